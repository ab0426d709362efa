/*
 * attention: causal self-attention, forward and backward.
 *
 * The kernels training runs keep O(T) per head and row, never the T x T
 * probabilities (FlashAttention's idea, on CPU): queries go in tiles of
 * br rows, keys in tiles of bc (tile_shape); scores, probabilities and their
 * gradients live only in one tile per thread. The forward keeps an online
 * softmax (a running maximum and sum per row, the output rescaled as they
 * grow) and leaves each row's log-sum-exp; the backward recomputes a tile's
 * probabilities from it. Tiles above the causal diagonal are never formed,
 * and inside a diagonal tile the products skip the micro-tiles and k ranges
 * the causal mask makes zero. Heads run one per OpenMP thread, or where
 * they are too few for the threads, in parts of rows (below); each tile
 * product on BLIS's micro-kernel (mm_tile: heads of 32 make products too
 * small for a whole sgemm call).
 *
 * The earlier kernels, which keep the probabilities, stay as the tests'
 * reference, with a slow, obvious one in double beside them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/base/util.h"
#include "src/kernels/kernels.h"
#include "src/kernels/kernels_impl.h"

/* Row t of a causal softmax: probabilities over columns 0..t, zeros after. */
VEC_IMPL softmax_causal_row_impl(float *row, int t, int T) {
    float mx = row[0];
#pragma omp simd reduction(max : mx)
    for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= t; j++) {
        row[j] = fast_expf(row[j] - mx);
        sum += row[j];
    }
    float inv = 1.f / sum;
    for (int j = 0; j <= t; j++) row[j] *= inv;
    for (int j = t + 1; j < T; j++) row[j] = 0.f;
}
VEC_DISPATCH(softmax_causal_row, (float *row, int t, int T), (row, t, T))

/* dS = P * (dP - sum(P * dP)) * scale over columns 0..t of row t. */
VEC_IMPL softmax_causal_row_backward_impl(float *drow, const float *prow, int t, int T,
                                          float scale) {
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j <= t; j++) dot += prow[j] * drow[j];
    for (int j = 0; j <= t; j++) drow[j] = prow[j] * (drow[j] - dot) * scale;
    for (int j = t + 1; j < T; j++) drow[j] = 0.f;
}
VEC_DISPATCH(softmax_causal_row_backward,
             (float *drow, const float *prow, int t, int T, float scale),
             (drow, prow, t, T, scale))

/* ------------------------------------------------ the kept full kernels */

/* Causal attention skips the products above the diagonal: rows are taken in
 * blocks of ATT_BLOCK queries, and block [r0, r1) only meets keys [0, r1).
 * At T = 256 this does 5/8 of the full T x T work. These kernels keep every
 * probability (B*NH*T*T floats); they are the reference of the O(T) ones. */
#define ATT_BLOCK 64

/* Where the probabilities of sequence b, head h start in att: sequences
 * of different lengths are packed one after the other. */
static size_t att_offset(const int *off, int b, int h, int NH) {
    size_t o = 0;
    for (int i = 0; i < b; i++) o += (size_t)NH * (off[i + 1] - off[i]) * (off[i + 1] - off[i]);
    size_t T = (size_t)(off[b + 1] - off[b]);
    return o + (size_t)h * T * T;
}

void attention_forward_full(float *out, float *att, const float *qkv, int B, const int *off, int NH,
                       int hs) {
    const int C = NH * hs, C3 = 3 * C;
    const float scale = 1.f / sqrtf((float)hs);
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, T = off[b + 1] - off[b];
        const float *q = qkv + (size_t)off[b] * C3 + h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *p = att + att_offset(off, b, h, NH);
        float *y = out + (size_t)off[b] * C + h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_BLOCK) {
            int r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T, rb = r1 - r0;
            float *pr = p + (size_t)r0 * T;
            /* scores = scale * q @ k^T, a causal softmax per row, then p @ v */
            mm1(0, 1, rb, r1, hs, scale, q + (size_t)r0 * C3, C3, k, C3, 0.f, pr, T);
            for (int t = r0; t < r1; t++) softmax_causal_row(p + (size_t)t * T, t, T);
            mm1(0, 0, rb, hs, r1, 1.f, pr, T, v, C3, 0.f, y + (size_t)r0 * C, C);
        }
    }
}

