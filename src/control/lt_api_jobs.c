/* lt_api_jobs: /v1/jobs — submit, list, show, cancel, checkpoints and artifacts (events are in
 * lt_api_events.c). A submission or cancel is answered only once its record is in the log. */
#include "lt_api_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job_record.h"
#include "lt_jobspec.h"
#include "lt_publisher.h"

/* ---------------------------------------------------------------- views */

typedef struct {
  const lt_job_t *me;
  int64_t ahead;
  double run_s_sum;
  int64_t runs;
} queue_acc_t;

static bool before(const lt_job_t *a, const lt_job_t *b) {
  if (a->job_class != b->job_class) return a->job_class < b->job_class;
  if (a->queued_at_ms != b->queued_at_ms) return a->queued_at_ms < b->queued_at_ms;
  return strcmp(a->job_id, b->job_id) < 0;
}

static bool queue_scan(const lt_job_t *j, void *ctx) {
  queue_acc_t *q = ctx;
  if (j != q->me && j->state == LT_JOB_QUEUED && before(j, q->me)) q->ahead++;
  if (j->state == LT_JOB_COMPLETED && j->started_at_ms > 0 && j->ended_at_ms > j->started_at_ms) {
    q->run_s_sum += (double)(j->ended_at_ms - j->started_at_ms) / 1000.0;
    q->runs++;
  }
  return true;
}

/* Slots of the fleet, from the workers' latest heartbeats. */
static int64_t fleet_slots(lt_api_t *api) {
  const char *id;
  json_t *hb;
  int64_t slots = 0;
  json_object_foreach(lt_proj_workers(api->proj), id, hb) slots += json_integer_value(json_object_get(hb, "slots_total"));
  return slots;
}

json_t *lt_api_job_json(lt_api_t *api, const lt_job_t *j) {
  json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:s,s:s,s:b,s:i,s:I}", "id", j->job_id, "state", lt_job_state_name(j->state),
                        "priority", lt_job_class_name(j->job_class), "attempt", j->attempt, "base_model", j->base_model,
                        "dataset_id", j->dataset_id, "cancel_requested", j->cancel_requested, "failed_attempts",
                        j->failed_attempts, "submitted_at", (json_int_t)j->submitted_at_ms);
  if (j->started_at_ms) json_object_set_new(o, "started_at", json_integer(j->started_at_ms));
  if (j->ended_at_ms) json_object_set_new(o, "ended_at", json_integer(j->ended_at_ms));
  if (j->reason[0]) {
    char reason[sizeof j->reason + 256];
    lt_api_scrub(api, j->reason, reason, sizeof reason);
    json_object_set_new(o, "reason", json_string(reason));
  }
  if (j->state == LT_JOB_QUEUED || j->state == LT_JOB_SUBMITTED) {
    queue_acc_t q = {.me = j};
    lt_job_scan(lt_proj_jobs(api->proj), queue_scan, &q);
    int64_t slots = fleet_slots(api);
    double mean = q.runs ? q.run_s_sum / (double)q.runs : 60.0;
    json_object_set_new(o, "queue_position", json_integer(q.ahead + 1));
    /* Jobs ahead drain slots-wide, each taking the mean run time seen so far. */
    json_object_set_new(o, "wait_estimate_s", json_integer((json_int_t)((double)(q.ahead / (slots > 0 ? slots : 1) + 1) * mean)));
  }
  json_t *info = lt_proj_job_info(api->proj, j->job_id);
  if (info) {
    json_t *v;
    if ((v = json_object_get(info, "progress"))) json_object_set(o, "progress", v);
    if ((v = json_object_get(info, "evals")) && json_array_size(v)) json_object_set(o, "evals", v);
    if ((v = json_object_get(info, "artifacts")) && json_array_size(v)) {
      json_t *names = json_array();
      size_t i;
      json_t *a;
      json_array_foreach(v, i, a) {
        json_array_append_new(names, json_pack("{s:O,s:O,s:O}", "name", json_object_get(a, "name"), "sha256",
                                               json_object_get(a, "sha256"), "bytes", json_object_get(a, "bytes")));
      }
      json_object_set_new(o, "artifacts", names);
    }
    if ((v = json_object_get(info, "spec"))) json_object_set(o, "spec", v);
  }
  return o;
}

/* The job if it exists and belongs to the tenant; another tenant's job is "not found" too. */
static const lt_job_t *own_job(lt_api_t *api, const lt_tenant_t *t, const char *id) {
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), id);
  return j && strcmp(j->tenant_id, t->tenant_id) == 0 ? j : NULL;
}

