#include "ckptfs/error.h"

G_DEFINE_QUARK(ckptfs-error-quark, ckptfs_error)
