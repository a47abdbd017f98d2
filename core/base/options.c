#include "ckptfs/options.h"

#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/units.h"

void ckptfs_options_init(CkptfsOptions *options)
{
    memset(options, 0, sizeof *options);
    options->spec = CKPTFS_SPEC_TE;
    options->vocab_divisible_by = 128;
    options->vocab_pad = CKPTFS_VOCAB_PAD_ZERO;
    options->megatron_args = true;
    options->prefetch = CKPTFS_PREFETCH_AUTO;
    options->direct_io = true;
    options->mapped_reads = true;
    options->readahead = CKPTFS_READAHEAD_AUTO;
}

void ckptfs_options_clear(CkptfsOptions *options)
{
    g_clear_pointer(&options->layouts, g_strfreev);
    g_clear_pointer(&options->iteration, g_free);
    g_clear_pointer(&options->hf_arch, g_free);
    g_clear_pointer(&options->hf_config, g_free);
    g_clear_pointer(&options->hf_extra, g_free);
    g_clear_pointer(&options->step, g_free);
    g_clear_pointer(&options->role, g_free);
}

void ckptfs_options_copy(CkptfsOptions *dst, const CkptfsOptions *src)
{
    *dst = *src;
    dst->layouts = g_strdupv(src->layouts);
    dst->iteration = g_strdup(src->iteration);
    dst->hf_arch = g_strdup(src->hf_arch);
    dst->hf_config = g_strdup(src->hf_config);
    dst->hf_extra = g_strdup(src->hf_extra);
    dst->step = g_strdup(src->step);
    dst->role = g_strdup(src->role);
}

static bool bad(GError **error, const char *key, const char *why)
{
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "option %s: %s", key, why);
    return false;
}

/* A number option's VALUE, MIN to MAX: digits only ("-1" is refused, not read as 2^64 - 1). */
static bool parse_number(const char *key, const char *value, uint64_t min, uint64_t max, uint64_t *out,
                         GError **error)
{
    GError *local = NULL;
    if (!ckptfs_parse_uint(value, min, max, out, &local)) {
        bad(error, key, local->message);
        g_error_free(local);
        return false;
    }
    return true;
}

static bool parse_count(const char *key, const char *value, unsigned min, unsigned *out,
                        GError **error)
{
    uint64_t v;
    if (!parse_number(key, value, min, 1u << 20, &v, error))
        return false;
    *out = (unsigned)v;
    return true;
}

static bool parse_choice(const char *key, const char *value, const char *const *names, int *out,
                         GError **error)
{
    for (int i = 0; value && names[i]; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return true;
        }
    g_autofree char *all = g_strjoinv("|", (char **)names);
    g_autofree char *why = g_strdup_printf("'%s' is not one of %s", value ? value : "", all);
    return bad(error, key, why);
}

typedef bool (*OptionFn)(CkptfsOptions *o, const char *key, const char *value, GError **error);

/* A size option's VALUE (4096, 256M, 5GB) into *OUT. */
static bool parse_size_option(const char *key, const char *value, uint64_t *out, GError **error)
{
    GError *local = NULL;
    if (!ckptfs_parse_size(value, out, &local)) {
        bad(error, key, local->message);
        g_error_free(local);
        return false;
    }
    return true;
}

static bool opt_hf_shard_size(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_size_option(key, value, &o->hf_shard_size, error);
}

static bool opt_frame_cache(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_size_option(key, value, &o->frame_cache, error);
}

static bool opt_prefetch(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    if (strcmp(value, "0") == 0 || strcmp(value, "auto") == 0) { /* off; the source's own default */
        o->prefetch = strcmp(value, "0") == 0 ? 0 : CKPTFS_PREFETCH_AUTO;
        return true;
    }
    if (!parse_size_option(key, value, &o->prefetch, error))
        return false;
    if (o->prefetch > CKPTFS_PREFETCH_MAX)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "option prefetch=%s: at most 64G", value);
    return true;
}

