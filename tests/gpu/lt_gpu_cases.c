/* lt_gpu_cases: each cuda kernel (through the backend vtable, in f32 mode unless the case says
 * bf16) against a plain C reference written here, with the tolerance it is held to. A case
 * returns LT_GPU_SKIP when no usable GPU is present (no device, no driver, "driver version is
 * insufficient"): that is reported as skipped, never as passed. */
#include "lt_gpu_cases.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "lt_backend_cuda.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static uint64_t lt_gt_rng = 0x1234567887654321ull;
static float lt_gt_rand(void) { /* uniform in [-1, 1) */
  lt_gt_rng ^= lt_gt_rng << 13;
  lt_gt_rng ^= lt_gt_rng >> 7;
  lt_gt_rng ^= lt_gt_rng << 17;
  return (float)((lt_gt_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}
static float *lt_gt_randv(size_t n, float scale) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = lt_gt_rand() * scale;
  return x;
}

/* Opens a backend; LT_GPU_SKIP (and prints "skipped: no GPU") when there is none. */
static int lt_gt_open(int bf16, lt_backend_t **be, char *msg, size_t n) {
  char err[512] = "";
  lt_cuda_opts_t o = {bf16, 0};
  lt_err_t e = lt_backend_cuda_new_opts(0, &o, be, err, sizeof err);
  if (e == LT_ERR_UNAVAILABLE) {
    printf("skipped: no GPU (%s)\n", err);
    snprintf(msg, n, "skipped: no GPU (%s)", err);
    return LT_GPU_SKIP;
  }
  if (e != LT_OK) {
    snprintf(msg, n, "backend: %s: %s", lt_err_name(e), err);
    return LT_GPU_FAIL;
  }
  return LT_GPU_PASS;
}

static void *lt_gt_up(lt_backend_t *be, const void *h, size_t bytes) {
  void *d = be->alloc(be, bytes);
  if (d && h) be->upload(be, d, h, bytes);
  return d;
}
static float *lt_gt_down(lt_backend_t *be, const void *d, size_t n) {
  float *h = malloc(n * sizeof *h);
  be->download(be, h, d, n * sizeof *h);
  return h;
}

/* max |a-b| / (atol + rtol*|b|) must be <= 1. */
static int lt_gt_close(const char *what, const float *got, const float *want, size_t n,
                       float atol, float rtol, char *msg, size_t msz) {
  for (size_t i = 0; i < n; i++) {
    float d = fabsf(got[i] - want[i]);
    if (!(d <= atol + rtol * fabsf(want[i]))) {
      snprintf(msg, msz, "%s[%zu]: got %.7g want %.7g (atol %g rtol %g)", what, i, got[i],
               want[i], atol, rtol);
      return 0;
    }
  }
  return 1;
}

static int lt_gt_end(lt_backend_t *be, int ok, char *msg, size_t n) {
  const char *le = be->last_error(be);
  if (ok && le && *le) {
    snprintf(msg, n, "backend error: %s", le);
    ok = 0;
  }
  lt_backend_destroy(be);
  if (ok) snprintf(msg, n, "ok");
  return ok ? LT_GPU_PASS : LT_GPU_FAIL;
}

static float lt_gt_bf16(float x) { /* round to nearest even, as __float2bfloat16_rn */
  uint32_t u;
  memcpy(&u, &x, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  memcpy(&x, &u, 4);
  return x;
}

/* Row-major reference matmul, same contract as lt_backend.h. */
static void lt_gt_ref_mm(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                         int lda, const float *B, int ldb, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double s = 0;
      for (int k = 0; k < K; k++)
        s += (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = (float)(alpha * s + (beta == 0.0f ? 0.0 : beta * C[i * ldc + j]));
    }
}

/* ---- cases -------------------------------------------------------------------------------- */

static int lt_gt_matmul(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int ok = 1, M = 37, N = 300, K = 70; /* N*K >= the bf16 shadow threshold when bf16 */
  for (int t = 0; t < 4 && ok; t++) {
    int ta = t & 1, tb = t >> 1;
    size_t na = (size_t)M * K, nb = (size_t)K * N * 4, nc = (size_t)M * N;
    float *A = lt_gt_randv(na, 1), *B = lt_gt_randv(nb, 1), *C = lt_gt_randv(nc, 1);
    int lda = ta ? M : K, ldb = tb ? K : N;
    float *dA = lt_gt_up(be, A, na * 4), *dC = lt_gt_up(be, C, nc * 4);
    /* B is a mapped weight (as the engine does): in bf16 mode it gets a bf16 shadow */
    const float *dB = be->map_const(be, B, nb);
    if (bf16) { /* the reference sees what the tensor cores see */
      for (size_t i = 0; i < na; i++) A[i] = lt_gt_bf16(A[i]);
      for (size_t i = 0; i < nb; i++) B[i] = lt_gt_bf16(B[i]);
    }
    be->matmul(be, ta, tb, M, N, K, 0.5f, dA, lda, dB, ldb, 0.25f, dC, N);
    lt_gt_ref_mm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, C, N);
    float *got = lt_gt_down(be, dC, nc);
    char what[64];
    snprintf(what, sizeof what, "matmul(ta=%d,tb=%d)", ta, tb);
    /* f32: cuBLAS FP32 vs a double-accumulated reference; bf16: same rounded inputs, f32 sums */
    ok = lt_gt_close(what, got, C, nc, 1e-4f, 1e-4f, msg, n);
    free(A), free(B), free(C), free(got);
    be->free(be, dA), be->free(be, dC), be->free_const(be, dB);
  }
  return ok;
}

static int lt_gt_rmsnorm(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int N = 9, D = 333;
  float eps = 1e-5f;
  float *x = lt_gt_randv((size_t)N * D, 2), *w = lt_gt_randv(D, 1), *dy = lt_gt_randv((size_t)N * D, 1);
  float *dx0 = lt_gt_randv((size_t)N * D, 1), *dw0 = lt_gt_randv(D, 1);
  float *y = malloc((size_t)N * D * 4), *rs = malloc(N * 4), *dx = malloc((size_t)N * D * 4), *dw = malloc(D * 4);
  memcpy(dx, dx0, (size_t)N * D * 4), memcpy(dw, dw0, D * 4);
  for (int i = 0; i < N; i++) {
    double ss = 0, dot = 0;
    for (int c = 0; c < D; c++) ss += (double)x[i * D + c] * x[i * D + c];
    rs[i] = (float)(1.0 / sqrt(ss / D + eps));
    for (int c = 0; c < D; c++) y[i * D + c] = x[i * D + c] * rs[i] * w[c];
    for (int c = 0; c < D; c++) dot += (double)dy[i * D + c] * w[c] * x[i * D + c];
    double k = dot * rs[i] * rs[i] * rs[i] / D;
    for (int c = 0; c < D; c++) {
      dx[i * D + c] += (float)(rs[i] * w[c] * dy[i * D + c] - x[i * D + c] * k);
      dw[c] += dy[i * D + c] * x[i * D + c] * rs[i];
    }
  }
  float *dX = lt_gt_up(be, x, (size_t)N * D * 4), *dW = lt_gt_up(be, w, D * 4);
  float *dY = lt_gt_up(be, NULL, (size_t)N * D * 4), *dR = lt_gt_up(be, NULL, N * 4);
  float *dDY = lt_gt_up(be, dy, (size_t)N * D * 4), *dDX = lt_gt_up(be, dx0, (size_t)N * D * 4);
  float *dDW = lt_gt_up(be, dw0, D * 4);
  be->rmsnorm_fwd(be, dY, dR, dX, dW, N, D, eps);
  be->rmsnorm_bwd(be, dDX, dDW, dDY, dX, dW, dR, N, D);
  float *gy = lt_gt_down(be, dY, (size_t)N * D), *gdx = lt_gt_down(be, dDX, (size_t)N * D);
  float *gdw = lt_gt_down(be, dDW, D);
  int ok = lt_gt_close("rmsnorm y", gy, y, (size_t)N * D, 1e-5f, 1e-4f, msg, n) &&
           lt_gt_close("rmsnorm dx", gdx, dx, (size_t)N * D, 1e-5f, 1e-4f, msg, n) &&
           lt_gt_close("rmsnorm dw", gdw, dw, D, 1e-4f, 1e-4f, msg, n);
  free(x), free(w), free(dy), free(dx0), free(dw0), free(y), free(rs), free(dx), free(dw);
  free(gy), free(gdx), free(gdw);
  return ok;
}

static int lt_gt_rope(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int N = 7, nh = 3, hd = 16, maxp = 32, half = hd / 2;
  float *x = lt_gt_randv((size_t)N * nh * hd, 1), *ct = malloc(maxp * half * 4), *st = malloc(maxp * half * 4);
  int32_t pos[7] = {0, 1, 2, 5, 31, 3, 17};
  for (int p = 0; p < maxp; p++)
    for (int j = 0; j < half; j++) {
      double a = p * pow(10000.0, -2.0 * j / hd);
      ct[p * half + j] = (float)cos(a), st[p * half + j] = (float)sin(a);
    }
  float *want = malloc((size_t)N * nh * hd * 4);
  for (int i = 0; i < N; i++)
    for (int h = 0; h < nh; h++)
      for (int j = 0; j < half; j++) {
        const float *xh = x + ((size_t)i * nh + h) * hd;
        float c = ct[pos[i] * half + j], s = st[pos[i] * half + j];
        want[((size_t)i * nh + h) * hd + j] = xh[j] * c - xh[j + half] * s;
        want[((size_t)i * nh + h) * hd + j + half] = xh[j + half] * c + xh[j] * s;
      }
  float *dX = lt_gt_up(be, x, (size_t)N * nh * hd * 4), *dC = lt_gt_up(be, ct, maxp * half * 4);
  float *dS = lt_gt_up(be, st, maxp * half * 4);
  int32_t *dP = lt_gt_up(be, pos, sizeof pos);
  be->rope(be, dX, dC, dS, dP, N, nh, hd, 0);
  float *g1 = lt_gt_down(be, dX, (size_t)N * nh * hd);
  be->rope(be, dX, dC, dS, dP, N, nh, hd, 1);
  float *g2 = lt_gt_down(be, dX, (size_t)N * nh * hd);
  int ok = lt_gt_close("rope", g1, want, (size_t)N * nh * hd, 1e-6f, 1e-5f, msg, n) &&
           lt_gt_close("rope inverse", g2, x, (size_t)N * nh * hd, 1e-6f, 1e-5f, msg, n);
  free(x), free(ct), free(st), free(want), free(g1), free(g2);
  return ok;
}

/* Reference causal GQA attention forward and backward in double; row i of a sequence attends
 * to rows i - pos[i] .. i (its example, when rows are packed). */
static void lt_gt_ref_attn(int B, int T, int H, int KV, int hd, const float *q, const float *k,
                           const float *v, const float *dout, const int32_t *pos, float *out,
                           float *dq, float *dk, float *dv) {
  int g = H / KV;
  double sc = 1.0 / sqrt((double)hd);
  double *P = malloc(sizeof(double) * T * T), *dP = malloc(sizeof(double) * T * T);
  memset(dk, 0, sizeof(float) * B * T * KV * hd);
  memset(dv, 0, sizeof(float) * B * T * KV * hd);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++) {
      int j = h / g;
#define Q(t, e) q[((size_t)(b * T + (t)) * H + h) * hd + (e)]
#define KK(t, e) k[((size_t)(b * T + (t)) * KV + j) * hd + (e)]
#define VV(t, e) v[((size_t)(b * T + (t)) * KV + j) * hd + (e)]
#define DO(t, e) dout[((size_t)(b * T + (t)) * H + h) * hd + (e)]
      for (int i = 0; i < T; i++) {
        int j0 = i - pos[b * T + i];
        double mx = -1e300, s = 0;
        for (int t = j0; t <= i; t++) {
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)Q(i, e) * KK(t, e);
          P[i * T + t] = d * sc;
          if (P[i * T + t] > mx) mx = P[i * T + t];
        }
        for (int t = j0; t <= i; t++) s += exp(P[i * T + t] - mx);
        for (int t = 0; t < T; t++) P[i * T + t] = t >= j0 && t <= i ? exp(P[i * T + t] - mx) / s : 0;
        for (int e = 0; e < hd; e++) {
          double o = 0;
          for (int t = 0; t <= i; t++) o += P[i * T + t] * VV(t, e);
          out[((size_t)(b * T + i) * H + h) * hd + e] = (float)o;
        }
      }
      for (int i = 0; i < T; i++) {
        double D = 0;
        for (int e = 0; e < hd; e++) D += (double)DO(i, e) * out[((size_t)(b * T + i) * H + h) * hd + e];
        for (int t = 0; t < T; t++) dP[i * T + t] = 0;
        for (int t = i - pos[b * T + i]; t <= i; t++) {
          double d = 0;
          for (int e = 0; e < hd; e++) d += (double)DO(i, e) * VV(t, e);
          dP[i * T + t] = P[i * T + t] * (d - D) * sc;
        }
      }
      for (int i = 0; i < T; i++)
        for (int e = 0; e < hd; e++) {
          double a = 0;
          for (int t = 0; t <= i; t++) a += dP[i * T + t] * KK(t, e);
          dq[((size_t)(b * T + i) * H + h) * hd + e] = (float)a;
        }
      for (int t = 0; t < T; t++)
        for (int e = 0; e < hd; e++) {
          double a = 0, c = 0;
          for (int i = t; i < T; i++) a += dP[i * T + t] * Q(i, e), c += P[i * T + t] * DO(i, e);
          dk[((size_t)(b * T + t) * KV + j) * hd + e] += (float)a;
          dv[((size_t)(b * T + t) * KV + j) * hd + e] += (float)c;
        }
#undef Q
#undef KK
#undef VV
#undef DO
    }
  free(P), free(dP);
}

