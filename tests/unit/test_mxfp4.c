/* MXFP4 dequantised on read, against a reference written from the format definition (OCP
 * microscaling: E2M1 codes, two a byte, the low nibble first; an E8M0 scale 2^(s - 127) per 32,
 * applied exactly as transformers' ldexp does):
 * every code under every scale; MXFP4 extents over a file read whole, at odd offsets and byte by
 * byte, stored rows (every other one, from a column inside a group) and stored columns
 * (transformers' [E, C, R] of [E, R, C/32, 16]); the catalog's tensor of a blocks/scales pair,
 * and pairs of the wrong shapes refused by name. Stored columns decoded where they lie: the
 * transposing decoder against the row decoder for every piece of a group, and random reads of a
 * leased, mapped source (tiny and huge, inside a group, inside an output row) against a naive
 * dequantise-then-transpose. */
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

#include "ckptfs/catalog.h"
#include "ckptfs/convert.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "tap.h"

/* The value of E2M1 code C (sign bit 3, exponent bits 2-1 with bias 1, mantissa bit 0; exponent 0
 * subnormal: 0.5 x mantissa) times 2^(S - 127), exactly, as bf16 bits: infinite from 2^128 up
 * (beyond bf16's largest), S = 255 a number as transformers' ldexp takes it. */
static uint16_t reference_bf16(unsigned c, unsigned s)
{
    unsigned sign = c >> 3, exp = (c >> 1) & 3u, mant = c & 1u;
    double v = exp == 0 ? 0.5 * mant : (1.0 + 0.5 * mant) * (double)(1u << (exp - 1));
    for (int e = (int)s - 127; e > 0; e--)
        v *= 2.0;
    for (int e = (int)s - 127; e < 0; e++)
        v *= 0.5;
    if (v >= 0x1p128)
        return sign ? 0xFF80 : 0x7F80;
    float f = (float)(sign ? -v : v); /* exact: two significant bits, 2^-128 at least */
    uint32_t u;
    memcpy(&u, &f, 4);
    g_assert((u & 0xFFFFu) == 0);
    return (uint16_t)(u >> 16);
}

/* Stored element (row, col) of an [rows, cols] MXFP4 matrix: its nibble and its group's scale. */
static uint16_t reference_element(const uint8_t *blocks, const uint8_t *scales, uint64_t cols, uint64_t row,
                                  uint64_t col)
{
    uint8_t byte = blocks[row * (cols / 2) + col / 2];
    return reference_bf16(col % 2 ? byte >> 4 : byte & 0xFu, scales[row * (cols / 32) + col / 32]);
}

static void test_every_code(void)
{
    /* 256 scales x 16 groups: each byte value once under each scale */
    g_autofree uint8_t *blocks = g_malloc(256 * 16 * 16), *scales = g_malloc(256 * 16);
    g_autofree uint16_t *out = g_new(uint16_t, 256 * 16 * 32);
    for (unsigned s = 0; s < 256; s++)
        for (unsigned g = 0; g < 16; g++) {
            scales[s * 16 + g] = (uint8_t)s;
            for (unsigned b = 0; b < 16; b++)
                blocks[(s * 16 + g) * 16 + b] = (uint8_t)(g * 16 + b);
        }
    ckptfs_convert_mxfp4(blocks, scales, 256 * 16, out);
    unsigned bad = 0;
    for (unsigned i = 0; i < 256 * 16 * 32; i++) {
        unsigned group = i / 32, byte = blocks[group * 16 + (i % 32) / 2];
        uint16_t want = reference_bf16(i % 2 ? byte >> 4 : byte & 0xFu, scales[group]);
        if (out[i] != want && bad++ < 5)
            tap_diag("  element %u (code %u, scale %u): got 0x%04x, want 0x%04x", i, i % 2 ? byte >> 4 : byte & 0xFu,
                     scales[group], out[i], want);
    }
    tap_ok(bad == 0, "every E2M1 code under every E8M0 scale, low nibble first (%u wrong)", bad);
    tap_ok(out[(127 * 16 + 2) * 32 + 2] == 0x3F00 && out[(127 * 16 + 2) * 32 + 3] == 0x3F80,
           "byte 0x21 under scale 127 is 0.5 (low nibble) then 1.0");
    /* transformers 5.12.1's convert_moe_packed_tensors on these bytes (its ldexp is exact: 0 x
     * 2^128 is 0, 0.5 x 2^128 finite) */
    tap_ok(out[(255 * 16) * 32 + 0] == 0x0000 && out[(255 * 16) * 32 + 2] == 0x7F00 &&
               out[(255 * 16) * 32 + 4] == 0x7F80 && out[(255 * 16) * 32 + 18] == 0xFF00 &&
               out[(0 * 16) * 32 + 2] == 0x0020 && out[(254 * 16) * 32 + 6] == 0x7F40,
           "scales 0, 254 and 255 as transformers gives them (2^-128 subnormal, 1.5 x 2^127, 0.5 x 2^128 finite, "
           "2^128 infinite, zero zero)");
}

