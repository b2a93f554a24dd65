/* bench_gpu: tokens/s and MFU of LoRA training on the cuda backend for a 1B-class Llama layer
 * stack (defaults: D=2048, 16 layers, 32 heads, 8 kv heads, FFN 8192, B=4 x T=2048, LoRA rank 16
 * on all seven linear maps), forward + backward, bf16 weights with f32 accumulation.
 *
 * Useful FLOPs per token per layer: frozen linear maps 2P forward + 2P backward (input gradient
 * only; LoRA has no base weight gradient), LoRA 6r(in+out), causal attention 2THhd forward and
 * 4THhd backward. The recomputed scores of the backward pass and the masked half of the
 * attention GEMMs are not counted. MFU = useful FLOP/s / the card's dense bf16 peak
 * (LATHE_PEAK_TFLOPS overrides the table). Last line: `gpu_lora_mfu: <percent>`.
 *   bench_gpu [layers D H KV FFN B T rank iters] */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_backend_cuda.h"
#include "lt_gpu_peak.h"

static int L = 16, D = 2048, H = 32, KV = 8, F = 8192, B = 4, T = 2048, R = 16, ITERS = 5;
static lt_backend_t *be;

static float *dalloc(size_t n) {
  float *p = be->alloc(be, n * 4);
  if (!p) {
    fprintf(stderr, "bench_gpu: alloc of %zu floats failed: %s\n", n, be->last_error(be));
    exit(1);
  }
  return p;
}

/* A random host tensor mapped as a frozen weight (bf16 shadow). */
static const float *weight(size_t n, float scale, float *host) {
  for (size_t i = 0; i < n; i++) host[i] = ((float)rand() / RAND_MAX * 2 - 1) * scale;
  const float *p = be->map_const(be, host, n);
  if (!p) {
    fprintf(stderr, "bench_gpu: map_const failed: %s\n", be->last_error(be));
    exit(1);
  }
  return p;
}

typedef struct {
  const float *W;   /* (out, in) frozen */
  float *A, *Bm;    /* LoRA (r, in), (out, r) */
  float *dA, *dB;
  int in, out;
} lin_t;

typedef struct {
  lin_t q, k, v, o, g, u, d;
  const float *n1, *n2;
  /* saved activations, (N, .) */
  float *h_in, *xn, *r1, *qa, *ka, *va, *att, *lse, *h_mid, *xn2, *r2, *ga, *ua, *act;
  float *uq, *uk, *uv, *uo, *ug, *uu, *ud; /* LoRA x A^T, (N, r) */
} layer_t;

static const float LORA_S = 2.0f;

static void lin_fwd(lin_t *l, const float *x, float *y, float beta, float *u, int N) {
  be->matmul(be, 0, 1, N, l->out, l->in, 1.0f, x, l->in, l->W, l->in, beta, y, l->out);
  be->matmul(be, 0, 1, N, R, l->in, 1.0f, x, l->in, l->A, l->in, 0.0f, u, R);
  be->matmul(be, 0, 1, N, l->out, R, LORA_S, u, R, l->Bm, R, 1.0f, y, l->out);
}

static void lin_bwd(lin_t *l, const float *dy, const float *x, const float *u, float *dx,
                    float beta, float *du, int N) {
  be->matmul(be, 1, 0, l->out, R, N, LORA_S, dy, l->out, u, R, 1.0f, l->dB, R);
  be->matmul(be, 0, 0, N, R, l->out, LORA_S, dy, l->out, l->Bm, R, 0.0f, du, R);
  be->matmul(be, 1, 0, R, l->in, N, 1.0f, du, R, x, l->in, 1.0f, l->dA, l->in);
  be->matmul(be, 0, 0, N, l->in, l->out, 1.0f, dy, l->out, l->W, l->in, beta, dx, l->in);
  be->matmul(be, 0, 0, N, l->in, R, 1.0f, du, R, l->A, l->in, 1.0f, dx, l->in);
}

