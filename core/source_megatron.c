/* Megatron-core legacy checkpoints as a source: per-rank torch.save files for one TP/PP/VPP
 * split. Every global tensor becomes a catalog tensor under its Hugging Face name, made of
 * pieces that point into the rank files (QKV groups de-interleaved, fc1 split into gate and
 * up, row-parallel shards side by side, vocabulary padding cut). Only the pickles are read;
 * tensor data, optimizer and RNG state are never touched. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/pickle.h"
#include "ckptfs/zipreader.h"
#include "source_internal.h"

#define TRACKER "latest_checkpointed_iteration.txt"
#define MAX_PICKLE (1ull << 30)

typedef struct {
    unsigned tp, pp;
    char *path;
    uint32_t src;
    CkptfsZip *zip;
    CkptfsPickle *pickle;
    GHashTable *used; /* keys consumed, per chunk "model0/name" */
} Rank;

typedef struct {
    CkptfsSource *source;
    const CkptfsOptions *options;
    unsigned T, P, V;
    Rank **ranks; /* [p * T + t] */
    CkptfsLayout layout;
    uint64_t layers, hidden, heads, groups, head_dim, ffn, vocab, padded_vocab;
    bool tied, qkv_bias, qk_norm, te;
    CkptfsDtype dtype;
    GError **error;
} Mg;

static void rank_free(Rank *r)
{
    if (r == NULL)
        return;
    ckptfs_pickle_free(r->pickle);
    ckptfs_zip_free(r->zip);
    if (r->used)
        g_hash_table_unref(r->used);
    g_free(r->path);
    g_free(r);
}

/* The iteration directory: DIR itself when it holds rank directories, else the one -o iteration
 * or the tracker names (release, or iter_%07d). */
static char *iteration_dir(const char *dir, const char *wanted, GError **error)
{
    g_autofree char *tracker = g_build_filename(dir, TRACKER, NULL);
    g_autofree char *text = NULL;
    if (wanted != NULL)
        text = g_strdup(wanted);
    else if (!g_file_get_contents(tracker, &text, NULL, NULL))
        return g_strdup(dir);
    g_strstrip(text);
    char *end;
    unsigned long it = strtoul(text, &end, 10);
    g_autofree char *name = strcmp(text, "release") == 0 ? g_strdup("release")
                            : (*text && *end == '\0') ? g_strdup_printf("iter_%07lu", it) : NULL;
    if (name == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: '%s' is neither \"release\" nor an iteration number", tracker, text);
        return NULL;
    }
    char *iter = g_build_filename(dir, name, NULL);
    if (!g_file_test(iter, G_FILE_TEST_IS_DIR)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s names %s, which does not exist",
                    wanted ? "option iteration" : tracker, iter);
        g_free(iter);
        return NULL;
    }
    return iter;
}

bool ckptfs_source_is_megatron(const char *dir)
{
    g_autofree char *tracker = g_build_filename(dir, TRACKER, NULL);
    if (g_file_test(tracker, G_FILE_TEST_EXISTS))
        return true;
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL)
        if (g_str_has_prefix(name, "mp_rank_"))
            return true;
    return false;
}

