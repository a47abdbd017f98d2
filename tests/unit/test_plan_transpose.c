/* TRANSPOSE extents (a matrix stored transposed, an expert's slice of a fused tensor) against a
 * naive element-by-element reference: random extents over random source files read at random
 * offsets and lengths, bf16 and fp32 as stored and fp32 served as bf16; the catalog's strided
 * pieces cut into rectangles, and seen with their column halves exchanged; a 1 MiB read in few
 * read calls; the random extents and a wide expert read through a leased mapping, transposed from
 * it; a source changed under the plan. */
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckptfs/catalog.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "random_sources.h"
#include "tap.h"

#define NSRC 2
#define SRC_SIZE (4u << 20)

/* Element (j, k) of item IT, output as OSZ bytes at OUT: its stored bytes, converted fp32 ->
 * bf16 by the plain formula (round to nearest even on the upper half; NaN -> 0xFFFF). */
static void reference_element(const RandomSources *s, const CkptfsStridedItem *it, uint64_t j, uint64_t k, size_t isz,
                              bool to_bf16, uint8_t *out)
{
    const uint8_t *at = s->data[it->src] + it->base + j * it->row_stride + k * it->col_stride;
    if (!to_bf16) {
        memcpy(out, at, isz);
        return;
    }
    uint32_t u;
    memcpy(&u, at, 4);
    uint16_t h;
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
        h = 0xFFFF;
    else
        h = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    memcpy(out, &h, 2);
}

/* The naive bytes of NREP rows of ITEMS side by side. */
static GByteArray *reference_rows(const RandomSources *s, const CkptfsStridedItem *items, unsigned nitems, uint64_t nrep,
                                  size_t isz, bool to_bf16)
{
    size_t osz = to_bf16 ? 2 : isz;
    GByteArray *want = g_byte_array_new();
    for (uint64_t j = 0; j < nrep; j++)
        for (unsigned i = 0; i < nitems; i++)
            for (uint64_t k = 0; k < items[i].cols; k++) {
                uint8_t el[8];
                reference_element(s, &items[i], j, k, isz, to_bf16, el);
                g_byte_array_append(want, el, (guint)osz);
            }
    return want;
}

typedef struct {
    const char *what;
    CkptfsDtype stored;
    CkptfsConvert conv;
} Kind;

static const Kind kinds[] = {
    {"bf16", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE},
    {"fp32", CKPTFS_DTYPE_F32, CKPTFS_CONVERT_NONE},
    {"fp32 -> bf16", CKPTFS_DTYPE_F32, CKPTFS_CONVERT_F32_TO_BF16},
};

/* Random extents: 1-3 items, each stored transposed (halves or interleaved: rows one or two
 * elements apart, columns a stored row apart) or row-major, odd sizes; behind a literal so the
 * extent starts at an odd offset; read whole and at random offsets and lengths. */
