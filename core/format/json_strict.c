/* Strict JSON (RFC 8259) for every JSON a source holds: safetensors headers, config.json,
 * model.safetensors.index.json, metadata.json. json-glib 1.6 accepts single quotes, comments,
 * hex numbers, leading zeros, raw control characters and text after the value, which Python's
 * json and the safetensors library refuse; a \u0000 would cut a name short; it keeps the last
 * of repeated keys, misreads integers past 64 bits as other numbers and recurses once per
 * nesting level (100000 levels overflow the stack). This pass runs first, in one pass over the
 * bytes and at most CKPTFS_MAX_JSON_DEPTH levels of recursion, so json-glib only ever sees
 * what Python's json reads the same way. */
#include "ckptfs/json_strict.h"

#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"

typedef struct {
    const char *what;
    const unsigned char *p, *start, *end;
    GError **error;
} Scan;

static ptrdiff_t offset_of(const Scan *s, const unsigned char *at)
{
    return (const char *)at - (const char *)s->start;
}

static bool bad(Scan *s, const char *why)
{
    g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not valid JSON at byte %td: %s",
                s->what, offset_of(s, s->p), why);
    return false;
}

/* KEY for a one-line message: at most 80 characters, control characters and quotes escaped
 * (UTF-8 kept as it is). */
static char *printable_key(const char *key)
{
    char utf8_bytes[129] = {0};
    for (int i = 0; i < 128; i++)
        utf8_bytes[i] = (char)(0x80 + i);
    bool long_key = g_utf8_strlen(key, -1) > 80;
    g_autofree char *cut = long_key ? g_utf8_substring(key, 0, 80) : g_strdup(key);
    g_autofree char *escaped = g_strescape(cut, utf8_bytes);
    return g_strconcat(escaped, long_key ? "..." : "", NULL);
}

