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

/* Parts of a share as "hf:row0+rows" (or "pad+rows") joined by spaces. */
static char *share_text(const CkptfsMcoreKey *key, unsigned T, unsigned r, uint64_t *rows, uint64_t *cols)
{
    g_autoptr(GArray) parts = ckptfs_mcore_share(key, T, r, rows, cols);
    GString *out = g_string_new(NULL);
    for (guint i = 0; i < parts->len; i++) {
        const CkptfsSharePart *p = &g_array_index(parts, CkptfsSharePart, i);
        if (p->hf)
            g_string_append_printf(out, "%s%s:%" G_GUINT64_FORMAT "+%" G_GUINT64_FORMAT, i ? " " : "",
                                   p->hf, p->hf_row0, p->rows);
        else
            g_string_append_printf(out, "%spad+%" G_GUINT64_FORMAT, i ? " " : "", p->rows);
        if (p->col0 || p->cols != key->cols)
            g_string_append_printf(out, "[%" G_GUINT64_FORMAT "+%" G_GUINT64_FORMAT "]", p->col0, p->cols);
    }
    return g_string_free(out, FALSE);
}

#define EXPECT_SHARE(key, T, r, want_rows, want_cols, want, what)                                \
    do {                                                                                        \
        uint64_t rows_, cols_;                                                                  \
        g_autofree char *got_ = share_text(key, T, r, &rows_, &cols_);                          \
        if (!tap_ok(strcmp(got_, want) == 0 && rows_ == (want_rows) && cols_ == (want_cols), "%s", what)) \
            tap_diag("  got %s (%" G_GUINT64_FORMAT " x %" G_GUINT64_FORMAT ")", got_, rows_, cols_); \
    } while (0)

/* What one legacy TP rank holds, against Megatron's rules worked out by hand on a small model:
 * 4 heads in 2 groups of head dim 2 (QKV blocks of (2 + 2) * 2 = 8 rows), hidden 8, ffn 6. */
static void test_shares(const CkptfsModel *big)
{
    CkptfsModel m = {.layers = 2, .hidden = 8, .heads = 4, .kv_heads = 2, .head_dim = 2, .ffn = 6,
                     .vocab = 10, .arch = big->arch};
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(&m, 16, false);
    const CkptfsMcoreKey *qkv = find_key(keys, "decoder.layers.self_attention.linear_qkv.weight");
    EXPECT_SHARE(qkv, 2, 1, 8, 8,
                 "self_attn.q_proj.weight:4+4 self_attn.k_proj.weight:2+2 self_attn.v_proj.weight:2+2",
                 "qkv tp2 rank 1: group 1's q, k, v rows");
    EXPECT_SHARE(qkv, 4, 1, 4, 8, "self_attn.k_proj.weight:0+2 self_attn.v_proj.weight:0+2",
                 "qkv tp4 rank 1 (more ranks than groups): group 0's k and v");
    const CkptfsMcoreKey *fc1 = find_key(keys, "decoder.layers.mlp.linear_fc1.weight");
    EXPECT_SHARE(fc1, 2, 1, 6, 8, "mlp.gate_proj.weight:3+3 mlp.up_proj.weight:3+3",
                 "fc1 tp2 rank 1: the second half of gate, then of up");
    const CkptfsMcoreKey *fc2 = find_key(keys, "decoder.layers.mlp.linear_fc2.weight");
    EXPECT_SHARE(fc2, 2, 1, 8, 3, "mlp.down_proj.weight:0+8[3+3]", "fc2 tp2 rank 1: columns [3, 6)");
    const CkptfsMcoreKey *emb = find_key(keys, "embedding.word_embeddings.weight");
    EXPECT_SHARE(emb, 2, 1, 8, 8, "model.embed_tokens.weight:8+2 pad+6",
                 "embedding tp2 rank 1 of 16 padded rows: rows [8, 10), then 6 of padding");
    const CkptfsMcoreKey *norm = find_key(keys, "decoder.layers.mlp.linear_fc1.layer_norm_weight");
    EXPECT_SHARE(norm, 4, 3, 8, 1, "post_attention_layernorm.weight:0+8", "norms: whole on every rank");
}

