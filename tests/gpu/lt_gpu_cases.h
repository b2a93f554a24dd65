/* lt_gpu_cases: the GPU test cases, each a cuda backend member (and so a kernel family)
 * checked against a plain C reference with an explicit tolerance. Shared by the Criterion
 * suite (test_gpu.c, meson suite 'gpu') and the standalone driver (gpu_driver.c) that
 * tests/gpu/run_on_device.sh builds with nvcc alone on a GPU machine. */
#ifndef LT_GPU_CASES_H
#define LT_GPU_CASES_H

#include <stddef.h>

enum { LT_GPU_PASS = 0, LT_GPU_FAIL = 1, LT_GPU_SKIP = 2 };

typedef int (*lt_gpu_case_fn)(char *msg, size_t msg_size);

typedef struct {
  const char *name;
  lt_gpu_case_fn fn;
} lt_gpu_case_t;

/* NULL-terminated table of every case. */
extern const lt_gpu_case_t lt_gpu_cases[];

#endif
