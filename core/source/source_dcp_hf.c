/* torch distributed checkpoints (DCP) of a Hugging Face model as a source: what the Hugging
 * Face Trainer and Accelerate write for FSDP with SHARDED_STATE_DICT (checkpoint-N/ with
 * config.json and pytorch_model_fsdp_0/, the DCP save of {"model": model_state_dict}, so keys
 * are "model.<HF name>"; FSDP1's ShardedTensors and FSDP2's DTensors alike), and a bare DCP
 * directory of an HF state dict. Each key's chunks, wherever the ranks wrote them, become
 * pieces of the tensor; nothing is copied. The optimizer's directories (optimizer_0/) and the
 * trainer's state files are never opened.
 * torchtitan's DCP checkpoints (checkpoint/step-N/) are read the same way, their own parameter
 * names made Hugging Face's by titan.c's tables; the optimizer, lr_scheduler, dataloader and
 * train_state entries saved beside the model are left unread. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"
#include "dcp.h"
#include "source_internal.h"
#include "titan.h"

/* Accelerate's save_fsdp_model: pytorch_model_fsdp_{model_index}; model 0 is the one trained. */
#define MODEL_DIR "pytorch_model_fsdp_0"
#define METADATA ".metadata"
/* The top-level key save_fsdp_model nests the model's state dict under. */
#define MODEL_KEY "model"
/* What torchtitan's model state dict has and no Hugging Face one: how its checkpoints are told. */
#define TITAN_MARK "tok_embeddings.weight"
/* The states torchtitan's checkpointer saves beside the model's (flattened) ones. */
static const char *const titan_other_states[] = {"optimizer", "lr_scheduler", "dataloader", "train_state"};

/* Files of the checkpoint directory hf/ does not pass through: weights (hf/ makes its own, a
 * bare DCP directory holds its chunks) and the trainer's own state. */
static const char *const not_passed_suffixes[] = {".safetensors", ".index.json", ".bin", ".pt", ".pth", ".distcp"};
static const char *const not_passed_names[] = {METADATA, "trainer_state.json",
                                               /* DeepSpeed's tag file and the merge script it copies beside it */
                                               "latest", "zero_to_fp32.py"};

typedef struct {
    CkptfsSource *source;
    const CkptfsOptions *options;
    GError **error;
    char *checkpoint_dir;  /* where config.json and the tokenizer are */
    bool trainer;          /* checkpoint-N/ with pytorch_model_fsdp_0/, not a bare DCP directory */
    CkptfsDcp dcp;
    bool nested;           /* keys are MODEL_KEY "." + HF name */
    unsigned tensors, chunks, skipped;
    GHashTable *ranks;     /* R of the __R_k.distcp files read */
    bool listed[CKPTFS_DTYPE_COUNT];
    GString *dtypes;       /* stored element types, in the order first seen */
    const CkptfsTitanModel *titan; /* torchtitan's names, or NULL for Hugging Face's */
    CkptfsTitanHeads heads;
} DcpHf;

#define fail(h, ...) ckptfs_fail((h)->error, __VA_ARGS__)

static bool has_file(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, G_FILE_TEST_IS_REGULAR);
}

/* A trainer checkpoint (DIR/pytorch_model_fsdp_0/.metadata) or a bare DCP directory (.metadata
 * without Megatron's metadata.json). */
static bool probe_dcp_hf(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    g_autofree char *model = g_build_filename(dir, MODEL_DIR, NULL);
    return has_file(model, METADATA) || (has_file(dir, METADATA) && !has_file(dir, "metadata.json"));
}

