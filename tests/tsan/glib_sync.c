/* ThreadSanitizer build only (CKPTFS_TSAN): GLib's mutexes and condition variables are futexes
 * on Linux, which ThreadSanitizer does not see, so every access they order would be reported
 * as a race. These definitions, linked into each program of that build, take the place of
 * GLib's entry points the project calls, call GLib's own, and tell ThreadSanitizer what they
 * order: a lock acquires the mutex, an unlock releases it, a wait does both; a task handed to a
 * queue or a thread pool is released by the pusher and acquired by whoever takes it, and a pool
 * freed with waiting acquires what its tasks did. */
#include <dlfcn.h>
#include <glib.h>
#include <stdio.h>
#include <stdlib.h>

void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);

/* GLib's definition of NAME (the next one after this program's). */
static void *real(const char *name)
{
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "tsan glib_sync: %s not found\n", name);
        abort();
    }
    return fn;
}

/* GLib's NAME (a function pointer of its declared type), looked up once. */
#define REAL(name)                                                                                \
    __extension__({                                                                               \
        static __typeof__(&name) fn_;                                                             \
        __typeof__(&name) f_ = __atomic_load_n(&fn_, __ATOMIC_ACQUIRE);                           \
        if (f_ == NULL) {                                                                         \
            f_ = (__typeof__(&name))real(#name);                                                  \
            __atomic_store_n(&fn_, f_, __ATOMIC_RELEASE);                                         \
        }                                                                                         \
        f_;                                                                                       \
    })

void g_mutex_lock(GMutex *mutex)
{
    REAL(g_mutex_lock)(mutex);
    __tsan_acquire(mutex);
}

gboolean g_mutex_trylock(GMutex *mutex)
{
    gboolean taken = REAL(g_mutex_trylock)(mutex);
    if (taken)
        __tsan_acquire(mutex);
    return taken;
}

void g_mutex_unlock(GMutex *mutex)
{
    __tsan_release(mutex);
    REAL(g_mutex_unlock)(mutex);
}

void g_cond_wait(GCond *cond, GMutex *mutex)
{
    __tsan_release(mutex);
    REAL(g_cond_wait)(cond, mutex);
    __tsan_acquire(mutex);
}

gboolean g_cond_wait_until(GCond *cond, GMutex *mutex, gint64 end_time)
{
    __tsan_release(mutex);
    gboolean signalled = REAL(g_cond_wait_until)(cond, mutex, end_time);
    __tsan_acquire(mutex);
    return signalled;
}

void g_async_queue_push(GAsyncQueue *queue, gpointer data)
{
    __tsan_release(data);
    REAL(g_async_queue_push)(queue, data);
}

gpointer g_async_queue_pop(GAsyncQueue *queue)
{
    gpointer data = REAL(g_async_queue_pop)(queue);
    __tsan_acquire(data);
    return data;
}

/* A pool's function and data, for the task trampoline: the pool's user_data, freed with it (when
 * freeing waits for its tasks). */
typedef struct {
    GFunc func;
    gpointer user_data;
} PoolTask;

static void pool_trampoline(gpointer data, gpointer user_data)
{
    PoolTask *task = user_data;
    __tsan_acquire(data);
    task->func(data, task->user_data);
    __tsan_release(task); /* for g_thread_pool_free, which waits for the tasks */
}

GThreadPool *g_thread_pool_new_full(GFunc func, gpointer user_data, GDestroyNotify item_free_func, gint max_threads,
                                    gboolean exclusive, GError **error)
{
    PoolTask *task = malloc(sizeof *task);
    task->func = func;
    task->user_data = user_data;
    return REAL(g_thread_pool_new_full)(
        pool_trampoline, task, item_free_func, max_threads, exclusive, error);
}

void g_thread_pool_free(GThreadPool *pool, gboolean immediate, gboolean wait_)
{
    /* The pool's last thread frees it, ordered by GLib after this read in a way the sanitizer
     * cannot see: the read is left out. */
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    PoolTask *task = pool->user_data;
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    REAL(g_thread_pool_free)(pool, immediate, wait_);
    if (wait_) { /* else tasks may still run, reading TASK */
        __tsan_acquire(task);
        free(task);
    }
}

gboolean g_thread_pool_push(GThreadPool *pool, gpointer data, GError **error)
{
    __tsan_release(data);
    return REAL(g_thread_pool_push)(pool, data, error);
}
