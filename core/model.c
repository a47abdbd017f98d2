#include "ckptfs/model.h"

#include <string.h>

#include "ckptfs/error.h"

static const CkptfsArchitecture llama = {"LlamaForCausalLM", "llama", false, false};
static const CkptfsArchitecture mistral = {"MistralForCausalLM", "mistral", false, false};
static const CkptfsArchitecture qwen2 = {"Qwen2ForCausalLM", "qwen2", true, false};
static const CkptfsArchitecture qwen3 = {"Qwen3ForCausalLM", "qwen3", false, true};
static const CkptfsArchitecture *const architectures[] = {&llama, &mistral, &qwen2, &qwen3, NULL};

const CkptfsArchitecture *const *ckptfs_architectures(void)
{
    return architectures;
}

char *ckptfs_hf_layer_name(uint64_t layer, const char *suffix)
{
    return g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".%s", layer, suffix);
}

#define CONFIG_ERROR(...)                                                                     \
    do {                                                                                      \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "config.json: %s", why_);  \
        return false;                                                                         \
    } while (0)

static bool get_uint(JsonObject *config, const char *key, bool required, uint64_t fallback,
                     uint64_t *out, GError **error)
{
    JsonNode *n = json_object_get_member(config, key);
    if (n == NULL || JSON_NODE_HOLDS_NULL(n)) {
        if (required)
            CONFIG_ERROR("missing \"%s\", which the Megatron views need", key);
        *out = fallback;
        return true;
    }
    if (!JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_INT64 ||
        json_node_get_int(n) <= 0)
        CONFIG_ERROR("\"%s\" is not a positive integer", key);
    *out = (uint64_t)json_node_get_int(n);
    return true;
}

static double get_double(JsonObject *config, const char *key, double fallback)
{
    JsonNode *n = json_object_get_member(config, key);
    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n))
        return fallback;
    GType t = json_node_get_value_type(n);
    if (t == G_TYPE_DOUBLE)
        return json_node_get_double(n);
    if (t == G_TYPE_INT64)
        return (double)json_node_get_int(n);
    return fallback;
}

static bool get_bool(JsonObject *config, const char *key, bool fallback)
{
    JsonNode *n = json_object_get_member(config, key);
    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n) || json_node_get_value_type(n) != G_TYPE_BOOLEAN)
        return fallback;
    return json_node_get_boolean(n);
}

static const CkptfsArchitecture *find_architecture(JsonObject *config, GError **error)
{
    JsonNode *n = json_object_get_member(config, "architectures");
    const char *name = NULL;
    if (n && JSON_NODE_HOLDS_ARRAY(n) && json_array_get_length(json_node_get_array(n)) > 0) {
        JsonNode *first = json_array_get_element(json_node_get_array(n), 0);
        if (JSON_NODE_HOLDS_VALUE(first) && json_node_get_value_type(first) == G_TYPE_STRING)
            name = json_node_get_string(first);
    }
    JsonNode *mt = json_object_get_member(config, "model_type");
    const char *model_type = mt && JSON_NODE_HOLDS_VALUE(mt) &&
                                     json_node_get_value_type(mt) == G_TYPE_STRING
                                 ? json_node_get_string(mt)
                                 : NULL;
    for (const CkptfsArchitecture *const *a = architectures; *a; a++)
        if ((name && strcmp(name, (*a)->hf_architecture) == 0) ||
            (!name && model_type && strcmp(model_type, (*a)->model_type) == 0))
            return *a;
    g_autoptr(GString) known = g_string_new(NULL);
    for (const CkptfsArchitecture *const *a = architectures; *a; a++)
        g_string_append_printf(known, "%s%s", known->len ? ", " : "", (*a)->hf_architecture);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                "config.json: architecture %s (model_type %s) has no Megatron rules; known: %s",
                name ? name : "not given", model_type ? model_type : "not given", known->str);
    return NULL;
}

