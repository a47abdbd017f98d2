/* tpXppY[vppV][epE][etpX]/: Megatron-core legacy checkpoints (per-rank torch.save files) of a
 * model in the catalog, for any valid layout. Every rank tensor is a list of rectangles of
 * catalog tensors (plus padding rows), so its bytes come from the source by extent. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/mcore.h"
#include "ckptfs/schema.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/value.h"
#include "ckptfs/views.h"

/* One piece of a rank tensor, stacked by rows: a rectangle of a catalog tensor, or padding. */
typedef struct {
    const CkptfsTensor *src; /* NULL: zero rows */
    uint64_t r0, r1, c0, c1; /* rectangle (for zero rows: r1 - r0 rows of c1 - c0 columns) */
    bool swapped;            /* of SRC seen with its column halves exchanged */
    bool transposed;         /* of SRC seen transposed (CKPTFS_RECIPE_TRANSPOSED) */
    int shift;               /* added to each element (-1: a zero-centred norm), or 0 */
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
        if (p->src && p->shift)
            ckptfs_tensor_emit_rect_shifted(p->src, b, p->r0, p->r1, p->c0, p->c1, p->shift);
        else if (p->src && p->swapped)
            ckptfs_tensor_emit_rect_swapped(p->src, b, p->r0, p->r1, p->c0, p->c1);
        else if (p->src && p->transposed)
            ckptfs_tensor_emit_rect_transposed(p->src, b, p->r0, p->r1, p->c0, p->c1);
        else if (p->src)
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
    GPtrArray *keys; /* CkptfsMcoreKey*: vocabulary padded for this TP; with pp > 1 the last
                        stage's copy of tied embeddings */
    /* A vision-language model's vision tower (on the first stage, before the language model, as
     * mbridge's models register it) and its keys; NULL keys: a text model */
    CkptfsModel tower;
    GPtrArray *tower_keys;
} MegatronView;

static void megatron_view_free(gpointer p)
{
    MegatronView *v = p;
    g_ptr_array_unref(v->keys);
    if (v->tower_keys)
        g_ptr_array_unref(v->tower_keys);
    g_free(v);
}

typedef struct {
    const MegatronView *view;
    unsigned pp_rank;
    CkptfsRankFile ranks; /* dense TP, EP and expert TP ranks */
} RankFile;

/* Everything one rank file's values point to while its plan is built. */
typedef struct {
    const MegatronView *view;
    const CkptfsRankFile *ranks;
    GPtrArray *tensors; /* RankTensor*, owned */
    /* "mtp.layers.J." while a multi-token prediction layer is added, a module list's
     * "decoder.deepstack_merger_list.J." while its module J is */
    const char *mtp_prefix;
    /* the part whose entries are added: the model (or a VLM's vision tower), its keys, and its
     * module's prefix in the state dict (a VLM's "language_model."; "" for a text model) */
    const CkptfsModel *model;
    const GPtrArray *keys;
    const char *prefix;
} RankBuild;

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
    Part p = {src, r0, r1, c0, c1, false, false, 0};
    g_array_append_val(t->parts, p);
}

/* What this rank holds of KEY (of LAYER, for stacked keys; of global expert EXPERT, for expert
 * keys, split by expert TP): the parts of its share, each a rectangle of a catalog tensor;
 * padding rows are zero, or with -o vocab_pad=last copies of the vocabulary's last row. */
