/* lt_k_attention: causal grouped-query attention for training (forward and backward) and
 * attention against a KV cache for sampling.
 *
 * Training attention runs its four products per (sequence, head) as cuBLAS batched GEMMs, so
 * they use tensor cores in bf16 mode (f32 accumulation) and exact FP32 in f32 mode; the
 * softmax and its gradient are kernels here. Query head h reads kv head h / (H/KV) through the
 * GEMMs' pointer arrays, so K and V are never copied per head. The probabilities are not kept:
 * the forward pass saves the log-sum-exp per row (B*H*T floats) and the backward pass
 * recomputes S = QK^T from it, as flash attention does; the T x T scratch lives in `work`, a
 * chunk of sequences at a time.
 *
 * cuBLAS is column-major: a row-major (rows x cols, ld) matrix is the column-major transpose
 * with the same ld, which is how every product below is phrased. */
#include <cublas_v2.h>
#include <math.h>

#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

/* Cap on the T x T scratch of one chunk (S in f32 plus P), in bytes. */
#define LT_K_ATTN_SCRATCH_CAP ((size_t)2 << 30)
#define LT_K_ATTN_THREADS 256

/* Where matrix z = b*H + h of a batched GEMM starts: base + b*seq + (h/div)*head elements. */
typedef struct {
  const char *base;
  long seq, head; /* strides in elements */
  int div, esz;   /* head divisor (H/KV for K and V, else 1), element size in bytes */
} lt_k_ptrspec;

__global__ void lt_k_attn_ptrs_kernel(const void **a, const void **b, void **c, lt_k_ptrspec sa,
                                      lt_k_ptrspec sb, lt_k_ptrspec sc, int count, int H) {
  int z = blockIdx.x * blockDim.x + threadIdx.x;
  if (z >= count) return;
  int s = z / H, h = z % H;
  a[z] = sa.base + ((size_t)s * sa.seq + (size_t)(h / sa.div) * sa.head) * sa.esz;
  b[z] = sb.base + ((size_t)s * sb.seq + (size_t)(h / sb.div) * sb.head) * sb.esz;
  c[z] = (void *)(sc.base + ((size_t)s * sc.seq + (size_t)(h / sc.div) * sc.head) * sc.esz);
}

static lt_k_ptrspec lt_k_spec(const void *base, long seq, long head, int div, int esz) {
  lt_k_ptrspec s;
  s.base = (const char *)base;
  s.seq = seq;
  s.head = head;
  s.div = div;
  s.esz = esz;
  return s;
}

typedef struct {
  cublasHandle_t h;
  cudaStream_t stream;
  void **ptrs; /* 3 * count pointers of device scratch */
  int count, H;
  char *errstr;
  size_t errstr_size;
} lt_k_gemm_ctx;

