/* libFuzzer target: any bytes as a pickle. Parsing must end with a value or an error, within
 * the parser's bounds; a parsed tree is walked to touch every object. */
#include <stdint.h>
#include <stdlib.h>

#include "ckptfs/pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Visits at most *BUDGET nodes: memo references can share objects, so an unbounded walk of
 * the graph as a tree could take exponential time. */
static size_t walk(const CkptfsPy *v, unsigned depth, size_t *budget)
{
    if (v == NULL || depth > 64 || *budget == 0)
        return 0;
    (*budget)--;
    size_t n = 1;
    if (v->items)
        for (guint i = 0; i < v->items->len; i++)
            n += walk(g_ptr_array_index(v->items, i), depth + 1, budget);
    if (v->kind == CKPTFS_PY_OBJECT || v->kind == CKPTFS_PY_PERSID) /* the fields of other kinds share memory */
        n += walk(v->args, depth + 1, budget) + (v->kind == CKPTFS_PY_OBJECT ? walk(v->state, depth + 1, budget) : 0);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    GError *error = NULL;
    CkptfsPickle *p = ckptfs_pickle_parse("fuzz", data, size, &error);
    if (p == NULL && error == NULL)
        abort(); /* a failure always says why */
    if (p)
    {
        size_t budget = 100000;
        (void)walk(ckptfs_pickle_root(p), 0, &budget);
    }
    g_clear_error(&error);
    ckptfs_pickle_free(p);
    return 0;
}
