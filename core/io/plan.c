#include "ckptfs/plan.h"

#include <string.h>
#include <sys/uio.h>
#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "ckptfs/error.h"

/* The last band of stored columns of a transposed MXFP4 extent decoded, as rows, for reads that
 * copy their source (a mapped one decodes where the codes lie and keeps nothing): the reads after
 * it (a reader going through the file) find them ready. A band fetches every stored row of its
 * expert once for many output rows; without it each read fetched them all again for its own few
 * (0.07 GB/s for GPT-OSS-120B's [2880, 5760]). Kept with the plan, and the one before it for its
 * buffer (16 MiB at most): fresh pages for every band cost a third of the time. */
typedef struct {
    GMutex lock;
    const CkptfsExtent *extent;
    uint64_t ja, jb;  /* its output rows */
    uint16_t *rows;   /* (jb - ja) x the extent's width */
    uint16_t *spare;  /* the band before, its buffer reused by the next (fresh pages cost a third of
                         the decoding time) */
    size_t spare_len; /* elements */
    size_t rows_len;
    /* the band a read is decoding, which the reads that need it wait for rather than decode it
     * too (a reader's read-ahead comes as several reads at once: each decoded the same band,
     * 0.08 GB/s for `cat`); NULL: none */
    const CkptfsExtent *coming;
    uint64_t coming_ja, coming_jb;
    GCond done; /* it is in */
} Mxfp4Band;

struct CkptfsPlan {
    uint64_t size;
    size_t n_extents;
    CkptfsExtent *extents;
    uint8_t *literals;       /* all literal bytes, one allocation */
    CkptfsGatherItem *items; /* all gather items, one allocation */
    CkptfsBlockScale *scales; /* of the block-scaled CONVERT extents */
    uint64_t *cols;           /* their items' first columns */
    CkptfsStridedItem *strided; /* all TRANSPOSE items, one allocation */
    CkptfsMxfp4 *mxfp4;         /* of the MXFP4 extents */
    Mxfp4Band *band;            /* with a transposed one */
    /* CRC-32 cache, one slot per CRC extent: the value, then a flag set once it is valid.
     * Two threads may compute the same slot at once; both store the same value. */
    uint32_t *crc_values;
    gint *crc_ready;
    uint32_t n_crcs;
};

/* While building, literal and item references are offsets into growing arrays; pointers are
 * fixed once at the end. */
typedef struct {
    uint64_t offset, size;
    CkptfsExtentKind kind;
    uint64_t first; /* literal byte offset, or first gather item */
    uint64_t nrep, rep_size;
    uint32_t nitems;
    CkptfsConvert convert;
    int64_t scale; /* index in scales, or -1 */
    uint64_t crc_offset, crc_len;
    uint32_t elsize; /* TRANSPOSE: stored element size (FIRST indexes strided items) */
} BuildExtent;

struct CkptfsPlanBuilder {
    GArray *extents;   /* BuildExtent */
    GByteArray *literals;
    GArray *items;     /* CkptfsGatherItem */
    GArray *scales;    /* CkptfsBlockScale, col0 an index into cols until finished */
    GArray *cols;      /* uint64_t */
    GArray *strided;   /* CkptfsStridedItem */
    GArray *mxfp4;     /* CkptfsMxfp4 */
    uint64_t size;
    uint32_t n_crcs;
};

CkptfsPlanBuilder *ckptfs_plan_builder_new(void)
{
    CkptfsPlanBuilder *b = g_new0(CkptfsPlanBuilder, 1);
    b->extents = g_array_new(FALSE, FALSE, sizeof(BuildExtent));
    b->literals = g_byte_array_new();
    b->items = g_array_new(FALSE, FALSE, sizeof(CkptfsGatherItem));
    b->scales = g_array_new(FALSE, FALSE, sizeof(CkptfsBlockScale));
    b->cols = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    b->strided = g_array_new(FALSE, FALSE, sizeof(CkptfsStridedItem));
    b->mxfp4 = g_array_new(FALSE, FALSE, sizeof(CkptfsMxfp4));
    return b;
}

void ckptfs_plan_builder_free(CkptfsPlanBuilder *b)
{
    if (b == NULL)
        return;
    g_array_unref(b->extents);
    g_byte_array_unref(b->literals);
    g_array_unref(b->items);
    g_array_unref(b->scales);
    g_array_unref(b->cols);
    g_array_unref(b->strided);
    g_array_unref(b->mxfp4);
    g_free(b);
}

uint64_t ckptfs_plan_builder_size(const CkptfsPlanBuilder *b)
{
    return b->size;
}

static BuildExtent *last_extent(CkptfsPlanBuilder *b)
{
    return b->extents->len ? &g_array_index(b->extents, BuildExtent, b->extents->len - 1) : NULL;
}

static void push_extent(CkptfsPlanBuilder *b, BuildExtent e)
{
    if (e.kind != CKPTFS_EXTENT_CONVERT)
        e.scale = -1;
    e.offset = b->size;
    g_array_append_val(b->extents, e);
    b->size += e.size;
}

void ckptfs_plan_add_literal(CkptfsPlanBuilder *b, const void *data, size_t len)
{
    if (len == 0)
        return;
    BuildExtent *last = last_extent(b);
    if (last && last->kind == CKPTFS_EXTENT_LITERAL && last->first + last->size == b->literals->len) {
        g_byte_array_append(b->literals, data, (guint)len);
        last->size += len;
        b->size += len;
        return;
    }
    BuildExtent e = {.kind = CKPTFS_EXTENT_LITERAL, .size = len, .first = b->literals->len};
    g_byte_array_append(b->literals, data, (guint)len);
    push_extent(b, e);
}

void ckptfs_plan_add_zero(CkptfsPlanBuilder *b, uint64_t len)
{
    if (len == 0)
        return;
    BuildExtent *last = last_extent(b);
    if (last && last->kind == CKPTFS_EXTENT_ZERO) {
        last->size += len;
        b->size += len;
        return;
    }
    push_extent(b, (BuildExtent){.kind = CKPTFS_EXTENT_ZERO, .size = len});
}

static bool is_plain_run(const CkptfsPlanBuilder *b, const BuildExtent *e)
{
    return e->kind == CKPTFS_EXTENT_GATHER && e->nrep == 1 && e->nitems == 1 &&
           e->first == b->items->len - 1;
}

void ckptfs_plan_add_run(CkptfsPlanBuilder *b, uint32_t src, uint64_t offset, uint64_t len)
{
    if (len == 0)
        return;
    BuildExtent *last = last_extent(b);
    if (last && is_plain_run(b, last)) {
        CkptfsGatherItem *item = &g_array_index(b->items, CkptfsGatherItem, last->first);
        if (item->src == src && item->base + item->len == offset) {
            item->len += len;
            item->stride = item->len;
            last->rep_size += len;
            last->size += len;
            b->size += len;
            return;
        }
    }
    CkptfsGatherItem item = {.src = src, .base = offset, .stride = len, .len = len};
    BuildExtent e = {.kind = CKPTFS_EXTENT_GATHER, .size = len, .first = b->items->len,
                     .nrep = 1, .rep_size = len, .nitems = 1};
    g_array_append_val(b->items, item);
    push_extent(b, e);
}

void ckptfs_plan_add_crc32(CkptfsPlanBuilder *b, uint64_t offset, uint64_t len)
{
    g_assert(offset + len <= b->size);
    BuildExtent e = {.kind = CKPTFS_EXTENT_CRC32, .size = 4, .first = b->n_crcs++,
                     .crc_offset = offset, .crc_len = len};
    push_extent(b, e);
}

/* Appends E with ITEMS (those of zero length left out) as its items. */
static void push_items_extent(CkptfsPlanBuilder *b, BuildExtent e, const CkptfsGatherItem *items,
                              uint32_t nitems)
{
    e.first = b->items->len;
    e.nitems = 0;
    for (uint32_t k = 0; k < nitems; k++)
        if (items[k].len > 0) {
            g_array_append_val(b->items, items[k]);
            e.nitems++;
        }
    push_extent(b, e);
}

void ckptfs_plan_add_gather(CkptfsPlanBuilder *b, uint64_t nrep, const CkptfsGatherItem *items,
                            uint32_t nitems)
{
    uint64_t rep_size = 0;
    for (uint32_t k = 0; k < nitems; k++)
        rep_size += items[k].len;
    if (nrep == 0 || rep_size == 0)
        return;
    /* A single item whose repetitions are back to back is one contiguous run. */
    if (nitems == 1 && (nrep == 1 || items[0].stride == items[0].len)) {
        ckptfs_plan_add_run(b, items[0].src, items[0].base, items[0].len * nrep);
        return;
    }
    if (nrep == 1) {
        for (uint32_t k = 0; k < nitems; k++)
            ckptfs_plan_add_run(b, items[k].src, items[k].base, items[k].len);
        return;
    }
    BuildExtent e = {.kind = CKPTFS_EXTENT_GATHER, .size = nrep * rep_size, .nrep = nrep,
                     .rep_size = rep_size};
    push_items_extent(b, e, items, nitems);
}

/* Output bytes of SRC_BYTES source bytes converted by CONV. */
static uint64_t converted_size(CkptfsConvert conv, uint64_t src_bytes)
{
    return src_bytes / ckptfs_dtype_size(ckptfs_convert_from(conv)) *
           ckptfs_dtype_size(ckptfs_convert_to(conv));
}

void ckptfs_plan_add_convert(CkptfsPlanBuilder *b, CkptfsConvert conv, uint64_t nrep,
                             const CkptfsGatherItem *items, uint32_t nitems)
{
    g_assert(conv > CKPTFS_CONVERT_NONE && conv < CKPTFS_CONVERT_COUNT);
    size_t isz = ckptfs_dtype_size(ckptfs_convert_from(conv));
    uint64_t rep_size = 0;
    for (uint32_t k = 0; k < nitems; k++) {
        g_assert(items[k].len % isz == 0); /* pieces are whole elements */
        rep_size += items[k].len;
    }
    if (nrep == 0 || rep_size == 0)
        return;
    CkptfsGatherItem run = items[0];
    if (nitems == 1 && (nrep == 1 || items[0].stride == items[0].len)) {
        /* One contiguous run: continues the previous converted run when it can. */
        run.len *= nrep;
        run.stride = run.len;
        BuildExtent *last = last_extent(b);
        if (last && last->kind == CKPTFS_EXTENT_CONVERT && last->convert == conv && last->scale < 0 && last->nrep == 1 &&
            last->nitems == 1 && last->first == b->items->len - 1) {
            CkptfsGatherItem *prev = &g_array_index(b->items, CkptfsGatherItem, last->first);
            if (prev->src == run.src && prev->base + prev->len == run.base) {
                uint64_t grown = converted_size(conv, run.len);
                prev->len += run.len;
                prev->stride = prev->len;
                last->rep_size += run.len;
                last->size += grown;
                b->size += grown;
                return;
            }
        }
        items = &run, nitems = 1, nrep = 1, rep_size = run.len;
    }
    BuildExtent e = {.kind = CKPTFS_EXTENT_CONVERT, .size = converted_size(conv, nrep * rep_size),
                     .nrep = nrep, .rep_size = rep_size, .convert = conv, .scale = -1};
    push_items_extent(b, e, items, nitems);
}

