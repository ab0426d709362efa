/*
 * model_mem: a model's activations and memory. One size table per kind of
 * buffer (a block's, an activation set's own, the scratch) says what each
 * buffer holds and where it exists; allocation lays the buffers out from
 * it, and model_memory measures the same table, so what the planner and
 * train's memory check count is what model_init (here, at the end, with
 * model_free and the accessors of a set's stage output) allocates.
 */
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

/* The activation size table (after llm.c's act_sizes): one row per buffer,
 * naming the field that points at it, its element size, its element count
 * as a function of the dims, and where it exists. An activation set is one
 * allocation laid out row by row, every buffer on a 64-byte boundary. */
typedef enum {
    SZ_N,    /* B*T: one per token */
    SZ_NC,   /* B*T*C */
    SZ_N3CL, /* B*T*3Cl: q, k, v of this rank's heads, each query head's own */
    SZ_NQKV, /* B*T*qkvl: q, k, v of this rank's heads (llama: KVl k and v heads) */
    SZ_NCL,  /* B*T*Cl */
    SZ_NFL,  /* B*T*Fl: this rank's MLP columns */
    SZ_NGU,  /* B*T*Fl, llama B*T*2Fl: the MLP's first product (gate|up) */
    SZ_ROPE, /* maxT*hs/2: the rotary positions' cosines or sines */
    SZ_NH,   /* B*T*H: the predictor's hidden layer */
    SZ_LSE,  /* B*T*NHl: attention row log-sum-exps */
    SZ_OFF,  /* B+1: sequence offsets */
    SZ_HVL,  /* min(B*T, head_rows)*Vl: this rank's logits of one chunk of the head */
    SZ_3N,   /* 3*B*T: per-row max, sum and target logit of the loss */
    SZ_2NH,  /* 2*B*T*H: the predictor's hidden gradients (one H when no predictor) */
    SZ_NET,  /* B*T*(E+Nn): the experts' router probabilities */
    SZ_NK,   /* B*T*k: expert slots */
    SZ_NKC,  /* B*T*k*C: rows sent to experts */
    SZ_RC,   /* R*C: rows received by this rank's experts, R = B*T*k*ep */
    SZ_RFL,  /* R*Fel: their hidden rows */
    SZ_RGU,  /* R*Fel, llama R*2Fel: their first product */
    SZ_MCNT  /* 2E + El + 1: the all-to-all's counts */
} SizeKind;
typedef enum {
    IN_ANY,
    IN_ROUTED,
    IN_PREDICTOR,
    IN_LAST_STAGE,
    IN_DENSE_MLP,  /* a block with the dense MLP */
    IN_MOE,        /* an MoE block */
    IN_MOE_EP,     /* an MoE block under ep > 1 */
    IN_ANY_MOE,    /* the model has MoE blocks (scratch) */
    IN_ANY_MOE_EP, /* ... under ep > 1 */
    IN_GPT2,       /* a gpt2 model (LayerNorm's means) */
    IN_LAST_GPT2,  /* the last stage of one (ln_f's) */
    IN_LLAMA,      /* a llama model (rotary positions) */
    IN_GQA         /* fewer kv heads than query heads (their expansion) */
} Where;
/* A block's buffer that the set leaves, from recompute mode r on, to the
 * working copy the backward recomputes it in: WORK(r) in its where (r + 1
 * in the bits above the Where; none there: always kept). */
#define WORK(r) (((r) + 1) << 8)
#define WORK_FROM(where) ((Recompute)(((where) >> 8) - 1))
typedef struct {
    size_t field; /* offset of the pointer in its struct */
    size_t elem;  /* bytes per element */
    SizeKind n;
    int where; /* a Where, | WORK(r) for the buffers recompute r and above leave out */
} ActRow;

#define F sizeof(float)
#define W_ATT WORK(RECOMPUTE_ATTENTION) /* the attention branch up to its projection */
#define W_BLK WORK(RECOMPUTE_BLOCK)     /* the rest of a block but its output, res3 */
/* the MLP's GELU output: never kept (the backward makes it again from the
 * kept pre-activation, one elementwise pass, where keeping it cost 4 of a
 * block's 16 floats of d_model a token) */
