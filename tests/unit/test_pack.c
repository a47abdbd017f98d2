/* ckptfs pack's writer (core/pack/pack.c): byte planes, the tensor ranges of a file, containers
 * of synthetic files (a raw header, bf16 and fp32 ranges of odd sizes, a range ending exactly at a
 * frame boundary, random bytes that do not compress, an empty file) read back bit for bit frame by
 * frame (ckptfs_frame_decode) and through the source-file set that decodes containers, for both
 * codecs, several frame sizes and thread counts; the index tiles the file; a write error names the
 * file. Then a whole directory (a safetensors checkpoint with a subdirectory, a symlink and a FIFO)
 * packed and verified, and the refusals: DEST not empty, DEST inside SRC, SRC already packed, bad
 * options. */
#include <errno.h>
#include <fcntl.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/container.h"
#include "ckptfs/error.h"
#include "ckptfs/pack.h"
#include "ckptfs/srcfiles.h"
#include "tap.h"

/* --- helpers --- */

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

/* About normal(0, 0.02): the sum of 12 uniforms less 6 has variance 1. */
static float normal(GRand *rng)
{
    double s = -6.0;
    for (int i = 0; i < 12; i++)
        s += g_rand_double(rng);
    return (float)(0.02 * s);
}

static void fill_bf16(uint8_t *p, uint64_t n, GRand *rng)
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t v = bf16_of(normal(rng));
        p[2 * i] = (uint8_t)v;
        p[2 * i + 1] = (uint8_t)(v >> 8);
    }
}

static void fill_fp32(uint8_t *p, uint64_t n, GRand *rng)
{
    for (uint64_t i = 0; i < n; i++) {
        float f = normal(rng);
        memcpy(p + 4 * i, &f, 4);
    }
}

static void fill_text(uint8_t *p, uint64_t n)
{
    static const char text[] = "{\"__metadata__\":{\"format\":\"pt\"},\"model.layers.0.weight\":{\"dtype\":\"BF16\"}} ";
    for (uint64_t i = 0; i < n; i++)
        p[i] = (uint8_t)text[i % (sizeof text - 1)];
}

static bool write_file(const char *path, const uint8_t *data, size_t len)
{
    return g_file_set_contents(path, (const char *)data, (gssize)len, NULL);
}

static CkptfsPackOptions options_for(CkptfsCodec codec, int level, uint32_t frame, unsigned threads)
{
    CkptfsPackOptions o;
    ckptfs_pack_options_init(&o);
    o.codec = codec;
    o.level = level;
    o.frame_size = frame;
    o.threads = threads;
    GError *error = NULL;
    if (!ckptfs_pack_options_check(&o, &error)) {
        tap_diag("options: %s", error->message);
        g_error_free(error);
    }
    return o;
}

