/* lt_cpu_dot: the batch-invariant dot products of the cpu backend's matmul_rows
 * (lt_backend_cpu.c), included there only. Every element of a product is one 16-lane sum whose
 * order is fixed, whichever kernel computes it and whichever instruction set it is built for. */
#ifndef LT_CPU_DOT_H
#define LT_CPU_DOT_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The order every element of the product is summed in, whatever M: 16 partial sums, lane i
 * taking k = i, i + 16, ... (the tail in the low lanes), then folded pairwise. The kernels below
 * keep the 16 lanes as one 16-float vector (GCC's vector extension: one register with AVX-512,
 * two with AVX2, four with SSE2), so each lane sees the same operations in the same order in
 * every kernel and build. The weight operand is `const void *` with `h` saying bf16 (true) or
 * float: every caller passes a constant, so each kernel is compiled once per weight type,
 * without a branch in the loop. */
typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
/* The helpers taking and returning v16f are always inlined: no call, so no ABI to change (GCC
 * warns at the end of the file, so the warning is off for all of it). */
#pragma GCC diagnostic ignored "-Wpsabi"
#define AI static inline __attribute__((always_inline))

AI v16f ld16(const float *p) {
  v16f v;
  memcpy(&v, p, sizeof v);
  return v;
}

/* Sixteen weights from element k on: floats, or bf16 widened (the bits shifted into the top
 * half). The kernels take the loader as an argument (a constant: it is inlined), so the AVX-512
 * build can widen with one instruction (GCC splits the generic conversion in four). */
typedef v16f (*ldw_fn)(const void *w, int k, bool h);

AI v16f ldw(const void *w, int k, bool h) {
  if (!h) return ld16((const float *)w + k);
  v16h x;
  memcpy(&x, (const uint16_t *)w + k, sizeof x);
  return (v16f)(__builtin_convertvector(x, v16u) << 16);
}

/* Loads without calling ld16: clang refuses a call returning a 64-byte vector between functions
 * of different targets, even one always inlined. */
__attribute__((target("avx512f"))) AI v16f ldw_avx512(const void *w, int k, bool h) {
  if (!h) {
    v16f v;
    memcpy(&v, (const float *)w + k, sizeof v);
    return v;
  }
  __m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + k));
  return (v16f)_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16);
}

AI float wat(const void *w, int k, bool h) {
  if (!h) return ((const float *)w)[k];
  uint32_t u = (uint32_t)((const uint16_t *)w)[k] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

AI float fold16(float *acc) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; i++) acc[i] += acc[i + w];
  return acc[0];
}

/* The lanes' partial sums plus the tail k0..K-1 in the low lanes, folded. */
AI float finish16(v16f v, const float *a, const void *b, bool h, int k0, int K) {
  float acc[16];
  memcpy(acc, &v, sizeof v);
  for (int i = 0; k0 + i < K; i++) acc[i] += a[k0 + i] * wat(b, k0 + i, h);
  return fold16(acc);
}

AI float dot16(const float *a, const void *b, bool h, int K, ldw_fn ld) {
  v16f v = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) v += ld16(a + k) * ld(b, k, h);
  return finish16(v, a, b, h, k, K);
}

/* Four rows against one weight row at once: each weight value is loaded once for the four, and
 * each element is summed exactly as dot16 sums it (same lanes, same fold), so a row's result does
 * not depend on whether it was computed in a block of four or alone. */
AI void dot16x4(const float *a0, const float *a1, const float *a2, const float *a3, const void *b, bool h,
                int K, ldw_fn ld, float out[4]) {
  v16f v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f w = ld(b, k, h);
    v0 += ld16(a0 + k) * w;
    v1 += ld16(a1 + k) * w;
    v2 += ld16(a2 + k) * w;
    v3 += ld16(a3 + k) * w;
  }
  out[0] = finish16(v0, a0, b, h, k, K);
  out[1] = finish16(v1, a1, b, h, k, K);
  out[2] = finish16(v2, a2, b, h, k, K);
  out[3] = finish16(v3, a3, b, h, k, K);
}

/* One row against four weight rows (b, b + ldb, ...): four independent sums in flight, for the
 * few-row products of decoding (memory-bound: more loads outstanding), each summed exactly as
 * dot16 sums it. */
AI void dot16w4(const float *a, const void *b, size_t ldb, bool h, int K, ldw_fn ld, float out[4]) {
  const void *b1 = h ? (const void *)((const uint16_t *)b + ldb) : (const void *)((const float *)b + ldb);
  const void *b2 = h ? (const void *)((const uint16_t *)b + 2 * ldb) : (const void *)((const float *)b + 2 * ldb);
  const void *b3 = h ? (const void *)((const uint16_t *)b + 3 * ldb) : (const void *)((const float *)b + 3 * ldb);
  v16f v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f x = ld16(a + k);
    v0 += x * ld(b, k, h);
    v1 += x * ld(b1, k, h);
    v2 += x * ld(b2, k, h);
    v3 += x * ld(b3, k, h);
  }
  out[0] = finish16(v0, a, b, h, k, K);
  out[1] = finish16(v1, a, b1, h, k, K);
  out[2] = finish16(v2, a, b2, h, k, K);
  out[3] = finish16(v3, a, b3, h, k, K);
}

#endif
