/* Megatron-core legacy checkpoints as a source: per-rank torch.save files for one TP/PP/VPP
 * split, with expert parallelism (EP, expert TP) for mixtures of experts. Every global tensor
 * becomes a catalog tensor under its Hugging Face name, made of pieces that point into the rank
 * files (QKV groups de-interleaved, fc1 split into gate and up, row-parallel shards side by
 * side, vocabulary padding cut, experts gathered from their EP ranks' files). The file set must
 * be exactly Megatron's writer grid for the saved layout (ckptfs_layout_rank_files). verl's
 * 2025 saves (mp_rank_TT[_PPP]/model.pt: a list of the chunks' state dicts, no args) are read
 * the same way. Only the pickles are read; tensor data, optimizer and RNG state are never
 * touched. */
#include <errno.h>
#include <limits.h>
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

/* One rank file: mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt. */
typedef struct {
    char *name;          /* the directory's name */
    unsigned nparts;     /* number parts after mp_rank_TT: 0, 1 (PPP or EEE) or 2 */
    unsigned num[3];     /* the numbers in the name */
    unsigned tp, pp, ep, etp; /* dense TP, PP, EP and expert TP ranks (once the layout is known) */
    char *path;
    uint32_t src;
    CkptfsZip *zip;
    CkptfsPickle *pickle;
    GHashTable *used; /* keys consumed, per chunk "model0/name" */
} Rank;

typedef struct {
    CkptfsSource *source;
    const CkptfsOptions *options;
    const char *iter;
    const CkptfsRankFiles *files; /* the rank files' name and pickle root */
    GHashTable *found;  /* directory name -> Rank* (owned): every mp_rank_* directory */
    Rank *first;        /* tp, pp and ep rank 0: its args say the layout */
    unsigned T, P, V, E, X; /* tp, pp, vpp, ep, etp */
    unsigned F;         /* files per pipeline stage */
    Rank **ranks;       /* [p * F + i]: stage p's files in Megatron's writer order (borrowed) */
    unsigned *dense_reader;  /* [t]: the file of a stage whose dense TP share t is read */
    unsigned *expert_reader; /* [ep * X + etp]: the file whose expert share is read */
    CkptfsMegatronModel saved; /* the model, its padded vocabulary and the saved split */
    GPtrArray *keys;           /* CkptfsMcoreKey* of the model, vocabulary padded as saved */
    bool te;                   /* Transformer Engine names (else the local spec's) */
    /* "mtp.layers.J." while an MTP layer is mapped, a module list's
     * "decoder.deepstack_merger_list.J." while its module J is */
    const char *mtp_prefix;
    /* the part being mapped: the model (a VLM's language model) or a VLM's vision tower, its
     * keys, and its module's prefix in the state dict ("" for a text model) */
    const CkptfsModel *part;
    const GPtrArray *part_keys;
    const char *prefix;
    CkptfsModel tower;         /* a VLM's vision tower (its blocks the layers) */
    GPtrArray *tower_keys;     /* its keys; NULL for a text model */
    CkptfsDtype dtype;
    GError **error;
} Mg;

