/* The extent engine against a naive reference: random plans over random source files, then
 * thousands of random reads, including reads across extent boundaries and past EOF. Also the
 * catalog's rectangle emission over tensors made of several pieces. */
#include <glib.h>
#include <glib/gstdio.h>
#include <math.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckptfs/catalog.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "random_sources.h"
#include "tap.h"

#define NSRC 3
#define SRC_SIZE 65536

/* bf16 of fp32 bits by the definition, not by bit tricks: the nearer of the two bf16 values
 * around it (compared in double), the even one on a tie; NaN -> NAN_BITS (what torch gives:
 * 0xFFFF from a float tensor, 0x7FC0 from a half tensor). */
static uint16_t reference_bf16_nan(uint32_t u, uint16_t nan_bits)
{
    float f;
    memcpy(&f, &u, 4);
    if (isnan(f))
        return nan_bits;
    uint32_t lo = u & 0xFFFF0000u, hi = lo + 0x10000u;
    if ((lo & 0x7FFFFFFFu) == 0x7F800000u) /* an infinity is exact */
        return (uint16_t)(lo >> 16);
    float flo, fhi;
    memcpy(&flo, &lo, 4);
    memcpy(&fhi, &hi, 4);
    double dlo = fabs((double)f - (double)flo);
    /* hi of the largest finite magnitude is infinity: rounding there goes up past the max. */
    double dhi = isinf(fhi) ? fabs(ldexp(1.0, 128) * (f < 0 ? -1 : 1) - (double)f) : fabs((double)fhi - (double)f);
    if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1u) == 0))
        return (uint16_t)(lo >> 16);
    return (uint16_t)(hi >> 16);
}

static uint16_t reference_bf16(uint32_t u)
{
    return reference_bf16_nan(u, 0xFFFF);
}

