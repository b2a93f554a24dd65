/* lt_api_events: GET /v1/jobs/{id}/events, Server-Sent Events of a job's records.
 *
 * Every folded record of a job (lt_api_events_on_record, from the feed) is kept in the job's
 * replay buffer and sent to the job's open streams. A stream first replays the buffer after
 * Last-Event-ID (header, or the last_event_id query parameter), then follows live, and ends with
 * "event: end" once the job is terminal.
 *
 * The buffer is bounded: the last conf.sse_history events of a job (older ones are dropped), and
 * a finished job's buffer is forgotten conf.sse_keep_ended_ms after it ended (its state stays in
 * GET /v1/jobs/{id}). A Last-Event-ID that is no longer kept — or was never sent — gets
 * "event: gap" with {"dropped": N, "message"} first, then the replay from the oldest event kept:
 * the client learns that it missed events rather than silently getting a partial history.
 *
 * A stream with nothing to say (a job queued for hours) gets a comment line ": keepalive" every
 * 15 s, so that proxies and load balancers with idle timeouts do not cut it.
 *
 * A stream is cut (its connection closed) when its client leaves conf.stream_backlog bytes of it
 * unread, as a sampling stream is: the API does not buffer a job's events without bound for a
 * client that reads nothing; and at the tick after the key that opened it is revoked or its
 * tenant disabled: a revoked key reads nothing more, whatever it opened before. */
#include "lt_api_int.h"
#include "lt_log.h"
#include "lt_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One job's replay buffer. */
typedef struct history {
  json_t *events;  /* [{id, event, data}], oldest first */
  int64_t dropped; /* events no longer kept */
} history_t;

struct lt_api_sse {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  char job_id[LT_ID_MAX + 1];
  char tenant[LT_ID_MAX + 1]; /* whose stream: counted against its held requests */
  char key_id[LT_TENANT_KEY_ID_LEN + 1]; /* the key that opened it */
  lt_api_sse_t *next;
};

int lt_api_events_streams_of(lt_api_t *api, const char *tenant) {
  int n = 0;
  for (lt_api_sse_t *s = api->sse; s; s = s->next) n += strcmp(s->tenant, tenant) == 0;
  return n;
}

void lt_api_history_free(void *hist) {
  history_t *h = hist;
  if (!h) return;
  json_decref(h->events);
  free(h);
}

/* "event: gap": the events the client asked to resume after are not all kept. */
static void send_gap(struct evhttp_request *req, const history_t *h, const char *last) {
  struct evbuffer *b = evbuffer_new();
  json_t *oldest = h ? json_object_get(json_array_get(h->events, 0), "id") : NULL;
  json_t *data = json_pack("{s:I,s:s,s:s}", "dropped", (json_int_t)(h ? h->dropped : 0), "last_event_id", last, "message",
                           "the events after Last-Event-ID are not all kept (the API keeps the newest of a job, and a "
                           "finished job's for a while): replaying from the oldest kept");
  if (oldest) json_object_set(data, "oldest_id", oldest);
  char *text = json_dumps(data, JSON_COMPACT);
  evbuffer_add_printf(b, "event: gap\ndata: %s\n\n", text ? text : "{}");
  free(text);
  json_decref(data);
  evhttp_send_reply_chunk(req, b);
  evbuffer_free(b);
}

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

static void sse_closed(void *arg) {
  lt_api_sse_t *s = arg;
  lt_api_door_release(s->req);
  sse_unlink(s->api, s);
  free(s);
}

/* Nothing more will happen to the job: the stream says so and ends. */
static void send_end(struct evhttp_request *req) {
  struct evbuffer *b = evbuffer_new();
  evbuffer_add_printf(b, "event: end\ndata: {}\n\n");
  evhttp_send_reply_chunk(req, b);
  evbuffer_free(b);
  evhttp_send_reply_end(req);
}

/* Closes the stream's connection now, with no end event: the client reconnects with its
 * Last-Event-ID if it may. */
static void sse_cut(lt_api_sse_t *s, const char *why) {
  lt_log_info("api", "event stream of job %s (tenant %s) cut: %s", s->job_id, s->tenant, why);
  struct evhttp_connection *evcon = s->evcon;
  lt_api_door_on_close(s->api, evcon, NULL, NULL);
  lt_api_door_release(s->req);
  sse_unlink(s->api, s);
  free(s);
  evhttp_connection_free(evcon);
}

/* Whether the stream's client left more than conf.stream_backlog bytes unread: then it is cut. */
static bool sse_backlogged(lt_api_sse_t *s) {
  if (lt_api_unread_bytes(s->evcon) <= s->api->conf.stream_backlog) return false;
  s->api->stats.events_cut_unread++;
  sse_cut(s, "its client left stream_backlog bytes unread");
  return true;
}

static void sse_end(lt_api_sse_t *s) {
  lt_api_door_on_close(s->api, s->evcon, NULL, NULL);
  send_end(s->req);
  sse_unlink(s->api, s);
  free(s);
}

