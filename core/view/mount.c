#include "ckptfs/mount.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
#include "ckptfs/verl_run.h"
#include "ckptfs/views.h"

/* The layout a bare "vpp2" or "pp4" refines: the source's own split (tp1pp1 for HF). */
static CkptfsLayout base_layout(const CkptfsMount *mount)
{
    CkptfsLayout base = mount->source->saved_layout;
    base.vpp = 1;
    return base;
}

/* Uneven pipeline stages: -o pp_first/pp_last for every layout when given; else the source's
 * own first/last stage sizes for layouts with its number of stages (the run's own setting),
 * and even stages for any other number. */
static void apply_uneven_stages(const CkptfsMount *mount, const CkptfsLayout *base,
                                CkptfsLayout *layout)
{
    if (mount->options.pp_first || mount->options.pp_last) {
        layout->pp_first = mount->options.pp_first;
        layout->pp_last = mount->options.pp_last;
    } else if (layout->pp != base->pp) {
        layout->pp_first = layout->pp_last = 0;
    }
    if (layout->pp == 1)
        layout->pp_first = layout->pp_last = 0;
}

/* Tensors the Megatron views leave out although the checkpoint has them: config.json and the
 * weights disagree (an expert or layer past its counts, a stray tensor). hf/ still serves them;
 * the warning says what the Megatron model lacks, as transformers lists unused weights. */
static void warn_unused_tensors(CkptfsSource *source, const GPtrArray *unused)
{
    if (unused->len == 0)
        return;
    g_autoptr(GString) names = g_string_new(NULL);
    for (guint i = 0; i < unused->len && i < 3; i++)
        g_string_append_printf(names, "%s'%s'", i ? ", " : "", (char *)g_ptr_array_index(unused, i));
    if (unused->len > 3)
        g_string_append_printf(names, " and %u more", unused->len - 3);
    g_ptr_array_add(source->warnings,
                    g_strdup_printf("%u tensor%s in no Megatron view (config.json does not describe %s): %s",
                                    unused->len, unused->len == 1 ? " is" : "s are", unused->len == 1 ? "it" : "them",
                                    names->str));
}

/* Whether the model has an mcore/: a VLM's names its vision tower, a hybrid its gated delta-net
 * layers, with the TE spec only (mbridge and Megatron-core build them so), and a TE-only
 * architecture's layers exist in that spec only (Gemma 3): the checks of a single-rank layout say
 * why not otherwise. */
static bool mcore_servable(const CkptfsMount *mount, GError **error)
{
    CkptfsLayout single = {.tp = 1, .pp = 1, .vpp = 1};
    const CkptfsArchitecture *arch = mount->model->arch;
    return (!arch->vision && !arch->hybrid_attention && !arch->te_spec_only) ||
           ckptfs_megatron_layout_check(mount->model, &mount->options, &single, error);
}

bool ckptfs_mount_layout(const CkptfsMount *mount, const char *name, CkptfsLayout *layout,
                         GError **error)
{
    if (mount->source == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "no Megatron views: %s", mount->model_problem);
        return false;
    }
    /* mcore/ is not listed without a model: say why, not that there is no such view. */
    if (mount->model == NULL && strcmp(name, "mcore") == 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "no Megatron views: %s", mount->model_problem);
        return false;
    }
    if (mount->model != NULL && strcmp(name, "mcore") == 0 && !mcore_servable(mount, error))
        return false;
    CkptfsLayout base = base_layout(mount);
    if (!ckptfs_layout_parse(name, &base, layout)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND,
                    "'%s' is not a layout name (tp{T}pp{P}[vpp{V}][ep{E}][etp{X}], or its tail alone "
                    "such as pp{P}, vpp{V} or ep{E}; each number from 1 to 4096; the other views are hf "
                    "and mcore)", name);
        return false;
    }
    apply_uneven_stages(mount, &base, layout);
    if (mount->model == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "no Megatron views: %s",
                    mount->model_problem);
        return false;
    }
    return ckptfs_layout_validate(layout, mount->model, error) &&
           ckptfs_megatron_layout_check(mount->model, &mount->options, layout, error);
}