#define E 3
#define R 40  /* stored rows per expert */
#define C 96  /* stored columns: 3 groups */

typedef struct {
    char *dir, *path;
    CkptfsSrcFiles *files;
    uint8_t *data; /* blocks at 0, scales after them */
    uint64_t scales_at;
} MxSource;

static void source_init(MxSource *m, GRand *rng)
{
    m->dir = g_dir_make_tmp("ckptfs-mxfp4-XXXXXX", NULL);
    m->path = g_strdup_printf("%s/experts", m->dir);
    m->scales_at = (uint64_t)E * R * C / 2;
    size_t size = (size_t)(m->scales_at + (uint64_t)E * R * C / 32);
    m->data = g_malloc(size);
    for (size_t i = 0; i < m->scales_at; i++)
        m->data[i] = (uint8_t)g_rand_int(rng);
    for (size_t i = m->scales_at; i < size; i++) /* scales around 2^0, some at the ends of the range */
        m->data[i] = (uint8_t)(i % 17 == 0 ? (i % 2 ? 255 : 0) : g_rand_int_range(rng, 118, 136));
    g_file_set_contents(m->path, (const char *)m->data, (gssize)size, NULL);
    m->files = ckptfs_srcfiles_new(0);
    g_assert(ckptfs_srcfiles_add(m->files, m->path, NULL) == 0);
}

static void source_clear(MxSource *m)
{
    g_unlink(m->path);
    g_rmdir(m->dir);
    g_free(m->path);
    g_free(m->dir);
    g_free(m->data);
    ckptfs_srcfiles_free(m->files);
}

/* Reads PLAN whole, at odd offsets in odd lengths and byte by byte near an end; whether every
 * read equals WANT (SIZE bytes). */
static bool reads_equal_n(const CkptfsPlan *plan, const CkptfsSrcFiles *files, const uint8_t *want, size_t size,
                          GRand *rng, int nreads)
{
    g_autofree uint8_t *got = g_malloc0(size + 1);
    GError *error = NULL;
    if (ckptfs_plan_size(plan) != size ||
        ckptfs_plan_read(plan, CKPTFS_READ_SHARED(files), got, size, 0, &error) != (int64_t)size ||
        memcmp(got, want, size) != 0) {
        tap_diag("  the whole read differs%s%s", error ? ": " : "", error ? error->message : "");
        g_clear_error(&error);
        return false;
    }
    for (int i = 0; i < nreads; i++) {
        size_t off = (size_t)g_rand_int_range(rng, 0, (gint32)size), len = (size_t)g_rand_int_range(rng, 1, 700);
        len = MIN(len, size - off);
        memset(got, 0xA5, len);
        if (ckptfs_plan_read(plan, CKPTFS_READ_SHARED(files), got, len, off, NULL) != (int64_t)len ||
            memcmp(got, want + off, len) != 0) {
            tap_diag("  a read of %zu bytes at %zu differs", len, off);
            return false;
        }
    }
    for (size_t off = size > 9 ? size - 9 : 0; off < size; off++)
        if (ckptfs_plan_read(plan, CKPTFS_READ_SHARED(files), got, 1, off, NULL) != 1 || got[0] != want[off]) {
            tap_diag("  the byte at %zu differs", off);
            return false;
        }
    return true;
}

static bool reads_equal(const CkptfsPlan *plan, const CkptfsSrcFiles *files, const uint8_t *want, size_t size,
                        GRand *rng)
{
    return reads_equal_n(plan, files, want, size, rng, 200);
}

