/* Interleaved TRANSPOSE items (WAYS items whose columns alternate in runs: GPT-OSS's gate and up
 * joined into gate_up_proj) against a naive element-by-element interleave: random extents of
 * sets and lone items over random source files, read whole, at random offsets and lengths, and
 * starting and ending inside an element, a run and a row; bf16 and fp32 as stored and fp32
 * served as bf16. Catalog pieces every other column (a gate and up per expert and TP shard)
 * tile the tensor, are read as rectangles cut anywhere and with their column halves exchanged,
 * and overlapping ones are refused. Both again through a leased mapping, transposed from it. A
 * source changed under the plan fails the read naming it. */
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
#define SRC_SIZE (2u << 20)

/* Appends to OUT the stored element at AT of source SRC, as OSZ bytes: as stored, or fp32 ->
 * bf16 by the plain formula (round to nearest even on the upper half; NaN -> 0xFFFF). */
static void append_element(GByteArray *out, const RandomSources *s, uint32_t src, uint64_t at, size_t isz, bool to_bf16)
{
    const uint8_t *p = s->data[src] + at;
    if (!to_bf16) {
        g_byte_array_append(out, p, (guint)isz);
        return;
    }
    uint32_t u;
    memcpy(&u, p, 4);
    uint16_t h = (u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0
                     ? 0xFFFF
                     : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    g_byte_array_append(out, (const guint8 *)&h, 2);
}

/* Element (j, k) of item IT into OUT. */
static void append_item_element(GByteArray *out, const RandomSources *s, const CkptfsStridedItem *it, uint64_t j,
                                uint64_t k, size_t isz, bool to_bf16)
{
    append_element(out, s, it->src, it->base + j * it->row_stride + k * it->col_stride, isz, to_bf16);
}

/* The naive bytes of NREP rows of ITEMS: a lone item's columns in order, a set's runs taken
 * from each of its items in turn. */
static GByteArray *reference_rows(const RandomSources *s, const CkptfsStridedItem *items, unsigned nitems, uint64_t nrep,
                                  size_t isz, bool to_bf16)
{
    GByteArray *want = g_byte_array_new();
    for (uint64_t j = 0; j < nrep; j++)
        for (unsigned i = 0; i < nitems;) {
            unsigned ways = MAX(items[i].ways, 1u);
            uint64_t run = ways > 1 ? items[i].run : items[i].cols;
            for (uint64_t r0 = 0; r0 < items[i].cols; r0 += run)
                for (unsigned w = 0; w < ways; w++)
                    for (uint64_t k = r0; k < r0 + run; k++)
                        append_item_element(want, s, &items[i + w], j, k, isz, to_bf16);
            i += ways;
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

/* A random item of COLS columns over NREP rows: stored transposed (a column's rows adjacent, as
 * an expert's gate read into gate_up_proj) or row-major. */
static CkptfsStridedItem random_item(GRand *rng, uint64_t nrep, uint64_t cols, size_t isz)
{
    CkptfsStridedItem it = {.src = (uint32_t)g_rand_int_range(rng, 0, NSRC), .cols = cols};
    if (g_rand_int_range(rng, 0, 4) > 0) {
        it.row_stride = isz;
        it.col_stride = nrep * isz + isz * (uint64_t)g_rand_int_range(rng, 0, 5);
    } else {
        it.col_stride = isz;
        it.row_stride = cols * isz + isz * (uint64_t)g_rand_int_range(rng, 0, 5);
    }
    uint64_t span = (nrep - 1) * it.row_stride + (cols - 1) * it.col_stride + isz;
    it.base = isz * (uint64_t)g_rand_int_range(rng, 0, (gint32)((SRC_SIZE - span) / isz));
    return it;
}

/* Reads LEN bytes at OFF of PLAN and compares them with WANT's. */
static bool read_equals(RandomSources *s, const CkptfsPlan *plan, const GByteArray *want, uint64_t off, uint64_t len)
{
    g_autofree uint8_t *buf = g_malloc(len + 1);
    int64_t got = random_sources_read(s, plan, buf, (size_t)len, off, NULL);
    return got == (int64_t)len && memcmp(buf, want->data + off, (size_t)len) == 0;
}

/* Random extents: 1-2 sets of 2-3 items interleaved in runs of 1-3 elements (as TP shards of
 * gate and up), a lone item before, between or after them, behind a literal so that the extent
 * starts at an odd offset; read whole, at random places, and starting and ending inside an
 * element, inside a run and inside a row. */
static void test_random_extents(RandomSources *s, GRand *rng)
{
    for (size_t kind = 0; kind < G_N_ELEMENTS(kinds); kind++) {
        const Kind *kd = &kinds[kind];
        size_t isz = ckptfs_dtype_size(kd->stored);
        size_t osz = kd->conv != CKPTFS_CONVERT_NONE ? 2 : isz;
        const char *how = s->refs ? "mapped reads, " : "";
        int whole_ok = 0, reads_ok = 0, reads = 0, cut_ok = 0, cuts = 0, nextents = 50, as_transpose = 0;
        for (int x = 0; x < nextents; x++) {
            uint64_t nrep = (uint64_t)g_rand_int_range(rng, 1, 120);
            CkptfsStridedItem items[8];
            unsigned nitems = 0, sets = (unsigned)g_rand_int_range(rng, 1, 3);
            int lone_at = g_rand_int_range(rng, -1, (gint32)sets + 1); /* -1: none */
            uint64_t run = (uint64_t)g_rand_int_range(rng, 1, 4);
            for (unsigned set = 0; set <= sets; set++) {
                if ((int)set == lone_at)
                    items[nitems++] = random_item(rng, nrep, (uint64_t)g_rand_int_range(rng, 1, 40), isz);
                if (set == sets)
                    break;
                unsigned ways = (unsigned)g_rand_int_range(rng, 2, 4);
                uint64_t cols = run * (uint64_t)g_rand_int_range(rng, 1, 30);
                for (unsigned w = 0; w < ways; w++) {
                    items[nitems] = random_item(rng, nrep, cols, isz);
                    items[nitems].ways = w == 0 ? ways : 0, items[nitems].run = run;
                    nitems++;
                }
            }
            CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
            ckptfs_plan_add_literal(b, "abc", 3);
            ckptfs_plan_add_strided(b, kd->stored, kd->conv, nrep, items, nitems);
            ckptfs_plan_add_literal(b, "z", 1);
            CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
            as_transpose += ckptfs_plan_extent_count(plan) == 3;
            g_autoptr(GByteArray) want = g_byte_array_new();
            g_byte_array_append(want, (const guint8 *)"abc", 3);
            g_autoptr(GByteArray) body = reference_rows(s, items, nitems, nrep, isz, kd->conv != CKPTFS_CONVERT_NONE);
            g_byte_array_append(want, body->data, body->len);
            g_byte_array_append(want, (const guint8 *)"z", 1);
            whole_ok += ckptfs_plan_size(plan) == want->len && read_equals(s, plan, want, 0, want->len);
            for (int r = 0; r < 30; r++) {
                uint64_t off = (uint64_t)g_rand_int_range(rng, 0, (gint32)want->len);
                uint64_t len = (uint64_t)g_rand_int_range(rng, 1, (gint32)(want->len - off + 1));
                uint64_t small = (uint64_t)g_rand_int_range(rng, 1, 9); /* MIN evaluates twice */
                if (r % 3 == 0) /* small reads: part of an element, of a run */
                    len = MIN(len, small);
                reads++;
                reads_ok += read_equals(s, plan, want, off, len);
            }
            /* From the second byte of an element inside a row (inside a run where runs are
             * longer than one) to the first byte of one inside a later row. */
            uint64_t width = body->len / nrep / osz;
            for (int r = 0; r < 6; r++) {
                uint64_t j0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)nrep), j1 = MIN(nrep - 1, j0 + (r % 3));
                uint64_t e0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)width);
                uint64_t e1 = (uint64_t)g_rand_int_range(rng, 0, (gint32)width);
                uint64_t off = 3 + (j0 * width + e0) * osz + 1, end = 3 + (j1 * width + e1) * osz + 1;
                if (end <= off)
                    continue;
                cuts++;
                cut_ok += read_equals(s, plan, want, off, end - off);
            }
            ckptfs_plan_free(plan);
        }
        tap_ok(as_transpose == nextents, "%s%s: interleaved items are one TRANSPOSE extent (%d/%d)", how, kd->what,
               as_transpose, nextents);
        tap_ok(whole_ok == nextents, "%s%s: random interleaved extents read whole equal the naive interleave (%d/%d)",
               how, kd->what, whole_ok, nextents);
        tap_ok(reads_ok == reads, "%s%s: reads at random offsets and lengths equal it (%d/%d)", how, kd->what, reads_ok,
               reads);
        tap_ok(cut_ok == cuts && cuts > 0, "%s%s: reads from inside an element, a run and a row to inside a later row "
               "equal it (%d/%d)", how, kd->what, cut_ok, cuts);
    }
}

