/* lt_api: the HTTP server core — routing, authentication, JSON errors, the projection feed,
 * produce-then-answer, /healthz and /metrics. Jobs and datasets live in lt_api_jobs.c and
 * lt_api_datasets.c. See lt_api.h. */
#include "lt_api_int.h"
#include "lt_time.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/thread.h>

enum { R_HEALTH, R_METRICS, R_DATASETS, R_UPLOADS, R_JOBS, R_OTHER, R__COUNT };
static const char *const route_names[R__COUNT] = {"healthz", "metrics", "datasets", "uploads", "jobs", "other"};
static const double latency_bounds_ms[10] = {1, 2, 5, 10, 25, 50, 100, 250, 1000, 1e12};

/* ---------------------------------------------------------------- replies */

void lt_api_reply_json(struct evhttp_request *req, int status, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(body);
  struct evbuffer *out = evbuffer_new();
  if (text) {
    evbuffer_add(out, text, strlen(text));
    evbuffer_add(out, "\n", 1);
  }
  free(text);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
  const char *reason = status == 200 ? "OK" : status == 201 ? "Created" : status == 202 ? "Accepted" : NULL;
  evhttp_send_reply(req, status, reason, out);
  evbuffer_free(out);
}

void lt_api_reply_error(struct evhttp_request *req, int status, const char *code, const char *field,
                        const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  json_t *err = json_pack("{s:s,s:s,s:o}", "code", code, "message", msg, "field",
                          field && *field ? json_string(field) : json_null());
  lt_api_reply_json(req, status, json_pack("{s:o}", "error", err));
}

void lt_api_reply_err(struct evhttp_request *req, lt_err_t err, const char *field, const char *msg) {
  switch (err) {
  case LT_ERR_INVALID: lt_api_reply_error(req, 400, "invalid", field, "%s", msg); break;
  case LT_ERR_NOT_FOUND: lt_api_reply_error(req, 404, "not_found", field, "%s", msg); break;
  case LT_ERR_QUOTA: lt_api_reply_error(req, 429, "over_quota", field, "%s", msg); break;
  case LT_ERR_AUTH: lt_api_reply_error(req, 401, "unauthorized", NULL, "%s", msg); break;
  case LT_ERR_EXISTS: lt_api_reply_error(req, 409, "conflict", field, "%s", msg); break;
  case LT_ERR_UNAVAILABLE:
  case LT_ERR_TIMEOUT:
  case LT_ERR_RETRIABLE:
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    lt_api_reply_error(req, 503, "unavailable", NULL, "%s", msg);
    break;
  default: lt_api_reply_error(req, 500, "internal", NULL, "%s", msg); break;
  }
}

char *lt_api_body_text(lt_api_t *api, struct evhttp_request *req, size_t *len) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t n = evbuffer_get_length(in);
  if (n > api->conf.max_json_body) {
    lt_api_reply_error(req, 413, "too_large", NULL, "request body is %zu bytes, over the limit of %zu", n,
                       api->conf.max_json_body);
    return NULL;
  }
  char *s = malloc(n + 1);
  if (!s) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  evbuffer_copyout(in, s, n);
  s[n] = '\0';
  if (len) *len = n;
  return s;
}

const char *lt_api_query(struct evkeyvalq *q, const char *name) { return evhttp_find_header(q, name); }

/* ---------------------------------------------------------------- produce, then answer */

struct lt_api_pending {
  lt_api_t *api;
  struct event *ev;
  struct event *timer; /* answers 503 at the deadline if the broker has not answered */
  bool answered;
  lt_api_done_fn *done;
  void *ctx;
  lt_err_t err;
  char msg[256];
  void *value; /* a copy of the record, folded on success when fold_now */
  size_t len;
  bool fold_now;
};

/* On the loop thread: the broker answered. */
static void pending_fire(evutil_socket_t fd, short what, void *arg) {
  lt_api_pending_t *p = arg;
  lt_api_t *api = p->api;
  if (p->err == LT_OK) {
    api->stats.produced++;
    /* Read-your-writes only for a job's first record: nothing of the job can precede it in the
     * log. Any other record is folded when the consumer reads it, in log order (invariant 3: a
     * cancel folded early could overtake a completion that came first). */
    lt_proj_result_t res;
    if (p->fold_now && lt_proj_apply(api->proj, p->value, p->len, &res, NULL, 0) == LT_OK && res.job_id)
      lt_api_jobs_on_record(api, &res);
  } else {
    api->stats.produce_failed++;
  }
  if (!p->answered) p->done(api, p->ctx, p->err, p->msg);
  event_free(p->ev);
  event_free(p->timer);
  free(p->value);
  free(p);
}

