/* lt_worker: `lathed worker`, one per GPU or CPU node (docs/DESIGN.md §2, §7, §9).
 *
 * It consumes the dispatch topics of every priority class (one per class, so every worker of the
 * group owns partitions of each), claims an attempt with AttemptStarted, runs it in an executor
 * child process (lt_executor.c, spoken to in the protocol of lt_proto.h), and records what the
 * executor reports: StepCompleted and EvalCompleted into lathe.progress, CheckpointCommitted
 * (after the sealed objects are in the store), AttemptStopped, JobCompleted, JobCancelled and
 * CleanupDone into lathe.control.
 *
 * The invariants it keeps:
 *  - one live attempt (§4.2): it folds lathe.control (lt_proj) and never starts, nor records
 *    anything for, an attempt that is not the job's current one; a newer attempt kills ours. Its
 *    leases are renewed by its heartbeats; when heartbeats cannot be delivered for 2/3 of a
 *    lease it stops its attempts itself, before the lease can expire;
 *  - bounded cancellation (§4.6): on CancelRequested the executor stops at the next micro-step
 *    (SIGUSR1); no stop within the kill deadline -> SIGKILL, AttemptStopped(killed);
 *  - commit after upload (§4.4, §4.5): CheckpointCommitted is produced with acks=all only after
 *    the executor reported the objects written; JobCompleted only after the final commit;
 *  - isolation (§4.7, §5a): executors are confined (lt_confine.h: unprivileged, no network, no
 *    credentials, seccomp, rlimits); the worker fetches and opens their inputs into memory files
 *    (lt_xfer.h) and uploads the checkpoints they seal (lt_ckpt.h, copy mode); their private
 *    directories (sealed checkpoints on disk, plaintext on a memory file system) and input files
 *    are zeroed and removed after the attempt; staging objects of a cancelled job are deleted.
 *
 * Threads: everything on the caller's event_base thread; the producer's delivery reports only
 * update an atomic heartbeat timestamp. */
#ifndef LT_WORKER_H
#define LT_WORKER_H

#include <event2/event.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_recmac.h"
#include "lt_store.h"

typedef struct lt_worker lt_worker_t;

typedef struct lt_worker_conf {
  const lt_bus_conf_t *bus;           /* borrowed */
  lt_store_t *store;                  /* borrowed: inputs, checkpoint uploads, staging cleanup */
  const lt_crypto_kek_t *kek;         /* borrowed: opens the tenants' data keys */
  /* borrowed; TenantUpserted folds only with a valid MAC under it (docs/DESIGN.md §5a). lathed
   * always sets it; NULL (tests of other behaviour) folds tenants unchecked. */
  const lt_recmac_key_t *tenant_mac;
  const lt_avro_registry_t *registry; /* borrowed */
  const char *worker_id;              /* also the producer identity ("worker/<id>") */
  int slots;                          /* attempts at once (1; on cuda, one a GPU: every GPU) */
  const char *backend;                /* "auto" (NULL), "cpu" or "cuda" (lt_worker_devices) */
  int threads_per_executor;           /* cpu backend threads of each executor (1) */
  const char *models_dir;             /* <models_dir>/<base_model>/ holds each base model */
  const char *executor_path;          /* the lathed binary to spawn (/proc/self/exe) */
  const char *work_root;              /* parent of the per-attempt sealed directories (/tmp) */
  const char *mem_root;               /* parent of the per-attempt plaintext directories: a memory
                                       * file system (/dev/shm; LATHE_WORKER_MEM_DIR) */
  int heartbeat_ms;                   /* 1000 */
  int kill_deadline_ms;               /* 30000: stop requested -> SIGKILL after this */
  int watchdog_ms;                    /* 600000: no progress line for this long -> kill */
  int64_t session_idle_ms;            /* 300000: a session with no call this long is parked; < 0 never */
  int64_t store_retry_ms;             /* 120000: an unreachable object store is retried this long
                                       * (an attempt's inputs, a checkpoint's upload);
                                       * LATHE_WORKER_STORE_RETRY_MS */
  /* Gangs across workers (docs/DESIGN.md §6): the node group this worker is in, and the
   * host:port other workers of the group reach it at (rank 0 of a gang listens at that port plus
   * the lowest index of the slots it was given). Either empty (the default): no gang spans this
   * worker. LATHE_WORKER_NODE_GROUP, LATHE_WORKER_RENDEZVOUS. */
  const char *node_group, *rendezvous;
  /* Called once when an operator's signed WorkerDrainRequested for this worker (lathe admin drain)
   * made it drain, with the request's reason; NULL: the worker drains and the process goes on. */
  void (*on_drain)(void *ctx, const char *reason);
  void *on_drain_ctx;
} lt_worker_conf_t;

