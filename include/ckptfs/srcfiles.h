/* The set of source files a mount reads from. Each file is identified by a small index that
 * extents refer to, and by what it was when first opened: inode, size, mtime and ctime (which
 * users cannot set back). Every read checks the file is still that one, so a shard rewritten
 * under a mount gives errors, never old and new bytes mixed.
 *
 * A packed file (`ckptfs pack`, include/ckptfs/container.h: its first bytes are the container
 * magic) is read as the file it holds: its size is the original's, reads return original bytes
 * decompressed frame by frame through a bounded cache of decoded frames shared by all readers,
 * and a frame that does not decode to its size and checksum is an error naming file and frame.
 * Its index is checked when it is added.
 *
 * Descriptors are kept in a bounded cache (least recently used closed first): a source may have
 * more files than the process may hold open; a file reopened is checked to be the same. */
#ifndef CKPTFS_SRCFILES_H
#define CKPTFS_SRCFILES_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "ckptfs/container.h"

/* Decoded frames of packed files kept by default (-o frame_cache). */
#define CKPTFS_FRAME_CACHE_DEFAULT (64ull << 20)

typedef struct CkptfsSrcFiles CkptfsSrcFiles;

typedef struct {
    char *path;       /* as opened (absolute or relative to the cwd at mount time) */
    uint64_t size;
    int64_t mtime_ns, ctime_ns;
    uint64_t ino;
    uint64_t dev;
    uint32_t uid, gid; /* owner of the file (symlinks followed) */
    uint32_t mode;     /* its permission bits */
} CkptfsSrcFile;

/* Who may read something made of source files: an owner, a group and permission bits. */
typedef struct {
    uint32_t uid, gid, mode;
} CkptfsAccess;

/* A set whose descriptor cache holds up to MAX_OPEN files (0: derived from RLIMIT_NOFILE). */
CkptfsSrcFiles *ckptfs_srcfiles_new(unsigned max_open);
void ckptfs_srcfiles_free(CkptfsSrcFiles *files);
/* Closes every descriptor and mapping of FILES that no read is using now, and gives their
 * leases back: for a source deleted while mounted, whose space is freed only once nothing holds
 * its files open. Later reads open them again, and fail where they are gone. */
void ckptfs_srcfiles_let_go(CkptfsSrcFiles *files);

/* Raises the soft RLIMIT_NOFILE to the hard limit (a process-wide setting: the command does it
 * once at start). Returns the soft limit now in force. */
uint64_t ckptfs_raise_fd_limit(void);

/* Opens PATH (following symlinks; it must be a regular file; a FIFO never blocks) and returns
 * its index, or -1 with an error naming the file. Opening the same path twice returns the same
 * index. */
int ckptfs_srcfiles_add(CkptfsSrcFiles *files, const char *path, GError **error);

unsigned ckptfs_srcfiles_count(const CkptfsSrcFiles *files);
const CkptfsSrcFile *ckptfs_srcfiles_get(const CkptfsSrcFiles *files, unsigned index);
/* Descriptors open now (at most the cache size). */
unsigned ckptfs_srcfiles_open_count(const CkptfsSrcFiles *files);

/* One reader's own descriptors (a FUSE open of a view file): plain source files are read through
 * descriptors of its own, opened on first use (64 at most; past that, or where opening fails, the
 * set's shared ones), so the kernel's read-ahead of each file and a streaming client under the
 * source (rclone, s3fs) see this reader's reads in order; packed files go through the set's frame
 * cache. Thread-safe; free it before the set. */
typedef struct CkptfsSrcReader CkptfsSrcReader;
CkptfsSrcReader *ckptfs_src_reader_new(const CkptfsSrcFiles *files);
void ckptfs_src_reader_free(CkptfsSrcReader *reader);
unsigned ckptfs_src_reader_open_count(CkptfsSrcReader *reader);