static bool fail(Mg *m, CkptfsErrorCode code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static bool fail(Mg *m, CkptfsErrorCode code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (m->error && *m->error == NULL)
        g_set_error_literal(m->error, CKPTFS_ERROR, code, msg);
    return false;
}

/* Finds the rank files and checks the TP x PP grid has no hole. */
static bool find_ranks(Mg *m, const char *iter)
{
    g_autoptr(GDir) d = g_dir_open(iter, 0, NULL);
    if (d == NULL)
        return fail(m, CKPTFS_ERROR_IO, "%s: cannot list", iter);
    g_autoptr(GPtrArray) found = g_ptr_array_new();
    const char *name;
    unsigned maxt = 0, maxp = 0;
    bool with_pp = false;
    while ((name = g_dir_read_name(d)) != NULL) {
        unsigned t, p = 0;
        char tail;
        int n = sscanf(name, "mp_rank_%2u_%3u%c", &t, &p, &tail);
        /* mp_rank_TT or mp_rank_TT_PPP, digits only */
        size_t len = strlen(name);
        if (!g_str_has_prefix(name, "mp_rank_") || n < 1 || n > 2 || len != (n == 1 ? 10u : 14u) ||
            strspn(name + 8, "0123456789") != 2 || (n == 2 && strspn(name + 11, "0123456789") != 3))
            continue;
        with_pp |= n == 2;
        Rank *r = g_new0(Rank, 1);
        r->tp = t;
        r->pp = p;
        r->path = g_build_filename(iter, name, "model_optim_rng.pt", NULL);
        g_ptr_array_add(found, r);
        maxt = MAX(maxt, t);
        maxp = MAX(maxp, p);
    }
    if (found->len == 0)
        return fail(m, CKPTFS_ERROR_NOT_FOUND, "%s: no mp_rank_* directories", iter);
    m->T = maxt + 1;
    m->P = with_pp ? maxp + 1 : 1;
    m->ranks = g_new0(Rank *, (gsize)m->T * m->P);
    for (guint i = 0; i < found->len; i++) {
        Rank *r = g_ptr_array_index(found, i);
        if (r->tp >= m->T || r->pp >= m->P || m->ranks[r->pp * m->T + r->tp]) {
            rank_free(r);
            continue;
        }
        m->ranks[r->pp * m->T + r->tp] = r;
    }
    for (unsigned p = 0; p < m->P; p++)
        for (unsigned t = 0; t < m->T; t++)
            if (m->ranks[p * m->T + t] == NULL) {
                g_autofree char *want = m->P > 1 ? g_strdup_printf("mp_rank_%02u_%03u", t, p)
                                                 : g_strdup_printf("mp_rank_%02u", t);
                return fail(m, CKPTFS_ERROR_NOT_FOUND,
                            "%s/%s/model_optim_rng.pt: missing (a hole in the tp %u x pp %u grid)",
                            iter, want, m->T, m->P);
            }
    return true;
}

static bool open_rank(Mg *m, Rank *r)
{
    int src = ckptfs_srcfiles_add(m->source->files, r->path, m->error);
    if (src < 0)
        return false;
    r->src = (uint32_t)src;
    r->zip = ckptfs_zip_open(m->source->files, r->src, m->error);
    if (r->zip == NULL)
        return false;
    GBytes *pkl = ckptfs_zip_read(r->zip, m->source->files, "data.pkl", MAX_PICKLE, m->error);
    if (pkl == NULL)
        return false;
    gsize n;
    const uint8_t *data = g_bytes_get_data(pkl, &n);
    g_autofree char *what = g_strdup_printf("%s: data.pkl", r->path);
    r->pickle = ckptfs_pickle_parse(what, data, n, m->error);
    g_bytes_unref(pkl);
    r->used = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    return r->pickle != NULL;
}

static const CkptfsPy *arg(const CkptfsPy *args, const char *key)
{
    return ckptfs_py_dict_get(args, key);
}

static bool arg_uint(Mg *m, const CkptfsPy *args, const char *path, const char *key, uint64_t *out)
{
    const CkptfsPy *v = arg(args, key);
    if (v == NULL || v->kind != CKPTFS_PY_INT || v->big || v->i <= 0)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: args.%s is missing or not a positive integer", path, key);
    *out = (uint64_t)v->i;
    return true;
}

static bool arg_bool(const CkptfsPy *args, const char *key)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_BOOL && v->i;
}

static double arg_double(const CkptfsPy *args, const char *key, double fallback)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_FLOAT ? v->f : v && v->kind == CKPTFS_PY_INT ? (double)v->i : fallback;
}

static uint64_t arg_uint_or(const CkptfsPy *args, const char *key, uint64_t fallback)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_INT && !v->big && v->i > 0 ? (uint64_t)v->i : fallback;
}

/* Reads the model's sizes from rank 0's args and checks the files agree with them. */
/* The model dict of virtual chunk V of a rank. */
static const CkptfsPy *chunk_dict(const Rank *r, unsigned v, unsigned V)
{
    const CkptfsPy *root = ckptfs_pickle_root(r->pickle);
    if (V == 1)
        return ckptfs_py_dict_get(root, "model");
    char key[16];
    g_snprintf(key, sizeof key, "model%u", v);
    return ckptfs_py_dict_get(root, key);
}

/* Rank files saved without args: the sizes come from the config.json given with -o hf_config or
 * -o hf_extra, the split from the files (virtual chunks from the model0.. keys, the padded
 * vocabulary from the embedding's rows); locate() then checks every shape against them. */
