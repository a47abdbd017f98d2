#include "ckptfs/fused.h"

#include <string.h>

#include "ckptfs/error.h"

const CkptfsFusedExperts ckptfs_fused_in_memory = {
    .name = "[E, 2F, H] and [E, H, F]", .gate_up = "mlp.experts.gate_up_proj", .down = "mlp.experts.down_proj"};
const CkptfsFusedExperts ckptfs_fused_transposed = {
    .name = "[E, H, 2F] and [E, F, H]", .gate_up = "mlp.experts.gate_up_proj", .down = "mlp.experts.down_proj",
    .transposed = true};
const CkptfsFusedExperts ckptfs_fused_interleaved = {
    .name = "[E, H, 2F] with gate and up interleaved, and [E, F, H]", .gate_up = "mlp.experts.gate_up_proj",
    .down = "mlp.experts.down_proj", .transposed = true, .interleaved = true,
    .gate_up_bias = "mlp.experts.gate_up_proj_bias", .down_bias = "mlp.experts.down_proj_bias"};
const CkptfsSavedExperts ckptfs_saved_per_expert = {
    .held = &ckptfs_fused_in_memory, .gate = "mlp.experts.{e}.gate_proj.weight",
    .up = "mlp.experts.{e}.up_proj.weight", .down = "mlp.experts.{e}.down_proj.weight"};
static const char *const mixtral_renamed[] = {"mlp.", "block_sparse_moe.", NULL};
const CkptfsSavedExperts ckptfs_saved_mixtral = {
    .held = &ckptfs_fused_in_memory, .gate = "block_sparse_moe.experts.{e}.w1.weight",
    .up = "block_sparse_moe.experts.{e}.w3.weight", .down = "block_sparse_moe.experts.{e}.w2.weight",
    .renamed = mixtral_renamed};

enum { GATE, UP, DOWN, PROJECTIONS };
/* The experts' biases (families whose experts have them): gate's, up's, down's. */
enum { GATE_BIAS, UP_BIAS, DOWN_BIAS, BIASES };
/* The per-expert Hugging Face names (after a layer's prefix, "{e}" for the expert) of the
 * family's routed experts: fc1's two halves, fc2. */
static bool expert_names(const CkptfsFamily *family, const char *names[PROJECTIONS], const char *biases[BIASES],
                         GError **error)
{
    names[GATE] = names[UP] = names[DOWN] = NULL;
    biases[GATE_BIAS] = biases[UP_BIAS] = biases[DOWN_BIAS] = NULL;
    for (unsigned i = 0; i < family->n_rules; i++) {
        const CkptfsRule *r = &family->rules[i];
        if (!r->expert || r->extra_state)
            continue;
        const char **into = r->ndim == 2 ? names : biases; /* GATE, UP, DOWN = the biases' indices */
        if (r->recipe == CKPTFS_RECIPE_HALVES)
            into[GATE] = r->hf[0], into[UP] = r->hf[1];
        else if (r->recipe == CKPTFS_RECIPE_WHOLE && r->rows == CKPTFS_DIM_HIDDEN)
            into[DOWN] = r->hf[0];
    }
    if (names[GATE] && names[DOWN])
        return true;
    return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "the %s rules have no per-expert gate, up and down "
                       "projections for fused expert tensors to be read as", family->name);
}

/* PREFIX + PATTERN with "{e}" replaced by EXPERT. */
static char *expert_name(const char *prefix, const char *pattern, uint64_t expert)
{
    g_autofree char *e = g_strdup_printf("%" G_GUINT64_FORMAT, expert);
    g_auto(GStrv) parts = g_strsplit(pattern, "{e}", -1);
    g_autofree char *suffix = g_strjoinv(e, parts);
    return g_strconcat(prefix, suffix, NULL);
}

/* Layer L's name prefix ("model.layers.L.", an MTP layer's "mtp.layers.0.") + PATTERN with "{e}"
 * replaced by EXPERT. */
static char *layer_name(const CkptfsModel *m, uint64_t layer, const char *pattern, uint64_t expert)
{
    g_autofree char *suffix = expert_name("", pattern, expert);
    return ckptfs_model_hf_layer_name(m, layer, suffix);
}

