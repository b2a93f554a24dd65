/* test_gpu: the Criterion face of lt_gpu_cases (meson suite 'gpu'). Without a usable GPU each
 * test prints "skipped: no GPU" and is reported as skipped. */
#include <criterion/criterion.h>

#include "lt_gpu_cases.h"

static void lt_gpu_run(const char *name) {
  for (const lt_gpu_case_t *c = lt_gpu_cases; c->name; c++) {
    if (strcmp(c->name, name) != 0) continue;
    char msg[768] = "";
    int r = lt_gpu_case_run(c, msg, sizeof msg);
    if (r == LT_GPU_SKIP) cr_skip_test("skipped: no GPU");
    cr_assert_eq(r, LT_GPU_PASS, "%s: %s", name, msg);
    return;
  }
  cr_assert_fail("no gpu case named %s", name);
}

#define LT_GPU_TEST(n) \
  Test(gpu, n) { lt_gpu_run(#n); }

LT_GPU_TEST(matmul_f32)
LT_GPU_TEST(matmul_bf16)
LT_GPU_TEST(rmsnorm)
LT_GPU_TEST(rope)
LT_GPU_TEST(attention_f32)
LT_GPU_TEST(attention_bf16)
LT_GPU_TEST(attention_cached)
LT_GPU_TEST(attention_paged)
LT_GPU_TEST(swiglu)
LT_GPU_TEST(cross_entropy)
LT_GPU_TEST(adamw)
LT_GPU_TEST(misc_sumsq_embed_bias_dropout_scrub)
LT_GPU_TEST(devices_as_a_heartbeat_reports_them)
LT_GPU_TEST(nccl_one_rank_allreduce)
LT_GPU_TEST(bf16_weights_stored_once)
