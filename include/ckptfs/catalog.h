/* The catalog: every tensor of a source under its Hugging Face name, in source order, with
 * where its bytes live. A tensor is seen as a row-major 2-D matrix (rows = shape[0], columns =
 * the product of the other dims; a scalar is 1x1), covered exactly by pieces; each piece is a
 * rectangle of that matrix stored in one source file, row-major or, with a column stride, in any
 * other order (an expert's slice of a fused 3-D tensor, stored transposed or with gate and up
 * interleaved), or every K-th column of one (per-expert gate and up joined interleaved). An HF
 * tensor is one piece; a tensor gathered from Megatron rank files is several.
 * Views only ask for rectangles. */
#ifndef CKPTFS_CATALOG_H
#define CKPTFS_CATALOG_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/dtype.h"
#include "ckptfs/plan.h"

typedef struct {
    uint64_t row0, row1; /* rows [row0, row1) of the 2-D view */
    uint64_t col0, col1; /* columns (elements) [col0, col1) */
    uint32_t src;        /* source file index */
    /* 0 or 1: its columns adjacent in the view; K: every K-th column from col0 to its last,
     * col1 - 1 (K pieces interleaved: GPT-OSS's gate and up alternating, 2), its column k the
     * view's col0 + k * K */
    uint32_t col_step;
    uint64_t offset;     /* where element (row0, col0) is in the source file */
    uint64_t row_stride; /* bytes between consecutive rows in the source file */
    /* bytes between consecutive columns: 0 for the element size (rows stored row-major); an
     * element (r, c) is at offset + (r - row0) * row_stride + (c - col0) / K * col_stride */
    uint64_t col_stride;
} CkptfsPiece;

/* How many columns PIECE holds (its col_step applied). */
uint64_t ckptfs_piece_cols(const CkptfsPiece *piece);

typedef struct {
    char *name;
    CkptfsDtype dtype;  /* what views serve (nbytes counts it) */
    CkptfsDtype stored; /* what the pieces' bytes are: another type is converted on read */
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS];
    uint64_t rows, cols; /* the 2-D view */
    uint64_t nbytes;
    unsigned npieces;
    CkptfsPiece *pieces;
    CkptfsBlockScale *scale; /* block-scaled FP8: where its scales are (row0, col0 unused); NULL */
    /* MXFP4 dequantised on read (no pieces; stored U8): where its blocks and scales are, ROW0 and
     * COL0 those of the view's element (0, 0); TRANSPOSED, its view's rows are E experts' stored
     * columns, shape [E, C, R] of stored [E, R, C]. NULL */
    CkptfsMxfp4 *mxfp4;
    /* added to every element on read (+1: a Megatron zero-centred norm served as the plain
     * weight Hugging Face stores), or 0 */
    int shift;
} CkptfsTensor;

typedef struct CkptfsCatalog CkptfsCatalog;

/* A GHashFunc for tensor names (and other NUL-terminated strings), faster than g_str_hash on
 * long ones; with g_str_equal. */
guint ckptfs_name_hash(gconstpointer name);

CkptfsCatalog *ckptfs_catalog_new(void);
void ckptfs_catalog_free(CkptfsCatalog *catalog);

/* Adds a tensor stored contiguously (row-major) at OFFSET of source file SRC. Returns NULL
 * (and adds nothing) when the name is already present or the shape overflows 64 bits. */
const CkptfsTensor *ckptfs_catalog_add_contiguous(CkptfsCatalog *catalog, const char *name,
                                                  CkptfsDtype dtype, unsigned ndim,
                                                  const uint64_t *shape, uint32_t src,
                                                  uint64_t offset);

/* Adds a tensor made of PIECES (copied), which must tile its 2-D view exactly: inside it, not
 * overlapping, covering every element, each piece's last byte within 64 bits. Returns NULL with
 * an error naming the tensor otherwise, or when the name is already present. */
