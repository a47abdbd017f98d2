/* torch_dist checkpoints (Megatron-core's default format: PyTorch distributed checkpoint
 * underneath) as a source. `.metadata` says, for every key, its global shape and chunks and
 * where each chunk's archive is; each chunk is a complete torch.save archive inside a .distcp
 * file. The model's keys are stacked over layers (see mcore.h), routed experts stacked in a
 * second axis; a model whose layers are not all of one kind (dense layers among MoE layers)
 * has one key per layer instead ("decoder.layers.5.mlp.router.weight", no layer axis). Every
 * chunk, whatever its box, becomes pieces of the Hugging Face tensors it holds. Only pickles
 * are parsed (nothing executed); optimizer and RNG entries are never read. */
#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"
#include "ckptfs/mcore.h"
#include "ckptfs/pickle.h"
#include "ckptfs/zipreader.h"
#include "dcp.h"
#include "source_internal.h"


typedef struct {
    CkptfsSource *source;
    const CkptfsOptions *options;
    GError **error;
    CkptfsDcp dcp;              /* the checkpoint directory (metadata.json, .metadata, ...) */
    const CkptfsTorchDistWrap *wrap; /* another trainer's save around it, or NULL */
    const char *wrap_prefix;    /* the wrapping trainer's prefix of every key ("" for Megatron's own) */
    CkptfsPickle *common;
    CkptfsMegatronModel saved; /* the model, its padded vocabulary and saved split */
    CkptfsDtype dtype;
    uint64_t vocab_rows;        /* the padded vocabulary of the first vocabulary key (no args) */
    unsigned chunks, objects, skipped; /* model chunks read, _extra_state objects, others */
    const char *prefix;         /* the language model's module in the keys ("" for a text model) */
} Td;

#define fail(ctx, ...) ckptfs_fail((ctx)->error, __VA_ARGS__)

static bool has_file(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, G_FILE_TEST_IS_REGULAR);
}

/* NAME (allocated) as .metadata holds it: under the wrapping trainer's prefix. */
static char *stored_name(const Td *t, char *name)
{
    if (*t->wrap_prefix == '\0')
        return name;
    char *prefixed = g_strconcat(t->wrap_prefix, name, NULL);
    g_free(name);
    return prefixed;
}

/* The checkpoint directory of PATH: PATH itself (an iter_*, release or verl dist_ckpt
 * directory) or the one its tracker names. NULL when PATH is not a torch_dist checkpoint. */
static char *checkpoint_dir(const char *path, const char *iteration)
{
    if (has_file(path, "metadata.json") && iteration == NULL)
        return g_strdup(path);
    g_autofree char *iter = ckptfs_megatron_iteration_dir(path, iteration, NULL);
    if (iter && strcmp(iter, path) != 0 && has_file(iter, "metadata.json"))
        return g_steal_pointer(&iter);
    return NULL;
}

static bool probe_torch_dist(const char *dir, const CkptfsOptions *options)
{
    g_autofree char *found = checkpoint_dir(dir, options->iteration);
    return found != NULL;
}

