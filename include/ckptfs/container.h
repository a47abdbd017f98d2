/* The compressed container of `ckptfs pack` (docs/compression.md): one original file as
 * independent frames of at most 64 MiB, each stored as it is or compressed with zstd or lz4,
 * tensor bytes split into byte planes first; an index of frames and a trailer at the end. The
 * writer (core/pack) and the reader (core/io/container.c, used by the source-file set, so every
 * source format reads a packed checkpoint unchanged) share these definitions. */
#ifndef CKPTFS_CONTAINER_H
#define CKPTFS_CONTAINER_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckptfs/codec.h"

#define CKPTFS_CONTAINER_MAGIC "CKPTFSZ\x01" /* 8 bytes, at the start and the very end */
#define CKPTFS_CONTAINER_MAGIC_LEN 8
#define CKPTFS_CONTAINER_HEADER_SIZE 16
#define CKPTFS_CONTAINER_ENTRY_SIZE 32
#define CKPTFS_CONTAINER_TRAILER_SIZE 48
#define CKPTFS_CONTAINER_MAX_FRAME (64u << 20)

/* One index entry, decoded. */
typedef struct {
    uint64_t uoffset;  /* in the original file */
    uint32_t ulength;  /* original bytes */
    uint32_t clength;  /* stored bytes */
    uint64_t coffset;  /* in the container */
    uint8_t codec;     /* CkptfsCodec */
    uint8_t planes;    /* 1, 2, 4 or 8 */
    uint32_t checksum; /* low 32 bits of XXH3-64 of the original bytes */
} CkptfsFrameEntry;

/* The trailer, decoded. */
typedef struct {
    uint64_t size;         /* of the original file */
    uint64_t nframes;
    uint64_t index_offset;
    uint32_t frame_size;
    uint32_t index_checksum;
    uint8_t codec_used;
} CkptfsContainerTrailer;

/* Little-endian (de)serialisation of index entries and the trailer. */
void ckptfs_frame_entry_encode(const CkptfsFrameEntry *e, uint8_t out[CKPTFS_CONTAINER_ENTRY_SIZE]);
void ckptfs_frame_entry_decode(const uint8_t in[CKPTFS_CONTAINER_ENTRY_SIZE], CkptfsFrameEntry *e);
void ckptfs_container_trailer_encode(const CkptfsContainerTrailer *t, uint8_t out[CKPTFS_CONTAINER_TRAILER_SIZE]);
/* False when the trailer's magic or reserved bytes are wrong. */
bool ckptfs_container_trailer_decode(const uint8_t in[CKPTFS_CONTAINER_TRAILER_SIZE], CkptfsContainerTrailer *t);

/* The frame checksum: low 32 bits of XXH3-64 of LEN bytes. */
uint32_t ckptfs_frame_checksum(const void *data, size_t len);

/* Byte planes: SHUFFLE writes plane p (byte p of each of the LEN / PLANES elements of SRC) one
 * after the other into DST; UNSHUFFLE undoes it. PLANES 1 copies. */
void ckptfs_planes_shuffle(uint8_t *dst, const uint8_t *src, size_t len, unsigned planes);
void ckptfs_planes_unshuffle(uint8_t *dst, const uint8_t *src, size_t len, unsigned planes);

/* Decodes a stored frame (CLENGTH bytes at SRC) into exactly E->ulength bytes at DST (SCRATCH:
 * ulength bytes of working space, for planes > 1) and checks its checksum, with DECODER, a
 * context of the frame's codec to reuse (its decoder_new's), or NULL (one made for the call).
 * Errors say what is wrong with the frame (the caller names file and frame). */
bool ckptfs_frame_decode(const CkptfsFrameEntry *e, const uint8_t *src, uint8_t *dst, uint8_t *scratch,
                         void *decoder, GError **error);

/* --- reading --- */

/* Whether the LEN bytes at the start of a file (at least CKPTFS_CONTAINER_MAGIC_LEN) are a
 * container's. */
bool ckptfs_container_magic(const uint8_t *start, size_t len);

typedef struct CkptfsContainer CkptfsContainer;

/* Reads and checks the header, trailer and index of the container in FD (DISK_SIZE bytes;
 * PATH for messages). Errors name the file and what is inconsistent. */
