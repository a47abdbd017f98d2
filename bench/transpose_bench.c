/* Reading experts out of a fused tensor stored transposed, one thread: what a daemon thread does
 * for a view's read of an expert's weight when the source holds [E, F, H] (Qwen3-VL-MoE's and
 * GPT-OSS's releases) rather than per-expert [H, F]. A source file of random bf16 (or fp32)
 * experts is written to DIR and read from the page cache; the same bytes are read
 *
 *   contiguous  as a plain run of the file (a per-expert tensor's read: the baseline)
 *   transposed  as the experts' [H, F] matrices, through TRANSPOSE extents
 *   interleaved as their gate halves with gate and up interleaved (GPT-OSS: rows two apart)
 *   fp32->bf16  transposed and converted (an fp32 source served as bf16)
 *   fc1-join    as hf/'s gate_up_proj [H, 2F] of Megatron fc1s [2F, H] (gate rows, then up rows):
 *               gate and up interleaved column by column, each stored transposed (GPT-OSS's
 *               joined experts; --ffn is then 2F)
 *
 *   transpose_bench [--rounds N] [--read KIB] [--hidden H] [--ffn F] [--experts E] [--only CASE] [--wall] DIR
 *
 * Each case but the contiguous one is read two ways: copied (the source's runs read into the
 * daemon, as with -o mapped_reads=off) and mapped (the file leased and mapped, as a mount reads
 * it by default: transposed where the cached pages lie). Prints GB/s of output per second of this
 * thread's CPU time (a shared machine slows the wall clock, not it; the wall clock with --wall),
 * the best of N rounds (default 5), each one's ratio to the contiguous read and mapped/copied.
 * Defaults: Qwen3-30B-A3B's experts (H 2048, F 768), 32 of them (96 MiB of bf16), reads of 1 MiB. */
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "plan_bench.h"

/* GB/s of output reading PLAN whole in READ-byte requests as CTX says, by CLOCK, the best of
 * ROUNDS after a first read that warms the page cache. */
static double read_rate(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, size_t read, int rounds, clockid_t clock)
{
    bench_best_read_seconds_ctx(plan, ctx, read, 1, clock, "transpose_bench");
    double t = bench_best_read_seconds_ctx(plan, ctx, read, rounds, clock, "transpose_bench");
    return (double)ckptfs_plan_size(plan) / t / 1e9;
}

