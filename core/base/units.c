#include "ckptfs/units.h"

#include <string.h>

#include "ckptfs/error.h"

static const struct {
    const char *suffix;
    uint64_t factor;
} size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"m", 1ull << 20},
    {"g", 1ull << 30},
    {"t", 1ull << 40},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
    {"kb", 1000ull},
    {"mb", 1000ull * 1000},
    {"gb", 1000ull * 1000 * 1000},
    {"tb", 1000ull * 1000 * 1000 * 1000},
};

bool ckptfs_parse_size(const char *text, uint64_t *out, GError **error)
{
    const char *p = text;
    uint64_t value = 0;
    if (text == NULL || *text < '0' || *text > '9')
        goto bad;
    while (*p >= '0' && *p <= '9') {
        if (!ckptfs_mul_u64(value, 10, &value) || !ckptfs_add_u64(value, (uint64_t)(*p - '0'), &value))
            goto too_big;
        p++;
    }
    for (size_t i = 0; i < G_N_ELEMENTS(size_units); i++) {
        if (g_ascii_strcasecmp(p, size_units[i].suffix) == 0) {
            if (!ckptfs_mul_u64(value, size_units[i].factor, &value))
                goto too_big;
            if (value == 0) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                            "size '%s' must be greater than zero", text);
                return false;
            }
            *out = value;
            return true;
        }
    }
bad:
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                "'%s' is not a size (examples: 4096, 256M, 5G, 5GB, 2GiB)", text ? text : "");
    return false;
too_big:
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "size '%s' is too large", text);
    return false;
}

bool ckptfs_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out, GError **error)
{
    guint64 v;
    if (text == NULL || !g_ascii_string_to_unsigned(text, 10, min, max, &v, NULL)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                    "'%s' is not a whole number from %" G_GUINT64_FORMAT " to %" G_GUINT64_FORMAT, text ? text : "",
                    min, max);
        return false;
    }
    *out = v;
    return true;
}
