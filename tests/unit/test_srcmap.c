/* Mapped reads: a read replied to from leased mappings gives the bytes a copying read gives, at
 * odd offsets and sizes, with small pieces still copied; a writer opening a leased file waits
 * while a reply is being written from it and goes on once it is, after which the file is read
 * (and checked) with pread; a file changed in place is refused either way; the watcher refuses
 * to start when its signals are not blocked. */
#include <errno.h>
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <signal.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "tap.h"

#define SRC_SIZE (4u << 20)

static void fill(uint8_t *data, size_t n, unsigned seed)
{
    for (size_t j = 0; j < n; j++)
        data[j] = (uint8_t)(seed * 131 + j * 7 + (j >> 12));
}

/* Where the 768 pieces of 4 KiB start in make_plan's file (more than CKPTFS_REPLY_REFS_MAX in a
 * 3 MiB read). */
static uint64_t many_pieces_at;

/* Literals, a run, a column split (8 KiB of every 16 KiB row: mapped), a finer one (1 KiB of
 * every 4 KiB: copied), two files interleaved, and 768 pieces of 4 KiB, over two files. */
static CkptfsPlan *make_plan(void)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    ckptfs_plan_add_literal(b, "header--", 8);
    ckptfs_plan_add_run(b, 0, 100, 1u << 20);
    CkptfsGatherItem wide = {0, 1u << 20, 16384, 8192};
    ckptfs_plan_add_gather(b, 128, &wide, 1);
    CkptfsGatherItem fine = {1, 0, 4096, 1024};
    ckptfs_plan_add_gather(b, 256, &fine, 1);
    CkptfsGatherItem two[2] = {{0, 3u << 20, 20000, 6000}, {1, 2u << 20, 10000, 5000}};
    ckptfs_plan_add_gather(b, 40, two, 2);
    many_pieces_at = ckptfs_plan_builder_size(b);
    CkptfsGatherItem many = {1, 4096, 5000, 4096};
    ckptfs_plan_add_gather(b, 768, &many, 1);
    ckptfs_plan_add_literal(b, "tail", 4);
    return ckptfs_plan_builder_finish(b);
}

/* Reads [OFF, OFF + LEN) mapped and flattens the reply. */
static int64_t read_mapped(const CkptfsPlan *plan, const CkptfsSrcFiles *files, uint8_t *out, size_t len,
                           uint64_t off, unsigned *nrefs)
{
    static CkptfsReplyRefs refs;
    static struct iovec iov[CKPTFS_REPLY_IOV_MAX];
    uint8_t *buf = g_malloc(len ? len : 1);
    int64_t n = ckptfs_plan_read(plan, &(CkptfsReadCtx){.files = files, .refs = &refs}, buf, len, off, NULL);
    if (n >= 0) {
        int k = ckptfs_reply_refs_iov(&refs, buf, (size_t)n, iov, G_N_ELEMENTS(iov));
        size_t at = 0;
        for (int i = 0; i < k; i++) {
            memcpy(out + at, iov[i].iov_base, iov[i].iov_len);
            at += iov[i].iov_len;
        }
        if (at != (size_t)n)
            n = -2;
    }
    *nrefs = refs.n;
    ckptfs_reply_refs_release(files, &refs);
    g_free(buf);
    return n;
}

