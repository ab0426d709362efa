/*
 * ckpt: model checkpoints on the ckio format. ckpt_dir/step-NNNNNNNN/ holds
 * data.bin and index (ckio.h) with the parameters, the AdamW moments, the
 * model config and the training state. A save clears what interrupted
 * saves left, checks the free space, writes step-N.tmp/, fsyncs, renames
 * it to step-N/ (a re-save of step N moves the old one to step-N.old
 * first), fsyncs ckpt_dir, then replaces `latest` by write-to-temp and
 * rename, and keeps the newest ckpt_keep. Every write, fsync, rename and
 * unlink is a fault point (src/base/fault.h). Every tensor goes through the parameter
 * registry: a rank writes and reads its own slices.
 */
#ifndef MODTRAIN_CKPT_H
#define MODTRAIN_CKPT_H

#include <mpi.h>
#include <stddef.h>

#include "checkpoint/ckio.h"
#include "checkpoint/safetensors.h"
#include "src/base/util.h"
#include "src/config/config.h"
#include "src/model/model.h"
#include "src/model/optim.h"

/* The training state beyond the step that a checkpoint records: the
 * global batches skipped so far (step s trains on batch s + batch_offset),
 * the rollbacks onto this checkpoint's step after a non-finite loss, the
 * samples consumed (the data position: the next step reads sample
 * `samples` on), the seed of the data order, and the dataset's identity
 * (ds_identity's "data.*" pairs: the caller's when saving; read from the
 * checkpoint, n_data 0 when it has none, freed by ckpt_run_state_free). */
/* A run's line: the id a fresh start draws (hex digits), which every
 * checkpoint it and its resumes and requeues save carries. */
#define CKPT_RUN_ID 33

typedef struct {
    char run_id[CKPT_RUN_ID]; /* "": not recorded (a checkpoint older than lines) */
    int parent_step;          /* the checkpoint this state descends from (-1: a fresh start) */
    long long batch_offset;
    int rollbacks;
    long long samples;
    long long seed; /* -1: not recorded */
    CkKV *data;
    int n_data;
    /* read only: the schedule the checkpoint's run had (-1: not recorded) */
    double lr, min_lr;
    int warmup_steps, steps, batch_size;
} CkptRunState;

/* Reads a checkpoint's CkptRunState (zeros for keys it lacks: written
 * before they were; samples then from state.data_cursor). Returns 0 or -1
 * with err set. */
int ckpt_read_run_state(const char *stepdir, CkptRunState *rs, Err *err);
void ckpt_run_state_free(CkptRunState *rs);

/* The line checkpoint stepdir belongs to: its state.run_id into id[CKPT_RUN_ID]
 * ("" when it records none, as checkpoints from before lines). Returns 0, or
 * -1 when its index does not read. */
int ckpt_read_run_id(const char *stepdir, char *id);
/* Whether a checkpoint of line `have` ("" when older than lines) counts as one
 * of line `want`: the same id, or either side unrecorded. */
int ckpt_same_line(const char *have, const char *want);

/* Saves weights (and moments when opt is non-NULL) after `step` completed
 * steps. Collective over comm; every rank writes a share: the data it holds
 * alike with others (its dp replicas, of this rank dp_rank of dp; the tp
 * ranks of a replicated tensor; the two copies of the tied embedding) is
 * divided among them, balanced by bytes. Fills *st (when not NULL) with
 * what the save wrote. Returns 0 on every rank; -1 on every rank with err
 * set (rank 0's says why) when nothing was committed; or 1 on every rank
 * when the checkpoint is committed but err holds a warning (ckpt_dir not
 * fsynced, `latest` not written, a prune failed). The model and older
 * checkpoints are untouched either way. */
int ckpt_save(const char *ckpt_dir, const Model *m, const AdamW *opt, const Config *cfg, int step,
              const CkptRunState *rs, MPI_Comm comm, int dp, int dp_rank, CkStats *st, Err *err);

/* Asynchronous saves: the state is copied into a staging buffer on the
 * calling thread (the only stall), then a thread of its own packs, writes
 * (collectively, over a duplicate of comm, beside training's MPI calls) and
 * commits it exactly as ckpt_save would. At most one save is in flight; a
 * save commits only when every rank's data is durable. Needs
 * MPI_THREAD_MULTIPLE. */
typedef struct CkptAsync CkptAsync;

/* Sets up asynchronous saves over comm, with a staging buffer of `floats`
 * (3 x Model.nparams for weights and moments) touched by `threads`
 * threads. Collective. Returns NULL with err set when MPI does not give
 * MPI_THREAD_MULTIPLE. */