/* GPT-OSS's gate_up_proj [E, H, 2F] joined from Megatron's fc1 rank files: shard t's expert e's
 * fc1 [2 * FS, H] row-major (gate's FS rows, then up's) in source t, the fused tensor's element
 * (e, i, 2 * (t * FS + r) + s) its row s * FS + r, column i. */
enum { E = 3, H = 37, FS = 5, TP = 2, F = FS * TP };

static uint64_t fc1_base(uint32_t t, uint64_t e, size_t isz)
{
    return 4096 + (t * 7 + e) * (uint64_t)(2 * FS * H) * isz + 64 * isz;
}

/* The naive [E * H, 2F] bytes of rows [r0, r1) x columns [c0, c1), columns SWAPPED halves. */
static GByteArray *fused_reference(const RandomSources *s, size_t isz, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1,
                                   bool swapped)
{
    GByteArray *want = g_byte_array_new();
    for (uint64_t row = r0; row < r1; row++)
        for (uint64_t col = c0; col < c1; col++) {
            uint64_t c = swapped ? (col + F) % (2 * F) : col;
            uint64_t e = row / H, i = row % H, o = c / 2, sel = c % 2, t = o / FS, r = o % FS;
            append_element(want, s, (uint32_t)t, fc1_base((uint32_t)t, e, isz) + ((sel * FS + r) * H + i) * isz, isz,
                           false);
        }
    return want;
}

