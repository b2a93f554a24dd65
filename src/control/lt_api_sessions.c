/* lt_api_sessions: /v1/sessions, training sessions driven by the customer's own loop
 * (docs/DESIGN.md §5), and /v1/tokenize.
 *
 * A session is a job in mode interactive (id "ses-..."): created, admitted, scheduled, cancelled
 * and published like one. Its calls are asynchronous. POST .../calls checks the call
 * (lt_callspec.h: every field, token ids against the base model's vocabulary), seals its body
 * under the tenant's data key into the store (sessions/<tenant>/<id>/calls/<call id>) on the work
 * pool, then records a SessionCall in lathe.calls on the session's partition; once the broker has
 * it, the answer is 202 with the record's offset as the call's sequence number: calls run in that
 * order. The worker holding the session records each call's end as PrimitiveCompleted in
 * lathe.progress, with its result sealed in the store; GET .../calls/{seq} long-polls for it and
 * answers the result, opened. No call body or result is ever in a record.
 *
 * What a session's calls did is folded here from PrimitiveCompleted: per call its status, per
 * session the step its state is at and its saved states by name (load_state names them). The
 * first record of a call wins; a record of an attempt older than the session's current one is
 * ignored (invariant 2).
 *
 * A call sent with an Idempotency-Key gets a call id made from the tenant, the session and the
 * key (lt_call_id_for_key), so a retry whose first answer was lost names the same call on any API
 * process, after a restart too: this API reads lathe.calls back and keeps, per keyed id, the first
 * SessionCall that carried it. A retry of the same body answers that call's seq again; another
 * body under the same key is refused (422); a retry while the first is still being recorded here
 * is 409 with Retry-After. Where two records of one keyed id reach the log (two API processes at
 * once, or a retry after a delivery report that said "failed" for a record the broker kept), the
 * worker runs the first and skips the rest, and GET of a later one answers the first's result. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <openssl/crypto.h>

#include "lt_api_int.h"
#include "lt_callspec.h"
#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_time.h"

#define WAIT_DEFAULT_S 30
#define WAIT_MAX_S 60

bool lt_api_is_session_id(const char *id) {
  return strncmp(id, LT_API_SESSION_PREFIX, strlen(LT_API_SESSION_PREFIX)) == 0;
}

/* ---------------------------------------------------------------- parked sessions */

/* A parked session (it went idle: SessionIdle) is queued again by SessionWoken, which this API
 * writes when it sees a call after the one the session parked after: when it accepts one, when it
 * reads one (call_seen), when a client waits for one, and when it reads the park after such a
 * call. Once per park. */
static void wake_failed(lt_api_t *api, const char *key);
static void woken(lt_api_t *api, void *ctx, lt_err_t err, const char *msg) {
  char *key = ctx;
  if (err) {
    lt_log(LT_LOG_WARN, "api", &(lt_log_ids_t){.session = key},
           "SessionWoken for %s not recorded (tried again): %s", key, msg);
    lt_map_del(api->wakes, key);
    wake_failed(api, key);
  }
  free(key);
}

/* Writes SessionWoken for session j, parked before call seq; true when it is written or was for
 * this park already. */
static bool wake_parked(lt_api_t *api, const lt_job_t *j, int64_t seq) {
  if (!j || !j->parked || seq <= j->parked_seq || lt_job_state_is_terminal(j->state)) return false;
  char key[LT_ID_MAX + 32];
  snprintf(key, sizeof key, "%s:%lld", j->job_id, (long long)j->parked_seq);
  if (lt_map_has(api->wakes, key)) return true;
  lt_avro_record_t *rec = NULL;
  const uint8_t *bytes;
  size_t blen;
  lt_err_t err = lt_avro_record_new(api->reg, "SessionWoken", &rec, NULL, 0);
  if (!err) err = lt_avro_record_stamp(rec, api->conf.producer_id);
  if (!err) err = lt_avro_set_string(rec, "job_id", j->job_id);
  if (!err) err = lt_avro_set_string(rec, "tenant_id", j->tenant_id);
  if (!err) err = lt_avro_set_long(rec, "seq", seq);
  if (!err) err = lt_avro_record_encode(rec, &bytes, &blen, NULL, 0);
  char *ctx = err ? NULL : strdup(key);
  bool sent = ctx && lt_api_produce(api, api->topic_control, LT_BUS_PARTITION_ANY, j->job_id, bytes, blen, false,
                                    woken, ctx) == LT_OK;
  if (sent) lt_map_set(api->wakes, key, NULL);
  else free(ctx);
  lt_avro_record_destroy(rec);
  return sent;
}

/* ---------------------------------------------------------------- what the calls did */

/* A session's folded calls. */
typedef struct {
  json_t *calls;   /* seq (decimal) -> {seq, kind, status, error?, step, tokens, loss?, duration_ms,
                    *                   result_key?} */
  json_t *saved;   /* name -> {name, step, checkpoint, state_key} */
  json_t *keys;    /* "<tenant>/<call id>" -> {seq, object_key} of keyed calls: the first SessionCall of
                    * the id (seq 0 while this API records it) */
  json_t *dups;    /* seq (decimal) -> seq of the first call of its keyed id: a later record the worker
                    * does not run */
  int64_t step;    /* the step of the session's state after its newest call: */
  int32_t step_attempt; /* of the newest attempt's */
  int64_t step_seq;     /* newest call */
  int64_t completed;
  int64_t last_call;    /* seq of the newest SessionCall of the session read here (or made here) */
  int64_t last_run;     /* of those, the newest its worker runs (call_seen): what wakes a park */
  int64_t woken_for, woken_park; /* the last_run a wake was written for, and the park it woke */
} sess_fold_t;

static void fold_free(void *v) {
  sess_fold_t *f = v;
  json_decref(f->calls);
  json_decref(f->saved);
  json_decref(f->keys);
  json_decref(f->dups);
  free(f);
}

static sess_fold_t *fold_of(lt_api_t *api, const char *job_id, bool create) {
  if (!api->sessions) return NULL; /* shutting down: the producer's last delivery reports come after */
  sess_fold_t *f = lt_map_get(api->sessions, job_id);
  if (f || !create) return f;
  if (!(f = calloc(1, sizeof *f))) return NULL;
  f->calls = json_object();
  f->saved = json_object();
  f->keys = json_object();
  f->dups = json_object();
  if (!f->calls || !f->saved || !f->keys || !f->dups || lt_map_set(api->sessions, job_id, f)) {
    fold_free(f);
    return NULL;
  }
  return f;
}

/* The call a GET of seq answers: seq itself, or the first call of its keyed id when seq is a later
 * record of that id, which the worker skips. */
static int64_t first_of(const sess_fold_t *f, int64_t seq) {
  char key[32];
  snprintf(key, sizeof key, "%lld", (long long)seq);
  json_t *d = f ? json_object_get(f->dups, key) : NULL;
  return d ? (int64_t)json_integer_value(d) : seq;
}

/* Wakes parked session j for the newest call read here, once per call and park: a call its worker
 * never runs (another tenant's record read before the session was known) leaves it parked at the
 * same seq, not woken at each park. Not while catching up (lt_api_sessions_on_ready, after). */
static void wake_owed(lt_api_t *api, const lt_job_t *j, sess_fold_t *f) {
  if (!f || !j || !j->parked || !api->ready || (f->last_run == f->woken_for && j->parked_seq == f->woken_park)) return;
  if (wake_parked(api, j, f->last_run)) f->woken_for = f->last_run, f->woken_park = j->parked_seq;
}

/* A wakes key ("job:parked_seq") taken apart; false for one that is not. */
static bool wake_key_parse(const char *key, char job[LT_ID_MAX + 1], long long *seq) {
  const char *colon = strrchr(key, ':');
  size_t jl = colon ? (size_t)(colon - key) : 0;
  if (jl == 0 || jl > LT_ID_MAX) return false;
  memcpy(job, key, jl);
  job[jl] = '\0';
  *seq = strtoll(colon + 1, NULL, 10);
  return true;
}

