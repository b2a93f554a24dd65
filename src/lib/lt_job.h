/* lt_job: the job state machine of docs/DESIGN.md §5 as a pure fold over log records.
 *
 * A job's state is a function of its records in lathe.jobs and lathe.control (invariant 1).
 * lt_job_apply() is that function's step: no I/O, no clock, no allocation beyond the job table
 * growing. The API's projections, the scheduler, the publisher, the worker and `lathe admin
 * replay` all fold with this code, so they cannot disagree about a job.
 *
 * Records arrive as lt_job_event_t, a flat view that the caller fills from a decoded Avro
 * record (lt_job_event_from_record in lt_job_record.c) or directly in tests.
 *
 * Rules the fold enforces (each has a test that tries to break it):
 *  - attempt fencing (invariant 2): a record of an attempt older than the job's current one is
 *    ignored; a dispatch with a number not above the current one is ignored;
 *  - first terminal record wins (invariant 3); a cancel recorded before the completion makes the
 *    job CANCELLED, and a completion after it does not publish;
 *  - idempotence: applying the same record twice leaves the same state (duplicate delivery).
 *
 * Thread safety: an lt_job_table_t is used by one thread at a time. */
#ifndef LT_JOB_H
#define LT_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

typedef enum lt_job_state {
  LT_JOB_SUBMITTED = 0, /* in lathe.jobs, not yet validated */
  LT_JOB_QUEUED,        /* accepted, waiting for a slot (also after preemption or a lost attempt) */
  LT_JOB_DISPATCHED,    /* given to a worker under an attempt number, not started yet */
  LT_JOB_RUNNING,       /* the attempt started on a worker */
  LT_JOB_PREEMPTING,    /* asked to checkpoint and stop; returns to QUEUED on AttemptStopped */
  LT_JOB_COMPLETED,     /* terminal */
  LT_JOB_FAILED,        /* terminal */
  LT_JOB_CANCELLED,     /* terminal */
  LT_JOB_REJECTED,      /* terminal: failed validation, never queued */
  LT_JOB__STATE_COUNT
} lt_job_state_t;

/* Priority classes, highest first; the scheduling policy (lt_sched) orders work by them. */
typedef enum lt_job_class {
  LT_CLASS_PRODUCTION = 0, /* reserved share, never preempted */
  LT_CLASS_STANDARD,
  LT_CLASS_PREEMPTIBLE,    /* checkpointed then preempted when higher classes wait */
  LT_CLASS__COUNT
} lt_job_class_t;

typedef enum lt_job_event_type {
  LT_EV_JOB_SUBMITTED = 0,
  LT_EV_JOB_ACCEPTED,
  LT_EV_JOB_REJECTED,
  LT_EV_JOB_DISPATCHED,
  LT_EV_ATTEMPT_STARTED,
  LT_EV_CANCEL_REQUESTED,
  LT_EV_PREEMPT_REQUESTED,
  LT_EV_CHECKPOINT_COMMITTED,
  LT_EV_ATTEMPT_STOPPED,
  LT_EV_JOB_COMPLETED,
  LT_EV_JOB_FAILED,
  LT_EV_JOB_CANCELLED,
  LT_EV_CLEANUP_DONE,
  LT_EV_SESSION_IDLE,  /* a session's worker parks it: its attempt stops, no slot until woken */
  LT_EV_SESSION_WOKEN, /* a call came for a parked session */
  LT_EV__COUNT
} lt_job_event_type_t;

/* Why an attempt stopped (AttemptStopped.reason). */
typedef enum lt_job_stop_reason {
  LT_STOP_CANCEL = 0, /* cancel requested: the job will be CANCELLED */
  LT_STOP_PREEMPT,    /* preempted after a checkpoint: back to the queue */
  LT_STOP_LOST,       /* lease expired or worker lost: back to the queue, counts as a failure */
  LT_STOP_FAILED,     /* the executor failed (error, watchdog): counts as a failure */
  LT_STOP_UNAVAILABLE, /* the object store could not be reached for the attempt's inputs (its
                        * executor never ran) or a job's checkpoint (redone from the last commit):
                        * back to the queue, not a failure (AttemptStopped v2) */
  LT_STOP__COUNT
} lt_job_stop_reason_t;

#define LT_ID_MAX 63                  /* longest id: job, tenant, dataset, worker, model (no '/') */
#define LT_JOB_NAME_MAX 128  /* base model names */
#define LT_JOB_REASON_MAX 256
#define LT_JOB_KEY_MAX 512   /* object keys of a checkpoint */

/* One record, flattened. Strings are borrowed for the duration of lt_job_apply(); fields a
 * record type does not have are ignored. */
typedef struct lt_job_event {
  lt_job_event_type_t type;
  const char *event_id;
  int64_t occurred_at_ms;
  const char *job_id;
  const char *tenant_id;
  int32_t attempt;           /* attempt-scoped records */
  /* JobSubmitted */
  lt_job_class_t job_class;
  const char *base_model;
  const char *dataset_id;
  int32_t gpus;
  int64_t max_duration_s;
  /* JobDispatched, AttemptStarted */
  const char *worker_id;
  int64_t lease_ms;
  /* CheckpointCommitted; SessionIdle, SessionWoken: the call's sequence number */
  int64_t step;
  const char *object_key;    /* the checkpoint's first object (its state file) */
  const char *sha256_hex;
  int64_t bytes;
  bool final_checkpoint;
  /* AttemptStopped */
  lt_job_stop_reason_t stop_reason;
  /* JobRejected, JobFailed, AttemptStopped: what the user sees */
  const char *reason;
} lt_job_event_t;