static char *entry_names(const CkptfsModel *m, CkptfsScope scope, bool te, bool tied_copy)
{
    g_autoptr(GPtrArray) rules = ckptfs_legacy_entries(m, scope, 0, te, tied_copy);
    GString *out = g_string_new(NULL);
    for (guint i = 0; i < rules->len; i++)
        g_string_append_printf(out, "%s%s", i ? " " : "",
                               ckptfs_rule_legacy_name(g_ptr_array_index(rules, i), te));
    return g_string_free(out, FALSE);
}

/* The order Megatron-core's modules register a layer's state (TE and local GPT layer specs). */
static void test_legacy_order(const CkptfsModel *m)
{
    g_autofree char *te = entry_names(m, CKPTFS_SCOPE_LAYER, true, false);
    tap_ok(strcmp(te, "self_attention.core_attention._extra_state self_attention.linear_proj.weight "
                      "self_attention.linear_proj._extra_state self_attention.linear_qkv.layer_norm_weight "
                      "self_attention.linear_qkv.weight self_attention.linear_qkv._extra_state "
                      "self_attention.q_layernorm.weight self_attention.q_layernorm._extra_state "
                      "self_attention.k_layernorm.weight self_attention.k_layernorm._extra_state "
                      "mlp.linear_fc1.layer_norm_weight mlp.linear_fc1.weight mlp.linear_fc1._extra_state "
                      "mlp.linear_fc2.weight mlp.linear_fc2._extra_state") == 0,
           "TE layer entries in module order (%s)", te);
    g_autofree char *local = entry_names(m, CKPTFS_SCOPE_LAYER, false, false);
    tap_ok(strcmp(local, "input_layernorm.weight self_attention.linear_proj.weight "
                         "self_attention.linear_proj._extra_state self_attention.linear_qkv.weight "
                         "self_attention.linear_qkv._extra_state self_attention.q_layernorm.weight "
                         "self_attention.k_layernorm.weight pre_mlp_layernorm.weight mlp.linear_fc1.weight "
                         "mlp.linear_fc1._extra_state mlp.linear_fc2.weight mlp.linear_fc2._extra_state") == 0,
           "local layer entries in module order (%s)", local);
    CkptfsModel tied = *m;
    tied.tied_embeddings = true;
    g_autofree char *last_pp1 = entry_names(&tied, CKPTFS_SCOPE_LAST, true, false);
    g_autofree char *last_pp2 = entry_names(&tied, CKPTFS_SCOPE_LAST, false, true);
    tap_ok(strcmp(last_pp1, "decoder.final_layernorm.weight decoder.final_layernorm._extra_state "
                            "output_layer._extra_state") == 0 &&
               strcmp(last_pp2, "decoder.final_layernorm.weight output_layer.weight output_layer._extra_state") == 0,
           "tied: no output weight with pp 1, the embedding's copy with pp > 1 (%s | %s)", last_pp1, last_pp2);
}

