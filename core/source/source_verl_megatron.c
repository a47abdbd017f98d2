/* verl's Megatron checkpoints as a source: one role directory (global_step_N/actor) saved by
 * verl's Megatron engine, opened with the reader of the format its weights are in. Three
 * layouts, by date of the verl that wrote them:
 *   2026 layout: ckpt_contents.json (written last), transformer_config.json, model/huggingface/
 *     (config, tokenizer and by default the weights as safetensors from Megatron-Bridge),
 *     model/dist_ckpt/ (torch_dist, when dist checkpointing is on), optimizer/, extra/;
 *   2025-26 layout: dist_ckpt/ (torch_dist: model, optimizer, RNG) and huggingface/ (config,
 *     tokenizer; the weights too when Megatron-Bridge saved the model);
 *   2025 per-rank layout: model/mp_rank_TT[_PPP]/model.pt (a list of the virtual chunks' state
 *     dicts, no args), config.json in hf_config_and_tokenizer/ (from May 2025) or huggingface/.
 * Safetensors weights pass through as a Hugging Face source; torch_dist and rank files get
 * config.json and the tokenizer from the Hugging Face directory, as -o hf_extra gives them.
 * verl creates its directories before it knows whether anything goes in them: a dist_ckpt/
 * counts only with its metadata.json. Megatron's tracker and iteration directories do not apply
 * here. */
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/source.h"
#include "source_internal.h"

#define MANIFEST "ckpt_contents.json"

typedef enum { WEIGHTS_HF, WEIGHTS_TORCH_DIST, WEIGHTS_RANKS } Weights;

/* Where one layout keeps the weights, and its config.json and tokenizer. */
typedef struct {
    const char *layout;      /* for inspect: "2026 layout" */
    Weights weights;
    const char *dir;         /* below the role directory */
    const char *hf_dirs[3];  /* config.json and tokenizer: the first that has config.json */
} Layout;

/* Tried in order: the Hugging Face weights Megatron-Bridge writes are the ones verl loads when
 * both trees exist; in a 2025-26 save with Megatron-Bridge, dist_ckpt/ holds no model. */
static const Layout layouts[] = {
    {"2026 layout", WEIGHTS_HF, "model/huggingface", {"model/huggingface"}},
    {"2026 layout", WEIGHTS_TORCH_DIST, "model/dist_ckpt", {"model/huggingface"}},
    {"2025 per-rank layout", WEIGHTS_RANKS, "model", {"hf_config_and_tokenizer", "huggingface"}},
    {"2025-26 layout", WEIGHTS_HF, "huggingface", {"huggingface"}},
    {"2025-26 layout", WEIGHTS_TORCH_DIST, "dist_ckpt", {"huggingface"}},
};

static bool has(const char *dir, const char *name, GFileTest test)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, test);
}

static bool has_rank_dirs(const char *dir)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL)
        if (g_str_has_prefix(name, "mp_rank_") && has(dir, name, G_FILE_TEST_IS_DIR))
            return true;
    return false;
}

/* Whether ROLE holds the weights where LAYOUT keeps them. */
static bool holds(const char *role, const Layout *layout)
{
    g_autofree char *dir = g_build_filename(role, layout->dir, NULL);
    switch (layout->weights) {
    case WEIGHTS_HF:
        return has(dir, "model.safetensors", G_FILE_TEST_EXISTS) ||
               has(dir, "model.safetensors.index.json", G_FILE_TEST_EXISTS);
    case WEIGHTS_TORCH_DIST:
        return has(dir, "metadata.json", G_FILE_TEST_EXISTS);
    case WEIGHTS_RANKS:
        return has_rank_dirs(dir);
    }
    return false;
}

static const Layout *find_layout(const char *role)
{
    for (size_t i = 0; i < G_N_ELEMENTS(layouts); i++)
        if (holds(role, &layouts[i]))
            return &layouts[i];
    return NULL;
}

/* A role directory of a verl Megatron save, also one without model weights (then refused by
 * name rather than read as something else); a Hugging Face checkpoint with a model/ directory
 * beside its weights is not one. */
static bool probe_verl_megatron(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    if (has(dir, MANIFEST, G_FILE_TEST_EXISTS) || find_layout(dir) != NULL)
        return true;
    bool hf_weights = has(dir, "model.safetensors", G_FILE_TEST_EXISTS) ||
                      has(dir, "model.safetensors.index.json", G_FILE_TEST_EXISTS);
    return !hf_weights && (has(dir, "model", G_FILE_TEST_IS_DIR) || has(dir, "dist_ckpt", G_FILE_TEST_IS_DIR));
}

/* The directory of LAYOUT's config.json and tokenizer: the first with config.json, else the
 * first there is (a tokenizer without config: config.json then comes from -o hf_config). */
static char *hf_dir(const char *role, const Layout *layout, bool *has_config)
{
    char *first = NULL;
    *has_config = false;
    for (const char *const *d = layout->hf_dirs; *d; d++) {
        g_autofree char *path = g_build_filename(role, *d, NULL);
        if (has(path, "config.json", G_FILE_TEST_IS_REGULAR)) {
            g_free(first);
            *has_config = true;
            return g_steal_pointer(&path);
        }
        if (first == NULL && g_file_test(path, G_FILE_TEST_IS_DIR))
            first = g_steal_pointer(&path);
    }
    return first;
}

