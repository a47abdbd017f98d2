/* Read-ahead pushed into the mount's page cache (-o readahead, core's readahead.h): the chunks a
 * worker builds go to the kernel as stores into the file's cache. */
#ifndef CKPTFS_FS_READAHEAD_H
#define CKPTFS_FS_READAHEAD_H

#include "fuse_ops.h"
#include "ckptfs/readahead.h"

/* The mount's read-ahead, storing through SE; NULL when the option is off. */
CkptfsReadahead *ckptfs_fs_readahead_new(struct fuse_session *se, const CkptfsOptions *options);
/* Stops it (after the session loop, before the session is destroyed) and logs what it did. */
void ckptfs_fs_readahead_free(CkptfsFuseContext *ctx);

#endif
