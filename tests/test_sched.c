/* test_sched: the scheduling policy (lt_sched) and its simulator — weighted fairness, strict
 * priority, preemption, gangs (on one worker, and across the workers of a node group), affinity,
 * quotas, invariant 9 (prompt start), FIFO comparison, determinism and trace errors. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_sched.h"

#define GB (1ULL << 30)

static lt_sched_t *mk(lt_sched_policy_t policy, double reserve, double aging, double preempt,
                      double gang) {
  lt_sched_config_t c;
  lt_sched_config_default(&c);
  c.policy = policy;
  c.production_reserve = reserve;
  c.aging_s = aging;
  c.preempt_after_s = preempt;
  c.gang_reserve_after_s = gang;
  c.max_jobs = 4096;
  c.check_invariants = true; /* every call asserts the tables are consistent */
  lt_sched_t *s;
  char err[256];
  cr_assert_eq(lt_sched_new(&c, &s, err, sizeof err), LT_OK, "%s", err);
  return s;
}

static void tenant(lt_sched_t *s, uint64_t id, double weight, uint32_t max_run,
                   uint32_t max_queued, double max_dur) {
  lt_sched_tenant_t t = {.id = id,
                         .weight = weight,
                         .max_running_slots = max_run,
                         .max_queued_jobs = max_queued,
                         .max_duration_s = max_dur};
  char err[256];
  cr_assert_eq(lt_sched_tenant_upsert(s, &t, err, sizeof err), LT_OK, "%s", err);
}

static void worker(lt_sched_t *s, uint64_t id, uint32_t slots, uint32_t cache) {
  lt_sched_worker_t w = {.id = id, .slots = slots, .mem_bytes = slots * 80 * GB,
                         .model_cache = cache};
  char err[256];
  cr_assert_eq(lt_sched_worker_up(s, &w, err, sizeof err), LT_OK, "%s", err);
}

static void job(lt_sched_t *s, uint64_t id, uint64_t ten, lt_job_class_t cls, uint32_t gpus,
                uint32_t model, double now) {
  lt_sched_job_t j = {.id = id, .tenant_id = ten, .cls = cls, .gpus = gpus,
                      .mem_bytes = gpus * 40 * GB, .model = model};
  char err[256];
  cr_assert_eq(lt_sched_job_enqueue(s, &j, now, err, sizeof err), LT_OK, "%s", err);
}

/* Where most cases start: the policy's knobs (preemption and gang reservation: 0 is never), tenants
 * 1.. with the given weights (a 0 ends the list; no quotas, jobs may run max_dur seconds, 0: no
 * limit), then workers 1..workers of slots GPUs and a cache of `cache` models. */
typedef struct fleet {
  lt_sched_policy_t policy;
  double reserve, aging, preempt, gang;
  double weights[8];
  double max_dur;
  uint32_t workers, slots, cache;
} fleet_t;

static lt_sched_t *fleet(fleet_t f) {
  lt_sched_t *s = mk(f.policy, f.reserve, f.aging, f.preempt > 0 ? f.preempt : -1,
                     f.gang > 0 ? f.gang : -1);
  for (uint64_t t = 0; t < 8 && f.weights[t] > 0; t++) tenant(s, t + 1, f.weights[t], 0, 0, f.max_dur);
  for (uint64_t w = 1; w <= f.workers; w++) worker(s, w, f.slots, f.cache);
  return s;
}

/* The jobs a test's fleet is running and when each ends (jobs finish in lt_sched at that time). */
typedef struct running {
  uint64_t id[64];
  double end[64];
  size_t n;
} running_t;

static void run_add(running_t *r, uint64_t id, double end) {
  cr_assert(r->n < 64, "more running jobs than the test expects");
  r->id[r->n] = id;
  r->end[r->n++] = end;
}

static void run_forget(running_t *r, size_t i) {
  r->id[i] = r->id[--r->n];
  r->end[i] = r->end[r->n];
}

/* Reports every running job whose end time has come as finished at now. */
static void run_finish_due(lt_sched_t *s, running_t *r, double now) {
  for (size_t i = 0; i < r->n;)
    if (r->end[i] <= now) {
      lt_sched_job_finished(s, r->id[i], now);
      run_forget(r, i);
    } else {
      i++;
    }
}

Test(sched, weights_1_and_3_with_equal_demand_get_slots_in_ratio_1_to_3) {
  lt_sched_t *s = fleet((fleet_t){.weights = {1, 3}, .workers = 4, .slots = 4, .cache = 2});
  for (int i = 0; i < 400; i++) {
    job(s, 1000 + (uint64_t)i, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
    job(s, 2000 + (uint64_t)i, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  }
  lt_sched_decision_t d[64];
  uint64_t running[64];
  size_t nrun = 0;
  double got[3] = {0};
  /* 10 rounds of 10 s: every job runs one round, freed slots are refilled */
  for (int round = 0; round < 10; round++) {
    double now = round * 10.0;
    for (size_t i = 0; i < nrun; i++)
      cr_assert_eq(lt_sched_job_finished(s, running[i], now), LT_OK);
    nrun = 0;
    size_t n = lt_sched_decide(s, now, d, 64);
    cr_assert_eq(n, 16, "every free slot is filled (got %zu)", n);
    for (size_t i = 0; i < n; i++) {
      cr_assert_eq(d[i].action, LT_SCHED_DISPATCH);
      got[d[i].tenant_id] += 10.0;
      running[nrun++] = d[i].job_id;
    }
    cr_assert(lt_sched_jain(s, LT_CLASS_STANDARD) > 0.99);
  }
  double ratio = got[2] / got[1];
  cr_assert(ratio > 2.7 && ratio < 3.3, "slot-seconds ratio %.3f, expected ~3", ratio);
  lt_sched_tenant_stats_t st[4];
  size_t n = lt_sched_tenants_stats(s, LT_CLASS_STANDARD, st, 4);
  cr_assert_eq(n, 2);
  cr_assert_float_eq(st[0].entitlement, 0.25, 1e-9);
  cr_assert_float_eq(st[1].entitlement, 0.75, 1e-9);
  cr_assert_float_eq(st[0].share, 0.25, 1e-9);
  lt_sched_destroy(s);
}

Test(sched, production_job_never_waits_behind_lower_class_when_slot_free) {
  /* property over a random stream of 1-GPU jobs, aging off: after every decision round, if a
   * production job is still queued then the fleet is full and no lower-class job started */
  lt_sched_t *s = fleet((fleet_t){.weights = {1, 2, 3, 4, 5}, .workers = 3, .slots = 4, .cache = 2});
  srand(7);
  lt_sched_decision_t d[64];
  running_t run = {0};
  uint64_t next_id = 1;
  int checked = 0;
  for (int step = 0; step < 2000; step++) {
    double now = step;
    run_finish_due(s, &run, now);
    int arrivals = rand() % 4;
    for (int a = 0; a < arrivals; a++)
      job(s, next_id++, 1 + (uint64_t)(rand() % 5), (lt_job_class_t)(rand() % 3), 1,
          LT_SCHED_NO_MODEL, now);
    size_t n = lt_sched_decide(s, now, d, 64);
    bool lower_started = false;
    for (size_t i = 0; i < n; i++) {
      cr_assert_eq(d[i].action, LT_SCHED_DISPATCH);
      lower_started |= d[i].cls != LT_CLASS_PRODUCTION;
      run_add(&run, d[i].job_id, now + 5 + rand() % 15);
    }
    lt_sched_counters_t c;
    lt_sched_counters(s, &c);
    if (c.queued_class[LT_CLASS_PRODUCTION] > 0) {
      checked++;
      cr_assert_eq(c.slots_used, c.slots_total, "a production job waits with a free slot");
      cr_assert(!lower_started, "a lower class started while production waited");
    }
  }
  cr_assert(checked > 50, "the stream must put production jobs in the queue (%d)", checked);
  lt_sched_destroy(s);
}

Test(sched, production_never_waits_behind_lower_class_on_free_slot) {
  lt_sched_t *s = fleet((fleet_t){.aging = 600, .weights = {1}, .workers = 1, .slots = 1, .cache = 1});
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 1);
  job(s, 3, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 2);
  lt_sched_decision_t d[8];
  size_t n = lt_sched_decide(s, 3, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].job_id, 3, "the production job goes first, not %llu",
               (unsigned long long)d[0].job_id);
  lt_sched_job_finished(s, 3, 10);
  n = lt_sched_decide(s, 10, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].job_id, 2, "then standard");
  lt_sched_destroy(s);
}

Test(sched, preemptible_work_is_preempted_when_production_waits_past_bound) {
  lt_sched_t *s = fleet((fleet_t){.preempt = 60, .weights = {1, 1}, .workers = 1, .slots = 2, .cache = 2});
  job(s, 1, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 2, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  job(s, 3, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 30, d, 8), 0, "no preemption before the bound");
  size_t n = lt_sched_decide(s, 62, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT);
  cr_assert_eq(d[0].job_id, 2, "the preemptible job is preempted");
  cr_assert_eq(lt_sched_decide(s, 63, d, 8), 0, "one preemption is enough");
  /* checkpoint done: the preemptible job goes back, production takes the slot */
  cr_assert_eq(lt_sched_job_requeue(s, 2, 80), LT_OK);
  n = lt_sched_decide(s, 80, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].job_id, 3);
  cr_assert_eq(d[0].action, LT_SCHED_DISPATCH);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.preemptions, 1);
  cr_assert_eq(c.queued_class[LT_CLASS_PREEMPTIBLE], 1, "the preempted job is queued again");
  /* once production finishes, the preempted job resumes with a new attempt */
  lt_sched_job_finished(s, 1, 100);
  n = lt_sched_decide(s, 100, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].job_id, 2);
  cr_assert_eq(d[0].attempt, 2);
  lt_sched_destroy(s);
}