static int lt_gt_attn(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int B = 2, T = 19, H = 4, KV = 2, hd = 16;
  size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
  float *q = lt_gt_randv(nq, 1), *k = lt_gt_randv(nk, 1), *v = lt_gt_randv(nk, 1), *dout = lt_gt_randv(nq, 1);
  if (bf16) {
    for (size_t i = 0; i < nq; i++) q[i] = lt_gt_bf16(q[i]), dout[i] = lt_gt_bf16(dout[i]);
    for (size_t i = 0; i < nk; i++) k[i] = lt_gt_bf16(k[i]), v[i] = lt_gt_bf16(v[i]);
  }
  float *out = malloc(nq * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4), *dv = malloc(nk * 4);
  /* Sequence 0 is one example; sequence 1 packs two (8 and 11 tokens), each attending only
   * within itself. */
  int32_t pos[2 * 19];
  for (int t = 0; t < T; t++) pos[t] = t, pos[T + t] = t < 8 ? t : t - 8;
  lt_gt_ref_attn(B, T, H, KV, hd, q, k, v, dout, pos, out, dq, dk, dv);
  int32_t *dpos = be->alloc(be, sizeof pos);
  be->upload(be, dpos, pos, sizeof pos);
  float *dQ = lt_gt_up(be, q, nq * 4), *dK = lt_gt_up(be, k, nk * 4), *dV = lt_gt_up(be, v, nk * 4);
  float *dDO = lt_gt_up(be, dout, nq * 4), *dO = lt_gt_up(be, NULL, nq * 4);
  float *dst = lt_gt_up(be, NULL, be->attn_state_floats(be, B, T, H) * 4);
  float *gq = lt_gt_up(be, NULL, nq * 4), *gk = lt_gt_up(be, NULL, nk * 4), *gv = lt_gt_up(be, NULL, nk * 4);
  be->attn_fwd(be, dO, dst, dQ, dK, dV, dpos, B, T, H, KV, hd);
  be->attn_bwd(be, gq, gk, gv, dDO, dQ, dK, dV, dO, dst, dpos, B, T, H, KV, hd);
  float *ho = lt_gt_down(be, dO, nq), *hq = lt_gt_down(be, gq, nq), *hk = lt_gt_down(be, gk, nk);
  float *hv = lt_gt_down(be, gv, nk);
  /* f32: FP32 GEMMs and softmax vs double. bf16: P and dS are rounded to bf16 between GEMMs. */
  float at = bf16 ? 2e-2f : 1e-4f, rt = bf16 ? 2e-2f : 1e-3f;
  int ok = lt_gt_close("attn out", ho, out, nq, at, rt, msg, n) &&
           lt_gt_close("attn dq", hq, dq, nq, at, rt, msg, n) &&
           lt_gt_close("attn dk", hk, dk, nk, at, rt, msg, n) &&
           lt_gt_close("attn dv", hv, dv, nk, at, rt, msg, n);
  free(q), free(k), free(v), free(dout), free(out), free(dq), free(dk), free(dv);
  free(ho), free(hq), free(hk), free(hv);
  return ok;
}

