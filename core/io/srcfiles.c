#include "ckptfs/srcfiles.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/container.h"
#include "ckptfs/error.h"
#include "ckptfs/options.h"
#include "ckptfs/readfile.h"
#include "srcfiles_internal.h"

/* Descriptors left to the rest of the process (FUSE, stdio, libraries) besides the cache. */
#define FDS_RESERVED 64u
#define MAX_OPEN_DEFAULT 65536u
/* Threads decoding frames of packed files ahead of their readers, at most (one per CPU). */
#define DECODERS_MAX 16u

static void decode_ahead(gpointer job, gpointer user_data);

static void srcfile_free(gpointer data)
{
    SrcFile *f = data;
    if (f->fd >= 0)
        close(f->fd);
    ckptfs_container_free(f->container);
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
    g_mutex_init(&files->lock);
    g_queue_init(&files->open);
    files->max_open = max_open ? max_open : default_max_open();
    files->frames = ckptfs_frame_cache_new(CKPTFS_FRAME_CACHE_DEFAULT);
    return files;
}

void ckptfs_srcfiles_free(CkptfsSrcFiles *files)
{
    if (files == NULL)
        return;
    ckptfs_srcfiles_map_stop(files);
    if (files->decoders != NULL) /* queued frames dropped, running ones finished */
        g_thread_pool_free(files->decoders, TRUE, TRUE);
    g_ptr_array_unref(files->files);
    g_hash_table_unref(files->by_path);
    g_queue_clear(&files->open);
    g_mutex_clear(&files->lock);
    ckptfs_frame_cache_free(files->frames);
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

/* Under the lock: closes least recently used descriptors no read is using until KEEP are left
 * (or only ones in use). */
static void trim_open(CkptfsSrcFiles *files, unsigned keep)
{
    for (GList *l = files->open.tail; l != NULL && files->open.length > keep;) {
        GList *prev = l->prev;
        SrcFile *f = l->data;
        if (f->pins == 0) {
            close(f->fd);
            f->fd = -1;
            g_queue_delete_link(&files->open, l);
            f->lru = NULL;
        }
        l = prev;
    }
}

/* Room for one more. When every open one is in use, the cache goes over its size for a while. */
static void make_room(CkptfsSrcFiles *files)
{
    trim_open(files, files->max_open - 1);
}

void ckptfs_srcfiles_let_go(CkptfsSrcFiles *files)
{
    ckptfs_srcfiles_map_stop(files);
    g_mutex_lock(&files->lock);
    trim_open(files, 0);
    g_mutex_unlock(&files->lock);
}

static void cache_insert(CkptfsSrcFiles *files, SrcFile *f, int fd)
{
    make_room(files);
    f->fd = fd;
    g_queue_push_head(&files->open, f);
    f->lru = files->open.head;
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

/* A WILLNEED advice reads at most the file's read-ahead (or the device's optimal I/O size, if
 * larger) and drops the rest: longer ranges are advised in chunks of the file's read-ahead, or
 * of the smallest one a device has by default where it is not known. */
#define ADVISE_CHUNK_MIN (128u << 10)

/* cachestat(2) (Linux 6.5; one number on every architecture): pages of a range in the page
 * cache, without reading or reading ahead. Laid out as <linux/mman.h> has them. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cachestat_range_arg {
    uint64_t off, len;
};
struct cachestat_result {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* Whether every page of [OFFSET, OFFSET + LEN) of F is in the page cache. False where the kernel
 * does not say: before 6.5 (FILES then stops asking), and since 6.14 for a file the process
 * neither owns nor may write (F then stops asking). */
static bool range_cached(const CkptfsSrcFiles *files, SrcFile *f, uint64_t offset, uint64_t len)
{
    gint *no_syscall = (gint *)&files->no_cachestat;
    if (g_atomic_int_get(no_syscall) || g_atomic_int_get(&f->no_cachestat))
        return false;
    uint64_t page = (uint64_t)getpagesize();
    struct cachestat_range_arg range = {offset, len};
    struct cachestat_result stat = {0};
    if (syscall(__NR_cachestat, f->fd, &range, &stat, 0) != 0) {
        g_atomic_int_set(errno == ENOSYS ? no_syscall : &f->no_cachestat, 1);
        return false;
    }
    return stat.nr_cache >= (offset + len + page - 1) / page - offset / page;
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
    /* A packed file is read as the file it holds. */
    uint8_t magic[CKPTFS_CONTAINER_MAGIC_LEN];
    CkptfsContainer *container = NULL;
    if ((uint64_t)st.st_size >= sizeof magic && pread(fd, magic, sizeof magic, 0) == (ssize_t)sizeof magic &&
        ckptfs_container_magic(magic, sizeof magic)) {
        container = ckptfs_container_open(fd, (uint64_t)st.st_size, path, error);
        if (container == NULL) {
            close(fd);
            return -1;
        }
    }
    SrcFile *f = g_new0(SrcFile, 1);
    f->pub.path = g_strdup(path);
    f->disk_size = (uint64_t)st.st_size;
    f->container = container;
    f->pub.size = container ? ckptfs_container_size(container) : (uint64_t)st.st_size;
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
    g_mutex_lock(&files->lock);
    files->packed |= container != NULL;
    files->off_disk |= f->fs_kind != SRC_FS_DISK;
    g_ptr_array_add(files->files, f);
    cache_insert(files, f, fd);
    g_mutex_unlock(&files->lock);
    int index = (int)files->files->len - 1;
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
    CkptfsSrcFiles *mutable = (CkptfsSrcFiles *)files;
    g_mutex_lock(&mutable->lock);
    unsigned n = files->open.length;
    g_mutex_unlock(&mutable->lock);
    return n;
}

/* F's path opened again: a descriptor of the file first opened, or -1 with *OPEN_ERROR set when it
 * cannot be opened, or -2 when it names another file now (replaced, rewritten: nothing kept open). */
static int reopen(const SrcFile *f, GError **open_error)
{
    struct stat st;
    int fd = ckptfs_open_regular(f->pub.path, &st, open_error);
    if (fd >= 0 && !ckptfs_srcfile_same(f, &st)) {
        close(fd);
        return -2;
    }
    return fd;
}

/* reopen, with a file gone, replaced or no longer regular reported as changed (the file then
 * stays refused). */
static int reopen_checked(SrcFile *f, GError **error)
{
    GError *open_error = NULL;
    int fd = reopen(f, &open_error);
    if (fd == -2 || (fd < 0 && (open_error->code == CKPTFS_ERROR_NOT_FOUND || open_error->code == CKPTFS_ERROR_FORMAT))) {
        g_clear_error(&open_error);
        return ckptfs_srcfile_report_changed(f, error), -1;
    }
    if (fd < 0)
        g_propagate_error(error, open_error);
    return fd;
}

/* The descriptor of file INDEX, pinned until release_fd; opened again (and checked to be the
 * same file) when the cache had closed it. */
static int acquire_fd(const CkptfsSrcFiles *cfiles, unsigned index, SrcFile **out, GError **error)
{
    CkptfsSrcFiles *files = (CkptfsSrcFiles *)cfiles; /* the cache changes; the set does not */
    if (index >= files->files->len) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "source file #%u does not exist", index);
        return -1;
    }
    SrcFile *f = g_ptr_array_index(files->files, index);
    *out = f;
    if (g_atomic_int_get(&f->changed))
        return ckptfs_srcfile_report_changed(f, error), -1;
    g_mutex_lock(&files->lock);
    if (f->fd >= 0) {
        f->pins++;
        g_queue_unlink(&files->open, f->lru);
        g_queue_push_head_link(&files->open, f->lru);
        int fd = f->fd;
        g_mutex_unlock(&files->lock);
        return fd;
    }
    int fd = reopen_checked(f, error);
    if (fd < 0) {
        g_mutex_unlock(&files->lock);
        return -1;
    }
    cache_insert(files, f, fd);
    f->pins++;
    g_mutex_unlock(&files->lock);
    return fd;
}

