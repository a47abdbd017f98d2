/* torchtitan's parameter names, from its state-dict adapters (torchtitan/models/<model>/
 * state_dict_adapter.py): the names of its releases (0.1, 0.2: layers.N.attention.wq.weight,
 * moe.experts.w1) and of later sources (attention.qkv_linear.wq.weight,
 * moe.routed_experts.inner_experts.w1_EFD) both, each row the adapter's to_hf. */
#include "titan.h"

#include <string.h>

#include "ckptfs/error.h"

#define ROPE(t, h, which) {t, h, CKPTFS_TITAN_ROPE_##which, NULL}
#define SAME(t, h) {t, h, CKPTFS_TITAN_AS_IS, NULL}
#define EXPERTS(t, h) {t, h, CKPTFS_TITAN_PER_EXPERT, NULL}

/* Every model's embedding, final norm and output layer (older releases "output", later
 * "lm_head"), its layers' norms and dense MLP. */
#define COMMON_ROWS                                                                               \
    SAME("tok_embeddings.weight", "model.embed_tokens.weight"),                                    \
    SAME("norm.weight", "model.norm.weight"),                                                      \
    SAME("output.weight", "lm_head.weight"),                                                       \
    SAME("lm_head.weight", "lm_head.weight"),                                                      \
    SAME("layers.{}.attention_norm.weight", "model.layers.{}.input_layernorm.weight"),            \
    SAME("layers.{}.ffn_norm.weight", "model.layers.{}.post_attention_layernorm.weight"),         \
    SAME("layers.{}.feed_forward.w1.weight", "model.layers.{}.mlp.gate_proj.weight"),             \
    SAME("layers.{}.feed_forward.w3.weight", "model.layers.{}.mlp.up_proj.weight"),               \
    SAME("layers.{}.feed_forward.w2.weight", "model.layers.{}.mlp.down_proj.weight"),             \
    SAME("layers.{}.attention.wo.weight", "model.layers.{}.self_attn.o_proj.weight")

/* Grouped experts [E, F, H] (w1, w3) and [E, H, F] (w2): expert e is slice e, as the adapters'
 * _split_experts_weights cut them. */
#define EXPERT_ROWS                                                                                       \
    EXPERTS("layers.{}.moe.experts.w1", "model.layers.{}.mlp.experts.{}.gate_proj.weight"),               \
    EXPERTS("layers.{}.moe.experts.w3", "model.layers.{}.mlp.experts.{}.up_proj.weight"),                 \
    EXPERTS("layers.{}.moe.experts.w2", "model.layers.{}.mlp.experts.{}.down_proj.weight"),               \
    EXPERTS("layers.{}.moe.routed_experts.inner_experts.w1_EFD", "model.layers.{}.mlp.experts.{}.gate_proj.weight"), \
    EXPERTS("layers.{}.moe.routed_experts.inner_experts.w3_EFD", "model.layers.{}.mlp.experts.{}.up_proj.weight"),   \
    EXPERTS("layers.{}.moe.routed_experts.inner_experts.w2_EDF", "model.layers.{}.mlp.experts.{}.down_proj.weight"), \
    SAME("layers.{}.moe.router.gate.weight", "model.layers.{}.mlp.gate.weight")

/* Llama 3: torchtitan rotates interleaved pairs, Hugging Face halves; the adapter permutes the
 * rows of wq and wk per head. Its 0.1 release saved the rotary table (a persistent buffer,
 * complex64), which Hugging Face computes from the config as torchtitan does. */
static const CkptfsTitanName llama3_names[] = {
    COMMON_ROWS,
    {"freqs_cis", NULL, CKPTFS_TITAN_DERIVED, NULL},
    ROPE("layers.{}.attention.wq.weight", "model.layers.{}.self_attn.q_proj.weight", Q),
    ROPE("layers.{}.attention.wk.weight", "model.layers.{}.self_attn.k_proj.weight", K),
    SAME("layers.{}.attention.wv.weight", "model.layers.{}.self_attn.v_proj.weight"),
    ROPE("layers.{}.attention.qkv_linear.wq.weight", "model.layers.{}.self_attn.q_proj.weight", Q),
    ROPE("layers.{}.attention.qkv_linear.wk.weight", "model.layers.{}.self_attn.k_proj.weight", K),
    SAME("layers.{}.attention.qkv_linear.wv.weight", "model.layers.{}.self_attn.v_proj.weight"),
    {NULL, NULL, 0, NULL},
};

