/* lt_backend_cuda: the cuda backend (lt_backend.h) on cuBLAS and the kernels in kernels/, and
 * the NCCL communicator for data parallelism across the GPUs of one node.
 *
 * One stream and one cuBLAS handle per backend. Device buffers are tracked so that free()
 * knows their size and scrubs them, and destroy() scrubs and frees whatever is left (docs/DESIGN.md
 * §4.7: nothing of a tenant stays in GPU memory). Scratch (bf16 casts, attention) grows on
 * demand during the first step and is then reused: no allocation per step after warm-up. */
#include "lt_backend_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "lt_cuda_check.cuh"
#include "lt_kernels.cuh"

typedef struct {
  void *p;
  size_t bytes;
  void *bf16; /* map_const shadow, or NULL */
  size_t n;   /* floats, for map_const entries */
  int is_const;
  /* A weight kept in bf16 alone (bf16 mode, at least bf16_min floats): p is not device memory
   * but a reserved, inaccessible host range of n floats (the weight's name: unique, and any
   * kernel handed it faults instead of reading garbage); host is the caller's floats, which
   * copy and download read (map_const's contract keeps them valid). */
  const float *host;
  int grad_f32; /* grad_f32 was asked for this bf16-only weight */
  float *f32;   /* then its floats on the device, made at its first A W product; or NULL */
} lt_cb_buf;

typedef struct {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  int bf16;
  size_t bf16_min;
  lt_err_t err;          /* first recorded failure (sticky) */
  char errbuf[600];
  char tmp[512];
  lt_cb_buf *bufs;
  size_t nbufs, capbufs;
  void *cast;            /* bf16 scratch for matmul operands */
  size_t cast_bytes;
  void *attn;            /* attention scratch */
  size_t attn_bytes;
  double *sum_dev;       /* 1 + lt_k_sumsq_work_doubles() */
} lt_cb_ctx;

static lt_cb_ctx *lt_cb(lt_backend_t *be) { return (lt_cb_ctx *)be->ctx; }

