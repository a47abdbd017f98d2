/* Element types shared by every format: safetensors names, item sizes, torch storage classes. */
#ifndef CKPTFS_DTYPE_H
#define CKPTFS_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Dimensions of a tensor ckptfs reads or writes (safetensors, pickled tensors, views). */
#define CKPTFS_MAX_DIMS 8

/* A shape as Python prints it in messages: "[4096, 128]". */
char *ckptfs_dims_text(const uint64_t *dims, unsigned n);

typedef enum {
    CKPTFS_DTYPE_INVALID = 0,
    CKPTFS_DTYPE_BOOL,
    CKPTFS_DTYPE_U8,
    CKPTFS_DTYPE_I8,
    CKPTFS_DTYPE_F8_E5M2,
    CKPTFS_DTYPE_F8_E4M3,
    CKPTFS_DTYPE_F8_E8M0,
    CKPTFS_DTYPE_I16,
    CKPTFS_DTYPE_U16,
    CKPTFS_DTYPE_F16,
    CKPTFS_DTYPE_BF16,
    CKPTFS_DTYPE_I32,
    CKPTFS_DTYPE_U32,
    CKPTFS_DTYPE_F32,
    CKPTFS_DTYPE_F64,
    CKPTFS_DTYPE_I64,
    CKPTFS_DTYPE_U64,
    CKPTFS_DTYPE_C64,
    CKPTFS_DTYPE_COUNT
} CkptfsDtype;

/* torch's name ("bfloat16" for torch.bfloat16), NULL for INVALID. */
const char *ckptfs_dtype_torch_name(CkptfsDtype dtype);
/* "bfloat16" (or an alias such as "half") -> CKPTFS_DTYPE_BF16; INVALID when unknown. */
CkptfsDtype ckptfs_dtype_from_torch_name(const char *name);

/* "BF16" -> CKPTFS_DTYPE_BF16; CKPTFS_DTYPE_INVALID for a name we do not know. */
CkptfsDtype ckptfs_dtype_from_safetensors(const char *name);
const char *ckptfs_dtype_safetensors_name(CkptfsDtype dtype);
size_t ckptfs_dtype_size(CkptfsDtype dtype);
/* Whether DTYPE is F32, BF16 or F16: a type a tensor Megatron keeps in fp32 may be stored in. */
bool ckptfs_dtype_is_float(CkptfsDtype dtype);

#endif
