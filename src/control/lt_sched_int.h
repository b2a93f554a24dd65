/* lt_sched_int.h: the policy's private tables, shared by its files and nothing else:
 * lt_sched.c (lifecycle, events, visibility), lt_sched_queue.c (queues, fair-share heaps, what a
 * running job books), lt_sched_decide.c (the decisions), lt_sched_las.c (the LAS peer) and
 * lt_sched_stats.c (usage, reserved idle slots, fragmentation) and
 * lt_sched_gang.c (node groups and multi-worker gang placement).
 *
 * Data layout, all sized once at lt_sched_new():
 *   - a job pool with intrusive links: each queued job sits on its tenant's per-class FIFO and
 *     on an age-ordered list (one per class for the Lathe policy, which the starvation pass
 *     scans from the oldest; one global list in arrival order for FIFO); a running job holds
 *     one part per worker it runs on (one part, or world parts for a multi-worker gang), each
 *     part on its worker's running list;
 *   - per class, a binary heap of the tenants that have queued work and room in their quota,
 *     keyed by DRF dominant share / weight, so picking the next tenant is O(log tenants);
 *   - per free-slot count k, a bitmap of workers with exactly k free slots, and per base model
 *     a bitmap of workers holding it, so best-fit warm placement is a few word ANDs;
 *   - per node group, its workers and their free slots, so a multi-worker gang looks only at
 *     the groups that could hold it.
 * Candidates that cannot be placed are set aside for the rest of a decide call (resources only
 * shrink during a call), and at most max_scan of them are examined per call. */
#ifndef LT_SCHED_INT_H
#define LT_SCHED_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "lt_rand.h"
#include "lt_sched.h"

#define NIL UINT32_MAX
#define MAX_CACHE 64 /* models one worker may hold */
#define NHIST 64     /* wait histogram buckets: 0, then [0.1 * 1.25^(b-1), 0.1 * 1.25^b) */

enum { JS_FREE = 0, JS_QUEUED, JS_RUNNING };

/* Intrusive doubly-linked lists of jobs, by index into the job pool (NIL ends them). */
typedef struct link {
  uint32_t prev, next;
} link_t;
typedef struct list {
  uint32_t head, tail;
} list_t;

/* What a running job books on one worker: a single-worker job has one part, a multi-worker gang
 * one per worker (rank order along next, rank 0 first). */
typedef struct part {
  uint64_t mask;  /* its GPUs on the worker */
  uint64_t mem;   /* its share of the job's device memory */
  uint32_t job, worker, gpus, rank;
  uint32_t next;  /* the job's next part; the free list's next when free */
  link_t run;     /* its worker's running list */
} part_t;

typedef struct job {
  uint64_t id;
  uint64_t mem;
  double enq;   /* when it was (re)queued */
  double start; /* dispatch, then AttemptStarted */
  double starve_next; /* next time the starvation pass looks at it */
  double attained;    /* GPU-seconds run in earlier attempts (LAS orders by it) */
  double limit;       /* lt_sched_job_t.limit_s (0: none) */
  uint32_t tenant, model, attempt, gpus;
  uint32_t part;     /* running: its first part (rank 0); NIL otherwise */
  uint32_t world;    /* running: its parts (workers it runs on) */
  uint32_t reserved; /* a worker reserved for it (one of nres), NIL: none */
  uint32_t nres;     /* workers reserved for it (a multi-worker gang may hold several) */
  uint32_t hnext;
  link_t tq;  /* its tenant's queue of its class (tq.next: the free list when free) */
  link_t age; /* its age list */
  uint8_t cls, state;
  bool preempting, stop_sent;
} job_t;

typedef struct tenant {
  uint64_t id;
  double weight;
  uint32_t max_running, max_queued;
  double max_duration;
  uint32_t running_slots, queued;
  uint32_t run_slots_c[LT_CLASS__COUNT];
  uint64_t run_mem_c[LT_CLASS__COUNT];
  uint32_t queued_c[LT_CLASS__COUNT];
  uint64_t queued_gpus_c[LT_CLASS__COUNT];
  list_t q[LT_CLASS__COUNT]; /* queued jobs per class, FIFO (requeued jobs first) */
  uint32_t heap_pos[LT_CLASS__COUNT];
  double key[LT_CLASS__COUNT];
  /* the preemptible class over time (lt_sched_decide.c fair_advance): its water-filled share of
   * the slots the class runs (weighted max-min over tenants with work in it), and the
   * slot-seconds of that share it did not run while it had work there (< 0: ran more), and
   * the slots it ran when the share was last computed */
  double alloc_p, deficit_p, run_p;
  bool in_fair; /* listed in lt_sched.fair_t */
  uint8_t blocked; /* bit c: set aside in this decide call */
  uint32_t hnext;
  uint64_t dispatched;
  uint32_t hist[NHIST];
  /* lt_sched_stats.c: what its jobs of each class ran (ended attempts; running ones are added
   * up to now when asked) and how many of their dispatches loaded the base model */
  double gpu_s_c[LT_CLASS__COUNT];
  uint64_t cold_c[LT_CLASS__COUNT];
  /* and the waits of its dispatches per class: log buckets as hist, exact counts per
   * lt_sched_wait_bounds_s bucket (not cumulative), their sum */
  uint32_t hist_c[LT_CLASS__COUNT][NHIST];
  uint64_t wait_n_c[LT_CLASS__COUNT][LT_SCHED_WAIT_BUCKETS];
  double wait_sum_c[LT_CLASS__COUNT];
} tenant_t;

