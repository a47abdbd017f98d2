/* The model schema's four walks: every row read from each of its config.json spellings
 * (transformers 4's and 5's), written back and read again, written to Megatron args and read
 * from them; and the configs it refuses. Expected values are the ones the test's own JSON gives. */
#include <json-glib/json-glib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/model.h"
#include "ckptfs/pickle.h"
#include "ckptfs/schema.h"
#include "ckptfs/torchsave.h"
#include "ckptfs/value.h"
#include "source_internal.h" /* ckptfs_megatron_model_from_args */
#include "tap.h"

/* One config per kind of row: every row that applies is given (non-default where it may be). */
static const char *const bases[] = {
    /* dense, llama3 scaling, v4 spellings */
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"num_hidden_layers\": 3, "
    "\"hidden_size\": 96, \"num_attention_heads\": 6, \"num_key_value_heads\": 2, \"head_dim\": 32, "
    "\"intermediate_size\": 200, \"vocab_size\": 300, \"max_position_embeddings\": 9000, \"hidden_act\": \"silu\", "
    "\"tie_word_embeddings\": true, \"attention_bias\": false, \"mlp_bias\": false, \"rms_norm_eps\": 1e-05, \"rope_theta\": 500000.0, "
    "\"partial_rotary_factor\": 1.0, \"sliding_window\": null, \"num_nextn_predict_layers\": 0, "
    "\"bos_token_id\": 1, \"eos_token_id\": [2, 7], \"pad_token_id\": null, "
    "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
    /* Qwen3-MoE, v5 spellings */
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\", \"num_hidden_layers\": 2, "
    "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"head_dim\": null, "
    "\"intermediate_size\": 128, \"vocab_size\": 100, \"max_position_embeddings\": 4096, \"hidden_act\": \"silu\", "
    "\"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-06, \"dtype\": \"bfloat16\", "
    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, "
    "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 48, "
    "\"norm_topk_prob\": true, \"num_nextn_predict_layers\": 0, \"bos_token_id\": 5}",
    /* Qwen2-MoE, v4 spellings: a gated shared expert under the architecture's name */
    "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, "
    "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, "
    "\"vocab_size\": 100, \"max_position_embeddings\": 4096, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, "
    "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"num_experts\": 4, \"num_experts_per_tok\": 2, "
    "\"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 48, \"norm_topk_prob\": false, "
    "\"decoder_sparse_step\": 1, \"mlp_only_layers\": []}",
    /* DeepSeek-V3: multi-latent attention, yarn (Kimi-K2's betas: MLATransformerConfig fields) */
    "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 3, "
    "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\": 128, "
    "\"vocab_size\": 100, \"max_position_embeddings\": 16384, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, "
    "\"rms_norm_eps\": 1e-06, \"rope_theta\": 20000.0, \"q_lora_rank\": 24, \"kv_lora_rank\": 16, "
    "\"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4, \"v_head_dim\": 12, \"n_routed_experts\": 8, "
    "\"num_experts_per_tok\": 4, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, "
    "\"first_k_dense_replace\": 1, \"moe_layer_freq\": 1, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true, "
    "\"n_group\": 4, \"topk_group\": 2, \"scoring_func\": \"sigmoid\", \"topk_method\": \"noaux_tc\", "
    "\"num_nextn_predict_layers\": 1, \"eos_token_id\": 1, \"pad_token_id\": 300, "
    "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40.0, \"mscale\": 0.5, \"mscale_all_dim\": 0.75, "
    "\"beta_fast\": 1, \"beta_slow\": 1, \"original_max_position_embeddings\": 4096}}",
    /* GLM-4.5: optional q/k norms (use_qk_norm) and biases, partial rotary, DeepSeek-V3's MoE */
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"num_hidden_layers\": 3, "
    "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 32, "
    "\"intermediate_size\": 128, \"vocab_size\": 100, \"max_position_embeddings\": 8192, \"hidden_act\": \"silu\", "
    "\"tie_word_embeddings\": false, \"rms_norm_eps\": 1e-06, \"attention_bias\": true, \"use_qk_norm\": true, "
    "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0, \"partial_rotary_factor\": 0.25}, "
    "\"n_routed_experts\": 8, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 32, \"n_shared_experts\": 1, "
    "\"first_k_dense_replace\": 1, \"routed_scaling_factor\": 2.5, \"norm_topk_prob\": true, \"n_group\": 4, "
    "\"topk_group\": 2, \"num_nextn_predict_layers\": 1}",
    /* Gemma 3's text model, v5 spellings: two rope bases nested by layer kind, a window on all
     * layers but every sixth, its query scalar, soft-caps null */
    "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", \"num_hidden_layers\": 6, "
    "\"hidden_size\": 64, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 24, "
    "\"intermediate_size\": 96, \"vocab_size\": 256, \"max_position_embeddings\": 512, "
    "\"hidden_activation\": \"gelu_pytorch_tanh\", \"tie_word_embeddings\": true, \"rms_norm_eps\": 1e-06, "
    "\"attention_bias\": false, \"query_pre_attn_scalar\": 20, \"sliding_window\": 4, "
    "\"attn_logit_softcapping\": null, \"final_logit_softcapping\": null, \"use_bidirectional_attention\": false, "
    "\"_sliding_window_pattern\": 6, \"layer_types\": [\"sliding_attention\", \"sliding_attention\", "
    "\"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"], "
    "\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\", \"rope_theta\": 1000000.0}, "
    "\"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 5000.0}}}",
};

static JsonObject *parse(const char *json)
{
    return ckptfs_json_parse_object("test config", json, strlen(json), NULL);
}

static const CkptfsArchitecture *arch_of(JsonObject *config)
{
    return ckptfs_architecture_find(ckptfs_json_member_string(config, "model_type"), NULL);
}

static bool read_model(JsonObject *config, CkptfsModel *m, GError **error)
{
    memset(m, 0, sizeof *m);
    m->arch = arch_of(config);
    return ckptfs_model_read_config(config, m, error);
}

/* The names of F in a config of M's architecture. */
static unsigned names_of(const CkptfsModelField *f, const CkptfsModel *m, const char **out)
{
    unsigned n = 0;
    const CkptfsMoeConfig *moe = m->arch ? m->arch->moe : NULL;
    if (moe && f->arch_key == CKPTFS_ARCH_KEY_EXPERTS)
        out[n++] = moe->experts_key;
    if (moe && f->arch_key == CKPTFS_ARCH_KEY_EXPERT_FFN)
        out[n++] = moe->ffn_key;
    if (m->arch && m->arch->qk_norm_key && f->arch_key == CKPTFS_ARCH_KEY_QK_NORM)
        out[n++] = m->arch->qk_norm_key;
    if (moe && f->arch_key == CKPTFS_ARCH_KEY_SHARED_FFN && moe->shared_ffn_key)
        out[n++] = moe->shared_ffn_key;
    for (unsigned i = 0; i < G_N_ELEMENTS(f->hf) && f->hf[i]; i++)
        if (n == 0 || strcmp(out[0], f->hf[i]) != 0)
            out[n++] = f->hf[i];
    return n;
}

