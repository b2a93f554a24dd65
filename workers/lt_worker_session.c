/* lt_worker_session: a session attempt's calls in, results out (see lt_worker_session.h). */
#include "lt_worker_session.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "lt_callspec.h"
#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_map.h"
#include "lt_sealed.h"
#include "lt_time.h"

/* A line about the session s: its id in a field of its own (lt_log.h). */
#define SESSION(s) (&(lt_log_ids_t){.session = (s)->job})

#define MAX_BODY ((size_t)64 << 20) /* the largest call body or state the worker reads */
#define MAX_AHEAD 8                 /* calls handed to the executor and not yet answered, at most */

/* A call's body in the store, to delete once the call is answered; a keyed call's leaves its
 * digest (lt_call_body_digest) for the API to compare a retry with. */
typedef struct {
  char key[512];
  char digest[65]; /* "" for a call without a key */
} body_t;

/* A result waiting for the outbound thread (a copy of the executor's line, or one made here). */
typedef struct result {
  int64_t seq, step, tokens;
  int32_t attempt; /* the attempt the answer is of: 0, this one */
  bool ok;
  double loss, grad_norm, duration_ms;
  char kind[32], code[24], field[96], reason[320];
  char name[64]; /* save_state, save_weights_for_sampler: the state's name */
  char *body;
  struct result *next;
} result_t;

struct lt_wsess {
  lt_wsess_conf_t c;
  char tenant[64], job[64], t_calls[128], t_progress[128], producer_id[160], mem_dir[720], key_id[64];
  lt_crypto_dek_t *dek;
  lt_avro_decoder_t *dec;      /* the inbound thread's */
  lt_map_t *keyed;             /* the inbound thread's: keyed call ids read (set) */
  lt_map_t *bodies;            /* under lock: seq -> body_t of a call's body, until the call is answered */
  lt_avro_record_t *rec;       /* the outbound thread's PrimitiveCompleted */
  pthread_t in_thr, out_thr;
  bool in_started, out_started;
  pthread_mutex_t lock, wlock; /* the fields below; the executor's stdin */
  pthread_cond_t cond;
  bool stop, fenced;
  int64_t ready_step;          /* -1 until the executor said it loaded its state */
  result_t *head, *tail;
  int64_t received, answered;  /* calls of the session read; calls answered (atomic) */
  int64_t last_ms, last_seq;   /* the newest call's arrival or answer; the newest answered (atomic) */
};

/* ---------------------------------------------------------------- results (outbound) */

