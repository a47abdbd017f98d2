/* torch.save files from values. The pickle is protocol 2 with the opcodes torch.save uses
 * (and torch.load(weights_only=True) accepts); the container is the zip layout of torch 2.x's
 * writer: STORED entries, data descriptors, every record 64-byte aligned through an "FB"
 * padding extra field, ZIP64 end records. CRC fields are 0 by default (torch's reader does not
 * check them); with compute_crc they are real CRC-32s, computed lazily by the read engine. */
#include "ckptfs/torchsave.h"

#include <string.h>

#include "ckptfs/error.h"

/* --- pickle --- */

enum {
    OP_MARK = '(', OP_STOP = '.', OP_BININT = 'J', OP_BININT1 = 'K', OP_BININT2 = 'M',
    OP_NONE = 'N', OP_BINPERSID = 'Q', OP_REDUCE = 'R', OP_BINUNICODE = 'X', OP_EMPTY_LIST = ']',
    OP_APPENDS = 'e', OP_BUILD = 'b', OP_GLOBAL = 'c', OP_EMPTY_DICT = '}', OP_SETITEMS = 'u',
    OP_TUPLE = 't', OP_EMPTY_TUPLE = ')', OP_BINFLOAT = 'G', OP_PROTO = 0x80, OP_NEWOBJ = 0x81,
    OP_TUPLE1 = 0x85, OP_TUPLE2 = 0x86, OP_TUPLE3 = 0x87, OP_NEWTRUE = 0x88, OP_NEWFALSE = 0x89,
    OP_LONG1 = 0x8a, OP_BINPUT = 'q', OP_LONG_BINPUT = 'r', OP_BINGET = 'h', OP_LONG_BINGET = 'j',
};

typedef struct {
    GByteArray *out; /* the pickle so far, but for its last STAGED bytes (pickler_out gives all) */
    uint8_t staged[256]; /* opcodes and fields are a few bytes: appended to OUT in one call */
    unsigned n_staged;
    GPtrArray *tensors; /* const CkptfsValue*, in storage key order; NULL: no tensors allowed */
    GHashTable *globals; /* "module\nname" -> memo index + 1, when globals are memoized */
    GError **error;
    bool failed;
} Pickler;

static GByteArray *pickler_out(Pickler *p)
{
    g_byte_array_append(p->out, p->staged, p->n_staged);
    p->n_staged = 0;
    return p->out;
}

static void put_bytes(Pickler *p, const void *data, size_t n)
{
    if (p->n_staged + n > sizeof p->staged) {
        pickler_out(p);
        if (n > sizeof p->staged) {
            g_byte_array_append(p->out, data, (guint)n);
            return;
        }
    }
    memcpy(p->staged + p->n_staged, data, n);
    p->n_staged += (unsigned)n;
}

static void put_byte(Pickler *p, uint8_t b)
{
    put_bytes(p, &b, 1);
}

/* The N low bytes of V (N <= 8), little-endian, appended at once: a rank file of a large model
 * holds thousands of such fields, and appending them byte by byte was a tenth of its plan. */
static void append_le(GByteArray *a, uint64_t v, unsigned n)
{
    uint8_t b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    g_byte_array_append(a, b, n);
}

static void put_le(Pickler *p, uint64_t v, unsigned n)
{
    uint8_t b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    put_bytes(p, b, n);
}

static void put_str(Pickler *p, const char *s)
{
    size_t n = strlen(s);
    put_byte(p, OP_BINUNICODE);
    put_le(p, n, 4);
    put_bytes(p, s, n);
}

static void put_memo_op(Pickler *p, uint8_t short_op, uint8_t long_op, uint64_t index)
{
    if (index <= 0xff) {
        put_byte(p, short_op);
        put_le(p, index, 1);
    } else {
        put_byte(p, long_op);
        put_le(p, index, 4);
    }
}

