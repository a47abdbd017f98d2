/* The mapping tables. Rows are in Megatron-core's module order, which is the order of keys in
 * a torch_dist checkpoint; the order columns give a legacy state dict's order for each spec
 * (Transformer Engine fuses the pre-attention and pre-MLP norms into the next linear layer and
 * adds _extra_state entries for its attention and q/k norms). Rules of dense-MLP and MoE
 * layers share order numbers: a layer holds one kind or the other. */
#include "ckptfs/mapping.h"

#include <glib.h>
#include <string.h>

#define NONE CKPTFS_ABSENT

/* A weight of one layer: its names, legacy orders (TE, local), when it exists, its shape in
 * model dimensions, its TP split and its recipe of HF tensors. */
#define WEIGHT(name_, local_, te_at, local_at, need_, ndim_, rows_, cols_, split_, recipe_, ...)  \
    {CKPTFS_SCOPE_LAYER, false, false, name_, local_, NULL, te_at, local_at, need_, ndim_,      \
     rows_, cols_, split_, recipe_, {__VA_ARGS__}, NULL, false, false, NULL}
/* The same, one per routed expert. */
#define EXPERT_WEIGHT(name_, te_at, local_at, rows_, cols_, split_, recipe_, ...)              \
    {CKPTFS_SCOPE_LAYER, false, true, name_, NULL, NULL, te_at, local_at, CKPTFS_NEED_MOE, 2,  \
     rows_, cols_, split_, recipe_, {__VA_ARGS__}, NULL, false, false, NULL}

/* Entries every GPT family shares around the attention and MLP projections. */
#define EMBEDDING                                                                             \
    {CKPTFS_SCOPE_FIRST, false, false, "embedding.word_embeddings.weight", NULL, NULL, 0, 0,  \
     CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_VOCAB, CKPTFS_DIM_HIDDEN, CKPTFS_TP_VOCAB,              \
     CKPTFS_RECIPE_WHOLE, {"model.embed_tokens.weight"}, NULL, false, false, NULL}
#define LAYER_NORM(name_, local_, te_at, local_at, need_, hf_)                                 \
    WEIGHT(name_, local_, te_at, local_at, need_, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,          \
           CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, hf_)
#define INPUT_NORM                                                                            \
    LAYER_NORM("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight", 3, 0,  \
               CKPTFS_NEED_ALWAYS, "input_layernorm.weight")
#define QKV(need_, recipe_, ...)                                                              \
    WEIGHT("self_attention.linear_qkv.weight", NULL, 4, 3, need_, 2, CKPTFS_DIM_QKV,            \
           CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS, recipe_, __VA_ARGS__)
#define QKV_BIAS                                                                              \
    WEIGHT("self_attention.linear_qkv.bias", NULL, 5, 4, CKPTFS_NEED_QKV_BIAS, 1, CKPTFS_DIM_QKV, \
           CKPTFS_DIM_ONE, CKPTFS_TP_ROWS, CKPTFS_RECIPE_QKV, "self_attn.q_proj.bias",            \
           "self_attn.k_proj.bias", "self_attn.v_proj.bias")
#define QK_NORMS                                                                              \
    WEIGHT("self_attention.q_layernorm.weight", NULL, 7, 6, CKPTFS_NEED_QK_NORM, 1,              \
           CKPTFS_DIM_HEAD, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,            \
           "self_attn.q_norm.weight"),                                                         \
    WEIGHT("self_attention.k_layernorm.weight", NULL, 9, 7, CKPTFS_NEED_QK_NORM, 1,              \
           CKPTFS_DIM_HEAD, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,            \
           "self_attn.k_norm.weight")
#define EXTRA(scope_, name_, te_at, local_at, need_)                                           \
    {scope_, true, false, name_, NULL, NULL, te_at, local_at, need_, 0, CKPTFS_DIM_ONE,        \
     CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {NULL}, NULL, false, false, NULL}
#define EXPERT_EXTRA(name_, te_at, local_at)                                                  \
    {CKPTFS_SCOPE_LAYER, true, true, name_, NULL, NULL, te_at, local_at, CKPTFS_NEED_MOE, 0,   \
     CKPTFS_DIM_ONE, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {NULL}, NULL, false, false, NULL}
/* o_proj, and the norm before a dense MLP (fused into fc1 by Transformer Engine). */
#define ATTENTION_OUT_AND_MLP_NORM                                                            \
    WEIGHT("self_attention.linear_proj.weight", NULL, 1, 1, CKPTFS_NEED_ALWAYS, 2,              \
           CKPTFS_DIM_HIDDEN, CKPTFS_DIM_Q, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE,                 \
           "self_attn.o_proj.weight"),                                                         \
    LAYER_NORM("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight", 11, 8,          \
               CKPTFS_NEED_DENSE_MLP, "post_attention_layernorm.weight")
#define MLP_IN(recipe_, ...)                                                                  \
    WEIGHT("mlp.linear_fc1.weight", NULL, 12, 9, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_FFN2,     \
           CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, recipe_, __VA_ARGS__)
#define MLP_OUT                                                                               \
    WEIGHT("mlp.linear_fc2.weight", NULL, 14, 11, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_HIDDEN,  \
           CKPTFS_DIM_FFN, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "mlp.down_proj.weight")
#define DENSE_MLP                                                                             \
    MLP_IN(CKPTFS_RECIPE_HALVES, "mlp.gate_proj.weight", "mlp.up_proj.weight"), MLP_OUT

/* An MoE layer: its own pre-MLP norm (Megatron's local spec saves it under TE's fused name in
 * torch_dist), the router, the routed experts, the shared expert. */
#define MOE_NORM_AND_ROUTER(router_hf)                                                        \
    {CKPTFS_SCOPE_LAYER, false, false, "pre_mlp_layernorm.weight", NULL,                       \
     "mlp.linear_fc1.layer_norm_weight", 11, 8, CKPTFS_NEED_MOE, 1, CKPTFS_DIM_HIDDEN,         \
     CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,                                \
     {"post_attention_layernorm.weight"}, NULL, false, false, NULL},                                               \
    WEIGHT("mlp.router.weight", NULL, 13, 9, CKPTFS_NEED_MOE, 2, CKPTFS_DIM_EXPERTS,            \
           CKPTFS_DIM_HIDDEN, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, router_hf)
/* Experts' fc1 = [gate; up] and fc2, split by expert tensor parallelism. */
#define EXPERTS(gate_hf, up_hf, down_hf)                                                      \
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc1.weight", 14, 10, CKPTFS_DIM_MOE_FFN2,         \
                  CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, gate_hf, up_hf),  \
    EXPERT_EXTRA("mlp.experts.experts.linear_fc1._extra_state", 15, 11),                       \
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc2.weight", 16, 12, CKPTFS_DIM_HIDDEN,           \
                  CKPTFS_DIM_MOE_FFN, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, down_hf),             \
    EXPERT_EXTRA("mlp.experts.experts.linear_fc2._extra_state", 17, 13)
/* The shared experts' MLP, split by dense TP: fc1 = [gate; up] at legacy orders TE_AT, LOCAL_AT,
 * fc2 two after; HF_ is its module ("mlp.shared_expert" in Qwen, "mlp.shared_experts" in
 * DeepSeek and GLM). */
#define SHARED_EXPERT_MLP(te_at, local_at, hf_)                                                \
    WEIGHT("mlp.shared_experts.linear_fc1.weight", NULL, te_at, local_at, CKPTFS_NEED_SHARED_EXPERT, \
           2, CKPTFS_DIM_SHARED_FFN2, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, \
           hf_ ".gate_proj.weight", hf_ ".up_proj.weight"),                                    \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.shared_experts.linear_fc1._extra_state", te_at + 1, local_at + 1, \
          CKPTFS_NEED_SHARED_EXPERT),                                                           \
    WEIGHT("mlp.shared_experts.linear_fc2.weight", NULL, te_at + 2, local_at + 2,               \
           CKPTFS_NEED_SHARED_EXPERT, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_SHARED_FFN, CKPTFS_TP_COLS, \
           CKPTFS_RECIPE_WHOLE, hf_ ".down_proj.weight"),                                      \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.shared_experts.linear_fc2._extra_state", te_at + 3, local_at + 3, \
          CKPTFS_NEED_SHARED_EXPERT)
/* Qwen2-MoE's shared expert: its sigmoid gate [1, H] first (Megatron registers it first), then
 * its MLP. */
#define SHARED_EXPERT                                                                         \
    WEIGHT("mlp.shared_experts.gate_weight", NULL, 18, 14, CKPTFS_NEED_SHARED_GATE, 2,          \
           CKPTFS_DIM_ONE, CKPTFS_DIM_HIDDEN, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,          \
           "mlp.shared_expert_gate.weight"),                                                   \
    SHARED_EXPERT_MLP(19, 15, "mlp.shared_expert")
/* The router's expert bias (DeepSeek-V3's e_score_correction_bias): a persistent fp32 buffer,
 * after the router's weight in a legacy state dict (a buffer follows its module's parameters;
 * at the weight's order, the table's order decides). */
#define ROUTER_EXPERT_BIAS(te_at, local_at)                                                   \
    {CKPTFS_SCOPE_LAYER, false, false, "mlp.router.expert_bias", NULL, NULL, te_at, local_at,  \
     CKPTFS_NEED_EXPERT_BIAS, 1, CKPTFS_DIM_EXPERTS, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,      \
     CKPTFS_RECIPE_WHOLE, {"mlp.gate.e_score_correction_bias"}, NULL, true, false, NULL}

