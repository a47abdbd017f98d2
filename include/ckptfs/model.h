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

/* Where a mixture-of-experts architecture keeps its sizes in config.json. */
typedef struct {
    const char *experts_key;    /* "num_local_experts" (Mixtral), "num_experts" (Qwen) */
    const char *ffn_key;        /* one expert's intermediate size */
    const char *shared_ffn_key; /* the shared expert's (NULL: none) */
    /* DeepSeek: the shared experts' count (n_shared_experts), each one expert's size */
    const char *shared_count_key;
    bool shared_gate;           /* the shared expert's output is gated */
    bool dense_layers;          /* decoder_sparse_step and mlp_only_layers apply */
    bool always_renormalize;    /* top-k weights always sum to 1 (no norm_topk_prob field) */
    /* every layer MoE and no intermediate_size in its config class: the dense ffn size is the
     * expert's when config.json leaves it out (CKPTFS_FIELD_EXPERT_FFN_FALLBACK) */
    bool ffn_from_expert;
    /* DeepSeek: first_k_dense_replace and moe_layer_freq say which layers are MoE; scoring_func,
     * topk_method, n_group, topk_group and routed_scaling_factor the routing */
    bool deepseek_config;
    /* DeepSeek-V3: sigmoid scores with a per-expert bias (noaux_tc), group-limited top-k;
     * otherwise softmax scores */
    bool sigmoid_routing;
    /* The fused forms (fused.h) its Hugging Face checkpoints may hold the experts in, NULL-
     * terminated; NULL: per expert only */
    const struct CkptfsFusedExperts *const *fused_forms;
    /* The form its Hugging Face class reads its experts in and nothing else (GPT-OSS), or its
     * releases' (Qwen3-VL-MoE): hf/ of a source held per expert (a Megatron one) serves them fused
     * so; NULL: per expert */
    const struct CkptfsFusedExperts *hf_form;
    /* Its transformers class holds the experts fused and save_pretrained writes them one by one
     * (GLM-4.5V): a source keyed by the names held in memory (verl's FSDP shards) serves them as
     * saved; NULL: saved as held */
    const struct CkptfsSavedExperts *saved_per_expert;
} CkptfsMoeConfig;

