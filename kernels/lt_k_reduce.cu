/* lt_k_reduce: deterministic reductions: the sum of squares behind gradient clipping and the
 * bias gradient. Fixed grid, fixed per-thread order, then one block over the partials. */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

#define LT_K_SUMSQ_BLOCKS 512

__global__ void lt_k_sumsq_partial(double *work, const float *x, size_t n) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    acc += (double)x[i] * (double)x[i];
  acc = lt_k_block_sum_d(acc, sh);
  if (threadIdx.x == 0) work[blockIdx.x] = acc;
}

__global__ void lt_k_sumsq_final(double *out, const double *work, int nparts) {
  __shared__ double sh[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += work[i];
  acc = lt_k_block_sum_d(acc, sh);
  if (threadIdx.x == 0) *out = acc;
}

/* One thread per column, rows in increasing order: matches the CPU order exactly. */
__global__ void lt_k_bias_bwd_kernel(float *db, const float *dy, int rows, int cols) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; r++) acc += dy[(size_t)r * cols + c];
  db[c] += acc;
}

extern "C" size_t lt_k_sumsq_work_doubles(void) { return LT_K_SUMSQ_BLOCKS; }

extern "C" lt_err_t lt_k_sumsq(double *out_dev, double *work_dev, const float *x, size_t n,
                               cudaStream_t stream, char *errstr, size_t errstr_size) {
  /* Always the same grid, so the summation order depends only on n. */
  lt_k_sumsq_partial<<<LT_K_SUMSQ_BLOCKS, LT_K_THREADS, 0, stream>>>(work_dev, x, n);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  lt_k_sumsq_final<<<1, LT_K_THREADS, 0, stream>>>(out_dev, work_dev, LT_K_SUMSQ_BLOCKS);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}

extern "C" lt_err_t lt_k_bias_bwd(float *db, const float *dy, int rows, int cols,
                                  cudaStream_t stream, char *errstr, size_t errstr_size) {
  if (rows <= 0 || cols <= 0) return LT_OK;
  lt_k_bias_bwd_kernel<<<(cols + 127) / 128, 128, 0, stream>>>(db, dy, rows, cols);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
