/* Mapped reads, the plain backend's own capability: replies written straight from a mapping of
 * a source file, so a cached source byte is copied once (into the reader's buffer or the mount's
 * page cache) instead of twice (pread into the daemon, then out of it).
 *
 * A mapping shows the file's pages as they are when the reply is copied, not as they were when
 * checked, so it is only used while the process holds a read lease on the file (fcntl
 * F_SETLEASE): the kernel then makes any open for writing or truncation wait and tells this
 * process first; the lease watcher (leasewatch.c) then gives the lease back through
 * ckptfs_srcmap_stop_pins and ckptfs_srcmap_give_back. Leases are only taken on local file
 * systems, where every writer is seen.
 *
 * The map pin protocol. A file's map_state goes UNTRIED -> READY (leased and mapped) or REFUSED,
 * and READY -> REFUSED once given back, never back; map, lease_fd and the set's count of leases
 * change only under the set's maps lock (SrcMaps), taken after the watch's lock, never the other
 * way. A reply pins the mapping (map_pins + 1) and then looks at map_breaking; the lease's giving
 * back sets map_breaking and then waits for map_pins to be 0 (both atomic, full barriers): one of
 * the two sees the other, so either the pin fails or the mapping is not unmapped and the lease
 * not given back until that reply is written and unpinned. Every byte sent from a mapping was
 * thus sent before a writer could change the file. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/readfile.h"
#include "srcfiles_internal.h"


/* How far ahead of a read the kernel's read-ahead of F's device may have gone: twice its
 * read-ahead (a window and the asynchronous one after it), plus a MiB. 8 MiB of read-ahead is
 * assumed where it is not known. */
static uint64_t read_ahead_reach(const SrcFile *f)
{
    uint64_t ra = f->read_ahead == SRC_READ_AHEAD_UNKNOWN ? 8u << 20 : f->read_ahead;
    return 2 * ra + (1u << 20);
}

