/*
 * rng: a SplitMix64-style finaliser applied to a combined key. Statistical
 * quality is ample for initialisation and shuffling; what matters here is that
 * the value of element i never depends on how the tensor is split.
 */
#include "src/base/rng.h"

#include <math.h>

uint64_t rng_hash_str(const char *s) {
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return mix64(mix64(mix64(seed) ^ stream) ^ counter);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (double)(rng_u64(seed, stream, counter) >> 11) * 0x1.0p-53;
}

double rng_normal(uint64_t seed, uint64_t stream, uint64_t counter) {
    /* Two independent draws per element: counters 2i and 2i+1. */
    double u1 = rng_uniform(seed, stream, 2 * counter);
    double u2 = rng_uniform(seed, stream, 2 * counter + 1);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void rng_seed(Rng *r, uint64_t seed) { r->s = mix64(seed) | 1; }

double rng_next_uniform(Rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return (double)((r->s * 0x2545F4914F6CDD1DULL) >> 11) * 0x1.0p-53;
}
