#include "ckptfs/mcore.h"

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
    g_free(k);
}

static CkptfsMcoreKey *add_key(GPtrArray *keys, const char *name, bool stacked, unsigned ndim,
                               uint64_t rows, uint64_t cols, CkptfsTpSplit split)
{
    CkptfsMcoreKey *k = g_new0(CkptfsMcoreKey, 1);
    *k = (CkptfsMcoreKey){name, stacked, ndim, rows, ndim == 1 ? 1 : cols, split,
                          g_array_new(FALSE, FALSE, sizeof(CkptfsMcoreSegment))};
    g_array_set_clear_func(k->segments, segment_clear);
    g_ptr_array_add(keys, k);
    return k;
}

/* A tensor that is one HF tensor as is. */
static void add_whole(GPtrArray *keys, const char *name, bool stacked, unsigned ndim, uint64_t rows,
                      uint64_t cols, CkptfsTpSplit split, const char *hf_name)
{
    segment(add_key(keys, name, stacked, ndim, rows, cols, split), hf_name, 0, 0, rows);
}

/* Fused QKV: for each query group, the q rows of its heads, then its k and v rows. */
static void add_qkv(GPtrArray *keys, const CkptfsModel *m, const char *name, unsigned ndim,
                    const char *q, const char *k, const char *v)
{
    uint64_t d = m->head_dim, hpg = m->heads / m->kv_heads, block = (hpg + 2) * d;
    CkptfsMcoreKey *key = add_key(keys, name, true, ndim, block * m->kv_heads, m->hidden,
                                  CKPTFS_TP_ROWS);
    for (uint64_t g = 0; g < m->kv_heads; g++) {
        segment(key, q, g * hpg * d, g * block, hpg * d);
        segment(key, k, g * d, g * block + hpg * d, d);
        segment(key, v, g * d, g * block + (hpg + 1) * d, d);
    }
}

GPtrArray *ckptfs_mcore_keys(const CkptfsModel *m, uint64_t padded_vocab)
{
    GPtrArray *keys = g_ptr_array_new_with_free_func(key_free);
    uint64_t H = m->hidden, q = m->heads * m->head_dim, F = m->ffn;
    CkptfsMcoreKey *emb = add_key(keys, "embedding.word_embeddings.weight", false, 2, padded_vocab,
                                  H, CKPTFS_TP_VOCAB);
    segment(emb, "model.embed_tokens.weight", 0, 0, m->vocab);
    add_whole(keys, "decoder.layers.self_attention.linear_qkv.layer_norm_weight", true, 1, H, 1,
              CKPTFS_TP_REPLICATED, "input_layernorm.weight");
    add_qkv(keys, m, "decoder.layers.self_attention.linear_qkv.weight", 2,
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight");
    if (m->qkv_bias)
        add_qkv(keys, m, "decoder.layers.self_attention.linear_qkv.bias", 1,
                "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias");
    if (m->qk_norm) {
        add_whole(keys, "decoder.layers.self_attention.q_layernorm.weight", true, 1, m->head_dim,
                  1, CKPTFS_TP_REPLICATED, "self_attn.q_norm.weight");
        add_whole(keys, "decoder.layers.self_attention.k_layernorm.weight", true, 1, m->head_dim,
                  1, CKPTFS_TP_REPLICATED, "self_attn.k_norm.weight");
    }
    add_whole(keys, "decoder.layers.self_attention.linear_proj.weight", true, 2, H, q,
              CKPTFS_TP_COLS, "self_attn.o_proj.weight");
    add_whole(keys, "decoder.layers.mlp.linear_fc1.layer_norm_weight", true, 1, H, 1,
              CKPTFS_TP_REPLICATED, "post_attention_layernorm.weight");
    CkptfsMcoreKey *fc1 = add_key(keys, "decoder.layers.mlp.linear_fc1.weight", true, 2, 2 * F, H,
                                  CKPTFS_TP_ROW_HALVES);
    segment(fc1, "mlp.gate_proj.weight", 0, 0, F);
    segment(fc1, "mlp.up_proj.weight", 0, F, F);
    add_whole(keys, "decoder.layers.mlp.linear_fc2.weight", true, 2, H, F, CKPTFS_TP_COLS,
              "mlp.down_proj.weight");
    add_whole(keys, "decoder.final_layernorm.weight", false, 1, H, 1, CKPTFS_TP_REPLICATED,
              "model.norm.weight");
    /* Tied embeddings: Megatron stores no output layer, whatever the pipeline. */
    if (!m->tied_embeddings) {
        CkptfsMcoreKey *out = add_key(keys, "output_layer.weight", false, 2, padded_vocab, H,
                                      CKPTFS_TP_VOCAB);
        segment(out, "lm_head.weight", 0, 0, m->vocab);
    }
    return keys;
}

const char *const *ckptfs_mcore_extra_state_modules(const CkptfsModel *model)
{
    /* Local spec: the four linear layers. TE spec adds its attention and, with q/k norms,
     * those; a loader ignores entries it does not ask for. */
    static const char *const plain[] = {
        "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
        "mlp.linear_fc2", "self_attention.core_attention", NULL};
    static const char *const with_qk_norm[] = {
        "self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1",
        "mlp.linear_fc2", "self_attention.core_attention", "self_attention.q_layernorm",
        "self_attention.k_layernorm", NULL};
    return model->qk_norm ? with_qk_norm : plain;
}

unsigned ckptfs_mcore_key_shape(const CkptfsMcoreKey *key, uint64_t layers, uint64_t *shape)
{
    unsigned n = 0;
    if (key->stacked)
        shape[n++] = layers;
    shape[n++] = key->rows;
    if (key->ndim == 2)
        shape[n++] = key->cols;
    return n;
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
    g_array_sort(cuts, cmp_u64);
    guint out = 0;
    for (guint i = 0; i < cuts->len; i++)
        if (out == 0 || g_array_index(cuts, uint64_t, i) != g_array_index(cuts, uint64_t, out - 1))
            g_array_index(cuts, uint64_t, out++) = g_array_index(cuts, uint64_t, i);
    g_array_set_size(cuts, out);
    return cuts;
}
