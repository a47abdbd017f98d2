#include "readahead.h"

#include "ckptfs/readahead_policy.h"

/* A store into the page cache of inode TARGET (libfuse 3.14 has it: Debian 12's). The kernel
 * marks the pages up to date where it got them whole. */
static bool store(gpointer se, uint64_t target, uint64_t offset, const void *data, size_t len)
{
    struct fuse_bufvec bufv = FUSE_BUFVEC_INIT(len);
    bufv.buf[0].mem = (void *)data;
    return fuse_lowlevel_notify_store(se, (fuse_ino_t)target, (off_t)offset, &bufv, 0) == 0;
}

void ckptfs_fs_readahead_start(CkptfsFuseContext *ctx, struct fuse_session *se)
{
    CkptfsReadaheadPolicy policy;
    ckptfs_readahead_policy(&ctx->mount->options, ckptfs_readahead_machine_cores(), &policy);
    if (ctx->foreground) {
        g_autofree char *about = ckptfs_readahead_policy_describe(&policy);
        ckptfs_fuse_log(ctx, "readahead=%s", about);
    }
    if (policy.mode == CKPTFS_AHEAD_OFF)
        return;
    unsigned lone = policy.mode == CKPTFS_AHEAD_LONE ? policy.streams : 0;
    ctx->readahead = ckptfs_readahead_new(policy.window, policy.cap, 0, lone, store, se);
}

CkptfsReadaheadStream *ckptfs_fs_readahead_open(CkptfsFuseContext *ctx, fuse_ino_t ino, bool streamed,
                                                const CkptfsPlan *plan, const CkptfsSrcFiles *files,
                                                CkptfsSrcReader *reader, struct fuse_file_info *fi)
{
    if (ctx->readahead == NULL)
        return NULL;
    if (ckptfs_readahead_lone(ctx->readahead) == 0)
        return fi->direct_io ? NULL : ckptfs_readahead_open(ctx->readahead, plan, files, reader, ino);
    if (!streamed)
        return NULL;
    bool pushes = false;
    CkptfsReadaheadStream *s = ckptfs_readahead_open_lone(ctx->readahead, plan, files, reader, ino, &pushes);
    if (pushes)
        fi->direct_io = 0;
    return s;
}

void ckptfs_fs_readahead_free(CkptfsFuseContext *ctx)
{
    if (ctx->readahead == NULL)
        return;
    CkptfsReadaheadStats st;
    ckptfs_readahead_stats(ctx->readahead, &st);
    bool lone = ckptfs_readahead_lone(ctx->readahead) > 0;
    ckptfs_readahead_free(ctx->readahead);
    ctx->readahead = NULL;
    if (!ctx->foreground || st.chunks_pushed + st.failed + st.lone_pushed + st.lone_unpushed == 0)
        return;
    g_autofree char *opens = lone ? g_strdup_printf("; auto: %" G_GUINT64_FORMAT " opens pushed, %" G_GUINT64_FORMAT
                                                    " opens among others not, %" G_GUINT64_FORMAT
                                                    " reads of pushed files while others were open",
                                                    st.lone_pushed, st.lone_unpushed, st.crowded_reads)
                                  : g_strdup("");
    ckptfs_fuse_log(ctx,
                    "readahead: %" G_GUINT64_FORMAT " chunks pushed (%" G_GUINT64_FORMAT " bytes), %" G_GUINT64_FORMAT
                    " skipped, %" G_GUINT64_FORMAT " dropped, %" G_GUINT64_FORMAT " failed; at most %" G_GUINT64_FORMAT
                    " bytes ahead of readers (cap %" G_GUINT64_FORMAT ")%s",
                    st.chunks_pushed, st.bytes_pushed, st.skipped, st.dropped, st.failed, st.peak_held, st.cap, opens);
}
