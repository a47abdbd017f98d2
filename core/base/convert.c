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
        if (!scaled((CkptfsConvert)c) && conversions[c].from == from && conversions[c].to == to)
            return (CkptfsConvert)c;
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
 * at load time where the CPU has it (twice the elements per instruction of the baseline). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
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

void ckptfs_convert_mxfp4(const uint8_t *blocks, const uint8_t *scales, size_t groups, uint16_t *out)
{
    /* E2M1: sign, two exponent bits (bias 1), one mantissa bit; exponent 0 is subnormal */
    static const float e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    uint16_t values[16];
    int cached = -1; /* neighbouring groups mostly share a scale: its 16 values are made once */
    for (size_t g = 0; g < groups; g++) {
        if (scales[g] != cached) {
            cached = scales[g];
            /* 2^(s - 127) as a double (exact, 2^128 included): the products are exact, and
             * their cast to fp32 too but for those of 2^128 or more, infinity */
            uint64_t scale_bits = (uint64_t)(cached - 127 + 1023) << 52;
            double scale;
            memcpy(&scale, &scale_bits, 8);
            for (unsigned c = 0; c < 16; c++) {
                float p = (float)(e2m1[c] * scale);
                uint32_t u;
                memcpy(&u, &p, 4);
                values[c] = bf16_from_f32_bits(u, 0xFFFFu);
            }
        }
        const uint8_t *in = blocks + g * 16;
        uint16_t *o = out + g * CKPTFS_MXFP4_GROUP;
        for (unsigned i = 0; i < 16; i++) {
            o[2 * i] = values[in[i] & 0xFu];
            o[2 * i + 1] = values[in[i] >> 4];
        }
    }
}
