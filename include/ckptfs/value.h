/* Python values as torch.save pickles them: what a synthesized .pt file holds, before it is
 * serialized. Tensors carry no data, only how to emit their bytes into a plan. */
#ifndef CKPTFS_VALUE_H
#define CKPTFS_VALUE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/dtype.h"
#include "ckptfs/plan.h"

typedef enum {
    CKPTFS_VALUE_NONE,
    CKPTFS_VALUE_BOOL,
    CKPTFS_VALUE_INT,
    CKPTFS_VALUE_FLOAT,
    CKPTFS_VALUE_STR,
    CKPTFS_VALUE_DICT,      /* dict: items are key, value, key, value ... (keys are STR) */
    CKPTFS_VALUE_ODICT,     /* collections.OrderedDict, same items */
    CKPTFS_VALUE_LIST,
    CKPTFS_VALUE_TUPLE,
    CKPTFS_VALUE_NAMESPACE, /* argparse.Namespace: items as a dict */
    CKPTFS_VALUE_DTYPE,     /* torch.bfloat16 ... */
    CKPTFS_VALUE_TENSOR,
    CKPTFS_VALUE_OBJECT,    /* module.name applied to args (a TUPLE), then BUILD with state */
} CkptfsValueKind;

/* Appends exactly the tensor's bytes (row-major, contiguous) to B. */
typedef void (*CkptfsEmitFn)(gconstpointer ctx, CkptfsPlanBuilder *b);

typedef struct CkptfsValue CkptfsValue;
struct CkptfsValue {
    CkptfsValueKind kind;
    union {
        bool b;
        int64_t i;
        double f;
        char *s;
        GPtrArray *items; /* CkptfsValue*, owned */
        CkptfsDtype dtype;
        struct {
            CkptfsDtype dtype;
            unsigned ndim;
            uint64_t shape[CKPTFS_MAX_DIMS];
            CkptfsEmitFn emit;
            gconstpointer ctx; /* not owned */
        } tensor;
        struct {
            char *module, *name;
            CkptfsValue *args;  /* TUPLE */
            CkptfsValue *state; /* NULL: no BUILD */
            bool newobj;        /* cls.__new__(cls, *args) (NEWOBJ) rather than a call */
        } object;
    } u;
};

void ckptfs_value_free(CkptfsValue *v);
CkptfsValue *ckptfs_value_none(void);
CkptfsValue *ckptfs_value_bool(bool b);
CkptfsValue *ckptfs_value_int(int64_t i);
CkptfsValue *ckptfs_value_float(double f);
CkptfsValue *ckptfs_value_str(const char *s);
CkptfsValue *ckptfs_value_dtype(CkptfsDtype dtype);
CkptfsValue *ckptfs_value_container(CkptfsValueKind kind); /* DICT, ODICT, LIST, TUPLE, NAMESPACE */
CkptfsValue *ckptfs_value_tensor(CkptfsDtype dtype, unsigned ndim, const uint64_t *shape,
                                 CkptfsEmitFn emit, gconstpointer ctx);

/* An object as pickle rebuilds it: `module.name(*ARGS)` (or `__new__` with NEWOBJ), then
 * `__setstate__(STATE)` or a __dict__ update when STATE is not NULL. Takes ARGS and STATE. */
CkptfsValue *ckptfs_value_object(const char *module, const char *name, CkptfsValue *args,
                                 CkptfsValue *state, bool newobj);
/* A TUPLE of integers. */
CkptfsValue *ckptfs_value_int_tuple(const uint64_t *v, unsigned n);

/* Appends to a LIST/TUPLE. */
void ckptfs_value_append(CkptfsValue *container, CkptfsValue *item);
/* Adds KEY: VALUE to a DICT/ODICT/NAMESPACE (insertion order kept). */
void ckptfs_value_set(CkptfsValue *map, const char *key, CkptfsValue *value);

/* Adds KEY: VALUE with any hashable KEY value (DICT only). */
void ckptfs_value_set_item(CkptfsValue *map, CkptfsValue *key, CkptfsValue *value);

/* Bytes of a tensor value. */
uint64_t ckptfs_value_tensor_nbytes(const CkptfsValue *v);

#endif
