/* lt_k_swiglu: the SwiGLU MLP activation h = silu(g) * u and its gradient. */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

__global__ void lt_k_swiglu_fwd_kernel(float *h, const float *g, const float *u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = g[i];
    float sig = 1.0f / (1.0f + expf(-x));
    h[i] = x * sig * u[i];
  }
}

__global__ void lt_k_swiglu_bwd_kernel(float *dg, float *du, const float *dh, const float *g,
                                       const float *u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float x = g[i], d = dh[i];
    float sig = 1.0f / (1.0f + expf(-x));
    float silu = x * sig;
    dg[i] = d * u[i] * sig * (1.0f + x * (1.0f - sig));
    du[i] = d * silu;
  }
}

extern "C" lt_err_t lt_k_swiglu_fwd(float *h, const float *g, const float *u, size_t n,
                                    cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (n == 0) return LT_OK;
  lt_k_swiglu_fwd_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(h, g, u, n);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g,
                                    const float *u, size_t n, cudaStream_t stream, char *errstr,
                                    size_t errstr_size) {
  if (n == 0) return LT_OK;
  lt_k_swiglu_bwd_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(dg, du, dh, g,
                                                                                  u, n);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
