/* Tests of the cpu backend's tiled training attention (workers/engine/lt_cpu_attn.c behind
 * attn_fwd / attn_bwd of lt_backend_cpu): against the full-square implementation it replaced
 * (lt_cpu_attn_ref_*) on packed rows, GQA, B > 1 and lengths that are not a multiple of the
 * tile; its state size (linear in T); bitwise determinism over runs and thread counts; and
 * masking (a key outside a row's window changes nothing for that row). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lt_backend.h"
#include "lt_cpu_attn.h"

static char errbuf[512];

/* Inputs and outputs of one attention call of dims d. */
typedef struct io {
  lt_cpu_attn_dims_t d;
  size_t nq, nk; /* floats of q (and out, dout, dq) and of k (v, dk, dv) */
  float *q, *k, *v, *dout;
  int32_t *pos;
  float *out, *state, *dq, *dk, *dv;
} io_t;

static float urand(unsigned *s) { return (float)rand_r(s) / (float)RAND_MAX * 2.0f - 1.0f; }

/* Random q, k, v, dout; pos packs examples of 1 .. max_ex tokens into each row (max_ex >= T:
 * one example per row, plain causal attention). */
static void io_init(io_t *x, lt_cpu_attn_dims_t d, int max_ex, unsigned seed) {
  memset(x, 0, sizeof *x);
  x->d = d;
  size_t N = (size_t)d.B * d.T;
  x->nq = N * d.H * d.hd;
  x->nk = N * d.KV * d.hd;
  x->q = malloc(x->nq * sizeof(float));
  x->dout = malloc(x->nq * sizeof(float));
  x->k = malloc(x->nk * sizeof(float));
  x->v = malloc(x->nk * sizeof(float));
  x->pos = malloc(N * sizeof(int32_t));
  cr_assert(x->q && x->dout && x->k && x->v && x->pos);
  unsigned s = seed;
  for (size_t i = 0; i < x->nq; i++) x->q[i] = 2.0f * urand(&s), x->dout[i] = urand(&s);
  for (size_t i = 0; i < x->nk; i++) x->k[i] = 2.0f * urand(&s), x->v[i] = urand(&s);
  for (int b = 0; b < d.B; b++) {
    int left = 0, p = 0;
    for (int t = 0; t < d.T; t++) {
      if (left == 0) left = 1 + rand_r(&s) % max_ex, p = 0;
      x->pos[(size_t)b * d.T + t] = p++;
      left--;
    }
  }
}

static void io_outputs(io_t *x, size_t state_floats) {
  x->out = calloc(x->nq, sizeof(float));
  x->dq = calloc(x->nq, sizeof(float));
  x->dk = calloc(x->nk, sizeof(float));
  x->dv = calloc(x->nk, sizeof(float));
  x->state = calloc(state_floats ? state_floats : 1, sizeof(float));
  cr_assert(x->out && x->dq && x->dk && x->dv && x->state);
}

static void io_free(io_t *x) {
  free(x->q), free(x->k), free(x->v), free(x->dout), free(x->pos);
  free(x->out), free(x->state), free(x->dq), free(x->dk), free(x->dv);
}

/* Forward and backward on the cpu backend with `threads` threads, into x's outputs. */
static void run_backend(io_t *x, int threads) {
  lt_backend_t *be;
  cr_assert_eq(lt_backend_cpu_new(threads, &be, errbuf, sizeof errbuf), LT_OK, "%s", errbuf);
  lt_cpu_attn_dims_t d = x->d;
  size_t st = be->attn_state_floats(be, d.B, d.T, d.H);
  if (!x->out) io_outputs(x, st);
  be->attn_fwd(be, x->out, x->state, x->q, x->k, x->v, x->pos, d.B, d.T, d.H, d.KV, d.hd);
  be->attn_bwd(be, x->dq, x->dk, x->dv, x->dout, x->q, x->k, x->v, x->out, x->state, x->pos,
               d.B, d.T, d.H, d.KV, d.hd);
  lt_backend_destroy(be);
}

static void run_ref(io_t *x) {
  lt_cpu_attn_dims_t d = x->d;
  io_outputs(x, (size_t)d.B * d.H * d.T * d.T);
  lt_cpu_attn_ref_fwd(d, x->out, x->state, x->q, x->k, x->v, x->pos);
  lt_cpu_attn_ref_bwd(d, x->dq, x->dk, x->dv, x->dout, x->q, x->k, x->v, x->state);
}

/* max |a - b| / max(1, max |b|) */
static double rel_diff(const float *a, const float *b, size_t n) {
  double mx = 1.0, diff = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]);
    cr_assert(isfinite(a[i]), "element %zu is %f", i, (double)a[i]);
    diff = e > diff ? e : diff;
    mx = fabs(b[i]) > mx ? fabs(b[i]) : mx;
  }
  return diff / mx;
}

/* The tiled kernels against the full-square ones: out, dq, dk, dv within tol relative to the
 * largest magnitude of each tensor (float32 sums in another order: a few ulps per term). */
