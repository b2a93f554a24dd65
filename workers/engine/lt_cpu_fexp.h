/* lt_cpu_fexp: the cpu backend's exp(), shared by lt_backend_cpu.c and lt_cpu_attn.c so the
 * softmax of every attention path (training, cached, paged) rounds the same way. */
#ifndef LT_CPU_FEXP_H
#define LT_CPU_FEXP_H

#include <stdint.h>
#include <string.h>

/* exp(x) for float, relative error about 2e-7 over the range used (x <= 0 mostly), branch-free
 * so gcc vectorises loops calling it. Cephes expf: x = n ln2 + r, |r| <= ln2/2, degree-6
 * polynomial, 2^n assembled in the exponent bits. Results below ~-87 flush to 0. */
static inline float lt_fexp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float r2 = r * r;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r2 + r + 1.0f;
  int32_t e = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &e, 4);
  return p * s;
}

#endif