void attention_backward_full(float *dqkv, const float *dout, const float *qkv, const float *att, int B,
                        const int *off, int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C;
    const float scale = 1.f / sqrtf((float)hs);
    int maxT = 0;
    for (int b = 0; b < B; b++) maxT = off[b + 1] - off[b] > maxT ? off[b + 1] - off[b] : maxT;
#pragma omp parallel
    {
        float *dp = kernels_scratch(SCRATCH_TILE, (size_t)maxT * maxT);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH, T = off[b + 1] - off[b];
            const int nblk = (T + ATT_BLOCK - 1) / ATT_BLOCK;
            const float *q = qkv + (size_t)off[b] * C3 + h * hs;
            const float *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + (size_t)off[b] * C3 + h * hs;
            float *dk = dq + C, *dv = dq + 2 * C;
            const float *p = att + att_offset(off, b, h, NH);
            const float *dy = dout + (size_t)off[b] * C + h * hs;
            /* The last block meets every key, so going backwards its products
             * initialise dK and dV (beta 0) and the others add to them. */
            for (int blk = nblk - 1; blk >= 0; blk--) {
                int r0 = blk * ATT_BLOCK, r1 = r0 + ATT_BLOCK < T ? r0 + ATT_BLOCK : T;
                int rb = r1 - r0;
                float beta = blk == nblk - 1 ? 0.f : 1.f;
                const float *pr = p + (size_t)r0 * T;
                float *dpr = dp + (size_t)r0 * T;
                const float *dyr = dy + (size_t)r0 * C;
                mm1(0, 1, rb, r1, hs, 1.f, dyr, C, v, C3, 0.f, dpr, T);   /* dP = dY @ V^T */
                mm1(1, 0, r1, hs, rb, 1.f, pr, T, dyr, C, beta, dv, C3);  /* dV += P^T @ dY */
                for (int t = r0; t < r1; t++)
                    softmax_causal_row_backward(dp + (size_t)t * T, p + (size_t)t * T, t, r1,
                                                scale);
                mm1(0, 0, rb, hs, r1, 1.f, dpr, T, k, C3, 0.f, dq + (size_t)r0 * C3, C3); /* dQ */
                mm1(1, 0, r1, hs, rb, 1.f, dpr, T, q + (size_t)r0 * C3, C3, beta, dk, C3); /* dK */
            }
        }
    }
}

void attention_forward_ref(float *out, float *att, const float *qkv, int B, const int *off,
                           int NH, int hs) {
    const int C = NH * hs, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int T = off[b + 1] - off[b];
            const float *base = qkv + (size_t)off[b] * C3;
            for (int t = 0; t < T; t++) {
                const float *qt = base + (size_t)t * C3 + h * hs;
                float *pt = att + att_offset(off, b, h, NH) + (size_t)t * T;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < T; j++) {
                    const float *kj = base + (size_t)j * C3 + C + h * hs;
                    double s = 0;
                    for (int i = 0; i < hs; i++) s += (double)qt[i] * kj[i];
                    pt[j] = j <= t ? (float)(s * scale) : 0.f;
                    if (j <= t && pt[j] > mx) mx = pt[j];
                }
                for (int j = 0; j <= t; j++) sum += exp(pt[j] - mx);
                for (int j = 0; j <= t; j++) pt[j] = (float)(exp(pt[j] - mx) / sum);
                float *yt = out + ((size_t)off[b] + t) * C + h * hs;
                for (int i = 0; i < hs; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++)
                        a += (double)pt[j] * base[(size_t)j * C3 + 2 * C + h * hs + i];
                    yt[i] = (float)a;
                }
            }
        }
}

void attention_decode(float *out, float *p, const float *q, const float *kc, const float *vc,
                      int len, int NH, int KV, int hs, int ldkv) {
    const float scale = 1.f / sqrtf((float)hs);
    for (int h = 0; h < NH; h++) {
        const int g = h * KV / NH; /* the query head's kv head (repeat_kv) */
        mv(0, len, hs, scale, kc + g * hs, ldkv, q + h * hs, 0.f, p); /* one query: level 2 */
        softmax_causal_row(p, len - 1, len);
        mv(1, len, hs, 1.f, vc + g * hs, ldkv, p, 0.f, out + h * hs);
    }
}

