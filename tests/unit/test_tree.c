/* The namespace (core/view/tree.c) on its own, without a source or FUSE: lookups and attributes,
 * stable inode numbers, readdir offsets and a full buffer, directories filled on first use,
 * names created on lookup by a resolve hook, symlinks, plans built once (also under concurrent
 * lookups), a stalled populate hook or plan build stalling only its own node, errors (ENOENT,
 * ENOTDIR, EISDIR, EINVAL, EIO with the reason), and access: files
 * get what the access hook computes from their plan, directories and symlinks the directory
 * access. */
#include <errno.h>
#include <glib.h>
#include <glib/gstdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/plan.h"
#include "ckptfs/srcfiles.h"
#include "ckptfs/tree.h"
#include "tap.h"

/* --- plans: a file's key says what its plan holds --- */

typedef struct {
    gint built;     /* plan_fn calls that returned a plan (atomic) */
    gint failed;    /* plan_fn calls that failed */
    gint accessed;  /* access hook calls */
} Counters;

typedef struct {
    const char *text;  /* literal bytes, or NULL */
    int src;           /* source file to read 16 bytes of, or -1 */
    int src2;          /* a second one, or -1 */
    bool fail;         /* the plan cannot be built */
} FileKey;

static CkptfsPlan *plan_of(gpointer owner, gconstpointer key, GError **error)
{
    Counters *c = owner;
    const FileKey *k = key;
    if (k->fail) {
        g_atomic_int_inc(&c->failed);
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_FORMAT, "plan of the broken file: no luck");
        return NULL;
    }
    /* Slow enough that concurrent lookups overlap. */
    g_usleep(2000);
    CkptfsPlanBuilder *b = ckptfs_plan_builder_new();
    if (k->text)
        ckptfs_plan_add_literal(b, k->text, strlen(k->text));
    if (k->src >= 0)
        ckptfs_plan_add_run(b, (uint32_t)k->src, 0, 16);
    if (k->src2 >= 0)
        ckptfs_plan_add_run(b, (uint32_t)k->src2, 0, 16);
    g_atomic_int_inc(&c->built);
    return ckptfs_plan_builder_finish(b);
}

/* --- hooks --- */

typedef struct {
    int populate_calls;
    int resolve_calls;
    Counters *counters;
    const FileKey *hello;
} Hooks;

static const FileKey key_hello = {"hello\n", -1, -1, false};
static const FileKey key_world = {"world!!\n", -1, -1, false};

static bool populate_lazy(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    Hooks *h = owner;
    h->populate_calls++;
    ckptfs_tree_add_file(tree, dir, "a", plan_of, h->counters, h->hello);
    ckptfs_tree_add_file(tree, dir, "b", plan_of, h->counters, &key_world);
    ckptfs_tree_add_dir(tree, dir, "sub");
    return true;
}

static bool populate_broken(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    return ckptfs_fail(error, CKPTFS_ERROR_FORMAT, "the broken directory cannot be listed");
}

/* Creates "made-<x>" names on lookup (files); "dir-<x>" as a directory that resolves the same
 * way; anything else is refused with a reason. */
static CkptfsNode *resolve_made(CkptfsTree *tree, CkptfsNode *dir, const char *name, gpointer owner,
                                GError **error)
{
    Hooks *h = owner;
    h->resolve_calls++;
    if (g_str_has_prefix(name, "made-"))
        return ckptfs_tree_add_file(tree, dir, name, plan_of, h->counters, &key_world);
    if (g_str_has_prefix(name, "dir-")) {
        CkptfsNode *sub = ckptfs_tree_add_dir(tree, dir, name);
        ckptfs_tree_set_dir_hooks(tree, sub, NULL, resolve_made, owner);
        return sub;
    }
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "'%s' is not a name this directory makes",
                name);
    return NULL;
}

/* --- readdir collection --- */

typedef struct {
    GPtrArray *names;
    GArray *inos;
    GArray *next;
    GArray *types;
    guint limit; /* entries accepted before "the buffer is full" */
} Listing;

static void listing_init(Listing *l, guint limit)
{
    l->names = g_ptr_array_new_with_free_func(g_free);
    l->inos = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    l->next = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    l->types = g_array_new(FALSE, FALSE, sizeof(int));
    l->limit = limit;
}

static void listing_clear(Listing *l)
{
    g_ptr_array_unref(l->names);
    g_array_unref(l->inos);
    g_array_unref(l->next);
    g_array_unref(l->types);
}

static bool collect(gpointer ctx, const char *name, const CkptfsAttr *attr, uint64_t next_offset)
{
    Listing *l = ctx;
    if (l->names->len >= l->limit)
        return false;
    g_ptr_array_add(l->names, g_strdup(name));
    g_array_append_val(l->inos, attr->ino);
    g_array_append_val(l->next, next_offset);
    int type = attr->type;
    g_array_append_val(l->types, type);
    return true;
}

static char *joined(const Listing *l)
{
    GString *s = g_string_new(NULL);
    for (guint i = 0; i < l->names->len; i++)
        g_string_append_printf(s, "%s%s", i ? " " : "", (const char *)g_ptr_array_index(l->names, i));
    return g_string_free(s, FALSE);
}

/* --- tests --- */