/* A tensor the rules need: present, with this shape and the model's dtype. */
static bool expect_tensor(const CkptfsCatalog *catalog, CkptfsModel *model, const char *name,
                          unsigned ndim, uint64_t d0, uint64_t d1, GError **error)
{
    const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
    if (t == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s' is missing from the checkpoint", name);
        return false;
    }
    bool shape_ok = t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
    if (!shape_ok) {
        g_autoptr(GString) got = g_string_new("[");
        for (unsigned i = 0; i < t->ndim; i++)
            g_string_append_printf(got, "%s%" G_GUINT64_FORMAT, i ? ", " : "", t->shape[i]);
        g_string_append(got, "]");
        g_autofree char *want = ndim == 2 ? g_strdup_printf("[%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]", d0, d1)
                                          : g_strdup_printf("[%" G_GUINT64_FORMAT "]", d0);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "tensor '%s' has shape %s; config.json implies %s", name, got->str, want);
        return false;
    }
    if (model->dtype == CKPTFS_DTYPE_INVALID)
        model->dtype = t->dtype;
    if (t->dtype != model->dtype) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "tensor '%s' is %s but the other weights are %s; mixed dtypes are not supported",
                    name, ckptfs_dtype_safetensors_name(t->dtype),
                    ckptfs_dtype_safetensors_name(model->dtype));
        return false;
    }
    return true;
}

unsigned ckptfs_hf_layer_tensors(const CkptfsModel *m, CkptfsHfShape *out)
{
    const uint64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    const struct {
        CkptfsHfShape shape;
        bool wanted;
    } all[] = {
        {{"input_layernorm.weight", 1, m->hidden, 0}, true},
        {{"self_attn.q_proj.weight", 2, q, m->hidden}, true},
        {{"self_attn.k_proj.weight", 2, kv, m->hidden}, true},
        {{"self_attn.v_proj.weight", 2, kv, m->hidden}, true},
        {{"self_attn.q_proj.bias", 1, q, 0}, m->qkv_bias},
        {{"self_attn.k_proj.bias", 1, kv, 0}, m->qkv_bias},
        {{"self_attn.v_proj.bias", 1, kv, 0}, m->qkv_bias},
        {{"self_attn.q_norm.weight", 1, m->head_dim, 0}, m->qk_norm},
        {{"self_attn.k_norm.weight", 1, m->head_dim, 0}, m->qk_norm},
        {{"self_attn.o_proj.weight", 2, m->hidden, q}, true},
        {{"post_attention_layernorm.weight", 1, m->hidden, 0}, true},
        {{"mlp.gate_proj.weight", 2, m->ffn, m->hidden}, true},
        {{"mlp.up_proj.weight", 2, m->ffn, m->hidden}, true},
        {{"mlp.down_proj.weight", 2, m->hidden, m->ffn}, true},
    };
    G_STATIC_ASSERT(G_N_ELEMENTS(all) <= CKPTFS_HF_LAYER_TENSORS_MAX);
    unsigned n = 0;
    for (size_t k = 0; k < G_N_ELEMENTS(all); k++)
        if (all[k].wanted)
            out[n++] = all[k].shape;
    return n;
}

static bool check_layer_tensors(const CkptfsCatalog *catalog, CkptfsModel *m, uint64_t i,
                                GError **error)
{
    CkptfsHfShape need[CKPTFS_HF_LAYER_TENSORS_MAX];
    unsigned n = ckptfs_hf_layer_tensors(m, need);
    for (unsigned k = 0; k < n; k++) {
        g_autofree char *name = ckptfs_hf_layer_name(i, need[k].suffix);
        if (!expect_tensor(catalog, m, name, need[k].ndim, need[k].d0, need[k].d1, error))
            return false;
    }
    return true;
}