void ckptfs_plan_add_scaled(CkptfsPlanBuilder *b, CkptfsConvert conv, const CkptfsBlockScale *scale,
                            uint64_t nrep, const CkptfsGatherItem *items, uint32_t nitems)
{
    uint64_t rep_size = 0;
    for (uint32_t k = 0; k < nitems; k++)
        rep_size += items[k].len;
    if (nrep == 0 || rep_size == 0)
        return;
    CkptfsBlockScale copy = *scale;
    copy.col0 = (const uint64_t *)(uintptr_t)b->cols->len; /* an index until the plan is finished */
    for (uint32_t k = 0; k < nitems; k++)
        if (items[k].len > 0) /* as push_items_extent keeps them */
            g_array_append_val(b->cols, scale->col0[k]);
    BuildExtent e = {.kind = CKPTFS_EXTENT_CONVERT, .size = converted_size(conv, nrep * rep_size),
                     .nrep = nrep, .rep_size = rep_size, .convert = conv, .scale = b->scales->len};
    g_array_append_val(b->scales, copy);
    push_items_extent(b, e, items, nitems);
}

void ckptfs_plan_add_strided(CkptfsPlanBuilder *b, CkptfsDtype stored, CkptfsConvert conv, uint64_t nrep,
                             const CkptfsStridedItem *items, uint32_t nitems)
{
    size_t isz = ckptfs_dtype_size(stored);
    size_t osz = conv != CKPTFS_CONVERT_NONE ? ckptfs_dtype_size(ckptfs_convert_to(conv)) : isz;
    g_assert(conv == CKPTFS_CONVERT_NONE || ckptfs_convert_from(conv) == stored);
    uint64_t row_elems = 0;
    bool adjacent = true; /* every item's columns adjacent and none interleaved: a plain gather */
    for (uint32_t k = 0; k < nitems; k++) {
        row_elems += items[k].cols;
        adjacent = adjacent && items[k].ways <= 1 &&
                   (items[k].cols <= 1 || items[k].col_stride == isz || items[k].col_stride == 0);
    }
    if (nrep == 0 || row_elems == 0)
        return;
    if (adjacent) {
        g_autofree CkptfsGatherItem *gather = g_new(CkptfsGatherItem, nitems);
        for (uint32_t k = 0; k < nitems; k++)
            gather[k] = (CkptfsGatherItem){.src = items[k].src, .base = items[k].base,
                                           .stride = items[k].row_stride, .len = items[k].cols * isz};
        if (conv != CKPTFS_CONVERT_NONE)
            ckptfs_plan_add_convert(b, conv, nrep, gather, nitems);
        else
            ckptfs_plan_add_gather(b, nrep, gather, nitems);
        return;
    }
    BuildExtent e = {.kind = CKPTFS_EXTENT_TRANSPOSE, .size = nrep * row_elems * osz, .nrep = nrep,
                     .rep_size = row_elems, .convert = conv, .elsize = (uint32_t)isz,
                     .first = b->strided->len};
    uint64_t at = 0; /* where the next item (or set of interleaved ones) starts in the row */
    for (uint32_t k = 0; k < nitems;) {
        uint32_t ways = MAX(items[k].ways, 1u);
        uint64_t run = ways > 1 ? MAX(items[k].run, (uint64_t)1) : MAX(items[k].cols, (uint64_t)1);
        g_assert(k + ways <= nitems && items[k].cols % run == 0);
        for (uint32_t w = 0; w < ways; w++, k++) {
            g_assert(items[k].cols == items[k - w].cols);
            if (items[k].cols == 0)
                continue;
            CkptfsStridedItem item = items[k];
            item.col_stride = item.col_stride ? item.col_stride : isz; /* 0: adjacent */
            item.ways = ways, item.run = run, item.at = at + w * run, item.run_step = ways * run;
            g_array_append_val(b->strided, item);
            e.nitems++;
        }
        at += ways * items[k - 1].cols;
    }
    push_extent(b, e);
}

void ckptfs_plan_add_mxfp4(CkptfsPlanBuilder *b, const CkptfsMxfp4 *where, uint64_t nrep, uint64_t width)
{
    g_assert(where->cols % CKPTFS_MXFP4_GROUP == 0 && where->row_step > 0);
    if (nrep == 0 || width == 0)
        return;
    BuildExtent e = {.kind = CKPTFS_EXTENT_MXFP4, .size = nrep * width * 2, .nrep = nrep, .rep_size = width,
                     .first = b->mxfp4->len};
    g_array_append_val(b->mxfp4, *where);
    push_extent(b, e);
}

CkptfsPlan *ckptfs_plan_builder_finish(CkptfsPlanBuilder *b)
{
    CkptfsPlan *plan = g_new0(CkptfsPlan, 1);
    plan->size = b->size;
    plan->n_extents = b->extents->len;
    plan->extents = g_new0(CkptfsExtent, plan->n_extents ? plan->n_extents : 1);
    plan->literals = g_memdup2(b->literals->data, b->literals->len ? b->literals->len : 1);
    plan->items = g_memdup2(b->items->data, (b->items->len ? b->items->len : 1) * sizeof(CkptfsGatherItem));
    plan->n_crcs = b->n_crcs;
    plan->cols = g_memdup2(b->cols->data, (b->cols->len ? b->cols->len : 1) * sizeof(uint64_t));
    plan->scales = g_memdup2(b->scales->data, (b->scales->len ? b->scales->len : 1) * sizeof(CkptfsBlockScale));
    for (guint i = 0; i < b->scales->len; i++)
        plan->scales[i].col0 = plan->cols + (uintptr_t)plan->scales[i].col0;
    plan->strided = g_memdup2(b->strided->data, (b->strided->len ? b->strided->len : 1) * sizeof(CkptfsStridedItem));
    plan->mxfp4 = g_memdup2(b->mxfp4->data, (b->mxfp4->len ? b->mxfp4->len : 1) * sizeof(CkptfsMxfp4));
    plan->crc_values = g_new0(uint32_t, b->n_crcs ? b->n_crcs : 1);
    plan->crc_ready = g_new0(gint, b->n_crcs ? b->n_crcs : 1);
    for (size_t i = 0; i < plan->n_extents; i++) {
        const BuildExtent *be = &g_array_index(b->extents, BuildExtent, i);
        CkptfsExtent *e = &plan->extents[i];
        e->offset = be->offset;
        e->size = be->size;
        e->kind = be->kind;
        if (be->kind == CKPTFS_EXTENT_LITERAL) {
            e->u.literal = plan->literals + be->first;
        } else if (be->kind == CKPTFS_EXTENT_GATHER || be->kind == CKPTFS_EXTENT_CONVERT) {
            e->u.gather.convert = be->convert;
            e->u.gather.scale = be->kind == CKPTFS_EXTENT_CONVERT && be->scale >= 0 ? &plan->scales[be->scale] : NULL;
            e->u.gather.nrep = be->nrep;
            e->u.gather.rep_size = be->rep_size;
            e->u.gather.nitems = be->nitems;
            e->u.gather.items = plan->items + be->first;
        } else if (be->kind == CKPTFS_EXTENT_TRANSPOSE) {
            e->u.strided.nrep = be->nrep;
            e->u.strided.row_elems = be->rep_size;
            e->u.strided.nitems = be->nitems;
            e->u.strided.items = plan->strided + be->first;
            e->u.strided.convert = be->convert;
            e->u.strided.elsize = be->elsize;
        } else if (be->kind == CKPTFS_EXTENT_MXFP4) {
            e->u.mxfp4.nrep = be->nrep;
            e->u.mxfp4.width = be->rep_size;
            e->u.mxfp4.where = plan->mxfp4 + be->first;
            if (e->u.mxfp4.where->transposed && plan->band == NULL) {
                plan->band = g_new0(Mxfp4Band, 1);
                g_mutex_init(&plan->band->lock);
                g_cond_init(&plan->band->done);
            }
        } else if (be->kind == CKPTFS_EXTENT_CRC32) {
            e->u.crc.offset = be->crc_offset;
            e->u.crc.len = be->crc_len;
            e->u.crc.slot = (uint32_t)be->first;
        }
    }
    ckptfs_plan_builder_free(b);
    return plan;
}

void ckptfs_plan_free(CkptfsPlan *plan)
{
    if (plan == NULL)
        return;
    g_free(plan->extents);
    g_free(plan->literals);
    g_free(plan->items);
    g_free(plan->scales);
    g_free(plan->cols);
    g_free(plan->strided);
    g_free(plan->mxfp4);
    if (plan->band != NULL) {
        g_mutex_clear(&plan->band->lock);
        g_cond_clear(&plan->band->done);
        g_free(plan->band->rows);
        g_free(plan->band->spare);
        g_free(plan->band);
    }
    g_free(plan->crc_values);
    g_free(plan->crc_ready);
    g_free(plan);
}

uint64_t ckptfs_plan_size(const CkptfsPlan *plan)
{
    return plan->size;
}

size_t ckptfs_plan_extent_count(const CkptfsPlan *plan)
{
    return plan->n_extents;
}

/* Source reads are collected and merged while they continue each other in the same file: a
 * strided gather over full rows costs one read, and pieces separated by small gaps (a TP
 * column split takes 1/T of every row) are read with one preadv whose gaps land in a scratch
 * buffer. One syscall then replaces up to MAX_IOV / 2 small reads. */
#define MAX_IOV 256
#define MAX_SKIP (16u << 10)

typedef struct {
    CkptfsReadCtx ctx; /* its refs: pieces left in mapped files; NULL: copy all */
    uint32_t src;
    uint64_t start, end; /* source range the iovecs cover */
    struct iovec iov[MAX_IOV];
    int n;
    uint8_t *skip; /* MAX_SKIP bytes of scratch for the gaps, allocated on first need */
    const uint8_t *base;   /* the read's buffer (refs record places in it) */
    size_t len;            /* the read's size */
} PendingRead;

static bool pending_flush(PendingRead *p, GError **error)
{
    if (p->n == 0)
        return true;
    bool ok = ckptfs_srcfiles_read(&p->ctx, p->src, p->iov, p->n, p->start, error);
    p->n = 0;
    return ok;
}

/* The pin of SRC for this read (taken now on first use; its map NULL where refused), or NULL
 * when no more files may be pinned. */
