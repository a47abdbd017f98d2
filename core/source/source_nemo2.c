/* NeMo 2 checkpoints as a source. NeMo (2.0 and later, with Megatron-core) saves a checkpoint
 * directory holding weights/, a Megatron-core torch_dist checkpoint of the model's
 * sharded_state_dict with every key under "module." (MegatronParallel's wrapper), and context/,
 * whose io.json is the fiddle serialization of the TrainerContext: the model class and the
 * arguments its config class was built with. The model is read from io.json into the Megatron
 * args the torch_dist reader takes, which then reads weights/ as any torch_dist checkpoint.
 *
 * io.json holds only the arguments given when the config was built (NeMo's importers give the
 * sizes; a recipe may give none): a config class's own defaults are known here only for the
 * classes of a table (each family's base class, and the ones NeMo's importers build); a field
 * that changes the math and that io.json does not give for another class, or that ckptfs does
 * not understand, is refused by name. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/value.h"
#include "source_internal.h"

G_DEFINE_AUTOPTR_CLEANUP_FUNC(CkptfsValue, ckptfs_value_free)

/* A family of NeMo's GPT models: its model class, the prefix of the config classes it takes
 * (NeMo's llm/gpt/model/<family>.py; the first row whose prefix fits is the family), the Hugging
 * Face architecture, and whether its config classes apply Llama 3.1's rope scaling. */
typedef struct {
    const char *model_class;
    const char *config_prefix;
    const char *hf_architecture;
    bool llama3_rope; /* Llama31Config's configure_model scales the rope by scale_factor, ... */
} NemoFamily;

static const NemoFamily families[] = {
    {"LlamaModel", "Llama31", "LlamaForCausalLM", true},
    {"LlamaModel", "Llama32", "LlamaForCausalLM", true},
    {"LlamaModel", "Llama33", "LlamaForCausalLM", true},
    {"LlamaModel", "Llama", "LlamaForCausalLM", false},
    {"Qwen2Model", "Qwen2", "Qwen2ForCausalLM", false},
    {"Qwen3Model", "Qwen3MoE", "Qwen3MoeForCausalLM", false},
    {"Qwen3Model", "Qwen3", "Qwen3ForCausalLM", false},
    {"MixtralModel", "Mixtral", "MixtralForCausalLM", false},
};

/* GPTConfig's (Megatron-core's TransformerConfig's) defaults that the classes below keep, and
 * their common seq_length. */
#define NEMO_GPT_DEFAULTS                                                                               \
    "\"normalization\": \"RMSNorm\", \"activation_func\": \"torch.nn.functional.silu\", "              \
    "\"gated_linear_unit\": true, \"position_embedding_type\": \"rope\", \"add_bias_linear\": false, " \
    "\"share_embeddings_and_output_weights\": false, \"seq_length\": 4096, \"rotary_percent\": 1.0, "  \
    "\"moe_ffn_hidden_size\": null, \"moe_shared_expert_intermediate_size\": null, "                    \
    "\"moe_shared_expert_gate\": false, \"moe_router_score_function\": \"softmax\", "                   \
    "\"moe_router_topk_scaling_factor\": null, \"moe_router_num_groups\": null, "                        \
    "\"moe_router_group_topk\": null, \"moe_router_enable_expert_bias\": false, \"moe_layer_freq\": 1"
/* ... and those of a model without experts */
#define NEMO_DENSE_DEFAULTS \
    NEMO_GPT_DEFAULTS ", \"num_moe_experts\": null, \"moe_router_topk\": 2, \"moe_router_pre_softmax\": false"
#define NEMO_LLAMA_DEFAULTS                                                                         \
    NEMO_DENSE_DEFAULTS ", \"add_qkv_bias\": false, \"qk_layernorm\": false, \"layernorm_epsilon\": 1e-5, " \
    "\"rotary_base\": 10000, \"kv_channels\": null"
#define NEMO_QWEN3_DEFAULTS                                                                                     \
    NEMO_GPT_DEFAULTS ", \"add_qkv_bias\": false, \"qk_layernorm\": true, \"layernorm_epsilon\": 1e-6, "            \
    "\"rotary_base\": 1000000.0, \"vocab_size\": 151936, \"kv_channels\": 128, \"num_query_groups\": 8"
#define NEMO_MIXTRAL_DEFAULTS                                                                                 \
    NEMO_GPT_DEFAULTS ", \"add_qkv_bias\": false, \"qk_layernorm\": false, \"layernorm_epsilon\": 1e-5, "         \
    "\"rotary_base\": 1000000.0, \"kv_channels\": null, \"num_query_groups\": 8, \"num_moe_experts\": 8, "       \
    "\"moe_router_topk\": 2, \"moe_router_pre_softmax\": false"

