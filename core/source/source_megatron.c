/* Megatron-core legacy checkpoints as a source: per-rank torch.save files for one TP/PP/VPP
 * split. Every global tensor becomes a catalog tensor under its Hugging Face name, made of
 * pieces that point into the rank files (QKV groups de-interleaved, fc1 split into gate and
 * up, row-parallel shards side by side, vocabulary padding cut). Only the pickles are read;
 * tensor data, optimizer and RNG state are never touched. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/limits.h"
#include "ckptfs/mcore.h"
#include "ckptfs/pickle.h"
#include "ckptfs/zipreader.h"
#include "source_internal.h"

#define TRACKER "latest_checkpointed_iteration.txt"

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
    CkptfsMegatronModel saved; /* the model, its padded vocabulary and the saved split */
    GPtrArray *keys;           /* CkptfsMcoreKey* of the model, vocabulary padded as saved */
    bool te;                   /* Transformer Engine names (else the local spec's) */
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

static bool probe_megatron(const char *dir, const CkptfsOptions *options)
{
    (void)options;
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

#define fail(ctx, ...) ckptfs_fail((ctx)->error, __VA_ARGS__)

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
    GBytes *pkl = ckptfs_zip_read(r->zip, m->source->files, "data.pkl", CKPTFS_MAX_RANK_PICKLE_BYTES, m->error);
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

/* Rank files saved without args: the sizes come from the config.json given with -o hf_config or
 * -o hf_extra, the split from the files (virtual chunks from the model0.. keys, the padded
 * vocabulary from the embedding's rows); locate() then checks every shape against them. */
static bool read_config_sizes(Mg *m)
{
    Rank *r0 = m->ranks[0];
    if (!ckptfs_megatron_model_from_config(m->source->config, r0->path, &m->saved, m->error))
        return false;
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
    if (!ckptfs_mul_u64(emb->tensor->shape[0], m->T, &m->saved.padded_vocab))
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: the embedding's %" G_GUINT64_FORMAT " rows x %u ranks "
                    "overflow 64 bits", r0->path, emb->tensor->shape[0], m->T);
    if (m->saved.padded_vocab < m->saved.model.vocab)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: the embedding has %" G_GUINT64_FORMAT
                    " rows over all ranks, fewer than vocab_size %" G_GUINT64_FORMAT, r0->path,
                    m->saved.padded_vocab, m->saved.model.vocab);
    m->saved.layout = (CkptfsLayout){.tp = m->T, .pp = m->P, .vpp = m->V,
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
    if (!ckptfs_megatron_model_from_args(args, r0->path, m->options->hf_arch, m->source->config, &m->saved, m->error))
        return false;
    const CkptfsLayout *saved = &m->saved.layout;
    if (saved->tp != m->T || saved->pp != m->P)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: args say tp %u pp %u but the directory holds tp %u x "
                    "pp %u rank files", r0->path, saved->tp, saved->pp, m->T, m->P);
    m->V = saved->vpp;
    if (m->source->config == NULL) /* else given with -o hf_config / hf_extra */
        ckptfs_megatron_synthesize_config(m->source, &m->saved.model);
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
    if (t->tensor->ndim > 1 && !ckptfs_dims_product(t->tensor->shape + 1, t->tensor->ndim - 1, &got_cols))
        got_cols = UINT64_MAX; /* no expected shape has that many columns: refused below */
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
    uint64_t row_step = t->tensor->ndim == 0 || rows <= 1 ? cols : t->tensor->stride[0];
    if ((t->tensor->ndim == 2 && cols > 1 && t->tensor->stride[1] != 1) ||
        (t->tensor->ndim == 2 && rows > 1 && row_step < cols) || (rows > 1 && row_step == 0))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has strides that are not row-major (a "
                    "transposed view); save it contiguous", r->path, key);
    g_autofree char *record = g_strdup_printf("data/%s", t->tensor->storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(r->zip, record);
    size_t isz = ckptfs_dtype_size(t->tensor->dtype);
    uint64_t offset = t->tensor->offset, end = 0;
    if (e == NULL)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s': its storage record %s is missing", r->path, key, record);
    /* The last row's end, (offset + (rows - 1) * stride + cols) * itemsize, checked before it
     * is compared with the record: wrapped, it would pass and point anywhere. */
    if (!ckptfs_rows_end(offset, rows, row_step, cols, isz, &end))
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s': stride %" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT
                    " rows of %" G_GUINT64_FORMAT " %zu-byte elements from storage offset %" G_GUINT64_FORMAT
                    " overflows 64 bits", r->path, key, row_step, rows, cols, isz, offset);
    if (end > e->size)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s': its rows reach byte %" G_GUINT64_FORMAT " of storage "
                    "record %s, which has %" G_GUINT64_FORMAT, r->path, key, end, record, e->size);
    /* offset * isz and (rows - 1) * row_step * isz are both at most END: no overflow below. */
    *out = (Located){.src = r->src, .base = e->data_offset + offset * isz, .rows = rows,
                     .cols = cols, .row_stride = row_step * isz};
    return true;
}

/* The rank tensors of SCOPE in chunk V of stage P (LAYER: layer LOCAL of the chunk, global
 * layer GLOBAL) mapped back to Hugging Face pieces: each is rank t's TP share of a key of the
 * mapping table. Replicated tensors (norms) must be on every rank; they are read from rank 0. */
