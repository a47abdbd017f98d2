/* ckptfs pack: writes packed checkpoints (docs/compression.md, include/ckptfs/pack.h).
 *
 * A file is cut into segments (maximal runs of tensor bytes of one element size, or of bytes
 * that are not tensor data), each segment into frames of at most the frame size. The calling
 * thread reads frames into a window of buffers and writes them out in order; worker threads
 * checksum, split into byte planes and compress them. A frame that does not shrink is stored:
 * codec 0, planes 1, its original bytes. */
#include "ckptfs/pack.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/catalog.h"
#include "ckptfs/error.h"
#include "ckptfs/readfile.h"
#include "ckptfs/srcfiles.h"
#include "ckptfs/units.h"
#include "ckptfs/verl_run.h"

#define THREADS_DEFAULT_MAX 16u
#define VERIFY_CHUNK (4u << 20)
/* Decoded frames the verifying reader may keep: it reads each file once, in order. */
#define VERIFY_FRAME_CACHE (64ull << 20)

/* --- options --- */

void ckptfs_pack_options_init(CkptfsPackOptions *options)
{
    memset(options, 0, sizeof *options);
    options->codec = CKPTFS_CODEC_ZSTD;
    options->frame_size = CKPTFS_PACK_FRAME_DEFAULT;
}

static bool parse_uint(const char *key, const char *value, uint64_t min, uint64_t max, uint64_t *out,
                       GError **error)
{
    GError *local = NULL;
    if (!ckptfs_parse_uint(value, min, max, out, &local)) {
        ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s: %s", key, local->message);
        g_error_free(local);
        return false;
    }
    return true;
}

CkptfsOptionResult ckptfs_pack_options_apply(CkptfsPackOptions *options, const char *key_value,
                                             GError **error)
{
    const char *eq = strchr(key_value, '=');
    g_autofree char *key = eq ? g_strndup(key_value, (gsize)(eq - key_value)) : g_strdup(key_value);
    const char *value = eq ? eq + 1 : NULL;
    static const char *const keys[] = {"codec", "level", "frame", "threads"};
    bool ours = false;
    for (size_t i = 0; i < G_N_ELEMENTS(keys); i++)
        ours |= strcmp(key, keys[i]) == 0;
    if (!ours)
        return CKPTFS_OPTION_UNKNOWN;
    if (value == NULL || *value == '\0') {
        ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s needs a value (%s=...)", key, key);
        return CKPTFS_OPTION_BAD;
    }
    uint64_t v;
    if (strcmp(key, "codec") == 0) {
        const CkptfsCodecInfo *codec = ckptfs_codec_by_name(value);
        if (codec == NULL) {
            g_autofree char *names = ckptfs_codec_written_names();
            ckptfs_fail(error, CKPTFS_ERROR_INVALID, "codec: '%s' is not %s", value, names);
            return CKPTFS_OPTION_BAD;
        }
        options->codec = codec->id;
    } else if (strcmp(key, "level") == 0) {
        if (!parse_uint(key, value, 1, (uint64_t)ckptfs_codec_level_max(), &v, error))
            return CKPTFS_OPTION_BAD;
        options->level = (int)v;
    } else if (strcmp(key, "threads") == 0) {
        if (!parse_uint(key, value, 1, CKPTFS_PACK_THREADS_MAX, &v, error))
            return CKPTFS_OPTION_BAD;
        options->threads = (unsigned)v;
    } else {
        GError *local = NULL;
        if (!ckptfs_parse_size(value, &v, &local)) {
            ckptfs_fail(error, CKPTFS_ERROR_INVALID, "frame: %s", local->message);
            g_error_free(local);
            return CKPTFS_OPTION_BAD;
        }
        if (v < CKPTFS_PACK_FRAME_MIN || v > CKPTFS_PACK_FRAME_MAX || v % 4096 != 0) {
            ckptfs_fail(error, CKPTFS_ERROR_INVALID,
                        "frame: %s (%" G_GUINT64_FORMAT " bytes) is not a multiple of 4096 from 64K to 64M",
                        value, v);
            return CKPTFS_OPTION_BAD;
        }
        options->frame_size = (uint32_t)v;
    }
    return CKPTFS_OPTION_TAKEN;
}

bool ckptfs_pack_options_check(CkptfsPackOptions *options, GError **error)
{
    const CkptfsCodecInfo *codec = ckptfs_codec(options->codec);
    if (codec == NULL || codec->encode == NULL) {
        g_autofree char *names = ckptfs_codec_written_names();
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "codec %d is not %s", (int)options->codec, names);
    }
    if (options->level == 0)
        options->level = codec->level_default;
    if (options->level < codec->level_min || options->level > codec->level_max)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "level: %s levels go from %d%s to %d%s, not %d", codec->name,
                           codec->level_min, codec->level_min_note, codec->level_max, codec->level_max_note,
                           options->level);
    if (options->frame_size < CKPTFS_PACK_FRAME_MIN || options->frame_size > CKPTFS_PACK_FRAME_MAX ||
        options->frame_size % 4096 != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "frame: %u bytes is not a multiple of 4096 from 64K to 64M",
                           options->frame_size);
    if (options->threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        options->threads = n < 1 ? 1u : MIN((unsigned)n, THREADS_DEFAULT_MAX);
    }
    if (options->threads > CKPTFS_PACK_THREADS_MAX)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "threads: at most %u", CKPTFS_PACK_THREADS_MAX);
    return true;
}

