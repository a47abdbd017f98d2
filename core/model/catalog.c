#include "ckptfs/catalog.h"

#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"

struct CkptfsCatalog {
    GPtrArray *tensors;  /* CkptfsTensor*, source order */
    GHashTable *by_name; /* name -> CkptfsTensor* */
    uint64_t total_bytes;
};

static void tensor_free(gpointer data)
{
    CkptfsTensor *t = data;
    g_free(t->name);
    g_free(t->pieces);
    g_free(t->scale);
    g_free(t->mxfp4);
    g_free(t);
}

guint ckptfs_name_hash(gconstpointer name)
{
    /* Eight bytes a step (g_str_hash takes one): a 1T model's ~140k names of ~55 bytes are
     * hashed ~15 times each while it mounts. */
    const char *p = name;
    size_t n = strlen(p);
    uint64_t h = 0x9e3779b97f4a7c15u ^ n;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdu;
        h ^= h >> 32;
    }
    uint64_t tail = 0;
    memcpy(&tail, p, n);
    h = (h ^ tail) * 0xc4ceb9fe1a85ec53u;
    h ^= h >> 29;
    return (guint)h;
}

CkptfsCatalog *ckptfs_catalog_new(void)
{
    CkptfsCatalog *c = g_new0(CkptfsCatalog, 1);
    c->tensors = g_ptr_array_new_with_free_func(tensor_free);
    c->by_name = g_hash_table_new(ckptfs_name_hash, g_str_equal);
    return c;
}

void ckptfs_catalog_free(CkptfsCatalog *catalog)
{
    if (catalog == NULL)
        return;
    g_hash_table_unref(catalog->by_name);
    g_ptr_array_unref(catalog->tensors);
    g_free(catalog);
}

const CkptfsTensor *ckptfs_catalog_add_pieces(CkptfsCatalog *catalog, const char *name,
                                              CkptfsDtype dtype, unsigned ndim,
                                              const uint64_t *shape, const CkptfsPiece *pieces,
                                              unsigned npieces, GError **error)
{
    return ckptfs_catalog_add_reshaped(catalog, name, dtype, dtype, ndim, shape, 0, pieces, npieces, error);
}

/* A tensor of ROWS x COLS elements (their product within 64 bits with 8 bytes each), no pieces. */
static CkptfsTensor *tensor_new(const char *name, CkptfsDtype dtype, CkptfsDtype stored, unsigned ndim,
                                const uint64_t *shape, uint64_t rows, uint64_t cols)
{
    CkptfsTensor *t = g_new0(CkptfsTensor, 1);
    t->name = g_strdup(name);
    t->dtype = dtype;
    t->stored = stored;
    t->ndim = ndim;
    memcpy(t->shape, shape, ndim * sizeof *shape);
    t->rows = rows;
    t->cols = cols;
    t->nbytes = rows * cols * ckptfs_dtype_size(dtype);
    return t;
}

static const CkptfsTensor *tensor_insert(CkptfsCatalog *catalog, CkptfsTensor *t)
{
    g_ptr_array_add(catalog->tensors, t);
    g_hash_table_insert(catalog->by_name, t->name, t);
    if (!ckptfs_add_u64(catalog->total_bytes, t->nbytes, &catalog->total_bytes))
        catalog->total_bytes = UINT64_MAX; /* only shown; every tensor's own size is exact */
    return t;
}

