/* mcore/: a torch_dist checkpoint of the model, synthesized on read. It is what Megatron-core's
 * dist_checkpointing (and verl's loader on top of it) reads: metadata.json, common.pt (args),
 * .metadata (a pickle of torch.distributed.checkpoint's Metadata: every key's global shape and
 * chunks, and where each chunk is) and .distcp files, each a run of small torch.save archives,
 * one per chunk. Chunks are cut at every boundary a tensor-parallel loader of degree 1, 2, 4 or
 * 8 (those the model allows) draws, so each loader reads exactly its share of every tensor. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/mcore.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/views.h"

#define DCP_MODULE "torch.distributed.checkpoint.metadata"
/* A new .distcp file starts once the current one reaches this size. */
#define DISTCP_TARGET_SIZE (1ull << 30)

typedef struct {
    const CkptfsMcoreKey *key; /* NULL: an _extra_state object */
    char *object_fqn;          /* _extra_state: its key */
    uint64_t layer;            /* stacked keys and objects */
    uint64_t r0, r1, c0, c1;   /* the chunk in the key's (per-layer) matrix */
    unsigned file;
    uint64_t offset, length;   /* of its archive in the file */
} Item;

typedef struct {
    const CkptfsSource *source;
    const CkptfsModel *model;
    const CkptfsOptions *options;
    uint64_t padded_vocab;
    unsigned tps[4], ntps; /* tensor-parallel degrees the model allows, of 1, 2, 4, 8 */
    GPtrArray *keys;       /* CkptfsMcoreKey* */
    GArray *items;         /* Item */
    unsigned nfiles;
    GArray *file_first;    /* first item of each file, then items->len */
} McoreView;

typedef struct {
    const McoreView *view;
    const Item *item;
} ItemRef;

static void clear_items(McoreView *v)
{
    if (v->items) {
        for (guint i = 0; i < v->items->len; i++)
            g_free(g_array_index(v->items, Item, i).object_fqn);
        g_array_unref(v->items);
        v->items = NULL;
    }
    if (v->file_first) {
        g_array_unref(v->file_first);
        v->file_first = NULL;
    }
}

static void mcore_view_free(gpointer p)
{
    McoreView *v = p;
    clear_items(v);
    g_ptr_array_unref(v->keys);
    g_free(v);
}

/* The rows [r0, r1) x columns [c0, c1) of a key's matrix (of one layer), row-major. */
static void emit_item(gconstpointer ctx, CkptfsPlanBuilder *b)
{
    const ItemRef *ref = ctx;
    const Item *it = ref->item;
    const CkptfsMcoreKey *k = it->key;
    size_t isz = ckptfs_dtype_size(ref->view->model->dtype);
    uint64_t row = it->r0, width = it->c1 - it->c0;
    for (guint s = 0; s < k->segments->len && row < it->r1; s++) {
        const CkptfsMcoreSegment *seg = &g_array_index(k->segments, CkptfsMcoreSegment, s);
        uint64_t a = MAX(row, seg->row0), z = MIN(it->r1, seg->row0 + seg->rows);
        if (a >= z)
            continue;
        if (a > row) /* padding rows before it */
            ckptfs_plan_add_zero(b, (a - row) * width * isz);
        g_autofree char *name = ckptfs_mcore_hf_name(k, it->layer, 0, seg->hf_name);
        const CkptfsTensor *t = ckptfs_catalog_find(ref->view->source->catalog, name);
        g_assert(t != NULL); /* the model rules checked every tensor */
        ckptfs_tensor_emit_rect(t, b, seg->hf_row0 + (a - seg->row0), seg->hf_row0 + (z - seg->row0),
                                it->c0, it->c1);
        row = z;
    }
    if (row < it->r1)
        ckptfs_plan_add_zero(b, (it->r1 - row) * width * isz);
}

/* What the chunk's archive holds: its tensor, or `[None]` for an _extra_state object (what
 * Megatron saves for layers without FP8 state). */
static CkptfsValue *item_value(const ItemRef *ref)
{
    const Item *it = ref->item;
    if (it->key == NULL) {
        CkptfsValue *list = ckptfs_value_container(CKPTFS_VALUE_LIST);
        ckptfs_value_append(list, ckptfs_value_none());
        return list;
    }
    uint64_t shape[3];
    unsigned n = 0;
    if (it->key->stacked)
        shape[n++] = 1;
    shape[n++] = it->r1 - it->r0;
    if (it->key->ndim == 2)
        shape[n++] = it->c1 - it->c0;
    return ckptfs_value_tensor(ref->view->model->dtype, n, shape, emit_item, ref);
}