/* A SessionWoken ("job:parked_seq") not written: the next prune tries again. */
static void wake_failed(lt_api_t *api, const char *key) {
  char job[LT_ID_MAX + 1];
  long long seq;
  sess_fold_t *f = wake_key_parse(key, job, &seq) ? fold_of(api, job, false) : NULL;
  if (f) f->woken_for = f->woken_park = 0;
}

bool lt_api_sessions_call_settled(lt_api_t *api, const char *job_id, int64_t seq) {
  const sess_fold_t *f = fold_of(api, job_id, false);
  char key[32];
  snprintf(key, sizeof key, "%lld", (long long)seq);
  return f && (json_object_get(f->calls, key) || first_of(f, seq) != seq);
}

json_t *lt_api_sessions_saved_names(lt_api_t *api, const char *job_id) {
  sess_fold_t *f = fold_of(api, job_id, false);
  json_t *names = json_array();
  const char *name;
  json_t *s;
  if (f) json_object_foreach(f->saved, name, s) json_array_append_new(names, json_string(name));
  return names;
}

const char *lt_api_sessions_saved(lt_api_t *api, const char *job_id, const char *name, int64_t *checkpoint) {
  sess_fold_t *f = fold_of(api, job_id, false);
  json_t *s = f ? json_object_get(f->saved, name) : NULL;
  if (!s) return NULL;
  *checkpoint = json_integer_value(json_object_get(s, "checkpoint"));
  return json_string_value(json_object_get(s, "state_key"));
}

/* A long poll on one call. */
struct lt_api_waiter {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  struct event *timer;
  char job_id[LT_ID_MAX + 1];
  char tenant[LT_ID_MAX + 1]; /* whose poll: counted against its held requests */
  int64_t seq;
  struct lt_api_waiter *next;
};

int lt_api_sessions_waiting_of(lt_api_t *api, const char *tenant) {
  int n = 0;
  for (lt_api_waiter_t *w = api->waiters; w; w = w->next) n += strcmp(w->tenant, tenant) == 0;
  return n;
}

static void answer_call(lt_api_t *api, struct evhttp_request *req, const lt_job_t *j, int64_t seq);

static void waiter_unlink(lt_api_t *api, lt_api_waiter_t *w) {
  for (lt_api_waiter_t **p = &api->waiters; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  lt_api_door_on_close(api, w->evcon, NULL, NULL);
  event_free(w->timer);
  free(w);
}

/* Answers every long poll of the job (seq < 0: whatever it waits for) with what is known now. */
static void wake(lt_api_t *api, const char *job_id, int64_t seq) {
  for (lt_api_waiter_t *w = api->waiters, *next; w; w = next) {
    next = w->next;
    if (strcmp(w->job_id, job_id) != 0 || (seq >= 0 && w->seq != seq)) continue;
    struct evhttp_request *req = w->req;
    int64_t s = w->seq;
    waiter_unlink(api, w);
    answer_call(api, req, lt_job_get(lt_proj_jobs(api->proj), job_id), s);
  }
}

void lt_api_sessions_on_record(lt_api_t *api, const lt_proj_result_t *res) {
  lt_avro_record_t *r = res->record;
  const char *job_id = NULL, *kind = NULL, *status = NULL, *s;
  int32_t attempt = 0;
  int64_t seq = 0, step = 0, tokens = 0;
  double d;
  lt_avro_get_string(r, "job_id", &job_id, NULL);
  lt_avro_get_int(r, "attempt", &attempt);
  lt_avro_get_long(r, "seq", &seq);
  lt_avro_get_enum(r, "kind", &kind);
  lt_avro_get_enum(r, "status", &status);
  const char *tenant = NULL;
  lt_avro_get_string(r, "tenant_id", &tenant, NULL);
  const lt_job_t *j = job_id ? lt_job_get(lt_proj_jobs(api->proj), job_id) : NULL;
  if (!j && job_id && lt_id_valid(job_id) && lt_api_is_session_id(job_id) && res->message) {
    lt_api_early_keep(api, job_id, res->message, res->message_len); /* its session is not read yet */
    return;
  }
  if (!j || !kind || !status || !tenant || strcmp(tenant, j->tenant_id) != 0) return; /* not this session's */
  sess_fold_t *f = fold_of(api, job_id, true);
  char key[32];
  snprintf(key, sizeof key, "%lld", (long long)seq);
  /* Per call, the newest attempt's record stands, whatever order the topics are read in: an
   * attempt resumed after a lost one answers again (session_restarted) the calls the lost one
   * ran on a state that is gone, and answers nothing the state it resumed holds, whose answers
   * (the lost attempt's, even folded after the new attempt began) stand. Within an attempt the
   * first record of a call wins. */
  json_t *had = f ? json_object_get(f->calls, key) : NULL;
  if (!f || (had && attempt <= json_integer_value(json_object_get(had, "attempt")))) return;
  if (had) { /* superseded: a state it saved is gone with its attempt */
    const char *name;
    json_t *sv, *tmp;
    json_object_foreach_safe(f->saved, tmp, name, sv) {
      if (json_integer_value(json_object_get(sv, "checkpoint")) == seq &&
          json_integer_value(json_object_get(sv, "attempt")) == json_integer_value(json_object_get(had, "attempt")))
        json_object_del(f->saved, name);
    }
  }
  lt_avro_get_long(r, "step", &step);
  lt_avro_get_long(r, "tokens", &tokens);
  json_t *c = json_pack("{s:I,s:s,s:s,s:I,s:I,s:i}", "seq", (json_int_t)seq, "kind", kind, "status", status, "step",
                        (json_int_t)step, "tokens", (json_int_t)tokens, "attempt", attempt);
  if (!lt_avro_get_double(r, "loss", &d)) json_object_set_new(c, "loss", json_real(d));
  if (!lt_avro_get_double(r, "grad_norm", &d)) json_object_set_new(c, "grad_norm", json_real(d));
  if (!lt_avro_get_double(r, "duration_ms", &d)) json_object_set_new(c, "duration_ms", json_real(d));
  if (!lt_avro_get_string(r, "result_key", &s, NULL)) json_object_set_new(c, "result_key", json_string(s));
  if (strcmp(status, "failed") == 0) {
    json_t *e = json_object();
    const char *names[3] = {"error_code", "error_field", "error_reason"}, *keys[3] = {"code", "field", "message"};
    char clean[1024]; /* an executor's reason may name its files (a state it could not load) */
    for (int i = 0; i < 3; i++)
      if (!lt_avro_get_string(r, names[i], &s, NULL)) {
        if (i == 2) lt_api_scrub(api, s, clean, sizeof clean);
        json_object_set_new(e, keys[i], json_string(i == 2 ? clean : s));
      }
    const char *code = json_string_value(json_object_get(e, "code"));
    if (code && strcmp(code, "session_restarted") == 0)
      json_object_set_new(e, "resumed_from_step", json_integer(step));
    json_object_set_new(c, "error", e);
  }
  if (strcmp(status, "done") == 0 && !lt_avro_get_string(r, "checkpoint_name", &s, NULL) && lt_id_valid(s)) {
    /* A saved state: load_state finds it by name, as the state file of the checkpoint numbered seq. */
    char skey[LT_STORE_KEY_MAX + 1];
    snprintf(skey, sizeof skey, "staging/%s/%s/%d/%lld/state.bin", j->tenant_id, job_id, (int)attempt, (long long)seq);
    json_object_set_new(f->saved, s,
                        json_pack("{s:s,s:I,s:I,s:s,s:i}", "name", s, "step", (json_int_t)step, "checkpoint",
                                  (json_int_t)seq, "state_key", skey, "attempt", attempt));
  }
  if (!had) f->completed++;
  json_object_set_new(f->calls, key, c);
  if (attempt > f->step_attempt || (attempt == f->step_attempt && seq > f->step_seq)) {
    f->step = step;
    f->step_attempt = attempt;
    f->step_seq = seq;
  }
  if (lt_callspec_saves_state(kind)) lt_api_saving_prune(api, tenant, NULL);
  wake(api, job_id, seq);
}

/* seq is a later record of the keyed call first: the worker skips it, so its long polls wait for
 * the first call's end. */
static void fold_dup(lt_api_t *api, sess_fold_t *f, const char *job_id, int64_t seq, int64_t first) {
  char key[32];
  snprintf(key, sizeof key, "%lld", (long long)seq);
  json_object_set_new(f->dups, key, json_integer(first));
  for (lt_api_waiter_t *w = api->waiters; w; w = w->next)
    if (w->seq == seq && strcmp(w->job_id, job_id) == 0) w->seq = first;
  snprintf(key, sizeof key, "%lld", (long long)first);
  if (json_object_get(f->calls, key)) wake(api, job_id, first);
}

/* A call of the session read here that its worker runs (not another tenant's record, nor a later
 * record of a keyed call): a session parked before it is woken (wake_owed). The worker may park a
 * moment after the call reached the log, before it read it; the API that took it then woke
 * nothing, nor did a poll without wait or a long poll on another API. */
static void call_seen(lt_api_t *api, sess_fold_t *f, const char *job_id, const char *tenant, int64_t seq) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job_id);
  if (j && strcmp(j->tenant_id, tenant) != 0) return;
  if (seq > f->last_call) f->last_call = seq;
  if (seq > f->last_run) f->last_run = seq;
  wake_owed(api, j, f);
}

