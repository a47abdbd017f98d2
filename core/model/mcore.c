#include "ckptfs/mcore.h"

#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"

static void segment(CkptfsMcoreKey *k, const char *hf_name, uint64_t hf_row0, uint64_t row0,
                    uint64_t rows)
{
    CkptfsMcoreSegment s = {g_strdup(hf_name), hf_row0, row0, rows};
    g_array_append_val(k->segments, s);
}

static void segment_clear(gpointer p)
{
    g_free(((CkptfsMcoreSegment *)p)->hf_name);
}

static void key_free(gpointer p)
{
    CkptfsMcoreKey *k = p;
    g_array_unref(k->segments);
    g_free(k->key);
    g_free(k->local_key);
    g_free(k);
}

static uint64_t dim_value(const CkptfsModel *m, CkptfsDim dim, uint64_t padded_vocab)
{
    switch (dim) {
    case CKPTFS_DIM_ONE:
        return 1;
    case CKPTFS_DIM_HIDDEN:
        return m->hidden;
    case CKPTFS_DIM_HEAD:
        return m->head_dim;
    case CKPTFS_DIM_Q:
        return m->heads * m->head_dim;
    case CKPTFS_DIM_QKV:
        return (m->heads + 2 * m->kv_heads) * m->head_dim;
    case CKPTFS_DIM_FFN:
        return m->ffn;
    case CKPTFS_DIM_FFN2:
        return 2 * m->ffn;
    case CKPTFS_DIM_VOCAB:
        return padded_vocab;
    case CKPTFS_DIM_EXPERTS:
        return m->experts;
    case CKPTFS_DIM_MOE_FFN:
        return m->moe_ffn;
    case CKPTFS_DIM_MOE_FFN2:
        return 2 * m->moe_ffn;
    case CKPTFS_DIM_SHARED_FFN:
        return m->shared_ffn;
    case CKPTFS_DIM_SHARED_FFN2:
        return 2 * m->shared_ffn;
    case CKPTFS_DIM_Q_LORA:
        return m->q_lora;
    case CKPTFS_DIM_KV_LORA:
        return m->kv_lora;
    case CKPTFS_DIM_MLA_Q:
        return m->heads * (m->qk_head_dim + m->qk_rope_dim);
    case CKPTFS_DIM_MLA_KV_DOWN:
        return m->kv_lora + m->qk_rope_dim;
    case CKPTFS_DIM_MLA_KV_UP:
        return m->heads * (m->qk_head_dim + m->v_head_dim);
    case CKPTFS_DIM_MLA_OUT:
        return m->heads * m->v_head_dim;
    case CKPTFS_DIM_HIDDEN2:
        return 2 * m->hidden;
    case CKPTFS_DIM_PATCH:
        /* a Conv2d's kernel (no temporal patch: SigLIP's) is one frame's */
        return m->vision_channels * MAX(m->vision_temporal_patch, 1) * m->vision_patch * m->vision_patch;
    case CKPTFS_DIM_MERGED:
    case CKPTFS_DIM_MERGE_KERNEL:
        return m->hidden * m->vision_merge * m->vision_merge;
    case CKPTFS_DIM_VISION_OUT:
        return m->vision_out_hidden;
    case CKPTFS_DIM_HEADS:
        return m->heads;
    case CKPTFS_DIM_QKV_GATED:
        return (2 * m->heads + 2 * m->kv_heads) * m->head_dim;
    case CKPTFS_DIM_GDN_IN:
        return 2 * m->linear_key_heads * m->linear_key_dim + 2 * m->linear_value_heads * m->linear_value_dim +
               2 * m->linear_value_heads;
    case CKPTFS_DIM_GDN_CONV:
        return 2 * m->linear_key_heads * m->linear_key_dim + m->linear_value_heads * m->linear_value_dim;
    case CKPTFS_DIM_GDN_VALUE:
        return m->linear_value_heads * m->linear_value_dim;
    case CKPTFS_DIM_GDN_HEADS:
        return m->linear_value_heads;
    case CKPTFS_DIM_GDN_VALUE_HEAD:
        return m->linear_value_dim;
    case CKPTFS_DIM_CONV_KERNEL:
        return m->conv_kernel;
    case CKPTFS_DIM_POSITIONS:
        return m->vision_positions;
    }
    return 0;
}