static int lt_gt_attn_cached(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int S = 2, max_t = 24, H = 4, KV = 2, hd = 32, g = H / KV, rows = 3;
  size_t ncache = (size_t)S * max_t * KV * hd;
  float *kc = lt_gt_randv(ncache, 1), *vc = lt_gt_randv(ncache, 1), *q = lt_gt_randv((size_t)rows * H * hd, 1);
  int32_t seq[3] = {0, 1, 1}, pos[3] = {23, 0, 11};
  float *want = malloc((size_t)rows * H * hd * 4);
  for (int i = 0; i < rows; i++)
    for (int h = 0; h < H; h++) {
      int j = h / g;
      double s[64], mx = -1e300, z = 0;
      for (int p = 0; p <= pos[i]; p++) {
        double d = 0;
        for (int e = 0; e < hd; e++)
          d += (double)q[((size_t)i * H + h) * hd + e] * kc[(((size_t)seq[i] * max_t + p) * KV + j) * hd + e];
        s[p] = d / sqrt((double)hd);
        if (s[p] > mx) mx = s[p];
      }
      for (int p = 0; p <= pos[i]; p++) z += exp(s[p] - mx);
      for (int e = 0; e < hd; e++) {
        double o = 0;
        for (int p = 0; p <= pos[i]; p++)
          o += exp(s[p] - mx) / z * vc[(((size_t)seq[i] * max_t + p) * KV + j) * hd + e];
        want[((size_t)i * H + h) * hd + e] = (float)o;
      }
    }
  float *dK = lt_gt_up(be, kc, ncache * 4), *dV = lt_gt_up(be, vc, ncache * 4);
  float *dQ = lt_gt_up(be, q, (size_t)rows * H * hd * 4), *dO = lt_gt_up(be, NULL, (size_t)rows * H * hd * 4);
  int32_t *dS = lt_gt_up(be, seq, sizeof seq), *dP = lt_gt_up(be, pos, sizeof pos);
  be->attn_cached(be, dO, dQ, dK, dV, dS, dP, rows, H, KV, hd, max_t);
  float *got = lt_gt_down(be, dO, (size_t)rows * H * hd);
  int ok = lt_gt_close("attn_cached", got, want, (size_t)rows * H * hd, 1e-5f, 1e-4f, msg, n);
  free(kc), free(vc), free(q), free(want), free(got);
  return ok;
}

