/* Model rules: config.json parsing and the checks against the catalog. */
#include <json-glib/json-glib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/mcore.h"
#include "ckptfs/model.h"
#include "tap.h"

typedef struct {
    unsigned layers, hidden, heads, kv, head_dim, ffn, vocab;
    bool tied, bias, qk_norm, lm_head;
    unsigned experts, moe_ffn, shared_ffn; /* Qwen-MoE names when experts > 0 */
    unsigned dense_layers;                 /* bit i: layer i is dense */
} Shape;

static void add(CkptfsCatalog *c, const char *name, unsigned ndim, uint64_t d0, uint64_t d1)
{
    uint64_t shape[2] = {d0, d1};
    ckptfs_catalog_add_contiguous(c, name, CKPTFS_DTYPE_BF16, ndim, shape, 0, 0);
}

static CkptfsCatalog *catalog_of(const Shape *s)
{
    CkptfsCatalog *c = ckptfs_catalog_new();
    uint64_t q = (uint64_t)s->heads * s->head_dim, kv = (uint64_t)s->kv * s->head_dim;
    add(c, "model.embed_tokens.weight", 2, s->vocab, s->hidden);
    for (unsigned i = 0; i < s->layers; i++) {
        char n[128];
#define L(suffix, nd, a, b) (g_snprintf(n, sizeof n, "model.layers.%u.%s", i, suffix), add(c, n, nd, a, b))
        L("input_layernorm.weight", 1, s->hidden, 0);
        L("self_attn.q_proj.weight", 2, q, s->hidden);
        L("self_attn.k_proj.weight", 2, kv, s->hidden);
        L("self_attn.v_proj.weight", 2, kv, s->hidden);
        if (s->bias) {
            L("self_attn.q_proj.bias", 1, q, 0);
            L("self_attn.k_proj.bias", 1, kv, 0);
            L("self_attn.v_proj.bias", 1, kv, 0);
        }
        if (s->qk_norm) {
            L("self_attn.q_norm.weight", 1, s->head_dim, 0);
            L("self_attn.k_norm.weight", 1, s->head_dim, 0);
        }
        L("self_attn.o_proj.weight", 2, s->hidden, q);
        L("post_attention_layernorm.weight", 1, s->hidden, 0);
        if (s->experts && !(s->dense_layers & (1u << i))) {
            L("mlp.gate.weight", 2, s->experts, s->hidden);
            for (unsigned e = 0; e < s->experts; e++) {
                char x[64];
#define X(suffix, a, b) (g_snprintf(x, sizeof x, "mlp.experts.%u.%s", e, suffix), L(x, 2, a, b))
                X("gate_proj.weight", s->moe_ffn, s->hidden);
                X("up_proj.weight", s->moe_ffn, s->hidden);
                X("down_proj.weight", s->hidden, s->moe_ffn);
#undef X
            }
            if (s->shared_ffn) {
                L("mlp.shared_expert.gate_proj.weight", 2, s->shared_ffn, s->hidden);
                L("mlp.shared_expert.up_proj.weight", 2, s->shared_ffn, s->hidden);
                L("mlp.shared_expert.down_proj.weight", 2, s->hidden, s->shared_ffn);
                L("mlp.shared_expert_gate.weight", 2, 1, s->hidden);
            }
            continue;
        }
        L("mlp.gate_proj.weight", 2, s->ffn, s->hidden);
        L("mlp.up_proj.weight", 2, s->ffn, s->hidden);
        L("mlp.down_proj.weight", 2, s->hidden, s->ffn);
#undef L
    }
    add(c, "model.norm.weight", 1, s->hidden, 0);
    if (s->lm_head)
        add(c, "lm_head.weight", 2, s->vocab, s->hidden);
    return c;
}

static JsonObject *config_of(const char *json)
{
    JsonParser *p = json_parser_new();
    g_assert(json_parser_load_from_data(p, json, -1, NULL));
    JsonObject *o = json_object_ref(json_node_get_object(json_parser_get_root(p)));
    g_object_unref(p);
    return o;
}

static bool run(const char *json, const Shape *s, CkptfsModel *m, char **why)
{
    JsonObject *config = config_of(json);
    CkptfsCatalog *c = catalog_of(s);
    GError *error = NULL;
    bool ok = ckptfs_model_from_config(config, c, m, NULL, &error);
    *why = error ? g_strdup(error->message) : g_strdup("");
    g_clear_error(&error);
    ckptfs_catalog_free(c);
    json_object_unref(config);
    return ok;
}

#define LLAMA "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", " \
              "\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, " \
              "\"num_hidden_layers\": 2, \"intermediate_size\": 96, \"vocab_size\": 250"

#define QWEN2_MOE "\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\", " \
                  "\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, " \
                  "\"num_hidden_layers\": 3, \"intermediate_size\": 96, \"vocab_size\": 250, " \
                  "\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, " \
                  "\"shared_expert_intermediate_size\": 48"

/* Mixture of experts: sizes, the shared expert, routing, dense layers, and what is refused. */
static void test_moe_configs(void)
{
    CkptfsModel m;
    char *why;
    Shape moe = {3, 64, 8, 2, 8, 96, 250, false, true, false, true, 4, 32, 48, 1u << 1};
    bool ok = run("{" QWEN2_MOE ", \"mlp_only_layers\": [1], \"norm_topk_prob\": false}", &moe, &m, &why);
    tap_ok(ok && m.experts == 4 && m.topk == 2 && m.moe_ffn == 32 && m.shared_ffn == 48 && m.shared_gate &&
               !m.renormalize && ckptfs_model_layer_is_moe(&m, 0) && !ckptfs_model_layer_is_moe(&m, 1) &&
               ckptfs_model_moe_layers(&m) == 2,
           "Qwen2-MoE with a dense layer 1 (%s)", why);
    g_free(why);
    Shape step2 = moe;
    step2.dense_layers = 1u << 0 | 1u << 2;
    ok = run("{" QWEN2_MOE ", \"decoder_sparse_step\": 2}", &step2, &m, &why);
    tap_ok(ok && !ckptfs_model_layer_is_moe(&m, 0) && ckptfs_model_layer_is_moe(&m, 1) &&
               !ckptfs_model_layer_is_moe(&m, 2),
           "decoder_sparse_step 2: layers 1, 3, ... are MoE (%s)", why);
    g_free(why);
    ok = run("{" QWEN2_MOE ", \"mlp_only_layers\": [3]}", &moe, &m, &why);
    tap_ok(!ok && strstr(why, "mlp_only_layers"), "a dense layer beyond the model is refused (%s)", why);
    g_free(why);
    ok = run("{" QWEN2_MOE ", \"num_experts_per_tok\": 5}", &moe, &m, &why);
    tap_ok(!ok && strstr(why, "num_experts_per_tok"), "top-k above the experts is refused (%s)", why);
    g_free(why);
    ok = run("{" QWEN2_MOE ", \"mlp_only_layers\": [1], \"n_group\": 8}", &moe, &m, &why);
    tap_ok(!ok && strstr(why, "n_group"), "an unsupported routing field is refused by name (%s)", why);
    g_free(why);
    ok = run("{" QWEN2_MOE ", \"mlp_only_layers\": [1], \"num_experts\": 5}", &moe, &m, &why);
    tap_ok(!ok && strstr(why, "model.layers.0.mlp.gate.weight") && strstr(why, "[5, 64]"),
           "a router of the wrong size is named (%s)", why);
    g_free(why);
    {
        /* The catalog without one expert tensor. */
        JsonObject *config = config_of("{" QWEN2_MOE ", \"mlp_only_layers\": [1]}");
        CkptfsCatalog *full = catalog_of(&moe), *holed = ckptfs_catalog_new();
        for (unsigned i = 0; i < ckptfs_catalog_count(full); i++) {
            const CkptfsTensor *t = ckptfs_catalog_at(full, i);
            if (strcmp(t->name, "model.layers.2.mlp.experts.3.up_proj.weight") != 0)
                ckptfs_catalog_add_contiguous(holed, t->name, t->dtype, t->ndim, t->shape, 0, 0);
        }
        GError *error = NULL;
        ok = ckptfs_model_from_config(config, holed, &m, NULL, &error);
        tap_ok(!ok && error && strstr(error->message, "model.layers.2.mlp.experts.3.up_proj.weight") &&
                   strstr(error->message, "missing"),
               "a missing expert is named (%s)", error ? error->message : "");
        g_clear_error(&error);
        ckptfs_catalog_free(holed);
        ckptfs_catalog_free(full);
        json_object_unref(config);
    }
    Shape wrong = moe;
    wrong.moe_ffn = 16;
    ok = run("{" QWEN2_MOE ", \"mlp_only_layers\": [1]}", &wrong, &m, &why);
    tap_ok(!ok && strstr(why, "experts.0.gate_proj.weight") && strstr(why, "[16, 64]"),
           "an expert of the wrong shape is named with its shape (%s)", why);
    g_free(why);
}