bool lt_api_jobs_resolve(lt_api_call_t *c) {
  /* A session is a job too, but its routes are /v1/sessions (lt_api_sessions.c). */
  c->job = lt_id_valid(c->id) && !lt_api_is_session_id(c->id) ? own_job(c->api, c->tenant, c->id) : NULL;
  /* A deleted job is gone on every route; DELETE again finishes a deletion a failure cut short. */
  if (c->job && lt_api_job_gone(c, "job")) return false;
  if (c->job) return true;
  lt_api_reply_error(c->req, 404, "not_found", NULL, "no job %s for this tenant", lt_id_valid(c->id) ? c->id : "(invalid id)");
  return false;
}

void lt_api_jobs_show(lt_api_call_t *c) { lt_api_reply_json(c->req, 200, lt_api_job_json(c->api, c->job)); }

/* ---------------------------------------------------------------- records, then answers */

/* What a submission or cancel answers with once the broker acknowledged its record. */
typedef struct {
  struct evhttp_request *req;
  char job_id[LT_ID_MAX + 1];
  int status;
  lt_api_job_view_fn *view;
  bool submitting; /* a submission counted in api->submitting until then */
} answer_ctx_t;

/* The view a call's answers take. */
static lt_api_job_view_fn *view_of(const lt_api_call_t *c) { return c->openai ? lt_api_openai_job_json : lt_api_job_json; }

/* Starts one of the API's job records: cleared, stamped with this producer, naming the job and
 * its tenant. */
static lt_err_t record_start(lt_api_t *api, lt_avro_record_t *rec, const char *job_id, const char *tenant_id) {
  lt_avro_record_clear(rec);
  lt_err_t err = lt_avro_record_stamp(rec, api->conf.producer_id);
  if (!err) err = lt_avro_set_string(rec, "job_id", job_id);
  if (!err) err = lt_avro_set_string(rec, "tenant_id", tenant_id);
  return err;
}

/* Encodes rec (unless err says filling it failed) and makes the context that answers req with
 * status once the record is durable. Replies 500 itself and returns NULL when either fails. */
static answer_ctx_t *encode_for_answer(const lt_api_call_t *call, lt_avro_record_t *rec, lt_err_t err,
                                       const char *what, const char *job_id, int status, const uint8_t **bytes,
                                       size_t *blen) {
  struct evhttp_request *req = call->req;
  char msg[256];
  if (!err) err = lt_avro_record_encode(rec, bytes, blen, msg, sizeof msg);
  if (err) {
    lt_api_reply_error(req, 500, "internal", NULL, "cannot encode the %s: %s", what, lt_avro_record_error(rec));
    return NULL;
  }
  answer_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  c->req = req;
  c->status = status;
  c->view = view_of(call);
  snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
  return c;
}

/* ---------------------------------------------------------------- submit */

/* The tenant's submissions on their way to the broker (a few at a time: those of the last
 * milliseconds). */
static int64_t submitting(const lt_api_t *api, const char *tenant) {
  int64_t n = 0;
  lt_map_iter_t it = {0};
  while (lt_map_next(api->submitting, &it)) n += strcmp(it.value, tenant) == 0;
  return n;
}

static void submit_done(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  answer_ctx_t *c = arg;
  /* Acknowledged: the projection holds the job now (read-your-writes, lt_api_feed.c); refused
   * or timed out: not (a record that lands late is folded when the consumer reads it). */
  if (c->submitting) lt_map_del(api->submitting, c->job_id);
  if (err) {
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the job could not be recorded durably; nothing was submitted, "
                                                       "retry with the same Idempotency-Key");
  } else {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), c->job_id);
    lt_api_reply_json(c->req, c->status, j ? c->view(api, j) : json_pack("{s:s}", "id", c->job_id));
  }
  free(c);
}

