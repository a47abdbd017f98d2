/* What the modules of the source-file set share (core/io/srcfiles.c: the set; srcfd.c: the
 * descriptor cache; srcplain.c and srcpacked.c: the two backends; srcmap.c: the plain backend's
 * mapped reads; leasewatch.c: their lease watcher): each file's state, the backend ops table and
 * the set itself. */
#ifndef CKPTFS_SRCFILES_INTERNAL_H
#define CKPTFS_SRCFILES_INTERNAL_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "ckptfs/srcfiles.h"

/* Where a source file lies: a local disk's file system (ext4, xfs, btrfs, f2fs: its leases see
 * every writer and its pages are read ahead from a device), memory (tmpfs), or anything else
 * (network and FUSE file systems, overlays). */
typedef enum { SRC_FS_DISK, SRC_FS_MEMORY, SRC_FS_OTHER } SrcFsKind;

typedef struct SrcBackend SrcBackend;

/* A file: what the set knows of it, its place in the descriptor cache, and its backend's state. */
typedef struct {
    CkptfsSrcFile pub;
    unsigned index;             /* in the set */
    const SrcBackend *backend;  /* how its bytes are read */
    int fd;         /* -1 while closed (srcfd.c) */
    unsigned pins;  /* reads in progress with fd: it is not closed under them */
    GList *lru;     /* its link in the open list while open */
    gint changed;   /* set once a change was seen: every later read fails */
    uint64_t disk_size;          /* the file's own size (pub.size: what it holds) */
    SrcFsKind fs_kind;           /* where it lies */
    uint64_t read_ahead; /* its device's read-ahead in bytes (SRC_READ_AHEAD_UNKNOWN: not on a
                            local disk, or sysfs does not say) */
    /* The packed backend's (srcpacked.c): the container's index. */
    CkptfsContainer *container;
    /* The plain backend's (srcplain.c, srcmap.c). */
    gint no_cachestat;   /* the kernel refused cachestat(2) for this file: not asked again */
    gint map_state;      /* SRC_MAP_* */
    gint map_pins;       /* replies being written from the mapping */
    gint map_breaking;   /* the lease is being given back: no new pins */
    const uint8_t *map;  /* the whole file, PROT_READ, while map_state is SRC_MAP_READY */
    int lease_fd;        /* the descriptor holding the lease, -1 without one */
    uint64_t map_probe;  /* a read ahead of this far cached: the file is cached, not being read ahead */
} SrcFile;

#define SRC_READ_AHEAD_UNKNOWN UINT64_MAX

enum { SRC_MAP_UNTRIED, SRC_MAP_READY, SRC_MAP_REFUSED };

/* How the bytes of a kind of source file are read. The set picks the first backend whose open
 * takes a file, and every read, advice and pin of it goes through its ops. */
struct SrcBackend {
    const char *name;
    /* Takes F, just opened as FD (ST: its fstat; F's identity and place filled): 1 when F is
     * this backend's (F's size and state then set), 0 when it is not, -1 with an error naming
     * the file when it is but cannot be read. */
    int (*open)(SrcFile *f, int fd, const struct stat *st, GError **error);
    /* Reads the contiguous range at OFFSET of what F holds into IOV[0..N) (N > 0, no empty
     * buffer first), all of it, then checks F is still the file first opened. READER: the
     * reader's own descriptors, or NULL. */
    bool (*preadv)(const CkptfsSrcFiles *files, SrcFile *f, CkptfsSrcReader *reader, struct iovec *iov,
                   int n, uint64_t offset, GError **error);
    /* Starts reading [OFFSET, OFFSET + LEN) (LEN > 0) ahead of its readers; errors ignored. */
    void (*advise)(const CkptfsSrcFiles *files, SrcFile *f, uint64_t offset, uint64_t len);
    /* F's bytes as stored, pinned until map_unpin; NULL when they cannot be mapped now. NULL ops:
     * never mapped. */
    const uint8_t *(*map_pin)(const CkptfsSrcFiles *files, SrcFile *f);
    void (*map_unpin)(SrcFile *f);
    /* The identity check: whether F, as fstat or stat describes it in ST, is still the file
     * first opened. */
    bool (*same)(const SrcFile *f, const struct stat *st);
    /* Frees the backend's state of F (the set closes F's descriptor). */
    void (*close)(SrcFile *f);
    /* What is read is decoded from what is stored (no passthrough, no mapping; frames decoded
     * ahead on threads of the set, so prefetched further). */
    bool decoded;
};

extern const SrcBackend ckptfs_src_plain;
extern const SrcBackend ckptfs_src_packed;