static bool read_config_sizes(Mg *m)
{
    Rank *r0 = m->ranks[0];
    JsonObject *c = m->source->config;
    if (c == NULL)
        return fail(m, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: no args Namespace; give the model's config.json with -o hf_config=PATH or "
                    "-o hf_extra=DIR",
                    r0->path);
    const char *need[] = {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"};
    for (size_t i = 0; i < G_N_ELEMENTS(need); i++)
        if (json_object_get_int_member_with_default(c, need[i], 0) <= 0)
            return fail(m, CKPTFS_ERROR_FORMAT, "config.json: \"%s\" is missing or not positive (needed "
                        "for rank files without args)", need[i]);
    m->layers = (uint64_t)json_object_get_int_member(c, "num_hidden_layers");
    m->hidden = (uint64_t)json_object_get_int_member(c, "hidden_size");
    m->heads = (uint64_t)json_object_get_int_member(c, "num_attention_heads");
    m->ffn = (uint64_t)json_object_get_int_member(c, "intermediate_size");
    m->vocab = (uint64_t)json_object_get_int_member(c, "vocab_size");
    m->groups = (uint64_t)json_object_get_int_member_with_default(c, "num_key_value_heads", (gint64)m->heads);
    m->head_dim = (uint64_t)json_object_get_int_member_with_default(c, "head_dim", (gint64)(m->hidden / m->heads));
    m->tied = json_object_get_boolean_member_with_default(c, "tie_word_embeddings", false);
    const char *type = json_object_get_string_member_with_default(c, "model_type", "");
    m->qkv_bias = strcmp(type, "qwen2") == 0 || json_object_get_boolean_member_with_default(c, "attention_bias", false);
    m->qk_norm = strcmp(type, "qwen3") == 0;
    if (m->groups == 0 || m->head_dim == 0)
        return fail(m, CKPTFS_ERROR_FORMAT, "config.json: num_key_value_heads and head_dim must be positive");
    const CkptfsPy *root = ckptfs_pickle_root(r0->pickle);
    m->V = 1;
    while (ckptfs_py_dict_get(root, "model") == NULL) {
        char key[16];
        g_snprintf(key, sizeof key, "model%u", m->V);
        if (ckptfs_py_dict_get(root, key) == NULL)
            break;
        m->V++;
    }
    const CkptfsPy *emb = ckptfs_py_dict_get(chunk_dict(r0, 0, m->V), "embedding.word_embeddings.weight");
    if (emb == NULL || emb->kind != CKPTFS_PY_TENSOR || emb->tensor.ndim != 2)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no embedding.word_embeddings.weight matrix", r0->path);
    m->padded_vocab = emb->tensor.shape[0] * m->T;
    if (m->padded_vocab < m->vocab)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: the embedding has %" G_GUINT64_FORMAT
                    " rows over all ranks, fewer than vocab_size %" G_GUINT64_FORMAT, r0->path,
                    m->padded_vocab, m->vocab);
    m->layout = (CkptfsLayout){.tp = m->T, .pp = m->P, .vpp = m->V,
                               .pp_first = m->P > 1 ? m->options->pp_first : 0,
                               .pp_last = m->P > 1 ? m->options->pp_last : 0};
    return true;
}

