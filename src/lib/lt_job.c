/* lt_job: the pure fold of job records into job states (see lt_job.h for the rules). */
#include "lt_job.h"

#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

struct lt_job_table {
  lt_job_t **slots; /* open addressing, linear probing; NULL = empty */
  size_t cap;       /* power of two */
  size_t count;
};

static const char *const state_names[LT_JOB__STATE_COUNT] = {
    "submitted", "queued", "dispatched", "running", "preempting",
    "completed", "failed", "cancelled", "rejected"};
static const char *const class_names[LT_CLASS__COUNT] = {"production", "standard", "preemptible"};
static const char *const event_names[LT_EV__COUNT] = {
    "JobSubmitted",   "JobAccepted",         "JobRejected",   "JobDispatched", "AttemptStarted",
    "CancelRequested", "PreemptRequested",   "CheckpointCommitted", "AttemptStopped",
    "JobCompleted",   "JobFailed",           "JobCancelled",  "CleanupDone",   "SessionIdle",
    "SessionWoken"};
static const char *const stop_names[LT_STOP__COUNT] = {"cancel", "preempt", "lost", "failed",
                                                        "unavailable"};

bool lt_job_state_is_terminal(lt_job_state_t s) {
  return s == LT_JOB_COMPLETED || s == LT_JOB_FAILED || s == LT_JOB_CANCELLED ||
         s == LT_JOB_REJECTED;
}

const char *lt_job_state_name(lt_job_state_t s) {
  return (unsigned)s < LT_JOB__STATE_COUNT ? state_names[s] : "?";
}

const char *lt_job_class_name(lt_job_class_t c) {
  return (unsigned)c < LT_CLASS__COUNT ? class_names[c] : "?";
}

const char *lt_job_event_type_name(lt_job_event_type_t t) {
  return (unsigned)t < LT_EV__COUNT ? event_names[t] : "?";
}

const char *lt_job_stop_reason_name(lt_job_stop_reason_t r) {
  return (unsigned)r < LT_STOP__COUNT ? stop_names[r] : "?";
}

static int find_name(const char *const *names, int n, const char *name) {
  if (!name) return -1;
  for (int i = 0; i < n; i++)
    if (strcmp(names[i], name) == 0) return i;
  return -1;
}

lt_err_t lt_job_class_parse(const char *name, lt_job_class_t *out) {
  int i = find_name(class_names, LT_CLASS__COUNT, name);
  if (i < 0) return LT_ERR_INVALID;
  *out = (lt_job_class_t)i;
  return LT_OK;
}

lt_err_t lt_job_stop_reason_parse(const char *name, lt_job_stop_reason_t *out) {
  int i = find_name(stop_names, LT_STOP__COUNT, name);
  if (i < 0) return LT_ERR_INVALID;
  *out = (lt_job_stop_reason_t)i;
  return LT_OK;
}

lt_err_t lt_job_event_type_parse(const char *name, lt_job_event_type_t *out) {
  int i = find_name(event_names, LT_EV__COUNT, name);
  if (i < 0) return LT_ERR_NOT_FOUND;
  *out = (lt_job_event_type_t)i;
  return LT_OK;
}