/* How a read reaches source files: the set, through whose descriptors, and where the pieces
 * left in mapped files go (a read of a synthesized file, plan.h; NULL: every byte copied). */
typedef struct CkptfsReplyRefs CkptfsReplyRefs;
typedef struct {
    const CkptfsSrcFiles *files;
    CkptfsSrcReader *reader; /* a reader's own descriptors; NULL: the set's shared ones */
    CkptfsReplyRefs *refs;
} CkptfsReadCtx;
/* The context of a read through SET's shared descriptors, every byte copied. */
#define CKPTFS_READ_SHARED(set) (&(const CkptfsReadCtx){.files = (set)})

/* The one read of source bytes: the contiguous range starting at OFFSET of file INDEX into the
 * N buffers of IOV, like preadv, until all are full (retrying short reads). A short read (the
 * file shrank), a failed read, or a file that is no longer what it was is an error naming the
 * file (CHANGED for the last two; the file then stays refused). */
struct iovec;
bool ckptfs_srcfiles_read(const CkptfsReadCtx *ctx, unsigned index, struct iovec *iov, int n, uint64_t offset,
                          GError **error);
/* ckptfs_srcfiles_read of LEN bytes into BUF through the set's shared descriptors (what a
 * source's open reads). */
bool ckptfs_srcfiles_pread(const CkptfsSrcFiles *files, unsigned index, void *buf, size_t len,
                           uint64_t offset, GError **error);

/* Starts reading bytes [OFFSET, OFFSET + LEN) of file INDEX into the page cache, without
 * waiting; errors are ignored. Of a packed file: the frames that hold them are decoded into the
 * frame cache on decoder threads (one per CPU, 16 at most), as long as the frames being decoded
 * take at most half the cache; a frame that fails is left to its reader, which reports why. */
void ckptfs_srcfiles_advise(const CkptfsSrcFiles *files, unsigned index, uint64_t offset, uint64_t len);

/* At most BYTES of decoded frames kept (more while readers hold them). */
void ckptfs_srcfiles_set_frame_cache(CkptfsSrcFiles *files, uint64_t bytes);
/* The prefetch window of a reader of these files for the option's value OPTION (options.h): the
 * value itself, or for CKPTFS_PREFETCH_AUTO:
 * - CKPTFS_PREFETCH_PACKED when a file is packed (its frames are then decoded ahead on other
 *   threads);
 * - CKPTFS_PREFETCH_DISK when every file is on a local disk's file system (a cold reader of a
 *   synthesized file gathers ranges the source's own read-ahead does not see coming: 0.68 -> 0.87
 *   of a direct read on a GPU node, docs/performance.md);
 * - none otherwise: on a network or FUSE file system (object-store clients) advice over a row-
 *   parallel share's span would fetch the other ranks' columns too, and tmpfs needs none. */
#define CKPTFS_PREFETCH_PACKED (16ull << 20)
#define CKPTFS_PREFETCH_DISK (32ull << 20)
uint64_t ckptfs_srcfiles_prefetch_window(const CkptfsSrcFiles *files, uint64_t option);
/* Frames of packed files decoded so far (a frame several threads want at once is decoded once). */
uint64_t ckptfs_srcfiles_frames_decoded(const CkptfsSrcFiles *files);
/* The largest frame of the packed files added so far, in original bytes, and in *INDEX the file
 * that has it; 0 (INDEX untouched) when none is packed. */
uint32_t ckptfs_srcfiles_largest_frame(const CkptfsSrcFiles *files, unsigned *index);
/* Whether what file INDEX gives is its bytes as stored (not decoded from a packed container):
 * the kernel may then read it itself (FUSE passthrough). */
bool ckptfs_srcfiles_as_stored(const CkptfsSrcFiles *files, unsigned index);
/* What packed file INDEX holds (false for a file that is not packed). */
bool ckptfs_srcfiles_container_stats(const CkptfsSrcFiles *files, unsigned index, CkptfsContainerStats *out);

