/*
 * regress: runs a fuzz harness over files, without libFuzzer, so that
 * `make check` (and its sanitizer build) replays the seed corpus and every
 * input that once crashed or hung.
 *
 *   regress_NAME PATH...   each PATH a file or a directory of files
 *
 * Exits 0 after running them all (a crash ends it earlier with the
 * sanitizer's report), 2 when a path cannot be read or no input was found.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "src/base/files.h"
#include "src/base/util.h"
#include "tests/fuzz/fuzz.h"

static int run_file(const char *path) {
    size_t len = 0;
    Err e;
    char *buf = read_file(path, SIZE_MAX, &len, &e);
    if (!buf) {
        fprintf(stderr, "regress: %s\n", e.msg);
        return -1;
    }
    /* an exact-size copy, so that reading one byte past the input is caught */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) return -1;
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file in dir, in name order. Returns the count or -1. */
static int run_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        names = xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = xstrdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) != 0) count = -1;
            else if (count >= 0) count++;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv) {
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int k;
        if (stat(argv[i], &st) != 0) k = -1;
        else if (S_ISDIR(st.st_mode)) k = run_dir(argv[i]);
        else k = run_file(argv[i]) == 0 ? 1 : -1;
        if (k < 0) {
            fprintf(stderr, "regress: cannot read '%s'\n", argv[i]);
            return 2;
        }
        total += k;
    }
    if (total == 0) {
        fprintf(stderr, "regress: no input to run\n");
        return 2;
    }
    printf("regress: %d inputs ran\n", total);
    return 0;
}
