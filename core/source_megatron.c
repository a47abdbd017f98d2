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

static void take_sizes(Mg *m, const CkptfsMegatronSizes *s)
{
    m->layers = s->layers, m->hidden = s->hidden, m->heads = s->heads, m->groups = s->groups;
    m->head_dim = s->head_dim, m->ffn = s->ffn, m->vocab = s->vocab, m->padded_vocab = s->padded_vocab;
    m->tied = s->tied, m->qkv_bias = s->qkv_bias, m->qk_norm = s->qk_norm;
}

/* Rank files saved without args: the sizes come from the config.json given with -o hf_config or
 * -o hf_extra, the split from the files (virtual chunks from the model0.. keys, the padded
 * vocabulary from the embedding's rows); locate() then checks every shape against them. */
static bool read_config_sizes(Mg *m)
{
    Rank *r0 = m->ranks[0];
    CkptfsMegatronSizes s;
    if (!ckptfs_megatron_sizes_from_config(m->source->config, r0->path, &s, m->error))
        return false;
    take_sizes(m, &s);
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
    if (emb == NULL || emb->kind != CKPTFS_PY_TENSOR || emb->tensor->ndim != 2)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no embedding.word_embeddings.weight matrix", r0->path);
    m->padded_vocab = emb->tensor->shape[0] * m->T;
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
    CkptfsMegatronSizes s;
    if (!ckptfs_megatron_sizes_from_args(args, r0->path, &s, m->error))
        return false;
    if (s.layout.tp != m->T || s.layout.pp != m->P)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: args say tp %u pp %u but the directory holds tp %u x "
                    "pp %u rank files", r0->path, s.layout.tp, s.layout.pp, m->T, m->P);
    take_sizes(m, &s);
    m->V = s.layout.vpp;
    m->layout = s.layout;
    if (m->source->config == NULL) /* else given with -o hf_config / hf_extra */
        ckptfs_megatron_synthesize_config(m->source, &s, args, m->options->hf_arch);
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
    uint64_t got_rows = t->tensor->ndim ? t->tensor->shape[0] : 1, got_cols = 1;
    for (unsigned d = 1; d < t->tensor->ndim; d++)
        got_cols *= t->tensor->shape[d];
    if (t->tensor->ndim > 2 || got_rows != rows || got_cols != cols)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' has shape [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    "]; the args imply [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                    r->path, key, got_rows, got_cols, rows, cols);
    if (t->tensor->dtype == CKPTFS_DTYPE_INVALID)
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has a storage type ckptfs does not know", r->path, key);
    if (m->dtype == CKPTFS_DTYPE_INVALID)
        m->dtype = t->tensor->dtype;
    if (t->tensor->dtype != m->dtype)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, other tensors are %s", r->path, key,
                    ckptfs_dtype_safetensors_name(t->tensor->dtype), ckptfs_dtype_safetensors_name(m->dtype));
    /* Rows may be apart (a view of a wider matrix, every n-th element of a vector); elements
     * within a row must be adjacent: pieces are runs of bytes. */
    uint64_t row_step = t->tensor->ndim == 0 ? cols : t->tensor->stride[0];
    if ((t->tensor->ndim == 2 && cols > 1 && t->tensor->stride[1] != 1) ||
        (t->tensor->ndim == 2 && rows > 1 && row_step < cols) || (rows > 1 && row_step == 0))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has strides that are not row-major (a "
                    "transposed view); save it contiguous", r->path, key);
    g_autofree char *record = g_strdup_printf("data/%s", t->tensor->storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(r->zip, record);
    size_t isz = ckptfs_dtype_size(t->tensor->dtype);
    uint64_t span = rows > 1 ? (rows - 1) * row_step + cols : rows * cols;
    bool huge = rows > 1 && row_step > (UINT64_MAX / isz - cols) / (rows - 1);
    if (e == NULL || huge || t->tensor->offset > e->size / isz || (t->tensor->offset + span) * isz > e->size)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s': its storage record %s is missing or too short",
                    r->path, key, record);
    *out = (Located){.src = r->src, .base = e->data_offset + t->tensor->offset * isz, .rows = rows,
                     .cols = cols, .row_stride = row_step * isz};
    return true;
}

typedef CkptfsPieceSet Collect;

static void want(Collect *c, const char *name, unsigned ndim, uint64_t d0, uint64_t d1)
{
    ckptfs_piece_set_want(c, name, ndim, d0, d1);
}

/* Rows [r0, r1) x cols [c0, c1) of HF tensor NAME are at L's row LROW, column LCOL. */
static void piece(Collect *c, const char *name, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1,
                  const Located *l, uint64_t lrow, uint64_t lcol, size_t isz)
{
    CkptfsPiece p = {.row0 = r0, .row1 = r1, .col0 = c0, .col1 = c1, .src = l->src,
                     .offset = l->base + lrow * l->row_stride + lcol * isz, .row_stride = l->row_stride};
    ckptfs_piece_set_add(c, name, &p);
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

bool ckptfs_source_open_megatron(CkptfsSource *source, const CkptfsOptions *options,
                                 GError **error)
{
    source->kind = CKPTFS_SOURCE_MEGATRON;
    g_autofree char *iter = ckptfs_megatron_iteration_dir(source->dir, options->iteration, error);
    if (iter == NULL)
        return false;
    Mg m = {.source = source, .options = options, .error = error};
    Collect *c = ckptfs_piece_set_new();
    bool ok = find_ranks(&m, iter);
    for (unsigned i = 0; ok && i < m.T * m.P; i++)
        ok = open_rank(&m, m.ranks[i]);
    ok = ok && ckptfs_source_use_given_config(source, options, error) && read_args(&m);
    if (ok && !ckptfs_layout_validate(&m.layout, &(CkptfsModel){.layers = m.layers, .heads = m.heads,
                                      .kv_heads = m.groups, .ffn = m.ffn}, error))
        ok = false;
    ok = ok && map_model(&m, c) && check_unexpected(&m);
    ok = ok && ckptfs_piece_set_to_catalog(c, source->catalog, m.dtype, error);
    ok = ok && (options->hf_extra == NULL || ckptfs_source_add_extra_files(source, options->hf_extra, error));
    if (ok)
        source->megatron_layout = m.layout;
    for (unsigned i = 0; m.ranks && i < m.T * m.P; i++)
        rank_free(m.ranks[i]);
    g_free(m.ranks);
    ckptfs_piece_set_free(c);
    return ok;
}