CkptfsContainer *ckptfs_container_open(int fd, uint64_t disk_size, const char *path, GError **error);
void ckptfs_container_free(CkptfsContainer *c);
/* The original file's size, the number of frames, frame I, the frame holding OFFSET (< size). */
uint64_t ckptfs_container_size(const CkptfsContainer *c);
uint64_t ckptfs_container_frames(const CkptfsContainer *c);
const CkptfsFrameEntry *ckptfs_container_frame(const CkptfsContainer *c, uint64_t i);
/* The original length of its largest frame (0 for an empty file). */
uint32_t ckptfs_container_largest_frame(const CkptfsContainer *c);
uint64_t ckptfs_container_frame_at(const CkptfsContainer *c, uint64_t offset);
/* What the container holds, for inspect: stored bytes and original bytes per planes class
 * (index 0: planes 1, 1: 2, 2: 4, 3: 8), and the codec pack was given. */
typedef struct {
    uint64_t original[4], stored[4];
    uint64_t frames;
    uint8_t codec;
} CkptfsContainerStats;
void ckptfs_container_stats(const CkptfsContainer *c, CkptfsContainerStats *out);

/* Decompressed frames shared by readers: at most BUDGET bytes kept (more while every frame is
 * in use), least recently used dropped first. Thread-safe. */
typedef struct CkptfsFrameCache CkptfsFrameCache;
CkptfsFrameCache *ckptfs_frame_cache_new(uint64_t budget);
void ckptfs_frame_cache_free(CkptfsFrameCache *cache);
void ckptfs_frame_cache_set_budget(CkptfsFrameCache *cache, uint64_t budget);
/* The frame of KEY, held until ckptfs_frame_cache_release(*HOLD); when another thread is decoding
 * it, after waiting for that. Or NULL: KEY (LEN bytes) is the caller's to decode (one decode per
 * frame however many threads want it; a frame only queued for a decoder thread is taken over),
 * and it must end with put or abandon. */
const uint8_t *ckptfs_frame_cache_get_or_claim(CkptfsFrameCache *cache, uint64_t key, size_t len, gpointer *hold);
/* Claims KEY (LEN bytes) for a decoder thread, without waiting: false when it is cached or
 * claimed already, or when frames claimed this way and frames decoded ahead but not read yet
 * would take over half the budget. */
bool ckptfs_frame_cache_claim(CkptfsFrameCache *cache, uint64_t key, size_t len);
/* A decoder thread starting on KEY: true when it is still its to decode (false: a reader took it
 * over, or it is done). */
bool ckptfs_frame_cache_start(CkptfsFrameCache *cache, uint64_t key);
/* A claimed frame that could not be decoded: whoever waits for it decodes it (and reports why not). */
void ckptfs_frame_cache_abandon(CkptfsFrameCache *cache, uint64_t key);
/* Adds DATA (LEN bytes of a buffer of CAP, taken over) as KEY, or when another thread added KEY
 * meanwhile recycles it and returns that one; held as by get_or_claim, or not held when HOLD is NULL (a
 * frame decoded ahead, counted as such until its first reader). Ends a claim of KEY. */
const uint8_t *ckptfs_frame_cache_put(CkptfsFrameCache *cache, uint64_t key, uint8_t *data, size_t len,
                                      size_t cap, gpointer *hold);
/* A buffer of at least LEN bytes (*CAP: its size), reused when the cache has one to spare (frames
 * dropped, work buffers given back), else new (NULL when memory runs out); give it back with
 * ckptfs_frame_cache_recycle or to the cache with put. */
uint8_t *ckptfs_frame_cache_buffer(CkptfsFrameCache *cache, size_t len, size_t *cap);
void ckptfs_frame_cache_recycle(CkptfsFrameCache *cache, uint8_t *data, size_t cap);
/* A decoder context of CODEC to decode with (NULL: the codec needs none), reused; hand it back
 * when done. */
void *ckptfs_frame_cache_decoder(CkptfsFrameCache *cache, const CkptfsCodecInfo *codec);
void ckptfs_frame_cache_decoder_done(CkptfsFrameCache *cache, const CkptfsCodecInfo *codec, void *ctx);
void ckptfs_frame_cache_release(CkptfsFrameCache *cache, gpointer hold);
/* Frames handed over with put so far (decoded by readers or ahead of them). */
uint64_t ckptfs_frame_cache_decoded(CkptfsFrameCache *cache);

#endif
