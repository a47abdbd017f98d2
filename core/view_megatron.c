/* tpXppY[vppV]/: Megatron-core legacy checkpoints (per-rank torch.save files) of a model in
 * the catalog, for any valid layout. Every rank tensor is a list of rectangles of catalog
 * tensors (plus padding rows), so its bytes come from the source by extent. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/value.h"
#include "ckptfs/views.h"

/* One piece of a rank tensor, stacked by rows: a rectangle of a catalog tensor, or padding. */
typedef struct {
    const CkptfsTensor *src; /* NULL: zero rows */
    uint64_t r0, r1, c0, c1; /* rectangle (for zero rows: r1 - r0 rows of c1 - c0 columns) */
} Part;

typedef struct {
    CkptfsDtype dtype;
    GArray *parts; /* Part */
} RankTensor;

static void rank_tensor_free(gpointer p)
{
    RankTensor *t = p;
    g_array_unref(t->parts);
    g_free(t);
}

static void rank_tensor_emit(gconstpointer ctx, CkptfsPlanBuilder *b)
{
    const RankTensor *t = ctx;
    size_t isz = ckptfs_dtype_size(t->dtype);
    for (guint i = 0; i < t->parts->len; i++) {
        const Part *p = &g_array_index(t->parts, Part, i);
        if (p->src)
            ckptfs_tensor_emit_rect(p->src, b, p->r0, p->r1, p->c0, p->c1);
        else
            ckptfs_plan_add_zero(b, (p->r1 - p->r0) * (p->c1 - p->c0) * isz);
    }
}

typedef struct {
    const CkptfsSource *source;
    const CkptfsModel *model;
    const CkptfsOptions *options;
    CkptfsLayout layout;
    uint64_t padded_vocab;
} MegatronView;

typedef struct {
    const MegatronView *view;
    unsigned tp_rank, pp_rank;
} RankFile;

/* Everything one rank file's values point to while its plan is built. */
typedef struct {
    const MegatronView *view;
    unsigned r; /* tp rank */
    GPtrArray *tensors; /* RankTensor*, owned */
} RankBuild;

static const CkptfsTensor *hf_tensor(const MegatronView *v, const char *name)
{
    return ckptfs_catalog_find(v->source->catalog, name);
}

static const CkptfsTensor *hf_layer_tensor(const MegatronView *v, uint64_t layer, const char *suffix)
{
    g_autofree char *name = ckptfs_hf_layer_name(layer, suffix);
    return ckptfs_catalog_find(v->source->catalog, name);
}

static RankTensor *rank_tensor_new(RankBuild *rb)
{
    RankTensor *t = g_new0(RankTensor, 1);
    t->dtype = rb->view->model->dtype;
    t->parts = g_array_new(FALSE, FALSE, sizeof(Part));
    g_ptr_array_add(rb->tensors, t);
    return t;
}

static void add_part(RankTensor *t, const CkptfsTensor *src, uint64_t r0, uint64_t r1, uint64_t c0,
                     uint64_t c1)
{
    if (r1 <= r0 || c1 <= c0)
        return;
    Part p = {src, r0, r1, c0, c1};
    g_array_append_val(t->parts, p);
}

static CkptfsValue *tensor_value(RankTensor *t, unsigned ndim, uint64_t d0, uint64_t d1)
{
    uint64_t shape[2] = {d0, d1};
    return ckptfs_value_tensor(t->dtype, ndim, shape, rank_tensor_emit, t);
}

/* A replicated tensor (norms). */
static CkptfsValue *whole(RankBuild *rb, const CkptfsTensor *src)
{
    RankTensor *t = rank_tensor_new(rb);
    add_part(t, src, 0, src->rows, 0, src->cols);
    return ckptfs_value_tensor(t->dtype, src->ndim, src->shape, rank_tensor_emit, t);
}

/* Column-parallel rows [r*R/T, (r+1)*R/T) of several tensors stacked by rows (fc1: [gate; up]). */
static CkptfsValue *row_split(RankBuild *rb, const CkptfsTensor *const *srcs, unsigned n)
{
    unsigned T = rb->view->layout.tp, r = rb->r;
    RankTensor *t = rank_tensor_new(rb);
    uint64_t rows = 0;
    for (unsigned i = 0; i < n; i++) {
        uint64_t R = srcs[i]->rows;
        add_part(t, srcs[i], r * R / T, (r + 1) * R / T, 0, srcs[i]->cols);
        rows += R / T;
    }
    return tensor_value(t, 2, rows, srcs[0]->cols);
}

