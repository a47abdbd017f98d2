/* The codec table (include/ckptfs/codec.h): row I is codec I; what a row encodes the codec's own
 * library decodes (and the row's decode, with and without a pooled context, gives the same bytes);
 * encoded lengths stay within the row's bound and the bound of any codec; corrupt data is refused
 * with the codec named; an unknown codec is named by number, never as another codec; the names
 * and levels pack accepts come from the rows. */
#include <glib.h>
#include <lz4.h>
#include <lz4hc.h>
#include <string.h>
#include <zstd.h>

#include "ckptfs/codec.h"
#include "ckptfs/pack.h"
#include "tap.h"

#define DATA_LEN (256u << 10)

/* Bytes that compress: a slow ramp with some noise. */
static void fill(uint8_t *data, size_t n)
{
    uint32_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (uint8_t)((i >> 9) + (i % 16 == 0 ? (x >> 16) & 3 : 0));
    }
}

/* The bytes of LEN as the codec's own library decodes them into OUT (LEN bytes): true when they
 * are LEN bytes. */
static bool library_decode(CkptfsCodec id, const uint8_t *src, size_t src_len, uint8_t *out, size_t len)
{
    if (id == CKPTFS_CODEC_ZSTD) {
        size_t r = ZSTD_decompress(out, len, src, src_len);
        return !ZSTD_isError(r) && r == len;
    }
    if (id == CKPTFS_CODEC_LZ4)
        return LZ4_decompress_safe((const char *)src, (char *)out, (int)src_len, (int)len) == (int)len;
    return false;
}

static void check_row_round_trip(const CkptfsCodecInfo *codec, int level, const uint8_t *data)
{
    size_t cap = (size_t)codec->bound(DATA_LEN);
    g_autofree uint8_t *enc = g_malloc(cap);
    g_autofree uint8_t *dec = g_malloc(DATA_LEN);
    void *encoder = codec->encoder_new(level);
    size_t n = codec->encode(encoder, data, DATA_LEN, enc, cap, level);
    tap_ok(n > 0 && n < DATA_LEN / 2 && n <= ckptfs_codec_bound_any(DATA_LEN),
           "%s level %d: encodes %u compressible bytes to %zu, within every bound", codec->name, level, DATA_LEN, n);
    memset(dec, 0, DATA_LEN);
    tap_ok(library_decode(codec->id, enc, n, dec, DATA_LEN) && memcmp(dec, data, DATA_LEN) == 0,
           "%s level %d: the codec's library decodes it to the original bytes", codec->name, level);
    void *decoder = codec->decoder_new ? codec->decoder_new() : NULL;
    for (int with_ctx = 0; with_ctx < 2; with_ctx++) {
        size_t got = 0;
        memset(dec, 0, DATA_LEN);
        bool ok = codec->decode(with_ctx ? decoder : NULL, enc, n, dec, DATA_LEN, &got, NULL);
        tap_ok(ok && got == DATA_LEN && memcmp(dec, data, DATA_LEN) == 0, "%s level %d: the row decodes it (%s context)",
               codec->name, level, with_ctx ? "a pooled" : "no");
    }
    tap_is_u64(codec->encode(encoder, data, DATA_LEN, enc, 16, level), 0,
               "%s level %d: 16 bytes of room is too little: 0, nothing half-written claimed", codec->name, level);
    /* Corrupt: the encoded bytes cut short. */
    GError *error = NULL;
    size_t got = 0;
    bool ok = codec->decode(decoder, enc, n / 2, dec, DATA_LEN, &got, &error);
    tap_ok((!ok && error != NULL && g_str_has_prefix(error->message, codec->name)) || (ok && got != DATA_LEN),
           "%s level %d: half of the encoded bytes do not decode to the original length (%s)", codec->name, level,
           error ? error->message : "short");
    g_clear_error(&error);
    if (decoder)
        codec->decoder_free(decoder);
    codec->encoder_free(encoder);
}

