/* gpu_driver: runs every case of lt_gpu_cases without Criterion (for run_on_device.sh on a GPU
 * machine that has nvcc but not meson or Criterion). Prints one line per case; exit status 1
 * when any case failed, 0 otherwise (all-skipped included: it says so). */
#include <stdio.h>

#include "lt_gpu_cases.h"

int main(void) {
  int pass = 0, fail = 0, skip = 0;
  for (const lt_gpu_case_t *c = lt_gpu_cases; c->name; c++) {
    char msg[768] = "";
    int r = lt_gpu_case_run(c, msg, sizeof msg);
    printf("%-40s %s  %s\n", c->name, r == LT_GPU_PASS ? "PASS" : r == LT_GPU_SKIP ? "SKIP" : "FAIL",
           msg);
    fflush(stdout);
    pass += r == LT_GPU_PASS, fail += r == LT_GPU_FAIL, skip += r == LT_GPU_SKIP;
  }
  printf("gpu kernels: %d passed, %d failed, %d skipped\n", pass, fail, skip);
  return fail ? 1 : 0;
}
