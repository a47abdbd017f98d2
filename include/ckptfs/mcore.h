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

#include "ckptfs/catalog.h"
#include "ckptfs/mapping.h"
#include "ckptfs/model.h"

#define CKPTFS_MAX_SECTIONS 6u

typedef struct {
    char *hf_name;        /* for stacked keys a layer suffix ("self_attn.q_proj.weight") */
    uint64_t hf_row0;     /* first row taken from the HF tensor */
    uint64_t row0, rows;  /* the rows of the key's matrix it fills */
} CkptfsMcoreSegment;

typedef struct {
    char *key;            /* "decoder.layers.self_attention.linear_qkv.weight" */
    char *local_key;      /* the same as a local-spec model saves it (most often KEY) */
    const CkptfsRule *rule; /* the row of the mapping table it comes from */
    bool stacked;         /* leading layer dimension */
    bool expert;          /* one matrix per routed expert, stacked after the layer axis */
    uint64_t experts;     /* their number (experts of the model) */
    unsigned ndim;        /* of one layer's (expert's) tensor: 1 or 2; 3 for [rows, 1, cols]
                             (a gated delta-net's conv1d) */
    uint64_t rows, cols;  /* that tensor as a matrix (cols 1 for 1-D) */
    CkptfsTpSplit split;
    /* CKPTFS_TP_SECTIONS: the row sections each TP rank takes a slice of (ckptfs_dim_sections) */
    uint64_t sections[CKPTFS_MAX_SECTIONS];
    /* their names: torch_dist holds each section as a key of its own, the key's name + "." + the
     * section's ("...in_proj.weight.query"), as Megatron-core's GatedDeltaNet saves them */
    const char *section_names[CKPTFS_MAX_SECTIONS];
    unsigned n_sections;
    GArray *segments;     /* CkptfsMcoreSegment, by row; rows not covered are zero (padding) */
    /* Layers from DECODER_LAYERS on are multi-token prediction layers, whose HF tensors are
     * under MTP_HF_PREFIX when the family names one (CkptfsFamily.mtp_hf_prefix) */
    uint64_t decoder_layers;
    const char *mtp_hf_prefix;
    const char *mtp_hf_block_prefix; /* CkptfsFamily's: the MTP layer's own tensors without a number */
    const char *hf_layer_prefix; /* the architecture's (NULL: "model.layers.") */
    /* a key of the family's module list (CKPTFS_SCOPE_LIST): a leading axis of LIST_COUNT, its
     * HF tensors after LIST_HF_PREFIX and the module's number */
    bool listed;
    uint64_t list_count;
    const char *list_hf_prefix;
    const char *layer_prefix; /* a layer's module: the architecture's, or "decoder.layers." */
} CkptfsMcoreKey;

/* The row sections of DIM in MODEL that CKPTFS_TP_SECTIONS splits one by one, into OUT, their
 * torch_dist names into NAMES (may be NULL); how many (0 for a dim without sections). */
unsigned ckptfs_dim_sections(const CkptfsModel *model, CkptfsDim dim, uint64_t out[CKPTFS_MAX_SECTIONS],
                             const char *names[CKPTFS_MAX_SECTIONS]);

/* Whether KEY's HF matrix holds its columns' two halves in the other order
 * (CKPTFS_RECIPE_SWAP_COL_HALVES): each rectangle of the key is then read through
 * ckptfs_tensor_emit_rect_swapped / ckptfs_piece_swap_col_halves. */
bool ckptfs_mcore_key_swaps_col_halves(const CkptfsMcoreKey *key);
/* Whether KEY's HF tensor is its matrix transposed (CKPTFS_RECIPE_TRANSPOSED): each rectangle of
 * the key is then read through ckptfs_tensor_emit_rect_transposed. */
bool ckptfs_mcore_key_transposed(const CkptfsMcoreKey *key);

/* The tensor keys of MODEL from its family's mapping table (sizes, bias, norms and tying are
 * read), with the vocabulary padded to PADDED_VOCAB rows, in Megatron's module order. Tied
 * embeddings have no output layer, unless TIED_OUTPUT_COPY (legacy files of a pipeline keep a
 * copy of the embedding on the last stage). */