static void put_global(Pickler *p, const char *module, const char *name)
{
    g_autofree char *tag = p->globals ? g_strdup_printf("%s\n%s", module, name) : NULL;
    if (tag) { /* a big pickle names the same few classes thousands of times */
        gpointer known = g_hash_table_lookup(p->globals, tag);
        if (known) {
            put_memo_op(p, OP_BINGET, OP_LONG_BINGET, GPOINTER_TO_SIZE(known) - 1);
            return;
        }
    }
    put_byte(p, OP_GLOBAL);
    put_bytes(p, module, strlen(module));
    put_byte(p, '\n');
    put_bytes(p, name, strlen(name));
    put_byte(p, '\n');
    if (tag) {
        guint index = g_hash_table_size(p->globals);
        put_memo_op(p, OP_BINPUT, OP_LONG_BINPUT, index);
        g_hash_table_insert(p->globals, g_steal_pointer(&tag), GSIZE_TO_POINTER(index + 1));
    }
}

/* Python's choice of int opcode: BININT1/2 for small non-negative, BININT for int32, else LONG1
 * with the shortest two's complement. */
static void put_int(Pickler *p, int64_t v)
{
    if (v >= 0 && v <= 0xff) {
        put_byte(p, OP_BININT1);
        put_le(p, (uint64_t)v, 1);
    } else if (v >= 0 && v <= 0xffff) {
        put_byte(p, OP_BININT2);
        put_le(p, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        put_byte(p, OP_BININT);
        put_le(p, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {
        unsigned n = 8;
        while (n > 1) { /* drop redundant sign bytes */
            int64_t top = v >> (8 * (n - 1) - 1);
            if (top != 0 && top != -1)
                break;
            n--;
        }
        put_byte(p, OP_LONG1);
        put_byte(p, (uint8_t)n);
        put_le(p, (uint64_t)v, n);
    }
}

static void put_float(Pickler *p, double f)
{
    uint64_t bits;
    memcpy(&bits, &f, sizeof bits);
    put_byte(p, OP_BINFLOAT);
    for (int i = 7; i >= 0; i--)
        put_byte(p, (uint8_t)(bits >> (8 * i)));
}

static void put_tuple_of_ints(Pickler *p, const uint64_t *v, unsigned n)
{
    static const uint8_t small[] = {OP_EMPTY_TUPLE, OP_TUPLE1, OP_TUPLE2, OP_TUPLE3};
    if (n > 3)
        put_byte(p, OP_MARK);
    for (unsigned i = 0; i < n; i++)
        put_int(p, (int64_t)v[i]);
    put_byte(p, n > 3 ? OP_TUPLE : small[n]);
}

static const char *storage_class(CkptfsDtype dtype)
{
    switch (dtype) {
    case CKPTFS_DTYPE_BF16: return "BFloat16Storage";
    case CKPTFS_DTYPE_F16: return "HalfStorage";
    case CKPTFS_DTYPE_F32: return "FloatStorage";
    case CKPTFS_DTYPE_F64: return "DoubleStorage";
    case CKPTFS_DTYPE_I64: return "LongStorage";
    case CKPTFS_DTYPE_I32: return "IntStorage";
    case CKPTFS_DTYPE_I16: return "ShortStorage";
    case CKPTFS_DTYPE_I8: return "CharStorage";
    case CKPTFS_DTYPE_U8: return "ByteStorage";
    case CKPTFS_DTYPE_BOOL: return "BoolStorage";
    default: return NULL;
    }
}

static void fail(Pickler *p, const char *what, CkptfsDtype dtype)
{
    if (!p->failed)
        g_set_error(p->error, CKPTFS_ERROR, CKPTFS_ERROR_UNSUPPORTED,
                    "dtype %s has no torch %s", ckptfs_dtype_safetensors_name(dtype), what);
    p->failed = true;
}

/* torch._utils._rebuild_tensor_v2(storage, 0, size, stride, False, OrderedDict()) with the
 * storage as a persistent id ('storage', torch.XStorage, key, 'cpu', numel). */
static void put_tensor(Pickler *p, const CkptfsValue *v)
{
    const char *cls = storage_class(v->u.tensor.dtype);
    if (cls == NULL) {
        fail(p, "storage class", v->u.tensor.dtype);
        return;
    }
    unsigned ndim = v->u.tensor.ndim;
    uint64_t numel = 1, stride[CKPTFS_MAX_DIMS];
    for (unsigned d = ndim; d-- > 0;) {
        stride[d] = numel;
        numel *= v->u.tensor.shape[d];
    }
    if (p->tensors == NULL) {
        if (!p->failed)
            g_set_error(p->error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "a tensor in a plain pickle");
        p->failed = true;
        return;
    }
    char key[24];
    g_snprintf(key, sizeof key, "%u", p->tensors->len);
    g_ptr_array_add(p->tensors, (gpointer)v);

    put_global(p, "torch._utils", "_rebuild_tensor_v2");
    put_byte(p, OP_MARK);
    put_byte(p, OP_MARK);
    put_str(p, "storage");
    put_global(p, "torch", cls);
    put_str(p, key);
    put_str(p, "cpu");
    put_int(p, (int64_t)numel);
    put_byte(p, OP_TUPLE);
    put_byte(p, OP_BINPERSID);
    put_int(p, 0);
    put_tuple_of_ints(p, v->u.tensor.shape, ndim);
    put_tuple_of_ints(p, stride, ndim);
    put_byte(p, OP_NEWFALSE);
    put_global(p, "collections", "OrderedDict");
    put_byte(p, OP_EMPTY_TUPLE);
    put_byte(p, OP_REDUCE);
    put_byte(p, OP_TUPLE);
    put_byte(p, OP_REDUCE);
}

static void put_value(Pickler *p, const CkptfsValue *v);

static void put_items(Pickler *p, const GPtrArray *items, uint8_t closer)
{
    if (items->len == 0)
        return;
    put_byte(p, OP_MARK);
    for (guint i = 0; i < items->len; i++)
        put_value(p, g_ptr_array_index(items, i));
    put_byte(p, closer);
}

static void put_value(Pickler *p, const CkptfsValue *v)
{
    switch (v->kind) {
    case CKPTFS_VALUE_NONE:
        put_byte(p, OP_NONE);
        break;
    case CKPTFS_VALUE_BOOL:
        put_byte(p, v->u.b ? OP_NEWTRUE : OP_NEWFALSE);
        break;
    case CKPTFS_VALUE_INT:
        put_int(p, v->u.i);
        break;
    case CKPTFS_VALUE_FLOAT:
        put_float(p, v->u.f);
        break;
    case CKPTFS_VALUE_STR:
        put_str(p, v->u.s);
        break;
    case CKPTFS_VALUE_DICT:
        put_byte(p, OP_EMPTY_DICT);
        put_items(p, v->u.items, OP_SETITEMS);
        break;
    case CKPTFS_VALUE_ODICT: /* OrderedDict.__reduce__: (OrderedDict, ()), then its items */
        put_global(p, "collections", "OrderedDict");
        put_byte(p, OP_EMPTY_TUPLE);
        put_byte(p, OP_REDUCE);
        put_items(p, v->u.items, OP_SETITEMS);
        break;
    case CKPTFS_VALUE_LIST:
        put_byte(p, OP_EMPTY_LIST);
        put_items(p, v->u.items, OP_APPENDS);
        break;
    case CKPTFS_VALUE_TUPLE:
        put_byte(p, OP_MARK);
        for (guint i = 0; i < v->u.items->len; i++)
            put_value(p, g_ptr_array_index(v->u.items, i));
        put_byte(p, OP_TUPLE);
        break;
    case CKPTFS_VALUE_NAMESPACE: /* object.__reduce_ex__(2): copyreg.__newobj__ + state dict */
        put_global(p, "argparse", "Namespace");
        put_byte(p, OP_EMPTY_TUPLE);
        put_byte(p, OP_NEWOBJ);
        put_byte(p, OP_EMPTY_DICT);
        put_items(p, v->u.items, OP_SETITEMS);
        put_byte(p, OP_BUILD);
        break;
    case CKPTFS_VALUE_DTYPE: {
        const char *name = ckptfs_dtype_torch_name(v->u.dtype);
        if (name == NULL)
            fail(p, "dtype", v->u.dtype);
        else
            put_global(p, "torch", name);
        break;
    }
    case CKPTFS_VALUE_TENSOR:
        put_tensor(p, v);
        break;
    case CKPTFS_VALUE_OBJECT:
        put_global(p, v->u.object.module, v->u.object.name);
        put_value(p, v->u.object.args);
        put_byte(p, v->u.object.newobj ? OP_NEWOBJ : OP_REDUCE);
        if (v->u.object.state) {
            put_value(p, v->u.object.state);
            put_byte(p, OP_BUILD);
        }
        break;
    }
}

/* --- zip container --- */

#define ZIP_ALIGN 64
#define U32_MAX 0xffffffffu

typedef struct {
    char *name;
    uint64_t header_offset, data_offset, size;
} ZipEntry;

typedef struct {
    CkptfsPlanBuilder *b;
    uint64_t base; /* where the archive starts in the file: its offsets are relative to it */
    const char *archive;
    bool compute_crc;
    GArray *entries; /* ZipEntry, offsets relative to base */
} ZipWriter;

static uint64_t zip_pos(const ZipWriter *z)
{
    return ckptfs_plan_builder_size(z->b) - z->base;
}

static void le16(GByteArray *a, uint16_t v)
{
    append_le(a, v, 2);
}

static void le32(GByteArray *a, uint32_t v)
{
    append_le(a, v, 4);
}

static void le64(GByteArray *a, uint64_t v)
{
    append_le(a, v, 8);
}

static void literal(ZipWriter *z, GByteArray *a)
{
    ckptfs_plan_add_literal(z->b, a->data, a->len);
    g_byte_array_set_size(a, 0);
}

/* The CRC field of entry E: 0, or its lazily computed CRC-32 (pending bytes in A go first). */
static void crc_field(ZipWriter *z, GByteArray *a, const ZipEntry *e)
{
    if (!z->compute_crc) {
        le32(a, 0);
        return;
    }
    literal(z, a);
    ckptfs_plan_add_crc32(z->b, z->base + e->data_offset, e->size);
}

/* Local header with an "FB" extra field padding the data start to a multiple of 64. */
static void zip_begin_entry(ZipWriter *z, const char *name, uint64_t size)
{
    g_autofree char *full = g_strconcat(z->archive, "/", name, NULL);
    size_t name_len = strlen(full);
    uint64_t at = zip_pos(z);
    uint64_t data_at = at + 30 + name_len + 4;
    uint64_t pad = (ZIP_ALIGN - data_at % ZIP_ALIGN) % ZIP_ALIGN;
    ZipEntry e = {.name = g_steal_pointer(&full), .header_offset = at, .size = size,
                  .data_offset = data_at + pad};
    g_array_append_val(z->entries, e);

    g_autoptr(GByteArray) h = g_byte_array_sized_new((guint)(30 + name_len + 4 + pad));
    le32(h, 0x04034b50);
    le16(h, 0);      /* version needed, as torch writes it */
    le16(h, 0x0808); /* data descriptor follows; UTF-8 name */
    le16(h, 0);      /* STORED */
    le32(h, 0);      /* time, date */
    le32(h, 0);      /* CRC (in the descriptor) */
    le32(h, 0);      /* sizes (in the descriptor) */
    le32(h, 0);
    le16(h, (uint16_t)name_len);
    le16(h, (uint16_t)(4 + pad));
    g_byte_array_append(h, (const guint8 *)e.name, (guint)name_len);
    le16(h, 0x4246); /* "FB" */
    le16(h, (uint16_t)pad);
    static const char padding[ZIP_ALIGN] = {[0 ... ZIP_ALIGN - 1] = 'Z'};
    g_byte_array_append(h, (const guint8 *)padding, (guint)pad); /* pad < ZIP_ALIGN */
    literal(z, h);
}

static void zip_end_entry(ZipWriter *z, uint64_t size)
{
    const ZipEntry *e = &g_array_index(z->entries, ZipEntry, z->entries->len - 1);
    g_autoptr(GByteArray) d = g_byte_array_new();
    le32(d, 0x08074b50);
    crc_field(z, d, e);
    if (size >= U32_MAX) {
        le64(d, size);
        le64(d, size);
    } else {
        le32(d, (uint32_t)size);
        le32(d, (uint32_t)size);
    }
    literal(z, d);
}

static void zip_add_bytes(ZipWriter *z, const char *name, const void *data, size_t len)
{
    zip_begin_entry(z, name, len);
    ckptfs_plan_add_literal(z->b, data, len);
    zip_end_entry(z, len);
}

static void zip_finish(ZipWriter *z)
{
    g_autoptr(GByteArray) cd = g_byte_array_new();
    uint64_t cd_offset = zip_pos(z);
    /* The directory may be cut by CRC extents: its size is counted from the plan. */
    for (guint i = 0; i < z->entries->len; i++) {
        const ZipEntry *e = &g_array_index(z->entries, ZipEntry, i);
        bool big_size = e->size >= U32_MAX, big_offset = e->header_offset >= U32_MAX;
        uint16_t extra = (uint16_t)((big_size || big_offset) ? 4 + (big_size ? 16 : 0) + (big_offset ? 8 : 0) : 0);
        le32(cd, 0x02014b50);
        le16(cd, 0);      /* made by */
        le16(cd, 0);      /* needed */
        le16(cd, 0x0808);
        le16(cd, 0);
        le32(cd, 0);      /* time, date */
        crc_field(z, cd, e);
        le32(cd, big_size ? U32_MAX : (uint32_t)e->size);
        le32(cd, big_size ? U32_MAX : (uint32_t)e->size);
        le16(cd, (uint16_t)strlen(e->name));
        le16(cd, extra);
        le16(cd, 0);      /* comment */
        le16(cd, 0);      /* disk */
        le16(cd, 0);      /* internal attributes */
        le32(cd, 0);      /* external attributes */
        le32(cd, big_offset ? U32_MAX : (uint32_t)e->header_offset);
        g_byte_array_append(cd, (const guint8 *)e->name, (guint)strlen(e->name));
        if (extra) { /* ZIP64 extended information: only the fields that overflowed */
            le16(cd, 0x0001);
            le16(cd, (uint16_t)(extra - 4));
            if (big_size) {
                le64(cd, e->size);
                le64(cd, e->size);
            }
            if (big_offset)
                le64(cd, e->header_offset);
        }
    }
    literal(z, cd);
    uint64_t n = z->entries->len;
    uint64_t eocd64_offset = zip_pos(z);
    uint64_t cd_size = eocd64_offset - cd_offset;
    le32(cd, 0x06064b50); /* ZIP64 end of central directory */
    le64(cd, 44);
    le16(cd, 0x031e);
    le16(cd, 0x002d);
    le32(cd, 0);
    le32(cd, 0);
    le64(cd, n);
    le64(cd, n);
    le64(cd, cd_size);
    le64(cd, cd_offset);
    le32(cd, 0x07064b50); /* its locator */
    le32(cd, 0);
    le64(cd, eocd64_offset);
    le32(cd, 1);
    le32(cd, 0x06054b50); /* end of central directory */
    le16(cd, 0);
    le16(cd, 0);
    le16(cd, n >= 0xffff ? 0xffff : (uint16_t)n);
    le16(cd, n >= 0xffff ? 0xffff : (uint16_t)n);
    le32(cd, cd_size >= U32_MAX ? U32_MAX : (uint32_t)cd_size);
    le32(cd, cd_offset >= U32_MAX ? U32_MAX : (uint32_t)cd_offset);
    le16(cd, 0);
    literal(z, cd);
}

static Pickler pickler_new(bool with_tensors, bool memo_globals, GError **error)
{
    return (Pickler){.out = g_byte_array_new(), .tensors = with_tensors ? g_ptr_array_new() : NULL,
                     .globals = memo_globals ? g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL) : NULL,
                     .error = error};
}

static void pickler_clear(Pickler *p)
{
    g_byte_array_unref(p->out);
    if (p->tensors)
        g_ptr_array_unref(p->tensors);
    if (p->globals)
        g_hash_table_unref(p->globals);
}

static bool pickle_root(Pickler *p, const CkptfsValue *root)
{
    put_byte(p, OP_PROTO);
    put_byte(p, 2);
    put_value(p, root);
    put_byte(p, OP_STOP);
    return !p->failed;
}

/* The archive; SIZING_ONLY replaces tensor bytes by zero extents (same size, no source). */
static bool torchsave_append(CkptfsPlanBuilder *b, const CkptfsValue *root, const char *archive_name,
                             bool compute_crc, bool sizing_only, GError **error)
{
    Pickler p = pickler_new(true, false, error);
    if (!pickle_root(&p, root)) {
        pickler_clear(&p);
        return false;
    }
    ZipWriter z = {.b = b, .base = ckptfs_plan_builder_size(b), .archive = archive_name,
                   .compute_crc = compute_crc,
                   .entries = g_array_new(FALSE, FALSE, sizeof(ZipEntry))};
    GByteArray *pickle = pickler_out(&p);
    zip_add_bytes(&z, "data.pkl", pickle->data, pickle->len);
    zip_add_bytes(&z, "byteorder", "little", 6);
    for (guint i = 0; i < p.tensors->len; i++) {
        const CkptfsValue *t = g_ptr_array_index(p.tensors, i);
        char name[32];
        g_snprintf(name, sizeof name, "data/%u", i);
        uint64_t size = ckptfs_value_tensor_nbytes(t);
        zip_begin_entry(&z, name, size);
        uint64_t before = ckptfs_plan_builder_size(z.b);
        if (sizing_only)
            ckptfs_plan_add_zero(z.b, size);
        else
            t->u.tensor.emit(t->u.tensor.ctx, z.b);
        g_assert(ckptfs_plan_builder_size(z.b) - before == size);
        zip_end_entry(&z, size);
    }
    zip_add_bytes(&z, "version", "3\n", 2);
    zip_finish(&z);

    for (guint i = 0; i < z.entries->len; i++)
        g_free(g_array_index(z.entries, ZipEntry, i).name);
    g_array_unref(z.entries);
    pickler_clear(&p);
    return true;
}

bool ckptfs_torchsave_append(CkptfsPlanBuilder *b, const CkptfsValue *root,
                             const char *archive_name, bool compute_crc, GError **error)
{
    return torchsave_append(b, root, archive_name, compute_crc, false, error);
}

uint64_t ckptfs_torchsave_size(const CkptfsValue *root, const char *archive_name, GError **error)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    bool ok = torchsave_append(b, root, archive_name, false, true, error);
    uint64_t size = ckptfs_plan_builder_size(b);
    ckptfs_plan_builder_free(b);
    return ok ? size : 0;
}

CkptfsPlan *ckptfs_torchsave_plan(const CkptfsValue *root, const char *archive_name,
                                  bool compute_crc, GError **error)
{
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    if (!torchsave_append(b, root, archive_name, compute_crc, false, error)) {
        ckptfs_plan_builder_free(b);
        return NULL;
    }
    return ckptfs_plan_builder_finish(b);
}

struct CkptfsPickleStream {
    Pickler p;
};

CkptfsPickleStream *ckptfs_pickle_stream_new(GError **error)
{
    CkptfsPickleStream *s = g_new0(CkptfsPickleStream, 1);
    s->p = pickler_new(false, true, error);
    put_byte(&s->p, OP_PROTO);
    put_byte(&s->p, 2);
    return s;
}

void ckptfs_pickle_stream_value(CkptfsPickleStream *s, const CkptfsValue *v)
{
    put_value(&s->p, v);
}

void ckptfs_pickle_stream_str(CkptfsPickleStream *s, const char *str)
{
    put_str(&s->p, str);
}

void ckptfs_pickle_stream_object_begin(CkptfsPickleStream *s, const char *module, const char *name)
{
    put_global(&s->p, module, name);
    put_byte(&s->p, OP_EMPTY_TUPLE);
    put_byte(&s->p, OP_NEWOBJ);
}

void ckptfs_pickle_stream_object_end(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_BUILD);
}

void ckptfs_pickle_stream_dict_begin(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_EMPTY_DICT);
    put_byte(&s->p, OP_MARK);
}

void ckptfs_pickle_stream_dict_end(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_SETITEMS);
}

void ckptfs_pickle_stream_list_begin(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_EMPTY_LIST);
    put_byte(&s->p, OP_MARK);
}

void ckptfs_pickle_stream_list_end(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_APPENDS);
}

GBytes *ckptfs_pickle_stream_finish(CkptfsPickleStream *s)
{
    put_byte(&s->p, OP_STOP);
    pickler_out(&s->p);
    GBytes *out = s->p.failed ? NULL : g_byte_array_free_to_bytes(g_steal_pointer(&s->p.out));
    if (s->p.out == NULL)
        s->p.out = g_byte_array_new(); /* pickler_clear frees it */
    pickler_clear(&s->p);
    g_free(s);
    return out;
}
