/* torchtitan's parameter names and layouts, as its state-dict adapters convert them to Hugging
 * Face's: a naming table per model (data), and the few layouts that differ (Llama 3's rotary
 * halves of wq/wk, grouped experts) as pieces of the stored tensor, no byte copied. */
#ifndef CKPTFS_SOURCE_TITAN_H
#define CKPTFS_SOURCE_TITAN_H

#include <json-glib/json-glib.h>

#include "ckptfs/catalog.h"

/* How one torchtitan tensor becomes Hugging Face's. */
typedef enum {
    CKPTFS_TITAN_AS_IS,
    CKPTFS_TITAN_ROPE_Q,      /* rows permuted per query head (Llama's interleaved rotary pairs) */
    CKPTFS_TITAN_ROPE_K,      /* the same per key/value head */
    CKPTFS_TITAN_PER_EXPERT,  /* [E, A, B] grouped experts: one [A, B] tensor per expert */
    CKPTFS_TITAN_REFUSED,     /* a tensor Hugging Face's model has no place for: refused, WHY says */
    CKPTFS_TITAN_DERIVED,     /* a table torchtitan computes from the config (its rotary cache): not read */
} CkptfsTitanLayout;

typedef struct {
    const char *titan; /* "layers.{}.attention.wq.weight": {} the layer */
    const char *hf;    /* "model.layers.{}.self_attn.q_proj.weight": {} the layer, then the expert */
    CkptfsTitanLayout layout;
    const char *why;   /* CKPTFS_TITAN_REFUSED: why */
} CkptfsTitanName;

typedef struct {
    const char *name;                /* in messages: "Llama 3" */
    const char *const *model_types;  /* config.json's model_type values it serves; NULL-terminated */
    const CkptfsTitanName *names;    /* ended by a row with titan NULL */
} CkptfsTitanModel;

/* The torchtitan model whose Hugging Face form is MODEL_TYPE, or NULL. */
const CkptfsTitanModel *ckptfs_titan_model_for(const char *model_type);
/* The row of MODEL naming torchtitan tensor NAME, or NULL; *LAYER (owned by the caller) its
 * layer number, NULL for a tensor outside the layers. */
const CkptfsTitanName *ckptfs_titan_lookup(const CkptfsTitanModel *model, const char *name, char **layer);
/* The model types ckptfs reads torchtitan checkpoints of, for messages ("llama, qwen3, ..."). */
char *ckptfs_titan_model_types(void);

/* The heads Llama's rotary permutation works per. */
typedef struct {
    uint64_t query, key_value;
} CkptfsTitanHeads;

/* Adds to CATALOG the Hugging Face tensor(s) of torchtitan tensor ROW (LAYER its layer) of
 * DTYPE, SHAPE (N dims) and PIECES of its 2-D view (rows: the first dim). */
bool ckptfs_titan_add(CkptfsCatalog *catalog, const CkptfsTitanName *row, const char *layer,
                      const CkptfsTitanHeads *heads, CkptfsDtype dtype, unsigned n, const uint64_t *shape,
                      const CkptfsPiece *pieces, unsigned npieces, GError **error);

#endif