static uint32_t fnv(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

/* Phase 1: the body as a job spec. False when it replied 4xx. */
static bool read_spec(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t, lt_jobspec_t *spec) {
  size_t len;
  char *text = lt_api_body_text(api, req, &len);
  if (!text) return false;
  json_error_t je;
  json_t *body = json_loadb(text, len, 0, &je);
  free(text);
  if (!body) {
    lt_api_reply_error(req, 400, "invalid", NULL, "the body is not valid JSON: %s at line %d column %d", je.text,
                       je.line, je.column);
    return false;
  }
  char field[96], msg[256];
  lt_err_t err = lt_jobspec_from_json(body, spec, field, sizeof field, msg, sizeof msg);
  json_decref(body);
  if (err) {
    lt_api_reply_err(req, err, field, msg);
    return false;
  }
  return true;
}

/* True when the job's recorded submission (the projection keeps JobSubmitted as JSON) asks for
 * what spec asks: a retry of the same request. A submission the projection cannot read back
 * counts as the same, as it did before keys were compared. */
static bool same_request(lt_api_t *api, const char *job_id, const lt_jobspec_t *spec) {
  json_t *info = lt_proj_job_info(api->proj, job_id);
  json_t *stored = info ? json_object_get(info, "spec") : NULL;
  if (!stored) return true;
  /* The projection keeps the record without its envelope (ids, producer, time); put neutral
   * values back so that the record reads back through the one spec reader. */
  json_t *copy = json_copy(stored);
  json_object_set_new(copy, "occurred_at", json_integer(0));
  json_object_set_new(copy, "event_id", json_string(""));
  json_object_set_new(copy, "producer", json_string(""));
  json_object_set_new(copy, "job_id", json_string(job_id));
  json_object_set_new(copy, "tenant_id", json_string(""));
  lt_avro_record_t *rec = NULL;
  lt_jobspec_t old;
  bool readable = copy && !lt_avro_record_new(api->reg, "JobSubmitted", &rec, NULL, 0) &&
                  !lt_avro_record_from_jansson(rec, copy, NULL, 0) && !lt_jobspec_from_record(rec, &old, NULL, 0);
  lt_avro_record_destroy(rec);
  json_decref(copy);
  if (!readable) return true;
  json_t *a = lt_jobspec_to_json(&old), *b = lt_jobspec_to_json(spec);
  bool same = a && b && json_equal(a, b);
  json_decref(a);
  json_decref(b);
  return same;
}

/* Phase 2: the job's id. The same key always names the same job, so a retry after a lost answer
 * finds it: then this replies 200 with the job and returns false; the key reused for a different
 * request is refused (422): it would silently answer with a job the caller did not ask for.
 * Without a key the id is random. */
static bool name_job(const lt_api_call_t *call, const lt_jobspec_t *spec, char job_id[LT_ID_MAX + 1]) {
  lt_api_t *api = call->api;
  struct evhttp_request *req = call->req;
  const lt_tenant_t *t = call->tenant;
  const char *prefix = spec->mode == LT_MODE_INTERACTIVE ? LT_API_SESSION_PREFIX : "job-";
  if (!spec->idempotency_key[0]) {
    char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
    lt_crypto_random_id(rnd);
    snprintf(job_id, LT_ID_MAX + 1, "%s%.24s", prefix, rnd);
    return true;
  }
  char seed[256];
  uint8_t h[32];
  char hex[65];
  snprintf(seed, sizeof seed, "%s\n%s", t->tenant_id, spec->idempotency_key);
  lt_crypto_sha256(seed, strlen(seed), h);
  lt_crypto_hex(h, 12, hex);
  snprintf(job_id, LT_ID_MAX + 1, "%s%.24s", prefix, hex);
  const lt_job_t *j = own_job(api, t, job_id);
  if (!j) return true;
  if (!same_request(api, job_id, spec))
    lt_api_reply_error(req, 422, "idempotency_key_reused", "Idempotency-Key",
                       "Idempotency-Key %s was used for job %s with a different request: send the same request "
                       "to get that job again, or use a new key for a new job",
                       spec->idempotency_key, job_id);
  else
    lt_api_reply_json(req, 200, view_of(call)(api, j));
  return false;
}

/* True (after replying 400 naming the field) when the fleet has said which base models it serves
 * and model is none of them: such a job could only fail its attempts later. The models are those
 * in the latest heartbeat of every worker that has reported (docs/DESIGN.md §1). Before any worker
 * has reported — a fresh deployment, or an API started ahead of its workers — the fleet has said
 * nothing, and the submission is accepted: refusing everything then would be worse. */
bool lt_api_model_unserved(lt_api_t *api, struct evhttp_request *req, const char *model, const char *field) {
  json_t *workers = lt_proj_workers(api->proj), *hb, *m;
  if (!json_object_size(workers)) return false;
  json_t *served = json_object(); /* a set, in the order first seen */
  const char *wid;
  size_t i;
  json_object_foreach(workers, wid, hb) json_array_foreach(json_object_get(hb, "base_models"), i, m) {
    if (json_is_string(m)) json_object_set(served, json_string_value(m), json_true());
  }
  bool known = json_object_get(served, model) != NULL;
  if (!known) {
    char list[400] = "";
    const char *name;
    json_t *v;
    json_object_foreach(served, name, v) {
      size_t used = strlen(list);
      snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", name);
    }
    lt_api_reply_error(req, 400, "invalid", field, "%s: \"%s\" is not served here; the workers serve: %s", field,
                       model, list[0] ? list : "(none)");
  }
  json_decref(served);
  return !known;
}

/* The queue quota: the tenant's live jobs as folded, and its submissions on their way to the
 * broker (a burst sent at once would pass the limit otherwise); false when it replied 429. Each
 * API counts its own submissions: another API's are seen once its records are folded here. */
static bool queue_ok(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t) {
  if (t->quotas.max_queued_jobs <= 0) return true;
  int64_t live = lt_api_tenant_jobs(api, t->tenant_id).live + submitting(api, t->tenant_id);
  if (live < t->quotas.max_queued_jobs) return true;
  lt_api_reply_error(req, 429, "over_quota", NULL,
                     "tenant %s has %lld queued or running jobs; its limit max_queued_jobs is %d: wait for one to "
                     "finish or cancel one",
                     t->tenant_id, (long long)live, t->quotas.max_queued_jobs);
  return false;
}

/* Phase 3: the tenant's quotas and the fleet's models; false when it replied. The storage quota
 * is checked against the datasets' bytes as this API last measured them; with none measured yet
 * (since it started, or since the tenant's quota came), *measure asks phase 4 to measure them off
 * the loop first. */
static bool admit(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t, const lt_jobspec_t *spec,
                  const char *job_id, bool *measure) {
  /* a retry (its Idempotency-Key) of a submission still on its way is counted once already */
  if (!lt_map_has(api->submitting, job_id) && !queue_ok(api, req, t)) return false;
  uint64_t quota = lt_api_storage_quota(api, t), datasets = 0;
  *measure = quota && !lt_api_stored_recent(api, t->tenant_id, &datasets, NULL);
  if (quota && !*measure) { /* lt_api_quota.c; datasets and checkpoints as measured lately */
    char msg[512];
    if (lt_api_storage_check(quota, t->tenant_id, datasets, lt_api_artifact_bytes(api, t->tenant_id), 0, NULL, msg,
                             sizeof msg)) {
      lt_api_reply_storage(req, msg);
      return false;
    }
  }
  return !lt_api_model_unserved(api, req, spec->base_model, "base_model");
}

/* POST /v1/jobs: read, name, admit, look its datasets up, then JobSubmitted into lathe.jobs; 201
 * once it is durable. */
void lt_api_jobs_submit(lt_api_call_t *call) {
  lt_jobspec_t spec;
  if (!read_spec(call->api, call->req, call->tenant, &spec)) return;
  if (spec.mode == LT_MODE_INTERACTIVE) {
    lt_api_reply_error(call->req, 400, "invalid", "mode",
                       "mode: an interactive job is a training session: create it with POST /v1/sessions "
                       "(its calls are /v1/sessions/{id}/calls)");
    return;
  }
  lt_api_jobs_submit_spec(call, &spec);
}

/* What every submission is checked for, a job's or a session's: the Idempotency-Key header and the
 * tenant's duration limit. False when it replied 4xx. */
static bool check_request(struct evhttp_request *req, const lt_tenant_t *t, lt_jobspec_t *spec) {
  const char *idem = evhttp_find_header(evhttp_request_get_input_headers(req), "Idempotency-Key");
  if (idem) {
    if (!lt_id_valid(idem)) {
      lt_api_reply_error(req, 400, "invalid", "Idempotency-Key",
                         "Idempotency-Key must be 1-63 characters of A-Z a-z 0-9 . _ -");
      return false;
    }
    snprintf(spec->idempotency_key, sizeof spec->idempotency_key, "%s", idem);
  }
  if (t->quotas.max_job_duration_s > 0 && spec->max_duration_s > t->quotas.max_job_duration_s) {
    lt_api_reply_error(req, 400, "invalid", "max_duration_s",
                       "max_duration_s: %lld is over the tenant's limit max_job_duration_s = %lld",
                       (long long)spec->max_duration_s, (long long)t->quotas.max_job_duration_s);
    return false;
  }
  return true;
}

/* Phase 5: JobSubmitted into lathe.jobs, answered once durable. */
static void submit_record(lt_api_call_t *call, const char *tenant_id, const lt_jobspec_t *spec, const char *job_id) {
  lt_api_t *api = call->api;
  struct evhttp_request *req = call->req;
  char msg[256];
  lt_avro_record_t *rec = api->rec_submit;
  const uint8_t *bytes;
  size_t blen;
  /* Again on the loop, right before it is sent: the store look-up (phase 4) ran off it, and other
   * submissions of the tenant may have been sent meanwhile. */
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tenant_id);
  bool again = lt_map_has(api->submitting, job_id); /* a retry of one on its way: counted once */
  if (t && !again && !queue_ok(api, req, t)) return;
  lt_err_t err = record_start(api, rec, job_id, tenant_id);
  if (!err) err = lt_jobspec_to_record(spec, rec, msg, sizeof msg);
  answer_ctx_t *c = encode_for_answer(call, rec, err, "submission", job_id, call->openai ? 200 : 201, &bytes, &blen);
  if (!c) return;
  /* lathe.jobs partitions are grouped by class: two per class, in class order. */
  int32_t partition = (int32_t)spec->priority * 2 + (int32_t)(fnv(job_id) % 2);
  char *owner = again ? NULL : strdup(tenant_id);
  if (owner && lt_map_set(api->submitting, job_id, owner) == LT_OK) c->submitting = true;
  else free(owner); /* out of memory: counted by the projection alone, as before */
  err = lt_api_produce(api, api->topic_jobs, partition, job_id, bytes, blen, true, submit_done, c);
  if (err) {
    if (c->submitting) lt_map_del(api->submitting, job_id);
    free(c);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the submission now; nothing was submitted");
  }
}

