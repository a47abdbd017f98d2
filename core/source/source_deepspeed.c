/* DeepSpeed ZeRO checkpoints (stages 1, 2 and 3) as a source: what the engine's save_checkpoint
 * writes into a tag directory (global_stepN/, named by the `latest` file beside it), as the
 * Hugging Face Trainer and OpenRLHF leave it. hf/ serves what DeepSpeed's zero_to_fp32.py writes:
 * the fp32 master weights each rank keeps of its partition of the flattened parameters, put back
 * together by the same rules, plus the buffers, the frozen parameters and the shared ones the
 * model states record. Every tensor becomes pieces of the ranks' files in place; only the
 * pickles are read. The bf16 module copy, the optimizer's moments and the scheduler are never
 * read.
 *
 * Stages 1 and 2: each param group is flattened in param_shapes' order, padded to a multiple of
 * 2 x world size and cut into equal partitions; rank R saves single_partition_of_fp32_groups[g],
 * its partition with the padding removed. Concatenated in rank order they give the group's
 * parameters one after another.
 * Stage 3: every parameter is cut into ceil(numel / world) elements per rank (the last padded);
 * rank R's fp32_flat_groups hold its part of each parameter one after another. */
#include <string.h>


#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/pickle.h"
#include "ckptfs/readfile.h"
#include "ckptfs/zipreader.h"
#include "source_internal.h"

#define TAG_FILE "latest"
#define TAG_MAX_BYTES 4096
#define MODEL_STATES_12 "mp_rank_00_model_states.pt"
#define MODEL_STATES_3 "zero_pp_rank_0_mp_rank_00_model_states.pt"
#define OPTIM_SUFFIX "_optim_states.pt"
/* World sizes above this are refused before anything is allocated per rank. */
#define MAX_WORLD_SIZE (1u << 20)

/* Elements lying one after another in a source file. */
typedef struct {
    uint32_t src;
    uint64_t offset; /* of the first element, in the file */
    uint64_t numel;
} Run;

/* A flat vector as runs of files: a ZeRO-1/2 group over the ranks, a ZeRO-3 rank's groups. */
typedef struct {
    GArray *runs; /* Run */
    uint64_t numel;
} Flat;

/* One .pt file of the tag directory, parsed. */
typedef struct {
    char *path;
    uint32_t src;
    CkptfsZip *zip;
    CkptfsPickle *pickle;
    const CkptfsPy *root;
} PtFile;

typedef struct {
    CkptfsSource *source;
    const CkptfsOptions *options;
    GError **error;
    char *tag_dir;        /* global_stepN/ */
    char *checkpoint_dir; /* where config.json and the tokenizer are */
    bool tag_from_file;   /* named by `latest` */
    unsigned stage, world;
    const char *prefix;   /* of the optimizer files: "", "bf16_" or "fp16_" */
    PtFile *optim;        /* [world] */
    PtFile *model;        /* [1] (stages 1, 2) or [world] (stage 3) */
    unsigned nmodel;
    Flat *flats;          /* stages 1, 2: one per group; stage 3: one per rank */
    unsigned nflats, groups;
    CkptfsDtype master;   /* element type of the fp32 groups */
    CkptfsDtype listed_dtypes[4];
    unsigned trainable, frozen, buffers, shared;
    uint64_t elements;
    bool tied;            /* config.json says tie_word_embeddings: lm_head.weight left out */
    bool wrapped;         /* names under a wrapper's WRAPPER_PREFIX (OpenRLHF's Actor holds the
                             Hugging Face model as .model): served without it */
} Ds;

#define WRAPPER_PREFIX "model."

#define fail(d, ...) ckptfs_fail((d)->error, __VA_ARGS__)

static bool has_file(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, G_FILE_TEST_IS_REGULAR);
}

static bool is_tag_dir(const char *dir)
{
    return has_file(dir, MODEL_STATES_12) || has_file(dir, MODEL_STATES_3);
}

/* Printable UTF-8 text (names are printed in messages and served in headers). */
static bool printable_text(const char *text)
{
    bool printable = text != NULL && text[0] != '\0' && g_utf8_validate(text, -1, NULL);
    for (const char *p = text; printable && *p; p++)
        printable = (unsigned char)*p >= 0x20 && *p != 0x7f;
    return printable;
}

/* The tag `latest` names, checked to be one directory name; NULL with an error otherwise. */
static char *read_tag(const char *dir, GError **error)
{
    g_autofree char *path = g_build_filename(dir, TAG_FILE, NULL);
    g_autofree char *text = NULL;
    size_t len = 0;
    /* A `latest` that is a device, a FIFO or huge is never read whole. */
    if (!ckptfs_read_small_file(path, TAG_MAX_BYTES, &text, &len, NULL)) {
        ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: unreadable or over %d bytes (it names the tag directory)",
                    path, TAG_MAX_BYTES);
        return NULL;
    }
    g_strstrip(text);
    if (!printable_text(text) || strchr(text, '/') || strcmp(text, ".") == 0 || strcmp(text, "..") == 0) {
        g_autofree char *shown = g_strescape(text, NULL);
        ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "%s: '%s' is not the name of a tag directory beside it", path, shown);
        return NULL;
    }
    return g_steal_pointer(&text);
}

