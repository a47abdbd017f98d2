#include "ckptfs/schema.h"

#include <math.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"

#define M(member) offsetof(CkptfsModel, member)
#define DIM ((double)CKPTFS_MAX_MODEL_DIM)

/* Rows in the order they are read: the rope type before the fields of its scaling, sizes
 * before what is derived from them. */
static const CkptfsModelField fields[] = {
    {"layers", CKPTFS_FIELD_UINT, M(layers), CKPTFS_FOR_ALL, {"num_hidden_layers"}, 0, "num_layers", NULL,
     CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, CKPTFS_MAX_LAYERS, {NULL}},
    {"hidden", CKPTFS_FIELD_UINT, M(hidden), CKPTFS_FOR_ALL, {"hidden_size"}, 0, "hidden_size", NULL,
     CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    {"heads", CKPTFS_FIELD_UINT, M(heads), CKPTFS_FOR_ALL, {"num_attention_heads"}, 0, "num_attention_heads", NULL,
     CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    {"kv_heads", CKPTFS_FIELD_UINT, M(kv_heads), CKPTFS_FOR_ALL, {"num_key_value_heads"}, 0, "num_query_groups", NULL,
     CKPTFS_FIELD_MATH, 0, 0, CKPTFS_DERIVED_HEADS, 0, DIM, {NULL}},
    {"ffn", CKPTFS_FIELD_UINT, M(ffn), CKPTFS_FOR_ALL, {"intermediate_size"}, 0, "ffn_hidden_size", NULL,
     CKPTFS_FIELD_REQUIRED | CKPTFS_FIELD_EXPERT_FFN_FALLBACK, 0, 0, 0, 0, DIM, {NULL}},
    {"vocab", CKPTFS_FIELD_UINT, M(vocab), CKPTFS_FOR_ALL, {"vocab_size"}, 0, "vocab_size", NULL,
     CKPTFS_FIELD_REQUIRED | CKPTFS_FIELD_ARGS_OPTIONAL, 0, 0, 0, 0, CKPTFS_MAX_VOCAB, {NULL}},
    {"max_positions", CKPTFS_FIELD_UINT, M(max_positions), CKPTFS_FOR_ALL, {"max_position_embeddings"}, 0,
     "max_position_embeddings", NULL, 0, 4096, 4096, CKPTFS_DERIVED_MAX_POSITIONS, 0, (double)UINT32_MAX, {NULL}},
    {"mla", CKPTFS_FIELD_BOOL, M(mla), CKPTFS_FOR_ALL, {NULL}, 0, "multi_latent_attention", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARCH_HAS_IT, 0, 0, 0, 0, 0, {NULL}},
    /* multi-head latent attention's sizes (DeepSeek-V2/V3); q_lora_rank null: a plain q_proj */
    {"q_lora", CKPTFS_FIELD_COUNT, M(q_lora), CKPTFS_FOR_MLA, {"q_lora_rank"}, 0, "q_lora_rank", NULL,
     CKPTFS_FIELD_NULL_WHEN_ZERO, 0, 0, 0, 0, DIM, {NULL}},
    {"kv_lora", CKPTFS_FIELD_UINT, M(kv_lora), CKPTFS_FOR_MLA, {"kv_lora_rank"}, 0, "kv_lora_rank", NULL,
     CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    {"qk_head_dim", CKPTFS_FIELD_UINT, M(qk_head_dim), CKPTFS_FOR_MLA, {"qk_nope_head_dim"}, 0, "qk_head_dim",
     NULL, CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    {"qk_rope_dim", CKPTFS_FIELD_UINT, M(qk_rope_dim), CKPTFS_FOR_MLA, {"qk_rope_head_dim"}, 0,
     "qk_pos_emb_head_dim", NULL, CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    {"v_head_dim", CKPTFS_FIELD_UINT, M(v_head_dim), CKPTFS_FOR_MLA, {"v_head_dim"}, 0, "v_head_dim", NULL,
     CKPTFS_FIELD_REQUIRED, 0, 0, 0, 0, DIM, {NULL}},
    /* transformers 5 writes head_dim null for "hidden_size / num_attention_heads" */
    {"head_dim", CKPTFS_FIELD_UINT, M(head_dim), CKPTFS_FOR_MHA, {"head_dim"}, 0, "kv_channels", NULL,
     CKPTFS_FIELD_MATH, 0, 0, CKPTFS_DERIVED_HEAD_DIM, 0, DIM, {NULL}},
    /* gated delta-net layers (Qwen3-Next): transformers' and Megatron-core 0.17.1's defaults */
    {"linear_key_heads", CKPTFS_FIELD_UINT, M(linear_key_heads), CKPTFS_FOR_LINEAR_ATTENTION,
     {"linear_num_key_heads"}, 0, "linear_num_key_heads", NULL, CKPTFS_FIELD_MATH, 16, 16, 0, 0, DIM, {NULL}},
    {"linear_value_heads", CKPTFS_FIELD_UINT, M(linear_value_heads), CKPTFS_FOR_LINEAR_ATTENTION,
     {"linear_num_value_heads"}, 0, "linear_num_value_heads", NULL, CKPTFS_FIELD_MATH, 32, 32, 0, 0, DIM, {NULL}},
    {"linear_key_dim", CKPTFS_FIELD_UINT, M(linear_key_dim), CKPTFS_FOR_LINEAR_ATTENTION,
     {"linear_key_head_dim"}, 0, "linear_key_head_dim", NULL, CKPTFS_FIELD_MATH, 128, 128, 0, 0, DIM, {NULL}},
    {"linear_value_dim", CKPTFS_FIELD_UINT, M(linear_value_dim), CKPTFS_FOR_LINEAR_ATTENTION,
     {"linear_value_head_dim"}, 0, "linear_value_head_dim", NULL, CKPTFS_FIELD_MATH, 128, 128, 0, 0, DIM, {NULL}},
    {"conv_kernel", CKPTFS_FIELD_UINT, M(conv_kernel), CKPTFS_FOR_LINEAR_ATTENTION,
     {"linear_conv_kernel_dim"}, 0, "linear_conv_kernel_dim", NULL, CKPTFS_FIELD_MATH, 4, 4, 0, 0, 1024, {NULL}},
    {"activation", CKPTFS_FIELD_ACTIVATION, 0, CKPTFS_FOR_ALL, {"hidden_act", "hidden_activation"}, 0, "swiglu",
     NULL, CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    /* Megatron's untie_embeddings_and_output_weights is False unless given (older runs lack it) */
    {"tied_embeddings", CKPTFS_FIELD_BOOL, M(tied_embeddings), CKPTFS_FOR_ALL, {"tie_word_embeddings"}, 0,
     "untie_embeddings_and_output_weights", NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARGS_NEGATED, 0, 1,
     CKPTFS_DERIVED_TIED, 0, 0, {NULL}},
    {"qkv_bias", CKPTFS_FIELD_BOOL, M(qkv_bias), CKPTFS_FOR_ALL, {"attention_bias"}, 0, "add_qkv_bias", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARCH_HAS_IT, 0, 0, CKPTFS_DERIVED_QKV_BIAS, 0, 0, {NULL}},
    /* GPT-OSS has them on every linear layer (its architecture's); the others none */
    {"linear_bias", CKPTFS_FIELD_BOOL, M(linear_bias), CKPTFS_FOR_ALL, {"mlp_bias"}, 0, "add_bias_linear", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED | CKPTFS_FIELD_ARCH_HAS_IT, 0, 0, 0, 0, 0, {NULL}},
    /* GPT-OSS's attention sinks, Megatron's learnable softmax offset (the architecture's) */
    {"sinks", CKPTFS_FIELD_BOOL, M(sinks), CKPTFS_FOR_ALL, {NULL}, 0, "softmax_type", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARCH_HAS_IT | CKPTFS_FIELD_ARGS_CHOICE, 0, 0, 0, 0, 0, {"vanilla", "learnable"}},
    /* GPT-OSS's clamped quick-GELU GLU (its class fixes it; 0: SwiGLU), None in args otherwise */
    {"glu_clamp", CKPTFS_FIELD_FLOAT, M(glu_clamp), CKPTFS_FOR_ALL, {NULL}, 0, "activation_func_clamp_value", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ZERO_AS_DEFAULT, 0, 0, CKPTFS_DERIVED_GLU_CLAMP, -1, 1e6, {NULL}},
    /* Qwen3's per-head norms come with the architecture; MLA's latent norms are Megatron's
     * q/k layernorms too */
    {"qk_norm", CKPTFS_FIELD_BOOL, M(qk_norm), CKPTFS_FOR_ALL, {NULL}, CKPTFS_ARCH_KEY_QK_NORM, "qk_layernorm", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARCH_HAS_IT, 0, 0, 0, 0, 0, {NULL}},
    {"norm_eps", CKPTFS_FIELD_FLOAT, M(norm_eps), CKPTFS_FOR_ALL, {"rms_norm_eps"}, 0, "layernorm_epsilon",
     "norm_epsilon", CKPTFS_FIELD_MATH, 1e-6, 1e-5, CKPTFS_DERIVED_NORM_EPS, 0, 1, {NULL}},
    {"rope_theta", CKPTFS_FIELD_FLOAT, M(rope_theta), CKPTFS_FOR_ALL,
     {"rope_theta", "rope_parameters.rope_theta", "rope_parameters.full_attention.rope_theta"}, 0, "rotary_base", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARGS_INTEGER, 10000, 10000, CKPTFS_DERIVED_ROPE_THETA, 0, 1e12, {NULL}},
    {"rotary_percent", CKPTFS_FIELD_FLOAT, M(rotary_percent), CKPTFS_FOR_ALL,
     {"partial_rotary_factor", "rope_parameters.partial_rotary_factor"}, 0, "rotary_percent", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 1, 1, CKPTFS_DERIVED_ROTARY_PERCENT, 0, 1, {NULL}},
    {"sliding_window", CKPTFS_FIELD_WINDOW, 0, CKPTFS_FOR_ALL, {"sliding_window"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    {"rope_type", CKPTFS_FIELD_ROPE_TYPE, M(rope_type), CKPTFS_FOR_PLAIN_ROPE,
     {"rope_scaling.rope_type", "rope_scaling.type", "rope_parameters.rope_type"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    /* Gemma 3: the release scales the full-attention layers' rope (rope_scaling, which its
     * transformers applies to those only; transformers 5 nests it under full_attention); the
     * sliding layers' rope is unscaled, and so is transformers 5's top-level "rope_type" it
     * writes beside the nested ones (model.c refuses another) */
    {"rope_global_type", CKPTFS_FIELD_ROPE_TYPE, M(rope_type), CKPTFS_FOR_GEMMA_ATTENTION,
     {"rope_scaling.rope_type", "rope_scaling.type", "rope_parameters.full_attention.rope_type"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    {"rope_local_type", CKPTFS_FIELD_ROPE_TYPE, M(rope_local_type), CKPTFS_FOR_GEMMA_ATTENTION,
     {"rope_parameters.sliding_attention.rope_type", "rope_parameters.rope_type"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    /* Megatron-LM's linear interpolation of the (global) rope, an integer there; Megatron-Bridge's
     * Gemma3ModelProvider calls it rope_scaling_factor, mbridge's Gemma3Model fixes it at 8 */
    {"rope_linear_factor", CKPTFS_FIELD_FLOAT, M(rope_linear_factor), CKPTFS_FOR_LINEAR_ROPE,
     {"rope_scaling.factor", "rope_parameters.full_attention.factor"}, 0, "rotary_seq_len_interpolation_factor",
     NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_REQUIRED | CKPTFS_FIELD_ARGS_INTEGER, 1, 1, 0, 0, 1e6, {NULL}},
    /* Gemma's attention (transformers 5 nests the two rope bases under rope_parameters'
     * full_attention and sliding_attention): mbridge's Gemma3TransformerConfig field names;
     * soft-capping and bidirectional attention are not in Megatron-core 0.17.1 */
    {"rope_local_theta", CKPTFS_FIELD_FLOAT, M(rope_local_theta), CKPTFS_FOR_GEMMA_ATTENTION,
     {"rope_local_base_freq", "rope_parameters.sliding_attention.rope_theta"}, 0, "rope_local_base_freq", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARGS_REQUIRED, 10000, 10000, 0, 0, 1e12, {NULL}},
    {"query_pre_attn_scalar", CKPTFS_FIELD_FLOAT, M(query_pre_attn_scalar), CKPTFS_FOR_GEMMA_ATTENTION,
     {"query_pre_attn_scalar"}, 0, "query_pre_attn_scalar", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARGS_REQUIRED | CKPTFS_FIELD_HF_INTEGER, 256, 256, 0, 0, 1e12, {NULL}},
    {"attn_softcap", CKPTFS_FIELD_FLOAT, M(attn_softcap), CKPTFS_FOR_GEMMA_ATTENTION, {"attn_logit_softcapping"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED | CKPTFS_FIELD_NULL_WHEN_ZERO, 0, 0, 0, -1e12, 1e12, {NULL}},
    {"final_softcap", CKPTFS_FIELD_FLOAT, M(final_softcap), CKPTFS_FOR_GEMMA_ATTENTION, {"final_logit_softcapping"},
     0, NULL, NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED | CKPTFS_FIELD_NULL_WHEN_ZERO, 0, 0, 0, -1e12, 1e12, {NULL}},
    {"bidirectional_attention", CKPTFS_FIELD_BOOL, M(bidirectional_attention), CKPTFS_FOR_GEMMA_ATTENTION,
     {"use_bidirectional_attention"}, 0, NULL, NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 0, 0, 0, 0, 0, {NULL}},
    /* Llama 3's scaling: Megatron-core 0.17.1 (apply_rope_scaling) takes the factor and fixes
     * the rest */
    {"rope_scaling_factor", CKPTFS_FIELD_FLOAT, M(rope_scaling_factor), CKPTFS_FOR_LLAMA3,
     {"rope_scaling.factor", "rope_parameters.factor"}, 0, "rope_scaling_factor", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_REQUIRED, 0, 8, 0, 0, 1e6, {NULL}},
    {"rope_low_freq", CKPTFS_FIELD_FLOAT, M(rope_low_freq), CKPTFS_FOR_LLAMA3,
     {"rope_scaling.low_freq_factor", "rope_parameters.low_freq_factor"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 1, 1, 0, 0, 1e6, {NULL}},
    {"rope_high_freq", CKPTFS_FIELD_FLOAT, M(rope_high_freq), CKPTFS_FOR_LLAMA3,
     {"rope_scaling.high_freq_factor", "rope_parameters.high_freq_factor"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 4, 4, 0, 0, 1e6, {NULL}},
    {"rope_original_positions", CKPTFS_FIELD_UINT, M(rope_original_positions), CKPTFS_FOR_LLAMA3,
     {"rope_scaling.original_max_position_embeddings", "rope_parameters.original_max_position_embeddings"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 8192, 8192, 0, 0, (double)UINT32_MAX, {NULL}},
    /* YaRN as DeepSeek-V3 and Kimi-K2 configure it: beta_fast and beta_slow are fields of
     * Megatron-core's MLATransformerConfig (Kimi-K2's are 1 and 1), written to args under their
     * names; original_max_position_embeddings has Megatron's default only */
    {"yarn_factor", CKPTFS_FIELD_FLOAT, M(yarn_factor), CKPTFS_FOR_YARN,
     {"rope_scaling.factor", "rope_parameters.factor"}, 0, "rotary_scaling_factor", NULL, CKPTFS_FIELD_MATH, 1,
     1, 0, 0.999999, 1e6, {NULL}},
    {"yarn_mscale", CKPTFS_FIELD_FLOAT, M(yarn_mscale), CKPTFS_FOR_YARN,
     {"rope_scaling.mscale", "rope_parameters.mscale"}, 0, "mscale", NULL, CKPTFS_FIELD_MATH, 1, 1, 0, -1e6, 1e6, {NULL}},
    {"yarn_mscale_all_dim", CKPTFS_FIELD_FLOAT, M(yarn_mscale_all_dim), CKPTFS_FOR_YARN,
     {"rope_scaling.mscale_all_dim", "rope_parameters.mscale_all_dim"}, 0, "mscale_all_dim", NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, -1e6, 1e6, {NULL}},
    {"yarn_beta_fast", CKPTFS_FIELD_FLOAT, M(yarn_beta_fast), CKPTFS_FOR_YARN,
     {"rope_scaling.beta_fast", "rope_parameters.beta_fast"}, 0, "beta_fast", NULL, CKPTFS_FIELD_MATH, 32, 32, 0,
     -1e6, 1e6, {NULL}},
    {"yarn_beta_slow", CKPTFS_FIELD_FLOAT, M(yarn_beta_slow), CKPTFS_FOR_YARN,
     {"rope_scaling.beta_slow", "rope_parameters.beta_slow"}, 0, "beta_slow", NULL, CKPTFS_FIELD_MATH, 1, 1, 0,
     -1e6, 1e6, {NULL}},
    {"yarn_original_positions", CKPTFS_FIELD_UINT, M(yarn_original_positions), CKPTFS_FOR_YARN,
     {"rope_scaling.original_max_position_embeddings", "rope_parameters.original_max_position_embeddings"}, 0,
     "original_max_position_embeddings", NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_FIXED, 4096, 4096, 0, 0,
     (double)UINT32_MAX, {NULL}},
    /* YaRN's correction range rounded to whole dimensions (GPT-OSS says false); Megatron-core's
     * GPT model takes it as the bridges' yarn_correction_range_round_to_int */
    {"yarn_truncate", CKPTFS_FIELD_BOOL, M(yarn_truncate), CKPTFS_FOR_YARN,
     {"rope_scaling.truncate", "rope_parameters.truncate"}, 0, "yarn_correction_range_round_to_int", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_OMIT_DEFAULT, 1, 1, 0, 0, 0, {NULL}},
    /* experts: transformers 5 writes num_local_experts for every family */
    {"experts", CKPTFS_FIELD_UINT, M(experts), CKPTFS_FOR_MOE, {"num_local_experts"}, CKPTFS_ARCH_KEY_EXPERTS,
     "num_experts", NULL, CKPTFS_FIELD_REQUIRED | CKPTFS_FIELD_MATH, 0, 0, 0, 0, CKPTFS_MAX_EXPERTS, {NULL}},
    {"topk", CKPTFS_FIELD_UINT, M(topk), CKPTFS_FOR_MOE, {"num_experts_per_tok"}, 0, "moe_router_topk", NULL,
     CKPTFS_FIELD_REQUIRED | CKPTFS_FIELD_MATH, 0, 2, 0, 0, CKPTFS_MAX_EXPERTS, {NULL}},
    {"moe_ffn", CKPTFS_FIELD_UINT, M(moe_ffn), CKPTFS_FOR_MOE, {NULL}, CKPTFS_ARCH_KEY_EXPERT_FFN,
     "moe_ffn_hidden_size", NULL, CKPTFS_FIELD_REQUIRED, 0, 0, CKPTFS_DERIVED_FFN, 0, DIM, {NULL}},
    /* the shared expert: Qwen2-MoE's width, or DeepSeek's count of expert-sized MLPs (read after
     * the expert's width); Qwen2-MoE's is gated */
    {"shared_ffn", CKPTFS_FIELD_COUNT, M(shared_ffn), CKPTFS_FOR_MOE, {NULL}, CKPTFS_ARCH_KEY_SHARED_FFN,
     "moe_shared_expert_intermediate_size", NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_NULL_WHEN_ZERO, 0, 0, 0, 0, DIM, {NULL}},
    {"shared_experts", CKPTFS_FIELD_COUNT, M(shared_ffn), CKPTFS_FOR_MOE, {"n_shared_experts"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_TIMES_EXPERT_FFN | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_DEEPSEEK_REQUIRED,
     0, 0, 0, 0, 4096, {NULL}},
    {"shared_gate", CKPTFS_FIELD_BOOL, M(shared_gate), CKPTFS_FOR_MOE, {NULL}, 0, "moe_shared_expert_gate", NULL,
     CKPTFS_FIELD_MATH, 0, 0, CKPTFS_DERIVED_SHARED_GATE, 0, 0, {NULL}},
    /* top-k weights renormalised (Mixtral's always); Megatron's moe_router_pre_softmax is the
     * negation */
    {"renormalize", CKPTFS_FIELD_BOOL, M(renormalize), CKPTFS_FOR_MOE, {"norm_topk_prob"}, 0, "moe_router_pre_softmax",
     NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_ARGS_NEGATED | CKPTFS_FIELD_ARCH_HAS_IT | CKPTFS_FIELD_DEEPSEEK_REQUIRED,
     0, 1, 0, 0, 0, {NULL}},
    /* DeepSeek's routing (modeling_deepseek.py's MoEGate) as Megatron's router: V3 scores with a
     * sigmoid and picks the top-k of score + e_score_correction_bias (noaux_tc), V2 with softmax,
     * greedily. Megatron's group-limited top-k scores a group by the sum of its top scores, not
     * by their maximum: another top-k method is refused. */
    {"sigmoid_scores", CKPTFS_FIELD_BOOL, M(sigmoid_scores), CKPTFS_FOR_MOE, {"scoring_func"}, 0,
     "moe_router_score_function", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_ARCH_FIXED | CKPTFS_FIELD_ARGS_CHOICE, 0, 0,
     CKPTFS_DERIVED_SIGMOID, 0, 0, {"softmax", "sigmoid"}},
    {"expert_bias", CKPTFS_FIELD_BOOL, M(expert_bias), CKPTFS_FOR_MOE, {"topk_method"}, 0,
     "moe_router_enable_expert_bias", NULL, CKPTFS_FIELD_MATH | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_ARCH_FIXED,
     0, 0, CKPTFS_DERIVED_SIGMOID, 0, 0, {"greedy", "noaux_tc"}},
    /* the chosen experts' weights times routed_scaling_factor (1: not scaled) */
    {"topk_scaling", CKPTFS_FIELD_FLOAT, M(topk_scaling), CKPTFS_FOR_MOE, {"routed_scaling_factor"}, 0,
     "moe_router_topk_scaling_factor", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_DEEPSEEK_REQUIRED | CKPTFS_FIELD_DEFAULT_AS_ZERO, 1,
     0, 0, 0, 1e6, {NULL}},
    /* V3's group-limited top-k: within the topk_group best of n_group groups (1 group: none) */
    {"groups", CKPTFS_FIELD_UINT, M(groups), CKPTFS_FOR_MOE, {"n_group"}, 0, "moe_router_num_groups", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_DEEPSEEK_REQUIRED | CKPTFS_FIELD_SIGMOID_ONLY |
         CKPTFS_FIELD_DEFAULT_AS_ZERO, 1, 0, 0, 0, CKPTFS_MAX_EXPERTS, {NULL}},
    {"group_topk", CKPTFS_FIELD_UINT, M(group_topk), CKPTFS_FOR_MOE, {"topk_group"}, 0, "moe_router_group_topk", NULL,
     CKPTFS_FIELD_MATH | CKPTFS_FIELD_DEEPSEEK_ONLY | CKPTFS_FIELD_DEEPSEEK_REQUIRED | CKPTFS_FIELD_SIGMOID_ONLY |
         CKPTFS_FIELD_ZERO_AS_DEFAULT, 1, 0, 0, 0, CKPTFS_MAX_EXPERTS, {NULL}},
    /* DeepSeek's name; Qwen3-Next's and Qwen3.5's releases say mtp_num_hidden_layers */
    {"mtp_layers", CKPTFS_FIELD_COUNT, M(mtp_layers), CKPTFS_FOR_ALL, {"num_nextn_predict_layers", "mtp_num_hidden_layers"},
     0, NULL, NULL, CKPTFS_FIELD_OMIT_ZERO, 0, 0, 0, 0, 64, {NULL}},
    /* the tokenizer's ids, kept as given: the views' args carry them in one dict (Megatron has no
     * such argument and its loaders ignore the ones they do not know), so that hf/ of their copy
     * writes them back; a Megatron checkpoint's own args have none: written null, never left to
     * transformers' defaults, which may lie outside the vocabulary (Phi-3's pad_token_id 32000) */
    {"bos_token_id", CKPTFS_FIELD_TOKEN_ID, M(bos_token), CKPTFS_FOR_ALL, {"bos_token_id"}, 0, "hf_token_ids", NULL,
     0, 0, 0, 0, 0, 0, {NULL}},
    {"eos_token_id", CKPTFS_FIELD_TOKEN_ID, M(eos_token), CKPTFS_FOR_ALL, {"eos_token_id"}, 0, "hf_token_ids", NULL,
     0, 0, 0, 0, 0, 0, {NULL}},
    {"pad_token_id", CKPTFS_FIELD_TOKEN_ID, M(pad_token), CKPTFS_FOR_ALL, {"pad_token_id"}, 0, "hf_token_ids", NULL,
     0, 0, 0, 0, 0, 0, {NULL}},
    /* The vision tower and merger (Qwen2_5_VLVisionConfig's defaults); mbridge builds Megatron's
     * vision config from these, Megatron's args have none. The release also writes
     * spatial_patch_size (14, unread by transformers): the same patch, so it must agree. */
    {"vision_depth", CKPTFS_FIELD_UINT, M(vision_depth), CKPTFS_FOR_VISION, {"vision_config.depth"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 32, 32, 0, 0, CKPTFS_MAX_VISION_DEPTH, {NULL}},
    {"vision_hidden", CKPTFS_FIELD_UINT, M(vision_hidden), CKPTFS_FOR_VISION, {"vision_config.hidden_size"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 3584, 3584, 0, 0, DIM, {NULL}},
    {"vision_heads", CKPTFS_FIELD_UINT, M(vision_heads), CKPTFS_FOR_VISION, {"vision_config.num_heads"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 16, 16, 0, 0, DIM, {NULL}},
    {"vision_ffn", CKPTFS_FIELD_UINT, M(vision_ffn), CKPTFS_FOR_VISION, {"vision_config.intermediate_size"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 3420, 3420, 0, 0, DIM, {NULL}},
    {"vision_activation", CKPTFS_FIELD_ACTIVATION, 0, CKPTFS_FOR_VISION, {"vision_config.hidden_act"}, 0, NULL, NULL,
     CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    {"vision_out_hidden", CKPTFS_FIELD_UINT, M(vision_out_hidden), CKPTFS_FOR_VISION,
     {"vision_config.out_hidden_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 3584, 3584, 0, 0, DIM, {NULL}},
    {"vision_patch", CKPTFS_FIELD_UINT, M(vision_patch), CKPTFS_FOR_VISION,
     {"vision_config.patch_size", "vision_config.spatial_patch_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 14, 14, 0,
     0, 4096, {NULL}},
    {"vision_temporal_patch", CKPTFS_FIELD_UINT, M(vision_temporal_patch), CKPTFS_FOR_VISION,
     {"vision_config.temporal_patch_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_merge", CKPTFS_FIELD_UINT, M(vision_merge), CKPTFS_FOR_VISION, {"vision_config.spatial_merge_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_window", CKPTFS_FIELD_UINT, M(vision_window), CKPTFS_FOR_VISION, {"vision_config.window_size"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 112, 112, 0, 0, 65536, {NULL}},
    {"vision_channels", CKPTFS_FIELD_UINT, M(vision_channels), CKPTFS_FOR_VISION,
     {"vision_config.in_chans", "vision_config.in_channels"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 3, 3, 0, 0, 64,
     {NULL}},
    {"vision_tokens_per_second", CKPTFS_FIELD_FLOAT, M(vision_tokens_per_second), CKPTFS_FOR_VISION,
     {"vision_config.tokens_per_second"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 4, 4, 0, 0, 1e6, {NULL}},
    /* GLM-4.1V's vision tower (Glm4vVisionConfig's defaults): no windows; a learned position
     * embedding over image_size; the blocks' MLP is out_hidden_size wide, intermediate_size is the
     * merger's */
    {"vision_depth", CKPTFS_FIELD_UINT, M(vision_depth), CKPTFS_FOR_GLM4V_VISION, {"vision_config.depth"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 24, 24, 0, 0, CKPTFS_MAX_VISION_DEPTH, {NULL}},
    {"vision_hidden", CKPTFS_FIELD_UINT, M(vision_hidden), CKPTFS_FOR_GLM4V_VISION, {"vision_config.hidden_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 1536, 1536, 0, 0, DIM, {NULL}},
    {"vision_heads", CKPTFS_FIELD_UINT, M(vision_heads), CKPTFS_FOR_GLM4V_VISION, {"vision_config.num_heads"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 12, 12, 0, 0, DIM, {NULL}},
    {"vision_ffn", CKPTFS_FIELD_UINT, M(vision_ffn), CKPTFS_FOR_GLM4V_VISION, {"vision_config.intermediate_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 13696, 13696, 0, 0, DIM, {NULL}},
    {"vision_activation", CKPTFS_FIELD_ACTIVATION, 0, CKPTFS_FOR_GLM4V_VISION, {"vision_config.hidden_act"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    {"vision_out_hidden", CKPTFS_FIELD_UINT, M(vision_out_hidden), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.out_hidden_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 4096, 4096, 0, 0, DIM, {NULL}},
    {"vision_patch", CKPTFS_FIELD_UINT, M(vision_patch), CKPTFS_FOR_GLM4V_VISION, {"vision_config.patch_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 14, 14, 0, 0, 4096, {NULL}},
    {"vision_temporal_patch", CKPTFS_FIELD_UINT, M(vision_temporal_patch), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.temporal_patch_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_merge", CKPTFS_FIELD_UINT, M(vision_merge), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.spatial_merge_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_channels", CKPTFS_FIELD_UINT, M(vision_channels), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.in_channels"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 3, 3, 0, 0, 64, {NULL}},
    {"vision_image_size", CKPTFS_FIELD_UINT, M(vision_image_size), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.image_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 336, 336, 0, 0, 65536, {NULL}},
    {"vision_norm_eps", CKPTFS_FIELD_FLOAT, M(vision_norm_eps), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.rms_norm_eps"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 1e-5, 1e-5, 0, 0, 1, {NULL}},
    {"vision_qkv_bias", CKPTFS_FIELD_BOOL, M(vision_qkv_bias), CKPTFS_FOR_GLM4V_VISION,
     {"vision_config.attention_bias"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {NULL}},
    /* The tokens that place an image or a video in the text (Glm4vMoeConfig's defaults; GLM-4.1V's
     * image and video tokens default to 151343 and 151344, but it gets no Megatron view to carry
     * them): carried in the views' args, for a Megatron source's hf/config.json */
    {"image_token_id", CKPTFS_FIELD_UINT, M(image_token), CKPTFS_FOR_GLM4V_VISION, {"image_token_id"}, 0, NULL, NULL, 0,
     151363, 151363, 0, 0, G_MAXINT32, {NULL}},
    {"video_token_id", CKPTFS_FIELD_UINT, M(video_token), CKPTFS_FOR_GLM4V_VISION, {"video_token_id"}, 0, NULL, NULL, 0,
     151364, 151364, 0, 0, G_MAXINT32, {NULL}},
    {"vision_start_token_id", CKPTFS_FIELD_UINT, M(vision_start_token), CKPTFS_FOR_GLM4V_VISION,
     {"image_start_token_id"}, 0, NULL, NULL, 0, 151339, 151339, 0, 0, G_MAXINT32, {NULL}},
    {"vision_end_token_id", CKPTFS_FIELD_UINT, M(vision_end_token), CKPTFS_FOR_GLM4V_VISION, {"image_end_token_id"}, 0,
     NULL, NULL, 0, 151340, 151340, 0, 0, G_MAXINT32, {NULL}},
    {"video_start_token_id", CKPTFS_FIELD_UINT, M(video_start_token), CKPTFS_FOR_GLM4V_VISION,
     {"video_start_token_id"}, 0, NULL, NULL, 0, 151341, 151341, 0, 0, G_MAXINT32, {NULL}},
    {"video_end_token_id", CKPTFS_FIELD_UINT, M(video_end_token), CKPTFS_FOR_GLM4V_VISION, {"video_end_token_id"}, 0,
     NULL, NULL, 0, 151342, 151342, 0, 0, G_MAXINT32, {NULL}},
    /* Qwen3-VL's vision tower (Qwen3VLVisionConfig's defaults): LayerNorm blocks with a plain
     * gelu (tanh) MLP, a learned position embedding of num_position_embeddings rows; mbridge's
     * get_vision_model_config reads these. deepstack_visual_indexes is read by the
     * architecture's walk (model.c). */
    {"vision_depth", CKPTFS_FIELD_UINT, M(vision_depth), CKPTFS_FOR_VISION_DEEPSTACK, {"vision_config.depth"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 27, 27, 0, 0, CKPTFS_MAX_VISION_DEPTH, {NULL}},
    {"vision_hidden", CKPTFS_FIELD_UINT, M(vision_hidden), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.hidden_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 1152, 1152, 0, 0, DIM, {NULL}},
    {"vision_heads", CKPTFS_FIELD_UINT, M(vision_heads), CKPTFS_FOR_VISION_DEEPSTACK, {"vision_config.num_heads"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 16, 16, 0, 0, DIM, {NULL}},
    {"vision_ffn", CKPTFS_FIELD_UINT, M(vision_ffn), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.intermediate_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 4304, 4304, 0, 0, DIM, {NULL}},
    {"vision_activation", CKPTFS_FIELD_ACTIVATION, 0, CKPTFS_FOR_VISION_DEEPSTACK, {"vision_config.hidden_act"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {"gelu_pytorch_tanh"}},
    {"vision_out_hidden", CKPTFS_FIELD_UINT, M(vision_out_hidden), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.out_hidden_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 3584, 3584, 0, 0, DIM, {NULL}},
    {"vision_patch", CKPTFS_FIELD_UINT, M(vision_patch), CKPTFS_FOR_VISION_DEEPSTACK, {"vision_config.patch_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 16, 16, 0, 0, 4096, {NULL}},
    {"vision_temporal_patch", CKPTFS_FIELD_UINT, M(vision_temporal_patch), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.temporal_patch_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_merge", CKPTFS_FIELD_UINT, M(vision_merge), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.spatial_merge_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2, 2, 0, 0, 64, {NULL}},
    {"vision_channels", CKPTFS_FIELD_UINT, M(vision_channels), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.in_channels"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 3, 3, 0, 0, 64, {NULL}},
    {"vision_positions", CKPTFS_FIELD_UINT, M(vision_positions), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_config.num_position_embeddings"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 2304, 2304, 0, 0, DIM, {NULL}},
    /* Gemma 3's SigLIP tower (SiglipVisionConfig's defaults): LayerNorm blocks with a plain
     * gelu (tanh) MLP, a learned position embedding of (image_size / patch_size)^2 rows, one
     * image a frame; the projector pools the patches to mm_tokens_per_image tokens. The token
     * ids are Gemma3Config's (image_token_index, boi/eoi: the image's start and end). */
    {"vision_depth", CKPTFS_FIELD_UINT, M(vision_depth), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.num_hidden_layers"},
     0, NULL, NULL, CKPTFS_FIELD_MATH, 12, 12, 0, 0, CKPTFS_MAX_VISION_DEPTH, {NULL}},
    {"vision_hidden", CKPTFS_FIELD_UINT, M(vision_hidden), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.hidden_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 768, 768, 0, 0, DIM, {NULL}},
    {"vision_heads", CKPTFS_FIELD_UINT, M(vision_heads), CKPTFS_FOR_SIGLIP_VISION,
     {"vision_config.num_attention_heads"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 12, 12, 0, 0, DIM, {NULL}},
    {"vision_ffn", CKPTFS_FIELD_UINT, M(vision_ffn), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.intermediate_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 3072, 3072, 0, 0, DIM, {NULL}},
    {"vision_activation", CKPTFS_FIELD_ACTIVATION, 0, CKPTFS_FOR_SIGLIP_VISION, {"vision_config.hidden_act"}, 0, NULL,
     NULL, CKPTFS_FIELD_MATH, 0, 0, 0, 0, 0, {"gelu_pytorch_tanh"}},
    {"vision_channels", CKPTFS_FIELD_UINT, M(vision_channels), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.num_channels"},
     0, NULL, NULL, CKPTFS_FIELD_MATH, 3, 3, 0, 0, 64, {NULL}},
    {"vision_image_size", CKPTFS_FIELD_UINT, M(vision_image_size), CKPTFS_FOR_SIGLIP_VISION,
     {"vision_config.image_size"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 224, 224, 0, 0, 65536, {NULL}},
    {"vision_patch", CKPTFS_FIELD_UINT, M(vision_patch), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.patch_size"}, 0,
     NULL, NULL, CKPTFS_FIELD_MATH, 16, 16, 0, 0, 4096, {NULL}},
    {"vision_norm_eps", CKPTFS_FIELD_FLOAT, M(vision_norm_eps), CKPTFS_FOR_SIGLIP_VISION,
     {"vision_config.layer_norm_eps"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 1e-6, 1e-6, 0, 0, 1, {NULL}},
    {"vision_head", CKPTFS_FIELD_BOOL, M(vision_head), CKPTFS_FOR_SIGLIP_VISION, {"vision_config.vision_use_head"}, 0,
     NULL, NULL, 0, 1, 1, 0, 0, 0, {NULL}},
    {"vision_image_tokens", CKPTFS_FIELD_UINT, M(vision_image_tokens), CKPTFS_FOR_SIGLIP_VISION,
     {"mm_tokens_per_image"}, 0, NULL, NULL, CKPTFS_FIELD_MATH, 256, 256, 0, 0, 65536, {NULL}},
    {"image_token_id", CKPTFS_FIELD_UINT, M(image_token), CKPTFS_FOR_SIGLIP_VISION,
     {"image_token_index", "image_token_id"}, 0, NULL, NULL, 0, 262144, 262144, 0, 0, G_MAXINT32, {NULL}},
    {"vision_start_token_id", CKPTFS_FIELD_UINT, M(vision_start_token), CKPTFS_FOR_SIGLIP_VISION,
     {"boi_token_index", "boi_token_id"}, 0, NULL, NULL, 0, 255999, 255999, 0, 0, G_MAXINT32, {NULL}},
    {"vision_end_token_id", CKPTFS_FIELD_UINT, M(vision_end_token), CKPTFS_FOR_SIGLIP_VISION,
     {"eoi_token_index", "eoi_token_id"}, 0, NULL, NULL, 0, 256000, 256000, 0, 0, G_MAXINT32, {NULL}},
    /* The tokens that place an image or video in the text (Qwen2_5_VLConfig's defaults): no
     * weight's math, but a Megatron source's hf/config.json needs them for transformers to put
     * the tower's output where the checkpoint's tokenizer does. */
    {"image_token_id", CKPTFS_FIELD_UINT, M(image_token), CKPTFS_FOR_VISION, {"image_token_id"}, 0, NULL, NULL, 0,
     151655, 151655, 0, 0, G_MAXINT32, {NULL}},
    {"video_token_id", CKPTFS_FIELD_UINT, M(video_token), CKPTFS_FOR_VISION, {"video_token_id"}, 0, NULL, NULL, 0,
     151656, 151656, 0, 0, G_MAXINT32, {NULL}},
    {"vision_start_token_id", CKPTFS_FIELD_UINT, M(vision_start_token), CKPTFS_FOR_VISION, {"vision_start_token_id"},
     0, NULL, NULL, 0, 151652, 151652, 0, 0, G_MAXINT32, {NULL}},
    {"vision_end_token_id", CKPTFS_FIELD_UINT, M(vision_end_token), CKPTFS_FOR_VISION, {"vision_end_token_id"}, 0,
     NULL, NULL, 0, 151653, 151653, 0, 0, G_MAXINT32, {NULL}},
    /* Qwen3-VL's (Qwen3VLConfig's and Qwen3VLMoeConfig's defaults, Qwen2.5-VL's values): carried
     * in the views' args, so a Megatron source's hf/config.json places the image as the source did */
    {"image_token_id", CKPTFS_FIELD_UINT, M(image_token), CKPTFS_FOR_VISION_DEEPSTACK, {"image_token_id"}, 0, NULL,
     NULL, 0, 151655, 151655, 0, 0, G_MAXINT32, {NULL}},
    {"video_token_id", CKPTFS_FIELD_UINT, M(video_token), CKPTFS_FOR_VISION_DEEPSTACK, {"video_token_id"}, 0, NULL,
     NULL, 0, 151656, 151656, 0, 0, G_MAXINT32, {NULL}},
    {"vision_start_token_id", CKPTFS_FIELD_UINT, M(vision_start_token), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_start_token_id"}, 0, NULL, NULL, 0, 151652, 151652, 0, 0, G_MAXINT32, {NULL}},
    {"vision_end_token_id", CKPTFS_FIELD_UINT, M(vision_end_token), CKPTFS_FOR_VISION_DEEPSTACK,
     {"vision_end_token_id"}, 0, NULL, NULL, 0, 151653, 151653, 0, 0, G_MAXINT32, {NULL}},
};

/* Members of a vision part no row reads that leave the weights' math alone (the dtype is the
 * tensors'; attention_dropout acts in training only); the architecture's list of blocks
 * (fullatt_block_indexes, deepstack_visual_indexes) is read by its walk (model.c). */
static const char *const vision_members_unread[] = {"model_type", "initializer_range", "dtype", "torch_dtype",
                                                    "attention_dropout"};

/* Members of rope_scaling / rope_parameters ckptfs knows besides the table's. */
static const char *const rope_objects[] = {"rope_scaling", "rope_parameters"};

const CkptfsModelField *ckptfs_schema_fields(size_t *count)
{
    *count = G_N_ELEMENTS(fields);
    return fields;
}

bool ckptfs_schema_applies(const CkptfsModelField *f, const CkptfsModel *m)
{
    switch (f->scope) {
    case CKPTFS_FOR_MHA:
        return !m->mla;
    case CKPTFS_FOR_MLA:
        return m->mla;
    case CKPTFS_FOR_MOE:
        return m->experts > 0 || (m->arch && m->arch->moe);
    case CKPTFS_FOR_LLAMA3:
        return m->rope_type == CKPTFS_ROPE_LLAMA3;
    case CKPTFS_FOR_YARN:
        return m->rope_type == CKPTFS_ROPE_YARN;
    case CKPTFS_FOR_PLAIN_ROPE:
        return !(m->arch && m->arch->gemma_attention);
    case CKPTFS_FOR_LINEAR_ROPE:
        return m->rope_type == CKPTFS_ROPE_LINEAR;
    case CKPTFS_FOR_VISION: /* their own walks (ckptfs_schema_read_vision, ckptfs_schema_write_vision):
                               Megatron's args have no vision tower */
    case CKPTFS_FOR_GLM4V_VISION:
    case CKPTFS_FOR_VISION_DEEPSTACK:
    case CKPTFS_FOR_SIGLIP_VISION:
        return false;
    case CKPTFS_FOR_LINEAR_ATTENTION:
        return m->linear_attention;
    case CKPTFS_FOR_GEMMA_ATTENTION:
        return m->arch && m->arch->gemma_attention;
    default:
        return true;
    }
}

static const char *const rope_type_names[] = {"default", "llama3", "yarn", "linear"};

const char *ckptfs_rope_type_name(CkptfsRopeType type)
{
    return rope_type_names[type];
}

/* The activation as config.json names it: the row's own (a vision tower's plain MLP), else the
 * architecture's gated MLP's, else SwiGLU's silu. */
static const char *activation_of(const CkptfsModel *m, const CkptfsModelField *f)
{
    if (f->choice[0])
        return f->choice[0];
    return m->arch && m->arch->activation ? m->arch->activation : "silu";
}

static char *token_ids_text(const CkptfsTokenIds *t, bool known)
{
    if (!known)
        return g_strdup("null (unknown)");
    if (t->form == CKPTFS_TOKEN_ABSENT)
        return g_strdup("absent (transformers' default)");
    if (t->form == CKPTFS_TOKEN_NULL)
        return g_strdup("null");
    GString *text = g_string_new(t->form == CKPTFS_TOKEN_LIST ? "[" : "");
    for (unsigned i = 0; i < t->count; i++)
        g_string_append_printf(text, "%s%" G_GINT64_FORMAT, i ? ", " : "", t->ids[i]);
    if (t->form == CKPTFS_TOKEN_LIST)
        g_string_append_c(text, ']');
    return g_string_free(text, FALSE);
}

char *ckptfs_schema_value_text(const CkptfsModelField *f, const CkptfsModel *m)
{
    const char *p = (const char *)m + f->offset;
    switch (f->type) {
    case CKPTFS_FIELD_UINT:
    case CKPTFS_FIELD_COUNT:
        if (f->flags & CKPTFS_FIELD_TIMES_EXPERT_FFN) /* the count config.json says */
            return g_strdup_printf("%" G_GUINT64_FORMAT, m->moe_ffn ? *(const uint64_t *)(const void *)p / m->moe_ffn : 0);
        return g_strdup_printf("%" G_GUINT64_FORMAT, *(const uint64_t *)(const void *)p);
    case CKPTFS_FIELD_FLOAT:
        return g_strdup_printf("%g", *(const double *)(const void *)p);
    case CKPTFS_FIELD_BOOL:
        if (f->choice[0])
            return g_strdup(f->choice[*(const bool *)(const void *)p]);
        return g_strdup(*(const bool *)(const void *)p ? "true" : "false");
    case CKPTFS_FIELD_ROPE_TYPE:
        return g_strdup(rope_type_names[*(const CkptfsRopeType *)(const void *)p]);
    case CKPTFS_FIELD_ACTIVATION:
        return g_strdup(activation_of(m, f));
    case CKPTFS_FIELD_WINDOW:
        if (m->window > 0)
            return g_strdup_printf("%" G_GUINT64_FORMAT " (one full-attention layer in %" G_GUINT64_FORMAT ")",
                                   m->window, m->window_skip_freq);
        return g_strdup("none");
    case CKPTFS_FIELD_TOKEN_ID:
        return token_ids_text((const CkptfsTokenIds *)(const void *)p, m->token_ids_known);
    }
    return g_strdup("?");
}

/* --- values of any type, as the walks pass them --- */

typedef struct {
    double number; /* UINT, COUNT, FLOAT, BOOL (0/1), ROPE_TYPE (the enum) */
    const char *text; /* names: as given */
} FieldValue;

static void store(const CkptfsModelField *f, CkptfsModel *m, double v)
{
    char *p = (char *)m + f->offset;
    switch (f->type) {
    case CKPTFS_FIELD_UINT:
    case CKPTFS_FIELD_COUNT:
        *(uint64_t *)(void *)p = (uint64_t)v;
        break;
    case CKPTFS_FIELD_FLOAT:
        *(double *)(void *)p = v;
        break;
    case CKPTFS_FIELD_BOOL:
        *(bool *)(void *)p = v != 0;
        break;
    case CKPTFS_FIELD_ROPE_TYPE:
        *(CkptfsRopeType *)(void *)p = (CkptfsRopeType)v;
        break;
    default:
        break;
    }
}

static double load(const CkptfsModelField *f, const CkptfsModel *m)
{
    const char *p = (const char *)m + f->offset;
    switch (f->type) {
    case CKPTFS_FIELD_UINT:
    case CKPTFS_FIELD_COUNT:
        return (double)*(const uint64_t *)(const void *)p;
    case CKPTFS_FIELD_FLOAT:
        return *(const double *)(const void *)p;
    case CKPTFS_FIELD_BOOL:
        return *(const bool *)(const void *)p;
    case CKPTFS_FIELD_ROPE_TYPE:
        return *(const CkptfsRopeType *)(const void *)p;
    default:
        return 0;
    }
}

/* The default of F for MODEL (its sizes read): the derived one, else the row's. A size config.json
 * leaves out is the architecture's transformers default where it has one (Mistral's 8 key/value
 * heads); one it gives as null is the derived one (transformers' "None"). */
static double default_of(const CkptfsModelField *f, const CkptfsModel *m, bool args, bool null_given)
{
    bool arch_default = !args && !null_given && m->arch;
    switch (f->derived) {
    case CKPTFS_DERIVED_HEADS:
        return arch_default && m->arch->kv_heads ? (double)m->arch->kv_heads : (double)m->heads;
    case CKPTFS_DERIVED_HEAD_DIM:
        if (arch_default && m->arch->head_dim)
            return (double)m->arch->head_dim;
        return m->heads ? (double)(m->hidden / m->heads) : 0;
    case CKPTFS_DERIVED_FFN:
        return (double)m->ffn;
    case CKPTFS_DERIVED_ROPE_THETA:
        if (!args && m->arch && m->arch->rope_theta > 0)
            return m->arch->rope_theta;
        break;
    case CKPTFS_DERIVED_NORM_EPS:
        if (!args && m->arch && m->arch->norm_eps > 0)
            return m->arch->norm_eps;
        break;
    case CKPTFS_DERIVED_ROTARY_PERCENT:
        if (!args && m->arch && m->arch->partial_rotary > 0)
            return m->arch->partial_rotary;
        break;
    case CKPTFS_DERIVED_MAX_POSITIONS:
        if (!args && m->arch && m->arch->max_positions > 0)
            return (double)m->arch->max_positions;
        break;
    case CKPTFS_DERIVED_SHARED_GATE:
        if (!args && m->arch && m->arch->moe)
            return m->arch->moe->shared_gate && m->shared_ffn > 0;
        break;
    case CKPTFS_DERIVED_SIGMOID:
        if (!args && m->arch && m->arch->moe)
            return m->arch->moe->sigmoid_routing;
        break;
    case CKPTFS_DERIVED_GLU_CLAMP:
        if (!args && m->arch)
            return m->arch->glu_clamp;
        break;
    case CKPTFS_DERIVED_TIED:
        if (!args && m->arch && m->arch->tied_by_default)
            return 1;
        break;
    case CKPTFS_DERIVED_QKV_BIAS:
        if (!args && m->arch && m->arch->biased_by_default)
            return 1;
        break;
    default:
        break;
    }
    return args ? f->args_default : f->hf_default;
}

static bool rope_type_from_name(const char *name, const CkptfsModel *m, CkptfsRopeType *out)
{
    if (strcmp(name, "default") == 0) {
        *out = CKPTFS_ROPE_DEFAULT;
        return true;
    }
    if (strcmp(name, "llama3") == 0 && !m->mla) {
        *out = CKPTFS_ROPE_LLAMA3;
        return true;
    }
    if (strcmp(name, "yarn") == 0 && (m->mla || (m->arch && m->arch->yarn))) {
        *out = CKPTFS_ROPE_YARN;
        return true;
    }
    if (strcmp(name, "linear") == 0 && m->arch && m->arch->gemma_attention) {
        *out = CKPTFS_ROPE_LINEAR;
        return true;
    }
    /* Qwen2-VL's multimodal rope: default frequencies over sections of the head (the model's walk
     * reads mrope_section) */
    if (strcmp(name, "mrope") == 0 && m->arch && m->arch->vision_part && !m->arch->text_rope) {
        *out = CKPTFS_ROPE_DEFAULT;
        return true;
    }
    return false;
}

/* Whether F has only its default for MODEL: a FIXED row, unless the architecture's transformers
 * class honours the field (partial rotary), or while the architecture is not known yet (Megatron
 * args are read before it is picked, which checks it then). */
static bool arch_has(const CkptfsModelField *f, const CkptfsModel *m);

static bool fixed_for(const CkptfsModelField *f, const CkptfsModel *m)
{
    if (!(f->flags & CKPTFS_FIELD_FIXED))
        return false;
    if (f->derived == CKPTFS_DERIVED_ROTARY_PERCENT)
        return m->arch != NULL && m->arch->partial_rotary == 0;
    if (f->flags & CKPTFS_FIELD_ARCH_HAS_IT) /* another value only where the architecture has it */
        return m->arch != NULL && !arch_has(f, m);
    return true;
}

/* --- walk 1: config.json --- */

const char *ckptfs_schema_config_architecture(JsonObject *config)
{
    JsonNode *n = ckptfs_json_member(config, "architectures");
    if (n == NULL || !JSON_NODE_HOLDS_ARRAY(n) || json_array_get_length(json_node_get_array(n)) == 0)
        return NULL;
    JsonNode *first = json_array_get_element(json_node_get_array(n), 0);
    return JSON_NODE_HOLDS_VALUE(first) && json_node_get_value_type(first) == G_TYPE_STRING
               ? json_node_get_string(first)
               : NULL;
}

#define REFUSE(...) return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "config.json: " __VA_ARGS__)

JsonObject *ckptfs_schema_text_config(JsonObject *config, const char *part, GError **error)
{
    JsonNode *node = part ? json_object_get_member(config, part) : NULL;
    if (node == NULL || JSON_NODE_HOLDS_NULL(node))
        return json_object_ref(config);
    if (!JSON_NODE_HOLDS_OBJECT(node)) {
        ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "config.json: \"%s\" is not an object", part);
        return NULL;
    }
    JsonObject *text = json_node_get_object(node);
    JsonObject *merged = json_object_new();
    g_autoptr(GList) top = json_object_get_members(config);
    for (GList *k = top; k; k = k->next)
        if (strcmp(k->data, part) != 0)
            json_object_set_member(merged, k->data, json_node_copy(json_object_get_member(config, k->data)));
    g_autoptr(GList) inner = json_object_get_members(text);
    for (GList *k = inner; k; k = k->next) {
        JsonNode *value = json_object_get_member(text, k->data), *outer = json_object_get_member(merged, k->data);
        /* the part's own name for the model (model_type "qwen2_5_vl_text") is not the model's */
        if (strcmp(k->data, "model_type") == 0 || strcmp(k->data, "architectures") == 0)
            continue;
        /* the whole model ties its head by the top level's (transformers 5 saves Qwen3-VL-MoE's
         * text part with its class's default, true, beside a top-level false it keeps lm_head by) */
        if (outer != NULL && strcmp(k->data, "tie_word_embeddings") == 0)
            continue;
        /* json_node_equal takes 1000000 and 1e6 as one number */
        if (outer != NULL && !json_node_equal(outer, value)) {
            json_object_unref(merged);
            ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "config.json: %s.%s and %s disagree", part,
                        (const char *)k->data, (const char *)k->data);
            return NULL;
        }
        json_object_set_member(merged, k->data, json_node_copy(value));
    }
    return merged;
}

/* The value under NAME (found: *FOUND), type-checked. */
static bool config_value(JsonObject *config, const CkptfsModelField *f, const char *name, const CkptfsModel *m,
                         bool *found, FieldValue *v, GError **error)
{
    CkptfsJsonMember got = CKPTFS_JSON_ABSENT;
    gint64 i = 0;
    bool b = false;
    const char *kind = "";
    switch (f->type) {
    case CKPTFS_FIELD_UINT:
    case CKPTFS_FIELD_COUNT:
        got = ckptfs_json_member_int(config, name, &i);
        v->number = (double)i;
        kind = f->type == CKPTFS_FIELD_UINT ? "a positive integer" : "an integer from 0";
        /* sizes over their limits: ckptfs_model_check_limits names them, with the others */
        if (got == CKPTFS_JSON_FOUND && i < (f->type == CKPTFS_FIELD_UINT))
            got = CKPTFS_JSON_WRONG_TYPE;
        break;
    case CKPTFS_FIELD_FLOAT:
        got = ckptfs_json_member_number(config, name, &v->number);
        kind = "a number";
        if (got == CKPTFS_JSON_FOUND && !(v->number > f->min && v->number <= f->max))
            REFUSE("\"%s\" %g is out of range (%g, %g]", name, v->number, f->min, f->max);
        break;
    case CKPTFS_FIELD_BOOL:
        if (f->choice[0]) { /* a name: one of the two, else -1 (refused as not the architecture's) */
            v->text = ckptfs_json_member_string(config, name);
            got = v->text ? CKPTFS_JSON_FOUND : ckptfs_json_member_bool(config, name, &b) == CKPTFS_JSON_ABSENT
                                                    ? CKPTFS_JSON_ABSENT : CKPTFS_JSON_WRONG_TYPE;
            v->number = v->text == NULL ? 0 : strcmp(v->text, f->choice[1]) == 0 ? 1
                                           : strcmp(v->text, f->choice[0]) == 0 ? 0 : -1;
            kind = "a name";
            break;
        }
        got = ckptfs_json_member_bool(config, name, &b);
        v->number = b;
        kind = "true or false";
        break;
    case CKPTFS_FIELD_ROPE_TYPE:
    case CKPTFS_FIELD_ACTIVATION:
        v->text = ckptfs_json_member_string(config, name);
        got = v->text ? CKPTFS_JSON_FOUND : ckptfs_json_member(config, name) && !JSON_NODE_HOLDS_NULL(
                                                ckptfs_json_member(config, name)) ? CKPTFS_JSON_WRONG_TYPE
                                                                                  : CKPTFS_JSON_ABSENT;
        kind = "a name";
        break;
    case CKPTFS_FIELD_WINDOW:
    case CKPTFS_FIELD_TOKEN_ID: /* their own readers */
        break;
    }
    if (got == CKPTFS_JSON_WRONG_TYPE)
        REFUSE("\"%s\" is not %s", name, kind);
    *found = got == CKPTFS_JSON_FOUND;
    if (!*found)
        return true;
    if (f->type == CKPTFS_FIELD_ROPE_TYPE) {
        CkptfsRopeType t;
        if (!rope_type_from_name(v->text, m, &t))
            REFUSE("%s '%s' has no Megatron equivalent (Megatron has llama3 scaling for attention, yarn for "
                   "multi-latent attention and GPT-OSS, linear for Gemma 3's full-attention layers)", name, v->text);
        v->number = t;
    }
    const char *activation = activation_of(m, f);
    /* a vision tower's plain MLP: the one activation its Megatron config fixes */
    if (f->type == CKPTFS_FIELD_ACTIVATION && f->choice[0] && strcmp(v->text, activation) != 0)
        REFUSE("%s '%s' is not understood: the vision tower's rules know %s only", name, v->text, activation);
    bool swish = f->type == CKPTFS_FIELD_ACTIVATION && strcmp(activation, "silu") == 0 && strcmp(v->text, "swish") == 0;
    if (f->type == CKPTFS_FIELD_ACTIVATION && strcmp(v->text, activation) != 0 && !swish)
        REFUSE("%s '%s' has no Megatron equivalent (%s's gated MLP uses %s)", name, v->text,
               m->arch ? m->arch->hf_architecture : "a SwiGLU model", activation);
    return true;
}

/* A sliding attention window narrower than the context: Megatron's views would attend to all
 * of it. null is none; absent is transformers' default for the architecture (Mistral's is a
 * window of 4096); Qwen's use_sliding_window, false unless given, must turn it on. */
static bool check_window(JsonObject *config, CkptfsModel *m, GError **error);

/* GPT-OSS's window (its architecture's WINDOW_SKIP_FREQ): sliding_window keys on the layers
 * layer_types calls sliding_attention, which must be all but every WINDOW_SKIP_FREQ-th, as
 * Megatron's window_attn_skip_freq has them; absent, transformers' defaults (the architecture's
 * window, that pattern). */
static bool read_skipped_window(JsonObject *config, CkptfsModel *m, GError **error)
{
    uint64_t freq = m->arch->window_skip_freq;
    gint64 window = (gint64)m->arch->sliding_window;
    CkptfsJsonMember got = ckptfs_json_member_int(config, "sliding_window", &window);
    if (got == CKPTFS_JSON_WRONG_TYPE || (got == CKPTFS_JSON_FOUND && window <= 0) ||
        (ckptfs_json_member(config, "sliding_window") && got != CKPTFS_JSON_FOUND))
        REFUSE("\"sliding_window\" is not a positive integer (%s's sliding layers need one)", m->arch->hf_architecture);
    /* the older spelling of layer_types (Gemma 3's releases; transformers 5 writes it with "_") */
    static const char *const patterns[] = {"sliding_window_pattern", "_sliding_window_pattern"};
    for (size_t i = 0; i < G_N_ELEMENTS(patterns); i++) {
        gint64 pattern = (gint64)freq;
        got = ckptfs_json_member_int(config, patterns[i], &pattern);
        if (got == CKPTFS_JSON_WRONG_TYPE || pattern != (gint64)freq)
            REFUSE("%s is not %" G_GUINT64_FORMAT ": Megatron's window_attn_skip_freq for %s has a full-attention "
                   "layer every %" G_GUINT64_FORMAT "th", patterns[i], freq, m->arch->hf_architecture, freq);
    }
    JsonNode *types = ckptfs_json_member(config, "layer_types");
    if (types != NULL && !JSON_NODE_HOLDS_NULL(types)) {
        JsonArray *list = JSON_NODE_HOLDS_ARRAY(types) ? json_node_get_array(types) : NULL;
        if (list == NULL || json_array_get_length(list) != m->layers)
            REFUSE("\"layer_types\" is not a list of num_hidden_layers (%" G_GUINT64_FORMAT ") names", m->layers);
        for (guint l = 0; l < m->layers; l++) {
            JsonNode *n = json_array_get_element(list, l);
            const char *want = (l + 1) % freq != 0 ? "sliding_attention" : "full_attention";
            const char *given = JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_STRING
                                    ? json_node_get_string(n) : "(not a name)";
            if (strcmp(given, want) != 0)
                REFUSE("layer_types entry %u is '%s': Megatron's window_attn_skip_freq %" G_GUINT64_FORMAT
                       " has %s there (a full-attention layer every %" G_GUINT64_FORMAT "th, sliding ones between)",
                       l, given, freq, want, freq);
        }
    }
    m->window = (uint64_t)window, m->window_skip_freq = freq;
    return true;
}

static bool check_window(JsonObject *config, CkptfsModel *m, GError **error)
{
    if (m->arch && m->arch->window_skip_freq)
        return read_skipped_window(config, m, error);
    gint64 window = 0;
    bool use = !(m->arch && m->arch->window_opt_in);
    CkptfsJsonMember got = ckptfs_json_member_int(config, "sliding_window", &window);
    if (got == CKPTFS_JSON_WRONG_TYPE)
        REFUSE("\"sliding_window\" is not an integer");
    if (ckptfs_json_member_bool(config, "use_sliding_window", &use) == CKPTFS_JSON_WRONG_TYPE)
        REFUSE("\"use_sliding_window\" is not true or false");
    bool absent = ckptfs_json_member(config, "sliding_window") == NULL;
    if (absent && m->arch && m->arch->sliding_window > 0 && use && m->arch->sliding_window < m->max_positions)
        REFUSE("no \"sliding_window\": transformers gives %s its default window of %" G_GUINT64_FORMAT
               " (below max_position_embeddings %" G_GUINT64_FORMAT "), which has no Megatron equivalent: its "
               "views attend to the whole sequence (\"sliding_window\": null says there is none)",
               m->arch->hf_architecture, m->arch->sliding_window, m->max_positions);
    if (got == CKPTFS_JSON_FOUND && use && (window <= 0 || (uint64_t)window < m->max_positions))
        REFUSE("sliding_window %" G_GINT64_FORMAT " (below max_position_embeddings %" G_GUINT64_FORMAT
               ") has no Megatron equivalent: its views attend to the whole sequence",
               window, m->max_positions);
    return true;
}

/* Members of rope_scaling / rope_parameters a vision-language model's walk reads (model.c: the
 * multimodal rope's sections, and transformers 5's "type": "mrope" beside rope_type). */
static const char *const mrope_members[] = {"mrope_section", "type"};

/* OBJECT's members (PREFIX.name) each one a row reads; a nested object's in turn (Gemma 3's
 * rope_parameters.full_attention and .sliding_attention). */
static bool check_rope_object(JsonObject *object, const char *prefix, const CkptfsModel *m, GError **error)
{
    g_autoptr(GList) members = json_object_get_members(object);
    for (GList *k = members; k; k = k->next) {
        g_autofree char *path = g_strdup_printf("%s.%s", prefix, (const char *)k->data);
        JsonNode *member = json_object_get_member(object, k->data);
        if (JSON_NODE_HOLDS_OBJECT(member)) {
            if (!check_rope_object(json_node_get_object(member), path, m, error))
                return false;
            continue;
        }
        bool known = false;
        for (size_t i = 0; i < G_N_ELEMENTS(fields) && !known; i++)
            for (size_t n = 0; n < G_N_ELEMENTS(fields[i].hf) && fields[i].hf[n] && !known; n++)
                known = strcmp(fields[i].hf[n], path) == 0;
        for (size_t i = 0; i < G_N_ELEMENTS(mrope_members) && !known && m->arch && m->arch->vision_part; i++)
            known = strcmp(mrope_members[i], k->data) == 0;
        known = known || (m->arch && m->arch->mrope_interleaved && strcmp(k->data, "mrope_interleaved") == 0);
        if (!known)
            REFUSE("%s is not understood: its effect has no Megatron equivalent", path);
    }
    return true;
}

/* Every member of rope_scaling / rope_parameters must be one a row reads: another would be a
 * setting whose effect the views silently drop. */
static bool check_rope_members(JsonObject *config, const CkptfsModel *m, GError **error)
{
    for (size_t o = 0; o < G_N_ELEMENTS(rope_objects); o++) {
        JsonNode *node = json_object_get_member(config, rope_objects[o]);
        if (node == NULL || JSON_NODE_HOLDS_NULL(node))
            continue;
        if (!JSON_NODE_HOLDS_OBJECT(node))
            REFUSE("\"%s\" is not an object", rope_objects[o]);
        if (!check_rope_object(json_node_get_object(node), rope_objects[o], m, error))
            return false;
    }
    return true;
}

static const CkptfsTokenIds *token_ids_of(const CkptfsModelField *f, const CkptfsModel *m)
{
    return (const CkptfsTokenIds *)(const void *)((const char *)m + f->offset);
}

/* A token id as config.json gives it, kept as given (an id outside the vocabulary too: the
 * model's own config says so, and transformers reads it the same from hf/). */
static bool read_config_token_ids(JsonObject *config, const CkptfsModelField *f, CkptfsModel *m, GError **error)
{
    CkptfsTokenIds *t = (CkptfsTokenIds *)(void *)((char *)m + f->offset);
    const char *name = f->hf[0];
    JsonNode *node = ckptfs_json_member(config, name);
    memset(t, 0, sizeof *t);
    if (node == NULL)
        return true;
    if (JSON_NODE_HOLDS_NULL(node)) {
        t->form = CKPTFS_TOKEN_NULL;
        return true;
    }
    if (ckptfs_json_node_int(node, &t->ids[0])) {
        t->form = CKPTFS_TOKEN_ONE, t->count = 1;
        return true;
    }
    JsonArray *list = JSON_NODE_HOLDS_ARRAY(node) ? json_node_get_array(node) : NULL;
    if (list == NULL)
        REFUSE("\"%s\" is not a token id, a list of them or null", name);
    if (json_array_get_length(list) > CKPTFS_MAX_TOKEN_IDS)
        REFUSE("\"%s\" lists %u ids, more than %u", name, json_array_get_length(list), CKPTFS_MAX_TOKEN_IDS);
    t->form = CKPTFS_TOKEN_LIST;
    for (guint i = 0; i < json_array_get_length(list); i++, t->count++)
        if (!ckptfs_json_node_int(json_array_get_element(list, i), &t->ids[i]))
            REFUSE("\"%s\" entry %u is not a token id", name, i);
    return true;
}

static const char *arch_key(const CkptfsModelField *f, const CkptfsModel *m)
{
    if (f->arch_key == CKPTFS_ARCH_KEY_QK_NORM)
        return m->arch ? m->arch->qk_norm_key : NULL;
    const CkptfsMoeConfig *moe = m->arch ? m->arch->moe : NULL;
    if (moe == NULL)
        return NULL;
    return f->arch_key == CKPTFS_ARCH_KEY_EXPERTS      ? moe->experts_key
           : f->arch_key == CKPTFS_ARCH_KEY_EXPERT_FFN ? moe->ffn_key
           : f->arch_key == CKPTFS_ARCH_KEY_SHARED_FFN ? moe->shared_ffn_key
                                                        : NULL;
}

/* Whether the architecture of M has the flag F always on (Qwen2's q/k/v biases, Qwen3's q/k
 * norms, Mixtral's renormalised top-k, DeepSeek's latent attention). */
static bool arch_has(const CkptfsModelField *f, const CkptfsModel *m)
{
    const CkptfsArchitecture *a = m->arch;
    if (a == NULL || !(f->flags & CKPTFS_FIELD_ARCH_HAS_IT))
        return false;
    return f->offset == M(qkv_bias)      ? a->qkv_bias
           : f->offset == M(qk_norm)     ? a->qk_norm
           : f->offset == M(renormalize) ? a->moe && a->moe->always_renormalize
           : f->offset == M(mla)         ? a->mla
           : f->offset == M(linear_bias) ? a->linear_biases
           : f->offset == M(sinks)       ? a->attention_sinks
                                         : false;
}

static bool deepseek_routing(const CkptfsModel *m)
{
    return m->arch && m->arch->moe && m->arch->moe->deepseek_config;
}

/* The name config.json gives F's value under when it leaves F out (Qwen3.5-MoE's ffn: its
 * expert's size), else NULL. */
static const char *fallback_key(const CkptfsModelField *f, const CkptfsModel *m)
{
    const CkptfsMoeConfig *moe = m->arch ? m->arch->moe : NULL;
    return (f->flags & CKPTFS_FIELD_EXPERT_FFN_FALLBACK) && moe && moe->ffn_from_expert ? moe->ffn_key : NULL;
}

/* Whether config.json's names of F are read for M: DeepSeek's routing fields only in DeepSeek's
 * configs, V3's groups only with sigmoid routing. */
static bool config_names_apply(const CkptfsModelField *f, const CkptfsModel *m)
{
    if ((f->flags & CKPTFS_FIELD_DEEPSEEK_ONLY) && !deepseek_routing(m))
        return false;
    return !(f->flags & CKPTFS_FIELD_SIGMOID_ONLY) || (m->arch && m->arch->moe && m->arch->moe->sigmoid_routing);
}

/* F from every name it has in CONFIG: the values given must agree. */
static bool read_config_field(JsonObject *config, const CkptfsModelField *f, CkptfsModel *m, GError **error)
{
    const char *names[G_N_ELEMENTS(f->hf) + 1];
    size_t n = 0;
    const char *own = arch_key(f, m);
    if (own)
        names[n++] = own;
    for (size_t i = 0; i < G_N_ELEMENTS(f->hf) && f->hf[i]; i++)
        if (own == NULL || strcmp(own, f->hf[i]) != 0)
            names[n++] = f->hf[i];
    const char *first = NULL;
    FieldValue chosen = {0};
    bool null_given = false;
    for (size_t i = 0; i < n; i++) {
        FieldValue v = {0};
        bool found = false;
        if (!config_value(config, f, names[i], m, &found, &v, error))
            return false;
        JsonNode *node = ckptfs_json_member(config, names[i]);
        null_given = null_given || (node != NULL && JSON_NODE_HOLDS_NULL(node));
        if (!found)
            continue;
        /* rope types by meaning: a VLM's "mrope" has the default frequencies */
        bool same_text = !first || !v.text || f->type == CKPTFS_FIELD_ROPE_TYPE || strcmp(v.text, chosen.text) == 0;
        if (first && (v.number != chosen.number || !same_text)) {
            if (v.text)
                REFUSE("%s '%s' and %s '%s' disagree", first, chosen.text, names[i], v.text);
            REFUSE("%s %g and %s %g disagree", first, chosen.number, names[i], v.number);
        }
        if (first == NULL)
            first = names[i], chosen = v;
    }
    const char *fallback = first ? NULL : fallback_key(f, m);
    if (fallback) {
        bool found = false;
        if (!config_value(config, f, fallback, m, &found, &chosen, error))
            return false;
        first = found ? fallback : NULL;
    }
    if (first == NULL) {
        if ((f->flags & CKPTFS_FIELD_REQUIRED) && fallback)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "config.json: missing \"%s\" and \"%s\", which "
                               "the Megatron views need", names[0], fallback);
        if (f->flags & CKPTFS_FIELD_REQUIRED)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "config.json: missing \"%s\", which the Megatron "
                               "views need", n ? names[0] : f->field);
        if ((f->flags & CKPTFS_FIELD_DEEPSEEK_REQUIRED) && deepseek_routing(m) && !null_given)
            REFUSE("\"%s\" is missing; %s routing needs it given", names[0], m->arch->hf_architecture);
        chosen.number = default_of(f, m, false, null_given);
    }
    double arch_value = default_of(f, m, false, false);
    if ((f->flags & CKPTFS_FIELD_ARCH_FIXED) && chosen.number != arch_value)
        REFUSE("%s \"%s\" is not supported for %s (%s is)", first, chosen.text, m->arch->hf_architecture,
               f->choice[arch_value != 0]);
    if ((f->flags & CKPTFS_FIELD_TIMES_EXPERT_FFN) && chosen.number > f->max)
        REFUSE("%s %g is over the limit of %g", first, chosen.number, f->max);
    if (f->flags & CKPTFS_FIELD_TIMES_EXPERT_FFN)
        chosen.number *= (double)m->moe_ffn;
    if ((f->flags & CKPTFS_FIELD_DEFAULT_AS_ZERO) && chosen.number == f->hf_default)
        chosen.number = 0;
    if ((f->flags & CKPTFS_FIELD_ARGS_INTEGER) && chosen.number != (double)(int64_t)chosen.number)
        REFUSE("%s %g has no Megatron equivalent: %s is an integer", first, chosen.number, f->args);
    if (fixed_for(f, m) && chosen.number != f->hf_default && f->type == CKPTFS_FIELD_BOOL)
        REFUSE("%s %s has no Megatron equivalent: the views serve only %s", first, chosen.number ? "true" : "false",
               f->hf_default ? "true" : "false");
    if (fixed_for(f, m) && chosen.number != f->hf_default && f->hf_default == 0) /* Gemma's soft-caps */
        REFUSE("%s %g has no Megatron equivalent: the Megatron model the views follow has none (only null or 0 "
               "is served)", first, chosen.number);
    if (fixed_for(f, m) && chosen.number != f->hf_default)
        REFUSE("%s %g has no Megatron equivalent: Megatron-core fixes it at %g", first, chosen.number,
               f->hf_default);
    if (f->type == CKPTFS_FIELD_BOOL && arch_has(f, m))
        chosen.number = 1; /* the architecture's own */
    store(f, m, chosen.number);
    return true;
}

/* The object that holds *NAME in CONFIG ("a.b": member b of object a, made on first use), *NAME
 * then the member's own name. */
static JsonObject *parent_object(JsonObject *config, const char **name)
{
    const char *dot = strchr(*name, '.');
    if (dot == NULL)
        return config;
    g_autofree char *parent = g_strndup(*name, (gsize)(dot - *name));
    JsonObject *into = ckptfs_json_member_object(config, parent);
    if (into == NULL) {
        into = json_object_new();
        json_object_set_object_member(config, parent, into);
    }
    *name = dot + 1;
    return into;
}

/* The rows a VLM's vision part is read and written by: its architecture's, else Qwen2.5-VL's. */
static CkptfsFieldScope vision_rows(const CkptfsModel *m)
{
    return m->arch && m->arch->vision_fields ? (CkptfsFieldScope)m->arch->vision_fields : CKPTFS_FOR_VISION;
}

bool ckptfs_schema_read_vision(JsonObject *config, CkptfsModel *m, GError **error)
{
    const char *part = m->arch ? m->arch->vision_part : NULL;
    JsonObject *vision = part ? ckptfs_json_member_object(config, part) : NULL;
    if (vision == NULL)
        REFUSE("no \"%s\" object: the vision tower's fields are missing", part ? part : "vision_config");
    CkptfsFieldScope rows = vision_rows(m);
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++)
        if (fields[i].scope == rows && !read_config_field(config, &fields[i], m, error))
            return false;
    g_autoptr(GList) members = json_object_get_members(vision);
    for (GList *k = members; k; k = k->next) {
        g_autofree char *path = g_strdup_printf("%s.%s", part, (const char *)k->data);
        bool known = m->arch->vision_blocks && strcmp(m->arch->vision_blocks->member, k->data) == 0;
        for (size_t i = 0; i < G_N_ELEMENTS(vision_members_unread) && !known; i++)
            known = strcmp(vision_members_unread[i], k->data) == 0;
        for (size_t i = 0; i < G_N_ELEMENTS(fields) && !known; i++)
            for (size_t n = 0; n < G_N_ELEMENTS(fields[i].hf) && fields[i].hf[n] && !known; n++)
                known = fields[i].scope == rows && strcmp(fields[i].hf[n], path) == 0;
        if (!known)
            REFUSE("%s is not understood: the vision tower's rules do not know what it changes", path);
    }
    return true;
}

void ckptfs_schema_write_vision(const CkptfsModel *m, JsonObject *config)
{
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        if (f->scope != vision_rows(m))
            continue;
        const char *name = f->hf[0];
        JsonObject *into = parent_object(config, &name);
        /* a whole number as an integer: transformers 5 takes tokens_per_second as an int only */
        if (f->type == CKPTFS_FIELD_ACTIVATION)
            json_object_set_string_member(into, name, activation_of(m, f));
        else if (f->type == CKPTFS_FIELD_BOOL) /* transformers' strict configs take no 0 for false */
            json_object_set_boolean_member(into, name, load(f, m) != 0);
        else if (f->type == CKPTFS_FIELD_FLOAT && load(f, m) != (double)(gint64)load(f, m))
            json_object_set_double_member(into, name, load(f, m));
        else
            json_object_set_int_member(into, name, (gint64)load(f, m));
    }
}

bool ckptfs_schema_read_config(JsonObject *config, CkptfsModel *m, GError **error)
{
    m->token_ids_known = true;
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        if (!ckptfs_schema_applies(f, m))
            continue;
        if (!config_names_apply(f, m)) {
            /* another MoE's config with a DeepSeek routing field: its rules route otherwise */
            for (size_t k = 0; (f->flags & CKPTFS_FIELD_DEEPSEEK_ONLY) && !deepseek_routing(m) &&
                               k < G_N_ELEMENTS(f->hf) && f->hf[k]; k++)
                if (ckptfs_json_member(config, f->hf[k]) != NULL)
                    REFUSE("\"%s\" is set: %s routing with it is not supported", f->hf[k],
                           m->arch->hf_architecture);
            continue;
        }
        bool ok = f->type == CKPTFS_FIELD_WINDOW     ? check_window(config, m, error)
                  : f->type == CKPTFS_FIELD_TOKEN_ID ? read_config_token_ids(config, f, m, error)
                                                     : read_config_field(config, f, m, error);
        if (!ok)
            return false;
    }
    if (m->mla) /* what Megatron's kv_channels means for MLA: the width linear_proj reads per head */
        m->head_dim = m->v_head_dim;
    return check_rope_members(config, m, error);
}

/* --- walk 2: config.json written --- */

/* A token id as it was given; null when unknown. */
static void write_config_token_ids(JsonObject *config, const char *name, const CkptfsTokenIds *t, bool known)
{
    if (!known || t->form == CKPTFS_TOKEN_NULL) {
        json_object_set_null_member(config, name);
    } else if (t->form == CKPTFS_TOKEN_ONE) {
        json_object_set_int_member(config, name, t->ids[0]);
    } else if (t->form == CKPTFS_TOKEN_LIST) {
        JsonArray *list = json_array_new();
        for (unsigned i = 0; i < t->count; i++)
            json_array_add_int_element(list, t->ids[i]);
        json_object_set_array_member(config, name, list);
    }
}

void ckptfs_schema_write_config(const CkptfsModel *m, JsonObject *config)
{
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        const char *name = arch_key(f, m) ? arch_key(f, m) : f->hf[0];
        if (f->type == CKPTFS_FIELD_TOKEN_ID) {
            write_config_token_ids(config, name, token_ids_of(f, m), m->token_ids_known);
            continue;
        }
        if (f->type == CKPTFS_FIELD_WINDOW && m->window > 0) { /* GPT-OSS's, and its layer pattern */
            JsonArray *types = json_array_new();
            for (uint64_t l = 0; l < m->layers; l++)
                json_array_add_string_element(types, (l + 1) % m->window_skip_freq ? "sliding_attention"
                                                                                    : "full_attention");
            json_object_set_int_member(config, name, (gint64)m->window);
            json_object_set_array_member(config, "layer_types", types);
            continue;
        }
        if (f->type == CKPTFS_FIELD_WINDOW) {
            /* none, said where transformers' default for the architecture is a window (Mistral) */
            if (m->arch && m->arch->sliding_window > 0)
                json_object_set_null_member(config, name);
            continue;
        }
        double v = load(f, m);
        if (name == NULL || !ckptfs_schema_applies(f, m))
            continue;
        if (arch_has(f, m))
            continue; /* Qwen2's config has no attention_bias: its biases come with it */
        if ((f->flags & CKPTFS_FIELD_DEEPSEEK_ONLY) && !deepseek_routing(m))
            continue;
        if ((f->flags & CKPTFS_FIELD_OMIT_ZERO) && v == 0)
            continue;
        if ((f->flags & CKPTFS_FIELD_OMIT_DEFAULT) && v == f->hf_default)
            continue;
        if (fallback_key(f, m) && v == (double)m->moe_ffn)
            continue; /* the release's config has no intermediate_size: it reads back the same */
        if (f->flags & CKPTFS_FIELD_TIMES_EXPERT_FFN)
            v = m->moe_ffn ? v / (double)m->moe_ffn : 0;
        if ((f->flags & (CKPTFS_FIELD_DEFAULT_AS_ZERO | CKPTFS_FIELD_ZERO_AS_DEFAULT)) && v == 0)
            v = f->hf_default;
        if (fixed_for(f, m) && f->scope == CKPTFS_FOR_ALL)
            continue; /* its one value, which transformers takes too */
        if (f->type == CKPTFS_FIELD_ROPE_TYPE && v == CKPTFS_ROPE_DEFAULT)
            continue; /* no rope_scaling at all */
        /* a member of rope_scaling: the object made on first use */
        JsonObject *into = parent_object(config, &name);
        switch (f->type) {
        case CKPTFS_FIELD_UINT:
            json_object_set_int_member(into, name, (gint64)v);
            break;
        case CKPTFS_FIELD_COUNT:
            if (v == 0 && (f->flags & CKPTFS_FIELD_NULL_WHEN_ZERO))
                json_object_set_null_member(into, name);
            else
                json_object_set_int_member(into, name, (gint64)v);
            break;
        case CKPTFS_FIELD_FLOAT: /* Gemma's soft-capping: null is none, 0 would divide by it */
            if (v == 0 && (f->flags & CKPTFS_FIELD_NULL_WHEN_ZERO))
                json_object_set_null_member(into, name);
            else if ((f->flags & CKPTFS_FIELD_HF_INTEGER) && v == (double)(gint64)v)
                json_object_set_int_member(into, name, (gint64)v);
            else
                json_object_set_double_member(into, name, v);
            break;
        case CKPTFS_FIELD_BOOL:
            if (f->choice[0])
                json_object_set_string_member(into, name, f->choice[v != 0]);
            else
                json_object_set_boolean_member(into, name, v != 0);
            break;
        case CKPTFS_FIELD_ROPE_TYPE:
            /* "type" too: DeepSeek's own modeling code reads that one */
            json_object_set_string_member(into, name, rope_type_names[(int)v]);
            json_object_set_string_member(into, "type", rope_type_names[(int)v]);
            break;
        case CKPTFS_FIELD_ACTIVATION: /* Gemma's config reads its own name, the row's second */
            json_object_set_string_member(into, !f->choice[0] && m->arch && m->arch->activation ? f->hf[1] : name,
                                          activation_of(m, f));
            break;
        case CKPTFS_FIELD_WINDOW:
        case CKPTFS_FIELD_TOKEN_ID:
            break;
        }
    }
}

/* --- walk 3: Megatron args --- */

#define ARGS_ERROR(...) return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, __VA_ARGS__)

/* The argument of F in ARGS (its older name when the first is absent), NULL when absent or None. */
static const CkptfsPy *args_value(const CkptfsPy *args, const CkptfsModelField *f)
{
    const CkptfsPy *v = ckptfs_py_dict_get(args, f->args);
    if ((v == NULL || v->kind == CKPTFS_PY_NONE) && f->args_old)
        v = ckptfs_py_dict_get(args, f->args_old);
    return v && v->kind != CKPTFS_PY_NONE ? v : NULL;
}

/* A token id the views' args carry (in their dict under config.json's name): absent from it,
 * None, an int or a list of ints. */
static bool read_args_token_ids(const CkptfsPy *args, const char *path, const CkptfsModelField *f, CkptfsModel *m,
                                GError **error)
{
    CkptfsTokenIds *t = (CkptfsTokenIds *)(void *)((char *)m + f->offset);
    const CkptfsPy *dict = ckptfs_py_dict_get(args, f->args);
    const CkptfsPy *v = ckptfs_py_dict_get(dict, f->hf[0]);
    memset(t, 0, sizeof *t);
    if (dict == NULL || dict->kind == CKPTFS_PY_NONE)
        return true; /* none carried: m->token_ids_known stays false */
    if (dict->kind != CKPTFS_PY_DICT)
        ARGS_ERROR("%s: args.%s is not a dict of token ids", path, f->args);
    m->token_ids_known = true;
    if (v == NULL)
        return true;
    if (v->kind == CKPTFS_PY_NONE) {
        t->form = CKPTFS_TOKEN_NULL;
        return true;
    }
    bool one = v->kind == CKPTFS_PY_INT;
    guint n = one ? 1 : v->kind == CKPTFS_PY_LIST ? v->items->len : 0;
    if (!one && v->kind != CKPTFS_PY_LIST)
        ARGS_ERROR("%s: args.%s['%s'] is not a token id, a list of them or None", path, f->args, f->hf[0]);
    if (n > CKPTFS_MAX_TOKEN_IDS)
        ARGS_ERROR("%s: args.%s['%s'] lists %u ids, more than %u", path, f->args, f->hf[0], n, CKPTFS_MAX_TOKEN_IDS);
    t->form = one ? CKPTFS_TOKEN_ONE : CKPTFS_TOKEN_LIST;
    for (guint i = 0; i < n; i++, t->count++) {
        const CkptfsPy *id = one ? v : g_ptr_array_index(v->items, i);
        if (id->kind != CKPTFS_PY_INT || id->big)
            ARGS_ERROR("%s: args.%s['%s'] entry %u is not a token id", path, f->args, f->hf[0], i);
        t->ids[i] = id->i;
    }
    return true;
}

/* Megatron's window: none (window_size None), or (W - 1, 0) on all layers but every
 * window_attn_skip_freq-th (GPT-OSS's form; the architecture checks the frequency). */
static bool read_args_window(const CkptfsPy *args, const char *path, CkptfsModel *m, GError **error)
{
    const CkptfsPy *size = ckptfs_py_dict_get(args, "window_size");
    const CkptfsPy *freq = ckptfs_py_dict_get(args, "window_attn_skip_freq");
    if (size == NULL || size->kind == CKPTFS_PY_NONE)
        return true;
    const CkptfsPy *left = (size->kind == CKPTFS_PY_TUPLE || size->kind == CKPTFS_PY_LIST) && size->items->len == 2
                               ? g_ptr_array_index(size->items, 0) : NULL;
    const CkptfsPy *right = left ? g_ptr_array_index(size->items, 1) : NULL;
    if (left == NULL || left->kind != CKPTFS_PY_INT || left->big || left->i < 0 || right->kind != CKPTFS_PY_INT ||
        right->i != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.window_size is not (W, 0) with W from 0: "
                           "no transformers equivalent", path);
    if (freq == NULL || freq->kind != CKPTFS_PY_INT || freq->big || freq->i < 2)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.window_size without an integer "
                           "window_attn_skip_freq from 2 (full-attention layers among the sliding ones)", path);
    m->window = (uint64_t)left->i + 1, m->window_skip_freq = (uint64_t)freq->i;
    return true;
}

static bool read_args_field(const CkptfsPy *args, const char *path, const CkptfsModelField *f, CkptfsModel *m,
                            GError **error)
{
    if (f->type == CKPTFS_FIELD_TOKEN_ID)
        return read_args_token_ids(args, path, f, m, error);
    const CkptfsPy *v = f->args ? args_value(args, f) : NULL;
    double value = default_of(f, m, true, false);
    if (f->type == CKPTFS_FIELD_ACTIVATION) {
        /* SwiGLU, or GPT-OSS's GLU: quick-GELU clamped (its clamp a row of its own), 1 added to
         * the linear half */
        const CkptfsPy *quick = ckptfs_py_dict_get(args, "quick_geglu");
        const CkptfsPy *offset = ckptfs_py_dict_get(args, "glu_linear_offset");
        bool swiglu = v != NULL && v->kind == CKPTFS_PY_BOOL && v->i;
        bool geglu = !swiglu && quick && quick->kind == CKPTFS_PY_BOOL && quick->i && offset &&
                     offset->kind == CKPTFS_PY_FLOAT && offset->f == 1.0;
        /* Gemma 3's: the gated tanh GELU (gated_linear_unit with openai_gelu) */
        const CkptfsPy *gated = ckptfs_py_dict_get(args, "gated_linear_unit");
        const CkptfsPy *tanh_gelu = ckptfs_py_dict_get(args, "openai_gelu");
        bool gelu_glu = !swiglu && gated && gated->kind == CKPTFS_PY_BOOL && gated->i && tanh_gelu &&
                        tanh_gelu->kind == CKPTFS_PY_BOOL && tanh_gelu->i;
        const char *wanted = m->arch ? m->arch->activation : NULL; /* NULL: SwiGLU or GPT-OSS's GLU */
        if (wanted && !gelu_glu)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.gated_linear_unit and args.openai_gelu "
                               "are not both true (with swiglu false): %s's MLP is the gated tanh GELU (%s)", path,
                               m->arch->hf_architecture, wanted);
        if (gelu_glu && m->arch && !wanted)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.gated_linear_unit with openai_gelu (the "
                               "gated tanh GELU): %s's MLP is SwiGLU", path, m->arch->hf_architecture);
        if (gelu_glu) /* no architecture yet: checked once one is picked (ckptfs_schema_read_args_for_arch) */
            return true;
        if (!swiglu && !geglu)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.swiglu is not true and args.quick_geglu "
                               "is not true with glu_linear_offset 1.0, nor gated_linear_unit with openai_gelu; only "
                               "SwiGLU, GPT-OSS's GLU and Gemma's gated tanh GELU are supported", path);
        if (geglu && !(ckptfs_py_dict_get(args, "activation_func_clamp_value") &&
                       ckptfs_py_dict_get(args, "activation_func_clamp_value")->kind == CKPTFS_PY_FLOAT))
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.quick_geglu without "
                               "activation_func_clamp_value: GPT-OSS's GLU is clamped", path);
        return true;
    }
    if (f->type == CKPTFS_FIELD_WINDOW)
        return read_args_window(args, path, m, error);
    if (f->type == CKPTFS_FIELD_ROPE_TYPE)
        return true; /* read first */
    if (f->args == NULL) {
        if (!(f->flags & CKPTFS_FIELD_TIMES_EXPERT_FFN)) /* the shared experts' width is args' own */
            store(f, m, value); /* what Megatron fixes */
        return true;
    }
    if (v == NULL) {
        if ((f->flags & CKPTFS_FIELD_REQUIRED) && !(f->flags & CKPTFS_FIELD_ARGS_OPTIONAL) && f->args_default == 0 &&
            f->derived == CKPTFS_DERIVED_NONE)
            ARGS_ERROR("%s: args.%s is missing or not a positive integer", path, f->args);
        if (f->flags & CKPTFS_FIELD_ARGS_REQUIRED)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s is missing: %s computes with it and "
                               "Megatron has no default for it", path, f->args, m->arch->hf_architecture);
    } else if (f->type == CKPTFS_FIELD_UINT || f->type == CKPTFS_FIELD_COUNT) {
        if (v->kind != CKPTFS_PY_INT || v->big || v->i < (f->type == CKPTFS_FIELD_UINT))
            ARGS_ERROR("%s: args.%s is missing or not %s", path, f->args,
                       f->type == CKPTFS_FIELD_UINT ? "a positive integer" : "an integer from 0");
        value = (double)v->i;
    } else if (f->type == CKPTFS_FIELD_FLOAT) {
        if (v->kind != CKPTFS_PY_FLOAT && v->kind != CKPTFS_PY_INT)
            ARGS_ERROR("%s: args.%s is not a number", path, f->args);
        value = v->kind == CKPTFS_PY_FLOAT ? v->f : (double)v->i;
        if (!(value > f->min && value <= f->max))
            ARGS_ERROR("%s: args.%s %g is out of range (%g, %g]", path, f->args, value, f->min, f->max);
    } else if (f->type == CKPTFS_FIELD_BOOL && (f->flags & CKPTFS_FIELD_ARGS_CHOICE)) {
        const char *name = ckptfs_py_str(v);
        if (name == NULL)
            ARGS_ERROR("%s: args.%s is not a name", path, f->args);
        if (strcmp(name, f->choice[0]) != 0 && strcmp(name, f->choice[1]) != 0)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s is '%s'; %s and %s are supported", path,
                               f->args, name, f->choice[0], f->choice[1]);
        value = strcmp(name, f->choice[1]) == 0;
    } else if (f->type == CKPTFS_FIELD_BOOL) {
        if (v->kind != CKPTFS_PY_BOOL)
            ARGS_ERROR("%s: args.%s is not True or False", path, f->args);
        value = (v->i != 0) != ((f->flags & CKPTFS_FIELD_ARGS_NEGATED) != 0);
    }
    if ((f->flags & CKPTFS_FIELD_DEFAULT_AS_ZERO) && value == f->hf_default)
        value = 0;
    if (fixed_for(f, m) && value != f->args_default)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s %g: ckptfs serves only %g", path, f->args,
                           value, f->args_default);
    store(f, m, value);
    return true;
}

static bool args_flag(const CkptfsPy *args, const char *key)
{
    const CkptfsPy *v = ckptfs_py_dict_get(args, key);
    return v && v->kind == CKPTFS_PY_BOOL && v->i;
}

bool ckptfs_schema_read_args(const CkptfsPy *args, const char *path, CkptfsModel *m, GError **error)
{
    /* What says which rows apply: experts, multi-latent attention, the rope's scaling. */
    const CkptfsPy *experts = ckptfs_py_dict_get(args, "num_experts");
    m->mla = args_flag(args, "multi_latent_attention");
    m->experts = experts && experts->kind != CKPTFS_PY_NONE; /* its count read with the row */
    const char *variant = ckptfs_py_str(ckptfs_py_dict_get(args, "experimental_attention_variant"));
    m->linear_attention = variant != NULL && strcmp(variant, "gated_delta_net") == 0;
    const char *rope = ckptfs_py_str(ckptfs_py_dict_get(args, "rope_type"));
    const char *rope_position = ckptfs_py_str(ckptfs_py_dict_get(args, "position_embedding_type"));
    const CkptfsPy *interpolation = ckptfs_py_dict_get(args, "rotary_seq_len_interpolation_factor");
    bool interpolated = interpolation != NULL && interpolation->kind != CKPTFS_PY_NONE;
    if (interpolated && (m->mla || args_flag(args, "use_rope_scaling") ||
                         (rope_position != NULL && strcmp(rope_position, "yarn") == 0)))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.rotary_seq_len_interpolation_factor with "
                           "another rope scaling: no Hugging Face equivalent", path);
    if (m->mla) /* Megatron's MLA takes YaRN unless told rope */
        m->rope_type = rope == NULL || strcmp(rope, "yarn") == 0 ? CKPTFS_ROPE_YARN : CKPTFS_ROPE_DEFAULT;
    else if (rope_position == NULL || strcmp(rope_position, "yarn") != 0)
        m->rope_type = args_flag(args, "use_rope_scaling") ? CKPTFS_ROPE_LLAMA3
                       : interpolated ? CKPTFS_ROPE_LINEAR /* the architecture says whether it has one */
                                      : CKPTFS_ROPE_DEFAULT;
    else /* GPT-OSS's YaRN for q/k/v attention */
        m->rope_type = CKPTFS_ROPE_YARN;
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        if (!ckptfs_schema_applies(f, m))
            continue;
        if (f->derived == CKPTFS_DERIVED_HEADS && !args_flag(args, "group_query_attention")) {
            m->kv_heads = m->heads;
            continue;
        }
        if (!read_args_field(args, path, f, m, error))
            return false;
    }
    if (m->mla)
        m->head_dim = m->v_head_dim;
    return true;
}

/* Whether F applies only where an architecture says so (its rows are then read once one is picked). */
static bool needs_arch(const CkptfsModelField *f)
{
    return f->scope == CKPTFS_FOR_GEMMA_ATTENTION;
}

bool ckptfs_schema_read_args_for_arch(const CkptfsPy *args, const char *path, CkptfsModel *m, GError **error)
{
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        bool again = f->type == CKPTFS_FIELD_ACTIVATION && f->scope == CKPTFS_FOR_ALL;
        if ((again || needs_arch(f)) && ckptfs_schema_applies(f, m) && !read_args_field(args, path, f, m, error))
            return false;
    }
    return true;
}

/* --- walk 4: Megatron args written --- */

/* A token id known from a config.json into the dict of them (made with the first); an absent
 * one is left out of it, as it was of config.json. */
static void write_args_token_ids(const CkptfsModelField *f, const CkptfsModel *m, CkptfsValue *a,
                                 CkptfsValue **dict)
{
    const CkptfsTokenIds *t = token_ids_of(f, m);
    if (!m->token_ids_known)
        return;
    if (*dict == NULL) {
        *dict = ckptfs_value_container(CKPTFS_VALUE_DICT);
        ckptfs_value_set(a, f->args, *dict);
    }
    if (t->form == CKPTFS_TOKEN_ABSENT)
        return;
    CkptfsValue *v = t->form == CKPTFS_TOKEN_NULL ? ckptfs_value_none()
                     : t->form == CKPTFS_TOKEN_ONE ? ckptfs_value_int(t->ids[0])
                                                   : ckptfs_value_container(CKPTFS_VALUE_LIST);
    for (unsigned i = 0; t->form == CKPTFS_TOKEN_LIST && i < t->count; i++)
        ckptfs_value_append(v, ckptfs_value_int(t->ids[i]));
    ckptfs_value_set(*dict, f->hf[0], v);
}

void ckptfs_schema_write_args(const CkptfsModel *m, CkptfsValue *a)
{
    CkptfsValue *token_ids = NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const CkptfsModelField *f = &fields[i];
        if (f->args == NULL)
            continue;
        if (f->type == CKPTFS_FIELD_TOKEN_ID) {
            write_args_token_ids(f, m, a, &token_ids);
            continue;
        }
        if (f->type == CKPTFS_FIELD_ACTIVATION) { /* SwiGLU, GPT-OSS's clamped quick-GELU GLU, Gemma's GeGLU */
            bool gelu = m->arch && m->arch->activation;
            ckptfs_value_set(a, f->args, ckptfs_value_bool(m->glu_clamp == 0 && !gelu));
            if (gelu) /* Megatron-Bridge's fast_gelu: openai_gelu's tanh GELU, gated */
                ckptfs_value_set(a, "gated_linear_unit", ckptfs_value_bool(true)),
                    ckptfs_value_set(a, "openai_gelu", ckptfs_value_bool(true));
            ckptfs_value_set(a, "quick_geglu", ckptfs_value_bool(m->glu_clamp != 0));
            ckptfs_value_set(a, "glu_linear_offset", ckptfs_value_float(m->glu_clamp != 0 ? 1.0 : 0.0));
            continue;
        }
        /* kv_channels: for MLA, the per-head width linear_proj reads (the value head's) */
        bool has = ckptfs_schema_applies(f, m) || f->offset == M(head_dim);
        /* the rope scaling Megatron has for this attention, unused: its defaults, said explicitly */
        bool unused_scaling = f->scope == CKPTFS_FOR_LLAMA3 || (f->scope == CKPTFS_FOR_YARN && m->mla);
        if (!has && !unused_scaling)
            continue;
        double v = has ? load(f, m) : f->args_default;
        if ((f->flags & (CKPTFS_FIELD_DEFAULT_AS_ZERO | CKPTFS_FIELD_ZERO_AS_DEFAULT)) && v == 0) {
            ckptfs_value_set(a, f->args, ckptfs_value_none()); /* Megatron's "not set" */
            continue;
        }
        switch (f->type) {
        case CKPTFS_FIELD_UINT:
            ckptfs_value_set(a, f->args, ckptfs_value_int((int64_t)v));
            break;
        case CKPTFS_FIELD_COUNT:
            ckptfs_value_set(a, f->args, v == 0 && (f->flags & CKPTFS_FIELD_NULL_WHEN_ZERO)
                                             ? ckptfs_value_none()
                                             : ckptfs_value_int((int64_t)v));
            break;
        case CKPTFS_FIELD_FLOAT:
            ckptfs_value_set(a, f->args, (f->flags & CKPTFS_FIELD_ARGS_INTEGER) ? ckptfs_value_int((int64_t)v)
                                                                                 : ckptfs_value_float(v));
            break;
        case CKPTFS_FIELD_BOOL:
            if (f->flags & CKPTFS_FIELD_ARGS_CHOICE)
                ckptfs_value_set(a, f->args, ckptfs_value_str(f->choice[v != 0]));
            else
                ckptfs_value_set(a, f->args,
                                 ckptfs_value_bool((v != 0) != ((f->flags & CKPTFS_FIELD_ARGS_NEGATED) != 0)));
            break;
        default:
            break;
        }
    }
    if (m->window > 0) { /* GPT-OSS's: (W - 1, 0), full attention every window_attn_skip_freq-th layer */
        uint64_t size[2] = {m->window - 1, 0};
        ckptfs_value_set(a, "window_size", ckptfs_value_int_tuple(size, 2));
        ckptfs_value_set(a, "window_attn_skip_freq", ckptfs_value_int((int64_t)m->window_skip_freq));
    }
    if (m->arch && m->arch->gemma_attention) /* Megatron-core's TransformerConfig.softmax_scale */
        ckptfs_value_set(a, "softmax_scale", ckptfs_value_float(1.0 / sqrt(m->query_pre_attn_scalar)));
    if (m->arch && m->arch->scaled_embedding) /* mbridge's Gemma3TransformerConfig.embed_scale */
        ckptfs_value_set(a, "embed_scale", ckptfs_value_float(sqrt((double)m->hidden)));
    ckptfs_value_set(a, "group_query_attention", ckptfs_value_bool(m->kv_heads != m->heads));
    ckptfs_value_set(a, "use_rope_scaling", ckptfs_value_bool(m->rope_type == CKPTFS_ROPE_LLAMA3));
    if (m->mla)
        ckptfs_value_set(a, "rope_type", ckptfs_value_str(m->rope_type == CKPTFS_ROPE_YARN ? "yarn" : "rope"));
}