static bool check_metadata_json(Td *t)
{
    g_autofree char *path = g_build_filename(t->dcp.dir, "metadata.json", NULL);
    GError *json_error = NULL;
    g_autoptr(JsonObject) o = ckptfs_json_load_object(path, &json_error);
    if (o == NULL) {
        fail(t, (CkptfsErrorCode)json_error->code, "%s", json_error->message);
        g_error_free(json_error);
        return false;
    }
    const char *given = ckptfs_json_member_string(o, "sharded_backend");
    g_autofree char *backend = g_strescape(given ? given : "", NULL);
    if (given == NULL)
        return fail(t, CKPTFS_ERROR_FORMAT, "%s: no \"sharded_backend\" string", path);
    if (strcmp(backend, "torch_dist") != 0)
        return fail(t, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: sharded_backend '%.40s' is not supported (torch_dist is)", path, backend);
    return true;
}

/* One entry of the model in .metadata: KEY under the name NAME, with the layer axis when
 * LAYER_AXIS (stacked layers), else for layer LAYER alone (per-layer keys; ignored for keys
 * outside the layers); of a key of row sections, the section of ROWS rows from ROW0 (a gated
 * delta-net's "in_proj.weight.query"; rows 0: the whole key). */
typedef struct {
    const CkptfsMcoreKey *key;
    char *name;
    bool layer_axis;
    uint64_t layer;
    const CkptfsModel *part; /* the model (a VLM's language model) or a VLM's vision tower */
    uint64_t row0, rows;     /* a section of the key's rows (GatedDeltaNet's): where and how many */
} Entry;

static void entry_clear(gpointer p)
{
    g_free(((Entry *)p)->name);
}

/* What args say of the sizes of an expert key or the router, for messages about its shape
 * ("" for other keys). */
static char *moe_sizes_hint(Td *t, const CkptfsMcoreKey *key)
{
    const CkptfsModel *m = &t->saved.model;
    switch (key->rule->need) {
    case CKPTFS_NEED_MOE:
        if (!key->expert && key->rule->rows != CKPTFS_DIM_EXPERTS)
            return g_strdup("");
        return g_strdup_printf(" (num_experts %" G_GUINT64_FORMAT ", moe_ffn_hidden_size %" G_GUINT64_FORMAT ")",
                               m->experts, m->moe_ffn);
    case CKPTFS_NEED_SHARED_EXPERT:
    case CKPTFS_NEED_SHARED_GATE:
        return g_strdup_printf(" (moe_shared_expert_intermediate_size %" G_GUINT64_FORMAT ")", m->shared_ffn);
    default:
        return g_strdup("");
    }
}

/* The entry's TensorStorageMetadata in .metadata, of the expected shape and dtype (*DTYPE: the
 * weights', or for an entry Megatron keeps in fp32 its own floating-point type). */
/* EN's global shape as the model implies it (a section's rows for a section); returns ndim. */
static unsigned entry_shape(const Entry *en, uint64_t *shape, bool *kernel)
{
    unsigned kernel_dims = ckptfs_mcore_kernel_shape(en->key, en->part, shape);
    if (kernel_dims) { /* a patch kernel: 5 dims (4 for a Conv2d), replicated */
        if (kernel)
            *kernel = true;
        return kernel_dims;
    }
    unsigned n = ckptfs_mcore_key_shape(en->key, en->layer_axis ? en->part->layers : 0, shape);
    if (en->rows)
        shape[n - en->key->ndim] = en->rows;
    return n;
}

static const CkptfsPy *tensor_metadata(Td *t, const Entry *en, uint64_t *padded_rows, CkptfsDtype *dtype_out)
{
    const CkptfsMcoreKey *key = en->key;
    const CkptfsPy *md = ckptfs_py_dict_get(t->dcp.state_dict_metadata, en->name);
    const CkptfsPy *st = ckptfs_py_object_state(md);
    if (md == NULL) {
        fail(t, CKPTFS_ERROR_FORMAT, "%s: no '%s' (the model's args imply it)", t->dcp.metadata_path, en->name);
        return NULL;
    }
    uint64_t dims[CKPTFS_MAX_DIMS], want[CKPTFS_MAX_DIMS];
    unsigned n = 0, nwant = entry_shape(en, want, NULL);
    if (st == NULL || !ckptfs_py_dims(ckptfs_py_dict_get(st, "size"), dims, &n)) {
        fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' is not a tensor entry with a size", t->dcp.metadata_path, en->name);
        return NULL;
    }
    /* The vocabulary is padded as the saver's TP required: args.padded_vocab_size rows, or
     * without args any row count >= the vocabulary, the same for every vocabulary key (rows
     * past what a key's chunks hold would be a hole). */
    bool vocab = key->split == CKPTFS_TP_VOCAB;
    if (vocab && n == 2 && dims[0] >= t->saved.model.vocab)
        want[0] = t->saved.padded_vocab ? t->saved.padded_vocab : t->vocab_rows ? t->vocab_rows : dims[0];
    if (n != nwant || memcmp(dims, want, n * sizeof *dims) != 0) {
        g_autofree char *got = ckptfs_dims_text(dims, n), *exp = ckptfs_dims_text(want, nwant);
        g_autofree char *hint = moe_sizes_hint(t, key);
        fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' has shape %s; %s %s%s", t->dcp.metadata_path, en->name, got,
             vocab && !t->saved.padded_vocab && t->vocab_rows && dims[0] >= t->saved.model.vocab
                 ? "the other vocabulary key implies" : "the model's args imply", exp, hint);
        return NULL;
    }
    if (vocab)
        t->vocab_rows = dims[0];
    *padded_rows = dims[0];
    CkptfsDtype d = ckptfs_dcp_tensor_dtype(st);
    if (d == CKPTFS_DTYPE_INVALID) {
        fail(t, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has no dtype ckptfs knows", t->dcp.metadata_path, en->name);
        return NULL;
    }
    *dtype_out = d;
    if (key->rule->fp32) {
        if (ckptfs_dtype_is_float(d))
            return st;
        fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, not a floating-point type", t->dcp.metadata_path, en->name,
             ckptfs_dtype_safetensors_name(d));
        return NULL;
    }
    if (t->dtype == CKPTFS_DTYPE_INVALID)
        t->dtype = d;
    if (d != t->dtype) {
        fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s, other weights are %s", t->dcp.metadata_path, en->name,
             ckptfs_dtype_safetensors_name(d), ckptfs_dtype_safetensors_name(t->dtype));
        return NULL;
    }
    return st;
}