/* Qwen3 and Qwen3-MoE: rotary as Hugging Face's (no permutation); q and k norms. */
static const CkptfsTitanName qwen3_names[] = {
    COMMON_ROWS,
    EXPERT_ROWS,
    SAME("layers.{}.attention.wq.weight", "model.layers.{}.self_attn.q_proj.weight"),
    SAME("layers.{}.attention.wk.weight", "model.layers.{}.self_attn.k_proj.weight"),
    SAME("layers.{}.attention.wv.weight", "model.layers.{}.self_attn.v_proj.weight"),
    SAME("layers.{}.attention.qkv_linear.wq.weight", "model.layers.{}.self_attn.q_proj.weight"),
    SAME("layers.{}.attention.qkv_linear.wk.weight", "model.layers.{}.self_attn.k_proj.weight"),
    SAME("layers.{}.attention.qkv_linear.wv.weight", "model.layers.{}.self_attn.v_proj.weight"),
    SAME("layers.{}.attention.q_norm.weight", "model.layers.{}.self_attn.q_norm.weight"),
    SAME("layers.{}.attention.k_norm.weight", "model.layers.{}.self_attn.k_norm.weight"),
    /* torchtitan routes with it (load balancing); Qwen3-MoE's router has none, and the adapter
     * drops it: served without, the model would pick other experts. */
    {"layers.{}.moe.expert_bias", NULL, CKPTFS_TITAN_REFUSED,
     "torchtitan's load-balancing expert bias changes which experts each token is routed to, and "
     "Hugging Face's Qwen3-MoE router has no bias to take it"},
    {"layers.{}.moe.expert_bias_E", NULL, CKPTFS_TITAN_REFUSED,
     "torchtitan's load-balancing expert bias changes which experts each token is routed to, and "
     "Hugging Face's Qwen3-MoE router has no bias to take it"},
    {NULL, NULL, 0, NULL},
};

/* DeepSeek-V3: multi-head latent attention (with or without q_lora), shared experts, the
 * router's score-correction bias. */
static const CkptfsTitanName deepseek_v3_names[] = {
    COMMON_ROWS,
    EXPERT_ROWS,
    SAME("layers.{}.attention.wq.weight", "model.layers.{}.self_attn.q_proj.weight"),
    SAME("layers.{}.attention.wq_a.weight", "model.layers.{}.self_attn.q_a_proj.weight"),
    SAME("layers.{}.attention.q_norm.weight", "model.layers.{}.self_attn.q_a_layernorm.weight"),
    SAME("layers.{}.attention.wq_b.weight", "model.layers.{}.self_attn.q_b_proj.weight"),
    SAME("layers.{}.attention.wkv_a.weight", "model.layers.{}.self_attn.kv_a_proj_with_mqa.weight"),
    SAME("layers.{}.attention.kv_norm.weight", "model.layers.{}.self_attn.kv_a_layernorm.weight"),
    SAME("layers.{}.attention.wkv_b.weight", "model.layers.{}.self_attn.kv_b_proj.weight"),
    SAME("layers.{}.moe.shared_experts.w1.weight", "model.layers.{}.mlp.shared_experts.gate_proj.weight"),
    SAME("layers.{}.moe.shared_experts.w3.weight", "model.layers.{}.mlp.shared_experts.up_proj.weight"),
    SAME("layers.{}.moe.shared_experts.w2.weight", "model.layers.{}.mlp.shared_experts.down_proj.weight"),
    SAME("layers.{}.moe.expert_bias", "model.layers.{}.mlp.gate.e_score_correction_bias"),
    SAME("layers.{}.moe.expert_bias_E", "model.layers.{}.mlp.gate.e_score_correction_bias"),
    {NULL, NULL, 0, NULL},
};