static void test_bytes(CkptfsSrcFiles *files)
{
    CkptfsPlan *plan = make_plan();
    uint64_t size = ckptfs_plan_size(plan);
    uint8_t *want = g_malloc(size), *got = g_malloc(size);
    tap_ok(ckptfs_plan_read(plan, CKPTFS_READ_SHARED(files), want, size, 0, NULL) == (int64_t)size,
           "the whole file read by copying");
    GRand *rng = g_rand_new_with_seed(11);
    int good = 0, with_refs = 0;
    for (int k = 0; k < 300; k++) {
        uint64_t off = (uint64_t)g_rand_int_range(rng, 0, (gint32)size);
        size_t len = (size_t)g_rand_int_range(rng, 0, 1 << 20);
        if (k % 10 == 0)
            len = 1u << 20;
        unsigned nrefs = 0;
        int64_t n = read_mapped(plan, files, got, len, off, &nrefs);
        size_t expect = off + len > size ? (size_t)(size - off) : len;
        good += n == (int64_t)expect && memcmp(got, want + off, expect) == 0;
        with_refs += nrefs > 0;
    }
    tap_ok(good == 300, "300 mapped reads at odd offsets and sizes equal the copying read (%d)", good);
    tap_ok(with_refs > 200, "most of them left pieces in the mappings (%d)", with_refs);
    /* The same reads gathered in place, as a reply written from the reader's own buffer is. */
    good = with_refs = 0;
    for (int k = 0; k < 100; k++) {
        uint64_t off = (uint64_t)g_rand_int_range(rng, 0, (gint32)size);
        size_t len = k % 10 == 0 ? 1u << 20 : (size_t)g_rand_int_range(rng, 1, 1 << 20);
        static CkptfsReplyRefs refs;
        int64_t n = ckptfs_plan_read(plan, &(CkptfsReadCtx){.files = files, .refs = &refs}, got, len, off, NULL);
        size_t expect = off + len > size ? (size_t)(size - off) : len;
        with_refs += refs.n > 0;
        good += n == (int64_t)expect && ckptfs_reply_refs_gather(&refs, got, (size_t)n) == expect &&
                memcmp(got, want + off, expect) == 0;
        ckptfs_reply_refs_release(files, &refs);
    }
    tap_ok(good == 100 && with_refs > 50, "100 mapped reads gathered into their buffer equal the copying read "
                                          "(%d; %d with pieces from the mappings)", good, with_refs);
    unsigned nrefs = 0;
    int64_t n = read_mapped(plan, files, got, 1u << 20, size - 30000, &nrefs);
    tap_ok(n == 30000 && memcmp(got, want + size - 30000, 30000) == 0, "the last bytes, past the end asked for");
    n = read_mapped(plan, files, got, 4096, size, &nrefs);
    tap_ok(n == 0 && nrefs == 0, "a read at the end is empty");
    n = read_mapped(plan, files, got, 768 * 4096, many_pieces_at, &nrefs);
    tap_ok(n == 768 * 4096 && memcmp(got, want + many_pieces_at, (size_t)n) == 0 && nrefs == CKPTFS_REPLY_REFS_MAX,
           "768 pieces in one read: %u from the mappings, the rest copied, all right", nrefs);
    g_rand_free(rng);
    g_free(want);
    g_free(got);
    ckptfs_plan_free(plan);
}

/* A child opening PATH for writing; returns its pid. */
static pid_t start_writer(const char *path)
{
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(path, O_WRONLY);
        _exit(fd >= 0 ? 0 : 1);
    }
    return pid;
}

/* Waits up to MS for PID; true when it exited with 0. */
static bool writer_done(pid_t pid, int ms)
{
    for (int waited = 0; waited <= ms; waited += 10) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        g_usleep(10000);
    }
    return false;
}

/* The watcher's counts once it has counted GIVEN_WANT leases given back (or after 2 s): a
 * writer goes on at the lease's release, a moment before the watcher counts it. */
static void stats_after(CkptfsLeaseWatch *watch, unsigned given_want, unsigned *held, unsigned *given_back)
{
    ckptfs_lease_watch_stats(watch, held, given_back);
    for (int waited = 0; waited < 2000 && *given_back < given_want; waited += 10) {
        g_usleep(10000);
        ckptfs_lease_watch_stats(watch, held, given_back);
    }
}