static CkptfsValue *share_value(RankBuild *rb, const CkptfsMcoreKey *key, uint64_t layer, uint64_t expert)
{
    const MegatronView *v = rb->view;
    const CkptfsCatalog *catalog = ckptfs_source_model_catalog(v->source);
    uint64_t rows, cols, kernel[5];
    unsigned degree = key->expert ? ckptfs_layout_etp(&v->layout) : v->layout.tp;
    unsigned rank = key->expert ? rb->ranks->etp : rb->ranks->tp;
    g_autoptr(GArray) parts = ckptfs_mcore_share(key, degree, rank, &rows, &cols);
    RankTensor *t = rank_tensor_new(rb);
    t->dtype = ckptfs_mcore_key_dtype(key, rb->model);
    for (guint i = 0; i < parts->len; i++) {
        const CkptfsSharePart *p = &g_array_index(parts, CkptfsSharePart, i);
        if (p->hf != NULL) {
            g_autofree char *name = ckptfs_mcore_hf_name(key, layer, expert, p->hf);
            add_part(t, ckptfs_catalog_find(catalog, name), p->hf_row0, p->hf_row0 + p->rows, p->col0,
                     p->col0 + p->cols);
            if (t->parts->len > 0 && ckptfs_mcore_key_swaps_col_halves(key))
                g_array_index(t->parts, Part, t->parts->len - 1).swapped = true;
            if (t->parts->len > 0 && ckptfs_mcore_key_transposed(key))
                g_array_index(t->parts, Part, t->parts->len - 1).transposed = true;
            if (t->parts->len > 0 && key->rule->recipe == CKPTFS_RECIPE_LESS_ONE)
                g_array_index(t->parts, Part, t->parts->len - 1).shift = -1;
        } else if (key->split == CKPTFS_TP_VOCAB && v->options->vocab_pad == CKPTFS_VOCAB_PAD_LAST) {
            const CkptfsMcoreSegment *vocab = &g_array_index(key->segments, CkptfsMcoreSegment, 0);
            const CkptfsTensor *src = ckptfs_catalog_find(catalog, vocab->hf_name);
            for (uint64_t row = 0; row < p->rows; row++)
                add_part(t, src, vocab->rows - 1, vocab->rows, p->col0, p->col0 + p->cols);
        } else {
            add_part(t, NULL, 0, p->rows, 0, p->cols);
        }
    }
    uint64_t shape[3] = {rows, cols};
    unsigned kernel_dims = ckptfs_mcore_kernel_shape(key, rb->model, kernel);
    if (kernel_dims) /* replicated: the whole kernel */
        return ckptfs_value_tensor(t->dtype, kernel_dims, kernel, rank_tensor_emit, t);
    if (key->ndim == 3) /* [channels, 1, kernel] */
        shape[1] = 1, shape[2] = cols;
    return ckptfs_value_tensor(t->dtype, key->ndim, shape, rank_tensor_emit, t);
}

/* One entry: NAME (after "decoder.layers.LOCAL." for layer rules, or the multi-token
 * prediction layer's prefix) holding RULE's share. */
static void add_entry(RankBuild *rb, CkptfsValue *sd, const CkptfsRule *rule, const char *name,
                      uint64_t global, uint64_t local, uint64_t expert)
{
    g_autofree char *key = ckptfs_legacy_entry_key(rb->model, rule, rb->prefix, local, name, rb->mtp_prefix);
    if (rule->extra_state)
        ckptfs_value_set(sd, key, ckptfs_value_none());
    else
        ckptfs_value_set(sd, key, share_value(rb, ckptfs_mcore_key_of(rb->keys, rule), global, expert));
}

/* The run of expert rules RULES[A, Z) for this rank's local experts: SequentialMLP registers
 * each expert's linears in turn, TEGroupedMLP each linear's weights of every expert, then its
 * one _extra_state. */
static void add_experts(RankBuild *rb, CkptfsValue *sd, GPtrArray *rules, guint a, guint z,
                        uint64_t global, uint64_t local)
{
    const MegatronView *v = rb->view;
    bool grouped = v->options->moe_grouped_gemm;
    uint64_t per_rank = rb->model->experts / ckptfs_layout_ep(&v->layout);
    uint64_t first = rb->ranks->ep * per_rank;
    for (uint64_t outer = 0; outer < (grouped ? z - a : per_rank); outer++)
        for (uint64_t inner = 0; inner < (grouped ? per_rank : z - a); inner++) {
            uint64_t j = grouped ? inner : outer;
            const CkptfsRule *rule = g_ptr_array_index(rules, a + (grouped ? outer : inner));
            if (grouped && rule->extra_state && j + 1 < per_rank)
                continue; /* after the linear's last weight */
            g_autofree char *name = ckptfs_expert_legacy_name(rule, grouped, j);
            add_entry(rb, sd, rule, name, global, local, first + j);
        }
}

