/* lt_executor_int: what the executor's two files share (not public).
 *
 *   lt_executor.c          the process: confinement, the assignment, inputs, the sealing of
 *                          checkpoints, the protocol's channels, and a managed job's loop
 *   lt_executor_session.c  a training session: the worker's calls, run in order */
#ifndef LT_EXECUTOR_INT_H
#define LT_EXECUTOR_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_ckpt.h"
#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_proto.h"
#include "lt_store.h"

/* One attempt's resources, from the assignment to the exit; also the training hooks' context. */
typedef struct exec {
  const lt_proto_assignment_t *asg;
  lt_crypto_dek_t *dek;     /* the tenant's data key, from the assignment */
  lt_store_t *sealed;       /* the directory store the checkpoints are sealed into */
  char *train, *valid;      /* the datasets' plaintext: read-only maps of the input memory files */
  size_t train_len, valid_len;
  char train_sha[65];
  char resume_path[64];     /* the state to resume from (its memory file); "" for none */
  lt_ckpt_t *ckpt;          /* seals checkpoints off the training thread */
  int64_t awaited;          /* the step of the newest interval checkpoint handed to it (0: none) */
  int64_t submitted;        /* the step of the newest checkpoint handed to it (0: none) */
} exec_t;

/* Set by the signal handlers: SIGUSR1/SIGTERM (cancel), SIGUSR2 (preempt). */
extern volatile sig_atomic_t lt_exec_stop_cancel, lt_exec_stop_preempt;

/* Writes one protocol line on stdout, whole; with last, nothing is written after it. */
void lt_exec_emit_line(const lt_proto_msg_t *m, bool last);

/* Waits until the worker has recorded the commit of the checkpoint at step (0: none to wait
 * for). A cancel ends the wait when cancel_ends is set; an upload that failed, or a worker that is
 * gone, is an error. */
lt_err_t lt_exec_wait_committed(exec_t *x, int64_t step, bool cancel_ends, char *errstr, size_t n);

/* A session's call as the worker sent it. */
typedef struct lt_exec_call {
  lt_proto_msg_t msg; /* LT_PROTO_CALL */
  struct lt_exec_call *next;
} lt_exec_call_t;

/* The next call, waiting for one; NULL when a stop was asked (lt_exec_stop_*), calls still queued
 * or not, or stdin ended (*gone). Free it with lt_exec_call_free. */
lt_exec_call_t *lt_exec_next_call(bool *gone);
void lt_exec_call_free(lt_exec_call_t *c);

/* Serves a training session (spec.mode interactive) until it ends, is stopped or fails; reports
 * how it ended as train_and_report does for a managed job. */
lt_err_t lt_exec_session(exec_t *x, char *errstr, size_t n);

#endif
