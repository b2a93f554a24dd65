/* lt_worker: the worker role — dispatch, executors, leases, progress, cancel (see lt_worker.h). */
#include "lt_worker.h"
#include "lt_models.h"

#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "lt_confine.h"
#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_proto.h"
#include "lt_scrub.h"
#include "lt_proj.h"
#include "lt_time.h"
#include "lt_worker_int.h"
#include "lt_xfer.h"

#define LINE_MAX_BYTES ((size_t)256 << 20) /* the longest executor line read */

enum { R_STARTED, R_CKPT, R_STOPPED, R_COMPLETED, R_CANCELLED, R_CLEANUP, R_STEP, R_EVAL, R_HB, R__N };
static const char *const rec_types[R__N] = {"AttemptStarted", "CheckpointCommitted", "AttemptStopped", "JobCompleted",
                                            "JobCancelled", "CleanupDone", "StepCompleted", "EvalCompleted",
                                            "WorkerHeartbeat"};

/* A line of this worker's, about attempt a (NULL: none): its ids go in fields of their own. */
static void logf_(const attempt_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(const attempt_t *a, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lt_log(LT_LOG_INFO, "worker", a ? &(lt_log_ids_t){.job = a->job_id, .tenant = a->tenant_id, .attempt = a->attempt}
                                  : NULL, "%s", msg);
}

/* ---------------------------------------------------------------- producing */
/* A record being built. Every set is checked and the first failure sticks: a set fails only when
 * this file and the schema disagree (a path, a type, a symbol), which is a bug, so the record is
 * logged with lt_avro_record_error() and never sent rather than sent with a field missing. */
typedef struct {
  lt_avro_record_t *r;
  lt_err_t err;
  bool mute; /* a gang's rank > 0: rank 0 alone speaks for the attempt, so nothing is sent */
} rec_t;

/* Sets a field of b unless an earlier set failed: PUT(&b, lt_avro_set_long, "step", v). */
#define PUT(b, setter, ...) ((b)->err ? (void)0 : (void)((b)->err = setter((b)->r, __VA_ARGS__)))

/* Appends an element to the array of records at path and returns its index. */
static size_t put_elem(rec_t *b, const char *path) {
  size_t idx = 0;
  if (!b->err) b->err = lt_avro_array_append(b->r, path, &idx);
  return idx;
}

/* The path of a field of an array's element ("leases[2].job_id"), in buf. */
static const char *elem(char buf[64], const char *array, size_t idx, const char *field) {
  snprintf(buf, 64, "%s[%zu].%s", array, idx, field);
  return buf;
}

/* A fresh record of rec_types[which], stamped; with the attempt's ids when a is not NULL. */
static rec_t fresh(lt_worker_t *w, int which, const attempt_t *a) {
  rec_t b = {.r = w->rec[which]};
  lt_avro_record_clear(b.r);
  b.err = lt_avro_record_stamp(b.r, w->producer_id);
  if (a) {
    b.mute = a->gang_rank > 0;
    PUT(&b, lt_avro_set_string, "job_id", a->job_id);
    PUT(&b, lt_avro_set_string, "tenant_id", a->tenant_id);
    PUT(&b, lt_avro_set_int, "attempt", a->attempt);
  }
  return b;
}

/* The bus record of b, keyed by key; false (logged) when b failed a set or does not encode. */
static bool to_bus(lt_worker_t *w, const rec_t *b, const char *topic, const char *key, lt_bus_record_t *out) {
  const uint8_t *bytes;
  size_t len;
  char err[512];
  if (b->err) {
    logf_(NULL, "%s for %s not built (a bug): %s", lt_avro_record_type(b->r), key, lt_avro_record_error(b->r));
    return false;
  }
  if (lt_avro_record_encode(b->r, &bytes, &len, err, sizeof err)) {
    logf_(NULL, "cannot encode %s: %s", lt_avro_record_type(b->r), err);
    return false;
  }
  *out = (lt_bus_record_t){.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = key, .key_size = strlen(key),
                           .value = bytes, .value_size = len};
  return true;
}

/* Produces with acks=all and waits; retries a bounded time while the broker is unavailable. */
static lt_err_t send_sync(lt_worker_t *w, const char *topic, const char *key, const rec_t *b) {
  if (b->mute) return LT_OK;
  lt_bus_record_t rec;
  if (!to_bus(w, b, topic, key, &rec)) return LT_ERR_INTERNAL;
  char err[512];
  lt_err_t e = LT_OK;
  /* Bounded well below a lease (two tries of 3 s): the event loop must keep checking leases and
   * kill deadlines while the broker is away. */
  for (int tries = 0; tries < 2; tries++) {
    e = lt_bus_produce_sync(w->producer, &rec, 3000, NULL, NULL, err, sizeof err);
    if (!e) return LT_OK; /* folded when the control consumer reads it back, in log order */
    if (e == LT_ERR_FATAL || e == LT_ERR_FENCED) break;
    usleep(200000);
  }
  logf_(NULL, "%s for %s was not recorded: %s", lt_avro_record_type(b->r), key, err);
  return e;
}

static void send_async(lt_worker_t *w, const char *topic, const char *key, const rec_t *b, void *opaque) {
  lt_bus_record_t rec;
  char err[512];
  if (!b->mute && to_bus(w, b, topic, key, &rec) && lt_bus_produce(w->producer, &rec, opaque, err, sizeof err))
    logf_(NULL, "%s for %s not queued: %s", lt_avro_record_type(b->r), key, err);
}

/* Delivery reports (producer thread): a delivered heartbeat renews this worker's leases. */
static void on_delivery(void *opaque, const lt_bus_delivery_t *d) {
  lt_worker_t *w = opaque;
  if (d->msg_opaque == (void *)w && d->err == LT_OK) {
    __atomic_store_n(&w->hb_ok_ms, lt_time_wall_ms(), __ATOMIC_RELEASE);
  }
}

/* ---------------------------------------------------------------- attempts */
static attempt_t *find_attempt(lt_worker_t *w, const char *job_id) {
  for (int i = 0; i < w->conf.slots; i++)
    if (w->slots[i].state != A_FREE && strcmp(w->slots[i].job_id, job_id) == 0) return &w->slots[i];
  return NULL;
}

static int free_slots(lt_worker_t *w) {
  int n = 0;
  for (int i = 0; i < w->conf.slots; i++) n += w->slots[i].state == A_FREE;
  return n;
}

/* Is this attempt still the job's live one (per the fold of lathe.control)? */
static bool live(lt_worker_t *w, const attempt_t *a) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), a->job_id);
  return j && j->attempt == a->attempt && !lt_job_state_is_terminal(j->state) && !a->fenced;
}

/* A gang's attempt another rank already stopped (a rank whose store stayed away: unavailable; a
 * later rank's stop is the one record it writes). */
static bool peer_stopped(lt_worker_t *w, const attempt_t *a) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), a->job_id);
  return j && j->attempt == a->attempt && j->attempt_stopped;
}

static void stop_attempt(lt_worker_t *w, attempt_t *a, int sig) {
  if (a->state != A_RUNNING || a->stop_signal) return;
  a->stop_signal = sig;
  a->stop_sent_ms = lt_time_wall_ms();
  if (a->pid > 0) kill(a->pid, sig);
  else lt_xfer_abort(a->xfer); /* still fetching its inputs: it will not start */
  logf_(a, "asked %s attempt %d to stop (%s)", a->job_id, a->attempt, sig == SIGUSR2 ? "preempt" : "cancel");
}

static void kill_attempt(lt_worker_t *w, attempt_t *a, const char *why) {
  if (a->state != A_RUNNING || a->killed) return;
  a->killed = true;
  logf_(a, "killed %s attempt %d: %s", a->job_id, a->attempt, why); /* said first, then done */
  if (a->pid > 0) kill(a->pid, SIGKILL);
  else lt_xfer_abort(a->xfer); /* still fetching its inputs: it will not start */
}