static void rank_free(gpointer p)
{
    Rank *r = p;
    if (r == NULL)
        return;
    ckptfs_pickle_free(r->pickle);
    ckptfs_zip_free(r->zip);
    if (r->used)
        g_hash_table_unref(r->used);
    g_free(r->name);
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

/* "mp_rank_" then digits, then up to a few "_digits" parts: a rank directory. Whether its parts
 * are the ones the layout names is decided later (names of other shapes are unexpected). */
static bool parse_rank_name(const char *name, Rank *r)
{
    if (!g_str_has_prefix(name, "mp_rank_"))
        return false;
    const char *p = name + strlen("mp_rank_");
    unsigned n = 0;
    for (;;) {
        size_t digits = strspn(p, "0123456789");
        if (digits == 0 || digits > 6)
            return false;
        if (n < 3)
            r->num[n] = (unsigned)strtoul(p, NULL, 10);
        n++;
        p += digits;
        if (*p == '\0')
            break;
        if (*p != '_' || n >= 4)
            return false;
        p++;
    }
    r->nparts = n - 1;
    return true;
}

/* Every rank directory of ITER, and the first rank's (tp, pp and ep rank 0), whose args say
 * the layout. */
static bool scan_ranks(Mg *m)
{
    g_autoptr(GDir) d = g_dir_open(m->iter, 0, NULL);
    if (d == NULL)
        return fail(m, CKPTFS_ERROR_IO, "%s: cannot list", m->iter);
    m->found = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, rank_free);
    const char *name;
    while ((name = g_dir_read_name(d)) != NULL) {
        Rank r = {0};
        if (!parse_rank_name(name, &r))
            continue;
        Rank *found = g_new0(Rank, 1);
        *found = r;
        found->name = g_strdup(name);
        found->path = g_build_filename(m->iter, name, m->files->rank_file, NULL);
        g_hash_table_insert(m->found, found->name, found);
        bool zero = found->nparts <= 2 && found->num[0] == 0 && found->num[1] == 0 && found->num[2] == 0;
        /* Of mp_rank_00, mp_rank_00_000 (both exist only in a broken checkpoint): the shorter */
        if (zero && (m->first == NULL || found->nparts < m->first->nparts))
            m->first = found;
    }
    if (g_hash_table_size(m->found) == 0)
        return fail(m, CKPTFS_ERROR_NOT_FOUND, "%s: no mp_rank_* directories", m->iter);
    if (m->first == NULL)
        return fail(m, CKPTFS_ERROR_NOT_FOUND, "%s/mp_rank_00/%s: missing (no mp_rank_00, "
                    "mp_rank_00_000 or mp_rank_00_000_000: the first rank's file)", m->iter, m->files->rank_file);
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
    if (r->pickle == NULL || !m->files->chunk_list)
        return r->pickle != NULL;
    /* verl's model.pt: torch.save of the list of the virtual chunks' state dicts. */
    const CkptfsPy *root = ckptfs_pickle_root(r->pickle);
    bool dicts = root->kind == CKPTFS_PY_LIST && root->items->len > 0;
    for (guint v = 0; dicts && v < root->items->len; v++)
        dicts = ((const CkptfsPy *)g_ptr_array_index(root->items, v))->kind == CKPTFS_PY_DICT;
    if (!dicts)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: its root is not a list of state dicts (one per virtual "
                    "pipeline chunk, as verl saves model.pt)", r->path);
    return true;
}

/* The model dict of virtual chunk V of a rank. */
static const CkptfsPy *chunk_dict(const Mg *m, const Rank *r, unsigned v, unsigned V)
{
    const CkptfsPy *root = ckptfs_pickle_root(r->pickle);
    if (m->files->chunk_list)
        return v < root->items->len ? g_ptr_array_index(root->items, v) : NULL;
    if (V == 1)
        return ckptfs_py_dict_get(root, "model");
    char key[16];
    g_snprintf(key, sizeof key, "model%u", v);
    return ckptfs_py_dict_get(root, key);
}

/* The largest number at part I of the rank names with NPARTS parts. */
static unsigned max_name_part(const Mg *m, unsigned nparts, unsigned i)
{
    unsigned max = 0;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, m->found);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        const Rank *r = value;
        if (r->nparts == nparts)
            max = MAX(max, r->num[i]);
    }
    return max;
}

/* Without args, the expert TP size from an expert's fc1 rows (2 * ffn / etp) in the first
 * rank's chunks; tp when none holds an expert (a shape that does not fit is then reported by
 * locate). */
static unsigned guess_etp(const Mg *m, const Rank *r)
{
    const CkptfsModel *model = &m->saved.model;
    for (unsigned v = 0; v < m->V; v++) {
        const CkptfsPy *chunk = chunk_dict(m, r, v, m->V);
        for (guint k = 0; chunk && chunk->kind == CKPTFS_PY_DICT && k + 1 < chunk->items->len; k += 2) {
            const char *key = ckptfs_py_str(g_ptr_array_index(chunk->items, k));
            const CkptfsPy *t = g_ptr_array_index(chunk->items, k + 1);
            if (key == NULL || t->kind != CKPTFS_PY_TENSOR || t->tensor->ndim != 2 ||
                (!g_str_has_suffix(key, ".mlp.experts.local_experts.0.linear_fc1.weight") &&
                 !g_str_has_suffix(key, ".mlp.experts.linear_fc1.weight0")))
                continue;
            uint64_t rows = t->tensor->shape[0];
            if (rows > 0 && rows % 2 == 0 && model->moe_ffn % (rows / 2) == 0 &&
                model->moe_ffn / (rows / 2) <= 65536)
                return (unsigned)(model->moe_ffn / (rows / 2));
            return m->T;
        }
    }
    return m->T;
}

/* Rank files saved without args: the sizes come from the config.json given with -o hf_config or
 * -o hf_extra, the split from the files (tp, pp and ep from the directory names, virtual
 * chunks from the model0.. keys, the padded vocabulary from the embedding's rows, expert TP from
 * the experts' rows); locate() then checks every shape against them. */