static void release_fd(const CkptfsSrcFiles *cfiles, SrcFile *f)
{
    CkptfsSrcFiles *files = (CkptfsSrcFiles *)cfiles;
    g_mutex_lock(&files->lock);
    f->pins--;
    g_mutex_unlock(&files->lock);
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
    return ckptfs_srcfile_same(f, &st) || ckptfs_srcfile_report_changed(f, error);
}

static bool read_failed(SrcFile *f, ssize_t got, uint64_t offset, GError **error)
{
    if (got == 0 && offset >= f->pub.size)
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO,
                    "%s: read at offset %" G_GUINT64_FORMAT " is past its end (%" G_GUINT64_FORMAT
                    " bytes)", f->pub.path, offset, f->pub.size);
    else if (got < 0)
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO,
                    "%s: read at offset %" G_GUINT64_FORMAT " failed: %s", f->pub.path, offset,
                    g_strerror(errno));
    else
        ckptfs_srcfile_report_changed(f, error); /* it ends before the size it had */
    return false;
}

static uint64_t frame_key(unsigned index, uint64_t i)
{
    return (uint64_t)index << 32 | i; /* frames < 2^24 */
}

/* Decodes frame I of packed file F (read from FD) into a buffer of the cache (*OUT, *OUT_CAP). */
static bool decode_frame(const CkptfsSrcFiles *files, SrcFile *f, int fd, uint64_t i, uint8_t **out,
                         size_t *out_cap, GError **error)
{
    const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
    size_t work_cap = 0;
    uint8_t *work = ckptfs_frame_cache_buffer(files->frames, (size_t)e->clength + e->ulength, &work_cap);
    *out = ckptfs_frame_cache_buffer(files->frames, e->ulength, out_cap);
    GError *why = NULL;
    bool ok = work != NULL && *out != NULL;
    if (!ok)
        g_set_error(&why, CKPTFS_ERROR, CKPTFS_ERROR_IO, "out of memory");
    int rc = ok ? ckptfs_pread_full(fd, work, e->clength, e->coffset) : 0;
    if (rc != 0) {
        g_set_error(&why, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s", rc > 0 ? g_strerror(rc) : "the file ends early");
        ok = false;
    }
    const CkptfsCodecInfo *codec = ckptfs_codec(e->codec); /* known: the container's index is checked */
    void *decoder = ok ? ckptfs_frame_cache_decoder(files->frames, codec) : NULL;
    ok = ok && ckptfs_frame_decode_with(e, work, *out, work + e->clength, decoder, &why);
    ckptfs_frame_cache_decoder_done(files->frames, codec, decoder);
    ckptfs_frame_cache_recycle(files->frames, work, work_cap);
    if (!ok) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO,
                    "%s: packed frame %" G_GUINT64_FORMAT " (original bytes [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    ")): %s", f->pub.path, i, e->uoffset, e->uoffset + e->ulength, why->message);
        g_error_free(why);
        ckptfs_frame_cache_recycle(files->frames, *out, *out_cap);
        *out = NULL;
    }
    return ok;
}

