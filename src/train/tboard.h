/*
 * tboard: TensorBoard event files, written without TensorBoard. A file is a
 * sequence of TFRecords (a little-endian uint64 length, the masked CRC32C
 * of those 8 bytes, the data, the masked CRC32C of the data), each holding
 * one serialized Event protocol buffer: the first carries file_version,
 * the second a SessionLog START at the launch's first step (TensorBoard
 * then drops what earlier launches wrote from that step on: a resumed
 * run's steps replace theirs), then one Event per metrics record with its
 * scalars as simple_value summaries.
 */
#ifndef MODTRAIN_TBOARD_H
#define MODTRAIN_TBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "src/base/util.h"
#include "src/train/record.h"

typedef struct TBoard TBoard;

/* Creates dir (and its parents) and a new events file in it,
 * events.out.tfevents.SECONDS.HOST.PID, beginning with the file_version
 * Event and the SessionLog START at first_step. Returns NULL with err set. */
TBoard *tb_open(const char *dir, int first_step, Err *err);
/* Adds rec's scalars as one Event at rec's step (nothing when it has none). */
void tb_add(TBoard *tb, const Record *rec);
/* Writes what was added to the file and flushes it. Returns 0, or -1 with
 * err set (the file system's error). */
int tb_flush(TBoard *tb, Err *err);
/* Flushes (as tb_flush) and closes; tb is freed either way. */
int tb_close(TBoard *tb, Err *err);
/* The file's path. */
const char *tb_path(const TBoard *tb);

/* CRC32C (Castagnoli) of n bytes, and TFRecord's mask of it. */
uint32_t crc32c(const void *p, size_t n);
uint32_t crc32c_masked(const void *p, size_t n);

#endif
