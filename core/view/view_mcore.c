/* mcore/: a torch_dist checkpoint of the model, synthesized on read. It is what Megatron-core's
 * dist_checkpointing (and verl's loader on top of it) reads: metadata.json, common.pt (args),
 * .metadata (a pickle of torch.distributed.checkpoint's Metadata: every key's global shape and
 * chunks, and where each chunk is) and .distcp files, each a run of small torch.save archives,
 * one per chunk. Chunks are cut at every boundary a tensor-parallel loader of degree 1, 2, 4 or
 * 8 (those the model allows) draws, so each loader reads exactly its share of every tensor.
 *
 * Mixture of experts, as Megatron-core's sharded_state_dict has it: when every layer is of one
 * kind, layer keys are stacked (leading layer axis) and expert keys add an expert axis
 * (decoder.layers.mlp.experts.experts.linear_fc1.weight [L, E, 2F, H]); when dense layers sit
 * among MoE layers, every layer key is that layer's alone, with its global index and no layer
 * axis (decoder.layers.5.mlp.experts.experts.linear_fc1.weight [E, 2F, H]). Expert chunks are
 * one expert each (an expert-parallel loader reads its experts only), cut at the boundaries of
 * the expert-TP degrees the experts' ffn allows. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/mcore.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/views.h"

#define DCP_MODULE "torch.distributed.checkpoint.metadata"
/* A new .distcp file starts once the current one reaches this size. */
#define DISTCP_TARGET_SIZE (1ull << 30)

/* A module of the state dict: the model (a VLM's language model), or a VLM's vision tower,
 * with its keys and its prefix ("vision_model.", "language_model."; "" for a text model). */
typedef struct {
    const CkptfsModel *model;
    GPtrArray *keys;  /* CkptfsMcoreKey* */
    const char *prefix;
    bool per_layer;   /* MoE and dense layers: per-layer keys, no layer axis */
} McorePart;

/* One entry of .metadata's state_dict_metadata: a tensor key (for a model whose layers are not
 * all of one kind, one layer's), one row section of one (a gated delta-net's in_proj.weight.query),
 * or an _extra_state object. */
typedef struct {
    char *fqn;
    const McorePart *part;
    const CkptfsMcoreKey *key; /* NULL: an _extra_state object */
    bool single;               /* a layer key of one layer only (an MTP layer's): no layer axis */
    uint64_t row0, rows;       /* a section's rows of the key's matrix (rows 0: the whole key) */
} Entry;

typedef struct {
    guint entry;
    uint64_t layer, expert;    /* of layer keys and expert keys */
    uint64_t r0, r1, c0, c1;   /* the chunk in the key's matrix (of one layer and expert) */
    unsigned file;
    uint64_t offset, length;   /* of its archive in the file */
} Item;

