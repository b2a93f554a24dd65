/* test_sim: what the event-driven simulator relies on in the policy — lt_sched_next_timer() names
 * the instants at which waiting changes a decision — and the least-attained-service peer
 * (LT_SCHED_POLICY_LAS); the streaming trace reader refuses an out-of-order line; every policy runs
 * multi-worker gangs to completion in the simulator, refusing only jobs larger than a group, and
 * random runs with such gangs keep the policy's tables consistent. The
 * simulator's end-to-end behaviour (same results as the tick-based run, no false stall, a named
 * deadlock, `lathe sim gen`) is tests/sim_json.py. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lt_sched.h"

static lt_sched_t *fleet(lt_sched_policy_t p, uint32_t workers, uint32_t slots) {
  lt_sched_config_t c;
  lt_sched_config_default(&c);
  c.policy = p;
  c.check_invariants = true;
  c.max_jobs = 64;
  c.max_tenants = 8;
  c.max_workers = 8;
  lt_sched_t *s;
  char err[256];
  cr_assert_eq(lt_sched_new(&c, &s, err, sizeof err), LT_OK, "%s", err);
  lt_sched_tenant_t t = {.id = 1, .weight = 1};
  cr_assert_eq(lt_sched_tenant_upsert(s, &t, err, sizeof err), LT_OK, "%s", err);
  for (uint32_t w = 0; w < workers; w++) {
    lt_sched_worker_t wk = {.id = w + 1, .slots = slots, .mem_bytes = 0, .model_cache = 1};
    cr_assert_eq(lt_sched_worker_up(s, &wk, err, sizeof err), LT_OK, "%s", err);
  }
  return s;
}

static void enqueue(lt_sched_t *s, uint64_t id, lt_job_class_t cls, uint32_t gpus, double now) {
  lt_sched_job_t j = {.id = id, .tenant_id = 1, .cls = cls, .gpus = gpus,
                      .model = LT_SCHED_NO_MODEL};
  char err[256];
  cr_assert_eq(lt_sched_job_enqueue(s, &j, now, err, sizeof err), LT_OK, "%s", err);
}

Test(sim, next_timer_names_the_waits_that_change_a_decision) {
  lt_sched_t *s = fleet(LT_SCHED_POLICY_LATHE, 1, 2);
  lt_sched_decision_t d[8];
  enqueue(s, 1, LT_CLASS_PREEMPTIBLE, 2, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1); /* the fleet is now full */
  cr_assert(isinf(lt_sched_next_timer(s, 0)), "nothing waits: no timer");
  enqueue(s, 2, LT_CLASS_STANDARD, 2, 10);
  cr_assert_eq(lt_sched_decide(s, 10, d, 8), 0);
  /* standard, 2 GPUs: preempt_after_s 120, gang_reserve_after_s 300, aging_s 600 */
  cr_assert_float_eq(lt_sched_next_timer(s, 10), 130, 1e-9);
  cr_assert_float_eq(lt_sched_next_timer(s, 130), 310, 1e-9);
  cr_assert_float_eq(lt_sched_next_timer(s, 310), 610, 1e-9);
  cr_assert(isinf(lt_sched_next_timer(s, 610)));
  /* at the first one, the policy preempts the preemptible job */
  size_t n = lt_sched_decide(s, 130, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT);
  cr_assert_eq(d[0].job_id, 1);
  lt_sched_destroy(s);
}

Test(sim, next_timer_under_fifo_is_only_durations) {
  lt_sched_t *s = fleet(LT_SCHED_POLICY_FIFO, 1, 1);
  lt_sched_decision_t d[4];
  enqueue(s, 1, LT_CLASS_STANDARD, 1, 0);
  enqueue(s, 2, LT_CLASS_PRODUCTION, 1, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 4), 1);
  cr_assert(isinf(lt_sched_next_timer(s, 0)), "FIFO compares no wait with a threshold");
  lt_sched_destroy(s);
}

Test(sim, las_starts_the_least_attained_job_first) {
  lt_sched_t *s = fleet(LT_SCHED_POLICY_LAS, 1, 1);
  lt_sched_decision_t d[4];
  enqueue(s, 1, LT_CLASS_PRODUCTION, 1, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 4), 1);
  cr_assert_eq(lt_sched_job_started(s, 1, 0), LT_OK);
  /* job 1 ran 4000 GPU-s (past the 3600 threshold) and is requeued; job 2 arrives later */
  cr_assert_eq(lt_sched_job_requeue(s, 1, 4000), LT_OK);
  enqueue(s, 2, LT_CLASS_PREEMPTIBLE, 1, 4001);
  cr_assert_eq(lt_sched_decide(s, 4001, d, 4), 1);
  cr_assert_eq(d[0].job_id, 2, "the job with no attained service goes first, whatever its class");
  lt_sched_destroy(s);
}