static bool read_config_sizes(Mg *m)
{
    Rank *r0 = m->first;
    if (!ckptfs_megatron_model_from_config(m->source->config, r0->path, &m->saved, m->error))
        return false;
    const CkptfsPy *root = ckptfs_pickle_root(r0->pickle);
    m->V = m->files->chunk_list ? root->items->len : 1;
    while (!m->files->chunk_list && ckptfs_py_dict_get(root, "model") == NULL) {
        char key[16];
        g_snprintf(key, sizeof key, "model%u", m->V);
        if (ckptfs_py_dict_get(root, key) == NULL)
            break;
        m->V++;
    }
    /* mp_rank_TT_PPP_EEE; mp_rank_TT_XXX is a pipeline stage unless the model has experts
     * and this first file holds the last stage's final norm (then XXX is the EP rank). */
    unsigned n = r0->nparts, T = 0;
    for (unsigned k = 0; k <= 2; k++)
        T = MAX(T, max_name_part(m, k, 0) + 1);
    m->T = T, m->P = 1, m->E = 1;
    bool ep_part = n == 2 || (n == 1 && m->saved.model.experts > 0 &&
                              ckptfs_py_dict_get(chunk_dict(m, r0, m->V - 1, m->V), "decoder.final_layernorm.weight"));
    if (n >= 1 && !(n == 1 && ep_part))
        m->P = max_name_part(m, n, 1) + 1;
    if (ep_part)
        m->E = max_name_part(m, n, n) + 1;
    const CkptfsPy *chunk0 = chunk_dict(m, r0, 0, m->V);
    const char *module = m->saved.model.arch->megatron_prefix; /* a VLM's language_model. */
    g_autofree char *embedding = g_strconcat(module ? module : "", "embedding.word_embeddings.weight", NULL);
    const CkptfsPy *emb = ckptfs_py_dict_get(chunk0, embedding);
    /* verl's saves of March 2025 hold its own parallel model's names (model.layers.N.self_attn...). */
    if (emb == NULL && m->files->chunk_list && ckptfs_py_dict_get(chunk0, "model.embed_tokens.weight"))
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: holds verl's early-2025 parallel model names "
                    "(model.embed_tokens.weight, model.layers.N.self_attn.qkv_proj.weight ...), a layout "
                    "ckptfs does not read (Megatron-core names are read)", r0->path);
    if (emb == NULL || emb->kind != CKPTFS_PY_TENSOR || emb->tensor->ndim != 2)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no %s matrix", r0->path, embedding);
    if (!ckptfs_mul_u64(emb->tensor->shape[0], m->T, &m->saved.padded_vocab))
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: the embedding's %" G_GUINT64_FORMAT " rows x %u ranks "
                    "overflow 64 bits", r0->path, emb->tensor->shape[0], m->T);
    if (m->saved.padded_vocab < m->saved.model.vocab)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: the embedding has %" G_GUINT64_FORMAT
                    " rows over all ranks, fewer than vocab_size %" G_GUINT64_FORMAT, r0->path,
                    m->saved.padded_vocab, m->saved.model.vocab);
    m->X = m->saved.model.experts ? guess_etp(m, r0) : m->T;
    m->saved.layout = (CkptfsLayout){.tp = m->T, .pp = m->P, .vpp = m->V,
                               .pp_first = m->P > 1 ? m->options->pp_first : 0,
                               .pp_last = m->P > 1 ? m->options->pp_last : 0,
                               .ep = m->E, .etp = m->X};
    return true;
}

/* The model's sizes and the layout it was saved with, from the first rank's args (or, without
 * args, from a given config.json and the files). */
static bool read_args(Mg *m)
{
    Rank *r0 = m->first;
    const CkptfsPy *root = ckptfs_pickle_root(r0->pickle);
    const CkptfsPy *args = ckptfs_py_object_state(ckptfs_py_dict_get(root, "args"));
    if (args == NULL)
        return read_config_sizes(m);
    if (!ckptfs_megatron_model_from_args(args, r0->path, m->options, m->source->config, &m->saved, m->error))
        return false;
    const CkptfsLayout *saved = &m->saved.layout;
    m->T = saved->tp, m->P = saved->pp, m->V = saved->vpp;
    m->E = ckptfs_layout_ep(saved), m->X = ckptfs_layout_etp(saved);
    if (m->source->config == NULL) /* else given with -o hf_config / hf_extra */
        ckptfs_megatron_synthesize_config(m->source, &m->saved.model);
    return true;
}

/* Megatron's args that must be the same in every rank file of one checkpoint. */
static const char *const same_args[] = {
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
    "ffn_hidden_size", "padded_vocab_size", "tensor_model_parallel_size",
    "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "num_experts",
    "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_router_topk", NULL};

static char *arg_text(const CkptfsPy *v)
{
    if (v == NULL)
        return g_strdup("absent");
    if (v->kind == CKPTFS_PY_NONE)
        return g_strdup("None");
    if ((v->kind == CKPTFS_PY_INT || v->kind == CKPTFS_PY_BOOL) && !v->big)
        return g_strdup_printf("%" G_GINT64_FORMAT, v->i);
    return g_strdup("a value of another kind");
}