typedef struct {
    const CkptfsPlan *plan;
    const CkptfsSrcFiles *files;
    const uint8_t *want;
    size_t size;
    guint32 seed;
    int bad;
} Reader;

/* Random reads of a plan from a thread of its own, as FUSE workers serve a reader's read-ahead. */
static gpointer read_randomly(gpointer data)
{
    Reader *r = data;
    GRand *rng = g_rand_new_with_seed(r->seed);
    g_autofree uint8_t *got = g_malloc(256 << 10);
    for (int i = 0; i < 12; i++) {
        size_t off = (size_t)g_rand_int_range(rng, 0, (gint32)r->size);
        size_t draw = (size_t)g_rand_int_range(rng, 1, 256 << 10); /* once: MIN evaluates twice */
        size_t len = MIN(draw, r->size - off);
        if (ckptfs_plan_read(r->plan, CKPTFS_READ_SHARED(r->files), got, len, off, NULL) != (int64_t)len ||
            memcmp(got, r->want + off, len) != 0)
            r->bad++;
    }
    g_rand_free(rng);
    return NULL;
}

/* A transposed extent of so many stored rows that a band holds one group of columns (16 MiB
 * of output): reads cross bands, come back to earlier ones, start inside a group. */
static void test_bands(GRand *rng)
{
    MxSource m = {0};
    m.dir = g_dir_make_tmp("ckptfs-mxfp4-XXXXXX", NULL);
    m.path = g_strdup_printf("%s/experts", m.dir);
    uint64_t rows = 140000, cols = 96;
    m.scales_at = rows * cols / 2;
    size_t size = (size_t)(m.scales_at + rows * cols / 32);
    m.data = g_malloc(size);
    for (size_t i = 0; i < size; i++)
        m.data[i] = i < m.scales_at ? (uint8_t)g_rand_int(rng) : (uint8_t)g_rand_int_range(rng, 100, 150);
    g_file_set_contents(m.path, (const char *)m.data, (gssize)size, NULL);
    m.files = ckptfs_srcfiles_new(0);
    g_assert(ckptfs_srcfiles_add(m.files, m.path, NULL) == 0);
    CkptfsMxfp4 where = {.scales_base = m.scales_at, .cols = cols, .row0 = 0, .row_step = 1, .col0 = 7,
                         .transposed = true};
    uint64_t nrep = cols - 7;
    g_autofree uint16_t *want = g_new(uint16_t, nrep * rows);
    for (uint64_t j = 0; j < nrep; j++)
        for (uint64_t k = 0; k < rows; k++)
            want[j * rows + k] = reference_element(m.data, m.data + m.scales_at, cols, k, 7 + j);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_mxfp4(b, &where, nrep, rows);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    tap_ok(reads_equal_n(plan, m.files, (const uint8_t *)want, nrep * rows * 2, rng, 40),
           "stored columns in bands of one group (140000 stored rows): every read as the reference");
    Reader readers[4];
    GThread *threads[4];
    for (int t = 0; t < 4; t++) {
        readers[t] = (Reader){plan, m.files, (const uint8_t *)want, nrep * rows * 2, 7u + (guint32)t, 0};
        threads[t] = g_thread_new("reader", read_randomly, &readers[t]);
    }
    int bad = 0;
    for (int t = 0; t < 4; t++) {
        g_thread_join(threads[t]);
        bad += readers[t].bad;
    }
    tap_ok(bad == 0, "  4 threads reading it at once: every read as the reference (%d wrong)", bad);
    ckptfs_plan_free(plan);
    source_clear(&m);
}

