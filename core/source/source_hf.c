/* Hugging Face source: config.json + model.safetensors, or shards listed by
 * model.safetensors.index.json. Every header is parsed and validated here, at open. */
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"
#include "ckptfs/safetensors.h"
#include "ckptfs/source.h"
#include "source_internal.h"

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

static CkptfsStHeader *read_st_header(CkptfsSource *source, const CkptfsSourceFile *file,
                                      GError **error)
{
    const CkptfsSrcFile *sf = ckptfs_srcfiles_get(source->files, file->src);
    if (sf->size < 8) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: %" G_GUINT64_FORMAT " bytes is too short for a safetensors file", sf->path,
                    sf->size);
        return NULL;
    }
    uint8_t prefix[8];
    uint64_t json_len;
    if (!ckptfs_srcfiles_pread(source->files, file->src, prefix, 8, 0, error) ||
        !ckptfs_st_header_length(sf->path, prefix, sf->size, &json_len, error))
        return NULL;
    g_autofree char *json = g_malloc(json_len);
    if (!ckptfs_srcfiles_pread(source->files, file->src, json, json_len, 8, error))
        return NULL;
    return ckptfs_st_parse_header(sf->path, json, json_len, sf->size, error);
}

static bool valid_shard_name(const char *name)
{
    return name[0] != '\0' && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0 && strstr(name, "..") == NULL;
}

/* weight_map of the index: tensor name -> shard file name, and the names in the index's order. */
typedef struct {
    GHashTable *shard_of; /* name (owned) -> shard (borrowed from SHARDS) */
    GHashTable *shards;   /* each shard file name once (a large index names ~60 for 100k tensors) */
    GPtrArray *names;     /* borrowed from SHARD_OF's keys */
} WeightMap;

static void weight_map_free(WeightMap *w)
{
    if (w == NULL)
        return;
    g_ptr_array_unref(w->names);
    g_hash_table_unref(w->shard_of);
    g_hash_table_unref(w->shards);
    g_free(w);
}
G_DEFINE_AUTOPTR_CLEANUP_FUNC(WeightMap, weight_map_free)

/* Read from the checked bytes with a cursor: an index of a large model lists ~100k tensors, and
 * json-glib's tree of them was a fifth of such a mount. */
static WeightMap *read_weight_map(CkptfsSource *source, GError **error)
{
    g_autofree char *path = g_build_filename(source->dir, INDEX_NAME, NULL);
    g_autofree char *data = NULL;
    size_t len = 0;
    if (!ckptfs_read_small_file(path, CKPTFS_MAX_JSON_BYTES, &data, &len, error) ||
        !ckptfs_json_check_strict(path, data, len, error))
        return NULL;
    g_autoptr(WeightMap) w = g_new0(WeightMap, 1);
    w->shard_of = g_hash_table_new_full(ckptfs_name_hash, g_str_equal, g_free, NULL);
    w->shards = g_hash_table_new_full(ckptfs_name_hash, g_str_equal, g_free, NULL);
    w->names = g_ptr_array_new();
    CkptfsJsonCursor c;
    ckptfs_json_cursor_init(&c, data, len);
    ckptfs_json_cursor_enter(&c);
    g_autoptr(GString) key = g_string_new(NULL), shard = g_string_new(NULL);
    bool found = false;
    while (ckptfs_json_cursor_next(&c, key)) {
        if (strcmp(key->str, "weight_map") != 0 || ckptfs_json_cursor_kind(&c) != CKPTFS_JSON_OBJECT) {
            ckptfs_json_cursor_skip(&c);
            continue;
        }
        found = true;
        ckptfs_json_cursor_enter(&c);
        while (ckptfs_json_cursor_next(&c, key)) {
            if (ckptfs_json_cursor_kind(&c) != CKPTFS_JSON_STRING) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: weight_map entry of tensor '%s' is not a file name", path, key->str);
                return NULL;
            }
            ckptfs_json_cursor_string(&c, shard);
            if (!valid_shard_name(shard->str)) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: tensor '%s' is mapped to '%s', which is not a plain file name in the "
                            "source directory",
                            path, key->str, shard->str);
                return NULL;
            }
            char *name = g_strdup(key->str); /* keys are distinct: the strict check refuses repeats */
            char *shard_name = g_hash_table_lookup(w->shards, shard->str);
            if (shard_name == NULL) {
                shard_name = g_strdup(shard->str);
                g_hash_table_add(w->shards, shard_name);
            }
            g_hash_table_insert(w->shard_of, name, shard_name);
            g_ptr_array_add(w->names, name);
        }
    }
    if (!found) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: no \"weight_map\" object", path);
        return NULL;
    }
    if (w->names->len == 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: weight_map is empty", path);
        return NULL;
    }
    return g_steal_pointer(&w);
}

