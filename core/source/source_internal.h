/* Between the generic source code (detection, top-level files) and each format's reader. */
#ifndef CKPTFS_SOURCE_INTERNAL_H
#define CKPTFS_SOURCE_INTERNAL_H

#include "ckptfs/model.h"
#include "ckptfs/pickle.h"
#include "ckptfs/source.h"

/* Adds every top-level regular file of DIR_PATH (symlinks followed; sub-directories left out)
 * to SOURCE's top files; a name already present keeps its first file. */
bool ckptfs_source_add_top_files(CkptfsSource *source, const char *dir_path, GError **error);
/* Adds one file under NAME to SOURCE's top files. */
bool ckptfs_source_add_file(CkptfsSource *source, const char *name, const char *path,
                            GError **error);

/* The architecture SOURCE's config.json names (its architectures, else its model_type); NULL
 * without a config or a known architecture. */
const CkptfsArchitecture *ckptfs_source_architecture(const CkptfsSource *source);

/* The formats of the registry, each in its own file. */
extern const CkptfsSourceFormat ckptfs_format_hf;         /* source_hf.c */
extern const CkptfsSourceFormat ckptfs_format_megatron;   /* source_megatron.c */
extern const CkptfsSourceFormat ckptfs_format_torch_dist; /* source_torchdist.c */
extern const CkptfsSourceFormat ckptfs_format_verl_fsdp;  /* source_fsdp.c */
extern const CkptfsSourceFormat ckptfs_format_verl_megatron; /* source_verl_megatron.c */
extern const CkptfsSourceFormat ckptfs_format_dcp_hf;     /* source_dcp_hf.c */
extern const CkptfsSourceFormat ckptfs_format_titan;      /* source_dcp_hf.c, names from titan.c */
extern const CkptfsSourceFormat ckptfs_format_deepspeed;  /* source_deepspeed.c */
extern const CkptfsSourceFormat ckptfs_format_nemo2;      /* source_nemo2.c */

/* config.json (or -o hf_config), the tokenizer and the other top-level files of a trainer's
 * checkpoint directory DIR that hf/ passes through (weights, trainer state and DeepSpeed's tag
 * file left out). Without a config, hf/ still serves the weights and the model views say what
 * they miss. (source_dcp_hf.c) */
bool ckptfs_source_read_checkpoint_dir(CkptfsSource *source, const CkptfsOptions *options, const char *dir,
                                       GError **error);

/* --- shared by the Megatron-core sources (megatron_common.c) --- */

/* Pieces collected for each HF tensor of a model, by name, before they become the catalog. */
typedef struct {
    GHashTable *pieces; /* name -> GArray of CkptfsPiece */
    GPtrArray *order;   /* names in the order first wanted */
    GHashTable *shapes; /* name -> uint64_t[CKPTFS_PIECE_SHAPE_LEN] (ndim, its dims, zeros after them;
                           its dtype or CKPTFS_DTYPE_INVALID last) */
} CkptfsPieceSet;
#define CKPTFS_PIECE_SHAPE_LEN 7

CkptfsPieceSet *ckptfs_piece_set_new(void);
void ckptfs_piece_set_free(CkptfsPieceSet *set);
/* Declares HF tensor NAME (once; later calls are no-ops) with its shape. */
void ckptfs_piece_set_want(CkptfsPieceSet *set, const char *name, unsigned ndim, uint64_t d0,
                           uint64_t d1);
/* Declares HF tensor NAME (once) with NDIM (at most 5) dims DIMS: a patch kernel's 5. */
void ckptfs_piece_set_want_shape(CkptfsPieceSet *set, const char *name, unsigned ndim, const uint64_t *dims);
/* The elements of wanted tensor NAME. */
uint64_t ckptfs_piece_set_numel(const CkptfsPieceSet *set, const char *name);
/* Adds a piece to a wanted tensor. */
void ckptfs_piece_set_add(CkptfsPieceSet *set, const char *name, const CkptfsPiece *piece);
/* A DeepSeek MTP layer's copies of the embedding and output layer, which the Hugging Face
 * checkpoint holds as model.layers.{L+j}.embed_tokens / shared_head.head and Megatron shares
 * with the model: the same bytes under those names. */
bool ckptfs_megatron_add_mtp_copies(CkptfsCatalog *catalog, const CkptfsModel *m, GError **error);
/* Zero-centred norms of tensors Hugging Face stores plain (CKPTFS_RECIPE_LESS_ONE, of KEYS) are
 * read back plus one. */
bool ckptfs_megatron_unshift_norms(CkptfsCatalog *catalog, const CkptfsModel *m, const GPtrArray *keys,
                                   GError **error);

