/* Read-ahead pushed into a reader's cache: the windows of a synthesized file ahead of a
 * sequential reader are built on worker threads (plan reads, with every source check) and handed
 * to a push function, which the FUSE glue makes a store into the mount's page cache. The reader
 * then copies from its cache while the next windows are built on other cores, where a reader
 * served request by request has one request in flight.
 *
 * A file is cut into chunks of CKPTFS_READAHEAD_CHUNK bytes. A chunk is pushed without its first
 * page: the reader's miss on that page is the one request it sends per chunk, and tells where it
 * is (a cache that serves the reader itself reports nothing else). Each such read, and every read
 * that continues the previous ones, moves the window on: chunks up to WINDOW bytes past it are
 * queued. A read elsewhere (a seek) drops the chunks still queued for the file; a chunk the reader
 * reached before it was built is skipped. The chunks ahead of their readers (queued, being built,
 * or pushed and not yet reached), over all files, take at most CAP bytes: what the reader's cache
 * holds ahead of them. The daemon itself holds one chunk buffer per worker. */
#ifndef CKPTFS_READAHEAD_H
#define CKPTFS_READAHEAD_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/plan.h"

#define CKPTFS_READAHEAD_CHUNK (2u << 20)
/* How far ahead of one reader, at most (a reader copying from its cache needs a few chunks). */
#define CKPTFS_READAHEAD_WINDOW (16ull << 20)

typedef struct CkptfsReadahead CkptfsReadahead;
typedef struct CkptfsReadaheadStream CkptfsReadaheadStream;

/* Puts LEN bytes at OFFSET of file TARGET where its reader finds them (PUSH_DATA: what
 * ckptfs_readahead_new was given). False stops that file's read-ahead. */
typedef bool (*CkptfsReadaheadPush)(gpointer push_data, uint64_t target, uint64_t offset, const void *data,
                                    size_t len);

/* WINDOW: how far past a sequential reader chunks are pushed; CAP: the bytes of chunks ahead of
 * readers at once, over all files (rounded down to whole chunks, one at least); THREADS: workers
 * building them (0: one per CPU, 8 at most); LONE: 0, or the most streams opened with
 * ckptfs_readahead_open_lone that may be open for chunks to be pushed (readahead=auto). */
CkptfsReadahead *ckptfs_readahead_new(uint64_t window, uint64_t cap, unsigned threads, unsigned lone,
                                      CkptfsReadaheadPush push, gpointer push_data);
/* Its LONE. */
unsigned ckptfs_readahead_lone(const CkptfsReadahead *ra);
/* Drops what is queued, waits for the chunks being built, stops the workers. Streams must be
 * closed first. */
void ckptfs_readahead_free(CkptfsReadahead *ra);

/* A reader of PLAN (read through FILES and READER, as ckptfs_plan_read with them) whose chunks go to
 * push target TARGET. */
CkptfsReadaheadStream *ckptfs_readahead_open(CkptfsReadahead *ra, const CkptfsPlan *plan, const CkptfsSrcFiles *files,
                                             CkptfsSrcReader *reader, uint64_t target);
/* A lone stream (readahead=auto): counted among the open ones until closed. *PUSHES: whether it is
 * pushed, which is when fewer than LONE others are open (where one close would make it so, after
 * waiting up to 10 ms for that close: cp -r's close of the previous file may come after its next
 * open); one that is not never is (its reader may go on with direct I/O). A pushed one pauses while more than LONE are open: its queued chunks are
 * dropped and its reads queue none; once few enough are open, a read that continues the previous
 * one starts its window again. */
CkptfsReadaheadStream *ckptfs_readahead_open_lone(CkptfsReadahead *ra, const CkptfsPlan *plan,
                                                  const CkptfsSrcFiles *files, CkptfsSrcReader *reader,
                                                  uint64_t target, bool *pushes);
/* The reader was served LEN bytes at OFFSET (a read that came past its cache). */
void ckptfs_readahead_note(CkptfsReadaheadStream *s, uint64_t offset, uint64_t len);
/* Drops its queued chunks and waits for those being built: nothing is pushed for it after. */
void ckptfs_readahead_close(CkptfsReadaheadStream *s);

typedef struct {
    uint64_t chunks_pushed, bytes_pushed;
    uint64_t skipped;   /* the reader got there first */
    uint64_t dropped;   /* queued, then the reader moved away or closed the file */
    uint64_t failed;    /* a source read or the push failed (the reader's own read says why) */
    uint64_t peak_held; /* the most bytes of chunks ahead of readers at once */
    uint64_t cap;
    uint64_t lone_pushed, lone_unpushed; /* lone streams opened pushed, and among others */
    uint64_t crowded_reads;              /* reads of pushed streams while too many were open */
    uint64_t queued, building;           /* now: chunks waiting for a worker, and being built */
} CkptfsReadaheadStats;
void ckptfs_readahead_stats(CkptfsReadahead *ra, CkptfsReadaheadStats *out);

#endif