/* Phase 4, for the datasets this API has not yet seen exist, and for a storage quota with no
 * measure of the tenant's datasets: the store is asked on the work pool, so a slow or unreachable
 * store holds this submission, not the loop every tenant's requests run on (before, the HEAD ran
 * on the loop: up to libs3's timeouts times lt_store's tries). */
typedef struct lookup_task {
  lt_api_t *api;
  struct evhttp_request *req;
  bool openai;
  lt_jobspec_t spec;
  char tenant_id[LT_ID_MAX + 1], job_id[LT_ID_MAX + 1];
  int n;               /* datasets the spec names: dataset_id, then validation_dataset_id */
  const char *field[2];
  const char *id[2];   /* into spec; NULL for one this API has seen already */
  lt_err_t err[2];     /* the store's answers, from the pool */
  bool measure;        /* and the tenant's datasets' bytes: */
  uint64_t datasets, since;
  lt_err_t measured;
} lookup_task_t;

static void lookup_work(void *ctx) {
  lookup_task_t *t = ctx;
  for (int i = 0; i < t->n; i++)
    if (t->id[i]) t->err[i] = lt_api_dataset_head(t->api, t->tenant_id, t->id[i]);
  if (t->measure) t->measured = lt_api_stored_bytes(t->api, t->tenant_id, &t->datasets, &t->since, NULL, NULL, 0);
}