const CkptfsTensor *ckptfs_catalog_add_reshaped(CkptfsCatalog *catalog, const char *name, CkptfsDtype dtype,
                                                CkptfsDtype stored, unsigned ndim, const uint64_t *shape,
                                                uint64_t view_rows, const CkptfsPiece *pieces, unsigned npieces,
                                                GError **error)
{
    if (g_hash_table_contains(catalog->by_name, name)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s' is given twice", name);
        return NULL;
    }
    /* Sources check their numbers; these checks keep the catalog's own arithmetic (and every
     * read that follows from it) from wrapping whatever a source let through. */
    size_t isz = ckptfs_dtype_size(stored); /* pieces address stored bytes */
    uint64_t numel = 0, nbytes = 0, rows = ndim > 0 ? shape[0] : 1, cols = 1;
    if (!ckptfs_dims_product(shape, ndim, &numel) ||
        !ckptfs_mul_u64(numel, MAX(isz, ckptfs_dtype_size(dtype)), &nbytes) ||
        (ndim > 1 && !ckptfs_dims_product(shape + 1, ndim - 1, &cols))) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s': its %u-dimensional shape overflows 64 bits", name, ndim);
        return NULL;
    }
    if (view_rows != 0) {
        if (numel % view_rows != 0) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s': %" G_GUINT64_FORMAT
                        " elements are not %" G_GUINT64_FORMAT " rows", name, numel, view_rows);
            return NULL;
        }
        rows = view_rows, cols = numel / view_rows;
    }
    uint64_t covered = 0;
    for (unsigned i = 0; i < npieces; i++) {
        const CkptfsPiece *a = &pieces[i];
        uint64_t end, last_row, last_col;
        bool inside = a->row0 < a->row1 && a->col0 < a->col1 && a->row1 <= rows && a->col1 <= cols &&
                      (a->col1 - a->col0 - 1) % MAX(a->col_step, 1u) == 0; /* col1 - 1 is its last column */
        uint64_t a_cols = inside ? ckptfs_piece_cols(a) : 0;
        bool wraps = inside && (a->col_stride == 0
                                    ? !ckptfs_rows_end(a->offset, a->row1 - a->row0, a->row_stride, a_cols * isz, 1,
                                                       &end)
                                    /* strided: the end of its last row's last element */
                                    : !ckptfs_offset_at(a->offset, a->row1 - a->row0 - 1, a->row_stride, &last_row) ||
                                          !ckptfs_mul_u64(a_cols - 1, a->col_stride, &last_col) ||
                                          !ckptfs_add_u64(last_row, last_col, &end) ||
                                          !ckptfs_add_u64(end, isz, &end));
        if (wraps) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "tensor '%s': piece of %" G_GUINT64_FORMAT " rows %" G_GUINT64_FORMAT
                        " bytes apart from offset %" G_GUINT64_FORMAT " overflows 64 bits",
                        name, a->row1 - a->row0, a->row_stride, a->offset);
            return NULL;
        }
        for (unsigned j = 0; inside && j < i; j++) {
            const CkptfsPiece *b = &pieces[j];
            /* pieces interleaved alike (one step) whose columns start apart hold none in common */
            uint64_t step = MAX(a->col_step, 1u);
            bool interleaved = a->col_step == b->col_step && step > 1 &&
                               (MAX(a->col0, b->col0) - MIN(a->col0, b->col0)) % step != 0;
            inside = a->row1 <= b->row0 || b->row1 <= a->row0 || a->col1 <= b->col0 ||
                     b->col1 <= a->col0 || interleaved;
        }
        if (!inside) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "tensor '%s': piece rows [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        ") x columns [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                        ") is outside the tensor or overlaps another piece",
                        name, a->row0, a->row1, a->col0, a->col1);
            return NULL;
        }
        covered += (a->row1 - a->row0) * a_cols; /* disjoint, inside: <= numel */
    }
    if (covered != rows * cols) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s': pieces cover %" G_GUINT64_FORMAT " of %" G_GUINT64_FORMAT
                    " elements (a rank file or chunk is missing)",
                    name, covered, rows * cols);
        return NULL;
    }
    CkptfsTensor *t = tensor_new(name, dtype, stored, ndim, shape, rows, cols);
    t->npieces = npieces;
    t->pieces = g_memdup2(pieces, npieces * sizeof *pieces);
    return tensor_insert(catalog, t);
}

uint64_t ckptfs_piece_cols(const CkptfsPiece *piece)
{
    uint64_t step = MAX(piece->col_step, 1u);
    return (piece->col1 - piece->col0 + step - 1) / step;
}

const CkptfsTensor *ckptfs_catalog_add_contiguous(CkptfsCatalog *catalog, const char *name,
                                                  CkptfsDtype dtype, unsigned ndim,
                                                  const uint64_t *shape, uint32_t src,
                                                  uint64_t offset)
{
    uint64_t numel = 0, rows = ndim > 0 ? shape[0] : 1, cols = 1;
    if (!ckptfs_dims_product(shape, ndim, &numel) || (ndim > 1 && !ckptfs_dims_product(shape + 1, ndim - 1, &cols)))
        return NULL; /* the source parser refuses such shapes first */
    if (numel == 0) /* an empty tensor has no piece to tile it */
        return ckptfs_catalog_add_pieces(catalog, name, dtype, ndim, shape, NULL, 0, NULL);
    CkptfsPiece whole = {.row0 = 0, .row1 = rows, .col0 = 0, .col1 = cols, .src = src,
                         .offset = offset, .row_stride = cols * ckptfs_dtype_size(dtype)};
    return ckptfs_catalog_add_pieces(catalog, name, dtype, ndim, shape, &whole, 1, NULL);
}

