/* verl run directories by name (core/source/verl_run.c): step names, steps in numeric order,
 * the latest step (tracker, else the highest), role directories, and what -o step=/role= pick,
 * with errors naming what exists. */
#include <glib.h>
#include <glib/gstdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckptfs/error.h"
#include "ckptfs/options.h"
#include "ckptfs/verl_run.h"
#include "tap.h"

static void touch(const char *dir, const char *name, const char *text)
{
    g_autofree char *path = g_build_filename(dir, name, NULL);
    g_file_set_contents(path, text, -1, NULL);
}

/* RUN/global_step_N/ROLE with a fsdp_config.json (a role), or a bare directory (not a role). */
static void make_role(const char *run, unsigned step, const char *role, bool checkpoint)
{
    g_autofree char *dir = g_strdup_printf("%s/global_step_%u/%s", run, step, role);
    g_mkdir_with_parents(dir, 0755);
    if (checkpoint)
        touch(dir, "fsdp_config.json", "{\"FSDP_version\": 2, \"world_size\": 1}");
}

static void test_step_names(void)
{
    static const struct {
        const char *name;
        bool ok;
        uint64_t step;
    } cases[] = {{"global_step_0", true, 0},          {"global_step_7", true, 7},
                 {"global_step_18446744073709551615", true, UINT64_MAX},
                 {"global_step_18446744073709551616", false, 0}, {"global_step_", false, 0},
                 {"global_step_01", false, 0},        {"global_step_-1", false, 0},
                 {"global_step_3a", false, 0},        {"global_step_ 3", false, 0},
                 {"step_3", false, 0},                {"global_step_+3", false, 0}};
    int ok = 0;
    for (size_t i = 0; i < G_N_ELEMENTS(cases); i++) {
        uint64_t step = 0;
        bool got = ckptfs_verl_step_name(cases[i].name, &step);
        if (got == cases[i].ok && (!got || step == cases[i].step))
            ok++;
        else
            tap_diag("%s: %s", cases[i].name, got ? "accepted" : "refused");
    }
    tap_ok(ok == (int)G_N_ELEMENTS(cases), "step names: digits without sign or leading zero, within 64 bits (%d/%zu)",
           ok, G_N_ELEMENTS(cases));
}

static void test_run(void)
{
    g_autofree char *run = g_dir_make_tmp("ckptfs-verl-XXXXXX", NULL);
    make_role(run, 9, "actor", true);
    make_role(run, 10, "actor", true);
    make_role(run, 10, "critic", true);
    make_role(run, 10, "rollout_cache", false);
    make_role(run, 100, "actor", true);
    touch(run, "global_step_200", "a file, not a step");
    g_autofree char *odd = g_build_filename(run, "global_step_010", NULL);
    g_mkdir(odd, 0755);

    g_autoptr(GArray) steps = ckptfs_verl_steps(run);
    bool order = steps->len == 3 && g_array_index(steps, uint64_t, 0) == 9 &&
                 g_array_index(steps, uint64_t, 1) == 10 && g_array_index(steps, uint64_t, 2) == 100;
    tap_ok(order, "steps in numeric order (9, 10, 100), files and global_step_010 left out (%u found)", steps->len);
    tap_ok(ckptfs_verl_is_run(run), "a directory with global_step_N directories is a run");

    uint64_t latest = 0;
    tap_ok(ckptfs_verl_latest(run, &latest, NULL) && latest == 100, "no tracker: latest is the highest step");
    touch(run, "latest_checkpointed_iteration.txt", "10\n");
    tap_ok(ckptfs_verl_latest(run, &latest, NULL) && latest == 10, "the tracker's step (10) when it is there");
    g_autofree char *agreed = ckptfs_verl_tracker_problem(run, latest);
    tap_ok(agreed == NULL, "no problem when latest is the tracker's step");
    touch(run, "latest_checkpointed_iteration.txt", "55");
    bool found = ckptfs_verl_latest(run, &latest, NULL);
    g_autofree char *absent = ckptfs_verl_tracker_problem(run, latest);
    tap_ok(found && latest == 100 && absent && strstr(absent, "names step 55"),
           "a tracker naming a step not saved (an async save): the highest step, and why: %s", absent);
    touch(run, "latest_checkpointed_iteration.txt", "ten");
    found = ckptfs_verl_latest(run, &latest, NULL);
    g_autofree char *garbage = ckptfs_verl_tracker_problem(run, latest);
    tap_ok(found && latest == 100 && garbage && strstr(garbage, "holds no step number"),
           "a tracker without a number: the highest step, and why: %s", garbage);

    g_autofree char *step10 = g_build_filename(run, "global_step_10", NULL);
    g_autoptr(GPtrArray) roles = ckptfs_verl_roles(step10);
    tap_ok(roles->len == 2 && strcmp(g_ptr_array_index(roles, 0), "actor") == 0 &&
               strcmp(g_ptr_array_index(roles, 1), "critic") == 0,
           "roles: directories holding a checkpoint, sorted (a bare directory left out)");
    tap_ok(ckptfs_verl_is_step(step10) && !ckptfs_verl_is_step(run), "global_step_10 is a step, the run is not");

    CkptfsOptions o;
    ckptfs_options_init(&o);
    GError *error = NULL;
    g_autofree char *picked = ckptfs_verl_pick_role(run, &o, &error);
    g_autofree char *want = g_build_filename(run, "global_step_100", "actor", NULL);
    tap_ok(picked && strcmp(picked, want) == 0, "no options: the latest step's only role");
    o.step = g_strdup("10");
    g_autofree char *actor = ckptfs_verl_pick_role(run, &o, &error);
    tap_ok(actor && g_str_has_suffix(actor, "/global_step_10/actor"), "step=10 with two roles: actor");
    o.role = g_strdup("critic");
    g_autofree char *critic = ckptfs_verl_pick_role(run, &o, &error);
    tap_ok(critic && g_str_has_suffix(critic, "/global_step_10/critic"), "step=10,role=critic");
    g_free(o.role);
    o.role = g_strdup("rollout_cache");
    g_autofree char *none = ckptfs_verl_pick_role(run, &o, &error);
    tap_ok(none == NULL && error && strstr(error->message, "no role 'rollout_cache'") &&
               strstr(error->message, "roles: actor, critic"),
           "a role without a checkpoint is refused, naming the roles (%s)", error ? error->message : "no error");
    g_clear_error(&error);
    g_free(o.step);
    o.step = g_strdup("11");
    g_autofree char *missing = ckptfs_verl_pick_role(run, &o, &error);
    tap_ok(missing == NULL && error && strstr(error->message, "no step 11 (steps: 9, 10, 100)"),
           "a step not saved is refused, naming the steps (%s)", error ? error->message : "no error");
    g_clear_error(&error);
    ckptfs_options_clear(&o);

    g_autofree char *cmd = g_strdup_printf("rm -rf '%s'", run);
    tap_ok(system(cmd) == 0, "cleaned up");
}

int main(void)
{
    test_step_names();
    test_run();
    return tap_done();
}