static void parity(lt_cpu_attn_dims_t d, int max_ex, unsigned seed, double tol) {
  io_t x, r;
  io_init(&x, d, max_ex, seed);
  io_init(&r, d, max_ex, seed);
  run_backend(&x, 2);
  run_ref(&r);
  double e[4] = {rel_diff(x.out, r.out, x.nq), rel_diff(x.dq, r.dq, x.nq),
                 rel_diff(x.dk, r.dk, x.nk), rel_diff(x.dv, r.dv, x.nk)};
  const char *name[4] = {"out", "dq", "dk", "dv"};
  cr_log_info("B %d T %d H %d KV %d hd %d: out %.2g dq %.2g dk %.2g dv %.2g", d.B, d.T, d.H, d.KV,
              d.hd, e[0], e[1], e[2], e[3]);
  for (int i = 0; i < 4; i++)
    cr_assert(e[i] <= tol, "B %d T %d H %d KV %d hd %d: %s differs by %g (tolerance %g)", d.B,
              d.T, d.H, d.KV, d.hd, name[i], e[i], tol);
  io_free(&x);
  io_free(&r);
}

#define TOL 1e-5

Test(cpu_attn, matches_full_square_on_packed_rows_with_gqa_and_ragged_tiles) {
  parity((lt_cpu_attn_dims_t){.B = 2, .T = 100, .H = 6, .KV = 2, .hd = 16}, 23, 1, TOL);
  parity((lt_cpu_attn_dims_t){.B = 3, .T = 257, .H = 6, .KV = 2, .hd = 64}, 90, 2, TOL);
  parity((lt_cpu_attn_dims_t){.B = 2, .T = 64, .H = 3, .KV = 1, .hd = 64}, 64, 3, TOL);
  parity((lt_cpu_attn_dims_t){.B = 1, .T = 1, .H = 3, .KV = 3, .hd = 8}, 1, 4, TOL);
  /* one long row: the backward pass runs 11 ranges of query tiles and adds their dk, dv */
  parity((lt_cpu_attn_dims_t){.B = 1, .T = 700, .H = 3, .KV = 1, .hd = 16}, 200, 6, TOL);
  /* examples of one token: every row attends only to itself */
  parity((lt_cpu_attn_dims_t){.B = 2, .T = 70, .H = 3, .KV = 1, .hd = 32}, 1, 5, TOL);
}

Test(cpu_attn, matches_full_square_at_1024_plain_and_packed, .timeout = 300) {
  parity((lt_cpu_attn_dims_t){.B = 2, .T = 1024, .H = 3, .KV = 1, .hd = 64}, 1024, 6, TOL);
  parity((lt_cpu_attn_dims_t){.B = 1, .T = 1000, .H = 6, .KV = 2, .hd = 64}, 300, 7, TOL);
}

Test(cpu_attn, matches_full_square_at_4096, .timeout = 600) {
  parity((lt_cpu_attn_dims_t){.B = 1, .T = 4096, .H = 3, .KV = 1, .hd = 64}, 2500, 8, TOL);
}

/* Two floats (the softmax max and 1/sum) per row and head, never T x T. */
Test(cpu_attn, state_is_two_floats_per_row_and_head) {
  lt_backend_t *be;
  cr_assert_eq(lt_backend_cpu_new(1, &be, errbuf, sizeof errbuf), LT_OK, "%s", errbuf);
  cr_assert_eq(be->attn_state_floats(be, 4, 256, 9), (size_t)2 * 4 * 9 * 256);
  cr_assert_eq(be->attn_state_floats(be, 1, 4096, 9), (size_t)2 * 9 * 4096);
  cr_assert_eq(be->attn_state_floats(be, 3, 1, 2), (size_t)2 * 6);
  lt_backend_destroy(be);
}

