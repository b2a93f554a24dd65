/* lt_kernels: host launchers of Lathe's CUDA kernels, callable from C.
 *
 * One kernel family per file (lt_k_<family>.cu), each with its launchers; this header is the
 * C face of them all, grouped by family, so workers/engine/lt_backend_cuda.c (plain C) and the GPU
 * tests can call them. Semantics of each op are those of the matching member of
 * workers/engine/lt_backend.h, which the CPU backend and the CPU references in tests/gpu/ implement.
 *
 * Conventions:
 *  - Pointers are device pointers; tensors are row-major f32 unless the name says bf16 (then
 *    `void *` holding __nv_bfloat16, so C callers need no CUDA C++ types).
 *  - Every launcher enqueues on `stream`, checks the launch, and returns lt_err_t (message in
 *    errstr). Sizes of 0 are valid no-ops. Nothing here allocates or synchronises.
 *  - Deterministic: no atomics; every reduction runs in a fixed order for a given shape, and each
 *    output row depends only on its own input rows.
 *  - Thread safety: launchers are reentrant; a stream / cuBLAS handle must not be used by two
 *    host threads at once (the backend's rule: one executor thread per instance).
 */
#ifndef LT_KERNELS_CUH
#define LT_KERNELS_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "lt_err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- elementwise (lt_k_elementwise.cu) ---------------------------------------------------- */

/* x *= a */
lt_err_t lt_k_scale(float *x, float a, size_t n, cudaStream_t stream, char *errstr,
                    size_t errstr_size);
/* y += a * x */
lt_err_t lt_k_axpy(float *y, float a, const float *x, size_t n, cudaStream_t stream,
                   char *errstr, size_t errstr_size);
/* y[r, c] += b[c] */
lt_err_t lt_k_bias_add(float *y, const float *b, int rows, int cols, cudaStream_t stream,
                       char *errstr, size_t errstr_size);
/* out[i] = keep(seed, i) ? in[i] / (1 - p) : 0 with lt_backend_dropout_keep's hash
 * (lt_k_dropout.h). */
lt_err_t lt_k_dropout(float *out, const float *in, size_t n, float p, uint64_t seed,
                      cudaStream_t stream, char *errstr, size_t errstr_size);
/* dst_bf16[r, c] = bf16(src[r, c]) (round to nearest even), row strides in elements. */
lt_err_t lt_k_cast_bf16(void *dst_bf16, long ld_dst, const float *src, long ld_src, int rows,
                        int cols, cudaStream_t stream, char *errstr, size_t errstr_size);

/* ---- reductions (lt_k_reduce.cu) ---------------------------------------------------------- */

/* Number of doubles of workspace lt_k_sumsq needs. */
size_t lt_k_sumsq_work_doubles(void);
/* *out_dev = sum of x[i]^2 in double, in a fixed order; work_dev has lt_k_sumsq_work_doubles(). */
lt_err_t lt_k_sumsq(double *out_dev, double *work_dev, const float *x, size_t n,
                    cudaStream_t stream, char *errstr, size_t errstr_size);
/* db[c] += sum_r dy[r, c], rows summed in increasing r. */
lt_err_t lt_k_bias_bwd(float *db, const float *dy, int rows, int cols, cudaStream_t stream,
                       char *errstr, size_t errstr_size);

/* ---- embedding and KV cache (lt_k_embed.cu) ----------------------------------------------- */

lt_err_t lt_k_embed_fwd(float *out, const float *table, const int32_t *tokens, int N, int D,
                        cudaStream_t stream, char *errstr, size_t errstr_size);
/* out[r, :] = table[tokens[r], :] widened to floats, the table in bf16 (a weight the cuda backend
 * keeps in bf16 alone). */
lt_err_t lt_k_embed_fwd_bf16(float *out, const void *table_bf16, const int32_t *tokens, int N, int D,
                             cudaStream_t stream, char *errstr, size_t errstr_size);
/* dtable[tokens[r], :] += dout[r, :], r increasing (one thread per column: no atomics). */
lt_err_t lt_k_embed_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int D,
                        cudaStream_t stream, char *errstr, size_t errstr_size);
/* cache[seq[r]*max_t + pos[r], :] = src[r, :] */
lt_err_t lt_k_kv_store(float *cache, const float *src, const int32_t *seq, const int32_t *pos,
                       int n, int width, int max_t, cudaStream_t stream, char *errstr,
                       size_t errstr_size);

/* ---- RMSNorm (lt_k_rmsnorm.cu) ------------------------------------------------------------ */

