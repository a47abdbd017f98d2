/* ckptfs: the command-line entry point; dispatches to the commands. */
#include <stdio.h>
#include <string.h>

#include "ckptfs/srcfiles.h"
#include "commands.h"
#include "daemon.h"
#include "transport.h"

#ifndef CKPTFS_VERSION
#define CKPTFS_VERSION "0.0.0"
#endif

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ckptfs COMMAND ...\n"
            "  mount [-f] [-d] [-o OPTS] SRC MNT   mount checkpoint SRC read-only at MNT\n"
            "  inspect SRC [--json] [--layout NAME] [-o OPTS]\n                                      what SRC holds, which views it can show,\n                                      whether layout NAME is valid (and why not)\n"
            "  ls SRC [VIEW] [-o OPTS]             list the views, or the files of one view\n"
            "  cat SRC VIEW/FILE [-o OPTS]         write one synthesized file to stdout\n"
            "  export SRC VIEW DEST [-o OPTS]      write a view into the new directory DEST\n"
            "  pack SRC DEST [-o OPTS] [--verify]  copy SRC into the new directory DEST with its\n"
            "                                      tensor files compressed (see 'ckptfs pack --help')\n"
            "  --help, --version\n"
            "Unmount with: fusermount3 -u MNT. See 'ckptfs mount --help' for options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* Sources may have thousands of files: allow every descriptor the system lets us have. */
    ckptfs_raise_fd_limit();
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("ckptfs %s (libfuse %s; %s)\n", CKPTFS_VERSION, ckptfs_libfuse_version(), ckptfs_transport_build_info());
        return 0;
    }
    static const struct {
        const char *name;
        int (*run)(int, char **);
    } commands[] = {
        {"mount", ckptfs_cmd_mount},   {"inspect", ckptfs_cmd_inspect}, {"ls", ckptfs_cmd_ls},
        {"cat", ckptfs_cmd_cat},       {"export", ckptfs_cmd_export},
        {"pack", ckptfs_cmd_pack},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ckptfs: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