/* Gives wanted tensor NAME its own element type (an fp32 expert bias among bf16 weights). */
void ckptfs_piece_set_dtype(CkptfsPieceSet *set, const char *name, CkptfsDtype dtype);
/* Adds every wanted tensor to CATALOG (of DTYPE unless given its own), checking its pieces tile
 * it exactly. */
bool ckptfs_piece_set_to_catalog(const CkptfsPieceSet *set, CkptfsCatalog *catalog,
                                 CkptfsDtype dtype, GError **error);

/* The iteration directory under DIR: the one WANTED (-o iteration) or the tracker names
 * (release, or iter_%07d); DIR itself when it has no tracker and nothing is wanted. */
char *ckptfs_megatron_iteration_dir(const char *dir, const char *wanted, GError **error);

/* What a Megatron checkpoint says of its model: the one model description (sizes, features,
 * architecture), the vocabulary as padded, and the split it was saved with. */
typedef struct {
    CkptfsModel model;
    uint64_t padded_vocab;
    CkptfsLayout layout;
} CkptfsMegatronModel;

/* The model from ARGS (an argparse.Namespace's state; PATH names it in errors). The
 * architecture is OPTIONS' hf_arch when given, else the one args name (hf_architecture, as
 * ckptfs writes it), else GIVEN_CONFIG's model_type (a config.json given with the checkpoint;
 * may be NULL), else the first whose features the args have; named as Megatron-Bridge names it
 * with OPTIONS' megatron_names=bridge. */
bool ckptfs_megatron_model_from_args(const CkptfsPy *args, const char *path, const CkptfsOptions *options,
                                     JsonObject *given_config, CkptfsMegatronModel *out,
                                     GError **error);
/* The same from a given config.json (checkpoints saved without args; WHAT names them). The
 * padded vocabulary and the layout are left 0. */
bool ckptfs_megatron_model_from_config(JsonObject *config, const char *what,
                                       CkptfsMegatronModel *out, GError **error);
/* How the rank files of a legacy directory are named and pickled: Megatron's
 * (mp_rank_TT[_PPP]/model_optim_rng.pt, a dict with args and model or model0..), or verl's
 * 2025 saves (mp_rank_TT[_PPP]/model.pt, a list of the virtual chunks' state dicts, no args). */
typedef struct {
    const char *rank_file; /* the file in each mp_rank_* directory */
    bool chunk_list;       /* its pickle's root is a list of per-chunk state dicts */
} CkptfsRankFiles;
/* Opens the rank directories of DIR (an iteration directory; verl's model/) into SOURCE. */
bool ckptfs_megatron_open_ranks(CkptfsSource *source, const CkptfsOptions *options, const char *dir,
                                const CkptfsRankFiles *files, GError **error);
/* A torch_dist checkpoint saved inside another trainer's checkpoint (NeMo 2's weights/): the
 * model's keys under KEY_PREFIX in .metadata, its args (a dict under Megatron's argument names)
 * given when common.pt holds none; ARGS_FROM names them in errors. */
typedef struct {
    const char *key_prefix;
    const CkptfsPy *args;
    const char *args_from;
} CkptfsTorchDistWrap;
/* Opens the torch_dist checkpoint in DIR (metadata.json, .metadata, ...) into SOURCE; WRAP may
 * be NULL (Megatron's own save). (source_torchdist.c) */
bool ckptfs_torch_dist_open_dir(CkptfsSource *source, const CkptfsOptions *options, const char *dir,
                                const CkptfsTorchDistWrap *wrap, GError **error);
/* inspect's line for both Megatron formats: files opened and the split saved. */
char *ckptfs_megatron_describe(const CkptfsSource *source);
/* Sets SOURCE's config.json to what Hugging Face would write for MODEL. */
void ckptfs_megatron_synthesize_config(CkptfsSource *source, const CkptfsModel *model);
/* Declares every Hugging Face tensor of MODEL (KEYS: its mcore keys) in SET, in the order the
 * keys use them: the catalog of a Megatron source lists them so. */
void ckptfs_piece_set_want_model(CkptfsPieceSet *set, const CkptfsModel *model, const GPtrArray *keys);
/* -o hf_config / the config.json of -o hf_extra as SOURCE's config.json, when given. */
bool ckptfs_source_use_given_config(CkptfsSource *source, const CkptfsOptions *options,
                                    GError **error);
/* Files hf/ passes through from -o hf_extra (tokenizer and the like); weights are not taken. */
bool ckptfs_source_add_extra_files(CkptfsSource *source, const char *dir, GError **error);

#endif
