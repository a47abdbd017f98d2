/* The Hugging Face <-> Megatron-core mapping, as data: one table of rules per architecture
 * family. Each rule is one Megatron state-dict entry (a weight, or an `_extra_state` object):
 * its torch_dist / Transformer Engine name and its local-spec name, its place in a legacy
 * state dict for each spec, its shape in model dimensions, how tensor parallelism splits it and
 * which Hugging Face tensors fill it (the recipe). Every user derives what it needs from the
 * table: the mcore/ keys and chunks, the legacy rank-file views, the legacy and torch_dist
 * sources (the same segments read backwards), and the Hugging Face tensors a model must have. */
#ifndef CKPTFS_MAPPING_H
#define CKPTFS_MAPPING_H

#include <stdbool.h>
#include <stdint.h>

/* How Megatron's tensor parallelism splits an entry (what one TP rank holds). */
typedef enum {
    CKPTFS_TP_REPLICATED, /* norms: every rank holds the whole tensor */
    CKPTFS_TP_ROWS,       /* column-parallel: rows [r*R/T, (r+1)*R/T) (QKV, its bias) */
    CKPTFS_TP_ROW_HALVES, /* fc1: the same rows of each half ([gate; up]) */
    CKPTFS_TP_COLS,       /* row-parallel: columns [r*C/T, (r+1)*C/T) (linear_proj, fc2) */
    CKPTFS_TP_VOCAB,      /* vocab-parallel: rows of the vocabulary as padded for T */
    /* column-parallel over each of the row sections of the key's rows dim in turn (a gated
     * delta-net's in_proj: q, k, v, z, beta, alpha; its conv1d: q, k, v): rank r holds the
     * r-th slice of every section, in order (ckptfs_dim_sections) */
    CKPTFS_TP_SECTIONS,
} CkptfsTpSplit;

/* Sizes in model dimensions. */
typedef enum {
    CKPTFS_DIM_ONE,    /* the column count of a vector */
    CKPTFS_DIM_HIDDEN, /* hidden_size */
    CKPTFS_DIM_HEAD,   /* head_dim */
    CKPTFS_DIM_Q,      /* heads * head_dim */
    CKPTFS_DIM_QKV,    /* (heads + 2 * kv_heads) * head_dim */
    CKPTFS_DIM_FFN,    /* intermediate_size */
    CKPTFS_DIM_FFN2,   /* 2 * intermediate_size */
    CKPTFS_DIM_VOCAB,  /* the vocabulary, padded in Megatron (vocab_size in Hugging Face) */
    CKPTFS_DIM_EXPERTS,     /* routed experts (the router's rows) */
    CKPTFS_DIM_MOE_FFN,     /* one expert's intermediate size */
    CKPTFS_DIM_MOE_FFN2,    /* twice that (fc1 = [gate; up]) */
    CKPTFS_DIM_SHARED_FFN,  /* the shared expert's intermediate size */
    CKPTFS_DIM_SHARED_FFN2,
    /* Multi-head latent attention (DeepSeek-V2/V3) */
    CKPTFS_DIM_Q_LORA,  /* q_lora_rank: the query's compressed width */
    CKPTFS_DIM_KV_LORA, /* kv_lora_rank */
    CKPTFS_DIM_MLA_Q,   /* heads * (qk_head_dim + qk_pos_emb_head_dim): the query per head */
    CKPTFS_DIM_MLA_KV_DOWN, /* kv_lora_rank + qk_pos_emb_head_dim: latent and shared rope key */
    CKPTFS_DIM_MLA_KV_UP,   /* heads * (qk_head_dim + v_head_dim): keys and values per head */
    CKPTFS_DIM_MLA_OUT,     /* heads * v_head_dim: what linear_proj reads */
    CKPTFS_DIM_HIDDEN2,     /* 2 * hidden_size (an MTP layer's eh_proj reads two states) */
    /* A vision tower (its hidden_size is the model's HIDDEN there) */
    CKPTFS_DIM_PATCH,       /* channels * temporal patch * patch^2: a patch's pixels (the columns
                               of a Conv3d kernel [hidden, channels, temporal, patch, patch],
                               which keeps that shape in every format) */
    CKPTFS_DIM_MERGED,      /* hidden_size * spatial_merge_size^2: a merged square of patches */
    CKPTFS_DIM_VISION_OUT,  /* out_hidden_size: what the merger hands the language model */
    CKPTFS_DIM_HEADS,       /* attention heads (one attention sink each) */
    /* Gated attention (Qwen3-Next): q_proj holds a query and an output gate per head */
    CKPTFS_DIM_QKV_GATED,   /* (2 * heads + 2 * kv_heads) * head_dim */
    /* Gated delta-net (linear attention) layers */
    CKPTFS_DIM_GDN_IN,      /* in_proj: 2 * key dim + 2 * value dim + 2 * value heads (q, k, v,
                               z, beta, alpha) */
    CKPTFS_DIM_GDN_CONV,    /* conv1d's channels: 2 * key dim + value dim (q, k, v) */
    CKPTFS_DIM_GDN_VALUE,   /* value heads * value head dim (out_proj's input) */
    CKPTFS_DIM_GDN_HEADS,   /* value heads (A_log, dt_bias) */
    CKPTFS_DIM_GDN_VALUE_HEAD, /* one value head's width (the per-head out_norm) */
    CKPTFS_DIM_CONV_KERNEL, /* conv1d's kernel width */
    CKPTFS_DIM_POSITIONS,   /* a vision tower's learned position embedding's rows */
    CKPTFS_DIM_MERGE_KERNEL, /* hidden_size * spatial_merge_size^2: the columns of a Conv2d that
                                merges a square of patches (GLM-4.1V's downsample), its kernel
                                [rows, hidden, merge, merge] kept in every format */
} CkptfsDim;

