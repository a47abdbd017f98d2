/* Small files read whole (trackers, config.json, index files, metadata.json): never blocks on a
 * FIFO or device, never reads without bound. */
#ifndef CKPTFS_READFILE_H
#define CKPTFS_READFILE_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Reads the whole of PATH into *CONTENTS (NUL-terminated, g_free it) and its length into *LEN
 * (may be NULL). PATH is opened with O_NONBLOCK, so a FIFO fails instead of blocking; anything
 * but a regular file (after symlinks) is refused as "not a regular file", a file larger than
 * MAX bytes as too large. Errors name the file. */
bool ckptfs_read_small_file(const char *path, size_t max, char **contents, size_t *len,
                            GError **error);

/* "a directory", "a FIFO", ... for a file type in MODE ("a regular file" for one). */
const char *ckptfs_file_kind(unsigned mode);

/* Why PATH cannot be read as a file, for messages: "missing", "a dangling symlink", "a symlink
 * loop", "not a regular file (a FIFO)", ...; NULL when it is a regular file (after symlinks). */
const char *ckptfs_path_problem(const char *path);

/* Opens PATH read-only without blocking (a FIFO would) and checks, after symlinks, that it is a
 * regular file ("not a regular file (a FIFO)" otherwise); fills ST. Returns the descriptor, or
 * -1 with an error naming the file. */
struct stat;
int ckptfs_open_regular(const char *path, struct stat *st, GError **error);

/* Reads exactly LEN bytes at OFFSET of FD (retrying short reads and EINTR). Returns 0, an errno
 * value when a read failed, or -1 when the file ends first. */
int ckptfs_pread_full(int fd, void *buf, size_t len, uint64_t offset);

#endif