/* Appends a random extent to the plan and the same bytes to EXPECT. */
static void add_random_extent(CkptfsPlanBuilder *b, GByteArray *expect, const RandomSources *s,
                              GRand *rng)
{
    switch (g_rand_int_range(rng, 0, 6)) {
    case 0: {
        uint8_t lit[300];
        size_t n = (size_t)g_rand_int_range(rng, 1, sizeof lit);
        for (size_t i = 0; i < n; i++)
            lit[i] = (uint8_t)g_rand_int(rng);
        ckptfs_plan_add_literal(b, lit, n);
        g_byte_array_append(expect, lit, (guint)n);
        break;
    }
    case 1: {
        size_t n = (size_t)g_rand_int_range(rng, 1, 5000);
        ckptfs_plan_add_zero(b, n);
        g_byte_array_set_size(expect, expect->len + (guint)n);
        memset(expect->data + expect->len - n, 0, n);
        break;
    }
    case 2: {
        uint32_t src = (uint32_t)g_rand_int_range(rng, 0, NSRC);
        uint64_t off = (uint64_t)g_rand_int_range(rng, 0, SRC_SIZE - 1);
        uint64_t len = (uint64_t)g_rand_int_range(rng, 1, (gint32)(SRC_SIZE - off) + 1);
        ckptfs_plan_add_run(b, src, off, len);
        g_byte_array_append(expect, s->data[src] + off, (guint)len);
        break;
    }
    case 4:
    case 5: {
        /* fp32 -> bf16 or bf16 -> fp32 of a gather of whole elements. */
        bool narrow = g_rand_boolean(rng);
        size_t isz = narrow ? 4 : 2;
        CkptfsGatherItem items[3];
        uint32_t nitems = (uint32_t)g_rand_int_range(rng, 1, 4);
        uint64_t nrep = (uint64_t)g_rand_int_range(rng, 1, 30);
        for (uint32_t k = 0; k < nitems; k++) {
            items[k].src = (uint32_t)g_rand_int_range(rng, 0, NSRC);
            items[k].len = isz * (uint64_t)g_rand_int_range(rng, 0, 20);
            items[k].stride = items[k].len + (uint64_t)g_rand_int_range(rng, 0, 3) * isz * g_rand_int_range(rng, 0, 2);
            uint64_t span = items[k].stride * (nrep - 1) + items[k].len;
            items[k].base = (uint64_t)g_rand_int_range(rng, 0, (gint32)(SRC_SIZE - span));
        }
        ckptfs_plan_add_convert(b, narrow ? CKPTFS_CONVERT_F32_TO_BF16 : CKPTFS_CONVERT_BF16_TO_F32, nrep,
                                items, nitems);
        for (uint64_t j = 0; j < nrep; j++)
            for (uint32_t k = 0; k < nitems; k++)
                for (uint64_t e = 0; e < items[k].len / isz; e++) {
                    const uint8_t *at = s->data[items[k].src] + items[k].base + j * items[k].stride + e * isz;
                    if (narrow) {
                        uint32_t u;
                        memcpy(&u, at, 4);
                        uint16_t h = reference_bf16(u);
                        g_byte_array_append(expect, (const uint8_t *)&h, 2);
                    } else {
                        uint16_t h;
                        memcpy(&h, at, 2);
                        float f = ldexpf(1.0f, 0); /* value rebuilt from sign, exponent, mantissa */
                        uint32_t exp = (h >> 7) & 0xFFu, mant = h & 0x7Fu;
                        if (exp == 0xFF)
                            f = mant ? NAN : INFINITY;
                        else if (exp == 0)
                            f = ldexpf((float)mant, -133);
                        else
                            f = ldexpf((float)(mant | 0x80u), (int)exp - 134);
                        uint32_t u;
                        if (exp == 0xFF && mant) /* NaN: payload kept, bits as stored */
                            u = (uint32_t)h << 16;
                        else {
                            if (h & 0x8000u)
                                f = -f;
                            memcpy(&u, &f, 4);
                        }
                        g_byte_array_append(expect, (const uint8_t *)&u, 4);
                    }
                }
        break;
    }
    default: {
        CkptfsGatherItem items[4];
        uint32_t nitems = (uint32_t)g_rand_int_range(rng, 1, 5);
        uint64_t nrep = (uint64_t)g_rand_int_range(rng, 1, 40);
        for (uint32_t k = 0; k < nitems; k++) {
            items[k].src = (uint32_t)g_rand_int_range(rng, 0, NSRC);
            items[k].len = (uint64_t)g_rand_int_range(rng, 0, 50);
            items[k].stride = (uint64_t)g_rand_int_range(rng, 0, 200);
            uint64_t span = items[k].stride * (nrep - 1) + items[k].len;
            items[k].base = (uint64_t)g_rand_int_range(rng, 0, (gint32)(SRC_SIZE - span));
        }
        ckptfs_plan_add_gather(b, nrep, items, nitems);
        for (uint64_t j = 0; j < nrep; j++)
            for (uint32_t k = 0; k < nitems; k++)
                g_byte_array_append(expect, s->data[items[k].src] + items[k].base + j * items[k].stride,
                                    (guint)items[k].len);
        break;
    }
    }
}

static void test_random_plans(const RandomSources *s, GRand *rng)
{
    int plans_ok = 0, reads_ok = 0, reads = 0;
    for (int p = 0; p < 40; p++) {
        CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
        GByteArray *expect = g_byte_array_new();
        int n = g_rand_int_range(rng, 0, 60);
        for (int i = 0; i < n; i++)
            add_random_extent(b, expect, s, rng);
        CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
        bool size_ok = ckptfs_plan_size(plan) == expect->len;
        plans_ok += size_ok;
        uint8_t *buf = g_malloc(expect->len + 4096);
        for (int r = 0; r < 250; r++) {
            uint64_t off = (uint64_t)g_rand_int_range(rng, 0, (gint32)expect->len + 100);
            size_t len = (size_t)g_rand_int_range(rng, 0, 4096);
            int64_t got = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, len, off, NULL);
            int64_t want = off >= expect->len ? 0 : (int64_t)MIN((uint64_t)len, expect->len - off);
            reads++;
            if (got == want && (want == 0 || memcmp(buf, expect->data + off, (size_t)want) == 0))
                reads_ok++;
            else if (reads - reads_ok < 5)
                tap_diag("plan %d read off=%llu len=%zu: got %lld want %lld", p,
                         (unsigned long long)off, len, (long long)got, (long long)want);
        }
        /* Whole-file read in one call. */
        int64_t got = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, expect->len + 10, 0, NULL);
        reads++;
        if (got == (int64_t)expect->len && (expect->len == 0 || memcmp(buf, expect->data, expect->len) == 0))
            reads_ok++;
        g_free(buf);
        g_byte_array_unref(expect);
        ckptfs_plan_free(plan);
    }
    tap_ok(plans_ok == 40, "random plans have the reference size (%d/40)", plans_ok);
    tap_ok(reads_ok == reads, "random reads equal the reference (%d/%d)", reads_ok, reads);
}

