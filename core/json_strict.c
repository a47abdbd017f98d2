/* Strict JSON (RFC 8259) for headers from untrusted files. json-glib 1.6 accepts single
 * quotes, comments, hex numbers, leading zeros, raw control characters and text after the
 * value, which Python's json and the safetensors library refuse; a \u0000 would cut a tensor
 * name short. This pass runs first so ckptfs refuses what they refuse. */
#include "ckptfs/json_strict.h"

#include <string.h>

#include "ckptfs/error.h"

#define MAX_DEPTH 64

typedef struct {
    const char *what;
    const unsigned char *p, *start, *end;
    GError **error;
} Scan;

static bool bad(Scan *s, const char *why)
{
    g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not valid JSON at byte %td: %s",
                s->what, (const char *)s->p - (const char *)s->start, why);
    return false;
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

/* A string; its decoded UTF-8 is appended to OUT when OUT is not NULL. */
static bool string(Scan *s, GString *out)
{
    s->p++; /* the opening quote */
    while (s->p < s->end && *s->p != '"') {
        unsigned char c = *s->p;
        if (c < 0x20)
            return bad(s, "a control character inside a string");
        if (c != '\\') {
            const char *next = g_utf8_find_next_char((const char *)s->p, (const char *)s->end);
            const unsigned char *stop = next ? (const unsigned char *)next : s->end;
            if (g_utf8_get_char_validated((const char *)s->p, stop - s->p) >= (gunichar)-2)
                return bad(s, "invalid UTF-8");
            if (out)
                g_string_append_len(out, (const char *)s->p, stop - s->p);
            s->p = stop;
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

static bool number(Scan *s)
{
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
        s->p++;
        if (!digits(s))
            return bad(s, "an invalid number");
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (!digits(s))
            return bad(s, "an invalid number");
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

static bool value(Scan *s, unsigned depth, GHashTable *keys);

/* An object or array; KEYS (top level only) collects the object's keys to refuse repeats. */
static bool container(Scan *s, unsigned depth, GHashTable *keys)
{
    bool object = *s->p == '{';
    char close = object ? '}' : ']';
    if (depth >= MAX_DEPTH)
        return bad(s, "nesting too deep");
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return true;
    }
    for (;;) {
        skip_ws(s);
        if (object) {
            if (s->p >= s->end || *s->p != '"')
                return bad(s, "an object key that is not a double-quoted string");
            g_autoptr(GString) key = keys ? g_string_new(NULL) : NULL;
            if (!string(s, key))
                return false;
            if (keys && !g_hash_table_add(keys, g_strdup(key->str))) {
                g_set_error(s->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: '%s' is given twice",
                            s->what, key->str);
                return false;
            }
            skip_ws(s);
            if (s->p >= s->end || *s->p != ':')
                return bad(s, "a missing ':'");
            s->p++;
        }
        if (!value(s, depth + 1, NULL))
            return false;
        skip_ws(s);
        if (s->p < s->end && *s->p == ',') {
            s->p++;
            continue;
        }
        if (s->p < s->end && *s->p == close) {
            s->p++;
            return true;
        }
        return bad(s, object ? "a missing ',' or '}'" : "a missing ',' or ']'");
    }
}

static bool value(Scan *s, unsigned depth, GHashTable *keys)
{
    skip_ws(s);
    if (s->p >= s->end)
        return bad(s, "a missing value");
    switch (*s->p) {
    case '{':
    case '[':
        return container(s, depth, keys);
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
    if (s.p >= s.end || *s.p != '{')
        return bad(&s, "the header is not a JSON object");
    g_autoptr(GHashTable) keys = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    if (!value(&s, 0, keys))
        return false;
    skip_ws(&s);
    if (s.p != s.end)
        return bad(&s, "text after the JSON object");
    return true;
}