unsigned ckptfs_dim_sections(const CkptfsModel *m, CkptfsDim dim, uint64_t out[CKPTFS_MAX_SECTIONS],
                             const char *names[CKPTFS_MAX_SECTIONS])
{
    uint64_t key = m->linear_key_heads * m->linear_key_dim, value = m->linear_value_heads * m->linear_value_dim;
    /* Megatron-core 0.17.1's GatedDeltaNet: in_proj = [q, k, v, z, beta, alpha], conv1d's
     * channels [q, k, v], each section split over TP on its own and, in sharded_state_dict, a
     * torch_dist key of its own (_split_tensor_factory) */
    const uint64_t in_proj[] = {key, key, value, value, m->linear_value_heads, m->linear_value_heads};
    const uint64_t conv[] = {key, key, value};
    static const char *const section_names[] = {"query", "key", "value", "z", "beta", "alpha"};
    const uint64_t *sections = dim == CKPTFS_DIM_GDN_IN ? in_proj : dim == CKPTFS_DIM_GDN_CONV ? conv : NULL;
    unsigned n = dim == CKPTFS_DIM_GDN_IN ? G_N_ELEMENTS(in_proj) : dim == CKPTFS_DIM_GDN_CONV ? G_N_ELEMENTS(conv) : 0;
    for (unsigned i = 0; i < n; i++) {
        out[i] = sections[i];
        if (names)
            names[i] = section_names[i];
    }
    return n;
}

bool ckptfs_rule_present(const CkptfsRule *rule, const CkptfsModel *m, bool tied_output_copy)
{
    switch (rule->need) {
    case CKPTFS_NEED_ALWAYS:
        return true;
    case CKPTFS_NEED_QKV_BIAS:
        return m->qkv_bias;
    case CKPTFS_NEED_QK_NORM:
        return m->qk_norm;
    case CKPTFS_NEED_OUTPUT:
        return !m->tied_embeddings || tied_output_copy;
    case CKPTFS_NEED_DENSE_MLP:
        return ckptfs_model_moe_layers(m) < m->layers;
    case CKPTFS_NEED_MOE:
        return ckptfs_model_moe_layers(m) > 0;
    case CKPTFS_NEED_SHARED_EXPERT:
        return ckptfs_model_moe_layers(m) > 0 && m->shared_ffn > 0;
    case CKPTFS_NEED_SHARED_GATE:
        return ckptfs_model_moe_layers(m) > 0 && m->shared_ffn > 0 && m->shared_gate;
    case CKPTFS_NEED_Q_LORA:
        return m->mla && m->q_lora > 0;
    case CKPTFS_NEED_Q_DIRECT:
        return m->mla && m->q_lora == 0;
    case CKPTFS_NEED_EXPERT_BIAS:
        return ckptfs_model_moe_layers(m) > 0 && m->expert_bias;
    case CKPTFS_NEED_MTP:
        return m->mtp;
    case CKPTFS_NEED_FULL_ATTENTION:
        return ckptfs_model_linear_layers(m) < m->layers;
    case CKPTFS_NEED_LINEAR_ATTENTION:
        return ckptfs_model_linear_layers(m) > 0;
    case CKPTFS_NEED_VISION_QKV_BIAS:
        return m->vision_qkv_bias;
    }
    return false;
}

bool ckptfs_rule_in_layer(const CkptfsRule *rule, const CkptfsModel *m, uint64_t layer)
{
    if (!ckptfs_rule_present(rule, m, false))
        return false;
    switch (rule->need) {
    case CKPTFS_NEED_DENSE_MLP:
        return !ckptfs_model_layer_is_moe(m, layer);
    case CKPTFS_NEED_MOE:
    case CKPTFS_NEED_SHARED_EXPERT:
    case CKPTFS_NEED_SHARED_GATE:
    case CKPTFS_NEED_EXPERT_BIAS:
        return ckptfs_model_layer_is_moe(m, layer);
    case CKPTFS_NEED_FULL_ATTENTION:
        return !ckptfs_model_layer_is_linear(m, layer);
    case CKPTFS_NEED_LINEAR_ATTENTION:
        return ckptfs_model_layer_is_linear(m, layer);
    default:
        return true;
    }
}

