/* lt_cpu_vec: what the cpu backend's vectorised row kernels share (lt_cpu_attn.c, lt_cpu_ew.c),
 * both compiled with -fno-trapping-math so that lt_fexp's clamp and floor vectorise.
 *
 * LT_ISA_DISPATCH(NAME, PARAMS, ARGS) makes NAME(PARAMS) call NAME_of built for AVX-512, AVX2
 * or the baseline, by the chip: picked at the call, not by target_clones, whose ifunc resolver
 * runs during relocation, before a sanitizer's runtime is up (ThreadSanitizer builds crashed
 * there). The clones use wider registers only (no FMA: -ffp-contract=off), elementwise
 * operations and the 16-lane reductions below, so every clone gives the same bits. */
#ifndef LT_CPU_VEC_H
#define LT_CPU_VEC_H

#define LT_AI static inline __attribute__((always_inline))

#define LT_ISA_DISPATCH(name, params, args)                                                    \
  __attribute__((target("avx512f"))) static void name##_avx512 params { name##_of args; }     \
  __attribute__((target("avx2"))) static void name##_avx2 params { name##_of args; }          \
  static void name##_base params { name##_of args; }                                          \
  static void name params {                                                                   \
    if (__builtin_cpu_supports("avx512f")) name##_avx512 args;                                \
    else if (__builtin_cpu_supports("avx2")) name##_avx2 args;                                \
    else name##_base args;                                                                    \
  }

/* Reductions over a row in 16 lanes (lane u takes j = u, u + 16, ...), folded pairwise: a
 * fixed order that every instruction set vectorises alike, so every clone gives the same bits. */
#define LT_VEC_LANES 16
LT_AI float lt_vec_max(const float *x, int n, float init) {
  float a[LT_VEC_LANES];
  for (int u = 0; u < LT_VEC_LANES; u++) a[u] = init;
  int j = 0;
  for (; j + LT_VEC_LANES <= n; j += LT_VEC_LANES)
    for (int u = 0; u < LT_VEC_LANES; u++) a[u] = x[j + u] > a[u] ? x[j + u] : a[u];
  for (int u = 0; j + u < n; u++) a[u] = x[j + u] > a[u] ? x[j + u] : a[u];
  for (int w = LT_VEC_LANES / 2; w; w /= 2)
    for (int u = 0; u < w; u++) a[u] = a[u + w] > a[u] ? a[u + w] : a[u];
  return a[0];
}
/* The lanes' partial sums folded pairwise (lane u + w onto lane u, w = 8, 4, 2, 1). */
LT_AI float lt_vec_fold_sum(float a[LT_VEC_LANES]) {
  for (int w = LT_VEC_LANES / 2; w; w /= 2)
    for (int u = 0; u < w; u++) a[u] += a[u + w];
  return a[0];
}
LT_AI float lt_vec_sum(const float *x, int n) {
  float a[LT_VEC_LANES] = {0};
  int j = 0;
  for (; j + LT_VEC_LANES <= n; j += LT_VEC_LANES)
    for (int u = 0; u < LT_VEC_LANES; u++) a[u] += x[j + u];
  for (int u = 0; j + u < n; u++) a[u] += x[j + u];
  return lt_vec_fold_sum(a);
}

#endif