Test(sched, production_and_standard_work_is_never_preempted) {
  lt_sched_t *s = fleet((fleet_t){.preempt = 10, .weights = {1}, .workers = 1, .slots = 2, .cache = 2});
  job(s, 1, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  job(s, 3, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 0);
  for (int t = 1; t < 1000; t += 7) {
    size_t n = lt_sched_decide(s, t, d, 8);
    for (size_t i = 0; i < n; i++) cr_assert_neq(d[i].action, LT_SCHED_PREEMPT);
  }
  lt_sched_destroy(s);
}

Test(sched, gang_is_all_or_nothing_on_one_worker) {
  lt_sched_t *s = fleet((fleet_t){.weights = {1}, .workers = 2, .slots = 4, .cache = 2});
  for (uint64_t i = 1; i <= 4; i++) job(s, i, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[16];
  cr_assert_eq(lt_sched_decide(s, 0, d, 16), 4);
  /* best fit packs the singles on one worker; spread them so 4 GPUs are free but split */
  uint64_t on1[4], on2[4];
  size_t n1 = 0, n2 = 0;
  for (int i = 0; i < 4; i++)
    if (d[i].worker_id == 1) on1[n1++] = d[i].job_id;
    else on2[n2++] = d[i].job_id;
  cr_assert_eq(n1 + n2, 4);
  /* free two GPUs on the full worker so each worker has free GPUs but neither has 4 */
  uint64_t *full = n1 == 4 ? on1 : on2;
  uint64_t full_w = n1 == 4 ? 1 : 2;
  cr_assert(n1 == 4 || n2 == 4, "best fit fills one worker first");
  lt_sched_job_finished(s, full[0], 1);
  lt_sched_job_finished(s, full[1], 1);
  job(s, 10, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 1);
  job(s, 11, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 1, d, 16), 2);
  for (int i = 0; i < 2; i++) cr_assert_eq(d[i].worker_id, full_w, "best fit keeps holes");
  lt_sched_job_finished(s, full[2], 2);
  lt_sched_job_finished(s, 10, 2);
  /* now worker full_w has 2 free and the other 4 free: a 4-GPU gang must go whole there */
  job(s, 20, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 2);
  size_t n = lt_sched_decide(s, 2, d, 16);
  cr_assert_eq(n, 1);
  cr_assert_neq(d[0].worker_id, full_w);
  cr_assert_eq(__builtin_popcountll(d[0].gpu_mask), 4);
  /* a second gang of 4 does not fit in the 2 + 0 free GPUs: nothing starts */
  job(s, 21, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 3);
  cr_assert_eq(lt_sched_decide(s, 3, d, 16), 0, "no partial gang");
  lt_sched_destroy(s);
}

Test(sched, starving_gang_reserves_a_worker_and_starts_within_bound) {
  /* a stream of single-GPU jobs keeps every worker busy; the gang must still start */
  lt_sched_t *s = fleet((fleet_t){.gang = 100, .weights = {1, 1}, .workers = 2, .slots = 4, .cache = 2});
  lt_sched_decision_t d[16];
  running_t run = {0};
  uint64_t id = 100;
  for (int i = 0; i < 40; i++) job(s, id++, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 1, 2, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  double gang_start = -1;
  srand(3);
  for (int t = 0; t < 1000 && gang_start < 0; t++) {
    run_finish_due(s, &run, t);
    while (id < 100 + 40 + 2000) { /* keep 20 single-GPU jobs waiting */
      lt_sched_counters_t c;
      lt_sched_counters(s, &c);
      if (c.queued >= 20) break;
      job(s, id++, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, t);
    }
    size_t n = lt_sched_decide(s, t, d, 16);
    for (size_t i = 0; i < n; i++) {
      if (d[i].job_id == 1) {
        gang_start = t;
        cr_assert_eq(__builtin_popcountll(d[i].gpu_mask), 4);
      }
      run_add(&run, d[i].job_id, t + 20 + rand() % 40);
    }
  }
  /* bound: reservation after 100 s, then the reserved worker drains (jobs run <= 60 s) */
  cr_assert(gang_start >= 0 && gang_start <= 100 + 60 + 1, "gang started at %g", gang_start);
  lt_sched_destroy(s);
}

Test(sched, affinity_prefers_a_worker_holding_the_base_model) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  uint32_t m1, m2;
  char err[128];
  cr_assert_eq(lt_sched_model_intern(s, "llama-8b", &m1, err, sizeof err), LT_OK);
  cr_assert_eq(lt_sched_model_intern(s, "qwen-7b", &m2, err, sizeof err), LT_OK);
  tenant(s, 1, 1, 0, 0, 0);
  for (uint64_t w = 1; w <= 3; w++) worker(s, w, 4, 1);
  cr_assert_eq(lt_sched_worker_heartbeat(s, 3, &m1, 1, err, sizeof err), LT_OK);
  job(s, 1, 1, LT_CLASS_STANDARD, 1, m1, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert_eq(d[0].worker_id, 3, "the warm worker is chosen");
  cr_assert(!d[0].cold_load);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, m2, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert(d[0].cold_load, "no worker holds qwen-7b: a cold load");
  uint64_t w2 = d[0].worker_id;
  job(s, 3, 1, LT_CLASS_STANDARD, 1, m2, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert_eq(d[0].worker_id, w2, "the worker that loaded it is warm now");
  cr_assert(!d[0].cold_load);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.cold_loads, 1);
  lt_sched_destroy(s);
}

Test(sched, running_slot_quota_caps_a_tenant) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  tenant(s, 1, 1, 2, 0, 0);
  worker(s, 1, 8, 1);
  for (uint64_t i = 1; i <= 5; i++) job(s, i, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2, "max_running_slots 2");
  cr_assert_eq(lt_sched_decide(s, 1, d, 8), 0);
  lt_sched_job_finished(s, d[0].job_id ? 1 : 1, 2);
  cr_assert_eq(lt_sched_decide(s, 2, d, 8), 1, "one slot of quota came back");
  lt_sched_destroy(s);
}

Test(sched, queued_job_quota_refuses_admission_naming_the_limit) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  tenant(s, 7, 1, 0, 3, 0);
  char err[256] = "";
  for (uint64_t i = 1; i <= 3; i++) {
    cr_assert_eq(lt_sched_admit(s, 7, err, sizeof err), LT_OK);
    job(s, i, 7, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  }
  cr_assert_eq(lt_sched_admit(s, 7, err, sizeof err), LT_ERR_QUOTA);
  cr_assert(strstr(err, "max_queued_jobs") && strstr(err, "3"), "message: %s", err);
  cr_assert_eq(lt_sched_admit(s, 8, err, sizeof err), LT_ERR_NOT_FOUND);
  lt_sched_job_cancelled(s, 2, 1);
  cr_assert_eq(lt_sched_admit(s, 7, err, sizeof err), LT_OK, "a cancel frees queue quota");
  lt_sched_destroy(s);
}

Test(sched, max_duration_is_enforced_by_a_stop_decision) {
  lt_sched_t *s = fleet((fleet_t){.weights = {1}, .max_dur = 100, .workers = 1, .slots = 2, .cache = 1});
  job(s, 1, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert_eq(lt_sched_job_started(s, 1, 5), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 100, d, 8), 0, "ran 95 s of 100");
  size_t n = lt_sched_decide(s, 106, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].action, LT_SCHED_STOP);
  cr_assert_eq(d[0].job_id, 1);
  cr_assert_eq(lt_sched_decide(s, 200, d, 8), 0, "STOP is emitted once");
  lt_sched_destroy(s);
}

/* Invariant 9: an admitted job starts within a bounded time when a slot is free. With a
 * production reserve, standard work may wait beside free reserved slots only until it ages. */
Test(sched, admitted_job_starts_within_bound_when_a_slot_is_free) {
  const double aging = 60;
  lt_sched_t *s = fleet((fleet_t){.reserve = 0.25, .aging = aging, .preempt = 30,
                                  .weights = {2, 3, 1, 2, 3, 1}, /* 1 + t % 3 */
                                  .workers = 4, .slots = 4, .cache = 2});
  enum { MAXJ = 8192 };
  static double enq[MAXJ];
  static bool queued[MAXJ];
  lt_sched_decision_t d[64];
  running_t run = {0};
  uint64_t next_id = 1;
  int with_free_slot = 0;
  srand(11);
  for (int step = 0; step < 3000; step++) {
    double now = step;
    run_finish_due(s, &run, now);
    if (next_id < MAXJ - 4 && rand() % 4 == 0) {
      uint64_t id = next_id++;
      job(s, id, 1 + (uint64_t)(rand() % 6), (lt_job_class_t)(rand() % 3), 1,
          LT_SCHED_NO_MODEL, now);
      enq[id] = now;
      queued[id] = true;
    }
    size_t n = lt_sched_decide(s, now, d, 64);
    for (size_t i = 0; i < n; i++) {
      if (d[i].action == LT_SCHED_PREEMPT) {
        lt_sched_job_requeue(s, d[i].job_id, now);
        for (size_t k = 0; k < run.n; k++)
          if (run.id[k] == d[i].job_id) {
            run_forget(&run, k);
            break;
          }
        queued[d[i].job_id] = true;
        enq[d[i].job_id] = now;
        continue;
      }
      cr_assert_eq(d[i].action, LT_SCHED_DISPATCH);
      queued[d[i].job_id] = false;
      run_add(&run, d[i].job_id, now + 10 + rand() % 60);
    }
    lt_sched_counters_t c;
    lt_sched_counters(s, &c);
    if (c.slots_used < c.slots_total) {
      with_free_slot++;
      for (uint64_t id = 1; id < next_id; id++)
        cr_assert(!queued[id] || now - enq[id] <= aging,
                  "job %llu waited %g s with a free slot (bound %g s)", (unsigned long long)id,
                  now - enq[id], aging);
    }
  }
  cr_assert(with_free_slot > 100);
  lt_sched_destroy(s);
}

static const char *heavy_trace(void) {
  static char buf[1 << 16];
  size_t n = (size_t)snprintf(buf, sizeof buf, "arrival_s,tenant,class,gpus,duration_s,base_model\n");
  for (int i = 0; i < 200; i++)
    n += (size_t)snprintf(buf + n, sizeof buf - n, "%d,heavy,standard,1,300,llama-8b\n", i);
  for (int l = 0; l < 4; l++)
    for (int i = 0; i < 15; i++)
      n += (size_t)snprintf(buf + n, sizeof buf - n, "%d,light%d,standard,1,300,llama-8b\n",
                            60 + i * 40 + l, l);
  return buf;
}

static void run_sim(const char *text, lt_sched_policy_t p, lt_sched_sim_result_t *r) {
  lt_sched_trace_t *tr;
  char err[256];
  cr_assert_eq(lt_sched_trace_parse(text, strlen(text), &tr, err, sizeof err), LT_OK, "%s", err);
  lt_sched_sim_config_t cfg;
  lt_sched_sim_config_default(&cfg);
  cfg.sched.policy = p;
  cfg.sched.check_invariants = true;
  cfg.workers = 4;
  cfg.slots_per_worker = 4;
  cr_assert_eq(lt_sched_sim_run(tr, &cfg, r, err, sizeof err), LT_OK, "%s", err);
  lt_sched_trace_destroy(tr);
}

Test(sched, lathe_is_fairer_than_fifo_with_one_heavy_tenant) {
  lt_sched_sim_result_t lathe, fifo;
  run_sim(heavy_trace(), LT_SCHED_POLICY_LATHE, &lathe);
  run_sim(heavy_trace(), LT_SCHED_POLICY_FIFO, &fifo);
  cr_assert_eq(lathe.completed, 260);
  cr_assert_eq(fifo.completed, 260);
  double jl = lathe.jain[LT_CLASS_STANDARD], jf = fifo.jain[LT_CLASS_STANDARD];
  cr_assert(jl > jf + 0.1, "jain lathe %.3f vs fifo %.3f", jl, jf);
  cr_assert(jl > 0.9, "jain lathe %.3f", jl);
  /* light tenants wait less under Lathe */
  for (size_t i = 0; i < lathe.n_rows; i++)
    if (lathe.rows[i].tenant != 0)
      cr_assert(lathe.rows[i].wait_p99_s < fifo.rows[i].wait_p99_s);
  lt_sched_sim_result_free(&lathe);
  lt_sched_sim_result_free(&fifo);
}

static size_t random_run(uint32_t seed, lt_sched_decision_t *log, size_t cap) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0.1, 30, 20, 40);
  uint32_t models[3];
  char err[64];
  lt_sched_model_intern(s, "a", &models[0], err, sizeof err);
  lt_sched_model_intern(s, "b", &models[1], err, sizeof err);
  lt_sched_model_intern(s, "c", &models[2], err, sizeof err);
  for (uint64_t t = 1; t <= 8; t++) tenant(s, t, (double)(1 + t % 4), t == 3 ? 4 : 0, 0, 0);
  for (uint64_t w = 1; w <= 5; w++) worker(s, w, 4, 1);
  srand(seed);
  size_t nlog = 0, nrun = 0;
  uint64_t next_id = 1, running[64];
  lt_sched_decision_t d[32];
  for (int step = 0; step < 1500 && nlog < cap; step++) {
    double now = step;
    if (rand() % 2)
      job(s, next_id++, 1 + (uint64_t)(rand() % 8), (lt_job_class_t)(rand() % 3),
          1 + (uint32_t)(rand() % 3 == 0 ? rand() % 4 : 0), models[rand() % 3], now);
    size_t n = lt_sched_decide(s, now, d, 32);
    for (size_t i = 0; i < n && nlog < cap; i++) {
      log[nlog++] = d[i];
      if (d[i].action == LT_SCHED_DISPATCH) running[nrun++] = d[i].job_id;
    }
    /* finish (or, now and then, requeue) a random running job */
    if (nrun > 0 && rand() % 3 != 0) {
      size_t k = (size_t)rand() % nrun;
      if (rand() % 8) lt_sched_job_finished(s, running[k], now);
      else lt_sched_job_requeue(s, running[k], now);
      running[k] = running[--nrun];
    }
  }
  lt_sched_destroy(s);
  return nlog;
}

