#include "ckptfs/srcfiles.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/error.h"

struct CkptfsSrcFiles {
    GPtrArray *files;     /* CkptfsSrcFile* */
    GHashTable *by_path;  /* path -> index + 1 */
};

static void srcfile_free(gpointer data)
{
    CkptfsSrcFile *f = data;
    if (f->fd >= 0)
        close(f->fd);
    g_free(f->path);
    g_free(f);
}

CkptfsSrcFiles *ckptfs_srcfiles_new(void)
{
    CkptfsSrcFiles *files = g_new0(CkptfsSrcFiles, 1);
    files->files = g_ptr_array_new_with_free_func(srcfile_free);
    files->by_path = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    return files;
}

void ckptfs_srcfiles_free(CkptfsSrcFiles *files)
{
    if (files == NULL)
        return;
    g_ptr_array_unref(files->files);
    g_hash_table_unref(files->by_path);
    g_free(files);
}

static int64_t stat_mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

int ckptfs_srcfiles_add(CkptfsSrcFiles *files, const char *path, GError **error)
{
    gpointer known = g_hash_table_lookup(files->by_path, path);
    if (known != NULL)
        return GPOINTER_TO_INT(known) - 1;

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot open: %s", path,
                    g_strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot stat: %s", path,
                    g_strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    CkptfsSrcFile *f = g_new0(CkptfsSrcFile, 1);
    f->path = g_strdup(path);
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    f->mtime_ns = stat_mtime_ns(&st);
    f->ino = st.st_ino;
    f->dev = st.st_dev;
    g_ptr_array_add(files->files, f);
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
    return index < files->files->len ? g_ptr_array_index(files->files, index) : NULL;
}

bool ckptfs_srcfiles_pread(const CkptfsSrcFiles *files, unsigned index, void *buf, size_t len,
                           uint64_t offset, GError **error)
{
    const CkptfsSrcFile *f = ckptfs_srcfiles_get(files, index);
    if (f == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "source file #%u does not exist", index);
        return false;
    }
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pread(f->fd, p, len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: read at offset %" G_GUINT64_FORMAT " failed: %s",
                        f->path, offset, g_strerror(errno));
            return false;
        }
        if (n == 0) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_CHANGED,
                        "%s: file ends before offset %" G_GUINT64_FORMAT " (it changed after the mount?)",
                        f->path, offset);
            return false;
        }
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return true;
}

bool ckptfs_srcfiles_preadv(const CkptfsSrcFiles *files, unsigned index, struct iovec *iov, int n,
                            uint64_t offset, GError **error)
{
    if (n == 1)
        return ckptfs_srcfiles_pread(files, index, iov[0].iov_base, iov[0].iov_len, offset, error);
    const CkptfsSrcFile *f = ckptfs_srcfiles_get(files, index);
    if (f == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "source file #%u does not exist", index);
        return false;
    }
    while (n > 0) {
        ssize_t got = preadv(f->fd, iov, n, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            g_set_error(error, CKPTFS_ERROR, got < 0 ? CKPTFS_ERROR_IO : CKPTFS_ERROR_CHANGED,
                        "%s: read at offset %" G_GUINT64_FORMAT " failed: %s", f->path, offset,
                        got < 0 ? g_strerror(errno) : "file ends early (it changed after the mount?)");
            return false;
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
    return true;
}

bool ckptfs_srcfiles_unchanged(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    const CkptfsSrcFile *f = ckptfs_srcfiles_get(files, index);
    if (f == NULL)
        return false;
    struct stat st;
    /* Compare the path's current file too: a file replaced by rename keeps the old fd valid. */
    if (stat(f->path, &st) != 0 || st.st_ino != f->ino || st.st_dev != f->dev ||
        (uint64_t)st.st_size != f->size || stat_mtime_ns(&st) != f->mtime_ns) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_CHANGED,
                    "%s: source file changed after the mount (size, mtime or inode differ); "
                    "remount to serve the new contents",
                    f->path);
        return false;
    }
    return true;
}
