/* The descriptor cache's pins (core/io/srcfd.c): a pinned descriptor is never closed, the cache
 * going over its size instead; unpinned ones are closed least recently used first; threads
 * pinning, reading and releasing descriptors of more files than the cache holds always read the
 * file they pinned (a descriptor closed under a pin and reused by another file would not). */
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <unistd.h>

#include "srcfiles_internal.h"
#include "tap.h"

enum { NFILES = 6, FILE_SIZE = 4096 };

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

static void test_pins(CkptfsSrcFiles *files)
{
    SrcFdCache *cache = files->fds;
    SrcFile *f[3];
    int fd[3];
    for (unsigned i = 0; i < 3; i++) {
        f[i] = ckptfs_srcfiles_file(files, i, NULL);
        fd[i] = ckptfs_srcfd_acquire(cache, f[i], NULL);
    }
    tap_ok(fd[0] >= 0 && fd[1] >= 0 && fd[2] >= 0 && ckptfs_srcfd_open_count(cache) == 3 && fd_open(fd[0]) &&
               fd_open(fd[1]),
           "three pinned in a cache of two: none closed, the cache over its size (%u open)",
           ckptfs_srcfd_open_count(cache));
    ckptfs_srcfd_release(cache, f[0]);
    ckptfs_srcfd_release(cache, f[1]);
    ckptfs_srcfd_trim(cache, 0);
    tap_ok(ckptfs_srcfd_open_count(cache) == 1 && f[0]->fd < 0 && f[1]->fd < 0 && f[2]->fd == fd[2] && fd_open(fd[2]),
           "trimmed to none: the unpinned closed, the pinned one kept and still open");
    ckptfs_srcfd_release(cache, f[2]);
    int again = ckptfs_srcfd_acquire(cache, f[0], NULL);
    uint8_t b = 0;
    tap_ok(again >= 0 && pread(again, &b, 1, 0) == 1 && b == 0, "a closed file's descriptor is opened again on its next pin");
    ckptfs_srcfd_release(cache, f[0]);
}

typedef struct {
    CkptfsSrcFiles *files;
    unsigned seed;
    bool ok;
} Pinner;

static gpointer pin_and_read(gpointer data)
{
    Pinner *p = data;
    GRand *rng = g_rand_new_with_seed(p->seed);
    p->ok = true;
    for (int k = 0; k < 2000 && p->ok; k++) {
        unsigned i = (unsigned)g_rand_int_range(rng, 0, NFILES);
        SrcFile *f = ckptfs_srcfiles_file(p->files, i, NULL);
        int fd = ckptfs_srcfd_acquire(p->files->fds, f, NULL);
        uint8_t b = 0xff;
        p->ok = fd >= 0 && pread(fd, &b, 1, g_rand_int_range(rng, 0, FILE_SIZE)) == 1 && b == i;
        if (fd >= 0)
            ckptfs_srcfd_release(p->files->fds, f);
    }
    g_rand_free(rng);
    return NULL;
}

static void test_threads(CkptfsSrcFiles *files)
{
    enum { THREADS = 4 };
    Pinner p[THREADS];
    GThread *t[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        p[i] = (Pinner){files, 7 + i, false};
        t[i] = g_thread_new("pinner", pin_and_read, &p[i]);
    }
    bool ok = true;
    for (unsigned i = 0; i < THREADS; i++) {
        g_thread_join(t[i]);
        ok &= p[i].ok;
    }
    tap_ok(ok && ckptfs_srcfd_open_count(files->fds) <= 2 + THREADS,
           "4 threads x 2000 pins of 6 files in a cache of 2: every read from the file pinned (%u open after)",
           ckptfs_srcfd_open_count(files->fds));
}

int main(void)
{
    g_autofree char *dir = g_dir_make_tmp("ckptfs-srcfd-XXXXXX", NULL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(2);
    char *paths[NFILES];
    for (unsigned i = 0; i < NFILES; i++) {
        uint8_t bytes[FILE_SIZE];
        memset(bytes, (int)i, sizeof bytes);
        paths[i] = g_strdup_printf("%s/f%u", dir, i);
        g_file_set_contents(paths[i], (const char *)bytes, sizeof bytes, NULL);
        if (ckptfs_srcfiles_add(files, paths[i], NULL) != (int)i) {
            tap_diag("cannot add %s", paths[i]);
            return 1;
        }
    }
    tap_ok(ckptfs_srcfd_open_count(files->fds) == 2, "6 files added to a cache of 2: 2 open");
    test_pins(files);
    test_threads(files);
    ckptfs_srcfiles_free(files);
    for (unsigned i = 0; i < NFILES; i++) {
        g_unlink(paths[i]);
        g_free(paths[i]);
    }
    g_rmdir(dir);
    return tap_done();
}
