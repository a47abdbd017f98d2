#include "passthrough.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckptfs/plan.h"

/* How the kernel reads an inode's opens. It refuses to mix the two modes: while one open is
 * passthrough (or cached), every other open of the inode must be the same, with the same backing
 * file. */
typedef struct {
    int id;         /* backing id from fuse_passthrough_open; 0: the opens are cached ones */
    unsigned opens; /* opens not yet released */
    bool refused;   /* the kernel refused this file: it stays cached (and is not logged again) */
} InodeMode;

struct CkptfsPassthrough {
    GMutex lock;
    GHashTable *by_ino; /* fuse_ino_t -> InodeMode*: inodes with opens, and refused ones */
    bool on;            /* cleared when the kernel refuses passthrough itself */
    bool quiet;         /* auto: a refusal of passthrough itself is not logged */
    bool open_failed;   /* a source file could not be opened for it (logged once) */
};

bool ckptfs_passthrough_built(void)
{
#ifdef CKPTFS_HAVE_PASSTHROUGH
    return true;
#else
    return false;
#endif
}

int ckptfs_passthrough_take_option(CkptfsPassthroughMode *mode, const char *item)
{
    if (strcmp(item, "passthrough") == 0) {
        *mode = CKPTFS_PASSTHROUGH_ON;
        return 1;
    }
    int value;
    int taken = ckptfs_take_auto_switch(item, "passthrough", &value);
    if (taken == 1)
        *mode = (CkptfsPassthroughMode)value;
    return taken;
}

/* Root in the kernel's eyes: root of the first user namespace (the kernel asks for CAP_SYS_ADMIN
 * there; a container's root of a namespace of its own is refused, and libfuse logs each refusal). */
static bool initial_root(void)
{
    g_autofree char *map = NULL;
    if (geteuid() != 0 || !g_file_get_contents("/proc/self/uid_map", &map, NULL, NULL))
        return false;
    unsigned long inside, outside, count;
    return sscanf(map, "%lu %lu %lu", &inside, &outside, &count) == 3 && inside == 0 && outside == 0 &&
           count == 4294967295ul;
}

CkptfsPassthrough *ckptfs_passthrough_new(CkptfsPassthroughMode mode)
{
    if (mode == CKPTFS_PASSTHROUGH_OFF || !ckptfs_passthrough_built() ||
        (mode == CKPTFS_PASSTHROUGH_AUTO && !initial_root()))
        return NULL;
    CkptfsPassthrough *pt = g_new0(CkptfsPassthrough, 1);
    g_mutex_init(&pt->lock);
    pt->by_ino = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    pt->on = true;
    pt->quiet = mode == CKPTFS_PASSTHROUGH_AUTO;
    return pt;
}

void ckptfs_passthrough_free(CkptfsPassthrough *pt)
{
    if (pt == NULL)
        return;
    g_hash_table_unref(pt->by_ino);
    g_mutex_clear(&pt->lock);
    g_free(pt);
}

bool ckptfs_passthrough_init(CkptfsPassthrough *pt, struct fuse_conn_info *conn, const char **why)
{
    if (pt == NULL)
        return false;
#ifdef CKPTFS_HAVE_PASSTHROUGH
    /* Sources may sit on overlayfs (a container's image): allow backing files one stacked file
     * system deep, at the price of nothing stacking over this mount. */
    conn->max_backing_stack_depth = FUSE_BACKING_STACKED_OVER;
    if (fuse_set_feature_flag(conn, FUSE_CAP_PASSTHROUGH))
        return true;
    *why = pt->quiet ? NULL : "the kernel does not offer FUSE passthrough (it needs Linux 6.9 or later, built with it)";
#else
    (void)conn;
    *why = pt->quiet ? NULL : "this build's libfuse has no passthrough (3.17 or later needed)";
#endif
    pt->on = false;
    return false;
}

#ifdef CKPTFS_HAVE_PASSTHROUGH
/* Errors that say the kernel will refuse every file, not just this one. */
static bool refuses_all(int err)
{
    return err == EPERM || err == EOPNOTSUPP || err == ENOTTY || err == ENOSYS;
}

