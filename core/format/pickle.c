/* A pickle VM over an inert object model. Nothing is imported or called: GLOBAL yields a name,
 * REDUCE/NEWOBJ yield an opaque object, except for the few constructors torch.save relies on,
 * which are recognised by name. Every length is checked against the input, and depth, stack,
 * memo and object counts are bounded, so hostile input fails with an error in bounded time and
 * memory. */
#include "ckptfs/pickle.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/limits.h"

/* Objects are allocated in blocks of this many, and strings in one string chunk: a big pickle
 * holds millions of small values, and a malloc each doubled its memory. */
#define BLOCK_OBJECTS 4096u
#define SMALL_INTS 256

/* Every value of a pickle, freed together. */
typedef struct {
    GPtrArray *blocks;     /* CkptfsPy[BLOCK_OBJECTS] each */
    unsigned used;         /* objects taken in the last block */
    uint64_t objects;      /* in all blocks */
    GStringChunk *strings; /* the bytes of STR, BYTES, GLOBAL names, storage keys */
    GPtrArray *empty;      /* the items of every container while it is empty */
} Arena;

struct CkptfsPickle {
    Arena arena;
    CkptfsPy *root;
};

typedef struct {
    const char *what;
    const uint8_t *p, *end, *start;
    Arena *arena;
    GPtrArray *stack;
    GArray *marks;      /* guint stack heights */
    GPtrArray *memo;    /* memo[index]: the dense part (indexes written in order, as pickle does) */
    GHashTable *memo_sparse; /* the other indexes */
    guint memo_count;   /* entries in both */
    CkptfsPy *none, *true_, *false_, *empty_tuple, *small_int[SMALL_INTS]; /* shared */
    GError **error;
} Vm;

static void arena_init(Arena *a)
{
    a->blocks = g_ptr_array_new();
    a->used = BLOCK_OBJECTS;
    a->objects = 0;
    a->strings = g_string_chunk_new(64 * 1024);
    a->empty = g_ptr_array_new();
}

static void arena_clear(Arena *a)
{
    for (guint b = 0; b < a->blocks->len; b++) {
        CkptfsPy *block = g_ptr_array_index(a->blocks, b);
        unsigned n = b + 1 == a->blocks->len ? a->used : BLOCK_OBJECTS;
        for (unsigned i = 0; i < n; i++) {
            CkptfsPy *v = &block[i];
            if (v->items)
                g_ptr_array_unref(v->items);
            if (v->kind == CKPTFS_PY_TENSOR)
                g_free(v->tensor);
        }
        g_free(block);
    }
    g_ptr_array_unref(a->blocks);
    g_string_chunk_free(a->strings);
    g_ptr_array_unref(a->empty);
}

static char *arena_strndup(Arena *a, const void *bytes, size_t len)
{
    return g_string_chunk_insert_len(a->strings, bytes, (gssize)len);
}

static bool fail(Vm *vm, const char *fmt, ...) G_GNUC_PRINTF(2, 3);
static bool fail(Vm *vm, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(vm->error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: pickle offset %td: %s",
                vm->what, vm->p - vm->start, msg);
    return false;
}

/* A new value; containers get ITEMS (taken), or an empty array when NULL. */
static CkptfsPy *new_value(Vm *vm, CkptfsPyKind kind, GPtrArray *items)
{
    Arena *a = vm->arena;
    if (a->objects >= CKPTFS_MAX_PICKLE_OBJECTS) {
        if (items)
            g_ptr_array_unref(items);
        fail(vm, "more than %u objects (limit)", CKPTFS_MAX_PICKLE_OBJECTS);
        return NULL;
    }
    if (a->used == BLOCK_OBJECTS) {
        g_ptr_array_add(a->blocks, g_new(CkptfsPy, BLOCK_OBJECTS));
        a->used = 0;
    }
    CkptfsPy *v = &((CkptfsPy *)g_ptr_array_index(a->blocks, a->blocks->len - 1))[a->used++];
    a->objects++;
    *v = (CkptfsPy){.kind = kind};
    if (kind == CKPTFS_PY_TUPLE || kind == CKPTFS_PY_LIST || kind == CKPTFS_PY_DICT ||
        kind == CKPTFS_PY_SET)
        v->items = items ? items : g_ptr_array_ref(a->empty);
    if (kind == CKPTFS_PY_TENSOR)
        v->tensor = g_new0(CkptfsPyTensor, 1);
    return v;
}

