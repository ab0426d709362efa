/*
 * folder_set: a folder of files written whole, as a set: made beside its
 * place (OUT.TAG-tmp.HOST.PID), then renamed into place, or exchanged
 * with the set there (renameat2) and the old set removed; where the file
 * system cannot exchange, the old set is renamed aside first
 * (OUT.TAG-old.HOST.PID) and put back by the next writer if a crash came
 * between the renames. prep's shard sets and ckpt export's Hugging Face
 * folders are such sets. Every step is a fault point named TAG.commit.*,
 * TAG.remove.* or TAG.stale.*.
 */
#ifndef MODTRAIN_FOLDER_SET_H
#define MODTRAIN_FOLDER_SET_H

#include "src/base/util.h"

#define FSET_PATH 4096

typedef struct {
    /* what the caller sets */
    const char *tag;                  /* the temporary names' and fault points' word: "prep" */
    const char *who;                  /* the messages' first word: "prep", "ckpt export" */
    int (*member)(const char *name);  /* whether a file of that name is one a set holds */
    const char *what;                 /* a set in words: "a shard set" */
    const char *other;                /* the end of the line for a file that is no member */
    const char *not_folder;           /* the hint when --out is a file */
    void (*note)(void *ctx, const char *line); /* warnings and what was cleaned, or NULL */
    void *ctx;
    /* what fset_paths fills */
    char out[FSET_PATH], parent[FSET_PATH], base[256], tmp[FSET_PATH + 300], old[FSET_PATH + 300];
    char host[65]; /* this machine's name, in the temporary folders' names */
} FolderSet;

/* Fills fs's paths for a set at out. 0, or -1 with err set. */
int fset_paths(FolderSet *fs, const char *out, Err *err);
/* Removes the temporary folders of earlier writers into the same out on
 * this host that did not finish (their process gone); puts an old set
 * back when a crash left out missing. Another host's are left alone (said). */
void fset_clean_stale(const FolderSet *fs);
/* Checks out before the work: 0 when a set may go there (absent, empty, or
 * a set and replace), -1 with err. */
int fset_check_out(const FolderSet *fs, int replace, Err *err);
/* Moves the finished set in fs->tmp to fs->out (see above) and fsyncs the
 * parent. 0, or -1 with err (fs->tmp still there). */
int fset_commit(const FolderSet *fs, int replace, Err *err);
/* Removes a folder of a set: its members, then the folder (something else
 * in it stays, and the folder with it). A symbolic link is never entered:
 * the link itself goes. 0, or -1 with errno. */
int fset_remove(const FolderSet *fs, const char *dir);

#endif