const char *ckptfs_pack_class_name(unsigned cls)
{
    static const char *const names[CKPTFS_PACK_CLASSES] = {"raw", "1-byte", "2-byte", "4-byte", "8-byte"};
    return cls < CKPTFS_PACK_CLASSES ? names[cls] : "?";
}

static unsigned class_of(uint32_t esize)
{
    switch (esize) {
    case 1:
        return CKPTFS_PACK_E1;
    case 2:
        return CKPTFS_PACK_E2;
    case 4:
        return CKPTFS_PACK_E4;
    case 8:
        return CKPTFS_PACK_E8;
    default:
        return CKPTFS_PACK_RAW;
    }
}

/* --- tensor byte ranges --- */

static gint range_cmp(gconstpointer a, gconstpointer b)
{
    const CkptfsPackRange *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->length != y->length) /* the longest first: it decides the element size */
        return x->length > y->length ? -1 : 1;
    return x->esize < y->esize ? -1 : x->esize > y->esize;
}

void ckptfs_pack_ranges_normalize(GArray *ranges)
{
    g_array_sort(ranges, range_cmp);
    guint out = 0;
    for (guint i = 0; i < ranges->len; i++) {
        CkptfsPackRange r = g_array_index(ranges, CkptfsPackRange, i);
        if (r.length == 0)
            continue;
        if (out > 0) {
            CkptfsPackRange *cur = &g_array_index(ranges, CkptfsPackRange, out - 1);
            uint64_t end = cur->offset + cur->length, r_end = r.offset + r.length;
            if (r.offset < end || (r.offset == end && r.esize == cur->esize)) {
                if (r_end > end)
                    cur->length = r_end - cur->offset;
                continue;
            }
        }
        g_array_index(ranges, CkptfsPackRange, out++) = r;
    }
    g_array_set_size(ranges, out);
}

static void add_rows(GPtrArray *per_file, uint32_t src, uint64_t offset, uint64_t rows, uint64_t width,
                     uint64_t stride, uint32_t esize)
{
    if (src >= per_file->len || rows == 0 || width == 0)
        return;
    GArray *ranges = g_ptr_array_index(per_file, src);
    if (rows == 1 || stride == width) {
        CkptfsPackRange r = {.offset = offset, .length = rows * width, .esize = esize};
        g_array_append_val(ranges, r);
        return;
    }
    for (uint64_t i = 0; i < rows; i++) {
        CkptfsPackRange r = {.offset = offset + i * stride, .length = width, .esize = esize};
        g_array_append_val(ranges, r);
    }
}

static void add_catalog(GPtrArray *per_file, const CkptfsCatalog *catalog)
{
    if (catalog == NULL)
        return;
    for (unsigned i = 0; i < ckptfs_catalog_count(catalog); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(catalog, i);
        uint32_t esize = (uint32_t)ckptfs_dtype_size(t->stored);
        if (esize != 1 && esize != 2 && esize != 4 && esize != 8)
            continue; /* no such type today: left as raw bytes */
        for (unsigned p = 0; p < t->npieces; p++) {
            const CkptfsPiece *pc = &t->pieces[p];
            if ((pc->col_stride != 0 && pc->col_stride != esize) || pc->col_step > 1)
                continue; /* a view of a stored tensor (an expert of a fused one): that tensor's ranges hold it */
            add_rows(per_file, pc->src, pc->offset, pc->row1 - pc->row0, (pc->col1 - pc->col0) * esize,
                     pc->row_stride, esize);
        }
        if (t->scale != NULL) /* block scales: fp32 */
            add_rows(per_file, t->scale->src, t->scale->base, t->scale->rows, t->scale->cols * 4,
                     t->scale->row_stride, 4);
    }
}

static void ranges_free(gpointer p)
{
    g_array_unref(p);
}

GPtrArray *ckptfs_pack_source_ranges(const CkptfsSource *source)
{
    unsigned n = ckptfs_srcfiles_count(source->files);
    GPtrArray *per_file = g_ptr_array_new_full(n, ranges_free);
    for (unsigned i = 0; i < n; i++)
        g_ptr_array_add(per_file, g_array_new(FALSE, FALSE, sizeof(CkptfsPackRange)));
    add_catalog(per_file, source->catalog);
    add_catalog(per_file, source->model_catalog);
    add_catalog(per_file, source->adapter);
    for (unsigned i = 0; i < n; i++)
        ckptfs_pack_ranges_normalize(g_ptr_array_index(per_file, i));
    return per_file;
}

/* --- I/O helpers --- */

