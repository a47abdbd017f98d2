/* The source file set: a bounded descriptor cache that still reads every file right, change
 * detection after every read (in-place rewrites with the mtime put back, growth, replacement
 * while evicted), special files refused without blocking, and the access of files combined. */
#include <errno.h>
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/options.h"
#include "ckptfs/srcfiles.h"
#include "tap.h"

#define NFILES 20
#define FILE_SIZE 4096

static char *file_path(const char *dir, int i)
{
    return g_strdup_printf("%s/f%02d", dir, i);
}

static void fill(uint8_t *data, int i)
{
    for (int j = 0; j < FILE_SIZE; j++)
        data[j] = (uint8_t)(i * 31 + j * 7);
}

static void test_cache(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(4);
    bool added = true;
    for (int i = 0; i < NFILES; i++) {
        g_autofree char *path = file_path(dir, i);
        added &= ckptfs_srcfiles_add(files, path, NULL) == i;
    }
    tap_ok(added, "%d files added to a set that keeps 4 open", NFILES);
    tap_ok(ckptfs_srcfiles_open_count(files) <= 4, "at most 4 descriptors open after adding (%u)",
           ckptfs_srcfiles_open_count(files));
    GRand *rng = g_rand_new_with_seed(7);
    int good = 0;
    for (int k = 0; k < 400; k++) {
        int i = g_rand_int_range(rng, 0, NFILES);
        uint32_t off = (uint32_t)g_rand_int_range(rng, 0, FILE_SIZE - 64);
        uint8_t want[FILE_SIZE], got[64];
        fill(want, i);
        if (ckptfs_srcfiles_pread(files, (unsigned)i, got, 64, off, NULL) &&
            memcmp(got, want + off, 64) == 0)
            good++;
    }
    tap_ok(good == 400, "400 reads in random file order are right (%d)", good);
    tap_ok(ckptfs_srcfiles_open_count(files) <= 4, "still at most 4 open (%u)",
           ckptfs_srcfiles_open_count(files));
    g_rand_free(rng);
    ckptfs_srcfiles_free(files);
}

static void rewrite_keeping_mtime(const char *path, off_t at);

/* Replaces file I at PATH by rename with a new file of the same bytes, size and mtime. */
static void replace_with_same(const char *dir, const char *path, int i)
{
    g_autofree char *tmp = g_strdup_printf("%s/replacement", dir);
    uint8_t same[FILE_SIZE];
    fill(same, i);
    g_file_set_contents(tmp, (const char *)same, FILE_SIZE, NULL);
    struct stat st;
    stat(path, &st);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, tmp, times, 0);
    g_rename(tmp, path);
}

static unsigned open_fds(void)
{
    GDir *d = g_dir_open("/proc/self/fd", 0, NULL);
    unsigned n = 0;
    while (d && g_dir_read_name(d))
        n++;
    if (d)
        g_dir_close(d);
    return n;
}

/* A reader's own descriptors: right bytes, independent of the shared cache, the same change
 * detection, closed when the reader goes. Files f10..f19. */