#define W_ALL WORK(RECOMPUTE_NONE)
#define BA(f) offsetof(BlockActs, f)
static const ActRow block_rows[] = {
    {BA(ln1), F, SZ_NC, IN_ANY | W_ATT},
    {BA(ln1_mean), F, SZ_N, IN_GPT2 | W_ATT},
    {BA(ln1_rstd), F, SZ_N, IN_ANY | W_ATT},
    {BA(qkv), F, SZ_NQKV, IN_ANY | W_ATT},
    {BA(lse), F, SZ_LSE, IN_ANY | W_ATT},
    {BA(atty), F, SZ_NCL, IN_ANY | W_ATT},
    {BA(res2), F, SZ_NC, IN_ANY | W_BLK},
    {BA(ln2), F, SZ_NC, IN_ANY | W_BLK},
    {BA(ln2_mean), F, SZ_N, IN_GPT2 | W_BLK},
    {BA(ln2_rstd), F, SZ_N, IN_ANY | W_BLK},
    {BA(fch), F, SZ_NGU, IN_DENSE_MLP | W_BLK},
    {BA(fch_gelu), F, SZ_NFL, IN_DENSE_MLP | W_ALL},
    {BA(res3), F, SZ_NC, IN_ANY},
    {BA(r), F, SZ_N, IN_ROUTED | W_BLK},
    {BA(topk), 1, SZ_N, IN_ROUTED | W_BLK},
    {BA(sel), sizeof(int), SZ_N, IN_ROUTED | W_BLK},
    {BA(off), sizeof(int), SZ_OFF, IN_ROUTED | W_BLK},
    {BA(gate), F, SZ_N, IN_ROUTED | W_BLK},
    {BA(xs), F, SZ_NC, IN_ROUTED | W_BLK},
    {BA(a), F, SZ_NC, IN_ROUTED | W_BLK},
    {BA(mo), F, SZ_NC, IN_ROUTED | W_BLK},
    {BA(plogit), F, SZ_N, IN_PREDICTOR | W_BLK},
    {BA(ph), F, SZ_NH, IN_PREDICTOR | W_BLK},
    {BA(phg), F, SZ_NH, IN_PREDICTOR | W_BLK},
    {BA(mp), F, SZ_NET, IN_MOE | W_BLK},
    {BA(mch), sizeof(int), SZ_NK, IN_MOE | W_BLK},
    {BA(mslot), sizeof(int), SZ_NK, IN_MOE | W_BLK},
    {BA(mcnt), sizeof(int), SZ_MCNT, IN_MOE | W_BLK},
    {BA(mxs), F, SZ_NKC, IN_MOE | W_BLK},
    {BA(mys), F, SZ_NKC, IN_MOE | W_BLK},
    {BA(mxr), F, SZ_RC, IN_MOE_EP | W_BLK},
    {BA(myr), F, SZ_RC, IN_MOE_EP | W_BLK},
    {BA(mh), F, SZ_RGU, IN_MOE | W_BLK},
    {BA(mhg), F, SZ_RFL, IN_MOE | W_ALL},
};
#define AS(f) offsetof(ActSet, f)
static const ActRow set_rows[] = {
    {AS(enc), F, SZ_NC, IN_ANY},
    {AS(lnf), F, SZ_NC, IN_LAST_STAGE},
    {AS(lnf_mean), F, SZ_N, IN_LAST_GPT2},
    {AS(lnf_rstd), F, SZ_N, IN_LAST_STAGE},
    {AS(lmax), F, SZ_N, IN_LAST_STAGE},
    {AS(lsum), F, SZ_N, IN_LAST_STAGE},
    {AS(losses), F, SZ_N, IN_LAST_STAGE},
    {AS(inputs), sizeof(int), SZ_N, IN_ANY},
    {AS(targets), sizeof(int), SZ_N, IN_ANY},
};
#define SC(f) offsetof(Scratch, f)
static const ActRow scratch_rows[] = {
    {SC(dres), F, SZ_NC, IN_ANY},           {SC(dln), F, SZ_NC, IN_ANY},
    {SC(scratch), F, SZ_NC, IN_ANY},        {SC(scratch2), F, SZ_NC, IN_ANY},
    {SC(dqkv), F, SZ_N3CL, IN_ANY},         {SC(datty), F, SZ_NCL, IN_ANY},
    {SC(dfch), F, SZ_NGU, IN_ANY},          {SC(dfchg), F, SZ_NFL, IN_ANY},
    {SC(qkvg), F, SZ_N3CL, IN_GQA},         {SC(pos), sizeof(int), SZ_N, IN_LLAMA},
    {SC(rope_cos), F, SZ_ROPE, IN_LLAMA},   {SC(rope_sin), F, SZ_ROPE, IN_LLAMA},
    {SC(rowbuf), F, SZ_3N, IN_ANY},         {SC(dr), F, SZ_N, IN_ANY},
    {SC(dph), F, SZ_2NH, IN_ANY},           {SC(off_dense), sizeof(int), SZ_OFF, IN_ANY},
    {SC(mdys), F, SZ_NKC, IN_ANY_MOE},      {SC(mdyr), F, SZ_RC, IN_ANY_MOE_EP},
    {SC(mdxr), F, SZ_RC, IN_ANY_MOE},       {SC(mdh), F, SZ_RGU, IN_ANY_MOE},
    {SC(mdhg), F, SZ_RFL, IN_ANY_MOE},      {SC(mdp), F, SZ_NET, IN_ANY_MOE},
    {SC(logits), F, SZ_HVL, IN_LAST_STAGE},
};
#undef F
#undef W_ATT
#undef W_BLK
#undef BA
#undef AS
#undef SC
#define NROWS(t) (sizeof(t) / sizeof((t)[0]))