/* C_z = alpha * op(A_z) op(B_z) + beta * C_z (column-major) for every z in the chunk. */
static lt_err_t lt_k_gemm(lt_k_gemm_ctx *g, cublasOperation_t ta, cublasOperation_t tb, int m,
                          int n, int k, float alpha, lt_k_ptrspec a, cudaDataType_t at, int lda,
                          lt_k_ptrspec b, cudaDataType_t bt, int ldb, lt_k_ptrspec c,
                          cudaDataType_t ct, int ldc) {
  const void **pa = (const void **)g->ptrs, **pb = (const void **)g->ptrs + g->count;
  void **pc = g->ptrs + 2 * g->count;
  lt_k_attn_ptrs_kernel<<<(g->count + 127) / 128, 128, 0, g->stream>>>(pa, pb, pc, a, b, c,
                                                                      g->count, g->H);
  LT_CUDA_LAUNCHED(g->errstr, g->errstr_size);
  float beta = 0.0f;
  LT_CUBLAS_TRY(cublasGemmBatchedEx(g->h, ta, tb, m, n, k, &alpha, pa, at, lda, pb, bt, ldb,
                                    &beta, pc, ct, ldc, g->count, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                g->errstr, g->errstr_size);
  return LT_OK;
}

__device__ __forceinline__ void lt_k_st(float *p, float v) { *p = v; }
__device__ __forceinline__ void lt_k_st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ float lt_k_ld(const float *p) { return *p; }
__device__ __forceinline__ float lt_k_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

/* Row i of the (chunk, head) score matrix: P = softmax over j0 <= j <= i, j0 = i - pos of the
 * row (its example's first row); zeros elsewhere. save_lse: forward (compute and store lse);
 * else backward (read lse, recompute P). The backward's dsoftmax needs no mask: P is 0 there. */
template <typename PT>
__global__ void lt_k_attn_softmax_kernel(PT *P, const float *S, float *lse, const int32_t *pos,
                                         int T, int H, int b0, int save_lse) {
  __shared__ float sh[32];
  size_t row = blockIdx.x; /* (bb*H + h)*T + i */
  int i = (int)(row % T);
  size_t zh = row / T; /* bb*H + h */
  size_t lrow = ((size_t)b0 * H + zh) * T + i;
  int j0 = i - pos[((size_t)b0 + zh / H) * T + i];
  const float *s = S + row * T;
  PT *p = P + row * T;
  float z;
  if (save_lse) {
    float mx = -INFINITY;
    for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, s[j]);
    mx = lt_k_block_max(mx, sh);
    float sum = 0.0f;
    for (int j = j0 + threadIdx.x; j <= i; j += blockDim.x) sum += expf(s[j] - mx);
    sum = lt_k_block_sum(sum, sh);
    z = mx + logf(sum);
    if (threadIdx.x == 0) lse[lrow] = z;
  } else {
    z = lse[lrow];
  }
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    lt_k_st(&p[j], j >= j0 && j <= i ? expf(s[j] - z) : 0.0f);
}

/* dS = P * (dP - D), D = sum_d dout*out of this row and head; written over P. */
template <typename PT>
__global__ void lt_k_attn_dsoftmax_kernel(PT *P, const float *dP, const float *dout,
                                          const float *out, int T, int H, int hd, int b0) {
  __shared__ float sh[32];
  size_t row = blockIdx.x;
  int i = (int)(row % T);
  size_t zh = row / T;
  int h = (int)(zh % H), bb = (int)(zh / H);
  size_t orow = ((size_t)(b0 + bb) * T + i) * H * hd + (size_t)h * hd;
  float d = 0.0f;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) d += dout[orow + e] * out[orow + e];
  d = lt_k_block_sum(d, sh);
  PT *p = P + row * T;
  const float *dp = dP + row * T;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    lt_k_st(&p[j], j <= i ? lt_k_ld(&p[j]) * (dp[j] - d) : 0.0f);
}

/* dst (rows of the chunk, KV*hd) = sum over the group's query heads of src (rows, H*hd),
 * heads in increasing order. */
__global__ void lt_k_attn_group_sum_kernel(float *dst, const float *src, size_t rows, int H,
                                           int KV, int hd) {
  int g = H / KV;
  size_t total = rows * KV * hd;
  for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < total;
       x += (size_t)gridDim.x * blockDim.x) {
    size_t r = x / ((size_t)KV * hd);
    int c = (int)(x % ((size_t)KV * hd));
    int j = c / hd, e = c % hd;
    const float *s = src + r * H * hd + (size_t)j * g * hd + e;
    float acc = 0.0f;
    for (int i = 0; i < g; i++) acc += s[(size_t)i * hd];
    dst[x] = acc;
  }
}

/* ---- workspace --------------------------------------------------------------------------- */

typedef struct {
  int nb;            /* sequences per chunk */
  void **ptrs;       /* 3 * nb*H pointers */
  float *S;          /* nb*H*T*T */
  void *P;           /* nb*H*T*T of f32 or bf16 */
  float *dkh, *dvh;  /* nb*T*H*hd each */
  void *qb, *kb, *vb, *ob, *dob; /* bf16 copies (bf16 mode) */
} lt_k_attn_ws;

static size_t lt_k_align(size_t x) { return (x + 255) & ~(size_t)255; }

