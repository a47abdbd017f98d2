/* Mapped reads: replies written straight from a mapping of a source file, so a cached source
 * byte is copied once (into the reader's buffer or the mount's page cache) instead of twice
 * (pread into the daemon, then out of it).
 *
 * A mapping shows the file's pages as they are when the reply is copied, not as they were when
 * checked, so it is only used while the process holds a read lease on the file (fcntl
 * F_SETLEASE): the kernel then makes any open for writing or truncation wait and tells this
 * process first. The watcher thread stops new replies from the mapping, waits for those being
 * written, and only then gives the lease back: every byte sent from a mapping was sent before
 * the file could change. Afterwards the file is read with pread and its checks, as files without
 * a lease are. Leases are only taken on local file systems, where every writer is seen. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/readfile.h"
#include "srcfiles_internal.h"

struct CkptfsLeaseWatch {
    int signal_fd; /* lease breaks: ckptfs_lease_signal(), and SIGIO when its queue overflowed */
    int stop_fd;   /* an eventfd: the watcher returns */
    GThread *watcher;
    GMutex lock;   /* sets */
    GPtrArray *sets; /* CkptfsSrcFiles* whose files may be leased */
    gint held;       /* leases held now */
    gint given_back; /* leases given back because a writer came */
};

int ckptfs_lease_signal(void)
{
    return SIGRTMIN + 2;
}

static void lease_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, ckptfs_lease_signal());
    sigaddset(set, SIGIO); /* sent instead when the queue of real-time signals is full */
}

bool ckptfs_leases_block_signals(void)
{
    sigset_t set;
    lease_signals(&set);
    return pthread_sigmask(SIG_BLOCK, &set, NULL) == 0;
}

/* File systems whose leases see every writer (local ones). On a network file system a lease
 * only sees this machine's writers. */
static bool leases_trusted(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) != 0)
        return false;
    switch ((unsigned long)sf.f_type) {
    case 0xEF53:     /* ext2/3/4 */
    case 0x58465342: /* xfs */
    case 0x9123683E: /* btrfs */
    case 0x01021994: /* tmpfs */
    case 0xF2F52010: /* f2fs */
        return true;
    default:
        return false;
    }
}

/* How far ahead of a read the kernel's read-ahead of F's device may have gone: twice its
 * read_ahead_kb (a window and the asynchronous one after it), plus a MiB. 8 MiB of read-ahead is
 * assumed where sysfs does not say (a file system over several devices, or none). */
static uint64_t read_ahead_reach(const struct stat *st)
{
    uint64_t kb = 8192;
    g_autofree char *disk = g_strdup_printf("/sys/dev/block/%u:%u/queue/read_ahead_kb", major(st->st_dev),
                                            minor(st->st_dev));
    g_autofree char *part = g_strdup_printf("/sys/dev/block/%u:%u/../queue/read_ahead_kb", major(st->st_dev),
                                            minor(st->st_dev));
    g_autofree char *text = NULL;
    if (g_file_get_contents(disk, &text, NULL, NULL) || g_file_get_contents(part, &text, NULL, NULL))
        kb = g_ascii_strtoull(text, NULL, 10);
    return 2 * MIN(kb, (uint64_t)1 << 20) * 1024 + (1u << 20);
}

