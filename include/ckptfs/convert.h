/* Element conversions done on read (fp32 shards served as bf16, bf16 served as fp32), each
 * bit-for-bit what torch gives for x.to(dtype) on CPU. */
#ifndef CKPTFS_CONVERT_H
#define CKPTFS_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "ckptfs/dtype.h"

typedef enum {
    CKPTFS_CONVERT_NONE = 0,
    CKPTFS_CONVERT_F32_TO_BF16, /* round to nearest even; NaN -> 0xFFFF */
    CKPTFS_CONVERT_F16_TO_BF16, /* exactly to fp32, then as above; NaN -> 0x7FC0 */
    CKPTFS_CONVERT_BF16_TO_F32, /* exact */
    CKPTFS_CONVERT_F16_TO_F32,  /* exact; a NaN made quiet */
    CKPTFS_CONVERT_E4M3_SCALED_TO_BF16, /* block-scaled FP8 (needs its scales: plan.h) */
    CKPTFS_CONVERT_E5M2_SCALED_TO_BF16,
    /* the same type, each element less or plus one, in fp32 and rounded as torch's `w - 1` on
     * CPU: Megatron's zero-centred form of a norm stored plain, and back (never found by
     * ckptfs_convert_find: asked for by name) */
    CKPTFS_CONVERT_BF16_LESS_ONE,
    CKPTFS_CONVERT_BF16_PLUS_ONE,
    CKPTFS_CONVERT_F32_LESS_ONE,
    CKPTFS_CONVERT_F32_PLUS_ONE,
    CKPTFS_CONVERT_COUNT
} CkptfsConvert;

/* The conversion from FROM to TO, or NONE when there is none (or they are equal). */
CkptfsConvert ckptfs_convert_find(CkptfsDtype from, CkptfsDtype to);
CkptfsDtype ckptfs_convert_from(CkptfsConvert conv);
/* The conversion of DTYPE that adds DELTA (-1 or +1) to each element, or NONE for a type without
 * one (only bf16 and fp32 have one). */
CkptfsConvert ckptfs_convert_shift(CkptfsDtype dtype, int delta);
CkptfsDtype ckptfs_convert_to(CkptfsConvert conv);
/* Converts N elements of IN (the source type) into OUT (the target type). */
void ckptfs_convert_run(CkptfsConvert conv, const void *in, void *out, size_t n);

/* The value of an FP8 code as a float, exactly: E4M3 ("fn": no infinities, S.1111.111 is NaN,
 * largest 448) or E5M2 (IEEE-like: infinities and NaNs). */
float ckptfs_fp8_value(CkptfsDtype fp8, uint8_t code);
/* Block-scaled FP8 to bf16 (DeepSeek-V3's weight_scale_inv): each of N codes of IN becomes
 * bf16(float(code) * SCALE), the product in fp32 and rounded to nearest even, NaN -> 0xFFFF
 * (torch's `(x.float() * s).bfloat16()` on CPU). */
void ckptfs_convert_fp8_scaled(CkptfsDtype fp8, const uint8_t *in, float scale, uint16_t *out, size_t n);

/* MXFP4 (OCP microscaling FP4: GPT-OSS's experts): GROUPS groups of 32 elements, each 16 bytes of
 * BLOCKS (element 2i in the low nibble of byte i, 2i + 1 in the high one; E2M1 codes) and one
 * E8M0 byte of SCALES, into 32 * GROUPS bf16 of OUT: code * 2^(scale - 127) exactly (as ldexp),
 * infinity from 2^128 up, zeros keeping their sign; as transformers' convert_moe_packed_tensors
 * does on CPU (scale 255 is a number there, not E8M0's NaN). */
#define CKPTFS_MXFP4_GROUP 32u
void ckptfs_convert_mxfp4(const uint8_t *blocks, const uint8_t *scales, size_t groups, uint16_t *out);
/* Columns [C0, C0 + NC) of one group of ROWS stored rows (C0 + NC <= 32), transposed: row r's 16
 * bytes of codes at BLOCKS + r * BLOCK_STEP, its scale at SCALES + r * SCALE_STEP; element r of
 * column C0 + i, as ckptfs_convert_mxfp4 decodes it, becomes bf16 r of the row at
 * OUT + i * OUT_STEP (bytes). The rows are read where they lie (a mapped file): nothing copied. */
void ckptfs_convert_mxfp4_columns(const uint8_t *blocks, size_t block_step, const uint8_t *scales, size_t scale_step,
                                  size_t rows, unsigned c0, unsigned nc, uint8_t *out, size_t out_step);

#endif