typedef struct CkptfsArchitecture {
    const char *hf_architecture; /* "LlamaForCausalLM" */
    const char *model_type;      /* "llama" */
    bool qkv_bias;               /* q/k/v projections always carry a bias (Qwen2) */
    bool qk_norm;                /* per-head RMSNorm on q and k (Qwen3) */
    const CkptfsFamily *family;  /* the Megatron mapping of its tensors */
    const CkptfsMoeConfig *moe;  /* NULL: a dense architecture */
    bool mla;                    /* multi-head latent attention (DeepSeek-V2/V3) */
    /* transformers' defaults where a config.json leaves them out and the architecture's differ
     * from the schema's (0: the schema's) */
    double rope_theta, norm_eps;
    /* transformers' sliding attention window where config.json has no sliding_window (Mistral:
     * 4096; 0: none), and whether it applies only when use_sliding_window says so (Qwen: off
     * unless it does) */
    uint64_t sliding_window;
    bool window_opt_in;
    /* transformers' num_key_value_heads and head_dim where config.json leaves them out (0: the
     * attention heads, hidden_size / num_attention_heads) */
    uint64_t kv_heads, head_dim;
    /* config.json's flag for per-head q/k norms where the architecture makes them optional
     * (GLM-4.5's use_qk_norm; NULL: qk_norm alone decides) */
    const char *qk_norm_key;
    /* transformers' partial_rotary_factor where config.json leaves it out, for an architecture
     * whose transformers class honours the field (GLM-4.5: 0.5); 0: it does not, only full
     * rotary is served */
    double partial_rotary;
    /* transformers' max_position_embeddings where config.json leaves it out (0: the schema's) */
    uint64_t max_positions;
    /* config.json's attention_bias also puts a bias on o_proj (Llama, Qwen3): Megatron has that one
     * only with add_bias_linear, on every linear layer, so such a model has no Megatron equivalent */
    bool attention_bias_on_output;
    /* A vision-language model: config.json's object of the language model's fields
     * ("text_config", read with the top level's: ckptfs_schema_text_config) and of the vision
     * tower's ("vision_config"); NULL: a text model */
    const char *text_part, *vision_part;
    /* the vision tower and its merger as an architecture of their own, whose family holds their
     * Megatron rules (NULL: none yet, so hf/ only, and the mount says so by name) */
    const struct CkptfsArchitecture *vision;
    /* the schema rows of its vision part: a CkptfsFieldScope (0: CKPTFS_FOR_VISION, Qwen2.5-VL's
     * fields and defaults; towers whose configs differ name rows of their own) */
    int vision_fields;
    /* its module's prefix in a Megatron state dict (mbridge's VLMs: "language_model.",
     * "vision_model."; NULL: none), and where its layers' Hugging Face tensors are (NULL:
     * "model.layers."; a vision tower's blocks: "visual.blocks.") */
    const char *megatron_prefix, *hf_layer_prefix;
    /* a multimodal rope that hands its sections out interleaved (Qwen3-VL: transformers' and
     * mbridge's models always do; config.json's mrope_interleaved, when given, must say so) */
    bool mrope_interleaved;
    /* its family's module list (CKPTFS_SCOPE_LIST): the list's Megatron name
     * ("decoder.deepstack_merger_list.") and Hugging Face one; NULL: no such list */
    const char *list_prefix, *list_hf_prefix;
    /* its layers' module in Megatron's names, a vision tower kept as transformers' own module
     * ("blocks.": mbridge's Qwen3.5 tower); each layer's tensors are then keys of their own in
     * torch_dist, as Megatron's sharded_state_dict_default names a plain module's. NULL:
     * "decoder.layers.", stacked where the layers are alike */
    const char *layer_prefix;
    /* Pairs of Hugging Face name prefixes, NULL-terminated: a later transformers' module names
     * and the release's, which the rules use (Qwen2.5-VL's "model.language_model." and "model.",
     * "model.visual." and "visual."); NULL: one naming */
    const char *const *module_names;
    /* Pairs of name prefixes, NULL-terminated: the names the model holds in memory (its
     * state_dict, which verl's FSDP shards are keyed by) and the ones transformers'
     * save_pretrained writes, where they differ (Qwen2.5-VL: the release's, model. and visual.);
     * NULL: it saves the names it holds */
    const char *const *saved_names;
    /* its releases save the tensors under the first names of those pairs (Qwen3-VL's): hf/ of a
     * source made from the rules (a Megatron one) serves them so */
    bool released_under_module_names;
    /* its releases write the language model's fields under text_part alone (Qwen3-VL's
     * text_config, which its transformers class reads nothing of at the top level); else at the
     * top level (Qwen2.5-VL's release) */
    bool released_text_part;
    /* mbridge registers the language model before the tower (Gemma 3's VLM): a legacy state dict
     * and mcore/ hold language_model.* first */
    bool language_first;
    /* mbridge's bridge builds no virtual pipeline stages (its gemma3 provider asserts
     * vp_stage is None): layouts with vpp are refused */
    bool no_virtual_pipeline;
    /* a VLM whose language model rotates by the text position alone (Gemma 3: mbridge builds it
     * with position_embedding_type "rope"), no multimodal rope to read */
    bool text_rope;
    /* transformers rotates interleaved pairs of each head's rotary dims (GLM-4.1V's
     * rotate_half_llm), its mrope sections taken by frequency: Megatron-core 0.17.1's mrope pairs
     * halves (rotary_interleaved false, what mbridge builds) or takes the sections over the
     * interleaved dims (true), so no args give transformers' attention on an image's tokens */
    bool rotates_interleaved_pairs;
    /* GPT-OSS's attention and MLP, fixed by its transformers class rather than config.json:
     * a bias on every linear layer (Megatron's add_bias_linear: o_proj, the router, the
     * experts; attention_bias false is refused), one learned attention sink per head (Megatron's
     * softmax_type "learnable"), a sliding window on all layers but every WINDOW_SKIP_FREQ-th
     * (layer_types; 0: no window), the GLU of clamped quick-GELU with 1 added to the linear half
     * (Megatron's quick_geglu, activation_func_clamp_value GLU_CLAMP, glu_linear_offset 1; 0:
     * SwiGLU), YaRN rope for q/k/v attention (Megatron's position_embedding_type "yarn") */
    bool linear_biases, attention_sinks;
    uint64_t window_skip_freq;
    double glu_clamp;
    bool yarn;
    /* Hybrid layers (Qwen3-Next): gated delta-net layers among attention layers, as config.json's
     * layer_types or full_attention_interval says; their sizes are the schema's linear_* rows */
    bool hybrid_attention;
    /* q_proj holds an output gate per head after its query (Megatron's attention_output_gate) */
    bool attention_gate;
    /* RMSNorms scale by 1 + weight (Megatron's apply_layernorm_1p) */
    bool zero_centred_norms;
    /* the vision part's list of block numbers the architecture's walk reads (NULL: none) */
    const struct CkptfsVisionBlocks *vision_blocks;
    /* The gated MLP's activation as config.json names it (NULL: silu, SwiGLU; Gemma 3:
     * "gelu_pytorch_tanh", Megatron's GLU with the tanh GELU, openai_gelu) */
    const char *activation;
    /* Gemma's embedding output times sqrt(hidden_size) (mbridge's and Megatron-Bridge's Gemma
     * embedding scales it; the weights are the same) */
    bool scaled_embedding;
    /* Gemma's attention: the sliding layers rotate with a base of their own
     * (rope_local_base_freq), scores scaled by query_pre_attn_scalar^-0.5; soft-capping of the
     * scores or logits and bidirectional attention have no Megatron equivalent (the schema's
     * CKPTFS_FOR_GEMMA_ATTENTION rows) */
    bool gemma_attention;
    /* transformers ties the embeddings when config.json leaves tie_word_embeddings out (Gemma 3's
     * 1B release does) */
    bool tied_by_default;
    /* q/k/v biases unless config.json says attention_bias false (Glm4vMoeTextConfig's default) */
    bool biased_by_default;
    /* Megatron builds it with Transformer Engine only (Megatron-Bridge's Gemma 3 spec puts the
     * post-norms inside TE's linear layers): spec=local is refused */
    bool te_spec_only;
    /* The same model as Megatron-Bridge's bridge builds it, for -o megatron_names=bridge: a row
     * of its own where its module tree differs from mbridge's (Qwen2.5-VL's tower as
     * transformers' module under visual.), the row itself where the trees are the same
     * (Qwen3-VL's); NULL: the option is refused, naming BRIDGE_NAMES_NOTE (the reason) */
    const struct CkptfsArchitecture *megatron_bridge;
    const char *bridge_names_note;
} CkptfsArchitecture;

