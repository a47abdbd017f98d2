#include "ckptfs/convert.h"

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

static const struct {
    CkptfsDtype from, to;
} conversions[CKPTFS_CONVERT_COUNT] = {
    [CKPTFS_CONVERT_F32_TO_BF16] = {CKPTFS_DTYPE_F32, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_F16_TO_BF16] = {CKPTFS_DTYPE_F16, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_BF16_TO_F32] = {CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_F32},
    [CKPTFS_CONVERT_F16_TO_F32] = {CKPTFS_DTYPE_F16, CKPTFS_DTYPE_F32},
    [CKPTFS_CONVERT_E4M3_SCALED_TO_BF16] = {CKPTFS_DTYPE_F8_E4M3, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_E5M2_SCALED_TO_BF16] = {CKPTFS_DTYPE_F8_E5M2, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_BF16_LESS_ONE] = {CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_BF16_PLUS_ONE] = {CKPTFS_DTYPE_BF16, CKPTFS_DTYPE_BF16},
    [CKPTFS_CONVERT_F32_LESS_ONE] = {CKPTFS_DTYPE_F32, CKPTFS_DTYPE_F32},
    [CKPTFS_CONVERT_F32_PLUS_ONE] = {CKPTFS_DTYPE_F32, CKPTFS_DTYPE_F32},
};

/* Whether CONV needs block scales (not found by ckptfs_convert_find: an FP8 tensor without its
 * scales has no value to convert to). */
static bool scaled(CkptfsConvert c)
{
    return c == CKPTFS_CONVERT_E4M3_SCALED_TO_BF16 || c == CKPTFS_CONVERT_E5M2_SCALED_TO_BF16;
}

CkptfsConvert ckptfs_convert_find(CkptfsDtype from, CkptfsDtype to)
{
    for (int c = 1; c < CKPTFS_CONVERT_COUNT; c++)
        if (!scaled((CkptfsConvert)c) && from != to && conversions[c].from == from && conversions[c].to == to)
            return (CkptfsConvert)c;
    return CKPTFS_CONVERT_NONE;
}

CkptfsConvert ckptfs_convert_shift(CkptfsDtype dtype, int delta)
{
    if (dtype == CKPTFS_DTYPE_BF16)
        return delta < 0 ? CKPTFS_CONVERT_BF16_LESS_ONE : CKPTFS_CONVERT_BF16_PLUS_ONE;
    if (dtype == CKPTFS_DTYPE_F32)
        return delta < 0 ? CKPTFS_CONVERT_F32_LESS_ONE : CKPTFS_CONVERT_F32_PLUS_ONE;
    return CKPTFS_CONVERT_NONE;
}

CkptfsDtype ckptfs_convert_from(CkptfsConvert conv)
{
    return conversions[conv].from;
}

CkptfsDtype ckptfs_convert_to(CkptfsConvert conv)
{
    return conversions[conv].to;
}

/* torch's rounding: add half an ulp of bf16 (ties to even) and truncate. A NaN becomes NAN_BITS:
 * 0xFFFF from a float tensor's .bfloat16() on CPU (ATen's vectorised cast, what verl's merger
 * runs), 0x7FC0 from c10::BFloat16 of one value (the path a half tensor takes). Branch-free so
 * the loop vectorizes. */
static inline uint16_t bf16_from_f32_bits(uint32_t u, uint16_t nan_bits)
{
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7FFFFFFFu) > 0x7F800000u ? nan_bits : (uint16_t)rounded;
}

/* IEEE half to single, exactly: subnormal halves become normal singles; infinities keep their
 * sign; a NaN keeps sign and payload and is made quiet, as torch's cast does. */
static uint32_t f32_bits_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (exp == 0x1F)
        return sign | 0x7F800000u | (mant << 13) | (mant ? 0x400000u : 0u);
    if (exp != 0)
        return sign | ((exp + 112u) << 23) | (mant << 13);
    if (mant == 0)
        return sign;
    uint32_t e = 113; /* 2^-14 = the smallest normal half's exponent, biased for single */
    while (!(mant & 0x400u)) {
        mant <<= 1;
        e--;
    }
    return sign | (e << 23) | ((mant & 0x3FFu) << 13);
}