/* The paged cache (serving): the cache above scattered over shuffled blocks of 4 positions by
 * kv_store_paged; attn_paged must give attn_cached's result bit for bit (same order of
 * positions), hence also the double reference's. */
static int lt_gt_attn_paged(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int S = 2, max_t = 24, H = 4, KV = 2, hd = 32, rows = 3, bt = 4, w = KV * hd;
  size_t ncache = (size_t)S * max_t * w, nq = (size_t)rows * H * hd;
  float *kc = lt_gt_randv(ncache, 1), *vc = lt_gt_randv(ncache, 1), *q = lt_gt_randv(nq, 1);
  int32_t seq[3] = {0, 1, 1}, pos[3] = {23, 0, 11};
  int32_t btab[12] = {11, 3, 7, 0, 5, 9, 1, 10, 2, 8, 4, 6}, off[3] = {0, 6, 6}, slot[48];
  for (int r = 0; r < S * max_t; r++)
    slot[r] = btab[(r / max_t) * 6 + (r % max_t) / bt] * bt + (r % max_t) % bt;
  float *dK = lt_gt_up(be, kc, ncache * 4), *dV = lt_gt_up(be, vc, ncache * 4);
  float *pK = lt_gt_up(be, NULL, ncache * 4), *pV = lt_gt_up(be, NULL, ncache * 4);
  float *dQ = lt_gt_up(be, q, nq * 4), *dO = lt_gt_up(be, NULL, nq * 4);
  float *dP2 = lt_gt_up(be, NULL, nq * 4);
  int32_t *dS = lt_gt_up(be, seq, sizeof seq), *dP = lt_gt_up(be, pos, sizeof pos);
  int32_t *dB = lt_gt_up(be, btab, sizeof btab), *dF = lt_gt_up(be, off, sizeof off);
  int32_t *dL = lt_gt_up(be, slot, sizeof slot);
  be->kv_store_paged(be, pK, dK, dL, S * max_t, w);
  be->kv_store_paged(be, pV, dV, dL, S * max_t, w);
  be->attn_cached(be, dO, dQ, dK, dV, dS, dP, rows, H, KV, hd, max_t);
  be->attn_paged(be, dP2, dQ, pK, pV, dB, dF, dP, rows, H, KV, hd, bt);
  float *want = lt_gt_down(be, dO, nq), *got = lt_gt_down(be, dP2, nq);
  int ok = 1;
  for (size_t i = 0; ok && i < nq; i++)
    if (memcmp(&got[i], &want[i], sizeof(float))) {
      snprintf(msg, n, "attn_paged %g differs from attn_cached %g at %zu", got[i], want[i], i);
      ok = 0;
    }
  free(kc), free(vc), free(q), free(want), free(got);
  return ok;
}

