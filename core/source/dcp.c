/* PyTorch distributed checkpoints: `.metadata` says, for every key, its global shape and chunks
 * and where each chunk's archive is; each chunk is a complete torch.save archive inside a
 * .distcp file. */
#include "dcp.h"

#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"

typedef struct {
    uint32_t src;
    uint64_t offset, length;
    const char *fqn;
} Span;

#define fail(d, ...) ckptfs_fail((d)->error, __VA_ARGS__)

void ckptfs_dcp_init(CkptfsDcp *dcp, CkptfsSrcFiles *files, const char *dir, GError **error)
{
    *dcp = (CkptfsDcp){.files = files, .error = error, .dir = g_strdup(dir),
                       .metadata_path = g_build_filename(dir, ".metadata", NULL),
                       .storage = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                       .file_srcs = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL),
                       .spans = g_array_new(FALSE, FALSE, sizeof(Span))};
}

void ckptfs_dcp_clear(CkptfsDcp *dcp)
{
    ckptfs_pickle_free(dcp->metadata);
    g_hash_table_unref(dcp->storage);
    g_hash_table_unref(dcp->file_srcs);
    g_array_unref(dcp->spans);
    g_free(dcp->metadata_path);
    g_free(dcp->dir);
    *dcp = (CkptfsDcp){0};
}

/* Reads and parses a whole small file (.metadata). */
static CkptfsPickle *parse_file(CkptfsDcp *d, const char *path, uint64_t max)
{
    int src = ckptfs_srcfiles_add(d->files, path, d->error);
    if (src < 0)
        return NULL;
    const CkptfsSrcFile *f = ckptfs_srcfiles_get(d->files, (unsigned)src);
    if (f->size > max) {
        fail(d, CKPTFS_ERROR_FORMAT, "%s: %" G_GUINT64_FORMAT " bytes is over the %" G_GUINT64_FORMAT
             " limit", path, f->size, max);
        return NULL;
    }
    g_autofree uint8_t *data = g_malloc(f->size ? f->size : 1);
    if (!ckptfs_srcfiles_pread(d->files, (unsigned)src, data, (size_t)f->size, 0, d->error))
        return NULL;
    return ckptfs_pickle_parse(path, data, (size_t)f->size, d->error);
}

CkptfsPickle *ckptfs_dcp_parse_archive(CkptfsDcp *d, CkptfsZip *zip, const char *what)
{
    GBytes *pkl = ckptfs_zip_read(zip, d->files, "data.pkl", CKPTFS_MAX_ARCHIVE_PICKLE_BYTES, d->error);
    if (pkl == NULL)
        return NULL;
    gsize n;
    const uint8_t *data = g_bytes_get_data(pkl, &n);
    g_autofree char *name = g_strdup_printf("%s: data.pkl", what);
    CkptfsPickle *p = ckptfs_pickle_parse(name, data, n, d->error);
    g_bytes_unref(pkl);
    return p;
}

static char *storage_tag(const char *fqn, const uint64_t *offsets, unsigned n)
{
    g_autofree char *dims = ckptfs_dims_text(offsets, n);
    return g_strdup_printf("%s\n%s", fqn, dims);
}

/* Indexes storage_data: (fqn, chunk offsets) -> where the chunk's archive is. */
static bool index_storage(CkptfsDcp *d, const CkptfsPy *storage)
{
    if (storage == NULL || storage->kind != CKPTFS_PY_DICT)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: no storage_data dict", d->metadata_path);
    for (guint i = 0; i + 1 < storage->items->len; i += 2) {
        const CkptfsPy *index = ckptfs_py_object_state(g_ptr_array_index(storage->items, i));
        const CkptfsPy *info = ckptfs_py_object_state(g_ptr_array_index(storage->items, i + 1));
        const char *fqn = ckptfs_py_str(ckptfs_py_dict_get(index, "fqn"));
        if (fqn == NULL || info == NULL)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: storage_data entry %u is not a MetadataIndex -> "
                        "_StorageInfo pair", d->metadata_path, i / 2);
        uint64_t offsets[CKPTFS_MAX_DIMS];
        unsigned n = 0;
        const CkptfsPy *off = ckptfs_py_dict_get(index, "offset");
        if (off && off->kind != CKPTFS_PY_NONE && !ckptfs_py_dims(off, offsets, &n))
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: storage_data entry for '%s' has a bad offset",
                        d->metadata_path, fqn);
        g_hash_table_replace(d->storage, storage_tag(fqn, offsets, n), (gpointer)info);
    }
    return true;
}

