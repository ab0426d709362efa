/*
 * head: the last stage's ln_f, tied head and loss, over a micro-batch's N
 * rows in chunks of d.head_rows, so that one chunk's logits (the scratch's
 * logits, head_rows x Vl) are all that ever exist of them: a whole
 * micro-batch's would be N x Vl floats, 0.8 GB at V 50257, B 4, T 1024.
 *
 * A loss forward keeps each row's max logit and sum of exponentials
 * (vocab-parallel: each tp rank holds Vl columns, and per chunk the row
 * maxima, sums and target logits are all-reduced, never the logits; every
 * rank has the same N, so the same chunks and collectives). The head's
 * backward then happens in one of two places:
 *  - in the forward (llm.c's fused classifier), when the caller promised
 *    the backward's dloss (model_expect_backward, as training does): each
 *    chunk's dlogits go straight into G.wte and into ln_f's output
 *    gradient, written over the chunk's rows of lnf, which nothing needs
 *    after (ln_f's backward reads its input, mean and rstd);
 *  - in model_backward otherwise, which recomputes each chunk's logits
 *    from lnf and the kept row statistics: one more head product (2CV
 *    FLOPs a token, a tenth of GPT-2 small's step) and the exponentials
 *    again; at V 50257, C 768, 2 layers it made the step about a third
 *    slower than the fused head, which is why training promises.
 * Both make the same probabilities from the same logits, so they give the
 * same gradients bit for bit.
 *
 * The reference head (m->ref_logits set, tests only) is the unchunked one:
 * the whole micro-batch's logits in the caller's buffer.
 */
#include "src/model/model_impl.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "mpi/tp.h"
#include "src/kernels/kernels.h"
#include "src/kernels/kernels_impl.h"

/* This rank's columns that are real tokens (the rest pad V to tp's multiple). */
static int valid_cols(const ModelDims *d) {
    const int valid = d->V - d->v0 < d->Vl ? d->V - d->v0 : d->Vl;
    return valid < 0 ? 0 : valid;
}

void head_forward(Model *m, const float *x, int N) {
    ActSet *S = m->cur;
    norm_forward(m, S->lnf, S->lnf_mean, S->lnf_rstd, x, m->P.lnfw, m->P.lnfb, N);
}

float *head_logits(Model *m, int r0, int n) {
    const ModelDims *d = &m->d;
    assert(n >= 1 && n <= d->head_rows);
    mm(0, 1, n, d->Vl, d->C, 1.f, m->cur->lnf + (size_t)r0 * d->C, d->C, model_head_w(&m->P), d->C,
       0.f, m->s.logits, d->Vl);
    return m->s.logits;
}

/* A row's largest logit and its sum of exponentials relative to it, over
 * the first n, in one read: blocks of 256 logits, each block's max found
 * first, the lanes' running sums rescaled once a block when the max grows
 * (one exp a logit, and one a block that raises the max), on LANES lanes. */
#define ROW_BLOCK 256
VEC_IMPL row_max_sum_impl(const float *row, int n, float *mx, float *sum) {
    float m = -INFINITY, sl[LANES] = {0};
    for (int j0 = 0; j0 < n; j0 += ROW_BLOCK) {
        const int j1 = j0 + ROW_BLOCK < n ? j0 + ROW_BLOCK : n;
        const int j16 = j0 + (j1 - j0) / LANES * LANES;
        float bl[LANES];
        for (int l = 0; l < LANES; l++) bl[l] = m;
        for (int j = j0; j < j16; j += LANES)
#pragma omp simd
            for (int l = 0; l < LANES; l++) bl[l] = row[j + l] > bl[l] ? row[j + l] : bl[l];
        for (int j = j16; j < j1; j++) bl[j - j16] = row[j] > bl[j - j16] ? row[j] : bl[j - j16];
        const float bm = lanes_max(bl);
        if (bm > m) {
            const float r = m == -INFINITY ? 0.f : fast_expf(m - bm);
#pragma omp simd
            for (int l = 0; l < LANES; l++) sl[l] *= r;
            m = bm;
        }
        for (int j = j0; j < j16; j += LANES)
#pragma omp simd
            for (int l = 0; l < LANES; l++) sl[l] += fast_expf(row[j + l] - m);
        for (int j = j16; j < j1; j++) sl[j - j16] += fast_expf(row[j] - m);
    }
    *mx = m;
    *sum = lanes_sum(sl);
}
VEC_DISPATCH(row_max_sum, (const float *row, int n, float *mx, float *sum), (row, n, mx, sum))

