/*
 * peakrss: runs a command and prints its peak resident set size, so that
 * tests can check how much memory a run really touched (AddressSanitizer
 * reserves terabytes of address space, which rules out `ulimit -v`).
 *
 *   peakrss OUT CMD [ARGS...]   writes the peak RSS in KiB of CMD to OUT
 *                               and exits with CMD's status
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: peakrss OUT CMD [ARGS...]\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("peakrss: fork");
        return 2;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        perror("peakrss: exec");
        _exit(127);
    }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) < 0) {
        perror("peakrss: wait4");
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f || fprintf(f, "%ld\n", ru.ru_maxrss) < 0 || fclose(f) != 0) {
        perror("peakrss: writing OUT");
        return 2;
    }
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
