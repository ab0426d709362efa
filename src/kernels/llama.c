/*
 * llama: the Llama-style block's own kernels: RMSNorm, rotary position
 * embeddings (Hugging Face's rotate_half convention: dimension i pairs
 * with i + hs/2) and SwiGLU on a fused gate|up row, each vectorised beside
 * its plain reference; and grouped-query attention's key and value heads
 * spread to the query heads, their gradients gathered back.
 */
#include "src/kernels/kernels.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "src/kernels/kernels_impl.h"

/* ---------------------------------------------------------------- RMSNorm */

/* One row: o = x * s * w, s = 1 / sqrt(mean(x^2) + eps). */
VEC_IMPL rms_row_impl(float *o, float *rstd, const float *x, const float *w, int C, float eps) {
    const int C16 = C / LANES * LANES;
    float acc[LANES] = {0};
    for (int c0 = 0; c0 < C16; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) acc[l] += x[c0 + l] * x[c0 + l];
    for (int c = C16; c < C; c++) acc[c - C16] += x[c] * x[c];
    const float s = 1.f / sqrtf(lanes_sum(acc) / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
    *rstd = s;
}
VEC_DISPATCH(rms_row, (float *o, float *rstd, const float *x, const float *w, int C, float eps),
             (o, rstd, x, w, C, eps))

void rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                     float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        rms_row(out + (size_t)i * C, &rstd[i], inp + (size_t)i * C, w, C, eps);
}

void rmsnorm_forward_ref(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                         float eps) {
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const double s = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (float)(x[c] * s * w[c]);
        rstd[i] = (float)s;
    }
}

/* One row of the backward: with g = w * dy and xh = x * s,
 * dx += s * (g - xh * mean(g * xh)), and the block's dw partial += dy * xh. */
VEC_IMPL rms_back_row_impl(float *dx, float *pw, const float *x, const float *dy, const float *w,
                           float s, int C) {
    const int C16 = C / LANES * LANES;
    float acc[LANES] = {0};
    for (int c0 = 0; c0 < C16; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int c = c0 + l;
            acc[l] += w[c] * dy[c] * x[c];
        }
    for (int c = C16; c < C; c++) acc[c - C16] += w[c] * dy[c] * x[c];
    const float m = lanes_sum(acc) * s / C; /* mean(g * xh) */
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float xh = x[c] * s;
        dx[c] += s * (w[c] * dy[c] - xh * m);
        pw[c] += dy[c] * xh;
    }
}
VEC_DISPATCH(rms_back_row,
             (float *dx, float *pw, const float *x, const float *dy, const float *w, float s,
              int C),
             (dx, pw, x, dy, w, s, C))

/* Rows in blocks of NORM_ROWS, each block's dw partial added in block order
 * afterwards: the same bits on any thread count, as layer norm's. */
void rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C) {
    const int nb = (N + NORM_ROWS - 1) / NORM_ROWS;
    float *part = norm_partials((size_t)nb * C);
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int k = 0; k < nb; k++) {
            float *pw = part + (size_t)k * C;
            memset(pw, 0, (size_t)C * sizeof(float));
            const int i1 = (k + 1) * NORM_ROWS < N ? (k + 1) * NORM_ROWS : N;
            for (int i = k * NORM_ROWS; i < i1; i++) {
                const size_t o = (size_t)i * C;
                rms_back_row(dinp + o, pw, inp + o, dout + o, w, rstd[i], C);
            }
        }
        norm_partials_add(&dw, 1, part, nb, C);
    }
}

void rmsnorm_backward_ref(float *dinp, float *dw, const float *dout, const float *inp,
                          const float *w, const float *rstd, int N, int C) {
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        const double s = rstd[i];
        double m = 0;
        for (int c = 0; c < C; c++) m += (double)w[c] * dy[c] * x[c] * s;
        m /= C;
        for (int c = 0; c < C; c++) {
            const double xh = x[c] * s;
            dinp[(size_t)i * C + c] += (float)(s * (w[c] * dy[c] - xh * m));
            dw[c] += (float)(dy[c] * xh);
        }
    }
}

/* ------------------------------------------------------------------ RoPE */

void rope_tables(float *cos_t, float *sin_t, int T, int hs, double theta) {
    const int h = hs / 2;
    for (int p = 0; p < T; p++)
        for (int i = 0; i < h; i++) {
            const double a = p * pow(theta, -2.0 * i / hs);
            cos_t[(size_t)p * h + i] = (float)cos(a);
            sin_t[(size_t)p * h + i] = (float)sin(a);
        }
}

/* One head: (x1, x2) = (x[i], x[i + h]) turned by the angle's cos c and
 * sin s (s negated to turn back). */
VEC_IMPL rope_head_impl(float *x, const float *c, const float *s, int h, float dir) {
#pragma omp simd
    for (int i = 0; i < h; i++) {
        const float x1 = x[i], x2 = x[i + h], sn = dir * s[i];
        x[i] = x1 * c[i] - x2 * sn;
        x[i + h] = x2 * c[i] + x1 * sn;
    }
}
VEC_DISPATCH(rope_head, (float *x, const float *c, const float *s, int h, float dir),
             (x, c, s, h, dir))

void rope_apply(float *x, const int *pos, int N, int H, int hs, int stride, const float *cos_t,
                const float *sin_t, int dir) {
    const int h = hs / 2;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *c = cos_t + (size_t)pos[n] * h, *s = sin_t + (size_t)pos[n] * h;
        for (int k = 0; k < H; k++)
            rope_head(x + (size_t)n * stride + (size_t)k * hs, c, s, h, dir < 0 ? -1.f : 1.f);
    }
}