/* Reads LEN bytes at OFFSET; a file that ends sooner is an error. */
static bool pread_full(int fd, void *buf, size_t len, uint64_t offset, const char *name, GError **error)
{
    int rc = ckptfs_pread_full(fd, buf, len, offset);
    if (rc > 0)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: read failed: %s", name, g_strerror(rc));
    if (rc < 0)
        return ckptfs_fail(error, CKPTFS_ERROR_CHANGED, "%s: ends before byte %" G_GUINT64_FORMAT
                           ": it shrank while being packed", name, offset + len);
    return true;
}

static bool write_full(int fd, const void *buf, size_t len, const char *name, GError **error)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: write failed: %s", name, g_strerror(errno));
        if (n == 0)
            return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: write failed: nothing written", name);
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* Starts the writeback of what was written to FD since *FLUSHED once 16 MiB or more are
 * pending, so that the fdatasync before the rename finds little left to write (and does not
 * stall the workers). Errors are left to that fdatasync (a pipe or device says EINVAL/ESPIPE). */
#define WRITEBACK_STEP (16u << 20)
static void start_writeback(int fd, uint64_t written, uint64_t *flushed)
{
    if (written - *flushed < WRITEBACK_STEP)
        return;
    (void)sync_file_range(fd, (off_t)*flushed, (off_t)(written - *flushed), SYNC_FILE_RANGE_WRITE);
    *flushed = written;
}

/* --- the container writer --- */

typedef struct {
    uint64_t uoffset;
    uint32_t ulength, clength, checksum;
    uint8_t planes, codec, cls;
    uint8_t *in;  /* the original bytes (frame size) */
    uint8_t *out; /* the compressed bytes (frame size) */
    bool done;
} Slot;

typedef struct {
    CkptfsPacker *packer;
    GThread *thread;
    void *encoder;    /* the codec's encoder context */
    uint8_t *scratch; /* the byte planes (frame size) */
} Worker;

struct CkptfsPacker {
    CkptfsPackOptions o;
    const CkptfsCodecInfo *codec; /* o.codec's row */
    Slot *slots;
    unsigned nslots;
    Worker *workers;
    GAsyncQueue *jobs; /* Slot* to compress; &stop_job ends a worker */
    GMutex lock;       /* every slot's done */
    GCond done;
    void (*progress)(const CkptfsPackStats *stats, gpointer ctx);
    gpointer ctx;
};

static Slot stop_job;

static void compress_slot(Worker *w, Slot *s)
{
    const CkptfsPackOptions *o = &w->packer->o;
    s->checksum = ckptfs_frame_checksum(s->in, s->ulength);
    const uint8_t *src = s->in;
    if (s->planes > 1) {
        ckptfs_planes_shuffle(w->scratch, s->in, s->ulength, s->planes);
        src = w->scratch;
    }
    size_t clen = 0;
    if (s->ulength > 1) {
        size_t cap = s->ulength - 1; /* only a frame that shrinks is kept compressed */
        clen = w->packer->codec->encode(w->encoder, src, s->ulength, s->out, cap, o->level);
    }
    if (clen > 0 && clen < s->ulength) {
        s->codec = (uint8_t)o->codec;
        s->clength = (uint32_t)clen;
    } else { /* stored: the original bytes, so a reader copies them as they are */
        s->codec = CKPTFS_CODEC_STORED;
        s->planes = 1;
        s->clength = s->ulength;
    }
}

static gpointer worker_main(gpointer data)
{
    Worker *w = data;
    CkptfsPacker *p = w->packer;
    for (;;) {
        Slot *s = g_async_queue_pop(p->jobs);
        if (s == &stop_job)
            break;
        compress_slot(w, s);
        g_mutex_lock(&p->lock);
        s->done = true;
        g_cond_broadcast(&p->done);
        g_mutex_unlock(&p->lock);
    }
    return NULL;
}

CkptfsPacker *ckptfs_packer_new(const CkptfsPackOptions *options,
                                void (*progress)(const CkptfsPackStats *stats, gpointer ctx), gpointer ctx)
{
    CkptfsPacker *p = g_new0(CkptfsPacker, 1);
    p->o = *options;
    p->codec = ckptfs_codec(p->o.codec);
    p->progress = progress;
    p->ctx = ctx;
    unsigned threads = MAX(p->o.threads, 1u);
    p->o.threads = threads;
    /* Twice as many frames as workers in flight: every worker has the next frame ready while the
     * calling thread waits for the oldest one to write it. */
    p->nslots = 2 * threads;
    p->slots = g_new0(Slot, p->nslots);
    for (unsigned i = 0; i < p->nslots; i++) {
        p->slots[i].in = g_malloc(p->o.frame_size);
        p->slots[i].out = g_malloc(p->o.frame_size);
    }
    g_mutex_init(&p->lock);
    g_cond_init(&p->done);
    p->jobs = g_async_queue_new();
    p->workers = g_new0(Worker, threads);
    for (unsigned i = 0; i < threads; i++) {
        Worker *w = &p->workers[i];
        w->packer = p;
        w->scratch = g_malloc(p->o.frame_size);
        w->encoder = p->codec->encoder_new(p->o.level);
        if (w->encoder == NULL) /* as g_malloc does */
            g_error("ckptfs pack: out of memory (a %s encoder)", p->codec->name);
        w->thread = g_thread_new("ckptfs-pack", worker_main, w);
    }
    return p;
}