static CkptfsReplyPin *pin_of(CkptfsReplyRefs *r, const CkptfsSrcFiles *files, uint32_t src)
{
    for (unsigned i = 0; i < r->npins; i++)
        if (r->pin[i].src == src)
            return &r->pin[i];
    if (r->npins == CKPTFS_REPLY_PINS_MAX)
        return NULL;
    r->pin[r->npins] = (CkptfsReplyPin){src, ckptfs_srcfiles_map_pin(files, src), false};
    return &r->pin[r->npins++];
}

/* Leaves the piece in its mapped file when it can: a lease, the pages cached, room in REFS. */
static bool map_piece(PendingRead *p, uint32_t src, uint64_t src_off, const uint8_t *dst, size_t len)
{
    CkptfsReplyRefs *r = p->ctx.refs;
    if (r == NULL || len < CKPTFS_MAPPED_MIN || r->n == CKPTFS_REPLY_REFS_MAX)
        return false;
    CkptfsReplyPin *pin = pin_of(r, p->ctx.files, src);
    if (pin == NULL || pin->map == NULL)
        return false;
    const uint8_t *map = pin->map;
    if (!(src == r->resident_src && src_off >= r->resident_lo && src_off + len <= r->resident_hi)) {
        /* Asked once for as far as the read goes (up to a MiB): a strided gather's next pieces
         * then need no call, and a small read's no more than its own. */
        uint64_t span = MAX((uint64_t)len, MIN((uint64_t)p->len, 1u << 20));
        uint64_t ahead = MIN(span, ckptfs_srcfiles_get(p->ctx.files, src)->size - src_off);
        if (!ckptfs_srcfiles_map_cached(p->ctx.files, src, src_off, ahead))
            return false;
        r->resident_src = src, r->resident_lo = src_off, r->resident_hi = src_off + ahead;
    }
    pin->used = true;
    size_t at = (size_t)(dst - p->base);
    if (r->n > 0 && r->ref[r->n - 1].at + r->ref[r->n - 1].len == at &&
        r->ref[r->n - 1].ptr + r->ref[r->n - 1].len == map + src_off) {
        r->ref[r->n - 1].len += len;
    } else {
        r->ref[r->n].at = at;
        r->ref[r->n].ptr = map + src_off;
        r->ref[r->n].len = len;
        r->n++;
    }
    return true;
}

static bool pending_add(PendingRead *p, uint32_t src, uint64_t src_off, uint8_t *dst, size_t len,
                        GError **error)
{
    if (map_piece(p, src, src_off, dst, len))
        return true;
    if (p->n > 0 && p->src == src && src_off >= p->end && src_off - p->end <= MAX_SKIP &&
        p->n + 2 <= MAX_IOV) {
        uint64_t gap = src_off - p->end;
        struct iovec *last = &p->iov[p->n - 1];
        if (gap == 0 && (uint8_t *)last->iov_base + last->iov_len == dst) {
            last->iov_len += len;
        } else {
            if (gap > 0) {
                if (p->skip == NULL)
                    p->skip = g_malloc(MAX_SKIP);
                p->iov[p->n++] = (struct iovec){p->skip, (size_t)gap};
            }
            p->iov[p->n++] = (struct iovec){dst, len};
        }
        p->end = src_off + len;
        return true;
    }
    if (!pending_flush(p, error))
        return false;
    p->src = src;
    p->start = src_off;
    p->end = src_off + len;
    p->iov[0] = (struct iovec){dst, len};
    p->n = 1;
    return true;
}

/* Row-major: bytes [in_off, in_off + n) of a gather, item after item, repetition after
 * repetition. */
static bool gather_read_rows(const CkptfsExtent *e, uint64_t in_off, uint8_t *dst, size_t n,
                             PendingRead *pending, GError **error)
{
    uint64_t rep = in_off / e->u.gather.rep_size;
    uint64_t pos = in_off % e->u.gather.rep_size;
    uint32_t k = 0;
    while (pos >= e->u.gather.items[k].len) {
        pos -= e->u.gather.items[k].len;
        k++;
    }
    while (n > 0) {
        const CkptfsGatherItem *item = &e->u.gather.items[k];
        uint64_t take = item->len - pos;
        if (take > n)
            take = n;
        if (!pending_add(pending, item->src, item->base + rep * item->stride + pos, dst,
                         (size_t)take, error))
            return false;
        dst += take;
        n -= (size_t)take;
        pos = 0;
        if (++k == e->u.gather.nitems) {
            k = 0;
            rep++;
        }
    }
    return true;
}

/* Whole repetitions with several items (a matrix merged from shards in different files, QKV
 * groups): read item by item, so each item's strided rows merge into few preadv calls instead
 * of alternating between files every few bytes. */
static bool gather_read(const CkptfsExtent *e, uint64_t in_off, uint8_t *dst, size_t n,
                        PendingRead *pending, GError **error)
{
    uint64_t rep_size = e->u.gather.rep_size;
    if (e->u.gather.nitems == 1)
        return gather_read_rows(e, in_off, dst, n, pending, error);
    /* The partial repetition at the start, row-major. */
    uint64_t head = (rep_size - in_off % rep_size) % rep_size;
    if (head > n)
        head = n;
    if (head && !gather_read_rows(e, in_off, dst, (size_t)head, pending, error))
        return false;
    in_off += head, dst += head, n -= (size_t)head;
    uint64_t first = in_off / rep_size, count = n / rep_size;
    uint64_t at = 0;
    for (uint32_t k = 0; k < e->u.gather.nitems; k++) {
        const CkptfsGatherItem *item = &e->u.gather.items[k];
        for (uint64_t j = 0; j < count; j++)
            if (!pending_add(pending, item->src, item->base + (first + j) * item->stride,
                             dst + j * rep_size + at, (size_t)item->len, error))
                return false;
        at += item->len;
    }
    uint64_t body = count * rep_size;
    /* The partial repetition at the end. */
    return n == body || gather_read_rows(e, in_off + body, dst + body, n - (size_t)body, pending, error);
}

/* Elements converted per source read: few reads, and the scratch (256 KiB of fp32) stays in L2. */
#define CONVERT_CHUNK 65536u

/* Output bytes [in_off, in_off + n) of a CONVERT extent: the elements they touch are read from
 * the sources and converted; whole ones straight into DST, a first or last element cut by the
 * read through a small buffer. */
/* Output bytes [in_off, in_off + n) of a block-scaled FP8 extent: the codes they touch are read
 * (a chunk at a time, merged reads as for a gather), each run of a row converted block by block
 * with its scale (a row of scales read when the block row changes), the requested bytes copied. */
static bool scaled_read(const CkptfsExtent *e, const CkptfsReadCtx *ctx,
                        uint64_t in_off, uint8_t *dst, size_t n, GError **error)
{
    const CkptfsBlockScale *sc = e->u.gather.scale;
    CkptfsDtype fp8 = ckptfs_convert_from(e->u.gather.convert);
    uint64_t first = in_off / 2, end = (in_off + n + 1) / 2; /* elements: one code, two bytes out */
    uint64_t rep = first / e->u.gather.rep_size, pos = first % e->u.gather.rep_size;
    uint32_t k = 0;
    while (pos >= e->u.gather.items[k].len)
        pos -= e->u.gather.items[k++].len;
    size_t chunk = (size_t)MIN(end - first, (uint64_t)CONVERT_CHUNK);
    g_autofree uint8_t *codes = g_malloc(chunk);
    g_autofree uint16_t *out = g_malloc(chunk * 2);
    g_autofree float *scales = g_new(float, sc->cols);
    uint64_t cached_brow = UINT64_MAX;
    for (uint64_t el = first; el < end;) {
        uint64_t count = MIN(end - el, (uint64_t)chunk);
        PendingRead pending = {.ctx = {.files = ctx->files, .reader = ctx->reader}}; /* every piece copied */
        bool ok = gather_read(e, el, codes, (size_t)count, &pending, error) && pending_flush(&pending, error);
        g_free(pending.skip);
        if (!ok)
            return false;
        for (uint64_t i = 0; i < count;) {
            const CkptfsGatherItem *item = &e->u.gather.items[k];
            uint64_t seg = MIN(item->len - pos, count - i);
            uint64_t row = sc->row0 + rep, col = sc->col0[k] + pos;
            uint64_t brow = row / sc->block_rows;
            if ((col + seg - 1) / sc->block_cols >= sc->cols || brow >= sc->rows) {
                g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "block scales of row %" G_GUINT64_FORMAT
                            " reach past their %" G_GUINT64_FORMAT "x%" G_GUINT64_FORMAT " matrix", row,
                            sc->rows, sc->cols);
                return false;
            }
            if (brow != cached_brow) {
                if (!ckptfs_srcfiles_pread(ctx->files, sc->src, scales, (size_t)sc->cols * sizeof(float),
                                           sc->base + brow * sc->row_stride, error))
                    return false;
                cached_brow = brow;
            }
            for (uint64_t c = col; c < col + seg;) {
                uint64_t stop = MIN(col + seg, (c / sc->block_cols + 1) * sc->block_cols);
                ckptfs_convert_fp8_scaled(fp8, codes + i + (c - col), scales[c / sc->block_cols],
                                          out + i + (c - col), (size_t)(stop - c));
                c = stop;
            }
            i += seg;
            pos += seg;
            if (pos == item->len) {
                pos = 0;
                if (++k == e->u.gather.nitems) {
                    k = 0;
                    rep++;
                }
            }
        }
        /* The requested bytes of this chunk. */
        uint64_t a = MAX(el * 2, in_off), z = MIN((el + count) * 2, in_off + n);
        memcpy(dst + (a - in_off), (const uint8_t *)out + (a - el * 2), (size_t)(z - a));
        el += count;
    }
    return true;
}

/* The output bytes of elements [EL, EL + COUNT) of an extent, their source bytes at IN, that
 * fall in [IN_OFF, OUT_END) of it, into DST (which holds byte IN_OFF): converted by CONV (NONE:
 * as they are); whole ones straight into DST, one cut by the read through a small buffer. */
static void put_elements(CkptfsConvert conv, size_t isz, const uint8_t *in, uint64_t el, uint64_t count,
                         uint64_t in_off, uint64_t out_end, uint8_t *dst)
{
    if (conv == CKPTFS_CONVERT_NONE) {
        uint64_t a = MAX(el * isz, in_off), z = MIN((el + count) * isz, out_end);
        if (a < z)
            memcpy(dst + (a - in_off), in + (a - el * isz), (size_t)(z - a));
        return;
    }
    size_t osz = ckptfs_dtype_size(ckptfs_convert_to(conv));
    for (uint64_t i = 0; i < count;) {
        uint64_t at = (el + i) * osz; /* where element el + i starts in the extent */
        if (at < in_off || at + osz > out_end) {
            uint8_t one[8];
            ckptfs_convert_run(conv, in + i * isz, one, 1);
            uint64_t a = MAX(at, in_off), z = MIN(at + osz, out_end);
            if (a < z)
                memcpy(dst + (a - in_off), one + (a - at), (size_t)(z - a));
            i++;
            continue;
        }
        /* Whole elements from here to the chunk's end or the last, cut one. */
        uint64_t whole = MIN(count - i, (out_end - at) / osz);
        ckptfs_convert_run(conv, in + i * isz, dst + (at - in_off), (size_t)whole);
        i += whole;
    }
}

