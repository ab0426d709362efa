/*
 * infer: what eval.c and sample.c share (infer.c): a checkpoint opened for
 * inference, its tokenizer, logits written to a file.
 */
#ifndef MODTRAIN_INFER_H
#define MODTRAIN_INFER_H

#include "mpi/grid.h"
#include "src/cmd/cmd.h"
#include "src/tokenizer/bpe.h"

/* A checkpoint opened for inference: the grid, and this rank's part of the
 * model. */
typedef struct {
    Grid grid;
    Model m;
    Config cfg;
    int step;
} Infer;

/* Builds the grid for `pp` stages (stdout on rank 0 alone), sets threads
 * and loads this rank's part of the checkpoint for micro-batches of maxB.
 * Returns 0, or -1 after printing why (nothing to free). */
int infer_open(Infer *in, const char *cmd, const char *ckpt, int pp, int threads, int maxB);
void infer_close(Infer *in);
/* The tokenizer the checkpoint records (*bpe NULL for bytes, or GPT-2's
 * from --vocab, checked), and the number of ids with text in *vdraw.
 * Returns 0, or -1 with err set. */
int infer_tokenizer(const Infer *in, const char *cmd, const char *vocab, Bpe **bpe, int *vdraw,
                    Err *err);
/* Writes V logits, one a line, gathered over tp from this rank's Vl (rank 0
 * of the tp group writes). Returns 0, or -1 with err set. */
int write_logits(const char *path, const Model *m, const float *logits, Err *err);
/* Every rank parses the same arguments: rank 0 alone prints (help, errors). */
void quiet_above_rank0(int on);

#endif