/* A list of vision blocks in a VLM's vision part: Qwen2.5-VL's fullatt_block_indexes (the blocks
 * with full attention), Qwen3-VL's deepstack_visual_indexes (the blocks whose output a deepstack
 * merger hands to the language model). */
typedef struct CkptfsVisionBlocks {
    const char *member;            /* "fullatt_block_indexes" */
    size_t offset;                 /* of its bit set of blocks in CkptfsModel */
    uint64_t defaults[8];          /* transformers' default list */
    unsigned n_defaults;
    bool ascending;                /* entries must rise and exist, also by default (their order
                                      numbers the deepstack mergers, one per entry) */
} CkptfsVisionBlocks;

/* How rotary embeddings are scaled: what Megatron has (Llama 3's scaling for multi-head
 * attention, YaRN for multi-head latent attention, Gemma 3's linear scaling of its
 * full-attention layers' rope). */
typedef enum {
    CKPTFS_ROPE_DEFAULT,
    CKPTFS_ROPE_LLAMA3,
    CKPTFS_ROPE_YARN,
    CKPTFS_ROPE_LINEAR,
} CkptfsRopeType;

/* Most ids one token-id field of config.json may list (Llama 3.1's eos_token_id lists 3). */
#define CKPTFS_MAX_TOKEN_IDS 16u

