/* lt_api_jobs: /v1/jobs — submit, list, show, cancel, events (SSE) and artifacts. */
#include "lt_api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "lt_job_record.h"
#include "lt_jobspec.h"

#define HISTORY_MAX 1024

struct lt_api_sse {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  char job_id[LT_JOB_ID_MAX];
  lt_api_sse_t *next;
};

/* ---------------------------------------------------------------- views */

typedef struct {
  const lt_job_t *me;
  int64_t ahead;
  int64_t slots_hint;
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

static json_t *job_json(lt_api_t *api, const lt_job_t *j) {
  json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:s,s:s,s:b,s:i,s:I}", "id", j->job_id, "state", lt_job_state_name(j->state),
                        "priority", lt_job_class_name(j->job_class), "attempt", j->attempt, "base_model", j->base_model,
                        "dataset_id", j->dataset_id, "cancel_requested", j->cancel_requested, "failed_attempts",
                        j->failed_attempts, "submitted_at", (json_int_t)j->submitted_at_ms);
  if (j->started_at_ms) json_object_set_new(o, "started_at", json_integer(j->started_at_ms));
  if (j->ended_at_ms) json_object_set_new(o, "ended_at", json_integer(j->ended_at_ms));
  if (j->reason[0]) json_object_set_new(o, "reason", json_string(j->reason));
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

/* ---------------------------------------------------------------- submit */

typedef struct {
  struct evhttp_request *req;
  char job_id[LT_JOB_ID_MAX];
  int status;
} submit_ctx_t;

static void submit_done(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  submit_ctx_t *c = arg;
  if (err) {
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the job could not be recorded durably; nothing was submitted, "
                                                       "retry with the same Idempotency-Key");
  } else {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), c->job_id);
    lt_api_reply_json(c->req, c->status, j ? job_json(api, j) : json_pack("{s:s}", "id", c->job_id));
  }
  free(c);
}

