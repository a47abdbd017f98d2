/* What Megatron-core checkpoints of both formats (legacy rank files, torch_dist) share as
 * sources: the tracker and iteration directory, the model's sizes from args (or from a given
 * config.json), and the config.json Hugging Face would write for them. */
#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "source_internal.h"

#define TRACKER "latest_checkpointed_iteration.txt"

/* The iteration directory: DIR itself when it holds rank directories, else the one -o iteration
 * or the tracker names (release, or iter_%07d). */
char *ckptfs_megatron_iteration_dir(const char *dir, const char *wanted, GError **error)
{
    g_autofree char *tracker = g_build_filename(dir, TRACKER, NULL);
    g_autofree char *text = NULL;
    if (wanted != NULL)
        text = g_strdup(wanted);
    else if (!g_file_get_contents(tracker, &text, NULL, NULL))
        return g_strdup(dir);
    g_strstrip(text);
    char *end;
    unsigned long it = strtoul(text, &end, 10);
    g_autofree char *name = strcmp(text, "release") == 0 ? g_strdup("release")
                            : (*text && *end == '\0') ? g_strdup_printf("iter_%07lu", it) : NULL;
    if (name == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: '%s' is neither \"release\" nor an iteration number", tracker, text);
        return NULL;
    }
    char *iter = g_build_filename(dir, name, NULL);
    if (!g_file_test(iter, G_FILE_TEST_IS_DIR)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s names %s, which does not exist",
                    wanted ? "option iteration" : tracker, iter);
        g_free(iter);
        return NULL;
    }
    return iter;
}



static const CkptfsPy *arg(const CkptfsPy *args, const char *key)
{
    return ckptfs_py_dict_get(args, key);
}

static bool arg_uint(const CkptfsPy *args, const char *path, const char *key, uint64_t *out,
                     GError **error)
{
    const CkptfsPy *v = arg(args, key);
    if (v == NULL || v->kind != CKPTFS_PY_INT || v->big || v->i <= 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: args.%s is missing or not a positive integer", path, key);
        return false;
    }
    *out = (uint64_t)v->i;
    return true;
}

static bool arg_bool(const CkptfsPy *args, const char *key)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_BOOL && v->i;
}

static double arg_double(const CkptfsPy *args, const char *key, double fallback)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_FLOAT ? v->f : v && v->kind == CKPTFS_PY_INT ? (double)v->i : fallback;
}

static uint64_t arg_uint_or(const CkptfsPy *args, const char *key, uint64_t fallback)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_INT && !v->big && v->i > 0 ? (uint64_t)v->i : fallback;
}

bool ckptfs_megatron_sizes_from_args(const CkptfsPy *args, const char *path,
                                     CkptfsMegatronSizes *s, GError **error)
{
    memset(s, 0, sizeof *s);
    uint64_t tp = 0, pp = 0;
    if (!arg_uint(args, path, "num_layers", &s->layers, error) ||
        !arg_uint(args, path, "hidden_size", &s->hidden, error) ||
        !arg_uint(args, path, "num_attention_heads", &s->heads, error) ||
        !arg_uint(args, path, "ffn_hidden_size", &s->ffn, error) ||
        !arg_uint(args, path, "padded_vocab_size", &s->padded_vocab, error) ||
        !arg_uint(args, path, "tensor_model_parallel_size", &tp, error) ||
        !arg_uint(args, path, "pipeline_model_parallel_size", &pp, error))
        return false;
    if (arg_uint_or(args, "expert_model_parallel_size", 1) != 1 || arg_uint_or(args, "num_experts", 0)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: mixture-of-experts checkpoints are not supported yet", path);
        return false;
    }
    if (!arg_bool(args, "swiglu")) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: args.swiglu is not true; only SwiGLU models are supported", path);
        return false;
    }
    s->groups = arg_bool(args, "group_query_attention") ? arg_uint_or(args, "num_query_groups", s->heads) : s->heads;
    s->head_dim = arg_uint_or(args, "kv_channels", s->hidden / s->heads);
    s->vocab = arg_uint_or(args, "vocab_size", s->padded_vocab);
    s->tied = !arg_bool(args, "untie_embeddings_and_output_weights");
    s->qkv_bias = arg_bool(args, "add_qkv_bias");
    s->qk_norm = arg_bool(args, "qk_layernorm");
    s->layout = (CkptfsLayout){.tp = (unsigned)tp, .pp = (unsigned)pp,
                               .vpp = (unsigned)arg_uint_or(args, "virtual_pipeline_model_parallel_size", 1),
                               .pp_first = (unsigned)arg_uint_or(args, "decoder_first_pipeline_num_layers", 0),
                               .pp_last = (unsigned)arg_uint_or(args, "decoder_last_pipeline_num_layers", 0)};
    return true;
}