/* A DeepSeek catalog: hidden 32, 4 heads, q_lora 16 (0: q_proj), kv_lora 16, nope 8, rope 4,
 * v 8, ffn 48, 4 experts of 16, one shared; layers [0, DENSE) dense, then MoE; MTP layers after
 * the decoder's; the expert bias of layer L of type BIAS_DTYPE (L = 1) or F32. */
static CkptfsCatalog *deepseek_catalog(unsigned layers, unsigned dense, unsigned q_lora, bool bias,
                                       unsigned mtp, CkptfsDtype bias_dtype)
{
    CkptfsCatalog *c = ckptfs_catalog_new();
    add(c, "model.embed_tokens.weight", 2, 100, 32);
#define L(suffix, nd, a, b) (g_snprintf(n, sizeof n, "model.layers.%u.%s", i, suffix), add(c, n, nd, a, b))
    for (unsigned i = 0; i < layers + mtp; i++) {
        char n[128];
        L("input_layernorm.weight", 1, 32, 0);
        if (q_lora) {
            L("self_attn.q_a_proj.weight", 2, q_lora, 32);
            L("self_attn.q_a_layernorm.weight", 1, q_lora, 0);
            L("self_attn.q_b_proj.weight", 2, 4 * 12, q_lora);
        } else {
            L("self_attn.q_proj.weight", 2, 4 * 12, 32);
        }
        L("self_attn.kv_a_proj_with_mqa.weight", 2, 16 + 4, 32);
        L("self_attn.kv_a_layernorm.weight", 1, 16, 0);
        L("self_attn.kv_b_proj.weight", 2, 4 * 16, 16);
        L("self_attn.o_proj.weight", 2, 32, 4 * 8);
        L("post_attention_layernorm.weight", 1, 32, 0);
        if (i < dense) {
            L("mlp.gate_proj.weight", 2, 48, 32);
            L("mlp.up_proj.weight", 2, 48, 32);
            L("mlp.down_proj.weight", 2, 32, 48);
            continue;
        }
        L("mlp.gate.weight", 2, 4, 32);
        if (bias) {
            g_snprintf(n, sizeof n, "model.layers.%u.mlp.gate.e_score_correction_bias", i);
            uint64_t shape[1] = {4};
            ckptfs_catalog_add_contiguous(c, n, i == 1 ? bias_dtype : CKPTFS_DTYPE_F32, 1, shape, 0, 0);
        }
        for (unsigned e = 0; e < 4; e++) {
            char x[64];
#define X(suffix, a, b) (g_snprintf(x, sizeof x, "mlp.experts.%u.%s", e, suffix), L(x, 2, a, b))
            X("gate_proj.weight", 16, 32);
            X("up_proj.weight", 16, 32);
            X("down_proj.weight", 32, 16);
#undef X
        }
        L("mlp.shared_experts.gate_proj.weight", 2, 16, 32);
        L("mlp.shared_experts.up_proj.weight", 2, 16, 32);
        L("mlp.shared_experts.down_proj.weight", 2, 32, 16);
        if (i >= layers) {
            L("enorm.weight", 1, 32, 0);
            L("hnorm.weight", 1, 32, 0);
            L("eh_proj.weight", 2, 32, 64);
            L("shared_head.norm.weight", 1, 32, 0);
        }
    }
#undef L
    add(c, "model.norm.weight", 1, 32, 0);
    add(c, "lm_head.weight", 2, 100, 32);
    return c;
}

#define DEEPSEEK_V3 "\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", " \
    "\"hidden_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"num_hidden_layers\": 3, " \
    "\"intermediate_size\": 48, \"vocab_size\": 100, \"q_lora_rank\": 16, \"kv_lora_rank\": 16, " \
    "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, \"n_routed_experts\": 4, " \
    "\"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"first_k_dense_replace\": 1, " \
    "\"num_nextn_predict_layers\": 1, \"routed_scaling_factor\": 2.5"
#define DEEPSEEK_V2 "\"architectures\": [\"DeepseekV2ForCausalLM\"], \"model_type\": \"deepseek_v2\", " \
    "\"hidden_size\": 32, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"num_hidden_layers\": 3, " \
    "\"intermediate_size\": 48, \"vocab_size\": 100, \"q_lora_rank\": null, \"kv_lora_rank\": 16, " \
    "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, \"n_routed_experts\": 4, " \
    "\"moe_intermediate_size\": 16, \"n_shared_experts\": 1, \"first_k_dense_replace\": 1, " \
    "\"num_experts_per_tok\": 2, \"scoring_func\": \"softmax\", \"topk_method\": \"greedy\""

static bool run_deepseek(const char *json, CkptfsCatalog *c, CkptfsModel *m, char **why)
{
    JsonObject *config = config_of(json);
    GError *error = NULL;
    bool ok = ckptfs_model_from_config(config, c, m, NULL, &error);
    *why = error ? g_strdup(error->message) : g_strdup("");
    g_clear_error(&error);
    ckptfs_catalog_free(c);
    json_object_unref(config);
    return ok;
}

