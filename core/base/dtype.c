#include "ckptfs/dtype.h"

#include <string.h>

#include <glib.h>

static const struct {
    const char *name;  /* safetensors */
    const char *torch; /* torch.<name> */
    size_t size;
} dtype_table[CKPTFS_DTYPE_COUNT] = {
    [CKPTFS_DTYPE_BOOL] = {"BOOL", "bool", 1},
    [CKPTFS_DTYPE_U8] = {"U8", "uint8", 1},
    [CKPTFS_DTYPE_I8] = {"I8", "int8", 1},
    [CKPTFS_DTYPE_F8_E5M2] = {"F8_E5M2", "float8_e5m2", 1},
    [CKPTFS_DTYPE_F8_E4M3] = {"F8_E4M3", "float8_e4m3fn", 1},
    [CKPTFS_DTYPE_F8_E8M0] = {"F8_E8M0", "float8_e8m0fnu", 1},
    [CKPTFS_DTYPE_I16] = {"I16", "int16", 2},
    [CKPTFS_DTYPE_U16] = {"U16", "uint16", 2},
    [CKPTFS_DTYPE_F16] = {"F16", "float16", 2},
    [CKPTFS_DTYPE_BF16] = {"BF16", "bfloat16", 2},
    [CKPTFS_DTYPE_I32] = {"I32", "int32", 4},
    [CKPTFS_DTYPE_U32] = {"U32", "uint32", 4},
    [CKPTFS_DTYPE_F32] = {"F32", "float32", 4},
    [CKPTFS_DTYPE_F64] = {"F64", "float64", 8},
    [CKPTFS_DTYPE_I64] = {"I64", "int64", 8},
    [CKPTFS_DTYPE_U64] = {"U64", "uint64", 8},
    [CKPTFS_DTYPE_C64] = {"C64", "complex64", 8},
};

const char *ckptfs_dtype_torch_name(CkptfsDtype dtype)
{
    if (dtype <= CKPTFS_DTYPE_INVALID || dtype >= CKPTFS_DTYPE_COUNT)
        return NULL;
    return dtype_table[dtype].torch;
}

CkptfsDtype ckptfs_dtype_from_torch_name(const char *name)
{
    /* torch also exports the C-style aliases. */
    static const struct {
        const char *alias, *name;
    } aliases[] = {{"half", "float16"}, {"float", "float32"}, {"double", "float64"},
                   {"long", "int64"}, {"int", "int32"}, {"short", "int16"}};
    for (size_t i = 0; i < G_N_ELEMENTS(aliases); i++)
        if (strcmp(name, aliases[i].alias) == 0)
            name = aliases[i].name;
    for (int d = 1; d < CKPTFS_DTYPE_COUNT; d++)
        if (strcmp(dtype_table[d].torch, name) == 0)
            return (CkptfsDtype)d;
    return CKPTFS_DTYPE_INVALID;
}

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

bool ckptfs_dtype_is_float(CkptfsDtype dtype)
{
    return dtype == CKPTFS_DTYPE_F32 || dtype == CKPTFS_DTYPE_BF16 || dtype == CKPTFS_DTYPE_F16;
}

size_t ckptfs_dtype_size(CkptfsDtype dtype)
{
    if (dtype <= CKPTFS_DTYPE_INVALID || dtype >= CKPTFS_DTYPE_COUNT)
        return 0;
    return dtype_table[dtype].size;
}

char *ckptfs_dims_text(const uint64_t *dims, unsigned n)
{
    GString *s = g_string_new("[");
    for (unsigned i = 0; i < n; i++)
        g_string_append_printf(s, "%s%" G_GUINT64_FORMAT, i ? ", " : "", dims[i]);
    g_string_append_c(s, ']');
    return g_string_free(s, FALSE);
}