/* How config.json gives a token id (bos_token_id, eos_token_id, pad_token_id): they are the
 * tokenizer's, not the model's math, and are kept as given. Absent: transformers takes the
 * architecture's default (Phi-3's pad_token_id is 32000). */
typedef enum {
    CKPTFS_TOKEN_ABSENT,
    CKPTFS_TOKEN_NULL,
    CKPTFS_TOKEN_ONE,
    CKPTFS_TOKEN_LIST,
} CkptfsTokenForm;

typedef struct {
    CkptfsTokenForm form;
    uint8_t count; /* ids in IDS: 1 for ONE, 0 or more for LIST */
    int64_t ids[CKPTFS_MAX_TOKEN_IDS];
} CkptfsTokenIds;

/* Most routed experts a model may have (DeepSeek-V3 and Kimi K2: 256 and 384). */
#define CKPTFS_MAX_EXPERTS 4096u
/* Most blocks a vision tower may have (Qwen2.5-VL's have 32). */
#define CKPTFS_MAX_VISION_DEPTH 256u
/* Most layers a model may have (for the dense-layer bitmap; the source-tensor cap allows
 * fewer still). */
#define CKPTFS_MAX_LAYERS 32768u

typedef struct {
    const CkptfsArchitecture *arch;
    uint64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
    uint64_t max_positions;
    bool tied_embeddings;
    bool qkv_bias;
    bool linear_bias; /* biases of the other linears (mlp_bias): none, the one form served */
    bool qk_norm;
    double rope_theta;
    double norm_eps;
    double rotary_percent; /* of each head's width (partial rotary): 1 */
    CkptfsRopeType rope_type;
    /* Llama 3.x rope scaling ("rope_type": "llama3"); factor 0 when absent. The other three
     * are what Megatron-core fixes (1, 4, 8192). */
    double rope_scaling_factor, rope_low_freq, rope_high_freq;
    uint64_t rope_original_positions;
    CkptfsDtype dtype; /* of the weights (all the same) */
    CkptfsDtype fp32_dtype; /* of the tensors Megatron keeps in fp32 (expert bias): F32 unless
                               a source stored them otherwise; all the same */
    /* Mixture of experts: 0 experts for a dense model. */
    uint64_t experts, topk, moe_ffn, shared_ffn;
    bool shared_gate;
    bool renormalize; /* top-k routing weights renormalised (norm_topk_prob); Megatron's
                         moe_router_pre_softmax is its negation */
    uint8_t dense_layer[CKPTFS_MAX_LAYERS / 8]; /* of an MoE model: layers with a dense MLP */
    /* Routing beyond softmax top-k (DeepSeek): sigmoid scores, a per-expert bias added for the
     * choice only, top-k within the GROUP_TOPK best of GROUPS expert groups (0: no groups),
     * weights scaled by TOPK_SCALING (0: not scaled). */
    bool sigmoid_scores, expert_bias;
    uint64_t groups, group_topk;
    double topk_scaling;
    /* Multi-head latent attention: compressed query (0: a plain q_proj) and key/value widths,
     * per-head widths of the non-rotary and rotary query/key parts and of the value. */
    bool mla;
    uint64_t q_lora, kv_lora, qk_head_dim, qk_rope_dim, v_head_dim;
    /* YaRN rope scaling (DeepSeek-V3): factor 0 when absent */
    double yarn_factor, yarn_mscale, yarn_mscale_all_dim, yarn_beta_fast, yarn_beta_slow;
    uint64_t yarn_original_positions;
    /* YaRN's correction range rounded to whole dimensions (transformers' truncate, Megatron's
     * yarn_correction_range_round_to_int): true unless config.json says false (GPT-OSS) */
    bool yarn_truncate;
    /* GPT-OSS (CkptfsArchitecture): attention sinks; a sliding WINDOW of keys (0: none) on all
     * layers but every WINDOW_SKIP_FREQ-th; the clamped quick-GELU GLU's clamp (0: SwiGLU) */
    bool sinks;
    uint64_t window, window_skip_freq;
    double glu_clamp;
    /* Multi-token prediction layers after the decoder's (num_nextn_predict_layers), and whether
     * the Megatron views serve them (-o mtp=on) */
    uint64_t mtp_layers;
    bool mtp;
    /* Gated delta-net layers (hybrid architectures): their key and value heads and widths, the
     * convolution's kernel, and which layers they are (set: linear attention) */
    bool linear_attention; /* it has some (a hybrid's config, Megatron's gated_delta_net variant) */
    uint64_t linear_key_heads, linear_value_heads, linear_key_dim, linear_value_dim, conv_kernel;
    uint8_t linear_layer[CKPTFS_MAX_LAYERS / 8];
    /* The tokenizer's ids as a config.json gave them (or the Megatron views' args carried them:
     * TOKEN_IDS_KNOWN); unknown ones (a Megatron checkpoint's own args) are written null. */
    bool token_ids_known;
    CkptfsTokenIds bos_token, eos_token, pad_token;
    /* A vision-language model's vision tower (vision_config): its blocks, width, heads, MLP
     * width; the merger's output width (the language model's hidden size); the patch (pixels a
     * side, frames), the side of the square of patches the merger joins, the attention window
     * (pixels a side), the image's channels, video positions per second (mrope) */
    uint64_t vision_depth, vision_hidden, vision_heads, vision_ffn, vision_out_hidden;
    uint64_t vision_patch, vision_temporal_patch, vision_merge, vision_window, vision_channels;
    double vision_tokens_per_second;
    /* GLM-4.1V's tower: the image side its learned position embedding covers (image_size: its
     * rows are (image_size / patch_size)^2), its norms' epsilon, a bias on the fused qkv */
    uint64_t vision_image_size;
    double vision_norm_eps;
    bool vision_qkv_bias;
    /* the tokens that place an image or video in the text (top-level image_token_id, ...) */
    uint64_t image_token, video_token, vision_start_token, vision_end_token;
    uint64_t video_start_token, video_end_token; /* GLM-4.1V's and GLM-4.5V's: a video's own */
    /* the blocks with full attention (fullatt_block_indexes); the others attend within windows */
    uint8_t vision_full_attention[CKPTFS_MAX_VISION_DEPTH / 8];
    /* Qwen3-VL's tower: its learned position embedding's rows (num_position_embeddings), and the
     * blocks whose outputs deepstack mergers hand to the language model's first layers
     * (deepstack_visual_indexes), and how many */
    uint64_t vision_positions;
    uint8_t vision_deepstack[CKPTFS_MAX_VISION_DEPTH / 8];
    uint64_t vision_deepstack_count;
    /* Gemma 3's SigLIP tower: the tokens an image is pooled to (mm_tokens_per_image, a square of
     * a side that divides the image's patches a side), and whether the tower has SigLIP's
     * attention-pooling head (vision_use_head; its tensors are saved, Gemma 3 does not use it) */
    uint64_t vision_image_tokens;
    bool vision_head;
    /* the modules of the family's numbered list (CKPTFS_SCOPE_LIST): a vision tower's deepstack
     * mergers */
    uint64_t list_modules;
    /* Multimodal rotary embedding (Qwen2-VL's mrope_section: the rotary frequencies given to the
     * temporal, height and width positions; all 0: plain rope) */
    uint64_t mrope_section[3];
    /* Gemma's attention (CkptfsArchitecture.gemma_attention): the sliding layers' rope base, the
     * query scalar (scores times its inverse square root); soft-caps and bidirectional attention
     * read only to be refused (0, false: none) */
    double rope_local_theta, query_pre_attn_scalar, attn_softcap, final_softcap;
    bool bidirectional_attention;
    /* Gemma 3's rope: the full-attention layers' linear factor (positions divided by it; 1:
     * none), and the sliding layers' type, which Megatron's Gemma 3 never scales */
    double rope_linear_factor;
    CkptfsRopeType rope_local_type;
} CkptfsModel;

