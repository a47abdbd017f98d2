#include "daemon.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#include "ckptfs/error.h"
#include "ckptfs/units.h"
#include "fuse_ops.h"
#include "passthrough.h"
#include "readahead.h"
#include "transport.h"

const char *ckptfs_libfuse_version(void)
{
    return G_STRINGIFY(FUSE_MAJOR_VERSION) "." G_STRINGIFY(FUSE_MINOR_VERSION);
}

static void mount_usage(FILE *out)
{
    g_autofree char *options_help = ckptfs_options_help();
    fprintf(out,
            "usage: ckptfs mount [-f] [-d] [-o OPTIONS] SRC MNT\n"
            "  -f          stay in the foreground\n"
            "  -d          debug: print every FUSE request (implies -f)\n"
            "  -o OPTIONS  comma-separated; ckptfs options:\n%s"
            "              nonempty    mount over a non-empty directory or another ckptfs mount\n"
            "              max_threads=N  FUSE worker threads at most (default 16, up to 256)\n"
            "              max_idle_threads=N  idle workers kept (default: libfuse's)\n"
            "              clone_fd    a /dev/fuse descriptor per worker thread (default off)\n"
            "              passthrough=auto|on|off  the kernel reads hf/ files that are source files\n"
            "                           unchanged straight from the source (default auto: where it\n"
            "                           can, root, Linux 6.9+, libfuse 3.17+; a source file rewritten\n"
            "                           in place is then not detected); passthrough alone is on\n"
            "              io_uring=auto|on|off  FUSE over io_uring (default off; auto: where this\n"
            "                           build's libfuse 3.18+ has it and the kernel allows it; on:\n"
            "                           refuse to mount without it)\n"
            "              FUSE options: allow_other, auto_unmount, fsname=NAME, and the other\n"
            "              options of mount.fuse3(8); default_permissions is always on\n"
            "Unmount with: fusermount3 -u MNT\n",
            options_help);
}

/* Options that mount(8) and fstab hand over but that mean nothing to a FUSE file system. */
static bool is_mount8_only(const char *opt)
{
    /* exec/noexec, suid/nosuid, dev/nodev, sync/async, atime/noatime go to libfuse, which
     * applies them as mount flags. */
    static const char *const ignored[] = {"ro", "defaults", "auto", "noauto", "nofail", "user",
                                          "users", "nouser", "_netdev", "owner", "group",
                                          "relatime", "norelatime", "strictatime", NULL};
    for (const char *const *p = ignored; *p; p++)
        if (strcmp(opt, *p) == 0)
            return true;
    return g_str_has_prefix(opt, "x-") || g_str_has_prefix(opt, "comment=");
}

typedef struct {
    bool foreground, debug;
    const char *src, *mnt;
    CkptfsOptions options;
    GPtrArray *fuse_opts; /* char* */
    bool has_fsname, has_subtype, nonempty;
    /* libfuse's session loop: worker threads, and whether each gets its own /dev/fuse queue */
    unsigned max_threads, max_idle_threads; /* 0: libfuse's default for idle */
    bool clone_fd;
    CkptfsPassthroughMode passthrough; /* hand files identical to a source file to the kernel (passthrough.h) */
    CkptfsUringMode io_uring;          /* the transport (transport.h) */
} MountArgs;

/* max_threads=N, max_idle_threads=N, clone_fd (the names libfuse's own command-line helper uses),
 * passthrough and io_uring: the session's settings. 1 taken, 0 not one of them, -1 a bad value. */
static int take_loop_option(MountArgs *a, const char *item)
{
    if (strcmp(item, "clone_fd") == 0) {
        a->clone_fd = true;
        return 1;
    }
    int taken = ckptfs_passthrough_take_option(&a->passthrough, item);
    if (taken == 0)
        taken = ckptfs_transport_take_option(&a->io_uring, item);
    if (taken != 0)
        return taken;
    unsigned *slot = g_str_has_prefix(item, "max_threads=")        ? &a->max_threads
                     : g_str_has_prefix(item, "max_idle_threads=") ? &a->max_idle_threads
                                                                   : NULL;
    if (slot == NULL)
        return 0;
    const char *value = strchr(item, '=') + 1;
    uint64_t n;
    if (!ckptfs_parse_uint(value, 1, 256, &n, NULL)) {
        fprintf(stderr, "ckptfs: option %s: expected a number of threads from 1 to 256\n", item);
        return -1;
    }
    *slot = (unsigned)n;
    return 1;
}