/* Scrubs an attempt's private directory (lt_scrub: every file in every subdirectory overwritten,
 * synced and removed); the bytes zeroed go into CleanupDone. A failure is logged: what could be
 * removed is gone, and what could not is named. */
static int64_t scrub_dir(lt_worker_t *w, const char *dir) {
  int64_t zeroed = 0;
  char err[512];
  if (dir[0] && lt_scrub_tree(dir, &zeroed, err, sizeof err)) logf_(NULL, "%s", err);
  return zeroed;
}

/* Deletes the staging objects of a job (all attempts): a cancelled job leaves nothing behind. A
 * failure leaves the rest to the publisher's GC. */
static int delete_staging(lt_worker_t *w, const char *tenant, const char *job) {
  char prefix[512];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/", tenant, job);
  uint64_t deleted = 0;
  lt_store_delete_prefix(w->conf.store, prefix, &deleted, NULL, 0);
  return (int)deleted;
}

/* AttemptStopped for the attempt; false when it is fenced or not the live one (nothing written). */
static bool record_stopped(lt_worker_t *w, attempt_t *a, const char *reason, const char *detail) {
  if (a->fenced || !live(w, a)) return false;
  rec_t b = fresh(w, R_STOPPED, a);
  if (!strcmp(reason, "unavailable")) b.mute = false; /* a gang's later rank too: its peers wait for it */
  PUT(&b, lt_avro_set_enum, "reason", reason);
  PUT(&b, lt_avro_set_long, "step", a->step);
  PUT(&b, lt_avro_set_bool, "killed", a->killed);
  if (detail) PUT(&b, lt_avro_set_string, "detail", detail);
  else PUT(&b, lt_avro_set_null, "detail");
  return send_sync(w, w->t_control, a->job_id, &b) == LT_OK;
}

static void record_cancelled(lt_worker_t *w, attempt_t *a) {
  rec_t b = fresh(w, R_CANCELLED, a);
  PUT(&b, lt_avro_set_string, "cancel_event_id", "");
  PUT(&b, lt_avro_set_string, "requested_by", "customer");
  send_sync(w, w->t_control, a->job_id, &b);
}

/* Frees a slot: its pipes closed, everything else zero. */
static void slot_reset(attempt_t *a) {
  if (a->out_fd >= 0) close(a->out_fd);
  if (a->in_fd >= 0) close(a->in_fd);
  for (int i = 0; i < 2; i++)
    if (a->notify[i] >= 0) close(a->notify[i]);
  if (a->line) OPENSSL_cleanse(a->line, a->line_cap); /* a session's results passed through it */
  free(a->line);
  memset(a, 0, sizeof *a);
  a->out_fd = a->in_fd = a->notify[0] = a->notify[1] = -1;
  lt_xfer_inputs_init(&a->in);
}

/* Everything of the attempt on this host: its threads stopped (a fetch or an upload in flight is
 * abandoned), its input memory files and both directories zeroed and removed. Returns the bytes
 * zeroed (CleanupDone's host_bytes_zeroed). */
static int64_t scrub_attempt(lt_worker_t *w, attempt_t *a) {
  lt_wsess_destroy(a->sess);
  a->sess = NULL;
  lt_wgang_abandon(a->gang);
  a->gang = NULL;
  for (int i = 0; i < a->gang_nfds; i++) close(a->gang_fds[i]);
  a->gang_nfds = 0;
  lt_xfer_destroy(a->xfer);
  a->xfer = NULL;
  lt_ckpt_destroy(a->up);
  a->up = NULL;
  lt_store_destroy(a->sealed);
  a->sealed = NULL;
  if (a->notify_ev) event_free(a->notify_ev);
  a->notify_ev = NULL;
  int64_t zeroed = lt_xfer_inputs_scrub(&a->in);
  zeroed += scrub_dir(w, a->work_dir);
  return zeroed + scrub_dir(w, a->mem_dir);
}

/* The executor is gone (or never started): records how the attempt ended if it did not say so
 * itself, scrubs its directory, deletes a cancelled job's staging objects, frees the slot. */
static void finish_attempt(lt_worker_t *w, attempt_t *a, int status) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), a->job_id);
  bool cancelled = j && (j->cancel_requested || j->state == LT_JOB_CANCELLED);
  if (!a->reported) {
    char detail[560];
    if (a->fail_detail[0])
      snprintf(detail, sizeof detail, "%s", a->fail_detail);
    else if (a->killed && a->stop_signal)
      snprintf(detail, sizeof detail, "killed after the %d ms kill deadline", w->conf.kill_deadline_ms);
    else if (a->pid <= 0)
      snprintf(detail, sizeof detail, "stopped before its executor started");
    else if (WIFSIGNALED(status))
      snprintf(detail, sizeof detail, "the executor died of signal %d", WTERMSIG(status));
    else
      snprintf(detail, sizeof detail, "the executor exited with status %d without reporting", WEXITSTATUS(status));
    /* a session killed before its preemption's checkpoint lost the state its calls ran on: failed,
     * so that its next attempt fails them with session_restarted */
    bool lost_state = a->killed && a->sess;
    const char *why = cancelled                                  ? "cancel"
                      : a->stop_signal == SIGUSR2 && !lost_state ? "preempt"
                      : a->store_away                            ? "unavailable"
                                                                 : "failed";
    if (record_stopped(w, a, why, detail) && !strcmp(why, "unavailable"))
      a->reported = true, a->outcome = LT_WORKER_END_UNAVAILABLE;
    if (cancelled && !a->fenced && j && !lt_job_state_is_terminal(j->state)) record_cancelled(w, a);
  }
  int64_t zeroed = scrub_attempt(w, a);
  int deleted = cancelled && a->gang_rank == 0 ? delete_staging(w, a->tenant_id, a->job_id) : 0;
  rec_t b = fresh(w, R_CLEANUP, a);
  PUT(&b, lt_avro_set_string, "worker_id", w->conf.worker_id);
  PUT(&b, lt_avro_set_int, "staging_objects_deleted", deleted);
  PUT(&b, lt_avro_set_long, "host_bytes_zeroed", zeroed);
  PUT(&b, lt_avro_set_long, "device_bytes_zeroed", 0);
  send_sync(w, w->t_control, a->job_id, &b);
  if (a->ev) event_free(a->ev);
  logf_(a, "attempt %d of %s ended", a->attempt, a->job_id);
  w->st.ended[a->reported ? a->outcome : LT_WORKER_END_LOST]++;
  slot_reset(a);
}

/* ---------------------------------------------------------------- what executors report */
static void on_step_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  const lt_train_step_t *st = &m->step;
  a->step = st->step;
  rec_t b = fresh(w, R_STEP, a);
  PUT(&b, lt_avro_set_long, "step", st->step);
  PUT(&b, lt_avro_set_long, "total_steps", st->total_steps);
  PUT(&b, lt_avro_set_double, "loss", st->loss);
  PUT(&b, lt_avro_set_double, "learning_rate", st->learning_rate);
  PUT(&b, lt_avro_set_long, "tokens", st->tokens);
  PUT(&b, lt_avro_set_double, "tokens_per_s", st->tokens_per_s);
  PUT(&b, lt_avro_set_long, "elapsed_ms", st->elapsed_ms);
  PUT(&b, lt_avro_set_long, "eta_ms", st->eta_ms);
  PUT(&b, lt_avro_set_double, "epoch", st->epoch);
  PUT(&b, lt_avro_set_double, "grad_norm", st->grad_norm);
  send_async(w, w->t_progress, a->job_id, &b, NULL);
}

