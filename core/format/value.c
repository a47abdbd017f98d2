#include "ckptfs/value.h"

static CkptfsValue *value_new(CkptfsValueKind kind)
{
    CkptfsValue *v = g_new0(CkptfsValue, 1);
    v->kind = kind;
    return v;
}

void ckptfs_value_free(CkptfsValue *v)
{
    if (v == NULL)
        return;
    switch (v->kind) {
    case CKPTFS_VALUE_STR:
        g_free(v->u.s);
        break;
    case CKPTFS_VALUE_DICT:
    case CKPTFS_VALUE_ODICT:
    case CKPTFS_VALUE_LIST:
    case CKPTFS_VALUE_TUPLE:
    case CKPTFS_VALUE_NAMESPACE:
        g_ptr_array_unref(v->u.items);
        break;
    case CKPTFS_VALUE_OBJECT:
        g_free(v->u.object.module);
        g_free(v->u.object.name);
        ckptfs_value_free(v->u.object.args);
        ckptfs_value_free(v->u.object.state);
        break;
    default:
        break;
    }
    g_free(v);
}

CkptfsValue *ckptfs_value_none(void)
{
    return value_new(CKPTFS_VALUE_NONE);
}

CkptfsValue *ckptfs_value_bool(bool b)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_BOOL);
    v->u.b = b;
    return v;
}

CkptfsValue *ckptfs_value_int(int64_t i)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_INT);
    v->u.i = i;
    return v;
}

CkptfsValue *ckptfs_value_float(double f)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_FLOAT);
    v->u.f = f;
    return v;
}

CkptfsValue *ckptfs_value_str(const char *s)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_STR);
    v->u.s = g_strdup(s);
    return v;
}

CkptfsValue *ckptfs_value_dtype(CkptfsDtype dtype)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_DTYPE);
    v->u.dtype = dtype;
    return v;
}

CkptfsValue *ckptfs_value_container(CkptfsValueKind kind)
{
    CkptfsValue *v = value_new(kind);
    v->u.items = g_ptr_array_new_with_free_func((GDestroyNotify)ckptfs_value_free);
    return v;
}

CkptfsValue *ckptfs_value_tensor(CkptfsDtype dtype, unsigned ndim, const uint64_t *shape,
                                 CkptfsEmitFn emit, gconstpointer ctx)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_TENSOR);
    v->u.tensor.dtype = dtype;
    v->u.tensor.ndim = ndim;
    for (unsigned d = 0; d < ndim && d < CKPTFS_MAX_DIMS; d++)
        v->u.tensor.shape[d] = shape[d];
    v->u.tensor.emit = emit;
    v->u.tensor.ctx = ctx;
    return v;
}

CkptfsValue *ckptfs_value_object(const char *module, const char *name, CkptfsValue *args,
                                 CkptfsValue *state, bool newobj)
{
    CkptfsValue *v = value_new(CKPTFS_VALUE_OBJECT);
    v->u.object.module = g_strdup(module);
    v->u.object.name = g_strdup(name);
    v->u.object.args = args ? args : ckptfs_value_container(CKPTFS_VALUE_TUPLE);
    v->u.object.state = state;
    v->u.object.newobj = newobj;
    return v;
}

CkptfsValue *ckptfs_value_int_tuple(const uint64_t *v, unsigned n)
{
    CkptfsValue *t = ckptfs_value_container(CKPTFS_VALUE_TUPLE);
    for (unsigned i = 0; i < n; i++)
        ckptfs_value_append(t, ckptfs_value_int((int64_t)v[i]));
    return t;
}

void ckptfs_value_append(CkptfsValue *container, CkptfsValue *item)
{
    g_ptr_array_add(container->u.items, item);
}

void ckptfs_value_set(CkptfsValue *map, const char *key, CkptfsValue *value)
{
    g_ptr_array_add(map->u.items, ckptfs_value_str(key));
    g_ptr_array_add(map->u.items, value);
}

void ckptfs_value_set_item(CkptfsValue *map, CkptfsValue *key, CkptfsValue *value)
{
    g_ptr_array_add(map->u.items, key);
    g_ptr_array_add(map->u.items, value);
}

uint64_t ckptfs_value_tensor_nbytes(const CkptfsValue *v)
{
    uint64_t n = ckptfs_dtype_size(v->u.tensor.dtype);
    for (unsigned d = 0; d < v->u.tensor.ndim; d++)
        n *= v->u.tensor.shape[d];
    return n;
}
