/* torchtitan's names and layouts (core/source/titan.c) against references written from
 * torchtitan's adapters: names of both spellings looked up; Llama 3's wq/wk rows, stored in
 * chunks cut anywhere (inside a head, at odd rows), located where Hugging Face's permutation
 * (view(heads, D/2, 2, cols).transpose(1, 2)) puts them, columns cut too; grouped experts cut into one tensor
 * each; refusals by name. Pieces are checked element by element: where each one's bytes are. */
#include <glib.h>
#include <string.h>

#include "ckptfs/catalog.h"
#include "tap.h"
#include "titan.h"

enum { ISZ = 4 };

/* Where element (R, C) of T is: its source file and byte offset (false outside every piece). */
static bool locate(const CkptfsTensor *t, uint64_t r, uint64_t c, uint32_t *src, uint64_t *at)
{
    for (unsigned k = 0; k < t->npieces; k++) {
        const CkptfsPiece *p = &t->pieces[k];
        if (p->row0 <= r && r < p->row1 && p->col0 <= c && c < p->col1) {
            *src = p->src;
            *at = p->offset + (r - p->row0) * p->row_stride + (c - p->col0) * (p->col_stride ? p->col_stride : ISZ);
            return true;
        }
    }
    return false;
}

/* A tensor of ROWS x COLS fp32 stored row-major in chunks of rows cut at CUTS (ascending,
 * ending at ROWS): chunk k in source file k, at offset 64 * (k + 1). */
static unsigned chunks_of(uint64_t rows, uint64_t cols, const uint64_t *cuts, unsigned ncuts, CkptfsPiece *out)
{
    uint64_t from = 0;
    for (unsigned k = 0; k < ncuts; k++) {
        out[k] = (CkptfsPiece){.row0 = from, .row1 = cuts[k], .col0 = 0, .col1 = cols, .src = k,
                               .offset = 64 * (k + 1), .row_stride = cols * ISZ};
        from = cuts[k];
    }
    (void)rows;
    return ncuts;
}

/* Where stored row T's element C is, by the chunks. */
static void stored_at(const CkptfsPiece *chunks, unsigned n, uint64_t t, uint64_t c, uint32_t *src, uint64_t *at)
{
    for (unsigned k = 0; k < n; k++)
        if (chunks[k].row0 <= t && t < chunks[k].row1 && chunks[k].col0 <= c && c < chunks[k].col1) {
            *src = chunks[k].src;
            *at = chunks[k].offset + (t - chunks[k].row0) * chunks[k].row_stride + (c - chunks[k].col0) * ISZ;
        }
}

/* The chunks of tensor parallelism's row-wise split on top of FSDP's: rows cut at CUT, the
 * first rows' columns cut at 2 too (each chunk its own rows of its own width). */
static unsigned chunks_with_columns(uint64_t rows, uint64_t cols, uint64_t cut, CkptfsPiece *out)
{
    out[0] = (CkptfsPiece){.row0 = 0, .row1 = cut, .col0 = 0, .col1 = 2, .src = 0, .offset = 64, .row_stride = 2 * ISZ};
    out[1] = (CkptfsPiece){.row0 = 0, .row1 = cut, .col0 = 2, .col1 = cols, .src = 1, .offset = 64,
                           .row_stride = (cols - 2) * ISZ};
    out[2] = (CkptfsPiece){.row0 = cut, .row1 = rows, .col0 = 0, .col1 = cols, .src = 2, .offset = 128,
                           .row_stride = cols * ISZ};
    return 3;
}