Test(sched, same_inputs_give_the_same_decisions) {
  static lt_sched_decision_t a[4096], b[4096];
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  size_t na = random_run(42, a, 4096), nb = random_run(42, b, 4096);
  cr_assert_eq(na, nb);
  cr_assert(na > 100, "the run made decisions (%zu)", na);
  cr_assert_eq(memcmp(a, b, na * sizeof a[0]), 0);
  lt_sched_sim_result_t r1, r2;
  run_sim(heavy_trace(), LT_SCHED_POLICY_LATHE, &r1);
  run_sim(heavy_trace(), LT_SCHED_POLICY_LATHE, &r2);
  cr_assert_eq(r1.n_rows, r2.n_rows);
  cr_assert_eq(memcmp(r1.rows, r2.rows, r1.n_rows * sizeof r1.rows[0]), 0);
  cr_assert_eq(r1.makespan_s, r2.makespan_s);
  lt_sched_sim_result_free(&r1);
  lt_sched_sim_result_free(&r2);
}

Test(sched, fifo_starts_jobs_in_arrival_order) {
  lt_sched_t *s = fleet((fleet_t){.policy = LT_SCHED_POLICY_FIFO, .weights = {1, 5}, .workers = 1, .slots = 1,
                                  .cache = 1});
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 2, 2, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 1);
  lt_sched_decision_t d[4];
  cr_assert_eq(lt_sched_decide(s, 2, d, 4), 1);
  cr_assert_eq(d[0].job_id, 1, "FIFO ignores class and weight");
  uint32_t pos;
  double est;
  cr_assert_eq(lt_sched_job_position(s, 2, &pos, &est), LT_OK);
  cr_assert_eq(pos, 0);
  lt_sched_destroy(s);
}

Test(sched, queue_position_and_wait_estimate) {
  lt_sched_t *s = fleet((fleet_t){.weights = {1, 1}, .workers = 1, .slots = 2, .cache = 1});
  for (uint64_t i = 1; i <= 2; i++) job(s, i, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[4];
  cr_assert_eq(lt_sched_decide(s, 0, d, 4), 2);
  lt_sched_job_finished(s, 1, 100);
  lt_sched_job_finished(s, 2, 100);
  for (uint64_t i = 10; i < 16; i++) job(s, i, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 100);
  job(s, 20, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 101);
  job(s, 30, 2, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 102);
  uint32_t p_prod, p_light, p_last;
  double w_prod, w_last;
  cr_assert_eq(lt_sched_job_position(s, 30, &p_prod, &w_prod), LT_OK);
  cr_assert_eq(lt_sched_job_position(s, 20, &p_light, NULL), LT_OK);
  cr_assert_eq(lt_sched_job_position(s, 15, &p_last, &w_last), LT_OK);
  cr_assert_eq(p_prod, 0, "production is next");
  cr_assert_eq(p_light, 2, "behind production and one job of the equal-weight tenant");
  cr_assert_eq(p_last, 7);
  cr_assert(w_last > w_prod && w_last > 0, "estimates grow with position (%g)", w_last);
  cr_assert_eq(lt_sched_job_position(s, 999, &p_last, NULL), LT_ERR_NOT_FOUND);
  lt_sched_destroy(s);
}

Test(sched, worker_loss_requeues_its_jobs_with_a_new_attempt) {
  lt_sched_t *s = fleet((fleet_t){.weights = {1}, .workers = 1, .slots = 2, .cache = 1});
  job(s, 1, 1, LT_CLASS_STANDARD, 2, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[4];
  cr_assert_eq(lt_sched_decide(s, 0, d, 4), 1);
  cr_assert_eq(d[0].attempt, 1);
  cr_assert_eq(lt_sched_worker_down(s, 1, 10), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 11, d, 4), 0, "no worker");
  worker(s, 2, 4, 1);
  cr_assert_eq(lt_sched_decide(s, 12, d, 4), 1);
  cr_assert_eq(d[0].worker_id, 2);
  cr_assert_eq(d[0].attempt, 2);
  lt_sched_destroy(s);
}

Test(sched, bad_trace_line_is_named_with_its_column) {
  const char *text = "arrival_s,tenant,class,gpus,duration_s,base_model\n"
                     "0,a,standard,1,10,m\n"
                     "\n"
                     "5,b,urgent,1,10,m\n";
  lt_sched_trace_t *tr = NULL;
  char err[256] = "";
  cr_assert_eq(lt_sched_trace_parse(text, strlen(text), &tr, err, sizeof err), LT_ERR_INVALID);
  cr_assert_null(tr);
  cr_assert(strstr(err, "line 4, column 3 (class)"), "message: %s", err);
  const char *t2 = "arrival_s,tenant,class,gpus,duration_s,base_model\n1,a,standard,two,10,m\n";
  cr_assert_eq(lt_sched_trace_parse(t2, strlen(t2), &tr, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "line 2, column 4 (gpus)"), "message: %s", err);
  const char *t3 = "0,a,standard,1,10,m\n";
  cr_assert_eq(lt_sched_trace_parse(t3, strlen(t3), &tr, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "line 1") && strstr(err, "header"), "message: %s", err);
  const char *t4 = "arrival_s,tenant,class,gpus,duration_s,base_model\n1,a,standard,1,10\n";
  cr_assert_eq(lt_sched_trace_parse(t4, strlen(t4), &tr, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "line 2") && strstr(err, "5 columns"), "message: %s", err);
}

Test(sched, waterfill_and_jain_index) {
  double demand[3] = {10, 1, 10}, weight[3] = {1, 1, 2}, alloc[3];
  lt_sched_waterfill(3, demand, weight, 10, alloc);
  cr_assert_float_eq(alloc[1], 1, 1e-9);
  cr_assert_float_eq(alloc[0], 3, 1e-9);
  cr_assert_float_eq(alloc[2], 6, 1e-9);
  double x1[3] = {1, 1, 1}, x2[2] = {1, 0};
  cr_assert_float_eq(lt_sched_jain_index(3, x1), 1, 1e-12);
  cr_assert_float_eq(lt_sched_jain_index(2, x2), 0.5, 1e-12);
}

/* ---- class order under load: a seeded synthetic trace through the pure policy -------------- */

/* One job of the synthetic trace and what happened to it in the run. */
typedef struct syn_job {
  double arrive, left, end, stop_at, wait;
  uint32_t gpus, worker;
  uint64_t tenant;
  lt_job_class_t cls;
  enum { SJ_FUTURE, SJ_QUEUED, SJ_RUNNING, SJ_STOPPING, SJ_DONE } state;
} syn_job_t;

enum { SYN_JOBS = 2000, SYN_TENANTS = 8, SYN_MAX_WORKERS = 64 };

static double syn_unit(uint64_t *x) { /* xorshift64*: uniform in (0, 1) */
  *x ^= *x >> 12;
  *x ^= *x << 25;
  *x ^= *x >> 27;
  return ((double)((*x * 0x2545F4914F6CDD1DULL) >> 11) + 0.5) / 9007199254740992.0;
}

/* The public-trace shape: 15% production, 60% standard, 25% preemptible, the same size
 * and duration distributions in every class: 80% 1 GPU, 15% 4, 5% 8; log-normal durations
 * (median 245 s, mean ~500 s, p99 ~4000 s); Poisson arrivals at `load` times the fleet's
 * slots; tenants 1..8 by a heavy-tailed draw, so tenant 1 is large. */
static void syn_trace(uint64_t seed, double load, uint32_t slots_total, syn_job_t *jobs) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  double mean_gpus = 0.8 * 1 + 0.15 * 4 + 0.05 * 8, mean_dur = exp(5.5 + 1.2 * 1.2 / 2);
  double gap = mean_gpus * mean_dur / (load * slots_total), t = 0;
  for (size_t i = 0; i < SYN_JOBS; i++) {
    syn_job_t *j = &jobs[i];
    t += -log(syn_unit(&x)) * gap;
    double r = syn_unit(&x), g = syn_unit(&x);
    double normal = sqrt(-2 * log(syn_unit(&x))) * cos(2 * M_PI * syn_unit(&x));
    uint64_t ten = (uint64_t)pow(syn_unit(&x), -1 / 1.2);
    *j = (syn_job_t){.arrive = t,
                     .left = fmax(10, round(exp(5.5 + 1.2 * normal))),
                     .gpus = g < 0.05 ? 8 : g < 0.2 ? 4 : 1,
                     .tenant = ten > SYN_TENANTS ? SYN_TENANTS : ten,
                     .cls = r < 0.15 ? LT_CLASS_PRODUCTION
                            : r < 0.75 ? LT_CLASS_STANDARD : LT_CLASS_PREEMPTIBLE,
                     .wait = -1};
  }
}

typedef struct syn_result {
  double p50[LT_CLASS__COUNT], p99[LT_CLASS__COUNT];
  uint32_t passed;       /* dispatches onto a slot a waiting higher-class job could use */
  uint64_t dispatches, preemptions;
} syn_result_t;

/* Whether dispatch d (class d->cls onto a worker with `free` free slots, before d books them)
 * passes a queued job of a higher class that could use the slot now: any production job that
 * fits; a standard job that fits and that the production reserve does not hold back. */
static bool syn_passes(const syn_job_t *jobs, const lt_sched_decision_t *d, uint32_t free,
                       uint32_t used_std, uint32_t std_cap) {
  for (size_t i = 0; i < SYN_JOBS; i++) {
    const syn_job_t *q = &jobs[i];
    if (q->state != SJ_QUEUED || q->cls >= d->cls || q->gpus > free) continue;
    if (q->cls == LT_CLASS_PRODUCTION || used_std + q->gpus <= std_cap) return true;
  }
  return false;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Per class, the p50 and p99 of the first-dispatch waits. */
static void syn_quantiles(const syn_job_t *jobs, syn_result_t *r) {
  static double w[SYN_JOBS];
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    size_t k = 0;
    for (size_t i = 0; i < SYN_JOBS; i++)
      if (jobs[i].cls == (lt_job_class_t)c) w[k++] = jobs[i].wait;
    qsort(w, k, sizeof w[0], cmp_double);
    r->p50[c] = k ? w[(k - 1) / 2] : 0;
    r->p99[c] = k ? w[(size_t)((double)(k - 1) * 0.99)] : 0;
  }
}

/* Applies the decisions of one decide call at now: dispatches start (each checked against the
 * queue as it stood when the policy made it), preempted jobs stop after a 30 s checkpoint. */
