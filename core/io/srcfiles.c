#include "ckptfs/srcfiles.h"

/* The set of source files: their indexes, identity checks and access bits. How a file's bytes
 * are read is its backend's (srcplain.c, srcpacked.c), picked when the file is added. */
#include <errno.h>
#include <linux/magic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/options.h"
#include "ckptfs/readfile.h"
#include "srcfiles_internal.h"

/* Descriptors left to the rest of the process (FUSE, stdio, libraries) besides the cache. */
#define FDS_RESERVED 64u
#define MAX_OPEN_DEFAULT 65536u

/* The backends, tried in this order when a file is added: the first whose open takes it. */
static const SrcBackend *const backends[] = {&ckptfs_src_packed, &ckptfs_src_plain};

static void srcfile_free(gpointer data)
{
    SrcFile *f = data;
    if (f->fd >= 0)
        close(f->fd);
    if (f->backend != NULL)
        f->backend->close(f);
    g_free(f->pub.path);
    g_free(f);
}

uint64_t ckptfs_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : (uint64_t)rl.rlim_cur;
}

/* Half the descriptors the process may still open, so that other mounts and sources in the
 * same process (tests, the CLI) have room too. */
static unsigned default_max_open(void)
{
    struct rlimit rl;
    uint64_t limit = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 1024;
    uint64_t n = limit > 2 * FDS_RESERVED ? (limit - FDS_RESERVED) / 2 : 8;
    return (unsigned)MIN(n, (uint64_t)MAX_OPEN_DEFAULT);
}

CkptfsSrcFiles *ckptfs_srcfiles_new(unsigned max_open)
{
    CkptfsSrcFiles *files = g_new0(CkptfsSrcFiles, 1);
    files->files = g_ptr_array_new_with_free_func(srcfile_free);
    files->by_path = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    files->fds = ckptfs_srcfd_new(max_open ? max_open : default_max_open());
    files->plain = g_new0(SrcPlainSet, 1);
    g_mutex_init(&files->plain->maps.lock);
    files->plain->maps.held_max = MAX(ckptfs_srcfd_max_open(files->fds) / 2, 1u);
    files->packed_set = ckptfs_srcpacked_set_new();
    return files;
}

void ckptfs_srcfiles_free(CkptfsSrcFiles *files)
{
    if (files == NULL)
        return;
    ckptfs_srcfiles_map_stop(files);
    ckptfs_srcpacked_set_free(files->packed_set); /* its decoders read files of the set */
    g_ptr_array_unref(files->files);
    g_hash_table_unref(files->by_path);
    ckptfs_srcfd_free(files->fds);
    g_mutex_clear(&files->plain->maps.lock);
    g_free(files->plain);
    g_free(files);
}

static int64_t ns(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

bool ckptfs_srcfile_same(const SrcFile *file, const struct stat *st)
{
    const CkptfsSrcFile *f = &file->pub;
    return st->st_ino == f->ino && st->st_dev == f->dev && (uint64_t)st->st_size == file->disk_size &&
           ns(&st->st_mtim) == f->mtime_ns && ns(&st->st_ctim) == f->ctime_ns;
}

bool ckptfs_srcfile_report_changed(SrcFile *f, GError **error)
{
    g_atomic_int_set(&f->changed, 1);
    struct stat st;
    if (error != NULL && stat(f->pub.path, &st) != 0 && errno == ENOENT)
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_CHANGED,
                    "%s: source file removed after the mount (a checkpoint deleted, or renamed away); "
                    "its views fail from now on", f->pub.path);
    else
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_CHANGED,
                    "%s: source file changed after the mount (inode, size, mtime or ctime differ); "
                    "remount to serve the new contents",
                    f->pub.path);
    return false;
}

void ckptfs_srcfiles_let_go(CkptfsSrcFiles *files)
{
    ckptfs_srcfiles_map_stop(files);
    ckptfs_srcfd_trim(files->fds, 0);
}

static SrcFsKind fs_kind(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return SRC_FS_OTHER;
    switch ((unsigned long)sf.f_type) {
    case EXT4_SUPER_MAGIC: /* ext2, ext3 too */
    case XFS_SUPER_MAGIC:
    case BTRFS_SUPER_MAGIC:
    case F2FS_SUPER_MAGIC:
        return SRC_FS_DISK;
    case TMPFS_MAGIC:
        return SRC_FS_MEMORY;
    default:
        return SRC_FS_OTHER;
    }
}

/* The read-ahead of the device holding the file ST describes (its read_ahead_kb), in bytes;
 * SRC_READ_AHEAD_UNKNOWN where sysfs does not say (a file system over several devices, or none). */
