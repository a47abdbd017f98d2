/* verl FSDP checkpoints as a source: one role directory of a verl run (global_step_N/actor or
 * critic) with a model_world_size_W_rank_R.pt per rank, each the torch.save of an FSDP1 or FSDP2
 * sharded state dict: DTensors over a 1-D ("fsdp") mesh or a 2-D ("ddp", "fsdp") HSDP mesh, or
 * plain tensors (FSDP1 at world size 1). Keys are Hugging Face names already; every tensor
 * becomes a catalog tensor made of the local shards of the mesh's first row, in their stored
 * type. Only the pickles and the tiny mesh tensors are read; optimizer and extra state files are
 * never opened. huggingface/ gives config.json and the tokenizer. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/json_strict.h"
#include "ckptfs/limits.h"
#include "ckptfs/pickle.h"
#include "ckptfs/units.h"
#include "ckptfs/zipreader.h"
#include "source_internal.h"

#define CONFIG_NAME "fsdp_config.json"
#define HF_DIR "huggingface"
#define RANK_PATTERN "model_world_size_*_rank_*.pt"
/* World sizes above this are refused before anything is allocated per rank (the largest FSDP
 * runs: tens of thousands of GPUs). */
#define MAX_WORLD_SIZE (1u << 20)
/* Missing ranks a message lists. */
#define LIST_MAX 8

typedef enum { PLACE_PLAIN, PLACE_REPLICATE, PLACE_SHARD } Place;

/* A key of the state dict as the mesh's first rank gave it; every rank read is checked against
 * it and adds its piece. */
typedef struct {
    char *name;
    CkptfsDtype dtype;
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS]; /* global */
    Place place;                     /* on the mesh's last dim */
    unsigned dim;                    /* of Shard(dim) */
    uint64_t filled;                 /* of dim DIM, by the ranks read so far */
    bool dropped;                    /* lm_head.weight tied to the embedding */
    bool adapter;                    /* a LoRA matrix: served in hf/lora_adapter/ */
    char *served;                    /* its name in hf/ (LoRA runs: PEFT's wrapping removed) */
    GArray *pieces;                  /* CkptfsPiece */
} Key;

/* A rank's local tensor: where its elements are in a storage record of its file. */
typedef struct {
    const char *storage_key;
    uint64_t storage_numel; /* what the pickle says the storage holds: torch makes it that size */
    CkptfsDtype dtype;
    uint64_t offset; /* in elements */
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS], stride[CKPTFS_MAX_DIMS];
} Local;

/* One state dict entry of a rank, decoded. */
typedef struct {
    Local local;
    unsigned ndim; /* global shape */
    uint64_t shape[CKPTFS_MAX_DIMS];
    Place place;
    unsigned dim;
} Entry;

/* A rank file while it is read. */
typedef struct {
    unsigned rank; /* R of its name */
    const char *path;
    uint32_t src;
    CkptfsZip *zip;
    CkptfsPickle *pickle;
    const CkptfsPy *dict;      /* the state dict */
    const CkptfsPy *mesh_seen; /* the DeviceMesh last checked: memoized, shared by the keys */
} Rank;

typedef struct {
    CkptfsSource *source;
    GError **error;
    unsigned W;
    char **paths;    /* [W]: rank R's file */
    int64_t version; /* FSDP_version of fsdp_config.json; 0 without one */
    /* The device mesh, from rank 0's first DTensor. */
    unsigned mesh_ndim; /* 0: plain tensors only */
    uint64_t mesh_shape[2];
    char *mesh_names;   /* "ddp, fsdp" */
    int64_t *mesh;      /* [W]: the rank at each coordinate, row-major */
    unsigned *position; /* [W]: rank R's coordinate, row-major */
    unsigned row;       /* ranks of the first row (the last dim's size): those read */
    GArray *keys;        /* Key, in the first rank's order */
    GHashTable *by_name; /* name -> index in keys + 1 */
    const char *first;   /* the file of the first rank read: its keys are the reference */
    bool lora;           /* a LoRA run: PEFT's names, adapter matrices */
    const CkptfsArchitecture *arch; /* config.json's, when known: how its names are saved */
} Fsdp;

#define fail(f, ...) ckptfs_fail((f)->error, __VA_ARGS__)

static void key_clear(gpointer p)
{
    Key *k = p;
    g_free(k->name);
    g_free(k->served);
    if (k->pieces)
        g_array_unref(k->pieces);
}

static void rank_clear(Rank *r)
{
    ckptfs_pickle_free(r->pickle);
    ckptfs_zip_free(r->zip);
    *r = (Rank){0};
}

/* A string from a pickle as messages show it: escaped (one line, ASCII), cut if long. */
static char *shown(const char *text)
{
    g_autofree char *cut = g_strndup(text, 200);
    return g_strescape(cut, NULL);
}

/* Keys are printed as they are in messages: refused unless they are printable UTF-8 text. */
static bool check_key_text(Fsdp *f, const Rank *r, const char *key, guint index)
{
    bool printable = key != NULL && g_utf8_validate(key, -1, NULL);
    for (const char *p = key; printable && *p; p++)
        printable = (unsigned char)*p >= 0x20 && *p != 0x7f;
    if (printable)
        return true;
    g_autofree char *text = key ? shown(key) : NULL;
    return fail(f, CKPTFS_ERROR_FORMAT, "%s: state dict entry %u has a key that is not printable text%s%s%s",
                r->path, index, text ? " ('" : "", text ? text : "", text ? "')" : "");
}

/* --- the files --- */

/* Digits at *P (any number of them: a name with a huge number is still a rank file's, refused
 * by its number, not passed over); a number above 2^32 - 1 is read as UINT_MAX, out of range of
 * any world size or rank read. */
static bool parse_number(const char **p, unsigned *out)
{
    size_t n = strspn(*p, "0123456789");
    if (n == 0)
        return false;
    g_autofree char *digits = g_strndup(*p, n);
    uint64_t v;
    *out = ckptfs_parse_uint(digits, 0, UINT_MAX, &v, NULL) ? (unsigned)v : UINT_MAX;
    *p += n;
    return true;
}

static gint compare_names(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* model_world_size_W_rank_R.pt */
static bool parse_rank_name(const char *name, unsigned *w, unsigned *r)
{
    const char *p = name;
    if (!g_str_has_prefix(p, "model_world_size_"))
        return false;
    p += strlen("model_world_size_");
    if (!parse_number(&p, w) || !g_str_has_prefix(p, "_rank_"))
        return false;
    p += strlen("_rank_");
    return parse_number(&p, r) && strcmp(p, ".pt") == 0;
}

static bool probe_fsdp(const char *dir, const CkptfsOptions *options)
{
    (void)options;
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL)
        if (strcmp(name, CONFIG_NAME) == 0 || g_pattern_match_simple(RANK_PATTERN, name))
            return true;
    return false;
}

/* An integer member (null or absent: none). */
static bool json_int(JsonObject *o, const char *key, int64_t *out)
{
    gint64 v = 0;
    if (ckptfs_json_member_int(o, key, &v) != CKPTFS_JSON_FOUND)
        return false;
    *out = v;
    return true;
}

/* fsdp_config.json, when there is one (older runs have none): the world size it says, or 0. */
static bool read_fsdp_config(Fsdp *f, int64_t *world_size)
{
    *world_size = 0;
    g_autofree char *path = g_build_filename(f->source->dir, CONFIG_NAME, NULL);
    if (!g_file_test(path, G_FILE_TEST_EXISTS) && !g_file_test(path, G_FILE_TEST_IS_SYMLINK))
        return true;
    g_autoptr(JsonObject) config = ckptfs_json_load_object(path, f->error);
    if (config == NULL)
        return false;
    if (!json_int(config, "world_size", world_size) || *world_size < 1) {
        JsonNode *n = ckptfs_json_member(config, "world_size");
        g_autofree char *text = n ? json_to_string(n, FALSE) : g_strdup("missing");
        g_autofree char *value = g_utf8_strlen(text, -1) > 40
                                     ? g_strdup_printf("%.*s...", (int)(g_utf8_offset_to_pointer(text, 37) - text), text)
                                     : g_strdup(text);
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: \"world_size\" must be a whole number of at least 1 (it is %s)",
                    path, value);
    }
    if (ckptfs_json_member(config, "FSDP_version") != NULL && !json_int(config, "FSDP_version", &f->version))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: \"FSDP_version\" is not a number", path);
    return true;
}