/* The layer's extra states (in the order mcore/ lists their objects) and the last stage. */
#define LAYER_EXTRAS_AND_LAST                                                                 \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_qkv._extra_state", 6, 5, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_proj._extra_state", 2, 2, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 13, 10, CKPTFS_NEED_DENSE_MLP),    \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 15, 12, CKPTFS_NEED_DENSE_MLP),    \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 0, NONE, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.q_layernorm._extra_state", 8, NONE, CKPTFS_NEED_QK_NORM), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.k_layernorm._extra_state", 10, NONE, CKPTFS_NEED_QK_NORM), \
    /* a Transformer Engine norm before the MoE block (TENorm carries FP8 state) */              \
    EXTRA(CKPTFS_SCOPE_LAYER, "pre_mlp_layernorm._extra_state", 12, NONE, CKPTFS_NEED_MOE),     \
    LAST_STAGE

/* The last stage's final norm and output layer. */
#define LAST_STAGE                                                                            \
    {CKPTFS_SCOPE_LAST, false, false, "decoder.final_layernorm.weight", NULL, NULL, 0, 0,      \
     CKPTFS_NEED_ALWAYS, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,           \
     CKPTFS_RECIPE_WHOLE, {"model.norm.weight"}, NULL, false, false, NULL},                                        \
    EXTRA(CKPTFS_SCOPE_LAST, "decoder.final_layernorm._extra_state", 1, NONE, CKPTFS_NEED_ALWAYS), \
    {CKPTFS_SCOPE_LAST, false, false, "output_layer.weight", NULL, NULL, 2, 1,                 \
     CKPTFS_NEED_OUTPUT, 2, CKPTFS_DIM_VOCAB, CKPTFS_DIM_HIDDEN, CKPTFS_TP_VOCAB,              \
     CKPTFS_RECIPE_WHOLE, {"lm_head.weight"}, "model.embed_tokens.weight", false, false, NULL},                    \
    EXTRA(CKPTFS_SCOPE_LAST, "output_layer._extra_state", 3, 2, CKPTFS_NEED_ALWAYS)

#define SEPARATE_QKV                                                                          \
    QKV(CKPTFS_NEED_ALWAYS, CKPTFS_RECIPE_QKV, "self_attn.q_proj.weight", "self_attn.k_proj.weight", \
        "self_attn.v_proj.weight"),                                                            \
    QKV_BIAS, QK_NORMS

static const CkptfsRule llama_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM, DENSE_MLP,
    LAYER_EXTRAS_AND_LAST,
};

/* Phi-3: the same Megatron entries, filled from fused Hugging Face projections. */
static const CkptfsRule phi3_rules[] = {
    EMBEDDING,
    INPUT_NORM,
    QKV(CKPTFS_NEED_ALWAYS, CKPTFS_RECIPE_QKV_FUSED, "self_attn.qkv_proj.weight"),
    ATTENTION_OUT_AND_MLP_NORM,
    MLP_IN(CKPTFS_RECIPE_HALVES_FUSED, "mlp.gate_up_proj.weight"),
    MLP_OUT,
    LAYER_EXTRAS_AND_LAST,
};

/* Mixtral: every layer is MoE; experts are w1 (gate), w3 (up), w2 (down). */
static const CkptfsRule mixtral_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM, DENSE_MLP,
    MOE_NORM_AND_ROUTER("block_sparse_moe.gate.weight"),
    EXPERTS("block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight",
            "block_sparse_moe.experts.{e}.w2.weight"),
    LAYER_EXTRAS_AND_LAST,
};

/* Qwen2-MoE and Qwen3-MoE: dense layers (mlp_only_layers, decoder_sparse_step) among MoE
 * layers; Qwen2-MoE adds a gated shared expert. */
static const CkptfsRule qwen_moe_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM, DENSE_MLP,
    MOE_NORM_AND_ROUTER("mlp.gate.weight"),
    EXPERTS("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
            "mlp.experts.{e}.down_proj.weight"),
    SHARED_EXPERT,
    LAYER_EXTRAS_AND_LAST,
};

/* DeepSeek-V2/V3: multi-head latent attention (Megatron's MLASelfAttention; the TE spec keeps
 * input_layernorm as a norm of its own and fuses the q/kv latent norms into the up
 * projections, the local spec keeps them as q_layernorm/kv_layernorm), the first layers dense,
 * then MoE layers with ungated shared experts and, in V3, a router expert bias. Legacy orders:
 * TransformerLayer registers input_layernorm, self_attention (core_attention, linear_proj, then
 * the q, kv projections and norms), pre_mlp_layernorm, mlp. Orders of the dense-MLP and MoE
 * rules overlap (a layer holds one kind), as do linear_q_proj and linear_q_down_proj. */
#define MLA_LINEAR(name_, te_at, local_at, need_, rows_, cols_, split_, local_rows_, hf_)       \
    {CKPTFS_SCOPE_LAYER, false, false, "self_attention." name_ ".weight", NULL, NULL, te_at,   \
     local_at, need_, 2, rows_, cols_, split_, CKPTFS_RECIPE_WHOLE, {"self_attn." hf_ ".weight"}, \
     NULL, false, local_rows_, NULL},                                                                 \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention." name_ "._extra_state", te_at + 1, local_at + 1, need_)
/* A latent norm: fused into the up projection in the TE spec, a module of its own locally. */
#define MLA_NORM(te_name, local_name_, te_at, local_at, need_, dim_, hf_)                       \
    {CKPTFS_SCOPE_LAYER, false, false, "self_attention." te_name, "self_attention." local_name_, \
     "self_attention." local_name_, te_at, local_at, need_, 1, dim_, CKPTFS_DIM_ONE,            \
     CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {"self_attn." hf_ ".weight"}, NULL, false, false, NULL}

/* A norm of a multi-token prediction layer (a TENorm with its _extra_state in the TE spec). */
#define MTP_NORM(scope_, name_, te_at, local_at, hf_)                                           \
    {scope_, false, false, name_ ".weight", NULL, NULL, te_at, local_at, CKPTFS_NEED_MTP, 1,      \
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {hf_}, NULL,   \
     false, false, NULL},                                                                              \
    EXTRA(scope_, name_ "._extra_state", te_at + 1, NONE, CKPTFS_NEED_MTP)

/* A multi-token prediction layer (names after "mtp.layers.N.", HF names after the family's MTP
 * prefix, mtp_hf_prefix): its norms of the embedding and of the hidden state, their projection
 * (column-parallel; EH_RECIPE says how the HF matrix's columns are ordered), the transformer
 * layer (the family's layer rules), and its final norm. Its embedding and head are the model's. */
#define MTP_LAYER_OF(enorm_hf, hnorm_hf, eh_recipe, eh_hf, final_hf)                            \
    MTP_NORM(CKPTFS_SCOPE_MTP_IN, "enorm", 0, 0, enorm_hf),                                     \
    MTP_NORM(CKPTFS_SCOPE_MTP_IN, "hnorm", 2, 1, hnorm_hf),                                     \
    {CKPTFS_SCOPE_MTP_IN, false, false, "eh_proj.weight", NULL, NULL, 4, 2, CKPTFS_NEED_MTP, 2, \
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN2, CKPTFS_TP_ROWS, eh_recipe, {eh_hf}, NULL, false, false, NULL}, \
    EXTRA(CKPTFS_SCOPE_MTP_IN, "eh_proj._extra_state", 5, 3, CKPTFS_NEED_MTP),                  \
    MTP_NORM(CKPTFS_SCOPE_MTP_OUT, "final_layernorm", 0, 0, final_hf)
/* DeepSeek-V3's (HF: model.layers.{layers + N}.): eh_proj as Megatron orders it. */
#define MTP_LAYER                                                                             \
    MTP_LAYER_OF("enorm.weight", "hnorm.weight", CKPTFS_RECIPE_WHOLE, "eh_proj.weight",        \
                 "shared_head.norm.weight")

