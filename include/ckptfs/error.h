/* Error reporting for core: GError with one ckptfs domain. Messages name the file, the
 * tensor and the problem, in one line, so a CLI can print them as they are. */
#ifndef CKPTFS_ERROR_H
#define CKPTFS_ERROR_H

#include <glib.h>

#define CKPTFS_ERROR (ckptfs_error_quark())
GQuark ckptfs_error_quark(void);

typedef enum {
    CKPTFS_ERROR_IO,          /* a system call failed (errno in the message) */
    CKPTFS_ERROR_FORMAT,      /* a source file is malformed */
    CKPTFS_ERROR_UNSUPPORTED, /* valid input we do not handle (dtype, architecture, ...) */
    CKPTFS_ERROR_INVALID,     /* bad option or layout asked for by the user */
    CKPTFS_ERROR_NOT_FOUND,   /* no such file / view / tensor */
    CKPTFS_ERROR_CHANGED,     /* a source file changed after it was opened */
} CkptfsErrorCode;

/* Sets *ERROR, unless ERROR is NULL or already set (the first problem found is the one
 * reported), and returns false: `return ckptfs_fail(error, CODE, "...", ...);`. */
gboolean ckptfs_fail(GError **error, CkptfsErrorCode code, const char *fmt, ...) G_GNUC_PRINTF(3, 4);

#endif
