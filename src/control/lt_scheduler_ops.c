/* lt_scheduler_ops: the scheduler's operator endpoint — what the leader's policy (lt_sched)
 * sees now, per tenant and class and for the fleet, as Prometheus text (GET /metrics) and as
 * JSON (GET /v1/admin/queue, which `lathe admin queue` prints).
 *
 * Why here and not in the API's /metrics: queue depth and waits the API can rebuild from its
 * projection, but reserved-idle slots, fragmentation and cold loads are the policy's own state
 * (which worker is draining for which gang, which free slots no waiting job fits), and only the
 * leading scheduler holds it. A standby answers 503 on /v1/admin/queue and reports only
 * lathe_scheduler_leading 0 on /metrics, so a scrape of every instance sums correctly.
 *
 * The figures cover the current term: GPU-seconds, cold loads and waits are counted from the
 * dispatches and ends this leader saw (a job already running when it took over counts from
 * then). Plain HTTP without authentication, like the API's operator port: bind it to loopback. */
#include "lt_scheduler_int.h"
#include "lt_web.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "lt_metrics.h"
#include "lt_time.h"

/* One (tenant, class) with demand or history in the class, and the whole fleet. */
typedef struct ops_row {
  const char *tenant;
  int cls;
  lt_sched_tenant_stats_t st;
  const lt_sched_usage_t *u;
} ops_row_t;

typedef struct ops_view {
  double now;
  lt_sched_counters_t cnt;
  lt_sched_usage_t *usage; /* tenant-table order */
  size_t nusage;
  lt_sched_tenant_stats_t *stats; /* scratch for one class */
  ops_row_t *rows;
  size_t nrows;
  double jain[LT_CLASS__COUNT];
  uint32_t fragmented, smallest_queued, reserved_slots, reserved_workers;
  double reserved_idle_slot_s, gpu_seconds;
} ops_view_t;

/* The scheduler's name of lt_sched tenant id; NULL for the placeholder tenant of a term's start
 * (scheduler_rebuild) and unknown ids. */
static const char *tenant_name(const lt_scheduler_t *s, uint64_t id) {
  if (id == 0 || id > s->ntenants) return NULL;
  return s->tenant_names[id - 1];
}

static void view_free(ops_view_t *v) {
  free(v->usage);
  free(v->stats);
  free(v->rows);
}

/* Fills v from the leader's lt_sched at now. LT_ERR_NOMEM when out of memory. */
static lt_err_t view_build(lt_scheduler_t *s, ops_view_t *v) {
  lt_sched_t *sc = s->sched;
  int64_t wall = lt_time_wall_ms();
  memset(v, 0, sizeof *v);
  v->now = (double)wall / 1000.0 > s->now_s ? (double)wall / 1000.0 : s->now_s;
  lt_sched_counters(sc, &v->cnt);
  size_t nt = v->cnt.tenants ? v->cnt.tenants : 1;
  v->usage = calloc(nt, sizeof *v->usage);
  v->stats = calloc(nt, sizeof *v->stats);
  v->rows = calloc(nt * LT_CLASS__COUNT, sizeof *v->rows);
  if (!v->usage || !v->stats || !v->rows) return LT_ERR_NOMEM;
  v->nusage = lt_sched_tenants_usage(sc, v->now, v->usage, nt);
  if (v->nusage > nt) v->nusage = nt;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    size_t n = lt_sched_tenants_stats(sc, (lt_job_class_t)c, v->stats, nt), k = 0;
    for (size_t i = 0; i < n && i < nt; i++) {
      const char *name = tenant_name(s, v->stats[i].tenant_id);
      if (!name) continue;
      while (k < v->nusage && v->usage[k].tenant_id != v->stats[i].tenant_id) k++; /* same order */
      const lt_sched_usage_t *u = k < v->nusage ? &v->usage[k] : NULL;
      bool history = u && (u->waits[c] > 0 || u->gpu_seconds[c] > 0);
      if (!v->stats[i].queued && !v->stats[i].running_slots && !history) continue;
      v->rows[v->nrows++] = (ops_row_t){.tenant = name, .cls = c, .st = v->stats[i], .u = u};
    }
    v->jain[c] = lt_sched_jain(sc, (lt_job_class_t)c);
  }
  for (size_t k = 0; k < v->nusage; k++)
    if (tenant_name(s, v->usage[k].tenant_id))
      for (int c = 0; c < LT_CLASS__COUNT; c++) v->gpu_seconds += v->usage[k].gpu_seconds[c];
  v->fragmented = lt_sched_fragmented_slots(sc);
  v->smallest_queued = lt_sched_smallest_queued(sc);
  v->reserved_slots = lt_sched_reserved_idle_slots(sc, &v->reserved_workers);
  v->reserved_idle_slot_s = lt_sched_reserved_idle_slot_s(sc, v->now);
  return LT_OK;
}