int main(int argc, char **argv)
{
    int rounds = 5;
    uint64_t read_kib = 1024, hidden = 2048, ffn = 768, experts = 32;
    const char *dir = NULL, *only = NULL;
    clockid_t clock = CLOCK_THREAD_CPUTIME_ID;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--wall") == 0)
            clock = CLOCK_MONOTONIC;
        else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(argv[i], "--read") == 0)
            read_kib = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--hidden") == 0)
            hidden = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--ffn") == 0)
            ffn = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--experts") == 0)
            experts = strtoull(argv[++i], NULL, 10);
        else if (i + 1 < argc && strcmp(argv[i], "--only") == 0)
            only = argv[++i];
        else
            dir = argv[i];
    }
    if (dir == NULL || rounds < 1 || read_kib == 0 || hidden == 0 || ffn == 0 || experts == 0) {
        fprintf(stderr, "usage: transpose_bench [--rounds N] [--read KIB] [--hidden H] [--ffn F] [--experts E] [--only CASE] [--wall] DIR\n");
        return 2;
    }
    /* fp32 experts: the bf16 cases read the first half of the file as bf16 elements. */
    uint64_t elems = experts * hidden * ffn, size = elems * 4;
    g_autofree char *path = g_build_filename(dir, "transpose_bench.src", NULL);
    {
        g_autofree uint32_t *data = g_new(uint32_t, elems);
        GRand *rng = g_rand_new_with_seed(1);
        for (uint64_t i = 0; i < elems; i++)
            data[i] = g_rand_int(rng) & 0xBFFFFFFFu; /* finite values */
        g_rand_free(rng);
        if (!g_file_set_contents(path, (const char *)data, (gssize)size, NULL)) {
            fprintf(stderr, "transpose_bench: cannot write %s\n", path);
            return 1;
        }
    }
    /* the lease signals blocked before any thread is made, as the daemon does */
    GError *error = NULL;
    CkptfsLeaseWatch *watch = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(&error) : NULL;
    if (watch == NULL) {
        fprintf(stderr, "transpose_bench: no lease watch: %s\n", error ? error->message : "signals not blocked");
        return 1;
    }
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    if (ckptfs_srcfiles_add(files, path, &error) < 0) {
        fprintf(stderr, "transpose_bench: %s\n", error->message);
        return 1;
    }
    ckptfs_lease_watch_add(watch, files);
    static CkptfsReplyRefs refs;
    const CkptfsReadCtx mapped = {.files = files, .refs = &refs};
    if (ckptfs_srcfiles_map_pin(files, 0) == NULL) {
        fprintf(stderr, "transpose_bench: %s is not mapped (no lease on its file system?)\n", path);
        return 1;
    }
    ckptfs_srcfiles_map_unpin(files, 0);
    struct {
        const char *name;
        CkptfsDtype stored;
        CkptfsConvert conv;
        unsigned interleave; /* 1: halves; 2: rows two apart (the gate of [.., 2F] interleaved); 3: fc1 join */
    } cases[] = {
        {"contiguous", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 0},
        {"transposed", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 1},
        {"interleaved", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 2},
        {"fp32->bf16", CKPTFS_DTYPE_F32, CKPTFS_CONVERT_F32_TO_BF16, 1},
        {"fc1-join", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 3},
    };
    double base = 0;
    printf("experts %" G_GUINT64_FORMAT " x [H %" G_GUINT64_FORMAT ", F %" G_GUINT64_FORMAT "], reads of %"
           G_GUINT64_FORMAT " KiB, best of %d, one thread, %s; copied | mapped\n", experts, hidden, ffn, read_kib,
           rounds, clock == CLOCK_MONOTONIC ? "wall clock" : "CPU time");
    for (size_t c = 0; c < G_N_ELEMENTS(cases); c++) {
        if (c > 0 && only != NULL && strcmp(only, cases[c].name) != 0)
            continue; /* the contiguous read stays: the ratios' base */
        size_t isz = cases[c].stored == CKPTFS_DTYPE_F32 ? 4 : 2;
        CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
        if (cases[c].interleave == 0) {
            ckptfs_plan_add_run(b, 0, 0, elems * 2);
        } else {
            for (uint64_t e = 0; e < experts; e++) {
                uint64_t at = e * hidden * ffn * isz;
                if (cases[c].interleave == 3) { /* gate_up_proj [H, F] of fc1 [F, H]: gate rows, up rows */
                    CkptfsStridedItem it[2];
                    for (unsigned half = 0; half < 2; half++)
                        it[half] = (CkptfsStridedItem){.src = 0, .base = at + half * ffn / 2 * hidden * isz,
                                                       .row_stride = isz, .col_stride = hidden * isz,
                                                       .cols = ffn / 2, .ways = half == 0 ? 2 : 0, .run = 1};
                    ckptfs_plan_add_strided(b, cases[c].stored, cases[c].conv, hidden, it, 2);
                    continue;
                }
                if (cases[c].interleave == 1) { /* down_proj [H, F] of its stored [F, H] */
                    CkptfsStridedItem it = {.src = 0, .base = at, .row_stride = isz, .col_stride = hidden * isz,
                                            .cols = ffn};
                    ckptfs_plan_add_strided(b, cases[c].stored, cases[c].conv, hidden, &it, 1);
                    continue;
                }
                /* gate and up [F / 2, H] of a stored [H, F] whose columns alternate gate, up */
                for (unsigned half = 0; half < 2; half++) {
                    CkptfsStridedItem it = {.src = 0, .base = at + half * isz, .row_stride = 2 * isz,
                                            .col_stride = ffn * isz, .cols = hidden};
                    ckptfs_plan_add_strided(b, cases[c].stored, cases[c].conv, ffn / 2, &it, 1);
                }
            }
        }
        CkptfsPlan *plan = ckptfs_plan_builder_finish(b);
        double gbs = read_rate(plan, CKPTFS_READ_SHARED(files), (size_t)read_kib << 10, rounds, clock);
        if (c == 0) {
            base = gbs;
            printf("  %-12s %7.2f GB/s\n", cases[c].name, gbs);
        } else {
            double gbs_mapped = read_rate(plan, &mapped, (size_t)read_kib << 10, rounds, clock);
            printf("  %-12s %7.2f GB/s %5.2f of contiguous | %7.2f GB/s %5.2f of contiguous | mapped/copied %.2f\n",
                   cases[c].name, gbs, gbs / base, gbs_mapped, gbs_mapped / base, gbs_mapped / gbs);
        }
        ckptfs_plan_free(plan);
    }
    ckptfs_srcfiles_free(files);
    ckptfs_lease_watch_free(watch);
    g_unlink(path);
    return 0;
}
