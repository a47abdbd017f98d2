/* MXFP4 experts dequantised to bf16 on read, one thread: what a daemon thread does for a read of
 * GPT-OSS's experts served as bf16. A source file of random MXFP4 blocks and scales (E experts of
 * [R, C/32, 16] and [R, C/32]) is written to DIR and read from the page cache through
 * ckptfs_plan_read (no FUSE):
 *
 *   plain       the bf16 output's size as a plain run of a file (the baseline of the ratios)
 *   rows        each expert's stored rows (a Megatron view's fc1/fc2: rows of [R, C])
 *   gate        every other stored row (gate rows of GPT-OSS's interleaved gate_up)
 *   transposed  each expert's [C, R] (hf/ with -o dtype=bf16: transformers' [E, H, 2F])
 *
 *   mxfp4_bench [--rounds N] [--read KIB] [--rows R] [--cols C] [--experts E] [--only CASE] [--wall] DIR
 *
 * Each MXFP4 case is read twice in the same run: copied (every source byte read into the daemon
 * first, as with -o mapped_reads=off: stored columns decoded a band at a time and kept with the
 * plan) and mapped (the source file leased and mapped, as a mount reads it by default: decoded
 * where the codes lie). Prints GB/s of bf16 output per second of this thread's CPU time (of the
 * wall clock with --wall) for each, the best of N rounds (default 5), its ratio to the plain
 * read, the mapped/copied ratio, and the memory the plan still holds once read (malloc's bytes in
 * use after the reads, less before). Defaults: GPT-OSS-120B's gate_up_proj (R 5760 = 2F, C 2880
 * = H), 4 experts (127 MiB of bf16), reads of 1 MiB. */
#include <glib.h>
#include <glib/gstdio.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "plan_bench.h"

/* The plan of case C (0 plain, 1 rows, 2 gate, 3 transposed) over EXPERTS experts of [ROWS,
 * COLS], their scales at BLOCKS. */
static CkptfsPlan *build_case(size_t c, uint64_t experts, uint64_t rows, uint64_t cols, uint64_t blocks)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    for (uint64_t e = 0; e < experts; e++) {
        CkptfsMxfp4 where = {.blocks_src = 0, .scales_src = 0, .blocks_base = 0, .scales_base = blocks,
                             .cols = cols, .row0 = e * rows, .row_step = 1};
        if (c == 0) {
            ckptfs_plan_add_run(b, 0, e * rows * cols * 2, rows * cols * 2);
        } else if (c == 1) {
            ckptfs_plan_add_mxfp4(b, &where, rows, cols);
        } else if (c == 2) { /* gate rows, then up rows */
            where.row_step = 2;
            ckptfs_plan_add_mxfp4(b, &where, rows / 2, cols);
            where.row0++;
            ckptfs_plan_add_mxfp4(b, &where, rows / 2, cols);
        } else {
            where.transposed = true;
            ckptfs_plan_add_mxfp4(b, &where, cols, rows);
        }
    }
    return ckptfs_plan_builder_finish(b);
}

/* Bytes malloc has given out and not had back (mapped chunks included). */
static double heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
}

/* GB/s of PLAN's output read whole in READ-byte requests as CTX says, per second of CLOCK (this
 * thread's CPU time: a machine shared with other work slows the wall clock, not it), the best of ROUNDS
 * after a read that warms the page cache; HELD: malloc's bytes in use after the reads less
 * before. */
static double read_rate(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, size_t read, int rounds, clockid_t clock,
                        double *held)
{
    double before = heap_in_use();
    bench_best_read_seconds_ctx(plan, ctx, read, 1, clock, "mxfp4_bench");
    double t = bench_best_read_seconds_ctx(plan, ctx, read, rounds, clock, "mxfp4_bench");
    *held = heap_in_use() - before;
    return (double)ckptfs_plan_size(plan) / t / 1e9;
}

