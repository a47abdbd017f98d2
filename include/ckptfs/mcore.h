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

#include "ckptfs/mapping.h"
#include "ckptfs/model.h"

typedef struct {
    char *hf_name;        /* for stacked keys a layer suffix ("self_attn.q_proj.weight") */
    uint64_t hf_row0;     /* first row taken from the HF tensor */
    uint64_t row0, rows;  /* the rows of the key's matrix it fills */
} CkptfsMcoreSegment;

typedef struct {
    char *key;            /* "decoder.layers.self_attention.linear_qkv.weight" */
    const CkptfsRule *rule; /* the row of the mapping table it comes from */
    bool stacked;         /* leading layer dimension */
    unsigned ndim;        /* of one layer's tensor (or of the tensor): 1 or 2 */
    uint64_t rows, cols;  /* that tensor as a matrix (cols 1 for 1-D) */
    CkptfsTpSplit split;
    GArray *segments;     /* CkptfsMcoreSegment, by row; rows not covered are zero (padding) */
} CkptfsMcoreKey;

/* The tensor keys of MODEL from its family's mapping table (sizes, bias, norms and tying are
 * read), with the vocabulary padded to PADDED_VOCAB rows, in Megatron's module order. Tied
 * embeddings have no output layer, unless TIED_OUTPUT_COPY (legacy files of a pipeline keep a
 * copy of the embedding on the last stage). */
GPtrArray *ckptfs_mcore_keys(const CkptfsModel *model, uint64_t padded_vocab, bool tied_output_copy);

/* The key of RULE in KEYS, or NULL when the model has no such entry. */
const CkptfsMcoreKey *ckptfs_mcore_key_of(const GPtrArray *keys, const CkptfsRule *rule);

/* Whether MODEL has the entry of RULE (tied embeddings: no output layer unless
 * TIED_OUTPUT_COPY). */
bool ckptfs_rule_present(const CkptfsRule *rule, const CkptfsModel *model, bool tied_output_copy);

/* The rules of MODEL's family for SCOPE that a legacy state dict of SPEC holds, in its order
 * (tensors and _extra_state entries). */
GPtrArray *ckptfs_legacy_entries(const CkptfsModel *model, CkptfsScope scope, bool te_spec,
                                 bool tied_output_copy);
/* The name of RULE's entry in a legacy state dict of SPEC (without "decoder.layers.N."). */
const char *ckptfs_rule_legacy_name(const CkptfsRule *rule, bool te_spec);

/* The modules of each layer whose `_extra_state` a torch_dist loader asks for, NULL-ended. */
GPtrArray *ckptfs_mcore_extra_state_modules(const CkptfsModel *model);

/* The Hugging Face tensors KEYS are made of (layer suffixes for LAYER_KEYS, full names for the
 * others), in order of first use, with their shapes (derived from the segments). */
typedef struct {
    const char *name;
    unsigned ndim;
    uint64_t d0, d1; /* d1 0 for 1-D */
} CkptfsHfShape;
GArray *ckptfs_mcore_hf_tensors(const GPtrArray *keys, bool layer_keys);

/* What tensor-parallel rank R of T holds of KEY (one layer of it): a matrix of *ROWS x *COLS
 * whose rows, in order, are these parts. */
typedef struct {
    const char *hf;        /* Hugging Face name (layer suffix for stacked keys); NULL: padding */
    uint64_t hf_row0, rows; /* rows of the HF tensor */
    uint64_t col0, cols;   /* its columns */
} CkptfsSharePart;
GArray *ckptfs_mcore_share(const CkptfsMcoreKey *key, unsigned T, unsigned r, uint64_t *rows,
                           uint64_t *cols);

/* The full shape of KEY for LAYERS layers into SHAPE; returns ndim. */
unsigned ckptfs_mcore_key_shape(const CkptfsMcoreKey *key, uint64_t layers, uint64_t *shape);

/* Boundaries (sorted, distinct, from 0 to the extent) of what the TP ranks of each degree in
 * TPS (N of them) load along the split dimension of KEY: rows, or columns for COLS. For VOCAB,
 * each degree T pads the vocabulary to a multiple of DIVISIBLE_BY * T (VOCAB rows). */
GArray *ckptfs_mcore_tp_cuts(const CkptfsMcoreKey *key, const unsigned *tps, unsigned n,
                             uint64_t vocab, uint64_t divisible_by);

#endif