typedef struct worker {
  uint64_t id;
  uint64_t mem_total, mem_free, preempt_mem;
  uint64_t gpu_free; /* bit i: GPU i free */
  uint32_t slots, free_slots, preempt_slots;
  uint32_t cache_cap, nmodels;
  uint32_t models[MAX_CACHE];
  uint64_t lru[MAX_CACHE];
  list_t run; /* parts of running jobs, newest first */
  uint32_t reserved_job;
  uint32_t hnext;
  uint32_t group, gnext; /* its node group (index) and the group's next worker */
  bool up;
  bool cordoned; /* takes no new work, keeps what runs (lt_sched_worker_cordon) */
} worker_t;

/* A node group (lt_sched_worker_t.node_group): the workers that may host one gang together. */
typedef struct group {
  uint32_t id;
  uint32_t head;        /* its workers, up or down, along worker_t.gnext */
  uint32_t slots, free_slots; /* over its up workers */
} group_t;

struct lt_sched {
  lt_sched_config_t cfg;
  void *tables; /* one block holding every array below (sched_tables_layout) */
  job_t *jobs;
  uint32_t *job_hash, job_hmask, job_free, njobs;
  tenant_t *tenants;
  uint32_t *ten_hash, ten_hmask, ntenants;
  worker_t *workers;
  uint32_t *wrk_hash, wrk_hmask, nworkers, nup;
  char **model_names;
  uint32_t nmodels;

  size_t words;      /* 64-bit words per worker bitmap */
  uint64_t *free_bm; /* (MAX_WORKER_SLOTS + 1) bitmaps */
  uint64_t *model_bm;
  uint32_t max_slots; /* largest worker seen */

  part_t *parts;      /* parts_cap: at most one a GPU of max_workers full workers */
  uint32_t parts_cap, part_free;
  group_t *groups;    /* ngroups used, max_workers at most */
  uint32_t ngroups;
  uint64_t *gang_key; /* max_workers: placement scratch, (order key << 32 | worker) */

  uint32_t *heap[LT_CLASS__COUNT];
  uint32_t heap_n[LT_CLASS__COUNT];
  uint32_t *blocked[LT_CLASS__COUNT];
  uint32_t nblocked[LT_CLASS__COUNT];

  list_t age[LT_CLASS__COUNT]; /* queued jobs by (re)queue time; FIFO uses age[0] only */
  uint32_t cursor[LT_CLASS__COUNT];

  uint64_t total_mem;
  uint32_t total_slots, slots_used;
  uint32_t used_c[LT_CLASS__COUNT];
  uint32_t queued_c[LT_CLASS__COUNT];
  uint32_t queued, running;
  uint64_t tick; /* LRU clock */
  double next_deadline;
  double mean_run;
  uint64_t finished_n;
  uint64_t dispatches, preemptions, stops, cold_loads, requeues, backfills;
  double now; /* the running decide call's time (backfill's clock) */
  double fair_at; /* fair_advance's last time; < 0: never */
  uint32_t *fair_t, nfair; /* tenants that had preemptible work since fair_advance last looked */
  uint32_t nreserved; /* workers reserved for a starving job */

  double *scratch_d, *scratch_w, *scratch_a; /* max_tenants each: visibility */
  uint32_t *scratch_t;

  /* lt_sched_next_timer: when queued jobs' waits cross a threshold, a min-heap of
   * (time, job, its enq), pushed when a job is (re)queued; entries of jobs that left the queue
   * since are dropped when they reach the top, or all at once when the table is full. */
  struct sched_timer {
    double t, enq;
    uint32_t jx;
  } *timers;
  uint32_t ntimers, timers_cap;

  /* lt_sched_stats.c: slot-seconds held free on reserved workers up to idle_at, advanced by
   * every event and decide call that takes now (sched_stats_advance); queued jobs by GPUs,
   * for the smallest waiting gang */
  double idle_reserved_s, idle_at;
  /* queued jobs by GPUs asked; the last bucket: more than a worker may have (a multi-worker
   * gang, whatever its size) */
  uint32_t queued_by_gpus[LT_SCHED_MAX_WORKER_SLOTS + 2];
  uint32_t reserved_free; /* free slots on reserved workers now (lt_sched_queue.c keeps it) */
};