static CkptfsPy *new_obj(Vm *vm, CkptfsPyKind kind)
{
    return new_value(vm, kind, NULL);
}

/* A value nothing changes, made once: None, True, False, (), small ints. */
static CkptfsPy *shared(Vm *vm, CkptfsPy **slot, CkptfsPyKind kind, int64_t i)
{
    if (*slot == NULL && (*slot = new_obj(vm, kind)) != NULL)
        (*slot)->i = i;
    return *slot;
}

static bool push(Vm *vm, CkptfsPy *v)
{
    if (v == NULL)
        return false;
    if (vm->stack->len >= CKPTFS_MAX_PICKLE_STACK)
        return fail(vm, "stack deeper than %u", CKPTFS_MAX_PICKLE_STACK);
    g_ptr_array_add(vm->stack, v);
    return true;
}

/* The top object, which must be above the last MARK; removed when TAKE. */
static CkptfsPy *stack_top(Vm *vm, bool take)
{
    guint floor = vm->marks->len ? g_array_index(vm->marks, guint, vm->marks->len - 1) : 0;
    if (vm->stack->len <= floor) {
        fail(vm, "stack underflow");
        return NULL;
    }
    return take ? g_ptr_array_steal_index(vm->stack, vm->stack->len - 1)
                : g_ptr_array_index(vm->stack, vm->stack->len - 1);
}

static CkptfsPy *pop(Vm *vm)
{
    return stack_top(vm, true);
}

static CkptfsPy *top(Vm *vm)
{
    return stack_top(vm, false);
}

/* Pops everything down to the last MARK into a new array (in order). */
static GPtrArray *pop_mark(Vm *vm)
{
    if (vm->marks->len == 0) {
        fail(vm, "no MARK on the stack");
        return NULL;
    }
    guint at = g_array_index(vm->marks, guint, vm->marks->len - 1);
    g_array_set_size(vm->marks, vm->marks->len - 1);
    GPtrArray *items = g_ptr_array_sized_new(vm->stack->len - at);
    for (guint i = at; i < vm->stack->len; i++)
        g_ptr_array_add(items, g_ptr_array_index(vm->stack, i));
    g_ptr_array_set_size(vm->stack, at);
    return items;
}

static bool need(Vm *vm, size_t n)
{
    if ((size_t)(vm->end - vm->p) < n)
        return fail(vm, "truncated (needs %zu more bytes)", n);
    return true;
}

static uint64_t read_le(Vm *vm, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v |= (uint64_t)vm->p[i] << (8 * i);
    vm->p += n;
    return v;
}

/* A text line (protocol 0 style arguments), without its newline. */
static bool read_line(Vm *vm, const char **line, size_t *len)
{
    const uint8_t *nl = memchr(vm->p, '\n', (size_t)(vm->end - vm->p));
    if (nl == NULL)
        return fail(vm, "unterminated text argument");
    *line = (const char *)vm->p;
    *len = (size_t)(nl - vm->p);
    vm->p = nl + 1;
    return true;
}

static bool push_string(Vm *vm, CkptfsPyKind kind, uint64_t n)
{
    if (!need(vm, n))
        return false;
    CkptfsPy *v = new_obj(vm, kind);
    if (v == NULL)
        return false;
    v->s = arena_strndup(vm->arena, vm->p, (size_t)n);
    v->len = (size_t)n;
    vm->p += n;
    return push(vm, v);
}

static bool push_int(Vm *vm, int64_t i, bool big)
{
    if (!big && i >= 0 && i < SMALL_INTS)
        return push(vm, shared(vm, &vm->small_int[i], CKPTFS_PY_INT, i));
    CkptfsPy *v = new_obj(vm, CKPTFS_PY_INT);
    if (v == NULL)
        return false;
    v->i = i;
    v->big = big;
    return push(vm, v);
}

/* LONG1/LONG4: little-endian two's complement of N bytes. */
static bool push_long(Vm *vm, uint64_t n)
{
    if (!need(vm, n))
        return false;
    bool big = n > 8;
    int64_t v = 0;
    if (n > 0 && !big) {
        uint64_t u = 0;
        for (uint64_t i = 0; i < n; i++)
            u |= (uint64_t)vm->p[i] << (8 * i);
        if (n < 8 && (vm->p[n - 1] & 0x80))
            u |= ~0ull << (8 * n); /* sign-extend */
        v = (int64_t)u;
    }
    vm->p += n;
    return push_int(vm, v, big);
}