/* Phi-3's fused projections fill the same keys: q/k/v and gate/up rows at their offsets. */
static void test_phi3(const CkptfsModel *llama)
{
    CkptfsModel m = {.layers = 2, .hidden = 8, .heads = 4, .kv_heads = 2, .head_dim = 2, .ffn = 6,
                     .vocab = 10, .arch = ckptfs_architecture_find("Phi3ForCausalLM", NULL)};
    tap_ok(m.arch && m.arch->family == &ckptfs_family_phi3, "Phi3ForCausalLM has the phi3 rules");
    if (m.arch == NULL)
        return;
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(&m, 16, false);
    const CkptfsMcoreKey *qkv = find_key(keys, "decoder.layers.self_attention.linear_qkv.weight");
    EXPECT_SHARE(qkv, 2, 1, 8, 8,
                 "self_attn.qkv_proj.weight:4+4 self_attn.qkv_proj.weight:10+2 self_attn.qkv_proj.weight:14+2",
                 "phi3 qkv tp2 rank 1: group 1's q rows, then k at 8 + 2, v at 12 + 2");
    const CkptfsMcoreKey *fc1 = find_key(keys, "decoder.layers.mlp.linear_fc1.weight");
    EXPECT_SHARE(fc1, 2, 0, 6, 8, "mlp.gate_up_proj.weight:0+3 mlp.gate_up_proj.weight:6+3",
                 "phi3 fc1 tp2 rank 0: gate rows [0, 3), up rows [6, 9) of gate_up_proj");
    g_autoptr(GArray) hf = ckptfs_model_hf_tensors(&m, keys);
    GString *names = g_string_new(NULL);
    for (guint i = 0; i < hf->len; i++) {
        const CkptfsHfShape *t = &g_array_index(hf, CkptfsHfShape, i);
        if (g_str_has_prefix(t->name, "model.layers.1."))
            continue;
        g_string_append_printf(names, "%s%s[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT "]", i ? " " : "",
                               t->name, t->d0, t->d1);
    }
    tap_ok(strcmp(names->str, "model.embed_tokens.weight[10,8] model.layers.0.input_layernorm.weight[8,0] "
                              "model.layers.0.self_attn.qkv_proj.weight[16,8] "
                              "model.layers.0.self_attn.o_proj.weight[8,8] "
                              "model.layers.0.post_attention_layernorm.weight[8,0] "
                              "model.layers.0.mlp.gate_up_proj.weight[12,8] model.layers.0.mlp.down_proj.weight[8,6] "
                              "model.norm.weight[8,0] lm_head.weight[10,8]") == 0,
           "phi3 tensors and shapes in checkpoint order (%s)", names->str);
    g_string_free(names, TRUE);
    (void)llama;
}

/* GLM-4.1V's language model (the glm4 rules): gate_up_proj fused into fc1, and the two norms
 * mbridge's Glm4TransformerLayer registers after the MLP (TENorms: weight, then _extra_state),
 * with the names of mbridge's glm4v bridge. */
static void test_glm4(void)
{
    CkptfsModel m = {.layers = 2, .hidden = 8, .heads = 4, .kv_heads = 2, .head_dim = 2, .ffn = 6,
                     .vocab = 10, .qkv_bias = true,
                     .arch = ckptfs_architecture_find("Glm4vForConditionalGeneration", NULL)};
    tap_ok(m.arch && m.arch->family == &ckptfs_family_glm4, "Glm4vForConditionalGeneration has the glm4 rules");
    if (m.arch == NULL)
        return;
    g_autofree char *te = entry_names(&m, CKPTFS_SCOPE_LAYER, true, false);
    tap_ok(strcmp(te, "self_attention.core_attention._extra_state self_attention.linear_proj.weight "
                      "self_attention.linear_proj._extra_state self_attention.linear_qkv.layer_norm_weight "
                      "self_attention.linear_qkv.weight self_attention.linear_qkv.bias "
                      "self_attention.linear_qkv._extra_state mlp.linear_fc1.layer_norm_weight "
                      "mlp.linear_fc1.weight mlp.linear_fc1._extra_state mlp.linear_fc2.weight "
                      "mlp.linear_fc2._extra_state post_self_attn_layernorm.weight "
                      "post_self_attn_layernorm._extra_state post_mlp_layernorm.weight "
                      "post_mlp_layernorm._extra_state") == 0,
           "glm4 TE layer: the post norms after the MLP, each with its _extra_state (%s)", te);
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(&m, 16, false);
    const CkptfsMcoreKey *fc1 = find_key(keys, "decoder.layers.mlp.linear_fc1.weight");
    EXPECT_SHARE(fc1, 2, 1, 6, 8, "mlp.gate_up_proj.weight:3+3 mlp.gate_up_proj.weight:9+3",
                 "glm4 fc1 tp2 rank 1: gate rows [3, 6), up rows [9, 12) of gate_up_proj");
    const CkptfsMcoreKey *post = find_key(keys, "decoder.layers.post_self_attn_layernorm.weight");
    if (tap_ok(post != NULL, "glm4: a post-attention norm key"))
        EXPECT_SHARE(post, 2, 1, 8, 1, "post_self_attn_layernorm.weight:0+8", "glm4 post-attention norm: whole");
    const CkptfsMcoreKey *post_mlp = find_key(keys, "decoder.layers.post_mlp_layernorm.weight");
    tap_ok(post_mlp && post_mlp->stacked && post_mlp->rows == 8, "glm4 post-MLP norm: stacked [layers, 8]");
    g_autoptr(GArray) hf = ckptfs_model_hf_tensors(&m, keys);
    GString *names = g_string_new(NULL);
    for (guint i = 0; i < hf->len; i++) {
        const CkptfsHfShape *t = &g_array_index(hf, CkptfsHfShape, i);
        if (g_str_has_prefix(t->name, "model.layers.0.") && strstr(t->name, "layernorm"))
            g_string_append_printf(names, "%s%s", names->len ? " " : "", t->name + strlen("model.layers.0."));
    }
    tap_ok(strcmp(names->str, "input_layernorm.weight post_attention_layernorm.weight "
                              "post_self_attn_layernorm.weight post_mlp_layernorm.weight") == 0,
           "glm4 HF norms of a layer (%s)", names->str);
    g_string_free(names, TRUE);
}

