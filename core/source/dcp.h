/* Reading a PyTorch distributed checkpoint (DCP: `.metadata` + `*.distcp`), shared by the
 * sources that hold one (Megatron's torch_dist, the Hugging Face Trainer's FSDP saves). Only
 * the pickles are parsed (nothing executed); each chunk is located, never copied. */
#ifndef CKPTFS_SOURCE_DCP_H
#define CKPTFS_SOURCE_DCP_H

#include "ckptfs/pickle.h"
#include "ckptfs/srcfiles.h"
#include "ckptfs/zipreader.h"

typedef struct {
    CkptfsSrcFiles *files;
    GError **error;
    char *dir;                          /* the directory holding .metadata and the .distcp files */
    char *metadata_path;
    CkptfsPickle *metadata;
    const CkptfsPy *state_dict_metadata; /* key -> TensorStorageMetadata / BytesStorageMetadata */
    const CkptfsPy *planner_data;        /* flattened key -> its path in the saved dict, or NULL */
    GHashTable *storage;                 /* "fqn\n(offsets)" -> _StorageInfo state dict */
    GHashTable *file_srcs;               /* relative path -> src + 1 */
    GArray *spans;                       /* the archives read, to refuse overlaps */
} CkptfsDcp;

/* Where one chunk's first element is. */
typedef struct {
    uint32_t src;
    uint64_t base;
} CkptfsDcpChunk;

void ckptfs_dcp_init(CkptfsDcp *dcp, CkptfsSrcFiles *files, const char *dir, GError **error);
void ckptfs_dcp_clear(CkptfsDcp *dcp);
/* Parses DIR/.metadata: a torch.distributed.checkpoint Metadata with its state_dict_metadata
 * and storage_data (indexed); planner_data when the saver flattened a nested dict. */
bool ckptfs_dcp_read_metadata(CkptfsDcp *dcp);
/* A torch.save archive's pickle (WHAT names it in errors). */
CkptfsPickle *ckptfs_dcp_parse_archive(CkptfsDcp *dcp, CkptfsZip *zip, const char *what);
/* The element type of a TensorStorageMetadata's properties, or CKPTFS_DTYPE_INVALID. */
CkptfsDtype ckptfs_dcp_tensor_dtype(const CkptfsPy *tensor_metadata);
/* Chunk C of KEY's chunk list: its offsets and sizes, of rank N, inside SHAPE. */
bool ckptfs_dcp_chunk_box(CkptfsDcp *dcp, const char *key, const CkptfsPy *chunks, guint c,
                          const uint64_t *shape, unsigned n, uint64_t *offsets, uint64_t *sizes);
/* Finds one chunk's bytes: its archive, the tensor in it (shape SIZES, DTYPE, contiguous),
 * its record. */
bool ckptfs_dcp_locate_chunk(CkptfsDcp *dcp, const char *fqn, const uint64_t *offsets, const uint64_t *sizes,
                             unsigned n, CkptfsDtype dtype, CkptfsDcpChunk *out);
/* Two chunks whose archives share bytes are a corrupt checkpoint, not two views of data. */
bool ckptfs_dcp_check_overlaps(CkptfsDcp *dcp);
/* How many .distcp files the chunks located are in. */
unsigned ckptfs_dcp_file_count(const CkptfsDcp *dcp);

#endif