static void test_readers(const char *dir)
{
    unsigned fds_before = open_fds();
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(2);
    for (int i = 0; i < NFILES; i++) {
        g_autofree char *path = file_path(dir, i);
        ckptfs_srcfiles_add(files, path, NULL);
    }
    CkptfsSrcReader *r1 = ckptfs_src_reader_new(files), *r2 = ckptfs_src_reader_new(files);
    GRand *rng = g_rand_new_with_seed(11);
    int good = 0;
    for (int k = 0; k < 200; k++) {
        int i = g_rand_int_range(rng, 10, NFILES);
        uint32_t off = (uint32_t)g_rand_int_range(rng, 0, FILE_SIZE - 64);
        uint8_t want[FILE_SIZE], got[64];
        fill(want, i);
        struct iovec iov = {got, 64};
        CkptfsReadCtx read_ctx = {.files = files, .reader = k % 2 ? r1 : r2};
        if (ckptfs_srcfiles_read(&read_ctx, (unsigned)i, &iov, 1, off, NULL) &&
            memcmp(got, want + off, 64) == 0)
            good++;
    }
    g_rand_free(rng);
    tap_ok(good == 200 && ckptfs_src_reader_open_count(r1) == 10 && ckptfs_src_reader_open_count(r2) == 10 &&
               ckptfs_srcfiles_open_count(files) <= 2,
           "two readers: 200 reads right, 10 descriptors each, the shared cache untouched (%d, %u, %u, %u)", good,
           ckptfs_src_reader_open_count(r1), ckptfs_src_reader_open_count(r2), ckptfs_srcfiles_open_count(files));

    g_autofree char *p10 = file_path(dir, 10), *p11 = file_path(dir, 11);
    rewrite_keeping_mtime(p10, 200);
    uint8_t buf[64];
    struct iovec iov = {buf, 64};
    GError *error = NULL;
    bool read = ckptfs_srcfiles_read(&(CkptfsReadCtx){.files = files, .reader = r1}, 10, &iov, 1, 1000, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_CHANGED && strstr(error->message, p10),
           "a rewrite is caught through a reader's descriptor (%s)", error ? error->message : "read");
    g_clear_error(&error);
    iov = (struct iovec){buf, 64};
    tap_ok(!ckptfs_srcfiles_read(&(CkptfsReadCtx){.files = files, .reader = r2}, 10, &iov, 1, 0, NULL) &&
               !ckptfs_srcfiles_pread(files, 10, buf, 64, 0, NULL),
           "and every reader and the shared descriptors refuse it from then on");

    /* Replaced by rename before a new reader opens it. */
    replace_with_same(dir, p11, 11);
    CkptfsSrcReader *r3 = ckptfs_src_reader_new(files);
    iov = (struct iovec){buf, 64};
    read = ckptfs_srcfiles_read(&(CkptfsReadCtx){.files = files, .reader = r3}, 11, &iov, 1, 0, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_CHANGED,
           "a file replaced by one of the same bytes, size and mtime: a new reader refuses it (%s)",
           error ? error->message : "read");
    g_clear_error(&error);
    ckptfs_src_reader_free(r1);
    ckptfs_src_reader_free(r2);
    ckptfs_src_reader_free(r3);
    ckptfs_srcfiles_free(files);
    tap_ok(open_fds() == fds_before, "every descriptor closed with the readers and the set (%u, %u before)",
           open_fds(), fds_before);
}

static void rewrite_keeping_mtime(const char *path, off_t at)
{
    struct stat st;
    stat(path, &st);
    int fd = open(path, O_WRONLY);
    uint8_t x[16];
    memset(x, 0xAB, sizeof x);
    if (pwrite(fd, x, sizeof x, at) != (ssize_t)sizeof x)
        tap_diag("pwrite failed");
    close(fd);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    utimensat(AT_FDCWD, path, times, 0);
}

static void test_changes(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(2);
    g_autofree char *p0 = file_path(dir, 0), *p1 = file_path(dir, 1), *p2 = file_path(dir, 2);
    int a = ckptfs_srcfiles_add(files, p0, NULL), b = ckptfs_srcfiles_add(files, p1, NULL);
    int c = ckptfs_srcfiles_add(files, p2, NULL);
    uint8_t buf[64];
    GError *error = NULL;
    tap_ok(ckptfs_srcfiles_pread(files, (unsigned)a, buf, 64, 0, NULL), "f00 reads before any change");

    rewrite_keeping_mtime(p0, 100);
    bool read = ckptfs_srcfiles_pread(files, (unsigned)a, buf, 64, 2000, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_CHANGED && strstr(error->message, p0),
           "after an in-place rewrite with the mtime put back, a read elsewhere fails naming it (%s)",
           error ? error->message : "read");
    g_clear_error(&error);
    tap_ok(!ckptfs_srcfiles_pread(files, (unsigned)a, buf, 64, 0, NULL) &&
               !ckptfs_srcfiles_unchanged(files, (unsigned)a, NULL),
           "and every later read and check of it fails too");
    tap_ok(ckptfs_srcfiles_pread(files, (unsigned)b, buf, 64, 0, NULL), "f01 still reads");

    /* f02 was the last opened; f01 was just read: reading f01 and f00 leaves f02 closed. */
    int fd = open(p2, O_WRONLY | O_APPEND);
    if (write(fd, "x", 1) != 1)
        tap_diag("append failed");
    close(fd);
    read = ckptfs_srcfiles_pread(files, (unsigned)c, buf, 64, 0, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_CHANGED, "a grown file fails (%s)",
           error ? error->message : "read");
    g_clear_error(&error);

    /* Replaced by rename while its descriptor is closed: reopening finds another file. */
    g_autofree char *p3 = file_path(dir, 3), *p4 = file_path(dir, 4);
    int d = ckptfs_srcfiles_add(files, p3, NULL);
    ckptfs_srcfiles_add(files, p4, NULL);
    ckptfs_srcfiles_pread(files, (unsigned)b, buf, 64, 0, NULL); /* f03 is now least recent */
    replace_with_same(dir, p3, 3);
    read = ckptfs_srcfiles_pread(files, (unsigned)d, buf, 64, 0, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_CHANGED,
           "a file replaced by one of the same bytes, size and mtime is caught on reopen (%s)",
           error ? error->message : "read");
    g_clear_error(&error);

    tap_ok(ckptfs_srcfiles_pread(files, (unsigned)b, buf, 0, 10, NULL) &&
               ckptfs_srcfiles_pread(files, (unsigned)b, buf, 4, 0, NULL),
           "a read of nothing succeeds and is not taken for a change");
    read = ckptfs_srcfiles_pread(files, (unsigned)b, buf, 64, FILE_SIZE - 10, &error);
    tap_ok(!read && error && error->code == CKPTFS_ERROR_IO,
           "a read past the end is an error, not a change (%s)", error ? error->message : "read");
    g_clear_error(&error);
    tap_ok(ckptfs_srcfiles_pread(files, (unsigned)b, buf, 64, 0, NULL), "and the file still reads");
    ckptfs_srcfiles_free(files);
}

