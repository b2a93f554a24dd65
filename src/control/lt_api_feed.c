/* lt_api_feed: the API's side of the bus. Writes go out through one producer and are answered
 * only once the broker acknowledged them (acks=all) or the deadline passed (503, never a false
 * ack); reads come from the projection, folded here from every partition of the job, control,
 * tenant, progress, artifact and worker topics, with each folded job record handed to the event streams.
 * See lt_api_int.h. */
#include "lt_api_int.h"
#include "lt_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_log.h"

/* ---------------------------------------------------------------- produce, then answer */

typedef struct lt_api_pending {
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
  int32_t partition;   /* where the broker wrote it */
  int64_t offset;
  struct lt_api_pending *prev, *next; /* api->pendings */
} lt_api_pending_t;

static void pending_free(lt_api_pending_t *p) {
  if (p->prev) p->prev->next = p->next;
  else if (p->api->pendings == p) p->api->pendings = p->next;
  if (p->next) p->next->prev = p->prev;
  if (p->ev) event_free(p->ev);
  if (p->timer) event_free(p->timer);
  free(p->value);
  free(p);
}

static void on_folded(void *ctx, const lt_proj_result_t *res);

/* On the loop thread: the broker answered. */
static void pending_fire(evutil_socket_t fd, short what, void *arg) {
  lt_api_pending_t *p = arg;
  lt_api_t *api = p->api;
  if (p->err == LT_OK) {
    api->stats.produced++;
    /* Read-your-writes only for a job's first record: nothing else of the job can precede it in
     * the log. Another JobSubmitted of the same id can (the idempotency key retried on another
     * api): the projection then takes that one when the consumer reads it
     * (lt_proj_apply_early). Any other record is folded when the consumer reads it, in log order
     * (invariant 3: a cancel folded early could overtake a completion that came first). */
    if (p->fold_now)
      lt_proj_apply_early(api->proj, p->value, p->len, p->partition, p->offset, on_folded, api, NULL, NULL, 0);
  } else {
    api->stats.produce_failed++;
  }
  api->done_offset = p->offset;
  api->done_partition = p->partition;
  if (!p->answered) p->done(api, p->ctx, p->err, p->msg);
  pending_free(p);
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
  p->partition = d->partition;
  p->offset = d->offset;
  snprintf(p->msg, sizeof p->msg, "%s", d->err ? (d->errmsg && *d->errmsg ? d->errmsg : lt_err_str(d->err)) : "");
  event_active(p->ev, 0, 0);
}

lt_err_t lt_api_produce(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                        size_t len, bool fold_now, lt_api_done_fn *done, void *ctx) {
  return lt_api_produce_h(api, topic, partition, key, value, len, NULL, 0, fold_now, done, ctx);
}

lt_err_t lt_api_produce_h(lt_api_t *api, const char *topic, int32_t partition, const char *key, const void *value,
                          size_t len, const lt_bus_header_t *headers, size_t nheaders, bool fold_now,
                          lt_api_done_fn *done, void *ctx) {
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
    pending_free(p);
    return LT_ERR_NOMEM;
  }
  memcpy(p->value, value, len);
  p->len = len;
  p->next = api->pendings;
  if (p->next) p->next->prev = p;
  api->pendings = p;
  lt_bus_record_t rec = {.topic = topic, .partition = partition, .key = key, .key_size = strlen(key),
                         .value = value, .value_size = len, .headers = headers, .header_count = nheaders};
  char err[256];
  lt_err_t e = lt_bus_produce(api->producer, &rec, p, err, sizeof err);
  if (e) {
    pending_free(p);
    return e;
  }
  struct timeval tv = {api->conf.produce_timeout_ms / 1000, (api->conf.produce_timeout_ms % 1000) * 1000};
  evtimer_add(p->timer, &tv);
  return LT_OK;
}

void lt_api_feed_settle(lt_api_t *api) {
  /* rounds 0-3 wait for the broker; later ones answer what is left as at its deadline (a done
   * may write another record: it goes in at the head, so each round starts from the head again) */
  for (int round = 0; round < 8; round++) {
    lt_api_pending_t *p = api->pendings;
    while (p && p->answered) p = p->next;
    if (!p) return;
    if (round < 4) {
      char err[256];
      if (api->producer) lt_bus_producer_flush(api->producer, api->conf.produce_timeout_ms, err, sizeof err);
      event_base_loop(api->base, EVLOOP_NONBLOCK); /* the delivery reports' pending_fire */
    } else {
      for (; p; p = p->next)
        if (!p->answered) pending_timeout(-1, 0, p);
    }
  }
}

