/* safetensors: parsing a file's header (untrusted input) and writing one (for re-sharded views).
 * Layout: u64 little-endian N, N bytes of UTF-8 JSON, then the data area. */
#ifndef CKPTFS_SAFETENSORS_H
#define CKPTFS_SAFETENSORS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/dtype.h"
#include "ckptfs/limits.h" /* CKPTFS_SAFETENSORS_MAX_HEADER, CKPTFS_MAX_HEADER_TENSORS */

typedef struct {
    char *name;
    CkptfsDtype dtype;
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS];
    uint64_t begin; /* data_offsets, relative to the data area */
    uint64_t end;
} CkptfsStEntry;

typedef struct {
    uint64_t data_start; /* 8 + header length */
    GPtrArray *entries;  /* of CkptfsStEntry*, in data order (ascending begin) */
    GPtrArray *metadata; /* __metadata__: flat list key, value, key, value ... (char*) */
} CkptfsStHeader;

void ckptfs_st_header_free(CkptfsStHeader *header);

/* Reads the 8-byte length prefix. FILE_NAME is used in error messages only. */
bool ckptfs_st_header_length(const char *file_name, const uint8_t prefix[8], uint64_t file_size,
                             uint64_t *json_len, GError **error);

/* Parses and validates the JSON header (JSON_LEN bytes, not NUL-terminated) of a file of
 * FILE_SIZE bytes: offsets inside the data area, end - begin = numel * itemsize, no overlaps or
 * holes, known dtypes. Errors name FILE_NAME, the tensor and the problem. */
CkptfsStHeader *ckptfs_st_parse_header(const char *file_name, const char *json, size_t json_len,
                                       uint64_t file_size, GError **error);

/* numel of SHAPE; false on overflow. */
bool ckptfs_shape_numel(const uint64_t *shape, unsigned ndim, uint64_t *numel);

/* How many tensors the header JSON (JSON_LEN bytes, not yet validated) lists: the keys of its
 * top-level object other than "__metadata__". A cheap scan, so that a header of a million
 * tensors is refused before it is parsed into a tree. */
uint64_t ckptfs_st_count_tensors(const char *json, size_t json_len);

/* Builds a header as Hugging Face writes one: the 8-byte length, then compact JSON with
 * "__metadata__" first and tensors in the given order, padded with spaces so the data area
 * starts at a multiple of 8. ENTRIES' begin/end must already be set. */
GBytes *ckptfs_st_build_header(CkptfsStEntry *const *entries, unsigned n_entries,
                               const char *const *metadata_kv, unsigned n_metadata);

#endif