static bool probe_deepspeed(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    if (is_tag_dir(dir))
        return true;
    /* A `latest` that names no directory, or a missing one, is still DeepSpeed's: open says
     * what is wrong. One naming a directory of something else is not. */
    if (!has_file(dir, TAG_FILE))
        return false;
    g_autofree char *tag = read_tag(dir, NULL);
    g_autofree char *tag_dir = tag ? g_build_filename(dir, tag, NULL) : NULL;
    return tag_dir == NULL || is_tag_dir(tag_dir) || !g_file_test(tag_dir, G_FILE_TEST_EXISTS);
}

/* --- files and pickled values --- */

static bool open_pt(Ds *d, const char *path, PtFile *f)
{
    f->path = g_strdup(path);
    int src = ckptfs_srcfiles_add(d->source->files, path, d->error);
    if (src < 0)
        return false;
    f->src = (uint32_t)src;
    if ((f->zip = ckptfs_zip_open(d->source->files, f->src, d->error)) == NULL)
        return false;
    GBytes *pkl = ckptfs_zip_read(f->zip, d->source->files, "data.pkl", CKPTFS_MAX_RANK_PICKLE_BYTES, d->error);
    if (pkl == NULL)
        return false;
    gsize n;
    const uint8_t *data = g_bytes_get_data(pkl, &n);
    g_autofree char *what = g_strdup_printf("%s: data.pkl", path);
    f->pickle = ckptfs_pickle_parse(what, data, n, d->error);
    g_bytes_unref(pkl);
    if (f->pickle == NULL)
        return false;
    f->root = ckptfs_pickle_root(f->pickle);
    if (f->root->kind != CKPTFS_PY_DICT)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: data.pkl holds no dict (DeepSpeed saves a dict of states)", path);
    return true;
}

static void close_pt(PtFile *f)
{
    ckptfs_pickle_free(f->pickle);
    ckptfs_zip_free(f->zip);
    g_free(f->path);
}

static const CkptfsPy *item(const CkptfsPy *list, guint i)
{
    return list && (list->kind == CKPTFS_PY_TUPLE || list->kind == CKPTFS_PY_LIST) && i < list->items->len
               ? g_ptr_array_index(list->items, i)
               : NULL;
}

static guint length(const CkptfsPy *list)
{
    return list && (list->kind == CKPTFS_PY_TUPLE || list->kind == CKPTFS_PY_LIST) ? list->items->len : 0;
}

static bool small_int(const CkptfsPy *v, int64_t *out)
{
    if (v == NULL || v->kind != CKPTFS_PY_INT || v->big || v->i < 0)
        return false;
    *out = v->i;
    return true;
}

/* An int, or an enum member pickled as its class applied to one (ZeroStageEnum.gradients). */
static bool int_or_enum(const CkptfsPy *v, int64_t *out)
{
    if (v && v->kind == CKPTFS_PY_OBJECT && v->callable && v->callable->kind == CKPTFS_PY_GLOBAL &&
        length(v->args) == 1)
        return small_int(item(v->args, 0), out);
    return small_int(v, out);
}

/* Where TENSOR's elements are in F: one run (a contiguous tensor inside its storage record),
 * its element type and shape. WHAT names it in errors. */
static bool tensor_run(Ds *d, const PtFile *f, const CkptfsPy *tensor, const char *what, Run *run,
                       CkptfsDtype *dtype, uint64_t *shape, unsigned *ndim)
{
    if (tensor == NULL || tensor->kind != CKPTFS_PY_TENSOR)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s is not a tensor", f->path, what);
    const CkptfsPyTensor *t = tensor->tensor;
    if (t->dtype == CKPTFS_DTYPE_INVALID)
        return fail(d, CKPTFS_ERROR_UNSUPPORTED, "%s: %s has an element type ckptfs does not know", f->path, what);
    uint64_t numel = 1, want = 1;
    for (unsigned i = t->ndim; i-- > 0;) {
        if (t->shape[i] != 1 && t->stride[i] != want)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s is not contiguous", f->path, what);
        if (!ckptfs_mul_u64(want, t->shape[i], &want))
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s: its size overflows 64 bits", f->path, what);
    }
    numel = want;
    g_autofree char *record = g_strdup_printf("data/%s", t->storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(f->zip, record);
    size_t isz = ckptfs_dtype_size(t->dtype);
    uint64_t end_el, end;
    if (e == NULL)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s: its storage record %s is missing", f->path, what, record);
    if (!ckptfs_add_u64(t->offset, numel, &end_el) || end_el > t->storage_numel ||
        !ckptfs_mul_u64(end_el, isz, &end) || end > e->size)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s: %" G_GUINT64_FORMAT " elements from offset %" G_GUINT64_FORMAT
                    " lie outside its storage (%" G_GUINT64_FORMAT " elements, record %s of %" G_GUINT64_FORMAT
                    " bytes)", f->path, what, numel, t->offset, t->storage_numel, record, e->size);
    *run = (Run){.src = f->src, .offset = e->data_offset + t->offset * isz, .numel = numel};
    *dtype = t->dtype;
    if (shape) {
        memcpy(shape, t->shape, sizeof t->shape);
        *ndim = t->ndim;
    }
    return true;
}

/* --- pieces --- */

/* Elements [DEST0, DEST0 + RUN.numel) of a row-major tensor of COLS columns, stored one after
 * another at RUN: up to three rectangles (the rest of a first row, whole rows, the start of a
 * last row). */