/* "layer 3", or "MTP layer 0" (for messages) */
static char *layer_text(const CkptfsModel *m, uint64_t layer)
{
    if (layer < m->layers)
        return g_strdup_printf("layer %" G_GUINT64_FORMAT, layer);
    return g_strdup_printf("MTP layer %" G_GUINT64_FORMAT, layer - m->layers);
}

/* Whether fused SHAPE's last two dims are gate_up's (WHICH 0) or down's (1) in FORM. */
static bool fits(const CkptfsFusedExperts *form, const CkptfsModel *m, const CkptfsTensor *t, int which)
{
    uint64_t out = which == 0 ? 2 * m->moe_ffn : m->hidden, in = which == 0 ? m->hidden : m->moe_ffn;
    if (form->transposed) {
        uint64_t swap = out;
        out = in, in = swap;
    }
    return t->ndim == 3 && t->shape[1] == out && t->shape[2] == in;
}

/* Where element (e, j) of fused tensor T (its 2-D view [E, rest]) is: its pieces must hold
 * whole rows, each row's elements adjacent. */
static bool expert_base(const CkptfsTensor *t, uint64_t e, const CkptfsPiece **piece, uint64_t *offset,
                        GError **error)
{
    size_t isz = ckptfs_dtype_size(t->stored);
    for (unsigned p = 0; p < t->npieces; p++) {
        const CkptfsPiece *pc = &t->pieces[p];
        if (e < pc->row0 || e >= pc->row1)
            continue;
        if (pc->col0 != 0 || pc->col1 != t->cols || (pc->col_stride != 0 && pc->col_stride != isz) ||
            t->scale != NULL)
            break;
        *piece = pc;
        *offset = pc->offset + (e - pc->row0) * pc->row_stride;
        return true;
    }
    return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "tensor '%s': expert %" G_GUINT64_FORMAT " is not stored "
                       "as one run of bytes (split across files, or block-scaled); its experts are not served", t->name,
                       e);
}

/* "[4, 128, 64]" */
static char *shape_text(const CkptfsTensor *t)
{
    GString *text = g_string_new("[");
    for (unsigned i = 0; i < t->ndim; i++)
        g_string_append_printf(text, "%s%" G_GUINT64_FORMAT, i ? ", " : "", t->shape[i]);
    g_string_append_c(text, ']');
    return g_string_free(text, FALSE);
}

/* The form of layer L's fused tensors among FORMS: the one their shapes fit. */
static const CkptfsFusedExperts *layer_form(const CkptfsModel *m, const CkptfsFusedExperts *const *forms,
                                            const CkptfsTensor *gate_up, const CkptfsTensor *down, GError **error)
{
    const CkptfsFusedExperts *found = NULL;
    const CkptfsTensor *both[2] = {gate_up, down};
    for (int i = 0; i < 2; i++)
        if (both[i]->ndim != 3 || both[i]->shape[0] != m->experts) {
            g_autofree char *shape = shape_text(both[i]);
            ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert tensor '%s' is %s: it must be 3-dimensional, "
                        "its first dimension the %" G_GUINT64_FORMAT " experts config.json gives", both[i]->name, shape,
                        m->experts);
            return NULL;
        }
    for (const CkptfsFusedExperts *const *f = forms; *f; f++) {
        if (!fits(*f, m, gate_up, 0) || !fits(*f, m, down, 1))
            continue;
        if (found != NULL && (found->transposed != (*f)->transposed || found->interleaved != (*f)->interleaved)) {
            ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert tensors '%s' and '%s' fit both %s and %s "
                        "(hidden_size %" G_GUINT64_FORMAT ", expert FFN size %" G_GUINT64_FORMAT "): their "
                        "orientation is ambiguous", gate_up->name, down->name, found->name, (*f)->name, m->hidden,
                        m->moe_ffn);
            return NULL;
        }
        found = *f;
    }
    if (found == NULL && gate_up->ndim == 3 && down->ndim == 3) {
        g_autoptr(GString) want = g_string_new(NULL);
        for (const CkptfsFusedExperts *const *f = forms; *f; f++)
            g_string_append_printf(want, "%s%s", want->len ? " or " : "", (*f)->name);
        ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert tensors '%s' [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    ", %" G_GUINT64_FORMAT "] and '%s' [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    "] are not %s with E %" G_GUINT64_FORMAT ", H %" G_GUINT64_FORMAT " and F %" G_GUINT64_FORMAT
                    " (config.json)", gate_up->name, gate_up->shape[0], gate_up->shape[1], gate_up->shape[2],
                    down->name, down->shape[0], down->shape[1], down->shape[2], want->str, m->experts, m->hidden,
                    m->moe_ffn);
    }
    return found;
}