typedef struct {
    const CkptfsSource *source;
    const CkptfsModel *model;
    const CkptfsOptions *options;
    uint64_t padded_vocab;
    bool te_spec;
    unsigned tps[4], ntps; /* tensor-parallel degrees the model allows, of 1, 2, 4, 8 */
    unsigned etps[4], netps; /* expert tensor-parallel degrees the experts allow */
    /* the modules in file order: a VLM's vision tower (mbridge registers it first, but for
     * language_first architectures), then the model */
    McorePart parts[2];
    unsigned nparts;
    CkptfsModel tower;
    GArray *entries;       /* Entry */
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
    if (v->entries) {
        for (guint i = 0; i < v->entries->len; i++)
            g_free(g_array_index(v->entries, Entry, i).fqn);
        g_array_unref(v->entries);
        v->entries = NULL;
    }
    if (v->items) {
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
    for (unsigned i = 0; i < v->nparts; i++)
        g_ptr_array_unref(v->parts[i].keys);
    g_free(v);
}

static const CkptfsMcoreKey *item_key(const McoreView *v, const Item *it)
{
    return g_array_index(v->entries, Entry, it->entry).key;
}

static const CkptfsModel *item_model(const McoreView *v, const Item *it)
{
    return g_array_index(v->entries, Entry, it->entry).part->model;
}

/* The rows [r0, r1) x columns [c0, c1) of a key's matrix (of one layer and expert), row-major. */
static void emit_item(gconstpointer ctx, CkptfsPlanBuilder *b)
{
    const ItemRef *ref = ctx;
    const Item *it = ref->item;
    const CkptfsMcoreKey *k = item_key(ref->view, it);
    size_t isz = ckptfs_dtype_size(ckptfs_mcore_key_dtype(k, item_model(ref->view, it)));
    uint64_t row = it->r0, width = it->c1 - it->c0;
    for (guint s = 0; s < k->segments->len && row < it->r1; s++) {
        const CkptfsMcoreSegment *seg = &g_array_index(k->segments, CkptfsMcoreSegment, s);
        uint64_t a = MAX(row, seg->row0), z = MIN(it->r1, seg->row0 + seg->rows);
        if (a >= z)
            continue;
        if (a > row) /* padding rows before it */
            ckptfs_plan_add_zero(b, (a - row) * width * isz);
        g_autofree char *name = ckptfs_mcore_hf_name(k, it->layer, it->expert, seg->hf_name);
        const CkptfsTensor *t = ckptfs_catalog_find(ckptfs_source_model_catalog(ref->view->source), name);
        g_assert(t != NULL); /* the model rules checked every tensor */
        uint64_t r0 = seg->hf_row0 + (a - seg->row0), r1 = seg->hf_row0 + (z - seg->row0);
        if (k->rule->recipe == CKPTFS_RECIPE_LESS_ONE) /* checked shiftable when the view was built */
            ckptfs_tensor_emit_rect_shifted(t, b, r0, r1, it->c0, it->c1, -1);
        else if (ckptfs_mcore_key_transposed(k)) /* likewise checked transposable */
            ckptfs_tensor_emit_rect_transposed(t, b, r0, r1, it->c0, it->c1);
        else
            (ckptfs_mcore_key_swaps_col_halves(k) ? ckptfs_tensor_emit_rect_swapped : ckptfs_tensor_emit_rect)(
                t, b, r0, r1, it->c0, it->c1);
        row = z;
    }
    if (row < it->r1)
        ckptfs_plan_add_zero(b, (it->r1 - row) * width * isz);
}

/* The chunk of a tensor item in its entry's global tensor: offsets and sizes of each dimension
 * (layer when stacked, expert, rows (of its section), columns; conv1d's [rows, 1, kernel]). */
static unsigned item_box(const McoreView *v, const Item *it, uint64_t *offsets, uint64_t *sizes)
{
    const CkptfsMcoreKey *k = item_key(v, it);
    const Entry *e = &g_array_index(v->entries, Entry, it->entry);
    unsigned n = 0;
    unsigned kernel_dims = ckptfs_mcore_kernel_shape(k, e->part->model, sizes);
    if (kernel_dims) { /* replicated: one whole chunk */
        memset(offsets, 0, kernel_dims * sizeof *offsets);
        return kernel_dims;
    }
    if ((k->stacked && !e->part->per_layer && !e->single) || k->listed) /* listed: the module's number */
        offsets[n] = it->layer, sizes[n++] = 1;
    if (k->expert)
        offsets[n] = it->expert, sizes[n++] = 1;
    offsets[n] = it->r0 - e->row0, sizes[n++] = it->r1 - it->r0;
    if (k->ndim == 3)
        offsets[n] = 0, sizes[n++] = 1;
    if (k->ndim >= 2)
        offsets[n] = it->c0, sizes[n++] = it->c1 - it->c0;
    return n;
}

/* What the chunk's archive holds: its tensor, or `[None]` for an _extra_state object (what
 * Megatron saves for layers without FP8 state). */
static CkptfsValue *item_value(const ItemRef *ref)
{
    const Item *it = ref->item;
    if (item_key(ref->view, it) == NULL) {
        CkptfsValue *list = ckptfs_value_container(CKPTFS_VALUE_LIST);
        ckptfs_value_append(list, ckptfs_value_none());
        return list;
    }
    uint64_t offsets[5], shape[5];
    unsigned n = item_box(ref->view, it, offsets, shape);
    return ckptfs_value_tensor(ckptfs_mcore_key_dtype(item_key(ref->view, it), item_model(ref->view, it)), n,
                               shape, emit_item, ref);
}

/* Takes FQN, which gets the part's prefix. A key of row sections is an entry per section, named
 * FQN.<section> (Megatron-core's GatedDeltaNet splits in_proj and conv1d so); returns the first. */
static guint add_entry(McoreView *v, const McorePart *part, char *fqn, const CkptfsMcoreKey *key)
{
    guint first = v->entries->len;
    unsigned sections = key ? key->n_sections : 0; /* 0: the key whole, one entry */
    uint64_t row0 = 0;
    for (unsigned s = 0; s < MAX(sections, 1u); row0 += sections ? key->sections[s] : 0, s++) {
        /* a module beside the part's own (Gemma 3's vision_projection.) has its own prefix */
        const char *prefix = key && key->rule->module ? key->rule->module : part->prefix;
        Entry e = {sections ? g_strconcat(prefix, fqn, ".", key->section_names[s], NULL)
                            : g_strconcat(prefix, fqn, NULL),
                   part, key, false, row0, sections ? key->sections[s] : 0};
        g_array_append_val(v->entries, e);
    }
    g_free(fqn);
    return first;
}

/* Which of KEY's entries (from its first) holds row ROW: its section's. */
static guint section_of(const CkptfsMcoreKey *key, uint64_t row)
{
    guint s = 0;
    for (uint64_t end = key->n_sections ? key->sections[0] : 0; s + 1 < key->n_sections && row >= end;
         end += key->sections[++s])
        ;
    return s;
}

static void add_item(McoreView *v, Item it)
{
    g_array_append_val(v->items, it);
}

/* The chunks of KEY (entry ENTRY) for one layer and expert: cut along its split dimension at
 * CUTS. */
static void add_key_items(McoreView *v, guint entry, const CkptfsMcoreKey *key, const GArray *cuts,
                          uint64_t layer, uint64_t expert)
{
    for (guint i = 0; i + 1 < cuts->len; i++) {
        uint64_t a = g_array_index(cuts, uint64_t, i), z = g_array_index(cuts, uint64_t, i + 1);
        Item it = {.entry = entry, .layer = layer, .expert = expert,
                   .r0 = 0, .r1 = key->rows, .c0 = 0, .c1 = key->cols};
        if (key->split == CKPTFS_TP_COLS)
            it.c0 = a, it.c1 = z;
        else
            it.r0 = a, it.r1 = z, it.entry += section_of(key, a); /* the cuts hold the section bounds */
        add_item(v, it);
    }
}

/* The entry of layer key K for layer L: the stacked key's (made once, in key order), or with
 * per-layer keys a new one; in MTP layer *MTP its own. */
static guint layer_entry(McoreView *v, const McorePart *part, const guint *stacked_entry, guint k, uint64_t l,
                         const uint64_t *mtp)
{
    const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
    if (mtp) {
        guint e = add_entry(v, part, ckptfs_mcore_mtp_key_name(key, v->te_spec, *mtp), key);
        for (unsigned s = 0; s < MAX(key->n_sections, 1u); s++)
            g_array_index(v->entries, Entry, e + s).single = true;
        return e;
    }
    if (!part->per_layer)
        return stacked_entry[k];
    return add_entry(v, part, ckptfs_mcore_key_name(key, v->te_spec, true, l), key);
}

/* The _extra_state objects of layer L: Megatron's ShardedObjects, one per layer (and expert)
 * of the stacked axes ("shard_{l}_{L}", "shard_{l}.{e}_{L}.{E}"), or with per-layer keys of
 * the expert axis alone ("shard_0_1", "shard_{e}_{E}"). */
static void add_layer_objects(McoreView *v, const McorePart *part, const GPtrArray *extras, uint64_t l,
                              const uint64_t *mtp)
{
    const CkptfsModel *m = part->model;
    for (guint i = 0; i < extras->len; i++) {
        const CkptfsRule *r = g_ptr_array_index(extras, i);
        if (!ckptfs_rule_in_layer(r, m, l))
            continue;
        uint64_t n = r->expert ? m->experts : 1;
        for (uint64_t e = 0; e < n; e++) {
            char *fqn;
            if (mtp && r->expert) /* an MTP layer's: of its own, as per-layer keys */
                fqn = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".transformer_layer.%s/shard_%" G_GUINT64_FORMAT
                                      "_%" G_GUINT64_FORMAT, *mtp, r->name, e, m->experts);
            else if (mtp)
                fqn = g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".transformer_layer.%s/shard_0_1", *mtp, r->name);
            else if (!part->per_layer && r->expert)
                fqn = g_strdup_printf("decoder.layers.%s/shard_%" G_GUINT64_FORMAT ".%" G_GUINT64_FORMAT
                                      "_%" G_GUINT64_FORMAT ".%" G_GUINT64_FORMAT,
                                      r->name, l, e, m->layers, m->experts);
            else if (!part->per_layer)
                fqn = g_strdup_printf("decoder.layers.%s/shard_%" G_GUINT64_FORMAT "_%" G_GUINT64_FORMAT,
                                      r->name, l, m->layers);
            else if (r->expert)
                fqn = g_strdup_printf("decoder.layers.%" G_GUINT64_FORMAT ".%s/shard_%" G_GUINT64_FORMAT
                                      "_%" G_GUINT64_FORMAT,
                                      l, r->name, e, m->experts);
            else
                fqn = g_strdup_printf("decoder.layers.%" G_GUINT64_FORMAT ".%s/shard_0_1", l, r->name);
            add_item(v, (Item){.entry = add_entry(v, part, fqn, NULL), .layer = l, .expert = e});
        }
    }
}

