/* lt_backend: the compute interface the training engine (lt_engine.c) runs on.
 *
 * A backend is a small vtable (libevent/nginx style) of memory management and the kernels a
 * Llama-family decoder needs for training and sampling. The model code calls only these members
 * and never learns which backend it runs on. Two implementations: `cpu` (lt_backend_cpu.c:
 * OpenBLAS + own loops + a thread pool) and `cuda` (lt_backend_cuda.c + kernels/).
 *
 * Conventions that hold for every member:
 *  - Device memory. Pointers returned by alloc() are *device pointers*: the host may do pointer
 *    arithmetic on them (offsets into a buffer are valid arguments) but must not dereference
 *    them; data crosses with upload()/download(). On the cpu backend they happen to be host
 *    memory. All tensors are float32 (`float *`) or int32 (`int32_t *`), row-major, contiguous
 *    unless a leading dimension is given.
 *  - Shapes in comments use: N rows (tokens) = B sequences x T positions, row r = b*T + t;
 *    D hidden size; H query heads, KV key/value heads (H % KV == 0, query head h reads kv head
 *    h / (H/KV), as HF's repeat_kv); hd head dim; V vocabulary.
 *  - Gradients. Members named *_bwd OVERWRITE the activation gradients they produce unless the
 *    comment says "+=". Parameter gradients (dw, db) always ACCUMULATE (+=), so gradient
 *    accumulation over several forward_backward calls is free; zero them with zero().
 *  - Ordering. Calls are executed in order (a stream); download() and sumsq() return only when
 *    all previously issued work is done. Nothing runs concurrently with the caller afterwards.
 *  - Determinism. For a fixed thread count (cpu) or device (cuda), every member gives bitwise
 *    identical results for identical inputs: reductions run in a fixed order, never atomics whose
 *    order depends on scheduling. Each output row depends only on its own input rows (plus
 *    weights), never on how many other rows are in the call, except matmul / matmul_strided
 *    (see matmul_rows) — sampling's batch invariance rests on this.
 *  - Errors. Kernels cannot fail on valid arguments (asserted). Members that can fail (memory,
 *    transfer) return lt_err_t / NULL; the backend keeps the message for last_error().
 *  - Threads. One backend instance is used by one thread at a time (the executor's); it owns
 *    its worker threads / CUDA stream. Different instances are independent.
 */
#ifndef LT_BACKEND_H
#define LT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"
#include "lt_k_dropout.h" /* lt_backend_dropout_keep: the mask every backend draws */

typedef struct lt_backend lt_backend_t;

/* One product C[M,N] = alpha * A[M,K] @ W[N,K]^T + beta * C of matmul_rows_multi. */
typedef struct lt_mr_desc {
  int M, N, K;
  float alpha, beta;
  const float *A, *W;
  float *C;
  int lda, ldw, ldc;
} lt_mr_desc_t;

struct lt_backend {
  const char *name; /* "cpu" or "cuda" */
  void *ctx;        /* the implementation's private state */

  /* Releases every worker thread, stream and handle, then the struct itself. Buffers still
   * allocated are freed too. NULL-safe via lt_backend_destroy(). */
  void (*destroy)(lt_backend_t *be);

  /* Text of the last failure of a fallible member; "" if none. Owned by the backend. */
  const char *(*last_error)(lt_backend_t *be);

  /* ---- memory ------------------------------------------------------------------------- */

  /* `bytes` of device memory, zero-filled, aligned to at least 64 bytes; NULL on failure
   * (last_error says why). bytes == 0 returns a valid unique pointer. */
  void *(*alloc)(lt_backend_t *be, size_t bytes);
  /* Scrubs (overwrites with zeros in a way the compiler may not elide: tenant isolation,
   * docs/DESIGN.md §4.7) and frees a buffer from alloc(). NULL is a no-op. */
  void (*free)(lt_backend_t *be, void *p);
  /* Host -> device and device -> host copies of `bytes`. download() waits for earlier work. */
  lt_err_t (*upload)(lt_backend_t *be, void *dst_dev, const void *src_host, size_t bytes);
  lt_err_t (*download)(lt_backend_t *be, void *dst_host, const void *src_dev, size_t bytes);
  /* Read-only weights. Returns a device pointer holding the n floats of `host` (which stays
   * valid and unchanged while the result is in use: typically an mmap of a safetensors file).
   * The cpu backend returns `host` itself (no copy, page cache shared by every executor);
   * cuda copies. NULL on failure. Release with free_const(). */
  const float *(*map_const)(lt_backend_t *be, const float *host, size_t n);
  void (*free_const)(lt_backend_t *be, const float *dev);
  /* May be NULL. The input-gradient products of mapped weight dev (A W with W K x N: dY W)
   * stay in f32 whatever lower precision the others take; its forward products (A W^T) take
   * it. The engine marks the LM head: in bf16 the product of the logits' gradient cost the
   * bundled task exact match (0.890 against 1.000 on one seed of three), the logits did not. */
  void (*grad_f32)(lt_backend_t *be, const float *dev);
  /* Overwrites `bytes` at p with zeros (not elided). Used on gradients and on buffers that held
   * a tenant's data before they are reused. */
  void (*scrub)(lt_backend_t *be, void *p, size_t bytes);