static bool read_args(Mg *m)
{
    Rank *r0 = m->ranks[0];
    const CkptfsPy *root = ckptfs_pickle_root(r0->pickle);
    const CkptfsPy *args = ckptfs_py_object_state(ckptfs_py_dict_get(root, "args"));
    if (args == NULL)
        return read_config_sizes(m);
    uint64_t tp = 0, pp = 0;
    if (!arg_uint(m, args, r0->path, "num_layers", &m->layers) ||
        !arg_uint(m, args, r0->path, "hidden_size", &m->hidden) ||
        !arg_uint(m, args, r0->path, "num_attention_heads", &m->heads) ||
        !arg_uint(m, args, r0->path, "ffn_hidden_size", &m->ffn) ||
        !arg_uint(m, args, r0->path, "padded_vocab_size", &m->padded_vocab) ||
        !arg_uint(m, args, r0->path, "tensor_model_parallel_size", &tp) ||
        !arg_uint(m, args, r0->path, "pipeline_model_parallel_size", &pp))
        return false;
    if (tp != m->T || pp != m->P)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: args say tp %" G_GUINT64_FORMAT " pp %" G_GUINT64_FORMAT
                    " but the directory holds tp %u x pp %u rank files", r0->path, tp, pp, m->T, m->P);
    if (arg_uint_or(args, "expert_model_parallel_size", 1) != 1 || arg_uint_or(args, "num_experts", 0))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: mixture-of-experts checkpoints are not supported yet", r0->path);
    if (!arg_bool(args, "swiglu"))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: args.swiglu is not true; only SwiGLU models are supported", r0->path);
    m->groups = arg_bool(args, "group_query_attention") ? arg_uint_or(args, "num_query_groups", m->heads) : m->heads;
    m->head_dim = arg_uint_or(args, "kv_channels", m->hidden / m->heads);
    m->vocab = arg_uint_or(args, "vocab_size", m->padded_vocab);
    m->tied = !arg_bool(args, "untie_embeddings_and_output_weights");
    m->qkv_bias = arg_bool(args, "add_qkv_bias");
    m->qk_norm = arg_bool(args, "qk_layernorm");
    m->V = (unsigned)arg_uint_or(args, "virtual_pipeline_model_parallel_size", 1);
    m->layout = (CkptfsLayout){.tp = m->T, .pp = m->P, .vpp = m->V,
                               .pp_first = (unsigned)arg_uint_or(args, "decoder_first_pipeline_num_layers", 0),
                               .pp_last = (unsigned)arg_uint_or(args, "decoder_last_pipeline_num_layers", 0)};

    if (m->source->config != NULL)
        return true; /* given with -o hf_config / hf_extra */
    /* config.json as Hugging Face would write it for this model: the model rules then read it
     * like any HF config, and hf/ shows it. The architecture follows from the weights unless
     * -o hf_arch says (Mistral and Llama have the same ones). */
    const char *type = m->options->hf_arch ? m->options->hf_arch
                       : m->qk_norm        ? "qwen3"
                       : m->qkv_bias       ? "qwen2"
                                           : "llama";
    const char *arch = NULL;
    for (const CkptfsArchitecture *const *a = ckptfs_architectures(); *a; a++)
        if (strcmp((*a)->model_type, type) == 0)
            arch = (*a)->hf_architecture;
    JsonObject *c = json_object_new();
    JsonArray *archs = json_array_new();
    json_array_add_string_element(archs, arch);
    json_object_set_array_member(c, "architectures", archs);
    json_object_set_string_member(c, "model_type", type);
    json_object_set_int_member(c, "hidden_size", (gint64)m->hidden);
    json_object_set_int_member(c, "intermediate_size", (gint64)m->ffn);
    json_object_set_int_member(c, "num_attention_heads", (gint64)m->heads);
    json_object_set_int_member(c, "num_key_value_heads", (gint64)m->groups);
    json_object_set_int_member(c, "num_hidden_layers", (gint64)m->layers);
    json_object_set_int_member(c, "head_dim", (gint64)m->head_dim);
    json_object_set_int_member(c, "vocab_size", (gint64)m->vocab);
    json_object_set_int_member(c, "max_position_embeddings", (gint64)arg_uint_or(args, "max_position_embeddings", 4096));
    json_object_set_double_member(c, "rms_norm_eps",
                                  arg_double(args, "layernorm_epsilon", arg_double(args, "norm_epsilon", 1e-5)));
    json_object_set_double_member(c, "rope_theta", arg_double(args, "rotary_base", 10000));
    json_object_set_boolean_member(c, "tie_word_embeddings", m->tied);
    json_object_set_string_member(c, "hidden_act", "silu");
    json_object_set_string_member(c, "torch_dtype", "bfloat16");
    if (arg_bool(args, "use_rope_scaling")) {
        JsonObject *scaling = json_object_new();
        json_object_set_string_member(scaling, "rope_type", "llama3");
        json_object_set_double_member(scaling, "factor", arg_double(args, "rope_scaling_factor", 8.0));
        json_object_set_object_member(c, "rope_scaling", scaling);
    }
    m->source->config = c;
    return true;
}

typedef struct {
    uint32_t src;
    uint64_t base;       /* of element 0 in the file */
    uint64_t rows, cols; /* 2-D view */
    uint64_t row_stride; /* bytes */
} Located;