/* ---------------------------------------------------------------- the projection feed */

/* Ready once the consumer reached every partition's high watermark as of start-up: before that,
 * tenants and jobs may be missing and answers would be wrong. A partition that kept no record
 * (empty, or emptied by retention: its oldest offset is its high watermark) has nothing to wait
 * for; it never gives the consumer a position. What it still waits for, /healthz says. */
static bool caught_up(lt_api_t *api) {
  if (!api->nfeed) return true;
  lt_bus_tp_t pos[256];
  size_t n = api->nfeed < 256 ? api->nfeed : 256;
  memcpy(pos, api->feed_parts, n * sizeof *pos);
  if (lt_bus_consumer_position(api->consumer, pos, n, NULL, 0)) return false;
  for (size_t i = 0; i < n; i++) {
    int64_t hw = api->feed_parts[i].offset;
    if (!lt_bus_read_to(pos[i].offset, 0, api->feed_low[i], hw)) {
      char at[32] = "no record yet";
      if (pos[i].offset >= 0) snprintf(at, sizeof at, "offset %lld", (long long)pos[i].offset);
      snprintf(api->waiting_for, sizeof api->waiting_for, "%s [%d]: read to %s of %lld..%lld", pos[i].topic,
               (int)pos[i].partition, at, (long long)api->feed_low[i], (long long)hw);
      return false;
    }
  }
  api->waiting_for[0] = '\0';
  return true;
}

/* A job deleted (here or on another API): the sampler beside this API drops the job's adapters
 * from its cache, zeroed, rather than keeping the tenant's weights until they are evicted. */
static void forget_adapters(lt_api_t *api, const lt_proj_result_t *res) {
  const char *job_id = NULL;
  if (!api->conf.sampler || lt_avro_get_string(res->record, "job_id", &job_id, NULL) || !job_id) return;
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job_id);
  if (j) lt_api_sample_forget(api, j->tenant_id, j->job_id);
}

static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_api_t *api = ctx;
  if (res->type && strcmp(res->type, "PrimitiveCompleted") == 0) lt_api_sessions_on_record(api, res);
  if (res->type && strcmp(res->type, "JobDeleted") == 0 && res->record) {
    forget_adapters(api, res);
    lt_api_download_recheck(api); /* its downloads in progress are cut */
  }
  if (res->job_id && res->job_outcome == LT_JOB_APPLIED) lt_api_sessions_on_job(api, res->job_id);
  if (res->job_id || (res->type && (strcmp(res->type, "StepCompleted") == 0 || strcmp(res->type, "EvalCompleted") == 0 ||
                                    strcmp(res->type, "ArtifactPublished") == 0 ||
                                    strcmp(res->type, "PrimitiveCompleted") == 0)))
    lt_api_events_on_record(api, res);
}

static void feed(lt_api_t *api) {
  /* Bounded per call so HTTP requests interleave with a long replay. */
  for (int i = 0; i < 2000; i++) {
    const lt_bus_msg_t *m = NULL;
    char err[256];
    lt_err_t e = lt_bus_consumer_poll(api->consumer, 0, &m, err, sizeof err);
    if (e) {
      lt_log_error("api", "consumer: %s", err);
      return;
    }
    if (!m) {
      if (!api->ready && (api->ready = caught_up(api))) {
        api->ready_at_ms = lt_time_mono_ms();
        lt_api_sessions_on_ready(api);
      }
      return;
    }
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    if (!v) continue; /* tombstone */
    if (strcmp(lt_bus_msg_topic(m), api->topic_audit) == 0) {
      lt_api_access_on_record(api, m);
      continue;
    }
    if (strcmp(lt_bus_msg_topic(m), api->topic_calls) == 0) {
      lt_api_sessions_on_call(api, m);
      continue;
    }
    /* The scheduler owns dead-lettering (of lathe.jobs, and of tenant records refused for their
     * MAC, once, through its group's offsets); the API skips, says and counts. A refused tenant
     * record leaves the tenant as it was: its keys, its data key (docs/DESIGN.md §5a). */
    lt_err_t fe = lt_proj_fold_msg(api->proj, m, NULL, on_folded, api, err, sizeof err);
    if (fe == LT_ERR_AUTH) {
      api->stats.refused++;
      lt_log_warn("api", "%s", err);
    } else if (fe) {
      api->stats.undecodable++;
    }
  }
  event_active(api->consumer_ev, EV_READ, 0); /* more to read: come back after HTTP work */
}

