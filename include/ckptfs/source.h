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

typedef enum {
    CKPTFS_SOURCE_HF,       /* config.json + model.safetensors or shards with an index */
    CKPTFS_SOURCE_MEGATRON, /* Megatron-core legacy rank files (mp_rank_XX[_YYY]) */
    CKPTFS_SOURCE_TORCH_DIST, /* Megatron-core torch_dist (.metadata + .distcp) */
} CkptfsSourceKind;

typedef struct {
    char *name;   /* file name inside the source directory */
    uint32_t src; /* index in the source's file set */
    uint64_t size;
} CkptfsSourceFile;

typedef struct {
    CkptfsSourceKind kind;
    char *dir;              /* the source directory as given */
    CkptfsSrcFiles *files;  /* every file opened */
    CkptfsCatalog *catalog; /* tensors in source order */
    GPtrArray *top_files;   /* CkptfsSourceFile*: every top-level regular file, sorted by name */
    GPtrArray *weight_files; /* char*: safetensors files holding the weights, in source order */
    bool has_index;          /* model.safetensors.index.json present */
    JsonObject *config;      /* config.json, NULL when missing or broken */
    char *config_problem;    /* why config is NULL */
    GPtrArray *warnings;     /* char*: things a user should know that do not stop the mount */
    char *found;             /* what the reader found, in a line (Megatron sources), or NULL */
    CkptfsLayout megatron_layout; /* MEGATRON: the split of the rank files */
} CkptfsSource;

/* Detects and opens the checkpoint in PATH, validating every header. Errors name the file, the
 * tensor and the problem. */
CkptfsSource *ckptfs_source_open(const char *path, const CkptfsOptions *options,
                                 GError **error);
void ckptfs_source_free(CkptfsSource *source);

const char *ckptfs_source_kind_name(CkptfsSourceKind kind);

/* A top-level file by name, or NULL. */
const CkptfsSourceFile *ckptfs_source_top_file(const CkptfsSource *source, const char *name);

#endif
