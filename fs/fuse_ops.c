#include "fuse_ops.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <syslog.h>

#include "ckptfs/error.h"
#include "passthrough.h"
#include "readahead.h"
#include "transport.h"

/* The tree never changes while mounted: let the kernel cache names and attributes for long. */
#define CACHE_TIMEOUT 86400.0
#define READ_AHEAD (1u << 20)
#define SCATTERED_BLKSIZE (16u << 10)

void ckptfs_fuse_log(const CkptfsFuseContext *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    if (ctx->foreground)
        fprintf(stderr, "ckptfs: %s\n", msg);
    else
        syslog(LOG_ERR, "%s", msg);
}

static CkptfsFuseContext *ctx_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

static void to_stat(const CkptfsFuseContext *ctx, const CkptfsAttr *attr, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = attr->ino;
    st->st_nlink = attr->nlink;
    st->st_uid = attr->access.uid;
    st->st_gid = attr->access.gid;
    st->st_size = (off_t)attr->size;
    /* stdio and Python size their buffers from st_blksize: large for copies, small for files
     * whose readers jump between small archives (a loader's few chunks of a .distcp). */
    st->st_blksize = (attr->hints & CKPTFS_HINT_SCATTERED) ? SCATTERED_BLKSIZE : READ_AHEAD;
    st->st_blocks = (blkcnt_t)((attr->size + 511) / 512);
    st->st_atim = st->st_mtim = st->st_ctim = ctx->mtime;
    switch (attr->type) {
    case CKPTFS_NODE_DIR:
        st->st_mode = S_IFDIR | attr->access.mode;
        break;
    case CKPTFS_NODE_FILE:
        st->st_mode = S_IFREG | attr->access.mode;
        break;
    case CKPTFS_NODE_SYMLINK:
        st->st_mode = S_IFLNK | 0777;
        break;
    }
}

/* Replies with -RC, logging the reason when there is one worth reading. */
static void reply_failure(fuse_req_t req, int rc, GError *error)
{
    if (error != NULL) {
        ckptfs_fuse_log(ctx_of(req), "%s", error->message);
        g_error_free(error);
    }
    fuse_reply_err(req, -rc);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    CkptfsFuseContext *ctx = userdata;
    if (conn->max_readahead > READ_AHEAD)
        conn->max_readahead = READ_AHEAD;
    /* Nothing changes behind the kernel's back: no need to revalidate cached data. */
#if CKPTFS_LIBFUSE_3_17
    fuse_unset_feature_flag(conn, FUSE_CAP_AUTO_INVAL_DATA); /* 3.17 refuses want and want_ext mixed */
    /* Shared mappings of direct-I/O files, through the page cache (Linux 6.6+): not what their
     * loaders do, but nothing a user tries should fail for it. */
    if (ctx->mount->options.direct_io && !fuse_set_feature_flag(conn, FUSE_CAP_DIRECT_IO_ALLOW_MMAP))
        ckptfs_fuse_log(ctx, "direct_io: the kernel does not allow shared mappings of direct-I/O files "
                             "(Linux 6.6 or later does); mapping a rank file shared fails with ENODEV");
#else
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
#endif
    ckptfs_transport_init(ctx->transport, ctx, conn);
    const char *why = NULL;
    if (ctx->passthrough != NULL && !ckptfs_passthrough_init(ctx->passthrough, conn, &why) && why != NULL)
        ckptfs_fuse_log(ctx, "passthrough: %s; files are read through the daemon", why);
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    CkptfsFuseContext *ctx = ctx_of(req);
    CkptfsAttr attr;
    GError *error = NULL;
    int rc = ckptfs_tree_lookup(ctx->mount->tree, parent, name, &attr, &error);
    if (rc != 0) {
        reply_failure(req, rc, error);
        return;
    }
    struct fuse_entry_param e = {.ino = attr.ino, .attr_timeout = CACHE_TIMEOUT,
                                 .entry_timeout = CACHE_TIMEOUT};
    to_stat(ctx, &attr, &e.attr);
    fuse_reply_entry(req, &e);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    (void)fi;
    CkptfsFuseContext *ctx = ctx_of(req);
    CkptfsAttr attr;
    GError *error = NULL;
    int rc = ckptfs_tree_getattr(ctx->mount->tree, ino, &attr, &error);
    if (rc != 0) {
        reply_failure(req, rc, error);
        return;
    }
    struct stat st;
    to_stat(ctx, &attr, &st);
    fuse_reply_attr(req, &st, CACHE_TIMEOUT);
}

