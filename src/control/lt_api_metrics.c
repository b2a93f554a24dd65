/* lt_api_metrics: GET /metrics in Prometheus text, and the per-route counters behind it.
 *
 * Job gauges come from one scan of the projection: jobs by class and state, queue depth per
 * tenant and class, and per class the fairness view — each tenant's share of the class's running
 * jobs against its weight-proportional entitlement among the tenants with demand, its queue-wait
 * quantiles, and Jain's index of share/entitlement. Tenants are printed in the order the scan
 * first met them. */
#include "lt_api_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const slot_names[LT_API_SLOT__COUNT] = {"healthz", "metrics", "datasets", "uploads", "jobs",
                                                            "access",  "sessions", "sample", "other"};
static const double latency_bounds_ms[LT_API_LATENCY_BUCKETS] = {1, 2, 5, 10, 25, 50, 100, 250, 1000, 1e12};

void lt_api_metrics_observe(lt_api_t *api, lt_api_slot_t slot, int status, int64_t us) {
  int cls = status >= 100 && status < 600 ? status / 100 - 1 : 1;
  api->stats.requests[slot][cls]++;
  api->stats.latency_us_sum[slot] += (uint64_t)us;
  int b = 0;
  while (b < LT_API_LATENCY_BUCKETS - 1 && us / 1000.0 > latency_bounds_ms[b]) b++;
  api->stats.latency_le[slot][b]++;
}

/* ---------------------------------------------------------------- the scan */

/* One tenant in one class. */
typedef struct tenant_class {
  int64_t running; /* dispatched, running or preempting */
  int64_t demand;  /* running or queued */
  int64_t *waits;  /* ms from the last queueing to the start, per job that started */
  size_t nwaits, cap;
} tenant_class_t;

/* One tenant's queued jobs, per class, with the classes in the order the scan met them. */
typedef struct tenant_queued {
  int64_t count[LT_CLASS__COUNT];
  lt_job_class_t order[LT_CLASS__COUNT];
  int norder;
} tenant_queued_t;

typedef struct {
  uint64_t by_class_state[LT_CLASS__COUNT][LT_JOB__STATE_COUNT];
  lt_map_t *queued;                 /* tenant -> tenant_queued_t */
  lt_map_t *per[LT_CLASS__COUNT];   /* tenant -> tenant_class_t */
} metric_acc_t;

static void tenant_class_free(void *v) {
  tenant_class_t *e = v;
  free(e->waits);
  free(e);
}

/* The map's value for key, made with calloc(size) when absent; NULL when out of memory. */
static void *map_entry(lt_map_t *m, const char *key, size_t size) {
  void *v = lt_map_get(m, key);
  if (v) return v;
  if (!(v = calloc(1, size))) return NULL;
  if (lt_map_set(m, key, v)) {
    free(v);
    return NULL;
  }
  return v;
}

static void add_wait(tenant_class_t *e, int64_t ms) {
  if (e->nwaits == e->cap) {
    size_t cap = e->cap ? 2 * e->cap : 8;
    int64_t *w = realloc(e->waits, cap * sizeof *w);
    if (!w) return;
    e->waits = w;
    e->cap = cap;
  }
  e->waits[e->nwaits++] = ms;
}

static bool count_job(const lt_job_t *j, void *ctx) {
  metric_acc_t *m = ctx;
  m->by_class_state[j->job_class][j->state]++;
  bool running = j->state == LT_JOB_DISPATCHED || j->state == LT_JOB_RUNNING || j->state == LT_JOB_PREEMPTING;
  bool queued = j->state == LT_JOB_QUEUED || j->state == LT_JOB_SUBMITTED;
  if (running || queued || j->started_at_ms) {
    tenant_class_t *e = map_entry(m->per[j->job_class], j->tenant_id, sizeof *e);
    if (e) {
      if (running) e->running++;
      if (running || queued) e->demand++;
      /* Wait of the last time it was queued until its attempt started. */
      if (j->started_at_ms && j->queued_at_ms && j->started_at_ms >= j->queued_at_ms)
        add_wait(e, j->started_at_ms - j->queued_at_ms);
    }
  }
  if (queued) {
    tenant_queued_t *t = map_entry(m->queued, j->tenant_id, sizeof *t);
    if (t) {
      if (!t->count[j->job_class]) t->order[t->norder++] = j->job_class;
      t->count[j->job_class]++;
    }
  }
  return true;
}

/* ---------------------------------------------------------------- the text */