static void test_basic(void)
{
    Counters c = {0};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    CkptfsNode *d1 = ckptfs_tree_add_dir(tree, root, "d1");
    CkptfsNode *d2 = ckptfs_tree_add_dir(tree, root, "d2");
    CkptfsNode *f = ckptfs_tree_add_file(tree, root, "f", plan_of, &c, &key_hello);
    ckptfs_tree_add_file(tree, d1, "inner", plan_of, &c, &key_world);
    CkptfsNode *link = ckptfs_tree_add_symlink(tree, root, "l", "d1/inner");
    tap_ok(d1 && d2 && f && link, "nodes are added");
    tap_ok(ckptfs_tree_add_dir(tree, root, "d1") == NULL &&
               ckptfs_tree_add_file(tree, root, "f", plan_of, &c, &key_hello) == NULL &&
               ckptfs_tree_add_symlink(tree, root, "d2", "x") == NULL,
           "a name already present is refused (dir, file or symlink over any kind)");

    CkptfsAttr a;
    int rc = ckptfs_tree_getattr(tree, CKPTFS_ROOT_INO, &a, NULL);
    tap_ok(rc == 0 && a.ino == CKPTFS_ROOT_INO && a.type == CKPTFS_NODE_DIR && a.nlink == 4,
           "root: ino 1, a directory, nlink 2 + its 2 subdirectories (got rc %d nlink %u)", rc, a.nlink);
    tap_ok(a.access.uid == 0 && a.access.gid == 0 && a.access.mode == 0555,
           "without set_access, directories are root's 0555 (got %u:%u %o)", a.access.uid,
           a.access.gid, a.access.mode);

    CkptfsAttr fa;
    rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "f", &fa, NULL);
    tap_ok(rc == 0 && fa.type == CKPTFS_NODE_FILE && fa.size == 6 && fa.nlink == 1 &&
               fa.access.mode == 0444 && fa.access.uid == 0,
           "file: size of its plan (6), nlink 1, root's 0444 without set_access");
    uint64_t f_ino = fa.ino;
    bool stable = true;
    for (int i = 0; i < 5; i++) {
        CkptfsAttr again;
        stable &= ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "f", &again, NULL) == 0 && again.ino == f_ino;
        stable &= ckptfs_tree_getattr(tree, f_ino, &again, NULL) == 0 && again.ino == f_ino &&
                  again.size == 6;
    }
    CkptfsAttr via_path;
    stable &= ckptfs_tree_resolve(tree, "f", &via_path, NULL) == 0 && via_path.ino == f_ino;
    stable &= ckptfs_tree_resolve(tree, "./d1//../f", &via_path, NULL) != 0; /* no ".." walking */
    tap_ok(stable, "lookups, getattr and resolve give the same inode every time");

    CkptfsAttr inner;
    rc = ckptfs_tree_resolve(tree, "d1/inner", &inner, NULL);
    CkptfsAttr inner2;
    int rc2 = ckptfs_tree_resolve(tree, "./d1//inner/", &inner2, NULL);
    tap_ok(rc == 0 && rc2 == 0 && inner.ino == inner2.ino && inner.size == 8,
           "resolve walks paths, skipping empty and '.' parts");
    CkptfsAttr r;
    tap_ok(ckptfs_tree_resolve(tree, "", &r, NULL) == 0 && r.ino == CKPTFS_ROOT_INO,
           "resolve of \"\" is the root");
    tap_ok(ckptfs_tree_plan(tree, f_ino, &(const CkptfsPlan *){NULL}, NULL, NULL) == 0 && c.built == 2,
           "each file's plan was built once (2 files looked up, %d builds)", c.built);

    /* Plans read back. */
    const CkptfsPlan *plan = NULL, *plan2 = NULL;
    ckptfs_tree_plan(tree, f_ino, &plan, NULL, NULL);
    ckptfs_tree_plan(tree, f_ino, &plan2, NULL, NULL);
    CkptfsSrcFiles *none = ckptfs_srcfiles_new(0);
    char buf[16] = {0};
    int64_t n = plan ? ckptfs_plan_read(plan, CKPTFS_READ_SHARED(none), buf, sizeof buf, 0, NULL) : -1;
    tap_ok(plan && plan == plan2 && n == 6 && memcmp(buf, "hello\n", 6) == 0,
           "ckptfs_tree_plan hands out the one cached plan, which reads the file's bytes");
    ckptfs_srcfiles_free(none);

    /* Symlinks. */
    CkptfsAttr la;
    rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "l", &la, NULL);
    const char *target = NULL;
    int rl = rc == 0 ? ckptfs_tree_readlink(tree, la.ino, &target) : rc;
    tap_ok(rc == 0 && la.type == CKPTFS_NODE_SYMLINK && la.size == strlen("d1/inner") &&
               la.access.mode == 0777 && rl == 0 && target && strcmp(target, "d1/inner") == 0,
           "symlink: type, size = target length, 0777, readlink gives the target");
    tap_ok(ckptfs_tree_readlink(tree, f_ino, &target) == -EINVAL &&
               ckptfs_tree_readlink(tree, 9999, &target) == -ENOENT,
           "readlink: EINVAL on a file, ENOENT on an unknown inode");
    CkptfsAttr through;
    tap_ok(ckptfs_tree_resolve(tree, "l/inner", &through, NULL) == -ENOTDIR,
           "resolve does not follow symlinks: l/inner is ENOTDIR");
    const CkptfsPlan *p = NULL;
    tap_ok(ckptfs_tree_plan(tree, la.ino, &p, NULL, NULL) == -EINVAL, "no plan for a symlink (EINVAL)");

    /* Errors. */
    GError *error = NULL;
    tap_ok(ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "nope", &a, &error) == -ENOENT,
           "lookup of a missing name: ENOENT");
    g_clear_error(&error);
    tap_ok(ckptfs_tree_lookup(tree, f_ino, "x", &a, NULL) == -ENOTDIR,
           "lookup under a file: ENOTDIR");
    tap_ok(ckptfs_tree_lookup(tree, 0, "x", &a, NULL) == -ENOENT &&
               ckptfs_tree_lookup(tree, 12345, "x", &a, NULL) == -ENOENT,
           "lookup under inode 0 or an unknown inode: ENOENT");
    tap_ok(ckptfs_tree_getattr(tree, 0, &a, NULL) == -ENOENT &&
               ckptfs_tree_getattr(tree, 12345, &a, NULL) == -ENOENT,
           "getattr of inode 0 or an unknown inode: ENOENT");
    tap_ok(ckptfs_tree_plan(tree, CKPTFS_ROOT_INO, &p, NULL, NULL) == -EISDIR &&
               ckptfs_tree_plan(tree, 12345, &p, NULL, NULL) == -ENOENT,
           "plan of a directory: EISDIR; of an unknown inode: ENOENT");
    Listing l;
    listing_init(&l, 100);
    tap_ok(ckptfs_tree_readdir(tree, f_ino, 0, collect, &l, NULL) == -ENOTDIR &&
               ckptfs_tree_readdir(tree, 12345, 0, collect, &l, NULL) == -ENOENT && l.names->len == 0,
           "readdir of a file: ENOTDIR; of an unknown inode: ENOENT; nothing listed");
    listing_clear(&l);
    tap_ok(ckptfs_tree_resolve(tree, "d1/missing", &a, NULL) == -ENOENT &&
               ckptfs_tree_resolve(tree, "f/x", &a, NULL) == -ENOTDIR,
           "resolve: ENOENT for a missing leaf, ENOTDIR through a file");

    ckptfs_tree_free(tree);
}

