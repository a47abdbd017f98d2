/* The namespace of a mount: directories and files with stable inode numbers, built lazily.
 * Views add nodes; a file node knows how to build its plan, which is done once, on first
 * lookup, and cached. Thread-safe: every call may come from any FUSE worker thread. */
#ifndef CKPTFS_TREE_H
#define CKPTFS_TREE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/plan.h"

#define CKPTFS_ROOT_INO 1

typedef struct CkptfsTree CkptfsTree;
typedef struct CkptfsNode CkptfsNode;

/* Builds the plan of a file node. OWNER and KEY are what the view registered. */
typedef CkptfsPlan *(*CkptfsPlanFn)(gpointer owner, gconstpointer key, GError **error);

/* Fills a directory on first use (adds its children). Used by the root to create views. */
typedef bool (*CkptfsPopulateFn)(CkptfsTree *tree, CkptfsNode *dir, gpointer owner,
                                 GError **error);

/* Resolves a name not yet present in a directory (views looked up on demand, such as
 * tp4pp2). Returns the new child, or NULL with an error (NOT_FOUND/INVALID says why). */
typedef CkptfsNode *(*CkptfsResolveFn)(CkptfsTree *tree, CkptfsNode *dir, const char *name,
                                       gpointer owner, GError **error);

typedef enum { CKPTFS_NODE_DIR, CKPTFS_NODE_FILE, CKPTFS_NODE_SYMLINK } CkptfsNodeType;

/* How a file's loaders read it: what the file system can do for them. */
typedef enum {
    /* read at scattered offsets (many small archives in one file, each loader taking a few):
     * small I/O buffers serve them better */
    CKPTFS_HINT_SCATTERED = 1 << 0,
    /* loaded with read(2), once, and never mapped shared (torch.load, dcp.load): it can be
     * served without the mount's page cache (-o direct_io) */
    CKPTFS_HINT_STREAMED = 1 << 1,
} CkptfsFileHints;

typedef struct {
    uint64_t ino;
    CkptfsNodeType type;
    uint64_t size;
    uint32_t nlink;
    unsigned hints; /* files: CkptfsFileHints */
    CkptfsAccess access; /* owner, group and permission bits (no file-type bits) */
} CkptfsAttr;

/* Who may read a file, from the source files its plan reads (see ckptfs_srcfiles_access);
 * SCOPE is the file's scope (ckptfs_tree_set_scope). */
typedef CkptfsAccess (*CkptfsAccessFn)(gpointer owner, gpointer scope, const CkptfsPlan *plan);

CkptfsTree *ckptfs_tree_new(void);
void ckptfs_tree_free(CkptfsTree *tree);

/* Sets how files get their access (computed once, with the plan) and the access of
 * directories and symlinks. Without it everything is root's: 0555 directories, 0444 files. */
void ckptfs_tree_set_access(CkptfsTree *tree, CkptfsAccessFn file_access, gpointer owner,
                            CkptfsAccess dir_access);

/* Keeps DATA alive for the life of the tree (freed with DESTROY at the end). */
void ckptfs_tree_own(CkptfsTree *tree, gpointer data, GDestroyNotify destroy);

CkptfsNode *ckptfs_tree_root(CkptfsTree *tree);
void ckptfs_tree_set_dir_hooks(CkptfsTree *tree, CkptfsNode *dir, CkptfsPopulateFn populate,
                               CkptfsResolveFn resolve, gpointer owner);

/* A directory whose populate hook runs again at each listing from the start, adding what
 * appeared since (entries are never removed): a verl run gains steps while mounted. */
void ckptfs_tree_mark_refreshed(CkptfsNode *dir);
/* Sets the scope of DIR, inherited by every node created under it afterwards: what the view
 * its files belong to needs to read them (the source of a verl run's role). */
void ckptfs_tree_set_scope(CkptfsNode *dir, gpointer scope);

/* Node creation. Populate/resolve hooks and plan builds run without the tree's lock, so a slow
 * one stalls only its own node; a hook changes only its own directory and the nodes it creates
 * (nobody else reaches them before it ends). A name already present returns NULL. */
CkptfsNode *ckptfs_tree_add_dir(CkptfsTree *tree, CkptfsNode *parent, const char *name);
CkptfsNode *ckptfs_tree_add_file(CkptfsTree *tree, CkptfsNode *parent, const char *name,
                                 CkptfsPlanFn plan_fn, gpointer owner, gconstpointer key);
/* Adds HINTS (CkptfsFileHints) to a file node's attributes. FILE may be NULL. Returns FILE. */
CkptfsNode *ckptfs_tree_hint(CkptfsNode *file, unsigned hints);
/* Makes FILE's plan one that is kept only while held (ckptfs_tree_plan until
 * ckptfs_tree_plan_release): its first stat builds it for the size and access and drops it; an
 * open builds it again. For files whose plans are large (a big MoE layout's rank files: hundreds
 * of them, each listed by `ls -l`, few open at once). FILE may be NULL. Returns FILE. */
CkptfsNode *ckptfs_tree_plan_on_open(CkptfsNode *file);
CkptfsNode *ckptfs_tree_add_symlink(CkptfsTree *tree, CkptfsNode *parent, const char *name,
                                    const char *target);

/* The file-system operations. All return 0 or a negative errno; ERROR (may be NULL) gets the
 * reason for anything a user should read in a log. */
int ckptfs_tree_lookup(CkptfsTree *tree, uint64_t parent, const char *name, CkptfsAttr *attr,
                       GError **error);
int ckptfs_tree_getattr(CkptfsTree *tree, uint64_t ino, CkptfsAttr *attr, GError **error);

/* Calls FN for entries from index OFFSET on ("." and ".." not included); FN returns false
 * when its buffer is full. */
typedef bool (*CkptfsDirFn)(gpointer ctx, const char *name, const CkptfsAttr *attr,
                            uint64_t next_offset);
int ckptfs_tree_readdir(CkptfsTree *tree, uint64_t ino, uint64_t offset, CkptfsDirFn fn,
                        gpointer ctx, GError **error);

int ckptfs_tree_readlink(CkptfsTree *tree, uint64_t ino, const char **target);

/* The plan of a file node (built if needed) and its scope (SCOPE may be NULL), held until
 * ckptfs_tree_plan_release: valid until then for a file marked ckptfs_tree_plan_on_open, for the
 * life of the tree for any other. */
int ckptfs_tree_plan(CkptfsTree *tree, uint64_t ino, const CkptfsPlan **plan, gpointer *scope,
                     GError **error);
/* Gives back a plan ckptfs_tree_plan handed out for INO (once per successful call); the last one
 * given back of a ckptfs_tree_plan_on_open file is freed. */
void ckptfs_tree_plan_release(CkptfsTree *tree, uint64_t ino);

/* Walks a relative path ("hf/config.json", "" = root) with lookups, following symbolic links
 * ("tp2/release" is "tp2pp1/release"). */
int ckptfs_tree_resolve(CkptfsTree *tree, const char *path, CkptfsAttr *attr, GError **error);

#endif