static int lt_gt_swiglu(lt_backend_t *be, int bf16, char *msg, size_t n) {
  size_t N = 1000;
  float *g = lt_gt_randv(N, 6), *u = lt_gt_randv(N, 2), *dh = lt_gt_randv(N, 1);
  float *h = malloc(N * 4), *dg = malloc(N * 4), *du = malloc(N * 4);
  for (size_t i = 0; i < N; i++) {
    double sg = 1.0 / (1.0 + exp(-g[i]));
    h[i] = (float)(g[i] * sg * u[i]);
    dg[i] = (float)(dh[i] * u[i] * sg * (1 + g[i] * (1 - sg)));
    du[i] = (float)(dh[i] * g[i] * sg);
  }
  float *dG = lt_gt_up(be, g, N * 4), *dU = lt_gt_up(be, u, N * 4), *dDH = lt_gt_up(be, dh, N * 4);
  float *dH = lt_gt_up(be, NULL, N * 4), *dDG = lt_gt_up(be, NULL, N * 4), *dDU = lt_gt_up(be, NULL, N * 4);
  be->swiglu_fwd(be, dH, dG, dU, N);
  be->swiglu_bwd(be, dDG, dDU, dDH, dG, dU, N);
  float *gh = lt_gt_down(be, dH, N), *gg = lt_gt_down(be, dDG, N), *gu = lt_gt_down(be, dDU, N);
  int ok = lt_gt_close("swiglu h", gh, h, N, 1e-6f, 1e-5f, msg, n) &&
           lt_gt_close("swiglu dg", gg, dg, N, 1e-6f, 1e-5f, msg, n) &&
           lt_gt_close("swiglu du", gu, du, N, 1e-6f, 1e-5f, msg, n);
  free(g), free(u), free(dh), free(h), free(dg), free(du), free(gh), free(gg), free(gu);
  return ok;
}

static int lt_gt_xent(lt_backend_t *be, int bf16, char *msg, size_t n) {
  int N = 6, V = 5003;
  float *lg = lt_gt_randv((size_t)N * V, 8), coef[6] = {1, 0, 0.5f, -2, 1, 0.25f};
  int32_t tg[6] = {0, 5002, 17, 4000, 3, 3};
  float *lp = malloc(N * 4), *lse = malloc(N * 4), *grad = malloc((size_t)N * V * 4);
  for (int i = 0; i < N; i++) {
    double mx = -1e300, s = 0;
    for (int j = 0; j < V; j++) mx = lg[i * V + j] > mx ? lg[i * V + j] : mx;
    for (int j = 0; j < V; j++) s += exp(lg[i * V + j] - mx);
    lse[i] = (float)(mx + log(s));
    lp[i] = lg[i * V + tg[i]] - lse[i];
    for (int j = 0; j < V; j++)
      grad[i * V + j] = (float)(coef[i] * ((j == tg[i]) - exp(lg[i * V + j] - mx) / s));
  }
  float *dL = lt_gt_up(be, lg, (size_t)N * V * 4), *dLP = lt_gt_up(be, NULL, N * 4);
  float *dLSE = lt_gt_up(be, NULL, N * 4), *dC = lt_gt_up(be, coef, sizeof coef);
  int32_t *dT = lt_gt_up(be, tg, sizeof tg);
  be->ce_fwd(be, dLP, dLSE, dL, dT, N, V);
  be->ce_bwd(be, dL, dLSE, dT, dC, N, V);
  float *glp = lt_gt_down(be, dLP, N), *glse = lt_gt_down(be, dLSE, N), *gg = lt_gt_down(be, dL, (size_t)N * V);
  int ok = lt_gt_close("ce lse", glse, lse, N, 1e-5f, 1e-6f, msg, n) &&
           lt_gt_close("ce logp", glp, lp, N, 1e-4f, 1e-5f, msg, n) &&
           lt_gt_close("ce grad", gg, grad, (size_t)N * V, 1e-6f, 1e-4f, msg, n);
  free(lg), free(lp), free(lse), free(grad), free(glp), free(glse), free(gg);
  return ok;
}

