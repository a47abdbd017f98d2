/* Views: each builds one top-level directory of the mount from a source. */
#ifndef CKPTFS_VIEWS_H
#define CKPTFS_VIEWS_H

#include <glib.h>
#include <stdbool.h>

#include "ckptfs/layout.h"
#include "ckptfs/model.h"
#include "ckptfs/options.h"
#include "ckptfs/source.h"
#include "ckptfs/tree.h"

/* hf/: pass-through of the source's files, or re-sharded safetensors when
 * options->hf_shard_size is set. Adds the view's nodes under DIR. */
bool ckptfs_hf_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                          const CkptfsOptions *options, GError **error);

/* Re-sharding as Hugging Face's save_pretrained does it: tensors in order, a new shard when the
 * next tensor would push the current one past MAX_SHARD_SIZE. Returns the shard index of each
 * catalog tensor in SHARD_OF (length = tensor count) and the number of shards. */
unsigned ckptfs_hf_assign_shards(const CkptfsCatalog *catalog, uint64_t max_shard_size,
                                 unsigned *shard_of);

/* tp{T}pp{P}[vpp{V}]/: Megatron-core legacy rank files of MODEL for LAYOUT (validated here;
 * the error says why a layout is invalid). */
bool ckptfs_megatron_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                                const CkptfsModel *model, const CkptfsOptions *options,
                                const CkptfsLayout *layout, GError **error);

#endif