static void skip_ws(Scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const unsigned char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Whether one of the eight bytes of W ends a run of plain ASCII in a string: below 0x20, 0x80 or
 * above, '"' or '\\'. (The tests may flag bytes after such a one too: the run ends before.) */
static bool word_ends_plain_run(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    uint64_t quote = w ^ (ones * '"'), backslash = w ^ (ones * '\\');
    uint64_t flagged = (w - ones * 0x20) | ((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | w;
    return (flagged & highs) != 0;
}

/* A string; its decoded UTF-8 is appended to OUT when OUT is not NULL. */
static bool string(Scan *s, GString *out)
{
    s->p++; /* the opening quote */
    while (s->p < s->end && *s->p != '"') {
        unsigned char c = *s->p;
        if (c < 0x20)
            return bad(s, "a control character inside a string");
        if (c < 0x80 && c != '\\') {
            /* a run of plain ASCII, appended at once (a safetensors header is ~all of it) */
            const unsigned char *from = s->p;
            for (uint64_t w; s->end - s->p >= 8 && (memcpy(&w, s->p, 8), !word_ends_plain_run(w));)
                s->p += 8; /* eight bytes a step: tensor names are most of a large header */
            while (s->p < s->end && *s->p >= 0x20 && *s->p < 0x80 && *s->p != '"' && *s->p != '\\')
                s->p++;
            if (out)
                g_string_append_len(out, (const char *)from, s->p - from);
            continue;
        }
        if (c != '\\') {
            /* One character, as long as its encoding says: a stray continuation byte after
             * it is the next character, and refused there. */
            gunichar u = c < 0x80 ? c : g_utf8_get_char_validated((const char *)s->p, s->end - s->p);
            if (u >= (gunichar)-2)
                return bad(s, "invalid UTF-8");
            int n = c < 0x80 ? 1 : g_unichar_to_utf8(u, NULL);
            if (out)
                g_string_append_len(out, (const char *)s->p, n);
            s->p += n;
            continue;
        }
        if (s->end - s->p < 2)
            return bad(s, "a string that does not end");
        const char *simple = strchr("\"\\/bfnrt", s->p[1]);
        if (simple && s->p[1] != '\0') {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            if (out)
                g_string_append_c(out, decoded[simple - "\"\\/bfnrt"]);
            s->p += 2;
            continue;
        }
        if (s->p[1] != 'u' || s->end - s->p < 6 || hex4(s->p + 2) < 0)
            return bad(s, "an invalid escape");
        gunichar u = (gunichar)hex4(s->p + 2);
        s->p += 6;
        if (u >= 0xd800 && u <= 0xdbff) { /* a surrogate pair */
            int low = s->end - s->p >= 6 && s->p[0] == '\\' && s->p[1] == 'u' ? hex4(s->p + 2) : -1;
            if (low < 0xdc00 || low > 0xdfff)
                return bad(s, "an unpaired surrogate escape");
            u = 0x10000 + ((u - 0xd800) << 10) + ((gunichar)low - 0xdc00);
            s->p += 6;
        } else if (u >= 0xdc00 && u <= 0xdfff) {
            return bad(s, "an unpaired surrogate escape");
        }
        if (u == 0)
            return bad(s, "\\u0000 inside a string");
        if (out)
            g_string_append_unichar(out, u);
    }
    if (s->p >= s->end)
        return bad(s, "a string that does not end");
    s->p++;
    return true;
}

static bool digits(Scan *s)
{
    const unsigned char *from = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > from;
}

/* Whether the integer literal FROM..TO ("-"? digits, no leading zero) fits in 64 bits, as
 * json-glib stores it. */
static bool fits_int64(const unsigned char *from, const unsigned char *to)
{
    bool negative = *from == '-';
    const char *digits = (const char *)from + negative;
    size_t n = (size_t)((const char *)to - digits);
    const char *limit = negative ? "9223372036854775808" : "9223372036854775807";
    return n < 19 || (n == 19 && memcmp(digits, limit, 19) <= 0);
}

static bool number(Scan *s)
{
    const unsigned char *from = s->p;
    bool integer = true;
    if (*s->p == '-')
        s->p++;
    if (s->p < s->end && *s->p == '0') {
        s->p++;
        if (s->p < s->end && *s->p >= '0' && *s->p <= '9')
            return bad(s, "a number with a leading zero");
    } else if (!digits(s)) {
        return bad(s, "an invalid number");
    }
    if (s->p < s->end && *s->p == '.') {
        integer = false;
        s->p++;
        if (!digits(s))
            return bad(s, "an invalid number");
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        integer = false;
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (!digits(s))
            return bad(s, "an invalid number");
    }
    if (integer && !fits_int64(from, s->p)) {
        g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: integer %.*s%s does not fit in 64 bits at byte %td", s->what,
                    (int)MIN(s->p - from, 24), (const char *)from, s->p - from > 24 ? "..." : "",
                    offset_of(s, from));
        return false;
    }
    return true;
}

static bool literal(Scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return bad(s, "an unexpected character");
    s->p += n;
    return true;
}

static bool value(Scan *s, unsigned depth);

#define FEW_KEYS 16

/* An object key as decoded: the bytes between its quotes when it has no escape (decoding
 * changes nothing else), or a decoded copy; never NUL-terminated. */
typedef struct {
    const char *text;
    size_t len;
} KeySlice;

/* The keys of one object: compared one by one while few (a safetensors header holds ~100k
 * objects of three keys; copying or hashing them was a fifth of a large mount), in an open
 * addressing table once there are more. */
typedef struct {
    KeySlice few[FEW_KEYS];
    unsigned n_few;
    KeySlice *slots; /* a power of two of them; an empty one has a NULL text */
    size_t n_slots, n_used;
} KeySet;

static bool key_equal(KeySlice a, KeySlice b)
{
    return a.len == b.len && memcmp(a.text, b.text, a.len) == 0;
}

static size_t key_hash(KeySlice k)
{
    uint64_t h = 14695981039346656037u; /* FNV-1a */
    for (size_t i = 0; i < k.len; i++)
        h = (h ^ (unsigned char)k.text[i]) * 1099511628211u;
    return (size_t)(h ^ (h >> 29));
}

/* Puts KEY in SLOTS (not full); false when it was there. */
static bool slots_add(KeySlice *slots, size_t n_slots, KeySlice key)
{
    for (size_t i = key_hash(key) & (n_slots - 1);; i = (i + 1) & (n_slots - 1)) {
        if (slots[i].text == NULL) {
            slots[i] = key;
            return true;
        }
        if (key_equal(slots[i], key))
            return false;
    }
}

/* Adds KEY (its text outliving SET); false when it was there. */
static bool key_set_add(KeySet *set, KeySlice key)
{
    if (set->slots == NULL) {
        for (unsigned i = 0; i < set->n_few; i++)
            if (key_equal(set->few[i], key))
                return false;
        if (set->n_few < FEW_KEYS) {
            set->few[set->n_few++] = key;
            return true;
        }
        set->n_slots = 4 * FEW_KEYS;
        set->slots = g_new0(KeySlice, set->n_slots);
        for (unsigned i = 0; i < set->n_few; i++)
            slots_add(set->slots, set->n_slots, set->few[i]);
        set->n_used = set->n_few;
    }
    if (2 * (set->n_used + 1) > set->n_slots) { /* at most half full */
        size_t n = 2 * set->n_slots;
        KeySlice *grown = g_new0(KeySlice, n);
        for (size_t i = 0; i < set->n_slots; i++)
            if (set->slots[i].text != NULL)
                slots_add(grown, n, set->slots[i]);
        g_free(set->slots);
        set->slots = grown, set->n_slots = n;
    }
    if (!slots_add(set->slots, set->n_slots, key))
        return false;
    set->n_used++;
    return true;
}

/* The key whose string starts at AT (S just past it) as decoded: a decoded copy, kept in
 * *DECODED (made on first use), only when it holds an escape. */
static KeySlice key_of(Scan *s, const unsigned char *at, GPtrArray **decoded)
{
    KeySlice key = {(const char *)at + 1, (size_t)(s->p - at) - 2};
    if (memchr(key.text, '\\', key.len) == NULL)
        return key;
    g_autoptr(GString) out = g_string_new(NULL);
    Scan again = {s->what, at, s->start, s->end, NULL};
    string(&again, out); /* checked already */
    if (*decoded == NULL)
        *decoded = g_ptr_array_new_with_free_func(g_free);
    key.len = out->len;
    key.text = g_string_free(g_steal_pointer(&out), FALSE);
    g_ptr_array_add(*decoded, (char *)key.text);
    return key;
}

/* An object or array at nesting level DEPTH (the top-level object is 0). An object's keys are
 * collected, decoded, to refuse one given twice, at every level: json-glib would keep only the
 * last, Python's json too, so the two could disagree with a reader that keeps the first. */
static bool container(Scan *s, unsigned depth)
{
    bool object = *s->p == '{';
    char close = object ? '}' : ']';
    if (depth >= CKPTFS_MAX_JSON_DEPTH) {
        g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: nesting deeper than %d at byte %td",
                    s->what, CKPTFS_MAX_JSON_DEPTH, offset_of(s, s->p));
        return false;
    }
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return true;
    }
    KeySet keys; /* not zeroed whole: FEW is filled before it is read, and arrays use none */
    keys.n_few = 0, keys.slots = NULL, keys.n_slots = 0, keys.n_used = 0;
    g_autoptr(GPtrArray) decoded = NULL;
    bool ok = false;
    for (;;) {
        skip_ws(s);
        if (object) {
            if (s->p >= s->end || *s->p != '"') {
                bad(s, "an object key that is not a double-quoted string");
                break;
            }
            const unsigned char *key_at = s->p;
            if (!string(s, NULL))
                break;
            KeySlice key = key_of(s, key_at, &decoded);
            if (!key_set_add(&keys, key)) {
                g_autofree char *text = g_strndup(key.text, key.len);
                g_autofree char *shown = printable_key(text);
                g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: key '%s' is given twice in one object at byte %td", s->what, shown,
                            offset_of(s, key_at));
                break;
            }
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':') {
                bad(s, "a missing ':'");
                break;
            }
            s->p++;
        }
        if (!value(s, depth + 1))
            break;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == close) {
            s->p++;
            ok = true;
            break;
        }
        bad(s, object ? "a missing ',' or '}'" : "a missing ',' or ']'");
        break;
    }
    g_free(keys.slots);
    return ok;
}

