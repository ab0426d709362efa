/*
 * gemm_impl: what the product files share and nothing else includes.
 *
 * The products from the top down; a file calls only the files below it:
 *   gemm.c         mm, mm1, mm_colsum: our own packing and split between
 *                  the threads, or bli_sgemm_ex; BLIS's level-2 products;
 *                  the linear layer
 *   tile.c         mm_tile: attention's small products, causal masks
 *   pack.c         operands into the micro-kernel's panels
 *   microkernel.c  BLIS's micro-kernel and our in-place ones
 *   kernels.c      the threads, the kernel timer, the scratch buffers
 */
#ifndef MODTRAIN_GEMM_IMPL_H
#define MODTRAIN_GEMM_IMPL_H

#include <blis.h>
#include <pthread.h>
#include <stddef.h>
#include <time.h>

/* the thread count of kernels_init and kernels_set_threads (kernels.c) */
extern int g_threads;

/* the kernel timer (kernels_gemm_seconds): the time from t0 to t1 */
void count_ns(struct timespec t0, struct timespec t1);

/* BLIS's micro-kernel for the configuration in use, set once by ukr_init
 * (pthread_once on g_ukr_once) */
typedef void (*SgemmUkr)(dim_t m, dim_t n, dim_t k, float *alpha, float *a, float *b, float *beta,
                         float *c, inc_t rs_c, inc_t cs_c, auxinfo_t *data, cntx_t *cntx);
typedef struct {
    SgemmUkr f;
    cntx_t *cntx;
    int mr, nr, row_pref;
    /* where a micro-kernel of our own reads op(A) in place, on whole blocks
     * (KERNELS_INPLACE_*): ukr_32x12_rows and _cols on skx (AVX-512), in
     * mm_tile and own_gemm; ukr_6x16_rows and _cols on haswell (AVX2), in
     * mm_tile only; 0: nowhere */
    int inplace;
} Ukr;
extern Ukr g_ukr;
extern pthread_once_t g_ukr_once;
extern int g_orient; /* the tests' choice of storage for C, -1 the kernel's */
void ukr_init(void);

/* The longest K block read in place: on skx the micro-kernel's packed
 * panel and its 12 rows of op(A) then fit in L1 together (kc 256: 32 + 12
 * KB), so each row's lines are fetched once for all the packed panels. At
 * kc 384 (GPT-2 small's K of 768 or more) the rows came from L2 again for
 * every block, twelve streams at once: gemm_bench's GPT-2 shapes ran 2-4%
 * slower than with them packed. */
enum { INPLACE_KC_MAX = 256 };

int inplace_on(void);
void ukr_inplace(int k, float alpha, const float *v, const float *s, size_t sr, size_t sk,
                 float beta, float *c, size_t ldc, const float *next);

void pack_block_sum(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out,
                    float *sum);
void pack_block(int P, int K, const float *X, size_t rsx, size_t csx, int R, float *out);
int mask_range(int mask, int d, int K, int i0, int i1, int j0, int *klo, int *khi);
void pack_masked(int M, int K, const float *A, size_t rs, size_t cs, int R, float *out, int mask,
                 int d);

#endif