static uint32_t fnv(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

typedef struct {
  const char *tenant;
  int64_t live;
} live_acc_t;

static bool count_live(const lt_job_t *j, void *ctx) {
  live_acc_t *a = ctx;
  if (strcmp(j->tenant_id, a->tenant) == 0 && !lt_job_state_is_terminal(j->state)) a->live++;
  return true;
}

static void submit(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t) {
  size_t len;
  char *text = lt_api_body_text(api, req, &len);
  if (!text) return;
  json_error_t je;
  json_t *body = json_loadb(text, len, 0, &je);
  free(text);
  if (!body) {
    lt_api_reply_error(req, 400, "invalid", NULL, "the body is not valid JSON: %s at line %d column %d", je.text,
                       je.line, je.column);
    return;
  }
  lt_jobspec_t spec;
  char field[96], msg[256];
  lt_err_t err = lt_jobspec_from_json(body, &spec, field, sizeof field, msg, sizeof msg);
  json_decref(body);
  if (err) {
    lt_api_reply_err(req, err, field, msg);
    return;
  }
  const char *idem = evhttp_find_header(evhttp_request_get_input_headers(req), "Idempotency-Key");
  if (idem) {
    if (!lt_id_valid(idem)) {
      lt_api_reply_error(req, 400, "invalid", "Idempotency-Key",
                         "Idempotency-Key must be 1-63 characters of A-Z a-z 0-9 . _ -");
      return;
    }
    snprintf(spec.idempotency_key, sizeof spec.idempotency_key, "%s", idem);
  }
  if (t->quotas.max_job_duration_s > 0 && spec.max_duration_s > t->quotas.max_job_duration_s) {
    lt_api_reply_error(req, 400, "invalid", "max_duration_s",
                       "max_duration_s: %lld is over the tenant's limit max_job_duration_s = %lld",
                       (long long)spec.max_duration_s, (long long)t->quotas.max_job_duration_s);
    return;
  }
  /* The same key always names the same job: a retry after a lost answer finds it. */
  char job_id[LT_JOB_ID_MAX];
  if (idem) {
    char seed[256];
    uint8_t h[32];
    char hex[65];
    snprintf(seed, sizeof seed, "%s\n%s", t->tenant_id, idem);
    lt_crypto_sha256(seed, strlen(seed), h);
    lt_crypto_hex(h, 12, hex);
    snprintf(job_id, sizeof job_id, "job-%.24s", hex);
    const lt_job_t *j = own_job(api, t, job_id);
    if (j) {
      lt_api_reply_json(req, 200, job_json(api, j));
      return;
    }
  } else {
    char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
    lt_crypto_random_id(rnd);
    snprintf(job_id, sizeof job_id, "job-%.24s", rnd);
  }
  if (t->quotas.max_queued_jobs > 0) {
    live_acc_t a = {.tenant = t->tenant_id};
    lt_job_scan(lt_proj_jobs(api->proj), count_live, &a);
    if (a.live >= t->quotas.max_queued_jobs) {
      lt_api_reply_error(req, 429, "over_quota", NULL,
                         "tenant %s has %lld queued or running jobs; its limit max_queued_jobs is %d: wait for one to "
                         "finish or cancel one",
                         t->tenant_id, (long long)a.live, t->quotas.max_queued_jobs);
      return;
    }
  }
  if (!lt_api_dataset_exists(api, t->tenant_id, spec.dataset_id)) {
    lt_api_reply_error(req, 404, "not_found", "dataset_id", "dataset_id: no dataset %s for this tenant", spec.dataset_id);
    return;
  }
  if (spec.validation_dataset_id[0] && !lt_api_dataset_exists(api, t->tenant_id, spec.validation_dataset_id)) {
    lt_api_reply_error(req, 404, "not_found", "validation_dataset_id", "validation_dataset_id: no dataset %s for this tenant",
                       spec.validation_dataset_id);
    return;
  }
  lt_avro_record_t *rec = api->rec_submit;
  lt_avro_record_clear(rec);
  const uint8_t *bytes;
  size_t blen;
  if ((err = lt_avro_record_stamp(rec, api->conf.producer_id)) || (err = lt_avro_set_string(rec, "job_id", job_id)) ||
      (err = lt_avro_set_string(rec, "tenant_id", t->tenant_id)) ||
      (err = lt_jobspec_to_record(&spec, rec, msg, sizeof msg)) ||
      (err = lt_avro_record_encode(rec, &bytes, &blen, msg, sizeof msg))) {
    lt_api_reply_error(req, 500, "internal", NULL, "cannot encode the submission: %s", lt_avro_record_error(rec));
    return;
  }
  submit_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return;
  }
  c->req = req;
  c->status = 201;
  snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
  /* lathe.jobs partitions are grouped by class: two per class, in class order. */
  int32_t partition = (int32_t)spec.priority * 2 + (int32_t)(fnv(job_id) % 2);
  err = lt_api_produce(api, api->topic_jobs, partition, job_id, bytes, blen, true, submit_done, c);
  if (err) {
    free(c);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the submission now; nothing was submitted");
  }
}

/* ---------------------------------------------------------------- cancel */

static void cancel_done(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  submit_ctx_t *c = arg;
  if (err)
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the cancel could not be recorded durably; retry");
  else {
    json_object_set_new(api->cancels_sent, c->job_id, json_true());
    /* The cancel is in the log; the projection folds it in order when it reads it. */
    json_t *o = job_json(api, lt_job_get(lt_proj_jobs(api->proj), c->job_id));
    if (!json_is_true(json_object_get(o, "cancel_requested")) &&
        !lt_job_state_is_terminal(lt_job_get(lt_proj_jobs(api->proj), c->job_id)->state))
      json_object_set_new(o, "cancel_requested", json_true());
    lt_api_reply_json(c->req, 202, o);
  }
  free(c);
}

