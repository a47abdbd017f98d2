#include "ckptfs/safetensors.h"

#include <json-glib/json-glib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/units.h"

static void entry_free(gpointer data)
{
    CkptfsStEntry *e = data;
    g_free(e->name);
    g_free(e);
}

void ckptfs_st_header_free(CkptfsStHeader *header)
{
    if (header == NULL)
        return;
    g_ptr_array_unref(header->entries);
    g_ptr_array_unref(header->metadata);
    g_free(header);
}

bool ckptfs_shape_numel(const uint64_t *shape, unsigned ndim, uint64_t *numel)
{
    uint64_t n = 1;
    for (unsigned i = 0; i < ndim; i++)
        if (!ckptfs_mul_u64(n, shape[i], &n))
            return false;
    *numel = n;
    return true;
}

bool ckptfs_st_header_length(const char *file_name, const uint8_t prefix[8], uint64_t file_size,
                             uint64_t *json_len, GError **error)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | prefix[i];
    if (n > CKPTFS_SAFETENSORS_MAX_HEADER) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header length %" G_GUINT64_FORMAT
                    " is absurd (limit %u bytes); not a safetensors file?",
                    file_name, n, CKPTFS_SAFETENSORS_MAX_HEADER);
        return false;
    }
    if (file_size < 8 || n > file_size - 8) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header length %" G_GUINT64_FORMAT
                    " is larger than the file (%" G_GUINT64_FORMAT " bytes); truncated?",
                    file_name, n, file_size);
        return false;
    }
    if (n < 2) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header length %" G_GUINT64_FORMAT " is too small",
                    file_name, n);
        return false;
    }
    *json_len = n;
    return true;
}

/* A JSON integer >= 0 (json-glib parses anything too large for int64 as a double). */
static bool node_get_u64(JsonNode *node, uint64_t *out)
{
    if (node == NULL || JSON_NODE_TYPE(node) != JSON_NODE_VALUE ||
        json_node_get_value_type(node) != G_TYPE_INT64)
        return false;
    gint64 v = json_node_get_int(node);
    if (v < 0)
        return false;
    *out = (uint64_t)v;
    return true;
}

