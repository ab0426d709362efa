/*
 * rng: counter-based random numbers. A value is a pure function of
 * (seed, stream, counter), so any rank can compute any element of any tensor's
 * initial value, or any step's data order, without drawing the ones before it.
 */
#ifndef MODTRAIN_RNG_H
#define MODTRAIN_RNG_H

#include <stdint.h>

/* 64-bit FNV-1a of a string: turns a tensor name into a stream id. */
uint64_t rng_hash_str(const char *s);
/* Mixes (seed, stream, counter) into 64 well-distributed bits. */
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter);
/* Uniform double in [0, 1) with 53 random bits. */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);
/* Standard normal (Box-Muller on two counter draws). */
double rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);

/* A small sequential generator for sampling (xorshift64*). */
typedef struct {
    uint64_t s;
} Rng;
void rng_seed(Rng *r, uint64_t seed);
double rng_next_uniform(Rng *r);

#endif