static int same(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* d runs 4 times (2, 2, 1 and 3 threads) with the same bits. */
static void bitwise(lt_cpu_attn_dims_t d, int max_ex) {
  io_t x[4];
  int threads[4] = {2, 2, 1, 3};
  for (int i = 0; i < 4; i++) {
    io_init(&x[i], d, max_ex, 9);
    run_backend(&x[i], threads[i]);
  }
  for (int i = 1; i < 4; i++) {
    cr_assert(same(x[i].out, x[0].out, x[0].nq * 4), "out: %d threads differ", threads[i]);
    cr_assert(same(x[i].state, x[0].state, (size_t)d.B * d.H * d.T * 8), "state differs");
    cr_assert(same(x[i].dq, x[0].dq, x[0].nq * 4), "dq: %d threads differ", threads[i]);
    cr_assert(same(x[i].dk, x[0].dk, x[0].nk * 4), "dk: %d threads differ", threads[i]);
    cr_assert(same(x[i].dv, x[0].dv, x[0].nk * 4), "dv: %d threads differ", threads[i]);
  }
  for (int i = 0; i < 4; i++) io_free(&x[i]);
}

Test(cpu_attn, bitwise_identical_over_runs_and_thread_counts) {
  bitwise((lt_cpu_attn_dims_t){.B = 3, .T = 150, .H = 6, .KV = 2, .hd = 64}, 60);
  /* one long row, one kv head: the backend cuts it into 16 ranges of query tiles, whose dk and
   * dv it adds in range order */
  bitwise((lt_cpu_attn_dims_t){.B = 1, .T = 1100, .H = 3, .KV = 1, .hd = 16}, 2000);
  bitwise((lt_cpu_attn_dims_t){.B = 1, .T = 1100, .H = 3, .KV = 1, .hd = 16}, 300);
}

/* The ranges of lt_cpu_attn_split cover the tiles in order, and no range holds more than its
 * share of the work plus one tile's. */
Test(cpu_attn, split_cuts_the_query_tiles_into_ranges_of_equal_work) {
  int T = 2048, tile = 64, ntiles = 32, bounds[7];
  int32_t *ps = malloc(T * sizeof *ps);
  cr_assert(ps);
  for (int packed = 0; packed < 2; packed++) {
    for (int t = 0; t < T; t++) ps[t] = packed ? t % 300 : t;
    long work[32], total = 0;
    for (int i = 0; i < ntiles; i++) {
      int q0 = i * tile, kbeg = q0 - ps[q0];
      work[i] = (q0 + tile - kbeg + tile - 1) / tile;
      total += work[i];
    }
    lt_cpu_attn_split(T, tile, ps, 6, bounds);
    cr_assert_eq(bounds[0], 0);
    cr_assert_eq(bounds[6], ntiles);
    for (int p = 0; p < 6; p++) {
      cr_assert(bounds[p] <= bounds[p + 1], "range %d runs backwards", p);
      long w = 0;
      for (int i = bounds[p]; i < bounds[p + 1]; i++) w += work[i];
      cr_assert(w <= total / 6 + work[bounds[p + 1] - 1], "packed %d: range %d holds %ld of %ld", packed, p, w,
                total);
    }
  }
  /* ranges per task: until 16 tasks, no more than the tiles; 8 x 256 with 3 kv heads uncut */
  cr_assert_eq(lt_cpu_attn_parts(1, 3, 2048, tile), 6);
  cr_assert_eq(lt_cpu_attn_parts(8, 3, 256, tile), 1);
  cr_assert_eq(lt_cpu_attn_parts(1, 1, 100, tile), 2);
  cr_assert_eq(lt_cpu_attn_parts(1, 1, 4096, tile), 16);
  lt_cpu_attn_split(100, tile, ps, 5, bounds); /* 2 tiles, 5 ranges: 3 of them empty */
  cr_assert(bounds[0] == 0 && bounds[5] == 2, "%d %d", bounds[0], bounds[5]);
  free(ps);
}

/* Rows [r0, r1) of sequence b of a (N, width) tensor are bitwise equal in x and y. */
static int rows_same(const float *x, const float *y, int b, int T, int r0, int r1, int width) {
  size_t off = ((size_t)b * T + r0) * width;
  return same(x + off, y + off, (size_t)(r1 - r0) * width * sizeof(float));
}

Test(cpu_attn, keys_outside_a_rows_window_change_nothing_for_it) {
  /* sequence 1 packs examples [0, 40), [40, 130), [130, 150) */
  lt_cpu_attn_dims_t d = {.B = 2, .T = 150, .H = 6, .KV = 2, .hd = 64};
  io_t a, c;
  io_init(&a, d, 150, 10);
  io_init(&c, d, 150, 10);
  for (io_t *x = &a; x; x = x == &a ? &c : NULL)
    for (int t = 0; t < d.T; t++)
      x->pos[d.T + t] = t < 40 ? t : t < 130 ? t - 40 : t - 130;
  /* c: other keys and values in the first example and at the last position of sequence 1 */
  int kw = d.KV * d.hd, qw = d.H * d.hd;
  for (int t = 0; t < d.T; t++)
    if (t < 40 || t == d.T - 1)
      for (int j = 0; j < kw; j++) {
        c.k[((size_t)d.T + t) * kw + j] += 0.5f;
        c.v[((size_t)d.T + t) * kw + j] -= 0.25f;
      }
  run_backend(&a, 2);
  run_backend(&c, 2);
  /* the second example [40, 130) sees neither the first one nor the last position */
  cr_assert(rows_same(a.out, c.out, 1, d.T, 40, 130, qw), "out of the second example changed");
  cr_assert(rows_same(a.dq, c.dq, 1, d.T, 40, 130, qw), "dq of the second example changed");
  cr_assert(rows_same(a.dk, c.dk, 1, d.T, 40, 130, kw), "dk of the second example changed");
  cr_assert(rows_same(a.dv, c.dv, 1, d.T, 40, 130, kw), "dv of the second example changed");
  /* the third example's rows before the last one do not see the last position */
  cr_assert(rows_same(a.out, c.out, 1, d.T, 130, 149, qw), "a future key changed a row");
  /* sequence 0 is untouched; the changed rows did change */
  cr_assert(rows_same(a.out, c.out, 0, d.T, 0, d.T, qw));
  cr_assert(!rows_same(a.out, c.out, 1, d.T, 0, 40, qw));
  cr_assert(!rows_same(a.out, c.out, 1, d.T, 149, 150, qw));
  io_free(&a);
  io_free(&c);
}
