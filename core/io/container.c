/* The container format's shared pieces: index entries and trailer, byte planes, frame decoding
 * (include/ckptfs/container.h). */
#include "ckptfs/container.h"

#include <errno.h>
#include <unistd.h>
#include <string.h>
#include <xxhash.h>

#include "ckptfs/error.h"
#include "ckptfs/readfile.h"

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void ckptfs_frame_entry_encode(const CkptfsFrameEntry *e, uint8_t out[CKPTFS_CONTAINER_ENTRY_SIZE])
{
    memset(out, 0, CKPTFS_CONTAINER_ENTRY_SIZE);
    put_u64(out, e->uoffset);
    put_u32(out + 8, e->ulength);
    put_u32(out + 12, e->clength);
    put_u64(out + 16, e->coffset);
    out[24] = e->codec;
    out[25] = e->planes;
    put_u32(out + 28, e->checksum);
}

void ckptfs_frame_entry_decode(const uint8_t in[CKPTFS_CONTAINER_ENTRY_SIZE], CkptfsFrameEntry *e)
{
    e->uoffset = get_u64(in);
    e->ulength = get_u32(in + 8);
    e->clength = get_u32(in + 12);
    e->coffset = get_u64(in + 16);
    e->codec = in[24];
    e->planes = in[25];
    e->checksum = get_u32(in + 28);
}

void ckptfs_container_trailer_encode(const CkptfsContainerTrailer *t, uint8_t out[CKPTFS_CONTAINER_TRAILER_SIZE])
{
    memset(out, 0, CKPTFS_CONTAINER_TRAILER_SIZE);
    put_u64(out, t->size);
    put_u64(out + 8, t->nframes);
    put_u64(out + 16, t->index_offset);
    put_u32(out + 24, t->frame_size);
    put_u32(out + 28, t->index_checksum);
    out[32] = t->codec_used;
    memcpy(out + 40, CKPTFS_CONTAINER_MAGIC, CKPTFS_CONTAINER_MAGIC_LEN);
}

bool ckptfs_container_trailer_decode(const uint8_t in[CKPTFS_CONTAINER_TRAILER_SIZE], CkptfsContainerTrailer *t)
{
    static const uint8_t zero[7] = {0};
    if (memcmp(in + 40, CKPTFS_CONTAINER_MAGIC, CKPTFS_CONTAINER_MAGIC_LEN) != 0 || memcmp(in + 33, zero, 7) != 0)
        return false;
    t->size = get_u64(in);
    t->nframes = get_u64(in + 8);
    t->index_offset = get_u64(in + 16);
    t->frame_size = get_u32(in + 24);
    t->index_checksum = get_u32(in + 28);
    t->codec_used = in[32];
    return true;
}

uint32_t ckptfs_frame_checksum(const void *data, size_t len)
{
    return (uint32_t)XXH3_64bits(data, len);
}

void ckptfs_planes_shuffle(uint8_t *dst, const uint8_t *src, size_t len, unsigned planes)
{
    if (planes <= 1) {
        memcpy(dst, src, len);
        return;
    }
    size_t n = len / planes;
    /* Bytes past the last whole element stay where they are (frames never have any). */
    memcpy(dst + n * planes, src + n * planes, len - n * planes);
    switch (planes) {
    case 2: /* written like the unshuffle: loops the compiler vectorises */
        for (size_t i = 0; i < n; i++) {
            dst[i] = src[2 * i];
            dst[n + i] = src[2 * i + 1];
        }
        return;
    case 4:
        for (size_t i = 0; i < n; i++) {
            dst[i] = src[4 * i];
            dst[n + i] = src[4 * i + 1];
            dst[2 * n + i] = src[4 * i + 2];
            dst[3 * n + i] = src[4 * i + 3];
        }
        return;
    default:
        for (unsigned p = 0; p < planes; p++) {
            uint8_t *out = dst + p * n;
            for (size_t i = 0; i < n; i++)
                out[i] = src[i * planes + p];
        }
    }
}

void ckptfs_planes_unshuffle(uint8_t *dst, const uint8_t *src, size_t len, unsigned planes)
{
    size_t n = len / (planes ? planes : 1);
    if (planes > 1)
        memcpy(dst + n * planes, src + n * planes, len - n * planes);
    switch (planes) {
    case 0:
    case 1:
        memcpy(dst, src, len);
        return;
    case 2: /* bf16, fp16: the common case, kept simple enough to vectorise */
        for (size_t i = 0; i < n; i++) {
            dst[2 * i] = src[i];
            dst[2 * i + 1] = src[n + i];
        }
        return;
    case 4:
        for (size_t i = 0; i < n; i++) {
            dst[4 * i] = src[i];
            dst[4 * i + 1] = src[n + i];
            dst[4 * i + 2] = src[2 * n + i];
            dst[4 * i + 3] = src[3 * n + i];
        }
        return;
    default:
        for (unsigned p = 0; p < planes; p++)
            for (size_t i = 0; i < n; i++)
                dst[i * planes + p] = src[p * n + i];
    }
}