CkptAsync *ckpt_async_new(MPI_Comm comm, size_t floats, int threads, Err *err);
/* Starts saving what ckpt_save would save (rs may be NULL: zeros) (the copy on `threads` threads)
 * and returns once the state is copied. None may be in flight (wait for it
 * first). Collective over the ranks of ckpt_async_new's comm. */
void ckpt_async_start(CkptAsync *a, const char *ckpt_dir, const Model *m, const AdamW *opt,
                      const Config *cfg, int step, const CkptRunState *rs, int dp, int dp_rank,
                      int threads);
/* The step of the save in flight (started and not waited for), or -1;
 * whether it has finished on this rank (never blocks); seconds since it
 * started (0 when none). a may be NULL. */
int ckpt_async_step(const CkptAsync *a);
int ckpt_async_ready(CkptAsync *a);
double ckpt_async_elapsed(const CkptAsync *a);
/* Waits for the save in flight (none: returns 0 at once): its result as
 * ckpt_save's (0, or -1 on every rank with err set), *st its figures and
 * *seconds its time from the start of the copy to the commit (either may be
 * NULL). Local: the saving threads of all ranks finish together. */
int ckpt_async_wait(CkptAsync *a, CkStats *st, double *seconds, Err *err);
/* Waits for a save in flight and frees everything. a may be NULL. */
void ckpt_async_free(CkptAsync *a);

/* Measures what a save into ckpt_dir would take before any was made, for
 * time_limit's budget: rank 0 writes, fsyncs and removes a probe file of
 * min(state_bytes, 16 MiB) there (fault points probe.*; a leftover
 * probe.tmp.PID is cleared by ckpt_recover) and scales its time to
 * state_bytes. Collective; fills *seconds on every rank and returns 0, or
 * -1 with err set (ckpt_dir cannot be written). */
int ckpt_probe_save(const char *ckpt_dir, double state_bytes, MPI_Comm comm, double *seconds,
                    Err *err);

/* Turns --ckpt (a step directory, or a ckpt_dir: its `latest`, else its
 * newest step directory) into a step directory. Returns 0 or -1 with err
 * set. */
int ckpt_resolve(const char *path, char *out, size_t n, Err *err);

/* Puts right what interrupted saves left in ckpt_dir (rank 0 alone, no
 * save in flight; nothing is entered through a symbolic link, and a link
 * among them is removed itself): a step-N.old whose step-N is missing (a re-save stopped
 * between its renames) becomes step-N again; every other .old, .tmp (but
 * keep_tmp, when not NULL) and .del directory and latest.tmp.PID file is
 * removed whole. Returns 0 or -1 with err naming what could not be
 * removed. */
int ckpt_recover(const char *ckpt_dir, const char *keep_tmp, Err *err);

/* After a run of line run_id resumed from step `step` (rank 0 alone): the
 * checkpoints of that line in ckpt_dir newer than it belong to training
 * this run abandoned (another line's stay where they are),
 * so they move to ckpt_dir/abandoned/ (out of resume's and pruning's
 * sight, nothing deleted), and `latest` names step-`step` again (or is
 * removed when that lies elsewhere). Returns 0 or -1 with err set. */
int ckpt_abandon_after(const char *ckpt_dir, int step, const char *run_id, Err *err);
/* Moves every checkpoint of ckpt_dir to ckpt_dir/abandoned/ and removes
 * `latest` (rank 0 alone): a run with resume = never starts a line of its
 * own there. *moved says how many went. Returns 0 or -1 with err set. */
int ckpt_abandon_all(const char *ckpt_dir, int *moved, Err *err);

/* Lists the step-NNNNNNNN directories of ckpt_dir, newest first (malloc'd
 * names; the caller frees each and the array), leaving out symbolic links.
 * Returns the count. */
int ckpt_list_steps(const char *ckpt_dir, char ***names);

/* Reads the model config keys and step of a checkpoint into cfg (other keys
 * untouched). Returns 0 or -1 with err set. */
int ckpt_read_config(const char *stepdir, Config *cfg, int *step, Err *err);

/* Loads this rank's slices of the weights (and of the moments when opt is
 * non-NULL and the checkpoint has them; *had_moments says which) into m.
 * Checks every chunk it reads. Returns 0 or -1 with err set. */
int ckpt_load(const char *stepdir, Model *m, AdamW *opt, int *had_moments, Err *err);
/* The weights alone of a checkpoint; under fresh_routing (a dense model's
 * checkpoint for a Mixture-of-Depths model) the routers and predictors
 * keep their values. 0, or -1 with err set. */
