#include "ckptfs/readahead_policy.h"

#include <glib.h>
#include <sched.h>

#include "ckptfs/readahead.h"

unsigned ckptfs_readahead_machine_cores(void)
{
    /* The CPUs this process may run on (taskset, a cgroup's cpuset), not all the machine has. */
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return (unsigned)CPU_COUNT(&set);
    return g_get_num_processors();
}

void ckptfs_readahead_policy(const CkptfsOptions *options, unsigned machine_cores, CkptfsReadaheadPolicy *out)
{
    bool automatic = options->readahead == CKPTFS_READAHEAD_AUTO;
    unsigned cores = options->readahead_cores ? options->readahead_cores : MAX(machine_cores, 1u);
    uint64_t cap = automatic ? CKPTFS_READAHEAD_AUTO_CAP : options->readahead;
    CkptfsAheadMode mode = CKPTFS_AHEAD_OFF;
    if (automatic)
        mode = cores >= CKPTFS_READAHEAD_AUTO_MIN_CORES ? CKPTFS_AHEAD_LONE : CKPTFS_AHEAD_OFF;
    else if (options->readahead > 0)
        mode = CKPTFS_AHEAD_CACHED;
    *out = (CkptfsReadaheadPolicy){
        .mode = mode,
        .automatic = automatic,
        .cap = mode == CKPTFS_AHEAD_OFF ? 0 : cap,
        .window = mode == CKPTFS_AHEAD_OFF ? 0 : MIN(cap, CKPTFS_READAHEAD_WINDOW),
        .cores = cores,
        .cores_given = options->readahead_cores > 0,
        .streams = options->readahead_streams ? options->readahead_streams : CKPTFS_READAHEAD_AUTO_STREAMS,
    };
}

char *ckptfs_readahead_policy_describe(const CkptfsReadaheadPolicy *p)
{
    g_autofree char *cap = g_format_size_full(p->cap, G_FORMAT_SIZE_IEC_UNITS);
    const char *counted = p->cores_given ? " (-o readahead_cores)" : "";
    switch (p->mode) {
    case CKPTFS_AHEAD_LONE:
        return g_strdup_printf("auto: on: %u core%s%s, %u needed; a rank or mcore/ file opened as one of at most "
                               "%u such files open at once (-o readahead_streams) is read through the page cache with "
                               "chunks pushed ahead of its reader, paused while more are open; others as "
                               "direct_io says; %s ahead at most",
                               p->cores, p->cores == 1 ? "" : "s", counted, CKPTFS_READAHEAD_AUTO_MIN_CORES, p->streams,
                               cap);
    case CKPTFS_AHEAD_CACHED:
        return g_strdup_printf("%s: files read through the page cache get chunks pushed ahead of their readers, "
                               "%s ahead of all at most", cap, cap);
    case CKPTFS_AHEAD_OFF:
        break;
    }
    if (p->automatic)
        return g_strdup_printf("auto: off: %u core%s%s, %u needed (-o readahead_cores=N counts otherwise)", p->cores,
                               p->cores == 1 ? "" : "s", counted, CKPTFS_READAHEAD_AUTO_MIN_CORES);
    return g_strdup("off");
}
