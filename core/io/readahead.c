#include "ckptfs/readahead.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Reads this far behind the furthest one, or past the window's end, still continue the stream:
 * the kernel's read-ahead requests of one reader reach the worker threads out of order. */
#define SLACK CKPTFS_READAHEAD_CHUNK
#define MAX_THREADS 8u
/* How long an open that one close would leave alone waits for that close: the kernel sends a close
 * (RELEASE) without waiting for it, so a reader that closes a file and opens the next at once
 * (cp -r) may have its open served first. */
#define LONE_GRACE_US 10000

struct CkptfsReadahead {
    uint64_t window, cap, page;
    CkptfsReadaheadPush push;
    gpointer push_data;
    GMutex lock;
    GCond work; /* a chunk queued, or stopping */
    GCond idle; /* a chunk done: a closing stream waits for its own */
    GCond closed; /* a lone stream closed: an open waits for one for a moment */
    GQueue queue; /* of Chunk */
    GPtrArray *threads;
    uint64_t held; /* bytes of chunks ahead of their readers: queued, being built, or pushed */
    unsigned lone;      /* 0: every stream pushes; else lone streams push while at most LONE are open */
    unsigned lone_open; /* lone streams open now, pushed or not */
    bool stopping;
    CkptfsReadaheadStats stats;
};

struct CkptfsReadaheadStream {
    CkptfsReadahead *ra;
    const CkptfsPlan *plan;
    const CkptfsSrcFiles *files;
    CkptfsSrcReader *reader;
    uint64_t target, size;
    uint64_t next;     /* the end of the furthest read of this run of reads */
    uint64_t first;    /* [first, ahead): its chunks counted in held (queued, built, not yet read) */
    uint64_t ahead;    /* chunks before this are queued, built or passed */
    unsigned building; /* chunks of this stream being built now */
    bool stopped;      /* closed, or a chunk failed */
    bool lone;         /* counted in lone_open */
    bool pushes;       /* chunks are pushed for it (not a lone stream opened among others) */
};

typedef struct {
    CkptfsReadaheadStream *stream;
    uint64_t offset; /* chunk start */
} Chunk;

static uint64_t align_up(uint64_t v, uint64_t to)
{
    return v > UINT64_MAX - to ? UINT64_MAX / to * to : (v + to - 1) / to * to;
}

/* A worker's chunk buffer: one huge page where the kernel allows (2 MiB, aligned), like the reply
 * buffers, so that storing it pins one page instead of 512. */
static uint8_t *buffer_new(void)
{
    void *data = NULL;
    if (posix_memalign(&data, CKPTFS_READAHEAD_CHUNK, CKPTFS_READAHEAD_CHUNK) != 0)
        g_error("out of memory for a %u-byte read-ahead buffer", CKPTFS_READAHEAD_CHUNK); /* as g_malloc */
    madvise(data, CKPTFS_READAHEAD_CHUNK, MADV_HUGEPAGE);
    return data;
}

/* More lone streams open than may push: no chunk is queued or built for any (the lock held). */
static bool crowded(const CkptfsReadahead *ra)
{
    return ra->lone > 0 && ra->lone_open > ra->lone;
}

/* Builds chunk C of S (the lock not held) and pushes it; false when that failed. */
static bool build_and_push(CkptfsReadahead *ra, const Chunk *c, uint8_t *buf)
{
    CkptfsReadaheadStream *s = c->stream;
    /* The chunk's first page stays out: the reader's request for it says where it is. */
    uint64_t from = c->offset + ra->page, to = MIN(c->offset + CKPTFS_READAHEAD_CHUNK, s->size);
    if (from >= to)
        return true;
    CkptfsReadCtx read_ctx = {.files = s->files, .reader = s->reader};
    int64_t n = ckptfs_plan_read(s->plan, &read_ctx, buf, (size_t)(to - from), from, NULL);
    if (n != (int64_t)(to - from))
        return false;
    if (!ra->push(ra->push_data, s->target, from, buf, (size_t)n))
        return false;
    g_mutex_lock(&ra->lock);
    ra->stats.chunks_pushed++;
    ra->stats.bytes_pushed += (uint64_t)n;
    g_mutex_unlock(&ra->lock);
    return true;
}