/* ---- lt_sched_gang.c: node groups and multi-worker gangs --------------------------------- */

/* A placement: the workers of one job's parts and the GPUs on each, rank order. */
typedef struct placement {
  uint32_t n;
  uint32_t worker[LT_SCHED_MAX_GANG_WORKERS];
  uint32_t gpus[LT_SCHED_MAX_GANG_WORKERS];
} placement_t;

/* Whether job jx can never run on one worker (more GPUs than the largest worker has): then it
 * is placed as a multi-worker gang, or not at all. */
static inline bool sched_multi(const lt_sched_t *s, const job_t *j) { return j->gpus > s->max_slots; }
/* Device memory a gang's part books per GPU: the job's, split by GPUs, rounded up. */
static inline uint64_t sched_mem_per_gpu(const job_t *j) { return (j->mem + j->gpus - 1) / j->gpus; }
/* Worker w joins node group id (its index is created the first time), or leaves its group. */
void sched_group_join(lt_sched_t *s, uint32_t w, uint32_t id);
/* Worker w's free slots change by delta (up workers only count). */
void sched_group_free(lt_sched_t *s, uint32_t w, int64_t delta);
/* All-or-nothing placement of multi-worker gang jx on workers of one node group whose usable
 * free slots cover it, workers it may use only (sched_may_use): the fewest workers, whole free
 * ones first, the last part best fit, then the group left with the fewest free slots. False
 * when no group can hold it now. */
bool sched_gang_find(lt_sched_t *s, uint32_t jx, placement_t *pl);
/* The gang's starvation handling (lt_sched_decide.c's pass): reserve the workers of one group
 * closest to free whose capacity covers it (false when none, or over the bound `room`
 * workers); a production gang preempts preemptible parts on them (PREEMPT decisions). */
bool sched_gang_reserve(lt_sched_t *s, uint32_t jx, uint32_t room);
size_t sched_gang_preempt(lt_sched_t *s, uint32_t jx, lt_sched_decision_t *out, size_t cap);

/* lt_sched_queue.c: backfill. Whether job jx, bounded (limit), ends before the job worker wk
 * is reserved for could start there: the shadow time, when wk's free slots and those of the
 * parts whose bounds end by then cover that job's share of wk (a part with no bound never
 * ends: when the reserved job waits on one, its start is unknown and nothing backfills; nor
 * while a preemption is in flight, which means it is about to start).
 * Bounds are enforced by the caller, so a backfilled job never delays the reserved one past
 * its shadow time (EASY backfilling's guarantee). */
bool sched_backfill_ok(const lt_sched_t *s, const worker_t *wk, uint32_t jx);
/* A job's run-time bound: its own (limit) and its tenant's max duration, the lower; 0: none. */
double sched_job_bound(const lt_sched_t *s, const job_t *j);

/* Whether job jx may use worker wk's free slots: the worker is not cordoned and not reserved, or
 * reserved for jx, or (Lathe) reserved for a job of a lower class or jx backfills (sched_backfill_ok). */
static inline bool sched_may_use(const lt_sched_t *s, const worker_t *wk, uint32_t jx) {
  if (wk->cordoned) return false;
  uint32_t r = wk->reserved_job;
  if (r == NIL || r == jx) return true;
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return false;
  return s->jobs[jx].cls < s->jobs[r].cls || sched_backfill_ok(s, wk, jx);
}

/* lt_sched.c: the threshold crossings of job jx, (re)queued at now, into the timer heap. */
void sched_timers_push(lt_sched_t *s, uint32_t jx, double now);
/* lt_sched_stats.c: integrates the slots held free on reserved workers (reserved_free) from the
 * last call up to now (before anything at now changes them); a now earlier than the last is
 * ignored. With cfg.check_invariants, asserts that reserved_free matches the workers. */
void sched_stats_advance(lt_sched_t *s, double now);
/* lt_sched_stats.c: running job jx stops at now (finished, requeued, its worker down): what it
 * ran since its start counts as its tenant's GPU-seconds. */
void sched_stats_ran(lt_sched_t *s, uint32_t jx, double now);
/* lt_sched_stats.c: queued job jx is dispatched after waiting `waited` s (log bucket hb). */
void sched_stats_waited(lt_sched_t *s, uint32_t jx, double waited, uint32_t hb);
/* lt_sched_las.c: lt_sched_decide() for LT_SCHED_POLICY_LAS, and its next timer. */
size_t sched_las_decide(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap);
double sched_las_next_timer(const lt_sched_t *s, double now);