/* The casts run on every byte a converted view serves: on x86-64, an AVX2 build of them is picked
 * at load time where the CPU has it (twice the elements per instruction of the baseline). Not
 * under ThreadSanitizer: the instrumented resolvers would run before its runtime is up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CONVERT_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CONVERT_CLONES
#endif

/* Inputs and outputs may be unaligned (reads land anywhere in a FUSE buffer): memcpy loads. */
CONVERT_CLONES
void ckptfs_convert_run(CkptfsConvert conv, const void *in, void *out, size_t n)
{
    const uint8_t *restrict src = in;
    uint8_t *restrict dst = out;
    switch (conv) {
    case CKPTFS_CONVERT_F32_TO_BF16:
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, src + 4 * i, 4);
            uint16_t b = bf16_from_f32_bits(u, 0xFFFFu);
            memcpy(dst + 2 * i, &b, 2);
        }
        break;
    case CKPTFS_CONVERT_F16_TO_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint16_t b = bf16_from_f32_bits(f32_bits_from_f16(h), 0x7FC0u);
            memcpy(dst + 2 * i, &b, 2);
        }
        break;
    case CKPTFS_CONVERT_BF16_TO_F32:
        for (size_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, src + 2 * i, 2);
            uint32_t u = (uint32_t)b << 16;
            memcpy(dst + 4 * i, &u, 4);
        }
        break;
    case CKPTFS_CONVERT_F16_TO_F32:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t u = f32_bits_from_f16(h);
            memcpy(dst + 4 * i, &u, 4);
        }
        break;
    case CKPTFS_CONVERT_BF16_LESS_ONE:
    case CKPTFS_CONVERT_BF16_PLUS_ONE: {
        float delta = conv == CKPTFS_CONVERT_BF16_LESS_ONE ? -1.0f : 1.0f;
        for (size_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, src + 2 * i, 2);
            uint32_t u = (uint32_t)b << 16;
            float f;
            memcpy(&f, &u, 4);
            f += delta;
            memcpy(&u, &f, 4);
            b = bf16_from_f32_bits(u, 0xFFFFu);
            memcpy(dst + 2 * i, &b, 2);
        }
        break;
    }
    case CKPTFS_CONVERT_F32_LESS_ONE:
    case CKPTFS_CONVERT_F32_PLUS_ONE: {
        float delta = conv == CKPTFS_CONVERT_F32_LESS_ONE ? -1.0f : 1.0f;
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            f += delta;
            memcpy(dst + 4 * i, &f, 4);
        }
        break;
    }
    case CKPTFS_CONVERT_E4M3_SCALED_TO_BF16: /* need their scales: ckptfs_convert_fp8_scaled */
    case CKPTFS_CONVERT_E5M2_SCALED_TO_BF16:
    case CKPTFS_CONVERT_NONE:
    case CKPTFS_CONVERT_COUNT:
        break;
    }
}

float ckptfs_fp8_value(CkptfsDtype fp8, uint8_t code)
{
    uint32_t sign = (uint32_t)(code & 0x80u) << 24, bits;
    if (fp8 == CKPTFS_DTYPE_F8_E5M2) {
        /* The top byte of an IEEE half. */
        bits = f32_bits_from_f16((uint16_t)(code << 8));
    } else {
        uint32_t exp = (code >> 3) & 0xFu, mant = code & 0x7u;
        if (exp == 0xF && mant == 0x7) {
            bits = sign | 0x7FF00000u; /* the only NaN of E4M3fn; torch keeps sign and mantissa */
        } else if (exp != 0) {
            bits = sign | ((exp + 120u) << 23) | (mant << 20); /* bias 7 -> 127 */
        } else if (mant == 0) {
            bits = sign;
        } else {
            /* Subnormal: mant x 2^-9, normal as a float. */
            uint32_t e = 121; /* 2^-6, the smallest normal E4M3 exponent, biased for single */
            while (!(mant & 0x8u)) {
                mant <<= 1;
                e--;
            }
            bits = sign | (e << 23) | ((mant & 0x7u) << 20);
        }
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* E4M3 code to float bits without branches (the loop below vectorizes): normal codes by moving
 * the fields, subnormals through an integer-to-float conversion, the NaN code kept as torch does. */
static inline uint32_t e4m3_bits(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xFu, m = c & 0x7u;
    uint32_t normal = sign | ((e + 120u) << 23) | (m << 20);
    float sub = (float)m * 0x1p-9f;
    uint32_t sub_bits;
    memcpy(&sub_bits, &sub, 4);
    uint32_t is_normal = 0u - (uint32_t)(e != 0), is_nan = 0u - (uint32_t)((c & 0x7Fu) == 0x7Fu);
    uint32_t v = (normal & is_normal) | ((sub_bits | sign) & ~is_normal);
    return (v & ~is_nan) | ((sign | 0x7FF00000u) & is_nan);
}

CONVERT_CLONES
void ckptfs_convert_fp8_scaled(CkptfsDtype fp8, const uint8_t *in, float scale, uint16_t *out, size_t n)
{
    if (fp8 == CKPTFS_DTYPE_F8_E4M3) {
        for (size_t i = 0; i < n; i++) {
            uint32_t bits = e4m3_bits(in[i]);
            float v;
            memcpy(&v, &bits, 4);
            float p = v * scale;
            uint32_t u;
            memcpy(&u, &p, 4);
            out[i] = bf16_from_f32_bits(u, 0xFFFFu);
        }
        return;
    }
    /* E5M2 (rare in checkpoints): the 256 products once, then a table walk. */
    float values[256];
    for (unsigned c = 0; c < 256; c++)
        values[c] = ckptfs_fp8_value(fp8, (uint8_t)c) * scale;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &values[in[i]], 4);
        out[i] = bf16_from_f32_bits(u, 0xFFFFu);
    }
}