void ckptfs_packer_free(CkptfsPacker *p)
{
    if (p == NULL)
        return;
    for (unsigned i = 0; i < p->o.threads; i++)
        g_async_queue_push(p->jobs, &stop_job);
    for (unsigned i = 0; i < p->o.threads; i++) {
        Worker *w = &p->workers[i];
        g_thread_join(w->thread);
        p->codec->encoder_free(w->encoder);
        g_free(w->scratch);
    }
    g_free(p->workers);
    g_async_queue_unref(p->jobs);
    for (unsigned i = 0; i < p->nslots; i++) {
        g_free(p->slots[i].in);
        g_free(p->slots[i].out);
    }
    g_free(p->slots);
    g_mutex_clear(&p->lock);
    g_cond_clear(&p->done);
    g_free(p);
}

/* Cuts [0, size) into frames: segments of tensor bytes of one element size (RANGES) or of other
 * bytes (the gaps), each cut into frames of at most FRAME bytes from its start. */
typedef struct {
    const CkptfsPackRange *ranges;
    unsigned nranges, next; /* the first range not yet started */
    uint64_t size, pos, seg_end;
    uint32_t esize; /* of the current segment; 0: not tensor bytes */
    uint32_t frame;
} FrameCutter;

static bool cutter_next(FrameCutter *c, uint64_t *offset, uint32_t *len, uint8_t *planes, uint8_t *cls)
{
    if (c->pos >= c->size)
        return false;
    if (c->pos >= c->seg_end) {
        while (c->next < c->nranges && c->ranges[c->next].offset + c->ranges[c->next].length <= c->pos)
            c->next++;
        const CkptfsPackRange *r = c->next < c->nranges ? &c->ranges[c->next] : NULL;
        if (r != NULL && r->offset <= c->pos) {
            c->seg_end = MIN(r->offset + r->length, c->size);
            c->esize = r->esize;
            c->next++;
        } else {
            c->seg_end = r != NULL ? MIN(r->offset, c->size) : c->size;
            c->esize = 0;
        }
    }
    uint64_t n = MIN((uint64_t)c->frame, c->seg_end - c->pos);
    *offset = c->pos;
    *len = (uint32_t)n;
    /* A segment's last frame is shorter; whole elements unless overlapping ranges of different
     * element sizes were merged, whose odd tail is then taken as plain bytes. */
    *planes = (uint8_t)(c->esize >= 2 && n % c->esize == 0 ? c->esize : 1);
    *cls = (uint8_t)class_of(c->esize);
    c->pos += n;
    return true;
}

static void wait_done(CkptfsPacker *p, Slot *s)
{
    g_mutex_lock(&p->lock);
    while (!s->done)
        g_cond_wait(&p->done, &p->lock);
    g_mutex_unlock(&p->lock);
}

bool ckptfs_packer_write(CkptfsPacker *p, int src_fd, uint64_t size, const CkptfsPackRange *ranges,
                         unsigned nranges, int out_fd, const char *src_name, const char *dest_name,
                         CkptfsPackStats *stats, GError **error)
{
    uint8_t header[CKPTFS_CONTAINER_HEADER_SIZE] = {0};
    memcpy(header, CKPTFS_CONTAINER_MAGIC, CKPTFS_CONTAINER_MAGIC_LEN);
    if (!write_full(out_fd, header, sizeof header, dest_name, error))
        return false;
    stats->bytes_out += sizeof header;
    FrameCutter cut = {.ranges = ranges, .nranges = nranges, .size = size, .frame = p->o.frame_size};
    g_autoptr(GArray) index = g_array_new(FALSE, FALSE, CKPTFS_CONTAINER_ENTRY_SIZE);
    uint64_t coffset = CKPTFS_CONTAINER_HEADER_SIZE, flushed = 0;
    uint64_t submitted = 0, written = 0;
    bool ok = true, more = true;
    while (ok && (more || written < submitted)) {
        /* Fill the window: read the next frames and hand them to the workers. */
        while (ok && more && submitted - written < p->nslots) {
            Slot *s = &p->slots[submitted % p->nslots];
            more = cutter_next(&cut, &s->uoffset, &s->ulength, &s->planes, &s->cls);
            if (!more)
                break;
            if (!pread_full(src_fd, s->in, s->ulength, s->uoffset, src_name, error)) {
                ok = false;
                break;
            }
            s->done = false;
            g_async_queue_push(p->jobs, s);
            submitted++;
        }
        if (!ok || written == submitted)
            break;
        /* Write the oldest frame. */
        Slot *s = &p->slots[written % p->nslots];
        wait_done(p, s);
        written++;
        const uint8_t *bytes = s->codec == CKPTFS_CODEC_STORED ? s->in : s->out;
        if (!write_full(out_fd, bytes, s->clength, dest_name, error)) {
            ok = false;
            break;
        }
        CkptfsFrameEntry e = {.uoffset = s->uoffset, .ulength = s->ulength, .clength = s->clength,
                              .coffset = coffset, .codec = s->codec, .planes = s->planes,
                              .checksum = s->checksum};
        uint8_t raw[CKPTFS_CONTAINER_ENTRY_SIZE];
        ckptfs_frame_entry_encode(&e, raw);
        g_array_append_vals(index, raw, 1);
        coffset += s->clength;
        start_writeback(out_fd, coffset, &flushed);
        stats->bytes_in += s->ulength;
        stats->bytes_out += s->clength;
        stats->class_in[s->cls] += s->ulength;
        stats->class_out[s->cls] += s->clength;
        stats->frames++;
        stats->frames_stored += s->codec == CKPTFS_CODEC_STORED;
        if (p->progress)
            p->progress(stats, p->ctx);
    }
    /* On an error, let the workers finish what they hold before the buffers are reused. */
    while (written < submitted)
        wait_done(p, &p->slots[written++ % p->nslots]);
    if (!ok)
        return false;
    if (index->len > (1u << 24))
        return ckptfs_fail(error, CKPTFS_ERROR_UNSUPPORTED, "%s: %u frames, over the 2^24 a container may hold; "
                           "pack with a larger frame size (-o frame=)", dest_name, index->len);
    size_t index_bytes = (size_t)index->len * CKPTFS_CONTAINER_ENTRY_SIZE;
    CkptfsContainerTrailer t = {.size = size, .nframes = index->len, .index_offset = coffset,
                                .frame_size = p->o.frame_size,
                                .index_checksum = ckptfs_frame_checksum(index->data, index_bytes),
                                .codec_used = (uint8_t)p->o.codec};
    uint8_t trailer[CKPTFS_CONTAINER_TRAILER_SIZE];
    ckptfs_container_trailer_encode(&t, trailer);
    if (!write_full(out_fd, index->data, index_bytes, dest_name, error) ||
        !write_full(out_fd, trailer, sizeof trailer, dest_name, error))
        return false;
    stats->bytes_out += index_bytes + sizeof trailer;
    return true;
}

