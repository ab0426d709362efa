/*
 * decode: incremental decoding, one token at a time, with a KV cache per
 * block that holds only the tokens that went through that block. A routed
 * block decides causally per token; an MoE block sends the token to its
 * top-k experts with no capacity (one token cannot overflow an expert).
 */
#include <stdlib.h>
#include <string.h>

#include "mpi/pipeline.h"
#include "mpi/tp.h"
#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "src/model/model_impl.h"

void decode_init(DecodeState *s, const Model *m) {
    const ModelDims *d = &m->d;
    memset(s, 0, sizeof *s);
    s->k = xcalloc((size_t)d->L, sizeof(float *));
    s->v = xcalloc((size_t)d->L, sizeof(float *));
    for (int l = 0; l < d->L; l++) {
        s->k[l] = xcalloc((size_t)d->maxT * d->KVl * d->hs, sizeof(float));
        s->v[l] = xcalloc((size_t)d->maxT * d->KVl * d->hs, sizeof(float));
    }
    s->len = xcalloc((size_t)d->L, sizeof(int));
    s->processed = xcalloc((size_t)d->L, sizeof(long long));
    s->x = xcalloc((size_t)d->C, sizeof(float));
    s->att = xcalloc((size_t)d->maxT, sizeof(float));
}

void decode_free(DecodeState *s, const Model *m) {
    for (int l = 0; l < m->d.L; l++) {
        free(s->k[l]);
        free(s->v[l]);
    }
    void *bufs[] = {s->k, s->v, s->len, s->processed, s->x, s->att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(s, 0, sizeof *s);
}

void decode_reset(DecodeState *s, const Model *m) {
    memset(s->len, 0, (size_t)m->d.L * sizeof(int));
}

const float *decode_step(Model *m, DecodeState *s, int tok, int pos) {
    const ModelDims *d = &m->d;
    const int C = d->C;
    float *x = s->x, *a = m->s.scratch, *mo = m->s.scratch2;
    if (model_first_stage(d)) {
        embed_forward(x, &tok, m->P.wte, d->v0, d->Vl, 1, C);
        tp_allreduce_sum(x, (size_t)C, &m->tp);
        if (m->P.wpe)
            for (int c = 0; c < C; c++) x[c] += m->P.wpe[(size_t)pos * C + c];
    } else { /* a pipeline: the token's residual stream from the previous stage */
        pp_recv_prev(x, (size_t)C, PP_TAG_DECODE, m->pp_comm);
    }
    s->steps++;
    for (int l = d->c0[0]; l < d->c1[0]; l++) { /* one chunk: decoding is not interleaved */
        const BlockActs *A = &m->cur->acts[l];
        const int routed = model_is_routed(d, l);
        if (routed) {
            mod_router_forward(m, l, x, 1);
            /* skipped: costs nothing more, and leaves nothing in the cache */
            if (!mod_causal(d, A->r[0], d->predictor ? A->plogit[0] : 0.f)) continue;
        }
        s->processed[l]++;
        const KvCache kv = {s->k[l], s->v[l], &s->len[l], s->att};
        /* llama: its key is cached turned to its true position */
        block_branches_forward(m, l, x, 1, 1, NULL, d->arch == ARCH_LLAMA ? &pos : NULL, &kv, a,
                               mo);
        if (routed) gated_add(x, a, mo, mod_gate(d->gate, A->r[0]), C);
        else residual_forward(x, A->res2, mo, (size_t)C);
    }
    if (!model_last_stage(d)) {
        pp_send_next(x, (size_t)C, PP_TAG_DECODE, m->pp_comm);
        return NULL;
    }
    head_forward(m, x, 1);
    return head_logits(m, 0, 1);
}