static bool take_options(MountArgs *a, const char *list)
{
    g_auto(GStrv) items = g_strsplit(list, ",", -1);
    for (char **item = items; *item; item++) {
        if (**item == '\0' || is_mount8_only(*item))
            continue;
        if (strcmp(*item, "nonempty") == 0) { /* ours: libfuse 3 dropped it */
            a->nonempty = true;
            continue;
        }
        int loop = take_loop_option(a, *item);
        if (loop != 0) {
            if (loop < 0)
                return false;
            continue;
        }
        if (strcmp(*item, "rw") == 0) {
            fprintf(stderr, "ckptfs: option rw: ckptfs is a read-only file system\n");
            return false;
        }
        GError *error = NULL;
        switch (ckptfs_options_apply(&a->options, *item, &error)) {
        case CKPTFS_OPTION_TAKEN:
            break;
        case CKPTFS_OPTION_BAD:
            fprintf(stderr, "ckptfs: %s\n", error->message);
            g_error_free(error);
            return false;
        case CKPTFS_OPTION_UNKNOWN:
            a->has_fsname |= g_str_has_prefix(*item, "fsname=");
            a->has_subtype |= g_str_has_prefix(*item, "subtype=");
            g_ptr_array_add(a->fuse_opts, g_strdup(*item));
            break;
        }
    }
    return true;
}

/* Returns 0 when parsed, 1 on a usage error, 2 for --help. */
static int parse_args(MountArgs *a, int argc, char **argv)
{
    const char *positional[2];
    int npos = 0;
    bool options_done = false; /* after "--" every argument is a path */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!options_done && strcmp(arg, "--") == 0) {
            options_done = true;
            continue;
        }
        if (!options_done && (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0))
            return 2;
        if (options_done) {
            if (npos >= 2) {
                fprintf(stderr, "ckptfs: unexpected argument '%s'\n", arg);
                return 1;
            }
            positional[npos++] = arg;
        } else if (strcmp(arg, "-f") == 0) {
            a->foreground = true;
        } else if (strcmp(arg, "-d") == 0) {
            a->debug = a->foreground = true;
        } else if (strcmp(arg, "-o") == 0 || g_str_has_prefix(arg, "-o")) {
            const char *list = arg[2] ? arg + 2 : (i + 1 < argc ? argv[++i] : NULL);
            if (list == NULL) {
                fprintf(stderr, "ckptfs: -o needs an option list\n");
                return 1;
            }
            if (!take_options(a, list))
                return 1;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            fprintf(stderr, "ckptfs: unknown argument '%s'\n", arg);
            return 1;
        } else if (npos < 2) {
            positional[npos++] = arg;
        } else {
            fprintf(stderr, "ckptfs: unexpected argument '%s'\n", arg);
            return 1;
        }
    }
    if (npos != 2) {
        mount_usage(stderr);
        return 1;
    }
    a->src = positional[0];
    a->mnt = positional[1];
    return 0;
}

/* The device ("major:minor") of the ckptfs file system mounted at MNT, or NULL, from
 * mountinfo (a stat of a mount point this process serves would wait for our own reply). */
static char *ckptfs_mount_device(const char *mnt)
{
    g_autofree char *real = realpath(mnt, NULL);
    g_autofree char *info = NULL;
    if (real == NULL || !g_file_get_contents("/proc/self/mountinfo", &info, NULL, NULL))
        return NULL;
    g_auto(GStrv) lines = g_strsplit(info, "\n", -1);
    for (char **line = lines; *line; line++) {
        g_auto(GStrv) f = g_strsplit(*line, " ", 6);
        if (g_strv_length(f) >= 5 && strcmp(f[4], real) == 0 && strstr(*line, " fuse.ckptfs "))
            return g_strdup(f[2]);
    }
    return NULL;
}

static bool dir_is_empty(const char *dir)
{
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    return d == NULL || g_dir_read_name(d) == NULL; /* GDir skips . and .. */
}

static bool check_mountpoint(const char *mnt, bool nonempty)
{
    struct stat st;
    if (stat(mnt, &st) != 0) {
        fprintf(stderr, "ckptfs: mount point %s: %s\n", mnt, g_strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "ckptfs: mount point %s: not a directory\n", mnt);
        return false;
    }
    if (nonempty)
        return true;
    g_autofree char *device = ckptfs_mount_device(mnt);
    if (device != NULL) {
        fprintf(stderr, "ckptfs: mount point %s: already a ckptfs mount (unmount it first, or "
                        "-o nonempty to mount over it)\n", mnt);
        return false;
    }
    if (!dir_is_empty(mnt)) {
        fprintf(stderr, "ckptfs: mount point %s: not empty (-o nonempty mounts over it)\n", mnt);
        return false;
    }
    return true;
}