void lt_api_sessions_on_ready(lt_api_t *api) {
  lt_map_iter_t it = {0};
  while (lt_map_next(api->sessions, &it)) wake_owed(api, lt_job_get(lt_proj_jobs(api->proj), it.key), it.value);
}

void lt_api_sessions_on_call(lt_api_t *api, const lt_bus_msg_t *m) {
  size_t len = 0;
  const void *v = lt_bus_msg_value(m, &len);
  lt_avro_record_t *r;
  const char *job_id = NULL, *tenant = NULL, *call_id = NULL, *okey = NULL, *kind = NULL;
  size_t kl = 0;
  const void *mkey = lt_bus_msg_key(m, &kl);
  if (!v || lt_avro_decode(api->call_dec, v, len, &r, NULL, 0) ||
      strcmp(lt_avro_record_type(r), "SessionCall") != 0 || lt_avro_get_string(r, "call_id", &call_id, NULL) ||
      lt_avro_get_string(r, "job_id", &job_id, NULL) || lt_avro_get_string(r, "tenant_id", &tenant, NULL) ||
      !lt_id_valid(job_id) || !lt_id_valid(tenant))
    return;
  /* Only where the session's worker reads (its partition, its key): another record is never run. */
  if (!mkey || kl != strlen(job_id) || memcmp(mkey, job_id, kl) != 0 ||
      lt_bus_msg_partition(m) != lt_calls_partition(job_id))
    return;
  lt_avro_get_string(r, "object_key", &okey, NULL);
  int64_t seq = lt_bus_msg_offset(m) + 1; /* as the worker numbers calls */
  if (!lt_avro_get_enum(r, "kind", &kind) && lt_callspec_saves_state(kind))
    lt_api_saving_note(api, tenant, job_id, okey, seq);
  sess_fold_t *f = fold_of(api, job_id, true);
  if (!f) return;
  if (!lt_call_id_keyed(call_id)) { /* a call without a key: nothing more to remember */
    call_seen(api, f, job_id, tenant, seq);
    return;
  }
  char k[LT_ID_MAX + LT_CALL_ID_MAX + 2];
  snprintf(k, sizeof k, "%s/%s", tenant, call_id); /* another tenant's record of the id is not this one */
  json_t *e = json_object_get(f->keys, k);
  int64_t had = e ? (int64_t)json_integer_value(json_object_get(e, "seq")) : 0;
  if (had == seq) { /* this API's own record, already known from its delivery */
    call_seen(api, f, job_id, tenant, seq);
    return;
  }
  if (had > 0 && had < seq) { /* a later record of the id: its worker skips it */
    if (seq > f->last_call) f->last_call = seq; /* a long poll of it waits for the first */
    fold_dup(api, f, job_id, seq, had);
    return;
  }
  /* the first record of the id, or one before the record this API's delivery made known */
  json_t *n = json_pack("{s:I}", "seq", (json_int_t)seq);
  if (n && okey) json_object_set_new(n, "object_key", json_string(okey));
  if (n) json_object_set_new(f->keys, k, n);
  call_seen(api, f, job_id, tenant, seq);
  if (had > 0) fold_dup(api, f, job_id, had, seq);
}

/* ---------------------------------------------------------------- answers */

/* The call as GET answers it, without the store's key. New reference. */
static json_t *call_view(const json_t *c) {
  json_t *v = json_deep_copy(c);
  json_object_del(v, "result_key");
  json_object_del(v, "attempt");
  return v;
}

typedef struct {
  lt_api_t *api;
  struct evhttp_request *req;
  char tenant[LT_ID_MAX + 1], job_id[LT_ID_MAX + 1];
  const lt_crypto_dek_t *dek;
  char key[LT_STORE_KEY_MAX + 1];
  json_t *view;  /* the call as answered (call_view), made on the loop; the result goes in on the pool */
  char *text;    /* the whole answer, written on the pool: 20 MB of a sampling call's result took the
                  * event loop 0.4 s to write, for every GET of it */
  lt_err_t err;
  char msg[256];
} fetch_t;

/* A sealed JSON object of a session (a call's body or result), opened and parsed, its plaintext
 * scrubbed (any thread: the work pool). what names it in the error. */
static lt_err_t sealed_json(lt_api_t *api, const lt_crypto_dek_t *dek, const char *key, size_t max, const char *what,
                            json_t **out, char *msg, size_t n) {
  void *data = NULL;
  size_t len = 0;
  *out = NULL;
  lt_err_t err = lt_sealed_get(api->conf.store, dek, key, max, &data, &len, msg, n);
  if (!err && !(*out = json_loadb(data, len, 0, NULL))) err = lt_errf(msg, n, LT_ERR_CORRUPT, "%s is not JSON", what);
  if (data) OPENSSL_cleanse(data, len);
  free(data);
  return err;
}

static void fetch_work(void *arg) {
  fetch_t *f = arg;
  json_t *result = NULL;
  f->err = sealed_json(f->api, f->dek, f->key, (size_t)256 << 20, "the stored result", &result, f->msg, sizeof f->msg);
  if (f->err) {
    json_decref(f->view);
  } else {
    json_object_set_new(f->view, "result", result);
    if (!(f->text = lt_api_json_text(f->view))) f->err = LT_ERR_NOMEM; /* takes the view */
  }
  f->view = NULL;
}

static void fetch_after(lt_api_t *api, void *arg) {
  fetch_t *f = arg;
  if (f->err) lt_api_reply_store_err(f->req, f->err, "the call's result cannot be read now; retry");
  else lt_api_reply_text(f->req, 200, f->text);
  free(f);
}

/* Answers GET .../calls/{seq} with what is known now: the result (read from the store), the
 * failure, "pending", or the session's end. */
