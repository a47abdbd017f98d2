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

static inline double bench_clock(clockid_t clock)
{
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static inline double bench_now(void)
{
    return bench_clock(CLOCK_MONOTONIC);
}

/* Seconds of CLOCK to read PLAN whole in READ-byte requests as CTX says (REFS, when it has them,
 * released after each read as a reply's are), the best of ROUNDS; a read error ends the program
 * with PROGRAM's name. */
static inline double bench_best_read_seconds_ctx(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, size_t read,
                                                 int rounds, clockid_t clock, const char *program)
{
    g_autofree uint8_t *buf = g_malloc(read);
    double best = 1e30;
    for (int r = 0; r < rounds; r++) {
        double t0 = bench_clock(clock);
        for (uint64_t off = 0; off < ckptfs_plan_size(plan); off += read) {
            GError *error = NULL;
            int64_t n = ckptfs_plan_read(plan, ctx, buf, read, off, &error);
            if (ctx->refs != NULL)
                ckptfs_reply_refs_release(ctx->files, ctx->refs);
            if (n < 0) {
                fprintf(stderr, "%s: %s\n", program, error->message);
                exit(1);
            }
        }
        double t = bench_clock(clock) - t0;
        best = t < best ? t : best;
    }
    return best;
}

/* Wall-clock seconds through FILES' shared descriptors, every byte copied. */
static inline double bench_best_read_seconds(const CkptfsPlan *plan, const CkptfsSrcFiles *files, size_t read,
                                             int rounds, const char *program)
{
    return bench_best_read_seconds_ctx(plan, CKPTFS_READ_SHARED(files), read, rounds, CLOCK_MONOTONIC, program);
}

#endif