/* Adds expert E's tensors NAMES (gate, up, down; whole names) as pieces of GATE_UP and DOWN. */
static bool add_expert_named(CkptfsCatalog *catalog, const CkptfsModel *m, const CkptfsFusedExperts *form,
                             uint64_t e, char *const names[PROJECTIONS], const CkptfsTensor *gate_up,
                             const CkptfsTensor *down, GError **error)
{
    uint64_t h = m->hidden, f = m->moe_ffn;
    if (gate_up->mxfp4 && down->mxfp4 && form->transposed) {
        /* MXFP4 (GPT-OSS's releases): stored [E, out, in] and served transposed, so an expert's
         * projection is a run of stored rows, every other one for gate and up interleaved */
        uint64_t apart = form->interleaved ? 2 : 1, up_first = form->interleaved ? 1 : f;
        return ckptfs_catalog_add_mxfp4_rows(catalog, names[GATE], gate_up, e * 2 * f, apart, f, error) &&
               ckptfs_catalog_add_mxfp4_rows(catalog, names[UP], gate_up, e * 2 * f + up_first, apart, f, error) &&
               ckptfs_catalog_add_mxfp4_rows(catalog, names[DOWN], down, e * h, 1, h, error);
    }
    size_t isz = ckptfs_dtype_size(gate_up->stored);
    const CkptfsPiece *gp, *dp;
    uint64_t gbase, dbase;
    if (!expert_base(gate_up, e, &gp, &gbase, error) || !expert_base(down, e, &dp, &dbase, error))
        return false;
    /* gate_up element (o, i) (output o of 2F, input i of H) at gbase + (o * o_step + i * i_step)
     * elements; gate's row r is output r (halves) or 2r (interleaved), up's F + r or 2r + 1. */
    uint64_t o_step = form->transposed ? 1 : h, i_step = form->transposed ? 2 * f : 1;
    uint64_t rows_apart = form->interleaved ? 2 : 1, up_first = form->interleaved ? 1 : f;
    /* down element (o, i) (output o of H, input i of F) */
    uint64_t do_step = form->transposed ? 1 : f, di_step = form->transposed ? h : 1;
    struct {
        uint64_t offset, row_stride, col_stride, rows, cols;
        const CkptfsPiece *in;
        const CkptfsTensor *of;
    } parts[PROJECTIONS] = {
        {gbase, rows_apart * o_step * isz, i_step * isz, f, h, gp, gate_up},
        {gbase + up_first * o_step * isz, rows_apart * o_step * isz, i_step * isz, f, h, gp, gate_up},
        {dbase, do_step * isz, di_step * isz, h, f, dp, down},
    };
    for (int p = 0; p < PROJECTIONS; p++) {
        uint64_t shape[2] = {parts[p].rows, parts[p].cols};
        CkptfsPiece piece = {.row0 = 0, .row1 = shape[0], .col0 = 0, .col1 = shape[1], .src = parts[p].in->src,
                             .offset = parts[p].offset, .row_stride = parts[p].row_stride,
                             .col_stride = parts[p].col_stride};
        if (!ckptfs_catalog_add_reshaped(catalog, names[p], parts[p].of->dtype, parts[p].of->stored, 2, shape, 0,
                                         &piece, 1, error))
            return false;
    }
    return true;
}

/* Adds expert E's per-expert tensors of layer L (NAMES) as pieces of GATE_UP and DOWN. */
static bool add_expert(CkptfsCatalog *catalog, const CkptfsModel *m, const CkptfsFusedExperts *form, uint64_t l,
                       uint64_t e, const char *const names[PROJECTIONS], const CkptfsTensor *gate_up,
                       const CkptfsTensor *down, GError **error)
{
    g_autofree char *gate = layer_name(m, l, names[GATE], e), *up = layer_name(m, l, names[UP], e);
    g_autofree char *down_name = layer_name(m, l, names[DOWN], e);
    char *const full[PROJECTIONS] = {gate, up, down_name};
    return add_expert_named(catalog, m, form, e, full, gate_up, down, error);
}