/* ---------------------------------------------------------------- JSON */

static json_t *view_json(const ops_view_t *v) {
  json_t *rows = json_array(), *jain = json_object();
  for (size_t i = 0; i < v->nrows; i++) {
    const ops_row_t *r = &v->rows[i];
    const lt_sched_usage_t *u = r->u;
    json_t *row = json_pack("{s:s,s:s,s:f,s:I,s:I,s:f,s:f}", "tenant", r->tenant, "class",
                            lt_job_class_name((lt_job_class_t)r->cls), "weight", r->st.weight,
                            "queued", (json_int_t)r->st.queued, "running_slots",
                            (json_int_t)r->st.running_slots, "share", r->st.share, "entitlement",
                            r->st.entitlement);
    json_object_update_new(
        row, json_pack("{s:I,s:f,s:f,s:f,s:I}", "dispatched", (json_int_t)(u ? u->waits[r->cls] : 0),
                       "wait_p50_s", u ? u->wait_p50_s[r->cls] : 0.0, "wait_p99_s",
                       u ? u->wait_p99_s[r->cls] : 0.0, "gpu_hours",
                       u ? u->gpu_seconds[r->cls] / 3600 : 0.0, "cold_loads",
                       (json_int_t)(u ? u->cold_loads[r->cls] : 0)));
    json_array_append_new(rows, row);
  }
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    json_object_set_new(jain, lt_job_class_name((lt_job_class_t)c), json_real(v->jain[c]));
  json_t *fleet = json_pack(
      "{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "workers", (json_int_t)v->cnt.workers, "slots_total",
      (json_int_t)v->cnt.slots_total, "slots_used", (json_int_t)v->cnt.slots_used, "queued",
      (json_int_t)v->cnt.queued, "running", (json_int_t)v->cnt.running, "dispatches",
      (json_int_t)v->cnt.dispatches, "preemptions", (json_int_t)v->cnt.preemptions);
  json_object_update_new(
      fleet, json_pack("{s:I,s:I,s:f,s:I,s:I,s:I,s:f}", "reserved_workers",
                       (json_int_t)v->reserved_workers, "reserved_idle_slots",
                       (json_int_t)v->reserved_slots, "reserved_idle_slot_hours",
                       v->reserved_idle_slot_s / 3600, "fragmented_slots", (json_int_t)v->fragmented,
                       "smallest_queued_gpus", (json_int_t)v->smallest_queued, "cold_loads",
                       (json_int_t)v->cnt.cold_loads, "gpu_hours", v->gpu_seconds / 3600));
  return json_pack("{s:s,s:f,s:o,s:o,s:o}", "role", "leading", "now", v->now, "rows", rows, "fleet",
                   fleet, "jain", jain);
}

/* Each worker the leader folded: its slots, whether it is up (heartbeats within its lease) or
 * draining, the age of its last heartbeat, its node group. */
static json_t *workers_json(const lt_scheduler_t *s) {
  json_t *out = json_array();
  int64_t now = lt_time_wall_ms();
  for (size_t i = 0; i < s->nworkers; i++) {
    const worker_t *w = &s->workers[i];
    json_array_append_new(out, json_pack("{s:s,s:i,s:b,s:b,s:f,s:s}", "id", w->id, "slots", (int)w->slots, "up", w->up,
                                         "draining", w->draining, "last_heartbeat_s",
                                         w->last_hb_ms ? (double)(now - w->last_hb_ms) / 1000.0 : -1.0, "node_group",
                                         w->group));
  }
  return out;
}

/* ---------------------------------------------------------------- Prometheus */