static void syn_apply(syn_job_t *jobs, const lt_sched_decision_t *d, size_t n, double now,
                      uint32_t *free, uint32_t *used_std, uint32_t std_cap, syn_result_t *r) {
  for (size_t i = 0; i < n; i++) {
    syn_job_t *j = &jobs[d[i].job_id - 1];
    if (d[i].action == LT_SCHED_PREEMPT) {
      cr_assert_eq(j->cls, LT_CLASS_PREEMPTIBLE, "only preemptible work is preempted");
      j->state = SJ_STOPPING;
      j->stop_at = now + 30;
      r->preemptions++;
      continue;
    }
    cr_assert_eq(d[i].action, LT_SCHED_DISPATCH);
    uint32_t w = (uint32_t)d[i].worker_id;
    if (syn_passes(jobs, &d[i], free[w], *used_std, std_cap)) r->passed++;
    free[w] -= j->gpus;
    if (j->cls == LT_CLASS_STANDARD) *used_std += j->gpus;
    j->state = SJ_RUNNING;
    j->worker = w;
    j->end = now + j->left;
    j->stop_at = now; /* its start, until a preemption sets the stop */
    if (j->wait < 0) j->wait = now - j->arrive;
    r->dispatches++;
  }
}

/* Drives the trace through lt_sched in virtual time on workers x 8 slots (aging 600 s,
 * preemption after 120 s, gang reservation after 300 s, production reserve 0.1), deciding at
 * every arrival and completion and every 5 s while jobs wait, until every job has finished. */
static void syn_run(syn_job_t *jobs, uint32_t workers, syn_result_t *r) {
  lt_sched_t *s = fleet((fleet_t){.reserve = 0.1, .aging = 600, .preempt = 120, .gang = 300,
                                  .weights = {2, 1, 1, 3, 1, 1, 2, 1},
                                  .workers = workers, .slots = 8, .cache = 2});
  uint32_t free[SYN_MAX_WORKERS + 1], used_std = 0, std_cap = workers * 8 - workers * 8 / 10;
  for (uint32_t w = 1; w <= workers; w++) free[w] = 8;
  memset(r, 0, sizeof *r);
  static lt_sched_decision_t d[256];
  size_t next = 0, done = 0;
  double now = 0;
  while (done < SYN_JOBS) {
    double t_next = next < SYN_JOBS ? jobs[next].arrive : INFINITY;
    bool waiting = false;
    for (size_t i = 0; i < next; i++) {
      syn_job_t *j = &jobs[i];
      bool stops = j->state == SJ_STOPPING && j->stop_at <= now && j->end > now;
      if ((j->state == SJ_RUNNING || j->state == SJ_STOPPING) && (j->end <= now || stops)) {
        free[j->worker] += j->gpus;
        if (j->cls == LT_CLASS_STANDARD) used_std -= j->gpus;
        if (stops) {
          j->left = j->end - now;
          cr_assert_eq(lt_sched_job_requeue(s, i + 1, now), LT_OK);
          j->state = SJ_QUEUED;
        } else {
          cr_assert_eq(lt_sched_job_finished(s, i + 1, now), LT_OK);
          j->state = SJ_DONE;
          done++;
        }
      }
      waiting |= j->state == SJ_QUEUED;
      if (j->state == SJ_RUNNING || j->state == SJ_STOPPING) t_next = fmin(t_next, j->end);
      if (j->state == SJ_STOPPING) t_next = fmin(t_next, j->stop_at);
    }
    for (; next < SYN_JOBS && jobs[next].arrive <= now; next++) {
      job(s, next + 1, jobs[next].tenant, jobs[next].cls, jobs[next].gpus, LT_SCHED_NO_MODEL,
          now);
      jobs[next].state = SJ_QUEUED;
      waiting = true;
    }
    size_t n = lt_sched_decide(s, now, d, 256);
    syn_apply(jobs, d, n, now, free, &used_std, std_cap, r);
    if (waiting) t_next = fmin(t_next, now + 5);
    if (done < SYN_JOBS) now = fmax(t_next, now);
  }
  syn_quantiles(jobs, r);
  lt_sched_destroy(s);
}

static void syn_print(const char *what, const syn_result_t *r) {
  fprintf(stderr, "%s: wait p50/p99 production %.0f/%.0f s, standard %.0f/%.0f s, "
          "preemptible %.0f/%.0f s; %llu preemptions, %u passes\n", what,
          r->p50[0], r->p99[0], r->p50[1], r->p99[1], r->p50[2], r->p99[2],
          (unsigned long long)r->preemptions, r->passed);
}

/* No dispatch passed a waiting higher-class job, and waits are in class order. The one slack:
 * a production gang that finds no whole worker free waits one checkpoint (30 s) for the
 * preemptible work it displaces, which can exceed standard's p99 when standard barely waits. */
static void assert_class_order(const syn_result_t *r) {
  cr_assert_eq(r->passed, 0, "%u dispatches passed a waiting higher-class job", r->passed);
  cr_assert(r->p50[0] <= r->p50[1] && r->p50[1] <= r->p50[2],
            "p50 waits out of class order: %g, %g, %g s", r->p50[0], r->p50[1], r->p50[2]);
  cr_assert(r->p99[0] <= fmax(r->p99[1], 30) && r->p99[1] <= r->p99[2],
            "p99 waits out of class order: %g, %g, %g s", r->p99[0], r->p99[1], r->p99[2]);
}

/* docs/DESIGN.md §4 invariant 9 in overload: every standard job ages past aging_s, which must
 * not let standard work take production's turn. */
Test(sched, overloaded_trace_keeps_waits_in_class_order) {
  static syn_job_t jobs[SYN_JOBS];
  syn_trace(13, 1.5, 16 * 8, jobs);
  syn_result_t r;
  syn_run(jobs, 16, &r);
  syn_print("150% load, 16 x 8", &r);
  assert_class_order(&r);
  cr_assert(r.p99[1] > 3600, "the trace is overloaded: standard waits past an hour (%g s)",
            r.p99[1]);
  cr_assert(r.preemptions > 0, "preemptible work is preempted for production");
}

Test(sched, moderately_loaded_trace_keeps_waits_in_class_order) {
  static syn_job_t jobs[SYN_JOBS];
  syn_trace(14, 0.7, 16 * 8, jobs);
  syn_result_t r;
  syn_run(jobs, 16, &r);
  syn_print("70% load, 16 x 8", &r);
  assert_class_order(&r);
}

/* Invariant 9, the targeted cases: a production job waiting for a slot is never passed by a
 * standard or preemptible job starting on a slot it could use — not when its tenant's own
 * gang, ahead of it, finds no hole; not by aged standard work; not on a worker draining for a
 * standard gang. */
Test(sched, production_job_is_never_passed_on_a_slot_it_could_use) {
  lt_sched_t *s = fleet((fleet_t){.reserve = 0.25, .aging = 60, .gang = 10,
                                  .weights = {1, 1}, .workers = 2, .slots = 4, .cache = 1});
  lt_sched_decision_t d[16];
  for (uint64_t i = 1; i <= 7; i++) job(s, i, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 16), 6, "standard holds at most 1 - reserve of 8");
  /* tenant 1: a production gang no worker can hold, then a 1-GPU production job */
  job(s, 100, 1, LT_CLASS_PRODUCTION, 4, LT_SCHED_NO_MODEL, 1);
  job(s, 101, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 1);
  job(s, 200, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 1);
  /* the standard job 7 has aged past 60 s: it may use the reserve only after production */
  size_t n = lt_sched_decide(s, 100, d, 16);
  cr_assert(n >= 1 && d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 101,
            "the 1-GPU production job behind its tenant's gang starts first, not %llu",
            (unsigned long long)d[0].job_id);
  for (size_t i = 1; i < n; i++)
    cr_assert(d[i].action != LT_SCHED_DISPATCH || d[i].job_id == 7,
              "only the aged standard job may take the last free slot, not %llu",
              (unsigned long long)d[i].job_id);
  lt_sched_destroy(s);

  /* a worker draining for a standard gang does not keep production off its free slots */
  s = fleet((fleet_t){.gang = 10, .weights = {1, 1}, .workers = 1, .slots = 4, .cache = 1});
  for (uint64_t i = 1; i <= 3; i++) job(s, i, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 16), 3);
  job(s, 50, 2, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  job(s, 51, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 20, d, 16), 1, "the 1-GPU standard job fills the hole");
  cr_assert_eq(d[0].job_id, 51);
  lt_sched_job_finished(s, 51, 21);
  cr_assert_eq(lt_sched_decide(s, 21, d, 16), 0, "the worker drains for the gang");
  job(s, 60, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 22);
  job(s, 61, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 22);
  n = lt_sched_decide(s, 22, d, 16);
  cr_assert_eq(n, 1, "production takes the drained slot; preemptible does not");
  cr_assert_eq(d[0].job_id, 60);
  lt_sched_destroy(s);
}

/* Trying the jobs behind a blocked head stays cheap: a tenant whose quota holds back hundreds
 * of queued gangs costs one try, not max_scan, so other tenants still start in the call. */
Test(sched, a_quota_held_queue_does_not_use_up_the_scan) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  tenant(s, 1, 1, 2, 0, 0); /* max_running_slots 2 */
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 8, 1);
  for (uint64_t i = 1; i <= 400; i++) job(s, i, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  job(s, 401, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  for (uint64_t i = 500; i < 504; i++) job(s, i, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 1);
  lt_sched_decision_t d[16];
  size_t n = lt_sched_decide(s, 2, d, 16);
  cr_assert_eq(n, 5, "tenant 1's 1-GPU job and tenant 2's four start (got %zu)", n);
  lt_sched_destroy(s);
}

/* ---- visibility: GPU-seconds, cold loads, reserved idle slots, fragmentation --------------- */

static const lt_sched_usage_t *usage_of(const lt_sched_usage_t *u, size_t n, uint64_t tenant_id) {
  for (size_t i = 0; i < n; i++)
    if (u[i].tenant_id == tenant_id) return &u[i];
  cr_assert_fail("tenant %llu has no usage row", (unsigned long long)tenant_id);
  return NULL;
}

Test(sched, gpu_seconds_and_cold_loads_are_counted_per_tenant_and_class) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  uint32_t m;
  char err[128];
  cr_assert_eq(lt_sched_model_intern(s, "llama-8b", &m, err, sizeof err), LT_OK);
  tenant(s, 1, 1, 0, 0, 0);
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 4, 2);
  job(s, 10, 1, LT_CLASS_STANDARD, 2, m, 0);                  /* a cold load */
  job(s, 20, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0); /* no model: never cold */
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  cr_assert_eq(lt_sched_job_started(s, 10, 10), LT_OK); /* runs from its AttemptStarted */
  lt_sched_usage_t u[4];
  cr_assert_eq(lt_sched_tenants_usage(s, 1810, u, 4), 2);
  /* running now: 2 GPUs x 1800 s since its start; 1 GPU x 1810 s since its dispatch */
  cr_assert_float_eq(usage_of(u, 2, 1)->gpu_seconds[LT_CLASS_STANDARD], 3600, 1e-9);
  cr_assert_float_eq(usage_of(u, 2, 2)->gpu_seconds[LT_CLASS_PREEMPTIBLE], 1810, 1e-9);
  cr_assert_eq(usage_of(u, 2, 1)->cold_loads[LT_CLASS_STANDARD], 1);
  cr_assert_eq(usage_of(u, 2, 2)->cold_loads[LT_CLASS_PREEMPTIBLE], 0);
  /* tenant 2's job is requeued at 1810 (kept), tenant 1's finishes at 3610 */
  cr_assert_eq(lt_sched_job_requeue(s, 20, 1810), LT_OK);
  cr_assert_eq(lt_sched_job_finished(s, 10, 3610), LT_OK);
  cr_assert_eq(lt_sched_tenants_usage(s, 5000, u, 4), 2);
  cr_assert_float_eq(usage_of(u, 2, 1)->gpu_seconds[LT_CLASS_STANDARD], 7200, 1e-9);
  cr_assert_float_eq(usage_of(u, 2, 2)->gpu_seconds[LT_CLASS_PREEMPTIBLE], 1810, 1e-9);
  cr_assert_float_eq(usage_of(u, 2, 1)->gpu_seconds[LT_CLASS_PREEMPTIBLE], 0, 1e-9);
  /* a second run of the same model on the same worker is warm: still one cold load */
  job(s, 11, 1, LT_CLASS_STANDARD, 1, m, 5000);
  cr_assert_eq(lt_sched_decide(s, 5000, d, 8), 2);
  lt_sched_tenants_usage(s, 5000, u, 4);
  cr_assert_eq(usage_of(u, 2, 1)->cold_loads[LT_CLASS_STANDARD], 1);
  /* waits: tenant 1's two jobs started at once; tenant 2's job at 0 s, then 3190 s after its
   * requeue (between the 1800 s and 3600 s bounds) */
  const lt_sched_usage_t *u1 = usage_of(u, 2, 1), *u2 = usage_of(u, 2, 2);
  cr_assert_eq(u1->waits[LT_CLASS_STANDARD], 2);
  cr_assert_eq(u1->wait_le[LT_CLASS_STANDARD][0], 2, "both <= 1 s");
  cr_assert_eq(u2->waits[LT_CLASS_PREEMPTIBLE], 2);
  cr_assert_float_eq(u2->wait_sum_s[LT_CLASS_PREEMPTIBLE], 3190, 1e-9);
  cr_assert_eq(lt_sched_wait_bounds_s[6], 1800);
  cr_assert_eq(u2->wait_le[LT_CLASS_PREEMPTIBLE][6], 1);
  cr_assert_eq(u2->wait_le[LT_CLASS_PREEMPTIBLE][7], 2);
  cr_assert_eq(u2->wait_le[LT_CLASS_PREEMPTIBLE][LT_SCHED_WAIT_BUCKETS - 1], 2);
  cr_assert(u2->wait_p99_s[LT_CLASS_PREEMPTIBLE] > 3190 / 1.15 &&
            u2->wait_p99_s[LT_CLASS_PREEMPTIBLE] < 3190 * 1.15, "p99 %g",
            u2->wait_p99_s[LT_CLASS_PREEMPTIBLE]);
  cr_assert_eq(u2->waits[LT_CLASS_STANDARD], 0, "tenant 2 ran nothing standard");
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.cold_loads, 1);
  lt_sched_destroy(s);
}

