/* Read-ahead pushed into the mount's page cache (-o readahead, core's readahead.h and
 * readahead_policy.h): the chunks a worker builds go to the kernel as stores into the file's
 * cache; with readahead=auto, each open of a streamed file is read through that cache with pushes
 * or with direct I/O, as the policy decides. */
#ifndef CKPTFS_FS_READAHEAD_H
#define CKPTFS_FS_READAHEAD_H

#include "fuse_ops.h"
#include "ckptfs/readahead.h"

/* Starts the mount's read-ahead, storing through SE, into ctx->readahead (NULL when the policy
 * is off); in the foreground, one line says what the policy is. */
void ckptfs_fs_readahead_start(CkptfsFuseContext *ctx, struct fuse_session *se);
/* The stream of a file being opened (NULL: nothing pushed or counted for it). STREAMED: a file
 * its loaders stream (rank files, mcore/'s). FI's direct_io is cleared where its reader is to go
 * through the page cache for the pushes. */
CkptfsReadaheadStream *ckptfs_fs_readahead_open(CkptfsFuseContext *ctx, fuse_ino_t ino, bool streamed,
                                                const CkptfsPlan *plan, const CkptfsSrcFiles *files,
                                                CkptfsSrcReader *reader, struct fuse_file_info *fi);
/* Stops it (after the session loop, before the session is destroyed) and logs what it did. */
void ckptfs_fs_readahead_free(CkptfsFuseContext *ctx);

#endif