static void lin_init(lin_t *l, int in, int out, float *host) {
  l->in = in, l->out = out;
  l->W = weight((size_t)out * in, 0.02f, host);
  l->A = dalloc((size_t)R * in), l->Bm = dalloc((size_t)out * R);
  l->dA = dalloc((size_t)R * in), l->dB = dalloc((size_t)out * R);
  for (size_t i = 0; i < (size_t)R * in; i++) host[i] = ((float)rand() / RAND_MAX * 2 - 1) * 0.01f;
  be->upload(be, l->A, host, (size_t)R * in * 4);
  for (size_t i = 0; i < (size_t)out * R; i++) host[i] = ((float)rand() / RAND_MAX * 2 - 1) * 0.01f;
  be->upload(be, l->Bm, host, (size_t)out * R * 4);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  int *args[] = {&L, &D, &H, &KV, &F, &B, &T, &R, &ITERS};
  for (int i = 1; i < argc && i <= 9; i++) *args[i - 1] = atoi(argv[i]);
  int hd = D / H, N = B * T, Dk = KV * hd;
  char err[512];
  lt_cuda_opts_t o = {1, 0};
  lt_err_t e = lt_backend_cuda_new_opts(0, &o, &be, err, sizeof err);
  if (e) {
    printf("bench_gpu: no cuda backend: %s\n", err);
    return e == LT_ERR_UNAVAILABLE ? 0 : 1;
  }
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  cudaGetDeviceProperties(&prop, 0);
  double peak = lt_gpu_nominal_peak_tflops(prop.name) * 1e12;
  printf("device: %s (%d SMs), peak bf16 dense %.1f TFLOP/s\n", prop.name,
         prop.multiProcessorCount, peak / 1e12);
  printf("shape: layers=%d D=%d H=%d KV=%d hd=%d FFN=%d B=%d T=%d lora_r=%d\n", L, D, H, KV, hd,
         F, B, T, R);

  size_t hmax = (size_t)F * D > (size_t)N * D ? (size_t)F * D : (size_t)N * D;
  float *host = malloc(hmax * 4);
  layer_t *ly = calloc(L, sizeof *ly);
  for (int i = 0; i < L; i++) {
    layer_t *y = &ly[i];
    lin_init(&y->q, D, D, host), lin_init(&y->k, D, Dk, host), lin_init(&y->v, D, Dk, host);
    lin_init(&y->o, D, D, host), lin_init(&y->g, D, F, host), lin_init(&y->u, D, F, host);
    lin_init(&y->d, F, D, host);
    for (int c = 0; c < D; c++) host[c] = 1.0f;
    y->n1 = be->map_const(be, host, D), y->n2 = be->map_const(be, host, D);
    y->h_in = dalloc((size_t)N * D), y->xn = dalloc((size_t)N * D), y->r1 = dalloc(N);
    y->qa = dalloc((size_t)N * D), y->ka = dalloc((size_t)N * Dk), y->va = dalloc((size_t)N * Dk);
    y->att = dalloc((size_t)N * D), y->lse = dalloc(be->attn_state_floats(be, B, T, H));
    y->h_mid = dalloc((size_t)N * D), y->xn2 = dalloc((size_t)N * D), y->r2 = dalloc(N);
    y->ga = dalloc((size_t)N * F), y->ua = dalloc((size_t)N * F), y->act = dalloc((size_t)N * F);
    y->uq = dalloc((size_t)N * R), y->uk = dalloc((size_t)N * R), y->uv = dalloc((size_t)N * R);
    y->uo = dalloc((size_t)N * R), y->ug = dalloc((size_t)N * R), y->uu = dalloc((size_t)N * R);
    y->ud = dalloc((size_t)N * R);
  }
  /* rope tables and positions */
  int half = hd / 2;
  float *ct = malloc((size_t)T * half * 4), *st = malloc((size_t)T * half * 4);
  for (int p = 0; p < T; p++)
    for (int j = 0; j < half; j++) {
      double a = p * pow(500000.0, -2.0 * j / hd);
      ct[p * half + j] = (float)cos(a), st[p * half + j] = (float)sin(a);
    }
  float *dct = dalloc((size_t)T * half), *dst = dalloc((size_t)T * half);
  be->upload(be, dct, ct, (size_t)T * half * 4), be->upload(be, dst, st, (size_t)T * half * 4);
  int32_t *pos = malloc(N * 4);
  for (int i = 0; i < N; i++) pos[i] = i % T;
  int32_t *dpos = be->alloc(be, N * 4);
  be->upload(be, dpos, pos, N * 4);
  float *h = dalloc((size_t)N * D), *dh = dalloc((size_t)N * D), *dx = dalloc((size_t)N * D);
  float *gq = dalloc((size_t)N * D), *gk = dalloc((size_t)N * Dk), *gv = dalloc((size_t)N * Dk);
  float *gatt = dalloc((size_t)N * D), *gg = dalloc((size_t)N * F), *gu = dalloc((size_t)N * F);
  float *gact = dalloc((size_t)N * F), *du = dalloc((size_t)N * R);
  for (size_t i = 0; i < (size_t)N * D; i++) host[i] = ((float)rand() / RAND_MAX * 2 - 1);
  float one = 1.0f;
  (void)one;

  double best = 1e30;
  for (int it = 0; it < ITERS + 1; it++) {
    be->upload(be, h, host, (size_t)N * D * 4);
    double t0 = now();
    for (int i = 0; i < L; i++) { /* forward */
      layer_t *y = &ly[i];
      be->copy(be, y->h_in, h, (size_t)N * D);
      be->rmsnorm_fwd(be, y->xn, y->r1, h, y->n1, N, D, 1e-5f);
      lin_fwd(&y->q, y->xn, y->qa, 0, y->uq, N);
      lin_fwd(&y->k, y->xn, y->ka, 0, y->uk, N);
      lin_fwd(&y->v, y->xn, y->va, 0, y->uv, N);
      be->rope(be, y->qa, dct, dst, dpos, N, H, hd, 0);
      be->rope(be, y->ka, dct, dst, dpos, N, KV, hd, 0);
      be->attn_fwd(be, y->att, y->lse, y->qa, y->ka, y->va, dpos, B, T, H, KV, hd);
      lin_fwd(&y->o, y->att, h, 1.0f, y->uo, N); /* residual: h += o W^T */
      be->copy(be, y->h_mid, h, (size_t)N * D);
      be->rmsnorm_fwd(be, y->xn2, y->r2, h, y->n2, N, D, 1e-5f);
      lin_fwd(&y->g, y->xn2, y->ga, 0, y->ug, N);
      lin_fwd(&y->u, y->xn2, y->ua, 0, y->uu, N);
      be->swiglu_fwd(be, y->act, y->ga, y->ua, (size_t)N * F);
      lin_fwd(&y->d, y->act, h, 1.0f, y->ud, N);
    }
    be->copy(be, dh, h, (size_t)N * D); /* stand-in for the head's gradient */
    be->scale(be, dh, 1e-3f, (size_t)N * D);
    for (int i = L - 1; i >= 0; i--) { /* backward */
      layer_t *y = &ly[i];
      lin_bwd(&y->d, dh, y->act, y->ud, gact, 0, du, N);
      be->swiglu_bwd(be, gg, gu, gact, y->ga, y->ua, (size_t)N * F);
      lin_bwd(&y->g, gg, y->xn2, y->ug, dx, 0, du, N);
      lin_bwd(&y->u, gu, y->xn2, y->uu, dx, 1.0f, du, N);
      be->rmsnorm_bwd(be, dh, NULL, dx, y->h_mid, y->n2, y->r2, N, D);
      lin_bwd(&y->o, dh, y->att, y->uo, gatt, 0, du, N);
      be->attn_bwd(be, gq, gk, gv, gatt, y->qa, y->ka, y->va, y->att, y->lse, dpos, B, T, H, KV, hd);
      be->rope(be, gq, dct, dst, dpos, N, H, hd, 1);
      be->rope(be, gk, dct, dst, dpos, N, KV, hd, 1);
      lin_bwd(&y->q, gq, y->xn, y->uq, dx, 0, du, N);
      lin_bwd(&y->k, gk, y->xn, y->uk, dx, 1.0f, du, N);
      lin_bwd(&y->v, gv, y->xn, y->uv, dx, 1.0f, du, N);
      be->rmsnorm_bwd(be, dh, NULL, dx, y->h_in, y->n1, y->r1, N, D);
    }
    double s = be->sumsq(be, dh, (size_t)N * D); /* waits for the stream */
    double dt = now() - t0;
    const char *le = be->last_error(be);
    if (le && *le) {
      printf("bench_gpu: backend error: %s\n", le);
      return 1;
    }
    printf("iter %d: %.2f ms%s (|dh|^2 = %.4g)\n", it, dt * 1e3, it == 0 ? " (warm-up)" : "", s);
    fflush(stdout);
    if (it > 0 && dt < best) best = dt;
  }
  double P = (double)D * D * 2 + 2.0 * D * Dk + 3.0 * D * F;
  double lora = 6.0 * R * ((D + D) * 2 + (D + Dk) * 2 + (D + F) * 3);
  double attn = 6.0 * T * H * hd;
  double flops = (double)N * L * (4 * P + lora + attn);
  double tps = N / best, mfu = flops / best / peak * 100;
  printf("best step: %.2f ms, %.0f tokens/s, %.1f TFLOP/s useful\n", best * 1e3, tps,
         flops / best / 1e12);
  printf("gpu_lora_tokens_per_s: %.0f\n", tps);
  printf("gpu_lora_mfu: %.1f\n", mfu);
  lt_backend_destroy(be);
  free(host), free(ly), free(ct), free(st), free(pos);
  return 0;
}
