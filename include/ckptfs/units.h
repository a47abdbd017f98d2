/* Parsing of user-facing quantities (sizes such as "256M", "5GB", "2GiB"; counts such as "8"). */
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

/* Counts, steps, iterations: decimal digits only (no sign, space or unit: strtoul would take
 * "-1" as 2^64 - 1) from MIN to MAX. Otherwise false + error "'TEXT' is not a whole number from
 * MIN to MAX". Every number an option or a small source file gives is read with it. */
bool ckptfs_parse_uint(const char *text, uint64_t min, uint64_t max, uint64_t *out, GError **error);

#endif