/* The rank files: one world size in every name, agreeing with fsdp_config.json, and a file for
 * each rank. */
static bool scan_files(Fsdp *f)
{
    const char *dir = f->source->dir;
    int64_t config_w;
    if (!read_fsdp_config(f, &config_w))
        return false;
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    if (d == NULL)
        return fail(f, CKPTFS_ERROR_IO, "%s: cannot list", dir);
    g_autoptr(GPtrArray) names = g_ptr_array_new_with_free_func(g_free);
    const char *name;
    unsigned w, r;
    while ((name = g_dir_read_name(d)) != NULL)
        if (parse_rank_name(name, &w, &r))
            g_ptr_array_add(names, g_strdup(name));
    g_ptr_array_sort(names, compare_names); /* messages name the same files each time */
    const char *seen = NULL; /* a file of world size W */
    for (guint i = 0; i < names->len; i++) {
        const char *n = g_ptr_array_index(names, i);
        parse_rank_name(n, &w, &r);
        if (w == 0 || w > MAX_WORLD_SIZE)
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s/%s: the world size in its name is out of range (ckptfs "
                        "reads 1 to %u ranks)", dir, n, MAX_WORLD_SIZE);
        if (seen == NULL) {
            f->W = w, seen = n;
        } else if (w != f->W) {
            /* Name the file that disagrees with fsdp_config.json (else the later one). */
            const char *odd = (int64_t)w == config_w ? seen : n;
            return fail(f, CKPTFS_ERROR_FORMAT, "%s/%s: world size %u in its name, but %s/%s has %u "
                        "(rank files of two different world sizes)", dir, odd, odd == n ? w : f->W, dir,
                        odd == n ? seen : n, odd == n ? f->W : w);
        }
    }
    if (seen == NULL) {
        if (config_w > 0)
            return fail(f, CKPTFS_ERROR_NOT_FOUND, "%s/model_world_size_%" G_GINT64_FORMAT "_rank_0.pt: "
                        "missing (%s says world size %" G_GINT64_FORMAT "; no rank file is there)", dir,
                        config_w, CONFIG_NAME, config_w);
        return fail(f, CKPTFS_ERROR_NOT_FOUND, "%s: no %s rank files", dir, RANK_PATTERN);
    }
    if (config_w > 0 && config_w != f->W)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s/%s: world_size %" G_GINT64_FORMAT ", but the rank files are "
                    "model_world_size_%u_rank_*.pt", dir, CONFIG_NAME, config_w, f->W);
    f->paths = g_new0(char *, f->W);
    for (guint i = 0; i < names->len; i++) {
        const char *n = g_ptr_array_index(names, i);
        parse_rank_name(n, &w, &r);
        if (r >= f->W)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s/%s: the rank in its name is out of range (world size %u: ranks "
                        "0 to %u)", dir, n, f->W, f->W - 1);
        if (f->paths[r] != NULL)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s/%s: rank %u is also %s", dir, n, r, f->paths[r]);
        f->paths[r] = g_build_filename(dir, n, NULL);
    }
    g_autoptr(GString) missing = g_string_new(NULL);
    unsigned nmissing = 0, first_missing = 0;
    for (unsigned k = 0; k < f->W; k++) {
        if (f->paths[k] != NULL)
            continue;
        if (nmissing == 0)
            first_missing = k;
        if (nmissing++ < LIST_MAX)
            g_string_append_printf(missing, "%s%u", missing->len ? ", " : "", k);
    }
    if (nmissing > 0)
        return fail(f, CKPTFS_ERROR_NOT_FOUND, "%s/model_world_size_%u_rank_%u.pt: missing (%u of the %u rank "
                    "files missing: rank%s %s%s)", dir, f->W, first_missing, nmissing, f->W,
                    nmissing == 1 ? "" : "s", missing->str, nmissing > LIST_MAX ? ", ..." : "");
    return true;
}

static bool open_rank(Fsdp *f, unsigned rank, Rank *r)
{
    *r = (Rank){.rank = rank, .path = f->paths[rank]};
    int src = ckptfs_srcfiles_add(f->source->files, r->path, f->error);
    if (src < 0)
        return false;
    r->src = (uint32_t)src;
    r->zip = ckptfs_zip_open(f->source->files, r->src, f->error);
    if (r->zip == NULL)
        return false;
    GBytes *pkl = ckptfs_zip_read(r->zip, f->source->files, "data.pkl", CKPTFS_MAX_RANK_PICKLE_BYTES, f->error);
    if (pkl == NULL)
        return false;
    gsize n;
    const uint8_t *data = g_bytes_get_data(pkl, &n);
    g_autofree char *what = g_strdup_printf("%s: data.pkl", r->path);
    r->pickle = ckptfs_pickle_parse(what, data, n, f->error);
    g_bytes_unref(pkl);
    if (r->pickle == NULL)
        return false;
    r->dict = ckptfs_pickle_root(r->pickle);
    if (r->dict->kind != CKPTFS_PY_DICT)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: data.pkl holds no state dict (an OrderedDict of tensors)",
                    r->path);
    return true;
}

/* --- decoding the pickled values --- */

static const CkptfsPy *item(const CkptfsPy *tuple, guint i)
{
    return tuple && (tuple->kind == CKPTFS_PY_TUPLE || tuple->kind == CKPTFS_PY_LIST) && i < tuple->items->len
               ? g_ptr_array_index(tuple->items, i)
               : NULL;
}

static bool is_int(const CkptfsPy *v)
{
    return v && v->kind == CKPTFS_PY_INT && !v->big && v->i >= 0;
}

/* torch.distributed's class NAME (its module moved between torch versions). */
static bool is_dist_class(const CkptfsPy *v, const char *name)
{
    return v && v->kind == CKPTFS_PY_GLOBAL && g_str_has_prefix(v->module, "torch.distributed") &&
           strcmp(v->name, name) == 0;
}

/* _rebuild_tensor_v2's arguments: (persistent id ('storage', torch.XStorage, key, location,
 * numel), offset, size, stride, ...). */
static bool local_from_args(const CkptfsPy *args, Local *out)
{
    const CkptfsPy *pid = item(args, 0), *off = item(args, 1);
    if (pid == NULL || pid->kind != CKPTFS_PY_PERSID || !is_int(off) || item(args, 3) == NULL)
        return false;
    const char *tag = ckptfs_py_str(item(pid->args, 0)), *key = ckptfs_py_str(item(pid->args, 2));
    if (tag == NULL || strcmp(tag, "storage") != 0 || key == NULL || !is_int(item(pid->args, 4)))
        return false;
    unsigned nsize, nstride;
    if (!ckptfs_py_dims(item(args, 2), out->shape, &nsize) || !ckptfs_py_dims(item(args, 3), out->stride, &nstride) ||
        nsize != nstride)
        return false;
    out->storage_key = key;
    out->storage_numel = (uint64_t)item(pid->args, 4)->i;
    out->dtype = ckptfs_py_storage_dtype(item(pid->args, 1));
    out->offset = (uint64_t)off->i;
    out->ndim = nsize;
    return true;
}

/* A plain tensor: _rebuild_tensor_v2 applied, or given to _rebuild_from_type_v2 for a
 * torch.Tensor with a state (FSDP1 at world size 1: {'_has_been_cloned': True}). */