/* The deadline passed: the outcome is unknown, so the client hears 503 (never a false ack); the
 * delivery report, when it comes, still folds a record that did get in. */
static void pending_timeout(evutil_socket_t fd, short what, void *arg) {
  lt_api_pending_t *p = arg;
  if (p->answered) return;
  p->answered = true;
  p->done(p->api, p->ctx, LT_ERR_TIMEOUT, "the broker did not acknowledge in time");
}

/* On the producer's thread: hand the outcome to the loop. */
static void on_delivery(void *opaque, const lt_bus_delivery_t *d) {
  lt_api_pending_t *p = d->msg_opaque;
  (void)opaque;
  p->err = d->err;
  snprintf(p->msg, sizeof p->msg, "%s", d->err ? (d->errmsg && *d->errmsg ? d->errmsg : lt_err_str(d->err)) : "");
  event_active(p->ev, 0, 0);
}

lt_err_t lt_api_produce(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                        size_t len, bool fold_now, lt_api_done_fn *done, void *ctx) {
  lt_api_pending_t *p = calloc(1, sizeof *p);
  if (!p) return LT_ERR_NOMEM;
  p->api = api;
  p->fold_now = fold_now;
  p->done = done;
  p->ctx = ctx;
  p->value = malloc(len ? len : 1);
  p->ev = event_new(api->base, -1, 0, pending_fire, p);
  p->timer = evtimer_new(api->base, pending_timeout, p);
  if (!p->value || !p->ev || !p->timer) {
    if (p->ev) event_free(p->ev);
    if (p->timer) event_free(p->timer);
    free(p->value);
    free(p);
    return LT_ERR_NOMEM;
  }
  memcpy(p->value, value, len);
  p->len = len;
  lt_bus_record_t rec = {.topic = topic, .partition = partition, .key = key, .key_size = strlen(key),
                         .value = value, .value_size = len};
  char err[256];
  lt_err_t e = lt_bus_produce(api->producer, &rec, p, err, sizeof err);
  if (e) {
    event_free(p->ev);
    event_free(p->timer);
    free(p->value);
    free(p);
    return e;
  }
  struct timeval tv = {api->conf.produce_timeout_ms / 1000, (api->conf.produce_timeout_ms % 1000) * 1000};
  evtimer_add(p->timer, &tv);
  return LT_OK;
}

/* ---------------------------------------------------------------- the projection feed */

/* Ready once the consumer reached every partition's high watermark as of start-up: before that,
 * tenants and jobs may be missing and answers would be wrong. */
static bool caught_up(lt_api_t *api) {
  if (!api->nfeed) return true;
  lt_bus_tp_t pos[256];
  size_t n = api->nfeed < 256 ? api->nfeed : 256;
  memcpy(pos, api->feed_parts, n * sizeof *pos);
  if (lt_bus_consumer_position(api->consumer, pos, n, NULL, 0)) return false;
  for (size_t i = 0; i < n; i++) {
    int64_t hw = api->feed_parts[i].offset;
    if (hw <= 0) continue;                         /* empty partition */
    if (pos[i].offset == LT_BUS_OFFSET_INVALID || pos[i].offset < hw) return false;
  }
  return true;
}

static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_api_t *api = ctx;
  if (res->job_id || (res->type && (strcmp(res->type, "StepCompleted") == 0 || strcmp(res->type, "EvalCompleted") == 0 ||
                                    strcmp(res->type, "ArtifactPublished") == 0)))
    lt_api_jobs_on_record(api, res);
}