static void answer_call(lt_api_t *api, struct evhttp_request *req, const lt_job_t *j, int64_t seq) {
  sess_fold_t *f = j ? fold_of(api, j->job_id, false) : NULL;
  seq = first_of(f, seq);
  char key[32];
  snprintf(key, sizeof key, "%lld", (long long)seq);
  json_t *c = f ? json_object_get(f->calls, key) : NULL;
  if (!c) {
    bool ended = !j || lt_job_state_is_terminal(j->state);
    json_t *o = json_pack("{s:I,s:s}", "seq", (json_int_t)seq, "status", ended ? "failed" : "pending");
    if (ended)
      json_object_set_new(o, "error",
                          json_pack("{s:s,s:s}", "code", "session_ended", "message",
                                    "the session ended before this call ran"));
    lt_api_reply_json(req, 200, o);
    return;
  }
  const char *rkey = json_string_value(json_object_get(c, "result_key"));
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), j->tenant_id);
  if (!rkey || !t) {
    lt_api_reply_json(req, 200, call_view(c));
    return;
  }
  fetch_t *ft = calloc(1, sizeof *ft);
  char msg[256];
  if (!ft || lt_keyring_tenant_dek(api->keyring, t, &ft->dek, msg, sizeof msg)) {
    free(ft);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the tenant's key cannot be opened now; retry");
    return;
  }
  ft->api = api;
  ft->req = req;
  ft->view = call_view(c);
  snprintf(ft->job_id, sizeof ft->job_id, "%s", j->job_id);
  snprintf(ft->key, sizeof ft->key, "%s", rkey);
  lt_api_work(api, j->tenant_id, fetch_work, fetch_after, ft);
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg) {
  lt_api_waiter_t *w = arg;
  lt_api_t *api = w->api;
  struct evhttp_request *req = w->req;
  int64_t seq = w->seq;
  char job[LT_ID_MAX + 1];
  snprintf(job, sizeof job, "%s", w->job_id);
  waiter_unlink(api, w);
  answer_call(api, req, lt_job_get(lt_proj_jobs(api->proj), job), seq);
}

static void waiter_closed(void *arg) {
  lt_api_waiter_t *w = arg;
  w->evcon = NULL; /* the connection is going: lt_api_door_on_close must not be called for it */
  lt_api_door_release(w->req);
  for (lt_api_waiter_t **p = &w->api->waiters; *p; p = &(*p)->next)
    if (*p == w) {
      *p = w->next;
      break;
    }
  event_free(w->timer);
  free(w);
}

/* GET /v1/sessions/{id}/calls/{seq}?wait=S */
void lt_api_sessions_call_show(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  char *end;
  long long seq = strtoll(c->name, &end, 10);
  if (!c->name[0] || *end || seq < 0) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "no call %.40s in session %s (calls are numbered by their seq)",
                       c->name, c->job->job_id);
    return;
  }
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  const char *v = lt_api_query(&q, "wait");
  long wait = v ? strtol(v, &end, 10) : WAIT_DEFAULT_S;
  bool bad = v && (*end || wait < 0 || wait > WAIT_MAX_S);
  evhttp_clear_headers(&q);
  if (bad) {
    lt_api_reply_error(c->req, 400, "invalid", "wait", "wait must be a whole number of seconds from 0 to %d", WAIT_MAX_S);
    return;
  }
  sess_fold_t *f = fold_of(api, c->job->job_id, false);
  seq = first_of(f, seq);
  char key[32];
  snprintf(key, sizeof key, "%lld", seq);
  if (wait == 0 || (f && json_object_get(f->calls, key)) || lt_job_state_is_terminal(c->job->state)) {
    answer_call(api, c->req, c->job, seq);
    return;
  }
  const lt_tenant_key_t *k = lt_tenant_key(c->tenant, c->key_id);
  /* Only a call the session has (read here, or made here) wakes it: a poll of a number it never
   * had (calls are numbered by their offset in a partition sessions share) re-dispatched a parked
   * session, a slot and a checkpoint each time, for nothing. Its own POST woke it anyway. */
  bool wakes = k && k->role != LT_TENANT_ROLE_VIEWER && f && seq <= f->last_call;
  if (wakes) wake_parked(api, c->job, seq); /* a call waits: a parked session must run again */
  if (!lt_api_hold_room(api, c->req, c->tenant->tenant_id)) return;
  lt_api_waiter_t *w = calloc(1, sizeof *w);
  struct evhttp_connection *evcon = evhttp_request_get_connection(c->req);
  if (!w || !(w->timer = evtimer_new(api->base, waiter_timeout, w)) || !lt_api_door_on_close(api, evcon, waiter_closed, w)) {
    if (w && w->timer) event_free(w->timer);
    free(w);
    answer_call(api, c->req, c->job, seq);
    return;
  }
  w->api = api;
  w->req = c->req;
  w->evcon = evcon;
  w->seq = seq;
  snprintf(w->job_id, sizeof w->job_id, "%s", c->job->job_id);
  snprintf(w->tenant, sizeof w->tenant, "%s", c->tenant->tenant_id);
  w->next = api->waiters;
  api->waiters = w;
  struct timeval tv = {wait, 0};
  evtimer_add(w->timer, &tv);
}

/* The session's end (a cancel, a failure, the end call) answers every long poll of it. */
void lt_api_sessions_on_job(lt_api_t *api, const char *job_id) {
  lt_api_early_release(api, job_id);
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job_id);
  if (j && lt_job_state_is_terminal(j->state) && api->waiters) wake(api, job_id, -1);
  if (j && j->parked) { /* a call read here after the park wakes it, whoever waits (call_seen) */
    wake_owed(api, j, fold_of(api, job_id, false));
  } else if (j) { /* woken (or dispatched): a later park at the same seq is another park */
    char key[LT_ID_MAX + 32];
    snprintf(key, sizeof key, "%s:%lld", job_id, (long long)j->parked_seq);
    lt_map_del(api->wakes, key);
  }
}

#define FORGET_AFTER_MS (3600 * 1000) /* as the publisher's GC grace: results are gone by then */

void lt_api_sessions_prune(lt_api_t *api) {
  lt_map_iter_t it = {0};
  char doomed[64][LT_ID_MAX + 1];
  int n = 0;
  int64_t now = lt_time_wall_ms();
  while (n < 64 && lt_map_next(api->sessions, &it)) {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), it.key);
    /* unknown: a record of a session the feed has not read yet while it catches up (lathe.calls
     * and lathe.jobs are read in no fixed order), else one of none */
    if ((!j && api->ready) || (j && lt_job_state_is_terminal(j->state) && now - j->ended_at_ms > FORGET_AFTER_MS))
      snprintf(doomed[n++], LT_ID_MAX + 1, "%s", it.key);
  }
  for (int i = 0; i < n; i++) lt_map_del(api->sessions, doomed[i]);
  /* A park woken is remembered while the session stays parked there (once per park); after that
   * its key only grew the set, one per park of every session for the process's life. */
  lt_map_iter_t wt = {0};
  char stale[64][LT_ID_MAX + 32];
  n = 0;
  while (n < 64 && lt_map_next(api->wakes, &wt)) {
    char job[LT_ID_MAX + 1];
    long long seq = -1;
    const lt_job_t *j = wake_key_parse(wt.key, job, &seq) ? lt_job_get(lt_proj_jobs(api->proj), job) : NULL;
    if (!j || !j->parked || j->parked_seq != seq || lt_job_state_is_terminal(j->state))
      snprintf(stale[n++], sizeof stale[0], "%s", wt.key);
  }
  for (int i = 0; i < n; i++) lt_map_del(api->wakes, stale[i]);
  lt_map_iter_t ot = {0}; /* a wake that was not written is tried again */
  while (lt_map_next(api->sessions, &ot)) wake_owed(api, lt_job_get(lt_proj_jobs(api->proj), ot.key), ot.value);
  lt_api_early_prune(api);
  lt_map_iter_t st = {0};
  while (lt_map_next(api->saving, &st)) lt_api_saving_prune(api, st.key, NULL); /* it may delete the current key */
}

