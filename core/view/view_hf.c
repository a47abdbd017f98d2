/* hf/: the source's files passed through byte-identical, or the weights re-sharded into new
 * safetensors files the way Hugging Face's save_pretrained writes them. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/safetensors.h"
#include "ckptfs/views.h"

#define INDEX_NAME "model.safetensors.index.json"

typedef struct {
    const CkptfsCatalog *catalog;
    unsigned nshards;
    GPtrArray **shard_tensors; /* per shard: const CkptfsTensor*, in source order */
    char **shard_names;
} HfReshard;

static void hf_reshard_free(gpointer data)
{
    HfReshard *r = data;
    for (unsigned s = 0; s < r->nshards; s++) {
        g_ptr_array_unref(r->shard_tensors[s]);
        g_free(r->shard_names[s]);
    }
    g_free(r->shard_tensors);
    g_free(r->shard_names);
    g_free(r);
}

unsigned ckptfs_hf_assign_shards(const CkptfsCatalog *catalog, uint64_t max_shard_size,
                                 unsigned *shard_of)
{
    unsigned n = ckptfs_catalog_count(catalog);
    unsigned shard = 0;
    uint64_t used = 0;
    bool empty = true;
    for (unsigned i = 0; i < n; i++) {
        uint64_t size = ckptfs_catalog_at(catalog, i)->nbytes;
        if (!empty && (used + size > max_shard_size || used + size < used)) {
            shard++;
            used = 0;
            empty = true;
        }
        shard_of[i] = shard;
        used += size;
        empty = false;
    }
    return n ? shard + 1 : 0;
}

static CkptfsPlan *plan_passthrough(gpointer owner, gconstpointer key, GError **error)
{
    (void)owner;
    (void)error;
    const CkptfsSourceFile *file = key;
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, file->src, 0, file->size);
    return ckptfs_plan_builder_finish(b);
}

static CkptfsPlan *plan_shard(gpointer owner, gconstpointer key, GError **error)
{
    (void)error;
    const HfReshard *r = owner;
    const GPtrArray *tensors = r->shard_tensors[GPOINTER_TO_UINT(key)];
    CkptfsStEntry *entries = g_new0(CkptfsStEntry, tensors->len ? tensors->len : 1);
    CkptfsStEntry **entry_ptrs = g_new0(CkptfsStEntry *, tensors->len ? tensors->len : 1);
    uint64_t offset = 0;
    for (guint i = 0; i < tensors->len; i++) {
        const CkptfsTensor *t = g_ptr_array_index(tensors, i);
        entries[i].name = t->name;
        entries[i].dtype = t->dtype;
        entries[i].ndim = t->ndim;
        memcpy(entries[i].shape, t->shape, sizeof t->shape);
        entries[i].begin = offset;
        entries[i].end = offset + t->nbytes;
        offset += t->nbytes;
        entry_ptrs[i] = &entries[i];
    }
    static const char *const metadata[] = {"format", "pt"};
    GBytes *header = ckptfs_st_build_header(entry_ptrs, tensors->len, metadata, 1);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    gsize header_len;
    const void *header_data = g_bytes_get_data(header, &header_len);
    ckptfs_plan_add_literal(b, header_data, header_len);
    for (guint i = 0; i < tensors->len; i++)
        ckptfs_tensor_emit(g_ptr_array_index(tensors, i), b);
    g_bytes_unref(header);
    g_free(entry_ptrs);
    g_free(entries);
    return ckptfs_plan_builder_finish(b);
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii: non-ASCII as \uXXXX). */
static void append_json_string(GString *out, const char *s)
{
    g_string_append_c(out, '"');
    for (const char *p = s; *p; p = g_utf8_next_char(p)) {
        gunichar c = g_utf8_get_char(p);
        switch (c) {
        case '"': g_string_append(out, "\\\""); break;
        case '\\': g_string_append(out, "\\\\"); break;
        case '\n': g_string_append(out, "\\n"); break;
        case '\r': g_string_append(out, "\\r"); break;
        case '\t': g_string_append(out, "\\t"); break;
        case '\b': g_string_append(out, "\\b"); break;
        case '\f': g_string_append(out, "\\f"); break;
        default:
            if (c < 0x20 || (c >= 0x7f && c < 0x10000)) {
                g_string_append_printf(out, "\\u%04x", c);
            } else if (c >= 0x10000) {
                c -= 0x10000;
                g_string_append_printf(out, "\\u%04x\\u%04x", 0xd800 + (c >> 10), 0xdc00 + (c & 0x3ff));
            } else {
                g_string_append_c(out, (char)c);
            }
        }
    }
    g_string_append_c(out, '"');
}