bool ckptfs_catalog_set_block_scale(CkptfsCatalog *catalog, const char *name, const char *scale,
                                    unsigned block_rows, unsigned block_cols, GError **error)
{
    CkptfsTensor *t = g_hash_table_lookup(catalog->by_name, name);
    const CkptfsTensor *s = g_hash_table_lookup(catalog->by_name, scale);
    g_assert(t != NULL && s != NULL && block_rows > 0 && block_cols > 0);
    uint64_t want_rows = t->rows / block_rows + (t->rows % block_rows != 0);
    uint64_t want_cols = t->cols / block_cols + (t->cols % block_cols != 0);
    if (t->ndim != 2 || (t->stored != CKPTFS_DTYPE_F8_E4M3 && t->stored != CKPTFS_DTYPE_F8_E5M2)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s' has block scales ('%s') but is not an "
                    "FP8 matrix", name, scale);
        return false;
    }
    for (unsigned p = 0; p < t->npieces; p++)
        if ((t->pieces[p].col_stride != 0 && t->pieces[p].col_stride != 1) || t->pieces[p].col_step > 1) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s' has block scales ('%s') but is "
                        "stored transposed or interleaved: not dequantised", name, scale);
            return false;
        }
    if (s->stored != CKPTFS_DTYPE_F32 || s->ndim != 2 || s->rows != want_rows || s->cols != want_cols ||
        s->npieces != 1 || (s->pieces[0].col_stride != 0 && s->pieces[0].col_stride != 4)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s': its scales '%s' are %s [%" G_GUINT64_FORMAT
                    ", %" G_GUINT64_FORMAT "]; %ux%u blocks of [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] need F32 [%"
                    G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]", name, scale, ckptfs_dtype_safetensors_name(s->stored),
                    s->rows, s->cols, block_rows, block_cols, t->rows, t->cols, want_rows, want_cols);
        return false;
    }
    g_free(t->scale);
    t->scale = g_new0(CkptfsBlockScale, 1);
    *t->scale = (CkptfsBlockScale){.src = s->pieces[0].src, .base = s->pieces[0].offset,
                                   .row_stride = s->pieces[0].row_stride, .rows = s->rows, .cols = s->cols,
                                   .block_rows = block_rows, .block_cols = block_cols};
    return true;
}

/* "[2, 64, 2, 16]" */
static char *shape_text(const CkptfsTensor *t)
{
    GString *s = g_string_new("[");
    for (unsigned d = 0; d < t->ndim; d++)
        g_string_append_printf(s, "%s%" G_GUINT64_FORMAT, d ? ", " : "", t->shape[d]);
    return g_string_free(g_string_append_c(s, ']'), FALSE);
}

/* Whether T is stored whole, row-major, in one piece (as a Hugging Face file holds a tensor). */
static bool stored_whole(const CkptfsTensor *t)
{
    return t->npieces == 1 && t->pieces[0].col_stride == 0 && t->pieces[0].row_stride == t->cols;
}

const CkptfsTensor *ckptfs_catalog_add_mxfp4(CkptfsCatalog *catalog, const char *name, const char *blocks,
                                             const char *scales, GError **error)
{
    const CkptfsTensor *b = g_hash_table_lookup(catalog->by_name, blocks);
    const CkptfsTensor *s = g_hash_table_lookup(catalog->by_name, scales);
    g_assert(b != NULL && s != NULL);
    g_autofree char *b_shape = shape_text(b), *s_shape = shape_text(s);
    if (b->stored != CKPTFS_DTYPE_U8 || b->ndim != 4 || b->shape[3] != 16 || b->shape[2] == 0 ||
        b->shape[2] > UINT64_MAX / CKPTFS_MXFP4_GROUP) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "MXFP4 blocks '%s' are %s %s: they must be U8 [E, R, "
                    "C/32, 16] (16 bytes of 32 FP4 codes a group)", blocks, ckptfs_dtype_safetensors_name(b->stored),
                    b_shape);
        return NULL;
    }
    if (s->stored != CKPTFS_DTYPE_U8 || s->ndim != 3 || memcmp(s->shape, b->shape, 3 * sizeof *s->shape) != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "MXFP4 scales '%s' are %s %s: blocks '%s' %s need U8 "
                    "[%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] (one E8M0 scale a group)",
                    scales, ckptfs_dtype_safetensors_name(s->stored), s_shape, blocks, b_shape, b->shape[0],
                    b->shape[1], b->shape[2]);
        return NULL;
    }
    if (!stored_whole(b) || !stored_whole(s)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "MXFP4 blocks '%s' or scales '%s' are not stored whole "
                    "in one file: not dequantised", blocks, scales);
        return NULL;
    }
    if (g_hash_table_contains(catalog->by_name, name)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s' is given beside its MXFP4 blocks '%s'",
                    name, blocks);
        return NULL;
    }
    uint64_t experts = b->shape[0], rows = b->shape[1], cols = b->shape[2] * CKPTFS_MXFP4_GROUP, numel = 0;
    uint64_t shape[3] = {experts, cols, rows};
    if (!ckptfs_dims_product(shape, 3, &numel) || numel > UINT64_MAX / 8) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "MXFP4 blocks '%s' %s: the tensor overflows 64 bits",
                    blocks, b_shape);
        return NULL;
    }
    CkptfsTensor *t = tensor_new(name, CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_U8, 3, shape, experts * cols, rows);
    t->mxfp4 = g_new0(CkptfsMxfp4, 1);
    *t->mxfp4 = (CkptfsMxfp4){.blocks_src = b->pieces[0].src, .blocks_base = b->pieces[0].offset,
                              .scales_src = s->pieces[0].src, .scales_base = s->pieces[0].offset, .cols = cols,
                              .row_step = 1, .transposed = true};
    return tensor_insert(catalog, t);
}