static int lt_gt_adamw(lt_backend_t *be, int bf16, char *msg, size_t n) {
  size_t N = 777;
  float *p = lt_gt_randv(N, 1), *g = lt_gt_randv(N, 1), *m = lt_gt_randv(N, 0.1f), *v = lt_gt_randv(N, 0.1f);
  for (size_t i = 0; i < N; i++) v[i] = fabsf(v[i]);
  float *dp = lt_gt_up(be, p, N * 4), *dg = lt_gt_up(be, g, N * 4), *dm = lt_gt_up(be, m, N * 4);
  float *dv = lt_gt_up(be, v, N * 4);
  float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.01f, gs = 0.5f;
  long step = 3;
  be->adamw(be, dp, dg, dm, dv, N, lr, b1, b2, eps, wd, gs, step);
  for (size_t i = 0; i < N; i++) {
    double gi = (double)g[i] * gs, pi = p[i] * (1 - (double)lr * wd);
    double mi = b1 * (double)m[i] + (1 - b1) * gi, vi = b2 * (double)v[i] + (1 - b2) * gi * gi;
    double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
    p[i] = (float)(pi - lr / bc1 * mi / (sqrt(vi) / sqrt(bc2) + eps));
    m[i] = (float)mi, v[i] = (float)vi;
  }
  float *gp = lt_gt_down(be, dp, N), *gm = lt_gt_down(be, dm, N), *gv = lt_gt_down(be, dv, N);
  int ok = lt_gt_close("adamw p", gp, p, N, 1e-6f, 1e-5f, msg, n) &&
           lt_gt_close("adamw m", gm, m, N, 1e-7f, 1e-5f, msg, n) &&
           lt_gt_close("adamw v", gv, v, N, 1e-8f, 1e-5f, msg, n);
  free(p), free(g), free(m), free(v), free(gp), free(gm), free(gv);
  return ok;
}

/* sumsq, embedding scatter with repeated tokens, bias gradient, dropout mask, and the scrub
 * that tenant isolation rests on. */
static int lt_gt_misc(lt_backend_t *be, int bf16, char *msg, size_t n) {
  size_t N = 100003;
  float *x = lt_gt_randv(N, 1);
  double want = 0;
  for (size_t i = 0; i < N; i++) want += (double)x[i] * x[i];
  float *dx = lt_gt_up(be, x, N * 4);
  double got = be->sumsq(be, dx, N), got2 = be->sumsq(be, dx, N);
  int ok = fabs(got - want) <= 1e-9 * want && got == got2;
  if (!ok) snprintf(msg, n, "sumsq: got %.17g (again %.17g) want %.17g", got, got2, want);
  int rows = 5, D = 7;
  int32_t tok[5] = {2, 0, 2, 2, 1};
  float *dout = lt_gt_randv((size_t)rows * D, 1), tab[3 * 7] = {0}, db[7] = {0};
  for (int i = 0; i < rows; i++)
    for (int c = 0; c < D; c++) tab[tok[i] * D + c] += dout[i * D + c], db[c] += dout[i * D + c];
  float *dT = lt_gt_up(be, NULL, sizeof tab), *dD = lt_gt_up(be, dout, (size_t)rows * D * 4);
  float *dB = lt_gt_up(be, NULL, sizeof db);
  int32_t *dTok = lt_gt_up(be, tok, sizeof tok);
  be->embed_bwd(be, dT, dD, dTok, rows, D);
  be->bias_bwd(be, dB, dD, rows, D);
  float *gt = lt_gt_down(be, dT, 21), *gb = lt_gt_down(be, dB, 7);
  ok = ok && lt_gt_close("embed_bwd", gt, tab, 21, 1e-6f, 1e-6f, msg, n) &&
       lt_gt_close("bias_bwd", gb, db, 7, 1e-6f, 1e-6f, msg, n);
  float *dd = lt_gt_up(be, NULL, N * 4);
  be->dropout(be, dd, dx, N, 0.3f, 42);
  float *gd = lt_gt_down(be, dd, N);
  for (size_t i = 0; ok && i < N; i++) {
    float w = lt_backend_dropout_keep(42, i, 0.3f) ? x[i] / 0.7f : 0.0f;
    if (fabsf(gd[i] - w) > 1e-6f * (1 + fabsf(w))) {
      snprintf(msg, n, "dropout[%zu]: got %g want %g", i, gd[i], w);
      ok = 0;
    }
  }
  be->scrub(be, dx, N * 4);
  float *gs = lt_gt_down(be, dx, N);
  for (size_t i = 0; ok && i < N; i++)
    if (gs[i] != 0.0f) {
      snprintf(msg, n, "scrub left %g at %zu", gs[i], i);
      ok = 0;
    }
  free(x), free(dout), free(gt), free(gb), free(gd), free(gs);
  return ok;
}

