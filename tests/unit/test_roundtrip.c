/* Round trips without FUSE. A tiny Llama-like Hugging Face checkpoint is written from C (random
 * bf16 weights); views of it are read through the namespace and file plans into new
 * directories (as `ckptfs export` would), those directories are opened as sources, and their
 * catalogs must equal the original: the same tensor names in the same order, shapes, dtype and
 * bytes (and hf/model.safetensors of the copy must be the original file, byte for byte).
 *
 * Legacy rank files are also checked against an oracle written here from Megatron's
 * conventions (QKV grouped per query group, fc1 = [gate; up] per TP rank, row-parallel weights
 * split by columns, vocabulary padded with zero rows, interleaved virtual stages), not from
 * ckptfs's mapping table: a mistake made the same way in the view and in the source would
 * cancel out in a round trip, not here.
 *
 * Negative cases: a tensor byte changed in a copied rank file is seen by the comparison (it
 * reads real bytes); a rank file with a damaged pickle or cut short fails to open, naming the
 * file; a missing rank (a hole in the grid) and args that disagree with the directory's split
 * are refused. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/catalog.h"
#include "ckptfs/error.h"
#include "ckptfs/mount.h"
#include "ckptfs/pickle.h"
#include "ckptfs/plan.h"
#include "ckptfs/tree.h"
#include "ckptfs/zipreader.h"
#include "source_internal.h" /* the format registry rows, to say which reader opened a copy */
#include "tap.h"

/* The model: hidden 16, 4 heads (head_dim 4) in 2 query groups, ffn 32, vocabulary 40. */
#define LAYERS 4
#define HIDDEN 16
#define HEADS 4
#define KV_HEADS 2
#define HEAD_DIM (HIDDEN / HEADS)
#define FFN 32
#define VOCAB 40
#define Q_DIM (HEADS * HEAD_DIM)
#define KV_DIM (KV_HEADS * HEAD_DIM)

typedef struct {
    char *name;
    unsigned ndim;
    uint64_t shape[2];
    uint8_t *data; /* bf16, row-major */
    uint64_t nbytes;
} Tensor;

static GPtrArray *model_tensors; /* Tensor*, in the order Megatron's modules use them */
static char *top;                /* the temporary directory everything goes in */
static char *hf_dir;
static uint8_t *hf_file;         /* the original model.safetensors */
static gsize hf_file_len;

/* ------------------------------------------------------------------ files and directories */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static bool write_file(const char *path, const void *data, gsize len)
{
    g_autofree char *parent = g_path_get_dirname(path);
    g_mkdir_with_parents(parent, 0755);
    return g_file_set_contents(path, data, (gssize)len, NULL);
}

static void copy_tree(const char *from, const char *to)
{
    g_mkdir_with_parents(to, 0755);
    GDir *d = g_dir_open(from, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        g_autofree char *a = g_build_filename(from, name, NULL);
        g_autofree char *b = g_build_filename(to, name, NULL);
        if (g_file_test(a, G_FILE_TEST_IS_DIR)) {
            copy_tree(a, b);
        } else {
            gchar *data = NULL;
            gsize len = 0;
            g_file_get_contents(a, &data, &len, NULL);
            write_file(b, data, len);
            g_free(data);
        }
    }
    if (d)
        g_dir_close(d);
}

/* XORs byte OFFSET of PATH with MASK (in place). */
static bool flip_byte(const char *path, uint64_t offset, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    uint8_t c = 0;
    bool ok = fd >= 0 && pread(fd, &c, 1, (off_t)offset) == 1;
    c ^= mask;
    ok = ok && pwrite(fd, &c, 1, (off_t)offset) == 1;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* ------------------------------------------------------------------ the Hugging Face source */

static uint16_t random_bf16(GRand *rng)
{
    float f = (float)g_rand_double_range(rng, -2.0, 2.0);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)(bits >> 16);
}