lt_err_t lt_worker_new(struct event_base *base, const lt_worker_conf_t *conf, lt_worker_t **out, char *errstr,
                       size_t errstr_size);

/* Kills running executors (their attempts get AttemptStopped(lost) from the scheduler once the
 * leases expire) and frees. NULL is fine. */
void lt_worker_destroy(lt_worker_t *w);

/* Drains the worker (a graceful stop, `lathed` on SIGTERM): its heartbeat says draining, sent
 * before anything else, so the scheduler places nothing more here and asks the gangs with a part
 * here to stop; it consumes no dispatch, and each one taken but not started gets its
 * AttemptStopped (preempt) so the job is queued again at once; every attempt it speaks for is
 * asked to checkpoint and stop, as a preemption is (AttemptStopped preempt: queued again, not
 * charged, resumed from that checkpoint). One that does not stop within kill_deadline_ms is
 * killed: a job then resumes from its last interval commit (still not charged), and a session's
 * attempt is recorded failed (the state its calls ran on is gone). A part of another worker's
 * gang (rank > 0) ends when its rank 0 stops. Returns the kill deadline (ms), within which the
 * attempts end. Lasts until the worker is destroyed. On the worker's event loop. */
int64_t lt_worker_drain(lt_worker_t *w);
/* No attempt holds a slot (a drained worker may stop). */
bool lt_worker_idle(lt_worker_t *w);

/* How attempts ended here: the executor finished (completed) or stopped on request (stopped,
 * a cancel or a preemption), said it failed, finished without a final checkpoint or could not
 * start (failed), ended without saying (lost: it died or was killed), or met the object store
 * away past the retry window: before it started, or a job's checkpoint upload (unavailable). */
typedef enum {
  LT_WORKER_END_COMPLETED,
  LT_WORKER_END_STOPPED,
  LT_WORKER_END_FAILED,
  LT_WORKER_END_LOST,
  LT_WORKER_END_UNAVAILABLE,
  LT_WORKER_END__COUNT
} lt_worker_end_t;

/* The operator endpoint's figures: the state now and counters since creation (a copy). */
typedef struct lt_worker_stats {
  int slots, busy, pending;             /* slots, those holding an attempt, dispatches waiting */
  uint64_t started;                     /* executors started */
  uint64_t ended[LT_WORKER_END__COUNT]; /* attempts ended, by outcome */
  uint64_t fetched_bytes;               /* plaintext inputs fetched for started executors */
  uint64_t uploaded_bytes, checkpoints; /* checkpoints committed and their stored bytes */
  int64_t hb_ok_ms, hb_sent_ms;         /* last heartbeat acknowledged, and sent (wall ms; 0: none) */
  int64_t heartbeat_ms;                 /* the heartbeat interval */
  bool draining;                        /* lt_worker_drain was called */
} lt_worker_stats_t;

/* On the worker's event loop. */
void lt_worker_stats(lt_worker_t *w, lt_worker_stats_t *out);

/* /metrics (Prometheus text, malloc'd; NULL when out of memory) and /healthz (200 while its
 * heartbeats are acknowledged, else 503; *json malloc'd) of the worker's operator endpoint
 * (lt_worker_ops.c). On the worker's event loop. */
char *lt_worker_metrics(lt_worker_t *w);
int lt_worker_health(lt_worker_t *w, char **json);

/* The executor side, for `lathed --role executor` (lt_executor.c). Returns the exit status. */
int lt_executor_main(void);

#endif
