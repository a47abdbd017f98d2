#include "ckptfs/zipreader.h"

#include <string.h>

#include "ckptfs/checked.h"
#include "ckptfs/error.h"
#include "ckptfs/limits.h"

#define EOCD_SIG 0x06054b50u
#define EOCD64_SIG 0x06064b50u
#define LOCATOR_SIG 0x07064b50u
#define CD_SIG 0x02014b50u
#define LOCAL_SIG 0x04034b50u

/* Bytes of an archive read once and kept: its last 4 KiB (end records, and for a small
 * directory such as a torch_dist chunk archive's the directory too) and its first 4 KiB from the
 * first local header (the headers before the data and small records such as data.pkl). */
typedef struct {
    uint8_t *buf;
    uint64_t at; /* archive offset of buf[0] */
    size_t len;
} Window;

#define WINDOW_BYTES 4096u

struct CkptfsZip {
    char *path;
    unsigned src;
    uint64_t base;       /* of the archive in the file */
    Window head;         /* see Window */
    char *top;
    GPtrArray *entries;  /* CkptfsZipEntry* */
    GHashTable *by_name; /* name -> entry */
};

static void entry_free(gpointer p)
{
    CkptfsZipEntry *e = p;
    g_free(e->name);
    g_free(e);
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static bool bad(GError **error, const char *path, const char *fmt, ...) G_GNUC_PRINTF(3, 4);
static bool bad(GError **error, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    g_autofree char *msg = g_strdup_vprintf(fmt, ap);
    va_end(ap);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: %s", path, msg);
    return false;
}

/* Bytes [OFF, OFF + LEN) of the archive at BASE into OUT: from one of the N windows W where
 * one holds them all, else read. */
static bool archive_bytes(const CkptfsSrcFiles *files, unsigned src, uint64_t base, const Window *w, unsigned n,
                          uint64_t off, size_t len, uint8_t *out, GError **error)
{
    for (unsigned i = 0; i < n; i++)
        if (w[i].buf != NULL && off >= w[i].at && off - w[i].at <= w[i].len && len <= w[i].len - (off - w[i].at)) {
            memcpy(out, w[i].buf + (off - w[i].at), len);
            return true;
        }
    return ckptfs_srcfiles_pread(files, src, out, len, base + off, error);
}

/* The ZIP64 end of central directory record the locator at LOC (20 bytes) points to, checked
 * and cross-checked with the classic end record E: fills the directory's offset, size and
 * entry count. Readers disagree on archives whose records disagree (miniz, which torch.load
 * uses, takes the ZIP64 values; Python's zipfile looks for the record just before the locator;
 * an older ckptfs took the classic values), so only the archive every reader sees the same is
 * accepted: one disk, the record where the locator says and just before it, and every classic
 * field that is not saturated (0xffff / 0xffffffff) equal to its ZIP64 counterpart. */
static bool read_zip64_end(const CkptfsSrcFiles *files, unsigned src, const char *path,
                           uint64_t base, uint64_t size, const Window *tail, uint64_t loc_at, const uint8_t *loc,
                           const uint8_t *e, uint64_t *cd_offset, uint64_t *cd_size,
                           uint64_t *count, GError **error)
{
    uint32_t record_disk = get32(loc + 4), disks = get32(loc + 16);
    uint64_t rec_off = get64(loc + 8);
    if (record_disk != 0 || disks != 1)
        return bad(error, path, "ZIP64 locator says the archive spans %u disks (its end record on "
                                "disk %u); multi-disk zip archives are not supported", disks, record_disk);
    uint8_t rec[56];
    if (!ckptfs_range_inside(rec_off, sizeof rec, size))
        return bad(error, path, "ZIP64 locator points to offset %" G_GUINT64_FORMAT ", outside the "
                                "archive (%" G_GUINT64_FORMAT " bytes)", rec_off, size);
    if (!archive_bytes(files, src, base, tail, 1, rec_off, sizeof rec, rec, error))
        return false;
    if (get32(rec) != EOCD64_SIG)
        return bad(error, path, "no ZIP64 end record where the locator points (offset %" G_GUINT64_FORMAT ")",
                   rec_off);
    uint64_t rec_size = get64(rec + 4);
    if (rec_size != sizeof rec - 12 || rec_off + sizeof rec != loc_at)
        return bad(error, path, "ZIP64 end record at %" G_GUINT64_FORMAT " has size %" G_GUINT64_FORMAT
                                " and is not right before its locator at %" G_GUINT64_FORMAT
                                " (torch.save writes 44 and there)", rec_off, rec_size, loc_at);
    uint64_t on_disk = get64(rec + 24);
    *count = get64(rec + 32);
    *cd_size = get64(rec + 40);
    *cd_offset = get64(rec + 48);
    if (get32(rec + 16) != 0 || get32(rec + 20) != 0 || on_disk != *count)
        return bad(error, path, "ZIP64 end record: %" G_GUINT64_FORMAT " entries on this disk of %"
                                G_GUINT64_FORMAT " (disk %u, directory on disk %u); multi-disk zip "
                                "archives are not supported", on_disk, *count, get32(rec + 16), get32(rec + 20));
    uint16_t classic_count = get16(e + 10);
    uint32_t classic_size = get32(e + 12), classic_offset = get32(e + 16);
    if (classic_count != 0xffff && classic_count != *count)
        return bad(error, path, "ZIP64 end record says %" G_GUINT64_FORMAT " entries, the classic "
                                "end record %u", *count, classic_count);
    if (classic_size != 0xffffffffu && classic_size != *cd_size)
        return bad(error, path, "ZIP64 end record says a central directory of %" G_GUINT64_FORMAT
                                " bytes, the classic end record %u", *cd_size, classic_size);
    if (classic_offset != 0xffffffffu && classic_offset != *cd_offset)
        return bad(error, path, "ZIP64 end record says the central directory is at offset %"
                                G_GUINT64_FORMAT ", the classic end record at %u", *cd_offset, classic_offset);
    return true;
}

/* Finds the end records: fills the directory's offset, size and entry count, and TAIL (to be
 * freed) with the archive's last bytes. A torch.save archive has no comment, so its end records
 * are in its last 4 KiB; the 64 KiB a comment may add are read only where they are not. */
static bool find_directory(const CkptfsSrcFiles *files, unsigned src, const char *path,
                           uint64_t base, uint64_t size, Window *tail, uint64_t *cd_offset, uint64_t *cd_size,
                           uint64_t *count, GError **error)
{
    if (size < 22)
        return bad(error, path, "%" G_GUINT64_FORMAT " bytes is too short for a zip archive", size);
    static const size_t tail_sizes[] = {WINDOW_BYTES, 65535 + 22 + 20 + 56};
    ssize_t at = -1;
    for (size_t k = 0; k < G_N_ELEMENTS(tail_sizes) && at < 0; k++) {
        size_t tail_len = (size_t)MIN(size, (uint64_t)tail_sizes[k]);
        if (k > 0 && tail_len == tail->len)
            break; /* the whole archive was read already */
        g_free(tail->buf);
        *tail = (Window){g_malloc(tail_len), size - tail_len, tail_len};
        if (!ckptfs_srcfiles_pread(files, src, tail->buf, tail_len, base + tail->at, error))
            return false;
        /* The end record is the last signature whose comment length reaches the end exactly. */
        for (ssize_t i = (ssize_t)tail_len - 22; i >= 0; i--)
            if (get32(tail->buf + i) == EOCD_SIG && (size_t)i + 22 + get16(tail->buf + i + 20) == tail_len) {
                at = i;
                break;
            }
        /* Found too near the start of a short read to see a ZIP64 locator before it: read more. */
        if (at >= 0 && at < 20 && tail_len < size && k + 1 < G_N_ELEMENTS(tail_sizes))
            at = -1;
    }
    if (at < 0)
        return bad(error, path, "not a zip archive (no end of central directory record); "
                                "not a torch.save file, or truncated?");
    const uint8_t *e = tail->buf + at;
    if (get16(e + 4) != 0 || get16(e + 6) != 0)
        return bad(error, path, "multi-disk zip archives are not supported");
    if (get16(e + 8) != get16(e + 10))
        return bad(error, path, "end record: %u entries on this disk of %u; multi-disk zip archives "
                                "are not supported", get16(e + 8), get16(e + 10));
    *count = get16(e + 10);
    *cd_size = get32(e + 12);
    *cd_offset = get32(e + 16);
    uint64_t eocd_at = tail->at + (uint64_t)at;
    if (at >= 20 && get32(e - 20) == LOCATOR_SIG) {
        if (!read_zip64_end(files, src, path, base, size, tail, eocd_at - 20, e - 20, e, cd_offset,
                            cd_size, count, error))
            return false;
    } else if (*count == 0xffff || *cd_size == 0xffffffffu || *cd_offset == 0xffffffffu) {
        return bad(error, path, "ZIP64 sizes without a ZIP64 locator");
    }
    if (!ckptfs_range_inside(*cd_offset, *cd_size, size))
        return bad(error, path, "central directory [%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT
                                ") runs past the end of the file (%" G_GUINT64_FORMAT " bytes); truncated?",
                   *cd_offset, *cd_size, size);
    if (*cd_size > CKPTFS_MAX_ZIP_DIRECTORY_BYTES || *count > CKPTFS_MAX_ZIP_ENTRIES)
        return bad(error, path, "central directory of %" G_GUINT64_FORMAT " entries / %" G_GUINT64_FORMAT
                                " bytes is over the limit (%u entries, %u bytes)",
                   *count, *cd_size, CKPTFS_MAX_ZIP_ENTRIES, CKPTFS_MAX_ZIP_DIRECTORY_BYTES);
    return true;
}

/* Walks the extra field X (LEN bytes) of a directory entry or local header: the ZIP64 extended
 * information replaces the sizes and the offset that are 0xffffffff (OFFSET NULL: a local
 * header has none). Returns the bytes of whole (id, length, data) fields from the start: LEN
 * when the field is well formed. */
static size_t read_extra(const uint8_t *x, size_t len, uint64_t *usize, uint64_t *csize, uint64_t *offset)
{
    size_t at = 0;
    while (at + 4 <= len && at + 4 + get16(x + at + 2) <= len) {
        size_t v = at + 4, vend = v + get16(x + at + 2);
        if (get16(x + at) == 0x0001) {
            if (*usize == 0xffffffffu && v + 8 <= vend)
                *usize = get64(x + v), v += 8;
            if (*csize == 0xffffffffu && v + 8 <= vend)
                *csize = get64(x + v), v += 8;
            if (offset != NULL && *offset == 0xffffffffu && v + 8 <= vend)
                *offset = get64(x + v);
        }
        at = vend;
    }
    return at;
}

/* What the directory says of an entry beyond CkptfsZipEntry: its local header is checked
 * against it. */
typedef struct {
    CkptfsZipEntry *entry;
    uint64_t local; /* offset of the local header */
    uint32_t crc;
    uint16_t flags;
} CdEntry;

/* One central directory entry at P (LEFT bytes left); fills CD (its entry allocated), returns
 * its length. */
static size_t parse_cd_entry(const uint8_t *p, size_t left, const char *path, CdEntry *cd, GError **error)
{
    if (left < 46 || get32(p) != CD_SIG) {
        bad(error, path, "central directory entry is malformed");
        return 0;
    }
    CkptfsZipEntry *entry = cd->entry;
    cd->flags = get16(p + 8);
    cd->crc = get32(p + 16);
    uint16_t method = get16(p + 10);
    uint64_t csize = get32(p + 20), usize = get32(p + 24);
    size_t name_len = get16(p + 28), extra_len = get16(p + 30), comment_len = get16(p + 32);
    cd->local = get32(p + 42);
    if (46 + name_len + extra_len + comment_len > left) {
        bad(error, path, "central directory entry runs past the directory");
        return 0;
    }
    entry->name = g_strndup((const char *)p + 46, name_len);
    read_extra(p + 46 + name_len, extra_len, &usize, &csize, &cd->local);
    if (method != 0) {
        bad(error, path, "entry '%s' is compressed (method %u); torch.save files store every "
                         "entry uncompressed",
            entry->name, method);
        return 0;
    }
    if (csize != usize) {
        bad(error, path, "entry '%s': stored size %" G_GUINT64_FORMAT " differs from size %" G_GUINT64_FORMAT,
            entry->name, csize, usize);
        return 0;
    }
    if (cd->flags & 1) {
        bad(error, path, "entry '%s' is encrypted; torch.save files are not", entry->name);
        return 0;
    }
    entry->size = usize;
    return 46 + name_len + extra_len + comment_len;
}

#define DESCRIPTOR_SIG 0x08074b50u
/* A data descriptor: an optional signature, the CRC, then both sizes in 4 or (ZIP64) 8 bytes. */
#define DESCRIPTOR_MAX 24u
/* Bytes read with a local header beyond its name, for the extra field (torch pads the data to
 * 64 bytes in it); a longer one is read on its own. */
#define LOCAL_EXTRA_GUESS 128u
#define LOCAL_FIXED 30u

/* Whether the LEN bytes at D are the data descriptor of an entry of SIZE bytes and CRC. Every
 * reader skips it, but it pins where the data ends: a local header whose name or extra length
 * was changed moves the data, and no longer meets its descriptor. */
static bool descriptor_matches(const uint8_t *d, size_t len, uint64_t size, uint32_t crc)
{
    for (unsigned sig = 0; sig <= 4; sig += 4) {
        if (sig && (len < 4 || get32(d) != DESCRIPTOR_SIG))
            break;
        const uint8_t *v = d + sig;
        size_t n = len - sig;
        if (n >= 12 && get32(v) == crc && get32(v + 4) == size && get32(v + 8) == size)
            return true;
        if (n >= 20 && get32(v) == crc && get64(v + 4) == size && get64(v + 12) == size)
            return true;
    }
    return false;
}

/* Checks the local header of CD, whose first AVAIL bytes are at H (at least LOCAL_FIXED + its
 * name), and finds where its data starts (archive offset, in *START). The extra field is checked
 * to be whole fields, which needs its bytes: *NEED says how many to read for it when H has too
 * few (and the call is repeated). */
static bool check_local(const uint8_t *h, size_t avail, const CdEntry *cd, const char *path,
                        uint64_t *start, size_t *need, GError **error)
{
    const char *name = cd->entry->name; /* the full name: the top folder is cut later */
    size_t name_len = strlen(name);
    if (get32(h) != LOCAL_SIG)
        return bad(error, path, "entry '%s': no local header at offset %" G_GUINT64_FORMAT, name, cd->local);
    if (get16(h + 26) != name_len || memcmp(h + LOCAL_FIXED, name, name_len) != 0)
        return bad(error, path, "entry '%s': the local header at offset %" G_GUINT64_FORMAT " names another "
                                "file (%u bytes of name); the archive is damaged", name, cd->local, get16(h + 26));
    if (get16(h + 8) != 0 || (get16(h + 6) & 1))
        return bad(error, path, "entry '%s': the local header says compressed (method %u) or encrypted, the "
                                "directory does not", name, get16(h + 8));
    size_t extra_len = get16(h + 28);
    *need = LOCAL_FIXED + name_len + extra_len;
    if (avail < *need)
        return true;
    uint64_t csize = get32(h + 18), usize = get32(h + 22);
    if (read_extra(h + LOCAL_FIXED + name_len, extra_len, &usize, &csize, NULL) != extra_len)
        return bad(error, path, "entry '%s': the extra field of the local header at offset %" G_GUINT64_FORMAT
                                " is not whole fields (%zu bytes); the archive is damaged", name, cd->local, extra_len);
    /* Without a data descriptor the header carries the sizes. */
    if (!(cd->flags & 8) && (csize != cd->entry->size || usize != cd->entry->size))
        return bad(error, path, "entry '%s': the local header says %" G_GUINT64_FORMAT " bytes, the directory %"
                                G_GUINT64_FORMAT "; the archive is damaged", name, usize, cd->entry->size);
    *start = cd->local + *need;
    return true;
}

static gint by_local(gconstpointer a, gconstpointer b)
{
    const CdEntry *x = a, *y = b;
    return x->local < y->local ? -1 : x->local > y->local;
}

/* The local headers of the entries, in file order (sorts CDS), each checked against the
 * directory; sets each entry's data_offset. Each entry's data, with its descriptor, must end
 * before the next header and the directory: a damaged header that would move the data onto other
 * bytes is refused instead of read. One read per entry: a header with the previous entry's
 * descriptor just before it. */
static bool check_local_headers(const CkptfsSrcFiles *files, unsigned src, const char *path, uint64_t base,
                                uint64_t cd_offset, GArray *cds, Window w[2], GError **error)
{
    g_array_sort(cds, by_local);
    /* w[1] is the tail; w[0], the first WINDOW_BYTES from the first header, is read here
     * unless the tail holds it. */
    uint64_t first = cds->len ? g_array_index(cds, CdEntry, 0).local : cd_offset;
    if (first < w[1].at && first < cd_offset) {
        size_t len = (size_t)MIN((uint64_t)WINDOW_BYTES, cd_offset - first);
        w[0] = (Window){g_malloc(len), first, len};
        if (!ckptfs_srcfiles_pread(files, src, w[0].buf, len, base + first, error))
            return false;
    }
    g_autofree uint8_t *buf = NULL;
    size_t buf_size = 0;
    uint64_t prev_end = 0; /* where the previous entry's data ends */
    const CdEntry *prev = NULL;
    for (guint i = 0; i <= cds->len; i++) {
        const CdEntry *cd = i < cds->len ? &g_array_index(cds, CdEntry, i) : NULL;
        uint64_t at = cd ? cd->local : cd_offset; /* what comes next: a header, or the directory */
        if (at > cd_offset)
            return bad(error, path, "entry '%s': local header offset %" G_GUINT64_FORMAT " is past the central "
                                    "directory (at %" G_GUINT64_FORMAT ")", cd->entry->name, at, cd_offset);
        if (prev != NULL && cd != NULL && at == prev->local)
            return bad(error, path, "entries '%s' and '%s' share the local header at offset %" G_GUINT64_FORMAT
                                    "; the archive is damaged", prev->entry->name, cd->entry->name, at);
        if (prev != NULL && at < prev_end)
            return bad(error, path, "entry '%s': its data [%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT
                                    ") runs into the %s at offset %" G_GUINT64_FORMAT "; the archive is damaged",
                       prev->entry->name, prev_end - prev->entry->size, prev->entry->size,
                       cd ? "next local header" : "central directory", at);
        /* The previous descriptor, when this read can take it along. */
        bool descriptor = prev != NULL && (prev->flags & 8);
        uint64_t lo = descriptor && at - prev_end <= DESCRIPTOR_MAX ? prev_end : at;
        size_t name_len = cd ? strlen(cd->entry->name) : 0;
        uint64_t hi = cd ? MIN(at + LOCAL_FIXED + name_len + LOCAL_EXTRA_GUESS, cd_offset) : at;
        if (cd && hi < at + LOCAL_FIXED + name_len)
            return bad(error, path, "entry '%s': local header offset %" G_GUINT64_FORMAT " leaves no room for "
                                    "the header before the central directory", cd->entry->name, at);
        uint64_t start = 0;
        unsigned reread = 0;
        for (;;) {
            size_t len = (size_t)(hi - lo);
            if (len > buf_size) {
                buf_size = len;
                g_free(buf);
                buf = g_malloc(buf_size);
            }
            if (len > 0 && !archive_bytes(files, src, base, w, 2, lo, len, buf, error))
                return false;
            if (descriptor) {
                uint8_t own[DESCRIPTOR_MAX];
                const uint8_t *d = buf;
                size_t d_len = (size_t)MIN(at - prev_end, (uint64_t)DESCRIPTOR_MAX);
                if (lo != prev_end) { /* far before this header: read on its own */
                    if (!archive_bytes(files, src, base, w, 2, prev_end, d_len, own, error))
                        return false;
                    d = own;
                }
                if (!descriptor_matches(d, d_len, prev->entry->size, prev->crc))
                    return bad(error, path, "entry '%s': no data descriptor where its %" G_GUINT64_FORMAT
                                            " bytes of data end (offset %" G_GUINT64_FORMAT "): its local header "
                                            "or the directory is damaged",
                               prev->entry->name, prev->entry->size, prev_end);
                descriptor = false;
            }
            if (cd == NULL)
                break;
            size_t need = 0;
            if (!check_local(buf + (at - lo), len - (size_t)(at - lo), cd, path, &start, &need, error))
                return false;
            if (start != 0)
                break;
            /* A long extra field: read the whole header again (once: a header asking for more
             * the second time changed in between). */
            if (reread++)
                return bad(error, path, "entry '%s': its local header changed while it was read", cd->entry->name);
            lo = at;
            hi = at + need;
            if (hi > cd_offset)
                return bad(error, path, "entry '%s': its local header runs into the central directory",
                           cd->entry->name);
        }
        if (cd == NULL)
            break;
        if (!ckptfs_range_inside(start, cd->entry->size, cd_offset))
            return bad(error, path, "entry '%s': data [%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT
                                    ") runs into the central directory at offset %" G_GUINT64_FORMAT
                                    "; the archive is damaged", cd->entry->name, start, cd->entry->size, cd_offset);
        cd->entry->data_offset = base + start;
        prev_end = start + cd->entry->size;
        prev = cd;
    }
    return true;
}

/* The archive at [BASE, BASE + SIZE) of source file SRC; PATH names it in errors. Offsets in
 * the archive are relative to BASE. */
static CkptfsZip *zip_open(const CkptfsSrcFiles *files, unsigned src, const char *path,
                           uint64_t base, uint64_t size, GError **error)
{
    uint64_t cd_offset = 0, cd_size = 0, count = 0;
    Window w[2] = {{0}}; /* head, tail */
    bool found = find_directory(files, src, path, base, size, &w[1], &cd_offset, &cd_size, &count, error);
    g_autofree uint8_t *tail_buf = w[1].buf;
    g_autofree uint8_t *cd = found ? g_malloc(cd_size ? cd_size : 1) : NULL;
    found = found && archive_bytes(files, src, base, &w[1], 1, cd_offset, (size_t)cd_size, cd, error);
    if (!found)
        return NULL;
    CkptfsZip *zip = g_new0(CkptfsZip, 1);
    zip->path = g_strdup(path);
    zip->src = src;
    zip->base = base;
    zip->entries = g_ptr_array_new_with_free_func(entry_free);
    zip->by_name = g_hash_table_new(g_str_hash, g_str_equal);
    size_t pos = 0;
    g_autoptr(GArray) cds = g_array_sized_new(FALSE, FALSE, sizeof(CdEntry), (guint)MIN(count, 4096));
    for (uint64_t i = 0; i < count; i++) {
        CdEntry cde = {.entry = g_new0(CkptfsZipEntry, 1)};
        g_ptr_array_add(zip->entries, cde.entry);
        size_t used = parse_cd_entry(cd + pos, (size_t)cd_size - pos, path, &cde, error);
        if (used == 0)
            goto fail;
        pos += used;
        g_array_append_val(cds, cde);
    }
    /* Python's zipfile reads entries until the directory's size is used up, miniz (torch.load)
     * reads the count: both must agree. */
    if (pos != cd_size) {
        bad(error, path, "central directory has %" G_GUINT64_FORMAT " bytes after its %" G_GUINT64_FORMAT
                         " entries", (uint64_t)cd_size - pos, count);
        goto fail;
    }
    bool checked = check_local_headers(files, src, path, base, cd_offset, cds, w, error);
    zip->head = w[0]; /* kept for small records (data.pkl of a chunk archive) */
    if (!checked)
        goto fail;
    /* torch.save puts every entry in one top folder: find it from data.pkl. */
    for (guint i = 0; i < zip->entries->len && zip->top == NULL; i++) {
        const char *name = ((CkptfsZipEntry *)g_ptr_array_index(zip->entries, i))->name;
        const char *slash = strchr(name, '/');
        if (slash && strcmp(slash + 1, "data.pkl") == 0)
            zip->top = g_strndup(name, (gsize)(slash - name));
    }
    if (zip->top == NULL) {
        bad(error, path, "no data.pkl entry: not a torch.save archive");
        goto fail;
    }
    size_t top_len = strlen(zip->top);
    for (guint i = 0; i < zip->entries->len; i++) {
        CkptfsZipEntry *e = g_ptr_array_index(zip->entries, i);
        if (strncmp(e->name, zip->top, top_len) != 0 || e->name[top_len] != '/') {
            bad(error, path, "entry '%s' is outside the top folder '%s'", e->name, zip->top);
            goto fail;
        }
        memmove(e->name, e->name + top_len + 1, strlen(e->name + top_len + 1) + 1);
        if (g_hash_table_contains(zip->by_name, e->name)) {
            bad(error, path, "entry '%s/%s' appears twice", zip->top, e->name);
            goto fail;
        }
        g_hash_table_insert(zip->by_name, e->name, e);
    }
    return zip;
fail:
    ckptfs_zip_free(zip);
    return NULL;
}

CkptfsZip *ckptfs_zip_open(const CkptfsSrcFiles *files, unsigned src, GError **error)
{
    const CkptfsSrcFile *file = ckptfs_srcfiles_get(files, src);
    return zip_open(files, src, file->path, 0, file->size, error);
}

CkptfsZip *ckptfs_zip_open_range(const CkptfsSrcFiles *files, unsigned src, uint64_t base,
                                 uint64_t size, const char *what, GError **error)
{
    const CkptfsSrcFile *file = ckptfs_srcfiles_get(files, src);
    if (!ckptfs_range_inside(base, size, file->size)) {
        bad(error, what, "[%" G_GUINT64_FORMAT ", +%" G_GUINT64_FORMAT ") runs past the end of "
                         "the file (%" G_GUINT64_FORMAT " bytes)", base, size, file->size);
        return NULL;
    }
    return zip_open(files, src, what, base, size, error);
}

void ckptfs_zip_free(CkptfsZip *zip)
{
    if (zip == NULL)
        return;
    g_hash_table_unref(zip->by_name);
    g_ptr_array_unref(zip->entries);
    g_free(zip->head.buf);
    g_free(zip->top);
    g_free(zip->path);
    g_free(zip);
}

const CkptfsZipEntry *ckptfs_zip_find(const CkptfsZip *zip, const char *name)
{
    return g_hash_table_lookup(zip->by_name, name);
}

unsigned ckptfs_zip_count(const CkptfsZip *zip)
{
    return zip->entries->len;
}

const CkptfsZipEntry *ckptfs_zip_at(const CkptfsZip *zip, unsigned index)
{
    return index < zip->entries->len ? g_ptr_array_index(zip->entries, index) : NULL;
}

const char *ckptfs_zip_top_folder(const CkptfsZip *zip)
{
    return zip->top;
}

GBytes *ckptfs_zip_read(const CkptfsZip *zip, const CkptfsSrcFiles *files, const char *name,
                        uint64_t max, GError **error)
{
    const CkptfsZipEntry *e = ckptfs_zip_find(zip, name);
    if (e == NULL) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "%s: no entry '%s/%s'", zip->path,
                    zip->top, name);
        return NULL;
    }
    if (e->size > max) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT,
                    "%s: entry '%s/%s' is %" G_GUINT64_FORMAT " bytes (limit %" G_GUINT64_FORMAT ")",
                    zip->path, zip->top, name, e->size, max);
        return NULL;
    }
    uint8_t *buf = g_malloc(e->size ? e->size : 1);
    if (!archive_bytes(files, zip->src, zip->base, &zip->head, 1, e->data_offset - zip->base, (size_t)e->size, buf,
                       error)) {
        g_free(buf);
        return NULL;
    }
    return g_bytes_new_take(buf, (gsize)e->size);
}