/* The config classes whose defaults are known (NeMo's dataclasses, with GPTConfig's), as
 * io.json spells them; another class must give every field that changes the math itself. */
static const struct {
    const char *config_class;
    const char *defaults;
} config_defaults[] = {
    {"LlamaConfig", "{" NEMO_LLAMA_DEFAULTS ", \"num_query_groups\": null}"},
    /* Llama3Config's num_query_groups; Llama31Config's rope scaling */
    {"Llama31Config", "{" NEMO_LLAMA_DEFAULTS ", \"num_query_groups\": 8, \"scale_factor\": 8.0, "
     "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"old_context_len\": 8192}"},
    {"Qwen2Config", "{" NEMO_DENSE_DEFAULTS ", \"add_qkv_bias\": true, \"qk_layernorm\": false, "
     "\"layernorm_epsilon\": 1e-6, \"rotary_base\": 1000000.0, \"vocab_size\": 151936, \"kv_channels\": null, "
     "\"num_query_groups\": null}"},
    {"Qwen3Config", "{" NEMO_QWEN3_DEFAULTS ", \"num_moe_experts\": null, \"moe_router_topk\": 2, "
     "\"moe_router_pre_softmax\": false}"},
    {"Qwen3MoEConfig", "{" NEMO_QWEN3_DEFAULTS ", \"num_moe_experts\": 128, \"moe_router_topk\": 8, "
     "\"moe_router_pre_softmax\": false}"},
    {"MixtralConfig", "{" NEMO_MIXTRAL_DEFAULTS ", \"num_layers\": 32, \"hidden_size\": 4096, "
     "\"num_attention_heads\": 32, \"ffn_hidden_size\": 14336}"},
    /* what NeMo's Mixtral importer builds, sizes given */
    {"MixtralConfig8x7B", "{" NEMO_MIXTRAL_DEFAULTS ", \"num_layers\": 32, \"hidden_size\": 4096, "
     "\"num_attention_heads\": 32, \"ffn_hidden_size\": 14336}"},
    {"MixtralConfig8x22B", "{" NEMO_MIXTRAL_DEFAULTS ", \"num_layers\": 56, \"hidden_size\": 6144, "
     "\"num_attention_heads\": 48, \"ffn_hidden_size\": 16384}"},
};

/* Config classes whose class computes what no field of io.json says, and what that is. */
static const struct {
    const char *prefix;
    const char *why;
} refused_configs[] = {
    {"Llama4", "Llama 4's experts and chunked attention"},
};

typedef enum {
    NEMO_ARG,         /* copied to the Megatron argument */
    NEMO_ARG_NEGATED, /* its negation is the Megatron argument */
    NEMO_MUST_BE,     /* only the value given is what the views compute */
    NEMO_IGNORED,     /* changes nothing the weights mean (dtypes, fusions, dropout, parallelism) */
} NemoFieldUse;

typedef struct {
    const char *field; /* NeMo's config field (Megatron-core's TransformerConfig, GPTConfig) */
    NemoFieldUse use;
    const char *arg;   /* the Megatron argument (NEMO_ARG*) */
    const char *only;  /* NEMO_MUST_BE: the one value, as io.json spells it */
    bool required;     /* no class default stands in: io.json must give it */
    bool llama3_rope;  /* a field of Llama31Config's only (NemoFamily.llama3_rope) */
} NemoField;