/* A gauge or counter per (tenant, class) row; value(row) gives the number. */
static void per_row(lt_metrics_t *m, const ops_view_t *v, const char *name, lt_metric_type_t type, const char *text,
                    double (*value)(const ops_row_t *r)) {
  lt_metrics_family(m, name, type, text);
  for (size_t i = 0; i < v->nrows; i++)
    lt_metrics_sample(m,
                      (lt_metric_label_t[]){{"class", lt_job_class_name((lt_job_class_t)v->rows[i].cls)},
                                            {"tenant", v->rows[i].tenant}, {0}},
                      value(&v->rows[i]));
}

static double row_queued(const ops_row_t *r) { return r->st.queued; }
static double row_running(const ops_row_t *r) { return r->st.running_slots; }
static double row_share(const ops_row_t *r) { return r->st.share; }
static double row_entitlement(const ops_row_t *r) { return r->st.entitlement; }
static double row_gpu_seconds(const ops_row_t *r) { return r->u ? r->u->gpu_seconds[r->cls] : 0; }
static double row_cold(const ops_row_t *r) { return r->u ? (double)r->u->cold_loads[r->cls] : 0; }

/* lathe_wait_seconds: one histogram per (tenant, class) that dispatched in the class. */
static void wait_histograms(lt_metrics_t *m, const ops_view_t *v) {
  lt_metrics_family(m, "lathe_wait_seconds", LT_METRIC_HISTOGRAM,
                    "Wait of each dispatch since the job was (re)queued, per tenant and class (this term).");
  for (size_t i = 0; i < v->nrows; i++) {
    const ops_row_t *r = &v->rows[i];
    if (!r->u || !r->u->waits[r->cls]) continue;
    lt_metrics_buckets(m,
                       (lt_metric_label_t[]){{"class", lt_job_class_name((lt_job_class_t)r->cls)},
                                             {"tenant", r->tenant}, {0}},
                       lt_sched_wait_bounds_s, r->u->wait_le[r->cls], LT_SCHED_WAIT_BUCKETS - 1,
                       r->u->wait_sum_s[r->cls], r->u->waits[r->cls]);
  }
}

static void view_metrics(lt_metrics_t *m, const ops_view_t *v) {
  per_row(m, v, "lathe_sched_queued", LT_METRIC_GAUGE, "Queued jobs per tenant and class (the policy's view).",
          row_queued);
  per_row(m, v, "lathe_sched_running_slots", LT_METRIC_GAUGE, "Slots held per tenant and class.", row_running);
  per_row(m, v, "lathe_sched_tenant_share", LT_METRIC_GAUGE,
          "Fraction of the class's running slots the tenant holds.", row_share);
  per_row(m, v, "lathe_sched_tenant_entitlement", LT_METRIC_GAUGE,
          "The tenant's weighted max-min fair fraction of the class's running slots.", row_entitlement);
  wait_histograms(m, v);
  per_row(m, v, "lathe_tenant_gpu_seconds_total", LT_METRIC_COUNTER,
          "GPU-seconds run per tenant and class this term (ended attempts plus running ones).", row_gpu_seconds);
  per_row(m, v, "lathe_cold_loads_total", LT_METRIC_COUNTER,
          "Dispatches whose worker did not hold the job's base model, per tenant and class.", row_cold);
  lt_metrics_family(m, "lathe_sched_class_jain", LT_METRIC_GAUGE,
                    "Jain's index of running / entitled slots per class.");
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    lt_metrics_sample(m, (lt_metric_label_t[]){{"class", lt_job_class_name((lt_job_class_t)c)}, {0}}, v->jain[c]);
  lt_metrics_family(m, "lathe_slots", LT_METRIC_GAUGE, "Worker slots of the fleet: total and used.");
  lt_metrics_sample(m, (lt_metric_label_t[]){{"state", "total"}, {0}}, v->cnt.slots_total);
  lt_metrics_sample(m, (lt_metric_label_t[]){{"state", "used"}, {0}}, v->cnt.slots_used);
  lt_metrics_one(m, "lathe_reserved_idle_slots", LT_METRIC_GAUGE,
                 "Free slots held now on workers reserved (draining) for a waiting gang.", v->reserved_slots);
  lt_metrics_one(m, "lathe_reserved_idle_slot_seconds_total", LT_METRIC_COUNTER,
                 "Slot-seconds held free on reserved workers (this term).", v->reserved_idle_slot_s);
  lt_metrics_one(m, "lathe_fragmented_slots", LT_METRIC_GAUGE,
                 "Free slots on unreserved workers too few for the smallest queued job.", v->fragmented);
}