/* Which Hugging Face tensors fill an entry, row segment by row segment. */
typedef enum {
    CKPTFS_RECIPE_WHOLE,        /* hf[0] as it is */
    CKPTFS_RECIPE_QKV,          /* per query group: its q rows of hf[0], k rows of hf[1], v of hf[2] */
    CKPTFS_RECIPE_QKV_FUSED,    /* the same from hf[0] = [q; k; v] (one fused projection) */
    CKPTFS_RECIPE_HALVES,       /* [hf[0]; hf[1]] (fc1 = [gate; up]) */
    CKPTFS_RECIPE_HALVES_FUSED, /* hf[0] = [gate; up] already */
    /* hf[0] with each row's two column halves in the other order: [b | a] from [a | b] (MiMo's
     * MTP input_proj reads [hidden; embedding], Megatron's eh_proj [embedding; hidden]). A
     * gather of rectangles, its own inverse: sources read it back the same way. */
    CKPTFS_RECIPE_SWAP_COL_HALVES,
    /* Megatron's gated attention linear_qkv (attention_output_gate): per query group its
     * queries, their gates, its key and value, from hf[0] = q_proj holding [query; gate] per
     * head, hf[1] = k_proj, hf[2] = v_proj (Qwen3-Next) */
    CKPTFS_RECIPE_QKV_GATED,
    /* A gated delta-net's in_proj = [q; k; v; z; beta; alpha], each over all heads, from
     * Qwen3-Next's hf[0] = in_proj_qkvz and hf[1] = in_proj_ba, which hold them per key-head
     * group ([q_g; k_g; v_g; z_g] and [b_g; a_g]) */
    CKPTFS_RECIPE_GDN_IN_GROUPED,
    /* the same from Qwen3.5's hf[0] = in_proj_qkv ([q; k; v] over all heads), hf[1] = in_proj_z,
     * hf[2] = in_proj_b, hf[3] = in_proj_a: stacked as they are */
    CKPTFS_RECIPE_GDN_IN_SPLIT,
    /* hf[0] less one, element by element: Megatron's zero-centred norm (layernorm_zero_centered_
     * gamma) of a norm Hugging Face stores as the plain weight (the gated delta-net's out_norm).
     * Converted on read; a source reads it back plus one. */
    CKPTFS_RECIPE_LESS_ONE,
    /* hf[0] transposed: a 2-D Hugging Face tensor of [cols, rows] (Gemma 3's
     * mm_input_projection_weight, which transformers multiplies from the right). Read by columns
     * on read, as an expert's slice of a fused tensor stored transposed is. */
    CKPTFS_RECIPE_TRANSPOSED,
} CkptfsRecipe;

