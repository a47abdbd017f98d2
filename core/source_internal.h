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

/* --- shared by the Megatron-core sources (megatron_common.c) --- */

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