static void feed(lt_api_t *api) {
  /* Bounded per call so HTTP requests interleave with a long replay. */
  for (int i = 0; i < 2000; i++) {
    const lt_bus_msg_t *m = NULL;
    char err[256];
    lt_err_t e = lt_bus_consumer_poll(api->consumer, 0, &m, err, sizeof err);
    if (e) {
      fprintf(stderr, "lathed api: consumer: %s\n", err);
      return;
    }
    if (!m) {
      if (!api->ready) api->ready = caught_up(api);
      return;
    }
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    if (!v) continue; /* tombstone */
    /* The scheduler owns dead-lettering of lathe.jobs; the API only skips and counts. */
    if (lt_proj_fold(api->proj, v, len, on_folded, api, err, sizeof err)) api->stats.undecodable++;
  }
  event_active(api->consumer_ev, EV_READ, 0); /* more to read: come back after HTTP work */
}

static void on_consumer(evutil_socket_t fd, short what, void *arg) { feed(arg); }

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  lt_api_t *api = arg;
  feed(api);
  lt_api_uploads_tick(api);
}

static lt_err_t start_feed(lt_api_t *api, char *errstr, size_t n) {
  static const char *const bases[] = {"jobs", "control", "tenants", "progress", "artifacts"};
  lt_bus_admin_t *admin = NULL;
  lt_err_t err = lt_bus_admin_new(api->conf.bus, &admin, errstr, n);
  if (err) return err;
  lt_bus_tp_t parts[256];
  char(*names)[128] = calloc(5, sizeof *names);
  size_t np = 0;
  if (!names) err = LT_ERR_NOMEM;
  api->feed_names = names;
  for (size_t b = 0; b < 5 && !err; b++) {
    lt_bus_topic_name(api->conf.bus, bases[b], names[b], sizeof names[b]);
    int count = 0;
    err = lt_bus_admin_describe_topic(admin, names[b], 10000, &count, errstr, n);
    for (int p = 0; !err && p < count && np < 256; p++)
      parts[np++] = (lt_bus_tp_t){.topic = names[b], .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_admin_destroy(admin);
  if (err) return err;
  lt_bus_consumer_opts_t copts = {0};
  if ((err = lt_bus_consumer_new(api->conf.bus, &copts, &api->consumer, errstr, n))) return err;
  api->feed_parts = malloc(np * sizeof *api->feed_parts);
  if (!api->feed_parts) return LT_ERR_NOMEM;
  memcpy(api->feed_parts, parts, np * sizeof *parts);
  api->nfeed = np;
  /* Watermarks first: once assigned, the consumer's long-poll fetches of empty partitions hold
   * the broker connection for up to fetch.wait.max.ms, and each watermark query would wait
   * behind one (~10 s for the 25 partitions of a fresh prefix). */
  if ((err = lt_bus_consumer_watermarks(api->consumer, api->feed_parts, np, NULL, 10000, errstr, n))) return err;
  if ((err = lt_bus_consumer_assign(api->consumer, parts, np, errstr, n))) return err;
  api->consumer_ev = event_new(api->base, lt_bus_consumer_fd(api->consumer), EV_READ | EV_PERSIST, on_consumer, api);
  api->tick_ev = event_new(api->base, -1, EV_PERSIST, on_tick, api);
  struct timeval tv = {0, 200 * 1000};
  if (!api->consumer_ev || !api->tick_ev || event_add(api->consumer_ev, NULL) || event_add(api->tick_ev, &tv))
    return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot register consumer events");
  return LT_OK;
}

/* ---------------------------------------------------------------- health and metrics */

static void reply_health(lt_api_t *api, struct evhttp_request *req) {
  /* digest: the projection's job-state digest, so a restart or replay can be compared. */
  char digest[65] = "";
  lt_api_digest(api, digest);
  lt_api_reply_json(req, api->ready ? 200 : 503,
                    json_pack("{s:s,s:b,s:I,s:I,s:s}", "status", api->ready ? "ok" : "starting", "ready", api->ready,
                              "jobs", (json_int_t)lt_job_count(lt_proj_jobs(api->proj)), "records_folded",
                              (json_int_t)lt_proj_applied(api->proj), "digest", digest));
}

typedef struct {
  uint64_t by_class_state[LT_CLASS__COUNT][LT_JOB__STATE_COUNT];
  json_t *tenant_queued; /* tenant -> {class -> count} */
  json_t *per;           /* "class\ttenant" -> {"running", "demand", "waits": [ms...]} */
} metric_acc_t;

static json_t *per_entry(metric_acc_t *m, const lt_job_t *j) {
  char k[160];
  snprintf(k, sizeof k, "%s\t%s", lt_job_class_name(j->job_class), j->tenant_id);
  json_t *e = json_object_get(m->per, k);
  if (!e) {
    e = json_pack("{s:i,s:i,s:[]}", "running", 0, "demand", 0, "waits");
    json_object_set_new(m->per, k, e);
  }
  return e;
}

static void bump(json_t *o, const char *k) { json_object_set_new(o, k, json_integer(json_integer_value(json_object_get(o, k)) + 1)); }

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static bool count_job(const lt_job_t *j, void *ctx) {
  metric_acc_t *m = ctx;
  m->by_class_state[j->job_class][j->state]++;
  bool running = j->state == LT_JOB_DISPATCHED || j->state == LT_JOB_RUNNING || j->state == LT_JOB_PREEMPTING;
  bool queued = j->state == LT_JOB_QUEUED || j->state == LT_JOB_SUBMITTED;
  if (running || queued || j->started_at_ms) {
    json_t *e = per_entry(m, j);
    if (running) bump(e, "running");
    if (running || queued) bump(e, "demand");
    /* Wait of the last time it was queued until its attempt started. */
    if (j->started_at_ms && j->queued_at_ms && j->started_at_ms >= j->queued_at_ms)
      json_array_append_new(json_object_get(e, "waits"), json_integer(j->started_at_ms - j->queued_at_ms));
  }
  if (j->state == LT_JOB_QUEUED || j->state == LT_JOB_SUBMITTED) {
    json_t *t = json_object_get(m->tenant_queued, j->tenant_id);
    if (!t) {
      t = json_object();
      json_object_set_new(m->tenant_queued, j->tenant_id, t);
    }
    const char *c = lt_job_class_name(j->job_class);
    json_object_set_new(t, c, json_integer(json_integer_value(json_object_get(t, c)) + 1));
  }
  return true;
}

static void reply_metrics(lt_api_t *api, struct evhttp_request *req) {
  struct evbuffer *out = evbuffer_new();
  metric_acc_t m = {.tenant_queued = json_object(), .per = json_object()};
  lt_job_scan(lt_proj_jobs(api->proj), count_job, &m);
  evbuffer_add_printf(out, "# HELP lathe_jobs Jobs by priority class and state, from the projection.\n"
                           "# TYPE lathe_jobs gauge\n");
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      evbuffer_add_printf(out, "lathe_jobs{class=\"%s\",state=\"%s\"} %" PRIu64 "\n", lt_job_class_name(c),
                          lt_job_state_name(s), m.by_class_state[c][s]);
  evbuffer_add_printf(out, "# HELP lathe_queue_depth Queued jobs per tenant and class.\n"
                           "# TYPE lathe_queue_depth gauge\n");
  const char *tenant;
  json_t *per;
  json_object_foreach(m.tenant_queued, tenant, per) {
    const char *cls;
    json_t *v;
    json_object_foreach(per, cls, v)
      evbuffer_add_printf(out, "lathe_queue_depth{tenant=\"%s\",class=\"%s\"} %" JSON_INTEGER_FORMAT "\n", tenant, cls,
                          json_integer_value(v));
  }
  json_decref(m.tenant_queued);
  /* Per tenant and class: running slots' share against the weight-proportional entitlement among
   * tenants with demand in that class, queue waits, and Jain's index of share/entitlement. */
  evbuffer_add_printf(out, "# HELP lathe_tenant_share Share of the class's running jobs, and its entitlement.\n"
                           "# TYPE lathe_tenant_share gauge\n"
                           "# HELP lathe_tenant_wait_ms Queue wait before the last start, quantiles.\n"
                           "# TYPE lathe_tenant_wait_ms gauge\n"
                           "# HELP lathe_class_jain Jain's fairness index of share/entitlement per class.\n"
                           "# TYPE lathe_class_jain gauge\n");
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    const char *cls = lt_job_class_name(c);
    double running_total = 0, weight_total = 0, sx = 0, sxx = 0;
    int n = 0;
    const char *key;
    json_t *e;
    size_t cl = strlen(cls);
    json_object_foreach(m.per, key, e) {
      if (strncmp(key, cls, cl) != 0 || key[cl] != '\t') continue;
      const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), key + cl + 1);
      running_total += (double)json_integer_value(json_object_get(e, "running"));
      if (json_integer_value(json_object_get(e, "demand")) > 0) weight_total += t && t->weight > 0 ? t->weight : 1.0;
    }
    json_object_foreach(m.per, key, e) {
      if (strncmp(key, cls, cl) != 0 || key[cl] != '\t') continue;
      const char *tid = key + cl + 1;
      const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tid);
      double w = t && t->weight > 0 ? t->weight : 1.0;
      bool demand = json_integer_value(json_object_get(e, "demand")) > 0;
      double share = running_total > 0 ? (double)json_integer_value(json_object_get(e, "running")) / running_total : 0;
      double ent = demand && weight_total > 0 ? w / weight_total : 0;
      evbuffer_add_printf(out, "lathe_tenant_share{tenant=\"%s\",class=\"%s\",kind=\"share\"} %.4f\n", tid, cls, share);
      evbuffer_add_printf(out, "lathe_tenant_share{tenant=\"%s\",class=\"%s\",kind=\"entitlement\"} %.4f\n", tid, cls,
                          ent);
      if (demand && ent > 0) {
        double x = share / ent;
        sx += x;
        sxx += x * x;
        n++;
      }
      json_t *waits = json_object_get(e, "waits");
      size_t nw = json_array_size(waits);
      if (nw) {
        int64_t *v = malloc(nw * sizeof *v);
        for (size_t i = 0; v && i < nw; i++) v[i] = json_integer_value(json_array_get(waits, i));
        if (v) {
          qsort(v, nw, sizeof *v, cmp_i64);
          evbuffer_add_printf(out, "lathe_tenant_wait_ms{tenant=\"%s\",class=\"%s\",quantile=\"0.5\"} %lld\n", tid,
                              cls, (long long)v[(nw - 1) / 2]);
          evbuffer_add_printf(out, "lathe_tenant_wait_ms{tenant=\"%s\",class=\"%s\",quantile=\"0.99\"} %lld\n", tid,
                              cls, (long long)v[(size_t)((double)(nw - 1) * 0.99)]);
          free(v);
        }
      }
    }
    if (n > 0 && sxx > 0) evbuffer_add_printf(out, "lathe_class_jain{class=\"%s\"} %.4f\n", cls, sx * sx / (n * sxx));
  }
  json_decref(m.per);
  evbuffer_add_printf(out, "# HELP lathe_api_requests_total API requests by route and status class.\n"
                           "# TYPE lathe_api_requests_total counter\n");
  for (int r = 0; r < R__COUNT; r++)
    for (int s = 0; s < 5; s++)
      if (api->stats.requests[r][s])
        evbuffer_add_printf(out, "lathe_api_requests_total{route=\"%s\",code=\"%dxx\"} %" PRIu64 "\n", route_names[r],
                            s + 1, api->stats.requests[r][s]);
  evbuffer_add_printf(out, "# HELP lathe_api_latency_ms API latency (time to the handler's answer).\n"
                           "# TYPE lathe_api_latency_ms histogram\n");
  for (int r = 0; r < R__COUNT; r++) {
    uint64_t total = 0;
    for (int b = 0; b < 10; b++) {
      total += api->stats.latency_le[r][b];
      if (b < 9)
        evbuffer_add_printf(out, "lathe_api_latency_ms_bucket{route=\"%s\",le=\"%g\"} %" PRIu64 "\n", route_names[r],
                            latency_bounds_ms[b], total);
    }
    evbuffer_add_printf(out, "lathe_api_latency_ms_bucket{route=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", route_names[r], total);
    evbuffer_add_printf(out, "lathe_api_latency_ms_sum{route=\"%s\"} %.3f\n", route_names[r],
                        api->stats.latency_us_sum[r] / 1000.0);
    evbuffer_add_printf(out, "lathe_api_latency_ms_count{route=\"%s\"} %" PRIu64 "\n", route_names[r], total);
  }
  evbuffer_add_printf(out, "lathe_api_records_produced_total %" PRIu64 "\n", api->stats.produced);
  evbuffer_add_printf(out, "lathe_api_produce_failures_total %" PRIu64 "\n", api->stats.produce_failed);
  evbuffer_add_printf(out, "lathe_api_undecodable_records_total %" PRIu64 "\n", api->stats.undecodable);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
  evhttp_send_reply(req, 200, "OK", out);
  evbuffer_free(out);
}