/* The storage quota with the datasets just measured (the quota read again: it may have changed
 * meanwhile); false when it replied. */
static bool storage_ok(lt_api_t *api, const lookup_task_t *t) {
  if (!t->measure) return true;
  if (t->measured) {
    char why[256];
    snprintf(why, sizeof why, "the object store could not say how much tenant %s stores (%s), which its storage "
             "quota needs; retry", t->tenant_id, lt_err_str(t->measured));
    lt_api_reply_err(t->req, LT_ERR_UNAVAILABLE, NULL, why);
    return false;
  }
  lt_api_stored_note(api, t->tenant_id, t->since, true, t->datasets);
  char msg[512];
  const lt_tenant_t *tn = lt_tenant_get(lt_proj_tenants(api->proj), t->tenant_id);
  if (!lt_api_storage_check(lt_api_storage_quota(api, tn), t->tenant_id, t->datasets,
                            lt_api_artifact_bytes(api, t->tenant_id), 0, NULL, msg, sizeof msg))
    return true;
  lt_api_reply_storage(t->req, msg);
  return false;
}

/* 404 naming the field when the tenant has no such dataset, 503 when the store could not say
 * (then a retry is safe); false when it replied. */
static bool dataset_found(struct evhttp_request *req, bool openai, const char *field, const char *id, lt_err_t err) {
  if (!err) return true;
  if (err != LT_ERR_NOT_FOUND) lt_api_reply_store_unsure(req, field, id, err);
  else if (openai) lt_api_reply_error(req, 404, "not_found", field, "%s: no file %s for this tenant", field, id);
  else lt_api_reply_error(req, 404, "not_found", field, "%s: no dataset %s for this tenant", field, id);
  return false;
}

static void lookup_after(lt_api_t *api, void *ctx) {
  lookup_task_t *t = ctx;
  bool ok = true;
  for (int i = 0; i < t->n; i++) {
    if (!t->id[i]) continue;
    if (!t->err[i]) lt_api_dataset_mark_seen(api, t->tenant_id, t->id[i]);
    ok = ok && dataset_found(t->req, t->openai, t->field[i], t->id[i], t->err[i]);
  }
  if (ok && storage_ok(api, t)) {
    lt_api_call_t call = {.api = api, .req = t->req, .openai = t->openai};
    submit_record(&call, t->tenant_id, &t->spec, t->job_id);
  }
  free(t);
}