static void item_offsets(const Item *it, uint64_t *offsets, uint64_t *sizes, unsigned *n)
{
    *n = 0;
    if (it->key->stacked)
        offsets[*n] = it->layer, sizes[(*n)++] = 1;
    offsets[*n] = it->r0, sizes[(*n)++] = it->r1 - it->r0;
    if (it->key->ndim == 2)
        offsets[*n] = it->c0, sizes[(*n)++] = it->c1 - it->c0;
}

static void add_item(McoreView *v, Item it)
{
    g_array_append_val(v->items, it);
}

/* The chunks of KEY (for one layer of a stacked key): cut along its split dimension. */
static void add_key_items(McoreView *v, const CkptfsMcoreKey *key, uint64_t layer)
{
    g_autoptr(GArray) cuts = ckptfs_mcore_tp_cuts(key, v->tps, v->ntps, v->model->vocab,
                                                  v->options->vocab_divisible_by);
    for (guint i = 0; i + 1 < cuts->len; i++) {
        uint64_t a = g_array_index(cuts, uint64_t, i), z = g_array_index(cuts, uint64_t, i + 1);
        Item it = {.key = key, .layer = layer, .r0 = 0, .r1 = key->rows, .c0 = 0, .c1 = key->cols};
        if (key->split == CKPTFS_TP_COLS)
            it.c0 = a, it.c1 = z;
        else
            it.r0 = a, it.r1 = z;
        add_item(v, it);
    }
}

/* Every chunk in file order: the embedding, each layer's tensors and objects (so a pipeline
 * stage reads one region), the final norm and output layer. Then archive sizes and files. */
static bool lay_out_items(McoreView *v, GError **error)
{
    const CkptfsModel *m = v->model;
    clear_items(v); /* a failed attempt is retried on the next lookup */
    v->items = g_array_new(FALSE, FALSE, sizeof(Item));
    for (guint k = 0; k < v->keys->len; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(v->keys, k);
        if (key->rule->scope == CKPTFS_SCOPE_FIRST)
            add_key_items(v, key, 0);
    }
    g_autoptr(GPtrArray) extras = ckptfs_mcore_extra_state_rules(m);
    for (uint64_t l = 0; l < m->layers; l++) {
        for (guint k = 0; k < v->keys->len; k++) {
            const CkptfsMcoreKey *key = g_ptr_array_index(v->keys, k);
            if (key->stacked)
                add_key_items(v, key, l);
        }
        for (guint i = 0; i < extras->len; i++)
            add_item(v, (Item){.object_fqn = g_strdup_printf(
                                   "decoder.layers.%s/shard_%" G_GUINT64_FORMAT "_%" G_GUINT64_FORMAT,
                                   ((const CkptfsRule *)g_ptr_array_index(extras, i))->name, l, m->layers),
                               .layer = l});
    }
    for (guint k = 0; k < v->keys->len; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(v->keys, k);
        if (key->rule->scope == CKPTFS_SCOPE_LAST)
            add_key_items(v, key, 0);
    }

    v->file_first = g_array_new(FALSE, FALSE, sizeof(guint));
    uint64_t at = 0;
    for (guint i = 0; i < v->items->len; i++) {
        Item *it = &g_array_index(v->items, Item, i);
        if (i == 0 || at >= DISTCP_TARGET_SIZE) {
            g_array_append_val(v->file_first, i);
            at = 0;
        }
        ItemRef ref = {v, it};
        CkptfsValue *value = item_value(&ref);
        it->length = ckptfs_torchsave_size(value, "archive", error);
        ckptfs_value_free(value);
        if (it->length == 0)
            return false;
        it->file = v->file_first->len - 1;
        it->offset = at;
        at += it->length;
    }
    v->nfiles = v->file_first->len;
    guint end = v->items->len;
    g_array_append_val(v->file_first, end);
    return true;
}

static char *distcp_name(unsigned file)
{
    return g_strdup_printf("__%u_0.distcp", file);
}

/* --- .metadata: torch.distributed.checkpoint.metadata.Metadata, as pickle.dump writes it --- */

static CkptfsValue *dataclass(const char *module, const char *name, CkptfsValue *state)
{
    return ckptfs_value_object(module, name, NULL, state, true);
}

static CkptfsValue *torch_size(const uint64_t *dims, unsigned n)
{
    CkptfsValue *args = ckptfs_value_container(CKPTFS_VALUE_TUPLE);
    ckptfs_value_append(args, ckptfs_value_int_tuple(dims, n));
    return ckptfs_value_object("torch", "Size", args, NULL, false);
}

static CkptfsValue *call1(const char *module, const char *name, CkptfsValue *arg)
{
    CkptfsValue *args = ckptfs_value_container(CKPTFS_VALUE_TUPLE);
    ckptfs_value_append(args, arg);
    return ckptfs_value_object(module, name, args, NULL, false);
}

/* TensorProperties pickles its __getstate__ tuple: dtype, layout, requires_grad, memory format
 * (an _MEM_FORMAT_ENCODING), pin_memory. */
