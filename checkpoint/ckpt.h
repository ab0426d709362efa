/*
 * ckpt: checkpoints in their first, simple form: ckpt_dir/step-NNNNNNNN/ holds
 * model.safetensors (weights under their Hugging Face names, the model config
 * and training state as metadata) and optim.safetensors (AdamW moments), made
 * durable by writing step-N.tmp/, fsync, rename, then replacing `latest`.
 * Everything goes through the parameter registry.
 */
#ifndef MODTRAIN_CKPT_H
#define MODTRAIN_CKPT_H

#include <stddef.h>

#include "../src/config.h"
#include "../src/model.h"
#include "../src/optim.h"

/* Saves weights (and moments when opt is non-NULL) for `step` completed
 * steps; keeps the newest `keep` checkpoints. Returns 0 or -1. */
int ckpt_save(const char *ckpt_dir, const Model *m, const AdamW *opt, const Config *cfg, int step,
              int keep);

/* Turns --ckpt (a ckpt_dir holding `latest`, or one step directory) into a
 * step directory. Returns 0, or -1 after printing why. */
int ckpt_resolve(const char *path, char *out, size_t n);

/* Reads the model keys and step from a step directory's metadata into cfg
 * (other keys untouched). Returns 0 or -1. */
int ckpt_read_config(const char *stepdir, Config *cfg, int *step);

/* Loads the weights of a safetensors file into m's slices, checking every
 * name and shape against the registry. Returns 0 or -1. */
int ckpt_load_weights(const char *file, Model *m);
/* Loads AdamW moments saved by ckpt_save. Returns 0 or -1. */
int ckpt_load_optim(const char *stepdir, const Model *m, AdamW *opt);

/* Writes m's weights as a Hugging Face GPT-2 safetensors file (tp = 1).
 * Returns 0 or -1. */
int ckpt_export_safetensors(const char *path, const Model *m, const Config *cfg, int step);
/* Writes the gradients the same way (the parity tests read them). */
int ckpt_export_grads(const char *path, const Model *m, const Config *cfg);

/* Opens --ckpt for inference: resolves it, reads its config into cfg, builds
 * m for micro-batches of maxB and loads the weights. Returns 0 or -1. */
int ckpt_open_model(const char *ckpt_arg, Model *m, Config *cfg, int maxB, int *step);

/* Checks that two configs agree on every model key; prints the first key
 * that differs. Returns 0 or -1. */
int ckpt_check_model_config(const Config *ckpt, const Config *run, const char *stepdir);

#endif
