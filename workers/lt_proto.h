/* lt_proto: the worker <-> executor protocol, one JSON object per line (lt_worker.c spawns the
 * executor, lt_executor.c runs the attempt).
 *
 *   executor stdin   the assignment (the one message without a "type": it came first, and the
 *                    executor reads it before anything else), then one "committed" line per
 *                    checkpoint the worker recorded; the assignment names the descriptors the
 *                    executor inherited its inputs on (lt_xfer.h) and carries the tenant's data
 *                    key, the one secret an executor holds;
 *   executor stdout  "step" every optimizer step, "eval" at each evaluation, "checkpoint" once a
 *                    checkpoint is sealed into the sealed directory (by the sealing thread, so it
 *                    may follow later steps' lines; the worker then uploads it and answers
 *                    "committed"; "stopped" (preempt) and "done" come only after the commit of
 *                    their checkpoint); one of
 *                    "stopped", "done" or "error" (exit 1) ends the attempt;
 *   signals          SIGUSR1 or SIGTERM: stop at the next micro-step boundary (cancel);
 *                    SIGUSR2: checkpoint at the next step boundary, then stop (preempt).
 *
 * A training session (spec.mode interactive, docs/DESIGN.md §5) runs no loop of its own: the
 * worker writes one "call" line per call of the session, in sequence order, and the executor
 * answers each with one "result" line, in the same order. save_state and the end of the session
 * make checkpoints as above (their "result" or "done" follows the commit).
 *
 * Both sides build and read messages only through lt_proto_encode() and lt_proto_decode(), so the
 * field names live here and nowhere else. Customer text never crosses the protocol: ids, hashes
 * and metrics only, except a session's call and result bodies (token ids, weights, log-probs),
 * which the worker seals into the store and never logs. Reading is as lenient as the peers always were: a missing field reads as 0,
 * false or NULL, and a type this side does not know as LT_PROTO_UNKNOWN, which the reader ignores.
 *
 * Threads: no state; any thread. */
#ifndef LT_PROTO_H
#define LT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_ckpt.h"
#include "lt_err.h"
#include "lt_jobspec.h"
#include "lt_train.h"

typedef enum lt_proto_type {
  LT_PROTO_UNKNOWN = 0, /* a "type" this version does not know */
  LT_PROTO_ASSIGNMENT,  /* worker -> executor, the first line: what to run */
  LT_PROTO_COMMITTED,   /* worker -> executor: a checkpoint's commit is recorded */
  LT_PROTO_STEP,        /* executor -> worker: an optimizer step is done */
  LT_PROTO_EVAL,        /* executor -> worker: an evaluation is done */
  LT_PROTO_CHECKPOINT,  /* executor -> worker: a checkpoint is in staging, sealed */
  LT_PROTO_STOPPED,     /* executor -> worker, last: stopped on request */
  LT_PROTO_DONE,        /* executor -> worker, last: finished */
  LT_PROTO_ERROR,       /* executor -> worker, last: failed */
  LT_PROTO_CALL,        /* worker -> executor: a session's call to run */
  LT_PROTO_RESULT,      /* executor -> worker: how a session's call ended */
  LT_PROTO_READY,       /* executor -> worker: a session's state is loaded ("step": its step) */
  LT_PROTO__COUNT
} lt_proto_type_t;

typedef struct lt_proto_assignment {
  const char *job_id, *tenant_id;
  int32_t attempt;
  lt_jobspec_t spec;
  const char *model_dir;        /* the base model's directory (the executor's descriptor 6) */
  const char *work_dir;         /* the attempt's private directory on a memory file system: the
                                 * only place its plaintext files go */
  const char *sealed_dir;       /* a directory store on disk where it seals its checkpoints, for
                                 * the worker to upload */
  int threads;                  /* cpu backend threads */
  const char *backend;          /* "cpu" (NULL, absent) or "cuda": the worker's (lt_worker_devices) */
  int device;                   /* cuda: the GPU, the slot the worker gave the attempt (-1: none) */
  int train_fd;                 /* the training dataset's plaintext: a memory file (-1: a session) */
  int valid_fd;                 /* the validation dataset's, or -1: hold out a share */
  int resume_fd;                /* the state to resume from, or -1 */
  const char *key_id;           /* the tenant's data key (its id) ... */
  const char *key_hex;          /* ... and its bytes in hex: it seals the checkpoints */
  /* A gang across workers (world > 1; 0 or 1: alone): this executor is rank gang_rank and
   * inherited its connections to the other ranks, verified by its worker (lt_worker_gang.h), on
   * descriptors gang_fd0 .. gang_fd0 + gang_nfds - 1 (rank 0: one per other rank, in rank
   * order; the others: rank 0's). */
  int gang_rank, gang_world, gang_fd0, gang_nfds;
} lt_proto_assignment_t;

