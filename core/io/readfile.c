#include "ckptfs/readfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/error.h"

/* File types other than regular files, named for messages. */
static const struct {
    unsigned type;
    const char *kind, *problem;
} other_kinds[] = {
    {S_IFDIR, "a directory", "not a regular file (a directory)"},
    {S_IFIFO, "a FIFO", "not a regular file (a FIFO)"},
    {S_IFSOCK, "a socket", "not a regular file (a socket)"},
    {S_IFCHR, "a character device", "not a regular file (a device)"},
    {S_IFBLK, "a block device", "not a regular file (a device)"},
};

const char *ckptfs_file_kind(unsigned mode)
{
    if (S_ISREG(mode))
        return "a regular file";
    for (size_t i = 0; i < G_N_ELEMENTS(other_kinds); i++)
        if ((mode & S_IFMT) == other_kinds[i].type)
            return other_kinds[i].kind;
    return "not a regular file";
}

const char *ckptfs_path_problem(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ELOOP)
            return "a symlink loop";
        return lstat(path, &st) == 0 ? "a dangling symlink" : "missing";
    }
    if (S_ISREG(st.st_mode))
        return NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(other_kinds); i++)
        if ((st.st_mode & S_IFMT) == other_kinds[i].type)
            return other_kinds[i].problem;
    return "not a regular file";
}

int ckptfs_open_regular(const char *path, struct stat *st, GError **error)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        g_set_error(error, CKPTFS_ERROR, e == ENOENT ? CKPTFS_ERROR_NOT_FOUND : CKPTFS_ERROR_IO,
                    "%s: cannot open: %s", path, e == ELOOP ? "a symlink loop" : g_strerror(e));
        return -1;
    }
    if (fstat(fd, st) != 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: cannot stat: %s", path,
                    g_strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: not a regular file (%s)", path,
                    ckptfs_file_kind(st->st_mode));
        close(fd);
        return -1;
    }
    return fd;
}

bool ckptfs_read_small_file(const char *path, size_t max, char **contents, size_t *len,
                            GError **error)
{
    *contents = NULL;
    struct stat st;
    int fd = ckptfs_open_regular(path, &st, error);
    if (fd < 0)
        return false;
    if ((uint64_t)st.st_size > max) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: %" G_GUINT64_FORMAT " bytes, more than the %zu this file may have", path,
                    (guint64)st.st_size, max);
        close(fd);
        return false;
    }
    /* Read until EOF, but never past MAX (the file may grow while read). */
    size_t cap = (size_t)st.st_size + 1, used = 0;
    char *buf = g_malloc(cap + 1);
    for (;;) {
        if (used == cap) {
            if (cap > max) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                            "%s: more than the %zu bytes this file may have", path, max);
                g_free(buf);
                close(fd);
                return false;
            }
            cap = MIN(cap * 2, max + 1);
            buf = g_realloc(buf, cap + 1);
        }
        ssize_t n = read(fd, buf + used, cap - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s: read failed: %s", path,
                        g_strerror(errno));
            g_free(buf);
            close(fd);
            return false;
        }
        if (n == 0)
            break;
        used += (size_t)n;
    }
    close(fd);
    buf[used] = '\0';
    *contents = buf;
    if (len != NULL)
        *len = used;
    return true;
}

int ckptfs_pread_full(int fd, void *buf, size_t len, uint64_t offset)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = pread(fd, p, len, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno ? errno : EIO;
        if (n == 0)
            return -1;
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}
