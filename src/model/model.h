/*
 * model: the GPT-2-shaped transformer, its parameter registry, and forward
 * and backward over a micro-batch.
 *
 *   B sequences   T positions   C channels   V vocabulary   L blocks
 *   NH heads      hs = C/NH     F = 4C (MLP width)
 *   K tokens a routed block processes (Mixture-of-Depths)   H predictor width
 *   E experts of an MoE block, Nn no-op experts beside them, k experts a
 *   token chooses, Fe an expert's width (Fel = Fe/tp local), El = E/ep the
 *   experts this rank holds (e0 the first)
 *
 * The model is shard-aware: a rank holds its tensor-parallel slice (NHl =
 * NH/tp heads, Fl = F/tp MLP columns, Vl = Vp/tp vocabulary rows starting at
 * v0) and calls the tp collectives between kernels. tp = 1 is the trivial case.
 */
#ifndef MODTRAIN_MODEL_H
#define MODTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "mpi/ep.h"
#include "mpi/tp.h"
#include "src/base/util.h"
#include "src/config/config.h"

/* Chunks of blocks a pipeline rank may hold (virtual_stages at most). */
enum { MODEL_MAX_CHUNKS = CONFIG_MAX_VIRTUAL_STAGES };

typedef struct {
    Arch arch; /* the block: GPT-2's or Llama's */
    int V;    /* real vocabulary */
    int Vp;   /* padded to a multiple of tp */
    int maxT; /* seq_len: rows of wpe */
    int L, NH, C;
    /* this rank's slice */
    int tp, tp_rank;
    int NHl, hs, Cl, Fl, Vl, v0;
    /* F the MLP's width (Fl = F/tp local; llama's MLP makes gate and up
     * rows of Fl each), KV key and value heads (KVl = KV/tp local; NH for
     * gpt2), qkvl the local width of a q|k|v row ((NHl + 2 KVl) hs) */
    int F, KV, KVl, qkvl;
    int tied;     /* the head is the token embedding */
    float eps;    /* llama's RMSNorm */
    double theta; /* llama's rotary base */
    /* Mixture-of-Depths: block l is routed when route_every > 0 and
     * l % route_every == route_every - 1 */
    int route_every;
    double capacity;
    RouterGate gate;
    int predictor; /* 1: causal_router = predictor (an MLP of width H) */
    int H;
    /* pipeline stage: this rank holds nchunk chunks of blocks, chunk k the
     * blocks [c0[k], c1[k]), virtual stage k * pp + pp_rank of pp * nchunk
     * (one chunk but under interleaved 1F1B, virtual_stages); the first
     * stage also wte and wpe (its chunk 0 looks them up), the last ln_f and
     * the head (after its last chunk; wte again, tied) */
    int pp, pp_rank, nchunk;
    int c0[MODEL_MAX_CHUNKS], c1[MODEL_MAX_CHUNKS];
    /* Mixture-of-Experts: block l's MLP is E experts when E > 0 and
     * l % moe_every == moe_every - 1 */
    int E, Nn, ek, Fe, Fel, moe_every;
    double cf; /* capacity_factor */
    /* expert parallelism: this rank holds experts [e0, e0 + El) of every
     * MoE block, its position ep_rank in a group of ep data-parallel ranks */
    int ep, ep_rank, El, e0;
    /* the head's chunk: rows whose logits exist at a time (head.c);
     * model_dims sets HEAD_ROWS */
    int head_rows;
    /* what a block keeps for its backward (model_init lays the sets out by
     * it): train and plan set it from the config; model_dims_config leaves
     * it none, since evaluation, sampling and decoding never backward */
    Recompute recompute;
} ModelDims;