void lt_api_sessions_free(lt_api_t *api) {
  while (api->waiters) {
    lt_api_waiter_t *w = api->waiters;
    api->waiters = w->next;
    lt_api_door_on_close(api, w->evcon, NULL, NULL);
    event_free(w->timer);
    free(w);
  }
  lt_map_destroy(api->sessions);
  lt_map_destroy(api->wakes);
  lt_api_early_free(api);
  lt_avro_decoder_destroy(api->call_dec);
  api->call_dec = NULL;
  api->sessions = NULL;
  api->wakes = NULL;
}

lt_err_t lt_api_sessions_start(lt_api_t *api, char *errstr, size_t n) {
  api->sessions = lt_map_new(fold_free);
  api->wakes = lt_map_new(NULL);
  if (!api->sessions || !api->wakes) return LT_ERR_NOMEM;
  lt_bus_topic_name(api->conf.bus, "calls", api->topic_calls, sizeof api->topic_calls);
  lt_err_t err = lt_api_early_start(api, errstr, n);
  if (!err) err = lt_avro_decoder_new(api->reg, &api->call_dec, errstr, n);
  return err ? err : lt_avro_record_new(api->reg, "SessionCall", &api->rec_call, errstr, n);
}

/* ---------------------------------------------------------------- a session */

bool lt_api_sessions_resolve(lt_api_call_t *c) {
  const lt_job_t *j = lt_id_valid(c->id) && lt_api_is_session_id(c->id) ? lt_job_get(lt_proj_jobs(c->api->proj), c->id)
                                                                        : NULL;
  if (j && strcmp(j->tenant_id, c->tenant->tenant_id) == 0) c->job = j;
  if (c->job) return !lt_api_job_gone(c, "session"); /* deleted: 410, but to the DELETE that finishes it */
  lt_api_reply_error(c->req, 404, "not_found", NULL, "no session %s for this tenant",
                     lt_id_valid(c->id) ? c->id : "(invalid id)");
  return false;
}

/* A session as GET shows it: the job, and where its calls stand. */
static json_t *session_json(lt_api_t *api, const lt_job_t *j) {
  json_t *o = lt_api_job_json(api, j);
  sess_fold_t *f = fold_of(api, j->job_id, false);
  json_t *saved = json_array();
  const char *name;
  json_t *s;
  if (f) json_object_foreach(f->saved, name, s)
      json_array_append_new(saved, json_pack("{s:O,s:O}", "name", json_object_get(s, "name"), "step", json_object_get(s, "step")));
  json_object_set_new(o, "object", json_string("session"));
  json_object_set_new(o, "step", json_integer(f ? f->step : 0));
  json_object_set_new(o, "calls_completed", json_integer(f ? f->completed : 0));
  json_object_set_new(o, "saved", saved);
  json_object_set_new(o, "idle", json_boolean(j->parked)); /* parked: holds no slot until a call */
  return o;
}

void lt_api_sessions_show(lt_api_call_t *c) { lt_api_reply_json(c->req, 200, session_json(c->api, c->job)); }

/* The body of POST /v1/sessions as a job spec (mode interactive): its errors name the session's
 * fields (lora.rank), not the spec's. */
static bool session_spec(lt_api_t *api, struct evhttp_request *req, lt_jobspec_t *spec) {
  size_t len;
  char *text = lt_api_body_text(api, req, &len);
  if (!text) return false;
  json_error_t je;
  json_t *body = json_loadb(text, len, 0, &je);
  free(text);
  char field[96] = "", msg[256] = "";
  lt_err_t err = body && json_is_object(body) ? LT_OK : LT_ERR_INVALID;
  if (err) snprintf(msg, sizeof msg, "the body must be a JSON object%s%s", body ? "" : ": ", body ? "" : je.text);
  json_t *js = json_pack("{s:s,s:o}", "mode", "interactive", "hyperparameters", json_object());
  json_t *hp = json_object_get(js, "hyperparameters");
  const char *k;
  json_t *v;
  if (!err) json_object_foreach(body, k, v) {
      if (strcmp(k, "base_model") == 0 || strcmp(k, "priority") == 0 || strcmp(k, "max_duration_s") == 0)
        json_object_set(js, k, v);
      else if (strcmp(k, "seed") == 0) json_object_set(hp, "seed", v);
      else if (strcmp(k, "lora") == 0 && json_is_object(v)) {
        const char *lk;
        json_t *lv;
        json_object_foreach(v, lk, lv) {
          char hk[64];
          snprintf(hk, sizeof hk, "%s%s", strcmp(lk, "targets") == 0 ? "" : "lora_",
                   strcmp(lk, "targets") == 0 ? "target_modules" : lk);
          json_object_set(hp, hk, lv);
        }
      } else {
        snprintf(field, sizeof field, "%s", k);
        snprintf(msg, sizeof msg, "%s: unknown field (a session takes base_model, lora {rank, alpha, dropout, "
                                  "targets}, seed, priority, max_duration_s)", k);
        err = LT_ERR_INVALID;
        break;
      }
    }
  if (!err) err = lt_jobspec_from_json(js, spec, field, sizeof field, msg, sizeof msg);
  json_decref(js);
  json_decref(body);
  if (!err) return true;
  /* hyperparameters.lora_rank -> lora.rank, hyperparameters.target_modules -> lora.targets */
  char shown[96];
  if (strncmp(field, "hyperparameters.lora_", 21) == 0) snprintf(shown, sizeof shown, "lora.%s", field + 21);
  else if (strcmp(field, "hyperparameters.target_modules") == 0) snprintf(shown, sizeof shown, "lora.targets");
  else if (strncmp(field, "hyperparameters.", 16) == 0) snprintf(shown, sizeof shown, "%s", field + 16);
  else snprintf(shown, sizeof shown, "%s", field);
  lt_api_reply_error(req, 400, "invalid", shown[0] ? shown : NULL, "%s", msg);
  return false;
}

/* POST /v1/sessions */
void lt_api_sessions_create(lt_api_call_t *c) {
  lt_jobspec_t spec;
  if (!session_spec(c->api, c->req, &spec)) return;
  lt_api_jobs_submit_spec(c, &spec); /* the Idempotency-Key and the tenant's limits, as for a job */
}

/* ---------------------------------------------------------------- calls in */

typedef struct {
  lt_api_t *api;
  struct evhttp_request *req;
  char tenant[LT_ID_MAX + 1], job_id[LT_ID_MAX + 1], call_id[LT_CALL_ID_MAX], kind[32];
  char keyed[LT_ID_MAX + LT_CALL_ID_MAX + 2]; /* "<tenant>/<call id>" of a call with an Idempotency-Key */
  const lt_crypto_dek_t *dek;
  char *body;            /* plaintext, scrubbed once sealed */
  size_t len;
  char key[LT_STORE_KEY_MAX + 1];
  char sha_hex[65];
  int examples;
  uint64_t quota, artifacts; /* a call that saves a state: the tenant's storage quota (0: none) */
  uint32_t saving;           /* and its saving calls taken before this one, not completed, */
  uint64_t saving_bytes;     /* and what their checkpoints write at least, where known */
  bool measured;             /* and the tenant's stored bytes, measured on the pool: */
  uint64_t stored, since, ckpt_max;
  bool wrote;                /* the body is in the store (the measure came before it) */
  lt_err_t err;
  char msg[512];
} call_in_t;

/* The keyed call's entry while this API records it (seq 0); NULL once a record of the id is known. */
static json_t *pending_key(lt_api_t *api, const call_in_t *ci) {
  sess_fold_t *f = ci->keyed[0] ? fold_of(api, ci->job_id, false) : NULL;
  json_t *e = f ? json_object_get(f->keys, ci->keyed) : NULL;
  return e && json_integer_value(json_object_get(e, "seq")) == 0 ? e : NULL;
}

/* Also frees the key of a keyed call that was not recorded: a retry records it then; and forgets a
 * saving call that was not. */