static CkptfsValue *tensor_properties(CkptfsDtype dtype)
{
    CkptfsValue *state = ckptfs_value_container(CKPTFS_VALUE_TUPLE);
    ckptfs_value_append(state, ckptfs_value_dtype(dtype));
    ckptfs_value_append(state, call1("torch.serialization", "_get_layout",
                                     ckptfs_value_str("torch.strided")));
    ckptfs_value_append(state, ckptfs_value_bool(false));
    ckptfs_value_append(state, call1(DCP_MODULE, "_MEM_FORMAT_ENCODING", ckptfs_value_int(0)));
    ckptfs_value_append(state, ckptfs_value_bool(false));
    return dataclass(DCP_MODULE, "TensorProperties", state);
}

static CkptfsValue *build_metadata(const McoreView *v)
{
    const CkptfsModel *m = v->model;
    CkptfsValue *sdm = ckptfs_value_container(CKPTFS_VALUE_DICT);
    CkptfsValue *storage = ckptfs_value_container(CKPTFS_VALUE_DICT);
    /* Chunks of each key, in key order; then every object. */
    GHashTable *chunks_of = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (guint k = 0; k < v->keys->len; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(v->keys, k);
        uint64_t shape[3];
        unsigned n = ckptfs_mcore_key_shape(key, m->layers, shape);
        CkptfsValue *state = ckptfs_value_container(CKPTFS_VALUE_DICT);
        ckptfs_value_set(state, "properties", tensor_properties(m->dtype));
        ckptfs_value_set(state, "size", torch_size(shape, n));
        CkptfsValue *chunks = ckptfs_value_container(CKPTFS_VALUE_LIST);
        ckptfs_value_set(state, "chunks", chunks);
        g_hash_table_insert(chunks_of, (gpointer)key, chunks);
        ckptfs_value_set(sdm, key->key, dataclass(DCP_MODULE, "TensorStorageMetadata", state));
    }
    for (guint i = 0; i < v->items->len; i++) {
        const Item *it = &g_array_index(v->items, Item, i);
        CkptfsValue *index = ckptfs_value_container(CKPTFS_VALUE_DICT);
        ckptfs_value_set(index, "fqn", ckptfs_value_str(it->key ? it->key->key : it->object_fqn));
        if (it->key) {
            uint64_t offsets[3], sizes[3];
            unsigned n;
            item_offsets(it, offsets, sizes, &n);
            CkptfsValue *chunk = ckptfs_value_container(CKPTFS_VALUE_DICT);
            ckptfs_value_set(chunk, "offsets", torch_size(offsets, n));
            ckptfs_value_set(chunk, "sizes", torch_size(sizes, n));
            ckptfs_value_append(g_hash_table_lookup(chunks_of, it->key),
                                dataclass(DCP_MODULE, "ChunkStorageMetadata", chunk));
            ckptfs_value_set(index, "offset", torch_size(offsets, n));
        } else {
            ckptfs_value_set(sdm, it->object_fqn, dataclass(DCP_MODULE, "BytesStorageMetadata", NULL));
        }
        ckptfs_value_set(index, "index", ckptfs_value_none());
        CkptfsValue *info = ckptfs_value_container(CKPTFS_VALUE_DICT);
        g_autofree char *file = distcp_name(it->file);
        ckptfs_value_set(info, "relative_path", ckptfs_value_str(file));
        ckptfs_value_set(info, "offset", ckptfs_value_int((int64_t)it->offset));
        ckptfs_value_set(info, "length", ckptfs_value_int((int64_t)it->length));
        ckptfs_value_set_item(storage, dataclass(DCP_MODULE, "MetadataIndex", index),
                              dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo", info));
    }
    g_hash_table_unref(chunks_of);
    CkptfsValue *state = ckptfs_value_container(CKPTFS_VALUE_DICT);
    ckptfs_value_set(state, "state_dict_metadata", sdm);
    ckptfs_value_set(state, "planner_data", ckptfs_value_none());
    ckptfs_value_set(state, "storage_data", storage);
    ckptfs_value_set(state, "storage_meta", ckptfs_value_none());
    return dataclass(DCP_MODULE, "Metadata", state);
}

/* --- files --- */

static CkptfsPlan *literal_plan(const void *data, size_t len)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, data, len);
    return ckptfs_plan_builder_finish(b);
}

static CkptfsPlan *plan_text(gpointer owner, gconstpointer key, GError **error)
{
    return literal_plan(key, strlen(key));
}

