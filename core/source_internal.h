/* Between the generic source code (detection, top-level files) and each format's reader. */
#ifndef CKPTFS_SOURCE_INTERNAL_H
#define CKPTFS_SOURCE_INTERNAL_H

#include "ckptfs/source.h"

/* Adds every top-level regular file of DIR_PATH (symlinks followed; sub-directories left out)
 * to SOURCE's top files; a name already present keeps its first file. */
bool ckptfs_source_add_top_files(CkptfsSource *source, const char *dir_path, GError **error);
/* Adds one file under NAME to SOURCE's top files. */
bool ckptfs_source_add_file(CkptfsSource *source, const char *name, const char *path,
                            GError **error);

/* Fills SOURCE (whose dir, files and top_files are set) from a Hugging Face checkpoint. */
bool ckptfs_source_open_hf(CkptfsSource *source, GError **error);

/* Whether DIR looks like a Megatron legacy checkpoint (tracker file or mp_rank_* dirs). */
bool ckptfs_source_is_megatron(const char *dir);
/* Fills SOURCE from a Megatron-core legacy checkpoint (per-rank torch.save files). */
bool ckptfs_source_open_megatron(CkptfsSource *source, const CkptfsOptions *options,
                                 GError **error);

#endif