/* Saturating (SIZE_MAX: more than can exist), so that model_memory() can
 * measure any config before anything is allocated. */
static size_t size_of(const Model *m, SizeKind k) {
    const ModelDims *d = &m->d;
    const size_t B = (size_t)m->maxB, N = sat_mul(B, (size_t)d->maxT), C = (size_t)d->C;
    const size_t gu = d->arch == ARCH_LLAMA ? 2 : 1; /* llama's gate|up rows */
    switch (k) {
    case SZ_N: return N;
    case SZ_NC: return sat_mul(N, C);
    case SZ_N3CL: return sat_mul(N, 3 * (size_t)d->Cl);
    case SZ_NCL: return sat_mul(N, (size_t)d->Cl);
    case SZ_NQKV: return sat_mul(N, (size_t)d->qkvl);
    case SZ_NFL: return sat_mul(N, (size_t)d->Fl);
    case SZ_NGU: return sat_mul(N, (size_t)d->Fl * gu);
    case SZ_ROPE: return (size_t)d->maxT * (size_t)(d->hs / 2);
    case SZ_NH: return sat_mul(N, (size_t)d->H);
    case SZ_LSE: return sat_mul(N, (size_t)d->NHl);
    case SZ_OFF: return B + 1;
    case SZ_HVL: return sat_mul(N < (size_t)d->head_rows ? N : (size_t)d->head_rows, (size_t)d->Vl);
    case SZ_3N: return sat_mul(3, N);
    case SZ_2NH:
        return sat_mul(2 * N, (size_t)(d->predictor ? d->H : 1)); /* dL/d(hidden), dL/d(gelu) */
    case SZ_NET: return sat_mul(N, (size_t)(d->E + d->Nn));
    case SZ_NK: return sat_mul(N, (size_t)d->ek);
    case SZ_NKC: return sat_mul(sat_mul(N, (size_t)d->ek), C);
    case SZ_RC: return sat_mul(sat_mul(sat_mul(N, (size_t)d->ek), (size_t)d->ep), C);
    case SZ_RFL: return sat_mul(sat_mul(sat_mul(N, (size_t)d->ek), (size_t)d->ep), (size_t)d->Fel);
    case SZ_RGU:
        return sat_mul(sat_mul(sat_mul(N, (size_t)d->ek), (size_t)d->ep), (size_t)d->Fel * gu);
    case SZ_MCNT: return 2 * (size_t)d->E + (size_t)d->El + 1;
    }
    return 0;
}