/* A rank tensor by key, checked to be contiguous with the expected 2-D shape (cols 1 for 1-D). */
static bool locate(Mg *m, Rank *r, unsigned v, const char *key, uint64_t rows, uint64_t cols,
                   Located *out)
{
    const CkptfsPy *t = ckptfs_py_dict_get(chunk_dict(r, v, m->V), key);
    g_hash_table_add(r->used, g_strdup_printf("%u/%s", v, key));
    if (t == NULL || t->kind != CKPTFS_PY_TENSOR)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is missing or not a tensor", r->path, key);
    uint64_t got_rows = t->tensor.ndim ? t->tensor.shape[0] : 1, got_cols = 1;
    for (unsigned d = 1; d < t->tensor.ndim; d++)
        got_cols *= t->tensor.shape[d];
    if (t->tensor.ndim > 2 || got_rows != rows || got_cols != cols)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' has shape [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    "]; the args imply [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                    r->path, key, got_rows, got_cols, rows, cols);
    if (t->tensor.dtype == CKPTFS_DTYPE_INVALID)
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has a storage type ckptfs does not know", r->path, key);
    if (m->dtype == CKPTFS_DTYPE_INVALID)
        m->dtype = t->tensor.dtype;
    if (t->tensor.dtype != m->dtype)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, other tensors are %s", r->path, key,
                    ckptfs_dtype_safetensors_name(t->tensor.dtype), ckptfs_dtype_safetensors_name(m->dtype));
    if ((t->tensor.ndim == 2 && (t->tensor.stride[1] != 1 || t->tensor.stride[0] != cols)) ||
        (t->tensor.ndim == 1 && t->tensor.stride[0] != 1))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' is not stored contiguously", r->path, key);
    g_autofree char *record = g_strdup_printf("data/%s", t->tensor.storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(r->zip, record);
    size_t isz = ckptfs_dtype_size(t->tensor.dtype);
    if (e == NULL || (t->tensor.offset + rows * cols) * isz > e->size)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s': its storage record %s is missing or too short",
                    r->path, key, record);
    *out = (Located){.src = r->src, .base = e->data_offset + t->tensor.offset * isz, .rows = rows,
                     .cols = cols, .row_stride = cols * isz};
    return true;
}

/* Pieces being collected for each HF tensor of the model, by name. */
typedef struct {
    GHashTable *pieces; /* name -> GArray of CkptfsPiece */
    GPtrArray *order;   /* names in HF order */
    GHashTable *shapes; /* name -> uint64_t[3] (ndim, d0, d1) */
} Collect;

static void want(Collect *c, const char *name, unsigned ndim, uint64_t d0, uint64_t d1)
{
    if (g_hash_table_contains(c->pieces, name))
        return;
    char *key = g_strdup(name);
    g_hash_table_insert(c->pieces, key, g_array_new(FALSE, FALSE, sizeof(CkptfsPiece)));
    uint64_t *shape = g_new(uint64_t, 3);
    shape[0] = ndim, shape[1] = d0, shape[2] = d1;
    g_hash_table_insert(c->shapes, key, shape);
    g_ptr_array_add(c->order, key);
}

/* Rows [r0, r1) x cols [c0, c1) of HF tensor NAME are at L's row LROW, column LCOL. */
static void piece(Collect *c, const char *name, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1,
                  const Located *l, uint64_t lrow, uint64_t lcol, size_t isz)
{
    CkptfsPiece p = {.row0 = r0, .row1 = r1, .col0 = c0, .col1 = c1, .src = l->src,
                     .offset = l->base + lrow * l->row_stride + lcol * isz, .row_stride = l->row_stride};
    g_array_append_val(g_hash_table_lookup(c->pieces, name), p);
}

