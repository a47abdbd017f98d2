/* What Megatron-core checkpoints of both formats (legacy rank files, torch_dist) share as
 * sources: the tracker and iteration directory, the model's sizes from args (or from a given
 * config.json), and the config.json Hugging Face would write for them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/mcore.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"
#include "ckptfs/schema.h"
#include "ckptfs/units.h"
#include "source_internal.h"

#define TRACKER "latest_checkpointed_iteration.txt"

/* The iteration directory: DIR itself when it holds rank directories, else the one -o iteration
 * or the tracker names (release, or iter_%07d). */
char *ckptfs_megatron_iteration_dir(const char *dir, const char *wanted, GError **error)
{
    g_autofree char *tracker = g_build_filename(dir, TRACKER, NULL);
    g_autofree char *text = NULL;
    size_t len = 0;
    GError *read_error = NULL;
    if (wanted != NULL) {
        text = g_strdup(wanted);
        len = strlen(text);
    } else if (!ckptfs_read_small_file(tracker, CKPTFS_MAX_TRACKER_BYTES, &text, &len, &read_error)) {
        /* No tracker is normal (DIR holds the rank directories); a FIFO, directory or device
         * there, or one too large, is an error naming it. */
        if (g_error_matches(read_error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND)) {
            g_error_free(read_error);
            return g_strdup(dir);
        }
        g_propagate_error(error, read_error);
        return NULL;
    }
    bool has_nul = strlen(text) != len; /* "release\0..." is not "release" */
    g_strstrip(text);
    uint64_t it; /* digits only: "-1" is no iteration (strtoul would make it 2^64 - 1) */
    g_autofree char *name = has_nul                                              ? NULL
                            : strcmp(text, "release") == 0                       ? g_strdup("release")
                            : ckptfs_parse_uint(text, 0, G_MAXUINT64, &it, NULL) ? g_strdup_printf("iter_%07" G_GUINT64_FORMAT, it)
                                                                                 : NULL;
    if (name == NULL) {
        /* The text shown escaped and cut short: the message stays one line. */
        g_autofree char *shown = g_strescape(text, NULL);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: '%.40s%s' is neither \"release\" nor an iteration number", tracker, shown,
                    strlen(shown) > 40 || has_nul ? "..." : "");
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

static uint64_t arg_uint_or(const CkptfsPy *args, const char *key, uint64_t fallback)
{
    const CkptfsPy *v = arg(args, key);
    return v && v->kind == CKPTFS_PY_INT && !v->big && v->i > 0 ? (uint64_t)v->i : fallback;
}

/* Whether the sources read a Megatron checkpoint of VLM architecture A back: its tower has rules
 * (its names, its own modules, transposed weights, the module order are all the tables') */
static bool tower_read_back(const CkptfsArchitecture *a)
{
    return a->vision != NULL;
}

/* The architecture of a Megatron checkpoint: -o hf_arch, the one its args name, or the first
 * with its features. */
static bool pick_architecture(const char *named, const char *what, CkptfsModel *m, GError **error)
{
    m->arch = ckptfs_architecture_find(named, m);
    if (m->arch == NULL) {
        g_autoptr(GString) known = g_string_new(NULL);
        for (const CkptfsArchitecture *const *a = ckptfs_architectures(); *a; a++)
            g_string_append_printf(known, "%s%s", known->len ? ", " : "", (*a)->model_type);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: architecture '%s' has no Megatron rules (known: %s)", what,
                    named ? named : "of these args (biases, sinks, experts, norms)", known->str);
        return false;
    }
    /* no tower rules to read vision_model.* by: said before the language model's features,
     * which would name a mismatch instead */
    if (m->arch->vision_part && !tower_read_back(m->arch))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: a Megatron checkpoint of %s (a vision-language "
                           "model) is not read as a source yet", what, m->arch->hf_architecture);
    if (m->arch->hybrid_attention != m->linear_attention) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: architecture %s %s gated delta-net layers "
                    "but the checkpoint %s", what, m->arch->hf_architecture,
                    m->arch->hybrid_attention ? "has" : "has no", m->linear_attention ? "has them" : "does not");
        return false;
    }
    if (m->arch->mla != m->mla) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: architecture %s %s multi-latent attention "
                    "but the checkpoint %s", what, m->arch->hf_architecture, m->arch->mla ? "has" : "has no",
                    m->mla ? "has it" : "does not");
        return false;
    }
    /* An architecture named by the option must compute what the checkpoint does: Llama, Mistral
     * and Phi-3 have no q/k norms, and no q/k/v-only biases (Llama's attention_bias adds
     * o_proj's too); their Hugging Face model would silently leave them out. */
    bool by_option = strcmp(what, "option hf_arch") == 0;
    if (by_option && ((m->qk_norm && !m->arch->qk_norm && !m->arch->mla) || (m->qkv_bias && !m->arch->qkv_bias))) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: %s has no %s, but the checkpoint has them (args.%s is true)", what, m->arch->model_type,
                    m->qk_norm && !m->arch->qk_norm ? "q/k layernorms" : "q/k/v-only biases",
                    m->qk_norm && !m->arch->qk_norm ? "qk_layernorm" : "add_qkv_bias");
        return false;
    }
    /* GPT-OSS's features come with its architecture and only with it: a checkpoint and the
     * architecture it is read as must agree on each, or the Hugging Face model would compute
     * otherwise. */
    const CkptfsArchitecture *a = m->arch;
    const char *differs = m->linear_bias != a->linear_biases         ? "add_bias_linear"
                          : m->sinks != a->attention_sinks          ? "softmax_type"
                          : m->glu_clamp != a->glu_clamp            ? "quick_geglu / activation_func_clamp_value"
                          : m->rope_type == CKPTFS_ROPE_YARN && !m->mla && !a->yarn ? "position_embedding_type"
                                                                                   : NULL;
    if (differs) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s disagrees with %s, which has %s of "
                    "GPT-OSS's biases on every linear, attention sinks, window on alternate layers, clamped GLU and "
                    "YaRN", what, differs, a->hf_architecture, a->linear_biases ? "all" : "none");
        return false;
    }
    if (m->window_skip_freq != a->window_skip_freq) /* GPT-OSS's alternate layers, Gemma 3's every sixth */
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.window_size / window_attn_skip_freq: a "
                           "full-attention layer every %" G_GUINT64_FORMAT " (0: no window), but %s has one every %"
                           G_GUINT64_FORMAT, what, m->window_skip_freq, a->hf_architecture, a->window_skip_freq);
    m->qkv_bias |= m->arch->qkv_bias;
    m->qk_norm |= m->arch->qk_norm;
    if (m->rotary_percent != 1.0 && m->arch->partial_rotary == 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: rotary_percent %g: %s rotates the whole head (its transformers class has no "
                    "partial_rotary_factor)", what, m->rotary_percent, m->arch->hf_architecture);
        return false;
    }
    if ((m->arch->moe != NULL) != (m->experts > 0)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: architecture %s %s experts but the checkpoint has %s", what,
                    m->arch->hf_architecture, m->arch->moe ? "has" : "has no",
                    m->experts ? "experts" : "none");
        return false;
    }
    if (m->arch->moe && !m->arch->moe->dense_layers && !m->arch->moe->deepseek_config &&
        ckptfs_model_moe_layers(m) < m->layers) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: %s has no dense layers but the checkpoint has some (moe_layer_freq)", what,
                    m->arch->hf_architecture);
        return false;
    }
    bool deepseek_routing = m->arch->moe && m->arch->moe->deepseek_config;
    if (m->experts && !deepseek_routing && (m->sigmoid_scores || m->expert_bias || m->groups || m->topk_scaling > 0)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: %s routes with softmax scores alone; the checkpoint's router (sigmoid scores, "
                    "expert bias, expert groups or a scaling factor) has no rules for it", what,
                    m->arch->hf_architecture);
        return false;
    }
    if (m->arch->moe && m->shared_ffn > 0 && m->arch->moe->shared_ffn_key == NULL &&
        m->arch->moe->shared_count_key == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: %s has no shared expert but the checkpoint has one", what,
                    m->arch->hf_architecture);
        return false;
    }
    return true;
}

