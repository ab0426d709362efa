/*
 * fault: named fault points for crash testing, after SQLite's crash tests
 * and etcd's failpoints. Every write, fsync, rename, unlink, mkdir and
 * rmdir of a save goes through one of the fp_ wrappers below (a lint test
 * checks that checkpoint/ and the durable-write helper call none
 * directly), each naming its point, so a test can end the process at any
 * of them, or make that one call fail, and a trace lists every point a run
 * reached.
 *
 *   MODTRAIN_FAULT=at:POINT[:STEP[:ACTION[:RANK[:NTH]]]] (or the same in
 *   MODTRAIN_FAULT_AT, beside another MODTRAIN_FAULT hook)
 *     POINT   a point's name ("commit.rename", "index.fsync", ...)
 *     STEP    only in the save of that step (the thread's fault_set_step;
 *             "*" or absent: any)
 *     ACTION  kill (SIGKILL, the default), or EIO, ENOSPC, EDQUOT, EINVAL:
 *             the guarded call fails with that errno, once (EINVAL: what
 *             a file system without renameat2's exchange answers)
 *     RANK    only on that rank (util_rank; "*" or absent: every rank)
 *     NTH     the nth time the point matches (default 1)
 *   Up to four such faults may be joined by commas, each acting alone
 *   (at:prep.commit.exchange:*:EINVAL,at:prep.commit.aside).
 *   MODTRAIN_FAULT_TRACE=FILE appends "POINT STEP RANK" for every point
 *     reached, in order.
 *
 * Without either variable a point costs one load of a cached flag.
 */
#ifndef MODTRAIN_FAULT_H
#define MODTRAIN_FAULT_H

#include <stddef.h>
#include <sys/types.h>

/* The step of the save the calling thread works on (-1: none). */
void fault_set_step(long step);
long fault_get_step(void);

/* Point `point` is reached: returns 0 to go on, or -1 with errno set when
 * the guarded call is to fail; never returns when the action is kill. */
int fault_point(const char *point);

/* The guarded calls: each is its POSIX call behind fault_point(point).
 * fp_write_all writes all n bytes (retrying short writes and EINTR) and
 * returns 0 or -1 with errno; a short write that makes no progress is
 * ENOSPC; fp_pwrite_all the same at offset off (off >= 0). fp_fsync_dir
 * opens the directory and fsyncs it. */
int fp_open(const char *point, const char *path, int flags, mode_t mode);
int fp_write_all(const char *point, int fd, const void *buf, size_t n);
int fp_pwrite_all(const char *point, int fd, const void *buf, size_t n, off_t off);
int fp_fsync(const char *point, int fd);
int fp_fsync_dir(const char *point, const char *path);
int fp_rename(const char *point, const char *from, const char *to);
/* renameat2(RENAME_EXCHANGE): a and b swap names in one step. */
int fp_exchange(const char *point, const char *a, const char *b);
int fp_unlink(const char *point, const char *path);
int fp_rmdir(const char *point, const char *path);
int fp_mkdir(const char *point, const char *path, mode_t mode);

/* The watchdog's heartbeat: fault_progress marks that the calling thread
 * (training's, or a save's) made progress now; fault_phase names what the
 * training thread is doing (a static string). fault_last_progress gives
 * the time of the last mark (now_s's clock) and the phase. */
void fault_progress(void);
void fault_phase(const char *phase);
double fault_last_progress(const char **phase);

#endif
