#ifndef CKPTFS_DAEMON_H
#define CKPTFS_DAEMON_H

/* `ckptfs mount [-f] [-d] [-o OPTS] SRC MNT`: validates the source, mounts, returns once the
 * mount is ready (the daemon stays in the background unless -f). Returns the exit status. */
int ckptfs_cmd_mount(int argc, char **argv);

/* The libfuse version this binary was built against ("3.14"): what the mount can ask of the
 * kernel depends on it (passthrough, shared mappings of direct-I/O files: 3.17). */
const char *ckptfs_libfuse_version(void);

#endif