/* The chunks of layer L (its experts one after the other) and its objects. With MTP (the
 * index of a multi-token prediction layer) the layer's keys are that layer's own. */
static void add_layer_items(McoreView *v, const McorePart *part, const guint *entry_of, GPtrArray *cuts,
                            const GPtrArray *extras, uint64_t l, const uint64_t *mtp)
{
    const CkptfsModel *m = part->model;
    guint nkeys = part->keys->len;
    g_autofree guint *layer_entry_of = g_new0(guint, nkeys);
    bool experts_done = false;
    for (guint k = 0; k < nkeys; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        if (!key->stacked || !ckptfs_rule_in_layer(key->rule, m, l) || (key->expert && experts_done))
            continue;
        if (!key->expert) {
            add_key_items(v, layer_entry(v, part, entry_of, k, l, mtp), key, g_ptr_array_index(cuts, k), l, 0);
            continue;
        }
        /* The expert keys, expert by expert: an expert-parallel rank's experts lie together. */
        for (guint j = k; j < nkeys; j++) {
            const CkptfsMcoreKey *ek = g_ptr_array_index(part->keys, j);
            if (ek->stacked && ek->expert && ckptfs_rule_in_layer(ek->rule, m, l))
                layer_entry_of[j] = layer_entry(v, part, entry_of, j, l, mtp);
        }
        for (uint64_t e = 0; e < m->experts; e++)
            for (guint j = k; j < nkeys; j++) {
                const CkptfsMcoreKey *ek = g_ptr_array_index(part->keys, j);
                if (ek->stacked && ek->expert && ckptfs_rule_in_layer(ek->rule, m, l))
                    add_key_items(v, layer_entry_of[j], ek, g_ptr_array_index(cuts, j), l, e);
            }
        experts_done = true;
    }
    add_layer_objects(v, part, extras, l, mtp);
}