static void on_eval_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  const lt_train_eval_t *e = &m->eval;
  const struct {
    const char *name;
    double value, base_value;
  } metrics[] = {{"val_loss", e->val_loss, e->base_val_loss},
                 {"perplexity", e->perplexity, e->base_perplexity},
                 {"token_accuracy", e->token_accuracy, e->base_token_accuracy},
                 {"exact_match", e->exact_match, e->base_exact_match}};
  enum { EXACT_MATCH = 3 };
  rec_t b = fresh(w, R_EVAL, a);
  PUT(&b, lt_avro_set_long, "step", e->step);
  PUT(&b, lt_avro_set_bool, "final", e->final);
  PUT(&b, lt_avro_set_long, "examples", e->examples);
  for (size_t i = 0; i < sizeof metrics / sizeof *metrics; i++) {
    if (i == EXACT_MATCH && metrics[i].value < 0) continue; /* not measured */
    char path[64];
    size_t idx = put_elem(&b, "metrics");
    PUT(&b, lt_avro_set_string, elem(path, "metrics", idx, "name"), metrics[i].name);
    PUT(&b, lt_avro_set_double, elem(path, "metrics", idx, "value"), metrics[i].value);
    PUT(&b, lt_avro_set_double, elem(path, "metrics", idx, "base_value"), metrics[i].base_value);
    if (i == EXACT_MATCH) {
      PUT(&b, lt_avro_set_double, elem(path, "metrics", idx, "ci_low"), e->em_ci_low);
      PUT(&b, lt_avro_set_double, elem(path, "metrics", idx, "ci_high"), e->em_ci_high);
    }
  }
  PUT(&b, lt_avro_set_string, "config_digest", e->config_digest);
  send_async(w, w->t_progress, a->job_id, &b, NULL);
}

/* The checkpoint is in staging: commit it, then tell the executor, which holds back its next
 * optimizer update until then (lt_executor.c): a crash then loses at most one interval. */
static void commit_checkpoint(lt_worker_t *w, attempt_t *a, const lt_ckpt_done_t *d) {
  rec_t b = fresh(w, R_CKPT, a);
  PUT(&b, lt_avro_set_long, "step", d->step);
  for (size_t i = 0; i < LT_CKPT_NAMES && d->keys[i]; i++)
    PUT(&b, lt_avro_array_append_string, "object_keys", d->keys[i]);
  PUT(&b, lt_avro_set_string, "sha256", d->sha256_hex);
  PUT(&b, lt_avro_set_long, "bytes", (int64_t)d->bytes);
  PUT(&b, lt_avro_set_bool, "final", d->final);
  /* The executor says what made the checkpoint: it seals in the background, so a line that
   * arrives after a preemption signal may still be an interval checkpoint. */
  PUT(&b, lt_avro_set_string, "trigger", d->trigger ? d->trigger : d->final ? "final" : "interval");
  const char *eid = NULL;
  lt_avro_get_string(b.r, "event_id", &eid, NULL);
  if (d->final && eid) {
    snprintf(a->final_ckpt_event, sizeof a->final_ckpt_event, "%s", eid);
    snprintf(a->final_ckpt_sha, sizeof a->final_ckpt_sha, "%s", d->sha256_hex);
  }
  if (send_sync(w, w->t_control, a->job_id, &b)) {
    kill_attempt(w, a, "its checkpoint could not be recorded");
    return;
  }
  w->st.checkpoints++, w->st.uploaded_bytes += d->bytes;
  char *ack = NULL;
  size_t len = 0;
  lt_proto_msg_t committed = {.type = LT_PROTO_COMMITTED, .committed.step = d->step};
  if (a->in_fd < 0 || lt_proto_encode(&committed, &ack, &len) ||
      !(a->sess ? lt_wsess_write(a->sess, ack, len) : write(a->in_fd, ack, len) == (ssize_t)len))
    kill_attempt(w, a, "the executor cannot be told of its commit");
  free(ack);
}

/* Ends the attempt for a reason of the worker's own (recorded as AttemptStopped's detail). */
static void fail_attempt(lt_worker_t *w, attempt_t *a, const char *why) {
  if (!a->fail_detail[0]) snprintf(a->fail_detail, sizeof a->fail_detail, "%s", why);
  kill_attempt(w, a, why);
}

/* The executor sealed a checkpoint into its directory: upload it (a thread; on_notify hears of
 * the end). It may name only its own attempt's keys — prefix<step>/<name>, in lt_ckpt_names order
 * — and only one checkpoint at a time, since it waits for each commit. */
static void on_checkpoint_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  const lt_ckpt_done_t *d = &m->checkpoint;
  char want[LT_STORE_KEY_MAX + 1], err[512];
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    snprintf(want, sizeof want, "staging/%s/%s/%d/%lld/%s", a->tenant_id, a->job_id, a->attempt,
             (long long)d->step, lt_ckpt_names[i]);
    if (d->step <= 0 || !d->keys[i] || strcmp(d->keys[i], want) != 0) {
      fail_attempt(w, a, "the executor named a checkpoint object outside its attempt");
      return;
    }
  }
  if (!a->up || a->uploading) {
    fail_attempt(w, a, "the executor sealed a checkpoint before the previous one was committed");
    return;
  }
  if (lt_ckpt_submit(a->up, "", d->step, d->final, d->trigger, err, sizeof err)) fail_attempt(w, a, err);
  else a->uploading = true;
}

/* The upload thread (its on_done): what it stored, for on_notify to commit. */
static void on_uploaded(void *ctx, const lt_ckpt_done_t *d) {
  attempt_t *a = ctx;
  a->uploaded = *d;
}

/* The fetch and upload threads' last act: a byte on the attempt's notify pipe. */
static void notify_loop(attempt_t *a, char what) {
  while (write(a->notify[1], &what, 1) < 0 && errno == EINTR) {
  }
}

static void on_upload_end(void *ctx) { notify_loop(ctx, 'u'); }

static void on_done_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  a->reported = true, a->outcome = a->final_ckpt_event[0] ? LT_WORKER_END_COMPLETED : LT_WORKER_END_FAILED;
  if (!a->final_ckpt_event[0]) {
    record_stopped(w, a, "failed", "finished without a final checkpoint");
    return;
  }
  rec_t b = fresh(w, R_COMPLETED, a);
  PUT(&b, lt_avro_set_long, "step", m->done.step);
  PUT(&b, lt_avro_set_string, "checkpoint_event_id", a->final_ckpt_event);
  PUT(&b, lt_avro_set_string, "checkpoint_sha256", a->final_ckpt_sha);
  send_sync(w, w->t_control, a->job_id, &b);
}

static void on_stopped_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  bool cancel = m->stopped.why == LT_TRAIN_STOP_CANCEL;
  a->reported = true, a->outcome = LT_WORKER_END_STOPPED;
  a->step = m->stopped.step;
  record_stopped(w, a, cancel ? "cancel" : "preempt", NULL);
  if (cancel) record_cancelled(w, a);
}

static void on_error_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  a->reported = true, a->outcome = LT_WORKER_END_FAILED;
  logf_(a, "%s attempt %d failed: %s", a->job_id, a->attempt, m->error.reason ? m->error.reason : "(no reason)");
  record_stopped(w, a, "failed", m->error.reason ? m->error.reason : "the executor failed");
}

/* A session's executor loaded its state, or answered a call (lt_worker_session.h). */
static void on_session_line(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) {
  if (a->sess && w && m->type == LT_PROTO_READY) lt_wsess_ready(a->sess, m->committed.step);
  else if (a->sess && w) lt_wsess_result(a->sess, &m->result);
}

/* What an executor may say (lt_proto.h); other types are ignored. */
static void (*const line_handlers[LT_PROTO__COUNT])(lt_worker_t *w, attempt_t *a, const lt_proto_msg_t *m) = {
    [LT_PROTO_STEP] = on_step_line,       [LT_PROTO_EVAL] = on_eval_line,
    [LT_PROTO_CHECKPOINT] = on_checkpoint_line, [LT_PROTO_DONE] = on_done_line,
    [LT_PROTO_STOPPED] = on_stopped_line, [LT_PROTO_ERROR] = on_error_line,
    [LT_PROTO_READY] = on_session_line,   [LT_PROTO_RESULT] = on_session_line,
};