/* The row segments of a key, from its recipe: which rows of which HF tensors fill it. */
static void add_segments(CkptfsMcoreKey *key, const CkptfsModel *m, const char *const *hf)
{
    uint64_t d = m->head_dim, hpg = m->heads / m->kv_heads, block = (hpg + 2) * d;
    uint64_t q = m->heads * d, kv = m->kv_heads * d;
    switch (key->rule->recipe) {
    case CKPTFS_RECIPE_WHOLE: /* the vocabulary's padding rows are left uncovered */
    case CKPTFS_RECIPE_SWAP_COL_HALVES: /* rows as they are; readers swap the columns */
    case CKPTFS_RECIPE_LESS_ONE:        /* rows as they are; readers shift the elements */
    case CKPTFS_RECIPE_TRANSPOSED:      /* the HF tensor's columns as rows; readers transpose */
        segment(key, hf[0], 0, 0, key->split == CKPTFS_TP_VOCAB ? m->vocab : key->rows);
        break;
    case CKPTFS_RECIPE_QKV:
    case CKPTFS_RECIPE_QKV_FUSED: {
        bool fused = key->rule->recipe == CKPTFS_RECIPE_QKV_FUSED;
        const char *k = fused ? hf[0] : hf[1], *v = fused ? hf[0] : hf[2];
        uint64_t k0 = fused ? q : 0, v0 = fused ? q + kv : 0;
        for (uint64_t g = 0; g < m->kv_heads; g++) {
            segment(key, hf[0], g * hpg * d, g * block, hpg * d);
            segment(key, k, k0 + g * d, g * block + hpg * d, d);
            segment(key, v, v0 + g * d, g * block + (hpg + 1) * d, d);
        }
        break;
    }
    case CKPTFS_RECIPE_QKV_GATED: /* per group: queries, gates, key, value (q_proj: [q; gate] per head) */
        for (uint64_t g = 0; g < m->kv_heads; g++) {
            uint64_t gated_block = (2 * hpg + 2) * d;
            for (uint64_t h = 0; h < hpg; h++)
                segment(key, hf[0], (g * hpg + h) * 2 * d, g * gated_block + h * d, d);
            for (uint64_t h = 0; h < hpg; h++)
                segment(key, hf[0], (g * hpg + h) * 2 * d + d, g * gated_block + (hpg + h) * d, d);
            segment(key, hf[1], g * d, g * gated_block + 2 * hpg * d, d);
            segment(key, hf[2], g * d, g * gated_block + (2 * hpg + 1) * d, d);
        }
        break;
    case CKPTFS_RECIPE_GDN_IN_GROUPED: {
        /* Qwen3-Next's in_proj_qkvz holds [q_g; k_g; v_g; z_g] per key-head group g, in_proj_ba
         * [b_g; a_g]; Megatron's sections hold each over all groups, group by group */
        uint64_t groups = m->linear_key_heads, dk = m->linear_key_dim;
        uint64_t heads_per_group = m->linear_value_heads / groups, vg = heads_per_group * m->linear_value_dim;
        uint64_t qkvz_group = 2 * dk + 2 * vg, ba_group = 2 * heads_per_group;
        const uint64_t at_in_group[] = {0, dk, 2 * dk, 2 * dk + vg, 0, heads_per_group};
        const uint64_t per_group[] = {dk, dk, vg, vg, heads_per_group, heads_per_group};
        uint64_t row0 = 0;
        for (unsigned s = 0; s < G_N_ELEMENTS(per_group); s++) {
            bool ba = s >= 4;
            for (uint64_t g = 0; g < groups; g++)
                segment(key, hf[ba ? 1 : 0], g * (ba ? ba_group : qkvz_group) + at_in_group[s],
                        row0 + g * per_group[s], per_group[s]);
            row0 += groups * per_group[s];
        }
        break;
    }
    case CKPTFS_RECIPE_GDN_IN_SPLIT: { /* [q; k; v] as in_proj_qkv holds them, then z, b, a */
        uint64_t qkv = key->sections[0] + key->sections[1] + key->sections[2];
        segment(key, hf[0], 0, 0, qkv);
        for (unsigned s = 3; s < 6; s++) {
            segment(key, hf[s - 2], 0, qkv, key->sections[s]);
            qkv += key->sections[s];
        }
        break;
    }
    case CKPTFS_RECIPE_HALVES:
        segment(key, hf[0], 0, 0, key->rows / 2);
        segment(key, hf[1], 0, key->rows / 2, key->rows / 2);
        break;
    case CKPTFS_RECIPE_HALVES_FUSED:
        segment(key, hf[0], 0, 0, key->rows / 2);
        segment(key, hf[0], key->rows / 2, key->rows / 2, key->rows / 2);
        break;
    }
}

