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

/* kernel<<<grid, block, 0, stream>>>(args...), the launch checked. */
template <typename... P, typename... A>
static inline lt_err_t lt_k_launch(void (*kernel)(P...), unsigned grid, unsigned block,
                                   cudaStream_t stream, char *errstr, size_t errstr_size,
                                   A... args) {
  kernel<<<grid, block, 0, stream>>>(args...);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

/* The reduction operators: a + b and fmaxf(a, b), each exact whichever operand comes first. */
struct lt_k_add {
  template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct lt_k_max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* op over the warp's 32 lanes by xor shuffles; every lane gets the result. */
template <typename T, typename Op> __device__ __forceinline__ T lt_k_warp_reduce(T v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* op over the block (blockDim.x a multiple of 32, <= 1024): each warp reduces, then every warp
 * reduces the warps' partials, `identity` filling the lanes past the last warp; every thread
 * gets the result. `shared` holds 32 T. Calls __syncthreads: every thread of the block must
 * call it. */
template <typename T, typename Op>
__device__ __forceinline__ T lt_k_block_reduce(T v, T *shared, T identity, Op op) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = lt_k_warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T t = lane < nw ? shared[lane] : identity;
  return lt_k_warp_reduce(t, op);
}
__device__ __forceinline__ float lt_k_block_sum(float v, float *shared) {
  return lt_k_block_reduce(v, shared, 0.0f, lt_k_add());
}
__device__ __forceinline__ double lt_k_block_sum_d(double v, double *shared) {
  return lt_k_block_reduce(v, shared, 0.0, lt_k_add());
}
__device__ __forceinline__ float lt_k_block_max(float v, float *shared) {
  return lt_k_block_reduce(v, shared, -INFINITY, lt_k_max());
}

#endif