/* The table of known architectures, NULL-terminated. */
const CkptfsArchitecture *const *ckptfs_architectures(void);

/* The architecture named NAME (a model_type such as "qwen2", or an HF class name), or when NAME
 * is NULL the first whose built-in features are FEATURES' (a Megatron checkpoint says only
 * which features it has): Llama for none, Qwen2 for q/k/v biases, Qwen3 for q/k norms,
 * Mixtral for experts, Qwen2-MoE for experts with a shared expert, Qwen3-MoE for experts with
 * q/k norms. NULL when none matches. */
const CkptfsArchitecture *ckptfs_architecture_find(const char *name, const CkptfsModel *features);

/* Whether layer L of MODEL is a mixture-of-experts layer. */
bool ckptfs_model_layer_is_moe(const CkptfsModel *model, uint64_t layer);
/* Marks layer L dense (an MoE model's dense-MLP layer). */
void ckptfs_model_set_dense_layer(CkptfsModel *model, uint64_t layer);
/* Whether every layer is of one kind (torch_dist then stacks layers in one key per weight). */
bool ckptfs_model_layers_homogeneous(const CkptfsModel *model);
/* Number of MoE layers. */
uint64_t ckptfs_model_moe_layers(const CkptfsModel *model);
/* Whether layer L of MODEL is a gated delta-net (linear attention) layer; the number of them. */
bool ckptfs_model_layer_is_linear(const CkptfsModel *model, uint64_t layer);
/* Marks layer L a gated delta-net layer. */
void ckptfs_model_set_linear_layer(CkptfsModel *model, uint64_t layer);
uint64_t ckptfs_model_linear_layers(const CkptfsModel *model);
/* Reads a hybrid architecture's layer kinds from CONFIG: layer_types ("linear_attention",
 * "full_attention"), else every full_attention_interval-th layer full (transformers' default
 * 4); a list whose length is not num_hidden_layers, an unknown kind, or an interval that does
 * not agree with layer_types is refused by name. */