/* The head's default chunk. A chunk costs more than its FLOPs: each of
 * its two products with wte packs all of wte again (BLIS packs a product's
 * B once a call). At V 50257, C 768 the head of a 4096-row micro-batch
 * took, one thread: 25 s in chunks of 64 rows, 18 at 128, 12 at 256, 11.0
 * at 512, 10.7 at 1024, 11.1 whole. 512 rows (also past skx's MC, 480)
 * stay within a few per cent of the whole at 512 * Vl floats: 103 MB at
 * V 50257, against 0.8 GB for a whole micro-batch of 4 x 1024. */
enum { HEAD_ROWS = 512 };

/* Fills dims from the global shape and this rank's tp position; the model is
 * dense until model_dims_mod() adds routing. */
void model_dims(ModelDims *d, int V, int maxT, int L, int NH, int C, int tp, int tp_rank);
/* Makes d a llama model (arch ARCH_LLAMA) or sets GPT-2's MLP width and
 * head: KV kv heads (dividing NH, divided by tp), MLP width F, RMSNorm's
 * eps, rotary base theta, tied head. */
void model_dims_arch(ModelDims *d, Arch arch, int KV, int F, double eps, double theta, int tied);
void model_dims_mod(ModelDims *d, int route_every, double capacity, RouterGate gate, int predictor,
                    int H);
/* Adds experts to d (n_expert 0: none). expert_d_ff 0 = F, the MLP's width. */
void model_dims_moe(ModelDims *d, int n_expert, int n_noop, int top_k, int expert_d_ff,
                    double capacity_factor, int moe_every);
/* Makes d this rank's share of ep expert-parallel ranks (E % ep == 0). */
void model_dims_ep(ModelDims *d, int ep, int ep_rank);
/* Whether block l's MLP is a Mixture-of-Experts; how many of the whole
 * model's blocks are. */
int model_is_moe(const ModelDims *d, int l);
int model_moe_blocks(const ModelDims *d);
/* Rows an expert takes of N in a micro-batch: max(1, floor(cf * N * k / E)). */
int model_expert_capacity(const ModelDims *d, int N);
/* Makes d the pipeline stage pp_rank of pp, holding vs chunks (virtual
 * stages k * pp + pp_rank, k < vs): blocks split over the pp * vs virtual
 * stages as layers[] says (counts per virtual stage, NULL: balanced, the
 * first ones one more when L % (pp * vs)). Returns 0, or -1 when a virtual
 * stage would hold no block or vs is out of [1, MODEL_MAX_CHUNKS]. */
int model_dims_stage(ModelDims *d, int pp, int vs, int pp_rank, const int *layers);
/* The same in two parts, for the planner's every stage in O(pp vs): the
 * first block of each virtual stage into starts[0 .. pp * vs] (the last
 * L; returns 0, or -1 as above), then a rank's stage from them in O(vs). */
int model_stage_starts(const ModelDims *d, int pp, int vs, const int *layers, int *starts);
void model_dims_stage_at(ModelDims *d, int pp, int vs, int pp_rank, const int *starts);
/* Makes d the whole model: one stage, one chunk of every block. */
void model_dims_whole(ModelDims *d);
static inline int model_first_stage(const ModelDims *d) { return d->pp_rank == 0; }
static inline int model_last_stage(const ModelDims *d) { return d->pp_rank == d->pp - 1; }
/* Whether this rank holds block l; how many blocks it holds. */
int model_holds(const ModelDims *d, int l);
int model_stage_blocks(const ModelDims *d);
/* All of the above but the stage and ep from a config (its vocab_size
 * must be resolved). */
void model_dims_config(ModelDims *d, const Config *cfg, int tp, int tp_rank);
/* Whether block l is routed. */
int model_is_routed(const ModelDims *d, int l);
/* How many of the stage's blocks (its chunks') are routed. */
int model_stage_routed(const ModelDims *d);
/* How many of the stage's blocks are MoE blocks, and *routed of them also
 * routed (in a few operations). */
int model_stage_moe(const ModelDims *d, int *routed);
/* Tokens top-k routing keeps in a sequence of T: max(1, round(capacity * T)). */
int model_capacity_k(const ModelDims *d, int T);
/* member[t] = 1 for the k positions with the largest r (ties to the lower
 * position), 0 elsewhere. */