/* Every chunk of the entry as pieces of the HF tensors it holds. A chunk is any box of the
 * key's [layers,] [experts,] rows[, columns]: it may span layers, experts, and rows of several
 * segments. */
static bool map_key(Td *t, const Entry *en, CkptfsPieceSet *set)
{
    const CkptfsMcoreKey *key = en->key;
    uint64_t padded_rows = 0;
    CkptfsDtype dtype = CKPTFS_DTYPE_INVALID;
    const CkptfsPy *st = tensor_metadata(t, en, &padded_rows, &dtype);
    if (st == NULL)
        return false;
    const CkptfsPy *chunks = ckptfs_py_dict_get(st, "chunks");
    if (chunks == NULL || chunks->kind != CKPTFS_PY_LIST || chunks->items->len == 0)
        return fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' has no chunks", t->dcp.metadata_path, en->name);
    uint64_t shape[CKPTFS_MAX_DIMS];
    bool kernel = false;
    unsigned n = entry_shape(en, shape, &kernel);
    if (!key->stacked && !kernel)
        shape[0] = padded_rows; /* the saver's padded vocabulary */
    size_t isz = ckptfs_dtype_size(dtype);
    for (guint c = 0; c < chunks->items->len; c++) {
        uint64_t off[CKPTFS_MAX_DIMS], size[CKPTFS_MAX_DIMS];
        CkptfsDcpChunk where = {0, 0};
        if (!ckptfs_dcp_chunk_box(&t->dcp, en->name, chunks, c, shape, n, off, size) ||
            !ckptfs_dcp_locate_chunk(&t->dcp, en->name, off, size, n, dtype, &where))
            return false;
        t->chunks++;
        for (unsigned k = 1; kernel && k < n; k++)
            if (off[k] != 0 || size[k] != shape[k])
                return fail(t, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' chunk %u cuts the patch kernel's dim %u; it "
                            "is saved whole (replicated)", t->dcp.metadata_path, en->name, c, k);
        /* The chunk as layers (a module list's modules) x experts x rows x columns of one expert's
         * (layer's, module's) matrix. */
        unsigned d = 0;
        bool axis = en->layer_axis || key->listed;
        uint64_t l0 = axis ? off[d] : en->layer, nl = axis ? size[d++] : 1;
        uint64_t e0 = key->expert ? off[d] : 0, ne = key->expert ? size[d++] : 1;
        uint64_t r0 = en->row0 + off[d], nr = size[d++];
        d += key->ndim == 3 && !kernel; /* conv1d's [rows, 1, kernel] */
        uint64_t c0 = key->ndim >= 2 && !kernel ? off[d] : 0;
        uint64_t nc = kernel ? key->cols : key->ndim >= 2 ? size[d] : 1;
        for (uint64_t l = l0; l < l0 + nl; l++)
            for (uint64_t e = e0; e < e0 + ne; e++)
                for (guint s = 0; s < key->segments->len; s++) {
                    const CkptfsMcoreSegment *seg = &g_array_index(key->segments, CkptfsMcoreSegment, s);
                    uint64_t a = MAX(r0, seg->row0), z = MIN(r0 + nr, seg->row0 + seg->rows);
                    if (a >= z)
                        continue;
                    g_autofree char *hf = ckptfs_mcore_hf_name(key, l, e, seg->hf_name);
                    /* Products below numel (checked by ckptfs_dcp_locate_chunk): no overflow. */
                    uint64_t at = (((l - l0) * ne + (e - e0)) * nr + (a - r0)) * nc;
                    CkptfsPiece p = {.row0 = seg->hf_row0 + (a - seg->row0), .row1 = seg->hf_row0 + (z - seg->row0),
                                     .col0 = c0, .col1 = c0 + nc, .src = where.src,
                                     .offset = where.base + at * isz, .row_stride = nc * isz};
                    if (!g_hash_table_contains(set->pieces, hf))
                        return fail(t, CKPTFS_ERROR_FORMAT, "%s: '%s' chunk %u holds '%s', which the model "
                                    "does not have", t->dcp.metadata_path, en->name, c, hf);
                    if (ckptfs_mcore_key_transposed(key)) /* the key's rows are the HF tensor's columns */
                        p = ckptfs_piece_transposed(&p, isz);
                    CkptfsPiece swapped[2];
                    unsigned nswapped = ckptfs_mcore_key_swaps_col_halves(key)
                                            ? ckptfs_piece_swap_col_halves(&p, key->cols, isz, swapped)
                                            : 0;
                    for (unsigned i = 0; i < nswapped; i++)
                        ckptfs_piece_set_add(set, hf, &swapped[i]);
                    if (nswapped == 0)
                        ckptfs_piece_set_add(set, hf, &p);
                    if (key->rule->fp32)
                        ckptfs_piece_set_dtype(set, hf, dtype);
                }
    }
    return true;
}

