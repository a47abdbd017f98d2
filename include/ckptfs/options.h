/* ckptfs's own options (-o key=value), shared by mount and the CLI commands. Options that are
 * not ckptfs's (allow_other, fsname, ...) are left to the FUSE layer. */
#ifndef CKPTFS_OPTIONS_H
#define CKPTFS_OPTIONS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct {
    uint64_t hf_shard_size; /* 0: hf/ passes the source files through unchanged */
} CkptfsOptions;

typedef enum {
    CKPTFS_OPTION_TAKEN,   /* a ckptfs option, applied */
    CKPTFS_OPTION_UNKNOWN, /* not a ckptfs option */
    CKPTFS_OPTION_BAD,     /* a ckptfs option with a bad value (error set) */
} CkptfsOptionResult;

void ckptfs_options_init(CkptfsOptions *options);

/* KEY_VALUE is "key=value" or "key". */
CkptfsOptionResult ckptfs_options_apply(CkptfsOptions *options, const char *key_value,
                                        GError **error);

/* A comma-separated list where every option must be a ckptfs option (CLI commands). */
bool ckptfs_options_apply_list(CkptfsOptions *options, const char *list, GError **error);

/* One line per option for --help. */
const char *ckptfs_options_help(void);

#endif