/* Counts an open of MODE and tells the kernel how to read it. */
static void count_open(InodeMode *mode, struct fuse_file_info *fi)
{
    mode->opens++;
    if (mode->id > 0) {
        fi->backing_id = mode->id;
        fi->keep_cache = 0; /* the kernel refuses it with passthrough: it reads the source's pages */
    }
}
#endif

bool ckptfs_passthrough_open(CkptfsPassthrough *pt, fuse_req_t req, fuse_ino_t ino, const CkptfsPlan *plan,
                             const CkptfsSrcFiles *files, struct fuse_file_info *fi, char **refusal)
{
#ifdef CKPTFS_HAVE_PASSTHROUGH
    if (pt == NULL)
        return false;
    int64_t src = ckptfs_plan_identical_file(plan, files);
    if (src < 0)
        return false;
    uint64_t key = ino;
    g_mutex_lock(&pt->lock);
    InodeMode *mode = g_hash_table_lookup(pt->by_ino, &key);
    if (mode != NULL) { /* open already, or refused: as before */
        count_open(mode, fi);
        g_mutex_unlock(&pt->lock);
        return true;
    }
    bool try = pt->on;
    g_mutex_unlock(&pt->lock);

    /* The source is opened without the lock: on a network file system that takes a while. */
    GError *open_error = NULL;
    int fd = try ? ckptfs_srcfiles_open_fd(files, (unsigned)src, &open_error) : -1;
    int id = fd >= 0 ? fuse_passthrough_open(req, fd) : 0;
    int err = errno;
    if (fd >= 0)
        close(fd);

    g_mutex_lock(&pt->lock);
    mode = g_hash_table_lookup(pt->by_ino, &key);
    if (mode == NULL) { /* the first open of the inode: its mode is this one's */
        mode = g_new0(InodeMode, 1);
        g_hash_table_insert(pt->by_ino, g_memdup2(&key, sizeof key), mode);
        const char *path = ckptfs_srcfiles_get(files, (unsigned)src)->path;
        if (id > 0) {
            mode->id = id;
            id = 0;
        } else if (fd >= 0 && refuses_all(err) && pt->on) {
            pt->on = false;
            if (!pt->quiet)
                *refusal = g_strdup_printf("passthrough refused by the kernel (%s%s); files are read through "
                                           "the daemon from now on", g_strerror(err),
                                           err == EPERM ? ": the daemon needs CAP_SYS_ADMIN" : "");
        } else if (fd >= 0 && !refuses_all(err)) {
            mode->refused = true;
            *refusal = g_strdup_printf("%s: passthrough refused by the kernel (%s); read through the daemon",
                                       path, g_strerror(err));
        } else if (open_error != NULL && !pt->open_failed) {
            pt->open_failed = true; /* a passing failure (descriptors, network): this open only */
            *refusal = g_strdup_printf("passthrough: %s; this file is read through the daemon while it is open "
                                       "(logged once)", open_error->message);
        }
    }
    count_open(mode, fi);
    g_mutex_unlock(&pt->lock);
    if (id > 0) /* another open of the inode got there first */
        fuse_passthrough_close(req, id);
    g_clear_error(&open_error);
    return true;
#else
    (void)pt, (void)req, (void)ino, (void)plan, (void)files, (void)fi, (void)refusal;
    return false;
#endif
}

void ckptfs_passthrough_release(CkptfsPassthrough *pt, fuse_req_t req, fuse_ino_t ino)
{
#ifdef CKPTFS_HAVE_PASSTHROUGH
    uint64_t key = ino;
    int id = 0;
    g_mutex_lock(&pt->lock);
    InodeMode *mode = g_hash_table_lookup(pt->by_ino, &key);
    if (mode != NULL && mode->opens > 0 && --mode->opens == 0 && !mode->refused) {
        id = mode->id;
        g_hash_table_remove(pt->by_ino, &key); /* the next open chooses again */
    }
    g_mutex_unlock(&pt->lock);
    if (id > 0 && req != NULL) /* without a request, the id stays with the connection until unmount */
        fuse_passthrough_close(req, id);
#else
    (void)pt, (void)req, (void)ino;
#endif
}