void model_topk(unsigned char *member, const float *r, int T, int k);
/* g(r), the weight a routed block's output is scaled by. */
float model_gate(const ModelDims *d, float r);
/* The causal decision for a token with router logit r and predictor logit
 * plogit (read only with causal_router = predictor): 1 to process it. */
int model_causal(const ModelDims *d, float r, float plogit);

typedef enum { INIT_NORMAL, INIT_RESID, INIT_ZERO, INIT_ONE } InitKind;

/* One row of the parameter registry: everything that allocation, the
 * optimizer, gradient sync, checkpoints and safetensors need to know. */
typedef struct {
    char name[64];  /* Hugging Face GPT-2 name, e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int shape[2];   /* global; wte has Vp rows, safetensors shows V */
    int split_dim;  /* dimension split across tp, -1 = replicated */
    int split_blocks; /* c_attn: q, k, v are split separately (3) */
    int block_w[3];   /* the blocks' global widths along split_dim (llama's
                       * q is NH heads wide, k and v KV) */
    int layer;      /* block index, -1 outside the blocks */
    int expert;     /* the expert it belongs to (global index), -1 for none */
    int stage;      /* pipeline stage that owns it */
    InitKind init;
    int decay;      /* AdamW weight decay applies (matrices) */
    int tied;       /* the embedding the first stage looks up and the last
                     * stage's head reuses: both stages hold a copy */
    int vocab_rows; /* rows that hold data: V for wte (padded to Vp rows,
                     * never saved), shape[0] for every other tensor */
    int lshape[2];  /* local shape */
    size_t offset, numel; /* local, in floats */
    size_t slot;    /* byte offset of its pointer in ParamPtrs / BlockParams */
} ParamInfo;

/* One expert's MLP: the dense MLP's shape with Fel columns. */
typedef struct {
    float *fcw, *fcb;     /* (C, Fel), (Fel) */
    float *projw, *projb; /* (Fel, C), (C) */
} ExpertParams;

typedef struct {
    float *ln1w, *ln1b;         /* (C) */
    float *qkvw, *qkvb;         /* (C, 3Cl), (3Cl) */
    float *attprojw, *attprojb; /* (Cl, C), (C) */
    float *ln2w, *ln2b;         /* (C) */
    float *fcw, *fcb;           /* (C, Fl), (Fl) */
    float *fcprojw, *fcprojb;   /* (Fl, C), (C) */
    /* routed blocks only */
    float *rw, *rb;             /* router (C), (1) */
    float *pw1, *pb1;           /* predictor (C, H), (H) */
    float *pw2, *pb2;           /* predictor (H, 1), (1) */
    /* MoE blocks only (no fcw .. fcprojb) */
    float *mrw;                 /* expert router (C, E + Nn) */
    ExpertParams *ex;           /* (El) this rank's experts */
} BlockParams;

typedef struct {
    float *wte;         /* (Vl, C) */
    float *wpe;         /* (maxT, C), gpt2 */
    float *lnfw, *lnfb; /* (C) */
    float *lmw;         /* (Vl, C) the head when not tied to wte */
    BlockParams *h;     /* (L) */
} ParamPtrs;

/* A block's activations. A routed block runs its attention and MLP on the K
 * gathered rows only, so those buffers hold K <= B*T rows. Under recompute
 * the buffers a set does not keep point into the model's one working copy
 * (Model.work), which each backward fills again before it reads them:
 * attention keeps all but ln1 .. atty (the attention branch up to its
 * projection); block keeps res3 alone. */
typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C), (B,T), (B,T) */
    float *qkv;                       /* (B,T,qkvl): llama's q and k rotated */
    float *lse;                       /* (B,NHl,T) attention row log-sum-exps */
    float *atty;                      /* (B,T,Cl) */
    float *res2;                      /* (B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C), (B,T), (B,T) */
    float *fch, *fch_gelu;            /* (B,T,Fl); llama: fch (B,T,2Fl) gate|up,
                                       * fch_gelu their SwiGLU */
    float *res3;                      /* (B,T,C) block output */
    /* routed blocks only */
    float *r;            /* (B,T) router logits */
    float *plogit;       /* (B,T) predictor logits */
    float *ph, *phg;     /* (B,T,H) predictor hidden, before and after GELU */
    unsigned char *topk; /* (B,T) top-k membership: the BCE target */
    int *sel;            /* (K) positions b*T+t of the processed tokens, ascending */
    int *off;            /* (B+1) sequence b's tokens are sel[off[b] .. off[b+1]) */
    float *gate;         /* (K) g(r) of the processed tokens */
    float *xs, *a, *mo;  /* (K,C) gathered input, attention and MLP branches */
    /* MoE blocks only: over the block's rows n (B*T, or K when routed) */
    float *mp;           /* (n, E+Nn) router probabilities */
    int *mch;            /* (n, k) chosen experts, best first */
    int *mslot;          /* (n, k) the choice's row among the rows sent, or
                          * MOE_DROPPED / MOE_NOOP */
    int *mcnt;           /* (E) rows sent to each expert, (ep, El) rows
                          * received from each rank for each local expert,
                          * (El + 1) offsets of the local experts' rows */
    float *mxs, *mys;    /* (n*k, C) rows sent to the experts, their outputs */
    float *mxr, *myr;    /* (R, C) rows received and their outputs (ep > 1;
                          * the same buffers as mxs and mys at ep 1) */
    float *mh, *mhg;     /* (R, Fel) the experts' hidden rows before and after GELU
                          * (llama: mh (R, 2Fel) gate|up, mhg their SwiGLU) */
    int nrecv;           /* R: rows this rank's experts took */
} BlockActs;

enum { MOE_DROPPED = -1, MOE_NOOP = -2 };

typedef enum { ROUTE_TOPK = 0, ROUTE_CAUSAL = 1 } RouteMode;

/* What routing did in the forwards since the last model_stats_reset(). */
typedef struct {
    double aux_sum;      /* sum of the router's BCE over tokens and routed blocks */
    double pred_sum;     /* the same for the predictor */
    long long decisions; /* tokens x routed blocks seen */
    long long agree;     /* causal decision == top-k membership */
    long long *processed; /* (L) tokens each block processed */
    long long tokens;     /* tokens each block saw */
    /* MoE blocks: (L, E + Nn + 2) slots kept per expert (no-ops too), then
     * dropped, then all slots (rows x k); in forwards on this rank */
    long long *moe;
    long long *expert_rows; /* (L, El) rows this rank's experts' GEMMs took */
    /* the load-balancing loss summed over MoE blocks and forwards, each
     * weighted by its micro-batch's tokens; and those weights' sum (MoE
     * blocks x tokens): their ratio is the mean the objective weighs */
    double moe_aux_sum;
    long long moe_forwards;
} RouteStats;

/* Everything one micro-batch's forward leaves for its backward. A pipeline
 * stage keeps several micro-batches in flight, one set each. Every buffer
 * lies in one 64-byte aligned allocation, laid out by a size table
 * (model.c), each buffer on a 64-byte boundary of its own. */
typedef struct {
    void *mem;                        /* the allocation every pointer below is in */
    float *enc;                       /* (B,T,C) embeddings, or the stage's input */
    BlockActs *acts;                  /* (L), the stage's blocks filled in */
    /* (B,T,C), (B,T), (B,T); after a forward that did the head's backward
     * (head_fused), lnf holds dL/d(lnf) instead, before its tp all-reduce */
    float *lnf, *lnf_mean, *lnf_rstd;
    /* (B,T) each row's max logit over the vocabulary and its sum of
     * exp(logit - max): what backward recomputes the probabilities from */
    float *lmax, *lsum;
    float *losses;                    /* (B,T) */
    int *inputs, *targets;            /* (B,T) */
    int B, T;                         /* the shape of the last forward */
    int chunk;                        /* the chunk of blocks the set is for */
    float aux_loss, pred_loss;        /* mean BCEs of the last forward */
    float moe_aux;                    /* mean load-balancing loss over MoE blocks */
    int head_fused;                   /* the loss forward did the head's backward, with: */
    float head_dloss;
} ActSet;