/* When an entry exists. */
typedef enum {
    CKPTFS_NEED_ALWAYS,
    CKPTFS_NEED_QKV_BIAS, /* the model has q/k/v biases */
    CKPTFS_NEED_QK_NORM,  /* per-head q/k norms */
    CKPTFS_NEED_OUTPUT,   /* an untied output layer (or, in legacy files, the last stage's copy
                             of tied embeddings: TIED_HF) */
    CKPTFS_NEED_DENSE_MLP,     /* a layer with a dense MLP (every layer of a dense model) */
    CKPTFS_NEED_MOE,           /* a mixture-of-experts layer */
    CKPTFS_NEED_SHARED_EXPERT, /* an MoE layer of a model with a shared expert */
    CKPTFS_NEED_SHARED_GATE,   /* ... whose output is gated (Qwen2-MoE) */
    CKPTFS_NEED_Q_LORA,        /* MLA with a compressed query (q_lora_rank set) */
    CKPTFS_NEED_Q_DIRECT,      /* MLA without one (DeepSeek-V2-Lite: q_proj) */
    CKPTFS_NEED_EXPERT_BIAS,   /* an MoE layer routed with a per-expert bias (DeepSeek-V3) */
    CKPTFS_NEED_MTP,           /* multi-token prediction layers served (-o mtp=on) */
    /* Hybrid models (layer kinds per layer: CkptfsModel.linear_layer) */
    CKPTFS_NEED_FULL_ATTENTION,   /* a layer of softmax attention */
    CKPTFS_NEED_LINEAR_ATTENTION, /* a gated delta-net layer */
    CKPTFS_NEED_VISION_QKV_BIAS,  /* a vision tower whose config gives its qkv a bias (GLM-4.1V's
                                     attention_bias) */
} CkptfsNeed;

/* Where an entry is in a legacy state dict: the first pipeline stage, each layer, the last;
 * a multi-token prediction layer's own entries before its transformer layer and after it. */
typedef enum {
    CKPTFS_SCOPE_FIRST,
    CKPTFS_SCOPE_LAYER,
    CKPTFS_SCOPE_LAST,
    CKPTFS_SCOPE_MTP_IN,
    CKPTFS_SCOPE_MTP_OUT,
    /* a list of modules numbered apart from the layers, after them (Qwen3-VL's deepstack
     * mergers): CkptfsModel.list_modules of them, legacy names after the architecture's
     * list_prefix and "K.", one key stacked over the list in torch_dist, HF names after its
     * list_hf_prefix */
    CKPTFS_SCOPE_LIST,
} CkptfsScope;

#define CKPTFS_ABSENT (-1) /* an order for a spec that has no such entry */

typedef struct {
    CkptfsScope scope;
    bool extra_state;       /* an `_extra_state` object, not a weight */
    /* One per routed expert: HF names hold "{e}" for the expert's index; torch_dist stacks the
     * experts in a second axis; legacy names are derived from NAME (mcore.h). */
    bool expert;
    const char *name;       /* torch_dist and TE-spec name; for layers after "decoder.layers.N." */
    const char *local_name; /* local-spec name in legacy files, when it differs (NULL: NAME) */
    /* torch_dist name when a local-spec model saved it, when it differs (Megatron's local spec
     * renames an MoE layer's pre_mlp_layernorm to TE's fused name; NULL: NAME) */
    const char *local_dist_name;
    int te_order, local_order; /* position in a legacy state dict (per scope), or CKPTFS_ABSENT */
    CkptfsNeed need;
    unsigned ndim;          /* of one layer's tensor: 1 or 2 (a patch embedding's kernel, stored
                               5-D, is a matrix of CKPTFS_DIM_PATCH columns); 3 for [rows, 1, cols]
                               (conv1d) */
    CkptfsDim rows, cols;
    CkptfsTpSplit split;
    CkptfsRecipe recipe;
    const char *hf[4];      /* Hugging Face names; for layers after "model.layers.N."; "{e}"
                               stands for the expert */
    const char *tied_hf;    /* NEED_OUTPUT: what tied embeddings copy */
    bool fp32;              /* kept in float32 whatever the weights are (the router's expert
                               bias, which Megatron keeps in fp32 for exact routing) */
    bool local_rows;        /* replicated in the TE spec (TELinear "duplicated") but a
                               column-parallel linear, split by rows, in the local spec (MLA's
                               down projections) */
    /* the entry's module in the state dict in place of the architecture's megatron_prefix, for a
     * module registered beside the family's own (Gemma 3's "vision_projection." beside
     * "vision_model."); NULL: the architecture's */
    const char *module;
} CkptfsRule;

typedef struct {
    const char *name; /* "llama": separate q/k/v and gate/up projections */
    const CkptfsRule *rules;
    unsigned n_rules;
    /* Where multi-token prediction layer J's Hugging Face tensors are: "model.mtp_layers." (then
     * "J."; MiMo), its layer's under the decoder layers' names, no copies of the embedding and
     * head. NULL: DeepSeek's form, the layers after the decoder's ("model.layers.{layers + J}."),
     * with copies of the embedding and head (embed_tokens, shared_head.head). */
    const char *mtp_hf_prefix;
    /* Where the MTP block's own tensors (its norms, projection and final norm) are when the release
     * keeps one set for the whole block ("mtp.": Qwen3-Next's fc, pre_fc_norm_*, norm) rather than
     * one a layer; NULL: under MTP_HF_PREFIX and the layer's number. Megatron has one set a layer,
     * so such a block is served with one layer only. */
    const char *mtp_hf_block_prefix;
} CkptfsFamily;

