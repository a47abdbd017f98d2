#include "ckptfs/verl_run.h"

#include <string.h>
#include <sys/stat.h>

#include "ckptfs/error.h"
#include "ckptfs/limits.h"
#include "ckptfs/readfile.h"
#include "ckptfs/units.h"

#define STEP_PREFIX "global_step_"
#define TRACKER "latest_checkpointed_iteration.txt"

bool ckptfs_verl_step_name(const char *name, uint64_t *step)
{
    if (strncmp(name, STEP_PREFIX, strlen(STEP_PREFIX)) != 0)
        return false;
    const char *digits = name + strlen(STEP_PREFIX);
    if (digits[0] == '0' && digits[1] != '\0')
        return false;
    return ckptfs_parse_uint(digits, 0, G_MAXUINT64, step, NULL);
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_file(const char *dir, const char *name)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    return g_file_test(path, G_FILE_TEST_EXISTS);
}

bool ckptfs_verl_is_role(const char *dir)
{
    /* FSDP's config; Megatron's manifest (2026), model/ (2025 rank files, 2026) and dist_ckpt/
     * (2025-26). */
    static const char *const marks[] = {"fsdp_config.json", "ckpt_contents.json", "model", "dist_ckpt"};
    for (size_t i = 0; i < G_N_ELEMENTS(marks); i++)
        if (has_file(dir, marks[i]))
            return true;
    /* Older FSDP runs have no fsdp_config.json. */
    g_autoptr(GDir) d = g_dir_open(dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL)
        if (g_str_has_prefix(name, "model_world_size_") && g_str_has_suffix(name, ".pt"))
            return true;
    return false;
}

