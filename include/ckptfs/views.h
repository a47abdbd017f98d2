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
#include "ckptfs/value.h"

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
/* What a layout needs of a model beyond ckptfs_layout_validate, for the options' spec: the
 * local spec's split of MLA's down projections, the MTP layer's split of eh_proj. */
bool ckptfs_megatron_layout_check(const CkptfsModel *model, const CkptfsOptions *options,
                                  const CkptfsLayout *layout, GError **error);
bool ckptfs_megatron_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                                const CkptfsModel *model, const CkptfsOptions *options,
                                const CkptfsLayout *layout, GError **error);

/* args (argparse.Namespace) as Megatron-LM saves them, with what loaders read: sizes, the
 * split of LAYOUT, vocabulary padding, dtype, spec, CKPT_FORMAT ("torch", "torch_dist"). */
CkptfsValue *ckptfs_megatron_args(const CkptfsModel *model, const CkptfsOptions *options,
                                  const CkptfsLayout *layout, uint64_t padded_vocab,
                                  const char *ckpt_format);

/* mcore/: a torch_dist checkpoint (Megatron-core's sharded format) of MODEL, chunked so that a
 * loader at any tensor-parallel degree the model allows reads little more than its share. */
bool ckptfs_mcore_view_build(CkptfsTree *tree, CkptfsNode *dir, const CkptfsSource *source,
                             const CkptfsModel *model, const CkptfsOptions *options,
                             GError **error);

#endif