/* The descriptor cache (srcfd.c). */
typedef struct SrcFdCache SrcFdCache;
SrcFdCache *ckptfs_srcfd_new(unsigned max_open);
void ckptfs_srcfd_free(SrcFdCache *cache);
unsigned ckptfs_srcfd_max_open(const SrcFdCache *cache);
/* F's first descriptor FD into the cache (closing others not in use to make room). */
void ckptfs_srcfd_insert(SrcFdCache *cache, SrcFile *f, int fd);
/* F's descriptor, pinned until ckptfs_srcfd_release; opened again (and checked to be the same
 * file) when the cache had closed it. -1 with an error naming the file. */
int ckptfs_srcfd_acquire(SrcFdCache *cache, SrcFile *f, GError **error);
void ckptfs_srcfd_release(SrcFdCache *cache, SrcFile *f);
/* Closes least recently used descriptors no read is using until KEEP are left. */
void ckptfs_srcfd_trim(SrcFdCache *cache, unsigned keep);
unsigned ckptfs_srcfd_open_count(SrcFdCache *cache);

/* The plain backend's mapped reads of a set (srcmap.c). */
typedef struct {
    GMutex lock;             /* map_state, map and lease_fd of every file while set up or given back; held */
    CkptfsLeaseWatch *watch; /* the watch the set is in, NULL while off (read atomically) */
    unsigned held;           /* files leased and mapped (under lock) */
    unsigned held_max;       /* each lease holds a descriptor beside the cache's: half its size */
} SrcMaps;

/* What the plain backend keeps for the whole set. */
typedef struct {
    gint no_cachestat; /* the kernel has no cachestat(2): not asked again */
    SrcMaps maps;
} SrcPlainSet;

/* What the packed backend keeps for the whole set (srcpacked.c). */
typedef struct SrcPackedSet SrcPackedSet;
SrcPackedSet *ckptfs_srcpacked_set_new(void);
/* Drops queued decodes, waits for running ones. */
void ckptfs_srcpacked_set_free(SrcPackedSet *set);

/* The set. Everything a read changes lies behind its pointers: reads take a const set. */
struct CkptfsSrcFiles {
    GPtrArray *files;     /* SrcFile* */
    GHashTable *by_path;  /* path -> index + 1 */
    SrcFdCache *fds;
    SrcPlainSet *plain;
    SrcPackedSet *packed_set;
    bool packed;          /* some file is read decoded (packed) */
    bool off_disk;        /* some file is not on a local disk (SRC_FS_DISK) */
};

/* The file of INDEX, or NULL with an error saying there is none. */
SrcFile *ckptfs_srcfiles_file(const CkptfsSrcFiles *files, unsigned index, GError **error);
/* The identity check of every backend that reads a file as stored on a local or mounted file
 * system: inode, device, size, mtime and ctime. */
bool ckptfs_srcfile_same(const SrcFile *f, const struct stat *st);
/* F's path opened again: a descriptor of the file first opened, or -1 with *OPEN_ERROR set when
 * it cannot be opened, or -2 when it names another file now (nothing kept open). */
int ckptfs_srcfile_reopen(const SrcFile *f, GError **open_error);
/* ckptfs_srcfile_reopen, with a file gone, replaced or no longer regular reported as changed
 * (the file then stays refused). */
int ckptfs_srcfile_reopen_checked(SrcFile *f, GError **error);
/* The check after a read through FD: F is still the file first opened, unchanged (false, with
 * ERROR set and F marked changed, otherwise). */
bool ckptfs_srcfile_check_fd(SrcFile *f, int fd, GError **error);
/* Marks F changed (every later read fails) and sets ERROR to say so; returns false. */
bool ckptfs_srcfile_report_changed(SrcFile *f, GError **error);
/* Ends mapped reads of FILES: gives every lease back, leaves its watch (srcmap.c; called by
 * ckptfs_srcfiles_free). */
void ckptfs_srcfiles_map_stop(CkptfsSrcFiles *files);
/* The plain backend's map ops (srcmap.c). */
const uint8_t *ckptfs_srcmap_pin(const CkptfsSrcFiles *files, SrcFile *f);
void ckptfs_srcmap_unpin(SrcFile *f);
/* Stops new pins of F's mapping; true when F has one (it is then to be given back). */
bool ckptfs_srcmap_stop_pins(SrcFile *f);
/* Once no reply is being written from F's mapping (ckptfs_srcmap_stop_pins was called, waits for
 * the pins to go): unmaps it and gives the lease back, counted off W. */
void ckptfs_srcmap_give_back(CkptfsLeaseWatch *w, SrcMaps *maps, SrcFile *f);
/* The lease watcher (leasewatch.c): whether it stopped (no lease may be taken), and leases held
 * counted by DELTA. */
bool ckptfs_lease_watch_stopped(CkptfsLeaseWatch *w);
void ckptfs_lease_watch_held(CkptfsLeaseWatch *w, int delta);

#endif
