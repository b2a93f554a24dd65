/* lt_cpu_ew: SwiGLU and the cross-entropy's rows for the cpu backend (see lt_cpu_ew.h). Built
 * with the attention tiles' flags (-fno-trapping-math: lt_fexp vectorises) and cloned per
 * instruction set. */
#include "lt_cpu_ew.h"

#include <math.h>

#include "lt_cpu_fexp.h"
#include "lt_cpu_vec.h"

LT_AI void swiglu_fwd_of(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + lt_fexp(-g[i])) * u[i];
}
LT_ISA_DISPATCH(swiglu_fwd, (float *h, const float *g, const float *u, size_t n), (h, g, u, n))
void lt_cpu_swiglu_fwd(float *h, const float *g, const float *u, size_t n) { swiglu_fwd(h, g, u, n); }

LT_AI void swiglu_bwd_of(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float sg = 1.0f / (1.0f + lt_fexp(-g[i]));
    float silu = g[i] * sg;
    du[i] = dh[i] * silu;
    dg[i] = dh[i] * u[i] * sg * (1.0f + g[i] * (1.0f - sg));
  }
}
LT_ISA_DISPATCH(swiglu_bwd, (float *dg, float *du, const float *dh, const float *g, const float *u, size_t n),
                (dg, du, dh, g, u, n))
void lt_cpu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n) {
  swiglu_bwd(dg, du, dh, g, u, n);
}

/* sum_j exp(l[j] - mx) in lt_vec_sum's lanes and order. */
LT_AI void sum_exp_of(const float *l, int V, float mx, float *out) {
  float a[LT_VEC_LANES] = {0};
  int j = 0;
  for (; j + LT_VEC_LANES <= V; j += LT_VEC_LANES)
    for (int u = 0; u < LT_VEC_LANES; u++) a[u] += lt_fexp(l[j + u] - mx);
  for (int u = 0; j + u < V; u++) a[u] += lt_fexp(l[j + u] - mx);
  *out = lt_vec_fold_sum(a);
}
LT_ISA_DISPATCH(sum_exp, (const float *l, int V, float mx, float *out), (l, V, mx, out))
LT_AI void row_max_of(const float *l, int V, float *out) { *out = lt_vec_max(l, V, -INFINITY); }
LT_ISA_DISPATCH(row_max, (const float *l, int V, float *out), (l, V, out))

float lt_cpu_ce_lse(const float *l, int V) {
  float mx, sum;
  row_max(l, V, &mx);
  sum_exp(l, V, mx, &sum);
  return mx + logf(sum);
}

LT_AI void ce_grad_of(float *l, int V, float lse, float c) {
  for (int j = 0; j < V; j++) l[j] = -c * lt_fexp(l[j] - lse);
}
LT_ISA_DISPATCH(ce_grad, (float *l, int V, float lse, float c), (l, V, lse, c))
void lt_cpu_ce_grad(float *l, int V, float lse, float c) { ce_grad(l, V, lse, c); }