static void test_rope(const char *titan_name, uint64_t heads, uint64_t head_dim, const uint64_t *cuts, unsigned ncuts,
                      bool column_cut)
{
    const CkptfsTitanModel *llama = ckptfs_titan_model_for("llama");
    g_autofree char *layer = NULL;
    const CkptfsTitanName *row = ckptfs_titan_lookup(llama, titan_name, &layer);
    tap_ok(row != NULL && g_strcmp0(layer, "3") == 0, "%s: a Llama 3 row, layer 3", titan_name);
    if (row == NULL)
        return;
    const uint64_t rows = heads * head_dim, cols = 5;
    CkptfsPiece chunks[8];
    unsigned n = column_cut ? chunks_with_columns(rows, cols, cuts[0], chunks) : chunks_of(rows, cols, cuts, ncuts, chunks);
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    uint64_t shape[2] = {rows, cols};
    CkptfsTitanHeads h = {heads, heads};
    GError *error = NULL;
    bool added = ckptfs_titan_add(catalog, row, layer, &h, CKPTFS_DTYPE_F32, 2, shape, chunks, n, &error);
    tap_ok(added, "%s over %u chunks: added (%s)", titan_name, n, error ? error->message : "");
    g_clear_error(&error);
    const char *hf = row->layout == CKPTFS_TITAN_ROPE_Q ? "model.layers.3.self_attn.q_proj.weight"
                                                        : "model.layers.3.self_attn.k_proj.weight";
    const CkptfsTensor *t = ckptfs_catalog_find(catalog, hf);
    tap_ok(t != NULL && t->shape[0] == rows && t->shape[1] == cols, "served as %s [%" G_GUINT64_FORMAT ", 5]", hf, rows);
    /* Hugging Face's row of stored row s: permute's view(heads, D/2, 2, cols).transpose(1, 2)
     * sends element [h][a][b] (stored row h*D + 2a + b) to [h][b][a] (row h*D + b*D/2 + a). */
    unsigned wrong = 0;
    for (uint64_t s = 0; t && s < rows; s++) {
        uint64_t hh = s / head_dim, a = (s % head_dim) / 2, b = s % 2;
        uint64_t r = hh * head_dim + b * (head_dim / 2) + a;
        for (uint64_t c = 0; c < cols; c++) {
            uint32_t src = 99, want_src = 98;
            uint64_t at = 0, want = 1;
            stored_at(chunks, n, s, c, &want_src, &want);
            if (!locate(t, r, c, &src, &at) || src != want_src || at != want)
                wrong++;
        }
    }
    tap_ok(t && wrong == 0, "every element where the permutation puts it (%u wrong)", wrong);
    ckptfs_catalog_free(catalog);
}

static void test_experts(void)
{
    const CkptfsTitanModel *ds = ckptfs_titan_model_for("deepseek_v3");
    g_autofree char *layer = NULL;
    const CkptfsTitanName *row = ckptfs_titan_lookup(ds, "layers.12.moe.experts.w2", &layer);
    tap_ok(row && row->layout == CKPTFS_TITAN_PER_EXPERT && g_strcmp0(layer, "12") == 0,
       "DeepSeek-V3's grouped w2 of layer 12");
    if (row == NULL)
        return;
    enum { E = 5, A = 3, B = 4 };
    uint64_t shape[3] = {E, A, B}, cuts[2] = {3, E};
    CkptfsPiece chunks[2];
    unsigned n = chunks_of(E, A * B, cuts, 2, chunks);
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    GError *error = NULL;
    tap_ok(ckptfs_titan_add(catalog, row, layer, NULL, CKPTFS_DTYPE_F32, 3, shape, chunks, n, &error),
       "w2 [5, 3, 4] over 2 chunks (3 + 2 experts): added");
    g_clear_error(&error);
    unsigned wrong = 0, found = 0;
    for (uint64_t e = 0; e < E; e++) {
        g_autofree char *name = g_strdup_printf("model.layers.12.mlp.experts.%" G_GUINT64_FORMAT ".down_proj.weight", e);
        const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
        if (t == NULL || t->ndim != 2 || t->shape[0] != A || t->shape[1] != B)
            continue;
        found++;
        for (uint64_t r = 0; r < A; r++)
            for (uint64_t c = 0; c < B; c++) {
                uint32_t src = 99, want_src = 98;
                uint64_t at = 0, want = 1;
                stored_at(chunks, n, e, r * B + c, &want_src, &want);
                if (!locate(t, r, c, &src, &at) || src != want_src || at != want)
                    wrong++;
            }
    }
    tap_ok(found == E && wrong == 0, "each expert its own [3, 4] tensor, slice e of the stored one (%u of 5, %u wrong)",
       found, wrong);
    ckptfs_catalog_free(catalog);
}