static void test_readdir(void)
{
    Counters c = {0};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    enum { N = 25 };
    for (int i = 0; i < N; i++) {
        char name[16];
        g_snprintf(name, sizeof name, "e%02d", N - 1 - i); /* insertion order != name order */
        if (i % 5 == 0)
            ckptfs_tree_add_dir(tree, root, name);
        else if (i % 5 == 1)
            ckptfs_tree_add_symlink(tree, root, name, "e00");
        else
            ckptfs_tree_add_file(tree, root, name, plan_of, &c, &key_hello);
    }
    Listing all;
    listing_init(&all, 1000);
    int rc = ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, 0, collect, &all, NULL);
    int built_by_readdir = c.built;
    bool order = all.names->len == N;
    bool next_ok = true, ino_ok = true;
    for (guint i = 0; order && i < all.names->len; i++) {
        char want[16];
        g_snprintf(want, sizeof want, "e%02d", N - 1 - (int)i);
        order &= strcmp(g_ptr_array_index(all.names, i), want) == 0;
        next_ok &= g_array_index(all.next, uint64_t, i) == i + 1;
        CkptfsAttr a;
        ino_ok &= ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, g_ptr_array_index(all.names, i), &a, NULL) == 0 &&
                  a.ino == g_array_index(all.inos, uint64_t, i) &&
                  (int)a.type == g_array_index(all.types, int, i);
    }
    tap_ok(rc == 0 && order, "readdir lists every entry in insertion order, without . and ..");
    tap_ok(next_ok, "each entry's next offset is its index + 1");
    tap_ok(ino_ok, "readdir's inode and type agree with lookup");
    tap_ok(built_by_readdir == 0 && c.built == 15,
           "plans are built by lookups, not by readdir (%d after readdir, %d after 15 file lookups)",
           built_by_readdir, c.built);

    /* Resuming at every offset. */
    bool resume_ok = true;
    for (uint64_t off = 0; off <= N + 2; off++) {
        Listing part;
        listing_init(&part, 1000);
        resume_ok &= ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, off, collect, &part, NULL) == 0;
        uint64_t want = off >= N ? 0 : N - off;
        resume_ok &= part.names->len == want;
        for (guint i = 0; resume_ok && i < part.names->len; i++)
            resume_ok &= strcmp(g_ptr_array_index(part.names, i), g_ptr_array_index(all.names, off + i)) == 0 &&
                         g_array_index(part.next, uint64_t, i) == off + i + 1;
        listing_clear(&part);
    }
    tap_ok(resume_ok, "readdir from every offset 0..%d lists the rest (nothing past the end)", N + 2);

    /* A small buffer: FN says full after 4 entries; continuing from the last next offset. */
    GPtrArray *seen = g_ptr_array_new_with_free_func(g_free);
    uint64_t off = 0;
    int calls = 0;
    while (calls++ < 100) {
        Listing part;
        listing_init(&part, 4);
        ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, off, collect, &part, NULL);
        for (guint i = 0; i < part.names->len; i++)
            g_ptr_array_add(seen, g_strdup(g_ptr_array_index(part.names, i)));
        bool done = part.names->len == 0;
        if (!done)
            off = g_array_index(part.next, uint64_t, part.names->len - 1);
        listing_clear(&part);
        if (done)
            break;
    }
    bool same = seen->len == all.names->len;
    for (guint i = 0; same && i < seen->len; i++)
        same &= strcmp(g_ptr_array_index(seen, i), g_ptr_array_index(all.names, i)) == 0;
    tap_ok(same && calls == 8, "a full buffer stops the listing; resuming at the last next offset "
                               "loses and repeats nothing (%d calls)", calls);
    g_ptr_array_unref(seen);

    /* A name added later is listed at the end; earlier offsets are unchanged. */
    ckptfs_tree_add_file(tree, root, "late", plan_of, &c, &key_hello);
    Listing after;
    listing_init(&after, 1000);
    ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, N, collect, &after, NULL);
    tap_ok(after.names->len == 1 && strcmp(g_ptr_array_index(after.names, 0), "late") == 0,
           "an entry added later appears after the others (offset %d)", N);
    listing_clear(&after);
    listing_clear(&all);
    ckptfs_tree_free(tree);
}

