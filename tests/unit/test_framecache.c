/* The frame cache's protocol (core/io/framecache.c): claims (a reader's, or queued for a decoder
 * thread and taken over by its reader), start, put, abandon and holds; many readers of one frame
 * decode it once; a frame given up by its decoder is decoded by a waiting reader; held frames are
 * never dropped, even over the budget. */
#include <glib.h>
#include <string.h>

#include "ckptfs/container.h"
#include "tap.h"

/* The frame cache's claims: a frame queued for a decoder thread is taken over by its reader (no
 * waiting behind a queue that may never run); frames claimed or decoded ahead and not read yet
 * take half the budget at most. */
static void test_frame_claims(void)
{
    const size_t q = 256u << 10;
    CkptfsFrameCache *cache = ckptfs_frame_cache_new(4 * q);
    gpointer hold;
    bool claimed = ckptfs_frame_cache_claim(cache, 7, q);
    const uint8_t *got = ckptfs_frame_cache_get_or_claim(cache, 7, q, &hold);
    bool started = ckptfs_frame_cache_start(cache, 7);
    size_t cap;
    uint8_t *buf = ckptfs_frame_cache_buffer(cache, q, &cap);
    memset(buf, 0x5a, q);
    const uint8_t *put = ckptfs_frame_cache_put(cache, 7, buf, q, cap, &hold);
    tap_ok(claimed && got == NULL && !started && put != NULL && put[q - 1] == 0x5a,
           "a frame queued for a decoder thread: its reader takes it over at once, the thread then skips it");
    ckptfs_frame_cache_release(cache, hold);

    bool big = ckptfs_frame_cache_claim(cache, 8, 2 * q + 1);
    bool a = ckptfs_frame_cache_claim(cache, 9, q);
    started = ckptfs_frame_cache_start(cache, 9);
    buf = ckptfs_frame_cache_buffer(cache, q, &cap);
    ckptfs_frame_cache_put(cache, 9, buf, q, cap, NULL); /* decoded ahead, not read */
    bool b = ckptfs_frame_cache_claim(cache, 10, q);
    bool c = ckptfs_frame_cache_claim(cache, 11, q);
    tap_ok(!big && a && started && b && !c,
           "ahead: a frame over half the budget refused; one decoded ahead and one claimed fill the half");
    got = ckptfs_frame_cache_get_or_claim(cache, 9, q, &hold);
    ckptfs_frame_cache_release(cache, hold);
    c = ckptfs_frame_cache_claim(cache, 11, q);
    tap_ok(got != NULL && c, "once the frame decoded ahead is read, another can be claimed");
    ckptfs_frame_cache_abandon(cache, 10);
    ckptfs_frame_cache_abandon(cache, 11);
    got = ckptfs_frame_cache_get_or_claim(cache, 10, q, &hold);
    tap_ok(got == NULL, "an abandoned frame is claimed by the next reader, not waited for");
    ckptfs_frame_cache_abandon(cache, 10);
    ckptfs_frame_cache_free(cache);
}

/* Readers of one frame at once: the first claims it, the others wait for it. */
typedef struct {
    CkptfsFrameCache *cache;
    uint64_t key;
    size_t len;
    bool abandon_first; /* the first claimant gives up: a waiter must decode it */
    gint *claims;       /* readers that got the claim */
    gint *go;
    bool ok;
} FrameReader;

static gpointer frame_reader(gpointer data)
{
    FrameReader *r = data;
    while (!g_atomic_int_get(r->go))
        ;
    gpointer hold;
    const uint8_t *got = ckptfs_frame_cache_get_or_claim(r->cache, r->key, r->len, &hold);
    if (got == NULL) { /* ours to decode */
        int n = g_atomic_int_add(r->claims, 1);
        g_usleep(20000); /* the others queue up behind the claim meanwhile */
        if (n == 0 && r->abandon_first) {
            ckptfs_frame_cache_abandon(r->cache, r->key);
            r->ok = true;
            return NULL;
        }
        size_t cap;
        uint8_t *buf = ckptfs_frame_cache_buffer(r->cache, r->len, &cap);
        memset(buf, 0x3c, r->len);
        got = ckptfs_frame_cache_put(r->cache, r->key, buf, r->len, cap, &hold);
    }
    r->ok = got != NULL && got[0] == 0x3c && got[r->len - 1] == 0x3c;
    ckptfs_frame_cache_release(r->cache, hold);
    return NULL;
}