/* The entries of SCOPE (LAYER: of global layer GLOBAL, numbered LOCAL in its chunk) in the
 * order Megatron's modules register them; _extra_state entries are None. */
static void add_entries(RankBuild *rb, CkptfsValue *sd, CkptfsScope scope, uint64_t global,
                        uint64_t local)
{
    const MegatronView *v = rb->view;
    bool te = v->options->spec == CKPTFS_SPEC_TE;
    g_autoptr(GPtrArray) rules = ckptfs_legacy_entries(rb->model, scope, global, te, v->layout.pp > 1);
    for (guint i = 0; i < rules->len; i++) {
        const CkptfsRule *rule = g_ptr_array_index(rules, i);
        if (rule->expert) {
            guint end = i;
            while (end < rules->len && ((const CkptfsRule *)g_ptr_array_index(rules, end))->expert)
                end++;
            add_experts(rb, sd, rules, i, end, global, local);
            i = end - 1;
            continue;
        }
        add_entry(rb, sd, rule, ckptfs_rule_legacy_name(rule, te), global, local, 0);
    }
}

/* The last stage's entries: GPTModel registers the multi-token prediction block between the
 * decoder (whose final norm comes first) and the output layer; each MTP layer holds its norms
 * and projection, a transformer layer (HF layer LAYERS + J) and its final norm. */
static void add_last_entries(RankBuild *rb, CkptfsValue *sd)
{
    const MegatronView *v = rb->view;
    const CkptfsModel *m = rb->model;
    bool te = v->options->spec == CKPTFS_SPEC_TE;
    g_autoptr(GPtrArray) last = ckptfs_legacy_entries(m, CKPTFS_SCOPE_LAST, 0, te, v->layout.pp > 1);
    guint i = 0;
    for (; i < last->len && g_str_has_prefix(((const CkptfsRule *)g_ptr_array_index(last, i))->name, "decoder."); i++) {
        const CkptfsRule *rule = g_ptr_array_index(last, i);
        add_entry(rb, sd, rule, ckptfs_rule_legacy_name(rule, te), 0, 0, 0);
    }
    for (uint64_t j = 0; m->mtp && j < m->mtp_layers; j++) {
        g_autofree char *prefix = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".", j);
        rb->mtp_prefix = prefix;
        add_entries(rb, sd, CKPTFS_SCOPE_MTP_IN, m->layers + j, 0);
        add_entries(rb, sd, CKPTFS_SCOPE_LAYER, m->layers + j, 0);
        add_entries(rb, sd, CKPTFS_SCOPE_MTP_OUT, m->layers + j, 0);
        rb->mtp_prefix = NULL;
    }
    for (; i < last->len; i++) {
        const CkptfsRule *rule = g_ptr_array_index(last, i);
        add_entry(rb, sd, rule, ckptfs_rule_legacy_name(rule, te), 0, 0, 0);
    }
}

/* A VLM's vision tower, whole (its own config has pipeline_model_parallel_size 1): its first
 * entries, blocks, module list and last entries, under its prefix. */
static void add_tower_entries(RankBuild *rb, CkptfsValue *sd)
{
    const MegatronView *v = rb->view;
    *rb = (RankBuild){rb->view, rb->ranks, rb->tensors, NULL, &v->tower, v->tower_keys,
                      v->tower.arch->megatron_prefix};
    add_entries(rb, sd, CKPTFS_SCOPE_FIRST, 0, 0);
    for (uint64_t b = 0; b < v->tower.layers; b++)
        add_entries(rb, sd, CKPTFS_SCOPE_LAYER, b, b);
    for (uint64_t j = 0; j < v->tower.list_modules; j++) { /* its module list, after the blocks */
        g_autofree char *prefix = ckptfs_list_module_prefix(&v->tower, j);
        rb->mtp_prefix = prefix;
        add_entries(rb, sd, CKPTFS_SCOPE_LIST, j, j);
        rb->mtp_prefix = NULL;
    }
    add_entries(rb, sd, CKPTFS_SCOPE_LAST, 0, 0);
}