/* The object holding PATH's last member (nested: Gemma 3's rope_parameters.full_attention.*),
 * made with CREATE where missing. */
static JsonObject *parent_of(JsonObject *config, const char *path, const char **leaf, bool create)
{
    const char *dot = strchr(path, '.');
    *leaf = dot ? dot + 1 : path;
    if (dot == NULL)
        return config;
    g_autofree char *parent = g_strndup(path, (gsize)(dot - path));
    JsonObject *o = ckptfs_json_member_object(config, parent);
    if (o == NULL && create) {
        o = json_object_new();
        json_object_set_object_member(config, parent, o);
    }
    return o && strchr(*leaf, '.') ? parent_of(o, *leaf, leaf, create) : o;
}

/* The JSON value at PATH as the schema prints it ("%g" numbers, true/false, names). */
static char *json_text(JsonObject *config, const char *path)
{
    JsonNode *n = ckptfs_json_member(config, path);
    if (n == NULL || !JSON_NODE_HOLDS_VALUE(n))
        return NULL;
    switch (json_node_get_value_type(n)) {
    case G_TYPE_INT64:
        return g_strdup_printf("%" G_GINT64_FORMAT, json_node_get_int(n));
    case G_TYPE_DOUBLE:
        return g_strdup_printf("%g", json_node_get_double(n));
    case G_TYPE_BOOLEAN:
        return g_strdup(json_node_get_boolean(n) ? "true" : "false");
    default:
        return g_strdup(json_node_get_string(n));
    }
}

/* With ARGS, only the rows Megatron's args carry (or fix). */
static bool same_model(const CkptfsModel *a, const CkptfsModel *b, bool args, GString *diff)
{
    size_t count = 0;
    const CkptfsModelField *fields = ckptfs_schema_fields(&count);
    for (size_t i = 0; i < count; i++) {
        g_autofree char *x = ckptfs_schema_value_text(&fields[i], a);
        g_autofree char *y = ckptfs_schema_value_text(&fields[i], b);
        bool carried = !args || fields[i].args || (fields[i].flags & CKPTFS_FIELD_FIXED);
        if (carried && ckptfs_schema_applies(&fields[i], a) && strcmp(x, y) != 0)
            g_string_append_printf(diff, " %s %s/%s", fields[i].field, x, y);
    }
    return diff->len == 0;
}

/* Each row under each of its names alone: the value given is the value read. */
static void every_spelling(const char *base_json, const CkptfsModel *base)
{
    size_t count = 0;
    const CkptfsModelField *fields = ckptfs_schema_fields(&count);
    for (size_t i = 0; i < count; i++) {
        const CkptfsModelField *f = &fields[i];
        const char *names[8];
        unsigned n = names_of(f, base, names);
        if (f->type == CKPTFS_FIELD_WINDOW || n == 0 || !ckptfs_schema_applies(f, base))
            continue;
        g_autoptr(JsonObject) probe = parse(base_json);
        g_autofree char *given = NULL;
        for (unsigned k = 0; k < n && given == NULL; k++)
            given = json_text(probe, names[k]);
        if (given == NULL)
            continue; /* left to its default in this base */
        for (unsigned k = 0; k < n; k++) {
            g_autoptr(JsonObject) config = parse(base_json);
            JsonNode *value = NULL;
            for (unsigned j = 0; j < n; j++) { /* the value, then every name of it removed */
                const char *leaf = NULL;
                JsonObject *parent = parent_of(config, names[j], &leaf, false);
                if (parent && json_object_has_member(parent, leaf)) {
                    if (value == NULL)
                        value = json_node_copy(json_object_get_member(parent, leaf));
                    json_object_remove_member(parent, leaf);
                }
            }
            const char *leaf = NULL;
            JsonObject *into = parent_of(config, names[k], &leaf, true);
            json_object_set_member(into, leaf, value);
            CkptfsModel m;
            GError *error = NULL;
            bool ok = read_model(config, &m, &error);
            g_autofree char *got = ok ? ckptfs_schema_value_text(f, &m) : NULL;
            /* a rope type read as a name given ("type": "yarn" -> yarn) */
            tap_ok(ok && strcmp(got, given) == 0, "%s: %s read from %s alone: %s (%s)", base->arch->model_type,
                   f->field, names[k], got ? got : "refused", error ? error->message : given);
            g_clear_error(&error);
        }
    }
}

/* Walks 2 to 4: config.json written and read again; args written, pickled, parsed, read. */
static void round_trips(const CkptfsModel *base)
{
    g_autoptr(JsonObject) written = json_object_new();
    json_object_set_string_member(written, "model_type", base->arch->model_type);
    ckptfs_schema_write_config(base, written);
    CkptfsModel again;
    GError *error = NULL;
    memset(&again, 0, sizeof again);
    again.arch = base->arch;
    again.mla = base->mla;
    bool ok = ckptfs_schema_read_config(written, &again, &error);
    g_autoptr(GString) diff = g_string_new(NULL);
    ok = ok && same_model(base, &again, false, diff);
    tap_ok(ok, "%s: config.json written and read again: the same fields (%s%s)",
           base->arch->model_type, error ? error->message : "", diff->str);
    g_clear_error(&error);
    /* transformers 4's spelling: top-level rope_theta, rope_scaling, no rope_parameters */
    tap_ok(ckptfs_json_member(written, "rope_theta") && !ckptfs_json_member(written, "rope_parameters"),
           "%s: the written config.json has transformers 4's top-level rope_theta", base->arch->model_type);

    CkptfsValue *args = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
    ckptfs_schema_write_args(base, args);
    CkptfsPickleStream *stream = ckptfs_pickle_stream_new(NULL);
    ckptfs_pickle_stream_value(stream, args);
    g_autoptr(GBytes) bytes = ckptfs_pickle_stream_finish(stream);
    ckptfs_value_free(args);
    gsize len = 0;
    const uint8_t *data = g_bytes_get_data(bytes, &len);
    CkptfsPickle *pickle = ckptfs_pickle_parse("args", data, len, &error);
    const CkptfsPy *state = pickle ? ckptfs_py_object_state(ckptfs_pickle_root(pickle)) : NULL;
    CkptfsModel from_args;
    memset(&from_args, 0, sizeof from_args);
    from_args.arch = base->arch;
    ok = state && ckptfs_schema_read_args(state, "args", &from_args, &error);
    g_string_truncate(diff, 0);
    ok = ok && same_model(base, &from_args, true, diff);
    tap_ok(ok, "%s: args written and read again: the same fields (%s%s)",
           base->arch->model_type, error ? error->message : "", diff->str);
    g_clear_error(&error);
    if (pickle)
        ckptfs_pickle_free(pickle);
}