static gint tensor_name_cmp(gconstpointer a, gconstpointer b)
{
    return strcmp((*(const CkptfsTensor *const *)a)->name, (*(const CkptfsTensor *const *)b)->name);
}

/* model.safetensors.index.json as transformers writes it: json.dumps(indent=2, sort_keys=True). */
static CkptfsPlan *plan_index(gpointer owner, gconstpointer key, GError **error)
{
    (void)key;
    (void)error;
    const HfReshard *r = owner;
    const CkptfsCatalog *catalog = r->catalog;
    g_autoptr(GPtrArray) sorted = g_ptr_array_new();
    g_autoptr(GHashTable) shard_name_of = g_hash_table_new(g_direct_hash, g_direct_equal);
    for (unsigned s = 0; s < r->nshards; s++)
        for (guint i = 0; i < r->shard_tensors[s]->len; i++) {
            gpointer t = g_ptr_array_index(r->shard_tensors[s], i);
            g_ptr_array_add(sorted, t);
            g_hash_table_insert(shard_name_of, t, r->shard_names[s]);
        }
    g_ptr_array_sort(sorted, tensor_name_cmp);
    GString *out = g_string_new(NULL);
    g_string_append_printf(out, "{\n  \"metadata\": {\n    \"total_size\": %" G_GUINT64_FORMAT
                                "\n  },\n  \"weight_map\": {",
                           ckptfs_catalog_total_bytes(catalog));
    for (guint i = 0; i < sorted->len; i++) {
        const CkptfsTensor *t = g_ptr_array_index(sorted, i);
        g_string_append(out, i ? ",\n    " : "\n    ");
        append_json_string(out, t->name);
        g_string_append(out, ": ");
        append_json_string(out, g_hash_table_lookup(shard_name_of, t));
    }
    g_string_append(out, sorted->len ? "\n  }\n}\n" : "}\n}\n");
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, out->str, out->len);
    g_string_free(out, TRUE);
    return ckptfs_plan_builder_finish(b);
}

static bool is_weight_file(const CkptfsSource *source, const char *name)
{
    if (strcmp(name, INDEX_NAME) == 0) /* only a source read from its index lists one */
        return true;
    for (guint i = 0; i < source->weight_files->len; i++)
        if (strcmp(g_ptr_array_index(source->weight_files, i), name) == 0)
            return true;
    return false;
}

static bool is_generated_name(const HfReshard *r, const char *name)
{
    if (r->nshards > 1 && strcmp(name, INDEX_NAME) == 0)
        return true;
    for (unsigned s = 0; s < r->nshards; s++)
        if (strcmp(r->shard_names[s], name) == 0)
            return true;
    return false;
}

/* The shards of CATALOG; one is named SINGLE_NAME. */
static HfReshard *hf_reshard_new(const CkptfsCatalog *catalog, uint64_t max_shard_size,
                                 const char *single_name)
{
    unsigned n = ckptfs_catalog_count(catalog);
    g_autofree unsigned *shard_of = g_new0(unsigned, n ? n : 1);
    HfReshard *r = g_new0(HfReshard, 1);
    r->catalog = catalog;
    r->nshards = ckptfs_hf_assign_shards(catalog, max_shard_size, shard_of);
    r->shard_tensors = g_new0(GPtrArray *, r->nshards ? r->nshards : 1);
    r->shard_names = g_new0(char *, r->nshards ? r->nshards : 1);
    for (unsigned s = 0; s < r->nshards; s++) {
        r->shard_tensors[s] = g_ptr_array_new();
        r->shard_names[s] = r->nshards == 1
                                ? g_strdup(single_name)
                                : g_strdup_printf("model-%05u-of-%05u.safetensors", s + 1, r->nshards);
    }
    for (unsigned i = 0; i < n; i++)
        g_ptr_array_add(r->shard_tensors[shard_of[i]], (gpointer)ckptfs_catalog_at(catalog, i));
    return r;
}

