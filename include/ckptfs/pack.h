/* ckptfs pack (docs/compression.md): a copy of a checkpoint directory in which every file holding
 * tensor bytes is a compressed container (include/ckptfs/container.h), every other file copied
 * as it is. The container writer streams: memory is O(frame size x threads), never O(file);
 * frames are compressed by a pool of worker threads and written in order. */
#ifndef CKPTFS_PACK_H
#define CKPTFS_PACK_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/container.h"
#include "ckptfs/options.h"
#include "ckptfs/source.h"

#define CKPTFS_PACK_FRAME_DEFAULT (2u << 20)
#define CKPTFS_PACK_FRAME_MIN (64u << 10)
#define CKPTFS_PACK_FRAME_MAX CKPTFS_CONTAINER_MAX_FRAME
#define CKPTFS_PACK_THREADS_MAX 64u

typedef struct {
    CkptfsCodec codec;   /* CKPTFS_CODEC_ZSTD (default) or CKPTFS_CODEC_LZ4 */
    int level;           /* 0 until checked: the codec's default (zstd 1, lz4 1) */
    uint32_t frame_size; /* uncompressed bytes per frame */
    unsigned threads;    /* compressing workers; 0 until checked: online CPUs, at most 16 */
} CkptfsPackOptions;

void ckptfs_pack_options_init(CkptfsPackOptions *options);
/* KEY_VALUE is "codec=zstd|lz4", "level=N", "frame=SIZE" or "threads=N": TAKEN, BAD (error set)
 * or UNKNOWN (another key). */
CkptfsOptionResult ckptfs_pack_options_apply(CkptfsPackOptions *options, const char *key_value,
                                             GError **error);
/* Checks the combination (the level against the codec) and fills in the defaults. */
bool ckptfs_pack_options_check(CkptfsPackOptions *options, GError **error);

/* Byte classes of the statistics: bytes that are not tensor data, then tensor bytes by element
 * size (1, 2, 4, 8). */
enum { CKPTFS_PACK_RAW, CKPTFS_PACK_E1, CKPTFS_PACK_E2, CKPTFS_PACK_E4, CKPTFS_PACK_E8, CKPTFS_PACK_CLASSES };
/* "raw", "1-byte", ... */
const char *ckptfs_pack_class_name(unsigned cls);

typedef struct {
    uint64_t files_packed, files_copied, files_skipped, dirs;
    uint64_t bytes_in, bytes_out;  /* of the files done so far (a container: header, frames, index) */
    uint64_t total_in;             /* what the whole pack reads (known after the scan) */
    uint64_t class_in[CKPTFS_PACK_CLASSES], class_out[CKPTFS_PACK_CLASSES]; /* frames' bytes */
    uint64_t frames, frames_stored;
    uint64_t verified_files, verified_bytes;
} CkptfsPackStats;

/* A range of a file's bytes holding tensor elements of ESIZE bytes (1, 2, 4 or 8). */
typedef struct {
    uint64_t offset, length;
    uint32_t esize;
} CkptfsPackRange;

/* Sorts RANGES (a GArray of CkptfsPackRange) by offset, drops empty ones, merges overlapping
 * ones (the merged range keeps the element size of the first) and adjacent ones of the same
 * element size. */
void ckptfs_pack_ranges_normalize(GArray *ranges);

/* The tensor byte ranges of SOURCE (its catalogs and their block scales): a GPtrArray indexed by
 * source file index (ckptfs_srcfiles_count), each a normalized GArray of CkptfsPackRange (empty
 * for a file holding no tensor bytes). */
GPtrArray *ckptfs_pack_source_ranges(const CkptfsSource *source);

/* The container writer: a pool of compressing workers and a window of frame buffers, kept from
 * one file to the next. */
typedef struct CkptfsPacker CkptfsPacker;

/* OPTIONS must have been checked. PROGRESS (may be NULL) is called after every frame written. */
CkptfsPacker *ckptfs_packer_new(const CkptfsPackOptions *options,
                                void (*progress)(const CkptfsPackStats *stats, gpointer ctx),
                                gpointer ctx);
void ckptfs_packer_free(CkptfsPacker *packer);

/* Writes to OUT_FD (at its current position, which must be 0) the container of the SIZE bytes of
 * SRC_FD, whose tensor bytes are RANGES (normalized, within SIZE). Adds to STATS. Errors name
 * SRC_NAME for reads and DEST_NAME for writes. */
bool ckptfs_packer_write(CkptfsPacker *packer, int src_fd, uint64_t size, const CkptfsPackRange *ranges,
                         unsigned nranges, int out_fd, const char *src_name, const char *dest_name,
                         CkptfsPackStats *stats, GError **error);

typedef struct {
    /* Called after each frame or chunk written or verified, and at the end of each phase: the
     * caller rate-limits what it prints. */
    void (*progress)(const CkptfsPackStats *stats, bool verifying, gpointer ctx);
    /* Things skipped (special files, symlinks to directories). */
    void (*warning)(const char *message, gpointer ctx);
    gpointer ctx;
} CkptfsPackHooks;

/* ckptfs pack SRC DEST: opens SRC as a source with SOURCE_OPTIONS, then writes DEST (which must
 * not exist or be an empty directory, and not be inside SRC). With VERIFY, reads every file of
 * DEST back through a fresh source-file set (which decodes containers) and compares it with
 * SRC. Errors name the file. */
bool ckptfs_pack_dir(const char *src, const char *dest, const CkptfsOptions *source_options,
                     const CkptfsPackOptions *options, bool verify, const CkptfsPackHooks *hooks,
                     CkptfsPackStats *stats, GError **error);

/* Compares every regular file of SRC (the files pack writes) with the same path under DEST read
 * through ckptfs_srcfiles. The first difference is an error naming the file and the offset. */
bool ckptfs_pack_verify(const char *src, const char *dest, const CkptfsPackHooks *hooks,
                        CkptfsPackStats *stats, GError **error);

#endif