/* Packs DATA (with RANGES) from SRC_PATH into DEST_PATH. */
static bool pack_one(const char *src_path, const char *dest_path, uint64_t size, GArray *ranges,
                     const CkptfsPackOptions *o, CkptfsPackStats *stats)
{
    int in = open(src_path, O_RDONLY);
    int out = open(dest_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CkptfsPacker *p = ckptfs_packer_new(o, NULL, NULL);
    GError *error = NULL;
    bool ok = ckptfs_packer_write(p, in, size, (const CkptfsPackRange *)ranges->data, ranges->len, out, src_path,
                                  dest_path, stats, &error);
    if (!ok) {
        tap_diag("pack: %s", error->message);
        g_error_free(error);
    }
    ckptfs_packer_free(p);
    close(in);
    close(out);
    return ok;
}

typedef struct {
    bool ok;
    char why[200];
    uint64_t nframes, stored;
    GArray *entries; /* CkptfsFrameEntry */
} Decoded;

#define WHY(...) (snprintf(d->why, sizeof d->why, __VA_ARGS__), d->ok = false)

/* Reads the container at PATH by the rules of docs/compression.md, decodes every frame and
 * compares it with ORIG (SIZE bytes). */
static void decode_container(const char *path, const uint8_t *orig, uint64_t size, Decoded *d)
{
    memset(d, 0, sizeof *d);
    d->ok = true;
    d->entries = g_array_new(FALSE, FALSE, sizeof(CkptfsFrameEntry));
    gchar *raw = NULL;
    gsize len = 0;
    if (!g_file_get_contents(path, &raw, &len, NULL)) {
        WHY("cannot read");
        return;
    }
    const uint8_t *c = (const uint8_t *)raw;
    CkptfsContainerTrailer t;
    if (len < CKPTFS_CONTAINER_HEADER_SIZE + CKPTFS_CONTAINER_TRAILER_SIZE) {
        WHY("too short");
    } else if (memcmp(c, CKPTFS_CONTAINER_MAGIC "\0\0\0\0\0\0\0\0", 16) != 0) {
        WHY("bad header");
    } else if (!ckptfs_container_trailer_decode(c + len - CKPTFS_CONTAINER_TRAILER_SIZE, &t)) {
        WHY("bad trailer");
    } else if (t.size != size) {
        WHY("trailer size %llu, not %llu", (unsigned long long)t.size, (unsigned long long)size);
    } else if (t.index_offset + CKPTFS_CONTAINER_ENTRY_SIZE * t.nframes + CKPTFS_CONTAINER_TRAILER_SIZE != len) {
        WHY("index offset/nframes do not add up to the container size");
    } else if (ckptfs_frame_checksum(c + t.index_offset, CKPTFS_CONTAINER_ENTRY_SIZE * t.nframes) !=
               t.index_checksum) {
        WHY("index checksum");
    }
    if (!d->ok) {
        g_free(raw);
        return;
    }
    d->nframes = t.nframes;
    uint8_t *dst = g_malloc(CKPTFS_CONTAINER_MAX_FRAME), *scratch = g_malloc(CKPTFS_CONTAINER_MAX_FRAME);
    uint64_t upos = 0, cpos = CKPTFS_CONTAINER_HEADER_SIZE;
    for (uint64_t i = 0; d->ok && i < t.nframes; i++) {
        CkptfsFrameEntry e;
        ckptfs_frame_entry_decode(c + t.index_offset + i * CKPTFS_CONTAINER_ENTRY_SIZE, &e);
        g_array_append_val(d->entries, e);
        if (e.uoffset != upos)
            WHY("frame %llu starts at %llu, not %llu", (unsigned long long)i, (unsigned long long)e.uoffset,
                (unsigned long long)upos);
        else if (e.ulength == 0 || e.ulength > CKPTFS_CONTAINER_MAX_FRAME)
            WHY("frame %llu: length %u", (unsigned long long)i, e.ulength);
        else if (e.coffset != cpos) /* the writer packs frames one after the other */
            WHY("frame %llu stored at %llu, not %llu", (unsigned long long)i, (unsigned long long)e.coffset,
                (unsigned long long)cpos);
        else if (e.coffset + e.clength > t.index_offset)
            WHY("frame %llu beyond the index", (unsigned long long)i);
        else if (e.planes != 1 && e.planes != 2 && e.planes != 4 && e.planes != 8)
            WHY("frame %llu: planes %u", (unsigned long long)i, e.planes);
        else if (e.ulength % e.planes != 0)
            WHY("frame %llu: planes %u do not divide %u", (unsigned long long)i, e.planes, e.ulength);
        else if (e.codec == CKPTFS_CODEC_STORED && (e.clength != e.ulength || e.planes != 1))
            WHY("stored frame %llu: clength %u, planes %u", (unsigned long long)i, e.clength, e.planes);
        else if (e.codec != CKPTFS_CODEC_STORED && e.clength >= e.ulength)
            WHY("compressed frame %llu does not shrink", (unsigned long long)i);
        else if (e.codec != CKPTFS_CODEC_STORED && e.codec != t.codec_used)
            WHY("frame %llu: codec %u in a %u pack", (unsigned long long)i, e.codec, t.codec_used);
        else {
            GError *error = NULL;
            if (!ckptfs_frame_decode(&e, c + e.coffset, dst, scratch, NULL, &error)) {
                WHY("frame %llu: %s", (unsigned long long)i, error->message);
                g_error_free(error);
            } else if (memcmp(dst, orig + e.uoffset, e.ulength) != 0) {
                WHY("frame %llu decodes to other bytes", (unsigned long long)i);
            }
        }
        d->stored += e.codec == CKPTFS_CODEC_STORED;
        upos += e.ulength;
        cpos += e.clength;
    }
    if (d->ok && upos != size)
        WHY("frames end at %llu, not %llu", (unsigned long long)upos, (unsigned long long)size);
    if (d->ok && cpos != t.index_offset)
        WHY("frames end at %llu in the container, the index is at %llu", (unsigned long long)cpos,
            (unsigned long long)t.index_offset);
    g_free(dst);
    g_free(scratch);
    g_free(raw);
}

/* Reads PATH through the source-file set (which decodes containers) and compares with ORIG. */
static bool read_back(const char *path, const uint8_t *orig, uint64_t size, GRand *rng, char *why, size_t why_len)
{
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    GError *error = NULL;
    bool ok = true;
    int idx = ckptfs_srcfiles_add(files, path, &error);
    if (idx < 0) {
        snprintf(why, why_len, "add: %s", error->message);
        ok = false;
    } else if (ckptfs_srcfiles_get(files, (unsigned)idx)->size != size) {
        snprintf(why, why_len, "size %llu, not %llu", (unsigned long long)ckptfs_srcfiles_get(files, (unsigned)idx)->size,
                 (unsigned long long)size);
        ok = false;
    }
    uint8_t *buf = g_malloc(size + 1);
    if (ok && size > 0) {
        if (!ckptfs_srcfiles_pread(files, (unsigned)idx, buf, size, 0, &error)) {
            snprintf(why, why_len, "read all: %s", error->message);
            ok = false;
        } else if (memcmp(buf, orig, size) != 0) {
            snprintf(why, why_len, "whole file differs");
            ok = false;
        }
    }
    for (int k = 0; ok && size > 0 && k < 200; k++) { /* reads at random places, across frames */
        uint64_t off = (uint64_t)g_rand_double_range(rng, 0, (double)size);
        uint64_t want = (uint64_t)g_rand_int_range(rng, 1, 300000); /* not inside MIN: evaluated twice */
        uint64_t len = MIN(size - off, want);
        if (!ckptfs_srcfiles_pread(files, (unsigned)idx, buf, len, off, &error)) {
            snprintf(why, why_len, "read %llu at %llu: %s", (unsigned long long)len, (unsigned long long)off,
                     error->message);
            ok = false;
        } else if (memcmp(buf, orig + off, len) != 0) {
            snprintf(why, why_len, "read %llu at %llu differs", (unsigned long long)len, (unsigned long long)off);
            ok = false;
        }
    }
    g_clear_error(&error);
    g_free(buf);
    ckptfs_srcfiles_free(files);
    return ok;
}

/* --- byte planes --- */

static void test_planes(GRand *rng)
{
    static const unsigned planes[] = {1, 2, 4, 8};
    static const size_t lens[] = {0, 8, 24, 4096, 65536 + 8, 1000000};
    for (size_t p = 0; p < G_N_ELEMENTS(planes); p++) {
        bool ok = true, layout = true;
        for (size_t l = 0; l < G_N_ELEMENTS(lens); l++) {
            size_t len = lens[l];
            uint8_t *a = g_malloc(len + 1), *b = g_malloc(len + 1), *c = g_malloc(len + 1);
            for (size_t i = 0; i < len; i++)
                a[i] = (uint8_t)g_rand_int(rng);
            ckptfs_planes_shuffle(b, a, len, planes[p]);
            ckptfs_planes_unshuffle(c, b, len, planes[p]);
            ok &= memcmp(a, c, len) == 0;
            /* plane q holds byte q of every element, in element order */
            size_t n = len / planes[p];
            for (size_t i = 0; i < n && layout; i++)
                for (unsigned q = 0; q < planes[p]; q++)
                    layout &= b[q * n + i] == a[i * planes[p] + q];
            g_free(a);
            g_free(b);
            g_free(c);
        }
        tap_ok(ok, "planes %u: unshuffle(shuffle(x)) == x for lengths 0 to 1000000", planes[p]);
        tap_ok(layout, "planes %u: plane q holds byte q of every element in order", planes[p]);
    }
}

/* --- ranges --- */

static GArray *ranges_of(const CkptfsPackRange *r, unsigned n)
{
    GArray *a = g_array_new(FALSE, FALSE, sizeof(CkptfsPackRange));
    g_array_append_vals(a, r, n);
    return a;
}

static bool ranges_equal(GArray *a, const CkptfsPackRange *want, unsigned n)
{
    if (a->len != n)
        return false;
    for (unsigned i = 0; i < n; i++) {
        const CkptfsPackRange *r = &g_array_index(a, CkptfsPackRange, i);
        if (r->offset != want[i].offset || r->length != want[i].length || r->esize != want[i].esize)
            return false;
    }
    return true;
}

static void test_ranges(void)
{
    /* rows of a strided piece, out of order; an overlap of different element sizes; an empty
     * range; adjacent ranges of different sizes stay apart */
    const CkptfsPackRange in[] = {
        {300, 100, 2}, {100, 100, 2}, {200, 100, 2}, /* rows: one range [100, 400) */
        {400, 40, 4},                                 /* adjacent, another size */
        {420, 40, 2},                                 /* overlaps the fp32 one: merged, keeps 4 */
        {1000, 0, 2},                                 /* empty */
        {2000, 8, 1}, {2008, 8, 1},                   /* adjacent 1-byte */
        {3000, 64, 8}, {3010, 10, 8},                 /* contained */
    };
    const CkptfsPackRange want[] = {{100, 300, 2}, {400, 60, 4}, {2000, 16, 1}, {3000, 64, 8}};
    GArray *a = ranges_of(in, G_N_ELEMENTS(in));
    ckptfs_pack_ranges_normalize(a);
    tap_ok(ranges_equal(a, want, G_N_ELEMENTS(want)),
           "ranges: sorted, overlaps merged (first element size kept), adjacent same size merged, empty dropped");
    g_array_unref(a);
}

/* --- containers of synthetic files --- */

/* A file: a raw header, bf16 of an odd number of elements, a raw gap, fp32 ending exactly at a
 * frame boundary (FRAME_END), random bf16 that does not compress, a raw tail. */
typedef struct {
    uint8_t *data;
    uint64_t size;
    GArray *ranges;
} Synthetic;

static void synthetic(Synthetic *s, uint32_t frame_end_multiple, GRand *rng)
{
    uint64_t header = 1237;               /* raw */
    uint64_t bf16_n = 150001;             /* odd: ~300 KB, several frames of every size tested */
    uint64_t gap = 77;                    /* raw */
    uint64_t fp32_start = header + 2 * bf16_n + gap;
    /* fp32 up to the next multiple of FRAME_END_MULTIPLE past 200 KB of it: a multiple of 4, and a
     * frame boundary of every frame size that divides it */
    uint64_t fp32_end = ((fp32_start + 200000) / frame_end_multiple + 1) * frame_end_multiple;
    uint64_t rnd_n = 70001;               /* random bf16: stored frames */
    uint64_t tail = 501;
    s->size = fp32_end + 2 * rnd_n + tail;
    s->data = g_malloc(s->size);
    fill_text(s->data, header);
    fill_bf16(s->data + header, bf16_n, rng);
    fill_text(s->data + header + 2 * bf16_n, gap);
    fill_fp32(s->data + fp32_start, (fp32_end - fp32_start) / 4, rng);
    for (uint64_t i = 0; i < 2 * rnd_n; i++)
        s->data[fp32_end + i] = (uint8_t)g_rand_int(rng);
    fill_text(s->data + fp32_end + 2 * rnd_n, tail);
    const CkptfsPackRange r[] = {
        {header, 2 * bf16_n, 2},
        {fp32_start, fp32_end - fp32_start, 4},
        {fp32_end, 2 * rnd_n, 2},
    };
    s->ranges = ranges_of(r, G_N_ELEMENTS(r));
    ckptfs_pack_ranges_normalize(s->ranges);
}

/* Every range boundary is a frame boundary; frames inside a range have its element size as
 * planes (or are stored, planes 1); frames outside have planes 1. */
static bool frames_follow_ranges(const Decoded *d, GArray *ranges, uint32_t frame)
{
    for (guint i = 0; i < d->entries->len; i++) {
        const CkptfsFrameEntry *e = &g_array_index(d->entries, CkptfsFrameEntry, i);
        uint32_t esize = 0;
        bool inside = false;
        for (guint k = 0; k < ranges->len; k++) {
            const CkptfsPackRange *r = &g_array_index(ranges, CkptfsPackRange, k);
            bool starts_in = e->uoffset >= r->offset && e->uoffset < r->offset + r->length;
            bool ends_in = e->uoffset + e->ulength > r->offset && e->uoffset + e->ulength <= r->offset + r->length;
            if (starts_in != ends_in || (!starts_in && e->uoffset < r->offset &&
                                         e->uoffset + e->ulength > r->offset + r->length))
                return false; /* straddles a boundary */
            if (starts_in) {
                inside = true;
                esize = r->esize;
            }
        }
        if (e->ulength > frame)
            return false;
        if (e->codec == CKPTFS_CODEC_STORED ? e->planes != 1 : e->planes != (inside && esize > 1 ? esize : 1))
            return false;
    }
    return true;
}

static void test_containers(const char *dir, GRand *rng)
{
    static const uint32_t frames[] = {64u << 10, 128u << 10, 1u << 20};
    static const struct {
        CkptfsCodec codec;
        int level;
        const char *name;
    } codecs[] = {{CKPTFS_CODEC_ZSTD, 3, "zstd 3"}, {CKPTFS_CODEC_ZSTD, 1, "zstd 1"},
                  {CKPTFS_CODEC_LZ4, 1, "lz4"}, {CKPTFS_CODEC_LZ4, 9, "lz4hc 9"}};
    Synthetic s;
    synthetic(&s, 1u << 20, rng); /* fp32 ends at a multiple of 1 MiB: a boundary of all three */
    g_autofree char *src = g_build_filename(dir, "synthetic.bin", NULL);
    g_autofree char *dest = g_build_filename(dir, "synthetic.ckz", NULL);
    write_file(src, s.data, s.size);
    tap_note("synthetic file: %llu bytes, fp32 ends at %llu",
             (unsigned long long)s.size,
             (unsigned long long)(g_array_index(s.ranges, CkptfsPackRange, 1).offset +
                                  g_array_index(s.ranges, CkptfsPackRange, 1).length));
    for (size_t c = 0; c < G_N_ELEMENTS(codecs); c++) {
        for (size_t f = 0; f < G_N_ELEMENTS(frames); f++) {
            unsigned threads = (unsigned)(1 + (c + f) % 3);
            CkptfsPackOptions o = options_for(codecs[c].codec, codecs[c].level, frames[f], threads);
            CkptfsPackStats st = {0};
            bool packed = pack_one(src, dest, s.size, s.ranges, &o, &st);
            Decoded d;
            decode_container(dest, s.data, s.size, &d);
            tap_ok(packed && d.ok, "%s, frame %u, %u threads: container valid, every frame decodes to the original%s%s",
                   codecs[c].name, frames[f], threads, d.ok ? "" : ": ", d.ok ? "" : d.why);
            tap_ok(frames_follow_ranges(&d, s.ranges, frames[f]),
                   "%s, frame %u: frames stay inside segments, planes = element size", codecs[c].name, frames[f]);
            tap_ok(d.stored > 0 && st.frames_stored == d.stored && st.frames == d.nframes,
                   "%s, frame %u: the random bytes are stored (%llu of %llu frames)", codecs[c].name, frames[f],
                   (unsigned long long)d.stored, (unsigned long long)d.nframes);
            double r2 = (double)st.class_out[CKPTFS_PACK_E2] / (double)st.class_in[CKPTFS_PACK_E2];
            tap_ok(st.class_in[CKPTFS_PACK_RAW] == 1237 + 77 + 501 && st.class_in[CKPTFS_PACK_E4] > 0 &&
                       st.bytes_in == s.size,
                   "%s, frame %u: statistics count every byte in its class (2-byte ratio %.3f)", codecs[c].name,
                   frames[f], r2);
            char why[300] = "";
            tap_ok(read_back(dest, s.data, s.size, rng, why, sizeof why),
                   "%s, frame %u: read through ckptfs_srcfiles as the original%s%s", codecs[c].name, frames[f],
                   *why ? ": " : "", why);
            g_array_unref(d.entries);
        }
    }
    g_free(s.data);
    g_array_unref(s.ranges);
}

/* One frame holds exactly one range that ends on the frame boundary; the next range starts a
 * new frame. */
static void test_exact_boundary(const char *dir, GRand *rng)
{
    uint32_t frame = 64u << 10;
    uint64_t size = 3ull * frame;
    uint8_t *data = g_malloc(size);
    fill_bf16(data, size / 2, rng);
    const CkptfsPackRange r[] = {{0, frame, 2}, {frame, 2ull * frame, 4}};
    GArray *ranges = ranges_of(r, 2);
    g_autofree char *src = g_build_filename(dir, "exact.bin", NULL);
    g_autofree char *dest = g_build_filename(dir, "exact.ckz", NULL);
    write_file(src, data, size);
    CkptfsPackOptions o = options_for(CKPTFS_CODEC_ZSTD, 3, frame, 2);
    CkptfsPackStats st = {0};
    bool ok = pack_one(src, dest, size, ranges, &o, &st);
    Decoded d;
    decode_container(dest, data, size, &d);
    bool shape = d.ok && d.nframes == 3;
    for (guint i = 0; shape && i < 3; i++) {
        const CkptfsFrameEntry *e = &g_array_index(d.entries, CkptfsFrameEntry, i);
        shape = e->uoffset == i * frame && e->ulength == frame && (e->codec == 0 || e->planes == (i == 0 ? 2 : 4));
    }
    tap_ok(ok && shape, "ranges ending exactly at frame boundaries: 3 whole frames, planes 2, 4, 4");
    char why[300] = "";
    tap_ok(read_back(dest, data, size, rng, why, sizeof why), "and read back as the original%s%s", *why ? ": " : "",
           why);
    g_array_unref(d.entries);
    g_array_unref(ranges);
    g_free(data);
}

static void test_empty(const char *dir, GRand *rng)
{
    g_autofree char *src = g_build_filename(dir, "empty.bin", NULL);
    g_autofree char *dest = g_build_filename(dir, "empty.ckz", NULL);
    write_file(src, (const uint8_t *)"", 0);
    GArray *ranges = g_array_new(FALSE, FALSE, sizeof(CkptfsPackRange));
    CkptfsPackOptions o = options_for(CKPTFS_CODEC_LZ4, 1, 64u << 10, 1);
    CkptfsPackStats st = {0};
    bool ok = pack_one(src, dest, 0, ranges, &o, &st);
    struct stat sb;
    stat(dest, &sb);
    Decoded d;
    decode_container(dest, (const uint8_t *)"", 0, &d);
    tap_ok(ok && d.ok && d.nframes == 0 && sb.st_size == 16 + 48,
           "an empty file: a container of no frame, header and trailer only (%lld bytes)%s%s", (long long)sb.st_size,
           d.ok ? "" : ": ", d.ok ? "" : d.why);
    char why[300] = "";
    tap_ok(read_back(dest, (const uint8_t *)"", 0, rng, why, sizeof why), "read back as an empty file%s%s",
           *why ? ": " : "", why);
    g_array_unref(d.entries);
    g_array_unref(ranges);
}

/* Raw bytes only (a file with a range of 1-byte elements and text): planes 1 everywhere, and a
 * write error names the file. */
static void test_one_byte_and_errors(const char *dir, GRand *rng)
{
    uint64_t size = 300000;
    uint8_t *data = g_malloc(size);
    fill_text(data, size);
    for (uint64_t i = 1000; i < 201000; i++)
        data[i] = (uint8_t)(g_rand_int_range(rng, 0, 16) | 0x30);
    const CkptfsPackRange r[] = {{1000, 200000, 1}};
    GArray *ranges = ranges_of(r, 1);
    g_autofree char *src = g_build_filename(dir, "fp8.bin", NULL);
    g_autofree char *dest = g_build_filename(dir, "fp8.ckz", NULL);
    write_file(src, data, size);
    CkptfsPackOptions o = options_for(CKPTFS_CODEC_ZSTD, 3, 64u << 10, 2);
    CkptfsPackStats st = {0};
    bool ok = pack_one(src, dest, size, ranges, &o, &st);
    Decoded d;
    decode_container(dest, data, size, &d);
    bool planes1 = d.ok;
    for (guint i = 0; i < d.entries->len; i++)
        planes1 &= g_array_index(d.entries, CkptfsFrameEntry, i).planes == 1;
    tap_ok(ok && planes1 && st.class_in[CKPTFS_PACK_E1] == 200000,
           "1-byte tensor bytes: frames of their own, planes 1, counted as 1-byte");
    g_array_unref(d.entries);

    /* /dev/full: ENOSPC on the first write */
    int in = open(src, O_RDONLY), out = open("/dev/full", O_WRONLY);
    if (out >= 0) {
        CkptfsPacker *p = ckptfs_packer_new(&o, NULL, NULL);
        GError *error = NULL;
        bool wrote = ckptfs_packer_write(p, in, size, r, 1, out, src, "DEST/fp8.ckz", &st, &error);
        tap_ok(!wrote && error && strstr(error->message, "DEST/fp8.ckz") &&
                   strstr(error->message, g_strerror(ENOSPC)),
               "a full disk: an error naming the file (%s)", error ? error->message : "none");
        g_clear_error(&error);
        /* the packer still works after a failed file */
        int out2 = open(dest, O_WRONLY | O_TRUNC);
        wrote = ckptfs_packer_write(p, in, size, r, 1, out2, src, dest, &st, &error);
        close(out2);
        decode_container(dest, data, size, &d);
        tap_ok(wrote && d.ok, "the same packer writes the next file after a failure");
        g_array_unref(d.entries);
        g_clear_error(&error);
        ckptfs_packer_free(p);
        close(out);
    } else {
        tap_ok(true, "# SKIP no /dev/full");
        tap_ok(true, "# SKIP no /dev/full");
    }
    /* a source file shorter than it should be */
    {
        CkptfsPacker *p = ckptfs_packer_new(&o, NULL, NULL);
        GError *error = NULL;
        int out3 = open(dest, O_WRONLY | O_TRUNC);
        bool wrote = ckptfs_packer_write(p, in, size + 100000, r, 1, out3, src, dest, &st, &error);
        tap_ok(!wrote && error && strstr(error->message, src), "a source file that ends early: an error naming it (%s)",
               error ? error->message : "none");
        g_clear_error(&error);
        close(out3);
        ckptfs_packer_free(p);
    }
    close(in);
    g_array_unref(ranges);
    g_free(data);
}

/* --- options --- */

static void test_options(void)
{
    static const struct {
        const char *kv;
        CkptfsOptionResult want;
    } cases[] = {
        {"codec=zstd", CKPTFS_OPTION_TAKEN},   {"codec=lz4", CKPTFS_OPTION_TAKEN},
        {"codec=gzip", CKPTFS_OPTION_BAD},     {"codec", CKPTFS_OPTION_BAD},
        {"level=19", CKPTFS_OPTION_TAKEN},     {"level=0", CKPTFS_OPTION_BAD},
        {"level=20", CKPTFS_OPTION_BAD},       {"level=x", CKPTFS_OPTION_BAD},
        {"frame=64K", CKPTFS_OPTION_TAKEN},    {"frame=64M", CKPTFS_OPTION_TAKEN},
        {"frame=2MiB", CKPTFS_OPTION_TAKEN},   {"frame=60K", CKPTFS_OPTION_BAD},
        {"frame=65M", CKPTFS_OPTION_BAD},      {"frame=100000", CKPTFS_OPTION_BAD},
        {"threads=2", CKPTFS_OPTION_TAKEN},    {"threads=0", CKPTFS_OPTION_BAD},
        {"iteration=5", CKPTFS_OPTION_UNKNOWN}, {"frame_cache=1M", CKPTFS_OPTION_UNKNOWN},
    };
    int good = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        CkptfsPackOptions o;
        ckptfs_pack_options_init(&o);
        GError *error = NULL;
        CkptfsOptionResult r = ckptfs_pack_options_apply(&o, cases[i].kv, &error);
        if (r == cases[i].want && (r == CKPTFS_OPTION_BAD) == (error != NULL))
            good++;
        else
            tap_diag("%s: got %d", cases[i].kv, (int)r);
        g_clear_error(&error);
    }
    tap_ok(good == (int)G_N_ELEMENTS(cases), "option values taken, refused with a message, or left to the source");
    CkptfsPackOptions o;
    ckptfs_pack_options_init(&o);
    ckptfs_pack_options_apply(&o, "codec=lz4", NULL);
    ckptfs_pack_options_apply(&o, "level=13", NULL);
    GError *error = NULL;
    tap_ok(!ckptfs_pack_options_check(&o, &error) && error, "lz4 level 13 refused (%s)", error ? error->message : "");
    g_clear_error(&error);
    ckptfs_pack_options_init(&o);
    tap_ok(ckptfs_pack_options_check(&o, NULL) && o.level == 1 && o.threads >= 1 && o.threads <= 16 &&
               o.frame_size == (2u << 20),
           "defaults: zstd level 1, frame 2 MiB, 1-16 threads (%u)", o.threads);
}

