/* The lease watcher of mapped reads (srcmap.c): one thread for every set of the process.
 *
 * A mapping shows the file's pages as they are when the reply is copied, not as they were when
 * checked, so it is only used while the process holds a read lease on the file (fcntl
 * F_SETLEASE): the kernel then makes any open for writing or truncation wait and tells this
 * process first. The watcher thread stops new replies from the mapping, waits for those being
 * written, and only then gives the lease back: every byte sent from a mapping was sent before
 * the file could change. Afterwards the file is read with pread and its checks, as files without
 * a lease are. Leases are only taken on local file systems, where every writer is seen.
 *
 * The kernel gives a lease up by itself once a writer has waited lease-break-time (45 s by
 * default): the watcher takes every break the signal queue holds at once, and mapped reads are
 * refused where that time is under LEASE_BREAK_MIN.
 *
 * The watcher's states. Idle: blocked in poll, nothing breaking. Busy: some files' pins stopped
 * (ckptfs_srcmap_stop_pins, under the watch's lock then each set's maps lock) and waiting for
 * their replies outside any lock, while more breaks are still taken; busy is set and cleared
 * under the watch's lock, and a set leaves the watch (ckptfs_srcfiles_map_stop) only while the
 * watcher is not busy, so no set is freed under a file being given back. Stopped (poll failed or
 * the watch is freed): no lease is taken again, every lease goes back once its replies are
 * written. Lock order: the watch's lock, then a set's maps lock; the watcher never holds either
 * while it waits for pins. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "srcfiles_internal.h"

/* Seconds a writer may wait for a lease, at the least, for leases to be taken (fs.lease-break-time). */
#define LEASE_BREAK_MIN 5

