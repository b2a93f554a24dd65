/* lt_cpu_attn: tiled causal attention for the cpu backend's training pass (see lt_cpu_attn.h).
 *
 * Both passes work per sequence and kv head, on the g = H/KV query heads that read it stacked
 * into one tile of g * 64 rows (head after head): one product per key tile for all of them,
 * three times the rows OpenBLAS gets per call at SmolLM2's 9/3 heads, and K and V read once.
 *
 * Forward: for each query tile, the key tiles from the tile's earliest example start up to its
 * last row; scores S = Q K^T on the tile (cblas_sgemm; the 1/sqrt(hd) is applied to s - max,
 * see row_exp), masked per row to the row's window t - pos[t] .. t, then the online softmax: a
 * running max m and sum l per row, the output rows rescaled by exp(m_old - m_new) before P V is
 * added. The state is m and 1/l per row.
 *
 * Backward (FlashAttention-2's equations, query tiles outer): with D_t = rowsum(dO_t * O_t) (in
 * double) and P = exp((S - m) * scale) / l recomputed per tile: dV += P^T dO, dP = dO V^T,
 * dS = P * (dP - D), dQ += scale * dS K, dK += scale * dS^T Q. One task owns a kv head and every
 * query head reading it, so dk and dv are summed in a fixed order: no atomics, results
 * independent of the thread count.
 * Tiles of 64: within noise of 48, 96 and 128 at T = 256 .. 2048, hd 64; 32 is slower. */
#include "lt_cpu_attn.h"

#include <assert.h>
#include <cblas.h>
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "lt_cpu_fexp.h"
#include "lt_cpu_vec.h"

size_t lt_cpu_attn_scratch(int tile, int hd, int g, int T) {
  return (size_t)g * (2 * (size_t)tile * tile + 3 * (size_t)tile * hd + 3 * (size_t)tile) + 2 * (size_t)hd * T;
}


static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* Key tiles query tile i visits. */
static long tile_work(int T, int tile, const int32_t *ps, int i) {
  int q0 = i * tile, nq = imin(tile, T - q0), kbeg = q0 - ps[q0];
  return (q0 + nq - kbeg + tile - 1) / tile;
}

int lt_cpu_attn_parts(int B, int heads, int T, int tile) {
  int p = (LT_CPU_ATTN_UNITS + B * heads - 1) / (B * heads), tiles = (T + tile - 1) / tile;
  p = p < tiles ? p : tiles;
  return p < 1 ? 1 : p > LT_CPU_ATTN_MAX_PARTS ? LT_CPU_ATTN_MAX_PARTS : p;
}

void lt_cpu_attn_unit(lt_cpu_attn_dims_t d, int tile, const int32_t *pos, int parts, size_t u, int *b, int *kv,
                      int *qt0, int *qt1, int *part) {
  int bounds[LT_CPU_ATTN_MAX_PARTS + 1];
  *part = (int)(u % (size_t)parts);
  *kv = (int)(u / (size_t)parts % (size_t)d.KV);
  *b = (int)(u / (size_t)parts / (size_t)d.KV);
  lt_cpu_attn_split(d.T, tile, pos + (size_t)*b * d.T, parts, bounds);
  *qt0 = bounds[*part];
  *qt1 = bounds[*part + 1];
}

void lt_cpu_attn_split(int T, int tile, const int32_t *ps, int parts, int *bounds) {
  int ntiles = (T + tile - 1) / tile;
  long total = 0, acc = 0;
  for (int i = 0; i < ntiles; i++) total += tile_work(T, tile, ps, i);
  int p = 1;
  bounds[0] = 0;
  for (int i = 0; i < ntiles && p < parts; i++) {
    acc += tile_work(T, tile, ps, i);
    while (p < parts && acc * parts >= total * p) bounds[p++] = i + 1;
  }
  while (p <= parts) bounds[p++] = ntiles;
}

/* Row i of a tile of scores starting at key k0 (nk keys) for query row t: the columns of its
 * window, [*lo, *hi) (empty when the window misses the tile). */
LT_AI void window(const int32_t *ps, int t, int k0, int nk, int *lo, int *hi) {
  *lo = imin(imax(k0, t - ps[t]) - k0, nk);
  *hi = imax(imin(k0 + nk, t + 1) - k0, *lo);
}

