/* File plans: a synthesized file is an ordered list of extents covering [0, size).
 *
 * Extent kinds:
 *   LITERAL  bytes owned by the plan (headers, pickle bytes, zip records, padding)
 *   ZERO     zero fill
 *   GATHER   repeat NREP times; in repetition j emit, for each item k in order, items[k].len
 *            bytes of source file items[k].src starting at items[k].base + j * items[k].stride.
 *            One item with nrep 1 is a plain contiguous run of a source file.
 *   CONVERT  a gather whose bytes are elements of one type, emitted as another (fp32 shards
 *            served as bf16): N source bytes become M output bytes; reads at any offset and
 *            length convert only the elements they touch.
 *   TRANSPOSE NREP rows, each the items' columns side by side or interleaved, whose elements
 *            are not adjacent in the source (a matrix stored transposed: an expert's slice of a
 *            fused 3-D tensor; GPT-OSS's gate and up rows alternating in its fused gate_up_proj);
 *            a read fetches each source run it needs once, transposes in a buffer, converts
 *            when the catalog does and puts each item's runs in their places.
 *   MXFP4    NREP rows of bf16 dequantised from MXFP4 blocks and scales (CkptfsMxfp4), stored
 *            rows or, transposed, stored columns (transformers' [E, H, 2F] of [E, 2F, H/32, 16]).
 * The read engine binary-searches the extent containing an offset and copies from the sources;
 * a plan never holds tensor data. Plans are immutable once built and safe to read from any
 * number of threads (what they cache as they are read, CRCs and a band of decoded MXFP4 where
 * the source is copied, is behind their own synchronisation). */
#ifndef CKPTFS_PLAN_H
#define CKPTFS_PLAN_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptfs/convert.h"
#include "ckptfs/srcfiles.h"

typedef enum {
    CKPTFS_EXTENT_LITERAL,
    CKPTFS_EXTENT_ZERO,
    CKPTFS_EXTENT_GATHER,
    CKPTFS_EXTENT_CRC32, /* 4 bytes: CRC-32 (little-endian) of an earlier range of the same
                            file, computed on first read and cached */
    CKPTFS_EXTENT_CONVERT,
    CKPTFS_EXTENT_TRANSPOSE,
    CKPTFS_EXTENT_MXFP4,
} CkptfsExtentKind;

typedef struct {
    uint32_t src;    /* index in the CkptfsSrcFiles set */
    uint64_t base;   /* byte offset in the source file of repetition 0 */
    uint64_t stride; /* bytes between repetitions in the source file */
    uint64_t len;    /* bytes emitted per repetition */
} CkptfsGatherItem;

/* Block-scaled FP8 (DeepSeek-V3's weight_scale_inv): element (row, col) of a tensor is
 * bf16(float(code) * scale[row / block_rows][col / block_cols]), the scales an fp32 matrix stored
 * row-major in a source file. A CONVERT extent with one knows where its elements are in the
 * tensor: repetition j is row ROW0 + j, item k starts at column COL0[k]. */
typedef struct {
    uint32_t src;        /* the scale matrix's file */
    uint64_t base;       /* offset of scale[0][0] */
    uint64_t row_stride; /* bytes between scale rows */
    uint64_t rows, cols; /* of the scale matrix */
    uint32_t block_rows, block_cols;
    uint64_t row0;
    const uint64_t *col0; /* per item; owned by the plan */
} CkptfsBlockScale;

/* A TRANSPOSE extent's item: COLS columns whose element (j, k) (row j of the extent, column k
 * of the item) is at BASE + j * ROW_STRIDE + k * COL_STRIDE of source file SRC. Items lie side
 * by side in a row, or WAYS of them interleave: their columns alternate in runs of RUN elements
 * (GPT-OSS's gate and up: 2 ways, runs of 1). */
typedef struct {
    uint32_t src;
    /* in the first of a set of WAYS items of equal COLS (a multiple of RUN, at least 1) that
     * interleave; 0 or 1: the item lies alone */
    uint32_t ways;
    uint64_t base;
    uint64_t row_stride; /* an element size for a matrix stored transposed */
    uint64_t col_stride; /* its stored rows' length (0: the element size) */
    uint64_t cols;
    uint64_t run;
    /* set by the plan: where its column k is in the row, AT + k / RUN * RUN_STEP + k % RUN */
    uint64_t at, run_step;
} CkptfsStridedItem;