static void test_hooks(void)
{
    Counters c = {0};
    Hooks h = {.counters = &c, .hello = &key_hello};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    CkptfsNode *lazy = ckptfs_tree_add_dir(tree, root, "lazy");
    ckptfs_tree_set_dir_hooks(tree, lazy, populate_lazy, resolve_made, &h);
    CkptfsNode *resolving = ckptfs_tree_add_dir(tree, root, "resolving");
    ckptfs_tree_set_dir_hooks(tree, resolving, NULL, resolve_made, &h);
    CkptfsNode *broken = ckptfs_tree_add_dir(tree, root, "broken");
    ckptfs_tree_set_dir_hooks(tree, broken, populate_broken, NULL, &h);

    /* Listing the root does not fill its subdirectories. */
    Listing l;
    listing_init(&l, 100);
    ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, 0, collect, &l, NULL);
    listing_clear(&l);
    tap_is_u64(h.populate_calls, 0, "listing the parent does not populate a lazy directory");

    CkptfsAttr a;
    int rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "lazy", &a, NULL);
    uint64_t lazy_ino = a.ino;
    tap_ok(rc == 0 && h.populate_calls == 1 && a.nlink == 3,
           "looking a lazy directory up populates it once (nlink 3 with its one subdir; calls %d)",
           h.populate_calls);
    listing_init(&l, 100);
    ckptfs_tree_readdir(tree, lazy_ino, 0, collect, &l, NULL);
    g_autofree char *names = joined(&l);
    listing_clear(&l);
    ckptfs_tree_lookup(tree, lazy_ino, "a", &a, NULL);
    ckptfs_tree_getattr(tree, lazy_ino, &a, NULL);
    tap_ok(strcmp(names, "a b sub") == 0 && h.populate_calls == 1,
           "its listing is what populate added (%s); populate ran once in all", names);

    /* Resolve: a name that is not there yet is created on lookup, once. */
    rc = ckptfs_tree_lookup(tree, lazy_ino, "made-1", &a, NULL);
    uint64_t made_ino = a.ino;
    int calls_after_first = h.resolve_calls;
    CkptfsAttr again;
    int rc2 = ckptfs_tree_lookup(tree, lazy_ino, "made-1", &again, NULL);
    tap_ok(rc == 0 && a.type == CKPTFS_NODE_FILE && a.size == 8 && rc2 == 0 && again.ino == made_ino &&
               h.resolve_calls == calls_after_first && calls_after_first == 1,
           "a name resolved on lookup becomes a node: same inode later, resolve called once");
    tap_ok(ckptfs_tree_lookup(tree, lazy_ino, "a", &a, NULL) == 0 && h.resolve_calls == 1,
           "names that exist do not go through resolve");
    listing_init(&l, 100);
    ckptfs_tree_readdir(tree, lazy_ino, 0, collect, &l, NULL);
    g_autofree char *names2 = joined(&l);
    listing_clear(&l);
    tap_ok(strcmp(names2, "a b sub made-1") == 0, "the resolved name is listed after the others (%s)",
           names2);
    GError *error = NULL;
    rc = ckptfs_tree_lookup(tree, lazy_ino, "other", &a, &error);
    tap_ok(rc == -ENOENT && error && strstr(error->message, "'other' is not a name"),
           "resolve refusing a name: ENOENT with its reason (%s)", error ? error->message : "no error");
    g_clear_error(&error);
    rc = ckptfs_tree_resolve(tree, "resolving/dir-x/made-2", &a, NULL);
    tap_ok(rc == 0 && a.type == CKPTFS_NODE_FILE,
           "resolve hooks chain along a path: a directory made on lookup, then a file in it (rc %d)", rc);
    rc = ckptfs_tree_resolve(tree, "resolving/dir-x", &again, NULL);
    tap_ok(rc == 0 && again.type == CKPTFS_NODE_DIR && again.nlink == 2,
           "a directory made on lookup is found again as it is (nlink 2: no subdirectories)");
    CkptfsAttr r;
    ckptfs_tree_getattr(tree, CKPTFS_ROOT_INO, &r, NULL);
    tap_is_u64(r.nlink, 5, "root nlink counts lazy, resolving, broken");

    /* A directory that cannot be filled. */
    rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "broken", &a, &error);
    tap_ok(rc == -EIO && error && strstr(error->message, "cannot be listed"),
           "a directory whose populate fails: EIO with the reason (%s)", error ? error->message : "none");
    g_clear_error(&error);

    ckptfs_tree_free(tree);
}