/* DeepSeek: MLA sizes, routing as Megatron's arguments, and what routes differently, refused. */
static void test_deepseek_configs(void)
{
    CkptfsModel m;
    char *why;
    const char *v3_routing = ", \"num_experts_per_tok\": 2, \"n_group\": 2, \"topk_group\": 1, "
                             "\"norm_topk_prob\": true";
    g_autofree char *v3 = g_strconcat("{" DEEPSEEK_V3, v3_routing, "}", NULL);
    bool ok = run_deepseek(v3, deepseek_catalog(3, 1, 16, true, 1, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(ok && m.mla && m.q_lora == 16 && m.kv_lora == 16 && m.qk_head_dim == 8 && m.qk_rope_dim == 4 &&
               m.v_head_dim == 8 && m.sigmoid_scores && m.expert_bias && m.groups == 2 && m.group_topk == 1 &&
               m.topk_scaling == 2.5 && m.shared_ffn == 16 && !ckptfs_model_layer_is_moe(&m, 0) &&
               ckptfs_model_layer_is_moe(&m, 1) && m.mtp_layers == 1 && !m.mtp && m.fp32_dtype == CKPTFS_DTYPE_F32,
           "DeepSeek-V3: MLA, sigmoid routing with bias and groups, dense layer 0, MTP layer (%s)", why);
    g_free(why);
    ok = run_deepseek(v3, deepseek_catalog(3, 1, 16, true, 0, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(ok, "the MTP layer's tensors are not needed unless served (%s)", why);
    g_free(why);
    {
        JsonObject *config = config_of(v3);
        CkptfsCatalog *c = deepseek_catalog(3, 1, 16, true, 0, CKPTFS_DTYPE_F32);
        GError *error = NULL;
        ok = ckptfs_model_from_config(config, c, &m, NULL, &error) && ckptfs_model_serve_mtp(&m, c, &error);
        tap_ok(!ok && error && strstr(error->message, "model.layers.3.") && strstr(error->message, "missing"),
               "-o mtp=on without the MTP layer's tensors names one (%s)", error ? error->message : "");
        g_clear_error(&error);
        ckptfs_catalog_free(c);
        c = deepseek_catalog(3, 1, 16, true, 1, CKPTFS_DTYPE_F32);
        ok = ckptfs_model_from_config(config, c, &m, NULL, &error) && ckptfs_model_serve_mtp(&m, c, &error);
        tap_ok(ok && m.mtp, "-o mtp=on with them (%s)", error ? error->message : "");
        g_clear_error(&error);
        ckptfs_catalog_free(c);
        json_object_unref(config);
    }
    ok = run_deepseek(v3, deepseek_catalog(3, 1, 16, true, 1, CKPTFS_DTYPE_BF16), &m, &why);
    tap_ok(!ok && strstr(why, "model.layers.2.mlp.gate.e_score_correction_bias") && strstr(why, "is F32; BF16 expected"),
           "expert biases of two types are refused (%s)", why);
    g_free(why);
    ok = run_deepseek(v3, deepseek_catalog(3, 1, 16, false, 1, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(!ok && strstr(why, "e_score_correction_bias") && strstr(why, "missing"),
           "V3 without its expert bias is refused (%s)", why);
    g_free(why);
    static const struct {
        const char *extra, *says, *what;
    } refused[] = {
        {", \"num_experts_per_tok\": 4, \"n_group\": 2, \"topk_group\": 1, \"norm_topk_prob\": true", "2 x topk_group",
         "groups ranked by the top two only when topk = 2 x topk_group"},
        {", \"num_experts_per_tok\": 2, \"n_group\": 3, \"topk_group\": 1, \"norm_topk_prob\": true", "does not divide",
         "n_group not dividing the experts"},
        {", \"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"scoring_func\": \"softmax\"", "scoring_func",
         "V3 with softmax scores"},
        {", \"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": false", "norm_topk_prob",
         "sigmoid top-k not normalised"},
        {", \"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": 1, \"norm_topk_prob\": true, \"num_key_value_heads\": 2",
         "num_key_value_heads", "MLA with fewer key/value heads"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(refused); i++) {
        g_autofree char *json = g_strconcat("{" DEEPSEEK_V3, refused[i].extra, "}", NULL);
        ok = run_deepseek(json, deepseek_catalog(3, 1, 16, true, 1, CKPTFS_DTYPE_F32), &m, &why);
        tap_ok(!ok && strstr(why, refused[i].says), "refused: %s (%s)", refused[i].what, why);
        g_free(why);
    }
    { /* what the Megatron views refuse, the sizes alone still give (the experts split as saved) */
        JsonObject *config = config_of("{" DEEPSEEK_V3 ", \"num_experts_per_tok\": 2, \"n_group\": 1, \"topk_group\": "
                                       "1, \"norm_topk_prob\": true, \"num_key_value_heads\": 2}");
        CkptfsModel sized = {.arch = ckptfs_architecture_find("DeepseekV3ForCausalLM", NULL)};
        GError *error = NULL;
        ok = ckptfs_model_read_sizes(config, &sized, &error);
        tap_ok(ok && sized.experts == 4 && sized.hidden == 32 && sized.moe_ffn == 16,
               "MLA with fewer key/value heads: the sizes are read (%s)", error ? error->message : "");
        g_clear_error(&error);
        json_object_unref(config);
    }
    ok = run_deepseek("{" DEEPSEEK_V3 ", \"num_experts_per_tok\": 2, \"norm_topk_prob\": true}",
                      deepseek_catalog(3, 1, 16, true, 1, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(!ok && strstr(why, "\"n_group\" is missing"), "a V3 config without n_group is refused, not guessed (%s)", why);
    g_free(why);
    ok = run_deepseek("{" DEEPSEEK_V2 ", \"norm_topk_prob\": false, \"routed_scaling_factor\": 16.0}",
                      deepseek_catalog(3, 1, 0, false, 0, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(ok && m.q_lora == 0 && !m.sigmoid_scores && !m.expert_bias && m.groups == 0 && m.topk_scaling == 16.0 &&
               !m.renormalize,
           "DeepSeek-V2-Lite: q_proj, softmax, weights x 16 (%s)", why);
    g_free(why);
    ok = run_deepseek("{" DEEPSEEK_V2 ", \"norm_topk_prob\": true, \"routed_scaling_factor\": 16.0}",
                      deepseek_catalog(3, 1, 0, false, 0, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(ok && m.renormalize && m.topk_scaling == 0,
           "V2 renormalising: its gate does not scale, nor does Megatron (%s)", why);
    g_free(why);
    ok = run_deepseek("{" DEEPSEEK_V2 ", \"topk_method\": \"group_limited_greedy\", \"norm_topk_prob\": false, "
                      "\"routed_scaling_factor\": 1.0}",
                      deepseek_catalog(3, 1, 0, false, 0, CKPTFS_DTYPE_F32), &m, &why);
    tap_ok(!ok && strstr(why, "group_limited_greedy"), "V2's group_limited_greedy is refused (%s)", why);
    g_free(why);
}

/* A Megatron checkpoint without an architecture name is matched by its features: sigmoid routing
 * with shared experts and no MLA is GLM-4.5 (with or without q/k norms, biases), softmax routing
 * with a shared expert Qwen2-MoE, never the other way round; attention sinks with biases on every
 * linear are GPT-OSS, and without them attention biases alone make a Mixtral with biases. */
static void test_features(void)
{
    static const struct {
        bool sigmoid, shared, qk_norm, bias, sinks_and_biases;
        const char *want;
    } cases[] = {
        {true, true, true, true, false, "glm4_moe"},     {true, true, false, false, false, "glm4_moe"},
        {false, true, false, true, false, "qwen2_moe"},  {false, false, true, false, false, "qwen3_moe"},
        {true, false, false, false, false, NULL},        {false, false, false, false, false, "mixtral"},
        {false, false, false, true, true, "gpt_oss"},    {false, false, false, true, false, "mixtral"},
        {false, true, false, true, true, NULL},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        CkptfsModel f;
        memset(&f, 0, sizeof f);
        f.experts = 8;
        f.sigmoid_scores = f.expert_bias = cases[i].sigmoid;
        f.shared_ffn = cases[i].shared ? 32 : 0;
        f.qk_norm = cases[i].qk_norm;
        f.qkv_bias = cases[i].bias;
        f.sinks = f.linear_bias = cases[i].sinks_and_biases;
        const CkptfsArchitecture *a = ckptfs_architecture_find(NULL, &f);
        const char *got = a ? a->model_type : NULL;
        tap_ok(g_strcmp0(got, cases[i].want) == 0,
               "features sigmoid=%d shared=%d qk_norm=%d bias=%d sinks and biases=%d: %s (want %s)", cases[i].sigmoid,
               cases[i].shared, cases[i].qk_norm, cases[i].bias, cases[i].sinks_and_biases, got ? got : "none",
               cases[i].want ? cases[i].want : "none");
    }
}

/* A vision-language model's vision part: read by its rows (both spellings of a field must
 * agree), what no row reads refused by name, the tower without rules said by name. */
static void test_vision_configs(void)
{
#define QWEN2_5_VL "\"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], \"model_type\": \"qwen2_5_vl\", " \
                   "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_hidden_layers\": 2, " \
                   "\"intermediate_size\": 96, \"vocab_size\": 250, \"rope_scaling\": {\"type\": \"mrope\", " \
                   "\"mrope_section\": [1, 1, 2]}}, "
#define GLM4V "\"architectures\": [\"Glm4vForConditionalGeneration\"], \"model_type\": \"glm4v\", " \
              "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, " \
              "\"intermediate_size\": 96, \"vocab_size\": 250, \"rope_parameters\": {\"rope_type\": \"default\", " \
              "\"partial_rotary_factor\": 0.5, \"mrope_section\": [1, 1, 2]}}, "
#define GLM4V_MOE "\"architectures\": [\"Glm4vMoeForConditionalGeneration\"], \"model_type\": \"glm4v_moe\", " \
                  "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, " \
                  "\"intermediate_size\": 96, \"vocab_size\": 250, \"moe_intermediate_size\": 32, " \
                  "\"n_routed_experts\": 4, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, \"first_k_dense_replace\": 1, " \
                  "\"norm_topk_prob\": true, \"n_group\": 1, \"topk_group\": 1, \"routed_scaling_factor\": 1.0, " \
                  "\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5, " \
                  "\"mrope_section\": [1, 1, 2]}}, "
#define GLM4V_VISION "\"depth\": 3, \"hidden_size\": 32, \"num_heads\": 2, \"intermediate_size\": 48, " \
                     "\"out_hidden_size\": 64, \"image_size\": 56, \"patch_size\": 14, \"in_channels\": 3, " \
                     "\"rms_norm_eps\": 1e-5, \"attention_bias\": false, \"attention_dropout\": 0.0, " \
                     "\"model_type\": \"glm4v_vision\", \"initializer_range\": 0.02"
#define VISION "\"depth\": 3, \"hidden_size\": 32, \"intermediate_size\": 48, \"out_hidden_size\": 64, " \
               "\"model_type\": \"qwen2_5_vl_vision\", \"initializer_range\": 0.02"
#define QWEN3_VL "\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"model_type\": \"qwen3_vl\", " \
                 "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_hidden_layers\": 2, " \
                 "\"intermediate_size\": 96, \"vocab_size\": 250, \"head_dim\": 8, \"rope_parameters\": " \
                 "{\"rope_type\": \"default\", \"mrope_section\": [1, 1, 2], \"mrope_interleaved\": true}}, "
#define QWEN3_VISION "\"depth\": 3, \"hidden_size\": 32, \"num_heads\": 2, \"intermediate_size\": 48, " \
                     "\"out_hidden_size\": 64, \"model_type\": \"qwen3_vl_vision\", \"hidden_act\": \"gelu_pytorch_tanh\", " \
                     "\"patch_size\": 16, \"in_channels\": 3, \"num_position_embeddings\": 16"
#define QWEN3_5_TEXT(interleaved) \
    "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, " \
    "\"num_hidden_layers\": 2, \"intermediate_size\": 96, \"vocab_size\": 250, \"head_dim\": 32, " \
    "\"layer_types\": [\"linear_attention\", \"full_attention\"], \"linear_num_key_heads\": 2, " \
    "\"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 8, " \
    "\"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25, " \
    "\"mrope_section\": [2, 1, 1], \"mrope_interleaved\": " interleaved "}}, "
#define QWEN3_5 "\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", " \
                QWEN3_5_TEXT("true")
#define GEMMA3 "\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\", " \
               "\"text_config\": {\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 6, " \
               "\"intermediate_size\": 96, \"vocab_size\": 256, \"head_dim\": 16, \"model_type\": \"gemma3_text\"}, "
#define SIGLIP "\"num_hidden_layers\": 2, \"hidden_size\": 32, \"num_attention_heads\": 2, \"intermediate_size\": 48, " \
               "\"image_size\": 32, \"patch_size\": 8, \"num_channels\": 3, \"layer_norm_eps\": 1e-6, " \
               "\"hidden_act\": \"gelu_pytorch_tanh\", \"vision_use_head\": false, \"attention_dropout\": 0.0, " \
               "\"model_type\": \"siglip_vision_model\""
    static const struct {
        const char *json, *want, *what;
    } cases[] = {
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"fullatt_block_indexes\": [2], \"in_chans\": 3, \"in_channels\": 3}}",
         "tensor 'model.embed_tokens.weight' is missing from the checkpoint",
         "a Qwen2.5-VL config read whole (in_chans and in_channels agreeing), then the tensors looked for"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"num_heads\": 3}}",
         "vision_config.hidden_size 32 is not a multiple of num_heads 3", "vision heads that do not divide its width"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"window_attention_kind\": \"shifted\"}}",
         "vision_config.window_attention_kind is not understood", "a vision field no row reads"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"in_chans\": 3, \"in_channels\": 4}}",
         "vision_config.in_chans 3 and vision_config.in_channels 4 disagree", "two spellings of the channels disagreeing"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"patch_size\": 14, \"spatial_patch_size\": 16}}",
         "vision_config.patch_size 14 and vision_config.spatial_patch_size 16 disagree",
         "the release's spatial_patch_size other than patch_size"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"fullatt_block_indexes\": [1, 3]}}",
         "vision_config.fullatt_block_indexes entry 1 is not a block number below depth 3", "a full-attention block past the tower"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"hidden_act\": \"gelu\"}}",
         "vision_config.hidden_act 'gelu' has no Megatron equivalent", "a vision activation other than silu"},
        {"{" QWEN2_5_VL "\"vision_config\": {\"depth\": 100000}}", "100000 vision blocks is over the limit",
         "a vision tower deeper than the limit"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"hidden_size\": 1048576, \"num_heads\": 1, \"spatial_merge_size\": 64}}",
         "vision merged width (hidden_size x spatial_merge_size^2) is over the limit", "a merger wider than the limit"},
        {"{" QWEN2_5_VL "\"vision_config\": {" VISION ", \"patch_size\": 4096}}",
         "vision patch (channels x temporal_patch_size x patch_size^2) is over the limit", "a patch larger than the limit"},
        {"{" QWEN2_5_VL "\"vision_config\": 7}", "no \"vision_config\" object", "a vision_config that is not an object"},
        {"{" QWEN2_5_VL "\"image_token_id\": 5}", "no \"vision_config\" object", "no vision_config"},
        /* GLM's tower: its own rows (Glm4vVisionConfig's fields and defaults); GLM-4.5V's config
         * read whole, then its tensors looked for; GLM-4.1V's refused for its rope after its tower */
        {"{" GLM4V_MOE "\"vision_config\": {" GLM4V_VISION "}}",
         "tensor 'model.embed_tokens.weight' is missing from the checkpoint",
         "a GLM-4.5V config read whole (image_size, rms_norm_eps, attention_bias, attention_dropout), then the "
         "tensors looked for"},
        {"{" GLM4V_MOE "\"vision_config\": {}}", "tensor 'model.embed_tokens.weight' is missing from the checkpoint",
         "a GLM-4.5V vision_config left empty: Glm4vVisionConfig's defaults"},
        {"{" GLM4V "\"vision_config\": {" GLM4V_VISION "}}",
         "Glm4vForConditionalGeneration rotates interleaved pairs with its mrope sections taken by frequency",
         "GLM-4.1V's rope, after its tower is read"},
        {"{" GLM4V "\"vision_config\": {" GLM4V_VISION ", \"fullatt_block_indexes\": [1]}}",
         "vision_config.fullatt_block_indexes is not understood", "GLM-4.1V's tower has no windows"},
        {"{" GLM4V "\"vision_config\": {" GLM4V_VISION ", \"in_chans\": 3}}",
         "vision_config.in_chans is not understood", "Qwen2.5-VL's spelling of the channels in GLM-4.1V's"},
        {"{" GLM4V "\"vision_config\": {" GLM4V_VISION ", \"attention_bias\": \"yes\"}}",
         "vision_config.attention_bias", "a qkv bias that is not a boolean"},
        {"{" GLM4V "\"vision_config\": {\"depth\": 3, \"hidden_size\": 32, \"num_heads\": 2, \"patch_size\": [14, 16]}}",
         "\"vision_config.patch_size\" is not a positive integer",
         "a patch of two sides (Glm4vVisionConfig allows a list; its modules take one number)"},
        {"{" GLM4V "\"vision_config\": {\"depth\": 3, \"hidden_size\": 32, \"num_heads\": 2, \"image_size\": [56, 56]}}",
         "\"vision_config.image_size\" is not a positive integer", "an image size of two sides"},
        /* Qwen3-VL's tower: its own rows and defaults (27 blocks; deepstack blocks 8, 16, 24 where
         * they exist) */
        {"{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"model_type\": \"qwen3_vl\", \"text_config\": "
         "{\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, "
         "\"intermediate_size\": 96, \"vocab_size\": 250, \"head_dim\": 8, \"rope_parameters\": {\"rope_type\": "
         "\"default\", \"mrope_section\": [1, 1, 2], \"mrope_interleaved\": false}}, \"vision_config\": {" QWEN3_VISION
         ", \"deepstack_visual_indexes\": [0, 2]}}",
         "rope_parameters.mrope_interleaved is not true: Qwen3VLForConditionalGeneration's rope hands out its sections "
         "interleaved", "a Qwen3-VL rope said not to interleave"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION "}}",
         "vision_config.deepstack_visual_indexes entry 0 is not a block number below depth 3",
         "the default deepstack blocks (8, 16, 24) past a 3-block tower: mergers no block feeds"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"deepstack_visual_indexes\": [2, 1]}}",
         "vision_config.deepstack_visual_indexes entry 1 (1) does not follow 2", "deepstack blocks out of order"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"deepstack_visual_indexes\": [3]}}",
         "vision_config.deepstack_visual_indexes entry 0 is not a block number below depth 3", "a deepstack block past the tower"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"fullatt_block_indexes\": [1]}}",
         "vision_config.fullatt_block_indexes is not understood", "Qwen2.5-VL's full-attention blocks in a Qwen3-VL tower"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"window_size\": 112}}",
         "vision_config.window_size is not understood", "Qwen2.5-VL's window in a Qwen3-VL tower"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"hidden_act\": \"silu\"}}",
         "vision_config.hidden_act 'silu' is not understood: the vision tower's rules know gelu_pytorch_tanh only",
         "a Qwen3-VL vision activation other than gelu_pytorch_tanh"},
        {"{" QWEN3_VL "\"vision_config\": {" QWEN3_VISION ", \"num_position_embeddings\": 0}}",
         "vision_config.num_position_embeddings", "no learned positions"},
        /* Gemma 3's SigLIP tower: its own rows (SiglipVisionConfig's fields and defaults) and
         * the projector's image tokens */
        {"{" GEMMA3 "\"mm_tokens_per_image\": 4, \"image_token_index\": 250, \"vision_config\": {" SIGLIP "}}",
         "tensor 'model.embed_tokens.weight' is missing from the checkpoint",
         "a Gemma 3 VLM config read whole (no mrope asked for), then the tensors looked for"},
        {"{" GEMMA3 "\"mm_tokens_per_image\": 50, \"vision_config\": {}}",
         "mm_tokens_per_image 50 is not the square of a side that divides the 14 patches a side",
         "a SigLIP vision_config left empty: SiglipVisionConfig's 224x224 images in patches of 16"},
        {"{" GEMMA3 "\"vision_config\": {}}", "mm_tokens_per_image 256 is not the square of a side that divides the "
         "14 patches a side", "Gemma3Config's 256 image tokens with SiglipVisionConfig's 14x14 patches (a pool of no "
         "patches)"},
        {"{" GEMMA3 "\"mm_tokens_per_image\": 8, \"vision_config\": {" SIGLIP "}}",
         "mm_tokens_per_image 8 is not the square of a side that divides the 4 patches a side", "image tokens not a square"},
        {"{" GEMMA3 "\"mm_tokens_per_image\": 9, \"vision_config\": {" SIGLIP "}}",
         "mm_tokens_per_image 9 is not the square of a side", "a pool side (3) that does not divide the patches (4)"},
        {"{" GEMMA3 "\"vision_config\": {" SIGLIP ", \"image_size\": 36}}",
         "vision_config.image_size 36 is not a multiple of vision_config.patch_size 8", "an image of part patches"},
        {"{" GEMMA3 "\"vision_config\": {" SIGLIP ", \"hidden_act\": \"gelu\"}}",
         "vision_config.hidden_act 'gelu' is not understood", "a SigLIP activation other than gelu_pytorch_tanh"},
        {"{" GEMMA3 "\"vision_config\": {" SIGLIP ", \"depth\": 2}}",
         "vision_config.depth is not understood", "Qwen's spelling of the blocks in a SigLIP tower"},
        {"{" GEMMA3 "\"vision_config\": {" SIGLIP ", \"image_size\": [32, 32]}}",
         "\"vision_config.image_size\" is not a positive integer", "an image size of two sides (SiglipVisionConfig "
         "allows a list; Gemma 3's projector takes one number)"},
        {"{" GEMMA3 "\"image_token_index\": 250, \"image_token_id\": 251, \"vision_config\": {" SIGLIP "}}",
         "image_token_index 250 and image_token_id 251 disagree", "two spellings of the image token disagreeing"},
        /* Qwen3.5's releases: Qwen3-VL's tower rows without the deepstack list, the hybrid text
         * model with interleaved mrope */
        {"{" QWEN3_5 "\"vision_config\": {" QWEN3_VISION "}}",
         "tensor 'model.embed_tokens.weight' is missing from the checkpoint",
         "a Qwen3.5 VLM config read whole by Qwen3-VL's rows and the hybrid text rows, then the tensors looked for"},
        {"{" QWEN3_5 "\"vision_config\": {" QWEN3_VISION ", \"deepstack_visual_indexes\": [0]}}",
         "vision_config.deepstack_visual_indexes is not understood", "Qwen3-VL's deepstack list in a Qwen3.5 tower"},
        {"{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", "
         QWEN3_5_TEXT("false") "\"vision_config\": {" QWEN3_VISION "}}",
         "rope_parameters.mrope_interleaved is not true: Qwen3_5ForConditionalGeneration's rope hands out its "
         "sections interleaved", "a Qwen3.5 rope said not to interleave"},
        {"{" QWEN3_5 "\"vision_config\": {" QWEN3_VISION ", \"window_size\": 112}}",
         "vision_config.window_size is not understood", "Qwen2.5-VL's window in a Qwen3.5 tower"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        JsonObject *config = config_of(cases[i].json);
        CkptfsCatalog *c = ckptfs_catalog_new();
        CkptfsModel m;
        GError *error = NULL;
        bool ok = ckptfs_model_from_config(config, c, &m, NULL, &error);
        tap_ok(!ok && error && strstr(error->message, cases[i].want), "%s: refused for the Megatron views, by name (%s)",
               cases[i].what, error ? error->message : "read");
        g_clear_error(&error);
        ckptfs_catalog_free(c);
        json_object_unref(config);
    }
}

/* GLM-4.1V's language model rotates interleaved pairs with its mrope sections taken by
 * frequency (transformers' rotate_half_llm), which no Megatron-core mrope args give: refused by
 * name. GLM-4.5V's rotates halves, as Megatron-core's mrope without rotary_interleaved does. */
static void test_interleaved_mrope(void)
{
    static const char *const text = "{\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                                    "\"intermediate_size\": 96, \"vocab_size\": 250, \"rope_parameters\": "
                                    "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.5, "
                                    "\"mrope_section\": [1, 1, 2]}}";
    CkptfsModel m;
    memset(&m, 0, sizeof m);
    m.arch = ckptfs_architecture_find("glm4v", NULL);
    JsonObject *config = config_of(text);
    GError *error = NULL;
    bool ok = m.arch && ckptfs_model_read_config(config, &m, &error);
    tap_ok(!ok && error && strstr(error->message, "Glm4vForConditionalGeneration rotates interleaved pairs") &&
               strstr(error->message, "rotary_interleaved"),
           "GLM-4.1V's interleaved mrope refused by name (%s)", error ? error->message : "read");
    g_clear_error(&error);
    tap_ok(m.arch && m.arch->family == &ckptfs_family_glm4, "GLM-4.1V's language model has the glm4 rules");
    memset(&m, 0, sizeof m);
    m.arch = ckptfs_architecture_find("glm4v_moe", NULL);
    tap_ok(m.arch && !m.arch->rotates_interleaved_pairs, "GLM-4.5V's mrope (halves rotated) is Megatron-core's");
    json_object_unref(config);
}

/* Gemma 3's SigLIP tower as a model of its own: a Conv2d kernel kept 4-D, a position per patch,
 * and the projector a module of its own whose weight is the HF tensor transposed. */
static void test_gemma3_vlm_tower(void)
{
    JsonObject *config = config_of("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
                                   "\"gemma3\", \"mm_tokens_per_image\": 4, \"vision_config\": {\"num_hidden_layers\": 2, "
                                   "\"hidden_size\": 32, \"num_attention_heads\": 2, \"intermediate_size\": 48, "
                                   "\"image_size\": 32, \"patch_size\": 8}}");
    CkptfsModel m, tower;
    memset(&m, 0, sizeof m);
    GError *error = NULL;
    m.arch = ckptfs_architecture_find("gemma3", &m);
    bool ok = m.arch && ckptfs_model_read_vision(config, &m, &error);
    m.hidden = 64; /* the language model's (text_config, read apart) */
    if (ok)
        ckptfs_model_vision_tower(&m, &tower);
    g_autoptr(GPtrArray) keys = ok ? ckptfs_mcore_keys(&tower, 0, false) : NULL;
    const CkptfsMcoreKey *conv = NULL, *projection = NULL, *positions = NULL;
    for (guint i = 0; keys && i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (strcmp(k->key, "conv1.weight") == 0)
            conv = k;
        else if (strcmp(k->key, "mm_input_projection.weight") == 0)
            projection = k;
        else if (strcmp(k->key, "position_embeddings.weight") == 0)
            positions = k;
    }
    uint64_t kernel[5] = {0};
    unsigned dims = conv ? ckptfs_mcore_kernel_shape(conv, &tower, kernel) : 0;
    tap_ok(ok && dims == 4 && kernel[0] == 32 && kernel[1] == 3 && kernel[2] == 8 && kernel[3] == 8,
           "Gemma 3's tower: conv1's kernel [32, 3, 8, 8], a Conv2d's 4 dims (%s)", error ? error->message : "read");
    tap_ok(positions && positions->rows == 16 && positions->cols == 32, "a learned position per patch: [16, 32]");
    tap_ok(projection && projection->rows == 64 && projection->cols == 32 && projection->split == CKPTFS_TP_ROWS &&
               ckptfs_mcore_key_transposed(projection) && projection->rule->module &&
               strcmp(projection->rule->module, "vision_projection.") == 0,
           "the projection [64, 32] split by rows, transposed, under vision_projection.");
    g_autoptr(GArray) tensors = keys ? ckptfs_model_hf_tensors(&tower, keys) : NULL;
    const CkptfsHfShape *hf = NULL;
    for (guint i = 0; tensors && i < tensors->len; i++)
        if (strcmp(g_array_index(tensors, CkptfsHfShape, i).name, "multi_modal_projector.mm_input_projection_weight") == 0)
            hf = &g_array_index(tensors, CkptfsHfShape, i);
    tap_ok(hf && hf->d0 == 32 && hf->d1 == 64, "its HF tensor mm_input_projection_weight is [32, 64] (got [%" G_GUINT64_FORMAT
           ", %" G_GUINT64_FORMAT "])", hf ? hf->d0 : 0, hf ? hf->d1 : 0);
    /* the rank files' key the views write and the sources read: the rule's own module, not the tower's prefix */
    g_autofree char *entry = projection ? ckptfs_legacy_entry_key(&tower, projection->rule, "vision_model.", 0,
                                                                  "mm_input_projection.weight", NULL)
                                        : NULL;
    tap_ok(entry && strcmp(entry, "vision_projection.mm_input_projection.weight") == 0,
           "the projection in a rank file: vision_projection.mm_input_projection.weight (got %s)", entry ? entry : "none");
    g_clear_error(&error);
    json_object_unref(config);
}

/* Qwen3-VL's tower as a model of its own: its deepstack mergers a module list of their own count,
 * one key each stacked over the list, their HF tensors after the blocks' and before the merger's. */
static void test_qwen3_vl_tower(void)
{
    JsonObject *config = config_of(
        "{\"architectures\": [\"Qwen3VLForConditionalGeneration\"], \"model_type\": \"qwen3_vl\", "
        "\"image_token_id\": 240, \"text_config\": "
        "{\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, "
        "\"intermediate_size\": 96, \"vocab_size\": 250, \"head_dim\": 8, \"rope_parameters\": {\"rope_type\": "
        "\"default\", \"mrope_section\": [1, 1, 2], \"mrope_interleaved\": true}}, \"vision_config\": {\"depth\": 3, "
        "\"hidden_size\": 32, \"num_heads\": 2, \"intermediate_size\": 48, \"out_hidden_size\": 64, \"patch_size\": 16, "
        "\"num_position_embeddings\": 16, \"deepstack_visual_indexes\": [0, 2]}}");
    CkptfsModel m, tower;
    memset(&m, 0, sizeof m);
    GError *error = NULL;
    m.arch = ckptfs_architecture_find("qwen3_vl", &m);
    bool ok = m.arch && ckptfs_model_read_vision(config, &m, &error);
    if (ok)
        ckptfs_model_vision_tower(&m, &tower);
    g_autoptr(GPtrArray) keys = ok ? ckptfs_mcore_keys(&tower, 0, false) : NULL;
    const CkptfsMcoreKey *fc1 = NULL;
    for (guint i = 0; keys && i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (strcmp(k->key, "decoder.deepstack_merger_list.linear_fc1.weight") == 0)
            fc1 = k;
    }
    uint64_t shape[5] = {0};
    unsigned n = fc1 ? ckptfs_mcore_key_shape(fc1, tower.layers, shape) : 0;
    tap_ok(ok && tower.list_modules == 2 && fc1 && n == 3 && shape[0] == 2 && shape[1] == 128 && shape[2] == 128,
           "Qwen3-VL's tower: 2 deepstack mergers, their fc1 one key [2, 128, 128] (%s)",
           error ? error->message : "read");
    g_autoptr(GArray) tensors = keys ? ckptfs_model_hf_tensors(&tower, keys) : NULL;
    int merger = -1, deepstack = -1, block = -1;
    for (guint i = 0; tensors && i < tensors->len; i++) {
        const char *name = g_array_index(tensors, CkptfsHfShape, i).name;
        if (strcmp(name, "visual.deepstack_merger_list.1.linear_fc2.bias") == 0)
            deepstack = (int)i;
        else if (strcmp(name, "visual.merger.norm.weight") == 0)
            merger = (int)i;
        else if (strcmp(name, "visual.blocks.2.mlp.linear_fc2.bias") == 0)
            block = (int)i;
    }
    tap_ok(block >= 0 && deepstack > block && merger > deepstack,
           "its HF tensors: the blocks', the deepstack mergers' (visual.deepstack_merger_list.K.*), the merger's");
    /* written back (the views' args.hf_vision_config): its own list of blocks, not Qwen2.5-VL's */
    JsonObject *written = json_object_new();
    if (ok)
        ckptfs_model_write_vision(&m, written);
    JsonNode *list = ckptfs_json_member(written, "vision_config.deepstack_visual_indexes");
    JsonArray *blocks = list && JSON_NODE_HOLDS_ARRAY(list) ? json_node_get_array(list) : NULL;
    tap_ok(blocks && json_array_get_length(blocks) == 2 && json_array_get_int_element(blocks, 0) == 0 &&
               json_array_get_int_element(blocks, 1) == 2 &&
               ckptfs_json_member(written, "vision_config.fullatt_block_indexes") == NULL,
           "its vision part written back with deepstack_visual_indexes [0, 2] and no fullatt_block_indexes");
    /* and the token ids that place an image, which a Megatron source's hf/config.json needs */
    JsonNode *image = ckptfs_json_member(written, "image_token_id"), *video = ckptfs_json_member(written, "video_token_id");
    tap_ok(image && video && json_node_get_int(image) == 240 && json_node_get_int(video) == 151656,
           "and the image token id read (240), the video token id Qwen3VLConfig's default (151656)");
    json_object_unref(written);
    g_clear_error(&error);
    json_object_unref(config);
}

/* Qwen3.5's tower as mbridge keeps it (transformers' module under vision_model.): its blocks
 * named "blocks.N." a key each, nothing split by TP, so a TP degree that divides none of its
 * sizes still holds it whole; no deepstack list written back. */
static void test_qwen3_5_tower(void)
{
    JsonObject *config = config_of(
        "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\", "
        "\"vision_config\": {\"depth\": 3, \"hidden_size\": 30, \"num_heads\": 3, \"intermediate_size\": 45, "
        "\"out_hidden_size\": 64, \"patch_size\": 16, \"num_position_embeddings\": 16}}");
    CkptfsModel m, tower;
    memset(&m, 0, sizeof m);
    GError *error = NULL;
    m.arch = ckptfs_architecture_find("qwen3_5", &m);
    bool ok = m.arch && ckptfs_model_read_vision(config, &m, &error);
    if (ok)
        ckptfs_model_vision_tower(&m, &tower);
    g_autoptr(GPtrArray) keys = ok ? ckptfs_mcore_keys(&tower, 0, false) : NULL;
    const CkptfsMcoreKey *qkv = NULL;
    bool replicated = keys && keys->len > 0;
    for (guint i = 0; keys && i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        replicated = replicated && k->split == CKPTFS_TP_REPLICATED;
        if (strcmp(k->key, "blocks.attn.qkv.weight") == 0)
            qkv = k;
    }
    g_autofree char *name = qkv ? ckptfs_mcore_key_name(qkv, true, true, 2) : NULL;
    tap_ok(ok && qkv && qkv->stacked && replicated && strcmp(name, "blocks.2.attn.qkv.weight") == 0 &&
               qkv->rows == 90 && qkv->cols == 30,
           "Qwen3.5's tower: block 2's qkv a key of its own, blocks.2.attn.qkv.weight [90, 30], every entry whole on "
           "each rank (%s)", error ? error->message : name);
    g_clear_error(&error);
    /* the rank files' key the views write and the sources read: the tower's layer prefix, not decoder.layers. */
    g_autofree char *entry = qkv ? ckptfs_legacy_entry_key(&tower, qkv->rule, "vision_model.", 1, "attn.qkv.weight",
                                                           NULL)
                                 : NULL;
    tap_ok(entry && strcmp(entry, "vision_model.blocks.1.attn.qkv.weight") == 0,
           "its block 1's qkv in a rank file: vision_model.blocks.1.attn.qkv.weight (got %s)", entry ? entry : "none");
    tap_ok(ok && ckptfs_model_check_vision_split(&m, 4, &error), "tp 4 holds a tower of 3 heads, ffn 45 whole (%s)",
           error ? error->message : "accepted");
    g_clear_error(&error);
    JsonObject *written = json_object_new();
    if (ok)
        ckptfs_model_write_vision(&m, written);
    tap_ok(ckptfs_json_member(written, "vision_config.depth") != NULL &&
               ckptfs_json_member(written, "vision_config.deepstack_visual_indexes") == NULL,
           "its vision part written back without a deepstack list");
    json_object_unref(written);
    json_object_unref(config);
}

/* A vision part written as a Megatron source's hf/config.json (and the views' args) carry it
 * reads back to the same tower and token ids; the tower's TP split is checked by name. */
static void test_vision_round_trip(void)
{
    JsonObject *config = config_of("{" QWEN2_5_VL "\"image_token_id\": 9, \"vision_start_token_id\": 7, "
                                   "\"vision_config\": {" VISION ", \"num_heads\": 4, \"fullatt_block_indexes\": [0, 2], "
                                   "\"tokens_per_second\": 2, \"window_size\": 56}}");
    CkptfsModel read, back;
    memset(&read, 0, sizeof read);
    memset(&back, 0, sizeof back);
    read.arch = back.arch = ckptfs_architecture_find("qwen2_5_vl", &read);
    GError *error = NULL;
    bool ok = read.arch && ckptfs_model_read_vision(config, &read, &error);
    JsonObject *written = json_object_new();
    if (ok)
        ckptfs_model_write_vision(&read, written);
    ok = ok && ckptfs_model_read_vision(written, &back, &error);
    gint64 tokens_per_second = 0;
    tap_ok(ok && read.vision_depth == 3 && read.vision_heads == 4 && read.image_token == 9 &&
               read.vision_start_token == 7 && read.video_token == 151656 && read.vision_window == 56 &&
               memcmp(&read.vision_depth, &back.vision_depth,
                      (size_t)((const char *)&read.mrope_section - (const char *)&read.vision_depth)) == 0 &&
               ckptfs_json_member_int(written, "vision_config.tokens_per_second", &tokens_per_second) ==
                   CKPTFS_JSON_FOUND && tokens_per_second == 2,
           "a vision part written and read back: the same tower, blocks with full attention and token ids, "
           "tokens_per_second an integer (%s)", error ? error->message : "ok");
    g_clear_error(&error);
    ok = ckptfs_model_check_vision_split(&read, 2, NULL) && !ckptfs_model_check_vision_split(&read, 8, &error);
    tap_ok(ok && error && strstr(error->message, "tp 8 does not divide the vision num_heads 4"),
           "the tower's TP split: tp 2 divides it, tp 8 is refused by name (%s)", error ? error->message : "none");
    g_clear_error(&error);
    json_object_unref(written);
    json_object_unref(config);
}

/* The names transformers 5 holds a VLM under (its state_dict, which verl's FSDP shards are keyed
 * by) and the ones its save_pretrained writes: the architecture's saved_names. */
static void test_saved_names(void)
{
    static const char *const cases[][3] = {
        {"qwen2_5_vl", "model.language_model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"},
        {"qwen2_5_vl", "model.visual.blocks.1.attn.qkv.bias", "visual.blocks.1.attn.qkv.bias"},
        {"qwen2_5_vl", "lm_head.weight", "lm_head.weight"},
        {"qwen3_vl", "model.visual.merger.norm.weight", "model.visual.merger.norm.weight"},
        {"gemma3", "model.language_model.embed_tokens.weight", "language_model.model.embed_tokens.weight"},
        {"gemma3", "model.vision_tower.vision_model.post_layernorm.weight",
         "vision_tower.vision_model.post_layernorm.weight"},
        {"gemma3", "model.multi_modal_projector.mm_input_projection_weight",
         "multi_modal_projector.mm_input_projection_weight"},
        {"gemma3", "lm_head.weight", "language_model.lm_head.weight"},
        {"llama", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        const CkptfsArchitecture *arch = ckptfs_architecture_find(cases[i][0], NULL);
        g_autofree char *saved = arch ? ckptfs_name_renamed(cases[i][1], arch->saved_names) : NULL;
        tap_ok(saved && strcmp(saved, cases[i][2]) == 0, "%s: %s is saved as %s (%s)", cases[i][0], cases[i][1],
               cases[i][2], saved ? saved : "no architecture");
    }
}

/* Where a multi-token prediction layer's Hugging Face tensors are, as the releases name them:
 * DeepSeek-V3's after the decoder's layers (model.layers.61 of its 61), MiMo's and Qwen3-Next's
 * under a prefix of their own from 0. */
static void test_mtp_names(void)
{
    static const char *const cases[][3] = {
        {"DeepseekV3ForCausalLM", "model.layers.4.mlp.gate.weight", "model.layers.5.mlp.gate.weight"},
        {"MiMoForCausalLM", "model.mtp_layers.0.mlp.gate.weight", "model.mtp_layers.1.mlp.gate.weight"},
        {"Qwen3NextForCausalLM", "mtp.layers.0.mlp.gate.weight", "mtp.layers.1.mlp.gate.weight"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        CkptfsModel m = {.layers = 4, .mtp_layers = 2, .mtp = true,
                         .arch = ckptfs_architecture_find(cases[i][0], NULL)};
        g_autofree char *first = m.arch ? ckptfs_model_hf_layer_name(&m, 4, "mlp.gate.weight") : NULL;
        g_autofree char *second = m.arch ? ckptfs_model_hf_layer_name(&m, 5, "mlp.gate.weight") : NULL;
        g_autofree char *decoder = m.arch ? ckptfs_model_hf_layer_name(&m, 3, "mlp.gate.weight") : NULL;
        tap_ok(first && strcmp(first, cases[i][1]) == 0 && strcmp(second, cases[i][2]) == 0 &&
                   strcmp(decoder, "model.layers.3.mlp.gate.weight") == 0,
               "%s: MTP layers 0 and 1 of a 4-layer model are %s, %s (got %s, %s; decoder layer 3: %s)", cases[i][0],
               cases[i][1], cases[i][2], first, second, decoder);
    }
}

/* -o megatron_names=bridge: Qwen2.5-VL's and Gemma 3's towers become Megatron-Bridge's (transformers'
 * modules under visual. and vision_tower., whole); Qwen3-VL's trees are the same in both; the
 * others are refused by name. */
static void test_bridge_names(void)
{
    static const struct {
        const char *type, *says, *tower_prefix;
    } cases[] = {
        {"qwen2_5_vl", NULL, "visual."},
        {"qwen3_vl", NULL, "vision_model."},
        {"qwen3_vl_moe", NULL, "vision_model."},
        {"qwen3_5", "Megatron-core ViT", NULL},
        {"qwen3_5_moe", "Megatron-core ViT", NULL},
        {"gemma3", NULL, "vision_tower."},
        {"llama", "a text model", NULL},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        CkptfsModel m = {0};
        m.arch = ckptfs_architecture_find(cases[i].type, &m);
        const CkptfsArchitecture *before = m.arch;
        GError *error = NULL;
        bool ok = m.arch != NULL && ckptfs_model_use_bridge_names(&m, NULL, &error);
        if (cases[i].tower_prefix)
            tap_ok(ok && strcmp(m.arch->vision->megatron_prefix, cases[i].tower_prefix) == 0 &&
                       strcmp(m.arch->megatron_prefix, "language_model.") == 0 &&
                       m.arch->megatron_bridge == m.arch,
                   "%s: megatron_names=bridge puts the tower under %s (%s)", cases[i].type, cases[i].tower_prefix,
                   error ? error->message : "");
        else
            tap_ok(!ok && error && strstr(error->message, "option megatron_names=bridge") &&
                       strstr(error->message, cases[i].says) && m.arch == before,
                   "%s: megatron_names=bridge is refused by name (%s)", cases[i].type, error ? error->message : "");
        g_clear_error(&error);
    }
    CkptfsModel m = {0};
    m.arch = ckptfs_architecture_find("qwen2_5_vl", &m);
    tap_ok(m.arch->vision->family == &ckptfs_family_qwen2_5_vl_vision &&
               m.arch->megatron_bridge->vision->family == &ckptfs_family_qwen2_5_vl_hf_vision &&
               m.arch->megatron_bridge->vision->family->n_rules == 18,
           "qwen2_5_vl: mbridge's tower rules by default, Megatron-Bridge's 18 (a tensor each) in its bridge row");
    m.arch = ckptfs_architecture_find("gemma3", &m);
    const CkptfsArchitecture *bridge = m.arch->megatron_bridge;
    tap_ok(m.arch->language_first && m.arch->family == &ckptfs_family_gemma3_vlm && !bridge->language_first &&
               bridge->family == &ckptfs_family_gemma3 && !bridge->no_virtual_pipeline &&
               bridge->vision->family == &ckptfs_family_siglip_hf_vision,
           "gemma3: Megatron-Bridge's row puts the tower first, the language model under the text gemma3 names");
}

int main(void)
{
    CkptfsModel m;
    char *why;
    Shape llama = {2, 64, 8, 2, 8, 96, 250, false, false, false, true, 0, 0, 0, 0};

    bool ok = run("{" LLAMA ", \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": "
                  "\"llama3\", \"factor\": 8.0}}", &llama, &m, &why);
    tap_ok(ok && m.layers == 2 && m.kv_heads == 2 && m.head_dim == 8 && !m.tied_embeddings &&
               m.rope_theta == 500000.0 && m.rope_scaling_factor == 8.0,
           "Llama 3 config with rope scaling (%s)", why);
    g_free(why);

    Shape qwen2 = llama;
    qwen2.bias = true;
    qwen2.tied = true;
    qwen2.lm_head = false;
    ok = run("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 64, "
             "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, "
             "\"intermediate_size\": 96, \"vocab_size\": 250, \"tie_word_embeddings\": true}",
             &qwen2, &m, &why);
    tap_ok(ok && m.qkv_bias && m.tied_embeddings, "Qwen2: qkv bias, tied, no lm_head (%s)", why);
    g_free(why);

    Shape qwen3 = llama;
    qwen3.head_dim = 16;
    qwen3.qk_norm = true;
    ok = run("{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64, \"head_dim\": 16, "
             "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"num_hidden_layers\": 2, "
             "\"intermediate_size\": 96, \"vocab_size\": 250}",
             &qwen3, &m, &why);
    tap_ok(ok && m.qk_norm && m.head_dim == 16, "Qwen3: q/k norm, head_dim 16 != 64/8 (%s)", why);
    g_free(why);

    ok = run("{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 64}", &llama, &m, &why);
    tap_ok(!ok && strstr(why, "GPT2LMHeadModel") && strstr(why, "config.json"),
           "unknown architecture is refused by name (%s)", why);
    g_free(why);

    ok = run("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
             "\"num_attention_heads\": 8, \"intermediate_size\": 96, \"vocab_size\": 250}",
             &llama, &m, &why);
    tap_ok(!ok && strstr(why, "num_hidden_layers"), "missing num_hidden_layers is named (%s)", why);
    g_free(why);

    /* Llama's attention_bias biases o_proj too, which Megatron's add_qkv_bias does not cover */
    ok = run("{" LLAMA ", \"attention_bias\": true}", &llama, &m, &why);
    tap_ok(!ok && strstr(why, "attention_bias") && strstr(why, "o_proj"),
           "Llama's attention_bias (o_proj's bias too) is refused by name (%s)", why);
    g_free(why);

    ok = run("{" LLAMA ", \"hidden_act\": \"gelu\"}", &llama, &m, &why);
    tap_ok(!ok && strstr(why, "gelu"), "non-SwiGLU activation is refused (%s)", why);
    g_free(why);

    Shape wrong_ffn = llama;
    wrong_ffn.ffn = 128;
    ok = run("{" LLAMA "}", &wrong_ffn, &m, &why);
    tap_ok(!ok && strstr(why, "model.layers.0.mlp.gate_proj.weight") && strstr(why, "[128, 64]") &&
               strstr(why, "[96, 64]"),
           "a tensor with an unexpected shape is named with both shapes (%s)", why);
    g_free(why);

    Shape no_head = llama;
    no_head.lm_head = false;
    ok = run("{" LLAMA "}", &no_head, &m, &why);
    tap_ok(!ok && strstr(why, "lm_head.weight"), "untied model without lm_head.weight (%s)", why);
    g_free(why);

    Shape fewer = llama;
    fewer.layers = 1;
    ok = run("{" LLAMA "}", &fewer, &m, &why);
    tap_ok(!ok && strstr(why, "model.layers.1."), "a missing layer is named (%s)", why);
    g_free(why);

    ok = run("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, "
             "\"num_attention_heads\": 8, \"num_key_value_heads\": 3, \"num_hidden_layers\": 2, "
             "\"intermediate_size\": 96, \"vocab_size\": 250}",
             &llama, &m, &why);
    tap_ok(!ok && strstr(why, "num_key_value_heads"), "heads not a multiple of KV heads (%s)", why);
    g_free(why);

    {
        JsonObject *config = config_of("{" LLAMA "}");
        CkptfsCatalog *c = catalog_of(&llama);
        /* Re-add one norm as F32: the weights are then a mix of dtypes. */
        CkptfsCatalog *mixed = ckptfs_catalog_new();
        for (unsigned i = 0; i < ckptfs_catalog_count(c); i++) {
            const CkptfsTensor *t = ckptfs_catalog_at(c, i);
            bool odd = strcmp(t->name, "model.layers.1.input_layernorm.weight") == 0;
            ckptfs_catalog_add_contiguous(mixed, t->name, odd ? CKPTFS_DTYPE_F32 : t->dtype,
                                          t->ndim, t->shape, 0, 0);
        }
        GError *error = NULL;
        bool mixed_ok = ckptfs_model_from_config(config, mixed, &m, NULL, &error);
        tap_ok(!mixed_ok && error && strstr(error->message, "model.layers.1.input_layernorm.weight") &&
                   strstr(error->message, "mixed"),
               "a dtype mix is refused naming the tensor (%s)", error ? error->message : "");
        g_clear_error(&error);
        ckptfs_catalog_free(mixed);
        ckptfs_catalog_free(c);
        json_object_unref(config);
    }

    ok = run("{" LLAMA ", \"num_hidden_layers\": -2}", &llama, &m, &why);
    tap_ok(!ok, "negative layer count is refused (%s)", why);
    g_free(why);
    test_moe_configs();
    test_deepseek_configs();
    test_features();
    test_bridge_names();
    test_vision_configs();
    test_vision_round_trip();
    test_saved_names();
    test_mtp_names();
    test_interleaved_mrope();
    test_qwen3_vl_tower();
    test_qwen3_5_tower();
    test_gemma3_vlm_tower();
    return tap_done();
}
