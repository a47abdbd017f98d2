#include "ckptfs/safetensors.h"

#include <json-glib/json-glib.h>
#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
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
    return ckptfs_dims_product(shape, ndim, numel);
}

uint64_t ckptfs_st_count_tensors(const char *json, size_t len)
{
    /* Keys are the strings followed by ':' one level into the top object; "__metadata__" is not
     * a tensor. Any bytes at all are scanned safely: this runs before the JSON is validated. */
    uint64_t keys = 0;
    unsigned depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '"') {
            size_t start = i++;
            while (i < len && json[i] != '"') {
                /* to the next quote at once, unless an escape comes first */
                const char *quote = memchr(json + i, '"', len - i);
                size_t to = quote ? (size_t)(quote - json) : len;
                const char *escape = memchr(json + i, '\\', to - i);
                if (escape == NULL) {
                    i = to;
                    break;
                }
                i = (size_t)(escape - json) + 2;
            }
            size_t j = i + 1;
            while (j < len && (json[j] == ' ' || json[j] == '\t' || json[j] == '\n' || json[j] == '\r'))
                j++;
            if (depth == 1 && j < len && json[j] == ':' &&
                !(i - start == 13 && memcmp(json + start, "\"__metadata__", 13) == 0))
                keys++;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if ((c == '}' || c == ']') && depth > 0) {
            depth--;
        }
    }
    return keys;
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

/* A JSON integer >= 0 at the cursor into *OUT: NULL, or why it is not one, for "shape[1] <why>"
 * (a new string). Integers beyond 64 bits never get here: the strict JSON pass refuses them. */
static char *cursor_u64(CkptfsJsonCursor *c, uint64_t *out)
{
    if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_NUMBER) {
        ckptfs_json_cursor_skip(c);
        return g_strdup("is not a number");
    }
    bool is_int;
    int64_t i;
    double d;
    ckptfs_json_cursor_number(c, &is_int, &i, &d);
    if (!is_int)
        return g_strdup_printf("is not an integer (%g)", d);
    if (i < 0)
        return g_strdup_printf("%" G_GINT64_FORMAT " is negative", (gint64)i);
    *out = (uint64_t)i;
    return NULL;
}

/* The integers of the array at the cursor into OUT (at most MAX; *N their number, counted past
 * MAX): NULL, or why one is not a non-negative integer, prefixed "[k] ". */
static char *cursor_u64_array(CkptfsJsonCursor *c, uint64_t *out, unsigned max, unsigned *n)
{
    *n = 0;
    ckptfs_json_cursor_enter(c);
    char *why = NULL;
    while (ckptfs_json_cursor_next(c, NULL)) {
        uint64_t v = 0;
        char *bad = why ? NULL : cursor_u64(c, &v);
        if (why) /* the rest only counted */
            ckptfs_json_cursor_skip(c);
        if (bad) {
            why = g_strdup_printf("[%u] %s", *n, bad);
            g_free(bad);
        }
        if (*n < max)
            out[*n] = v;
        (*n)++;
    }
    return why;
}