static bool opt_spec(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    static const char *const names[] = {"te", "local", NULL};
    int i;
    if (!parse_choice(key, value, names, &i, error))
        return false;
    o->spec = (CkptfsSpec)i;
    return true;
}

static bool opt_vocab_pad(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    static const char *const names[] = {"zero", "last", NULL};
    int i;
    if (!parse_choice(key, value, names, &i, error))
        return false;
    o->vocab_pad = (CkptfsVocabPad)i;
    return true;
}

/* OFF|ON (two names) into *OUT: true for ON. */
static bool parse_pair(const char *key, const char *value, const char *off, const char *on, bool *out,
                       GError **error)
{
    const char *const names[] = {off, on, NULL};
    int i;
    if (!parse_choice(key, value, names, &i, error))
        return false;
    *out = i == 1;
    return true;
}

/* off|on into *OUT. */
static bool parse_switch(const char *key, const char *value, bool *out, GError **error)
{
    return parse_pair(key, value, "off", "on", out, error);
}

static bool opt_megatron_args(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_switch(key, value, &o->megatron_args, error);
}

static bool opt_moe_grouped_gemm(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_switch(key, value, &o->moe_grouped_gemm, error);
}

static bool opt_megatron_names(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_pair(key, value, "mbridge", "bridge", &o->bridge_names, error);
}

static bool opt_source_fds(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_pair(key, value, "shared", "reader", &o->fd_per_reader, error);
}

static bool opt_direct_io(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_switch(key, value, &o->direct_io, error);
}

static bool opt_mapped_reads(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_switch(key, value, &o->mapped_reads, error);
}

static bool opt_readahead(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    if (strcmp(value, "off") == 0 || strcmp(value, "0") == 0 || strcmp(value, "auto") == 0) {
        o->readahead = strcmp(value, "auto") == 0 ? CKPTFS_READAHEAD_AUTO : 0;
        return true;
    }
    GError *local = NULL;
    if (!ckptfs_parse_size(value, &o->readahead, &local)) {
        g_autofree char *why = g_strdup_printf("auto, off or a size: %s", local->message);
        g_error_free(local);
        return bad(error, key, why);
    }
    if (o->readahead > CKPTFS_PREFETCH_MAX)
        return ckptfs_fail(error, CKPTFS_ERROR_INVALID, "option readahead=%s: at most 64G", value);
    return true;
}

static bool opt_readahead_cores(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_count(key, value, 1, &o->readahead_cores, error);
}

static bool opt_readahead_streams(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_count(key, value, 1, &o->readahead_streams, error);
}

static bool opt_mtp(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_switch(key, value, &o->mtp, error);
}

static bool opt_crc32(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_pair(key, value, "zero", "compute", &o->crc32, error);
}

static bool opt_vocab_divisible_by(CkptfsOptions *o, const char *key, const char *value,
                                   GError **error)
{
    return parse_count(key, value, 1, &o->vocab_divisible_by, error);
}

static bool opt_pp_first(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_count(key, value, 1, &o->pp_first, error);
}

static bool opt_pp_last(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    return parse_count(key, value, 1, &o->pp_last, error);
}

static bool opt_layouts(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    if (value == NULL || *value == '\0')
        return bad(error, key, "needs a list such as tp2pp2:tp4pp1");
    g_strfreev(o->layouts);
    o->layouts = g_strsplit(value, ":", -1);
    return true;
}

static bool set_string(char **field, const char *value)
{
    g_free(*field);
    *field = g_strdup(value);
    return true;
}

static bool opt_iteration(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    uint64_t v;
    if (strcmp(value, "release") != 0 && !ckptfs_parse_uint(value, 0, G_MAXUINT64, &v, NULL)) {
        g_autofree char *why = g_strdup_printf("needs \"release\" or an iteration number (digits only, below 2^64), "
                                               "not '%s'", value);
        return bad(error, key, why);
    }
    return set_string(&o->iteration, value);
}