/* One line from an executor: any line is progress; a fenced attempt's lines are not recorded. */
static void on_line(lt_worker_t *w, attempt_t *a, const char *line) {
  lt_proto_msg_t m;
  char err[256];
  if (lt_proto_decode(line, &m, err, sizeof err)) {
    logf_(a, "%s: unreadable executor line: %s", a->job_id, err);
  } else {
    a->last_progress_ms = lt_time_wall_ms();
    if (!live(w, a)) {
      /* Fenced: a newer attempt owns the job. Record nothing and stop. */
      a->fenced = true;
      if (a->sess) lt_wsess_fence(a->sess);
      kill_attempt(w, a, "fenced by a newer attempt");
    } else if (line_handlers[m.type]) {
      line_handlers[m.type](w, a, &m);
    }
  }
  lt_proto_msg_release(&m);
}

typedef struct {
  lt_worker_t *w;
  attempt_t *a;
} out_ctx_t;

static void read_output(evutil_socket_t fd, short what, void *arg) {
  out_ctx_t *c = arg;
  attempt_t *a = c->a;
  lt_worker_t *w = c->w;
  (void)what;
  for (;;) {
    /* Lines of a session's results can be large: the buffer grows, up to LINE_MAX_BYTES. */
    if (a->line_cap - a->line_len < 4096) {
      size_t cap = a->line_cap ? a->line_cap * 2 : 1 << 15;
      char *grown = cap <= LINE_MAX_BYTES ? realloc(a->line, cap) : NULL;
      if (grown) a->line = grown, a->line_cap = cap;
    }
    if (a->line_cap - a->line_len <= 1) a->line_len = 0; /* an overlong line: dropped */
    ssize_t n = read(fd, a->line + a->line_len, a->line_cap - 1 - a->line_len);
    if (n > 0) {
      a->line_len += (size_t)n;
      a->line[a->line_len] = '\0';
      char *start = a->line, *nl;
      while ((nl = memchr(start, '\n', a->line_len - (size_t)(start - a->line)))) {
        *nl = '\0';
        on_line(w, a, start);
        start = nl + 1;
      }
      size_t rest = a->line_len - (size_t)(start - a->line);
      memmove(a->line, start, rest);
      a->line_len = rest;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    /* EOF: the executor closed its output, so it has exited or is exiting; one that lingers
     * without output is of no use and must not hold the worker's loop. */
    event_del(a->ev);
    int status = 0;
    for (int i = 0; i < 50 && waitpid(a->pid, &status, WNOHANG) == 0; i++) usleep(20000);
    if (waitpid(a->pid, &status, WNOHANG) == 0) {
      kill(a->pid, SIGKILL);
      waitpid(a->pid, &status, 0);
    }
    a->state = A_EXITED;
    free(c);
    a->ev = (event_free(a->ev), NULL);
    finish_attempt(w, a, status);
    return;
  }
}

/* ---------------------------------------------------------------- starting attempts */
/* Starts the executor (confined: lt_confine_spawn) with its inputs and hands it its assignment. */
static lt_err_t spawn(lt_worker_t *w, attempt_t *a, const char *assignment, size_t len, char *errstr, size_t n) {
  /* The base model's directory, opened here: the executor's uid need not reach it by its path. */
  char model_dir[1024];
  snprintf(model_dir, sizeof model_dir, "%s/%s", w->conf.models_dir, a->spec.base_model);
  int model_fd = open(model_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (model_fd < 0) return lt_errf(errstr, n, LT_ERR_IO, "the base model's directory: %s", strerror(errno));
  int inputs[LT_CONFINE_INPUTS] = {a->in.train_fd, a->in.valid_fd, a->in.resume_fd, model_fd};
  for (int i = 4; i < LT_CONFINE_INPUTS; i++) inputs[i] = i - 4 < a->gang_nfds ? a->gang_fds[i - 4] : -1;
  lt_err_t err = lt_confine_spawn(w->conf.executor_path, &w->confine, inputs, &a->pid, &a->in_fd, &a->out_fd,
                                  errstr, n);
  close(model_fd);
  for (int i = 0; i < a->gang_nfds; i++) close(a->gang_fds[i]); /* the executor has them now */
  a->gang_nfds = 0;
  if (err) return err;
  bool ok = write(a->in_fd, assignment, len) == (ssize_t)len;
  fcntl(a->out_fd, F_SETFL, fcntl(a->out_fd, F_GETFL) | O_NONBLOCK);
  fcntl(a->in_fd, F_SETFL, fcntl(a->in_fd, F_GETFL) | O_NONBLOCK);
  out_ctx_t *c = malloc(sizeof *c);
  c->w = w;
  c->a = a;
  a->ev = event_new(w->base, a->out_fd, EV_READ | EV_PERSIST, read_output, c);
  event_add(a->ev, NULL);
  if (!ok) logf_(a, "could not hand the assignment to the executor of %s", a->job_id);
  return LT_OK;
}

/* Ends an attempt that failed before its executor ran: recorded, scrubbed, its slot freed. An
 * object store still away past the retry window (store_away) is no failure of the job: nothing
 * ran, so the attempt stops as unavailable and is not counted (docs/DESIGN.md §9). */
static void fail_start(lt_worker_t *w, attempt_t *a, bool store_away, const char *why) {
  record_stopped(w, a, store_away ? "unavailable" : "failed", why);
  a->reported = true, a->outcome = store_away ? LT_WORKER_END_UNAVAILABLE : LT_WORKER_END_FAILED;
  finish_attempt(w, a, 0);
}

/* Claims the attempt with AttemptStarted, before doing anything with it. */
static lt_err_t claim(lt_worker_t *w, attempt_t *a, const lt_job_t *j) {
  rec_t b = fresh(w, R_STARTED, a);
  PUT(&b, lt_avro_set_string, "worker_id", w->conf.worker_id);
  PUT(&b, lt_avro_set_long, "lease_deadline", lt_time_wall_ms() + a->lease_ms);
  if (j->ckpt_step > 0) PUT(&b, lt_avro_set_long, "resume_step", j->ckpt_step);
  else PUT(&b, lt_avro_set_null, "resume_step");
  return send_sync(w, w->t_control, a->job_id, &b);
}

/* Spawns the attempt's executor with its assignment, its inputs fetched, and the uploader of what
 * it seals. */
static lt_err_t launch(lt_worker_t *w, attempt_t *a, const lt_jobspec_t *spec, char *errstr, size_t n) {
  char key_hex[2 * LT_CRYPTO_KEY_BYTES + 1], prefix[512], err[512];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/%d/", a->tenant_id, a->job_id, a->attempt);
  lt_ckpt_conf_t cc = {.store = w->conf.store, .copy_from = NULL, .prefix = prefix, .retry_ms = w->conf.store_retry_ms,
                       .on_done = on_uploaded, .on_end = on_upload_end, .ctx = a};
  /* The executor writes into both directories, under its own uid. */
  if (w->confine.uid > 0 && (chown(a->work_dir, (uid_t)w->confine.uid, (gid_t)w->confine.gid) != 0 ||
                             chown(a->mem_dir, (uid_t)w->confine.uid, (gid_t)w->confine.gid) != 0))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot give the attempt's directories to uid %lld: %s",
                   (long long)w->confine.uid, strerror(errno));
  if (lt_store_dir_new(&a->sealed, a->work_dir, err, sizeof err) ||
      (cc.copy_from = a->sealed, lt_ckpt_new(&cc, &a->up, err, sizeof err)))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot prepare the checkpoint upload: %s", err);
  char tmp[740]; /* the store's temporary files, which the executor's store writes */
  snprintf(tmp, sizeof tmp, "%s/.tmp", a->work_dir);
  if (w->confine.uid > 0 && lchown(tmp, (uid_t)w->confine.uid, (gid_t)w->confine.gid) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot give %s to uid %lld: %s", tmp, (long long)w->confine.uid,
                   strerror(errno));
  lt_crypto_hex(a->in.key, sizeof a->in.key, key_hex);
  lt_proto_msg_t m = {.type = LT_PROTO_ASSIGNMENT,
                      .assignment = {.job_id = a->job_id, .tenant_id = a->tenant_id, .attempt = a->attempt,
                                     .spec = *spec, .model_dir = "/proc/self/fd/6", .work_dir = a->mem_dir,
                                     .sealed_dir = a->work_dir, .threads = w->conf.threads_per_executor,
                                     .backend = w->dev.backend, .device = w->dev.ngpus ? (int)(a - w->slots) : -1,
                                     .train_fd = 3, .valid_fd = a->in.valid_fd >= 0 ? 4 : -1,
                                     .resume_fd = a->in.resume_fd >= 0 ? 5 : -1, .key_id = a->in.key_id,
                                     .key_hex = key_hex, .gang_rank = a->gang_rank, .gang_world = a->gang_world,
                                     .gang_fd0 = 7, .gang_nfds = a->gang_nfds}};
  char *line;
  size_t len;
  lt_err_t e = lt_proto_encode(&m, &line, &len);
  OPENSSL_cleanse(key_hex, sizeof key_hex);
  if (e) return lt_errf(errstr, n, e, "cannot write the executor's assignment");
  e = spawn(w, a, line, len, errstr, n);
  OPENSSL_cleanse(line, len);
  free(line);
  return e;
}

/* True when this worker has base model name (what its heartbeat advertises). The name passed the
 * spec's id check, so it has no '/'. */
static bool model_installed(const lt_worker_t *w, const char *name) {
  char probe[1200];
  snprintf(probe, sizeof probe, "%s/%s/model.safetensors", w->conf.models_dir, name);
  return name[0] && access(probe, R_OK) == 0;
}

/* A training session's calls and results (lt_worker_session.h), once its executor runs. */
static lt_err_t start_session(lt_worker_t *w, attempt_t *a, char *errstr, size_t n) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), a->job_id);
  if (a->spec.mode != LT_MODE_INTERACTIVE || !j) return LT_OK;
  lt_wsess_conf_t sc = {.bus = w->conf.bus, .producer = w->producer, .store = w->conf.store,
                        .registry = w->conf.registry, .producer_id = w->producer_id, .t_calls = w->t_calls,
                        .t_progress = w->t_progress, .t_control = w->t_control, .tenant_id = a->tenant_id, .job_id = a->job_id,
                        .attempt = a->attempt, .key = a->in.key, .key_id = a->in.key_id,
                        .since_ms = j->submitted_at_ms, .resume_seq = a->in.resume_fd >= 0 ? j->ckpt_step : 0,
                        .resume_attempt = a->in.resume_fd >= 0 ? j->ckpt_attempt : 0,
                        .restarted = j->last_stop_failed, .mem_dir = a->mem_dir, .uid = w->confine.uid,
                        .gid = w->confine.gid, .exec_fd = a->in_fd};
  return lt_wsess_start(&sc, &a->sess, errstr, n);
}

