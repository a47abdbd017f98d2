/* torch.save files from values: the pickle (protocol 2, as torch.save writes it) and the zip
 * container around it, with tensor storages as extents of the plan. */
#ifndef CKPTFS_TORCHSAVE_H
#define CKPTFS_TORCHSAVE_H

#include <glib.h>
#include <stdbool.h>

#include "ckptfs/plan.h"
#include "ckptfs/value.h"

/* The plan of `torch.save(ROOT)` with entries under ARCHIVE_NAME/. Each tensor value gets its
 * own storage, keyed "0", "1", ... in pickle order. CRC fields are 0 unless COMPUTE_CRC, which
 * makes them real CRC-32s computed on first read (for zipfile-based tools). */
CkptfsPlan *ckptfs_torchsave_plan(const CkptfsValue *root, const char *archive_name,
                                  bool compute_crc, GError **error);

/* The same archive appended to B (a file holding several archives, as a torch_dist .distcp
 * does): its internal offsets are relative to where it starts. */
bool ckptfs_torchsave_append(CkptfsPlanBuilder *b, const CkptfsValue *root,
                             const char *archive_name, bool compute_crc, GError **error);

/* The size of the archive ckptfs_torchsave_append would write (0 on error), without touching
 * any tensor's source. */
uint64_t ckptfs_torchsave_size(const CkptfsValue *root, const char *archive_name, GError **error);

/* A plain pickle (protocol 2, `pickle.dump`; no tensors; globals memoized as Python's pickler
 * does) written piece by piece, so that structures too large to hold as one value tree
 * (mcore/'s .metadata of a large MoE has hundreds of thousands of chunks) need not be: whole
 * values, strings, and containers opened and closed around what follows. Objects are built as
 * dataclasses pickle: NEWOBJ of the class with no arguments, then their state, then BUILD. */
typedef struct CkptfsPickleStream CkptfsPickleStream;
CkptfsPickleStream *ckptfs_pickle_stream_new(GError **error);
void ckptfs_pickle_stream_value(CkptfsPickleStream *s, const CkptfsValue *v);
void ckptfs_pickle_stream_str(CkptfsPickleStream *s, const char *str);
void ckptfs_pickle_stream_object_begin(CkptfsPickleStream *s, const char *module, const char *name);
void ckptfs_pickle_stream_object_end(CkptfsPickleStream *s);
void ckptfs_pickle_stream_dict_begin(CkptfsPickleStream *s); /* then key, value, key, value ... */
void ckptfs_pickle_stream_dict_end(CkptfsPickleStream *s);
void ckptfs_pickle_stream_list_begin(CkptfsPickleStream *s);
void ckptfs_pickle_stream_list_end(CkptfsPickleStream *s);
/* The pickle (STOP added), or NULL when a value could not be pickled (the error given to _new
 * is set); frees S. */
GBytes *ckptfs_pickle_stream_finish(CkptfsPickleStream *s);

#endif