/* --- the directory tree --- */

typedef struct {
    char *rel;  /* below SRC ("" never: the root is not an item) */
    bool dir;
    uint64_t size;
    uint32_t mode; /* permission bits */
    uint64_t dev, ino;
} Item;

static void item_free(gpointer data)
{
    Item *it = data;
    g_free(it->rel);
    g_free(it);
}

static void warn(const CkptfsPackHooks *hooks, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static void warn(const CkptfsPackHooks *hooks, const char *fmt, ...)
{
    if (hooks == NULL || hooks->warning == NULL)
        return;
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    hooks->warning(msg, hooks->ctx);
}

static gint name_cmp(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists the tree under ROOT depth-first, parents first, names sorted: directories, regular files
 * and symlinks to regular files (as files); anything else is skipped with a warning. */
static bool scan(const char *root, const char *rel, GPtrArray *items, const CkptfsPackHooks *hooks,
                 CkptfsPackStats *stats, GError **error)
{
    g_autofree char *dir_path = *rel ? g_build_filename(root, rel, NULL) : g_strdup(root);
    DIR *d = opendir(dir_path);
    if (d == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dir_path, g_strerror(errno));
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
            g_ptr_array_add(names, g_strdup(de->d_name));
        errno = 0;
    }
    int err = errno;
    closedir(d);
    if (err != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dir_path, g_strerror(err));
    g_ptr_array_sort(names, name_cmp);
    for (guint i = 0; i < names->len; i++) {
        const char *name = g_ptr_array_index(names, i);
        g_autofree char *item_rel = *rel ? g_build_filename(rel, name, NULL) : g_strdup(name);
        g_autofree char *path = g_build_filename(root, item_rel, NULL);
        struct stat st;
        if (lstat(path, &st) != 0)
            return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", path, g_strerror(errno));
        if (S_ISLNK(st.st_mode)) {
            if (stat(path, &st) != 0) {
                warn(hooks, "%s: skipped: a symlink whose target cannot be read (%s)", path, g_strerror(errno));
                stats->files_skipped++;
                continue;
            }
            if (!S_ISREG(st.st_mode)) {
                warn(hooks, "%s: skipped: a symlink to %s", path,
                     S_ISDIR(st.st_mode) ? "a directory" : "something that is not a regular file");
                stats->files_skipped++;
                continue;
            }
        }
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
            warn(hooks, "%s: skipped: not a regular file or directory", path);
            stats->files_skipped++;
            continue;
        }
        Item *it = g_new0(Item, 1);
        it->rel = g_steal_pointer(&item_rel);
        it->dir = S_ISDIR(st.st_mode);
        it->size = it->dir ? 0 : (uint64_t)st.st_size;
        it->mode = st.st_mode & 07777;
        it->dev = st.st_dev;
        it->ino = st.st_ino;
        g_ptr_array_add(items, it);
        if (it->dir && !scan(root, it->rel, items, hooks, stats, error))
            return false;
    }
    return true;
}