/* Every chunk of PART in file order: the embedding, each layer's tensors (its experts one after
 * the other) and objects (so a pipeline stage reads one region), the final norm and output
 * layer. */
static void add_part_items(McoreView *v, const McorePart *part)
{
    const CkptfsModel *m = part->model;
    guint nkeys = part->keys->len;
    g_autofree guint *entry_of = g_new0(guint, nkeys);
    g_autoptr(GPtrArray) cuts = g_ptr_array_new_with_free_func((GDestroyNotify)g_array_unref);
    for (guint k = 0; k < nkeys; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        bool ex = key->expert;
        g_ptr_array_add(cuts, ckptfs_mcore_tp_cuts(key, ex ? v->etps : v->tps, ex ? v->netps : v->ntps,
                                                   m->vocab, v->options->vocab_divisible_by));
    }
    /* Entries in key order: the first stage's, the stacked keys' (per-layer keys come layer by
     * layer), the last stage's. */
    for (guint k = 0; k < nkeys; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        if (key->rule->scope != CKPTFS_SCOPE_FIRST)
            continue;
        entry_of[k] = add_entry(v, part, ckptfs_mcore_key_name(key, v->te_spec, false, 0), key);
        add_key_items(v, entry_of[k], key, g_ptr_array_index(cuts, k), 0, 0);
    }
    for (guint k = 0; k < nkeys && !part->per_layer; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        if (key->stacked)
            entry_of[k] = add_entry(v, part, ckptfs_mcore_key_name(key, v->te_spec, false, 0), key);
    }
    g_autoptr(GPtrArray) extras = ckptfs_mcore_extra_state_rules(m);
    for (uint64_t l = 0; l < m->layers; l++)
        add_layer_items(v, part, entry_of, cuts, extras, l, NULL);
    /* Multi-token prediction layers (-o mtp=on): their norms and projection, a layer of their
     * own (HF layer LAYERS + J), their final norm. */
    for (uint64_t j = 0; m->mtp && j < m->mtp_layers; j++) {
        for (int pass = 0; pass < 2; pass++) {
            for (guint k = 0; k < nkeys; k++) {
                const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
                if (key->rule->scope != (pass ? CKPTFS_SCOPE_MTP_OUT : CKPTFS_SCOPE_MTP_IN))
                    continue;
                guint e = add_entry(v, part, ckptfs_mcore_mtp_key_name(key, v->te_spec, j), key);
                add_key_items(v, e, key, g_ptr_array_index(cuts, k), m->layers + j, 0);
            }
            if (pass == 0)
                add_layer_items(v, part, entry_of, cuts, extras, m->layers + j, &j);
        }
    }
    /* A module list (a vision tower's deepstack mergers): each key stacked over the list, as
     * its modules' sharded_state_dict offsets them. */
    for (guint k = 0; k < nkeys; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        if (!key->listed)
            continue;
        entry_of[k] = add_entry(v, part, ckptfs_mcore_key_name(key, v->te_spec, false, 0), key);
        for (uint64_t j = 0; j < key->list_count; j++)
            add_key_items(v, entry_of[k], key, g_ptr_array_index(cuts, k), j, 0);
    }
    for (guint k = 0; k < nkeys; k++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(part->keys, k);
        if (key->rule->scope != CKPTFS_SCOPE_LAST)
            continue;
        entry_of[k] = add_entry(v, part, ckptfs_mcore_key_name(key, v->te_spec, false, 0), key);
        add_key_items(v, entry_of[k], key, g_ptr_array_index(cuts, k), 0, 0);
    }
}

