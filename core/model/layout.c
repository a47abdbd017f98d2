#include "ckptfs/layout.h"

#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"

/* Reads "<prefix><number>" at *P; advances past it. */
static bool take_part(const char **p, const char *prefix, unsigned *out)
{
    size_t n = strlen(prefix);
    if (strncmp(*p, prefix, n) != 0 || (*p)[n] < '1' || (*p)[n] > '9')
        return false;
    char *end;
    unsigned long v = strtoul(*p + n, &end, 10);
    if (v == 0 || v > 4096)
        return false;
    *out = (unsigned)v;
    *p = end;
    return true;
}

bool ckptfs_layout_parse(const char *name, const CkptfsLayout *base, CkptfsLayout *out)
{
    CkptfsLayout l = {.tp = base->tp, .pp = base->pp, .vpp = 1,
                      .pp_first = base->pp_first, .pp_last = base->pp_last,
                      .ep = base->ep, .etp = base->etp};
    const char *p = name;
    bool any = false;
    unsigned v;
    if (take_part(&p, "tp", &v)) {
        /* a named tp starts from tp{T}pp1, expert parallelism off */
        l.tp = v;
        l.pp = 1;
        l.ep = l.etp = 0;
        any = true;
    }
    /* "vpp" must not be read as "v" + "pp". */
    if (strncmp(p, "vpp", 3) != 0 && take_part(&p, "pp", &v)) {
        l.pp = v;
        any = true;
    }
    if (take_part(&p, "vpp", &v)) {
        l.vpp = v;
        any = true;
    }
    if (take_part(&p, "ep", &v)) {
        l.ep = v;
        any = true;
    }
    if (take_part(&p, "etp", &v)) {
        l.etp = v;
        any = true;
    }
    if (!any || *p != '\0')
        return false;
    *out = l;
    return true;
}

unsigned ckptfs_layout_ep(const CkptfsLayout *layout)
{
    return layout->ep ? layout->ep : 1;
}

unsigned ckptfs_layout_etp(const CkptfsLayout *layout)
{
    return layout->etp ? layout->etp : layout->tp;
}

char *ckptfs_layout_name(const CkptfsLayout *layout)
{
    GString *name = g_string_new(NULL);
    g_string_printf(name, "tp%upp%u", layout->tp, layout->pp);
    if (layout->vpp > 1)
        g_string_append_printf(name, "vpp%u", layout->vpp);
    if (ckptfs_layout_ep(layout) > 1)
        g_string_append_printf(name, "ep%u", ckptfs_layout_ep(layout));
    if (ckptfs_layout_etp(layout) != layout->tp)
        g_string_append_printf(name, "etp%u", ckptfs_layout_etp(layout));
    return g_string_free(name, FALSE);
}

/* Every rank of one stage that writes a legacy file, in rank order (names may repeat). */
static GArray *writers(const CkptfsLayout *layout)
{
    GArray *out = g_array_new(FALSE, FALSE, sizeof(CkptfsRankFile));
    uint64_t tp = layout->tp, ep = ckptfs_layout_ep(layout), etp = ckptfs_layout_etp(layout);
    /* In a world of lcm(tp, etp x ep) ranks per stage, dense DP rank 0 is g < tp and expert
     * DP rank 0 is g < etp x ep. */
    uint64_t expert_grid = etp * ep, world = MAX(tp, expert_grid);
    for (uint64_t g = 0; g < world; g++) {
        CkptfsRankFile f = {(unsigned)(g % tp), (unsigned)(g / etp % ep), (unsigned)(g % etp)};
        g_array_append_val(out, f);
    }
    return out;
}

#define INVALID(...)                                                                          \
    do {                                                                                      \
        g_autofree char *name_ = ckptfs_layout_name(layout);                                  \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "layout %s: %s", name_, why_); \
        return false;                                                                         \
    } while (0)

static uint64_t gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t r = a % b;
        a = b;
        b = r;
    }
    return a;
}

/* Ranks per stage of the smallest world that tiles both the dense and the expert grid. */
static uint64_t stage_world(const CkptfsLayout *layout)
{
    uint64_t tp = layout->tp, expert_grid = (uint64_t)ckptfs_layout_etp(layout) * ckptfs_layout_ep(layout);
    return tp / gcd(tp, expert_grid) * expert_grid;
}

/* The expert TP shard each writer's file holds, by file name (TP rank << 32 | EP rank), plus 1;
 * NULL when two writers of one name hold different shards. */
static GHashTable *writer_shards(const CkptfsLayout *layout)
{
    g_autoptr(GArray) all = writers(layout);
    GHashTable *shard_of = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL);
    for (guint i = 0; i < all->len; i++) {
        const CkptfsRankFile *f = &g_array_index(all, CkptfsRankFile, i);
        gint64 name = (gint64)f->tp << 32 | f->ep;
        gpointer seen = g_hash_table_lookup(shard_of, &name);
        if (seen && GPOINTER_TO_UINT(seen) != f->etp + 1) {
            g_hash_table_unref(shard_of);
            return NULL;
        }
        g_hash_table_insert(shard_of, g_memdup2(&name, sizeof name), GUINT_TO_POINTER(f->etp + 1));
    }
    return shard_of;
}