static bool args_agree(Mg *m, const Rank *r)
{
    const CkptfsPy *want = ckptfs_py_object_state(ckptfs_py_dict_get(ckptfs_pickle_root(m->first->pickle), "args"));
    const CkptfsPy *got = ckptfs_py_object_state(ckptfs_py_dict_get(ckptfs_pickle_root(r->pickle), "args"));
    if (want == NULL || got == NULL || r == m->first)
        return true;
    for (const char *const *k = same_args; *k; k++) {
        g_autofree char *a = arg_text(ckptfs_py_dict_get(want, *k));
        g_autofree char *b = arg_text(ckptfs_py_dict_get(got, *k));
        if (strcmp(a, b) != 0)
            return fail(m, CKPTFS_ERROR_FORMAT, "%s: args.%s is %s but %s says %s", r->path, *k, b,
                        m->first->path, a);
    }
    return true;
}

/* A list of chunk state dicts (verl) holds as many chunks in every file as in the first. */
static bool chunks_agree(Mg *m, const Rank *r)
{
    guint n = ckptfs_pickle_root(r->pickle)->items->len;
    if (!m->files->chunk_list || n == m->V)
        return true;
    return fail(m, CKPTFS_ERROR_FORMAT, "%s: holds %u chunk state dicts but %s holds %u", r->path, n,
                m->first->path, m->V);
}

/* When every rank directory is named as the saved layout names them but their numbers span a
 * smaller grid (fewer TP, PP or EP ranks than the args say): the two grids, for the message. */
static char *smaller_grid(const Mg *m)
{
    unsigned parts = (m->P > 1) + (m->E > 1), T = 0, P = 1, E = 1;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, m->found);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        const Rank *r = value;
        if (r->nparts != parts)
            return NULL;
        T = MAX(T, r->num[0] + 1);
        if (m->P > 1)
            P = MAX(P, r->num[1] + 1);
        if (m->E > 1)
            E = MAX(E, r->num[parts] + 1);
    }
    if (T >= m->T && P >= m->P && E >= m->E)
        return NULL;
    if (m->E > 1)
        return g_strdup_printf("args say tp %u pp %u ep %u but the directory holds tp %u x pp %u x ep %u "
                               "rank files", m->T, m->P, m->E, T, P, E);
    return g_strdup_printf("args say tp %u pp %u but the directory holds tp %u x pp %u rank files", m->T,
                           m->P, T, P);
}

/* The rank files the saved layout has (Megatron's writers: with expert TP below TP not every
 * TP x EP pair), each found; no other rank directory; then opened, with args that agree. */
static bool find_ranks(Mg *m)
{
    g_autofree char *layout = ckptfs_layout_name(&m->saved.layout);
    const char *whence = m->first->path;
    g_autoptr(GArray) stage = ckptfs_layout_rank_files(&m->saved.layout);
    m->F = stage->len;
    /* Names are distinct: at most one more lookup than there are directories before a miss
     * (args may say any layout: nothing is sized by it before its files are found). */
    GPtrArray *ranks = g_ptr_array_new();
    g_autoptr(GHashTable) expected = g_hash_table_new(g_str_hash, g_str_equal);
    for (unsigned p = 0; p < m->P; p++)
        for (unsigned i = 0; i < m->F; i++) {
            const CkptfsRankFile *f = &g_array_index(stage, CkptfsRankFile, i);
            g_autofree char *name = ckptfs_rank_file_dir(&m->saved.layout, p, f);
            Rank *r = g_hash_table_lookup(m->found, name);
            if (r == NULL) {
                g_ptr_array_free(ranks, TRUE);
                g_autofree char *why = smaller_grid(m);
                if (why)
                    return fail(m, CKPTFS_ERROR_NOT_FOUND, "%s/%s/%s: missing (%s: %s)",
                                m->iter, name, m->files->rank_file, whence, why);
                return fail(m, CKPTFS_ERROR_NOT_FOUND, "%s/%s/%s: missing (a hole in the "
                            "grid of layout %s, from %s, with %u rank files per pipeline stage)", m->iter,
                            name, m->files->rank_file, layout, whence, m->F);
            }
            r->tp = f->tp, r->pp = p, r->ep = f->ep, r->etp = f->etp;
            g_ptr_array_add(ranks, r); /* at p * F + i */
            g_hash_table_add(expected, r->name);
        }
    m->ranks = (Rank **)g_ptr_array_free(ranks, FALSE);
    /* The first in name order of the directories the layout has no file for. */
    const char *unexpected = NULL;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, m->found);
    while (g_hash_table_iter_next(&it, NULL, &value)) {
        const Rank *r = value;
        if (!g_hash_table_contains(expected, r->name) && (unexpected == NULL || strcmp(r->name, unexpected) < 0))
            unexpected = r->name;
    }
    if (unexpected)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s/%s: unexpected rank directory (layout %s, from %s, has no "
                    "such file)", m->iter, unexpected, layout, whence);
    /* Dense TP share t: from the stage's first file of TP rank t; each expert share (EP rank,
     * expert TP rank) from the first file that holds it. */
    m->dense_reader = g_new(unsigned, m->T);
    m->expert_reader = g_new(unsigned, (gsize)m->E * m->X);
    for (unsigned t = 0; t < m->T; t++)
        m->dense_reader[t] = UINT_MAX;
    for (unsigned k = 0; k < m->E * m->X; k++)
        m->expert_reader[k] = UINT_MAX;
    for (unsigned i = m->F; i-- > 0;) {
        const CkptfsRankFile *f = &g_array_index(stage, CkptfsRankFile, i);
        m->dense_reader[f->tp] = i;
        m->expert_reader[f->ep * m->X + f->etp] = i;
    }
    for (unsigned k = 0; m->saved.model.experts && k < m->E * m->X; k++)
        if (m->expert_reader[k] == UINT_MAX)
            return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: layout %s (from %s): no rank file holds expert "
                        "TP rank %u of EP rank %u", m->iter, layout, whence, k % m->X, k / m->X);
    for (unsigned i = 0; i < m->F * m->P; i++) {
        Rank *r = m->ranks[i];
        if (r != m->first && (!open_rank(m, r) || !args_agree(m, r) || !chunks_agree(m, r)))
            return false;
    }
    return true;
}