static const CkptfsRule deepseek_rules[] = {
    EMBEDDING,
    {CKPTFS_SCOPE_LAYER, false, false, "input_layernorm.weight", NULL, NULL, 0, 0, CKPTFS_NEED_ALWAYS, 1,
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,
     {"input_layernorm.weight"}, NULL, false, false, NULL},
    EXTRA(CKPTFS_SCOPE_LAYER, "input_layernorm._extra_state", 1, NONE, CKPTFS_NEED_ALWAYS),
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 2, NONE, CKPTFS_NEED_ALWAYS),
    MLA_LINEAR("linear_proj", 3, 1, CKPTFS_NEED_ALWAYS, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_MLA_OUT,
               CKPTFS_TP_COLS, false, "o_proj"),
    MLA_LINEAR("linear_q_proj", 5, 3, CKPTFS_NEED_Q_DIRECT, CKPTFS_DIM_MLA_Q, CKPTFS_DIM_HIDDEN,
               CKPTFS_TP_ROWS, false, "q_proj"),
    MLA_LINEAR("linear_q_down_proj", 5, 3, CKPTFS_NEED_Q_LORA, CKPTFS_DIM_Q_LORA, CKPTFS_DIM_HIDDEN,
               CKPTFS_TP_REPLICATED, true, "q_a_proj"),
    MLA_NORM("linear_q_up_proj.layer_norm_weight", "q_layernorm.weight", 7, 11, CKPTFS_NEED_Q_LORA,
             CKPTFS_DIM_Q_LORA, "q_a_layernorm"),
    MLA_LINEAR("linear_q_up_proj", 8, 5, CKPTFS_NEED_Q_LORA, CKPTFS_DIM_MLA_Q, CKPTFS_DIM_Q_LORA,
               CKPTFS_TP_ROWS, false, "q_b_proj"),
    MLA_LINEAR("linear_kv_down_proj", 10, 7, CKPTFS_NEED_ALWAYS, CKPTFS_DIM_MLA_KV_DOWN,
               CKPTFS_DIM_HIDDEN, CKPTFS_TP_REPLICATED, true, "kv_a_proj_with_mqa"),
    MLA_NORM("linear_kv_up_proj.layer_norm_weight", "kv_layernorm.weight", 12, 12, CKPTFS_NEED_ALWAYS,
             CKPTFS_DIM_KV_LORA, "kv_a_layernorm"),
    MLA_LINEAR("linear_kv_up_proj", 13, 9, CKPTFS_NEED_ALWAYS, CKPTFS_DIM_MLA_KV_UP, CKPTFS_DIM_KV_LORA,
               CKPTFS_TP_ROWS, false, "kv_b_proj"),
    /* A dense layer: the TE spec fuses its norm into fc1; the MLA local spec keeps
     * pre_mlp_layernorm under that name in torch_dist too (no keys map). */
    {CKPTFS_SCOPE_LAYER, false, false, "mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight",
     "pre_mlp_layernorm.weight", 15, 13, CKPTFS_NEED_DENSE_MLP, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
     CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {"post_attention_layernorm.weight"}, NULL, false, false, NULL},
    WEIGHT("mlp.linear_fc1.weight", NULL, 16, 14, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_FFN2,
           CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, "mlp.gate_proj.weight",
           "mlp.up_proj.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 17, 15, CKPTFS_NEED_DENSE_MLP),
    WEIGHT("mlp.linear_fc2.weight", NULL, 18, 16, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_HIDDEN,
           CKPTFS_DIM_FFN, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "mlp.down_proj.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 19, 17, CKPTFS_NEED_DENSE_MLP),
    /* An MoE layer: its norm, the router (weight, then the persistent fp32 expert_bias
     * buffer), routed experts, shared experts without a gate. */
    LAYER_NORM("pre_mlp_layernorm.weight", NULL, 15, 13, CKPTFS_NEED_MOE, "post_attention_layernorm.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "pre_mlp_layernorm._extra_state", 16, NONE, CKPTFS_NEED_MOE),
    WEIGHT("mlp.router.weight", NULL, 17, 14, CKPTFS_NEED_MOE, 2, CKPTFS_DIM_EXPERTS, CKPTFS_DIM_HIDDEN,
           CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "mlp.gate.weight"),
    ROUTER_EXPERT_BIAS(18, 15),
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc1.weight", 19, 16, CKPTFS_DIM_MOE_FFN2, CKPTFS_DIM_HIDDEN,
                  CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, "mlp.experts.{e}.gate_proj.weight",
                  "mlp.experts.{e}.up_proj.weight"),
    EXPERT_EXTRA("mlp.experts.experts.linear_fc1._extra_state", 20, 17),
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc2.weight", 21, 18, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_MOE_FFN,
                  CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "mlp.experts.{e}.down_proj.weight"),
    EXPERT_EXTRA("mlp.experts.experts.linear_fc2._extra_state", 22, 19),
    SHARED_EXPERT_MLP(23, 20, "mlp.shared_experts"),
    /* The last stage */
    {CKPTFS_SCOPE_LAST, false, false, "decoder.final_layernorm.weight", NULL, NULL, 0, 0,
     CKPTFS_NEED_ALWAYS, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
     CKPTFS_RECIPE_WHOLE, {"model.norm.weight"}, NULL, false, false, NULL},
    EXTRA(CKPTFS_SCOPE_LAST, "decoder.final_layernorm._extra_state", 1, NONE, CKPTFS_NEED_ALWAYS),
    {CKPTFS_SCOPE_LAST, false, false, "output_layer.weight", NULL, NULL, 2, 1,
     CKPTFS_NEED_OUTPUT, 2, CKPTFS_DIM_VOCAB, CKPTFS_DIM_HIDDEN, CKPTFS_TP_VOCAB,
     CKPTFS_RECIPE_WHOLE, {"lm_head.weight"}, "model.embed_tokens.weight", false, false, NULL},
    EXTRA(CKPTFS_SCOPE_LAST, "output_layer._extra_state", 3, 2, CKPTFS_NEED_ALWAYS),
    MTP_LAYER,
};

/* GLM-4.5/4.6 (Glm4MoeForCausalLM): Llama/Qwen attention (q/k/v biases and q/k norms as
 * config.json says), dense-first layers, then DeepSeek-V3's MoE (router with expert bias,
 * ungated shared experts) and its multi-token prediction layers (Megatron-Bridge's GLM-4.5 and
 * mbridge's glm4_moe names). */
static const CkptfsRule glm4_moe_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM, DENSE_MLP,
    MOE_NORM_AND_ROUTER("mlp.gate.weight"),
    ROUTER_EXPERT_BIAS(13, 9),
    EXPERTS("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
            "mlp.experts.{e}.down_proj.weight"),
    SHARED_EXPERT_MLP(19, 15, "mlp.shared_experts"),
    LAYER_EXTRAS_AND_LAST,
    MTP_LAYER,
};

/* Qwen3-Next (Qwen3NextForCausalLM): each layer a gated delta-net (linear attention) or gated
 * softmax attention, as the model's layer kinds say, then Qwen2-MoE's experts with a gated shared
 * expert. Megatron-core 0.17.1's experimental attention variant spec (Transformer Engine only):
 * the attention layers as GPT's with attention_output_gate (linear_qkv per query group: queries,
 * their gates, key, value, as mbridge's qwen3_5 bridge orders them), the delta-net layers'
 * GatedDeltaNet (megatron/core/ssm/gated_delta_net.py) with the input norm fused into in_proj;
 * names as Megatron-Bridge's qwen3_next_bridge.py maps them. A legacy state dict holds a delta-net
 * layer's own parameters (dt_bias, A_log) before its modules'. */
#define GDN_LAYER_ENTRY(name_, te_at, ndim_, rows_, cols_, split_, recipe_, ...)                  \
    WEIGHT("self_attention." name_, NULL, te_at, NONE, CKPTFS_NEED_LINEAR_ATTENTION, ndim_, rows_, \
           cols_, split_, recipe_, __VA_ARGS__)
#define GDN_EXTRA(name_, te_at) EXTRA(CKPTFS_SCOPE_LAYER, "self_attention." name_ "._extra_state", te_at, \
                                      NONE, CKPTFS_NEED_LINEAR_ATTENTION)
#define FULL_ATTENTION_WEIGHT(name_, te_at, rows_, cols_, split_, recipe_, ...)                  \
    WEIGHT("self_attention." name_, NULL, te_at, NONE, CKPTFS_NEED_FULL_ATTENTION, rows_ == CKPTFS_DIM_HEAD ? 1 : 2, \
           rows_, cols_, split_, recipe_, __VA_ARGS__)
#define FULL_ATTENTION_EXTRA(name_, te_at) EXTRA(CKPTFS_SCOPE_LAYER, "self_attention." name_ "._extra_state", \
                                                 te_at, NONE, CKPTFS_NEED_FULL_ATTENTION)
/* A gated delta-net layer, its in_proj from RECIPE and its HF tensors */
#define GDN_LAYER(in_proj_recipe, ...)                                                          \
    GDN_LAYER_ENTRY("dt_bias", 0, 1, CKPTFS_DIM_GDN_HEADS, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,        \
                    CKPTFS_RECIPE_WHOLE, "linear_attn.dt_bias"),                                 \
    GDN_LAYER_ENTRY("A_log", 1, 1, CKPTFS_DIM_GDN_HEADS, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,          \
                    CKPTFS_RECIPE_WHOLE, "linear_attn.A_log"),                                   \
    GDN_LAYER_ENTRY("in_proj.layer_norm_weight", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,         \
                    CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "input_layernorm.weight"),        \
    GDN_LAYER_ENTRY("in_proj.weight", 3, 2, CKPTFS_DIM_GDN_IN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_SECTIONS, \
                    in_proj_recipe, __VA_ARGS__),                                                \
    GDN_EXTRA("in_proj", 4),                                                                    \
    GDN_LAYER_ENTRY("conv1d.weight", 5, 3, CKPTFS_DIM_GDN_CONV, CKPTFS_DIM_CONV_KERNEL,           \
                    CKPTFS_TP_SECTIONS, CKPTFS_RECIPE_WHOLE, "linear_attn.conv1d.weight"),       \
    /* Megatron's zero-centred norm (layernorm_zero_centered_gamma) of transformers' plain one */ \
    GDN_LAYER_ENTRY("out_norm.weight", 6, 1, CKPTFS_DIM_GDN_VALUE_HEAD, CKPTFS_DIM_ONE,          \
                    CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_LESS_ONE, "linear_attn.norm.weight"),    \
    GDN_EXTRA("out_norm", 7),                                                                   \
    GDN_LAYER_ENTRY("out_proj.weight", 8, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_GDN_VALUE, CKPTFS_TP_COLS, \
                    CKPTFS_RECIPE_WHOLE, "linear_attn.out_proj.weight"),                         \
    GDN_EXTRA("out_proj", 9)
