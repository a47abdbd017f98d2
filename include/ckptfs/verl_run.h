/* verl's run directories: <run>/latest_checkpointed_iteration.txt ("N") and
 * <run>/global_step_N/<role>/ (actor, critic), each role directory one checkpoint. Names and
 * small files only: the checkpoints themselves are sources of their own. */
#ifndef CKPTFS_VERL_RUN_H
#define CKPTFS_VERL_RUN_H

#include <glib.h>
#include <stdbool.h>
#include <stdint.h>

#include "ckptfs/options.h"

/* N when NAME is "global_step_N" (N without sign or leading zeros); false otherwise. */
bool ckptfs_verl_step_name(const char *name, uint64_t *step);
/* Whether DIR holds global_step_N directories (a run). */
bool ckptfs_verl_is_run(const char *dir);
/* Whether DIR is named global_step_N and holds a role directory (a step). */
bool ckptfs_verl_is_step(const char *dir);
/* Whether DIR looks like one role's checkpoint (verl FSDP shards or a Megatron save). */
bool ckptfs_verl_is_role(const char *dir);

/* The steps of RUN present now, ascending (uint64_t). */
GArray *ckptfs_verl_steps(const char *run);
/* The latest step: the tracker's when its directory exists, else the highest present. False
 * with an error naming the run when it has none. */
bool ckptfs_verl_latest(const char *run, uint64_t *step, GError **error);
/* Why LATEST (ckptfs_verl_latest's answer) is not the tracker's step (it cannot be read: a
 * FIFO, a device, too large; it holds no number; it names a step not there), or NULL when it is
 * or there is no tracker; to be freed. The tracker is read as every small file is
 * (ckptfs_read_small_file): never blocking, never unbounded. */
char *ckptfs_verl_tracker_problem(const char *run, uint64_t latest);
/* The role directories of STEP_DIR, sorted by name. */
GPtrArray *ckptfs_verl_roles(const char *step_dir);

/* The role directory -o step= / role= pick in RUN (role defaults to the step's only role, or
 * actor); the error says what exists when it is not there. */
char *ckptfs_verl_pick_role(const char *run, const CkptfsOptions *options, GError **error);

#endif