static int step_cmp(gconstpointer a, gconstpointer b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

GArray *ckptfs_verl_steps(const char *run)
{
    GArray *steps = g_array_new(FALSE, FALSE, sizeof(uint64_t));
    g_autoptr(GDir) d = g_dir_open(run, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        uint64_t step;
        g_autofree char *path = g_build_filename(run, name, NULL);
        if (ckptfs_verl_step_name(name, &step) && is_dir(path))
            g_array_append_val(steps, step);
    }
    g_array_sort(steps, step_cmp);
    return steps;
}

bool ckptfs_verl_is_run(const char *dir)
{
    g_autoptr(GArray) steps = ckptfs_verl_steps(dir);
    return steps->len > 0;
}

static int str_cmp(gconstpointer a, gconstpointer b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

GPtrArray *ckptfs_verl_roles(const char *step_dir)
{
    GPtrArray *roles = g_ptr_array_new_with_free_func(g_free);
    g_autoptr(GDir) d = g_dir_open(step_dir, 0, NULL);
    const char *name;
    while (d && (name = g_dir_read_name(d)) != NULL) {
        g_autofree char *path = g_build_filename(step_dir, name, NULL);
        if (is_dir(path) && ckptfs_verl_is_role(path))
            g_ptr_array_add(roles, g_strdup(name));
    }
    g_ptr_array_sort(roles, str_cmp);
    return roles;
}

bool ckptfs_verl_is_step(const char *dir)
{
    g_autofree char *base = g_path_get_basename(dir);
    uint64_t step;
    if (!ckptfs_verl_step_name(base, &step))
        return false;
    g_autoptr(GPtrArray) roles = ckptfs_verl_roles(dir);
    return roles->len > 0;
}

/* What the tracker says: a step (verl writes the bare number), or why it says none: it is not
 * there (verl writes none with async saves: *WHY stays NULL), cannot be read (a FIFO, a device, a
 * directory, too large: read as every small file is, never blocking or unbounded) or holds no
 * step number. */
static bool tracker_step(const char *run, uint64_t *step, char **why)
{
    g_autofree char *path = g_build_filename(run, TRACKER, NULL);
    g_autofree char *text = NULL;
    size_t len = 0;
    GError *read_error = NULL;
    *why = NULL;
    if (!ckptfs_read_small_file(path, CKPTFS_MAX_TRACKER_BYTES, &text, &len, &read_error)) {
        if (!g_error_matches(read_error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND))
            *why = g_strdup(read_error->message);
        g_error_free(read_error);
        return false;
    }
    bool has_nul = strlen(text) != len;
    g_strstrip(text);
    g_autofree char *name = g_strconcat(STEP_PREFIX, text, NULL);
    if (!has_nul && ckptfs_verl_step_name(name, step))
        return true;
    *why = g_strdup_printf("%s holds no step number", path);
    return false;
}

bool ckptfs_verl_latest(const char *run, uint64_t *step, GError **error)
{
    g_autoptr(GArray) steps = ckptfs_verl_steps(run);
    if (steps->len == 0) {
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: no global_step_N directories", run);
        return false;
    }
    uint64_t tracked;
    g_autofree char *why = NULL;
    if (tracker_step(run, &tracked, &why))
        for (guint i = 0; i < steps->len; i++)
            if (g_array_index(steps, uint64_t, i) == tracked) {
                *step = tracked;
                return true;
            }
    /* No tracker, an unreadable one, or one naming a step not there. */
    *step = g_array_index(steps, uint64_t, steps->len - 1);
    return true;
}

char *ckptfs_verl_tracker_problem(const char *run, uint64_t latest)
{
    uint64_t tracked;
    g_autofree char *why = NULL;
    if (!tracker_step(run, &tracked, &why))
        return why ? g_strdup_printf("%s: latest is the highest step, global_step_%" G_GUINT64_FORMAT, why, latest)
                   : NULL;
    if (tracked != latest) {
        g_autofree char *path = g_build_filename(run, TRACKER, NULL);
        return g_strdup_printf("%s names step %" G_GUINT64_FORMAT ", which is not there (a save still going on, or "
                               "deleted): latest is the highest step, global_step_%" G_GUINT64_FORMAT,
                               path, tracked, latest);
    }
    return NULL;
}

static char *joined_roles(const GPtrArray *roles)
{
    GString *s = g_string_new(NULL);
    for (guint i = 0; i < roles->len; i++)
        g_string_append_printf(s, "%s%s", i ? ", " : "", (const char *)g_ptr_array_index(roles, i));
    return g_string_free(s, FALSE);
}

char *ckptfs_verl_pick_role(const char *run, const CkptfsOptions *options, GError **error)
{
    uint64_t step;
    if (options->step == NULL || strcmp(options->step, "latest") == 0) {
        if (!ckptfs_verl_latest(run, &step, error))
            return NULL;
    } else {
        GError *parse_error = NULL;
        if (!ckptfs_parse_uint(options->step, 0, G_MAXUINT64, &step, &parse_error)) {
            g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_INVALID, "option step: %s", parse_error->message);
            g_error_free(parse_error);
            return NULL;
        }
    }
    g_autofree char *step_dir = g_strdup_printf("%s/" STEP_PREFIX "%" G_GUINT64_FORMAT, run, step);
    if (!is_dir(step_dir)) {
        g_autoptr(GArray) steps = ckptfs_verl_steps(run);
        GString *have = g_string_new(NULL);
        for (guint i = 0; i < steps->len; i++)
            g_string_append_printf(have, "%s%" G_GUINT64_FORMAT, i ? ", " : "", g_array_index(steps, uint64_t, i));
        g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: no step %" G_GUINT64_FORMAT " (steps: %s)",
                    run, step, have->str);
        g_string_free(have, TRUE);
        return NULL;
    }
    g_autoptr(GPtrArray) roles = ckptfs_verl_roles(step_dir);
    g_autofree char *all = joined_roles(roles);
    const char *role = options->role;
    if (role == NULL && roles->len == 1)
        role = g_ptr_array_index(roles, 0);
    else if (role == NULL)
        role = "actor";
    for (guint i = 0; i < roles->len; i++)
        if (strcmp(g_ptr_array_index(roles, i), role) == 0)
            return g_build_filename(step_dir, role, NULL);
    g_set_error(error, CKPTFS_ERROR, CKPTFS_ERROR_NOT_FOUND, "%s: no role '%s' with a checkpoint (roles: %s)%s",
                step_dir, role, roles->len ? all : "none", options->role ? "" : "; choose one with -o role=");
    return NULL;
}