/* The state dict of virtual chunk VC on pipeline stage P. Tied embeddings: no output weight
 * with pp 1; a copy of the embedding on the last stage otherwise (Megatron keeps them in sync
 * across stages). */
static CkptfsValue *chunk_state_dict(RankBuild *rb, unsigned p, unsigned vc)
{
    const MegatronView *v = rb->view;
    const CkptfsLayout *l = &v->layout;
    CkptfsValue *sd = ckptfs_value_container(CKPTFS_VALUE_ODICT);
    bool last = p == l->pp - 1 && vc == l->vpp - 1;
    bool tower = v->tower_keys && p == 0 && vc == 0; /* the vision tower whole, unpipelined */
    if (tower && !v->model->arch->language_first)
        add_tower_entries(rb, sd);
    rb->model = v->model, rb->keys = v->keys;
    rb->prefix = v->model->arch->megatron_prefix ? v->model->arch->megatron_prefix : "";
    /* GPTModel builds the embedding on the stage of the MTP layers too (they embed the next
     * tokens): the last stage's copy, registered first. */
    if ((p == 0 && vc == 0) || (last && v->model->mtp))
        add_entries(rb, sd, CKPTFS_SCOPE_FIRST, 0, 0);
    uint64_t first, count;
    ckptfs_layout_chunk_layers(l, v->model, p, vc, &first, &count);
    for (uint64_t i = 0; i < count; i++)
        add_entries(rb, sd, CKPTFS_SCOPE_LAYER, first + i, i);
    if (last)
        add_last_entries(rb, sd);
    if (tower && v->model->arch->language_first)
        add_tower_entries(rb, sd);
    return sd;
}

/* What Megatron needs besides the model's fields to build the same experts and route as Hugging
 * Face does (scores in fp32, no load-balancing loss), and which layers are MoE. */
static void add_moe_args(CkptfsValue *a, const CkptfsModel *m, const CkptfsOptions *options,
                         const CkptfsLayout *l)
{
    if (m->experts == 0) {
        ckptfs_value_set(a, "num_experts", ckptfs_value_none());
        return;
    }
    /* the experts' sizes and routing: the schema's (ckptfs_schema_write_args) */
    ckptfs_value_set(a, "moe_router_dtype", ckptfs_value_str("fp32"));
    ckptfs_value_set(a, "moe_router_load_balancing_type", ckptfs_value_str("none"));
    ckptfs_value_set(a, "moe_aux_loss_coeff", ckptfs_value_float(0.0));
    ckptfs_value_set(a, "moe_token_dispatcher_type", ckptfs_value_str("alltoall"));
    ckptfs_value_set(a, "moe_grouped_gemm", ckptfs_value_bool(options->moe_grouped_gemm));
    if (ckptfs_model_moe_layers(m) == m->layers) {
        ckptfs_value_set(a, "moe_layer_freq", ckptfs_value_int(1));
    } else {
        CkptfsValue *pattern = ckptfs_value_container(CKPTFS_VALUE_LIST);
        for (uint64_t i = 0; i < m->layers; i++)
            ckptfs_value_append(pattern, ckptfs_value_int(ckptfs_model_layer_is_moe(m, i)));
        ckptfs_value_set(a, "moe_layer_freq", pattern);
    }
    /* Megatron requires sequence parallelism for MoE with tensor parallelism. */
    ckptfs_value_set(a, "sequence_parallel", ckptfs_value_bool(l->tp > 1));
}

/* A hybrid's layer kinds and gated attention as Megatron-core 0.17.1's TransformerConfig fields
 * (Megatron-Bridge's qwen3_next provider sets the same); the delta-net sizes are the schema's. */