/* FNV-1a: the table only needs a spread, not secrecy (ids are validated before they get here). */
static uint64_t hash_id(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

lt_err_t lt_job_table_new(lt_job_table_t **out) {
  lt_job_table_t *t = calloc(1, sizeof *t);
  if (!t) return LT_ERR_NOMEM;
  t->cap = 1024;
  t->slots = calloc(t->cap, sizeof *t->slots);
  if (!t->slots) {
    free(t);
    return LT_ERR_NOMEM;
  }
  *out = t;
  return LT_OK;
}

void lt_job_table_destroy(lt_job_table_t *t) {
  if (!t) return;
  for (size_t i = 0; i < t->cap; i++) free(t->slots[i]);
  free(t->slots);
  free(t);
}

static lt_job_t **probe(const lt_job_table_t *t, const char *job_id) {
  size_t mask = t->cap - 1;
  for (size_t i = hash_id(job_id) & mask;; i = (i + 1) & mask) {
    if (!t->slots[i] || strcmp(t->slots[i]->job_id, job_id) == 0) return &t->slots[i];
  }
}

static lt_err_t grow(lt_job_table_t *t) {
  lt_job_t **old = t->slots;
  size_t old_cap = t->cap;
  t->cap *= 2;
  t->slots = calloc(t->cap, sizeof *t->slots);
  if (!t->slots) {
    t->slots = old;
    t->cap = old_cap;
    return LT_ERR_NOMEM;
  }
  for (size_t i = 0; i < old_cap; i++)
    if (old[i]) *probe(t, old[i]->job_id) = old[i];
  free(old);
  return LT_OK;
}

const lt_job_t *lt_job_get(const lt_job_table_t *t, const char *job_id) {
  if (!job_id) return NULL;
  return *probe(t, job_id);
}

size_t lt_job_count(const lt_job_table_t *t) { return t->count; }

/* Copies src into a fixed field, truncating; fields are sized above the validated limits. */
static void set_str(char *dst, size_t cap, const char *src) {
  if (!src) src = "";
  size_t n = strnlen(src, cap - 1);
  memcpy(dst, src, n);
  dst[n] = '\0';
}

static bool same_str(const char *field, const char *src) { return strcmp(field, src ? src : "") == 0; }

/* A record of the current attempt that is still live (not fenced, not stopped). */
static bool live_attempt(const lt_job_t *j, int32_t attempt) {
  return attempt == j->attempt && j->attempt > 0 && !j->attempt_stopped;
}

static void terminate(lt_job_t *j, lt_job_state_t s, const lt_job_event_t *ev, const char *why) {
  j->state = s;
  j->ended_at_ms = ev->occurred_at_ms;
  if (why && *why) set_str(j->reason, sizeof j->reason, why);
}

/* The transition function. Returns true when the job changed. */
static bool fold(lt_job_t *j, const lt_job_event_t *ev) {
  bool terminal = lt_job_state_is_terminal(j->state);
  switch (ev->type) {
  case LT_EV_JOB_SUBMITTED:
    return false; /* handled by the caller: a second submission of an id changes nothing */
  case LT_EV_JOB_ACCEPTED:
    if (j->state != LT_JOB_SUBMITTED) return false;
    j->state = LT_JOB_QUEUED;
    j->queued_at_ms = ev->occurred_at_ms;
    return true;
  case LT_EV_JOB_REJECTED:
    if (j->state != LT_JOB_SUBMITTED) return false;
    terminate(j, LT_JOB_REJECTED, ev, ev->reason);
    return true;
  case LT_EV_JOB_DISPATCHED:
    /* A newer attempt fences every older one; a dispatch never revives a terminal job. */
    if (terminal || ev->attempt <= j->attempt) return false;
    if (j->state == LT_JOB_SUBMITTED) return false; /* not accepted: nothing may run it */
    j->attempt = ev->attempt;
    j->attempt_stopped = false;
    j->parked = false; /* dispatched: running again, whatever woke it */
    j->state = LT_JOB_DISPATCHED;
    j->lease_ms = ev->lease_ms;
    set_str(j->worker_id, sizeof j->worker_id, ev->worker_id);
    return true;
  case LT_EV_ATTEMPT_STARTED:
    if (terminal || !live_attempt(j, ev->attempt) || j->state != LT_JOB_DISPATCHED) return false;
    j->state = LT_JOB_RUNNING;
    j->started_at_ms = ev->occurred_at_ms;
    if (ev->worker_id && *ev->worker_id) set_str(j->worker_id, sizeof j->worker_id, ev->worker_id);
    return true;
  case LT_EV_CANCEL_REQUESTED:
    if (terminal || j->cancel_requested) return false;
    j->cancel_requested = true;
    return true;
  case LT_EV_PREEMPT_REQUESTED:
    if (terminal || !live_attempt(j, ev->attempt) || j->state != LT_JOB_RUNNING) return false;
    j->state = LT_JOB_PREEMPTING;
    return true;
  case LT_EV_CHECKPOINT_COMMITTED:
    /* Only the live attempt's commits count: a fenced attempt's checkpoint is never resumed
     * from nor published (invariants 2 and 4). Steps only move forward. */
    if (terminal || ev->attempt != j->attempt || j->attempt == 0) return false;
    if (j->ckpt_attempt == ev->attempt && ev->step <= j->ckpt_step && !(ev->final_checkpoint && !j->ckpt_final))
      return false;
    j->ckpt_attempt = ev->attempt;
    j->ckpt_step = ev->step;
    j->ckpt_bytes = ev->bytes;
    j->ckpt_final = ev->final_checkpoint;
    set_str(j->ckpt_key, sizeof j->ckpt_key, ev->object_key);
    set_str(j->ckpt_sha256, sizeof j->ckpt_sha256, ev->sha256_hex);
    return true;
  case LT_EV_ATTEMPT_STOPPED: {
    if (terminal || !live_attempt(j, ev->attempt)) return false;
    j->attempt_stopped = true;
    /* unavailable: the store was away — for the inputs (nothing ran) or for a job's checkpoint
     * (what ran after its last commit is redone from it) — so it is counted apart from failures
     * (the scheduler's own bound) and leaves what the last attempt that ran left (a session's
     * restart: a session's upload that fails stops as failed); its detail says why the job waits */
    bool failed = ev->stop_reason == LT_STOP_LOST || ev->stop_reason == LT_STOP_FAILED,
         away = ev->stop_reason == LT_STOP_UNAVAILABLE;
    if (!away) j->last_stop_failed = failed;
    j->failed_attempts += failed;
    j->unavailable_stops += away;
    if ((failed || away) && ev->reason && *ev->reason) set_str(j->reason, sizeof j->reason, ev->reason);
    if (!j->cancel_requested) {
      j->state = LT_JOB_QUEUED;
      j->queued_at_ms = ev->occurred_at_ms;
    }
    return true;
  }
  case LT_EV_JOB_COMPLETED:
    if (terminal) return false;
    if (ev->attempt != j->attempt) return false; /* a fenced attempt cannot complete the job */
    /* A cancel recorded before the completion means cancelled (invariant 3). */
    if (j->cancel_requested)
      terminate(j, LT_JOB_CANCELLED, ev, "cancelled before the job completed");
    else
      terminate(j, LT_JOB_COMPLETED, ev, NULL);
    return true;
  case LT_EV_JOB_FAILED:
    if (terminal) return false;
    terminate(j, LT_JOB_FAILED, ev, ev->reason);
    return true;
  case LT_EV_JOB_CANCELLED:
    if (terminal) return false;
    j->cancel_requested = true;
    terminate(j, LT_JOB_CANCELLED, ev, ev->reason && *ev->reason ? ev->reason : "cancelled on request");
    return true;
  case LT_EV_CLEANUP_DONE:
    /* A fenced attempt's cleanup says nothing about the live one. */
    if (j->cleanup_done || (!terminal && ev->attempt != j->attempt)) return false;
    j->cleanup_done = true;
    return true;
  case LT_EV_SESSION_IDLE:
    /* Only the live attempt parks its session; it then stops like a preempted one. */
    if (terminal || ev->attempt != j->attempt || j->parked) return false;
    j->parked = true;
    j->parked_seq = ev->step;
    return true;
  case LT_EV_SESSION_WOKEN:
    /* A wake names the call it is for; one for a call at or before the park is an earlier park's,
     * written late (every API wakes a park once: one lagging on lathe.control wakes one that is
     * over), and would dispatch the session for nothing. */
    if (terminal || !j->parked || ev->step <= j->parked_seq) return false;
    j->parked = false;
    return true;
  case LT_EV__COUNT:
    break;
  }
  return false;
}

/* What fold() guarantees whatever the record, asserted around every step (docs/STYLE.md habit
 * 7): the attempt number, the failed and unavailable attempts and the checkpoint's attempt never
 * go down, a
 * cancel request is never withdrawn, and a terminal state never changes. */
typedef struct fold_mark {
  lt_job_state_t state;
  int32_t attempt, failed_attempts, unavailable_stops, ckpt_attempt;
  bool cancel_requested;
} fold_mark_t;

static fold_mark_t fold_mark(const lt_job_t *j) {
  return (fold_mark_t){j->state, j->attempt, j->failed_attempts, j->unavailable_stops, j->ckpt_attempt,
                       j->cancel_requested};
}

static bool fold_ok(const fold_mark_t *before, const lt_job_t *j) {
  return j->attempt >= before->attempt && j->failed_attempts >= before->failed_attempts &&
         j->unavailable_stops >= before->unavailable_stops &&
         j->ckpt_attempt >= before->ckpt_attempt && j->ckpt_attempt <= j->attempt &&
         (!before->cancel_requested || j->cancel_requested) &&
         (!lt_job_state_is_terminal(before->state) || j->state == before->state);
}

static lt_err_t check_id(const char *field, const char *v, bool required, char *errstr, size_t n) {
  if (!v || !*v) {
    if (!required) return LT_OK;
    return lt_errf(errstr, n, LT_ERR_INVALID, "field \"%s\" is missing or empty", field);
  }
  if (strlen(v) > LT_ID_MAX)
    return lt_errf(errstr, n, LT_ERR_INVALID, "field \"%s\" is longer than %d bytes", field,
                   LT_ID_MAX);
  return LT_OK;
}

/* The fields a JobSubmitted gives a job. */
static void seed(lt_job_t *j, const lt_job_event_t *ev) {
  set_str(j->base_model, sizeof j->base_model, ev->base_model);
  set_str(j->dataset_id, sizeof j->dataset_id, ev->dataset_id);
  j->job_class = (unsigned)ev->job_class < LT_CLASS__COUNT ? ev->job_class : LT_CLASS_STANDARD;
  j->gpus = ev->gpus > 0 ? ev->gpus : 1;
  j->max_duration_s = ev->max_duration_s;
  j->submitted_at_ms = ev->occurred_at_ms;
}

bool lt_job_reseed(lt_job_table_t *t, const lt_job_event_t *ev) {
  if (ev->type != LT_EV_JOB_SUBMITTED || !ev->job_id || !ev->tenant_id) return false;
  lt_job_t *j = *probe(t, ev->job_id);
  if (!j || !same_str(j->tenant_id, ev->tenant_id)) return false;
  seed(j, ev);
  return true;
}

lt_err_t lt_job_apply(lt_job_table_t *t, const lt_job_event_t *ev, lt_job_outcome_t *outcome,
                      char *errstr, size_t errstr_size) {
  lt_job_outcome_t dummy;
  if (!outcome) outcome = &dummy;
  *outcome = LT_JOB_IGNORED;
  if ((unsigned)ev->type >= LT_EV__COUNT)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "unknown record type %d", (int)ev->type);
  lt_err_t err = check_id("job_id", ev->job_id, true, errstr, errstr_size);
  if (!err) err = check_id("tenant_id", ev->tenant_id, ev->type == LT_EV_JOB_SUBMITTED, errstr, errstr_size);
  if (!err) err = check_id("worker_id", ev->worker_id, false, errstr, errstr_size);
  if (err) return err;

  lt_job_t **slot = probe(t, ev->job_id);
  if (!*slot) {
    if (ev->type != LT_EV_JOB_SUBMITTED) {
      *outcome = LT_JOB_UNKNOWN_JOB;
      return LT_OK;
    }
    if ((t->count + 1) * 2 > t->cap) {
      if ((err = grow(t))) return err;
      slot = probe(t, ev->job_id);
    }
    lt_job_t *j = calloc(1, sizeof *j);
    if (!j) return LT_ERR_NOMEM;
    set_str(j->job_id, sizeof j->job_id, ev->job_id);
    set_str(j->tenant_id, sizeof j->tenant_id, ev->tenant_id);
    seed(j, ev);
    j->state = LT_JOB_SUBMITTED;
    j->records = 1;
    *slot = j;
    t->count++;
    *outcome = LT_JOB_APPLIED;
    return LT_OK;
  }
  lt_job_t *j = *slot;
  /* Records name the job's tenant; one that names another tenant is not this job's. */
  if (ev->tenant_id && *ev->tenant_id && !same_str(j->tenant_id, ev->tenant_id)) return LT_OK;
  fold_mark_t before = fold_mark(j);
  if (fold(j, ev)) {
    j->records++;
    *outcome = LT_JOB_APPLIED;
  }
  assert(fold_ok(&before, j));
  return LT_OK;
}