/* The first of experts' per-expert tensors (PREFIX + PATTERNS, "{e}" each expert) CATALOG
 * holds as well as their fused form, or NULL. */
static char *held_one_by_one(const CkptfsCatalog *catalog, const char *prefix, const char *const patterns[PROJECTIONS],
                             uint64_t experts)
{
    for (uint64_t e = 0; e < experts; e++)
        for (int p = 0; p < PROJECTIONS; p++) {
            char *name = expert_name(prefix, patterns[p], e);
            if (ckptfs_catalog_find(catalog, name) != NULL)
                return name;
            g_free(name);
        }
    return NULL;
}

/* Adds expert E's bias vectors of layer L (NAMES: gate's, up's, down's) as pieces of the fused
 * biases GATE_UP [E, 2F] (ordered as FORM's weight) and DOWN [E, H]. */
static bool add_expert_biases(CkptfsCatalog *catalog, const CkptfsModel *m, const CkptfsFusedExperts *form,
                              uint64_t l, uint64_t e, const char *const names[BIASES], const CkptfsTensor *gate_up,
                              const CkptfsTensor *down, GError **error)
{
    size_t isz = ckptfs_dtype_size(gate_up->stored);
    const CkptfsPiece *gp, *dp;
    uint64_t gbase, dbase;
    if (!expert_base(gate_up, e, &gp, &gbase, error) || !expert_base(down, e, &dp, &dbase, error))
        return false;
    uint64_t apart = form->interleaved ? 2 : 1, up_first = form->interleaved ? 1 : m->moe_ffn;
    struct {
        uint64_t offset, stride, rows;
        const CkptfsPiece *in;
        const CkptfsTensor *of;
    } parts[BIASES] = {
        {gbase, apart * isz, m->moe_ffn, gp, gate_up},
        {gbase + up_first * isz, apart * isz, m->moe_ffn, gp, gate_up},
        {dbase, isz, m->hidden, dp, down},
    };
    for (int p = 0; p < BIASES; p++) {
        g_autofree char *name = layer_name(m, l, names[p], e);
        uint64_t shape[1] = {parts[p].rows};
        CkptfsPiece piece = {.row0 = 0, .row1 = shape[0], .col0 = 0, .col1 = 1, .src = parts[p].in->src,
                             .offset = parts[p].offset, .row_stride = parts[p].stride};
        if (!ckptfs_catalog_add_reshaped(catalog, name, parts[p].of->dtype, parts[p].of->stored, 1, shape, 0, &piece,
                                         1, error))
            return false;
    }
    return true;
}

/* Layer L's fused biases of FORM, [E, 2F] and [E, H], into *GATE_UP and *DOWN, for a family
 * whose experts have biases (BIASES named): present with those shapes, or refused by name. */
static bool layer_biases(const CkptfsCatalog *catalog, const CkptfsModel *m, const CkptfsFusedExperts *form,
                         uint64_t l, const CkptfsTensor **gate_up, const CkptfsTensor **down, GError **error)
{
    const char *fused[2] = {form->gate_up_bias, form->down_bias};
    uint64_t cols[2] = {2 * m->moe_ffn, m->hidden};
    const CkptfsTensor **out[2] = {gate_up, down};
    for (int i = 0; i < 2; i++) {
        if (fused[i] == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "the experts fused as %s have no biases, which the "
                               "%s rules need", form->name, m->arch->family->name);
        g_autofree char *name = ckptfs_model_hf_layer_name(m, l, fused[i]);
        const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
        if (t == NULL || t->ndim != 2 || t->shape[0] != m->experts || t->shape[1] != cols[i]) {
            g_autofree char *shape = t ? shape_text(t) : NULL;
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert bias '%s' is %s; config.json implies [%"
                               G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]", name, t ? shape : "missing", m->experts,
                               cols[i]);
        }
        *out[i] = t;
    }
    return true;
}