void lt_api_jobs_submit_spec(lt_api_call_t *call, lt_jobspec_t *specp) {
  lt_api_t *api = call->api;
  struct evhttp_request *req = call->req;
  const lt_tenant_t *t = call->tenant;
  lt_jobspec_t spec = *specp;
  char job_id[LT_ID_MAX + 1];
  bool measure = false;
  if (!check_request(req, t, &spec) || !name_job(call, &spec, job_id) || !admit(api, req, t, &spec, job_id, &measure)) return;
  /* a session has no dataset; an invalid id is none; one this API has seen needs no store */
  const char *fields[2][2] = {{"dataset_id", "validation_dataset_id"}, {"training_file", "validation_file"}};
  const char *ids[2] = {spec.dataset_id, spec.validation_dataset_id};
  int n = spec.mode == LT_MODE_INTERACTIVE ? 0 : ids[1][0] ? 2 : 1;
  bool ask[2] = {false, false};
  for (int i = 0; i < n; i++) {
    if (!lt_id_valid(ids[i])) {
      dataset_found(req, call->openai, fields[call->openai][i], ids[i], LT_ERR_NOT_FOUND);
      return;
    }
    ask[i] = !lt_api_dataset_seen(api, t->tenant_id, ids[i]);
  }
  if (!ask[0] && !ask[1] && !measure) {
    submit_record(call, t->tenant_id, &spec, job_id);
    return;
  }
  lookup_task_t *lt = calloc(1, sizeof *lt);
  if (!lt) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return;
  }
  *lt = (lookup_task_t){.api = api, .req = req, .openai = call->openai, .spec = spec, .n = n, .measure = measure};
  snprintf(lt->tenant_id, sizeof lt->tenant_id, "%s", t->tenant_id);
  snprintf(lt->job_id, sizeof lt->job_id, "%s", job_id);
  const char *own[2] = {lt->spec.dataset_id, lt->spec.validation_dataset_id};
  for (int i = 0; i < n; i++)
    if (ask[i]) lt->field[i] = fields[call->openai][i], lt->id[i] = own[i];
  lt_api_work(api, t->tenant_id, lookup_work, lookup_after, lt);
}

/* ---------------------------------------------------------------- cancel */

/* A job whose cancel is in the log but not yet folded shows it in the native view
 * (cancel_requested); OpenAI's view has no such flag and shows the state as it is. */
static void view_cancel_requested(lt_api_job_view_fn *view, json_t *o, const lt_job_t *j) {
  if (view == lt_api_job_json && !lt_job_state_is_terminal(j->state)) json_object_set_new(o, "cancel_requested", json_true());
}

static void cancel_done(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  answer_ctx_t *c = arg;
  if (err)
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the cancel could not be recorded durably; retry");
  else {
    lt_map_set(api->cancels_sent, c->job_id, NULL);
    /* The cancel is in the log; the projection folds it in order when it reads it. */
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), c->job_id);
    json_t *o = c->view(api, j);
    view_cancel_requested(c->view, o, j);
    lt_api_reply_json(c->req, c->status, o);
  }
  free(c);
}

/* POST /v1/jobs/{id}/cancel: CancelRequested into lathe.control; 202 once it is durable. */
void lt_api_jobs_cancel(lt_api_call_t *call) {
  lt_api_t *api = call->api;
  struct evhttp_request *req = call->req;
  const lt_job_t *j = call->job;
  /* Idempotent: a finished job or one already being cancelled answers its state. */
  if (lt_job_state_is_terminal(j->state) || j->cancel_requested || lt_map_has(api->cancels_sent, j->job_id)) {
    json_t *o = view_of(call)(api, j);
    view_cancel_requested(view_of(call), o, j);
    lt_api_reply_json(req, lt_job_state_is_terminal(j->state) || call->openai ? 200 : 202, o);
    return;
  }
  lt_avro_record_t *rec = api->rec_cancel;
  const uint8_t *bytes;
  size_t blen;
  lt_err_t err = record_start(api, rec, j->job_id, call->tenant->tenant_id);
  if (!err) err = lt_avro_set_string(rec, "requested_by", "customer");
  answer_ctx_t *c = encode_for_answer(call, rec, err, "cancel", j->job_id, call->openai ? 200 : 202, &bytes, &blen);
  if (!c) return;
  if (lt_api_produce(api, api->topic_control, LT_BUS_PARTITION_ANY, j->job_id, bytes, blen, false, cancel_done, c)) {
    free(c);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the cancel now; retry");
  }
}