/* The conversions on their hard cases: ties both ways, rounding past the largest finite value,
 * signed zeros, subnormals, infinities, NaNs of both signs; every half-precision value. */
static void test_conversions(GRand *rng)
{
    static const uint32_t special[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00008000, 0x00018000, 0x3F808000,
        0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000,
        0xFF800000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xFF800001, 0x3F800000, 0x477FE000};
    int ok = 0, total = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(special) + 100000; i++) {
        uint32_t u = i < G_N_ELEMENTS(special) ? special[i] : g_rand_int(rng);
        uint16_t got;
        ckptfs_convert_run(CKPTFS_CONVERT_F32_TO_BF16, &u, &got, 1);
        total++;
        if (got == reference_bf16(u))
            ok++;
        else if (total - ok < 5)
            tap_diag("fp32 %08x -> bf16 %04x, want %04x", u, got, reference_bf16(u));
    }
    tap_ok(ok == total, "fp32 -> bf16 rounds to nearest even, NaN -> 0xFFFF (%d/%d values)", ok, total);
    int ok16 = 0, okb = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t half = (uint16_t)h;
        uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, want;
        if (exp == 0x1F) {
            want = ((h & 0x8000u) << 16) | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u);
        } else {
            float f = exp ? ldexpf((float)(mant | 0x400u), (int)exp - 25) : ldexpf((float)mant, -24);
            if (h & 0x8000u)
                f = -f;
            memcpy(&want, &f, 4);
        }
        uint32_t got;
        uint16_t gotb;
        ckptfs_convert_run(CKPTFS_CONVERT_F16_TO_F32, &half, &got, 1);
        ckptfs_convert_run(CKPTFS_CONVERT_F16_TO_BF16, &half, &gotb, 1);
        ok16 += got == want;
        okb += gotb == reference_bf16_nan(want, 0x7FC0);
    }
    tap_ok(ok16 == 65536, "fp16 -> fp32 is exact for every half value, NaNs made quiet (%d/65536)", ok16);
    tap_ok(okb == 65536, "fp16 -> bf16 = fp16 -> fp32 -> bf16 for every half value (%d/65536)", okb);
    tap_ok(ckptfs_convert_find(CKPTFS_DTYPE_F32, CKPTFS_DTYPE_BF16) == CKPTFS_CONVERT_F32_TO_BF16 &&
               ckptfs_convert_find(CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_BF16) == CKPTFS_CONVERT_NONE &&
               ckptfs_convert_find(CKPTFS_DTYPE_I64, CKPTFS_DTYPE_BF16) == CKPTFS_CONVERT_NONE,
           "conversions exist between float types only");
    /* w - 1 and w + 1 in the weights' type (a zero-centred norm and back): in fp32, rounded to
     * nearest even, as torch computes them on bf16 */
    int shifted = 0, both_ways = 0, near_one = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        uint16_t bits = (uint16_t)b, less, plus, back;
        uint32_t u = b << 16, want_less, want_plus;
        float f;
        memcpy(&f, &u, 4);
        float fl = f - 1.0f, fp = f + 1.0f;
        memcpy(&want_less, &fl, 4);
        memcpy(&want_plus, &fp, 4);
        ckptfs_convert_run(CKPTFS_CONVERT_BF16_LESS_ONE, &bits, &less, 1);
        ckptfs_convert_run(CKPTFS_CONVERT_BF16_PLUS_ONE, &bits, &plus, 1);
        ckptfs_convert_run(CKPTFS_CONVERT_BF16_PLUS_ONE, &less, &back, 1);
        shifted += less == reference_bf16(want_less) && plus == reference_bf16(want_plus);
        bool near = f >= 0.5f && f < 256.0f; /* where w - 1 is exact in bf16 */
        near_one += near;
        both_ways += near && back == bits;
    }
    tap_ok(shifted == 65536, "bf16 less one and plus one, in fp32 rounded to nearest even, for every value (%d/65536)",
           shifted);
    tap_ok(both_ways == near_one, "bf16 weights in [0.5, 256) come back bit for bit from less one then plus one "
           "(%d/%d)", both_ways, near_one);
    tap_ok(ckptfs_convert_shift(CKPTFS_DTYPE_BF16, -1) == CKPTFS_CONVERT_BF16_LESS_ONE &&
               ckptfs_convert_shift(CKPTFS_DTYPE_F32, 1) == CKPTFS_CONVERT_F32_PLUS_ONE &&
               ckptfs_convert_shift(CKPTFS_DTYPE_F16, -1) == CKPTFS_CONVERT_NONE &&
               ckptfs_convert_find(CKPTFS_DTYPE_F32, CKPTFS_DTYPE_F32) == CKPTFS_CONVERT_NONE,
           "shifts exist for bf16 and fp32 only, and are never found as a conversion between types");
}

