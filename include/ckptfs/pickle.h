/* A pickle parser that executes nothing: it runs the opcodes of protocols 2 to 5 over a small
 * object model. Globals are never imported or called; the few torch.save builds on (tensor
 * rebuilds, OrderedDict) are recognised by name, every other one becomes an opaque object that
 * keeps its name, arguments and state. Bounded in depth, size and memory for hostile input. */
#ifndef CKPTFS_PICKLE_H
#define CKPTFS_PICKLE_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/dtype.h"

typedef enum {
    CKPTFS_PY_NONE,
    CKPTFS_PY_BOOL,
    CKPTFS_PY_INT,    /* i; big = true when it did not fit in 64 bits */
    CKPTFS_PY_FLOAT,
    CKPTFS_PY_STR,    /* UTF-8 as given, s/len */
    CKPTFS_PY_BYTES,  /* s/len */
    CKPTFS_PY_TUPLE,
    CKPTFS_PY_LIST,
    CKPTFS_PY_DICT,   /* dict or OrderedDict: items = key, value, key, value ... in order */
    CKPTFS_PY_SET,
    CKPTFS_PY_GLOBAL, /* module/name, never resolved */
    CKPTFS_PY_OBJECT, /* an unknown callable applied: callable, args, state (each may be NULL) */
    CKPTFS_PY_PERSID, /* a persistent id: args holds the id object */
    CKPTFS_PY_TENSOR, /* torch._utils._rebuild_tensor_v2 / _rebuild_parameter */
} CkptfsPyKind;

typedef struct {
    char *storage_key;     /* the record name under data/ */
    CkptfsDtype dtype;     /* from the storage class */
    uint64_t storage_numel;
    uint64_t offset;       /* in elements */
    unsigned ndim;
    uint64_t shape[CKPTFS_MAX_DIMS];
    uint64_t stride[CKPTFS_MAX_DIMS];
} CkptfsPyTensor;

/* One value. A big .metadata holds millions, so the fields of different kinds share memory:
 * read only those of the value's kind. None, booleans, integers 0..255 and the empty tuple are
 * shared by every place that holds them; values are never changed once parsed. */
typedef struct CkptfsPy CkptfsPy;
struct CkptfsPy {
    CkptfsPyKind kind;
    bool big;
    union {
        int64_t i; /* INT BOOL */
        double f;  /* FLOAT */
    };
    GPtrArray *items; /* TUPLE LIST DICT SET; OBJECT: what APPENDS/SETITEMS gave it (or NULL) */
    union {
        struct {
            char *s; /* STR BYTES */
            size_t len;
        };
        struct {
            char *module, *name; /* GLOBAL */
        };
        struct {
            CkptfsPy *callable, *args, *state; /* OBJECT (args also for PERSID) */
        };
        CkptfsPyTensor *tensor; /* TENSOR */
    };
};

typedef struct CkptfsPickle CkptfsPickle;

/* Parses DATA; WHAT names the input in errors ("FILE: data.pkl"). */
CkptfsPickle *ckptfs_pickle_parse(const char *what, const uint8_t *data, size_t len,
                                  GError **error);
void ckptfs_pickle_free(CkptfsPickle *pickle);
const CkptfsPy *ckptfs_pickle_root(const CkptfsPickle *pickle);

/* Lookups on parsed values (NULL when absent or of another kind). */
const CkptfsPy *ckptfs_py_dict_get(const CkptfsPy *dict, const char *key);
/* The state dict of an object built with NEWOBJ/BUILD (argparse.Namespace), or NULL. */
const CkptfsPy *ckptfs_py_object_state(const CkptfsPy *obj);
bool ckptfs_py_is_global(const CkptfsPy *v, const char *module, const char *name);
const char *ckptfs_py_str(const CkptfsPy *v); /* STR value, NUL-terminated, or NULL */
/* The element type of a torch storage class (torch.FloatStorage), INVALID when unknown. */
CkptfsDtype ckptfs_py_storage_dtype(const CkptfsPy *cls);
/* A tuple of non-negative ints (or torch.Size over one) into OUT (CKPTFS_MAX_DIMS at most). */
bool ckptfs_py_dims(const CkptfsPy *v, uint64_t *out, unsigned *n);

#endif