/* THREADS readers of KEY at once; returns how many got the claim, *ALL_OK whether every reader
 * saw the frame (but an abandoning first claimant). */
static int read_at_once(CkptfsFrameCache *cache, uint64_t key, bool abandon_first, bool *all_ok)
{
    enum { THREADS = 8 };
    gint claims = 0, go = 0;
    FrameReader r[THREADS];
    GThread *t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i] = (FrameReader){cache, key, 4096, abandon_first, &claims, &go, false};
        t[i] = g_thread_new("frame-reader", frame_reader, &r[i]);
    }
    g_atomic_int_set(&go, 1);
    *all_ok = true;
    for (int i = 0; i < THREADS; i++) {
        g_thread_join(t[i]);
        *all_ok &= r[i].ok;
    }
    return g_atomic_int_get(&claims);
}

static void test_one_decode(void)
{
    CkptfsFrameCache *cache = ckptfs_frame_cache_new(1u << 20);
    bool all_ok;
    int claims = read_at_once(cache, 1, false, &all_ok);
    tap_ok(claims == 1 && all_ok && ckptfs_frame_cache_decoded(cache) == 1,
           "8 readers of one frame at once: one decodes it, every one reads it (%d claims, %" G_GUINT64_FORMAT
           " decoded)", claims, ckptfs_frame_cache_decoded(cache));
    claims = read_at_once(cache, 2, true, &all_ok);
    tap_ok(claims == 2 && all_ok && ckptfs_frame_cache_decoded(cache) == 2,
           "its first claimant abandons it: one waiting reader decodes it, the others read that (%d claims)", claims);
    ckptfs_frame_cache_free(cache);
}

static void test_holds(void)
{
    const size_t q = 64u << 10;
    CkptfsFrameCache *cache = ckptfs_frame_cache_new(2 * q);
    gpointer held, hold;
    size_t cap;
    uint8_t *buf = ckptfs_frame_cache_buffer(cache, q, &cap);
    memset(buf, 1, q);
    ckptfs_frame_cache_get_or_claim(cache, 1, q, &hold);
    const uint8_t *first = ckptfs_frame_cache_put(cache, 1, buf, q, cap, &held);
    for (uint64_t key = 2; key < 6; key++) { /* four more frames through a cache of two */
        ckptfs_frame_cache_get_or_claim(cache, key, q, &hold);
        buf = ckptfs_frame_cache_buffer(cache, q, &cap);
        memset(buf, (int)key, q);
        ckptfs_frame_cache_put(cache, key, buf, q, cap, &hold);
        ckptfs_frame_cache_release(cache, hold);
    }
    const uint8_t *again = ckptfs_frame_cache_get_or_claim(cache, 1, q, &hold);
    tap_ok(again == first && again[q - 1] == 1, "a held frame stays cached while others pass through a full cache");
    ckptfs_frame_cache_release(cache, hold);
    ckptfs_frame_cache_release(cache, held);
    const uint8_t *gone = ckptfs_frame_cache_get_or_claim(cache, 2, q, &hold);
    tap_ok(gone == NULL, "an unheld frame past the budget is dropped (claimed again by its next reader)");
    ckptfs_frame_cache_abandon(cache, 2);
    ckptfs_frame_cache_free(cache);
}

int main(void)
{
    test_frame_claims();
    test_one_decode();
    test_holds();
    return tap_done();
}