/* ---------------------------------------------------------------- routing */

static const lt_tenant_t *authenticate(lt_api_t *api, struct evhttp_request *req) {
  const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
  const lt_tenant_t *t = NULL;
  if (!h || strncmp(h, "Bearer ", 7) != 0 ||
      lt_tenant_authenticate(lt_proj_tenants(api->proj), h + 7, &t) != LT_OK) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    lt_api_reply_error(req, 401, "unauthorized", NULL,
                       h ? "the API key is not valid (revoked, unknown or malformed)"
                         : "missing \"Authorization: Bearer <api key>\" header");
    return NULL;
  }
  return t;
}

/* Strips prefix from path; returns the rest ("" or "/..."), or NULL when path is elsewhere. */
static const char *under(const char *path, const char *prefix) {
  size_t n = strlen(prefix);
  if (strncmp(path, prefix, n) != 0) return NULL;
  if (path[n] != '\0' && path[n] != '/' && path[n] != '?') return NULL;
  return path + n;
}

static void on_request(struct evhttp_request *req, void *arg) {
  lt_api_t *api = arg;
  int64_t t0 = lt_time_mono_us();
  const char *uri = evhttp_request_get_uri(req);
  struct evhttp_uri *parsed = evhttp_uri_parse(uri);
  const char *path = parsed ? evhttp_uri_get_path(parsed) : NULL;
  size_t dlen = 0;
  char *decoded = path ? evhttp_uridecode(path, 0, &dlen) : NULL;
  int route = R_OTHER;
  const char *rest;
  if (!decoded) {
    lt_api_reply_error(req, 400, "invalid", NULL, "the request URI cannot be parsed");
  } else if (strlen(decoded) != dlen) {
    lt_api_reply_error(req, 400, "invalid", NULL, "the path holds a NUL byte");
  } else if (strcmp(decoded, "/healthz") == 0) {
    route = R_HEALTH;
    reply_health(api, req);
  } else if (strcmp(decoded, "/metrics") == 0) {
    route = R_METRICS;
    reply_metrics(api, req);
  } else if ((rest = under(decoded, "/v1/jobs"))) {
    route = R_JOBS;
    const lt_tenant_t *t = authenticate(api, req);
    if (t) lt_api_jobs_route(api, req, t, rest);
  } else if ((rest = under(decoded, "/v1/datasets"))) {
    route = R_DATASETS;
    const lt_tenant_t *t = authenticate(api, req);
    if (t) lt_api_datasets_route(api, req, t, rest);
  } else if ((rest = under(decoded, "/v1/uploads"))) {
    route = R_UPLOADS;
    const lt_tenant_t *t = authenticate(api, req);
    if (t) lt_api_uploads_route(api, req, t, rest);
  } else {
    lt_api_reply_error(req, 404, "not_found", NULL, "no such route: %s", decoded);
  }
  free(decoded);
  if (parsed) evhttp_uri_free(parsed);
  /* Status of requests answered now; async ones (submissions) count their handler time. */
  int status = evhttp_request_get_response_code(req);
  int cls = status >= 100 && status < 600 ? status / 100 - 1 : 1;
  api->stats.requests[route][cls]++;
  int64_t us = lt_time_mono_us() - t0;
  api->stats.latency_us_sum[route] += (uint64_t)us;
  int b = 0;
  while (b < 9 && us / 1000.0 > latency_bounds_ms[b]) b++;
  api->stats.latency_le[route][b]++;
}

