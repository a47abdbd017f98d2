/* Experts fused on disk (core/model/fused.c) against element-by-element references written
 * from the forms' definitions: the per-expert tensors split out of fused ones in each form
 * (transformers 5's [E, 2F, H], the transposed [E, H, 2F] of Qwen3-VL-MoE's releases, GPT-OSS's
 * transposed and interleaved one), bf16, fp32 and fp32 served as bf16, whole and as random
 * rectangles; the fused tensors of hf/ joined from per-expert tensors split in pieces across
 * files (a TP split's); a multi-token prediction layer's fused experts (its own prefix); experts
 * held fused split into the per-expert tensors save_pretrained writes (GLM-4.5V's), from shards;
 * refusals by name. */
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>

#include "ckptfs/catalog.h"
#include "ckptfs/fused.h"
#include "ckptfs/model.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "random_sources.h"
#include "tap.h"

#define SRC_SIZE (1u << 20)
enum { E = 3, H = 24, F = 10, LAYERS = 2 };

static void model_init(CkptfsModel *m)
{
    memset(m, 0, sizeof *m);
    m->arch = ckptfs_architecture_find("qwen3_moe", NULL);
    m->layers = LAYERS, m->hidden = H, m->moe_ffn = F, m->experts = E;
}

/* The element of ISZ bytes at AT, as served: fp32 -> bf16 by the plain formula when TO_BF16. */
static void served(const uint8_t *at, size_t isz, bool to_bf16, GByteArray *out)
{
    if (!to_bf16) {
        g_byte_array_append(out, at, (guint)isz);
        return;
    }
    uint32_t u;
    memcpy(&u, at, 4);
    uint16_t h = (u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) ? 0xFFFF
                                                                        : (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    g_byte_array_append(out, (const guint8 *)&h, 2);
}

static char *name_of(uint64_t layer, const char *what)
{
    return g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".%s", layer, what);
}

/* Where fused tensors of layer L live in src 0 (gate_up, then down, layer after layer). */
static uint64_t fused_offset(uint64_t l, int down, size_t isz)
{
    return 4096 + (l * 2 + (uint64_t)down) * (uint64_t)E * 2 * F * H * isz;
}

/* The reference: element (r, c) of expert E's projection P (0 gate [F, H], 1 up, 2 down [H, F])
 * of layer L, from the fused tensors' row-major bytes by FORM's definition. */
static const uint8_t *fused_element(const RandomSources *s, const CkptfsFusedExperts *form, size_t isz, uint64_t l,
                                    uint64_t e, int p, uint64_t r, uint64_t c)
{
    uint64_t i0, i1, d1, d2; /* fused index (e, i0, i1) of a [E, d1, d2] tensor */
    if (p < 2) {
        uint64_t f = r, h = c;
        uint64_t o = form->interleaved ? 2 * f + (uint64_t)p : (uint64_t)p * F + f;
        d1 = form->transposed ? H : 2 * F, d2 = form->transposed ? 2 * F : H;
        i0 = form->transposed ? h : o, i1 = form->transposed ? o : h;
    } else {
        uint64_t h = r, f = c;
        d1 = form->transposed ? F : H, d2 = form->transposed ? H : F;
        i0 = form->transposed ? f : h, i1 = form->transposed ? h : f;
    }
    return s->data[0] + fused_offset(l, p == 2, isz) + ((e * d1 + i0) * d2 + i1) * isz;
}

/* Qwen3-MoE's per-expert names (its mapping rules'). */
static const char *const per_expert[3] = {"gate_proj", "up_proj", "down_proj"};

static char *expert_name(uint64_t l, unsigned e, int p)
{
    g_autofree char *suffix = g_strdup_printf("mlp.experts.%u.%s.weight", e, per_expert[p]);
    return name_of(l, suffix);
}

static bool read_equal(const RandomSources *s, const CkptfsTensor *t, uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1,
                       const GByteArray *want)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_tensor_emit_rect(t, b, r0, r1, c0, c1);
    CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
    g_autofree uint8_t *buf = g_malloc(want->len + 1);
    bool ok = ckptfs_plan_size(plan) == want->len &&
              ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, want->len, 0, NULL) == (int64_t)want->len &&
              memcmp(buf, want->data, want->len) == 0;
    ckptfs_plan_free(plan);
    return ok;
}

