#include "passthrough.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "ckptfs/plan.h"

/* The backing file the kernel holds for an inode while it is open in passthrough. */
typedef struct {
    int id;         /* from fuse_passthrough_open */
    unsigned opens; /* opens not yet released */
} Backing;

struct CkptfsPassthrough {
    GMutex lock;
    GHashTable *by_ino; /* fuse_ino_t -> Backing* */
    bool on;            /* cleared by the first refusal */
};

bool ckptfs_passthrough_built(void)
{
#ifdef CKPTFS_HAVE_PASSTHROUGH
    return true;
#else
    return false;
#endif
}

CkptfsPassthrough *ckptfs_passthrough_new(bool wanted)
{
    if (!wanted || !ckptfs_passthrough_built())
        return NULL;
    CkptfsPassthrough *pt = g_new0(CkptfsPassthrough, 1);
    g_mutex_init(&pt->lock);
    pt->by_ino = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, g_free);
    pt->on = true;
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
    *why = "the kernel does not offer FUSE passthrough (it needs Linux 6.9 or later, built with it)";
#else
    (void)conn;
    *why = "this build's libfuse has no passthrough (3.17 or later needed)";
#endif
    pt->on = false;
    return false;
}

bool ckptfs_passthrough_open(CkptfsPassthrough *pt, fuse_req_t req, fuse_ino_t ino, const CkptfsPlan *plan,
                             const CkptfsSrcFiles *files, struct fuse_file_info *fi, char **refusal)
{
#ifdef CKPTFS_HAVE_PASSTHROUGH
    if (pt == NULL)
        return false;
    int64_t src = ckptfs_plan_identical_file(plan, files);
    if (src < 0)
        return false;
    g_mutex_lock(&pt->lock);
    uint64_t key = ino;
    Backing *b = g_hash_table_lookup(pt->by_ino, &key);
    /* An inode already open in passthrough stays so: the kernel refuses to mix the two modes. */
    if (b == NULL && pt->on) {
        int fd = ckptfs_srcfiles_open_fd(files, (unsigned)src, NULL);
        int id = fd >= 0 ? fuse_passthrough_open(req, fd) : 0;
        int why = errno;
        if (fd >= 0)
            close(fd);
        if (id > 0) {
            b = g_new0(Backing, 1);
            b->id = id;
            g_hash_table_insert(pt->by_ino, g_memdup2(&key, sizeof key), b);
        } else if (fd >= 0) {
            pt->on = false;
            *refusal = g_strdup_printf("passthrough refused by the kernel (%s%s); files are read through the "
                                       "daemon from now on", g_strerror(why),
                                       why == EPERM ? ": the daemon needs CAP_SYS_ADMIN" : "");
        }
    }
    if (b != NULL) {
        b->opens++;
        fi->backing_id = b->id;
        fi->keep_cache = 0; /* the kernel reads the source's own page cache */
    }
    g_mutex_unlock(&pt->lock);
    return b != NULL;
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
    Backing *b = g_hash_table_lookup(pt->by_ino, &key);
    if (b != NULL && --b->opens == 0) {
        id = b->id;
        g_hash_table_remove(pt->by_ino, &key);
    }
    g_mutex_unlock(&pt->lock);
    if (id > 0)
        fuse_passthrough_close(req, id);
#else
    (void)pt, (void)req, (void)ino;
#endif
}