typedef struct {
    fuse_req_t req;
    CkptfsFuseContext *ctx;
    bool plus;
    char *buf;
    size_t size, used;
} DirFill;

static bool dir_add(DirFill *d, const char *name, const CkptfsAttr *attr, uint64_t next)
{
    struct stat st;
    to_stat(d->ctx, attr, &st);
    size_t room = d->size - d->used, need;
    if (d->plus) {
        struct fuse_entry_param e = {.ino = attr->ino, .attr = st,
                                     .attr_timeout = CACHE_TIMEOUT, .entry_timeout = CACHE_TIMEOUT};
        need = fuse_add_direntry_plus(d->req, d->buf + d->used, room, name, &e, (off_t)next);
    } else {
        need = fuse_add_direntry(d->req, d->buf + d->used, room, name, &st, (off_t)next);
    }
    if (need > room)
        return false;
    d->used += need;
    return true;
}

/* Offsets: 0 = ".", 1 = "..", 2 + i = child i. */
static bool dir_add_child(gpointer data, const char *name, const CkptfsAttr *attr, uint64_t next)
{
    DirFill *d = data;
    CkptfsAttr full = *attr;
    if (d->plus) {
        /* readdirplus hands out entries: they need their real attributes (and sizes). */
        if (ckptfs_tree_getattr(d->ctx->mount->tree, attr->ino, &full, NULL) != 0)
            full = *attr;
    }
    return dir_add(d, name, &full, next + 2);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
    CkptfsFuseContext *ctx = ctx_of(req);
    DirFill d = {.req = req, .ctx = ctx, .plus = plus, .buf = g_malloc(size), .size = size};
    GError *error = NULL;
    int rc = 0;
    CkptfsAttr self;
    rc = ckptfs_tree_getattr(ctx->mount->tree, ino, &self, &error);
    if (rc == 0 && off == 0 && !dir_add(&d, ".", &self, 1))
        goto reply;
    /* ".." gets this directory's attributes: the kernel fills in the real parent itself. */
    if (rc == 0 && off <= 1 && !dir_add(&d, "..", &self, 2))
        goto reply;
    if (rc == 0)
        rc = ckptfs_tree_readdir(ctx->mount->tree, ino, off >= 2 ? (uint64_t)off - 2 : 0,
                                 dir_add_child, &d, &error);
reply:
    if (rc != 0)
        reply_failure(req, rc, error);
    else
        fuse_reply_buf(req, d.buf, d.used);
    g_free(d.buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)fi;
    do_readdir(req, ino, size, off, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi)
{
    (void)fi;
    do_readdir(req, ino, size, off, true);
}

/* Sequential reads reach the daemon in read-ahead sized requests: 128 KiB by default, which
 * costs a round trip per 128 KiB. FUSE's INIT can only lower the read-ahead, so raise it to
 * 1 MiB through sysfs once INIT is done (needs root; best effort). */
static void raise_read_ahead(CkptfsFuseContext *ctx)
{
    if (ctx->read_ahead_knob == NULL || !g_atomic_int_compare_and_exchange(&ctx->read_ahead_raised, 0, 1))
        return;
    g_autofree char *current = NULL;
    if (!g_file_get_contents(ctx->read_ahead_knob, &current, NULL, NULL) ||
        atoi(current) >= (int)(READ_AHEAD >> 10))
        return;
    FILE *f = fopen(ctx->read_ahead_knob, "w"); /* sysfs: written in place */
    if (f != NULL) {
        fprintf(f, "%u", READ_AHEAD >> 10);
        fclose(f);
    }
}

typedef struct {
    uint64_t ino;
    const CkptfsPlan *plan; /* held from the tree until the file is freed */
    const CkptfsSrcFiles *files;
    CkptfsSrcReader *reader; /* this open file's own source descriptors (-o source_fds=reader), or NULL */
    uint64_t window;     /* bytes to prefetch ahead of a sequential reader (0: none) */
    uint64_t next;       /* where the last read ended (atomic: reads run in parallel) */
    uint64_t prefetched; /* the end of what was prefetched */
    bool mode_counted;   /* counted by ckptfs_passthrough_open: released there too */
    CkptfsReadaheadStream *ahead; /* -o readahead (fs/readahead.h), else NULL */
} OpenFile;

/* Whether file INO is one its loaders stream with read(2), such as a rank file: read with direct
 * I/O (-o direct_io, on by default), the reply lands in the reader's buffer instead of new
 * page-cache pages that are copied again, and the bytes are not cached twice (source and mount).
 * Files loaders map shared (safetensors) are not hinted: the kernel refuses a shared mapping of a
 * direct-I/O file unless libfuse 3.17 asks it (Linux 6.6+) to allow one. */
static bool is_streamed(CkptfsFuseContext *ctx, fuse_ino_t ino)
{
    CkptfsAttr attr;
    return ckptfs_tree_getattr(ctx->mount->tree, ino, &attr, NULL) == 0 && (attr.hints & CKPTFS_HINT_STREAMED);
}

/* What an open file holds, once it is released (its passthrough count given back by the caller)
 * or left open when the session ended. */
static void open_file_free(CkptfsFuseContext *ctx, OpenFile *open_file)
{
    g_mutex_lock(&ctx->open_lock);
    g_hash_table_remove(ctx->open_files, open_file);
    g_mutex_unlock(&ctx->open_lock);
    ckptfs_readahead_close(open_file->ahead); /* before the reader its chunks read through */
    ckptfs_src_reader_free(open_file->reader);
    ckptfs_tree_plan_release(ctx->mount->tree, open_file->ino); /* after everything that reads it */
    g_free(open_file);
}

void ckptfs_fuse_open_files_init(CkptfsFuseContext *ctx)
{
    g_mutex_init(&ctx->open_lock);
    ctx->open_files = g_hash_table_new(g_direct_hash, g_direct_equal);
}

void ckptfs_fuse_open_files_free(CkptfsFuseContext *ctx)
{
    g_autoptr(GList) left = g_hash_table_get_keys(ctx->open_files);
    for (GList *l = left; l != NULL; l = l->next)
        open_file_free(ctx, l->data);
    g_hash_table_unref(ctx->open_files);
    g_mutex_clear(&ctx->open_lock);
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    CkptfsFuseContext *ctx = ctx_of(req);
    raise_read_ahead(ctx);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
        fuse_reply_err(req, EROFS);
        return;
    }
    const CkptfsPlan *plan = NULL;
    gpointer scope = NULL;
    GError *error = NULL;
    int rc = ckptfs_tree_plan(ctx->mount->tree, ino, &plan, &scope, &error);
    const CkptfsMount *owner = ckptfs_mount_of_scope(ctx->mount, scope);
    if (rc == 0 && !ckptfs_mount_check_sources(owner, plan, &error)) {
        ckptfs_tree_plan_release(ctx->mount->tree, ino);
        rc = -EIO;
    }
    if (rc != 0) {
        reply_failure(req, rc, error);
        return;
    }
    /* What reads need, fixed for the life of the mount: the plan and the files it reads. */
    OpenFile *open_file = g_new(OpenFile, 1);
    const CkptfsSrcFiles *files = owner->source->files;
    if (ctx->leases != NULL) /* a verl run's roles each have their set */
        ckptfs_lease_watch_add(ctx->leases, owner->source->files);
    *open_file = (OpenFile){ino, plan, files, ctx->mount->options.fd_per_reader ? ckptfs_src_reader_new(files) : NULL,
                            ckptfs_srcfiles_prefetch_window(files, ctx->mount->options.prefetch), 0, 0, false,
                            NULL};
    fi->fh = (uint64_t)(uintptr_t)open_file;
    g_mutex_lock(&ctx->open_lock);
    g_hash_table_add(ctx->open_files, open_file);
    g_mutex_unlock(&ctx->open_lock);
    fi->keep_cache = 1;
    char *refusal = NULL;
    open_file->mode_counted = ckptfs_passthrough_open(ctx->passthrough, req, ino, plan, files, fi, &refusal);
    /* keep_cache stays: a direct-I/O file is cached only where mapped (torch.load(mmap=True)),
     * and those pages stay valid for another reader's mapping: files never change under a mount. */
    bool streamed = !open_file->mode_counted && is_streamed(ctx, ino);
    fi->direct_io = streamed && ctx->mount->options.direct_io;
    if (!open_file->mode_counted)
        open_file->ahead = ckptfs_fs_readahead_open(ctx, ino, streamed, plan, files, open_file->reader, fi);
    if (refusal != NULL) {
        ckptfs_fuse_log(ctx, "%s", refusal);
        g_free(refusal);
    }
    /* -ENOENT: the open was interrupted and is cancelled, no release will come (as libfuse's
     * high-level layer does). The reply freed REQ. */
    if (fuse_reply_open(req, fi) == -ENOENT) {
        if (open_file->mode_counted)
            ckptfs_passthrough_release(ctx->passthrough, NULL, ino);
        open_file_free(ctx, open_file);
    }
}

