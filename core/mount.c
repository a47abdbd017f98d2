#include "ckptfs/mount.h"

#include "ckptfs/error.h"
#include "ckptfs/views.h"

/* The root lists every view the source can show; views are built on first use of the root. */
static bool populate_root(CkptfsTree *tree, CkptfsNode *root, gpointer owner, GError **error)
{
    CkptfsMount *mount = owner;
    CkptfsNode *hf = ckptfs_tree_add_dir(tree, root, "hf");
    return ckptfs_hf_view_build(tree, hf, mount->source, &mount->options, error);
}

CkptfsMount *ckptfs_mount_open(const char *path, const CkptfsOptions *options, GError **error)
{
    CkptfsSource *source = ckptfs_source_open(path, options, error);
    if (source == NULL)
        return NULL;
    CkptfsMount *mount = g_new0(CkptfsMount, 1);
    ckptfs_options_copy(&mount->options, options);
    mount->source = source;
    mount->tree = ckptfs_tree_new();
    ckptfs_tree_set_dir_hooks(mount->tree, ckptfs_tree_root(mount->tree), populate_root, NULL,
                              mount);
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