/* --- a directory --- */

/* A safetensors file of two bf16 tensors and an fp32 one. */
static void write_safetensors(const char *path, GRand *rng, uint8_t **data_out, size_t *len_out)
{
    const uint64_t n1 = 300 * 257, n2 = 1001, n3 = 40000;
    g_autofree char *json = g_strdup_printf(
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"a.weight\":{\"dtype\":\"BF16\",\"shape\":[300,257],\"data_offsets\":[0,%llu]},"
        "\"b.bias\":{\"dtype\":\"BF16\",\"shape\":[1001],\"data_offsets\":[%llu,%llu]},"
        "\"c.weight\":{\"dtype\":\"F32\",\"shape\":[200,200],\"data_offsets\":[%llu,%llu]}}",
        (unsigned long long)(2 * n1), (unsigned long long)(2 * n1), (unsigned long long)(2 * n1 + 2 * n2),
        (unsigned long long)(2 * n1 + 2 * n2), (unsigned long long)(2 * n1 + 2 * n2 + 4 * n3));
    size_t hlen = strlen(json);
    size_t padded = (hlen + 7) / 8 * 8;
    size_t len = 8 + padded + 2 * n1 + 2 * n2 + 4 * n3;
    uint8_t *data = g_malloc(len);
    for (int i = 0; i < 8; i++)
        data[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(data + 8, json, hlen);
    memset(data + 8 + hlen, ' ', padded - hlen);
    uint8_t *p = data + 8 + padded;
    fill_bf16(p, n1 + n2, rng);
    fill_fp32(p + 2 * (n1 + n2), n3, rng);
    write_file(path, data, len);
    *data_out = data;
    *len_out = len;
}

typedef struct {
    int warnings;
    bool saw_fifo;
} Hooked;

static void on_warning(const char *message, gpointer ctx)
{
    Hooked *h = ctx;
    h->warnings++;
    h->saw_fifo |= strstr(message, "fifo") != NULL;
}

static bool same_file(const char *a, const char *b)
{
    gchar *x = NULL, *y = NULL;
    gsize lx = 0, ly = 0;
    bool same = g_file_get_contents(a, &x, &lx, NULL) && g_file_get_contents(b, &y, &ly, NULL) && lx == ly &&
                memcmp(x, y, lx) == 0;
    g_free(x);
    g_free(y);
    return same;
}

static bool is_container(const char *path)
{
    uint8_t m[8] = {0};
    FILE *f = fopen(path, "rb");
    bool yes = f && fread(m, 1, 8, f) == 8 && memcmp(m, CKPTFS_CONTAINER_MAGIC, 8) == 0;
    if (f)
        fclose(f);
    return yes;
}

static void test_dir(const char *dir, GRand *rng)
{
    g_autofree char *src = g_build_filename(dir, "ckpt", NULL);
    g_autofree char *sub = g_build_filename(src, "extra", NULL);
    g_mkdir_with_parents(sub, 0755);
    g_autofree char *st_path = g_build_filename(src, "model.safetensors", NULL);
    uint8_t *st_data;
    size_t st_len;
    write_safetensors(st_path, rng, &st_data, &st_len);
    g_autofree char *cfg = g_build_filename(src, "config.json", NULL);
    g_file_set_contents(cfg, "{\"architectures\": [\"LlamaForCausalLM\"]}\n", -1, NULL);
    g_autofree char *notes = g_build_filename(sub, "notes.txt", NULL);
    g_file_set_contents(notes, "hello\n", -1, NULL);
    g_autofree char *empty = g_build_filename(sub, "empty", NULL);
    g_file_set_contents(empty, "", 0, NULL);
    g_autofree char *link = g_build_filename(sub, "link.txt", NULL);
    if (symlink("notes.txt", link) != 0)
        tap_diag("symlink failed");
    g_autofree char *fifo = g_build_filename(sub, "fifo", NULL);
    mkfifo(fifo, 0644);

    g_autofree char *dest = g_build_filename(dir, "packed", NULL);
    CkptfsOptions so;
    ckptfs_options_init(&so);
    CkptfsPackOptions po;
    ckptfs_pack_options_init(&po);
    po.frame_size = 64u << 10;
    Hooked h = {0};
    CkptfsPackHooks hooks = {.warning = on_warning, .ctx = &h};
    CkptfsPackStats stats = {0};
    GError *error = NULL;
    bool ok = ckptfs_pack_dir(src, dest, &so, &po, true, &hooks, &stats, &error);
    tap_ok(ok, "pack and verify a directory%s%s", ok ? "" : ": ", ok ? "" : error->message);
    g_clear_error(&error);
    g_autofree char *d_st = g_build_filename(dest, "model.safetensors", NULL);
    g_autofree char *d_cfg = g_build_filename(dest, "config.json", NULL);
    g_autofree char *d_notes = g_build_filename(dest, "extra", "notes.txt", NULL);
    g_autofree char *d_link = g_build_filename(dest, "extra", "link.txt", NULL);
    g_autofree char *d_empty = g_build_filename(dest, "extra", "empty", NULL);
    g_autofree char *d_fifo = g_build_filename(dest, "extra", "fifo", NULL);
    struct stat sb;
    tap_ok(is_container(d_st) && !is_container(d_cfg), "the safetensors file is a container, config.json is not");
    tap_ok(same_file(cfg, d_cfg) && same_file(notes, d_notes) && same_file(notes, d_link) &&
               lstat(d_link, &sb) == 0 && S_ISREG(sb.st_mode) && stat(d_empty, &sb) == 0 && sb.st_size == 0,
           "other files copied byte for byte, the symlink as a file, the empty file too");
    tap_ok(lstat(d_fifo, &sb) != 0 && h.warnings == 1 && h.saw_fifo && stats.files_skipped == 1,
           "the FIFO skipped with a warning");
    tap_ok(stats.files_packed == 1 && stats.files_copied == 4 && stats.verified_files == 5,
           "1 file packed, 4 copied, 5 verified");
    tap_ok(stats.class_in[CKPTFS_PACK_E2] == 2 * (300 * 257 + 1001) && stats.class_in[CKPTFS_PACK_E4] == 4 * 40000,
           "tensor bytes found from the catalog: bf16 and fp32");
    char why[300] = "";
    tap_ok(read_back(d_st, st_data, st_len, rng, why, sizeof why), "the packed shard reads as the original%s%s",
           *why ? ": " : "", why);
    /* no temporary file left */
    GDir *dd = g_dir_open(dest, 0, NULL);
    const char *name;
    int hidden = 0;
    while (dd && (name = g_dir_read_name(dd)) != NULL)
        hidden += name[0] == '.';
    if (dd)
        g_dir_close(dd);
    tap_ok(hidden == 0, "no temporary file left in DEST");

    /* the packed directory is a source, with the same tensors */
    CkptfsSource *a = ckptfs_source_open(src, &so, NULL), *b = ckptfs_source_open(dest, &so, NULL);
    tap_ok(a && b && ckptfs_catalog_count(a->catalog) == ckptfs_catalog_count(b->catalog) &&
               ckptfs_catalog_total_bytes(a->catalog) == ckptfs_catalog_total_bytes(b->catalog),
           "DEST opens as a source with the same catalog");
    ckptfs_source_free(a);
    ckptfs_source_free(b);

    /* verify sees a difference */
    g_file_set_contents(d_notes, "hellO\n", -1, NULL);
    ok = ckptfs_pack_verify(src, dest, NULL, &stats, &error);
    tap_ok(!ok && error && strstr(error->message, "notes.txt") && strstr(error->message, "byte 4"),
           "verify reports the first difference with file and offset (%s)", error ? error->message : "none");
    g_clear_error(&error);
    g_file_set_contents(d_notes, "hello\n", -1, NULL);

    /* refusals */
    ok = ckptfs_pack_dir(src, dest, &so, &po, false, NULL, &stats, &error);
    tap_ok(!ok && error && strstr(error->message, "not empty"), "DEST not empty refused (%s)",
           error ? error->message : "none");
    g_clear_error(&error);
    g_autofree char *inside = g_build_filename(src, "packed", NULL);
    ok = ckptfs_pack_dir(src, inside, &so, &po, false, NULL, &stats, &error);
    tap_ok(!ok && error && strstr(error->message, "inside") && !g_file_test(inside, G_FILE_TEST_EXISTS),
           "DEST inside SRC refused, nothing written (%s)", error ? error->message : "none");
    g_clear_error(&error);
    g_autofree char *again = g_build_filename(dir, "again", NULL);
    ok = ckptfs_pack_dir(dest, again, &so, &po, false, NULL, &stats, &error);
    tap_ok(!ok && error && strstr(error->message, "already packed") && !g_file_test(again, G_FILE_TEST_EXISTS),
           "an already packed SRC refused (%s)", error ? error->message : "none");
    g_clear_error(&error);
    g_autofree char *nowhere = g_build_filename(dir, "nowhere", NULL);
    g_autofree char *out2 = g_build_filename(dir, "out2", NULL);
    ok = ckptfs_pack_dir(nowhere, out2, &so, &po, false, NULL, &stats, &error);
    tap_ok(!ok && error && strstr(error->message, "nowhere") && !g_file_test(out2, G_FILE_TEST_EXISTS),
           "a missing SRC refused, naming it (%s)", error ? error->message : "none");
    g_clear_error(&error);
    /* not a checkpoint: the source's error, DEST not created */
    ok = ckptfs_pack_dir(sub, out2, &so, &po, false, NULL, &stats, &error);
    tap_ok(!ok && error && !g_file_test(out2, G_FILE_TEST_EXISTS), "a directory that is not a checkpoint refused (%s)",
           error ? error->message : "none");
    g_clear_error(&error);
    ckptfs_options_clear(&so);
    g_free(st_data);
}

/* --- decoding ahead and once --- */

typedef struct {
    const CkptfsSrcFiles *files;
    unsigned index;
    uint64_t offset, len;
    const uint8_t *expect;
    gint *go;
    bool ok;
} FrameReader;

static gpointer read_frame_thread(gpointer data)
{
    FrameReader *r = data;
    uint8_t *buf = g_malloc(r->len);
    while (!g_atomic_int_get(r->go))
        ;
    r->ok = ckptfs_srcfiles_pread(r->files, r->index, buf, r->len, r->offset, NULL) &&
            memcmp(buf, r->expect, r->len) == 0;
    g_free(buf);
    return NULL;
}

/* Waits (at most 5 s) until FILES has decoded WANT frames; returns how many it has. */
static uint64_t wait_decoded(const CkptfsSrcFiles *files, uint64_t want)
{
    for (int i = 0; i < 500 && ckptfs_srcfiles_frames_decoded(files) < want; i++)
        g_usleep(10000);
    g_usleep(50000); /* and a little longer: nothing more may come */
    return ckptfs_srcfiles_frames_decoded(files);
}

static void test_decode_ahead(const char *dir, GRand *rng)
{
    const uint32_t frame = 64u << 10;
    uint64_t size = 64 * (uint64_t)frame;
    uint8_t *data = g_malloc(size);
    fill_bf16(data, size / 2, rng);
    const CkptfsPackRange r[] = {{0, size, 2}};
    GArray *ranges = ranges_of(r, 1);
    g_autofree char *src = g_build_filename(dir, "ahead.bin", NULL);
    g_autofree char *dest = g_build_filename(dir, "ahead.ckz", NULL);
    write_file(src, data, size);
    CkptfsPackOptions o = options_for(CKPTFS_CODEC_ZSTD, 1, frame, 2);
    CkptfsPackStats st = {0};
    bool packed = pack_one(src, dest, size, ranges, &o, &st);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    int idx = ckptfs_srcfiles_add(files, dest, NULL);
    if (!packed || idx < 0) {
        tap_ok(false, "packed and added %s", dest);
        tap_skip(4, "nothing to read");
        goto out;
    }

    /* Eight readers of one cold frame at once: it is decoded once, each gets its bytes. */
    gint go = 0;
    FrameReader readers[8];
    GThread *threads[8];
    for (int t = 0; t < 8; t++) {
        readers[t] = (FrameReader){files, (unsigned)idx, 5 * (uint64_t)frame + 1000 * (uint64_t)t, 30000,
                                   data + 5 * (uint64_t)frame + 1000 * (uint64_t)t, &go, false};
        threads[t] = g_thread_new("reader", read_frame_thread, &readers[t]);
    }
    g_atomic_int_set(&go, 1);
    bool all_ok = true;
    for (int t = 0; t < 8; t++) {
        g_thread_join(threads[t]);
        all_ok &= readers[t].ok;
    }
    uint64_t n = ckptfs_srcfiles_frames_decoded(files);
    tap_ok(all_ok && n == 1, "8 threads reading one cold frame at once: right bytes, 1 decode (%llu)", (unsigned long long)n);

    /* Advice for [10 frames + 100, 14 frames + 100): frames 10..14 decoded ahead, no others; reading
     * them then decodes nothing. */
    uint64_t off = 10 * (uint64_t)frame + 100, len = 4 * (uint64_t)frame;
    ckptfs_srcfiles_advise(files, (unsigned)idx, off, len);
    n = wait_decoded(files, 1 + 5);
    tap_ok(n == 1 + 5, "advice over 5 frames decodes those 5 ahead, and only them (%llu of 6)", (unsigned long long)n);
    uint8_t *buf = g_malloc(len);
    bool read = ckptfs_srcfiles_pread(files, (unsigned)idx, buf, len, off, NULL) && memcmp(buf, data + off, len) == 0;
    n = ckptfs_srcfiles_frames_decoded(files);
    tap_ok(read && n == 6, "reading them: right bytes, no decode of its own (%llu)", (unsigned long long)n);
    g_free(buf);
    /* Advice for frames already decoded, or for more than half the cache: nothing more, or only
     * as many frames as fit in half of it. */
    ckptfs_srcfiles_set_frame_cache(files, 8 * (uint64_t)frame);
    ckptfs_srcfiles_advise(files, (unsigned)idx, 40 * (uint64_t)frame, 20 * (uint64_t)frame);
    n = wait_decoded(files, 6 + 4);
    ckptfs_srcfiles_advise(files, (unsigned)idx, 40 * (uint64_t)frame, 20 * (uint64_t)frame);
    uint64_t again = wait_decoded(files, n + 1);
    tap_ok(n == 6 + 4 && again == n,
           "a cache of 8 frames: 4 decoded ahead of 20 asked for, none more while they are not read (%llu, %llu)",
           (unsigned long long)(n - 6), (unsigned long long)(again - 6));

    /* A damaged frame decoded ahead: its reader gets the error naming file and frame. */
    {
        g_autofree char *bad = g_build_filename(dir, "ahead-bad.ckz", NULL);
        gchar *bytes;
        gsize blen;
        g_file_get_contents(dest, &bytes, &blen, NULL);
        Decoded d;
        decode_container(dest, data, size, &d);
        const CkptfsFrameEntry *e = &g_array_index(d.entries, CkptfsFrameEntry, 20);
        bytes[e->coffset + e->clength / 2] ^= 0x40;
        g_file_set_contents(bad, bytes, (gssize)blen, NULL);
        g_free(bytes);
        g_array_unref(d.entries);
        CkptfsSrcFiles *bad_files = ckptfs_srcfiles_new(0);
        int bidx = ckptfs_srcfiles_add(bad_files, bad, NULL);
        ckptfs_srcfiles_advise(bad_files, (unsigned)bidx, 20 * (uint64_t)frame, frame);
        g_usleep(100000);
        GError *error = NULL;
        uint8_t one;
        bool got = bidx >= 0 && ckptfs_srcfiles_pread(bad_files, (unsigned)bidx, &one, 1, 20 * (uint64_t)frame + 7, &error);
        tap_ok(!got && error && strstr(error->message, bad) && strstr(error->message, "packed frame 20"),
               "a damaged frame asked for ahead: its reader gets the error (%s)", error ? error->message : "none");
        g_clear_error(&error);
        ckptfs_srcfiles_free(bad_files);
    }
out:
    ckptfs_srcfiles_free(files);
    g_array_unref(ranges);
    g_free(data);
}

int main(void)
{
    GRand *rng = g_rand_new_with_seed(20251126);
    g_autofree char *dir = g_dir_make_tmp("ckptfs-pack-XXXXXX", NULL);
    test_planes(rng);
    test_ranges();
    test_options();
    test_containers(dir, rng);
    test_exact_boundary(dir, rng);
    test_empty(dir, rng);
    test_one_byte_and_errors(dir, rng);
    test_dir(dir, rng);
    test_decode_ahead(dir, rng);
    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("cleanup failed");
    g_rand_free(rng);
    return tap_done();
}