static size_t lt_k_attn_layout(int B, int T, int H, int KV, int hd, int bf16, char *base,
                               lt_k_attn_ws *ws) {
  size_t esz = bf16 ? 2 : 4;
  size_t per_seq = (size_t)H * T * T * (4 + esz);
  int nb = (int)(LT_K_ATTN_SCRATCH_CAP / (per_seq ? per_seq : 1));
  if (nb < 1) nb = 1;
  if (nb > B) nb = B;
  size_t N = (size_t)B * T, off = 0;
  lt_k_attn_ws w;
#define LT_K_TAKE(field, type, bytes)                                                          \
  w.field = (type)(base ? base + off : NULL);                                                  \
  off += lt_k_align(bytes)
  w.nb = nb;
  LT_K_TAKE(ptrs, void **, 3 * sizeof(void *) * (size_t)nb * H);
  LT_K_TAKE(S, float *, 4 * (size_t)nb * H * T * T);
  LT_K_TAKE(P, void *, esz * (size_t)nb * H * T * T);
  LT_K_TAKE(dkh, float *, 4 * (size_t)nb * T * H * hd);
  LT_K_TAKE(dvh, float *, 4 * (size_t)nb * T * H * hd);
  size_t bq = bf16 ? 2 * N * H * hd : 0, bk = bf16 ? 2 * N * KV * hd : 0;
  LT_K_TAKE(qb, void *, bq);
  LT_K_TAKE(kb, void *, bk);
  LT_K_TAKE(vb, void *, bk);
  LT_K_TAKE(ob, void *, bq);
  LT_K_TAKE(dob, void *, bq);
#undef LT_K_TAKE
  if (ws) *ws = w;
  return off;
}

extern "C" size_t lt_k_attn_work_bytes(int B, int T, int H, int KV, int hd, int bf16) {
  return lt_k_attn_layout(B, T, H, KV, hd, bf16, NULL, NULL);
}

static lt_err_t lt_k_attn_check(int B, int T, int H, int KV, int hd, char *errstr,
                                size_t errstr_size) {
  if (B < 0 || T < 0 || H <= 0 || KV <= 0 || hd <= 0 || H % KV != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "attention: bad shape B=%d T=%d H=%d KV=%d hd=%d (H must be a multiple of KV)",
                   B, T, H, KV, hd);
  return LT_OK;
}

/* What both passes set up per call: the workspace, the GEMMs' input type, the strides of one
 * sequence, and the inputs the GEMMs read: q, k, v (and dout, backward only) as given, or their
 * bf16 copies in the workspace. */
struct lt_k_attn_call {
  lt_k_attn_ws w;
  int g, esz;
  cudaDataType_t it;
  float scale;
  long qs, ks, ss; /* one sequence of q/out/dout, of k/v, of S/P */
  const char *q, *k, *v, *dout;
  int B, H;
  lt_k_gemm_ctx gc; /* count set per chunk */
};

/* Checks the shape and sets c up; an empty batch (B or T 0) is checked only, and the caller
 * returns at once. */
static lt_err_t lt_k_attn_begin(lt_k_attn_call *c, void *cublas, const float *q, const float *k,
                                const float *v, const float *dout, int B, int T, int H, int KV,
                                int hd, int bf16, void *work, cudaStream_t stream, char *errstr,
                                size_t errstr_size) {
  lt_err_t err = lt_k_attn_check(B, T, H, KV, hd, errstr, errstr_size);
  if (err || B == 0 || T == 0) return err;
  lt_k_attn_layout(B, T, H, KV, hd, bf16, (char *)work, &c->w);
  c->B = B;
  c->H = H;
  c->gc = {(cublasHandle_t)cublas, stream, c->w.ptrs, 0, H, errstr, errstr_size};
  c->g = H / KV;
  c->esz = bf16 ? 2 : 4;
  c->it = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  c->scale = 1.0f / sqrtf((float)hd);
  c->qs = (long)T * H * hd;
  c->ks = (long)T * KV * hd;
  c->ss = (long)H * T * T;
  c->q = (const char *)q;
  c->k = (const char *)k;
  c->v = (const char *)v;
  c->dout = (const char *)dout;
  if (!bf16) return LT_OK;
  if ((err = lt_k_cast_bf16(c->w.qb, (long)H * hd, q, (long)H * hd, B * T, H * hd, stream, errstr,
                            errstr_size)) ||
      (err = lt_k_cast_bf16(c->w.kb, (long)KV * hd, k, (long)KV * hd, B * T, KV * hd, stream,
                            errstr, errstr_size)) ||
      (err = lt_k_cast_bf16(c->w.vb, (long)KV * hd, v, (long)KV * hd, B * T, KV * hd, stream,
                            errstr, errstr_size)) ||
      (dout && (err = lt_k_cast_bf16(c->w.dob, (long)H * hd, dout, (long)H * hd, B * T, H * hd,
                                     stream, errstr, errstr_size))))
    return err;
  c->q = (const char *)c->w.qb;
  c->k = (const char *)c->w.kb;
  c->v = (const char *)c->w.vb;
  if (dout) c->dout = (const char *)c->w.dob;
  return LT_OK;
}

