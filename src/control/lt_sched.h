/* lt_sched: Lathe's scheduling policy (docs/DESIGN.md §6, invariant 9), as a pure library.
 *
 * The scheduler daemon folds job, control, worker and tenant records into calls of this API and
 * turns the decisions it returns into dispatch and control records; `lathe sim` drives the very
 * same code with virtual time over a trace. Nothing here does I/O or reads a clock: every call
 * that depends on time takes `now` (seconds, any epoch, non-decreasing across calls).
 *
 * Policy (LT_SCHED_POLICY_LATHE):
 *   - strict priority across classes (production > standard > preemptible), in overload too:
 *     no job starts on a slot that a waiting job of a higher class could use now (the jobs
 *     behind a tenant's blocked head are tried; a worker draining for a gang holds its slots
 *     only against the gang's class and lower ones). Aging is bounded by that order: a
 *     standard job that waited `aging_s` may use the production reserve once no production
 *     job can start (aging_levels 0 turns this off); it never competes ahead of production;
 *   - within a class, weighted max-min fair share by DRF: the tenant with the lowest
 *     max(slots share, device-memory share) / weight goes next (a heap, O(log tenants));
 *     within a tenant and class, FIFO;
 *   - production's reserved share: standard work may hold at most (1 - production_reserve)
 *     of the fleet's slots, so production always finds that part free or held by preemptible
 *     work it may preempt;
 *   - tenant quotas: running slots (enforced here), queued jobs (lt_sched_admit(), the same check
 *     the API makes from its projection before it accepts a submission), job duration (a
 *     STOP decision);
 *   - base-model affinity: a worker that holds the job's model first (best fit by free slots),
 *     otherwise a cold load on the best-fitting worker (counted);
 *   - gang allocation, all or nothing: a job that fits on one worker (gpus <= the largest
 *     worker's slots) runs on one worker or does not start, even when two half-free workers
 *     would hold it; a larger job (a multi-worker gang) runs on a set of workers of one node
 *     group (lt_sched_worker_t.node_group: a rack, an NVLink domain) whose free slots together
 *     cover it, or does not start — the fewest workers, whole free workers first, the last
 *     part best fit, in the group that is left with the fewest free slots. A gang waiting past
 *     `gang_reserve_after_s` reserves a worker (a multi-worker gang: the workers of one group
 *     closest to free whose slots cover it), which then drains for it; the reserved workers
 *     count against max_reservations (one each), so drains stay bounded. No backfill: a
 *     draining worker's free slots are held against the gang's class and lower ones (no
 *     duration estimates prove a job would end before the gang starts);
 *   - preemption: a production or standard job blocked past `preempt_after_s` (a production
 *     gang at once) reserves a worker (a production multi-worker gang: the workers of one
 *     group) and asks preemptible jobs there to checkpoint and stop (PREEMPT decisions, one
 *     row per part of a multi-worker job); the caller reports each stop with
 *     lt_sched_job_requeue(), which puts the job back in its queue, all its parts freed.
 * LT_SCHED_POLICY_FIFO is the comparison peer behind the same interface: one queue in arrival
 * order, head-of-line blocking, best-fit placement, no classes, fairness, quotas, affinity or
 * preemption (max duration is still enforced). Both peers place multi-worker gangs with the
 * Lathe policy's own all-or-nothing helper, so comparisons are fair.
 * LT_SCHED_POLICY_LAS is the second peer, least attained service as Tiresias does it: a job's
 * attained service is gpus x seconds run over all its attempts; two queues split at
 * las_threshold_gpu_s (jobs below it first), FIFO by arrival within a queue, skipping what
 * does not fit (no head-of-line blocking), best-fit placement, no classes, fairness, quotas or
 * affinity; a first-queue job that cannot start preempts second-queue jobs (las_preempt).
 *
 * Threads: an lt_sched_t is not thread-safe; one thread owns it (the scheduler's fold loop or
 * the simulator). Memory: everything is allocated by lt_sched_new() from the configured
 * capacities (and by lt_sched_model_intern() for a new model name); events and decisions
 * allocate nothing. Determinism: the same calls in the same order give the same decisions. */