/* The experts' structure from args (their sizes and routing read with the schema): what the
 * routing must satisfy, which layers are MoE. */
static bool moe_from_args(const CkptfsPy *args, const char *path, CkptfsModel *s, GError **error)
{
    if (s->experts == 0)
        return true;
    if (s->groups == 0)
        s->group_topk = 0;
    if (s->groups && (s->group_topk == 0 || s->group_topk > s->groups)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: args.moe_router_num_groups %" G_GUINT64_FORMAT " with moe_router_group_topk %" G_GUINT64_FORMAT
                    " (the best groups at most their number)", path, s->groups, s->group_topk);
        return false;
    }
    s->shared_gate = s->shared_gate && s->shared_ffn > 0;
    if (s->topk > s->experts) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: args.num_experts %" G_GUINT64_FORMAT " with moe_router_topk %" G_GUINT64_FORMAT
                    " (top-k at most their number)", path, s->experts, s->topk);
        return false;
    }
    /* moe_layer_freq: every N-th layer (from layer 0), or a 0/1 pattern of every layer. */
    const CkptfsPy *freq = arg(args, "moe_layer_freq");
    if (freq && freq->kind == CKPTFS_PY_INT && !freq->big && freq->i > 0) {
        for (uint64_t l = 0; l < s->layers && l < CKPTFS_MAX_LAYERS; l++)
            if (l % (uint64_t)freq->i != 0)
                ckptfs_model_set_dense_layer(s, l);
    } else if (freq && freq->kind == CKPTFS_PY_LIST) {
        if (freq->items->len != s->layers) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                        "%s: args.moe_layer_freq lists %u layers, num_layers is %" G_GUINT64_FORMAT,
                        path, freq->items->len, s->layers);
            return false;
        }
        for (guint l = 0; l < freq->items->len; l++) {
            const CkptfsPy *v = g_ptr_array_index(freq->items, l);
            if (v->kind != CKPTFS_PY_INT || (v->i != 0 && v->i != 1)) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: args.moe_layer_freq entry %u is not 0 or 1", path, l);
                return false;
            }
            if (v->i == 0)
                ckptfs_model_set_dense_layer(s, l);
        }
    } else if (freq && freq->kind != CKPTFS_PY_NONE) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: args.moe_layer_freq is neither a positive integer nor a list", path);
        return false;
    }
    return true;
}

