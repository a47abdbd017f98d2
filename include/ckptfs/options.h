/* ckptfs's own options (-o key=value), shared by mount and the CLI commands. Options that are
 * not ckptfs's (allow_other, fsname, ...) are left to the FUSE layer. */
#ifndef CKPTFS_OPTIONS_H
#define CKPTFS_OPTIONS_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

typedef enum { CKPTFS_SPEC_TE, CKPTFS_SPEC_LOCAL } CkptfsSpec;
typedef enum { CKPTFS_VOCAB_PAD_ZERO, CKPTFS_VOCAB_PAD_LAST } CkptfsVocabPad;
/* The element type views serve floating-point weights in: the source's own (or its format's
 * default: bf16 for verl's fp32 FSDP shards), or converted on read. */
typedef enum { CKPTFS_SERVE_AUTO, CKPTFS_SERVE_BF16, CKPTFS_SERVE_FP32 } CkptfsServeDtype;

#define CKPTFS_PREFETCH_AUTO UINT64_MAX
#define CKPTFS_PREFETCH_MAX (64ull << 30)
/* -o readahead=auto: a lone reader of a streamed file gets its chunks pushed (readahead_policy.h). */
#define CKPTFS_READAHEAD_AUTO UINT64_MAX

typedef struct {
    uint64_t hf_shard_size; /* 0: hf/ passes the source files through unchanged */
    uint64_t frame_cache;   /* packed sources: decoded frames kept (0: the default) */
    bool fd_per_reader;     /* each open view file reads plain source files through its own fds */
    uint64_t prefetch;      /* source bytes asked for ahead of a sequential reader (0: none;
                               CKPTFS_PREFETCH_AUTO: the source's default, srcfiles.h) */
    bool direct_io;         /* files their loaders stream (CKPTFS_HINT_STREAMED) bypass the
                               mount's page cache */
    bool mapped_reads;      /* replies from leased mappings of source files (srcfiles.h) */
    uint64_t readahead;     /* bytes pushed into the mount's page cache ahead of sequential readers
                               of files read through it, all files together (readahead.h; 0: off;
                               CKPTFS_READAHEAD_AUTO, the default: readahead_policy.h) */
    unsigned readahead_cores;   /* the cores readahead=auto counts (0: the machine's) */
    unsigned readahead_streams; /* readahead=auto pushes while at most this many streamed files
                                   are open (0: the default, 1) */
    /* Megatron views */
    CkptfsSpec spec;              /* TE names (default) or local names */
    bool mtp;                     /* multi-token prediction layers in the Megatron views */
    bool moe_grouped_gemm;        /* experts as TEGroupedMLP keys (weight{e}), not SequentialMLP */
    bool bridge_names;            /* a VLM's module tree as Megatron-Bridge names it, not mbridge */
    unsigned vocab_divisible_by;  /* Megatron's --make-vocab-size-divisible-by (128) */
    CkptfsVocabPad vocab_pad;     /* padding rows: zeros, or copies of the last row */
    unsigned pp_first, pp_last;   /* uneven pipelines: layers on the first/last stage */
    bool megatron_args;           /* put an argparse.Namespace `args` in rank files */
    bool crc32;                   /* real CRC-32s in synthesized zips (computed on read) */
    char **layouts;               /* extra layouts the root lists (NULL-terminated) */
    CkptfsServeDtype dtype;       /* element type of the weights every view serves */
    /* Megatron sources */
    char *iteration;              /* "release" or a number: which checkpoint of the directory */
    char *hf_arch;                /* llama|mistral|qwen2|qwen3: architecture of hf/config.json */
    char *hf_config;              /* a config.json to serve in hf/ instead of a synthesized one */
    char *hf_extra;               /* a directory whose files (tokenizer...) hf/ passes through */
    /* verl run directories */
    char *step;                   /* "latest" or N: mount one saved step (default: all of them) */
    char *role;                   /* actor|critic: with step, the role whose views are the root */
} CkptfsOptions;

typedef enum {
    CKPTFS_OPTION_TAKEN,   /* a ckptfs option, applied */
    CKPTFS_OPTION_UNKNOWN, /* not a ckptfs option */
    CKPTFS_OPTION_BAD,     /* a ckptfs option with a bad value (error set) */
} CkptfsOptionResult;

void ckptfs_options_init(CkptfsOptions *options);
void ckptfs_options_clear(CkptfsOptions *options);
/* Deep copy (layouts duplicated). */
void ckptfs_options_copy(CkptfsOptions *dst, const CkptfsOptions *src);

/* KEY_VALUE is "key=value" or "key". */
CkptfsOptionResult ckptfs_options_apply(CkptfsOptions *options, const char *key_value,
                                        GError **error);

/* A comma-separated list where every option must be a ckptfs option (CLI commands). */
bool ckptfs_options_apply_list(CkptfsOptions *options, const char *list, GError **error);

/* One line per option for --help (caller frees). */
char *ckptfs_options_help(void);

#endif