/* A new descriptor of file INDEX (the caller closes it), checked to be the file first opened,
 * unchanged; -1 with an error naming the file otherwise (CHANGED when it was replaced or
 * rewritten: it then stays refused, as after a read). */
int ckptfs_srcfiles_open_fd(const CkptfsSrcFiles *files, unsigned index, GError **error);

/* Checks that the path of file INDEX still names the file first opened, unchanged (a file
 * replaced by rename is caught here; one changed in place by every read too). */
bool ckptfs_srcfiles_unchanged(const CkptfsSrcFiles *files, unsigned index, GError **error);

/* The access of something made of files INDEXES[0..N) (all files when N is 0): each permission
 * class keeps only the read bits every file grants it, so nobody reads bytes through a view that
 * a file of the source would not let them read. Files of different owners give the result to
 * DAEMON_UID (which opened them all) with read for the owner; of different groups, to
 * DAEMON_GID with the group getting only what others get. */
CkptfsAccess ckptfs_srcfiles_access(const CkptfsSrcFiles *files, const uint32_t *indexes,
                                    unsigned n, uint32_t daemon_uid, uint32_t daemon_gid);

/* Mapped reads (core/io/srcmap.c): replies written from a mapping of a source file while this
 * process holds a read lease on it, one copy of each byte fewer than a pread. A writer opening
 * the file makes the lease be given back first: no new reply uses the mapping, those being
 * written finish, then the writer goes on and the file is read with pread (and checked) again.
 *
 * Lease breaks come as a signal (ckptfs_lease_signal(); SIGIO when too many are queued), blocked
 * in every thread of the process (ckptfs_leases_block_signals, before any thread is made) and
 * read by one watcher thread for every set of the process. */
typedef struct CkptfsLeaseWatch CkptfsLeaseWatch;
int ckptfs_lease_signal(void);
bool ckptfs_leases_block_signals(void);
/* Starts the watcher; fails when the signals are not blocked in the calling thread. */
CkptfsLeaseWatch *ckptfs_lease_watch_new(GError **error);
/* Files of FILES are leased and mapped from now on, on first use (nothing when already added).
 * Freeing the set gives its leases back and takes it out of the watch. */
void ckptfs_lease_watch_add(CkptfsLeaseWatch *watch, CkptfsSrcFiles *files);
/* Stops the watcher and gives back the leases of every set still in it. */
void ckptfs_lease_watch_free(CkptfsLeaseWatch *watch);
/* Leases held now, and given back to writers so far. */
void ckptfs_lease_watch_stats(const CkptfsLeaseWatch *watch, unsigned *held, unsigned *given_back);
/* The mapping of file INDEX, pinned (not unmapped, its lease kept) until
 * ckptfs_srcfiles_map_unpin; NULL where mapped reads are off, the file is packed, its file
 * system not local, the lease refused (another process has it open for writing, or the daemon
 * neither owns it nor has CAP_LEASE) or given back. */
const uint8_t *ckptfs_srcfiles_map_pin(const CkptfsSrcFiles *files, unsigned index);
void ckptfs_srcfiles_map_unpin(const CkptfsSrcFiles *files, unsigned index);
/* For a pinned file, the check a pread makes after reading: still the file first opened, its
 * size, mtime and ctime unchanged (a lease is not broken by touch or chmod). */
bool ckptfs_srcfiles_map_check(const CkptfsSrcFiles *files, unsigned index, GError **error);
/* Whether bytes [OFFSET, OFFSET + LEN) of pinned file INDEX are to be sent from its mapping:
 * they are in the page cache, and so is the page as far past them as the kernel's read-ahead of
 * the source goes. Pages that are not would be read one fault at a time; and while a cold file is
 * being read ahead, the pages just read ahead are left to pread, whose reads start the next
 * read-ahead (a mapping's reads would not). */
bool ckptfs_srcfiles_map_cached(const CkptfsSrcFiles *files, unsigned index, uint64_t offset, uint64_t len);

#endif
