/*
 * ckpt_impl: what the model checkpoint files share and nothing else
 * includes.
 *
 *   ckpt_slices.c  registry rows as ckio slices, and the config and state
 *                  as key/value lines
 *   ckpt_commit.c  the commit protocol of a ckpt_dir: step-N.tmp, the
 *                  renames, `latest`, pruning, recovery, run lines,
 *                  abandoned/, listing the step directories
 *   ckpt_save.c    ckpt_save, the asynchronous saves, the probe write
 *   ckpt_load.c    --ckpt resolved, a checkpoint's config and state read,
 *                  its slices loaded, a model opened for inference
 *   ckpt_hfio.c    Hugging Face folders: the names there, config.json
 *                  read, the shards read and loaded, the weights written
 *   ckpt_hf.c      safetensors files, and Hugging Face folders written
 *
 * A file calls only into the files listed before it (and into ckio).
 */
#ifndef MODTRAIN_CKPT_IMPL_H
#define MODTRAIN_CKPT_IMPL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckio.h"
#include "checkpoint/ckpt.h"
#include "src/base/util.h"

/* Who else holds the same data as this rank, for sharing the writing. */
typedef struct {
    int dp, dp_rank;
} Replicas;

/* One save: this rank's slices of the state in buffers laid out like
 * m->params, the key/value lines, and where it goes. */
typedef struct {
    char ckpt_dir[1024], run_id[CKPT_RUN_ID];
    int step, keep;
    CkSlice *slices;
    int n;
    CkKV *kv; /* (64 + the dataset's pairs) */
    int nkv;
    CkWriteOpts wo;
} SaveJob;

/* ckpt_slices.c */
/* This rank's pieces of every registry row in buffer `base` (laid out like
 * m->params), named prefix/name; with r, each says who shares its writing.
 * Returns the count; out holds at most 3 * nreg. */
int model_slices(const Model *m, float *base, const char *prefix, const Replicas *r, CkSlice *out);
/* This rank's pieces of a buffer sharded as sh (ZeRO-1's moments), named
 * prefix/name. Returns the count; out holds at most shard_slices_cap. */
int shard_slices(const Model *m, float *base, const char *prefix, const ZeroShard *sh,
                 int with_share, CkSlice *out);
size_t shard_slices_cap(const Model *m, const ZeroShard *sh);
/* The value a checkpoint records for model key `key` into v (n bytes). */
void model_key_value(const Config *cfg, const Model *m, const char *key, char *v, size_t n);
/* A save's key/value lines into kv (room for 64 + rs's dataset pairs): the
 * model config, the training state after `step`, the layout over `world`
 * ranks. Returns the count. */
int state_kv(const Config *cfg, const Model *m, int step, const CkptRunState *rs, int world,
             CkKV *kv);

/* ckpt_commit.c */
/* Whether id is a run id as a fresh start draws it: 1 to 32 hex digits. */
int run_id_ok(const char *id);
/* Writes step-N.tmp, then commits it. Collective over comm; returns 0 on
 * every rank, -1 on every rank with err set (nothing committed), or 1 on
 * every rank with err holding a warning (committed). */
int job_run(const SaveJob *j, MPI_Comm comm, CkStats *st, Err *err);

#endif