typedef struct lt_proto_committed {
  int64_t step;
} lt_proto_committed_t;

typedef struct lt_proto_stopped {
  lt_train_stop_t why; /* LT_TRAIN_STOP_CANCEL or LT_TRAIN_STOP_PREEMPT (anything but "cancel") */
  int64_t step;
} lt_proto_stopped_t;

typedef struct lt_proto_done {
  int64_t step;
  const char *config_digest;
} lt_proto_done_t;

typedef struct lt_proto_error {
  const char *reason; /* NULL when the executor gave none */
} lt_proto_error_t;

/* A session's call: its sequence number (its SessionCall's offset in lathe.calls), its kind
 * ("forward_backward", ... as the record's PrimitiveKind) and its body, the JSON the customer sent
 * (NULL for a call without one). */
typedef struct lt_proto_call {
  int64_t seq;
  const char *kind;
  const char *body;
} lt_proto_call_t;

/* How a call ended. ok false: error_code ("invalid": the session is unchanged; "internal"),
 * error_field (may be NULL) and error_reason say why. loss and grad_norm are NAN when the kind has
 * none (they are then left out of the line). body: the result's JSON, or NULL. */
typedef struct lt_proto_result {
  int64_t seq;
  const char *kind;
  bool ok;
  const char *error_code, *error_field, *error_reason;
  int64_t step;         /* optimizer steps of the session's state after the call */
  int64_t tokens;
  double loss, grad_norm;
  double duration_ms;
  const char *body;
} lt_proto_result_t;

/* One message. Strings are borrowed: from the caller for encoding; for a decoded message they
 * point into the parsed line, valid until lt_proto_msg_release(). */
typedef struct lt_proto_msg {
  lt_proto_type_t type;
  union {
    lt_proto_assignment_t assignment;
    lt_proto_committed_t committed; /* also LT_PROTO_READY's */
    lt_train_step_t step;     /* all fields but tokens_total are read back */
    lt_train_eval_t eval;
    lt_ckpt_done_t checkpoint; /* trigger NULL and keys NULL when absent; sha256_hex "" */
    lt_proto_stopped_t stopped;
    lt_proto_done_t done;
    lt_proto_error_t error;
    lt_proto_call_t call;
    lt_proto_result_t result;
  };
  void *doc_; /* private: what a decoded message's strings point into */
} lt_proto_msg_t;

/* The wire name of a type ("step"); "" for LT_PROTO_ASSIGNMENT and LT_PROTO_UNKNOWN. */
const char *lt_proto_type_name(lt_proto_type_t type);

/* Writes msg as one line, newline included, into *line (the caller frees it) and its length into
 * *len. LT_ERR_INVALID when a field cannot be written (a NULL string where one is required, a
 * number that is not finite): nothing is then to be sent. */
lt_err_t lt_proto_encode(const lt_proto_msg_t *msg, char **line, size_t *len);

/* Reads one line (with or without its newline) into *msg, which the caller releases whatever the
 * result. A line that is not JSON is LT_ERR_CORRUPT with the parser's message. LT_ERR_INVALID, with
 * a message that says why, for an assignment that lacks a field or whose spec does not validate
 * and for a checkpoint that names more than LT_CKPT_NAMES objects; other messages always read. */
lt_err_t lt_proto_decode(const char *line, lt_proto_msg_t *msg, char *errstr, size_t errstr_size);

/* Frees what a decoded message points into; the message is then empty. Harmless on an encoded or
 * empty message. */
void lt_proto_msg_release(lt_proto_msg_t *msg);

#endif