/* Adds the view directory of a valid layout (once, under its canonical name). */
static CkptfsNode *add_layout_view(CkptfsMount *mount, CkptfsNode *root, const CkptfsLayout *layout,
                                   GError **error)
{
    g_autofree char *name = ckptfs_layout_name(layout);
    CkptfsNode *dir = ckptfs_tree_add_dir(mount->tree, root, name);
    if (dir == NULL)
        return NULL; /* already there */
    if (!ckptfs_megatron_view_build(mount->tree, dir, mount->source, mount->model, &mount->options,
                                    layout, error))
        return NULL;
    return dir;
}

/* The root lists hf/ and the valid layouts among tp 1,2,4,8 x pp 1,2,4 (and for an MoE model
 * x ep 2,4,8 with pp 1), plus -o layouts=. */
static bool populate_root(CkptfsTree *tree, CkptfsNode *root, gpointer owner, GError **error)
{
    CkptfsMount *mount = owner;
    /* -o layouts first: a bad one fails before any view is built. */
    for (char **name = mount->options.layouts; name && *name; name++) {
        CkptfsLayout layout;
        if (!ckptfs_mount_layout(mount, *name, &layout, error)) {
            g_prefix_error(error, "option layouts: ");
            return false;
        }
    }
    /* NULL when a failed attempt already made it: views are built once. */
    CkptfsNode *hf = ckptfs_tree_add_dir(tree, root, "hf");
    if (hf != NULL && !ckptfs_hf_view_build(tree, hf, mount->source, &mount->options, error))
        return false;
    if (mount->model == NULL)
        return true;
    CkptfsNode *mcore = mcore_servable(mount, NULL) ? ckptfs_tree_add_dir(tree, root, "mcore") : NULL;
    if (mcore != NULL && !ckptfs_mcore_view_build(tree, mcore, mount->source, mount->model, &mount->options, error))
        return false;
    static const unsigned tps[] = {1, 2, 4, 8}, pps[] = {1, 2, 4};
    for (size_t i = 0; i < G_N_ELEMENTS(tps); i++)
        for (size_t j = 0; j < G_N_ELEMENTS(pps); j++) {
            g_autofree char *name = g_strdup_printf("tp%upp%u", tps[i], pps[j]);
            CkptfsLayout layout;
            if (ckptfs_mount_layout(mount, name, &layout, NULL))
                add_layout_view(mount, root, &layout, NULL);
        }
    /* A mixture of experts: expert-parallel splits too (any other is looked up on demand). */
    static const unsigned eps[] = {2, 4, 8};
    for (size_t i = 0; mount->model->experts && i < G_N_ELEMENTS(tps); i++)
        for (size_t j = 0; j < G_N_ELEMENTS(eps); j++) {
            g_autofree char *name = g_strdup_printf("tp%upp1ep%u", tps[i], eps[j]);
            CkptfsLayout layout;
            if (ckptfs_mount_layout(mount, name, &layout, NULL))
                add_layout_view(mount, root, &layout, NULL);
        }
    for (char **name = mount->options.layouts; name && *name; name++) {
        CkptfsLayout layout;
        if (ckptfs_mount_layout(mount, *name, &layout, NULL))
            add_layout_view(mount, root, &layout, NULL);
    }
    return true;
}

/* A name not listed: a layout asked for on demand. A short name (tp2, vpp2) is a symlink to
 * its canonical directory, so both paths show the same files. */
static CkptfsNode *resolve_root(CkptfsTree *tree, CkptfsNode *root, const char *name,
                                gpointer owner, GError **error)
{
    CkptfsMount *mount = owner;
    CkptfsLayout layout;
    if (!ckptfs_mount_layout(mount, name, &layout, error))
        return NULL;
    g_autofree char *canonical = ckptfs_layout_name(&layout);
    GError *local = NULL;
    CkptfsNode *dir = add_layout_view(mount, root, &layout, &local);
    if (local != NULL) {
        g_propagate_error(error, local);
        return NULL;
    }
    if (strcmp(canonical, name) == 0)
        return dir;
    return ckptfs_tree_add_symlink(tree, root, name, canonical);
}

void ckptfs_mount_set_log(CkptfsMount *mount, CkptfsMountLog log, gpointer ctx)
{
    mount->log = log;
    mount->log_ctx = ctx;
}

const CkptfsMount *ckptfs_mount_of_scope(const CkptfsMount *mount, gpointer scope)
{
    return scope != NULL ? scope : mount;
}

/* A file reads as its source files allow; one made of generated bytes only (names, sizes and
 * settings taken from the whole source) as the whole source allows. */
