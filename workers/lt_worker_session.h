/* lt_worker_session: the worker's side of a training session's attempt (docs/DESIGN.md §5).
 *
 * A session's calls reach its worker by reference: the API seals each call's body under the
 * tenant's data key into the store and records a SessionCall (ids, kind, key, hash, size) in
 * lathe.calls, on the session's partition (lt_calls_partition); the record's offset is the call's
 * sequence number. This module, one per session attempt, runs two threads:
 *
 *  - the inbound thread reads the session's partition from the session's start, skips the calls
 *    the resumed state already holds (sequence <= its checkpoint's) but an end (its final
 *    checkpoint may be the one resumed from, the completion lost), fetches and opens each call's
 *    body and writes it to the executor as a "call" line (lt_proto.h). For load_state it also
 *    fetches the named state (a checkpoint of this session only) into the attempt's private
 *    directory. When the attempt replaces one that was lost, every call recorded before this
 *    attempt began is failed instead, with session_restarted and the step the state resumed from:
 *    the lost attempt may have run some of them on a state that is gone — except an end, which
 *    ends the session from the state this attempt resumed.
 *  - the outbound thread takes the executor's "result" lines in order, seals each result body
 *    into the store (sessions/<tenant>/<job>/results/<seq>), records PrimitiveCompleted in
 *    lathe.progress with acks=all, then deletes the call's body (read once; no attempt reads it
 *    again), leaving a keyed call's digest (lt_call_body_digest) for the API's retries.
 *
 * The executor's stdin is shared with the event loop's "committed" lines: every line goes through
 * lt_wsess_write, whole.
 *
 * Threads: lt_wsess_start/_ready/_result/_fence/_busy/_destroy from the worker's loop thread;
 * lt_wsess_write from any. */
#ifndef LT_WORKER_SESSION_H
#define LT_WORKER_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_err.h"
#include "lt_proto.h"
#include "lt_store.h"

typedef struct lt_wsess lt_wsess_t;

typedef struct lt_wsess_conf {
  const lt_bus_conf_t *bus;           /* borrowed: the inbound thread's consumer */
  lt_bus_producer_t *producer;        /* borrowed (thread-safe): PrimitiveCompleted */
  lt_store_t *store;                  /* borrowed (thread-safe) */
  const lt_avro_registry_t *registry; /* borrowed */
  const char *producer_id;            /* "worker/<id>" */
  const char *t_calls, *t_progress, *t_control; /* full topic names (borrowed) */
  const char *tenant_id, *job_id;
  int32_t attempt;
  const uint8_t *key;                 /* the tenant's data key (LT_CRYPTO_KEY_BYTES) and its id */
  const char *key_id;
  int64_t since_ms;                   /* when the session was submitted: no call is older */
  int64_t resume_seq;                 /* the checkpoint resumed from (its call's sequence), 0: none */
  int32_t resume_attempt;             /* the attempt that saved it */
  bool restarted;                     /* an earlier attempt ran and was lost or failed */
  const char *mem_dir;                /* the attempt's private directory (load_state files) */
  int64_t uid, gid;                   /* the executor's, for those files (uid <= 0: unchanged) */
  int exec_fd;                        /* the executor's stdin (borrowed) */
} lt_wsess_conf_t;

lt_err_t lt_wsess_start(const lt_wsess_conf_t *conf, lt_wsess_t **out, char *errstr, size_t errstr_size);

/* Writes one line to the executor's stdin, whole (waits while the pipe is full). False when the
 * executor is gone. */
bool lt_wsess_write(lt_wsess_t *s, const char *line, size_t len);

/* The executor loaded its state: its optimizer step (what session_restarted failures name). */
void lt_wsess_ready(lt_wsess_t *s, int64_t step);

/* One result line of the executor, to seal, store and record (copied). */
void lt_wsess_result(lt_wsess_t *s, const lt_proto_result_t *r);

/* The attempt is no longer the session's live one: record nothing more. */
void lt_wsess_fence(lt_wsess_t *s);

/* True while a call of the session was read and is not answered yet: the watchdog applies only
 * then (an idle session makes no progress lines, and need not). */
bool lt_wsess_busy(lt_wsess_t *s);

/* True when no call came or was answered for idle_ms (> 0) and none is pending: the session may be
 * parked (SessionIdle, then a preemption: its state saved, its slot freed). *last_seq gets the
 * newest call answered. */
bool lt_wsess_idle(lt_wsess_t *s, int64_t now_ms, int64_t idle_ms, int64_t *last_seq);

/* Records SessionIdle (the session parks after call seq) with acks=all; the caller then preempts
 * the attempt, which saves the state and stops. Loop thread. */
lt_err_t lt_wsess_park(lt_wsess_t *s, int64_t seq, char *errstr, size_t errstr_size);

/* Stops both threads (what is queued is dropped) and frees. NULL is fine. */
void lt_wsess_destroy(lt_wsess_t *s);

#endif
