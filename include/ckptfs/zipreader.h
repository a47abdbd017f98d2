/* Reading torch.save zip archives: the central directory (ZIP64 included) and where each
 * record's bytes are in the file. STORED entries only; alignment and extra fields as any
 * torch version writes them. Untrusted input: every offset is checked against the file, and
 * each local header against the directory (name, method, whole extra fields, the data
 * descriptor where the data ends), so a damaged header is refused rather than read. */
#ifndef CKPTFS_ZIPREADER_H
#define CKPTFS_ZIPREADER_H

#include <glib.h>
#include <stdint.h>

#include "ckptfs/srcfiles.h"

typedef struct {
    char *name;           /* below the archive's top folder: "data.pkl", "data/0" */
    uint64_t data_offset; /* of the record's bytes in the file */
    uint64_t size;
} CkptfsZipEntry;

typedef struct CkptfsZip CkptfsZip;

/* Reads the directory of source file SRC. Errors name the file and the entry. */
CkptfsZip *ckptfs_zip_open(const CkptfsSrcFiles *files, unsigned src, GError **error);
/* An archive stored inside a file at [BASE, BASE + SIZE) (a torch_dist .distcp holds one per
 * chunk); its offsets are relative to BASE, entries' data_offset are in the file. WHAT names
 * it in errors. */
CkptfsZip *ckptfs_zip_open_range(const CkptfsSrcFiles *files, unsigned src, uint64_t base,
                                 uint64_t size, const char *what, GError **error);
void ckptfs_zip_free(CkptfsZip *zip);

const CkptfsZipEntry *ckptfs_zip_find(const CkptfsZip *zip, const char *name);
unsigned ckptfs_zip_count(const CkptfsZip *zip);
const CkptfsZipEntry *ckptfs_zip_at(const CkptfsZip *zip, unsigned index);
/* The top folder all entries share ("archive", "model_optim_rng", ...). */
const char *ckptfs_zip_top_folder(const CkptfsZip *zip);

/* Reads a whole (small) record, e.g. data.pkl, from the file the archive was opened from
 * (FILES must be the same set); refuses records above MAX bytes. */
GBytes *ckptfs_zip_read(const CkptfsZip *zip, const CkptfsSrcFiles *files, const char *name,
                        uint64_t max, GError **error);

#endif