static bool push_global(Vm *vm, const char *module, size_t mlen, const char *name, size_t nlen)
{
    CkptfsPy *g = new_obj(vm, CKPTFS_PY_GLOBAL);
    if (g == NULL)
        return false;
    g->module = arena_strndup(vm->arena, module, mlen);
    g->name = arena_strndup(vm->arena, name, nlen);
    return push(vm, g);
}

bool ckptfs_py_is_global(const CkptfsPy *v, const char *module, const char *name)
{
    return v && v->kind == CKPTFS_PY_GLOBAL && strcmp(v->module, module) == 0 &&
           strcmp(v->name, name) == 0;
}

CkptfsDtype ckptfs_py_storage_dtype(const CkptfsPy *cls)
{
    static const struct {
        const char *name;
        CkptfsDtype dtype;
    } table[] = {{"BFloat16Storage", CKPTFS_DTYPE_BF16}, {"HalfStorage", CKPTFS_DTYPE_F16},
                 {"FloatStorage", CKPTFS_DTYPE_F32},    {"DoubleStorage", CKPTFS_DTYPE_F64},
                 {"LongStorage", CKPTFS_DTYPE_I64},     {"IntStorage", CKPTFS_DTYPE_I32},
                 {"ShortStorage", CKPTFS_DTYPE_I16},    {"CharStorage", CKPTFS_DTYPE_I8},
                 {"ByteStorage", CKPTFS_DTYPE_U8},      {"BoolStorage", CKPTFS_DTYPE_BOOL},
                 {"Float8_e4m3fnStorage", CKPTFS_DTYPE_F8_E4M3},
                 {"Float8_e5m2Storage", CKPTFS_DTYPE_F8_E5M2}};
    if (cls == NULL || cls->kind != CKPTFS_PY_GLOBAL || strcmp(cls->module, "torch") != 0)
        return CKPTFS_DTYPE_INVALID;
    for (size_t i = 0; i < G_N_ELEMENTS(table); i++)
        if (strcmp(cls->name, table[i].name) == 0)
            return table[i].dtype;
    return CKPTFS_DTYPE_INVALID;
}

static CkptfsDtype torch_dtype(const CkptfsPy *g)
{
    static const struct {
        const char *name;
        CkptfsDtype dtype;
    } table[] = {{"bfloat16", CKPTFS_DTYPE_BF16}, {"float16", CKPTFS_DTYPE_F16},
                 {"float32", CKPTFS_DTYPE_F32},   {"float64", CKPTFS_DTYPE_F64},
                 {"int64", CKPTFS_DTYPE_I64},     {"int32", CKPTFS_DTYPE_I32},
                 {"int16", CKPTFS_DTYPE_I16},     {"int8", CKPTFS_DTYPE_I8},
                 {"uint8", CKPTFS_DTYPE_U8},      {"bool", CKPTFS_DTYPE_BOOL}};
    if (g == NULL || g->kind != CKPTFS_PY_GLOBAL || strcmp(g->module, "torch") != 0)
        return CKPTFS_DTYPE_INVALID;
    for (size_t i = 0; i < G_N_ELEMENTS(table); i++)
        if (strcmp(g->name, table[i].name) == 0)
            return table[i].dtype;
    return CKPTFS_DTYPE_INVALID;
}

bool ckptfs_py_dims(const CkptfsPy *t, uint64_t *out, unsigned *n)
{
    if (t && t->kind == CKPTFS_PY_OBJECT && ckptfs_py_is_global(t->callable, "torch", "Size") &&
        t->args && t->args->kind == CKPTFS_PY_TUPLE && t->args->items->len == 1)
        t = g_ptr_array_index(t->args->items, 0);
    if (t == NULL || t->kind != CKPTFS_PY_TUPLE || t->items->len > CKPTFS_MAX_DIMS)
        return false;
    for (guint i = 0; i < t->items->len; i++) {
        const CkptfsPy *x = g_ptr_array_index(t->items, i);
        if (x->kind != CKPTFS_PY_INT || x->big || x->i < 0)
            return false;
        out[i] = (uint64_t)x->i;
    }
    *n = t->items->len;
    return true;
}

/* _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) and
 * _rebuild_tensor_v3(..., dtype, metadata): the storage is a persistent id
 * ('storage', torch.XStorage, key, location, numel). NULL (no error) if it is not one. */
