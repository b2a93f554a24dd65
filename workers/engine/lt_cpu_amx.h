/* The frozen base weights' products in bf16 on AMX tiles (lt_cpu_opts_t.amx_bf16): a LoRA
 * session's X W^T and dY W, where W is a mapped weight of the base model, which never changes
 * (but the LM head's dY W, which the engine keeps in f32: lt_backend_t.grad_f32).
 * Each weight is packed once, on its first product of each form, into the tile layout AMX reads
 * (bf16 pairs, nearest even); the activations are rounded to bf16 at every product; the tiles
 * accumulate in f32. Each output element is one accumulation over the reduction in a fixed order,
 * whatever the rows and the thread count: the same bits on one machine, not those of the f32
 * products (docs/DESIGN.md, the engine). */
#ifndef LT_CPU_AMX_H
#define LT_CPU_AMX_H

#include <stdbool.h>
#include <stddef.h>

#include "lt_err.h"

typedef struct lt_amx lt_amx_t;

/* Runs fn(arg, tid, nt) on every thread of a pool and returns when all are done. */
typedef void (*lt_amx_run_fn)(void *pool, void (*fn)(void *arg, int tid, int nt), void *arg);

/* LT_ERR_UNSUPPORTED, saying why, when the chip has no AMX-BF16 or the kernel does not let the
 * process use its tiles. Weights of fewer than min_elems floats are left to the f32 products. */
lt_err_t lt_amx_new(size_t min_elems, lt_amx_t **out, char *errstr, size_t errstr_size);
void lt_amx_destroy(lt_amx_t *x); /* NULL-safe */

/* [w, w + n) is a frozen weight (the backend's map_const); LT_ERR_NOMEM. Its packing waits for
 * its first product. */
lt_err_t lt_amx_add(lt_amx_t *x, const float *w, size_t n);
void lt_amx_remove(lt_amx_t *x, const float *w);
/* The A W products of registered weight w take the f32 path from now on (its A W^T stay here);
 * NULL-safe, and nothing when w is not registered. */
void lt_amx_grad_f32(lt_amx_t *x, const float *w);

/* C (M x N, ldc) = alpha * A W^T + beta * C (tb: W is N x K, ldb K) or alpha * A W + beta * C
 * (W is K x N, ldb N), A (M x K, lda) row-major, when W is a whole registered weight; else false
 * and nothing is done. A packing that cannot be allocated also answers false (the f32 product
 * then runs). run splits the work over pool's threads. */
bool lt_amx_matmul(lt_amx_t *x, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                   const float *W, int ldb, float beta, float *C, int ldc, lt_amx_run_fn run, void *pool);

#endif