static int cmp_job(const void *a, const void *b) {
  return strcmp((*(lt_job_t *const *)a)->job_id, (*(lt_job_t *const *)b)->job_id);
}

/* A sorted snapshot of the table's pointers; the caller frees it. */
static lt_job_t **sorted(const lt_job_table_t *t) {
  lt_job_t **v = malloc((t->count ? t->count : 1) * sizeof *v);
  if (!v) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i]) v[n++] = t->slots[i];
  assert(n == t->count);
  qsort(v, n, sizeof *v, cmp_job);
  return v;
}

void lt_job_foreach(const lt_job_table_t *t, bool (*fn)(const lt_job_t *, void *), void *ctx) {
  lt_job_t **v = sorted(t);
  if (!v) return;
  for (size_t i = 0; i < t->count; i++)
    if (!fn(v[i], ctx)) break;
  free(v);
}

void lt_job_scan(const lt_job_table_t *t, bool (*fn)(const lt_job_t *, void *), void *ctx) {
  for (size_t i = 0; i < t->cap; i++)
    if (t->slots[i] && !fn(t->slots[i], ctx)) return;
}

int lt_job_line(const lt_job_t *j, char *line, size_t n) {
  /* Every field of the state, in a fixed text form: the digest covers all of it. */
  return snprintf(line, n,
                  "%s|%s|%s|%s|%d|%d|%" PRId64 "|%d|%d|%d|%d|%d|%d|%d|%d|%s|%" PRId64 "|%" PRId64
                  "|%" PRId64 "|%" PRId64 "|%" PRId64 "|%d|%" PRId64 "|%" PRId64 "|%d|%s|%s|%s|%" PRIu64 "\n",
                  j->job_id, j->tenant_id, j->base_model, j->dataset_id, (int)j->job_class, j->gpus,
                  j->max_duration_s, (int)j->state, j->attempt, j->attempt_stopped, j->failed_attempts,
                  j->unavailable_stops, j->cancel_requested, j->cleanup_done, 0, j->worker_id, j->submitted_at_ms, j->queued_at_ms,
                  j->started_at_ms, j->lease_ms, j->ended_at_ms, j->ckpt_attempt, j->ckpt_step, j->ckpt_bytes,
                  j->ckpt_final, j->ckpt_key, j->ckpt_sha256, j->reason, j->records);
}

lt_err_t lt_job_digest(const lt_job_table_t *t, char out_hex[65]) {
  lt_job_t **v = sorted(t);
  if (!v) return LT_ERR_NOMEM;
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (!md || !EVP_DigestInit_ex(md, EVP_sha256(), NULL)) {
    free(v);
    EVP_MD_CTX_free(md);
    return LT_ERR_NOMEM;
  }
  char line[2048];
  for (size_t i = 0; i < t->count; i++) {
    int n = lt_job_line(v[i], line, sizeof line);
    EVP_DigestUpdate(md, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  }
  unsigned char d[32];
  unsigned dl = 0;
  EVP_DigestFinal_ex(md, d, &dl);
  EVP_MD_CTX_free(md);
  free(v);
  for (int i = 0; i < 32; i++) snprintf(out_hex + 2 * i, 3, "%02x", d[i]);
  return LT_OK;
}