static bool opt_hf_arch(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    /* Checked against the architecture table when a Megatron source is opened. */
    if (*value == '\0')
        return bad(error, key, "give an architecture (llama, mistral, qwen2, qwen3, phi3, ...)");
    return set_string(&o->hf_arch, value);
}

static bool opt_hf_config(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    if (!g_file_test(value, G_FILE_TEST_IS_REGULAR))
        return bad(error, key, "is not a file");
    return set_string(&o->hf_config, value);
}

static bool opt_hf_extra(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    if (!g_file_test(value, G_FILE_TEST_IS_DIR))
        return bad(error, key, "is not a directory");
    return set_string(&o->hf_extra, value);
}

static bool opt_dtype(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    static const char *const names[] = {"auto", "bf16", "fp32", NULL};
    int i;
    if (!parse_choice(key, value, names, &i, error))
        return false;
    o->dtype = (CkptfsServeDtype)i;
    return true;
}

static bool opt_step(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    uint64_t v;
    if (strcmp(value, "latest") != 0 && !ckptfs_parse_uint(value, 0, G_MAXUINT64, &v, NULL)) {
        g_autofree char *why = g_strdup_printf("needs \"latest\" or a step number (digits only, below 2^64), "
                                               "not '%s'", value);
        return bad(error, key, why);
    }
    return set_string(&o->step, value);
}

static bool opt_role(CkptfsOptions *o, const char *key, const char *value, GError **error)
{
    /* Any role directory name verl writes (actor, critic, ...); checked when the run is read. */
    if (*value == '\0' || strchr(value, '/') != NULL || strcmp(value, ".") == 0 || strcmp(value, "..") == 0)
        return bad(error, key, "needs a role directory name such as actor or critic");
    return set_string(&o->role, value);
}