lt_err_t lt_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int D,
                          float eps, cudaStream_t stream, char *errstr, size_t errstr_size);
/* dx += ..., dw += ... (dw may be NULL). */
lt_err_t lt_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                          const float *w, const float *rstd, int N, int D, cudaStream_t stream,
                          char *errstr, size_t errstr_size);

/* ---- RoPE (lt_k_rope.cu) ------------------------------------------------------------------ */

lt_err_t lt_k_rope(float *x, const float *cos_tab, const float *sin_tab, const int32_t *pos,
                   int N, int nh, int hd, int inverse, cudaStream_t stream, char *errstr,
                   size_t errstr_size);

/* ---- SwiGLU (lt_k_swiglu.cu) -------------------------------------------------------------- */

lt_err_t lt_k_swiglu_fwd(float *h, const float *g, const float *u, size_t n, cudaStream_t stream,
                         char *errstr, size_t errstr_size);
lt_err_t lt_k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                         size_t n, cudaStream_t stream, char *errstr, size_t errstr_size);

/* ---- cross-entropy (lt_k_xent.cu) --------------------------------------------------------- */

lt_err_t lt_k_ce_fwd(float *logp, float *lse, const float *logits, const int32_t *targets, int N,
                     int V, cudaStream_t stream, char *errstr, size_t errstr_size);
lt_err_t lt_k_ce_bwd(float *logits, const float *lse, const int32_t *targets, const float *coef,
                     int N, int V, cudaStream_t stream, char *errstr, size_t errstr_size);

/* ---- AdamW (lt_k_adamw.cu) ---------------------------------------------------------------- */

lt_err_t lt_k_adamw(float *p, const float *grad, float *m, float *v, size_t n, float lr,
                    float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                    long step, cudaStream_t stream, char *errstr, size_t errstr_size);

/* ---- attention (lt_k_attention.cu) -------------------------------------------------------- */

/* Causal GQA attention for training, on cuBLAS batched GEMMs (tensor cores in bf16 mode) plus
 * softmax kernels; the probabilities are recomputed in the backward pass, so the saved state is
 * only the log-sum-exp per (sequence, head, position): B*H*T floats.
 * `cublas` is a cublasHandle_t already bound to `stream`. `bf16` != 0 casts q, k, v, out, dout
 * to bf16 for the GEMMs (f32 accumulation); 0 keeps everything f32 (exact FP32 GEMMs).
 * `work` is scratch of lt_k_attn_work_bytes(...) bytes for the same (B, T, H, KV, hd, bf16). */
size_t lt_k_attn_work_bytes(int B, int T, int H, int KV, int hd, int bf16);
/* pos (B*T) int32 device positions: row t of a sequence attends to rows t - pos .. t (see
 * lt_backend.h attn_fwd: 0..T-1 is plain causal attention, restarts mark packed examples). */
lt_err_t lt_k_attn_fwd(void *cublas, float *out, float *lse, const float *q, const float *k,
                       const float *v, const int32_t *pos, int B, int T, int H, int KV, int hd,
                       int bf16, void *work, cudaStream_t stream, char *errstr,
                       size_t errstr_size);
lt_err_t lt_k_attn_bwd(void *cublas, float *dq, float *dk, float *dv, const float *dout,
                       const float *q, const float *k, const float *v, const float *out,
                       const float *lse, const int32_t *pos, int B, int T, int H, int KV, int hd,
                       int bf16, void *work, cudaStream_t stream, char *errstr,
                       size_t errstr_size);
/* Attention of each row against a KV cache (sampling); see lt_backend.h attn_cached. */
lt_err_t lt_k_attn_cached(float *out, const float *q, const float *kcache, const float *vcache,
                          const int32_t *seq, const int32_t *pos, int n, int H, int KV, int hd,
                          int max_t, cudaStream_t stream, char *errstr, size_t errstr_size);

/* ---- paged KV cache (lt_k_paged.cu) ------------------------------------------------------ */

/* cache[slot[r], :] = src[r, :]; see lt_backend.h kv_store_paged. */
lt_err_t lt_k_kv_store_paged(float *cache, const float *src, const int32_t *slot, int n,
                             int width, cudaStream_t stream, char *errstr, size_t errstr_size);
/* Attention of each row over its sequence's blocks; see lt_backend.h attn_paged. */
lt_err_t lt_k_attn_paged(float *out, const float *q, const float *kcache, const float *vcache,
                         const int32_t *btab, const int32_t *btab_off, const int32_t *pos, int n,
                         int H, int KV, int hd, int block_tokens, cudaStream_t stream,
                         char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif

#endif