static bool value(Scan *s, unsigned depth)
{
    skip_ws(s);
    if (s->p >= s->end)
        return bad(s, "a missing value");
    switch (*s->p) {
    case '{':
    case '[':
        return container(s, depth);
    case '"':
        return string(s, NULL);
    case 't':
        return literal(s, "true");
    case 'f':
        return literal(s, "false");
    case 'n':
        return literal(s, "null");
    default:
        if (*s->p == '-' || (*s->p >= '0' && *s->p <= '9'))
            return number(s);
        return bad(s, "an unexpected character");
    }
}

bool ckptfs_json_check_strict(const char *what, const char *data, size_t len, GError **error)
{
    Scan s = {what, (const unsigned char *)data, (const unsigned char *)data,
              (const unsigned char *)data + len, error};
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{') {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a JSON object at byte %td",
                    what, offset_of(&s, s.p));
        return false;
    }
    if (!value(&s, 0))
        return false;
    skip_ws(&s);
    if (s.p != s.end)
        return bad(&s, "text after the JSON object");
    return true;
}

JsonObject *ckptfs_json_parse_object(const char *what, const char *data, size_t len, GError **error)
{
    if (len > G_MAXSSIZE) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: %zu bytes of JSON is too large",
                    what, len);
        return NULL;
    }
    if (!ckptfs_json_check_strict(what, data, len, error))
        return NULL;
    /* A mutable tree: sealing one hashes every node, a tenth of a large header's parse. */
    g_autoptr(JsonParser) parser = json_parser_new();
    GError *json_error = NULL;
    if (!json_parser_load_from_data(parser, data, (gssize)len, &json_error)) {
        /* Not expected after the strict check; refused all the same. */
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not valid JSON: %s", what,
                    json_error->message);
        g_error_free(json_error);
        return NULL;
    }
    JsonNode *root = json_parser_get_root(parser);
    if (root == NULL || !JSON_NODE_HOLDS_OBJECT(root)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a JSON object", what);
        return NULL;
    }
    return json_object_ref(json_node_get_object(root));
}

