/* lt_cpu_dot: the batch-invariant dot products of the cpu backend's matmul_rows
 * (lt_backend_cpu.c), included there only. Every element of a product is one 16-lane sum whose
 * order is fixed, whichever kernel computes it and whichever instruction set it is built for:
 * over floats, or over bf16 pairs when the weight has a bf16 copy (bf16 serving, below). */
#ifndef LT_CPU_DOT_H
#define LT_CPU_DOT_H

#include <immintrin.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The order every element of a float product is summed in, whatever M: 16 partial sums, lane
 * i taking k = i, i + 16, ... (the tail in the low lanes), then folded pairwise. The kernels below
 * keep the 16 lanes as one 16-float vector (GCC's vector extension: one register with AVX-512,
 * two with AVX2, four with SSE2), so each lane sees the same operations in the same order in
 * every kernel and build. */
typedef float v16f __attribute__((vector_size(64)));
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

/* Sixteen weights from element k on. The kernels take the loader as an argument (a constant:
 * it is inlined): clang refuses a call returning a 64-byte vector between functions of
 * different targets, even one always inlined, so the AVX-512 build has a loader of its own. */
typedef v16f (*ldw_fn)(const float *w, int k);

AI v16f ldw(const float *w, int k) { return ld16(w + k); }

__attribute__((target("avx512f"))) AI v16f ldw_avx512(const float *w, int k) {
  v16f v;
  memcpy(&v, w + k, sizeof v);
  return v;
}

AI float fold16(float *acc) {
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; i++) acc[i] += acc[i + w];
  return acc[0];
}

/* The lanes' partial sums plus the tail k0..K-1 in the low lanes, folded. */
AI float finish16(v16f v, const float *a, const float *b, int k0, int K) {
  float acc[16];
  memcpy(acc, &v, sizeof v);
  for (int i = 0; k0 + i < K; i++) acc[i] += a[k0 + i] * b[k0 + i];
  return fold16(acc);
}

AI float dot16(const float *a, const float *b, int K, ldw_fn ld) {
  v16f v = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) v += ld16(a + k) * ld(b, k);
  return finish16(v, a, b, k, K);
}

/* Four rows against one weight row at once: each weight value is loaded once for the four, and
 * each element is summed exactly as dot16 sums it (same lanes, same fold), so a row's result does
 * not depend on whether it was computed in a block of four or alone. */
AI void dot16x4(const float *a0, const float *a1, const float *a2, const float *a3, const float *b, int K,
                ldw_fn ld, float out[4]) {
  v16f v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f w = ld(b, k);
    v0 += ld16(a0 + k) * w;
    v1 += ld16(a1 + k) * w;
    v2 += ld16(a2 + k) * w;
    v3 += ld16(a3 + k) * w;
  }
  out[0] = finish16(v0, a0, b, k, K);
  out[1] = finish16(v1, a1, b, k, K);
  out[2] = finish16(v2, a2, b, k, K);
  out[3] = finish16(v3, a3, b, k, K);
}

/* One row against four weight rows (b, b + ldb, ...): four independent sums in flight, for the
 * few-row products of decoding (memory-bound: more loads outstanding), each summed exactly as
 * dot16 sums it. */
AI void dot16w4(const float *a, const float *b, size_t ldb, int K, ldw_fn ld, float out[4]) {
  const float *b1 = b + ldb, *b2 = b + 2 * ldb, *b3 = b + 3 * ldb;
  v16f v0 = {0}, v1 = {0}, v2 = {0}, v3 = {0};
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    v16f x = ld16(a + k);
    v0 += x * ld(b, k);
    v1 += x * ld(b1, k);
    v2 += x * ld(b2, k);
    v3 += x * ld(b3, k);
  }
  out[0] = finish16(v0, a, b, k, K);
  out[1] = finish16(v1, a, b1, k, K);
  out[2] = finish16(v2, a, b2, k, K);
  out[3] = finish16(v3, a, b3, k, K);
}