static CkptfsPy *make_tensor(Vm *vm, const CkptfsPy *args, bool v3)
{
    if (args == NULL || args->kind != CKPTFS_PY_TUPLE || args->items->len < 4)
        return NULL;
    const CkptfsPy *pid = g_ptr_array_index(args->items, 0);
    const CkptfsPy *off = g_ptr_array_index(args->items, 1);
    if (pid->kind != CKPTFS_PY_PERSID || pid->args == NULL || pid->args->kind != CKPTFS_PY_TUPLE ||
        pid->args->items->len < 5 || off->kind != CKPTFS_PY_INT || off->big || off->i < 0)
        return NULL;
    const CkptfsPy *tag = g_ptr_array_index(pid->args->items, 0);
    const CkptfsPy *cls = g_ptr_array_index(pid->args->items, 1);
    const CkptfsPy *key = g_ptr_array_index(pid->args->items, 2);
    const CkptfsPy *numel = g_ptr_array_index(pid->args->items, 4);
    if (tag->kind != CKPTFS_PY_STR || strcmp(tag->s, "storage") != 0 || key->kind != CKPTFS_PY_STR ||
        numel->kind != CKPTFS_PY_INT || numel->big || numel->i < 0)
        return NULL;
    CkptfsDtype dtype = ckptfs_py_storage_dtype(cls);
    if (v3 && args->items->len >= 7)
        dtype = torch_dtype(g_ptr_array_index(args->items, 6));
    CkptfsPy *t = new_obj(vm, CKPTFS_PY_TENSOR);
    if (t == NULL)
        return NULL;
    unsigned nd_size = 0, nd_stride = 0;
    if (!ckptfs_py_dims(g_ptr_array_index(args->items, 2), t->tensor->shape, &nd_size) ||
        !ckptfs_py_dims(g_ptr_array_index(args->items, 3), t->tensor->stride, &nd_stride) ||
        nd_size != nd_stride) {
        fail(vm, "tensor size/stride are not matching tuples of at most %d non-negative ints",
             CKPTFS_MAX_DIMS);
        return NULL;
    }
    t->tensor->ndim = nd_size;
    t->tensor->storage_key = key->s; /* in the same arena */
    t->tensor->dtype = dtype;
    t->tensor->storage_numel = (uint64_t)numel->i;
    t->tensor->offset = (uint64_t)off->i;
    return t;
}

static bool op_reduce(Vm *vm)
{
    CkptfsPy *args = pop(vm), *callable = args ? pop(vm) : NULL;
    if (callable == NULL)
        return false;
    CkptfsPy *result = NULL;
    if (ckptfs_py_is_global(callable, "collections", "OrderedDict")) {
        result = new_obj(vm, CKPTFS_PY_DICT);
    } else if (ckptfs_py_is_global(callable, "torch._utils", "_rebuild_tensor_v2") ||
               ckptfs_py_is_global(callable, "torch._utils", "_rebuild_tensor_v3")) {
        result = make_tensor(vm, args, strcmp(callable->name, "_rebuild_tensor_v3") == 0);
        if (result == NULL && vm->error && *vm->error)
            return false;
    } else if (ckptfs_py_is_global(callable, "torch._utils", "_rebuild_parameter") &&
               args->kind == CKPTFS_PY_TUPLE && args->items->len >= 1 &&
               ((CkptfsPy *)g_ptr_array_index(args->items, 0))->kind == CKPTFS_PY_TENSOR) {
        result = g_ptr_array_index(args->items, 0);
    }
    if (result == NULL) {
        result = new_obj(vm, CKPTFS_PY_OBJECT);
        if (result == NULL)
            return false;
        result->callable = callable;
        result->args = args;
    }
    return push(vm, result);
}

/* ITEMS (taken) added to something: a dict, a list or a set, or an opaque object that collects
 * them. An empty target takes the array itself, sized as it was popped. */
static bool add_items(Vm *vm, CkptfsPy *target, GPtrArray *items, bool pairs)
{
    g_autoptr(GPtrArray) taken = items;
    if (pairs && items->len % 2 != 0)
        return fail(vm, "SETITEMS with an odd number of items");
    bool ok = target->kind == (pairs ? CKPTFS_PY_DICT : CKPTFS_PY_LIST) ||
              (!pairs && target->kind == CKPTFS_PY_SET) || target->kind == CKPTFS_PY_OBJECT;
    if (!ok)
        return fail(vm, "%s on something that is not a %s", pairs ? "SETITEM" : "APPEND",
                    pairs ? "dict" : "list");
    if (target->items == NULL || target->items == vm->arena->empty) {
        if (target->items)
            g_ptr_array_unref(target->items);
        target->items = g_steal_pointer(&taken);
        return true;
    }
    for (guint i = 0; i < items->len; i++)
        g_ptr_array_add(target->items, g_ptr_array_index(items, i));
    return true;
}