static void test_split(const RandomSources *s, GRand *rng)
{
    const CkptfsFusedExperts *forms[] = {&ckptfs_fused_in_memory, &ckptfs_fused_transposed, &ckptfs_fused_interleaved};
    struct {
        const char *what;
        CkptfsDtype stored;
        bool to_bf16;
    } kinds[] = {{"bf16", CKPTFS_DTYPE_BF16, false}, {"fp32", CKPTFS_DTYPE_F32, false},
                 {"fp32 -> bf16", CKPTFS_DTYPE_F32, true}};
    CkptfsModel model;
    model_init(&model);
    for (size_t f = 0; f < G_N_ELEMENTS(forms); f++)
        for (size_t k = 0; k < G_N_ELEMENTS(kinds); k++) {
            size_t isz = ckptfs_dtype_size(kinds[k].stored);
            CkptfsCatalog *catalog = ckptfs_catalog_new();
            for (uint64_t l = 0; l < LAYERS; l++) {
                uint64_t gu[3] = {E, forms[f]->transposed ? H : 2 * F, forms[f]->transposed ? 2 * F : H};
                uint64_t dn[3] = {E, forms[f]->transposed ? F : H, forms[f]->transposed ? H : F};
                g_autofree char *gate_up = name_of(l, forms[f]->gate_up), *down = name_of(l, forms[f]->down);
                ckptfs_catalog_add_contiguous(catalog, gate_up, kinds[k].stored, 3, gu, 0, fused_offset(l, 0, isz));
                ckptfs_catalog_add_contiguous(catalog, down, kinds[k].stored, 3, dn, 0, fused_offset(l, 1, isz));
            }
            if (kinds[k].to_bf16)
                ckptfs_catalog_serve_as(catalog, CKPTFS_DTYPE_BF16, NULL);
            const CkptfsFusedExperts *one[] = {forms[f], NULL};
            unsigned layers = 0;
            GError *error = NULL;
            bool split = ckptfs_fused_experts_split(catalog, &model, one, &layers, &error);
            int whole = 0, rects = 0, nrects = 0, found = 0;
            for (uint64_t l = 0; split && l < LAYERS; l++)
                for (unsigned e = 0; e < E; e++)
                    for (int p = 0; p < 3; p++) {
                        g_autofree char *name = expert_name(l, e, p);
                        const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
                        uint64_t rows = p < 2 ? F : H, cols = p < 2 ? H : F;
                        if (t == NULL || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
                            continue;
                        found++;
                        g_autoptr(GByteArray) want = g_byte_array_new();
                        for (uint64_t r = 0; r < rows; r++)
                            for (uint64_t c = 0; c < cols; c++)
                                served(fused_element(s, forms[f], isz, l, e, p, r, c), isz, kinds[k].to_bf16, want);
                        whole += read_equal(s, t, 0, rows, 0, cols, want);
                        for (int x = 0; x < 5; x++, nrects++) {
                            uint64_t r0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)rows);
                            uint64_t r1 = (uint64_t)g_rand_int_range(rng, (gint32)r0 + 1, (gint32)rows + 1);
                            uint64_t c0 = (uint64_t)g_rand_int_range(rng, 0, (gint32)cols);
                            uint64_t c1 = (uint64_t)g_rand_int_range(rng, (gint32)c0 + 1, (gint32)cols + 1);
                            g_autoptr(GByteArray) part = g_byte_array_new();
                            size_t osz = kinds[k].to_bf16 ? 2 : isz;
                            for (uint64_t r = r0; r < r1; r++)
                                g_byte_array_append(part, want->data + (r * cols + c0) * osz, (guint)((c1 - c0) * osz));
                            rects += read_equal(s, t, r0, r1, c0, c1, part);
                        }
                    }
            g_autofree char *gone = name_of(0, forms[f]->gate_up);
            tap_ok(split && layers == LAYERS && found == LAYERS * E * 3 && !ckptfs_catalog_find(catalog, gone),
                   "%s, %s: every layer split into its %d per-expert tensors, the fused ones gone (%s)", forms[f]->name,
                   kinds[k].what, E * 3, error ? error->message : "ok");
            tap_ok(whole == found && found > 0 && rects == nrects,
                   "%s, %s: each equals the fused bytes read by the form's definition (%d/%d whole, %d/%d rectangles)",
                   forms[f]->name, kinds[k].what, whole, found, rects, nrects);
            g_clear_error(&error);
            ckptfs_catalog_free(catalog);
        }
}