GPtrArray *ckptfs_mcore_keys(const CkptfsModel *model, uint64_t padded_vocab, bool tied_output_copy);

/* The element type of KEY's tensors in MODEL (the weights' type, or for an entry Megatron keeps
 * in fp32 the type its source tensors have). */
CkptfsDtype ckptfs_mcore_key_dtype(const CkptfsMcoreKey *key, const CkptfsModel *model);

/* Splits KEYS as a legacy file of SPEC does (the local spec splits MLA's down projections by
 * rows, the TE spec replicates them). */
void ckptfs_mcore_keys_for_spec(GPtrArray *keys, bool te_spec);

/* The key of RULE in KEYS, or NULL when the model has no such entry. */
const CkptfsMcoreKey *ckptfs_mcore_key_of(const GPtrArray *keys, const CkptfsRule *rule);

/* Whether MODEL has the entry of RULE in some layer (tied embeddings: no output layer unless
 * TIED_OUTPUT_COPY). */
bool ckptfs_rule_present(const CkptfsRule *rule, const CkptfsModel *model, bool tied_output_copy);
/* Whether layer LAYER of MODEL has the entry of layer rule RULE (dense-MLP entries in dense
 * layers, MoE entries in MoE layers). */
bool ckptfs_rule_in_layer(const CkptfsRule *rule, const CkptfsModel *model, uint64_t layer);

/* The rules of MODEL's family for SCOPE that a legacy state dict of SPEC holds, in its order
 * (tensors and _extra_state entries); for LAYER scope those of layer LAYER. Expert rules come
 * as one run, which a state dict repeats per local expert (mcore.h: ckptfs_expert_legacy_name). */
GPtrArray *ckptfs_legacy_entries(const CkptfsModel *model, CkptfsScope scope, uint64_t layer,
                                 bool te_spec, bool tied_output_copy);
/* The name of RULE's entry in a legacy state dict of SPEC (without "decoder.layers.N."). */
const char *ckptfs_rule_legacy_name(const CkptfsRule *rule, bool te_spec);
/* The key of entry NAME of SCOPE in a legacy state dict: after "decoder.layers.LOCAL." for a
 * layer, or in a multi-token prediction layer (MTP_PREFIX "mtp.layers.J.", else NULL) after
 * "mtp.layers.J.mtp_model_layer." for its layer's entries and "mtp.layers.J." for its own; a
 * module of the family's list (CKPTFS_SCOPE_LIST) after MTP_PREFIX, there the list's prefix and
 * the module's number. */
char *ckptfs_legacy_key(CkptfsScope scope, uint64_t local, const char *name, const char *mtp_prefix);
/* The prefix of module J of MODEL's module list in a legacy state dict (the MTP_PREFIX of
 * ckptfs_legacy_key): "decoder.deepstack_merger_list.J.". */
char *ckptfs_list_module_prefix(const CkptfsModel *model, uint64_t j);
/* The whole key of RULE's entry NAME in a legacy state dict of MODEL (a VLM's language model or
 * tower) under PREFIX, its part's module: the rule's own module in its place (Gemma 3's
 * vision_projection.), a layer's entries under the architecture's layer prefix (a tower kept as
 * transformers' module: "blocks.LOCAL.") or as ckptfs_legacy_key puts them. The views write
 * these keys and the sources read them back. */
char *ckptfs_legacy_entry_key(const CkptfsModel *model, const CkptfsRule *rule, const char *prefix,
                              uint64_t local, const char *name, const char *mtp_prefix);
/* The legacy name of expert rule RULE for local expert J: SequentialMLP's
 * "mlp.experts.local_experts.J.linear_fc1.weight", or with GROUPED (TEGroupedMLP)
 * "mlp.experts.linear_fc1.weightJ" (its _extra_state is one per linear: J ignored). */
char *ckptfs_expert_legacy_name(const CkptfsRule *rule, bool grouped, uint64_t j);

/* The layer rules whose `_extra_state` objects a torch_dist loader asks for (present in some
 * layer of MODEL), in table order. */
GPtrArray *ckptfs_mcore_extra_state_rules(const CkptfsModel *model);