static void test_extents(MxSource *m, GRand *rng)
{
    const uint8_t *blocks = m->data, *scales = m->data + m->scales_at;
    CkptfsMxfp4 where = {.blocks_src = 0, .scales_src = 0, .blocks_base = 0, .scales_base = m->scales_at, .cols = C,
                         .row_step = 1};
    /* Stored rows: expert 1's odd rows (gate and up interleaved: the up rows), columns [37, 90). */
    where.row0 = R + 1, where.row_step = 2, where.col0 = 37;
    uint64_t nrep = R / 2, width = 90 - 37;
    g_autofree uint16_t *want = g_new(uint16_t, nrep * width);
    for (uint64_t j = 0; j < nrep; j++)
        for (uint64_t k = 0; k < width; k++)
            want[j * width + k] = reference_element(blocks, scales, C, R + 1 + 2 * j, 37 + k);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, "hdr", 3);
    ckptfs_plan_add_mxfp4(b, &where, nrep, width);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autofree uint8_t *bytes = g_malloc(3 + nrep * width * 2);
    memcpy(bytes, "hdr", 3);
    memcpy(bytes + 3, want, nrep * width * 2);
    tap_ok(reads_equal(plan, m->files, bytes, 3 + nrep * width * 2, rng),
           "stored rows two apart from a column inside a group, after a literal: every read as the reference");
    ckptfs_plan_free(plan);

    /* Stored columns: expert 2's columns [5, 70) as rows, its rows [3, 40) as columns. */
    where = (CkptfsMxfp4){.scales_base = m->scales_at, .cols = C, .row0 = 2 * R + 3, .row_step = 1, .col0 = 5,
                          .transposed = true};
    nrep = 70 - 5, width = R - 3;
    g_autofree uint16_t *want_t = g_new(uint16_t, nrep * width);
    for (uint64_t j = 0; j < nrep; j++)
        for (uint64_t k = 0; k < width; k++)
            want_t[j * width + k] = reference_element(blocks, scales, C, 2 * R + 3 + k, 5 + j);
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_mxfp4(b, &where, nrep, width);
    plan = ckptfs_plan_builder_finish(b);
    tap_ok(reads_equal(plan, m->files, (const uint8_t *)want_t, nrep * width * 2, rng),
           "stored columns as rows (transposed): every read as the reference");
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    tap_is_u64(srcs->len, 1, "its sources: the blocks and scales file");
    ckptfs_plan_prefetch(plan, m->files, 0, ckptfs_plan_size(plan)); /* advice only: must not fail */
    ckptfs_plan_free(plan);
}

