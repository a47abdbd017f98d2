/* Strict JSON for every JSON a source holds: what Python's json and the safetensors library
 * refuse is refused (json-glib 1.6 alone accepts most of it), valid input passes; nesting, key
 * repeats at any depth and integer range are bounded; files are read capped, regular files
 * only, and errors are one line naming the input with the byte offset. */
#include <fcntl.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/safetensors.h"
#include "tap.h"

static bool check(const char *text, GError **error)
{
    return ckptfs_json_check_strict("h", text, strlen(text), error);
}

/* ok when a call FAILED with the one-line error WANT (exactly); clears *ERROR. */
static void refused(bool failed, GError **error, const char *want, const char *what)
{
    const char *got = *error ? (*error)->message : "accepted";
    tap_ok(failed && *error && (strcmp(got, want) == 0 || (strstr(got, want) && !strchr(got, '\n'))),
           "%s: %s", what, got);
    if (!(failed && *error && strstr(got, want)))
        tap_diag("  want %s", want);
    g_clear_error(error);
}

int main(void)
{
    static const char *const valid[] = {
        "{}",
        "  {\"a\": 1}   ",
        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
        "{\"__metadata__\":{\"format\":\"pt\",\"nested\":{\"x\":[true,false,null]}}}",
        "{\"n\": [0, -0, 1.5, -2e10, 3E+2, 4.25e-3, 1e400, 123456789012345678901234567890.0]}",
        "{\"n\": [9223372036854775807, -9223372036854775808, 1000000000000000000]}",
        "{\"u\": \"caf\\u00e9 \\ud83d\\ude00 \\\" \\\\ \\/ \\b\\f\\n\\r\\t\"}",
        "{\"utf8\": \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
        "\t\r\n{\"a\":[[],{}]}\n",
    };
    for (size_t i = 0; i < G_N_ELEMENTS(valid); i++) {
        GError *e = NULL;
        tap_ok(check(valid[i], &e), "valid %zu accepted%s%s", i, e ? ": " : "", e ? e->message : "");
        g_clear_error(&e);
    }
    static const struct {
        const char *text, *why;
    } invalid[] = {
        {"{'a': 1}", "an object key that is not a double-quoted string"},
        {"{\"a\": 'x'}", "an unexpected character"},
        {"{\"a\": 1} /* c */", "text after the JSON object"},
        {"{/* c */ \"a\": 1}", "an object key"},
        {"{\"a\": 1 // c\n}", "a missing ','"},
        {"{\"a\": 0x10}", "a missing ','"},
        {"{\"a\": 007}", "leading zero"},
        {"{\"a\": 1.}", "an invalid number"},
        {"{\"a\": .5}", "an unexpected character"},
        {"{\"a\": +1}", "an unexpected character"},
        {"{\"a\": \"x\ty\"}", "control character"},
        {"{\"a\": 1}{\"b\": 2}", "text after the JSON object"},
        {"{\"a\\u0000b\": 1}", "\\u0000"},
        {"{\"a\": \"\\x41\"}", "an invalid escape"},
        {"{\"a\": \"\\ud800\"}", "unpaired surrogate"},
        {"{\"a\": \"\xff\"}", "invalid UTF-8"},
        /* A stray continuation byte after an ASCII character (json-glib refuses it: the check
         * must too), overlong, surrogate, cut short, past U+10FFFF; in a key as well. */
        {"{\"a\": \"d\xb2\"}", "h: not valid JSON at byte 8: invalid UTF-8"},
        {"{\"shard\xb2" "d\": 1}", "h: not valid JSON at byte 7: invalid UTF-8"},
        {"{\"a\": \"\xc0\xaf\"}", "invalid UTF-8"},
        {"{\"a\": \"\xed\xa0\x80\"}", "invalid UTF-8"},
        {"{\"a\": \"\xe2\x82\"}", "invalid UTF-8"},
        {"{\"a\": \"\xf8\x88\x80\x80\x80\"}", "invalid UTF-8"},
        {"{\"a\": \"\xf4\x90\x80\x80\"}", "invalid UTF-8"},
        {"{\"a\": 1,}", "an object key"},
        {"{\"a\": [1,]}", "an unexpected character"},
        {"{\"a\": tru}", "an unexpected character"},
        {"{\"a\": NaN}", "an unexpected character"},
        {"{\"a\": 1", "a missing ','"},
        {"{\"a\": \"x", "a string that does not end"},
        {"[1, 2]", "not a JSON object"},
        {"", "not a JSON object"},
        {"{\"a\": 1, \"a\": 2}", "'a' is given twice"},
        {"{\"a\": 1, \"\\u0061\": 2}", "'a' is given twice"},
        /* Repeated keys are refused at every depth, with where the repeat starts. */
        {"{\"t\": {\"k\": 1, \"k\": 2}}", "h: key 'k' is given twice in one object at byte 15"},
        {"{\"a\": [{\"x\": 1}, {\"x\": 1, \"x\": 2}]}", "key 'x' is given twice in one object at byte 26"},
        {"{\"o\": {\"p\": {\"a\": 1, \"\\u0061\": 2}}}", "key 'a' is given twice"},
        {"{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"dtype\": \"BF16\"}}", "key 'dtype' is given twice"},
        /* json-glib reads these as other numbers (-1, INT64_MIN, ...): refused. */
        {"{\"n\": 9223372036854775808}", "h: integer 9223372036854775808 does not fit in 64 bits at byte 6"},
        {"{\"n\": [-9223372036854775809]}", "integer -9223372036854775809 does not fit in 64 bits at byte 7"},
        {"{\"n\": {\"m\": 18446744073709551680}}", "does not fit in 64 bits at byte 12"},
        {"{\"n\": 123456789012345678901234567890}", "integer 123456789012345678901234... does not fit"},
        /* Not an object: the offset of what is there instead. */
        {"  [1, 2]", "h: not a JSON object at byte 2"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(invalid); i++) {
        GError *e = NULL;
        bool ok = check(invalid[i].text, &e);
        tap_ok(!ok && e && strstr(e->message, invalid[i].why), "invalid %zu refused (%s): %s", i,
               invalid[i].why, e ? e->message : "accepted");
        g_clear_error(&e);
    }
    /* Deep nesting stops at the bound, without recursing further. */
    GString *deep = g_string_new("{\"a\":");
    for (int i = 0; i < 100000; i++)
        g_string_append_c(deep, '[');
    GError *e = NULL;
    refused(!ckptfs_json_check_strict("h", deep->str, deep->len, &e), &e,
            "h: nesting deeper than 64 at byte 68", "100000 nested arrays: refused at the 65th level");
    g_string_free(deep, TRUE);
    GString *objects = g_string_new(NULL);
    for (int i = 0; i < 100000; i++)
        g_string_append(objects, "{\"a\":");
    refused(!ckptfs_json_check_strict("h", objects->str, objects->len, &e), &e,
            "h: nesting deeper than 64 at byte 320", "{\"a\": x 100000: refused at the 65th level");
    /* Exactly CKPTFS_MAX_JSON_DEPTH levels pass, one more does not. */
    for (int levels = CKPTFS_MAX_JSON_DEPTH; levels <= CKPTFS_MAX_JSON_DEPTH + 1; levels++) {
        g_autoptr(GString) nested = g_string_new(NULL);
        for (int i = 0; i < levels; i++)
            g_string_append(nested, "{\"a\":");
        g_string_append(nested, "1");
        for (int i = 0; i < levels; i++)
            g_string_append_c(nested, '}');
        bool ok = ckptfs_json_check_strict("h", nested->str, nested->len, &e);
        tap_ok(ok == (levels == CKPTFS_MAX_JSON_DEPTH), "%d nested objects: %s", levels,
               ok ? "accepted" : e->message);
        g_clear_error(&e);
    }
    /* Nested keys may repeat across objects (only within one they may not). */
    tap_ok(check("{\"__metadata__\":{\"k\":\"1\"},\"t\":{\"k\":2},\"u\":[{\"k\":3},{\"k\":4}]}", NULL),
           "keys repeat across objects");

    /* A repeated key with a newline or 100000 bytes: the message stays one short line. */
    refused(!check("{\"o\": {\"a\\nb\": 1, \"a\\nb\": 2}}", &e), &e,
            "h: key 'a\\nb' is given twice in one object at byte 18",
            "a repeated key with a newline is shown escaped");
    g_autoptr(GString) long_key = g_string_new("{\"o\": {\"");
    for (int i = 0; i < 100000; i++)
        g_string_append_c(long_key, 'k');
    g_string_append(long_key, "\": 1, \"");
    g_string_append_len(long_key, long_key->str + 8, 100000);
    g_string_append(long_key, "\": 2}}");
    g_autofree char *shown = g_strdup_printf("h: key '%.80s...' is given twice in one object at byte 100014",
                                             long_key->str + 8);
    refused(!check(long_key->str, &e), &e, shown, "a repeated 100000-byte key is shown cut short");

    /* Large flat input: one pass, no recursion per element; a 100000-key object passes. */
    g_autoptr(GString) wide = g_string_new("{");
    for (int i = 0; i < 100000; i++)
        g_string_append_printf(wide, "%s\"model.layers.%d.weight\": [%d, 4096]", i ? "," : "", i, i);
    g_string_append(wide, ", \"big\": [");
    for (int i = 0; i < 1000000; i++)
        g_string_append(wide, i ? ",1.5" : "1.5");
    g_string_append(wide, "]}");
    gint64 t0 = g_get_monotonic_time();
    bool wide_ok = check(wide->str, &e);
    double check_s = (g_get_monotonic_time() - t0) / 1e6;
    g_autoptr(JsonObject) wide_object = ckptfs_json_parse_object("h", wide->str, wide->len, &e);
    tap_ok(wide_ok && wide_object && json_object_get_size(wide_object) == 100001,
           "a %zu-byte object of 100001 keys and 1000000 numbers passes (strict check %.2f s)",
           wide->len, check_s);
    g_clear_error(&e);
    /* The same with a repeated key at the end: found. */
    g_string_truncate(wide, wide->len - 1);
    g_string_append(wide, ", \"model.layers.7.weight\": 1}");
    refused(!check(wide->str, &e), &e, "key 'model.layers.7.weight' is given twice",
            "a key repeated 100000 keys later is found");

    /* Parsing: the object, its members; nothing json-glib would read differently. */
    const char *config = "{\"hidden_size\": 4096, \"rope_scaling\": {\"factor\": 8.0}, \"architectures\": [\"LlamaForCausalLM\"]}";
    g_autoptr(JsonObject) parsed = ckptfs_json_parse_object("config.json", config, strlen(config), &e);
    tap_ok(parsed && json_object_get_int_member(parsed, "hidden_size") == 4096 &&
               json_object_get_double_member(json_object_get_object_member(parsed, "rope_scaling"), "factor") == 8.0,
           "parse_object returns the object");
    g_clear_error(&e);
    const char *dup = "{\"rope_scaling\": {\"factor\": 8.0, \"factor\": 1.0}}";
    refused(ckptfs_json_parse_object("config.json", dup, strlen(dup), &e) == NULL, &e,
            "config.json: key 'factor' is given twice in one object at byte 33",
            "parse_object refuses a nested repeated key");
    refused(ckptfs_json_parse_object("x", "[]", 2, &e) == NULL, &e, "x: not a JSON object at byte 0",
            "parse_object refuses an array");

    /* Files: read capped, regular files only, never blocking; errors name the file. A FIFO
     * that blocked would hang: the alarm fails the test instead. */
    alarm(60);
    g_autofree char *dir = g_dir_make_tmp("test_json_strict.XXXXXX", NULL);
    g_autofree char *good = g_build_filename(dir, "config.json", NULL);
    g_file_set_contents(good, config, -1, NULL);
    g_autoptr(JsonObject) loaded = ckptfs_json_load_object(good, &e);
    tap_ok(loaded && json_object_get_int_member(loaded, "hidden_size") == 4096, "load_object reads a file%s%s",
           e ? ": " : "", e ? e->message : "");
    g_clear_error(&e);
    g_autofree char *deep_file = g_build_filename(dir, "deep.json", NULL);
    g_file_set_contents(deep_file, objects->str, (gssize)objects->len, NULL);
    g_string_free(objects, TRUE);
    g_autofree char *want = g_strdup_printf("%s: nesting deeper than 64 at byte 320", deep_file);
    refused(ckptfs_json_load_object(deep_file, &e) == NULL, &e, want,
            "load_object: 100000 levels refused naming the file");
    /* One byte over the cap, sparse: refused from its size, nothing read. */
    g_autofree char *huge = g_build_filename(dir, "huge.json", NULL);
    int fd = open(huge, O_CREAT | O_WRONLY, 0644);
    tap_ok(fd >= 0 && ftruncate(fd, (off_t)CKPTFS_MAX_JSON_BYTES + 1) == 0, "sparse file over the cap made");
    close(fd);
    want = (g_free(want), g_strdup_printf("%s: %u bytes, more than the %u this file may have", huge,
                                          CKPTFS_MAX_JSON_BYTES + 1, CKPTFS_MAX_JSON_BYTES));
    refused(ckptfs_json_load_object(huge, &e) == NULL, &e, want,
            "load_object: a file over the cap refused from its size");
    g_autofree char *fifo = g_build_filename(dir, "fifo.json", NULL);
    mkfifo(fifo, 0644);
    want = (g_free(want), g_strdup_printf("%s: not a regular file (a FIFO)", fifo));
    refused(ckptfs_json_load_object(fifo, &e) == NULL, &e, want, "load_object: a FIFO refused without blocking");
    g_autofree char *zero = g_build_filename(dir, "zero.json", NULL);
    symlink("/dev/zero", zero);
    want = (g_free(want), g_strdup_printf("%s: not a regular file (a character device)", zero));
    refused(ckptfs_json_load_object(zero, &e) == NULL, &e, want, "load_object: a symlink to /dev/zero refused");
    want = (g_free(want), g_strdup_printf("%s: not a regular file (a directory)", dir));
    refused(ckptfs_json_load_object(dir, &e) == NULL, &e, want, "load_object: a directory refused");
    g_autofree char *missing = g_build_filename(dir, "missing.json", NULL);
    bool missing_refused = ckptfs_json_load_object(missing, &e) == NULL;
    tap_ok(missing_refused && g_error_matches(e, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND),
           "load_object: a missing file is NOT_FOUND: %s", e ? e->message : "accepted");
    g_clear_error(&e);
    const char *names[] = {good, deep_file, huge, fifo, zero, missing};
    for (size_t i = 0; i < G_N_ELEMENTS(names); i++)
        g_unlink(names[i]);
    g_rmdir(dir);
    alarm(0);

    /* Through the safetensors parser: the file is named, the header refused. */
    const char *hdr = "{'w': {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}}";
    CkptfsStHeader *h = ckptfs_st_parse_header("model.safetensors", hdr, strlen(hdr), 8 + strlen(hdr) + 2, &e);
    tap_ok(h == NULL && e && strstr(e->message, "model.safetensors: safetensors header: not valid JSON at byte 1"),
           "safetensors header with single quotes refused naming the file: %s", e ? e->message : "accepted");
    g_clear_error(&e);
    /* The same rules hold inside a tensor's entry. */
    hdr = "{\"w\": {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2], \"shape\": [2]}}";
    h = ckptfs_st_parse_header("model.safetensors", hdr, strlen(hdr), 8 + strlen(hdr) + 2, &e);
    tap_ok(h == NULL && e && strstr(e->message, "model.safetensors: safetensors header: key 'shape' is given twice in one object at byte 62"),
           "safetensors entry with 'shape' twice refused: %s", e ? e->message : "accepted");
    g_clear_error(&e);

    /* The cursor reads integers in place: both ends of 64 bits, -0, and numbers that are not
     * integers still read as doubles. */
    const char *numbers = "[0, -0, 7, 9223372036854775807, -9223372036854775808, 1000000000000000000, "
                          "-12, 1.5, -2e3, 4E-1]";
    static const int64_t want_int[] = {0, 0, 7, INT64_MAX, INT64_MIN, 1000000000000000000, -12};
    static const double want_double[] = {1.5, -2000, 0.4};
    CkptfsJsonCursor c;
    ckptfs_json_cursor_init(&c, numbers, strlen(numbers));
    ckptfs_json_cursor_enter(&c);
    unsigned read = 0, right = 0;
    while (ckptfs_json_cursor_next(&c, NULL)) {
        bool is_int;
        int64_t i;
        double d;
        ckptfs_json_cursor_number(&c, &is_int, &i, &d);
        if (read < G_N_ELEMENTS(want_int))
            right += is_int && i == want_int[read];
        else if (read - G_N_ELEMENTS(want_int) < G_N_ELEMENTS(want_double))
            right += !is_int && d == want_double[read - G_N_ELEMENTS(want_int)];
        read++;
    }
    tap_ok(read == 10 && right == 10, "cursor: %u of 10 numbers read, %u right", read, right);

    /* Strings are scanned eight bytes a step: a quote, an escape, a control character or a
     * UTF-8 byte at every position of a word ends the run there, and decodes as before. */
    unsigned decoded_right = 0, refused_right = 0;
    for (unsigned at = 0; at < 17; at++) {
        g_autofree char *plain = g_strnfill(at, 'x');
        static const char *const inserts[] = {"\\\"", "\\n", "\xc3\xa9", "\\u0041"};
        static const char *const decoded[] = {"\"", "\n", "\xc3\xa9", "A"};
        for (size_t k = 0; k < G_N_ELEMENTS(inserts); k++) {
            g_autofree char *json = g_strdup_printf("{\"%s%sabcdefghijklmnop\": 1}", plain, inserts[k]);
            g_autofree char *expected = g_strdup_printf("%s%sabcdefghijklmnop", plain, decoded[k]);
            g_autoptr(GString) key = g_string_new(NULL);
            ckptfs_json_cursor_init(&c, json, strlen(json));
            ckptfs_json_cursor_enter(&c);
            decoded_right += check(json, NULL) && ckptfs_json_cursor_next(&c, key) && strcmp(key->str, expected) == 0;
        }
        g_autofree char *raw = g_strdup_printf("{\"%s\tabcdefghijklmnop\": 1}", plain);
        g_autofree char *where = g_strdup_printf("at byte %u: a control character inside a string", 2 + at);
        bool failed = !check(raw, &e);
        refused_right += failed && e && strstr(e->message, where) != NULL;
        g_clear_error(&e);
    }
    tap_ok(decoded_right == 17 * 4, "strings: %u of 68 keys with an escape or UTF-8 at offsets 0-16 decoded right",
           decoded_right);
    tap_ok(refused_right == 17, "strings: %u of 17 raw tabs at offsets 0-16 refused at their byte", refused_right);

    /* Keys are compared as decoded, in a small object and past the point where they are hashed:
     * an escaped spelling of a key seen 40 keys earlier, and keys that are prefixes of others. */
    g_autoptr(GString) many = g_string_new("{");
    for (int i = 0; i < 40; i++)
        g_string_append_printf(many, "\"k%d\": 0, \"k%dx\": 0, ", i, i);
    g_string_append(many, "\"k\": 0, \"\": 0, ");
    g_autofree char *unique = g_strdup_printf("%s\"z\": 0}", many->str);
    tap_ok(check(unique, NULL), "82 keys, some prefixes of others and one empty, accepted");
    g_string_append(many, "\"\\u006b7\": 1}"); /* "k7" */
    refused(!check(many->str, &e), &e, "key 'k7' is given twice in one object", "'\\u006b7' after 'k7' among 83 keys");
    refused(!check("{\"\": 1, \"\": 2}", &e), &e, "key '' is given twice", "the empty key twice");
    return tap_done();
}
