/* FUSE passthrough: a view file that is a plain source file byte for byte (hf/ shards, config
 * and tokenizer files of an unchanged checkpoint) is handed to the kernel at open, which then
 * reads the source file itself: no request reaches the daemon, and the mount shares the
 * source's page cache instead of caching the bytes a second time. Needs libfuse 3.17 at build
 * time, a kernel with FUSE passthrough (6.9 or later) and a daemon with CAP_SYS_ADMIN; where
 * any is missing, files are served through the daemon as always. */
#ifndef CKPTFS_PASSTHROUGH_H
#define CKPTFS_PASSTHROUGH_H

#include "fuse_ops.h"

/* libfuse 3.17 has fuse_passthrough_open and the 64-bit feature flags it needs. */
#if CKPTFS_LIBFUSE_3_17
#define CKPTFS_HAVE_PASSTHROUGH 1
#endif

typedef struct CkptfsPassthrough CkptfsPassthrough;

/* Whether this build can ask for passthrough (libfuse 3.17 or later). */
bool ckptfs_passthrough_built(void);

/* -o passthrough=auto (the default: where it can work, else silently not), on (-o passthrough
 * alone too: a refusal is logged), off. */
typedef enum {
    CKPTFS_PASSTHROUGH_AUTO = CKPTFS_SWITCH_AUTO,
    CKPTFS_PASSTHROUGH_ON = CKPTFS_SWITCH_ON,
    CKPTFS_PASSTHROUGH_OFF = CKPTFS_SWITCH_OFF
} CkptfsPassthroughMode;

/* passthrough or passthrough=auto|on|off: 1 taken into *MODE, 0 not this option, -1 a bad value
 * (said on stderr). */
int ckptfs_passthrough_take_option(CkptfsPassthroughMode *mode, const char *item);

/* NULL when MODE is off, when this build has no passthrough, or, for auto, when the daemon does
 * not run as root of the first user namespace (the kernel would refuse every file). */
CkptfsPassthrough *ckptfs_passthrough_new(CkptfsPassthroughMode mode);
void ckptfs_passthrough_free(CkptfsPassthrough *pt);

/* At INIT: asks the kernel for passthrough. False (with the reason in *WHY, static; NULL for
 * auto, which falls back silently) when it does not offer it. */
bool ckptfs_passthrough_init(CkptfsPassthrough *pt, struct fuse_conn_info *conn, const char **why);

/* At open of inode INO, a view file made by PLAN. For a plan that is a plain source file whole
 * (ckptfs_plan_identical_file) it decides how the kernel reads the inode and returns true: the
 * open is then counted until ckptfs_passthrough_release. Passthrough (FI->backing_id set, one
 * backing file per inode while it has opens) where the kernel takes it; cached otherwise, and
 * every open of an inode gets the mode of the opens it already has (the kernel refuses a mix).
 * A refusal of passthrough itself (no CAP_SYS_ADMIN, a kernel without it) turns it off for the
 * mount; one of a single file, for that file; a source file that cannot be opened, for that open.
 * *REFUSAL gets a line for the log on the first of each (the caller frees it), but for a refusal
 * of passthrough itself with auto. */
bool ckptfs_passthrough_open(CkptfsPassthrough *pt, fuse_req_t req, fuse_ino_t ino, const CkptfsPlan *plan,
                             const CkptfsSrcFiles *files, struct fuse_file_info *fi, char **refusal);
/* At release of an open that ckptfs_passthrough_open counted; REQ NULL for an open whose reply
 * failed (its request is gone: a backing file it leaves is freed at unmount). */
void ckptfs_passthrough_release(CkptfsPassthrough *pt, fuse_req_t req, fuse_ino_t ino);

#endif