/* A file whose plan cannot be built: EIO with the reason, on lookup and on plan. */
static void test_plan_errors(void)
{
    Counters c = {0};
    static const FileKey bad = {NULL, -1, -1, true};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    CkptfsNode *f = ckptfs_tree_add_file(tree, root, "bad", plan_of, &c, &bad);
    GError *error = NULL;
    CkptfsAttr a;
    int rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "bad", &a, &error);
    tap_ok(rc == -EIO && error && strstr(error->message, "no luck"),
           "lookup of a file whose plan fails: EIO with the reason (%s)", error ? error->message : "none");
    g_clear_error(&error);
    const CkptfsPlan *p = NULL;
    rc = ckptfs_tree_plan(tree, 2, &p, NULL, &error);
    tap_ok(f && rc == -EIO && p == NULL && error, "ckptfs_tree_plan of it: EIO, no plan");
    g_clear_error(&error);
    ckptfs_tree_free(tree);
}

/* Access: set_access decides; files take their plan's access, computed once with the plan. */
typedef struct {
    const CkptfsSrcFiles *files;
    Counters *counters;
} AccessCtx;

static CkptfsAccess access_of(gpointer owner, gpointer scope, const CkptfsPlan *plan)
{
    (void)scope;
    AccessCtx *ctx = owner;
    g_atomic_int_inc(&ctx->counters->accessed);
    g_autoptr(GArray) srcs = g_array_new(FALSE, FALSE, sizeof(guint32));
    ckptfs_plan_sources(plan, srcs);
    return ckptfs_srcfiles_access(ctx->files, (const uint32_t *)(void *)srcs->data, srcs->len, 4242, 4343);
}

static void test_access(void)
{
    g_autofree char *dir = g_dir_make_tmp("ckptfs-tree-XXXXXX", NULL);
    CkptfsSrcFiles *files = ckptfs_srcfiles_new(0);
    static const unsigned modes[] = {0640, 0604, 0444};
    for (int i = 0; i < 3; i++) {
        g_autofree char *path = g_strdup_printf("%s/s%d", dir, i);
        g_file_set_contents(path, "0123456789abcdefXXXX", 20, NULL);
        g_chmod(path, modes[i]);
        ckptfs_srcfiles_add(files, path, NULL);
    }
    uint32_t uid = (uint32_t)geteuid(), gid = (uint32_t)getegid();
    Counters c = {0};
    AccessCtx ctx = {files, &c};
    CkptfsTree *tree = ckptfs_tree_new();
    ckptfs_tree_set_access(tree, access_of, &ctx, (CkptfsAccess){1001, 1002, 0550});
    CkptfsNode *root = ckptfs_tree_root(tree);
    static const FileKey k0 = {NULL, 0, -1, false}, k01 = {"x", 0, 1, false}, k2 = {NULL, 2, -1, false},
                         klit = {"generated", -1, -1, false};
    ckptfs_tree_add_file(tree, root, "from0", plan_of, &c, &k0);
    ckptfs_tree_add_file(tree, root, "from01", plan_of, &c, &k01);
    ckptfs_tree_add_file(tree, root, "from2", plan_of, &c, &k2);
    ckptfs_tree_add_file(tree, root, "literal", plan_of, &c, &klit);
    CkptfsNode *sub = ckptfs_tree_add_dir(tree, root, "sub");
    ckptfs_tree_add_symlink(tree, sub, "link", "../from0");

    CkptfsAttr a;
    ckptfs_tree_getattr(tree, CKPTFS_ROOT_INO, &a, NULL);
    tap_ok(a.access.uid == 1001 && a.access.gid == 1002 && a.access.mode == 0550,
           "the root directory has the directory access (%u:%u %o)", a.access.uid, a.access.gid,
           a.access.mode);
    ckptfs_tree_resolve(tree, "sub", &a, NULL);
    tap_ok(a.access.uid == 1001 && a.access.mode == 0550, "subdirectories too");
    ckptfs_tree_lookup(tree, a.ino, "link", &a, NULL); /* the link itself: resolve follows it */
    tap_ok(a.access.uid == 1001 && a.access.gid == 1002 && a.access.mode == 0777,
           "symlinks: the directory owner, 0777");
    /* resolve follows links from their own directory (a short layout name), not in circles. */
    ckptfs_tree_add_symlink(tree, root, "short", "sub");
    ckptfs_tree_add_symlink(tree, root, "loop", "loop");
    CkptfsAttr sub_attr;
    ckptfs_tree_resolve(tree, "sub", &sub_attr, NULL);
    tap_ok(ckptfs_tree_resolve(tree, "short", &a, NULL) == 0 && a.ino == sub_attr.ino &&
               ckptfs_tree_resolve(tree, "short/.", &a, NULL) == 0 && a.ino == sub_attr.ino,
           "resolve follows a link to its target");
    tap_ok(ckptfs_tree_resolve(tree, "loop/x", &a, NULL) == -ELOOP, "a link to itself: ELOOP");

    struct {
        const char *name;
        unsigned mode;
    } want[] = {{"from0", 0440}, {"from01", 0400}, {"from2", 0444}, {"literal", 0400}};
    for (size_t i = 0; i < G_N_ELEMENTS(want); i++) {
        int rc = ckptfs_tree_resolve(tree, want[i].name, &a, NULL);
        tap_ok(rc == 0 && a.access.uid == uid && a.access.gid == gid && a.access.mode == want[i].mode,
               "%s: the read bits its source files all grant, their owner (%o, want %o)", want[i].name,
               a.access.mode, want[i].mode);
    }
    int before = c.accessed;
    for (int i = 0; i < 3; i++) {
        ckptfs_tree_resolve(tree, "from0", &a, NULL);
        ckptfs_tree_getattr(tree, a.ino, &a, NULL);
    }
    Listing l;
    listing_init(&l, 100);
    ckptfs_tree_readdir(tree, CKPTFS_ROOT_INO, 0, collect, &l, NULL);
    listing_clear(&l);
    tap_ok(before == 4 && c.accessed == 4 && c.built == 4,
           "access computed once per file, with its plan (%d access calls, %d plans)", c.accessed,
           c.built);

    ckptfs_tree_free(tree);
    ckptfs_srcfiles_free(files);
    for (int i = 0; i < 3; i++) {
        g_autofree char *path = g_strdup_printf("%s/s%d", dir, i);
        g_unlink(path);
    }
    g_rmdir(dir);
}