Test(sched, reserved_worker_idle_slots_are_integrated_over_time) {
  /* two 4-slot workers run a 1-GPU job each (the second on the worker that holds its model);
   * a 4-GPU gang waits, reserves worker 1 at 100 s and starts there when its job ends at
   * 110 s: 3 free slots held for 10 s = 30 slot-seconds */
  lt_sched_t *s = fleet((fleet_t){.gang = 100, .weights = {1, 1}, .workers = 2, .slots = 4, .cache = 2});
  uint32_t m;
  char err[128];
  cr_assert_eq(lt_sched_model_intern(s, "llama-8b", &m, err, sizeof err), LT_OK);
  cr_assert_eq(lt_sched_worker_heartbeat(s, 2, &m, 1, err, sizeof err), LT_OK);
  lt_sched_decision_t d[8];
  job(s, 1, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  uint64_t w_first = d[0].worker_id;
  job(s, 3, 1, LT_CLASS_STANDARD, 1, m, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert_eq(d[0].worker_id, 2, "the warm worker");
  cr_assert_eq(w_first, 1);
  job(s, 2, 2, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 50, d, 8), 0);
  cr_assert_eq(lt_sched_reserved_idle_slots(s, NULL), 0, "not reserved before 100 s");
  cr_assert_eq(lt_sched_fragmented_slots(s), 6, "3 + 3 free, too few for the gang");
  cr_assert_eq(lt_sched_decide(s, 100, d, 8), 0);
  uint32_t nres = 0;
  cr_assert_eq(lt_sched_reserved_idle_slots(s, &nres), 3);
  cr_assert_eq(nres, 1);
  cr_assert_float_eq(lt_sched_reserved_idle_slot_s(s, 100), 0, 1e-9);
  cr_assert_float_eq(lt_sched_reserved_idle_slot_s(s, 105), 15, 1e-9);
  cr_assert_eq(lt_sched_fragmented_slots(s), 3, "a reserved worker's free slots are reserved "
                                                "idle, not fragmented");
  cr_assert_eq(lt_sched_job_finished(s, 1, 110), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 110, d, 8), 1);
  cr_assert_eq(d[0].job_id, 2);
  cr_assert_eq(d[0].worker_id, 1);
  cr_assert_eq(lt_sched_reserved_idle_slots(s, NULL), 0);
  cr_assert_float_eq(lt_sched_reserved_idle_slot_s(s, 110), 30, 1e-9);
  cr_assert_float_eq(lt_sched_reserved_idle_slot_s(s, 500), 30, 1e-9, "nothing held since");
  lt_sched_destroy(s);
}

Test(sched, fragmented_slots_are_free_slots_too_few_for_the_smallest_waiting_job) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, -1);
  tenant(s, 1, 1, 0, 0, 0);
  worker(s, 1, 4, 2);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_fragmented_slots(s), 0, "nothing waits: idle, not fragmented");
  job(s, 1, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1); /* worker 1: 3 free */
  worker(s, 2, 3, 2);                           /* worker 2: 3 free */
  job(s, 2, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 1, d, 8), 0);
  cr_assert_eq(lt_sched_smallest_queued(s), 4);
  cr_assert_eq(lt_sched_fragmented_slots(s), 6, "3 + 3 free, neither hosts the 4-GPU gang");
  job(s, 3, 1, LT_CLASS_STANDARD, 3, LT_SCHED_NO_MODEL, 1); /* now a 3-GPU job waits too */
  cr_assert_eq(lt_sched_smallest_queued(s), 3);
  cr_assert_eq(lt_sched_fragmented_slots(s), 0, "each worker hosts the 3-GPU job");
  cr_assert_eq(lt_sched_decide(s, 1, d, 8), 1);
  cr_assert_eq(lt_sched_smallest_queued(s), 4);
  cr_assert_eq(lt_sched_fragmented_slots(s), 3, "the other worker's 3 free slots");
  lt_sched_destroy(s);
}

/* ---- multi-worker gangs on node groups ------------------------------------------------------ */

/* A scheduler for gang cases: gang reservation after `gang` s (<= 0: never), preemption after
 * `preempt` s (<= 0: never), at most max_res workers reserved (0: the default); tenant 1. */
static lt_sched_t *gang_fleet(double gang, double preempt, uint32_t max_res) {
  lt_sched_config_t c;
  lt_sched_config_default(&c);
  c.gang_reserve_after_s = gang > 0 ? gang : -1;
  c.preempt_after_s = preempt > 0 ? preempt : -1;
  c.max_reservations = max_res;
  c.production_reserve = 0;
  c.max_jobs = 256;
  c.max_workers = 16;
  c.check_invariants = true;
  lt_sched_t *s;
  char err[256];
  cr_assert_eq(lt_sched_new(&c, &s, err, sizeof err), LT_OK, "%s", err);
  tenant(s, 1, 1, 0, 0, 0);
  return s;
}

static void gworker(lt_sched_t *s, uint64_t id, uint32_t slots, uint32_t group) {
  lt_sched_worker_t w = {.id = id, .slots = slots, .mem_bytes = slots * 80 * GB,
                         .model_cache = 1, .node_group = group};
  char err[256];
  cr_assert_eq(lt_sched_worker_up(s, &w, err, sizeof err), LT_OK, "%s", err);
}

/* The decisions d[0..n) are one job's world rows: same action, job and attempt, ranks 0.. in
 * order, distinct workers, masks of `gpus_each` GPUs (0: any). */
static void assert_gang_rows(const lt_sched_decision_t *d, size_t n, uint64_t job_id,
                             uint32_t gpus_each) {
  cr_assert(n >= 1);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(d[i].job_id, job_id);
    cr_assert_eq(d[i].action, d[0].action);
    cr_assert_eq(d[i].attempt, d[0].attempt);
    cr_assert_eq(d[i].rank, i, "rank 0 first, in order");
    cr_assert_eq(d[i].world, n);
    if (gpus_each) cr_assert_eq(__builtin_popcountll(d[i].gpu_mask), gpus_each);
    for (size_t k = 0; k < i; k++) cr_assert_neq(d[i].worker_id, d[k].worker_id);
  }
}

Test(sched, gang_of_16_starts_on_two_workers_of_one_group_with_ranks) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 7);
  gworker(s, 2, 8, 7);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  size_t n = lt_sched_decide(s, 0, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  cr_assert_eq(d[0].action, LT_SCHED_DISPATCH);
  cr_assert_eq(d[0].gpu_mask, 0xff);
  cr_assert_eq(d[1].gpu_mask, 0xff);
  cr_assert_eq(d[0].attempt, 1);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.running, 1, "one job on two workers");
  cr_assert_eq(c.slots_used, 16);
  /* finished: both parts are free again, and a single-worker job sees world 1 */
  cr_assert_eq(lt_sched_job_finished(s, 1, 10), LT_OK);
  job(s, 2, 1, LT_CLASS_STANDARD, 8, LT_SCHED_NO_MODEL, 10);
  cr_assert_eq(lt_sched_decide(s, 10, d, 8), 1);
  cr_assert_eq(d[0].world, 1);
  cr_assert_eq(d[0].rank, 0);
  lt_sched_destroy(s);
}

Test(sched, gang_never_spans_two_node_groups) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 1);
  gworker(s, 2, 8, 2);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 0, "16 GPUs free, but in two groups");
  gworker(s, 3, 8, 2);
  size_t n = lt_sched_decide(s, 1, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  for (size_t i = 0; i < n; i++) cr_assert_neq(d[i].worker_id, 1, "group 2 only");
  lt_sched_destroy(s);
}

Test(sched, gang_waits_all_or_nothing_while_only_15_slots_are_free) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 0);
  gworker(s, 2, 8, 0);
  job(s, 1, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  job(s, 2, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 1, d, 8), 0, "no partial gang on 15 free slots");
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.slots_used, 1);
  cr_assert_eq(lt_sched_job_finished(s, 1, 2), LT_OK);
  size_t n = lt_sched_decide(s, 2, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 2, 8);
  /* a gang's rows are never split across calls: with room for one row, it waits */
  cr_assert_eq(lt_sched_job_requeue(s, 2, 3), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 3, d, 1), 0);
  cr_assert_eq(lt_sched_decide(s, 3, d, 2), 2);
  lt_sched_destroy(s);
}

Test(sched, gang_of_8_prefers_one_worker_over_two_half_free_ones) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 0);
  gworker(s, 2, 8, 0);
  lt_sched_decision_t d[8];
  /* 4-GPU jobs: 10 and 11 fill worker 1 (best fit), 12 half of worker 2; 11 ends */
  for (uint64_t i = 10; i <= 12; i++) job(s, i, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 3);
  cr_assert_eq(lt_sched_job_finished(s, 11, 1), LT_OK);
  job(s, 1, 1, LT_CLASS_STANDARD, 8, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 1, d, 8), 0, "8 GPUs fit one worker: not split over two");
  gworker(s, 3, 8, 0);
  size_t n = lt_sched_decide(s, 2, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].worker_id, 3);
  cr_assert_eq(d[0].world, 1);
  cr_assert_eq(d[0].gpu_mask, 0xff);
  lt_sched_destroy(s);
}