/* NAME's layer prefix ("model.language_model.layers.1.") when it is that prefix + SUFFIX, the
 * prefix ending in a layer's number; else NULL. */
static char *layer_prefix_of(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix), digits = 0;
    if (n <= k + 1 || strcmp(name + n - k, suffix) != 0 || name[n - k - 1] != '.')
        return NULL;
    while (digits < n - k - 1 && g_ascii_isdigit(name[n - k - 2 - digits]))
        digits++;
    if (digits == 0 || (digits < n - k - 1 && name[n - k - 2 - digits] != '.'))
        return NULL;
    return g_strndup(name, n - k);
}

/* The modules SAVED renames, in each of the split layers (PREFIXES), named as saved. */
static bool rename_as_saved(CkptfsCatalog *catalog, const CkptfsSavedExperts *saved, const GPtrArray *prefixes,
                            GError **error)
{
    if (saved->renamed == NULL || prefixes->len == 0)
        return true;
    g_autoptr(GPtrArray) pairs = g_ptr_array_new_with_free_func(g_free);
    for (guint i = 0; i < prefixes->len; i++)
        for (const char *const *p = saved->renamed; p[0] && p[1]; p += 2) {
            g_ptr_array_add(pairs, g_strconcat(g_ptr_array_index(prefixes, i), p[0], NULL));
            g_ptr_array_add(pairs, g_strconcat(g_ptr_array_index(prefixes, i), p[1], NULL));
        }
    g_ptr_array_add(pairs, NULL);
    g_autofree char *clash = NULL;
    if (!ckptfs_catalog_rename(catalog, (const char *const *)pairs->pdata, &clash))
        return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "tensor '%s' is there both as held and as saved", clash);
    return true;
}

bool ckptfs_fused_experts_split_as_saved(CkptfsCatalog *catalog, const CkptfsModel *model,
                                         const CkptfsSavedExperts *saved, unsigned *split, GError **error)
{
    *split = 0;
    const CkptfsFusedExperts *forms[] = {saved->held, NULL};
    const char *const patterns[PROJECTIONS] = {saved->gate, saved->up, saved->down};
    /* the layers' prefixes, in catalog order, each once (from either projection) */
    g_autoptr(GPtrArray) prefixes = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GHashTable) seen = g_hash_table_new(g_str_hash, g_str_equal);
    for (unsigned i = 0; i < ckptfs_catalog_count(catalog); i++) {
        const char *name = ckptfs_catalog_at(catalog, i)->name;
        char *prefix = layer_prefix_of(name, saved->held->gate_up);
        prefix = prefix ? prefix : layer_prefix_of(name, saved->held->down);
        if (prefix != NULL && g_hash_table_contains(seen, prefix)) {
            g_free(prefix);
        } else if (prefix != NULL) {
            g_hash_table_add(seen, prefix);
            g_ptr_array_add(prefixes, prefix);
        }
    }
    g_autoptr(GHashTable) fused = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (guint i = 0; i < prefixes->len; i++) {
        const char *prefix = g_ptr_array_index(prefixes, i);
        g_autofree char *gate_up_name = g_strconcat(prefix, saved->held->gate_up, NULL);
        g_autofree char *down_name = g_strconcat(prefix, saved->held->down, NULL);
        const CkptfsTensor *gate_up = ckptfs_catalog_find(catalog, gate_up_name);
        const CkptfsTensor *down = ckptfs_catalog_find(catalog, down_name);
        if (gate_up == NULL || down == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert tensor '%s' has no '%s' beside it",
                               gate_up ? gate_up_name : down_name, gate_up ? down_name : gate_up_name);
        if (model->experts == 0)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "fused expert tensor '%s' in a model config.json gives "
                               "no experts", gate_up_name);
        if (layer_form(model, forms, gate_up, down, error) == NULL)
            return false;
        g_autofree char *both = held_one_by_one(catalog, prefix, patterns, model->experts);
        if (both != NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "'%s' holds its experts both fused ('%s') and one by one "
                               "('%s')", prefix, gate_up_name, both);
        for (uint64_t e = 0; e < model->experts; e++) {
            char *names[PROJECTIONS];
            for (int p = 0; p < PROJECTIONS; p++)
                names[p] = expert_name(prefix, patterns[p], e);
            bool added = add_expert_named(catalog, model, saved->held, e, names, gate_up, down, error);
            for (int p = 0; p < PROJECTIONS; p++)
                g_free(names[p]);
            if (!added)
                return false;
        }
        g_hash_table_add(fused, g_steal_pointer(&gate_up_name));
        g_hash_table_add(fused, g_steal_pointer(&down_name));
        (*split)++;
    }
    ckptfs_catalog_remove(catalog, fused);
    return rename_as_saved(catalog, saved, prefixes, error);
}

