#include "ckptfs/error.h"

#include <errno.h>

G_DEFINE_QUARK(ckptfs-error-quark, ckptfs_error)

int ckptfs_error_errno(const GError *error)
{
    if (error == NULL || error->domain != CKPTFS_ERROR)
        return EIO;
    switch ((CkptfsErrorCode)error->code) {
    case CKPTFS_ERROR_NOT_FOUND:
    case CKPTFS_ERROR_INVALID:
        return ENOENT;
    case CKPTFS_ERROR_UNSUPPORTED:
        return ENOTSUP;
    case CKPTFS_ERROR_IO:
    case CKPTFS_ERROR_FORMAT:
    case CKPTFS_ERROR_CHANGED:
        break;
    }
    return EIO;
}