/* ---- lookups: ids to table indexes, worker bitmaps ---------------------------------------- */

static inline uint64_t mix64(uint64_t x) { return lt_mix64(x + 0x9e3779b97f4a7c15ULL); }

static inline void bm_set(uint64_t *bm, uint32_t i) { bm[i >> 6] |= 1ULL << (i & 63); }
static inline void bm_clr(uint64_t *bm, uint32_t i) { bm[i >> 6] &= ~(1ULL << (i & 63)); }
static inline uint64_t *free_bm(lt_sched_t *s, uint32_t k) { return s->free_bm + (size_t)k * s->words; }
static inline uint64_t *model_bm(lt_sched_t *s, uint32_t m) {
  return s->model_bm + (size_t)m * s->words;
}

static inline uint32_t job_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->job_hash[mix64(id) & s->job_hmask]; i != NIL; i = s->jobs[i].hnext)
    if (s->jobs[i].id == id) return i;
  return NIL;
}
static inline uint32_t tenant_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->ten_hash[mix64(id) & s->ten_hmask]; i != NIL; i = s->tenants[i].hnext)
    if (s->tenants[i].id == id) return i;
  return NIL;
}
static inline uint32_t worker_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->wrk_hash[mix64(id) & s->wrk_hmask]; i != NIL; i = s->workers[i].hnext)
    if (s->workers[i].id == id) return i;
  return NIL;
}

/* ---- lt_sched_queue.c: queues, fair-share heaps, booking ------------------------------------ */

/* Puts job jx on its queues at time now: at the tail, or at the head of its tenant's queue when
 * front (a requeued job, already started once). */
void sched_queue_insert(lt_sched_t *s, uint32_t jx, bool front, double now);
/* Takes queued job jx off its queues (and drops its reservation); it is then JS_FREE. */
void sched_queue_remove(lt_sched_t *s, uint32_t jx);
/* Books the placement's workers for queued job jx, competing in class effective, and writes
 * one DISPATCH decision per part into d (pl->n of them, rank 0 first). */
void sched_book(lt_sched_t *s, uint32_t jx, const placement_t *pl, int effective, double now,
                lt_sched_decision_t *d);
/* The same on the given GPUs: masks[r] for rank r (free GPUs of its worker, pl->gpus[r] of them;
 * 0: the lowest free ones); masks NULL: sched_book. */
void sched_book_on(lt_sched_t *s, uint32_t jx, const placement_t *pl, const uint64_t *masks, int effective,
                   double now, lt_sched_decision_t *d);
/* The same on one worker w (the job's whole gang): one decision. */
void sched_book1(lt_sched_t *s, uint32_t jx, uint32_t w, int effective, double now,
                 lt_sched_decision_t *d);
/* Releases what running job jx holds, every part; it is then JS_FREE. */
void sched_run_release(lt_sched_t *s, uint32_t jx);
void sched_reserve(lt_sched_t *s, uint32_t w, uint32_t jx);
/* Asks running job rj to checkpoint and stop: marks it, takes a preemptible job's slots and
 * memory out of its workers' preemptible counts, counts the preemption; writes one PREEMPT
 * decision per part (rank 0 first) and returns how many, or 0 (nothing done) when cap is too
 * small for them. lt_sched_decide.c: the Lathe policy's preemptions and LAS's share it. */
size_t sched_preempt(lt_sched_t *s, job_t *rj, lt_sched_decision_t *out, size_t cap);
/* One decision row for part p of running job j (action; DISPATCH fields are the caller's). */
lt_sched_decision_t sched_part_decision(const lt_sched_t *s, const job_t *j, uint32_t p,
                                        lt_sched_action_t action);
/* Drops the reservation of the job reserved on worker w (all its workers); no-op when w is not
 * reserved. */
void sched_unreserve(lt_sched_t *s, uint32_t w);
double sched_tenant_key(const lt_sched_t *s, const tenant_t *t, int c);
void sched_heap_remove(lt_sched_t *s, int c, uint32_t t);
void sched_tenant_refresh(lt_sched_t *s, uint32_t t, int c);
void sched_tenant_refresh_all(lt_sched_t *s, uint32_t t);
void sched_heaps_rebuild(lt_sched_t *s);
int sched_worker_model_slot(const worker_t *wk, uint32_t m); /* -1: not held */
double sched_hist_quantile(const uint32_t *h, uint64_t n, double q);

/* The tables' invariants: true when they hold. Every mutating entry point ends with
 * assert(sched_ok(s)). The aggregate counts are checked always (O(classes)); each queue, run
 * list, worker booking and reservation only when cfg.check_invariants is set. */
bool sched_ok(const lt_sched_t *s);

#endif