bool ckptfs_megatron_sizes_from_config(JsonObject *c, const char *what, CkptfsMegatronSizes *s,
                                       GError **error)
{
    memset(s, 0, sizeof *s);
    if (c == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: no args Namespace; give the model's config.json with -o hf_config=PATH or "
                    "-o hf_extra=DIR", what);
        return false;
    }
    const char *need[] = {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"};
    for (size_t i = 0; i < G_N_ELEMENTS(need); i++)
        if (json_object_get_int_member_with_default(c, need[i], 0) <= 0) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "config.json: \"%s\" is missing or not positive (needed for %s without args)",
                        need[i], what);
            return false;
        }
    s->layers = (uint64_t)json_object_get_int_member(c, "num_hidden_layers");
    s->hidden = (uint64_t)json_object_get_int_member(c, "hidden_size");
    s->heads = (uint64_t)json_object_get_int_member(c, "num_attention_heads");
    s->ffn = (uint64_t)json_object_get_int_member(c, "intermediate_size");
    s->vocab = (uint64_t)json_object_get_int_member(c, "vocab_size");
    s->groups = (uint64_t)json_object_get_int_member_with_default(c, "num_key_value_heads", (gint64)s->heads);
    s->head_dim = (uint64_t)json_object_get_int_member_with_default(c, "head_dim", (gint64)(s->hidden / s->heads));
    s->tied = json_object_get_boolean_member_with_default(c, "tie_word_embeddings", false);
    const char *type = json_object_get_string_member_with_default(c, "model_type", "");
    s->qkv_bias = strcmp(type, "qwen2") == 0 || json_object_get_boolean_member_with_default(c, "attention_bias", false);
    s->qk_norm = strcmp(type, "qwen3") == 0;
    if (s->groups == 0 || s->head_dim == 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "config.json: num_key_value_heads and head_dim must be positive");
        return false;
    }
    return true;
}

void ckptfs_megatron_synthesize_config(CkptfsSource *source, const CkptfsMegatronSizes *s,
                                       const CkptfsPy *args, const char *hf_arch)
{
    /* config.json as Hugging Face would write it for this model: the model rules then read it
     * like any HF config, and hf/ shows it. The architecture follows from the weights unless
     * -o hf_arch says (Mistral and Llama have the same ones). */
    const char *type = hf_arch ? hf_arch : s->qk_norm ? "qwen3" : s->qkv_bias ? "qwen2" : "llama";
    const char *arch = NULL;
    for (const CkptfsArchitecture *const *a = ckptfs_architectures(); *a; a++)
        if (strcmp((*a)->model_type, type) == 0)
            arch = (*a)->hf_architecture;
    JsonObject *c = json_object_new();
    JsonArray *archs = json_array_new();
    json_array_add_string_element(archs, arch);
    json_object_set_array_member(c, "architectures", archs);
    json_object_set_string_member(c, "model_type", type);
    json_object_set_int_member(c, "hidden_size", (gint64)s->hidden);
    json_object_set_int_member(c, "intermediate_size", (gint64)s->ffn);
    json_object_set_int_member(c, "num_attention_heads", (gint64)s->heads);
    json_object_set_int_member(c, "num_key_value_heads", (gint64)s->groups);
    json_object_set_int_member(c, "num_hidden_layers", (gint64)s->layers);
    json_object_set_int_member(c, "head_dim", (gint64)s->head_dim);
    json_object_set_int_member(c, "vocab_size", (gint64)s->vocab);
    json_object_set_int_member(c, "max_position_embeddings", (gint64)arg_uint_or(args, "max_position_embeddings", 4096));
    json_object_set_double_member(c, "rms_norm_eps",
                                  arg_double(args, "layernorm_epsilon", arg_double(args, "norm_epsilon", 1e-5)));
    json_object_set_double_member(c, "rope_theta", arg_double(args, "rotary_base", 10000));
    json_object_set_boolean_member(c, "tie_word_embeddings", s->tied);
    json_object_set_string_member(c, "hidden_act", "silu");
    json_object_set_string_member(c, "torch_dtype", "bfloat16");
    if (arg_bool(args, "use_rope_scaling")) {
        JsonObject *scaling = json_object_new();
        json_object_set_string_member(scaling, "rope_type", "llama3");
        json_object_set_double_member(scaling, "factor", arg_double(args, "rope_scaling_factor", 8.0));
        json_object_set_object_member(c, "rope_scaling", scaling);
    }
    source->config = c;
}