static CkptfsAccess plan_access(gpointer owner, gpointer scope, const CkptfsPlan *plan)
{
    const CkptfsMount *mount = ckptfs_mount_of_scope(owner, scope);
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    return ckptfs_srcfiles_access(mount->source->files, (const uint32_t *)(void *)srcs->data,
                                  srcs->len, getuid(), getgid());
}

/* Directories: the source directory's owner, and read+search where it grants read. */
static CkptfsAccess dir_access(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return (CkptfsAccess){getuid(), getgid(), 0500};
    uint32_t read = st.st_mode & 0444;
    return (CkptfsAccess){st.st_uid, st.st_gid, read | (read >> 2)};
}

/* Opens the source at PATH into a mount whose views hang under DIR of TREE, or at the root of
 * a tree of its own when TREE is NULL. */
static CkptfsMount *open_views(const char *path, const CkptfsOptions *options, CkptfsTree *tree,
                               CkptfsNode *dir, GError **error)
{
    if (options->moe_grouped_gemm && options->spec == CKPTFS_SPEC_LOCAL) {
        /* Megatron's local spec builds SequentialMLP experts whatever --moe-grouped-gemm says. */
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                    "option moe_grouped_gemm=on needs spec=te: Megatron's local spec has no grouped experts");
        return NULL;
    }
    CkptfsSource *source = ckptfs_source_open(path, options, error);
    if (source == NULL)
        return NULL;
    CkptfsMount *mount = g_new0(CkptfsMount, 1);
    ckptfs_options_copy(&mount->options, options);
    mount->source = source;
    GError *model_error = NULL;
    g_autoptr(GPtrArray) unused = NULL; /* tensors no Megatron view reads */
    CkptfsModel *model = g_new0(CkptfsModel, 1);
    if (source->model_problem) {
        mount->model_problem = g_strdup(source->model_problem);
        g_free(model);
    } else if (source->config == NULL && source->config_problem != NULL) {
        mount->model_problem = g_strdup_printf("%s; the Megatron views need it", source->config_problem);
        g_free(model);
    } else if (ckptfs_model_from_config(source->config, ckptfs_source_model_catalog(source), model, &unused,
                                        &model_error)) {
        mount->model = model;
        model->token_ids_known = !source->token_ids_unknown;
        if (options->mtp && !ckptfs_model_serve_mtp(model, ckptfs_source_model_catalog(source), error)) {
            g_prefix_error(error, "%s: option mtp=on: ", path);
            ckptfs_mount_free(mount);
            return NULL;
        }
        if (options->bridge_names && !ckptfs_model_use_bridge_names(model, ckptfs_source_model_catalog(source), error)) {
            g_prefix_error(error, "%s: ", path);
            ckptfs_mount_free(mount);
            return NULL;
        }
        warn_unused_tensors(source, unused);
    } else {
        mount->model_problem = g_strdup(model_error->message);
        g_error_free(model_error);
        g_free(model);
    }
    if (tree != NULL && source->config == NULL) {
        /* verl's rank 0 writes huggingface/ after the shards: a role without it in a run is
         * still being saved. Refused for now (retried at the next lookup), not served without
         * its config for the life of the mount. */
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND,
                    "%s: no config.json yet (%s); is the step still being saved?", path, source->config_problem);
        ckptfs_mount_free(mount);
        return NULL;
    }
    if (tree == NULL) {
        mount->tree = ckptfs_tree_new();
        ckptfs_tree_set_access(mount->tree, plan_access, mount, dir_access(mount->source->dir));
        dir = ckptfs_tree_root(mount->tree);
    } else {
        mount->tree = tree;
        mount->tree_borrowed = true;
    }
    ckptfs_tree_set_scope(dir, mount);
    ckptfs_tree_set_dir_hooks(mount->tree, dir, populate_root, resolve_root, mount);
    return mount;
}

/* --- verl runs: global_step_N/ROLE/ directories, each role's views opened on first use --- */

typedef struct {
    CkptfsMount *run;
    char *path; /* the step's or role's directory */
} RunDir;

static void run_dir_free(gpointer p)
{
    RunDir *d = p;
    g_free(d->path);
    g_free(d);
}

static RunDir *run_dir_new(CkptfsMount *run, char *path)
{
    RunDir *d = g_new0(RunDir, 1);
    d->run = run;
    d->path = path;
    ckptfs_tree_own(run->tree, d, run_dir_free);
    return d;
}

/* A role's directory: its checkpoint opened as a source, its views below (retried at the next
 * lookup when that fails: a step may still be being written). */