/* A hybrid's layer kinds from args.linear_attention_freq (Megatron-core 0.17.1's
 * get_linear_attention_pattern: N, every N-th layer softmax attention; or a 0/1 list, 1 linear),
 * and the gated attention and zero-centred norms its architecture computes with. */
static bool linear_from_args(const CkptfsPy *args, const char *path, CkptfsModel *s, GError **error)
{
    if (!s->arch->hybrid_attention)
        return true;
    const char *flags[] = {"attention_output_gate", "layernorm_zero_centered_gamma"};
    for (size_t i = 0; i < G_N_ELEMENTS(flags); i++) {
        const CkptfsPy *v = arg(args, flags[i]);
        if (v == NULL || v->kind != CKPTFS_PY_BOOL || !v->i)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s is not true, which %s computes with",
                               path, flags[i], s->arch->hf_architecture);
    }
    const CkptfsPy *freq = arg(args, "linear_attention_freq");
    memset(s->linear_layer, 0, sizeof s->linear_layer);
    if (freq && freq->kind == CKPTFS_PY_INT && !freq->big && freq->i > 0) {
        for (uint64_t l = 0; l < s->layers && l < CKPTFS_MAX_LAYERS; l++)
            if ((l + 1) % (uint64_t)freq->i != 0)
                ckptfs_model_set_linear_layer(s, l);
        return true;
    }
    if (freq == NULL || freq->kind != CKPTFS_PY_LIST)
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: args.linear_attention_freq is neither a positive "
                           "integer nor a list", path);
    if (freq->items->len != s->layers)
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: args.linear_attention_freq lists %u layers, num_layers "
                           "is %" G_GUINT64_FORMAT, path, freq->items->len, s->layers);
    for (guint l = 0; l < freq->items->len; l++) {
        const CkptfsPy *v = g_ptr_array_index(freq->items, l);
        if (v->kind != CKPTFS_PY_INT || (v->i != 0 && v->i != 1))
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: args.linear_attention_freq entry %u is not 0 or 1",
                               path, l);
        if (v->i == 1)
            ckptfs_model_set_linear_layer(s, l);
    }
    return true;
}

/* Whether the MoE layers of S are DeepSeek's: none of the first *FIRST_DENSE, then those at
 * multiples of *FREQ. */
static bool dense_first_pattern(const CkptfsModel *s, uint64_t *first_dense, uint64_t *freq)
{
    uint64_t k = 0, f = 1;
    while (k < s->layers && !ckptfs_model_layer_is_moe(s, k))
        k++;
    for (uint64_t l = k + 1; l < s->layers; l++)
        if (ckptfs_model_layer_is_moe(s, l)) {
            f = l - k;
            break;
        }
    if (k % f != 0) /* the first MoE layer is itself a multiple of the frequency */
        return false;
    for (uint64_t l = 0; l < s->layers; l++)
        if (ckptfs_model_layer_is_moe(s, l) != (l >= k && l % f == 0))
            return false;
    if (first_dense)
        *first_dense = k, *freq = f;
    return true;
}

