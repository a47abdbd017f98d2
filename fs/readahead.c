#include "readahead.h"

/* A store into the page cache of inode TARGET (libfuse 3.14 has it: Debian 12's). The kernel
 * marks the pages up to date where it got them whole. */
static bool store(gpointer se, uint64_t target, uint64_t offset, const void *data, size_t len)
{
    struct fuse_bufvec bufv = FUSE_BUFVEC_INIT(len);
    bufv.buf[0].mem = (void *)data;
    return fuse_lowlevel_notify_store(se, (fuse_ino_t)target, (off_t)offset, &bufv, 0) == 0;
}

CkptfsReadahead *ckptfs_fs_readahead_new(struct fuse_session *se, const CkptfsOptions *options)
{
    if (options->readahead == 0)
        return NULL;
    return ckptfs_readahead_new(MIN(options->readahead, CKPTFS_READAHEAD_WINDOW), options->readahead, 0, store, se);
}

void ckptfs_fs_readahead_free(CkptfsFuseContext *ctx)
{
    if (ctx->readahead == NULL)
        return;
    CkptfsReadaheadStats st;
    ckptfs_readahead_stats(ctx->readahead, &st);
    ckptfs_readahead_free(ctx->readahead);
    ctx->readahead = NULL;
    if (ctx->foreground && st.chunks_pushed + st.failed > 0)
        ckptfs_fuse_log(ctx,
                        "readahead: %" G_GUINT64_FORMAT " chunks pushed (%" G_GUINT64_FORMAT " bytes), %" G_GUINT64_FORMAT
                        " skipped, %" G_GUINT64_FORMAT " dropped, %" G_GUINT64_FORMAT " failed; at most %" G_GUINT64_FORMAT
                        " bytes ahead of readers (cap %" G_GUINT64_FORMAT ")",
                        st.chunks_pushed, st.bytes_pushed, st.skipped, st.dropped, st.failed, st.peak_held, st.cap);
}