/* Fused tensors of both orientations' shapes: a form list that cannot tell them apart. */
static void test_refusals(void)
{
    CkptfsModel model;
    model_init(&model);
    struct {
        const char *what, *want;
        uint64_t gate_up[3], down[3];
        bool per_expert_too, no_down;
        const CkptfsFusedExperts *forms[3];
    } cases[] = {
        {"halves or interleaved: ambiguous", "orientation is ambiguous", {E, H, 2 * F}, {E, F, H}, false, false,
         {&ckptfs_fused_transposed, &ckptfs_fused_interleaved, NULL}},
        {"first dimension not the expert count", "the 3 experts", {E + 1, 2 * F, H}, {E + 1, H, F}, false, false,
         {&ckptfs_fused_in_memory, NULL, NULL}},
        {"a 2-D tensor", "must be 3-dimensional", {E, 2 * F * H, 0}, {E, H, F}, false, false,
         {&ckptfs_fused_in_memory, NULL, NULL}},
        {"transposed where the form is not", "are not [E, 2F, H] and [E, H, F]", {E, H, 2 * F}, {E, F, H}, false,
         false, {&ckptfs_fused_in_memory, NULL, NULL}},
        {"per-expert tensors too", "both fused", {E, 2 * F, H}, {E, H, F}, true, false,
         {&ckptfs_fused_in_memory, NULL, NULL}},
        {"no down_proj", "but not 'model.layers.0.mlp.experts.down_proj'", {E, 2 * F, H}, {E, H, F}, false, true,
         {&ckptfs_fused_in_memory, NULL, NULL}},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        CkptfsCatalog *catalog = ckptfs_catalog_new();
        ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.experts.gate_up_proj", CKPTFS_DTYPE_BF16,
                                      cases[i].gate_up[2] ? 3 : 2, cases[i].gate_up, 0, 0);
        if (!cases[i].no_down)
            ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.experts.down_proj", CKPTFS_DTYPE_BF16, 3,
                                          cases[i].down, 0, 0);
        if (cases[i].per_expert_too) {
            uint64_t shape[2] = {F, H};
            ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.experts.2.up_proj.weight", CKPTFS_DTYPE_BF16, 2,
                                          shape, 0, 0);
        }
        unsigned layers = 0;
        GError *error = NULL;
        bool split = ckptfs_fused_experts_split(catalog, &model, cases[i].forms, &layers, &error);
        tap_ok(!split && error && strstr(error->message, cases[i].want) &&
                   strstr(error->message, "model.layers.0.mlp.experts."),
               "%s: refused by name (%s)", cases[i].what, error ? error->message : "accepted");
        g_clear_error(&error);
        ckptfs_catalog_free(catalog);
    }
}

/* A multi-token prediction layer's fused experts (Qwen3.5-MoE's mtp.layers.0.mlp.experts.*, after
 * the decoder's layers in src 0): left as they are unless the model serves its MTP layers, then
 * split as the decoder's, the bytes the form's definition gives; a half-fused MTP layer refused
 * naming it. */
