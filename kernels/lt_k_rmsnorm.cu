/* lt_k_rmsnorm: HF LlamaRMSNorm forward (y = x * rsqrt(mean(x^2) + eps) * w) and backward.
 * One block per row for the row reductions; the weight gradient walks rows in order per
 * column (deterministic, no atomics). */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

__global__ void lt_k_rmsnorm_fwd_kernel(float *out, float *rstd, const float *x, const float *w,
                                        int D, float eps) {
  __shared__ float sh[32];
  size_t r = blockIdx.x;
  const float *xr = x + r * D;
  float ss = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) ss += xr[c] * xr[c];
  ss = lt_k_block_sum(ss, sh);
  float rs = rsqrtf(ss / (float)D + eps);
  if (threadIdx.x == 0 && rstd) rstd[r] = rs;
  for (int c = threadIdx.x; c < D; c += blockDim.x) out[r * D + c] = xr[c] * rs * w[c];
}

/* dx += r*w*dy - x * r^3 / D * sum(dy*w*x) */
__global__ void lt_k_rmsnorm_bwd_dx_kernel(float *dx, const float *dout, const float *x,
                                           const float *w, const float *rstd, int D) {
  __shared__ float sh[32];
  size_t r = blockIdx.x;
  const float *xr = x + r * D, *dr = dout + r * D;
  float dot = 0.0f;
  for (int c = threadIdx.x; c < D; c += blockDim.x) dot += dr[c] * w[c] * xr[c];
  dot = lt_k_block_sum(dot, sh);
  float rs = rstd[r];
  float k = dot * rs * rs * rs / (float)D;
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    dx[r * D + c] += rs * w[c] * dr[c] - xr[c] * k;
}

__global__ void lt_k_rmsnorm_bwd_dw_kernel(float *dw, const float *dout, const float *x,
                                           const float *rstd, int N, int D) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= D) return;
  float acc = 0.0f;
  for (int r = 0; r < N; r++) acc += dout[(size_t)r * D + c] * x[(size_t)r * D + c] * rstd[r];
  dw[c] += acc;
}

extern "C" lt_err_t lt_k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w,
                                     int N, int D, float eps, cudaStream_t stream, char *errstr,
                                     size_t errstr_size) {
  if (N <= 0 || D <= 0) return LT_OK;
  lt_k_rmsnorm_fwd_kernel<<<N, LT_K_THREADS, 0, stream>>>(out, rstd, x, w, D, eps);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_rmsnorm_bwd(float *dx, float *dw, const float *dout, const float *x,
                                     const float *w, const float *rstd, int N, int D,
                                     cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (N <= 0 || D <= 0) return LT_OK;
  lt_k_rmsnorm_bwd_dx_kernel<<<N, LT_K_THREADS, 0, stream>>>(dx, dout, x, w, rstd, D);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  if (dw) {
    lt_k_rmsnorm_bwd_dw_kernel<<<(D + 127) / 128, 128, 0, stream>>>(dw, dout, x, rstd, N, D);
    LT_CUDA_LAUNCHED(errstr, errstr_size);
  }
  return LT_OK;
}