/* Row-parallel: columns [r*C/T, (r+1)*C/T). */
static CkptfsValue *col_split(RankBuild *rb, const CkptfsTensor *src)
{
    unsigned T = rb->view->layout.tp, r = rb->r;
    RankTensor *t = rank_tensor_new(rb);
    uint64_t C = src->cols;
    add_part(t, src, 0, src->rows, r * C / T, (r + 1) * C / T);
    return tensor_value(t, 2, src->rows, C / T);
}

/* Fused QKV (weight or bias): for each query group g, [q rows of its heads; k rows; v rows];
 * rank r takes rows [r*R/T, (r+1)*R/T) of that interleaved tensor, which also covers T larger
 * than the number of groups (a rank then holds part of one group's block). */
static CkptfsValue *qkv_split(RankBuild *rb, const CkptfsTensor *q, const CkptfsTensor *k,
                              const CkptfsTensor *v, bool is_bias)
{
    const CkptfsModel *m = rb->view->model;
    unsigned T = rb->view->layout.tp, r = rb->r;
    uint64_t d = m->head_dim, hpg = m->heads / m->kv_heads;
    uint64_t block = (hpg + 2) * d, R = block * m->kv_heads;
    uint64_t lo = r * R / T, hi = (r + 1) * R / T;
    RankTensor *t = rank_tensor_new(rb);
    for (uint64_t g = 0; g < m->kv_heads; g++) {
        const struct {
            const CkptfsTensor *src;
            uint64_t src_row, at, rows;
        } segs[3] = {
            {q, g * hpg * d, g * block, hpg * d},
            {k, g * d, g * block + hpg * d, d},
            {v, g * d, g * block + (hpg + 1) * d, d},
        };
        for (int s = 0; s < 3; s++) {
            uint64_t a = MAX(lo, segs[s].at), z = MIN(hi, segs[s].at + segs[s].rows);
            if (a < z)
                add_part(t, segs[s].src, segs[s].src_row + (a - segs[s].at),
                         segs[s].src_row + (z - segs[s].at), 0, segs[s].src->cols);
        }
    }
    return is_bias ? tensor_value(t, 1, (hi - lo), 0) : tensor_value(t, 2, hi - lo, q->cols);
}

/* Vocab-parallel (embedding, output layer): the padded vocabulary split by rows. */
static CkptfsValue *vocab_split(RankBuild *rb, const CkptfsTensor *src)
{
    const MegatronView *v = rb->view;
    unsigned T = v->layout.tp, r = rb->r;
    uint64_t per_rank = v->padded_vocab / T, lo = r * per_rank, hi = lo + per_rank;
    uint64_t vocab = v->model->vocab, cols = src->cols;
    RankTensor *t = rank_tensor_new(rb);
    add_part(t, src, lo, MIN(hi, vocab), 0, cols);
    for (uint64_t row = MAX(lo, vocab); row < hi; row++) {
        if (v->options->vocab_pad == CKPTFS_VOCAB_PAD_LAST)
            add_part(t, src, vocab - 1, vocab, 0, cols);
        else
            add_part(t, NULL, row, row + 1, 0, cols);
    }
    return tensor_value(t, 2, per_rank, cols);
}

static void set_none(CkptfsValue *odict, const char *key)
{
    ckptfs_value_set(odict, key, ckptfs_value_none());
}