/* The 16 bf16 values of E2M1 codes under E8M0 scale S into VALUES. */
static void mxfp4_values(unsigned s, uint16_t *values)
{
    /* E2M1 (sign, two exponent bits of bias 1, one mantissa bit; exponent 0 subnormal) as bf16
     * under scale 2^0: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives */
    static const uint16_t e2m1_bf16[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                           0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
    if (s >= 2 && s <= 252) {
        /* the non-zero values' exponents (126-129) stay normal: the scale adds to their field */
        uint16_t add = (uint16_t)(((int)s - 127) * 128);
        for (unsigned c = 0; c < 16; c++)
            values[c] = (uint16_t)(e2m1_bf16[c] + ((c & 7u) ? add : 0u));
        return;
    }
    /* subnormal or infinite ends: 2^(s - 127) as a double (exact, 2^128 included), the products
     * exact, their cast to fp32 too but from 2^128 up, infinity */
    uint64_t scale_bits = (uint64_t)((int)s - 127 + 1023) << 52;
    double scale;
    memcpy(&scale, &scale_bits, 8);
    for (unsigned c = 0; c < 16; c++) {
        uint32_t bf16_bits = (uint32_t)e2m1_bf16[c] << 16, u;
        float v, p;
        memcpy(&v, &bf16_bits, 4);
        p = (float)(v * scale);
        memcpy(&u, &p, 4);
        values[c] = bf16_from_f32_bits(u, 0xFFFFu);
    }
}

/* Groups [0, GROUPS) one byte at a time through their 16 values. */
static void mxfp4_scalar(const uint8_t *blocks, const uint8_t *scales, size_t groups, uint16_t *out)
{
    uint16_t values[16];
    int cached = -1; /* neighbouring groups often share a scale: its 16 values are made once */
    for (size_t g = 0; g < groups; g++) {
        if (scales[g] != cached) {
            cached = scales[g];
            mxfp4_values((unsigned)cached, values);
        }
        const uint8_t *in = blocks + g * 16;
        uint16_t *o = out + g * CKPTFS_MXFP4_GROUP;
        for (unsigned i = 0; i < 16; i++) {
            o[2 * i] = values[in[i] & 0xFu];
            o[2 * i + 1] = values[in[i] >> 4];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The byte-shuffle tables of the SSSE3 decoders: the low and high bytes of each E2M1 code's bf16
 * value under scale 2^0, and 0xFF for the non-zero codes (those the scale's exponent is added to). */
__attribute__((target("ssse3"))) static void mxfp4_tables(__m128i *table_lo, __m128i *table_hi, __m128i *table_nz)
{
    uint16_t base[16], nonzero[16];
    mxfp4_values(127, base);
    for (unsigned c = 0; c < 16; c++)
        nonzero[c] = (c & 7u) ? 0xFFFFu : 0;
    const __m128i b0 = _mm_loadu_si128((const __m128i *)(const void *)base);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(const void *)(base + 8));
    const __m128i n0 = _mm_loadu_si128((const __m128i *)(const void *)nonzero);
    const __m128i n1 = _mm_loadu_si128((const __m128i *)(const void *)(nonzero + 8));
    const __m128i low_byte = _mm_set1_epi16(0x00FF);
    *table_lo = _mm_packus_epi16(_mm_and_si128(b0, low_byte), _mm_and_si128(b1, low_byte));
    *table_hi = _mm_packus_epi16(_mm_srli_epi16(b0, 8), _mm_srli_epi16(b1, 8));
    *table_nz = _mm_packs_epi16(n0, n1);
}

/* The same with SSSE3's byte shuffle as the table: a group's 32 nibbles looked up at once in the
 * bytes of their values under scale 2^0, the scale then added to the exponents of the non-zero
 * ones (the ends of the scale's range one byte at a time). One table per group took as long as
 * the scalar loop: 1.3-1.6 GB/s of output for rows of GPT-OSS-120B's gate_up_proj. */
__attribute__((target("ssse3"))) static void mxfp4_ssse3(const uint8_t *blocks, const uint8_t *scales, size_t groups,
                                                         uint16_t *out)
{
    __m128i table_lo, table_hi, table_nz;
    mxfp4_tables(&table_lo, &table_hi, &table_nz);
    const __m128i nibble = _mm_set1_epi8(0x0F);
    for (size_t g = 0; g < groups; g++) {
        unsigned scale = scales[g];
        if (scale < 2 || scale > 252) {
            mxfp4_scalar(blocks + g * 16, scales + g, 1, out + g * CKPTFS_MXFP4_GROUP);
            continue;
        }
        __m128i add = _mm_set1_epi16((short)(((int)scale - 127) * 128));
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(blocks + g * 16));
        __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
        __m128i codes[2] = {_mm_unpacklo_epi8(lo, hi), _mm_unpackhi_epi8(lo, hi)}; /* element order */
        __m128i *o = (__m128i *)(void *)(out + g * CKPTFS_MXFP4_GROUP);
        for (int h = 0; h < 2; h++) {
            __m128i l = _mm_shuffle_epi8(table_lo, codes[h]), u = _mm_shuffle_epi8(table_hi, codes[h]);
            __m128i nz = _mm_shuffle_epi8(table_nz, codes[h]);
            __m128i v0 = _mm_add_epi16(_mm_unpacklo_epi8(l, u), _mm_and_si128(_mm_unpacklo_epi8(nz, nz), add));
            __m128i v1 = _mm_add_epi16(_mm_unpackhi_epi8(l, u), _mm_and_si128(_mm_unpackhi_epi8(nz, nz), add));
            _mm_storeu_si128(o + 2 * h, v0);
            _mm_storeu_si128(o + 2 * h + 1, v1);
        }
    }
}
#endif

/* Stored rows [R0, R1) of ckptfs_convert_mxfp4_columns, a group at a time through its 32 values. */
static void mxfp4_columns_scalar(const uint8_t *blocks, size_t block_step, const uint8_t *scales, size_t scale_step,
                                 size_t r0, size_t r1, unsigned c0, unsigned nc, uint8_t *out, size_t out_step)
{
    uint16_t group[CKPTFS_MXFP4_GROUP];
    for (size_t r = r0; r < r1; r++) {
        mxfp4_scalar(blocks + r * block_step, scales + r * scale_step, 1, group);
        for (unsigned i = 0; i < nc; i++)
            memcpy(out + i * out_step + r * 2, &group[c0 + i], 2);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* The same 8 stored rows by 8 columns at a time, transposed as they are decoded: the 4 bytes of
 * codes of each row's 8 columns gathered byte by byte across the rows, so each code vector holds
 * a column's 8 rows; then looked up as mxfp4_ssse3 does, each lane with its own row's scale.
 * Only the 8-column pieces asked for are decoded; 8 rows with a scale at an end of the range go
 * one group at a time. */
__attribute__((target("ssse3"))) static void mxfp4_columns_ssse3(const uint8_t *blocks, size_t block_step,
                                                                 const uint8_t *scales, size_t scale_step, size_t rows,
                                                                 unsigned c0, unsigned nc, uint8_t *out,
                                                                 size_t out_step)
{
    __m128i table_lo, table_hi, table_nz;
    mxfp4_tables(&table_lo, &table_hi, &table_nz);
    const __m128i nibble = _mm_set1_epi8(0x0F);
    /* bytes 0-3 of 4 rows' words -> byte b of each of the 4 rows together */
    const __m128i by_byte = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    size_t r = 0;
    for (; r + 8 <= rows; r += 8) {
        int16_t add[8];
        bool ends = false;
        for (unsigned i = 0; i < 8; i++) {
            unsigned scale = scales[(r + i) * scale_step];
            ends = ends || scale < 2 || scale > 252;
            add[i] = (int16_t)(((int)scale - 127) * 128);
        }
        if (ends) {
            mxfp4_columns_scalar(blocks, block_step, scales, scale_step, r, r + 8, c0, nc, out, out_step);
            continue;
        }
        const __m128i adds = _mm_loadu_si128((const __m128i *)(const void *)add); /* lane i: row r + i's */
        /* the rows four blocks on asked for now: each is a cache line of its own, which the loads
         * below waited for a block at a time (GPT-OSS-120B's gate_up_proj as [H, 2F]: 3.5 -> 5.6
         * GB/s for 1 MiB reads, 1.8 -> 2.1 for 128 KiB) */
        for (size_t i = r + 32; i < r + 40 && i < rows; i++)
            __builtin_prefetch(blocks + i * block_step + c0 / 2);
        for (unsigned q = c0 / 8; q * 8 < c0 + nc; q++) {
            uint32_t w[8];
            for (unsigned i = 0; i < 8; i++)
                memcpy(&w[i], blocks + (r + i) * block_step + q * 4, 4);
            __m128i x0 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)w), by_byte);
            __m128i x1 = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)(w + 4)), by_byte);
            /* byte b of rows 0-7: bytes 0 and 1 in B01, 2 and 3 in B23 */
            __m128i b01 = _mm_unpacklo_epi32(x0, x1), b23 = _mm_unpackhi_epi32(x0, x1);
            /* columns (of the 8) whose rows each code vector holds, in its low and high halves:
             * byte b's low nibble is column 2b, its high one 2b + 1 */
            __m128i codes[4] = {_mm_and_si128(b01, nibble), _mm_and_si128(_mm_srli_epi16(b01, 4), nibble),
                                _mm_and_si128(b23, nibble), _mm_and_si128(_mm_srli_epi16(b23, 4), nibble)};
            for (unsigned h = 0; h < 4; h++) {
                __m128i l = _mm_shuffle_epi8(table_lo, codes[h]), u = _mm_shuffle_epi8(table_hi, codes[h]);
                __m128i nz = _mm_shuffle_epi8(table_nz, codes[h]);
                __m128i v[2] = {_mm_add_epi16(_mm_unpacklo_epi8(l, u), _mm_and_si128(_mm_unpacklo_epi8(nz, nz), adds)),
                                _mm_add_epi16(_mm_unpackhi_epi8(l, u), _mm_and_si128(_mm_unpackhi_epi8(nz, nz), adds))};
                for (unsigned half = 0; half < 2; half++) {
                    unsigned c = q * 8 + (h & 1u) + (h >> 1) * 4 + half * 2;
                    if (c >= c0 && c < c0 + nc)
                        _mm_storeu_si128((__m128i *)(void *)(out + (c - c0) * out_step + r * 2), v[half]);
                }
            }
        }
    }
    mxfp4_columns_scalar(blocks, block_step, scales, scale_step, r, rows, c0, nc, out, out_step);
}
#endif

void ckptfs_convert_mxfp4_columns(const uint8_t *blocks, size_t block_step, const uint8_t *scales, size_t scale_step,
                                  size_t rows, unsigned c0, unsigned nc, uint8_t *out, size_t out_step)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("ssse3")) {
        mxfp4_columns_ssse3(blocks, block_step, scales, scale_step, rows, c0, nc, out, out_step);
        return;
    }
#endif
    mxfp4_columns_scalar(blocks, block_step, scales, scale_step, 0, rows, c0, nc, out, out_step);
}

void ckptfs_convert_mxfp4(const uint8_t *blocks, const uint8_t *scales, size_t groups, uint16_t *out)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("ssse3")) {
        mxfp4_ssse3(blocks, scales, groups, out);
        return;
    }
#endif
    mxfp4_scalar(blocks, scales, groups, out);
}