bool ckptfs_layout_loadable(const CkptfsLayout *layout, GError **error)
{
    g_autoptr(GHashTable) shard_of = writer_shards(layout);
    if (shard_of == NULL)
        return true; /* ckptfs_layout_validate refuses it */
    uint64_t tp = layout->tp, ep = ckptfs_layout_ep(layout), etp = ckptfs_layout_etp(layout);
    uint64_t world = stage_world(layout);
    if (world > 65536)
        INVALID("tp %u with etp %u x ep %u needs a world of %" G_GUINT64_FORMAT " GPUs per stage, more "
                "than ckptfs lays out (65536)", layout->tp, (unsigned)etp, (unsigned)ep, world);
    for (uint64_t g = MAX(tp, etp * ep); g < world; g++) {
        gint64 name = (gint64)(g % tp) << 32 | (g / etp % ep);
        gpointer shard = g_hash_table_lookup(shard_of, &name);
        if (shard == NULL)
            INVALID("tp %u with etp %u x ep %u: in a world of %" G_GUINT64_FORMAT " GPUs per stage (the "
                    "least both grids tile) rank %" G_GUINT64_FORMAT " would load mp_rank_%02u with EP rank "
                    "%u, which no rank writes (Megatron writes on expert data-parallel rank 0); torch_dist "
                    "(mcore/) holds any split",
                    layout->tp, (unsigned)etp, (unsigned)ep, world, g, (unsigned)(g % tp),
                    (unsigned)(g / etp % ep));
        if (GPOINTER_TO_UINT(shard) != g % etp + 1)
            INVALID("tp %u with etp %u x ep %u: in a world of %" G_GUINT64_FORMAT " GPUs per stage (the "
                    "least both grids tile) rank %" G_GUINT64_FORMAT " would load expert TP shard %u from "
                    "mp_rank_%02u, which holds shard %u; torch_dist (mcore/) holds any split",
                    layout->tp, (unsigned)etp, (unsigned)ep, world, g, (unsigned)(g % etp),
                    (unsigned)(g % tp), GPOINTER_TO_UINT(shard) - 1);
    }
    return true;
}

GArray *ckptfs_layout_rank_files(const CkptfsLayout *layout)
{
    GArray *all = writers(layout);
    g_autoptr(GHashTable) named = g_hash_table_new(g_int64_hash, g_int64_equal);
    g_autofree gint64 *names = g_new(gint64, all->len);
    guint kept = 0;
    for (guint i = 0; i < all->len; i++) {
        const CkptfsRankFile f = g_array_index(all, CkptfsRankFile, i);
        names[i] = (gint64)f.tp << 32 | f.ep;
        if (g_hash_table_add(named, &names[i]))
            g_array_index(all, CkptfsRankFile, kept++) = f;
    }
    g_array_set_size(all, kept);
    return all;
}

char *ckptfs_rank_file_dir(const CkptfsLayout *layout, unsigned pp_rank, const CkptfsRankFile *file)
{
    GString *name = g_string_new(NULL);
    g_string_printf(name, "mp_rank_%02u", file->tp);
    if (layout->pp > 1)
        g_string_append_printf(name, "_%03u", pp_rank);
    if (ckptfs_layout_ep(layout) > 1)
        g_string_append_printf(name, "_%03u", file->ep);
    return g_string_free(name, FALSE);
}

/* Stage kinds under Megatron's uneven pipeline rules: a first/last stage with its own layer
 * count when set, every other stage a "middle" one sharing the rest evenly. */
typedef struct {
    uint64_t first, last;  /* layers on the first / last stage (0 = a middle stage) */
    uint64_t middle_stages, middle_layers;
} StagePlan;

static StagePlan stage_plan(const CkptfsLayout *layout, const CkptfsModel *model)
{
    StagePlan s = {.first = layout->pp > 1 ? layout->pp_first : 0,
                   .last = layout->pp > 1 ? layout->pp_last : 0};
    s.middle_stages = layout->pp - (s.first ? 1 : 0) - (s.last ? 1 : 0);
    s.middle_layers = model->layers - s.first - s.last;
    return s;
}