/* VALUE as one item of a libfuse option list, which splits at commas and takes a backslash
 * as an escape: a path with a comma must not become a second option. */
static char *escape_option_value(const char *value)
{
    GString *out = g_string_new(NULL);
    for (const char *p = value; *p; p++) {
        if (*p == ',' || *p == '\\')
            g_string_append_c(out, '\\');
        g_string_append_c(out, *p);
    }
    return g_string_free(out, FALSE);
}

static struct timespec newest_source_mtime(const CkptfsMount *mount)
{
    struct stat st;
    if (mount->source == NULL) /* a verl run: its directory's, changed as steps are saved */
        return stat(mount->run_dir, &st) == 0 ? st.st_mtim : (struct timespec){0};
    const CkptfsSource *source = mount->source;
    int64_t newest = 0;
    for (unsigned i = 0; i < ckptfs_srcfiles_count(source->files); i++) {
        int64_t m = ckptfs_srcfiles_get(source->files, i)->mtime_ns;
        if (m > newest)
            newest = m;
    }
    return (struct timespec){.tv_sec = newest / 1000000000, .tv_nsec = newest % 1000000000};
}

/* The sysfs read-ahead knob of the new mount's device. NULL when not found. */
static char *read_ahead_knob(const char *mnt)
{
    g_autofree char *device = ckptfs_mount_device(mnt);
    return device ? g_strdup_printf("/sys/class/bdi/%s/read_ahead_kb", device) : NULL;
}

/* A run's roles are opened on lookup, long after the mount: their warnings go to the log. */
static void log_role_warning(gpointer ctx, const char *where, const char *line)
{
    ckptfs_fuse_log(ctx, "%s: warning: %s", where, line);
}

static int serve(MountArgs *a, CkptfsMount *mount, const char *abs_src, CkptfsTransport *transport)
{
    CkptfsFuseContext ctx = {.mount = mount,
                             .mtime = newest_source_mtime(mount),
                             .foreground = a->foreground,
                             .passthrough = ckptfs_passthrough_new(a->passthrough),
                             .transport = transport};
    /* A key per mount, not a GPrivate: glib allocates one of those once and never frees it. The
     * workers' buffers are freed as they exit, before the loop returns. */
    if (pthread_key_create(&ctx.read_buffer, ckptfs_read_buffer_free) != 0) {
        fprintf(stderr, "ckptfs: cannot create a thread-specific key\n");
        ckptfs_passthrough_free(ctx.passthrough);
        return 1;
    }
    if (a->passthrough == CKPTFS_PASSTHROUGH_ON && !ckptfs_passthrough_built())
        fprintf(stderr, "ckptfs: warning: passthrough: this ckptfs was built with libfuse %s (3.17 or later "
                        "needed); files are read through the daemon\n", ckptfs_libfuse_version());
    g_autoptr(GPtrArray) argv = g_ptr_array_new_with_free_func(g_free);
    g_ptr_array_add(argv, g_strdup("ckptfs"));
    if (a->debug)
        g_ptr_array_add(argv, g_strdup("-d"));
    g_autoptr(GString) opts = g_string_new("ro");
    if (!a->has_fsname) {
        g_autofree char *escaped = escape_option_value(abs_src);
        g_string_append_printf(opts, ",fsname=%s", escaped);
    }
    if (!a->has_subtype)
        g_string_append(opts, ",subtype=ckptfs");
    /* Files carry their sources' owners and modes: the kernel enforces them. */
    g_string_append(opts, ",default_permissions");
    for (guint i = 0; i < a->fuse_opts->len; i++)
        g_string_append_printf(opts, ",%s", (char *)g_ptr_array_index(a->fuse_opts, i));
    g_string_append(opts, ckptfs_transport_session_option(transport));
    g_ptr_array_add(argv, g_strdup("-o"));
    g_ptr_array_add(argv, g_strdup(opts->str));
    struct fuse_args args = FUSE_ARGS_INIT((int)argv->len, (char **)argv->pdata);

    ckptfs_mount_set_log(mount, log_role_warning, &ctx);
    struct fuse_session *se = fuse_session_new(&args, &ckptfs_fuse_ops, sizeof ckptfs_fuse_ops, &ctx);
    if (se == NULL) {
        fprintf(stderr, "ckptfs: cannot start the FUSE session (bad option in '%s'?)\n", opts->str);
        fuse_opt_free_args(&args);
        return 1;
    }
    int status = 1;
    if (fuse_set_signal_handlers(se) != 0)
        goto out_destroy;
    if (fuse_session_mount(se, a->mnt) != 0) {
        fprintf(stderr, "ckptfs: cannot mount on %s\n", a->mnt);
        goto out_signals;
    }
    ctx.read_ahead_knob = read_ahead_knob(a->mnt);
    if (!a->foreground)
        openlog("ckptfs", LOG_PID, LOG_DAEMON);
    /* The parent returns from here once the child is serving. */
    if (fuse_daemonize(a->foreground) != 0)
        goto out_unmount;
    /* After the fork (the watcher is a thread), before the workers (they inherit the mask). */
    if (mount->options.mapped_reads) {
        GError *why = NULL;
        ctx.leases = ckptfs_leases_block_signals() ? ckptfs_lease_watch_new(&why) : NULL;
        if (ctx.leases == NULL) {
            ckptfs_fuse_log(&ctx, "%s; mapped reads are off", why ? why->message : "mapped reads: cannot block the lease signals");
            g_clear_error(&why);
        }
    }
    ckptfs_fs_readahead_start(&ctx, se); /* its threads: after the fork and the mask */
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, a->max_threads ? a->max_threads : 16);
    if (a->max_idle_threads)
        fuse_loop_cfg_set_idle_threads(config, a->max_idle_threads);
    fuse_loop_cfg_set_clone_fd(config, a->clone_fd);
    ckptfs_fuse_open_files_init(&ctx);
    status = fuse_session_loop_mt(se, config) == 0 ? 0 : 1;
    fuse_loop_cfg_destroy(config);
    ckptfs_fuse_open_files_free(&ctx); /* those never released (their read-ahead closed) */
    ckptfs_fs_readahead_free(&ctx); /* before the session's descriptor is closed */
    ckptfs_lease_watch_free(ctx.leases);
