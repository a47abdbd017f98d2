/* The set of source files a mount reads from. Each file is opened once (read-only) and
 * identified by a small index that extents refer to. Its size, mtime and inode are recorded so
 * that a file changed after the mount is detected instead of served as silent wrong data. */
#ifndef CKPTFS_SRCFILES_H
#define CKPTFS_SRCFILES_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct CkptfsSrcFiles CkptfsSrcFiles;

typedef struct {
    char *path;       /* as opened (absolute or relative to the cwd at mount time) */
    int fd;
    uint64_t size;
    int64_t mtime_ns;
    uint64_t ino;
    uint64_t dev;
} CkptfsSrcFile;

CkptfsSrcFiles *ckptfs_srcfiles_new(void);
void ckptfs_srcfiles_free(CkptfsSrcFiles *files);

/* Opens PATH (following symlinks; it must be a regular file) and returns its index, or -1 with
 * an error naming the file. Opening the same path twice returns the same index. */
int ckptfs_srcfiles_add(CkptfsSrcFiles *files, const char *path, GError **error);

unsigned ckptfs_srcfiles_count(const CkptfsSrcFiles *files);
const CkptfsSrcFile *ckptfs_srcfiles_get(const CkptfsSrcFiles *files, unsigned index);

/* Reads exactly LEN bytes at OFFSET of file INDEX into BUF. A short read (the file shrank) or a
 * failed read is an error naming the file; EINTR is retried. */
bool ckptfs_srcfiles_pread(const CkptfsSrcFiles *files, unsigned index, void *buf, size_t len,
                           uint64_t offset, GError **error);

/* Reads the contiguous range starting at OFFSET of file INDEX into the N buffers of IOV, like
 * preadv, until all are full (retrying short reads). */
struct iovec;
bool ckptfs_srcfiles_preadv(const CkptfsSrcFiles *files, unsigned index, struct iovec *iov, int n,
                            uint64_t offset, GError **error);

/* Checks that file INDEX still has the size, mtime and inode it had when opened. */
bool ckptfs_srcfiles_unchanged(const CkptfsSrcFiles *files, unsigned index, GError **error);

#endif
