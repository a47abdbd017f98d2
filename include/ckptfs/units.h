/* Parsing of user-facing quantities (sizes such as "256M", "5GB", "2GiB"). */
#ifndef CKPTFS_UNITS_H
#define CKPTFS_UNITS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

/* Sizes: a whole number of bytes, optionally followed by a unit, case-insensitive.
 * K M G T and KiB MiB GiB TiB are powers of 1024; KB MB GB TB powers of 1000 (as Hugging Face's
 * max_shard_size reads them); B is bytes. Overflow, garbage, empty or zero -> false + error. */
bool ckptfs_parse_size(const char *text, uint64_t *out, GError **error);

/* Overflow-checked arithmetic used by every parser of untrusted sizes. */
static inline bool ckptfs_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool ckptfs_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

#endif