/* Mixture of experts: the expert keys, their HF tensors and legacy names; dense layers among
 * MoE layers. */
static void test_moe(void)
{
    CkptfsModel m = {.layers = 3, .hidden = 8, .heads = 4, .kv_heads = 2, .head_dim = 2, .ffn = 12,
                     .vocab = 10, .experts = 4, .topk = 2, .moe_ffn = 6, .shared_ffn = 4, .shared_gate = true, .qkv_bias = true,
                     .arch = ckptfs_architecture_find("qwen2_moe", NULL)};
    ckptfs_model_set_dense_layer(&m, 1);
    tap_ok(m.arch && m.arch->family == &ckptfs_family_qwen_moe && ckptfs_model_layer_is_moe(&m, 0) &&
               !ckptfs_model_layer_is_moe(&m, 1) && !ckptfs_model_layers_homogeneous(&m),
           "qwen2_moe: layer 1 dense, layers 0 and 2 MoE");
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(&m, 16, false);
    const CkptfsMcoreKey *fc1 = find_key(keys, "decoder.layers.mlp.experts.experts.linear_fc1.weight");
    uint64_t shape[4];
    unsigned n = fc1 ? ckptfs_mcore_key_shape(fc1, 3, shape) : 0;
    tap_ok(n == 4 && shape[0] == 3 && shape[1] == 4 && shape[2] == 12 && shape[3] == 8,
           "expert fc1: [L, E, 2F, H] = [3, 4, 12, 8]");
    n = fc1 ? ckptfs_mcore_key_shape(fc1, 0, shape) : 0;
    tap_ok(n == 3 && shape[0] == 4, "one layer's expert fc1: [E, 2F, H]");
    if (fc1) {
        EXPECT_SHARE(fc1, 2, 1, 6, 8, "mlp.experts.{e}.gate_proj.weight:3+3 mlp.experts.{e}.up_proj.weight:3+3",
                     "expert fc1 etp2 rank 1: gate rows [3, 6), up rows [3, 6)");
        g_autofree char *hf = ckptfs_mcore_hf_name(fc1, 2, 3, "mlp.experts.{e}.up_proj.weight");
        tap_ok(strcmp(hf, "model.layers.2.mlp.experts.3.up_proj.weight") == 0, "expert HF name (%s)", hf);
        g_autofree char *seq = ckptfs_expert_legacy_name(fc1->rule, false, 1);
        g_autofree char *grouped = ckptfs_expert_legacy_name(fc1->rule, true, 1);
        tap_ok(strcmp(seq, "mlp.experts.local_experts.1.linear_fc1.weight") == 0 &&
                   strcmp(grouped, "mlp.experts.linear_fc1.weight1") == 0,
               "legacy expert names (%s, %s)", seq, grouped);
        g_autofree char *te = ckptfs_mcore_key_name(fc1, true, true, 2);
        tap_ok(strcmp(te, "decoder.layers.2.mlp.experts.experts.linear_fc1.weight") == 0,
               "per-layer torch_dist name (%s)", te);
    }
    const CkptfsMcoreKey *norm = find_key(keys, "decoder.layers.pre_mlp_layernorm.weight");
    tap_ok(norm && strcmp(norm->local_key, "decoder.layers.mlp.linear_fc1.layer_norm_weight") == 0,
           "MoE pre-MLP norm: TE name, local spec saves TE's fused name");
    const CkptfsMcoreKey *gate = find_key(keys, "decoder.layers.mlp.shared_experts.gate_weight");
    tap_ok(gate && gate->rows == 1 && gate->cols == 8, "shared expert gate [1, H]");
    g_autoptr(GPtrArray) moe_layer = ckptfs_legacy_entries(&m, CKPTFS_SCOPE_LAYER, 0, false, false);
    g_autoptr(GPtrArray) dense_layer = ckptfs_legacy_entries(&m, CKPTFS_SCOPE_LAYER, 1, false, false);
    GString *names = g_string_new(NULL);
    for (guint i = 0; i < moe_layer->len; i++)
        g_string_append_printf(names, "%s%s", i ? " " : "",
                               ckptfs_rule_legacy_name(g_ptr_array_index(moe_layer, i), false));
    tap_ok(strcmp(names->str, "input_layernorm.weight self_attention.linear_proj.weight "
                              "self_attention.linear_proj._extra_state self_attention.linear_qkv.weight "
                              "self_attention.linear_qkv.bias self_attention.linear_qkv._extra_state "
                              "pre_mlp_layernorm.weight mlp.router.weight "
                              "mlp.experts.experts.linear_fc1.weight mlp.experts.experts.linear_fc1._extra_state "
                              "mlp.experts.experts.linear_fc2.weight mlp.experts.experts.linear_fc2._extra_state "
                              "mlp.shared_experts.gate_weight mlp.shared_experts.linear_fc1.weight "
                              "mlp.shared_experts.linear_fc1._extra_state mlp.shared_experts.linear_fc2.weight "
                              "mlp.shared_experts.linear_fc2._extra_state") == 0,
           "local MoE layer entries in module order (%s)", names->str);
    g_string_free(names, TRUE);
    tap_is_u64(dense_layer->len, 11, "dense layer: 11 local entries, as in a dense model with q/k/v biases");
    g_autoptr(GArray) hf = ckptfs_model_hf_tensors(&m, keys);
    /* embedding + 2 MoE layers x (4 attn + 3 bias + 2 norms + router + 4 x 3 experts + 3 shared + gate)
     * + dense layer (4 + 3 + 2 + 3) + norm + lm_head */
    tap_is_u64(hf->len, 1 + 2 * 26 + 12 + 2, "every HF tensor once, experts expanded");
    const CkptfsHfShape *e1 = hf->len > 20 ? &g_array_index(hf, CkptfsHfShape, 11) : NULL;
    tap_ok(e1 && strcmp(e1->name, "model.layers.0.mlp.experts.0.gate_proj.weight") == 0 && e1->d0 == 6 && e1->d1 == 8,
           "experts in checkpoint order, expert by expert (%s)", e1 ? e1->name : "none");
}