/* x[j] = exp((x[j] - sub) * scale) * mul, elementwise. The scores stay unscaled until here,
 * as in the full-square kernels: s - max is then (nearly) exact and only the difference is
 * rounded by the scale, where scaling each score first would add an ulp of |s| to every
 * exponent. */
LT_AI void row_exp(float *x, int n, float sub, float scale, float mul) {
  for (int j = 0; j < n; j++) x[j] = lt_fexp((x[j] - sub) * scale) * mul;
}

/* The elementwise work on tiles, built for AVX-512, AVX2 and the baseline and picked at each
 * call (LT_ISA_DISPATCH, lt_cpu_vec.h). */
/* Forward: the unscaled scores S (nq x nk, row stride tile) of query rows q0.. against keys
 * k0.. become exp((s - m_new) * scale) inside each row's window and 0 outside; m (running max
 * of s) and l (running sum) are updated, and corr[i] is what row i's output so far must be
 * multiplied by. */
LT_AI void fwd_tile_of(float *S, int tile, int nq, int nk, const int32_t *ps, int q0,
                            int k0, float scale, float *m, float *l, float *corr) {
  for (int i = 0; i < nq; i++) {
    float *row = S + (size_t)i * tile;
    int lo, hi;
    window(ps, q0 + i, k0, nk, &lo, &hi);
    for (int j = 0; j < lo; j++) row[j] = 0.0f;
    for (int j = hi; j < nk; j++) row[j] = 0.0f;
    corr[i] = 1.0f;
    if (lo == hi) continue;
    float mx = lt_vec_max(row + lo, hi - lo, m[i]);
    row_exp(row + lo, hi - lo, mx, scale, 1.0f);
    float sum = lt_vec_sum(row + lo, hi - lo);
    if (mx != m[i] && m[i] != -INFINITY) {
      corr[i] = lt_fexp((m[i] - mx) * scale);
      l[i] *= corr[i];
    }
    m[i] = mx;
    l[i] += sum;
  }
}
LT_ISA_DISPATCH(fwd_tile, (float *S, int tile, int nq, int nk, const int32_t *ps, int q0, int k0, float scale, float *m, float *l, float *corr),
             (S, tile, nq, nk, ps, q0, k0, scale, m, l, corr))

/* rows of out *= f[i] */
LT_AI void scale_rows_of(float *O, int ld, int nq, int hd, const float *f) {
  for (int i = 0; i < nq; i++) {
    if (f[i] == 1.0f) continue;
    float *o = O + (size_t)i * ld;
    for (int c = 0; c < hd; c++) o[c] *= f[i];
  }
}
LT_ISA_DISPATCH(scale_rows, (float *O, int ld, int nq, int hd, const float *f),
             (O, ld, nq, hd, f))

/* Backward: the scores (as fwd_tile's) become P = exp((s - m) * scale) / l, 0 outside the
 * windows. */
LT_AI void bwd_p_tile_of(float *P, int tile, int nq, int nk, const int32_t *ps, int q0,
                              int k0, float scale, const float *st) {
  for (int i = 0; i < nq; i++) {
    float *row = P + (size_t)i * tile;
    int lo, hi;
    window(ps, q0 + i, k0, nk, &lo, &hi);
    for (int j = 0; j < lo; j++) row[j] = 0.0f;
    row_exp(row + lo, hi - lo, st[2 * (q0 + i)], scale, st[2 * (q0 + i) + 1]);
    for (int j = hi; j < nk; j++) row[j] = 0.0f;
  }
}
LT_ISA_DISPATCH(bwd_p_tile, (float *P, int tile, int nq, int nk, const int32_t *ps, int q0, int k0, float scale, const float *st),
             (P, tile, nq, nk, ps, q0, k0, scale, st))

/* dP <- P * (dP - D) */
LT_AI void bwd_ds_tile_of(float *dP, const float *P, int tile, int nq, int nk,
                               const float *D) {
  for (int i = 0; i < nq; i++) {
    const float *pr = P + (size_t)i * tile;
    float *dr = dP + (size_t)i * tile, di = D[i];
    for (int j = 0; j < nk; j++) dr[j] = pr[j] * (dr[j] - di);
  }
}
LT_ISA_DISPATCH(bwd_ds_tile, (float *dP, const float *P, int tile, int nq, int nk, const float *D),
             (dP, P, tile, nq, nk, D))