static void test_catalog(MxSource *m, GRand *rng)
{
    const uint8_t *blocks = m->data, *scales = m->data + m->scales_at;
    CkptfsCatalog *cat = ckptfs_catalog_new();
    uint64_t bshape[4] = {E, R, C / 32, 16}, sshape[3] = {E, R, C / 32};
    ckptfs_catalog_add_contiguous(cat, "x.gate_up_proj_blocks", CKPTFS_DTYPE_U8, 4, bshape, 0, 0);
    ckptfs_catalog_add_contiguous(cat, "x.gate_up_proj_scales", CKPTFS_DTYPE_U8, 3, sshape, 0, m->scales_at);
    GError *error = NULL;
    const CkptfsTensor *t =
        ckptfs_catalog_add_mxfp4(cat, "x.gate_up_proj", "x.gate_up_proj_blocks", "x.gate_up_proj_scales", &error);
    if (!tap_ok(t != NULL, "a blocks/scales pair becomes a tensor"))
        tap_diag("  %s", error->message);
    g_clear_error(&error);
    if (t == NULL) {
        ckptfs_catalog_free(cat);
        return;
    }
    tap_ok(t->dtype == CKPTFS_DTYPE_BF16 && t->ndim == 3 && t->shape[0] == E && t->shape[1] == C && t->shape[2] == R &&
               t->nbytes == (uint64_t)E * C * R * 2,
           "  bf16 [E, C, R], as transformers' dequantisation transposes it");
    g_autofree uint16_t *want = g_new(uint16_t, E * C * R);
    for (uint64_t e = 0; e < E; e++)
        for (uint64_t c = 0; c < C; c++)
            for (uint64_t r = 0; r < R; r++)
                want[(e * C + c) * R + r] = reference_element(blocks, scales, C, e * R + r, c);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_tensor_emit(t, b);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    tap_ok(reads_equal(plan, m->files, (const uint8_t *)want, (size_t)E * C * R * 2, rng),
           "  served whole: every read as the reference");
    ckptfs_plan_free(plan);
    /* A rectangle across an expert boundary: rows [C - 7, C + 9), columns [4, 31). */
    b = ckptfs_plan_builder_new();
    ckptfs_tensor_emit_rect(t, b, C - 7, C + 9, 4, 31);
    plan = ckptfs_plan_builder_finish(b);
    g_autofree uint16_t *rect = g_new(uint16_t, 16 * 27);
    for (int i = 0; i < 16; i++)
        memcpy(rect + i * 27, want + (C - 7 + i) * R + 4, 27 * 2);
    tap_ok(reads_equal(plan, m->files, (const uint8_t *)rect, 16 * 27 * 2, rng),
           "  a rectangle across two experts: as the reference");
    ckptfs_plan_free(plan);
    CkptfsCatalog *copy = ckptfs_catalog_copy(cat);
    ckptfs_catalog_serve_as(copy, CKPTFS_DTYPE_F32, NULL);
    tap_ok(ckptfs_catalog_find(copy, "x.gate_up_proj")->dtype == CKPTFS_DTYPE_BF16,
           "  a copy served as fp32 keeps it bf16 (its only conversion)");
    ckptfs_catalog_free(copy);

    /* Refused by name. */
    uint64_t narrow[4] = {E, R, C / 32, 8}, wrong_scales[3] = {E, R, C / 32 + 1};
    ckptfs_catalog_add_contiguous(cat, "y_blocks", CKPTFS_DTYPE_U8, 4, narrow, 0, 0);
    ckptfs_catalog_add_contiguous(cat, "y_scales", CKPTFS_DTYPE_U8, 3, sshape, 0, m->scales_at);
    tap_ok(!ckptfs_catalog_add_mxfp4(cat, "y", "y_blocks", "y_scales", &error) &&
               strstr(error->message, "'y_blocks'") && strstr(error->message, "[3, 40, 3, 8]") &&
               strstr(error->message, "[E, R, C/32, 16]"),
           "blocks of 8 bytes a group: refused by name");
    g_clear_error(&error);
    ckptfs_catalog_add_contiguous(cat, "z_blocks", CKPTFS_DTYPE_U8, 4, bshape, 0, 0);
    ckptfs_catalog_add_contiguous(cat, "z_scales", CKPTFS_DTYPE_U8, 3, wrong_scales, 0, 0);
    tap_ok(!ckptfs_catalog_add_mxfp4(cat, "z", "z_blocks", "z_scales", &error) &&
               strstr(error->message, "'z_scales'") &&
               strstr(error->message, "[3, 40, 4]") && strstr(error->message, "need U8 [3, 40, 3]"),
           "scales of another shape: refused by name");
    g_clear_error(&error);
    ckptfs_catalog_add_contiguous(cat, "w_blocks", CKPTFS_DTYPE_U8, 4, bshape, 0, 0);
    ckptfs_catalog_add_contiguous(cat, "w_scales", CKPTFS_DTYPE_F32, 3, sshape, 0, 0);
    tap_ok(!ckptfs_catalog_add_mxfp4(cat, "w", "w_blocks", "w_scales", &error) && strstr(error->message, "F32"),
           "fp32 scales: refused by name");
    g_clear_error(&error);
    ckptfs_catalog_free(cat);
}

/* ckptfs_convert_mxfp4_columns against ckptfs_convert_mxfp4: every piece [c0, c0 + nc) of a group,
 * row counts around its 8-row blocks, rows apart in their source, scales at the ends of the range
 * (decoded a group at a time) among the others. */