static bool map_layer(Mg *m, Collect *c, unsigned p, unsigned v, uint64_t local, uint64_t g)
{
    unsigned T = m->T;
    uint64_t H = m->hidden, d = m->head_dim, hpg = m->heads / m->groups;
    uint64_t q = m->heads * d, kv = m->groups * d, block = (hpg + 2) * d, R = block * m->groups;
    size_t isz = ckptfs_dtype_size(m->dtype == CKPTFS_DTYPE_INVALID ? CKPTFS_DTYPE_BF16 : m->dtype);
    char pre[64], key[160];
    g_snprintf(pre, sizeof pre, "decoder.layers.%" G_GUINT64_FORMAT ".", local);
#define K(s) (g_snprintf(key, sizeof key, "%s%s", pre, s), key)
    g_autofree char *hq = ckptfs_hf_layer_name(g, "self_attn.q_proj.weight");
    g_autofree char *hk = ckptfs_hf_layer_name(g, "self_attn.k_proj.weight");
    g_autofree char *hv = ckptfs_hf_layer_name(g, "self_attn.v_proj.weight");
    g_autofree char *hqb = ckptfs_hf_layer_name(g, "self_attn.q_proj.bias");
    g_autofree char *hkb = ckptfs_hf_layer_name(g, "self_attn.k_proj.bias");
    g_autofree char *hvb = ckptfs_hf_layer_name(g, "self_attn.v_proj.bias");
    g_autofree char *hn1 = ckptfs_hf_layer_name(g, "input_layernorm.weight");
    g_autofree char *hn2 = ckptfs_hf_layer_name(g, "post_attention_layernorm.weight");
    g_autofree char *hqn = ckptfs_hf_layer_name(g, "self_attn.q_norm.weight");
    g_autofree char *hkn = ckptfs_hf_layer_name(g, "self_attn.k_norm.weight");
    g_autofree char *ho = ckptfs_hf_layer_name(g, "self_attn.o_proj.weight");
    g_autofree char *hg = ckptfs_hf_layer_name(g, "mlp.gate_proj.weight");
    g_autofree char *hu = ckptfs_hf_layer_name(g, "mlp.up_proj.weight");
    g_autofree char *hd = ckptfs_hf_layer_name(g, "mlp.down_proj.weight");
    want(c, hn1, 1, H, 0);
    want(c, hq, 2, q, H), want(c, hk, 2, kv, H), want(c, hv, 2, kv, H);
    if (m->qkv_bias)
        want(c, hqb, 1, q, 0), want(c, hkb, 1, kv, 0), want(c, hvb, 1, kv, 0);
    if (m->qk_norm)
        want(c, hqn, 1, d, 0), want(c, hkn, 1, d, 0);
    want(c, ho, 2, H, q), want(c, hn2, 1, H, 0);
    want(c, hg, 2, m->ffn, H), want(c, hu, 2, m->ffn, H), want(c, hd, 2, H, m->ffn);

    /* Replicated norms: served from TP rank 0; every rank must hold them with that shape. */
    const struct {
        const char *key, *hf;
        uint64_t rows;
        bool present;
    } norms[] = {
        {m->te ? "self_attention.linear_qkv.layer_norm_weight" : "input_layernorm.weight", hn1, H, true},
        {m->te ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight", hn2, H, true},
        {"self_attention.q_layernorm.weight", hqn, d, m->qk_norm},
        {"self_attention.k_layernorm.weight", hkn, d, m->qk_norm},
    };
    Located l;
    for (size_t k = 0; k < G_N_ELEMENTS(norms); k++) {
        if (!norms[k].present)
            continue;
        for (unsigned t = T; t-- > 0;)
            if (!locate(m, m->ranks[p * T + t], v, K(norms[k].key), norms[k].rows, 1, &l))
                return false;
        piece(c, norms[k].hf, 0, norms[k].rows, 0, 1, &l, 0, 0, isz);
    }
    for (unsigned t = 0; t < T; t++) {
        Rank *r = m->ranks[p * T + t];
        uint64_t lo = t * R / T, hi = (t + 1) * R / T;
        for (int bias = 0; bias <= (m->qkv_bias ? 1 : 0); bias++) {
            uint64_t cols = bias ? 1 : H;
            if (!locate(m, r, v, bias ? K("self_attention.linear_qkv.bias") : K("self_attention.linear_qkv.weight"),
                        hi - lo, cols, &l))
                return false;
            for (uint64_t grp = 0; grp < m->groups; grp++) {
                const struct {
                    const char *name;
                    uint64_t src_row, at, rows;
                } segs[3] = {{bias ? hqb : hq, grp * hpg * d, grp * block, hpg * d},
                             {bias ? hkb : hk, grp * d, grp * block + hpg * d, d},
                             {bias ? hvb : hv, grp * d, grp * block + (hpg + 1) * d, d}};
                for (int s = 0; s < 3; s++) {
                    uint64_t a = MAX(lo, segs[s].at), z = MIN(hi, segs[s].at + segs[s].rows);
                    if (a < z)
                        piece(c, segs[s].name, segs[s].src_row + (a - segs[s].at),
                              segs[s].src_row + (z - segs[s].at), 0, cols, &l, a - lo, 0, isz);
                }
            }
        }
        if (!locate(m, r, v, K("self_attention.linear_proj.weight"), H, q / T, &l))
            return false;
        piece(c, ho, 0, H, t * q / T, (t + 1) * q / T, &l, 0, 0, isz);
        uint64_t f = m->ffn / T;
        if (!locate(m, r, v, K("mlp.linear_fc1.weight"), 2 * f, H, &l))
            return false;
        piece(c, hg, t * f, (t + 1) * f, 0, H, &l, 0, 0, isz);
        piece(c, hu, t * f, (t + 1) * f, 0, H, &l, f, 0, isz);
        if (!locate(m, r, v, K("mlp.linear_fc2.weight"), H, f, &l))
            return false;
        piece(c, hd, 0, H, t * f, (t + 1) * f, &l, 0, 0, isz);
    }
#undef K
    return true;
}

/* Embedding or output layer: padded vocabulary split by rows over the TP ranks of stage P. */
static bool map_vocab(Mg *m, Collect *c, unsigned p, unsigned v, const char *key, const char *hf)
{
    uint64_t per = m->padded_vocab / m->T, H = m->hidden;
    size_t isz = ckptfs_dtype_size(m->dtype == CKPTFS_DTYPE_INVALID ? CKPTFS_DTYPE_BF16 : m->dtype);
    want(c, hf, 2, m->vocab, H);
    for (unsigned t = 0; t < m->T; t++) {
        Located l;
        if (!locate(m, m->ranks[p * m->T + t], v, key, per, H, &l))
            return false;
        uint64_t lo = t * per, hi = MIN(lo + per, m->vocab);
        if (lo < hi)
            piece(c, hf, lo, hi, 0, H, &l, 0, 0, isz);
    }
    return true;
}

static bool map_model(Mg *m, Collect *c)
{
    const CkptfsPy *first = chunk_dict(m->ranks[0], 0, m->V);
    if (first == NULL)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no '%s' state dict", m->ranks[0]->path,
                    m->V == 1 ? "model" : "model0");
    m->te = ckptfs_py_dict_get(first, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight") != NULL;
    CkptfsModel shape = {.layers = m->layers};
    if (!map_vocab(m, c, 0, 0, "embedding.word_embeddings.weight", "model.embed_tokens.weight"))
        return false;
    for (unsigned v = 0; v < m->V; v++)
        for (unsigned p = 0; p < m->P; p++) {
            uint64_t start, count;
            ckptfs_layout_chunk_layers(&m->layout, &shape, p, v, &start, &count);
            for (uint64_t i = 0; i < count; i++)
                if (!map_layer(m, c, p, v, i, start + i))
                    return false;
        }
    unsigned lp = m->P - 1, lv = m->V - 1;
    Located l;
    want(c, "model.norm.weight", 1, m->hidden, 0);
    for (unsigned t = m->T; t-- > 0;)
        if (!locate(m, m->ranks[lp * m->T + t], lv, "decoder.final_layernorm.weight", m->hidden, 1, &l))
            return false;
    piece(c, "model.norm.weight", 0, m->hidden, 0, 1, &l, 0, 0, ckptfs_dtype_size(m->dtype));
    if (!m->tied)
        return map_vocab(m, c, lp, lv, "output_layer.weight", "lm_head.weight");
    /* Tied: the last stage's copy of the embedding is not a separate HF tensor. */
    for (unsigned t = 0; t < m->T; t++)
        g_hash_table_add(m->ranks[lp * m->T + t]->used, g_strdup_printf("%u/output_layer.weight", lv));
    return true;
}

/* Every key of every chunk must have been mapped, or be an _extra_state. */
static bool check_unexpected(Mg *m)
{
    for (unsigned i = 0; i < m->T * m->P; i++) {
        Rank *r = m->ranks[i];
        g_autoptr(GString) extra = g_string_new(NULL);
        unsigned n = 0;
        for (unsigned v = 0; v < m->V; v++) {
            const CkptfsPy *dict = chunk_dict(r, v, m->V);
            g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
            for (guint k = 0; dict && k + 1 < dict->items->len; k += 2) {
                const char *key = ckptfs_py_str(g_ptr_array_index(dict->items, k));
                if (key && !g_hash_table_add(seen, (gpointer)key))
                    return fail(m, CKPTFS_ERROR_FORMAT, "%s: model entry '%s' is given twice", r->path, key);
                g_autofree char *tag = g_strdup_printf("%u/%s", v, key ? key : "");
                if (key == NULL || g_str_has_suffix(key, "._extra_state") ||
                    g_hash_table_contains(r->used, tag))
                    continue;
                if (n++ < 5)
                    g_string_append_printf(extra, "%s'%s'", extra->len ? ", " : "", key);
            }
        }
        if (n > 0)
            return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: %u unexpected model entries: %s%s", r->path, n,
                        extra->str, n > 5 ? ", ..." : "");
    }
    return true;
}

