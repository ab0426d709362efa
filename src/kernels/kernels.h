/*
 * kernels: the numerical building blocks of the model, each a forward and a
 * backward in a pair (llm.c style: outputs first, then inputs, then sizes;
 * backward adds into its gradients, so zeroing is one explicit step).
 *
 *   N  rows (B*T tokens)   C  channels   OC output channels
 *   B  sequences           T  positions  NH heads (local)   hs head size
 *
 * Every matrix product goes through BLIS via mm(); mm_ref() is the slow,
 * obvious reference the tests compare it against.
 */
#ifndef MODTRAIN_KERNELS_H
#define MODTRAIN_KERNELS_H

#include <stddef.h>

#include "src/base/util.h"

/* Sets BLIS and OpenMP threads once; picks BLIS kernels (blis_arch: "auto"
 * chooses skx on AVX-512 CPUs). Call before any other kernel. */
void kernels_init(int threads, const char *blis_arch);
int kernels_threads(void);
/* Changes the thread count kernels_init set (BLIS's and OpenMP's). */
void kernels_set_threads(int threads);
/* Whether blis_arch is "auto" or a configuration BLIS knows. Returns 0, or
 * -1 with err listing the names that would be right. */
int kernels_check_arch(const char *blis_arch, Err *err);
/* Which build of the elementwise loops runs: 0 the baseline, 1 AVX2+FMA,
 * 2 AVX-512 (the widest the CPU has, from kernels_init). The tests set each
 * level the CPU supports in turn; set returns the level taken. */
int kernels_vec_level(void);
int kernels_set_vec_level(int level);
/* The BLIS configuration in use, for the run's log ("skx", "haswell", ...). */
const char *kernels_blis_arch(void);
/* Its id: what BLIS_ARCH_TYPE gives another program on the same BLIS
 * (PyTorch, in the benchmarks) for the same kernels. */
int kernels_blis_arch_id(void);
/* Best-of-many sgemm rate in GFLOP/s at the current thread count: short
 * products over at least 0.2 s, with naps between rounds. */
double kernels_measure_peak_gflops(void);

/* The kernel timer: seconds spent in mm, mm1, mv and rank1 since the start, as wall
 * time (a product made inside a parallel region of n threads counts a nth
 * of its time), for the step's split into sgemm and everything else. */
double kernels_gemm_seconds(void);

/* Row-major C(M,N) = alpha * op(A)(M,K) @ op(B)(K,N) + beta * C.
 * ta/tb: 1 = the stored matrix is transposed (A stored (K,M) with lda).
 * By default on BLIS's micro-kernel with modtrain's own packing and split
 * between the threads (each C element sums the same products in the same
 * order on any thread count); kernels_set_gemm(0) (config gemm = blis)
 * sends it to bli_sgemm_ex instead. mm1 is always bli_sgemm_ex. */
void kernels_set_gemm(int own);
void mm(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
        int ldb, float beta, float *C, int ldc);
/* mm with op(B) = B (K,N) as stored, adding B's column sums into sum_b
 * (sum_b[j] += sum over k of B[k][j]) as B is packed for the product, not
 * in a pass of its own: the same bits as bias_backward(sum_b, B, K, N)
 * (each column summed over the rows in order, from zero, then added). */
void mm_colsum(int ta, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
               int ldb, float beta, float *C, int ldc, float *sum_b);
/* The same on one thread, for calls made inside a parallel region. */
void mm1(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
         int ldb, float beta, float *C, int ldc);
/* y = alpha * op(A) x + beta * y for A (M,N) row-major: y has N entries
 * when ta, else M. On one thread, as BLIS's level-2 operations are. */
void mv(int ta, int M, int N, float alpha, const float *A, int lda, const float *x, float beta,
        float *y);