/* A Hugging Face tensor of KEY: HF (a segment's or share part's name) of layer LAYER and
 * expert EXPERT, as the checkpoint names it ("model.layers.3.mlp.experts.5.up_proj.weight";
 * a multi-token prediction layer's under the family's prefix: "model.mtp_layers.0.input_proj.weight"). */
char *ckptfs_mcore_hf_name(const CkptfsMcoreKey *key, uint64_t layer, uint64_t expert, const char *hf);

/* Every Hugging Face tensor of MODEL (KEYS: its mcore keys), full names, in checkpoint order:
 * the embedding, then layer by layer (expert by expert), the final norm and output layer. */
typedef struct {
    char *name;
    unsigned ndim;
    uint64_t d0, d1; /* d1 0 for 1-D; ndim 3: [d0, 1, d1] */
    bool fp32;       /* a tensor Megatron keeps in float32 (the weights' type not required) */
    CkptfsDim cols_dim; /* its columns' dim: a kernel's (CKPTFS_DIM_PATCH, CKPTFS_DIM_MERGE_KERNEL)
                           keeps its own shape (ckptfs_model_kernel_shape) */
} CkptfsHfShape;
GArray *ckptfs_model_hf_tensors(const CkptfsModel *model, const GPtrArray *keys);

/* What tensor-parallel rank R of T holds of KEY (one layer of it): a matrix of *ROWS x *COLS
 * whose rows, in order, are these parts. */
typedef struct {
    const char *hf;        /* Hugging Face name (layer suffix for stacked keys); NULL: padding */
    uint64_t hf_row0, rows; /* rows of the HF tensor */
    uint64_t col0, cols;   /* its columns */
} CkptfsSharePart;
GArray *ckptfs_mcore_share(const CkptfsMcoreKey *key, unsigned T, unsigned r, uint64_t *rows,
                           uint64_t *cols);

/* Whether KEY is a convolution's kernel (ckptfs_model_kernel_shape): its dims (0: it is not),
 * and its shape as stored in every format into SHAPE. */
unsigned ckptfs_mcore_kernel_shape(const CkptfsMcoreKey *key, const CkptfsModel *model, uint64_t *shape);

/* The full shape of KEY for LAYERS stacked layers (0: one layer's key, no layer axis) into
 * SHAPE (up to 4 dims, the experts' axis after the layers'); returns ndim. */
unsigned ckptfs_mcore_key_shape(const CkptfsMcoreKey *key, uint64_t layers, uint64_t *shape);
/* The torch_dist name of KEY as a model of SPEC saves it; with PER_LAYER (a model whose layers
 * are not all of one kind) the key of layer LAYER alone ("decoder.layers.5.mlp.router.weight"). */
char *ckptfs_mcore_key_name(const CkptfsMcoreKey *key, bool te_spec, bool per_layer, uint64_t layer);

/* The torch_dist name of KEY (a layer key, or a multi-token prediction rule's) in MTP layer J:
 * "mtp.layers.J.transformer_layer.<layer key>" (the name Megatron's sharded state dict keeps for
 * checkpoints; its modules call the layer mtp_model_layer), "mtp.layers.J.enorm.weight". */
char *ckptfs_mcore_mtp_key_name(const CkptfsMcoreKey *key, bool te_spec, uint64_t j);

/* Boundaries (sorted, distinct, from 0 to the extent) of what the TP ranks of each degree in
 * TPS (N of them) load along the split dimension of KEY: rows, or columns for COLS. For VOCAB,
 * each degree T pads the vocabulary to a multiple of DIVISIBLE_BY * T (VOCAB rows). */
GArray *ckptfs_mcore_tp_cuts(const CkptfsMcoreKey *key, const unsigned *tps, unsigned n,
                             uint64_t vocab, uint64_t divisible_by);

/* Whether every tensor of CATALOG that KEYS serve shifted (a zero-centred norm,
 * CKPTFS_RECIPE_LESS_ONE) can be: served as stored, bf16 or fp32; and every one they serve
 * transposed (CKPTFS_RECIPE_TRANSPOSED) is stored element by element; otherwise an error naming it. */
bool ckptfs_mcore_keys_check_shifted(const GPtrArray *keys, const CkptfsModel *model, const CkptfsCatalog *catalog,
                                     GError **error);

#endif