/* Every chunk of every part, then archive sizes and files. */
static bool lay_out_items(McoreView *v, GError **error)
{
    clear_items(v); /* a failed attempt is retried on the next lookup */
    v->entries = g_array_new(FALSE, FALSE, sizeof(Entry));
    v->items = g_array_new(FALSE, FALSE, sizeof(Item));
    for (unsigned i = 0; i < v->nparts; i++)
        add_part_items(v, &v->parts[i]);

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

/* Pieces are pickled one by one (a value tree of a large MoE's .metadata would take GBs). */
static void stream_value(CkptfsPickleStream *ps, CkptfsValue *v)
{
    ckptfs_pickle_stream_value(ps, v);
    ckptfs_value_free(v);
}

/* ChunkStorageMetadata of each chunk of tensor entry ENTRY (ITEMS_OF: item indexes by entry,
 * FIRST_OF: where each entry's run starts). */
static void stream_chunks(CkptfsPickleStream *ps, const McoreView *v, const guint *items_of,
                          const guint *first_of, guint entry)
{
    ckptfs_pickle_stream_list_begin(ps);
    for (guint k = first_of[entry]; k < first_of[entry + 1]; k++) {
        const Item *it = &g_array_index(v->items, Item, items_of[k]);
        uint64_t offsets[5], sizes[5];
        unsigned n = item_box(v, it, offsets, sizes);
        CkptfsValue *chunk = ckptfs_value_container(CKPTFS_VALUE_DICT);
        ckptfs_value_set(chunk, "offsets", torch_size(offsets, n));
        ckptfs_value_set(chunk, "sizes", torch_size(sizes, n));
        stream_value(ps, dataclass(DCP_MODULE, "ChunkStorageMetadata", chunk));
    }
    ckptfs_pickle_stream_list_end(ps);
}

/* MetadataIndex -> _StorageInfo of one item. */
static void stream_storage_entry(CkptfsPickleStream *ps, const McoreView *v, const Item *it)
{
    const Entry *e = &g_array_index(v->entries, Entry, it->entry);
    CkptfsValue *index = ckptfs_value_container(CKPTFS_VALUE_DICT);
    ckptfs_value_set(index, "fqn", ckptfs_value_str(e->fqn));
    if (e->key) {
        uint64_t offsets[5], sizes[5];
        unsigned n = item_box(v, it, offsets, sizes);
        ckptfs_value_set(index, "offset", torch_size(offsets, n));
    }
    ckptfs_value_set(index, "index", ckptfs_value_none());
    stream_value(ps, dataclass(DCP_MODULE, "MetadataIndex", index));
    CkptfsValue *info = ckptfs_value_container(CKPTFS_VALUE_DICT);
    g_autofree char *file = distcp_name(it->file);
    ckptfs_value_set(info, "relative_path", ckptfs_value_str(file));
    ckptfs_value_set(info, "offset", ckptfs_value_int((int64_t)it->offset));
    ckptfs_value_set(info, "length", ckptfs_value_int((int64_t)it->length));
    stream_value(ps, dataclass("torch.distributed.checkpoint.filesystem", "_StorageInfo", info));
}

/* Metadata(state_dict_metadata: every tensor entry with its chunks, in entry order, then every
 * object; planner_data None; storage_data: where each chunk's archive is; storage_meta None). */
static GBytes *build_metadata(const McoreView *v, GError **error)
{
    /* The items of each entry, by entry (a counting sort of item indexes). */
    g_autofree guint *first_of = g_new0(guint, v->entries->len + 1);
    g_autofree guint *items_of = g_new(guint, MAX(v->items->len, 1));
    for (guint i = 0; i < v->items->len; i++)
        first_of[g_array_index(v->items, Item, i).entry + 1]++;
    for (guint e = 0; e < v->entries->len; e++)
        first_of[e + 1] += first_of[e];
    g_autofree guint *fill = g_memdup2(first_of, sizeof(guint) * (v->entries->len + 1));
    for (guint i = 0; i < v->items->len; i++)
        items_of[fill[g_array_index(v->items, Item, i).entry]++] = i;

    CkptfsPickleStream *ps = ckptfs_pickle_stream_new(error);
    ckptfs_pickle_stream_object_begin(ps, DCP_MODULE, "Metadata");
    ckptfs_pickle_stream_dict_begin(ps);
    ckptfs_pickle_stream_str(ps, "state_dict_metadata");
    ckptfs_pickle_stream_dict_begin(ps);
    for (guint i = 0; i < v->entries->len; i++) {
        const Entry *e = &g_array_index(v->entries, Entry, i);
        if (e->key == NULL)
            continue;
        const CkptfsModel *m = e->part->model;
        uint64_t shape[5];
        unsigned n = ckptfs_mcore_kernel_shape(e->key, m, shape);
        if (n == 0)
            n = ckptfs_mcore_key_shape(e->key, e->part->per_layer || e->single ? 0 : m->layers, shape);
        if (e->rows) /* a section: its rows */
            shape[n - e->key->ndim] = e->rows;
        ckptfs_pickle_stream_str(ps, e->fqn);
        ckptfs_pickle_stream_object_begin(ps, DCP_MODULE, "TensorStorageMetadata");
        ckptfs_pickle_stream_dict_begin(ps);
        ckptfs_pickle_stream_str(ps, "properties");
        stream_value(ps, tensor_properties(ckptfs_mcore_key_dtype(e->key, m)));
        ckptfs_pickle_stream_str(ps, "size");
        stream_value(ps, torch_size(shape, n));
        ckptfs_pickle_stream_str(ps, "chunks");
        stream_chunks(ps, v, items_of, first_of, i);
        ckptfs_pickle_stream_dict_end(ps);
        ckptfs_pickle_stream_object_end(ps);
    }
    for (guint i = 0; i < v->items->len; i++) {
        const Entry *e = &g_array_index(v->entries, Entry, g_array_index(v->items, Item, i).entry);
        if (e->key == NULL) {
            ckptfs_pickle_stream_str(ps, e->fqn);
            stream_value(ps, dataclass(DCP_MODULE, "BytesStorageMetadata", NULL));
        }
    }
    ckptfs_pickle_stream_dict_end(ps);
    ckptfs_pickle_stream_str(ps, "planner_data");
    stream_value(ps, ckptfs_value_none());
    ckptfs_pickle_stream_str(ps, "storage_data");
    ckptfs_pickle_stream_dict_begin(ps);
    for (guint i = 0; i < v->items->len; i++)
        stream_storage_entry(ps, v, &g_array_index(v->items, Item, i));
    ckptfs_pickle_stream_dict_end(ps);
    ckptfs_pickle_stream_str(ps, "storage_meta");
    stream_value(ps, ckptfs_value_none());
    ckptfs_pickle_stream_dict_end(ps);
    ckptfs_pickle_stream_object_end(ps);
    return ckptfs_pickle_stream_finish(ps);
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
    GBytes *bytes = build_metadata(owner, error);
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
    for (unsigned i = 0; i < v->nparts; i++)
        if (!ckptfs_mcore_keys_check_shifted(v->parts[i].keys, v->parts[i].model,
                                             ckptfs_source_model_catalog(v->source), error))
            return false;
    if (!lay_out_items(v, error))
        return false;
    ckptfs_tree_add_file(tree, dir, "metadata.json", plan_text, v, metadata_json);
    /* dcp.load reads these with read(2) (pickle.load of .metadata, torch.load of common.pt and
     * of each item), never mapping them. */
    ckptfs_tree_hint(ckptfs_tree_add_file(tree, dir, "common.pt", plan_common, v, NULL), CKPTFS_HINT_STREAMED);
    ckptfs_tree_hint(ckptfs_tree_add_file(tree, dir, ".metadata", plan_metadata, v, NULL), CKPTFS_HINT_STREAMED);
    for (unsigned f = 0; f < v->nfiles; f++) {
        g_autofree char *name = distcp_name(f);
        ckptfs_tree_hint(ckptfs_tree_add_file(tree, dir, name, plan_distcp, v, &g_array_index(v->file_first, guint, f)),
                         CKPTFS_HINT_SCATTERED | CKPTFS_HINT_STREAMED);
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
    v->te_spec = options->spec == CKPTFS_SPEC_TE;
    /* Degrees of dense TP (checked for an MoE model with its experts unsplit, so that the
     * experts' ffn does not limit them) and of expert TP (those dividing the experts' ffn). */
    static const unsigned degrees[] = {1, 2, 4, 8};
    for (size_t i = 0; i < G_N_ELEMENTS(degrees); i++) {
        CkptfsLayout l = {.tp = degrees[i], .pp = 1, .vpp = 1, .etp = model->experts ? 1 : 0};
        /* a VLM's: those that split its vision tower too */
        if (ckptfs_layout_validate(&l, model, NULL) &&
            (!model->arch->vision || ckptfs_megatron_layout_check(model, options, &l, NULL)))
            v->tps[v->ntps++] = degrees[i];
        if (model->experts && model->moe_ffn % degrees[i] == 0)
            v->etps[v->netps++] = degrees[i];
    }
    /* Padded for the largest degree: a loader with another padding reads the rows it shares
     * (Megatron allows that mismatch for the vocabulary, and only for it). */
    v->padded_vocab = ckptfs_padded_vocab(model->vocab, options->vocab_divisible_by,
                                          v->ntps ? v->tps[v->ntps - 1] : 1);
    if (model->arch->vision) { /* the whole tower, replicated over PP, on the first stage */
        ckptfs_model_vision_tower(model, &v->tower);
        v->tower.dtype = model->dtype;
        v->parts[v->nparts++] = (McorePart){&v->tower, ckptfs_mcore_keys(&v->tower, 0, false),
                                            v->tower.arch->megatron_prefix,
                                            v->tower.arch->layer_prefix != NULL};
    }
    /* Megatron stacks layers unless moe_layer_freq is a list (or > 1), which the args say for an
     * MoE model with any dense layer, or linear_attention_freq is a list, which they say for a
     * gated delta-net hybrid (TransformerBlock's non_homogeneous_layers). */
    v->parts[v->nparts++] = (McorePart){model, ckptfs_mcore_keys(model, v->padded_vocab, false),
                                        model->arch->megatron_prefix ? model->arch->megatron_prefix : "",
                                        (model->experts > 0 && ckptfs_model_moe_layers(model) < model->layers) ||
                                            model->arch->hybrid_attention};
    if (model->arch->vision && model->arch->language_first) { /* Gemma 3's: registered before the tower */
        McorePart tower = v->parts[0];
        v->parts[0] = v->parts[1], v->parts[1] = tower;
    }
    ckptfs_tree_own(tree, v, mcore_view_free);

    /* Megatron reads the tracker as text; "release" loads weights only. */
    ckptfs_tree_add_file(tree, dir, "latest_checkpointed_iteration.txt", plan_text, NULL, "release");
    CkptfsNode *release = ckptfs_tree_add_dir(tree, dir, "release");
    ckptfs_tree_set_dir_hooks(tree, release, populate_release, NULL, v);
    return true;
}