JsonObject *ckptfs_json_load_object(const char *path, GError **error)
{
    g_autofree char *data = NULL;
    size_t len = 0;
    if (!ckptfs_read_small_file(path, CKPTFS_MAX_JSON_BYTES, &data, &len, error))
        return NULL;
    return ckptfs_json_parse_object(path, data, len, error);
}

/* --- the cursor (over checked JSON: a syntax error just ends what is read) --- */

static Scan cursor_scan(CkptfsJsonCursor *c)
{
    return (Scan){"json", c->p, c->p, c->end, NULL};
}

void ckptfs_json_cursor_init(CkptfsJsonCursor *c, const char *data, size_t len)
{
    c->p = (const unsigned char *)data;
    c->end = c->p + len;
}

static void cursor_ws(CkptfsJsonCursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

CkptfsJsonKind ckptfs_json_cursor_kind(CkptfsJsonCursor *c)
{
    cursor_ws(c);
    if (c->p >= c->end)
        return CKPTFS_JSON_END;
    switch (*c->p) {
    case '{':
        return CKPTFS_JSON_OBJECT;
    case '[':
        return CKPTFS_JSON_ARRAY;
    case '"':
        return CKPTFS_JSON_STRING;
    case 't':
    case 'f':
    case 'n':
        return CKPTFS_JSON_LITERAL;
    default:
        return *c->p == '-' || (*c->p >= '0' && *c->p <= '9') ? CKPTFS_JSON_NUMBER : CKPTFS_JSON_END;
    }
}

void ckptfs_json_cursor_enter(CkptfsJsonCursor *c)
{
    CkptfsJsonKind k = ckptfs_json_cursor_kind(c);
    if (k == CKPTFS_JSON_OBJECT || k == CKPTFS_JSON_ARRAY)
        c->p++;
}

bool ckptfs_json_cursor_next(CkptfsJsonCursor *c, GString *key)
{
    cursor_ws(c);
    if (c->p < c->end && *c->p == ',')
        c->p++;
    cursor_ws(c);
    if (c->p >= c->end || *c->p == '}' || *c->p == ']') {
        c->p += c->p < c->end;
        return false;
    }
    if (key != NULL) {
        ckptfs_json_cursor_string(c, key);
        cursor_ws(c);
        if (c->p < c->end && *c->p == ':')
            c->p++;
    }
    return true;
}

void ckptfs_json_cursor_string(CkptfsJsonCursor *c, GString *out)
{
    g_string_truncate(out, 0);
    if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_STRING) {
        c->p = c->end;
        return;
    }
    Scan s = cursor_scan(c);
    if (!string(&s, out))
        s.p = s.end;
    c->p = s.p;
}

void ckptfs_json_cursor_number(CkptfsJsonCursor *c, bool *is_int, int64_t *i, double *d)
{
    *is_int = false, *i = 0, *d = 0;
    if (ckptfs_json_cursor_kind(c) != CKPTFS_JSON_NUMBER) {
        c->p = c->end;
        return;
    }
    const unsigned char *a = c->p;
    Scan s = cursor_scan(c);
    if (!number(&s)) {
        c->p = c->end;
        return;
    }
    c->p = s.p;
    *is_int = true;
    for (const unsigned char *q = a; q < c->p && *is_int; q++)
        *is_int = *q != '.' && *q != 'e' && *q != 'E';
    if (*is_int) {
        /* Read here, not copied for strtoll: a header holds ~5 integers a tensor. The strict
         * pass let only literals that fit in 64 bits through. */
        bool negative = *a == '-';
        uint64_t magnitude = 0;
        for (const unsigned char *q = a + negative; q < c->p; q++)
            magnitude = magnitude * 10 + (uint64_t)(*q - '0');
        *i = negative ? (magnitude == 0 ? 0 : -(int64_t)(magnitude - 1) - 1) : (int64_t)magnitude;
        return;
    }
    g_autofree char *text = g_strndup((const char *)a, (gsize)(c->p - a));
    *d = g_ascii_strtod(text, NULL);
}