Test(sim, las_preempts_a_second_queue_job_for_a_first_queue_one) {
  lt_sched_t *s = fleet(LT_SCHED_POLICY_LAS, 1, 2);
  lt_sched_decision_t d[4];
  enqueue(s, 1, LT_CLASS_STANDARD, 2, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 4), 1);
  enqueue(s, 2, LT_CLASS_STANDARD, 1, 100);
  cr_assert_eq(lt_sched_decide(s, 100, d, 4), 0, "job 1 is still in the first queue");
  /* job 1 crosses 3600 GPU-s at 1800 s (2 GPUs): the timer says so, and then it is preempted */
  cr_assert_float_eq(lt_sched_next_timer(s, 100), 1800, 1e-9);
  size_t n = lt_sched_decide(s, 1800, d, 4);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT);
  cr_assert_eq(d[0].job_id, 1);
  cr_assert_eq(lt_sched_job_requeue(s, 1, 1830), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 1830, d, 4), 1);
  cr_assert_eq(d[0].job_id, 2);
  lt_sched_destroy(s);
}

Test(sim, streaming_trace_refuses_an_out_of_order_line_naming_it) {
  lt_sched_trace_t *t;
  char err[256];
  cr_assert_eq(lt_sched_trace_new(&t, err, sizeof err), LT_OK);
  const char *lines[] = {"arrival_s,tenant,class,gpus,duration_s,base_model\n",
                         "# comment\n", "5,a,standard,1,60,m\n", "7,a,standard,1,60,m\n"};
  for (size_t i = 0; i < 4; i++)
    cr_assert_eq(lt_sched_trace_add_line(t, lines[i], strlen(lines[i]), err, sizeof err), LT_OK,
                 "%s", err);
  const char *bad = "6,b,standard,1,60,m\n";
  cr_assert_eq(lt_sched_trace_add_line(t, bad, strlen(bad), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "trace line 5") && strstr(err, "line 4") && strstr(err, "sorted"),
            "message: %s", err);
  lt_sched_trace_destroy(t);
}

Test(sim, runs_multi_worker_gangs_to_completion_under_every_policy) {
  /* 16 workers of 8 in node groups of 8 (64 GPUs a group): gangs of 16, 32 and 64 GPUs among
   * single-worker jobs, and one 128-GPU job, larger than a group, which is refused */
  char text[4096] = "arrival_s,tenant,class,gpus,duration_s,base_model\n";
  size_t len = strlen(text);
  static const uint32_t gpus[] = {1, 16, 4, 32, 8, 64, 1, 16, 2, 32, 128, 1, 64, 8, 16};
  static const char *const cls[] = {"production", "standard", "preemptible"};
  uint32_t multi = 0, n = sizeof gpus / sizeof gpus[0];
  for (uint32_t i = 0; i < n; i++) {
    len += (size_t)snprintf(text + len, sizeof text - len, "%u,t%u,%s,%u,%u,m%u\n", i * 30, i % 3,
                            cls[i % 3], gpus[i], 600 + 100 * i, i % 2);
    multi += gpus[i] > 8 && gpus[i] <= 64;
  }
  lt_sched_trace_t *tr;
  char err[256];
  cr_assert_eq(lt_sched_trace_parse(text, len, &tr, err, sizeof err), LT_OK, "%s", err);
  for (int p = 0; p < 3; p++) {
    lt_sched_sim_config_t cfg;
    lt_sched_sim_config_default(&cfg);
    cfg.sched.policy = (lt_sched_policy_t)p;
    cfg.sched.check_invariants = true;
    cfg.workers = 16;
    cfg.slots_per_worker = 8;
    cfg.workers_per_group = 8;
    lt_sched_sim_result_t r;
    cr_assert_eq(lt_sched_sim_run(tr, &cfg, &r, err, sizeof err), LT_OK, "%s", err);
    const char *name = lt_sched_policy_name(cfg.sched.policy);
    cr_assert_eq(r.refused_size, 1, "%s", name);
    cr_assert_eq(r.refused_first_gpus, 128, "%s", name);
    cr_assert_eq(r.completed, n - 1, "%s: every job that fits a group completes", name);
    cr_assert_eq(r.multi_finished, multi, "%s: %llu of %u gangs finished", name,
                 (unsigned long long)r.multi_finished, multi);
    cr_assert_geq(r.multi_started, multi, "%s", name);
    lt_sched_sim_result_free(&r);
  }
  lt_sched_trace_destroy(tr);
}