static void test_mtp_layer(const RandomSources *s)
{
    const CkptfsFusedExperts *forms[] = {&ckptfs_fused_in_memory, NULL};
    CkptfsModel model;
    model_init(&model);
    model.arch = ckptfs_architecture_find("qwen3_5_moe_text", NULL);
    model.mtp_layers = 1;
    uint64_t gu[3] = {E, 2 * F, H}, dn[3] = {E, H, F};
    for (int served_mtp = 0; served_mtp < 2; served_mtp++) {
        model.mtp = served_mtp;
        CkptfsCatalog *catalog = ckptfs_catalog_new();
        for (uint64_t l = 0; l <= LAYERS; l++) {
            const char *prefix = l < LAYERS ? "model.layers." : "mtp.layers.";
            uint64_t at = l < LAYERS ? l : 0;
            g_autofree char *gate_up = g_strdup_printf("%s%" G_GUINT64_FORMAT ".mlp.experts.gate_up_proj", prefix, at);
            g_autofree char *down = g_strdup_printf("%s%" G_GUINT64_FORMAT ".mlp.experts.down_proj", prefix, at);
            ckptfs_catalog_add_contiguous(catalog, gate_up, CKPTFS_DTYPE_BF16, 3, gu, 0, fused_offset(l, 0, 2));
            ckptfs_catalog_add_contiguous(catalog, down, CKPTFS_DTYPE_BF16, 3, dn, 0, fused_offset(l, 1, 2));
        }
        unsigned layers = 0;
        GError *error = NULL;
        bool split = ckptfs_fused_experts_split(catalog, &model, forms, &layers, &error);
        int found = 0, equal = 0;
        for (unsigned e = 0; split && e < E; e++)
            for (int p = 0; p < 3; p++) {
                g_autofree char *name = g_strdup_printf("mtp.layers.0.mlp.experts.%u.%s.weight", e, per_expert[p]);
                const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
                uint64_t rows = p < 2 ? F : H, cols = p < 2 ? H : F;
                if (t == NULL || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
                    continue;
                found++;
                g_autoptr(GByteArray) want = g_byte_array_new();
                for (uint64_t r = 0; r < rows; r++)
                    for (uint64_t c = 0; c < cols; c++)
                        served(fused_element(s, forms[0], 2, LAYERS, e, p, r, c), 2, false, want);
                equal += read_equal(s, t, 0, rows, 0, cols, want);
            }
        bool fused_left = ckptfs_catalog_find(catalog, "mtp.layers.0.mlp.experts.gate_up_proj") != NULL;
        if (served_mtp)
            tap_ok(split && layers == LAYERS + 1 && found == E * 3 && equal == found && !fused_left,
                   "MTP layer served: its fused experts split as the decoder's, %d/%d per-expert tensors the fused "
                   "bytes (%s)", equal, E * 3, error ? error->message : "ok");
        else
            tap_ok(split && layers == LAYERS && found == 0 && fused_left,
                   "MTP layer not served: the decoder's %d layers split, the MTP layer's fused tensors left as "
                   "saved (%s)", LAYERS, error ? error->message : "ok");
        g_clear_error(&error);
        ckptfs_catalog_free(catalog);
    }
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    ckptfs_catalog_add_contiguous(catalog, "mtp.layers.0.mlp.experts.gate_up_proj", CKPTFS_DTYPE_BF16, 3, gu, 0, 0);
    unsigned layers = 0;
    GError *error = NULL;
    bool split = ckptfs_fused_experts_split(catalog, &model, forms, &layers, &error);
    tap_ok(!split && error && strstr(error->message, "MTP layer 0 has fused expert tensor "
                                     "'mtp.layers.0.mlp.experts.gate_up_proj' but not "
                                     "'mtp.layers.0.mlp.experts.down_proj'"),
           "an MTP layer with gate_up_proj alone: refused by name (%s)", error ? error->message : "accepted");
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);
}

/* Per-expert tensors in pieces (gate and up split by rows, down by columns, over two files with
 * padded rows), joined into fused tensors (GPT-OSS's transposed interleaved form too) and read
 * whole. */