bool ckptfs_fused_experts_present(const CkptfsCatalog *catalog, const CkptfsModel *model,
                                  const CkptfsFusedExperts *const *forms)
{
    for (const CkptfsFusedExperts *const *f = forms; f && *f; f++)
        for (uint64_t l = 0; l < ckptfs_model_hf_layers(model); l++) {
            g_autofree char *gate_up = ckptfs_model_hf_layer_name(model, l, (*f)->gate_up);
            g_autofree char *down = ckptfs_model_hf_layer_name(model, l, (*f)->down);
            if (ckptfs_model_layer_is_moe(model, l) &&
                (ckptfs_catalog_find(catalog, gate_up) || ckptfs_catalog_find(catalog, down)))
                return true;
        }
    return false;
}

bool ckptfs_fused_experts_split(CkptfsCatalog *catalog, const CkptfsModel *model,
                                const CkptfsFusedExperts *const *forms, unsigned *split, GError **error)
{
    *split = 0;
    const char *names[PROJECTIONS], *biases[BIASES];
    if (forms == NULL || forms[0] == NULL || model->experts == 0)
        return true;
    g_autoptr(GHashTable) fused = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (uint64_t l = 0; l < ckptfs_model_hf_layers(model); l++) {
        if (!ckptfs_model_layer_is_moe(model, l))
            continue;
        g_autofree char *gate_up_name = ckptfs_model_hf_layer_name(model, l, forms[0]->gate_up);
        g_autofree char *down_name = ckptfs_model_hf_layer_name(model, l, forms[0]->down);
        const CkptfsTensor *gate_up = ckptfs_catalog_find(catalog, gate_up_name);
        const CkptfsTensor *down = ckptfs_catalog_find(catalog, down_name);
        if (gate_up == NULL && down == NULL)
            continue; /* held per expert */
        g_autofree char *where = layer_text(model, l);
        if (gate_up == NULL || down == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s has fused expert tensor '%s' but not '%s'", where,
                               gate_up ? gate_up_name : down_name, gate_up ? down_name : gate_up_name);
        if (*split == 0 && !expert_names(model->arch->family, names, biases, error))
            return false;
        const CkptfsFusedExperts *form = layer_form(model, forms, gate_up, down, error);
        const CkptfsTensor *gate_up_bias = NULL, *down_bias = NULL;
        if (form == NULL ||
            (biases[GATE_BIAS] && !layer_biases(catalog, model, form, l, &gate_up_bias, &down_bias, error)))
            return false;
        g_autofree char *prefix = ckptfs_model_hf_layer_name(model, l, "");
        g_autofree char *both = held_one_by_one(catalog, prefix, names, model->experts);
        if (both != NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s holds its experts both fused ('%s') and one by one "
                               "('%s')", where, gate_up_name, both);
        for (uint64_t e = 0; e < model->experts; e++)
            if (!add_expert(catalog, model, form, l, e, names, gate_up, down, error) ||
                (gate_up_bias && !add_expert_biases(catalog, model, form, l, e, biases, gate_up_bias, down_bias, error)))
                return false;
        g_hash_table_add(fused, g_steal_pointer(&gate_up_name));
        g_hash_table_add(fused, g_steal_pointer(&down_name));
        if (gate_up_bias) {
            g_hash_table_add(fused, g_strdup(gate_up_bias->name));
            g_hash_table_add(fused, g_strdup(down_bias->name));
        }
        (*split)++;
    }
    ckptfs_catalog_remove(catalog, fused);
    return true;
}

