/* Source files for the read-path tests: N files of SIZE random bytes in a fresh temporary
 * directory, registered in a CkptfsSrcFiles in order (index i = file i), their bytes kept in
 * memory to check reads against; and a plan read from them as a mount reads it, through
 * descriptors or (refs set) from a leased mapping of the cached sources. */
#ifndef CKPTFS_TESTS_RANDOM_SOURCES_H
#define CKPTFS_TESTS_RANDOM_SOURCES_H

#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"

typedef struct {
    char *dir;
    CkptfsSrcFiles *files;
    unsigned n;
    uint8_t **data;
    /* Reads as a mount's with mapped reads (NULL: through descriptors); how many of them used
     * the mapping. */
    CkptfsReplyRefs *refs;
    int from_map;
} RandomSources;

static inline char *random_sources_path(const RandomSources *s, unsigned i)
{
    return g_strdup_printf("%s/src%u", s->dir, i);
}

/* WHAT names the temporary directory (ckptfs-WHAT-XXXXXX). */
static inline void random_sources_init(RandomSources *s, unsigned n, size_t size, GRand *rng, const char *what)
{
    g_autofree char *tmpl = g_strdup_printf("ckptfs-%s-XXXXXX", what);
    s->dir = g_dir_make_tmp(tmpl, NULL);
    g_assert(s->dir != NULL);
    s->files = ckptfs_srcfiles_new(0);
    s->n = n;
    s->data = g_new0(uint8_t *, n);
    s->refs = NULL;
    s->from_map = 0;
    for (unsigned i = 0; i < n; i++) {
        s->data[i] = g_malloc(size);
        for (size_t j = 0; j < size; j += 4) {
            uint32_t v = g_rand_int(rng);
            memcpy(s->data[i] + j, &v, MIN(4, size - j));
        }
        g_autofree char *path = random_sources_path(s, i);
        g_assert(g_file_set_contents(path, (const char *)s->data[i], (gssize)size, NULL));
        g_assert(ckptfs_srcfiles_add(s->files, path, NULL) == (int)i);
    }
}

static inline void random_sources_clear(RandomSources *s)
{
    for (unsigned i = 0; i < s->n; i++) {
        g_autofree char *path = random_sources_path(s, i);
        g_unlink(path);
        g_free(s->data[i]);
    }
    g_free(s->data);
    g_rmdir(s->dir);
    g_free(s->dir);
    ckptfs_srcfiles_free(s->files);
}

/* Changes file I in place (its first byte flipped, here and on disk) with a new mtime. */
static inline void random_sources_change(RandomSources *s, unsigned i)
{
    g_autofree char *path = random_sources_path(s, i);
    s->data[i][0] ^= 0xFF;
    sleep(1); /* a new mtime even on coarse clocks */
    FILE *f = fopen(path, "r+b");
    g_assert(f != NULL && fwrite(s->data[i], 1, 1, f) == 1);
    fclose(f);
}

/* Whether PLAN reads whole and then, file I changed in place under it, fails naming the file;
 * WHY gets the error's message (or what went wrong before it). */
static inline bool random_sources_change_fails(RandomSources *s, const CkptfsPlan *plan, unsigned i, char **why)
{
    uint64_t size = ckptfs_plan_size(plan);
    g_autofree uint8_t *buf = g_malloc(size);
    bool before = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, size, 0, NULL) == (int64_t)size;
    random_sources_change(s, i);
    GError *error = NULL;
    int64_t n = ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, size, 0, &error);
    g_autofree char *name = g_strdup_printf("src%u", i);
    bool fails = before && n < 0 && error && strstr(error->message, name);
    *why = g_strdup(error ? error->message : before ? "no error" : "the read before the change failed");
    g_clear_error(&error);
    return fails;
}

/* Starts reading as a mount with mapped reads does (S's refs set), if WATCH leases the sources:
 * false (nothing started) where it does not. */
static inline bool random_sources_start_mapped(RandomSources *s, const CkptfsLeaseWatch *watch)
{
    const uint8_t *probe = watch ? ckptfs_srcfiles_map_pin(s->files, 0) : NULL;
    if (probe == NULL)
        return false;
    ckptfs_srcfiles_map_unpin(s->files, 0);
    s->refs = g_new0(CkptfsReplyRefs, 1);
    return true;
}

/* LEN bytes at OFF of PLAN into BUF, read as S says: the pieces a mapped read leaves in the
 * mapping put in their places, and a read that used the mapping counted. */
static inline int64_t random_sources_read(RandomSources *s, const CkptfsPlan *plan, uint8_t *buf, size_t len,
                                          uint64_t off, GError **error)
{
    if (s->refs == NULL)
        return ckptfs_plan_read(plan, CKPTFS_READ_SHARED(s->files), buf, len, off, error);
    int64_t n = ckptfs_plan_read(plan, &(CkptfsReadCtx){.files = s->files, .refs = s->refs}, buf, len, off, error);
    if (n > 0)
        ckptfs_reply_refs_gather(s->refs, buf, (size_t)n);
    bool used = false;
    for (unsigned i = 0; i < s->refs->npins; i++)
        used = used || (s->refs->pin[i].map != NULL && s->refs->pin[i].used);
    s->from_map += used;
    ckptfs_reply_refs_release(s->files, s->refs);
    return n;
}

#endif