static const NemoField fields[] = {
    {"num_layers", NEMO_ARG, "num_layers", NULL, true, false},
    {"hidden_size", NEMO_ARG, "hidden_size", NULL, true, false},
    {"ffn_hidden_size", NEMO_ARG, "ffn_hidden_size", NULL, true, false},
    {"num_attention_heads", NEMO_ARG, "num_attention_heads", NULL, true, false},
    /* NeMo uses a vocab_size given as it is; without one it pads the tokenizer's */
    {"vocab_size", NEMO_ARG, "vocab_size", NULL, true, false},
    {"num_query_groups", NEMO_ARG, "num_query_groups", NULL, false, false},
    {"kv_channels", NEMO_ARG, "kv_channels", NULL, false, false},
    {"layernorm_epsilon", NEMO_ARG, "norm_epsilon", NULL, false, false},
    {"rotary_base", NEMO_ARG, "rotary_base", NULL, false, false},
    {"rotary_percent", NEMO_ARG, "rotary_percent", NULL, false, false},
    {"seq_length", NEMO_ARG, "max_position_embeddings", NULL, false, false},
    {"share_embeddings_and_output_weights", NEMO_ARG_NEGATED, "untie_embeddings_and_output_weights", NULL, false, false},
    {"add_qkv_bias", NEMO_ARG, "add_qkv_bias", NULL, false, false},
    {"add_bias_linear", NEMO_ARG, "add_bias_linear", NULL, false, false},
    {"qk_layernorm", NEMO_ARG, "qk_layernorm", NULL, false, false},
    /* experts: Megatron-core's TransformerConfig fields, under Megatron's argument names (None:
     * no experts; moe_ffn_hidden_size None: ffn_hidden_size) */
    {"num_moe_experts", NEMO_ARG, "num_experts", NULL, false, false},
    {"moe_router_topk", NEMO_ARG, "moe_router_topk", NULL, false, false},
    {"moe_ffn_hidden_size", NEMO_ARG, "moe_ffn_hidden_size", NULL, false, false},
    {"moe_shared_expert_intermediate_size", NEMO_ARG, "moe_shared_expert_intermediate_size", NULL, false, false},
    {"moe_shared_expert_gate", NEMO_ARG, "moe_shared_expert_gate", NULL, false, false},
    {"moe_router_pre_softmax", NEMO_ARG, "moe_router_pre_softmax", NULL, false, false},
    {"moe_router_score_function", NEMO_ARG, "moe_router_score_function", NULL, false, false},
    {"moe_router_topk_scaling_factor", NEMO_ARG, "moe_router_topk_scaling_factor", NULL, false, false},
    {"moe_router_num_groups", NEMO_ARG, "moe_router_num_groups", NULL, false, false},
    {"moe_router_group_topk", NEMO_ARG, "moe_router_group_topk", NULL, false, false},
    {"moe_router_enable_expert_bias", NEMO_ARG, "moe_router_enable_expert_bias", NULL, false, false},
    {"moe_layer_freq", NEMO_ARG, "moe_layer_freq", NULL, false, false},
    /* Llama 3.1's rope scaling: Megatron's args carry the factor (with use_rope_scaling); its
     * other constants are fixed there to Llama 3.1's */
    {"scale_factor", NEMO_ARG, "rope_scaling_factor", NULL, false, true},
    {"low_freq_factor", NEMO_MUST_BE, NULL, "1", false, true},
    {"high_freq_factor", NEMO_MUST_BE, NULL, "4", false, true},
    {"old_context_len", NEMO_MUST_BE, NULL, "8192", false, true},
    {"normalization", NEMO_MUST_BE, NULL, "RMSNorm", false, false},
    {"position_embedding_type", NEMO_MUST_BE, NULL, "rope", false, false},
    {"activation_func", NEMO_MUST_BE, NULL, "torch.nn.functional.silu", false, false},
    {"gated_linear_unit", NEMO_MUST_BE, NULL, "true", false, false},
    {"make_vocab_size_divisible_by", NEMO_IGNORED, NULL, NULL, false, false}, /* unused with a vocab_size given */
    /* NeMo's GPT model sizes its rope by seq_length; Mixtral's class keeps this one unused */
    {"max_position_embeddings", NEMO_IGNORED, NULL, NULL, false, false},
    /* the experts' training: load balancing, dispatch, fusions (the torch_dist keys are the
     * same with grouped GEMM) */
    {"moe_router_load_balancing_type", NEMO_IGNORED, NULL, NULL, false, false},
    {"moe_aux_loss_coeff", NEMO_IGNORED, NULL, NULL, false, false},
    {"moe_z_loss_coeff", NEMO_IGNORED, NULL, NULL, false, false},
    {"moe_token_dispatcher_type", NEMO_IGNORED, NULL, NULL, false, false},
    {"moe_grouped_gemm", NEMO_IGNORED, NULL, NULL, false, false},
    {"moe_permute_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"expert_model_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"expert_tensor_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"init_method_std", NEMO_IGNORED, NULL, NULL, false, false},
    {"fp16", NEMO_IGNORED, NULL, NULL, false, false},
    {"bf16", NEMO_IGNORED, NULL, NULL, false, false},
    {"params_dtype", NEMO_IGNORED, NULL, NULL, false, false},
    {"pipeline_dtype", NEMO_IGNORED, NULL, NULL, false, false},
    {"autocast_dtype", NEMO_IGNORED, NULL, NULL, false, false},
    {"generation_config", NEMO_IGNORED, NULL, NULL, false, false},
    {"attention_dropout", NEMO_IGNORED, NULL, NULL, false, false},
    {"hidden_dropout", NEMO_IGNORED, NULL, NULL, false, false},
    {"bias_activation_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"bias_dropout_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"masked_softmax_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"persist_layer_norm", NEMO_IGNORED, NULL, NULL, false, false},
    {"apply_rope_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"cross_entropy_loss_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"gradient_accumulation_fusion", NEMO_IGNORED, NULL, NULL, false, false},
    {"use_transformer_engine_op_fuser", NEMO_IGNORED, NULL, NULL, false, false},
    {"attention_softmax_in_fp32", NEMO_IGNORED, NULL, NULL, false, false},
    {"deallocate_pipeline_outputs", NEMO_IGNORED, NULL, NULL, false, false},
    {"tensor_model_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"pipeline_model_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"virtual_pipeline_model_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"context_parallel_size", NEMO_IGNORED, NULL, NULL, false, false},
    {"sequence_parallel", NEMO_IGNORED, NULL, NULL, false, false},
    {"recompute_granularity", NEMO_IGNORED, NULL, NULL, false, false},
    {"recompute_method", NEMO_IGNORED, NULL, NULL, false, false},
    {"recompute_num_layers", NEMO_IGNORED, NULL, NULL, false, false},
    {"use_cpu_initialization", NEMO_IGNORED, NULL, NULL, false, false},
    {"perform_initialization", NEMO_IGNORED, NULL, NULL, false, false},
};

/* The longest chain of references followed (fiddle's are a DAG a few levels deep). */
#define NEMO_MAX_REF_HOPS 64

typedef struct {
    GError **error;
    const char *io_json;  /* its path, for messages */
    JsonObject *top;      /* io.json */
    JsonObject *objects;  /* its "objects" */
} Nemo;

#define fail(n, ...) ckptfs_fail((n)->error, __VA_ARGS__)

static bool has_file(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, G_FILE_TEST_IS_REGULAR);
}

/* The checkpoint directory of DIR: DIR when it holds weights/ and context/io.json, its parent
 * when DIR is that weights/; NULL otherwise. */
static char *checkpoint_of(const char *dir)
{
    g_autofree char *weights = g_build_filename(dir, "weights", NULL);
    g_autofree char *context = g_build_filename(dir, "context", NULL);
    if (has_file(weights, "metadata.json") && has_file(context, "io.json"))
        return g_strdup(dir);
    g_autofree char *base = g_path_get_basename(dir);
    g_autofree char *parent = g_path_get_dirname(dir);
    g_autofree char *beside = g_build_filename(parent, "context", NULL);
    if (strcmp(base, "weights") == 0 && has_file(dir, "metadata.json") && has_file(beside, "io.json"))
        return g_steal_pointer(&parent);
    return NULL;
}

static bool probe_nemo2(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    g_autofree char *found = checkpoint_of(dir);
    return found != NULL;
}

/* NODE with fiddle's references followed ({"type": "ref", "key": K} is objects[K]), or NULL
 * with the error set. WHAT names it. */
static JsonObject *deref(Nemo *n, JsonNode *node, const char *what)
{
    for (int hops = 0; node != NULL && JSON_NODE_HOLDS_OBJECT(node); hops++) {
        JsonObject *o = json_node_get_object(node);
        const char *type = ckptfs_json_member_string(o, "type");
        if (type == NULL || strcmp(type, "ref") != 0)
            return o;
        const char *key = ckptfs_json_member_string(o, "key");
        if (hops == NEMO_MAX_REF_HOPS) {
            fail(n, CKPTFS_ERROR_FORMAT, "%s: %s: references chained more than %d deep (a cycle?)", n->io_json, what,
                 NEMO_MAX_REF_HOPS);
            return NULL;
        }
        if (key == NULL || !json_object_has_member(n->objects, key)) {
            fail(n, CKPTFS_ERROR_FORMAT, "%s: %s: a reference to '%.60s', which \"objects\" does not hold", n->io_json,
                 what, key ? key : "");
            return NULL;
        }
        node = json_object_get_member(n->objects, key);
    }
    fail(n, CKPTFS_ERROR_FORMAT, "%s: %s is not an object", n->io_json, what);
    return NULL;
}

/* The value of attribute NAME of a serialized object (its "items": ["Attr(name='NAME')", value]
 * pairs, as fiddle writes the repr of each path element), or NULL. */
static JsonNode *item(JsonObject *o, const char *name)
{
    JsonNode *items = json_object_get_member(o, "items");
    if (items == NULL || !JSON_NODE_HOLDS_ARRAY(items))
        return NULL;
    g_autofree char *label = g_strdup_printf("Attr(name='%s')", name);
    JsonArray *a = json_node_get_array(items);
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonNode *pair = json_array_get_element(a, i);
        if (!JSON_NODE_HOLDS_ARRAY(pair) || json_array_get_length(json_node_get_array(pair)) != 2)
            continue;
        JsonNode *key = json_array_get_element(json_node_get_array(pair), 0);
        if (JSON_NODE_HOLDS_VALUE(key) && json_node_get_value_type(key) == G_TYPE_STRING &&
            strcmp(json_node_get_string(key), label) == 0)
            return json_array_get_element(json_node_get_array(pair), 1);
    }
    return NULL;
}

/* "module.name" of a fiddle pyref ({"type": "pyref", "module": M, "name": N}), or NULL. */
static char *pyref_name(JsonNode *node)
{
    JsonObject *o = node && JSON_NODE_HOLDS_OBJECT(node) ? json_node_get_object(node) : NULL;
    const char *type = o ? ckptfs_json_member_string(o, "type") : NULL;
    const char *module = o ? ckptfs_json_member_string(o, "module") : NULL;
    const char *name = o ? ckptfs_json_member_string(o, "name") : NULL;
    if (type == NULL || strcmp(type, "pyref") != 0 || module == NULL || name == NULL)
        return NULL;
    return g_strconcat(module, ".", name, NULL);
}

/* The class a serialized fdl.Config builds (its metadata's fn_or_cls): its name, and in
 * *MODULE its module; NULL with the error set. */
static char *config_class(Nemo *n, JsonObject *config, const char *what, char **module)
{
    JsonObject *meta = deref(n, json_object_get_member(config, "metadata"), what);
    if (meta == NULL)
        return NULL;
    g_autofree char *full = pyref_name(item(meta, "fn_or_cls"));
    if (full == NULL) {
        fail(n, CKPTFS_ERROR_FORMAT, "%s: %s: not a fiddle Config (no fn_or_cls class in its metadata)", n->io_json,
             what);
        return NULL;
    }
    char *dot = strrchr(full, '.');
    *module = g_strndup(full, (gsize)(dot - full));
    return g_strdup(dot + 1);
}

/* A leaf of io.json: {"type": "leaf", "value": V} or V itself; a pyref as "module.name". NULL
 * for anything else (a nested object). */
static JsonNode *leaf_value(JsonNode *node)
{
    if (node == NULL || !JSON_NODE_HOLDS_OBJECT(node))
        return node ? json_node_copy(node) : NULL;
    JsonObject *o = json_node_get_object(node);
    const char *type = ckptfs_json_member_string(o, "type");
    if (type && strcmp(type, "leaf") == 0 && json_object_has_member(o, "value"))
        return leaf_value(json_object_get_member(o, "value"));
    g_autofree char *ref = pyref_name(node);
    if (ref == NULL)
        return NULL;
    JsonNode *named = json_node_new(JSON_NODE_VALUE);
    json_node_set_string(named, ref);
    return named;
}

/* A JSON leaf as a Python value of Megatron's args (NEGATE: a boolean's negation); NULL when it
 * is not a number, boolean or name. */
static CkptfsValue *arg_value(JsonNode *v, bool negate)
{
    if (JSON_NODE_HOLDS_NULL(v))
        return ckptfs_value_none();
    if (!JSON_NODE_HOLDS_VALUE(v))
        return NULL;
    GType t = json_node_get_value_type(v);
    if (t == G_TYPE_BOOLEAN)
        return ckptfs_value_bool(json_node_get_boolean(v) != negate);
    if (negate)
        return NULL;
    if (t == G_TYPE_INT64)
        return ckptfs_value_int(json_node_get_int(v));
    if (t == G_TYPE_DOUBLE)
        return ckptfs_value_float(json_node_get_double(v));
    if (t == G_TYPE_STRING)
        return ckptfs_value_str(json_node_get_string(v));
    return NULL;
}

static const char *leaf_text(JsonNode *v, char **buffer)
{
    if (JSON_NODE_HOLDS_VALUE(v) && json_node_get_value_type(v) == G_TYPE_STRING)
        return json_node_get_string(v);
    *buffer = json_to_string(v, FALSE);
    return *buffer;
}

static const NemoField *field_named(const char *name)
{
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++)
        if (strcmp(fields[i].field, name) == 0)
            return &fields[i];
    return NULL;
}

