/* Megatron parallel layouts: tp{T}pp{P}[vpp{V}][ep{E}][etp{X}] names, validation against a
 * model, which layers each pipeline stage and virtual chunk holds, and which ranks write a
 * legacy checkpoint's files. */
#ifndef CKPTFS_LAYOUT_H
#define CKPTFS_LAYOUT_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/model.h"

typedef struct {
    unsigned tp, pp, vpp;        /* vpp 1 = no virtual pipeline */
    unsigned pp_first, pp_last;  /* layers on the first / last stage; 0 = even split */
    unsigned ep, etp;            /* expert parallel and expert tensor parallel sizes; 0 is read
                                    as 1 and as tp (Megatron's defaults) */
} CkptfsLayout;

/* Parses a view name. Parts may be left out: "tp2" = tp2pp1 (ep 1), "vpp2" = BASE's tp/pp/ep
 * with vpp 2, "pp4" = BASE's tp and ep, "ep2" = BASE's tp/pp with ep 2. Order is tp, pp, vpp,
 * ep, etp. pp_first/pp_last come from BASE (the caller drops them for pp 1). Returns false for
 * names that are not layouts. */
bool ckptfs_layout_parse(const char *name, const CkptfsLayout *base, CkptfsLayout *out);

/* Canonical name: tp{T}pp{P}, vpp{V} when V > 1, ep{E} when E > 1, etp{X} when X != T. */
char *ckptfs_layout_name(const CkptfsLayout *layout);

/* Expert parallel and expert tensor parallel sizes with their defaults applied. */
unsigned ckptfs_layout_ep(const CkptfsLayout *layout);
unsigned ckptfs_layout_etp(const CkptfsLayout *layout);

/* One legacy rank file of a pipeline stage: the dense TP rank and EP rank that name it
 * (mp_rank_TT[_PPP][_EEE]) and the expert TP rank whose share of the experts it holds. */
typedef struct {
    unsigned tp, ep, etp;
} CkptfsRankFile;
/* The files one pipeline stage of LAYOUT writes, in rank order: Megatron's writers are the
 * ranks whose dense or expert data-parallel rank is 0, over a world of lcm(tp, etp x ep) ranks
 * per stage (tp-fastest rank order for both grids); one file per (TP rank, EP rank). */
GArray *ckptfs_layout_rank_files(const CkptfsLayout *layout);
/* The directory name of a rank file: mp_rank_TT, _PPP when pp > 1, _EEE when ep > 1. */
char *ckptfs_rank_file_dir(const CkptfsLayout *layout, unsigned pp_rank, const CkptfsRankFile *file);

/* Whether MODEL can be laid out so; the error says why not (in one line). */
bool ckptfs_layout_validate(const CkptfsLayout *layout, const CkptfsModel *model, GError **error);
/* Whether Megatron can load LAYOUT's rank files: every rank of a world of lcm(tp, etp x ep)
 * ranks per stage finds the file named by its TP and EP ranks, holding its expert TP shard.
 * Not so where neither divides the other (tp4 etp3, tp2 ep3 etp1): Megatron writes such files
 * (on expert data-parallel rank 0) but cannot load them, so a view refuses them while a source
 * of them is read. */
bool ckptfs_layout_loadable(const CkptfsLayout *layout, GError **error);

/* Global layers [*first, *first + *count) held by virtual chunk V of pipeline stage P. */
void ckptfs_layout_chunk_layers(const CkptfsLayout *layout, const CkptfsModel *model, unsigned p,
                                unsigned v, uint64_t *first, uint64_t *count);

/* Megatron's padded vocabulary: vocab rounded up to a multiple of divisible_by * tp. */
uint64_t ckptfs_padded_vocab(uint64_t vocab, unsigned divisible_by, unsigned tp);

#endif
