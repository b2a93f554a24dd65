/* lt_scheduler: `lathed scheduler`, the live side of the scheduling policy (docs/DESIGN.md §2, §6).
 *
 * It folds lathe.jobs, lathe.control, lathe.workers and lathe.tenants through lt_proj (one
 * decode-and-fold for every process), turns the fold into calls of the pure policy (lt_sched),
 * and writes what it decides back as records, in Kafka transactions:
 *   - every JobSubmitted (from the API or any upstream Kafka client) is validated exactly like
 *     an API submission (lt_jobspec_from_record + lt_jobspec_validate, the tenant must exist and
 *     not be disabled, max_duration_s within the tenant's max_job_duration_s) -> JobAccepted or
 *     JobRejected (code, reason, field);
 *   - undecodable bytes and records that cannot be applied -> lathe.deadletter (DeadLetter with
 *     topic, partition, offset, key, payload and reason); the fold goes on;
 *   - lt_sched's DISPATCH -> JobDispatched to lathe.control and to lathe.dispatch.<class> (key
 *     job_id, attempt = previous + 1, the spec, worker, lease, resume_step of the newest live
 *     checkpoint); PREEMPT -> PreemptRequested;
 *   - a dispatched attempt not started within start_timeout_ms is dispatched again under a new
 *     attempt number (which fences the old one);
 *   - an attempt whose lease expired (not renewed by its worker's heartbeats) gets
 *     AttemptStopped(lost) only after expiry + lease_margin_ms (invariant 2), then is requeued;
 *     after max_attempts failed attempts, JobFailed;
 *   - a running job past min(its max_duration_s, the tenant's max_job_duration_s) -> JobFailed;
 *   - CancelRequested of a job that is not running -> JobCancelled at once; of a running one,
 *     JobCancelled after the worker's AttemptStopped (or the lease expiry).
 *
 * Exactly-once without relying on memory: every decision is a function of the fold, and the fold
 * is rebuilt from the log whenever this instance starts leading. A decision is written in a
 * transaction together with the group's offsets of lathe.jobs/lathe.control (the offsets decide
 * which bad records were already dead-lettered); a new leader first fences the old one (same
 * transactional id), then replays to the end, then decides only what the log does not already
 * say. So a crash or a takeover never duplicates or loses a decision.
 *
 * Leadership: every instance joins the consumer group `group_id` subscribed to lathe.jobs
 * (cooperative-sticky assignment, partitions paused: they are used for membership only). The
 * instance that owns lathe.jobs partition 0 is the leader; the others are standbys holding the
 * rest. When the leader leaves or dies, the group gives partition 0 to a standby, which starts
 * leading. A leader whose producer is fenced (a newer instance with the same transactional id)
 * stops leading at once and stays a standby until the group gives it partition 0 again.
 *
 * What lt_sched is told: tenants (weight, max running slots; durations are enforced here from
 * the fold, so lt_sched never sends STOP), workers (from WorkerHeartbeat: slots_total,
 * memory_total_bytes, base_models; a worker whose newest heartbeat is older than
 * worker_timeout_ms is down; draining workers are not brought up), queued jobs (fold state
 * QUEUED) and, when leading starts, the jobs already running on each live worker. Job memory is
 * not known before a run, so jobs ask for 0 bytes and memory never constrains placement yet.
 *
 * Operators see the leader's policy through its operator endpoint (conf.operator_bind_addr:
 * /metrics and /v1/admin/queue, lt_scheduler_ops.c; `lathe admin queue`).
 *
 * Threads: everything runs on the caller's event_base thread. The process must call
 * evthread_use_pthreads() before creating the event_base. */
#ifndef LT_SCHEDULER_H
#define LT_SCHEDULER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_err.h"
#include "lt_proj.h"
#include "lt_sched.h"
#include "lt_store.h"

typedef struct lt_scheduler lt_scheduler_t;