/* The field name of an item's label "Attr(name='X')", or NULL. */
static char *label_field(JsonNode *label)
{
    const char *s = JSON_NODE_HOLDS_VALUE(label) && json_node_get_value_type(label) == G_TYPE_STRING
                        ? json_node_get_string(label) : NULL;
    size_t len = s ? strlen(s) : 0;
    if (len < 14 || !g_str_has_prefix(s, "Attr(name='") || strcmp(s + len - 2, "')") != 0)
        return NULL;
    return g_strndup(s + 11, len - 13);
}

/* The known defaults of config class CLS (config_defaults), or NULL. */
static const char *defaults_of(const char *cls)
{
    for (size_t i = 0; i < G_N_ELEMENTS(config_defaults); i++)
        if (strcmp(cls, config_defaults[i].config_class) == 0)
            return config_defaults[i].defaults;
    return NULL;
}

/* Whether leaf V is the value ONLY (a number compared as a number: 1 is 1.0). */
static bool leaf_is(JsonNode *v, const char *only)
{
    GType t = JSON_NODE_HOLDS_VALUE(v) ? json_node_get_value_type(v) : G_TYPE_INVALID;
    if (t == G_TYPE_INT64 || t == G_TYPE_DOUBLE)
        return json_node_get_double(v) == g_ascii_strtod(only, NULL);
    g_autofree char *buffer = NULL;
    return strcmp(leaf_text(v, &buffer), only) == 0;
}