/* A gated attention layer (q/k norms always) */
#define GATED_ATTENTION_LAYER                                                                   \
    FULL_ATTENTION_EXTRA("core_attention", 0),                                                  \
    FULL_ATTENTION_WEIGHT("linear_proj.weight", 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_Q, CKPTFS_TP_COLS, \
                          CKPTFS_RECIPE_WHOLE, "self_attn.o_proj.weight"),                       \
    FULL_ATTENTION_EXTRA("linear_proj", 2),                                                     \
    WEIGHT("self_attention.linear_qkv.layer_norm_weight", NULL, 3, NONE, CKPTFS_NEED_FULL_ATTENTION, 1, \
           CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,          \
           "input_layernorm.weight"),                                                          \
    FULL_ATTENTION_WEIGHT("linear_qkv.weight", 4, CKPTFS_DIM_QKV_GATED, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS, \
                          CKPTFS_RECIPE_QKV_GATED, "self_attn.q_proj.weight", "self_attn.k_proj.weight", \
                          "self_attn.v_proj.weight"),                                           \
    FULL_ATTENTION_EXTRA("linear_qkv", 6),                                                      \
    FULL_ATTENTION_WEIGHT("q_layernorm.weight", 7, CKPTFS_DIM_HEAD, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, \
                          CKPTFS_RECIPE_WHOLE, "self_attn.q_norm.weight"),                       \
    FULL_ATTENTION_EXTRA("q_layernorm", 8),                                                     \
    FULL_ATTENTION_WEIGHT("k_layernorm.weight", 9, CKPTFS_DIM_HEAD, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, \
                          CKPTFS_RECIPE_WHOLE, "self_attn.k_norm.weight"),                       \
    FULL_ATTENTION_EXTRA("k_layernorm", 10)
/* A dense MLP with its norm fused into fc1 (TE) */
#define FUSED_NORM_DENSE_MLP                                                                    \
    LAYER_NORM("mlp.linear_fc1.layer_norm_weight", NULL, 11, NONE, CKPTFS_NEED_DENSE_MLP,        \
               "post_attention_layernorm.weight"),                                             \
    DENSE_MLP,                                                                                  \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 13, NONE, CKPTFS_NEED_DENSE_MLP),    \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 15, NONE, CKPTFS_NEED_DENSE_MLP)
/* The hybrids' MTP block (the releases' mtp.*; Megatron-Bridge's qwen3_next and qwen35 bridges):
 * fc reads [embedding; hidden] as eh_proj does, pre_fc_norm_embedding and pre_fc_norm_hidden are
 * enorm and hnorm, norm the final norm (all zero-centred in both), its layer (mtp.layers.0.) a gated
 * attention layer with the family's MLP. */
#define HYBRID_MTP_LAYER                                                                        \
    MTP_LAYER_OF("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", CKPTFS_RECIPE_WHOLE, \
                 "fc.weight", "norm.weight")
