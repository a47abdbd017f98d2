/* Megatron parallel layouts: tp{T}pp{P}[vpp{V}] names, validation against a model, and which
 * layers each pipeline stage and virtual chunk holds. */
#ifndef CKPTFS_LAYOUT_H
#define CKPTFS_LAYOUT_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/model.h"

typedef struct {
    unsigned tp, pp, vpp;        /* vpp 1 = no virtual pipeline */
    unsigned pp_first, pp_last;  /* layers on the first / last stage; 0 = even split */
} CkptfsLayout;

/* Parses a view name. Parts may be left out: "tp2" = tp2pp1, "vpp2" = BASE's tp/pp with vpp 2,
 * "pp4" = BASE's tp. Order is tp, pp, vpp. pp_first/pp_last come from BASE (the caller drops
 * them for pp 1). Returns false for names that are not layouts. */
bool ckptfs_layout_parse(const char *name, const CkptfsLayout *base, CkptfsLayout *out);

/* Canonical name: tp{T}pp{P} plus vpp{V} when V > 1. */
char *ckptfs_layout_name(const CkptfsLayout *layout);

/* Whether MODEL can be laid out so; the error says why not (in one line). */
bool ckptfs_layout_validate(const CkptfsLayout *layout, const CkptfsModel *model, GError **error);

/* Global layers [*first, *first + *count) held by virtual chunk V of pipeline stage P. */
void ckptfs_layout_chunk_layers(const CkptfsLayout *layout, const CkptfsModel *model, unsigned p,
                                unsigned v, uint64_t *first, uint64_t *count);

/* Megatron's padded vocabulary: vocab rounded up to a multiple of divisible_by * tp. */
uint64_t ckptfs_padded_vocab(uint64_t vocab, unsigned divisible_by, unsigned tp);

#endif