/* Keys of one layer, in the order Megatron's modules register them. */
static void add_layer(RankBuild *rb, CkptfsValue *sd, uint64_t global, uint64_t local)
{
    const MegatronView *v = rb->view;
    const CkptfsModel *m = v->model;
    bool te = v->options->spec == CKPTFS_SPEC_TE;
    g_autofree char *pre = g_strdup_printf("decoder.layers.%" G_GUINT64_FORMAT ".", local);
#define KEY(suffix) (g_snprintf(key, sizeof key, "%s%s", pre, suffix), key)
    char key[256];
    const CkptfsTensor *q = hf_layer_tensor(v, global, "self_attn.q_proj.weight");
    const CkptfsTensor *k = hf_layer_tensor(v, global, "self_attn.k_proj.weight");
    const CkptfsTensor *vv = hf_layer_tensor(v, global, "self_attn.v_proj.weight");
    const CkptfsTensor *fc1[2] = {hf_layer_tensor(v, global, "mlp.gate_proj.weight"),
                                  hf_layer_tensor(v, global, "mlp.up_proj.weight")};

    if (te)
        set_none(sd, KEY("self_attention.core_attention._extra_state"));
    else
        ckptfs_value_set(sd, KEY("input_layernorm.weight"),
                         whole(rb, hf_layer_tensor(v, global, "input_layernorm.weight")));
    ckptfs_value_set(sd, KEY("self_attention.linear_proj.weight"),
                     col_split(rb, hf_layer_tensor(v, global, "self_attn.o_proj.weight")));
    set_none(sd, KEY("self_attention.linear_proj._extra_state"));
    if (te)
        ckptfs_value_set(sd, KEY("self_attention.linear_qkv.layer_norm_weight"),
                         whole(rb, hf_layer_tensor(v, global, "input_layernorm.weight")));
    ckptfs_value_set(sd, KEY("self_attention.linear_qkv.weight"), qkv_split(rb, q, k, vv, false));
    if (m->qkv_bias)
        ckptfs_value_set(sd, KEY("self_attention.linear_qkv.bias"),
                         qkv_split(rb, hf_layer_tensor(v, global, "self_attn.q_proj.bias"),
                                   hf_layer_tensor(v, global, "self_attn.k_proj.bias"),
                                   hf_layer_tensor(v, global, "self_attn.v_proj.bias"), true));
    set_none(sd, KEY("self_attention.linear_qkv._extra_state"));
    if (m->qk_norm) {
        ckptfs_value_set(sd, KEY("self_attention.q_layernorm.weight"),
                         whole(rb, hf_layer_tensor(v, global, "self_attn.q_norm.weight")));
        if (te)
            set_none(sd, KEY("self_attention.q_layernorm._extra_state"));
        ckptfs_value_set(sd, KEY("self_attention.k_layernorm.weight"),
                         whole(rb, hf_layer_tensor(v, global, "self_attn.k_norm.weight")));
        if (te)
            set_none(sd, KEY("self_attention.k_layernorm._extra_state"));
    }
    const CkptfsTensor *post_norm = hf_layer_tensor(v, global, "post_attention_layernorm.weight");
    if (te)
        ckptfs_value_set(sd, KEY("mlp.linear_fc1.layer_norm_weight"), whole(rb, post_norm));
    else
        ckptfs_value_set(sd, KEY("pre_mlp_layernorm.weight"), whole(rb, post_norm));
    ckptfs_value_set(sd, KEY("mlp.linear_fc1.weight"), row_split(rb, fc1, 2));
    set_none(sd, KEY("mlp.linear_fc1._extra_state"));
    ckptfs_value_set(sd, KEY("mlp.linear_fc2.weight"),
                     col_split(rb, hf_layer_tensor(v, global, "mlp.down_proj.weight")));
    set_none(sd, KEY("mlp.linear_fc2._extra_state"));
#undef KEY
}

/* The state dict of virtual chunk VC on pipeline stage P. */
static CkptfsValue *chunk_state_dict(RankBuild *rb, unsigned p, unsigned vc)
{
    const MegatronView *v = rb->view;
    const CkptfsLayout *l = &v->layout;
    CkptfsValue *sd = ckptfs_value_container(CKPTFS_VALUE_ODICT);
    if (p == 0 && vc == 0)
        ckptfs_value_set(sd, "embedding.word_embeddings.weight",
                         vocab_split(rb, hf_tensor(v, "model.embed_tokens.weight")));
    uint64_t first, count;
    ckptfs_layout_chunk_layers(l, v->model, p, vc, &first, &count);
    for (uint64_t i = 0; i < count; i++)
        add_layer(rb, sd, first + i, i);
    if (p == l->pp - 1 && vc == l->vpp - 1) {
        ckptfs_value_set(sd, "decoder.final_layernorm.weight",
                         whole(rb, hf_tensor(v, "model.norm.weight")));
        if (v->options->spec == CKPTFS_SPEC_TE)
            set_none(sd, "decoder.final_layernorm._extra_state");
        /* Tied embeddings: no output weight with pp 1; a copy of the embedding on the last
         * stage otherwise (Megatron keeps them in sync across stages). */
        const CkptfsTensor *head = hf_tensor(v, "lm_head.weight");
        if (v->model->tied_embeddings)
            head = l->pp > 1 ? hf_tensor(v, "model.embed_tokens.weight") : NULL;
        if (head)
            ckptfs_value_set(sd, "output_layer.weight", vocab_split(rb, head));
        set_none(sd, "output_layer._extra_state");
    }
    return sd;
}

