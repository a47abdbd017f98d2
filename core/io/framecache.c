/* The frame cache of packed files (declared in include/ckptfs/container.h): decoded frames
 * shared by every reader of a set, least recently used dropped first, each frame decoded once.
 *
 * The frame protocol. A frame's key is in at most one of FRAMES (decoded) and PENDING (claimed
 * for decoding), both changed only under the cache's one lock, which is never held while a frame
 * is decoded or while another lock is taken (it is the last lock of any thread). A key is
 * claimed by a reader (get_or_claim, running) or for a decoder thread (claim, queued): whoever
 * holds a claim ends it exactly once, with put (the frame into FRAMES) or abandon (back to
 * nobody's); both wake the readers waiting on the key, which then look again. A decoder thread
 * starts a queued claim only if no reader took it over meanwhile (start); a reader takes over a
 * claim that is still queued rather than wait behind the queue, so each claim has at most one
 * running decoder. A frame is held (hold) from get_or_claim or put until release: a held frame is
 * never dropped, so the cache may go over its budget while every frame is held. Frames claimed
 * ahead plus frames decoded ahead and not read yet take at most half the budget. */
#include <glib.h>

#include "ckptfs/codec.h"
#include "ckptfs/container.h"


typedef struct {
    uint64_t key;
    uint8_t *data;
    size_t len, cap; /* bytes of the frame, of the buffer */
    unsigned holds;
    bool ahead; /* decoded ahead and not read yet: counted in ahead_bytes */
    GList link; /* in the LRU list while held by the cache */
} CachedFrame;

/* A frame being decoded, or queued to be by a decoder thread (not running yet: a reader that
 * wants it takes it over rather than waiting behind the queue). */
typedef struct {
    uint64_t key;
    size_t len;
    bool running;
} PendingFrame;

/* A buffer kept for the next decode: reusing one costs no page faults, where a fresh one of a
 * few MiB is a new mapping touched page by page. */
typedef struct {
    uint8_t *data;
    size_t cap;
} Spare;
#define SPARE_BUFFERS 16u

struct CkptfsFrameCache {
    GMutex lock;
    GHashTable *frames; /* key -> CachedFrame* */
    GQueue lru;         /* most recently used first */
    uint64_t bytes, budget;
    Spare spare[SPARE_BUFFERS];
    unsigned nspare;
    /* Idle decoder contexts per codec id, one per thread decoding at once at most. */
    GPtrArray *decoders[CKPTFS_CODEC_COUNT];
    GHashTable *pending; /* key -> PendingFrame*: frames claimed for decoding */
    uint64_t pending_bytes;
    uint64_t ahead_bytes; /* frames decoded ahead, not read yet */
    GCond decoded;       /* a pending frame was put or abandoned */
    uint64_t puts;       /* frames decoded and handed over, in all */
};

CkptfsFrameCache *ckptfs_frame_cache_new(uint64_t budget)
{
    CkptfsFrameCache *cache = g_new0(CkptfsFrameCache, 1);
    g_mutex_init(&cache->lock);
    cache->frames = g_hash_table_new(g_int64_hash, g_int64_equal);
    g_queue_init(&cache->lru);
    cache->budget = budget;
    for (unsigned id = 0; id < G_N_ELEMENTS(cache->decoders); id++)
        cache->decoders[id] = g_ptr_array_new();
    cache->pending = g_hash_table_new_full(g_int64_hash, g_int64_equal, NULL, g_free);
    g_cond_init(&cache->decoded);
    return cache;
}

static void cached_frame_free(CachedFrame *f)
{
    g_free(f->data);
    g_free(f);
}

/* Under the lock: keeps DATA for reuse, or frees it. */
static void recycle_locked(CkptfsFrameCache *cache, uint8_t *data, size_t cap)
{
    if (cache->nspare < SPARE_BUFFERS)
        cache->spare[cache->nspare++] = (Spare){data, cap};
    else
        g_free(data);
}