/* The values io.json gives the config (field -> leaf), over its class's defaults when they are
 * known. */
static GHashTable *config_values(Nemo *n, JsonObject *config, const NemoFamily *family, const char *cls)
{
    g_autoptr(GHashTable) values = g_hash_table_new_full(g_str_hash, g_str_equal, g_free,
                                                          (GDestroyNotify)json_node_unref);
    const char *known = defaults_of(cls);
    if (known != NULL) {
        g_autoptr(JsonObject) defaults = ckptfs_json_parse_object(cls, known, strlen(known), n->error);
        if (defaults == NULL)
            return NULL;
        g_autoptr(GList) names = json_object_get_members(defaults);
        for (GList *l = names; l; l = l->next)
            g_hash_table_insert(values, g_strdup(l->data), json_node_copy(json_object_get_member(defaults, l->data)));
    }
    JsonNode *items = json_object_get_member(config, "items");
    JsonArray *a = items && JSON_NODE_HOLDS_ARRAY(items) ? json_node_get_array(items) : NULL;
    if (a == NULL) {
        fail(n, CKPTFS_ERROR_FORMAT, "%s: model.config (%s) has no \"items\" list", n->io_json, cls);
        return NULL;
    }
    for (guint i = 0; i < json_array_get_length(a); i++) {
        JsonNode *pair = json_array_get_element(a, i);
        JsonArray *kv = JSON_NODE_HOLDS_ARRAY(pair) ? json_node_get_array(pair) : NULL;
        g_autofree char *name = kv && json_array_get_length(kv) == 2 ? label_field(json_array_get_element(kv, 0)) : NULL;
        if (name == NULL) {
            fail(n, CKPTFS_ERROR_FORMAT, "%s: model.config (%s): item %u is not an [\"Attr(name='...')\", value] pair",
                 n->io_json, cls, i);
            return NULL;
        }
        const NemoField *f = field_named(name);
        if (f == NULL) {
            fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config.%s (%s) is not a field ckptfs understands; it may "
                 "change what the model computes", n->io_json, name, cls);
            return NULL;
        }
        if (f->llama3_rope && !family->llama3_rope) {
            fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config.%s (%s): a field of Llama 3.1's config classes, "
                 "whose rope scaling %s does not apply", n->io_json, name, cls, cls);
            return NULL;
        }
        if (f->use == NEMO_IGNORED)
            continue;
        JsonNode *v = leaf_value(json_array_get_element(kv, 1));
        if (v == NULL) {
            fail(n, CKPTFS_ERROR_FORMAT, "%s: model.config.%s (%s) is not a plain value", n->io_json, name, cls);
            return NULL;
        }
        g_hash_table_replace(values, g_steal_pointer(&name), v);
    }
    return g_steal_pointer(&values);
}