bool ckptfs_dcp_read_metadata(CkptfsDcp *d)
{
    d->metadata = parse_file(d, d->metadata_path, CKPTFS_MAX_DCP_METADATA_BYTES);
    if (d->metadata == NULL)
        return false;
    const CkptfsPy *root = ckptfs_pickle_root(d->metadata);
    const CkptfsPy *state = ckptfs_py_object_state(root);
    if (root->kind != CKPTFS_PY_OBJECT ||
        !ckptfs_py_is_global(root->callable, "torch.distributed.checkpoint.metadata", "Metadata") ||
        state == NULL)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: not a torch.distributed.checkpoint Metadata", d->metadata_path);
    d->state_dict_metadata = ckptfs_py_dict_get(state, "state_dict_metadata");
    if (d->state_dict_metadata == NULL || d->state_dict_metadata->kind != CKPTFS_PY_DICT)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: no state_dict_metadata dict", d->metadata_path);
    const CkptfsPy *planner = ckptfs_py_dict_get(state, "planner_data");
    d->planner_data = planner && planner->kind == CKPTFS_PY_DICT ? planner : NULL;
    return index_storage(d, ckptfs_py_dict_get(state, "storage_data"));
}

CkptfsDtype ckptfs_dcp_tensor_dtype(const CkptfsPy *st)
{
    const CkptfsPy *props = ckptfs_py_object_state(ckptfs_py_dict_get(st, "properties"));
    const CkptfsPy *dtype = props && props->kind == CKPTFS_PY_TUPLE && props->items->len > 0
                                ? g_ptr_array_index(props->items, 0)
                                : NULL;
    return dtype && dtype->kind == CKPTFS_PY_GLOBAL && strcmp(dtype->module, "torch") == 0
               ? ckptfs_dtype_from_torch_name(dtype->name)
               : CKPTFS_DTYPE_INVALID;
}

bool ckptfs_dcp_chunk_box(CkptfsDcp *d, const char *key, const CkptfsPy *chunks, guint c,
                          const uint64_t *shape, unsigned n, uint64_t *off, uint64_t *size)
{
    const CkptfsPy *cs = ckptfs_py_object_state(g_ptr_array_index(chunks->items, c));
    unsigned no = 0, ns = 0;
    if (!ckptfs_py_dims(ckptfs_py_dict_get(cs, "offsets"), off, &no) ||
        !ckptfs_py_dims(ckptfs_py_dict_get(cs, "sizes"), size, &ns) || no != n || ns != n)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: '%s' chunk %u has no offsets/sizes of rank %u",
                    d->metadata_path, key, c, n);
    for (unsigned i = 0; i < n; i++)
        if (size[i] == 0 || off[i] > shape[i] || size[i] > shape[i] - off[i]) {
            g_autofree char *o = ckptfs_dims_text(off, n), *s = ckptfs_dims_text(size, n), *g = ckptfs_dims_text(shape, n);
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: '%s' chunk at %s of size %s lies outside %s",
                        d->metadata_path, key, o, s, g);
        }
    return true;
}

/* The source file of a chunk archive, by its relative path (a plain name in the directory). */
static bool chunk_file(CkptfsDcp *d, const char *fqn, const char *rel, uint32_t *src)
{
    if (rel == NULL || *rel == '\0' || strchr(rel, '/') || strcmp(rel, ".") == 0 || strcmp(rel, "..") == 0)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: '%s': relative_path '%s' is not a file name in the "
                    "checkpoint directory", d->metadata_path, fqn, rel ? rel : "(none)");
    gpointer known = g_hash_table_lookup(d->file_srcs, rel);
    if (known) {
        *src = GPOINTER_TO_UINT(known) - 1;
        return true;
    }
    g_autofree char *path = g_build_filename(d->dir, rel, NULL);
    const char *problem = ckptfs_path_problem(path);
    if (problem != NULL)
        return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s: %s (it holds chunks of '%s')", path, problem, fqn);
    int s = ckptfs_srcfiles_add(d->files, path, d->error);
    if (s < 0)
        return false;
    g_hash_table_insert(d->file_srcs, g_strdup(rel), GUINT_TO_POINTER((unsigned)s + 1));
    *src = (uint32_t)s;
    return true;
}