void lt_api_events_stream(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  struct evhttp_request *req = c->req;
  const lt_job_t *j = c->job;
  const char *last = evhttp_find_header(evhttp_request_get_input_headers(req), "Last-Event-ID");
  struct evkeyvalq q;
  lt_api_parse_query(req, &q);
  if (!last) last = lt_api_query(&q, "last_event_id");
  if (!lt_job_state_is_terminal(j->state) && !lt_api_hold_room(api, req, c->tenant->tenant_id)) {
    evhttp_clear_headers(&q);
    return;
  }
  struct evkeyvalq *out = evhttp_request_get_output_headers(req);
  evhttp_add_header(out, "Content-Type", "text/event-stream");
  evhttp_add_header(out, "Cache-Control", "no-cache");
  evhttp_send_reply_start(req, 200, "OK");
  history_t *h = lt_map_get(api->history, j->job_id);
  json_t *hist = h ? h->events : NULL, *e;
  size_t start = 0, i;
  bool found = false;
  json_array_foreach(hist, i, e) if (last && strcmp(json_string_value(json_object_get(e, "id")), last) == 0) {
    start = i + 1;
    found = true;
  }
  if (last && !found) send_gap(req, h, last);
  for (i = start; i < json_array_size(hist); i++) sse_send(req, json_array_get(hist, i));
  evhttp_clear_headers(&q);
  if (lt_job_state_is_terminal(j->state)) {
    send_end(req);
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
  snprintf(s->tenant, sizeof s->tenant, "%s", c->tenant->tenant_id);
  snprintf(s->key_id, sizeof s->key_id, "%s", c->key_id);
  if (!lt_api_door_on_close(api, s->evcon, sse_closed, s)) {
    free(s);
    evhttp_send_reply_end(req); /* its close could not be watched: the client reconnects */
    return;
  }
  s->next = api->sse;
  api->sse = s;
}

/* What a customer may see of a record: no producer or worker (host names), reasons scrubbed of
 * server paths and host names. */
static void customer_view(lt_api_t *api, json_t *data) {
  json_object_del(data, "producer");
  json_object_del(data, "worker_id");
  static const char *const texts[] = {"reason", "detail"};
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    const char *v = json_string_value(json_object_get(data, texts[i]));
    if (!v) continue;
    char clean[1024];
    lt_api_scrub(api, v, clean, sizeof clean);
    json_object_set_new(data, texts[i], json_string(clean));
  }
}

void lt_api_events_on_record(lt_api_t *api, const lt_proj_result_t *res) {
  const char *job_id = res->job_id;
  if (!job_id && lt_avro_get_string(res->record, "job_id", &job_id, NULL) != LT_OK) return;
  const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job_id);
  if (!j) return;
  const char *event_id = NULL;
  if (lt_avro_get_string(res->record, "event_id", &event_id, NULL) != LT_OK) return;
  history_t *h = lt_map_get(api->history, job_id);
  if (!h) {
    if (!(h = calloc(1, sizeof *h)) || !(h->events = json_array()) || lt_map_set(api->history, job_id, h)) {
      lt_api_history_free(h);
      return;
    }
  }
  json_t *hist = h->events;
  size_t i;
  json_t *e;
  json_array_foreach(hist, i, e) if (strcmp(json_string_value(json_object_get(e, "id")), event_id) == 0) return;
  json_t *data = NULL;
  if (lt_avro_record_to_jansson(res->record, &data, NULL, 0) != LT_OK) return;
  json_object_set_new(data, "state", json_string(lt_job_state_name(j->state)));
  customer_view(api, data);
  json_t *entry = json_pack("{s:s,s:s,s:o}", "id", event_id, "event", res->type, "data", data);
  json_array_append_new(hist, entry);
  while (json_array_size(hist) > (size_t)api->conf.sse_history) {
    json_array_remove(hist, 0);
    h->dropped++;
  }
  for (lt_api_sse_t *s = api->sse, *next; s; s = next) {
    next = s->next;
    if (strcmp(s->job_id, job_id) != 0) continue;
    sse_send(s->req, entry);
    if (lt_job_state_is_terminal(j->state)) sse_end(s);
    else sse_backlogged(s);
  }
}

json_t *lt_api_events_history(lt_api_t *api, const char *job_id) {
  history_t *h = lt_map_get(api->history, job_id);
  return h ? h->events : NULL;
}

void lt_api_events_heartbeat(lt_api_t *api) {
  for (lt_api_sse_t *s = api->sse, *next; s; s = next) {
    next = s->next;
    struct evbuffer *b = evbuffer_new();
    if (!b) return;
    evbuffer_add_printf(b, ": keepalive\n\n");
    evhttp_send_reply_chunk(s->req, b);
    evbuffer_free(b);
    sse_backlogged(s);
  }
}

void lt_api_events_recheck(lt_api_t *api) {
  const lt_tenant_table_t *tenants = lt_proj_tenants(api->proj);
  for (lt_api_sse_t *s = api->sse, *next; s; s = next) {
    next = s->next;
    const lt_tenant_t *t = lt_tenant_get(tenants, s->tenant);
    const lt_tenant_key_t *k = lt_tenant_key(t, s->key_id);
    if (t && !t->disabled && k && !k->revoked) continue;
    api->stats.events_cut_key++;
    sse_cut(s, t && t->disabled ? "its tenant was disabled" : "the key that opened it was revoked");
  }
}

void lt_api_events_prune(lt_api_t *api) {
  int64_t now = lt_time_wall_ms();
  lt_map_iter_t it = {0};
  while (lt_map_next(api->history, &it)) {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), it.key);
    if (!j || (lt_job_state_is_terminal(j->state) && j->ended_at_ms > 0 &&
               now - j->ended_at_ms > api->conf.sse_keep_ended_ms))
      lt_map_del(api->history, it.key);
  }
}

void lt_api_events_free(lt_api_t *api) {
  while (api->sse) {
    lt_api_sse_t *s = api->sse;
    api->sse = s->next;
    lt_api_door_on_close(api, s->evcon, NULL, NULL);
    free(s);
  }
}