typedef struct lt_scheduler_conf {
  const lt_bus_conf_t *bus;           /* borrowed; topics use its prefix */
  const lt_avro_registry_t *registry; /* borrowed */
  /* borrowed; TenantUpserted folds only with a valid MAC under it (docs/DESIGN.md §5a). lathed
   * always sets it; NULL (tests of other behaviour) folds tenants unchecked. */
  const lt_recmac_key_t *tenant_mac;
  const char *producer_id;            /* identity in records, e.g. "scheduler/host-1" */
  const char *transactional_id;       /* NULL: "<prefix>scheduler" (one per deployment) */
  const char *group_id;               /* NULL: "<prefix>scheduler" */
  const lt_sched_config_t *policy;    /* NULL: lt_sched_config_default() */
  int64_t lease_ms;                   /* lease given with a dispatch (30000) */
  int64_t lease_margin_ms;            /* wait after a lease expired before fencing (5000) */
  int64_t start_timeout_ms;           /* dispatched, not started: dispatch again (60000) */
  int64_t worker_timeout_ms;          /* no heartbeat for this long: worker down (lease_ms) */
  int64_t tenant_grace_ms;            /* unknown tenant: wait this long before rejecting (5000) */
  int64_t checkpoint_deadline_ms;     /* PreemptRequested: time to checkpoint (30000) */
  int32_t max_attempts;               /* failed attempts before JobFailed (3) */
  int32_t max_unavailable_stops;      /* attempts stopped unavailable (the object store away for
                                         their inputs or a checkpoint) before JobFailed
                                         store_unavailable: not failures, but bounded (30, about
                                         an hour of the worker's 2-minute retry window) */
  int tick_ms;                        /* timer: group, timeouts and decisions (100) */
  lt_store_t *store;                  /* borrowed, may be NULL: checks that a submission's datasets
                                         exist, as the API does (NULL: not checked) */
  /* The operator endpoint (lt_scheduler_ops.c): plain HTTP without authentication, so keep it on
   * loopback. NULL: none. It serves GET /healthz, /metrics (Prometheus) and /v1/admin/queue
   * (JSON, `lathe admin queue`) from the leader's lt_sched; a standby answers 503 there. */
  const char *operator_bind_addr;
  uint16_t operator_port;             /* 0: any free port (lt_scheduler_operator_port tells) */
} lt_scheduler_conf_t;

typedef enum lt_scheduler_role {
  LT_SCHEDULER_STANDBY = 0, /* member of the group, not leading */
  LT_SCHEDULER_CATCHUP,     /* owns partition 0, fenced the old leader, replaying the log */
  LT_SCHEDULER_LEADING,     /* caught up and deciding */
} lt_scheduler_role_t;

typedef struct lt_scheduler_stats {
  lt_scheduler_role_t role;
  bool fenced;               /* this instance's producer was fenced (it stopped leading) */
  uint64_t terms;            /* times it started leading */
  uint64_t folded;           /* messages folded in the current term */
  uint64_t accepted, rejected, dispatched, preempted, lost, failed, cancelled, deadlettered;
  uint64_t txns, txn_failures;
} lt_scheduler_stats_t;

/* Creates the scheduler on base: joins the group, and leads when it owns lathe.jobs partition 0.
 * conf is copied (its borrowed pointers must outlive the scheduler). *out is the caller's
 * (lt_scheduler_destroy). */
lt_err_t lt_scheduler_new(struct event_base *base, const lt_scheduler_conf_t *conf,
                          lt_scheduler_t **out, char *errstr, size_t errstr_size);

/* Leaves the group and frees. An open transaction is aborted by the broker (or by the next
 * leader's fencing); nothing half-decided is ever visible. NULL is a no-op. */
void lt_scheduler_destroy(lt_scheduler_t *s);

void lt_scheduler_stats(const lt_scheduler_t *s, lt_scheduler_stats_t *out);

/* The fold's job-state digest (lt_job_digest). LT_ERR_UNAVAILABLE while standby (no fold). */
lt_err_t lt_scheduler_digest(lt_scheduler_t *s, char out_hex[65]);

/* The port of the operator endpoint; 0 when conf.operator_bind_addr was NULL. */
uint16_t lt_scheduler_operator_port(const lt_scheduler_t *s);

/* The current fold (NULL while standby); borrowed, valid until the next event-loop turn. */
lt_proj_t *lt_scheduler_proj(lt_scheduler_t *s);

#endif