bool ckptfs_model_read_layer_kinds(JsonObject *config, CkptfsModel *model, GError **error);

/* Reads CONFIG (config.json) and checks every tensor the rules need exists in CATALOG with the
 * expected shape and one common dtype. Errors name config.json or the tensor and the problem.
 * With UNUSED, *UNUSED gets the names of CATALOG's tensors no Megatron view reads, less those
 * left out on purpose (a tied lm_head, rotary inv_freq buffers, MTP layers, which -o mtp
 * serves): weights config.json does not describe, such as an expert or a layer past its
 * counts. */
bool ckptfs_model_from_config(JsonObject *config, const CkptfsCatalog *catalog, CkptfsModel *model,
                              GPtrArray **unused, GError **error);

/* MODEL's description from CONFIG (MODEL's arch set, or NULL: a dense model by its defaults):
 * the schema's fields (ckptfs/schema.h), then the experts' structure; no tensor is checked. */
bool ckptfs_model_read_config(JsonObject *config, CkptfsModel *model, GError **error);

/* The schema's fields of CONFIG alone (sizes, the expert count), without the checks the
 * Megatron views need of them (ckptfs_model_read_config's): what reading the tensors under the
 * names a Hugging Face save writes takes. */
bool ckptfs_model_read_sizes(JsonObject *config, CkptfsModel *model, GError **error);

/* The experts' structure of MODEL (its arch an MoE architecture, its sizes read): the shared
 * expert, routing, dense layers. Configs of routing schemes ckptfs has no rules for are
 * refused. */
bool ckptfs_model_read_moe(JsonObject *config, CkptfsModel *model, GError **error);

/* Serves MODEL's multi-token prediction layers in the Megatron views (-o mtp=on): checks that
 * it has some and that CATALOG holds their tensors. */
bool ckptfs_model_serve_mtp(CkptfsModel *model, const CkptfsCatalog *catalog, GError **error);

/* Names MODEL's Megatron views as Megatron-Bridge's bridge does (-o megatron_names=bridge): its
 * architecture's megatron_bridge row, whose tensors CATALOG must hold; refused by name where the
 * architecture has none. */
bool ckptfs_model_use_bridge_names(CkptfsModel *model, const CkptfsCatalog *catalog, GError **error);