/* A(M,N) += alpha * x y^T (x M entries, y N). */
void rank1(int M, int N, float alpha, const float *x, const float *y, float *A, int lda);
/* A small product on one thread through BLIS's micro-kernel (packing its
 * operands here, none of sgemm's per-call set-up), for attention's tiles.
 * The mask leaves out what a causal tile makes zero, with d the tile's
 * query offset less its key offset (row i of a scores tile sees columns
 * j <= i + d):
 *   MASK_NONE    the whole product;
 *   MASK_BELOW   C = scores: blocks wholly above the diagonal are left
 *                unwritten (only j <= i + d is ever read);
 *   MASK_K_UPTO  K runs over keys: row i sums k <= i + d only (P V, dS K);
 *   MASK_K_FROM  C's rows are keys, K runs over queries: row j sums
 *                k >= j - d only (P^T dY, dS^T Q);
 *   MASK_K_UPTO0, MASK_K_FROM0  the same where op(A) holds zeros in
 *                the MASK_ZERO_TAIL entries of each row next to the mask's
 *                edge (k from i + d + 1, or up to i - d - 1), as a causal
 *                tile's rows zeroed past their limit: then A may be read as
 *                it lies (skx). */
enum { MASK_NONE, MASK_BELOW, MASK_K_UPTO, MASK_K_FROM, MASK_K_UPTO0, MASK_K_FROM0 };
enum { MASK_ZERO_TAIL = 16 }; /* at least a micro-kernel's NR */
void mm_tile(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
             const float *B, int ldb, float beta, float *C, int ldc, int mask, int d);
/* Where an mm_tile product may be cut into parts without changing a bit:
 * a part of C's rows (or columns) that starts a multiple of this from the
 * whole's start, and ends where the whole ends or at such a multiple, sums
 * every element as the whole does (the micro-kernel's blocks fall the same
 * way, and the mask gives them the same k). The least common multiple of
 * the micro-kernel's MR and NR, so either storage of C holds. */
int mm_tile_granule(void);
/* For the tests: 1 or 0 has mm_tile and mm (gemm = own) store C by rows or
 * by columns in the micro-kernel's view whatever the kernel prefers (both
 * are correct, one is slower); -1 goes back to the kernel's preference. */
void mm_tile_orientation(int row_pref);
/* On skx's kernels (32 x 12, C by columns), mm and mm_tile read the side
 * of a product that the micro-kernel broadcasts (its 12, op(A)) in place,
 * through a micro-kernel of modtrain's own with skx's arithmetic, instead
 * of transposing it into panels: the same bits. On haswell's (6 x 16, C
 * by rows, broadcasting op(A)'s 6) mm_tile does the same. kernels_inplace()
 * says where this machine takes that path (0: nowhere); for the tests and
 * benchmarks, kernels_set_inplace(0) packs as elsewhere. */
enum { KERNELS_INPLACE_TILE = 1, KERNELS_INPLACE_GEMM = 2 }; /* mm_tile, mm */
int kernels_inplace(void);
void kernels_set_inplace(int on);
/* Naive triple loop in double; the tests' reference. */
void mm_ref(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
            const float *B, int ldb, float beta, float *C, int ldc);

/* out(N,OC) = inp(N,C) @ w(C,OC) [+ bias(OC)]. */
void linear_forward(float *out, const float *inp, const float *w, const float *bias, int N, int C,
                    int OC);
/* dinp(N,C) += dout @ w^T (when dinp), dw(C,OC) += inp^T @ dout (when
 * dw), dbias(OC) += column sums of dout (when dw and dbias). */
void linear_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                     const float *w, int N, int C, int OC);
/* The same with dinp overwritten (=) rather than added to: no zeroing
 * pass before it. */
void linear_backward_set(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                         const float *w, int N, int C, int OC);

/* Layer norm over rows; the backward adds into dinp (the _set one
 * overwrites it), reading x and dout once (dw and db from blocks of 64
 * rows, added in block order: the same bits on any thread count). The
 * _ref ones are the plain loops in double the tests compare against. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                       const float *b, int N, int C);
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                        const float *w, const float *mean, const float *rstd, int N, int C);
void layernorm_backward_set(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C);
void layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *w,
                           const float *b, int N, int C);
void layernorm_backward_ref(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, const float *mean, const float *rstd, int N, int C);
/* A block's residual in one pass: a(N,C) += bias, res = x + a, ln =
 * layer norm of res (the same floats as bias_add, residual_forward and
 * layernorm_forward one after another). */
