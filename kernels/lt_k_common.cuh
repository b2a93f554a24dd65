/* lt_k_common: device helpers shared by the kernel families (CUDA C++ only, internal).
 * Block reductions here run in a fixed order (warp shuffles then one warp over the partials),
 * so a kernel's result depends only on its inputs and launch shape: no atomics anywhere. */
#ifndef LT_K_COMMON_CUH
#define LT_K_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

#include "lt_cuda_check.cuh"

#define LT_K_THREADS 256

/* Grid size for a grid-stride loop over n elements (capped; the loop covers the rest). */
static inline unsigned lt_k_grid(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  if (b > 65535u * 8u) b = 65535u * 8u;
  return b == 0 ? 1u : (unsigned)b;
}

__device__ __forceinline__ float lt_k_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float lt_k_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ double lt_k_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
 * `shared` holds 32 floats. Calls __syncthreads: every thread of the block must call it. */
__device__ __forceinline__ float lt_k_block_sum(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = lt_k_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < nw ? shared[lane] : 0.0f;
  return lt_k_warp_sum(t);
}
__device__ __forceinline__ float lt_k_block_max(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = lt_k_warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float t = lane < nw ? shared[lane] : -INFINITY;
  return lt_k_warp_max(t);
}

#endif
