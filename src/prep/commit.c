/*
 * commit: prep's output folder, a shard set (train*.bin, val*.bin) that
 * folder_set.c writes whole: --out checked, the temporary folders of preps
 * that died cleaned up, and the finished set renamed (or exchanged) into
 * place.
 */
#include "src/prep/prep_impl.h"

#include <string.h>

#include "src/base/files.h"

/* Whether name is one a shard set holds: train*.bin or val*.bin. */
static int is_shard_name(const char *name) {
    return (strncmp(name, "train", 5) == 0 || strncmp(name, "val", 3) == 0) &&
           ends_with(name, ".bin");
}

static void note(void *ctx, const char *line) {
    const PrepReport *rep = ctx;
    if (rep && rep->note) rep->note(rep->ctx, line);
}

int paths_make(Paths *p, const char *out, const PrepReport *rep, Err *err) {
    memset(p, 0, sizeof *p);
    p->tag = "prep";
    p->who = "prep";
    p->member = is_shard_name;
    p->what = "a shard set";
    p->other = "which is not a token shard; prep replaces only a folder of shards (train*.bin, "
               "val*.bin), even with --force: give another --out or move it";
    p->not_folder = "give a folder for the shards";
    p->note = note;
    p->ctx = (void *)rep;
    return fset_paths(p, out, err);
}
