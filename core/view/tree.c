/* The namespace (include/ckptfs/tree.h).
 *
 * Locking: the tree's one mutex guards its node array and every node's fields; it is a leaf
 * (nothing else is locked while it is held). Hooks (populate, resolve) and plan builds run
 * WITHOUT it, so a slow one (a verl role opening its whole source, a large plan) stalls only
 * its own node: that node is marked busy meanwhile, and whoever needs it waits on hook_done
 * until the hook ends; the rest of the tree stays served. A hook may change only its own
 * directory and the nodes it creates, which nobody else reaches before it ends (their parent is
 * busy); it creates them with ckptfs_tree_add_*, which take the mutex. A plan is built once and
 * published under the mutex; readers then use it without the mutex. A file whose plan is dropped
 * when not open (ckptfs_tree_plan_on_open) counts who holds its plan: it is freed, under the
 * mutex, only when the last of them gives it back, so a reader never sees it go. */
#include "ckptfs/tree.h"

#include <errno.h>
#include <string.h>

#include "ckptfs/error.h"

struct CkptfsNode {
    uint64_t ino;
    CkptfsNodeType type;
    char *name;
    CkptfsNode *parent;
    /* directories */
    GPtrArray *children; /* CkptfsNode*, in insertion order (the listing order) */
    GHashTable *by_name;
    unsigned subdirs;
    bool populated;
    bool refreshed; /* populate runs again at each listing from the start */
    bool busy;      /* a hook or plan build runs on this node, without the tree's lock */
    CkptfsPopulateFn populate;
    CkptfsResolveFn resolve;
    gpointer hook_owner;
    /* files */
    CkptfsPlanFn plan_fn;
    unsigned hints; /* CkptfsFileHints */
    gpointer plan_owner;
    gconstpointer plan_key;
    CkptfsPlan *plan; /* built once, then read without the lock */
    CkptfsAccess access; /* set with the plan */
    bool sized;          /* SIZE and ACCESS known (from a plan built once) */
    uint64_t size;
    bool plan_on_open;   /* the plan is kept only while some caller holds it */
    unsigned plan_users; /* ckptfs_tree_plan calls not yet given back */
    /* symlinks */
    char *target;
    gpointer scope; /* what the view it belongs to set for its subtree (inherited) */
};

typedef struct {
    gpointer data;
    GDestroyNotify destroy;
} Owned;

struct CkptfsTree {
    GMutex lock;
    GCond hook_done; /* a node stopped being busy */
    CkptfsAccessFn file_access;
    gpointer access_owner;
    CkptfsAccess dir_access;
    GPtrArray *nodes; /* index = ino - 1 */
    GArray *owned;    /* Owned, freed in reverse order */
};

static void node_free(gpointer data)
{
    CkptfsNode *n = data;
    g_free(n->name);
    if (n->children)
        g_ptr_array_unref(n->children);
    if (n->by_name)
        g_hash_table_unref(n->by_name);
    ckptfs_plan_free(n->plan);
    g_free(n->target);
    g_free(n);
}

static CkptfsNode *node_new(CkptfsTree *tree, CkptfsNode *parent, const char *name,
                            CkptfsNodeType type)
{
    if (parent != NULL) {
        if (g_hash_table_contains(parent->by_name, name))
            return NULL;
    }
    CkptfsNode *n = g_new0(CkptfsNode, 1);
    n->type = type;
    n->name = g_strdup(name);
    n->parent = parent;
    n->scope = parent ? parent->scope : NULL;
    n->populated = true;
    if (type == CKPTFS_NODE_DIR) {
        n->children = g_ptr_array_new();
        n->by_name = g_hash_table_new(g_str_hash, g_str_equal);
    }
    g_ptr_array_add(tree->nodes, n);
    n->ino = tree->nodes->len;
    if (parent != NULL) {
        g_ptr_array_add(parent->children, n);
        g_hash_table_insert(parent->by_name, n->name, n);
        if (type == CKPTFS_NODE_DIR)
            parent->subdirs++;
    }
    return n;
}

CkptfsTree *ckptfs_tree_new(void)
{
    CkptfsTree *tree = g_new0(CkptfsTree, 1);
    g_mutex_init(&tree->lock);
    g_cond_init(&tree->hook_done);
    tree->nodes = g_ptr_array_new_with_free_func(node_free);
    tree->owned = g_array_new(FALSE, FALSE, sizeof(Owned));
    tree->dir_access = (CkptfsAccess){.mode = 0555};
    node_new(tree, NULL, "", CKPTFS_NODE_DIR);
    return tree;
}

