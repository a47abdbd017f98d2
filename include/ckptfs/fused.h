/* Routed experts fused on disk: one 3-D tensor per projection, expert e a slice of it, as
 * transformers 5 holds them in memory (and loads them as they are for Qwen3-MoE), Qwen3-VL-MoE's
 * releases (transposed) and GPT-OSS's (transposed, gate and up interleaved) store them. The
 * Megatron views read per-expert tensors: each is a strided piece of the fused one, no byte
 * copied. The other way, the fused tensors of hf/ are made of per-expert pieces. */
#ifndef CKPTFS_FUSED_H
#define CKPTFS_FUSED_H

#include <glib.h>
#include <stdbool.h>

#include "ckptfs/catalog.h"
#include "ckptfs/model.h"

/* One form of fused experts (E experts, hidden size H, expert FFN size F). */
typedef struct CkptfsFusedExperts {
    const char *name;    /* in messages: "[E, 2F, H]" */
    const char *gate_up; /* names after a layer's prefix ("model.layers.N.", "mtp.layers.J.") */
    const char *down;
    /* gate_up [E, H, 2F] and down [E, F, H] (inputs first: x @ W) rather than nn.Linear's
     * [E, 2F, H] and [E, H, F] */
    bool transposed;
    /* gate and up alternate along 2F (gate at even places) rather than gate's F then up's */
    bool interleaved;
    /* the experts' biases, gate_up's [E, 2F] ordered as its weight, down's [E, H] (names after
     * a layer's prefix; NULL: the form has none) */
    const char *gate_up_bias, *down_bias;
} CkptfsFusedExperts;

/* transformers 5's experts module in memory: [E, 2F, H] gate then up, [E, H, F] */
extern const CkptfsFusedExperts ckptfs_fused_in_memory;

/* Experts an architecture's transformers class holds fused (HELD) and its save_pretrained writes
 * one tensor per expert and projection (its weight conversion): the names after a layer's prefix,
 * "{e}" the expert. */
typedef struct CkptfsSavedExperts {
    const CkptfsFusedExperts *held;
    const char *gate, *up, *down;
    /* NULL-terminated pairs: a module transformers renames on load, as held and as saved (after
     * a layer's prefix), which save_pretrained names back in every layer split (Mixtral's
     * router); NULL: none */
    const char *const *renamed;
} CkptfsSavedExperts;

/* transformers 5.12.1's qwen2_moe conversion (GLM-4.5V's among others): held as
 * ckptfs_fused_in_memory, saved as mlp.experts.{e}.gate_proj.weight, up_proj, down_proj */
extern const CkptfsSavedExperts ckptfs_saved_per_expert;
/* transformers 5.12.1's mixtral conversion: held as ckptfs_fused_in_memory under mlp., saved as
 * block_sparse_moe.experts.{e}.w1.weight (gate), w3 (up), w2 (down), the router as
 * block_sparse_moe.gate.weight */
extern const CkptfsSavedExperts ckptfs_saved_mixtral;
/* Qwen3-VL-MoE's releases: [E, H, 2F] gate then up, [E, F, H] */
extern const CkptfsFusedExperts ckptfs_fused_transposed;
/* GPT-OSS's bf16 releases: [E, H, 2F] gate and up interleaved, [E, F, H], with biases */
extern const CkptfsFusedExperts ckptfs_fused_interleaved;

/* The per-expert tensors MODEL's rules read, in CATALOG, for every MoE layer (the decoder's, and
 * the multi-token prediction layers' when MODEL serves them, each under its own prefix:
 * ckptfs_model_hf_layer_name) whose experts are fused in one of FORMS (NULL-terminated; the one whose shapes fit): each a strided piece of the
 * fused tensor, which leaves the catalog. Layers held per expert are left as they are. Refused
 * by name: a fused tensor whose first dimension is not the expert count or whose other two fit
 * no form, shapes that fit two forms, a layer with fused and per-expert tensors both, one fused
 * projection without the other, a fused tensor not stored whole rows per expert. *SPLIT counts
 * the layers. */
bool ckptfs_fused_experts_split(CkptfsCatalog *catalog, const CkptfsModel *model,
                                const CkptfsFusedExperts *const *forms, unsigned *split, GError **error);

/* The fused tensors of SAVED's held form in CATALOG (any name ending in a layer's number and its
 * gate_up name: "model.language_model.layers.1.mlp.experts.gate_up_proj", as a model holds them
 * in memory) replaced by the per-expert tensors its save_pretrained writes under the same layer
 * prefix, each a strided piece of the fused one (no byte copied). MODEL gives the expert count
 * and sizes. Refused by name as ckptfs_fused_experts_split refuses. *SPLIT counts the layers. */
bool ckptfs_fused_experts_split_as_saved(CkptfsCatalog *catalog, const CkptfsModel *model,
                                         const CkptfsSavedExperts *saved, unsigned *split, GError **error);

/* Whether CATALOG holds a fused tensor of FORMS for some MoE layer of MODEL. */
bool ckptfs_fused_experts_present(const CkptfsCatalog *catalog, const CkptfsModel *model,
                                  const CkptfsFusedExperts *const *forms);

/* The other way (hf/ of a source held per expert, for an architecture whose Hugging Face form
 * is fused): every MoE layer's per-expert tensors in CATALOG become fused tensors in FORM, made
 * of their pieces (reshaped so that each piece is a rectangle, transposed pieces where FORM is,
 * gate's and up's pieces interleaved where FORM is transposed and interleaved: two pieces per
 * expert and stored piece, whatever the sizes), and leave it. */
bool ckptfs_fused_experts_join(CkptfsCatalog *catalog, const CkptfsModel *model, const CkptfsFusedExperts *form,
                               GError **error);

#endif