static void test_random_extents(RandomSources *s, GRand *rng)
{
    for (size_t kind = 0; kind < G_N_ELEMENTS(kinds); kind++) {
        const Kind *kd = &kinds[kind];
        size_t isz = ckptfs_dtype_size(kd->stored);
        const char *how = s->refs ? "mapped reads, " : "";
        int extents_ok = 0, reads_ok = 0, reads = 0, nextents = 60;
        for (int x = 0; x < nextents; x++) {
            uint64_t nrep = (uint64_t)g_rand_int_range(rng, 1, 300);
            unsigned nitems = (unsigned)g_rand_int_range(rng, 1, 4);
            CkptfsStridedItem items[3];
            for (unsigned i = 0; i < nitems; i++) {
                CkptfsStridedItem *it = &items[i];
                *it = (CkptfsStridedItem){0}; /* side by side: no WAYS */
                it->src = (uint32_t)g_rand_int_range(rng, 0, NSRC);
                it->cols = (uint64_t)g_rand_int_range(rng, 1, 200);
                if (g_rand_int_range(rng, 0, 4) > 0) { /* transposed */
                    it->row_stride = isz * (uint64_t)g_rand_int_range(rng, 1, 3);
                    it->col_stride = nrep * it->row_stride + isz * (uint64_t)g_rand_int_range(rng, 0, 5);
                } else {
                    it->col_stride = isz;
                    it->row_stride = it->cols * isz + isz * (uint64_t)g_rand_int_range(rng, 0, 5);
                }
                uint64_t span = (nrep - 1) * it->row_stride + (it->cols - 1) * it->col_stride + isz;
                it->base = isz * (uint64_t)g_rand_int_range(rng, 0, (gint32)((SRC_SIZE - span) / isz));
            }
            CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
            ckptfs_plan_add_literal(b, "abc", 3);
            ckptfs_plan_add_strided(b, kd->stored, kd->conv, nrep, items, nitems);
            ckptfs_plan_add_literal(b, "z", 1);
            CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
            g_autoptr(GByteArray) want = g_byte_array_new();
            g_byte_array_append(want, (const guint8 *)"abc", 3);
            g_autoptr(GByteArray) body = reference_rows(s, items, nitems, nrep, isz, kd->conv != CKPTFS_CONVERT_NONE);
            g_byte_array_append(want, body->data, body->len);
            g_byte_array_append(want, (const guint8 *)"z", 1);
            g_autofree uint8_t *buf = g_malloc(want->len + 16);
            if (ckptfs_plan_size(plan) == want->len &&
                random_sources_read(s, plan, buf, want->len + 16, 0, NULL) == (int64_t)want->len &&
                memcmp(buf, want->data, want->len) == 0)
                extents_ok++;
            for (int r = 0; r < 40; r++) {
                uint64_t off = (uint64_t)g_rand_int_range(rng, 0, (gint32)want->len);
                uint64_t len = (uint64_t)g_rand_int_range(rng, 1, (gint32)(want->len - off + 1));
                if (r % 4 == 0) { /* small reads: part of an element, a row (MIN evaluates twice) */
                    uint64_t small = (uint64_t)g_rand_int_range(rng, 1, 9);
                    len = MIN(len, small);
                }
                int64_t got = random_sources_read(s, plan, buf, (size_t)len, off, NULL);
                reads++;
                reads_ok += got == (int64_t)len && memcmp(buf, want->data + off, (size_t)len) == 0;
            }
            ckptfs_plan_free(plan);
        }
        tap_ok(extents_ok == nextents, "%s%s: random transposed extents read whole equal the naive transpose (%d/%d)",
               how, kd->what, extents_ok, nextents);
        tap_ok(reads_ok == reads, "%s%s: reads at random offsets and lengths equal it (%d/%d)", how, kd->what, reads_ok,
               reads);
    }
}

/* Items whose columns are adjacent are a gather (no TRANSPOSE extent). */
static void test_adjacent_is_gather(const RandomSources *s)
{
    CkptfsStridedItem row_major = {.src = 0, .base = 64, .row_stride = 40, .col_stride = 2, .cols = 20};
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 10, &row_major, 1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    uint8_t buf[400];
    tap_ok(ckptfs_plan_extent_count(plan) == 1 &&
               ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, sizeof buf, 0, NULL) == 400 &&
               memcmp(buf, s->data[0] + 64, 400) == 0,
           "row-major items with adjacent rows are one contiguous run");
    ckptfs_plan_free(plan);
}

/* A tensor made of strided pieces (two experts' down_proj [H, F] of a fused [E, F, H] tensor side
 * by side, one stored transposed, one row-major), rectangles emitted by the catalog, and the same
 * served as bf16 from fp32. */