static void test_join(const RandomSources *s)
{
    static const CkptfsFusedExperts halves_interleaved = {.name = "[E, 2F, H] interleaved",
                                                          .gate_up = "mlp.experts.gate_up_proj",
                                                          .down = "mlp.experts.down_proj", .interleaved = true};
    const CkptfsFusedExperts *forms[] = {&ckptfs_fused_in_memory, &halves_interleaved, &ckptfs_fused_transposed,
                                         &ckptfs_fused_interleaved};
    CkptfsModel model;
    model_init(&model);
    const size_t isz = 2;
    for (size_t f = 0; f < G_N_ELEMENTS(forms); f++) {
        CkptfsCatalog *catalog = ckptfs_catalog_new();
        uint64_t at = 64;
        /* Where each expert tensor's element (r, c) is: file, offset, row stride, split. */
        GHashTable *where = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
        for (uint64_t l = 0; l < LAYERS; l++)
            for (unsigned e = 0; e < E; e++)
                for (int p = 0; p < 3; p++) {
                    uint64_t rows = p < 2 ? F : H, cols = p < 2 ? H : F;
                    g_autofree char *name = expert_name(l, e, p);
                    CkptfsPiece pieces[2];
                    uint64_t *info = g_new(uint64_t, 6);
                    if (p < 2) { /* rows [0, 4) in src 0, [4, F) in src 1 */
                        pieces[0] = (CkptfsPiece){.row0 = 0, .row1 = 4, .col0 = 0, .col1 = cols, .src = 0,
                                                  .offset = at, .row_stride = (cols + 1) * isz};
                        pieces[1] = (CkptfsPiece){.row0 = 4, .row1 = rows, .col0 = 0, .col1 = cols, .src = 1,
                                                  .offset = at, .row_stride = (cols + 3) * isz};
                    } else { /* columns [0, 6) in src 0, [6, F) in src 1 */
                        pieces[0] = (CkptfsPiece){.row0 = 0, .row1 = rows, .col0 = 0, .col1 = 6, .src = 0,
                                                  .offset = at, .row_stride = 7 * isz};
                        pieces[1] = (CkptfsPiece){.row0 = 0, .row1 = rows, .col0 = 6, .col1 = cols, .src = 1,
                                                  .offset = at, .row_stride = (cols - 6) * isz};
                    }
                    memcpy(info, (uint64_t[]){at, pieces[0].row_stride, pieces[1].row_stride, p < 2 ? 4 : 6, 0, 0},
                           6 * sizeof *info);
                    uint64_t shape[2] = {rows, cols};
                    g_assert(ckptfs_catalog_add_pieces(catalog, name, CKPTFS_DTYPE_BF16, 2, shape, pieces, 2, NULL));
                    g_hash_table_insert(where, g_strdup(name), info);
                    at += rows * (cols + 3) * isz + 64;
                }
        GError *error = NULL;
        bool joined = ckptfs_fused_experts_join(catalog, &model, forms[f], &error);
        int ok = 0;
        for (uint64_t l = 0; joined && l < LAYERS; l++)
            for (int which = 0; which < 2; which++) {
                g_autofree char *name = name_of(l, which ? forms[f]->down : forms[f]->gate_up);
                const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
                if (t == NULL)
                    continue;
                bool tr = forms[f]->transposed, il = forms[f]->interleaved;
                uint64_t d1 = which ? (tr ? F : H) : (tr ? H : 2 * F), d2 = which ? (tr ? H : F) : (tr ? 2 * F : H);
                g_autoptr(GByteArray) want = g_byte_array_new();
                for (unsigned e = 0; e < E; e++)
                    for (uint64_t i0 = 0; i0 < d1; i0++)
                        for (uint64_t i1 = 0; i1 < d2; i1++) {
                            int p;
                            uint64_t r, c;
                            if (which) {
                                p = 2, r = tr ? i1 : i0, c = tr ? i0 : i1;
                            } else {
                                uint64_t o = tr ? i1 : i0, h = tr ? i0 : i1;
                                p = il ? (int)(o % 2) : o >= F;
                                r = il ? o / 2 : o % F, c = h;
                            }
                            g_autofree char *pe = expert_name(l, e, p);
                            const uint64_t *info = g_hash_table_lookup(where, pe);
                            bool second = c >= info[3] && p == 2 ? true : (p < 2 && r >= info[3]);
                            uint64_t off = info[0] + (p < 2 ? (r - (second ? info[3] : 0)) * info[1 + second] + c * isz
                                                            : r * info[1 + second] + (c - (second ? info[3] : 0)) * isz);
                            g_byte_array_append(want, s->data[second] + off, (guint)isz);
                        }
                uint64_t shape_ok = t->ndim == 3 && t->shape[0] == E && t->shape[1] == d1 && t->shape[2] == d2;
                ok += shape_ok && read_equal(s, t, 0, t->rows, 0, t->cols, want);
            }
        g_autofree char *gone = expert_name(0, 0, 0);
        tap_ok(joined && ok == 2 * LAYERS && !ckptfs_catalog_find(catalog, gone),
               "join %s: fused tensors of per-expert pieces across files equal the naive fused layout (%d/%d; %s)",
               forms[f]->name, ok, 2 * LAYERS, error ? error->message : "ok");
        g_clear_error(&error);
        g_hash_table_unref(where);
        ckptfs_catalog_free(catalog);
    }
}

/* Expert E's rows of a fused [E, d1, d2] tensor sharded on its experts as FSDP2's Shard(0) on two
 * ranks: experts [0, 2) at AT in src 0, [2, E) at AT in src 1. */