/* The entry whose chunks fill HF tensor NAME (for messages), or NULL. */
static const Entry *entry_of_hf(Td *t, GArray *entries, const char *name)
{
    for (guint i = 0; i < entries->len; i++) {
        const Entry *en = &g_array_index(entries, Entry, i);
        const CkptfsMcoreKey *key = en->key;
        uint64_t l0 = en->layer_axis || key->listed ? 0 : en->layer;
        uint64_t l1 = en->layer_axis ? en->part->layers : key->listed ? key->list_count : l0 + 1;
        for (uint64_t l = l0; l < l1; l++)
            for (uint64_t e = 0; e < (key->expert ? key->experts : 1); e++)
                for (guint s = 0; s < key->segments->len; s++) {
                    const CkptfsMcoreSegment *seg = &g_array_index(key->segments, CkptfsMcoreSegment, s);
                    g_autofree char *hf = ckptfs_mcore_hf_name(key, l, e, seg->hf_name);
                    if (strcmp(hf, name) == 0)
                        return en;
                }
    }
    return NULL;
}

/* Each HF tensor's pieces hold as many elements as the tensor: fewer is a hole in the chunks
 * (a chunk or an expert missing), more an overlap (two chunks holding the same part). Said in
 * the checkpoint's terms before the catalog checks the exact tiling. */
static bool check_coverage(Td *t, GArray *entries, const CkptfsPieceSet *set)
{
    for (guint i = 0; i < set->order->len; i++) {
        const char *name = g_ptr_array_index(set->order, i);
        GArray *pieces = g_hash_table_lookup(set->pieces, name);
        uint64_t total = ckptfs_piece_set_numel(set, name), held = 0;
        bool over = false;
        for (guint k = 0; k < pieces->len && !over; k++) {
            const CkptfsPiece *p = &g_array_index(pieces, CkptfsPiece, k);
            uint64_t area = (p->row1 - p->row0) * (p->col1 - p->col0); /* within the tensor */
            over = area > total - held;
            held += over ? 0 : area;
        }
        if (!over && held == total)
            continue;
        const Entry *en = entry_of_hf(t, entries, name);
        g_autofree char *of = en ? g_strdup_printf("'%s'", en->name) : g_strdup("the model's keys");
        if (over)
            return fail(t, CKPTFS_ERROR_FORMAT, "%s: chunks of %s overlap: they hold parts of '%s' more "
                        "than once", t->dcp.metadata_path, of, name);
        return fail(t, CKPTFS_ERROR_FORMAT, "%s: chunks of %s leave a hole: they hold %" G_GUINT64_FORMAT
                    " of the %" G_GUINT64_FORMAT " elements of '%s' (a chunk is missing)",
                    t->dcp.metadata_path, of, held, total, name);
    }
    return true;
}