/* A DCP directory (as a bare one above) whose .metadata names torchtitan's embedding. */
static bool probe_titan(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    if (!has_file(dir, METADATA) || has_file(dir, "metadata.json"))
        return false;
    g_autofree char *path = g_build_filename(dir, METADATA, NULL);
    g_autofree char *contents = NULL;
    size_t len = 0;
    /* capped as the DCP reader caps it; a file it would refuse is not torchtitan's either */
    if (!ckptfs_read_small_file(path, CKPTFS_MAX_DCP_METADATA_BYTES, &contents, &len, NULL))
        return false;
    return memmem(contents, len, TITAN_MARK, strlen(TITAN_MARK)) != NULL;
}

static bool passed_through(const char *name)
{
    for (size_t i = 0; i < G_N_ELEMENTS(not_passed_suffixes); i++)
        if (g_str_has_suffix(name, not_passed_suffixes[i]))
            return false;
    for (size_t i = 0; i < G_N_ELEMENTS(not_passed_names); i++)
        if (strcmp(name, not_passed_names[i]) == 0)
            return false;
    return true;
}

bool ckptfs_source_read_checkpoint_dir(CkptfsSource *source, const CkptfsOptions *options, const char *dir,
                                       GError **error)
{
    /* Given files first: the first file of a name is the one served. */
    if (!ckptfs_source_use_given_config(source, options, error) ||
        (options->hf_extra && !ckptfs_source_add_extra_files(source, options->hf_extra, error)))
        return false;
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(dir, name, NULL);
        if (passed_through(name) && g_file_test(path, G_FILE_TEST_IS_REGULAR) &&
            !ckptfs_source_add_file(source, name, path, error))
            return false;
    }
    if (source->config != NULL)
        return true;
    g_autofree char *path = g_build_filename(dir, "config.json", NULL);
    GError *json_error = NULL;
    if (ckptfs_source_top_file(source, "config.json") == NULL) {
        source->config_problem = g_strdup_printf("%s: missing (give -o hf_config=PATH)", path);
    } else if ((source->config = ckptfs_json_load_object(path, &json_error)) == NULL) {
        source->config_problem = g_strdup(json_error->message);
        g_error_free(json_error);
    }
    if (source->config == NULL)
        g_ptr_array_add(source->warnings,
                        g_strdup_printf("%s; hf/ holds the weights only, model-specific views need it",
                                        source->config_problem));
    return true;
}

static bool read_checkpoint_dir(DcpHf *h)
{
    return ckptfs_source_read_checkpoint_dir(h->source, h->options, h->checkpoint_dir, h->error);
}

/* The saved dict's path of KEY as planner_data records it (a tuple of names), or NULL. */
static const CkptfsPy *saved_path(const DcpHf *h, const char *key)
{
    const CkptfsPy *p = h->dcp.planner_data ? ckptfs_py_dict_get(h->dcp.planner_data, key) : NULL;
    return p && (p->kind == CKPTFS_PY_TUPLE || p->kind == CKPTFS_PY_LIST) ? p : NULL;
}

/* Whether the keys are "model.<HF name>" (save_fsdp_model nests the state dict): planner_data
 * says so where the saver flattened a nested dict; without it, the names of a causal LM's
 * top-level modules under "model." do. */
static bool keys_nested(const DcpHf *h)
{
    const CkptfsPy *sdm = h->dcp.state_dict_metadata;
    for (guint i = 0; i + 1 < sdm->items->len; i += 2) {
        const char *key = ckptfs_py_str(g_ptr_array_index(sdm->items, i));
        const CkptfsPy *path = key ? saved_path(h, key) : NULL;
        if (path != NULL && path->items->len == 2 &&
            g_strcmp0(ckptfs_py_str(g_ptr_array_index(path->items, 0)), MODEL_KEY) == 0)
            return true;
        if (key && h->dcp.planner_data == NULL &&
            (g_str_has_prefix(key, MODEL_KEY ".model.") || g_str_has_prefix(key, MODEL_KEY ".lm_head.")))
            return true;
    }
    return false;
}

/* KEY's Hugging Face name, or NULL for an entry that is not the model's (an optimizer state
 * saved in the same dict). */