typedef struct {
    uint32_t src;
    uint64_t base;       /* of element 0 in the file */
    uint64_t rows, cols; /* 2-D view */
    uint64_t row_stride; /* bytes */
    CkptfsDtype dtype;
} Located;

/* A rank tensor by key, checked to be contiguous with the expected 2-D shape (cols 1 for 1-D)
 * and of the weights' type (OWN_FLOAT: any floating-point type, an fp32 expert bias). */
static bool locate(Mg *m, Rank *r, unsigned v, const char *key, uint64_t rows, uint64_t cols,
                   bool own_float, unsigned kernel_dims, const uint64_t *kernel, Located *out)
{
    const CkptfsPy *t = ckptfs_py_dict_get(chunk_dict(m, r, v, m->V), key);
    g_hash_table_add(r->used, g_strdup_printf("%u/%s", v, key));
    if (t == NULL || t->kind != CKPTFS_PY_TENSOR)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is missing or not a tensor", r->path, key);
    uint64_t got_rows = t->tensor->ndim ? t->tensor->shape[0] : 1, got_cols = 1;
    if (t->tensor->ndim > 1 && !ckptfs_dims_product(t->tensor->shape + 1, t->tensor->ndim - 1, &got_cols))
        got_cols = UINT64_MAX; /* no expected shape has that many columns: refused below */
    /* 3 dims only as [rows, 1, cols] (a convolution's weight); KERNEL_DIMS as a KERNEL, whole */
    bool conv = t->tensor->ndim == 3 && t->tensor->shape[1] == 1;
    bool patch = kernel_dims && t->tensor->ndim == kernel_dims &&
                 memcmp(t->tensor->shape, kernel, kernel_dims * sizeof *kernel) == 0;
    for (unsigned d = 1; patch && d < kernel_dims; d++) /* its trailing dims row-major */
        patch = t->tensor->stride[d] ==
                (d == kernel_dims - 1 ? 1 : t->tensor->stride[d + 1] * t->tensor->shape[d + 1]);
    if ((kernel_dims && !patch) || (!kernel_dims && t->tensor->ndim > 2 && !conv) || got_rows != rows || got_cols != cols)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' has shape [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    "]; the args imply [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]",
                    r->path, key, got_rows, got_cols, rows, cols);
    if (t->tensor->dtype == CKPTFS_DTYPE_INVALID)
        return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has a storage type ckptfs does not know", r->path, key);
    CkptfsDtype d = t->tensor->dtype;
    if (own_float && !ckptfs_dtype_is_float(d))
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, not a floating-point type", r->path, key,
                    ckptfs_dtype_safetensors_name(d));
    if (m->dtype == CKPTFS_DTYPE_INVALID && !own_float)
        m->dtype = t->tensor->dtype;
    if (!own_float && t->tensor->dtype != m->dtype)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, other tensors are %s", r->path, key,
                    ckptfs_dtype_safetensors_name(t->tensor->dtype), ckptfs_dtype_safetensors_name(m->dtype));
    /* Rows may be apart (a view of a wider matrix, every n-th element of a vector); elements
     * within a row must be adjacent: pieces are runs of bytes. */
    uint64_t row_step = t->tensor->ndim == 0 || rows <= 1 ? cols : t->tensor->stride[0];
    if ((t->tensor->ndim == 2 && cols > 1 && t->tensor->stride[1] != 1) ||
        (conv && cols > 1 && t->tensor->stride[2] != 1) ||
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
                     .cols = cols, .row_stride = row_step * isz, .dtype = d};
    return true;
}