  /* ---- dense linear algebra ----------------------------------------------------------- */

  /* Row-major SGEMM: C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C. Deterministic for
   * fixed shapes, but a row's rounding may depend on M (see matmul_rows).
   * op(X) = X if trans_X == 0, X^T if 1. lda/ldb/ldc are row strides in floats of A, B, C as
   * stored (A is M x K when trans_a == 0, K x M when 1). beta == 0 ignores C's old content
   * (NaNs included). The cpu backend calls cblas_sgemm. */
  void (*matmul)(lt_backend_t *be, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

  /* Batch-invariant C[M,N] = alpha * A[M,K] @ W[N,K]^T + beta * C (W row-major (N, K), as a
   * linear layer's weight). Unlike matmul (OpenBLAS picks different kernels, hence different
   * rounding, for different M), row i of C is bitwise the same whatever M and the other rows
   * are. Sampling's decode steps use it so a prompt's output does not depend on its batch. */
  void (*matmul_rows)(lt_backend_t *be, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *W, int ldw, float beta, float *C, int ldc);
  /* count matmul_rows products in one call, each element bitwise as matmul_rows computes it;
   * their outputs must not overlap. For the many small products of one step (each adapter's
   * low-rank update on its own rows): one dispatch to the threads instead of one per product. */
  void (*matmul_rows_multi)(lt_backend_t *be, int count, const lt_mr_desc_t *d);

  /* `batch` independent matmuls; matrix i uses A + i*stride_a, B + i*stride_b, C + i*stride_c
   * (strides in floats). Same semantics as matmul for each. */
  void (*matmul_strided)(lt_backend_t *be, int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, long stride_a, const float *B,
                         int ldb, long stride_b, float beta, float *C, int ldc, long stride_c,
                         int batch);

  /* ---- elementwise and small ops ------------------------------------------------------ */

  void (*zero)(lt_backend_t *be, float *x, size_t n);                 /* x = 0 */
  void (*copy)(lt_backend_t *be, float *dst, const float *src, size_t n); /* non-overlapping */
  void (*scale)(lt_backend_t *be, float *x, float a, size_t n);        /* x *= a */
  void (*axpy)(lt_backend_t *be, float *y, float a, const float *x, size_t n); /* y += a*x */
  /* Sum of squares of x (in double, fixed order), returned to the host; waits for the stream. */
  double (*sumsq)(lt_backend_t *be, const float *x, size_t n);

  /* y[r, c] += b[c] for r < rows, c < cols (bias of a linear layer). */
  void (*bias_add)(lt_backend_t *be, float *y, const float *b, int rows, int cols);
  /* db[c] += sum_r dy[r, c] (rows summed in increasing r). */
  void (*bias_bwd)(lt_backend_t *be, float *db, const float *dy, int rows, int cols);

  /* Inverted dropout as a pure function of (seed, index): out[i] = keep(seed, i) ? in[i]/(1-p)
   * : 0, with keep(seed, i) = lt_backend_dropout_keep(seed, i, p) (lt_k_dropout.h), so cpu
   * and cuda drop the same elements and the backward pass is the same call on the gradient. out
   * may equal in. p == 0 is a copy. */
  void (*dropout)(lt_backend_t *be, float *out, const float *in, size_t n, float p,
                  uint64_t seed);

  /* ---- embedding ---------------------------------------------------------------------- */

  /* out[r, :] = table[tokens[r], :], r < N; table (V, D). Tokens are valid (checked by caller). */
  void (*embed_fwd)(lt_backend_t *be, float *out, const float *table, const int32_t *tokens,
                    int N, int D);
  /* dtable[tokens[r], :] += dout[r, :] for r in increasing order (deterministic). */
  void (*embed_bwd)(lt_backend_t *be, float *dtable, const float *dout, const int32_t *tokens,
                    int N, int D);

  /* ---- RMSNorm (HF LlamaRMSNorm: y = x * rsqrt(mean(x^2) + eps) * w) -------------------- */

  /* out (N, D), rstd (N) saved for the backward pass (rstd may be NULL when not training). */
  void (*rmsnorm_fwd)(lt_backend_t *be, float *out, float *rstd, const float *x,
                      const float *w, int N, int D, float eps);
  /* dx (N, D) += gradient wrt x; dw (D) += gradient wrt w, or dw == NULL when w is frozen.
   * dout (N, D), x the forward input, rstd from rmsnorm_fwd. */
  void (*rmsnorm_bwd)(lt_backend_t *be, float *dx, float *dw, const float *dout, const float *x,
                      const float *w, const float *rstd, int N, int D);

  /* ---- RoPE (HF rotate_half convention) ----------------------------------------------- */

  /* In place on x (N, nh*hd): for each row r and head, with j < hd/2, c = cos_tab[pos[r]*hd/2+j],
   * s = sin_tab[...]: (x_j, x_{j+hd/2}) <- (x_j c - x_{j+hd/2} s, x_{j+hd/2} c + x_j s).
   * inverse != 0 rotates by -angle instead: that is the backward pass (dx from dy, in place).
   * cos_tab/sin_tab are (max_pos, hd/2) device tables the model computes from rope_theta and
   * rope_scaling; pos (N) int32 device positions, each < max_pos. */
  void (*rope)(lt_backend_t *be, float *x, const float *cos_tab, const float *sin_tab,
               const int32_t *pos, int N, int nh, int hd, int inverse);

  /* ---- causal grouped-query attention (training / full sequences) ---------------------- */

  /* Floats of the per-layer state attn_fwd saves for attn_bwd for B sequences of T tokens and
   * H heads: linear in T on both backends, which recompute the probabilities tile by tile in
   * attn_bwd (cpu: each row's softmax max and 1/sum, 2*B*H*T, lt_cpu_attn.h; cuda: B*H*T). */
  size_t (*attn_state_floats)(lt_backend_t *be, int B, int T, int H);
  /* out (N, H*hd) = softmax(q k^T / sqrt(hd) + mask) v per sequence and head, where row t of
   * a sequence attends to its rows t - pos[r] .. t (r = b*T + t): pos (N) int32 device
   * positions as RoPE's, 0..T-1 for one example per row (plain causal attention), restarting
   * at 0 where a packed row starts its next example (pos[r] <= t, and pos[r] = 0 or
   * pos[r-1] + 1). q (N, H*hd), k and v (N, KV*hd), rows b*T + t; state as sized by
   * attn_state_floats. */
  void (*attn_fwd)(lt_backend_t *be, float *out, float *state, const float *q, const float *k,
                   const float *v, const int32_t *pos, int B, int T, int H, int KV, int hd);
  /* Overwrites dq (N, H*hd), dk and dv (N, KV*hd) from dout (N, H*hd); q, k, v, out, state and
   * pos as in and from attn_fwd. */
  void (*attn_bwd)(lt_backend_t *be, float *dq, float *dk, float *dv, const float *dout,
                   const float *q, const float *k, const float *v, const float *out,
                   const float *state, const int32_t *pos, int B, int T, int H, int KV, int hd);

  /* ---- attention against a KV cache (sampling) ---------------------------------------- */

  /* Cache layout per layer: (S, max_t, KV*hd), sequence s position p at row s*max_t + p.
   * kv_store: cache[seq[r]*max_t + pos[r], :] = src[r, :] for r < n (width = KV*hd). */
  void (*kv_store)(lt_backend_t *be, float *cache, const float *src, const int32_t *seq,
                   const int32_t *pos, int n, int width, int max_t);
  /* out[r] (H*hd) = attention of q[r] over positions 0..pos[r] (inclusive) of sequence seq[r]
   * in kcache/vcache. Each row is computed alone: its result does not depend on the other rows
   * in the call (batch invariance of sampling). */
  void (*attn_cached)(lt_backend_t *be, float *out, const float *q, const float *kcache,
                      const float *vcache, const int32_t *seq, const int32_t *pos, int n, int H,
                      int KV, int hd, int max_t);

  /* ---- attention against a paged KV cache (serving, lt_serve.h) ----------------------- */

  /* Cache layout per layer: a pool of blocks of block_tokens positions, (blocks*block_tokens,
   * KV*hd); position p of a sequence lives in row btab[p / block_tokens] * block_tokens +
   * p % block_tokens, btab being that sequence's block table.
   * kv_store_paged: cache[slot[r], :] = src[r, :] for r < n (slot[r] the physical row). */
  void (*kv_store_paged)(lt_backend_t *be, float *cache, const float *src, const int32_t *slot,
                         int n, int width);
  /* out[r] (H*hd) = attention of q[r] over positions 0..pos[r] (inclusive) of its sequence,
   * whose block table is btab + btab_off[r] (btab: the step's tables, flat). Positions are
   * visited in increasing order whatever the blocks are, so a row's result is bitwise that of
   * attn_cached over the same keys and values, and independent of the other rows in the call. */
  void (*attn_paged)(lt_backend_t *be, float *out, const float *q, const float *kcache,
                     const float *vcache, const int32_t *btab, const int32_t *btab_off,
                     const int32_t *pos, int n, int H, int KV, int hd, int block_tokens);

  /* ---- SwiGLU MLP activation ---------------------------------------------------------- */

  /* h = silu(g) * u, all (n). */
  void (*swiglu_fwd)(lt_backend_t *be, float *h, const float *g, const float *u, size_t n);
  /* dg = dh * u * silu'(g), du = dh * silu(g) (overwritten; dg/du may not alias dh). */
  void (*swiglu_bwd)(lt_backend_t *be, float *dg, float *du, const float *dh, const float *g,
                     const float *u, size_t n);

  /* ---- cross-entropy ------------------------------------------------------------------ */

  /* For each row r < N of logits (N, V): lse[r] = logsumexp(logits[r, :]) and
   * logp[r] = logits[r, targets[r]] - lse[r]. Every targets[r] is in [0, V). */
  void (*ce_fwd)(lt_backend_t *be, float *logp, float *lse, const float *logits,
                 const int32_t *targets, int N, int V);
  /* In place: logits[r, :] <- coef[r] * (onehot(targets[r]) - softmax(logits[r, :])), i.e. the
   * gradient of sum_r coef[r] * logp[r] wrt the logits. The model turns any per-token loss
   * (weighted cross-entropy, importance sampling) into coef = dLoss/dlogp. */
  void (*ce_bwd)(lt_backend_t *be, float *logits, const float *lse, const int32_t *targets,
                 const float *coef, int N, int V);

  /* ---- optimizer ---------------------------------------------------------------------- */

  /* PyTorch torch.optim.AdamW (decoupled weight decay), on n parameters, with g = grad *
   * grad_scale (clipping and accumulation folded into grad_scale):
   *   p -= lr*wd*p; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
   *   p -= (lr / (1-b1^step)) * m / (sqrt(v) / sqrt(1-b2^step) + eps).
   * step >= 1 is the 1-based step count after this update. */
  void (*adamw)(lt_backend_t *be, float *p, const float *grad, float *m, float *v, size_t n,
                float lr, float beta1, float beta2, float eps, float weight_decay,
                float grad_scale, long step);
};

typedef struct lt_cpu_opts {
  int threads;          /* as lt_backend_cpu_new */
  /* Serving precision: map_const also keeps a bf16 copy (rounded to nearest even) of every
   * weight of at least bf16_min_elems floats (0: 65536, i.e. the matrices, not the norms), and
   * matmul_rows / matmul_rows_multi read it when W lies in a mapped weight, with A's rows
   * rounded to bf16 too: each element is the bf16 pairs' sum of lt_cpu_dot.h (vdpbf16ps where
   * the chip has AVX-512 BF16, the same bits elsewhere), float sums and C, batch-invariant as
   * before, with half the weight bytes a decode step streams. Everything else (matmul,
   * embeddings, norms, training) reads the floats. The sampler sets it
   * (LATHE_SAMPLER_PRECISION); training never does. */
  int bf16_weights;
  size_t bf16_min_elems;
  /* matmul_rows runs AVX-512 kernels (4x4 tiles) where the processor has them; narrow: the
   * AVX2 / baseline kernels even there. Same bits either way (tests compare them). */
  int narrow;
  /* Training precision: a LoRA session's products against the frozen base weights (map_const,
   * at least bf16_min_elems floats) run in bf16 on AMX tiles with f32 accumulation
   * (lt_cpu_amx.h): the weights packed once, the activations rounded at each product; the LM
   * head's logits too, but not its input gradient (grad_f32).
   * lt_backend_cpu_new_opts fails with LT_ERR_UNSUPPORTED where the chip or kernel has no AMX. */
  int amx_bf16;
} lt_cpu_opts_t;
lt_err_t lt_backend_cpu_new_opts(const lt_cpu_opts_t *opts, lt_backend_t **out, char *errstr,
                                 size_t errstr_size);

/* Creates the cpu backend with `threads` worker threads (>= 1; the calling thread counts as
 * one). It sets OpenBLAS to the same count. The caller owns the result (lt_backend_destroy). */
static inline lt_err_t lt_backend_cpu_new(int threads, lt_backend_t **out, char *errstr, size_t errstr_size) {
  lt_cpu_opts_t o = {.threads = threads};
  return lt_backend_cpu_new_opts(&o, out, errstr, errstr_size);
}

/* Creates the cuda backend on device `device`. LT_ERR_UNAVAILABLE when the build has no CUDA or
 * no GPU is present ("driver version is insufficient" counts as no GPU). Defined in
 * lt_backend_cuda.c when built with CUDA, else by a stub in the engine library. */
lt_err_t lt_backend_cuda_new(int device, lt_backend_t **out, char *errstr, size_t errstr_size);

static inline void lt_backend_destroy(lt_backend_t *be) {
  if (be) be->destroy(be);
}

#endif