/* A descriptor of its own for the caller (FUSE passthrough hands it to the kernel): the file's
 * bytes, and no descriptor for a file replaced or rewritten since it was added. Files f05..f07. */
static void test_open_fd(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    g_autofree char *p5 = file_path(dir, 5), *p6 = file_path(dir, 6), *p7 = file_path(dir, 7);
    int a = ckptfs_srcfiles_add(files, p5, NULL), b = ckptfs_srcfiles_add(files, p6, NULL);
    int c = ckptfs_srcfiles_add(files, p7, NULL);
    unsigned fds = open_fds();
    int fd = ckptfs_srcfiles_open_fd(files, (unsigned)a, NULL);
    uint8_t got[FILE_SIZE], want[FILE_SIZE];
    fill(want, 5);
    tap_ok(fd >= 0 && pread(fd, got, FILE_SIZE, 0) == FILE_SIZE && memcmp(got, want, FILE_SIZE) == 0,
           "open_fd gives a descriptor of the file's bytes");
    if (fd >= 0)
        close(fd);
    tap_is_u64(open_fds(), fds, "which the caller owns: none left open after it closes it");

    GError *error = NULL;
    replace_with_same(dir, p6, 6);
    fd = ckptfs_srcfiles_open_fd(files, (unsigned)b, &error);
    tap_ok(fd < 0 && error && error->code == CKPTFS_ERROR_CHANGED && strstr(error->message, p6),
           "a file replaced by rename (same bytes, size, mtime) gets none (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    rewrite_keeping_mtime(p7, 10);
    fd = ckptfs_srcfiles_open_fd(files, (unsigned)c, &error);
    tap_ok(fd < 0 && error && error->code == CKPTFS_ERROR_CHANGED,
           "nor one rewritten in place with its mtime put back (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    tap_ok(!ckptfs_srcfiles_pread(files, (unsigned)c, got, 16, 0, NULL), "which then stays refused to reads");
    fd = ckptfs_srcfiles_open_fd(files, 99, &error);
    tap_ok(fd < 0 && error != NULL, "an index out of range gets none (%s)", error ? error->message : "opened");
    g_clear_error(&error);
    ckptfs_srcfiles_free(files);
}

static void test_special(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    g_autofree char *fifo = g_strdup_printf("%s/fifo", dir);
    mkfifo(fifo, 0600);
    GError *error = NULL;
    int i = ckptfs_srcfiles_add(files, fifo, &error);
    tap_ok(i < 0 && error && strstr(error->message, "not a regular file (a FIFO)"),
           "a FIFO is refused at once (%s)", error ? error->message : "added");
    g_clear_error(&error);
    g_autofree char *loop = g_strdup_printf("%s/loop", dir);
    if (symlink("loop", loop) != 0)
        tap_diag("symlink failed");
    i = ckptfs_srcfiles_add(files, loop, &error);
    tap_ok(i < 0 && error && strstr(error->message, "symlink loop"), "a symlink loop is named (%s)",
           error ? error->message : "added");
    g_clear_error(&error);
    i = ckptfs_srcfiles_add(files, dir, &error);
    tap_ok(i < 0 && error && strstr(error->message, "a directory"), "a directory is named (%s)",
           error ? error->message : "added");
    g_clear_error(&error);
    ckptfs_srcfiles_free(files);
}

static void test_access(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    const unsigned modes[] = {0644, 0640, 0604};
    for (int i = 0; i < 3; i++) {
        g_autofree char *path = file_path(dir, 10 + i);
        chmod(path, modes[i]);
        ckptfs_srcfiles_add(files, path, NULL);
    }
    uint32_t all[] = {0, 1, 2}, open_ones[] = {0};
    CkptfsAccess a = ckptfs_srcfiles_access(files, all, 3, 0, 0);
    tap_is_u64(a.mode, 0400, "0644 + 0640 + 0604 read as 0400");
    a = ckptfs_srcfiles_access(files, open_ones, 1, 0, 0);
    tap_is_u64(a.mode, 0444, "a 0644 file alone reads as 0444");
    a = ckptfs_srcfiles_access(files, NULL, 0, 0, 0);
    tap_is_u64(a.mode, 0400, "no files named: all of them count");
    if (geteuid() != 0) {
        printf("ok %d # skip chown needs root\n", ++tap_count);
        printf("ok %d # skip chown needs root\n", ++tap_count);
    } else {
        g_autofree char *p = file_path(dir, 11);
        if (chown(p, 1234, 5678) != 0)
            tap_diag("chown failed");
        chmod(p, 0644);
        CkptfsSrcFiles *owned = ckptfs_srcfiles_new(0);
        g_autofree char *p0 = file_path(dir, 10);
        chmod(p0, 0644);
        ckptfs_srcfiles_add(owned, p0, NULL);
        ckptfs_srcfiles_add(owned, p, NULL);
        a = ckptfs_srcfiles_access(owned, NULL, 0, 42, 43);
        tap_ok(a.uid == 42 && a.gid == 43 && a.mode == 0444,
               "files of two owners and groups: the daemon's, 0444 (got %u:%u %o)", a.uid, a.gid, a.mode);
        uint32_t second[] = {1};
        a = ckptfs_srcfiles_access(owned, second, 1, 42, 43);
        tap_ok(a.uid == 1234 && a.gid == 5678 && a.mode == 0444, "one file keeps its owner (%u:%u %o)",
               a.uid, a.gid, a.mode);
        ckptfs_srcfiles_free(owned);
    }
    ckptfs_srcfiles_free(files);
}

static bool on_local_disk(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf) != 0)
        return false;
    unsigned long t = (unsigned long)sf.f_type;
    return t == EXT4_SUPER_MAGIC || t == XFS_SUPER_MAGIC || t == BTRFS_SUPER_MAGIC || t == F2FS_SUPER_MAGIC;
}

