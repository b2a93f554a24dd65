/* What a worker's executors train on (workers/lt_worker_setup.h, lt_worker_devices): the backend
 * a worker picks from LATHE_WORKER_BACKEND and what this machine has, and the slots that follow.
 * Each test asserts this machine's truth either way: on a machine with GPUs the cuda answers, on
 * one without (this project's CI) the cpu answers and the runtime's reason. */
#include <stdio.h>
#include <string.h>

#include <criterion/criterion.h>

#include "lt_worker_setup.h"

static char err[600];

static int gpus_here(char *why, size_t n) {
  int count = 0;
  if (lt_cuda_device_count(&count, why, n)) count = 0;
  return count;
}

Test(worker_setup, auto_takes_every_gpu_one_a_slot_or_the_cpu_when_there_is_none) {
  char why[512] = "";
  int have = gpus_here(why, sizeof why);
  lt_worker_devices_t d;
  int slots = 0;
  cr_assert_eq(lt_worker_devices(NULL, &slots, &d, err, sizeof err), LT_OK, "%s", err);
  if (have == 0) {
    cr_assert_str_eq(d.backend, "cpu", "no GPU (%s): the cpu", why);
    cr_assert_eq(d.ngpus, 0);
    cr_assert_eq(slots, 1, "a cpu worker's slots default to 1");
    cr_assert(why[0], "the runtime says why there is no GPU");
  } else {
    int want = have < LT_WORKER_MAX_GPUS ? have : LT_WORKER_MAX_GPUS;
    cr_assert_str_eq(d.backend, "cuda");
    cr_assert_eq(d.ngpus, want);
    cr_assert_eq(slots, want, "one slot a GPU");
    for (int i = 0; i < d.ngpus; i++) {
      cr_assert_eq(d.gpus[i].index, i);
      cr_assert(d.gpus[i].name[0] && d.gpus[i].memory_bytes > ((uint64_t)1 << 30) && d.gpus[i].cc_major >= 3,
                "GPU %d: '%s', %llu bytes, cc %d.%d", i, d.gpus[i].name,
                (unsigned long long)d.gpus[i].memory_bytes, d.gpus[i].cc_major, d.gpus[i].cc_minor);
    }
  }
  slots = 5;
  cr_assert_eq(lt_worker_devices("auto", &slots, &d, err, sizeof err), have == 0 || have >= 5 ? LT_OK : LT_ERR_INVALID,
               "%s", err);
  if (have == 0) cr_assert_eq(slots, 5, "a cpu worker keeps the slots it was given");
  else if (have < 5) cr_assert(strstr(err, "LATHE_WORKER_SLOTS") && strstr(err, "5 slots"), "%s", err);
}

Test(worker_setup, cpu_is_the_cpu_whatever_the_machine_has) {
  lt_worker_devices_t d;
  int slots = 3;
  cr_assert_eq(lt_worker_devices("cpu", &slots, &d, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(d.backend, "cpu");
  cr_assert_eq(d.ngpus, 0, "a cpu worker reports no GPU");
  cr_assert_eq(slots, 3);
}

Test(worker_setup, cuda_without_a_gpu_and_a_backend_that_is_none_are_refused_by_name) {
  char why[512] = "";
  int have = gpus_here(why, sizeof why);
  lt_worker_devices_t d;
  int slots = 0;
  lt_err_t e = lt_worker_devices("cuda", &slots, &d, err, sizeof err);
  if (have == 0) {
    cr_assert_eq(e, LT_ERR_UNAVAILABLE, "%s", err);
    cr_assert(strstr(err, "LATHE_WORKER_BACKEND=cuda") && strstr(err, "no GPU"), "%s", err);
  } else {
    cr_assert_eq(e, LT_OK, "%s", err);
    cr_assert_str_eq(d.backend, "cuda");
  }
  static const char *const bad[] = {"tpu", "CUDA", "gpu", "cpu "};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    slots = 1;
    cr_assert_eq(lt_worker_devices(bad[i], &slots, &d, err, sizeof err), LT_ERR_INVALID, "%s", bad[i]);
    cr_assert(strstr(err, "LATHE_WORKER_BACKEND") && strstr(err, "auto, cpu or cuda") && strstr(err, bad[i]),
              "names the variable, the choices and the value: %s", err);
  }
}
