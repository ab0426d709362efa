/*
 * files: durable writes, checked opens and reads, directories without
 * links (files.c). Every file modtrain reads is opened by open_regular,
 * every output by open_output.
 */
#ifndef MODTRAIN_FILES_H
#define MODTRAIN_FILES_H

#include <dirent.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#include "src/base/util.h"

/* Writes len bytes to path durably: temp file (path.tmp.PID), fsync,
 * rename, fsync of the directory; each step a fault point WHAT.open,
 * .write, .fsync, .rename, .fsync_dir (fault.h). Returns 0; -1 with err
 * set when path was not replaced (the temp file removed); or 1 with err
 * set when path holds the new content but the directory's fsync failed,
 * so a power cut could still undo the rename. */
int write_file_durable(const char *what, const char *path, const void *data, size_t len,
                       Err *err);
/* write_file_durable("file", ...), 1 counted as done. */
int write_file_atomic(const char *path, const void *data, size_t len, Err *err);
/* Opens path for reading (flags: O_RDONLY, perhaps with more) when it is a
 * regular file, filling *st (when not NULL) from the open descriptor. A
 * directory, a FIFO (even one with no writer: never a hang) or a device is
 * refused (stat before the open, fstat after it). Returns the descriptor
 * (close-on-exec, blocking), or -1 with err set to one line: "cannot open
 * 'X': ..." or "'X' is a directory, not a file" (a FIFO, a character
 * device, ...). Every file modtrain reads is opened here. */
int open_regular(const char *path, int flags, struct stat *st, Err *err);
/* What a file that is not a regular one is, for the error line: "a FIFO". */
const char *file_kind(mode_t m);
/* Every file modtrain writes outside a checkpoint (metrics, --ids, logits,
 * routing tables) is opened here: as open_regular does, so that a FIFO (no
 * hang, with or without a reader), a device (/dev/full) or a directory is
 * refused with one line, then created or emptied (append: added to).
 * Returns the stream, or NULL with err set. */
FILE *open_output(const char *path, int append, Err *err);
/* Closes an output stream, with the error of any write or of the close
 * itself (a full file system shows at the flush). Returns 0, or -1 with err
 * set to "cannot write 'path': ...". */
int close_output(FILE *f, const char *path, Err *err);
/* Reads the whole of a regular file (open_regular) of at most max bytes, its
 * size taken from fstat, into a malloc'd buffer (NUL-terminated). NULL on
 * error with err set to one line naming path. */
char *read_file(const char *path, size_t max, size_t *len, Err *err);
/* Opens directory path for reading without following a symbolic link
 * (O_NOFOLLOW on the open, so no race swaps one in). NULL with errno
 * ENOTDIR when path is a link or anything but a directory: what removes a
 * tree unlinks that, the link itself and never what it names. */
DIR *opendir_nofollow(const char *path);
/* Whether path is a directory itself (lstat: a link to one is not). */
int is_real_dir(const char *path);
/* mkdir -p; returns 0 or -1 with errno. */
int mkdirs(const char *path);
/* fsync a directory (fault point dir.fsync); returns 0 or -1 with errno. */
int fsync_dir(const char *path);

#endif