GPtrArray *ckptfs_mcore_keys(const CkptfsModel *m, uint64_t padded_vocab, bool tied_output_copy)
{
    GPtrArray *keys = g_ptr_array_new_with_free_func(key_free);
    const CkptfsFamily *family = m->arch->family;
    for (unsigned i = 0; i < family->n_rules; i++) {
        const CkptfsRule *r = &family->rules[i];
        if (r->extra_state || !ckptfs_rule_present(r, m, tied_output_copy))
            continue;
        CkptfsMcoreKey *k = g_new0(CkptfsMcoreKey, 1);
        bool stacked = r->scope == CKPTFS_SCOPE_LAYER, listed = r->scope == CKPTFS_SCOPE_LIST;
        const char *local = r->local_dist_name ? r->local_dist_name : r->name;
        const char *layers = m->arch->layer_prefix ? m->arch->layer_prefix : "decoder.layers.";
        const char *prefix = stacked ? layers : listed ? m->arch->list_prefix : "";
        *k = (CkptfsMcoreKey){g_strconcat(prefix, r->name, NULL), g_strconcat(prefix, local, NULL),
                              r, stacked, r->expert, r->expert ? m->experts : 0,
                              r->ndim, dim_value(m, r->rows, padded_vocab),
                              r->ndim == 1 ? 1 : dim_value(m, r->cols, padded_vocab), r->split, {0}, {NULL}, 0,
                              g_array_new(FALSE, FALSE, sizeof(CkptfsMcoreSegment)), m->layers,
                              family->mtp_hf_prefix, family->mtp_hf_block_prefix, m->arch->hf_layer_prefix, listed,
                              listed ? m->list_modules : 0, m->arch->list_hf_prefix, layers};
        k->n_sections = ckptfs_dim_sections(m, r->rows, k->sections, k->section_names);
        g_array_set_clear_func(k->segments, segment_clear);
        /* Tied embeddings: the output layer is the embedding's copy. */
        const char *tied[1] = {r->tied_hf};
        add_segments(k, m, r->need == CKPTFS_NEED_OUTPUT && m->tied_embeddings ? tied : r->hf);
        g_ptr_array_add(keys, k);
    }
    return keys;
}

CkptfsDtype ckptfs_mcore_key_dtype(const CkptfsMcoreKey *key, const CkptfsModel *m)
{
    return key->rule->fp32 && m->fp32_dtype != CKPTFS_DTYPE_INVALID ? m->fp32_dtype : m->dtype;
}

void ckptfs_mcore_keys_for_spec(GPtrArray *keys, bool te_spec)
{
    for (guint i = 0; i < keys->len; i++) {
        CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        k->split = ckptfs_rule_split(k->rule, te_spec);
    }
}

const CkptfsMcoreKey *ckptfs_mcore_key_of(const GPtrArray *keys, const CkptfsRule *rule)
{
    for (guint i = 0; i < keys->len; i++)
        if (((const CkptfsMcoreKey *)g_ptr_array_index(keys, i))->rule == rule)
            return g_ptr_array_index(keys, i);
    return NULL;
}

const char *ckptfs_rule_legacy_name(const CkptfsRule *rule, bool te_spec)
{
    return !te_spec && rule->local_name ? rule->local_name : rule->name;
}

static int legacy_order(const CkptfsRule *rule, bool te_spec)
{
    return te_spec ? rule->te_order : rule->local_order;
}

static gint cmp_legacy_order(gconstpointer a, gconstpointer b, gpointer te_spec)
{
    bool te = GPOINTER_TO_INT(te_spec);
    return legacy_order(*(const CkptfsRule *const *)a, te) - legacy_order(*(const CkptfsRule *const *)b, te);
}

GPtrArray *ckptfs_legacy_entries(const CkptfsModel *m, CkptfsScope scope, uint64_t layer,
                                 bool te_spec, bool tied_output_copy)
{
    GPtrArray *out = g_ptr_array_new();
    const CkptfsFamily *family = m->arch->family;
    for (unsigned i = 0; i < family->n_rules; i++) {
        const CkptfsRule *r = &family->rules[i];
        bool present = scope == CKPTFS_SCOPE_LAYER ? ckptfs_rule_in_layer(r, m, layer)
                                                   : ckptfs_rule_present(r, m, tied_output_copy);
        if (r->scope == scope && legacy_order(r, te_spec) != CKPTFS_ABSENT && present)
            g_ptr_array_add(out, (gpointer)r);
    }
    g_ptr_array_sort_with_data(out, cmp_legacy_order, GINT_TO_POINTER(te_spec));
    return out;
}

