/* torch.save files from values: the pickle (protocol 2, as torch.save writes it) and the zip
 * container around it, with tensor storages as extents of the plan. */
#ifndef CKPTFS_TORCHSAVE_H
#define CKPTFS_TORCHSAVE_H

#include <glib.h>

#include "ckptfs/plan.h"
#include "ckptfs/value.h"

/* The plan of `torch.save(ROOT)` with entries under ARCHIVE_NAME/. Each tensor value gets its
 * own storage, keyed "0", "1", ... in pickle order. */
CkptfsPlan *ckptfs_torchsave_plan(const CkptfsValue *root, const char *archive_name,
                                  GError **error);

#endif