uint8_t *ckptfs_frame_cache_buffer(CkptfsFrameCache *cache, size_t len, size_t *cap)
{
    g_mutex_lock(&cache->lock);
    for (unsigned i = 0; i < cache->nspare; i++)
        if (cache->spare[i].cap >= len) {
            Spare s = cache->spare[i];
            cache->spare[i] = cache->spare[--cache->nspare];
            g_mutex_unlock(&cache->lock);
            *cap = s.cap;
            return s.data;
        }
    g_mutex_unlock(&cache->lock);
    *cap = len;
    return g_try_malloc(MAX(len, 1));
}

void ckptfs_frame_cache_recycle(CkptfsFrameCache *cache, uint8_t *data, size_t cap)
{
    if (data == NULL)
        return;
    g_mutex_lock(&cache->lock);
    recycle_locked(cache, data, cap);
    g_mutex_unlock(&cache->lock);
}

void *ckptfs_frame_cache_decoder(CkptfsFrameCache *cache, const CkptfsCodecInfo *codec)
{
    if (codec->decoder_new == NULL)
        return NULL;
    GPtrArray *idle = cache->decoders[codec->id];
    g_mutex_lock(&cache->lock);
    void *ctx = idle->len ? g_ptr_array_steal_index_fast(idle, idle->len - 1) : NULL;
    g_mutex_unlock(&cache->lock);
    return ctx ? ctx : codec->decoder_new();
}

void ckptfs_frame_cache_decoder_done(CkptfsFrameCache *cache, const CkptfsCodecInfo *codec, void *ctx)
{
    if (ctx == NULL)
        return;
    g_mutex_lock(&cache->lock);
    g_ptr_array_add(cache->decoders[codec->id], ctx);
    g_mutex_unlock(&cache->lock);
}

void ckptfs_frame_cache_free(CkptfsFrameCache *cache)
{
    if (cache == NULL)
        return;
    GHashTableIter it;
    gpointer value;
    g_hash_table_iter_init(&it, cache->frames);
    while (g_hash_table_iter_next(&it, NULL, &value))
        cached_frame_free(value);
    g_hash_table_unref(cache->frames);
    for (unsigned i = 0; i < cache->nspare; i++)
        g_free(cache->spare[i].data);
    for (unsigned id = 0; id < G_N_ELEMENTS(cache->decoders); id++) {
        const CkptfsCodecInfo *codec = ckptfs_codec(id);
        for (unsigned i = 0; i < cache->decoders[id]->len; i++)
            codec->decoder_free(g_ptr_array_index(cache->decoders[id], i));
        g_ptr_array_unref(cache->decoders[id]);
    }
    g_hash_table_unref(cache->pending);
    g_cond_clear(&cache->decoded);
    g_mutex_clear(&cache->lock);
    g_free(cache);
}

/* Under the lock: drops unheld frames, least recently used first, until the budget holds. */
static void trim(CkptfsFrameCache *cache)
{
    for (GList *l = cache->lru.tail; l != NULL && cache->bytes > cache->budget;) {
        GList *prev = l->prev;
        CachedFrame *f = l->data;
        if (f->holds == 0) {
            if (f->ahead)
                cache->ahead_bytes -= f->len;
            g_queue_unlink(&cache->lru, l);
            g_hash_table_remove(cache->frames, &f->key);
            cache->bytes -= f->len;
            recycle_locked(cache, f->data, f->cap);
            g_free(f);
        }
        l = prev;
    }
}

void ckptfs_frame_cache_set_budget(CkptfsFrameCache *cache, uint64_t budget)
{
    g_mutex_lock(&cache->lock);
    cache->budget = budget;
    trim(cache);
    g_mutex_unlock(&cache->lock);
}

static const uint8_t *hold(CkptfsFrameCache *cache, CachedFrame *f, gpointer *out)
{
    if (f->ahead) { /* its first reader */
        f->ahead = false;
        cache->ahead_bytes -= f->len;
    }
    f->holds++;
    g_queue_unlink(&cache->lru, &f->link);
    g_queue_push_head_link(&cache->lru, &f->link);
    *out = f;
    return f->data;
}

/* Under the lock: KEY (LEN bytes) is claimed for decoding, by the caller now (RUNNING) or by a
 * decoder thread later. */
static void claim_locked(CkptfsFrameCache *cache, uint64_t key, size_t len, bool running)
{
    PendingFrame *p = g_new(PendingFrame, 1);
    *p = (PendingFrame){key, len, running};
    g_hash_table_insert(cache->pending, &p->key, p);
    cache->pending_bytes += len;
}