/* Keys that are neither the model's weights nor what a loader may skip. */
static bool check_unexpected(Td *t, GArray *entries)
{
    g_autoptr(GHashTable) known = g_hash_table_new(g_str_hash, g_str_equal);
    for (guint i = 0; i < entries->len; i++)
        g_hash_table_add(known, g_array_index(entries, Entry, i).name);
    g_autoptr(GString) extra = g_string_new(NULL);
    g_autofree char *tied_output = g_strconcat(t->wrap_prefix, t->prefix, "output_layer.weight", NULL);
    unsigned n = 0;
    const CkptfsPy *sdm = t->dcp.state_dict_metadata;
    for (guint i = 0; i + 1 < sdm->items->len; i += 2) {
        const char *key = ckptfs_py_str(g_ptr_array_index(sdm->items, i));
        if (key == NULL)
            return fail(t, CKPTFS_ERROR_FORMAT, "%s: a state_dict_metadata key is not a string", t->dcp.metadata_path);
        if (g_hash_table_contains(known, key))
            continue;
        if (strstr(key, "._extra_state")) {
            t->objects++;
            continue;
        }
        if (g_str_has_prefix(key, "optimizer.") || g_str_has_prefix(key, "rng_state") ||
            g_str_has_prefix(key, "rerun_state_machine") ||
            (t->saved.model.tied_embeddings && strcmp(key, tied_output) == 0)) {
            t->skipped++;
            continue;
        }
        if (n++ < 5)
            g_string_append_printf(extra, "%s'%s'", extra->len ? ", " : "", key);
    }
    if (n > 0)
        return fail(t, CKPTFS_ERROR_UNSUPPORTED, "%s: %u unexpected entries: %s%s%s%s%s", t->dcp.metadata_path, n,
                    extra->str, n > 5 ? ", ..." : "", *t->wrap_prefix ? " (the model's keys are expected under '" : "",
                    t->wrap_prefix, *t->wrap_prefix ? "')" : "");
    return true;
}

/* Whether .metadata names layers one by one ("decoder.layers.5. ..."), as Megatron saves a model
 * whose layers are not all of one kind (moe_layer_freq a list or > 1, heterogeneous specs). */
static bool per_layer_names(Td *t)
{
    const CkptfsPy *sdm = t->dcp.state_dict_metadata;
    g_autofree char *layers = g_strconcat(t->wrap_prefix, t->prefix, "decoder.layers.", NULL);
    for (guint i = 0; i + 1 < sdm->items->len; i += 2) {
        const char *key = ckptfs_py_str(g_ptr_array_index(sdm->items, i));
        if (key && g_str_has_prefix(key, layers) && g_ascii_isdigit(key[strlen(layers)]))
            return true;
    }
    return false;
}

/* The entries .metadata must hold for KEYS: stacked keys once, or with PER_LAYER once per
 * layer that has them; each under the name a TE-spec model saves or, failing that, the one a
 * local-spec model saves (they differ for an MoE layer's pre-MLP norm). */