static bool parse_entry(const char *file_name, const char *name, JsonNode *node,
                        CkptfsStEntry *entry, GError **error)
{
#define BAD(...)                                                                              \
    do {                                                                                      \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: tensor '%s': %s",          \
                    file_name, name, why_);                                                   \
        return false;                                                                         \
    } while (0)

    if (!JSON_NODE_HOLDS_OBJECT(node))
        BAD("entry is not a JSON object");
    JsonObject *obj = json_node_get_object(node);

    JsonNode *dtype_node = json_object_get_member(obj, "dtype");
    if (dtype_node == NULL || !JSON_NODE_HOLDS_VALUE(dtype_node) ||
        json_node_get_value_type(dtype_node) != G_TYPE_STRING)
        BAD("missing or non-string \"dtype\"");
    const char *dtype_name = json_node_get_string(dtype_node);
    entry->dtype = ckptfs_dtype_from_safetensors(dtype_name);
    if (entry->dtype == CKPTFS_DTYPE_INVALID)
        BAD("unknown dtype \"%s\"", dtype_name);

    JsonNode *shape_node = json_object_get_member(obj, "shape");
    if (shape_node == NULL || !JSON_NODE_HOLDS_ARRAY(shape_node))
        BAD("missing or non-array \"shape\"");
    JsonArray *shape = json_node_get_array(shape_node);
    guint ndim = json_array_get_length(shape);
    if (ndim > CKPTFS_MAX_DIMS)
        BAD("%u dimensions (at most %d supported)", ndim, CKPTFS_MAX_DIMS);
    entry->ndim = ndim;
    for (guint i = 0; i < ndim; i++)
        if (!node_get_u64(json_array_get_element(shape, i), &entry->shape[i]))
            BAD("shape[%u] is not a non-negative integer", i);

    JsonNode *offs_node = json_object_get_member(obj, "data_offsets");
    if (offs_node == NULL || !JSON_NODE_HOLDS_ARRAY(offs_node) ||
        json_array_get_length(json_node_get_array(offs_node)) != 2)
        BAD("missing \"data_offsets\" or not a [begin, end] pair");
    JsonArray *offs = json_node_get_array(offs_node);
    if (!node_get_u64(json_array_get_element(offs, 0), &entry->begin) ||
        !node_get_u64(json_array_get_element(offs, 1), &entry->end))
        BAD("data_offsets are not non-negative integers");
    if (entry->end < entry->begin)
        BAD("data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] end before begin",
            entry->begin, entry->end);

    uint64_t numel, nbytes;
    if (!ckptfs_shape_numel(entry->shape, ndim, &numel) ||
        !ckptfs_mul_u64(numel, ckptfs_dtype_size(entry->dtype), &nbytes))
        BAD("shape is too large");
    if (entry->end - entry->begin != nbytes)
        BAD("shape and dtype %s need %" G_GUINT64_FORMAT " bytes but data_offsets [%" G_GUINT64_FORMAT
            ", %" G_GUINT64_FORMAT "] hold %" G_GUINT64_FORMAT,
            dtype_name, nbytes, entry->begin, entry->end, entry->end - entry->begin);
    return true;
#undef BAD
}

static bool parse_metadata(const char *file_name, JsonNode *node, GPtrArray *out, GError **error)
{
    if (!JSON_NODE_HOLDS_OBJECT(node)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: \"__metadata__\" is not a JSON object", file_name);
        return false;
    }
    JsonObject *obj = json_node_get_object(node);
    g_autoptr(GList) members = json_object_get_members(obj);
    for (GList *m = members; m; m = m->next) {
        JsonNode *v = json_object_get_member(obj, m->data);
        if (!JSON_NODE_HOLDS_VALUE(v) || json_node_get_value_type(v) != G_TYPE_STRING) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: \"__metadata__\" value of '%s' is not a string", file_name,
                        (const char *)m->data);
            return false;
        }
        g_ptr_array_add(out, g_strdup(m->data));
        g_ptr_array_add(out, g_strdup(json_node_get_string(v)));
    }
    return true;
}

static gint entry_cmp_begin(gconstpointer a, gconstpointer b)
{
    const CkptfsStEntry *x = *(CkptfsStEntry *const *)a, *y = *(CkptfsStEntry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) /* empty tensors first at a shared offset */
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

CkptfsStHeader *ckptfs_st_parse_header(const char *file_name, const char *json, size_t json_len,
                                       uint64_t file_size, GError **error)
{
    uint64_t data_start = 8 + (uint64_t)json_len;
    if (data_start > file_size) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header runs past the end of the file", file_name);
        return NULL;
    }
    if (memchr(json, '\0', json_len) != NULL) {
        /* Writers pad with spaces; a NUL means this is not a safetensors header. */
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header contains a NUL byte; not JSON", file_name);
        return NULL;
    }
    g_autofree char *what = g_strdup_printf("%s: safetensors header", file_name);
    if (!ckptfs_json_check_strict(what, json, json_len, error))
        return NULL;
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    GError *json_error = NULL;
    if (!json_parser_load_from_data(parser, json, (gssize)json_len, &json_error)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header is not valid JSON: %s", file_name,
                    json_error->message);
        g_error_free(json_error);
        return NULL;
    }
    JsonNode *root = json_parser_get_root(parser);
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header is not a JSON object", file_name);
        return NULL;
    }

    CkptfsStHeader *header = g_new0(CkptfsStHeader, 1);
    header->data_start = data_start;
    header->entries = g_ptr_array_new_with_free_func(entry_free);
    header->metadata = g_ptr_array_new_with_free_func(g_free);

    JsonObject *obj = json_node_get_object(root);
    g_autoptr(GList) members = json_object_get_members(obj);
    for (GList *m = members; m; m = m->next) {
        const char *name = m->data;
        JsonNode *node = json_object_get_member(obj, name);
        if (strcmp(name, "__metadata__") == 0) {
            if (!parse_metadata(file_name, node, header->metadata, error))
                goto fail;
            continue;
        }
        CkptfsStEntry *entry = g_new0(CkptfsStEntry, 1);
        entry->name = g_strdup(name);
        g_ptr_array_add(header->entries, entry);
        if (!parse_entry(file_name, name, node, entry, error))
            goto fail;
    }

    /* The data area must be covered exactly, as the safetensors library requires. */
    g_ptr_array_sort(header->entries, entry_cmp_begin);
    uint64_t data_size = file_size - data_start;
    uint64_t expect = 0;
    for (guint i = 0; i < header->entries->len; i++) {
        CkptfsStEntry *e = g_ptr_array_index(header->entries, i);
        if (e->end > data_size) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: tensor '%s': data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        "] run past the end of the file (data area is %" G_GUINT64_FORMAT " bytes)",
                        file_name, e->name, e->begin, e->end, data_size);
            goto fail;
        }
        if (e->begin < expect) {
            CkptfsStEntry *prev = g_ptr_array_index(header->entries, i - 1);
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: tensor '%s': data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        "] overlap tensor '%s'",
                        file_name, e->name, e->begin, e->end, prev->name);
            goto fail;
        }
        if (e->begin > expect) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: tensor '%s': data_offsets leave a hole of %" G_GUINT64_FORMAT
                        " bytes before it",
                        file_name, e->name, e->begin - expect);
            goto fail;
        }
        expect = e->end;
    }
    if (expect != data_size) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: %" G_GUINT64_FORMAT " bytes after the last tensor are not described by the header",
                    file_name, data_size - expect);
        goto fail;
    }
    return header;