static void test_columns_decoder(GRand *rng)
{
    enum { ROWS = 37, STEP = 48 }; /* stored rows STEP bytes apart, their scales 3 apart */
    uint8_t blocks[ROWS * STEP], scales[ROWS * 3];
    for (size_t i = 0; i < sizeof blocks; i++)
        blocks[i] = (uint8_t)g_rand_int(rng);
    for (size_t i = 0; i < sizeof scales; i++)
        scales[i] = (uint8_t)(i % 23 == 0 ? (int)(255 - i % 4) : g_rand_int_range(rng, 2, 253)); /* 252-255 */
    scales[9 * 3] = 0, scales[10 * 3] = 1;
    uint16_t rows[ROWS][CKPTFS_MXFP4_GROUP];
    for (unsigned r = 0; r < ROWS; r++)
        ckptfs_convert_mxfp4(blocks + r * STEP, scales + r * 3, 1, rows[r]);
    int bad = 0, pieces = 0;
    static const unsigned counts[] = {1, 7, 8, 9, 16, 17, ROWS};
    for (unsigned c0 = 0; c0 < CKPTFS_MXFP4_GROUP; c0++)
        for (unsigned nc = 1; c0 + nc <= CKPTFS_MXFP4_GROUP; nc++)
            for (unsigned k = 0; k < G_N_ELEMENTS(counts); k++) {
                unsigned n = counts[k];
                uint16_t out[CKPTFS_MXFP4_GROUP][ROWS + 1];
                memset(out, 0xA5, sizeof out);
                ckptfs_convert_mxfp4_columns(blocks, STEP, scales, 3, n, c0, nc, (uint8_t *)out, sizeof out[0]);
                pieces++;
                for (unsigned i = 0; i < CKPTFS_MXFP4_GROUP; i++)
                    for (unsigned r = 0; r <= ROWS; r++) {
                        uint16_t want = i < nc && r < n ? rows[r][c0 + i] : 0xA5A5;
                        if (out[i][r] != want && bad++ < 5)
                            tap_diag("  columns [%u, %u) of %u rows: column %u row %u is 0x%04x, want 0x%04x", c0,
                                     c0 + nc, n, c0 + i, r, out[i][r], want);
                    }
            }
    tap_ok(bad == 0, "stored columns decoded transposed as the rows decode them: %d pieces of a group, nothing "
                     "written past them (%d wrong)", pieces, bad);
}

/* A read through a leased mapping of the source, as a mount's: the bytes, and whether the read
 * decoded from the mapping (a pin of it used). */
static int64_t read_mapped(const CkptfsPlan *plan, const CkptfsSrcFiles *files, uint8_t *buf, size_t len,
                           uint64_t off, bool *from_map)
{
    static CkptfsReplyRefs refs;
    int64_t n = ckptfs_plan_read(plan, &(CkptfsReadCtx){.files = files, .refs = &refs}, buf, len, off, NULL);
    *from_map = false;
    for (unsigned i = 0; i < refs.npins; i++)
        *from_map = *from_map || (refs.pin[i].map != NULL && refs.pin[i].used);
    ckptfs_reply_refs_release(files, &refs);
    return n;
}

/* Stored columns and rows decoded from the mapped source, against transformers' way written out
 * naively (every element dequantised, then the matrix transposed or not): two experts of 1003
 * stored rows (not a multiple of the decoder's blocks) and 10 groups; whole, and an expert's rows
 * two apart from a column inside a group, read at random offsets and lengths from 1 byte to the
 * whole file. */