void ckptfs_tree_free(CkptfsTree *tree)
{
    if (tree == NULL)
        return;
    g_ptr_array_unref(tree->nodes);
    for (guint i = tree->owned->len; i > 0; i--) {
        Owned *o = &g_array_index(tree->owned, Owned, i - 1);
        o->destroy(o->data);
    }
    g_array_unref(tree->owned);
    g_cond_clear(&tree->hook_done);
    g_mutex_clear(&tree->lock);
    g_free(tree);
}

void ckptfs_tree_set_access(CkptfsTree *tree, CkptfsAccessFn file_access, gpointer owner,
                            CkptfsAccess dir_access)
{
    tree->file_access = file_access;
    tree->access_owner = owner;
    tree->dir_access = dir_access;
}

void ckptfs_tree_own(CkptfsTree *tree, gpointer data, GDestroyNotify destroy)
{
    Owned o = {data, destroy};
    g_mutex_lock(&tree->lock);
    g_array_append_val(tree->owned, o);
    g_mutex_unlock(&tree->lock);
}

CkptfsNode *ckptfs_tree_root(CkptfsTree *tree)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *root = g_ptr_array_index(tree->nodes, 0);
    g_mutex_unlock(&tree->lock);
    return root;
}

void ckptfs_tree_set_dir_hooks(CkptfsTree *tree, CkptfsNode *dir, CkptfsPopulateFn populate,
                               CkptfsResolveFn resolve, gpointer owner)
{
    g_mutex_lock(&tree->lock);
    dir->populate = populate;
    dir->resolve = resolve;
    dir->hook_owner = owner;
    dir->populated = populate == NULL;
    g_mutex_unlock(&tree->lock);
}

void ckptfs_tree_mark_refreshed(CkptfsNode *dir)
{
    dir->refreshed = true;
}

void ckptfs_tree_set_scope(CkptfsNode *dir, gpointer scope)
{
    dir->scope = scope;
}

CkptfsNode *ckptfs_tree_add_dir(CkptfsTree *tree, CkptfsNode *parent, const char *name)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *n = node_new(tree, parent, name, CKPTFS_NODE_DIR);
    g_mutex_unlock(&tree->lock);
    return n;
}

CkptfsNode *ckptfs_tree_add_file(CkptfsTree *tree, CkptfsNode *parent, const char *name,
                                 CkptfsPlanFn plan_fn, gpointer owner, gconstpointer key)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *n = node_new(tree, parent, name, CKPTFS_NODE_FILE);
    if (n != NULL) {
        n->plan_fn = plan_fn;
        n->plan_owner = owner;
        n->plan_key = key;
    }
    g_mutex_unlock(&tree->lock);
    return n;
}

CkptfsNode *ckptfs_tree_hint(CkptfsNode *file, unsigned hints)
{
    if (file)
        file->hints |= hints;
    return file;
}

CkptfsNode *ckptfs_tree_plan_on_open(CkptfsNode *file)
{
    if (file)
        file->plan_on_open = true;
    return file;
}

CkptfsNode *ckptfs_tree_add_symlink(CkptfsTree *tree, CkptfsNode *parent, const char *name,
                                    const char *target)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *n = node_new(tree, parent, name, CKPTFS_NODE_SYMLINK);
    if (n != NULL)
        n->target = g_strdup(target);
    g_mutex_unlock(&tree->lock);
    return n;
}

/* --- operations (under the lock, except hooks, plan builds and plan reads) --- */

static CkptfsNode *node_get(CkptfsTree *tree, uint64_t ino)
{
    if (ino == 0 || ino > tree->nodes->len)
        return NULL;
    return g_ptr_array_index(tree->nodes, ino - 1);
}

/* Under the lock: waits until no hook or plan build runs on NODE. */
static void wait_idle(CkptfsTree *tree, CkptfsNode *node)
{
    while (node->busy)
        g_cond_wait(&tree->hook_done, &tree->lock);
}

/* Under the lock, NODE idle: marks it busy and lets the lock go for a hook. */
static void hook_begin(CkptfsTree *tree, CkptfsNode *node)
{
    node->busy = true;
    g_mutex_unlock(&tree->lock);
}

static void hook_end(CkptfsTree *tree, CkptfsNode *node)
{
    g_mutex_lock(&tree->lock);
    node->busy = false;
    g_cond_broadcast(&tree->hook_done);
}

/* Under the lock, DIR idle: runs its populate hook (again, for a refreshed one). */
static bool run_populate(CkptfsTree *tree, CkptfsNode *dir, GError **error)
{
    CkptfsPopulateFn populate = dir->populate;
    gpointer owner = dir->hook_owner;
    hook_begin(tree, dir);
    bool ok = populate(tree, dir, owner, error);
    g_mutex_lock(&tree->lock);
    dir->populated |= ok; /* before others see it idle */
    dir->busy = false;
    g_cond_broadcast(&tree->hook_done);
    return ok;
}