static void test_catalog_pieces(const RandomSources *s, GRand *rng)
{
    const uint64_t rows = 37, cols = 23, split = 11;
    for (int conv = 0; conv < 2; conv++) {
        CkptfsCatalog *catalog = ckptfs_catalog_new();
        size_t isz = conv ? 4 : 2;
        CkptfsPiece pieces[2] = {
            {.row0 = 0, .row1 = rows, .col0 = 0, .col1 = split, .src = 0, .offset = 1000 * isz,
             .row_stride = isz, .col_stride = (rows + 3) * isz},
            {.row0 = 0, .row1 = rows, .col0 = split, .col1 = cols, .src = 1, .offset = 7 * isz,
             .row_stride = (cols - split) * isz},
        };
        uint64_t shape[2] = {rows, cols};
        GError *error = NULL;
        const CkptfsTensor *t = ckptfs_catalog_add_pieces(catalog, "w", conv ? CKPTFS_DTYPE_F32 : CKPTFS_DTYPE_BF16,
                                                          2, shape, pieces, 2, &error);
        tap_ok(t != NULL, "a tensor of a transposed and a row-major piece is accepted (%s)",
               error ? error->message : "ok");
        g_clear_error(&error);
        if (t == NULL) {
            ckptfs_catalog_free(catalog);
            continue;
        }
        if (conv)
            ckptfs_catalog_serve_as(catalog, CKPTFS_DTYPE_BF16, NULL);
        int ok = 0, total = 200;
        for (int k = 0; k < total; k++) {
            uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)rows);
            uint64_t r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0 + 1, (gint32)rows + 1);
            uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)cols);
            uint64_t c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0 + 1, (gint32)cols + 1);
            CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
            ckptfs_tensor_emit_rect(t, b, r0, r1, c0, c1);
            CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
            g_autoptr(GByteArray) want = g_byte_array_new();
            for (uint64_t r = r0; r < r1; r++)
                for (uint64_t c = c0; c < c1; c++) {
                    const CkptfsPiece *pc = &pieces[c >= split];
                    uint64_t cs = pc->col_stride ? pc->col_stride : isz;
                    CkptfsStridedItem one = {.src = pc->src, .base = pc->offset + (r - pc->row0) * pc->row_stride +
                                                                     (c - pc->col0) * cs};
                    uint8_t el[4];
                    reference_element(s, &one, 0, 0, isz, conv, el);
                    g_byte_array_append(want, el, conv ? 2 : (guint)isz);
                }
            g_autofree uint8_t *buf = g_malloc(want->len);
            ok += ckptfs_plan_size(plan) == want->len &&
                  ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, want->len, 0, NULL) == (int64_t)want->len &&
                  memcmp(buf, want->data, want->len) == 0;
            ckptfs_plan_free(plan);
        }
        tap_ok(ok == total, "%s: rectangles of it equal the naive copy (%d/%d)", conv ? "fp32 -> bf16" : "bf16", ok,
               total);
        ckptfs_catalog_free(catalog);
    }
    /* A strided piece reaching past 64 bits is refused. */
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    CkptfsPiece wild = {.row0 = 0, .row1 = 4, .col0 = 0, .col1 = 4, .row_stride = 2, .col_stride = UINT64_MAX / 2};
    uint64_t shape[2] = {4, 4};
    GError *error = NULL;
    bool refused = ckptfs_catalog_add_pieces(catalog, "wild", CKPTFS_DTYPE_BF16, 2, shape, &wild, 1, &error) == NULL;
    tap_ok(refused && error && strstr(error->message, "wild") && strstr(error->message, "overflows"),
           "a strided piece whose last element is past 64 bits is refused by name (%s)",
           error ? error->message : "accepted");
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);
}

/* A matrix seen with each row's column halves exchanged (CKPTFS_RECIPE_SWAP_COL_HALVES): pieces
 * row-major and transposed, one crossing the middle; rectangles of the swapped view emitted by
 * ckptfs_tensor_emit_rect_swapped, and a tensor made of pieces swapped by
 * ckptfs_piece_swap_col_halves (a source read backwards), both equal the naive copy where
 * column c is the stored matrix's column (c + half) mod cols. */
