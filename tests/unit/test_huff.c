/*
 * test_huff: the checkpoint's Huffman-only deflate against zlib. Every
 * stream inflates with zlib to its input; it is no larger than zlib's own
 * Z_HUFFMAN_ONLY stream plus 0.5% (where the 15-bit length limit binds,
 * as on Fibonacci counts, 15%); a too small output buffer gives 0 and
 * is never written past; code lengths are optimal (a naive Huffman
 * reference's cost) when the limit does not bind and within the limit and
 * the Kraft inequality when it does. The byte shuffle that feeds it puts
 * byte b of float i at plane b, position i, as a byte loop does, and the
 * unshuffle restores every float's bits.
 */
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "checkpoint/ckio.h"
#include "checkpoint/huff.h"
#include "tests/unit/testutil.h"

/* zlib's Huffman-only stream of n bytes: its size. */
static size_t zlib_huffman(const uint8_t *in, size_t n) {
    uLong cap = compressBound((uLong)n);
    uint8_t *out = malloc(cap);
    z_stream z;
    memset(&z, 0, sizeof z);
    deflateInit2(&z, 6, Z_DEFLATED, 15, 9, Z_HUFFMAN_ONLY);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    size_t got = z.total_out;
    deflateEnd(&z);
    free(out);
    return got;
}

/* Codes in, inflates it with zlib and compares; checks the size against
 * zlib's and that nothing past the stream was written. */
static void round_trip_tol(const uint8_t *in, size_t n, const char *what, double tol) {
    size_t cap = compressBound((uLong)n) + 64;
    uint8_t *out = malloc(cap + 16);
    memset(out, 0xA5, cap + 16);
    size_t got = ck_huffman(in, n, out, cap);
    CU_ASSERT_FATAL(got > 0 && got <= cap);
    for (size_t i = cap; i < cap + 16; i++) CU_ASSERT_EQUAL(out[i], 0xA5);
    uint8_t *back = malloc(n + 1);
    uLongf blen = (uLongf)n;
    CU_ASSERT_EQUAL(uncompress(back, &blen, out, (uLong)got), Z_OK);
    CU_ASSERT_EQUAL(blen, n);
    CU_ASSERT(memcmp(back, in, n) == 0);
    size_t ref = zlib_huffman(in, n);
    if (n >= 4096) CU_ASSERT(got <= (double)ref * (1 + tol));
    if (n >= (1 << 17))
        printf("\n  %s: %zu bytes -> %zu (zlib Z_HUFFMAN_ONLY: %zu) ", what, n, got, ref);
    free(back);
    free(out);
}

static void round_trip(const uint8_t *in, size_t n, const char *what) {
    round_trip_tol(in, n, what, 0.005);
}

static void test_round_trips(void) {
    const size_t sizes[] = {0, 1, 2, 100, 65535, 65536, 65537, 3 * 65536 + 17, 1 << 20};
    uint8_t *buf = malloc(4 << 20);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)rng_u64(1, 0, i); /* random */
        round_trip(buf, n, "uniform bytes");
        memset(buf, 7, n); /* one symbol */
        round_trip(buf, n, "one byte value");
        for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i % 2 ? 200 : 3); /* two */
        round_trip(buf, n, "two byte values");
    }
    /* the byte planes of normal weights and of AdamW second moments */
    const size_t nf = 1 << 20;
    float *x = malloc(nf * sizeof(float));
    uint8_t *planes = malloc(4 * nf);
    fill_normal(x, nf, 3, 0.02f);
    for (size_t i = 0; i < nf; i++)
        for (int b = 0; b < 4; b++) planes[(size_t)b * nf + i] = ((uint8_t *)x)[4 * i + b];
    round_trip(planes + 3 * nf, nf, "sign/exponent plane of N(0, 0.02)");
    round_trip(planes + 2 * nf, nf, "third plane of N(0, 0.02)");
    for (size_t i = 0; i < nf; i++) x[i] = x[i] * x[i] * 1e-3f;
    for (size_t i = 0; i < nf; i++)
        for (int b = 0; b < 4; b++) planes[(size_t)b * nf + i] = ((uint8_t *)x)[4 * i + b];
    round_trip(planes + 3 * nf, nf, "exponent plane of squares");
    /* a skewed alphabet: Fibonacci-like counts, deeper than 15 bits unlimited */
    size_t at = 0, c = 1, p = 1;
    for (int s = 0; s < 25 && at < (4u << 20); s++) {
        for (size_t i = 0; i < c && at < (4u << 20); i++) buf[at++] = (uint8_t)s;
        size_t t = c + p;
        p = c;
        c = t;
    }
    /* where the 15-bit limit binds, zlib's redistribution of lengths gains
     * more than lengthening the rarest codes (12% here, adversarial) */
    round_trip_tol(buf, at, "Fibonacci counts", 0.15);
    free(planes);
    free(x);
    free(buf);
}