static void add_hybrid_args(CkptfsValue *a, const CkptfsModel *m)
{
    if (!m->arch->hybrid_attention)
        return;
    ckptfs_value_set(a, "experimental_attention_variant", ckptfs_value_str("gated_delta_net"));
    CkptfsValue *pattern = ckptfs_value_container(CKPTFS_VALUE_LIST); /* 1: linear attention */
    for (uint64_t i = 0; i < m->layers; i++)
        ckptfs_value_append(pattern, ckptfs_value_int(ckptfs_model_layer_is_linear(m, i)));
    ckptfs_value_set(a, "linear_attention_freq", pattern);
    ckptfs_value_set(a, "attention_output_gate", ckptfs_value_bool(m->arch->attention_gate));
    ckptfs_value_set(a, "layernorm_zero_centered_gamma", ckptfs_value_bool(m->arch->zero_centred_norms));
}

/* Gemma 3's norms scale by 1 + w (Megatron's layernorm_zero_centered_gamma), as a hybrid's. */
static void add_norm_args(CkptfsValue *a, const CkptfsModel *m)
{
    if (m->arch->zero_centred_norms && !m->arch->hybrid_attention)
        ckptfs_value_set(a, "layernorm_zero_centered_gamma", ckptfs_value_bool(true));
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
    /* Megatron's validate_args takes the virtual chunks as layers per chunk for an even split,
     * and requires them as chunks per stage (--num-virtual-stages-per-pipeline-rank) for an
     * uneven one, where the layers per chunk differ between stages. */
    bool uneven = l->pp > 1 && (l->pp_first || l->pp_last);
    ckptfs_value_set(a, "virtual_pipeline_model_parallel_size", l->vpp > 1 ? ckptfs_value_int(l->vpp) : ckptfs_value_none());
    ckptfs_value_set(a, "num_layers_per_virtual_pipeline_stage",
                     l->vpp > 1 && !uneven ? ckptfs_value_int((int64_t)(m->layers / (l->pp * l->vpp))) : ckptfs_value_none());
    ckptfs_value_set(a, "num_virtual_stages_per_pipeline_rank",
                     l->vpp > 1 && uneven ? ckptfs_value_int(l->vpp) : ckptfs_value_none());
    if (uneven && l->pp_first)
        SET_INT("decoder_first_pipeline_num_layers", l->pp_first);
    else
        ckptfs_value_set(a, "decoder_first_pipeline_num_layers", ckptfs_value_none());
    if (uneven && l->pp_last)
        SET_INT("decoder_last_pipeline_num_layers", l->pp_last);
    else
        ckptfs_value_set(a, "decoder_last_pipeline_num_layers", ckptfs_value_none());
    SET_INT("expert_model_parallel_size", ckptfs_layout_ep(l));
    SET_INT("expert_tensor_parallel_size", ckptfs_layout_etp(l));
    /* the model description: one walk of the schema (ckptfs/schema.h) */
    ckptfs_schema_write_args(m, a);
    /* MLA's latent norms are Megatron's q/k layernorms */
    SET_BOOL("qk_layernorm", m->qk_norm || m->mla);
    SET_INT("encoder_num_layers", m->layers);
    SET_INT("seq_length", m->max_positions);
    /* YaRN for q/k/v attention (GPT-OSS): Megatron-core's GPT model reads it as
     * position_embedding_type "yarn" with the yarn_* fields Megatron-Bridge's provider sets (the
     * command line of 0.17.1 has no flag for them); MLA's YaRN is rope_type's. A VLM's
     * multimodal rope is "mrope" with Megatron's --mrope-section. */
    bool yarn_attention = m->rope_type == CKPTFS_ROPE_YARN && !m->mla;
    SET_STR("position_embedding_type", m->mrope_section[0] ? "mrope" : yarn_attention ? "yarn" : "rope");
    if (m->mrope_section[0]) {
        CkptfsValue *sections = ckptfs_value_container(CKPTFS_VALUE_LIST);
        for (size_t i = 0; i < G_N_ELEMENTS(m->mrope_section); i++)
            ckptfs_value_append(sections, ckptfs_value_int((int64_t)m->mrope_section[i]));
        ckptfs_value_set(a, "mrope_section", sections);
    }
    if (yarn_attention) {
        ckptfs_value_set(a, "yarn_rotary_scaling_factor", ckptfs_value_float(m->yarn_factor));
        SET_INT("yarn_original_max_position_embeddings", m->yarn_original_positions);
        ckptfs_value_set(a, "yarn_beta_fast", ckptfs_value_float(m->yarn_beta_fast));
        ckptfs_value_set(a, "yarn_beta_slow", ckptfs_value_float(m->yarn_beta_slow));
        ckptfs_value_set(a, "yarn_mscale", ckptfs_value_float(m->yarn_mscale));
        ckptfs_value_set(a, "yarn_mscale_all_dim", ckptfs_value_float(m->yarn_mscale_all_dim));
    }
    /* What Megatron's own Llama examples run with (rope, no --no-position-embedding): its
     * check_checkpoint_args compares it when not fine-tuning; with rope it changes nothing. */
    SET_BOOL("add_position_embedding", true);
    SET_BOOL("rotary_interleaved", false);
    SET_STR("normalization", "RMSNorm");
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
    add_moe_args(a, m, options, l);
    add_hybrid_args(a, m);
    add_norm_args(a, m);
    ckptfs_value_set(a, "mtp_num_layers", m->mtp ? ckptfs_value_int((int64_t)m->mtp_layers) : ckptfs_value_none());
    SET_STR("hf_architecture", m->arch->hf_architecture);
    if (m->arch->vision) {
        /* Megatron's args have no vision tower (mbridge builds its config apart): its part of
         * config.json as JSON text, for hf/ of a copy of this view */
        g_autoptr(JsonObject) vision = json_object_new();
        ckptfs_model_write_vision(m, vision);
        g_autoptr(JsonNode) node = json_node_init_object(json_node_alloc(), vision);
        g_autofree char *text = json_to_string(node, FALSE);
        SET_STR("hf_vision_config", text);
    }
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
    RankBuild rb = {.view = v, .ranks = &rf->ranks,
                    .tensors = g_ptr_array_new_with_free_func(rank_tensor_free), .model = v->model,
                    .keys = v->keys, .prefix = ""};
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

bool ckptfs_megatron_layout_check(const CkptfsModel *model, const CkptfsOptions *options,
                                  const CkptfsLayout *layout, GError **error)
{
    if (!ckptfs_layout_loadable(layout, error))
        return false;
    /* The local spec splits MLA's down projections over TP (column-parallel linears). */
    uint64_t kv_down = model->kv_lora + model->qk_rope_dim;
    bool local = options->spec == CKPTFS_SPEC_LOCAL;
    if (model->mla && local && model->q_lora % layout->tp != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "tp %u does not divide q_lora_rank %" G_GUINT64_FORMAT
                           ", which the local spec splits (spec=te does not)", layout->tp, model->q_lora);
    if (model->mla && local && kv_down % layout->tp != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "tp %u does not divide kv_lora_rank + qk_rope_head_dim %"
                           G_GUINT64_FORMAT ", which the local spec splits (spec=te does not)", layout->tp, kv_down);
    /* A VLM's vision tower: mbridge builds it with the TE spec. */
    if (model->arch->vision && local)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "spec=local: %s's vision tower has Megatron names for the "
                           "TE spec only (mbridge builds it so)", model->arch->hf_architecture);
    if (!ckptfs_model_check_vision_split(model, layout->tp, error))
        return false;
    if (model->arch->no_virtual_pipeline && layout->vpp > 1)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "vpp %u: mbridge builds %s without virtual pipeline "
                           "stages", layout->vpp, model->arch->hf_architecture);
    if (model->arch->te_spec_only && local)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "spec=local: %s's Megatron layers exist with Transformer "
                           "Engine only (spec=te)", model->arch->hf_architecture);
    /* Megatron-core 0.17.1 builds gated delta-net layers with Transformer Engine only. */
    if (model->arch->hybrid_attention && local)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "spec=local: Megatron-core builds %s's gated delta-net "
                           "layers with Transformer Engine only (spec=te)", model->arch->hf_architecture);
    uint64_t value_heads = model->linear_value_heads, key_heads = model->linear_key_heads;
    if (model->arch->hybrid_attention && (key_heads % layout->tp != 0 || value_heads % layout->tp != 0))
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "tp %u does not divide linear_num_key_heads %" G_GUINT64_FORMAT
                           " and linear_num_value_heads %" G_GUINT64_FORMAT ", which the gated delta-net splits",
                           layout->tp, key_heads, value_heads);
    /* An MTP layer's eh_proj is column-parallel over the hidden size. */
    if (model->mtp && model->hidden % layout->tp != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "tp %u does not divide hidden_size %" G_GUINT64_FORMAT
                           ", which the MTP layer's eh_proj is split by", layout->tp, model->hidden);
    return true;
}