static bool plain_local(const CkptfsPy *v, Local *out)
{
    if (v == NULL)
        return false;
    if (v->kind == CKPTFS_PY_TENSOR) {
        const CkptfsPyTensor *t = v->tensor;
        *out = (Local){.storage_key = t->storage_key, .storage_numel = t->storage_numel, .dtype = t->dtype,
                       .offset = t->offset, .ndim = t->ndim};
        memcpy(out->shape, t->shape, sizeof out->shape);
        memcpy(out->stride, t->stride, sizeof out->stride);
        return true;
    }
    if (v->kind != CKPTFS_PY_OBJECT || !ckptfs_py_is_global(v->callable, "torch._tensor", "_rebuild_from_type_v2") ||
        !ckptfs_py_is_global(item(v->args, 0), "torch._utils", "_rebuild_tensor_v2"))
        return false;
    const CkptfsPy *cls = item(v->args, 1);
    if (!ckptfs_py_is_global(cls, "torch", "Tensor") && !ckptfs_py_is_global(cls, "torch.nn.parameter", "Parameter"))
        return false;
    return local_from_args(item(v->args, 2), out);
}

/* What a value is, for messages: "an object built by os.system". */
static char *what_is(const CkptfsPy *v)
{
    static const char *const kinds[] = {"None", "a bool", "an int", "a float", "a str", "bytes", "a tuple",
                                        "a list", "a dict", "a set", "a global", "an object", "a persistent id",
                                        "a tensor"};
    if (v->kind == CKPTFS_PY_OBJECT && v->callable && v->callable->kind == CKPTFS_PY_GLOBAL) {
        g_autofree char *module = shown(v->callable->module), *name = shown(v->callable->name);
        return g_strdup_printf("an object built by %s.%s", module, name);
    }
    return g_strdup(v->kind < G_N_ELEMENTS(kinds) ? kinds[v->kind] : "a value");
}

/* WHAT of KEY (a local tensor, a mesh tensor) against its storage as torch.load rebuilds it: a
 * storage of the element count the pickle gives, which the tensor must lie within ("Trying to
 * resize storage that is not resizable" otherwise, even where the bytes served lie inside the
 * record). Every entry of every file read is checked, also those whose bytes are not served. */
static bool check_storage(Fsdp *f, const Rank *r, const char *key, const char *what, const Local *l)
{
    size_t isz = ckptfs_dtype_size(l->dtype);
    g_autofree char *record = g_strdup_printf("data/%s", l->storage_key);
    g_autofree char *record_name = shown(record);
    uint64_t reach, reach_bytes;
    if (ckptfs_zip_find(r->zip, record) == NULL)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': the storage record %s of %s is missing", r->path, key,
                    record_name, what);
    g_autofree char *shape = ckptfs_dims_text(l->shape, l->ndim);
    g_autofree char *stride = ckptfs_dims_text(l->stride, l->ndim);
    if (!ckptfs_strided_extent(l->offset, l->shape, l->stride, l->ndim, &reach) ||
        !ckptfs_mul_u64(reach, isz, &reach_bytes))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': %s %s (strides %s) from storage offset %" G_GUINT64_FORMAT
                    " overflows 64 bits", r->path, key, what, shape, stride, l->offset);
    if (reach > l->storage_numel)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': %s %s (strides %s) from storage offset %" G_GUINT64_FORMAT
                    " reaches element %" G_GUINT64_FORMAT " of storage record %s, which the pickle says holds %"
                    G_GUINT64_FORMAT " (torch.load refuses it)", r->path, key, what, shape, stride, l->offset,
                    reach, record_name, l->storage_numel);
    return true;
}

/* The mesh tensor's values (the global rank at each coordinate), read from R's file. */
static bool read_mesh_values(Fsdp *f, Rank *r, const char *key, const CkptfsPy *t, uint64_t numel, int64_t *out)
{
    const CkptfsPyTensor *m = t->tensor;
    size_t isz = ckptfs_dtype_size(m->dtype);
    if (m->dtype != CKPTFS_DTYPE_I32 && m->dtype != CKPTFS_DTYPE_I64)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh tensor is %s, not int32", r->path, key,
                    ckptfs_dtype_safetensors_name(m->dtype));
    uint64_t want = 1;
    for (unsigned i = m->ndim; i-- > 0; want *= m->shape[i])
        if (m->shape[i] != 1 && m->stride[i] != want)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh tensor is not contiguous", r->path, key);
    Local mesh_local;
    plain_local(t, &mesh_local);
    if (!check_storage(f, r, key, "its device mesh tensor", &mesh_local))
        return false;
    g_autofree char *record = g_strdup_printf("data/%s", m->storage_key);
    const CkptfsZipEntry *e = ckptfs_zip_find(r->zip, record);
    g_autofree char *name = shown(record);
    uint64_t end;
    if (e == NULL)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': the storage record %s of its device mesh is missing",
                    r->path, key, name);
    if (!ckptfs_elements_end(m->offset, numel, isz, &end) || end > e->size)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's %" G_GUINT64_FORMAT " elements from "
                    "offset %" G_GUINT64_FORMAT " lie outside storage record %s (%" G_GUINT64_FORMAT " bytes)",
                    r->path, key, numel, m->offset, name, e->size);
    g_autofree uint8_t *buf = g_malloc(numel * isz); /* numel = W, at most MAX_WORLD_SIZE */
    if (!ckptfs_srcfiles_pread(f->source->files, r->src, buf, numel * isz, e->data_offset + m->offset * isz,
                               f->error))
        return false;
    for (uint64_t i = 0; i < numel; i++) {
        uint64_t u = 0;
        for (size_t b = 0; b < isz; b++)
            u |= (uint64_t)buf[i * isz + b] << (8 * b);
        out[i] = isz == 4 ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
    }
    return true;
}

/* "ddp, fsdp" from mesh_dim_names (escaped); NULL when they are not a tuple of strings. */
static char *mesh_names_text(const CkptfsPy *names)
{
    if (names == NULL || names->kind == CKPTFS_PY_NONE)
        return g_strdup("unnamed");
    if (names->kind != CKPTFS_PY_TUPLE && names->kind != CKPTFS_PY_LIST)
        return NULL;
    GString *s = g_string_new(NULL);
    for (guint i = 0; i < names->items->len; i++) {
        const char *n = ckptfs_py_str(g_ptr_array_index(names->items, i));
        if (n == NULL) {
            g_string_free(s, TRUE);
            return NULL;
        }
        g_autofree char *text = shown(n);
        g_string_append_printf(s, "%s%s", i ? ", " : "", text);
    }
    return g_string_free(s, FALSE);
}

/* A DeviceMesh as torch pickles it: torch 2.6 its tensor of ranks ("mesh") and "mesh_dim_names";
 * torch 2.14 a layout of one (size, stride) per dim ("_layout": "axes" of _FlatLayouts) over a 1-D
 * rank map ("_rank_map") and "_mesh_dim_names", the rank at a coordinate being
 * rank_map[sum(coordinate x stride)]. */
typedef struct {
    const CkptfsPy *ranks; /* the mesh tensor, or the rank map */
    const CkptfsPy *names;
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS];
    uint64_t stride[CKPTFS_MAX_DIMS]; /* into the rank map; the tensor's row-major strides otherwise */
} MeshForm;

/* One axis of a torch 2.14 mesh layout: a _FlatLayout of one size and stride (coalesced). */
static bool layout_axis(const CkptfsPy *axis, uint64_t *size, uint64_t *stride)
{
    const CkptfsPy *state = ckptfs_py_object_state(axis);
    uint64_t sizes[CKPTFS_MAX_DIMS], strides[CKPTFS_MAX_DIMS];
    unsigned nsize, nstride;
    if (state == NULL || state->kind != CKPTFS_PY_DICT ||
        !ckptfs_py_dims(ckptfs_py_dict_get(state, "shape"), sizes, &nsize) ||
        !ckptfs_py_dims(ckptfs_py_dict_get(state, "stride"), strides, &nstride) || nsize != 1 || nstride != 1)
        return false;
    *size = sizes[0];
    *stride = strides[0];
    return true;
}