static void call_in_free(call_in_t *ci) {
  if (pending_key(ci->api, ci)) json_object_del(fold_of(ci->api, ci->job_id, false)->keys, ci->keyed);
  json_t *saving = ci->key[0] ? lt_api_saving_of(ci->api, ci->tenant, false) : NULL;
  if (json_integer_value(json_object_get(json_object_get(saving, ci->key), "seq")) == 0)
    json_object_del(saving, ci->key); /* not recorded (nothing when it is not there) */
  if (ci->body) {
    OPENSSL_cleanse(ci->body, ci->len);
    free(ci->body);
  }
  free(ci);
}

/* 202: the call is durable, and runs as call seq. replayed: a retry with the call's Idempotency-Key. */
static void reply_queued(struct evhttp_request *req, const char *job_id, int64_t seq, const char *kind, bool replayed) {
  char rid[LT_ID_MAX + 32];
  snprintf(rid, sizeof rid, "%s:%lld", job_id, (long long)seq);
  if (replayed) evhttp_add_header(evhttp_request_get_output_headers(req), "Idempotent-Replayed", "true");
  lt_api_reply_json(req, 202, json_pack("{s:s,s:I,s:s}", "request_id", rid, "seq", (json_int_t)seq, "kind", kind));
}

static void produced(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  call_in_t *ci = arg;
  (void)msg;
  if (err) {
    lt_api_reply_err(ci->req, LT_ERR_UNAVAILABLE, NULL, "the call could not be recorded durably; it was not queued, retry");
    call_in_free(ci);
    return;
  }
  int64_t seq = api->done_offset + 1, first = seq; /* the worker numbers calls so too (lt_worker_session.c) */
  json_t *e = pending_key(api, ci);
  if (e) { /* known here before the feed reads the record back */
    json_object_set_new(e, "seq", json_integer(seq));
    if (ci->key[0]) json_object_set_new(e, "object_key", json_string(ci->key)); /* an end has none */
  } else if (ci->keyed[0]) { /* the feed read a record of the id first: this one is a later one */
    sess_fold_t *f = fold_of(api, ci->job_id, false);
    json_t *k = f ? json_object_get(f->keys, ci->keyed) : NULL;
    int64_t had = k ? (int64_t)json_integer_value(json_object_get(k, "seq")) : 0;
    if (had > 0 && had < seq) {
      first = had;
      fold_dup(api, f, ci->job_id, seq, had);
    }
  }
  json_t *sv = ci->key[0] ? json_object_get(lt_api_saving_of(api, ci->tenant, false), ci->key) : NULL;
  if (sv) json_object_set_new(sv, "seq", json_integer(seq)); /* counted until its PrimitiveCompleted */
  sess_fold_t *lf = fold_of(api, ci->job_id, true);
  if (lf && seq > lf->last_call) lf->last_call = seq;
  wake_parked(api, lt_job_get(lt_proj_jobs(api->proj), ci->job_id), first);
  reply_queued(ci->req, ci->job_id, first, ci->kind, first != seq);
  call_in_free(ci);
}

/* The SessionCall of a sealed body (or of none), into the session's partition of lathe.calls. */
static void record_call(lt_api_t *api, call_in_t *ci) {
  lt_avro_record_t *rec = api->rec_call;
  lt_avro_record_clear(rec);
  lt_err_t err = lt_avro_record_stamp(rec, api->conf.producer_id);
  if (!err) err = lt_avro_set_string(rec, "job_id", ci->job_id);
  if (!err) err = lt_avro_set_string(rec, "tenant_id", ci->tenant);
  if (!err) err = lt_avro_set_string(rec, "call_id", ci->call_id);
  if (!err) err = lt_avro_set_enum(rec, "kind", ci->kind);
  if (!err) err = ci->key[0] ? lt_avro_set_string(rec, "object_key", ci->key) : lt_avro_set_null(rec, "object_key");
  if (!err) err = ci->key[0] ? lt_avro_set_string(rec, "sha256", ci->sha_hex) : lt_avro_set_null(rec, "sha256");
  if (!err) err = lt_avro_set_long(rec, "size_bytes", (int64_t)ci->len);
  if (!err) err = lt_avro_set_int(rec, "examples", ci->examples);
  const uint8_t *bytes;
  size_t blen;
  char m[256];
  if (!err) err = lt_avro_record_encode(rec, &bytes, &blen, m, sizeof m);
  if (err) {
    lt_api_reply_error(ci->req, 500, "internal", NULL, "cannot encode the call: %s", lt_avro_record_error(rec));
    call_in_free(ci);
    return;
  }
  if (lt_api_produce(api, api->topic_calls, lt_calls_partition(ci->job_id), ci->job_id, bytes, blen, false, produced,
                     ci)) {
    lt_api_reply_err(ci->req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the call now; it was not queued, retry");
    call_in_free(ci);
  }
}

static void seal_work(void *arg) {
  call_in_t *ci = arg;
  uint8_t sha[32];
  char why[96];
  snprintf(why, sizeof why, ", and a %s keeps a state while the session lives", ci->kind);
  if (ci->quota && !(ci->err = lt_api_stored_bytes(ci->api, ci->tenant, &ci->stored, &ci->since, &ci->ckpt_max, ci->msg,
                                                   sizeof ci->msg))) {
    ci->measured = true;
    ci->err = lt_api_storage_check(ci->quota, ci->tenant, ci->stored, ci->artifacts, 0, why, ci->msg, sizeof ci->msg);
    /* the saving calls taken before it write their states later: each counts as the tenant's
     * largest checkpoint stored now, or all as what their sessions' checkpoints write at least,
     * whichever is more (a first burst has no checkpoint stored) */
    uint64_t used = ci->stored + ci->artifacts, each = (uint64_t)ci->saving * ci->ckpt_max;
    uint64_t coming = each > ci->saving_bytes ? each : ci->saving_bytes;
    char per[160];
    if (each >= ci->saving_bytes)
      snprintf(per, sizeof per, "about %llu bytes each (its largest checkpoint stored now)",
               (unsigned long long)ci->ckpt_max);
    else
      snprintf(per, sizeof per, "at least %llu bytes in all (their sessions' adapters and optimizer states)",
               (unsigned long long)ci->saving_bytes);
    if (!ci->err && coming && used + coming >= ci->quota)
      ci->err = lt_errf(ci->msg, sizeof ci->msg, LT_ERR_QUOTA,
                        "tenant %s's storage quota max_storage_bytes is %llu bytes; it uses %llu, and the %u saving "
                        "call(s) taken before this %s and not completed will store %s: wait for them, or delete "
                        "datasets (DELETE /v1/datasets/{id}) or finished jobs and sessions (DELETE /v1/jobs/{id})",
                        ci->tenant, (unsigned long long)ci->quota, (unsigned long long)used, ci->saving, ci->kind, per);
  }
  if (ci->err) return;
  ci->err = lt_sealed_put(ci->api->conf.store, ci->dek, ci->key, ci->body, ci->len, sha, ci->msg, sizeof ci->msg);
  ci->wrote = !ci->err;
  if (!ci->err) lt_crypto_hex(sha, 32, ci->sha_hex);
}

static void seal_after(lt_api_t *api, void *arg) {
  call_in_t *ci = arg;
  /* The measure came before the body was written: once it was, the tenant's bytes are unknown
   * (whatever the call's kind: every body counts). */
  if (ci->measured || ci->wrote) lt_api_stored_note(api, ci->tenant, ci->since, !ci->wrote, ci->stored);
  if (ci->err == LT_ERR_QUOTA) {
    lt_api_reply_storage(ci->req, ci->msg);
    call_in_free(ci);
    return;
  }
  if (ci->err) {
    lt_api_reply_store_err(ci->req, ci->err, "the call could not be stored; it was not queued, retry");
    call_in_free(ci);
    return;
  }
  record_call(api, ci);
}

/* The request's body, up to LT_API_PART_MAX bytes (413 beyond). NULL after replying. */
static char *call_body(struct evhttp_request *req, size_t *len) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  *len = evbuffer_get_length(in);
  if (*len > LT_API_PART_MAX) {
    lt_api_reply_error(req, 413, "too_large", NULL, "a call's body is at most %u bytes; split the batch", LT_API_PART_MAX);
    return NULL;
  }
  char *s = malloc(*len + 1);
  if (!s) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  evbuffer_copyout(in, s, *len);
  s[*len] = '\0';
  return s;
}

