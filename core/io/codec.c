/* The codec table of packed containers (include/ckptfs/codec.h). */
#include "ckptfs/codec.h"

#include <limits.h>
#include <lz4.h>
#include <lz4hc.h>
#include <stdio.h>
#include <string.h>
#include <zstd.h>

#include "ckptfs/error.h"

/* --- stored: the original bytes --- */

static uint64_t stored_bound(uint32_t len)
{
    return len;
}

static bool stored_decode(void *ctx, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len, size_t *got,
                          GError **error)
{
    if (src_len != dst_len) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "stored frame of %zu bytes holds %zu", dst_len, src_len);
        return false;
    }
    memcpy(dst, src, src_len);
    *got = src_len;
    return true;
}

/* --- zstd --- */

/* On byte planes of trained weights level 1 is smaller and twice as fast as 3. */
#define ZSTD_LEVEL_DEFAULT 1
#define ZSTD_LEVEL_MAX 19

static uint64_t zstd_bound(uint32_t len)
{
    return ZSTD_compressBound(len);
}

static bool zstd_decode(void *ctx, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len, size_t *got,
                        GError **error)
{
    size_t r = ctx ? ZSTD_decompressDCtx(ctx, dst, dst_len, src, src_len) : ZSTD_decompress(dst, dst_len, src, src_len);
    if (ZSTD_isError(r)) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "zstd: %s", ZSTD_getErrorName(r));
        return false;
    }
    *got = r;
    return true;
}

static size_t zstd_encode(void *ctx, const uint8_t *src, size_t len, uint8_t *dst, size_t cap, int level)
{
    size_t r = ZSTD_compressCCtx(ctx, dst, cap, src, len, level);
    return ZSTD_isError(r) ? 0 : r;
}

static void *zstd_encoder_new(int level)
{
    return ZSTD_createCCtx();
}

static void zstd_encoder_free(void *ctx)
{
    ZSTD_freeCCtx(ctx);
}

static void *zstd_decoder_new(void)
{
    return ZSTD_createDCtx();
}

static void zstd_decoder_free(void *ctx)
{
    ZSTD_freeDCtx(ctx);
}

/* --- lz4: level 1 the fast compressor, above it lz4hc --- */

static uint64_t lz4_bound(uint32_t len)
{
    return (uint64_t)LZ4_compressBound((int)MIN(len, (uint32_t)LZ4_MAX_INPUT_SIZE));
}

static bool lz4_decode(void *ctx, const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len, size_t *got,
                       GError **error)
{
    int r = src_len > INT_MAX || dst_len > INT_MAX
                ? -1
                : LZ4_decompress_safe((const char *)src, (char *)dst, (int)src_len, (int)dst_len);
    if (r < 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "lz4: corrupt data");
        return false;
    }
    *got = (size_t)r;
    return true;
}

static size_t lz4_encode(void *ctx, const uint8_t *src, size_t len, uint8_t *dst, size_t cap, int level)
{
    if (len > LZ4_MAX_INPUT_SIZE)
        return 0;
    int r = level <= 1 ? LZ4_compress_fast_extState(ctx, (const char *)src, (char *)dst, (int)len, (int)MIN(cap, INT_MAX), 1)
                       : LZ4_compress_HC_extStateHC(ctx, (const char *)src, (char *)dst, (int)len,
                                                    (int)MIN(cap, INT_MAX), level);
    return r > 0 ? (size_t)r : 0;
}

static void *lz4_encoder_new(int level)
{
    return g_try_malloc((gsize)(level <= 1 ? LZ4_sizeofState() : LZ4_sizeofStateHC()));
}

/* --- the table: row I is codec I --- */

static const CkptfsCodecInfo codecs[] = {
    {.id = CKPTFS_CODEC_STORED, .name = "stored", .bound = stored_bound, .decode = stored_decode},
    {.id = CKPTFS_CODEC_ZSTD,
     .name = "zstd",
     .bound = zstd_bound,
     .decode = zstd_decode,
     .encode = zstd_encode,
     .level_min = 1,
     .level_max = ZSTD_LEVEL_MAX,
     .level_default = ZSTD_LEVEL_DEFAULT,
     .level_min_note = "",
     .level_max_note = "",
     .encoder_new = zstd_encoder_new,
     .encoder_free = zstd_encoder_free,
     .decoder_new = zstd_decoder_new,
     .decoder_free = zstd_decoder_free},
    {.id = CKPTFS_CODEC_LZ4,
     .name = "lz4",
     .bound = lz4_bound,
     .decode = lz4_decode,
     .encode = lz4_encode,
     .level_min = 1,
     .level_max = LZ4HC_CLEVEL_MAX,
     .level_default = 1,
     .level_min_note = " (fast)",
     .level_max_note = " (lz4hc)",
     .encoder_new = lz4_encoder_new,
     .encoder_free = g_free},
};

G_STATIC_ASSERT(G_N_ELEMENTS(codecs) == CKPTFS_CODEC_COUNT);

const CkptfsCodecInfo *ckptfs_codec(unsigned id)
{
    return id < G_N_ELEMENTS(codecs) ? &codecs[id] : NULL;
}

const CkptfsCodecInfo *ckptfs_codec_by_name(const char *name)
{
    for (size_t i = 0; i < G_N_ELEMENTS(codecs); i++)
        if (codecs[i].encode != NULL && strcmp(codecs[i].name, name) == 0)
            return &codecs[i];
    return NULL;
}

const char *ckptfs_codec_name(unsigned id, char *buf, size_t buf_len)
{
    const CkptfsCodecInfo *codec = ckptfs_codec(id);
    if (codec != NULL)
        return codec->name;
    snprintf(buf, buf_len, "codec %u", id);
    return buf;
}

char *ckptfs_codec_written_names(void)
{
    GString *names = g_string_new(NULL);
    size_t written = 0, total = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(codecs); i++)
        total += codecs[i].encode != NULL;
    for (size_t i = 0; i < G_N_ELEMENTS(codecs); i++) {
        if (codecs[i].encode == NULL)
            continue;
        if (written > 0)
            g_string_append(names, written + 1 == total ? " or " : ", ");
        g_string_append(names, codecs[i].name);
        written++;
    }
    return g_string_free(names, FALSE);
}

int ckptfs_codec_level_max(void)
{
    int max = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(codecs); i++)
        max = MAX(max, codecs[i].level_max);
    return max;
}

uint64_t ckptfs_codec_bound_any(uint32_t len)
{
    uint64_t bound = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(codecs); i++)
        bound = MAX(bound, codecs[i].bound(len));
    return bound;
}