/* MXFP4 data: stored rows of COLS elements (COLS a multiple of 32), each COLS / 32 groups of 16
 * bytes of codes in the blocks file and one scale byte in the scales file, rows back to back in
 * both (ckptfs_convert_mxfp4 says what an element is). An MXFP4 extent's element (j, k) is the
 * stored one at row ROW0 + k * ROW_STEP, column COL0 + j when TRANSPOSED, else at row
 * ROW0 + j * ROW_STEP, column COL0 + k. */
typedef struct {
    uint32_t blocks_src, scales_src;
    uint64_t blocks_base, scales_base; /* of stored row 0 */
    uint64_t cols;
    uint64_t row0, row_step, col0;
    bool transposed;
} CkptfsMxfp4;

typedef struct {
    uint64_t offset; /* where the extent starts in the synthesized file */
    uint64_t size;   /* bytes it covers */
    CkptfsExtentKind kind;
    union {
        const uint8_t *literal; /* LITERAL: SIZE bytes owned by the plan */
        struct {
            uint64_t nrep;
            uint64_t rep_size; /* sum of items[k].len */
            uint32_t nitems;
            const CkptfsGatherItem *items; /* owned by the plan */
            CkptfsConvert convert;         /* CONVERT: rep_size etc. count source bytes */
            const CkptfsBlockScale *scale; /* CONVERT of block-scaled FP8, else NULL */
        } gather;
        struct {
            uint64_t offset, len; /* the range of this file it covers */
            uint32_t slot;        /* index of its cache slot in the plan */
        } crc;
        struct {
            uint64_t nrep;      /* rows */
            uint64_t row_elems; /* elements per row: the items' columns */
            uint32_t nitems;
            const CkptfsStridedItem *items; /* owned by the plan */
            CkptfsConvert convert;          /* NONE: served as stored */
            uint32_t elsize;                /* of the stored elements */
        } strided;
        struct {
            uint64_t nrep, width; /* rows, elements per row */
            const CkptfsMxfp4 *where; /* owned by the plan */
        } mxfp4;
    } u;
} CkptfsExtent;

typedef struct CkptfsPlan CkptfsPlan;
typedef struct CkptfsPlanBuilder CkptfsPlanBuilder;

CkptfsPlanBuilder *ckptfs_plan_builder_new(void);
/* Appends LEN bytes copied from DATA. */
void ckptfs_plan_add_literal(CkptfsPlanBuilder *b, const void *data, size_t len);
/* Appends LEN zero bytes. */
void ckptfs_plan_add_zero(CkptfsPlanBuilder *b, uint64_t len);
/* Appends a contiguous run of source file SRC; merged with the previous extent when it
 * continues the same run. */
void ckptfs_plan_add_run(CkptfsPlanBuilder *b, uint32_t src, uint64_t offset, uint64_t len);
/* Appends a gather extent (items copied). Degenerate gathers (nrep 0, zero length) add
 * nothing; a gather that is really one contiguous run is stored as a run. */
void ckptfs_plan_add_gather(CkptfsPlanBuilder *b, uint64_t nrep, const CkptfsGatherItem *items,
                            uint32_t nitems);
/* Appends the elements of a gather (as ckptfs_plan_add_gather; item lengths whole source
 * elements) converted by CONV. */
void ckptfs_plan_add_convert(CkptfsPlanBuilder *b, CkptfsConvert conv, uint64_t nrep,
                             const CkptfsGatherItem *items, uint32_t nitems);
/* Appends block-scaled FP8 elements of a gather (one byte each) as bf16: SCALE (copied, COL0
 * with NITEMS entries) places them in their tensor. */
void ckptfs_plan_add_scaled(CkptfsPlanBuilder *b, CkptfsConvert conv, const CkptfsBlockScale *scale,
                            uint64_t nrep, const CkptfsGatherItem *items, uint32_t nitems);
/* Appends NREP rows of elements of STORED type (converted by CONV unless NONE), each row the
 * ITEMS' columns (copied) side by side, or interleaved where an item says so (its WAYS):
 * TRANSPOSE, or a gather when every item's elements are adjacent and none interleave. */
void ckptfs_plan_add_strided(CkptfsPlanBuilder *b, CkptfsDtype stored, CkptfsConvert conv, uint64_t nrep,
                             const CkptfsStridedItem *items, uint32_t nitems);
/* Appends NREP rows of WIDTH bf16 elements dequantised from the MXFP4 data WHERE (copied) says. */
void ckptfs_plan_add_mxfp4(CkptfsPlanBuilder *b, const CkptfsMxfp4 *where, uint64_t nrep, uint64_t width);
/* Appends the 4-byte CRC-32 of bytes [OFFSET, OFFSET + LEN) of this file, which must come
 * before it and hold no CRC extent. Computed lazily: the first read of it reads the range. */