static int row_exists(const Model *m, Where w, int l) {
    switch (w) {
    case IN_ANY: return 1;
    case IN_ROUTED: return model_is_routed(&m->d, l);
    case IN_PREDICTOR: return model_is_routed(&m->d, l) && m->d.predictor;
    case IN_LAST_STAGE: return model_last_stage(&m->d);
    case IN_DENSE_MLP: return !model_is_moe(&m->d, l);
    case IN_MOE: return model_is_moe(&m->d, l);
    case IN_MOE_EP: return model_is_moe(&m->d, l) && m->d.ep > 1;
    case IN_ANY_MOE: return m->d.E > 0;
    case IN_ANY_MOE_EP: return m->d.E > 0 && m->d.ep > 1;
    case IN_GPT2: return m->d.arch == ARCH_GPT2;
    case IN_LAST_GPT2: return m->d.arch == ARCH_GPT2 && model_last_stage(&m->d);
    case IN_LLAMA: return m->d.arch == ARCH_LLAMA;
    case IN_GQA: return m->d.KV != m->d.NH;
    }
    return 0;
}

static size_t round64(size_t bytes) {
    return bytes > SIZE_MAX - 63 ? SIZE_MAX : (bytes + 63) & ~(size_t)63;
}

/* Whether the set keeps the row under m's recompute mode (else the
 * working copy holds it). */
static int row_kept(const Model *m, const ActRow *r) {
    return (r->where >> 8) == 0 || m->d.recompute < WORK_FROM(r->where);
}

/* Lays the rows out from byte `at` of base, pointing owner's fields into it
 * (base NULL: only measures); returns the next free byte. l: the block;
 * kept: the rows the set keeps (1) or those the working copy holds (0). */
static size_t lay_out(const Model *m, const ActRow *rows, size_t n, int l, int kept, void *owner,
                      char *base, size_t at) {
    for (size_t i = 0; i < n; i++) {
        if (!row_exists(m, (Where)(rows[i].where & 0xff), l) || row_kept(m, &rows[i]) != kept)
            continue;
        if (base) {
            void *p = base + at;
            memcpy((char *)owner + rows[i].field, &p, sizeof p);
        }
        at = sat_add(at, round64(sat_mul(size_of(m, rows[i].n), rows[i].elem)));
    }
    return at;
}

/* One activation set in base (NULL: measures it): the BlockActs array,
 * the set's own buffers, then what it keeps of this stage's blocks; the
 * rest of each block points into the working copy, the same for every
 * set. Returns the set's bytes. */
static size_t actset_layout(const Model *m, ActSet *s, char *base) {
    size_t at = round64((size_t)m->d.L * sizeof(BlockActs));
    if (base) s->acts = (BlockActs *)(void *)base;
    at = lay_out(m, set_rows, NROWS(set_rows), -1, 1, s, base, at);
    const int c0 = m->d.c0[s->chunk], c1 = m->d.c1[s->chunk];
    for (int l = c0; l < c1; l++)
        at = lay_out(m, block_rows, NROWS(block_rows), l, 1, base ? &s->acts[l] : NULL, base, at);
    for (int l = c0; base && l < c1; l++)
        lay_out(m, block_rows, NROWS(block_rows), l, 0, &s->acts[l], m->work, 0);
    return at;
}

/* Bytes of block l's buffers that the working copy holds. */
static size_t work_layout(const Model *m, int l) {
    return lay_out(m, block_rows, NROWS(block_rows), l, 0, NULL, NULL, 0);
}

