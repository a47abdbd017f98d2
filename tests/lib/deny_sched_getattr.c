/* Runs a command with sched_getattr(2) failing with EPERM (a seccomp filter), as under container
 * runtimes whose policies deny it. GLib then starts the threads of its shared thread pools from a
 * helper thread made with the first pool, which a process forked after that does not have: a
 * daemon must make its pools after it forks (pack.t).
 *
 *   deny_sched_getattr COMMAND [ARG...] */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: deny_sched_getattr COMMAND [ARG...]\n");
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_sched_getattr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("deny_sched_getattr: seccomp");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("deny_sched_getattr: exec");
    return 127;
}