bool ckptfs_frame_decode(const CkptfsFrameEntry *e, const uint8_t *src, uint8_t *dst, uint8_t *scratch,
                         void *decoder, GError **error)
{
    uint8_t *out = e->planes > 1 ? scratch : dst;
    size_t got = 0;
    const CkptfsCodecInfo *codec = ckptfs_codec(e->codec);
    if (codec == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "unknown codec %u", e->codec);
        return false;
    }
    if (!codec->decode(decoder, src, e->clength, out, e->ulength, &got, error))
        return false;
    if (got != e->ulength) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "decompresses to %zu bytes, not %u", got, e->ulength);
        return false;
    }
    if (e->planes > 1)
        ckptfs_planes_unshuffle(dst, scratch, e->ulength, e->planes);
    if (ckptfs_frame_checksum(dst, e->ulength) != e->checksum) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "checksum mismatch");
        return false;
    }
    return true;
}

/* --- reading --- */

struct CkptfsContainer {
    CkptfsContainerTrailer trailer;
    CkptfsFrameEntry *frames;
    uint32_t largest; /* of the frames' original lengths */
};

bool ckptfs_container_magic(const uint8_t *start, size_t len)
{
    return len >= CKPTFS_CONTAINER_MAGIC_LEN && memcmp(start, CKPTFS_CONTAINER_MAGIC, CKPTFS_CONTAINER_MAGIC_LEN) == 0;
}

static bool read_exact(int fd, void *buf, size_t len, uint64_t offset)
{
    int rc = ckptfs_pread_full(fd, buf, len, offset);
    errno = rc > 0 ? rc : rc < 0 ? EIO : 0;
    return rc == 0;
}