static bool convert_read(const CkptfsExtent *e, const CkptfsReadCtx *ctx,
                         uint64_t in_off, uint8_t *dst, size_t n, GError **error)
{
    if (e->u.gather.scale != NULL)
        return scaled_read(e, ctx, in_off, dst, n, error);
    CkptfsConvert conv = e->u.gather.convert;
    size_t isz = ckptfs_dtype_size(ckptfs_convert_from(conv));
    size_t osz = ckptfs_dtype_size(ckptfs_convert_to(conv));
    uint64_t first = in_off / osz, end = (in_off + n + osz - 1) / osz; /* elements [first, end) */
    uint64_t out_end = in_off + n;
    g_autofree uint8_t *scratch = g_malloc(MIN(end - first, (uint64_t)CONVERT_CHUNK) * isz);
    bool ok = true;
    for (uint64_t el = first; el < end && ok;) {
        uint64_t count = MIN(end - el, (uint64_t)CONVERT_CHUNK);
        PendingRead pending = {.ctx = {.files = ctx->files, .reader = ctx->reader}}; /* every piece copied */
        ok = gather_read(e, el * isz, scratch, (size_t)(count * isz), &pending, error) &&
             pending_flush(&pending, error);
        g_free(pending.skip);
        if (!ok)
            break;
        put_elements(conv, isz, scratch, el, count, in_off, out_end, dst);
        el += count;
    }
    return ok;
}

/* Source bytes a TRANSPOSE read fetches at a time, into a buffer malloc keeps (a fresh MiB
 * per read cost more in page faults than the transposing). */
#define TRANSPOSE_STRIPE (64u << 10)
/* Rows transposed together: the block's columns stay in L1 while it is put together. */
#define TRANSPOSE_BLOCK 32u

/* Bytes from the first to the end of the last of N elements STRIDE apart. */
static uint64_t run_bytes(uint64_t n, uint64_t stride, size_t isz)
{
    return (n - 1) * stride + isz;
}

/* Copies N elements of ISZ bytes, IN_STEP apart at IN, to places OUT_STEP apart at OUT. */
static void copy_elements(uint8_t *out, uint64_t out_step, const uint8_t *in, uint64_t in_step, uint64_t n,
                          size_t isz)
{
    switch (isz) { /* constant sizes: the copies become loads and stores */
    case 2:
        for (uint64_t i = 0; i < n; i++)
            memcpy(out + i * out_step, in + i * in_step, 2);
        break;
    case 4:
        for (uint64_t i = 0; i < n; i++)
            memcpy(out + i * out_step, in + i * in_step, 4);
        break;
    default:
        for (uint64_t i = 0; i < n; i++)
            memcpy(out + i * out_step, in + i * in_step, isz);
    }
}

#if defined(__SSE2__)
/* 8 16-bit elements at P, adjacent or (PAIRS) every other one of 16: the even ones sign-extended
 * to 32 bits and packed back, which saturates nothing. */
static inline __m128i load_8x16(const uint8_t *p, bool pairs)
{
    __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (!pairs)
        return lo;
    __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(p + 16));
    return _mm_packs_epi32(_mm_srai_epi32(_mm_slli_epi32(lo, 16), 16), _mm_srai_epi32(_mm_slli_epi32(hi, 16), 16));
}

/* 8x8 16-bit elements: row i of IN (8 elements from IN + i * IN_STEP, adjacent or every other
 * one) becomes column i of OUT. */
