#ifndef CKPTFS_DAEMON_H
#define CKPTFS_DAEMON_H

/* `ckptfs mount [-f] [-d] [-o OPTS] SRC MNT`: validates the source, mounts, returns once the
 * mount is ready (the daemon stays in the background unless -f). Returns the exit status. */
int ckptfs_cmd_mount(int argc, char **argv);

#endif