static void add_tensor(GRand *rng, const char *name, unsigned ndim, uint64_t d0, uint64_t d1)
{
    Tensor *t = g_new0(Tensor, 1);
    t->name = g_strdup(name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim == 2 ? d1 : 0;
    uint64_t numel = d0 * (ndim == 2 ? d1 : 1);
    t->nbytes = numel * 2;
    t->data = g_malloc(t->nbytes);
    for (uint64_t i = 0; i < numel; i++) {
        uint16_t v = random_bf16(rng);
        memcpy(t->data + 2 * i, &v, 2);
    }
    g_ptr_array_add(model_tensors, t);
}

static const Tensor *model_tensor(const char *name)
{
    for (guint i = 0; i < model_tensors->len; i++) {
        const Tensor *t = g_ptr_array_index(model_tensors, i);
        if (strcmp(t->name, name) == 0)
            return t;
    }
    return NULL;
}

static const Tensor *layer_tensor(unsigned layer, const char *suffix)
{
    g_autofree char *name = g_strdup_printf("model.layers.%u.%s", layer, suffix);
    return model_tensor(name);
}

static void make_model(GRand *rng)
{
    model_tensors = g_ptr_array_new();
    add_tensor(rng, "model.embed_tokens.weight", 2, VOCAB, HIDDEN);
    for (unsigned l = 0; l < LAYERS; l++) {
        char n[96];
#define L(suffix, nd, a, b) (g_snprintf(n, sizeof n, "model.layers.%u.%s", l, suffix), add_tensor(rng, n, nd, a, b))
        L("input_layernorm.weight", 1, HIDDEN, 0);
        L("self_attn.q_proj.weight", 2, Q_DIM, HIDDEN);
        L("self_attn.k_proj.weight", 2, KV_DIM, HIDDEN);
        L("self_attn.v_proj.weight", 2, KV_DIM, HIDDEN);
        L("self_attn.o_proj.weight", 2, HIDDEN, Q_DIM);
        L("post_attention_layernorm.weight", 1, HIDDEN, 0);
        L("mlp.gate_proj.weight", 2, FFN, HIDDEN);
        L("mlp.up_proj.weight", 2, FFN, HIDDEN);
        L("mlp.down_proj.weight", 2, HIDDEN, FFN);
#undef L
    }
    add_tensor(rng, "model.norm.weight", 1, HIDDEN, 0);
    add_tensor(rng, "lm_head.weight", 2, VOCAB, HIDDEN);
}

/* config.json and model.safetensors as Hugging Face writes them: compact JSON header with
 * __metadata__ first, padded with spaces to a multiple of 8, tensors in order. */
static bool write_hf(const char *dir)
{
    static const char config[] =
        "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
        "  \"hidden_size\": 16,\n  \"num_attention_heads\": 4,\n  \"num_key_value_heads\": 2,\n"
        "  \"num_hidden_layers\": 4,\n  \"intermediate_size\": 32,\n  \"vocab_size\": 40,\n"
        "  \"max_position_embeddings\": 128,\n  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n"
        "  \"hidden_act\": \"silu\",\n  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\"\n}\n";
    g_autofree char *config_path = g_build_filename(dir, "config.json", NULL);
    if (!write_file(config_path, config, strlen(config)))
        return false;
    GString *json = g_string_new("{\"__metadata__\":{\"format\":\"pt\"}");
    uint64_t off = 0;
    for (guint i = 0; i < model_tensors->len; i++) {
        const Tensor *t = g_ptr_array_index(model_tensors, i);
        g_string_append_printf(json, ",\"%s\":{\"dtype\":\"BF16\",\"shape\":[%" G_GUINT64_FORMAT, t->name,
                               t->shape[0]);
        if (t->ndim == 2)
            g_string_append_printf(json, ",%" G_GUINT64_FORMAT, t->shape[1]);
        g_string_append_printf(json, "],\"data_offsets\":[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT "]}",
                               off, off + t->nbytes);
        off += t->nbytes;
    }
    g_string_append_c(json, '}');
    while (json->len % 8)
        g_string_append_c(json, ' ');
    GByteArray *file = g_byte_array_new();
    uint8_t len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (uint8_t)((uint64_t)json->len >> (8 * i));
    g_byte_array_append(file, len8, 8);
    g_byte_array_append(file, (const guint8 *)json->str, json->len);
    for (guint i = 0; i < model_tensors->len; i++) {
        const Tensor *t = g_ptr_array_index(model_tensors, i);
        g_byte_array_append(file, t->data, (guint)t->nbytes);
    }
    g_string_free(json, TRUE);
    g_autofree char *st_path = g_build_filename(dir, "model.safetensors", NULL);
    bool ok = write_file(st_path, file->data, file->len);
    hf_file_len = file->len;
    hf_file = g_byte_array_free(file, FALSE);
    return ok;
}

/* ------------------------------------------------------------------ mounts, views, catalogs */

static CkptfsMount *open_mount(const char *dir, CkptfsSpec spec, bool args, const char *hf_config,
                               GError **error)
{
    CkptfsOptions options;
    ckptfs_options_init(&options);
    options.spec = spec;
    options.megatron_args = args;
    options.hf_config = g_strdup(hf_config);
    CkptfsMount *m = ckptfs_mount_open(dir, &options, error);
    ckptfs_options_clear(&options);
    return m;
}

/* Reads a whole synthesized file through the tree and its plan, in odd-sized pieces. */
static uint8_t *read_view_file(CkptfsMount *m, const char *path, uint64_t *len, GError **error)
{
    CkptfsAttr attr;
    int rc = ckptfs_tree_resolve(m->tree, path, &attr, error);
    const CkptfsPlan *plan = NULL;
    if (rc == 0)
        rc = ckptfs_tree_plan(m->tree, attr.ino, &plan, NULL, error);
    if (rc != 0) {
        if (error && *error == NULL)
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: %s", path, g_strerror(-rc));
        return NULL;
    }
    uint64_t size = ckptfs_plan_size(plan);
    uint8_t *buf = g_malloc(size + 1);
    uint64_t done = 0;
    while (done < size) {
        int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(m->source->files), buf + done, 40961, done, error);
        if (n <= 0) {
            g_free(buf);
            if (error && *error == NULL)
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: short read", path);
            return NULL;
        }
        done += (uint64_t)n;
    }
    *len = size;
    return buf;
}

typedef struct {
    CkptfsMount *m;
    GPtrArray *names;
    GArray *types;
} DirList;

static bool list_entry(gpointer ctx, const char *name, const CkptfsAttr *attr, uint64_t next)
{
    (void)next;
    DirList *l = ctx;
    g_ptr_array_add(l->names, g_strdup(name));
    int type = attr->type;
    g_array_append_val(l->types, type);
    return true;
}

/* Copies view directory PATH of M into DEST (same relative paths). Counts files. */
static bool export_dir(CkptfsMount *m, const char *path, const char *dest, unsigned *nfiles,
                       GError **error)
{
    CkptfsAttr attr;
    if (ckptfs_tree_resolve(m->tree, path, &attr, error) != 0)
        return false;
    g_mkdir_with_parents(dest, 0755);
    DirList l = {m, g_ptr_array_new_with_free_func(g_free), g_array_new(FALSE, FALSE, sizeof(int))};
    bool ok = ckptfs_tree_readdir(m->tree, attr.ino, 0, list_entry, &l, error) == 0;
    for (guint i = 0; ok && i < l.names->len; i++) {
        const char *name = g_ptr_array_index(l.names, i);
        g_autofree char *sub = g_build_filename(path, name, NULL);
        g_autofree char *out = g_build_filename(dest, name, NULL);
        switch (g_array_index(l.types, int, i)) {
        case CKPTFS_NODE_DIR:
            ok = export_dir(m, sub, out, nfiles, error);
            break;
        case CKPTFS_NODE_FILE: {
            uint64_t len = 0;
            g_autofree uint8_t *data = read_view_file(m, sub, &len, error);
            ok = data != NULL && write_file(out, data, len);
            *nfiles += ok;
            break;
        }
        default: {
            CkptfsAttr la;
            const char *target = NULL;
            ok = ckptfs_tree_resolve(m->tree, sub, &la, error) == 0 &&
                 ckptfs_tree_readlink(m->tree, la.ino, &target) == 0 && symlink(target, out) == 0;
            break;
        }
        }
    }
    g_ptr_array_unref(l.names);
    g_array_unref(l.types);
    return ok;
}