static inline void transpose_8x8_16(uint8_t *out, uint64_t out_step, const uint8_t *in, uint64_t in_step, bool pairs)
{
    __m128i x[8], a[8], b[8];
    for (int i = 0; i < 8; i++)
        x[i] = load_8x16(in + i * in_step, pairs);
    for (int i = 0; i < 4; i++) {
        a[2 * i] = _mm_unpacklo_epi16(x[2 * i], x[2 * i + 1]);
        a[2 * i + 1] = _mm_unpackhi_epi16(x[2 * i], x[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        b[4 * i] = _mm_unpacklo_epi32(a[4 * i], a[4 * i + 2]);
        b[4 * i + 1] = _mm_unpackhi_epi32(a[4 * i], a[4 * i + 2]);
        b[4 * i + 2] = _mm_unpacklo_epi32(a[4 * i + 1], a[4 * i + 3]);
        b[4 * i + 3] = _mm_unpackhi_epi32(a[4 * i + 1], a[4 * i + 3]);
    }
    for (int i = 0; i < 4; i++) {
        _mm_storeu_si128((__m128i *)(void *)(out + (2 * i) * out_step), _mm_unpacklo_epi64(b[i], b[i + 4]));
        _mm_storeu_si128((__m128i *)(void *)(out + (2 * i + 1) * out_step), _mm_unpackhi_epi64(b[i], b[i + 4]));
    }
}

/* 4x4 32-bit elements, the same way. */
static inline void transpose_4x4_32(uint8_t *out, uint64_t out_step, const uint8_t *in, uint64_t in_step)
{
    __m128i x[4];
    for (int i = 0; i < 4; i++)
        x[i] = _mm_loadu_si128((const __m128i *)(const void *)(in + i * in_step));
    __m128i a0 = _mm_unpacklo_epi32(x[0], x[1]), a1 = _mm_unpackhi_epi32(x[0], x[1]);
    __m128i a2 = _mm_unpacklo_epi32(x[2], x[3]), a3 = _mm_unpackhi_epi32(x[2], x[3]);
    _mm_storeu_si128((__m128i *)(void *)(out + 0 * out_step), _mm_unpacklo_epi64(a0, a2));
    _mm_storeu_si128((__m128i *)(void *)(out + 1 * out_step), _mm_unpackhi_epi64(a0, a2));
    _mm_storeu_si128((__m128i *)(void *)(out + 2 * out_step), _mm_unpacklo_epi64(a1, a3));
    _mm_storeu_si128((__m128i *)(void *)(out + 3 * out_step), _mm_unpackhi_epi64(a1, a3));
}
#endif

/* NR rows x NC columns of elements of ISZ bytes into rows OUT_STEP apart at OUT (adjacent
 * columns), element (r, c) taken from IN + c * COL_STEP + r * ROW_STEP: a column's run holds
 * its rows. Square tiles in registers where the runs are adjacent elements, or every other one
 * of bf16 (interleaved gate and up), reading at most an element past a run (the buffers have
 * room) (8x8 of bf16 went from 1.2 to 6.5 GB/s against element by element), element by element
 * for the rest. */
static void transpose_columns(uint8_t *out, uint64_t out_step, const uint8_t *in, uint64_t col_step,
                              uint64_t row_step, uint64_t nr, uint64_t nc, size_t isz)
{
    uint64_t tile = 0, done_r = 0, done_c = 0;
#if defined(__SSE2__)
    tile = row_step == isz ? (isz == 2 ? 8 : isz == 4 ? 4 : 0) : isz == 2 && row_step == 4 ? 8 : 0;
#endif
    if (tile != 0) {
        done_r = nr / tile * tile, done_c = nc / tile * tile;
#if defined(__SSE2__)
        for (uint64_t c = 0; c < done_c; c += tile)
            for (uint64_t r = 0; r < done_r; r += tile) {
                uint8_t *o = out + r * out_step + c * isz;
                const uint8_t *i = in + c * col_step + r * row_step;
                if (isz == 2)
                    transpose_8x8_16(o, out_step, i, col_step, row_step == 4);
                else
                    transpose_4x4_32(o, out_step, i, col_step);
            }
#endif
    }
    /* The columns no tile covered, then the rows under the tiles' columns. */
    for (uint64_t c = done_c; c < nc; c++)
        copy_elements(out + c * isz, out_step, in + c * col_step, row_step, nr, isz);
    for (uint64_t c = 0; c < done_c; c++)
        copy_elements(out + done_r * out_step + c * isz, out_step, in + c * col_step + done_r * row_step, row_step,
                      nr - done_r, isz);
}

/* Where column C of item IT is in its extent's row. */
static inline uint64_t item_place(const CkptfsStridedItem *it, uint64_t c)
{
    return it->at + c / it->run * it->run_step + c % it->run;
}

/* Columns [CA, CB) of item IT in row ROW of a TRANSPOSE extent (WIDTH elements a row), OSZ bytes
 * each at IN, put in their places of the read of the extent's elements [FIRST, END) (bytes
 * [IN_OFF, OUT_END)) at DST: a run at a time, or, for a row the read holds whole, runs of one
 * element copied as they come. */
static void put_item_row(const CkptfsStridedItem *it, uint64_t row, uint64_t width, uint64_t ca, uint64_t cb,
                         const uint8_t *in, size_t osz, uint64_t first, uint64_t end, uint64_t in_off,
                         uint64_t out_end, uint8_t *dst)
{
    uint64_t el = row * width;
    if (it->run == 1 && el + item_place(it, ca) >= first && el + item_place(it, cb - 1) < end &&
        (el + item_place(it, ca)) * osz >= in_off && (el + item_place(it, cb - 1) + 1) * osz <= out_end) {
        copy_elements(dst + ((el + item_place(it, ca)) * osz - in_off), it->run_step * osz, in, osz, cb - ca, osz);
        return;
    }
    for (uint64_t c = ca; c < cb;) {
        uint64_t stop = MIN(cb, (c / it->run + 1) * it->run), at = el + item_place(it, c);
        uint64_t a = MAX(at, first), z = MIN(at + (stop - c), end);
        if (a < z) /* served elements now: bytes of them, cut at the read's ends */
            put_elements(CKPTFS_CONVERT_NONE, osz, in + (c - ca + (a - at)) * osz, a, z - a, in_off, out_end, dst);
        c = stop;
    }
}

/* Columns [CA, CB) of item IT in rows [RA, RA + NR) of a TRANSPOSE extent, element (r, c) at
 * IN + r * ROW_STEP + (c - CA) * COL_STEP, put row-major a block of rows at a time into BLOCK (and
 * CONVERTED), then each row's elements of the read into DST (put_item_row's arguments). */
static void transpose_block_rows(const CkptfsStridedItem *it, const uint8_t *in, uint64_t row_step,
                                 uint64_t col_step, uint64_t ra, uint64_t nr, uint64_t ca, uint64_t cb, bool by_column,
                                 size_t isz, CkptfsConvert conv, size_t osz, uint64_t width, uint64_t first,
                                 uint64_t end, uint64_t in_off, uint64_t out_end, uint8_t *block, uint8_t *converted,
                                 uint8_t *dst)
{
    uint64_t ncols = cb - ca;
    for (uint64_t r0 = 0; r0 < nr; r0 += TRANSPOSE_BLOCK) {
        uint64_t r1 = MIN(nr, r0 + TRANSPOSE_BLOCK);
        if (by_column)
            transpose_columns(block, ncols * isz, in + r0 * row_step, col_step, row_step, r1 - r0, ncols, isz);
        else
            for (uint64_t r = r0; r < r1; r++)
                copy_elements(block + (r - r0) * ncols * isz, isz, in + r * row_step, col_step, ncols, isz);
        if (conv != CKPTFS_CONVERT_NONE)
            ckptfs_convert_run(conv, block, converted, (size_t)((r1 - r0) * ncols));
        const uint8_t *out = conv != CKPTFS_CONVERT_NONE ? converted : block;
        for (uint64_t r = r0; r < r1; r++)
            put_item_row(it, ra + r, width, ca, cb, out + (r - r0) * ncols * osz, osz, first, end, in_off, out_end,
                         dst);
    }
}

/* Where rows [RA, RA + NR) of item IT (ISZ-byte elements) lie in its mapped file: element (r, c) at
 * the result + r * ROW_STRIDE + c * COL_STRIDE, when the file is mapped under a lease and those
 * bytes are in the page cache (the pin then marked used: the file is checked after the read and
 * kept until its reply is written, as mxfp4_mapped's). NULL otherwise: the runs are fetched. The
 * register transpose reads up to an element past a run, so the range must end 16 bytes before
 * the file does. */
static const uint8_t *strided_mapped(const CkptfsStridedItem *it, const CkptfsReadCtx *ctx, uint64_t ra, uint64_t nr,
                                     size_t isz)
{
    CkptfsReplyRefs *r = ctx->refs;
    if (r == NULL)
        return NULL;
    uint64_t off = it->base + ra * it->row_stride;
    uint64_t span = run_bytes(nr, it->row_stride, isz) + (it->cols - 1) * it->col_stride;
    CkptfsReplyPin *pin = pin_of(r, ctx->files, it->src);
    if (pin == NULL || pin->map == NULL || off + span + 16 > ckptfs_srcfiles_get(ctx->files, it->src)->size ||
        !ckptfs_srcfiles_map_cached(ctx->files, it->src, off, span))
        return NULL;
    pin->used = true;
    return pin->map + off;
}

/* Output bytes [in_off, in_off + n) of a TRANSPOSE extent, a stripe of columns at a time
 * over all the rows they touch: each item's source runs (a column's rows for an item stored
 * transposed, a row's columns for the others) read once, merged into few preadv calls as a
 * gather's (the gaps between a stripe's column runs read once too); the stripe put together
 * row-major a block of rows at a time; each row's piece converted or copied out. An item whose
 * rows are mapped and cached (strided_mapped) is transposed from where it lies instead: no read
 * copies its runs with their gaps (a 1 MiB read of GPT-OSS-20B's fc1 served [H, 2F] wants 182 of
 * every 5760 bytes), and its stripes are as wide as the block buffer allows. */
static bool transpose_read(const CkptfsExtent *e, const CkptfsReadCtx *ctx,
                           uint64_t in_off, uint8_t *dst, size_t n, GError **error)
{
    CkptfsConvert conv = e->u.strided.convert;
    size_t isz = e->u.strided.elsize;
    size_t osz = conv != CKPTFS_CONVERT_NONE ? ckptfs_dtype_size(ckptfs_convert_to(conv)) : isz;
    uint64_t width = e->u.strided.row_elems, out_end = in_off + n;
    uint64_t first = in_off / osz, end = (out_end + osz - 1) / osz; /* elements [first, end) */
    uint64_t row_first = first / width, row_end = (end - 1) / width + 1;
    uint32_t nitems = e->u.strided.nitems;
    const CkptfsStridedItem *items = e->u.strided.items;
    /* Bytes of one row of one column in the stripe buffer, at most: rows per pass so that one
     * column of each item fits. */
    uint64_t widest = isz;
    for (uint32_t k = 0; k < nitems; k++)
        widest = MAX(widest, MIN(items[k].row_stride, items[k].col_stride));
    uint64_t pass_rows = MAX((uint64_t)1, TRANSPOSE_STRIPE / widest);
    /* zeroed: a partial first or last row leaves elements unread, transposed and dropped */
    g_autofree uint8_t *fetched = g_malloc0(TRANSPOSE_STRIPE + widest + isz);
    g_autofree uint8_t *block = g_malloc(TRANSPOSE_STRIPE + widest + isz);
    /* a block converted at once (a call per row of a narrow stripe cost a third of the time) */
    g_autofree uint8_t *converted = conv != CKPTFS_CONVERT_NONE ? g_malloc((TRANSPOSE_STRIPE + widest + isz) / isz * osz)
                                                                : NULL;
    for (uint64_t ra = row_first; ra < row_end;) {
        uint64_t nr = MIN(pass_rows, row_end - ra);
        for (uint64_t k = 0; k < nitems; k++) {
            const CkptfsStridedItem *it = &items[k];
            bool alone = it->run == it->cols; /* its columns adjacent in the row */
            bool by_column = it->row_stride < it->col_stride;
            /* Stripes of this item's columns: as many as fit the buffer (one at least). */
            uint64_t col_cost = by_column ? run_bytes(nr, it->row_stride, isz)
                                          : nr * MIN(it->col_stride, run_bytes(it->cols, it->col_stride, isz));
            uint64_t stripe = MAX((uint64_t)1, MIN(TRANSPOSE_STRIPE / col_cost, TRANSPOSE_STRIPE / (nr * isz)));
            const uint8_t *mapped = strided_mapped(it, ctx, ra, nr, isz);
            if (mapped != NULL) /* only the block buffer bounds it: a block of rows of the stripe */
                stripe = MAX((uint64_t)1, TRANSPOSE_STRIPE / (MIN(nr, (uint64_t)TRANSPOSE_BLOCK) * isz));
            for (uint64_t ca = 0; ca < it->cols; ca += stripe) {
                uint64_t cb = MIN(it->cols, ca + stripe), ncols = cb - ca;
                if (mapped != NULL) {
                    transpose_block_rows(it, mapped + ca * it->col_stride, it->row_stride, it->col_stride, ra, nr, ca,
                                         cb, by_column, isz, conv, osz, width, first, end, in_off, out_end, block,
                                         converted, dst);
                    continue;
                }
                /* Element (r, c) of the stripe at FETCHED + r * row_step + c * col_step. */
                uint64_t row_step = by_column ? it->row_stride : run_bytes(ncols, it->col_stride, isz);
                uint64_t col_step = by_column ? run_bytes(nr, it->row_stride, isz) : it->col_stride;
                /* Rows [lo, hi) of column c: the first and last rows of the read may want only
                 * some of their columns. */
                uint64_t first_col = ra == row_first ? first - row_first * width : 0;
                uint64_t last_end = ra + nr == row_end ? end - (row_end - 1) * width : width;
                PendingRead pending = {.ctx = {.files = ctx->files, .reader = ctx->reader}}; /* every piece copied */
                bool ok = true, any = false;
                if (by_column) {
                    for (uint64_t c = ca; c < cb && ok; c++) {
                        uint64_t lo = item_place(it, c) < first_col ? 1 : 0;
                        uint64_t hi = item_place(it, c) >= last_end ? nr - 1 : nr;
                        if (lo >= hi)
                            continue;
                        any = true;
                        ok = pending_add(&pending, it->src, it->base + (ra + lo) * it->row_stride + c * it->col_stride,
                                         fetched + (c - ca) * col_step + lo * row_step,
                                         (size_t)run_bytes(hi - lo, it->row_stride, isz), error);
                    }
                } else {
                    for (uint64_t r = 0; r < nr && ok; r++) {
                        /* an interleaved item's columns fetched whole: they exist in every row */
                        uint64_t g0 = it->at;
                        uint64_t c0 = MAX(ca, r == 0 && alone ? MAX(first_col, g0) - g0 : 0);
                        uint64_t c1 = MIN(cb, r == nr - 1 && alone ? MAX(last_end, g0) - g0 : cb);
                        if (c0 >= c1)
                            continue;
                        any = true;
                        ok = pending_add(&pending, it->src, it->base + (ra + r) * it->row_stride + c0 * it->col_stride,
                                         fetched + r * row_step + (c0 - ca) * col_step,
                                         (size_t)run_bytes(c1 - c0, it->col_stride, isz), error);
                    }
                }
                ok = ok && pending_flush(&pending, error);
                g_free(pending.skip);
                if (!ok)
                    return false;
                if (any)
                    transpose_block_rows(it, fetched, row_step, col_step, ra, nr, ca, cb, by_column, isz, conv, osz,
                                         width, first, end, in_off, out_end, block, converted, dst);
            }
        }
        ra += nr;
    }
    return true;
}

/* Elements a read of MXFP4 stored rows decodes at a time, at least a row: its buffers stay below
 * malloc's threshold for fresh pages (at 65536, 128 KiB reads of rows ran at 1.7 GB/s, 3.5-4.6 at
 * this size). */
#define MXFP4_PASS 32768u

/* Groups [G0, G0 + NG) of NROWS stored rows of M, ROW0 + k * STEP: row k's codes to CODES + k * NG
 * * 16, its scales to SCALES + k * NG, in merged reads as a gather's. */
static bool mxfp4_fetch(const CkptfsMxfp4 *m, const CkptfsReadCtx *ctx, uint64_t row0,
                        uint64_t step, uint64_t nrows, uint64_t g0, uint64_t ng, uint8_t *codes, uint8_t *scales,
                        GError **error)
{
    uint64_t groups = m->cols / CKPTFS_MXFP4_GROUP;
    PendingRead pending = {.ctx = {.files = ctx->files, .reader = ctx->reader}}; /* every piece copied */
    bool ok = true;
    for (uint64_t k = 0; k < nrows && ok; k++)
        ok = pending_add(&pending, m->blocks_src, m->blocks_base + ((row0 + k * step) * groups + g0) * 16,
                         codes + k * ng * 16, (size_t)(ng * 16), error);
    ok = ok && pending_flush(&pending, error);
    for (uint64_t k = 0; k < nrows && ok; k++)
        ok = pending_add(&pending, m->scales_src, m->scales_base + (row0 + k * step) * groups + g0, scales + k * ng,
                         (size_t)ng, error);
    ok = ok && pending_flush(&pending, error);
    g_free(pending.skip);
    return ok;
}

/* Output bytes of a band decoded at a time, at most: a band of GPT-OSS-120B's gate_up_proj is 22
 * of its 90 groups of columns, each of its 5760 stored rows fetched as one run of 352 bytes (the
 * rest of the row read in the same preadv as a gap): each band copies its expert's whole blocks.
 * With the buffers reused, bands of 8 and 16 MiB ran alike (bench/mxfp4_bench). */
#define MXFP4_BAND (8u << 20)

/* The band of transposed MXFP4 extent E holding its output row J: groups [GA, GA + NG) of stored
 * columns, output rows [JA, JB). */
static void band_range(const CkptfsExtent *e, uint64_t j, uint64_t *ga, uint64_t *ng, uint64_t *ja, uint64_t *jb)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, nrep = e->u.mxfp4.nrep;
    uint64_t groups = MAX((uint64_t)1, MXFP4_BAND / (width * CKPTFS_MXFP4_GROUP * 2));
    uint64_t g_last = (m->col0 + nrep - 1) / CKPTFS_MXFP4_GROUP;
    *ga = (m->col0 + j) / CKPTFS_MXFP4_GROUP;
    *ng = MIN(groups, g_last + 1 - *ga);
    *ja = MAX(*ga * CKPTFS_MXFP4_GROUP, m->col0) - m->col0;
    *jb = MIN(nrep, (*ga + *ng) * CKPTFS_MXFP4_GROUP - m->col0);
}

/* Decodes into ROWS the band of transposed MXFP4 extent E (band_range): groups of stored columns
 * over every stored row, a block of stored rows at a time (its scratch below malloc's threshold
 * for fresh pages), transposed in registers as a TRANSPOSE read's. */
static bool mxfp4_band_decode(const CkptfsExtent *e, const CkptfsReadCtx *ctx,
                              uint64_t ga, uint64_t ng, uint64_t ja, uint64_t jb, uint16_t *rows, GError **error)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, span = ng * CKPTFS_MXFP4_GROUP;
    uint64_t block = MAX((uint64_t)8, MXFP4_PASS / span); /* stored rows */
    block = MIN(block, width);
    g_autofree uint8_t *codes = g_malloc(block * ng * 16), *scales = g_malloc(block * ng);
    g_autofree uint16_t *decoded = g_new(uint16_t, block * span);
    for (uint64_t k0 = 0; k0 < width; k0 += block) {
        uint64_t nk = MIN(block, width - k0);
        if (!mxfp4_fetch(m, ctx, m->row0 + k0 * m->row_step, m->row_step, nk, ga, ng, codes, scales, error))
            return false;
        ckptfs_convert_mxfp4(codes, scales, (size_t)(nk * ng), decoded);
        /* element (j, k): stored row k's column COL0 + j, SPAN columns a row */
        transpose_columns((uint8_t *)(rows + k0), width * 2,
                          (const uint8_t *)(decoded + (m->col0 + ja - ga * CKPTFS_MXFP4_GROUP)), span * 2, 2, jb - ja,
                          nk, 2);
    }
    return true;
}

