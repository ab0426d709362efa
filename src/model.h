/*
 * model: the GPT-2-shaped transformer, its parameter registry, and forward
 * and backward over a micro-batch.
 *
 *   B sequences   T positions   C channels   V vocabulary   L blocks
 *   NH heads      hs = C/NH     F = 4C (MLP width)
 *
 * The model is shard-aware: a rank holds its tensor-parallel slice (NHl =
 * NH/tp heads, Fl = F/tp MLP columns, Vl = Vp/tp vocabulary rows starting at
 * v0) and calls the tp collectives between kernels. tp = 1 is the trivial case.
 */
#ifndef MODTRAIN_MODEL_H
#define MODTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../mpi/tp.h"

typedef struct {
    int V;    /* real vocabulary */
    int Vp;   /* padded to a multiple of tp */
    int maxT; /* seq_len: rows of wpe */
    int L, NH, C;
    /* this rank's slice */
    int tp, tp_rank;
    int NHl, hs, Cl, Fl, Vl, v0;
} ModelDims;

/* Fills dims from the global shape and this rank's tp position. */
void model_dims(ModelDims *d, int V, int maxT, int L, int NH, int C, int tp, int tp_rank);

typedef enum { INIT_NORMAL, INIT_RESID, INIT_ZERO, INIT_ONE } InitKind;

/* One row of the parameter registry: everything that allocation, the
 * optimizer, gradient sync, checkpoints and safetensors need to know. */
typedef struct {
    char name[64];  /* Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int shape[2];   /* global; wte has Vp rows, safetensors shows V */
    int split_dim;  /* dimension split across tp, -1 = replicated */
    int split_blocks; /* c_attn: q, k, v are split separately (3) */
    int layer;      /* block index, -1 outside the blocks */
    int stage;      /* pipeline stage that owns it */
    InitKind init;
    int decay;      /* AdamW weight decay applies (matrices) */
    int lshape[2];  /* local shape */
    size_t offset, numel; /* local, in floats */
    size_t slot;    /* byte offset of its pointer in ParamPtrs / BlockParams */
} ParamInfo;

typedef struct {
    float *ln1w, *ln1b;         /* (C) */
    float *qkvw, *qkvb;         /* (C, 3Cl), (3Cl) */
    float *attprojw, *attprojb; /* (Cl, C), (C) */
    float *ln2w, *ln2b;         /* (C) */
    float *fcw, *fcb;           /* (C, Fl), (Fl) */
    float *fcprojw, *fcprojb;   /* (Fl, C), (C) */
} BlockParams;

typedef struct {
    float *wte;         /* (Vl, C) */
    float *wpe;         /* (maxT, C) */
    float *lnfw, *lnfb; /* (C) */
    BlockParams *h;     /* (L) */
} ParamPtrs;

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkv;                       /* (B,T,3Cl) */
    float *att;                       /* (B,NHl,T,T) */
    float *atty;                      /* (B,T,Cl) */
    float *res2;                      /* (B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch, *fch_gelu;            /* (B,T,Fl) */
    float *res3;                      /* (B,T,C) block output */
} BlockActs;

typedef struct {
    ModelDims d;
    TpGroup tp;
    ParamInfo *reg;
    int nreg;
    size_t nparams;        /* local floats */
    float *params, *grads; /* (nparams) each, laid out by reg */
    ParamPtrs P, G;
    /* activations for up to maxB sequences of maxT tokens */
    int maxB, B, T;
    float *enc;                       /* (B,T,C) */
    BlockActs *acts;                  /* (L) */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C), (B,T), (B,T) */
    float *logits;                    /* (B,T,Vl): probabilities after a loss forward */
    float *losses;                    /* (B,T) */
    int *inputs, *targets;            /* (B,T) */
    /* backward scratch */
    float *dres, *dln, *scratch;  /* (B,T,C) */
    float *dqkv;                  /* (B,T,3Cl) */
    float *datty;                 /* (B,T,Cl) */
    float *dfch, *dfchg;          /* (B,T,Fl) */
    float *rowbuf;                /* (3*B*T) */
} Model;

/* Builds the registry and allocates parameters, gradients and activations
 * for micro-batches of up to maxB sequences. tp may be NULL (alone). */
void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp);
void model_free(Model *m);

/* Counter-based init: element i of tensor `name` depends on (seed, name, i)
 * only, so every layout starts from the same model. */
void model_init_weights(Model *m, uint64_t seed);

/* Global index (row-major in the global shape) of local element i of p. */
size_t param_global_index(const ParamInfo *p, int tp, int tp_rank, size_t i);
/* Registry row by name, or NULL. */
const ParamInfo *model_find_param(const Model *m, const char *name);
/* Points a ParamPtrs at a buffer laid out like m->params (for Adam moments). */
void model_point(const Model *m, ParamPtrs *pp, float *base);

/* Forward over B sequences of T tokens (T <= maxT). With targets, returns the
 * mean cross-entropy and keeps what backward needs; without, leaves logits
 * (B,T,Vl) and returns 0. */
float model_forward(Model *m, const int *inputs, const int *targets, int B, int T);
/* Backward of the last loss forward; each token's loss is weighted by dloss
 * (1 / tokens in the step). Adds into m->grads. */
void model_backward(Model *m, float dloss);
void model_zero_grad(Model *m);

/* Global parameter count (real vocabulary, no padding). */
size_t model_num_params(const Model *m);
/* Matmul FLOPs per trained token (forward + backward) at sequence length T. */
double model_flops_per_token(const ModelDims *d, int T);

#endif