/* ---------------------------------------------------------------- list */

typedef struct {
  lt_api_t *api;
  const char *tenant;
  int state; /* -1: any */
  bool sessions; /* list sessions (GET /v1/sessions), else managed jobs */
  const lt_job_t **jobs;
  size_t n, cap;
} list_acc_t;

static bool list_scan(const lt_job_t *j, void *ctx) {
  list_acc_t *l = ctx;
  if (strcmp(j->tenant_id, l->tenant) != 0 || lt_api_job_deleted(l->api, j->job_id)) return true;
  if (lt_api_is_session_id(j->job_id) != l->sessions) return true;
  if (l->state >= 0 && (int)j->state != l->state) return true;
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    const lt_job_t **p = realloc(l->jobs, cap * sizeof *p);
    if (!p) return false;
    l->jobs = p;
    l->cap = cap;
  }
  l->jobs[l->n++] = j;
  return true;
}

/* Newest first: by submission time, then by id (both descending), so that pages are stable. */
static bool newer(const lt_job_t *a, const lt_job_t *b) {
  if (a->submitted_at_ms != b->submitted_at_ms) return a->submitted_at_ms > b->submitted_at_ms;
  return strcmp(a->job_id, b->job_id) > 0;
}

static int cmp_newest(const void *pa, const void *pb) {
  const lt_job_t *a = *(const lt_job_t *const *)pa, *b = *(const lt_job_t *const *)pb;
  return newer(a, b) ? -1 : newer(b, a) ? 1 : 0;
}

#define LIST_LIMIT_DEFAULT 50
#define LIST_LIMIT_MAX 500

lt_err_t lt_api_jobs_page(lt_api_call_t *c, struct evkeyvalq *q, bool sessions, lt_api_job_view_fn *view,
                          json_t **data, bool *more) {
  lt_api_t *api = c->api;
  struct evhttp_request *req = c->req;
  list_acc_t l = {.api = api, .tenant = c->tenant->tenant_id, .state = -1, .sessions = sessions};
  int limit = LIST_LIMIT_DEFAULT;
  const char *v;
  if ((v = lt_api_query(q, "limit"))) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || end == v || n < 1 || n > LIST_LIMIT_MAX) {
      lt_api_reply_error(req, 400, "invalid", "limit", "limit must be a whole number from 1 to %d (default %d), not \"%.40s\"",
                         LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT, v);
      return LT_ERR_INVALID;
    }
    limit = (int)n;
  }
  if ((v = lt_api_query(q, "state"))) {
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      if (strcmp(v, lt_job_state_name(s)) == 0) l.state = s;
    if (l.state < 0) {
      lt_api_reply_error(req, 400, "invalid", "state",
                         "state must be one of submitted queued dispatched running preempting completed failed "
                         "cancelled rejected");
      return LT_ERR_INVALID;
    }
  }
  const char *after_name = lt_api_query(q, "after") ? "after" : "cursor";
  const char *cursor = lt_api_query(q, after_name);
  const lt_job_t *from = NULL;
  if (cursor && !(lt_id_valid(cursor) && (from = own_job(api, c->tenant, cursor)))) {
    lt_api_reply_error(req, 400, "invalid", after_name,
                       "%s must be the id of one of your jobs (the last_id of the page before)", after_name);
    return LT_ERR_INVALID;
  }
  lt_job_foreach(lt_proj_jobs(api->proj), list_scan, &l);
  if (l.n) qsort(l.jobs, l.n, sizeof *l.jobs, cmp_newest);
  *data = json_array();
  size_t i = 0;
  while (from && i < l.n && !newer(from, l.jobs[i]) ) i++; /* past the cursor and everything newer */
  for (; i < l.n && json_array_size(*data) < (size_t)limit; i++) json_array_append_new(*data, view(api, l.jobs[i]));
  *more = i < l.n;
  free(l.jobs);
  return LT_OK;
}

/* GET /v1/jobs?state=&limit=&after=: the tenant's jobs newest first, a page at a time, as
 * OpenAI's list objects page: `after` is the last id of the page before (`cursor` is its older
 * name), `has_more` says whether another page follows. */
static void list_page(lt_api_call_t *c, bool sessions) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  json_t *data;
  bool more;
  if (lt_api_jobs_page(c, &q, sessions, lt_api_job_json, &data, &more) == LT_OK) {
    size_t n = json_array_size(data);
    json_t *first = n ? json_object_get(json_array_get(data, 0), "id") : json_null();
    json_t *last = n ? json_object_get(json_array_get(data, n - 1), "id") : json_null();
    lt_api_reply_json(c->req, 200,
                      json_pack("{s:s,s:o,s:b,s:O,s:O,s:O}", "object", "list", sessions ? "data" : "jobs", data,
                                "has_more", more, "first_id", first, "last_id", last, "next_cursor",
                                more ? last : json_null()));
  }
  evhttp_clear_headers(&q);
}