static uint8_t *tensor_bytes(const CkptfsMount *m, const CkptfsTensor *t)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_tensor_emit(t, b);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    uint8_t *buf = g_malloc(t->nbytes + 1);
    GError *error = NULL;
    int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(m->source->files), buf, t->nbytes, 0, &error);
    if (n != (int64_t)t->nbytes) {
        tap_diag("reading tensor %s: %s", t->name, error ? error->message : "short read");
        g_clear_pointer(&buf, g_free);
    }
    g_clear_error(&error);
    ckptfs_plan_free(plan);
    return buf;
}

/* Compares M's catalog with the model written at the start: names in order, shapes, dtype,
 * bytes. Returns a description of the first difference (NULL when equal) and, in BAD_BYTES,
 * how many tensors have other bytes (the first named in FIRST_BAD). */
static char *compare_with_model(const CkptfsMount *m, unsigned *bad_bytes, char **first_bad)
{
    const CkptfsCatalog *c = m->source->catalog;
    *bad_bytes = 0;
    if (first_bad)
        *first_bad = NULL;
    if (ckptfs_catalog_count(c) != model_tensors->len)
        return g_strdup_printf("%u tensors, want %u", ckptfs_catalog_count(c), model_tensors->len);
    char *why = NULL;
    for (unsigned i = 0; i < model_tensors->len; i++) {
        const Tensor *want = g_ptr_array_index(model_tensors, i);
        const CkptfsTensor *got = ckptfs_catalog_at(c, i);
        if (strcmp(got->name, want->name) != 0)
            return g_strdup_printf("tensor %u is %s, want %s", i, got->name, want->name);
        if (got->ndim != want->ndim || got->shape[0] != want->shape[0] ||
            (want->ndim == 2 && got->shape[1] != want->shape[1]))
            return g_strdup_printf("%s: another shape", got->name);
        if (got->dtype != CKPTFS_DTYPE_BF16)
            return g_strdup_printf("%s: dtype %s", got->name, ckptfs_dtype_safetensors_name(got->dtype));
        g_autofree uint8_t *bytes = tensor_bytes(m, got);
        if (bytes == NULL)
            return g_strdup_printf("%s: cannot be read", got->name);
        if (got->nbytes != want->nbytes || memcmp(bytes, want->data, want->nbytes) != 0) {
            if (*bad_bytes == 0 && first_bad)
                *first_bad = g_strdup(got->name);
            if (why == NULL)
                why = g_strdup_printf("%s: other bytes", got->name);
            (*bad_bytes)++;
        }
    }
    return why;
}

/* The catalog of A against the catalog of B, through both sources' files. */
static char *compare_catalogs(const CkptfsMount *a, const CkptfsMount *b)
{
    unsigned n = ckptfs_catalog_count(a->source->catalog);
    if (n != ckptfs_catalog_count(b->source->catalog))
        return g_strdup_printf("%u tensors vs %u", n, ckptfs_catalog_count(b->source->catalog));
    for (unsigned i = 0; i < n; i++) {
        const CkptfsTensor *x = ckptfs_catalog_at(a->source->catalog, i);
        const CkptfsTensor *y = ckptfs_catalog_at(b->source->catalog, i);
        if (strcmp(x->name, y->name) != 0 || x->ndim != y->ndim || x->dtype != y->dtype ||
            memcmp(x->shape, y->shape, sizeof x->shape) != 0 || x->nbytes != y->nbytes)
            return g_strdup_printf("tensor %u: %s vs %s", i, x->name, y->name);
        g_autofree uint8_t *bx = tensor_bytes(a, x);
        g_autofree uint8_t *by = tensor_bytes(b, y);
        if (bx == NULL || by == NULL || memcmp(bx, by, x->nbytes) != 0)
            return g_strdup_printf("%s: other bytes", x->name);
    }
    return NULL;
}

/* hf/model.safetensors of M is the original file, byte for byte. */
static bool hf_file_is_original(CkptfsMount *m, char **why)
{
    GError *error = NULL;
    uint64_t len = 0;
    g_autofree uint8_t *data = read_view_file(m, "hf/model.safetensors", &len, &error);
    if (data == NULL) {
        *why = g_strdup(error ? error->message : "unreadable");
        g_clear_error(&error);
        return false;
    }
    if (len != hf_file_len) {
        *why = g_strdup_printf("%" G_GUINT64_FORMAT " bytes, the original has %" G_GSIZE_FORMAT, len,
                               hf_file_len);
        return false;
    }
    for (uint64_t i = 0; i < len; i++)
        if (data[i] != hf_file[i]) {
            *why = g_strdup_printf("differs from byte %" G_GUINT64_FORMAT, i);
            return false;
        }
    *why = g_strdup("identical");
    return true;
}

/* ------------------------------------------------------------------ the rank-file oracle */

/* Megatron's legacy layout, written out independently of core/model/mapping.c: which HF rows and
 * columns (or zero rows) make up each rank tensor. */
typedef struct {
    const Tensor *src; /* NULL: zero rows */
    uint64_t r0, r1, c0, c1;
} Rect;

typedef struct {
    GArray *rects; /* Rect, stacked by rows */
    uint64_t rows, cols;
} Expect;

static void expect_add(Expect *e, const Tensor *src, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1)
{
    Rect r = {src, r0, r1, c0, c1};
    g_array_append_val(e->rects, r);
    e->rows += r1 - r0;
    e->cols = c1 - c0;
}

static GByteArray *expect_bytes(const Expect *e)
{
    GByteArray *out = g_byte_array_new();
    for (guint i = 0; i < e->rects->len; i++) {
        const Rect *r = &g_array_index(e->rects, Rect, i);
        for (uint64_t row = r->r0; row < r->r1; row++) {
            if (r->src == NULL) {
                uint8_t zero[2 * HIDDEN * 4] = {0};
                g_byte_array_append(out, zero, (guint)(2 * (r->c1 - r->c0)));
            } else {
                uint64_t cols = r->src->ndim == 2 ? r->src->shape[1] : 1;
                g_byte_array_append(out, r->src->data + 2 * (row * cols + r->c0), (guint)(2 * (r->c1 - r->c0)));
            }
        }
    }
    return out;
}