/* What a worker's heartbeat reports of each GPU (lt_cuda_devices): every device, named, with its
 * memory and a compute capability the kernels build for. */
static int lt_gt_devices(lt_backend_t *be, int bf16, char *msg, size_t n) {
  (void)be, (void)bf16;
  lt_cuda_device_t d[16];
  int count = 0, total = 0;
  if (lt_cuda_devices(d, 16, &count, msg, n) || lt_cuda_device_count(&total, msg, n)) return 0;
  if (count < 1 || count != total) {
    snprintf(msg, n, "listed %d GPUs, the runtime counts %d", count, total);
    return 0;
  }
  for (int i = 0; i < count && i < 16; i++)
    if (d[i].index != i || !d[i].name[0] || d[i].memory_bytes < ((uint64_t)1 << 30) || d[i].cc_major < 7) {
      snprintf(msg, n, "GPU %d: index %d, '%s', %llu bytes, cc %d.%d", i, d[i].index, d[i].name,
               (unsigned long long)d[i].memory_bytes, d[i].cc_major, d[i].cc_minor);
      return 0;
    }
  fprintf(stderr, "GPU 0: %s, %.1f GiB, cc %d.%d (%d listed)\n", d[0].name, (double)d[0].memory_bytes / (1 << 30),
          d[0].cc_major, d[0].cc_minor, count);
  return 1;
}

/* The NCCL communicator a data-parallel gang would average its gradients over, on one rank (a
 * machine with one GPU cannot hold two: NCCL refuses two ranks on one device): the id, the
 * join, the mean of one rank is the buffer itself, bit for bit. */
static int lt_gt_nccl(lt_backend_t *be, int bf16, char *msg, size_t n) {
  (void)bf16;
  uint8_t id[LT_CUDA_COMM_ID_BYTES];
  lt_cuda_comm_t *comm = NULL;
  if (lt_cuda_comm_id(id, msg, n) || lt_cuda_comm_new(be, id, 1, 0, &comm, msg, n)) return 0;
  size_t N = 4099;
  float *x = lt_gt_randv(N, 1), *d = lt_gt_up(be, x, N * 4);
  int ok = lt_cuda_comm_allreduce_mean(comm, d, N, msg, n) == LT_OK;
  float *g = lt_gt_down(be, d, N);
  ok = ok && lt_gt_close("allreduce_mean over one rank", g, x, N, 0.0f, 0.0f, msg, n);
  lt_cuda_comm_destroy(comm);
  free(x), free(g);
  return ok;
}

/* bf16 mode stores a large weight once, in bf16: mapping 2^26 floats takes about 2 bytes a
 * float of device memory, not 6 (f32 and bf16 copies); copy and download give its exact floats
 * (the caller's); the embedding reads its bf16 rows; marked grad_f32 (the LM head), its A W is
 * the f32 product and its A W^T still bf16; a norm kernel handed it refuses by name. */
