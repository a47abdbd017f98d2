/* -o readahead's policy (core/io/readahead_policy.c): auto is the default and turns on only from
 * 8 cores, as counted by the CPU affinity or -o readahead_cores; -o readahead_streams sets how many
 * streamed files may be open for pushing to run; readahead=SIZE and off keep their meaning; bad
 * values are refused by name; the line for the log and inspect says what was decided and why. */
#include <glib.h>
#include <sched.h>
#include <string.h>

#include "ckptfs/options.h"
#include "ckptfs/readahead.h"
#include "ckptfs/readahead_policy.h"
#include "tap.h"

/* The policy of options LIST on a machine of CORES cores, and its line. */
static CkptfsReadaheadPolicy policy_of(const char *list, unsigned cores, char **text)
{
    CkptfsOptions o;
    ckptfs_options_init(&o);
    GError *error = NULL;
    if (!ckptfs_options_apply_list(&o, list, &error))
        g_error("options %s: %s", list, error->message);
    CkptfsReadaheadPolicy p;
    ckptfs_readahead_policy(&o, cores, &p);
    ckptfs_options_clear(&o);
    *text = ckptfs_readahead_policy_describe(&p);
    return p;
}

static void test_auto(void)
{
    g_autofree char *t2 = NULL, *t7 = NULL, *t8 = NULL, *t16 = NULL;
    CkptfsReadaheadPolicy p2 = policy_of("", 2, &t2);
    tap_ok(p2.automatic && p2.mode == CKPTFS_AHEAD_OFF && p2.cap == 0,
           "the default is auto, and off on 2 cores (%s)", t2);
    tap_ok(strstr(t2, "2 cores") && strstr(t2, "8 needed") && strstr(t2, "readahead_cores"),
           "its line says the cores counted, the cores needed and the option that counts otherwise");
    CkptfsReadaheadPolicy p7 = policy_of("", 7, &t7);
    CkptfsReadaheadPolicy p8 = policy_of("", 8, &t8);
    CkptfsReadaheadPolicy p16 = policy_of("readahead=auto", 16, &t16);
    tap_ok(p7.mode == CKPTFS_AHEAD_OFF && p8.mode == CKPTFS_AHEAD_LONE && p16.mode == CKPTFS_AHEAD_LONE,
           "auto: off on 7 cores, on for lone streams from 8 (%s)", t8);
    tap_ok(p16.streams == 1 && p16.cap == (64ull << 20) && p16.window == CKPTFS_READAHEAD_WINDOW && !p16.cores_given,
           "auto pushes one stream at a time, 64 MiB ahead at most, 16 MiB ahead of one reader");
    tap_ok(strstr(t16, "16 cores") && strstr(t16, "at most 1 such") && strstr(t16, "readahead_streams"),
           "the line says the cores and the open files it allows (%s)", t16);
}

static void test_overrides(void)
{
    g_autofree char *a = NULL, *b = NULL, *c = NULL;
    CkptfsReadaheadPolicy forced = policy_of("readahead_cores=16", 2, &a);
    tap_ok(forced.mode == CKPTFS_AHEAD_LONE && forced.cores == 16 && forced.cores_given &&
               strstr(a, "16 cores (-o readahead_cores)"),
           "readahead_cores=16 turns auto on on 2 cores, and the line says it was counted so (%s)", a);
    CkptfsReadaheadPolicy fewer = policy_of("readahead_cores=4", 64, &b);
    tap_ok(fewer.mode == CKPTFS_AHEAD_OFF && fewer.cores == 4, "readahead_cores=4 turns it off on 64 cores (%s)", b);
    CkptfsReadaheadPolicy streams = policy_of("readahead_streams=3,readahead_cores=8", 2, &c);
    tap_ok(streams.mode == CKPTFS_AHEAD_LONE && streams.streams == 3 && strstr(c, "at most 3 such"),
           "readahead_streams=3 allows three open files (%s)", c);
}

static void test_size_and_off(void)
{
    g_autofree char *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    CkptfsReadaheadPolicy size = policy_of("readahead=64M", 2, &a);
    tap_ok(size.mode == CKPTFS_AHEAD_CACHED && !size.automatic && size.cap == (64ull << 20) &&
               size.window == CKPTFS_READAHEAD_WINDOW,
           "readahead=64M: every file read through the page cache, on 2 cores too (%s)", a);
    CkptfsReadaheadPolicy small = policy_of("readahead=4M,readahead_cores=1", 2, &b);
    tap_ok(small.mode == CKPTFS_AHEAD_CACHED && small.cap == (4u << 20) && small.window == (4u << 20),
           "readahead=4M: 4 MiB ahead of one reader and of all, whatever the cores counted");
    CkptfsReadaheadPolicy off = policy_of("readahead=off,readahead_cores=64", 64, &c);
    tap_ok(off.mode == CKPTFS_AHEAD_OFF && !off.automatic && strcmp(c, "off") == 0,
           "readahead=off stays off on 64 cores (%s)", c);
    CkptfsReadaheadPolicy back = policy_of("readahead=off,readahead=auto", 16, &d);
    tap_ok(back.automatic && back.mode == CKPTFS_AHEAD_LONE, "readahead=auto after off is auto again");
}

static void test_refused(void)
{
    const char *bad[][2] = {{"readahead_cores=0", "readahead_cores"},
                            {"readahead_cores=many", "readahead_cores"},
                            {"readahead_streams=0", "readahead_streams"},
                            {"readahead_streams", "readahead_streams"},
                            {"readahead=sometimes", "readahead"}};
    for (size_t i = 0; i < G_N_ELEMENTS(bad); i++) {
        CkptfsOptions o;
        ckptfs_options_init(&o);
        GError *error = NULL;
        bool taken = ckptfs_options_apply_list(&o, bad[i][0], &error);
        tap_ok(!taken && error != NULL && strstr(error->message, bad[i][1]), "%s is refused by name (%s)", bad[i][0],
               error ? error->message : "taken");
        g_clear_error(&error);
        ckptfs_options_clear(&o);
    }
}

/* The cores counted are those the process may run on: one, once its affinity is one CPU. */
static void test_machine_cores(void)
{
    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof all, &all) != 0 || CPU_COUNT(&all) < 2) {
        tap_skip(1, "needs two CPUs to run on");
        return;
    }
    int first = 0;
    while (!CPU_ISSET(first, &all))
        first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    unsigned before = ckptfs_readahead_machine_cores();
    g_assert(sched_setaffinity(0, sizeof one, &one) == 0);
    unsigned pinned = ckptfs_readahead_machine_cores();
    g_assert(sched_setaffinity(0, sizeof all, &all) == 0);
    tap_ok(before == (unsigned)CPU_COUNT(&all) && pinned == 1,
           "the cores counted follow the CPU affinity (%u, then %u pinned to one CPU)", before, pinned);
}

int main(void)
{
    test_machine_cores();
    test_auto();
    test_overrides();
    test_size_and_off();
    test_refused();
    return tap_done();
}