static void push_result(lt_wsess_t *s, result_t *r) {
  pthread_mutex_lock(&s->lock);
  if (s->tail) s->tail->next = r;
  else s->head = r;
  s->tail = r;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static void free_result(result_t *r) {
  if (r->body) {
    OPENSSL_cleanse(r->body, strlen(r->body));
    free(r->body);
  }
  free(r);
}

static void answered(lt_wsess_t *s, int64_t seq) {
  __atomic_add_fetch(&s->answered, 1, __ATOMIC_RELAXED);
  __atomic_store_n(&s->last_ms, lt_time_wall_ms(), __ATOMIC_RELAXED);
  if (seq > __atomic_load_n(&s->last_seq, __ATOMIC_RELAXED)) __atomic_store_n(&s->last_seq, seq, __ATOMIC_RELAXED);
}

/* A failure made here (the call never reached the executor). */
static void fail_call(lt_wsess_t *s, int64_t seq, const char *kind, const char *code, int64_t step, const char *reason) {
  answered(s, seq);
  result_t *r = calloc(1, sizeof *r);
  if (!r) return;
  r->seq = seq;
  r->step = step;
  r->loss = r->grad_norm = NAN;
  snprintf(r->kind, sizeof r->kind, "%s", kind);
  snprintf(r->code, sizeof r->code, "%s", code);
  snprintf(r->reason, sizeof r->reason, "%s", reason);
  push_result(s, r);
}

#define SET(call)                                                                                                  \
  do {                                                                                                             \
    if (!err) err = (call);                                                                                        \
  } while (0)

static lt_err_t set_opt_string(lt_avro_record_t *rec, const char *path, const char *v) {
  return v && v[0] ? lt_avro_set_string(rec, path, v) : lt_avro_set_null(rec, path);
}

static lt_err_t set_opt_double(lt_avro_record_t *rec, const char *path, double v) {
  return isfinite(v) ? lt_avro_set_double(rec, path, v) : lt_avro_set_null(rec, path);
}

/* The call's answer is in the log: no attempt reads its body again (a later one resumes from a
 * state saved after it, or fails it as session_restarted), so the body goes now rather than
 * with the session, and a long session's call bodies do not pile up in the store. A keyed call's
 * digest goes in first, so that a retry read between the two finds one of them. */
static void drop_body(lt_wsess_t *s, int64_t seq) {
  char k[24], err[256], dkey[sizeof ((body_t *)0)->key + 8];
  snprintf(k, sizeof k, "%lld", (long long)seq);
  pthread_mutex_lock(&s->lock);
  body_t *b = lt_map_get(s->bodies, k), copy = b ? *b : (body_t){0};
  lt_map_del(s->bodies, k);
  pthread_mutex_unlock(&s->lock);
  if (!copy.key[0]) return;
  lt_call_digest_key(dkey, sizeof dkey, copy.key);
  lt_err_t e = copy.digest[0] ? lt_sealed_put(s->c.store, s->dek, dkey, copy.digest, 64, NULL, err, sizeof err) : LT_OK;
  if (!e) e = lt_store_delete(s->c.store, copy.key, err, sizeof err);
  if (e)
    lt_log(LT_LOG_WARN, "worker", SESSION(s), "%s: the body of call %lld stays until the session is swept: %s", s->job,
           (long long)seq, err);
}

/* Seals the result's body into the store, then records PrimitiveCompleted (acks=all). */
static void record_result(lt_wsess_t *s, result_t *r) {
  char key[512] = "", sha_hex[65] = "", err_msg[512];
  size_t len = r->body ? strlen(r->body) : 0;
  if (r->body) {
    uint8_t sha[32];
    snprintf(key, sizeof key, "sessions/%s/%s/results/%lld", s->tenant, s->job, (long long)r->seq);
    if (lt_sealed_put(s->c.store, s->dek, key, r->body, len, sha, err_msg, sizeof err_msg)) {
      lt_log(LT_LOG_ERROR, "worker", SESSION(s), "%s: the result of call %lld was not stored: %s", s->job,
             (long long)r->seq, err_msg);
      r->ok = false;
      snprintf(r->code, sizeof r->code, "internal");
      snprintf(r->reason, sizeof r->reason, "the call ran, but its result could not be stored");
      key[0] = '\0';
      len = 0;
    } else {
      lt_crypto_hex(sha, 32, sha_hex);
    }
  }
  lt_avro_record_t *rec = s->rec;
  lt_avro_record_clear(rec);
  lt_err_t err = lt_avro_record_stamp(rec, s->producer_id);
  SET(lt_avro_set_string(rec, "job_id", s->job));
  SET(lt_avro_set_string(rec, "tenant_id", s->tenant));
  SET(lt_avro_set_int(rec, "attempt", r->attempt ? r->attempt : s->c.attempt));
  SET(lt_avro_set_long(rec, "seq", r->seq));
  SET(lt_avro_set_enum(rec, "kind", r->kind));
  SET(lt_avro_set_enum(rec, "status", r->ok ? "done" : "failed"));
  SET(set_opt_string(rec, "error_code", r->ok ? NULL : r->code));
  SET(set_opt_string(rec, "error_field", r->ok ? NULL : r->field));
  SET(set_opt_string(rec, "error_reason", r->ok ? NULL : r->reason));
  SET(lt_avro_set_long(rec, "step", r->step));
  SET(lt_avro_set_long(rec, "tokens", r->tokens));
  SET(set_opt_double(rec, "loss", r->loss));
  SET(set_opt_double(rec, "grad_norm", r->grad_norm));
  SET(lt_avro_set_double(rec, "duration_ms", isfinite(r->duration_ms) ? r->duration_ms : 0));
  SET(set_opt_string(rec, "checkpoint_name", r->ok ? r->name : NULL));
  SET(set_opt_string(rec, "result_key", key));
  SET(set_opt_string(rec, "result_sha256", sha_hex));
  SET(lt_avro_set_long(rec, "result_bytes", (int64_t)len));
  const uint8_t *bytes;
  size_t blen;
  if (err || lt_avro_record_encode(rec, &bytes, &blen, err_msg, sizeof err_msg)) {
    lt_log_error("worker", "PrimitiveCompleted not built (a bug): %s", lt_avro_record_error(rec));
    return;
  }
  lt_bus_record_t br = {.topic = s->t_progress, .partition = LT_BUS_PARTITION_ANY, .key = s->job,
                        .key_size = strlen(s->job), .value = bytes, .value_size = blen};
  for (int tries = 0; tries < 3; tries++) {
    lt_err_t e = lt_bus_produce_sync(s->c.producer, &br, 3000, NULL, NULL, err_msg, sizeof err_msg);
    if (!e) {
      drop_body(s, r->seq);
      return;
    }
    if (e == LT_ERR_FATAL || e == LT_ERR_FENCED) break;
  }
  lt_log(LT_LOG_ERROR, "worker", SESSION(s), "%s: PrimitiveCompleted of call %lld not recorded: %s",
         s->job, (long long)r->seq, err_msg);
}

static void *outbound_main(void *arg) {
  lt_wsess_t *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->lock);
    while (!s->head && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
    result_t *r = s->head;
    if (r) {
      s->head = r->next;
      if (!s->head) s->tail = NULL;
    }
    bool fenced = s->fenced, stop = s->stop && !r;
    pthread_mutex_unlock(&s->lock);
    if (!r) {
      if (stop) return NULL;
      continue;
    }
    if (!fenced) record_result(s, r); /* what the executor answered is recorded, even while stopping */
    free_result(r);
  }
}