bool ckptfs_dcp_locate_chunk(CkptfsDcp *d, const char *fqn, const uint64_t *offsets, const uint64_t *sizes,
                             unsigned n, CkptfsDtype dtype, CkptfsDcpChunk *out)
{
    g_autofree char *tag = storage_tag(fqn, offsets, n);
    g_autofree char *where = ckptfs_dims_text(offsets, n);
    const CkptfsPy *info = g_hash_table_lookup(d->storage, tag);
    if (info == NULL)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: '%s' chunk at %s has no storage_data entry",
                    d->metadata_path, fqn, where);
    const CkptfsPy *off = ckptfs_py_dict_get(info, "offset"), *len = ckptfs_py_dict_get(info, "length");
    if (off == NULL || len == NULL || off->kind != CKPTFS_PY_INT || len->kind != CKPTFS_PY_INT ||
        off->big || len->big || off->i < 0 || len->i <= 0) {
        bool off_ok = off && off->kind == CKPTFS_PY_INT && !off->big && off->i >= 0;
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: '%s' chunk at %s: its storage_data %s is not %s",
                    d->metadata_path, fqn, where, off_ok ? "length" : "offset",
                    off_ok ? "a positive integer" : "an integer of at least 0");
    }
    uint32_t src = 0;
    const char *rel = ckptfs_py_str(ckptfs_py_dict_get(info, "relative_path"));
    if (!chunk_file(d, fqn, rel, &src))
        return false;
    g_autofree char *what = g_strdup_printf("%s/%s: '%s' chunk at %s (archive at %" G_GINT64_FORMAT ")",
                                            d->dir, rel, fqn, where, off->i);
    CkptfsZip *zip = ckptfs_zip_open_range(d->files, src, (uint64_t)off->i, (uint64_t)len->i, what, d->error);
    if (zip == NULL)
        return false;
    Span span = {src, (uint64_t)off->i, (uint64_t)len->i, fqn};
    g_array_append_val(d->spans, span);
    CkptfsPickle *p = ckptfs_dcp_parse_archive(d, zip, what);
    bool ok = p != NULL;
    const CkptfsPy *v = p ? ckptfs_pickle_root(p) : NULL;
    size_t isz = ckptfs_dtype_size(dtype);
    uint64_t numel = 0, offset = v && v->kind == CKPTFS_PY_TENSOR ? v->tensor->offset : 0;
    if (ok && !ckptfs_dims_product(sizes, n, &numel)) {
        g_autofree char *shape = ckptfs_dims_text(sizes, n);
        ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: shape %s overflows 64 bits", what, shape);
    }
    if (ok && (v->kind != CKPTFS_PY_TENSOR || v->tensor->ndim != n ||
               memcmp(v->tensor->shape, sizes, n * sizeof *sizes) != 0)) {
        g_autofree char *want = ckptfs_dims_text(sizes, n);
        ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: not a tensor of the chunk's shape %s", what, want);
    }
    if (ok && v->tensor->dtype != dtype)
        ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: holds %s, .metadata says %s", what,
                  ckptfs_dtype_safetensors_name(v->tensor->dtype), ckptfs_dtype_safetensors_name(dtype));
    uint64_t expect = 1;
    for (unsigned i = n; ok && i-- > 0;) {
        if (sizes[i] > 1 && v->tensor->stride[i] != expect)
            ok = fail(d, CKPTFS_ERROR_UNSUPPORTED, "%s: the tensor is not stored contiguously", what);
        expect *= sizes[i];
    }
    if (ok) {
        g_autofree char *record = g_strdup_printf("data/%s", v->tensor->storage_key);
        const CkptfsZipEntry *e = ckptfs_zip_find(zip, record);
        uint64_t end = 0;
        if (e == NULL)
            ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: its record %s is missing", what, record);
        else if (!ckptfs_elements_end(offset, numel, isz, &end))
            ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: storage offset %" G_GUINT64_FORMAT " + %" G_GUINT64_FORMAT
                      " elements of %zu bytes overflows 64 bits", what, offset, numel, isz);
        else if (end > e->size)
            ok = fail(d, CKPTFS_ERROR_FORMAT, "%s: elements [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                      ") need %" G_GUINT64_FORMAT " bytes but its record %s has %" G_GUINT64_FORMAT,
                      what, offset, offset + numel, end, record, e->size);
        else
            *out = (CkptfsDcpChunk){src, e->data_offset + offset * isz}; /* offset * isz <= end */
    }
    ckptfs_pickle_free(p);
    ckptfs_zip_free(zip);
    return ok;
}

static gint cmp_span(gconstpointer a, gconstpointer b)
{
    const Span *x = a, *y = b;
    if (x->src != y->src)
        return x->src < y->src ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

bool ckptfs_dcp_check_overlaps(CkptfsDcp *d)
{
    g_array_sort(d->spans, cmp_span);
    for (guint i = 1; i < d->spans->len; i++) {
        const Span *a = &g_array_index(d->spans, Span, i - 1), *b = &g_array_index(d->spans, Span, i);
        if (a->src == b->src && a->offset + a->length > b->offset)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: the archives of '%s' (at %" G_GUINT64_FORMAT
                        ") and '%s' (at %" G_GUINT64_FORMAT ") overlap",
                        ckptfs_srcfiles_get(d->files, a->src)->path, a->fqn, a->offset,
                        b->fqn, b->offset);
    }
    return true;
}

unsigned ckptfs_dcp_file_count(const CkptfsDcp *d)
{
    return g_hash_table_size(d->file_srcs);
}
