/* Between the generic source code (detection, top-level files) and each format's reader. */
#ifndef CKPTFS_SOURCE_INTERNAL_H
#define CKPTFS_SOURCE_INTERNAL_H

#include "ckptfs/pickle.h"
#include "ckptfs/source.h"

/* Adds every top-level regular file of DIR_PATH (symlinks followed; sub-directories left out)
 * to SOURCE's top files; a name already present keeps its first file. */
bool ckptfs_source_add_top_files(CkptfsSource *source, const char *dir_path, GError **error);
/* Adds one file under NAME to SOURCE's top files. */
bool ckptfs_source_add_file(CkptfsSource *source, const char *name, const char *path,
                            GError **error);

/* Fills SOURCE (whose dir, files and top_files are set) from a Hugging Face checkpoint. */
bool ckptfs_source_open_hf(CkptfsSource *source, GError **error);

/* Whether DIR looks like a Megatron legacy checkpoint (tracker file or mp_rank_* dirs). */
bool ckptfs_source_is_megatron(const char *dir);
/* Fills SOURCE from a Megatron-core legacy checkpoint (per-rank torch.save files). */
bool ckptfs_source_open_megatron(CkptfsSource *source, const CkptfsOptions *options,
                                 GError **error);

/* Whether DIR is (or its tracker names) a torch_dist checkpoint directory (metadata.json). */
bool ckptfs_source_is_torch_dist(const char *dir, const CkptfsOptions *options);
/* Fills SOURCE from a torch_dist checkpoint (.metadata + .distcp archives). */
bool ckptfs_source_open_torch_dist(CkptfsSource *source, const CkptfsOptions *options,
                                   GError **error);

/* --- shared by the Megatron-core sources (megatron_common.c) --- */

/* Pieces collected for each HF tensor of a model, by name, before they become the catalog. */
typedef struct {
    GHashTable *pieces; /* name -> GArray of CkptfsPiece */
    GPtrArray *order;   /* names in the order first wanted */
    GHashTable *shapes; /* name -> uint64_t[3] (ndim, d0, d1) */
} CkptfsPieceSet;

CkptfsPieceSet *ckptfs_piece_set_new(void);
void ckptfs_piece_set_free(CkptfsPieceSet *set);
/* Declares HF tensor NAME (once; later calls are no-ops) with its shape. */
void ckptfs_piece_set_want(CkptfsPieceSet *set, const char *name, unsigned ndim, uint64_t d0,
                           uint64_t d1);
/* Adds a piece to a wanted tensor. */
void ckptfs_piece_set_add(CkptfsPieceSet *set, const char *name, const CkptfsPiece *piece);
/* Adds every wanted tensor to CATALOG, checking its pieces tile it exactly. */
bool ckptfs_piece_set_to_catalog(const CkptfsPieceSet *set, CkptfsCatalog *catalog,
                                 CkptfsDtype dtype, GError **error);

/* The iteration directory under DIR: the one WANTED (-o iteration) or the tracker names
 * (release, or iter_%07d); DIR itself when it has no tracker and nothing is wanted. */
char *ckptfs_megatron_iteration_dir(const char *dir, const char *wanted, GError **error);

typedef struct {
    uint64_t layers, hidden, heads, groups, head_dim, ffn, vocab, padded_vocab;
    bool tied, qkv_bias, qk_norm;
    CkptfsLayout layout; /* the split the checkpoint was saved with */
} CkptfsMegatronSizes;

/* The model's sizes from ARGS (an argparse.Namespace's state; PATH names it in errors). */
bool ckptfs_megatron_sizes_from_args(const CkptfsPy *args, const char *path,
                                     CkptfsMegatronSizes *sizes, GError **error);
/* The same from a given config.json (checkpoints saved without args; WHAT names them). The
 * padded vocabulary and the layout are left 0. */
bool ckptfs_megatron_sizes_from_config(JsonObject *config, const char *what,
                                       CkptfsMegatronSizes *sizes, GError **error);
/* Sets SOURCE's config.json to what Hugging Face would write for SIZES (+ eps, rope from ARGS;
 * the architecture from HF_ARCH when given). */
void ckptfs_megatron_synthesize_config(CkptfsSource *source, const CkptfsMegatronSizes *sizes,
                                       const CkptfsPy *args, const char *hf_arch);
/* -o hf_config / the config.json of -o hf_extra as SOURCE's config.json, when given. */
bool ckptfs_source_use_given_config(CkptfsSource *source, const CkptfsOptions *options,
                                    GError **error);
/* Files hf/ passes through from -o hf_extra (tokenizer and the like); weights are not taken. */
bool ckptfs_source_add_extra_files(CkptfsSource *source, const char *dir, GError **error);

#endif