/* ------------------------------------------------------ the O(T) kernels */

/* A query tile of br rows meets key tiles [c0, c0 + bc) up to its last
 * row, so the tile above the diagonal is never formed. bc is a multiple of
 * br: every row of a query tile reaches into every key tile it meets.
 * The shapes were chosen when each tile product was a whole sgemm call
 * (128 x 256 gave 1.02 of the kept kernels' time at T 256, 64 x 256 1.10;
 * 256 x 512 gave 0.94 at T 1024). On the micro-kernel (mm_tile), which
 * skips the diagonal tile's upper triangle, 64 x 256 measured the same as
 * 128 x 256 within this VM's noise (tests/bench/attn_bench). */
#define ATT_BR_MAX 256
#define ATT_BC_MAX 512

static void tile_shape(int T, int *br, int *bc) {
    *br = T <= 256 ? 128 : ATT_BR_MAX;
    *bc = T <= 256 ? 256 : ATT_BC_MAX;
}

/* Where sequence b, head h's row log-sum-exps start: a sequence's NH heads
 * of len rows each, sequences one after the other (N*NH floats in all). */
static size_t lse_offset(const int *off, int b, int h, int NH) {
    return (size_t)off[b] * NH + (size_t)h * (off[b + 1] - off[b]);
}

/* The softmax row kernels below go through a row in chunks of LANES (16)
 * columns, the last chunk cut to the row's n inside the vector (a scalar
 * tail of up to 15 exponentials, and the compiler's serial reduction of
 * the lanes, cost as much as the rest of a 256-column row). A row buffer
 * holds n rounded up to 16 floats (a tile is 256 or 512 wide). */

/* One row of a score tile in the online softmax: the first n of cb columns
 * are causal (the rest are never read: mm_tile's K_UPTO mask counts them
 * zero). Takes the row's running maximum and sum over earlier tiles, leaves
 * exp(s - max) in the row, and returns by how much the row's earlier
 * output must shrink (0 on the first tile). */
VEC_IMPL online_softmax_row_impl(float *row, int n, float *mx, float *sum, float *shrink) {
    float mv[LANES], sv[LANES];
    for (int l = 0; l < LANES; l++) mv[l] = *mx, sv[l] = 0.f;
    for (int j0 = 0; j0 < n; j0 += LANES) {
        const float *r = row + j0;
        const int w = n - j0;
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const float x = l < w ? r[l] : -INFINITY;
            mv[l] = x > mv[l] ? x : mv[l];
        }
    }
    const float m = lanes_max(mv);
    for (int j0 = 0; j0 < n; j0 += LANES) {
        float *r = row + j0;
        const int w = n - j0;
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const float e = l < w ? fast_expf(r[l] - m) : 0.f;
            r[l] = e;
            sv[l] += e;
        }
    }
    *shrink = *mx == -INFINITY ? 0.f : fast_expf(*mx - m);
    *sum = *sum * *shrink + lanes_sum(sv);
    *mx = m;
}
VEC_DISPATCH(online_softmax_row, (float *row, int n, float *mx, float *sum, float *shrink),
             (row, n, mx, sum, shrink))

/* The MASK_ZERO_TAIL entries of a tile's row past its causal limit n
 * (short of the tile's width cb) as zeros: the products that sum over the
 * tile (P V, dS K; P^T dY, dS^T Q) then read it as it lies (MASK_K_UPTO0,
 * MASK_K_FROM0) instead of packing it by the mask. Zeroing the whole tail
 * cost 1.3% of a step in memset. */
static void zero_tail(float *row, int n, int cb) {
    const int e = n + MASK_ZERO_TAIL < cb ? n + MASK_ZERO_TAIL : cb;
    for (int k = n; k < e; k++) row[k] = 0.f;
}