/* The MTP layers from args, and what DeepSeek's config fields (DeepSeek-V2/V3, GLM-4.5: S's
 * architecture picked) can say of its experts. */
static bool deepseek_from_args(const CkptfsPy *args, const char *path, CkptfsModel *s, GError **error)
{
    s->mtp_layers = arg_uint_or(args, "mtp_num_layers", 0);
    s->mtp = s->mtp_layers > 0; /* what the files hold */
    if (s->arch->moe == NULL || !s->arch->moe->deepseek_config)
        return true;
    /* What DeepSeek's config.json can say: shared experts as a count of expert-sized MLPs, dense
     * layers as the first k and then every f-th MoE. */
    if (s->experts && s->shared_ffn % s->moe_ffn != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.moe_shared_expert_intermediate_size %" G_GUINT64_FORMAT
                           " is not a multiple of moe_ffn_hidden_size %" G_GUINT64_FORMAT
                           " (DeepSeek's n_shared_experts)", path, s->shared_ffn, s->moe_ffn);
    if (s->experts && !dense_first_pattern(s, NULL, NULL))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.moe_layer_freq: MoE layers that are not the "
                           "first k dense layers then every f-th, which DeepSeek's first_k_dense_replace and "
                           "moe_layer_freq say", path);
    return true;
}

/* A vision-language model's tower. Megatron's args have none (mbridge builds its config apart):
 * its fields come from the config.json given with the checkpoint, else from the part of
 * config.json the views' args carry as JSON text. */
static bool vision_tower_from_args(const CkptfsPy *args, JsonObject *given, CkptfsModel *s, GError **error)
{
    if (given != NULL)
        return ckptfs_model_read_vision(given, s, error);
    const char *text = ckptfs_py_str(arg(args, "hf_vision_config"));
    if (text == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "args.hf_vision_config is missing: Megatron's args "
                           "hold no vision tower of %s; give the model's config.json with -o hf_config or "
                           "-o hf_extra", s->arch->hf_architecture);
    g_autoptr(JsonObject) carried = ckptfs_json_parse_object("args.hf_vision_config", text, strlen(text), error);
    return carried != NULL && ckptfs_model_read_vision(carried, s, error);
}

/* A vision-language model's multimodal rope (args.mrope_section), or the text rope of one that
 * rotates by the text position alone (text_rope), and its vision tower. */
static bool vision_from_args(const CkptfsPy *args, const char *path, JsonObject *given, CkptfsModel *s,
                             GError **error)
{
    const char *position = ckptfs_py_str(arg(args, "position_embedding_type"));
    if (s->arch->text_rope && (position == NULL || strcmp(position, "rope") != 0))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "args.position_embedding_type is not rope: %s's "
                           "language model rotates by the text position alone", s->arch->hf_architecture);
    if (s->arch->text_rope)
        return vision_tower_from_args(args, given, s, error);
    const CkptfsPy *sections = arg(args, "mrope_section");
    uint64_t sum = 0;
    bool listed = sections && sections->kind == CKPTFS_PY_LIST && sections->items->len == 3;
    for (guint i = 0; listed && i < 3; i++) {
        const CkptfsPy *v = g_ptr_array_index(sections->items, i);
        listed = v->kind == CKPTFS_PY_INT && !v->big && v->i > 0 && (uint64_t)v->i <= CKPTFS_MAX_MODEL_DIM;
        s->mrope_section[i] = listed ? (uint64_t)v->i : 0;
        sum += s->mrope_section[i];
    }
    if (position == NULL || strcmp(position, "mrope") != 0 || !listed)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "args.position_embedding_type is not mrope with a "
                           "mrope_section of three positive sections: %s's rotary embedding is multimodal",
                           s->arch->hf_architecture);
    if (sum * 2 != ckptfs_model_rotated_dim(s))
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "args.mrope_section sums to %" G_GUINT64_FORMAT ", not half "
                           "the rotated head dim %" G_GUINT64_FORMAT, sum, ckptfs_model_rotated_dim(s));
    return vision_tower_from_args(args, given, s, error);
}

/* A number of ARGS that must be WANT (to a relative 1e-12: it was computed from what config.json
 * gives, as sqrt or an inverse square root) when REQUIRED, and may be absent otherwise. */
static bool arg_agrees(const CkptfsPy *args, const char *path, const char *key, double want, bool required,
                       const char *why, GError **error)
{
    const CkptfsPy *v = arg(args, key);
    if (v == NULL || v->kind == CKPTFS_PY_NONE) {
        if (!required)
            return true;
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s is missing: %s", path, key, why);
    }
    double got = v->kind == CKPTFS_PY_FLOAT ? v->f : v->kind == CKPTFS_PY_INT && !v->big ? (double)v->i : NAN;
    if (!(fabs(got - want) <= 1e-12 * fabs(want)))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.%s is not %.17g: %s", path, key, want, why);
    return true;
}