/* A retry of a keyed call: the first call's body, read back from the store on the work pool, against
 * the retry's; once that body is gone (the call was answered), its digest against the retry's. */
typedef struct {
  lt_api_t *api;
  struct evhttp_request *req;
  const lt_crypto_dek_t *dek;
  char job_id[LT_ID_MAX + 1], kind[32], idem[LT_ID_MAX + 1], key[LT_STORE_KEY_MAX + 1];
  int64_t seq;
  json_t *body; /* the retry's, a copy the task owns */
  bool same;
  lt_err_t err;
  char msg[256];
} replay_t;

static void replay_work(void *arg) {
  replay_t *r = arg;
  json_t *first;
  r->err = sealed_json(r->api, r->dek, r->key, LT_API_PART_MAX + 4096, "the first call's body", &first, r->msg,
                       sizeof r->msg);
  if (first) { /* load_state's state key is the API's addition, not the client's */
    json_object_del(first, "state_key");
    json_object_del(r->body, "state_key");
    r->same = json_equal(first, r->body);
    json_decref(first);
  } else if (r->err == LT_ERR_NOT_FOUND) {
    char dkey[LT_STORE_KEY_MAX + 16], mine[65];
    void *d = NULL;
    size_t dl = 0;
    lt_call_digest_key(dkey, sizeof dkey, r->key);
    r->err = lt_sealed_get(r->api->conf.store, r->dek, dkey, 4096, &d, &dl, r->msg, sizeof r->msg);
    if (!r->err) r->same = dl == 64 && lt_call_body_digest(r->body, mine) && memcmp(d, mine, 64) == 0;
    free(d);
  }
}

static void replay_after(lt_api_t *api, void *arg) {
  replay_t *r = arg;
  if (r->err)
    lt_api_reply_store_err(r->req, r->err, "the call this Idempotency-Key recorded cannot be read back now; retry");
  else if (r->same)
    reply_queued(r->req, r->job_id, r->seq, r->kind, true);
  else
    lt_api_reply_error(r->req, 422, "idempotency_key_reused", "Idempotency-Key",
                       "Idempotency-Key %s was used for call %lld of session %s with a different body: send the "
                       "same call to get that one again, or use a new key for a new call",
                       r->idem, (long long)r->seq, r->job_id);
  json_decref(r->body);
  free(r);
}

