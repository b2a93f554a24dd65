/* lt_api_events: GET /v1/jobs/{id}/events, Server-Sent Events of a job's records.
 *
 * Every folded record of a job (lt_api_events_on_record, from the feed) is kept in the job's
 * replay buffer (the last HISTORY_MAX) and sent to the job's open streams. A stream first
 * replays the buffer after Last-Event-ID (header, or the last_event_id query parameter), then
 * follows live, and ends with "event: end" once the job is terminal. */
#include "lt_api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HISTORY_MAX 1024

struct lt_api_sse {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  char job_id[LT_ID_MAX + 1];
  lt_api_sse_t *next;
};

void lt_api_history_free(void *hist) { json_decref(hist); }

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
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(req, 200, "OK");
  json_t *hist = lt_map_get(api->history, j->job_id);
  size_t start = 0, i;
  json_t *e;
  if (last && hist) {
    json_array_foreach(hist, i, e) if (strcmp(json_string_value(json_object_get(e, "id")), last) == 0) start = i + 1;
  }
  if (hist)
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
  json_t *hist = lt_map_get(api->history, job_id);
  if (!hist) {
    hist = json_array();
    if (lt_map_set(api->history, job_id, hist)) {
      json_decref(hist);
      return;
    }
  }
  size_t i;
  json_t *e;
  json_array_foreach(hist, i, e) if (strcmp(json_string_value(json_object_get(e, "id")), event_id) == 0) return;
  json_t *data = NULL;
  if (lt_avro_record_to_jansson(res->record, &data, NULL, 0) != LT_OK) return;
  json_object_set_new(data, "state", json_string(lt_job_state_name(j->state)));
  customer_view(api, data);
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

void lt_api_events_free(lt_api_t *api) {
  while (api->sse) {
    lt_api_sse_t *s = api->sse;
    api->sse = s->next;
    lt_api_door_on_close(api, s->evcon, NULL, NULL);
    free(s);
  }
}