static const CkptfsRule qwen3_next_rules[] = {
    EMBEDDING,
    GDN_LAYER(CKPTFS_RECIPE_GDN_IN_GROUPED, "linear_attn.in_proj_qkvz.weight", "linear_attn.in_proj_ba.weight"),
    GATED_ATTENTION_LAYER,
    /* the MLP: dense (mlp_only_layers) or experts */
    FUSED_NORM_DENSE_MLP,
    MOE_NORM_AND_ROUTER("mlp.gate.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "pre_mlp_layernorm._extra_state", 12, NONE, CKPTFS_NEED_MOE),
    EXPERTS("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
            "mlp.experts.{e}.down_proj.weight"),
    SHARED_EXPERT,
    LAST_STAGE,
    HYBRID_MTP_LAYER,
};

/* Qwen3.5's text model (Qwen3_5ForCausalLM): Qwen3-Next's layers with the delta-net's input
 * projections split (mbridge's qwen3_5 bridge stacks [in_proj_qkv; in_proj_z; in_proj_b;
 * in_proj_a] into in_proj) and a dense MLP. */
static const CkptfsRule qwen3_5_rules[] = {
    EMBEDDING,
    GDN_LAYER(CKPTFS_RECIPE_GDN_IN_SPLIT, "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
              "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
    GATED_ATTENTION_LAYER,
    FUSED_NORM_DENSE_MLP,
    LAST_STAGE,
    HYBRID_MTP_LAYER,
};

/* Qwen3.5's MoE text model (Qwen3_5MoeForCausalLM): Qwen3.5's layers with Qwen3-Next's MoE
 * (every layer's: routed experts and the gated shared expert; mbridge's qwen3_5 MoE bridge). */
static const CkptfsRule qwen3_5_moe_rules[] = {
    EMBEDDING,
    GDN_LAYER(CKPTFS_RECIPE_GDN_IN_SPLIT, "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_z.weight",
              "linear_attn.in_proj_b.weight", "linear_attn.in_proj_a.weight"),
    GATED_ATTENTION_LAYER,
    MOE_NORM_AND_ROUTER("mlp.gate.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "pre_mlp_layernorm._extra_state", 12, NONE, CKPTFS_NEED_MOE),
    EXPERTS("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight",
            "mlp.experts.{e}.down_proj.weight"),
    SHARED_EXPERT,
    LAST_STAGE,
    HYBRID_MTP_LAYER,
};

/* MiMo (MiMoForCausalLM): Qwen2 (q/k/v biases) with multi-token prediction layers under
 * model.mtp_layers.N (mbridge's mimo names): token_layernorm and hidden_layernorm are Megatron's
 * enorm and hnorm; input_proj reads [hidden; embedding], eh_proj [embedding; hidden]. */
static const CkptfsRule mimo_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM, DENSE_MLP,
    LAYER_EXTRAS_AND_LAST,
    MTP_LAYER_OF("token_layernorm.weight", "hidden_layernorm.weight", CKPTFS_RECIPE_SWAP_COL_HALVES,
                 "input_proj.weight", "final_layernorm.weight"),
};

/* Qwen2.5-VL's vision tower (mbridge's qwen2_5_vl bridge, Megatron-core 0.17.1's ViT layer with
 * Transformer Engine, get_vit_layer_with_transformer_engine_spec): a Conv3d patch embedding
 * without bias, blocks with RMSNorms fused into fc1 and linear_qkv, q/k/v fused in HF
 * ([q; k; v]) and per head in Megatron, biases on every linear (TE registers a linear's weight,
 * bias, then _extra_state), the merger's norm as the block's final norm, and its MLP as
 * MultimodalProjector's encoder (not gated). mbridge builds it with the TE spec only: the local
 * spec has no orders. */
#define VISION_WEIGHT(name_, te_at, ndim_, rows_, cols_, split_, recipe_, ...)                   \
    WEIGHT(name_, NULL, te_at, NONE, CKPTFS_NEED_ALWAYS, ndim_, rows_, cols_, split_, recipe_, __VA_ARGS__)
#define VISION_EXTRA(scope_, name_, te_at) EXTRA(scope_, name_, te_at, NONE, CKPTFS_NEED_ALWAYS)
#define VISION_LAST(name_, te_at, ndim_, rows_, cols_, split_, hf_)                              \
    {CKPTFS_SCOPE_LAST, false, false, name_, NULL, NULL, te_at, NONE, CKPTFS_NEED_ALWAYS, ndim_, \
     rows_, cols_, split_, CKPTFS_RECIPE_WHOLE, {hf_}, NULL, false, false, NULL}
static const CkptfsRule qwen2_5_vl_vision_rules[] = {
    {CKPTFS_SCOPE_FIRST, false, false, "patch_embed.proj.weight", NULL, NULL, 0, NONE, CKPTFS_NEED_ALWAYS, 2,
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,
     {"visual.patch_embed.proj.weight"}, NULL, false, false, NULL},
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 0),
    VISION_WEIGHT("self_attention.linear_proj.weight", 1, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "attn.proj.weight"),
    VISION_WEIGHT("self_attention.linear_proj.bias", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "attn.proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_proj._extra_state", 3),
    VISION_WEIGHT("self_attention.linear_qkv.layer_norm_weight", 4, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                  CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "norm1.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.weight", 5, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV_FUSED, "attn.qkv.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.bias", 6, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV_FUSED, "attn.qkv.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_qkv._extra_state", 7),
    VISION_WEIGHT("mlp.linear_fc1.layer_norm_weight", 8, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "norm2.weight"),
    VISION_WEIGHT("mlp.linear_fc1.weight", 9, 2, CKPTFS_DIM_FFN2, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES,
                  CKPTFS_RECIPE_HALVES, "mlp.gate_proj.weight", "mlp.up_proj.weight"),
    VISION_WEIGHT("mlp.linear_fc1.bias", 10, 1, CKPTFS_DIM_FFN2, CKPTFS_DIM_ONE, CKPTFS_TP_ROW_HALVES,
                  CKPTFS_RECIPE_HALVES, "mlp.gate_proj.bias", "mlp.up_proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 11),
    VISION_WEIGHT("mlp.linear_fc2.weight", 12, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "mlp.down_proj.weight"),
    VISION_WEIGHT("mlp.linear_fc2.bias", 13, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "mlp.down_proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 14),
    VISION_LAST("decoder.final_layernorm.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                "visual.merger.ln_q.weight"),
    VISION_EXTRA(CKPTFS_SCOPE_LAST, "decoder.final_layernorm._extra_state", 1),
    VISION_LAST("projection.encoder.linear_fc1.weight", 2, 2, CKPTFS_DIM_MERGED, CKPTFS_DIM_MERGED, CKPTFS_TP_ROWS,
                "visual.merger.mlp.0.weight"),
    VISION_LAST("projection.encoder.linear_fc1.bias", 3, 1, CKPTFS_DIM_MERGED, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,
                "visual.merger.mlp.0.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAST, "projection.encoder.linear_fc1._extra_state", 4),
    VISION_LAST("projection.encoder.linear_fc2.weight", 5, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_MERGED, CKPTFS_TP_COLS,
                "visual.merger.mlp.2.weight"),
    VISION_LAST("projection.encoder.linear_fc2.bias", 6, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
                CKPTFS_TP_REPLICATED, "visual.merger.mlp.2.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAST, "projection.encoder.linear_fc2._extra_state", 7),
};

/* GLM-4's language model as GLM-4.1V holds it (mbridge's glm4v bridge, Glm4TransformerLayer):
 * Qwen2's attention with q/k/v biases, gate_up_proj fused ([gate; up] already), and two more
 * norms a layer, after the attention's output and after the MLP's, which Glm4TransformerLayer
 * registers after the MLP (TENorms with the TE spec: weight, then _extra_state). */
static const CkptfsRule glm4_rules[] = {
    EMBEDDING, INPUT_NORM, SEPARATE_QKV, ATTENTION_OUT_AND_MLP_NORM,
    MLP_IN(CKPTFS_RECIPE_HALVES_FUSED, "mlp.gate_up_proj.weight"),
    MLP_OUT,
    LAYER_NORM("post_self_attn_layernorm.weight", NULL, 16, 13, CKPTFS_NEED_ALWAYS,
               "post_self_attn_layernorm.weight"),
    LAYER_NORM("post_mlp_layernorm.weight", NULL, 18, 14, CKPTFS_NEED_ALWAYS, "post_mlp_layernorm.weight"),
    EXTRA(CKPTFS_SCOPE_LAYER, "post_self_attn_layernorm._extra_state", 17, NONE, CKPTFS_NEED_ALWAYS),
    EXTRA(CKPTFS_SCOPE_LAYER, "post_mlp_layernorm._extra_state", 19, NONE, CKPTFS_NEED_ALWAYS),
    LAYER_EXTRAS_AND_LAST,
};

/* Qwen3-VL's vision tower (mbridge's qwen3_vl bridge: Qwen3VLVisionModel, its
 * Qwen3VLVisionTransformerBlock and Qwen3VLVisionPatchMerger; Megatron-core 0.17.1's ViT layer
 * with Transformer Engine): a Conv3d patch embedding with a bias and a learned position
 * embedding, blocks with LayerNorms (weight, bias) fused into linear_qkv and fc1, q/k/v fused
 * as Qwen2.5-VL's, an MLP not gated, no final norm; then the deepstack mergers (a module list
 * after the blocks, their norm after the 2x2 shuffle) and the merger (its norm before it). Each
 * merger: patch_norm (a TENorm), linear_fc1 (column-parallel), linear_fc2 (row-parallel). */
#define Q3_FIRST(name_, te_at, ndim_, rows_, cols_, hf_)                                         \
    {CKPTFS_SCOPE_FIRST, false, false, name_, NULL, NULL, te_at, NONE, CKPTFS_NEED_ALWAYS, ndim_, \
     rows_, cols_, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {hf_}, NULL, false, false, NULL}
#define Q3_MERGER_ENTRY(scope_, name_, te_at, ndim_, rows_, cols_, split_, hf_)                  \
    {scope_, false, false, name_, NULL, NULL, te_at, NONE, CKPTFS_NEED_ALWAYS, ndim_, rows_, cols_, \
     split_, CKPTFS_RECIPE_WHOLE, {hf_}, NULL, false, false, NULL}
/* A patch merger of SCOPE, its norm NORM_DIM wide; NAME_ and HF_ its module ("merger." and
 * "visual.merger.", or "" in the list, whose names follow the list's prefixes) */
#define Q3_MERGER(scope_, name_, norm_dim, hf_)                                                         \
    Q3_MERGER_ENTRY(scope_, name_ "patch_norm.weight", 0, 1, norm_dim, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, \
                    hf_ "norm.weight"),                                                          \
    Q3_MERGER_ENTRY(scope_, name_ "patch_norm.bias", 1, 1, norm_dim, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, \
                    hf_ "norm.bias"),                                                            \
    VISION_EXTRA(scope_, name_ "patch_norm._extra_state", 2),                                          \
    Q3_MERGER_ENTRY(scope_, name_ "linear_fc1.weight", 3, 2, CKPTFS_DIM_MERGED, CKPTFS_DIM_MERGED, CKPTFS_TP_ROWS, \
                    hf_ "linear_fc1.weight"),                                                    \
    Q3_MERGER_ENTRY(scope_, name_ "linear_fc1.bias", 4, 1, CKPTFS_DIM_MERGED, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS, \
                    hf_ "linear_fc1.bias"),                                                      \
    VISION_EXTRA(scope_, name_ "linear_fc1._extra_state", 5),                                          \
    Q3_MERGER_ENTRY(scope_, name_ "linear_fc2.weight", 6, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_MERGED, \
                    CKPTFS_TP_COLS, hf_ "linear_fc2.weight"),                                    \
    Q3_MERGER_ENTRY(scope_, name_ "linear_fc2.bias", 7, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,      \
                    CKPTFS_TP_REPLICATED, hf_ "linear_fc2.bias"),                                \
    VISION_EXTRA(scope_, name_ "linear_fc2._extra_state", 8)
static const CkptfsRule qwen3_vl_vision_rules[] = {
    Q3_FIRST("patch_embed.proj.weight", 0, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH, "visual.patch_embed.proj.weight"),
    Q3_FIRST("patch_embed.proj.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, "visual.patch_embed.proj.bias"),
    Q3_FIRST("pos_embed.weight", 2, 2, CKPTFS_DIM_POSITIONS, CKPTFS_DIM_HIDDEN, "visual.pos_embed.weight"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 0),
    VISION_WEIGHT("self_attention.linear_proj.weight", 1, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "attn.proj.weight"),
    VISION_WEIGHT("self_attention.linear_proj.bias", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "attn.proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_proj._extra_state", 3),
    VISION_WEIGHT("self_attention.linear_qkv.layer_norm_weight", 4, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                  CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "norm1.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.layer_norm_bias", 5, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                  CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "norm1.bias"),
    VISION_WEIGHT("self_attention.linear_qkv.weight", 6, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV_FUSED, "attn.qkv.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.bias", 7, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV_FUSED, "attn.qkv.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_qkv._extra_state", 8),
    VISION_WEIGHT("mlp.linear_fc1.layer_norm_weight", 9, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "norm2.weight"),
    VISION_WEIGHT("mlp.linear_fc1.layer_norm_bias", 10, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "norm2.bias"),
    VISION_WEIGHT("mlp.linear_fc1.weight", 11, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_WHOLE, "mlp.linear_fc1.weight"),
    VISION_WEIGHT("mlp.linear_fc1.bias", 12, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_WHOLE, "mlp.linear_fc1.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 13),
    VISION_WEIGHT("mlp.linear_fc2.weight", 14, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "mlp.linear_fc2.weight"),
    VISION_WEIGHT("mlp.linear_fc2.bias", 15, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "mlp.linear_fc2.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 16),
    Q3_MERGER(CKPTFS_SCOPE_LIST, "", CKPTFS_DIM_MERGED, ""),
    Q3_MERGER(CKPTFS_SCOPE_LAST, "merger.", CKPTFS_DIM_HIDDEN, "visual.merger."),
};

/* Qwen3.5's vision tower (mbridge's qwen3_5 bridge: transformers' Qwen3_5VisionModel itself under
 * vision_model., built whole on every TP rank of the first stage, its parameters named as
 * transformers names them): Qwen3-VL's tower without the deepstack mergers. Its state dict in
 * module order: the patch embedding and the learned positions, each block's norm1, norm2,
 * attn (fused qkv with a bias, proj), mlp (fc1, fc2), then the merger (its norm first). The
 * rotary embedding's inv_freq is not persistent; nothing has an _extra_state. */
#define HF_TOWER_IF(scope_, name_, at, need_, ndim_, rows_, cols_, hf_)                          \
    {scope_, false, false, name_, NULL, NULL, at, NONE, need_, ndim_, rows_, cols_,               \
     CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {hf_}, NULL, false, false, NULL}
#define HF_TOWER(scope_, name_, at, ndim_, rows_, cols_, hf_)                                    \
    HF_TOWER_IF(scope_, name_, at, CKPTFS_NEED_ALWAYS, ndim_, rows_, cols_, hf_)
#define HF_BLOCK(name_, at, ndim_, rows_, cols_) HF_TOWER(CKPTFS_SCOPE_LAYER, name_, at, ndim_, rows_, cols_, name_)
static const CkptfsRule qwen3_5_vision_rules[] = {
    HF_TOWER(CKPTFS_SCOPE_FIRST, "patch_embed.proj.weight", 0, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH,
             "visual.patch_embed.proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "patch_embed.proj.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.patch_embed.proj.bias"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "pos_embed.weight", 2, 2, CKPTFS_DIM_POSITIONS, CKPTFS_DIM_HIDDEN,
             "visual.pos_embed.weight"),
    HF_BLOCK("norm1.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("norm1.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("norm2.weight", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("norm2.bias", 3, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("attn.qkv.weight", 4, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("attn.qkv.bias", 5, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE),
    HF_BLOCK("attn.proj.weight", 6, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("attn.proj.bias", 7, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.linear_fc1.weight", 8, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.linear_fc1.bias", 9, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.linear_fc2.weight", 10, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN),
    HF_BLOCK("mlp.linear_fc2.bias", 11, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.norm.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.merger.norm.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.norm.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, "visual.merger.norm.bias"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.linear_fc1.weight", 2, 2, CKPTFS_DIM_MERGED, CKPTFS_DIM_MERGED,
             "visual.merger.linear_fc1.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.linear_fc1.bias", 3, 1, CKPTFS_DIM_MERGED, CKPTFS_DIM_ONE,
             "visual.merger.linear_fc1.bias"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.linear_fc2.weight", 4, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_MERGED,
             "visual.merger.linear_fc2.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.linear_fc2.bias", 5, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
             "visual.merger.linear_fc2.bias"),
};

/* GLM-4.1V's and GLM-4.5V's vision tower (mbridge's glm4v and glm4v_moe bridges: transformers'
 * Glm4vVisionModel / Glm4vMoeVisionModel itself under vision_model., on the first pipeline stage,
 * whole on every TP rank, named as transformers names it, as Qwen3.5's). Its state dict in module
 * order: the learned positions ((image_size / patch_size)^2 of them) and the Conv3d patch
 * embedding, each block's RMSNorms, attn (fused qkv, a bias only with attention_bias; proj
 * without), a gated MLP as wide as out_hidden_size, then the merger (proj, a LayerNorm, a gated
 * MLP of intermediate_size), the norm after the patch embedding, the downsampling Conv2d that
 * merges a square of patches into out_hidden_size, and the final norm (modeling_glm4v_moe.py,
 * transformers 5.12.1). */
static const CkptfsRule glm4v_vision_rules[] = {
    HF_TOWER(CKPTFS_SCOPE_FIRST, "embeddings.position_embedding.weight", 0, 2, CKPTFS_DIM_POSITIONS,
             CKPTFS_DIM_HIDDEN, "visual.embeddings.position_embedding.weight"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "patch_embed.proj.weight", 1, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH,
             "visual.patch_embed.proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "patch_embed.proj.bias", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.patch_embed.proj.bias"),
    HF_BLOCK("norm1.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("norm2.weight", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("attn.qkv.weight", 2, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN),
    HF_TOWER_IF(CKPTFS_SCOPE_LAYER, "attn.qkv.bias", 3, CKPTFS_NEED_VISION_QKV_BIAS, 1, CKPTFS_DIM_QKV,
                CKPTFS_DIM_ONE, "attn.qkv.bias"),
    HF_BLOCK("attn.proj.weight", 4, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.gate_proj.weight", 5, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.up_proj.weight", 6, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.down_proj.weight", 7, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_VISION_OUT),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.proj.weight", 0, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_VISION_OUT,
             "visual.merger.proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.post_projection_norm.weight", 1, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
             "visual.merger.post_projection_norm.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.post_projection_norm.bias", 2, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
             "visual.merger.post_projection_norm.bias"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.gate_proj.weight", 3, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_VISION_OUT,
             "visual.merger.gate_proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.up_proj.weight", 4, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_VISION_OUT,
             "visual.merger.up_proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.down_proj.weight", 5, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_FFN,
             "visual.merger.down_proj.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "post_conv_layernorm.weight", 6, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.post_conv_layernorm.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "downsample.weight", 7, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_MERGE_KERNEL,
             "visual.downsample.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "downsample.bias", 8, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
             "visual.downsample.bias"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "post_layernorm.weight", 9, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.post_layernorm.weight"),
};

/* Qwen2.5-VL's tower as Megatron-Bridge's qwen25_vl bridge builds it (Qwen25VLModel): transformers'
 * own Qwen2_5_VisionTransformerPretrainedModel under visual., whole on every TP rank, named as
 * transformers names it (the bridge's ReplicatedMapping "visual.**"), in its state dict's order;
 * no _extra_state. */
static const CkptfsRule qwen2_5_vl_hf_vision_rules[] = {
    HF_TOWER(CKPTFS_SCOPE_FIRST, "patch_embed.proj.weight", 0, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH,
             "visual.patch_embed.proj.weight"),
    HF_BLOCK("norm1.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("norm2.weight", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("attn.qkv.weight", 2, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("attn.qkv.bias", 3, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE),
    HF_BLOCK("attn.proj.weight", 4, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("attn.proj.bias", 5, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.gate_proj.weight", 6, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.gate_proj.bias", 7, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.up_proj.weight", 8, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.up_proj.bias", 9, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.down_proj.weight", 10, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN),
    HF_BLOCK("mlp.down_proj.bias", 11, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.ln_q.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "visual.merger.ln_q.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.mlp.0.weight", 1, 2, CKPTFS_DIM_MERGED, CKPTFS_DIM_MERGED,
             "visual.merger.mlp.0.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.mlp.0.bias", 2, 1, CKPTFS_DIM_MERGED, CKPTFS_DIM_ONE,
             "visual.merger.mlp.0.bias"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.mlp.2.weight", 3, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_MERGED,
             "visual.merger.mlp.2.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "merger.mlp.2.bias", 4, 1, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_ONE,
             "visual.merger.mlp.2.bias"),
};

/* Gemma 3's text model (Gemma3ForCausalLM; Megatron-Bridge's gemma3 bridge and layer spec, the
 * one bridge of the text class): q/k norms, no biases, four norms a layer. The norm after the
 * attention and the one after the MLP are TERowParallelLinearLayerNorm's post_layernorm, a TENorm
 * child of linear_proj and linear_fc2 (after the linear's weight and _extra_state in a legacy
 * state dict); the pre-MLP norm is fused into fc1. Gemma's norms scale by 1 + w, as Megatron's
 * layernorm_zero_centered_gamma: the bytes are the same. Transformer Engine spec only. */
#define GEMMA3_WEIGHT(name_, te_at, need_, ndim_, rows_, cols_, split_, recipe_, ...)            \
    WEIGHT(name_, NULL, te_at, NONE, need_, ndim_, rows_, cols_, split_, recipe_, __VA_ARGS__)
#define GEMMA3_NORM(name_, te_at, need_, hf_)                                                   \
    GEMMA3_WEIGHT(name_, te_at, need_, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, \
                  CKPTFS_RECIPE_WHOLE, hf_)
#define GEMMA3_EXTRA(name_, te_at, need_) EXTRA(CKPTFS_SCOPE_LAYER, name_, te_at, NONE, need_)
/* The rows the text and VLM tables share, one definition for both; in groups, as each table's
 * own post-norm rows sit between them and shift the legacy orders. AT: the pre-attention norm's
 * order (the attention's entries follow one by one); PROJ_AT: linear_proj's (its _extra_state
 * next); MLP_AT: the pre-MLP norm's (fc1's and fc2's entries follow). */
#define GEMMA3_ATTENTION(at, proj_at)                                                         \
    GEMMA3_NORM("self_attention.linear_qkv.layer_norm_weight", at, CKPTFS_NEED_ALWAYS,              \
                "input_layernorm.weight"),                                                       \
    GEMMA3_WEIGHT("self_attention.linear_qkv.weight", at + 1, CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_QKV,  \
                  CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS, CKPTFS_RECIPE_QKV, "self_attn.q_proj.weight",    \
                  "self_attn.k_proj.weight", "self_attn.v_proj.weight"),                         \
    GEMMA3_WEIGHT("self_attention.q_layernorm.weight", at + 3, CKPTFS_NEED_ALWAYS, 1, CKPTFS_DIM_HEAD, \
                  CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "self_attn.q_norm.weight"), \
    GEMMA3_WEIGHT("self_attention.k_layernorm.weight", at + 5, CKPTFS_NEED_ALWAYS, 1, CKPTFS_DIM_HEAD, \
                  CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "self_attn.k_norm.weight"), \
    GEMMA3_WEIGHT("self_attention.linear_proj.weight", proj_at, CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_HIDDEN, \
                  CKPTFS_DIM_Q, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "self_attn.o_proj.weight")
#define GEMMA3_MLP(mlp_at)                                                                    \
    GEMMA3_NORM("mlp.linear_fc1.layer_norm_weight", mlp_at, CKPTFS_NEED_DENSE_MLP,                  \
                "pre_feedforward_layernorm.weight"),                                             \
    GEMMA3_WEIGHT("mlp.linear_fc1.weight", mlp_at + 1, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_FFN2,     \
                  CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, "mlp.gate_proj.weight", \
                  "mlp.up_proj.weight"),                                                         \
    GEMMA3_WEIGHT("mlp.linear_fc2.weight", mlp_at + 3, CKPTFS_NEED_DENSE_MLP, 2, CKPTFS_DIM_HIDDEN,   \
                  CKPTFS_DIM_FFN, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "mlp.down_proj.weight")
#define GEMMA3_ATTENTION_EXTRAS(at, proj_at)                                                  \
    GEMMA3_EXTRA("self_attention.linear_qkv._extra_state", at + 2, CKPTFS_NEED_ALWAYS),         \
    GEMMA3_EXTRA("self_attention.linear_proj._extra_state", proj_at + 1, CKPTFS_NEED_ALWAYS)
#define GEMMA3_MLP_EXTRAS(mlp_at)                                                             \
    GEMMA3_EXTRA("mlp.linear_fc1._extra_state", mlp_at + 2, CKPTFS_NEED_DENSE_MLP),             \
    GEMMA3_EXTRA("mlp.linear_fc2._extra_state", mlp_at + 4, CKPTFS_NEED_DENSE_MLP)
#define GEMMA3_QK_NORM_EXTRAS(at)                                                             \
    GEMMA3_EXTRA("self_attention.q_layernorm._extra_state", at + 4, CKPTFS_NEED_ALWAYS),        \
    GEMMA3_EXTRA("self_attention.k_layernorm._extra_state", at + 6, CKPTFS_NEED_ALWAYS)
/* Legacy orders: the core attention's state (0), linear_proj and its post-norm (1-4), the attention
 * (5-11), the MLP and fc2's post-norm (12-18). */
static const CkptfsRule gemma3_rules[] = {
    EMBEDDING,
    GEMMA3_ATTENTION(5, 1),
    GEMMA3_NORM("self_attention.linear_proj.post_layernorm.weight", 3, CKPTFS_NEED_ALWAYS,
                "post_attention_layernorm.weight"),
    GEMMA3_MLP(12),
    GEMMA3_NORM("mlp.linear_fc2.post_layernorm.weight", 17, CKPTFS_NEED_DENSE_MLP,
                "post_feedforward_layernorm.weight"),
    GEMMA3_ATTENTION_EXTRAS(5, 1),
    GEMMA3_EXTRA("self_attention.linear_proj.post_layernorm._extra_state", 4, CKPTFS_NEED_ALWAYS),
    GEMMA3_MLP_EXTRAS(12),
    GEMMA3_EXTRA("mlp.linear_fc2.post_layernorm._extra_state", 18, CKPTFS_NEED_DENSE_MLP),
    GEMMA3_EXTRA("self_attention.core_attention._extra_state", 0, CKPTFS_NEED_ALWAYS),
    GEMMA3_QK_NORM_EXTRAS(5),
    LAST_STAGE,
};

/* Gemma 3's language model as mbridge's gemma3 VLM builds it (mbridge/models/gemma3,
 * Gemma3TransformerLayer with get_gemma3_layer_spec_te): the gemma3 rules' entries, but the norm
 * after the attention and the one after the MLP are TENorms of the layer itself, registered after
 * the MLP, and the core attention (mbridge's MemoryEfficientAttention) holds no state. Legacy
 * orders: linear_proj (0-1), the attention (2-8), the MLP (9-13), the post-norms (14-17). */
static const CkptfsRule gemma3_vlm_rules[] = {
    EMBEDDING,
    GEMMA3_ATTENTION(2, 0),
    GEMMA3_MLP(9),
    GEMMA3_NORM("post_attention_layernorm.weight", 14, CKPTFS_NEED_ALWAYS, "post_attention_layernorm.weight"),
    GEMMA3_NORM("post_feedforward_layernorm.weight", 16, CKPTFS_NEED_DENSE_MLP, "post_feedforward_layernorm.weight"),
    GEMMA3_ATTENTION_EXTRAS(2, 0),
    GEMMA3_MLP_EXTRAS(9),
    GEMMA3_QK_NORM_EXTRAS(2),
    GEMMA3_EXTRA("post_attention_layernorm._extra_state", 15, CKPTFS_NEED_ALWAYS),
    GEMMA3_EXTRA("post_feedforward_layernorm._extra_state", 17, CKPTFS_NEED_DENSE_MLP),
    LAST_STAGE,
};

/* Gemma 3's SigLIP tower as mbridge's gemma3 bridge builds it: Megatron-core 0.17.1's CLIPViTModel
 * with model_subtype "siglip" registers ln_post (a TENorm with a bias), conv1 (a Conv2d with a
 * bias), position_embeddings, then the blocks (get_layer_spec_te: LayerNorms with biases fused into
 * linear_qkv and fc1, q/k/v with biases per head, an ungated fc1, biases on every linear; no final
 * norm). The projector is a module of its own beside it, vision_projection: mm_soft_emb_norm fused
 * into mm_input_projection (TELayerNormColumnParallelLinear, no bias), whose weight is
 * mm_input_projection_weight transposed. HF names as transformers 5 saves them (the release's
 * vision_tower.vision_model. is read through the architecture's module names). */
#define SIGLIP_FIRST(name_, te_at, ndim_, rows_, cols_, hf_) Q3_FIRST(name_, te_at, ndim_, rows_, cols_, hf_)
#define SIGLIP_PROJECTION(name_, te_at, ndim_, rows_, cols_, split_, recipe_, hf_)                  \
    {CKPTFS_SCOPE_LAST, false, false, name_, NULL, NULL, te_at, NONE, CKPTFS_NEED_ALWAYS, ndim_, rows_, cols_, \
     split_, recipe_, {hf_}, NULL, false, false, .module = "vision_projection."}
static const CkptfsRule siglip_vision_rules[] = {
    SIGLIP_FIRST("ln_post.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, "vision_tower.post_layernorm.weight"),
    SIGLIP_FIRST("ln_post.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, "vision_tower.post_layernorm.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_FIRST, "ln_post._extra_state", 2),
    SIGLIP_FIRST("conv1.weight", 3, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH,
                 "vision_tower.embeddings.patch_embedding.weight"),
    SIGLIP_FIRST("conv1.bias", 4, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, "vision_tower.embeddings.patch_embedding.bias"),
    SIGLIP_FIRST("position_embeddings.weight", 5, 2, CKPTFS_DIM_POSITIONS, CKPTFS_DIM_HIDDEN,
                 "vision_tower.embeddings.position_embedding.weight"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 0),
    VISION_WEIGHT("self_attention.linear_proj.weight", 1, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "self_attn.out_proj.weight"),
    VISION_WEIGHT("self_attention.linear_proj.bias", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "self_attn.out_proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_proj._extra_state", 3),
    VISION_WEIGHT("self_attention.linear_qkv.layer_norm_weight", 4, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                  CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "layer_norm1.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.layer_norm_bias", 5, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                  CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "layer_norm1.bias"),
    VISION_WEIGHT("self_attention.linear_qkv.weight", 6, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV, "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    VISION_WEIGHT("self_attention.linear_qkv.bias", 7, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_QKV, "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_qkv._extra_state", 8),
    VISION_WEIGHT("mlp.linear_fc1.layer_norm_weight", 9, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "layer_norm2.weight"),
    VISION_WEIGHT("mlp.linear_fc1.layer_norm_bias", 10, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "layer_norm2.bias"),
    VISION_WEIGHT("mlp.linear_fc1.weight", 11, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                  CKPTFS_RECIPE_WHOLE, "mlp.fc1.weight"),
    VISION_WEIGHT("mlp.linear_fc1.bias", 12, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS, CKPTFS_RECIPE_WHOLE,
                  "mlp.fc1.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 13),
    VISION_WEIGHT("mlp.linear_fc2.weight", 14, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN, CKPTFS_TP_COLS,
                  CKPTFS_RECIPE_WHOLE, "mlp.fc2.weight"),
    VISION_WEIGHT("mlp.linear_fc2.bias", 15, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                  CKPTFS_RECIPE_WHOLE, "mlp.fc2.bias"),
    VISION_EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 16),
    SIGLIP_PROJECTION("mm_input_projection.layer_norm_weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
                      CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "multi_modal_projector.mm_soft_emb_norm.weight"),
    SIGLIP_PROJECTION("mm_input_projection.weight", 1, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                      CKPTFS_RECIPE_TRANSPOSED, "multi_modal_projector.mm_input_projection_weight"),
    {CKPTFS_SCOPE_LAST, true, false, "mm_input_projection._extra_state", NULL, NULL, 2, NONE, CKPTFS_NEED_ALWAYS, 0,
     CKPTFS_DIM_ONE, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {NULL}, NULL, false, false,
     .module = "vision_projection."},
};

/* Gemma 3's SigLIP tower as Megatron-Bridge's gemma3_vl bridge builds it (Gemma3VLModel): transformers'
 * SiglipVisionTransformer (no head) registered as vision_tower, whole on every TP rank, named as
 * transformers names it, in its state dict's order; then its own projector multi_modal_projector:
 * mm_soft_embed_norm (a TENorm) and proj (ColumnParallelLinear, no bias), whose weight is
 * mm_input_projection_weight transposed. */
#define BRIDGE_PROJECTOR(name_, at, ndim_, rows_, cols_, split_, recipe_, hf_)                      \
    {CKPTFS_SCOPE_LAST, false, false, name_, NULL, NULL, at, NONE, CKPTFS_NEED_ALWAYS, ndim_, rows_, cols_,   \
     split_, recipe_, {hf_}, NULL, false, false, .module = "multi_modal_projector."}
#define BRIDGE_PROJECTOR_EXTRA(name_, at)                                                          \
    {CKPTFS_SCOPE_LAST, true, false, name_, NULL, NULL, at, NONE, CKPTFS_NEED_ALWAYS, 0, CKPTFS_DIM_ONE,      \
     CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {NULL}, NULL, false, false,                  \
     .module = "multi_modal_projector."}
static const CkptfsRule siglip_hf_vision_rules[] = {
    HF_TOWER(CKPTFS_SCOPE_FIRST, "embeddings.patch_embedding.weight", 0, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_PATCH,
             "vision_tower.embeddings.patch_embedding.weight"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "embeddings.patch_embedding.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "vision_tower.embeddings.patch_embedding.bias"),
    HF_TOWER(CKPTFS_SCOPE_FIRST, "embeddings.position_embedding.weight", 2, 2, CKPTFS_DIM_POSITIONS,
             CKPTFS_DIM_HIDDEN, "vision_tower.embeddings.position_embedding.weight"),
    HF_BLOCK("layer_norm1.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("layer_norm1.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("self_attn.k_proj.weight", 2, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("self_attn.k_proj.bias", 3, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("self_attn.v_proj.weight", 4, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("self_attn.v_proj.bias", 5, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("self_attn.q_proj.weight", 6, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("self_attn.q_proj.bias", 7, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("self_attn.out_proj.weight", 8, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("self_attn.out_proj.bias", 9, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("layer_norm2.weight", 10, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("layer_norm2.bias", 11, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.fc1.weight", 12, 2, CKPTFS_DIM_FFN, CKPTFS_DIM_HIDDEN),
    HF_BLOCK("mlp.fc1.bias", 13, 1, CKPTFS_DIM_FFN, CKPTFS_DIM_ONE),
    HF_BLOCK("mlp.fc2.weight", 14, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN),
    HF_BLOCK("mlp.fc2.bias", 15, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE),
    HF_TOWER(CKPTFS_SCOPE_LAST, "post_layernorm.weight", 0, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "vision_tower.post_layernorm.weight"),
    HF_TOWER(CKPTFS_SCOPE_LAST, "post_layernorm.bias", 1, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE,
             "vision_tower.post_layernorm.bias"),
    BRIDGE_PROJECTOR("mm_soft_embed_norm.weight", 2, 1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED,
                     CKPTFS_RECIPE_WHOLE, "multi_modal_projector.mm_soft_emb_norm.weight"),
    BRIDGE_PROJECTOR_EXTRA("mm_soft_embed_norm._extra_state", 3),
    BRIDGE_PROJECTOR("proj.weight", 4, 2, CKPTFS_DIM_VISION_OUT, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
                     CKPTFS_RECIPE_TRANSPOSED, "multi_modal_projector.mm_input_projection_weight"),
    BRIDGE_PROJECTOR_EXTRA("proj._extra_state", 5),
};

/* GPT-OSS (GptOssForCausalLM; Megatron-Bridge's gpt_oss names): q/k/v with biases, one
 * attention sink per head (Megatron's learnable softmax offset, split by heads with them), a bias
 * on every linear layer (add_bias_linear: row-parallel biases whole on every rank), every layer
 * MoE, the router with a bias. Its experts are fused on disk (fused.h): the rules read them per
 * expert, fc1 = [gate; up] and its bias likewise, as the bridge de-interleaves them. Megatron
 * registers a parameter before its module's _extra_state and a weight before its bias. */
#define GPT_OSS_BIAS(name_, te_at, local_at, need_, rows_, split_, recipe_, ...)                \
    WEIGHT(name_, NULL, te_at, local_at, need_, 1, rows_, CKPTFS_DIM_ONE, split_, recipe_, __VA_ARGS__)
#define GPT_OSS_EXPERT_BIAS(name_, te_at, local_at, rows_, split_, recipe_, ...)                \
    {CKPTFS_SCOPE_LAYER, false, true, name_, NULL, NULL, te_at, local_at, CKPTFS_NEED_MOE, 1,   \
     rows_, CKPTFS_DIM_ONE, split_, recipe_, {__VA_ARGS__}, NULL, false, false, NULL}
static const CkptfsRule gpt_oss_rules[] = {
    EMBEDDING,
    INPUT_NORM,
    QKV(CKPTFS_NEED_ALWAYS, CKPTFS_RECIPE_QKV, "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight"),
    QKV_BIAS,
    GPT_OSS_BIAS("self_attention.core_attention.softmax_offset", 0, 1, CKPTFS_NEED_ALWAYS, CKPTFS_DIM_HEADS,
                 CKPTFS_TP_ROWS, CKPTFS_RECIPE_WHOLE, "self_attn.sinks"),
    ATTENTION_OUT_AND_MLP_NORM,
    GPT_OSS_BIAS("self_attention.linear_proj.bias", 1, 1, CKPTFS_NEED_ALWAYS, CKPTFS_DIM_HIDDEN,
                 CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, "self_attn.o_proj.bias"),
    MOE_NORM_AND_ROUTER("mlp.router.weight"),
    GPT_OSS_BIAS("mlp.router.bias", 13, 9, CKPTFS_NEED_MOE, CKPTFS_DIM_EXPERTS, CKPTFS_TP_REPLICATED,
                 CKPTFS_RECIPE_WHOLE, "mlp.router.bias"),
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc1.weight", 14, 10, CKPTFS_DIM_MOE_FFN2, CKPTFS_DIM_HIDDEN,
                  CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES, "mlp.experts.{e}.gate_proj.weight",
                  "mlp.experts.{e}.up_proj.weight"),
    GPT_OSS_EXPERT_BIAS("mlp.experts.experts.linear_fc1.bias", 14, 10, CKPTFS_DIM_MOE_FFN2, CKPTFS_TP_ROW_HALVES,
                        CKPTFS_RECIPE_HALVES, "mlp.experts.{e}.gate_proj.bias", "mlp.experts.{e}.up_proj.bias"),
    EXPERT_EXTRA("mlp.experts.experts.linear_fc1._extra_state", 15, 11),
    EXPERT_WEIGHT("mlp.experts.experts.linear_fc2.weight", 16, 12, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_MOE_FFN,
                  CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, "mlp.experts.{e}.down_proj.weight"),
    GPT_OSS_EXPERT_BIAS("mlp.experts.experts.linear_fc2.bias", 16, 12, CKPTFS_DIM_HIDDEN, CKPTFS_TP_REPLICATED,
                        CKPTFS_RECIPE_WHOLE, "mlp.experts.{e}.down_proj.bias"),
    EXPERT_EXTRA("mlp.experts.experts.linear_fc2._extra_state", 17, 13),
    LAYER_EXTRAS_AND_LAST,
};

const CkptfsFamily ckptfs_family_llama = {"llama", llama_rules, G_N_ELEMENTS(llama_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_phi3 = {"phi3", phi3_rules, G_N_ELEMENTS(phi3_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_mixtral = {"mixtral", mixtral_rules, G_N_ELEMENTS(mixtral_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_qwen_moe = {"qwen_moe", qwen_moe_rules, G_N_ELEMENTS(qwen_moe_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_deepseek = {"deepseek", deepseek_rules, G_N_ELEMENTS(deepseek_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_glm4_moe = {"glm4_moe", glm4_moe_rules, G_N_ELEMENTS(glm4_moe_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_mimo = {"mimo", mimo_rules, G_N_ELEMENTS(mimo_rules), "model.mtp_layers.", NULL};
const CkptfsFamily ckptfs_family_qwen2_5_vl_vision = {"qwen2_5_vl_vision", qwen2_5_vl_vision_rules,
                                                      G_N_ELEMENTS(qwen2_5_vl_vision_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_qwen3_vl_vision = {"qwen3_vl_vision", qwen3_vl_vision_rules,
                                                    G_N_ELEMENTS(qwen3_vl_vision_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_gpt_oss = {"gpt_oss", gpt_oss_rules, G_N_ELEMENTS(gpt_oss_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_qwen3_next = {"qwen3_next", qwen3_next_rules, G_N_ELEMENTS(qwen3_next_rules),
                                               "mtp.layers.", "mtp."};
const CkptfsFamily ckptfs_family_qwen3_5 = {"qwen3_5", qwen3_5_rules, G_N_ELEMENTS(qwen3_5_rules),
                                            "mtp.layers.", "mtp."};
const CkptfsFamily ckptfs_family_gemma3 = {"gemma3", gemma3_rules, G_N_ELEMENTS(gemma3_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_qwen3_5_vision = {"qwen3_5_vision", qwen3_5_vision_rules,
                                                   G_N_ELEMENTS(qwen3_5_vision_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_qwen3_5_moe = {"qwen3_5_moe", qwen3_5_moe_rules, G_N_ELEMENTS(qwen3_5_moe_rules),
                                                "mtp.layers.", "mtp."};
const CkptfsFamily ckptfs_family_gemma3_vlm = {"gemma3_vlm", gemma3_vlm_rules, G_N_ELEMENTS(gemma3_vlm_rules),
                                               NULL, NULL};
const CkptfsFamily ckptfs_family_siglip_vision = {"siglip_vision", siglip_vision_rules,
                                                  G_N_ELEMENTS(siglip_vision_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_glm4 = {"glm4", glm4_rules, G_N_ELEMENTS(glm4_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_glm4v_vision = {"glm4v_vision", glm4v_vision_rules, G_N_ELEMENTS(glm4v_vision_rules),
                                                 NULL, NULL};
const CkptfsFamily ckptfs_family_qwen2_5_vl_hf_vision = {"qwen2_5_vl_hf_vision", qwen2_5_vl_hf_vision_rules,
                                                         G_N_ELEMENTS(qwen2_5_vl_hf_vision_rules), NULL, NULL};
const CkptfsFamily ckptfs_family_siglip_hf_vision = {"siglip_hf_vision", siglip_hf_vision_rules,
                                                     G_N_ELEMENTS(siglip_hf_vision_rules), NULL, NULL};

bool ckptfs_family_has(const CkptfsFamily *family, CkptfsNeed need)
{
    for (unsigned i = 0; i < family->n_rules; i++)
        if (family->rules[i].need == need)
            return true;
    return false;
}

bool ckptfs_tensor_keeps_fp32(const char *hf_name)
{
    static const CkptfsFamily *const families[] = {&ckptfs_family_llama, &ckptfs_family_phi3,
                                                   &ckptfs_family_mixtral, &ckptfs_family_qwen_moe,
                                                   &ckptfs_family_deepseek, &ckptfs_family_glm4_moe};
    for (size_t f = 0; f < G_N_ELEMENTS(families); f++)
        for (unsigned i = 0; i < families[f]->n_rules; i++) {
            const CkptfsRule *r = &families[f]->rules[i];
            if (r->fp32 && r->hf[0] && g_str_has_suffix(hf_name, r->hf[0]) &&
                strlen(hf_name) > strlen(r->hf[0]) && hf_name[strlen(hf_name) - strlen(r->hf[0]) - 1] == '.')
                return true;
        }
    return false;
}

CkptfsTpSplit ckptfs_rule_split(const CkptfsRule *rule, bool te_spec)
{
    return !te_spec && rule->local_rows ? CKPTFS_TP_ROWS : rule->split;
}
