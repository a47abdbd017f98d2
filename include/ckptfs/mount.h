/* A mounted checkpoint as core sees it: the source, its views and the namespace they form.
 * Everything hangs off this object (no globals), so one process can open several. */
#ifndef CKPTFS_MOUNT_H
#define CKPTFS_MOUNT_H

#include <glib.h>

#include "ckptfs/layout.h"
#include "ckptfs/model.h"
#include "ckptfs/options.h"
#include "ckptfs/source.h"
#include "ckptfs/tree.h"

typedef struct CkptfsMount CkptfsMount;
/* Where a run sends what a role opened later has to say (its source's warnings). */
typedef void (*CkptfsMountLog)(gpointer ctx, const char *where, const char *line);
struct CkptfsMount {
    CkptfsOptions options;
    CkptfsSource *source; /* NULL for a verl run: each role is a mount of its own, below */
    CkptfsModel *model;   /* NULL when the source has no Megatron rules */
    char *model_problem;  /* why model is NULL */
    CkptfsTree *tree;     /* a run's roles build their views into the run's tree */
    /* verl run (or step) directories: global_step_N/ROLE/ directories whose views appear when
     * first looked up; steps saved while mounted appear too. */
    char *run_dir;
    bool run_is_step;     /* RUN_DIR is one global_step_N: the root lists its roles */
    GPtrArray *roles;     /* CkptfsMount*: the roles opened so far (a run's only) */
    GMutex roles_lock;    /* a run's: guards roles, as role directories open at once */
    bool tree_borrowed;   /* a role's: the run frees the tree */
    bool let_go;          /* a role's: its directory was deleted, its files let go */
    CkptfsMountLog log;   /* a run's: warnings of roles opened while mounted (may be NULL) */
    gpointer log_ctx;
};

/* Opens and validates the source at PATH and sets up the root directory of views. A verl run
 * directory (global_step_N/ROLE/) shows its steps and roles, each holding the views of that
 * checkpoint, or with -o step=N|latest[,role=R] the views of one role at the root. */
CkptfsMount *ckptfs_mount_open(const char *path, const CkptfsOptions *options, GError **error);
void ckptfs_mount_free(CkptfsMount *mount);

/* Sets where a run logs the warnings of roles it opens on lookup. */
void ckptfs_mount_set_log(CkptfsMount *mount, CkptfsMountLog log, gpointer ctx);

/* The mount whose source a file of this tree reads: SCOPE as ckptfs_tree_plan gives it. */
const CkptfsMount *ckptfs_mount_of_scope(const CkptfsMount *mount, gpointer scope);

/* Checks that no source file a plan reads from changed since the mount (done at open, so a
 * replaced or rewritten shard gives EIO instead of silently mixed data). MOUNT is the one of
 * the file's scope. */
bool ckptfs_mount_check_sources(const CkptfsMount *mount, const CkptfsPlan *plan, GError **error);

/* Parses and validates a layout view name for this mount; the error says why it is not one. */
bool ckptfs_mount_layout(const CkptfsMount *mount, const char *name, CkptfsLayout *layout,
                         GError **error);

#endif