/* ------------------------------------- the work shared between threads
 *
 * A thread takes a whole head where the heads are enough to keep every
 * thread busy (the usual case: B * NH heads against a node's cores). Where
 * they are too few (a pipeline's micro-batch of one sequence, a tensor
 * parallel rank's few heads), a head's rows are cut into parts of
 * mm_tile_granule()'s multiples inside each tile, which sum every element
 * as the whole tile does: the same bits on any number of threads. The
 * forward's parts are query rows. The backward's dQ sums over key tiles
 * and its dK and dV over query tiles, so a part of either kind would add
 * into rows another thread owns; it goes in two passes instead, dQ by
 * query rows, then dK and dV by key rows, each recomputing the tiles'
 * probabilities and dS: seven tile products a tile where one pass over
 * whole heads does five, worth it only where threads would otherwise
 * idle. */

/* Rows [lo, hi) of head h of sequence b: queries (the forward, the
 * backward's dQ) or keys (the backward's dK and dV); cost is its work in
 * causal score entries, as head_cost counts a head's. */
typedef struct {
    int b, h, lo, hi;
    double cost;
} Part;

/* The entries a row computes on the diagonal tile past its causal limit,
 * about (the masks skip the micro-kernel's blocks wholly above it) */
#define DIAGONAL_WASTE 64.0

static int part_longest_first(const void *x, const void *y) {
    const Part *a = x, *b = y;
    if (a->cost != b->cost) return a->cost < b->cost ? 1 : -1;
    if (a->b != b->b) return a->b - b->b;
    return a->h != b->h ? a->h - b->h : a->lo - b->lo;
}

/* The rows of a part: at least 64, at a multiple of the micro-kernel's
 * granule. */
static int part_rows(void) {
    const int g = mm_tile_granule();
    return (64 + g - 1) / g * g;
}

/* Every head's rows in parts of g inside each query tile (keys 0) or key
 * tile (keys 1), longest first; *n of them. Query row r meets r + 1 keys,
 * key row k meets T - k queries, and each row some waste on the diagonal
 * tile. */
static Part *head_parts(int B, const int *off, int NH, int keys, int g, int *n) {
    Part *p = NULL;
    int m = 0;
    for (int pass = 0; pass < 2; pass++) { /* count, then fill */
        if (pass) p = xmalloc((m ? (size_t)m : 1) * sizeof *p);
        m = 0;
        for (int b = 0; b < B; b++) {
            const int T = off[b + 1] - off[b];
            int br, bc;
            tile_shape(T, &br, &bc);
            const int tile = keys ? bc : br;
            for (int h = 0; h < NH; h++)
                for (int t0 = 0; t0 < T; t0 += tile) {
                    const int t1 = t0 + tile < T ? t0 + tile : T;
                    for (int lo = t0; lo < t1; lo += g, m++) {
                        const int hi = lo + g < t1 ? lo + g : t1;
                        const double rows = hi - lo,
                                     met = keys ? 2.0 * T - lo - hi + 1 : lo + hi + 1;
                        if (pass)
                            p[m] = (Part){b, h, lo, hi, rows * met / 2 + DIAGONAL_WASTE * rows};
                    }
                }
        }
    }
    qsort(p, (size_t)m, sizeof *p, part_longest_first);
    *n = m;
    return p;
}

/* Attention's floats in a thread's two slots: the tile slot (the
 * backward's s and dp) and its tile products' packing (S and dP, P V and
 * dS K, P^T dY and dS^T Q at the largest tiles). */
static void attention_slots(int hs, size_t *tile, size_t *pack) {
    const size_t shapes[3] = {mm_tile_pack_floats(ATT_BR_MAX, ATT_BC_MAX, hs),
                              mm_tile_pack_floats(ATT_BR_MAX, hs, ATT_BC_MAX),
                              mm_tile_pack_floats(ATT_BC_MAX, hs, ATT_BR_MAX)};
    *tile = (size_t)2 * ATT_BR_MAX * ATT_BC_MAX;
    *pack = 0;
    for (int i = 0; i < 3; i++) *pack = shapes[i] > *pack ? shapes[i] : *pack;
}

size_t attention_thread_bytes(int hs) {
    size_t tile, pack;
    attention_slots(hs, &tile, &pack);
    return (tile + pack) * sizeof(float);
}

size_t kernels_thread_bytes(int hs) {
    size_t tile, pack; /* the packing slot serves own_gemm too */
    attention_slots(hs, &tile, &pack);
    const size_t gemm = gemm_pack_floats();
    return (tile + (gemm > pack ? gemm : pack)) * sizeof(float);
}