/* ARGS (a Namespace, freed) pickled, parsed and read into M. */
static bool read_args_value(CkptfsValue *args, CkptfsModel *m, GError **error)
{
    CkptfsPickleStream *stream = ckptfs_pickle_stream_new(NULL);
    ckptfs_pickle_stream_value(stream, args);
    g_autoptr(GBytes) bytes = ckptfs_pickle_stream_finish(stream);
    ckptfs_value_free(args);
    gsize len = 0;
    const uint8_t *data = g_bytes_get_data(bytes, &len);
    CkptfsPickle *pickle = ckptfs_pickle_parse("args", data, len, error);
    memset(m, 0, sizeof *m);
    bool ok = pickle && ckptfs_schema_read_args(ckptfs_py_object_state(ckptfs_pickle_root(pickle)), "args", m, error);
    if (pickle)
        ckptfs_pickle_free(pickle);
    return ok;
}

/* Megatron args of a small MoE whose router is SCORE with NUM_GROUPS groups (0: None). */
static CkptfsValue *moe_args(const char *score, int64_t groups)
{
    CkptfsValue *a = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
    ckptfs_value_set(a, "num_layers", ckptfs_value_int(2));
    ckptfs_value_set(a, "hidden_size", ckptfs_value_int(64));
    ckptfs_value_set(a, "num_attention_heads", ckptfs_value_int(4));
    ckptfs_value_set(a, "ffn_hidden_size", ckptfs_value_int(128));
    ckptfs_value_set(a, "swiglu", ckptfs_value_bool(true));
    ckptfs_value_set(a, "num_experts", ckptfs_value_int(8));
    ckptfs_value_set(a, "moe_router_topk", ckptfs_value_int(2));
    ckptfs_value_set(a, "moe_router_score_function", ckptfs_value_str(score));
    ckptfs_value_set(a, "moe_router_num_groups", groups ? ckptfs_value_int(groups) : ckptfs_value_none());
    ckptfs_value_set(a, "moe_router_group_topk", groups ? ckptfs_value_int(1) : ckptfs_value_none());
    ckptfs_value_set(a, "moe_router_topk_scaling_factor", ckptfs_value_float(1.0));
    ckptfs_value_set(a, "moe_router_pre_softmax", ckptfs_value_bool(true));
    return a;
}

/* BASE with EDIT's members merged: "a.b" paths, JSON values (NULL: the member removed). */
static JsonObject *edited(const char *base_json, const char *const *edit)
{
    JsonObject *config = parse(base_json);
    for (const char *const *e = edit; *e; e += 2) {
        const char *leaf = NULL;
        JsonObject *parent = parent_of(config, e[0], &leaf, true);
        if (e[1] == NULL) {
            json_object_remove_member(parent, leaf);
            continue;
        }
        g_autoptr(JsonParser) p = json_parser_new();
        g_assert(json_parser_load_from_data(p, e[1], -1, NULL));
        json_object_set_member(parent, leaf, json_node_copy(json_parser_get_root(p)));
    }
    return config;
}

/* BASE with EDIT is refused naming WANT. */
static void refused(const char *base_json, const char *const *edit, const char *want, const char *what)
{
    g_autoptr(JsonObject) config = edited(base_json, edit);
    CkptfsModel m;
    GError *error = NULL;
    bool ok = read_model(config, &m, &error);
    tap_ok(!ok && error && strstr(error->message, "config.json") && strstr(error->message, want),
           "refused: %s (%s)", what, error ? error->message : "accepted");
    g_clear_error(&error);
}

/* Qwen3.5-MoE's release config.json has no intermediate_size (Qwen3_5MoeTextConfig has none: every
 * layer MoE): the dense ffn size, Megatron's ffn_hidden_size, is then moe_intermediate_size, as
 * mbridge's bridge sets it; written back without an intermediate_size; neither given is refused
 * naming both; another MoE's config without it still refused. */
#define QWEN3_5_MOE_TEXT "\"num_hidden_layers\": 4, \"hidden_size\": 64, \"num_attention_heads\": 4, " \
    "\"num_key_value_heads\": 2, \"head_dim\": 32, \"vocab_size\": 128, \"num_experts\": 4, " \
    "\"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"shared_expert_intermediate_size\": 48, " \
    "\"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"linear_key_head_dim\": 8, " \
    "\"linear_value_head_dim\": 8, \"full_attention_interval\": 2"
static void test_ffn_from_expert(void)
{
    /* the VLM's text model: its interleaved multimodal rope */
    const char *archs[] = {"qwen3_5_moe_text", "qwen3_5_moe"};
    const char *forms[] = {"{" QWEN3_5_MOE_TEXT "}",
                           "{" QWEN3_5_MOE_TEXT ", \"rope_parameters\": {\"rope_type\": \"default\", "
                           "\"partial_rotary_factor\": 0.25, \"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true}}"};
    for (size_t a = 0; a < G_N_ELEMENTS(archs); a++) {
        g_autoptr(JsonObject) config = parse(forms[a]);
        CkptfsModel m;
        GError *error = NULL;
        memset(&m, 0, sizeof m);
        m.arch = ckptfs_architecture_find(archs[a], NULL);
        bool ok = m.arch && ckptfs_model_read_config(config, &m, &error);
        tap_ok(ok && m.ffn == 32 && m.moe_ffn == 32 && m.shared_ffn == 48,
               "%s without intermediate_size: ffn is moe_intermediate_size 32 (got %" G_GUINT64_FORMAT "; %s)",
               archs[a], ok ? m.ffn : 0, error ? error->message : "");
        g_clear_error(&error);
        if (!ok)
            continue;
        g_autoptr(JsonObject) written = json_object_new();
        ckptfs_schema_write_config(&m, written);
        CkptfsModel again;
        memset(&again, 0, sizeof again);
        again.arch = m.arch;
        bool read = ckptfs_schema_read_config(written, &again, &error);
        tap_ok(!ckptfs_json_member(written, "intermediate_size") && read && again.ffn == 32,
               "%s: the written config.json has no intermediate_size, as the release, and reads ffn 32 again (%s)",
               archs[a], error ? error->message : "");
        g_clear_error(&error);
        CkptfsValue *args = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
        ckptfs_schema_write_args(&m, args);
        CkptfsModel from_args;
        read = read_args_value(args, &from_args, &error);
        tap_ok(read && from_args.ffn == 32 && from_args.moe_ffn == 32,
               "%s: args' ffn_hidden_size and moe_ffn_hidden_size are moe_intermediate_size 32 (mbridge's) (%s)",
               archs[a], error ? error->message : "");
        g_clear_error(&error);
    }
    {
        g_autoptr(JsonObject) config = parse("{" QWEN3_5_MOE_TEXT ", \"intermediate_size\": 96}");
        CkptfsModel m;
        GError *error = NULL;
        memset(&m, 0, sizeof m);
        m.arch = ckptfs_architecture_find("qwen3_5_moe_text", NULL);
        bool ok = ckptfs_model_read_config(config, &m, &error);
        g_autoptr(JsonObject) written = json_object_new();
        if (ok)
            ckptfs_schema_write_config(&m, written);
        tap_ok(ok && m.ffn == 96 && json_object_get_int_member_with_default(written, "intermediate_size", 0) == 96,
               "qwen3_5_moe_text with intermediate_size 96: ffn 96, written back (%s)", error ? error->message : "");
        g_clear_error(&error);
    }
    {
        g_autoptr(JsonObject) config = edited("{" QWEN3_5_MOE_TEXT "}", (const char *const[]){"moe_intermediate_size", NULL, NULL});
        CkptfsModel m;
        GError *error = NULL;
        memset(&m, 0, sizeof m);
        m.arch = ckptfs_architecture_find("qwen3_5_moe_text", NULL);
        bool ok = ckptfs_model_read_config(config, &m, &error);
        tap_ok(!ok && error && strstr(error->message, "config.json: missing \"intermediate_size\" and "
                                      "\"moe_intermediate_size\""),
               "qwen3_5_moe_text with neither intermediate_size nor moe_intermediate_size is refused naming both (%s)",
               error ? error->message : "read");
        g_clear_error(&error);
    }
    refused(bases[1], (const char *const[]){"intermediate_size", NULL, NULL}, "missing \"intermediate_size\"",
            "Qwen3-MoE without intermediate_size (its dense layers' size)");
}