void bias_residual_layernorm_forward(float *a, float *res, float *ln, float *mean, float *rstd,
                                     const float *x, const float *bias, const float *w,
                                     const float *b, int N, int C);

void gelu_forward(float *out, const float *inp, size_t n);
void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* gelu_backward overwriting dinp. */
void gelu_backward_set(float *dinp, const float *inp, const float *dout, size_t n);
/* out = gelu(inp), grad = gelu'(inp) in one pass (one tanh an element; the
 * same floats as gelu_forward, and as gelu_backward_set's factor). */
void gelu_with_grad(float *out, float *grad, const float *inp, size_t n);
/* out = gelu(inp), dinp = gelu'(inp) * dout in one pass: the GELU's output
 * again and its backward (the same floats as gelu_forward and
 * gelu_backward_set). */
void gelu_with_backward(float *out, float *dinp, const float *inp, const float *dout, size_t n);
/* a *= b, elementwise. */
void mul_inplace(float *a, const float *b, size_t n);
/* pre(N,F) += bias, out = gelu(pre), in one pass (the same floats as
 * bias_add then gelu_forward). */
void bias_gelu_forward(float *pre, float *out, const float *bias, int N, int F);

/* The Llama-style block's kernels (llama.c), each with its plain
 * reference (_ref, in double).
 * RMSNorm over rows: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps)
 * kept a row. The backward adds into dinp and dw (dw from blocks of
 * NORM_ROWS rows, added in block order: the same bits on any thread
 * count). */
void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps);
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C);
void rmsnorm_forward_ref(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                         float eps);
void rmsnorm_backward_ref(float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C);
/* Rotary position embeddings, Hugging Face's rotate_half convention: in a
 * head of hs (even) floats, (x[i], x[i + hs/2]) turns by the angle
 * pos * theta^(-2i/hs). rope_tables fills cos and sin (T * hs/2 each) for
 * positions 0 .. T-1; rope_apply turns in place the H heads (hs floats
 * apart, from x + n * stride) of each row n < N by the angle of its own
 * position pos[n] (< T), or back with dir -1: the backward, applied to
 * their gradients, since a turn's transpose is its inverse. */
void rope_tables(float *cos_t, float *sin_t, int T, int hs, double theta);
void rope_apply(float *x, const int *pos, int N, int H, int hs, int stride, const float *cos_t,
                const float *sin_t, int dir);
void rope_apply_ref(float *x, const int *pos, int N, int H, int hs, int stride, double theta,
                    int dir);
/* SwiGLU on the fused gate|up projection gu(N, 2F), a row's gate in its
 * first F floats: out(N,F) = silu(gate) * up. The backward writes (does
 * not add) dgu(N, 2F). */
void swiglu_forward(float *out, const float *gu, int N, int F);
void swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F);
void swiglu_forward_ref(float *out, const float *gu, int N, int F);
void swiglu_backward_ref(float *dgu, const float *dout, const float *gu, int N, int F);

/* Llama's MLP (the dense one or an expert) on n rows x(n, C): h = x w1
 * (n, 2F: gate|up), hg = silu(gate) * up (n, F), y = hg w2 (n, C). The
 * backward from dy adds the weights' gradients into gw1 and gw2 and sets
 * dx; it makes hg again first when `again` (no one keeps it), and dhg
 * (n, F) and dh (n, 2F) are scratch. */
void swiglu_mlp_forward(const float *x, int n, int C, int F, const float *w1, const float *w2,
                        float *h, float *hg, float *y);
void swiglu_mlp_backward(const float *x, int n, int C, int F, const float *w1, const float *w2,
                         float *gw1, float *gw2, const float *h, float *hg, int again,
                         const float *dy, float *dhg, float *dh, float *dx);

/* Grouped-query attention (KV key and value heads, KV dividing NH; 1:
 * multi-query) on the kernels of NH heads: gqa_expand writes qkv(N,
 * 3*NH*hs) from qkv_g(N, (NH + 2*KV)*hs), laid [q | k | v] a row, giving
 * query head h the key and value of kv head h*KV/NH (Hugging Face's
 * repeat_kv); gqa_reduce, its adjoint, writes dqkv_g from dqkv, each kv
 * head's gradient summed over its query heads in head order. */
