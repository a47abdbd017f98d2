/* Megatron-core's sharded state dict of a dense GPT model, as torch_dist checkpoints store it:
 * one key per weight, the layers stacked in a leading dimension, Transformer Engine names for
 * both specs, the vocabulary padded. Each key's matrix (per layer for stacked keys) is a stack
 * of row segments of Hugging Face tensors, which is all a reader or a writer of that format
 * needs to know: the mcore/ view emits boxes of it, the torch_dist source maps chunks back. */
#ifndef CKPTFS_MCORE_H
#define CKPTFS_MCORE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/model.h"

/* How Megatron's tensor parallelism splits a key (what one TP rank loads). */
typedef enum {
    CKPTFS_TP_REPLICATED, /* norms: every rank loads the whole tensor */
    CKPTFS_TP_ROWS,       /* column-parallel: rows [r*R/T, (r+1)*R/T) (QKV, its bias) */
    CKPTFS_TP_ROW_HALVES, /* fc1: the same rows of each half ([gate; up]) */
    CKPTFS_TP_COLS,       /* row-parallel: columns [r*C/T, (r+1)*C/T) (linear_proj, fc2) */
    CKPTFS_TP_VOCAB,      /* vocab-parallel: rows of the vocabulary as padded for T */
} CkptfsTpSplit;

typedef struct {
    char *hf_name;        /* for stacked keys a layer suffix ("self_attn.q_proj.weight") */
    uint64_t hf_row0;     /* first row taken from the HF tensor */
    uint64_t row0, rows;  /* the rows of the key's matrix it fills */
} CkptfsMcoreSegment;

typedef struct {
    const char *key;      /* "decoder.layers.self_attention.linear_qkv.weight" */
    bool stacked;         /* leading layer dimension */
    unsigned ndim;        /* of one layer's tensor (or of the tensor): 1 or 2 */
    uint64_t rows, cols;  /* that tensor as a matrix (cols 1 for 1-D) */
    CkptfsTpSplit split;
    GArray *segments;     /* CkptfsMcoreSegment, by row; rows not covered are zero (padding) */
} CkptfsMcoreKey;

/* The tensor keys of MODEL (sizes, bias, norms and tying are read; the architecture is not),
 * with the vocabulary padded to PADDED_VOCAB rows, in Megatron's module order. */
GPtrArray *ckptfs_mcore_keys(const CkptfsModel *model, uint64_t padded_vocab);

/* The modules of each layer whose `_extra_state` a loader asks for (local and TE specs). */
const char *const *ckptfs_mcore_extra_state_modules(const CkptfsModel *model);

/* The full shape of KEY for LAYERS layers into SHAPE; returns ndim. */
unsigned ckptfs_mcore_key_shape(const CkptfsMcoreKey *key, uint64_t layers, uint64_t *shape);

/* Boundaries (sorted, distinct, from 0 to the extent) of what the TP ranks of each degree in
 * TPS (N of them) load along the split dimension of KEY: rows, or columns for COLS. For VOCAB,
 * each degree T pads the vocabulary to a multiple of DIVISIBLE_BY * T (VOCAB rows). */
GArray *ckptfs_mcore_tp_cuts(const CkptfsMcoreKey *key, const unsigned *tps, unsigned n,
                             uint64_t vocab, uint64_t divisible_by);

#endif