static CkptfsPy *memo_lookup(Vm *vm, uint64_t index)
{
    CkptfsPy *v = index < vm->memo->len ? g_ptr_array_index(vm->memo, index) : NULL;
    if (v == NULL && g_hash_table_size(vm->memo_sparse) > 0) /* the array may have grown past it */
        v = g_hash_table_lookup(vm->memo_sparse, &index);
    return v;
}

/* Pickles number their memo entries 0, 1, 2...: those go to an array (8 bytes each), which
 * grows only as far as twice the entries stored; any other index goes to a hash table. */
static bool memo_put(Vm *vm, uint64_t index)
{
    CkptfsPy *v = top(vm);
    if (v == NULL)
        return false;
    bool is_new = memo_lookup(vm, index) == NULL;
    if (is_new && vm->memo_count >= CKPTFS_MAX_PICKLE_MEMO)
        return fail(vm, "memo larger than %u entries (limit)", CKPTFS_MAX_PICKLE_MEMO);
    vm->memo_count += is_new;
    if (index < vm->memo->len || index <= 2 * (uint64_t)vm->memo_count + 1024) {
        if (index >= vm->memo->len)
            g_ptr_array_set_size(vm->memo, (guint)index + 1);
        g_ptr_array_index(vm->memo, index) = v;
        if (!is_new && g_hash_table_size(vm->memo_sparse) > 0)
            g_hash_table_remove(vm->memo_sparse, &index);
    } else {
        uint64_t *key = g_new(uint64_t, 1);
        *key = index;
        g_hash_table_replace(vm->memo_sparse, key, v);
    }
    return true;
}

static bool memo_get(Vm *vm, uint64_t index)
{
    CkptfsPy *v = memo_lookup(vm, index);
    if (v == NULL)
        return fail(vm, "memo entry %" G_GUINT64_FORMAT " was never stored", index);
    return push(vm, v);
}

/* The memo index of PUT/GET (text), BINPUT/BINGET (1 byte), LONG_BINPUT/LONG_BINGET (4 bytes). */
static bool memo_index(Vm *vm, uint8_t op, uint64_t *idx)
{
    if (op == 'q' || op == 'h' || op == 'r' || op == 'j') {
        unsigned n = op == 'q' || op == 'h' ? 1 : 4;
        if (!need(vm, n))
            return false;
        *idx = read_le(vm, n);
        return true;
    }
    const char *line = NULL;
    size_t len = 0;
    if (!read_line(vm, &line, &len))
        return false;
    g_autofree char *text = g_strndup(line, len);
    char *end;
    *idx = strtoull(text, &end, 10);
    if (*end || end == text)
        return fail(vm, "bad memo index '%s'", text);
    return true;
}