/* The embedding's gradient kept apart from G.wte, a row per distinct token
 * (training at dp > 1): the head's share of the tied embedding's gradient
 * is then final as soon as the last micro-batch's head backward is done and
 * reduces over dp while the blocks' backward goes on; these rows, at most
 * one per token of the step, reduce at the end (dp_rows_reduce_add). */
typedef struct {
    int *slot;   /* (Vl) each local row's slot, or -1 */
    int *id;     /* (cap) the local row of each slot, in the order first touched */
    float *rows; /* (cap, C) */
    int n, cap, Vl, C;
} EmbRows;

/* Room for cap distinct rows of a Vl x C table; cap at most Vl. */
void emb_rows_init(EmbRows *e, int Vl, int C, int cap);
/* Adds dout's N rows to the rows of their tokens (v0..v0+Vl, others are
 * another tp rank's), in token order as embed_backward adds them to G.wte. */
void emb_rows_add(EmbRows *e, const float *dout, const int *tokens, int v0, int N);
/* Empties e for the next step. */
void emb_rows_clear(EmbRows *e);
void emb_rows_free(EmbRows *e);


/* Scratch that backward and decoding share across activation sets. */
typedef struct {
    void *mem;
    float *dres, *dln, *scratch;  /* (B,T,C) */
    float *dqkv;                  /* (B,T,3Cl) */
    float *datty;                 /* (B,T,Cl) */
    float *dfch, *dfchg;          /* (B,T,Fl), dfch llama's (B,T,2Fl) gate|up */
    float *qkvg;                  /* (B,T,3Cl) q|k|v with each query head's k and v
                                   * (grouped-query attention) */
    int *pos;                     /* (B*T) the rows' positions in their sequences (llama) */
    float *rope_cos, *rope_sin;   /* (maxT, hs/2) rotary tables (llama) */
    float *rowbuf;                /* (3*B*T) */
    float *logits;                /* (min(B*T, head_rows), Vl) the head's chunk, last stage only */
    float *scratch2;              /* (B,T,C) */
    float *dr;                    /* (B,T) router gradient */
    float *dph;                   /* (2,B,T,H) predictor hidden gradients */
    int *off_dense;               /* (B+1) sequence offsets of a dense block */
    /* MoE blocks */
    float *mdys, *mdyr;           /* (n*k, C), (R, C) gradients of the experts' outputs */
    float *mdxr;                  /* (R, C) gradients of the experts' input rows */
    float *mdh, *mdhg;            /* (R, Fel); llama's mdh (R, 2Fel) */
    float *mdp;                   /* (n, E+Nn) gradient of the router probabilities */
} Scratch;