/* Many threads look up the same new names at once: one node per name, one plan per file. */
typedef struct {
    CkptfsTree *tree;
    uint64_t dir_ino;
    uint64_t inos[8];
    int errors;
} ThreadCtx;

static gpointer lookup_thread(gpointer data)
{
    ThreadCtx *t = data;
    for (int i = 0; i < 8; i++) {
        char name[16];
        if (i % 2)
            g_snprintf(name, sizeof name, "made-%d", i);
        else
            g_strlcpy(name, "a", sizeof name);
        CkptfsAttr a;
        if (ckptfs_tree_lookup(t->tree, t->dir_ino, name, &a, NULL) != 0)
            t->errors++;
        t->inos[i] = a.ino;
    }
    return NULL;
}

static void test_threads(void)
{
    Counters c = {0};
    Hooks h = {.counters = &c, .hello = &key_hello};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *lazy = ckptfs_tree_add_dir(tree, ckptfs_tree_root(tree), "lazy");
    ckptfs_tree_set_dir_hooks(tree, lazy, populate_lazy, resolve_made, &h);
    CkptfsAttr la;
    ckptfs_tree_resolve(tree, "lazy", &la, NULL);
    enum { T = 8 };
    ThreadCtx ctx[T];
    GThread *threads[T];
    for (int i = 0; i < T; i++) {
        ctx[i] = (ThreadCtx){.tree = tree, .dir_ino = la.ino};
        threads[i] = g_thread_new("lookup", lookup_thread, &ctx[i]);
    }
    for (int i = 0; i < T; i++)
        g_thread_join(threads[i]);
    bool same = true;
    int errors = 0;
    for (int i = 0; i < T; i++) {
        errors += ctx[i].errors;
        same &= memcmp(ctx[i].inos, ctx[0].inos, sizeof ctx[0].inos) == 0;
    }
    /* a (1 plan) + made-1, made-3, made-5, made-7 (4 plans). */
    tap_ok(errors == 0 && same && h.populate_calls == 1 && h.resolve_calls == 4 && c.built == 5,
           "%d threads looking up the same names: same inodes, populate once, each name resolved "
           "once, each plan built once (%d resolves, %d plans)", T, h.resolve_calls, c.built);
    ckptfs_tree_free(tree);
}

/* --- a slow hook stalls only its own node --- */

/* A gate the stalled hooks wait at until the test opens it; entered counts who got there. */
typedef struct {
    GMutex lock;
    GCond cond;
    int entered;
    bool open;
    int populate_calls;
    Counters *counters;
} Gate;

static void gate_wait(Gate *g)
{
    g_mutex_lock(&g->lock);
    g->entered++;
    g_cond_broadcast(&g->cond);
    while (!g->open)
        g_cond_wait(&g->cond, &g->lock);
    g_mutex_unlock(&g->lock);
}

/* Waits (at most SECONDS) until *FLAG, a field guarded by G's lock, is at least WANT. */
static bool gate_until(Gate *g, const int *flag, int want, int seconds)
{
    gint64 end = g_get_monotonic_time() + seconds * G_TIME_SPAN_SECOND;
    g_mutex_lock(&g->lock);
    while (*flag < want && g_cond_wait_until(&g->cond, &g->lock, end))
        ;
    bool reached = *flag >= want;
    g_mutex_unlock(&g->lock);
    return reached;
}

/* As a verl role opening its whole source: stalls at the gate, then adds "x". */
static bool populate_stalled(CkptfsTree *tree, CkptfsNode *dir, gpointer owner, GError **error)
{
    Gate *g = owner;
    g->populate_calls++;
    gate_wait(g);
    ckptfs_tree_add_file(tree, dir, "x", plan_of, g->counters, &key_hello);
    return true;
}

/* As a large plan being built: stalls at the gate. */
static CkptfsPlan *plan_stalled(gpointer owner, gconstpointer key, GError **error)
{
    Gate *g = owner;
    gate_wait(g);
    return plan_of(g->counters, key, error);
}

typedef struct {
    CkptfsTree *tree;
    const char *path;
    Gate *gate;
    int rc;
    int done; /* under the gate's lock */
    CkptfsAttr attr;
} Walker;

static gpointer resolve_thread(gpointer data)
{
    Walker *w = data;
    w->rc = ckptfs_tree_resolve(w->tree, w->path, &w->attr, NULL);
    g_mutex_lock(&w->gate->lock);
    w->done = 1;
    g_cond_broadcast(&w->gate->cond);
    g_mutex_unlock(&w->gate->lock);
    return NULL;
}