bool ckptfs_layout_validate(const CkptfsLayout *layout, const CkptfsModel *model, GError **error)
{
    unsigned t = layout->tp;
    if (model->kv_heads % t != 0 && t % model->kv_heads != 0)
        INVALID("tp %u neither divides nor is a multiple of the %" G_GUINT64_FORMAT
                " query groups (num_key_value_heads)",
                t, model->kv_heads);
    if (model->heads % t != 0)
        INVALID("tp %u does not divide the %" G_GUINT64_FORMAT " attention heads", t, model->heads);
    /* With tp above the query groups, ColumnParallelLinear still splits the fused rows evenly. */
    uint64_t qkv_rows = (model->heads + 2 * model->kv_heads) * model->head_dim;
    if (!model->mla && qkv_rows % t != 0)
        INVALID("tp %u does not divide the %" G_GUINT64_FORMAT " rows of the fused q/k/v weight "
                "((%" G_GUINT64_FORMAT " heads + 2 x %" G_GUINT64_FORMAT " query groups) x head_dim %"
                G_GUINT64_FORMAT ")", t, qkv_rows, model->heads, model->kv_heads, model->head_dim);
    if (model->ffn % t != 0 && ckptfs_model_moe_layers(model) < model->layers)
        INVALID("tp %u does not divide ffn_hidden_size %" G_GUINT64_FORMAT, t, model->ffn);
    unsigned ep = ckptfs_layout_ep(layout), etp = ckptfs_layout_etp(layout);
    if (model->experts == 0 && (ep > 1 || etp != t))
        INVALID("the model has no experts; ep and etp apply to mixture-of-experts models");
    if (model->experts % ep != 0)
        INVALID("ep %u does not divide the %" G_GUINT64_FORMAT " experts", ep, model->experts);
    if (model->experts && model->moe_ffn % etp != 0)
        INVALID("etp %u does not divide the experts' ffn size %" G_GUINT64_FORMAT, etp, model->moe_ffn);
    if (model->shared_ffn % t != 0)
        INVALID("tp %u does not divide the shared expert's ffn size %" G_GUINT64_FORMAT, t, model->shared_ffn);
    if ((uint64_t)etp * ep > 65536)
        INVALID("etp %u x ep %u is more GPUs per stage than ckptfs lays out (65536)", etp, ep);
    g_autoptr(GHashTable) shards = writer_shards(layout);
    if (shards == NULL)
        /* Two writers of one (TP rank, EP rank) file with different expert shards: the legacy
         * format has no name for the expert TP rank, so a share would be lost. */
        INVALID("etp %u with tp %u: two ranks holding different expert shards would write the same "
                "legacy rank file (named by TP and EP rank only)", etp, t);
    if (layout->pp > model->layers)
        INVALID("pp %u is more than the %" G_GUINT64_FORMAT " layers", layout->pp, model->layers);
    if (layout->vpp > 1 && layout->pp == 1)
        INVALID("vpp needs pp > 1");
    if (layout->pp == 1 && (layout->pp_first || layout->pp_last))
        INVALID("pp_first/pp_last need pp > 1");
    StagePlan s = stage_plan(layout, model);
    if (s.first + s.last > model->layers)
        INVALID("pp_first %u + pp_last %u is more than the %" G_GUINT64_FORMAT " layers",
                layout->pp_first, layout->pp_last, model->layers);
    unsigned v = layout->vpp;
    if (s.first % v || s.last % v)
        INVALID("vpp %u does not divide the layers of the first/last stage", v);
    if (s.middle_stages == 0 && s.middle_layers != 0)
        INVALID("%" G_GUINT64_FORMAT " layers left for no middle stage", s.middle_layers);
    if (s.middle_stages > 0 && s.middle_layers % (s.middle_stages * v) != 0) {
        if (!layout->pp_first && !layout->pp_last)
            INVALID("pp %u x vpp %u does not divide the %" G_GUINT64_FORMAT " layers", layout->pp,
                    v, model->layers);
        INVALID("the %" G_GUINT64_FORMAT " layers between the first and last stage do not split "
                "evenly over %" G_GUINT64_FORMAT " stages x vpp %u",
                s.middle_layers, s.middle_stages, v);
    }
    if (s.middle_stages > 0 && s.middle_layers == 0)
        INVALID("a middle stage would hold no layers");
    return true;
}

void ckptfs_layout_chunk_layers(const CkptfsLayout *layout, const CkptfsModel *model, unsigned p,
                                unsigned v, uint64_t *first, uint64_t *count)
{
    StagePlan s = stage_plan(layout, model);
    unsigned V = layout->vpp;
    uint64_t first_chunk = s.first / V, last_chunk = s.last / V;
    uint64_t middle_chunk = s.middle_stages ? s.middle_layers / (V * s.middle_stages) : 0;
    /* One round of virtual chunks covers every stage once: model->layers / V layers. */
    uint64_t round = model->layers / V;
    uint64_t offset = v * round;
    bool is_first = p == 0 && s.first, is_last = p == layout->pp - 1 && s.last;
    if (is_first) {
        *count = first_chunk;
    } else {
        unsigned middle_index = p - (s.first ? 1 : 0);
        offset += first_chunk + middle_index * middle_chunk;
        *count = is_last ? last_chunk : middle_chunk;
    }
    *first = offset;
}

uint64_t ckptfs_padded_vocab(uint64_t vocab, unsigned divisible_by, unsigned tp)
{
    uint64_t multiple = (uint64_t)divisible_by * tp;
    return (vocab + multiple - 1) / multiple * multiple;
}