/* A JSON object as a file (pretty, two-space indent). */
static CkptfsPlan *plan_json(gpointer owner, gconstpointer key, GError **error)
{
    (void)key;
    (void)error;
    JsonObject *object = owner;
    g_autoptr(JsonNode) root = json_node_new(JSON_NODE_OBJECT);
    json_node_set_object(root, object);
    g_autoptr(JsonGenerator) gen = json_generator_new();
    json_generator_set_pretty(gen, TRUE);
    json_generator_set_indent(gen, 2);
    json_generator_set_root(gen, root);
    gsize len = 0;
    g_autofree char *text = json_generator_to_data(gen, &len);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, text, len);
    ckptfs_plan_add_literal(b, "\n", 1);
    return ckptfs_plan_builder_finish(b);
}

/* Hugging Face's default max_shard_size ("5GB") for sources whose weights are not safetensors. */
#define HF_DEFAULT_SHARD_SIZE 5000000000ull

bool ckptfs_hf_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                          const CkptfsOptions *options, GError **error)
{
    (void)error;
    HfReshard *r = NULL;
    /* Weights not held in safetensors files of the source (a Megatron checkpoint), or served in
     * another element type than stored: hf/ makes them. */
    bool foreign = source->weight_files->len == 0 || source->converted > 0;
    if (options->hf_shard_size > 0 || foreign) {
        r = hf_reshard_new(source->catalog, options->hf_shard_size ? options->hf_shard_size : HF_DEFAULT_SHARD_SIZE,
                           "model.safetensors");
        ckptfs_tree_own(tree, r, hf_reshard_free);
    }
    /* A foreign source's own files are not Hugging Face files: hf/ shows a config.json made
     * from its model (unless one was given) and the files given with it (-o hf_extra). */
    bool own_config = source->config != NULL &&
                      (source->config_changed || (foreign && ckptfs_source_top_file(source, "config.json") == NULL));
    if (own_config)
        ckptfs_tree_add_file(tree, dir, "config.json", plan_json, source->config, NULL);
    /* Non-weight files (config, tokenizer, ...) always pass through; when re-sharding, the old
     * weight files and anything named like a new one are replaced. */
    for (guint i = 0; i < source->top_files->len; i++) {
        const CkptfsSourceFile *f = g_ptr_array_index(source->top_files, i);
        if (own_config && strcmp(f->name, "config.json") == 0)
            continue;
        if (r == NULL || (!is_weight_file(source, f->name) && !is_generated_name(r, f->name)))
            ckptfs_tree_add_file(tree, dir, f->name, plan_passthrough, NULL, f);
    }
    /* A LoRA run's adapter, as PEFT saves one (verl's merger writes it there too). */
    if (source->adapter != NULL) {
        CkptfsNode *lora = ckptfs_tree_add_dir(tree, dir, "lora_adapter");
        HfReshard *a = hf_reshard_new(source->adapter, UINT64_MAX, "adapter_model.safetensors");
        ckptfs_tree_own(tree, a, hf_reshard_free);
        ckptfs_tree_add_file(tree, lora, "adapter_config.json", plan_json, source->adapter_config, NULL);
        ckptfs_tree_add_file(tree, lora, a->shard_names[0], plan_shard, a, GUINT_TO_POINTER(0));
    }
    if (r == NULL)
        return true;
    for (unsigned s = 0; s < r->nshards; s++)
        ckptfs_tree_add_file(tree, dir, r->shard_names[s], plan_shard, r, GUINT_TO_POINTER(s));
    if (r->nshards > 1)
        ckptfs_tree_add_file(tree, dir, INDEX_NAME, plan_index, r, NULL);
    return true;
}
