/* Reading torch.save files: the zip directory and the pickle, on files Megatron-LM wrote
 * (tests/data), on files ckptfs writes itself, and on hostile pickles. */
#include <glib/gstdio.h>
#include <string.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/pickle.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/zipreader.h"
#include "tap.h"

static CkptfsPickle *load(const CkptfsSrcFiles *files, unsigned src, CkptfsZip **zip_out,
                          GError **error)
{
    CkptfsZip *zip = ckptfs_zip_open(files, src, error);
    if (zip == NULL)
        return NULL;
    GBytes *pkl = ckptfs_zip_read(zip, files, "data.pkl", 64u << 20, error);
    CkptfsPickle *p = NULL;
    if (pkl) {
        gsize n;
        const uint8_t *d = g_bytes_get_data(pkl, &n);
        p = ckptfs_pickle_parse("data.pkl", d, n, error);
        g_bytes_unref(pkl);
    }
    *zip_out = zip;
    return p;
}

static void test_megatron_file(void)
{
    g_autofree char *path = g_build_filename(CKPTFS_TEST_DATA,
                                             "megatron-core-0.17.1/llama-tp2pp2-torch/iter_0000010/"
                                             "mp_rank_01_001/model_optim_rng.pt",
                                             NULL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    int src = ckptfs_srcfiles_add(files, path, &error);
    CkptfsZip *zip = NULL;
    CkptfsPickle *p = src >= 0 ? load(files, (unsigned)src, &zip, &error) : NULL;
    tap_ok(p != NULL, "Megatron's rank file parses without executing anything (%s)",
           error ? error->message : "ok");
    g_clear_error(&error);
    if (p) {
        const CkptfsPy *root = ckptfs_pickle_root(p);
        const CkptfsPy *version = ckptfs_py_dict_get(root, "checkpoint_version");
        const CkptfsPy *iteration = ckptfs_py_dict_get(root, "iteration");
        tap_ok(version && version->kind == CKPTFS_PY_FLOAT && version->f == 3.0 && iteration &&
                   iteration->i == 10,
               "checkpoint_version 3.0, iteration 10");
        const CkptfsPy *args = ckptfs_py_object_state(ckptfs_py_dict_get(root, "args"));
        const CkptfsPy *tp = ckptfs_py_dict_get(args, "tensor_model_parallel_size");
        const CkptfsPy *vocab = ckptfs_py_dict_get(args, "padded_vocab_size");
        tap_ok(tp && tp->i == 2 && vocab && vocab->i == 256,
               "args Namespace state: tp 2, padded vocab 256");
        const CkptfsPy *model = ckptfs_py_dict_get(root, "model");
        const CkptfsPy *qkv = ckptfs_py_dict_get(model, "decoder.layers.0.self_attention.linear_qkv.weight");
        tap_ok(qkv && qkv->kind == CKPTFS_PY_TENSOR && qkv->tensor->dtype == CKPTFS_DTYPE_BF16 &&
                   qkv->tensor->ndim == 2 && qkv->tensor->shape[0] == 48 && qkv->tensor->shape[1] == 64 &&
                   qkv->tensor->stride[0] == 64,
               "linear_qkv.weight: bf16 [48, 64] row-major");
        unsigned tensors = 0, found = 0;
        for (guint i = 0; model && i + 1 < model->items->len; i += 2) {
            const CkptfsPy *v = g_ptr_array_index(model->items, i + 1);
            if (v->kind != CKPTFS_PY_TENSOR)
                continue;
            tensors++;
            g_autofree char *rec = g_strdup_printf("data/%s", v->tensor->storage_key);
            const CkptfsZipEntry *e = ckptfs_zip_find(zip, rec);
            found += e && e->size == v->tensor->storage_numel * ckptfs_dtype_size(v->tensor->dtype);
        }
        tap_ok(tensors > 20 && found == tensors,
               "every model tensor's storage record exists with numel x itemsize bytes (%u)", tensors);
        const CkptfsPy *rng = ckptfs_py_dict_get(root, "rng_state");
        tap_ok(rng != NULL, "rng_state (numpy 2 objects) is kept as opaque values");
        tap_ok(ckptfs_zip_top_folder(zip) && strcmp(ckptfs_zip_top_folder(zip), "model_optim_rng") == 0,
               "top folder read from the archive");
    }
    ckptfs_pickle_free(p);
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
}

/* torch.distributed.checkpoint's .metadata: protocol 4 (FRAME, MEMOIZE, STACK_GLOBAL, ...). */
static void test_dcp_metadata(void)
{
    g_autofree char *path = g_build_filename(CKPTFS_TEST_DATA,
                                             "megatron-core-0.17.1/llama-tp2pp2-torch_dist/iter_0000010/.metadata",
                                             NULL);
    gchar *data = NULL;
    gsize len = 0;
    GError *error = NULL;
    CkptfsPickle *p = NULL;
    if (g_file_get_contents(path, &data, &len, &error))
        p = ckptfs_pickle_parse(".metadata", (const uint8_t *)data, len, &error);
    const CkptfsPy *r = p ? ckptfs_pickle_root(p) : NULL;
    tap_ok(r && r->kind == CKPTFS_PY_OBJECT &&
               ckptfs_py_is_global(r->callable, "torch.distributed.checkpoint.metadata", "Metadata"),
           "Megatron's torch_dist .metadata (protocol 4) parses to an inert Metadata object (%s)",
           error ? error->message : "ok");
    g_clear_error(&error);
    ckptfs_pickle_free(p);
    g_free(data);
}

static void emit_iota(gconstpointer ctx, CkptfsPlanBuilder *b)
{
    uint8_t bytes[24];
    for (unsigned i = 0; i < sizeof bytes; i++)
        bytes[i] = (uint8_t)(i + GPOINTER_TO_UINT(ctx));
    ckptfs_plan_add_literal(b, bytes, sizeof bytes);
}

/* What ckptfs writes, it reads back: values, tensors, records. */
static void test_round_trip(void)
{
    CkptfsValue *root = ckptfs_value_container(CKPTFS_VALUE_DICT);
    CkptfsValue *ns = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
    ckptfs_value_set(ns, "hidden_size", ckptfs_value_int(4096));
    ckptfs_value_set(ns, "big", ckptfs_value_int(-(1ll << 40)));
    ckptfs_value_set(ns, "params_dtype", ckptfs_value_dtype(CKPTFS_DTYPE_BF16));
    ckptfs_value_set(root, "args", ns);
    ckptfs_value_set(root, "checkpoint_version", ckptfs_value_float(3.0));
    CkptfsValue *model = ckptfs_value_container(CKPTFS_VALUE_ODICT);
    uint64_t shape[2] = {3, 4};
    ckptfs_value_set(model, "w", ckptfs_value_tensor(CKPTFS_DTYPE_BF16, 2, shape, emit_iota, GUINT_TO_POINTER(1)));
    ckptfs_value_set(model, "w._extra_state", ckptfs_value_none());
    ckptfs_value_set(root, "model", model);
    CkptfsPlan *plan = ckptfs_torchsave_plan(root, "archive", false, NULL);
    ckptfs_value_free(root);

    g_autofree char *path = g_build_filename(g_get_tmp_dir(), "ckptfs-roundtrip-XXXXXX", NULL);
    int fd = g_mkstemp(path);
    CkptfsSrcFiles *none = ckptfs_srcfiles_new(0);
    uint64_t size = ckptfs_plan_size(plan);
    uint8_t *buf = g_malloc(size);
    ckptfs_plan_read(plan, CKPTFS_READ_SHARED(none), buf, size, 0, NULL);
    g_assert(write(fd, buf, size) == (ssize_t)size);
    close(fd);
    g_free(buf);
    ckptfs_plan_free(plan);
    ckptfs_srcfiles_free(none);

    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    int src = ckptfs_srcfiles_add(files, path, &error);
    CkptfsZip *zip = NULL;
    CkptfsPickle *p = load(files, (unsigned)src, &zip, &error);
    tap_ok(p != NULL, "a file ckptfs writes parses back (%s)", error ? error->message : "ok");
    g_clear_error(&error);
    if (p) {
        const CkptfsPy *r = ckptfs_pickle_root(p);
        const CkptfsPy *st = ckptfs_py_object_state(ckptfs_py_dict_get(r, "args"));
        const CkptfsPy *big = ckptfs_py_dict_get(st, "big");
        tap_ok(ckptfs_py_dict_get(st, "hidden_size")->i == 4096 && big && big->i == -(1ll << 40),
               "ints round-trip, LONG1 included");
        const CkptfsPy *w = ckptfs_py_dict_get(ckptfs_py_dict_get(r, "model"), "w");
        const CkptfsZipEntry *e = w ? ckptfs_zip_find(zip, "data/0") : NULL;
        uint8_t rec[24] = {0};
        bool bytes_ok = e && e->size == 24 && e->data_offset % 64 == 0 &&
                        ckptfs_srcfiles_pread(files, (unsigned)src, rec, 24, e->data_offset, NULL) &&
                        rec[0] == 1 && rec[23] == 24;
        tap_ok(w && w->kind == CKPTFS_PY_TENSOR && w->tensor->shape[1] == 4 && bytes_ok,
               "tensor [3, 4] and its 64-byte aligned record read back");
        tap_ok(ckptfs_py_dict_get(ckptfs_py_dict_get(r, "model"), "w._extra_state")->kind == CKPTFS_PY_NONE,
               "None entries kept in order");
    }
    ckptfs_pickle_free(p);
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
    g_unlink(path);
}

static void expect_bad_pickle(const char *what, const uint8_t *data, size_t len, const char *want)
{
    GError *error = NULL;
    CkptfsPickle *p = ckptfs_pickle_parse("hostile.pkl", data, len, &error);
    tap_ok(p == NULL && error && strstr(error->message, "hostile.pkl") && strstr(error->message, want),
           "%s: %s", what, error ? error->message : "parsed!");
    g_clear_error(&error);
    ckptfs_pickle_free(p);
}

static void test_hostile(void)
{
    GByteArray *deep = g_byte_array_new();
    g_byte_array_append(deep, (const guint8 *)"\x80\x02", 2);
    for (int i = 0; i < 5000; i++)
        g_byte_array_append(deep, (const guint8 *)"(", 1);
    expect_bad_pickle("5000 nested MARKs", deep->data, deep->len, "nesting deeper");
    g_byte_array_set_size(deep, 2);
    for (int i = 0; i < 5000; i++)
        g_byte_array_append(deep, (const guint8 *)"]", 1);
    g_byte_array_append(deep, (const guint8 *)".", 1);
    expect_bad_pickle("5000 lists left on the stack", deep->data, deep->len, "STOP with");
    g_byte_array_unref(deep);
    const uint8_t huge_str[] = {0x80, 2, 'X', 0xff, 0xff, 0xff, 0x7f, 'a', '.'};
    expect_bad_pickle("BINUNICODE claiming 2 GB", huge_str, sizeof huge_str, "truncated");
    const uint8_t huge8[] = {0x80, 4, 0x8e, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '.'};
    expect_bad_pickle("BINBYTES8 claiming 2^64", huge8, sizeof huge8, "truncated");
    const uint8_t unknown[] = {0x80, 2, 0xee, '.'};
    expect_bad_pickle("unknown opcode", unknown, sizeof unknown, "opcode 0xee");
    const uint8_t memo[] = {0x80, 2, 'h', 7, '.'};
    expect_bad_pickle("memo entry never stored", memo, sizeof memo, "never stored");
    const uint8_t under[] = {0x80, 2, 'R', '.'};
    expect_bad_pickle("REDUCE on an empty stack", under, sizeof under, "underflow");
    const uint8_t nostop[] = {0x80, 2, 'N'};
    expect_bad_pickle("no STOP", nostop, sizeof nostop, "without STOP");
    const uint8_t proto9[] = {0x80, 9, 'N', '.'};
    expect_bad_pickle("protocol 9", proto9, sizeof proto9, "protocol 9");
    const uint8_t odd[] = {0x80, 2, '}', '(', 'N', 'u', '.'};
    expect_bad_pickle("SETITEMS with one item", odd, sizeof odd, "odd number");
    const uint8_t setlist[] = {0x80, 2, ']', 'N', 'N', 's', '.'};
    expect_bad_pickle("SETITEM on a list", setlist, sizeof setlist, "not a dict");
    const uint8_t rce[] = "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00id" "\x85R.";
    GError *error = NULL;
    CkptfsPickle *p = ckptfs_pickle_parse("x.pkl", rce, sizeof rce - 1, &error);
    const CkptfsPy *r = p ? ckptfs_pickle_root(p) : NULL;
    tap_ok(r && r->kind == CKPTFS_PY_OBJECT && ckptfs_py_is_global(r->callable, "os", "system"),
           "os.system(...) stays an inert object: nothing is called");
    ckptfs_pickle_free(p);
    g_clear_error(&error);
}

static uint64_t le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = n; i-- > 0;)
        v = v << 8 | p[i];
    return v;
}

