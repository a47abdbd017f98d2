/* A checkpoint source: detection, full validation at open, and what views need from it
 * (the catalog, the model config, the files passed through). Sources are read-only: nothing is
 * ever written into the source directory. */
#ifndef CKPTFS_SOURCE_H
#define CKPTFS_SOURCE_H

#include <glib.h>
#include <json-glib/json-glib.h>
#include <stdbool.h>

#include "ckptfs/catalog.h"
#include "ckptfs/layout.h"
#include "ckptfs/options.h"
#include "ckptfs/srcfiles.h"

typedef struct CkptfsSourceFormat CkptfsSourceFormat;
typedef struct {
    char *name;   /* file name inside the source directory */
    uint32_t src; /* index in the source's file set */
    uint64_t size;
} CkptfsSourceFile;

typedef struct CkptfsSource {
    const CkptfsSourceFormat *format; /* the registry row that opened it */
    char *dir;              /* the source directory as given */
    CkptfsSrcFiles *files;  /* every file opened */
    CkptfsCatalog *catalog; /* tensors in source order */
    CkptfsCatalog *model_catalog; /* what the Megatron views read when it differs (a block-FP8
                                     source passed through: its weights dequantised), or NULL */
    GPtrArray *top_files;   /* CkptfsSourceFile*: every top-level regular file, sorted by name */
    GPtrArray *weight_files; /* char*: top files holding the weights (safetensors shards), in
                                source order; re-sharding hf/ replaces them and the index */
    JsonObject *config;      /* config.json, NULL when missing or broken */
    char *config_problem;    /* why config is NULL */
    char *model_problem;     /* why the Megatron views cannot read the weights (a block-FP8
                                source passed through whose scales are broken), or NULL */
    GPtrArray *warnings;     /* char*: things a user should know that do not stop the mount */
    char *found;             /* what the reader found, in a line, or NULL */
    CkptfsLayout saved_layout; /* the split it was saved with (tp1pp1 for Hugging Face): what a
                                  bare "vpp2" or "pp4" view refines */
    CkptfsServeDtype default_dtype; /* what -o dtype=auto serves: AUTO = the stored type; BF16
                                       for a format whose users' tools cast to bf16 (verl FSDP) */
    CkptfsCatalog *adapter;     /* a LoRA run's adapter weights under PEFT's names, or NULL */
    JsonObject *adapter_config; /* PEFT's adapter_config.json for it */
    unsigned converted;   /* tensors served in another element type than stored */
    bool config_changed;  /* config (torch_dtype) no longer says what the config.json file does */
    bool config_dtype_from_weights; /* config was made here: its torch_dtype is the served weights' */
    bool token_ids_unknown; /* config was made here from args that name no tokenizer ids: its null
                               ids say nothing is known, and the views carry none */
} CkptfsSource;

/* One checkpoint format: a row of the source registry (source.c), tried in order. */
struct CkptfsSourceFormat {
    const char *name; /* "megatron-legacy" */
    /* Whether DIR holds this format (names and small files only). */
    bool (*probe)(const char *dir, const CkptfsOptions *options);
    /* Fills SOURCE (dir, files, catalog and lists set up), validating every header. */
    bool (*open)(CkptfsSource *source, const CkptfsOptions *options, GError **error);
    /* What it holds in a few words for inspect: "4 weight files, with index". */
    char *(*describe)(const CkptfsSource *source);
};

/* Detects and opens the checkpoint in PATH, validating every header. Errors name the file, the
 * tensor and the problem. */
CkptfsSource *ckptfs_source_open(const char *path, const CkptfsOptions *options,
                                 GError **error);
void ckptfs_source_free(CkptfsSource *source);

/* The catalog the model rules and the Megatron views read. */
const CkptfsCatalog *ckptfs_source_model_catalog(const CkptfsSource *source);

/* A top-level file by name, or NULL. */
const CkptfsSourceFile *ckptfs_source_top_file(const CkptfsSource *source, const char *name);

#endif