/* Stored rows a direct column read decodes at a time, for every group of columns it touches: the
 * groups' source lines are fetched once, the output rows' pieces stay in L1 until whole lines. */
#define MXFP4_TILE_ROWS 64u

/* Where the codes and scales of MXFP4 extent E lie in their mapped files (BLOCKS and SCALES:
 * stored row ROW0's first group), when both are mapped and the pages of its stored rows
 * ROW0 + k * ROW_STEP, k in [KA, KB), are in the page cache: the pins are then marked used (the
 * files are checked after the read and kept until its reply is written). False otherwise: no
 * mapped reads, a packed or uncached file. */
static bool mxfp4_mapped(const CkptfsExtent *e, const CkptfsReadCtx *ctx, uint64_t ka, uint64_t kb,
                         const uint8_t **blocks, const uint8_t **scales)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    CkptfsReplyRefs *r = ctx->refs;
    if (r == NULL)
        return false;
    uint64_t groups = m->cols / CKPTFS_MXFP4_GROUP, first = m->row0 + ka * m->row_step;
    uint64_t span = (kb - ka - 1) * m->row_step + 1; /* stored rows from the first to the last */
    uint64_t b_off = m->blocks_base + first * groups * 16, b_len = span * groups * 16;
    uint64_t s_off = m->scales_base + first * groups, s_len = span * groups;
    CkptfsReplyPin *bp = pin_of(r, ctx->files, m->blocks_src);
    CkptfsReplyPin *sp = bp ? pin_of(r, ctx->files, m->scales_src) : NULL;
    if (sp == NULL || bp->map == NULL || sp->map == NULL ||
        b_off + b_len > ckptfs_srcfiles_get(ctx->files, m->blocks_src)->size ||
        s_off + s_len > ckptfs_srcfiles_get(ctx->files, m->scales_src)->size ||
        !ckptfs_srcfiles_map_cached(ctx->files, m->blocks_src, b_off, b_len) ||
        !ckptfs_srcfiles_map_cached(ctx->files, m->scales_src, s_off, s_len))
        return false;
    bp->used = sp->used = true;
    *blocks = bp->map + m->blocks_base + m->row0 * groups * 16;
    *scales = sp->map + m->scales_base + m->row0 * groups;
    return true;
}

/* A run of output rows of a direct column read and where they go: row J_A at OUT, rows OUT_STEP
 * bytes apart; only their elements [KA, KB) are needed (a row cut by the read). */
typedef struct {
    uint64_t ja, jb;
    uint8_t *out;
    uint64_t out_step;
    uint64_t ka, kb;
} ColumnRun;

/* Output rows of transposed MXFP4 extent E, the RUNS' (NRUNS, in order), decoded from the codes
 * and scales where they lie (BLOCKS, SCALES: as mxfp4_mapped gives them), a tile of stored rows
 * at a time, each group of columns a run touches decoded transposed into place: the source rows
 * are read once, nothing is copied or kept. */
static void mxfp4_columns_decode(const CkptfsExtent *e, const uint8_t *blocks, const uint8_t *scales,
                                 const ColumnRun *runs, unsigned nruns)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, groups = m->cols / CKPTFS_MXFP4_GROUP;
    uint64_t block_step = groups * 16 * m->row_step, scale_step = groups * m->row_step;
    for (uint64_t k0 = 0; k0 < width; k0 += MXFP4_TILE_ROWS) {
        uint64_t nk = MIN((uint64_t)MXFP4_TILE_ROWS, width - k0);
        for (unsigned i = 0; i < nruns; i++) {
            if (k0 + nk <= runs[i].ka || runs[i].kb <= k0)
                continue;
            for (uint64_t c = m->col0 + runs[i].ja, c_end = m->col0 + runs[i].jb; c < c_end;) {
                uint64_t g = c / CKPTFS_MXFP4_GROUP, stop = MIN(c_end, (g + 1) * CKPTFS_MXFP4_GROUP);
                ckptfs_convert_mxfp4_columns(blocks + k0 * block_step + g * 16, (size_t)block_step,
                                             scales + k0 * scale_step + g, (size_t)scale_step, (size_t)nk,
                                             (unsigned)(c % CKPTFS_MXFP4_GROUP), (unsigned)(stop - c),
                                             runs[i].out + (c - m->col0 - runs[i].ja) * runs[i].out_step + k0 * 2,
                                             (size_t)runs[i].out_step);
                c = stop;
            }
        }
    }
}

/* Output bytes [in_off, in_off + n) of transposed MXFP4 extent E from its mapped codes and scales
 * (mxfp4_mapped): whole output rows straight into DST, a first or last one cut by the read
 * through a row of its own. */
static void mxfp4_columns_read(const CkptfsExtent *e, const uint8_t *blocks, const uint8_t *scales,
                               uint64_t in_off, uint8_t *dst, size_t n)
{
    uint64_t width = e->u.mxfp4.width, row_bytes = width * 2, out_end = in_off + n;
    uint64_t j_first = in_off / row_bytes, j_end = (out_end - 1) / row_bytes + 1;
    bool cut_first = j_first * row_bytes < in_off || (j_first + 1) * row_bytes > out_end;
    bool cut_last = j_end - 1 > j_first && j_end * row_bytes > out_end;
    g_autofree uint8_t *cut = cut_first || cut_last ? g_malloc(2 * row_bytes) : NULL;
    ColumnRun runs[3];
    unsigned nruns = 0;
    uint64_t whole_a = j_first + cut_first, whole_b = j_end - cut_last;
    uint64_t k_first = in_off / 2 - j_first * width, k_end = (out_end + 1) / 2 - (j_end - 1) * width;
    if (cut_first)
        runs[nruns++] = (ColumnRun){j_first, j_first + 1, cut, row_bytes, k_first, j_end - 1 > j_first ? width : k_end};
    if (whole_a < whole_b)
        runs[nruns++] = (ColumnRun){whole_a, whole_b, dst + (whole_a * row_bytes - in_off), row_bytes, 0, width};
    if (cut_last)
        runs[nruns++] = (ColumnRun){j_end - 1, j_end, cut + row_bytes, row_bytes, 0, k_end};
    mxfp4_columns_decode(e, blocks, scales, runs, nruns);
    if (cut_first)
        put_elements(CKPTFS_CONVERT_NONE, 2, cut, j_first * width, width, in_off, out_end, dst);
    if (cut_last)
        put_elements(CKPTFS_CONVERT_NONE, 2, cut + row_bytes, (j_end - 1) * width, width, in_off, out_end, dst);
}

/* Output bytes [in_off, in_off + n) of MXFP4 extent E of stored rows from its mapped codes and
 * scales (mxfp4_mapped): groups [G0, G0 + NG) of each row decoded where they lie, straight into
 * DST where the row is whole in it and starts a group (SKIP 0), else through a row of its own. */
static void mxfp4_rows_read(const CkptfsExtent *e, const uint8_t *blocks, const uint8_t *scales, uint64_t g0,
                            uint64_t ng, uint64_t skip, uint64_t in_off, uint8_t *dst, size_t n)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, row_bytes = width * 2, out_end = in_off + n;
    uint64_t groups = m->cols / CKPTFS_MXFP4_GROUP;
    uint64_t j_first = in_off / row_bytes, j_end = (out_end - 1) / row_bytes + 1;
    g_autofree uint16_t *row = NULL;
    for (uint64_t j = j_first; j < j_end; j++) {
        const uint8_t *codes = blocks + (j * m->row_step * groups + g0) * 16;
        const uint8_t *row_scales = scales + j * m->row_step * groups + g0;
        uint8_t *at = dst + (j * row_bytes - MIN(j * row_bytes, in_off)); /* where the row's bytes go */
        bool whole = j * row_bytes >= in_off && (j + 1) * row_bytes <= out_end;
        if (whole && skip == 0 && width == ng * CKPTFS_MXFP4_GROUP && (uintptr_t)at % 2 == 0) {
            ckptfs_convert_mxfp4(codes, row_scales, (size_t)ng, (uint16_t *)(void *)at);
            continue;
        }
        if (row == NULL)
            row = g_new(uint16_t, ng * CKPTFS_MXFP4_GROUP);
        ckptfs_convert_mxfp4(codes, row_scales, (size_t)ng, row);
        put_elements(CKPTFS_CONVERT_NONE, 2, (const uint8_t *)(row + skip), j * width, width, in_off, out_end, dst);
    }
}