/* The Megatron args of the model io.json describes: its fields under Megatron's names, the
 * architecture from the family, the saved split from the trainer's strategy. */
static CkptfsValue *megatron_args(Nemo *n, GHashTable *values, const NemoFamily *family, const char *cls,
                                  gint64 tp, gint64 pp)
{
    bool known = defaults_of(cls) != NULL;
    g_autoptr(CkptfsValue) args = ckptfs_value_container(CKPTFS_VALUE_DICT);
    for (size_t i = 0; i < G_N_ELEMENTS(fields); i++) {
        const NemoField *f = &fields[i];
        if (f->use == NEMO_IGNORED || (f->llama3_rope && !family->llama3_rope))
            continue;
        JsonNode *v = g_hash_table_lookup(values, f->field);
        if (v == NULL) {
            fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config (%s) gives no %s%s", n->io_json, cls, f->field,
                 f->required || known ? ""
                                      : " (it changes the math, and the defaults of this config class are not "
                                        "known to ckptfs)");
            return NULL;
        }
        if (f->use == NEMO_MUST_BE) {
            g_autofree char *buffer = NULL;
            const char *text = leaf_text(v, &buffer);
            if (!leaf_is(v, f->only)) {
                fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config.%s is %.60s; ckptfs's views compute %s only",
                     n->io_json, f->field, text, f->only);
                return NULL;
            }
            continue;
        }
        CkptfsValue *value = arg_value(v, f->use == NEMO_ARG_NEGATED);
        if (value == NULL) {
            fail(n, CKPTFS_ERROR_FORMAT, "%s: model.config.%s is not a number or boolean", n->io_json, f->field);
            return NULL;
        }
        if (value->kind == CKPTFS_VALUE_NONE) { /* None: Megatron's own default (MHA, hidden / heads) */
            ckptfs_value_free(value);
            continue;
        }
        ckptfs_value_set(args, f->arg, value);
    }
    JsonNode *groups = g_hash_table_lookup(values, "num_query_groups");
    ckptfs_value_set(args, "group_query_attention", ckptfs_value_bool(!JSON_NODE_HOLDS_NULL(groups)));
    ckptfs_value_set(args, "swiglu", ckptfs_value_bool(true));
    ckptfs_value_set(args, "position_embedding_type", ckptfs_value_str("rope"));
    ckptfs_value_set(args, "use_rope_scaling", ckptfs_value_bool(family->llama3_rope));
    ckptfs_value_set(args, "hf_architecture", ckptfs_value_str(family->hf_architecture));
    gint64 vocab = 0;
    ckptfs_json_node_int(g_hash_table_lookup(values, "vocab_size"), &vocab);
    ckptfs_value_set(args, "padded_vocab_size", ckptfs_value_int(vocab)); /* NeMo pads no vocab_size given */
    ckptfs_value_set(args, "tensor_model_parallel_size", ckptfs_value_int(tp));
    ckptfs_value_set(args, "pipeline_model_parallel_size", ckptfs_value_int(pp));
    return g_steal_pointer(&args);
}