/* Frame I of packed file F (index INDEX) decoded, from the cache (waiting for a thread decoding
 * it) or now; held until released. */
static const uint8_t *container_frame(const CkptfsSrcFiles *files, unsigned index, SrcFile *f, int fd,
                                      uint64_t i, gpointer *hold, GError **error)
{
    uint64_t key = frame_key(index, i);
    const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
    const uint8_t *data = ckptfs_frame_cache_get_or_claim(files->frames, key, e->ulength, hold);
    if (data != NULL)
        return data;
    uint8_t *out;
    size_t out_cap;
    if (!decode_frame(files, f, fd, i, &out, &out_cap, error)) {
        ckptfs_frame_cache_abandon(files->frames, key);
        return NULL;
    }
    return ckptfs_frame_cache_put(files->frames, key, out, e->ulength, out_cap, hold);
}

/* A decoder thread's job: the frame of KEY (claimed) into the cache. A frame that fails is left
 * to its reader, which decodes it again and reports why. */
static void decode_ahead(gpointer job, gpointer user_data)
{
    const CkptfsSrcFiles *files = user_data;
    uint64_t key = *(uint64_t *)job;
    g_free(job); /* the pool frees only the jobs it drops */
    if (!ckptfs_frame_cache_start(files->frames, key))
        return; /* a reader took it over meanwhile */
    unsigned index = (unsigned)(key >> 32);
    uint64_t i = key & 0xffffffffu; /* frame_key's halves */
    SrcFile *f;
    int fd = acquire_fd(files, index, &f, NULL);
    uint8_t *out = NULL;
    size_t out_cap;
    if (fd >= 0 && decode_frame(files, f, fd, i, &out, &out_cap, NULL))
        ckptfs_frame_cache_put(files->frames, key, out, ckptfs_container_frame(f->container, i)->ulength, out_cap, NULL);
    else
        ckptfs_frame_cache_abandon(files->frames, key);
    if (fd >= 0)
        release_fd(files, f);
}