Test(sched, gang_prefers_whole_free_workers_and_best_fit_for_the_rest) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  for (uint64_t w = 1; w <= 4; w++) gworker(s, w, 8, 0);
  lt_sched_decision_t d[8];
  /* worker 1: 2 free (a 6-GPU job), worker 2: 4 free (a 4-GPU job), 3 and 4 whole */
  job(s, 10, 1, LT_CLASS_STANDARD, 6, LT_SCHED_NO_MODEL, 0);
  job(s, 11, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  cr_assert_eq(d[0].worker_id, 1);
  cr_assert_eq(d[1].worker_id, 2);
  /* 10 GPUs: one whole worker and the 2 left on worker 1 (best fit), not 8 + 4 */
  job(s, 1, 1, LT_CLASS_STANDARD, 10, LT_SCHED_NO_MODEL, 1);
  size_t n = lt_sched_decide(s, 1, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 0);
  cr_assert(d[0].worker_id == 3 || d[0].worker_id == 4);
  cr_assert_eq(d[0].gpu_mask, 0xff);
  cr_assert_eq(d[1].worker_id, 1);
  cr_assert_eq(__builtin_popcountll(d[1].gpu_mask), 2);
  lt_sched_destroy(s);
}

Test(sched, losing_a_worker_of_a_gang_requeues_the_whole_gang) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  for (uint64_t w = 1; w <= 3; w++) gworker(s, w, 8, 0);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  uint64_t lost = d[1].worker_id, kept = d[0].worker_id;
  cr_assert_eq(lt_sched_worker_down(s, lost, 10), LT_OK);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.running, 0);
  cr_assert_eq(c.queued, 1);
  cr_assert_eq(c.slots_used, 0, "the part on the other worker is freed");
  size_t n = lt_sched_decide(s, 11, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  cr_assert_eq(d[0].attempt, 2);
  for (size_t i = 0; i < n; i++) cr_assert_neq(d[i].worker_id, lost);
  cr_assert(d[0].worker_id == kept || d[1].worker_id == kept);
  lt_sched_destroy(s);
}

/* A new leader books what the log says runs (lt_sched_job_book): a gang on its workers in rank
 * order, whatever a decision would have chosen; bad bookings are refused and change nothing. */
Test(sched, a_running_gang_is_booked_where_the_log_says_it_runs) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  for (uint64_t w = 1; w <= 3; w++) gworker(s, w, 8, 7);
  gworker(s, 4, 8, 9);
  job(s, 1, 1, LT_CLASS_STANDARD, 12, LT_SCHED_NO_MODEL, 0);
  job(s, 2, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 0);
  char err[256] = "";
  uint64_t twice[2] = {3, 3}, groups[2] = {3, 4}, down[2] = {3, 5}, ranks[2] = {3, 1};
  cr_assert_eq(lt_sched_job_book(s, 1, twice, NULL, 2, 5, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "named twice"), "%s", err);
  cr_assert_eq(lt_sched_job_book(s, 1, groups, NULL, 2, 5, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "node group"), "%s", err);
  cr_assert_eq(lt_sched_job_book(s, 1, down, NULL, 2, 5, err, sizeof err), LT_ERR_NOT_FOUND);
  cr_assert(strstr(err, "worker 5 (rank 1) is not up"), "%s", err);
  cr_assert_eq(lt_sched_job_book(s, 1, ranks, NULL, 1, 5, err, sizeof err), LT_ERR_UNAVAILABLE, "12 GPUs on one 8-slot worker");
  cr_assert(strstr(err, "needs 12 GPUs"), "%s", err);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.running, 0, "a refused booking changed something");
  cr_assert_eq(c.slots_used, 0);
  /* rank 0 on worker 3, rank 1 on worker 1: 8 + 4 GPUs */
  cr_assert_eq(lt_sched_job_book(s, 1, ranks, NULL, 2, 5, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_sched_job_book(s, 1, ranks, NULL, 2, 5, err, sizeof err), LT_ERR_NOT_FOUND, "booked twice");
  lt_sched_counters(s, &c);
  cr_assert_eq(c.running, 1);
  cr_assert_eq(c.slots_used, 12);
  uint64_t w1[1] = {1};
  cr_assert_eq(lt_sched_job_book(s, 2, w1, NULL, 1, 5, err, sizeof err), LT_OK, "%s", err);
  /* workers 1 and 3 are full: a new 8-GPU job goes to worker 2 or 4, never onto the gang */
  job(s, 3, 1, LT_CLASS_STANDARD, 8, LT_SCHED_NO_MODEL, 6);
  lt_sched_decision_t d[8];
  size_t n = lt_sched_decide(s, 6, d, 8);
  cr_assert_eq(n, 1);
  cr_assert(d[0].worker_id == 2 || d[0].worker_id == 4, "dispatched onto worker %llu", (unsigned long long)d[0].worker_id);
  /* losing rank 1's worker frees the gang's part on worker 3 too, and requeues it */
  cr_assert_eq(lt_sched_worker_down(s, 1, 10), LT_OK);
  lt_sched_counters(s, &c);
  cr_assert_eq(c.slots_used, 8, "only job 3 runs");
  cr_assert_eq(c.queued, 2, "the gang and job 2 wait again");
  lt_sched_destroy(s);
}

/* With the GPUs its dispatch named (JobDispatched v4's gang_gpu_masks), a gang is booked on
 * exactly those, whatever is free elsewhere on its workers; the jobs on one worker then take what
 * is left. Without them, a gang dispatched as 3 + 3 on two 4-slot workers would be booked as
 * 4 + 2, and the job on one of them refused (a job that runs left out, its GPU shown free). */
Test(sched, a_running_gang_is_booked_on_the_gpus_its_dispatch_named) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  for (uint64_t w = 1; w <= 3; w++) gworker(s, w, 4, 7);
  job(s, 10, 1, LT_CLASS_STANDARD, 6, LT_SCHED_NO_MODEL, 0);
  job(s, 11, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  job(s, 12, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  char err[256] = "";
  uint64_t gang_w[2] = {1, 3}, over[2] = {0xf, 0x7}, many[2] = {0x7, 0xf}, named[2] = {0xe, 0x7};
  cr_assert_eq(lt_sched_job_book(s, 10, gang_w, many, 2, 1, err, sizeof err), LT_ERR_UNAVAILABLE, "7 GPUs of 6");
  cr_assert(strstr(err, "rank 1's GPUs (mask 0xf)"), "%s", err);
  cr_assert_eq(lt_sched_job_book(s, 10, gang_w, named, 2, 1, err, sizeof err), LT_OK, "%s", err);
  uint64_t w1[1] = {1}, w3[1] = {3};
  cr_assert_eq(lt_sched_job_book(s, 11, w1, NULL, 1, 1, err, sizeof err), LT_OK, "the GPU the gang left on worker 1: %s", err);
  cr_assert_eq(lt_sched_job_book(s, 12, w3, NULL, 1, 1, err, sizeof err), LT_OK, "the GPU the gang left on worker 3: %s", err);
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.running, 3);
  cr_assert_eq(c.slots_used, 8);
  /* a mask naming GPUs another job holds is refused, and changes nothing */
  job(s, 13, 1, LT_CLASS_STANDARD, 4, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_job_book(s, 13, gang_w, over, 1, 1, err, sizeof err), LT_ERR_UNAVAILABLE);
  lt_sched_counters(s, &c);
  cr_assert_eq(c.slots_used, 8);
  /* workers 1 and 3 are full: job 13 (4 GPUs) goes to worker 2 */
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 2, d, 8), 1);
  cr_assert_eq(d[0].job_id, 13);
  cr_assert_eq(d[0].worker_id, 2);
  lt_sched_destroy(s);
}

Test(sched, production_gang_preempts_preemptible_work_across_workers) {
  lt_sched_t *s = gang_fleet(0, 120, 0);
  gworker(s, 1, 8, 0);
  gworker(s, 2, 8, 0);
  lt_sched_decision_t d[8];
  /* a preemptible 16-GPU gang holds both workers */
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 16, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  /* a production 16-GPU gang preempts it at once: one PREEMPT row per part */
  job(s, 2, 1, LT_CLASS_PRODUCTION, 16, LT_SCHED_NO_MODEL, 5);
  size_t n = lt_sched_decide(s, 5, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT);
  cr_assert_eq(lt_sched_decide(s, 6, d, 8), 0, "the checkpoint is still in flight");
  cr_assert_eq(lt_sched_job_requeue(s, 1, 35), LT_OK);
  n = lt_sched_decide(s, 35, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 2, 8);
  cr_assert_eq(d[0].action, LT_SCHED_DISPATCH);
  lt_sched_destroy(s);
}

Test(sched, production_gang_preempts_single_worker_jobs_on_the_workers_it_takes) {
  lt_sched_t *s = gang_fleet(0, 120, 0);
  for (uint64_t w = 1; w <= 3; w++) gworker(s, w, 8, 0);
  lt_sched_decision_t d[16];
  /* workers 1 and 2: a preemptible 8-GPU job each; worker 3: a standard one (kept) */
  job(s, 10, 1, LT_CLASS_STANDARD, 8, LT_SCHED_NO_MODEL, 0);
  job(s, 11, 1, LT_CLASS_PREEMPTIBLE, 8, LT_SCHED_NO_MODEL, 0);
  job(s, 12, 1, LT_CLASS_PREEMPTIBLE, 8, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 16), 3);
  job(s, 1, 1, LT_CLASS_PRODUCTION, 16, LT_SCHED_NO_MODEL, 1);
  size_t n = lt_sched_decide(s, 1, d, 16);
  cr_assert_eq(n, 2);
  uint64_t got = 0;
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(d[i].action, LT_SCHED_PREEMPT);
    cr_assert_eq(d[i].world, 1);
    got |= 1ULL << d[i].job_id;
  }
  cr_assert_eq(got, (1ULL << 11) | (1ULL << 12), "only the preemptible jobs");
  cr_assert_eq(lt_sched_job_requeue(s, 11, 30), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 30, d, 16), 0, "8 of 16 free: all or nothing");
  cr_assert_eq(lt_sched_job_requeue(s, 12, 31), LT_OK);
  n = lt_sched_decide(s, 31, d, 16);
  cr_assert_eq(n, 2, "the gang, and not the requeued preemptible jobs");
  assert_gang_rows(d, n, 1, 8);
  lt_sched_destroy(s);
}

/* Two workers run a 7-GPU preemptible job each (preemption off); a standard 16-GPU gang waits
 * past its reservation bound (10 s); then a standard 1-GPU job arrives. Returns whether that job
 * started. */
static bool gang_reservation_run(uint32_t max_res) {
  lt_sched_t *s = gang_fleet(10, 0, max_res);
  gworker(s, 1, 8, 0);
  gworker(s, 2, 8, 0);
  lt_sched_decision_t d[8];
  job(s, 10, 1, LT_CLASS_PREEMPTIBLE, 7, LT_SCHED_NO_MODEL, 0);
  job(s, 11, 1, LT_CLASS_PREEMPTIBLE, 7, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 15, d, 8), 0);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 16);
  size_t n = lt_sched_decide(s, 16, d, 8);
  bool started = n == 1 && d[0].job_id == 2;
  if (!started) {
    /* the workers drain for the gang; a production job may still use them (class order) */
    job(s, 3, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 17);
    cr_assert_eq(lt_sched_decide(s, 17, d, 8), 1);
    cr_assert_eq(d[0].job_id, 3);
    cr_assert_eq(lt_sched_job_finished(s, 3, 18), LT_OK);
    cr_assert_eq(lt_sched_job_finished(s, 10, 18), LT_OK);
    cr_assert_eq(lt_sched_job_finished(s, 11, 18), LT_OK);
    n = lt_sched_decide(s, 18, d, 8);
    cr_assert_eq(n, 2, "drained: the gang starts before the waiting 1-GPU job");
    assert_gang_rows(d, n, 1, 8);
  }
  lt_sched_destroy(s);
  return started;
}

