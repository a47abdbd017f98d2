/* Between the generic source code (detection, top-level files) and each format's reader. */
#ifndef CKPTFS_SOURCE_INTERNAL_H
#define CKPTFS_SOURCE_INTERNAL_H

#include "ckptfs/source.h"

/* Fills SOURCE (whose dir, files and top_files are set) from a Hugging Face checkpoint. */
bool ckptfs_source_open_hf(CkptfsSource *source, GError **error);

#endif