/* The pieces of that tensor: a gate and an up per expert and shard, every other column. */
static unsigned fused_pieces(CkptfsPiece *pieces, size_t isz)
{
    unsigned n = 0;
    for (uint64_t e = 0; e < E; e++)
        for (uint32_t t = 0; t < TP; t++)
            for (uint64_t sel = 0; sel < 2; sel++) {
                uint64_t col0 = 2 * t * FS + sel;
                pieces[n++] = (CkptfsPiece){.row0 = e * H, .row1 = (e + 1) * H, .col0 = col0,
                                            .col1 = col0 + 2 * (FS - 1) + 1, .col_step = 2, .src = t,
                                            .offset = fc1_base(t, e, isz) + sel * FS * H * isz, .row_stride = isz,
                                            .col_stride = H * isz};
            }
    return n;
}

/* Reads PLAN whole and compares it with WANT. */
static bool plan_equals(RandomSources *s, CkptfsPlan *plan, const GByteArray *want)
{
    bool same = ckptfs_plan_size(plan) == want->len && read_equals(s, plan, want, 0, want->len);
    ckptfs_plan_free(plan);
    return same;
}

static void test_catalog_pieces(RandomSources *s, GRand *rng)
{
    size_t isz = 2;
    CkptfsPiece pieces[E * TP * 2];
    unsigned n = fused_pieces(pieces, isz);
    uint64_t shape[3] = {E, H, 2 * F};
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    GError *error = NULL;
    const CkptfsTensor *t = ckptfs_catalog_add_reshaped(catalog, "gate_up_proj", CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_BF16,
                                                        3, shape, E * H, pieces, n, &error);
    tap_ok(t != NULL && t->npieces == E * TP * 2, "%u pieces every other column tile [%d, %d, %d] (%s)", n, E, H,
           2 * F, error ? error->message : "ok");
    g_clear_error(&error);
    if (t == NULL) {
        ckptfs_catalog_free(catalog);
        return;
    }
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_tensor_emit(t, b);
    g_autoptr(GByteArray) whole = fused_reference(s, isz, 0, E * H, 0, 2 * F, false);
    tap_ok(plan_equals(s, ckptfs_plan_builder_finish(b), whole), "read whole: the naive interleave of the shards' "
           "gate and up");
    int rects_ok = 0, swapped_ok = 0, nrects = 200;
    for (int x = 0; x < nrects; x++) {
        uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, E * H), r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0 + 1,
                                                                                               E * H + 1);
        uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, 2 * F), c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0 + 1,
                                                                                              2 * F + 1);
        b = ckptfs_plan_builder_new();
        ckptfs_tensor_emit_rect(t, b, r0, r1, c0, c1);
        g_autoptr(GByteArray) want = fused_reference(s, isz, r0, r1, c0, c1, false);
        rects_ok += plan_equals(s, ckptfs_plan_builder_finish(b), want);
        b = ckptfs_plan_builder_new();
        ckptfs_tensor_emit_rect_swapped(t, b, r0, r1, c0, c1);
        g_autoptr(GByteArray) swapped = fused_reference(s, isz, r0, r1, c0, c1, true);
        swapped_ok += plan_equals(s, ckptfs_plan_builder_finish(b), swapped);
    }
    tap_ok(rects_ok == nrects, "random rectangles (cut inside a gate/up pair, a shard, an expert) equal the naive "
           "interleave (%d/%d)", rects_ok, nrects);
    tap_ok(swapped_ok == nrects, "and with their column halves exchanged (%d/%d)", swapped_ok, nrects);
    ckptfs_catalog_free(catalog);

    /* Two gate pieces on the same columns, and a piece whose col1 is not its last column + 1. */
    CkptfsPiece overlap[E * TP * 2];
    memcpy(overlap, pieces, sizeof overlap);
    overlap[1].col0 = overlap[0].col0, overlap[1].col1 = overlap[0].col1;
    CkptfsPiece loose[E * TP * 2];
    memcpy(loose, pieces, sizeof loose);
    loose[0].col1 += 1;
    const CkptfsPiece *bad[2] = {overlap, loose};
    const char *what[2] = {"two interleaved pieces on the same columns", "a piece's end past its last column"};
    for (int i = 0; i < 2; i++) {
        catalog = ckptfs_catalog_new();
        bool refused = ckptfs_catalog_add_reshaped(catalog, "gate_up_proj", CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_BF16, 3,
                                                   shape, E * H, bad[i], n, &error) == NULL;
        tap_ok(refused && error && strstr(error->message, "gate_up_proj"), "%s: refused naming the tensor (%s)",
               what[i], error ? error->message : "accepted");
        g_clear_error(&error);
        ckptfs_catalog_free(catalog);
    }
}

