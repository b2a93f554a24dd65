/* lt_k_xent: cross-entropy over the vocabulary: log-sum-exp and target log-prob per row, and
 * the in-place logits gradient coef[r] * (onehot - softmax) that any per-token loss
 * (weighted cross-entropy, importance sampling) reduces to. One block per row. */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

#define LT_K_XENT_THREADS 512

__global__ void lt_k_ce_fwd_kernel(float *logp, float *lse, const float *logits,
                                   const int32_t *targets, int V) {
  __shared__ float sh[32];
  size_t r = blockIdx.x;
  const float *l = logits + r * V;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, l[j]);
  mx = lt_k_block_max(mx, sh);
  float s = 0.0f;
  for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(l[j] - mx);
  s = lt_k_block_sum(s, sh);
  if (threadIdx.x == 0) {
    float z = mx + logf(s);
    if (lse) lse[r] = z;
    if (logp) logp[r] = l[targets[r]] - z;
  }
}

__global__ void lt_k_ce_bwd_kernel(float *logits, const float *lse, const int32_t *targets,
                                   const float *coef, int V) {
  size_t r = blockIdx.x;
  float *l = logits + r * V;
  float z = lse[r], c = coef[r];
  int t = targets[r];
  for (int j = threadIdx.x; j < V; j += blockDim.x)
    l[j] = c * ((j == t ? 1.0f : 0.0f) - expf(l[j] - z));
}

extern "C" lt_err_t lt_k_ce_fwd(float *logp, float *lse, const float *logits,
                                const int32_t *targets, int N, int V, cudaStream_t stream,
                                char *errstr, size_t errstr_size) {
  if (N <= 0 || V <= 0) return LT_OK;
  return lt_k_launch(lt_k_ce_fwd_kernel, N, LT_K_XENT_THREADS, stream, errstr, errstr_size, logp,
                     lse, logits, targets, V);
}

extern "C" lt_err_t lt_k_ce_bwd(float *logits, const float *lse, const int32_t *targets,
                                const float *coef, int N, int V, cudaStream_t stream,
                                char *errstr, size_t errstr_size) {
  if (N <= 0 || V <= 0) return LT_OK;
  return lt_k_launch(lt_k_ce_bwd_kernel, N, LT_K_XENT_THREADS, stream, errstr, errstr_size,
                     logits, lse, targets, coef, V);
}