#define BAD(...)                                                                                  \
    do {                                                                                          \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                     \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: packed container: %s", path, why_); \
        ckptfs_container_free(c);                                                                 \
        return NULL;                                                                              \
    } while (0)

CkptfsContainer *ckptfs_container_open(int fd, uint64_t disk_size, const char *path, GError **error)
{
    CkptfsContainer *c = g_new0(CkptfsContainer, 1);
    uint8_t head[CKPTFS_CONTAINER_HEADER_SIZE], tail[CKPTFS_CONTAINER_TRAILER_SIZE];
    static const uint8_t zero[8] = {0};
    if (disk_size < CKPTFS_CONTAINER_HEADER_SIZE + CKPTFS_CONTAINER_TRAILER_SIZE)
        BAD("%" G_GUINT64_FORMAT " bytes is too short for a header and a trailer (truncated?)", disk_size);
    if (!read_exact(fd, head, sizeof head, 0) ||
        !read_exact(fd, tail, sizeof tail, disk_size - CKPTFS_CONTAINER_TRAILER_SIZE))
        BAD("cannot read its header and trailer: %s", g_strerror(errno ? errno : EIO));
    if (!ckptfs_container_magic(head, sizeof head) || memcmp(head + 8, zero, 8) != 0)
        BAD("bad header (not version 1)");
    if (!ckptfs_container_trailer_decode(tail, &c->trailer))
        BAD("no trailer at the end (truncated, or not written to the end)");
    const CkptfsContainerTrailer *t = &c->trailer;
    uint64_t max_frames = (disk_size - CKPTFS_CONTAINER_HEADER_SIZE - CKPTFS_CONTAINER_TRAILER_SIZE) /
                          CKPTFS_CONTAINER_ENTRY_SIZE;
    if (t->nframes > max_frames || t->nframes > (1u << 24))
        BAD("%" G_GUINT64_FORMAT " frames do not fit (at most %" G_GUINT64_FORMAT ", and 2^24)", t->nframes,
            MIN(max_frames, (uint64_t)1 << 24));
    uint64_t index_bytes = t->nframes * CKPTFS_CONTAINER_ENTRY_SIZE;
    if (t->index_offset < CKPTFS_CONTAINER_HEADER_SIZE ||
        t->index_offset != disk_size - CKPTFS_CONTAINER_TRAILER_SIZE - index_bytes)
        BAD("the index (%" G_GUINT64_FORMAT " frames at %" G_GUINT64_FORMAT ") does not end at the trailer",
            t->nframes, t->index_offset);
    if ((t->size == 0) != (t->nframes == 0))
        BAD("%" G_GUINT64_FORMAT " frames for %" G_GUINT64_FORMAT " bytes", t->nframes, t->size);
    g_autofree uint8_t *raw = g_try_malloc(index_bytes ? index_bytes : 1);
    if (raw == NULL || !read_exact(fd, raw, index_bytes, t->index_offset))
        BAD("cannot read its index");
    if (ckptfs_frame_checksum(raw, index_bytes) != t->index_checksum)
        BAD("the index checksum does not match (corrupt index)");
    c->frames = g_new(CkptfsFrameEntry, MAX(t->nframes, 1));
    uint64_t next_u = 0, next_c = CKPTFS_CONTAINER_HEADER_SIZE;
    for (uint64_t i = 0; i < t->nframes; i++) {
        CkptfsFrameEntry *e = &c->frames[i];
        ckptfs_frame_entry_decode(raw + i * CKPTFS_CONTAINER_ENTRY_SIZE, e);
        if (e->uoffset != next_u || e->ulength == 0 || e->ulength > CKPTFS_CONTAINER_MAX_FRAME ||
            e->ulength > t->size - next_u)
            BAD("frame %" G_GUINT64_FORMAT " (%u bytes at %" G_GUINT64_FORMAT ") is not 1 byte to 64 MiB "
                "starting at %" G_GUINT64_FORMAT ", where the frames before it end, within the %" G_GUINT64_FORMAT
                "-byte file", i, e->ulength, e->uoffset, next_u, t->size);
        if (ckptfs_codec(e->codec) == NULL)
            BAD("frame %" G_GUINT64_FORMAT ": unknown codec %u", i, e->codec);
        if ((e->planes != 1 && e->planes != 2 && e->planes != 4 && e->planes != 8) || e->ulength % e->planes != 0)
            BAD("frame %" G_GUINT64_FORMAT ": %u byte planes of %u bytes", i, e->planes, e->ulength);
        if ((e->codec == CKPTFS_CODEC_STORED && e->clength != e->ulength) || e->clength == 0 ||
            e->clength > ckptfs_codec_bound_any(e->ulength))
            BAD("frame %" G_GUINT64_FORMAT ": %u stored bytes for %u", i, e->clength, e->ulength);
        if (e->coffset < next_c || e->coffset > t->index_offset || e->clength > t->index_offset - e->coffset)
            BAD("frame %" G_GUINT64_FORMAT ": stored bytes [%" G_GUINT64_FORMAT ", +%u) overlap another frame or "
                "lie outside [16, %" G_GUINT64_FORMAT ")", i, e->coffset, e->clength, t->index_offset);
        next_u += e->ulength;
        next_c = e->coffset + e->clength;
        c->largest = MAX(c->largest, e->ulength);
    }
    if (next_u != t->size)
        BAD("the frames cover %" G_GUINT64_FORMAT " bytes of %" G_GUINT64_FORMAT, next_u, t->size);
    return c;
}

void ckptfs_container_free(CkptfsContainer *c)
{
    if (c == NULL)
        return;
    g_free(c->frames);
    g_free(c);
}

uint64_t ckptfs_container_size(const CkptfsContainer *c)
{
    return c->trailer.size;
}

uint64_t ckptfs_container_frames(const CkptfsContainer *c)
{
    return c->trailer.nframes;
}

uint32_t ckptfs_container_largest_frame(const CkptfsContainer *c)
{
    return c->largest;
}

const CkptfsFrameEntry *ckptfs_container_frame(const CkptfsContainer *c, uint64_t i)
{
    return &c->frames[i];
}

uint64_t ckptfs_container_frame_at(const CkptfsContainer *c, uint64_t offset)
{
    uint64_t lo = 0, hi = c->trailer.nframes;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (c->frames[mid].uoffset <= offset)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

void ckptfs_container_stats(const CkptfsContainer *c, CkptfsContainerStats *out)
{
    memset(out, 0, sizeof *out);
    out->frames = c->trailer.nframes;
    out->codec = c->trailer.codec_used;
    for (uint64_t i = 0; i < c->trailer.nframes; i++) {
        const CkptfsFrameEntry *e = &c->frames[i];
        unsigned k = e->planes == 1 ? 0 : e->planes == 2 ? 1 : e->planes == 4 ? 2 : 3;
        out->original[k] += e->ulength;
        out->stored[k] += e->clength;
    }
}