/* Builds queued chunks with a buffer of its own (at most one chunk in memory per worker). */
static gpointer worker(gpointer data)
{
    CkptfsReadahead *ra = data;
    uint8_t *buf = NULL;
    g_mutex_lock(&ra->lock);
    for (;;) {
        while (!ra->stopping && g_queue_is_empty(&ra->queue))
            g_cond_wait(&ra->work, &ra->lock);
        if (ra->stopping)
            break;
        Chunk *c = g_queue_pop_head(&ra->queue);
        CkptfsReadaheadStream *s = c->stream;
        if (s->stopped || s->next > c->offset || crowded(ra)) {
            if (crowded(ra))
                ra->stats.dropped++;
            else
                ra->stats.skipped++;
            g_free(c);
            continue;
        }
        s->building++;
        ra->stats.building++;
        g_mutex_unlock(&ra->lock);
        if (buf == NULL)
            buf = buffer_new();
        bool ok = build_and_push(ra, c, buf);
        g_free(c);
        g_mutex_lock(&ra->lock);
        if (!ok) {
            s->stopped = true;
            ra->stats.failed++;
        }
        s->building--;
        ra->stats.building--;
        g_cond_broadcast(&ra->idle);
    }
    g_mutex_unlock(&ra->lock);
    free(buf);
    return NULL;
}

CkptfsReadahead *ckptfs_readahead_new(uint64_t window, uint64_t cap, unsigned threads, unsigned lone,
                                      CkptfsReadaheadPush push, gpointer push_data)
{
    CkptfsReadahead *ra = g_new0(CkptfsReadahead, 1);
    long page = sysconf(_SC_PAGESIZE);
    ra->page = page > 0 && (uint64_t)page < CKPTFS_READAHEAD_CHUNK ? (uint64_t)page : 4096;
    ra->window = MAX(window, CKPTFS_READAHEAD_CHUNK);
    ra->cap = MAX(cap / CKPTFS_READAHEAD_CHUNK, 1) * CKPTFS_READAHEAD_CHUNK;
    ra->stats.cap = ra->cap;
    ra->lone = lone;
    ra->push = push;
    ra->push_data = push_data;
    g_mutex_init(&ra->lock);
    g_cond_init(&ra->work);
    g_cond_init(&ra->idle);
    g_cond_init(&ra->closed);
    g_queue_init(&ra->queue);
    if (threads == 0)
        threads = MIN(MAX(g_get_num_processors(), 1u), MAX_THREADS);
    ra->threads = g_ptr_array_new();
    for (unsigned i = 0; i < threads; i++)
        g_ptr_array_add(ra->threads, g_thread_new("ckptfs-ahead", worker, ra));
    return ra;
}

/* Takes S's queued chunks out of the queue (all of them for NULL; the lock held). */
static void drop_queued(CkptfsReadahead *ra, CkptfsReadaheadStream *s)
{
    for (GList *l = ra->queue.head, *next; l != NULL; l = next) {
        next = l->next;
        Chunk *c = l->data;
        if (s != NULL && c->stream != s)
            continue;
        g_queue_delete_link(&ra->queue, l);
        g_free(c);
        ra->stats.dropped++;
    }
}

/* S's chunks up to UNTIL are no longer ahead of its reader (the lock held). */
static void release_until(CkptfsReadahead *ra, CkptfsReadaheadStream *s, uint64_t until)
{
    until = MIN(until, s->ahead);
    if (until > s->first) {
        ra->held -= until - s->first;
        s->first = until;
    }
}

void ckptfs_readahead_free(CkptfsReadahead *ra)
{
    if (ra == NULL)
        return;
    g_mutex_lock(&ra->lock);
    ra->stopping = true;
    drop_queued(ra, NULL);
    g_cond_broadcast(&ra->work);
    g_mutex_unlock(&ra->lock);
    for (guint i = 0; i < ra->threads->len; i++)
        g_thread_join(g_ptr_array_index(ra->threads, i));
    g_ptr_array_free(ra->threads, TRUE);
    g_mutex_clear(&ra->lock);
    g_cond_clear(&ra->work);
    g_cond_clear(&ra->idle);
    g_cond_clear(&ra->closed);
    g_free(ra);
}

CkptfsReadaheadStream *ckptfs_readahead_open(CkptfsReadahead *ra, const CkptfsPlan *plan, const CkptfsSrcFiles *files,
                                             CkptfsSrcReader *reader, uint64_t target)
{
    CkptfsReadaheadStream *s = g_new0(CkptfsReadaheadStream, 1);
    *s = (CkptfsReadaheadStream){.ra = ra, .plan = plan, .files = files, .reader = reader, .target = target,
                                 .size = ckptfs_plan_size(plan), .pushes = true};
    return s;
}