static void test_swapped_halves(const RandomSources *s, GRand *rng)
{
    const uint64_t rows = 19, half = 13, cols = 2 * half;
    const size_t isz = 2;
    CkptfsPiece pieces[3] = {
        {.row0 = 0, .row1 = rows, .col0 = 0, .col1 = 9, .src = 0, .offset = 300, .row_stride = 9 * isz},
        {.row0 = 0, .row1 = rows, .col0 = 9, .col1 = 20, .src = 1, .offset = 5000, .row_stride = isz,
         .col_stride = (rows + 1) * isz},
        {.row0 = 0, .row1 = rows, .col0 = 20, .col1 = cols, .src = 0, .offset = 9000, .row_stride = 6 * isz},
    };
    CkptfsPiece swapped[6];
    unsigned n = 0;
    for (int i = 0; i < 3; i++)
        n += ckptfs_piece_swap_col_halves(&pieces[i], cols, isz, swapped + n);
    tap_ok(n == 4, "the piece crossing the middle is cut in two, the others moved (%u pieces)", n);
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    uint64_t shape[2] = {rows, cols};
    GError *error = NULL;
    const CkptfsTensor *stored = ckptfs_catalog_add_pieces(catalog, "stored", CKPTFS_DTYPE_BF16, 2, shape, pieces, 3, &error);
    const CkptfsTensor *backwards = ckptfs_catalog_add_pieces(catalog, "backwards", CKPTFS_DTYPE_BF16, 2, shape, swapped, n,
                                                              &error);
    tap_ok(stored && backwards, "both tile the matrix (%s)", error ? error->message : "ok");
    g_clear_error(&error);
    for (int way = 0; way < 2 && stored && backwards; way++) {
        int ok = 0, total = 200;
        for (int k = 0; k < total; k++) {
            uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)rows);
            uint64_t r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0 + 1, (gint32)rows + 1);
            uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)cols);
            uint64_t c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0 + 1, (gint32)cols + 1);
            CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
            if (way == 0)
                ckptfs_tensor_emit_rect_swapped(stored, b, r0, r1, c0, c1);
            else
                ckptfs_tensor_emit_rect(backwards, b, r0, r1, c0, c1);
            CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
            g_autoptr(GByteArray) want = g_byte_array_new();
            for (uint64_t r = r0; r < r1; r++)
                for (uint64_t c = c0; c < c1; c++) {
                    uint64_t at = (c + half) % cols;
                    const CkptfsPiece *pc = &pieces[at < 9 ? 0 : at < 20 ? 1 : 2];
                    uint64_t cs = pc->col_stride ? pc->col_stride : isz;
                    CkptfsStridedItem one = {.src = pc->src, .base = pc->offset + (r - pc->row0) * pc->row_stride +
                                                                     (at - pc->col0) * cs};
                    uint8_t el[2];
                    reference_element(s, &one, 0, 0, isz, false, el);
                    g_byte_array_append(want, el, 2);
                }
            g_autofree uint8_t *buf = g_malloc(want->len);
            ok += ckptfs_plan_size(plan) == want->len &&
                  ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, want->len, 0, NULL) == (int64_t)want->len &&
                  memcmp(buf, want->data, want->len) == 0;
            ckptfs_plan_free(plan);
        }
        tap_ok(ok == total, "%s: rectangles of the halves exchanged equal the naive copy (%d/%d)",
               way == 0 ? "emit_rect_swapped" : "pieces swapped", ok, total);
    }
    ckptfs_catalog_free(catalog);
}

/* A matrix's pieces (one row-major, one stored transposed) seen transposed by
 * ckptfs_piece_transposed (a source's CKPTFS_RECIPE_TRANSPOSED key read back): the tensor they
 * make, read row by row, equals the naive copy where element (r, c) is the stored (c, r). */