static void run_pieces(const Run *run, uint64_t dest0, uint64_t cols, size_t isz, GArray *pieces)
{
    uint64_t at = dest0, end = dest0 + run->numel, offset = run->offset;
    while (at < end) {
        uint64_t row = at / cols, col = at % cols;
        uint64_t rows = col == 0 ? (end - at) / cols : 0;
        CkptfsPiece p = {.src = run->src, .offset = offset, .row_stride = cols * isz, .row0 = row};
        if (rows > 0) { /* whole rows */
            p.row1 = row + rows, p.col0 = 0, p.col1 = cols;
        } else { /* part of one row */
            p.row1 = row + 1, p.col0 = col, p.col1 = MIN(cols, col + (end - at));
            rows = 0;
        }
        uint64_t n = (p.row1 - p.row0) * (p.col1 - p.col0);
        g_array_append_val(pieces, p);
        at += n;
        offset += n * isz;
    }
}

/* Elements [START, START + COUNT) of FLAT as elements from DEST0 of a tensor of COLS columns. */
static void flat_pieces(const Flat *flat, uint64_t start, uint64_t count, uint64_t dest0, uint64_t cols, size_t isz,
                        GArray *pieces)
{
    uint64_t run_start = 0;
    for (guint i = 0; i < flat->runs->len && count > 0; i++) {
        const Run *r = &g_array_index(flat->runs, Run, i);
        uint64_t run_end = run_start + r->numel;
        if (start < run_end) {
            uint64_t skip = start - run_start, n = MIN(count, r->numel - skip);
            Run part = {.src = r->src, .offset = r->offset + skip * isz, .numel = n};
            run_pieces(&part, dest0, cols, isz, pieces);
            start += n, dest0 += n, count -= n;
        }
        run_start = run_end;
    }
}

static uint64_t columns(const uint64_t *shape, unsigned ndim)
{
    uint64_t cols = 1;
    for (unsigned i = 1; i < ndim; i++)
        cols *= shape[i]; /* bounded: numel was computed without overflow */
    return cols;
}

static void note_dtype(Ds *d, CkptfsDtype dtype)
{
    for (unsigned i = 0; i < G_N_ELEMENTS(d->listed_dtypes); i++) {
        if (d->listed_dtypes[i] == dtype)
            return;
        if (d->listed_dtypes[i] == CKPTFS_DTYPE_INVALID) {
            d->listed_dtypes[i] = dtype;
            return;
        }
    }
}

/* NAME as hf/ serves it. */
static const char *served_name(const Ds *d, const char *name)
{
    return d->wrapped && g_str_has_prefix(name, WRAPPER_PREFIX) ? name + strlen(WRAPPER_PREFIX) : name;
}

static bool add_tensor(Ds *d, const char *name, CkptfsDtype dtype, unsigned ndim, const uint64_t *shape,
                       GArray *pieces, const char *from)
{
    name = served_name(d, name);
    if (d->tied && strcmp(name, "lm_head.weight") == 0)
        return true; /* save_pretrained leaves a tied head out */
    if (!ckptfs_catalog_add_pieces(d->source->catalog, name, dtype, ndim, shape,
                                   (const CkptfsPiece *)(void *)pieces->data, pieces->len, d->error)) {
        g_prefix_error(d->error, "%s: ", from);
        return false;
    }
    note_dtype(d, dtype);
    return true;
}

/* A shape as param_shapes pickles it (torch.Size), its element count checked. */
static bool read_shape(Ds *d, const PtFile *f, const char *what, const char *name, const CkptfsPy *v,
                       uint64_t *shape, unsigned *ndim, uint64_t *numel)
{
    if (!ckptfs_py_dims(v, shape, ndim) || !ckptfs_dims_product(shape, *ndim, numel))
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s['%s'] is not a shape ckptfs can read (at most %d dims)", f->path,
                    what, name, CKPTFS_MAX_DIMS);
    return true;
}

static const char *entry_name(Ds *d, const PtFile *f, const char *what, const CkptfsPy *key)
{
    const char *name = ckptfs_py_str(key);
    if (!printable_text(name)) {
        fail(d, CKPTFS_ERROR_FORMAT, "%s: a key of %s is not a parameter name", f->path, what);
        return NULL;
    }
    return name;
}

/* --- the optimizer files --- */

/* R of "[bf16_|fp16_]zero_pp_rank_R_mp_rank_TT_optim_states.pt", or -1; *MP gets TT. */
static int64_t optim_rank(const char *name, const char **prefix, int64_t *mp)
{
    static const char *const prefixes[] = {"bf16_", "fp16_", ""};
    for (size_t i = 0; i < G_N_ELEMENTS(prefixes); i++) {
        g_autofree char *head = g_strconcat(prefixes[i], "zero_pp_rank_", NULL);
        if (!g_str_has_prefix(name, head) || !g_str_has_suffix(name, OPTIM_SUFFIX))
            continue;
        const char *p = name + strlen(head);
        char *end;
        if (!g_ascii_isdigit(*p))
            return -1;
        guint64 r = g_ascii_strtoull(p, &end, 10);
        if (!g_str_has_prefix(end, "_mp_rank_") || !g_ascii_isdigit(end[strlen("_mp_rank_")]))
            return -1;
        *mp = (int64_t)g_ascii_strtoull(end + strlen("_mp_rank_"), &end, 10);
        if (strcmp(end, OPTIM_SUFFIX) != 0)
            return -1;
        *prefix = prefixes[i];
        return r > MAX_WORLD_SIZE ? MAX_WORLD_SIZE : (int64_t)r;
    }
    return -1;
}

static const CkptfsPy *optim_states(Ds *d, const PtFile *f)
{
    const CkptfsPy *osd = ckptfs_py_dict_get(f->root, "optimizer_state_dict");
    if (osd == NULL || osd->kind != CKPTFS_PY_DICT) {
        fail(d, CKPTFS_ERROR_FORMAT, "%s: no optimizer_state_dict (not a DeepSpeed ZeRO optimizer file)", f->path);
        return NULL;
    }
    return osd;
}