#ifndef LT_SCHED_H
#define LT_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"
#include "lt_job.h" /* lt_job_class_t: the classes the policy orders */

typedef struct lt_sched lt_sched_t;

typedef enum lt_sched_policy {
  LT_SCHED_POLICY_LATHE = 0,
  LT_SCHED_POLICY_FIFO = 1,
  LT_SCHED_POLICY_LAS = 2, /* least attained service, Tiresias-style (lt_sched_las.c) */
} lt_sched_policy_t;

/* Largest number of GPUs (slots) one worker may have: a dispatch names them in a 64-bit mask. */
#define LT_SCHED_MAX_WORKER_SLOTS 64
#define LT_SCHED_NO_MODEL UINT32_MAX
/* Most workers one multi-worker gang spans, and so most GPUs one job may ask for. */
#define LT_SCHED_MAX_GANG_WORKERS 64
#define LT_SCHED_MAX_JOB_GPUS (LT_SCHED_MAX_GANG_WORKERS * LT_SCHED_MAX_WORKER_SLOTS)

typedef struct lt_sched_config {
  lt_sched_policy_t policy;
  uint32_t max_tenants;       /* capacities: tables are sized once, at lt_sched_new() */
  uint32_t max_workers;
  uint32_t max_jobs;          /* queued + running jobs at once */
  uint32_t max_models;        /* distinct base-model names */
  double aging_s;             /* wait after which standard work may use the production reserve
                               * once no production job can start; 0: never */
  uint32_t aging_levels;      /* 0: no aging; otherwise as above (default 1) */
  double preempt_after_s;     /* production/standard wait before preempting; <0: never */
  double gang_reserve_after_s; /* multi-GPU wait before a worker is reserved for it; <0: never */
  double production_reserve;  /* fraction of slots standard work may not hold, 0..1 */
  uint32_t max_scan;          /* blocked candidates examined per decide call (bounds its cost) */
  uint32_t max_reservations;  /* workers reserved (draining) at once, a multi-worker gang's
                               * counting one each; 0: 1/8 of workers, >= 1; production does
                               * not count against it */
  bool check_invariants;      /* after every event and decide call, assert that the tables are
                               * consistent, in O(jobs + tenants + workers): for tests */
  double las_threshold_gpu_s; /* LAS: attained GPU-seconds past which a job drops from the
                               * first queue to the second (default 3600 GPU-s, Tiresias's
                               * 2-level queue); <= 0: one queue */
  bool las_preempt;           /* LAS: a first-queue job that cannot start preempts second-queue
                               * jobs (checkpoint and requeue, as PREEMPT); default true */
} lt_sched_config_t;

/* Fills *config with defaults: Lathe policy, 1024 tenants, 1024 workers, 65536 jobs,
 * 256 models, aging 600 s (1 level), preemption after 120 s, gang reservation after 300 s,
 * production reserve 0.1, max_scan 256. */
void lt_sched_config_default(lt_sched_config_t *config);

typedef struct lt_sched_tenant {
  uint64_t id;
  double weight;               /* > 0; entitlement is proportional to it */
  uint32_t max_running_slots;  /* 0: unlimited */
  uint32_t max_queued_jobs;    /* 0: unlimited; checked by lt_sched_admit() */
  double max_duration_s;       /* 0: unlimited; a running job past it gets a STOP decision */
} lt_sched_tenant_t;

typedef struct lt_sched_worker {
  uint64_t id;
  uint32_t slots;        /* GPUs (or CPU slots), 1..LT_SCHED_MAX_WORKER_SLOTS */
  uint64_t mem_bytes;    /* device memory across its slots */
  uint32_t model_cache;  /* base models it can hold loaded at once (>= 1) */
  uint32_t node_group;   /* workers of one group (a rack, an NVLink domain) may host one
                          * multi-worker gang together; 0 by default: one group */
} lt_sched_worker_t;