const CkptfsTensor *ckptfs_catalog_add_mxfp4_rows(CkptfsCatalog *catalog, const char *name, const CkptfsTensor *from,
                                                  uint64_t row0, uint64_t row_step, uint64_t rows, GError **error)
{
    const CkptfsMxfp4 *m = from->mxfp4;
    uint64_t stored_rows = from->shape[0] * from->shape[2]; /* E x R of the served [E, C, R] */
    if (m == NULL || !m->transposed || rows == 0 || row_step == 0 || row0 >= stored_rows ||
        (rows - 1) > (stored_rows - 1 - row0) / row_step) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s': %" G_GUINT64_FORMAT " rows from stored row %"
                    G_GUINT64_FORMAT " every %" G_GUINT64_FORMAT " are not within MXFP4 tensor '%s'", name, rows, row0,
                    row_step, from->name);
        return NULL;
    }
    if (g_hash_table_contains(catalog->by_name, name)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "tensor '%s' is given twice", name);
        return NULL;
    }
    uint64_t shape[2] = {rows, m->cols};
    CkptfsTensor *t = tensor_new(name, CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_U8, 2, shape, rows, m->cols);
    t->mxfp4 = g_new0(CkptfsMxfp4, 1);
    *t->mxfp4 = (CkptfsMxfp4){.blocks_src = m->blocks_src, .blocks_base = m->blocks_base, .scales_src = m->scales_src,
                              .scales_base = m->scales_base, .cols = m->cols, .row0 = row0, .row_step = row_step};
    return tensor_insert(catalog, t);
}

void ckptfs_catalog_remove(CkptfsCatalog *catalog, GHashTable *names)
{
    guint kept = 0;
    for (guint i = 0; i < catalog->tensors->len; i++) {
        CkptfsTensor *t = g_ptr_array_index(catalog->tensors, i);
        if (g_hash_table_contains(names, t->name)) {
            g_hash_table_remove(catalog->by_name, t->name);
            catalog->total_bytes -= MIN(t->nbytes, catalog->total_bytes);
            tensor_free(t);
        } else {
            catalog->tensors->pdata[kept++] = t;
        }
    }
    /* The freed ones are gone: shrink without the free function seeing them again. */
    g_ptr_array_set_free_func(catalog->tensors, NULL);
    g_ptr_array_set_size(catalog->tensors, kept);
    g_ptr_array_set_free_func(catalog->tensors, tensor_free);
}

/* Serves tensors as TO where a conversion exists (with SCALED_ONLY, block-scaled FP8 alone;
 * tensors KEEP says stay as stored). */
static unsigned serve_as(CkptfsCatalog *catalog, CkptfsDtype to, bool scaled_only, bool (*keep)(const char *name))
{
    unsigned converted = 0;
    catalog->total_bytes = 0;
    for (guint i = 0; i < catalog->tensors->len; i++) {
        CkptfsTensor *t = g_ptr_array_index(catalog->tensors, i);
        CkptfsDtype serve = t->stored == to || ckptfs_convert_find(t->stored, to) ? to : t->stored;
        if (t->mxfp4 != NULL) /* MXFP4: bf16 only */
            serve = t->dtype;
        else if (t->scale != NULL) /* block-scaled FP8: to bf16 only, or as stored */
            serve = to == CKPTFS_DTYPE_BF16 ? to : t->stored;
        else if (scaled_only || (keep && keep(t->name)) || t->shift) /* a shifted one: as stored */
            serve = t->dtype;
        /* Fewer or as many bytes per element as stored (bf16 from fp32), or twice as many from
         * sizes already checked against 64 bits with 8-byte elements to spare. */
        t->dtype = serve;
        t->nbytes = t->rows * t->cols * ckptfs_dtype_size(serve);
        converted += serve != t->stored;
        if (!ckptfs_add_u64(catalog->total_bytes, t->nbytes, &catalog->total_bytes))
            catalog->total_bytes = UINT64_MAX;
    }
    return converted;
}

