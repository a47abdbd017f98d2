#include "ckptfs/error.h"

/* As G_DEFINE_QUARK, whose plain static is read and written by every thread failing at once
 * (a data race); here an atomic, set by whoever comes first (the quark is the same for all). */
GQuark ckptfs_error_quark(void)
{
    static GQuark quark;
    GQuark q = __atomic_load_n(&quark, __ATOMIC_ACQUIRE);
    if (q == 0) {
        q = g_quark_from_static_string("ckptfs-error-quark");
        __atomic_store_n(&quark, q, __ATOMIC_RELEASE);
    }
    return q;
}

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
