#include "ckptfs/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[CKPTFS_DTYPE_COUNT] = {
    [CKPTFS_DTYPE_BOOL] = {"BOOL", 1},       [CKPTFS_DTYPE_U8] = {"U8", 1},
    [CKPTFS_DTYPE_I8] = {"I8", 1},           [CKPTFS_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [CKPTFS_DTYPE_F8_E4M3] = {"F8_E4M3", 1}, [CKPTFS_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
    [CKPTFS_DTYPE_I16] = {"I16", 2},         [CKPTFS_DTYPE_U16] = {"U16", 2},
    [CKPTFS_DTYPE_F16] = {"F16", 2},         [CKPTFS_DTYPE_BF16] = {"BF16", 2},
    [CKPTFS_DTYPE_I32] = {"I32", 4},         [CKPTFS_DTYPE_U32] = {"U32", 4},
    [CKPTFS_DTYPE_F32] = {"F32", 4},         [CKPTFS_DTYPE_F64] = {"F64", 8},
    [CKPTFS_DTYPE_I64] = {"I64", 8},         [CKPTFS_DTYPE_U64] = {"U64", 8},
    [CKPTFS_DTYPE_C64] = {"C64", 8},
};

CkptfsDtype ckptfs_dtype_from_safetensors(const char *name)
{
    for (int d = 1; d < CKPTFS_DTYPE_COUNT; d++)
        if (strcmp(dtype_table[d].name, name) == 0)
            return (CkptfsDtype)d;
    return CKPTFS_DTYPE_INVALID;
}

const char *ckptfs_dtype_safetensors_name(CkptfsDtype dtype)
{
    if (dtype <= CKPTFS_DTYPE_INVALID || dtype >= CKPTFS_DTYPE_COUNT)
        return "INVALID";
    return dtype_table[dtype].name;
}

size_t ckptfs_dtype_size(CkptfsDtype dtype)
{
    if (dtype <= CKPTFS_DTYPE_INVALID || dtype >= CKPTFS_DTYPE_COUNT)
        return 0;
    return dtype_table[dtype].size;
}