static void test_names(void)
{
    static const struct {
        const char *model_type, *titan, *hf;
    } cases[] = {
        {"llama", "tok_embeddings.weight", "model.embed_tokens.weight"},
        {"llama", "output.weight", "lm_head.weight"},
        {"llama", "layers.0.attention.qkv_linear.wv.weight", "model.layers.{}.self_attn.v_proj.weight"},
        {"llama", "layers.7.feed_forward.w3.weight", "model.layers.{}.mlp.up_proj.weight"},
        {"qwen3_moe", "layers.1.attention.k_norm.weight", "model.layers.{}.self_attn.k_norm.weight"},
        {"qwen3", "layers.1.moe.routed_experts.inner_experts.w1_EFD", "model.layers.{}.mlp.experts.{}.gate_proj.weight"},
        {"deepseek_v3", "layers.2.moe.expert_bias", "model.layers.{}.mlp.gate.e_score_correction_bias"},
        {"deepseek_v3", "layers.2.attention.kv_norm.weight", "model.layers.{}.self_attn.kv_a_layernorm.weight"},
        {"deepseek_v3", "layers.2.moe.shared_experts.w2.weight", "model.layers.{}.mlp.shared_experts.down_proj.weight"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        g_autofree char *layer = NULL;
        const CkptfsTitanName *row = ckptfs_titan_lookup(ckptfs_titan_model_for(cases[i].model_type), cases[i].titan, &layer);
        tap_ok(row && g_strcmp0(row->hf, cases[i].hf) == 0, "%s %s: %s", cases[i].model_type, cases[i].titan, cases[i].hf);
    }
    static const struct {
        const char *model_type, *titan;
    } unknown[] = {
        {"llama", "layers.x.attention.wq.weight"}, {"llama", "layers.1.attention.wq.weight.extra"},
        {"llama", "layers..attention.wq.weight"},  {"llama", "layers.0.attention.q_norm.weight"},
        {"qwen3", "layers.0.attention.wq_a.weight"}, {"deepseek_v3", "layers.0.attention.wk.weight"},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(unknown); i++) {
        g_autofree char *layer = NULL;
        tap_ok(ckptfs_titan_lookup(ckptfs_titan_model_for(unknown[i].model_type), unknown[i].titan, &layer) == NULL,
           "%s %s: not a name of the model", unknown[i].model_type, unknown[i].titan);
    }
    tap_ok(ckptfs_titan_model_for("mistral") == NULL && ckptfs_titan_model_for(NULL) == NULL, "mistral: no table");
}

static void test_refusals(void)
{
    const CkptfsTitanModel *llama = ckptfs_titan_model_for("llama"), *qwen3 = ckptfs_titan_model_for("qwen3_moe");
    g_autofree char *layer = NULL, *layer2 = NULL;
    const CkptfsTitanName *wq = ckptfs_titan_lookup(llama, "layers.0.attention.wq.weight", &layer);
    uint64_t shape[2] = {12, 4}, cuts[1] = {12};
    CkptfsPiece chunks[1];
    chunks_of(12, 4, cuts, 1, chunks);
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    GError *error = NULL;
    CkptfsTitanHeads h = {8, 8}, none = {0, 0};
    bool refused = !ckptfs_titan_add(catalog, wq, layer, &h, CKPTFS_DTYPE_F32, 2, shape, chunks, 1, &error);
    tap_ok(refused && error && strstr(error->message, "12 rows are not 8 heads of an even size"),
           "wq of 12 rows, 8 heads: refused (%s)", error ? error->message : "");
    g_clear_error(&error);
    refused = !ckptfs_titan_add(catalog, wq, layer, &none, CKPTFS_DTYPE_F32, 2, shape, chunks, 1, &error);
    tap_ok(refused && error && strstr(error->message, "num_attention_heads"), "wq without head counts: refused (%s)",
           error ? error->message : "");
    g_clear_error(&error);
    const CkptfsTitanName *bias = ckptfs_titan_lookup(qwen3, "layers.4.moe.expert_bias", &layer2);
    uint64_t eshape[1] = {12};
    refused = bias && !ckptfs_titan_add(catalog, bias, layer2, &h, CKPTFS_DTYPE_F32, 1, eshape, chunks, 1, &error);
    tap_ok(refused && error && strstr(error->message, "'layers.4.moe.expert_bias': torchtitan's load-balancing expert bias"),
           "Qwen3's expert_bias: refused by name (%s)", error ? error->message : "");
    g_clear_error(&error);
    tap_ok(ckptfs_catalog_count(catalog) == 0, "nothing added by a refusal");
    ckptfs_catalog_free(catalog);
}

int main(void)
{
    test_names();
    uint64_t whole[] = {64}, odd[] = {7, 9, 33, 64}, kv[] = {5, 32};
    test_rope("layers.3.attention.wq.weight", 4, 16, whole, 1, false);
    test_rope("layers.3.attention.wq.weight", 4, 16, odd, 4, false);
    test_rope("layers.3.attention.qkv_linear.wk.weight", 2, 16, kv, 2, false);
    test_rope("layers.3.attention.wq.weight", 4, 16, odd + 2, 1, true); /* rows cut at 33 */
    test_experts();
    test_refusals();
    return tap_done();
}