static int lt_gt_bf16_once(lt_backend_t *be, int bf16, char *msg, size_t n) {
  (void)bf16;
  size_t V = 1 << 16, D = 1 << 10, N = V * D, f0, f1, total;
  float *W = lt_gt_randv(N, 1);
  const float *d0 = be->map_const(be, W, N); /* the first mapping also grows the cast scratch */
  if (!d0 || cudaMemGetInfo(&f0, &total) != cudaSuccess) return snprintf(msg, n, "map_const: %s", be->last_error(be)), 0;
  const float *dW = be->map_const(be, W, N);
  if (!dW || cudaMemGetInfo(&f1, &total) != cudaSuccess) return snprintf(msg, n, "map_const: %s", be->last_error(be)), 0;
  double per = (double)(f0 - f1) / N;
  int ok = per > 1.9 && per < 2.6;
  if (!ok) snprintf(msg, n, "mapping took %.2f bytes a float of device memory (bf16 alone: 2)", per);
  float *back = malloc(4096 * 4), *dc = be->alloc(be, 4096 * 4), *de = be->alloc(be, 3 * D * 4);
  ok = ok && be->download(be, back, dW + 5, 4096 * 4) == LT_OK && !memcmp(back, W + 5, 4096 * 4);
  if (ok) {
    be->copy(be, dc, dW + 7, 4096);
    float *g = lt_gt_down(be, dc, 4096);
    ok = lt_gt_close("copy from a bf16-only weight", g, W + 7, 4096, 0.0f, 0.0f, msg, n);
    free(g);
  } else if (!msg[0]) {
    snprintf(msg, n, "download of a bf16-only weight: not its floats");
  }
  int32_t tok[3] = {3, 65535, 3};
  int32_t *dt = lt_gt_up(be, tok, sizeof tok);
  if (ok) {
    be->embed_fwd(be, de, dW, dt, 3, (int)D);
    float *g = lt_gt_down(be, de, 3 * D), *want = malloc(3 * D * 4);
    for (int r = 0; r < 3; r++)
      for (size_t c = 0; c < D; c++) want[r * D + c] = lt_gt_bf16(W[(size_t)tok[r] * D + c]);
    ok = lt_gt_close("embedding rows of a bf16-only table", g, want, 3 * D, 0.0f, 0.0f, msg, n);
    free(g), free(want);
  }
  if (ok) { /* grad_f32: 2 rows times W (V x D) in f32; 2 rows times W^T still in bf16 */
    int M = 2;
    float *A = lt_gt_randv((size_t)M * V, 1), *R = malloc((size_t)M * D * 4);
    float *dA = lt_gt_up(be, A, (size_t)M * V * 4), *dC = be->alloc(be, (size_t)M * V * 4);
    be->grad_f32(be, dW);
    be->matmul(be, 0, 0, M, (int)D, (int)V, 1.0f, dA, (int)V, dW, (int)D, 0.0f, dC, (int)D);
    lt_gt_ref_mm(0, 0, M, (int)D, (int)V, 1.0f, A, (int)V, W, (int)D, 0.0f, R, (int)D);
    float *g = lt_gt_down(be, dC, (size_t)M * D);
    ok = lt_gt_close("A W of a grad_f32 weight (f32)", g, R, (size_t)M * D, 2e-3f, 1e-4f, msg, n);
    free(g);
    if (ok) { /* A W^T: 2 rows of D times W^T (D x V): bf16, so not within the f32 tolerance */
      be->matmul(be, 0, 1, M, (int)V, (int)D, 1.0f, dA, (int)D, dW, (int)D, 0.0f, dC, (int)V);
      float *R2 = malloc((size_t)M * V * 4);
      lt_gt_ref_mm(0, 1, M, (int)V, (int)D, 1.0f, A, (int)D, W, (int)D, 0.0f, R2, (int)V);
      g = lt_gt_down(be, dC, (size_t)M * V);
      char tmp[256];
      ok = !lt_gt_close("A W^T", g, R2, (size_t)M * V, 1e-5f, 1e-5f, tmp, sizeof tmp) &&
           lt_gt_close("A W^T of a grad_f32 weight (bf16)", g, R2, (size_t)M * V, 0.5f, 3e-2f, msg, n);
      if (!ok && !msg[0]) snprintf(msg, n, "A W^T of a grad_f32 weight matched f32 to 1e-5: not the bf16 path");
      free(g), free(R2);
    }
    be->free(be, dA), be->free(be, dC);
    free(A), free(R);
  }
  be->free(be, dc), be->free(be, de), be->free(be, dt), be->free_const(be, dW), be->free_const(be, d0);
  if (ok) { /* a kernel that reads floats is refused, naming itself (on a backend of its own:
             * the refusal fails it for good) */
    lt_backend_t *b2 = NULL;
    lt_cuda_opts_t o = {1, 1024};
    char err[256];
    if (lt_backend_cuda_new_opts(0, &o, &b2, err, sizeof err)) return snprintf(msg, n, "second backend: %s", err), 0;
    const float *d2 = b2->map_const(b2, W, 4096);
    float *x = b2->alloc(b2, 4096 * 4), *r = b2->alloc(b2, 4 * 4);
    b2->rmsnorm_fwd(b2, x, r, x, d2, 4, 1024, 1e-5f);
    ok = strstr(b2->last_error(b2), "rmsnorm") != NULL;
    if (!ok) snprintf(msg, n, "rmsnorm over a bf16-only weight was not refused: '%s'", b2->last_error(b2));
    lt_backend_destroy(b2);
  }
  free(W), free(back);
  return ok;
}

const lt_gpu_case_t lt_gpu_cases[] = {
    {"matmul_f32", 0, lt_gt_matmul},
    {"matmul_bf16", 1, lt_gt_matmul},
    {"rmsnorm", 0, lt_gt_rmsnorm},
    {"rope", 0, lt_gt_rope},
    {"attention_f32", 0, lt_gt_attn},
    {"attention_bf16", 1, lt_gt_attn},
    {"attention_cached", 0, lt_gt_attn_cached},
    {"attention_paged", 0, lt_gt_attn_paged},
    {"swiglu", 0, lt_gt_swiglu},
    {"cross_entropy", 0, lt_gt_xent},
    {"adamw", 0, lt_gt_adamw},
    {"misc_sumsq_embed_bias_dropout_scrub", 0, lt_gt_misc},
    {"devices_as_a_heartbeat_reports_them", 0, lt_gt_devices},
    {"nccl_one_rank_allreduce", 0, lt_gt_nccl},
    {"bf16_weights_stored_once", 1, lt_gt_bf16_once},
    {NULL, 0, NULL},
};

int lt_gpu_case_run(const lt_gpu_case_t *c, char *msg, size_t n) {
  lt_backend_t *be;
  int r = lt_gt_open(c->bf16, &be, msg, n);
  if (r) return r;
  return lt_gt_end(be, c->check(be, c->bf16, msg, n), msg, n);
}