/* Gemma 3's text model BASE's args as its views write them (the schema's, the name, the split,
 * the zero-centred norms) with KEY set to VALUE after them (the last one counts; None: absent),
 * read as a Megatron source's: NULL when accepted, else the message. */
static char *gemma_args_refusal2(const CkptfsModel *base, const char *key, CkptfsValue *value, const char *key2,
                                 CkptfsValue *value2);
static char *gemma_args_refusal(const CkptfsModel *base, const char *key, CkptfsValue *value)
{
    return gemma_args_refusal2(base, key, value, NULL, NULL);
}

/* The same with KEY2 set to VALUE2 too. */
static char *gemma_args_refusal2(const CkptfsModel *base, const char *key, CkptfsValue *value, const char *key2,
                                 CkptfsValue *value2)
{
    CkptfsValue *a = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
    ckptfs_schema_write_args(base, a);
    ckptfs_value_set(a, "hf_architecture", ckptfs_value_str(base->arch->hf_architecture));
    ckptfs_value_set(a, "padded_vocab_size", ckptfs_value_int((int64_t)base->vocab));
    ckptfs_value_set(a, "tensor_model_parallel_size", ckptfs_value_int(1));
    ckptfs_value_set(a, "pipeline_model_parallel_size", ckptfs_value_int(1));
    ckptfs_value_set(a, "layernorm_zero_centered_gamma", ckptfs_value_bool(true));
    if (key)
        ckptfs_value_set(a, key, value);
    if (key2)
        ckptfs_value_set(a, key2, value2);
    CkptfsPickleStream *stream = ckptfs_pickle_stream_new(NULL);
    ckptfs_pickle_stream_value(stream, a);
    g_autoptr(GBytes) bytes = ckptfs_pickle_stream_finish(stream);
    ckptfs_value_free(a);
    gsize len = 0;
    const uint8_t *data = g_bytes_get_data(bytes, &len);
    GError *error = NULL;
    CkptfsPickle *pickle = ckptfs_pickle_parse("args", data, len, &error);
    CkptfsMegatronModel out;
    const CkptfsOptions options = {0};
    bool ok = pickle && ckptfs_megatron_model_from_args(ckptfs_py_object_state(ckptfs_pickle_root(pickle)), "args",
                                                        &options, NULL, &out, &error);
    ok = ok && out.model.rope_local_theta == base->rope_local_theta &&
         out.model.query_pre_attn_scalar == base->query_pre_attn_scalar && out.model.window == base->window;
    if (pickle)
        ckptfs_pickle_free(pickle);
    char *why = ok ? NULL : g_strdup(error ? error->message : "read, but its Gemma fields differ");
    g_clear_error(&error);
    return why;
}

/* A Megatron checkpoint of Gemma 3 read back from args: each field its math needs read or checked
 * against the architecture, and refused by name when absent or otherwise. */