static const char *const llama_types[] = {"llama", NULL};
static const char *const qwen3_types[] = {"qwen3", "qwen3_moe", NULL};
static const char *const deepseek_v3_types[] = {"deepseek_v3", NULL};

static const CkptfsTitanModel models[] = {
    {"Llama 3", llama_types, llama3_names},
    {"Qwen3", qwen3_types, qwen3_names},
    {"DeepSeek-V3", deepseek_v3_types, deepseek_v3_names},
};

#define LAYER_MARK "{}"

const CkptfsTitanModel *ckptfs_titan_model_for(const char *model_type)
{
    for (size_t m = 0; model_type && m < G_N_ELEMENTS(models); m++)
        for (const char *const *t = models[m].model_types; *t; t++)
            if (strcmp(*t, model_type) == 0)
                return &models[m];
    return NULL;
}

char *ckptfs_titan_model_types(void)
{
    GString *s = g_string_new(NULL);
    for (size_t m = 0; m < G_N_ELEMENTS(models); m++)
        for (const char *const *t = models[m].model_types; *t; t++)
            g_string_append_printf(s, "%s%s", s->len ? ", " : "", *t);
    return g_string_free(s, FALSE);
}

/* Whether NAME is PATTERN with a layer number for its mark; *LAYER the number. */
static bool matches(const char *pattern, const char *name, char **layer)
{
    const char *mark = strstr(pattern, LAYER_MARK);
    if (mark == NULL)
        return strcmp(pattern, name) == 0;
    size_t head = (size_t)(mark - pattern);
    if (strncmp(pattern, name, head) != 0)
        return false;
    const char *digits = name + head, *end = digits;
    while (g_ascii_isdigit(*end))
        end++;
    if (end == digits || end - digits > 9 || strcmp(end, mark + strlen(LAYER_MARK)) != 0)
        return false;
    *layer = g_strndup(digits, (gsize)(end - digits));
    return true;
}

const CkptfsTitanName *ckptfs_titan_lookup(const CkptfsTitanModel *model, const char *name, char **layer)
{
    *layer = NULL;
    for (const CkptfsTitanName *row = model->names; row->titan; row++)
        if (matches(row->titan, name, layer))
            return row;
    return NULL;
}

/* PATTERN with its first mark LAYER, its second EXPERT. */
static char *fill(const char *pattern, const char *layer, uint64_t expert)
{
    g_auto(GStrv) parts = g_strsplit(pattern, LAYER_MARK, 3);
    GString *s = g_string_new(parts[0]);
    if (parts[1]) {
        g_string_append_printf(s, "%s%s", layer ? layer : "", parts[1]);
        if (parts[2])
            g_string_append_printf(s, "%" G_GUINT64_FORMAT "%s", expert, parts[2]);
    }
    return g_string_free(s, FALSE);
}

/* Hugging Face's row h * D + i * D/2 + j (head h of D rows, half i) is torchtitan's row
 * h * D + 2j + i: each half of a head is every other row of it, from row i. */