/* The folded state of one job. Read-only for callers. */
typedef struct lt_job {
  char job_id[LT_ID_MAX + 1];
  char tenant_id[LT_ID_MAX + 1];
  char base_model[LT_JOB_NAME_MAX];
  char dataset_id[LT_ID_MAX + 1];
  lt_job_class_t job_class;
  int32_t gpus;
  int64_t max_duration_s;
  lt_job_state_t state;
  int32_t attempt;            /* current attempt number; 0 before the first dispatch */
  bool attempt_stopped;       /* the current attempt confirmed its stop */
  int32_t failed_attempts;    /* attempts lost or failed */
  int32_t unavailable_stops;  /* attempts stopped unavailable: the store away (inputs or a checkpoint) */
  bool last_stop_failed;      /* the newest stopped attempt that ran was lost or failed (not preempted) */
  bool parked;                /* a session that went idle: QUEUED, but not to be dispatched until woken */
  int64_t parked_seq;         /* the last call it ran before it went idle */
  bool cancel_requested;
  bool cleanup_done;
  char worker_id[LT_ID_MAX + 1];
  int64_t submitted_at_ms;
  int64_t queued_at_ms;       /* last time it entered QUEUED */
  int64_t started_at_ms;      /* last AttemptStarted */
  int64_t lease_ms;
  int64_t ended_at_ms;        /* terminal record's time */
  /* newest checkpoint committed by a live attempt: a new attempt resumes from it */
  int32_t ckpt_attempt;
  int64_t ckpt_step;
  int64_t ckpt_bytes;
  bool ckpt_final;
  char ckpt_key[LT_JOB_KEY_MAX];
  char ckpt_sha256[65];
  char reason[LT_JOB_REASON_MAX]; /* rejection or failure reason, or why it was cancelled */
  uint64_t records;           /* records applied that changed this job */
} lt_job_t;

typedef struct lt_job_table lt_job_table_t;

/* What lt_job_apply did with a record. */
typedef enum lt_job_outcome {
  LT_JOB_APPLIED = 0,  /* the state changed */
  LT_JOB_IGNORED,      /* a duplicate, a stale attempt or a record after the terminal one */
  LT_JOB_UNKNOWN_JOB,  /* a control record for a job never submitted */
} lt_job_outcome_t;

lt_err_t lt_job_table_new(lt_job_table_t **out);
void lt_job_table_destroy(lt_job_table_t *t);

/* A JobSubmitted for a job already in the table, of its tenant: its fields replace those the job
 * was created with (model, dataset, class, GPUs, duration, submitted_at); the state and the rest
 * stay. For a projection that created the job from its own submission before reading the log
 * (lt_proj_apply_early) and then reads an earlier JobSubmitted of the same id: the log's first
 * one is the job, as a fold in log order has it. False when there is no such job. */
bool lt_job_reseed(lt_job_table_t *t, const lt_job_event_t *ev);

/* Folds one record into the table. Returns LT_ERR_INVALID (with a message naming the field)
 * for a record that cannot be applied at all (missing job id, id too long); *outcome says
 * whether it changed anything. outcome may be NULL. */
lt_err_t lt_job_apply(lt_job_table_t *t, const lt_job_event_t *ev, lt_job_outcome_t *outcome,
                      char *errstr, size_t errstr_size);

/* The job, or NULL. The pointer stays valid until the next lt_job_apply. */
const lt_job_t *lt_job_get(const lt_job_table_t *t, const char *job_id);

size_t lt_job_count(const lt_job_table_t *t);

/* Calls fn for every job in job-id order (stable across replays); stops if fn returns false. */
void lt_job_foreach(const lt_job_table_t *t, bool (*fn)(const lt_job_t *job, void *ctx), void *ctx);

/* Calls fn for every job in table order (no sorting, no allocation): for counts and scans whose
 * result does not depend on order. Stops if fn returns false. */
void lt_job_scan(const lt_job_table_t *t, bool (*fn)(const lt_job_t *job, void *ctx), void *ctx);

/* The job's state as the digest hashes it: one line of '|'-separated fields, ending in a newline
 * (snprintf's return: the length it needed). For an operator comparing two processes' states job
 * by job (GET /debug/jobs on the api's operator port, `lathe admin replay --jobs`). */
int lt_job_line(const lt_job_t *j, char *line, size_t n);

/* SHA-256 over every job's state in job-id order, as 64 hex digits and a NUL. Replaying the same
 * records gives the same digest, byte for byte (invariant 1). */
lt_err_t lt_job_digest(const lt_job_table_t *t, char out_hex[65]);

bool lt_job_state_is_terminal(lt_job_state_t s);
const char *lt_job_state_name(lt_job_state_t s);        /* "queued" */
const char *lt_job_class_name(lt_job_class_t c);        /* "production" */
const char *lt_job_event_type_name(lt_job_event_type_t t); /* "JobSubmitted" */
const char *lt_job_stop_reason_name(lt_job_stop_reason_t r);
/* Parses a name as lt_job_class_name writes it; LT_ERR_INVALID otherwise. */
lt_err_t lt_job_class_parse(const char *name, lt_job_class_t *out);
lt_err_t lt_job_stop_reason_parse(const char *name, lt_job_stop_reason_t *out);
/* Maps a record type name ("JobSubmitted") to its event type; LT_ERR_NOT_FOUND otherwise. */
lt_err_t lt_job_event_type_parse(const char *name, lt_job_event_type_t *out);

#endif
