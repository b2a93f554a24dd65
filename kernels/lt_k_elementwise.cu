/* lt_k_elementwise: scale, axpy, bias add, dropout and the f32 -> bf16 cast that feeds the
 * tensor-core GEMMs. Memory-bound one-liners; grid-stride loops. */
#include "lt_k_common.cuh"
#include "lt_k_dropout.h"
#include "lt_kernels.cuh"

__global__ void lt_k_scale_kernel(float *x, float a, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] *= a;
}

__global__ void lt_k_axpy_kernel(float *y, float a, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] += a * x[i];
}

__global__ void lt_k_bias_add_kernel(float *y, const float *b, size_t rows, size_t cols) {
  size_t n = rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] += b[i % cols];
}

__global__ void lt_k_dropout_kernel(float *out, const float *in, size_t n, float p,
                                    uint64_t seed) {
  float inv = 1.0f / (1.0f - p);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    out[i] = lt_backend_dropout_keep(seed, i, p) ? in[i] * inv : 0.0f;
}

__global__ void lt_k_cast_bf16_kernel(__nv_bfloat16 *dst, long ldd, const float *src, long lds,
                                      int rows, int cols) {
  size_t n = (size_t)rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t r = i / cols, c = i % cols;
    dst[r * ldd + c] = __float2bfloat16_rn(src[r * lds + c]);
  }
}

extern "C" lt_err_t lt_k_scale(float *x, float a, size_t n, cudaStream_t stream, char *errstr,
                               size_t errstr_size) {
  if (n == 0) return LT_OK;
  lt_k_scale_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(x, a, n);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_axpy(float *y, float a, const float *x, size_t n, cudaStream_t stream,
                              char *errstr, size_t errstr_size) {
  if (n == 0) return LT_OK;
  lt_k_axpy_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(y, a, x, n);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_bias_add(float *y, const float *b, int rows, int cols,
                                  cudaStream_t stream, char *errstr, size_t errstr_size) {
  size_t n = (size_t)rows * cols;
  if (n == 0) return LT_OK;
  lt_k_bias_add_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
      y, b, (size_t)rows, (size_t)cols);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_dropout(float *out, const float *in, size_t n, float p, uint64_t seed,
                                 cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (n == 0) return LT_OK;
  if (p <= 0.0f) {
    if (out != in)
      LT_CUDA_TRY(cudaMemcpyAsync(out, in, n * sizeof(float), cudaMemcpyDeviceToDevice, stream),
                  errstr, errstr_size);
    return LT_OK;
  }
  lt_k_dropout_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(out, in, n, p,
                                                                               seed);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_cast_bf16(void *dst_bf16, long ld_dst, const float *src, long ld_src,
                                   int rows, int cols, cudaStream_t stream, char *errstr,
                                   size_t errstr_size) {
  size_t n = (size_t)rows * cols;
  if (n == 0) return LT_OK;
  lt_k_cast_bf16_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
      (__nv_bfloat16 *)dst_bf16, ld_dst, src, ld_src, rows, cols);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
