/* The packed backend: a container of `ckptfs pack` (container.h) read as the file it holds.
 * Frames are decoded once into the set's frame cache, shared by every reader; frames ahead of a
 * sequential reader are decoded on decoder threads. A frame that does not decode to its size
 * and checksum is an error naming file and frame. */
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckptfs/container.h"
#include "ckptfs/error.h"
#include "ckptfs/readfile.h"
#include "srcfiles_internal.h"

/* Threads decoding frames of packed files ahead of their readers, at most (one per CPU). */
#define DECODERS_MAX 16u

struct SrcPackedSet {
    CkptfsFrameCache *frames; /* decompressed frames of packed files */
    GMutex lock;              /* decoders' creation */
    GThreadPool *decoders;    /* decode frames ahead of their readers; made on first use (after
                                 the daemon forks: GLib's pool threads are not inherited) */
};

/* A decoder thread's job: frame I of F. */
typedef struct {
    const CkptfsSrcFiles *files;
    SrcFile *file;
    uint64_t frame;
} DecodeJob;

SrcPackedSet *ckptfs_srcpacked_set_new(void)
{
    SrcPackedSet *set = g_new0(SrcPackedSet, 1);
    set->frames = ckptfs_frame_cache_new(CKPTFS_FRAME_CACHE_DEFAULT);
    g_mutex_init(&set->lock);
    return set;
}

void ckptfs_srcpacked_set_free(SrcPackedSet *set)
{
    if (set == NULL)
        return;
    if (set->decoders != NULL) /* queued frames dropped, running ones finished */
        g_thread_pool_free(set->decoders, TRUE, TRUE);
    g_mutex_clear(&set->lock);
    ckptfs_frame_cache_free(set->frames);
    g_free(set);
}

static int packed_open(SrcFile *f, int fd, const struct stat *st, GError **error)
{
    uint8_t magic[CKPTFS_CONTAINER_MAGIC_LEN];
    if ((uint64_t)st->st_size < sizeof magic || pread(fd, magic, sizeof magic, 0) != (ssize_t)sizeof magic ||
        !ckptfs_container_magic(magic, sizeof magic))
        return 0;
    f->container = ckptfs_container_open(fd, (uint64_t)st->st_size, f->pub.path, error);
    if (f->container == NULL)
        return -1;
    f->pub.size = ckptfs_container_size(f->container);
    return 1;
}

static void packed_close(SrcFile *f)
{
    ckptfs_container_free(f->container);
}

static uint64_t frame_key(const SrcFile *f, uint64_t i)
{
    return (uint64_t)f->index << 32 | i; /* frames < 2^24 */
}

/* Decodes frame I of F (read from FD) into a buffer of the cache (*OUT, *OUT_CAP). */
static bool decode_frame(CkptfsFrameCache *frames, SrcFile *f, int fd, uint64_t i, uint8_t **out,
                         size_t *out_cap, GError **error)
{
    const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
    size_t work_cap = 0;
    uint8_t *work = ckptfs_frame_cache_buffer(frames, (size_t)e->clength + e->ulength, &work_cap);
    *out = ckptfs_frame_cache_buffer(frames, e->ulength, out_cap);
    GError *why = NULL;
    bool ok = work != NULL && *out != NULL;
    if (!ok)
        g_set_error(&why, CKPTFS_ERROR, CKPTFS_ERROR_IO, "out of memory");
    int rc = ok ? ckptfs_pread_full(fd, work, e->clength, e->coffset) : 0;
    if (rc != 0) {
        g_set_error(&why, CKPTFS_ERROR, CKPTFS_ERROR_IO, "%s", rc > 0 ? g_strerror(rc) : "the file ends early");
        ok = false;
    }
    const CkptfsCodecInfo *codec = ckptfs_codec(e->codec); /* known: the container's index is checked */
    void *decoder = ok ? ckptfs_frame_cache_decoder(frames, codec) : NULL;
    ok = ok && ckptfs_frame_decode(e, work, *out, work + e->clength, decoder, &why);
    ckptfs_frame_cache_decoder_done(frames, codec, decoder);
    ckptfs_frame_cache_recycle(frames, work, work_cap);
    if (!ok) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_IO,
                    "%s: packed frame %" G_GUINT64_FORMAT " (original bytes [%" G_GUINT64_FORMAT ", %" G_GUINT64_FORMAT
                    ")): %s", f->pub.path, i, e->uoffset, e->uoffset + e->ulength, why->message);
        g_error_free(why);
        ckptfs_frame_cache_recycle(frames, *out, *out_cap);
        *out = NULL;
    }
    return ok;
}