out_unmount:
    fuse_session_unmount(se);
out_signals:
    fuse_remove_signal_handlers(se);
out_destroy:
    fuse_session_destroy(se);
    fuse_opt_free_args(&args); /* the copy libfuse makes when it adds an argument */
    g_free(ctx.read_ahead_knob);
    ckptfs_passthrough_free(ctx.passthrough);
    pthread_key_delete(ctx.read_buffer);
    return status;
}

static int validate_and_serve(MountArgs *a)
{
    if (!check_mountpoint(a->mnt, a->nonempty))
        return 1;
    /* The daemon changes to / when it detaches: keep absolute source paths. */
    g_autofree char *abs_src = g_canonicalize_filename(a->src, NULL);
    GError *error = NULL;
    /* Before the source is read: io_uring=on is refused at once where it cannot work. */
    g_autoptr(CkptfsTransport) transport = ckptfs_transport_new(a->io_uring, &error);
    CkptfsMount *mount = transport ? ckptfs_mount_open(abs_src, &a->options, &error) : NULL;
    if (mount == NULL) {
        fprintf(stderr, "ckptfs: %s\n", error->message);
        g_error_free(error);
        return 1;
    }
    for (guint i = 0; mount->source && i < mount->source->warnings->len; i++)
        fprintf(stderr, "ckptfs: warning: %s\n",
                (char *)g_ptr_array_index(mount->source->warnings, i));
    int rc = serve(a, mount, abs_src, transport);
    ckptfs_mount_free(mount);
    return rc;
}

int ckptfs_cmd_mount(int argc, char **argv)
{
    /* io_uring off unless asked for: on a 16-core node it served 4-16 readers 14-17% slower than
     * /dev/fuse (docs/performance.md). */
    MountArgs a = {.io_uring = CKPTFS_URING_OFF};
    ckptfs_options_init(&a.options);
    a.fuse_opts = g_ptr_array_new_with_free_func(g_free);
    int rc = parse_args(&a, argc, argv);
    if (rc == 2) {
        mount_usage(stdout);
        rc = 0;
    } else if (rc == 0) {
        rc = validate_and_serve(&a);
    }
    g_ptr_array_unref(a.fuse_opts);
    ckptfs_options_clear(&a.options);
    return rc;
}
