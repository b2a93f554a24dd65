/* lt_k_dropout: the dropout mask, one definition for every backend. Plain C, compiled for host
 * and device under nvcc, so the cpu backend and the CUDA kernel run the same hash and drop the
 * same elements bit for bit. */
#ifndef LT_K_DROPOUT_H
#define LT_K_DROPOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define LT_K_HOST_DEVICE __host__ __device__
#else
#define LT_K_HOST_DEVICE
#endif

/* A SplitMix64 hash of (seed, index) compared with p scaled to 2^32. Returns 1 to keep element
 * `i`. */
static inline LT_K_HOST_DEVICE int lt_backend_dropout_keep(uint64_t seed, uint64_t i, float p) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(uint32_t)(z >> 32) >= (double)p * 4294967296.0;
}

#endif