/* The fetch ended: start the executor with what it fetched, unless the attempt was stopped,
 * fenced or cancelled meanwhile, or the fetch failed. */
static void inputs_ready(lt_worker_t *w, attempt_t *a) {
  char err[512];
  lt_err_t e = a->gang_joined ? LT_OK : lt_xfer_finish(a->xfer, &a->in, err, sizeof err);
  a->xfer = NULL;
  if (a->killed || a->stop_signal || !live(w, a)) { /* an aborted fetch is no failure of the job */
    finish_attempt(w, a, 0);
    return;
  }
  if (e) {
    fail_start(w, a, lt_store_err_retriable(e), err);
    return;
  }
  if (a->gang_world > 1 && !a->gang_joined) { /* the gang first: gang_joined comes back here */
    lt_wgang_conf_t gc = {.rank = a->gang_rank, .world = a->gang_world, .rendezvous = a->gang_rdv,
                          .job_id = a->job_id, .attempt = a->attempt, .notify_fd = a->notify[1],
                          /* longer than a peer's wait for the store: its unavailable stop, not
                           * this rank's timeout, then says why the attempt ended */
                          .timeout_ms = (int)(w->conf.store_retry_ms + 120000)};
    if (lt_wgang_start(&gc, &a->gang, err, sizeof err)) fail_start(w, a, false, err);
    return;
  }
  if (launch(w, a, &a->spec, err, sizeof err) || start_session(w, a, err, sizeof err)) {
    fail_start(w, a, false, err);
    return;
  }
  logf_(a, "started %s attempt %d (pid %d)", a->job_id, a->attempt, (int)a->pid);
  w->st.started++, w->st.fetched_bytes += a->in.bytes;
}

/* The gang's join ended ('g'): its connections go to the executor, which starts now. */
static void gang_joined(lt_worker_t *w, attempt_t *a) {
  char err[512];
  lt_err_t e = lt_wgang_finish(a->gang, a->gang_fds, &a->gang_nfds, err, sizeof err);
  a->gang = NULL;
  a->gang_joined = true;
  if (e) fail_start(w, a, false, err);
  else inputs_ready(w, a);
}

/* A checkpoint upload ended: commit it, or end the attempt with the upload's failure. */
static void upload_ended(lt_worker_t *w, attempt_t *a) {
  char err[512];
  if (!a->uploading) return;
  a->uploading = false;
  lt_err_t e = lt_ckpt_flush(a->up, err, sizeof err);
  /* the store away past the window: a job's attempt stops as unavailable, not charged to the job
   * (it resumes from its last commit); a session's as failed, which its next attempt must say to
   * the calls that ran on the state lost with it (session_restarted) */
  a->store_away = e && !a->sess && lt_store_err_retriable(e);
  if (e) fail_attempt(w, a, err);
  else if (!a->fenced) commit_checkpoint(w, a, &a->uploaded);
}

/* The attempt's threads said they ended ('f': the fetch, 'u': an upload). */
static void on_notify(evutil_socket_t fd, short what, void *arg) {
  attempt_t *a = arg;
  lt_worker_t *w = a->w;
  (void)what;
  char b[16];
  ssize_t got = read(fd, b, sizeof b);
  for (ssize_t i = 0; i < got && a->state == A_RUNNING; i++) {
    if (b[i] == 'f' && a->xfer) inputs_ready(w, a);
    else if (b[i] == 'u') upload_ended(w, a);
    else if (b[i] == 'g' && a->gang) gang_joined(w, a);
  }
}

/* The attempt's directories — on disk for what its executor seals, on a memory file system for
 * its plaintext, both private (mkdtemp: 0700) — and the fetch of its inputs. */