/* Sequences b0 .. b0 + nb of a call (as many as the workspace holds): the batched-GEMM context
 * and where their q, k, v and dout start. */
struct lt_k_attn_chunk {
  int b0, nb;
  lt_k_gemm_ctx gc;
  const char *q, *k, *v, *dout;
};

/* Moves ch to the chunk after it (the first when ch is zeroed); false past the last sequence. */
static bool lt_k_attn_next(const lt_k_attn_call *c, lt_k_attn_chunk *ch) {
  int b0 = ch->b0 + ch->nb;
  if (b0 >= c->B) return false;
  int nb = c->B - b0 < c->w.nb ? c->B - b0 : c->w.nb;
  size_t qo = (size_t)b0 * c->qs * c->esz, ko = (size_t)b0 * c->ks * c->esz;
  *ch = {b0, nb, c->gc, c->q + qo, c->k + ko, c->v + ko, c->dout ? c->dout + qo : NULL};
  ch->gc.count = nb * c->H;
  return true;
}

extern "C" lt_err_t lt_k_attn_fwd(void *cublas, float *out, float *lse, const float *q,
                                  const float *k, const float *v, const int32_t *pos, int B, int T,
                                  int H, int KV, int hd, int bf16, void *work, cudaStream_t stream,
                                  char *errstr, size_t errstr_size) {
  lt_k_attn_call c;
  lt_err_t err = lt_k_attn_begin(&c, cublas, q, k, v, NULL, B, T, H, KV, hd, bf16, work, stream,
                                 errstr, errstr_size);
  if (err || B == 0 || T == 0) return err;
  for (lt_k_attn_chunk ch = {}; lt_k_attn_next(&c, &ch);) {
    /* S = scale * Q K^T  (column-major: S^T = K_c^T Q_c) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, c.scale,
                         lt_k_spec(ch.k, c.ks, hd, c.g, c.esz), c.it, KV * hd,
                         lt_k_spec(ch.q, c.qs, hd, 1, c.esz), c.it, H * hd,
                         lt_k_spec(c.w.S, c.ss, (long)T * T, 1, 4), CUDA_R_32F, T)))
      return err;
    if (bf16)
      lt_k_attn_softmax_kernel<__nv_bfloat16><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (__nv_bfloat16 *)c.w.P, c.w.S, lse, pos, T, H, ch.b0, 1);
    else
      lt_k_attn_softmax_kernel<float><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (float *)c.w.P, c.w.S, lse, pos, T, H, ch.b0, 1);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
    /* O = P V  (O^T = V_c P^T) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f,
                         lt_k_spec(ch.v, c.ks, hd, c.g, c.esz), c.it, KV * hd,
                         lt_k_spec(c.w.P, c.ss, (long)T * T, 1, c.esz), c.it, T,
                         lt_k_spec(out + (size_t)ch.b0 * c.qs, c.qs, hd, 1, 4), CUDA_R_32F,
                         H * hd)))
      return err;
  }
  return LT_OK;
}

extern "C" lt_err_t lt_k_attn_bwd(void *cublas, float *dq, float *dk, float *dv,
                                  const float *dout, const float *q, const float *k,
                                  const float *v, const float *out, const float *lse,
                                  const int32_t *pos, int B, int T, int H, int KV, int hd, int bf16,
                                  void *work, cudaStream_t stream, char *errstr,
                                  size_t errstr_size) {
  lt_k_attn_call c;
  lt_err_t err = lt_k_attn_begin(&c, cublas, q, k, v, dout, B, T, H, KV, hd, bf16, work, stream,
                                 errstr, errstr_size);
  if (err || B == 0 || T == 0) return err;
  for (lt_k_attn_chunk ch = {}; lt_k_attn_next(&c, &ch);) {
    lt_k_ptrspec sS = lt_k_spec(c.w.S, c.ss, (long)T * T, 1, 4);
    lt_k_ptrspec sP = lt_k_spec(c.w.P, c.ss, (long)T * T, 1, c.esz);
    lt_k_ptrspec sQ = lt_k_spec(ch.q, c.qs, hd, 1, c.esz);
    lt_k_ptrspec sK = lt_k_spec(ch.k, c.ks, hd, c.g, c.esz);
    lt_k_ptrspec sV = lt_k_spec(ch.v, c.ks, hd, c.g, c.esz);
    lt_k_ptrspec sD = lt_k_spec(ch.dout, c.qs, hd, 1, c.esz);
    /* 1. S again, 2. P from the saved lse */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, c.scale, sK, c.it, KV * hd,
                         sQ, c.it, H * hd, sS, CUDA_R_32F, T)))
      return err;
    if (bf16)
      lt_k_attn_softmax_kernel<__nv_bfloat16><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (__nv_bfloat16 *)c.w.P, c.w.S, (float *)lse, pos, T, H, ch.b0, 0);
    else
      lt_k_attn_softmax_kernel<float><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (float *)c.w.P, c.w.S, (float *)lse, pos, T, H, ch.b0, 0);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
    /* 3. dV_h = P^T dO  (dV^T = dO_c P) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, sD, c.it, H * hd, sP,
                         c.it, T, lt_k_spec(c.w.dvh, c.qs, hd, 1, 4), CUDA_R_32F, H * hd)))
      return err;
    /* 4. dP = dO V^T into S's scratch  (dP^T = V_c^T dO_c) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, sV, c.it, KV * hd, sD,
                         c.it, H * hd, sS, CUDA_R_32F, T)))
      return err;
    /* 5. dS = P * (dP - rowsum(dO * O)) over P */
    if (bf16)
      lt_k_attn_dsoftmax_kernel<__nv_bfloat16><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (__nv_bfloat16 *)c.w.P, c.w.S, dout, out, T, H, hd, ch.b0);
    else
      lt_k_attn_dsoftmax_kernel<float><<<ch.nb * H * T, LT_K_ATTN_THREADS, 0, stream>>>(
          (float *)c.w.P, c.w.S, dout, out, T, H, hd, ch.b0);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
    /* 6. dQ = scale * dS K  (dQ^T = K_c dS^T) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, c.scale, sK, c.it, KV * hd,
                         sP, c.it, T, lt_k_spec(dq + (size_t)ch.b0 * c.qs, c.qs, hd, 1, 4),
                         CUDA_R_32F, H * hd)))
      return err;
    /* 7. dK_h = scale * dS^T Q  (dK^T = Q_c dS) */
    if ((err = lt_k_gemm(&ch.gc, CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, c.scale, sQ, c.it, H * hd,
                         sP, c.it, T, lt_k_spec(c.w.dkh, c.qs, hd, 1, 4), CUDA_R_32F, H * hd)))
      return err;
    /* 8. sum the query heads of each group into the kv head's gradient */
    size_t rows = (size_t)ch.nb * T, tot = rows * KV * hd;
    lt_k_attn_group_sum_kernel<<<lt_k_grid(tot, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
        dk + (size_t)ch.b0 * c.ks, c.w.dkh, rows, H, KV, hd);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
    lt_k_attn_group_sum_kernel<<<lt_k_grid(tot, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
        dv + (size_t)ch.b0 * c.ks, c.w.dvh, rows, H, KV, hd);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
  }
  return LT_OK;
}