static void append_decimal(GString *out, uint64_t v)
{
    char digits[20];
    int n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n > 0)
        g_string_append_c(out, digits[--n]);
}

/* PREFIX, N and a dot, then HF with each "{e}" made EXPERT: built in one string, without
 * printf (a 1T model's ~70k expert names are made each time its model is checked). */
static char *layer_name(const char *prefix, uint64_t n, const char *hf, uint64_t expert)
{
    GString *out = g_string_sized_new(96);
    g_string_append(out, prefix);
    append_decimal(out, n);
    g_string_append_c(out, '.');
    for (const char *p = hf;;) {
        const char *brace = strstr(p, "{e}");
        if (brace == NULL) {
            g_string_append(out, p);
            break;
        }
        g_string_append_len(out, p, brace - p);
        append_decimal(out, expert);
        p = brace + 3;
    }
    return g_string_free(out, FALSE);
}

char *ckptfs_legacy_key(CkptfsScope scope, uint64_t local, const char *name, const char *mtp_prefix)
{
    if (scope == CKPTFS_SCOPE_LAYER && mtp_prefix)
        return g_strdup_printf("%smtp_model_layer.%s", mtp_prefix, name);
    if (scope == CKPTFS_SCOPE_LAYER) {
        GString *out = g_string_sized_new(96); /* without printf: made for every tensor of a rank file */
        g_string_append(out, "decoder.layers.");
        append_decimal(out, local);
        g_string_append_c(out, '.');
        g_string_append(out, name);
        return g_string_free(out, FALSE);
    }
    if (scope == CKPTFS_SCOPE_MTP_IN || scope == CKPTFS_SCOPE_MTP_OUT || scope == CKPTFS_SCOPE_LIST)
        return g_strdup_printf("%s%s", mtp_prefix, name);
    return g_strdup(name);
}

char *ckptfs_list_module_prefix(const CkptfsModel *m, uint64_t j)
{
    return g_strdup_printf("%s%" G_GUINT64_FORMAT ".", m->arch->list_prefix, j);
}

char *ckptfs_legacy_entry_key(const CkptfsModel *m, const CkptfsRule *rule, const char *prefix, uint64_t local,
                              const char *name, const char *mtp_prefix)
{
    const char *layers = m->arch->layer_prefix;
    g_autofree char *local_key = rule->scope == CKPTFS_SCOPE_LAYER && layers
                                     ? g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s", layers, local, name)
                                     : ckptfs_legacy_key(rule->scope, local, name, mtp_prefix);
    return g_strconcat(rule->module ? rule->module : prefix, local_key, NULL);
}

char *ckptfs_expert_legacy_name(const CkptfsRule *rule, bool grouped, uint64_t j)
{
    /* rule->name is "mlp.experts.experts.<linear>.<param>" */
    const char *linear = rule->name + strlen("mlp.experts.experts.");
    if (!grouped)
        return g_strdup_printf("mlp.experts.local_experts.%" G_GUINT64_FORMAT ".%s", j, linear);
    if (rule->extra_state)
        return g_strdup_printf("mlp.experts.%s", linear);
    return g_strdup_printf("mlp.experts.%s%" G_GUINT64_FORMAT, linear, j);
}

GPtrArray *ckptfs_mcore_extra_state_rules(const CkptfsModel *m)
{
    GPtrArray *out = g_ptr_array_new();
    const CkptfsFamily *family = m->arch->family;
    for (unsigned i = 0; i < family->n_rules; i++) {
        const CkptfsRule *r = &family->rules[i];
        if (r->extra_state && r->scope == CKPTFS_SCOPE_LAYER && r->te_order != CKPTFS_ABSENT &&
            ckptfs_rule_present(r, m, false))
            g_ptr_array_add(out, (gpointer)r);
    }
    return out;
}

static bool mtp_scope(CkptfsScope scope)
{
    return scope == CKPTFS_SCOPE_MTP_IN || scope == CKPTFS_SCOPE_MTP_OUT;
}

bool ckptfs_mcore_key_swaps_col_halves(const CkptfsMcoreKey *key)
{
    return key->rule->recipe == CKPTFS_RECIPE_SWAP_COL_HALVES;
}

bool ckptfs_mcore_key_transposed(const CkptfsMcoreKey *key)
{
    return key->rule->recipe == CKPTFS_RECIPE_TRANSPOSED;
}