/* ---- the tile products --------------------------------------------------------------------
 *
 * Every product of both passes has 64 columns when hd = 64 and the key tile is whole: C (M x 64,
 * ldc) = alpha * A B (+ C when acc), A read as A[m * sam + k * sak] (so A or A^T), B (K x 64,
 * ldb); the two products against K^T and V^T take a 64 x 64 transposed copy of the tile. On
 * AVX-512 a kernel of our own does them: 6 rows x 64 columns of C in 24 registers, one pass over k
 * (a fixed order: the same bits whatever the thread count), no packing per call; OpenBLAS spent
 * as long packing as computing on these sizes (perf). Elsewhere, and for other shapes, cblas. */
__attribute__((target("avx512f"))) static void mm64_avx512(int M, int K, float alpha, const float *A, size_t sam,
                                                          size_t sak, const float *B, int ldb, float *C, int ldc,
                                                          int acc) {
  int m = 0;
  for (; m + 6 <= M; m += 6) {
    __m512 c[6][4];
    for (int r = 0; r < 6; r++)
      for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
      const float *b = B + (size_t)k * ldb, *a = A + (size_t)m * sam + (size_t)k * sak;
      __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16), b2 = _mm512_loadu_ps(b + 32),
             b3 = _mm512_loadu_ps(b + 48);
      for (int r = 0; r < 6; r++) {
        __m512 x = _mm512_set1_ps(a[(size_t)r * sam]);
        c[r][0] = _mm512_fmadd_ps(x, b0, c[r][0]);
        c[r][1] = _mm512_fmadd_ps(x, b1, c[r][1]);
        c[r][2] = _mm512_fmadd_ps(x, b2, c[r][2]);
        c[r][3] = _mm512_fmadd_ps(x, b3, c[r][3]);
      }
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int r = 0; r < 6; r++)
      for (int q = 0; q < 4; q++) {
        float *o = C + (size_t)(m + r) * ldc + 16 * q;
        __m512 v = _mm512_mul_ps(al, c[r][q]);
        _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), v) : v);
      }
  }
  for (; m < M; m++) { /* the last rows, one at a time, in the same order */
    __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int k = 0; k < K; k++) {
      const float *b = B + (size_t)k * ldb;
      __m512 x = _mm512_set1_ps(A[(size_t)m * sam + (size_t)k * sak]);
      for (int q = 0; q < 4; q++) c[q] = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 16 * q), c[q]);
    }
    __m512 al = _mm512_set1_ps(alpha);
    for (int q = 0; q < 4; q++) {
      float *o = C + (size_t)m * ldc + 16 * q;
      __m512 v = _mm512_mul_ps(al, c[q]);
      _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), v) : v);
    }
  }
}

/* Whether the products of this call take the kernel above: hd 64 on a chip with AVX-512 (asked
 * at each call, as LT_ISA_DISPATCH does: no cached flag for the pool's threads to race on). */
static bool mm64_ok(int hd) { return hd == 64 && __builtin_cpu_supports("avx512f"); }

/* C = alpha * op(A) B (+ C when acc): op(A) is A (M x K, lda) or, with ta, A^T (A: K x M). N
 * columns of B (K x N, ldb). */
static void tile_mm(bool fast, bool ta, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                    int ldb, float *C, int ldc, bool acc) {
  if (fast && N == 64) {
    mm64_avx512(M, K, alpha, A, ta ? 1 : (size_t)lda, ta ? (size_t)lda : 1, B, ldb, C, ldc, acc);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, K, alpha, A, lda, B, ldb,
              acc ? 1.0f : 0.0f, C, ldc);
}

/* C = A X^T for a tile X of N rows (ld ldx). The fast path reads X^T from xt (ld ldxt), the
 * transposed keys (or values) the call made once for all its tiles (transpose_rows). */
static void tile_mm_nt(bool fast, int M, int N, int hd, const float *A, int lda, const float *X, int ldx,
                       const float *xt, int ldxt, float *C, int ldc) {
  if (fast && N == 64) {
    mm64_avx512(M, hd, 1.0f, A, (size_t)lda, 1, xt, ldxt, C, ldc, 0);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, hd, 1.0f, A, lda, X, ldx, 0.0f, C, ldc);
}