/* Qwen3.5's MTP block with -o mtp=on: its layer (after the decoder's) a full-attention one with
 * the dense MLP under "mtp.layers.0.", its norms and projection once for the block under "mtp."
 * (Megatron-Bridge's qwen35 names); eh_proj read as it is, rows split over TP. */
static void test_hybrid_mtp(void)
{
    CkptfsModel m = {.layers = 2, .hidden = 8, .heads = 4, .kv_heads = 2, .head_dim = 2, .ffn = 6,
                     .vocab = 10, .qk_norm = true, .linear_attention = true, .linear_key_heads = 2,
                     .linear_value_heads = 2, .linear_key_dim = 2, .linear_value_dim = 2, .conv_kernel = 4,
                     .mtp_layers = 1, .mtp = true, .arch = ckptfs_architecture_find("Qwen3_5ForCausalLM", NULL)};
    tap_ok(m.arch && m.arch->family == &ckptfs_family_qwen3_5, "Qwen3_5ForCausalLM has the qwen3_5 rules");
    if (m.arch == NULL)
        return;
    ckptfs_model_set_linear_layer(&m, 0);
    g_autoptr(GPtrArray) keys = ckptfs_mcore_keys(&m, 16, false);
    g_autoptr(GArray) hf = ckptfs_model_hf_tensors(&m, keys);
    GString *names = g_string_new(NULL);
    for (guint i = 0; i < hf->len; i++) {
        const CkptfsHfShape *t = &g_array_index(hf, CkptfsHfShape, i);
        if (g_str_has_prefix(t->name, "mtp."))
            g_string_append_printf(names, "%s%s[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT "]", names->len ? " " : "",
                                   t->name, t->d0, t->d1);
    }
    tap_ok(strcmp(names->str, "mtp.pre_fc_norm_embedding.weight[8,0] mtp.pre_fc_norm_hidden.weight[8,0] "
                              "mtp.fc.weight[8,16] mtp.layers.0.self_attn.o_proj.weight[8,8] "
                              "mtp.layers.0.input_layernorm.weight[8,0] mtp.layers.0.self_attn.q_proj.weight[16,8] "
                              "mtp.layers.0.self_attn.k_proj.weight[4,8] mtp.layers.0.self_attn.v_proj.weight[4,8] "
                              "mtp.layers.0.self_attn.q_norm.weight[2,0] mtp.layers.0.self_attn.k_norm.weight[2,0] "
                              "mtp.layers.0.post_attention_layernorm.weight[8,0] "
                              "mtp.layers.0.mlp.gate_proj.weight[6,8] mtp.layers.0.mlp.up_proj.weight[6,8] "
                              "mtp.layers.0.mlp.down_proj.weight[8,6] mtp.norm.weight[8,0]") == 0,
           "qwen3_5 MTP block: a gated attention layer and the dense MLP under mtp.layers.0., the rest under mtp. (%s)",
           names->str);
    g_string_free(names, TRUE);
    const CkptfsMcoreKey *eh = find_key(keys, "eh_proj.weight");
    if (tap_ok(eh != NULL && eh->rule->scope == CKPTFS_SCOPE_MTP_IN, "qwen3_5: an eh_proj key"))
        EXPECT_SHARE(eh, 2, 1, 4, 16, "fc.weight:4+4", "qwen3_5 eh_proj tp2 rank 1: fc rows [4, 8), as they are");
}