char *ckptfs_mcore_hf_name(const CkptfsMcoreKey *key, uint64_t layer, uint64_t expert, const char *hf)
{
    if (key->listed) /* LAYER is the module's number in the list */
        return g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s", key->list_hf_prefix, layer, hf);
    if (!key->stacked && !mtp_scope(key->rule->scope))
        return g_strdup(hf);
    if (key->mtp_hf_block_prefix && mtp_scope(key->rule->scope)) /* one set for the block */
        return g_strconcat(key->mtp_hf_block_prefix, hf, NULL);
    const char *decoder_prefix = key->hf_layer_prefix ? key->hf_layer_prefix : CKPTFS_HF_LAYER_PREFIX;
    if (layer < key->decoder_layers)
        return layer_name(decoder_prefix, layer, hf, expert);
    uint64_t first;
    const char *prefix = ckptfs_mtp_hf_prefix(key->mtp_hf_prefix, decoder_prefix, key->decoder_layers, &first);
    return layer_name(prefix, first + (layer - key->decoder_layers), hf, expert);
}

/* Adds the tensors of KEY's segments (layer LAYER, expert E) to OUT, each once (SEEN: name ->
 * its index + 1), its rows as far as a segment reaches. */
static void add_hf_tensors(GArray *out, GHashTable *seen, const CkptfsMcoreKey *k, uint64_t layer,
                           uint64_t e)
{
    for (guint s = 0; s < k->segments->len; s++) {
        const CkptfsMcoreSegment *seg = &g_array_index(k->segments, CkptfsMcoreSegment, s);
        char *name = ckptfs_mcore_hf_name(k, layer, e, seg->hf_name);
        guint at = GPOINTER_TO_UINT(g_hash_table_lookup(seen, name));
        if (at == 0) {
            CkptfsHfShape fresh = {name, k->ndim, 0, k->ndim >= 2 ? k->cols : 0, k->rule->fp32,
                                   k->rule->cols};
            if (ckptfs_mcore_key_transposed(k)) /* [cols, rows] */
                fresh.d1 = k->rows;
            g_array_append_val(out, fresh);
            at = out->len;
            g_hash_table_insert(seen, name, GUINT_TO_POINTER(at));
        } else {
            g_free(name);
        }
        CkptfsHfShape *shape = &g_array_index(out, CkptfsHfShape, at - 1);
        shape->d0 = ckptfs_mcore_key_transposed(k) ? k->cols : MAX(shape->d0, seg->hf_row0 + seg->rows);
    }
}

/* The tensors of layer L. */
static void add_layer_tensors(GArray *out, GHashTable *seen, const CkptfsModel *m, const GPtrArray *keys,
                              uint64_t l)
{
    bool experts_done = false;
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (!k->stacked || !ckptfs_rule_in_layer(k->rule, m, l) || (k->expert && experts_done))
            continue;
        if (!k->expert) {
            add_hf_tensors(out, seen, k, l, 0);
            continue;
        }
        /* Expert by expert: all of expert 0's tensors, then expert 1's. */
        for (uint64_t e = 0; e < m->experts; e++)
            for (guint j = i; j < keys->len; j++) {
                const CkptfsMcoreKey *ek = g_ptr_array_index(keys, j);
                if (ek->expert)
                    add_hf_tensors(out, seen, ek, l, e);
            }
        experts_done = true;
    }
}

static void add_scope_tensors(GArray *out, GHashTable *seen, const GPtrArray *keys, CkptfsScope scope,
                              uint64_t layer)
{
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (k->rule->scope == scope)
            add_hf_tensors(out, seen, k, layer, 0);
    }
}

static void hf_shape_clear(gpointer p)
{
    g_free(((CkptfsHfShape *)p)->name);
}

GArray *ckptfs_model_hf_tensors(const CkptfsModel *m, const GPtrArray *keys)
{
    GArray *out = g_array_new(FALSE, FALSE, sizeof(CkptfsHfShape));
    g_array_set_clear_func(out, hf_shape_clear);
    g_autoptr(GHashTable) seen = g_hash_table_new(ckptfs_name_hash, g_str_equal);
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (k->rule->scope == CKPTFS_SCOPE_FIRST)
            add_hf_tensors(out, seen, k, 0, 0);
    }
    for (uint64_t l = 0; l < m->layers; l++)
        add_layer_tensors(out, seen, m, keys, l);
    /* Multi-token prediction layers, when served: their own tensors around a layer's. */
    for (uint64_t j = 0; m->mtp && j < m->mtp_layers; j++) {
        add_scope_tensors(out, seen, keys, CKPTFS_SCOPE_MTP_IN, m->layers + j);
        add_layer_tensors(out, seen, m, keys, m->layers + j);
        add_scope_tensors(out, seen, keys, CKPTFS_SCOPE_MTP_OUT, m->layers + j);
    }
    for (uint64_t j = 0; j < m->list_modules; j++)
        add_scope_tensors(out, seen, keys, CKPTFS_SCOPE_LIST, j);
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (k->rule->scope == CKPTFS_SCOPE_LAST)
            add_hf_tensors(out, seen, k, 0, 0);
    }
    return out;
}