static void cancel(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t, const lt_job_t *j) {
  /* Idempotent: a finished job or one already being cancelled answers its state. */
  if (lt_job_state_is_terminal(j->state) || j->cancel_requested || json_object_get(api->cancels_sent, j->job_id)) {
    json_t *o = job_json(api, j);
    if (!lt_job_state_is_terminal(j->state)) json_object_set_new(o, "cancel_requested", json_true());
    lt_api_reply_json(req, lt_job_state_is_terminal(j->state) ? 200 : 202, o);
    return;
  }
  lt_avro_record_t *rec = api->rec_cancel;
  lt_avro_record_clear(rec);
  const uint8_t *bytes;
  size_t blen;
  char msg[256];
  if (lt_avro_record_stamp(rec, api->conf.producer_id) || lt_avro_set_string(rec, "job_id", j->job_id) ||
      lt_avro_set_string(rec, "tenant_id", t->tenant_id) || lt_avro_set_string(rec, "requested_by", "customer") ||
      lt_avro_record_encode(rec, &bytes, &blen, msg, sizeof msg)) {
    lt_api_reply_error(req, 500, "internal", NULL, "cannot encode the cancel: %s", lt_avro_record_error(rec));
    return;
  }
  submit_ctx_t *c = calloc(1, sizeof *c);
  if (!c) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return;
  }
  c->req = req;
  snprintf(c->job_id, sizeof c->job_id, "%s", j->job_id);
  if (lt_api_produce(api, api->topic_control, LT_BUS_PARTITION_ANY, j->job_id, bytes, blen, false, cancel_done, c)) {
    free(c);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the cancel now; retry");
  }
}

/* ---------------------------------------------------------------- list */

typedef struct {
  lt_api_t *api;
  const char *tenant;
  const char *cursor;
  int state; /* -1: any */
  int limit;
  json_t *out;
  const char *last;
  bool more;
} list_acc_t;

static bool list_scan(const lt_job_t *j, void *ctx) {
  list_acc_t *l = ctx;
  if (strcmp(j->tenant_id, l->tenant) != 0) return true;
  if (l->cursor && strcmp(j->job_id, l->cursor) <= 0) return true;
  if (l->state >= 0 && (int)j->state != l->state) return true;
  if ((int)json_array_size(l->out) == l->limit) {
    l->more = true;
    return false;
  }
  json_array_append_new(l->out, job_json(l->api, j));
  l->last = j->job_id;
  return true;
}

static void list(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t) {
  struct evkeyvalq q;
  evhttp_parse_query_str(evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req)) ?
                             evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req)) : "", &q);
  list_acc_t l = {.api = api, .tenant = t->tenant_id, .state = -1, .limit = 50, .out = json_array()};
  const char *v;
  if ((v = lt_api_query(&q, "limit"))) {
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < 1 || n > 500) {
      lt_api_reply_error(req, 400, "invalid", "limit", "limit must be a whole number from 1 to 500");
      goto out;
    }
    l.limit = (int)n;
  }
  if ((v = lt_api_query(&q, "state"))) {
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      if (strcmp(v, lt_job_state_name(s)) == 0) l.state = s;
    if (l.state < 0) {
      lt_api_reply_error(req, 400, "invalid", "state",
                         "state must be one of submitted queued dispatched running preempting completed failed "
                         "cancelled rejected");
      goto out;
    }
  }
  l.cursor = lt_api_query(&q, "cursor");
  lt_job_foreach(lt_proj_jobs(api->proj), list_scan, &l);
  lt_api_reply_json(req, 200,
                    json_pack("{s:o,s:o}", "jobs", json_incref(l.out), "next_cursor",
                              l.more && l.last ? json_string(l.last) : json_null()));
out:
  json_decref(l.out);
  evhttp_clear_headers(&q);
}

/* ---------------------------------------------------------------- events (SSE) */

