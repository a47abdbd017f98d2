/* The safetensors header parser on valid and malformed headers; the writer round trip. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/limits.h"
#include "ckptfs/safetensors.h"
#include "ckptfs/units.h"
#include "tap.h"

/* Parses JSON as the header of a file whose data area has DATA_SIZE bytes. */
static CkptfsStHeader *parse(const char *json, uint64_t data_size, char **why)
{
    GError *error = NULL;
    size_t n = strlen(json);
    CkptfsStHeader *h = ckptfs_st_parse_header("f.safetensors", json, n, 8 + n + data_size, &error);
    *why = g_strdup(error ? error->message : "");
    g_clear_error(&error);
    return h;
}

static void expect_error(const char *json, uint64_t data_size, const char *what, const char *want1,
                         const char *want2)
{
    char *why;
    CkptfsStHeader *h = parse(json, data_size, &why);
    tap_ok(h == NULL && strstr(why, "f.safetensors") && strstr(why, want1) &&
               (want2 == NULL || strstr(why, want2)),
           "%s: %s", what, why);
    ckptfs_st_header_free(h);
    g_free(why);
}

static void test_valid(void)
{
    char *why;
    CkptfsStHeader *h = parse(
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
        "\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[20,20]}}",
        20, &why);
    tap_ok(h != NULL, "valid header parses (%s)", why);
    if (h) {
        const CkptfsStEntry *a = g_ptr_array_index(h->entries, 0);
        const CkptfsStEntry *e = g_ptr_array_index(h->entries, 2);
        tap_ok(h->entries->len == 3 && strcmp(a->name, "a") == 0 && a->ndim == 0 &&
                   strcmp(e->name, "b") != 0,
               "entries in data order, scalar with shape []");
        tap_ok(h->metadata->len == 2 && strcmp(g_ptr_array_index(h->metadata, 1), "pt") == 0,
               "__metadata__ kept");
    }
    ckptfs_st_header_free(h);
    g_free(why);
    static const char *const dtypes[] = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                         "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
                                         "I64", "U64", "C64"};
    int known = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(dtypes); i++) {
        CkptfsDtype d = ckptfs_dtype_from_safetensors(dtypes[i]);
        known += d != CKPTFS_DTYPE_INVALID && strcmp(ckptfs_dtype_safetensors_name(d), dtypes[i]) == 0;
    }
    tap_is_u64(known, G_N_ELEMENTS(dtypes), "every byte-sized safetensors dtype round-trips its name");
    tap_ok(ckptfs_dtype_size(CKPTFS_DTYPE_BF16) == 2 && ckptfs_dtype_size(CKPTFS_DTYPE_C64) == 8 &&
               ckptfs_dtype_size(CKPTFS_DTYPE_F8_E4M3) == 1,
           "item sizes");
}

static void test_length_prefix(void)
{
    uint8_t p[8];
    uint64_t n;
    GError *error = NULL;
    uint64_t v = 1ull << 40;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    tap_ok(!ckptfs_st_header_length("f.safetensors", p, 1ull << 41, &n, &error) && error &&
               strstr(error->message, "absurd"),
           "absurd header length refused before allocating (%s)", error ? error->message : "");
    g_clear_error(&error);
    v = 4096;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    tap_ok(!ckptfs_st_header_length("f.safetensors", p, 100, &n, &error) && error &&
               strstr(error->message, "larger than the file"),
           "header longer than the file (%s)", error ? error->message : "");
    g_clear_error(&error);
    tap_ok(ckptfs_st_header_length("f.safetensors", p, 8 + 4096, &n, NULL) && n == 4096,
           "a header filling the whole file is fine");
    const uint8_t two[8] = {2, 0, 0, 0, 0, 0, 0, 0};
    tap_ok(!ckptfs_st_header_length("f.safetensors", two, 4, &n, NULL) &&
               !ckptfs_st_header_length("f.safetensors", two, 0, &n, NULL),
           "a file shorter than the length prefix is refused (no unsigned underflow)");
}