/* The probabilities of a row from its max and 1 / sum, written over the
 * logits: exp(row - mx) * inv; with dlogits, times scale and less scale
 * at the target t (when 0 <= t < n): (p - onehot(t)) * scale. The pad past
 * n up to Vl is zeroed. */
VEC_IMPL row_probs_impl(float *row, int n, int Vl, float mx, float inv, int dlogits, float scale,
                        int t) {
    if (!dlogits) {
#pragma omp simd
        for (int j = 0; j < n; j++) row[j] = fast_expf(row[j] - mx) * inv;
    } else {
#pragma omp simd
        for (int j = 0; j < n; j++) row[j] = fast_expf(row[j] - mx) * inv * scale;
        if (t >= 0 && t < n) row[t] -= scale;
    }
    for (int j = n; j < Vl; j++) row[j] = 0.f;
}
VEC_DISPATCH(row_probs,
             (float *row, int n, int Vl, float mx, float inv, int dlogits, float scale, int t),
             (row, n, Vl, mx, inv, dlogits, scale, t))

/* The loss of rows [r0, r0 + n) from their logits lg: keeps each row's max
 * and sum in the set and its loss in losses, and turns lg into
 * probabilities in place, or with a promised dloss (dlogits != 0) straight
 * into dlogits = (p - onehot(target)) * dloss. Two passes over the logits:
 * max and sum (read), then the probabilities (read and write). Under tp
 * each rank's max and sum are its columns'; the sums are brought to the
 * all-reduced max before they are added. */
static void chunk_loss(Model *m, float *lg, int r0, int n, int dlogits, float dloss) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int Vl = d->Vl, v0 = d->v0, valid = valid_cols(d);
    /* sum and target logit side by side: one all-reduce for both */
    float *mx = S->lmax + r0, *sum = m->s.rowbuf, *tl = m->s.rowbuf + n;
    float *own = m->s.rowbuf + 2 * (size_t)n; /* this rank's max, under tp */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *row = lg + (size_t)i * Vl;
        const int t = S->targets[r0 + i] - v0;
        tl[i] = t >= 0 && t < valid ? row[t] : 0.f;
        row_max_sum(row, valid, &mx[i], &sum[i]);
        own[i] = mx[i];
    }
    if (m->tp.size > 1) {
        tp_allreduce_max(mx, (size_t)n, &m->tp);
        for (int i = 0; i < n; i++)
            sum[i] = own[i] == -INFINITY ? 0.f : sum[i] * fast_expf(own[i] - mx[i]);
    }
    tp_allreduce_sum(sum, 2 * (size_t)n, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const int t = S->targets[r0 + i] - v0;
        row_probs(lg + (size_t)i * Vl, valid, Vl, mx[i], 1.f / sum[i], dlogits, dloss, t);
        S->lsum[r0 + i] = sum[i];
        S->losses[r0 + i] = logf(sum[i]) + mx[i] - tl[i];
    }
}

/* The probabilities of rows [r0, r0 + n) again, from their logits lg and
 * the kept statistics, in chunk_loss's operations (the same floats), as
 * dlogits for dloss. */
static void chunk_dlogits(const Model *m, float *lg, int r0, int n, float dloss) {
    const ModelDims *d = &m->d;
    const ActSet *S = m->cur;
    const int Vl = d->Vl, valid = valid_cols(d);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++)
        row_probs(lg + (size_t)i * Vl, valid, Vl, S->lmax[r0 + i], 1.f / S->lsum[r0 + i], 1, dloss,
                  S->targets[r0 + i] - d->v0);
}

/* Backward of rows [r0, r0 + n) from their dlogits: G.wte += dlogits^T @
 * lnf, then this rank's share of dL/d(lnf) into dlnf's rows (which may be
 * lnf's own: G.wte has read them by then). */
static void chunk_backward(Model *m, const float *dlg, int r0, int n, float *dlnf) {
    const ModelDims *d = &m->d;
    const ActSet *S = m->cur;
    const int C = d->C, Vl = d->Vl;
    mm(1, 0, Vl, C, n, 1.f, dlg, Vl, S->lnf + (size_t)r0 * C, C, 1.f, model_head_w(&m->G), C);
    mm(0, 0, n, C, Vl, 1.f, dlg, Vl, model_head_w(&m->P), C, 0.f, dlnf + (size_t)r0 * C, C);
}

