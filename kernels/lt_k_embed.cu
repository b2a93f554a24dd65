/* lt_k_embed: token embedding gather and its gradient scatter, and the KV-cache store used
 * by sampling. The scatter gives each thread one column and walks rows in order, so repeated
 * tokens accumulate without atomics and in the CPU's order. */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

__global__ void lt_k_embed_fwd_kernel(float *out, const float *table, const int32_t *tokens,
                                      int N, int D) {
  int r = blockIdx.x;
  const float *src = table + (size_t)tokens[r] * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) out[(size_t)r * D + c] = src[c];
}

__global__ void lt_k_embed_fwd_bf16_kernel(float *out, const uint16_t *table, const int32_t *tokens,
                                           int N, int D) {
  int r = blockIdx.x;
  const uint16_t *src = table + (size_t)tokens[r] * D;
  for (int c = threadIdx.x; c < D; c += blockDim.x) out[(size_t)r * D + c] = __uint_as_float((uint32_t)src[c] << 16);
}

__global__ void lt_k_embed_bwd_kernel(float *dtable, const float *dout, const int32_t *tokens,
                                      int N, int D) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= D) return;
  for (int r = 0; r < N; r++) dtable[(size_t)tokens[r] * D + c] += dout[(size_t)r * D + c];
}

__global__ void lt_k_kv_store_kernel(float *cache, const float *src, const int32_t *seq,
                                     const int32_t *pos, int width, int max_t) {
  int r = blockIdx.x;
  float *dst = cache + ((size_t)seq[r] * max_t + pos[r]) * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) dst[c] = src[(size_t)r * width + c];
}

extern "C" lt_err_t lt_k_embed_fwd(float *out, const float *table, const int32_t *tokens, int N,
                                   int D, cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (N <= 0 || D <= 0) return LT_OK;
  lt_k_embed_fwd_kernel<<<N, LT_K_THREADS, 0, stream>>>(out, table, tokens, N, D);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_embed_fwd_bf16(float *out, const void *table_bf16, const int32_t *tokens, int N,
                                        int D, cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (N <= 0 || D <= 0) return LT_OK;
  lt_k_embed_fwd_bf16_kernel<<<N, LT_K_THREADS, 0, stream>>>(out, (const uint16_t *)table_bf16, tokens, N, D);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_embed_bwd(float *dtable, const float *dout, const int32_t *tokens,
                                   int N, int D, cudaStream_t stream, char *errstr,
                                   size_t errstr_size) {
  if (N <= 0 || D <= 0) return LT_OK;
  lt_k_embed_bwd_kernel<<<(D + 127) / 128, 128, 0, stream>>>(dtable, dout, tokens, N, D);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_kv_store(float *cache, const float *src, const int32_t *seq,
                                  const int32_t *pos, int n, int width, int max_t,
                                  cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (n <= 0 || width <= 0) return LT_OK;
  lt_k_kv_store_kernel<<<n, LT_K_THREADS, 0, stream>>>(cache, src, seq, pos, width, max_t);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