/* ---------------------------------------------------------------- calls (inbound) */

bool lt_wsess_write(lt_wsess_t *s, const char *line, size_t len) {
  pthread_mutex_lock(&s->wlock);
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(s->c.exec_fd, line + off, len - off);
    if (n > 0) {
      off += (size_t)n;
    } else if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = s->c.exec_fd, .events = POLLOUT};
      poll(&p, 1, 200);
    } else if (!(n < 0 && errno == EINTR)) {
      break;
    }
  }
  pthread_mutex_unlock(&s->wlock);
  return off == len;
}

static bool stopping(lt_wsess_t *s) {
  pthread_mutex_lock(&s->lock);
  bool stop = s->stop;
  pthread_mutex_unlock(&s->lock);
  return stop;
}

/* The optimizer step the executor resumed at, once it said (session_restarted names it). */
static int64_t wait_ready(lt_wsess_t *s) {
  pthread_mutex_lock(&s->lock);
  while (s->ready_step < 0 && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
  int64_t step = s->ready_step;
  pthread_mutex_unlock(&s->lock);
  return step;
}

/* load_state: the named state (a state.bin of this session's own checkpoints, as the API resolved
 * the name) fetched into the attempt's private directory; the body then names that file. */
static lt_err_t fetch_state(lt_wsess_t *s, int64_t seq, json_t *body, char *errstr, size_t n) {
  const char *key = json_string_value(json_object_get(body, "state_key"));
  char prefix[256];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/", s->tenant, s->job);
  size_t kl = key ? strlen(key) : 0;
  if (!key || strncmp(key, prefix, strlen(prefix)) != 0 || kl < 10 || strcmp(key + kl - 10, "/state.bin") != 0 ||
      strstr(key, ".."))
    return lt_errf(errstr, n, LT_ERR_INVALID, "the call names no state of this session");
  void *data = NULL;
  size_t len = 0;
  lt_err_t err = lt_sealed_get(s->c.store, s->dek, key, MAX_BODY * 64, &data, &len, errstr, n);
  if (err) return err;
  char file[64], path[800];
  snprintf(file, sizeof file, "load-%lld.bin", (long long)seq);
  snprintf(path, sizeof path, "%s/%s", s->mem_dir, file);
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  bool ok = fd >= 0 && write(fd, data, len) == (ssize_t)len &&
            (s->c.uid <= 0 || fchown(fd, (uid_t)s->c.uid, (gid_t)s->c.gid) == 0);
  if (fd >= 0) close(fd);
  OPENSSL_cleanse(data, len);
  free(data);
  if (!ok) return lt_errf(errstr, n, LT_ERR_IO, "cannot hand the state to the executor: %s", strerror(errno));
  json_object_del(body, "state_key");
  json_object_set_new(body, "state_file", json_string(file));
  return LT_OK;
}

/* The body of call seq goes once its answer is recorded (drop_body); digest: a keyed call's, or NULL. */
static void remember_body(lt_wsess_t *s, int64_t seq, const char *okey, const char *digest) {
  char k[24];
  body_t *b = calloc(1, sizeof *b);
  if (!b || strlen(okey) >= sizeof b->key) {
    free(b);
    return; /* kept until the sweep */
  }
  snprintf(b->key, sizeof b->key, "%s", okey);
  if (digest) snprintf(b->digest, sizeof b->digest, "%s", digest);
  snprintf(k, sizeof k, "%lld", (long long)seq);
  pthread_mutex_lock(&s->lock);
  if (lt_map_set(s->bodies, k, b) != LT_OK) free(b);
  pthread_mutex_unlock(&s->lock);
}

/* Is okey an object of this session's calls (the only bodies its worker reads or deletes)? */
static bool own_call_object(const lt_wsess_t *s, const char *okey) {
  char prefix[256];
  snprintf(prefix, sizeof prefix, "sessions/%s/%s/calls/", s->tenant, s->job);
  return strncmp(okey, prefix, strlen(prefix)) == 0 && !strstr(okey, "..");
}

/* The body of call seq (rec), fetched and opened into *body (NULL: the call has none), to go
 * once the call is answered. */
static lt_err_t open_body(lt_wsess_t *s, lt_avro_record_t *rec, int64_t seq, json_t **body, char *err, size_t n) {
  const char *okey = NULL;
  lt_avro_get_string(rec, "object_key", &okey, NULL);
  void *data = NULL;
  size_t len = 0;
  lt_err_t e = LT_OK;
  *body = NULL;
  if (okey && !own_call_object(s, okey))
    e = lt_errf(err, n, LT_ERR_INVALID, "the call's body is not this session's");
  else if (okey && !(e = lt_sealed_get(s->c.store, s->dek, okey, MAX_BODY, &data, &len, err, n)))
    *body = json_loadb(data, len, 0, NULL);
  if (okey && !e) {
    const char *call_id = NULL;
    char digest[65] = "";
    bool keyed = !lt_avro_get_string(rec, "call_id", &call_id, NULL) && lt_call_id_keyed(call_id);
    if (!keyed || (*body && lt_call_body_digest(*body, digest))) remember_body(s, seq, okey, keyed ? digest : NULL);
  }
  if (data) {
    OPENSSL_cleanse(data, len);
    free(data);
  }
  if (!e && okey && !*body) e = lt_errf(err, n, LT_ERR_CORRUPT, "the call's body is not JSON");
  return e;
}

/* One SessionCall of this session: its body fetched and opened, then a "call" line. */
static void forward_call(lt_wsess_t *s, lt_avro_record_t *rec, int64_t seq) {
  const char *kind = NULL;
  char err[512];
  lt_avro_get_enum(rec, "kind", &kind);
  if (!kind) return;
  json_t *body = NULL;
  lt_err_t e = open_body(s, rec, seq, &body, err, sizeof err);
  if (!e && strcmp(kind, "load_state") == 0) e = fetch_state(s, seq, body, err, sizeof err);
  char *text = !e && body ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (e) {
    lt_log(LT_LOG_ERROR, "worker", SESSION(s), "%s: call %lld not run: %s", s->job, (long long)seq, err);
    fail_call(s, seq, kind, "internal", wait_ready(s), "the call's body could not be read back from the store");
    return;
  }
  lt_proto_msg_t m = {.type = LT_PROTO_CALL, .call = {.seq = seq, .kind = kind, .body = text}};
  char *line = NULL;
  size_t ll = 0;
  if (lt_proto_encode(&m, &line, &ll) != LT_OK || !lt_wsess_write(s, line, ll))
    answered(s, seq); /* the executor is gone: the attempt ends, nothing is owed */
  if (line) OPENSSL_cleanse(line, ll);
  free(line);
  if (text) {
    OPENSSL_cleanse(text, strlen(text));
    free(text);
  }
}

/* The save call (save_state, save_weights_for_sampler) whose state this attempt resumed from,
 * after a lost attempt: that attempt committed the state and may have died before it recorded
 * the call's answer, which then never came (the call pending for good, and load_state not
 * finding the name). Answered again as that attempt (the API keeps an attempt's first answer of
 * a call, so one already recorded stands), from the call's body; a body already gone went with
 * the recorded answer (drop_body), and nothing is owed. */
static void answer_held_save(lt_wsess_t *s, lt_avro_record_t *rec, int64_t seq, const char *kind) {
  char err[512];
  json_t *body = NULL;
  lt_err_t e = open_body(s, rec, seq, &body, err, sizeof err);
  const char *name = json_string_value(json_object_get(body, "name"));
  result_t *r = !e && name ? calloc(1, sizeof *r) : NULL;
  if (e != LT_OK && e != LT_ERR_NOT_FOUND)
    lt_log(LT_LOG_WARN, "worker", SESSION(s), "%s: call %lld, whose state this attempt resumed, not answered: %s",
           s->job, (long long)seq, err);
  if (r && (r->step = wait_ready(s)) < 0) { /* stopped before its executor was ready: the next one answers */
    free(r);
    r = NULL;
  }
  if (r) {
    r->seq = seq;
    r->attempt = s->c.resume_attempt;
    r->ok = true;
    r->loss = r->grad_norm = NAN;
    snprintf(r->kind, sizeof r->kind, "%s", kind);
    snprintf(r->name, sizeof r->name, "%s", name);
    json_t *answer = json_pack("{s:s,s:I,s:I}", "name", name, "step", (json_int_t)r->step, "checkpoint", (json_int_t)seq);
    r->body = answer ? json_dumps(answer, JSON_COMPACT) : NULL;
    json_decref(answer);
    push_result(s, r);
  }
  json_decref(body);
}

/* The session's partition from its start; mark: the high watermark when this attempt began. */
static lt_err_t open_calls(lt_wsess_t *s, lt_bus_consumer_t **out, int64_t *mark, char *errstr, size_t n) {
  lt_err_t err = lt_bus_consumer_new(s->c.bus, NULL, out, errstr, n);
  if (err) return err;
  lt_bus_tp_t hw = {.topic = s->t_calls, .partition = lt_calls_partition(s->job)};
  lt_bus_tp_t at = hw;
  at.offset = s->c.since_ms - 60000; /* clocks of the API and the broker may differ a little */
  if ((err = lt_bus_consumer_watermarks(*out, &hw, 1, NULL, 10000, errstr, n)) ||
      (err = lt_bus_consumer_offsets_for_times(*out, &at, 1, 10000, errstr, n)))
    return err;
  *mark = hw.offset;
  /* No record at or after the start yet: begin at the watermark (a later one comes after it). */
  if (at.offset < 0) at.offset = hw.offset;
  return lt_bus_consumer_assign(*out, &at, 1, errstr, n);
}

static void *inbound_main(void *arg) {
  lt_wsess_t *s = arg;
  lt_bus_consumer_t *cons = NULL;
  int64_t mark = 0;
  char err[512];
  if (open_calls(s, &cons, &mark, err, sizeof err)) {
    lt_log(LT_LOG_ERROR, "worker", SESSION(s), "%s: cannot read the session's calls: %s", s->job, err);
    lt_bus_consumer_destroy(cons);
    return NULL; /* the calls wait; the session's attempt is ended by its own watchdog or a cancel */
  }
  size_t jl = strlen(s->job);
  while (!stopping(s)) {
    /* a partition's fetcher may stop behind the log (lt_bus.h): a look within 5 s of the last is free */
    size_t healed = 0;
    if (lt_bus_consumer_heal_stalls(cons, 10000, 500, &healed, err, sizeof err) == LT_OK && healed)
      lt_log(LT_LOG_WARN, "worker", SESSION(s), "%s: its calls stood still behind the log for 10 s: fetching again",
             s->job);
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(cons, 100, &m, NULL, 0) || !m) continue;
    size_t kl = 0, vl = 0;
    const void *k = lt_bus_msg_key(m, &kl), *v = lt_bus_msg_value(m, &vl);
    lt_avro_record_t *rec;
    int64_t seq = lt_bus_msg_offset(m) + 1; /* calls count from 1: 0 is "none" for checkpoints */
    /* The calls the resumed state holds are skipped unread, but for the one it was saved by: that
     * may be the end, whose final checkpoint was committed while the job's completion was not (the
     * lost attempt died between the two: chaos seed 6703); skipped, the session waited for calls
     * for good. Run again, it ends the session from that same state. */
    if (!k || kl != jl || memcmp(k, s->job, jl) != 0 || !v || lt_avro_decode(s->dec, v, vl, &rec, NULL, 0) ||
        strcmp(lt_avro_record_type(rec), "SessionCall") != 0)
      continue;
    const char *tenant = NULL, *kind = NULL, *call_id = NULL;
    if (lt_avro_get_string(rec, "tenant_id", &tenant, NULL) || strcmp(tenant, s->tenant) != 0) continue;
    /* A later record of a keyed call id (an Idempotency-Key retried, lt_job_record.h) is the call
     * already run or queued: never a second run. The ids held include the calls the resumed state
     * holds, which are read for this alone. */
    if (!lt_avro_get_string(rec, "call_id", &call_id, NULL) && lt_call_id_keyed(call_id)) {
      if (lt_map_has(s->keyed, call_id)) {
        lt_log(LT_LOG_INFO, "worker", SESSION(s), "%s: call %lld repeats call id %s: the first of it is the one run",
               s->job, (long long)seq, call_id);
        continue;
      }
      lt_map_set(s->keyed, call_id, NULL);
    }
    if (seq < s->c.resume_seq) continue;
    lt_avro_get_enum(rec, "kind", &kind);
    bool end = kind && strcmp(kind, "end") == 0;
    if (!lt_callspec_runs_after(kind, seq, s->c.resume_seq)) {
      if (seq == s->c.resume_seq && s->c.restarted && s->c.resume_attempt > 0 && lt_callspec_saves_state(kind))
        answer_held_save(s, rec, seq, kind);
      continue;
    }
    /* Back-pressure: a client may queue thousands of calls; the executor holds a few. */
    while (__atomic_load_n(&s->received, __ATOMIC_RELAXED) - __atomic_load_n(&s->answered, __ATOMIC_RELAXED) >=
               MAX_AHEAD &&
           !stopping(s))
      usleep(2000);
    __atomic_add_fetch(&s->received, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&s->last_ms, lt_time_wall_ms(), __ATOMIC_RELAXED);
    /* recorded before this attempt began: failed, since the lost attempt may have run it on a
     * state that is gone; but not an end, which needs nothing of that state and which a client
     * sends and forgets after its 202 (failing it left the session running for good: chaos seed
     * 5001) — it ends the session from the state this attempt resumed */
    if (s->c.restarted && seq <= mark && !end) {
      char why[256];
      int64_t step = wait_ready(s);
      snprintf(why, sizeof why,
               "the session's worker was lost while this call was queued or running; the session resumed from "
               "its newest saved state, at step %lld: resend the calls after that state",
               (long long)step);
      const char *okey = NULL;
      /* never read: it goes with the failure's record, but for a keyed call's (no digest is made
       * of a body not read; a retry of it compares with the body, kept until the sweep) */
      if (!lt_avro_get_string(rec, "object_key", &okey, NULL) && okey && own_call_object(s, okey) &&
          !(call_id && lt_call_id_keyed(call_id)))
        remember_body(s, seq, okey, NULL);
      fail_call(s, seq, kind ? kind : "forward", "session_restarted", step, why);
      continue;
    }
    forward_call(s, rec, seq);
  }
  lt_bus_consumer_destroy(cons);
  return NULL;
}