/* LEN original bytes at OFFSET of packed file F, frame by frame. */
static bool container_read(const CkptfsSrcFiles *files, unsigned index, SrcFile *f, int fd, uint8_t *buf,
                           size_t len, uint64_t offset, GError **error)
{
    if (offset > f->pub.size || len > f->pub.size - offset)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: read of %zu bytes at offset %" G_GUINT64_FORMAT
                           " is past its end (%" G_GUINT64_FORMAT " bytes)", f->pub.path, len, offset, f->pub.size);
    for (uint64_t i = len ? ckptfs_container_frame_at(f->container, offset) : 0; len > 0; i++) {
        const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
        gpointer hold;
        const uint8_t *data = container_frame(files, index, f, fd, i, &hold, error);
        if (data == NULL)
            return false;
        size_t skip = (size_t)(offset - e->uoffset), n = MIN(len, (size_t)e->ulength - skip);
        memcpy(buf, data + skip, n);
        ckptfs_frame_cache_release(files->frames, hold);
        buf += n, len -= n, offset += n;
    }
    return true;
}

/* The frames of packed file F (index INDEX) holding [OFFSET, OFFSET + LEN) go to the decoder
 * threads, those not decoded or claimed yet, while the cache has room for them. */
static void advise_frames(const CkptfsSrcFiles *cfiles, unsigned index, SrcFile *f, uint64_t offset, uint64_t len)
{
    CkptfsSrcFiles *files = (CkptfsSrcFiles *)cfiles; /* the pool is made on first use */
    if (offset >= f->pub.size)
        return;
    GThreadPool *decoders = g_atomic_pointer_get(&files->decoders);
    if (decoders == NULL) {
        g_mutex_lock(&files->lock);
        if (files->decoders == NULL)
            g_atomic_pointer_set(&files->decoders,
                                 g_thread_pool_new_full(decode_ahead, files, g_free,
                                                        (gint)MIN(g_get_num_processors(), DECODERS_MAX), FALSE, NULL));
        decoders = files->decoders;
        g_mutex_unlock(&files->lock);
    }
    uint64_t end = MIN(offset + len, f->pub.size);
    uint64_t last = ckptfs_container_frame_at(f->container, end - 1);
    for (uint64_t i = ckptfs_container_frame_at(f->container, offset); i <= last; i++) {
        uint64_t key = frame_key(index, i);
        if (!ckptfs_frame_cache_claim(files->frames, key, ckptfs_container_frame(f->container, i)->ulength))
            continue;
        /* Queued even when no thread can be started now: its reader then takes the claim over. */
        g_thread_pool_push(decoders, g_memdup2(&key, sizeof key), NULL);
    }
}