/* Adds the pieces of what a file holds of KEY (one layer's, or one expert's) to SET: its parts
 * (from ckptfs_mcore_share) stacked by rows at L; HF names of layer GLOBAL, expert EXPERT. */
static void add_pieces(CkptfsPieceSet *set, const CkptfsMcoreKey *key, const GArray *parts,
                       const Located *l, uint64_t global, uint64_t expert)
{
    uint64_t row = 0;
    for (guint k = 0; k < parts->len; row += g_array_index(parts, CkptfsSharePart, k).rows, k++) {
        const CkptfsSharePart *part = &g_array_index(parts, CkptfsSharePart, k);
        if (part->hf == NULL)
            continue; /* vocabulary padding */
        g_autofree char *hf = ckptfs_mcore_hf_name(key, global, expert, part->hf);
        CkptfsPiece piece = {.row0 = part->hf_row0, .row1 = part->hf_row0 + part->rows,
                             .col0 = part->col0, .col1 = part->col0 + part->cols, .src = l->src,
                             .offset = l->base + row * l->row_stride, .row_stride = l->row_stride};
        if (ckptfs_mcore_key_transposed(key)) /* the rank's rows are the HF tensor's columns */
            piece = ckptfs_piece_transposed(&piece, ckptfs_dtype_size(l->dtype));
        CkptfsPiece swapped[2];
        unsigned n = ckptfs_mcore_key_swaps_col_halves(key)
                         ? ckptfs_piece_swap_col_halves(&piece, key->cols, ckptfs_dtype_size(l->dtype), swapped)
                         : 0;
        for (unsigned i = 0; i < n; i++)
            ckptfs_piece_set_add(set, hf, &swapped[i]);
        if (n == 0)
            ckptfs_piece_set_add(set, hf, &piece);
        if (key->rule->fp32)
            ckptfs_piece_set_dtype(set, hf, l->dtype);
    }
}

/* Whether the experts of layer LOCAL of chunk V of R are TEGroupedMLP's (linear_fc1.weight0),
 * not SequentialMLP's (local_experts.0.linear_fc1.weight): either scheme is read, each file as
 * it is; keys of the other scheme are then unexpected. Looked up as RULE's entries are (under a
 * VLM's language_model., in an MTP layer). */
static bool grouped_experts(const Mg *m, const Rank *r, unsigned v, uint64_t local, const CkptfsRule *rule)
{
    const CkptfsPy *chunk = chunk_dict(m, r, v, m->V);
    for (unsigned n = 1; n <= 2; n++) {
        g_autofree char *linear = g_strdup_printf("mlp.experts.linear_fc%u.weight0", n);
        g_autofree char *name = ckptfs_legacy_entry_key(m->part, rule, m->prefix, local, linear, m->mtp_prefix);
        if (ckptfs_py_dict_get(chunk, name) != NULL)
            return true;
    }
    return false;
}

/* Expert rule RULE of layer LOCAL (global GLOBAL) in chunk V of stage P: every file holds its
 * EP rank's experts (global k * N/E + j for local j), each split by expert TP; each share is
 * read from one file, and checked in every file that holds it. */
static bool map_experts(Mg *m, CkptfsPieceSet *set, unsigned p, unsigned v, const CkptfsRule *rule,
                        uint64_t local, uint64_t global)
{
    const CkptfsMcoreKey *key = ckptfs_mcore_key_of(m->part_keys, rule);
    uint64_t per_rank = m->saved.model.experts / m->E;
    for (unsigned i = 0; i < m->F; i++) {
        Rank *r = m->ranks[p * m->F + i];
        bool grouped = grouped_experts(m, r, v, local, rule);
        uint64_t rows, cols;
        g_autoptr(GArray) parts = ckptfs_mcore_share(key, m->X, r->etp, &rows, &cols);
        bool reader = m->expert_reader[r->ep * m->X + r->etp] == i;
        for (uint64_t j = 0; j < per_rank; j++) {
            g_autofree char *name = ckptfs_expert_legacy_name(rule, grouped, j);
            g_autofree char *entry = ckptfs_legacy_entry_key(m->part, rule, m->prefix, local, name, m->mtp_prefix);
            Located l = {0};
            if (!locate(m, r, v, entry, rows, cols, rule->fp32, 0, NULL, &l))
                return false;
            /* a replicated expert tensor (GPT-OSS's fc2 bias) whole in every ETP rank: read from the first */
            if (reader && (key->split != CKPTFS_TP_REPLICATED || r->etp == 0))
                add_pieces(set, key, parts, &l, global, r->ep * per_rank + j);
        }
    }
    return true;
}