/* -o hf_config / the config.json of -o hf_extra replace the synthesized one, as given. */
bool ckptfs_source_use_given_config(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    g_autofree char *extra_config = options->hf_extra ? g_build_filename(options->hf_extra, "config.json", NULL) : NULL;
    const char *path = options->hf_config ? options->hf_config
                       : extra_config && g_file_test(extra_config, G_FILE_TEST_IS_REGULAR) ? extra_config
                                                                                            : NULL;
    if (path == NULL)
        return true;
    g_autoptr(JsonParser) parser = json_parser_new_immutable();
    GError *json_error = NULL;
    if (!json_parser_load_from_file(parser, path, &json_error) ||
        !JSON_NODE_HOLDS_OBJECT(json_parser_get_root(parser))) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a JSON object%s%s", path,
                    json_error ? ": " : "", json_error ? json_error->message : "");
        g_clear_error(&json_error);
        return false;
    }
    if (source->config)
        json_object_unref(source->config);
    source->config = json_object_ref(json_node_get_object(json_parser_get_root(parser)));
    return ckptfs_source_add_file(source, "config.json", path, error);
}

/* Files hf/ passes through from -o hf_extra (tokenizer and the like); weights are not taken. */
bool ckptfs_source_add_extra_files(CkptfsSource *source, const char *dir, GError **error)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        if (g_str_has_suffix(name, ".safetensors") || strcmp(name, "model.safetensors.index.json") == 0)
            continue;
        g_autofree char *path = g_build_filename(dir, name, NULL);
        if (g_file_test(path, G_FILE_TEST_IS_REGULAR) && !ckptfs_source_add_file(source, name, path, error))
            return false;
    }
    return true;
}



CkptfsPieceSet *ckptfs_piece_set_new(void)
{
    CkptfsPieceSet *set = g_new0(CkptfsPieceSet, 1);
    set->pieces = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, (GDestroyNotify)g_array_unref);
    set->order = g_ptr_array_new_with_free_func(g_free);
    set->shapes = g_hash_table_new_full(g_str_hash, g_str_equal, NULL, g_free);
    return set;
}

void ckptfs_piece_set_free(CkptfsPieceSet *set)
{
    if (set == NULL)
        return;
    g_hash_table_unref(set->pieces);
    g_hash_table_unref(set->shapes);
    g_ptr_array_unref(set->order);
    g_free(set);
}

void ckptfs_piece_set_want(CkptfsPieceSet *set, const char *name, unsigned ndim, uint64_t d0,
                           uint64_t d1)
{
    if (g_hash_table_contains(set->pieces, name))
        return;
    char *key = g_strdup(name);
    g_hash_table_insert(set->pieces, key, g_array_new(FALSE, FALSE, sizeof(CkptfsPiece)));
    uint64_t *shape = g_new(uint64_t, 3);
    shape[0] = ndim, shape[1] = d0, shape[2] = d1;
    g_hash_table_insert(set->shapes, key, shape);
    g_ptr_array_add(set->order, key);
}

void ckptfs_piece_set_add(CkptfsPieceSet *set, const char *name, const CkptfsPiece *piece)
{
    g_array_append_val(g_hash_table_lookup(set->pieces, name), *piece);
}

bool ckptfs_piece_set_to_catalog(const CkptfsPieceSet *set, CkptfsCatalog *catalog,
                                 CkptfsDtype dtype, GError **error)
{
    for (guint i = 0; i < set->order->len; i++) {
        const char *name = g_ptr_array_index(set->order, i);
        GArray *pieces = g_hash_table_lookup(set->pieces, name);
        const uint64_t *shape = g_hash_table_lookup(set->shapes, name);
        if (!ckptfs_catalog_add_pieces(catalog, name, dtype, (unsigned)shape[0], shape + 1,
                                       (const CkptfsPiece *)(void *)pieces->data, pieces->len, error))
            return false;
    }
    return true;
}