typedef struct lt_sched_job {
  uint64_t id;
  uint64_t tenant_id;       /* must have been upserted */
  lt_job_class_t cls;
  uint32_t gpus;            /* slots needed, 1..LT_SCHED_MAX_JOB_GPUS: all on one worker when
                             * it has that many, else on workers of one node group (gang) */
  uint64_t mem_bytes;       /* device memory needed in total */
  uint32_t model;           /* from lt_sched_model_intern(), or LT_SCHED_NO_MODEL */
  uint32_t attempt;         /* the attempt the next dispatch starts is attempt + 1 */
  double limit_s;           /* its run-time bound per attempt (the spec's max_duration_s, or
                             * the tenant's, whichever is lower), enforced by the caller; 0:
                             * none. A bounded job may be backfilled onto slots held for a
                             * waiting gang when it ends before the gang could start there. */
} lt_sched_job_t;

typedef enum lt_sched_action {
  LT_SCHED_DISPATCH = 1, /* start job on worker, GPUs gpu_mask: resources are now booked */
  LT_SCHED_PREEMPT = 2,  /* ask the job to checkpoint and stop (PreemptRequested) */
  LT_SCHED_STOP = 3,     /* the job ran past its tenant's max duration: stop it */
} lt_sched_action_t;

/* One decision row names one worker. A multi-worker gang gets one row per worker part, all with
 * the same action, job_id and attempt, consecutive in the output, rank 0 first (rank
 * 0..world-1); a single-worker job one row with rank 0 and world 1. Callers must treat the
 * world rows of one job as one dispatch (or one preemption, one stop): the resources of every
 * part are booked at once, and the job starts when all its parts have — a caller that cannot
 * run a multi-worker gang drops the job (lt_sched_job_finished) so its parts are freed. */
typedef struct lt_sched_decision {
  lt_sched_action_t action;
  uint64_t job_id;
  uint64_t tenant_id;
  uint64_t worker_id;
  uint64_t gpu_mask;          /* bit i = GPU i of the worker: this part's */
  uint32_t rank;              /* this part's rank in the gang, 0..world-1 */
  uint32_t world;             /* the job's parts (workers it runs on); 1: a single worker */
  uint32_t attempt;           /* DISPATCH: the new attempt number; otherwise the running one */
  lt_job_class_t cls;       /* the job's own class */
  lt_job_class_t effective; /* DISPATCH: the class it competed in (after aging) */
  bool cold_load;             /* DISPATCH: this part's worker did not hold the base model */
  double waited_s;            /* DISPATCH: time since it was (re)queued */
} lt_sched_decision_t;

/* Creates a scheduler. config may be NULL (defaults). On failure *out is NULL and errstr says
 * which setting is wrong. The caller owns *out and frees it with lt_sched_destroy(). */
lt_err_t lt_sched_new(const lt_sched_config_t *config, lt_sched_t **out, char *errstr,
                      size_t errstr_size);
void lt_sched_destroy(lt_sched_t *s); /* NULL is fine */

/* Returns the id of a base-model name, adding it the first time (copies name). */
lt_err_t lt_sched_model_intern(lt_sched_t *s, const char *name, uint32_t *id_out, char *errstr,
                               size_t errstr_size);
/* The name of a model id, or NULL. Owned by s. */
const char *lt_sched_model_name(const lt_sched_t *s, uint32_t id);

/* --- events in (the fold) ------------------------------------------------------------------ */

/* Creates or updates a tenant (TenantUpserted). Quotas apply from the next decision on. */
lt_err_t lt_sched_tenant_upsert(lt_sched_t *s, const lt_sched_tenant_t *tenant, char *errstr,
                                size_t errstr_size);

/* Admission check for a new submission of tenant_id: LT_ERR_QUOTA with a message naming the
 * limit when the tenant already has max_queued_jobs queued; LT_ERR_NOT_FOUND for an unknown
 * tenant; LT_ERR_UNAVAILABLE when the scheduler's job table is full. Changes nothing. */
lt_err_t lt_sched_admit(const lt_sched_t *s, uint64_t tenant_id, char *errstr,
                        size_t errstr_size);

/* A worker joins (or comes back) with the given capacity; its model cache starts empty. */
lt_err_t lt_sched_worker_up(lt_sched_t *s, const lt_sched_worker_t *worker, char *errstr,
                            size_t errstr_size);
/* A heartbeat: the models it holds now (replacing what the scheduler assumed). */
lt_err_t lt_sched_worker_heartbeat(lt_sched_t *s, uint64_t worker_id, const uint32_t *models,
                                   size_t n_models, char *errstr, size_t errstr_size);
