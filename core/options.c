#include "ckptfs/options.h"

#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/units.h"

void ckptfs_options_init(CkptfsOptions *options)
{
    memset(options, 0, sizeof *options);
}

CkptfsOptionResult ckptfs_options_apply(CkptfsOptions *options, const char *key_value,
                                        GError **error)
{
    const char *eq = strchr(key_value, '=');
    size_t key_len = eq ? (size_t)(eq - key_value) : strlen(key_value);
    const char *value = eq ? eq + 1 : NULL;

    if (key_len == strlen("hf_shard_size") && strncmp(key_value, "hf_shard_size", key_len) == 0) {
        if (value == NULL) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                        "option hf_shard_size needs a value (hf_shard_size=5G)");
            return CKPTFS_OPTION_BAD;
        }
        GError *local = NULL;
        if (!ckptfs_parse_size(value, &options->hf_shard_size, &local)) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "option hf_shard_size: %s",
                        local->message);
            g_error_free(local);
            return CKPTFS_OPTION_BAD;
        }
        return CKPTFS_OPTION_TAKEN;
    }
    return CKPTFS_OPTION_UNKNOWN;
}

bool ckptfs_options_apply_list(CkptfsOptions *options, const char *list, GError **error)
{
    g_auto(GStrv) items = g_strsplit(list, ",", -1);
    for (char **item = items; *item; item++) {
        if (**item == '\0')
            continue;
        switch (ckptfs_options_apply(options, *item, error)) {
        case CKPTFS_OPTION_TAKEN:
            break;
        case CKPTFS_OPTION_UNKNOWN:
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "unknown option '%s'", *item);
            return false;
        case CKPTFS_OPTION_BAD:
            return false;
        }
    }
    return true;
}

const char *ckptfs_options_help(void)
{
    return "    -o hf_shard_size=SIZE  re-shard hf/ into safetensors files of at most SIZE\n"
           "                           (4096, 256M, 5G = binary units; 5GB = decimal, as\n"
           "                           Hugging Face's max_shard_size); default: the source's\n"
           "                           own files, byte-identical\n";
}