/* Piece P of an expert's [R, C] tensor as a piece of the fused tensor's 2-D view: its rows
 * shifted by ROW0 and columns by COL0, or, TRANSPOSED, its columns become rows (shifted by
 * ROW0) and its rows columns (shifted by COL0); its column k the view's COL0 + k * STEP (STEP
 * 2: interleaved with the other projection's), its columns' count P's columns' or rows'. */
static CkptfsPiece fused_piece(const CkptfsPiece *p, size_t isz, bool transposed, uint64_t row0, uint64_t col0,
                               uint32_t step)
{
    CkptfsPiece q = *p;
    uint64_t first = transposed ? p->row0 : p->col0, count = transposed ? p->row1 - p->row0 : ckptfs_piece_cols(p);
    if (!transposed) {
        q.row0 += row0, q.row1 += row0;
    } else {
        q.row0 = row0 + p->col0, q.row1 = row0 + p->col1;
        q.row_stride = p->col_stride ? p->col_stride : isz;
        q.col_stride = p->row_stride;
    }
    q.col_step = step;
    q.col0 = col0 + first * step, q.col1 = q.col0 + (count - 1) * step + 1;
    return q;
}

/* Layer L's per-expert biases (NAMES) as FORM's fused ones: gate_up's [E, 2F] seen as [E * F, 2]
 * when interleaved (a row gate's and up's), down's [E, H]; each expert's vector a column of
 * pieces. Their names are added to JOINED. */
static bool join_biases(CkptfsCatalog *catalog, const CkptfsModel *m, const CkptfsFusedExperts *form, uint64_t l,
                        const char *const names[BIASES], GHashTable *joined, GError **error)
{
    if (form->gate_up_bias == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "the experts fused as %s have no biases, which the %s "
                           "rules have", form->name, m->arch->family->name);
    uint64_t e_count = m->experts, f = m->moe_ffn;
    g_autoptr(GArray) gate_up = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
    g_autoptr(GArray) down = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
    const CkptfsTensor *first = NULL;
    for (uint64_t e = 0; e < e_count; e++)
        for (int p = 0; p < BIASES; p++) {
            g_autofree char *name = layer_name(m, l, names[p], e);
            const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
            uint64_t rows = p == DOWN_BIAS ? m->hidden : f;
            if (t == NULL || t->ndim != 1 || t->shape[0] != rows || t->scale != NULL ||
                (first && (t->dtype != first->dtype || t->stored != first->stored)))
                return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "bias '%s' is %s; fused expert biases need it [%"
                                   G_GUINT64_FORMAT "] of the others' type", name,
                                   t == NULL ? "missing" : "of another shape or type", rows);
            first = first ? first : t;
            size_t isz = ckptfs_dtype_size(t->stored);
            for (unsigned k = 0; k < t->npieces; k++) {
                CkptfsPiece q;
                if (p == DOWN_BIAS)
                    q = fused_piece(&t->pieces[k], isz, true, e, 0, 1);
                else if (form->interleaved)
                    q = fused_piece(&t->pieces[k], isz, false, e * f, p == UP_BIAS, 1);
                else
                    q = fused_piece(&t->pieces[k], isz, true, e, p == UP_BIAS ? f : 0, 1);
                g_array_append_val(p == DOWN_BIAS ? down : gate_up, q);
            }
            g_hash_table_add(joined, g_steal_pointer(&name));
        }
    uint64_t gate_up_shape[2] = {e_count, 2 * f}, down_shape[2] = {e_count, m->hidden};
    g_autofree char *gate_up_name = ckptfs_model_hf_layer_name(m, l, form->gate_up_bias);
    g_autofree char *down_name = ckptfs_model_hf_layer_name(m, l, form->down_bias);
    return ckptfs_catalog_add_reshaped(catalog, gate_up_name, first->dtype, first->stored, 2, gate_up_shape,
                                       form->interleaved ? e_count * f : 0, (const CkptfsPiece *)(void *)gate_up->data,
                                       gate_up->len, error) &&
           ckptfs_catalog_add_reshaped(catalog, down_name, first->dtype, first->stored, 2, down_shape, 0,
                                       (const CkptfsPiece *)(void *)down->data, down->len, error);
}