/* Cordons an up worker (on) or lifts it: a cordoned worker gets no new job, no reservation and
 * no preemption for another job's sake; what runs there keeps running and is accounted as
 * before. Coming up again (lt_sched_worker_up after down) lifts it. LT_ERR_NOT_FOUND for a worker
 * that is not up. The caller decides again after a lift. */
lt_err_t lt_sched_worker_cordon(lt_sched_t *s, uint64_t worker_id, bool on);
/* A worker is gone (lease expired): its running jobs go back to their queues (new attempt); a
 * multi-worker gang with a part on it goes back whole, its parts on other workers freed. A
 * worker that comes back up with another node_group moves to that group. */
lt_err_t lt_sched_worker_down(lt_sched_t *s, uint64_t worker_id, double now);

/* An accepted job enters the queue at time now. Never refused for quota (admission is
 * lt_sched_admit(), before the record is written); LT_ERR_EXISTS for a known job id,
 * LT_ERR_UNAVAILABLE when max_jobs are in the table, LT_ERR_INVALID for a bad job. */
lt_err_t lt_sched_job_enqueue(lt_sched_t *s, const lt_sched_job_t *job, double now,
                              char *errstr, size_t errstr_size);
/* AttemptStarted: the job's duration counts from now. */
lt_err_t lt_sched_job_started(lt_sched_t *s, uint64_t job_id, double now);
/* A job that runs where the log says (a new leader rebuilding its view): queued job job_id is
 * booked running on workers[0..n), rank order, as if lt_sched_decide had dispatched it there
 * (its attempt becomes attempt + 1), and nothing else is decided. masks (may be NULL) names each
 * rank's GPUs on its worker, as the dispatch's decision rows gave them (gpu_mask); a rank without
 * one (0) takes what its worker has free in rank order, the last one what is left. Book a gang
 * whose masks are known before the jobs on one worker, whose GPUs matter only by their count.
 * LT_ERR_NOT_FOUND for a job that is not queued or a worker that is not up; LT_ERR_INVALID for n
 * outside 1..LT_SCHED_MAX_GANG_WORKERS, a worker named twice or workers of different node
 * groups; LT_ERR_UNAVAILABLE when a rank's GPUs are taken or its worker's free slots (or memory)
 * cannot hold it. Nothing changes on an error: the caller then drops the job (its slots look
 * free) or queues it again. */
lt_err_t lt_sched_job_book(lt_sched_t *s, uint64_t job_id, const uint64_t *workers, const uint64_t *masks,
                           uint32_t n, double now, char *errstr, size_t errstr_size);
/* Completed, failed or cancelled (queued or running): the job leaves the scheduler. */
lt_err_t lt_sched_job_finished(lt_sched_t *s, uint64_t job_id, double now);
lt_err_t lt_sched_job_cancelled(lt_sched_t *s, uint64_t job_id, double now);
/* A running job stopped without finishing (preempted after its checkpoint, attempt lost, not
 * started in time): it frees its resources and goes back to the head of its tenant's queue. */
lt_err_t lt_sched_job_requeue(lt_sched_t *s, uint64_t job_id, double now);

/* --- decisions out ------------------------------------------------------------------------ */

/* Applies the policy at time now and writes at most cap decisions into out (caller-owned);
 * returns how many. Dispatches book their resources at once. A job's rows are never split
 * across calls: a gang whose world rows do not fit in what is left of cap waits for the next
 * call (cap >= LT_SCHED_MAX_GANG_WORKERS lets every gang start). Call it after events and
 * periodically (aging, preemption and gang bounds are measured against now). */
size_t lt_sched_decide(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap);

/* The earliest time after now at which lt_sched_decide() could decide differently although no
 * event comes in: a queued job's wait crossing aging_s (each level), preempt_after_s or
 * gang_reserve_after_s; a running job reaching its tenant's max duration; under LAS a running
 * job crossing las_threshold_gpu_s. INFINITY when there is none. The caller need not call
 * decide at other times (the simulator calls it on events and at these times only). Drops the
 * crossings that passed from its table (so it is not const); decisions are unchanged. O(1)
 * amortised, plus O(running) under LAS. */