static bool run(Vm *vm)
{
    while (vm->p < vm->end) {
        uint8_t op = *vm->p++;
        const char *line = NULL;
        size_t len = 0;
        switch (op) {
        case 0x80: /* PROTO */
            if (!need(vm, 1))
                return false;
            if (*vm->p > 5)
                return fail(vm, "protocol %u is not supported", *vm->p);
            vm->p++;
            break;
        case 0x95: /* FRAME: a length hint */
            if (!need(vm, 8))
                return false;
            vm->p += 8;
            break;
        case '.': /* STOP */
            if (vm->marks->len != 0 || vm->stack->len != 1)
                return fail(vm, "STOP with %u objects and %u marks on the stack", vm->stack->len,
                            vm->marks->len);
            return true;
        case '(': /* MARK */
            if (vm->marks->len >= CKPTFS_MAX_PICKLE_MARKS)
                return fail(vm, "nesting deeper than %d", CKPTFS_MAX_PICKLE_MARKS);
            g_array_append_val(vm->marks, vm->stack->len);
            break;
        case '0': /* POP */
            if (vm->marks->len && g_array_index(vm->marks, guint, vm->marks->len - 1) == vm->stack->len)
                g_array_set_size(vm->marks, vm->marks->len - 1); /* pops the mark itself */
            else if (pop(vm) == NULL)
                return false;
            break;
        case '1': { /* POP_MARK */
            GPtrArray *items = pop_mark(vm);
            if (items == NULL)
                return false;
            g_ptr_array_unref(items);
            break;
        }
        case '2': { /* DUP */
            CkptfsPy *v = top(vm);
            if (v == NULL || !push(vm, v))
                return false;
            break;
        }
        case 'N':
            if (!push(vm, shared(vm, &vm->none, CKPTFS_PY_NONE, 0)))
                return false;
            break;
        case 0x88: case 0x89: /* NEWTRUE NEWFALSE */
            if (!push(vm, op == 0x88 ? shared(vm, &vm->true_, CKPTFS_PY_BOOL, 1)
                                     : shared(vm, &vm->false_, CKPTFS_PY_BOOL, 0)))
                return false;
            break;
        case 'J':
            if (!need(vm, 4) || !push_int(vm, (int32_t)(uint32_t)read_le(vm, 4), false))
                return false;
            break;
        case 'K':
            if (!need(vm, 1) || !push_int(vm, (int64_t)read_le(vm, 1), false))
                return false;
            break;
        case 'M':
            if (!need(vm, 2) || !push_int(vm, (int64_t)read_le(vm, 2), false))
                return false;
            break;
        case 0x8a: /* LONG1 */
            if (!need(vm, 1) || !push_long(vm, read_le(vm, 1)))
                return false;
            break;
        case 0x8b: { /* LONG4 */
            if (!need(vm, 4))
                return false;
            int32_t n = (int32_t)(uint32_t)read_le(vm, 4);
            if (n < 0)
                return fail(vm, "negative LONG4 length");
            if (!push_long(vm, (uint64_t)n))
                return false;
            break;
        }
        case 'I': case 'L': { /* INT, LONG (text) */
            if (!read_line(vm, &line, &len))
                return false;
            g_autofree char *text = g_strndup(line, len);
            if (len && text[len - 1] == 'L')
                text[len - 1] = '\0';
            char *end;
            errno = 0;
            long long v = strtoll(text, &end, 10);
            if (op == 'I' && strcmp(text, "00") == 0)
                v = 0, end = text + 2; /* False */
            else if (op == 'I' && strcmp(text, "01") == 0)
                v = 1, end = text + 2;
            if (*end != '\0' || end == text)
                return fail(vm, "bad integer text");
            if (!push_int(vm, v, errno == ERANGE))
                return false;
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            if (!need(vm, 8))
                return false;
            uint64_t bits = 0;
            for (int i = 0; i < 8; i++)
                bits = (bits << 8) | vm->p[i];
            vm->p += 8;
            CkptfsPy *v = new_obj(vm, CKPTFS_PY_FLOAT);
            if (v == NULL)
                return false;
            memcpy(&v->f, &bits, sizeof v->f);
            if (!push(vm, v))
                return false;
            break;
        }
        case 'F': { /* FLOAT (text) */
            if (!read_line(vm, &line, &len))
                return false;
            g_autofree char *text = g_strndup(line, len);
            CkptfsPy *v = new_obj(vm, CKPTFS_PY_FLOAT);
            if (v == NULL)
                return false;
            v->f = g_ascii_strtod(text, NULL);
            if (!push(vm, v))
                return false;
            break;
        }
        case 'X': case 'B': /* BINUNICODE, BINBYTES */
            if (!need(vm, 4) || !push_string(vm, op == 'X' ? CKPTFS_PY_STR : CKPTFS_PY_BYTES, read_le(vm, 4)))
                return false;
            break;
        case 0x8c: case 'C': case 'U': /* SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING */
            if (!need(vm, 1) || !push_string(vm, op == 0x8c ? CKPTFS_PY_STR : CKPTFS_PY_BYTES, read_le(vm, 1)))
                return false;
            break;
        case 'T': /* BINSTRING */
            if (!need(vm, 4) || !push_string(vm, CKPTFS_PY_BYTES, read_le(vm, 4)))
                return false;
            break;
        case 0x8d: case 0x8e: case 0x96: /* BINUNICODE8, BINBYTES8, BYTEARRAY8 */
            if (!need(vm, 8) || !push_string(vm, op == 0x8d ? CKPTFS_PY_STR : CKPTFS_PY_BYTES, read_le(vm, 8)))
                return false;
            break;
        case 'V': case 'S': { /* UNICODE, STRING (text; kept as written) */
            if (!read_line(vm, &line, &len))
                return false;
            vm->p -= len + 1;
            if (!push_string(vm, op == 'V' ? CKPTFS_PY_STR : CKPTFS_PY_BYTES, len))
                return false;
            vm->p++; /* the newline */
            break;
        }
        case ')': /* EMPTY_TUPLE */
            if (!push(vm, shared(vm, &vm->empty_tuple, CKPTFS_PY_TUPLE, 0)))
                return false;
            break;
        case ']': case '}': case 0x8f: /* EMPTY_LIST EMPTY_DICT EMPTY_SET */
            if (!push(vm, new_obj(vm, op == ']' ? CKPTFS_PY_LIST : op == '}' ? CKPTFS_PY_DICT : CKPTFS_PY_SET)))
                return false;
            break;
        case 't': case 'l': case 'd': case 0x91: { /* TUPLE LIST DICT FROZENSET */
            GPtrArray *items = pop_mark(vm);
            if (items == NULL)
                return false;
            CkptfsPyKind kind = op == 't' ? CKPTFS_PY_TUPLE : op == 'l' ? CKPTFS_PY_LIST
                                : op == 'd' ? CKPTFS_PY_DICT : CKPTFS_PY_SET;
            if (kind == CKPTFS_PY_DICT && items->len % 2) {
                g_ptr_array_unref(items);
                return fail(vm, "DICT with an odd number of items");
            }
            if (!push(vm, new_value(vm, kind, items)))
                return false;
            break;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            unsigned n = op - 0x84u;
            CkptfsPy *got[3];
            for (unsigned i = 0; i < n; i++)
                if ((got[n - 1 - i] = pop(vm)) == NULL)
                    return false;
            GPtrArray *items = g_ptr_array_sized_new(n);
            for (unsigned i = 0; i < n; i++)
                g_ptr_array_add(items, got[i]);
            if (!push(vm, new_value(vm, CKPTFS_PY_TUPLE, items)))
                return false;
            break;
        }
        case 'a': case 's': { /* APPEND, SETITEM */
            unsigned n = op == 'a' ? 1 : 2;
            CkptfsPy *got[2];
            for (unsigned i = 0; i < n; i++)
                if ((got[n - 1 - i] = pop(vm)) == NULL)
                    return false;
            CkptfsPy *target = top(vm);
            if (target == NULL)
                return false;
            GPtrArray *items = g_ptr_array_sized_new(n);
            for (unsigned i = 0; i < n; i++)
                g_ptr_array_add(items, got[i]);
            if (!add_items(vm, target, items, op == 's'))
                return false;
            break;
        }
        case 'e': case 'u': case 0x90: { /* APPENDS, SETITEMS, ADDITEMS */
            GPtrArray *items = pop_mark(vm);
            if (items == NULL)
                return false;
            CkptfsPy *target = top(vm);
            if (target == NULL) {
                g_ptr_array_unref(items);
                return false;
            }
            if (!add_items(vm, target, items, op == 'u'))
                return false;
            break;
        }
        case 'c': { /* GLOBAL module\nname\n */
            const char *module = NULL, *name = NULL;
            size_t mlen = 0, nlen = 0;
            if (!read_line(vm, &module, &mlen) || !read_line(vm, &name, &nlen) ||
                !push_global(vm, module, mlen, name, nlen))
                return false;
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            CkptfsPy *name = pop(vm), *module = name ? pop(vm) : NULL;
            if (module == NULL)
                return false;
            if (module->kind != CKPTFS_PY_STR || name->kind != CKPTFS_PY_STR)
                return fail(vm, "STACK_GLOBAL needs two strings");
            if (!push_global(vm, module->s, module->len, name->s, name->len))
                return false;
            break;
        }
        case 'R':
            if (!op_reduce(vm))
                return false;
            break;
        case 0x81: case 0x92: { /* NEWOBJ, NEWOBJ_EX */
            CkptfsPy *kwargs = op == 0x92 ? pop(vm) : NULL;
            if (op == 0x92 && kwargs == NULL)
                return false;
            CkptfsPy *args = pop(vm), *cls = args ? pop(vm) : NULL;
            if (cls == NULL)
                return false;
            CkptfsPy *v = ckptfs_py_is_global(cls, "collections", "OrderedDict")
                              ? new_obj(vm, CKPTFS_PY_DICT)
                              : new_obj(vm, CKPTFS_PY_OBJECT);
            if (v == NULL)
                return false;
            if (v->kind == CKPTFS_PY_OBJECT) {
                v->callable = cls;
                v->args = args;
            }
            if (!push(vm, v))
                return false;
            break;
        }
        case 'b': { /* BUILD */
            CkptfsPy *state = pop(vm), *target = state ? top(vm) : NULL;
            if (target == NULL)
                return false;
            if (target->kind == CKPTFS_PY_OBJECT)
                target->state = state;
            /* Other targets (tensors, OrderedDicts) carry nothing ckptfs reads in their state. */
            break;
        }
        case 'p': case 'q': case 'r': case 'g': case 'h': case 'j': { /* PUT / GET */
            uint64_t idx;
            if (!memo_index(vm, op, &idx) ||
                !(op == 'p' || op == 'q' || op == 'r' ? memo_put(vm, idx) : memo_get(vm, idx)))
                return false;
            break;
        }
        case 0x94: /* MEMOIZE */
            if (!memo_put(vm, vm->memo_count))
                return false;
            break;
        case 'Q': { /* BINPERSID */
            CkptfsPy *id = pop(vm);
            CkptfsPy *v = id ? new_obj(vm, CKPTFS_PY_PERSID) : NULL;
            if (v == NULL)
                return false;
            v->args = id;
            if (!push(vm, v))
                return false;
            break;
        }
        case 'P': { /* PERSID (text) */
            if (!read_line(vm, &line, &len))
                return false;
            vm->p -= len + 1;
            if (!push_string(vm, CKPTFS_PY_STR, len))
                return false;
            vm->p++;
            CkptfsPy *id = pop(vm), *v = new_obj(vm, CKPTFS_PY_PERSID);
            if (v == NULL)
                return false;
            v->args = id;
            if (!push(vm, v))
                return false;
            break;
        }
        default:
            vm->p--;
            return fail(vm, "opcode 0x%02x is not supported", op);
        }
    }
    return fail(vm, "ends without STOP");
}

