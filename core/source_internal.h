/* Between the generic source code (detection, top-level files) and each format's reader. */
#ifndef CKPTFS_SOURCE_INTERNAL_H
#define CKPTFS_SOURCE_INTERNAL_H

#include "ckptfs/source.h"

/* Fills SOURCE (whose dir, files and top_files are set) from a Hugging Face checkpoint. */
bool ckptfs_source_open_hf(CkptfsSource *source, GError **error);

/* Whether DIR looks like a Megatron legacy checkpoint (tracker file or mp_rank_* dirs). */
bool ckptfs_source_is_megatron(const char *dir);
/* Fills SOURCE from a Megatron-core legacy checkpoint (per-rank torch.save files). */
bool ckptfs_source_open_megatron(CkptfsSource *source, GError **error);

#endif