/* An FP8 code's value from its definition: sign, exponent, mantissa, bias (E4M3fn: bias 7, no
 * infinities, S.1111.111 NaN; E5M2: bias 15, IEEE infinities and NaNs). */
static double reference_fp8(CkptfsDtype fp8, uint8_t c)
{
    double sign = (c & 0x80) ? -1.0 : 1.0;
    if (fp8 == CKPTFS_DTYPE_F8_E4M3) {
        int exp = (c >> 3) & 15, mant = c & 7;
        if (exp == 15 && mant == 7)
            return NAN;
        return sign * (exp ? ldexp(8 + mant, exp - 10) : ldexp(mant, -9));
    }
    int exp = (c >> 2) & 31, mant = c & 3;
    if (exp == 31)
        return mant ? NAN : sign * INFINITY;
    return sign * (exp ? ldexp(4 + mant, exp - 17) : ldexp(mant, -16));
}

/* Every FP8 code of both formats, alone and times block scales of several magnitudes (the
 * product in fp32, then bf16 by the definition). */
static void test_fp8(void)
{
    static const CkptfsDtype kinds[] = {CKPTFS_DTYPE_F8_E4M3, CKPTFS_DTYPE_F8_E5M2};
    static const float scales[] = {1.0f, 0.5f, 3.0f, 1.0f / 448.0f, 2.3283064e-10f, 0.0123456789f,
                                   65504.0f, 1.0e30f, 1.0e-40f /* subnormal */, 0.0f};
    int values_ok = 0, scaled_ok = 0, scaled_total = 0;
    for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++)
        for (unsigned c = 0; c < 256; c++) {
            double want = reference_fp8(kinds[k], (uint8_t)c);
            float got = ckptfs_fp8_value(kinds[k], (uint8_t)c);
            if (isnan(want) ? isnan(got) : ((double)got == want && !signbit(got) == !signbit(want)))
                values_ok++;
            else
                tap_diag("fp8 kind %zu code %02x: %g, want %g", k, c, (double)got, want);
            for (size_t i = 0; i < G_N_ELEMENTS(scales); i++) {
                uint8_t code = (uint8_t)c;
                uint16_t out;
                ckptfs_convert_fp8_scaled(kinds[k], &code, scales[i], &out, 1);
                float product = (float)want * scales[i];
                uint32_t bits;
                memcpy(&bits, &product, 4);
                scaled_total++;
                if (out == reference_bf16(bits))
                    scaled_ok++;
                else if (scaled_total - scaled_ok < 5)
                    tap_diag("fp8 kind %zu code %02x x %g: %04x, want %04x", k, c, (double)scales[i], out,
                             reference_bf16(bits));
            }
        }
    tap_ok(values_ok == 512, "every E4M3 and E5M2 code decodes to its value (%d/512)", values_ok);
    tap_ok(scaled_ok == scaled_total, "code x block scale -> bf16 as fp32 product then round to nearest even (%d/%d)",
           scaled_ok, scaled_total);
    /* A run: one table for many codes gives what one code at a time gives. */
    uint8_t codes[1000];
    uint16_t run[1000], one[1000];
    for (unsigned i = 0; i < 1000; i++)
        codes[i] = (uint8_t)(i * 37 + 11);
    ckptfs_convert_fp8_scaled(CKPTFS_DTYPE_F8_E4M3, codes, 0.03125f, run, 1000);
    for (unsigned i = 0; i < 1000; i++)
        ckptfs_convert_fp8_scaled(CKPTFS_DTYPE_F8_E4M3, codes + i, 0.03125f, one + i, 1);
    tap_ok(memcmp(run, one, sizeof run) == 0, "a run of 1000 codes equals them one by one");
}