static bool populate_role(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    RunDir *d = owner;
    CkptfsOptions options;
    ckptfs_options_copy(&options, &d->run->options);
    g_clear_pointer(&options.step, g_free);
    g_clear_pointer(&options.role, g_free);
    CkptfsMount *role = open_views(d->path, &options, tree, dir, error);
    ckptfs_options_clear(&options);
    if (role == NULL)
        return false;
    g_mutex_lock(&d->run->roles_lock);
    g_ptr_array_add(d->run->roles, role);
    g_mutex_unlock(&d->run->roles_lock);
    for (guint i = 0; d->run->log != NULL && i < role->source->warnings->len; i++)
        d->run->log(d->run->log_ctx, d->path, g_ptr_array_index(role->source->warnings, i));
    return populate_root(tree, dir, role, error);
}

static CkptfsNode *add_role(CkptfsMount *run, CkptfsNode *dir, const char *step_path, const char *name)
{
    CkptfsNode *role = ckptfs_tree_add_dir(run->tree, dir, name);
    if (role != NULL)
        ckptfs_tree_set_dir_hooks(run->tree, role, populate_role, NULL,
                                  run_dir_new(run, g_build_filename(step_path, name, NULL)));
    return role;
}

static void add_roles(CkptfsMount *run, CkptfsNode *dir, const char *step_path)
{
    g_autoptr(GPtrArray) roles = ckptfs_verl_roles(step_path);
    for (guint i = 0; i < roles->len; i++)
        add_role(run, dir, step_path, g_ptr_array_index(roles, i));
}

/* A role saved after the step was first listed (verl saves the critic after the actor). */
static CkptfsNode *resolve_role(CkptfsMount *run, CkptfsNode *dir, const char *step_path, const char *name,
                                GError **error)
{
    g_autofree char *path = g_build_filename(step_path, name, NULL);
    if (strchr(name, '/') == NULL && g_file_test(path, G_FILE_TEST_IS_DIR) && ckptfs_verl_is_role(path))
        return add_role(run, dir, step_path, name);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "'%s' is not a role of %s", name, step_path);
    return NULL;
}

static CkptfsNode *resolve_step(CkptfsTree *tree, CkptfsNode *dir, const char *name, gpointer owner,
                                GError **error)
{
    (void)tree;
    RunDir *d = owner;
    return resolve_role(d->run, dir, d->path, name, error);
}

static bool populate_step(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    (void)tree;
    (void)error;
    RunDir *d = owner;
    add_roles(d->run, dir, d->path);
    return true;
}

static CkptfsNode *add_step(CkptfsMount *run, CkptfsNode *root, uint64_t step)
{
    g_autofree char *name = g_strdup_printf("global_step_%" G_GUINT64_FORMAT, step);
    CkptfsNode *dir = ckptfs_tree_add_dir(run->tree, root, name);
    if (dir != NULL) {
        ckptfs_tree_set_dir_hooks(run->tree, dir, populate_step, resolve_step,
                                  run_dir_new(run, g_build_filename(run->run_dir, name, NULL)));
        ckptfs_tree_mark_refreshed(dir);
    }
    return dir;
}

/* The run's root: its steps (those saved since the last listing join it), and latest/ naming
 * the latest one when first listed. A step directory's root: its roles. */
static bool populate_run(CkptfsTree *tree, CkptfsNode *root, gpointer owner, GError **error)
{
    (void)tree;
    (void)error;
    CkptfsMount *run = owner;
    if (run->run_is_step) {
        add_roles(run, root, run->run_dir);
        return true;
    }
    g_autoptr(GArray) steps = ckptfs_verl_steps(run->run_dir);
    for (guint i = 0; i < steps->len; i++)
        add_step(run, root, g_array_index(steps, uint64_t, i));
    /* Roles of steps deleted since (verl's max_ckpt_to_keep) let their files go, so that their
     * space is freed; they stay listed, their files failing. */
    g_mutex_lock(&run->roles_lock);
    for (guint i = 0; i < run->roles->len; i++) {
        CkptfsMount *role = g_ptr_array_index(run->roles, i);
        if (!role->let_go && !g_file_test(role->source->dir, G_FILE_TEST_IS_DIR)) {
            ckptfs_srcfiles_let_go(role->source->files);
            role->let_go = true;
        }
    }
    g_mutex_unlock(&run->roles_lock);
    uint64_t latest;
    if (ckptfs_verl_latest(run->run_dir, &latest, NULL)) {
        g_autofree char *target = g_strdup_printf("global_step_%" G_GUINT64_FORMAT, latest);
        /* Said once, when latest is made (it stays fixed). */
        if (ckptfs_tree_add_symlink(run->tree, root, "latest", target) != NULL && run->log) {
            g_autofree char *problem = ckptfs_verl_tracker_problem(run->run_dir, latest);
            if (problem)
                run->log(run->log_ctx, run->run_dir, problem);
        }
    }
    return true;
}