/* xt (hd x (hi - lo)) = rows lo .. hi-1 of X (ld ldx), transposed. */
static void transpose_rows(float *xt, const float *X, int ldx, int hd, int lo, int hi) {
  int w = hi - lo;
  for (int k = lo; k < hi; k++)
    for (int c = 0; c < hd; c++) xt[(size_t)c * w + (k - lo)] = X[(size_t)k * ldx + c];
}

/* The rows q0 .. q0+nq-1 of the g query heads of kv head kv, stacked head after head (row
 * hh*nq + i: head kv*g + hh, position q0 + i) into X (ld hd), from a (ld ldq) at head offset. */
static void gather(float *X, const float *a, int ldq, int hd, int g, int h0, int q0, int nq) {
  for (int hh = 0; hh < g; hh++)
    for (int i = 0; i < nq; i++)
      memcpy(X + ((size_t)hh * nq + i) * hd, a + (size_t)(q0 + i) * ldq + (size_t)(h0 + hh) * hd,
             (size_t)hd * sizeof(float));
}

void lt_cpu_attn_fwd_kv(lt_cpu_attn_dims_t d, int tile, int b, int kv, int qt0, int qt1, float *out, float *st,
                        const float *q, const float *k, const float *v, const int32_t *pos, float *scratch) {
  int T = d.T, H = d.H, KV = d.KV, hd = d.hd, g = H / KV, ldq = H * hd, ldk = KV * hd, h0 = kv * g;
  float scale = 1.0f / sqrtf((float)hd);
  const float *Q = q + (size_t)b * T * ldq;
  const float *K = k + (size_t)b * T * ldk + (size_t)kv * hd;
  const float *Vv = v + (size_t)b * T * ldk + (size_t)kv * hd;
  float *O = out + (size_t)b * T * ldq;
  const int32_t *ps = pos + (size_t)b * T;
  float *S = scratch, *Qs = S + (size_t)g * tile * tile, *Os = Qs + (size_t)g * tile * hd;
  float *m = Os + (size_t)g * tile * hd, *l = m + (size_t)g * tile, *corr = l + (size_t)g * tile;
  float *kt = corr + (size_t)g * tile; /* the keys the call reads, transposed (hd x w) */
  bool fast = tile == 64 && mm64_ok(hd);
  int klo = qt0 * tile < T ? qt0 * tile - ps[qt0 * tile] : 0, w = imin(qt1 * tile, T) - klo;
  if (fast && w > 0) transpose_rows(kt, K, ldk, hd, klo, klo + w);
  for (int q0 = qt0 * tile; q0 < imin(qt1 * tile, T); q0 += tile) {
    int nq = imin(tile, T - q0), M = g * nq;
    int kbeg = q0 - ps[q0]; /* example starts never decrease along a row */
    gather(Qs, Q, ldq, hd, g, h0, q0, nq);
    memset(Os, 0, (size_t)M * hd * sizeof(float));
    for (int r = 0; r < M; r++) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    for (int k0 = kbeg; k0 < q0 + nq; k0 += tile) {
      int nk = imin(tile, q0 + nq - k0);
      tile_mm_nt(fast, M, nk, hd, Qs, hd, K + (size_t)k0 * ldk, ldk, kt + (k0 - klo), w, S, tile);
      for (int hh = 0; hh < g; hh++)
        fwd_tile(S + (size_t)hh * nq * tile, tile, nq, nk, ps, q0, k0, scale, m + hh * nq, l + hh * nq,
                 corr + hh * nq);
      scale_rows(Os, hd, M, hd, corr);
      tile_mm(fast, false, M, hd, nk, 1.0f, S, tile, Vv + (size_t)k0 * ldk, ldk, Os, hd, true);
    }
    for (int hh = 0; hh < g; hh++) {
      float *L = st + ((size_t)b * H + h0 + hh) * T * 2;
      for (int i = 0; i < nq; i++) {
        int r = hh * nq + i;
        float inv = 1.0f / l[r], *o = O + (size_t)(q0 + i) * ldq + (size_t)(h0 + hh) * hd;
        const float *os = Os + (size_t)r * hd;
        for (int c = 0; c < hd; c++) o[c] = os[c] * inv;
        L[2 * (q0 + i)] = m[r];
        L[2 * (q0 + i) + 1] = inv;
      }
    }
  }
}