/* ---------------------------------------------------------------- the loop thread's side */

lt_err_t lt_wsess_start(const lt_wsess_conf_t *c, lt_wsess_t **out, char *errstr, size_t n) {
  *out = NULL;
  lt_wsess_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  s->c = *c;
  snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant_id);
  snprintf(s->job, sizeof s->job, "%s", c->job_id);
  snprintf(s->t_calls, sizeof s->t_calls, "%s", c->t_calls);
  snprintf(s->t_progress, sizeof s->t_progress, "%s", c->t_progress);
  snprintf(s->producer_id, sizeof s->producer_id, "%s", c->producer_id);
  snprintf(s->mem_dir, sizeof s->mem_dir, "%s", c->mem_dir);
  snprintf(s->key_id, sizeof s->key_id, "%s", c->key_id);
  s->ready_step = -1;
  s->last_ms = lt_time_wall_ms();
  s->last_seq = c->resume_seq;
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->wlock, NULL);
  pthread_cond_init(&s->cond, NULL);
  lt_err_t err = lt_crypto_dek_import(&s->dek, s->tenant, s->key_id, c->key, errstr, n);
  if (!err) err = lt_avro_decoder_new(c->registry, &s->dec, errstr, n);
  if (!err && !(s->keyed = lt_map_new(NULL))) err = LT_ERR_NOMEM;
  if (!err && !(s->bodies = lt_map_new(free))) err = LT_ERR_NOMEM;
  if (!err) err = lt_avro_record_new(c->registry, "PrimitiveCompleted", &s->rec, errstr, n);
  if (!err && pthread_create(&s->out_thr, NULL, outbound_main, s) == 0) s->out_started = true;
  if (!err && s->out_started && pthread_create(&s->in_thr, NULL, inbound_main, s) == 0) s->in_started = true;
  if (!err && !s->in_started) err = lt_errf(errstr, n, LT_ERR_IO, "cannot start the session's threads");
  if (err) {
    lt_wsess_destroy(s);
    return err;
  }
  *out = s;
  return LT_OK;
}

