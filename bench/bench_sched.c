/* bench_sched: scheduler decisions per second at DESIGN scale — 10,000 queued jobs, 1,000
 * tenants, 500 workers of 8 GPUs in node groups of 8, multi-worker gangs of 16 and 32 GPUs in
 * the mix — for Lathe's policy and, as the peer in the same run, FIFO behind the same interface.
 *
 * Steady state: the fleet starts full; each cycle finishes 256 random running jobs (a few are
 * requeued instead, as after a lost attempt), tops the queue back up to 10,000, advances
 * virtual time by 1 s (so aging, preemption and gang reservation are live) and decides.
 * Timed: the events and the decide calls, i.e. everything the scheduler's fold loop does for
 * the policy. Preempt decisions are answered at once with a requeue.
 * Last line: `sched_decisions_per_s: N` (Lathe policy). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "lt_sched.h"

#define TENANTS 1000
#define WORKERS 500
#define SLOTS 8
#define GROUP 8 /* workers per node group */
#define QUEUED 10000
#define MODELS 20
#define CYCLES 400
#define CHURN 256

static uint64_t rng_state;
static uint32_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}

typedef struct result {
  double decisions_per_s, decide_only_per_s;
  uint64_t decisions, dispatches, preemptions, cold_loads;
  double jain_standard;
} result_t;

/* One policy's run: the scheduler, the fleet's running jobs and the virtual clock. */
typedef struct bench {
  lt_sched_t *s;
  uint32_t models[MODELS];
  uint64_t *running; /* WORKERS * SLOTS */
  size_t nrun;
  lt_sched_decision_t *d; /* 8192 */
  uint64_t next_id;
  uint64_t multi; /* multi-worker gangs dispatched */
  double vt;
} bench_t;

/* The scheduler at DESIGN scale: models, tenants (weights 1..4, every tenth with a 16-slot
 * quota) and the fleet. */
static int bench_open(bench_t *b, lt_sched_policy_t policy) {
  lt_sched_config_t c;
  lt_sched_config_default(&c);
  c.policy = policy;
  c.max_tenants = TENANTS;
  c.max_workers = WORKERS;
  c.max_jobs = QUEUED + WORKERS * SLOTS + 1024;
  c.max_models = MODELS;
  char err[256];
  if (lt_sched_new(&c, &b->s, err, sizeof err)) {
    fprintf(stderr, "bench_sched: %s\n", err);
    return 1;
  }
  rng_state = 0x9e3779b97f4a7c15ULL;
  for (int m = 0; m < MODELS; m++) {
    char name[32];
    snprintf(name, sizeof name, "model-%d", m);
    lt_sched_model_intern(b->s, name, &b->models[m], err, sizeof err);
  }
  for (uint64_t t = 1; t <= TENANTS; t++) {
    lt_sched_tenant_t ten = {.id = t, .weight = 1 + (double)(t % 4),
                             .max_running_slots = t % 10 == 0 ? 16 : 0};
    lt_sched_tenant_upsert(b->s, &ten, err, sizeof err);
  }
  for (uint64_t w = 1; w <= WORKERS; w++) {
    lt_sched_worker_t wk = {.id = w, .slots = SLOTS, .mem_bytes = SLOTS * (80ULL << 30),
                            .model_cache = 2, .node_group = (uint32_t)((w - 1) / GROUP)};
    lt_sched_worker_up(b->s, &wk, err, sizeof err);
  }
  b->next_id = 1;
  b->running = malloc(sizeof(uint64_t) * WORKERS * SLOTS);
  b->nrun = 0;
  b->d = malloc(sizeof *b->d * 8192);
  b->vt = 0;
  b->multi = 0;
  return 0;
}

/* Events: CHURN random running jobs finish (one in 32 is requeued instead). */
static void bench_churn(bench_t *b) {
  for (int k = 0; k < CHURN && b->nrun > 0; k++) {
    size_t i = rnd() % b->nrun;
    if (rnd() % 32 == 0) lt_sched_job_requeue(b->s, b->running[i], b->vt);
    else lt_sched_job_finished(b->s, b->running[i], b->vt);
    b->running[i] = b->running[--b->nrun];
  }
}

/* Events: new jobs top the queue back up to QUEUED (20% production, 70% standard; one in 20 a
 * gang of 8, of 4 or of 2; one in 200 a multi-worker gang of 16, one in 400 of 32). */