double lt_sched_next_timer(lt_sched_t *s, double now);

/* When the starvation pass looks again at a job it looked at and could not help (it waits
 * STARVE_RETRY_S between looks): the earliest such time after now among the oldest queued jobs,
 * INFINITY when none. Meaningful only after something changed (an event or a decision): with
 * nothing changed, the next look finds the same. */
double lt_sched_next_retry(const lt_sched_t *s, double now);

/* --- visibility --------------------------------------------------------------------------- */

typedef struct lt_sched_counters {
  uint64_t dispatches, preemptions, stops, cold_loads, requeues;
  uint64_t backfills; /* dispatches onto a worker reserved for another job (lt_sched_job_t.limit_s) */
  uint32_t queued, running, tenants, workers;
  uint32_t slots_total, slots_used;
  uint32_t slots_used_class[LT_CLASS__COUNT];
  uint32_t queued_class[LT_CLASS__COUNT];
} lt_sched_counters_t;
void lt_sched_counters(const lt_sched_t *s, lt_sched_counters_t *out);

/* Queue position (0: next) and a wait estimate for a queued job: jobs of higher classes, then
 * this class's jobs expected ahead under weighted fair share, times the mean run time seen so
 * far over the fleet's slots. wait_est_s is -1 while no job has finished. LT_ERR_NOT_FOUND
 * if the job is not queued. O(tenants + tenant's queue): for API reads, not the hot path. */
lt_err_t lt_sched_job_position(const lt_sched_t *s, uint64_t job_id, uint32_t *position,
                               double *wait_est_s);

typedef struct lt_sched_tenant_stats {
  uint64_t tenant_id;
  double weight;
  uint32_t queued;            /* in this class */
  uint32_t running_slots;     /* in this class */
  double demand_slots;        /* queued GPUs + running slots in this class */
  double share;               /* running_slots / slots the class holds */
  double entitlement;         /* weighted max-min fair fraction of those slots given demand */
  double dominant_share;      /* DRF share (max of slots, memory) / weight in this class */
  double wait_p50_s, wait_p99_s; /* waits before dispatch, all classes (log buckets, ~10%) */
  uint64_t dispatched;
} lt_sched_tenant_stats_t;

/* Per-tenant view of class cls, for every tenant with demand or history in it; writes at most
 * cap rows in tenant-table order and returns the number of rows available. */
size_t lt_sched_tenants_stats(lt_sched_t *s, lt_job_class_t cls, lt_sched_tenant_stats_t *out,
                              size_t cap);

/* Jain's fairness index of class cls now, over tenants with demand: x = running / entitled
 * slots. 1 when fair (or when no tenant has demand). */
double lt_sched_jain(lt_sched_t *s, lt_job_class_t cls);

/* Upper bounds, in seconds, of the buckets of lt_sched_usage_t's wait histograms (Prometheus
 * `le`); the last is INFINITY. */
#define LT_SCHED_WAIT_BUCKETS 12
extern const double lt_sched_wait_bounds_s[LT_SCHED_WAIT_BUCKETS];

/* What each tenant's jobs used and waited, per class of the job: GPU-seconds run (every ended
 * attempt, from its start to its end, plus the running ones up to now), cold loads (dispatches
 * whose worker did not hold the job's base model), and the waits of its dispatches (each from
 * the job's last (re)queueing): how many, their sum, a cumulative histogram (wait_le[c][b]:
 * waits <= lt_sched_wait_bounds_s[b]) and quantiles (log buckets, within ~12%). */
typedef struct lt_sched_usage {
  uint64_t tenant_id;
  double gpu_seconds[LT_CLASS__COUNT];
  uint64_t cold_loads[LT_CLASS__COUNT];
  uint64_t waits[LT_CLASS__COUNT];
  double wait_sum_s[LT_CLASS__COUNT];
  uint64_t wait_le[LT_CLASS__COUNT][LT_SCHED_WAIT_BUCKETS];
  double wait_p50_s[LT_CLASS__COUNT], wait_p99_s[LT_CLASS__COUNT];
} lt_sched_usage_t;

