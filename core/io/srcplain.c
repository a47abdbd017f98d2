/* The plain backend: a source file read as it is stored, through the set's descriptor cache
 * (srcfd.c) or a reader's own descriptors, advised to the page cache ahead of its readers, and
 * mapped under a read lease for replies written from its pages (srcmap.c). */
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "srcfiles_internal.h"

static int plain_open(SrcFile *f, int fd, const struct stat *st, GError **error)
{
    (void)fd, (void)error;
    f->pub.size = (uint64_t)st->st_size;
    return 1; /* every regular file */
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

/* Reads the contiguous range at OFFSET of F through FD into IOV[0..N), retrying short reads, then
 * checks the file is still the one first opened. */
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

/* Descriptors of one reader: its own open file description per plain source file, so that
 * the kernel's read-ahead of each file, and a streaming client under it (an object-store FUSE
 * mount), see that reader's own sequence of reads rather than all readers' interleaved. */
struct CkptfsSrcReader {
    GMutex lock;
    GHashTable *fds; /* index + 1 -> fd + 1 */
};
/* At most this many descriptors per reader; past it, and where opening fails, the shared one. */
#define READER_FDS_MAX 64u

CkptfsSrcReader *ckptfs_src_reader_new(const CkptfsSrcFiles *files)
{
    (void)files; /* descriptors are opened by the reads, through the set they name */
    CkptfsSrcReader *r = g_new0(CkptfsSrcReader, 1);
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

/* R's descriptor of F, opened on first use and checked to be the file first opened; -1 where
 * the shared descriptor is to be used instead. */
static int reader_fd(CkptfsSrcReader *r, SrcFile *f)
{
    g_mutex_lock(&r->lock);
    gpointer known = g_hash_table_lookup(r->fds, GUINT_TO_POINTER(f->index + 1));
    int fd = known ? GPOINTER_TO_INT(known) - 1 : -1;
    if (known == NULL && g_hash_table_size(r->fds) < READER_FDS_MAX) {
        fd = ckptfs_srcfile_reopen(f, NULL);
        if (fd == -2) { /* replaced since the mount: every read fails from now on */
            ckptfs_srcfile_report_changed(f, NULL);
            fd = -1;
        }
        if (fd >= 0)
            g_hash_table_insert(r->fds, GUINT_TO_POINTER(f->index + 1), GINT_TO_POINTER(fd + 1));
    }
    g_mutex_unlock(&r->lock);
    return fd;
}

static bool plain_preadv(const CkptfsSrcFiles *files, SrcFile *f, CkptfsSrcReader *reader, struct iovec *iov,
                         int n, uint64_t offset, GError **error)
{
    int fd = reader == NULL || g_atomic_int_get(&f->changed) ? -1 : reader_fd(reader, f);
    if (fd >= 0)
        return read_plain(f, fd, iov, n, offset, error);
    fd = ckptfs_srcfd_acquire(files->fds, f, error);
    if (fd < 0)
        return false;
    bool ok = read_plain(f, fd, iov, n, offset, error);
    ckptfs_srcfd_release(files->fds, f);
    return ok;
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

/* Whether every page of [OFFSET, OFFSET + LEN) of F (open as FD) is in the page cache. False
 * where the kernel does not say: before 6.5 (the set then stops asking), and since 6.14 for a
 * file the process neither owns nor may write (F then stops asking). */
static bool range_cached(SrcPlainSet *set, SrcFile *f, int fd, uint64_t offset, uint64_t len)
{
    if (g_atomic_int_get(&set->no_cachestat) || g_atomic_int_get(&f->no_cachestat))
        return false;
    uint64_t page = (uint64_t)getpagesize();
    struct cachestat_range_arg range = {offset, len};
    struct cachestat_result stat = {0};
    if (syscall(__NR_cachestat, fd, &range, &stat, 0) != 0) {
        g_atomic_int_set(errno == ENOSYS ? &set->no_cachestat : &f->no_cachestat, 1);
        return false;
    }
    return stat.nr_cache >= (offset + len + page - 1) / page - offset / page;
}

static void plain_advise(const CkptfsSrcFiles *files, SrcFile *f, uint64_t offset, uint64_t len)
{
    int fd = ckptfs_srcfd_acquire(files->fds, f, NULL);
    if (fd < 0)
        return;
    if (!range_cached(files->plain, f, fd, offset, len)) { /* a cached range's advice is pure cost */
        uint64_t chunk = f->read_ahead == SRC_READ_AHEAD_UNKNOWN ? ADVISE_CHUNK_MIN
                                                                 : MAX(f->read_ahead, ADVISE_CHUNK_MIN);
        for (uint64_t at = offset; at - offset < len; at += chunk)
            posix_fadvise(fd, (off_t)at, (off_t)MIN(chunk, offset + len - at), POSIX_FADV_WILLNEED);
    }
    ckptfs_srcfd_release(files->fds, f);
}

static void plain_close(SrcFile *f)
{
    (void)f; /* its lease and mapping were given back by ckptfs_srcfiles_map_stop */
}

const SrcBackend ckptfs_src_plain = {
    .name = "plain",
    .open = plain_open,
    .preadv = plain_preadv,
    .advise = plain_advise,
    .map_pin = ckptfs_srcmap_pin,
    .map_unpin = ckptfs_srcmap_unpin,
    .same = ckptfs_srcfile_same,
    .close = plain_close,
    .decoded = false,
};
