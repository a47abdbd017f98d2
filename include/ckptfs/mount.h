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

typedef struct {
    CkptfsOptions options;
    CkptfsSource *source;
    CkptfsModel *model;  /* NULL when the source has no Megatron rules */
    char *model_problem; /* why model is NULL */
    CkptfsTree *tree;
} CkptfsMount;

/* Opens and validates the source at PATH and sets up the root directory of views. */
CkptfsMount *ckptfs_mount_open(const char *path, const CkptfsOptions *options, GError **error);
void ckptfs_mount_free(CkptfsMount *mount);

/* Checks that no source file a plan reads from changed since the mount (done at open, so a
 * replaced or rewritten shard gives EIO instead of silently mixed data). */
bool ckptfs_mount_check_sources(const CkptfsMount *mount, const CkptfsPlan *plan, GError **error);

/* Parses and validates a layout view name for this mount; the error says why it is not one. */
bool ckptfs_mount_layout(const CkptfsMount *mount, const char *name, CkptfsLayout *layout,
                         GError **error);

#endif