static void test_run_merging(void)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 0, 100, 50);
    ckptfs_plan_add_run(b, 0, 150, 50);
    ckptfs_plan_add_run(b, 1, 200, 10);
    CkptfsGatherItem whole_rows = {.src = 1, .base = 210, .stride = 8, .len = 8};
    ckptfs_plan_add_gather(b, 4, &whole_rows, 1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    tap_is_u64(ckptfs_plan_extent_count(plan), 2, "adjacent runs and back-to-back rows merge");
    tap_is_u64(ckptfs_plan_size(plan), 142, "merged plan size");
    ckptfs_plan_free(plan);
}

/* Which plans are a source file whole (FUSE passthrough hands those files to the kernel). */
static int64_t identical_of(const RandomSources *s, CkptfsPlanBuilder *b)
{
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    int64_t src = ckptfs_plan_identical_file(plan, s->files);
    ckptfs_plan_free(plan);
    return src;
}

static void test_identical_file(const RandomSources *s)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 1, 0, SRC_SIZE);
    tap_ok(identical_of(s, b) == 1, "a run of all of src1 is src1");
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 2, 0, SRC_SIZE / 2);
    ckptfs_plan_add_run(b, 2, SRC_SIZE / 2, SRC_SIZE / 2);
    tap_ok(identical_of(s, b) == 2, "two halves in order (merged into one run) are src2");
    b = ckptfs_plan_builder_new();
    CkptfsGatherItem rows = {.src = 0, .base = 0, .stride = SRC_SIZE / 4, .len = SRC_SIZE / 4};
    ckptfs_plan_add_gather(b, 4, &rows, 1);
    tap_ok(identical_of(s, b) == 0, "back-to-back rows covering src0 are src0");
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 0, 0, SRC_SIZE - 1);
    tap_ok(identical_of(s, b) == -1, "all but its last byte: not the file");
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 0, 1, SRC_SIZE - 1);
    tap_ok(identical_of(s, b) == -1, "all but its first byte: not the file");
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, "x", 1);
    ckptfs_plan_add_run(b, 0, 0, SRC_SIZE);
    tap_ok(identical_of(s, b) == -1, "the file after a header: not the file");
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 0, SRC_SIZE / 2, SRC_SIZE / 2);
    ckptfs_plan_add_run(b, 0, 0, SRC_SIZE / 2);
    tap_ok(identical_of(s, b) == -1, "its halves swapped: not the file");
    b = ckptfs_plan_builder_new();
    CkptfsGatherItem whole = {.src = 0, .base = 0, .stride = 0, .len = SRC_SIZE};
    ckptfs_plan_add_convert(b, CKPTFS_CONVERT_F32_TO_BF16, 1, &whole, 1);
    tap_ok(identical_of(s, b) == -1, "the file converted fp32 -> bf16: not the file");
    b = ckptfs_plan_builder_new();
    tap_ok(identical_of(s, b) == -1, "an empty file: no source file");
}

static void test_read_errors(const RandomSources *s)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, 0, SRC_SIZE - 10, 20); /* runs past the end of src0 */
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    uint8_t buf[32];
    GError *error = NULL;
    int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, sizeof buf, 0, &error);
    tap_ok(n < 0 && error && strstr(error->message, "src0"),
           "a read past a source file's end fails naming the file (%s)",
           error ? error->message : "no error");
    g_clear_error(&error);
    ckptfs_plan_free(plan);
}

/* A 2-D bf16 tensor [rows, cols] split into a grid of pieces, each stored row-major in a
 * different place; rectangles must read back as the naive row-major copy. */