static const uint8_t *sharded_element(const RandomSources *s, uint64_t at, size_t isz, uint64_t e, uint64_t d1,
                                      uint64_t d2, uint64_t i0, uint64_t i1)
{
    uint32_t src = e < 2 ? 0 : 1;
    return s->data[src] + at + (((e < 2 ? e : e - 2) * d1 + i0) * d2 + i1) * isz;
}

static void add_sharded(CkptfsCatalog *catalog, const char *name, uint64_t d1, uint64_t d2, uint64_t at)
{
    uint64_t shape[3] = {E, d1, d2}, row = d1 * d2 * 4;
    CkptfsPiece pieces[2] = {{.row0 = 0, .row1 = 2, .col0 = 0, .col1 = d1 * d2, .src = 0, .offset = at,
                              .row_stride = row},
                             {.row0 = 2, .row1 = E, .col0 = 0, .col1 = d1 * d2, .src = 1, .offset = at,
                              .row_stride = row}};
    ckptfs_catalog_add_pieces(catalog, name, CKPTFS_DTYPE_F32, 3, shape, pieces, 2, NULL);
}

/* GLM-4.5V's experts held fused ([E, 2F, H], [E, H, F]) under a VLM's layer prefix, sharded on the
 * experts across two files as verl's FSDP2 shards hold them, fp32 served as bf16: split into the
 * per-expert tensors transformers' save_pretrained writes (mlp.experts.{e}.gate_proj.weight, ...),
 * each the shards' bytes by the form's definition; other tensors left; refusals by name. */