int main(int argc, char **argv)
{
    int rounds = 5;
    uint64_t read_kib = 1024, rows = 5760, cols = 2880, experts = 4;
    const char *dir = NULL, *only = NULL;
    clockid_t clock = CLOCK_THREAD_CPUTIME_ID;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--read") == 0)
            read_kib = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--rows") == 0)
            rows = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--cols") == 0)
            cols = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--experts") == 0)
            experts = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--only") == 0)
            only = argv[++i];
        else if (strcmp(argv[i], "--wall") == 0)
            clock = CLOCK_MONOTONIC;
        else
            dir = argv[i];
    }
    if (dir == NULL || rounds < 1 || read_kib == 0 || rows < 2 || cols == 0 || cols % 32 != 0 || experts == 0) {
        fprintf(stderr, "usage: mxfp4_bench [--rounds N] [--read KIB] [--rows R] [--cols C (a multiple of 32)] "
                        "[--experts E] [--only CASE] [--wall] DIR\n");
        return 2;
    }
    /* The file: blocks, then scales; long enough to hold the plain read's bytes too. */
    uint64_t elems = experts * rows * cols, blocks = elems / 2, scales = elems / 32;
    uint64_t size = MAX(blocks + scales, elems * 2);
    g_autofree char *path = g_build_filename(dir, "mxfp4_bench.src", NULL);
    {
        g_autofree uint8_t *data = g_malloc(size);
        GRand *rng = g_rand_new_with_seed(1);
        for (uint64_t i = 0; i < size; i++)
            data[i] = i >= blocks && i < blocks + scales ? (uint8_t)g_rand_int_range(rng, 110, 130)
                                                          : (uint8_t)g_rand_int(rng);
        g_rand_free(rng);
        if (!g_file_set_contents(path, (const char *)data, (gssize)size, NULL)) {
            fprintf(stderr, "mxfp4_bench: cannot write %s\n", path);
            return 1;
        }
    }
    /* the lease signals blocked before any thread is made, as the daemon does */
    GError *error = NULL;
    CkptfsLeaseWatch *watch = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(&error) : NULL;
    if (watch == NULL) {
        fprintf(stderr, "mxfp4_bench: no lease watch: %s\n", error ? error->message : "signals not blocked");
        return 1;
    }
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    if (ckptfs_srcfiles_add(files, path, &error) < 0) {
        fprintf(stderr, "mxfp4_bench: %s\n", error->message);
        return 1;
    }
    ckptfs_lease_watch_add(watch, files);
    static CkptfsReplyRefs refs;
    const CkptfsReadCtx mapped = {.files = files, .refs = &refs};
    const uint8_t *map = ckptfs_srcfiles_map_pin(files, 0);
    if (map == NULL) {
        fprintf(stderr, "mxfp4_bench: %s is not mapped (no lease on its file system?)\n", path);
        return 1;
    }
    ckptfs_srcfiles_map_unpin(files, 0);
    static const char *const cases[] = {"plain", "rows", "gate", "transposed"};
    double base = 0;
    printf("experts %" G_GUINT64_FORMAT " x MXFP4 [R %" G_GUINT64_FORMAT ", C %" G_GUINT64_FORMAT "], reads of %"
           G_GUINT64_FORMAT " KiB, best of %d, one thread, %s; copied | mapped\n", experts, rows, cols, read_kib, rounds,
           clock == CLOCK_MONOTONIC ? "wall clock" : "CPU time");
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        if (c > 0 && only != NULL && strcmp(only, cases[c]) != 0)
            continue; /* the plain read stays: the ratios' base */
        CkptfsPlan *plan = build_case(c, experts, rows, cols, blocks);
        double held, held_mapped;
        double gbs = read_rate(plan, CKPTFS_READ_SHARED(files), (size_t)read_kib << 10, rounds, clock, &held);
        if (c == 0) {
            base = gbs;
            printf("  %-12s %7.2f GB/s\n", cases[c], gbs);
        } else {
            ckptfs_plan_free(plan); /* a fresh plan: nothing the copied reads kept */
            plan = build_case(c, experts, rows, cols, blocks);
            double gbs_mapped = read_rate(plan, &mapped, (size_t)read_kib << 10, rounds, clock, &held_mapped);
            printf("  %-12s %7.2f GB/s %5.2f of plain, held %6.1f MiB | %7.2f GB/s %5.2f of plain, held %6.1f MiB"
                   " | mapped/copied %.2f\n",
                   cases[c], gbs, gbs / base, held / (1 << 20), gbs_mapped, gbs_mapped / base,
                   held_mapped / (1 << 20), gbs_mapped / gbs);
        }
        ckptfs_plan_free(plan);
    }
    ckptfs_srcfiles_free(files);
    ckptfs_lease_watch_free(watch);
    g_unlink(path);
    return 0;
}