/* The stage and world size a rank's file says: zero_stage, and partition_count (one per group
 * in stages 1 and 2, one in stage 3), every group's the same. */
static bool read_stage(Ds *d, const PtFile *f, unsigned *stage, unsigned *world)
{
    const CkptfsPy *osd = optim_states(d, f);
    if (osd == NULL)
        return false;
    int64_t s;
    if (!int_or_enum(ckptfs_py_dict_get(osd, "zero_stage"), &s))
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: optimizer_state_dict has no zero_stage (not a ZeRO checkpoint)",
                    f->path);
    if (s < 1 || s > 3)
        return fail(d, CKPTFS_ERROR_UNSUPPORTED, "%s: zero_stage %" G_GINT64_FORMAT " (ckptfs reads stages 1, 2 and 3)",
                    f->path, s);
    const CkptfsPy *pc = ckptfs_py_dict_get(osd, "partition_count");
    int64_t w = -1, one;
    for (guint g = 0; g < MAX(length(pc), 1); g++) {
        if (!small_int(length(pc) ? item(pc, g) : pc, &one) || one < 1 || one > MAX_WORLD_SIZE)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: partition_count is not a world size (a positive int or one "
                        "per param group)", f->path);
        if (w >= 0 && one != w)
            return fail(d, CKPTFS_ERROR_UNSUPPORTED, "%s: partition_count differs between param groups (%" G_GINT64_FORMAT
                        " and %" G_GINT64_FORMAT ": expert groups of a MoE run); ckptfs reads one data-parallel world",
                        f->path, w, one);
        w = one;
    }
    *stage = (unsigned)s, *world = (unsigned)w;
    return true;
}

/* The optimizer files: rank 0's says the stage and world size, every rank 0..W-1 must be
 * there, and each must say the same. */
static bool open_optim(Ds *d)
{
    g_autoptr(GDir) dir = g_dir_open(d->tag_dir, 0, d->error);
    if (dir == NULL)
        return false;
    g_autoptr(GHashTable) by_rank = g_hash_table_new_full(g_direct_hash, g_direct_equal, NULL, g_free);
    const char *name, *prefix = NULL;
    int64_t max_rank = -1;
    while ((name = g_dir_read_name(dir)) != NULL) {
        int64_t mp = 0;
        const char *p = NULL;
        int64_t r = optim_rank(name, &p, &mp);
        if (r < 0)
            continue;
        if (mp != 0)
            return fail(d, CKPTFS_ERROR_UNSUPPORTED, "%s/%s: a model-parallel rank file (mp_rank %" G_GINT64_FORMAT
                        "); ckptfs reads ZeRO checkpoints of one model-parallel rank", d->tag_dir, name, mp);
        if (prefix && strcmp(prefix, p) != 0)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s/%s: optimizer files of two kinds ('%szero_pp_rank_*' and '%s"
                        "zero_pp_rank_*')", d->tag_dir, name, prefix, p);
        prefix = p;
        g_hash_table_insert(by_rank, GINT_TO_POINTER(r + 1), g_build_filename(d->tag_dir, name, NULL));
        max_rank = MAX(max_rank, r);
    }
    if (prefix == NULL)
        return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s: no *" OPTIM_SUFFIX " files (the ZeRO optimizer states hold the "
                    "fp32 weights)", d->tag_dir);
    d->prefix = prefix;
    const char *first = g_hash_table_lookup(by_rank, GINT_TO_POINTER(1));
    g_autofree char *first_name = g_strdup_printf("%s/%szero_pp_rank_0_mp_rank_00" OPTIM_SUFFIX, d->tag_dir, prefix);
    if (first == NULL)
        return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s: missing (rank 0's optimizer states)", first_name);
    PtFile rank0 = {0};
    bool ok = open_pt(d, first, &rank0) && read_stage(d, &rank0, &d->stage, &d->world);
    if (!ok) {
        close_pt(&rank0);
        return false;
    }
    d->optim = g_new0(PtFile, d->world);
    d->optim[0] = rank0;
    if ((uint64_t)max_rank >= d->world) {
        const char *extra = g_hash_table_lookup(by_rank, GINT_TO_POINTER(max_rank + 1));
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: rank %" G_GINT64_FORMAT " of a world of %u (partition_count of %s); "
                    "the tag directory mixes two saves", extra, max_rank, d->world, first);
    }
    for (unsigned r = 1; r < d->world; r++) {
        const char *path = g_hash_table_lookup(by_rank, GINT_TO_POINTER(r + 1));
        if (path == NULL)
            return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s/%szero_pp_rank_%u_mp_rank_00" OPTIM_SUFFIX ": missing (%s says "
                        "%u ranks, %u files found)", d->tag_dir, prefix, r, first, d->world,
                        g_hash_table_size(by_rank));
        unsigned stage, world;
        if (!open_pt(d, path, &d->optim[r]) || !read_stage(d, &d->optim[r], &stage, &world))
            return false;
        if (stage != d->stage || world != d->world)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: zero_stage %u, partition_count %u where %s says %u, %u", path,
                        stage, world, first, d->stage, d->world);
    }
    return true;
}