static int bench_top_up(bench_t *b) {
  lt_sched_counters_t cnt;
  lt_sched_counters(b->s, &cnt);
  char err[256];
  for (uint32_t q = cnt.queued; q < QUEUED; q++) {
    uint32_t x = rnd();
    uint32_t cls = x % 10 < 2 ? 0 : x % 10 < 9 ? 1 : 2;
    uint32_t g = (x >> 8) % 20;
    lt_sched_job_t j = {.id = b->next_id++,
                        .tenant_id = 1 + (x >> 12) % TENANTS,
                        .cls = (lt_job_class_t)cls,
                        .gpus = g == 0 ? 8 : g == 1 ? 4 : g == 2 ? 2 : 1,
                        .model = b->models[(x >> 24) % MODELS]};
    uint32_t big = (x >> 3) % 400;
    if (big < 2) j.gpus = 16;
    else if (big == 2) j.gpus = 32;
    j.mem_bytes = j.gpus * (40ULL << 30);
    if (lt_sched_job_enqueue(b->s, &j, b->vt, err, sizeof err)) {
      fprintf(stderr, "bench_sched: %s\n", err);
      return 1;
    }
  }
  return 0;
}

/* Decides until the policy has nothing more to say; returns the number of decisions (a
 * multi-worker gang's rows, one a worker, count as one). */
static uint64_t bench_decide(bench_t *b) {
  uint64_t decisions = 0;
  size_t n;
  do {
    n = lt_sched_decide(b->s, b->vt, b->d, 8192);
    for (size_t i = 0; i < n; i++) {
      if (b->d[i].rank != 0) continue; /* a multi-worker gang's rows are one decision */
      decisions++;
      if (b->d[i].action == LT_SCHED_DISPATCH) {
        if (b->d[i].world > 1) b->multi++;
        b->running[b->nrun++] = b->d[i].job_id;
      } else {
        /* answered at once: preempted after its checkpoint, or stopped */
        for (size_t k = 0; k < b->nrun; k++)
          if (b->running[k] == b->d[i].job_id) {
            b->running[k] = b->running[--b->nrun];
            break;
          }
        lt_sched_job_requeue(b->s, b->d[i].job_id, b->vt);
      }
    }
  } while (n + LT_SCHED_MAX_GANG_WORKERS > 8192);
  return decisions;
}

static int run(lt_sched_policy_t policy, result_t *r) {
  bench_t b;
  if (bench_open(&b, policy)) return 1;
  double t_total = 0, t_decide = 0;
  uint64_t decisions = 0;
  for (int cycle = -1; cycle < CYCLES; cycle++) { /* cycle -1 fills the fleet: not timed */
    double t0 = bench_now_s();
    if (cycle >= 0) bench_churn(&b);
    if (bench_top_up(&b)) return 1;
    double t1 = bench_now_s();
    uint64_t n = bench_decide(&b);
    double t2 = bench_now_s();
    if (cycle >= 0) {
      decisions += n;
      t_total += t2 - t0;
      t_decide += t2 - t1;
    }
    b.vt += 1.0;
  }
  lt_sched_counters_t cnt;
  lt_sched_counters(b.s, &cnt);
  r->decisions = decisions;
  r->decisions_per_s = decisions / t_total;
  r->decide_only_per_s = decisions / t_decide;
  r->dispatches = cnt.dispatches;
  r->preemptions = cnt.preemptions;
  r->cold_loads = cnt.cold_loads;
  r->jain_standard = lt_sched_jain(b.s, LT_CLASS_STANDARD);
  printf("%-6s decisions %8llu  with events %10.0f/s  decide only %10.0f/s  queued %u  "
         "slots used %u/%u  preemptions %llu  cold loads %llu  multi-worker gangs %llu  "
         "jain(standard) %.3f\n",
         lt_sched_policy_name(policy), (unsigned long long)decisions, r->decisions_per_s,
         r->decide_only_per_s, cnt.queued, cnt.slots_used, cnt.slots_total,
         (unsigned long long)cnt.preemptions,
         (unsigned long long)cnt.cold_loads, (unsigned long long)b.multi, r->jain_standard);
  free(b.running);
  free(b.d);
  lt_sched_destroy(b.s);
  return 0;
}

int main(void) {
  printf("bench_sched: %d queued jobs, %d tenants, %d workers x %d GPUs in node groups of %d, "
         "%d cycles of %d finishes\n",
         QUEUED, TENANTS, WORKERS, SLOTS, GROUP, CYCLES, CHURN);
  result_t lathe, fifo;
  if (run(LT_SCHED_POLICY_FIFO, &fifo) || run(LT_SCHED_POLICY_LATHE, &lathe)) return 1;
  printf("lathe/fifo decisions/s ratio: %.2f\n", lathe.decisions_per_s / fifo.decisions_per_s);
  printf("sched_decisions_per_s: %.0f\n", lathe.decisions_per_s);
  return 0;
}