/* Frame I of F decoded, from the cache (waiting for a thread decoding it) or now; held until
 * released. */
static const uint8_t *frame_get(CkptfsFrameCache *frames, SrcFile *f, int fd, uint64_t i, gpointer *hold,
                                GError **error)
{
    uint64_t key = frame_key(f, i);
    const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
    const uint8_t *data = ckptfs_frame_cache_get_or_claim(frames, key, e->ulength, hold);
    if (data != NULL)
        return data;
    uint8_t *out;
    size_t out_cap;
    if (!decode_frame(frames, f, fd, i, &out, &out_cap, error)) {
        ckptfs_frame_cache_abandon(frames, key);
        return NULL;
    }
    return ckptfs_frame_cache_put(frames, key, out, e->ulength, out_cap, hold);
}

/* A decoder thread's job: its frame (claimed) into the cache. A frame that fails is left to its
 * reader, which decodes it again and reports why. */
static void decode_ahead(gpointer data, gpointer user_data)
{
    (void)user_data;
    DecodeJob job = *(DecodeJob *)data;
    g_free(data); /* the pool frees only the jobs it drops */
    CkptfsFrameCache *frames = job.files->packed_set->frames;
    SrcFile *f = job.file;
    uint64_t key = frame_key(f, job.frame);
    if (!ckptfs_frame_cache_start(frames, key))
        return; /* a reader took it over meanwhile */
    int fd = ckptfs_srcfd_acquire(job.files->fds, f, NULL);
    uint8_t *out = NULL;
    size_t out_cap;
    if (fd >= 0 && decode_frame(frames, f, fd, job.frame, &out, &out_cap, NULL))
        ckptfs_frame_cache_put(frames, key, out, ckptfs_container_frame(f->container, job.frame)->ulength, out_cap, NULL);
    else
        ckptfs_frame_cache_abandon(frames, key);
    if (fd >= 0)
        ckptfs_srcfd_release(job.files->fds, f);
}

/* LEN original bytes at OFFSET of F, frame by frame. */
static bool container_read(CkptfsFrameCache *frames, SrcFile *f, int fd, uint8_t *buf, size_t len,
                           uint64_t offset, GError **error)
{
    if (offset > f->pub.size || len > f->pub.size - offset)
        return ckptfs_fail(error, CKPTFS_ERROR_IO, "%s: read of %zu bytes at offset %" G_GUINT64_FORMAT
                           " is past its end (%" G_GUINT64_FORMAT " bytes)", f->pub.path, len, offset, f->pub.size);
    for (uint64_t i = len ? ckptfs_container_frame_at(f->container, offset) : 0; len > 0; i++) {
        const CkptfsFrameEntry *e = ckptfs_container_frame(f->container, i);
        gpointer hold;
        const uint8_t *data = frame_get(frames, f, fd, i, &hold, error);
        if (data == NULL)
            return false;
        size_t skip = (size_t)(offset - e->uoffset), n = MIN(len, (size_t)e->ulength - skip);
        memcpy(buf, data + skip, n);
        ckptfs_frame_cache_release(frames, hold);
        buf += n, len -= n, offset += n;
    }
    return true;
}