/* Refuses DEST when it exists and is not an empty directory, or lies inside SRC (or is SRC).
 * Sets *EXISTS. */
static bool check_dest(const char *src, const char *dest, bool *exists, GError **error)
{
    struct stat st;
    *exists = false;
    if (lstat(dest, &st) == 0) {
        if (!S_ISDIR(st.st_mode) && !(S_ISLNK(st.st_mode) && stat(dest, &st) == 0 && S_ISDIR(st.st_mode)))
            return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s: exists and is not a directory", dest);
        DIR *d = opendir(dest);
        if (d == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dest, g_strerror(errno));
        struct dirent *de;
        bool empty = true;
        while ((de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                empty = false;
        closedir(d);
        if (!empty)
            return ckptfs_fail(error, CKPTFS_ERROR_INVALID,
                               "%s: exists and is not empty (pack writes a new directory)", dest);
        *exists = true;
    } else if (errno != ENOENT) {
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dest, g_strerror(errno));
    }
    /* Where DEST is (or would be): its parent resolved, then its name. */
    g_autofree char *real_src = realpath(src, NULL);
    if (real_src == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", src, g_strerror(errno));
    g_autofree char *real_dest = NULL;
    if (*exists) {
        real_dest = realpath(dest, NULL);
    } else {
        g_autofree char *trimmed = g_strdup(dest); /* "out/": "out" in "." */
        for (size_t n = strlen(trimmed); n > 1 && trimmed[n - 1] == '/'; n--)
            trimmed[n - 1] = '\0';
        g_autofree char *parent = g_path_get_dirname(trimmed);
        g_autofree char *base = g_path_get_basename(trimmed);
        g_autofree char *real_parent = realpath(parent, NULL);
        if (real_parent == NULL)
            return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", parent, g_strerror(errno));
        real_dest = g_build_filename(real_parent, base, NULL);
    }
    if (real_dest == NULL)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dest, g_strerror(errno));
    size_t n = strlen(real_src);
    if (strcmp(real_dest, real_src) == 0 ||
        (strncmp(real_dest, real_src, n) == 0 && (real_dest[n] == '/' || strcmp(real_src, "/") == 0)))
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s: inside the source %s (nothing is written into SRC)",
                           dest, src);
    return true;
}

static void packer_progress(const CkptfsPackStats *stats, gpointer ctx)
{
    const CkptfsPackHooks *hooks = ctx;
    if (hooks && hooks->progress)
        hooks->progress(stats, false, hooks->ctx);
}

/* Writes one file of DEST under a temporary name in its directory, renamed when complete. */
static bool write_item(CkptfsPacker *packer, const char *src, const char *dest, const Item *it, GArray *ranges,
                       const CkptfsPackHooks *hooks, CkptfsPackStats *stats, GError **error)
{
    g_autofree char *src_path = g_build_filename(src, it->rel, NULL);
    g_autofree char *dest_path = g_build_filename(dest, it->rel, NULL);
    g_autofree char *dir = g_path_get_dirname(dest_path);
    g_autofree char *base = g_path_get_basename(dest_path);
    /* A hidden name that never looks finished; a long name gets a short one (NAME_MAX). */
    g_autofree char *tmp = strlen(base) < 200 ? g_strdup_printf("%s/.%s.ckptfs-pack-XXXXXX", dir, base)
                                              : g_strdup_printf("%s/.ckptfs-pack-XXXXXX", dir);
    struct stat st;
    int src_fd = ckptfs_open_regular(src_path, &st, error); /* replaced by a FIFO since: never blocks */
    if (src_fd < 0)
        return false;
    if ((uint64_t)st.st_size != it->size || st.st_ino != it->ino || st.st_dev != it->dev) {
        close(src_fd);
        return ckptfs_fail(error, CKPTFS_ERROR_CHANGED, "%s: changed while being packed", src_path);
    }
    posix_fadvise(src_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    int out_fd = g_mkstemp_full(tmp, O_WRONLY | O_CLOEXEC, 0600);
    if (out_fd < 0) {
        int err = errno;
        close(src_fd);
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: cannot create %s: %s", dest_path, tmp, g_strerror(err));
    }
    bool ok;
    bool packed = ranges != NULL && ranges->len > 0;
    if (packed) {
        ok = ckptfs_packer_write(packer, src_fd, it->size, (const CkptfsPackRange *)ranges->data, ranges->len,
                                 out_fd, src_path, dest_path, stats, error);
    } else {
        ok = true;
        uint64_t flushed = 0;
        for (uint64_t off = 0; ok && off < it->size;) {
            /* Through the first frame buffer: the workers are idle between files. */
            uint8_t *buf = packer->slots[0].in;
            size_t n = (size_t)MIN((uint64_t)packer->o.frame_size, it->size - off);
            ok = pread_full(src_fd, buf, n, off, src_path, error) && write_full(out_fd, buf, n, dest_path, error);
            off += n;
            if (ok) {
                start_writeback(out_fd, off, &flushed);
                stats->bytes_in += n;
                stats->bytes_out += n;
                if (hooks && hooks->progress)
                    hooks->progress(stats, false, hooks->ctx);
            }
        }
    }
    close(src_fd);
    if (ok && fchmod(out_fd, it->mode & 0777) != 0)
        ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: chmod: %s", tmp, g_strerror(errno));
    /* On disk before it gets its name: a crash never leaves a finished-looking file with holes. */
    if (ok && fdatasync(out_fd) != 0)
        ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: write failed: %s", dest_path, g_strerror(errno));
    if (close(out_fd) != 0 && ok)
        ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: write failed: %s", dest_path, g_strerror(errno));
    if (ok && rename(tmp, dest_path) != 0)
        ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: rename from %s: %s", dest_path, tmp, g_strerror(errno));
    if (!ok) {
        unlink(tmp);
        return false;
    }
    if (packed)
        stats->files_packed++;
    else
        stats->files_copied++;
    return true;
}

/* The first 8 bytes of a file are a container's (SRC already packed). */
static bool check_not_packed(const char *path, GError **error)
{
    struct stat st;
    int fd = ckptfs_open_regular(path, &st, error);
    if (fd < 0)
        return false;
    uint8_t magic[CKPTFS_CONTAINER_MAGIC_LEN];
    ssize_t n = pread(fd, magic, sizeof magic, 0);
    int err = errno;
    close(fd);
    if (n < 0)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: read failed: %s", path, g_strerror(err));
    if (n == (ssize_t)sizeof magic && memcmp(magic, CKPTFS_CONTAINER_MAGIC, sizeof magic) == 0)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID,
                           "%s: already packed (a ckptfs container); pack reads unpacked checkpoints", path);
    return true;
}