const CkptfsTensor *ckptfs_catalog_add_pieces(CkptfsCatalog *catalog, const char *name,
                                              CkptfsDtype dtype, unsigned ndim,
                                              const uint64_t *shape, const CkptfsPiece *pieces,
                                              unsigned npieces, GError **error);

/* The same with pieces of STORED elements served as DTYPE (one of them converted on read, as
 * ckptfs_catalog_serve_as does), and the 2-D view VIEW_ROWS rows of numel / VIEW_ROWS columns (0:
 * shape[0] rows): a fused [E, 2F, H] expert tensor seen as [E * 2F, H], so that each expert's
 * pieces are rectangles of it. */
const CkptfsTensor *ckptfs_catalog_add_reshaped(CkptfsCatalog *catalog, const char *name, CkptfsDtype dtype,
                                                CkptfsDtype stored, unsigned ndim, const uint64_t *shape,
                                                uint64_t view_rows, const CkptfsPiece *pieces, unsigned npieces,
                                                GError **error);

/* Gives FP8 tensor NAME its block scales: tensor SCALE of the catalog, fp32 of shape
 * [ceil(rows / BLOCK_ROWS), ceil(cols / BLOCK_COLS)], stored in one piece. Errors name both. */
bool ckptfs_catalog_set_block_scale(CkptfsCatalog *catalog, const char *name, const char *scale,
                                    unsigned block_rows, unsigned block_cols, GError **error);
/* Adds tensor NAME, bf16 [E, C, R], dequantised on read from the MXFP4 tensors BLOCKS (uint8
 * [E, R, C / 32, 16]) and SCALES (uint8 [E, R, C / 32]) of the catalog, as transformers'
 * convert_moe_packed_tensors gives it (GPT-OSS's experts: gate_up_proj [E, H, 2F] of blocks
 * [E, 2F, H / 32, 16]). Errors name the tensors and the shapes they need. */
const CkptfsTensor *ckptfs_catalog_add_mxfp4(CkptfsCatalog *catalog, const char *name, const char *blocks,
                                             const char *scales, GError **error);
/* Adds tensor NAME, bf16 [ROWS, C], rows ROW0, ROW0 + ROW_STEP, ... of the stored rows of MXFP4
 * tensor FROM (ckptfs_catalog_add_mxfp4; its stored [E, R, C] seen as E * R rows): one expert's
 * projection of fused MXFP4 experts (GPT-OSS's gate rows, every other one). NULL with an error
 * naming both when the rows are outside FROM's. */
const CkptfsTensor *ckptfs_catalog_add_mxfp4_rows(CkptfsCatalog *catalog, const char *name, const CkptfsTensor *from,
                                                  uint64_t row0, uint64_t row_step, uint64_t rows, GError **error);
/* Removes the tensors named in NAMES (a set of strings), in one pass (before any view uses the
 * catalog). */
void ckptfs_catalog_remove(CkptfsCatalog *catalog, GHashTable *names);

/* Serves every floating-point tensor as TO, converted on read from what is stored (tensors
 * stored as TO are served as stored; integer tensors are never converted; nor those KEEP, when
 * given, says to keep). Returns how many tensors are served converted. */
unsigned ckptfs_catalog_serve_as(CkptfsCatalog *catalog, CkptfsDtype to, bool (*keep)(const char *name));
/* Serves the block-scaled FP8 tensors (ckptfs_catalog_set_block_scale) as bf16, the others as
 * they are. Returns how many tensors are served converted. */
unsigned ckptfs_catalog_dequantize(CkptfsCatalog *catalog);

/* A copy of CATALOG to serve differently (block-FP8 dequantised for the Megatron views while
 * hf/ passes the FP8 through). */
CkptfsCatalog *ckptfs_catalog_copy(const CkptfsCatalog *catalog);
/* A copy of CATALOG whose tensors named PREFIXES[2i] + rest are named PREFIXES[2i + 1] + rest
 * (PREFIXES NULL-terminated pairs, the first that matches applies); NULL when two tensors would
 * then have one name, *CLASH getting it. */
