/* lt_k_rope: rotary position embedding, HF rotate_half convention, in place. The backward
 * pass is the same rotation by the negative angle (inverse != 0). */
#include "lt_k_common.cuh"
#include "lt_kernels.cuh"

__global__ void lt_k_rope_kernel(float *x, const float *cos_tab, const float *sin_tab,
                                 const int32_t *pos, size_t N, int nh, int hd, float sign) {
  int half = hd / 2;
  size_t total = N * nh * half;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    int j = (int)(i % half);
    size_t rh = i / half; /* row * nh + head */
    size_t r = rh / nh;
    float *xh = x + rh * hd;
    size_t t = (size_t)pos[r] * half + j;
    float c = cos_tab[t], s = sign * sin_tab[t];
    float a = xh[j], b = xh[j + half];
    xh[j] = a * c - b * s;
    xh[j + half] = b * c + a * s;
  }
}

extern "C" lt_err_t lt_k_rope(float *x, const float *cos_tab, const float *sin_tab,
                              const int32_t *pos, int N, int nh, int hd, int inverse,
                              cudaStream_t stream, char *errstr, size_t errstr_size) {
  size_t total = (size_t)N * nh * (hd / 2);
  if (total == 0) return LT_OK;
  lt_k_rope_kernel<<<lt_k_grid(total, LT_K_THREADS), LT_K_THREADS, 0, stream>>>(
      x, cos_tab, sin_tab, pos, (size_t)N, nh, hd, inverse ? -1.0f : 1.0f);
  LT_CUDA_LAUNCHED(errstr, errstr_size);
  return LT_OK;
}