/* Under the lock: DIR populated, and idle on return. */
static int ensure_populated(CkptfsTree *tree, CkptfsNode *dir, GError **error)
{
    wait_idle(tree, dir);
    if (dir->populated)
        return 0;
    return run_populate(tree, dir, error) ? 0 : -EIO;
}

/* Under the lock, DIR idle: asks its resolve hook for NAME. */
static CkptfsNode *run_resolve(CkptfsTree *tree, CkptfsNode *dir, const char *name, GError **error)
{
    CkptfsResolveFn resolve = dir->resolve;
    gpointer owner = dir->hook_owner;
    hook_begin(tree, dir);
    CkptfsNode *child = resolve(tree, dir, name, owner, error);
    hook_end(tree, dir);
    return child;
}

/* Under the lock: drops NODE's plan when nobody holds it and it is kept only while held. The
 * caller frees what it returns, after letting the lock go. */
static CkptfsPlan *take_unheld_plan(CkptfsNode *node)
{
    if (!node->plan_on_open || node->plan_users > 0 || node->busy)
        return NULL;
    CkptfsPlan *plan = node->plan;
    node->plan = NULL;
    return plan;
}

/* Under the lock: NODE's plan, built once (again after it was dropped). */
static int ensure_plan(CkptfsTree *tree, CkptfsNode *node, GError **error)
{
    if (node->type != CKPTFS_NODE_FILE)
        return 0;
    wait_idle(tree, node);
    if (node->plan != NULL)
        return 0;
    CkptfsPlanFn plan_fn = node->plan_fn;
    gpointer owner = node->plan_owner, scope = node->scope;
    gconstpointer key = node->plan_key;
    hook_begin(tree, node);
    CkptfsPlan *plan = plan_fn(owner, key, error);
    CkptfsAccess access = {.mode = 0444};
    if (plan != NULL && tree->file_access)
        access = tree->file_access(tree->access_owner, scope, plan);
    g_mutex_lock(&tree->lock);
    if (plan != NULL) {
        node->access = access;
        node->size = ckptfs_plan_size(plan);
        node->sized = true;
        /* Readers take the pointer without the lock: publish it fully built. */
        g_atomic_pointer_set(&node->plan, plan);
    }
    node->busy = false;
    g_cond_broadcast(&tree->hook_done);
    return plan != NULL ? 0 : -EIO;
}

static int fill_attr(CkptfsTree *tree, CkptfsNode *node, CkptfsAttr *attr, GError **error)
{
    int rc = 0;
    memset(attr, 0, sizeof *attr);
    attr->ino = node->ino;
    attr->type = node->type;
    switch (node->type) {
    case CKPTFS_NODE_DIR:
        rc = ensure_populated(tree, node, error);
        attr->nlink = 2 + node->subdirs;
        attr->access = tree->dir_access;
        break;
    case CKPTFS_NODE_FILE:
        /* a size is known once: a dropped plan is not built again for it */
        wait_idle(tree, node);
        rc = node->sized ? 0 : ensure_plan(tree, node, error);
        attr->nlink = 1;
        attr->size = rc == 0 ? node->size : 0;
        attr->hints = node->hints;
        attr->access = node->access;
        break;
    case CKPTFS_NODE_SYMLINK:
        attr->nlink = 1;
        attr->access = (CkptfsAccess){tree->dir_access.uid, tree->dir_access.gid, 0777};
        attr->size = strlen(node->target);
        break;
    }
    return rc;
}

/* fill_attr, and then NODE's plan dropped if nobody holds it (a stat builds one only for the size). */
static int fill_attr_dropping(CkptfsTree *tree, CkptfsNode *node, CkptfsAttr *attr, GError **error,
                              CkptfsPlan **dropped)
{
    int rc = fill_attr(tree, node, attr, error);
    if (node->type == CKPTFS_NODE_FILE)
        *dropped = take_unheld_plan(node);
    return rc;
}

int ckptfs_tree_lookup(CkptfsTree *tree, uint64_t parent, const char *name, CkptfsAttr *attr,
                       GError **error)
{
    g_mutex_lock(&tree->lock);
    int rc;
    CkptfsPlan *dropped = NULL;
    CkptfsNode *dir = node_get(tree, parent);
    if (dir == NULL) {
        rc = -ENOENT;
    } else if (dir->type != CKPTFS_NODE_DIR) {
        rc = -ENOTDIR;
    } else if ((rc = ensure_populated(tree, dir, error)) == 0) {
        CkptfsNode *child = g_hash_table_lookup(dir->by_name, name);
        if (child == NULL && dir->resolve != NULL)
            child = run_resolve(tree, dir, name, error);
        rc = child ? fill_attr_dropping(tree, child, attr, error, &dropped) : -ENOENT;
    }
    g_mutex_unlock(&tree->lock);
    ckptfs_plan_free(dropped);
    return rc;
}

