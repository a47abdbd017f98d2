/* Model rules: what a dense decoder checkpoint is, read from config.json and checked against
 * the catalog. Architectures are data (a table), not code paths. */
#ifndef CKPTFS_MODEL_H
#define CKPTFS_MODEL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/catalog.h"

typedef struct {
    const char *hf_architecture; /* "LlamaForCausalLM" */
    const char *model_type;      /* "llama" */
    bool qkv_bias;               /* q/k/v projections always carry a bias (Qwen2) */
    bool qk_norm;                /* per-head RMSNorm on q and k (Qwen3) */
} CkptfsArchitecture;

typedef struct {
    const CkptfsArchitecture *arch;
    uint64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t max_positions;
    bool tied_embeddings;
    bool qkv_bias;
    bool qk_norm;
    double rope_theta;
    double norm_eps;
    /* Llama 3.x rope scaling ("rope_type": "llama3"); factor 0 when absent. */
    double rope_scaling_factor;
    CkptfsDtype dtype; /* of the weights (all the same) */
} CkptfsModel;

/* The table of known architectures, NULL-terminated. */
const CkptfsArchitecture *const *ckptfs_architectures(void);

/* Reads CONFIG (config.json) and checks every tensor the rules need exists in CATALOG with the
 * expected shape and one common dtype. Errors name config.json or the tensor and the problem. */
bool ckptfs_model_from_config(JsonObject *config, const CkptfsCatalog *catalog,
                              CkptfsModel *model, GError **error);

/* The HF tensors of one decoder layer of MODEL (bias and q/k norms as it has them), in
 * Hugging Face's module order: name suffix and shape (d1 0 for 1-D). Returns the count. */
#define CKPTFS_HF_LAYER_TENSORS_MAX 16
typedef struct {
    const char *suffix; /* "self_attn.q_proj.weight" */
    unsigned ndim;
    uint64_t d0, d1;
} CkptfsHfShape;
unsigned ckptfs_hf_layer_tensors(const CkptfsModel *model, CkptfsHfShape *out);

/* HF tensor names of layer I (NULL-safe helpers for the views). */
char *ckptfs_hf_layer_name(uint64_t layer, const char *suffix);

#endif
