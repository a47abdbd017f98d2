/* Model rules: config.json parsing and the checks against the catalog. */
#include <json-glib/json-glib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/model.h"
#include "tap.h"

typedef struct {
    unsigned layers, hidden, heads, kv, head_dim, ffn, vocab;
    bool tied, bias, qk_norm, lm_head;
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
    bool ok = ckptfs_model_from_config(config, c, m, &error);
    *why = error ? g_strdup(error->message) : g_strdup("");
    g_clear_error(&error);
    ckptfs_catalog_free(c);
    json_object_unref(config);
    return ok;
}

#define LLAMA "\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", " \
              "\"hidden_size\": 64, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, " \
              "\"num_hidden_layers\": 2, \"intermediate_size\": 96, \"vocab_size\": 250"

int main(void)
{
    CkptfsModel m;
    char *why;
    Shape llama = {2, 64, 8, 2, 8, 96, 250, false, false, false, true};

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
        bool mixed_ok = ckptfs_model_from_config(config, mixed, &m, &error);
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
    return tap_done();
}