/* Under MAPS->lock: leases F, maps it, and says whether that worked. */
static int map_setup(SrcMaps *maps, SrcFile *f)
{
    if (f->map_state != SRC_MAP_UNTRIED)
        return f->map_state;
    g_atomic_int_set(&f->map_state, SRC_MAP_REFUSED);
    /* Each lease holds a descriptor and a mapping beside the cache's: at most half as many. */
    if (f->disk_size == 0 || g_atomic_int_get(&f->changed) || ckptfs_lease_watch_stopped(maps->watch) ||
        maps->held >= maps->held_max)
        return SRC_MAP_REFUSED;
    struct stat st;
    int fd = ckptfs_open_regular(f->pub.path, &st, NULL);
    if (fd < 0)
        return SRC_MAP_REFUSED;
    void *map = MAP_FAILED;
    /* The owner (or root) only: mincore answers for the page cache only to them, and a lease
     * the kernel gives others (CAP_LEASE) would come with every page said to be cached. The
     * lease is taken before the file is checked: a change after the check breaks it. Its break
     * is signalled to the process (F_SETOWN after F_SETLEASE, which sets the calling thread: a
     * FUSE worker that may be gone by then). */
    if ((st.st_uid == geteuid() || geteuid() == 0) && f->fs_kind != SRC_FS_OTHER &&
        fcntl(fd, F_SETSIG, ckptfs_lease_signal()) == 0 && fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
        if (fcntl(fd, F_SETOWN, getpid()) == 0 && fstat(fd, &st) == 0 && f->backend->same(f, &st))
            map = mmap(NULL, f->disk_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            fcntl(fd, F_SETLEASE, F_UNLCK);
    }
    if (map == MAP_FAILED) {
        close(fd);
        return SRC_MAP_REFUSED;
    }
    f->map = map;
    f->map_probe = read_ahead_reach(f);
    f->lease_fd = fd;
    maps->held++;
    ckptfs_lease_watch_held(maps->watch, 1);
    g_atomic_int_set(&f->map_state, SRC_MAP_READY);
    return SRC_MAP_READY;
}

const uint8_t *ckptfs_srcfiles_map_pin(const CkptfsSrcFiles *files, unsigned index)
{
    SrcFile *f = ckptfs_srcfiles_file(files, index, NULL);
    return f != NULL && f->backend->map_pin != NULL ? f->backend->map_pin(files, f) : NULL;
}

const uint8_t *ckptfs_srcmap_pin(const CkptfsSrcFiles *files, SrcFile *f)
{
    SrcMaps *maps = &files->plain->maps;
    if (g_atomic_pointer_get(&maps->watch) == NULL)
        return NULL;
    int state = g_atomic_int_get(&f->map_state);
    if (state == SRC_MAP_UNTRIED) {
        g_mutex_lock(&maps->lock);
        state = map_setup(maps, f);
        g_mutex_unlock(&maps->lock);
    }
    if (state != SRC_MAP_READY)
        return NULL;
    /* Pin, then look for a lease being given back; the watcher sets that, then waits for no
     * pins (both full barriers): one of the two sees the other. */
    g_atomic_int_inc(&f->map_pins);
    if (g_atomic_int_get(&f->map_breaking)) {
        g_atomic_int_add(&f->map_pins, -1);
        return NULL;
    }
    return f->map;
}

void ckptfs_srcfiles_map_unpin(const CkptfsSrcFiles *files, unsigned index)
{
    SrcFile *f = g_ptr_array_index(files->files, index);
    f->backend->map_unpin(f);
}

void ckptfs_srcmap_unpin(SrcFile *f)
{
    g_atomic_int_add(&f->map_pins, -1);
}

bool ckptfs_srcfiles_map_check(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    SrcFile *f = g_ptr_array_index(files->files, index);
    return ckptfs_srcfile_check_fd(f, f->lease_fd, error);
}

static bool resident(const uint8_t *map, uint64_t offset, uint64_t len)
{
    uint64_t page = (uint64_t)getpagesize(); /* mincore's unit */
    uint64_t first = offset / page * page;
    uint64_t pages = (offset + len - first + page - 1) / page;
    unsigned char vec[512];
    for (uint64_t done = 0; done < pages;) {
        uint64_t n = MIN(pages - done, (uint64_t)sizeof vec);
        if (mincore((void *)(map + first + done * page), n * page, vec) != 0)
            return false;
        for (uint64_t i = 0; i < n; i++)
            if (!(vec[i] & 1))
                return false;
        done += n;
    }
    return true;
}

bool ckptfs_srcfiles_map_cached(const CkptfsSrcFiles *files, unsigned index, uint64_t offset, uint64_t len)
{
    const SrcFile *f = g_ptr_array_index(files->files, index);
    uint64_t probe = MIN(offset + len + f->map_probe, f->disk_size - 1);
    return resident(f->map, probe, 1) && resident(f->map, offset, len);
}

bool ckptfs_srcmap_stop_pins(SrcFile *f)
{
    return g_atomic_int_get(&f->map_state) == SRC_MAP_READY && g_atomic_int_compare_and_exchange(&f->map_breaking, 0, 1);
}

void ckptfs_srcmap_give_back(CkptfsLeaseWatch *w, SrcMaps *maps, SrcFile *f)
{
    while (g_atomic_int_get(&f->map_pins) > 0)
        g_usleep(50);
    g_mutex_lock(&maps->lock);
    munmap((void *)f->map, f->disk_size);
    fcntl(f->lease_fd, F_SETLEASE, F_UNLCK);
    close(f->lease_fd);
    f->map = NULL;
    f->lease_fd = -1;
    maps->held--;
    ckptfs_lease_watch_held(w, -1);
    g_atomic_int_set(&f->map_state, SRC_MAP_REFUSED);
    g_mutex_unlock(&maps->lock);
}