/* A step saved after the last listing, looked up by name. */
static CkptfsNode *resolve_run(CkptfsTree *tree, CkptfsNode *root, const char *name, gpointer owner,
                               GError **error)
{
    (void)tree;
    CkptfsMount *run = owner;
    uint64_t step;
    g_autofree char *path = g_build_filename(run->run_dir, name, NULL);
    if (run->run_is_step)
        return resolve_role(run, root, run->run_dir, name, error);
    if (ckptfs_verl_step_name(name, &step) && g_file_test(path, G_FILE_TEST_IS_DIR))
        return add_step(run, root, step);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "'%s' is not a %s of %s", name,
                run->run_is_step ? "role" : "step (global_step_N) or latest", run->run_dir);
    return NULL;
}

static CkptfsMount *open_run(const char *path, const CkptfsOptions *options, bool is_step)
{
    CkptfsMount *run = g_new0(CkptfsMount, 1);
    ckptfs_options_copy(&run->options, options);
    run->run_dir = g_strdup(path);
    run->run_is_step = is_step;
    run->roles = g_ptr_array_new();
    g_mutex_init(&run->roles_lock);
    run->model_problem = g_strdup_printf("%s is a verl %s: the views are in its role directories "
                                         "(or mount with -o step=N,role=ROLE)",
                                         path, is_step ? "step" : "run");
    run->tree = ckptfs_tree_new();
    ckptfs_tree_set_access(run->tree, plan_access, run, dir_access(path));
    CkptfsNode *root = ckptfs_tree_root(run->tree);
    ckptfs_tree_set_dir_hooks(run->tree, root, populate_run, resolve_run, run);
    ckptfs_tree_mark_refreshed(root);
    return run;
}

CkptfsMount *ckptfs_mount_open(const char *path, const CkptfsOptions *options, GError **error)
{
    CkptfsMount *mount;
    bool run = ckptfs_verl_is_run(path);
    if (options->step != NULL || options->role != NULL) {
        if (!run) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                        "%s: options step and role pick a checkpoint of a verl run directory "
                        "(global_step_N/ROLE/); this is not one", path);
            return NULL;
        }
        g_autofree char *role_dir = ckptfs_verl_pick_role(path, options, error);
        if (role_dir == NULL)
            return NULL;
        mount = open_views(role_dir, options, NULL, NULL, error);
    } else if (run || ckptfs_verl_is_step(path)) {
        mount = open_run(path, options, !run);
    } else {
        mount = open_views(path, options, NULL, NULL, error);
    }
    if (mount == NULL)
        return NULL;
    /* Build the root now: a view that cannot be built fails the mount, not a later ls. */
    CkptfsAttr attr;
    if (ckptfs_tree_getattr(mount->tree, CKPTFS_ROOT_INO, &attr, error) != 0) {
        ckptfs_mount_free(mount);
        return NULL;
    }
    return mount;
}

void ckptfs_mount_free(CkptfsMount *mount)
{
    if (mount == NULL)
        return;
    if (!mount->tree_borrowed)
        ckptfs_tree_free(mount->tree);
    if (mount->roles != NULL) {
        for (guint i = 0; i < mount->roles->len; i++)
            ckptfs_mount_free(g_ptr_array_index(mount->roles, i));
        g_ptr_array_unref(mount->roles);
        g_mutex_clear(&mount->roles_lock);
    }
    g_free(mount->run_dir);
    g_free(mount->model);
    g_free(mount->model_problem);
    ckptfs_source_free(mount->source);
    ckptfs_options_clear(&mount->options);
    g_free(mount);
}

bool ckptfs_mount_check_sources(const CkptfsMount *mount, const CkptfsPlan *plan, GError **error)
{
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    for (guint i = 0; i < srcs->len; i++)
        if (!ckptfs_srcfiles_unchanged(mount->source->files, g_array_index(srcs, guint32, i), error))
            return false;
    return true;
}