typedef struct {
    ModelDims d;
    TpGroup tp;
    EpGroup ep;       /* the expert-parallel group: size 1 after model_init; the
                       * caller sets it when d.ep > 1 */
    MPI_Comm pp_comm; /* the pipeline, for decoding; MPI_COMM_NULL alone */
    ParamInfo *reg;
    int nreg;
    size_t nparams;        /* local floats */
    size_t expert_floats;  /* the last of them: the experts', reduced over their replicas */
    float *params, *grads; /* (nparams) each, laid out by reg */
    int grads_zeroed;      /* the optimizer left grads all zero (adamw_step, which
                            * zeroes each gradient as it consumes it): the next
                            * model_zero_grad has nothing to do */
    ParamPtrs P, G;
    /* activations for up to maxB sequences of maxT tokens */
    int maxB;
    ActSet *slots; /* (nslots) */
    int nslots;
    ActSet *cur; /* the set forward and backward use: model_use_slot() */
    Scratch s;
    /* recompute != none: the buffers of a block that no set keeps, sized
     * for the stage's largest kind of block; one for every set, since only
     * one block's backward runs at a time */
    void *work;
    /* what a recomputed forward counts (routing, experts), thrown away:
     * the forward that ran first counted it */
    RouteStats restats;
    /* Mixture-of-Depths */
    RouteMode route;   /* how routed blocks choose tokens in forward */
    int predictor_on;  /* train the predictor (tests switch it off) */
    int check_routing; /* all-reduce a hash of every routing decision over tp */
    float moe_aux_weight; /* weight of the experts' load-balancing loss in backward */
    float moe_scale;      /* backward's weight of each MoE block's load-balancing loss */
    RouteStats stats;
    /* the head: model_expect_backward's promise for the next forward; and,
     * when a caller (a test) points ref_logits at maxB * maxT * Vl floats,
     * the reference head, which keeps the whole micro-batch's logits there */
    int expect;
    float expect_dloss;
    float *ref_logits;
    /* set when a forward found something the caller must act on (the tp
     * ranks routed differently): the forward stopped early, on every rank
     * of the tp group alike */
    int faulted;
    Err fault;
    /* called after each block's backward with the block's index, and after
     * the head's with d.L (ln_f's gradients and the head's share of the
     * tied embedding's are then this micro-batch's), when set (training's
     * overlapped gradient reduction) */
    void (*block_done)(void *ctx, int l);
    void *block_done_ctx;
    /* called before a forward reads block l's parameters, with -1 before
     * the embedding's and d.L before the head's, when set (training's
     * all-gather of ZeRO-1's parameters, in flight from the step before);
     * its context is block_done_ctx */
    void (*block_needs)(void *ctx, int l);
    /* when set, the embedding's backward adds its rows here, not into
     * G.wte (training at dp > 1: see EmbRows) */
    EmbRows *emb_rows;
} Model;

/* Builds the registry and allocates parameters, gradients and activations
 * for micro-batches of up to maxB sequences. tp may be NULL (alone). */
void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp);
void model_free(Model *m);

/* The parameter registry a model of dims d would have, without the model:
 * *reg (malloc'd, the caller frees it) and the count. */
int model_registry(const ModelDims *d, ParamInfo **reg);

/* Bytes a rank's model takes: what model_init(d, maxB), model_set_slots(slots)
 * and, when optimizer, adamw_init allocate (acts: the sets and the working
 * copy of d->recompute). Every product saturates at
 * SIZE_MAX, so any config can be measured before anything is allocated. */
typedef struct {
    size_t params, grads, moments, acts, scratch;
    size_t staging; /* a copy of the weights and moments for asynchronous saves, set by the caller */
    size_t data;    /* the data path (ds_memory), set by the caller */
    size_t threads; /* each thread's own buffers (model_memory_threads) */
    size_t total;
} ModelMemory;
void model_memory(const ModelDims *d, int maxB, int slots, int optimizer, ModelMemory *mm);
/* Adds what threads threads' own buffers reach (kernels_thread_bytes at
 * the model's head size) to mm's threads and total. */
void model_memory_threads(ModelMemory *mm, const ModelDims *d, int threads);
/* What model_memory adds up, by part, for dims d (its tp, routing and
 * shape; not its stage) and micro-batches of maxB: a stage of any blocks is
 * then measured in a few operations, without a registry of its own (the
 * planner measures thousands of stages). [first][last]: of the stage. */
typedef struct {
    size_t top_floats[2][2];           /* the rows outside the blocks: wte, wpe, ln_f */
    /* a block's, by kind: routed + 2 * MoE (0 dense, 1 routed, 2 MoE,
     * 3 routed MoE); 0 for a kind the model has not */
    size_t block_floats[4];
    size_t set_bytes[2];               /* an activation set's own rows, [last] */
    size_t block_acts[4];              /* what a set keeps of a block */
    size_t work_acts[4];               /* what recompute leaves to the working copy */
    size_t scratch[2];                 /* [last]: the head's chunk is the last stage's */
} ModelUnits;
void model_units(const ModelDims *d, int maxB, ModelUnits *u);
/* model_memory of d's stage (l0, l1, first, last) from u. */
void model_memory_units(const ModelUnits *u, const ModelDims *d, int slots, int optimizer,
                        ModelMemory *mm);
