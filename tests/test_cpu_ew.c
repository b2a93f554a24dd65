/* Tests of the cpu backend's vectorised row kernels (workers/engine/lt_cpu_ew.c): SwiGLU and its
 * backward, and the cross-entropy's rows, against plain scalar loops written here with the same
 * exp (lt_fexp). The elementwise kernels must give those loops' bits exactly (vectorising
 * changes the instructions, never a value); the log-sum-exp must give the bits of its stated
 * order (16 lanes folded pairwise) and be within float rounding of a double-precision one. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lt_cpu_ew.h"
#include "lt_cpu_fexp.h"

static float urand(unsigned *s, float scale) { return ((float)rand_r(s) / (float)RAND_MAX * 2.0f - 1.0f) * scale; }

/* n values spread over [-scale, scale], with the edges a kernel must survive planted in. */
static float *values(size_t n, float scale, unsigned seed) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = urand(&seed, scale);
  const float edge[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.5f, -88.5f, 1e-30f, -1e-30f};
  for (size_t i = 0; i < sizeof edge / sizeof *edge && i * 37 < n; i++) x[i * 37] = edge[i];
  return x;
}

static void same_bits(const float *got, const float *want, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s[%zu]: %.9g, the scalar loop's %.9g", what, i,
              (double)got[i], (double)want[i]);
}

Test(cpu_ew, swiglu_and_its_backward_are_the_scalar_loops_bits) {
  size_t n = 4099; /* not a multiple of any vector width */
  float *g = values(n, 12, 1), *u = values(n, 3, 2), *dh = values(n, 1, 3);
  float *h = malloc(n * 4), *dg = malloc(n * 4), *du = malloc(n * 4);
  float *rh = malloc(n * 4), *rdg = malloc(n * 4), *rdu = malloc(n * 4);
  for (size_t i = 0; i < n; i++) {
    rh[i] = g[i] / (1.0f + lt_fexp(-g[i])) * u[i];
    float sg = 1.0f / (1.0f + lt_fexp(-g[i]));
    rdu[i] = dh[i] * (g[i] * sg);
    rdg[i] = dh[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
  }
  lt_cpu_swiglu_fwd(h, g, u, n);
  lt_cpu_swiglu_bwd(dg, du, dh, g, u, n);
  same_bits(h, rh, n, "h");
  same_bits(du, rdu, n, "du");
  same_bits(dg, rdg, n, "dg");
  for (size_t i = 0; i < n; i++) cr_assert(isfinite(h[i]) && isfinite(dg[i]), "not finite at %zu (g %g)", i, g[i]);
  free(g), free(u), free(dh), free(h), free(dg), free(du), free(rh), free(rdg), free(rdu);
}

Test(cpu_ew, a_rows_log_sum_exp_is_its_stated_order_and_near_the_exact_one) {
  const int widths[] = {1, 15, 16, 17, 1000, 49152 + 7};
  for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
    int V = widths[w];
    for (int shape = 0; shape < 2; shape++) {
      float *l = values((size_t)V, 8, 10 + (unsigned)w);
      if (shape) l[V / 2] = 1e4f; /* one logit far above the rest: the max shift carries the row */
      float mx = -INFINITY;
      for (int j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
      float a[16] = {0};
      int j = 0;
      for (; j + 16 <= V; j += 16)
        for (int k = 0; k < 16; k++) a[k] += lt_fexp(l[j + k] - mx);
      for (int k = 0; j + k < V; k++) a[k] += lt_fexp(l[j + k] - mx);
      for (int half = 8; half; half /= 2)
        for (int k = 0; k < half; k++) a[k] += a[k + half];
      float want = mx + logf(a[0]), got = lt_cpu_ce_lse(l, V);
      cr_assert(memcmp(&got, &want, 4) == 0, "V %d shape %d: lse %.9g, the 16-lane loop's %.9g", V, shape,
                (double)got, (double)want);
      double s = 0;
      for (j = 0; j < V; j++) s += exp((double)l[j] - mx);
      double exact = mx + log(s);
      cr_assert(fabs(got - exact) <= 4e-6 * fmax(1.0, fabs(exact)), "V %d shape %d: lse %.9g, exact %.12g", V,
                shape, (double)got, exact);
      free(l);
    }
  }
}

Test(cpu_ew, the_gradient_row_is_the_scalar_loops_bits_and_sums_to_zero_with_its_target) {
  int V = 49152 + 5;
  float *l = values((size_t)V, 6, 21), *ref = malloc((size_t)V * 4);
  float lse = lt_cpu_ce_lse(l, V), c = 0.25f;
  for (int j = 0; j < V; j++) ref[j] = -c * lt_fexp(l[j] - lse);
  lt_cpu_ce_grad(l, V, lse, c);
  same_bits(l, ref, (size_t)V, "dlogits");
  l[123] += c; /* the target's term, as the backend adds it */
  double s = 0;
  for (int j = 0; j < V; j++) s += l[j];
  cr_assert(fabs(s) < 1e-5, "a row's gradient sums to %.3g, not 0", s);
  free(l), free(ref);
}