CkptfsValue *ckptfs_megatron_args(const CkptfsModel *m, const CkptfsOptions *options,
                                  const CkptfsLayout *l, uint64_t padded_vocab,
                                  const char *ckpt_format)
{
    CkptfsValue *a = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
#define SET_INT(k, x) ckptfs_value_set(a, k, ckptfs_value_int((int64_t)(x)))
#define SET_BOOL(k, x) ckptfs_value_set(a, k, ckptfs_value_bool(x))
#define SET_STR(k, x) ckptfs_value_set(a, k, ckptfs_value_str(x))
    SET_INT("tensor_model_parallel_size", l->tp);
    SET_INT("pipeline_model_parallel_size", l->pp);
    if (l->vpp > 1) {
        SET_INT("virtual_pipeline_model_parallel_size", l->vpp);
        SET_INT("num_layers_per_virtual_pipeline_stage", m->layers / (l->pp * l->vpp));
    } else {
        ckptfs_value_set(a, "virtual_pipeline_model_parallel_size", ckptfs_value_none());
        ckptfs_value_set(a, "num_layers_per_virtual_pipeline_stage", ckptfs_value_none());
    }
    bool uneven = l->pp > 1 && (l->pp_first || l->pp_last);
    if (uneven && l->pp_first)
        SET_INT("decoder_first_pipeline_num_layers", l->pp_first);
    else
        ckptfs_value_set(a, "decoder_first_pipeline_num_layers", ckptfs_value_none());
    if (uneven && l->pp_last)
        SET_INT("decoder_last_pipeline_num_layers", l->pp_last);
    else
        ckptfs_value_set(a, "decoder_last_pipeline_num_layers", ckptfs_value_none());
    SET_INT("expert_model_parallel_size", 1);
    SET_INT("num_layers", m->layers);
    SET_INT("encoder_num_layers", m->layers);
    SET_INT("hidden_size", m->hidden);
    SET_INT("ffn_hidden_size", m->ffn);
    SET_INT("num_attention_heads", m->heads);
    SET_BOOL("group_query_attention", m->kv_heads != m->heads);
    SET_INT("num_query_groups", m->kv_heads);
    SET_INT("kv_channels", m->head_dim);
    SET_INT("max_position_embeddings", m->max_positions);
    SET_INT("seq_length", m->max_positions);
    SET_STR("position_embedding_type", "rope");
    /* What Megatron's own Llama examples run with (rope, no --no-position-embedding): its
     * check_checkpoint_args compares it when not fine-tuning; with rope it changes nothing. */
    SET_BOOL("add_position_embedding", true);
    SET_INT("rotary_base", (int64_t)m->rope_theta);
    ckptfs_value_set(a, "rotary_percent", ckptfs_value_float(1.0));
    SET_BOOL("rotary_interleaved", false);
    SET_BOOL("use_rope_scaling", m->rope_scaling_factor > 0);
    ckptfs_value_set(a, "rope_scaling_factor",
                     ckptfs_value_float(m->rope_scaling_factor > 0 ? m->rope_scaling_factor : 8.0));
    SET_STR("normalization", "RMSNorm");
    ckptfs_value_set(a, "layernorm_epsilon", ckptfs_value_float(m->norm_eps));
    SET_BOOL("swiglu", true);
    SET_BOOL("untie_embeddings_and_output_weights", !m->tied_embeddings);
    SET_BOOL("add_bias_linear", false);
    SET_BOOL("add_qkv_bias", m->qkv_bias);
    SET_BOOL("qk_layernorm", m->qk_norm);
    SET_INT("vocab_size", m->vocab);
    SET_INT("padded_vocab_size", padded_vocab);
    SET_INT("make_vocab_size_divisible_by", options->vocab_divisible_by);
    ckptfs_value_set(a, "params_dtype", ckptfs_value_dtype(m->dtype));
    SET_BOOL("bf16", m->dtype == CKPTFS_DTYPE_BF16);
    SET_BOOL("fp16", m->dtype == CKPTFS_DTYPE_F16);
    SET_STR("transformer_impl", options->spec == CKPTFS_SPEC_TE ? "transformer_engine" : "local");
    SET_STR("ckpt_format", ckpt_format);
    /* Nothing but weights: loaders then ask for no optimizer or RNG state. */
    SET_BOOL("no_save_optim", true);
    SET_BOOL("no_save_rng", true);
    SET_INT("iteration", 0);
    SET_BOOL("use_legacy_models", false);
    ckptfs_value_set(a, "num_experts", ckptfs_value_none());
    SET_STR("hf_architecture", m->arch->hf_architecture);
#undef SET_INT
#undef SET_BOOL
#undef SET_STR
    return a;
}