static guint devino_hash(gconstpointer key)
{
    const uint64_t *k = key;
    return g_int64_hash(&k[1]) ^ g_int64_hash(&k[0]);
}

static gboolean devino_equal(gconstpointer a, gconstpointer b)
{
    const uint64_t *x = a, *y = b;
    return x[0] == y[0] && x[1] == y[1];
}

bool ckptfs_pack_dir(const char *src, const char *dest, const CkptfsOptions *source_options,
                     const CkptfsPackOptions *options, bool verify, const CkptfsPackHooks *hooks,
                     CkptfsPackStats *stats, GError **error)
{
    CkptfsPackOptions o = *options;
    if (!ckptfs_pack_options_check(&o, error))
        return false;
    struct stat st;
    if (stat(src, &st) != 0)
        return ckptfs_fail(error, CKPTFS_ERROR_NOT_FOUND, "%s: %s", src, g_strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "%s: not a directory (give the checkpoint's directory)", src);
    bool dest_exists;
    if (!check_dest(src, dest, &dest_exists, error))
        return false;
    g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(item_free);
    if (!scan(src, "", items, hooks, stats, error))
        return false;
    for (guint i = 0; i < items->len; i++) {
        const Item *it = g_ptr_array_index(items, i);
        g_autofree char *path = g_build_filename(src, it->rel, NULL);
        if (!it->dir && !check_not_packed(path, error))
            return false;
        stats->total_in += it->size;
    }
    CkptfsSource *source = ckptfs_source_open(src, source_options, error);
    if (source == NULL) {
        /* A verl run holds several checkpoints: each role directory is packed on its own. */
        if (error && *error && (ckptfs_verl_is_run(src) || ckptfs_verl_is_step(src)))
            g_prefix_error(error, "%s is a verl %s directory, not one checkpoint: pack each role directory "
                           "(global_step_N/actor, ...) on its own; ", src,
                           ckptfs_verl_is_run(src) ? "run" : "step");
        return false;
    }
    /* Tensor ranges per file of the tree, matched by device and inode (whatever path the source
     * opened a file by). */
    g_autoptr(GPtrArray) per_file = ckptfs_pack_source_ranges(source);
    g_autoptr(GHashTable) by_file = g_hash_table_new_full(devino_hash, devino_equal, g_free, NULL);
    unsigned nfiles = ckptfs_srcfiles_count(source->files);
    for (unsigned i = 0; i < nfiles; i++) {
        const CkptfsSrcFile *f = ckptfs_srcfiles_get(source->files, i);
        uint64_t *key = g_new(uint64_t, 2);
        key[0] = f->dev;
        key[1] = f->ino;
        g_hash_table_insert(by_file, key, GUINT_TO_POINTER(i + 1));
    }
    GArray **item_ranges = g_new0(GArray *, items->len);
    g_autofree bool *used = g_new0(bool, nfiles);
    bool ok = true;
    for (guint i = 0; ok && i < items->len; i++) {
        const Item *it = g_ptr_array_index(items, i);
        uint64_t key[2] = {it->dev, it->ino};
        unsigned idx = GPOINTER_TO_UINT(g_hash_table_lookup(by_file, key));
        if (it->dir || idx == 0)
            continue;
        const CkptfsSrcFile *f = ckptfs_srcfiles_get(source->files, idx - 1);
        GArray *ranges = g_ptr_array_index(per_file, idx - 1);
        if (f->size != it->size)
            ok = ckptfs_fail(error, CKPTFS_ERROR_CHANGED, "%s/%s: changed while being packed", src, it->rel);
        for (guint r = 0; ok && r < ranges->len; r++) {
            const CkptfsPackRange *pr = &g_array_index(ranges, CkptfsPackRange, r);
            if (pr->offset + pr->length > it->size)
                ok = ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s/%s: tensor bytes beyond its end", src, it->rel);
        }
        item_ranges[i] = ranges;
        used[idx - 1] = true;
    }
    for (unsigned i = 0; ok && i < nfiles; i++) {
        GArray *ranges = g_ptr_array_index(per_file, i);
        if (!used[i] && ranges->len > 0)
            warn(hooks, "%s: holds tensor bytes but is not in %s: not packed",
                 ckptfs_srcfiles_get(source->files, i)->path, src);
    }
    if (ok && !dest_exists && mkdir(dest, 0755) != 0)
        ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", dest, g_strerror(errno));
    bool started = ok; /* DEST is there: a failure from now on leaves it incomplete */
    CkptfsPacker *packer = NULL;
    if (ok)
        packer = ckptfs_packer_new(&o, packer_progress, (gpointer)hooks);
    for (guint i = 0; ok && i < items->len; i++) {
        const Item *it = g_ptr_array_index(items, i);
        if (it->dir) {
            g_autofree char *path = g_build_filename(dest, it->rel, NULL);
            if (mkdir(path, (it->mode & 0777) | 0700) != 0)
                ok = ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: %s", path, g_strerror(errno));
            stats->dirs++;
            continue;
        }
        ok = write_item(packer, src, dest, it, item_ranges[i], hooks, stats, error);
    }
    ckptfs_packer_free(packer);
    g_free(item_ranges);
    ckptfs_source_free(source);
    if (hooks && hooks->progress)
        hooks->progress(stats, false, hooks->ctx);
    if (!ok) {
        if (started && error && *error)
            g_prefix_error(error, "%s is incomplete (remove it and pack again): ", dest);
        return false;
    }
    return !verify || ckptfs_pack_verify(src, dest, hooks, stats, error);
}