static int g_parts = -1;
void attention_set_parts(int mode) { g_parts = mode; }

/* A head's work in causal score entries, the sum of its parts' */
static double head_cost(int T) { return 0.5 * T * (T + 1.0) + DIAGONAL_WASTE * T; }

/* The longest thread's work where whole heads are dealt as OpenMP's static
 * schedule deals them (the first B*NH % P threads one more), and (*total)
 * all the heads' work. */
static double whole_heads_worst(int B, const int *off, int NH, int P, double *total) {
    const int W = B * NH, q = W / P, rem = W % P;
    double worst = 0, sum = 0;
    for (int t = 0, i = 0; t < P && i < W; t++) {
        double load = 0;
        for (int j = 0; j < q + (t < rem); j++, i++)
            load += head_cost(off[i / NH + 1] - off[i / NH]);
        worst = load > worst ? load : worst;
        sum += load;
    }
    *total = sum;
    return worst;
}

/* Rows [lo, hi) of head h of one sequence of T rows (q, k, v and y at
 * their row strides); s holds a br x bc tile. Each query tile's part meets
 * the key tiles the whole tile meets, with the same widths. */
static void attention_head_forward(float *y, float *lse, const float *q, const float *k,
                                   const float *v, int T, int C3, int C, int hs, float *s, int lo,
                                   int hi) {
    const float scale = 1.f / sqrtf((float)hs);
    float mx[ATT_BR_MAX], sum[ATT_BR_MAX];
    int br, bc;
    tile_shape(T, &br, &bc);
    for (int t0 = lo / br * br; t0 < hi; t0 += br) {
        const int t1 = t0 + br < T ? t0 + br : T;
        const int r0 = lo > t0 ? lo : t0, r1 = hi < t1 ? hi : t1, rb = r1 - r0;
        float *yr = y + (size_t)r0 * C;
        for (int i = 0; i < rb; i++) mx[i] = -INFINITY, sum[i] = 0.f;
        for (int c0 = 0; c0 < t1; c0 += bc) {
            const int cb = (c0 + bc < t1 ? c0 + bc : t1) - c0;
            mm_tile(0, 1, rb, cb, hs, scale, q + (size_t)r0 * C3, C3, k + (size_t)c0 * C3, C3, 0.f,
                    s, bc, MASK_BELOW, r0 - c0);
            for (int i = 0; i < rb; i++) {
                const int n = r0 + i - c0 + 1 < cb ? r0 + i - c0 + 1 : cb;
                float shrink;
                online_softmax_row(s + (size_t)i * bc, n, &mx[i], &sum[i], &shrink);
                zero_tail(s + (size_t)i * bc, n, cb);
                if (c0 > 0)
                    for (int j = 0; j < hs; j++) yr[(size_t)i * C + j] *= shrink;
            }
            mm_tile(0, 0, rb, hs, cb, 1.f, s, bc, v + (size_t)c0 * C3, C3, c0 > 0 ? 1.f : 0.f, yr,
                    C, MASK_K_UPTO0, r0 - c0);
        }
        for (int i = 0; i < rb; i++) {
            const float inv = 1.f / sum[i];
            for (int j = 0; j < hs; j++) yr[(size_t)i * C + j] *= inv;
            lse[r0 + i] = mx[i] + logf(sum[i]);
        }
    }
}

