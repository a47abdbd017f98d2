#include "ckptfs/mount.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/layout.h"
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

bool ckptfs_mount_layout(const CkptfsMount *mount, const char *name, CkptfsLayout *layout,
                         GError **error)
{
    CkptfsLayout base = base_layout(mount);
    if (!ckptfs_layout_parse(name, &base, layout)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND,
                    "'%s' is not a view (views: hf, mcore, tp{T}pp{P}[vpp{V}][ep{E}][etp{X}], vpp{V})", name);
        return false;
    }
    apply_uneven_stages(mount, &base, layout);
    if (mount->model == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED, "no Megatron views: %s",
                    mount->model_problem);
        return false;
    }
    return ckptfs_layout_validate(layout, mount->model, error);
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
    CkptfsNode *hf = ckptfs_tree_add_dir(tree, root, "hf");
    if (!ckptfs_hf_view_build(tree, hf, mount->source, &mount->options, error))
        return false;
    if (mount->model == NULL)
        return true;
    CkptfsNode *mcore = ckptfs_tree_add_dir(tree, root, "mcore");
    if (!ckptfs_mcore_view_build(tree, mcore, mount->source, mount->model, &mount->options, error))
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
        if (!ckptfs_mount_layout(mount, *name, &layout, error)) {
            g_prefix_error(error, "option layouts: ");
            return false;
        }
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

/* A file reads as its source files allow; one made of generated bytes only (names, sizes and
 * settings taken from the whole source) as the whole source allows. */
static CkptfsAccess plan_access(gpointer owner, const CkptfsPlan *plan)
{
    const CkptfsMount *mount = owner;
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    return ckptfs_srcfiles_access(mount->source->files, (const uint32_t *)(void *)srcs->data,
                                  srcs->len, getuid(), getgid());
}

/* Directories: the source directory's owner, and read+search where it grants read. */
static CkptfsAccess dir_access(const CkptfsMount *mount)
{
    struct stat st;
    if (stat(mount->source->dir, &st) != 0)
        return (CkptfsAccess){getuid(), getgid(), 0500};
    uint32_t read = st.st_mode & 0444;
    return (CkptfsAccess){st.st_uid, st.st_gid, read | (read >> 2)};
}

CkptfsMount *ckptfs_mount_open(const char *path, const CkptfsOptions *options, GError **error)
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
    CkptfsModel *model = g_new0(CkptfsModel, 1);
    if (ckptfs_model_from_config(source->config, source->catalog, model, &model_error)) {
        mount->model = model;
    } else {
        mount->model_problem = g_strdup(model_error->message);
        g_error_free(model_error);
        g_free(model);
    }
    mount->tree = ckptfs_tree_new();
    ckptfs_tree_set_access(mount->tree, plan_access, mount, dir_access(mount));
    ckptfs_tree_set_dir_hooks(mount->tree, ckptfs_tree_root(mount->tree), populate_root,
                              resolve_root, mount);
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
    ckptfs_tree_free(mount->tree);
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
