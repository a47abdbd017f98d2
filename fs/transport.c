#include "transport.h"

#include <link.h>
#include <stdio.h>
#include <string.h>

#include "ckptfs/error.h"

#define ENABLE_URING_KNOB "/sys/module/fuse/parameters/enable_uring"

struct CkptfsTransport {
    CkptfsUringMode mode;
    bool wanted;         /* io_uring asked of libfuse */
    gint first_read_seen; /* the transport in use was logged */
};

int ckptfs_transport_take_option(CkptfsUringMode *mode, const char *item)
{
    int value;
    int taken = ckptfs_take_auto_switch(item, "io_uring", &value);
    if (taken == 1)
        *mode = (CkptfsUringMode)value;
    return taken;
}

#ifdef CKPTFS_HAVE_URING
static int find_liburing(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    if (strstr(info->dlpi_name, "/liburing.so") != NULL || g_str_has_prefix(info->dlpi_name, "liburing.so")) {
        *(bool *)found = true;
        return 1;
    }
    return 0;
}

/* libfuse 3.18 built without io_uring has the same functions (stubs that fail); one built with it
 * links liburing, which is then loaded in this process. */
static bool libfuse_has_uring(void)
{
    bool found = false;
    dl_iterate_phdr(find_liburing, &found);
    return found;
}
#endif

const char *ckptfs_transport_build_info(void)
{
#ifdef CKPTFS_HAVE_URING
    return libfuse_has_uring() ? "FUSE over io_uring: yes" : "FUSE over io_uring: no (libfuse built without it)";
#else
    return "FUSE over io_uring: no (libfuse 3.18 or later needed)";
#endif
}

/* Why FUSE over io_uring cannot serve a mount here (a static string), or NULL when it can. */
static const char *uring_unavailable(void)
{
#ifdef CKPTFS_HAVE_URING
    if (!libfuse_has_uring())
        return "this ckptfs's libfuse was built without it (scripts/libfuse318.sh builds one with it)";
    g_autofree char *knob = NULL;
    if (!g_file_get_contents(ENABLE_URING_KNOB, &knob, NULL, NULL))
        return "this kernel has no FUSE over io_uring (Linux 6.14 or later built with CONFIG_FUSE_IO_URING)";
    if (knob[0] != 'Y')
        return "the kernel has it switched off (as root: echo Y > " ENABLE_URING_KNOB ")";
    g_autofree char *disabled = NULL;
    if (g_file_get_contents("/proc/sys/kernel/io_uring_disabled", &disabled, NULL, NULL) && disabled[0] == '2')
        return "io_uring is disabled on this machine (sysctl kernel.io_uring_disabled=2)";
    return NULL;
#else
    return "this ckptfs was built with libfuse " G_STRINGIFY(FUSE_MAJOR_VERSION) "." G_STRINGIFY(
        FUSE_MINOR_VERSION) " (3.18 or later built with io_uring needed: scripts/libfuse318.sh)";
#endif
}

CkptfsTransport *ckptfs_transport_new(CkptfsUringMode mode, GError **error)
{
    const char *why = mode == CKPTFS_URING_OFF ? NULL : uring_unavailable();
    if (mode == CKPTFS_URING_ON && why != NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "io_uring=on: FUSE over io_uring is not available: %s",
                    why);
        return NULL;
    }
#ifdef CKPTFS_HAVE_URING
    /* Said once per mount where it would have been used; a build that cannot have it stays quiet. */
    if (mode == CKPTFS_URING_AUTO && why != NULL)
        fprintf(stderr, "ckptfs: serving through /dev/fuse, not FUSE over io_uring: %s\n", why);
#endif
    CkptfsTransport *t = g_new0(CkptfsTransport, 1);
    t->mode = mode;
    t->wanted = mode != CKPTFS_URING_OFF && why == NULL;
    return t;
}

const char *ckptfs_transport_session_option(const CkptfsTransport *t)
{
    return t->wanted ? ",io_uring" : "";
}

void ckptfs_transport_free(CkptfsTransport *t)
{
    g_free(t);
}

void ckptfs_transport_init(CkptfsTransport *t, const CkptfsFuseContext *ctx, struct fuse_conn_info *conn)
{
#ifdef CKPTFS_HAVE_URING
    if (!t->wanted) {
        fuse_unset_feature_flag(conn, FUSE_CAP_OVER_IO_URING);
        return;
    }
    if (!fuse_get_feature_flag(conn, FUSE_CAP_OVER_IO_URING)) {
        t->wanted = false;
        ckptfs_fuse_log(ctx, "%sthe kernel did not offer FUSE over io_uring at INIT (%s turned N since the mount "
                             "began?); serving through /dev/fuse",
                        t->mode == CKPTFS_URING_ON ? "io_uring=on: " : "", ENABLE_URING_KNOB);
    }
#else
    (void)t, (void)ctx, (void)conn;
#endif
}

uint8_t *ckptfs_transport_reply_buffer(CkptfsTransport *t, const CkptfsFuseContext *ctx, fuse_req_t req,
                                       size_t size)
{
#ifdef CKPTFS_HAVE_URING
    bool uring = fuse_req_is_uring(req);
    if (t->wanted && g_atomic_int_compare_and_exchange(&t->first_read_seen, 0, 1)) {
        if (uring)
            ckptfs_fuse_log(ctx, "transport: FUSE over io_uring");
        else /* libfuse said why on stderr ("failed to start io-uring") */
            ckptfs_fuse_log(ctx, "%slibfuse did not start its io_uring queues; serving through /dev/fuse",
                            t->mode == CKPTFS_URING_ON ? "io_uring=on: " : "");
    }
    char *payload;
    size_t payload_size;
    if (uring && fuse_req_get_payload(req, &payload, &payload_size, NULL) == 0 && payload_size >= size)
        return (uint8_t *)payload;
#else
    (void)t, (void)ctx, (void)req, (void)size;
#endif
    return NULL;
}