void attention_forward(float *out, float *lse, const float *qkv, int B, const int *off, int NH,
                       int hs) {
    const int C = NH * hs, C3 = 3 * C, P = omp_get_max_threads();
    /* whole heads, unless they leave a thread with a tenth more than its share */
    double total;
    const double worst = whole_heads_worst(B, off, NH, P, &total);
    int np = 0;
    Part *parts = NULL;
    if (g_parts == 1 || (g_parts < 0 && worst > 1.1 * total / P)) {
        parts = head_parts(B, off, NH, 0, part_rows(), &np);
        /* no better where the longest part is as long as the busiest thread's heads */
        if (g_parts < 0 && np > 0 && 1.1 * fmax(total / P, parts[0].cost) >= worst)
            free(parts), parts = NULL;
    }
#pragma omp parallel
    {
        float *s = kernels_scratch(SCRATCH_TILE, (size_t)ATT_BR_MAX * ATT_BC_MAX);
        if (parts) {
#pragma omp for schedule(dynamic, 1)
            for (int i = 0; i < np; i++) {
                const Part *p = &parts[i];
                const int b = p->b, h = p->h;
                const float *q = qkv + (size_t)off[b] * C3 + h * hs;
                attention_head_forward(out + (size_t)off[b] * C + h * hs,
                                       lse + lse_offset(off, b, h, NH), q, q + C, q + 2 * C,
                                       off[b + 1] - off[b], C3, C, hs, s, p->lo, p->hi);
            }
        } else {
#pragma omp for schedule(static)
            for (int bh = 0; bh < B * NH; bh++) {
                const int b = bh / NH, h = bh % NH, T = off[b + 1] - off[b];
                const float *q = qkv + (size_t)off[b] * C3 + h * hs;
                attention_head_forward(out + (size_t)off[b] * C + h * hs,
                                       lse + lse_offset(off, b, h, NH), q, q + C, q + 2 * C, T, C3,
                                       C, hs, s, 0, T);
            }
        }
    }
    free(parts);
}

/* A tile's probabilities from the kept log-sum-exp, then, once dp holds
 * dY @ V^T, the scores' gradient in its place: dS = P * (dP - D) * scale,
 * D = rowsum(dY * Y). Columns past n are never read (mm_tile's masks count
 * them zero). */
VEC_IMPL tile_probs_row_impl(float *row, int n, float lse) {
    for (int j0 = 0; j0 < n; j0 += LANES) {
        float *r = row + j0;
        const int w = n - j0;
#pragma omp simd
        for (int l = 0; l < LANES; l++) r[l] = l < w ? fast_expf(r[l] - lse) : 0.f;
    }
}
VEC_DISPATCH(tile_probs_row, (float *row, int n, float lse), (row, n, lse))
VEC_IMPL tile_dscores_row_impl(float *drow, const float *prow, int n, float D, float scale) {
#pragma omp simd
    for (int j = 0; j < n; j++) drow[j] = prow[j] * (drow[j] - D) * scale;
}
VEC_DISPATCH(tile_dscores_row, (float *drow, const float *prow, int n, float D, float scale),
             (drow, prow, n, D, scale))

/* The operands of one head of one sequence in the backward. */
typedef struct {
    const float *q, *k, *v, *y, *dy, *lse;
    float *dq, *dk, *dv;
    int T, C3, C, hs;
} HeadGrad;

/* D = rowsum(dY * Y) of rows [r0, r0 + rb). */
static void rows_D(float *D, const HeadGrad *a, int r0, int rb) {
    for (int i = 0; i < rb; i++) {
        float dot = 0.f;
        const float *yi = a->y + (size_t)(r0 + i) * a->C, *dyi = a->dy + (size_t)(r0 + i) * a->C;
        for (int j = 0; j < a->hs; j++) dot += yi[j] * dyi[j];
        D[i] = dot;
    }
}

/* One tile's scores' gradient, into dp: query rows [r0, r0 + rb) against
 * key columns [k0, k0 + w), at leading dimension ld. S, then P from the
 * kept log-sum-exp, then dV += P^T dY when dv (the key columns' rows of
 * dV), dP = dY V^T and dS; row i's limit is key r0 + i, and P and dS hold
 * zeros past it for the masked products that read them as they lie. */
static void tile_dscores(const HeadGrad *a, int r0, int rb, int k0, int w, int ld, const float *D,
                         float *s, float *dp, float *dv) {
    const int C3 = a->C3, C = a->C, hs = a->hs, d = r0 - k0;
    const float scale = 1.f / sqrtf((float)hs);
    const float *qr = a->q + (size_t)r0 * C3, *dyr = a->dy + (size_t)r0 * C;
    const float *kk = a->k + (size_t)k0 * C3, *vk = a->v + (size_t)k0 * C3;
    mm_tile(0, 1, rb, w, hs, scale, qr, C3, kk, C3, 0.f, s, ld, MASK_BELOW, d); /* S */
    for (int i = 0; i < rb; i++) {
        const int n = d + i + 1 < 0 ? 0 : d + i + 1 < w ? d + i + 1 : w;
        tile_probs_row(s + (size_t)i * ld, n, a->lse[r0 + i]);
        zero_tail(s + (size_t)i * ld, n, w);
    }
    if (dv) /* dV += P^T @ dY */
        mm_tile(1, 0, w, hs, rb, 1.f, s, ld, dyr, C, 1.f, dv, C3, MASK_K_FROM0, d);
    mm_tile(0, 1, rb, w, hs, 1.f, dyr, C, vk, C3, 0.f, dp, ld, MASK_BELOW, d); /* dP */
    for (int i = 0; i < rb; i++) {
        const int n = d + i + 1 < 0 ? 0 : d + i + 1 < w ? d + i + 1 : w;
        tile_dscores_row(dp + (size_t)i * ld, s + (size_t)i * ld, n, D[i], scale);
        zero_tail(dp + (size_t)i * ld, n, w);
    }
}