static bool mesh_form(Fsdp *f, const Rank *r, const char *key, const CkptfsPy *mesh, MeshForm *out)
{
    *out = (MeshForm){0};
    const CkptfsPy *t = ckptfs_py_dict_get(mesh, "mesh");
    if (mesh != NULL && mesh->kind == CKPTFS_PY_DICT && t != NULL && t->kind == CKPTFS_PY_TENSOR) {
        out->ranks = t;
        out->names = ckptfs_py_dict_get(mesh, "mesh_dim_names");
        out->ndim = t->tensor->ndim;
        memcpy(out->shape, t->tensor->shape, sizeof out->shape);
        uint64_t step = 1;
        for (unsigned i = out->ndim; i-- > 0; step *= out->shape[i])
            out->stride[i] = step;
        return true;
    }
    const CkptfsPy *layout = ckptfs_py_object_state(ckptfs_py_dict_get(mesh, "_layout"));
    const CkptfsPy *axes = ckptfs_py_dict_get(layout, "axes");
    const CkptfsPy *rank_map = ckptfs_py_dict_get(mesh, "_rank_map");
    if (mesh == NULL || mesh->kind != CKPTFS_PY_DICT || layout == NULL || layout->kind != CKPTFS_PY_DICT ||
        rank_map == NULL || rank_map->kind != CKPTFS_PY_TENSOR)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensor has no device mesh tensor (torch 2.6) or "
                    "layout and rank map (torch 2.14)", r->path, key);
    if (axes == NULL || (axes->kind != CKPTFS_PY_TUPLE && axes->kind != CKPTFS_PY_LIST) ||
        axes->items->len > CKPTFS_MAX_DIMS)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's layout has no tuple of axes", r->path, key);
    if (rank_map->tensor->ndim != 1)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's rank map is not 1-D", r->path, key);
    out->ranks = rank_map;
    out->names = ckptfs_py_dict_get(mesh, "_mesh_dim_names");
    out->ndim = axes->items->len;
    for (unsigned i = 0; i < out->ndim; i++)
        if (!layout_axis(item(axes, i), &out->shape[i], &out->stride[i]))
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': axis %u of its device mesh's layout is not one "
                        "size and stride (not read)", r->path, key, i);
    return true;
}

/* The rank at each coordinate of FORM, row-major, read from R's file (W values). */
static bool mesh_ranks(Fsdp *f, Rank *r, const char *key, const MeshForm *form, int64_t *out)
{
    const CkptfsPyTensor *m = form->ranks->tensor;
    uint64_t count;
    if (!ckptfs_dims_product(m->shape, m->ndim, &count) || count > MAX_WORLD_SIZE)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's ranks tensor holds more than %u ranks",
                    r->path, key, MAX_WORLD_SIZE);
    g_autofree int64_t *ranks = g_new(int64_t, MAX(count, 1));
    if (!read_mesh_values(f, r, key, form->ranks, count, ranks))
        return false;
    for (unsigned i = 0; i < f->W; i++) {
        uint64_t at = 0, rest = i;
        for (unsigned d = form->ndim; d-- > 0; rest /= form->shape[d])
            at += rest % form->shape[d] * form->stride[d];
        if (at >= count)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's layout reaches past its rank map of %"
                        G_GUINT64_FORMAT, r->path, key, count);
        out[i] = ranks[at];
    }
    return true;
}

/* A DTensor's DeviceMesh (its state dict MESH): the first one seen, rank 0's, is the reference;
 * every other must have its shape and names, and the reference must put rank R where the file's
 * _coordinate_on_dim says. */
static bool check_mesh(Fsdp *f, Rank *r, const char *key, const CkptfsPy *mesh)
{
    if (mesh != NULL && mesh == r->mesh_seen)
        return true;
    MeshForm form;
    if (!mesh_form(f, r, key, mesh, &form))
        return false;
    unsigned ndim = form.ndim;
    g_autofree char *names = mesh_names_text(form.names);
    g_autofree char *shape = ckptfs_dims_text(form.shape, ndim);
    if (names == NULL)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh's mesh_dim_names are not strings", r->path,
                    key);
    if (ndim == 0 || ndim > 2)
        return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': a %u-D device mesh %s (%s) is not read (only "
                    "(fsdp) and HSDP's (ddp, fsdp))", r->path, key, ndim, shape, names);
    if (strcmp(names, ndim == 1 ? "fsdp" : "ddp, fsdp") != 0)
        return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': device mesh %s with dims named (%s) is not read "
                    "(only (fsdp) and HSDP's (ddp, fsdp))", r->path, key, shape, names);
    uint64_t numel;
    if (!ckptfs_dims_product(form.shape, ndim, &numel) || numel != f->W)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': device mesh %s does not hold the %u ranks of the world "
                    "size", r->path, key, shape, f->W);
    if (f->mesh != NULL && f->mesh_ndim == 0)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is a DTensor, but rank 0 holds plain tensors only", r->path,
                    key);
    if (f->mesh == NULL) {
        /* The rank at each coordinate is read once, here; the other files' meshes must have
         * its shape and names, and their _coordinate_on_dim must agree with it. */
        g_autofree int64_t *values = g_new(int64_t, f->W);
        if (!mesh_ranks(f, r, key, &form, values))
            return false;
        f->position = g_new(unsigned, f->W);
        g_autofree bool *has = g_new0(bool, f->W);
        for (unsigned i = 0; i < f->W; i++) {
            if (values[i] < 0 || values[i] >= f->W || has[values[i]])
                return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': device mesh %s does not name each of the ranks "
                            "0..%u once", r->path, key, shape, f->W - 1);
            has[values[i]] = true;
            f->position[values[i]] = i;
        }
        f->mesh_ndim = ndim;
        memcpy(f->mesh_shape, form.shape, ndim * sizeof *f->mesh_shape);
        f->mesh_names = g_strdup(names);
        f->mesh = g_steal_pointer(&values);
        f->row = (unsigned)f->mesh_shape[ndim - 1];
    } else if (ndim != f->mesh_ndim || memcmp(form.shape, f->mesh_shape, ndim * sizeof *f->mesh_shape) != 0 ||
               strcmp(names, f->mesh_names) != 0) {
        g_autofree char *want = ckptfs_dims_text(f->mesh_shape, f->mesh_ndim);
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its device mesh %s (%s) is not rank 0's %s (%s)", r->path,
                    key, shape, names, want, f->mesh_names);
    }
    /* Where the mesh puts this file's rank, and where the file says it is. */
    unsigned at = f->position[r->rank];
    uint64_t coord[2] = {at / f->row, at % f->row}, *want = ndim == 1 ? coord + 1 : coord;
    /* Older torch saves no _coordinate_on_dim: then the mesh alone places the file. */
    const CkptfsPy *said = ckptfs_py_dict_get(mesh, "_coordinate_on_dim");
    if (said != NULL && said->kind != CKPTFS_PY_NONE) {
        bool same = (said->kind == CKPTFS_PY_LIST || said->kind == CKPTFS_PY_TUPLE) && said->items->len == ndim;
        for (unsigned i = 0; same && i < ndim; i++)
            same = is_int(item(said, i)) && (uint64_t)item(said, i)->i == want[i];
        if (!same) {
            g_autofree char *where = ckptfs_dims_text(want, ndim);
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its _coordinate_on_dim is not %s, where the device "
                        "mesh puts rank %u", r->path, key, where, r->rank);
        }
    }
    r->mesh_seen = mesh;
    return true;
}