bool ckptfs_model_from_config(JsonObject *config, const CkptfsCatalog *catalog,
                              CkptfsModel *model, GError **error)
{
    memset(model, 0, sizeof *model);
    if (config == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "config.json is missing or broken; the Megatron views need it");
        return false;
    }
    model->arch = find_architecture(config, error);
    if (model->arch == NULL)
        return false;
    if (!get_uint(config, "num_hidden_layers", true, 0, &model->layers, error) ||
        !get_uint(config, "hidden_size", true, 0, &model->hidden, error) ||
        !get_uint(config, "num_attention_heads", true, 0, &model->heads, error) ||
        !get_uint(config, "num_key_value_heads", false, model->heads, &model->kv_heads, error) ||
        !get_uint(config, "intermediate_size", true, 0, &model->ffn, error) ||
        !get_uint(config, "vocab_size", true, 0, &model->vocab, error) ||
        !get_uint(config, "max_position_embeddings", false, 4096, &model->max_positions, error))
        return false;
    if (model->hidden % model->heads != 0 && json_object_get_member(config, "head_dim") == NULL)
        CONFIG_ERROR("hidden_size %" G_GUINT64_FORMAT " is not a multiple of num_attention_heads %"
                     G_GUINT64_FORMAT " and no head_dim is given",
                     model->hidden, model->heads);
    if (!get_uint(config, "head_dim", false, model->hidden / model->heads, &model->head_dim, error))
        return false;
    if (model->heads % model->kv_heads != 0)
        CONFIG_ERROR("num_attention_heads %" G_GUINT64_FORMAT
                     " is not a multiple of num_key_value_heads %" G_GUINT64_FORMAT,
                     model->heads, model->kv_heads);
    JsonNode *act = json_object_get_member(config, "hidden_act");
    if (act && JSON_NODE_HOLDS_VALUE(act) && json_node_get_value_type(act) == G_TYPE_STRING &&
        strcmp(json_node_get_string(act), "silu") != 0)
        CONFIG_ERROR("hidden_act \"%s\" is not supported (SwiGLU models use silu)",
                     json_node_get_string(act));
    model->tied_embeddings = get_bool(config, "tie_word_embeddings", false);
    model->qkv_bias = model->arch->qkv_bias || get_bool(config, "attention_bias", false);
    model->qk_norm = model->arch->qk_norm;
    model->rope_theta = get_double(config, "rope_theta", 10000.0);
    model->norm_eps = get_double(config, "rms_norm_eps", 1e-6);
    JsonNode *scaling = json_object_get_member(config, "rope_scaling");
    if (scaling && JSON_NODE_HOLDS_OBJECT(scaling)) {
        JsonObject *s = json_node_get_object(scaling);
        JsonNode *type = json_object_get_member(s, "rope_type");
        if (type == NULL)
            type = json_object_get_member(s, "type");
        const char *type_name = type && JSON_NODE_HOLDS_VALUE(type) &&
                                        json_node_get_value_type(type) == G_TYPE_STRING
                                    ? json_node_get_string(type)
                                    : "";
        if (strcmp(type_name, "llama3") != 0 && strcmp(type_name, "default") != 0)
            CONFIG_ERROR("rope_scaling type \"%s\" is not supported (llama3 is)", type_name);
        if (strcmp(type_name, "llama3") == 0)
            model->rope_scaling_factor = get_double(s, "factor", 8.0);
    }

    if (!expect_tensor(catalog, model, "model.embed_tokens.weight", 2, model->vocab, model->hidden,
                       error) ||
        !expect_tensor(catalog, model, "model.norm.weight", 1, model->hidden, 0, error))
        return false;
    bool has_lm_head = ckptfs_catalog_find(catalog, "lm_head.weight") != NULL;
    if (!model->tied_embeddings || has_lm_head) {
        if (!expect_tensor(catalog, model, "lm_head.weight", 2, model->vocab, model->hidden, error))
            return false;
    }
    for (uint64_t i = 0; i < model->layers; i++)
        if (!check_layer_tensors(catalog, model, i, error))
            return false;
    return true;
}