static bool map_entries(Mg *m, CkptfsPieceSet *set, unsigned p, unsigned v, CkptfsScope scope,
                        uint64_t local, uint64_t global)
{
    g_autoptr(GPtrArray) rules = ckptfs_legacy_entries(&m->saved.model, scope, global, m->te, false);
    for (guint i = 0; i < rules->len; i++) {
        const CkptfsRule *rule = g_ptr_array_index(rules, i);
        if (rule->extra_state)
            continue;
        const CkptfsMcoreKey *key = ckptfs_mcore_key_of(m->keys, rule);
        const char *name = ckptfs_rule_legacy_name(rule, m->te);
        g_autofree char *entry = scope == CKPTFS_SCOPE_LAYER
                                     ? g_strdup_printf("decoder.layers.%" G_GUINT64_FORMAT ".%s", local, name)
                                     : g_strdup(name);
        for (unsigned t = m->T; t-- > 0;) {
            uint64_t rows, cols;
            g_autoptr(GArray) parts = ckptfs_mcore_share(key, m->T, t, &rows, &cols);
            Located l = {0};
            if (!locate(m, m->ranks[p * m->T + t], v, entry, rows, cols, &l))
                return false;
            if (key->split == CKPTFS_TP_REPLICATED && t != 0)
                continue;
            uint64_t row = 0;
            for (guint k = 0; k < parts->len; row += g_array_index(parts, CkptfsSharePart, k).rows, k++) {
                const CkptfsSharePart *part = &g_array_index(parts, CkptfsSharePart, k);
                if (part->hf == NULL)
                    continue; /* vocabulary padding */
                g_autofree char *hf = ckptfs_mcore_hf_name(key, global, 0, part->hf);
                CkptfsPiece piece = {.row0 = part->hf_row0, .row1 = part->hf_row0 + part->rows,
                                     .col0 = part->col0, .col1 = part->col0 + part->cols, .src = l.src,
                                     .offset = l.base + row * l.row_stride, .row_stride = l.row_stride};
                ckptfs_piece_set_add(set, hf, &piece);
            }
        }
    }
    return true;
}

static bool map_model(Mg *m, CkptfsPieceSet *set)
{
    const CkptfsPy *first = chunk_dict(m->ranks[0], 0, m->V);
    if (first == NULL)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no '%s' state dict", m->ranks[0]->path,
                    m->V == 1 ? "model" : "model0");
    m->te = ckptfs_py_dict_get(first, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight") != NULL;
    const CkptfsModel *model = &m->saved.model;
    m->keys = ckptfs_mcore_keys(model, m->saved.padded_vocab, false);
    ckptfs_piece_set_want_model(set, model, m->keys);
    if (!map_entries(m, set, 0, 0, CKPTFS_SCOPE_FIRST, 0, 0))
        return false;
    for (unsigned v = 0; v < m->V; v++)
        for (unsigned p = 0; p < m->P; p++) {
            uint64_t start, count;
            ckptfs_layout_chunk_layers(&m->saved.layout, model, p, v, &start, &count);
            for (uint64_t i = 0; i < count; i++)
                if (!map_entries(m, set, p, v, CKPTFS_SCOPE_LAYER, i, start + i))
                    return false;
        }
    unsigned lp = m->P - 1, lv = m->V - 1;
    if (!map_entries(m, set, lp, lv, CKPTFS_SCOPE_LAST, 0, 0))
        return false;
    /* Tied: the last stage's copy of the embedding is not a separate HF tensor. */
    for (unsigned t = 0; model->tied_embeddings && t < m->T; t++)
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

static bool open_megatron(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    g_autofree char *iter = ckptfs_megatron_iteration_dir(source->dir, options->iteration, error);
    if (iter == NULL)
        return false;
    Mg m = {.source = source, .options = options, .error = error};
    CkptfsPieceSet *c = ckptfs_piece_set_new();
    bool ok = find_ranks(&m, iter);
    for (unsigned i = 0; ok && i < m.T * m.P; i++)
        ok = open_rank(&m, m.ranks[i]);
    ok = ok && ckptfs_source_use_given_config(source, options, error) && read_args(&m);
    ok = ok && ckptfs_model_check_limits(&m.saved.model, m.ranks[0]->path, error);
    if (ok && !ckptfs_layout_validate(&m.saved.layout, &m.saved.model, error))
        ok = false;
    ok = ok && map_model(&m, c) && check_unexpected(&m);
    ok = ok && ckptfs_piece_set_to_catalog(c, source->catalog, m.dtype, error);
    ok = ok && (options->hf_extra == NULL || ckptfs_source_add_extra_files(source, options->hf_extra, error));
    if (ok)
        source->saved_layout = m.saved.layout;
    if (m.keys)
        g_ptr_array_unref(m.keys);
    for (unsigned i = 0; m.ranks && i < m.T * m.P; i++)
        rank_free(m.ranks[i]);
    g_free(m.ranks);
    ckptfs_piece_set_free(c);
    return ok;
}

const CkptfsSourceFormat ckptfs_format_megatron = {"megatron-legacy", probe_megatron, open_megatron,
                                                   ckptfs_megatron_describe};