static bool model_entries(Td *t, const CkptfsModel *m, const char *prefix, const GPtrArray *keys, bool per_layer,
                          GArray *entries)
{
    for (guint k = 0; k < keys->len; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(keys, k);
        bool each_layer = key->stacked && per_layer;
        if (key->rule->scope == CKPTFS_SCOPE_MTP_IN || key->rule->scope == CKPTFS_SCOPE_MTP_OUT)
            continue; /* below */
        for (uint64_t l = 0; l < (each_layer ? m->layers : 1); l++) {
            if (each_layer && !ckptfs_rule_in_layer(key->rule, m, l))
                continue;
            g_autofree char *te_name = ckptfs_mcore_key_name(key, true, per_layer, l);
            g_autofree char *local_name = ckptfs_mcore_key_name(key, false, per_layer, l);
            /* a module beside the part's own (Gemma 3's vision_projection.) has its own prefix */
            const char *module = key->rule->module ? key->rule->module : prefix;
            g_autofree char *te = stored_name(t, g_strconcat(module, te_name, NULL));
            g_autofree char *local = stored_name(t, g_strconcat(module, local_name, NULL));
            /* a key of row sections: an entry per section, "<key>.<section>" (GatedDeltaNet's) */
            uint64_t row0 = 0;
            for (unsigned s = 0; s < MAX(key->n_sections, 1u); row0 += key->sections[s++]) {
                g_autofree char *te_s = key->n_sections ? g_strdup_printf("%s.%s", te, key->section_names[s])
                                                        : g_strdup(te);
                g_autofree char *local_s = key->n_sections ? g_strdup_printf("%s.%s", local, key->section_names[s])
                                                           : g_strdup(local);
                bool te_there = ckptfs_py_dict_get(t->dcp.state_dict_metadata, te_s) != NULL;
                if (!te_there && strcmp(te_s, local_s) != 0 &&
                    ckptfs_py_dict_get(t->dcp.state_dict_metadata, local_s) == NULL)
                    return fail(t, CKPTFS_ERROR_FORMAT, "%s: neither '%s' nor '%s' is there (the model's args "
                                "imply one of them)", t->dcp.metadata_path, te_s, local_s);
                Entry en = {key, te_there ? g_steal_pointer(&te_s) : g_steal_pointer(&local_s),
                            key->stacked && !per_layer, l, m, row0, key->n_sections ? key->sections[s] : 0};
                g_array_append_val(entries, en);
            }
        }
    }
    /* Multi-token prediction layers: their own keys, and a layer's keys for HF layer LAYERS + J. */
    for (uint64_t j = 0; j < m->mtp_layers; j++)
        for (guint k = 0; k < keys->len; k++) {
            const CkptfsMcoreKey *key = g_ptr_array_index(keys, k);
            CkptfsScope scope = key->rule->scope;
            uint64_t l = m->layers + j;
            if (scope == CKPTFS_SCOPE_FIRST || scope == CKPTFS_SCOPE_LAST ||
                (scope == CKPTFS_SCOPE_LAYER && !ckptfs_rule_in_layer(key->rule, m, l)))
                continue;
            g_autofree char *te_name = ckptfs_mcore_mtp_key_name(key, true, j);
            g_autofree char *local_name = ckptfs_mcore_mtp_key_name(key, false, j);
            g_autofree char *te = stored_name(t, g_strconcat(prefix, te_name, NULL));
            g_autofree char *local = stored_name(t, g_strconcat(prefix, local_name, NULL));
            bool te_there = ckptfs_py_dict_get(t->dcp.state_dict_metadata, te) != NULL;
            if (!te_there && ckptfs_py_dict_get(t->dcp.state_dict_metadata, local) == NULL)
                return fail(t, CKPTFS_ERROR_FORMAT, "%s: no '%s' (args.mtp_num_layers implies it)",
                            t->dcp.metadata_path, te);
            Entry en = {key, te_there ? g_steal_pointer(&te) : g_steal_pointer(&local), false, l, m, 0, 0};
            g_array_append_val(entries, en);
        }
    return true;
}

static bool read_common(Td *t, const CkptfsPy **args)
{
    g_autofree char *path = g_build_filename(t->dcp.dir, "common.pt", NULL);
    *args = NULL;
    if (!g_file_test(path, G_FILE_TEST_IS_REGULAR))
        return true; /* sizes must then come from a given config.json */
    int src = ckptfs_srcfiles_add(t->source->files, path, t->error);
    if (src < 0)
        return false;
    CkptfsZip *zip = ckptfs_zip_open(t->source->files, (unsigned)src, t->error);
    if (zip == NULL)
        return false;
    t->common = ckptfs_dcp_parse_archive(&t->dcp, zip, path);
    ckptfs_zip_free(zip);
    if (t->common == NULL)
        return false;
    *args = ckptfs_py_object_state(ckptfs_py_dict_get(ckptfs_pickle_root(t->common), "args"));
    return true;
}