/* The strategy's parallel size NAME (trainer.strategy), 1 when io.json gives none. */
static gint64 strategy_size(Nemo *n, JsonObject *context, const char *name)
{
    JsonNode *trainer = item(context, "trainer");
    GError *ignored = NULL;
    Nemo quiet = *n;
    quiet.error = &ignored; /* a context without a trainer or strategy saved with the default */
    JsonObject *t = trainer ? deref(&quiet, trainer, "trainer") : NULL;
    JsonNode *strategy = t ? item(t, "strategy") : NULL;
    JsonObject *s = strategy ? deref(&quiet, strategy, "trainer.strategy") : NULL;
    g_clear_error(&ignored);
    g_autoptr(JsonNode) v = s ? leaf_value(item(s, name)) : NULL;
    gint64 size = 1;
    return v && ckptfs_json_node_int(v, &size) && size >= 1 && size <= 65536 ? size : 1;
}

/* The training step of checkpoint directory DIR, from the name NeMo's ModelCheckpoint gives
 * it ("...-step=N-..."), or -1. */
static gint64 step_of(const char *dir)
{
    g_autofree char *base = g_path_get_basename(dir);
    const char *at = strstr(base, "step=");
    if (at == NULL || !g_ascii_isdigit(at[5]))
        return -1;
    return g_ascii_strtoll(at + 5, NULL, 10);
}

/* Whether MODEL_CLASS (in one of NeMo's modules) is a model class of the families; when not,
 * false with the error set. */
static bool model_class_known(Nemo *n, const char *module, const char *model_class)
{
    g_autoptr(GString) known = g_string_new(NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(families); i++) {
        if (strcmp(model_class, families[i].model_class) == 0 && g_str_has_prefix(module, "nemo.collections.llm."))
            return true;
        if (i == 0 || strcmp(families[i].model_class, families[i - 1].model_class) != 0)
            g_string_append_printf(known, "%s%s", i ? ", " : "", families[i].model_class);
    }
    return fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model class %.80s.%.80s is not one ckptfs reads (%s)", n->io_json,
                module, model_class, known->str);
}

/* The family of MODEL_CLASS with config class CLS: the first row whose prefix CLS has, and not a
 * class that computes more; NULL with the error set. */
static const NemoFamily *family_of(Nemo *n, const char *model_class, const char *cls)
{
    for (size_t i = 0; i < G_N_ELEMENTS(refused_configs); i++)
        if (g_str_has_prefix(cls, refused_configs[i].prefix)) {
            fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config is %s, whose class applies %s, which ckptfs does "
                 "not read from a NeMo checkpoint yet", n->io_json, cls, refused_configs[i].why);
            return NULL;
        }
    g_autoptr(GString) prefixes = g_string_new(NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(families); i++) {
        if (strcmp(model_class, families[i].model_class) != 0)
            continue;
        if (g_str_has_prefix(cls, families[i].config_prefix))
            return &families[i];
        g_string_append_printf(prefixes, "%s%s*", prefixes->len ? ", " : "", families[i].config_prefix);
    }
    fail(n, CKPTFS_ERROR_UNSUPPORTED, "%s: model.config is %.80s, not a config class of %s (%s)", n->io_json, cls,
         model_class, prefixes->str);
    return NULL;
}