void ckptfs_plan_add_crc32(CkptfsPlanBuilder *b, uint64_t offset, uint64_t len);
/* Current size of the file being built (where the next extent will start). */
uint64_t ckptfs_plan_builder_size(const CkptfsPlanBuilder *b);
/* Finishes the plan; the builder is consumed. */
CkptfsPlan *ckptfs_plan_builder_finish(CkptfsPlanBuilder *b);
void ckptfs_plan_builder_free(CkptfsPlanBuilder *b);

void ckptfs_plan_free(CkptfsPlan *plan);
uint64_t ckptfs_plan_size(const CkptfsPlan *plan);
size_t ckptfs_plan_extent_count(const CkptfsPlan *plan);


/* A read's bytes that stay in mapped source files (ckptfs_srcfiles_map_pin) rather than being
 * copied into its buffer: REF[i] is LEN bytes at PTR that belong at AT in the buffer. At most
 * CKPTFS_REPLY_REFS_MAX pieces, so that they fit a writev with the buffer's pieces between them;
 * at most CKPTFS_REPLY_PINS_MAX files pinned per read. */
#define CKPTFS_REPLY_REFS_MAX 480
#define CKPTFS_REPLY_PINS_MAX 8
/* iovecs a reply needs at most: a ref and the buffer's bytes before it, for each ref, and the
 * buffer's bytes after the last (with libfuse's header: 962, within IOV_MAX). */
#define CKPTFS_REPLY_IOV_MAX (2 * CKPTFS_REPLY_REFS_MAX + 1)
typedef struct {
    size_t at;
    const uint8_t *ptr;
    size_t len;
} CkptfsReplyRef;
typedef struct {
    uint32_t src;
    const uint8_t *map; /* NULL: mapping refused, copy */
    bool used;          /* some ref points into it */
} CkptfsReplyPin;
struct CkptfsReplyRefs {
    CkptfsReplyRef ref[CKPTFS_REPLY_REFS_MAX];
    unsigned n;
    CkptfsReplyPin pin[CKPTFS_REPLY_PINS_MAX];
    unsigned npins;
    uint32_t resident_src; /* a range of a pinned file known to be in the page cache */
    uint64_t resident_lo, resident_hi;
};

/* The one read of a synthesized file: copies up to LEN bytes at OFFSET into BUF and returns how
 * many (fewer only at end of file; 0 at or past EOF), or -1 with an error naming the source
 * file. Source files are read as CTX says (srcfiles.h): through its reader's own descriptors
 * (NULL: the shared ones), and with its REFS, source pieces of at least CKPTFS_MAPPED_MIN bytes
 * that are cached and in a file with a lease are left in REFS instead of BUF (their place in BUF
 * is left unwritten): the reply is then the pieces of ckptfs_reply_refs_iov, and REFS must be
 * released with ckptfs_reply_refs_release once it is written (also after an error). */
#define CKPTFS_MAPPED_MIN 4096u
int64_t ckptfs_plan_read(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, void *buf, size_t len, uint64_t offset,
                         GError **error);
/* The N bytes read into BUF and REFS as an iovec list in file order (at most MAX entries, MAX >=
 * CKPTFS_REPLY_IOV_MAX); returns how many entries. Sorts REFS. */
struct iovec;
int ckptfs_reply_refs_iov(CkptfsReplyRefs *refs, const void *buf, size_t n, struct iovec *iov, int max);
/* The N bytes read into BUF and REFS, whole in BUF: each ref copied into its place (a reply
 * written from one buffer of its own, such as FUSE over io_uring's). Returns N. */
size_t ckptfs_reply_refs_gather(const CkptfsReplyRefs *refs, void *buf, size_t n);
void ckptfs_reply_refs_release(const CkptfsSrcFiles *files, CkptfsReplyRefs *refs);

/* Asks the kernel to start reading the source bytes of [OFFSET, OFFSET + LEN) of the
 * synthesized file (posix_fadvise WILLNEED on each source range, stored frames for packed
 * files): a reader going through the file then finds them cached. Returns at once. */
void ckptfs_plan_prefetch(const CkptfsPlan *plan, const CkptfsSrcFiles *files, uint64_t offset, uint64_t len);

/* The distinct source files a plan reads from (for change detection at open). */
void ckptfs_plan_sources(const CkptfsPlan *plan, GArray *out_indexes /* of guint32 */);

/* The index of the source file whose bytes the plan is, all of them and nothing else, when that
 * file is plain (not packed): the kernel can then read it directly (FUSE passthrough). -1 for
 * every other plan. */
int64_t ckptfs_plan_identical_file(const CkptfsPlan *plan, const CkptfsSrcFiles *files);

#endif