float head_loss_forward(Model *m, int N, int fused, float dloss) {
    ActSet *S = m->cur;
    const int R = m->d.head_rows;
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        float *lg = head_logits(m, r0, n);
        chunk_loss(m, lg, r0, n, fused, dloss);
        if (fused) chunk_backward(m, lg, r0, n, S->lnf);
    }
    S->head_fused = fused;
    S->head_dloss = dloss;
    double total = 0;
    for (int i = 0; i < N; i++) total += S->losses[i];
    return (float)(total / N);
}

/* ---------------------------------------------------------------- reference */

/* Today's head before chunks: logits(N,Vl) = lnf @ wte^T for the whole
 * micro-batch into m->ref_logits; with targets, the vocab-parallel loss,
 * turning them into probabilities in place, and the mean loss. */
float head_reference_forward(Model *m, int N, int loss) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int Vl = d->Vl, v0 = d->v0, valid = valid_cols(d);
    float *lg = m->ref_logits;
    mm(0, 1, N, Vl, d->C, 1.f, S->lnf, d->C, model_head_w(&m->P), d->C, 0.f, lg, Vl);
    if (!loss) return 0.f;
    float *mx = m->s.rowbuf, *sum = m->s.rowbuf + N, *tl = m->s.rowbuf + 2 * N;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *row = lg + (size_t)i * Vl;
        float v = -INFINITY;
        for (int j = 0; j < valid; j++) v = row[j] > v ? row[j] : v;
        mx[i] = v;
    }
    tp_allreduce_max(mx, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = lg + (size_t)i * Vl;
        int t = S->targets[i] - v0;
        tl[i] = t >= 0 && t < valid ? row[t] : 0.f;
        float sm = 0.f;
        for (int j = 0; j < valid; j++) {
            row[j] = expf(row[j] - mx[i]);
            sm += row[j];
        }
        for (int j = valid; j < Vl; j++) row[j] = 0.f;
        sum[i] = sm;
    }
    tp_allreduce_sum(sum, (size_t)N, &m->tp);
    tp_allreduce_sum(tl, (size_t)N, &m->tp);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = lg + (size_t)i * Vl;
        float inv = 1.f / sum[i];
        for (int j = 0; j < valid; j++) row[j] *= inv;
        S->losses[i] = logf(sum[i]) + mx[i] - tl[i];
    }
    double total = 0;
    for (int i = 0; i < N; i++) total += S->losses[i];
    return (float)(total / N);
}

/* Its backward into m->s.dln (before the all-reduce), in place over the
 * probabilities. */
static void head_reference_backward(Model *m, float dloss, int N) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int C = d->C, Vl = d->Vl;
    float *lg = m->ref_logits;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *row = lg + (size_t)i * Vl;
        for (int j = 0; j < Vl; j++) row[j] *= dloss;
        int t = S->targets[i] - d->v0;
        if (t >= 0 && t < Vl) row[t] -= dloss;
    }
    mm(0, 0, N, C, Vl, 1.f, lg, Vl, model_head_w(&m->P), C, 0.f, m->s.dln, C);
    mm(1, 0, Vl, C, N, 1.f, lg, Vl, S->lnf, C, 1.f, model_head_w(&m->G), C);
}

/* ------------------------------------------------------------------ backward */

void head_backward(Model *m, float dloss, int N) {
    const ModelDims *d = &m->d;
    ActSet *S = m->cur;
    const int C = d->C, R = d->head_rows;
    const size_t NC = (size_t)N * C;
    float *dlnf = m->s.dln;
    if (m->ref_logits) {
        head_reference_backward(m, dloss, N);
    } else if (S->head_fused) { /* the forward did it, for this dloss */
        assert(S->head_dloss == dloss);
        dlnf = S->lnf;
    } else {
        for (int r0 = 0; r0 < N; r0 += R) {
            const int n = N - r0 < R ? N - r0 : R;
            float *lg = head_logits(m, r0, n);
            chunk_dlogits(m, lg, r0, n, dloss);
            chunk_backward(m, lg, r0, n, dlnf);
        }
    }
    tp_allreduce_sum(dlnf, NC, &m->tp);
    memset(m->s.dres, 0, NC * sizeof(float));
    norm_backward(m, m->s.dres, m->G.lnfw, m->G.lnfb, dlnf, model_stage_output(m), m->P.lnfw,
                  S->lnf_mean, S->lnf_rstd, N);
}

void model_expect_backward(Model *m, float dloss) {
    m->expect = 1;
    m->expect_dloss = dloss;
}

const float *model_logits(Model *m, int row, int n) {
    if (!model_last_stage(&m->d)) return NULL;
    assert(!m->cur->head_fused && row >= 0 && row + n <= m->cur->B * m->cur->T);
    return head_logits(m, row, n);
}