/* --- verification --- */

static bool verify_file(const char *src_path, const char *dest_path, uint64_t size, uint8_t *a, uint8_t *b,
                        const CkptfsPackHooks *hooks, CkptfsPackStats *stats, GError **error)
{
    struct stat st;
    int fd = ckptfs_open_regular(src_path, &st, error);
    if (fd < 0)
        return false;
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(4);
    ckptfs_srcfiles_set_frame_cache(files, VERIFY_FRAME_CACHE);
    bool ok = true;
    int idx = ckptfs_srcfiles_add(files, dest_path, error);
    if (idx < 0)
        ok = false;
    else if (ckptfs_srcfiles_get(files, (unsigned)idx)->size != size)
        ok = ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "verify: %s reads as %" G_GUINT64_FORMAT " bytes, %s has %"
                         G_GUINT64_FORMAT, dest_path, ckptfs_srcfiles_get(files, (unsigned)idx)->size, src_path, size);
    for (uint64_t off = 0; ok && off < size;) {
        size_t n = (size_t)MIN((uint64_t)VERIFY_CHUNK, size - off);
        ok = pread_full(fd, a, n, off, src_path, error) &&
             ckptfs_srcfiles_pread(files, (unsigned)idx, b, n, off, error);
        if (ok && memcmp(a, b, n) != 0) {
            size_t k = 0;
            while (a[k] == b[k])
                k++;
            ok = ckptfs_fail(error, CKPTFS_ERROR_FORMAT,
                             "verify: %s differs from %s at byte %" G_GUINT64_FORMAT " (0x%02x, not 0x%02x)", dest_path,
                             src_path, off + k, b[k], a[k]);
        }
        off += n;
        if (ok) {
            stats->verified_bytes += n;
            if (hooks && hooks->progress)
                hooks->progress(stats, true, hooks->ctx);
        }
    }
    ckptfs_srcfiles_free(files);
    close(fd);
    if (ok)
        stats->verified_files++;
    return ok;
}

bool ckptfs_pack_verify(const char *src, const char *dest, const CkptfsPackHooks *hooks, CkptfsPackStats *stats,
                        GError **error)
{
    g_autoptr(GPtrArray) items = g_ptr_array_new_with_free_func(item_free);
    CkptfsPackStats ignored = {0};
    if (!scan(src, "", items, NULL, &ignored, error))
        return false;
    g_autofree uint8_t *a = g_malloc(VERIFY_CHUNK), *b = g_malloc(VERIFY_CHUNK);
    for (guint i = 0; i < items->len; i++) {
        const Item *it = g_ptr_array_index(items, i);
        if (it->dir)
            continue;
        g_autofree char *src_path = g_build_filename(src, it->rel, NULL);
        g_autofree char *dest_path = g_build_filename(dest, it->rel, NULL);
        if (!verify_file(src_path, dest_path, it->size, a, b, hooks, stats, error))
            return false;
    }
    if (hooks && hooks->progress)
        hooks->progress(stats, true, hooks->ctx);
    return true;
}