/* Registry rows built so far by this process (the planner's tests bound
 * its work with it). */
size_t model_registry_rows_built(void);
/* 0 when mm->total fits in budget (bytes each of `ranks` ranks on a node may
 * use), else -1 with err saying how much is needed and what would help. */
int model_memory_check(const ModelMemory *mm, size_t budget, int ranks, Err *err);

/* Counter-based init: element i of tensor `name` depends on (seed, name, i)
 * only, so every layout starts from the same model. */
void model_init_weights(Model *m, uint64_t seed);

/* Global index (row-major in the global shape) of local element i of p. */
size_t param_global_index(const ParamInfo *p, int tp, int tp_rank, size_t i);
/* Whether a tensor (by its registry or checkpoint name) is a router's or
 * a MoD predictor's. */
int param_is_routing(const char *name);
/* Registry row by name, or NULL. */
const ParamInfo *model_find_param(const Model *m, const char *name);
/* The tied embedding's registry row, or NULL on stages without it (and
 * when the head is untied). */
const ParamInfo *model_tied_param(const Model *m);
/* The token embedding's row (the first stage's), the head's (the last
 * stage's: the tied embedding or lm_head), or NULL on other stages. */
const ParamInfo *model_embed_param(const Model *m);
const ParamInfo *model_head_param(const Model *m);
/* Where the head's weights and their gradients are: wte, or lm_head. */
static inline float *model_head_w(const ParamPtrs *p) { return p->lmw ? p->lmw : p->wte; }
/* The global start of block b of p along split_dim, and its local start
 * and width under tp. */
static inline void param_block(const ParamInfo *p, int b, int tp, long *g0, long *l0, long *lw) {
    long g = 0, l = 0;
    for (int j = 0; j < b; j++) g += p->block_w[j], l += p->block_w[j] / tp;
    *g0 = g, *l0 = l, *lw = p->block_w[b] / tp;
}
/* Points a ParamPtrs at a buffer laid out like m->params (for Adam moments). */
void model_point(const Model *m, ParamPtrs *pp, float *base);

/* Forward over B sequences of T tokens (1 <= B <= maxB, 1 <= T <= maxT) in
 * the current activation set. With targets, returns the mean cross-entropy
 * (the LM loss) and keeps what backward needs; without, keeps ln_f's output
 * for model_logits() and returns 0. Routed blocks choose their tokens by m->route;
 * cur->aux_loss and cur->pred_loss hold the routing BCEs. Returns NAN with
 * m->faulted set when debug routing checks failed. */
float model_forward(Model *m, const int *inputs, const int *targets, int B, int T);
/* Backward of the last loss forward; each token's loss is weighted by dloss
 * (1 / tokens in the step), the router's BCE by aux_weight * dloss / (routed
 * blocks) and the predictor's by dloss / (routed blocks). Adds into m->grads. */
void model_backward(Model *m, float dloss, float aux_weight);
/* A promise for the next model_forward only: a model_backward with this
 * dloss will follow it, on the same activation set. Its head then does its
 * own backward as it goes (into G.wte, and ln_f's output gradient kept for
 * model_backward) instead of recomputing the logits there. A forward
 * without it never touches the gradients. */
void model_expect_backward(Model *m, float dloss);
/* This rank's logits (n, Vl) of rows [row, row + n) of the current set's
 * last forward (n <= d.head_rows), computed from ln_f's output into the
 * scratch, where they stay until the next forward, backward, decode step or
 * model_logits. Not after a forward under model_expect_backward; NULL on
 * stages before the last. */