static void test_gemma_args(void)
{
    CkptfsModel base;
    GError *error = NULL;
    const char *gemma = NULL;
    for (size_t b = 0; b < G_N_ELEMENTS(bases); b++)
        gemma = strstr(bases[b], "\"gemma3_text\"") ? bases[b] : gemma;
    g_autoptr(JsonObject) config = parse(gemma);
    bool read = read_model(config, &base, &error);
    g_clear_error(&error);
    g_autofree char *as_written = read ? gemma_args_refusal(&base, NULL, NULL) : g_strdup("no base");
    tap_ok(as_written == NULL, "gemma3_text: its views' args read back, the local rope base, query scalar and "
           "window as written (%s)", as_written ? as_written : "accepted");
    static const struct {
        const char *key, *want, *what;
        int kind; /* 0 None, 1 true, 2 false, 3 a number */
        double number;
    } cases[] = {
        {"rope_local_base_freq", "args.rope_local_base_freq is missing: Gemma3ForCausalLM computes with it",
         "without the local rope base", 0, 0},
        {"query_pre_attn_scalar", "args.query_pre_attn_scalar is missing", "without the query scalar", 0, 0},
        {"swiglu", "args.gated_linear_unit and args.openai_gelu are not both true (with swiglu false): "
         "Gemma3ForCausalLM's MLP is the gated tanh GELU", "SwiGLU", 1, 0},
        {"openai_gelu", "args.swiglu is not true and args.quick_geglu is not true with glu_linear_offset 1.0, nor "
         "gated_linear_unit with openai_gelu", "a GLU of the erf GELU", 2, 0},
        {"embed_scale", "args.embed_scale is missing: Gemma3ForCausalLM scales the embedding by sqrt(hidden_size)",
         "without the embedding's scale", 0, 0},
        {"embed_scale", "args.embed_scale is not 8", "an embedding scale other than sqrt(hidden_size)", 3, 1},
        {"softmax_scale", "args.softmax_scale is not", "a softmax scale other than query_pre_attn_scalar^-0.5", 3,
         0.125},
        {"layernorm_zero_centered_gamma", "args.layernorm_zero_centered_gamma is not true, but Gemma3ForCausalLM's "
         "norms scale by 1 + weight", "norms that are not zero-centred", 2, 0},
        {"window_attn_skip_freq", "args.window_size / window_attn_skip_freq: a full-attention layer every 4 (0: no window), "
         "but Gemma3ForCausalLM has one every 6",
         "a full-attention layer every 4th", 3, 4},
    };
    for (size_t i = 0; read && i < G_N_ELEMENTS(cases); i++) {
        CkptfsValue *v = cases[i].kind == 0   ? ckptfs_value_none()
                         : cases[i].kind == 3 ? (strcmp(cases[i].key, "window_attn_skip_freq") == 0
                                                     ? ckptfs_value_int((int64_t)cases[i].number)
                                                     : ckptfs_value_float(cases[i].number))
                                              : ckptfs_value_bool(cases[i].kind == 1);
        g_autofree char *why = gemma_args_refusal(&base, cases[i].key, v);
        tap_ok(why && strstr(why, cases[i].want), "gemma3_text args refused: %s (%s)", cases[i].what,
               why ? why : "accepted");
    }
    /* no window, so that the architecture's window pattern agrees: the MLP is what differs */
    g_autofree char *llama = read ? gemma_args_refusal2(&base, "hf_architecture", ckptfs_value_str("LlamaForCausalLM"),
                                                        "window_size", ckptfs_value_none())
                                  : NULL;
    tap_ok(llama && strstr(llama, "args.gated_linear_unit with openai_gelu (the gated tanh GELU): "
                                  "LlamaForCausalLM's MLP is SwiGLU"),
           "gemma3_text args named Llama: refused for the MLP (%s)", llama ? llama : "accepted");
    g_autofree char *unnamed = read ? gemma_args_refusal2(&base, "hf_architecture", ckptfs_value_none(),
                                                          "window_size", ckptfs_value_none())
                                    : NULL;
    tap_ok(unnamed && strstr(unnamed, "args.gated_linear_unit with openai_gelu (the gated tanh GELU): "
                                      "Qwen3ForCausalLM's MLP is SwiGLU"),
           "gemma3_text args naming no architecture: the one their features pick refuses the MLP (%s)",
           unnamed ? unnamed : "accepted");
}