static void put_le(uint8_t *p, unsigned n, uint64_t v)
{
    for (unsigned i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Opens DATA as a zip file: NULL with *WHY set, or the archive. */
/* DATA in a new temporary file: its path, to unlink and free. */
static char *temp_file(const uint8_t *data, size_t len)
{
    char *path = g_build_filename(g_get_tmp_dir(), "ckptfs-zip-XXXXXX", NULL);
    int fd = g_mkstemp(path);
    g_assert(fd >= 0 && write(fd, data, len) == (ssize_t)len);
    close(fd);
    return path;
}

static bool zip_opens(const uint8_t *data, size_t len, char **why)
{
    g_autofree char *path = temp_file(data, len);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    int src = ckptfs_srcfiles_add(files, path, &error);
    CkptfsZip *zip = src >= 0 ? ckptfs_zip_open(files, (unsigned)src, &error) : NULL;
    *why = g_strdup(error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
    g_unlink(path);
    return zip != NULL;
}

/* CTX bytes, byte i = i * 7 + 3. */
static void emit_ramp(gconstpointer ctx, CkptfsPlanBuilder *b)
{
    size_t n = GPOINTER_TO_SIZE(ctx);
    g_autofree uint8_t *bytes = g_malloc(n);
    for (size_t i = 0; i < n; i++)
        bytes[i] = (uint8_t)(i * 7 + 3);
    ckptfs_plan_add_literal(b, bytes, n);
}

/* A torch.save archive of ckptfs's own writer ("FB" padding, data descriptors, ZIP64 end
 * records): {"w": 12 bf16 (24 bytes)} (or ELEMENTS bf16 of emit_ramp), with {"more": {"x": 1}}
 * when MORE. */
static uint8_t *written_archive_of(bool more, uint64_t elements, size_t *size)
{
    CkptfsValue *root = ckptfs_value_container(CKPTFS_VALUE_DICT);
    uint64_t shape[1] = {elements};
    ckptfs_value_set(root, "w", elements == 12 ? ckptfs_value_tensor(CKPTFS_DTYPE_BF16, 1, shape, emit_iota, NULL)
                                               : ckptfs_value_tensor(CKPTFS_DTYPE_BF16, 1, shape, emit_ramp,
                                                                     GSIZE_TO_POINTER(elements * 2)));
    if (more) {
        CkptfsValue *inner = ckptfs_value_container(CKPTFS_VALUE_DICT);
        ckptfs_value_set(inner, "x", ckptfs_value_int(1));
        ckptfs_value_set(root, "more", inner);
    }
    CkptfsPlan *plan = ckptfs_torchsave_plan(root, "archive", false, NULL);
    ckptfs_value_free(root);
    CkptfsSrcFiles *none = ckptfs_srcfiles_new(0);
    *size = (size_t)ckptfs_plan_size(plan);
    uint8_t *data = g_malloc(*size);
    ckptfs_plan_read(plan, CKPTFS_READ_SHARED(none), data, *size, 0, NULL);
    ckptfs_plan_free(plan);
    ckptfs_srcfiles_free(none);
    return data;
}

static uint8_t *written_archive(bool more, size_t *size)
{
    return written_archive_of(more, 12, size); /* emit_iota gives 24 bytes */
}

/* One or two little-endian fields of an archive changed, and what opening it must say. */
typedef struct {
    const char *what;
    size_t at;
    unsigned width;
    uint64_t value;
    size_t at2;
    unsigned width2;
    uint64_t value2;
    const char *want; /* NULL: accepted */
} ZipPatch;

static void check_patches(const uint8_t *good, size_t size, const ZipPatch *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        g_autofree uint8_t *bad = g_memdup2(good, size);
        put_le(bad + cases[i].at, cases[i].width, cases[i].value);
        if (cases[i].width2)
            put_le(bad + cases[i].at2, cases[i].width2, cases[i].value2);
        char *why = NULL;
        bool opened = zip_opens(bad, size, &why);
        if (cases[i].want)
            tap_ok(!opened && strstr(why, cases[i].want), "%s: refused (%s)", cases[i].what, why);
        else
            tap_ok(opened, "%s: accepted (%s)", cases[i].what, why);
        g_free(why);
    }
}

/* ZIP64 end records that contradict the classic one (torch.load refuses each), and ones that
 * agree (accepted, saturated classic fields included). ckptfs writes both kinds of records. */
static void test_zip64_cross_check(void)
{
    size_t size = 0;
    g_autofree uint8_t *good = written_archive(true, &size);

    size_t eocd = size - 22, loc = eocd - 20, rec = loc - 56;
    g_assert(le(good + eocd, 4) == 0x06054b50 && le(good + loc, 4) == 0x07064b50 &&
             le(good + rec, 4) == 0x06064b50);
    uint64_t count = le(good + rec + 32, 8), cd_offset = le(good + rec + 48, 8);
    char *why = NULL;
    bool opened = zip_opens(good, size, &why);
    tap_ok(opened, "the archive as written opens (%s)", why);
    g_free(why);

    const ZipPatch cases[] = {
        {"ZIP64 count one less than the classic one", rec + 24, 8, count - 1, rec + 32, 8, count - 1,
         "ZIP64 end record says"},
        {"ZIP64 count one more", rec + 24, 8, count + 1, rec + 32, 8, count + 1, "ZIP64 end record says"},
        {"ZIP64 directory offset off by one", rec + 48, 8, cd_offset - 1, 0, 0, 0, "at offset"},
        {"ZIP64 directory size off by 46", rec + 40, 8, le(good + rec + 40, 8) + 46, 0, 0, 0, "bytes, the classic"},
        {"ZIP64 entries on this disk != total", rec + 24, 8, count - 1, 0, 0, 0, "entries on this disk"},
        {"locator outside the file", loc + 8, 8, size + 100, 0, 0, 0, "outside the archive"},
        {"locator: 2 disks", loc + 16, 4, 2, 0, 0, 0, "spans 2 disks"},
        {"locator: 0 disks", loc + 16, 4, 0, 0, 0, 0, "spans 0 disks"},
        {"ZIP64 record size 40", rec + 4, 8, 40, 0, 0, 0, "has size 40"},
        {"ZIP64 record signature wrong", rec, 4, 0x06064b51, 0, 0, 0, "no ZIP64 end record"},
        {"classic entries on this disk != total", eocd + 8, 2, count - 1, 0, 0, 0, "entries on this disk"},
        {"classic offset saturated, no locator", loc, 4, 0, eocd + 16, 4, 0xffffffffu, "without a ZIP64 locator"},
        {"classic offset and size saturated, ZIP64 agrees", eocd + 16, 4, 0xffffffffu, eocd + 12, 4,
         0xffffffffu, NULL},
        {"classic counts saturated, ZIP64 agrees", eocd + 8, 2, 0xffff, eocd + 10, 2, 0xffff, NULL},
    };
    check_patches(good, size, cases, G_N_ELEMENTS(cases));
    /* Bytes after the last entry in the directory: zipfile would read them as entries. */
    g_autofree uint8_t *grown = g_malloc(size + 46);
    size_t cd_end = (size_t)(cd_offset + le(good + rec + 40, 8));
    memcpy(grown, good, cd_end);
    memset(grown + cd_end, 0, 46);
    memcpy(grown + cd_end + 46, good + cd_end, size - cd_end);
    uint8_t *g_rec = grown + rec + 46, *g_loc = grown + loc + 46, *g_eocd = grown + eocd + 46;
    put_le(g_rec + 40, 8, le(g_rec + 40, 8) + 46);
    put_le(g_loc + 8, 8, rec + 46);
    put_le(g_eocd + 12, 4, le(g_eocd + 12, 4) + 46);
    opened = zip_opens(grown, size + 46, &why);
    tap_ok(!opened && strstr(why, "46 bytes after its"),
           "a directory with bytes after its entries: refused (%s)", why);
    g_free(why);
}

/* Offset of the local header of entry NAME (below the top folder) of the archive in DATA, found
 * through its central directory (at CD_OFFSET, COUNT entries); its directory record in *CDE. */
static size_t local_of(const uint8_t *data, size_t cd_offset, uint64_t count, const char *name, size_t *cde)
{
    size_t p = cd_offset;
    for (uint64_t i = 0; i < count; i++) {
        size_t name_len = (size_t)le(data + p + 28, 2);
        const char *full = (const char *)data + p + 46;
        const char *slash = memchr(full, '/', name_len);
        if (slash && (size_t)(full + name_len - slash - 1) == strlen(name) && memcmp(slash + 1, name, strlen(name)) == 0) {
            *cde = p;
            return (size_t)le(data + p + 42, 4);
        }
        p += 46 + name_len + (size_t)le(data + p + 30, 2) + (size_t)le(data + p + 32, 2);
    }
    g_assert_not_reached();
}

/* An archive comment puts the end records further from the end: torch.save writes none, and
 * the first read (the last 4 KiB) misses them only with a comment; the second finds them. */
static void test_comment(void)
{
    size_t size = 0;
    g_autofree uint8_t *good = written_archive(true, &size);
    const size_t comments[] = {0, 100, 4060, 4074, 5000, 65535};
    for (size_t i = 0; i < 2 * G_N_ELEMENTS(comments); i++) {
        size_t n = comments[i / 2];
        g_autofree uint8_t *with = g_malloc(size + n);
        memcpy(with, good, size);
        memset(with + size, 'c', n);
        put_le(with + size - 2, 2, n);
        /* The classic directory offset saturated: only the ZIP64 records before the end record
         * give it, so they must be found too. */
        if (i % 2)
            put_le(with + size - 6, 4, 0xffffffffu);
        char *why = NULL;
        bool opened = zip_opens(with, size + n, &why);
        tap_ok(opened, "a comment of %zu bytes%s: opens (%s)", n, i % 2 ? ", classic offset saturated" : "", why);
        g_free(why);
    }
}

/* Local headers that disagree with the directory: each would move an entry's data onto other
 * bytes (torch.load would read them without a word, as it checks no CRC), so each is refused.
 * The archive is ckptfs's own torch.save writer's: "FB" padding, data descriptors. */
static void test_local_headers(void)
{
    size_t size = 0;
    g_autofree uint8_t *good = written_archive(false, &size);
    size_t rec = size - 22 - 20 - 56;
    uint64_t count = le(good + rec + 32, 8);
    size_t cd_offset = (size_t)le(good + rec + 48, 8), cde = 0, pkl_cde = 0;
    size_t lh = local_of(good, cd_offset, count, "data/0", &cde);
    local_of(good, cd_offset, count, "data.pkl", &pkl_cde);
    size_t name_len = (size_t)le(good + lh + 26, 2), extra_len = (size_t)le(good + lh + 28, 2);
    size_t fb = lh + 30 + name_len; /* the "FB" padding field */
    g_assert(le(good + fb, 2) == 0x4246 && le(good + fb + 2, 2) + 4 == extra_len && extra_len >= 8);
    char *why = NULL;
    bool opened = zip_opens(good, size, &why);
    tap_ok(opened, "the archive as written opens (%s)", why);
    g_free(why);

    const ZipPatch cases[] = {
        {"extra length + 64", lh + 28, 2, extra_len + 64, 0, 0, 0, "not whole fields"},
        {"extra length and its padding field + 64: whole fields, data moved", lh + 28, 2, extra_len + 64, fb + 2, 2,
         extra_len + 60, "runs into the next local header"},
        {"extra length and its padding field + 200 (the header read again): data moved", lh + 28, 2, extra_len + 200,
         fb + 2, 2, extra_len + 196, "runs into the central directory"},
        {"extra length and its padding field - 4: data moved back", lh + 28, 2, extra_len - 4, fb + 2, 2,
         extra_len - 8, "no data descriptor"},
        {"extra length 0 (the padding field's bytes become data)", lh + 28, 2, 0, 0, 0, 0, "no data descriptor"},
        {"name length 0", lh + 26, 2, 0, 0, 0, 0, "names another file"},
        {"a name byte changed", lh + 30 + name_len - 1, 1, 'x', 0, 0, 0, "names another file"},
        {"local header says deflated", lh + 8, 2, 8, 0, 0, 0, "says compressed"},
        {"local header says encrypted", lh + 6, 2, 0x0809, 0, 0, 0, "encrypted"},
        {"directory says encrypted", cde + 8, 2, 0x0809, 0, 0, 0, "is encrypted"},
        {"directory size of data/0 + 64, both fields", cde + 20, 4, 24 + 64, cde + 24, 4, 24 + 64, "runs into the next"},
        {"directory size of data/0 + 8 (still before the next header)", cde + 20, 4, 24 + 8, cde + 24, 4, 24 + 8,
         "no data descriptor"},
        {"directory CRC of data.pkl changed", pkl_cde + 16, 4, 0x12345678, 0, 0, 0, "no data descriptor"},
        {"data/0's header offset past the directory", cde + 42, 4, cd_offset + 4, 0, 0, 0, "past the central directory"},
        {"data/0's header offset moved onto data.pkl's", cde + 42, 4, le(good + pkl_cde + 42, 4), 0, 0, 0,
         "share the local header"},
    };
    check_patches(good, size, cases, G_N_ELEMENTS(cases));

    /* Without data descriptors the local header carries the sizes: data/0's header and directory
     * entry without the flag, the descriptor's 16 bytes left as a gap before the next header. */
    g_autofree uint8_t *plain = g_memdup2(good, size);
    put_le(plain + lh + 6, 2, 0x0800);
    put_le(plain + cde + 8, 2, 0x0800);
    put_le(plain + lh + 18, 4, 24);
    put_le(plain + lh + 22, 4, 24);
    opened = zip_opens(plain, size, &why);
    tap_ok(opened, "an entry without a data descriptor, sizes in its header: opens (%s)", why);
    g_free(why);
    put_le(plain + lh + 22, 4, 25);
    opened = zip_opens(plain, size, &why);
    tap_ok(!opened && strstr(why, "local header says 25 bytes"), "... with its header's size wrong: refused (%s)", why);
    g_free(why);
}

/* An archive larger than the two 4 KiB windows it is opened with (its first header's and its
 * end's): headers and small records come from them, the tensor's bytes stay where they are, and
 * damaged headers in either window are refused. */
static void test_large_archive(void)
{
    size_t size = 0;
    const uint64_t elements = 8192; /* 16 KiB between the windows */
    g_autofree uint8_t *good = written_archive_of(true, elements, &size);
    size_t rec = size - 22 - 20 - 56;
    uint64_t count = le(good + rec + 32, 8);
    size_t cd_offset = (size_t)le(good + rec + 48, 8), cde = 0, ver_cde = 0;
    size_t lh = local_of(good, cd_offset, count, "data/0", &cde);
    size_t ver = local_of(good, cd_offset, count, "version", &ver_cde);
    g_assert(lh < 4096 && ver > size - 4096 && size > 3 * 4096);
    g_autofree char *path = temp_file(good, size);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    int src = ckptfs_srcfiles_add(files, path, &error);
    CkptfsZip *zip = src >= 0 ? ckptfs_zip_open(files, (unsigned)src, &error) : NULL;
    tap_ok(zip != NULL, "a 16 KiB archive opens (%s)", error ? error->message : "ok");
    const CkptfsZipEntry *w = zip ? ckptfs_zip_find(zip, "data/0") : NULL;
    bool ramp = w && w->size == elements * 2 && w->data_offset + w->size <= size;
    for (uint64_t i = 0; ramp && i < w->size; i++)
        ramp = good[w->data_offset + i] == (uint8_t)(i * 7 + 3);
    tap_ok(ramp, "its tensor's record is where its bytes are");
    const CkptfsZipEntry *pkl = zip ? ckptfs_zip_find(zip, "data.pkl") : NULL;
    GBytes *got = zip ? ckptfs_zip_read(zip, files, "data.pkl", 1 << 20, &error) : NULL;
    tap_ok(got && pkl && g_bytes_get_size(got) == pkl->size &&
               memcmp(g_bytes_get_data(got, NULL), good + pkl->data_offset, pkl->size) == 0,
           "data.pkl read back (from the first window) equals its bytes");
    if (got)
        g_bytes_unref(got);
    GBytes *v = zip ? ckptfs_zip_read(zip, files, "version", 64, &error) : NULL;
    tap_ok(v && g_bytes_get_size(v) > 0, "a record near the end (version) reads back");
    if (v)
        g_bytes_unref(v);
    g_clear_error(&error);
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
    g_unlink(path);

    size_t name_len = (size_t)le(good + lh + 26, 2), extra_len = (size_t)le(good + lh + 28, 2);
    size_t fb = lh + 30 + name_len;
    const ZipPatch cases[] = {
        {"16 KiB archive: data/0's padding + 64 (first window)", lh + 28, 2, extra_len + 64, fb + 2, 2,
         extra_len + 60, "runs into the next local header"},
        {"16 KiB archive: version's name length 0 (last window)", ver + 26, 2, 0, 0, 0, 0, "names another file"},
        {"16 KiB archive: data/0's size + 8 (its descriptor looked for 8 bytes on)", cde + 20, 4,
         elements * 2 + 8, cde + 24, 4, elements * 2 + 8, "no data descriptor"},
    };
    check_patches(good, size, cases, G_N_ELEMENTS(cases));
}

/* The memo: indexes in order go to an array, others to a hash table, both found again; a
 * value shared by many places (None, small ints, the empty tuple) is one object. */
static void test_pickle_memo_and_sharing(void)
{
    const uint8_t data[] = {0x80, 2, ']', 'q', 0,           /* [] -> memo 0 */
                            'K', 7, 'r', 0x40, 0x42, 0x0f, 0, /* 7 -> memo 1000000 */
                            '0', '0',                         /* pop both */
                            '(', 'h', 0, 'j', 0x40, 0x42, 0x0f, 0, 'N', 'N', ')', ')', 'K', 7, 'K', 7, 't', '.'};
    GError *error = NULL;
    CkptfsPickle *p = ckptfs_pickle_parse("memo.pkl", data, sizeof data, &error);
    const CkptfsPy *r = p ? ckptfs_pickle_root(p) : NULL;
    bool shape_ok = r && r->kind == CKPTFS_PY_TUPLE && r->items->len == 8;
    tap_ok(shape_ok, "memo at 0 and at 1000000 both read back (%s)", error ? error->message : "ok");
    if (shape_ok) {
        const CkptfsPy *const *v = (const CkptfsPy *const *)r->items->pdata;
        tap_ok(v[0]->kind == CKPTFS_PY_LIST && v[1]->kind == CKPTFS_PY_INT && v[1]->i == 7,
               "the values memoized");
        tap_ok(v[2] == v[3] && v[4] == v[5] && v[6] == v[7] && v[1] == v[6] && v[4]->items->len == 0,
               "None, () and 7 are shared, not one object each");
    }
    g_clear_error(&error);
    ckptfs_pickle_free(p);
}

int main(void)
{
    test_megatron_file();
    test_dcp_metadata();
    test_round_trip();
    test_hostile();
    test_zip64_cross_check();
    test_local_headers();
    test_comment();
    test_large_archive();
    test_pickle_memo_and_sharing();
    return tap_done();
}
