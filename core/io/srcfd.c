/* The descriptor cache of a source-file set: a source may have more files than the process may
 * hold open, so descriptors are kept least recently used first and closed past the cache's size.
 *
 * Descriptor pins. Invariants: a file's fd, pins and lru change only under the cache's lock; a
 * descriptor is closed only while its file has no pins, so a reader that acquired it may use it
 * outside the lock until it releases it; an open file is in the open list exactly while its fd
 * is >= 0. When every open descriptor is pinned the cache goes over its size for a while. Lock
 * order: the cache's lock is taken last (a file reopened under it is stat'ed and checked, which
 * takes no other lock). */
#include <unistd.h>

#include "srcfiles_internal.h"

struct SrcFdCache {
    GMutex lock;  /* fd, pins and lru of every file; open */
    GQueue open;  /* SrcFile* with an fd, most recently used first */
    unsigned max_open;
};

SrcFdCache *ckptfs_srcfd_new(unsigned max_open)
{
    SrcFdCache *cache = g_new0(SrcFdCache, 1);
    g_mutex_init(&cache->lock);
    g_queue_init(&cache->open);
    cache->max_open = max_open;
    return cache;
}

void ckptfs_srcfd_free(SrcFdCache *cache)
{
    if (cache == NULL)
        return;
    g_queue_clear(&cache->open);
    g_mutex_clear(&cache->lock);
    g_free(cache);
}

unsigned ckptfs_srcfd_max_open(const SrcFdCache *cache)
{
    return cache->max_open;
}

/* Under the lock: closes least recently used descriptors no read is using until KEEP are left
 * (or only ones in use). */
static void trim_locked(SrcFdCache *cache, unsigned keep)
{
    for (GList *l = cache->open.tail; l != NULL && cache->open.length > keep;) {
        GList *prev = l->prev;
        SrcFile *f = l->data;
        if (f->pins == 0) {
            close(f->fd);
            f->fd = -1;
            g_queue_delete_link(&cache->open, l);
            f->lru = NULL;
        }
        l = prev;
    }
}

void ckptfs_srcfd_trim(SrcFdCache *cache, unsigned keep)
{
    g_mutex_lock(&cache->lock);
    trim_locked(cache, keep);
    g_mutex_unlock(&cache->lock);
}

/* Under the lock: room for one more, then FD as F's, most recently used. */
static void insert_locked(SrcFdCache *cache, SrcFile *f, int fd)
{
    trim_locked(cache, cache->max_open - 1);
    f->fd = fd;
    g_queue_push_head(&cache->open, f);
    f->lru = cache->open.head;
}

void ckptfs_srcfd_insert(SrcFdCache *cache, SrcFile *f, int fd)
{
    g_mutex_lock(&cache->lock);
    insert_locked(cache, f, fd);
    g_mutex_unlock(&cache->lock);
}

int ckptfs_srcfd_acquire(SrcFdCache *cache, SrcFile *f, GError **error)
{
    if (g_atomic_int_get(&f->changed))
        return ckptfs_srcfile_report_changed(f, error), -1;
    g_mutex_lock(&cache->lock);
    if (f->fd >= 0) {
        f->pins++;
        g_queue_unlink(&cache->open, f->lru);
        g_queue_push_head_link(&cache->open, f->lru);
        int fd = f->fd;
        g_mutex_unlock(&cache->lock);
        return fd;
    }
    int fd = ckptfs_srcfile_reopen_checked(f, error);
    if (fd < 0) {
        g_mutex_unlock(&cache->lock);
        return -1;
    }
    insert_locked(cache, f, fd);
    f->pins++;
    g_mutex_unlock(&cache->lock);
    return fd;
}

void ckptfs_srcfd_release(SrcFdCache *cache, SrcFile *f)
{
    g_mutex_lock(&cache->lock);
    f->pins--;
    g_mutex_unlock(&cache->lock);
}

unsigned ckptfs_srcfd_open_count(SrcFdCache *cache)
{
    g_mutex_lock(&cache->lock);
    unsigned n = cache->open.length;
    g_mutex_unlock(&cache->lock);
    return n;
}