/* Rows [A, Z) of KEY's matrix as parts: its segments where they cover them, padding between. */
static void rows_as_parts(const CkptfsMcoreKey *key, uint64_t a, uint64_t z, uint64_t col0,
                          uint64_t cols, GArray *parts)
{
    uint64_t at = a;
    for (guint i = 0; i < key->segments->len && at < z; i++) {
        const CkptfsMcoreSegment *s = &g_array_index(key->segments, CkptfsMcoreSegment, i);
        uint64_t lo = MAX(at, s->row0), hi = MIN(z, s->row0 + s->rows);
        if (lo >= hi)
            continue;
        if (lo > at) {
            CkptfsSharePart pad = {NULL, 0, lo - at, col0, cols};
            g_array_append_val(parts, pad);
        }
        CkptfsSharePart p = {s->hf_name, s->hf_row0 + (lo - s->row0), hi - lo, col0, cols};
        g_array_append_val(parts, p);
        at = hi;
    }
    if (at < z) {
        CkptfsSharePart pad = {NULL, 0, z - at, col0, cols};
        g_array_append_val(parts, pad);
    }
}

GArray *ckptfs_mcore_share(const CkptfsMcoreKey *key, unsigned T, unsigned r, uint64_t *rows,
                           uint64_t *cols)
{
    GArray *parts = g_array_new(FALSE, FALSE, sizeof(CkptfsSharePart));
    uint64_t R = key->rows, C = key->cols, half = R / 2;
    *rows = R, *cols = C;
    switch (key->split) {
    case CKPTFS_TP_REPLICATED:
        rows_as_parts(key, 0, R, 0, C, parts);
        break;
    case CKPTFS_TP_ROWS:
    case CKPTFS_TP_VOCAB: /* the key's rows are the vocabulary as padded for T */
        rows_as_parts(key, r * R / T, (r + 1) * R / T, 0, C, parts);
        *rows = (r + 1) * R / T - r * R / T;
        break;
    case CKPTFS_TP_ROW_HALVES:
        rows_as_parts(key, r * half / T, (r + 1) * half / T, 0, C, parts);
        rows_as_parts(key, half + r * half / T, half + (r + 1) * half / T, 0, C, parts);
        *rows = 2 * ((r + 1) * half / T - r * half / T);
        break;
    case CKPTFS_TP_COLS:
        rows_as_parts(key, 0, R, r * C / T, (r + 1) * C / T - r * C / T, parts);
        *cols = (r + 1) * C / T - r * C / T;
        break;
    case CKPTFS_TP_SECTIONS: {
        uint64_t at = 0;
        *rows = 0;
        for (unsigned s = 0; s < key->n_sections; s++) {
            uint64_t n = key->sections[s];
            rows_as_parts(key, at + r * n / T, at + (r + 1) * n / T, 0, C, parts);
            *rows += (r + 1) * n / T - r * n / T;
            at += n;
        }
        break;
    }
    }
    return parts;
}

unsigned ckptfs_mcore_kernel_shape(const CkptfsMcoreKey *key, const CkptfsModel *m, uint64_t *shape)
{
    return ckptfs_model_kernel_shape(m, key->rule->cols, key->rows, shape);
}

unsigned ckptfs_mcore_key_shape(const CkptfsMcoreKey *key, uint64_t layers, uint64_t *shape)
{
    unsigned n = 0;
    if (key->stacked && layers > 0)
        shape[n++] = layers;
    if (key->listed)
        shape[n++] = key->list_count;
    if (key->expert)
        shape[n++] = key->experts;
    shape[n++] = key->rows;
    if (key->ndim == 3) /* [channels, 1, kernel] */
        shape[n++] = 1;
    if (key->ndim >= 2)
        shape[n++] = key->cols;
    return n;
}

char *ckptfs_mcore_key_name(const CkptfsMcoreKey *key, bool te_spec, bool per_layer, uint64_t layer)
{
    const char *name = te_spec ? key->key : key->local_key;
    if (!per_layer || !key->stacked)
        return g_strdup(name);
    return g_strdup_printf("%s%" G_GUINT64_FORMAT ".%s", key->layer_prefix, layer, name + strlen(key->layer_prefix));
}