/* ---- bf16 pairs: the products of bf16 serving -----------------------------------------------
 * With bf16 weights (lt_cpu_opts_t.bf16_weights) a product reads both operands as bf16: the
 * weight's copy, and the activation rows rounded to bf16 once per product (lt_backend_cpu.c, bf16_rows). Every
 * element is then one sum in this order, whatever M, kernel or instruction set: 16 float lanes;
 * chunk c of 32 elements gives lane l the pair k = 32c + 2l, 32c + 2l + 1 (elements past K count
 * as zeros), added odd first: acc = acc + a[k+1]*w[k+1]; acc = acc + a[k]*w[k]; then the lanes
 * folded as fold16. That is AVX-512 BF16's vdpbf16ps, element for element (a product of two bf16
 * values is exact in a float, so its fused add and a multiply-then-add round alike), and the
 * narrow kernels compute the same sums from the widened halves. The instruction treats
 * subnormal inputs and results as zero, so every bf16 product runs with MXCSR's FTZ and DAZ set
 * (bf16_csr_enter), the narrow kernels' arithmetic and every path's fold alike: the same bits on
 * every machine for every finite result. The lanes hold 16 dwords of bf16 pairs (low half the
 * even element). */

/* Sixteen dwords of bf16 pairs from element k of p on; zeros past K. */
AI v16u ldp(const uint16_t *p, int k, int K) {
  v16u v;
  if (k + 32 <= K) {
    memcpy(&v, p + k, sizeof v);
    return v;
  }
  uint16_t t[32] = {0};
  memcpy(t, p + k, (size_t)(K - k) * sizeof *t);
  memcpy(&v, t, sizeof v);
  return v;
}

/* One chunk into the lanes: the odd elements' products added, then the even ones'. */
typedef v16f (*bstep_fn)(v16f acc, v16u a, v16u w);

AI v16f bstep(v16f acc, v16u a, v16u w) {
  const v16u hi = {0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u,
                   0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u,
                   0xffff0000u, 0xffff0000u, 0xffff0000u, 0xffff0000u};
  acc = acc + (v16f)(a & hi) * (v16f)(w & hi);
  return acc + (v16f)(a << 16) * (v16f)(w << 16);
}

__attribute__((target("avx512f,avx512bf16"))) AI v16f bstep_avx512(v16f acc, v16u a, v16u w) {
  return (v16f)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)w);
}

/* The loader for the AVX-512 build (see ldw_avx512 for why it is its own): a masked load for
 * the tail. */
__attribute__((target("avx512f,avx512bw"))) AI v16u ldp_avx512(const uint16_t *p, int k, int K) {
  if (k + 32 <= K) return (v16u)_mm512_loadu_si512((const void *)(p + k));
  return (v16u)_mm512_maskz_loadu_epi16((__mmask32)((1ull << (K - k)) - 1), p + k);
}
typedef v16u (*ldp_fn)(const uint16_t *p, int k, int K);

AI float bfold(v16f v) {
  float acc[16];
  memcpy(acc, &v, sizeof v);
  return fold16(acc);
}

/* fold16's tree in registers: halves, quarters, pairs, then the two (a tile folds sixteen sums
 * after every K; through memory that cost as much as the products at K = 576). */
__attribute__((target("avx512f"))) AI float bfold_avx512(v16f v) {
  __m512 x = (__m512)v;
  __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(x), hi);
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}
typedef float (*bfold_fn)(v16f v);

/* Enters and leaves the bf16 products' floating-point mode (FTZ and DAZ). */
AI unsigned bf16_csr_enter(void) {
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);
  return csr;
}
AI void bf16_csr_leave(unsigned csr) { _mm_setcsr(csr); }

/* rows x cols elements: rows activation rows (a, a + lda, ...) against cols weight rows
 * (w, w + ldw, ...), out[cols * r + q]; each element summed exactly as above, so tiling changes
 * no bit. rows x cols is 4x4, 1x4 or 1x1 (a constant at every call). The accumulators are named,
 * not an array: GCC kept an array of sixteen in memory, a store per chunk. pf, unless NULL: four
 * weight rows (ldw apart) a later tile reads, prefetched chunk by chunk beside this one's (the
 * weights stream from memory once a step; without it a tile waited for each chunk, and the
 * products of the rows in L1 did not overlap the next rows' fetch). */
