/* lt_gpu_peak: the card's nominal dense bf16 peak for the GPU benches' MFU (TFLOP/s):
 * H100/H200 SXM unless the name says otherwise; LATHE_PEAK_TFLOPS overrides it. */
#ifndef LT_GPU_PEAK_H
#define LT_GPU_PEAK_H

#include <stdlib.h>
#include <string.h>

static inline double lt_gpu_nominal_peak_tflops(const char *device_name) {
  double peak = 989.4; /* H100/H200 SXM dense bf16 */
  if (strstr(device_name, "A100")) peak = 312;
  if (strstr(device_name, "H100 PCIe")) peak = 756;
  if (getenv("LATHE_PEAK_TFLOPS")) peak = atof(getenv("LATHE_PEAK_TFLOPS"));
  return peak;
}

#endif