void lt_cpu_attn_bwd_kv(lt_cpu_attn_dims_t d, int tile, int b, int kv, int qt0, int qt1, float *dq,
                        float *dk, float *dv, const float *dout, const float *q, const float *k,
                        const float *v, const float *out, const float *st, const int32_t *pos,
                        float *scratch) {
  int T = d.T, H = d.H, KV = d.KV, hd = d.hd, g = H / KV, ldq = H * hd, ldk = KV * hd, h0 = kv * g;
  float scale = 1.0f / sqrtf((float)hd);
  size_t koff = (size_t)b * T * ldk + (size_t)kv * hd, qoff = (size_t)b * T * ldq;
  const float *K = k + koff, *Vv = v + koff, *Q = q + qoff, *dO = dout + qoff, *O = out + qoff;
  float *dK = dk + koff, *dV = dv + koff, *dQ = dq + qoff;
  const int32_t *ps = pos + (size_t)b * T;
  size_t tt = (size_t)g * tile * tile, th = (size_t)g * tile * hd;
  float *P = scratch, *dP = P + tt, *Qs = dP + tt, *dOs = Qs + th, *dQs = dOs + th, *Dr = dQs + th;
  bool fast = tile == 64 && mm64_ok(hd);
  int klo = qt0 * tile < T ? qt0 * tile - ps[qt0 * tile] : 0, w = imin(qt1 * tile, T) - klo;
  float *kt = Dr + (size_t)g * tile, *vt = kt + (size_t)hd * (w > 0 ? w : 0); /* transposed (hd x w) */
  if (fast && w > 0) {
    transpose_rows(kt, K, ldk, hd, klo, klo + w);
    transpose_rows(vt, Vv, ldk, hd, klo, klo + w);
  }
  for (int q0 = qt0 * tile; q0 < imin(qt1 * tile, T); q0 += tile) {
    int nq = imin(tile, T - q0), M = g * nq;
    int kbeg = q0 - ps[q0];
    gather(Qs, Q, ldq, hd, g, h0, q0, nq);
    gather(dOs, dO, ldq, hd, g, h0, q0, nq);
    memset(dQs, 0, (size_t)M * hd * sizeof(float));
    for (int hh = 0; hh < g; hh++)
      for (int i = 0; i < nq; i++) {
        const float *o = O + (size_t)(q0 + i) * ldq + (size_t)(h0 + hh) * hd, *go = dOs + ((size_t)hh * nq + i) * hd;
        double sum = 0.0;
        for (int c = 0; c < hd; c++) sum += (double)go[c] * o[c];
        Dr[hh * nq + i] = (float)sum;
      }
    for (int k0 = kbeg; k0 < q0 + nq; k0 += tile) {
      int nk = imin(tile, q0 + nq - k0);
      /* P = exp((Q K^T - m) * scale) / l, 0 outside each row's window */
      tile_mm_nt(fast, M, nk, hd, Qs, hd, K + (size_t)k0 * ldk, ldk, kt + (k0 - klo), w, P, tile);
      for (int hh = 0; hh < g; hh++)
        bwd_p_tile(P + (size_t)hh * nq * tile, tile, nq, nk, ps, q0, k0, scale,
                   st + ((size_t)b * H + h0 + hh) * T * 2);
      /* dV += P^T dO */
      tile_mm(fast, true, nk, hd, M, 1.0f, P, tile, dOs, hd, dV + (size_t)k0 * ldk, ldk, true);
      /* dP = dO V^T ; dS = P * (dP - D) (scale folded into the two products below) */
      tile_mm_nt(fast, M, nk, hd, dOs, hd, Vv + (size_t)k0 * ldk, ldk, vt + (k0 - klo), w, dP, tile);
      bwd_ds_tile(dP, P, tile, M, nk, Dr);
      /* dQ += scale dS K ; dK += scale dS^T Q */
      tile_mm(fast, false, M, hd, nk, scale, dP, tile, K + (size_t)k0 * ldk, ldk, dQs, hd, true);
      tile_mm(fast, true, nk, hd, M, scale, dP, tile, Qs, hd, dK + (size_t)k0 * ldk, ldk, true);
    }
    for (int hh = 0; hh < g; hh++)
      for (int i = 0; i < nq; i++)
        memcpy(dQ + (size_t)(q0 + i) * ldq + (size_t)(h0 + hh) * hd, dQs + ((size_t)hh * nq + i) * hd,
               (size_t)hd * sizeof(float));
  }
}