int main(void)
{
    /* Llama-3-8B-like: 32 heads, 8 groups, head dim 128, hidden 4096, ffn 14336, vocab 128256. */
    CkptfsModel m = {.layers = 32, .hidden = 4096, .heads = 32, .kv_heads = 8, .head_dim = 128,
                     .ffn = 14336, .vocab = 128256, .arch = ckptfs_architecture_find("llama", NULL)};
    GPtrArray *keys = ckptfs_mcore_keys(&m, 129024, false);
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
    keys = ckptfs_mcore_keys(&q2, 129024, false);
    const CkptfsMcoreKey *bias = find_key(keys, "decoder.layers.self_attention.linear_qkv.bias");
    tap_ok(bias && bias->ndim == 1 && bias->rows == 6144 && bias->cols == 1 && bias->segments->len == 24,
           "qkv bias: [6144] per layer, interleaved like the weight");
    tap_ok(find_key(keys, "output_layer.weight") == NULL, "tied: no output_layer, whatever the pipeline");
    g_ptr_array_unref(keys);
    CkptfsModel q3 = m;
    q3.qk_norm = true;
    keys = ckptfs_mcore_keys(&q3, 129024, false);
    const CkptfsMcoreKey *qn = find_key(keys, "decoder.layers.self_attention.q_layernorm.weight");
    tap_ok(qn && qn->rows == 128 && qn->split == CKPTFS_TP_REPLICATED, "q_layernorm: [head_dim], replicated");
    GPtrArray *mods = ckptfs_mcore_extra_state_rules(&q3);
    tap_is_u64(mods->len, 7, "q/k norm models: extra states of 4 linears, core attention and the two norms");
    g_ptr_array_unref(mods);
    g_ptr_array_unref(keys);
    test_shares(&m);
    test_legacy_order(&q3);
    test_phi3(&m);
    test_glm4();
    test_hybrid_mtp();
    test_moe();
    return tap_done();
}