bool ckptfs_fused_experts_join(CkptfsCatalog *catalog, const CkptfsModel *model, const CkptfsFusedExperts *form,
                               GError **error)
{
    const char *names[PROJECTIONS], *biases[BIASES];
    if (model->experts == 0 || !expert_names(model->arch->family, names, biases, error))
        return model->experts == 0;
    uint64_t e_count = model->experts, h = model->hidden, f = model->moe_ffn;
    g_autoptr(GHashTable) joined = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (uint64_t l = 0; l < ckptfs_model_hf_layers(model); l++) {
        if (!ckptfs_model_layer_is_moe(model, l))
            continue;
        g_autoptr(GArray) gate_up_pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
        g_autoptr(GArray) down_pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
        GArray *pieces[2] = {gate_up_pieces, down_pieces};
        const CkptfsTensor *first = NULL;
        for (uint64_t e = 0; e < e_count; e++)
            for (int p = 0; p < PROJECTIONS; p++) {
                g_autofree char *name = layer_name(model, l, names[p], e);
                const CkptfsTensor *t = ckptfs_catalog_find(catalog, name);
                uint64_t rows = p == DOWN ? h : f, cols = p == DOWN ? f : h;
                if (t == NULL || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols || t->scale != NULL)
                    return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "tensor '%s' is %s; fused experts need it [%"
                                       G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT "]", name,
                                       t == NULL ? "missing" : "of another shape or block-scaled", rows, cols);
                first = first ? first : t;
                if (t->dtype != first->dtype || t->stored != first->stored)
                    return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "tensor '%s' is %s, '%s' %s: fused experts are "
                                       "one type", name, ckptfs_dtype_safetensors_name(t->dtype), first->name,
                                       ckptfs_dtype_safetensors_name(first->dtype));
                /* Where the expert's tensor sits in the fused one's 2-D view: [E * 2F, H]
                 * (halves), [E * F, 2H] (interleaved: a row is gate's then up's), [E * H, 2F]
                 * (transposed; interleaved, gate's columns the even ones and up's the odd: a
                 * piece each, whatever H); down [E * H, F] or, transposed, [E * F, H]. */
                uint64_t row0, col0 = 0;
                uint32_t step = 1;
                if (p == DOWN)
                    row0 = e * (form->transposed ? f : h);
                else if (form->transposed && form->interleaved)
                    row0 = e * h, col0 = p == UP, step = 2;
                else if (form->transposed)
                    row0 = e * h, col0 = p == UP ? f : 0;
                else if (form->interleaved)
                    row0 = e * f, col0 = p == UP ? h : 0;
                else
                    row0 = e * 2 * f + (p == UP ? f : 0);
                size_t isz = ckptfs_dtype_size(t->stored);
                for (unsigned k = 0; k < t->npieces; k++) {
                    CkptfsPiece q = fused_piece(&t->pieces[k], isz, form->transposed, row0, col0, step);
                    g_array_append_val(pieces[p == DOWN], q);
                }
                g_hash_table_add(joined, g_steal_pointer(&name));
            }
        uint64_t gate_up_shape[3] = {e_count, form->transposed ? h : 2 * f, form->transposed ? 2 * f : h};
        uint64_t down_shape[3] = {e_count, form->transposed ? f : h, form->transposed ? h : f};
        uint64_t gate_up_rows = e_count * (form->transposed ? h : form->interleaved ? f : 2 * f);
        uint64_t down_rows = e_count * (form->transposed ? f : h);
        g_autofree char *gate_up = ckptfs_model_hf_layer_name(model, l, form->gate_up);
        g_autofree char *down = ckptfs_model_hf_layer_name(model, l, form->down);
        if (!ckptfs_catalog_add_reshaped(catalog, gate_up, first->dtype, first->stored, 3, gate_up_shape, gate_up_rows,
                                         (const CkptfsPiece *)(void *)pieces[0]->data, pieces[0]->len, error) ||
            !ckptfs_catalog_add_reshaped(catalog, down, first->dtype, first->stored, 3, down_shape, down_rows,
                                         (const CkptfsPiece *)(void *)pieces[1]->data, pieces[1]->len, error))
            return false;
        if (biases[GATE_BIAS] && !join_biases(catalog, model, form, l, biases, joined, error))
            return false;
    }
    ckptfs_catalog_remove(catalog, joined);
    return true;
}