/* ---- the full-square reference -------------------------------------------------------- */

/* Causal softmax in place on the T x T scores of one head: row t over its example's columns
 * t - pos[t] .. t (pos: the sequence's positions); every other entry = 0. */
static void causal_softmax(float *P, int T, float scale, const int32_t *pos) {
  for (int t = 0; t < T; t++) {
    float *row = P + (size_t)t * T;
    int j0 = t - pos[t];
    float mx = -INFINITY;
    for (int j = j0; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0;
    for (int j = j0; j <= t; j++) {
      row[j] = lt_fexp((row[j] - mx) * scale);
      sum += row[j];
    }
    float inv = 1.0f / sum;
    for (int j = 0; j < j0; j++) row[j] = 0.0f;
    for (int j = j0; j <= t; j++) row[j] *= inv;
    for (int j = t + 1; j < T; j++) row[j] = 0.0f;
  }
}

void lt_cpu_attn_ref_fwd(lt_cpu_attn_dims_t d, float *out, float *state, const float *q,
                         const float *k, const float *v, const int32_t *pos) {
  int T = d.T, H = d.H, KV = d.KV, hd = d.hd, g = H / KV;
  for (size_t bh = 0; bh < (size_t)d.B * H; bh++) {
    int b = (int)(bh / H), h = (int)(bh % H), kv = h / g;
    const float *Q = q + (size_t)b * T * H * hd + (size_t)h * hd;
    const float *K = k + (size_t)b * T * KV * hd + (size_t)kv * hd;
    const float *Vv = v + (size_t)b * T * KV * hd + (size_t)kv * hd;
    float *P = state + bh * (size_t)T * T;
    float *O = out + (size_t)b * T * H * hd + (size_t)h * hd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, Q, H * hd, K, KV * hd,
                0.0f, P, T);
    causal_softmax(P, T, 1.0f / sqrtf((float)hd), pos + (size_t)b * T);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, Vv, KV * hd,
                0.0f, O, H * hd);
  }
}

void lt_cpu_attn_ref_bwd(lt_cpu_attn_dims_t d, float *dq, float *dk, float *dv,
                         const float *dout, const float *q, const float *k, const float *v,
                         const float *state) {
  int T = d.T, H = d.H, KV = d.KV, hd = d.hd, g = H / KV;
  float scale = 1.0f / sqrtf((float)hd);
  float *dP = malloc((size_t)T * T * sizeof(float));
  assert(dP);
  for (size_t bk = 0; bk < (size_t)d.B * KV; bk++) {
    int b = (int)(bk / KV), kv = (int)(bk % KV);
    size_t koff = (size_t)b * T * KV * hd + (size_t)kv * hd;
    const float *K = k + koff, *Vv = v + koff;
    float *dK = dk + koff, *dV = dv + koff;
    for (int hh = 0; hh < g; hh++) {
      int h = kv * g + hh;
      size_t qoff = (size_t)b * T * H * hd + (size_t)h * hd;
      const float *Q = q + qoff, *dO = dout + qoff;
      const float *P = state + ((size_t)b * H + h) * (size_t)T * T;
      float *dQ = dq + qoff;
      float beta = hh == 0 ? 0.0f : 1.0f;
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, dO, H * hd,
                  beta, dV, KV * hd);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dO, H * hd, Vv,
                  KV * hd, 0.0f, dP, T);
      for (int t = 0; t < T; t++) {
        const float *pr = P + (size_t)t * T;
        float *dr = dP + (size_t)t * T;
        float s = 0;
        for (int j = 0; j <= t; j++) s += pr[j] * dr[j];
        for (int j = 0; j <= t; j++) dr[j] = pr[j] * (dr[j] - s) * scale;
        for (int j = t + 1; j < T; j++) dr[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, dP, T, K, KV * hd,
                  0.0f, dQ, H * hd);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, dP, T, Q, H * hd,
                  beta, dK, KV * hd);
    }
  }
  free(dP);
}
