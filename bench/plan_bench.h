/* What the C micro-benchmarks share: a monotonic clock, and the best time of reading a plan
 * whole in fixed-size requests (the read engine alone, no FUSE). */
#ifndef CKPTFS_BENCH_PLAN_BENCH_H
#define CKPTFS_BENCH_PLAN_BENCH_H

#include <glib.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"

static inline double bench_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Seconds to read PLAN whole in READ-byte requests, the best of ROUNDS; a read error ends the
 * program with PROGRAM's name. */
static inline double bench_best_read_seconds(const CkptfsPlan *plan, const CkptfsSrcFiles *files, size_t read,
                                             int rounds, const char *program)
{
    g_autofree uint8_t *buf = g_malloc(read);
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_now();
        for (uint64_t off = 0; off < ckptfs_plan_size(plan); off += read) {
            GError *error = NULL;
            if (ckptfs_plan_read(plan, CKPTFS_READ_SHARED(files), buf, read, off, &error) < 0) {
                fprintf(stderr, "%s: %s\n", program, error->message);
                exit(1);
            }
        }
        double t = bench_now() - t0;
        best = t < best ? t : best;
    }
    return best;
}

#endif