static void write_jobs(struct evbuffer *out, const metric_acc_t *m) {
  evbuffer_add_printf(out, "# HELP lathe_jobs Jobs by priority class and state, from the projection.\n"
                           "# TYPE lathe_jobs gauge\n");
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      evbuffer_add_printf(out, "lathe_jobs{class=\"%s\",state=\"%s\"} %" PRIu64 "\n", lt_job_class_name(c),
                          lt_job_state_name(s), m->by_class_state[c][s]);
}

static void write_queue_depth(struct evbuffer *out, const metric_acc_t *m) {
  evbuffer_add_printf(out, "# HELP lathe_queue_depth Queued jobs per tenant and class.\n"
                           "# TYPE lathe_queue_depth gauge\n");
  lt_map_iter_t it = {0};
  while (lt_map_next(m->queued, &it)) {
    const tenant_queued_t *t = it.value;
    for (int i = 0; i < t->norder; i++)
      evbuffer_add_printf(out, "lathe_queue_depth{tenant=\"%s\",class=\"%s\"} %" PRId64 "\n", it.key,
                          lt_job_class_name(t->order[i]), t->count[t->order[i]]);
  }
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static double tenant_weight(lt_api_t *api, const char *tenant) {
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tenant);
  return t && t->weight > 0 ? t->weight : 1.0;
}

/* The median and p99 of a tenant's queue waits in a class (sorts them). */
static void write_waits(struct evbuffer *out, const char *tenant, const char *cls, tenant_class_t *e) {
  size_t nw = e->nwaits;
  if (!nw) return;
  qsort(e->waits, nw, sizeof *e->waits, cmp_i64);
  evbuffer_add_printf(out, "lathe_tenant_wait_ms{tenant=\"%s\",class=\"%s\",quantile=\"0.5\"} %lld\n", tenant, cls,
                      (long long)e->waits[(nw - 1) / 2]);
  evbuffer_add_printf(out, "lathe_tenant_wait_ms{tenant=\"%s\",class=\"%s\",quantile=\"0.99\"} %lld\n", tenant, cls,
                      (long long)e->waits[(size_t)((double)(nw - 1) * 0.99)]);
}

/* One class: each tenant's share and entitlement and waits, then Jain's index over the tenants
 * with demand, of x = share / entitlement: (sum x)^2 / (n * sum x^2), 1 when all are equal. */
static void write_class_fairness(lt_api_t *api, struct evbuffer *out, lt_job_class_t c, lt_map_t *per) {
  const char *cls = lt_job_class_name(c);
  double running_total = 0, weight_total = 0, sx = 0, sxx = 0;
  int n = 0;
  lt_map_iter_t it = {0};
  while (lt_map_next(per, &it)) {
    const tenant_class_t *e = it.value;
    running_total += (double)e->running;
    if (e->demand > 0) weight_total += tenant_weight(api, it.key);
  }
  it = (lt_map_iter_t){0};
  while (lt_map_next(per, &it)) {
    tenant_class_t *e = it.value;
    bool demand = e->demand > 0;
    double share = running_total > 0 ? (double)e->running / running_total : 0;
    double ent = demand && weight_total > 0 ? tenant_weight(api, it.key) / weight_total : 0;
    evbuffer_add_printf(out, "lathe_tenant_share{tenant=\"%s\",class=\"%s\",kind=\"share\"} %.4f\n", it.key, cls, share);
    evbuffer_add_printf(out, "lathe_tenant_share{tenant=\"%s\",class=\"%s\",kind=\"entitlement\"} %.4f\n", it.key, cls,
                        ent);
    if (demand && ent > 0) {
      double x = share / ent;
      sx += x;
      sxx += x * x;
      n++;
    }
    write_waits(out, it.key, cls, e);
  }
  if (n > 0 && sxx > 0) evbuffer_add_printf(out, "lathe_class_jain{class=\"%s\"} %.4f\n", cls, sx * sx / (n * sxx));
}

static void write_fairness(lt_api_t *api, struct evbuffer *out, metric_acc_t *m) {
  evbuffer_add_printf(out, "# HELP lathe_tenant_share Share of the class's running jobs, and its entitlement.\n"
                           "# TYPE lathe_tenant_share gauge\n"
                           "# HELP lathe_tenant_wait_ms Queue wait before the last start, quantiles.\n"
                           "# TYPE lathe_tenant_wait_ms gauge\n"
                           "# HELP lathe_class_jain Jain's fairness index of share/entitlement per class.\n"
                           "# TYPE lathe_class_jain gauge\n");
  for (int c = 0; c < LT_CLASS__COUNT; c++) write_class_fairness(api, out, (lt_job_class_t)c, m->per[c]);
}

