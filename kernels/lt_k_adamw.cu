/* lt_k_adamw: the AdamW update of torch.optim.AdamW (decoupled weight decay), elementwise on
 * the adapter's parameters and moments. Bias corrections are computed once on the host. */
#include <math.h>

#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

__global__ void lt_k_adamw_kernel(float *p, const float *grad, float *m, float *v, size_t n,
                                  float lr, float b1, float b2, float eps, float wd,
                                  float gscale, float step_size, float bc2_sqrt) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float g = grad[i] * gscale;
    float pi = p[i] * (1.0f - lr * wd);
    float mi = b1 * m[i] + (1.0f - b1) * g;
    float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
  }
}

extern "C" lt_err_t lt_k_adamw(float *p, const float *grad, float *m, float *v, size_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               float grad_scale, long step, cudaStream_t stream, char *errstr,
                               size_t errstr_size) {
  if (n == 0) return LT_OK;
  if (step < 1) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "adamw: step %ld < 1", step);
  double bc1 = 1.0 - pow((double)beta1, (double)step);
  double bc2 = 1.0 - pow((double)beta2, (double)step);
  lt_k_adamw_kernel<<<lt_k_grid(n, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
      p, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, (float)(lr / bc1),
      (float)sqrt(bc2));
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