/* A source file changed in place under a plan: an interleaved read fails naming it. */
static void test_source_changed(RandomSources *s)
{
    CkptfsStridedItem items[2] = {{.src = 1, .ways = 2, .run = 1, .base = 0, .row_stride = 2, .col_stride = 400,
                                   .cols = 50},
                                  {.src = 1, .base = 200, .row_stride = 2, .col_stride = 400, .cols = 50}};
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_strided(b, CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 100, items, 2);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autofree char *why = NULL;
    bool fails = random_sources_change_fails(s, plan, 1, &why);
    tap_ok(fails, "a source changed in place under the plan: the interleaved read fails naming it (%s)", why);
    ckptfs_plan_free(plan);
}

/* The random extents and the catalog's pieces again, read as a mount with mapped reads reads them:
 * transposed where the sources' cached pages lie. */
static void test_mapped(RandomSources *s, CkptfsLeaseWatch *watch, GRand *rng)
{
    if (!random_sources_start_mapped(s, watch)) {
        tap_skip(19, "no lease on %s (its file system, or leases off): nothing is read mapped", s->dir);
        return;
    }
    test_random_extents(s, rng);
    int reads = s->from_map;
    test_catalog_pieces(s, rng);
    tap_ok(reads > 1000 && s->from_map > reads, "mapped reads transposed from the mapping: %d reads of random "
           "extents, %d of catalog pieces", reads, s->from_map - reads);
    g_clear_pointer(&s->refs, g_free);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(20261129);
    /* the lease signals blocked before any thread is made, as the daemon does */
    CkptfsLeaseWatch *watch = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(NULL) : NULL;
    RandomSources s = {0};
    random_sources_init(&s, NSRC, SRC_SIZE, rng, "interleave");
    if (watch != NULL)
        ckptfs_lease_watch_add(watch, s.files);
    test_random_extents(&s, rng);
    test_catalog_pieces(&s, rng);
    test_mapped(&s, watch, rng);
    test_source_changed(&s);
    random_sources_clear(&s);
    if (watch != NULL)
        ckptfs_lease_watch_free(watch);
    g_rand_free(rng);
    return tap_done();
}