static lt_err_t prepare(lt_worker_t *w, attempt_t *a, const lt_tenant_t *t, const char *resume, char *errstr,
                        size_t n) {
  snprintf(a->work_dir, sizeof a->work_dir, "%s/%s-%d-XXXXXX", w->work_parent, a->job_id, a->attempt);
  snprintf(a->mem_dir, sizeof a->mem_dir, "%s/%s-%d-XXXXXX", w->mem_parent, a->job_id, a->attempt);
  if (!mkdtemp(a->work_dir) || !mkdtemp(a->mem_dir))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot create the attempt's private directories");
  if (pipe2(a->notify, O_CLOEXEC | O_NONBLOCK) != 0 ||
      !(a->notify_ev = event_new(w->base, a->notify[0], EV_READ | EV_PERSIST, on_notify, a)) ||
      event_add(a->notify_ev, NULL) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot watch the attempt's threads");
  lt_xfer_conf_t xc = {.store = w->conf.store, .kek = w->conf.kek, .tenant_id = a->tenant_id,
                       .wrapped_key = t->wrapped_data_key, .wrapped_key_len = t->wrapped_data_key_len,
                       .train_id = a->spec.dataset_id,
                       .valid_id = a->spec.validation_dataset_id[0] ? a->spec.validation_dataset_id : NULL,
                       .resume_key = resume, .notify_fd = a->notify[1], .retry_ms = w->conf.store_retry_ms};
  lt_err_t err = lt_xfer_start(&xc, &a->xfer, errstr, n);
  if (!err) logf_(a, "fetching the inputs of %s attempt %d%s", a->job_id, a->attempt, resume ? " (resuming)" : "");
  return err;
}

/* Starts a dispatched attempt if it is still the job's live one; false to keep it pending. */
static bool try_start(lt_worker_t *w, pending_t *p) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), p->job_id);
  if (!j || j->attempt < p->attempt) return false; /* the control record is not folded yet */
  /* A gang's rank > 0 may find rank 0 already started (its AttemptStarted folded). */
  bool startable = j->state == LT_JOB_DISPATCHED || (p->gang_rank > 0 && j->state == LT_JOB_RUNNING);
  if (j->attempt > p->attempt || !startable || j->cancel_requested) return true; /* stale: drop */
  /* The scheduler dispatched the job, so its tenant exists: a tenant this worker has not met is
   * one its fold has not read yet (lathe.tenants is a topic of its own, read beside the job
   * topics in no set order). Wait for it; if it never comes, the scheduler's start timeout
   * dispatches a new attempt and this one goes stale. */
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(w->proj), j->tenant_id);
  if (!t) return false;
  attempt_t *a = NULL;
  for (int i = 0; i < w->conf.slots && !a; i++)
    if (w->slots[i].state == A_FREE) a = &w->slots[i];
  if (!a) return false;
  slot_reset(a);
  snprintf(a->job_id, sizeof a->job_id, "%s", j->job_id);
  snprintf(a->tenant_id, sizeof a->tenant_id, "%s", j->tenant_id);
  a->attempt = p->attempt;
  a->cls = j->job_class;
  a->gang_rank = p->gang_rank, a->gang_world = p->gang_world;
  snprintf(a->gang_rdv, sizeof a->gang_rdv, "%s", p->gang_rdv);
  a->lease_ms = p->lease_ms > 0 ? p->lease_ms : 30000;
  a->last_progress_ms = lt_time_wall_ms();
  a->state = A_RUNNING; /* from here the slot is ours, whatever happens next */
  if (p->spec_err) {
    fail_start(w, a, false, p->spec_msg);
    return true;
  }
  if (!model_installed(w, p->spec.base_model)) {
    /* Said here, without the worker's paths or name: the reason reaches the customer. */
    char why[256];
    snprintf(why, sizeof why, "base model \"%s\" is not installed on the worker that took the job",
             p->spec.base_model);
    fail_start(w, a, false, why);
    return true;
  }
  if (claim(w, a, j)) {
    slot_reset(a);
    return false; /* try again on the next tick */
  }
  a->spec = p->spec;
  a->w = w;
  char err[512];
  if (prepare(w, a, t, lt_proj_resume_key(w->proj, a->job_id), err, sizeof err)) fail_start(w, a, false, err);
  return true;
}

static void run_pending(lt_worker_t *w) {
  if (w->draining) return; /* lt_worker_drain gave these back; one taken since waits for its start timeout */
  /* Highest class first, then oldest. */
  for (int pass = 0; pass < LT_CLASS__COUNT; pass++)
    for (int i = 0; i < w->npending; i++) {
      pending_t *p = &w->pending[i];
      if ((int)p->cls != pass) continue;
      bool expired = lt_time_wall_ms() - p->since_ms > 60000;
      if (try_start(w, p) || expired) {
        w->pending[i] = w->pending[--w->npending];
        i--;
      }
    }
}

/* ---------------------------------------------------------------- consumers */
/* A JobDispatched record for this worker (or any worker) is kept pending until its attempt is
 * the job's live one in the fold of lathe.control. Its spec is read and validated here, once. */
static void on_dispatch_msg(lt_worker_t *w, const lt_bus_msg_t *m) {
  size_t len;
  const void *v = lt_bus_msg_value(m, &len);
  lt_avro_record_t *rec;
  char err[256];
  if (!v || lt_avro_decode(w->dec, v, len, &rec, err, sizeof err) || strcmp(lt_avro_record_type(rec), "JobDispatched")) {
    logf_(NULL, "skipping an undecodable dispatch record at offset %lld", (long long)lt_bus_msg_offset(m));
    return;
  }
  const char *wid = NULL, *job = NULL, *cls = NULL;
  int32_t attempt = 0;
  lt_avro_get_string(rec, "worker_id", &wid, NULL);
  lt_avro_get_string(rec, "job_id", &job, NULL);
  lt_avro_get_int(rec, "attempt", &attempt);
  lt_avro_get_enum(rec, "priority", &cls);
  if (!job || (wid && strcmp(wid, w->conf.worker_id) != 0)) return; /* another worker's */
  if (w->npending == MAX_PENDING || find_attempt(w, job)) return;
  pending_t *p = &w->pending[w->npending++];
  memset(p, 0, sizeof *p);
  snprintf(p->job_id, sizeof p->job_id, "%s", job);
  p->attempt = attempt;
  lt_job_class_t c = LT_CLASS_STANDARD;
  if (cls) lt_job_class_parse(cls, &c);
  p->cls = c;
  p->since_ms = lt_time_wall_ms();
  lt_avro_get_long(rec, "lease_ms", &p->lease_ms);
  const char *rdv = NULL;
  lt_avro_get_int(rec, "gang_rank", &p->gang_rank); /* JobDispatched v2; v1 records read the defaults */
  lt_avro_get_int(rec, "gang_world", &p->gang_world);
  lt_avro_get_string(rec, "gang_rendezvous", &rdv, NULL);
  snprintf(p->gang_rdv, sizeof p->gang_rdv, "%s", rdv ? rdv : "");
  if (p->gang_world < 1) p->gang_world = 1;
  char field[96];
  p->spec_err = lt_jobspec_from_record(rec, &p->spec, p->spec_msg, sizeof p->spec_msg);
  if (!p->spec_err)
    p->spec_err = lt_jobspec_validate(&p->spec, field, sizeof field, p->spec_msg, sizeof p->spec_msg);
}

/* Hands the records that are already here to on_msg (at most max, so neither consumer starves the
 * loop), then starts what became startable. */
static void drain(lt_worker_t *w, lt_bus_consumer_t *c, int max,
                  void (*on_msg)(lt_worker_t *w, const lt_bus_msg_t *m)) {
  for (int i = 0; i < max; i++) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(c, 0, &m, NULL, 0) || !m) break;
    on_msg(w, m);
  }
  run_pending(w);
}

static void take_dispatch(lt_worker_t *w, const lt_bus_msg_t *m) {
  on_dispatch_msg(w, m);
  lt_bus_consumer_commit_msg(w->dispatch, m, true, NULL, 0);
}

static void on_dispatch(evutil_socket_t fd, short what, void *arg) {
  lt_worker_t *w = arg;
  drain(w, w->dispatch, 100, take_dispatch);
}

/* A control record for a job running here may ask us to stop it. */
static void react(lt_worker_t *w, const char *job_id) {
  attempt_t *a = find_attempt(w, job_id);
  if (!a || a->state != A_RUNNING) return;
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), job_id);
  if (!j) return;
  if (j->attempt != a->attempt || (lt_job_state_is_terminal(j->state) && !a->reported)) {
    a->fenced = true;
    kill_attempt(w, a, "a newer attempt or a terminal record owns the job");
  } else if (j->cancel_requested) {
    stop_attempt(w, a, SIGUSR1);
  } else if (j->state == LT_JOB_PREEMPTING) {
    stop_attempt(w, a, SIGUSR2);
  }
}

static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_worker_t *w = ctx;
  if (res->job_id && res->job_outcome == LT_JOB_APPLIED) react(w, res->job_id);
  if (res->type && res->record && strcmp(res->type, "WorkerDrainRequested") == 0)
    lt_worker_drain_requested(w, res->record, w->folding);
}

/* Folds one record of jobs, control or tenants; a refused tenant record (no valid MAC) is said
 * and skipped: the tenant keeps its previous data key (the scheduler dead-letters it). */
static void fold_control(lt_worker_t *w, const lt_bus_msg_t *m) {
  char err[512];
  w->folding = m;
  if (lt_proj_fold_msg(w->proj, m, NULL, on_folded, w, err, sizeof err) == LT_ERR_AUTH)
    logf_(NULL, "%s", err);
  w->folding = NULL;
}

static void on_control(evutil_socket_t fd, short what, void *arg) {
  lt_worker_t *w = arg;
  drain(w, w->control, 1000, fold_control);
}