static uint64_t read_ahead(const struct stat *st)
{
    g_autofree char *disk = g_strdup_printf("/sys/dev/block/%u:%u/queue/read_ahead_kb", major(st->st_dev),
                                            minor(st->st_dev));
    g_autofree char *part = g_strdup_printf("/sys/dev/block/%u:%u/../queue/read_ahead_kb", major(st->st_dev),
                                            minor(st->st_dev));
    g_autofree char *text = NULL;
    if (!g_file_get_contents(disk, &text, NULL, NULL) && !g_file_get_contents(part, &text, NULL, NULL))
        return SRC_READ_AHEAD_UNKNOWN;
    return MIN(g_ascii_strtoull(text, NULL, 10), (uint64_t)1 << 20) * 1024;
}

int ckptfs_srcfiles_add(CkptfsSrcFiles *files, const char *path, GError **error)
{
    gpointer known = g_hash_table_lookup(files->by_path, path);
    if (known != NULL)
        return GPOINTER_TO_INT(known) - 1;
    struct stat st;
    int fd = ckptfs_open_regular(path, &st, error);
    if (fd < 0)
        return -1;
    SrcFile *f = g_new0(SrcFile, 1);
    f->pub.path = g_strdup(path);
    f->index = files->files->len;
    f->disk_size = (uint64_t)st.st_size;
    f->pub.mtime_ns = ns(&st.st_mtim);
    f->pub.ctime_ns = ns(&st.st_ctim);
    f->pub.ino = st.st_ino;
    f->pub.dev = st.st_dev;
    f->pub.uid = st.st_uid;
    f->pub.gid = st.st_gid;
    f->pub.mode = st.st_mode & 07777;
    f->fd = -1;
    f->lease_fd = -1;
    f->fs_kind = fs_kind(fd);
    f->read_ahead = f->fs_kind == SRC_FS_DISK ? read_ahead(&st) : SRC_READ_AHEAD_UNKNOWN;
    int taken = 0;
    for (size_t b = 0; taken == 0 && b < G_N_ELEMENTS(backends); b++) {
        taken = backends[b]->open(f, fd, &st, error);
        if (taken > 0)
            f->backend = backends[b];
    }
    if (taken < 0) {
        close(fd);
        srcfile_free(f);
        return -1;
    }
    files->packed |= f->backend->decoded;
    files->off_disk |= f->fs_kind != SRC_FS_DISK;
    g_ptr_array_add(files->files, f);
    ckptfs_srcfd_insert(files->fds, f, fd);
    int index = (int)f->index;
    g_hash_table_insert(files->by_path, g_strdup(path), GINT_TO_POINTER(index + 1));
    return index;
}

unsigned ckptfs_srcfiles_count(const CkptfsSrcFiles *files)
{
    return files->files->len;
}

const CkptfsSrcFile *ckptfs_srcfiles_get(const CkptfsSrcFiles *files, unsigned index)
{
    return index < files->files->len ? &((SrcFile *)g_ptr_array_index(files->files, index))->pub
                                     : NULL;
}

unsigned ckptfs_srcfiles_open_count(const CkptfsSrcFiles *files)
{
    return ckptfs_srcfd_open_count(files->fds);
}

/* F's path opened again: a descriptor of the file first opened, or -1 with *OPEN_ERROR set when it
 * cannot be opened, or -2 when it names another file now (replaced, rewritten: nothing kept open). */
int ckptfs_srcfile_reopen(const SrcFile *f, GError **open_error)
{
    struct stat st;
    int fd = ckptfs_open_regular(f->pub.path, &st, open_error);
    if (fd >= 0 && !f->backend->same(f, &st)) {
        close(fd);
        return -2;
    }
    return fd;
}

/* reopen, with a file gone, replaced or no longer regular reported as changed (the file then
 * stays refused). */
int ckptfs_srcfile_reopen_checked(SrcFile *f, GError **error)
{
    GError *open_error = NULL;
    int fd = ckptfs_srcfile_reopen(f, &open_error);
    if (fd == -2 || (fd < 0 && (open_error->code == CKPTFS_ERROR_NOT_FOUND || open_error->code == CKPTFS_ERROR_FORMAT))) {
        g_clear_error(&open_error);
        return ckptfs_srcfile_report_changed(f, error), -1;
    }
    if (fd < 0)
        g_propagate_error(error, open_error);
    return fd;
}

/* After a read: the bytes are the file's as first opened only if nothing changed it (a
 * writer's timestamps change before its data does). */