bool ckptfs_megatron_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                                const CkptfsModel *model, const CkptfsOptions *options,
                                const CkptfsLayout *layout, GError **error)
{
    if (!ckptfs_layout_validate(layout, model, error) || !ckptfs_megatron_layout_check(model, options, layout, error))
        return false;
    MegatronView *v = g_new0(MegatronView, 1);
    v->source = source;
    v->model = model;
    v->options = options;
    v->layout = *layout;
    v->padded_vocab = ckptfs_padded_vocab(model->vocab, options->vocab_divisible_by, layout->tp);
    v->keys = ckptfs_mcore_keys(model, v->padded_vocab, layout->pp > 1);
    ckptfs_mcore_keys_for_spec(v->keys, options->spec == CKPTFS_SPEC_TE);
    if (model->arch->vision) {
        ckptfs_model_vision_tower(model, &v->tower);
        v->tower.dtype = model->dtype;
        v->tower_keys = ckptfs_mcore_keys(&v->tower, 0, false);
        ckptfs_mcore_keys_for_spec(v->tower_keys, true);
    }
    if (!ckptfs_mcore_keys_check_shifted(v->keys, model, ckptfs_source_model_catalog(source), error) ||
        (v->tower_keys &&
         !ckptfs_mcore_keys_check_shifted(v->tower_keys, &v->tower, ckptfs_source_model_catalog(source), error))) {
        megatron_view_free(v);
        return false;
    }
    ckptfs_tree_own(tree, v, megatron_view_free);

    /* Megatron reads the tracker as text; "release" means iteration 0, no optimizer. */
    ckptfs_tree_add_file(tree, dir, "latest_checkpointed_iteration.txt", plan_literal_text, NULL,
                         "release");
    CkptfsNode *release = ckptfs_tree_add_dir(tree, dir, "release");
    g_autoptr(GArray) stage = ckptfs_layout_rank_files(layout);
    RankFile *files = g_new0(RankFile, (gsize)stage->len * layout->pp);
    ckptfs_tree_own(tree, files, g_free);
    for (unsigned p = 0; p < layout->pp; p++)
        for (guint i = 0; i < stage->len; i++) {
            RankFile *rf = &files[p * stage->len + i];
            *rf = (RankFile){.view = v, .pp_rank = p, .ranks = g_array_index(stage, CkptfsRankFile, i)};
            g_autofree char *name = ckptfs_rank_file_dir(layout, p, &rf->ranks);
            CkptfsNode *rank_dir = ckptfs_tree_add_dir(tree, release, name);
            /* torch.load reads it (mmap=True maps it private): nothing maps it shared. Its plan
             * is large for a big MoE layout (an expert's row-parallel rows each an extent) and
             * `ls -l` of hundreds of them would keep them all: built again on open instead. */
            CkptfsNode *file = ckptfs_tree_add_file(tree, rank_dir, "model_optim_rng.pt", plan_rank_file, NULL, rf);
            ckptfs_tree_plan_on_open(ckptfs_tree_hint(file, CKPTFS_HINT_STREAMED));
        }
    return true;
}