void ckptfs_srcfiles_advise(const CkptfsSrcFiles *files, unsigned index, uint64_t offset, uint64_t len)
{
    SrcFile *f;
    if (len == 0 || acquire_fd(files, index, &f, NULL) < 0)
        return;
    if (f->container)
        advise_frames(files, index, f, offset, len);
    else if (!range_cached(files, f, offset, len)) { /* a cached range's advice is pure cost */
        uint64_t chunk = f->read_ahead == SRC_READ_AHEAD_UNKNOWN ? ADVISE_CHUNK_MIN
                                                                 : MAX(f->read_ahead, ADVISE_CHUNK_MIN);
        for (uint64_t at = offset; at - offset < len; at += chunk)
            posix_fadvise(f->fd, (off_t)at, (off_t)MIN(chunk, offset + len - at), POSIX_FADV_WILLNEED);
    }
    release_fd(files, f);
}

uint64_t ckptfs_srcfiles_prefetch_window(const CkptfsSrcFiles *files, uint64_t option)
{
    if (option != CKPTFS_PREFETCH_AUTO)
        return option;
    if (files->packed)
        return CKPTFS_PREFETCH_PACKED;
    return files->off_disk || files->files->len == 0 ? 0 : CKPTFS_PREFETCH_DISK;
}

uint64_t ckptfs_srcfiles_frames_decoded(const CkptfsSrcFiles *files)
{
    return ckptfs_frame_cache_decoded(files->frames);
}

void ckptfs_srcfiles_set_frame_cache(CkptfsSrcFiles *files, uint64_t bytes)
{
    ckptfs_frame_cache_set_budget(files->frames, bytes);
}

uint32_t ckptfs_srcfiles_largest_frame(const CkptfsSrcFiles *files, unsigned *index)
{
    uint32_t largest = 0;
    for (guint i = 0; i < files->files->len; i++) {
        const SrcFile *f = g_ptr_array_index(files->files, i);
        if (f->container != NULL && ckptfs_container_largest_frame(f->container) > largest) {
            largest = ckptfs_container_largest_frame(f->container);
            *index = i;
        }
    }
    return largest;
}

bool ckptfs_srcfiles_container_stats(const CkptfsSrcFiles *files, unsigned index, CkptfsContainerStats *out)
{
    const SrcFile *f = index < files->files->len ? g_ptr_array_index(files->files, index) : NULL;
    if (f == NULL || f->container == NULL)
        return false;
    ckptfs_container_stats(f->container, out);
    return true;
}

bool ckptfs_srcfiles_pread(const CkptfsSrcFiles *files, unsigned index, void *buf, size_t len,
                           uint64_t offset, GError **error)
{
    struct iovec iov = {buf, len};
    return ckptfs_srcfiles_preadv(files, index, &iov, 1, offset, error);
}

/* Reads the contiguous range at OFFSET of plain file F through FD into IOV[0..N), retrying short
 * reads, then checks the file is still the one first opened. */
static bool read_plain(SrcFile *f, int fd, struct iovec *iov, int n, uint64_t offset, GError **error)
{
    bool ok = true;
    while (n > 0) {
        ssize_t got = n == 1 ? pread(fd, iov->iov_base, iov->iov_len, (off_t)offset)
                             : preadv(fd, iov, n, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            ok = read_failed(f, got, offset, error);
            break;
        }
        offset += (uint64_t)got;
        /* Drop the buffers filled; shorten the one filled in part. */
        while (n > 0 && (size_t)got >= iov->iov_len) {
            got -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (uint8_t *)iov->iov_base + got;
            iov->iov_len -= (size_t)got;
        }
    }
    return ok && ckptfs_srcfile_check_fd(f, fd, error);
}

bool ckptfs_srcfiles_preadv(const CkptfsSrcFiles *files, unsigned index, struct iovec *iov, int n,
                            uint64_t offset, GError **error)
{
    return ckptfs_srcfiles_preadv_with(files, NULL, index, iov, n, offset, error);
}

/* Descriptors of one reader: its own open file description per plain source file, so that
 * the kernel's read-ahead of each file, and a streaming client under it (an object-store FUSE
 * mount), see that reader's own sequence of reads rather than all readers' interleaved. */