char *ckptfs_mcore_mtp_key_name(const CkptfsMcoreKey *key, bool te_spec, uint64_t j)
{
    const char *name = te_spec ? key->key : key->local_key;
    if (key->stacked) /* "decoder.layers.X" -> "mtp.layers.J.transformer_layer.X" */
        return g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".transformer_layer.%s", j,
                               name + strlen("decoder.layers."));
    return g_strdup_printf("mtp.layers.%" G_GUINT64_FORMAT ".%s", j, name);
}

static gint cmp_u64(gconstpointer a, gconstpointer b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

GArray *ckptfs_mcore_tp_cuts(const CkptfsMcoreKey *key, const unsigned *tps, unsigned n,
                             uint64_t vocab, uint64_t divisible_by)
{
    GArray *cuts = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    uint64_t extent = key->split == CKPTFS_TP_COLS ? key->cols : key->rows;
    uint64_t zero = 0;
    g_array_append_val(cuts, zero);
    g_array_append_val(cuts, extent);
    for (unsigned i = 0; i < n && key->split != CKPTFS_TP_REPLICATED; i++) {
        uint64_t T = tps[i];
        for (uint64_t r = 1; r < T; r++) {
            uint64_t at[2];
            unsigned nat = 1;
            switch (key->split) {
            case CKPTFS_TP_ROW_HALVES:
                at[0] = r * (extent / 2) / T;
                at[1] = extent / 2 + at[0];
                nat = 2;
                break;
            case CKPTFS_TP_VOCAB:
                at[0] = r * (ckptfs_padded_vocab(vocab, (unsigned)divisible_by, (unsigned)T) / T);
                break;
            case CKPTFS_TP_SECTIONS: /* each section's own cuts, added below */
                nat = 0;
                break;
            default:
                at[0] = r * extent / T;
            }
            for (unsigned j = 0; j < nat; j++)
                if (at[j] < extent)
                    g_array_append_val(cuts, at[j]);
        }
    }
    if (key->split == CKPTFS_TP_ROW_HALVES) {
        uint64_t half = extent / 2;
        g_array_append_val(cuts, half);
    }
    for (uint64_t s = 0, at = 0; key->split == CKPTFS_TP_SECTIONS && s < key->n_sections; at += key->sections[s++]) {
        g_array_append_val(cuts, at);
        for (unsigned i = 0; i < n; i++)
            for (uint64_t r = 1; r < tps[i]; r++) {
                uint64_t cut = at + r * key->sections[s] / tps[i];
                g_array_append_val(cuts, cut);
            }
    }
    g_array_sort(cuts, cmp_u64);
    guint out = 0;
    for (guint i = 0; i < cuts->len; i++)
        if (out == 0 || g_array_index(cuts, uint64_t, i) != g_array_index(cuts, uint64_t, out - 1))
            g_array_index(cuts, uint64_t, out++) = g_array_index(cuts, uint64_t, i);
    g_array_set_size(cuts, out);
    return cuts;
}

bool ckptfs_mcore_keys_check_shifted(const GPtrArray *keys, const CkptfsModel *m, const CkptfsCatalog *catalog,
                                     GError **error)
{
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *key = g_ptr_array_index(keys, i);
        for (uint64_t l = 0; key->rule->recipe == CKPTFS_RECIPE_LESS_ONE && l < m->layers; l++) {
            if (!ckptfs_rule_in_layer(key->rule, m, l))
                continue;
            g_autofree char *name = ckptfs_mcore_hf_name(key, l, 0, key->rule->hf[0]);
            const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
            if (t != NULL && !ckptfs_tensor_can_shift(t))
                return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "tensor '%s' is served as %s: Megatron's "
                                   "zero-centred form of it (weight - 1) is served for bf16 or fp32 weights only",
                                   name, ckptfs_dtype_safetensors_name(t->dtype));
        }
        if (ckptfs_mcore_key_transposed(key) && !key->stacked) {
            const CkptfsTensor *t = ckptfs_catalog_find(catalog, key->rule->hf[0]);
            if (t != NULL && !ckptfs_tensor_can_transpose(t))
                return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "tensor '%s' is stored in scaled blocks: "
                                   "Megatron's transposed form of it is served for weights stored element by "
                                   "element only", key->rule->hf[0]);
        }
    }
    return true;
}