/* The placement on each mesh dim: Replicate, or Shard on the last (fsdp) dim only. */
static bool read_placements(Fsdp *f, Rank *r, const char *key, const CkptfsPy *placements, unsigned ndim,
                            Entry *e)
{
    if (placements == NULL || placements->kind != CKPTFS_PY_TUPLE || placements->items->len != f->mesh_ndim)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its placements are not a tuple of %u (one per mesh dim)",
                    r->path, key, f->mesh_ndim);
    for (guint i = 0; i < placements->items->len; i++) {
        const CkptfsPy *p = g_ptr_array_index(placements->items, i);
        const CkptfsPy *cls = p->kind == CKPTFS_PY_OBJECT ? p->callable : NULL;
        if (cls == NULL || cls->kind != CKPTFS_PY_GLOBAL)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': placement %u is not a placement object", r->path, key, i);
        bool last = i + 1 == placements->items->len;
        if (is_dist_class(cls, "Replicate")) {
            if (last)
                e->place = PLACE_REPLICATE;
            continue;
        }
        if (!is_dist_class(cls, "Shard")) {
            g_autofree char *module = shown(cls->module), *name = shown(cls->name);
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': placement %s.%s is not read (only Shard and "
                        "Replicate)", r->path, key, module, name);
        }
        /* Shard(dim): its state {'dim': d}, or the argument when built by calling the class. */
        const CkptfsPy *dim = p->state ? ckptfs_py_dict_get(p->state, "dim") : item(p->args, 0);
        if (!is_int(dim) || (uint64_t)dim->i >= ndim)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': Shard's dim is not one of the tensor's %u dims", r->path,
                        key, ndim);
        if (!last)
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': Shard(%" G_GINT64_FORMAT ") on mesh dim %u of (%s) "
                        "is not read (only the last mesh dim may shard)", r->path, key, dim->i, i, f->mesh_names);
        e->place = PLACE_SHARD;
        e->dim = (unsigned)dim->i;
    }
    return true;
}

/* The DTensorSpec's tensor_meta, TensorMeta(shape, stride, dtype) (None or absent in older
 * torch): the global shape, strides and dtype once more. torch.load takes a file where they are
 * not the DTensor's own, but its sharding propagation works from the spec's: which of the two the
 * tensor is cannot be known, so such a file is refused. */
static bool check_tensor_meta(Fsdp *f, const Rank *r, const char *key, const CkptfsPy *meta, const Entry *e,
                              const CkptfsPy *wrapper_stride, CkptfsDtype dtype)
{
    if (meta == NULL || meta->kind == CKPTFS_PY_NONE)
        return true;
    const CkptfsPy *cls = meta->kind == CKPTFS_PY_OBJECT ? meta->callable : NULL;
    uint64_t shape[CKPTFS_MAX_DIMS], stride[CKPTFS_MAX_DIMS], own_stride[CKPTFS_MAX_DIMS];
    unsigned nshape = 0, nstride = 0, own_nstride = 0;
    const CkptfsPy *meta_dtype = item(meta->args, 2);
    if (!is_dist_class(cls, "TensorMeta") || !ckptfs_py_dims(item(meta->args, 0), shape, &nshape) ||
        !ckptfs_py_dims(item(meta->args, 1), stride, &nstride) || meta_dtype == NULL ||
        meta_dtype->kind != CKPTFS_PY_GLOBAL || strcmp(meta_dtype->module, "torch") != 0)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensorSpec's tensor_meta is not a TensorMeta(shape, "
                    "stride, dtype)", r->path, key);
    if (!ckptfs_py_dims(wrapper_stride, own_stride, &own_nstride))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensor has no global stride", r->path, key);
    bool same = nshape == e->ndim && memcmp(shape, e->shape, nshape * sizeof *shape) == 0 &&
                nstride == own_nstride && memcmp(stride, own_stride, nstride * sizeof *stride) == 0 &&
                ckptfs_dtype_from_torch_name(meta_dtype->name) == dtype;
    if (same)
        return true;
    g_autofree char *meta_shape = ckptfs_dims_text(shape, nshape), *meta_stride = ckptfs_dims_text(stride, nstride);
    g_autofree char *own_shape = ckptfs_dims_text(e->shape, e->ndim);
    g_autofree char *own_strides = ckptfs_dims_text(own_stride, own_nstride);
    CkptfsDtype said = ckptfs_dtype_from_torch_name(meta_dtype->name);
    g_autofree char *meta_name = said != CKPTFS_DTYPE_INVALID ? g_strdup(ckptfs_dtype_safetensors_name(said))
                                                              : shown(meta_dtype->name);
    return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensorSpec's tensor_meta says shape %s, strides %s, %s; the "
                "DTensor is %s, strides %s, %s", r->path, key, meta_shape, meta_stride, meta_name, own_shape,
                own_strides, ckptfs_dtype_safetensors_name(dtype));
}

/* An entry of R's state dict: a plain tensor or a DTensor, rebuilt by
 * _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (DTensor, dtype, size, stride, ...),
 * (None, {'_local_tensor': tensor, '_spec': DTensorSpec})). */
static bool decode_entry(Fsdp *f, Rank *r, const char *key, const CkptfsPy *v, Entry *e)
{
    *e = (Entry){0};
    if (plain_local(v, &e->local)) {
        e->place = PLACE_PLAIN;
        e->ndim = e->local.ndim;
        memcpy(e->shape, e->local.shape, sizeof e->shape);
        return true;
    }
    bool dtensor = v->kind == CKPTFS_PY_OBJECT &&
                   ckptfs_py_is_global(v->callable, "torch._tensor", "_rebuild_from_type_v2") &&
                   ckptfs_py_is_global(item(v->args, 0), "torch._utils", "_rebuild_wrapper_subclass") &&
                   is_dist_class(item(v->args, 1), "DTensor");
    if (!dtensor) {
        g_autofree char *what = what_is(v);
        return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' is not a tensor or DTensor (%s)", r->path, key, what);
    }
    const CkptfsPy *wrapper = item(v->args, 2), *state = item(v->args, 3);
    if (!ckptfs_py_dims(item(wrapper, 2), e->shape, &e->ndim))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensor has no global size", r->path, key);
    const CkptfsPy *dtype = item(wrapper, 1);
    CkptfsDtype global_dtype = dtype && dtype->kind == CKPTFS_PY_GLOBAL && strcmp(dtype->module, "torch") == 0
                                   ? ckptfs_dtype_from_torch_name(dtype->name)
                                   : CKPTFS_DTYPE_INVALID;
    /* The state is (dict, slots) or a dict; the DTensor's fields are in the dict given. */
    if (state && state->kind == CKPTFS_PY_TUPLE)
        state = item(state, 1) && item(state, 1)->kind == CKPTFS_PY_DICT ? item(state, 1) : item(state, 0);
    if (!plain_local(ckptfs_py_dict_get(state, "_local_tensor"), &e->local))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensor has no local tensor", r->path, key);
    if (global_dtype != e->local.dtype) {
        g_autofree char *name = shown(dtype && dtype->kind == CKPTFS_PY_GLOBAL ? dtype->name : "(not a dtype)");
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': the DTensor's dtype %s is not its local storage's %s",
                    r->path, key, name, ckptfs_dtype_safetensors_name(e->local.dtype));
    }
    const CkptfsPy *spec = ckptfs_py_object_state(ckptfs_py_dict_get(state, "_spec"));
    if (spec == NULL || spec->kind != CKPTFS_PY_DICT)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its DTensor has no DTensorSpec", r->path, key);
    return check_tensor_meta(f, r, key, ckptfs_py_dict_get(spec, "tensor_meta"), e, item(wrapper, 3),
                             global_dtype) &&
           check_mesh(f, r, key, ckptfs_py_object_state(ckptfs_py_dict_get(spec, "mesh"))) &&
           read_placements(f, r, key, ckptfs_py_dict_get(spec, "placements"), e->ndim, e);
}

/* --- keys and pieces --- */

/* STR with every FROM replaced by TO (as Python's str.replace). */
static char *replace_all(const char *str, const char *from, const char *to)
{
    g_auto(GStrv) parts = g_strsplit(str, from, -1);
    return g_strjoinv(to, parts);
}

/* A LoRA run's names as verl's merger serves them: adapter matrices (any "lora_" key) under
 * PEFT's saved names (without the adapter name "default"); the base weights without PEFT's
 * wrapping (base_model.model., .base_layer). */
static char *served_name(const char *key, bool *adapter)
{
    *adapter = strstr(key, "lora_") != NULL;
    if (*adapter)
        return replace_all(key, ".default.weight", ".weight");
    g_autofree char *a = replace_all(key, "base_model.model.", "");
    g_autofree char *b = replace_all(a, ".base_layer.weight", ".weight");
    return replace_all(b, ".base_layer.bias", ".bias");
}