/* Adds the tensors of one safetensors file to the catalog, checking them against the index. */
static bool add_shard(CkptfsSource *source, const char *shard, const WeightMap *weight_map,
                      GHashTable *seen_in, GError **error)
{
    const CkptfsSourceFile *file = ckptfs_source_top_file(source, shard);
    g_autofree char *path = g_build_filename(source->dir, shard, NULL);
    if (file == NULL) {
        const char *problem = ckptfs_path_problem(path);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: %s (named by %s)", path,
                    problem ? problem : "missing", INDEX_NAME);
        return false;
    }
    CkptfsStHeader *header = read_st_header(source, file, error);
    if (header == NULL)
        return false;
    if ((uint64_t)ckptfs_catalog_count(source->catalog) + header->entries->len > CKPTFS_MAX_SOURCE_TENSORS) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: its %u tensors make the source hold "
                    "more than %u tensors (limit)", path, header->entries->len, CKPTFS_MAX_SOURCE_TENSORS);
        ckptfs_st_header_free(header);
        return false;
    }
    bool ok = true;
    for (guint i = 0; i < header->entries->len && ok; i++) {
        const CkptfsStEntry *e = g_ptr_array_index(header->entries, i);
        const char *first = g_hash_table_lookup(seen_in, e->name);
        if (first != NULL) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: tensor '%s' is listed twice (also in %s)", path, e->name, first);
            ok = false;
            break;
        }
        if (weight_map != NULL) {
            const char *where = g_hash_table_lookup(weight_map->shard_of, e->name);
            if (where == NULL || strcmp(where, shard) != 0) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: tensor '%s' is in this file but %s maps it to %s", path, e->name,
                            INDEX_NAME, where ? where : "nothing");
                ok = false;
                break;
            }
        }
        const CkptfsTensor *t = ckptfs_catalog_add_contiguous(source->catalog, e->name, e->dtype, e->ndim,
                                                              e->shape, file->src, header->data_start + e->begin);
        if (t != NULL) /* keyed by the catalog's copy of the name; SHARD outlives SEEN_IN too */
            g_hash_table_insert(seen_in, t->name, (gpointer)shard);
    }
    if (ok)
        g_ptr_array_add(source->weight_files, g_strdup(shard));
    ckptfs_st_header_free(header);
    return ok;
}

static bool open_weights(CkptfsSource *source, GError **error)
{
    if (ckptfs_source_top_file(source, INDEX_NAME) == NULL) {
        if (ckptfs_source_top_file(source, SINGLE_NAME) == NULL) {
            /* Present but unreadable as a file: say what it is rather than "no weights". */
            static const char *const names[] = {INDEX_NAME, SINGLE_NAME};
            for (size_t i = 0; i < G_N_ELEMENTS(names); i++) {
                g_autofree char *path = g_build_filename(source->dir, names[i], NULL);
                const char *problem = ckptfs_path_problem(path);
                if (problem != NULL && strcmp(problem, "missing") != 0) {
                    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: %s", path, problem);
                    return false;
                }
            }
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND,
                        "%s: no safetensors weights (expected %s or %s)", source->dir,
                        SINGLE_NAME, INDEX_NAME);
            return false;
        }
        g_autoptr(GHashTable) seen = g_hash_table_new(ckptfs_name_hash, g_str_equal);
        return add_shard(source, SINGLE_NAME, NULL, seen, error);
    }
    g_autoptr(WeightMap) weight_map = read_weight_map(source, error);
    if (weight_map == NULL)
        return false;
    if (weight_map->names->len > CKPTFS_MAX_SOURCE_TENSORS) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s/%s: weight_map lists %u tensors (limit %u "
                    "per source)", source->dir, INDEX_NAME, weight_map->names->len, CKPTFS_MAX_SOURCE_TENSORS);
        return false;
    }

    /* Shards in file name order, as transformers loads them. */
    g_autoptr(GList) shards = g_hash_table_get_keys(weight_map->shards);
    shards = g_list_sort(shards, (GCompareFunc)strcmp);

    g_autoptr(GHashTable) seen = g_hash_table_new(ckptfs_name_hash, g_str_equal);
    for (GList *s = shards; s; s = s->next)
        if (!add_shard(source, s->data, weight_map, seen, error))
            return false;
    for (guint i = 0; i < weight_map->names->len; i++) {
        const char *name = g_ptr_array_index(weight_map->names, i);
        if (ckptfs_catalog_find(source->catalog, name) == NULL) {
            g_autofree char *path = g_build_filename(source->dir, g_hash_table_lookup(weight_map->shard_of, name), NULL);
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: tensor '%s' is missing (%s maps it to this file)", path, name, INDEX_NAME);
            return false;
        }
    }
    return true;
}

static void read_config(CkptfsSource *source)
{
    g_autofree char *path = g_build_filename(source->dir, "config.json", NULL);
    if (ckptfs_source_top_file(source, "config.json") == NULL) {
        /* Present but not a regular file: say what it is rather than "missing". */
        const char *problem = ckptfs_path_problem(path);
        source->config_problem = problem && strcmp(problem, "missing") != 0
                                     ? g_strdup_printf("%s: %s", path, problem)
                                     : g_strdup("config.json is missing");
        return;
    }
    GError *json_error = NULL;
    source->config = ckptfs_json_load_object(path, &json_error);
    if (source->config == NULL) {
        source->config_problem = g_strdup(json_error->message);
        g_error_free(json_error);
    }
}

/* Every top-level regular file of an HF checkpoint (symlinks followed, as in a Hugging Face
 * cache snapshot) is part of it. */
static bool open_hf(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    (void)options;
    if (!ckptfs_source_add_top_files(source, source->dir, error) || !open_weights(source, error))
        return false;
    read_config(source);
    if (source->config == NULL)
        g_ptr_array_add(source->warnings,
                        g_strdup_printf("%s; hf/ works, model-specific views need it",
                                        source->config_problem));
    return true;
}

static bool probe_hf(const char *dir, const CkptfsOptions *options)
{
    (void)dir, (void)options;
    return true; /* the last format tried: anything else is read as Hugging Face */
}

static char *describe_hf(const CkptfsSource *source)
{
    unsigned n = source->weight_files->len;
    return g_strdup_printf("%u weight file%s%s", n, n == 1 ? "" : "s",
                           ckptfs_source_top_file(source, INDEX_NAME) ? ", with index" : "");
}

const CkptfsSourceFormat ckptfs_format_hf = {"huggingface-safetensors", probe_hf, open_hf, describe_hf};