/* The rank tensors of SCOPE in chunk V of stage P (LAYER: layer LOCAL of the chunk, global
 * layer GLOBAL) mapped back to Hugging Face pieces: each is a file's TP share of a key of the
 * mapping table. Dense tensors repeat in every EP rank's file and replicated ones (norms,
 * router) in every file: each is checked everywhere and read from one file. */
static bool map_entries(Mg *m, CkptfsPieceSet *set, unsigned p, unsigned v, CkptfsScope scope,
                        uint64_t local, uint64_t global)
{
    g_autoptr(GPtrArray) rules = ckptfs_legacy_entries(m->part, scope, global, m->te, false);
    for (guint i = 0; i < rules->len; i++) {
        const CkptfsRule *rule = g_ptr_array_index(rules, i);
        if (rule->extra_state)
            continue;
        if (rule->expert) {
            if (!map_experts(m, set, p, v, rule, local, global))
                return false;
            continue;
        }
        const CkptfsMcoreKey *key = ckptfs_mcore_key_of(m->part_keys, rule);
        const char *name = ckptfs_rule_legacy_name(rule, m->te);
        g_autofree char *entry = ckptfs_legacy_entry_key(m->part, rule, m->prefix, local, name, m->mtp_prefix);
        uint64_t kernel[5];
        unsigned kernel_dims = ckptfs_mcore_kernel_shape(key, m->part, kernel);
        for (unsigned f = 0; f < m->F; f++) {
            Rank *r = m->ranks[p * m->F + f];
            uint64_t rows, cols;
            g_autoptr(GArray) parts = ckptfs_mcore_share(key, m->T, r->tp, &rows, &cols);
            Located l = {0};
            if (!locate(m, r, v, entry, rows, cols, rule->fp32, kernel_dims, kernel, &l))
                return false;
            if (m->dense_reader[r->tp] != f || (key->split == CKPTFS_TP_REPLICATED && r->tp != 0))
                continue;
            add_pieces(set, key, parts, &l, global, 0);
        }
    }
    return true;
}

static bool map_model(Mg *m, CkptfsPieceSet *set)
{
    const CkptfsPy *first = chunk_dict(m, m->ranks[0], 0, m->V);
    if (first == NULL)
        return fail(m, CKPTFS_ERROR_FORMAT, "%s: no '%s' state dict", m->ranks[0]->path,
                    m->V == 1 ? "model" : "model0");
    const CkptfsModel *model = &m->saved.model;
    const char *prefix = model->arch->megatron_prefix ? model->arch->megatron_prefix : "";
    static const char *const te_norms[] = {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                                           "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight",
                                           "decoder.layers.0.self_attention.in_proj.layer_norm_weight"};
    for (size_t i = 0; i < G_N_ELEMENTS(te_norms) && !m->te; i++) {
        g_autofree char *name = g_strconcat(prefix, te_norms[i], NULL);
        m->te = ckptfs_py_dict_get(first, name) != NULL;
    }
    m->keys = ckptfs_mcore_keys(model, m->saved.padded_vocab, false);
    ckptfs_mcore_keys_for_spec(m->keys, m->te);
    if (model->arch->vision) { /* mbridge's tower: TE names, first in the first chunk of the first stage */
        ckptfs_model_vision_tower(model, &m->tower);
        m->tower_keys = ckptfs_mcore_keys(&m->tower, 0, false);
        ckptfs_mcore_keys_for_spec(m->tower_keys, true);
        ckptfs_piece_set_want_model(set, &m->tower, m->tower_keys);
        if (!m->te)
            return fail(m, CKPTFS_ERROR_UNSUPPORTED, "%s: no '%s%s': %s's Megatron form has the TE spec's names "
                        "only (mbridge builds it so)", m->ranks[0]->path, prefix, te_norms[0],
                        model->arch->hf_architecture);
        m->part = &m->tower, m->part_keys = m->tower_keys, m->prefix = m->tower.arch->megatron_prefix;
        if (!map_entries(m, set, 0, 0, CKPTFS_SCOPE_FIRST, 0, 0))
            return false;
        for (uint64_t b = 0; b < m->tower.layers; b++)
            if (!map_entries(m, set, 0, 0, CKPTFS_SCOPE_LAYER, b, b))
                return false;
        for (uint64_t j = 0; j < m->tower.list_modules; j++) { /* its module list, after the blocks */
            g_autofree char *module = ckptfs_list_module_prefix(&m->tower, j);
            m->mtp_prefix = module;
            bool ok = map_entries(m, set, 0, 0, CKPTFS_SCOPE_LIST, j, j);
            m->mtp_prefix = NULL;
            if (!ok)
                return false;
        }
        if (!map_entries(m, set, 0, 0, CKPTFS_SCOPE_LAST, 0, 0))
            return false;
    }
    m->part = model, m->part_keys = m->keys, m->prefix = prefix;
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
    /* Multi-token prediction layers (HF layers after the decoder's) on the last stage, with its
     * copy of the embedding (not a separate HF tensor). */
    for (uint64_t j = 0; j < model->mtp_layers; j++) {
        g_autofree char *mtp = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".", j);
        m->mtp_prefix = mtp;
        bool ok = map_entries(m, set, lp, lv, CKPTFS_SCOPE_MTP_IN, 0, model->layers + j) &&
                  map_entries(m, set, lp, lv, CKPTFS_SCOPE_LAYER, 0, model->layers + j) &&
                  map_entries(m, set, lp, lv, CKPTFS_SCOPE_MTP_OUT, 0, model->layers + j);
        m->mtp_prefix = NULL;
        if (!ok)
            return false;
    }
    for (unsigned f = 0; model->mtp_layers && (lp > 0 || lv > 0) && f < m->F; f++)
        g_hash_table_add(m->ranks[lp * m->F + f]->used, g_strdup_printf("%u/%sembedding.word_embeddings.weight", lv, prefix));
    /* Tied: the last stage's copy of the embedding is not a separate HF tensor. */
    for (unsigned f = 0; model->tied_embeddings && f < m->F; f++)
        g_hash_table_add(m->ranks[lp * m->F + f]->used, g_strdup_printf("%u/%soutput_layer.weight", lv, prefix));
    return true;
}