static void on_consumer(evutil_socket_t fd, short what, void *arg) { feed(arg); }

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  lt_api_t *api = arg;
  feed(api);
  lt_api_uploads_tick(api);
  lt_api_download_recheck(api); /* a grant that ran out cuts its reads */
  lt_api_events_recheck(api);   /* a revoked key's streams are cut */
  int64_t now = lt_time_mono_ms();
  if (now - api->pruned_at_ms >= 2000) { /* a scan of every bucket and buffer: not every tick */
    api->pruned_at_ms = now;
    lt_api_door_tick(api);
    lt_api_events_prune(api);
    lt_api_sessions_prune(api);
  }
  if (api->consumer) { /* a partition's fetcher may stop, before its first record too: lt_bus.h */
    size_t healed = 0;
    char err[256];
    if (lt_bus_consumer_heal_stalls(api->consumer, 10000, 500, &healed, err, sizeof err) == LT_OK && healed) {
      api->stats.feed_healed += healed;
      lt_log_warn("api", "feed: %zu partition(s) stood still behind the log for 10 s: fetching them again", healed);
    }
  }
  if (now - api->sse_beat_at_ms >= 15000) { /* proxies cut idle streams: say something */
    api->sse_beat_at_ms = now;
    lt_api_events_heartbeat(api);
  }
}

/* The producer, told the topics it writes so a customer's first cancel does not wait for it to
 * discover lathe.control. */
static lt_err_t start_producer(lt_api_t *api, char *errstr, size_t n) {
  lt_bus_topic_name(api->conf.bus, "jobs", api->topic_jobs, sizeof api->topic_jobs);
  lt_bus_topic_name(api->conf.bus, "control", api->topic_control, sizeof api->topic_control);
  lt_bus_producer_opts_t popts = {.delivery_cb = on_delivery, .opaque = api};
  lt_err_t err = lt_bus_producer_new(api->conf.bus, &popts, &api->producer, errstr, n);
  if (err) return err;
  lt_bus_producer_prepare(api->producer, api->topic_jobs, 2000);
  lt_bus_producer_prepare(api->producer, api->topic_control, 2000);
  return LT_OK;
}

lt_err_t lt_api_feed_start(lt_api_t *api, char *errstr, size_t n) {
  /* workers: the heartbeats say which base models the fleet serves (checked at submission);
   * audit: the lockbox's records (lt_api_access.c); calls: which call an Idempotency-Key named
   * (lt_api_sessions.c). */
  static const char *const bases[] = {"jobs",    "control", "tenants", "progress",
                                      "artifacts", "workers", "audit",   "calls"};
  enum { NBASES = sizeof bases / sizeof *bases };
  lt_err_t err = start_producer(api, errstr, n);
  if (err) return err;
  lt_bus_admin_t *admin = NULL;
  err = lt_bus_admin_new(api->conf.bus, &admin, errstr, n);
  if (err) return err;
  lt_bus_tp_t parts[256];
  char(*names)[128] = calloc(NBASES, sizeof *names);
  size_t np = 0;
  if (!names) err = LT_ERR_NOMEM;
  api->feed_names = names;
  for (size_t b = 0; b < NBASES && !err; b++) {
    if (api->conf.sampler_only && strcmp(bases[b], "calls") == 0) continue; /* it takes no calls */
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
  api->feed_low = calloc(np ? np : 1, sizeof *api->feed_low);
  if (!api->feed_parts || !api->feed_low) return LT_ERR_NOMEM;
  memcpy(api->feed_parts, parts, np * sizeof *parts);
  api->nfeed = np;
  /* Watermarks first: once assigned, the consumer's long-poll fetches of empty partitions hold
   * the broker connection for up to fetch.wait.max.ms, and each watermark query would wait
   * behind one (~10 s for the 25 partitions of a fresh prefix). */
  if ((err = lt_bus_consumer_watermarks(api->consumer, api->feed_parts, np, api->feed_low, 10000, errstr, n)))
    return err;
  if ((err = lt_bus_consumer_assign(api->consumer, parts, np, errstr, n))) return err;
  api->consumer_ev = event_new(api->base, lt_bus_consumer_fd(api->consumer), EV_READ | EV_PERSIST, on_consumer, api);
  api->tick_ev = event_new(api->base, -1, EV_PERSIST, on_tick, api);
  struct timeval tv = {0, 200 * 1000};
  if (!api->consumer_ev || !api->tick_ev || event_add(api->consumer_ev, NULL) || event_add(api->tick_ev, &tv))
    return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot register consumer events");
  return LT_OK;
}