AI void bdot_tile(const uint16_t *a, size_t lda, const uint16_t *w, size_t ldw, int K, int rows, int cols,
                  const uint16_t *pf, ldp_fn ld, bstep_fn step, bfold_fn fold, float *out) {
  v16f v00 = {0}, v01 = {0}, v02 = {0}, v03 = {0}, v10 = {0}, v11 = {0}, v12 = {0}, v13 = {0};
  v16f v20 = {0}, v21 = {0}, v22 = {0}, v23 = {0}, v30 = {0}, v31 = {0}, v32 = {0}, v33 = {0};
  for (int k = 0; k < K; k += 32) {
    if (pf)
      for (int q = 0; q < 4; q++) _mm_prefetch((const char *)(pf + q * ldw + k), _MM_HINT_T0);
    v16u w0 = ld(w, k, K), a0 = ld(a, k, K);
    v00 = step(v00, a0, w0);
    if (cols == 4) {
      v16u w1 = ld(w + ldw, k, K), w2 = ld(w + 2 * ldw, k, K), w3 = ld(w + 3 * ldw, k, K);
      v01 = step(v01, a0, w1), v02 = step(v02, a0, w2), v03 = step(v03, a0, w3);
      if (rows == 4) {
        v16u a1 = ld(a + lda, k, K), a2 = ld(a + 2 * lda, k, K), a3 = ld(a + 3 * lda, k, K);
        v10 = step(v10, a1, w0), v11 = step(v11, a1, w1), v12 = step(v12, a1, w2), v13 = step(v13, a1, w3);
        v20 = step(v20, a2, w0), v21 = step(v21, a2, w1), v22 = step(v22, a2, w2), v23 = step(v23, a2, w3);
        v30 = step(v30, a3, w0), v31 = step(v31, a3, w1), v32 = step(v32, a3, w2), v33 = step(v33, a3, w3);
      }
    }
  }
  out[0] = fold(v00);
  if (cols == 4) {
    out[1] = fold(v01), out[2] = fold(v02), out[3] = fold(v03);
    if (rows == 4) {
      out[4] = fold(v10), out[5] = fold(v11), out[6] = fold(v12), out[7] = fold(v13);
      out[8] = fold(v20), out[9] = fold(v21), out[10] = fold(v22), out[11] = fold(v23);
      out[12] = fold(v30), out[13] = fold(v31), out[14] = fold(v32), out[15] = fold(v33);
    }
  }
}

/* Eight activation rows against two weight rows: sixteen sums (out[2 * row + col]), each weight
 * chunk loaded once for eight rows, so a batch of eight streams the weights once with the
 * products between the loads; every element summed exactly as bdot_tile sums it. */
AI void bdot_tile82(const uint16_t *a, size_t lda, const uint16_t *w, size_t ldw, int K,
                    const uint16_t *pf, ldp_fn ld, bstep_fn step, bfold_fn fold, float *out) {
  v16f v00 = {0}, v01 = {0}, v10 = {0}, v11 = {0}, v20 = {0}, v21 = {0}, v30 = {0}, v31 = {0};
  v16f v40 = {0}, v41 = {0}, v50 = {0}, v51 = {0}, v60 = {0}, v61 = {0}, v70 = {0}, v71 = {0};
  for (int k = 0; k < K; k += 32) {
    if (pf) {
      _mm_prefetch((const char *)(pf + k), _MM_HINT_T0);
      _mm_prefetch((const char *)(pf + ldw + k), _MM_HINT_T0);
    }
    v16u w0 = ld(w, k, K), w1 = ld(w + ldw, k, K), x;
    x = ld(a, k, K), v00 = step(v00, x, w0), v01 = step(v01, x, w1);
    x = ld(a + lda, k, K), v10 = step(v10, x, w0), v11 = step(v11, x, w1);
    x = ld(a + 2 * lda, k, K), v20 = step(v20, x, w0), v21 = step(v21, x, w1);
    x = ld(a + 3 * lda, k, K), v30 = step(v30, x, w0), v31 = step(v31, x, w1);
    x = ld(a + 4 * lda, k, K), v40 = step(v40, x, w0), v41 = step(v41, x, w1);
    x = ld(a + 5 * lda, k, K), v50 = step(v50, x, w0), v51 = step(v51, x, w1);
    x = ld(a + 6 * lda, k, K), v60 = step(v60, x, w0), v61 = step(v61, x, w1);
    x = ld(a + 7 * lda, k, K), v70 = step(v70, x, w0), v71 = step(v71, x, w1);
  }
  out[0] = fold(v00), out[1] = fold(v01), out[2] = fold(v10), out[3] = fold(v11);
  out[4] = fold(v20), out[5] = fold(v21), out[6] = fold(v30), out[7] = fold(v31);
  out[8] = fold(v40), out[9] = fold(v41), out[10] = fold(v50), out[11] = fold(v51);
  out[12] = fold(v60), out[13] = fold(v61), out[14] = fold(v70), out[15] = fold(v71);
}

#endif