int model_registry(const ModelDims *d, ParamInfo **reg) {
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    model_build_registry(&m, 0);
    *reg = m.reg;
    return m.nreg;
}

/* Floats of the registry of a stage of d holding blocks [l0, l1), the first
 * and/or the last stage as said (measured, not built). */
static size_t stage_floats(const ModelDims *d, int first, int last, int l0, int l1) {
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    m.d.pp = 3, m.d.pp_rank = first ? 0 : last ? 2 : 1; /* first, last or a middle stage */
    if (first && last) m.d.pp = 1;
    m.d.nchunk = 1, m.d.c0[0] = l0, m.d.c1[0] = l1;
    model_build_registry(&m, 1);
    return m.nparams;
}

static int block_kind(const ModelDims *d, int l) {
    return model_is_routed(d, l) + 2 * model_is_moe(d, l);
}

void model_units(const ModelDims *d, int maxB, ModelUnits *u) {
    memset(u, 0, sizeof *u);
    for (int first = 0; first < 2; first++)
        for (int last = 0; last < 2; last++)
            u->top_floats[first][last] = stage_floats(d, first, last, 0, 0);
    Model m;
    memset(&m, 0, sizeof m);
    m.d = *d;
    m.maxB = maxB;
    /* the first block of each kind the model has (counted in a few
     * operations, so that the scan stops at the last kind's first) */
    ModelDims whole = *d;
    model_dims_whole(&whole);
    int both;
    const int moe = model_stage_moe(&whole, &both), routed = model_stage_routed(&whole);
    int left = (d->L - routed - moe + both > 0) + (routed > both) + (moe > both) + (both > 0);
    for (int l = 0; l < d->L && left > 0; l++) {
        const int k = block_kind(d, l);
        if (u->block_floats[k]) continue;
        u->block_floats[k] = stage_floats(d, 0, 0, l, l + 1);
        u->block_acts[k] = lay_out(&m, block_rows, NROWS(block_rows), l, 1, NULL, NULL, 0);
        u->work_acts[k] = work_layout(&m, l);
        left--;
    }
    for (int last = 0; last < 2; last++) {
        /* the set's and the scratch's rows depend on the last stage only */
        m.d.pp = last ? 1 : 2, m.d.pp_rank = 0;
        u->set_bytes[last] = lay_out(&m, set_rows, NROWS(set_rows), -1, 1, NULL, NULL,
                                     round64((size_t)d->L * sizeof(BlockActs)));
        u->scratch[last] = lay_out(&m, scratch_rows, NROWS(scratch_rows), -1, 1, NULL, NULL, 0);
    }
}

/* The stage's blocks by kind (routed + 2 * MoE), in a few operations. */
static void stage_kinds(const ModelDims *d, size_t kinds[4]) {
    int both = 0;
    const int moe = d->E > 0 ? model_stage_moe(d, &both) : 0, routed = model_stage_routed(d);
    kinds[3] = (size_t)both;
    kinds[2] = (size_t)(moe - both);
    kinds[1] = (size_t)(routed - both);
    kinds[0] = (size_t)(model_stage_blocks(d) - routed - moe + both);
}

void model_memory_units(const ModelUnits *u, const ModelDims *d, int slots, int optimizer,
                        ModelMemory *mm) {
    /* in a few operations: the planner measures thousands of stages */
    size_t kinds[4];
    stage_kinds(d, kinds);
    const int nk = d->E > 0 ? 4 : 2;
    size_t nparams = u->top_floats[model_first_stage(d)][model_last_stage(d)], work = 0;
    for (int k = 0; k < nk; k++) {
        nparams = sat_add(nparams, sat_mul(kinds[k], u->block_floats[k]));
        if (kinds[k] > 0 && u->work_acts[k] > work) work = u->work_acts[k];
    }
    /* a set holds the largest chunk's blocks (the stage's, but under
     * interleaving) */
    size_t set = 0;
    for (int c = 0; c < d->nchunk; c++) {
        ModelDims one = *d;
        one.nchunk = 1, one.c0[0] = d->c0[c], one.c1[0] = d->c1[c];
        stage_kinds(&one, kinds);
        size_t b = u->set_bytes[model_last_stage(d)];
        for (int k = 0; k < nk; k++) b = sat_add(b, sat_mul(kinds[k], u->block_acts[k]));
        set = b > set ? b : set;
    }
    const size_t param_bytes = sat_mul(nparams, sizeof(float));
    memset(mm, 0, sizeof *mm);
    mm->params = param_bytes;
    mm->grads = param_bytes;
    mm->moments = optimizer ? sat_mul(2, param_bytes) : 0;
    mm->acts = sat_add(sat_mul((size_t)slots, set), work);
    mm->scratch = u->scratch[model_last_stage(d)];
    mm->total = sat_add(sat_add(sat_add(mm->params, mm->grads), sat_add(mm->moments, mm->acts)),
                        mm->scratch);
}