static void write_routes(lt_api_t *api, struct evbuffer *out) {
  const lt_api_stats_t *st = &api->stats;
  evbuffer_add_printf(out, "# HELP lathe_api_requests_total API requests by route and status class.\n"
                           "# TYPE lathe_api_requests_total counter\n");
  for (int r = 0; r < LT_API_SLOT__COUNT; r++)
    for (int s = 0; s < LT_API_STATUS_CLASSES; s++)
      if (st->requests[r][s])
        evbuffer_add_printf(out, "lathe_api_requests_total{route=\"%s\",code=\"%dxx\"} %" PRIu64 "\n", slot_names[r],
                            s + 1, st->requests[r][s]);
  evbuffer_add_printf(out, "# HELP lathe_api_latency_ms API latency (time to the handler's answer).\n"
                           "# TYPE lathe_api_latency_ms histogram\n");
  for (int r = 0; r < LT_API_SLOT__COUNT; r++) {
    uint64_t total = 0;
    for (int b = 0; b < LT_API_LATENCY_BUCKETS; b++) {
      total += st->latency_le[r][b];
      if (b < LT_API_LATENCY_BUCKETS - 1)
        evbuffer_add_printf(out, "lathe_api_latency_ms_bucket{route=\"%s\",le=\"%g\"} %" PRIu64 "\n", slot_names[r],
                            latency_bounds_ms[b], total);
    }
    evbuffer_add_printf(out, "lathe_api_latency_ms_bucket{route=\"%s\",le=\"+Inf\"} %" PRIu64 "\n", slot_names[r], total);
    evbuffer_add_printf(out, "lathe_api_latency_ms_sum{route=\"%s\"} %.3f\n", slot_names[r],
                        st->latency_us_sum[r] / 1000.0);
    evbuffer_add_printf(out, "lathe_api_latency_ms_count{route=\"%s\"} %" PRIu64 "\n", slot_names[r], total);
  }
  evbuffer_add_printf(out, "lathe_api_records_produced_total %" PRIu64 "\n", st->produced);
  evbuffer_add_printf(out, "lathe_api_produce_failures_total %" PRIu64 "\n", st->produce_failed);
  evbuffer_add_printf(out, "lathe_api_undecodable_records_total %" PRIu64 "\n", st->undecodable);
  evbuffer_add_printf(out,
                      "# HELP lathe_api_refused_total Requests the front door refused: over a rate limit (429), "
                      "on a connection over max_connections (503), or refused by libevent itself (400/413/501, "
                      "answered in the JSON envelope).\n# TYPE lathe_api_refused_total counter\n"
                      "lathe_api_refused_total{reason=\"rate_limited\"} %" PRIu64 "\n"
                      "lathe_api_refused_total{reason=\"too_many_connections\"} %" PRIu64 "\n"
                      "lathe_api_refused_total{reason=\"http_parser\"} %" PRIu64 "\n",
                      st->rate_limited, st->over_connections, st->pages_rewritten);
  evbuffer_add_printf(out, "# HELP lathe_api_connections Open customer connections.\n"
                           "# TYPE lathe_api_connections gauge\nlathe_api_connections %zu\n",
                      api->conns ? lt_map_count(api->conns) : (size_t)0);
  evbuffer_add_printf(out, "lathe_api_refused_records_total %" PRIu64 "\n", st->refused);
  const lt_sample_ops_t *ops = api->conf.sampler;
  char *sampler = ops && ops->metrics ? ops->metrics(ops->ctx) : NULL;
  if (sampler) evbuffer_add(out, sampler, strlen(sampler));
  free(sampler);
}

void lt_api_metrics_reply(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  metric_acc_t m = {.queued = lt_map_new(free)};
  bool ok = m.queued != NULL;
  for (int k = 0; k < LT_CLASS__COUNT; k++) ok = (m.per[k] = lt_map_new(tenant_class_free)) && ok;
  struct evbuffer *out = evbuffer_new();
  if (ok) {
    lt_job_scan(lt_proj_jobs(api->proj), count_job, &m);
    write_jobs(out, &m);
    write_queue_depth(out, &m);
    write_fairness(api, out, &m);
    write_routes(api, out);
  }
  lt_map_destroy(m.queued);
  for (int k = 0; k < LT_CLASS__COUNT; k++) lt_map_destroy(m.per[k]);
  evhttp_add_header(evhttp_request_get_output_headers(c->req), "Content-Type", "text/plain; version=0.0.4");
  evhttp_send_reply(c->req, 200, "OK", out);
  evbuffer_free(out);
}
