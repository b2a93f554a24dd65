/* lt_gpu_cases: the GPU test cases, each a cuda backend member (and so a kernel family)
 * checked against a plain C reference with an explicit tolerance. Shared by the Criterion
 * suite (test_gpu.c, meson suite 'gpu') and the standalone driver (gpu_driver.c) that
 * tests/gpu/run_on_device.sh builds with nvcc alone on a GPU machine. */
#ifndef LT_GPU_CASES_H
#define LT_GPU_CASES_H

#include <stddef.h>

enum { LT_GPU_PASS = 0, LT_GPU_FAIL = 1, LT_GPU_SKIP = 2 };

struct lt_backend;

/* One case's check on an open cuda backend (in bf16 mode when bf16): 1 when it passes, else 0
 * with the reason in msg. */
typedef int (*lt_gpu_check_fn)(struct lt_backend *be, int bf16, char *msg, size_t msg_size);

typedef struct {
  const char *name;
  int bf16;
  lt_gpu_check_fn check;
} lt_gpu_case_t;

/* NULL-terminated table of every case. */
extern const lt_gpu_case_t lt_gpu_cases[];

/* Runs case c on a fresh cuda backend: LT_GPU_PASS, LT_GPU_FAIL (reason in msg, which says "ok"
 * on a pass) or LT_GPU_SKIP when there is no GPU. */
int lt_gpu_case_run(const lt_gpu_case_t *c, char *msg, size_t msg_size);

#endif