static void test_too_small(void) {
    uint8_t in[4096], out[4096 + 64];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)rng_u64(2, 0, i);
    for (size_t cap = 0; cap < 4096; cap += 97) {
        memset(out, 0xA5, sizeof out);
        CU_ASSERT_EQUAL(ck_huffman(in, sizeof in, out, cap), 0);
        for (size_t i = cap; i < sizeof out; i++) CU_ASSERT_EQUAL(out[i], 0xA5);
    }
}

/* Cost (sum of count x length) of an optimal prefix code: repeated merges
 * of the two lightest, O(n^2). */
static uint64_t reference_cost(const uint32_t *f, int n) {
    uint64_t w[300], cost = 0;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (f[i]) w[m++] = f[i];
    if (m == 1) return w[0];
    while (m > 1) {
        for (int j = 0; j < 2; j++) /* the lightest to the end */
            for (int i = 0; i < m - 1 - j; i++)
                if (w[i] < w[i + 1]) {
                    uint64_t t = w[i];
                    w[i] = w[i + 1];
                    w[i + 1] = t;
                }
        w[m - 2] += w[m - 1];
        cost += w[m - 2];
        m--;
    }
    return cost;
}

static void test_lengths(void) {
    uint32_t f[288];
    uint8_t len[288];
    for (int trial = 0; trial < 200; trial++) {
        const int n = trial % 2 ? 257 : 19;
        for (int s = 0; s < n; s++) {
            uint64_t r = rng_u64(5, (uint64_t)trial, (uint64_t)s);
            f[s] = r % 4 == 0 ? 0 : (uint32_t)(1 + (r >> 8) % (trial < 100 ? 1000 : 3));
        }
        ck_huff_lengths(f, n, 15, len);
        uint64_t cost = 0, kraft = 0;
        for (int s = 0; s < n; s++) {
            CU_ASSERT(len[s] <= 15);
            CU_ASSERT((f[s] == 0) == (len[s] == 0));
            cost += (uint64_t)f[s] * len[s];
            if (len[s]) kraft += (uint64_t)1 << (15 - len[s]);
        }
        CU_ASSERT(kraft <= 1u << 15);
        CU_ASSERT_EQUAL(cost, reference_cost(f, n));
    }
    /* Fibonacci counts need 24 bits unlimited: within 7 and 15, Kraft holds */
    uint32_t a = 1, b = 1;
    for (int s = 0; s < 25; s++) {
        f[s] = a;
        uint32_t t = a + b;
        a = b;
        b = t;
    }
    const int limits[] = {7, 15};
    for (int k = 0; k < 2; k++) {
        ck_huff_lengths(f, 19, limits[k], len);
        uint64_t kraft = 0;
        for (int s = 0; s < 19; s++) {
            CU_ASSERT(len[s] >= 1 && len[s] <= limits[k]);
            kraft += (uint64_t)1 << (limits[k] - len[s]);
        }
        CU_ASSERT(kraft <= (uint64_t)1 << limits[k]);
    }
}

static void test_shuffle(void) {
    const size_t sizes[] = {0, 1, 7, 64, 1001, 4099};
    uint32_t x = 12345;
    for (int k = 0; k < 6; k++) {
        const size_t n = sizes[k];
        float *in = malloc(n * 4 + 4), *back = malloc(n * 4 + 4);
        uint8_t *planes = malloc(n * 4 + 4);
        for (size_t i = 0; i < n * 4; i++) {
            x = x * 1103515245u + 12345u;
            ((uint8_t *)in)[i] = (uint8_t)(x >> 16);
        }
        ck_shuffle(planes, in, n);
        int same = 1;
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++)
                same &= planes[(size_t)b * n + i] == ((uint8_t *)in)[4 * i + b];
        CU_ASSERT(same);
        ck_unshuffle(back, planes, n);
        CU_ASSERT(memcmp(back, in, n * 4) == 0);
        free(in);
        free(back);
        free(planes);
    }
}

int main(void) {
    CU_TestInfo tests[] = {
        {"streams inflate with zlib, no larger than zlib's", test_round_trips},
        {"a too small buffer: 0, nothing written past it", test_too_small},
        {"code lengths: optimal, or within the limit", test_lengths},
        {"byte shuffle: planes as a byte loop makes them, and back", test_shuffle},
        CU_TEST_INFO_NULL};
    return run_suite("huff", tests);
}