/* prefetch=auto: a window for raw files only where every one is on a local disk (an object
 * store's client would fetch the gaps a window spans); a set value is kept as it is. */
static void test_prefetch_default(const char *dir)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    tap_ok(ckptfs_srcfiles_prefetch_window(files, CKPTFS_PREFETCH_AUTO) == 0, "no files: no prefetch");
    g_autofree char *path = file_path(dir, 0);
    ckptfs_srcfiles_add(files, path, NULL);
    uint64_t window = ckptfs_srcfiles_prefetch_window(files, CKPTFS_PREFETCH_AUTO);
    bool disk = on_local_disk(dir);
    tap_ok(window == (disk ? CKPTFS_PREFETCH_DISK : 0), "a raw file on %s: prefetch %" G_GUINT64_FORMAT,
           disk ? "a local disk" : "another file system", window);
    tap_ok(ckptfs_srcfiles_prefetch_window(files, 0) == 0 &&
               ckptfs_srcfiles_prefetch_window(files, 8u << 20) == 8u << 20,
           "prefetch=0 and prefetch=8M are kept as they are");
    struct statfs sf;
    if (disk && statfs("/dev/shm", &sf) == 0 && (unsigned long)sf.f_type == TMPFS_MAGIC) {
        g_autofree char *shm = g_strdup_printf("/dev/shm/ckptfs-srcfiles-%d", (int)getpid());
        g_file_set_contents(shm, "tmpfs", 5, NULL);
        ckptfs_srcfiles_add(files, shm, NULL);
        tap_ok(ckptfs_srcfiles_prefetch_window(files, CKPTFS_PREFETCH_AUTO) == 0,
               "one more file on tmpfs: no prefetch");
        g_unlink(shm);
    } else {
        tap_skip(1, "%s is not on a local disk, or /dev/shm is not tmpfs", dir);
    }
    ckptfs_srcfiles_free(files);
}

int main(void)
{
    g_autofree char *dir = g_dir_make_tmp("ckptfs-srcfiles-XXXXXX", NULL);
    for (int i = 0; i < NFILES; i++) {
        uint8_t data[FILE_SIZE];
        fill(data, i);
        g_autofree char *path = file_path(dir, i);
        g_file_set_contents(path, (const char *)data, FILE_SIZE, NULL);
    }
    test_cache(dir);
    test_changes(dir);
    test_readers(dir);
    test_open_fd(dir);
    test_special(dir);
    test_access(dir);
    test_prefetch_default(dir);
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("cleanup failed");
    return tap_done();
}