/* dQ of rows [r0, r0 + rb) += dS @ K of the key columns [c0, c0 + cb) */
static void tile_dq(const HeadGrad *a, int r0, int rb, int c0, int cb, int ld, const float *dp) {
    mm_tile(0, 0, rb, a->hs, cb, 1.f, dp, ld, a->k + (size_t)c0 * a->C3, a->C3, c0 > 0 ? 1.f : 0.f,
            a->dq + (size_t)r0 * a->C3, a->C3, MASK_K_UPTO0, r0 - c0);
}

/* dK of the key rows [k0, k0 + w) += dS^T @ Q of the rows [r0, r0 + rb) */
static void tile_dk(const HeadGrad *a, int r0, int rb, int k0, int w, int ld, const float *dp) {
    mm_tile(1, 0, w, a->hs, rb, 1.f, dp, ld, a->q + (size_t)r0 * a->C3, a->C3, 1.f,
            a->dk + (size_t)k0 * a->C3, a->C3, MASK_K_FROM0, r0 - k0);
}

/* Zeroes dK and dV of rows [k0, k1), before the query tiles add into them. */
static void zero_dkv(const HeadGrad *a, int k0, int k1) {
    for (int t = k0; t < k1; t++) {
        memset(a->dk + (size_t)t * a->C3, 0, (size_t)a->hs * sizeof(float));
        memset(a->dv + (size_t)t * a->C3, 0, (size_t)a->hs * sizeof(float));
    }
}

/* Query rows [lo, hi) of a head: their dQ (three tile products a tile:
 * S, dP, dQ), and with dkv, for a whole head (lo 0, hi T), dK and dV too
 * in the same pass, each tile's dS used for dQ and dK alike (five). Where
 * heads are too few for the threads, the backward runs this without dkv
 * over parts of query rows, then attention_head_dkv over parts of keys. */
static void attention_head_backward(const HeadGrad *a, float *s, float *dp, int lo, int hi,
                                    int dkv) {
    float D[ATT_BR_MAX];
    int br, bc;
    tile_shape(a->T, &br, &bc);
    if (dkv) zero_dkv(a, 0, a->T);
    for (int t0 = lo / br * br; t0 < hi; t0 += br) {
        const int t1 = t0 + br < a->T ? t0 + br : a->T;
        const int r0 = lo > t0 ? lo : t0, r1 = hi < t1 ? hi : t1, rb = r1 - r0;
        rows_D(D, a, r0, rb);
        for (int c0 = 0; c0 < t1; c0 += bc) {
            const int cb = (c0 + bc < t1 ? c0 + bc : t1) - c0;
            tile_dscores(a, r0, rb, c0, cb, bc, D, s, dp, dkv ? a->dv + (size_t)c0 * a->C3 : NULL);
            tile_dq(a, r0, rb, c0, cb, bc, dp);
            if (dkv) tile_dk(a, r0, rb, c0, cb, bc, dp);
        }
    }
}

/* dK and dV of key rows [lo, hi) (four tile products a tile: S, dV, dP,
 * dK), over the query tiles from their key tile on, in the one-pass order. The part's
 * columns of each tile are the whole tile's columns [k0 - c0, k0 - c0 + w). */