static void sse_send(struct evhttp_request *req, json_t *entry) {
  struct evbuffer *b = evbuffer_new();
  char *data = json_dumps(json_object_get(entry, "data"), JSON_COMPACT | JSON_REAL_PRECISION(15));
  evbuffer_add_printf(b, "id: %s\nevent: %s\ndata: %s\n\n", json_string_value(json_object_get(entry, "id")),
                      json_string_value(json_object_get(entry, "event")), data ? data : "{}");
  free(data);
  evhttp_send_reply_chunk(req, b);
  evbuffer_free(b);
}

static void sse_unlink(lt_api_t *api, lt_api_sse_t *s) {
  for (lt_api_sse_t **pp = &api->sse; *pp; pp = &(*pp)->next)
    if (*pp == s) {
      *pp = s->next;
      return;
    }
}

static void sse_closed(struct evhttp_connection *evcon, void *arg) {
  lt_api_sse_t *s = arg;
  sse_unlink(s->api, s);
  free(s);
}

static void sse_end(lt_api_sse_t *s) {
  evhttp_connection_set_closecb(s->evcon, NULL, NULL);
  struct evbuffer *b = evbuffer_new();
  evbuffer_add_printf(b, "event: end\ndata: {}\n\n");
  evhttp_send_reply_chunk(s->req, b);
  evbuffer_free(b);
  evhttp_send_reply_end(s->req);
  sse_unlink(s->api, s);
  free(s);
}

static void events(lt_api_t *api, struct evhttp_request *req, const lt_job_t *j) {
  const char *last = evhttp_find_header(evhttp_request_get_input_headers(req), "Last-Event-ID");
  struct evkeyvalq q;
  const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
  evhttp_parse_query_str(query ? query : "", &q);
  if (!last) last = lt_api_query(&q, "last_event_id");
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(req, 200, "OK");
  json_t *hist = json_object_get(api->history, j->job_id);
  size_t start = 0, i;
  json_t *e;
  if (last && hist) {
    json_array_foreach(hist, i, e) if (strcmp(json_string_value(json_object_get(e, "id")), last) == 0) start = i + 1;
  }
  if (hist)
    for (i = start; i < json_array_size(hist); i++) sse_send(req, json_array_get(hist, i));
  evhttp_clear_headers(&q);
  if (lt_job_state_is_terminal(j->state)) {
    /* Nothing more will happen to this job: the stream ends after its history. */
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "event: end\ndata: {}\n\n");
    evhttp_send_reply_chunk(req, b);
    evbuffer_free(b);
    evhttp_send_reply_end(req);
    return;
  }
  lt_api_sse_t *s = calloc(1, sizeof *s);
  if (!s) {
    evhttp_send_reply_end(req);
    return;
  }
  s->api = api;
  s->req = req;
  s->evcon = evhttp_request_get_connection(req);
  snprintf(s->job_id, sizeof s->job_id, "%s", j->job_id);
  evhttp_connection_set_closecb(s->evcon, sse_closed, s);
  s->next = api->sse;
  api->sse = s;
}

void lt_api_jobs_on_record(lt_api_t *api, const lt_proj_result_t *res) {
  const char *job_id = res->job_id;
  if (!job_id && lt_avro_get_string(res->record, "job_id", &job_id, NULL) != LT_OK) return;
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job_id);
  if (!j) return;
  const char *event_id = NULL;
  if (lt_avro_get_string(res->record, "event_id", &event_id, NULL) != LT_OK) return;
  json_t *hist = json_object_get(api->history, job_id);
  if (!hist) {
    hist = json_array();
    json_object_set_new(api->history, job_id, hist);
  }
  size_t i;
  json_t *e;
  json_array_foreach(hist, i, e) if (strcmp(json_string_value(json_object_get(e, "id")), event_id) == 0) return;
  json_t *data = NULL;
  if (lt_avro_record_to_jansson(res->record, &data, NULL, 0) != LT_OK) return;
  json_object_set_new(data, "state", json_string(lt_job_state_name(j->state)));
  json_t *entry = json_pack("{s:s,s:s,s:o}", "id", event_id, "event", res->type, "data", data);
  json_array_append_new(hist, entry);
  if (json_array_size(hist) > HISTORY_MAX) json_array_remove(hist, 0);
  for (lt_api_sse_t *s = api->sse, *next; s; s = next) {
    next = s->next;
    if (strcmp(s->job_id, job_id) != 0) continue;
    sse_send(s->req, entry);
    if (lt_job_state_is_terminal(j->state)) sse_end(s);
  }
}