CkptfsCatalog *ckptfs_catalog_copy(const CkptfsCatalog *catalog)
{
    CkptfsCatalog *c = ckptfs_catalog_new();
    for (guint i = 0; i < catalog->tensors->len; i++) {
        const CkptfsTensor *from = g_ptr_array_index(catalog->tensors, i);
        CkptfsTensor *t = g_memdup2(from, sizeof *t);
        t->name = g_strdup(from->name);
        t->pieces = g_memdup2(from->pieces, from->npieces * sizeof *from->pieces);
        t->scale = from->scale ? g_memdup2(from->scale, sizeof *from->scale) : NULL;
        t->mxfp4 = from->mxfp4 ? g_memdup2(from->mxfp4, sizeof *from->mxfp4) : NULL;
        g_ptr_array_add(c->tensors, t);
        g_hash_table_insert(c->by_name, t->name, t);
    }
    c->total_bytes = catalog->total_bytes;
    return c;
}

char *ckptfs_name_renamed(const char *name, const char *const *prefixes)
{
    for (const char *const *p = prefixes; p && p[0] && p[1]; p += 2)
        if (g_str_has_prefix(name, p[0]))
            return g_strconcat(p[1], name + strlen(p[0]), NULL);
    return g_strdup(name);
}

bool ckptfs_catalog_rename(CkptfsCatalog *catalog, const char *const *prefixes, char **clash)
{
    g_hash_table_remove_all(catalog->by_name);
    for (guint i = 0; i < catalog->tensors->len; i++) {
        CkptfsTensor *t = g_ptr_array_index(catalog->tensors, i);
        char *renamed = ckptfs_name_renamed(t->name, prefixes);
        g_free(t->name);
        t->name = renamed;
        if (g_hash_table_contains(catalog->by_name, t->name)) {
            *clash = g_strdup(t->name);
            return false;
        }
        g_hash_table_insert(catalog->by_name, t->name, t);
    }
    return true;
}

CkptfsCatalog *ckptfs_catalog_copy_renamed(const CkptfsCatalog *catalog, const char *const *prefixes, char **clash)
{
    CkptfsCatalog *c = ckptfs_catalog_copy(catalog);
    if (!ckptfs_catalog_rename(c, prefixes, clash)) {
        ckptfs_catalog_free(c);
        return NULL;
    }
    return c;
}

unsigned ckptfs_catalog_serve_as(CkptfsCatalog *catalog, CkptfsDtype to, bool (*keep)(const char *name))
{
    return serve_as(catalog, to, false, keep);
}

unsigned ckptfs_catalog_dequantize(CkptfsCatalog *catalog)
{
    return serve_as(catalog, CKPTFS_DTYPE_BF16, true, NULL);
}

unsigned ckptfs_catalog_count(const CkptfsCatalog *catalog)
{
    return catalog->tensors->len;
}

const CkptfsTensor *ckptfs_catalog_at(const CkptfsCatalog *catalog, unsigned index)
{
    return index < catalog->tensors->len ? g_ptr_array_index(catalog->tensors, index) : NULL;
}

const CkptfsTensor *ckptfs_catalog_find(const CkptfsCatalog *catalog, const char *name)
{
    return g_hash_table_lookup(catalog->by_name, name);
}

uint64_t ckptfs_catalog_total_bytes(const CkptfsCatalog *catalog)
{
    return catalog->total_bytes;
}

/* Rows [r0, r1) x columns [c0, c1) of an MXFP4 tensor: one extent (stored rows), or one per
 * expert (stored columns: the view's rows are E experts' C columns, its columns their R rows). */