static const char *hf_name(const DcpHf *h, const char *key)
{
    if (!h->nested)
        return key;
    const CkptfsPy *path = saved_path(h, key);
    if (path != NULL) {
        bool model = path->items->len == 2 &&
                     g_strcmp0(ckptfs_py_str(g_ptr_array_index(path->items, 0)), MODEL_KEY) == 0;
        return model ? ckptfs_py_str(g_ptr_array_index(path->items, 1)) : NULL;
    }
    return g_str_has_prefix(key, MODEL_KEY ".") ? key + strlen(MODEL_KEY ".") : NULL;
}

/* KEY's name in torchtitan's model state dict, or NULL for an entry of the other states: the
 * checkpointer flattens the model's entries to the top level (some saves keep them under
 * "model."), and saves the others nested under their state's name. */
static const char *titan_model_name(const DcpHf *h, const char *key)
{
    const CkptfsPy *path = saved_path(h, key);
    const char *first = path && path->items->len ? ckptfs_py_str(g_ptr_array_index(path->items, 0)) : NULL;
    if (path != NULL && path->items->len == 2 && g_strcmp0(first, MODEL_KEY) == 0)
        return ckptfs_py_str(g_ptr_array_index(path->items, 1));
    for (size_t i = 0; i < G_N_ELEMENTS(titan_other_states); i++) {
        size_t len = strlen(titan_other_states[i]);
        if (g_strcmp0(first, titan_other_states[i]) == 0 ||
            (strncmp(key, titan_other_states[i], len) == 0 && (key[len] == '.' || key[len] == '\0')))
            return NULL;
    }
    return path == NULL && g_str_has_prefix(key, MODEL_KEY ".") ? key + strlen(MODEL_KEY ".") : key;
}

/* R of a chunk file "__R_k.distcp" (what each rank of the save wrote). */
static void note_rank(DcpHf *h, uint32_t src)
{
    g_autofree char *base = g_path_get_basename(ckptfs_srcfiles_get(h->source->files, src)->path);
    if (g_str_has_prefix(base, "__") && g_ascii_isdigit(base[2]))
        g_hash_table_add(h->ranks, GUINT_TO_POINTER(g_ascii_strtoull(base + 2, NULL, 10) + 1));
}

/* One model entry: its chunks as pieces of the tensor's 2-D view (rows: the first dim). FSDP
 * cuts rows; a chunk of a 2-D tensor may cut columns too; one of more dims must keep the
 * trailing dims whole to be a rectangle of the view. */
