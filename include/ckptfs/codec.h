/* The codecs of packed containers (docs/compression.md) as one table: what the writer (core/pack),
 * the reader (core/io/container.c) and `ckptfs inspect` know of a codec is its row here, so a new
 * codec is one new row. */
#ifndef CKPTFS_CODEC_H
#define CKPTFS_CODEC_H

#include <glib.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The codec byte of a frame entry and of the trailer: part of the on-disk format. */
typedef enum {
    CKPTFS_CODEC_STORED = 0,
    CKPTFS_CODEC_ZSTD = 1,
    CKPTFS_CODEC_LZ4 = 2,
    CKPTFS_CODEC_COUNT /* rows of the table */
} CkptfsCodec;

typedef struct {
    CkptfsCodec id;
    const char *name;
    /* The most bytes LEN original bytes may take encoded. */
    uint64_t (*bound)(uint32_t len);
    /* Decodes SRC_LEN bytes into at most DST_LEN bytes at DST: the bytes produced, or false with
     * ERROR saying what is wrong with the data. CTX: a context of decoder_new, or NULL. */
    bool (*decode)(void *ctx, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len, size_t *got,
                   GError **error);
    /* Encodes LEN bytes at SRC into at most CAP bytes at DST at LEVEL: the encoded length, 0 when
     * they do not fit. CTX: a context of encoder_new(LEVEL). NULL for a codec pack does not write. */
    size_t (*encode)(void *ctx, const uint8_t *src, size_t len, uint8_t *dst, size_t cap, int level);
    /* Levels pack accepts (both 0 when it writes none), its default, and what the ends mean. */
    int level_min, level_max, level_default;
    const char *level_min_note, *level_max_note;
    /* Per-thread working state, reused from a pool (NULL new: the codec needs none). new returns
     * NULL when memory runs out. */
    void *(*encoder_new)(int level);
    void (*encoder_free)(void *ctx);
    void *(*decoder_new)(void);
    void (*decoder_free)(void *ctx);
} CkptfsCodecInfo;

/* The row of codec ID, or NULL for an unknown one. */
const CkptfsCodecInfo *ckptfs_codec(unsigned id);
/* The row named NAME among the codecs pack writes, or NULL. */
const CkptfsCodecInfo *ckptfs_codec_by_name(const char *name);
/* Codec ID's name, or "codec N" (in BUF, of BUF_LEN bytes) for an unknown one. */
const char *ckptfs_codec_name(unsigned id, char *buf, size_t buf_len);
/* The names of the codecs pack writes, as "zstd or lz4" (free with g_free). */
char *ckptfs_codec_written_names(void);
/* The largest level any codec accepts. */
int ckptfs_codec_level_max(void);
/* The most bytes LEN original bytes may take stored, whatever the codec. */
uint64_t ckptfs_codec_bound_any(uint32_t len);

#endif