void gqa_expand(float *qkv, const float *qkv_g, int N, int NH, int KV, int hs);
void gqa_reduce(float *dqkv_g, const float *dqkv, int N, int NH, int KV, int hs);

/* Causal self-attention of NH heads on qkv(N,3*NH*hs) laid out [q|k|v] per
 * row; sequence b is rows off[b] .. off[b+1] (B+1 offsets, lengths may
 * differ). out(N,NH*hs); lse keeps each row's log-sum-exp for backward:
 * per sequence its NH heads of len rows, packed (N*NH floats). O(T) memory:
 * the T x T probabilities exist one tile at a time (src/kernels/attention.c). The
 * same bits on any number of threads, whole heads or parts of them. */
void attention_forward(float *out, float *lse, const float *qkv, int B, const int *off, int NH,
                       int hs);
/* dqkv(N,3*NH*hs) is overwritten (not accumulated); out and lse are the
 * forward's. */
void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *out,
                        const float *lse, int B, const int *off, int NH, int hs);
/* The bytes each thread's own buffers reach in training at head size hs:
 * attention's tiles and the packed operands of own_gemm and mm_tile, on
 * this machine's BLIS configuration (BLIS's own pools, under gemm = blis,
 * are not counted). */
size_t kernels_thread_bytes(int hs);
/* What attention's kernels alone ask of a thread's buffers at head size hs. */
size_t attention_thread_bytes(int hs);
/* What the calling thread's buffers hold now, for the tests. */
size_t kernels_scratch_bytes(void);
/* For the tests and attn_bench: 1 has attention_forward and _backward cut
 * every head into parts of rows (the backward in two passes), 0 never, -1
 * (the default) where whole heads would leave threads idle. Every choice
 * gives the same bits. */
void attention_set_parts(int mode);
/* The kernels before them, the tests' reference: att keeps the
 * probabilities, per sequence and head a len x len block, packed (sum of
 * NH*len^2 floats). */
void attention_forward_full(float *out, float *att, const float *qkv, int B, const int *off, int NH,
                            int hs);
void attention_backward_full(float *dqkv, const float *dout, const float *qkv, const float *att,
                             int B, const int *off, int NH, int hs);
/* The slow, obvious version (double sums, no blocking) of the full forward. */
void attention_forward_ref(float *out, float *att, const float *qkv, int B, const int *off, int NH,
                           int hs);
/* One new query q(NH*hs) against len cached keys and values of KV heads
 * (rows ldkv apart, the new token's last; query head h reads kv head
 * h*KV/NH): out(NH*hs); p(len) is scratch. */
void attention_decode(float *out, float *p, const float *q, const float *kc, const float *vc,
                      int len, int NH, int KV, int hs, int ldkv);

/* out(N,C) = wte[tok - v0] for tokens in [v0, v0+Vl), else 0 (vocab-parallel
 * lookup; the caller sums over tensor-parallel ranks). */
void embed_forward(float *out, const int *tokens, const float *wte, int v0, int Vl, int N, int C);
void embed_backward(float *dwte, const float *dout, const int *tokens, int v0, int Vl, int N,
                    int C);
/* out(B,T,C) += wpe(T,C) per sequence; backward sums over B. */
void pos_forward(float *out, const float *wpe, int B, int T, int C);
void pos_backward(float *dwpe, const float *dout, int B, int T, int C);

/* y = a + b elementwise. */
void residual_forward(float *out, const float *a, const float *b, size_t n);
/* out(N,C) += bias(C). */
void bias_add(float *out, const float *bias, int N, int C);
/* dbias(OC) += the column sums of dout(N,OC): each column summed over the
 * rows in order, so the bits are the same on any thread count and vector
 * width; _ref sums in double, for the tests. */
void bias_backward(float *dbias, const float *dout, int N, int OC);
void bias_backward_ref(float *dbias, const float *dout, int N, int OC);

#endif