static void test_split_as_saved(const RandomSources *s)
{
    CkptfsModel model;
    model_init(&model);
    const char *prefix = "model.language_model.layers.";
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    for (uint64_t l = 0; l < LAYERS; l++) {
        g_autofree char *gate_up = g_strdup_printf("%s%" G_GUINT64_FORMAT ".mlp.experts.gate_up_proj", prefix, l);
        g_autofree char *down = g_strdup_printf("%s%" G_GUINT64_FORMAT ".mlp.experts.down_proj", prefix, l);
        add_sharded(catalog, gate_up, 2 * F, H, fused_offset(l, 0, 4));
        add_sharded(catalog, down, H, F, fused_offset(l, 1, 4));
    }
    uint64_t other_shape[2] = {E, H};
    ckptfs_catalog_add_contiguous(catalog, "model.language_model.layers.0.mlp.gate.weight", CKPTFS_DTYPE_F32, 2,
                                  other_shape, 0, 0);
    ckptfs_catalog_serve_as(catalog, CKPTFS_DTYPE_BF16, NULL);
    unsigned layers = 0;
    GError *error = NULL;
    bool split = ckptfs_fused_experts_split_as_saved(catalog, &model, &ckptfs_saved_per_expert, &layers, &error);
    int found = 0, equal = 0;
    for (uint64_t l = 0; split && l < LAYERS; l++)
        for (unsigned e = 0; e < E; e++)
            for (int p = 0; p < 3; p++) {
                g_autofree char *name = g_strdup_printf("%s%" G_GUINT64_FORMAT ".mlp.experts.%u.%s.weight", prefix, l,
                                                        e, per_expert[p]);
                const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
                uint64_t rows = p < 2 ? F : H, cols = p < 2 ? H : F;
                if (t == NULL || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols ||
                    t->dtype != CKPTFS_DTYPE_BF16)
                    continue;
                found++;
                g_autoptr(GByteArray) want = g_byte_array_new();
                for (uint64_t r = 0; r < rows; r++)
                    for (uint64_t c = 0; c < cols; c++) {
                        const uint8_t *at = p < 2 ? sharded_element(s, fused_offset(l, 0, 4), 4, e, 2 * F, H,
                                                                    (uint64_t)p * F + r, c)
                                                  : sharded_element(s, fused_offset(l, 1, 4), 4, e, H, F, r, c);
                        served(at, 4, true, want);
                    }
                equal += read_equal(s, t, 0, rows, 0, cols, want);
            }
    g_autofree char *gone = g_strdup_printf("%s1.mlp.experts.down_proj", prefix);
    tap_ok(split && layers == LAYERS && found == LAYERS * E * 3 && !ckptfs_catalog_find(catalog, gone) &&
               ckptfs_catalog_find(catalog, "model.language_model.layers.0.mlp.gate.weight") &&
               ckptfs_catalog_count(catalog) == LAYERS * E * 3 + 1,
           "held fused under model.language_model.layers.N., sharded on the experts: split into the %d per-expert "
           "tensors save_pretrained writes, the fused ones gone, the router left (%s)", LAYERS * E * 3,
           error ? error->message : "ok");
    tap_ok(equal == found && found > 0, "  each the shards' bytes by [E, 2F, H] and [E, H, F], as bf16 (%d/%d)", equal,
           found);
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);

    struct {
        const char *what, *want;
        uint64_t experts;
        bool no_down, per_expert_too;
    } cases[] = {
        {"first dimension not the expert count", "its first dimension the 4 experts config.json gives", E + 1, false,
         false},
        {"no down_proj", "has no 'model.language_model.layers.3.mlp.experts.down_proj'", E, true, false},
        {"no gate_up_proj", "has no 'model.language_model.layers.3.mlp.experts.gate_up_proj'", E, false, false},
        {"per-expert tensors too", "both fused", E, false, true},
    };
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        catalog = ckptfs_catalog_new();
        uint64_t gate_up[3] = {E, 2 * F, H}, down[3] = {E, H, F}, one[2] = {F, H};
        bool no_gate_up = strstr(cases[i].what, "gate_up") != NULL;
        if (!no_gate_up)
            ckptfs_catalog_add_contiguous(catalog, "model.language_model.layers.3.mlp.experts.gate_up_proj",
                                          CKPTFS_DTYPE_BF16, 3, gate_up, 0, 0);
        if (!cases[i].no_down)
            ckptfs_catalog_add_contiguous(catalog, "model.language_model.layers.3.mlp.experts.down_proj",
                                          CKPTFS_DTYPE_BF16, 3, down, 0, 0);
        if (cases[i].per_expert_too)
            ckptfs_catalog_add_contiguous(catalog, "model.language_model.layers.3.mlp.experts.1.up_proj.weight",
                                          CKPTFS_DTYPE_BF16, 2, one, 0, 0);
        model.experts = cases[i].experts;
        split = ckptfs_fused_experts_split_as_saved(catalog, &model, &ckptfs_saved_per_expert, &layers, &error);
        tap_ok(!split && error && strstr(error->message, cases[i].want) &&
                   strstr(error->message, "model.language_model.layers.3.mlp.experts."),
               "held fused, %s: refused by name (%s)", cases[i].what, error ? error->message : "accepted");
        g_clear_error(&error);
        ckptfs_catalog_free(catalog);
    }
    /* names that only end like a fused tensor: not a layer's, left as they are */
    catalog = ckptfs_catalog_new();
    uint64_t gate_up[3] = {E, 2 * F, H};
    ckptfs_catalog_add_contiguous(catalog, "mlp.experts.gate_up_proj", CKPTFS_DTYPE_BF16, 3, gate_up, 0, 0);
    ckptfs_catalog_add_contiguous(catalog, "model.layers.x1.mlp.experts.gate_up_proj", CKPTFS_DTYPE_BF16, 3, gate_up,
                                  0, 0);
    model.experts = E;
    split = ckptfs_fused_experts_split_as_saved(catalog, &model, &ckptfs_saved_per_expert, &layers, &error);
    tap_ok(split && layers == 0 && ckptfs_catalog_count(catalog) == 2,
           "a fused name under no layer number is left as it is (%s)", error ? error->message : "ok");
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);
}

/* Mixtral's transformers 5 form: held under mlp. (the router too), saved under block_sparse_moe.
 * with the experts as w1 (gate), w3 (up), w2 (down): every module of a split layer renamed back,
 * nothing else; a layer holding its router under both names refused by name. */
