/* What -o readahead makes of a mount. off: nothing pushed. SIZE: every file read through the
 * mount's page cache gets its chunks pushed (readahead.h), at most SIZE ahead of all readers.
 * auto (the default): only a lone reader of a streamed file (a rank file, mcore/'s files: direct
 * I/O otherwise) is read through the page cache with its chunks pushed, and only on a machine with
 * cores to spare for building them.
 *
 * Why lone: on a 16-core node one cached reader of tp4pp1/ read 4.29-4.70 GB/s pushed against 2.60
 * with direct I/O, but 4-16 readers pushed lost up to two thirds (12.56 against 38.25 GB/s at 16)
 * and TP-4/TP-8 loads got slower. Why cores: on 2 vCPUs one pushed reader read 0.78 GB/s against
 * 1.27 with direct I/O (the daemon's CPU per GB doubles and has no idle core to run on); one
 * pushed reader on the node kept about 3 daemon cores and 1 reader core busy. */
#ifndef CKPTFS_READAHEAD_POLICY_H
#define CKPTFS_READAHEAD_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/options.h"

/* auto turns on from this many cores: a pushed stream keeps about 4 busy, half the machine. */
#define CKPTFS_READAHEAD_AUTO_MIN_CORES 8u
/* auto's bytes ahead of all readers (the node's measured setting, readahead=64M). */
#define CKPTFS_READAHEAD_AUTO_CAP (64ull << 20)
/* auto pushes while at most this many streamed files are open (-o readahead_streams). */
#define CKPTFS_READAHEAD_AUTO_STREAMS 1u

typedef enum {
    CKPTFS_AHEAD_OFF,    /* nothing pushed */
    CKPTFS_AHEAD_CACHED, /* every file read through the page cache (readahead=SIZE) */
    CKPTFS_AHEAD_LONE,   /* streamed files, while at most STREAMS are open (readahead=auto) */
} CkptfsAheadMode;

typedef struct {
    CkptfsAheadMode mode;
    bool automatic;   /* readahead=auto (OFF then: too few cores) */
    uint64_t cap;     /* bytes of chunks ahead of all readers together */
    uint64_t window;  /* how far ahead of one reader */
    unsigned cores;   /* counted: -o readahead_cores, else MACHINE_CORES */
    bool cores_given; /* -o readahead_cores */
    unsigned streams; /* LONE: the most streamed files open for pushing to run */
} CkptfsReadaheadPolicy;

/* The cores this process may run on (its CPU affinity). */
unsigned ckptfs_readahead_machine_cores(void);
/* The policy OPTIONS ask for on a machine of MACHINE_CORES cores. */
void ckptfs_readahead_policy(const CkptfsOptions *options, unsigned machine_cores, CkptfsReadaheadPolicy *out);
/* One line for the log and inspect, e.g. "auto: off: 2 cores, 8 needed (-o readahead_cores=N
 * counts otherwise)" (caller frees). */
char *ckptfs_readahead_policy_describe(const CkptfsReadaheadPolicy *p);

#endif