CkptfsPickle *ckptfs_pickle_parse(const char *what, const uint8_t *data, size_t len,
                                  GError **error)
{
    CkptfsPickle *pickle = g_new0(CkptfsPickle, 1);
    arena_init(&pickle->arena);
    Vm vm = {.what = what, .p = data, .start = data, .end = data + len, .error = error,
             .arena = &pickle->arena, .stack = g_ptr_array_new(),
             .marks = g_array_new(FALSE, FALSE, sizeof(guint)), .memo = g_ptr_array_new(),
             .memo_sparse = g_hash_table_new_full(g_int64_hash, g_int64_equal, g_free, NULL)};
    if (run(&vm)) {
        pickle->root = g_ptr_array_index(vm.stack, 0);
    } else {
        ckptfs_pickle_free(pickle);
        pickle = NULL;
    }
    g_ptr_array_unref(vm.stack);
    g_array_unref(vm.marks);
    g_ptr_array_unref(vm.memo);
    g_hash_table_unref(vm.memo_sparse);
    return pickle;
}

void ckptfs_pickle_free(CkptfsPickle *pickle)
{
    if (pickle == NULL)
        return;
    arena_clear(&pickle->arena);
    g_free(pickle);
}

const CkptfsPy *ckptfs_pickle_root(const CkptfsPickle *pickle)
{
    return pickle->root;
}

const char *ckptfs_py_str(const CkptfsPy *v)
{
    return v && v->kind == CKPTFS_PY_STR ? v->s : NULL;
}

const CkptfsPy *ckptfs_py_dict_get(const CkptfsPy *dict, const char *key)
{
    if (dict == NULL || dict->items == NULL ||
        (dict->kind != CKPTFS_PY_DICT && dict->kind != CKPTFS_PY_OBJECT))
        return NULL;
    /* From the end: a key set twice keeps its last value, as in Python. */
    for (guint i = dict->items->len & ~1u; i >= 2; i -= 2) {
        const char *k = ckptfs_py_str(g_ptr_array_index(dict->items, i - 2));
        if (k && strcmp(k, key) == 0)
            return g_ptr_array_index(dict->items, i - 1);
    }
    return NULL;
}

const CkptfsPy *ckptfs_py_object_state(const CkptfsPy *obj)
{
    return obj && obj->kind == CKPTFS_PY_OBJECT ? obj->state : NULL;
}