/* The norms and scales S's architecture computes with, which the args must say so (Gemma's:
 * Megatron's layernorm_zero_centered_gamma, mbridge's embed_scale sqrt(hidden_size), the scores'
 * softmax_scale query_pre_attn_scalar^-0.5, the full layers' rope scaled linearly, which only
 * Gemma's rules read); a hybrid's zero-centred norms are linear_from_args'. */
static bool scales_from_args(const CkptfsPy *args, const char *path, const CkptfsModel *s, GError **error)
{
    const CkptfsArchitecture *a = s->arch;
    if (s->rope_type == CKPTFS_ROPE_LINEAR && !a->gemma_attention)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.rotary_seq_len_interpolation_factor %g: linear "
                           "rope scaling is read for Gemma 3's full-attention layers only, not for %s", path,
                           s->rope_linear_factor, a->hf_architecture);
    const CkptfsPy *centred = arg(args, "layernorm_zero_centered_gamma");
    bool zero_centred = centred && centred->kind == CKPTFS_PY_BOOL && centred->i;
    if (!a->hybrid_attention && zero_centred != a->zero_centred_norms)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: args.layernorm_zero_centered_gamma is %s, but %s's "
                           "norms %s", path, zero_centred ? "true" : "not true", a->hf_architecture,
                           a->zero_centred_norms ? "scale by 1 + weight" : "scale by the weight");
    g_autofree char *embed_why = g_strdup_printf("%s scales the embedding by %s", a->hf_architecture,
                                                 a->scaled_embedding ? "sqrt(hidden_size)" : "nothing");
    if (!arg_agrees(args, path, "embed_scale", a->scaled_embedding ? sqrt((double)s->hidden) : 1.0,
                    a->scaled_embedding, embed_why, error))
        return false;
    return !a->gemma_attention ||
           arg_agrees(args, path, "softmax_scale", 1.0 / sqrt(s->query_pre_attn_scalar), false,
                      "the scores are scaled by query_pre_attn_scalar^-0.5", error);
}

bool ckptfs_megatron_model_from_args(const CkptfsPy *args, const char *path, const CkptfsOptions *options,
                                     JsonObject *given_config, CkptfsMegatronModel *out,
                                     GError **error)
{
    memset(out, 0, sizeof *out);
    CkptfsModel *s = &out->model;
    uint64_t tp = 0, pp = 0;
    if (!ckptfs_schema_read_args(args, path, s, error) ||
        !arg_uint(args, path, "padded_vocab_size", &out->padded_vocab, error) ||
        !arg_uint(args, path, "tensor_model_parallel_size", &tp, error) ||
        !arg_uint(args, path, "pipeline_model_parallel_size", &pp, error))
        return false;
    if (s->vocab == 0)
        s->vocab = out->padded_vocab;
    if (!moe_from_args(args, path, s, error))
        return false;
    /* -o hf_arch, else what ckptfs wrote into args, else the config.json given with the
     * checkpoint (-o hf_config / hf_extra), else the features. */
    const char *hf_arch = options->hf_arch;
    const char *named = hf_arch ? hf_arch : ckptfs_py_str(arg(args, "hf_architecture"));
    if (named == NULL && given_config != NULL)
        named = ckptfs_json_member_string(given_config, "model_type");
    if (!pick_architecture(named, hf_arch ? "option hf_arch" : path, s, error) ||
        !ckptfs_schema_read_args_for_arch(args, path, s, error) || !deepseek_from_args(args, path, s, error) ||
        !linear_from_args(args, path, s, error) || !scales_from_args(args, path, s, error))
        return false;
    if (options->bridge_names && !ckptfs_model_use_bridge_names(s, NULL, error)) { /* read by its rows */
        g_prefix_error(error, "%s: ", path);
        return false;
    }
    if (s->arch->vision && (!vision_from_args(args, path, given_config, s, error) ||
                            !ckptfs_model_check_vision_split(s, (unsigned)tp, error))) {
        g_prefix_error(error, "%s: ", path);
        return false;
    }
    out->layout = (CkptfsLayout){.tp = (unsigned)tp, .pp = (unsigned)pp,
                                 .vpp = (unsigned)arg_uint_or(args, "virtual_pipeline_model_parallel_size", 1),
                                 .pp_first = (unsigned)arg_uint_or(args, "decoder_first_pipeline_num_layers", 0),
                                 .pp_last = (unsigned)arg_uint_or(args, "decoder_last_pipeline_num_layers", 0),
                                 .ep = (unsigned)MIN(arg_uint_or(args, "expert_model_parallel_size", 1), 65536),
                                 .etp = (unsigned)MIN(arg_uint_or(args, "expert_tensor_parallel_size", tp), 65536)};
    return true;
}

