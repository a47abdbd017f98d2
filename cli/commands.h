/* The ckptfs commands that work without FUSE, over core directly. Each returns an exit status. */
#ifndef CKPTFS_COMMANDS_H
#define CKPTFS_COMMANDS_H

int ckptfs_cmd_inspect(int argc, char **argv);
int ckptfs_cmd_ls(int argc, char **argv);
int ckptfs_cmd_cat(int argc, char **argv);
int ckptfs_cmd_export(int argc, char **argv);
int ckptfs_cmd_pack(int argc, char **argv);

#endif