static void emit_mxfp4_rect(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0, uint64_t r1, uint64_t c0,
                            uint64_t c1)
{
    const CkptfsMxfp4 *m = tensor->mxfp4;
    if (!m->transposed) {
        CkptfsMxfp4 where = *m;
        where.row0 += r0 * m->row_step, where.col0 += c0;
        ckptfs_plan_add_mxfp4(b, &where, r1 - r0, c1 - c0);
        return;
    }
    uint64_t per_expert = tensor->shape[1]; /* stored columns */
    for (uint64_t row = r0; row < r1;) {
        uint64_t e = row / per_expert, end = MIN(r1, (e + 1) * per_expert);
        CkptfsMxfp4 where = *m;
        where.row0 += (e * tensor->cols + c0) * m->row_step, where.col0 += row - e * per_expert;
        ckptfs_plan_add_mxfp4(b, &where, end - row, c1 - c0);
        row = end;
    }
}

/* The piece of TENSOR holding element (ROW, COL), or NULL. */
static const CkptfsPiece *piece_at(const CkptfsTensor *tensor, uint64_t row, uint64_t col)
{
    for (unsigned p = 0; p < tensor->npieces; p++) {
        const CkptfsPiece *pc = &tensor->pieces[p];
        if (pc->row0 <= row && row < pc->row1 && pc->col0 <= col && col < pc->col1 &&
            (col - pc->col0) % MAX(pc->col_step, 1u) == 0)
            return pc;
    }
    return NULL;
}

/* Row ROW's columns from COL (below C1) of TENSOR, held by pieces of K = col_step interleaved, as
 * strided items into ITEMS: the K pieces holding COL .. COL + K - 1 interleaved over the columns
 * they all hold, or, where they do not line up (a rectangle cut inside a set), COL's piece's
 * element alone. Returns the column after them. */
static uint64_t add_interleaved(const CkptfsTensor *tensor, uint64_t row, uint64_t col, uint64_t c1, GArray *items)
{
    size_t isz = ckptfs_dtype_size(tensor->stored);
    const CkptfsPiece *first = piece_at(tensor, row, col);
    uint32_t ways = first->col_step;
    uint64_t runs = UINT64_MAX; /* columns each of the set holds from its first here */
    g_autofree const CkptfsPiece **set = g_new(const CkptfsPiece *, ways);
    for (uint32_t w = 0; w < ways && runs > 0; w++) {
        set[w] = col + w < c1 ? piece_at(tensor, row, col + w) : NULL;
        if (set[w] == NULL || set[w]->col_step != ways)
            runs = 0;
        else
            runs = MIN(runs, (MIN(set[w]->col1, c1) - (col + w) + ways - 1) / ways);
    }
    if (runs == 0) /* one element of the first piece */
        ways = 1, runs = 1, set[0] = first;
    for (uint32_t w = 0; w < ways; w++) {
        const CkptfsPiece *pc = set[w];
        uint64_t col_stride = pc->col_stride ? pc->col_stride : isz;
        CkptfsStridedItem item = {
            .src = pc->src, .ways = w == 0 ? ways : 0, .run = 1, .cols = runs,
            .base = pc->offset + (row - pc->row0) * pc->row_stride + (col + w - pc->col0) / pc->col_step * col_stride,
            .row_stride = pc->row_stride, .col_stride = col_stride,
        };
        g_array_append_val(items, item);
    }
    return col + ways * runs;
}

/* Rows [r0, r1) x columns [c0, c1) of a tensor, walked in row-major order. Each row band is cut
 * by the pieces it crosses; within a band the pieces side by side become the items of one
 * gather (one repetition per row), so the extent count follows the pieces, not the rows. */