static const struct {
    const char *key;
    OptionFn apply;
    const char *help;
} option_table[] = {
    {"hf_shard_size", opt_hf_shard_size,
     "re-shard hf/ into safetensors files of at most SIZE (4096, 256M, 5G = binary\n"
     "                           units; 5GB = decimal, as Hugging Face's max_shard_size);\n"
     "                           default: the source's own files, byte-identical"},
    {"spec", opt_spec, "te|local: Megatron names of Transformer Engine (default) or local layers"},
    {"prefetch", opt_prefetch,
     "bytes of source data asked for ahead of a sequential reader of a view file;\n"
     "                           of a packed source, frames decoded ahead on decoder threads\n"
     "                           (default auto: 16M for packed sources, 32M for raw ones on\n"
     "                           a local disk, 0 (none) otherwise)"},
    {"source_fds", opt_source_fds,
     "shared|reader: plain source files read through one descriptor each for the whole\n"
     "                           mount (default), or through each open view file's own (for\n"
     "                           object-store clients that stream each open file: rclone, s3fs)"},
    {"direct_io", opt_direct_io,
     "on|off: the Megatron views' rank files and mcore/'s files, which loaders stream\n"
     "                           and never map shared, skip the mount's page cache (default on;\n"
     "                           direct_io alone: on)"},
    {"mapped_reads", opt_mapped_reads,
     "on|off: replies copied straight from the source's cached pages (a mapping guarded\n"
     "                           by a read lease) instead of read into the daemon first, where the\n"
     "                           source is on a local file system the daemon may lease (default on)"},
    {"readahead", opt_readahead,
     "auto|SIZE|off: chunks ahead of a sequential reader built on worker\n"
     "                           threads and stored in the mount's page cache. auto (default):\n"
     "                           for a rank file or mcore/ file read alone, on 8 cores or more\n"
     "                           (64M at most); SIZE: for every file read through that cache, at\n"
     "                           most SIZE ahead of all readers together"},
    {"readahead_cores", opt_readahead_cores,
     "the cores readahead=auto counts (default: those the daemon may run\n"
     "                           on; auto needs 8)"},
    {"readahead_streams", opt_readahead_streams,
     "readahead=auto pushes while at most N rank or mcore/ files are open\n"
     "                           (default 1)"},
    {"frame_cache", opt_frame_cache,
     "packed sources (ckptfs pack): decoded frames kept, at most SIZE (default 64M)"},
    {"moe_grouped_gemm", opt_moe_grouped_gemm,
     "off|on: experts as SequentialMLP local_experts (default) or TEGroupedMLP weight{e} keys"},
    {"megatron_names", opt_megatron_names,
     "mbridge|bridge: a vision-language model's Megatron views (and a Megatron source\n"
     "                           of one) hold mbridge's module tree (default) or Megatron-Bridge's"},
    {"mtp", opt_mtp,
     "off|on: the multi-token prediction layers (DeepSeek-V3) in the Megatron views as\n"
     "                           mtp.layers.N (default off: left out)"},
    {"vocab_divisible_by", opt_vocab_divisible_by,
     "pad the vocabulary to a multiple of N x tp (default 128)"},
    {"vocab_pad", opt_vocab_pad, "zero|last: padding rows are zeros (default) or the last row"},
    {"pp_first", opt_pp_first, "layers on the first pipeline stage (uneven pipelines)"},
    {"pp_last", opt_pp_last, "layers on the last pipeline stage (uneven pipelines)"},
    {"megatron_args", opt_megatron_args,
     "on|off: rank files carry Megatron's args Namespace (default on)"},
    {"crc32", opt_crc32,
     "zero|compute: CRC fields of synthesized zips are 0 (default; torch does not\n"
     "                           check them) or real, computed on first read (zipfile, unzip -t)"},
    {"iteration", opt_iteration, "Megatron source: release or N (default: the tracker's)"},
    {"hf_arch", opt_hf_arch, "Megatron source: the architecture (llama, mistral, qwen2, qwen3, phi3)"},
    {"hf_config", opt_hf_config, "Megatron source: serve this config.json in hf/"},
    {"hf_extra", opt_hf_extra, "Megatron source: pass this directory's files (tokenizer...) to hf/"},
    {"dtype", opt_dtype,
     "auto|bf16|fp32: element type of the weights in every view; auto = the source's\n"
     "                           own (bf16 for verl's fp32 FSDP shards); others converted on read"},
    {"step", opt_step, "verl run: mount only this saved step (N or latest)"},
    {"role", opt_role, "verl run: with step, the role (actor, critic) whose views are the root"},
    {"layouts", opt_layouts, "extra layouts to list at the root, e.g. tp8pp2:tp2pp4vpp2"},
};

CkptfsOptionResult ckptfs_options_apply(CkptfsOptions *options, const char *key_value,
                                        GError **error)
{
    const char *eq = strchr(key_value, '=');
    g_autofree char *key = eq ? g_strndup(key_value, (gsize)(eq - key_value)) : g_strdup(key_value);
    const char *value = eq ? eq + 1 : NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(option_table); i++) {
        if (strcmp(key, option_table[i].key) != 0)
            continue;
        if (value == NULL && strcmp(key, "direct_io") == 0)
            value = "on"; /* as libfuse's own direct_io flag is written */
        if (value == NULL) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID,
                        "option %s needs a value (%s=...)", key, key);
            return CKPTFS_OPTION_BAD;
        }
        return option_table[i].apply(options, key, value, error) ? CKPTFS_OPTION_TAKEN
                                                                   : CKPTFS_OPTION_BAD;
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

char *ckptfs_options_help(void)
{
    GString *s = g_string_new(NULL);
    for (size_t i = 0; i < G_N_ELEMENTS(option_table); i++) {
        g_autofree char *left = g_strdup_printf("%s=...", option_table[i].key);
        g_string_append_printf(s, "    -o %-22s %s\n", left, option_table[i].help);
    }
    return g_string_free(s, FALSE);
}