/* Output bytes [in_off, in_off + n) of an MXFP4 extent: the whole rows they touch decoded, a
 * pass of as many as MXFP4_PASS elements at a time for stored rows, the plan's BAND for stored
 * columns; the requested bytes copied out. */
static bool mxfp4_read(const CkptfsExtent *e, Mxfp4Band *band, const CkptfsReadCtx *ctx,
                       uint64_t in_off, uint8_t *dst, size_t n, GError **error)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, out_end = in_off + n;
    uint64_t j_first = in_off / 2 / width, j_end = ((out_end + 1) / 2 - 1) / width + 1;
    const uint8_t *mapped_blocks, *mapped_scales;
    if (!m->transposed) {
        uint64_t g0 = m->col0 / CKPTFS_MXFP4_GROUP;
        uint64_t ng = (m->col0 + width + CKPTFS_MXFP4_GROUP - 1) / CKPTFS_MXFP4_GROUP - g0;
        uint64_t skip = m->col0 - g0 * CKPTFS_MXFP4_GROUP; /* the columns of its first group before COL0 */
        if (mxfp4_mapped(e, ctx, j_first, j_end, &mapped_blocks, &mapped_scales)) {
            mxfp4_rows_read(e, mapped_blocks, mapped_scales, g0, ng, skip, in_off, dst, n);
            return true;
        }
        uint64_t pass = MAX((uint64_t)1, MXFP4_PASS / (ng * CKPTFS_MXFP4_GROUP));
        pass = MIN(pass, j_end - j_first);
        g_autofree uint8_t *codes = g_malloc(pass * ng * 16), *scales = g_malloc(pass * ng);
        g_autofree uint16_t *decoded = g_new(uint16_t, pass * ng * CKPTFS_MXFP4_GROUP);
        for (uint64_t ja = j_first; ja < j_end; ja += pass) {
            uint64_t nr = MIN(pass, j_end - ja);
            if (!mxfp4_fetch(m, ctx, m->row0 + ja * m->row_step, m->row_step, nr, g0, ng, codes, scales,
                             error))
                return false;
            ckptfs_convert_mxfp4(codes, scales, (size_t)(nr * ng), decoded);
            for (uint64_t r = 0; r < nr; r++)
                put_elements(CKPTFS_CONVERT_NONE, 2,
                             (const uint8_t *)(decoded + r * ng * CKPTFS_MXFP4_GROUP + skip),
                             (ja + r) * width, width, in_off, out_end, dst);
        }
        return true;
    }
    /* Transposed: output row j is stored column COL0 + j of WIDTH stored rows; read where they
     * lie when mapped, else decoded a band at a time, the plan's last band kept. */
    if (mxfp4_mapped(e, ctx, 0, width, &mapped_blocks, &mapped_scales)) {
        mxfp4_columns_read(e, mapped_blocks, mapped_scales, in_off, dst, n);
        return true;
    }
    g_mutex_lock(&band->lock);
    for (uint64_t j = j_first; j < j_end;) {
        if (band->extent == e && band->ja <= j && j < band->jb) {
            for (uint64_t stop = MIN(j_end, band->jb); j < stop; j++)
                put_elements(CKPTFS_CONVERT_NONE, 2, (const uint8_t *)(band->rows + (j - band->ja) * width), j * width,
                             width, in_off, out_end, dst);
            continue;
        }
        if (band->coming == e && band->coming_ja <= j && j < band->coming_jb) {
            g_cond_wait(&band->done, &band->lock);
            continue;
        }
        uint64_t ga, ng, ja, jb;
        band_range(e, j, &ga, &ng, &ja, &jb);
        bool announced = band->coming == NULL;
        if (announced)
            band->coming = e, band->coming_ja = ja, band->coming_jb = jb;
        size_t len = (size_t)((jb - ja) * width);
        uint16_t *rows = NULL;
        if (announced && band->spare != NULL && band->spare_len >= len) /* no other read uses it */
            rows = g_steal_pointer(&band->spare), len = band->spare_len;
        g_mutex_unlock(&band->lock);
        rows = rows ? rows : g_new(uint16_t, len);
        bool ok = mxfp4_band_decode(e, ctx, ga, ng, ja, jb, rows, error);
        g_mutex_lock(&band->lock);
        if (announced) {
            band->coming = NULL;
            g_cond_broadcast(&band->done);
        }
        if (!ok) {
            g_free(rows);
            g_mutex_unlock(&band->lock);
            return false;
        }
        if (band->spare == NULL)
            band->spare = band->rows, band->spare_len = band->rows_len;
        else
            g_free(band->rows);
        band->extent = e, band->ja = ja, band->jb = jb, band->rows = rows, band->rows_len = len;
    }
    g_mutex_unlock(&band->lock);
    return true;
}

#define CRC_CHUNK (1u << 20)

static bool crc_value(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, const CkptfsExtent *e,
                      uint32_t *out, GError **error)
{
    uint32_t slot = e->u.crc.slot;
    if (g_atomic_int_get(&plan->crc_ready[slot])) {
        *out = plan->crc_values[slot];
        return true;
    }
    uLong crc = crc32(0L, Z_NULL, 0);
    g_autofree uint8_t *buf = g_malloc(CRC_CHUNK);
    for (uint64_t done = 0; done < e->u.crc.len;) {
        size_t n = (size_t)MIN((uint64_t)CRC_CHUNK, e->u.crc.len - done);
        if (ckptfs_plan_read(plan, CKPTFS_READ_SHARED(ctx->files), buf, n, e->u.crc.offset + done, error) !=
            (int64_t)n)
            return false;
        crc = crc32(crc, buf, (uInt)n);
        done += n;
    }
    plan->crc_values[slot] = (uint32_t)crc;
    g_atomic_int_set(&plan->crc_ready[slot], 1);
    *out = (uint32_t)crc;
    return true;
}

static size_t find_extent(const CkptfsPlan *plan, uint64_t offset)
{
    size_t lo = 0, hi = plan->n_extents; /* last extent with e.offset <= offset */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (plan->extents[mid].offset <= offset)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The read without its mapped-read bookkeeping (REFS of CTX filled, not checked). */
static int64_t plan_read(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, void *buf, size_t len, uint64_t offset,
                         GError **error);

int64_t ckptfs_plan_read(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, void *buf, size_t len, uint64_t offset,
                         GError **error)
{
    CkptfsReplyRefs *refs = ctx->refs;
    if (refs == NULL)
        return plan_read(plan, ctx, buf, len, offset, error);
    refs->n = refs->npins = 0;
    refs->resident_src = 0;
    refs->resident_lo = refs->resident_hi = 0;
    int64_t n = plan_read(plan, ctx, buf, len, offset, error);
    /* Files nothing is sent from are let go now: a writer need not wait for this reply. The
     * others are checked as a pread is after it: still the files first opened. */
    const CkptfsSrcFiles *files = ctx->files;
    unsigned kept = 0;
    for (unsigned i = 0; i < refs->npins; i++) {
        if (refs->pin[i].map != NULL && !refs->pin[i].used) {
            ckptfs_srcfiles_map_unpin(files, refs->pin[i].src);
            continue;
        }
        refs->pin[kept++] = refs->pin[i];
        if (n >= 0 && refs->pin[i].map != NULL && !ckptfs_srcfiles_map_check(files, refs->pin[i].src, error))
            n = -1;
    }
    refs->npins = kept;
    return n;
}

static int compare_refs(const void *a, const void *b)
{
    const CkptfsReplyRef *x = a, *y = b;
    return x->at < y->at ? -1 : x->at > y->at;
}

int ckptfs_reply_refs_iov(CkptfsReplyRefs *refs, const void *buf, size_t n, struct iovec *iov, int max)
{
    g_assert(max >= CKPTFS_REPLY_IOV_MAX);
    qsort(refs->ref, refs->n, sizeof refs->ref[0], compare_refs);
    int k = 0;
    size_t done = 0;
    for (unsigned i = 0; i < refs->n; i++) {
        if (refs->ref[i].at > done)
            iov[k++] = (struct iovec){(uint8_t *)buf + done, refs->ref[i].at - done};
        iov[k++] = (struct iovec){(void *)refs->ref[i].ptr, refs->ref[i].len};
        done = refs->ref[i].at + refs->ref[i].len;
    }
    if (n > done)
        iov[k++] = (struct iovec){(uint8_t *)buf + done, n - done};
    return k;
}

size_t ckptfs_reply_refs_gather(const CkptfsReplyRefs *refs, void *buf, size_t n)
{
    for (unsigned i = 0; i < refs->n; i++)
        memcpy((uint8_t *)buf + refs->ref[i].at, refs->ref[i].ptr, refs->ref[i].len);
    return n;
}

void ckptfs_reply_refs_release(const CkptfsSrcFiles *files, CkptfsReplyRefs *refs)
{
    for (unsigned i = 0; i < refs->npins; i++)
        if (refs->pin[i].map != NULL)
            ckptfs_srcfiles_map_unpin(files, refs->pin[i].src);
    refs->npins = refs->n = 0;
}

static int64_t plan_read(const CkptfsPlan *plan, const CkptfsReadCtx *ctx, void *buf, size_t len, uint64_t offset,
                         GError **error)
{
    if (offset >= plan->size || len == 0)
        return 0;
    if (len > plan->size - offset)
        len = (size_t)(plan->size - offset);
    uint8_t *dst = buf;
    size_t remaining = len;
    PendingRead pending = {.ctx = *ctx, .base = buf, .len = len};
    int64_t result = (int64_t)len;
    for (size_t i = find_extent(plan, offset); remaining > 0; i++) {
        const CkptfsExtent *e = &plan->extents[i];
        uint64_t in_off = offset - e->offset;
        size_t n = e->size - in_off < remaining ? (size_t)(e->size - in_off) : remaining;
        switch (e->kind) {
        case CKPTFS_EXTENT_LITERAL:
            memcpy(dst, e->u.literal + in_off, n);
            break;
        case CKPTFS_EXTENT_ZERO:
            memset(dst, 0, n);
            break;
        case CKPTFS_EXTENT_GATHER:
            if (!gather_read(e, in_off, dst, n, &pending, error)) {
                result = -1;
                goto out;
            }
            break;
        case CKPTFS_EXTENT_CONVERT:
            if (!convert_read(e, ctx, in_off, dst, n, error)) {
                result = -1;
                goto out;
            }
            break;
        case CKPTFS_EXTENT_TRANSPOSE:
            if (!transpose_read(e, ctx, in_off, dst, n, error)) {
                result = -1;
                goto out;
            }
            break;
        case CKPTFS_EXTENT_MXFP4:
            if (!mxfp4_read(e, plan->band, ctx, in_off, dst, n, error)) {
                result = -1;
                goto out;
            }
            break;
        case CKPTFS_EXTENT_CRC32: {
            uint32_t crc;
            if (!crc_value(plan, ctx, e, &crc, error)) {
                result = -1;
                goto out;
            }
            uint8_t le[4] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16),
                             (uint8_t)(crc >> 24)};
            memcpy(dst, le + in_off, n);
            break;
        }
        }
        dst += n;
        offset += n;
        remaining -= n;
    }
    if (!pending_flush(&pending, error))
        result = -1;