/* Rank R's list of flat fp32 groups, each tensor one run. */
static const CkptfsPy *rank_groups(Ds *d, unsigned r)
{
    const char *key = d->stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
    const CkptfsPy *groups = ckptfs_py_dict_get(optim_states(d, &d->optim[r]), key);
    if (groups == NULL || (groups->kind != CKPTFS_PY_LIST && groups->kind != CKPTFS_PY_TUPLE) ||
        groups->items->len == 0) {
        fail(d, CKPTFS_ERROR_FORMAT, "%s: optimizer_state_dict has no %s (a list of flat tensors)", d->optim[r].path,
             key);
        return NULL;
    }
    return groups;
}

static bool group_run(Ds *d, unsigned r, const CkptfsPy *groups, guint g, Run *run)
{
    g_autofree char *what = g_strdup_printf("%s[%u]", d->stage <= 2 ? "single_partition_of_fp32_groups"
                                                                     : "fp32_flat_groups", g);
    CkptfsDtype dtype;
    uint64_t shape[CKPTFS_MAX_DIMS];
    unsigned ndim;
    if (!tensor_run(d, &d->optim[r], item(groups, g), what, run, &dtype, shape, &ndim))
        return false;
    if (ndim != 1 || !ckptfs_dtype_is_float(dtype))
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s is not a flat (1-dim) floating-point tensor", d->optim[r].path,
                    what);
    if (d->master == CKPTFS_DTYPE_INVALID)
        d->master = dtype;
    if (dtype != d->master)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s is %s where the others are %s", d->optim[r].path, what,
                    ckptfs_dtype_safetensors_name(dtype), ckptfs_dtype_safetensors_name(d->master));
    return true;
}

/* The flat vectors: per group over the ranks (stages 1, 2), per rank over the groups (3). The
 * partitions are checked to be what DeepSpeed cuts: stages 1, 2, equal ones but for the
 * padding DeepSpeed removed from the end; stage 3, every rank's groups the size of rank 0's. */
static bool read_flats(Ds *d)
{
    const CkptfsPy *groups0 = rank_groups(d, 0);
    if (groups0 == NULL)
        return false;
    d->groups = groups0->items->len;
    d->nflats = d->stage <= 2 ? d->groups : d->world;
    d->flats = g_new0(Flat, d->nflats);
    for (unsigned i = 0; i < d->nflats; i++)
        d->flats[i].runs = g_array_new(FALSE, FALSE, sizeof(Run));
    g_autofree uint64_t *size0 = g_new0(uint64_t, d->groups);
    for (unsigned r = 0; r < d->world; r++) {
        const CkptfsPy *groups = rank_groups(d, r);
        if (groups == NULL)
            return false;
        if (groups->items->len != d->groups)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: %u param groups where %s has %u", d->optim[r].path,
                        groups->items->len, d->optim[0].path, d->groups);
        for (guint g = 0; g < d->groups; g++) {
            Run run;
            if (!group_run(d, r, groups, g, &run))
                return false;
            if (r == 0)
                size0[g] = run.numel;
            Flat *flat = &d->flats[d->stage <= 2 ? g : r];
            if (d->stage <= 2) {
                /* Once a partition is short (the padding taken off), the later ones are empty. */
                const Run *prev = flat->runs->len ? &g_array_index(flat->runs, Run, flat->runs->len - 1) : NULL;
                bool prev_short = prev && flat->numel != (uint64_t)flat->runs->len * size0[g];
                if (run.numel > size0[g] || (prev_short && run.numel > 0))
                    return fail(d, CKPTFS_ERROR_FORMAT, "%s: single_partition_of_fp32_groups[%u] holds %" G_GUINT64_FORMAT
                                " elements after ranks holding %" G_GUINT64_FORMAT " in all (rank 0: %" G_GUINT64_FORMAT
                                "): ZeRO's partitions are equal but for the padding removed from the last ones",
                                d->optim[r].path, g, run.numel, flat->numel, size0[g]);
            } else if (run.numel != size0[g]) {
                return fail(d, CKPTFS_ERROR_FORMAT, "%s: fp32_flat_groups[%u] holds %" G_GUINT64_FORMAT " elements, "
                            "rank 0's %" G_GUINT64_FORMAT " (%s): ZeRO-3 gives every rank the same share",
                            d->optim[r].path, g, run.numel, size0[g], d->optim[0].path);
            }
            g_array_append_val(flat->runs, run);
            flat->numel += run.numel;
        }
    }
    return true;
}

/* --- the model states --- */

static bool open_model_states(Ds *d)
{
    d->nmodel = d->stage <= 2 ? 1 : d->world;
    d->model = g_new0(PtFile, d->nmodel);
    for (unsigned r = 0; r < d->nmodel; r++) {
        g_autofree char *name = d->stage <= 2 ? g_strdup(MODEL_STATES_12)
                                              : g_strdup_printf("zero_pp_rank_%u_mp_rank_00_model_states.pt", r);
        g_autofree char *path = g_build_filename(d->tag_dir, name, NULL);
        if (!g_file_test(path, G_FILE_TEST_EXISTS))
            return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s: missing (the model states of ZeRO stage %u%s)", path, d->stage,
                        d->stage == 3 ? ", one per rank" : "");
        if (!open_pt(d, path, &d->model[r]))
            return false;
        int64_t dp;
        const CkptfsPy *v = ckptfs_py_dict_get(d->model[r].root, "dp_world_size");
        if (v && small_int(v, &dp) && dp != d->world)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: dp_world_size %" G_GINT64_FORMAT " disagrees with partition_count "
                        "%u of %s", path, dp, d->world, d->optim[0].path);
    }
    /* Stage 3's flat groups are sub-groups of the param groups: only their total counts. */
    const CkptfsPy *shapes = ckptfs_py_dict_get(d->model[0].root, "param_shapes");
    if (length(shapes) == 0 || (d->stage <= 2 && length(shapes) != d->groups))
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: param_shapes has %u groups, the optimizer states %u (%s)",
                    d->model[0].path, length(shapes), d->groups, d->optim[0].path);
    return true;
}