static CkptfsPlan *plan_rank_file(gpointer owner, gconstpointer key, GError **error)
{
    (void)owner;
    const RankFile *rf = key;
    const MegatronView *v = rf->view;
    RankBuild rb = {.view = v, .r = rf->tp_rank,
                    .tensors = g_ptr_array_new_with_free_func(rank_tensor_free)};
    CkptfsValue *top = ckptfs_value_container(CKPTFS_VALUE_DICT);
    if (v->options->megatron_args)
        ckptfs_value_set(top, "args", ckptfs_megatron_args(v->model, v->options, &v->layout,
                                                           v->padded_vocab, "torch"));
    ckptfs_value_set(top, "checkpoint_version", ckptfs_value_float(3.0));
    ckptfs_value_set(top, "iteration", ckptfs_value_int(0));
    if (v->layout.vpp == 1) {
        ckptfs_value_set(top, "model", chunk_state_dict(&rb, rf->pp_rank, 0));
    } else {
        for (unsigned vc = 0; vc < v->layout.vpp; vc++) {
            char name[32];
            g_snprintf(name, sizeof name, "model%u", vc);
            ckptfs_value_set(top, name, chunk_state_dict(&rb, rf->pp_rank, vc));
        }
    }
    CkptfsPlan *plan = ckptfs_torchsave_plan(top, "archive", v->options->crc32, error);
    ckptfs_value_free(top);
    g_ptr_array_unref(rb.tensors);
    return plan;
}

static CkptfsPlan *plan_literal_text(gpointer owner, gconstpointer key, GError **error)
{
    (void)owner;
    (void)error;
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, key, strlen(key));
    return ckptfs_plan_builder_finish(b);
}

bool ckptfs_megatron_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                                const CkptfsModel *model, const CkptfsOptions *options,
                                const CkptfsLayout *layout, GError **error)
{
    if (!ckptfs_layout_validate(layout, model, error))
        return false;
    MegatronView *v = g_new0(MegatronView, 1);
    v->source = source;
    v->model = model;
    v->options = options;
    v->layout = *layout;
    v->padded_vocab = ckptfs_padded_vocab(model->vocab, options->vocab_divisible_by, layout->tp);
    ckptfs_tree_own(tree, v, g_free);

    /* Megatron reads the tracker as text; "release" means iteration 0, no optimizer. */
    ckptfs_tree_add_file(tree, dir, "latest_checkpointed_iteration.txt", plan_literal_text, NULL,
                         "release");
    CkptfsNode *release = ckptfs_tree_add_dir(tree, dir, "release");
    RankFile *files = g_new0(RankFile, (gsize)layout->tp * layout->pp);
    ckptfs_tree_own(tree, files, g_free);
    for (unsigned p = 0; p < layout->pp; p++)
        for (unsigned t = 0; t < layout->tp; t++) {
            RankFile *rf = &files[p * layout->tp + t];
            *rf = (RankFile){.view = v, .tp_rank = t, .pp_rank = p};
            g_autofree char *name = layout->pp > 1
                                        ? g_strdup_printf("mp_rank_%02u_%03u", t, p)
                                        : g_strdup_printf("mp_rank_%02u", t);
            CkptfsNode *rank_dir = ckptfs_tree_add_dir(tree, release, name);
            ckptfs_tree_add_file(tree, rank_dir, "model_optim_rng.pt", plan_rank_file, NULL, rf);
        }
    return true;
}