/* A call whose Idempotency-Key named a call already (e: its entry in the session's keys). */
static void replay_call(lt_api_call_t *c, const char *kind, json_t *body, const char *idem, json_t *e) {
  int64_t seq = (int64_t)json_integer_value(json_object_get(e, "seq"));
  const char *okey = json_string_value(json_object_get(e, "object_key"));
  if (seq == 0) {
    evhttp_add_header(evhttp_request_get_output_headers(c->req), "Retry-After", "1");
    lt_api_reply_error(c->req, 409, "idempotency_key_in_use", "Idempotency-Key",
                       "a call with Idempotency-Key %s is being recorded now; retry to learn its seq", idem);
    return;
  }
  if (!body || !okey) { /* an end (the only call without a body) on one side: the same only if both */
    if (!body && !okey) reply_queued(c->req, c->job->job_id, seq, kind, true);
    else
      lt_api_reply_error(c->req, 422, "idempotency_key_reused", "Idempotency-Key",
                         "Idempotency-Key %s was used for call %lld of session %s, %s; this request is %s", idem,
                         (long long)seq, c->job->job_id, okey ? "a call with a body" : "its end",
                         body ? "a call with a body" : "its end");
    return;
  }
  replay_t *r = calloc(1, sizeof *r);
  char msg[256];
  if (!r || !(r->body = json_deep_copy(body))) {
    free(r);
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  if (lt_keyring_tenant_dek(c->api->keyring, c->tenant, &r->dek, msg, sizeof msg)) {
    json_decref(r->body);
    free(r);
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the tenant's key cannot be opened now; retry");
    return;
  }
  r->api = c->api;
  r->req = c->req;
  r->seq = seq;
  snprintf(r->job_id, sizeof r->job_id, "%s", c->job->job_id);
  snprintf(r->kind, sizeof r->kind, "%s", kind);
  snprintf(r->idem, sizeof r->idem, "%s", idem);
  snprintf(r->key, sizeof r->key, "%s", okey);
  lt_api_work(c->api, c->tenant->tenant_id, replay_work, replay_after, r);
}

/* The keyed call of c's session under Idempotency-Key idem: its id into call_id, its key in the
 * fold's keys into keyed, the session's fold (made when missing) into *f; the entry, or NULL when
 * no call of the key is known yet. */
static json_t *keyed_entry(lt_api_call_t *c, const char *idem, char call_id[LT_CALL_ID_MAX],
                           char keyed[LT_ID_MAX + LT_CALL_ID_MAX + 2], sess_fold_t **f) {
  lt_call_id_for_key(c->tenant->tenant_id, c->job->job_id, idem, call_id);
  snprintf(keyed, LT_ID_MAX + LT_CALL_ID_MAX + 2, "%s/%s", c->tenant->tenant_id, call_id);
  *f = fold_of(c->api, c->job->job_id, true);
  return *f ? json_object_get((*f)->keys, keyed) : NULL;
}

/* Queues one call of c's session: kind and body checked, the body sealed, then recorded. idem: the
 * request's Idempotency-Key, or NULL. */
static void queue_call(lt_api_call_t *c, const char *kind, json_t *body, const char *idem) {
  lt_api_t *api = c->api;
  char call_id[LT_CALL_ID_MAX], keyed[LT_ID_MAX + LT_CALL_ID_MAX + 2] = "";
  sess_fold_t *f = NULL;
  if (idem) { /* before the session's state: a retry after the end still learns its call's seq */
    json_t *e = keyed_entry(c, idem, call_id, keyed, &f);
    if (e) {
      replay_call(c, kind, body, idem, e);
      return;
    }
  }
  if (lt_job_state_is_terminal(c->job->state) || c->job->cancel_requested) {
    lt_api_reply_error(c->req, 409, "session_ended", NULL, "session %s is %s: it takes no more calls", c->job->job_id,
                       c->job->cancel_requested ? "being cancelled" : lt_job_state_name(c->job->state));
    return;
  }
  call_in_t *ci = calloc(1, sizeof *ci);
  char msg[256];
  if (!ci) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  ci->api = api;
  ci->req = c->req;
  snprintf(ci->tenant, sizeof ci->tenant, "%s", c->tenant->tenant_id);
  snprintf(ci->job_id, sizeof ci->job_id, "%s", c->job->job_id);
  snprintf(ci->kind, sizeof ci->kind, "%s", kind);
  char obj[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(obj);
  if (idem && f) { /* the body's object is the attempt's own: a retry's body never overwrites it */
    snprintf(ci->call_id, sizeof ci->call_id, "%s", call_id);
    snprintf(ci->keyed, sizeof ci->keyed, "%s", keyed);
    json_object_set_new(f->keys, keyed, json_pack("{s:i}", "seq", 0));
  } else {
    snprintf(ci->call_id, sizeof ci->call_id, "%s", obj);
  }
  if (!body) {
    record_call(api, ci);
    return;
  }
  ci->examples = (int)json_array_size(json_object_get(body, json_object_get(body, "data") ? "data" : "prompts"));
  ci->body = json_dumps(body, JSON_COMPACT);
  ci->len = ci->body ? strlen(ci->body) : 0;
  if (!ci->body || lt_keyring_tenant_dek(api->keyring, c->tenant, &ci->dek, msg, sizeof msg)) {
    call_in_free(ci);
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the tenant's key cannot be opened now; retry");
    return;
  }
  snprintf(ci->key, sizeof ci->key, "sessions/%s/%s/calls/%s%s%s", ci->tenant, ci->job_id, ci->call_id,
           ci->keyed[0] ? "-" : "", ci->keyed[0] ? obj : "");
  if (lt_callspec_saves_state(kind)) {
    ci->quota = lt_api_storage_quota(api, c->tenant); /* measured on the pool, before the body is stored */
    ci->artifacts = ci->quota ? lt_api_artifact_bytes(api, ci->tenant) : 0;
    if (ci->quota) {
      ci->saving = lt_api_saving_prune(api, ci->tenant, &ci->saving_bytes);
      if (ci->saving >= (uint32_t)api->conf.max_saving_calls) { /* bounds the walk above, on the loop */
        unsigned in_flight = ci->saving;
        call_in_free(ci);
        lt_api_reply_error(c->req, 429, "over_quota", NULL,
                           "tenant %s has %u saving calls (save_state, save_weights_for_sampler) queued and not "
                           "completed; the limit max_saving_calls is %d: wait for them to complete",
                           c->tenant->tenant_id, in_flight, api->conf.max_saving_calls);
        return;
      }
      json_t *o = lt_api_saving_of(api, ci->tenant, true);
      json_int_t bytes = (json_int_t)lt_api_session_ckpt_bytes(api, c->job);
      if (!o || json_object_set_new(o, ci->key, json_pack("{s:s,s:i,s:I}", "job", ci->job_id, "seq", 0, "bytes", bytes))) {
        call_in_free(ci);
        lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
        return;
      }
    }
  }
  lt_api_work(api, ci->tenant, seal_work, seal_after, ci);
}

/* The request's Idempotency-Key (NULL when none); false after answering 400 for a bad one. */
static bool idem_key(lt_api_call_t *c, const char **idem) {
  *idem = evhttp_find_header(evhttp_request_get_input_headers(c->req), "Idempotency-Key");
  if (!*idem || lt_id_valid(*idem)) return true;
  lt_api_reply_error(c->req, 400, "invalid", "Idempotency-Key", "Idempotency-Key must be 1-63 characters of A-Z a-z 0-9 . _ -");
  return false;
}

/* POST /v1/sessions/{id}/calls */
void lt_api_sessions_call(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  const char *idem;
  if (!idem_key(c, &idem)) return;
  size_t len;
  char *text = call_body(c->req, &len);
  if (!text) return;
  char field[96] = "", msg[320];
  json_t *body = lt_callspec_parse(text, len, field, sizeof field, msg, sizeof msg);
  OPENSSL_cleanse(text, len);
  free(text);
  if (!body) {
    lt_api_reply_error(c->req, 400, "invalid", field[0] ? field : NULL, "%s", msg);
    return;
  }
  int vocab = api->conf.vocab_fn ? api->conf.vocab_fn(api->conf.tokenize_ctx, c->job->base_model) : 0;
  lt_callspec_limits_t lim = {.vocab_size = vocab, .max_tokens_per_call = LT_CALLSPEC_MAX_TOKENS};
  const char *kind = NULL;
  if (lt_callspec_check(body, &lim, &kind, field, sizeof field, msg, sizeof msg)) {
    lt_api_reply_error(c->req, 400, "invalid", field[0] ? field : NULL, "%s", msg);
    json_decref(body);
    return;
  }
  if (strcmp(kind, "load_state") == 0) {
    /* The name becomes the key of a state of this session's own: the worker takes no other. */
    sess_fold_t *f = fold_of(api, c->job->job_id, false);
    json_t *s = f ? json_object_get(f->saved, json_string_value(json_object_get(body, "name"))) : NULL;
    if (!s) {
      lt_api_reply_error(c->req, 400, "invalid", "name", "name: session %s has no saved state \"%.64s\" (yet: a "
                                                          "save_state counts once it completed)",
                         c->job->job_id, json_string_value(json_object_get(body, "name")));
      json_decref(body);
      return;
    }
    json_object_set(body, "state_key", json_object_get(s, "state_key"));
  }
  queue_call(c, kind, body, idem);
  json_decref(body);
}

/* DELETE /v1/sessions/{id}: the end, after the calls before it (a final checkpoint, then the
 * session completes and its adapter is published). With an Idempotency-Key, a DELETE sent again
 * answers the first one's seq instead of queueing another end (which would never run). */
void lt_api_sessions_end(lt_api_call_t *c) {
  const char *idem;
  if (!idem_key(c, &idem)) return;
  /* finished: 200 with the session, but a retry of a keyed DELETE (or a key used for a call)
   * answers what the key first queued, as queue_call does */
  char call_id[LT_CALL_ID_MAX], k[LT_ID_MAX + LT_CALL_ID_MAX + 2];
  sess_fold_t *f;
  if (lt_job_state_is_terminal(c->job->state) && !(idem && keyed_entry(c, idem, call_id, k, &f))) {
    lt_api_reply_json(c->req, 200, session_json(c->api, c->job));
    return;
  }
  queue_call(c, "end", NULL, idem);
}

/* ---------------------------------------------------------------- the tokenizer */

/* POST /v1/tokenize {model, text} and /v1/detokenize {model, tokens}: with the base model's own
 * tokenizer, so a client needs none. The body is a completion's at most (max_json_body): the work
 * runs on the event loop, and 8 MiB of text held it over a second and answered 19 MB. */
static void tokenize(lt_api_call_t *c, bool decode) {
  lt_api_t *api = c->api;
  size_t len;
  char *text = lt_api_body_text(api, c->req, &len);
  if (!text) return;
  json_error_t je;
  json_t *body = json_loadb(text, len, 0, &je);
  OPENSSL_cleanse(text, len);
  free(text);
  const char *model = json_string_value(json_object_get(body, "model"));
  json_t *in = json_object_get(body, decode ? "tokens" : "text");
  char msg[320];
  if (!body) lt_api_reply_error(c->req, 400, "invalid", NULL, "the body is not JSON: %s", je.text);
  else if (!model || !lt_model_id_valid(model)) lt_api_reply_error(c->req, 400, "invalid", "model", "model: a base model's id is required");
  else if (decode ? !json_is_array(in) : !json_is_string(in))
    lt_api_reply_error(c->req, 400, "invalid", decode ? "tokens" : "text", decode ? "tokens: an array of token ids is required"
                                                                                   : "text: a string is required");
  else if (!api->conf.tokenize_fn)
    lt_api_reply_error(c->req, 501, "not_implemented", NULL, "this server has no tokenizer");
  else if (!lt_tenant_key_may_tokenize(lt_tenant_key(c->tenant, c->key_id), model)) /* as if not served */
    lt_api_reply_error(c->req, 404, "not_found", "model", LT_API_NO_TOKENIZER, model);
  else {
    json_t *out = NULL;
    lt_err_t e = api->conf.tokenize_fn(api->conf.tokenize_ctx, model, in, &out, msg, sizeof msg);
    if (e) lt_api_reply_err(c->req, e, e == LT_ERR_NOT_FOUND ? "model" : decode ? "tokens" : "text", msg);
    else if (!out) lt_api_reply_error(c->req, 500, "internal", NULL, "the tokenizer gave no answer");
    else lt_api_reply_json(c->req, 200, out);
  }
  json_decref(body);
}

void lt_api_tokenize(lt_api_call_t *c) { tokenize(c, false); }
void lt_api_detokenize(lt_api_call_t *c) { tokenize(c, true); }
