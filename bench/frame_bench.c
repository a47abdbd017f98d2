/* Decoding cost of packed files, one thread, stage by stage: what a decoder thread of the daemon
 * does for each frame (read the stored bytes, decompress, undo the byte planes, check the
 * checksum), timed separately, and the same work through ckptfs_frame_decode with a context
 * per codec. Files are read from the page cache (warm them first); no FUSE, no view.
 *
 *   frame_bench [--rounds N] PACKED_FILE...
 *
 * Prints, per codec found and in all, GB/s of original bytes per second of this thread for each
 * stage and for the whole; the best of N rounds (default 3). bench/pack_bench.sh runs it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckptfs/container.h"
#include "ckptfs/readfile.h"
#include "plan_bench.h"

enum { ST_READ, ST_CODEC, ST_PLANES, ST_CHECKSUM, ST_WHOLE, ST_COUNT };
static const char *const stage_names[ST_COUNT] = {"read stored bytes", "decompress", "byte planes",
                                                  "checksum", "all (frame_decode)"};

typedef struct {
    double seconds[ST_COUNT];
    uint64_t bytes; /* original bytes */
    uint64_t stored;
    uint64_t frames;
} Totals;

/* A pass over every frame of C (in FD) timing the whole decode with its read (as a decoder
 * thread does it), apart from the staged pass so neither warms the caches for the other. */
static int run_file_whole(int fd, const char *path, const CkptfsContainer *c, void *const *decoders, uint8_t *work,
                          uint8_t *scratch, uint8_t *out, Totals *t)
{
    for (uint64_t i = 0; i < ckptfs_container_frames(c); i++) {
        const CkptfsFrameEntry *e = ckptfs_container_frame(c, i);
        double t0 = bench_now();
        bool ok = ckptfs_pread_full(fd, work, e->clength, e->coffset) == 0 &&
                  ckptfs_frame_decode(e, work, out, scratch, decoders[e->codec], NULL);
        double t1 = bench_now();
        if (!ok) {
            fprintf(stderr, "frame_bench: %s: frame %llu does not decode\n", path, (unsigned long long)i);
            return -1;
        }
        t[e->codec].seconds[ST_WHOLE] += t1 - t0;
    }
    return 0;
}

/* A pass over every frame of C (in FD) stage by stage: times into T (per codec: index CODEC). */
static int run_file(int fd, const char *path, const CkptfsContainer *c, void *const *decoders, uint8_t *work,
                    uint8_t *scratch, uint8_t *out, Totals *t)
{
    for (uint64_t i = 0; i < ckptfs_container_frames(c); i++) {
        const CkptfsFrameEntry *e = ckptfs_container_frame(c, i);
        Totals *k = &t[e->codec];
        double t0 = bench_now();
        if (ckptfs_pread_full(fd, work, e->clength, e->coffset) != 0) {
            fprintf(stderr, "frame_bench: %s: cannot read frame %llu\n", path, (unsigned long long)i);
            return -1;
        }
        double t1 = bench_now();
        uint8_t *dst = e->planes > 1 ? scratch : out;
        size_t got = 0;
        if (!ckptfs_codec(e->codec)->decode(decoders[e->codec], work, e->clength, dst, e->ulength, &got, NULL))
            got = 0;
        double t2 = bench_now();
        if (e->planes > 1)
            ckptfs_planes_unshuffle(out, scratch, e->ulength, e->planes);
        double t3 = bench_now();
        uint32_t sum = ckptfs_frame_checksum(out, e->ulength);
        double t4 = bench_now();
        if (got != e->ulength || sum != e->checksum) {
            fprintf(stderr, "frame_bench: %s: frame %llu does not decode\n", path, (unsigned long long)i);
            return -1;
        }
        k->seconds[ST_READ] += t1 - t0;
        k->seconds[ST_CODEC] += t2 - t1;
        k->seconds[ST_PLANES] += t3 - t2;
        k->seconds[ST_CHECKSUM] += t4 - t3;
        k->bytes += e->ulength;
        k->stored += e->clength;
        k->frames++;
    }
    return 0;
}