/* The families ckptfs knows. */
extern const CkptfsFamily ckptfs_family_llama;    /* Llama, Mistral, Qwen2, Qwen3 */
extern const CkptfsFamily ckptfs_family_phi3;     /* Phi-3: fused qkv_proj and gate_up_proj */
extern const CkptfsFamily ckptfs_family_mixtral;  /* Mixtral: block_sparse_moe, w1/w3/w2 */
extern const CkptfsFamily ckptfs_family_qwen_moe; /* Qwen2-MoE, Qwen3-MoE: mlp.experts, shared expert */
extern const CkptfsFamily ckptfs_family_deepseek; /* DeepSeek-V2/V3: MLA, dense-first layers, shared
                                                     experts, expert bias */
extern const CkptfsFamily ckptfs_family_glm4_moe; /* GLM-4.5/4.6: Qwen attention, DeepSeek-V3 MoE and MTP */
extern const CkptfsFamily ckptfs_family_mimo;     /* MiMo: Qwen2 with MTP layers of their own names */
/* Qwen2.5-VL's vision tower and patch merger as mbridge's vision_model (its blocks the layers) */
extern const CkptfsFamily ckptfs_family_qwen2_5_vl_vision;
/* Qwen3-VL's: LayerNorms, a learned position embedding, deepstack mergers (a module list) */
extern const CkptfsFamily ckptfs_family_qwen3_vl_vision;
extern const CkptfsFamily ckptfs_family_gpt_oss;  /* GPT-OSS: attention sinks, biases on every linear,
                                                     every layer MoE with fused experts */
extern const CkptfsFamily ckptfs_family_qwen3_next; /* Qwen3-Next: gated delta-net and gated
                                                       attention layers, MoE with a gated
                                                       shared expert */
extern const CkptfsFamily ckptfs_family_qwen3_5;  /* Qwen3.5's text model: the same layers, the
                                                     delta-net's input projections split, a
                                                     dense MLP */
extern const CkptfsFamily ckptfs_family_gemma3;   /* Gemma 3's text model: q/k norms, a norm after
                                                    attention and after the MLP (Megatron-Bridge's
                                                    post_layernorm of linear_proj and linear_fc2) */
/* Qwen3.5's tower as transformers' module (mbridge's qwen3_5 bridge): its names, whole on every rank */
extern const CkptfsFamily ckptfs_family_qwen3_5_vision;
extern const CkptfsFamily ckptfs_family_glm4v_vision;
/* Qwen2.5-VL's tower as Megatron-Bridge keeps it: transformers' module, whole, under visual. */
extern const CkptfsFamily ckptfs_family_qwen2_5_vl_hf_vision;
/* Gemma 3's SigLIP tower as Megatron-Bridge keeps it (transformers' module under vision_tower.) and
 * its projector (multi_modal_projector.) */
extern const CkptfsFamily ckptfs_family_siglip_hf_vision;
extern const CkptfsFamily ckptfs_family_qwen3_5_moe; /* Qwen3.5's MoE text model: the same layers,
                                                        Qwen3-Next's experts */

/* Gemma 3's language model in mbridge's gemma3 VLM: the gemma3 rules with the two post-norms as
 * TENorms of the layer (post_attention_layernorm, post_feedforward_layernorm) and a core attention
 * without Transformer Engine state */
extern const CkptfsFamily ckptfs_family_gemma3_vlm;
/* Gemma 3's SigLIP tower (Megatron-core's CLIPViTModel, model_subtype "siglip") and its
 * projector (mbridge's vision_projection) */
extern const CkptfsFamily ckptfs_family_siglip_vision;

extern const CkptfsFamily ckptfs_family_glm4;     /* GLM-4's language model (GLM-4.1V's): Qwen2's
                                                    attention, gate_up_proj fused, a norm after the
                                                    attention and after the MLP */

/* Whether FAMILY has rules of NEED (multi-token prediction layers: CKPTFS_NEED_MTP). */
bool ckptfs_family_has(const CkptfsFamily *family, CkptfsNeed need);

/* Whether HF_NAME is a tensor some family keeps in float32 whatever the weights' type (the
 * DeepSeek router's e_score_correction_bias): -o dtype=bf16 leaves it as it is stored. */
bool ckptfs_tensor_keeps_fp32(const char *hf_name);

/* How RULE is split over tensor parallelism in a legacy file of SPEC. */
CkptfsTpSplit ckptfs_rule_split(const CkptfsRule *rule, bool te_spec);

#endif