/* ---- KV-cache attention (sampling) ------------------------------------------------------- */

#define LT_K_CACHED_THREADS 128
#define LT_K_CACHED_MAX_HD 512

/* One block per (row, head). Pass 1: max and normaliser over positions 0..pos[r]; pass 2:
 * chunks of positions, probabilities in shared memory, each thread owns output dims. Fixed
 * order, and nothing depends on the other rows: batch invariant. */
__global__ void lt_k_attn_cached_kernel(float *out, const float *q, const float *kc,
                                        const float *vc, const int32_t *seq,
                                        const int32_t *pos, int H, int KV, int hd, int max_t,
                                        float scale) {
  __shared__ float sh[32];
  __shared__ float qs[LT_K_CACHED_MAX_HD];
  __shared__ float pr[LT_K_CACHED_THREADS];
  int r = blockIdx.x / H, h = blockIdx.x % H, j = h / (H / KV);
  int np = pos[r] + 1;
  size_t width = (size_t)KV * hd;
  const float *kb = kc + (size_t)seq[r] * max_t * width + (size_t)j * hd;
  const float *vb = vc + (size_t)seq[r] * max_t * width + (size_t)j * hd;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) qs[e] = q[((size_t)r * H + h) * hd + e];
  __syncthreads();
  float m = -INFINITY, l = 0.0f;
  for (int p = threadIdx.x; p < np; p += blockDim.x) {
    const float *kr = kb + (size_t)p * width;
    float s = 0.0f;
    for (int e = 0; e < hd; e++) s += qs[e] * kr[e];
    s *= scale;
    float nm = fmaxf(m, s);
    l = l * expf(m - nm) + expf(s - nm);
    m = nm;
  }
  float M = lt_k_block_max(m, sh);
  float L = lt_k_block_sum(m == -INFINITY ? 0.0f : l * expf(m - M), sh);
  float acc[LT_K_CACHED_MAX_HD / LT_K_CACHED_THREADS];
  for (int a = 0; a < LT_K_CACHED_MAX_HD / LT_K_CACHED_THREADS; a++) acc[a] = 0.0f;
  for (int p0 = 0; p0 < np; p0 += blockDim.x) {
    int p = p0 + threadIdx.x;
    __syncthreads();
    if (p < np) {
      const float *kr = kb + (size_t)p * width;
      float s = 0.0f;
      for (int e = 0; e < hd; e++) s += qs[e] * kr[e];
      pr[threadIdx.x] = expf(s * scale - M) / L;
    }
    __syncthreads();
    int cnt = np - p0 < (int)blockDim.x ? np - p0 : (int)blockDim.x;
    for (int a = 0, e = threadIdx.x; e < hd; a++, e += blockDim.x)
      for (int t = 0; t < cnt; t++) acc[a] += pr[t] * vb[(size_t)(p0 + t) * width + e];
  }
  for (int a = 0, e = threadIdx.x; e < hd; a++, e += blockDim.x)
    out[((size_t)r * H + h) * hd + e] = acc[a];
}

extern "C" lt_err_t lt_k_attn_cached(float *out, const float *q, const float *kcache,
                                     const float *vcache, const int32_t *seq, const int32_t *pos,
                                     int n, int H, int KV, int hd, int max_t,
                                     cudaStream_t stream, char *errstr, size_t errstr_size) {
  lt_err_t err = lt_k_attn_check(1, 1, H, KV, hd, errstr, errstr_size);
  if (err) return err;
  if (hd > LT_K_CACHED_MAX_HD)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED,
                   "attn_cached: head dim %d > %d", hd, LT_K_CACHED_MAX_HD);
  if (n <= 0) return LT_OK;
  lt_k_attn_cached_kernel<<<n * H, LT_K_CACHED_THREADS, 0, stream>>>(
      out, q, kcache, vcache, seq, pos, H, KV, hd, max_t, 1.0f / sqrtf((float)hd));
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