static void test_transposed_pieces(const RandomSources *s, GRand *rng)
{
    const uint64_t rows = 11, cols = 17;
    const size_t isz = 2;
    CkptfsPiece pieces[2] = {
        {.row0 = 0, .row1 = rows, .col0 = 0, .col1 = 7, .src = 0, .offset = 700, .row_stride = 7 * isz},
        {.row0 = 0, .row1 = rows, .col0 = 7, .col1 = cols, .src = 1, .offset = 3000, .row_stride = isz,
         .col_stride = (rows + 3) * isz},
    };
    CkptfsPiece seen[2] = {ckptfs_piece_transposed(&pieces[0], isz), ckptfs_piece_transposed(&pieces[1], isz)};
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    uint64_t shape[2] = {cols, rows};
    GError *error = NULL;
    const CkptfsTensor *t = ckptfs_catalog_add_pieces(catalog, "seen", CKPTFS_DTYPE_BF16, 2, shape, seen, 2, &error);
    tap_ok(t != NULL, "the transposed pieces tile the [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "] matrix (%s)",
           cols, rows, error ? error->message : "ok");
    g_clear_error(&error);
    int ok = 0, total = 200;
    for (int k = 0; k < total && t; k++) {
        uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)cols);
        uint64_t r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0 + 1, (gint32)cols + 1);
        uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)rows);
        uint64_t c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0 + 1, (gint32)rows + 1);
        CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
        ckptfs_tensor_emit_rect(t, b, r0, r1, c0, c1);
        CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
        g_autoptr(GByteArray) want = g_byte_array_new();
        for (uint64_t r = r0; r < r1; r++)
            for (uint64_t c = c0; c < c1; c++) { /* the stored element (c, r) */
                const CkptfsPiece *pc = &pieces[r < 7 ? 0 : 1];
                uint64_t cs = pc->col_stride ? pc->col_stride : isz;
                CkptfsStridedItem one = {.src = pc->src, .base = pc->offset + c * pc->row_stride + (r - pc->col0) * cs};
                uint8_t el[2];
                reference_element(s, &one, 0, 0, isz, false, el);
                g_byte_array_append(want, el, 2);
            }
        g_autofree uint8_t *buf = g_malloc(want->len);
        ok += ckptfs_plan_size(plan) == want->len &&
              ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, want->len, 0, NULL) == (int64_t)want->len &&
              memcmp(buf, want->data, want->len) == 0;
        ckptfs_plan_free(plan);
    }
    tap_ok(ok == total, "rectangles of the pieces seen transposed equal the naive copy (%d/%d)", ok, total);
    ckptfs_catalog_free(catalog);
}

/* read(2)-family calls this process made so far (/proc/self/io's syscr). */
static long read_calls(void)
{
    g_autofree char *io = NULL;
    if (!g_file_get_contents("/proc/self/io", &io, NULL, NULL))
        return -1;
    const char *at = strstr(io, "syscr:");
    return at ? strtol(at + 6, NULL, 10) : -1;
}

/* One expert's down_proj of a Qwen3-30B-A3B-shaped fused tensor stored transposed ([F, H] =
 * [768, 2048] bf16 served as [2048, 768]): a 1 MiB read reads each column's run once, in few
 * calls, not one per element. */
static void test_few_reads(const RandomSources *s)
{
    const uint64_t h = 2048, f = 768;
    CkptfsStridedItem down = {.src = 0, .base = 4096, .row_stride = 2, .col_stride = h * 2, .cols = f};
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, h, &down, 1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    size_t len = 1u << 20;
    g_autofree uint8_t *buf = g_malloc(len);
    long before = read_calls();
    int64_t got = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, len, 333, NULL);
    long calls = read_calls() - before;
    if (before < 0) {
        tap_skip(1, "no /proc/self/io");
    } else {
        tap_ok(got == (int64_t)len && calls > 0 && calls <= 64,
               "a 1 MiB read of a transposed [2048, 768] bf16 matrix takes %ld read calls (at most 64)", calls);
    }
    g_autoptr(GByteArray) want = reference_rows(s, &down, 1, h, 2, false);
    tap_ok(got == (int64_t)len && memcmp(buf, want->data + 333, len) == 0, "and gives the transposed bytes");
    ckptfs_plan_free(plan);
}

/* The files a transposed plan reads from (checked at open), and prefetch over one. */
static void test_sources_and_prefetch(const RandomSources *s)
{
    CkptfsStridedItem items[2] = {{.src = 1, .base = 100, .row_stride = 2, .col_stride = 1000, .cols = 30},
                                  {.src = 0, .base = 8, .row_stride = 4, .col_stride = 2000, .cols = 5}};
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, "header", 6);
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 200, items, 2);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    tap_ok(srcs->len == 2 && g_array_index(srcs, guint32, 0) == 1 && g_array_index(srcs, guint32, 1) == 0,
           "a transposed plan's sources are its items' files (%u)", srcs->len);
    ckptfs_plan_prefetch(plan, s->files, 0, ckptfs_plan_size(plan));
    ckptfs_plan_prefetch(plan, s->files, 1000, 3);
    uint8_t buf[64];
    tap_ok(ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, sizeof buf, 6, NULL) == (int64_t)sizeof buf,
           "prefetch over it, whole and a few bytes, then a read");
    ckptfs_plan_free(plan);
}

