/* What core/io/srcfiles.c and core/io/srcmap.c share: the set's and each file's state. */
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

/* A file with its place in the descriptor cache. */
typedef struct {
    CkptfsSrcFile pub;
    int fd;         /* -1 while closed */
    unsigned pins;  /* reads in progress with fd: it is not closed under them */
    GList *lru;     /* its link in the open list while open */
    gint changed;   /* set once a change was seen: every later read fails */
    uint64_t disk_size;          /* the file's own size (pub.size: what it holds) */
    CkptfsContainer *container;  /* a packed file (`ckptfs pack`): read as the original */
    /* Mapped reads (srcmap.c): the file mapped while this process holds a read lease on it. */
    gint map_state;      /* SRC_MAP_* */
    gint map_pins;       /* replies being written from the mapping */
    gint map_breaking;   /* the lease is being given back: no new pins */
    const uint8_t *map;  /* the whole file, PROT_READ, while map_state is SRC_MAP_READY */
    int lease_fd;        /* the descriptor holding the lease, -1 without one */
    uint64_t map_probe;  /* a read ahead of this far cached: the file is cached, not being read ahead */
    SrcFsKind fs_kind;   /* where it lies */
    uint64_t read_ahead; /* its device's read-ahead in bytes (SRC_READ_AHEAD_UNKNOWN: not on a
                            local disk, or sysfs does not say) */
    gint no_cachestat;   /* the kernel refused cachestat(2) for this file: not asked again */
} SrcFile;

#define SRC_READ_AHEAD_UNKNOWN UINT64_MAX

enum { SRC_MAP_UNTRIED, SRC_MAP_READY, SRC_MAP_REFUSED };

struct CkptfsSrcFiles {
    GPtrArray *files;     /* SrcFile* */
    GHashTable *by_path;  /* path -> index + 1 */
    GMutex lock;          /* the cache: fd, pins, lru of every file, open */
    GQueue open;          /* SrcFile* with an fd, most recently used first */
    unsigned max_open;
    CkptfsFrameCache *frames; /* decompressed frames of packed files */
    bool packed;              /* some file is packed */
    bool off_disk;            /* some file is not on a local disk (SRC_FS_DISK) */
    gint no_cachestat;        /* the kernel has no cachestat(2): not asked again */
    GThreadPool *decoders;    /* decode frames ahead of their readers; made on first use (after
                                 the daemon forks: GLib's pool threads are not inherited) */
    CkptfsLeaseWatch *leases; /* mapped reads (srcmap.c): the watch this set is in, NULL while off */
    unsigned leases_held;     /* files of this set leased and mapped (under lock) */
};

/* Whether F, as fstat or stat describes it in ST, is still the file first opened. */
bool ckptfs_srcfile_same(const SrcFile *f, const struct stat *st);
/* The check after a read through FD: F is still the file first opened, unchanged (false, with
 * ERROR set and F marked changed, otherwise). */
bool ckptfs_srcfile_check_fd(SrcFile *f, int fd, GError **error);
/* Marks F changed (every later read fails) and sets ERROR to say so; returns false. */
bool ckptfs_srcfile_report_changed(SrcFile *f, GError **error);
/* Ends mapped reads of FILES: gives every lease back, leaves its watch (srcmap.c; called by
 * ckptfs_srcfiles_free). */
void ckptfs_srcfiles_map_stop(CkptfsSrcFiles *files);

#endif
