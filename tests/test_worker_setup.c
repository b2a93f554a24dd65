/* What a worker's executors train on (workers/lt_worker_setup.h, lt_worker_devices): the backend
 * a worker picks from LATHE_WORKER_BACKEND and what this machine has, and the slots that follow.
 * Each test asserts this machine's truth either way: on a machine with GPUs the cuda answers, on
 * one without (this project's CI) the cpu answers and the runtime's reason. And where executors'
 * files go (lt_worker_confinement): what a crashed process of the same worker left is gone at
 * start, another worker's directory untouched. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "lt_test.h"
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

/* Writes text to dir/name, making dir. */
static void plant(const char *dir, const char *name, const char *text) {
  char path[800];
  mkdir(dir, 0711);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s", path);
  fputs(text, f);
  fclose(f);
}

static int entries(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s is gone", dir);
  int k = 0;
  for (struct dirent *e; (e = readdir(d));) k += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return k;
}

/* A worker killed mid-attempt (SIGKILL, a crash, the machine's OOM killer) never ran its
 * finish_attempt: its executor's plaintext (state, adapter, spool) stayed on /dev/shm for good.
 * The same worker id started again finds its own directories and scrubs them before any attempt;
 * another worker's, beside them, is not its to touch, and neither is a live process's of the
 * same id (two started with one LATHE_INSTANCE): it holds the id's lock. */
Test(worker_setup, a_restarted_worker_scrubs_what_its_crashed_predecessor_left_and_nothing_else) {
  char mem[] = "/dev/shm/lt-wsetup-XXXXXX", disk[] = "/tmp/lt-wsetup-XXXXXX";
  cr_assert_not_null(mkdtemp(mem));
  cr_assert_not_null(mkdtemp(disk));
  char own_mem[600], own_att[660], own_disk[600], other[600];
  snprintf(own_mem, sizeof own_mem, "%s/lathe-w1", mem);
  snprintf(own_att, sizeof own_att, "%s/att-3", own_mem);
  snprintf(own_disk, sizeof own_disk, "%s/lathe-w1", disk);
  snprintf(other, sizeof other, "%s/lathe-w2", mem);
  plant(own_mem, "load-7.bin", "a tenant's state");
  plant(own_att, "state.bin", "a tenant's state");
  plant(own_disk, "sealed.bin", "sealed bytes");
  plant(other, "state.bin", "another worker's tenant's state");
  lt_worker_conf_t c = {.store = (lt_store_t *)1, .kek = (const lt_crypto_kek_t *)1, .worker_id = "w1",
                        .work_root = disk, .mem_root = mem, .slots = 1};
  lt_confine_conf_t cc;
  char work_parent[512], mem_parent[512];
  int lock = -1, lock2 = -1;
  cr_assert_eq(lt_worker_confinement(&c, &cc, work_parent, mem_parent, &lock, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(mem_parent, own_mem);
  cr_assert_str_eq(work_parent, own_disk);
  cr_expect_eq(entries(own_mem), 0, "the crashed process's plaintext is still in %s", own_mem);
  cr_expect_eq(entries(own_disk), 0, "what the crashed process left is still in %s", own_disk);
  struct stat st;
  cr_expect(stat(own_mem, &st) == 0 && (st.st_mode & 07777) == 0711, "the worker's directory is there, 0711");
  char path[700];
  snprintf(path, sizeof path, "%s/state.bin", other);
  cr_expect(lt_test_file_has(path, "another worker's tenant's state"), "another worker's file was touched");
  plant(own_att, "state.bin", "a live attempt's state"); /* this process's, while it runs */
  cr_assert_eq(lt_worker_confinement(&c, &cc, work_parent, mem_parent, &lock2, err, sizeof err), LT_OK, "%s", err);
  snprintf(path, sizeof path, "%s/state.bin", own_att);
  cr_expect(lt_test_file_has(path, "a live attempt's state"), "a second process of the id swept the live one's");
  /* the first one ends and starts again while the second runs: the second's files are live */
  close(lock);
  int lock3 = -1;
  cr_assert_eq(lt_worker_confinement(&c, &cc, work_parent, mem_parent, &lock3, err, sizeof err), LT_OK, "%s", err);
  cr_expect(lt_test_file_has(path, "a live attempt's state"), "a restart swept the live second process's files");
  close(lock3);
  close(lock2);
  lt_test_rm_rf(mem);
  lt_test_rm_rf(disk);
}