/* Whether every parameter name is a causal LM's under WRAPPER_PREFIX ("model.model.layers...",
 * "model.lm_head.weight"): a Hugging Face model's own names never all start with "model."
 * while their rest starts with "model." or "lm_head." (its head is "lm_head.weight", or a tied
 * model's embedding "model.embed_tokens.weight" leaves "embed_tokens..."). */
static void detect_wrapper(Ds *d)
{
    const CkptfsPy *groups = ckptfs_py_dict_get(d->model[0].root, "param_shapes");
    const CkptfsPy *frozen = ckptfs_py_dict_get(d->model[0].root, "frozen_param_shapes");
    bool all = true;
    unsigned seen = 0;
    for (guint g = 0; g <= length(groups) && all; g++) {
        const CkptfsPy *shapes = g < length(groups) ? item(groups, g) : frozen;
        for (guint i = 0; shapes && shapes->kind == CKPTFS_PY_DICT && i + 1 < shapes->items->len && all; i += 2) {
            const char *name = ckptfs_py_str(g_ptr_array_index(shapes->items, i));
            const char *rest = name && g_str_has_prefix(name, WRAPPER_PREFIX) ? name + strlen(WRAPPER_PREFIX) : NULL;
            all = rest && (g_str_has_prefix(rest, "model.") || g_str_has_prefix(rest, "lm_head."));
            seen++;
        }
    }
    d->wrapped = all && seen > 0;
}

/* Buffers: the module's entries buffer_names names, whole in the model states. */
static bool add_buffers(Ds *d)
{
    const PtFile *f = &d->model[0];
    const CkptfsPy *names = ckptfs_py_dict_get(f->root, "buffer_names");
    const CkptfsPy *module = ckptfs_py_dict_get(f->root, "module");
    if (names == NULL || (names->kind != CKPTFS_PY_LIST && names->kind != CKPTFS_PY_TUPLE))
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: no buffer_names (not DeepSpeed model states)", f->path);
    for (guint i = 0; i < names->items->len; i++) {
        const char *name = entry_name(d, f, "buffer_names", item(names, i));
        if (name == NULL)
            return false;
        const CkptfsPy *t = module && module->kind == CKPTFS_PY_DICT ? ckptfs_py_dict_get(module, name) : NULL;
        if (t == NULL)
            continue; /* a buffer the module does not save (persistent=False) */
        g_autofree char *what = g_strdup_printf("buffer '%s'", name);
        Run run;
        CkptfsDtype dtype;
        uint64_t shape[CKPTFS_MAX_DIMS];
        unsigned ndim;
        if (!tensor_run(d, f, t, what, &run, &dtype, shape, &ndim))
            return false;
        g_autoptr(GArray) pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
        run_pieces(&run, 0, columns(shape, ndim), ckptfs_dtype_size(dtype), pieces);
        if (!add_tensor(d, name, dtype, ndim, shape, pieces, f->path))
            return false;
        d->buffers++;
    }
    return true;
}

/* Frozen parameters: whole in frozen_param_fragments (stages 1, 2), or each rank's
 * ceil(numel / world) elements of it, the last padded (stage 3). */
static bool add_frozen(Ds *d)
{
    const PtFile *f0 = &d->model[0];
    const CkptfsPy *shapes = ckptfs_py_dict_get(f0->root, "frozen_param_shapes");
    if (shapes == NULL || shapes->kind != CKPTFS_PY_DICT)
        return true;
    for (guint i = 0; i + 1 < shapes->items->len; i += 2) {
        const char *name = entry_name(d, f0, "frozen_param_shapes", g_ptr_array_index(shapes->items, i));
        uint64_t shape[CKPTFS_MAX_DIMS], numel = 0;
        unsigned ndim;
        if (name == NULL ||
            !read_shape(d, f0, "frozen_param_shapes", name, g_ptr_array_index(shapes->items, i + 1), shape, &ndim, &numel))
            return false;
        uint64_t share = d->stage <= 2 ? numel : (numel + d->world - 1) / d->world;
        g_autoptr(GArray) pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
        CkptfsDtype dtype = CKPTFS_DTYPE_INVALID;
        for (unsigned r = 0; r < d->nmodel; r++) {
            const PtFile *f = &d->model[r];
            const CkptfsPy *frags = ckptfs_py_dict_get(f->root, "frozen_param_fragments");
            g_autofree char *what = g_strdup_printf("frozen_param_fragments['%s']", name);
            Run run;
            CkptfsDtype dt;
            if (!tensor_run(d, f, frags && frags->kind == CKPTFS_PY_DICT ? ckptfs_py_dict_get(frags, name) : NULL, what,
                            &run, &dt, NULL, NULL))
                return false;
            uint64_t first = (uint64_t)r * share, want = first < numel ? MIN(share, numel - first) : 0;
            if (run.numel < want || (d->stage <= 2 && run.numel != numel)) {
                g_autofree char *dims = ckptfs_dims_text(shape, ndim);
                return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s holds %" G_GUINT64_FORMAT " elements; the parameter of "
                            "shape %s needs %" G_GUINT64_FORMAT " from this file", f->path, what, run.numel, dims,
                            want);
            }
            if (dtype != CKPTFS_DTYPE_INVALID && dt != dtype)
                return fail(d, CKPTFS_ERROR_FORMAT, "%s: %s is %s, rank 0's %s", f->path, what,
                            ckptfs_dtype_safetensors_name(dt), ckptfs_dtype_safetensors_name(dtype));
            dtype = dt;
            run.numel = want;
            run_pieces(&run, first, columns(shape, ndim), ckptfs_dtype_size(dt), pieces);
        }
        if (!add_tensor(d, name, dtype, ndim, shape, pieces, f0->path))
            return false;
        d->frozen++;
    }
    return true;
}