typedef struct {
    size_t size;
    uint8_t *data;
} ReadBuffer;

#define HUGE_PAGE (2u << 20)

void ckptfs_read_buffer_free(gpointer buffer)
{
    ReadBuffer *rb = buffer;
    free(rb->data);
    g_free(rb);
}

/* A reply buffer per worker thread: reads are up to 1 MiB, and a fresh allocation of that size
 * per request would be an mmap/munmap pair with page faults every time. It is one transparent huge
 * page where the kernel allows (2 MiB, aligned): writing the reply to /dev/fuse pins the buffer's
 * pages, one huge page instead of 256 small ones. Measured on 2 vCPUs, cached source, one reader:
 * pinning went from 6.9% to 2% of the machine's CPU time, and hf/ read at 3.1 GB/s instead of 2.8
 * with 11% less CPU per GB (medians of 6); tp4pp1/ unchanged. */
static uint8_t *thread_read_buffer(CkptfsFuseContext *ctx, size_t size)
{
    ReadBuffer *rb = pthread_getspecific(ctx->read_buffer);
    if (rb == NULL || rb->size < size) {
        size_t len = (size + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
        void *data = NULL;
        if (posix_memalign(&data, HUGE_PAGE, len) != 0)
            g_error("out of memory for a %zu-byte reply buffer", len); /* as g_malloc does */
        madvise(data, len, MADV_HUGEPAGE); /* a hint: small pages where huge ones are off */
        if (rb != NULL)
            ckptfs_read_buffer_free(rb);
        rb = g_new(ReadBuffer, 1);
        *rb = (ReadBuffer){len, data};
        pthread_setspecific(ctx->read_buffer, rb);
    }
    return rb->data;
}

/* At most this much of a file advised per read: the advice goes out before the read's reply, and
 * a large window (up to 64G) is reached over several reads instead. */
#define PREFETCH_STEP (16u << 20)

/* A reader going through a file in order (the kernel's read-ahead requests, cp, torch.load of a
 * rank file): the source ranges of the next WINDOW bytes are asked for now, so a cold disk has
 * work queued while the daemon copies. Sent again when half of it (at most PREFETCH_STEP) is
 * consumed. A synthesized file gathers many source ranges, which the kernel's own read-ahead of
 * each source file does not see coming. */
static void prefetch_ahead(OpenFile *f, uint64_t off, size_t size)
{
    if (f->window == 0)
        return;
    uint64_t end = off + size;
    uint64_t last = __atomic_exchange_n(&f->next, end, __ATOMIC_RELAXED);
    bool sequential = off <= last + f->window / 4 && end > last;
    uint64_t done = __atomic_load_n(&f->prefetched, __ATOMIC_RELAXED);
    if (!sequential || done >= end + f->window - MIN(f->window / 2, PREFETCH_STEP))
        return;
    uint64_t from = MAX(done, end), to = MIN(end + f->window, from + PREFETCH_STEP);
    if (__atomic_compare_exchange_n(&f->prefetched, &done, to, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ckptfs_plan_prefetch(f->plan, f->files, from, to - from);
}

/* Source pieces stay in their leased mappings where they can (-o mapped_reads, srcfiles.h) and
 * go out with the buffer's bytes in one writev, pinned until it is written. */
static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    (void)ino;
    CkptfsFuseContext *ctx = ctx_of(req);
    const OpenFile *open_file = (const OpenFile *)(uintptr_t)fi->fh;
    const CkptfsSrcFiles *files = open_file->files; /* once replied, OPEN_FILE may be freed */
    uint8_t *ring = ckptfs_transport_reply_buffer(ctx->transport, ctx, req, size);
    uint8_t *buf = ring ? ring : thread_read_buffer(ctx, size ? size : 1);
    CkptfsReplyRefs refs;
    struct iovec iov[CKPTFS_REPLY_IOV_MAX];
    GError *error = NULL;
    CkptfsReadCtx read_ctx = {.files = files, .reader = open_file->reader, .refs = &refs};
    int64_t n = ckptfs_plan_read(open_file->plan, &read_ctx, buf, size, (uint64_t)off, &error);
    if (n > 0) {
        prefetch_ahead((OpenFile *)open_file, (uint64_t)off, (size_t)n);
        if (open_file->ahead != NULL)
            ckptfs_readahead_note(open_file->ahead, (uint64_t)off, (uint64_t)n);
    }
    if (n < 0)
        reply_failure(req, -EIO, error);
    else if (ring != NULL) /* the mapped pieces copied into their places: the reply is the ring's buffer */
        fuse_reply_buf(req, (const char *)buf, ckptfs_reply_refs_gather(&refs, buf, (size_t)n));
    else
        fuse_reply_iov(req, iov, ckptfs_reply_refs_iov(&refs, buf, (size_t)n, iov, G_N_ELEMENTS(iov)));
    ckptfs_reply_refs_release(files, &refs);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    OpenFile *open_file = (OpenFile *)(uintptr_t)fi->fh;
    if (open_file->mode_counted)
        ckptfs_passthrough_release(ctx_of(req)->passthrough, req, ino);
    open_file_free(ctx_of(req), open_file);
    fuse_reply_err(req, 0);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
    const char *target;
    int rc = ckptfs_tree_readlink(ctx_of(req)->mount->tree, ino, &target);
    if (rc != 0)
        fuse_reply_err(req, -rc);
    else
        fuse_reply_readlink(req, target);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    (void)ino;
    struct statvfs st = {.f_bsize = 4096, .f_frsize = 4096, .f_namemax = 255};
    fuse_reply_statfs(req, &st);
}

/* Operations that would change something are left out: the mount is read-only ("ro"), so the
 * kernel answers EROFS before a request reaches us (tests/integration/hf_view.t checks each). */
const struct fuse_lowlevel_ops ckptfs_fuse_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .getattr = op_getattr,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .open = op_open,
    .read = op_read,
    .release = op_release,
    .readlink = op_readlink,
    .statfs = op_statfs,
};

int ckptfs_take_auto_switch(const char *item, const char *key, int *value)
{
    size_t len = strlen(key);
    if (strncmp(item, key, len) != 0 || item[len] != '=')
        return 0;
    static const char *const names[] = {[CKPTFS_SWITCH_AUTO] = "auto", [CKPTFS_SWITCH_ON] = "on",
                                        [CKPTFS_SWITCH_OFF] = "off"};
    for (int i = 0; i < (int)G_N_ELEMENTS(names); i++) {
        if (strcmp(item + len + 1, names[i]) == 0) {
            *value = i;
            return 1;
        }
    }
    fprintf(stderr, "ckptfs: option %s: expected %s=auto, on or off\n", item, key);
    return -1;
}
