/* lt_cpu_ew: the cpu backend's elementwise and row kernels outside attention (SwiGLU and the
 * cross-entropy's rows), vectorised for AVX-512, AVX2 or the baseline by the chip at each call
 * (lt_cpu_vec.h); every clone gives the same bits. The backend's pool tasks call them on their
 * share of the elements or rows (lt_backend_cpu.c).
 *
 * Threads: no state; any thread. */
#ifndef LT_CPU_EW_H
#define LT_CPU_EW_H

#include <stddef.h>

/* h = silu(g) * u over n elements. */
void lt_cpu_swiglu_fwd(float *h, const float *g, const float *u, size_t n);
/* Its backward: du = dh * silu(g), dg = dh * u * silu'(g). */
void lt_cpu_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n);
/* log(sum_j exp(l[j])) of a row of V logits (max-shifted; the sum in 16 lanes, folded in a fixed
 * order). */
float lt_cpu_ce_lse(const float *l, int V);
/* A row's logits become the cross-entropy's gradient without its target term:
 * l[j] = -c * exp(l[j] - lse). */
void lt_cpu_ce_grad(float *l, int V, float lse, float c);

#endif