/* One row per known tenant, in tenant-table order (row i is tenant-table entry i); writes at
 * most cap rows and returns the number of tenants. O(tenants + workers + running jobs). */
size_t lt_sched_tenants_usage(const lt_sched_t *s, double now, lt_sched_usage_t *out,
                              size_t cap);

/* The smallest GPU count among queued jobs; 0 when nothing is queued; when only gangs larger than
 * any worker (LT_SCHED_MAX_WORKER_SLOTS) wait, LT_SCHED_MAX_WORKER_SLOTS + 1 (their exact size is
 * not tracked). O(1). Fragmentation then counts the free slots of node groups with fewer free
 * slots than that, a lower bound of what cannot host the gang. */
uint32_t lt_sched_smallest_queued(const lt_sched_t *s);

/* Fragmentation now: free slots on unreserved up workers whose free count is below the
 * smallest queued job's GPUs, so that no waiting job fits there. 0 when nothing is queued.
 * (Free slots on a reserved worker are counted by lt_sched_reserved_idle_slot_s instead.)
 * O(workers). */
uint32_t lt_sched_fragmented_slots(const lt_sched_t *s);

/* Idle-but-reserved slot time: the integral over time of the free slots on workers reserved
 * (draining) for a waiting gang, in slot-seconds, up to now. Integrated at every event and
 * decide call that takes now; a worker's free slots count from the call that reserved it until
 * the call that dispatches the gang or drops the reservation. */
double lt_sched_reserved_idle_slot_s(const lt_sched_t *s, double now);

/* Free slots on reserved workers now, and how many workers are reserved. */
uint32_t lt_sched_reserved_idle_slots(const lt_sched_t *s, uint32_t *workers_out);

/* Weighted max-min fair (water-filling) split of capacity among n claimants with the given
 * demands and weights (> 0): alloc_out[i] <= demand[i], sums to min(capacity, sum demand).
 * Pure; used by the scheduler's visibility and by the simulator. */
void lt_sched_waterfill(size_t n, const double *demand, const double *weight, double capacity,
                        double *alloc_out);

/* Jain's index (sum x)^2 / (n sum x^2) of n values; 1 for n == 0. */
double lt_sched_jain_index(size_t n, const double *x);

const char *lt_sched_policy_name(lt_sched_policy_t p);

/* --- simulator (virtual time over a trace; used by `lathe sim` and the tests) -------------- */

typedef struct lt_sched_trace lt_sched_trace_t;

/* A CSV trace: a header line, then `arrival_s,tenant,class,gpus,duration_s,base_model` per
 * line ('#' lines and blank lines skipped), sorted by arrival_s. Read line by line: the caller
 * makes an empty trace, adds each line as it reads it (len bytes, a trailing newline is
 * dropped; a bad line, or a line whose arrival is before the previous one's, fails with a
 * message naming the line and column) and finishes it (fails when no job line came). Only the
 * parsed rows are kept (32 bytes a job), not the text. The caller frees the trace with
 * lt_sched_trace_destroy(). */
lt_err_t lt_sched_trace_new(lt_sched_trace_t **out, char *errstr, size_t errstr_size);
lt_err_t lt_sched_trace_add_line(lt_sched_trace_t *t, const char *line, size_t len,
                                 char *errstr, size_t errstr_size);
lt_err_t lt_sched_trace_finish(lt_sched_trace_t *t, char *errstr, size_t errstr_size);
/* The whole text at once (need not be NUL-terminated), for tests: lines need not be sorted here,
 * they are sorted by (arrival, line). */
lt_err_t lt_sched_trace_parse(const char *text, size_t len, lt_sched_trace_t **out,
                              char *errstr, size_t errstr_size);
void lt_sched_trace_destroy(lt_sched_trace_t *t);
size_t lt_sched_trace_jobs(const lt_sched_trace_t *t);
size_t lt_sched_trace_tenants(const lt_sched_trace_t *t);
const char *lt_sched_trace_tenant_name(const lt_sched_trace_t *t, size_t i);

typedef struct lt_sched_sim_tenant {
  char name[64];
  double weight;
  uint32_t max_running_slots;
  double max_duration_s;
} lt_sched_sim_tenant_t;