Test(sched, gang_reservation_drains_workers_within_the_reservation_bound) {
  cr_assert(!gang_reservation_run(2), "two workers reserved: the 1-GPU job waits");
  cr_assert(gang_reservation_run(1), "the gang needs two workers, the bound is one: no drain");
}

Test(sched, gang_past_max_duration_gets_a_stop_row_per_part) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  tenant(s, 1, 1, 0, 0, 100); /* jobs may run 100 s */
  gworker(s, 1, 8, 0);
  gworker(s, 2, 8, 0);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  cr_assert_eq(lt_sched_decide(s, 100, d, 1), 0, "two rows do not fit in one: next call");
  size_t n = lt_sched_decide(s, 100, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  cr_assert_eq(d[0].action, LT_SCHED_STOP);
  cr_assert_eq(lt_sched_decide(s, 101, d, 8), 0, "stopped once");
  lt_sched_destroy(s);
}

Test(sched, a_worker_back_in_another_node_group_moves_there) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 1);
  gworker(s, 2, 8, 2);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 0);
  gworker(s, 2, 8, 1); /* idle: it may change group without going down first */
  size_t n = lt_sched_decide(s, 1, d, 8);
  cr_assert_eq(n, 2);
  assert_gang_rows(d, n, 1, 8);
  lt_sched_destroy(s);
}

/* The visibility of a gang across workers: its GPU-seconds count every part; a waiting gang
 * larger than any worker waits as the smallest queued job, and the free slots of
 * a group too small for it are fragmented, those of a group that could host it are not. */
Test(sched, a_multi_worker_gangs_usage_and_fragmentation_count_its_parts_and_groups) {
  lt_sched_t *s = gang_fleet(0, 0, 0);
  gworker(s, 1, 8, 1);
  gworker(s, 2, 8, 1);
  gworker(s, 3, 8, 2);
  gworker(s, 4, 8, 2);
  job(s, 1, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  cr_assert_eq(lt_sched_job_started(s, 1, 10), LT_OK);
  lt_sched_usage_t u[4];
  cr_assert_eq(lt_sched_tenants_usage(s, 20, u, 4), 1);
  cr_assert_float_eq(u[0].gpu_seconds[LT_CLASS_STANDARD], 16 * 10.0, 1e-9, "both parts count");
  job(s, 2, 1, LT_CLASS_STANDARD, 2, LT_SCHED_NO_MODEL, 20); /* takes 2 slots of group 2 */
  cr_assert_eq(lt_sched_decide(s, 20, d, 8), 1);
  job(s, 3, 1, LT_CLASS_STANDARD, 16, LT_SCHED_NO_MODEL, 21); /* 14 free in group 2: waits */
  cr_assert_eq(lt_sched_decide(s, 21, d, 8), 0);
  cr_assert_eq(lt_sched_smallest_queued(s), 16);
  cr_assert_eq(lt_sched_fragmented_slots(s), 14, "group 2's 14 free slots cannot host the gang");
  cr_assert_eq(lt_sched_job_finished(s, 2, 30), LT_OK);
  cr_assert_eq(lt_sched_fragmented_slots(s), 0, "group 2 could host it now");
  cr_assert_eq(lt_sched_job_finished(s, 1, 40), LT_OK);
  cr_assert_eq(lt_sched_tenants_usage(s, 40, u, 4), 1);
  cr_assert_float_eq(u[0].gpu_seconds[LT_CLASS_STANDARD], 16 * 30.0 + 2 * 10.0, 1e-9);
  lt_sched_destroy(s);
}

/* Fair share inside the preemptible class: a tenant holding every preemptible slot gives one up
 * (its newest job, checkpointed first) to a tenant holding none that waited past
 * preempt_after_s; once the shares are as even as whole jobs allow, nobody preempts anybody:
 * the victim must still hold more than the taker after the move, so no slot goes back. */
Test(sched, preemptible_work_preempts_within_its_class_only_for_fair_share) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, 100, -1);
  tenant(s, 1, 1, 0, 0, 0);
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 4, 2);
  lt_sched_decision_t d[8];
  for (uint64_t i = 1; i <= 4; i++) job(s, i, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, (double)i);
  cr_assert_eq(lt_sched_decide(s, 5, d, 8), 4);
  job(s, 10, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 10);
  cr_assert_eq(lt_sched_decide(s, 50, d, 8), 0, "not before preempt_after_s");
  cr_assert_eq(lt_sched_decide(s, 111, d, 8), 1);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT);
  cr_assert_eq(d[0].tenant_id, 1, "the tenant over its share gives");
  cr_assert_eq(d[0].job_id, 4, "its newest job: the least work lost");
  cr_assert_eq(lt_sched_job_requeue(s, 4, 120), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 120, d, 8), 1);
  cr_assert_eq(d[0].action, LT_SCHED_DISPATCH);
  cr_assert_eq(d[0].job_id, 10, "the reserved slot goes to the tenant that waited");
  /* 3 against 1 with a fourth of tenant 1's waiting: moving a slot back would make it 4 : 0 */
  for (double t = 300; t < 3000; t += 300) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  job(s, 11, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 3000);
  cr_assert_eq(lt_sched_decide(s, 3200, d, 8), 0, "a move that only levels them (2 : 2) is not made");
  cr_assert_eq(lt_sched_job_finished(s, 1, 3300), LT_OK); /* a slot frees: tenant 2 is served first */
  cr_assert_eq(lt_sched_decide(s, 3300, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 11, "the lower share goes first");
  lt_sched_destroy(s);
}

/* Fair share over time inside the preemptible class: with one slot and one job each, the
 * instantaneous rule never moves the slot (1 : 0 either way), so the tenant that came second
 * would wait as long as the first one's job runs. Its deficit (the slot-seconds it was entitled
 * to and did not run) does it: once the running job has had its quantum (an hour) and the gap
 * in deficits exceeds an hour of the slot, the running job is preempted for it — and not before. */
Test(sched, preemptible_deficit_takes_a_turn_after_a_quantum) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, 100, -1);
  tenant(s, 1, 1, 0, 0, 0);
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 1, 2);
  lt_sched_decision_t d[8];
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  job(s, 2, 2, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 10);
  /* each is entitled to half the slot: tenant 2's deficit grows 0.5 slot-s/s, tenant 1's falls
   * as fast, so the gap passes an hour of the slot at t ~ 3610; the quantum ends at 3600 */
  for (double t = 60; t <= 3600; t += 60) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  size_t n = 0;
  double t = 3660;
  for (; t <= 4000 && n == 0; t += 60) n = lt_sched_decide(s, t, d, 8);
  cr_assert_eq(n, 1, "a turn by 4000 s");
  cr_assert(d[0].action == LT_SCHED_PREEMPT && d[0].job_id == 1 && d[0].tenant_id == 1);
  cr_assert_eq(lt_sched_job_requeue(s, 1, t), LT_OK);
  cr_assert_eq(lt_sched_decide(s, t, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 2, "the slot goes to tenant 2");
  /* now tenant 1 waits with the larger deficit, but tenant 2's job has its own quantum */
  for (double u = t + 60; u < t + 3600; u += 60) cr_assert_eq(lt_sched_decide(s, u, d, 8), 0, "at %g s", u);
  lt_sched_destroy(s);
}

/* One tenant, two preemptible jobs, one slot: the deficit is a tenant's, so a tenant's own jobs
 * never take turns among themselves, however long the second waits. */
Test(sched, preemptible_deficit_is_between_tenants_only) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, 100, -1);
  tenant(s, 1, 1, 0, 0, 0);
  worker(s, 1, 1, 2);
  lt_sched_decision_t d[8];
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  job(s, 2, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 10);
  for (double t = 60; t <= 20000; t += 60) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  lt_sched_destroy(s);
}

/* Reservations inside the preemptible class go to the tenants the class owes: a gang of the
 * class drains a worker that higher classes may keep refilling, so a reservation can last long.
 * Tenant 1, alone in the class, may reserve for its 2-GPU job; once tenant 2 queues work and
 * tenant 1 runs more than its share, tenant 1 gives the reservation up, and tenant 2's own 2-GPU
 * job (owed) takes the reserved worker when it drains — not tenant 1's older one. */
Test(sched, preemptible_reservations_go_to_tenants_the_class_owes) {
  lt_sched_t *s = fleet((fleet_t){.policy = LT_SCHED_POLICY_LATHE, .gang = 100, .weights = {1, 1},
                                  .workers = 2, .slots = 2, .cache = 2});
  lt_sched_decision_t d[8];
  for (uint64_t i = 1; i <= 4; i++) job(s, i, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 4);
  uint64_t on_w1[2], n1 = 0;
  for (int i = 0; i < 4; i++)
    if (d[i].worker_id == 1) on_w1[n1++] = d[i].job_id;
  cr_assert_eq(n1, 2);
  job(s, 5, 1, LT_CLASS_PREEMPTIBLE, 2, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 60, d, 8), 0);
  uint32_t nw = 9;
  lt_sched_reserved_idle_slots(s, &nw);
  cr_assert_eq(nw, 0, "not before gang_reserve_after_s");
  cr_assert_eq(lt_sched_decide(s, 120, d, 8), 0);
  lt_sched_reserved_idle_slots(s, &nw);
  cr_assert_eq(nw, 1, "alone in the class, tenant 1 is owed nothing and owes nothing: it drains one");
  job(s, 6, 2, LT_CLASS_PREEMPTIBLE, 2, LT_SCHED_NO_MODEL, 130);
  /* from 180 s tenant 1 runs 4 slots against a share of 2: its deficit turns negative, and
   * at 240 s (job 6 past the bound) the one reservation allowed passes to tenant 2 */
  for (double t = 180; t <= 300; t += 60) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  lt_sched_reserved_idle_slots(s, &nw);
  cr_assert_eq(nw, 1);
  /* the reserved worker is worker 1 (most free slots, then the first): drain it */
  cr_assert_eq(lt_sched_job_finished(s, on_w1[0], 400), LT_OK);
  cr_assert_eq(lt_sched_reserved_idle_slots(s, NULL), 1, "worker 1 is the reserved one");
  cr_assert_eq(lt_sched_decide(s, 400, d, 8), 0, "the freed slot is held for the gang");
  cr_assert_eq(lt_sched_job_finished(s, on_w1[1], 410), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 410, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 6 && d[0].worker_id == 1,
            "tenant 2's gang starts on the drained worker, not tenant 1's older one (job %llu)",
            (unsigned long long)d[0].job_id);
  lt_sched_destroy(s);
}

/* A lower class's reservation never holds a higher class's job back (invariant 9): with the one
 * reservation a 2-worker fleet has (max_reservations, 1/8 of the workers, at least 1) held by a
 * preemptible gang draining a worker, a standard job that starves takes it back and preempts. */