static void test_malformed(void)
{
    expect_error("{not json}", 0, "not JSON", "not valid JSON", NULL);
    expect_error("[1,2]", 0, "array", "not a JSON object", NULL);
    expect_error("{\"w\":{\"dtype\":\"Q7\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 "unknown dtype", "'w'", "Q7");
    expect_error("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                 "dtype not a string", "'w'", "dtype");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 3,
                 "shape not an array", "'w'", "shape");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[-3],\"data_offsets\":[0,3]}}", 3,
                 "negative dimension", "'w'", "shape[0]");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,3]}}", 3,
                 "float dimension", "'w'", "shape[0]");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                 "nine dimensions", "'w'", "dimensions");
    expect_error("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,8]}}",
                 8, "numel overflow", "'w'", "overflows 64 bits");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2, "no data_offsets", "'w'",
                 "data_offsets");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2,
                 "one offset", "'w'", "data_offsets");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,0]}}", 2,
                 "end before begin", "'w'", "end before begin");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 1,
                 "past the end", "'w'", "past the end");
    expect_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                 "size mismatch", "'w'", "need 8 bytes");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
                 6, "overlap", "'b'", "overlap tensor 'a'");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, "hole",
                 "'a'", "hole");
    expect_error("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 6,
                 "trailing bytes", "4 bytes after the last tensor", NULL);
    expect_error("{\"__metadata__\":[1]}", 0, "metadata not an object", "__metadata__", NULL);
    expect_error("{\"__metadata__\":{\"k\":1}}", 0, "metadata value not a string", "'k'", NULL);
    expect_error("{\"w\":5}", 0, "entry not an object", "'w'", "not a JSON object");
    char with_nul[] = "{\"a\":{}}\0  ";
    GError *error = NULL;
    CkptfsStHeader *h = ckptfs_st_parse_header("f.safetensors", with_nul, sizeof with_nul - 1,
                                               8 + sizeof with_nul - 1, &error);
    tap_ok(h == NULL && error && strstr(error->message, "NUL"), "NUL inside the header (%s)",
           error ? error->message : "");
    g_clear_error(&error);
}

static void test_build(void)
{
    CkptfsStEntry a = {.name = "quote\"back\\slash é", .dtype = CKPTFS_DTYPE_BF16, .ndim = 2,
                       .shape = {3, 5}, .begin = 0, .end = 30};
    CkptfsStEntry b = {.name = "scalar", .dtype = CKPTFS_DTYPE_F64, .ndim = 0, .begin = 30, .end = 38};
    CkptfsStEntry *entries[] = {&a, &b};
    const char *meta[] = {"format", "pt"};
    GBytes *hdr = ckptfs_st_build_header(entries, 2, meta, 1);
    gsize n;
    const uint8_t *p = g_bytes_get_data(hdr, &n);
    uint64_t json_len = 0;
    for (int i = 7; i >= 0; i--)
        json_len = (json_len << 8) | p[i];
    tap_ok(n % 8 == 0 && json_len == n - 8, "built header: length prefix right, 8-byte aligned");
    tap_ok(memcmp(p + 8, "{\"__metadata__\":{\"format\":\"pt\"},", 32) == 0,
           "__metadata__ first, compact");
    tap_ok(p[n - 1] == ' ' || p[n - 1] == '}', "padded with spaces");
    GError *error = NULL;
    CkptfsStHeader *h = ckptfs_st_parse_header("built", (const char *)p + 8, json_len, n + 38, &error);
    bool same = h && h->entries->len == 2;
    for (guint i = 0; same && i < 2; i++) {
        const CkptfsStEntry *x = g_ptr_array_index(h->entries, i), *y = entries[i];
        same = strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim &&
               x->begin == y->begin && x->end == y->end &&
               memcmp(x->shape, y->shape, x->ndim * sizeof x->shape[0]) == 0;
    }
    tap_ok(same, "built header parses back to the same entries (%s)", error ? error->message : "");
    g_clear_error(&error);
    ckptfs_st_header_free(h);
    g_bytes_unref(hdr);
}

static void test_sizes(void)
{
    const struct {
        const char *text;
        uint64_t want;
    } good[] = {{"4096", 4096},          {"256M", 256ull << 20},      {"5G", 5ull << 30},
                {"5GB", 5000000000ull}, {"2GiB", 2ull << 30},        {"1k", 1024},
                {"3mb", 3000000},       {"7B", 7},                   {"1T", 1ull << 40}};
    for (size_t i = 0; i < G_N_ELEMENTS(good); i++) {
        uint64_t v = 0;
        bool ok = ckptfs_parse_size(good[i].text, &v, NULL);
        tap_ok(ok && v == good[i].want, "size '%s' = %llu", good[i].text,
               (unsigned long long)good[i].want);
    }
    const char *bad[] = {"", "banana", "-1", "5XB", "0", "1.5G", "99999999999999999999",
                         "20000000T", "G", " 5G"};
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        uint64_t v;
        GError *error = NULL;
        bool ok = ckptfs_parse_size(bad[i], &v, &error);
        tap_ok(!ok && error != NULL, "size '%s' refused (%s)", bad[i], error ? error->message : "");
        g_clear_error(&error);
    }
}