void ckptfs_json_cursor_skip(CkptfsJsonCursor *c)
{
    Scan s = cursor_scan(c);
    if (ckptfs_json_cursor_kind(c) == CKPTFS_JSON_END || !value(&s, 0))
        s.p = s.end;
    c->p = s.p;
}

JsonNode *ckptfs_json_member(JsonObject *object, const char *path)
{
    const char *dot = object ? strchr(path, '.') : NULL;
    if (object == NULL)
        return NULL;
    if (dot == NULL)
        return json_object_get_member(object, path);
    g_autofree char *parent_name = g_strndup(path, (gsize)(dot - path));
    JsonNode *parent = json_object_get_member(object, parent_name);
    if (parent == NULL || !JSON_NODE_HOLDS_OBJECT(parent))
        return NULL;
    return ckptfs_json_member(json_node_get_object(parent), dot + 1);
}

/* The value node at PATH with its type, or ABSENT / WRONG_TYPE. */
static CkptfsJsonMember member_value(JsonObject *object, const char *path, JsonNode **out, GType *type)
{
    JsonNode *n = ckptfs_json_member(object, path);
    if (n == NULL || JSON_NODE_HOLDS_NULL(n))
        return CKPTFS_JSON_ABSENT;
    if (!JSON_NODE_HOLDS_VALUE(n))
        return CKPTFS_JSON_WRONG_TYPE;
    *out = n;
    *type = json_node_get_value_type(n);
    return CKPTFS_JSON_FOUND;
}

CkptfsJsonMember ckptfs_json_member_int(JsonObject *object, const char *path, gint64 *out)
{
    JsonNode *n;
    GType t;
    CkptfsJsonMember found = member_value(object, path, &n, &t);
    if (found != CKPTFS_JSON_FOUND)
        return found;
    return ckptfs_json_node_int(n, out) ? CKPTFS_JSON_FOUND : CKPTFS_JSON_WRONG_TYPE;
}

bool ckptfs_json_node_int(JsonNode *node, gint64 *out)
{
    if (node == NULL || !JSON_NODE_HOLDS_VALUE(node) || json_node_get_value_type(node) != G_TYPE_INT64)
        return false;
    *out = json_node_get_int(node);
    return true;
}

CkptfsJsonMember ckptfs_json_member_number(JsonObject *object, const char *path, double *out)
{
    JsonNode *n;
    GType t;
    CkptfsJsonMember found = member_value(object, path, &n, &t);
    if (found != CKPTFS_JSON_FOUND)
        return found;
    if (t == G_TYPE_INT64)
        *out = (double)json_node_get_int(n);
    else if (t == G_TYPE_DOUBLE)
        *out = json_node_get_double(n);
    else
        return CKPTFS_JSON_WRONG_TYPE;
    return CKPTFS_JSON_FOUND;
}

CkptfsJsonMember ckptfs_json_member_bool(JsonObject *object, const char *path, bool *out)
{
    JsonNode *n;
    GType t;
    CkptfsJsonMember found = member_value(object, path, &n, &t);
    if (found != CKPTFS_JSON_FOUND)
        return found;
    if (t != G_TYPE_BOOLEAN)
        return CKPTFS_JSON_WRONG_TYPE;
    *out = json_node_get_boolean(n);
    return CKPTFS_JSON_FOUND;
}

const char *ckptfs_json_member_string(JsonObject *object, const char *path)
{
    JsonNode *n;
    GType t;
    if (member_value(object, path, &n, &t) != CKPTFS_JSON_FOUND || t != G_TYPE_STRING)
        return NULL;
    return json_node_get_string(n);
}

JsonObject *ckptfs_json_member_object(JsonObject *object, const char *path)
{
    JsonNode *n = ckptfs_json_member(object, path);
    return n && JSON_NODE_HOLDS_OBJECT(n) ? json_node_get_object(n) : NULL;
}