bool ckptfs_megatron_model_from_config(JsonObject *c, const char *what, CkptfsMegatronModel *out,
                                       GError **error)
{
    memset(out, 0, sizeof *out);
    CkptfsModel *s = &out->model;
    if (c == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: no args Namespace; give the model's config.json with -o hf_config=PATH or "
                    "-o hf_extra=DIR", what);
        return false;
    }
    /* The architecture the config names; its built-in features (Qwen2's biases, Qwen3's norms). */
    const char *type = ckptfs_json_member_string(c, "model_type");
    const CkptfsArchitecture *named = ckptfs_architecture_find(type, s);
    if (named && named->mla) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "%s: %s: a Megatron checkpoint of an MLA model is read with its args (the MLA sizes "
                    "and routing are there); this one has none", what, named->hf_architecture);
        return false;
    }
    if (named && named->vision_part && !tower_read_back(named)) /* its config is not a text model's */
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: a Megatron checkpoint of %s (a vision-language "
                           "model) is not read as a source yet", what, named->hf_architecture);
    /* a VLM's config.json holds all: text_config (or the release's top level), the multimodal
     * rope's sections and vision_config */
    s->arch = named;
    g_autoptr(JsonObject) text = named && named->vision ? ckptfs_schema_text_config(c, named->text_part, error)
                                                        : json_object_ref(c);
    if (text == NULL || (named && named->vision && !ckptfs_model_read_vision(c, s, error)) ||
        !ckptfs_model_read_config(text, s, error)) {
        g_prefix_error(error, "%s without args: ", what);
        return false;
    }
    return pick_architecture(type, "config.json", s, error);
}

char *ckptfs_megatron_describe(const CkptfsSource *source)
{
    g_autofree char *saved = ckptfs_layout_name(&source->saved_layout);
    return g_strdup_printf("%u files opened; saved as %s", ckptfs_srcfiles_count(source->files), saved);
}

/* DeepSeek's config fields (modeling_deepseek.py's names; GLM-4.5 reads them too) from Megatron
 * beyond the schema's: dense layers as first_k_dense_replace and moe_layer_freq when the pattern is one of theirs
 * (else an explicit list would be needed, which DeepSeek's config has no field for: the model
 * check then says which layer differs). */
static void synthesize_deepseek(JsonObject *c, const CkptfsModel *m)
{
    json_object_set_int_member(c, "num_nextn_predict_layers", (gint64)m->mtp_layers);
    if (m->experts == 0)
        return;
    uint64_t first_dense = 0, freq = 1;
    dense_first_pattern(m, &first_dense, &freq); /* checked when read */
    json_object_set_int_member(c, "first_k_dense_replace", (gint64)first_dense);
    json_object_set_int_member(c, "moe_layer_freq", (gint64)freq);
}

/* The members of C that belong to the whole model, not to its language model. */
static bool whole_model_member(const char *name)
{
    static const char *const whole[] = {"architectures", "model_type", "torch_dtype", "tie_word_embeddings", NULL};
    return g_strv_contains(whole, name);
}

/* The language model's fields of C moved under the architecture's text part, as its releases
 * write them (Qwen3-VL's and Gemma 3's text_config; transformers' class reads nothing of it at the
 * top level): a multimodal rope as rope_parameters with its base, the sections handed out
 * interleaved as M's architecture computes them. */
static void nest_text_part(JsonObject *c, const CkptfsModel *m)
{
    JsonObject *text = json_object_new();
    g_autoptr(GList) members = json_object_get_members(c);
    for (GList *k = members; k; k = k->next)
        if (!whole_model_member(k->data)) {
            json_object_set_member(text, k->data, json_node_copy(json_object_get_member(c, k->data)));
            json_object_remove_member(c, k->data);
        }
    json_object_set_object_member(c, m->arch->text_part, text);
    if (m->arch->text_rope) /* Gemma 3's: its text rope's fields as its text model's config has them */
        return;
    JsonObject *rope = json_object_ref(json_object_get_object_member(text, "rope_scaling"));
    json_object_remove_member(text, "rope_scaling");
    json_object_remove_member(rope, "type");
    json_object_set_string_member(rope, "rope_type", "default");
    if (m->arch->mrope_interleaved) /* what Qwen3-VL's releases say; GLM-4.5V's say nothing */
        json_object_set_boolean_member(rope, "mrope_interleaved", true);
    if (json_object_has_member(text, "rope_theta")) {
        json_object_set_member(rope, "rope_theta", json_node_copy(json_object_get_member(text, "rope_theta")));
        json_object_remove_member(text, "rope_theta");
    }
    json_object_set_object_member(text, "rope_parameters", rope);
}

