/* lt_api_metrics: GET /metrics in Prometheus text, and the per-route counters behind it.
 *
 * Job gauges come from one scan of the projection: jobs by class and state, queue depth per
 * tenant and class, and per class the fairness view — each tenant's share of the class's running
 * jobs against its weight-proportional entitlement among the tenants with demand, a histogram of
 * its queue waits (the scheduler's buckets), and Jain's index of share/entitlement. Tenants are
 * printed in the order the scan first met them. Written through lt_metrics, like every role's. */
#include "lt_api_int.h"
#include "lt_sched.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const slot_names[LT_API_SLOT__COUNT] = {"healthz", "metrics", "datasets", "uploads", "jobs",
                                                            "access",  "sessions", "sample", "other"};
static const double latency_bounds_s[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

void lt_api_metrics_observe(lt_api_t *api, lt_api_slot_t slot, int status, int64_t us) {
  int cls = status >= 100 && status < 600 ? status / 100 - 1 : 1;
  api->stats.requests[slot][cls]++;
  lt_metrics_hist_t *h = &api->stats.latency[slot];
  if (!h->bounds) lt_metrics_hist_init(h, latency_bounds_s, (int)(sizeof latency_bounds_s / sizeof *latency_bounds_s));
  lt_metrics_hist_observe(h, (double)us / 1e6);
}

/* ---------------------------------------------------------------- the scan */

/* One tenant in one class. */
typedef struct tenant_class {
  int64_t running;        /* dispatched, running or preempting */
  int64_t demand;         /* running or queued */
  lt_metrics_hist_t wait; /* seconds from the last queueing to the start, per job that started */
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

static bool count_job(const lt_job_t *j, void *ctx) {
  metric_acc_t *m = ctx;
  m->by_class_state[j->job_class][j->state]++;
  bool running = j->state == LT_JOB_DISPATCHED || j->state == LT_JOB_RUNNING || j->state == LT_JOB_PREEMPTING;
  bool queued = j->state == LT_JOB_QUEUED || j->state == LT_JOB_SUBMITTED;
  if (running || queued || j->started_at_ms) {
    tenant_class_t *e = map_entry(m->per[j->job_class], j->tenant_id, sizeof *e);
    if (e) {
      if (!e->wait.bounds) lt_metrics_hist_init(&e->wait, lt_sched_wait_bounds_s, LT_SCHED_WAIT_BUCKETS - 1);
      if (running) e->running++;
      if (running || queued) e->demand++;
      /* Wait of the last time it was queued until its attempt started. */
      if (j->started_at_ms && j->queued_at_ms && j->started_at_ms >= j->queued_at_ms)
        lt_metrics_hist_observe(&e->wait, (double)(j->started_at_ms - j->queued_at_ms) / 1000.0);
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

static void write_jobs(lt_metrics_t *out, const metric_acc_t *m) {
  lt_metrics_family(out, "lathe_jobs", LT_METRIC_GAUGE, "Jobs by priority class and state, from the projection.");
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      lt_metrics_sample(out,
                        (lt_metric_label_t[]){{"class", lt_job_class_name(c)}, {"state", lt_job_state_name(s)}, {0}},
                        (double)m->by_class_state[c][s]);
}

static void write_queue_depth(lt_metrics_t *out, const metric_acc_t *m) {
  lt_metrics_family(out, "lathe_queue_depth", LT_METRIC_GAUGE, "Queued jobs per tenant and class.");
  lt_map_iter_t it = {0};
  while (lt_map_next(m->queued, &it)) {
    const tenant_queued_t *t = it.value;
    for (int i = 0; i < t->norder; i++)
      lt_metrics_sample(out, (lt_metric_label_t[]){{"tenant", it.key}, {"class", lt_job_class_name(t->order[i])}, {0}},
                        (double)t->count[t->order[i]]);
  }
}

static double tenant_weight(lt_api_t *api, const char *tenant) {
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tenant);
  return t && t->weight > 0 ? t->weight : 1.0;
}

/* One class: each tenant's share and entitlement; *jain gets Jain's index over the tenants with
 * demand, of x = share / entitlement: (sum x)^2 / (n * sum x^2), 1 when all are equal (-1: no
 * tenant with demand). */
static void write_class_shares(lt_api_t *api, lt_metrics_t *out, lt_job_class_t c, lt_map_t *per, double *jain) {
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
    const tenant_class_t *e = it.value;
    bool demand = e->demand > 0;
    double share = running_total > 0 ? (double)e->running / running_total : 0;
    double ent = demand && weight_total > 0 ? tenant_weight(api, it.key) / weight_total : 0;
    lt_metrics_sample(out, (lt_metric_label_t[]){{"tenant", it.key}, {"class", cls}, {"kind", "share"}, {0}}, share);
    lt_metrics_sample(out, (lt_metric_label_t[]){{"tenant", it.key}, {"class", cls}, {"kind", "entitlement"}, {0}},
                      ent);
    if (demand && ent > 0) {
      double x = share / ent;
      sx += x;
      sxx += x * x;
      n++;
    }
  }
  *jain = n > 0 && sxx > 0 ? sx * sx / (n * sxx) : -1;
}

static void write_fairness(lt_api_t *api, lt_metrics_t *out, metric_acc_t *m) {
  double jain[LT_CLASS__COUNT];
  lt_metrics_family(out, "lathe_tenant_share", LT_METRIC_GAUGE,
                    "Share of the class's running jobs (kind=share), and its entitlement (kind=entitlement).");
  for (int c = 0; c < LT_CLASS__COUNT; c++) write_class_shares(api, out, (lt_job_class_t)c, m->per[c], &jain[c]);
  lt_metrics_family(out, "lathe_tenant_wait_seconds", LT_METRIC_HISTOGRAM,
                    "Queue wait before the last start of each job, per tenant and class, from the projection.");
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    lt_map_iter_t it = {0};
    while (lt_map_next(m->per[c], &it)) {
      const tenant_class_t *e = it.value;
      if (e->wait.count)
        lt_metrics_hist(out, (lt_metric_label_t[]){{"tenant", it.key}, {"class", lt_job_class_name(c)}, {0}}, &e->wait);
    }
  }
  lt_metrics_family(out, "lathe_class_jain", LT_METRIC_GAUGE,
                    "Jain's fairness index of share/entitlement per class, over the tenants with demand.");
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    if (jain[c] >= 0) lt_metrics_sample(out, (lt_metric_label_t[]){{"class", lt_job_class_name(c)}, {0}}, jain[c]);
}

static void write_routes(lt_api_t *api, lt_metrics_t *out) {
  const lt_api_stats_t *st = &api->stats;
  char code[8];
  lt_metrics_family(out, "lathe_api_requests_total", LT_METRIC_COUNTER,
                    "API requests by route and the status class of the answer sent.");
  for (int r = 0; r < LT_API_SLOT__COUNT; r++)
    for (int s = 0; s < LT_API_STATUS_CLASSES; s++)
      if (st->requests[r][s]) {
        snprintf(code, sizeof code, "%dxx", s + 1);
        lt_metrics_sample(out, (lt_metric_label_t[]){{"route", slot_names[r]}, {"code", code}, {0}},
                          (double)st->requests[r][s]);
      }
  lt_metrics_family(out, "lathe_api_request_duration_seconds", LT_METRIC_HISTOGRAM,
                    "Seconds from a request's arrival to its answer (an asynchronous one's: to the reply).");
  for (int r = 0; r < LT_API_SLOT__COUNT; r++)
    if (st->latency[r].bounds)
      lt_metrics_hist(out, (lt_metric_label_t[]){{"route", slot_names[r]}, {0}}, &st->latency[r]);
  lt_metrics_one(out, "lathe_api_records_produced_total", LT_METRIC_COUNTER, "Records the broker acknowledged.",
                 (double)st->produced);
  lt_metrics_one(out, "lathe_api_produce_failures_total", LT_METRIC_COUNTER,
                 "Records the broker did not take (the request answered 503).", (double)st->produce_failed);
  lt_metrics_one(out, "lathe_api_undecodable_records_total", LT_METRIC_COUNTER,
                 "Records the projection could not decode (skipped).", (double)st->undecodable);
  lt_metrics_one(out, "lathe_api_feed_partitions_healed_total", LT_METRIC_COUNTER,
                 "Partitions of the API's feed that stood still behind the log and were fetched again.",
                 (double)st->feed_healed);
  lt_metrics_one(out, "lathe_api_staff_reads_cut_total", LT_METRIC_COUNTER,
                 "Staff reads under a grant cut mid-stream because the grant was revoked or ran out.",
                 (double)st->staff_reads_cut);
  lt_metrics_one(out, "lathe_api_downloads_cut_deleted_total", LT_METRIC_COUNTER,
                 "Downloads cut mid-stream because their job, or their dataset, was deleted.",
                 (double)st->downloads_cut_deleted);
  lt_metrics_one(out, "lathe_api_held_refused_total", LT_METRIC_COUNTER,
                 "Long polls and event streams refused (429): their tenant held a quarter of max_connections.",
                 (double)st->held_refused);
  lt_metrics_one(out, "lathe_api_streams_cut_total", LT_METRIC_COUNTER,
                 "Sampling streams cut because their client left stream_backlog bytes of them unread.",
                 (double)st->streams_cut);
  lt_metrics_family(out, "lathe_api_event_streams_cut_total", LT_METRIC_COUNTER,
                    "Event streams cut: their client left stream_backlog bytes unread, or the key that opened "
                    "them was revoked (or its tenant disabled).");
  lt_metrics_sample(out, (lt_metric_label_t[]){{"reason", "unread"}, {0}}, (double)st->events_cut_unread);
  lt_metrics_sample(out, (lt_metric_label_t[]){{"reason", "key"}, {0}}, (double)st->events_cut_key);
  if (api->tls) {
    lt_metrics_family(out, "lathe_api_tls_reloads_total", LT_METRIC_COUNTER,
                      "Certificate reloads (SIGHUP): taken, or refused (the files could not be used; the "
                      "certificate served before stays).");
    lt_metrics_sample(out, (lt_metric_label_t[]){{"result", "ok"}, {0}}, (double)st->tls_reloads);
    lt_metrics_sample(out, (lt_metric_label_t[]){{"result", "refused"}, {0}}, (double)st->tls_reload_failures);
    lt_metrics_one(out, "lathe_api_tls_certificate_not_after_seconds", LT_METRIC_GAUGE,
                   "When the certificate the customer port serves expires, seconds since the epoch: alert on "
                   "it minus time().", (double)api->tls_not_after);
  }
  lt_metrics_family(out, "lathe_api_refused_total", LT_METRIC_COUNTER,
                    "Requests the front door refused: over a rate limit (429), on a connection over "
                    "max_connections (503), or refused by libevent itself (400/413/501, answered in the JSON "
                    "envelope).");
  lt_metrics_sample(out, (lt_metric_label_t[]){{"reason", "rate_limited"}, {0}}, (double)st->rate_limited);
  lt_metrics_sample(out, (lt_metric_label_t[]){{"reason", "too_many_connections"}, {0}}, (double)st->over_connections);
  lt_metrics_sample(out, (lt_metric_label_t[]){{"reason", "http_parser"}, {0}}, (double)st->pages_rewritten);
  lt_metrics_one(out, "lathe_api_connections", LT_METRIC_GAUGE, "Open customer connections.",
                 api->conns ? (double)lt_map_count(api->conns) : 0);
  lt_metrics_one(out, "lathe_api_refused_records_total", LT_METRIC_COUNTER,
                 "Signed records (tenants, access) refused for a missing or wrong MAC.", (double)st->refused);
}

void lt_api_metrics_reply(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  metric_acc_t m = {.queued = lt_map_new(free)};
  bool ok = m.queued != NULL;
  for (int k = 0; k < LT_CLASS__COUNT; k++) ok = (m.per[k] = lt_map_new(free)) && ok;
  lt_metrics_t *text = ok ? lt_metrics_new() : NULL;
  if (text) {
    lt_job_scan(lt_proj_jobs(api->proj), count_job, &m);
    write_jobs(text, &m);
    write_queue_depth(text, &m);
    write_fairness(api, text, &m);
    write_routes(api, text);
  }
  lt_map_destroy(m.queued);
  for (int k = 0; k < LT_CLASS__COUNT; k++) lt_map_destroy(m.per[k]);
  size_t len = 0;
  char *body = lt_metrics_text(text, &len);
  /* The sampler's families (lt_sampling.h), each written whole by its backend. */
  const lt_sample_ops_t *ops = api->conf.sampler;
  char *sampler = body && ops && ops->metrics ? ops->metrics(ops->ctx) : NULL;
  struct evbuffer *out = evbuffer_new();
  if (body) evbuffer_add(out, body, len);
  if (sampler) evbuffer_add(out, sampler, strlen(sampler));
  free(body);
  free(sampler);
  evhttp_add_header(evhttp_request_get_output_headers(c->req), "Content-Type", "text/plain; version=0.0.4");
  if (body) evhttp_send_reply(c->req, 200, "OK", out);
  else lt_api_reply_error(c->req, 503, "unavailable", NULL, "out of memory");
  evbuffer_free(out);
}