/* The rest of the tree while the stalled hooks wait: a directory filled on first use, a plan
 * built, a listing and the attributes of the root. */
static gpointer elsewhere_thread(gpointer data)
{
    Walker *w = data;
    CkptfsAttr a;
    Listing l;
    listing_init(&l, 100);
    w->rc = ckptfs_tree_resolve(w->tree, "lazy/a", &a, NULL);
    if (w->rc == 0)
        w->rc = ckptfs_tree_resolve(w->tree, "ready", &w->attr, NULL);
    if (w->rc == 0)
        w->rc = ckptfs_tree_readdir(w->tree, CKPTFS_ROOT_INO, 0, collect, &l, NULL);
    if (w->rc == 0)
        w->rc = ckptfs_tree_getattr(w->tree, CKPTFS_ROOT_INO, &a, NULL);
    listing_clear(&l);
    g_mutex_lock(&w->gate->lock);
    w->done = 1;
    g_cond_broadcast(&w->gate->cond);
    g_mutex_unlock(&w->gate->lock);
    return NULL;
}

static void test_stalled_hooks(void)
{
    Counters c = {0};
    Hooks h = {.counters = &c, .hello = &key_hello};
    Gate gate = {.counters = &c};
    g_mutex_init(&gate.lock);
    g_cond_init(&gate.cond);
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    CkptfsNode *slow = ckptfs_tree_add_dir(tree, root, "slow");
    ckptfs_tree_set_dir_hooks(tree, slow, populate_stalled, NULL, &gate);
    ckptfs_tree_add_file(tree, root, "slow-file", plan_stalled, &gate, &key_world);
    CkptfsNode *lazy = ckptfs_tree_add_dir(tree, root, "lazy");
    ckptfs_tree_set_dir_hooks(tree, lazy, populate_lazy, resolve_made, &h);
    ckptfs_tree_add_file(tree, root, "ready", plan_of, &c, &key_hello);

    Walker in_slow = {.tree = tree, .path = "slow", .gate = &gate};
    Walker slow_file = {.tree = tree, .path = "slow-file", .gate = &gate};
    Walker inside_slow = {.tree = tree, .path = "slow/x", .gate = &gate};
    Walker elsewhere = {.tree = tree, .gate = &gate};
    GThread *a = g_thread_new("slow", resolve_thread, &in_slow);
    GThread *p = g_thread_new("slow-file", resolve_thread, &slow_file);
    bool stalled = gate_until(&gate, &gate.entered, 2, 10);
    tap_ok(stalled, "a directory's populate hook and a file's plan build are stalled at once");
    GThread *x = g_thread_new("slow/x", resolve_thread, &inside_slow);
    GThread *b = g_thread_new("elsewhere", elsewhere_thread, &elsewhere);
    bool free_elsewhere = gate_until(&gate, &elsewhere.done, 1, 3);
    tap_ok(free_elsewhere && elsewhere.rc == 0 && elsewhere.attr.size == strlen(key_hello.text),
           "meanwhile lookups, a directory's first fill, a plan build, a listing and getattr elsewhere "
           "in the tree finish (%s)", free_elsewhere ? "done" : "still blocked after 3 s");
    g_mutex_lock(&gate.lock);
    bool waited = !inside_slow.done && !in_slow.done && !slow_file.done;
    gate.open = true;
    g_cond_broadcast(&gate.cond);
    g_mutex_unlock(&gate.lock);
    tap_ok(waited, "a lookup inside the stalled directory waits for its hook, not failing meanwhile");
    g_thread_join(a);
    g_thread_join(p);
    g_thread_join(x);
    g_thread_join(b);
    tap_ok(in_slow.rc == 0 && inside_slow.rc == 0 && inside_slow.attr.size == strlen(key_hello.text) &&
               slow_file.rc == 0 && slow_file.attr.size == strlen(key_world.text) && gate.populate_calls == 1,
           "once the hooks end: the directory was filled once and holds its file, the stalled plan is served "
           "(rc %d %d %d, %d fills)", in_slow.rc, inside_slow.rc, slow_file.rc, gate.populate_calls);
    ckptfs_tree_free(tree);
    g_cond_clear(&gate.cond);
    g_mutex_clear(&gate.lock);
}

static void free_counter(gpointer data)
{
    (*(int *)data)++;
}

static void test_own(void)
{
    int freed = 0;
    CkptfsTree *tree = ckptfs_tree_new();
    ckptfs_tree_own(tree, &freed, free_counter);
    ckptfs_tree_own(tree, &freed, free_counter);
    CkptfsNode *f = ckptfs_tree_add_file(tree, ckptfs_tree_root(tree), "s", plan_of,
                                         &(Counters){0}, &key_hello);
    CkptfsAttr a;
    tap_ok(ckptfs_tree_resolve(tree, "s", &a, NULL) == 0 && a.hints == 0, "a file has no hints of its own");
    ckptfs_tree_hint(f, CKPTFS_HINT_SCATTERED);
    ckptfs_tree_hint(f, CKPTFS_HINT_STREAMED);
    tap_ok(ckptfs_tree_resolve(tree, "s", &a, NULL) == 0 && a.hints == (CKPTFS_HINT_SCATTERED | CKPTFS_HINT_STREAMED),
           "hints given to a file add up in its attributes");
    ckptfs_tree_free(tree);
    tap_is_u64(freed, 2, "data the tree owns is freed with it");
}