/* Whether MODEL's sizes, which a source gives (config.json, Megatron args), are within what
 * ckptfs serves: each dimension at most CKPTFS_MAX_MODEL_DIM (the vocabulary CKPTFS_MAX_VOCAB),
 * so that no product of them the mapping rules form can wrap, and few enough layers for
 * CKPTFS_MAX_SOURCE_TENSORS. Errors start with WHAT. */
bool ckptfs_model_check_limits(const CkptfsModel *model, const char *what, GError **error);

/* The vision tower of vision-language model VLM as a model of its own (its architecture the
 * tower's, its blocks the layers, its width, heads and MLP the model's), into TOWER. */
void ckptfs_model_vision_tower(const CkptfsModel *vlm, CkptfsModel *tower);
/* The shape of a convolution's kernel of ROWS output channels whose columns are COLS (a rule's
 * dim), which keeps its dims in every format, into SHAPE; returns their number, 0 when COLS is no
 * kernel's. A patch embedding (CKPTFS_DIM_PATCH): a Conv3d's 5, [ROWS, channels, frames, patch,
 * patch], or a Conv2d's 4 for a tower without frames (SigLIP's: [ROWS, channels, patch, patch]);
 * a merging Conv2d (CKPTFS_DIM_MERGE_KERNEL): [ROWS, hidden, merge, merge]. */
unsigned ckptfs_model_kernel_shape(const CkptfsModel *model, CkptfsDim cols, uint64_t rows, uint64_t *shape);

/* A vision-language model's vision part of CONFIG (config.json, or what a Megatron source's args
 * carry) into MODEL, whose arch is set: the schema's vision rows, the full-attention blocks, and
 * the tower's rules; refused by name when a field is unknown or there are no rules. */
bool ckptfs_model_read_vision(JsonObject *config, CkptfsModel *model, GError **error);
/* MODEL's vision part into CONFIG as the release writes it: what ckptfs_model_read_vision reads. */
void ckptfs_model_write_vision(const CkptfsModel *model, JsonObject *config);
/* Whether TP splits MODEL's vision tower as mbridge splits it (its heads, MLP and merger); true
 * for a text model. */
bool ckptfs_model_check_vision_split(const CkptfsModel *model, unsigned tp, GError **error);

/* The rotated dims of each head (head_dim x rotary_percent, as Megatron-core's rotary embedding
 * counts them), whose frequencies a multimodal rope's sections share out: their sum is half. */
uint64_t ckptfs_model_rotated_dim(const CkptfsModel *model);

/* HF tensor names of layer I (NULL-safe helpers for the views). */
#define CKPTFS_HF_LAYER_PREFIX "model.layers."
char *ckptfs_hf_layer_name(uint64_t layer, const char *suffix);

/* How many layers M's Hugging Face tensors hold as the Megatron views read them: the decoder's,
 * then the multi-token prediction layers when served (M->mtp). */
uint64_t ckptfs_model_hf_layers(const CkptfsModel *m);

/* Where multi-token prediction layer 0's Hugging Face tensors are: the prefix, and that layer's
 * number after it in FIRST (the next MTP layers number on). Under the family's MTP_PREFIX
 * (CkptfsFamily.mtp_hf_prefix) from 0; with none (DeepSeek's form) after the decoder's LAYERS
 * layers, under DECODER_PREFIX. One rule for the names the views read, the tensors a model's
 * check sets aside and what inspect prints, so that they cannot disagree. */
const char *ckptfs_mtp_hf_prefix(const char *mtp_prefix, const char *decoder_prefix, uint64_t layers,
                                 uint64_t *first);

/* The HF name of SUFFIX in layer LAYER of M: a decoder layer's ("model.layers.3.SUFFIX"), or,
 * from M's layer count on, multi-token prediction layer LAYER - layers under the family's MTP
 * prefix ("mtp.layers.0.SUFFIX") or after the decoder's (DeepSeek's). */
char *ckptfs_model_hf_layer_name(const CkptfsModel *m, uint64_t layer, const char *suffix);

#endif
