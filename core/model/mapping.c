/* The mapping tables. Rows are in Megatron-core's module order, which is the order of keys in
 * a torch_dist checkpoint; the order columns give a legacy state dict's order for each spec
 * (Transformer Engine fuses the pre-attention and pre-MLP norms into the next linear layer and
 * adds _extra_state entries for its attention and q/k norms). */
#include "ckptfs/mapping.h"

#include <glib.h>

#define NONE CKPTFS_ABSENT

/* Entries every dense GPT family shares around the attention and MLP projections. */
#define EMBEDDING                                                                             \
    {CKPTFS_SCOPE_FIRST, false, "embedding.word_embeddings.weight", NULL, 0, 0,               \
     CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_VOCAB, CKPTFS_DIM_HIDDEN, CKPTFS_TP_VOCAB,              \
     CKPTFS_RECIPE_WHOLE, {"model.embed_tokens.weight"}, NULL}
#define LAYER_NORM(name_, local_, te_at, local_at, hf_)                                        \
    {CKPTFS_SCOPE_LAYER, false, name_, local_, te_at, local_at, CKPTFS_NEED_ALWAYS, 1,        \
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {hf_}, NULL}
#define QK_NORM(name_, te_at, local_at, hf_)                                                   \
    {CKPTFS_SCOPE_LAYER, false, name_, NULL, te_at, local_at, CKPTFS_NEED_QK_NORM, 1,          \
     CKPTFS_DIM_HEAD, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {hf_}, NULL}
#define EXTRA(scope_, name_, te_at, local_at, need_)                                           \
    {scope_, true, name_, NULL, te_at, local_at, need_, 0, CKPTFS_DIM_ONE, CKPTFS_DIM_ONE,     \
     CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE, {NULL}, NULL}
/* o_proj, and the norm before the MLP (fused into fc1 by Transformer Engine). */
#define ATTENTION_OUT_AND_MLP_NORM                                                            \
    {CKPTFS_SCOPE_LAYER, false, "self_attention.linear_proj.weight", NULL, 1, 1,               \
     CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_Q, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE, \
     {"self_attn.o_proj.weight"}, NULL},                                                       \
    LAYER_NORM("mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight", 11, 8,          \
               "post_attention_layernorm.weight")
#define MLP_OUT                                                                               \
    {CKPTFS_SCOPE_LAYER, false, "mlp.linear_fc2.weight", NULL, 14, 11, CKPTFS_NEED_ALWAYS, 2,   \
     CKPTFS_DIM_HIDDEN, CKPTFS_DIM_FFN, CKPTFS_TP_COLS, CKPTFS_RECIPE_WHOLE,                    \
     {"mlp.down_proj.weight"}, NULL}
/* The layer's extra states (in the order mcore/ lists their objects) and the last stage. */
#define LAYER_EXTRAS_AND_LAST                                                                 \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_qkv._extra_state", 6, 5, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.linear_proj._extra_state", 2, 2, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc1._extra_state", 13, 10, CKPTFS_NEED_ALWAYS),       \
    EXTRA(CKPTFS_SCOPE_LAYER, "mlp.linear_fc2._extra_state", 15, 12, CKPTFS_NEED_ALWAYS),       \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.core_attention._extra_state", 0, NONE, CKPTFS_NEED_ALWAYS), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.q_layernorm._extra_state", 8, NONE, CKPTFS_NEED_QK_NORM), \
    EXTRA(CKPTFS_SCOPE_LAYER, "self_attention.k_layernorm._extra_state", 10, NONE, CKPTFS_NEED_QK_NORM), \
    {CKPTFS_SCOPE_LAST, false, "decoder.final_layernorm.weight", NULL, 0, 0, CKPTFS_NEED_ALWAYS, \
     1, CKPTFS_DIM_HIDDEN, CKPTFS_DIM_ONE, CKPTFS_TP_REPLICATED, CKPTFS_RECIPE_WHOLE,          \
     {"model.norm.weight"}, NULL},                                                            \
    EXTRA(CKPTFS_SCOPE_LAST, "decoder.final_layernorm._extra_state", 1, NONE, CKPTFS_NEED_ALWAYS), \
    {CKPTFS_SCOPE_LAST, false, "output_layer.weight", NULL, 2, 1, CKPTFS_NEED_OUTPUT, 2,        \
     CKPTFS_DIM_VOCAB, CKPTFS_DIM_HIDDEN, CKPTFS_TP_VOCAB, CKPTFS_RECIPE_WHOLE,                 \
     {"lm_head.weight"}, "model.embed_tokens.weight"},                                         \
    EXTRA(CKPTFS_SCOPE_LAST, "output_layer._extra_state", 3, 2, CKPTFS_NEED_ALWAYS)

static const CkptfsRule llama_rules[] = {
    EMBEDDING,
    LAYER_NORM("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight", 3, 0,
               "input_layernorm.weight"),
    {CKPTFS_SCOPE_LAYER, false, "self_attention.linear_qkv.weight", NULL, 4, 3,
     CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS, CKPTFS_RECIPE_QKV,
     {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"}, NULL},
    {CKPTFS_SCOPE_LAYER, false, "self_attention.linear_qkv.bias", NULL, 5, 4,
     CKPTFS_NEED_QKV_BIAS, 1, CKPTFS_DIM_QKV, CKPTFS_DIM_ONE, CKPTFS_TP_ROWS, CKPTFS_RECIPE_QKV,
     {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}, NULL},
    QK_NORM("self_attention.q_layernorm.weight", 7, 6, "self_attn.q_norm.weight"),
    QK_NORM("self_attention.k_layernorm.weight", 9, 7, "self_attn.k_norm.weight"),
    ATTENTION_OUT_AND_MLP_NORM,
    {CKPTFS_SCOPE_LAYER, false, "mlp.linear_fc1.weight", NULL, 12, 9, CKPTFS_NEED_ALWAYS, 2,
     CKPTFS_DIM_FFN2, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES,
     {"mlp.gate_proj.weight", "mlp.up_proj.weight"}, NULL},
    MLP_OUT,
    LAYER_EXTRAS_AND_LAST,
};

/* Phi-3: the same Megatron entries, filled from fused Hugging Face projections. */
static const CkptfsRule phi3_rules[] = {
    EMBEDDING,
    LAYER_NORM("self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight", 3, 0,
               "input_layernorm.weight"),
    {CKPTFS_SCOPE_LAYER, false, "self_attention.linear_qkv.weight", NULL, 4, 3,
     CKPTFS_NEED_ALWAYS, 2, CKPTFS_DIM_QKV, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROWS,
     CKPTFS_RECIPE_QKV_FUSED, {"self_attn.qkv_proj.weight"}, NULL},
    ATTENTION_OUT_AND_MLP_NORM,
    {CKPTFS_SCOPE_LAYER, false, "mlp.linear_fc1.weight", NULL, 12, 9, CKPTFS_NEED_ALWAYS, 2,
     CKPTFS_DIM_FFN2, CKPTFS_DIM_HIDDEN, CKPTFS_TP_ROW_HALVES, CKPTFS_RECIPE_HALVES_FUSED,
     {"mlp.gate_up_proj.weight"}, NULL},
    MLP_OUT,
    LAYER_EXTRAS_AND_LAST,
};

const CkptfsFamily ckptfs_family_llama = {"llama", llama_rules, G_N_ELEMENTS(llama_rules)};
const CkptfsFamily ckptfs_family_phi3 = {"phi3", phi3_rules, G_N_ELEMENTS(phi3_rules)};