/* The rectangle as its conversion gives it, or through SHIFT (a same-type conversion) when not NONE. */
static void emit_rect_as(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0, uint64_t r1, uint64_t c0,
                         uint64_t c1, CkptfsConvert shift)
{
    if (tensor->mxfp4 != NULL) {
        if (r0 < r1 && c0 < c1)
            emit_mxfp4_rect(tensor, b, r0, r1, c0, c1);
        return;
    }
    size_t isz = ckptfs_dtype_size(tensor->stored); /* pieces address stored bytes */
    CkptfsConvert conv = shift != CKPTFS_CONVERT_NONE ? shift : ckptfs_convert_find(tensor->stored, tensor->dtype);
    bool scaled = tensor->scale != NULL && tensor->dtype != tensor->stored;
    if (scaled)
        conv = tensor->stored == CKPTFS_DTYPE_F8_E4M3 ? CKPTFS_CONVERT_E4M3_SCALED_TO_BF16
                                                      : CKPTFS_CONVERT_E5M2_SCALED_TO_BF16;
    uint64_t row = r0;
    while (row < r1 && c0 < c1) {
        /* The band ends where any piece crossing these columns starts or ends. */
        uint64_t band_end = r1;
        for (unsigned p = 0; p < tensor->npieces; p++) {
            const CkptfsPiece *pc = &tensor->pieces[p];
            if (pc->col1 <= c0 || pc->col0 >= c1)
                continue;
            if (pc->row0 > row && pc->row0 < band_end)
                band_end = pc->row0;
            if (pc->row0 <= row && pc->row1 > row && pc->row1 < band_end)
                band_end = pc->row1;
        }
        /* Items: the pieces covering this band, left to right. */
        g_autoptr(GArray) items = g_array_new(FALSE, FALSE, sizeof(CkptfsGatherItem));
        g_autoptr(GArray) strided = g_array_new(FALSE, FALSE, sizeof(CkptfsStridedItem));
        g_autoptr(GArray) col0 = g_array_new(FALSE, FALSE, sizeof(uint64_t));
        bool transposed = false; /* some piece's columns are not adjacent */
        for (uint64_t col = c0; col < c1;) {
            const CkptfsPiece *hit = piece_at(tensor, row, col);
            g_assert(hit != NULL); /* pieces tile the tensor; sources verify it */
            if (hit->col_step > 1) {
                col = add_interleaved(tensor, row, col, c1, strided);
                transposed = true;
                continue;
            }
            uint64_t end = MIN(hit->col1, c1);
            CkptfsGatherItem item = {
                .src = hit->src,
                .base = hit->offset + (row - hit->row0) * hit->row_stride + (col - hit->col0) * isz,
                .stride = hit->row_stride,
                .len = (end - col) * isz,
            };
            uint64_t col_stride = hit->col_stride ? hit->col_stride : isz;
            CkptfsStridedItem by_element = {
                .src = hit->src,
                .base = hit->offset + (row - hit->row0) * hit->row_stride + (col - hit->col0) * col_stride,
                .row_stride = hit->row_stride,
                .col_stride = col_stride,
                .cols = end - col,
            };
            transposed = transposed || col_stride != isz;
            g_array_append_val(items, item);
            g_array_append_val(strided, by_element);
            g_array_append_val(col0, col);
            col = end;
        }
        g_assert(!(transposed && scaled)); /* ckptfs_catalog_set_block_scale refuses such pieces */
        if (transposed) {
            ckptfs_plan_add_strided(b, tensor->stored, conv, band_end - row,
                                    (const CkptfsStridedItem *)(void *)strided->data, strided->len);
        } else if (scaled) {
            CkptfsBlockScale where = *tensor->scale;
            where.row0 = row;
            where.col0 = (const uint64_t *)(void *)col0->data;
            ckptfs_plan_add_scaled(b, conv, &where, band_end - row, (const CkptfsGatherItem *)(void *)items->data,
                                   items->len);
        } else if (conv != CKPTFS_CONVERT_NONE)
            ckptfs_plan_add_convert(b, conv, band_end - row, (const CkptfsGatherItem *)(void *)items->data,
                                    items->len);
        else
            ckptfs_plan_add_gather(b, band_end - row, (const CkptfsGatherItem *)(void *)items->data,
                                   items->len);
        row = band_end;
    }
}

void ckptfs_tensor_emit_rect(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                             uint64_t r1, uint64_t c0, uint64_t c1)
{
    emit_rect_as(tensor, b, r0, r1, c0, c1,
                 tensor->shift ? ckptfs_convert_shift(tensor->dtype, tensor->shift) : CKPTFS_CONVERT_NONE);
}

bool ckptfs_catalog_set_shift(CkptfsCatalog *catalog, const char *name, int delta, GError **error)
{
    CkptfsTensor *t = (CkptfsTensor *)ckptfs_catalog_find(catalog, name);
    if (t == NULL || t->shift != 0 || !ckptfs_tensor_can_shift(t))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "tensor '%s' is %s: its weight %s 1 is served for "
                           "bf16 or fp32 only", name, t ? ckptfs_dtype_safetensors_name(t->dtype) : "missing",
                           delta < 0 ? "less" : "plus");
    t->shift = delta;
    return true;
}

bool ckptfs_tensor_can_shift(const CkptfsTensor *tensor)
{
    /* shifted by +1 already (a Megatron source's norm), the view's -1 gives the stored bytes back */
    return tensor->mxfp4 == NULL && tensor->scale == NULL && tensor->stored == tensor->dtype &&
           (tensor->shift == 0 || tensor->shift == 1) && ckptfs_convert_shift(tensor->dtype, -1) != CKPTFS_CONVERT_NONE;
}

