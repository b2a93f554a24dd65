/* bench_attn: the cpu backend's training attention (attn_fwd + attn_bwd, tiled with an online
 * softmax, workers/engine/lt_cpu_attn.c) at row lengths T = 256 .. 4096 and a fixed number of
 * tokens per call (B = tokens / T rows), SmolLM2-135M's attention shape (9 query heads, 3 kv
 * heads, hd 64), against the full-square kernels it replaced (lt_cpu_attn_ref_*: T x T
 * probabilities, the whole square computed) in the same run. The tiled kernels run on the
 * backend's pool with --threads threads (2); so does the peer (OpenBLAS's threads inside its
 * large products). Each figure is the median of --reps calls after a warm-up.
 *
 * Usage: bench_attn [--threads N] [--tokens N] [--reps K] [--lengths T1,T2,...] [--no-peer]
 * (--no-peer: the tiled kernels alone, for a profiler)
 * Last line: `attn_tiled_vs_square_T2048: <square ms / tiled ms>` (at T = 2048). */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "lt_backend.h"
#include "lt_cpu_attn.h"

void openblas_set_num_threads(int num_threads);

typedef struct io {
  lt_cpu_attn_dims_t d;
  float *q, *k, *v, *dout, *out, *dq, *dk, *dv, *state;
  int32_t *pos;
} io_t;

static float *floats(size_t n) {
  float *p = malloc(n * sizeof(float));
  if (!p) {
    fprintf(stderr, "bench_attn: out of memory (%zu floats)\n", n);
    exit(1);
  }
  return p;
}

/* Random inputs; one example per row (plain causal attention, the costliest case). */
static void io_init(io_t *x, lt_cpu_attn_dims_t d, size_t state_floats) {
  size_t N = (size_t)d.B * d.T, nq = N * d.H * d.hd, nk = N * d.KV * d.hd;
  x->d = d;
  x->q = floats(nq), x->dout = floats(nq), x->out = floats(nq), x->dq = floats(nq);
  x->k = floats(nk), x->v = floats(nk), x->dk = floats(nk), x->dv = floats(nk);
  x->state = floats(state_floats);
  x->pos = malloc(N * sizeof(int32_t));
  if (!x->pos) exit(1);
  unsigned s = 7;
  for (size_t i = 0; i < nq; i++) x->q[i] = (float)rand_r(&s) / RAND_MAX - 0.5f, x->dout[i] = x->q[i] * 0.5f;
  for (size_t i = 0; i < nk; i++) x->k[i] = (float)rand_r(&s) / RAND_MAX - 0.5f, x->v[i] = x->k[i] * 0.5f;
  for (size_t i = 0; i < N; i++) x->pos[i] = (int32_t)(i % (size_t)d.T);
}

static void io_free(io_t *x) {
  free(x->q), free(x->dout), free(x->out), free(x->dq), free(x->k), free(x->v), free(x->dk), free(x->dv);
  free(x->state), free(x->pos);
}

static double median_ms(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[n / 2] * 1e3;
}

static double tiled_ms(lt_backend_t *be, lt_cpu_attn_dims_t d, int reps) {
  io_t x;
  io_init(&x, d, be->attn_state_floats(be, d.B, d.T, d.H));
  double t[32];
  for (int r = -1; r < reps; r++) {
    double t0 = bench_now_s();
    be->attn_fwd(be, x.out, x.state, x.q, x.k, x.v, x.pos, d.B, d.T, d.H, d.KV, d.hd);
    be->attn_bwd(be, x.dq, x.dk, x.dv, x.dout, x.q, x.k, x.v, x.out, x.state, x.pos, d.B, d.T, d.H, d.KV, d.hd);
    if (r >= 0) t[r] = bench_now_s() - t0;
  }
  io_free(&x);
  return median_ms(t, reps);
}

static double square_ms(lt_cpu_attn_dims_t d, int reps, int threads) {
  io_t x;
  io_init(&x, d, (size_t)d.B * d.H * d.T * d.T);
  openblas_set_num_threads(threads);
  double t[32];
  for (int r = -1; r < reps; r++) {
    double t0 = bench_now_s();
    lt_cpu_attn_ref_fwd(d, x.out, x.state, x.q, x.k, x.v, x.pos);
    lt_cpu_attn_ref_bwd(d, x.dq, x.dk, x.dv, x.dout, x.q, x.k, x.v, x.state);
    if (r >= 0) t[r] = bench_now_s() - t0;
  }
  openblas_set_num_threads(1);
  io_free(&x);
  return median_ms(t, reps);
}

int main(int argc, char **argv) {
  int threads = 2, tokens = 4096, reps = 3, lens[8] = {256, 1024, 2048, 4096}, nlen = 4, peer = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-peer")) peer = 0;
    else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) {
      nlen = 0;
      for (char *p = argv[++i], *e; *p && nlen < 8; p = *e ? e + 1 : e) lens[nlen++] = (int)strtol(p, &e, 10);
    } else {
      fprintf(stderr, "usage: %s [--threads N] [--tokens N] [--reps K] [--lengths T1,T2,...] [--no-peer]\n",
              argv[0]);
      return 2;
    }
  }
  if (reps < 1 || reps > 32 || threads < 1 || tokens < 1) return fprintf(stderr, "bench_attn: bad arguments\n"), 2;
  char err[512];
  lt_backend_t *be;
  if (lt_backend_cpu_new(threads, &be, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
  printf("attention fwd+bwd, H 9, KV 3, hd 64, %d tokens per call, %d threads, median of %d\n", tokens, threads,
         reps);
  double at2048 = 0;
  for (int i = 0; i < nlen; i++) {
    int T = lens[i], B = tokens / T > 0 ? tokens / T : 1;
    lt_cpu_attn_dims_t d = {.B = B, .T = T, .H = 9, .KV = 3, .hd = 64};
    double tiled = tiled_ms(be, d, reps);
    if (!peer) {
      printf("T %4d (%2d rows): tiled %8.1f ms (%.2f us/token)\n", T, B, tiled, tiled * 1e3 / (B * T));
      continue;
    }
    double square = square_ms(d, reps, threads);
    printf("T %4d (%2d rows): tiled %8.1f ms (%.2f us/token), full square %8.1f ms: %.2fx\n", T, B, tiled,
           tiled * 1e3 / (B * T), square, square / tiled);
    if (T == 2048) at2048 = square / tiled;
  }
  lt_backend_destroy(be);
  if (at2048 > 0) printf("attn_tiled_vs_square_T2048: %.2f\n", at2048);
  else printf("attn_tiled_vs_square_T2048: none (%s)\n", peer ? "2048 not among the lengths" : "--no-peer");
  return 0;
}