/* -o hf_config / the config.json of -o hf_extra replace the synthesized one, as given. */
static bool use_given_config(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    g_autofree char *extra_config = options->hf_extra ? g_build_filename(options->hf_extra, "config.json", NULL) : NULL;
    const char *path = options->hf_config ? options->hf_config
                       : extra_config && g_file_test(extra_config, G_FILE_TEST_IS_REGULAR) ? extra_config
                                                                                            : NULL;
    if (path == NULL)
        return true;
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    GError *json_error = NULL;
    if (!json_parser_load_from_file(parser, path, &json_error) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser))) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a JSON object%s%s", path,
                    json_error ? ": " : "", json_error ? json_error->message : "");
        g_clear_error(&json_error);
        return false;
    }
    if (source->config)
        json_object_unref(source->config);
    source->config = json_object_ref(json_node_get_object(json_parser_get_root(parser)));
    return ckptfs_source_add_file(source, "config.json", path, error);
}

/* Files hf/ passes through from -o hf_extra (tokenizer and the like); weights are not taken. */
static bool add_extra_files(CkptfsSource *source, const char *dir, GError **error)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        if (g_str_has_suffix(name, ".safetensors") || strcmp(name, "model.safetensors.index.json") == 0)
            continue;
        g_autofree char *path = g_build_filename(dir, name, NULL);
        if (g_file_test(path, G_FILE_TEST_IS_REGULAR) && !ckptfs_source_add_file(source, name, path, error))
            return false;
    }
    return true;
}