void lt_api_jobs_free(lt_api_t *api) {
  while (api->sse) {
    lt_api_sse_t *s = api->sse;
    api->sse = s->next;
    evhttp_connection_set_closecb(s->evcon, NULL, NULL);
    free(s);
  }
}

/* ---------------------------------------------------------------- artifacts */

static void artifacts(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t, const lt_job_t *j,
                      const char *name) {
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
  lt_err_t err = lt_keyring_tenant_dek(api->keyring, t, &dek, msg, sizeof msg);
  void *data = NULL;
  size_t len = 0;
  if (!err)
    err = lt_sealed_get(api->conf.store, dek, json_string_value(json_object_get(found, "key")), 1ull << 31, &data, &len,
                        msg, sizeof msg);
  if (err) {
    lt_api_reply_err(req, err == LT_ERR_NOT_FOUND ? LT_ERR_INTERNAL : err, NULL, msg);
    return;
  }
  struct evbuffer *b = evbuffer_new();
  evbuffer_add(b, data, len);
  OPENSSL_cleanse(data, len);
  free(data);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                    strstr(name, ".json") ? "application/json" : "application/octet-stream");
  evhttp_send_reply(req, 200, "OK", b);
  evbuffer_free(b);
}

/* ---------------------------------------------------------------- routing */

void lt_api_jobs_route(lt_api_t *api, struct evhttp_request *req, const lt_tenant_t *t, const char *rest) {
  enum evhttp_cmd_type m = evhttp_request_get_command(req);
  if (*rest == '\0' || strcmp(rest, "/") == 0) {
    if (m == EVHTTP_REQ_POST) submit(api, req, t);
    else if (m == EVHTTP_REQ_GET) list(api, req, t);
    else lt_api_reply_error(req, 405, "method_not_allowed", NULL, "use GET or POST on /v1/jobs");
    return;
  }
  char id[LT_JOB_ID_MAX + 1], sub[64] = "", name[128] = "";
  const char *p = rest + 1, *slash = strchr(p, '/');
  size_t idlen = slash ? (size_t)(slash - p) : strlen(p);
  if (idlen == 0 || idlen > LT_ID_MAX) {
    lt_api_reply_error(req, 404, "not_found", NULL, "no such job");
    return;
  }
  memcpy(id, p, idlen);
  id[idlen] = '\0';
  if (slash) {
    const char *s2 = strchr(slash + 1, '/');
    snprintf(sub, sizeof sub, "%.*s", (int)(s2 ? s2 - slash - 1 : (long)strlen(slash + 1)), slash + 1);
    if (s2) snprintf(name, sizeof name, "%s", s2 + 1);
  }
  const lt_job_t *j = lt_id_valid(id) ? own_job(api, t, id) : NULL;
  if (!j) {
    lt_api_reply_error(req, 404, "not_found", NULL, "no job %s for this tenant", lt_id_valid(id) ? id : "(invalid id)");
    return;
  }
  if (!slash && m == EVHTTP_REQ_GET) lt_api_reply_json(req, 200, job_json(api, j));
  else if (strcmp(sub, "cancel") == 0 && !name[0] && m == EVHTTP_REQ_POST) cancel(api, req, t, j);
  else if (strcmp(sub, "events") == 0 && !name[0] && m == EVHTTP_REQ_GET) events(api, req, j);
  else if (strcmp(sub, "artifacts") == 0 && m == EVHTTP_REQ_GET) artifacts(api, req, t, j, name[0] ? name : NULL);
  else lt_api_reply_error(req, 404, "not_found", NULL, "no such route under /v1/jobs/%s", id);
}