void ckptfs_megatron_synthesize_config(CkptfsSource *source, const CkptfsModel *m)
{
    /* config.json as Hugging Face would write it for this model: the model rules then read it
     * like any HF config, and hf/ shows it. */
    JsonObject *c = json_object_new();
    JsonArray *archs = json_array_new();
    json_array_add_string_element(archs, m->arch->hf_architecture);
    json_object_set_array_member(c, "architectures", archs);
    json_object_set_string_member(c, "model_type", m->arch->model_type);
    ckptfs_schema_write_config(m, c);
    /* Until the weights are listed: then the type most of them are served in (source.c). */
    json_object_set_string_member(c, "torch_dtype", "bfloat16");
    source->config_dtype_from_weights = true;
    source->token_ids_unknown = !m->token_ids_known;
    if (!m->token_ids_known)
        g_ptr_array_add(source->warnings, g_strdup("hf/config.json: bos_token_id, eos_token_id and pad_token_id "
                                                   "are null: the Megatron args name no tokenizer ids (give the "
                                                   "model's config.json with -o hf_config or -o hf_extra)"));
    if (m->arch->vision && !m->arch->text_rope) { /* the release's: mrope's sections in rope_scaling */
        JsonObject *rope = json_object_new();
        JsonArray *sections = json_array_new();
        for (size_t i = 0; i < G_N_ELEMENTS(m->mrope_section); i++)
            json_array_add_int_element(sections, (gint64)m->mrope_section[i]);
        json_object_set_string_member(rope, "type", "mrope");
        json_object_set_array_member(rope, "mrope_section", sections);
        json_object_set_object_member(c, "rope_scaling", rope);
    }
    if (m->arch->hybrid_attention) {
        JsonArray *kinds = json_array_new();
        for (uint64_t l = 0; l < m->layers; l++)
            json_array_add_string_element(kinds, ckptfs_model_layer_is_linear(m, l) ? "linear_attention"
                                                                                    : "full_attention");
        json_object_set_array_member(c, "layer_types", kinds);
    }
    if (m->arch->moe && m->arch->moe->deepseek_config)
        synthesize_deepseek(c, m);
    else if (m->arch->moe) {
        if (m->arch->moe->dense_layers) {
            JsonArray *dense = json_array_new();
            for (uint64_t l = 0; l < m->layers; l++)
                if (!ckptfs_model_layer_is_moe(m, l))
                    json_array_add_int_element(dense, (gint64)l);
            json_object_set_int_member(c, "decoder_sparse_step", 1);
            json_object_set_array_member(c, "mlp_only_layers", dense);
        }
    }
    if (m->arch->vision && m->arch->released_text_part)
        nest_text_part(c, m);
    if (m->arch->vision) /* the tower's part and the whole model's token ids */
        ckptfs_model_write_vision(m, c);
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
    JsonObject *given = ckptfs_json_load_object(path, error);
    if (given == NULL)
        return false;
    if (source->config)
        json_object_unref(source->config);
    source->config = given;
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

void ckptfs_piece_set_want_shape(CkptfsPieceSet *set, const char *name, unsigned ndim, const uint64_t *dims)
{
    if (g_hash_table_contains(set->pieces, name))
        return;
    char *key = g_strdup(name);
    g_hash_table_insert(set->pieces, key, g_array_new(FALSE, FALSE, sizeof(CkptfsPiece)));
    /* ndim, the dims, the dtype */
    uint64_t *shape = g_new0(uint64_t, CKPTFS_PIECE_SHAPE_LEN);
    shape[0] = ndim, shape[CKPTFS_PIECE_SHAPE_LEN - 1] = CKPTFS_DTYPE_INVALID;
    memcpy(shape + 1, dims, MIN(ndim, 5u) * sizeof *dims);
    g_hash_table_insert(set->shapes, key, shape);
    g_ptr_array_add(set->order, key);
}

void ckptfs_piece_set_want(CkptfsPieceSet *set, const char *name, unsigned ndim, uint64_t d0,
                           uint64_t d1)
{
    /* ndim 3: [d0, 1, d1], a convolution's weight */
    const uint64_t dims[3] = {d0, ndim == 3 ? 1 : d1, d1};
    ckptfs_piece_set_want_shape(set, name, ndim, dims);
}

uint64_t ckptfs_piece_set_numel(const CkptfsPieceSet *set, const char *name)
{
    const uint64_t *shape = g_hash_table_lookup(set->shapes, name);
    uint64_t n = 1;
    for (uint64_t i = 0; i < shape[0]; i++)
        n *= shape[1 + i]; /* sizes the model's limits bound */
    return n;
}

void ckptfs_piece_set_add(CkptfsPieceSet *set, const char *name, const CkptfsPiece *piece)
{
    g_array_append_val(g_hash_table_lookup(set->pieces, name), *piece);
}

void ckptfs_piece_set_want_model(CkptfsPieceSet *set, const CkptfsModel *m, const GPtrArray *keys)
{
    g_autoptr(GArray) tensors = ckptfs_model_hf_tensors(m, keys);
    for (guint i = 0; i < tensors->len; i++) {
        const CkptfsHfShape *t = &g_array_index(tensors, CkptfsHfShape, i);
        uint64_t kernel[5];
        unsigned kernel_dims = ckptfs_model_kernel_shape(m, t->cols_dim, t->d0, kernel);
        if (kernel_dims)
            ckptfs_piece_set_want_shape(set, t->name, kernel_dims, kernel);
        else
            ckptfs_piece_set_want(set, t->name, t->ndim, t->d0, t->d1);
    }
}

void ckptfs_piece_set_dtype(CkptfsPieceSet *set, const char *name, CkptfsDtype dtype)
{
    uint64_t *shape = g_hash_table_lookup(set->shapes, name);
    if (shape)
        shape[CKPTFS_PIECE_SHAPE_LEN - 1] = dtype;
}

bool ckptfs_megatron_add_mtp_copies(CkptfsCatalog *catalog, const CkptfsModel *m, GError **error)
{
    const CkptfsTensor *embed = ckptfs_catalog_find(catalog, "model.embed_tokens.weight");
    const CkptfsTensor *head = ckptfs_catalog_find(catalog, m->tied_embeddings ? "model.embed_tokens.weight"
                                                                               : "lm_head.weight");
    /* DeepSeek's form only: a family with MTP layers of their own prefix has no copies */
    bool copies = m->arch->family->mtp_hf_prefix == NULL;
    for (uint64_t j = 0; copies && j < m->mtp_layers && embed && head; j++) {
        const CkptfsTensor *from[2] = {embed, head};
        const char *suffix[2] = {"embed_tokens.weight", "shared_head.head.weight"};
        for (int i = 0; i < 2; i++) {
            g_autofree char *name = ckptfs_model_hf_layer_name(m, m->layers + j, suffix[i]);
            const CkptfsTensor *t = from[i];
            if (!ckptfs_catalog_add_pieces(catalog, name, t->dtype, t->ndim, t->shape, t->pieces, t->npieces, error))
                return false;
        }
    }
    return true;
}

bool ckptfs_piece_set_to_catalog(const CkptfsPieceSet *set, CkptfsCatalog *catalog,
                                 CkptfsDtype dtype, GError **error)
{
    for (guint i = 0; i < set->order->len; i++) {
        const char *name = g_ptr_array_index(set->order, i);
        GArray *pieces = g_hash_table_lookup(set->pieces, name);
        const uint64_t *shape = g_hash_table_lookup(set->shapes, name);
        CkptfsDtype own = (CkptfsDtype)shape[CKPTFS_PIECE_SHAPE_LEN - 1];
        if (!ckptfs_catalog_add_pieces(catalog, name, own != CKPTFS_DTYPE_INVALID ? own : dtype,
                                       (unsigned)shape[0], shape + 1,
                                       (const CkptfsPiece *)(void *)pieces->data, pieces->len, error))
            return false;
    }
    return true;
}

bool ckptfs_megatron_unshift_norms(CkptfsCatalog *catalog, const CkptfsModel *m, const GPtrArray *keys,
                                   GError **error)
{
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(keys, i);
        for (uint64_t l = 0; key->rule->recipe == CKPTFS_RECIPE_LESS_ONE && l < m->layers; l++) {
            g_autofree char *name = ckptfs_mcore_hf_name(key, l, 0, key->rule->hf[0]);
            if (ckptfs_rule_in_layer(key->rule, m, l) && !ckptfs_catalog_set_shift(catalog, name, +1, error))
                return false;
        }
    }
    return true;
}
