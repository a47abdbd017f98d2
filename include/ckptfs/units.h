/* Parsing of user-facing quantities (sizes such as "256M", "5GB", "2GiB"). */
#ifndef CKPTFS_UNITS_H
#define CKPTFS_UNITS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/checked.h" /* ckptfs_mul_u64 and friends, which callers of this header use */

/* Sizes: a whole number of bytes, optionally followed by a unit, case-insensitive.
 * K M G T and KiB MiB GiB TiB are powers of 1024; KB MB GB TB powers of 1000 (as Hugging Face's
 * max_shard_size reads them); B is bytes. Overflow, garbage, empty or zero -> false + error. */
bool ckptfs_parse_size(const char *text, uint64_t *out, GError **error);

#endif