/* Records the first failure; returns 1 when the call failed (or an earlier one did). */
static int lt_cb_rec(lt_cb_ctx *c, lt_err_t err) {
  if (err != LT_OK && c->err == LT_OK) {
    c->err = err;
    snprintf(c->errbuf, sizeof c->errbuf, "cuda backend: %s", c->tmp);
  }
  return c->err != LT_OK;
}
#define LT_CB_REC(c, call) lt_cb_rec((c), (call))
#define LT_CB_CUDA(c, call) \
  lt_cb_rec((c), lt_cuda_check_at((int)(call), #call, __FILE__, __LINE__, (c)->tmp, sizeof (c)->tmp))
#define LT_CB_BLAS(c, call) \
  lt_cb_rec((c), lt_cublas_check_at((int)(call), #call, __FILE__, __LINE__, (c)->tmp, sizeof (c)->tmp))

/* Makes the device current; 0 when the backend is already failed (the call is skipped). */
static int lt_cb_enter(lt_cb_ctx *c) {
  if (c->err != LT_OK) return 0;
  return !LT_CB_CUDA(c, cudaSetDevice(c->device));
}

static lt_cb_buf *lt_cb_find(lt_cb_ctx *c, const void *p) {
  for (size_t i = 0; i < c->nbufs; i++)
    if (c->bufs[i].p == p) return &c->bufs[i];
  return NULL;
}

/* The bf16 shadow holding `p` (a pointer into a mapped weight), or NULL. */
static const void *lt_cb_shadow(lt_cb_ctx *c, const float *p) {
  if (!c->bf16) return NULL;
  for (size_t i = 0; i < c->nbufs; i++) {
    lt_cb_buf *b = &c->bufs[i];
    if (b->bf16 && p >= (const float *)b->p && p < (const float *)b->p + b->n)
      return (const uint16_t *)b->bf16 + (p - (const float *)b->p);
  }
  return NULL;
}

/* The bf16-only weight whose range holds p, or NULL. */
static const lt_cb_buf *lt_cb_bf16_only(const lt_cb_ctx *c, const void *p) {
  for (size_t i = 0; i < c->nbufs; i++) {
    const lt_cb_buf *b = &c->bufs[i];
    if (b->host && (const float *)p >= (const float *)b->p && (const float *)p < (const float *)b->p + b->n)
      return b;
  }
  return NULL;
}

/* p for a kernel that reads floats; NULL (and the backend failed, saying why) when p lies in a
 * weight kept in bf16 alone: only the products and the embedding read those. */
static const float *lt_cb_f32(lt_cb_ctx *c, const float *p, const char *what) {
  if (!p || !lt_cb_bf16_only(c, p)) return p;
  snprintf(c->tmp, sizeof c->tmp, "%s reads a weight kept in bf16 alone (bf16_min_elems is too small for it)", what);
  lt_cb_rec(c, LT_ERR_INTERNAL);
  return NULL;
}

static int lt_cb_track(lt_cb_ctx *c, lt_cb_buf b) {
  if (c->nbufs == c->capbufs) {
    size_t cap = c->capbufs ? 2 * c->capbufs : 64;
    lt_cb_buf *nb = realloc(c->bufs, cap * sizeof *nb);
    if (!nb) return -1;
    c->bufs = nb;
    c->capbufs = cap;
  }
  c->bufs[c->nbufs++] = b;
  return 0;
}

/* Scrubs, waits, frees. */
static void lt_cb_release(lt_cb_ctx *c, void *p, size_t bytes) {
  if (!p) return;
  cudaMemsetAsync(p, 0, bytes, c->stream);
  cudaStreamSynchronize(c->stream);
  cudaFree(p);
}

static int lt_cb_scratch(lt_cb_ctx *c, void **p, size_t *have, size_t need) {
  if (*have >= need) return 0;
  lt_cb_release(c, *p, *have);
  *p = NULL;
  *have = 0;
  if (LT_CB_CUDA(c, cudaMalloc(p, need))) return -1;
  *have = need;
  return 0;
}

/* Releases what entry b holds: its device memory, its bf16 shadow, a bf16-only weight's range. */
static void lt_cb_buf_release(lt_cb_ctx *c, lt_cb_buf *b) {
  if (b->host) munmap(b->p, b->n * sizeof(float));
  else lt_cb_release(c, b->p, b->bytes ? b->bytes : 64);
  if (b->bf16) lt_cb_release(c, b->bf16, b->n * 2);
  if (b->f32) lt_cb_release(c, b->f32, b->n * sizeof(float));
}

/* ---- lifecycle --------------------------------------------------------------------------- */

static void lt_cb_destroy(lt_backend_t *be) {
  lt_cb_ctx *c = lt_cb(be);
  cudaSetDevice(c->device);
  for (size_t i = 0; i < c->nbufs; i++) lt_cb_buf_release(c, &c->bufs[i]);
  free(c->bufs);
  lt_cb_release(c, c->cast, c->cast_bytes);
  lt_cb_release(c, c->attn, c->attn_bytes);
  lt_cb_release(c, c->sum_dev, (1 + lt_k_sumsq_work_doubles()) * sizeof(double));
  if (c->blas) cublasDestroy(c->blas);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
  free(be);
}

static const char *lt_cb_last_error(lt_backend_t *be) { return lt_cb(be)->errbuf; }

/* ---- memory ------------------------------------------------------------------------------ */

static void *lt_cb_alloc(lt_backend_t *be, size_t bytes) {
  lt_cb_ctx *c = lt_cb(be);
  if (!lt_cb_enter(c)) return NULL;
  void *p = NULL;
  size_t real = bytes ? (bytes + 63) & ~(size_t)63 : 64;
  if (LT_CB_CUDA(c, cudaMalloc(&p, real))) return NULL;
  if (LT_CB_CUDA(c, cudaMemsetAsync(p, 0, real, c->stream))) {
    cudaFree(p);
    return NULL;
  }
  lt_cb_buf b = {p, real, NULL, 0, 0, NULL, 0, NULL};
  if (lt_cb_track(c, b)) {
    cudaFree(p);
    snprintf(c->tmp, sizeof c->tmp, "out of host memory tracking a buffer");
    lt_cb_rec(c, LT_ERR_NOMEM);
    return NULL;
  }
  return p;
}

static void lt_cb_untrack_free(lt_cb_ctx *c, const void *p) {
  if (!p) return;
  cudaSetDevice(c->device);
  lt_cb_buf *b = lt_cb_find(c, p);
  if (!b) {
    snprintf(c->tmp, sizeof c->tmp, "free of a pointer this backend did not allocate");
    lt_cb_rec(c, LT_ERR_INTERNAL);
    return;
  }
  lt_cb_buf_release(c, b);
  *b = c->bufs[--c->nbufs];
}

static void lt_cb_free(lt_backend_t *be, void *p) { lt_cb_untrack_free(lt_cb(be), p); }

/* A copy between host and device that has finished when it returns: the host buffer may be
 * reused (upload) or read (download) at once. */
static lt_err_t lt_cb_copy_sync(lt_backend_t *be, void *dst, const void *src, size_t bytes,
                                enum cudaMemcpyKind kind) {
  lt_cb_ctx *c = lt_cb(be);
  if (lt_cb_enter(c) && bytes) LT_CB_CUDA(c, cudaMemcpyAsync(dst, src, bytes, kind, c->stream));
  if (c->err == LT_OK) LT_CB_CUDA(c, cudaStreamSynchronize(c->stream));
  return c->err;
}

static lt_err_t lt_cb_upload(lt_backend_t *be, void *dst, const void *src, size_t bytes) {
  return lt_cb_copy_sync(be, dst, src, bytes, cudaMemcpyHostToDevice);
}

static lt_err_t lt_cb_download(lt_backend_t *be, void *dst, const void *src, size_t bytes) {
  const lt_cb_buf *w = lt_cb_bf16_only(lt_cb(be), src);
  if (w) { /* a weight kept in bf16 alone: its floats are the caller's */
    memcpy(dst, w->host + ((const float *)src - (const float *)w->p), bytes);
    return lt_cb(be)->err;
  }
  return lt_cb_copy_sync(be, dst, src, bytes, cudaMemcpyDeviceToHost);
}

/* bf16 mode, n >= bf16_min: the weight on the device in bf16 alone, cast there in chunks through
 * the matmul scratch (the same rounding as a shadow of a device copy), named by a reserved
 * host range; NULL on failure. */
static const float *lt_cb_map_bf16_only(lt_cb_ctx *c, const float *host, size_t n) {
  void *name = mmap(NULL, n * sizeof(float), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (name == MAP_FAILED) {
    snprintf(c->tmp, sizeof c->tmp, "map_const: no address range for %zu floats", n);
    lt_cb_rec(c, LT_ERR_NOMEM);
    return NULL;
  }
  void *s = NULL;
  size_t chunk = n < ((size_t)1 << 24) ? n : (size_t)1 << 24;
  if (LT_CB_CUDA(c, cudaMalloc(&s, n * 2)) || lt_cb_scratch(c, &c->cast, &c->cast_bytes, chunk * sizeof(float))) {
    if (s) cudaFree(s);
    munmap(name, n * sizeof(float));
    return NULL;
  }
  for (size_t off = 0; off < n && c->err == LT_OK; off += chunk) {
    size_t m = n - off < chunk ? n - off : chunk;
    if (!LT_CB_CUDA(c, cudaMemcpyAsync(c->cast, host + off, m * sizeof(float), cudaMemcpyHostToDevice, c->stream)))
      LT_CB_REC(c, lt_k_cast_bf16((uint16_t *)s + off, 0, c->cast, 0, 1, (int)m, c->stream, c->tmp, sizeof c->tmp));
  }
  lt_cb_buf b = {name, 0, s, n, 1, host, 0, NULL};
  if (c->err != LT_OK || LT_CB_CUDA(c, cudaStreamSynchronize(c->stream)) || lt_cb_track(c, b)) {
    if (c->err == LT_OK) {
      snprintf(c->tmp, sizeof c->tmp, "out of host memory tracking a buffer");
      lt_cb_rec(c, LT_ERR_NOMEM);
    }
    lt_cb_release(c, s, n * 2);
    munmap(name, n * sizeof(float));
    return NULL;
  }
  return name;
}

static const float *lt_cb_map_const(lt_backend_t *be, const float *host, size_t n) {
  lt_cb_ctx *c = lt_cb(be);
  if (c->bf16 && n >= c->bf16_min) return lt_cb_enter(c) ? lt_cb_map_bf16_only(c, host, n) : NULL;
  float *p = lt_cb_alloc(be, n * sizeof(float));
  if (!p) return NULL;
  if (lt_cb_upload(be, p, host, n * sizeof(float)) != LT_OK) return NULL;
  lt_cb_buf *b = lt_cb_find(c, p);
  b->is_const = 1;
  b->n = n;
  return p;
}

/* The LM head's input gradient (dY W) in f32 as on the cpu backend: a bf16-only weight so marked
 * gets its floats on the device at its first A W product (a sampler, which has none, never pays
 * for them), and matmul reads those for that form. */
static void lt_cb_grad_f32(lt_backend_t *be, const float *dev) {
  lt_cb_buf *b = (lt_cb_buf *)lt_cb_bf16_only(lt_cb(be), dev);
  if (b && b->p == dev) b->grad_f32 = 1;
}

/* The floats of bf16-only weight b on the device (grad_f32), made on first use; NULL on failure
 * (recorded). */
static const float *lt_cb_weight_f32(lt_backend_t *be, lt_cb_buf *b) {
  lt_cb_ctx *c = lt_cb(be);
  if (b->f32) return b->f32;
  float *f = NULL;
  if (LT_CB_CUDA(c, cudaMalloc((void **)&f, b->n * sizeof(float)))) return NULL;
  if (lt_cb_copy_sync(be, f, b->host, b->n * sizeof(float), cudaMemcpyHostToDevice) != LT_OK) {
    cudaFree(f);
    return NULL;
  }
  return b->f32 = f;
}

static void lt_cb_free_const(lt_backend_t *be, const float *dev) {
  lt_cb_untrack_free(lt_cb(be), dev);
}

static void lt_cb_scrub(lt_backend_t *be, void *p, size_t bytes) {
  lt_cb_ctx *c = lt_cb(be);
  if (lt_cb_enter(c) && bytes) LT_CB_CUDA(c, cudaMemsetAsync(p, 0, bytes, c->stream));
}

/* ---- matmul ------------------------------------------------------------------------------ */

/* bf16 copy of a row-major (rows x cols, ld) f32 operand in scratch at byte offset `off`. */
static const void *lt_cb_cast_operand(lt_cb_ctx *c, const float *x, int rows, int cols, int ld,
                                      size_t off) {
  if (LT_CB_REC(c, lt_k_cast_bf16((char *)c->cast + off, cols, x, ld, rows, cols, c->stream,
                                  c->tmp, sizeof c->tmp)))
    return NULL;
  return (char *)c->cast + off;
}

static void lt_cb_matmul(lt_backend_t *be, int trans_a, int trans_b, int M, int N, int K,
                         float alpha, const float *A, int lda, const float *B, int ldb,
                         float beta, float *C, int ldc) {
  lt_cb_ctx *c = lt_cb(be);
  if (!lt_cb_enter(c) || M <= 0 || N <= 0) return;
  cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt_cb_buf *wb = trans_b ? NULL : (lt_cb_buf *)lt_cb_bf16_only(c, B);
  if (wb && wb->grad_f32) { /* dY W on the weight's floats */
    const float *f = lt_cb_weight_f32(be, wb);
    if (!f) return;
    B = f + (B - (const float *)wb->p);
  }
  const void *sa = lt_cb_shadow(c, A), *sb = wb && wb->grad_f32 ? NULL : lt_cb_shadow(c, B);
  if (K > 0 && (sa || sb)) {
    /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
    int ar = trans_a ? K : M, ac = trans_a ? M : K, br = trans_b ? N : K, bc = trans_b ? K : N;
    size_t need = (sa ? 0 : (size_t)ar * ac * 2) + (sb ? 0 : (size_t)br * bc * 2) + 256;
    if (lt_cb_scratch(c, &c->cast, &c->cast_bytes, need)) return;
    int la = lda, lb = ldb;
    size_t off = 0;
    if (!sa) {
      if (!(sa = lt_cb_cast_operand(c, A, ar, ac, lda, 0))) return;
      la = ac;
      off = ((size_t)ar * ac * 2 + 255) & ~(size_t)255;
    }
    if (!sb) {
      if (!(sb = lt_cb_cast_operand(c, B, br, bc, ldb, off))) return;
      lb = bc;
    }
    LT_CB_BLAS(c, cublasGemmEx(c->blas, ob, oa, N, M, K, &alpha, sb, CUDA_R_16BF, lb, sa,
                               CUDA_R_16BF, la, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
    return;
  }
  LT_CB_BLAS(c, cublasSgemm(c->blas, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

/* Batch invariance on the GPU: cuBLAS may pick another algorithm, hence another rounding, for
 * another M, so each row is its own M = 1 product. Decode steps are small; the loop costs
 * launches, not FLOPs. */
static void lt_cb_matmul_rows(lt_backend_t *be, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *W, int ldw, float beta, float *C, int ldc) {
  for (int i = 0; i < M; i++)
    lt_cb_matmul(be, 0, 1, 1, N, K, alpha, A + (size_t)i * lda, lda, W, ldw, beta, C + (size_t)i * ldc, ldc);
}

static void lt_cb_matmul_rows_multi(lt_backend_t *be, int count, const lt_mr_desc_t *d) {
  for (int i = 0; i < count; i++)
    lt_cb_matmul_rows(be, d[i].M, d[i].N, d[i].K, d[i].alpha, d[i].A, d[i].lda, d[i].W, d[i].ldw, d[i].beta, d[i].C,
                      d[i].ldc);
}

static void lt_cb_matmul_strided(lt_backend_t *be, int trans_a, int trans_b, int M, int N, int K,
                                 float alpha, const float *A, int lda, long stride_a,
                                 const float *B, int ldb, long stride_b, float beta, float *C,
                                 int ldc, long stride_c, int batch) {
  lt_cb_ctx *c = lt_cb(be);
  if (!lt_cb_enter(c) || M <= 0 || N <= 0 || batch <= 0 || !lt_cb_f32(c, A, "matmul_strided") ||
      !lt_cb_f32(c, B, "matmul_strided"))
    return;
  cublasOperation_t oa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t ob = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  LT_CB_BLAS(c, cublasSgemmStridedBatched(c->blas, ob, oa, N, M, K, &alpha, B, ldb, stride_b, A,
                                          lda, stride_a, &beta, C, ldc, stride_c, batch));
}

/* ---- elementwise and small ops ------------------------------------------------------------ */

#define LT_CB_K(be, call)                                                                       \
  do {                                                                                         \
    lt_cb_ctx *c_ = lt_cb(be);                                                                 \
    if (lt_cb_enter(c_)) LT_CB_REC(c_, call);                                                  \
  } while (0)
#define LT_CB_S lt_cb(be)->stream, lt_cb(be)->tmp, sizeof lt_cb(be)->tmp

static void lt_cb_zero(lt_backend_t *be, float *x, size_t n) { lt_cb_scrub(be, x, n * 4); }

static void lt_cb_copy(lt_backend_t *be, float *dst, const float *src, size_t n) {
  lt_cb_ctx *c = lt_cb(be);
  const lt_cb_buf *w = lt_cb_bf16_only(c, src);
  if (w && lt_cb_enter(c) && n) { /* from the caller's floats of a weight kept in bf16 alone */
    lt_cb_copy_sync(be, dst, w->host + (src - (const float *)w->p), n * 4, cudaMemcpyHostToDevice);
    return;
  }
  if (lt_cb_enter(c) && n)
    LT_CB_CUDA(c, cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice, c->stream));
}

static void lt_cb_scale(lt_backend_t *be, float *x, float a, size_t n) {
  LT_CB_K(be, lt_k_scale(x, a, n, LT_CB_S));
}

static void lt_cb_axpy(lt_backend_t *be, float *y, float a, const float *x, size_t n) {
  LT_CB_K(be, lt_k_axpy(y, a, x, n, LT_CB_S));
}

static double lt_cb_sumsq(lt_backend_t *be, const float *x, size_t n) {
  lt_cb_ctx *c = lt_cb(be);
  double r = 0.0;
  if (!lt_cb_enter(c)) return 0.0;
  if (LT_CB_REC(c, lt_k_sumsq(c->sum_dev, c->sum_dev + 1, x, n, LT_CB_S))) return 0.0;
  if (lt_cb_download(be, &r, c->sum_dev, sizeof r) != LT_OK) return 0.0;
  return r;
}

static void lt_cb_bias_add(lt_backend_t *be, float *y, const float *b, int rows, int cols) {
  if ((b = lt_cb_f32(lt_cb(be), b, "bias_add"))) LT_CB_K(be, lt_k_bias_add(y, b, rows, cols, LT_CB_S));
}

static void lt_cb_bias_bwd(lt_backend_t *be, float *db, const float *dy, int rows, int cols) {
  LT_CB_K(be, lt_k_bias_bwd(db, dy, rows, cols, LT_CB_S));
}

static void lt_cb_dropout(lt_backend_t *be, float *out, const float *in, size_t n, float p,
                          uint64_t seed) {
  LT_CB_K(be, lt_k_dropout(out, in, n, p, seed, LT_CB_S));
}

static void lt_cb_embed_fwd(lt_backend_t *be, float *out, const float *table,
                            const int32_t *tokens, int N, int D) {
  const void *h = lt_cb_bf16_only(lt_cb(be), table) ? lt_cb_shadow(lt_cb(be), table) : NULL;
  if (h) LT_CB_K(be, lt_k_embed_fwd_bf16(out, h, tokens, N, D, LT_CB_S));
  else LT_CB_K(be, lt_k_embed_fwd(out, table, tokens, N, D, LT_CB_S));
}

static void lt_cb_embed_bwd(lt_backend_t *be, float *dtable, const float *dout,
                            const int32_t *tokens, int N, int D) {
  LT_CB_K(be, lt_k_embed_bwd(dtable, dout, tokens, N, D, LT_CB_S));
}

static void lt_cb_rmsnorm_fwd(lt_backend_t *be, float *out, float *rstd, const float *x,
                              const float *w, int N, int D, float eps) {
  if ((w = lt_cb_f32(lt_cb(be), w, "rmsnorm"))) LT_CB_K(be, lt_k_rmsnorm_fwd(out, rstd, x, w, N, D, eps, LT_CB_S));
}

static void lt_cb_rmsnorm_bwd(lt_backend_t *be, float *dx, float *dw, const float *dout,
                              const float *x, const float *w, const float *rstd, int N, int D) {
  if ((w = lt_cb_f32(lt_cb(be), w, "rmsnorm"))) LT_CB_K(be, lt_k_rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, D, LT_CB_S));
}

static void lt_cb_rope(lt_backend_t *be, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int N, int nh, int hd, int inverse) {
  LT_CB_K(be, lt_k_rope(x, cos_tab, sin_tab, pos, N, nh, hd, inverse, LT_CB_S));
}

static size_t lt_cb_attn_state_floats(lt_backend_t *be, int B, int T, int H) {
  return (size_t)B * T * H; /* log-sum-exp per row: P is recomputed in the backward pass */
}

static void lt_cb_attn_fwd(lt_backend_t *be, float *out, float *state, const float *q,
                           const float *k, const float *v, const int32_t *pos, int B, int T, int H,
                           int KV, int hd) {
  lt_cb_ctx *c = lt_cb(be);
  if (!lt_cb_enter(c)) return;
  if (H <= 0 || KV <= 0 || H % KV) { /* let the launcher explain */
    LT_CB_REC(c, lt_k_attn_fwd(c->blas, out, state, q, k, v, pos, B, T, H, KV, hd, c->bf16, NULL,
                               LT_CB_S));
    return;
  }
  if (lt_cb_scratch(c, &c->attn, &c->attn_bytes, lt_k_attn_work_bytes(B, T, H, KV, hd, c->bf16)))
    return;
  LT_CB_REC(c, lt_k_attn_fwd(c->blas, out, state, q, k, v, pos, B, T, H, KV, hd, c->bf16, c->attn,
                             LT_CB_S));
}

static void lt_cb_attn_bwd(lt_backend_t *be, float *dq, float *dk, float *dv, const float *dout,
                           const float *q, const float *k, const float *v, const float *out,
                           const float *state, const int32_t *pos, int B, int T, int H, int KV,
                           int hd) {
  lt_cb_ctx *c = lt_cb(be);
  if (!lt_cb_enter(c)) return;
  if (H <= 0 || KV <= 0 || H % KV) {
    LT_CB_REC(c, lt_k_attn_bwd(c->blas, dq, dk, dv, dout, q, k, v, out, state, pos, B, T, H, KV,
                               hd, c->bf16, NULL, LT_CB_S));
    return;
  }
  if (lt_cb_scratch(c, &c->attn, &c->attn_bytes, lt_k_attn_work_bytes(B, T, H, KV, hd, c->bf16)))
    return;
  LT_CB_REC(c, lt_k_attn_bwd(c->blas, dq, dk, dv, dout, q, k, v, out, state, pos, B, T, H, KV,
                             hd, c->bf16, c->attn, LT_CB_S));
}

static void lt_cb_kv_store(lt_backend_t *be, float *cache, const float *src, const int32_t *seq,
                           const int32_t *pos, int n, int width, int max_t) {
  LT_CB_K(be, lt_k_kv_store(cache, src, seq, pos, n, width, max_t, LT_CB_S));
}

static void lt_cb_attn_cached(lt_backend_t *be, float *out, const float *q, const float *kcache,
                              const float *vcache, const int32_t *seq, const int32_t *pos, int n,
                              int H, int KV, int hd, int max_t) {
  LT_CB_K(be, lt_k_attn_cached(out, q, kcache, vcache, seq, pos, n, H, KV, hd, max_t, LT_CB_S));
}

static void lt_cb_kv_store_paged(lt_backend_t *be, float *cache, const float *src,
                                 const int32_t *slot, int n, int width) {
  LT_CB_K(be, lt_k_kv_store_paged(cache, src, slot, n, width, LT_CB_S));
}

static void lt_cb_attn_paged(lt_backend_t *be, float *out, const float *q, const float *kcache,
                             const float *vcache, const int32_t *btab, const int32_t *btab_off,
                             const int32_t *pos, int n, int H, int KV, int hd, int block_tokens) {
  LT_CB_K(be, lt_k_attn_paged(out, q, kcache, vcache, btab, btab_off, pos, n, H, KV, hd,
                              block_tokens, LT_CB_S));
}

static void lt_cb_swiglu_fwd(lt_backend_t *be, float *h, const float *g, const float *u,
                             size_t n) {
  LT_CB_K(be, lt_k_swiglu_fwd(h, g, u, n, LT_CB_S));
}

static void lt_cb_swiglu_bwd(lt_backend_t *be, float *dg, float *du, const float *dh,
                             const float *g, const float *u, size_t n) {
  LT_CB_K(be, lt_k_swiglu_bwd(dg, du, dh, g, u, n, LT_CB_S));
}

static void lt_cb_ce_fwd(lt_backend_t *be, float *logp, float *lse, const float *logits,
                         const int32_t *targets, int N, int V) {
  LT_CB_K(be, lt_k_ce_fwd(logp, lse, logits, targets, N, V, LT_CB_S));
}

static void lt_cb_ce_bwd(lt_backend_t *be, float *logits, const float *lse,
                         const int32_t *targets, const float *coef, int N, int V) {
  LT_CB_K(be, lt_k_ce_bwd(logits, lse, targets, coef, N, V, LT_CB_S));
}

static void lt_cb_adamw(lt_backend_t *be, float *p, const float *grad, float *m, float *v,
                        size_t n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, float grad_scale, long step) {
  LT_CB_K(be, lt_k_adamw(p, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step,
                         LT_CB_S));
}

/* ---- construction ------------------------------------------------------------------------ */

lt_err_t lt_cuda_device_count(int *count, char *errstr, size_t errstr_size) {
  *count = 0;
  int n = 0;
  LT_CUDA_TRY(cudaGetDeviceCount(&n), errstr, errstr_size);
  if (n <= 0) return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE, "no CUDA device present");
  *count = n;
  return LT_OK;
}

lt_err_t lt_cuda_devices(lt_cuda_device_t *out, int max, int *n, char *errstr, size_t errstr_size) {
  lt_err_t err = lt_cuda_device_count(n, errstr, errstr_size);
  for (int i = 0; !err && i < *n && i < max; i++) {
    struct cudaDeviceProp p;
    LT_CUDA_TRY(cudaGetDeviceProperties(&p, i), errstr, errstr_size);
    out[i] = (lt_cuda_device_t){.index = i, .memory_bytes = p.totalGlobalMem, .cc_major = p.major,
                                .cc_minor = p.minor};
    snprintf(out[i].name, sizeof out[i].name, "%.95s", p.name);
  }
  return err;
}

lt_err_t lt_backend_cuda_new_opts(int device, const lt_cuda_opts_t *opts, lt_backend_t **out,
                                  char *errstr, size_t errstr_size) {
  *out = NULL;
  int n = 0;
  lt_err_t err = lt_cuda_device_count(&n, errstr, errstr_size);
  if (err) return err;
  if (device < 0 || device >= n)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "cuda device %d: only %d present",
                   device, n);
  lt_backend_t *be = calloc(1, sizeof *be);
  lt_cb_ctx *c = calloc(1, sizeof *c);
  if (!be || !c) {
    free(be);
    free(c);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cuda backend: out of host memory");
  }
  c->device = device;
  c->bf16 = opts ? opts->bf16 : 0;
  c->bf16_min = opts && opts->bf16_min_elems ? opts->bf16_min_elems : 65536;
  be->name = "cuda";
  be->ctx = c;
  be->destroy = lt_cb_destroy;
  be->last_error = lt_cb_last_error;
  be->alloc = lt_cb_alloc;
  be->free = lt_cb_free;
  be->upload = lt_cb_upload;
  be->download = lt_cb_download;
  be->map_const = lt_cb_map_const;
  be->free_const = lt_cb_free_const;
  be->grad_f32 = lt_cb_grad_f32;
  be->scrub = lt_cb_scrub;
  be->matmul = lt_cb_matmul;
  be->matmul_strided = lt_cb_matmul_strided;
  be->matmul_rows = lt_cb_matmul_rows;
  be->matmul_rows_multi = lt_cb_matmul_rows_multi;
  be->zero = lt_cb_zero;
  be->copy = lt_cb_copy;
  be->scale = lt_cb_scale;
  be->axpy = lt_cb_axpy;
  be->sumsq = lt_cb_sumsq;
  be->bias_add = lt_cb_bias_add;
  be->bias_bwd = lt_cb_bias_bwd;
  be->dropout = lt_cb_dropout;
  be->embed_fwd = lt_cb_embed_fwd;
  be->embed_bwd = lt_cb_embed_bwd;
  be->rmsnorm_fwd = lt_cb_rmsnorm_fwd;
  be->rmsnorm_bwd = lt_cb_rmsnorm_bwd;
  be->rope = lt_cb_rope;
  be->attn_state_floats = lt_cb_attn_state_floats;
  be->attn_fwd = lt_cb_attn_fwd;
  be->attn_bwd = lt_cb_attn_bwd;
  be->kv_store = lt_cb_kv_store;
  be->attn_cached = lt_cb_attn_cached;
  be->kv_store_paged = lt_cb_kv_store_paged;
  be->attn_paged = lt_cb_attn_paged;
  be->swiglu_fwd = lt_cb_swiglu_fwd;
  be->swiglu_bwd = lt_cb_swiglu_bwd;
  be->ce_fwd = lt_cb_ce_fwd;
  be->ce_bwd = lt_cb_ce_bwd;
  be->adamw = lt_cb_adamw;

  if ((err = lt_cuda_check_at(cudaSetDevice(device), "cudaSetDevice", __FILE__, __LINE__, errstr,
                              errstr_size)) ||
      (err = lt_cuda_check_at(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking),
                              "cudaStreamCreate", __FILE__, __LINE__, errstr, errstr_size)) ||
      (err = lt_cublas_check_at(cublasCreate(&c->blas), "cublasCreate", __FILE__, __LINE__,
                                errstr, errstr_size)) ||
      (err = lt_cublas_check_at(cublasSetStream(c->blas, c->stream), "cublasSetStream", __FILE__,
                                __LINE__, errstr, errstr_size)) ||
      /* No TF32: f32 mode must match the cpu backend to f32 rounding. */
      (err = lt_cublas_check_at(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH),
                                "cublasSetMathMode", __FILE__, __LINE__, errstr, errstr_size)) ||
      (err = lt_cuda_check_at(
           cudaMalloc((void **)&c->sum_dev, (1 + lt_k_sumsq_work_doubles()) * sizeof(double)),
           "cudaMalloc", __FILE__, __LINE__, errstr, errstr_size))) {
    lt_cb_destroy(be);
    return err;
  }
  *out = be;
  return LT_OK;
}

lt_err_t lt_backend_cuda_new(int device, lt_backend_t **out, char *errstr, size_t errstr_size) {
  lt_cuda_opts_t o = {0, 0};
  const char *p = getenv("LATHE_CUDA_PRECISION");
  if (p && *p && strcmp(p, "bf16") != 0 && strcmp(p, "f32") != 0) /* not a silent f32 */
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "LATHE_CUDA_PRECISION=\"%.40s\": expected f32 or bf16", p);
  if (p && strcmp(p, "bf16") == 0) o.bf16 = 1;
  return lt_backend_cuda_new_opts(device, &o, out, errstr, errstr_size);
}

/* ---- NCCL ---------------------------------------------------------------------------------- */

struct lt_cuda_comm {
  ncclComm_t comm;
  lt_backend_t *be;
  int nranks;
};

lt_err_t lt_cuda_comm_id(uint8_t id[LT_CUDA_COMM_ID_BYTES], char *errstr, size_t errstr_size) {
  ncclUniqueId u;
  _Static_assert(sizeof u == LT_CUDA_COMM_ID_BYTES, "NCCL unique id size");
  LT_NCCL_TRY(ncclGetUniqueId(&u), errstr, errstr_size);
  memcpy(id, &u, sizeof u);
  return LT_OK;
}

lt_err_t lt_cuda_comm_new(lt_backend_t *be, const uint8_t id[LT_CUDA_COMM_ID_BYTES], int nranks,
                          int rank, lt_cuda_comm_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  if (!be || strcmp(be->name, "cuda") != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "nccl: backend is not cuda");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "nccl: rank %d of %d", rank, nranks);
  lt_cuda_comm_t *c = calloc(1, sizeof *c);
  if (!c) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "nccl: out of host memory");
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  lt_err_t err = lt_cuda_check_at(cudaSetDevice(lt_cb(be)->device), "cudaSetDevice", __FILE__,
                                  __LINE__, errstr, errstr_size);
  if (!err)
    err = lt_nccl_check_at(ncclCommInitRank(&c->comm, nranks, u, rank), "ncclCommInitRank",
                           __FILE__, __LINE__, errstr, errstr_size);
  if (err) {
    free(c);
    return err;
  }
  c->be = be;
  c->nranks = nranks;
  *out = c;
  return LT_OK;
}

lt_err_t lt_cuda_comm_allreduce_mean(lt_cuda_comm_t *comm, float *buf, size_t n, char *errstr,
                                     size_t errstr_size) {
  lt_cb_ctx *c = lt_cb(comm->be);
  if (c->err) return lt_errf(errstr, errstr_size, c->err, "%s", c->errbuf);
  if (n == 0) return LT_OK;
  LT_CUDA_TRY(cudaSetDevice(c->device), errstr, errstr_size);
  LT_NCCL_TRY(ncclAllReduce(buf, buf, n, ncclFloat32, ncclAvg, comm->comm, c->stream), errstr,
              errstr_size);
  return LT_OK;
}

void lt_cuda_comm_destroy(lt_cuda_comm_t *comm) {
  if (!comm) return;
  ncclCommDestroy(comm->comm);
  free(comm);
}