static void attention_head_dkv(const HeadGrad *a, float *s, float *dp, int lo, int hi) {
    float D[ATT_BR_MAX];
    int br, bc;
    tile_shape(a->T, &br, &bc);
    for (int c0 = lo / bc * bc; c0 < hi; c0 += bc) {
        const int c1 = c0 + bc < a->T ? c0 + bc : a->T;
        const int k0 = lo > c0 ? lo : c0, k1 = hi < c1 ? hi : c1;
        zero_dkv(a, k0, k1);
        for (int r0 = c0; r0 < a->T; r0 += br) {
            const int r1 = r0 + br < a->T ? r0 + br : a->T, rb = r1 - r0;
            const int cb = (c0 + bc < r1 ? c0 + bc : r1) - c0; /* the whole tile's width */
            if (k0 - c0 >= cb) continue; /* this query tile ends before the part */
            const int w = (k1 < c0 + cb ? k1 : c0 + cb) - k0;
            rows_D(D, a, r0, rb);
            tile_dscores(a, r0, rb, k0, w, bc, D, s, dp, a->dv + (size_t)k0 * a->C3);
            tile_dk(a, r0, rb, k0, w, bc, dp);
        }
    }
}

static HeadGrad head_grad(float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, const int *off, int NH, int hs, int b, int h) {
    const int C = NH * hs, C3 = 3 * C;
    const size_t r = (size_t)off[b], o = r * C + (size_t)h * hs;
    const float *q = qkv + r * C3 + (size_t)h * hs;
    float *dq = dqkv + r * C3 + (size_t)h * hs;
    HeadGrad a;
    a.q = q, a.k = q + C, a.v = q + 2 * C;
    a.y = out + o, a.dy = dout + o, a.lse = lse + lse_offset(off, b, h, NH);
    a.dq = dq, a.dk = dq + C, a.dv = dq + 2 * C;
    a.T = off[b + 1] - off[b], a.C3 = C3, a.C = C, a.hs = hs;
    return a;
}

void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                        const float *lse, int B, const int *off, int NH, int hs) {
    const int P = omp_get_max_threads();
    /* two passes over parts (3 tile products a tile, then 4, where one pass
     * does 5) where they beat the busiest thread's whole heads by a margin
     * for their balance: each pass takes its share of the work, or its
     * longest part if that is longer */
    double total;
    const double worst = whole_heads_worst(B, off, NH, P, &total);
    int split = g_parts == 1, nq = 0, nk = 0;
    Part *qp = NULL, *kp = NULL;
    if (split || (g_parts < 0 && 1.15 * 7.0 * total / P < 5.0 * worst)) {
        qp = head_parts(B, off, NH, 0, part_rows(), &nq);
        kp = head_parts(B, off, NH, 1, part_rows(), &nk);
        const double tq = fmax(total / P, nq ? qp[0].cost : 0),
                     tk = fmax(total / P, nk ? kp[0].cost : 0);
        split = split || 1.15 * (3.0 * tq + 4.0 * tk) < 5.0 * worst;
        if (!split) free(qp), free(kp), qp = kp = NULL;
    }
#pragma omp parallel
    {
        float *s = kernels_scratch(SCRATCH_TILE, (size_t)2 * ATT_BR_MAX * ATT_BC_MAX),
              *dp = s + ATT_BR_MAX * ATT_BC_MAX;
        if (split) {
#pragma omp for schedule(dynamic, 1)
            for (int i = 0; i < nq; i++) {
                const HeadGrad a =
                    head_grad(dqkv, dout, qkv, out, lse, off, NH, hs, qp[i].b, qp[i].h);
                attention_head_backward(&a, s, dp, qp[i].lo, qp[i].hi, 0);
            }
#pragma omp for schedule(dynamic, 1)
            for (int i = 0; i < nk; i++) {
                const HeadGrad a =
                    head_grad(dqkv, dout, qkv, out, lse, off, NH, hs, kp[i].b, kp[i].h);
                attention_head_dkv(&a, s, dp, kp[i].lo, kp[i].hi);
            }
        } else {
#pragma omp for schedule(static)
            for (int bh = 0; bh < B * NH; bh++) {
                const HeadGrad a =
                    head_grad(dqkv, dout, qkv, out, lse, off, NH, hs, bh / NH, bh % NH);
                attention_head_backward(&a, s, dp, 0, a.T, 1);
            }
        }
    }
    free(qp), free(kp);
}