static void print_totals(const char *label, const Totals *t)
{
    if (t->frames == 0)
        return;
    printf("%-6s %6llu frames, %7.1f MB -> %7.1f MB (%.3f):", label, (unsigned long long)t->frames,
           (double)t->stored / 1e6, (double)t->bytes / 1e6, (double)t->stored / (double)t->bytes);
    double stages = 0;
    for (int s = 0; s < ST_COUNT; s++) {
        printf(" %s %.2f", stage_names[s], (double)t->bytes / t->seconds[s] / 1e9);
        if (s < ST_WHOLE)
            stages += t->seconds[s];
    }
    printf(" | stages summed %.2f GB/s\n", (double)t->bytes / stages / 1e9);
}

int main(int argc, char **argv)
{
    int rounds = 3, first = 1;
    if (argc > 1 && strcmp(argv[1], "--rounds") == 0) {
        rounds = argc > 2 ? atoi(argv[2]) : 0;
        first = 3;
    }
    if (first >= argc || rounds < 1) {
        fprintf(stderr, "usage: frame_bench [--rounds N] PACKED_FILE...\n");
        return 2;
    }
    int n = argc - first;
    int *fds = calloc((size_t)n, sizeof *fds);
    CkptfsContainer **cs = calloc((size_t)n, sizeof *cs);
    size_t max_frame = 0;
    for (int f = 0; f < n; f++) {
        const char *path = argv[first + f];
        struct stat st;
        fds[f] = open(path, O_RDONLY);
        GError *error = NULL;
        if (fds[f] < 0 || fstat(fds[f], &st) != 0 ||
            (cs[f] = ckptfs_container_open(fds[f], (uint64_t)st.st_size, path, &error)) == NULL) {
            fprintf(stderr, "frame_bench: %s: %s\n", path, error ? error->message : strerror(errno));
            g_clear_error(&error);
            return 1;
        }
        for (uint64_t i = 0; i < ckptfs_container_frames(cs[f]); i++) {
            const CkptfsFrameEntry *e = ckptfs_container_frame(cs[f], i);
            max_frame = e->ulength > max_frame ? e->ulength : max_frame;
            max_frame = e->clength > max_frame ? e->clength : max_frame;
        }
    }
    uint8_t *work = malloc(max_frame + 1), *scratch = malloc(max_frame + 1), *out = malloc(max_frame + 1);
    void *decoders[CKPTFS_CODEC_COUNT];
    for (unsigned id = 0; id < CKPTFS_CODEC_COUNT; id++)
        decoders[id] = ckptfs_codec(id)->decoder_new ? ckptfs_codec(id)->decoder_new() : NULL;
    Totals best[CKPTFS_CODEC_COUNT];
    memset(best, 0, sizeof best);
    double best_whole = 0;
    for (int r = 0; r < rounds; r++) {
        Totals t[CKPTFS_CODEC_COUNT];
        memset(t, 0, sizeof t);
        for (int f = 0; f < n; f++)
            if (run_file(fds[f], argv[first + f], cs[f], decoders, work, scratch, out, t) != 0 ||
                run_file_whole(fds[f], argv[first + f], cs[f], decoders, work, scratch, out, t) != 0)
                return 1;
        double whole = 0;
        for (unsigned id = 0; id < CKPTFS_CODEC_COUNT; id++)
            whole += t[id].seconds[ST_WHOLE];
        if (r == 0 || whole < best_whole) {
            best_whole = whole;
            memcpy(best, t, sizeof best);
        }
    }
    printf("frame_bench: GB/s of original bytes per second of one thread (best of %d rounds)\n", rounds);
    for (unsigned id = 0; id < CKPTFS_CODEC_COUNT; id++) {
        print_totals(ckptfs_codec(id)->name, &best[id]);
        if (decoders[id])
            ckptfs_codec(id)->decoder_free(decoders[id]);
    }
    free(work);
    free(scratch);
    free(out);
    for (int f = 0; f < n; f++) {
        ckptfs_container_free(cs[f]);
        close(fds[f]);
    }
    free(cs);
    free(fds);
    return 0;
}