int ckpt_load_weights(const char *stepdir, Model *m, int fresh_routing, Err *err);

/* Checks that two configs agree on every model key. Returns 0, or -1 with
 * err naming the first key that differs. */
int ckpt_check_model_config(const Config *ckpt, const Config *run, const char *stepdir, Err *err);

/* Opens --ckpt for inference: resolves it, reads its config into cfg,
 * builds m (this rank's slice of tp, NULL: alone, and stage pp_rank of pp,
 * balanced) for micro-batches of maxB and loads the weights. The model must
 * fit in this node's memory shared by local_ranks ranks (checked before
 * anything is allocated). Returns 0, or -1 with err set and nothing to free. */
int ckpt_open_model(const char *ckpt_arg, Model *m, Config *cfg, int maxB, int *step,
                    const TpGroup *tp, int pp, int pp_rank, int local_ranks, Err *err);

/* Writes m's weights (or gradients) as a Hugging Face GPT-2 safetensors file
 * (tp = 1). Returns 0 or -1 with err set. */
int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step,
                            Err *err);
int ckpt_export_grads(const char *path, const Model *m, const Config *cfg, Err *err);
/* Writes a Hugging Face folder dir (made when missing): model.safetensors,
 * the dense part of m's weights (a Mixture-of-Depths model's routers and
 * predictors left out: *left_out says how many tensors, and its metadata
 * says route_every = 0), and GPT-2's config.json (transformers' GPT2Config).
 * Returns 0 or -1 with err set. */
int ckpt_export_hf(const char *dir, const Model *m, const Config *cfg, int step, int *left_out,
                   Err *err);
/* Checks a parsed safetensors file against the registry of a model of dims
 * d before any model is built: every tensor the model has is there with its
 * shape (but routers and predictors, under fresh_routing: a dense model's
 * file for a Mixture-of-Depths model), and the file has no tensor the model
 * lacks (but GPT-2's causal-mask buffers, h.N.attn.bias and
 * h.N.attn.masked_bias, of blocks it has). Returns 0 or -1 with err naming
 * the tensor. */
int ckpt_check_safetensors(const StFile *f, const ModelDims *d, int fresh_routing, Err *err);
/* One Hugging Face tensor of a registry row (ckpt_hfio.c): its name, the
 * columns [c0, c1) of the row's global matrix it holds, and whether it is
 * stored transposed ([out, in], nn.Linear's). */
typedef struct {
    char name[96];
    int c0, c1, tr;
} HfPart;
/* The parts of registry row p in a Hugging Face folder of d's model:
 * GPT-2's names are modtrain's ([in, out]); llama's LlamaForCausalLM's,
 * c_attn split into q, k and v, c_fc into gate and up. 0 for a tensor
 * those models have not (a router, a predictor, an expert). */
int hf_parts(const ModelDims *d, const ParamInfo *p, HfPart *out);
/* Writes m's weights (tp 1, pp 1) under those names as one safetensors
 * file, with meta; *left_out counts the tensors left out. 0 or -1. */
int hf_write_weights(const char *path, const Model *m, const StMeta *meta, int nmeta, int *left_out,
                     Err *err);
/* A Hugging Face folder, read: the model keys its config.json gives, and
 * its safetensors files (model.safetensors, or the shards the index names). */
typedef struct {
    char dir[4096];
    Config cfg;
    StFile *f;
    int nf;
} HfFolder;
/* The model keys of dir/config.json (model_type gpt2 or llama) into cfg,
 * defaults elsewhere: 0, or -1 with err naming the key modtrain cannot
 * build (a rope_scaling, attention or MLP biases, another activation, a
 * head_dim other than d_model / n_head, another model_type). */
int hf_read_config(const char *dir, Config *cfg, Err *err);
/* Reads the folder: 0, or -1 with err set and nothing to free. */
int hf_open(HfFolder *h, const char *dir, Err *err);
void hf_close(HfFolder *h);
/* Loads m's slices from h (checked first against the whole model: every
 * tensor with its shape, no tensor more); rows no folder holds (routers,
 * predictors) keep their values. 0, or -1 with err set. */
int hf_load(const HfFolder *h, Model *m, Err *err);

/* Loads m's weights (its pipeline stage's, its tp slices) from a parsed
 * safetensors file (checked as above against the whole model; a NaN or
 * infinity is an error naming the tensor); under fresh_routing the routers
 * and predictors keep their values. Returns 0 or -1. */
int ckpt_load_safetensors(const StFile *f, Model *m, int fresh_routing, Err *err);

#endif