static bool packed_preadv(const CkptfsSrcFiles *files, SrcFile *f, CkptfsSrcReader *reader, struct iovec *iov,
                          int n, uint64_t offset, GError **error)
{
    (void)reader; /* frames are shared by every reader */
    int fd = ckptfs_srcfd_acquire(files->fds, f, error);
    if (fd < 0)
        return false;
    bool ok = true;
    for (; ok && n > 0; iov++, n--) {
        ok = container_read(files->packed_set->frames, f, fd, iov->iov_base, iov->iov_len, offset, error);
        offset += iov->iov_len;
    }
    ok = ok && ckptfs_srcfile_check_fd(f, fd, error);
    ckptfs_srcfd_release(files->fds, f);
    return ok;
}

/* The set's decoder threads, made on first use. */
static GThreadPool *decoders(SrcPackedSet *set)
{
    GThreadPool *pool = g_atomic_pointer_get(&set->decoders);
    if (pool != NULL)
        return pool;
    g_mutex_lock(&set->lock);
    if (set->decoders == NULL)
        g_atomic_pointer_set(&set->decoders,
                             g_thread_pool_new_full(decode_ahead, NULL, g_free,
                                                    (gint)MIN(g_get_num_processors(), DECODERS_MAX), FALSE, NULL));
    pool = set->decoders;
    g_mutex_unlock(&set->lock);
    return pool;
}

/* The frames of F holding [OFFSET, OFFSET + LEN) go to the decoder threads, those not decoded or
 * claimed yet, while the cache has room for them. */
static void packed_advise(const CkptfsSrcFiles *files, SrcFile *f, uint64_t offset, uint64_t len)
{
    /* The descriptor is taken as a read's would be: a file changed or gone gets no advice. */
    if (ckptfs_srcfd_acquire(files->fds, f, NULL) < 0)
        return;
    if (offset < f->pub.size) {
        GThreadPool *pool = decoders(files->packed_set);
        uint64_t end = MIN(offset + len, f->pub.size);
        uint64_t last = ckptfs_container_frame_at(f->container, end - 1);
        for (uint64_t i = ckptfs_container_frame_at(f->container, offset); i <= last; i++) {
            if (!ckptfs_frame_cache_claim(files->packed_set->frames, frame_key(f, i),
                                          ckptfs_container_frame(f->container, i)->ulength))
                continue;
            /* Queued even when no thread can be started now: its reader then takes the claim over. */
            DecodeJob job = {files, f, i};
            g_thread_pool_push(pool, g_memdup2(&job, sizeof job), NULL);
        }
    }
    ckptfs_srcfd_release(files->fds, f);
}

const SrcBackend ckptfs_src_packed = {
    .name = "packed",
    .open = packed_open,
    .preadv = packed_preadv,
    .advise = packed_advise,
    .map_pin = NULL,
    .map_unpin = NULL,
    .same = ckptfs_srcfile_same,
    .close = packed_close,
    .decoded = true,
};

uint64_t ckptfs_srcfiles_frames_decoded(const CkptfsSrcFiles *files)
{
    return ckptfs_frame_cache_decoded(files->packed_set->frames);
}

void ckptfs_srcfiles_set_frame_cache(CkptfsSrcFiles *files, uint64_t bytes)
{
    ckptfs_frame_cache_set_budget(files->packed_set->frames, bytes);
}

uint32_t ckptfs_srcfiles_largest_frame(const CkptfsSrcFiles *files, unsigned *index)
{
    uint32_t largest = 0;
    for (guint i = 0; i < files->files->len; i++) {
        const SrcFile *f = g_ptr_array_index(files->files, i);
        if (f->backend == &ckptfs_src_packed && ckptfs_container_largest_frame(f->container) > largest) {
            largest = ckptfs_container_largest_frame(f->container);
            *index = i;
        }
    }
    return largest;
}

bool ckptfs_srcfiles_container_stats(const CkptfsSrcFiles *files, unsigned index, CkptfsContainerStats *out)
{
    const SrcFile *f = index < files->files->len ? g_ptr_array_index(files->files, index) : NULL;
    if (f == NULL || f->backend != &ckptfs_src_packed)
        return false;
    ckptfs_container_stats(f->container, out);
    return true;
}