int main(void)
{
    test_gemma_args();
    for (size_t b = 0; b < G_N_ELEMENTS(bases); b++) {
        g_autoptr(JsonObject) config = parse(bases[b]);
        CkptfsModel base;
        GError *error = NULL;
        bool ok = read_model(config, &base, &error);
        tap_ok(ok, "base config %zu is read (%s)", b, error ? error->message : "");
        g_clear_error(&error);
        if (!ok)
            continue;
        every_spelling(bases[b], &base);
        round_trips(&base);
    }

    const char *llama = bases[0], *qwen3_moe = bases[1], *deepseek = bases[3], *glm = bases[4];
#define EDIT(...) ((const char *const[]){__VA_ARGS__, NULL})
    refused(qwen3_moe, EDIT("rope_parameters.rope_type", "\"longrope\""), "rope_parameters.rope_type 'longrope' has no Megatron equivalent",
            "an unknown rope type");
    refused(llama, EDIT("rope_scaling.rope_type", "\"linear\""), "'linear' has no Megatron equivalent",
            "linear scaling, which Megatron lacks");
    refused(llama, EDIT("rope_scaling.rope_type", "\"dynamic\""), "'dynamic' has no Megatron equivalent",
            "dynamic scaling, which Megatron lacks");
    refused(llama, EDIT("rope_scaling.rope_type", "\"yarn\""), "'yarn' has no Megatron equivalent",
            "yarn without multi-latent attention");
    refused(llama, EDIT("rope_parameters.rope_theta", "1000000.0"), "rope_theta 500000 and rope_parameters.rope_theta 1e+06 disagree",
            "rope_theta and rope_parameters.rope_theta disagreeing");
    refused(llama, EDIT("rope_parameters.rope_type", "\"default\""), "disagree",
            "rope_scaling.rope_type llama3 and rope_parameters.rope_type default disagreeing");
    refused(qwen3_moe, EDIT("num_experts", "16"), "disagree", "num_experts and num_local_experts disagreeing");
    refused(llama, EDIT("rope_scaling.low_freq_factor", "2.0"), "low_freq_factor 2 has no Megatron equivalent",
            "llama3 low_freq_factor other than Megatron's 1");
    refused(llama, EDIT("rope_scaling.high_freq_factor", "8.0"), "high_freq_factor 8 has no Megatron equivalent",
            "llama3 high_freq_factor other than Megatron's 4");
    refused(llama, EDIT("rope_scaling.original_max_position_embeddings", "4096"),
            "original_max_position_embeddings 4096 has no Megatron equivalent",
            "llama3 original_max_position_embeddings other than Megatron's 8192");
    refused(llama, EDIT("rope_scaling.attention_factor", "0.5"), "rope_scaling.attention_factor is not understood",
            "a rope member with no rule");
    refused(llama, EDIT("rope_scaling.factor", NULL), "missing \"rope_scaling.factor\"", "llama3 without its factor");
    refused(llama, EDIT("rope_theta", "10000.5"), "rotary_base is an integer", "a rope_theta Megatron cannot take");
    refused(llama, EDIT("hidden_act", "\"gelu\""), "hidden_act 'gelu'", "an activation other than silu");
    refused(llama, EDIT("sliding_window", "4096"), "sliding_window 4096", "a sliding window narrower than the context");
    refused(llama, EDIT("mlp_bias", "true"), "mlp_bias true has no Megatron equivalent", "MLP biases");
    refused(llama, EDIT("partial_rotary_factor", "0.5"), "partial_rotary_factor 0.5", "partial rotary");
    refused(qwen3_moe, EDIT("rope_parameters.partial_rotary_factor", "0.5"), "partial_rotary_factor 0.5",
            "partial rotary in an architecture whose transformers class ignores it");
    refused(glm, EDIT("rope_parameters.partial_rotary_factor", "1.5"), "out of range", "partial rotary over 1");
    refused(glm, EDIT("partial_rotary_factor", "0.5"), "disagree", "two partial rotary factors disagreeing");

    /* GLM-4.5: transformers' partial_rotary_factor is 0.5 where config.json has none (Glm4MoeConfig's
     * default), and q/k norms follow use_qk_norm, absent: none. */
    {
        g_autoptr(JsonObject) config = edited(glm, EDIT("rope_parameters.partial_rotary_factor", NULL, "use_qk_norm",
                                                        NULL, "attention_bias", "false"));
        CkptfsModel m;
        GError *error = NULL;
        bool ok = read_model(config, &m, &error);
        tap_ok(ok && m.rotary_percent == 0.5 && !m.qk_norm && !m.qkv_bias,
               "GLM-4.5 without partial_rotary_factor and use_qk_norm: half the head rotated, no q/k norms (%s)",
               error ? error->message : "");
        g_clear_error(&error);
    }
    refused(llama, EDIT("rms_norm_eps", "\"small\""), "\"rms_norm_eps\" is not a number", "a number of the wrong type");
    /* Qwen's sliding window applies with use_sliding_window; left out, it is transformers' 4096 */
    refused(bases[2], EDIT("use_sliding_window", "true", "max_position_embeddings", "32768"), "transformers gives Qwen2MoeForCausalLM its default window "
            "of 4096", "Qwen's window turned on without its size");
    /* routing: DeepSeek's fields elsewhere, another scoring, a guessed default, limits */
    refused(qwen3_moe, EDIT("routed_scaling_factor", "2.5"), "\"routed_scaling_factor\" is set: Qwen3MoeForCausalLM "
            "routing with it is not supported", "DeepSeek's scaling in another MoE's config");
    refused(qwen3_moe, EDIT("topk_method", "\"greedy\""), "\"topk_method\" is set", "DeepSeek's top-k method elsewhere");
    refused(deepseek, EDIT("scoring_func", "\"softmax\""), "scoring_func \"softmax\" is not supported for "
            "DeepseekV3ForCausalLM (sigmoid is)", "softmax scores for V3");
    refused(deepseek, EDIT("topk_method", "\"group_limited_greedy\""), "topk_method \"group_limited_greedy\" is not "
            "supported for DeepseekV3ForCausalLM (noaux_tc is)", "a top-k method Megatron lacks");
    refused(deepseek, EDIT("routed_scaling_factor", NULL), "\"routed_scaling_factor\" is missing; "
            "DeepseekV3ForCausalLM routing needs it given", "V3 without its scaling factor");
    refused(deepseek, EDIT("n_shared_experts", "5000"), "n_shared_experts 5000 is over the limit of 4096",
            "more shared experts than kept");
    refused(deepseek, EDIT("n_group", "0"), "\"n_group\" is not a positive integer", "no expert groups as 0");
    refused(llama, EDIT("eos_token_id", "\"</s>\""), "\"eos_token_id\" is not a token id", "a token id that is a name");
    refused(llama, EDIT("eos_token_id", "[2, 1.5]"), "\"eos_token_id\" entry 1 is not a token id",
            "a list of token ids with a number that is not one");
    refused(llama, EDIT("bos_token_id", "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]"),
            "lists 17 ids, more than 16", "more token ids than kept");

    /* Megatron's args without vocab_size (older runs): read, the vocabulary left to the caller
     * (the padded size); without swiglu: refused. */
    for (int swiglu = 1; swiglu >= 0; swiglu--) {
        CkptfsValue *a = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
        ckptfs_value_set(a, "num_layers", ckptfs_value_int(2));
        ckptfs_value_set(a, "hidden_size", ckptfs_value_int(64));
        ckptfs_value_set(a, "num_attention_heads", ckptfs_value_int(4));
        ckptfs_value_set(a, "ffn_hidden_size", ckptfs_value_int(128));
        ckptfs_value_set(a, "swiglu", ckptfs_value_bool(swiglu));
        CkptfsPickleStream *stream = ckptfs_pickle_stream_new(NULL);
        ckptfs_pickle_stream_value(stream, a);
        g_autoptr(GBytes) bytes = ckptfs_pickle_stream_finish(stream);
        ckptfs_value_free(a);
        gsize len = 0;
        const uint8_t *data = g_bytes_get_data(bytes, &len);
        CkptfsPickle *pickle = ckptfs_pickle_parse("args", data, len, NULL);
        CkptfsModel m;
        memset(&m, 0, sizeof m);
        GError *error = NULL;
        bool ok = ckptfs_schema_read_args(ckptfs_py_object_state(ckptfs_pickle_root(pickle)), "args", &m, &error);
        if (swiglu)
            tap_ok(ok && m.vocab == 0 && m.rope_theta == 10000 && m.norm_eps == 1e-5 && m.kv_heads == 4,
                   "args without vocab_size: read with Megatron's defaults (%s)", error ? error->message : "");
        if (swiglu) /* untie_embeddings_and_output_weights is False in Megatron unless given */
            tap_ok(ok && m.tied_embeddings, "args without untie_embeddings_and_output_weights: tied embeddings, "
                   "as Megatron");
        if (swiglu) { /* no token ids carried: config.json says null, not transformers' defaults */
            m.vocab = 100;
            g_autoptr(JsonObject) written = json_object_new();
            ckptfs_schema_write_config(&m, written);
            static const char *const ids[] = {"bos_token_id", "eos_token_id", "pad_token_id"};
            bool nulls = !m.token_ids_known;
            for (size_t i = 0; i < G_N_ELEMENTS(ids); i++) {
                JsonNode *n = ckptfs_json_member(written, ids[i]);
                nulls = nulls && n && JSON_NODE_HOLDS_NULL(n);
            }
            tap_ok(nulls, "args without hf_token_ids: config.json written with bos/eos/pad_token_id null");
        }
        else
            tap_ok(!ok && error && strstr(error->message, "args.swiglu"), "args without swiglu: refused (%s)",
                   error ? error->message : "accepted");
        g_clear_error(&error);
        ckptfs_pickle_free(pickle);
    }

    /* The experts' fields of the MoE bases as their JSON gives them, and the same through args
     * written and read again (a row left out of the table would not be compared above). */
    for (int b = 2; b <= 3; b++) {
        g_autoptr(JsonObject) config = parse(bases[b]);
        CkptfsModel m, back;
        GError *error = NULL;
        bool ok = read_model(config, &m, &error);
        CkptfsValue *args = ckptfs_value_container(CKPTFS_VALUE_NAMESPACE);
        ckptfs_schema_write_args(&m, args);
        ok = ok && read_args_value(args, &back, &error);
        const CkptfsModel *models[2] = {&m, &back};
        for (int k = 0; k < 2; k++) {
            const CkptfsModel *x = models[k];
            bool want = b == 2 ? x->shared_ffn == 48 && x->shared_gate && !x->renormalize && !x->sigmoid_scores &&
                                     !x->expert_bias && x->groups == 0 && x->topk_scaling == 0
                               : x->shared_ffn == 32 && !x->shared_gate && x->renormalize && x->sigmoid_scores &&
                                     x->expert_bias && x->groups == 4 && x->group_topk == 2 && x->topk_scaling == 2.5;
            tap_ok(ok && want, "%s: shared expert, gate, renormalisation and routing %s (%s)",
                   b == 2 ? "qwen2_moe" : "deepseek_v3", k ? "through args" : "as config.json gives them",
                   error ? error->message : "");
        }
        g_clear_error(&error);
    }

    /* The router from args: Megatron's names and its "not set" (None, a scaling of 1). */
    {
        CkptfsModel m;
        GError *error = NULL;
        bool ok = read_args_value(moe_args("sigmoid", 4), &m, &error);
        tap_ok(ok && m.sigmoid_scores && m.groups == 4 && m.group_topk == 1 && m.topk_scaling == 0 && !m.renormalize &&
                   m.moe_ffn == 128 && m.shared_ffn == 0,
               "MoE args: sigmoid scores, 4 groups, scaling 1 as none, pre-softmax as not renormalised (%s)",
               error ? error->message : "");
        g_clear_error(&error);
        ok = read_args_value(moe_args("sparsemixer", 0), &m, &error);
        tap_ok(!ok && error && strstr(error->message, "args.moe_router_score_function is 'sparsemixer'"),
               "MoE args with a score function Megatron has and ckptfs has no rules for: refused (%s)",
               error ? error->message : "accepted");
        g_clear_error(&error);
    }

    /* What is left out is transformers' default for the architecture, not one guess for all
     * (max_position_embeddings: transformers 5.12.1's LlamaConfig(), MixtralConfig(), Phi3Config()). */
    static const struct {
        const char *arch, *type;
        double rope_theta, eps;
        uint64_t max_positions;
    } defaults[] = {{"LlamaForCausalLM", "llama", 10000, 1e-6, 2048},
                    {"MixtralForCausalLM", "mixtral", 1e6, 1e-5, 131072},
                    {"Phi3ForCausalLM", "phi3", 10000, 1e-5, 4096}};
    for (size_t i = 0; i < G_N_ELEMENTS(defaults); i++) {
        g_autofree char *json = g_strdup_printf(
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
            "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 100, "
            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2}", defaults[i].arch, defaults[i].type);
        g_autoptr(JsonObject) config = parse(json);
        CkptfsModel m;
        GError *error = NULL;
        bool ok = read_model(config, &m, &error);
        tap_ok(ok && m.rope_theta == defaults[i].rope_theta && m.norm_eps == defaults[i].eps,
               "%s without rope_theta and rms_norm_eps: transformers' %g and %g (%s)", defaults[i].type,
               defaults[i].rope_theta, defaults[i].eps, error ? error->message : "");
        tap_ok(ok && m.max_positions == defaults[i].max_positions,
               "%s without max_position_embeddings: transformers' %" G_GUINT64_FORMAT " (got %" G_GUINT64_FORMAT ")",
               defaults[i].type, defaults[i].max_positions, m.max_positions);
        g_clear_error(&error);
    }

    /* A sliding window config.json leaves out is transformers' default for the architecture:
     * MistralConfig's 4096 (a window the views do not have), none for Qwen2 unless
     * use_sliding_window (False in Qwen2Config) turns it on. */
    /* num_key_value_heads and head_dim left out: the architecture's transformers defaults
     * (MistralConfig's 8 key/value heads, Qwen3Config's head_dim 128); given as null: the
     * attention heads and hidden_size / num_attention_heads. */
    static const struct {
        const char *arch, *type, *sizes;
        uint64_t kv_heads, head_dim;
    } sizes[] = {
        {"MistralForCausalLM", "mistral", "", 8, 32},
        {"MixtralForCausalLM", "mixtral", "", 8, 32},
        {"Qwen3ForCausalLM", "qwen3", "\"num_key_value_heads\": 4, ", 4, 128},
        {"Qwen3ForCausalLM", "qwen3", "\"num_key_value_heads\": null, \"head_dim\": null, ", 16, 32},
        {"MistralForCausalLM", "mistral", "\"num_key_value_heads\": null, ", 16, 32},
        {"LlamaForCausalLM", "llama", "", 16, 32},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(sizes); i++) {
        g_autofree char *json = g_strdup_printf(
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 512, "
            "\"num_attention_heads\": 16, %s\"intermediate_size\": 1024, \"vocab_size\": 100, "
            "\"max_position_embeddings\": 4096, \"num_local_experts\": 4, \"num_experts_per_tok\": 2}",
            sizes[i].arch, sizes[i].type, sizes[i].sizes);
        g_autoptr(JsonObject) config = parse(json);
        CkptfsModel m;
        GError *error = NULL;
        bool ok = read_model(config, &m, &error);
        tap_ok(ok && m.kv_heads == sizes[i].kv_heads && m.head_dim == sizes[i].head_dim,
               "%s with {%s}: %" G_GUINT64_FORMAT " key/value heads of %" G_GUINT64_FORMAT " as transformers (got %"
               G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "; %s)", sizes[i].type, sizes[i].sizes, sizes[i].kv_heads,
               sizes[i].head_dim, ok ? m.kv_heads : 0, ok ? m.head_dim : 0, error ? error->message : "");
        g_clear_error(&error);
    }

#define MISTRAL "model_type", "\"mistral\"", "architectures", "[\"MistralForCausalLM\"]"
#define QWEN2 "model_type", "\"qwen2\"", "architectures", "[\"Qwen2ForCausalLM\"]"
    refused(llama, EDIT(MISTRAL, "sliding_window", NULL), "no \"sliding_window\"",
            "Mistral without sliding_window (transformers' window of 4096)");
    refused(llama, EDIT(QWEN2, "sliding_window", "4096", "use_sliding_window", "true"), "sliding_window 4096",
            "Qwen2 with use_sliding_window true and a window of 4096");
    {
        g_autoptr(JsonObject) qwen2 = edited(llama, EDIT(QWEN2, "sliding_window", "4096"));
        CkptfsModel m;
        GError *error = NULL;
        bool read = read_model(qwen2, &m, &error);
        tap_ok(read, "Qwen2 with a sliding_window but no use_sliding_window: read, its window off as in "
               "transformers (%s)", error ? error->message : "");
        g_clear_error(&error);

        g_autoptr(JsonObject) mistral = edited(llama, EDIT(MISTRAL, "sliding_window", "null"));
        bool ok = read_model(mistral, &m, &error);
        tap_ok(ok, "Mistral with sliding_window null: read (%s)", error ? error->message : "");
        g_clear_error(&error);
        g_autoptr(JsonObject) written = json_object_new();
        if (ok)
            ckptfs_schema_write_config(&m, written);
        JsonNode *window = ckptfs_json_member(written, "sliding_window");
        CkptfsModel again;
        memset(&again, 0, sizeof again);
        again.arch = m.arch;
        tap_ok(ok && window && JSON_NODE_HOLDS_NULL(window) && ckptfs_schema_read_config(written, &again, &error),
               "Mistral's written config.json says sliding_window null (transformers would take 4096), and is "
               "read again (%s)", error ? error->message : "");
        g_clear_error(&error);
    }

    /* A vision-language model's language model: its text part, nested as transformers 5 writes
     * it, at the top level as the release did, or both (agreeing). */
#define VLM_HEAD "{\"model_type\": \"qwen2_5_vl\", \"architectures\": [\"Qwen2_5_VLForConditionalGeneration\"], " \
                 "\"vision_config\": {\"depth\": 2, \"hidden_size\": 32}, "
#define VLM_TEXT "\"num_hidden_layers\": 3, \"hidden_size\": 64, \"num_attention_heads\": 8, \"intermediate_size\": 128, " \
                 "\"vocab_size\": 256, \"rms_norm_eps\": 1e-06, \"rope_scaling\": {\"type\": \"mrope\", \"mrope_section\": [1, 1, 2]}"
    {
        const struct {
            const char *json, *what;
        } forms[] = {
            {VLM_HEAD "\"text_config\": {" VLM_TEXT ", \"model_type\": \"qwen2_5_vl_text\"}}", "nested (transformers 5)"},
            {VLM_HEAD VLM_TEXT "}", "at the top level (the release)"},
            {VLM_HEAD VLM_TEXT ", \"text_config\": {" VLM_TEXT "}}", "in both, the same"},
            {VLM_HEAD VLM_TEXT ", \"rope_theta\": 1000000, \"text_config\": {\"rope_theta\": 1e6}}",
             "in both, a rope base written 1000000 and 1e6"},
        };
        for (size_t i = 0; i < G_N_ELEMENTS(forms); i++) {
            g_autoptr(JsonObject) config = parse(forms[i].json);
            GError *error = NULL;
            CkptfsModel m;
            g_autoptr(JsonObject) text = config ? ckptfs_schema_text_config(config, "text_config", &error) : NULL;
            bool ok = text && read_model(text, &m, &error);
            tap_ok(ok && m.arch && strcmp(m.arch->model_type, "qwen2_5_vl") == 0 && m.layers == 3 &&
                       m.hidden == 64 && m.heads == 8 && m.kv_heads == 8 && m.ffn == 128 && m.vocab == 256 &&
                       m.norm_eps == 1e-6 && m.qkv_bias && m.mrope_section[0] == 1 && m.mrope_section[1] == 1 &&
                       m.mrope_section[2] == 2,
                   "Qwen2.5-VL's language model %s: 3 layers, hidden 64, Qwen2_5_VLTextConfig's default 8 "
                   "key/value heads, q/k/v biases, mrope sections 1/1/2 (%s)", forms[i].what, error ? error->message : "");
            g_clear_error(&error);
        }
        {
            g_autoptr(JsonObject) config = parse(VLM_HEAD VLM_TEXT ", \"tie_word_embeddings\": false, \"text_config\": {"
                                                 VLM_TEXT ", \"tie_word_embeddings\": true}}");
            GError *error = NULL;
            CkptfsModel m;
            g_autoptr(JsonObject) text = config ? ckptfs_schema_text_config(config, "text_config", &error) : NULL;
            bool ok = text && read_model(text, &m, &error);
            tap_ok(ok && !m.tied_embeddings, "a text part's tie_word_embeddings under the top level's: the top "
                   "level's, which the whole model ties by (%s)", error ? error->message : "");
            g_clear_error(&error);
        }
        const struct {
            const char *json, *want, *what;
        } bad[] = {
            {VLM_HEAD VLM_TEXT ", \"text_config\": {\"hidden_size\": 32}}", "text_config.hidden_size and hidden_size disagree",
             "a text_config whose hidden_size is not the top level's"},
            {VLM_HEAD VLM_TEXT ", \"text_config\": [1]}", "\"text_config\" is not an object", "a text_config that is a list"},
        };
        /* the multimodal rope, read with the text part (errors from reading the model) */
        const struct {
            const char *json, *want, *what;
        } rope[] = {
            {VLM_HEAD "\"text_config\": {" VLM_TEXT ", \"rope_parameters\": {\"rope_type\": \"default\", \"type\": \"mrope\", "
             "\"mrope_section\": [2, 1, 1]}}}", "rope_scaling.mrope_section and rope_parameters.mrope_section disagree",
             "two mrope_sections that disagree"},
            {VLM_HEAD "\"text_config\": {\"num_hidden_layers\": 3, \"hidden_size\": 64, \"num_attention_heads\": 8, "
             "\"intermediate_size\": 128, \"vocab_size\": 256, \"rope_parameters\": {\"mrope_section\": [1, 1, 1]}}}",
             "rope_parameters.mrope_section sums to 3, not half the rotated head dim 8", "an mrope_section not covering half the head"},
            {VLM_HEAD "\"text_config\": {\"num_hidden_layers\": 3, \"hidden_size\": 64, \"num_attention_heads\": 8, "
             "\"intermediate_size\": 128, \"vocab_size\": 256}}", "no mrope_section in rope_scaling or rope_parameters",
             "no mrope_section"},
            {VLM_HEAD "\"text_config\": {\"num_hidden_layers\": 3, \"hidden_size\": 64, \"num_attention_heads\": 8, "
             "\"intermediate_size\": 128, \"vocab_size\": 256, \"rope_parameters\": {\"type\": \"yarn\", "
             "\"mrope_section\": [1, 1, 2]}}}", "rope_parameters.type 'yarn' is not mrope", "a rope type other than mrope"},
        };
        for (size_t i = 0; i < G_N_ELEMENTS(rope); i++) {
            g_autoptr(JsonObject) config = parse(rope[i].json);
            GError *error = NULL;
            CkptfsModel m;
            g_autoptr(JsonObject) text = config ? ckptfs_schema_text_config(config, "text_config", &error) : NULL;
            bool read = text && read_model(text, &m, &error);
            tap_ok(config && !read && error && strstr(error->message, rope[i].want), "%s is refused by name (%s)",
                   rope[i].what, error ? error->message : "read");
            g_clear_error(&error);
        }
        for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
            g_autoptr(JsonObject) config = parse(bad[i].json);
            GError *error = NULL;
            g_autoptr(JsonObject) text = config ? ckptfs_schema_text_config(config, "text_config", &error) : NULL;
            tap_ok(config && text == NULL && error && strstr(error->message, bad[i].want),
                   "%s is refused by name (%s)", bad[i].what, error ? error->message : "read");
            g_clear_error(&error);
        }
    }
    test_ffn_from_expert();
    return tap_done();
}