/* The padded vocabulary from the embedding's entry, for checkpoints saved without args. */
static uint64_t metadata_rows(Td *t, const char *key)
{
    uint64_t dims[CKPTFS_MAX_DIMS];
    unsigned n = 0;
    g_autofree char *stored = stored_name(t, g_strdup(key));
    const CkptfsPy *st = ckptfs_py_object_state(ckptfs_py_dict_get(t->dcp.state_dict_metadata, stored));
    return st && ckptfs_py_dims(ckptfs_py_dict_get(st, "size"), dims, &n) && n == 2 ? dims[0] : 0;
}

static bool open_torch_dist(Td *t)
{
    const CkptfsOptions *options = t->options;
    if (!check_metadata_json(t))
        return false;
    if (!g_file_test(t->dcp.metadata_path, G_FILE_TEST_IS_REGULAR))
        return fail(t, CKPTFS_ERROR_NOT_FOUND, "%s: missing (metadata.json says torch_dist)", t->dcp.metadata_path);
    if (!ckptfs_dcp_read_metadata(&t->dcp))
        return false;

    const CkptfsPy *args = NULL;
    if (!read_common(t, &args) || !ckptfs_source_use_given_config(t->source, options, t->error))
        return false;
    if (args == NULL && t->wrap != NULL)
        args = t->wrap->args;
    g_autofree char *common = t->wrap && args == t->wrap->args ? g_strdup(t->wrap->args_from)
                                                               : g_build_filename(t->dcp.dir, "common.pt", NULL);
    /* verl saves model/dist_ckpt/ without args beside model/huggingface/ (config, tokenizer). */
    g_autofree char *parent = g_path_get_dirname(t->dcp.dir);
    g_autofree char *verl_hf = g_build_filename(parent, "huggingface", NULL);
    bool verl_layout = options->hf_extra == NULL && options->hf_config == NULL && has_file(verl_hf, "config.json");
    if (verl_layout) {
        CkptfsOptions with_hf = {.hf_extra = verl_hf};
        if (!ckptfs_source_use_given_config(t->source, &with_hf, t->error))
            return false;
    }
    if (args) {
        if (!ckptfs_megatron_model_from_args(args, common, options, t->source->config, &t->saved, t->error))
            return false;
        if (t->source->config == NULL)
            ckptfs_megatron_synthesize_config(t->source, &t->saved.model);
    } else {
        if (!ckptfs_megatron_model_from_config(t->source->config, t->dcp.dir, &t->saved, t->error))
            return false;
        const char *module = t->saved.model.arch->megatron_prefix; /* a VLM's language_model. */
        g_autofree char *output = g_strconcat(module ? module : "", "output_layer.weight", NULL);
        t->saved.model.tied_embeddings = metadata_rows(t, output) == 0;
    }
    const CkptfsModel *model = &t->saved.model;
    /* Sizes a hostile source gives: bounded before anything is built per layer. */
    g_autofree char *sizes_from = args ? g_strdup(common) : g_strdup_printf("%s: config.json", t->dcp.dir);
    if (!ckptfs_model_check_limits(model, sizes_from, t->error))
        return false;
    if (model->kv_heads == 0 || model->heads % model->kv_heads != 0)
        return fail(t, CKPTFS_ERROR_FORMAT, "%s: %" G_GUINT64_FORMAT " attention heads are not a multiple "
                    "of %" G_GUINT64_FORMAT " query groups", t->dcp.dir, model->heads, model->kv_heads);
    /* Stacked keys, or one key per layer (Megatron's naming when layers differ in kind). */
    t->prefix = model->arch->megatron_prefix ? model->arch->megatron_prefix : "";
    bool per_layer = per_layer_names(t);
    if (!per_layer && !ckptfs_model_layers_homogeneous(model))
        return fail(t, CKPTFS_ERROR_FORMAT, "%s: the keys stack every layer, but the model has dense layers "
                    "among its MoE layers (args.moe_layer_freq), which Megatron saves per layer "
                    "('decoder.layers.N. ...')", t->dcp.metadata_path);
    /* The vocabulary's padding is the saver's: each key's shape is checked against .metadata. */
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(model, 0, false);
    g_autoptr(GArray) entries = g_array_new(FALSE, FALSE, sizeof(Entry));
    g_array_set_clear_func(entries, entry_clear);
    CkptfsPieceSet *set = ckptfs_piece_set_new();
    /* A VLM's vision tower, its blocks stacked (its own config has no pipeline), or a key per
     * block for a tower kept as transformers' module (Qwen3.5's "blocks.N.") */
    CkptfsModel tower;
    g_autoptr(GPtrArray) tower_keys = NULL;
    bool ok = true;
    if (model->arch->vision) {
        ckptfs_model_vision_tower(model, &tower);
        tower_keys = ckptfs_mcore_keys(&tower, 0, false);
        ckptfs_piece_set_want_model(set, &tower, tower_keys);
        ok = model_entries(t, &tower, tower.arch->megatron_prefix, tower_keys, tower.arch->layer_prefix != NULL,
                           entries);
    }
    ckptfs_piece_set_want_model(set, model, keys);
    ok = ok && model_entries(t, model, t->prefix, keys, per_layer, entries) && check_unexpected(t, entries);
    for (guint i = 0; ok && i < entries->len; i++)
        ok = map_key(t, &g_array_index(entries, Entry, i), set);
    ok = ok && check_coverage(t, entries, set) && ckptfs_dcp_check_overlaps(&t->dcp);
    if (ok && (!ckptfs_piece_set_to_catalog(set, t->source->catalog, t->dtype, t->error) ||
               !ckptfs_megatron_add_mtp_copies(t->source->catalog, &t->saved.model, t->error) ||
               !ckptfs_megatron_unshift_norms(t->source->catalog, &t->saved.model, keys, t->error))) {
        g_prefix_error(t->error, "%s: ", t->dcp.metadata_path);
        ok = false;
    }
    ckptfs_piece_set_free(set);
    if (!ok)
        return false;
    t->source->found = g_strdup_printf(
        "%u model keys%s in %u chunks over %u .distcp files; %u _extra_state objects and %u optimizer/RNG "
        "entries left unread", entries->len, per_layer ? " (per layer)" : "", t->chunks,
        ckptfs_dcp_file_count(&t->dcp), t->objects, t->skipped);
    /* The split it was saved with (from args) is what a bare vpp2 or pp4 refines. */
    CkptfsLayout saved = t->saved.layout;
    t->source->saved_layout = saved.tp && saved.pp ? saved : (CkptfsLayout){.tp = 1, .pp = 1, .vpp = 1};
    const char *extra = options->hf_extra ? options->hf_extra : verl_layout ? verl_hf : NULL;
    return extra == NULL || ckptfs_source_add_extra_files(t->source, extra, t->error);
}

bool ckptfs_torch_dist_open_dir(CkptfsSource *source, const CkptfsOptions *options, const char *dir,
                                const CkptfsTorchDistWrap *wrap, GError **error)
{
    Td t = {.source = source, .options = options, .error = error, .wrap = wrap,
            .wrap_prefix = wrap && wrap->key_prefix ? wrap->key_prefix : ""};
    ckptfs_dcp_init(&t.dcp, source->files, dir, error);
    bool ok = open_torch_dist(&t);
    ckptfs_pickle_free(t.common);
    ckptfs_dcp_clear(&t.dcp);
    return ok;
}

static bool open_torch_dist_source(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    g_autofree char *dir = checkpoint_dir(source->dir, options->iteration);
    if (dir == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_NOT_FOUND, "%s: no torch_dist checkpoint (metadata.json)", source->dir);
    return ckptfs_torch_dist_open_dir(source, options, dir, NULL, error);
}

const CkptfsSourceFormat ckptfs_format_torch_dist = {"megatron-torch_dist", probe_torch_dist,
                                                     open_torch_dist_source, ckptfs_megatron_describe};