const float *model_logits(Model *m, int row, int n);
/* Zeroes the gradients, unless the optimizer's step left them zero. */
void model_zero_grad(Model *m);
void model_stats_reset(Model *m);
/* RouteStats as ROUTE_STATS_FIXED + L doubles and back (for reductions). */
enum { ROUTE_STATS_FIXED = 7 };
/* Doubles route_stats_to_vec writes for d's model. */
int route_stats_len(const ModelDims *d);
void route_stats_to_vec(const RouteStats *st, const ModelDims *d, double *v);
void route_stats_from_vec(RouteStats *st, const ModelDims *d, const double *v);
/* This rank's sums of squares of the gradients, of tensors split across tp
 * and of replicated ones, [1] of the experts' (this rank's share of them);
 * a later stage's copy of the tied embedding is left to the first stage. */
void model_grad_sumsq(const Model *m, double split[2], double replicated[2]);
/* The same over the ranges [lo[k], hi[k]) of the buffer only (ZeRO-1: a
 * rank's shard); nr < 0: the whole buffer, as model_grad_sumsq. */
void model_grad_sumsq_ranges(const Model *m, const size_t *lo, const size_t *hi, int nr,
                             double split[2], double replicated[2]);
/* n activation sets (micro-batches in flight); all are freed with the
 * model. Each is sized for the largest of the stage's chunks and laid out
 * for one chunk at a time (chunk 0 at first). model_use_slot makes set k
 * the one forward and backward use (m->cur); model_use_chunk the same,
 * laying it out for chunk c first (only its pointers move: the set's own
 * rows, enc among them, stay where they are). A forward runs the set's
 * chunk: the embedding before chunk 0 on the first stage, the head after
 * the last chunk on the last. */
void model_set_slots(Model *m, int n);
void model_use_slot(Model *m, int k);
void model_use_chunk(Model *m, int k, int c);
/* Whether the current set's forward begins with the embedding (chunk 0 of
 * the first stage), ends with the head (the last chunk of the last). */
int model_set_embeds(const Model *m);
int model_set_heads(const Model *m);
/* The residual stream this stage hands to the next: (B,T,C) of the current
 * set's last forward. A later stage's input goes in m->cur->enc before its
 * forward, and the gradient of its output in m->s.dres before its
 * backward. */
float *model_stage_output(const Model *m);

/* Global parameter count (real vocabulary, no padding). */
size_t model_num_params(const Model *m);
/* Matmul FLOPs per trained token (forward + backward) at sequence length T,
 * when block l processes a fraction frac[l] of the tokens (NULL: all, and
 * no routers: the dense model of the same size). */
double model_flops_per_token(const ModelDims *d, int T, const double *frac);
/* The same, where an MoE block l's expert slots kept per token it processes
 * are slots[l] (NULL: expert_top_k each, none dropped or sent to a no-op). */
double model_flops_per_token_moe(const ModelDims *d, int T, const double *frac,
                                 const double *slots);

/* Incremental decoding with a KV cache per block that holds only the tokens
 * that went through that block; routed blocks decide causally per token. */
typedef struct {
    float **k, **v;   /* (L) caches (maxT, Cl) */
    int *len;         /* (L) tokens cached */
    long long *processed, steps; /* (L) tokens each block processed, tokens decoded */
    float *x, *att;              /* (C) the token's residual stream, (maxT) scratch */
} DecodeState;

void decode_init(DecodeState *s, const Model *m);
void decode_free(DecodeState *s, const Model *m);
/* Forgets the cached tokens (the counters stay). */
void decode_reset(DecodeState *s, const Model *m);
/* Runs token `tok` at position pos (= tokens decoded since the last reset)
 * through this stage's blocks (the same block code as the full forward, on
 * one row with the block's KV cache); returns its logits (Vl) in
 * m->s.logits on the last pipeline stage, NULL on the others (which pass
 * the token's residual stream on through the pipeline). */
const float *decode_step(Model *m, DecodeState *s, int tok, int pos);

#endif