/* Vocabulary rows of TP rank T out of a padded vocabulary of PADDED. */
static void expect_vocab(Expect *e, const Tensor *src, unsigned t, unsigned tp, uint64_t padded)
{
    uint64_t per = padded / tp, r0 = t * per, r1 = r0 + per;
    uint64_t real1 = MIN(r1, (uint64_t)VOCAB);
    if (r0 < real1)
        expect_add(e, src, r0, real1, 0, HIDDEN);
    uint64_t zero0 = MAX(r0, (uint64_t)VOCAB);
    if (zero0 < r1)
        expect_add(e, NULL, zero0, r1, 0, HIDDEN);
}

/* Reads rank tensor KEY of chunk dict DICT from an opened rank file into a row-major copy. */
static GByteArray *rank_tensor(const CkptfsSrcFiles *files, unsigned src, const CkptfsZip *zip,
                               const CkptfsPy *dict, const char *key, uint64_t *rows, uint64_t *cols)
{
    const CkptfsPy *v = ckptfs_py_dict_get(dict, key);
    if (v == NULL || v->kind != CKPTFS_PY_TENSOR || v->tensor->dtype != CKPTFS_DTYPE_BF16)
        return NULL;
    const CkptfsPyTensor *t = v->tensor;
    *rows = t->ndim ? t->shape[0] : 1;
    *cols = t->ndim == 2 ? t->shape[1] : 1;
    uint64_t stride = t->ndim == 2 ? t->stride[0] : 1;
    g_autofree char *record = g_strdup_printf("data/%s", t->storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(zip, record);
    if (e == NULL)
        return NULL;
    GByteArray *out = g_byte_array_sized_new((guint)(*rows * *cols * 2));
    g_byte_array_set_size(out, (guint)(*rows * *cols * 2));
    for (uint64_t r = 0; r < *rows; r++)
        if (!ckptfs_srcfiles_pread(files, src, out->data + r * *cols * 2, *cols * 2,
                                   e->data_offset + 2 * (t->offset + r * stride), NULL)) {
            g_byte_array_unref(out);
            return NULL;
        }
    return out;
}

/* Checks every weight of every rank file of an exported legacy view against the oracle. */
static void check_rank_files(const char *dir, unsigned tp, unsigned pp, unsigned vpp, bool te,
                             const char *what)
{
    const uint64_t padded = ((VOCAB + 128 * tp - 1) / (128 * tp)) * 128 * tp;
    const unsigned per_chunk = LAYERS / (pp * vpp);
    unsigned checked = 0, bad = 0, missing = 0;
    GString *problems = g_string_new(NULL);
    for (unsigned p = 0; p < pp; p++)
        for (unsigned t = 0; t < tp; t++) {
            g_autofree char *rank = pp > 1 ? g_strdup_printf("mp_rank_%02u_%03u", t, p)
                                           : g_strdup_printf("mp_rank_%02u", t);
            g_autofree char *path = g_build_filename(dir, "release", rank, "model_optim_rng.pt", NULL);
            CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
            int src = ckptfs_srcfiles_add(files, path, NULL);
            CkptfsZip *zip = src >= 0 ? ckptfs_zip_open(files, (unsigned)src, NULL) : NULL;
            GBytes *pkl = zip ? ckptfs_zip_read(zip, files, "data.pkl", 1u << 24, NULL) : NULL;
            CkptfsPickle *pickle = NULL;
            if (pkl) {
                gsize n;
                const uint8_t *d = g_bytes_get_data(pkl, &n);
                pickle = ckptfs_pickle_parse(path, d, n, NULL);
                g_bytes_unref(pkl);
            }
            const CkptfsPy *root = pickle ? ckptfs_pickle_root(pickle) : NULL;
            for (unsigned v = 0; root && v < vpp; v++) {
                char chunk_key[16] = "model";
                if (vpp > 1)
                    g_snprintf(chunk_key, sizeof chunk_key, "model%u", v);
                const CkptfsPy *dict = ckptfs_py_dict_get(root, chunk_key);
                GPtrArray *keys = g_ptr_array_new_with_free_func(g_free);
                GPtrArray *expects = g_ptr_array_new();
#define EXPECT(key_)                                                                          \
    (g_ptr_array_add(keys, (key_)), g_ptr_array_add(expects, g_new0(Expect, 1)),               \
     ((Expect *)g_ptr_array_index(expects, expects->len - 1))->rects = g_array_new(FALSE, FALSE, sizeof(Rect)), \
     (Expect *)g_ptr_array_index(expects, expects->len - 1))
                if (p == 0 && v == 0)
                    expect_vocab(EXPECT(g_strdup("embedding.word_embeddings.weight")),
                                 model_tensor("model.embed_tokens.weight"), t, tp, padded);
                for (unsigned local = 0; local < per_chunk; local++) {
                    /* Interleaved virtual pipeline: chunk v of stage p. */
                    unsigned g = v * (LAYERS / vpp) + p * per_chunk + local;
                    const unsigned groups = KV_HEADS / tp, q_per_group = HEADS / KV_HEADS;
                    Expect *e = EXPECT(g_strdup_printf("decoder.layers.%u.self_attention.linear_qkv.weight", local));
                    for (unsigned k = t * groups; k < (t + 1) * groups; k++) {
                        expect_add(e, layer_tensor(g, "self_attn.q_proj.weight"), k * q_per_group * HEAD_DIM,
                                   (k + 1) * q_per_group * HEAD_DIM, 0, HIDDEN);
                        expect_add(e, layer_tensor(g, "self_attn.k_proj.weight"), k * HEAD_DIM,
                                   (k + 1) * HEAD_DIM, 0, HIDDEN);
                        expect_add(e, layer_tensor(g, "self_attn.v_proj.weight"), k * HEAD_DIM,
                                   (k + 1) * HEAD_DIM, 0, HIDDEN);
                    }
                    e = EXPECT(g_strdup_printf("decoder.layers.%u.mlp.linear_fc1.weight", local));
                    expect_add(e, layer_tensor(g, "mlp.gate_proj.weight"), t * FFN / tp, (t + 1) * FFN / tp, 0, HIDDEN);
                    expect_add(e, layer_tensor(g, "mlp.up_proj.weight"), t * FFN / tp, (t + 1) * FFN / tp, 0, HIDDEN);
                    e = EXPECT(g_strdup_printf("decoder.layers.%u.self_attention.linear_proj.weight", local));
                    expect_add(e, layer_tensor(g, "self_attn.o_proj.weight"), 0, HIDDEN, t * Q_DIM / tp,
                               (t + 1) * Q_DIM / tp);
                    e = EXPECT(g_strdup_printf("decoder.layers.%u.mlp.linear_fc2.weight", local));
                    expect_add(e, layer_tensor(g, "mlp.down_proj.weight"), 0, HIDDEN, t * FFN / tp, (t + 1) * FFN / tp);
                    e = EXPECT(g_strdup_printf(te ? "decoder.layers.%u.self_attention.linear_qkv.layer_norm_weight"
                                                  : "decoder.layers.%u.input_layernorm.weight", local));
                    expect_add(e, layer_tensor(g, "input_layernorm.weight"), 0, HIDDEN, 0, 1);
                    e = EXPECT(g_strdup_printf(te ? "decoder.layers.%u.mlp.linear_fc1.layer_norm_weight"
                                                  : "decoder.layers.%u.pre_mlp_layernorm.weight", local));
                    expect_add(e, layer_tensor(g, "post_attention_layernorm.weight"), 0, HIDDEN, 0, 1);
                }
                if (p == pp - 1 && v == vpp - 1) {
                    expect_add(EXPECT(g_strdup("decoder.final_layernorm.weight")), model_tensor("model.norm.weight"),
                               0, HIDDEN, 0, 1);
                    expect_vocab(EXPECT(g_strdup("output_layer.weight")), model_tensor("lm_head.weight"), t, tp, padded);
                }
#undef EXPECT
                for (guint i = 0; i < keys->len; i++) {
                    const char *key = g_ptr_array_index(keys, i);
                    Expect *e = g_ptr_array_index(expects, i);
                    uint64_t rows = 0, cols = 0;
                    GByteArray *got = rank_tensor(files, (unsigned)src, zip, dict, key, &rows, &cols);
                    GByteArray *want = expect_bytes(e);
                    checked++;
                    if (got == NULL) {
                        missing++;
                        if (problems->len < 300)
                            g_string_append_printf(problems, " %s %s/%s missing;", rank, chunk_key, key);
                    } else if (rows != e->rows || cols != e->cols || got->len != want->len ||
                               memcmp(got->data, want->data, want->len) != 0) {
                        bad++;
                        if (problems->len < 300)
                            g_string_append_printf(problems, " %s %s/%s [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                                                   "] differs;", rank, chunk_key, key, rows, cols);
                    }
                    if (got)
                        g_byte_array_unref(got);
                    g_byte_array_unref(want);
                    g_array_unref(e->rects);
                    g_free(e);
                }
                g_ptr_array_unref(keys);
                g_ptr_array_unref(expects);
            }
            if (root == NULL) {
                missing++;
                g_string_append_printf(problems, " %s unreadable;", rank);
            }
            ckptfs_pickle_free(pickle);
            ckptfs_zip_free(zip);
            ckptfs_srcfiles_free(files);
        }
    tap_ok(checked > 0 && bad == 0 && missing == 0,
           "%s: all %u rank tensors equal Megatron's layout of the HF weights (computed here)%s",
           what, checked, problems->str);
    g_string_free(problems, TRUE);
}

/* ------------------------------------------------------------------ tests */

static CkptfsMount *orig_local, *orig_te;

static void test_original(void)
{
    GError *error = NULL;
    orig_local = open_mount(hf_dir, CKPTFS_SPEC_LOCAL, true, NULL, &error);
    tap_ok(orig_local != NULL, "the C-written HF checkpoint opens (%s)", error ? error->message : "ok");
    g_clear_error(&error);
    orig_te = open_mount(hf_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    g_clear_error(&error);
    if (orig_local == NULL || orig_te == NULL)
        return;
    tap_ok(orig_local->source->format == &ckptfs_format_hf && orig_local->model != NULL,
           "it is read as Hugging Face, with Megatron rules (%s)",
           orig_local->model_problem ? orig_local->model_problem : "llama");
    unsigned bad = 0;
    g_autofree char *why = compare_with_model(orig_local, &bad, NULL);
    tap_ok(why == NULL, "its catalog is the model written: names in order, shapes, bf16, bytes (%s)",
           why ? why : "equal");
    g_autofree char *same = NULL;
    bool is_original = hf_file_is_original(orig_local, &same);
    tap_ok(is_original, "hf/model.safetensors passes the file through (%s)", same);

    /* The root: listed views, a view made on lookup, a short name, an invalid layout. */
    CkptfsAttr a;
    bool listed = ckptfs_tree_resolve(orig_local->tree, "hf/config.json", &a, NULL) == 0 &&
                  ckptfs_tree_resolve(orig_local->tree, "mcore/release/metadata.json", &a, NULL) == 0 &&
                  ckptfs_tree_resolve(orig_local->tree, "tp2pp2/release/mp_rank_01_001/model_optim_rng.pt", &a,
                                      NULL) == 0;
    tap_ok(listed, "hf/, mcore/ and tp2pp2/ are there with their files");
    int rc = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp2", &a, NULL);
    const char *target = NULL;
    if (rc == 0)
        ckptfs_tree_readlink(orig_local->tree, a.ino, &target);
    tap_ok(rc == 0 && a.type == CKPTFS_NODE_SYMLINK && target && strcmp(target, "tp2pp1") == 0,
           "a short name (tp2) is a symlink to its canonical view (%s)", target ? target : "none");
    rc = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp8pp1", &a, &error);
    tap_ok(rc == -ENOENT && error != NULL, "tp8 with 4 heads is not a view: ENOENT (%s)",
           error ? error->message : "no reason");
    g_clear_error(&error);
    rc = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp3pp1", &a, &error);
    tap_ok(rc == -ENOENT && error != NULL, "tp3 with 2 query groups is not a view: ENOENT (%s)",
           error ? error->message : "no reason");
    g_clear_error(&error);
    rc = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp1pp3", &a, &error);
    tap_ok(rc == -ENOENT && error != NULL, "pp3 with 4 layers is not a view: ENOENT (%s)",
           error ? error->message : "no reason");
    g_clear_error(&error);
    /* Access: files as their source files allow, directories as the source directory. */
    g_autofree char *st_path = g_build_filename(hf_dir, "model.safetensors", NULL);
    struct stat file_st, dir_st;
    bool stat_ok = stat(st_path, &file_st) == 0 && stat(hf_dir, &dir_st) == 0;
    uint32_t dir_read = dir_st.st_mode & 0444;
    CkptfsAttr rank, root, view;
    bool access_ok =
        stat_ok && ckptfs_tree_resolve(orig_local->tree, "tp2pp2/release/mp_rank_00_000/model_optim_rng.pt", &rank, NULL) == 0 &&
        ckptfs_tree_resolve(orig_local->tree, "", &root, NULL) == 0 &&
        ckptfs_tree_resolve(orig_local->tree, "tp2pp2/release", &view, NULL) == 0;
    tap_ok(access_ok && rank.access.uid == file_st.st_uid && rank.access.gid == file_st.st_gid &&
               rank.access.mode == (file_st.st_mode & 0444),
           "a rank file reads as model.safetensors allows (%o, the file %o)", rank.access.mode,
           (unsigned)(file_st.st_mode & 0777));
    tap_ok(access_ok && root.access.uid == dir_st.st_uid && root.access.mode == (dir_read | (dir_read >> 2)) &&
               view.access.mode == root.access.mode,
           "directories take the source directory's owner and read+search bits (%o, the directory %o)",
           root.access.mode, (unsigned)(dir_st.st_mode & 0777));
    rc = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp2pp2vpp2", &a, NULL);
    uint64_t ino = a.ino;
    CkptfsAttr again;
    int rc2 = ckptfs_tree_lookup(orig_local->tree, CKPTFS_ROOT_INO, "tp2pp2vpp2", &again, NULL);
    tap_ok(rc == 0 && a.type == CKPTFS_NODE_DIR && rc2 == 0 && again.ino == ino,
           "tp2pp2vpp2 is made on lookup, once (same inode)");
}

typedef struct {
    CkptfsMount *from;
    const char *view;
    unsigned tp, pp, vpp;
    bool te;
    bool oracle; /* check the rank files against the oracle (which knows tp <= query groups) */
} ViewCase;

/* Exports VIEW of C->from into TOP/NAME and opens it. */
static CkptfsMount *export_and_open(CkptfsMount *from, const char *view, const char *name, bool args,
                                    const char *hf_config, char **dir_out)
{
    g_autofree char *dir = g_build_filename(top, name, NULL);
    GError *error = NULL;
    unsigned nfiles = 0;
    bool ok = export_dir(from, view, dir, &nfiles, &error);
    tap_ok(ok && nfiles > 0, "%s: %u files read through the tree and plans into %s (%s)", view, nfiles,
           name, error ? error->message : "ok");
    g_clear_error(&error);
    CkptfsMount *m = ok ? open_mount(dir, CKPTFS_SPEC_TE, args, hf_config, &error) : NULL;
    tap_ok(m != NULL, "%s: the copy opens as a source (%s)", name, error ? error->message : "ok");
    g_clear_error(&error);
    if (dir_out)
        *dir_out = g_steal_pointer(&dir);
    return m;
}

static void check_equal(CkptfsMount *m, const char *name)
{
    unsigned bad = 0;
    g_autofree char *why = compare_with_model(m, &bad, NULL);
    tap_ok(why == NULL, "%s: catalog equals the original: %u tensors, names in order, shapes, bf16, "
                        "bytes (%s)", name, model_tensors->len, why ? why : "equal");
    g_autofree char *cmp = compare_catalogs(m, orig_local);
    tap_ok(cmp == NULL, "%s: catalog equals the original source's catalog read through its own "
                        "files (%s)", name, cmp ? cmp : "equal");
    g_autofree char *same = NULL;
    bool is_original = hf_file_is_original(m, &same);
    tap_ok(is_original, "%s: its hf/model.safetensors is the original file (%s)", name, same);
}

static char *tp2pp2_dir; /* the local-spec tp2pp2 copy, for the negative cases */

static void test_legacy_views(void)
{
    const ViewCase cases[] = {
        {orig_local, "tp2pp2", 2, 2, 1, false, true},
        {orig_local, "tp2pp2vpp2", 2, 2, 2, false, true},
        {orig_te, "tp2pp2", 2, 2, 1, true, true},
        {orig_te, "tp1pp4", 1, 4, 1, true, true},
        {orig_te, "tp1pp2vpp2", 1, 2, 2, true, true},
        {orig_te, "tp4pp1", 4, 1, 1, true, false}, /* more ranks than query groups */
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        const ViewCase *c = &cases[i];
        g_autofree char *name = g_strdup_printf("%s-%s", c->view, c->te ? "te" : "local");
        char *dir = NULL;
        CkptfsMount *m = export_and_open(c->from, c->view, name, true, NULL, &dir);
        if (c->oracle)
            check_rank_files(dir, c->tp, c->pp, c->vpp, c->te, name);
        if (m) {
            const CkptfsLayout *s = &m->source->saved_layout;
            tap_ok(m->source->format == &ckptfs_format_megatron && s->tp == c->tp && s->pp == c->pp &&
                       s->vpp == c->vpp,
                   "%s: opened as a Megatron legacy checkpoint (%s) saved as tp%u pp%u vpp%u", name,
                   m->source->format ? m->source->format->name : "?", s->tp, s->pp, s->vpp);
            check_equal(m, name);
        }
        /* From the copy, on again: its own mcore/ and tp1pp1/ give the same weights. */
        if (m && i == 0) {
            for (int k = 0; k < 2; k++) {
                const char *view = k ? "tp1pp1" : "mcore";
                g_autofree char *name2 = g_strdup_printf("%s-then-%s", name, view);
                CkptfsMount *m2 = export_and_open(m, view, name2, true, NULL, NULL);
                if (m2)
                    check_equal(m2, name2);
                ckptfs_mount_free(m2);
            }
        }
        if (i == 0)
            tp2pp2_dir = g_strdup(dir);
        g_free(dir);
        ckptfs_mount_free(m);
    }

    /* Rank files without args: the sizes come from -o hf_config. */
    CkptfsOptions options;
    ckptfs_options_init(&options);
    options.megatron_args = false;
    GError *error = NULL;
    CkptfsMount *noargs = ckptfs_mount_open(hf_dir, &options, &error);
    ckptfs_options_clear(&options);
    if (noargs) {
        g_autofree char *dir = g_build_filename(top, "tp2pp2-noargs", NULL);
        unsigned nfiles = 0;
        bool ok = export_dir(noargs, "tp2pp2", dir, &nfiles, &error);
        g_clear_error(&error);
        CkptfsMount *m = ok ? open_mount(dir, CKPTFS_SPEC_TE, true, NULL, &error) : NULL;
        tap_ok(m == NULL && error != NULL, "rank files without args and no config are refused (%s)",
               error ? error->message : "opened");
        g_clear_error(&error);
        ckptfs_mount_free(m);
        g_autofree char *config = g_build_filename(hf_dir, "config.json", NULL);
        m = ok ? open_mount(dir, CKPTFS_SPEC_TE, true, config, &error) : NULL;
        tap_ok(m != NULL, "with -o hf_config they open (%s)", error ? error->message : "ok");
        g_clear_error(&error);
        if (m)
            check_equal(m, "tp2pp2-noargs");
        ckptfs_mount_free(m);
        ckptfs_mount_free(noargs);
    }
    g_clear_error(&error);
}

static void test_mcore_view(void)
{
    char *dir = NULL;
    CkptfsMount *m = export_and_open(orig_te, "mcore", "mcore", true, NULL, &dir);
    if (m == NULL) {
        g_free(dir);
        return;
    }
    tap_ok(m->source->format == &ckptfs_format_torch_dist, "mcore: opened as a torch_dist checkpoint (%s)",
           m->source->format ? m->source->format->name : "?");
    check_equal(m, "mcore");
    ckptfs_mount_free(m);

    /* A damaged copy: cut the .distcp file short. */
    g_autofree char *bad = g_build_filename(top, "mcore-cut", NULL);
    copy_tree(dir, bad);
    g_autofree char *release = g_build_filename(bad, "release", NULL);
    GDir *d = g_dir_open(release, 0, NULL);
    const char *name;
    g_autofree char *distcp = NULL;
    while (d && (name = g_dir_read_name(d)) != NULL)
        if (g_str_has_suffix(name, ".distcp") && distcp == NULL)
            distcp = g_strdup(name);
    if (d)
        g_dir_close(d);
    g_autofree char *path = distcp ? g_build_filename(release, distcp, NULL) : NULL;
    struct stat st;
    bool cut = path && stat(path, &st) == 0 && truncate(path, st.st_size / 2) == 0;
    GError *error = NULL;
    m = cut ? open_mount(bad, CKPTFS_SPEC_TE, true, NULL, &error) : NULL;
    tap_ok(cut && m == NULL && error && strstr(error->message, distcp),
           "mcore: a .distcp cut in half fails the open, naming it (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);
    g_free(dir);
}

/* A source's tensor piece: where its first byte is in which file. */
static bool first_piece_file(const CkptfsMount *m, const char *tensor, char **path, uint64_t *offset)
{
    const CkptfsTensor *t = ckptfs_catalog_find(m->source->catalog, tensor);
    if (t == NULL || t->npieces == 0)
        return false;
    const CkptfsSrcFile *f = ckptfs_srcfiles_get(m->source->files, t->pieces[0].src);
    *path = g_strdup(f->path);
    *offset = t->pieces[0].offset;
    return true;
}

static void test_negative(void)
{
    if (tp2pp2_dir == NULL) {
        tap_ok(false, "negative cases need the tp2pp2 copy");
        return;
    }
    GError *error = NULL;
    CkptfsMount *clean = open_mount(tp2pp2_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    g_clear_error(&error);
    if (clean == NULL) {
        tap_ok(false, "the tp2pp2 copy opens again");
        return;
    }

    /* 1. One tensor byte changed in a copy: the comparison must see it, in that tensor only. */
    const char *victim = "model.layers.2.mlp.up_proj.weight";
    g_autofree char *piece_path = NULL;
    uint64_t piece_offset = 0;
    bool found = first_piece_file(clean, victim, &piece_path, &piece_offset);
    g_autofree char *corrupt_dir = g_build_filename(top, "tp2pp2-corrupt", NULL);
    copy_tree(tp2pp2_dir, corrupt_dir);
    g_autofree char *rel = found && g_str_has_prefix(piece_path, tp2pp2_dir)
                               ? g_strdup(piece_path + strlen(tp2pp2_dir))
                               : NULL;
    g_autofree char *corrupt_file = rel ? g_strconcat(corrupt_dir, rel, NULL) : NULL;
    bool flipped = corrupt_file && flip_byte(corrupt_file, piece_offset + 1, 0x40);
    CkptfsMount *m = flipped ? open_mount(corrupt_dir, CKPTFS_SPEC_TE, true, NULL, &error) : NULL;
    g_clear_error(&error);
    unsigned bad = 0;
    g_autofree char *first_bad = NULL;
    g_autofree char *why = m ? compare_with_model(m, &bad, &first_bad) : NULL;
    tap_ok(m && why != NULL && bad == 1 && first_bad && strcmp(first_bad, victim) == 0,
           "a byte changed in a copied rank file's data (%s): the comparison finds exactly %s (%u "
           "tensor(s) differ: %s)", rel ? rel : "?", victim, bad, why ? why : "none");
    g_autofree char *cmp = m ? compare_catalogs(m, orig_local) : NULL;
    g_autofree char *same = NULL;
    bool is_original = m && hf_file_is_original(m, &same);
    tap_ok(m && cmp != NULL && !is_original,
           "... and so do the catalog comparison (%s) and hf/model.safetensors (%s)", cmp ? cmp : "equal",
           same ? same : "?");
    ckptfs_mount_free(m);
    ckptfs_mount_free(clean);

    /* 2. A damaged pickle: the PROTO opcode of one rank file's data.pkl. */
    const char *rank_rel = "release/mp_rank_01_001/model_optim_rng.pt";
    g_autofree char *flip_dir = g_build_filename(top, "tp2pp2-badpickle", NULL);
    copy_tree(tp2pp2_dir, flip_dir);
    g_autofree char *rank_file = g_build_filename(flip_dir, rank_rel, NULL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    int src = ckptfs_srcfiles_add(files, rank_file, NULL);
    CkptfsZip *zip = src >= 0 ? ckptfs_zip_open(files, (unsigned)src, NULL) : NULL;
    const CkptfsZipEntry *pkl = zip ? ckptfs_zip_find(zip, "data.pkl") : NULL;
    uint64_t pkl_offset = pkl ? pkl->data_offset : 0, pkl_size = pkl ? pkl->size : 0;
    ckptfs_zip_free(zip);
    ckptfs_srcfiles_free(files);
    gchar *orig_bytes = NULL;
    gsize orig_len = 0;
    g_file_get_contents(rank_file, &orig_bytes, &orig_len, NULL);
    flipped = pkl && flip_byte(rank_file, pkl_offset, 0xff);
    m = flipped ? open_mount(flip_dir, CKPTFS_SPEC_TE, true, NULL, &error) : NULL;
    tap_ok(flipped && m == NULL && error && strstr(error->message, "mp_rank_01_001/model_optim_rng.pt"),
           "a rank file whose pickle has a flipped byte fails the open, naming the file (%s)",
           error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);

    /* Bytes all through the pickle, one at a time: never a crash; a refusal names a rank file. */
    unsigned refused = 0, opened = 0, unnamed = 0;
    for (unsigned k = 0; pkl && k < 64; k++) {
        uint64_t pos = pkl_offset + (pkl_size * k) / 64;
        write_file(rank_file, orig_bytes, orig_len);
        flip_byte(rank_file, pos, (uint8_t)(1u << (k % 8)));
        m = open_mount(flip_dir, CKPTFS_SPEC_TE, true, NULL, &error);
        if (m)
            opened++;
        else if (error && strstr(error->message, "model_optim_rng.pt"))
            refused++;
        else if (unnamed++ == 0)
            tap_diag("byte %" G_GUINT64_FORMAT ": %s", pos - pkl_offset, error ? error->message : "no error");
        g_clear_error(&error);
        ckptfs_mount_free(m);
    }
    tap_ok(pkl && unnamed == 0 && refused > 0,
           "64 single-bit flips through data.pkl: %u refused naming a rank file, %u still open, %u "
           "refused without a file name", refused, opened, unnamed);

    /* 3. A rank file cut short. */
    write_file(rank_file, orig_bytes, orig_len);
    bool cut = truncate(rank_file, (off_t)(orig_len / 2)) == 0;
    m = cut ? open_mount(flip_dir, CKPTFS_SPEC_TE, true, NULL, &error) : NULL;
    tap_ok(cut && m == NULL && error && strstr(error->message, "mp_rank_01_001/model_optim_rng.pt"),
           "a rank file cut in half fails the open, naming the file (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);
    g_free(orig_bytes);

    /* 4. A hole in the grid. */
    g_autofree char *hole_dir = g_build_filename(top, "tp2pp2-hole", NULL);
    copy_tree(tp2pp2_dir, hole_dir);
    g_autofree char *gone = g_build_filename(hole_dir, "release", "mp_rank_01_001", NULL);
    rm_rf(gone);
    m = open_mount(hole_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    tap_ok(m == NULL && error && strstr(error->message, "mp_rank_01_001/model_optim_rng.pt") &&
               strstr(error->message, "hole"),
           "a missing rank directory is a hole in the grid, named (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);

    /* 5. A rank directory without its file. */
    g_mkdir_with_parents(gone, 0755);
    m = open_mount(hole_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    tap_ok(m == NULL && error && strstr(error->message, "mp_rank_01_001/model_optim_rng.pt"),
           "a rank directory without model_optim_rng.pt fails the open, naming the file (%s)",
           error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);

    /* 6. Args that disagree with the directory: tp 2 saved, only tp rank 0 present. */
    g_autofree char *tp1_dir = g_build_filename(top, "tp2pp2-tp1", NULL);
    copy_tree(tp2pp2_dir, tp1_dir);
    for (unsigned p = 0; p < 2; p++) {
        g_autofree char *r = g_strdup_printf("%s/release/mp_rank_01_%03u", tp1_dir, p);
        rm_rf(r);
    }
    m = open_mount(tp1_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    tap_ok(m == NULL && error && strstr(error->message, "args say tp 2 pp 2") &&
               strstr(error->message, "tp 1 x pp 2"),
           "args saying tp 2 over a tp 1 directory are refused (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);

    /* 7. A tracker naming an iteration that is not there. */
    g_autofree char *tracker_dir = g_build_filename(top, "tp2pp2-tracker", NULL);
    copy_tree(tp2pp2_dir, tracker_dir);
    g_autofree char *tracker = g_build_filename(tracker_dir, "latest_checkpointed_iteration.txt", NULL);
    write_file(tracker, "7", 1);
    m = open_mount(tracker_dir, CKPTFS_SPEC_TE, true, NULL, &error);
    tap_ok(m == NULL && error && strstr(error->message, "iter_0000007"),
           "a tracker naming a missing iteration fails the open, naming it (%s)",
           error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_mount_free(m);
}

static void tensor_free(gpointer p)
{
    Tensor *t = p;
    g_free(t->name);
    g_free(t->data);
    g_free(t);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(0x5eed2026);
    top = g_dir_make_tmp("ckptfs-roundtrip-XXXXXX", NULL);
    hf_dir = g_build_filename(top, "hf-source", NULL);
    make_model(rng);
    tap_ok(top && write_hf(hf_dir), "a %u-tensor Llama checkpoint written to %s", model_tensors->len,
           hf_dir);

    test_original();
    if (orig_local && orig_te) {
        test_legacy_views();
        test_mcore_view();
        test_negative();
    }

    ckptfs_mount_free(orig_local);
    ckptfs_mount_free(orig_te);
    if (g_getenv("CKPTFS_KEEP_TMP"))
        tap_note("kept %s", top);
    else
        rm_rf(top);
    g_free(tp2pp2_dir);
    g_free(top);
    g_free(hf_dir);
    g_free(hf_file);
    g_ptr_array_set_free_func(model_tensors, tensor_free);
    g_ptr_array_unref(model_tensors);
    g_rand_free(rng);
    return tap_done();
}