static void on_rebalance(void *opaque, lt_bus_consumer_t *c, lt_bus_rebalance_t what, const lt_bus_tp_t *parts,
                         size_t n) {
  lt_worker_t *w = opaque;
  (void)c;
  if (what == LT_BUS_REVOKED) {
    json_array_clear(w->owned);
    return;
  }
  json_array_clear(w->owned);
  for (size_t i = 0; i < n; i++)
    json_array_append_new(w->owned, json_pack("{s:s,s:i}", "topic", parts[i].topic, "partition", parts[i].partition));
  /* librdkafka keeps a partition paused across a rebalance, and a resume sent between the revoke
   * and this assignment reached no partition: apply the pause state again (chaos seed 7101). */
  w->dispatch_reassigned = true;
}

/* ---------------------------------------------------------------- heartbeat and timers */
/* What this worker offers (slots, memory, base models) and holds (dispatch partitions, leases):
 * the scheduler's view of it, and, once delivered, the renewal of its leases. */
static void heartbeat(lt_worker_t *w) {
  rec_t b = fresh(w, R_HB, NULL);
  PUT(&b, lt_avro_set_string, "worker_id", w->conf.worker_id);
  PUT(&b, lt_avro_set_long, "seq", ++w->hb_seq);
  PUT(&b, lt_avro_set_string, "backend", w->dev.backend);
  PUT(&b, lt_avro_set_int, "slots_total", w->conf.slots);
  PUT(&b, lt_avro_set_int, "slots_free", free_slots(w));
  struct sysinfo si;
  if (sysinfo(&si) == 0) {
    PUT(&b, lt_avro_set_long, "memory_total_bytes", (int64_t)si.totalram * si.mem_unit);
    PUT(&b, lt_avro_set_long, "memory_free_bytes", (int64_t)si.freeram * si.mem_unit);
  }
  static const char *const need[] = {"model.safetensors", NULL};
  char models[64][LT_JOB_NAME_MAX];
  size_t nm = lt_models_list(w->conf.models_dir, need, models, 64);
  for (size_t i = 0; i < nm && i < 64; i++) PUT(&b, lt_avro_array_append_string, "base_models", models[i]);
  char path[64];
  size_t i;
  json_t *p;
  json_array_foreach(w->owned, i, p) {
    size_t idx = put_elem(&b, "owned_partitions");
    PUT(&b, lt_avro_set_string, elem(path, "owned_partitions", idx, "topic"),
        json_string_value(json_object_get(p, "topic")));
    PUT(&b, lt_avro_set_int, elem(path, "owned_partitions", idx, "partition"),
            (int32_t)json_integer_value(json_object_get(p, "partition")));
  }
  for (int s = 0; s < w->conf.slots; s++) {
    attempt_t *a = &w->slots[s];
    if (a->state != A_RUNNING || a->fenced || a->gang_rank > 0) continue; /* rank 0 holds a gang's lease */
    size_t idx = put_elem(&b, "leases");
    PUT(&b, lt_avro_set_string, elem(path, "leases", idx, "job_id"), a->job_id);
    PUT(&b, lt_avro_set_int, elem(path, "leases", idx, "attempt"), a->attempt);
    PUT(&b, lt_avro_set_long, elem(path, "leases", idx, "lease_deadline"), lt_time_wall_ms() + a->lease_ms);
  }
  PUT(&b, lt_avro_set_bool, "draining", w->draining);
  PUT(&b, lt_avro_set_string, "node_group", w->conf.node_group ? w->conf.node_group : "");
  PUT(&b, lt_avro_set_string, "rendezvous", w->conf.rendezvous ? w->conf.rendezvous : "");
  for (int g = 0; g < w->dev.ngpus; g++) {
    const lt_cuda_device_t *d = &w->dev.gpus[g];
    size_t idx = put_elem(&b, "devices");
    char cc[24];
    snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
    PUT(&b, lt_avro_set_int, elem(path, "devices", idx, "index"), d->index);
    PUT(&b, lt_avro_set_string, elem(path, "devices", idx, "name"), d->name);
    PUT(&b, lt_avro_set_long, elem(path, "devices", idx, "memory_bytes"), (int64_t)d->memory_bytes);
    PUT(&b, lt_avro_set_string, elem(path, "devices", idx, "compute_capability"), cc);
  }
  const char *eid = NULL;
  if (!b.err && !lt_avro_get_string(b.r, "event_id", &eid, NULL)) /* a drain request names one */
    snprintf(w->hb_ids[w->hb_next++ % 128], sizeof w->hb_ids[0], "%s", eid);
  send_async(w, w->t_workers, w->conf.worker_id, &b, w);
}

/* Pauses dispatch consumption while every slot is busy (lower classes wait in Kafka) or the worker
 * drains; resumes it otherwise. */
static void pause_dispatch(lt_worker_t *w) {
  bool full = w->draining || free_slots(w) == 0;
  if (full == w->dispatch_paused && !w->dispatch_reassigned) return;
  lt_bus_tp_t parts[64];
  size_t np = 0;
  size_t i;
  json_t *p;
  json_array_foreach(w->owned, i, p) if (np < 64) parts[np++] = (lt_bus_tp_t){
      .topic = json_string_value(json_object_get(p, "topic")),
      .partition = (int32_t)json_integer_value(json_object_get(p, "partition"))};
  if (full) lt_bus_consumer_pause(w->dispatch, parts, np, NULL, 0);
  else lt_bus_consumer_resume(w->dispatch, parts, np, NULL, 0);
  w->dispatch_paused = full;
  w->dispatch_reassigned = false;
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  lt_worker_t *w = arg;
  int64_t now = lt_time_wall_ms();
  if (now - w->last_hb_sent_ms >= w->conf.heartbeat_ms) {
    heartbeat(w);
    w->last_hb_sent_ms = now;
  }
  int64_t hb_ok = __atomic_load_n(&w->hb_ok_ms, __ATOMIC_ACQUIRE);
  for (int i = 0; i < w->conf.slots; i++) {
    attempt_t *a = &w->slots[i];
    if (a->state != A_RUNNING) continue;
    bool said = a->gang && peer_stopped(w, a); /* its stop is in the log already */
    if (a->gang && (a->stop_signal || a->killed || !live(w, a) || said)) {
      if (said) a->reported = true, a->outcome = LT_WORKER_END_STOPPED;
      finish_attempt(w, a, 0); /* joining a gang: end it now */
      continue;
    }
    /* Partitioned: the lease cannot be renewed. Stop before it can expire (invariant 2). */
    if (hb_ok > 0 && now - hb_ok > a->lease_ms * 2 / 3) {
      a->fenced = true;
      kill_attempt(w, a, "its lease could not be renewed (broker unreachable)");
    }
    if (a->stop_signal && now - a->stop_sent_ms > w->conf.kill_deadline_ms)
      kill_attempt(w, a, "it did not stop within the kill deadline");
    if (a->sess && !lt_wsess_busy(a->sess)) a->last_progress_ms = now; /* an idle session owes no progress */
    int64_t seq; /* an idle session saves its state and frees its slot until a call wakes it */
    if (a->sess && !a->stop_signal && lt_wsess_idle(a->sess, now, w->conf.session_idle_ms, &seq) &&
        lt_wsess_park(a->sess, seq, NULL, 0) == LT_OK)
      stop_attempt(w, a, SIGUSR2);
    if (now - a->last_progress_ms > w->conf.watchdog_ms) kill_attempt(w, a, "no progress (step watchdog)");
  }
  run_pending(w);
  pause_dispatch(w);
  on_control(-1, 0, w);
  on_dispatch(-1, 0, w);
}