/* The keys of the first rank read: names, global shapes, types, placements. */
static bool make_keys(Fsdp *f, Rank *r)
{
    const GPtrArray *items = r->dict->items;
    if (items->len / 2 > CKPTFS_MAX_SOURCE_TENSORS)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: %u state dict entries (limit %u)", r->path, items->len / 2,
                    CKPTFS_MAX_SOURCE_TENSORS);
    f->first = r->path;
    for (guint i = 0; i + 1 < items->len && !f->lora; i += 2) {
        const char *name = ckptfs_py_str(g_ptr_array_index(items, i));
        f->lora = name != NULL && strstr(name, "lora_") != NULL;
    }
    for (guint i = 0; i + 1 < items->len; i += 2) {
        const char *name = ckptfs_py_str(g_ptr_array_index(items, i));
        if (!check_key_text(f, r, name, i / 2))
            return false;
        if (g_hash_table_contains(f->by_name, name))
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is given twice", r->path, name);
        Entry e;
        if (!decode_entry(f, r, name, g_ptr_array_index(items, i + 1), &e))
            return false;
        if (e.local.dtype == CKPTFS_DTYPE_INVALID)
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has a storage type ckptfs does not know", r->path,
                        name);
        uint64_t numel, bytes, outer = 1;
        if (!ckptfs_dims_product(e.shape, e.ndim, &numel) ||
            !ckptfs_mul_u64(numel, ckptfs_dtype_size(e.local.dtype), &bytes))
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its global shape overflows 64 bits", r->path, name);
        /* Shard(d > 0) is a block of columns of the [shape[0], rest] matrix only when the dims
         * between 0 and d are 1. */
        if (e.place == PLACE_SHARD && e.dim > 1)
            ckptfs_dims_product(e.shape + 1, e.dim - 1, &outer);
        if (outer != 1) {
            g_autofree char *shape = ckptfs_dims_text(e.shape, e.ndim);
            return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s': Shard(%u) of a %s tensor is not a block of rows "
                        "or columns (not read)", r->path, name, e.dim, shape);
        }
        Key k = {.name = g_strdup(name), .dtype = e.local.dtype, .ndim = e.ndim, .place = e.place, .dim = e.dim,
                 .pieces = g_array_new(FALSE, FALSE, sizeof(CkptfsPiece))};
        /* The names save_pretrained writes (verl's merger saves through it) for the module names
         * the shards are keyed by. */
        g_autofree char *unwrapped = f->lora ? served_name(name, &k.adapter) : g_strdup(name);
        k.served = ckptfs_name_renamed(unwrapped, f->arch ? f->arch->saved_names : NULL);
        memcpy(k.shape, e.shape, sizeof k.shape);
        g_array_append_val(f->keys, k);
        g_hash_table_insert(f->by_name, k.name, GUINT_TO_POINTER(f->keys->len));
    }
    return true;
}

static const char *place_text(Place p)
{
    return p == PLACE_PLAIN ? "a plain tensor" : p == PLACE_REPLICATE ? "Replicate" : "Shard";
}

/* Adds the piece of entry E of R (at coordinate COORD of the first row) to its key. */
static bool add_entry(Fsdp *f, Rank *r, unsigned coord, Key *k, const Entry *e)
{
    const Local *l = &e->local;
    if (e->ndim != k->ndim || memcmp(e->shape, k->shape, k->ndim * sizeof *k->shape) != 0) {
        g_autofree char *got = ckptfs_dims_text(e->shape, e->ndim);
        g_autofree char *want = ckptfs_dims_text(k->shape, k->ndim);
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' has global shape %s, but %s says %s", r->path, k->name, got,
                    f->first, want);
    }
    if (e->place != k->place || e->dim != k->dim || l->dtype != k->dtype)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is %s(%u) of %s, but %s has %s(%u) of %s", r->path, k->name,
                    place_text(e->place), e->dim, ckptfs_dtype_safetensors_name(l->dtype), f->first,
                    place_text(k->place), k->dim, ckptfs_dtype_safetensors_name(k->dtype));
    bool shard = k->place == PLACE_SHARD, fits = l->ndim == k->ndim;
    for (unsigned i = 0; fits && i < k->ndim; i++)
        fits = l->shape[i] == k->shape[i] || (shard && i == k->dim);
    if (!fits) {
        g_autofree char *local = ckptfs_dims_text(l->shape, l->ndim);
        g_autofree char *global = ckptfs_dims_text(k->shape, k->ndim);
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': local shape %s does not fit global shape %s (%s)", r->path,
                    k->name, local, global, shard ? "sharded" : "one whole copy");
    }
    if (!check_storage(f, r, k->name, "its local tensor", l))
        return false;
    if (!shard && coord > 0)
        return true; /* the copy of the first rank is read */
    uint64_t start = 0, count = shard ? l->shape[k->dim] : 0;
    if (shard) {
        if (count > k->shape[k->dim] - k->filled)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its %" G_GUINT64_FORMAT " of dim %u after the %"
                        G_GUINT64_FORMAT " of the ranks before it exceed the global %" G_GUINT64_FORMAT " (the "
                        "shards do not tile the global shape)", r->path, k->name, count, k->dim, k->filled,
                        k->shape[k->dim]);
        start = k->filled;
        k->filled += count;
    }
    /* The 2-D views: the global [rows, cols], the local [lrows, lcols] a rectangle of it. Every
     * product is at most the global element count, checked at make_keys. */
    uint64_t rows = k->ndim ? k->shape[0] : 1, cols = 1, inner = 1;
    for (unsigned i = 1; i < k->ndim; i++)
        cols *= k->shape[i];
    for (unsigned i = k->dim + 1; shard && i < k->ndim; i++)
        inner *= k->shape[i];
    CkptfsPiece piece = {.row0 = 0, .row1 = rows, .col0 = 0, .col1 = cols, .src = r->src};
    if (shard && k->dim == 0)
        piece.row0 = start, piece.row1 = start + count;
    else if (shard)
        piece.col0 = start * inner, piece.col1 = (start + count) * inner;
    uint64_t lrows = piece.row1 - piece.row0, lcols = piece.col1 - piece.col0;
    if (lrows == 0 || lcols == 0)
        return true; /* an empty shard (FSDP2 pads its record, FSDP1 leaves it empty) */
    /* Elements within a row adjacent, rows ROW_STEP elements apart: a piece is runs of bytes. */
    uint64_t want = 1, row_step = lrows > 1 ? l->stride[0] : lcols;
    for (unsigned i = l->ndim; i-- > 1; want *= l->shape[i])
        if (l->shape[i] != 1 && l->stride[i] != want)
            row_step = 0;
    if (row_step < lcols)
        return fail(f, CKPTFS_ERROR_UNSUPPORTED, "%s: '%s' has strides that are not row-major", r->path, k->name);
    g_autofree char *record = g_strdup_printf("data/%s", l->storage_key);
    const CkptfsZipEntry *z = ckptfs_zip_find(r->zip, record);
    g_autofree char *record_name = shown(record);
    size_t isz = ckptfs_dtype_size(k->dtype);
    uint64_t end;
    if (z == NULL)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its storage record %s is missing", r->path, k->name,
                    record_name);
    /* The last row's end, checked before it is compared with the record: wrapped, it would pass. */
    if (!ckptfs_rows_end(l->offset, lrows, row_step, lcols, isz, &end))
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': %" G_GUINT64_FORMAT " rows %" G_GUINT64_FORMAT " elements "
                    "apart from storage offset %" G_GUINT64_FORMAT " overflow 64 bits", r->path, k->name, lrows,
                    row_step, l->offset);
    if (end > z->size)
        return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s': its local tensor reaches byte %" G_GUINT64_FORMAT " of "
                    "storage record %s, which has %" G_GUINT64_FORMAT, r->path, k->name, end, record_name, z->size);
    if (k->dropped)
        return true;
    /* offset * isz and (lrows - 1) * row_step * isz are at most END: no overflow. */
    piece.offset = z->data_offset + l->offset * isz;
    piece.row_stride = row_step * isz;
    g_array_append_val(k->pieces, piece);
    return true;
}