/* A tensor entry (the value at the cursor). */
static bool parse_entry(const char *file_name, const char *name, CkptfsJsonCursor *c,
                        CkptfsStEntry *entry, GError **error)
{
#define BAD(...)                                                                              \
    do {                                                                                      \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: tensor '%s': %s",          \
                    file_name, name, why_);                                                   \
        return false;                                                                         \
    } while (0)

    if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_OBJECT)
        BAD("entry is not a JSON object");
    g_autoptr(GString) key = g_string_new(NULL), dtype_name = g_string_new(NULL);
    bool have_dtype = false, have_shape = false, shape_array = false, offs_array = false;
    unsigned ndim = 0, noffs = 0;
    uint64_t offs[2] = {0, 0};
    g_autofree char *shape_why = NULL, *offs_why = NULL;
    ckptfs_json_cursor_enter(c);
    while (ckptfs_json_cursor_next(c, key)) {
        CkptfsJsonKind kind = ckptfs_json_cursor_kind(c);
        if (strcmp(key->str, "dtype") == 0 && kind == CKPTFS_JSON_STRING) {
            ckptfs_json_cursor_string(c, dtype_name);
            have_dtype = true;
        } else if (strcmp(key->str, "shape") == 0) {
            have_shape = true;
            shape_array = kind == CKPTFS_JSON_ARRAY;
            if (shape_array)
                shape_why = cursor_u64_array(c, entry->shape, CKPTFS_MAX_DIMS, &ndim);
            else
                ckptfs_json_cursor_skip(c);
        } else if (strcmp(key->str, "data_offsets") == 0) {
            offs_array = kind == CKPTFS_JSON_ARRAY;
            if (offs_array)
                offs_why = cursor_u64_array(c, offs, 2, &noffs);
            else
                ckptfs_json_cursor_skip(c);
        } else {
            ckptfs_json_cursor_skip(c); /* other members are not read (nor were they by json-glib) */
        }
    }
    if (!have_dtype)
        BAD("missing or non-string \"dtype\"");
    entry->dtype = ckptfs_dtype_from_safetensors(dtype_name->str);
    if (entry->dtype == CKPTFS_DTYPE_INVALID)
        BAD("unknown dtype \"%s\"", dtype_name->str);
    if (!have_shape || !shape_array)
        BAD("missing or non-array \"shape\"");
    if (ndim > CKPTFS_MAX_DIMS)
        BAD("%u dimensions (at most %d supported)", ndim, CKPTFS_MAX_DIMS);
    entry->ndim = ndim;
    if (shape_why)
        BAD("shape%s", shape_why);
    if (!offs_array || noffs != 2)
        BAD("missing \"data_offsets\" or not a [begin, end] pair");
    if (offs_why)
        BAD("data_offsets%s", offs_why);
    entry->begin = offs[0];
    entry->end = offs[1];
    if (entry->end < entry->begin)
        BAD("data_offsets [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] end before begin",
            entry->begin, entry->end);

    uint64_t numel, nbytes;
    if (!ckptfs_dims_product(entry->shape, ndim, &numel)) {
        g_autofree char *dims = ckptfs_dims_text(entry->shape, ndim);
        BAD("shape %s: its element count overflows 64 bits", dims);
    }
    if (!ckptfs_mul_u64(numel, ckptfs_dtype_size(entry->dtype), &nbytes))
        BAD("%" G_GUINT64_FORMAT " %s elements of %zu bytes: their size overflows 64 bits", numel,
            dtype_name->str, ckptfs_dtype_size(entry->dtype));
    if (entry->end - entry->begin != nbytes)
        BAD("shape and dtype %s need %" G_GUINT64_FORMAT " bytes but data_offsets [%" G_GUINT64_FORMAT
            ", %" G_GUINT64_FORMAT "] hold %" G_GUINT64_FORMAT,
            dtype_name->str, nbytes, entry->begin, entry->end, entry->end - entry->begin);
    return true;
#undef BAD
}

/* "__metadata__" (the value at the cursor): string keys to string values. */
static bool parse_metadata(const char *file_name, CkptfsJsonCursor *c, GPtrArray *out, GError **error)
{
    if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_OBJECT) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: \"__metadata__\" is not a JSON object", file_name);
        return false;
    }
    g_autoptr(GString) key = g_string_new(NULL), value = g_string_new(NULL);
    ckptfs_json_cursor_enter(c);
    while (ckptfs_json_cursor_next(c, key)) {
        if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_STRING) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: \"__metadata__\" value of '%s' is not a string", file_name, key->str);
            return false;
        }
        ckptfs_json_cursor_string(c, value);
        g_ptr_array_add(out, g_strdup(key->str));
        g_ptr_array_add(out, g_strdup(value->str));
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
    /* Counted before parsing: json-glib's tree costs ~1.5 KB a tensor. */
    uint64_t tensors = ckptfs_st_count_tensors(json, json_len);
    if (tensors > CKPTFS_MAX_HEADER_TENSORS) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: safetensors header lists %" G_GUINT64_FORMAT " tensors (limit %u per file)",
                    file_name, tensors, CKPTFS_MAX_HEADER_TENSORS);
        return NULL;
    }
    g_autofree char *what = g_strdup_printf("%s: safetensors header", file_name);
    if (!ckptfs_json_check_strict(what, json, json_len, error))
        return NULL;

    CkptfsStHeader *header = g_new0(CkptfsStHeader, 1);
    header->data_start = data_start;
    header->entries = g_ptr_array_new_with_free_func(entry_free);
    header->metadata = g_ptr_array_new_with_free_func(g_free);

    /* Read straight from the checked bytes: no JSON tree (it was most of a large mount). */
    CkptfsJsonCursor c;
    ckptfs_json_cursor_init(&c, json, json_len);
    ckptfs_json_cursor_enter(&c);
    g_autoptr(GString) name = g_string_new(NULL);
    while (ckptfs_json_cursor_next(&c, name)) {
        if (strcmp(name->str, "__metadata__") == 0) {
            if (!parse_metadata(file_name, &c, header->metadata, error))
                goto fail;
            continue;
        }
        CkptfsStEntry *entry = g_new0(CkptfsStEntry, 1);
        entry->name = g_strdup(name->str);
        g_ptr_array_add(header->entries, entry);
        if (!parse_entry(file_name, entry->name, &c, entry, error))
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