int ckptfs_tree_getattr(CkptfsTree *tree, uint64_t ino, CkptfsAttr *attr, GError **error)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *node = node_get(tree, ino);
    CkptfsPlan *dropped = NULL;
    int rc = node ? fill_attr_dropping(tree, node, attr, error, &dropped) : -ENOENT;
    g_mutex_unlock(&tree->lock);
    ckptfs_plan_free(dropped);
    return rc;
}

int ckptfs_tree_readdir(CkptfsTree *tree, uint64_t ino, uint64_t offset, CkptfsDirFn fn,
                        gpointer ctx, GError **error)
{
    g_mutex_lock(&tree->lock);
    int rc = 0;
    CkptfsNode *dir = node_get(tree, ino);
    if (dir == NULL)
        rc = -ENOENT;
    else if (dir->type != CKPTFS_NODE_DIR)
        rc = -ENOTDIR;
    else {
        wait_idle(tree, dir);
        /* A listing from the start shows what appeared since (new entries last). */
        bool again = offset == 0 && dir->refreshed && dir->populated && dir->populate != NULL;
        rc = again ? (run_populate(tree, dir, error) ? 0 : -EIO) : ensure_populated(tree, dir, error);
    }
    /* Children are never removed, so the listing can be handed out without the lock: FN may
     * call back into the tree. */
    g_autoptr(GPtrArray) children = g_ptr_array_new();
    for (uint64_t i = offset; rc == 0 && i < dir->children->len; i++)
        g_ptr_array_add(children, g_ptr_array_index(dir->children, i));
    g_mutex_unlock(&tree->lock);
    for (guint i = 0; i < children->len; i++) {
        const CkptfsNode *child = g_ptr_array_index(children, i);
        CkptfsAttr attr = {.ino = child->ino, .type = child->type};
        if (!fn(ctx, child->name, &attr, offset + i + 1))
            break;
    }
    return rc;
}

int ckptfs_tree_readlink(CkptfsTree *tree, uint64_t ino, const char **target)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *node = node_get(tree, ino);
    int rc = node == NULL ? -ENOENT : node->type != CKPTFS_NODE_SYMLINK ? -EINVAL : 0;
    if (rc == 0)
        *target = node->target;
    g_mutex_unlock(&tree->lock);
    return rc;
}

int ckptfs_tree_plan(CkptfsTree *tree, uint64_t ino, const CkptfsPlan **plan, gpointer *scope,
                     GError **error)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *node = node_get(tree, ino);
    int rc = node == NULL ? -ENOENT : node->type == CKPTFS_NODE_DIR ? -EISDIR
                                    : node->type != CKPTFS_NODE_FILE ? -EINVAL : 0;
    if (rc == 0)
        rc = ensure_plan(tree, node, error);
    if (rc == 0) {
        *plan = node->plan;
        node->plan_users++;
    }
    if (rc == 0 && scope != NULL)
        *scope = node->scope;
    g_mutex_unlock(&tree->lock);
    return rc;
}

void ckptfs_tree_plan_release(CkptfsTree *tree, uint64_t ino)
{
    g_mutex_lock(&tree->lock);
    CkptfsNode *node = node_get(tree, ino);
    CkptfsPlan *dropped = NULL;
    if (node != NULL && node->type == CKPTFS_NODE_FILE && node->plan_users > 0) {
        node->plan_users--;
        dropped = take_unheld_plan(node);
    }
    g_mutex_unlock(&tree->lock);
    ckptfs_plan_free(dropped);
}

/* PATH's components looked up from directory DIR; a symbolic link (a short layout name, a verl
 * run's latest) is followed from its own directory, as the kernel does, at most DEPTH deep. */
static int resolve_from(CkptfsTree *tree, uint64_t dir, const char *path, int depth, CkptfsAttr *attr,
                        GError **error)
{
    g_auto(GStrv) parts = g_strsplit(path, "/", -1);
    int rc = ckptfs_tree_getattr(tree, dir, attr, error);
    for (char **p = parts; rc == 0 && *p; p++) {
        if (**p == '\0' || strcmp(*p, ".") == 0)
            continue;
        uint64_t parent = attr->ino;
        rc = ckptfs_tree_lookup(tree, parent, *p, attr, error);
        if (rc != 0 || attr->type != CKPTFS_NODE_SYMLINK)
            continue;
        const char *target;
        rc = depth == 0 ? -ELOOP : ckptfs_tree_readlink(tree, attr->ino, &target);
        if (rc == 0)
            rc = resolve_from(tree, parent, target, depth - 1, attr, error);
    }
    return rc;
}

int ckptfs_tree_resolve(CkptfsTree *tree, const char *path, CkptfsAttr *attr, GError **error)
{
    return resolve_from(tree, CKPTFS_ROOT_INO, path, 8, attr, error);
}
