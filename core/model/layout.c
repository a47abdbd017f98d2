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
                      .pp_first = base->pp_first, .pp_last = base->pp_last};
    const char *p = name;
    bool any = false;
    unsigned v;
    if (take_part(&p, "tp", &v)) {
        l.tp = v;
        l.pp = 1;
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
    if (!any || *p != '\0')
        return false;
    *out = l;
    return true;
}

char *ckptfs_layout_name(const CkptfsLayout *layout)
{
    if (layout->vpp > 1)
        return g_strdup_printf("tp%upp%uvpp%u", layout->tp, layout->pp, layout->vpp);
    return g_strdup_printf("tp%upp%u", layout->tp, layout->pp);
}

#define INVALID(...)                                                                          \
    do {                                                                                      \
        g_autofree char *name_ = ckptfs_layout_name(layout);                                  \
        g_autofree char *why_ = g_strdup_printf(__VA_ARGS__);                                 \
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "layout %s: %s", name_, why_); \
        return false;                                                                         \
    } while (0)

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
    if (model->ffn % t != 0)
        INVALID("tp %u does not divide ffn_hidden_size %" G_GUINT64_FORMAT, t, model->ffn);
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