/* Under files->lock: leases F, maps it, and says whether that worked. */
static int map_setup(CkptfsSrcFiles *files, SrcFile *f)
{
    if (f->map_state != SRC_MAP_UNTRIED)
        return f->map_state;
    f->map_state = SRC_MAP_REFUSED;
    if (f->container != NULL || f->disk_size == 0 || g_atomic_int_get(&f->changed))
        return f->map_state;
    struct stat st;
    int fd = ckptfs_open_regular(f->pub.path, &st, NULL);
    if (fd < 0)
        return f->map_state;
    void *map = MAP_FAILED;
    /* The lease is taken before the file is checked: a change after the check would break it. */
    if (leases_trusted(fd) && fcntl(fd, F_SETSIG, ckptfs_lease_signal()) == 0 &&
        fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
        if (fstat(fd, &st) == 0 && ckptfs_srcfile_same(f, &st))
            map = mmap(NULL, f->disk_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            fcntl(fd, F_SETLEASE, F_UNLCK);
    }
    if (map == MAP_FAILED) {
        close(fd);
        return f->map_state;
    }
    f->map = map;
    f->map_probe = read_ahead_reach(&st);
    f->lease_fd = fd;
    g_atomic_int_inc(&files->leases->held);
    g_atomic_int_set(&f->map_state, SRC_MAP_READY);
    return SRC_MAP_READY;
}

const uint8_t *ckptfs_srcfiles_map_pin(const CkptfsSrcFiles *cfiles, unsigned index)
{
    CkptfsSrcFiles *files = (CkptfsSrcFiles *)cfiles;
    if (files->leases == NULL || index >= files->files->len)
        return NULL;
    SrcFile *f = g_ptr_array_index(files->files, index);
    int state = g_atomic_int_get(&f->map_state);
    if (state == SRC_MAP_UNTRIED) {
        g_mutex_lock(&files->lock);
        state = map_setup(files, f);
        g_mutex_unlock(&files->lock);
    }
    if (state != SRC_MAP_READY)
        return NULL;
    /* Pin, then look for a lease being given back; give_back sets that, then waits for no pins
     * (both full barriers): one of the two sees the other. */
    g_atomic_int_inc(&f->map_pins);
    if (g_atomic_int_get(&f->map_breaking)) {
        g_atomic_int_dec_and_test(&f->map_pins);
        return NULL;
    }
    return f->map;
}

void ckptfs_srcfiles_map_unpin(const CkptfsSrcFiles *files, unsigned index)
{
    SrcFile *f = g_ptr_array_index(files->files, index);
    g_atomic_int_dec_and_test(&f->map_pins);
}

bool ckptfs_srcfiles_map_check(const CkptfsSrcFiles *files, unsigned index, GError **error)
{
    SrcFile *f = g_ptr_array_index(files->files, index);
    struct stat st;
    if (fstat(f->lease_fd, &st) != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: cannot stat: %s", f->pub.path, g_strerror(errno));
    return ckptfs_srcfile_same(f, &st) || ckptfs_srcfile_report_changed(f, error);
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

/* Stops mapped reads of F and gives its lease back once no reply is being written from it. */
static void give_back(CkptfsSrcFiles *files, SrcFile *f)
{
    g_atomic_int_set(&f->map_breaking, 1);
    while (g_atomic_int_get(&f->map_pins) > 0)
        g_usleep(50);
    g_mutex_lock(&files->lock);
    if (f->map_state == SRC_MAP_READY) {
        munmap((void *)f->map, f->disk_size);
        fcntl(f->lease_fd, F_SETLEASE, F_UNLCK);
        close(f->lease_fd);
        f->map = NULL;
        f->lease_fd = -1;
        g_atomic_int_dec_and_test(&files->leases->held);
    }
    g_atomic_int_set(&f->map_state, SRC_MAP_REFUSED);
    g_mutex_unlock(&files->lock);
}

/* A writer waits on the lease of descriptor FD (-1: on some lease, which one unknown). */
static void lease_broken(CkptfsSrcFiles *files, int fd, bool writer)
{
    for (guint i = 0; i < files->files->len; i++) {
        SrcFile *f = g_ptr_array_index(files->files, i);
        g_mutex_lock(&files->lock);
        bool hit = f->map_state == SRC_MAP_READY && (fd < 0 || f->lease_fd == fd);
        g_mutex_unlock(&files->lock);
        if (hit) {
            give_back(files, f);
            if (writer)
                g_atomic_int_inc(&files->leases->given_back);
        }
    }
}

static gpointer watch_leases(gpointer data)
{
    CkptfsLeaseWatch *w = data;
    struct pollfd fds[2] = {{w->signal_fd, POLLIN, 0}, {w->stop_fd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        struct signalfd_siginfo si;
        if (!(fds[0].revents & POLLIN) || read(w->signal_fd, &si, sizeof si) != (ssize_t)sizeof si)
            continue;
        int fd = (int)si.ssi_signo == ckptfs_lease_signal() ? si.ssi_fd : -1;
        g_mutex_lock(&w->lock);
        for (guint i = 0; i < w->sets->len; i++)
            lease_broken(g_ptr_array_index(w->sets, i), fd, true);
        g_mutex_unlock(&w->lock);
    }
    return NULL;
}

CkptfsLeaseWatch *ckptfs_lease_watch_new(GError **error)
{
    sigset_t set, blocked;
    lease_signals(&set);
    if (pthread_sigmask(SIG_BLOCK, NULL, &blocked) != 0 || !sigismember(&blocked, ckptfs_lease_signal()) ||
        !sigismember(&blocked, SIGIO))
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID,
                           "mapped reads: the lease signals are not blocked (ckptfs_leases_block_signals)"),
               NULL;
    int signal_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    int stop_fd = signal_fd < 0 ? -1 : eventfd(0, EFD_CLOEXEC);
    if (stop_fd < 0) {
        ckptfs_fail(error, CKPTFS_ERROR_IO, "mapped reads: %s", g_strerror(errno));
        if (signal_fd >= 0)
            close(signal_fd);
        return NULL;
    }
    CkptfsLeaseWatch *w = g_new0(CkptfsLeaseWatch, 1);
    w->signal_fd = signal_fd;
    w->stop_fd = stop_fd;
    g_mutex_init(&w->lock);
    w->sets = g_ptr_array_new();
    w->watcher = g_thread_new("ckptfs-leases", watch_leases, w);
    return w;
}

void ckptfs_lease_watch_add(CkptfsLeaseWatch *w, CkptfsSrcFiles *files)
{
    g_mutex_lock(&w->lock);
    if (files->leases == NULL) {
        files->leases = w;
        g_ptr_array_add(w->sets, files);
    }
    g_mutex_unlock(&w->lock);
}

void ckptfs_srcfiles_map_stop(CkptfsSrcFiles *files)
{
    CkptfsLeaseWatch *w = files->leases;
    if (w == NULL)
        return;
    g_mutex_lock(&w->lock);
    lease_broken(files, -1, false);
    g_ptr_array_remove(w->sets, files);
    files->leases = NULL;
    g_mutex_unlock(&w->lock);
}

void ckptfs_lease_watch_free(CkptfsLeaseWatch *w)
{
    if (w == NULL)
        return;
    uint64_t one = 1;
    if (write(w->stop_fd, &one, sizeof one) != (ssize_t)sizeof one)
        g_warning("mapped reads: cannot stop the lease watcher");
    g_thread_join(w->watcher);
    while (w->sets->len > 0)
        ckptfs_srcfiles_map_stop(g_ptr_array_index(w->sets, w->sets->len - 1));
    close(w->signal_fd);
    close(w->stop_fd);
    g_ptr_array_unref(w->sets);
    g_mutex_clear(&w->lock);
    g_free(w);
}

void ckptfs_lease_watch_stats(const CkptfsLeaseWatch *w, unsigned *held, unsigned *given_back)
{
    *held = (unsigned)g_atomic_int_get(&((CkptfsLeaseWatch *)w)->held);
    *given_back = (unsigned)g_atomic_int_get(&((CkptfsLeaseWatch *)w)->given_back);
}