void model_memory(const ModelDims *d, int maxB, int slots, int optimizer, ModelMemory *mm) {
    ModelUnits u;
    model_units(d, maxB, &u);
    model_memory_units(&u, d, slots, optimizer, mm);
}

void model_memory_threads(ModelMemory *mm, const ModelDims *d, int threads) {
    mm->threads = sat_mul((size_t)(threads > 0 ? threads : 1), kernels_thread_bytes(d->hs));
    mm->total = sat_add(mm->total, mm->threads);
}

int model_memory_check(const ModelMemory *mm, size_t budget, int ranks, Err *err) {
    if (mm->total <= budget) return 0;
    char tot[32], b[32], p[32], mo[32], a[32];
    format_bytes(tot, sizeof tot, mm->total);
    format_bytes(b, sizeof b, budget);
    format_bytes(p, sizeof p, sat_add(mm->params, mm->grads));
    format_bytes(mo, sizeof mo, mm->moments);
    format_bytes(a, sizeof a, sat_add(mm->acts, mm->scratch));
    char st[192] = "", sb[32];
    if (mm->staging) {
        format_bytes(sb, sizeof sb, mm->staging);
        snprintf(st, sizeof st, ", checkpoint staging copy %s", sb);
    }
    if (mm->data) {
        format_bytes(sb, sizeof sb, mm->data);
        snprintf(st + strlen(st), sizeof st - strlen(st), ", data path %s", sb);
    }
    if (mm->threads) {
        format_bytes(sb, sizeof sb, mm->threads);
        snprintf(st + strlen(st), sizeof st - strlen(st), ", the threads' buffers %s", sb);
    }
    return err_set(err,
                   "the model needs %s per rank (parameters and gradients %s, AdamW moments %s, "
                   "activations %s%s), more than the %s each of the %d rank%s on this node can "
                   "have; lower micro_batch, seq_len, d_model or n_layer, or split the model over "
                   "more ranks (tp, pp)%s",
                   tot, p, mo, a, st, b, ranks, ranks == 1 ? "" : "s",
                   mm->staging ? ", or save synchronously (ckpt_async 0)" : "");
}

/* Bytes a set takes for the largest of the stage's chunks. */
static size_t actset_bytes(const Model *m) {
    size_t most = 0;
    for (int c = 0; c < m->d.nchunk; c++) {
        ActSet probe = {.chunk = c};
        const size_t b = actset_layout(m, &probe, NULL);
        most = b > most ? b : most;
    }
    return most;
}

static void actset_alloc(const Model *m, ActSet *s) {
    memset(s, 0, sizeof *s);
    s->mem = xcalloc(1, actset_bytes(m));
    actset_layout(m, s, s->mem);
}

void model_set_slots(Model *m, int n) {
    for (int k = n; k < m->nslots; k++) free(m->slots[k].mem);
    m->slots = xrealloc(m->slots, (size_t)n * sizeof(ActSet));
    for (int k = m->nslots; k < n; k++) actset_alloc(m, &m->slots[k]);
    m->nslots = n;
    m->cur = &m->slots[0];
}