/* Whether PID has not exited yet (it is not reaped). */
static bool still_running(pid_t pid)
{
    siginfo_t info = {0};
    return waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

static void test_writer(CkptfsLeaseWatch *watch, CkptfsSrcFiles *files, const char *path0)
{
    const uint8_t *map = ckptfs_srcfiles_map_pin(files, 0);
    tap_ok(map != NULL, "a file is mapped and pinned");
    g_autofree char *path1 = g_strdup(ckptfs_srcfiles_get(files, 1)->path);
    tap_ok(ckptfs_srcfiles_map_pin(files, 1) != NULL, "the other file is mapped");
    ckptfs_srcfiles_map_unpin(files, 1);
    pid_t writer = start_writer(path0);
    tap_ok(!writer_done(writer, 300), "a writer opening it waits while a reply is written from it");
    unsigned held, given_back;
    ckptfs_lease_watch_stats(watch, &held, &given_back);
    tap_ok(held == 3, "three leases held (%u)", held);
    /* Another file's writer does not wait for the first file's replies: were it held until the
     * kernel revoked its lease, its file would be read from the mapping while written. */
    pid_t writer1 = start_writer(path1);
    tap_ok(writer_done(writer1, 2000) && still_running(writer),
           "a writer of an unpinned leased file goes on at once, while the pinned one's still waits");
    ckptfs_srcfiles_map_unpin(files, 0);
    tap_ok(writer_done(writer, 5000), "the writer goes on once the reply is written");
    stats_after(watch, 2, &held, &given_back);
    tap_ok(held == 1 && given_back == 2, "both leases were given back (held %u, given back %u)", held, given_back);
    tap_ok(ckptfs_srcfiles_map_pin(files, 0) == NULL, "the file is not mapped again");
    uint8_t want[4096], got[4096];
    fill(want, sizeof want, 0);
    tap_ok(ckptfs_srcfiles_pread(files, 0, got, sizeof got, 0, NULL) && memcmp(got, want, sizeof got) == 0,
           "an open without a write leaves the file readable, by pread");
    /* Changed in place: refused by the next read, as a copying read refuses it. */
    int fd = open(path1, O_WRONLY);
    bool wrote = fd >= 0 && pwrite(fd, "X", 1, 5) == 1;
    if (fd >= 0)
        close(fd);
    GError *error = NULL;
    bool ok = ckptfs_srcfiles_pread(files, 1, got, 16, 0, &error);
    tap_ok(wrote && !ok && error && error->code == CKPTFS_ERROR_CHANGED, "a file written after its lease was given back is refused: %s",
           error ? error->message : "no error");
    g_clear_error(&error);
}

/* Evicts bytes [OFF, OFF + LEN) of PATH from the page cache (clean, unmapped pages). */
static bool evict(const char *path, off_t off, off_t len)
{
    int fd = open(path, O_RDONLY);
    bool ok = fd >= 0 && fdatasync(fd) == 0 && posix_fadvise(fd, off, len, POSIX_FADV_DONTNEED) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Mapped only where cached, and only once the kernel's read-ahead of a cold file is behind: the
 * file's pages are never touched through the mapping here (that would map them, and evicting
 * them would no longer work). */
static void test_cold(CkptfsSrcFiles *files, unsigned index, const char *path)
{
    if (ckptfs_srcfiles_map_pin(files, index) == NULL) {
        tap_skip(4, "%s: not mapped", path);
        return;
    }
    uint8_t *all = g_malloc(SRC_SIZE);
    bool cached = ckptfs_srcfiles_pread(files, index, all, SRC_SIZE, 0, NULL);
    tap_ok(cached && ckptfs_srcfiles_map_cached(files, index, 0, 1u << 20), "a cached file is sent from its mapping");
    if (!evict(path, 0, SRC_SIZE) || ckptfs_srcfiles_map_cached(files, index, SRC_SIZE - 4096, 4096)) {
        tap_skip(3, "%s: its pages could not be evicted (posix_fadvise DONTNEED)", path);
    } else {
        tap_ok(!ckptfs_srcfiles_map_cached(files, index, 0, 4096), "an evicted file is not: it is read with pread");
        cached = ckptfs_srcfiles_pread(files, index, all, SRC_SIZE, 0, NULL) && evict(path, 1u << 20, SRC_SIZE);
        tap_ok(cached && !ckptfs_srcfiles_map_cached(files, index, 0, 1u << 20),
               "nor its first MiB cached while the pages after it are not (as in a read-ahead in progress)");
        cached = ckptfs_srcfiles_pread(files, index, all, SRC_SIZE, 0, NULL);
        tap_ok(cached && ckptfs_srcfiles_map_cached(files, index, 0, 1u << 20), "once all of it is cached, it is");
    }
    ckptfs_srcfiles_map_unpin(files, index);
    g_free(all);
}

static gpointer pin_and_unpin(gpointer files)
{
    const uint8_t *map = ckptfs_srcfiles_map_pin(files, 3);
    if (map != NULL)
        ckptfs_srcfiles_map_unpin(files, 3);
    return (gpointer)map;
}

/* The lease of a file first mapped by a thread that is gone by the time a writer comes: its
 * break still reaches the watcher (it goes to the process, not to that thread). */
static void test_thread_gone(CkptfsLeaseWatch *watch, CkptfsSrcFiles *files, const char *path)
{
    gpointer mapped = g_thread_join(g_thread_new("pin", pin_and_unpin, files));
    unsigned held0, given0, held, given;
    ckptfs_lease_watch_stats(watch, &held0, &given0);
    pid_t writer = start_writer(path);
    bool done = writer_done(writer, 5000);
    stats_after(watch, given0 + 1, &held, &given);
    tap_ok(mapped != NULL && done && given == given0 + 1,
           "a file mapped by a thread that has exited: its writer goes on at once, the lease given back");
}

/* The lease signal's queue overflowed (SIGIO, which names no file): every lease is given back. */
static void test_overflow(CkptfsLeaseWatch *watch, CkptfsSrcFiles *files)
{
    unsigned held, given;
    if (ckptfs_srcfiles_map_pin(files, 4) != NULL)
        ckptfs_srcfiles_map_unpin(files, 4);
    ckptfs_lease_watch_stats(watch, &held, &given);
    bool had = held > 0;
    kill(getpid(), SIGIO);
    for (int waited = 0; waited < 5000 && held > 0; waited += 10) {
        g_usleep(10000);
        ckptfs_lease_watch_stats(watch, &held, &given);
    }
    tap_ok(had && held == 0 && ckptfs_srcfiles_map_pin(files, 4) == NULL,
           "SIGIO (the queue of lease signals overflowed): every lease given back for good (%u left)", held);
}

/* touch and chmod break no lease; the check after a read still sees them. */
static void test_touched(CkptfsSrcFiles *files, unsigned index, const char *path)
{
    GError *error = NULL;
    bool mapped = ckptfs_srcfiles_map_pin(files, index) != NULL;
    bool before = mapped && ckptfs_srcfiles_map_check(files, index, NULL);
    struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
    bool touched = utimensat(AT_FDCWD, path, times, 0) == 0;
    bool after = mapped && ckptfs_srcfiles_map_check(files, index, &error);
    if (mapped)
        ckptfs_srcfiles_map_unpin(files, index);
    tap_ok(before && touched && !after && error && error->code == CKPTFS_ERROR_CHANGED,
           "a leased file touched (mtime set back): the check refuses it: %s", error ? error->message : "no error");
    g_clear_error(&error);
}

int main(void)
{
    GError *error = NULL;
    CkptfsLeaseWatch *refused = ckptfs_lease_watch_new(&error);
    tap_ok(refused == NULL && error != NULL, "the watcher refuses to start with its signals unblocked: %s",
           error ? error->message : "started");
    g_clear_error(&error);
    tap_ok(ckptfs_leases_block_signals(), "the lease signals blocked");
    CkptfsLeaseWatch *watch = ckptfs_lease_watch_new(&error);
    tap_ok(watch != NULL, "the watcher starts: %s", error ? error->message : "yes");
    g_clear_error(&error);

    g_autofree char *dir = g_dir_make_tmp("ckptfs-srcmap-XXXXXX", NULL);
    g_autofree char *path0 = g_build_filename(dir, "a", NULL), *path1 = g_build_filename(dir, "b", NULL);
    uint8_t *data = g_malloc(SRC_SIZE);
    fill(data, SRC_SIZE, 0);
    g_file_set_contents(path0, (const char *)data, SRC_SIZE, NULL);
    fill(data, SRC_SIZE, 1);
    g_file_set_contents(path1, (const char *)data, SRC_SIZE, NULL);
    g_autofree char *path2 = g_build_filename(dir, "c", NULL);
    g_file_set_contents(path2, (const char *)data, SRC_SIZE, NULL);
    g_autofree char *path3 = g_build_filename(dir, "d", NULL), *path4 = g_build_filename(dir, "e", NULL);
    g_autofree char *path5 = g_build_filename(dir, "f", NULL);
    g_file_set_contents(path3, (const char *)data, 65536, NULL);
    g_file_set_contents(path4, (const char *)data, 65536, NULL);
    g_file_set_contents(path5, (const char *)data, 65536, NULL);
    g_free(data);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    ckptfs_srcfiles_add(files, path0, NULL);
    ckptfs_srcfiles_add(files, path1, NULL);
    ckptfs_srcfiles_add(files, path2, NULL);
    ckptfs_srcfiles_add(files, path3, NULL);
    ckptfs_srcfiles_add(files, path4, NULL);
    ckptfs_srcfiles_add(files, path5, NULL);
    tap_ok(ckptfs_srcfiles_map_pin(files, 0) == NULL, "no mapping before the set is in a watch");
    if (watch != NULL)
        ckptfs_lease_watch_add(watch, files);
    const uint8_t *probe = watch ? ckptfs_srcfiles_map_pin(files, 0) : NULL;
    if (probe == NULL) {
        tap_skip(23, "no lease on %s (a file system other than ext4, xfs, btrfs, tmpfs or f2fs, leases "
                     "disabled, or no watcher)", dir);
    } else {
        ckptfs_srcfiles_map_unpin(files, 0);
        test_bytes(files);
        test_cold(files, 2, path2);
        test_writer(watch, files, path0);
        test_thread_gone(watch, files, path3);
        test_touched(files, 5, path5);
        test_overflow(watch, files);
    }
    unsigned held = 0, given_back = 0;
    if (watch != NULL) {
        CkptfsSrcFiles *other = ckptfs_srcfiles_new(0);
        ckptfs_srcfiles_add(other, path4, NULL);
        ckptfs_lease_watch_add(watch, other);
        const uint8_t *m = ckptfs_srcfiles_map_pin(other, 0);
        if (m != NULL)
            ckptfs_srcfiles_map_unpin(other, 0);
        ckptfs_lease_watch_stats(watch, &held, &given_back);
        bool one = held == 1;
        ckptfs_srcfiles_free(other); /* leaves the watch, its lease given back */
        ckptfs_lease_watch_stats(watch, &held, &given_back);
        if (probe != NULL)
            tap_ok(one && held == 0, "a set freed gives its leases back");
    }
    ckptfs_srcfiles_free(files);
    ckptfs_lease_watch_free(watch);
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("cleanup failed");
    return tap_done();
}
