/* How requests travel between the kernel and the daemon: read from and written to /dev/fuse by
 * the session's worker threads, or FUSE over io_uring (libfuse 3.18 built with it, a kernel with
 * CONFIG_FUSE_IO_URING that root switched on in /sys/module/fuse/parameters/enable_uring): a ring
 * per CPU, each served by a thread of its own, where a request and its reply are one io_uring
 * command and a read's reply is written straight into the ring's buffer. */
#ifndef CKPTFS_TRANSPORT_H
#define CKPTFS_TRANSPORT_H

#include "fuse_ops.h"

/* libfuse 3.18 has FUSE_CAP_OVER_IO_URING, the session's io_uring option and the ring buffers. */
#if FUSE_MAKE_VERSION(FUSE_MAJOR_VERSION, FUSE_MINOR_VERSION) >= FUSE_MAKE_VERSION(3, 18)
#define CKPTFS_HAVE_URING 1
#endif

/* -o io_uring=auto (where it works, else /dev/fuse with a line saying why), on (refuse to mount
 * without it), off (the default). */
typedef enum {
    CKPTFS_URING_AUTO = CKPTFS_SWITCH_AUTO,
    CKPTFS_URING_ON = CKPTFS_SWITCH_ON,
    CKPTFS_URING_OFF = CKPTFS_SWITCH_OFF
} CkptfsUringMode;

typedef struct CkptfsTransport CkptfsTransport;

/* io_uring=VALUE: 1 taken into *MODE, 0 not this option, -1 a bad value (said on stderr). */
int ckptfs_transport_take_option(CkptfsUringMode *mode, const char *item);

/* "FUSE over io_uring: ..." for --version: whether this binary's libfuse can speak it. */
const char *ckptfs_transport_build_info(void);

/* Before the mount: chooses the transport for MODE. NULL with *ERROR when MODE is on and
 * io_uring cannot work here; with auto, the reason it does not is printed on stderr (one line). */
CkptfsTransport *ckptfs_transport_new(CkptfsUringMode mode, GError **error);
void ckptfs_transport_free(CkptfsTransport *t);
G_DEFINE_AUTOPTR_CLEANUP_FUNC(CkptfsTransport, ckptfs_transport_free)

/* What the session's option list gets for it (",io_uring" or ""). */
const char *ckptfs_transport_session_option(const CkptfsTransport *t);

/* At INIT: keeps io_uring off unless chosen (libfuse also reads FUSE_URING_ENABLE from the
 * environment), and logs when the kernel did not offer it after all. */
void ckptfs_transport_init(CkptfsTransport *t, const CkptfsFuseContext *ctx, struct fuse_conn_info *conn);

/* For a read of SIZE bytes: the ring's own reply buffer of REQ, where the reply is written in
 * place (reply with fuse_reply_buf on it: no copy), or NULL on /dev/fuse. The first call logs
 * which transport serves the mount. */
uint8_t *ckptfs_transport_reply_buffer(CkptfsTransport *t, const CkptfsFuseContext *ctx, fuse_req_t req,
                                       size_t size);

#endif