static void test_mapped(CkptfsLeaseWatch *watch, GRand *rng)
{
    enum { ME = 2, MR = 1003, MC = 320 };
    static const struct {
        bool transposed;
        uint64_t row0, step, col0, nrep, width;
        const char *what;
    } shapes[] = {
        {true, 0, 1, 0, MC, MR, "stored columns: an expert's [C, R] whole"},
        {true, MR + 1, 2, 13, MC - 13 - 40, MR / 2, "stored columns: expert 1's odd rows from column 13"},
        {false, 0, 1, 0, MR, MC, "stored rows: an expert's [R, C] whole"},
        {false, MR + 1, 2, 13, MR / 2, MC - 13 - 40, "stored rows: expert 1's odd ones from column 13"},
    };
    MxSource m = {0};
    m.dir = g_dir_make_tmp("ckptfs-mxfp4-XXXXXX", NULL);
    m.path = g_strdup_printf("%s/experts", m.dir);
    m.scales_at = (uint64_t)ME * MR * MC / 2;
    size_t size = (size_t)(m.scales_at + (uint64_t)ME * MR * MC / 32);
    m.data = g_malloc(size);
    for (size_t i = 0; i < size; i++)
        m.data[i] = i < m.scales_at ? (uint8_t)g_rand_int(rng)
                                    : (uint8_t)(i % 101 == 0 ? (i % 2 ? 255 : 0) : g_rand_int_range(rng, 110, 140));
    g_file_set_contents(m.path, (const char *)m.data, (gssize)size, NULL);
    m.files = ckptfs_srcfiles_new(0);
    g_assert(ckptfs_srcfiles_add(m.files, m.path, NULL) == 0);
    if (watch != NULL)
        ckptfs_lease_watch_add(watch, m.files);
    const uint8_t *probe = watch ? ckptfs_srcfiles_map_pin(m.files, 0) : NULL;
    if (probe == NULL) {
        tap_skip(2 * (int)G_N_ELEMENTS(shapes), "no lease on %s (its file system, or leases off): nothing is read mapped",
                 m.dir);
        source_clear(&m);
        return;
    }
    ckptfs_srcfiles_map_unpin(m.files, 0);
    const uint8_t *blocks = m.data, *scales = m.data + m.scales_at;
    for (size_t s = 0; s < G_N_ELEMENTS(shapes); s++) {
        uint64_t nrep = shapes[s].nrep, width = shapes[s].width;
        CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
        ckptfs_plan_add_literal(b, "x", 1);
        g_autofree uint16_t *naive = g_new(uint16_t, ME * nrep * width);
        uint64_t at = 0;
        for (uint64_t e = 0; e < (s == 0 ? ME : 1); e++) {
            bool t = shapes[s].transposed;
            CkptfsMxfp4 where = {.scales_base = m.scales_at, .cols = MC, .row0 = shapes[s].row0 + e * MR,
                                 .row_step = shapes[s].step, .col0 = shapes[s].col0, .transposed = t};
            ckptfs_plan_add_mxfp4(b, &where, nrep, width);
            /* dequantised as stored, then transposed (or not) */
            uint64_t stored = t ? width : nrep;
            g_autofree uint16_t *rowwise = g_new(uint16_t, stored * MC);
            for (uint64_t k = 0; k < stored; k++)
                for (uint64_t c = 0; c < MC; c++)
                    rowwise[k * MC + c] = reference_element(blocks, scales, MC, where.row0 + k * where.row_step, c);
            for (uint64_t j = 0; j < nrep; j++)
                for (uint64_t k = 0; k < width; k++)
                    naive[at + j * width + k] = t ? rowwise[k * MC + where.col0 + j] : rowwise[j * MC + where.col0 + k];
            at += nrep * width;
        }
        CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
        size_t total = 1 + (size_t)at * 2;
        g_autofree uint8_t *want = g_malloc(total), *got = g_malloc(total + 1);
        want[0] = 'x';
        memcpy(want + 1, naive, (size_t)at * 2);
        int bad = 0, mapped = 0, reads = 0;
        for (int i = 0; i < 300; i++, reads++) {
            /* tiny, inside an output row, across rows and groups of them, and huge */
            static const size_t lens[] = {1, 2, 3, 31, 700, 4096, 70000, 300000, 1u << 20};
            size_t len = i == 0 ? total : lens[g_rand_int_range(rng, 0, G_N_ELEMENTS(lens))];
            size_t off = i == 0 ? 0 : (size_t)g_rand_int_range(rng, 0, (gint32)total);
            len = MIN(len, total - off);
            memset(got, 0xA5, len + 1);
            bool from_map;
            int64_t n = read_mapped(plan, m.files, got, len, off, &from_map);
            mapped += from_map;
            if ((n != (int64_t)len || memcmp(got, want + off, len) != 0 || got[len] != 0xA5) && bad++ < 3)
                tap_diag("  a read of %zu bytes at %zu differs (%" G_GINT64_FORMAT " read)", len, off, n);
        }
        tap_ok(bad == 0, "%s, from the mapped source: %d reads as a naive dequantisation (%d wrong)",
               shapes[s].what, reads, bad);
        tap_ok(mapped >= reads - 2, "  decoded where the codes lie: %d of %d reads (the others had only the literal)",
               mapped, reads);
        ckptfs_plan_free(plan);
    }
    source_clear(&m);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(20261128);
    /* the lease signals blocked before any thread is made, as the daemon does */
    CkptfsLeaseWatch *watch = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(NULL) : NULL;
    test_every_code();
    test_columns_decoder(rng);
    MxSource m;
    source_init(&m, rng);
    test_extents(&m, rng);
    test_catalog(&m, rng);
    source_clear(&m);
    test_bands(rng);
    test_mapped(watch, rng);
    if (watch != NULL)
        ckptfs_lease_watch_free(watch);
    g_rand_free(rng);
    return tap_done();
}