void rope_apply_ref(float *x, const int *pos, int N, int H, int hs, int stride, double theta,
                    int dir) {
    const int h = hs / 2;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < H; k++) {
            float *v = x + (size_t)n * stride + (size_t)k * hs;
            for (int i = 0; i < h; i++) {
                const double a = (dir < 0 ? -1.0 : 1.0) * pos[n] * pow(theta, -2.0 * i / hs);
                const double x1 = v[i], x2 = v[i + h];
                v[i] = (float)(x1 * cos(a) - x2 * sin(a));
                v[i + h] = (float)(x2 * cos(a) + x1 * sin(a));
            }
        }
}

/* ---------------------------------------------------------------- SwiGLU */

static inline float sigmoidf_fast(float g) { return 1.f / (1.f + fast_expf(-g)); }

VEC_IMPL swiglu_row_impl(float *o, const float *gu, int F) {
#pragma omp simd
    for (int j = 0; j < F; j++) {
        const float g = gu[j];
        o[j] = g * sigmoidf_fast(g) * gu[F + j];
    }
}
VEC_DISPATCH(swiglu_row, (float *o, const float *gu, int F), (o, gu, F))

void swiglu_forward(float *out, const float *gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) swiglu_row(out + (size_t)i * F, gu + (size_t)i * 2 * F, F);
}

/* d gate = dy * u * s * (1 + g * (1 - s)), d up = dy * g * s (s: the
 * gate's sigmoid). */
VEC_IMPL swiglu_back_row_impl(float *dgu, const float *dy, const float *gu, int F) {
#pragma omp simd
    for (int j = 0; j < F; j++) {
        const float g = gu[j], u = gu[F + j], s = sigmoidf_fast(g);
        dgu[j] = dy[j] * u * s * (1.f + g * (1.f - s));
        dgu[F + j] = dy[j] * g * s;
    }
}
VEC_DISPATCH(swiglu_back_row, (float *dgu, const float *dy, const float *gu, int F),
             (dgu, dy, gu, F))

void swiglu_backward(float *dgu, const float *dout, const float *gu, int N, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        swiglu_back_row(dgu + (size_t)i * 2 * F, dout + (size_t)i * F, gu + (size_t)i * 2 * F, F);
}

void swiglu_forward_ref(float *out, const float *gu, int N, int F) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            const double g = gu[(size_t)i * 2 * F + j], u = gu[(size_t)i * 2 * F + F + j];
            out[(size_t)i * F + j] = (float)(g / (1.0 + exp(-g)) * u);
        }
}

void swiglu_backward_ref(float *dgu, const float *dout, const float *gu, int N, int F) {
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            const size_t a = (size_t)i * 2 * F + j, b = a + F;
            const double g = gu[a], u = gu[b], s = 1.0 / (1.0 + exp(-g)),
                         dy = dout[(size_t)i * F + j];
            dgu[a] = (float)(dy * u * s * (1 + g * (1 - s)));
            dgu[b] = (float)(dy * g * s);
        }
}

/* ------------------------------------------------- grouped-query attention */

void gqa_expand(float *qkv, const float *qkv_g, int N, int NH, int KV, int hs) {
    const size_t in = (size_t)(NH + 2 * KV) * hs, out = (size_t)3 * NH * hs, q = (size_t)NH * hs;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *src = qkv_g + n * in;
        float *dst = qkv + n * out;
        memcpy(dst, src, q * sizeof(float));
        for (int h = 0; h < NH; h++) {
            const int g = (int)((long)h * KV / NH);
            memcpy(dst + q + (size_t)h * hs, src + q + (size_t)g * hs, (size_t)hs * sizeof(float));
            memcpy(dst + 2 * q + (size_t)h * hs, src + q + (size_t)(KV + g) * hs,
                   (size_t)hs * sizeof(float));
        }
    }
}

/* Each kv head's gradient: its query heads' in head order, so the sum's
 * order is fixed. */
VEC_IMPL add_row_impl(float *a, const float *b, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) a[i] += b[i];
}
VEC_DISPATCH(add_row, (float *a, const float *b, int n), (a, b, n))

void gqa_reduce(float *dqkv_g, const float *dqkv, int N, int NH, int KV, int hs) {
    const size_t in = (size_t)3 * NH * hs, out = (size_t)(NH + 2 * KV) * hs, q = (size_t)NH * hs;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *src = dqkv + n * in;
        float *dst = dqkv_g + n * out;
        memcpy(dst, src, q * sizeof(float));
        memset(dst + q, 0, (size_t)2 * KV * hs * sizeof(float));
        for (int h = 0; h < NH; h++) {
            const int g = (int)((long)h * KV / NH);
            add_row(dst + q + (size_t)g * hs, src + q + (size_t)h * hs, hs);
            add_row(dst + q + (size_t)(KV + g) * hs, src + 2 * q + (size_t)h * hs, hs);
        }
    }
}

/* ------------------------------------------------------------ SwiGLU MLP */

void swiglu_mlp_forward(const float *x, int n, int C, int F, const float *w1, const float *w2,
                        float *h, float *hg, float *y) {
    linear_forward(h, x, w1, NULL, n, C, 2 * F);
    swiglu_forward(hg, h, n, F);
    linear_forward(y, hg, w2, NULL, n, F, C);
}

void swiglu_mlp_backward(const float *x, int n, int C, int F, const float *w1, const float *w2,
                         float *gw1, float *gw2, const float *h, float *hg, int again,
                         const float *dy, float *dhg, float *dh, float *dx) {
    if (again) swiglu_forward(hg, h, n, F);
    linear_backward_set(dhg, gw2, NULL, dy, hg, w2, n, F, C);
    swiglu_backward(dh, dhg, h, n, F);
    linear_backward_set(dx, gw1, NULL, dh, x, w1, n, C, 2 * F);
}
