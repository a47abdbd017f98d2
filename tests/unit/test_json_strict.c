/* Strict JSON for safetensors headers: what Python's json and the safetensors library refuse
 * is refused (json-glib 1.6 alone accepts most of it), valid headers pass. */
#include <string.h>

#include "ckptfs/json_strict.h"
#include "ckptfs/safetensors.h"
#include "tap.h"

static bool check(const char *text, GError **error)
{
    return ckptfs_json_check_strict("h", text, strlen(text), error);
}

int main(void)
{
    static const char *const valid[] = {
        "{}",
        "  {\"a\": 1}   ",
        "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}",
        "{\"__metadata__\":{\"format\":\"pt\",\"nested\":{\"x\":[true,false,null]}}}",
        "{\"n\": [0, -0, 1.5, -2e10, 3E+2, 4.25e-3, 123456789012345678901234567890]}",
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
    tap_ok(!ckptfs_json_check_strict("h", deep->str, deep->len, &e) && strstr(e->message, "too deep"),
           "100000 nested arrays: refused as too deep");
    g_clear_error(&e);
    g_string_free(deep, TRUE);
    /* Nested keys may repeat (only tensor names must be unique). */
    tap_ok(check("{\"__metadata__\":{\"k\":\"1\"},\"t\":{\"k\":2}}", NULL), "keys repeat across objects");

    /* Through the safetensors parser: the file is named, the header refused. */
    const char *hdr = "{'w': {\"dtype\": \"BF16\", \"shape\": [1], \"data_offsets\": [0, 2]}}";
    CkptfsStHeader *h = ckptfs_st_parse_header("model.safetensors", hdr, strlen(hdr), 8 + strlen(hdr) + 2, &e);
    tap_ok(h == NULL && e && strstr(e->message, "model.safetensors: safetensors header: not valid JSON at byte 1"),
           "safetensors header with single quotes refused naming the file: %s", e ? e->message : "accepted");
    g_clear_error(&e);
    return tap_done();
}