bool ckptfs_source_open_megatron(CkptfsSource *source, const CkptfsOptions *options,
                                 GError **error)
{
    source->kind = CKPTFS_SOURCE_MEGATRON;
    g_autofree char *iter = iteration_dir(source->dir, options->iteration, error);
    if (iter == NULL)
        return false;
    Mg m = {.source = source, .options = options, .error = error};
    Collect c = {.pieces = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, (GDestroyNotify)g_array_unref),
                 .order = g_ptr_array_new_with_free_func(g_free),
                 .shapes = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free)};
    bool ok = find_ranks(&m, iter);
    for (unsigned i = 0; ok && i < m.T * m.P; i++)
        ok = open_rank(&m, m.ranks[i]);
    ok = ok && use_given_config(source, options, error) && read_args(&m);
    if (ok && !ckptfs_layout_validate(&m.layout, &(CkptfsModel){.layers = m.layers, .heads = m.heads,
                                      .kv_heads = m.groups, .ffn = m.ffn}, error))
        ok = false;
    ok = ok && map_model(&m, &c) && check_unexpected(&m);
    for (guint i = 0; ok && i < c.order->len; i++) {
        const char *name = g_ptr_array_index(c.order, i);
        GArray *pieces = g_hash_table_lookup(c.pieces, name);
        const uint64_t *shape = g_hash_table_lookup(c.shapes, name);
        ok = ckptfs_catalog_add_pieces(source->catalog, name, m.dtype, (unsigned)shape[0], shape + 1,
                                       (const CkptfsPiece *)(void *)pieces->data, pieces->len, error) != NULL;
    }
    ok = ok && (options->hf_extra == NULL || add_extra_files(source, options->hf_extra, error));
    if (ok)
        source->megatron_layout = m.layout;
    for (unsigned i = 0; m.ranks && i < m.T * m.P; i++)
        rank_free(m.ranks[i]);
    g_free(m.ranks);
    g_hash_table_unref(c.pieces);
    g_hash_table_unref(c.shapes);
    g_ptr_array_unref(c.order);
    return ok;
}