void ckptfs_tensor_emit_rect_shifted(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0, uint64_t r1,
                                     uint64_t c0, uint64_t c1, int delta)
{
    g_assert(ckptfs_tensor_can_shift(tensor) && (tensor->shift == 0 || tensor->shift == -delta));
    int total = tensor->shift + delta; /* 0: as stored */
    emit_rect_as(tensor, b, r0, r1, c0, c1, total ? ckptfs_convert_shift(tensor->dtype, total) : CKPTFS_CONVERT_NONE);
}

void ckptfs_tensor_emit(const CkptfsTensor *tensor, CkptfsPlanBuilder *b)
{
    ckptfs_tensor_emit_rect(tensor, b, 0, tensor->rows, 0, tensor->cols);
}

unsigned ckptfs_piece_swap_col_halves(const CkptfsPiece *piece, uint64_t cols, size_t isz, CkptfsPiece out[2])
{
    uint64_t half = cols / 2, col_stride = piece->col_stride ? piece->col_stride : isz;
    uint64_t step = MAX(piece->col_step, 1u);
    if (piece->col1 <= half || piece->col0 >= half) {
        out[0] = *piece;
        out[0].col0 = piece->col0 < half ? piece->col0 + half : piece->col0 - half;
        out[0].col1 = out[0].col0 + (piece->col1 - piece->col0);
        return 1;
    }
    /* its columns below half (LEFT of them) go right, the others left */
    uint64_t left = (half - piece->col0 + step - 1) / step;
    out[0] = *piece, out[1] = *piece;
    out[0].col0 = piece->col0 + half, out[0].col1 = piece->col0 + (left - 1) * step + 1 + half;
    out[1].col0 = piece->col0 + left * step - half, out[1].col1 = piece->col1 - half;
    out[1].offset = piece->offset + left * col_stride;
    return 2;
}

void ckptfs_tensor_emit_rect_swapped(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                                     uint64_t r1, uint64_t c0, uint64_t c1)
{
    size_t isz = ckptfs_dtype_size(tensor->stored);
    if (tensor->scale != NULL) {
        /* Block scales are found by the tensor's own columns: row by row, each half its own rect. */
        uint64_t half = tensor->cols / 2;
        for (uint64_t row = r0; row < r1; row++) {
            if (c0 < half)
                ckptfs_tensor_emit_rect(tensor, b, row, row + 1, c0 + half, MIN(c1, half) + half);
            if (c1 > half)
                ckptfs_tensor_emit_rect(tensor, b, row, row + 1, MAX(c0, half) - half, c1 - half);
        }
        return;
    }
    /* The tensor seen swapped: its pieces' columns moved; the gather then reads them side by side. */
    CkptfsTensor swapped = *tensor;
    g_autofree CkptfsPiece *pieces = g_new(CkptfsPiece, 2 * (size_t)tensor->npieces);
    swapped.npieces = 0;
    for (unsigned p = 0; p < tensor->npieces; p++)
        swapped.npieces += ckptfs_piece_swap_col_halves(&tensor->pieces[p], tensor->cols, isz,
                                                        pieces + swapped.npieces);
    swapped.pieces = pieces;
    ckptfs_tensor_emit_rect(&swapped, b, r0, r1, c0, c1);
}

bool ckptfs_tensor_can_transpose(const CkptfsTensor *tensor)
{
    return tensor->scale == NULL && tensor->mxfp4 == NULL;
}

CkptfsPiece ckptfs_piece_transposed(const CkptfsPiece *pc, size_t isz)
{
    return (CkptfsPiece){.row0 = pc->col0, .row1 = pc->col1, .col0 = pc->row0, .col1 = pc->row1, .src = pc->src,
                         .offset = pc->offset, .row_stride = pc->col_stride ? pc->col_stride : isz,
                         .col_stride = pc->row_stride};
}

void ckptfs_tensor_emit_rect_transposed(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                                        uint64_t r1, uint64_t c0, uint64_t c1)
{
    g_assert(ckptfs_tensor_can_transpose(tensor));
    size_t isz = ckptfs_dtype_size(tensor->stored);
    /* The tensor seen transposed: each piece's rows become columns, its strides exchanged; the
     * gather then reads its elements by stride, as an expert's slice stored transposed. */
    CkptfsTensor transposed = *tensor;
    g_autofree CkptfsPiece *pieces = g_new(CkptfsPiece, tensor->npieces ? tensor->npieces : 1);
    for (unsigned p = 0; p < tensor->npieces; p++)
        pieces[p] = ckptfs_piece_transposed(&tensor->pieces[p], isz);
    transposed.pieces = pieces;
    transposed.rows = tensor->cols, transposed.cols = tensor->rows;
    ckptfs_tensor_emit_rect(&transposed, b, r0, r1, c0, c1);
}