fail:
    ckptfs_st_header_free(header);
    return NULL;
}

GBytes *ckptfs_st_build_header(CkptfsStEntry *const *entries, unsigned n_entries,
                               const char *const *metadata_kv, unsigned n_metadata)
{
    g_autoptr(JsonBuilder) jb = json_builder_new_immutable();
    json_builder_begin_object(jb);
    if (n_metadata > 0) {
        json_builder_set_member_name(jb, "__metadata__");
        json_builder_begin_object(jb);
        for (unsigned i = 0; i < n_metadata; i++) {
            json_builder_set_member_name(jb, metadata_kv[2 * i]);
            json_builder_add_string_value(jb, metadata_kv[2 * i + 1]);
        }
        json_builder_end_object(jb);
    }
    for (unsigned i = 0; i < n_entries; i++) {
        const CkptfsStEntry *e = entries[i];
        json_builder_set_member_name(jb, e->name);
        json_builder_begin_object(jb);
        json_builder_set_member_name(jb, "dtype");
        json_builder_add_string_value(jb, ckptfs_dtype_safetensors_name(e->dtype));
        json_builder_set_member_name(jb, "shape");
        json_builder_begin_array(jb);
        for (unsigned d = 0; d < e->ndim; d++)
            json_builder_add_int_value(jb, (gint64)e->shape[d]);
        json_builder_end_array(jb);
        json_builder_set_member_name(jb, "data_offsets");
        json_builder_begin_array(jb);
        json_builder_add_int_value(jb, (gint64)e->begin);
        json_builder_add_int_value(jb, (gint64)e->end);
        json_builder_end_array(jb);
        json_builder_end_object(jb);
    }
    json_builder_end_object(jb);

    g_autoptr(JsonNode) root = json_builder_get_root(jb);
    g_autoptr(JsonGenerator) gen = json_generator_new();
    json_generator_set_root(gen, root);
    gsize json_len = 0;
    g_autofree char *json = json_generator_to_data(gen, &json_len);

    size_t padded = (json_len + 7) & ~(size_t)7;
    uint8_t *out = g_malloc(8 + padded);
    uint64_t n = padded;
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(n >> (8 * i));
    memcpy(out + 8, json, json_len);
    memset(out + 8 + json_len, ' ', padded - json_len);
    return g_bytes_new_take(out, 8 + padded);
}