static bool add_tensor(DcpHf *h, const char *key, const char *name, const CkptfsTitanName *titan_row,
                       const char *layer, const CkptfsPy *md)
{
    const char *path = h->dcp.metadata_path;
    if (md->kind == CKPTFS_PY_OBJECT &&
        ckptfs_py_is_global(md->callable, "torch.distributed.checkpoint.metadata", "BytesStorageMetadata"))
        return fail(h, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' is stored as bytes (a pickled object), not a tensor; "
                    "ckptfs serves tensors only", path, key);
    const CkptfsPy *st = ckptfs_py_object_state(md);
    if (md->kind != CKPTFS_PY_OBJECT ||
        !ckptfs_py_is_global(md->callable, "torch.distributed.checkpoint.metadata", "TensorStorageMetadata") ||
        st == NULL)
        return fail(h, CKPTFS_ERROR_FORMAT, "%s: '%s' is not a TensorStorageMetadata", path, key);
    uint64_t shape[CKPTFS_MAX_DIMS];
    unsigned n = 0;
    if (!ckptfs_py_dims(ckptfs_py_dict_get(st, "size"), shape, &n))
        return fail(h, CKPTFS_ERROR_FORMAT, "%s: '%s' has no size ckptfs can read (at most %d dims)", path, key,
                    CKPTFS_MAX_DIMS);
    CkptfsDtype dtype = ckptfs_dcp_tensor_dtype(st);
    if (dtype == CKPTFS_DTYPE_INVALID)
        return fail(h, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has no dtype ckptfs knows", path, key);
    const CkptfsPy *chunks = ckptfs_py_dict_get(st, "chunks");
    if (chunks == NULL || chunks->kind != CKPTFS_PY_LIST || chunks->items->len == 0)
        return fail(h, CKPTFS_ERROR_FORMAT, "%s: '%s' has no chunks", path, key);
    uint64_t cols = 1;
    for (unsigned d = 1; d < n; d++)
        cols *= shape[d]; /* below 2^64: ckptfs_py_dims bounds each dim, the catalog the product */
    size_t isz = ckptfs_dtype_size(dtype);
    g_autoptr(GArray) pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
    for (guint c = 0; c < chunks->items->len; c++) {
        uint64_t off[CKPTFS_MAX_DIMS], size[CKPTFS_MAX_DIMS];
        if (!ckptfs_dcp_chunk_box(&h->dcp, key, chunks, c, shape, n, off, size))
            return false;
        for (unsigned d = 1; n > 2 && d < n; d++)
            if (off[d] != 0 || size[d] != shape[d]) {
                g_autofree char *o = ckptfs_dims_text(off, n), *s = ckptfs_dims_text(size, n);
                return fail(h, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' chunk at %s of size %s cuts dim %u of a %u-dim "
                            "tensor (ckptfs serves chunks of whole rows there)", path, key, o, s, d, n);
            }
        CkptfsDcpChunk where = {0, 0};
        if (!ckptfs_dcp_locate_chunk(&h->dcp, key, off, size, n, dtype, &where))
            return false;
        note_rank(h, where.src);
        uint64_t r0 = n ? off[0] : 0, nr = n ? size[0] : 1;
        uint64_t c0 = n == 2 ? off[1] : 0, nc = n == 2 ? size[1] : cols;
        CkptfsPiece p = {.row0 = r0, .row1 = r0 + nr, .col0 = c0, .col1 = c0 + nc, .src = where.src,
                         .offset = where.base, .row_stride = nc * isz};
        g_array_append_val(pieces, p);
        h->chunks++;
    }
    const CkptfsPiece *tiles = (const CkptfsPiece *)(void *)pieces->data;
    if (titan_row ? !ckptfs_titan_add(h->source->catalog, titan_row, layer, &h->heads, dtype, n, shape, tiles,
                                      pieces->len, h->error)
                  : !ckptfs_catalog_add_pieces(h->source->catalog, name, dtype, n, shape, tiles, pieces->len, h->error)) {
        g_prefix_error(h->error, "%s: '%s': ", path, key);
        return false;
    }
    if (!h->listed[dtype])
        g_string_append_printf(h->dtypes, " %s", ckptfs_dtype_safetensors_name(dtype));
    h->listed[dtype] = true;
    h->tensors++;
    return true;
}

static bool config_true(JsonObject *config, const char *key)
{
    JsonNode *n = config ? json_object_get_member(config, key) : NULL;
    return n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN &&
           json_node_get_boolean(n);
}

static bool read_model(DcpHf *h)
{
    if (!ckptfs_dcp_read_metadata(&h->dcp))
        return false;
    h->nested = !h->titan && keys_nested(h);
    const CkptfsPy *sdm = h->dcp.state_dict_metadata;
    /* save_pretrained leaves a tied head out; the state dict has it (FSDP1 a copy, FSDP2 the same). */
    bool tied = config_true(h->source->config, "tie_word_embeddings");
    for (guint i = 0; i + 1 < sdm->items->len; i += 2) {
        const char *key = ckptfs_py_str(g_ptr_array_index(sdm->items, i));
        if (key == NULL)
            return fail(h, CKPTFS_ERROR_FORMAT, "%s: a state_dict_metadata key is not a string", h->dcp.metadata_path);
        const char *name = h->titan ? titan_model_name(h, key) : hf_name(h, key);
        g_autofree char *layer = NULL;
        const CkptfsTitanName *row = h->titan && name ? ckptfs_titan_lookup(h->titan, name, &layer) : NULL;
        if (h->titan && name && row == NULL)
            return fail(h, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' is not a parameter of torchtitan's %s that ckptfs "
                        "knows (config.json's model_type '%s')", h->dcp.metadata_path, key, h->titan->name,
                        ckptfs_json_member_string(h->source->config, "model_type"));
        const char *served = row ? row->hf : name;
        bool derived = row && row->layout == CKPTFS_TITAN_DERIVED;
        if (name == NULL || derived || (tied && g_strcmp0(served, "lm_head.weight") == 0)) {
            h->skipped++;
            continue;
        }
        if (!add_tensor(h, key, name, row, layer, g_ptr_array_index(sdm->items, i + 1)))
            return false;
    }
    if (h->tensors == 0)
        return fail(h, CKPTFS_ERROR_FORMAT, "%s: no tensors of a model%s", h->dcp.metadata_path,
                    h->nested ? "" : " (keys neither \"model.<name>\" nor Hugging Face names)");
    return ckptfs_dcp_check_overlaps(&h->dcp);
}

static void describe_found(DcpHf *h)
{
    g_autofree char *abs = g_canonicalize_filename(h->titan ? h->source->dir : h->checkpoint_dir, NULL);
    g_autofree char *base = g_path_get_basename(abs);
    const char *step = g_str_has_prefix(base, "checkpoint-") ? base + strlen("checkpoint-") : NULL;
    g_autoptr(GString) s = g_string_new(NULL);
    if (h->titan)
        g_string_append_printf(s, "torchtitan checkpoint%s%s (%s names)", g_str_has_prefix(base, "step-") ? ", step " : "",
                               g_str_has_prefix(base, "step-") ? base + strlen("step-") : "", h->titan->name);
    else if (h->trainer)
        g_string_append_printf(s, "Hugging Face Trainer / Accelerate FSDP checkpoint%s%s (" MODEL_DIR "/)",
                               step ? ", step " : "", step ? step : "");
    else
        g_string_append(s, "torch DCP of a Hugging Face state dict");
    g_string_append_printf(s, ": saved by %u rank%s, %u tensors in %u chunks over %u .distcp files, stored as%s",
                           g_hash_table_size(h->ranks), g_hash_table_size(h->ranks) == 1 ? "" : "s", h->tensors,
                           h->chunks, ckptfs_dcp_file_count(&h->dcp), h->dtypes->str);
    if (h->titan)
        g_string_append_printf(s, ", served as %u Hugging Face tensors", ckptfs_catalog_count(h->source->catalog));
    if (h->skipped)
        g_string_append_printf(s, "; %u other entries left unread", h->skipped);
    if (h->trainer || h->titan)
        g_string_append(s, "; optimizer and trainer state not read");
    h->source->found = g_string_free(g_steal_pointer(&s), FALSE);
}

/* torchtitan's model, from config.json's model_type (its names say nothing of the sizes, and
 * Llama's rotary permutation needs the head counts). */
static bool titan_model(DcpHf *h)
{
    JsonObject *config = h->source->config;
    if (config == NULL)
        return fail(h, CKPTFS_ERROR_INVALID, "%s: a torchtitan checkpoint names no model: %s", h->source->dir,
                    h->source->config_problem);
    const char *type = ckptfs_json_member_string(config, "model_type");
    if ((h->titan = ckptfs_titan_model_for(type)) == NULL) {
        g_autofree char *known = ckptfs_titan_model_types();
        return fail(h, CKPTFS_ERROR_UNSUPPORTED, "%s: config.json's model_type '%s': ckptfs reads torchtitan "
                    "checkpoints of %s", h->source->dir, type ? type : "(none)", known);
    }
    gint64 heads = 0, kv_heads = 0;
    if (ckptfs_json_member_int(config, "num_attention_heads", &heads) != CKPTFS_JSON_FOUND || heads < 0)
        heads = 0;
    if (ckptfs_json_member_int(config, "num_key_value_heads", &kv_heads) != CKPTFS_JSON_FOUND || kv_heads < 0)
        kv_heads = heads; /* transformers' default: as many as the query heads */
    h->heads = (CkptfsTitanHeads){(uint64_t)heads, (uint64_t)kv_heads};
    return true;
}

/* The model's every tensor, of its shape, and none beside: a torchtitan save is the whole
 * model, and what its names give must be that (a missing or misshapen tensor would otherwise
 * cost only the Megatron views, and hf/ would serve a model transformers cannot load). */
static bool titan_complete(DcpHf *h)
{
    CkptfsModel model;
    g_autoptr(GPtrArray) unused = NULL;
    if (!ckptfs_model_from_config(h->source->config, h->source->catalog, &model, &unused, h->error)) {
        g_prefix_error(h->error, "%s: ", h->dcp.metadata_path);
        return false;
    }
    if (unused != NULL && unused->len > 0)
        return fail(h, CKPTFS_ERROR_FORMAT, "%s: '%s' (and %u more) is beyond what config.json describes",
                    h->dcp.metadata_path, (const char *)g_ptr_array_index(unused, 0), unused->len - 1);
    return true;
}

static bool open_dcp(CkptfsSource *source, const CkptfsOptions *options, bool titan, GError **error)
{
    DcpHf h = {.source = source, .options = options, .error = error,
               .ranks = g_hash_table_new(g_direct_hash, g_direct_equal), .dtypes = g_string_new(NULL)};
    g_autofree char *model = g_build_filename(source->dir, MODEL_DIR, NULL);
    h.trainer = !titan && has_file(model, METADATA);
    /* A bare pytorch_model_fsdp_N/ given itself: its config is the checkpoint directory's; a
     * torchtitan step-N/ may have its config.json beside it, in the checkpoint folder. */
    g_autofree char *base = g_path_get_basename(source->dir);
    bool model_dir_itself = !h.trainer && g_str_has_prefix(base, "pytorch_model_fsdp_") && !has_file(source->dir, "config.json");
    g_autofree char *parent = g_path_get_dirname(source->dir);
    bool config_beside = titan && !has_file(source->dir, "config.json") && has_file(parent, "config.json");
    h.checkpoint_dir = model_dir_itself || config_beside ? g_strdup(parent) : g_strdup(source->dir);
    ckptfs_dcp_init(&h.dcp, source->files, h.trainer ? model : source->dir, error);
    bool ok = read_checkpoint_dir(&h) && (!titan || titan_model(&h)) && read_model(&h) &&
              (!titan || titan_complete(&h));
    if (ok) {
        describe_found(&h);
        /* What accelerate merge-weights users then cast to: training keeps fp32 masters. */
        source->default_dtype = CKPTFS_SERVE_BF16;
    }
    ckptfs_dcp_clear(&h.dcp);
    g_hash_table_unref(h.ranks);
    g_string_free(h.dtypes, TRUE);
    g_free(h.checkpoint_dir);
    return ok;
}

static bool open_dcp_hf(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    return open_dcp(source, options, false, error);
}

static bool open_titan(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    return open_dcp(source, options, true, error);
}

static char *describe_dcp_hf(const CkptfsSource *source)
{
    return g_strdup_printf("%u tensors from a torch distributed checkpoint", ckptfs_catalog_count(source->catalog));
}

const CkptfsSourceFormat ckptfs_format_dcp_hf = {"hf-dcp", probe_dcp_hf, open_dcp_hf, describe_dcp_hf};
const CkptfsSourceFormat ckptfs_format_titan = {"torchtitan", probe_titan, open_titan, describe_dcp_hf};