unsigned ckptfs_readahead_lone(const CkptfsReadahead *ra)
{
    return ra->lone;
}

CkptfsReadaheadStream *ckptfs_readahead_open_lone(CkptfsReadahead *ra, const CkptfsPlan *plan,
                                                  const CkptfsSrcFiles *files, CkptfsSrcReader *reader,
                                                  uint64_t target, bool *pushes)
{
    CkptfsReadaheadStream *s = ckptfs_readahead_open(ra, plan, files, reader, target);
    if (ra->lone == 0)
        return *pushes = true, s;
    g_mutex_lock(&ra->lock);
    gint64 until = g_get_monotonic_time() + LONE_GRACE_US;
    while (ra->lone_open == ra->lone && g_cond_wait_until(&ra->closed, &ra->lock, until))
        ;
    s->lone = true;
    s->pushes = ra->lone_open < ra->lone;
    ra->lone_open++;
    if (s->pushes)
        ra->stats.lone_pushed++;
    else
        ra->stats.lone_unpushed++;
    if (crowded(ra)) /* the others stop being pushed: their queued chunks go now */
        drop_queued(ra, NULL);
    g_mutex_unlock(&ra->lock);
    *pushes = s->pushes;
    return s;
}

void ckptfs_readahead_note(CkptfsReadaheadStream *s, uint64_t offset, uint64_t len)
{
    CkptfsReadahead *ra = s->ra;
    const uint64_t chunk = CKPTFS_READAHEAD_CHUNK;
    uint64_t end = offset + len;
    if (!s->pushes) /* fixed at open */
        return;
    g_mutex_lock(&ra->lock);
    if (s->stopped || ra->stopping) {
        g_mutex_unlock(&ra->lock);
        return;
    }
    bool continues = offset <= MAX(s->next, s->ahead) + SLACK && end + SLACK >= s->next;
    if (crowded(ra))
        ra->stats.crowded_reads++;
    if (!continues || crowded(ra)) {
        /* A seek, or other files open: what is queued for the old place is dropped, what was
         * pushed there is left to the cache; a read that continues this one (among few enough
         * open files) starts the window again. */
        drop_queued(ra, s);
        release_until(ra, s, s->ahead);
        s->next = end;
        s->first = s->ahead = align_up(end, chunk);
        g_mutex_unlock(&ra->lock);
        return;
    }
    s->next = MAX(s->next, end);
    release_until(ra, s, s->next / chunk * chunk);
    if (s->ahead < align_up(s->next, chunk))
        s->first = s->ahead = align_up(s->next, chunk);
    /* Whole chunks within the window (the last one of the file may end short). */
    uint64_t until = MIN(s->next + ra->window, align_up(s->size, chunk));
    bool queued = false;
    while (s->ahead + chunk <= until && ra->held + chunk <= ra->cap) {
        Chunk *c = g_new(Chunk, 1);
        *c = (Chunk){s, s->ahead};
        g_queue_push_tail(&ra->queue, c);
        ra->held += chunk;
        s->ahead += chunk;
        queued = true;
    }
    ra->stats.peak_held = MAX(ra->stats.peak_held, ra->held);
    if (queued)
        g_cond_broadcast(&ra->work);
    g_mutex_unlock(&ra->lock);
}

void ckptfs_readahead_close(CkptfsReadaheadStream *s)
{
    if (s == NULL)
        return;
    CkptfsReadahead *ra = s->ra;
    g_mutex_lock(&ra->lock);
    if (s->lone) { /* first: a reader that opens the next file at once (cp -r) finds this one gone */
        ra->lone_open--;
        g_cond_broadcast(&ra->closed);
    }
    s->stopped = true;
    drop_queued(ra, s);
    release_until(ra, s, s->ahead);
    while (s->building > 0)
        g_cond_wait(&ra->idle, &ra->lock);
    g_mutex_unlock(&ra->lock);
    g_free(s);
}

void ckptfs_readahead_stats(CkptfsReadahead *ra, CkptfsReadaheadStats *out)
{
    g_mutex_lock(&ra->lock);
    *out = ra->stats;
    out->queued = ra->queue.length;
    g_mutex_unlock(&ra->lock);
}