Test(sched, a_starving_standard_job_takes_the_reservation_back_from_the_preemptible_class) {
  lt_sched_t *s = fleet((fleet_t){.policy = LT_SCHED_POLICY_LATHE, .preempt = 60, .gang = 100,
                                  .weights = {1, 1, 1}, .workers = 2, .slots = 2, .cache = 2});
  lt_sched_decision_t d[8];
  job(s, 1, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  for (uint64_t i = 2; i <= 4; i++) job(s, i, 3, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 4);
  job(s, 5, 1, LT_CLASS_PREEMPTIBLE, 2, LT_SCHED_NO_MODEL, 10); /* the gang: reserves at 110 s */
  for (double t = 60; t <= 150; t += 30) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  uint32_t nw = 0;
  lt_sched_reserved_idle_slots(s, &nw);
  cr_assert_eq(nw, 1, "the gang holds the fleet's one reservation");
  job(s, 6, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 160);
  size_t n = 0;
  double t = 180;
  for (; t <= 600 && n == 0; t += 30) n = lt_sched_decide(s, t, d, 8);
  cr_assert_eq(n, 1, "the standard job preempts within its bound (by %g s)", t);
  cr_assert(d[0].action == LT_SCHED_PREEMPT && d[0].job_id >= 2 && d[0].job_id <= 4,
            "one of tenant 3's preemptible jobs (job %llu)", (unsigned long long)d[0].job_id);
  cr_assert_lt(t, 300, "at preempt_after_s, not when the gang's reservation ends");
  lt_sched_destroy(s);
}

/* A starving standard job on one worker takes a reservation back only once its preemption took
 * a worker: one that can preempt nothing (every running job is standard) leaves the preemptible
 * gang's drain alone, which giving it back first reset at every look. */
Test(sched, a_standard_job_that_can_preempt_nothing_leaves_the_preemptible_drain_alone) {
  lt_sched_t *s = fleet((fleet_t){.policy = LT_SCHED_POLICY_LATHE, .preempt = 60, .gang = 100,
                                  .weights = {1, 1, 1}, .workers = 2, .slots = 2, .cache = 2});
  lt_sched_decision_t d[8];
  for (uint64_t i = 1; i <= 4; i++) job(s, i, 2, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 4, "the fleet full of standard work");
  job(s, 5, 1, LT_CLASS_PREEMPTIBLE, 2, LT_SCHED_NO_MODEL, 10); /* the gang: reserves at 110 s */
  uint32_t nw = 0;
  for (double t = 60; t <= 150; t += 30) cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "at %g s", t);
  lt_sched_reserved_idle_slots(s, &nw);
  cr_assert_eq(nw, 1, "the gang holds the fleet's one reservation");
  job(s, 6, 3, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 160); /* starves from 220 s */
  for (double t = 170; t <= 400; t += 0.5) {
    cr_assert_eq(lt_sched_decide(s, t, d, 8), 0, "nothing to preempt, nothing to start (%g s)", t);
    lt_sched_reserved_idle_slots(s, &nw);
    cr_assert_eq(nw, 1, "the gang's drain still holds at %g s", t);
  }
  cr_assert_eq(lt_sched_job_finished(s, 1, 400), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 400, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 6, "the freed slot goes to the standard job first");
  lt_sched_destroy(s);
}

/* Backfill (EASY): a standard 4-GPU job drains a 4-slot worker whose two running jobs end by
 * their bounds at 1000 and 2000 s (limit_s). A bounded job that ends before the shadow time —
 * when the gang could start, 2000 s — may use the free slot; one that would end later, one
 * without a bound, and any job once the only job left to end has no bound, may not. A worker
 * reserved for production is never backfilled. */
static void bjob(lt_sched_t *s, uint64_t id, uint64_t ten, lt_job_class_t cls, uint32_t gpus,
                 double limit, double now) {
  lt_sched_job_t j = {.id = id, .tenant_id = ten, .cls = cls, .gpus = gpus, .mem_bytes = gpus * 40 * GB,
                      .model = LT_SCHED_NO_MODEL, .limit_s = limit};
  char err[256];
  cr_assert_eq(lt_sched_job_enqueue(s, &j, now, err, sizeof err), LT_OK, "%s", err);
}

Test(sched, backfill_uses_held_slots_only_when_it_ends_before_the_gang_could_start) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, 100);
  tenant(s, 1, 1, 0, 0, 0);
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 4, 2);
  worker(s, 2, 4, 2); /* kept full by production work, so the gang drains worker 1 */
  lt_sched_decision_t d[8];
  bjob(s, 9, 1, LT_CLASS_PRODUCTION, 4, 0, 0);
  bjob(s, 1, 1, LT_CLASS_STANDARD, 2, 1000, 0);
  bjob(s, 2, 1, LT_CLASS_STANDARD, 1, 2000, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 3);
  bjob(s, 3, 2, LT_CLASS_STANDARD, 4, 0, 10); /* the gang: waits, then drains worker 1 */
  cr_assert_eq(lt_sched_decide(s, 10, d, 8), 0);
  cr_assert_eq(lt_sched_decide(s, 200, d, 8), 0);
  cr_assert_eq(lt_sched_reserved_idle_slots(s, NULL), 1, "one free slot held for the gang");
  bjob(s, 4, 1, LT_CLASS_PREEMPTIBLE, 1, 0, 210);    /* no bound */
  bjob(s, 5, 1, LT_CLASS_PREEMPTIBLE, 1, 1900, 210); /* would end at 2110 > 2000 */
  cr_assert_eq(lt_sched_decide(s, 210, d, 8), 0, "neither backfills");
  bjob(s, 6, 2, LT_CLASS_PREEMPTIBLE, 1, 1700, 220); /* ends by 1920 <= 2000 */
  cr_assert_eq(lt_sched_decide(s, 220, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 6, "the short bounded job backfills");
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.backfills, 1);
  /* the backfilled job ends before the shadow time: the gang is not delayed past it */
  cr_assert_eq(lt_sched_job_finished(s, 1, 1000), LT_OK);
  cr_assert_eq(lt_sched_job_finished(s, 6, 1920), LT_OK);
  cr_assert_eq(lt_sched_job_finished(s, 2, 2000), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 2000, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_DISPATCH && d[0].job_id == 3, "the gang starts at its shadow time");
  lt_sched_destroy(s);
}

/* Two holds nothing backfills: one whose gang waits on a job without a bound (its start is
 * unknown), and one held for production. */
static void backfill_refused(lt_job_class_t waiting_cls, double running_limit) {
  lt_sched_t *s = mk(LT_SCHED_POLICY_LATHE, 0, 0, -1, 100);
  tenant(s, 1, 1, 0, 0, 0);
  tenant(s, 2, 1, 0, 0, 0);
  worker(s, 1, 4, 2);
  worker(s, 2, 4, 2);
  lt_sched_decision_t d[8];
  bjob(s, 1, 1, LT_CLASS_STANDARD, 3, running_limit, 0); /* worker 1 */
  bjob(s, 2, 1, LT_CLASS_PRODUCTION, 4, 0, 0);           /* worker 2, full */
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 2);
  bjob(s, 3, 2, waiting_cls, 4, 0, 10);
  cr_assert_eq(lt_sched_decide(s, 200, d, 8), 0);
  cr_assert_eq(lt_sched_reserved_idle_slots(s, NULL), 1, "worker 1's free slot is held");
  bjob(s, 5, 1, LT_CLASS_PREEMPTIBLE, 1, 10, 300);
  cr_assert_eq(lt_sched_decide(s, 300, d, 8), 0, "a 10 s job does not backfill");
  lt_sched_counters_t c;
  lt_sched_counters(s, &c);
  cr_assert_eq(c.backfills, 0);
  lt_sched_destroy(s);
}

Test(sched, backfill_needs_the_end_it_waits_on_bounded) {
  backfill_refused(LT_CLASS_STANDARD, 0);
}

Test(sched, backfill_never_takes_slots_held_for_production) {
  backfill_refused(LT_CLASS_PRODUCTION, 1000);
}

/* Under LAS too a cordoned (or draining) worker's jobs are never preempted for another job: a
 * first-queue job waits until the cordon is lifted. */
Test(sched, las_never_preempts_on_a_cordoned_worker) {
  lt_sched_t *s = fleet((fleet_t){.policy = LT_SCHED_POLICY_LAS, .weights = {1}, .workers = 1, .slots = 1, .cache = 1});
  lt_sched_decision_t d[8];
  job(s, 1, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 0);
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  cr_assert_eq(lt_sched_worker_cordon(s, 1, true), LT_OK);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 4000); /* job 1 is past 3,600 GPU-s */
  cr_assert_eq(lt_sched_decide(s, 4001, d, 8), 0, "LAS preempted on a cordoned worker");
  cr_assert_eq(lt_sched_worker_cordon(s, 1, false), LT_OK);
  cr_assert_eq(lt_sched_decide(s, 4002, d, 8), 1);
  cr_assert(d[0].action == LT_SCHED_PREEMPT && d[0].job_id == 1, "the lifted worker's long job makes room");
  lt_sched_destroy(s);
}

/* A cordoned worker (a dispatch to it was not started in time: lt_scheduler) gets no new job and is
 * never preempted for one; what runs there stays; lifting the cordon gives it work again. */
Test(sched, a_cordoned_worker_takes_no_new_work_and_keeps_what_runs) {
  lt_sched_t *s = fleet((fleet_t){.preempt = 10, .weights = {1}, .workers = 2, .slots = 1, .cache = 1});
  job(s, 1, 1, LT_CLASS_PREEMPTIBLE, 1, LT_SCHED_NO_MODEL, 0);
  lt_sched_decision_t d[8];
  cr_assert_eq(lt_sched_decide(s, 0, d, 8), 1);
  uint64_t busy = d[0].worker_id, other = busy == 1 ? 2 : 1;
  cr_assert_eq(lt_sched_worker_cordon(s, other, true), LT_OK);
  job(s, 2, 1, LT_CLASS_STANDARD, 1, LT_SCHED_NO_MODEL, 1);
  cr_assert_eq(lt_sched_decide(s, 2, d, 8), 0, "a job went to the cordoned worker");
  /* production waits past the preemption bound: the preemptible job on the open worker goes,
   * nothing of the cordoned one is touched */
  cr_assert_eq(lt_sched_worker_cordon(s, busy, true), LT_OK);
  job(s, 3, 1, LT_CLASS_PRODUCTION, 1, LT_SCHED_NO_MODEL, 3);
  cr_assert_eq(lt_sched_decide(s, 20, d, 8), 0, "preemption on a cordoned worker");
  cr_assert_eq(lt_sched_worker_cordon(s, busy, false), LT_OK);
  size_t n = lt_sched_decide(s, 21, d, 8);
  cr_assert_eq(n, 1);
  cr_assert_eq(d[0].action, LT_SCHED_PREEMPT, "the lifted worker's preemptible job makes room");
  cr_assert_eq(d[0].job_id, 1);
  cr_assert_eq(lt_sched_worker_cordon(s, other, false), LT_OK);
  n = lt_sched_decide(s, 22, d, 8);
  cr_assert_eq(n, 1, "the lifted worker takes a job again");
  cr_assert_eq(d[0].action, LT_SCHED_DISPATCH);
  cr_assert_eq(d[0].worker_id, other);
  cr_assert_eq(d[0].job_id, 3, "production first");
  cr_assert_eq(lt_sched_worker_cordon(s, 99, true), LT_ERR_NOT_FOUND);
  /* a worker that goes down and comes up again is not cordoned */
  cr_assert_eq(lt_sched_worker_cordon(s, other, true), LT_OK);
  cr_assert_eq(lt_sched_worker_down(s, other, 30), LT_OK);
  worker(s, other, 1, 1);
  n = lt_sched_decide(s, 31, d, 8);
  cr_assert(n >= 1 && d[0].action == LT_SCHED_DISPATCH && d[0].worker_id == other,
            "a worker that came back is still cordoned");
  lt_sched_destroy(s);
}