void lt_api_jobs_list(lt_api_call_t *c) { list_page(c, false); }

/* GET /v1/sessions: the same pages, of the tenant's sessions (each shown as GET /v1/jobs shows a job;
 * GET /v1/sessions/{id} adds its calls). */
void lt_api_sessions_list(lt_api_call_t *c) {
  list_page(c, true);
}

/* ---------------------------------------------------------------- checkpoints */

/* GET /v1/jobs/{id}/checkpoints: every checkpoint the job committed, oldest first — attempt, step,
 * bytes, final, committed_at (ms) and, when an evaluation ran at that step of that attempt, its
 * metrics. From the projection's fold: a fenced attempt's commits are not listed. */
void lt_api_jobs_checkpoints(lt_api_call_t *c) {
  const lt_job_t *j = c->job;
  size_t n;
  const lt_proj_ckpt_t *ck = lt_proj_job_checkpoints(c->api->proj, j->job_id, &n);
  json_t *info = lt_proj_job_info(c->api->proj, j->job_id);
  json_t *evals = info ? json_object_get(info, "evals") : NULL, *list = json_array(), *e;
  for (size_t i = 0; i < n; i++) {
    json_t *o = json_pack("{s:i,s:I,s:I,s:b,s:I}", "attempt", ck[i].attempt, "step", (json_int_t)ck[i].step, "bytes",
                          (json_int_t)ck[i].bytes, "final", ck[i].final, "committed_at",
                          (json_int_t)ck[i].committed_at_ms);
    size_t k;
    json_array_foreach(evals, k, e) {
      if (json_integer_value(json_object_get(e, "step")) == ck[i].step &&
          json_integer_value(json_object_get(e, "attempt")) == ck[i].attempt)
        json_object_set(o, "metrics", json_object_get(e, "metrics"));
    }
    json_array_append_new(list, o);
  }
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:s,s:o}", "job_id", j->job_id, "state", lt_job_state_name(j->state),
                                           "checkpoints", list));
}

/* ---------------------------------------------------------------- artifacts */

/* GET /v1/jobs/{id}/artifacts[/{name}]: the published artifacts, or one decrypted for its owner. */
void lt_api_jobs_artifacts(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  struct evhttp_request *req = c->req;
  const lt_job_t *j = c->job;
  const char *name = c->name && c->name[0] ? c->name : NULL;
  json_t *info = lt_proj_job_info(api->proj, j->job_id);
  json_t *arts = info ? json_object_get(info, "artifacts") : NULL;
  if (!name) {
    json_t *list = json_array();
    size_t i;
    json_t *a;
    json_array_foreach(arts, i, a) json_array_append_new(list, json_pack("{s:O,s:O,s:O}", "name", json_object_get(a, "name"),
                                                                          "sha256", json_object_get(a, "sha256"), "bytes",
                                                                          json_object_get(a, "bytes")));
    lt_api_reply_json(req, 200, json_pack("{s:s,s:s,s:o}", "job_id", j->job_id, "state", lt_job_state_name(j->state),
                                          "artifacts", list));
    return;
  }
  size_t i;
  json_t *a, *found = NULL;
  json_array_foreach(arts, i, a) if (strcmp(json_string_value(json_object_get(a, "name")), name) == 0) found = a;
  if (!found) {
    lt_api_reply_error(req, 404, "not_found", NULL, "job %s has no published artifact \"%s\"", j->job_id, name);
    return;
  }
  const lt_crypto_dek_t *dek;
  char msg[256];
  lt_err_t err = lt_keyring_tenant_dek(api->keyring, c->tenant, &dek, msg, sizeof msg);
  if (err) {
    lt_api_reply_err(req, err == LT_ERR_NOT_FOUND ? LT_ERR_INTERNAL : err, NULL, msg);
    return;
  }
  /* Streamed in pieces from a thread of its own: memory does not grow with the artifact. */
  char dek_key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_dek_key(dek_key, sizeof dek_key, j->tenant_id, j->job_id);
  lt_api_download_start(api, req, dek, dek_key, false, json_string_value(json_object_get(found, "key")),
                        (uint64_t)json_integer_value(json_object_get(found, "bytes")),
                        strstr(name, ".json") ? "application/json" : "application/octet-stream", j->job_id);
}