static void test_catalog_rects(const RandomSources *s, GRand *rng)
{
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    const uint64_t rows = 12, cols = 10;
    uint64_t shape[2] = {rows, cols};
    const CkptfsTensor *t0 = ckptfs_catalog_add_contiguous(catalog, "t", CKPTFS_DTYPE_BF16, 2,
                                                           shape, 0, 64);
    tap_ok(t0 && t0->rows == rows && t0->cols == cols && t0->nbytes == rows * cols * 2,
           "contiguous tensor has the 2-D view [12, 10]");
    tap_ok(ckptfs_catalog_add_contiguous(catalog, "t", CKPTFS_DTYPE_BF16, 2, shape, 0, 64) == NULL,
           "a duplicate name is refused");

    /* Pieces: rows cut at 5, columns at 3 and 7 -> 6 pieces in various files. */
    CkptfsTensor t = *t0;
    const uint64_t rcut[] = {0, 5, 12}, ccut[] = {0, 3, 7, 10};
    CkptfsPiece pieces[6] = {{0}};
    uint8_t expect_full[12 * 10 * 2];
    int np = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            CkptfsPiece *pc = &pieces[np];
            pc->row0 = rcut[i], pc->row1 = rcut[i + 1], pc->col0 = ccut[j], pc->col1 = ccut[j + 1];
            pc->src = (uint32_t)(np % NSRC);
            pc->row_stride = (pc->col1 - pc->col0) * 2 + (uint64_t)np; /* padded rows */
            pc->offset = 1000 + 3000 * (uint64_t)np;
            for (uint64_t r = pc->row0; r < pc->row1; r++)
                memcpy(expect_full + (r * cols + pc->col0) * 2,
                       s->data[pc->src] + pc->offset + (r - pc->row0) * pc->row_stride,
                       (pc->col1 - pc->col0) * 2);
            np++;
        }
    t.npieces = 6;
    t.pieces = pieces;
    int ok = 0, total = 0;
    for (int k = 0; k < 300; k++) {
        uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)rows);
        uint64_t r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0, (gint32)rows + 1);
        uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)cols);
        uint64_t c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0, (gint32)cols + 1);
        CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
        ckptfs_tensor_emit_rect(&t, b, r0, r1, c0, c1);
        CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
        uint64_t want_size = (r1 - r0) * (c1 - c0) * 2;
        uint8_t buf[12 * 10 * 2], want[12 * 10 * 2];
        for (uint64_t r = r0; r < r1; r++)
            memcpy(want + (r - r0) * (c1 - c0) * 2, expect_full + (r * cols + c0) * 2, (c1 - c0) * 2);
        int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, sizeof buf, 0, NULL);
        total++;
        if (ckptfs_plan_size(plan) == want_size && n == (int64_t)want_size &&
            memcmp(buf, want, want_size) == 0)
            ok++;
        ckptfs_plan_free(plan);
    }
    tap_ok(ok == total, "rectangles of a 6-piece tensor equal the naive copy (%d/%d)", ok, total);
    ckptfs_catalog_free(catalog);
}