/* zero_to_fp32's check of stages 1 and 2: what the parameters take and what the partitions
 * hold agree once both are rounded up to 2 x world size (DeepSpeed's alignment). */
static uint64_t zero2_align(uint64_t x, unsigned world)
{
    uint64_t a = 2 * (uint64_t)world;
    return (x + a - 1) / a * a;
}

/* The trainable parameters, in param_shapes' order, from the flat vectors. */
static bool add_trainable(Ds *d)
{
    const PtFile *f = &d->model[0];
    const CkptfsPy *groups = ckptfs_py_dict_get(f->root, "param_shapes");
    size_t isz = ckptfs_dtype_size(d->master);
    uint64_t offset = 0; /* stage 3: in every rank's flat vector */
    for (guint g = 0; g < length(groups); g++) {
        const CkptfsPy *shapes = item(groups, g);
        if (shapes == NULL || shapes->kind != CKPTFS_PY_DICT)
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: param_shapes[%u] is not a dict of shapes", f->path, g);
        if (d->stage <= 2)
            offset = 0;
        for (guint i = 0; i + 1 < shapes->items->len; i += 2) {
            const char *name = entry_name(d, f, "param_shapes", g_ptr_array_index(shapes->items, i));
            uint64_t shape[CKPTFS_MAX_DIMS], numel = 0;
            unsigned ndim;
            if (name == NULL ||
                !read_shape(d, f, "param_shapes", name, g_ptr_array_index(shapes->items, i + 1), shape, &ndim, &numel))
                return false;
            uint64_t cols = columns(shape, ndim);
            uint64_t share = d->stage <= 2 ? numel : (numel + d->world - 1) / d->world;
            const Flat *flat = &d->flats[d->stage <= 2 ? g : 0];
            if (offset + share > flat->numel || offset + share < offset)
                return fail(d, CKPTFS_ERROR_FORMAT, "%s: param_shapes need more than the %" G_GUINT64_FORMAT " elements "
                            "%s holds (at '%s', group %u): partitions and shapes disagree", f->path, flat->numel,
                            d->stage <= 2 ? "the ranks' partitions of its group" : "each rank's fp32_flat_groups",
                            name, g);
            g_autoptr(GArray) pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
            if (d->stage <= 2)
                flat_pieces(flat, offset, numel, 0, cols, isz, pieces);
            for (unsigned r = 0; d->stage == 3 && r < d->world; r++) {
                uint64_t first = (uint64_t)r * share;
                if (first < numel)
                    flat_pieces(&d->flats[r], offset, MIN(share, numel - first), first, cols, isz, pieces);
            }
            if (!add_tensor(d, name, d->master, ndim, shape, pieces, f->path))
                return false;
            offset += share;
            d->trainable++;
            d->elements += numel;
        }
        if (d->stage <= 2 && zero2_align(offset, d->world) != zero2_align(d->flats[g].numel, d->world))
            return fail(d, CKPTFS_ERROR_FORMAT, "%s: param group %u: param_shapes take %" G_GUINT64_FORMAT " elements, "
                        "the ranks' partitions hold %" G_GUINT64_FORMAT " (aligned to 2 x %u ranks: %" G_GUINT64_FORMAT
                        " and %" G_GUINT64_FORMAT "): the padding is not DeepSpeed's", f->path, g, offset,
                        d->flats[g].numel, d->world, zero2_align(offset, d->world),
                        zero2_align(d->flats[g].numel, d->world));
    }
    if (d->stage == 3 && offset != d->flats[0].numel)
        return fail(d, CKPTFS_ERROR_FORMAT, "%s: param_shapes take %" G_GUINT64_FORMAT " elements of each rank's "
                    "fp32_flat_groups, which hold %" G_GUINT64_FORMAT ": partitions and shapes disagree", f->path, offset,
                    d->flats[0].numel);
    return true;
}

/* shared_params: {name: the name it shares storage with}, served as a copy of that tensor. */
static bool add_shared(Ds *d)
{
    const PtFile *f = &d->model[0];
    const CkptfsPy *shared = ckptfs_py_dict_get(f->root, "shared_params");
    if (shared == NULL || shared->kind != CKPTFS_PY_DICT)
        return true;
    for (guint i = 0; i + 1 < shared->items->len; i += 2) {
        const char *name = entry_name(d, f, "shared_params", g_ptr_array_index(shared->items, i));
        const char *to = name ? entry_name(d, f, "shared_params", g_ptr_array_index(shared->items, i + 1)) : NULL;
        if (to == NULL)
            return false;
        const CkptfsTensor *t = ckptfs_catalog_find(d->source->catalog, served_name(d, to));
        if (t == NULL || ckptfs_catalog_find(d->source->catalog, served_name(d, name)) != NULL)
            continue; /* as zero_to_fp32: only a pair whose target it has */
        g_autoptr(GArray) pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece));
        g_array_append_vals(pieces, t->pieces, t->npieces);
        CkptfsDtype dtype = t->dtype;
        unsigned ndim = t->ndim;
        uint64_t shape[CKPTFS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (!add_tensor(d, name, dtype, ndim, shape, pieces, f->path))
            return false;
        d->shared += ckptfs_catalog_find(d->source->catalog, served_name(d, name)) != NULL; /* not a tied head left out */
    }
    return true;
}