void lt_wsess_ready(lt_wsess_t *s, int64_t step) {
  pthread_mutex_lock(&s->lock);
  s->ready_step = step;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

void lt_wsess_result(lt_wsess_t *s, const lt_proto_result_t *r) {
  answered(s, r->seq);
  result_t *q = calloc(1, sizeof *q);
  if (!q) return;
  q->seq = r->seq;
  q->step = r->step;
  q->tokens = r->tokens;
  q->ok = r->ok;
  q->loss = r->loss;
  q->grad_norm = r->grad_norm;
  q->duration_ms = r->duration_ms;
  snprintf(q->kind, sizeof q->kind, "%s", r->kind ? r->kind : "");
  snprintf(q->code, sizeof q->code, "%s", r->error_code ? r->error_code : "internal");
  snprintf(q->field, sizeof q->field, "%s", r->error_field ? r->error_field : "");
  snprintf(q->reason, sizeof q->reason, "%s", r->error_reason ? r->error_reason : "");
  q->body = r->body ? strdup(r->body) : NULL;
  if (r->ok && r->body && strncmp(q->kind, "save_", 5) == 0) {
    json_t *b = json_loads(r->body, 0, NULL);
    const char *name = json_string_value(json_object_get(b, "name"));
    snprintf(q->name, sizeof q->name, "%s", name ? name : "");
    json_decref(b);
  }
  push_result(s, q);
}

void lt_wsess_fence(lt_wsess_t *s) {
  pthread_mutex_lock(&s->lock);
  s->fenced = true;
  pthread_mutex_unlock(&s->lock);
}

bool lt_wsess_busy(lt_wsess_t *s) {
  return __atomic_load_n(&s->received, __ATOMIC_RELAXED) > __atomic_load_n(&s->answered, __ATOMIC_RELAXED);
}

lt_err_t lt_wsess_park(lt_wsess_t *s, int64_t seq, char *errstr, size_t n) {
  lt_avro_record_t *rec = NULL;
  lt_err_t err = lt_avro_record_new(s->c.registry, "SessionIdle", &rec, errstr, n);
  if (!err) err = lt_avro_record_stamp(rec, s->producer_id);
  SET(lt_avro_set_string(rec, "job_id", s->job));
  SET(lt_avro_set_string(rec, "tenant_id", s->tenant));
  SET(lt_avro_set_int(rec, "attempt", s->c.attempt));
  SET(lt_avro_set_long(rec, "seq", seq));
  const uint8_t *bytes;
  size_t blen;
  if (!err) err = lt_avro_record_encode(rec, &bytes, &blen, errstr, n);
  lt_bus_record_t br = {.topic = s->c.t_control, .partition = LT_BUS_PARTITION_ANY, .key = s->job,
                        .key_size = strlen(s->job), .value = bytes, .value_size = blen};
  if (!err) err = lt_bus_produce_sync(s->c.producer, &br, 3000, NULL, NULL, errstr, n);
  lt_avro_record_destroy(rec);
  return err;
}

bool lt_wsess_idle(lt_wsess_t *s, int64_t now_ms, int64_t idle_ms, int64_t *last_seq) {
  if (idle_ms <= 0 || lt_wsess_busy(s) || now_ms - __atomic_load_n(&s->last_ms, __ATOMIC_RELAXED) < idle_ms)
    return false;
  *last_seq = __atomic_load_n(&s->last_seq, __ATOMIC_RELAXED);
  return true;
}

void lt_wsess_destroy(lt_wsess_t *s) {
  if (!s) return;
  pthread_mutex_lock(&s->lock);
  s->stop = true;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  if (s->in_started) pthread_join(s->in_thr, NULL);
  if (s->out_started) pthread_join(s->out_thr, NULL);
  for (result_t *r = s->head, *next; r; r = next) {
    next = r->next;
    free_result(r);
  }
  lt_avro_record_destroy(s->rec);
  lt_avro_decoder_destroy(s->dec);
  lt_map_destroy(s->keyed);
  lt_map_destroy(s->bodies);
  lt_crypto_dek_destroy(s->dek);
  pthread_mutex_destroy(&s->lock);
  pthread_mutex_destroy(&s->wlock);
  pthread_cond_destroy(&s->cond);
  free(s);
}