struct CkptfsSrcReader {
    const CkptfsSrcFiles *files;
    GMutex lock;
    GHashTable *fds; /* index + 1 -> fd + 1 */
};
/* At most this many descriptors per reader; past it, and where opening fails, the shared one. */
#define READER_FDS_MAX 64u

CkptfsSrcReader *ckptfs_src_reader_new(const CkptfsSrcFiles *files)
{
    CkptfsSrcReader *r = g_new0(CkptfsSrcReader, 1);
    r->files = files;
    g_mutex_init(&r->lock);
    r->fds = g_hash_table_new(g_direct_hash, g_direct_equal);
    return r;
}

void ckptfs_src_reader_free(CkptfsSrcReader *r)
{
    if (r == NULL)
        return;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, r->fds);
    while (g_hash_table_iter_next(&it, NULL, &value))
        close(GPOINTER_TO_INT(value) - 1);
    g_hash_table_unref(r->fds);
    g_mutex_clear(&r->lock);
    g_free(r);
}

unsigned ckptfs_src_reader_open_count(CkptfsSrcReader *r)
{
    g_mutex_lock(&r->lock);
    unsigned n = g_hash_table_size(r->fds);
    g_mutex_unlock(&r->lock);
    return n;
}

/* R's descriptor of plain file F (index INDEX), opened on first use and checked to be the file
 * first opened; -1 where the shared descriptor is to be used instead. */
static int reader_fd(CkptfsSrcReader *r, unsigned index, SrcFile *f)
{
    g_mutex_lock(&r->lock);
    gpointer known = g_hash_table_lookup(r->fds, GUINT_TO_POINTER(index + 1));
    int fd = known ? GPOINTER_TO_INT(known) - 1 : -1;
    if (known == NULL && g_hash_table_size(r->fds) < READER_FDS_MAX) {
        fd = reopen(f, NULL);
        if (fd == -2) { /* replaced since the mount: every read fails from now on */
            ckptfs_srcfile_report_changed(f, NULL);
            fd = -1;
        }
        if (fd >= 0)
            g_hash_table_insert(r->fds, GUINT_TO_POINTER(index + 1), GINT_TO_POINTER(fd + 1));
    }
    g_mutex_unlock(&r->lock);
    return fd;
}

bool ckptfs_srcfiles_preadv_with(const CkptfsSrcFiles *files, CkptfsSrcReader *reader, unsigned index,
                                 struct iovec *iov, int n, uint64_t offset, GError **error)
{
    /* Nothing to read (an empty zip record): done, and not an early end of the file. */
    while (n > 0 && iov->iov_len == 0)
        iov++, n--;
    if (n == 0)
        return index < files->files->len || ckptfs_fail(error, CKPTFS_ERROR_IO, "source file #%u does not exist", index);
    if (reader != NULL && index < files->files->len) {
        SrcFile *f = g_ptr_array_index(files->files, index);
        int fd = f->container || g_atomic_int_get(&f->changed) ? -1 : reader_fd(reader, index, f);
        if (fd >= 0)
            return read_plain(f, fd, iov, n, offset, error);
    }
    SrcFile *f;
    int fd = acquire_fd(files, index, &f, error);
    if (fd < 0)
        return false;
    bool ok = true;
    for (; f->container && ok && n > 0; iov++, n--) {
        ok = container_read(files, index, f, fd, iov->iov_base, iov->iov_len, offset, error);
        offset += iov->iov_len;
    }
    ok = ok && (n == 0 ? ckptfs_srcfile_check_fd(f, fd, error) : read_plain(f, fd, iov, n, offset, error));
    release_fd(files, f);
    return ok;
}

int ckptfs_srcfiles_open_fd(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    if (index >= files->files->len)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "source file #%u does not exist", index), -1;
    SrcFile *f = g_ptr_array_index(files->files, index);
    if (g_atomic_int_get(&f->changed))
        return ckptfs_srcfile_report_changed(f, error), -1;
    return reopen_checked(f, error);
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
    return ckptfs_srcfile_same(f, &st) || ckptfs_srcfile_report_changed(f, error);
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