void model_use_chunk(Model *m, int k, int c) {
    ActSet *s = &m->slots[k];
    if (s->chunk != c) {
        s->chunk = c;
        actset_layout(m, s, s->mem);
    }
    m->cur = s;
}

void model_use_slot(Model *m, int k) { m->cur = &m->slots[k]; }

void model_alloc_scratch(Model *m) {
    m->s.mem = xcalloc(1, lay_out(m, scratch_rows, NROWS(scratch_rows), -1, 1, &m->s, NULL, 0));
    lay_out(m, scratch_rows, NROWS(scratch_rows), -1, 1, &m->s, m->s.mem, 0);
    if (m->d.arch == ARCH_LLAMA)
        rope_tables(m->s.rope_cos, m->s.rope_sin, m->d.maxT, m->d.hs, m->d.theta);
}

void model_alloc_work(Model *m) {
    size_t bytes = 0;
    for (int l = 0; l < m->d.L; l++) {
        if (!model_holds(&m->d, l)) continue;
        const size_t b = work_layout(m, l);
        bytes = b > bytes ? b : bytes;
    }
    m->work = bytes ? xcalloc(1, bytes) : NULL;
}

void model_init(Model *m, const ModelDims *d, int maxB, const TpGroup *tp) {
    memset(m, 0, sizeof *m);
    m->d = *d;
    if (tp) m->tp = *tp;
    else m->tp = (TpGroup){MPI_COMM_NULL, 1, 0};
    model_build_registry(m, 0);
    m->params = xcalloc(m->nparams, sizeof(float));
    m->grads = xcalloc(m->nparams, sizeof(float));
    m->P.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    m->G.h = xcalloc((size_t)d->L, sizeof(BlockParams));
    for (int l = model_next_held(d, 0); l < d->L; l = model_next_held(d, l + 1))
        if (model_is_moe(d, l)) {
            m->P.h[l].ex = xcalloc((size_t)d->El, sizeof(ExpertParams));
            m->G.h[l].ex = xcalloc((size_t)d->El, sizeof(ExpertParams));
        }
    model_point(m, &m->P, m->params);
    model_point(m, &m->G, m->grads);
    m->predictor_on = 1;
    RouteStats *st[2] = {&m->stats, &m->restats};
    for (int i = 0; i < 2; i++) {
        st[i]->processed = xcalloc((size_t)d->L, sizeof(long long));
        st[i]->moe = xcalloc((size_t)d->L * (d->E + d->Nn + 2), sizeof(long long));
        st[i]->expert_rows = xcalloc((size_t)d->L * d->El + 1, sizeof(long long));
    }
    m->ep = (EpGroup){MPI_COMM_NULL, 1, 0};
    m->maxB = maxB;
    m->pp_comm = MPI_COMM_NULL;
    model_alloc_work(m);
    model_set_slots(m, 1);
    model_alloc_scratch(m);
}

void model_free(Model *m) {
    for (int k = 0; k < m->nslots; k++) free(m->slots[k].mem);
    for (int l = 0; m->P.h && l < m->d.L; l++) {
        free(m->P.h[l].ex);
        free(m->G.h[l].ex);
    }
    void *bufs[] = {m->params, m->grads, m->s.mem,           m->slots,     m->P.h,
                    m->G.h,    m->reg,   m->stats.processed, m->stats.moe, m->stats.expert_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(m->work);
    free(m->restats.processed), free(m->restats.moe), free(m->restats.expert_rows);
    memset(m, 0, sizeof *m);
}

float *model_stage_output(const Model *m) {
    const int c0 = m->d.c0[m->cur->chunk], c1 = m->d.c1[m->cur->chunk];
    return c1 > c0 ? m->cur->acts[c1 - 1].res3 : m->cur->enc;
}

int model_set_embeds(const Model *m) { return model_first_stage(&m->d) && m->cur->chunk == 0; }

int model_set_heads(const Model *m) {
    return model_last_stage(&m->d) && m->cur->chunk == m->d.nchunk - 1;
}