CkptfsCatalog *ckptfs_catalog_copy_renamed(const CkptfsCatalog *catalog, const char *const *prefixes, char **clash);
/* CATALOG itself renamed as ckptfs_catalog_copy_renamed renames a copy; false on a clash (*CLASH
 * getting the name), CATALOG then renamed in part, to be dropped. */
bool ckptfs_catalog_rename(CkptfsCatalog *catalog, const char *const *prefixes, char **clash);
/* NAME renamed by PREFIXES as ckptfs_catalog_copy_renamed renames (a copy; NAME's own when none
 * matches or PREFIXES is NULL). */
char *ckptfs_name_renamed(const char *name, const char *const *prefixes);

unsigned ckptfs_catalog_count(const CkptfsCatalog *catalog);
const CkptfsTensor *ckptfs_catalog_at(const CkptfsCatalog *catalog, unsigned index);
const CkptfsTensor *ckptfs_catalog_find(const CkptfsCatalog *catalog, const char *name);
uint64_t ckptfs_catalog_total_bytes(const CkptfsCatalog *catalog);

/* Appends to B the row-major bytes of rows [r0, r1) x columns [c0, c1) of TENSOR's 2-D view,
 * as gather extents over the pieces (never the data itself). */
void ckptfs_tensor_emit_rect(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                             uint64_t r1, uint64_t c0, uint64_t c1);
/* Serves tensor NAME with DELTA (-1 or +1) added to each element (its type bf16 or fp32, served as
 * stored). Errors name it. */
bool ckptfs_catalog_set_shift(CkptfsCatalog *catalog, const char *name, int delta, GError **error);
/* Whether TENSOR's elements can be served shifted by -1 (served as stored, bf16 or fp32; shifted
 * by +1 already, a Megatron source's zero-centred norm, they are then its stored bytes). */
bool ckptfs_tensor_can_shift(const CkptfsTensor *tensor);
/* The same rectangle with DELTA (-1 or +1) added to each element (ckptfs_convert_shift) after the
 * tensor's own shift (0 or -DELTA); TENSOR one that ckptfs_tensor_can_shift accepts. */
void ckptfs_tensor_emit_rect_shifted(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0, uint64_t r1,
                                     uint64_t c0, uint64_t c1, int delta);
/* The whole tensor. */
void ckptfs_tensor_emit(const CkptfsTensor *tensor, CkptfsPlanBuilder *b);

/* The same rectangle of TENSOR's 2-D view seen with each row's two column halves exchanged
 * ([b | a] for [a | b]; columns an even count): gather extents side by side, no data moved. */
void ckptfs_tensor_emit_rect_swapped(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                                     uint64_t r1, uint64_t c0, uint64_t c1);

/* Rows [r0, r1) x columns [c0, c1) of TENSOR's 2-D view transposed (its columns as rows): strided
 * extents over its pieces, each seen transposed, no data moved. TENSOR has no block scales or
 * MXFP4 codes (ckptfs_tensor_can_transpose). */
void ckptfs_tensor_emit_rect_transposed(const CkptfsTensor *tensor, CkptfsPlanBuilder *b, uint64_t r0,
                                        uint64_t r1, uint64_t c0, uint64_t c1);
/* Whether TENSOR can be served transposed: its elements stored one by one (not FP8 blocks with
 * scales, not MXFP4). */
bool ckptfs_tensor_can_transpose(const CkptfsTensor *tensor);

/* PIECE, a rectangle of a matrix of COLS columns (ISZ bytes an element), as the same bytes seen
 * with the column halves exchanged: one piece, or two where it crosses the middle, into OUT;
 * returns how many. Its own inverse. */
unsigned ckptfs_piece_swap_col_halves(const CkptfsPiece *piece, uint64_t cols, size_t isz, CkptfsPiece out[2]);
/* PIECE (columns adjacent or strided, not stepped; ISZ bytes an element) as the same bytes seen
 * transposed: its rows the columns, its strides exchanged. Its own inverse. */
CkptfsPiece ckptfs_piece_transposed(const CkptfsPiece *piece, size_t isz);

#endif
