/* libFuzzer target: the input is a whole safetensors file. Its header is parsed and validated;
 * a header that parses is rebuilt with the writer and must parse again to the same entries. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t json_len;
    if (size < 8 || !ckptfs_st_header_length("fuzz", data, size, &json_len, NULL))
        return 0;
    CkptfsStHeader *h = ckptfs_st_parse_header("fuzz", (const char *)data + 8, (size_t)json_len,
                                               size, NULL);
    if (h == NULL)
        return 0;
    GBytes *rebuilt = ckptfs_st_build_header((CkptfsStEntry *const *)h->entries->pdata,
                                             h->entries->len,
                                             (const char *const *)h->metadata->pdata,
                                             h->metadata->len / 2);
    gsize rlen;
    const uint8_t *r = g_bytes_get_data(rebuilt, &rlen);
    uint64_t data_size = size - h->data_start;
    uint64_t rjson;
    if (!ckptfs_st_header_length("rebuilt", r, rlen + data_size, &rjson, NULL))
        abort();
    CkptfsStHeader *again = ckptfs_st_parse_header("rebuilt", (const char *)r + 8, (size_t)rjson,
                                                   rlen + data_size, NULL);
    if (again == NULL || again->entries->len != h->entries->len)
        abort();
    for (guint i = 0; i < h->entries->len; i++) {
        const CkptfsStEntry *a = g_ptr_array_index(h->entries, i);
        const CkptfsStEntry *b = g_ptr_array_index(again->entries, i);
        if (strcmp(a->name, b->name) != 0 || a->dtype != b->dtype || a->ndim != b->ndim ||
            a->begin != b->begin || a->end != b->end ||
            memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]) != 0)
            abort();
    }
    ckptfs_st_header_free(again);
    g_bytes_unref(rebuilt);
    ckptfs_st_header_free(h);
    return 0;
}