struct CkptfsLeaseWatch {
    int signal_fd; /* lease breaks: ckptfs_lease_signal(), and SIGIO when its queue overflowed */
    int stop_fd;   /* an eventfd: the watcher returns */
    GThread *watcher;
    GMutex lock;     /* sets, busy */
    GCond idle;      /* busy went false */
    bool busy;       /* the watcher is giving leases of some sets back (outside the lock) */
    GPtrArray *sets; /* CkptfsSrcFiles* whose files may be leased */
    gint held;       /* leases held now */
    gint given_back; /* leases given back because a writer came */
    gint stopped;    /* the watcher stopped: no lease may be taken */
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

typedef struct {
    SrcMaps *maps;
    SrcFile *file;
} Breaking;

/* Under w->lock: stops the pins of every leased file of every set whose lease descriptor is in
 * FDS (all of them when ALL), and adds them to OUT. */
static void stop_matching(CkptfsLeaseWatch *w, const GArray *fds, bool all, GArray *out)
{
    for (guint s = 0; s < w->sets->len; s++) {
        CkptfsSrcFiles *files = g_ptr_array_index(w->sets, s);
        SrcMaps *maps = &files->plain->maps;
        g_mutex_lock(&maps->lock); /* lease_fd is set under it */
        for (guint i = 0; i < files->files->len; i++) {
            SrcFile *f = g_ptr_array_index(files->files, i);
            bool hit = all;
            for (guint k = 0; !hit && fds != NULL && k < fds->len; k++)
                hit = f->lease_fd >= 0 && f->lease_fd == g_array_index(fds, int, k);
            if (hit && ckptfs_srcmap_stop_pins(f))
                g_array_append_val(out, ((Breaking){maps, f}));
        }
        g_mutex_unlock(&maps->lock);
    }
}

/* Stops the pins of the files stop_matching picks and adds them to BREAKING; the watcher is busy
 * while any of them waits (no set is removed under it). */
static void take_breaks(CkptfsLeaseWatch *w, const GArray *fds, bool all, GArray *breaking)
{
    g_mutex_lock(&w->lock);
    stop_matching(w, fds, all, breaking);
    w->busy = breaking->len > 0;
    g_mutex_unlock(&w->lock);
}

static void give_back_breaking(CkptfsLeaseWatch *w, const Breaking *b)
{
    ckptfs_srcmap_give_back(w, b->maps, b->file);
    g_atomic_int_inc(&w->given_back);
}

static void no_longer_busy(CkptfsLeaseWatch *w)
{
    g_mutex_lock(&w->lock);
    if (w->busy) {
        w->busy = false;
        g_cond_broadcast(&w->idle);
    }
    g_mutex_unlock(&w->lock);
}

static gpointer watch_leases(gpointer data)
{
    CkptfsLeaseWatch *w = data;
    struct pollfd fds[2] = {{w->signal_fd, POLLIN, 0}, {w->stop_fd, POLLIN, 0}};
    GArray *broken = g_array_new(FALSE, FALSE, sizeof(int));
    GArray *breaking = g_array_new(FALSE, FALSE, sizeof(Breaking)); /* waiting for their replies */
    gulong nap = 0; /* us between looks at them: 50, doubling to 1 ms while a reply lasts */
    for (;;) {
        /* While files wait for replies being written from them, breaks are still taken. */
        if (poll(fds, 2, breaking->len ? 0 : -1) < 0) {
            if (errno == EINTR)
                continue;
            g_warning("mapped reads: the lease watcher stops: poll: %s", g_strerror(errno));
            /* No break would be seen any more: every lease goes back, none left to be revoked,
             * and none is taken again. */
            g_atomic_int_set(&w->stopped, 1);
            take_breaks(w, NULL, true, breaking);
            break;
        }
        if (fds[1].revents)
            break;
        if (fds[0].revents) {
            g_array_set_size(broken, 0);
            bool all = false;
            struct signalfd_siginfo si;
            while (read(w->signal_fd, &si, sizeof si) == (ssize_t)sizeof si) {
                if ((int)si.ssi_signo == ckptfs_lease_signal())
                    g_array_append_val(broken, si.ssi_fd);
                else
                    all = true; /* SIGIO: the queue overflowed, which file is unknown */
            }
            take_breaks(w, broken, all, breaking);
        }
        /* Each file goes back as soon as the replies written from it are: its writer waits for
         * them only. Were they given back in turn, a reply stalled on one file would hold the
         * others' leases until the kernel revoked them, and those files would be read from
         * their mappings while their writers went on. */
        for (guint i = 0; i < breaking->len;) {
            Breaking *b = &g_array_index(breaking, Breaking, i);
            if (g_atomic_int_get(&b->file->map_pins) > 0) {
                i++;
                continue;
            }
            give_back_breaking(w, b);
            g_array_remove_index_fast(breaking, i);
        }
        if (breaking->len > 0) {
            nap = nap ? MIN(2 * nap, 1000) : 50;
            g_usleep(nap);
            continue;
        }
        nap = 0;
        no_longer_busy(w);
    }
    /* Stopped: the files still breaking go back once their replies are written. */
    for (guint i = 0; i < breaking->len; i++)
        give_back_breaking(w, &g_array_index(breaking, Breaking, i));
    no_longer_busy(w);
    g_array_unref(broken);
    g_array_unref(breaking);
    return NULL;
}

/* fs.lease-break-time, in seconds (the kernel's default where it cannot be read). */
static long lease_break_time(void)
{
    g_autofree char *text = NULL;
    if (!g_file_get_contents("/proc/sys/fs/lease-break-time", &text, NULL, NULL))
        return 45;
    return strtol(text, NULL, 10);
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
    long break_time = lease_break_time();
    if (break_time < LEASE_BREAK_MIN)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID,
                           "mapped reads: fs.lease-break-time is %ld s: a writer could go on before the "
                           "daemon stops reading the file's pages (at least %d s needed)",
                           break_time, LEASE_BREAK_MIN),
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
    g_cond_init(&w->idle);
    w->sets = g_ptr_array_new();
    /* Every signal blocked in the watcher: the process's others (SIGTERM...) go to its own threads. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &saved);
    w->watcher = g_thread_new("ckptfs-leases", watch_leases, w);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    return w;
}

void ckptfs_lease_watch_add(CkptfsLeaseWatch *w, CkptfsSrcFiles *files)
{
    SrcMaps *maps = &files->plain->maps;
    if (g_atomic_pointer_get(&maps->watch) == w) /* every open: no lock once added */
        return;
    g_mutex_lock(&w->lock);
    if (maps->watch == NULL) {
        g_ptr_array_add(w->sets, files);
        g_atomic_pointer_set(&maps->watch, w);
    }
    g_mutex_unlock(&w->lock);
}

void ckptfs_srcfiles_map_stop(CkptfsSrcFiles *files)
{
    SrcMaps *maps = &files->plain->maps;
    CkptfsLeaseWatch *w = maps->watch;
    if (w == NULL)
        return;
    g_mutex_lock(&w->lock);
    while (w->busy) /* it may be giving back a lease of this set */
        g_cond_wait(&w->idle, &w->lock);
    g_ptr_array_remove(w->sets, files);
    g_atomic_pointer_set(&maps->watch, NULL);
    g_mutex_unlock(&w->lock);
    for (guint i = 0; i < files->files->len; i++) {
        SrcFile *f = g_ptr_array_index(files->files, i);
        if (ckptfs_srcmap_stop_pins(f))
            ckptfs_srcmap_give_back(w, maps, f);
    }
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
    g_cond_clear(&w->idle);
    g_mutex_clear(&w->lock);
    g_free(w);
}

void ckptfs_lease_watch_stats(const CkptfsLeaseWatch *w, unsigned *held, unsigned *given_back)
{
    *held = (unsigned)g_atomic_int_get(&w->held);
    *given_back = (unsigned)g_atomic_int_get(&w->given_back);
}

bool ckptfs_lease_watch_stopped(CkptfsLeaseWatch *w)
{
    return g_atomic_int_get(&w->stopped);
}

void ckptfs_lease_watch_held(CkptfsLeaseWatch *w, int delta)
{
    g_atomic_int_add(&w->held, delta);
}
