/* lt_k_paged: the paged KV cache of serving (workers/engine/lt_serve.h): storing a step's keys
 * and values into their blocks, and attention of each row over its own sequence's blocks. The
 * attention kernel is lt_k_attn_cached_kernel's with the row of position p looked up in the
 * sequence's block table: same fixed order of positions, nothing read from other rows, so a row's
 * result does not depend on the rest of the step (batch invariance). */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

#define LT_K_PAGED_THREADS 128
#define LT_K_PAGED_MAX_HD 512

__global__ void lt_k_kv_store_paged_kernel(float *cache, const float *src, const int32_t *slot,
                                           int width) {
  int r = blockIdx.x;
  float *dst = cache + (size_t)slot[r] * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[(size_t)r * width + c];
}

extern "C" lt_err_t lt_k_kv_store_paged(float *cache, const float *src, const int32_t *slot,
                                        int n, int width, cudaStream_t stream, char *errstr,
                                        size_t errstr_size) {
  if (n <= 0 || width <= 0) return LT_OK;
  lt_k_kv_store_paged_kernel<<<n, LT_K_THREADS, 0, stream>>>(cache, src, slot, width);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

/* Physical row of position p in a block table. */
__device__ __forceinline__ size_t lt_k_paged_row(const int32_t *bl, int p, int bt) {
  return (size_t)bl[p / bt] * bt + p % bt;
}

/* One block per (row, head). Pass 1: max and normaliser over positions 0..pos[r]; pass 2:
 * chunks of positions, probabilities in shared memory, each thread owns output dims. */
__global__ void lt_k_attn_paged_kernel(float *out, const float *q, const float *kc,
                                       const float *vc, const int32_t *btab,
                                       const int32_t *off, const int32_t *pos, int H, int KV,
                                       int hd, int bt, float scale) {
  __shared__ float sh[32];
  __shared__ float qs[LT_K_PAGED_MAX_HD];
  __shared__ float pr[LT_K_PAGED_THREADS];
  int r = blockIdx.x / H, h = blockIdx.x % H, j = h / (H / KV);
  int np = pos[r] + 1;
  size_t width = (size_t)KV * hd;
  const int32_t *bl = btab + off[r];
  const float *kb = kc + (size_t)j * hd, *vb = vc + (size_t)j * hd;
  for (int e = threadIdx.x; e < hd; e += blockDim.x) qs[e] = q[((size_t)r * H + h) * hd + e];
  __syncthreads();
  float m = -INFINITY, l = 0.0f;
  for (int p = threadIdx.x; p < np; p += blockDim.x) {
    const float *kr = kb + lt_k_paged_row(bl, p, bt) * width;
    float s = 0.0f;
    for (int e = 0; e < hd; e++) s += qs[e] * kr[e];
    s *= scale;
    float nm = fmaxf(m, s);
    l = l * expf(m - nm) + expf(s - nm);
    m = nm;
  }
  float M = lt_k_block_max(m, sh);
  float L = lt_k_block_sum(m == -INFINITY ? 0.0f : l * expf(m - M), sh);
  float acc[LT_K_PAGED_MAX_HD / LT_K_PAGED_THREADS];
  for (int a = 0; a < LT_K_PAGED_MAX_HD / LT_K_PAGED_THREADS; a++) acc[a] = 0.0f;
  for (int p0 = 0; p0 < np; p0 += blockDim.x) {
    int p = p0 + threadIdx.x;
    __syncthreads();
    if (p < np) {
      const float *kr = kb + lt_k_paged_row(bl, p, bt) * width;
      float s = 0.0f;
      for (int e = 0; e < hd; e++) s += qs[e] * kr[e];
      pr[threadIdx.x] = expf(s * scale - M) / L;
    }
    __syncthreads();
    int cnt = np - p0 < (int)blockDim.x ? np - p0 : (int)blockDim.x;
    for (int a = 0, e = threadIdx.x; e < hd; a++, e += blockDim.x)
      for (int t = 0; t < cnt; t++)
        acc[a] += pr[t] * vb[lt_k_paged_row(bl, p0 + t, bt) * width + e];
  }
  for (int a = 0, e = threadIdx.x; e < hd; a++, e += blockDim.x)
    out[((size_t)r * H + h) * hd + e] = acc[a];
}

extern "C" lt_err_t lt_k_attn_paged(float *out, const float *q, const float *kcache,
                                    const float *vcache, const int32_t *btab,
                                    const int32_t *btab_off, const int32_t *pos, int n, int H,
                                    int KV, int hd, int block_tokens, cudaStream_t stream,
                                    char *errstr, size_t errstr_size) {
  if (H <= 0 || KV <= 0 || H % KV || hd <= 0 || block_tokens <= 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "attn_paged: H %d, KV %d, hd %d, block_tokens %d", H, KV, hd, block_tokens);
  if (hd > LT_K_PAGED_MAX_HD)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "attn_paged: head dim %d > %d", hd,
                   LT_K_PAGED_MAX_HD);
  if (n <= 0) return LT_OK;
  lt_k_attn_paged_kernel<<<n * H, LT_K_PAGED_THREADS, 0, stream>>>(
      out, q, kcache, vcache, btab, btab_off, pos, H, KV, hd, block_tokens,
      1.0f / sqrtf((float)hd));
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
