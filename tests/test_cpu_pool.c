/* Tests of the cpu backend's thread pool (workers/engine/lt_cpu_pool.h): every part of every job
 * runs once, with its own tid and the pool's nt, and lt_cpu_pool_run returns only when all have
 * finished — on both paths a worker takes to a job: awake (jobs back to back) and asleep (a
 * pause longer than the pool's awake wait before the next job). */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>

#include "lt_cpu_pool.h"

enum { MAXT = 4 };

typedef struct job {
  long id;
  long seen[MAXT];    /* each part writes the job's id here */
  _Atomic int parts;  /* parts run */
  int bad_nt;         /* a part saw another nt than the pool's */
  int nt;
} job_t;

static void part(void *arg, int tid, int nt) {
  job_t *j = arg;
  if (nt != j->nt || tid < 0 || tid >= nt) j->bad_nt = 1;
  else j->seen[tid] = j->id;
  atomic_fetch_add(&j->parts, 1);
}

static void pause_ms(long ms) {
  struct timespec t = {0, ms * 1000000L};
  nanosleep(&t, NULL);
}

Test(cpu_pool, every_part_runs_once_and_run_returns_after_all_of_them) {
  for (int nt = 1; nt <= MAXT; nt++) {
    lt_cpu_pool_t p;
    cr_assert_eq(lt_cpu_pool_start(&p, nt), 0, "nt %d: a thread did not start", nt);
    cr_assert_eq(p.nt, nt);
    job_t j = {.nt = nt};
    for (long id = 1; id <= 20000; id++) {
      j.id = id;
      atomic_store(&j.parts, 0);
      lt_cpu_pool_run(&p, part, &j);
      cr_assert_eq(atomic_load(&j.parts), nt, "nt %d, job %ld: %d parts ran by the return", nt, id,
                   atomic_load(&j.parts));
      cr_assert_eq(j.bad_nt, 0, "nt %d, job %ld: a part got a wrong tid or nt", nt, id);
      for (int t = 0; t < nt; t++)
        cr_assert_eq(j.seen[t], id, "nt %d, job %ld: part %d saw job %ld", nt, id, t, j.seen[t]);
      if (id % 5000 == 0) pause_ms(5); /* past the awake wait: the workers sleep, then wake */
    }
    lt_cpu_pool_stop(&p);
  }
}

/* Stopping a pool whose workers sleep, and one whose workers are still awake, returns. */
Test(cpu_pool, stop_returns_whether_the_workers_sleep_or_wait_awake) {
  for (int asleep = 0; asleep <= 1; asleep++) {
    lt_cpu_pool_t p;
    cr_assert_eq(lt_cpu_pool_start(&p, 3), 0);
    job_t j = {.id = 1, .nt = 3};
    lt_cpu_pool_run(&p, part, &j);
    if (asleep) pause_ms(5);
    lt_cpu_pool_stop(&p);
    cr_assert_eq(atomic_load(&j.parts), 3);
  }
}
