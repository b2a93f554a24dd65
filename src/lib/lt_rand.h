/* lt_rand: SplitMix64, the one generator behind Lathe's seeded choices (data order, shuffles,
 * random models, generated traces) and its integer hash. Deterministic in the seed on every
 * machine. Part of lt_base (header only): the engine may use it. */
#ifndef LT_RAND_H
#define LT_RAND_H

#include <stdint.h>

/* The finalizer: a 64-bit mix of x. */
static inline uint64_t lt_mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* The next value of the sequence whose state is *s (the state advances). */
static inline uint64_t lt_splitmix64(uint64_t *s) { return lt_mix64(*s += 0x9e3779b97f4a7c15ULL); }

#endif