/* ---------------------------------------------------------------- life cycle */
/* The configuration with its defaults filled in, and the names of the topics it uses. */
static void configure(lt_worker_t *w, const lt_worker_conf_t *conf) {
  w->conf = *conf;
  lt_worker_conf_defaults(&w->conf, MAX_SLOTS);
  for (int i = 0; i < MAX_SLOTS; i++) {
    attempt_t *a = &w->slots[i];
    a->out_fd = a->in_fd = a->notify[0] = a->notify[1] = -1;
    lt_xfer_inputs_init(&a->in);
  }
  snprintf(w->producer_id, sizeof w->producer_id, "worker/%s", conf->worker_id);
  lt_bus_topic_name(conf->bus, "control", w->t_control, sizeof w->t_control);
  lt_bus_topic_name(conf->bus, "progress", w->t_progress, sizeof w->t_progress);
  lt_bus_topic_name(conf->bus, "calls", w->t_calls, sizeof w->t_calls);
  lt_bus_topic_name(conf->bus, "workers", w->t_workers, sizeof w->t_workers);
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    char base_name[64];
    snprintf(base_name, sizeof base_name, "dispatch.%s", lt_job_class_name((lt_job_class_t)c));
    lt_bus_topic_name(conf->bus, base_name, w->t_dispatch[c], sizeof w->t_dispatch[c]);
  }
}

lt_err_t lt_worker_new(struct event_base *base, const lt_worker_conf_t *conf, lt_worker_t **out, char *errstr,
                       size_t n) {
  lt_worker_t *w = calloc(1, sizeof *w);
  if (!w) return LT_ERR_NOMEM;
  w->base = base;
  w->dir_lock = -1;
  w->owned = json_array();
  configure(w, conf);
  lt_err_t err = lt_worker_devices(conf->backend, &w->conf.slots, &w->dev, errstr, n);
  if (!err)
    err = lt_worker_confinement(&w->conf, &w->confine, w->work_parent, w->mem_parent, &w->dir_lock, errstr, n);
  if (!err) err = lt_proj_new(conf->registry, &w->proj, errstr, n);
  if (!err && conf->tenant_mac) lt_proj_require_tenant_mac(w->proj, conf->tenant_mac);
  if (!err && conf->kek) err = lt_recmac_key_new(conf->kek, LT_RECMAC_OPERATOR, &w->op_mac, errstr, n);
  if (!err) err = lt_avro_decoder_new(conf->registry, &w->dec, errstr, n);
  for (int i = 0; i < R__N && !err; i++) err = lt_avro_record_new(conf->registry, rec_types[i], &w->rec[i], errstr, n);
  lt_bus_producer_opts_t po = {.delivery_cb = on_delivery, .opaque = w};
  if (!err) err = lt_bus_producer_new(conf->bus, &po, &w->producer, errstr, n);
  if (!err) {
    lt_bus_producer_prepare(w->producer, w->t_control, 2000);
    lt_bus_producer_prepare(w->producer, w->t_progress, 2000);
    lt_bus_producer_prepare(w->producer, w->t_workers, 2000);
  }
  if (!err) err = lt_worker_assign_control(w->conf.bus, &w->control, errstr, n);
  const char *topics[LT_CLASS__COUNT] = {w->t_dispatch[0], w->t_dispatch[1], w->t_dispatch[2]};
  if (!err) err = lt_worker_join_dispatch(w->conf.bus, topics, on_rebalance, w, &w->dispatch, errstr, n);
  if (!err) {
    w->control_ev = event_new(base, lt_bus_consumer_fd(w->control), EV_READ | EV_PERSIST, on_control, w);
    w->dispatch_ev = event_new(base, lt_bus_consumer_fd(w->dispatch), EV_READ | EV_PERSIST, on_dispatch, w);
    w->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, w);
    struct timeval tv = {0, 200 * 1000};
    if (!w->control_ev || !w->dispatch_ev || !w->tick_ev || event_add(w->control_ev, NULL) ||
        event_add(w->dispatch_ev, NULL) || event_add(w->tick_ev, &tv))
      err = lt_errf(errstr, n, LT_ERR_NOMEM, "cannot register the worker's events");
  }
  if (err) {
    lt_worker_destroy(w);
    return err;
  }
  __atomic_store_n(&w->hb_ok_ms, lt_time_wall_ms(), __ATOMIC_RELEASE);
  *out = w;
  return LT_OK;
}

/* A dispatch taken but not started when the worker drains: its AttemptStopped (preempt), so the
 * job is queued again now rather than when its start times out (which also cordons this worker's
 * id, and a gang's rank 0 elsewhere would wait minutes to be joined). A gang's part of any rank
 * writes it: its peers end when it is in the log. */
static void drop_pending(lt_worker_t *w, const pending_t *p) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(w->proj), p->job_id);
  if (!j || j->attempt != p->attempt || j->attempt_stopped || lt_job_state_is_terminal(j->state) ||
      !(j->state == LT_JOB_DISPATCHED || (p->gang_world > 1 && j->state == LT_JOB_RUNNING)))
    return;
  static attempt_t t; /* record_stopped reads its ids only */
  memset(&t, 0, sizeof t);
  snprintf(t.job_id, sizeof t.job_id, "%s", p->job_id);
  snprintf(t.tenant_id, sizeof t.tenant_id, "%s", j->tenant_id);
  t.attempt = p->attempt;
  record_stopped(w, &t, "preempt", "not started: its worker drains");
}

int64_t lt_worker_drain(lt_worker_t *w) {
  if (w->draining) return w->conf.kill_deadline_ms;
  w->draining = true;
  pause_dispatch(w);
  heartbeat(w); /* said before any stop below is, so the scheduler places nothing more here */
  lt_bus_producer_flush(w->producer, 3000, NULL, 0);
  int asked = 0, ranks = 0, pending = w->npending;
  for (int i = 0; i < w->conf.slots; i++) {
    attempt_t *a = &w->slots[i];
    if (a->state != A_RUNNING || a->killed || a->stop_signal) continue; /* ending already */
    if (a->gang_rank > 0) { /* rank 0 speaks for the gang; the scheduler asks it to stop */
      ranks++;
      continue;
    }
    stop_attempt(w, a, SIGUSR2);
    asked++;
  }
  for (int i = 0; i < w->npending; i++) drop_pending(w, &w->pending[i]);
  w->npending = 0;
  lt_log_info("worker", "draining: %d attempt(s) asked to checkpoint and stop, %d gang part(s) left to their rank 0, "
              "%d dispatch(es) not started given back", asked, ranks, pending);
  return w->conf.kill_deadline_ms;
}

bool lt_worker_idle(lt_worker_t *w) { return free_slots(w) == w->conf.slots; }

void lt_worker_stats(lt_worker_t *w, lt_worker_stats_t *out) {
  *out = w->st;
  out->slots = w->conf.slots;
  out->busy = w->conf.slots - free_slots(w);
  out->pending = w->npending;
  out->hb_ok_ms = __atomic_load_n(&w->hb_ok_ms, __ATOMIC_ACQUIRE);
  out->hb_sent_ms = w->last_hb_sent_ms;
  out->heartbeat_ms = w->conf.heartbeat_ms;
  out->draining = w->draining;
}

void lt_worker_destroy(lt_worker_t *w) {
  if (!w) return;
  for (int i = 0; i < MAX_SLOTS; i++) {
    attempt_t *a = &w->slots[i];
    if (a->state == A_RUNNING && a->pid > 0) {
      kill(a->pid, SIGKILL);
      waitpid(a->pid, NULL, 0);
    }
    if (a->state != A_FREE) scrub_attempt(w, a);
    if (a->ev) event_free(a->ev);
    slot_reset(a);
  }
  if (w->control_ev) event_free(w->control_ev);
  if (w->dispatch_ev) event_free(w->dispatch_ev);
  if (w->tick_ev) event_free(w->tick_ev);
  lt_bus_consumer_destroy(w->dispatch);
  lt_bus_consumer_destroy(w->control);
  lt_bus_producer_destroy(w->producer, 5000);
  for (int i = 0; i < R__N; i++) lt_avro_record_destroy(w->rec[i]);
  lt_avro_decoder_destroy(w->dec);
  lt_recmac_key_destroy(w->op_mac);
  lt_proj_destroy(w->proj);
  json_decref(w->owned);
  if (w->dir_lock >= 0) close(w->dir_lock);
  free(w);
}