out:
    g_free(pending.skip);
    return result;
}

/* Source ranges advised so far, merged while they continue one another in one file, or leave
 * gaps of at most ADVICE_GAP between them: the rows of a tensor split by columns (a row-parallel
 * share: 1.8-9.5 KiB of every 7-37 KiB for Qwen2-7B at TP 4) are then one advice over their span
 * instead of one per row. Row by row, each advice was a page-sized read of its own: a GPU node's
 * cold `tp4pp1/` reader fell from 1.06 to 0.73 GB/s with -o prefetch=32M, its daemon CPU doubled.
 * Up to ADVICE_SPANS spans are kept open at once: a tensor stored split across files (Megatron,
 * torch_dist and FSDP sources), or a row put together from several tensors, is gathered a piece
 * from each in turn. (The gaps are read too, as the kernel's own read-ahead of a file read in
 * such rows would.) */
#define ADVICE_GAP (128u << 10)
#define ADVICE_SPANS 32u

typedef struct {
    uint32_t src;
    uint64_t offset, len; /* len 0: a free slot */
} AdviceSpan;

typedef struct {
    const CkptfsSrcFiles *files;
    AdviceSpan spans[ADVICE_SPANS];
    unsigned next;  /* the slot given up when every one is in use */
    unsigned calls; /* spans advised */
} Advice;

static void span_flush(Advice *a, AdviceSpan *span)
{
    if (span->len == 0)
        return;
    ckptfs_srcfiles_advise(a->files, span->src, span->offset, span->len);
    span->len = 0;
    a->calls++;
}

static void advice_add(Advice *a, uint32_t src, uint64_t offset, uint64_t len)
{
    AdviceSpan *slot = NULL;
    for (unsigned i = 0; i < ADVICE_SPANS; i++) {
        AdviceSpan *span = &a->spans[i];
        if (span->len == 0) {
            slot = slot ? slot : span;
        } else if (span->src == src && offset >= span->offset && offset - span->offset <= span->len + ADVICE_GAP) {
            span->len = MAX(span->len, offset - span->offset + len);
            return;
        }
    }
    if (slot == NULL) {
        slot = &a->spans[a->next];
        a->next = (a->next + 1) % ADVICE_SPANS;
    }
    span_flush(a, slot);
    *slot = (AdviceSpan){src, offset, len};
}

static void advice_finish(Advice *a)
{
    for (unsigned i = 0; i < ADVICE_SPANS; i++)
        span_flush(a, &a->spans[i]);
}

/* X * NUM / DEN rounded down or UP, without overflow (sizes of a view file and its sources). */
static uint64_t muldiv(uint64_t x, uint64_t num, uint64_t den, bool up)
{
    unsigned __int128 p = (unsigned __int128)x * num;
    return (uint64_t)((p + (up ? den - 1 : 0)) / den);
}

/* At most this many spans advised per prefetch (each in chunks of its file's read-ahead). */
#define PREFETCH_MAX_CALLS 4096u

/* The source runs a TRANSPOSE read of bytes [LO, HI) of extent E fetches (transpose_read). */
static void prefetch_strided(Advice *a, const CkptfsExtent *e, uint64_t lo, uint64_t hi)
{
    size_t isz = e->u.strided.elsize;
    CkptfsConvert conv = e->u.strided.convert;
    uint64_t row_bytes = e->u.strided.row_elems *
                         (conv != CKPTFS_CONVERT_NONE ? ckptfs_dtype_size(ckptfs_convert_to(conv)) : isz);
    uint64_t r0 = lo / row_bytes, r1 = (hi - 1) / row_bytes + 1;
    for (uint32_t k = 0; k < e->u.strided.nitems; k++) {
        const CkptfsStridedItem *it = &e->u.strided.items[k];
        if (it->row_stride < it->col_stride) {
            for (uint64_t c = 0; c < it->cols && a->calls < PREFETCH_MAX_CALLS; c++)
                advice_add(a, it->src, it->base + r0 * it->row_stride + c * it->col_stride,
                           run_bytes(r1 - r0, it->row_stride, isz));
        } else {
            for (uint64_t r = r0; r < r1 && a->calls < PREFETCH_MAX_CALLS; r++)
                advice_add(a, it->src, it->base + r * it->row_stride, run_bytes(it->cols, it->col_stride, isz));
        }
    }
}

/* The stored rows an MXFP4 read of bytes [LO, HI) of extent E decodes (mxfp4_read): their groups
 * of its columns, codes and scales. */
static void prefetch_mxfp4(Advice *a, const CkptfsExtent *e, uint64_t lo, uint64_t hi)
{
    const CkptfsMxfp4 *m = e->u.mxfp4.where;
    uint64_t width = e->u.mxfp4.width, groups = m->cols / CKPTFS_MXFP4_GROUP;
    uint64_t j0 = lo / 2 / width, j1 = ((hi + 1) / 2 - 1) / width + 1;
    /* stored rows [k0, k1) and columns [c0, c1) */
    uint64_t k0 = m->transposed ? 0 : j0, k1 = m->transposed ? width : j1;
    uint64_t c0 = m->col0 + (m->transposed ? j0 : 0), c1 = m->col0 + (m->transposed ? j1 : width);
    uint64_t g0 = c0 / CKPTFS_MXFP4_GROUP, g1 = (c1 + CKPTFS_MXFP4_GROUP - 1) / CKPTFS_MXFP4_GROUP;
    for (uint64_t k = k0; k < k1 && a->calls < PREFETCH_MAX_CALLS; k++) {
        uint64_t row = m->row0 + k * m->row_step;
        advice_add(a, m->blocks_src, m->blocks_base + (row * groups + g0) * 16, (g1 - g0) * 16);
        advice_add(a, m->scales_src, m->scales_base + row * groups + g0, g1 - g0);
    }
}

void ckptfs_plan_prefetch(const CkptfsPlan *plan, const CkptfsSrcFiles *files, uint64_t offset, uint64_t len)
{
    if (offset >= plan->size || len == 0)
        return;
    len = MIN(len, plan->size - offset);
    Advice a = {.files = files};
    for (size_t i = find_extent(plan, offset); i < plan->n_extents && plan->extents[i].offset < offset + len; i++) {
        const CkptfsExtent *e = &plan->extents[i];
        if (e->kind == CKPTFS_EXTENT_MXFP4) {
            prefetch_mxfp4(&a, e, MAX(offset, e->offset) - e->offset, MIN(offset + len, e->offset + e->size) - e->offset);
            continue;
        }
        if (e->kind == CKPTFS_EXTENT_TRANSPOSE) {
            prefetch_strided(&a, e, MAX(offset, e->offset) - e->offset, MIN(offset + len, e->offset + e->size) - e->offset);
            continue;
        }
        if (e->kind != CKPTFS_EXTENT_GATHER && e->kind != CKPTFS_EXTENT_CONVERT)
            continue;
        /* Repetitions whose output overlaps the window (a converted one emits out_rep bytes of
         * rep_size source bytes), and within each only the source bytes of that overlap: a run is
         * one repetition of a whole file. */
        uint64_t out_rep = e->size / e->u.gather.nrep, in_rep = e->u.gather.rep_size;
        uint64_t lo = MAX(offset, e->offset) - e->offset, hi = MIN(offset + len, e->offset + e->size) - e->offset;
        for (uint64_t j = lo / out_rep; j <= (hi - 1) / out_rep && a.calls < PREFETCH_MAX_CALLS; j++) {
            uint64_t from = MAX(lo, j * out_rep) - j * out_rep, to = MIN(hi, (j + 1) * out_rep) - j * out_rep;
            uint64_t src_from = muldiv(from, in_rep, out_rep, false), src_to = muldiv(to, in_rep, out_rep, true);
            uint64_t pos = 0;
            for (uint32_t k = 0; k < e->u.gather.nitems && pos < src_to; k++) {
                const CkptfsGatherItem *item = &e->u.gather.items[k];
                uint64_t a0 = MAX(pos, src_from), a1 = MIN(pos + item->len, src_to);
                if (a0 < a1)
                    advice_add(&a, item->src, item->base + j * item->stride + (a0 - pos), a1 - a0);
                pos += item->len;
            }
        }
    }
    advice_finish(&a);
}

static void add_source_once(GArray *indexes, guint32 src)
{
    for (guint j = 0; j < indexes->len; j++)
        if (g_array_index(indexes, guint32, j) == src)
            return;
    g_array_append_val(indexes, src);
}

void ckptfs_plan_sources(const CkptfsPlan *plan, GArray *out_indexes)
{
    for (size_t i = 0; i < plan->n_extents; i++) {
        const CkptfsExtent *e = &plan->extents[i];
        if (e->kind == CKPTFS_EXTENT_TRANSPOSE)
            for (uint32_t k = 0; k < e->u.strided.nitems; k++)
                add_source_once(out_indexes, e->u.strided.items[k].src);
        if (e->kind == CKPTFS_EXTENT_MXFP4) {
            add_source_once(out_indexes, e->u.mxfp4.where->blocks_src);
            add_source_once(out_indexes, e->u.mxfp4.where->scales_src);
        }
        if (e->kind != CKPTFS_EXTENT_GATHER && e->kind != CKPTFS_EXTENT_CONVERT)
            continue;
        if (e->kind == CKPTFS_EXTENT_CONVERT && e->u.gather.scale != NULL)
            add_source_once(out_indexes, e->u.gather.scale->src);
        for (uint32_t k = 0; k < e->u.gather.nitems; k++)
            add_source_once(out_indexes, e->u.gather.items[k].src);
    }
}

int64_t ckptfs_plan_identical_file(const CkptfsPlan *plan, const CkptfsSrcFiles *files)
{
    if (plan->n_extents != 1 || plan->extents[0].kind != CKPTFS_EXTENT_GATHER)
        return -1;
    const CkptfsExtent *e = &plan->extents[0];
    if (e->u.gather.nrep != 1 || e->u.gather.nitems != 1 || e->u.gather.items[0].base != 0)
        return -1;
    uint32_t src = e->u.gather.items[0].src;
    const CkptfsSrcFile *file = ckptfs_srcfiles_get(files, src);
    if (file == NULL || file->size != plan->size || !ckptfs_srcfiles_as_stored(files, src))
        return -1;
    return src;
}
