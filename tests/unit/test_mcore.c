/* Megatron-core's stacked key table (segments of HF tensors) and the TP cut points that decide
 * the chunks of mcore/. Expected values are written from Megatron's sharding rules, not from
 * the code. */
#include <string.h>

#include "ckptfs/mcore.h"
#include "tap.h"

static const CkptfsMcoreKey *find_key(GPtrArray *keys, const char *name)
{
    for (guint i = 0; i < keys->len; i++) {
        const CkptfsMcoreKey *k = g_ptr_array_index(keys, i);
        if (strcmp(k->key, name) == 0)
            return k;
    }
    return NULL;
}

static char *cuts_text(GArray *cuts)
{
    GString *s = g_string_new(NULL);
    for (guint i = 0; i < cuts->len; i++)
        g_string_append_printf(s, "%s%" G_GUINT64_FORMAT, i ? "," : "", g_array_index(cuts, uint64_t, i));
    return g_string_free(s, FALSE);
}

static void expect_cuts(const CkptfsMcoreKey *k, const unsigned *tps, unsigned n, uint64_t vocab,
                        const char *want, const char *what)
{
    g_autoptr(GArray) cuts = ckptfs_mcore_tp_cuts(k, tps, n, vocab, 128);
    g_autofree char *got = cuts_text(cuts);
    tap_ok(strcmp(got, want) == 0, "%s: cuts %s (want %s)", what, got, want);
}

/* Segments must tile the key's rows in order, except vocabulary padding at the end. */
static void check_segments(const CkptfsMcoreKey *k)
{
    uint64_t row = 0;
    bool ok = true;
    for (guint s = 0; s < k->segments->len; s++) {
        const CkptfsMcoreSegment *seg = &g_array_index(k->segments, CkptfsMcoreSegment, s);
        ok &= seg->row0 == row;
        row += seg->rows;
    }
    ok &= k->split == CKPTFS_TP_VOCAB ? row <= k->rows : row == k->rows;
    tap_ok(ok, "%s: segments tile its %" G_GUINT64_FORMAT " rows in order", k->key, k->rows);
}

int main(void)
{
    /* Llama-3-8B-like: 32 heads, 8 groups, head dim 128, hidden 4096, ffn 14336, vocab 128256. */
    CkptfsModel m = {.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128,
                     .ffn = 14336, .vocab = 128256};
    GPtrArray *keys = ckptfs_mcore_keys(&m, 129024);
    tap_is_u64(keys->len, 9, "untied, no bias, no q/k norm: 9 keys");
    for (guint i = 0; i < keys->len; i++)
        check_segments(g_ptr_array_index(keys, i));

    const CkptfsMcoreKey *qkv = find_key(keys, "decoder.layers.self_attention.linear_qkv.weight");
    tap_ok(qkv && qkv->stacked && qkv->rows == 6144 && qkv->cols == 4096 && qkv->segments->len == 24,
           "qkv: stacked [6144, 4096], 8 groups x (q, k, v)");
    const CkptfsMcoreSegment *k1 = &g_array_index(qkv->segments, CkptfsMcoreSegment, 4);
    tap_ok(strcmp(k1->hf_name, "self_attn.k_proj.weight") == 0 && k1->hf_row0 == 128 &&
               k1->row0 == 768 + 512 && k1->rows == 128,
           "qkv: group 1's k rows are k_proj rows [128, 256) at rows [1280, 1408)");
    uint64_t shape[3];
    tap_is_u64(ckptfs_mcore_key_shape(qkv, 32, shape), 3, "qkv: 3 dims");
    tap_ok(shape[0] == 32 && shape[1] == 6144 && shape[2] == 4096, "qkv: shape [32, 6144, 4096]");

    const unsigned all[] = {1, 2, 4, 8};
    expect_cuts(qkv, all, 4, m.vocab, "0,768,1536,2304,3072,3840,4608,5376,6144", "qkv tp 1/2/4/8");
    const unsigned two[] = {1, 2};
    expect_cuts(qkv, two, 2, m.vocab, "0,3072,6144", "qkv tp 1/2");
    const CkptfsMcoreKey *fc1 = find_key(keys, "decoder.layers.mlp.linear_fc1.weight");
    expect_cuts(fc1, two, 2, m.vocab, "0,7168,14336,21504,28672", "fc1 tp 1/2: gate and up halves cut alike");
    const CkptfsMcoreKey *fc2 = find_key(keys, "decoder.layers.mlp.linear_fc2.weight");
    tap_ok(fc2 && fc2->split == CKPTFS_TP_COLS && fc2->cols == 14336, "fc2: split by columns");
    expect_cuts(fc2, two, 2, m.vocab, "0,7168,14336", "fc2 tp 1/2: columns");
    const CkptfsMcoreKey *emb = find_key(keys, "embedding.word_embeddings.weight");
    /* tp 2 pads 128256 to 128256 (a multiple of 256): shares of 64128; tp 4 to 128512 (32128 each). */
    const unsigned twofour[] = {2, 4};
    expect_cuts(emb, twofour, 2, m.vocab, "0,32128,64128,64256,96384,129024", "embedding tp 2/4: each degree's padded shares");
    const CkptfsMcoreKey *norm = find_key(keys, "decoder.layers.self_attention.linear_qkv.layer_norm_weight");
    expect_cuts(norm, all, 4, m.vocab, "0,4096", "norms: replicated, one chunk");
    tap_ok(find_key(keys, "output_layer.weight") != NULL, "untied: output_layer present");
    g_ptr_array_unref(keys);

    /* Qwen2-like: bias, tied; Qwen3-like: q/k norms. */
    CkptfsModel q2 = m;
    q2.qkv_bias = true, q2.tied_embeddings = true;
    keys = ckptfs_mcore_keys(&q2, 129024);
    const CkptfsMcoreKey *bias = find_key(keys, "decoder.layers.self_attention.linear_qkv.bias");
    tap_ok(bias && bias->ndim == 1 && bias->rows == 6144 && bias->cols == 1 && bias->segments->len == 24,
           "qkv bias: [6144] per layer, interleaved like the weight");
    tap_ok(find_key(keys, "output_layer.weight") == NULL, "tied: no output_layer, whatever the pipeline");
    g_ptr_array_unref(keys);
    CkptfsModel q3 = m;
    q3.qk_norm = true;
    keys = ckptfs_mcore_keys(&q3, 129024);
    const CkptfsMcoreKey *qn = find_key(keys, "decoder.layers.self_attention.q_layernorm.weight");
    tap_ok(qn && qn->rows == 128 && qn->split == CKPTFS_TP_REPLICATED, "q_layernorm: [head_dim], replicated");
    const char *const *mods = ckptfs_mcore_extra_state_modules(&q3);
    unsigned n = 0;
    while (mods[n])
        n++;
    tap_is_u64(n, 7, "q/k norm models: extra states of 4 linears, core attention and the two norms");
    g_ptr_array_unref(keys);
    return tap_done();
}