/* Pages of PATH [A, Z) resident in the page cache, from mincore. */
static unsigned resident_pages(const char *path, uint64_t a, uint64_t z)
{
    int fd = open(path, O_RDONLY);
    long page = sysconf(_SC_PAGESIZE);
    off_t size = lseek(fd, 0, SEEK_END);
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    size_t npages = ((size_t)size + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = g_malloc(npages);
    unsigned n = 0;
    if (map != MAP_FAILED && mincore(map, (size_t)size, vec) == 0)
        for (uint64_t p = a / (uint64_t)page; p < (z + (uint64_t)page - 1) / (uint64_t)page && p < npages; p++)
            n += vec[p] & 1;
    if (map != MAP_FAILED)
        munmap(map, (size_t)size);
    g_free(vec);
    close(fd);
    return n;
}

/* Drops PATH (SIZE bytes) from the page cache; false, skipping the next N checks (if any) with
 * the reason, where its pages stay (tmpfs). */
static bool evicted(const char *path, uint64_t size, int n)
{
    int fd = open(path, O_RDONLY);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    unsigned before = resident_pages(path, 0, size);
    if (before > 0)
        tap_skip(n, "the page cache keeps %s (%u pages resident after DONTNEED)", path, before);
    return before == 0;
}

/* Whether the kernel brought in nearly ALL the pages advised: WILLNEED is best effort, and may
 * skip a chunk whose pages it cannot allocate at once (8 of 8192 seen on a busy machine). The bugs
 * these tests catch lost half the pages or more. */
static bool nearly_all(size_t resident, size_t all)
{
    return resident * 20 >= all * 19;
}

/* Prefetch of [OUT, OUT + LEN) of PLAN (one source file at PATH of SIZE bytes, dropped from the
 * page cache first) brings exactly source bytes [LO, HI) in: all their pages, and fewer than 64
 * others (past HI the kernel may read a little ahead). */
static void check_window(const CkptfsPlan *plan, const CkptfsSrcFiles *files, const char *path, uint64_t size,
                         uint64_t out, uint64_t len, uint64_t lo, uint64_t hi, const char *what)
{
    if (!evicted(path, size, 2))
        return;
    ckptfs_plan_prefetch(plan, files, out, len);
    unsigned pages = (unsigned)((hi - lo) / (uint64_t)sysconf(_SC_PAGESIZE)), wanted = 0;
    for (int i = 0; i < 200 && wanted < pages; i++) {
        g_usleep(5000);
        wanted = resident_pages(path, lo, hi);
    }
    unsigned others = resident_pages(path, 0, lo) + resident_pages(path, hi + (256u << 10), size);
    tap_ok(nearly_all(wanted, pages), "prefetch of %s brings the %u pages of its source bytes (%u, 95%% needed)", what,
           pages, wanted);
    tap_ok(others < 64, "and not the rest of the file (%u pages of it)", others);
}

/* Prefetch asks the kernel for the source ranges of a window of the synthesized file: a file
 * dropped from the page cache has those pages back, and not the rows after the window (the
 * gaps between its rows, 64 KiB here, may come in: one advice spans them). (Not on file systems
 * whose pages cannot be dropped, such as tmpfs.) */
static void test_prefetch(void)
{
    g_autofree char *dir = g_dir_make_tmp("ckptfs-prefetch-XXXXXX", NULL);
    g_autofree char *path = g_build_filename(dir, "src", NULL);
    size_t size = 8u << 20;
    g_autofree uint8_t *data = g_malloc(size);
    memset(data, 7, size);
    g_file_set_contents(path, (const char *)data, (gssize)size, NULL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    int src = ckptfs_srcfiles_add(files, path, NULL);
    /* Rows of 64 KiB from every other 128 KiB of the file: bytes [0, 64K), [128K, 192K), ... */
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, "header", 6);
    CkptfsGatherItem item = {(uint32_t)src, 0, 128u << 10, 64u << 10};
    ckptfs_plan_add_gather(b, 64, &item, 1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    if (evicted(path, size, 2)) {
        /* The window [6 + 1 MiB, 6 + 2 MiB) of the synthesized file: rows 16..31. */
        ckptfs_plan_prefetch(plan, files, 6 + (1u << 20), 1u << 20);
        unsigned wanted = 0, others = 0;
        for (int i = 0; i < 200 && wanted < 256; i++) {
            g_usleep(5000);
            wanted = 0;
            for (uint64_t row = 16; row < 32; row++)
                wanted += resident_pages(path, row * (128u << 10), row * (128u << 10) + (64u << 10));
        }
        for (uint64_t row = 33; row < 64; row++)
            others += resident_pages(path, row * (128u << 10), row * (128u << 10) + (64u << 10));
        tap_ok(wanted == 256, "prefetch brings the 16 rows the window gathers into the page cache (%u of 256 pages)", wanted);
        tap_ok(others < 64, "and not the rows after it (%u pages of them)", others);
    }
    ckptfs_plan_free(plan);
    /* A run (one repetition of the whole file): only the window's part of it. */
    b = ckptfs_plan_builder_new();
    ckptfs_plan_add_run(b, (uint32_t)src, 0, size);
    plan = ckptfs_plan_builder_finish(b);
    check_window(plan, files, path, size, 2u << 20, 1u << 20, 2u << 20, 3u << 20, "a window of a run");
    ckptfs_plan_free(plan);
    /* fp32 -> bf16 of the whole file: output window [1M, 2M) is source bytes [2M, 4M). */
    b = ckptfs_plan_builder_new();
    CkptfsGatherItem whole = {(uint32_t)src, 0, 0, size};
    ckptfs_plan_add_convert(b, CKPTFS_CONVERT_F32_TO_BF16, 1, &whole, 1);
    plan = ckptfs_plan_builder_finish(b);
    check_window(plan, files, path, size, 1u << 20, 1u << 20, 2u << 20, 4u << 20, "a converted window");
    ckptfs_plan_free(plan);
    ckptfs_srcfiles_free(files);
    g_unlink(path);
    g_rmdir(dir);
}

/* A window over ROWS short rows (a row-parallel share: 1 KiB of every 4 KiB) from each of NFILES
 * files in turn (a tensor stored split across files) is advised over their spans, not row by
 * row: every row comes in. Row by row, the advice stopped at the cap of calls per prefetch. With
 * WARM_LAST, the last row's page is cached beforehand (a zip entry's header read at mount sits
 * there): the rest still comes in. */
static void check_rows(const char *dir, unsigned nfiles, size_t rows, bool warm_last, const char *what)
{
    size_t stride = 4096, size = rows * stride + (1u << 20);
    g_autofree uint8_t *data = g_malloc0(size);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    char *paths[2];
    CkptfsGatherItem items[2];
    g_assert(nfiles <= G_N_ELEMENTS(paths));
    for (unsigned k = 0; k < nfiles; k++) {
        paths[k] = g_strdup_printf("%s/rows%u", dir, k);
        g_file_set_contents(paths[k], (const char *)data, (gssize)size, NULL);
        items[k] = (CkptfsGatherItem){(uint32_t)ckptfs_srcfiles_add(files, paths[k], NULL), 0, stride, 1024};
    }
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_gather(b, rows, items, nfiles);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    bool gone = true;
    for (unsigned k = 0; k < nfiles; k++)
        gone = evicted(paths[k], size, 0) && gone;
    if (!gone)
        tap_skip(2, "the page cache keeps %s", dir);
    else {
        if (warm_last)
            for (unsigned k = 0; k < nfiles; k++) {
                int fd = open(paths[k], O_RDONLY);
                char byte;
                g_assert(pread(fd, &byte, 1, (off_t)((rows - 1) * stride)) == 1);
                close(fd);
            }
        ckptfs_plan_prefetch(plan, files, 0, rows * 1024 * nfiles);
        /* A row starts each page of [0, rows * stride). */
        unsigned wanted = 0, others = 0;
        for (int i = 0; i < 400 && wanted < rows * nfiles; i++) {
            g_usleep(5000);
            wanted = 0;
            for (unsigned k = 0; k < nfiles; k++)
                wanted += resident_pages(paths[k], 0, rows * stride);
        }
        for (unsigned k = 0; k < nfiles; k++)
            others += resident_pages(paths[k], rows * stride + (256u << 10), size);
        tap_ok(nearly_all(wanted, rows * nfiles), "prefetch of %s brings every row in (%u of %zu pages, 95%% needed)",
               what, wanted, rows * nfiles);
        tap_ok(others < 64 * nfiles, "and not the bytes after them (%u pages of them)", others);
    }
    ckptfs_plan_free(plan);
    ckptfs_srcfiles_free(files);
    for (unsigned k = 0; k < nfiles; k++) {
        g_unlink(paths[k]);
        g_free(paths[k]);
    }
}

static void test_prefetch_rows(void)
{
    g_autofree char *dir = g_dir_make_tmp("ckptfs-prefetch-XXXXXX", NULL);
    check_rows(dir, 1, 8192, false, "8192 short rows of one file");
    check_rows(dir, 2, 4096, false, "4096 short rows of two files in turn");
    check_rows(dir, 1, 4096, true, "4096 short rows whose last page is cached");
    g_rmdir(dir);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(20261123);
    RandomSources s;
    random_sources_init(&s, NSRC, SRC_SIZE, rng, "plan");
    test_random_plans(&s, rng);
    test_conversions(rng);
    test_fp8();
    test_run_merging();
    test_identical_file(&s);
    test_read_errors(&s);
    test_catalog_rects(&s, rng);
    test_prefetch();
    test_prefetch_rows();
    random_sources_clear(&s);
    g_rand_free(rng);
    return tap_done();
}