/* ---------------------------------------------------------------- life cycle */

lt_err_t lt_api_new(struct event_base *base, const lt_api_conf_t *conf, lt_api_t **out, char *errstr, size_t n) {
  lt_api_t *api = calloc(1, sizeof *api);
  if (!api) return LT_ERR_NOMEM;
  api->conf = *conf;
  api->base = base;
  if (!api->conf.bind_addr) api->conf.bind_addr = "127.0.0.1";
  if (!api->conf.producer_id) api->conf.producer_id = "api";
  if (!api->conf.produce_timeout_ms) api->conf.produce_timeout_ms = 5000;
  if (!api->conf.max_json_body) api->conf.max_json_body = 65536;
  if (!api->conf.max_upload_bytes) api->conf.max_upload_bytes = 1ull << 30;
  lt_err_t err = LT_OK;
  api->reg = conf->registry;
  if (!api->reg) {
    err = lt_avro_registry_new(&api->own_registry, errstr, n);
    api->reg = api->own_registry;
  }
  if (!err) err = lt_proj_new(api->reg, &api->proj, errstr, n);
  if (!err) err = lt_keyring_new(conf->kek, &api->keyring);
  if (!err) err = lt_avro_record_new(api->reg, "JobSubmitted", &api->rec_submit, errstr, n);
  if (!err) err = lt_avro_record_new(api->reg, "CancelRequested", &api->rec_cancel, errstr, n);
  if (!err) {
    api->history = json_object();
    api->datasets_seen = json_object();
    api->cancels_sent = json_object();
    lt_bus_topic_name(conf->bus, "jobs", api->topic_jobs, sizeof api->topic_jobs);
    lt_bus_topic_name(conf->bus, "control", api->topic_control, sizeof api->topic_control);
    lt_bus_producer_opts_t popts = {.delivery_cb = on_delivery, .opaque = api};
    err = lt_bus_producer_new(conf->bus, &popts, &api->producer, errstr, n);
  }
  if (!err) {
    /* A customer's first cancel must not wait for the producer to discover lathe.control. */
    lt_bus_producer_prepare(api->producer, api->topic_jobs, 2000);
    lt_bus_producer_prepare(api->producer, api->topic_control, 2000);
  }
  if (!err) err = start_feed(api, errstr, n);
  if (!err) {
    api->http = evhttp_new(base);
    if (!api->http) err = lt_errf(errstr, n, LT_ERR_NOMEM, "evhttp_new failed");
  }
  if (!err) {
    evhttp_set_max_body_size(api->http, LT_API_PART_MAX + 4096);
    evhttp_set_max_headers_size(api->http, 16384);
    evhttp_set_timeout(api->http, 120);
    evhttp_set_allowed_methods(api->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
    evhttp_set_gencb(api->http, on_request, api);
    struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(api->http, api->conf.bind_addr, conf->port);
    if (!s) {
      err = lt_errf(errstr, n, LT_ERR_IO, "cannot listen on %s:%u (in use, or not an address of this host)",
                    api->conf.bind_addr, conf->port);
    } else {
      struct sockaddr_storage ss;
      socklen_t sl = sizeof ss;
      getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&ss, &sl);
      api->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
  }
  if (err) {
    lt_api_destroy(api);
    return err;
  }
  *out = api;
  return LT_OK;
}

uint16_t lt_api_port(const lt_api_t *api) { return api->port; }
bool lt_api_ready(const lt_api_t *api) { return api->ready; }
lt_err_t lt_api_digest(lt_api_t *api, char out_hex[65]) { return lt_job_digest(lt_proj_jobs(api->proj), out_hex); }

void lt_api_destroy(lt_api_t *api) {
  if (!api) return;
  if (api->http) evhttp_free(api->http);
  lt_api_jobs_free(api);
  lt_api_uploads_free(api);
  if (api->consumer_ev) event_free(api->consumer_ev);
  if (api->tick_ev) event_free(api->tick_ev);
  lt_bus_consumer_destroy(api->consumer);
  /* Records still in flight get their delivery report (and free their pending) here. */
  if (api->producer) {
    lt_bus_producer_destroy(api->producer, 5000);
    event_base_loop(api->base, EVLOOP_NONBLOCK);
  }
  lt_avro_record_destroy(api->rec_submit);
  lt_avro_record_destroy(api->rec_cancel);
  lt_keyring_free(api->keyring);
  lt_proj_destroy(api->proj);
  lt_avro_registry_destroy(api->own_registry);
  json_decref(api->history);
  json_decref(api->datasets_seen);
  json_decref(api->cancels_sent);
  free(api->feed_parts);
  free(api->feed_names);
  free(api);
}