typedef struct lt_sched_sim_config {
  lt_sched_config_t sched;   /* policy and bounds; capacities are sized from the trace */
  uint32_t workers;
  uint32_t slots_per_worker;
  uint32_t workers_per_group; /* node groups of this many workers (the last may be smaller);
                               * 0: all workers in one group */
  uint64_t mem_per_slot;     /* device memory per slot; a job needs gpus * mem_per_slot */
  uint32_t models_per_worker;
  double cold_load_s;        /* added to a job's run time when its worker loads the model */
  double checkpoint_s;       /* from PREEMPT to the stop (work until then is kept) */
  double tick_s;             /* 0 (default): decide on events and at the policy's timers only
                              * (lt_sched_next_timer); > 0: also every tick_s while jobs wait
                              * (the simulator before it was event-driven; for comparison) */
  const lt_sched_sim_tenant_t *tenants; /* weights/quotas by name; others get weight 1 */
  size_t n_tenants;
  double limit_factor;       /* each job declares a maximum duration of this times its true
                              * one, plus cold_load_s (lt_sched_job_t.limit_s), so the policy
                              * may backfill; >= 1, or 0 (default): no job declares one, as
                              * max_duration_s is optional live */
} lt_sched_sim_config_t;

void lt_sched_sim_config_default(lt_sched_sim_config_t *config);

typedef struct lt_sched_sim_row {  /* one (tenant, class) with jobs in the trace */
  size_t tenant;                   /* index into the trace's tenants */
  lt_job_class_t cls;
  double weight;
  uint32_t jobs;
  double wait_p50_s, wait_p99_s, wait_max_s; /* arrival to first dispatch, exact */
  double share;        /* slot-seconds it held / slot-seconds its class held */
  double entitlement;  /* time-integrated weighted max-min fair share of its class */
  double gpu_hours;    /* slot-hours its jobs ran, from dispatch (cold loads included) */
  uint64_t cold_loads; /* dispatches of its jobs that loaded the base model */
} lt_sched_sim_row_t;

typedef struct lt_sched_sim_result {
  lt_sched_policy_t policy;
  lt_sched_sim_row_t *rows; /* owned by the result */
  size_t n_rows;
  double jain[LT_CLASS__COUNT]; /* over rows of the class: share / entitlement */
  bool class_present[LT_CLASS__COUNT];
  double wait_p50_s[LT_CLASS__COUNT], wait_p99_s[LT_CLASS__COUNT]; /* all the class's jobs */
  double utilisation;   /* busy slot-seconds / (slots * makespan) */
  double makespan_s;    /* first arrival to last completion */
  uint64_t dispatches, preemptions, stops, cold_loads, completed;
  uint64_t backfills;      /* dispatches onto slots held for a waiting gang (lt_sched_counters) */
  uint64_t gangs_started;  /* dispatches of jobs of more than one GPU */
  uint64_t multi_started, multi_finished; /* dispatches of multi-worker gangs, and such jobs
                                           * completed (or stopped at max duration) */
  uint64_t decide_calls;   /* lt_sched_decide() calls the run made */
  double reserved_idle_slot_hours; /* free slots held on reserved workers, integrated */
  double fragmented_slots_mean;    /* lt_sched_fragmented_slots(), time-weighted over the run */
  double gpu_hours;                /* all tenants: the rows' sum */
  /* Jobs larger than one node group (workers_per_group x slots), or than a gang may span:
   * set aside at arrival (never queued); counted here, the first one's trace line named. */
  uint64_t refused_size;
  uint32_t refused_first_line, refused_first_gpus;
} lt_sched_sim_result_t;

/* Runs the trace to completion under config. The caller frees *out's rows with
 * lt_sched_sim_result_free(). Pure: no I/O. Fails (LT_ERR_INTERNAL) only on a real deadlock:
 * jobs queued, none running, and no arrival, event or policy timer to come; the message names
 * the jobs (trace lines) that can never start and why. */
lt_err_t lt_sched_sim_run(const lt_sched_trace_t *trace, const lt_sched_sim_config_t *config,
                          lt_sched_sim_result_t *out, char *errstr, size_t errstr_size);
void lt_sched_sim_result_free(lt_sched_sim_result_t *r);

#endif