/* INNER (a copy of the options) gets config.json and the tokenizer from the save's Hugging Face
 * directory, unless -o hf_extra gives them: torch_dist and rank files saved by verl have no args,
 * the model's sizes come from config.json. */
static bool find_hf_extra(const char *role, const Layout *layout, CkptfsOptions *inner, GError **error)
{
    if (layout->weights == WEIGHTS_HF || inner->hf_extra != NULL)
        return true;
    bool has_config;
    inner->hf_extra = hf_dir(role, layout, &has_config);
    if (has_config || inner->hf_config != NULL)
        return true;
    g_autofree char *want = g_build_filename(role, layout->hf_dirs[0], "config.json", NULL);
    g_autofree char *also = layout->hf_dirs[1] ? g_build_filename(role, layout->hf_dirs[1], "config.json", NULL)
                                               : NULL;
    return ckptfs_fail(error, CKPTFS_ERROR_NOT_FOUND, "%s%s%s: missing (the weights in %s/%s are saved without "
                       "args: the model's config.json is needed; give one with -o hf_config=PATH or -o "
                       "hf_extra=DIR)", want, also ? " and " : "", also ? also : "", role, layout->dir);
}

/* LoRA saves: adapters in huggingface/adapter/ (and dist_ckpt/), the base model nowhere. */
static bool check_not_adapters_only(const char *role, const Layout *layout, GError **error)
{
    static const char *const adapters[] = {"model/huggingface/adapter", "huggingface/adapter"};
    for (size_t i = 0; layout->weights != WEIGHTS_HF && i < G_N_ELEMENTS(adapters); i++)
        if (has(role, adapters[i], G_FILE_TEST_IS_DIR))
            return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s/%s: a LoRA save (adapters only): the base "
                               "model's weights are not in this checkpoint", role, adapters[i]);
    return true;
}

static bool open_weights(CkptfsSource *source, const Layout *layout, const CkptfsOptions *options,
                         GError **error)
{
    static const CkptfsRankFiles verl_files = {.rank_file = "model.pt", .chunk_list = true};
    switch (layout->weights) {
    case WEIGHTS_HF:
        return ckptfs_format_hf.open(source, options, error);
    case WEIGHTS_TORCH_DIST:
        return ckptfs_format_torch_dist.open(source, options, error);
    case WEIGHTS_RANKS:
        return ckptfs_megatron_open_ranks(source, options, source->dir, &verl_files, error);
    }
    return false;
}

static void describe_found(CkptfsSource *source, const Layout *layout)
{
    g_autofree char *inner = g_steal_pointer(&source->found);
    g_autofree char *saved = ckptfs_layout_name(&source->saved_layout);
    const char *what = layout->weights == WEIGHTS_HF           ? "Hugging Face weights"
                       : layout->weights == WEIGHTS_TORCH_DIST ? "torch_dist"
                                                               : "per-rank model.pt files";
    source->found = g_strdup_printf("verl Megatron save (%s): %s in %s%s%s%s%s", layout->layout, what,
                                    layout->dir, layout->weights == WEIGHTS_RANKS ? ", saved as " : "",
                                    layout->weights == WEIGHTS_RANKS ? saved : "", inner ? "; " : "",
                                    inner ? inner : "");
}

static bool open_verl_megatron(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    if (options->iteration != NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s: a verl Megatron save has no iterations; option "
                           "iteration is for Megatron's own checkpoint directories (pick a step of a verl run "
                           "with -o step=N)", source->dir);
    const Layout *layout = find_layout(source->dir);
    if (layout == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_NOT_FOUND, "%s: a verl Megatron save without model weights (no "
                           "safetensors in model/huggingface/ or huggingface/, no torch_dist metadata.json in "
                           "model/dist_ckpt/ or dist_ckpt/, no model/mp_rank_* directories)", source->dir);
    if (!check_not_adapters_only(source->dir, layout, error))
        return false;
    CkptfsOptions inner;
    ckptfs_options_copy(&inner, options);
    /* The reader sees the weights' directory as its source; the role directory stays the one
     * given (inspect shows it, permissions follow it). */
    char *role = source->dir;
    bool ok = find_hf_extra(role, layout, &inner, error);
    source->dir = g_build_filename(role, layout->dir, NULL);
    ok = ok && open_weights(source, layout, &inner, error);
    g_free(source->dir);
    source->dir = role;
    ckptfs_options_clear(&inner);
    if (!ok)
        return false;
    describe_found(source, layout);
    bool v2 = g_str_has_prefix(layout->dir, "model/");
    if (v2 && !has(role, MANIFEST, G_FILE_TEST_EXISTS))
        g_ptr_array_add(source->warnings, g_strdup_printf("%s/%s: missing; verl writes it last, so this save "
                                                          "may be incomplete or still being written", role,
                                                          MANIFEST));
    return true;
}

static char *describe_verl_megatron(const CkptfsSource *source)
{
    return source->weight_files->len > 0 ? ckptfs_format_hf.describe(source) : ckptfs_megatron_describe(source);
}

const CkptfsSourceFormat ckptfs_format_verl_megatron = {"verl-megatron", probe_verl_megatron, open_verl_megatron,
                                                        describe_verl_megatron};