static void test_split_as_saved_renamed(void)
{
    CkptfsModel model;
    model_init(&model);
    uint64_t gate_up[3] = {E, 2 * F, H}, down[3] = {E, H, F}, router[2] = {E, H}, norm[1] = {H};
    CkptfsCatalog *catalog = ckptfs_catalog_new();
    for (uint64_t l = 0; l < 2; l++) {
        g_autofree char *p = g_strdup_printf("model.layers.%" G_GUINT64_FORMAT ".", l);
        g_autofree char *a = g_strconcat(p, "mlp.gate.weight", NULL);
        g_autofree char *b = g_strconcat(p, "mlp.experts.gate_up_proj", NULL);
        g_autofree char *c = g_strconcat(p, "mlp.experts.down_proj", NULL);
        g_autofree char *d = g_strconcat(p, "post_attention_layernorm.weight", NULL);
        ckptfs_catalog_add_contiguous(catalog, a, CKPTFS_DTYPE_BF16, 2, router, 0, 0);
        ckptfs_catalog_add_contiguous(catalog, b, CKPTFS_DTYPE_BF16, 3, gate_up, 0, 0);
        ckptfs_catalog_add_contiguous(catalog, c, CKPTFS_DTYPE_BF16, 3, down, 0, 0);
        ckptfs_catalog_add_contiguous(catalog, d, CKPTFS_DTYPE_BF16, 1, norm, 0, 0);
    }
    ckptfs_catalog_add_contiguous(catalog, "model.mlp.gate.weight", CKPTFS_DTYPE_BF16, 2, router, 0, 0);
    unsigned layers = 0;
    GError *error = NULL;
    bool split = ckptfs_fused_experts_split_as_saved(catalog, &model, &ckptfs_saved_mixtral, &layers, &error);
    const char *want[] = {"model.layers.1.block_sparse_moe.gate.weight",
                          "model.layers.0.block_sparse_moe.experts.0.w1.weight",
                          "model.layers.1.block_sparse_moe.experts.2.w3.weight",
                          "model.layers.0.block_sparse_moe.experts.2.w2.weight",
                          "model.layers.1.post_attention_layernorm.weight", "model.mlp.gate.weight"};
    const char *gone[] = {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.experts.gate_up_proj",
                          "model.layers.0.block_sparse_moe.experts.gate_up_proj"};
    unsigned present = 0, absent = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(want); i++)
        present += ckptfs_catalog_find(catalog, want[i]) != NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(gone); i++)
        absent += ckptfs_catalog_find(catalog, gone[i]) == NULL;
    const CkptfsTensor *w2 = ckptfs_catalog_find(catalog, "model.layers.0.block_sparse_moe.experts.2.w2.weight");
    tap_ok(split && layers == 2 && present == G_N_ELEMENTS(want) && absent == G_N_ELEMENTS(gone) && w2 &&
               w2->shape[0] == H && w2->shape[1] == F && ckptfs_catalog_count(catalog) == 2 * (E * 3 + 2) + 1,
           "Mixtral's form: the router renamed back to block_sparse_moe.gate, the experts w1/w3/w2, other tensors "
           "as they are (%u of %zu names, %u of %zu gone: %s)", present, G_N_ELEMENTS(want), absent,
           G_N_ELEMENTS(gone), error ? error->message : "ok");
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);

    catalog = ckptfs_catalog_new();
    ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.gate.weight", CKPTFS_DTYPE_BF16, 2, router, 0, 0);
    ckptfs_catalog_add_contiguous(catalog, "model.layers.0.block_sparse_moe.gate.weight", CKPTFS_DTYPE_BF16, 2, router,
                                  0, 0);
    ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.experts.gate_up_proj", CKPTFS_DTYPE_BF16, 3, gate_up, 0,
                                  0);
    ckptfs_catalog_add_contiguous(catalog, "model.layers.0.mlp.experts.down_proj", CKPTFS_DTYPE_BF16, 3, down, 0, 0);
    split = ckptfs_fused_experts_split_as_saved(catalog, &model, &ckptfs_saved_mixtral, &layers, &error);
    tap_ok(!split && error && strstr(error->message, "'model.layers.0.block_sparse_moe.gate.weight'"),
           "Mixtral's form with the router under both names: refused by name (%s)",
           error ? error->message : "accepted");
    g_clear_error(&error);
    ckptfs_catalog_free(catalog);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(33);
    RandomSources s;
    random_sources_init(&s, 2, SRC_SIZE, rng, "fused");
    test_split(&s, rng);
    test_refusals();
    test_mtp_layer(&s);
    test_join(&s);
    test_split_as_saved(&s);
    test_split_as_saved_renamed();
    random_sources_clear(&s);
    g_rand_free(rng);
    return tap_done();
}
