/* Model rules: what a dense decoder checkpoint is, read from config.json and checked against
 * the catalog. Architectures are data (a table), not code paths. */
#ifndef CKPTFS_MODEL_H
#define CKPTFS_MODEL_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/catalog.h"
#include "ckptfs/mapping.h"

typedef struct {
    const char *hf_architecture; /* "LlamaForCausalLM" */
    const char *model_type;      /* "llama" */
    bool qkv_bias;               /* q/k/v projections always carry a bias (Qwen2) */
    bool qk_norm;                /* per-head RMSNorm on q and k (Qwen3) */
    const CkptfsFamily *family;  /* the Megatron mapping of its tensors */
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

/* The architecture named NAME (a model_type such as "qwen2", or an HF class name), or when NAME
 * is NULL the first whose built-in features are these (a Megatron checkpoint says only which
 * features it has): Llama for none, Qwen2 for q/k/v biases, Qwen3 for q/k norms. NULL when
 * none matches. */
const CkptfsArchitecture *ckptfs_architecture_find(const char *name, bool qkv_bias, bool qk_norm);

/* Reads CONFIG (config.json) and checks every tensor the rules need exists in CATALOG with the
 * expected shape and one common dtype. Errors name config.json or the tensor and the problem. */
bool ckptfs_model_from_config(JsonObject *config, const CkptfsCatalog *catalog,
                              CkptfsModel *model, GError **error);

/* Whether MODEL's sizes, which a source gives (config.json, Megatron args), are within what
 * ckptfs serves: each dimension at most CKPTFS_MAX_MODEL_DIM (the vocabulary CKPTFS_MAX_VOCAB),
 * so that no product of them the mapping rules form can wrap, and few enough layers for
 * CKPTFS_MAX_SOURCE_TENSORS. Errors start with WHAT. */
bool ckptfs_model_check_limits(const CkptfsModel *model, const char *what, GError **error);

/* HF tensor names of layer I (NULL-safe helpers for the views). */
char *ckptfs_hf_layer_name(uint64_t layer, const char *suffix);

#endif