/* The model's Megatron args from io.json; *MODEL_CLASS and *CLS: its model and config classes. */
static CkptfsValue *context_args(Nemo *n, char **model_class, char **cls)
{
    n->objects = ckptfs_json_member_object(n->top, "objects");
    if (n->objects == NULL || ckptfs_json_member_string(n->top, "version") == NULL) {
        fail(n, CKPTFS_ERROR_FORMAT, "%s: not a fiddle serialization (no \"objects\" and \"version\")", n->io_json);
        return NULL;
    }
    JsonObject *context = deref(n, json_object_get_member(n->top, "root"), "root");
    if (context == NULL)
        return NULL;
    JsonNode *model_item = item(context, "model");
    if (model_item == NULL) {
        fail(n, CKPTFS_ERROR_FORMAT, "%s: the root (NeMo's TrainerContext) has no model", n->io_json);
        return NULL;
    }
    g_autofree char *model_module = NULL, *config_module = NULL;
    JsonObject *model = deref(n, model_item, "model");
    if (model == NULL || (*model_class = config_class(n, model, "model", &model_module)) == NULL)
        return NULL;
    if (!model_class_known(n, model_module, *model_class))
        return NULL;
    JsonNode *config_item = item(model, "config");
    if (config_item == NULL) {
        fail(n, CKPTFS_ERROR_FORMAT, "%s: model (%s) has no config", n->io_json, *model_class);
        return NULL;
    }
    JsonObject *config = deref(n, config_item, "model.config");
    if (config == NULL || (*cls = config_class(n, config, "model.config", &config_module)) == NULL)
        return NULL;
    const NemoFamily *family = family_of(n, *model_class, *cls);
    if (family == NULL)
        return NULL;
    g_autoptr(GHashTable) values = config_values(n, config, family, *cls);
    if (values == NULL)
        return NULL;
    return megatron_args(n, values, family, *cls, strategy_size(n, context, "tensor_model_parallel_size"),
                         strategy_size(n, context, "pipeline_model_parallel_size"));
}

/* ARGS as the torch_dist reader takes them: the parsed pickle of the dict. */
static CkptfsPickle *args_pickle(const char *what, const CkptfsValue *args, GError **error)
{
    CkptfsPickleStream *stream = ckptfs_pickle_stream_new(error);
    ckptfs_pickle_stream_value(stream, args);
    g_autoptr(GBytes) bytes = ckptfs_pickle_stream_finish(stream);
    if (bytes == NULL)
        return NULL;
    gsize len = 0;
    const uint8_t *data = g_bytes_get_data(bytes, &len);
    return ckptfs_pickle_parse(what, data, len, error);
}

static bool open_nemo2(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    g_autofree char *dir = checkpoint_of(source->dir);
    if (dir == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_NOT_FOUND, "%s: no NeMo 2 checkpoint (weights/ and context/io.json)",
                           source->dir);
    g_autofree char *io_json = g_build_filename(dir, "context", "io.json", NULL);
    g_autoptr(JsonObject) top = ckptfs_json_load_object(io_json, error);
    if (top == NULL)
        return false;
    Nemo n = {.error = error, .io_json = io_json, .top = top};
    g_autofree char *model_class = NULL, *cls = NULL;
    g_autoptr(CkptfsValue) args = context_args(&n, &model_class, &cls);
    CkptfsPickle *pickle = args ? args_pickle(io_json, args, error) : NULL;
    if (pickle == NULL)
        return false;
    g_autofree char *weights = g_build_filename(dir, "weights", NULL);
    CkptfsTorchDistWrap wrap = {.key_prefix = "module.", .args = ckptfs_pickle_root(pickle), .args_from = io_json};
    bool ok = ckptfs_torch_dist_open_dir(source, options, weights, &wrap, error);
    ckptfs_pickle_free(pickle);
    if (!ok)
        return false;
    gint64 step = step_of(dir);
    g_autofree char *step_text = step >= 0 ? g_strdup_printf("step %" G_GINT64_FORMAT, step) : g_strdup("step unknown");
    g_autofree char *found = source->found;
    source->found = g_strdup_printf("NeMo 2 checkpoint, %s: model %s (%s) from context/io.json; weights/: %s",
                                    step_text, model_class, cls, found ? found : "");
    return true;
}

const CkptfsSourceFormat ckptfs_format_nemo2 = {"nemo2", probe_nemo2, open_nemo2, ckptfs_megatron_describe};