bool ckptfs_srcfile_check_fd(SrcFile *f, int fd, GError **error)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot stat: %s", f->pub.path,
                    g_strerror(errno));
        return false;
    }
    return f->backend->same(f, &st) || ckptfs_srcfile_report_changed(f, error);
}

bool ckptfs_srcfiles_pread(const CkptfsSrcFiles *files, unsigned index, void *buf, size_t len,
                           uint64_t offset, GError **error)
{
    struct iovec iov = {buf, len};
    return ckptfs_srcfiles_read(CKPTFS_READ_SHARED(files), index, &iov, 1, offset, error);
}

SrcFile *ckptfs_srcfiles_file(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    if (index < files->files->len)
        return g_ptr_array_index(files->files, index);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "source file #%u does not exist", index);
    return NULL;
}

bool ckptfs_srcfiles_read(const CkptfsReadCtx *ctx, unsigned index, struct iovec *iov, int n, uint64_t offset,
                          GError **error)
{
    SrcFile *f = ckptfs_srcfiles_file(ctx->files, index, error);
    if (f == NULL)
        return false;
    /* Nothing to read (an empty zip record): done, and not an early end of the file. */
    while (n > 0 && iov->iov_len == 0)
        iov++, n--;
    return n == 0 || f->backend->preadv(ctx->files, f, ctx->reader, iov, n, offset, error);
}

void ckptfs_srcfiles_advise(const CkptfsSrcFiles *files, unsigned index, uint64_t offset, uint64_t len)
{
    SrcFile *f = ckptfs_srcfiles_file(files, index, NULL);
    if (len > 0 && f != NULL)
        f->backend->advise(files, f, offset, len);
}

uint64_t ckptfs_srcfiles_prefetch_window(const CkptfsSrcFiles *files, uint64_t option)
{
    if (option != CKPTFS_PREFETCH_AUTO)
        return option;
    if (files->packed)
        return CKPTFS_PREFETCH_PACKED;
    return files->off_disk || files->files->len == 0 ? 0 : CKPTFS_PREFETCH_DISK;
}

bool ckptfs_srcfiles_as_stored(const CkptfsSrcFiles *files, unsigned index)
{
    const SrcFile *f = ckptfs_srcfiles_file(files, index, NULL);
    return f != NULL && !f->backend->decoded;
}

int ckptfs_srcfiles_open_fd(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    SrcFile *f = ckptfs_srcfiles_file(files, index, error);
    if (f == NULL)
        return -1;
    if (g_atomic_int_get(&f->changed))
        return ckptfs_srcfile_report_changed(f, error), -1;
    return ckptfs_srcfile_reopen_checked(f, error);
}

bool ckptfs_srcfiles_unchanged(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    if (index >= files->files->len)
        return false;
    SrcFile *f = g_ptr_array_index(files->files, index);
    struct stat st;
    if (g_atomic_int_get(&f->changed))
        return ckptfs_srcfile_report_changed(f, error);
    if (stat(f->pub.path, &st) != 0) {
        /* Gone is a change; another failure (EIO, ESTALE on a network file system) may pass, and
         * must not refuse the file for the rest of the mount. */
        if (errno == ENOENT || errno == ENOTDIR)
            return ckptfs_srcfile_report_changed(f, error);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot stat: %s", f->pub.path, g_strerror(errno));
        return false;
    }
    return f->backend->same(f, &st) || ckptfs_srcfile_report_changed(f, error);
}

CkptfsAccess ckptfs_srcfiles_access(const CkptfsSrcFiles *files, const uint32_t *indexes,
                                    unsigned n, uint32_t daemon_uid, uint32_t daemon_gid)
{
    unsigned count = n ? n : files->files->len;
    CkptfsAccess a = {.mode = 0444};
    bool one_uid = true, one_gid = true;
    for (unsigned i = 0; i < count; i++) {
        const CkptfsSrcFile *f = ckptfs_srcfiles_get(files, n ? indexes[i] : i);
        if (f == NULL)
            continue;
        if (i == 0)
            a.uid = f->uid, a.gid = f->gid;
        one_uid &= f->uid == a.uid;
        one_gid &= f->gid == a.gid;
        a.mode &= f->mode;
    }
    if (count == 0)
        a.uid = daemon_uid, a.gid = daemon_gid;
    if (!one_uid) {
        a.uid = daemon_uid;
        a.mode |= 0400;
    }
    if (!one_gid) {
        a.gid = daemon_gid;
        a.mode = (a.mode & ~0040u) | ((a.mode & 0004) << 3);
    }
    return a;
}