/* Every entry of R (at coordinate COORD of the first row): the same keys as the first rank, each
 * adding its piece. Ranks save their keys in the same order: a key is looked up by name only
 * when it is not where the first rank had it. */
static bool read_rank(Fsdp *f, Rank *r, unsigned coord)
{
    const GPtrArray *items = r->dict->items;
    unsigned nkeys = f->keys->len;
    g_autofree uint8_t *seen = g_new0(uint8_t, nkeys ? nkeys : 1);
    for (guint i = 0; i + 1 < items->len; i += 2) {
        const char *name = ckptfs_py_str(g_ptr_array_index(items, i));
        if (!check_key_text(f, r, name, i / 2))
            return false;
        guint at = i / 2;
        if (at >= nkeys || strcmp(g_array_index(f->keys, Key, at).name, name) != 0)
            at = GPOINTER_TO_UINT(g_hash_table_lookup(f->by_name, name)) - 1;
        if (at == G_MAXUINT)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is not in %s (the ranks' state dicts differ)", r->path,
                        name, f->first);
        if (seen[at]++)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is given twice", r->path, name);
        Entry e;
        if (!decode_entry(f, r, name, g_ptr_array_index(items, i + 1), &e) ||
            !add_entry(f, r, coord, &g_array_index(f->keys, Key, at), &e))
            return false;
    }
    for (unsigned k = 0; k < nkeys; k++)
        if (!seen[k])
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' is missing (%s has it)", r->path,
                        g_array_index(f->keys, Key, k).name, f->first);
    return true;
}

/* The mesh from rank 0's first DTensor; without one (plain tensors), rank 0 alone is read. */
static bool find_mesh(Fsdp *f, Rank *r0)
{
    const GPtrArray *items = r0->dict->items;
    for (guint i = 0; i + 1 < items->len; i += 2) {
        const char *name = ckptfs_py_str(g_ptr_array_index(items, i));
        Entry e;
        if (!check_key_text(f, r0, name, i / 2))
            return false;
        if (!plain_local(g_ptr_array_index(items, i + 1), &e.local))
            return decode_entry(f, r0, name, g_ptr_array_index(items, i + 1), &e);
    }
    f->row = 1;
    f->mesh = g_new0(int64_t, 1); /* coordinate 0: rank 0 */
    return true;
}

/* The files hf/ passes through (config, tokenizer, generation_config) from huggingface/, and
 * config.json parsed. Weights saved there too (verl's hf_model) are left out: hf/ makes its own
 * from the shards. */
static bool read_hf_dir(Fsdp *f)
{
    CkptfsSource *source = f->source;
    g_autofree char *dir = g_build_filename(source->dir, HF_DIR, NULL);
    if (!g_file_test(dir, G_FILE_TEST_IS_DIR)) {
        source->config_problem = g_strdup_printf("%s: missing (no config.json or tokenizer)", dir);
        g_ptr_array_add(source->warnings, g_strdup_printf("%s; hf/ holds the weights only", source->config_problem));
        return true;
    }
    GError *dir_error = NULL;
    g_autoptr(GDir) d = g_dir_open(dir, 0, &dir_error);
    if (d == NULL) {
        fail(f, CKPTFS_ERROR_IO, "%s: cannot list: %s", dir, dir_error->message);
        g_error_free(dir_error);
        return false;
    }
    const char *name;
    while ((name = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(dir, name, NULL);
        if (!g_file_test(path, G_FILE_TEST_IS_REGULAR) || g_str_has_suffix(name, ".safetensors") ||
            g_str_has_suffix(name, ".bin") || g_str_has_suffix(name, ".index.json"))
            continue;
        if (!ckptfs_source_add_file(source, name, path, f->error))
            return false;
    }
    g_autofree char *path = g_build_filename(dir, "config.json", NULL);
    if (ckptfs_source_top_file(source, "config.json") == NULL) {
        source->config_problem = g_strdup_printf("%s: missing", path);
    } else {
        GError *json_error = NULL;
        source->config = ckptfs_json_load_object(path, &json_error);
        if (source->config == NULL) {
            source->config_problem = g_strdup(json_error->message);
            g_error_free(json_error);
        }
    }
    if (source->config == NULL)
        g_ptr_array_add(source->warnings,
                        g_strdup_printf("%s; hf/ works, model-specific views need it", source->config_problem));
    return true;
}

/* Every key with its pieces tiling its global shape, into the catalog in the first rank's order. */
static bool to_catalog(Fsdp *f)
{
    for (guint i = 0; i < f->keys->len; i++) {
        const Key *k = &g_array_index(f->keys, Key, i);
        if (k->dropped)
            continue;
        if (k->place == PLACE_SHARD && k->filled != k->shape[k->dim]) {
            g_autofree char *shape = ckptfs_dims_text(k->shape, k->ndim);
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: '%s' has global shape %s, but the local shards of the %u "
                        "ranks read hold %" G_GUINT64_FORMAT " of its %" G_GUINT64_FORMAT " along dim %u (the "
                        "shards do not tile it)", f->first, k->name, shape, f->row, k->filled, k->shape[k->dim],
                        k->dim);
        }
        if (k->adapter && f->source->adapter == NULL)
            f->source->adapter = ckptfs_catalog_new();
        if (!ckptfs_catalog_add_pieces(k->adapter ? f->source->adapter : f->source->catalog, k->served, k->dtype,
                                       k->ndim, k->shape, (const CkptfsPiece *)(void *)k->pieces->data,
                                       k->pieces->len, f->error)) {
            g_prefix_error(f->error, "%s: ", f->first);
            return false;
        }
    }
    return true;
}

/* "step 1, role actor" from a directory global_step_N/ROLE; empty otherwise. */
static char *step_role(const char *dir)
{
    g_autofree char *abs = g_canonicalize_filename(dir, NULL);
    g_autofree char *role = g_path_get_basename(abs);
    g_autofree char *parent = g_path_get_dirname(abs);
    g_autofree char *step = g_path_get_basename(parent);
    const char *n = step + strlen("global_step_");
    if (!g_str_has_prefix(step, "global_step_") || *n == '\0' || strspn(n, "0123456789") != strlen(n))
        return g_strdup("");
    return g_strdup_printf(", step %s, role %s", n, role);
}

static void describe_found(Fsdp *f)
{
    g_autoptr(GString) s = g_string_new("verl ");
    if (f->version > 0)
        g_string_append_printf(s, "FSDP%" G_GINT64_FORMAT, f->version);
    else
        g_string_append(s, "FSDP (no " CONFIG_NAME ")");
    g_string_append_printf(s, " shards: world size %u, ", f->W);
    if (f->mesh_ndim == 0) {
        g_string_append(s, "plain tensors (rank 0 read)");
    } else {
        g_autofree char *shape = ckptfs_dims_text(f->mesh_shape, f->mesh_ndim);
        g_string_append_printf(s, "mesh %s (%s)", shape, f->mesh_names);
        if (f->row < f->W) {
            g_string_append(s, ", ranks of the first row read:");
            for (unsigned j = 0; j < f->row && j < LIST_MAX; j++)
                g_string_append_printf(s, " %" G_GINT64_FORMAT, f->mesh[j]);
            if (f->row > LIST_MAX)
                g_string_append(s, " ...");
        }
    }
    g_autofree char *where = step_role(f->source->dir);
    g_string_append(s, where);
    /* The stored element types, in the order of their first tensor. */
    bool listed[CKPTFS_DTYPE_COUNT] = {false};
    g_string_append(s, ", stored as");
    for (guint i = 0; i < f->keys->len; i++) {
        CkptfsDtype d = g_array_index(f->keys, Key, i).dtype;
        if (!listed[d])
            g_string_append_printf(s, " %s", ckptfs_dtype_safetensors_name(d));
        listed[d] = true;
    }
    if (f->keys->len == 0)
        g_string_append(s, " nothing (no tensors)");
    if (f->source->adapter != NULL)
        g_string_append_printf(s, "; LoRA: %u adapter matrices in hf/lora_adapter/",
                               ckptfs_catalog_count(f->source->adapter));
    f->source->found = g_string_free(g_steal_pointer(&s), FALSE);
}