/* A source file changed in place under a plan: a transposed read fails naming it. */
static void test_source_changed(RandomSources *s)
{
    CkptfsStridedItem item = {.src = 1, .base = 0, .row_stride = 2, .col_stride = 400, .cols = 50};
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 100, &item, 1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autofree char *why = NULL;
    bool fails = random_sources_change_fails(s, plan, 1, &why);
    tap_ok(fails, "a source changed in place under the plan: the transposed read fails naming it (%s)", why);
    ckptfs_plan_free(plan);
}

/* Read as a mount with mapped reads reads them, transposed where the sources' cached pages lie:
 * the random extents, and one as wide as a stripe of the mapped path is several (an expert's fc1
 * [2F, H] served [H, 2F], two items, stored columns 300 bytes apart), read whole and 1 MiB and
 * smaller reads at random places. */
static void test_mapped(RandomSources *s, CkptfsLeaseWatch *watch, GRand *rng)
{
    if (!random_sources_start_mapped(s, watch)) {
        tap_skip(8, "no lease on %s (its file system, or leases off): nothing is read mapped", s->dir);
        return;
    }
    test_random_extents(s, rng);
    int random_mapped = s->from_map;
    enum { NREP = 150 };
    CkptfsStridedItem items[2] = {
        {.src = 0, .base = 6, .row_stride = 2, .col_stride = 2 * NREP, .cols = 2500},
        {.src = 1, .base = 1000, .row_stride = 2, .col_stride = 2 * NREP, .cols = 1100},
    };
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, NREP, items, 2);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autoptr(GByteArray) want = reference_rows(s, items, 2, NREP, 2, false);
    g_autofree uint8_t *buf = g_malloc(want->len);
    int ok = 0, reads = 0;
    s->from_map = 0;
    for (int r = 0; r < 60; r++, reads++) {
        uint64_t off = r == 0 ? 0 : (uint64_t)g_rand_int_range(rng, 0, (gint32)want->len);
        /* the draw first: MIN evaluates its arguments twice */
        uint64_t draw = r % 2 ? 1u << 20 : (uint64_t)g_rand_int_range(rng, 1, 70000);
        uint64_t len = r == 0 ? want->len : MIN(want->len - off, draw);
        ok += random_sources_read(s, plan, buf, (size_t)len, off, NULL) == (int64_t)len && memcmp(buf, want->data + off, len) == 0;
    }
    tap_ok(ok == reads, "mapped reads, a wide expert's [H, 2F]: whole and at random places equal the naive transpose "
           "(%d/%d)", ok, reads);
    tap_ok(random_mapped > 300 && s->from_map == reads, "  transposed from the mapping: %d reads of random extents, "
           "%d/%d of the wide one", random_mapped, s->from_map, reads);
    ckptfs_plan_free(plan);
    g_clear_pointer(&s->refs, g_free);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(20261128);
    /* the lease signals blocked before any thread is made, as the daemon does */
    CkptfsLeaseWatch *watch = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(NULL) : NULL;
    RandomSources s = {0};
    random_sources_init(&s, NSRC, SRC_SIZE, rng, "transpose");
    if (watch != NULL)
        ckptfs_lease_watch_add(watch, s.files);
    test_random_extents(&s, rng);
    test_adjacent_is_gather(&s);
    test_catalog_pieces(&s, rng);
    test_swapped_halves(&s, rng);
    test_transposed_pieces(&s, rng);
    test_few_reads(&s);
    test_sources_and_prefetch(&s);
    test_mapped(&s, watch, rng);
    test_source_changed(&s);
    random_sources_clear(&s);
    if (watch != NULL)
        ckptfs_lease_watch_free(watch);
    g_rand_free(rng);
    return tap_done();
}