/* Every key of every chunk must have been mapped, or be an _extra_state. */
static bool check_unexpected(Mg *m)
{
    for (unsigned i = 0; i < m->F * m->P; i++) {
        Rank *r = m->ranks[i];
        g_autoptr(GString) extra = g_string_new(NULL);
        unsigned n = 0;
        for (unsigned v = 0; v < m->V; v++) {
            const CkptfsPy *dict = chunk_dict(m, r, v, m->V);
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

bool ckptfs_megatron_open_ranks(CkptfsSource *source, const CkptfsOptions *options, const char *iter,
                                const CkptfsRankFiles *files, GError **error)
{
    Mg m = {.source = source, .options = options, .iter = iter, .files = files, .error = error};
    CkptfsPieceSet *c = ckptfs_piece_set_new();
    bool ok = scan_ranks(&m) && open_rank(&m, m.first);
    ok = ok && ckptfs_source_use_given_config(source, options, error) && read_args(&m);
    ok = ok && ckptfs_model_check_limits(&m.saved.model, m.first->path, error);
    if (ok && !ckptfs_layout_validate(&m.saved.layout, &m.saved.model, error)) {
        g_prefix_error(error, "%s: ", m.first->path);
        ok = false;
    }
    ok = ok && find_ranks(&m) && map_model(&m, c) && check_unexpected(&m);
    ok = ok && ckptfs_piece_set_to_catalog(c, source->catalog, m.dtype, error) &&
         ckptfs_megatron_add_mtp_copies(source->catalog, &m.saved.model, error) &&
         ckptfs_megatron_unshift_norms(source->catalog, &m.saved.model, m.keys, error);
    ok = ok && (options->hf_extra == NULL || ckptfs_source_add_extra_files(source, options->hf_extra, error));
    if (ok)
        source->saved_layout = m.saved.layout;
    if (m.keys)
        g_ptr_array_unref(m.keys);
    if (m.tower_keys)
        g_ptr_array_unref(m.tower_keys);
    g_free(m.ranks);
    g_free(m.dense_reader);
    g_free(m.expert_reader);
    if (m.found)
        g_hash_table_unref(m.found);
    ckptfs_piece_set_free(c);
    return ok;
}

static bool open_megatron(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    static const CkptfsRankFiles megatron_files = {.rank_file = "model_optim_rng.pt", .chunk_list = false};
    g_autofree char *iter = ckptfs_megatron_iteration_dir(source->dir, options->iteration, error);
    return iter != NULL && ckptfs_megatron_open_ranks(source, options, iter, &megatron_files, error);
}

const CkptfsSourceFormat ckptfs_format_megatron = {"megatron-legacy", probe_megatron, open_megatron,
                                                   ckptfs_megatron_describe};