static void check_table(void)
{
    for (unsigned id = 0; id < CKPTFS_CODEC_COUNT; id++) {
        const CkptfsCodecInfo *codec = ckptfs_codec(id);
        tap_ok(codec != NULL && codec->id == (CkptfsCodec)id && codec->name && codec->bound && codec->decode,
               "row %u is codec %u, with a name, a bound and a decoder", id, id);
    }
    tap_ok(ckptfs_codec(CKPTFS_CODEC_COUNT) == NULL && ckptfs_codec(255) == NULL, "codecs past the table are unknown");
    char buf[32];
    tap_ok(strcmp(ckptfs_codec_name(CKPTFS_CODEC_LZ4 + 1, buf, sizeof buf), "codec 3") == 0,
           "an unknown codec is named by its number: '%s'", ckptfs_codec_name(CKPTFS_CODEC_LZ4 + 1, buf, sizeof buf));
    tap_ok(strcmp(ckptfs_codec_name(CKPTFS_CODEC_ZSTD, buf, sizeof buf), "zstd") == 0 &&
               strcmp(ckptfs_codec_name(CKPTFS_CODEC_STORED, buf, sizeof buf), "stored") == 0,
           "known codecs are named by their rows");
    tap_ok(ckptfs_codec_by_name("zstd") == ckptfs_codec(CKPTFS_CODEC_ZSTD) &&
               ckptfs_codec_by_name("lz4") == ckptfs_codec(CKPTFS_CODEC_LZ4) && ckptfs_codec_by_name("stored") == NULL &&
               ckptfs_codec_by_name("gzip") == NULL,
           "pack writes zstd and lz4 by name, not stored (it chooses that per frame) nor unknown ones");
    g_autofree char *names = ckptfs_codec_written_names();
    tap_ok(strcmp(names, "zstd or lz4") == 0, "the names pack accepts: '%s'", names);
    tap_is_u64(ckptfs_codec_level_max(), 19, "the highest level any codec takes is zstd's 19");
    tap_ok(ckptfs_codec(CKPTFS_CODEC_LZ4)->level_max == LZ4HC_CLEVEL_MAX, "lz4 goes up to lz4hc's highest level");
    uint32_t big = 64u << 20;
    tap_ok(ckptfs_codec_bound_any(big) >= ZSTD_compressBound(big) &&
               ckptfs_codec_bound_any(big) >= (uint64_t)LZ4_compressBound((int)big) &&
               ckptfs_codec(CKPTFS_CODEC_STORED)->bound(big) == big,
           "the bound of any codec covers zstd's and lz4's worst cases of a 64 MiB frame");
    uint8_t src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8];
    size_t got = 0;
    GError *error = NULL;
    bool ok = ckptfs_codec(CKPTFS_CODEC_STORED)->decode(NULL, src, 7, dst, 8, &got, &error);
    tap_ok(!ok && error && strstr(error->message, "stored frame of 8 bytes holds 7"),
           "a stored frame of the wrong length is refused (%s)", error ? error->message : "accepted");
    g_clear_error(&error);
}

/* Pack's options take their names and level ranges from the rows. */
static void check_pack_options(void)
{
    CkptfsPackOptions o;
    GError *error = NULL;
    ckptfs_pack_options_init(&o);
    tap_ok(ckptfs_pack_options_apply(&o, "codec=gzip", &error) == CKPTFS_OPTION_BAD && error &&
               strcmp(error->message, "codec: 'gzip' is not zstd or lz4") == 0,
           "codec=gzip: %s", error ? error->message : "taken");
    g_clear_error(&error);
    ckptfs_pack_options_init(&o);
    ckptfs_pack_options_apply(&o, "codec=lz4", NULL);
    ckptfs_pack_options_apply(&o, "level=13", NULL);
    tap_ok(!ckptfs_pack_options_check(&o, &error) && error &&
               strcmp(error->message, "level: lz4 levels go from 1 (fast) to 12 (lz4hc), not 13") == 0,
           "lz4 level 13: %s", error ? error->message : "taken");
    g_clear_error(&error);
    ckptfs_pack_options_init(&o);
    tap_ok(ckptfs_pack_options_apply(&o, "level=20", &error) == CKPTFS_OPTION_BAD, "level=20 is above every codec's");
    g_clear_error(&error);
    ckptfs_pack_options_init(&o);
    o.codec = CKPTFS_CODEC_STORED;
    tap_ok(!ckptfs_pack_options_check(&o, &error) && error && strstr(error->message, "is not zstd or lz4"),
           "codec stored is not one pack writes: %s", error ? error->message : "taken");
    g_clear_error(&error);
    ckptfs_pack_options_init(&o);
    tap_ok(ckptfs_pack_options_check(&o, NULL) && o.codec == CKPTFS_CODEC_ZSTD && o.level == 1,
           "the default: zstd level 1");
}

int main(void)
{
    check_table();
    check_pack_options();
    g_autofree uint8_t *data = g_malloc(DATA_LEN);
    fill(data, DATA_LEN);
    for (unsigned id = 0; id < CKPTFS_CODEC_COUNT; id++) {
        const CkptfsCodecInfo *codec = ckptfs_codec(id);
        if (codec == NULL || codec->encode == NULL)
            continue;
        int levels[] = {codec->level_min, codec->level_default, codec->level_max};
        for (size_t l = 0; l < G_N_ELEMENTS(levels); l++)
            check_row_round_trip(codec, levels[l], data);
    }
    return tap_done();
}