/* adapter_config.json as PEFT writes it for the adapter: rank and alpha from verl's
 * lora_train_meta.json, the target modules from the adapter's names (as verl's merger finds them). */
static bool adapter_config(Fsdp *f)
{
    CkptfsSource *source = f->source;
    if (source->adapter == NULL)
        return true;
    g_autofree char *meta_path = g_build_filename(source->dir, "lora_train_meta.json", NULL);
    g_autoptr(JsonObject) meta = NULL;
    int64_t r = 0;
    double alpha = 0;
    const char *task = "CAUSAL_LM";
    if (g_file_test(meta_path, G_FILE_TEST_EXISTS)) {
        meta = ckptfs_json_load_object(meta_path, f->error);
        if (meta == NULL)
            return false;
        /* PEFT takes any number for alpha (16.0 from Python is common). */
        bool numeric = ckptfs_json_member_number(meta, "lora_alpha", &alpha) == CKPTFS_JSON_FOUND;
        if (!json_int(meta, "r", &r) || r < 1 || !numeric)
            return fail(f, CKPTFS_ERROR_FORMAT, "%s: no whole \"r\" of at least 1 and numeric \"lora_alpha\"",
                        meta_path);
        const char *given_task = ckptfs_json_member_string(meta, "task_type");
        if (given_task != NULL)
            task = given_task;
    }
    g_autoptr(GPtrArray) modules = g_ptr_array_new_with_free_func(g_free);
    for (unsigned i = 0; i < ckptfs_catalog_count(source->adapter); i++) {
        const CkptfsTensor *t = ckptfs_catalog_at(source->adapter, i);
        g_auto(GStrv) parts = g_strsplit(t->name, ".", -1);
        guint n = g_strv_length(parts);
        /* ...q_proj.lora_A.weight: the module is third from the end */
        if (n >= 3 && !g_ptr_array_find_with_equal_func(modules, parts[n - 3], g_str_equal, NULL))
            g_ptr_array_add(modules, g_strdup(parts[n - 3]));
        if (meta == NULL && t->ndim == 2 && strstr(t->name, "lora_A") != NULL)
            r = (int64_t)MIN(t->shape[0], t->shape[1]);
    }
    g_ptr_array_sort(modules, compare_names);
    if (meta == NULL) {
        /* Runs older than the file: the scale cannot be known; say so rather than guess quietly. */
        alpha = (double)r;
        g_ptr_array_add(source->warnings,
                        g_strdup_printf("%s: missing: lora_adapter/adapter_config.json says lora_alpha = r = %"
                                        G_GINT64_FORMAT "; set it to the run's value", meta_path, r));
    }
    JsonObject *c = json_object_new();
    json_object_set_object_member(c, "alpha_pattern", json_object_new());
    json_object_set_null_member(c, "base_model_name_or_path");
    json_object_set_string_member(c, "bias", "none");
    json_object_set_boolean_member(c, "fan_in_fan_out", false);
    json_object_set_boolean_member(c, "inference_mode", true);
    json_object_set_boolean_member(c, "init_lora_weights", true);
    json_object_set_null_member(c, "layers_pattern");
    json_object_set_null_member(c, "layers_to_transform");
    if (alpha == (double)(int64_t)alpha) /* written back as given: 16, or 16.5 */
        json_object_set_int_member(c, "lora_alpha", (int64_t)alpha);
    else
        json_object_set_double_member(c, "lora_alpha", alpha);
    json_object_set_double_member(c, "lora_dropout", 0.0);
    json_object_set_null_member(c, "modules_to_save");
    json_object_set_string_member(c, "peft_type", "LORA");
    json_object_set_int_member(c, "r", r);
    json_object_set_object_member(c, "rank_pattern", json_object_new());
    JsonArray *targets = json_array_new();
    for (guint i = 0; i < modules->len; i++)
        json_array_add_string_element(targets, g_ptr_array_index(modules, i));
    json_object_set_array_member(c, "target_modules", targets);
    json_object_set_string_member(c, "task_type", task);
    json_object_set_boolean_member(c, "use_dora", false);
    json_object_set_boolean_member(c, "use_rslora", false);
    source->adapter_config = c;
    return true;
}

static bool read_shards(Fsdp *f)
{
    Rank r = {0};
    bool ok = open_rank(f, 0, &r) && find_mesh(f, &r);
    /* The first row's rank at coordinate 0 gives the keys (rank 0 unless the mesh is permuted). */
    if (ok && f->mesh[0] != 0) {
        rank_clear(&r);
        ok = open_rank(f, (unsigned)f->mesh[0], &r);
    }
    f->arch = ckptfs_source_architecture(f->source);
    ok = ok && make_keys(f, &r);
    bool tied = false;
    if (ok && f->source->config != NULL &&
        ckptfs_json_member_bool(f->source->config, "tie_word_embeddings", &tied) == CKPTFS_JSON_ABSENT)
        tied = f->arch != NULL && f->arch->tied_by_default;
    if (ok && tied) {
        /* verl's merger drops it: FSDP1 saves the tied head as its own copy, FSDP2 aliases it.
         * Found by the names the model holds (a text model's, or a VLM's language model's). */
        static const char *const embeddings[] = {"model.embed_tokens.weight",
                                                 "model.language_model.embed_tokens.weight", NULL};
        Key *head = NULL;
        bool embedding = false;
        for (guint i = 0; i < f->keys->len; i++) {
            Key *k = &g_array_index(f->keys, Key, i);
            g_autofree char *held = f->lora ? served_name(k->name, &(bool){false}) : g_strdup(k->name);
            embedding |= g_strv_contains(embeddings, held);
            if (strcmp(held, "lm_head.weight") == 0)
                head = k;
        }
        if (head != NULL && embedding)
            head->dropped = true;
    }
    for (unsigned j = 0; ok && j < f->row; j++) {
        if (j > 0) {
            rank_clear(&r);
            ok = open_rank(f, (unsigned)f->mesh[j], &r);
        }
        ok = ok && read_rank(f, &r, j);
    }
    ok = ok && to_catalog(f) && adapter_config(f);
    rank_clear(&r);
    return ok;
}

static bool open_fsdp(CkptfsSource *source, const CkptfsOptions *options, GError **error)
{
    (void)options;
    Fsdp f = {.source = source, .error = error, .keys = g_array_new(FALSE, FALSE, sizeof(Key)),
              .by_name = g_hash_table_new(g_str_hash, g_str_equal)};
    g_array_set_clear_func(f.keys, key_clear);
    bool ok = scan_files(&f) && read_hf_dir(&f) && read_shards(&f);
    if (ok) {
        describe_found(&f);
        /* verl's model_merger writes bf16 whatever the shards hold: serve what users get. */
        source->default_dtype = CKPTFS_SERVE_BF16;
    }
    for (unsigned i = 0; f.paths && i < f.W; i++)
        g_free(f.paths[i]);
    g_free(f.paths);
    g_free(f.mesh);
    g_free(f.position);
    g_free(f.mesh_names);
    g_hash_table_unref(f.by_name);
    g_array_unref(f.keys);
    return ok;
}

/* "4 rank files read of world size 4" from the files opened. */
static char *describe_fsdp(const CkptfsSource *source)
{
    unsigned read = 0, w = 0, r;
    for (unsigned i = 0; i < ckptfs_srcfiles_count(source->files); i++) {
        g_autofree char *base = g_path_get_basename(ckptfs_srcfiles_get(source->files, i)->path);
        if (parse_rank_name(base, &w, &r))
            read++;
    }
    return g_strdup_printf("%u rank file%s read of world size %u", read, read == 1 ? "" : "s", w);
}

const CkptfsSourceFormat ckptfs_format_verl_fsdp = {"verl-fsdp", probe_fsdp, open_fsdp, describe_fsdp};