/* --- opening --- */

static bool find_tag_dir(Ds *d)
{
    const char *dir = d->source->dir;
    if (is_tag_dir(dir)) {
        d->tag_dir = g_strdup(dir);
        /* The Trainer's config.json is in checkpoint-N/, above global_stepN/. */
        d->checkpoint_dir = has_file(dir, "config.json") ? g_strdup(dir) : g_path_get_dirname(dir);
        return true;
    }
    g_autofree char *tag = read_tag(dir, d->error);
    if (tag == NULL)
        return false;
    d->tag_dir = g_build_filename(dir, tag, NULL);
    d->checkpoint_dir = g_strdup(dir);
    d->tag_from_file = true;
    if (!g_file_test(d->tag_dir, G_FILE_TEST_IS_DIR))
        return fail(d, CKPTFS_ERROR_NOT_FOUND, "%s: missing (the tag directory %s/" TAG_FILE " names)", d->tag_dir, dir);
    return true;
}

static bool config_true(JsonObject *config, const char *key)
{
    JsonNode *n = config ? json_object_get_member(config, key) : NULL;
    return n && JSON_NODE_HOLDS_VALUE(n) && json_node_get_value_type(n) == G_TYPE_BOOLEAN && json_node_get_boolean(n);
}

static void describe_found(Ds *d)
{
    g_autofree char *tag = g_path_get_basename(d->tag_dir);
    g_autoptr(GString) s = g_string_new(NULL);
    g_string_append_printf(s, "DeepSpeed ZeRO stage %u checkpoint %s%s: saved by %u rank%s (%s" "zero_pp_rank_*), "
                           "%u param group%s; fp32 master weights of %u tensors (%" G_GUINT64_FORMAT " elements) stored "
                           "as %s", d->stage, tag, d->tag_from_file ? " (named by " TAG_FILE ")" : "", d->world,
                           d->world == 1 ? "" : "s", d->prefix, d->groups, d->groups == 1 ? "" : "s", d->trainable,
                           d->elements, ckptfs_dtype_safetensors_name(d->master));
    if (d->frozen)
        g_string_append_printf(s, ", %u frozen", d->frozen);
    if (d->buffers)
        g_string_append_printf(s, ", %u buffers", d->buffers);
    if (d->shared)
        g_string_append_printf(s, ", %u shared", d->shared);
    if (d->listed_dtypes[1] != CKPTFS_DTYPE_INVALID) { /* frozen parameters or buffers in their own type */
        g_string_append(s, "; stored types");
        for (unsigned i = 0; i < G_N_ELEMENTS(d->listed_dtypes) && d->listed_dtypes[i] != CKPTFS_DTYPE_INVALID; i++)
            g_string_append_printf(s, " %s", ckptfs_dtype_safetensors_name(d->listed_dtypes[i]));
    }
    if (d->wrapped)
        g_string_append(s, "; names under a wrapper's \"" WRAPPER_PREFIX "\" served without it");
    g_string_append(s, "; the module copy, optimizer moments and scheduler not read");
    d->source->found = g_string_free(g_steal_pointer(&s), FALSE);
}

static bool open_deepspeed(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    Ds d = {.source = source, .options = options, .error = error, .master = CKPTFS_DTYPE_INVALID};
    for (unsigned i = 0; i < G_N_ELEMENTS(d.listed_dtypes); i++)
        d.listed_dtypes[i] = CKPTFS_DTYPE_INVALID;
    bool ok = find_tag_dir(&d) && ckptfs_source_read_checkpoint_dir(source, options, d.checkpoint_dir, error);
    d.tied = ok && config_true(source->config, "tie_word_embeddings");
    /* zero_to_fp32's order: buffers, frozen parameters, trainable ones, shared ones. */
    ok = ok && open_optim(&d) && read_flats(&d) && open_model_states(&d);
    if (ok)
        detect_wrapper(&d);
    ok = ok && add_buffers(&d) && add_frozen(&d) &&
         add_trainable(&d) && add_shared(&d);
    if (ok) {
        describe_found(&d);
        /* What zero_to_fp32 users then cast to: training keeps fp32 masters. */
        source->default_dtype = CKPTFS_SERVE_BF16;
    }
    for (unsigned r = 0; d.optim && r < d.world; r++)
        close_pt(&d.optim[r]);
    for (unsigned r = 0; r < d.nmodel; r++)
        close_pt(&d.model[r]);
    for (unsigned i = 0; i < d.nflats; i++)
        g_array_unref(d.flats[i].runs);
    g_free(d.optim);
    g_free(d.model);
    g_free(d.flats);
    g_free(d.tag_dir);
    g_free(d.checkpoint_dir);
    return ok;
}

static char *describe_deepspeed(const CkptfsSource *source)
{
    return g_strdup_printf("%u tensors from DeepSpeed ZeRO optimizer states", ckptfs_catalog_count(source->catalog));
}

const CkptfsSourceFormat ckptfs_format_deepspeed = {"deepspeed", probe_deepspeed, open_deepspeed, describe_deepspeed};