/* Under the lock: KEY is no longer claimed; its waiters look again. */
static void unclaim_locked(CkptfsFrameCache *cache, uint64_t key)
{
    PendingFrame *p = g_hash_table_lookup(cache->pending, &key);
    if (p != NULL) {
        cache->pending_bytes -= p->len;
        g_hash_table_remove(cache->pending, &key);
        g_cond_broadcast(&cache->decoded);
    }
}

const uint8_t *ckptfs_frame_cache_get_or_claim(CkptfsFrameCache *cache, uint64_t key, size_t len, gpointer *out)
{
    g_mutex_lock(&cache->lock);
    const uint8_t *data = NULL;
    for (;;) {
        CachedFrame *f = g_hash_table_lookup(cache->frames, &key);
        if (f != NULL) {
            data = hold(cache, f, out);
            break;
        }
        PendingFrame *p = g_hash_table_lookup(cache->pending, &key);
        if (p == NULL) {
            claim_locked(cache, key, len, true);
            break;
        }
        if (!p->running) { /* still queued: decode it now rather than wait for a decoder thread */
            p->running = true;
            break;
        }
        g_cond_wait(&cache->decoded, &cache->lock);
    }
    g_mutex_unlock(&cache->lock);
    return data;
}

bool ckptfs_frame_cache_claim(CkptfsFrameCache *cache, uint64_t key, size_t len)
{
    g_mutex_lock(&cache->lock);
    /* Frames being decoded ahead and decoded ahead but not read yet take half the budget at most,
     * so they never push out each other or the frames being read. */
    bool claimed = !g_hash_table_contains(cache->frames, &key) && !g_hash_table_contains(cache->pending, &key) &&
                   cache->pending_bytes + cache->ahead_bytes + len <= cache->budget / 2;
    if (claimed)
        claim_locked(cache, key, len, false);
    g_mutex_unlock(&cache->lock);
    return claimed;
}

bool ckptfs_frame_cache_start(CkptfsFrameCache *cache, uint64_t key)
{
    g_mutex_lock(&cache->lock);
    PendingFrame *p = g_hash_table_lookup(cache->pending, &key);
    bool start = p != NULL && !p->running;
    if (start)
        p->running = true;
    g_mutex_unlock(&cache->lock);
    return start;
}

void ckptfs_frame_cache_abandon(CkptfsFrameCache *cache, uint64_t key)
{
    g_mutex_lock(&cache->lock);
    unclaim_locked(cache, key);
    g_mutex_unlock(&cache->lock);
}

const uint8_t *ckptfs_frame_cache_put(CkptfsFrameCache *cache, uint64_t key, uint8_t *data, size_t len,
                                      size_t cap, gpointer *out)
{
    g_mutex_lock(&cache->lock);
    unclaim_locked(cache, key);
    cache->puts++;
    CachedFrame *f = g_hash_table_lookup(cache->frames, &key);
    if (f != NULL) { /* decoded twice at once: keep the first */
        recycle_locked(cache, data, cap);
    } else {
        f = g_new0(CachedFrame, 1);
        *f = (CachedFrame){.key = key, .data = data, .len = len, .cap = cap, .ahead = out == NULL};
        if (f->ahead)
            cache->ahead_bytes += len;
        f->link.data = f;
        g_queue_push_head_link(&cache->lru, &f->link);
        g_hash_table_insert(cache->frames, &f->key, f);
        cache->bytes += len;
    }
    const uint8_t *held = NULL;
    if (out != NULL)
        held = hold(cache, f, out);
    trim(cache);
    g_mutex_unlock(&cache->lock);
    return held;
}

uint64_t ckptfs_frame_cache_decoded(CkptfsFrameCache *cache)
{
    g_mutex_lock(&cache->lock);
    uint64_t n = cache->puts;
    g_mutex_unlock(&cache->lock);
    return n;
}

void ckptfs_frame_cache_release(CkptfsFrameCache *cache, gpointer held)
{
    CachedFrame *f = held;
    g_mutex_lock(&cache->lock);
    f->holds--;
    trim(cache);
    g_mutex_unlock(&cache->lock);
}
