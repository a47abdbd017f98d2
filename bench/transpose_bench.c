/* Reading experts out of a fused tensor stored transposed, one thread: what a daemon thread does
 * for a view's read of an expert's weight when the source holds [E, F, H] (Qwen3-VL-MoE's and
 * GPT-OSS's releases) rather than per-expert [H, F]. A source file of random bf16 (or fp32)
 * experts is written to DIR and read from the page cache; the same bytes are read
 *
 *   contiguous  as a plain run of the file (a per-expert tensor's read: the baseline)
 *   transposed  as the experts' [H, F] matrices, through TRANSPOSE extents
 *   interleaved as their gate halves with gate and up interleaved (GPT-OSS: rows two apart)
 *   fp32->bf16  transposed and converted (an fp32 source served as bf16)
 *
 *   transpose_bench [--rounds N] [--read KIB] [--hidden H] [--ffn F] [--experts E] [--only CASE] DIR
 *
 * Prints GB/s of output per second of this thread for each, the best of N rounds (default 5),
 * and each one's ratio to the contiguous read. Defaults: Qwen3-30B-A3B's experts (H 2048,
 * F 768), 32 of them (96 MiB of bf16), reads of 1 MiB. */
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "plan_bench.h"

int main(int argc, char **argv)
{
    int rounds = 5;
    uint64_t read_kib = 1024, hidden = 2048, ffn = 768, experts = 32;
    const char *dir = NULL, *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0)
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
        fprintf(stderr, "usage: transpose_bench [--rounds N] [--read KIB] [--hidden H] [--ffn F] [--experts E] [--only CASE] DIR\n");
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
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    if (ckptfs_srcfiles_add(files, path, &error) < 0) {
        fprintf(stderr, "transpose_bench: %s\n", error->message);
        return 1;
    }
    struct {
        const char *name;
        CkptfsDtype stored;
        CkptfsConvert conv;
        unsigned interleave; /* 1: halves; 2: rows two apart (the gate of [.., 2F] interleaved) */
    } cases[] = {
        {"contiguous", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 0},
        {"transposed", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 1},
        {"interleaved", CKPTFS_DTYPE_BF16, CKPTFS_CONVERT_NONE, 2},
        {"fp32->bf16", CKPTFS_DTYPE_F32, CKPTFS_CONVERT_F32_TO_BF16, 1},
    };
    double base = 0;
    printf("experts %" G_GUINT64_FORMAT " x [H %" G_GUINT64_FORMAT ", F %" G_GUINT64_FORMAT "], reads of %"
           G_GUINT64_FORMAT " KiB, best of %d, one thread\n", experts, hidden, ffn, read_kib, rounds);
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
        bench_best_read_seconds(plan, files, (size_t)read_kib << 10, 1, "transpose_bench"); /* warm the page cache */
        double t = bench_best_read_seconds(plan, files, (size_t)read_kib << 10, rounds, "transpose_bench");
        double gbs = (double)ckptfs_plan_size(plan) / t / 1e9;
        if (c == 0)
            base = gbs;
        printf("  %-12s %7.2f GB/s  %.2f of contiguous\n", cases[c].name, gbs, gbs / base);
        ckptfs_plan_free(plan);
    }
    ckptfs_srcfiles_free(files);
    g_unlink(path);
    return 0;
}