/* ---------------------------------------------------------------- HTTP */

static void reply(struct evhttp_request *req, int code, const char *type, struct evbuffer *body) {
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
  evhttp_send_reply(req, code, code == 200 ? "OK" : code == 404 ? "Not Found" : "Service Unavailable", body);
}

static void reply_json(struct evhttp_request *req, int code, json_t *j) {
  struct evbuffer *b = evbuffer_new();
  char *text = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  if (b && text) evbuffer_add_printf(b, "%s\n", text);
  free(text);
  json_decref(j);
  reply(req, code, "application/json", b);
  if (b) evbuffer_free(b);
}

static void reply_error(struct evhttp_request *req, int code, const char *err, const char *msg) {
  reply_json(req, code, json_pack("{s:{s:s,s:s}}", "error", "code", err, "message", msg));
}

/* GET /healthz, /metrics or /v1/admin/queue. */
static void on_request(struct evhttp_request *req, void *arg) {
  lt_scheduler_t *s = arg;
  const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
  bool leading = s->role == LT_SCHEDULER_LEADING && s->sched;
  bool metrics = path && strcmp(path, "/metrics") == 0;
  bool queue = path && strcmp(path, "/v1/admin/queue") == 0;
  bool health = path && strcmp(path, "/healthz") == 0;
  ops_view_t v;
  if (lt_web_serve(req, path)) return; /* the dashboard's operator view (lt_web.h) */
  if (evhttp_request_get_command(req) != EVHTTP_REQ_GET || !(metrics || queue || health)) {
    reply_error(req, 404, "not_found", "the scheduler serves GET /healthz, /metrics and /v1/admin/queue");
  } else if (health) {
    reply_json(req, 200, json_pack("{s:s}", "role", leading ? "leading" : "standby"));
  } else if (queue && !leading) {
    reply_error(req, 503, "not_leading",
                "this scheduler is a standby: ask the leading scheduler's operator port");
  } else if (leading && view_build(s, &v)) {
    view_free(&v);
    reply_error(req, 503, "unavailable", "out of memory");
  } else if (queue) {
    json_t *o = view_json(&v);
    json_object_set_new(o, "workers", workers_json(s));
    reply_json(req, 200, o);
    view_free(&v);
  } else {
    lt_metrics_t *m = lt_metrics_new();
    lt_metrics_one(m, "lathe_scheduler_leading", LT_METRIC_GAUGE,
                   "1 on the leading scheduler, whose policy the rest reports.", leading);
    if (leading) view_metrics(m, &v);
    size_t len = 0;
    char *text = lt_metrics_text(m, &len);
    struct evbuffer *b = evbuffer_new();
    if (b && text) evbuffer_add(b, text, len);
    free(text);
    reply(req, text ? 200 : 503, "text/plain; version=0.0.4", b);
    if (b) evbuffer_free(b);
    if (leading) view_free(&v);
  }
}

lt_err_t scheduler_ops_open(lt_scheduler_t *s, char *errstr, size_t n) {
  const char *addr = s->conf.operator_bind_addr;
  if (!addr) return LT_OK;
  if (!(s->ops_http = evhttp_new(s->base))) return lt_errf(errstr, n, LT_ERR_NOMEM, "evhttp_new failed");
  evhttp_set_timeout(s->ops_http, 30);
  evhttp_set_allowed_methods(s->ops_http, EVHTTP_REQ_GET);
  evhttp_set_gencb(s->ops_http, on_request, s);
  struct evhttp_bound_socket *b = evhttp_bind_socket_with_handle(s->ops_http, addr, s->conf.operator_port);
  if (!b)
    return lt_errf(errstr, n, LT_ERR_IO,
                   "cannot listen on %s:%u (the scheduler's operator port: in use, or not an address "
                   "of this host)",
                   addr, s->conf.operator_port);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(evhttp_bound_socket_get_fd(b), (struct sockaddr *)&ss, &sl);
  s->ops_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  return LT_OK;
}

void scheduler_ops_close(lt_scheduler_t *s) {
  if (s->ops_http) evhttp_free(s->ops_http);
  s->ops_http = NULL;
}

uint16_t lt_scheduler_operator_port(const lt_scheduler_t *s) { return s->ops_port; }