static CkptfsPlan *plan_metadata(gpointer owner, gconstpointer key, GError **error)
{
    CkptfsValue *md = build_metadata(owner);
    GBytes *bytes = ckptfs_pickle_dump(md, error);
    ckptfs_value_free(md);
    if (bytes == NULL)
        return NULL;
    gsize n;
    const void *data = g_bytes_get_data(bytes, &n);
    CkptfsPlan *plan = literal_plan(data, n);
    g_bytes_unref(bytes);
    return plan;
}

/* common.pt: what every rank loads first. A release checkpoint of weights only. */
static CkptfsPlan *plan_common(gpointer owner, gconstpointer key, GError **error)
{
    const McoreView *v = owner;
    CkptfsLayout single = {.tp = 1, .pp = 1, .vpp = 1};
    CkptfsValue *top = ckptfs_value_container(CKPTFS_VALUE_DICT);
    ckptfs_value_set(top, "args", ckptfs_megatron_args(v->model, v->options, &single,
                                                       v->padded_vocab, "torch_dist"));
    ckptfs_value_set(top, "checkpoint_version", ckptfs_value_float(3.0));
    ckptfs_value_set(top, "iteration", ckptfs_value_int(0));
    CkptfsValue *content = ckptfs_value_container(CKPTFS_VALUE_DICT);
    ckptfs_value_set(content, "singleton_local_shards", ckptfs_value_bool(false));
    ckptfs_value_set(content, "chained_optim_avoid_prefix", ckptfs_value_bool(true));
    ckptfs_value_set(top, "content_metadata", content);
    CkptfsPlan *plan = ckptfs_torchsave_plan(top, "common", v->options->crc32, error);
    ckptfs_value_free(top);
    return plan;
}

static CkptfsPlan *plan_distcp(gpointer owner, gconstpointer key, GError **error)
{
    const McoreView *v = owner;
    const guint *range = key; /* first item, end */
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    for (guint i = range[0]; i < range[1]; i++) {
        const Item *it = &g_array_index(v->items, Item, i);
        ItemRef ref = {v, it};
        CkptfsValue *value = item_value(&ref);
        g_assert(ckptfs_plan_builder_size(b) == it->offset);
        bool ok = ckptfs_torchsave_append(b, value, "archive", v->options->crc32, error);
        ckptfs_value_free(value);
        if (!ok) {
            ckptfs_plan_builder_free(b);
            return NULL;
        }
        g_assert(ckptfs_plan_builder_size(b) == it->offset + it->length);
    }
    return ckptfs_plan_builder_finish(b);
}

static const char metadata_json[] =
    "{\"sharded_backend\": \"torch_dist\", \"sharded_backend_version\": 1, "
    "\"common_backend\": \"torch\", \"common_backend_version\": 1}";

/* The checkpoint directory is laid out on first use, not at mount. */
static bool populate_release(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    McoreView *v = owner;
    if (!lay_out_items(v, error))
        return false;
    ckptfs_tree_add_file(tree, dir, "metadata.json", plan_text, v, metadata_json);
    ckptfs_tree_add_file(tree, dir, "common.pt", plan_common, v, NULL);
    ckptfs_tree_add_file(tree, dir, ".metadata", plan_metadata, v, NULL);
    for (unsigned f = 0; f < v->nfiles; f++) {
        g_autofree char *name = distcp_name(f);
        ckptfs_tree_mark_scattered(ckptfs_tree_add_file(tree, dir, name, plan_distcp, v,
                                                        &g_array_index(v->file_first, guint, f)));
    }
    return true;
}

bool ckptfs_mcore_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                             const CkptfsModel *model, const CkptfsOptions *options,
                             GError **error)
{
    McoreView *v = g_new0(McoreView, 1);
    v->source = source;
    v->model = model;
    v->options = options;
    static const unsigned degrees[] = {1, 2, 4, 8};
    for (size_t i = 0; i < G_N_ELEMENTS(degrees); i++) {
        CkptfsLayout l = {.tp = degrees[i], .pp = 1, .vpp = 1};
        if (ckptfs_layout_validate(&l, model, NULL))
            v->tps[v->ntps++] = degrees[i];
    }
    /* Padded for the largest degree: a loader with another padding reads the rows it shares
     * (Megatron allows that mismatch for the vocabulary, and only for it). */
    v->padded_vocab = ckptfs_padded_vocab(model->vocab, options->vocab_divisible_by,
                                          v->ntps ? v->tps[v->ntps - 1] : 1);
    v->keys = ckptfs_mcore_keys(model, v->padded_vocab, false);
    ckptfs_tree_own(tree, v, mcore_view_free);

    /* Megatron reads the tracker as text; "release" loads weights only. */
    ckptfs_tree_add_file(tree, dir, "latest_checkpointed_iteration.txt", plan_text, NULL, "release");
    CkptfsNode *release = ckptfs_tree_add_dir(tree, dir, "release");
    ckptfs_tree_set_dir_hooks(tree, release, populate_release, NULL, v);
    return true;
}
