/* The libfuse low-level operations over a CkptfsMount: thin glue, no format logic. */
#ifndef CKPTFS_FUSE_OPS_H
#define CKPTFS_FUSE_OPS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "ckptfs/mount.h"

/* libfuse 3.17 or later: 64-bit feature flags (fuse_set_feature_flag), passthrough, shared
 * mappings of direct-I/O files. */
#define CKPTFS_LIBFUSE_3_17 (FUSE_MAKE_VERSION(FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION) >= FUSE_MAKE_VERSION(3, 17))

typedef struct {
    CkptfsMount *mount;
    struct timespec mtime; /* newest source file: stable across remounts of the same source */
    bool foreground;       /* log to stderr; else syslog */
    pthread_key_t read_buffer; /* per worker thread: a reply buffer reused across reads (ckptfs_read_buffer_free) */
    char *read_ahead_knob; /* sysfs read_ahead_kb of this mount, raised on first open */
    gint read_ahead_raised;
    struct CkptfsPassthrough *passthrough; /* -o passthrough (passthrough.h), else NULL */
    CkptfsLeaseWatch *leases; /* -o mapped_reads once started, else NULL */
    struct CkptfsReadahead *readahead; /* -o readahead once started (fs/readahead.h), else NULL */
    struct CkptfsTransport *transport; /* /dev/fuse or io_uring (transport.h) */
    /* The files open now (their handles, under open_lock): a session that ends while files are
     * open (unmounted lazily, or stopped by a signal, while they are read) gets no release of
     * them, and ckptfs_fuse_open_files_free frees them then. */
    GMutex open_lock;
    GHashTable *open_files;
} CkptfsFuseContext;

extern const struct fuse_lowlevel_ops ckptfs_fuse_ops;

/* Around the session loop: the set of open files starts empty, and what the kernel never released
 * is freed once the loop has ended (no request runs any more). */
void ckptfs_fuse_open_files_init(CkptfsFuseContext *ctx);
void ckptfs_fuse_open_files_free(CkptfsFuseContext *ctx);

/* Frees a worker thread's reply buffer: the notify of CkptfsFuseContext.read_buffer. */
void ckptfs_read_buffer_free(gpointer buffer);

/* One log line, to stderr in the foreground and to syslog once daemonized. */
void ckptfs_fuse_log(const CkptfsFuseContext *ctx, const char *fmt, ...) G_GNUC_PRINTF(2, 3);

/* The session's switches written KEY=auto|on|off (passthrough, io_uring): ITEM's value as 0
 * (auto), 1 (on) or 2 (off) in *VALUE. 1 taken, 0 not KEY=..., -1 a bad value (said on stderr). */
enum { CKPTFS_SWITCH_AUTO, CKPTFS_SWITCH_ON, CKPTFS_SWITCH_OFF };
int ckptfs_take_auto_switch(const char *item, const char *key, int *value);

#endif
