#include "ckptfs/error.h"

G_DEFINE_QUARK(ckptfs-error-quark, ckptfs_error)

gboolean ckptfs_fail(GError **error, CkptfsErrorCode code, const char *fmt, ...)
{
    if (error == NULL || *error != NULL)
        return FALSE;
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error_literal(error, CKPTFS_ERROR, code, msg);
    return FALSE;
}