/* Counts: digits only, in range; strtoul would take "-1" as 2^64 - 1 and " 5" as 5. */
static void test_counts(void)
{
    uint64_t v = 0;
    tap_ok(ckptfs_parse_uint("8", 1, 256, &v, NULL) && v == 8, "count '8'");
    tap_ok(ckptfs_parse_uint("18446744073709551615", 0, G_MAXUINT64, &v, NULL) && v == G_MAXUINT64,
           "count 2^64 - 1");
    const char *bad[] = {"", "-1", "+1", " 1", "1 ", "1x", "0x10", "0", "257", "18446744073709551616"};
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        GError *error = NULL;
        bool ok = ckptfs_parse_uint(bad[i], 1, 256, &v, &error);
        tap_ok(!ok && error != NULL && strstr(error->message, "from 1 to 256") != NULL, "count '%s' refused (%s)",
               bad[i], error ? error->message : "");
        g_clear_error(&error);
    }
}

/* Numbers near 2^63 and 2^64 in a header: refused with the value and what overflows, never
 * wrapped into a range that passes the checks. */
static void test_hostile_sizes(void)
{
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[4611686018427387904,8],\"data_offsets\":[0,0]}}", 0,
                 "[2^62, 8] elements (2^65, 0 when wrapped)", "'w'",
                 "shape [4611686018427387904, 8]: its element count overflows 64 bits");
    expect_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0,
                 "2^62 F32 elements (2^64 bytes, 0 when wrapped)", "'w'",
                 "4611686018427387904 F32 elements of 4 bytes: their size overflows 64 bits");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[18446744073709551615],\"data_offsets\":[0,0]}}", 0,
                 "shape 2^64 - 1", "18446744073709551615", NULL);
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[2,-4],\"data_offsets\":[0,8]}}", 8,
                 "negative dimension, named with its value", "'w'", "shape[1] -4 is negative");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[8.5],\"data_offsets\":[0,8]}}", 8,
                 "fractional dimension", "'w'", "shape[0] is not an integer (8.5)");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,-1]}}", 1,
                 "negative offset", "'w'", "data_offsets[1] -1 is negative");
    expect_error("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[9223372036854775803,"
                 "9223372036854775807]}}", 4, "offsets just below 2^63", "'w'", "run past the end");

    tap_is_u64(ckptfs_st_count_tensors("{}", 2), 0, "count: no tensors");
    const char *three = "{\"__metadata__\":{\"a\":\"b\",\"c\":\"d\"},\"x\":{\"shape\":[1,{\"k\":2}]},"
                        " \"y \\\" : {\" \t:\n{}, \"z\" : 1}";
    tap_is_u64(ckptfs_st_count_tensors(three, strlen(three)), 3,
               "count: top-level keys but __metadata__; nested keys and escaped quotes are not keys");
    const char *junk = "}}]]\"\\{{:::\":\":{\"";
    tap_ok(ckptfs_st_count_tensors(junk, strlen(junk)) < 10, "count: any bytes are scanned safely");
    /* It jumps from quote to quote: escapes before, after and between them still count right,
     * and a string cut by the end of the bytes (an escape last) reads nothing past them. */
    const char *escapes = "{\"a\\\\\":{\"s\":\"\\\"}:{\\\\\"}, \"\\\"b\\\"\" :{}, \"c\\u0022:\":1}";
    tap_is_u64(ckptfs_st_count_tensors(escapes, strlen(escapes)), 3,
               "count: keys ending in an escaped backslash, with escaped quotes and ':' inside strings");
    const char *cut = "{\"a\":1, \"b\\";
    tap_is_u64(ckptfs_st_count_tensors(cut, strlen(cut)), 1, "count: a key cut after an escape");

    /* One more tensor than a header may list: refused by counting, before json-glib parses it. */
    GString *big = g_string_new("{");
    for (unsigned i = 0; i <= CKPTFS_MAX_HEADER_TENSORS; i++)
        g_string_append_printf(big, "%s\"t%u\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
                               i ? "," : "", i);
    g_string_append_c(big, '}');
    GError *error = NULL;
    CkptfsStHeader *h = ckptfs_st_parse_header("f.safetensors", big->str, big->len, 8 + big->len, &error);
    g_autofree char *want = g_strdup_printf("%u tensors (limit %u", CKPTFS_MAX_HEADER_TENSORS + 1,
                                            CKPTFS_MAX_HEADER_TENSORS);
    tap_ok(h == NULL && error && strstr(error->message, "f.safetensors") && strstr(error->message, want),
           "a header of %u tensors is refused (%s)", CKPTFS_MAX_HEADER_TENSORS + 1,
           error ? error->message : "accepted");
    ckptfs_st_header_free(h);
    g_clear_error(&error);
    g_string_free(big, TRUE);
}

int main(void)
{
    test_valid();
    test_counts();
    test_length_prefix();
    test_malformed();
    test_hostile_sizes();
    test_build();
    test_sizes();
    return tap_done();
}