/* A file whose plan is kept only while held (ckptfs_tree_plan_on_open): a stat builds it for its
 * size and drops it, opens build it again and share it while any holds it, and it reads the same
 * bytes every time; a file not marked keeps its one plan. */
typedef struct {
    CkptfsTree *tree;
    uint64_t ino;
    int bad; /* reads that gave other bytes */
} HolderCtx;

static gpointer holder_thread(gpointer data)
{
    HolderCtx *h = data;
    CkptfsSrcFiles *none = ckptfs_srcfiles_new(0);
    for (int i = 0; i < 300; i++) {
        const CkptfsPlan *plan = NULL;
        CkptfsAttr a;
        char buf[16] = {0};
        if (ckptfs_tree_getattr(h->tree, h->ino, &a, NULL) != 0 || a.size != 6 ||
            ckptfs_tree_plan(h->tree, h->ino, &plan, NULL, NULL) != 0) {
            h->bad++;
            continue;
        }
        if (ckptfs_plan_read(plan, CKPTFS_READ_SHARED(none), buf, sizeof buf, 0, NULL) != 6 ||
            memcmp(buf, "hello\n", 6) != 0)
            h->bad++;
        ckptfs_tree_plan_release(h->tree, h->ino);
    }
    ckptfs_srcfiles_free(none);
    return NULL;
}

static void test_plan_on_open(void)
{
    Counters c = {0};
    CkptfsTree *tree = ckptfs_tree_new();
    CkptfsNode *root = ckptfs_tree_root(tree);
    ckptfs_tree_plan_on_open(ckptfs_tree_add_file(tree, root, "big", plan_of, &c, &key_hello));
    ckptfs_tree_add_file(tree, root, "kept", plan_of, &c, &key_world);
    CkptfsAttr a, again;
    int rc = ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "big", &a, NULL);
    tap_ok(rc == 0 && a.size == 6 && c.built == 1, "plan_on_open: the first stat builds its plan for the size");
    rc = ckptfs_tree_getattr(tree, a.ino, &again, NULL);
    tap_ok(rc == 0 && again.size == 6 && c.built == 1, "later stats give the size without building it again");
    const CkptfsPlan *p1 = NULL, *p2 = NULL;
    ckptfs_tree_plan(tree, a.ino, &p1, NULL, NULL);
    tap_is_u64((uint64_t)c.built, 2, "an open builds the plan the stat dropped");
    ckptfs_tree_plan(tree, a.ino, &p2, NULL, NULL);
    rc = ckptfs_tree_getattr(tree, a.ino, &again, NULL);
    tap_ok(p1 && p1 == p2 && c.built == 2 && rc == 0 && again.size == 6,
           "a second open and a stat while it is held share the held plan");
    ckptfs_tree_plan_release(tree, a.ino);
    CkptfsSrcFiles *none = ckptfs_srcfiles_new(0);
    char buf[16] = {0};
    int64_t n = ckptfs_plan_read(p1, CKPTFS_READ_SHARED(none), buf, sizeof buf, 0, NULL);
    tap_ok(n == 6 && memcmp(buf, "hello\n", 6) == 0, "the plan stays while one holder is left");
    ckptfs_tree_plan_release(tree, a.ino);
    const CkptfsPlan *p3 = NULL;
    ckptfs_tree_plan(tree, a.ino, &p3, NULL, NULL);
    memset(buf, 0, sizeof buf);
    n = p3 ? ckptfs_plan_read(p3, CKPTFS_READ_SHARED(none), buf, sizeof buf, 0, NULL) : -1;
    tap_ok(c.built == 3 && n == 6 && memcmp(buf, "hello\n", 6) == 0,
           "released by all, it is dropped: the next open builds it again and reads the same bytes");
    ckptfs_tree_plan_release(tree, a.ino);
    ckptfs_tree_plan_release(tree, a.ino); /* one too many: ignored */

    CkptfsAttr k;
    const CkptfsPlan *k1 = NULL, *k2 = NULL;
    ckptfs_tree_lookup(tree, CKPTFS_ROOT_INO, "kept", &k, NULL);
    ckptfs_tree_plan(tree, k.ino, &k1, NULL, NULL);
    ckptfs_tree_plan_release(tree, k.ino);
    ckptfs_tree_plan(tree, k.ino, &k2, NULL, NULL);
    ckptfs_tree_plan_release(tree, k.ino);
    tap_ok(k1 && k1 == k2 && c.built == 4, "a file not marked keeps its one plan after a release");

    enum { T = 4 };
    HolderCtx ctx[T];
    GThread *threads[T];
    for (int i = 0; i < T; i++) {
        ctx[i] = (HolderCtx){tree, a.ino, 0};
        threads[i] = g_thread_new("holder", holder_thread, &ctx[i]);
    }
    int bad = 0;
    for (int i = 0; i < T; i++) {
        g_thread_join(threads[i]);
        bad += ctx[i].bad;
    }
    tap_ok(bad == 0, "4 threads stat, open, read and release it 300 times each: every read right (%d wrong)", bad);
    ckptfs_srcfiles_free(none);
    ckptfs_tree_free(tree);
}

int main(void)
{
    test_basic();
    test_readdir();
    test_hooks();
    test_plan_errors();
    test_access();
    test_threads();
    test_stalled_hooks();
    test_own();
    test_plan_on_open();
    return tap_done();
}