static bool add_rope(CkptfsCatalog *catalog, const char *name, uint64_t heads, CkptfsDtype dtype, const uint64_t *shape,
                     const CkptfsPiece *pieces, unsigned npieces, GError **error)
{
    if (heads == 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "'%s': config.json gives no head count to undo torchtitan's "
                           "rotary permutation with (num_attention_heads, num_key_value_heads)", name);
    if (shape[0] % (2 * heads) != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "'%s': %" G_GUINT64_FORMAT " rows are not %" G_GUINT64_FORMAT
                           " heads of an even size", name, shape[0], heads);
    uint64_t head_rows = shape[0] / heads, half = head_rows / 2;
    g_autoptr(GArray) out = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
    for (uint64_t h = 0; h < heads; h++)
        for (uint64_t i = 0; i < 2; i++) {
            uint64_t first = h * head_rows + i; /* torchtitan's row of j = 0 */
            uint64_t hf_first = h * head_rows + i * half;
            for (unsigned k = 0; k < npieces; k++) {
                const CkptfsPiece *p = &pieces[k];
                uint64_t j0 = p->row0 > first ? (p->row0 - first + 1) / 2 : 0;
                uint64_t j1 = p->row1 > first ? MIN(half, (p->row1 - first + 1) / 2) : 0;
                if (j0 >= j1)
                    continue;
                CkptfsPiece q = *p;
                q.row0 = hf_first + j0;
                q.row1 = hf_first + j1;
                q.offset = p->offset + (first + 2 * j0 - p->row0) * p->row_stride;
                q.row_stride = 2 * p->row_stride;
                g_array_append_val(out, q);
            }
        }
    return ckptfs_catalog_add_pieces(catalog, name, dtype, 2, shape, (const CkptfsPiece *)(void *)out->data, out->len,
                                     error) != NULL;
}

/* Expert e of [E, A, B] is the E-row view's row e: an [A, B] tensor of its own. */
static bool add_experts(CkptfsCatalog *catalog, const CkptfsTitanName *row, const char *layer, CkptfsDtype dtype,
                        unsigned n, const uint64_t *shape, const CkptfsPiece *pieces, unsigned npieces, GError **error)
{
    g_autofree char *what = fill(row->titan, layer, 0);
    if (n != 3)
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "'%s': grouped experts have 3 dims [E, A, B], not %u", what, n);
    uint64_t expert_shape[2] = {shape[1], shape[2]};
    for (uint64_t e = 0; e < shape[0]; e++) {
        const CkptfsPiece *p = NULL;
        for (unsigned k = 0; k < npieces && p == NULL; k++)
            if (pieces[k].row0 <= e && e < pieces[k].row1)
                p = &pieces[k];
        if (p == NULL || p->col0 != 0 || p->col1 != shape[1] * shape[2] || p->col_stride != 0)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "'%s': expert %" G_GUINT64_FORMAT " is not stored whole",
                               what, e);
        CkptfsPiece q = {.row0 = 0, .row1 = shape[1], .col0 = 0, .col1 = shape[2], .src = p->src,
                         .offset = p->offset + (e - p->row0) * p->row_stride,
                         .row_stride = shape[2] * ckptfs_dtype_size(dtype)};
        g_autofree char *name = fill(row->hf, layer, e);
        if (ckptfs_catalog_add_pieces(catalog, name, dtype, 2, expert_shape, &q, 1, error) == NULL)
            return false;
    }
    return true;
}

bool ckptfs_titan_add(CkptfsCatalog *catalog, const CkptfsTitanName *row, const char *layer,
                      const CkptfsTitanHeads *heads, CkptfsDtype dtype, unsigned n, const uint64_t *shape,
                      const CkptfsPiece *pieces, unsigned npieces, GError **error)
{
    g_autofree char *name = fill(row->hf ? row->hf : row->titan, layer, 0);
    switch (row->layout) {
    case CKPTFS_TITAN_REFUSED:
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "'%s': %s", name, row->why);
    case CKPTFS_TITAN_PER_EXPERT:
        return add_experts(catalog, row, layer, dtype, n, shape, pieces, npieces, error);
    case CKPTFS_TITAN_ROPE_Q:
    case CKPTFS_TITAN_ROPE_K:
        if (n != 2)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "'%s': %u dims, not 2", name, n);
        return add_rope(catalog, name, row->layout == CKPTFS_TITAN_ROPE_Q ? heads->query : heads->key_value, dtype,
                        shape, pieces, npieces, error);
    case CKPTFS_TITAN_DERIVED: /* never read: the caller leaves it out */
    case CKPTFS_TITAN_AS_IS:
        break;
    }
    return ckptfs_catalog_add_pieces(catalog, name, dtype, n, shape, pieces, npieces, error) != NULL;
}