/* A random run under policy p with multi-worker gangs, invariants checked after every call:
 * jobs of 1..12 GPUs on 6 workers of 4 slots in two node groups; jobs finish, are requeued,
 * and workers go down and come back. Returns the multi-worker gangs dispatched. */
static uint32_t gang_stress(lt_sched_policy_t p, unsigned seed) {
  lt_sched_config_t c;
  lt_sched_config_default(&c);
  c.policy = p;
  c.check_invariants = true;
  c.max_jobs = 512;
  c.max_workers = 8;
  c.preempt_after_s = 20;
  c.gang_reserve_after_s = 30;
  c.las_threshold_gpu_s = 200;
  lt_sched_t *s;
  char err[256];
  cr_assert_eq(lt_sched_new(&c, &s, err, sizeof err), LT_OK, "%s", err);
  for (uint64_t t = 1; t <= 3; t++) {
    lt_sched_tenant_t ten = {.id = t, .weight = (double)t, .max_duration_s = t == 3 ? 50 : 0};
    cr_assert_eq(lt_sched_tenant_upsert(s, &ten, err, sizeof err), LT_OK, "%s", err);
  }
  lt_sched_worker_t wk[6];
  for (uint32_t w = 0; w < 6; w++) {
    wk[w] = (lt_sched_worker_t){.id = w + 1, .slots = 4, .mem_bytes = 4 << 20, .model_cache = 1,
                                .node_group = w / 3};
    cr_assert_eq(lt_sched_worker_up(s, &wk[w], err, sizeof err), LT_OK, "%s", err);
  }
  srand(seed);
  uint64_t next = 1, running[256];
  size_t nrun = 0;
  uint32_t multi = 0;
  lt_sched_decision_t d[64];
  for (int step = 0; step < 2000; step++) {
    double now = step;
    if (rand() % 2) {
      uint32_t g = rand() % 4 == 0 ? 5 + (uint32_t)(rand() % 8) : 1 + (uint32_t)(rand() % 4);
      lt_sched_job_t j = {.id = next++, .tenant_id = 1 + (uint64_t)(rand() % 3),
                          .cls = (lt_job_class_t)(rand() % 3), .gpus = g,
                          .mem_bytes = (uint64_t)g << 20, .model = LT_SCHED_NO_MODEL};
      cr_assert_eq(lt_sched_job_enqueue(s, &j, now, err, sizeof err), LT_OK, "%s", err);
    }
    size_t n = lt_sched_decide(s, now, d, 64);
    for (size_t i = 0; i < n; i += d[i].world) {
      cr_assert_eq(d[i].rank, 0, "a job's rows start at rank 0");
      cr_assert_leq(i + d[i].world, n, "a job's rows are never split");
      for (uint32_t r = 1; r < d[i].world; r++)
        cr_assert(d[i + r].job_id == d[i].job_id && d[i + r].rank == r);
      if (d[i].action == LT_SCHED_DISPATCH) {
        running[nrun++] = d[i].job_id;
        multi += d[i].world > 1;
      } else { /* preempted after its checkpoint, or stopped: at once */
        if (d[i].action == LT_SCHED_PREEMPT) lt_sched_job_requeue(s, d[i].job_id, now);
        else lt_sched_job_finished(s, d[i].job_id, now);
        for (size_t k = 0; k < nrun; k++)
          if (running[k] == d[i].job_id) running[k] = running[--nrun];
      }
    }
    if (nrun > 0 && rand() % 3 == 0) {
      size_t k = (size_t)rand() % nrun;
      if (rand() % 8) lt_sched_job_finished(s, running[k], now);
      else lt_sched_job_requeue(s, running[k], now);
      running[k] = running[--nrun];
    }
    if (rand() % 100 == 0) { /* a worker goes down (its jobs, gangs whole, are requeued) */
      uint32_t w = (uint32_t)(rand() % 6);
      if (lt_sched_worker_down(s, w + 1, now) == LT_OK) {
        nrun = 0; /* which jobs were requeued is the policy's business: forget them all */
        lt_sched_counters_t cnt;
        lt_sched_counters(s, &cnt);
        for (uint64_t id = 1; id < next && cnt.running; id++)
          if (lt_sched_job_requeue(s, id, now) == LT_OK) cnt.running--;
        cr_assert_eq(lt_sched_worker_up(s, &wk[w], err, sizeof err), LT_OK, "%s", err);
      }
    }
  }
  lt_sched_destroy(s);
  return multi;
}

Test(sim, random_runs_with_multi_worker_gangs_keep_the_tables_consistent) {
  for (int p = 0; p < 3; p++)
    cr_assert_gt(gang_stress((lt_sched_policy_t)p, 7 + (unsigned)p), 0, "%s",
                 lt_sched_policy_name((lt_sched_policy_t)p));
}
