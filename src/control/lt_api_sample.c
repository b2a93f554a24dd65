/* lt_api_sample: the OpenAI-compatible sampling routes — POST /v1/completions,
 * POST /v1/chat/completions, GET /v1/models — over a sampling backend (lt_sampling.h; lathed's
 * sampler role gives it workers/lt_sampler.c).
 *
 * A request names a model: a base model the backend serves, or "ft:<base>:<job-id>", the
 * published adapter of one of the caller's own finished jobs (or ended sessions). Which jobs
 * exist is answered from this process's projection, for the caller's tenant only: another
 * tenant's job and a job that does not exist get the same 404, from the same code path, before
 * the adapter cache or the store is looked at (nothing about another tenant's adapter can be
 * timed). An adapter not in the backend's cache is read from the store and decrypted with the
 * job's artifact key on a pool thread, handed to the backend, and its plaintext scrubbed.
 *
 * `n` choices are n backend requests (seeds seed, seed + 1, ...). Without `stream`, the answer
 * comes when every choice ended; with it, Server-Sent Events carry each token's text as the
 * backend releases it, and `data: [DONE]` ends the stream. A client that goes away cancels its
 * requests (their cache blocks are freed): at once when its stream has started (libevent sees
 * the close), else within the front door's next peek (lt_api_limits.c: door_reap, every 2 s). Each answered request records its usage —
 * tenant, model, adapter, tokens in and out, time to first token, duration; never a prompt or an
 * output — to lathe.usage (SamplingUsage). */
#include "lt_api_int.h"

#include <event2/bufferevent.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_chat.h"
#include "lt_log.h"
#include "lt_publisher.h"
#include "lt_time.h"

#define MAX_N 8
#define MAX_TOKENS_CAP 4096
#define DEFAULT_TIMEOUT_S 300
#define ADAPTER_MAX_BYTES (512u << 20)

/* One backend event as the loop thread reads it (copied off the batch thread). */
typedef struct sev {
  int choice;
  lt_sample_event_t ev; /* pointers below are owned copies */
  char *text, *token_text, *finish, *msg;
  int32_t top_ids[LT_SAMPLE_MAX_TOP];
  float top_logp[LT_SAMPLE_MAX_TOP];
  char *top_text[LT_SAMPLE_MAX_TOP];
  struct sev *next;
} sev_t;

/* One choice of a request: what it produced so far. */
typedef struct choice {
  struct sample_req *owner;
  int index;
  uint64_t handle;
  bool submitted, done;
  char *text;
  size_t len, cap; /* text: its length, and the bytes allocated */
  json_t *logprobs; /* the choice's logprobs in the answer's form, or NULL */
  size_t offset;    /* text_offset of the next token (completions' logprobs) */
  char finish[16];
  lt_err_t err;
  char msg[256];
  int prompt_tokens, completion_tokens;
  int64_t ttft_ms, duration_ms;
} choice_t;

/* One HTTP request. Freed on the loop thread once every choice ended (or was cancelled). */
typedef struct sample_req {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  bool chat, stream, usage_in_stream, gone, started, answered, watching;
  char id[48], model[256], base[LT_JOB_NAME_MAX], adapter[LT_SAMPLE_ADAPTER_MAX + 1], job_id[LT_ID_MAX + 1];
  char tenant[LT_ID_MAX + 1];
  char key_id[LT_TENANT_KEY_ID_LEN + 1]; /* the key that sent it, for its usage record */
  int logprobs; /* alternatives per token; -1: no logprobs at all */
  int64_t created;
  lt_sample_req_t sreq; /* the template each choice is submitted from */
  char *prompt;
  char *stop[LT_SAMPLE_MAX_STOP];
  int n, left;
  choice_t ch[MAX_N];
  /* the adapter load (pool thread) */
  char st_key[LT_STORE_KEY_MAX + 1], cfg_key[LT_STORE_KEY_MAX + 1], dek_key[LT_STORE_KEY_MAX + 1];
  const lt_crypto_dek_t *tenant_dek;
  lt_err_t load_err;
  bool load_gone; /* the store has no such weights (LT_ERR_NOT_FOUND from it, staging only) */
  bool load_final; /* load_err says it can never be served here (too large, refused by the engine) */
  bool backlogged; /* its client left conf.stream_backlog bytes unread: cut (on_events) */
  char load_msg[256];
  /* events from the batch thread, under mu */
  pthread_mutex_t mu;
  sev_t *head, **tail;
  struct event *ev;
} sample_req_t;

/* ---------------------------------------------------------------- events from the backend */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static char *dup_len(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    if (n) memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* The batch thread's side: copy the event, wake the loop. */
static void on_backend_event(void *ctx, const lt_sample_event_t *ev) {
  choice_t *c = ctx;
  sample_req_t *r = c->owner;
  sev_t *e = calloc(1, sizeof *e);
  if (!e) return;
  e->choice = c->index;
  e->ev = *ev;
  e->text = dup_len(ev->text ? ev->text : "", ev->text_len);
  e->token_text = dup_or_null(ev->token_text);
  e->finish = dup_or_null(ev->finish);
  e->msg = dup_or_null(ev->msg);
  for (int i = 0; i < ev->ntop && i < LT_SAMPLE_MAX_TOP; i++) {
    e->top_ids[i] = ev->top_ids[i];
    e->top_logp[i] = ev->top_logp[i];
    e->top_text[i] = dup_or_null(ev->top_text[i]);
  }
  /* event_active under mu: once the loop has taken this event it may free r (the last event of
   * the last choice), and req_free takes mu before it frees the event, so it waits for this. */
  pthread_mutex_lock(&r->mu);
  *r->tail = e;
  r->tail = &e->next;
  event_active(r->ev, 0, 0);
  pthread_mutex_unlock(&r->mu);
}

/* Frees a string of the output, cleansed first. */
static void free_text(char *s) {
  if (s) OPENSSL_cleanse(s, strlen(s));
  free(s);
}

static void sev_free(sev_t *e) {
  free_text(e->text);
  free_text(e->token_text);
  free(e->finish);
  free(e->msg);
  for (int i = 0; i < LT_SAMPLE_MAX_TOP; i++) free_text(e->top_text[i]);
  free(e);
}

static void req_free(sample_req_t *r) {
  if (r->watching) lt_api_door_on_close(r->api, r->evcon, NULL, NULL);
  pthread_mutex_lock(&r->mu); /* the batch thread may still be in on_backend_event's event_active */
  if (r->ev) event_free(r->ev);
  r->ev = NULL;
  sev_t *e = r->head;
  r->head = NULL;
  pthread_mutex_unlock(&r->mu);
  while (e) {
    sev_t *next = e->next;
    sev_free(e);
    e = next;
  }
  for (int i = 0; i < r->n; i++) {
    if (r->ch[i].text) OPENSSL_cleanse(r->ch[i].text, r->ch[i].cap);
    free(r->ch[i].text);
    json_decref(r->ch[i].logprobs);
  }
  for (int i = 0; i < LT_SAMPLE_MAX_STOP; i++) free_text(r->stop[i]);
  if (r->prompt) OPENSSL_cleanse(r->prompt, strlen(r->prompt));
  free(r->prompt);
  pthread_mutex_destroy(&r->mu);
  free(r);
}

/* ---------------------------------------------------------------- answers */

static json_t *usage_json(const sample_req_t *r) {
  int completion = 0;
  for (int i = 0; i < r->n; i++) completion += r->ch[i].completion_tokens;
  int prompt = r->ch[0].prompt_tokens;
  return json_pack("{s:i,s:i,s:i}", "prompt_tokens", prompt, "completion_tokens", completion, "total_tokens",
                   prompt + completion);
}

static json_t *envelope(const sample_req_t *r, const char *object) {
  return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", r->id, "object", object, "created", (json_int_t)r->created,
                   "model", r->model, "system_fingerprint", "lathe");
}

/* The whole answer (no stream). */
static void answer(sample_req_t *r) {
  json_t *body = envelope(r, r->chat ? "chat.completion" : "text_completion"), *choices = json_array();
  for (int i = 0; i < r->n; i++) {
    choice_t *c = &r->ch[i];
    json_t *o = json_pack("{s:i,s:s}", "index", i, "finish_reason", c->finish);
    if (r->chat) json_object_set_new(o, "message", json_pack("{s:s,s:s%}", "role", "assistant", "content", c->text ? c->text : "", c->len));
    else json_object_set_new(o, "text", json_stringn(c->text ? c->text : "", c->len));
    json_object_set(o, "logprobs", c->logprobs ? c->logprobs : json_null());
    json_array_append_new(choices, o);
  }
  json_object_set_new(body, "choices", choices);
  json_object_set_new(body, "usage", usage_json(r));
  lt_api_reply_json(r->req, 200, body);
}

/* Sends one event; past conf.stream_backlog bytes the client has not read, sends nothing more and
 * marks the request to be cut once its events are taken (on_events): a client that reads nothing
 * must not make the API hold a whole long answer for it. */
static void sse_send(sample_req_t *r, json_t *chunk) {
  if (r->backlogged) {
    json_decref(chunk);
    return;
  }
  /* the whole answer's precision (lt_api_reply_json): a stream's logprobs are the same numbers */
  char *text = json_dumps(chunk, JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(chunk);
  struct evbuffer *b = evbuffer_new();
  evbuffer_add_printf(b, "data: %s\n\n", text ? text : "{}");
  free(text);
  evhttp_send_reply_chunk(r->req, b);
  evbuffer_free(b);
  if (lt_api_unread_bytes(r->evcon) > r->api->conf.stream_backlog) r->backlogged = true;
}

static void stream_start(sample_req_t *r) {
  if (r->started) return;
  struct evkeyvalq *h = evhttp_request_get_output_headers(r->req);
  evhttp_add_header(h, "Content-Type", "text/event-stream");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  evhttp_send_reply_start(r->req, 200, "OK");
  r->started = true;
  if (r->chat) /* the first chunk of each choice names the role */
    for (int i = 0; i < r->n; i++) {
      json_t *ch = envelope(r, "chat.completion.chunk");
      json_object_set_new(ch, "choices", json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", i, "delta", "role", "assistant",
                                                   "content", "", "logprobs", "finish_reason"));
      sse_send(r, ch);
    }
}

/* A stream chunk of one choice: text (may be empty), logprobs of its token (or NULL), finish. */
static void stream_chunk(sample_req_t *r, int i, const char *text, size_t len, json_t *lp, const char *finish) {
  json_t *ch = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
  json_t *o = json_pack("{s:i}", "index", i);
  if (r->chat) json_object_set_new(o, "delta", finish ? json_object() : json_pack("{s:s%}", "content", text, len));
  else json_object_set_new(o, "text", json_stringn(text, len));
  json_object_set_new(o, "logprobs", lp ? lp : json_null());
  json_object_set_new(o, "finish_reason", finish ? json_string(finish) : json_null());
  json_object_set_new(ch, "choices", json_pack("[o]", o));
  sse_send(r, ch);
}

/* ---------------------------------------------------------------- usage records */

static void usage_done(lt_api_t *api, void *ctx, lt_err_t err, const char *msg) {
  (void)api;
  if (err) lt_log_error("sampler", "usage of %s not recorded: %s", (char *)ctx, msg);
  free(ctx);
}

/* SamplingUsage to lathe.usage: counts and times, never a prompt or an output. */
static void record_usage(sample_req_t *r, const char *finish) {
  lt_api_t *api = r->api;
  lt_avro_record_t *rec = NULL;
  const uint8_t *bytes;
  size_t blen;
  int completion = 0;
  int64_t ttft = -1, duration = 0;
  for (int i = 0; i < r->n; i++) {
    completion += r->ch[i].completion_tokens;
    if (r->ch[i].ttft_ms >= 0 && (ttft < 0 || r->ch[i].ttft_ms < ttft)) ttft = r->ch[i].ttft_ms;
    if (r->ch[i].duration_ms > duration) duration = r->ch[i].duration_ms;
  }
  lt_err_t err = lt_avro_record_new(api->reg, "SamplingUsage", &rec, NULL, 0);
  if (!err) err = lt_avro_record_stamp(rec, api->conf.producer_id);
  if (!err) err = lt_avro_set_string(rec, "request_id", r->id);
  if (!err) err = lt_avro_set_string(rec, "tenant_id", r->tenant);
  if (!err) err = lt_avro_set_string(rec, "base_model", r->base);
  if (!err) err = r->job_id[0] ? lt_avro_set_string(rec, "adapter_job_id", r->job_id) : lt_avro_set_null(rec, "adapter_job_id");
  if (!err) err = lt_avro_set_string(rec, "endpoint", r->chat ? "chat.completions" : "completions");
  if (!err) err = lt_avro_set_int(rec, "choices", r->n);
  if (!err) err = lt_avro_set_bool(rec, "stream", r->stream);
  if (!err) err = lt_avro_set_long(rec, "tokens_in", r->ch[0].prompt_tokens);
  if (!err) err = lt_avro_set_long(rec, "tokens_out", completion);
  if (!err) err = lt_avro_set_long(rec, "ttft_ms", ttft);
  if (!err) err = lt_avro_set_long(rec, "duration_ms", duration);
  if (!err) err = lt_avro_set_string(rec, "finish", finish);
  if (!err) err = r->key_id[0] ? lt_avro_set_string(rec, "api_key_id", r->key_id) : lt_avro_set_null(rec, "api_key_id");
  if (!err) err = lt_avro_record_encode(rec, &bytes, &blen, NULL, 0);
  char *ctx = err ? NULL : strdup(r->id);
  if (ctx && lt_api_produce(api, api->topic_usage, LT_BUS_PARTITION_ANY, r->tenant, bytes, blen, false, usage_done, ctx))
    free(ctx);
  lt_avro_record_destroy(rec);
}

/* ---------------------------------------------------------------- the end of a request */

/* Every choice ended: answer (or end the stream), record the usage, free. */
static void finish(sample_req_t *r) {
  const char *worst = NULL;
  for (int i = 0; i < r->n; i++)
    if (r->ch[i].err) worst = r->ch[i].finish;
  if (!r->gone) {
    choice_t *bad = NULL;
    for (int i = 0; i < r->n && !bad; i++)
      if (r->ch[i].err) bad = &r->ch[i];
    if (bad) { /* a failed step's message may name the backend's files (a CUDA error's) */
      char clean[sizeof bad->msg];
      lt_api_scrub(r->api, bad->msg, clean, sizeof clean);
      snprintf(bad->msg, sizeof bad->msg, "%s", clean);
    }
    if (r->started) {
      if (bad) sse_send(r, json_pack("{s:{s:s,s:s}}", "error", "code", bad->finish, "message", bad->msg));
      else if (r->usage_in_stream) {
        json_t *ch = envelope(r, r->chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(ch, "choices", json_array());
        json_object_set_new(ch, "usage", usage_json(r));
        sse_send(r, ch);
      }
      struct evbuffer *b = evbuffer_new();
      evbuffer_add_printf(b, "data: [DONE]\n\n");
      evhttp_send_reply_chunk(r->req, b);
      evbuffer_free(b);
      evhttp_send_reply_end(r->req);
    } else if (bad && bad->err == LT_ERR_TIMEOUT) {
      lt_api_reply_error(r->req, 504, "timeout", "timeout", "%s", bad->msg);
    } else if (bad) {
      lt_api_reply_err(r->req, bad->err, NULL, bad->msg);
    } else {
      answer(r);
    }
  }
  record_usage(r, r->gone ? "cancelled" : worst ? worst : r->ch[0].finish);
  req_free(r);
}

static void take_events(sample_req_t *r);

static void take_event(sample_req_t *r, const sev_t *e);

/* The client went away: cancel every choice now (their cache blocks are freed); no event of
 * them comes after cancel returns. */
static void on_client_gone(void *arg) {
  sample_req_t *r = arg;
  r->watching = false;
  r->gone = true;
  r->answered = true;
  const lt_sample_ops_t *ops = r->api->conf.sampler;
  int pt[MAX_N], ct[MAX_N];
  for (int i = 0; i < r->n; i++) {
    pt[i] = ct[i] = -1;
    /* what it read and generated until now is its usage: no DONE event reports it */
    if (r->ch[i].submitted && !r->ch[i].done) ops->cancel(ops->ctx, r->ch[i].handle, &pt[i], &ct[i]);
  }
  /* No event comes after the cancels; those queued before them are taken now (gone: nothing is
   * sent), a choice's DONE among them with its counts. */
  take_events(r);
  for (int i = 0; i < r->n; i++)
    if (r->ch[i].submitted && !r->ch[i].done) {
      r->ch[i].done = true;
      snprintf(r->ch[i].finish, sizeof r->ch[i].finish, "cancelled");
      if (pt[i] >= 0) r->ch[i].prompt_tokens = pt[i];
      if (ct[i] >= 0) r->ch[i].completion_tokens = ct[i];
      r->left--;
    }
  lt_api_door_release(r->req);
  r->req = NULL;
  finish(r);
}

/* ---------------------------------------------------------------- tokens in */

/* One token's logprobs: the stream chunk's, or (no stream) appended to c's list for the answer
 * and NULL. A stream keeps no list: at n 8, 4,096 tokens and 20 alternatives it was ~350 MB of
 * JSON that nothing read. */
static json_t *add_logprobs(sample_req_t *r, choice_t *c, const sev_t *e) {
  if (r->logprobs < 0) return NULL;
  const lt_sample_event_t *ev = &e->ev;
  json_t *one;
  if (r->chat) {
    json_t *top = json_array();
    for (int i = 0; i < ev->ntop; i++)
      json_array_append_new(top, json_pack("{s:s,s:f}", "token", e->top_text[i] ? e->top_text[i] : "", "logprob",
                                           (double)e->top_logp[i]));
    one = json_pack("{s:s,s:f,s:o}", "token", e->token_text ? e->token_text : "", "logprob", (double)ev->logp,
                    "top_logprobs", top);
    if (r->stream) return json_pack("{s:[o]}", "content", one);
    if (!c->logprobs) c->logprobs = json_pack("{s:[]}", "content");
    json_array_append_new(json_object_get(c->logprobs, "content"), one);
    return NULL;
  }
  json_t *top = json_object();
  for (int i = 0; i < ev->ntop; i++)
    json_object_set_new(top, e->top_text[i] ? e->top_text[i] : "", json_real(e->top_logp[i]));
  const char *tt = e->token_text ? e->token_text : "";
  json_int_t at = (json_int_t)c->offset;
  c->offset += strlen(tt);
  if (r->stream)
    return json_pack("{s:[s],s:[f],s:[o],s:[I]}", "tokens", tt, "token_logprobs", (double)ev->logp, "top_logprobs",
                     top, "text_offset", at);
  if (!c->logprobs)
    c->logprobs = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
  json_array_append_new(json_object_get(c->logprobs, "tokens"), json_string(tt));
  json_array_append_new(json_object_get(c->logprobs, "token_logprobs"), json_real(ev->logp));
  json_array_append_new(json_object_get(c->logprobs, "top_logprobs"), top);
  json_array_append_new(json_object_get(c->logprobs, "text_offset"), json_integer(at));
  return NULL;
}

static void take_event(sample_req_t *r, const sev_t *e) {
  choice_t *c = &r->ch[e->choice];
  if (c->done) return;
  if (e->ev.kind == LT_SAMPLE_TOKEN) {
    size_t len = strlen(e->text);
    if (c->len + len + 1 > c->cap) { /* not realloc: the old copy is cleansed before it goes */
      size_t cap = c->cap ? c->cap : 256;
      while (cap < c->len + len + 1) cap *= 2;
      char *t = malloc(cap);
      if (!t) return;
      if (c->text) memcpy(t, c->text, c->len);
      if (c->text) OPENSSL_cleanse(c->text, c->cap);
      free(c->text);
      c->text = t;
      c->cap = cap;
    }
    memcpy(c->text + c->len, e->text, len + 1);
    c->len += len;
    json_t *lp = add_logprobs(r, c, e);
    if (r->stream && !r->gone) {
      stream_start(r);
      if (len || lp) stream_chunk(r, c->index, e->text, len, lp, NULL);
      else json_decref(lp);
    } else {
      json_decref(lp);
    }
    return;
  }
  c->done = true;
  r->left--;
  snprintf(c->finish, sizeof c->finish, "%s", e->finish ? e->finish : "stop");
  c->err = e->ev.err;
  snprintf(c->msg, sizeof c->msg, "%s", e->msg ? e->msg : "");
  c->prompt_tokens = e->ev.prompt_tokens;
  c->completion_tokens = e->ev.completion_tokens;
  c->ttft_ms = e->ev.ttft_ms;
  c->duration_ms = e->ev.duration_ms;
  if (r->stream && !r->gone && !c->err) {
    stream_start(r);
    stream_chunk(r, c->index, "", 0, NULL, c->finish);
  }
}

/* Takes the events queued so far, in order. */
static void take_events(sample_req_t *r) {
  pthread_mutex_lock(&r->mu);
  sev_t *e = r->head;
  r->head = NULL;
  r->tail = &r->head;
  pthread_mutex_unlock(&r->mu);
  while (e) {
    sev_t *next = e->next;
    take_event(r, e);
    sev_free(e);
    e = next;
  }
}

/* The loop's side: drain the events. */
static void on_events(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  sample_req_t *r = arg;
  take_events(r);
  if (r->backlogged && !r->gone && r->watching) {
    /* cut: as if the client had gone (the choices cancelled, the usage so far recorded, r freed),
     * then the connection freed, which frees the request */
    lt_log_info("sampler", "request %s of tenant %s: stream cut, its client left over %zu bytes unread", r->id,
                r->tenant, r->api->conf.stream_backlog);
    r->api->stats.streams_cut++;
    struct evhttp_connection *evcon = r->evcon;
    lt_api_door_on_close(r->api, evcon, NULL, NULL);
    on_client_gone(r);
    evhttp_connection_free(evcon);
    return;
  }
  if (r->left == 0 && !r->answered) {
    r->answered = true;
    finish(r);
  }
}

/* ---------------------------------------------------------------- submit */

/* Submits every choice; on refusal cancels those submitted and answers. */
static void submit_all(sample_req_t *r) {
  const lt_sample_ops_t *ops = r->api->conf.sampler;
  char msg[256];
  for (int i = 0; i < r->n; i++) {
    lt_sample_req_t q = r->sreq;
    q.seed = r->sreq.seed + (uint64_t)i;
    q.on_event = on_backend_event;
    q.ctx = &r->ch[i];
    lt_err_t err = ops->submit(ops->ctx, &q, &r->ch[i].handle, msg, sizeof msg);
    if (err) {
      for (int k = 0; k < i; k++) ops->cancel(ops->ctx, r->ch[k].handle, NULL, NULL);
      if (err == LT_ERR_QUOTA) {
        evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", "1");
        lt_api_reply_error(r->req, 429, "rate_limited", NULL, "%s", msg);
      } else if (err == LT_ERR_NOT_FOUND && r->adapter[0]) {
        /* its model was resolved: the cache let the adapter go past its hold (a loop held up for a
         * second), which a retry loads again; not a model that does not exist */
        evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", "1");
        lt_api_reply_error(r->req, 503, "unavailable", "model",
                           "the adapter of %s left the sampler's cache before the request started; retry", r->model);
      } else {
        lt_api_reply_err(r->req, err, err == LT_ERR_INVALID ? "prompt" : "model", msg);
      }
      req_free(r);
      return;
    }
    r->ch[i].submitted = true;
  }
  r->watching = lt_api_door_on_close(r->api, r->evcon, on_client_gone, r);
  if (!r->watching) {
    /* Unwatched, a request could outlive its connection (a stream's close; any at shutdown,
     * when evhttp_free frees the request) and be written to after it was freed. */
    for (int i = 0; i < r->n; i++) ops->cancel(ops->ctx, r->ch[i].handle, NULL, NULL);
    lt_api_reply_error(r->req, 503, "unavailable", NULL, "the connection cannot be watched; retry");
    req_free(r);
  }
}

/* The pool's side of an adapter load: read, decrypt, hand to the backend, scrub. */
static void load_work(void *ctx) {
  sample_req_t *r = ctx;
  lt_api_t *api = r->api;
  char *msg = r->load_msg;
  size_t n = sizeof r->load_msg;
  void *blob = NULL, *st = NULL, *cfg = NULL;
  size_t blen = 0, st_len = 0, cfg_len = 0;
  lt_crypto_dek_t *job_dek = NULL;
  lt_err_t err = LT_OK;
  if (r->dek_key[0]) { /* a published adapter: its job's key (none before jobs had keys: the tenant's) */
    err = lt_store_get(api->conf.store, r->dek_key, LT_CRYPTO_WRAPPED_MAX, &blob, &blen, NULL, msg, n);
    if (!err) err = lt_crypto_dek_unwrap(api->conf.kek, r->tenant, blob, blen, &job_dek, msg, n);
    free(blob);
    if (err == LT_ERR_NOT_FOUND) err = LT_OK;
  }
  const lt_crypto_dek_t *dek = job_dek ? job_dek : r->tenant_dek;
  lt_store_info_t info;
  if (!err && lt_store_head(api->conf.store, r->st_key, &info, NULL, 0) == LT_OK && info.size > ADAPTER_MAX_BYTES) {
    err = lt_errf(msg, n, LT_ERR_UNSUPPORTED, "its weights are over this sampler's limit of %u MiB an adapter",
                  ADAPTER_MAX_BYTES >> 20);
    r->load_final = true;
  }
  if (!err) err = lt_sealed_get(api->conf.store, dek, r->st_key, ADAPTER_MAX_BYTES + 4096, &st, &st_len, msg, n);
  if (!err) err = lt_sealed_get(api->conf.store, dek, r->cfg_key, 1u << 20, &cfg, &cfg_len, msg, n);
  r->load_gone = err == LT_ERR_NOT_FOUND && !r->dek_key[0];
  const lt_sample_ops_t *ops = api->conf.sampler;
  if (!err) {
    err = ops->load_adapter(ops->ctx, r->adapter, r->base, st, st_len, cfg, cfg_len, msg, n);
    r->load_final = err == LT_ERR_UNSUPPORTED || err == LT_ERR_INVALID; /* the engine's own refusal */
  }
  if (st) OPENSSL_cleanse(st, st_len);
  if (cfg) OPENSSL_cleanse(cfg, cfg_len);
  free(st);
  free(cfg);
  lt_crypto_dek_destroy(job_dek);
  r->load_err = err;
}

void lt_api_sample_forget(lt_api_t *api, const char *tenant_id, const char *job_id) {
  const lt_sample_ops_t *ops = api->conf.sampler;
  char id[2 * LT_ID_MAX + 2];
  if (!ops || !ops->forget) return;
  snprintf(id, sizeof id, "%s/%s", tenant_id, job_id);
  ops->forget(ops->ctx, id);
}

/* Why an adapter can never be served here (api->adapters_refused; at most 4,096 are kept). */
typedef struct {
  lt_err_t err;
  char why[256];
} refused_t;

/* An adapter that can never be served here: 413 when it is too large, 400 when its files are
 * refused (a rank the base model cannot take); neither is a retry's to mend. */
static void refuse_adapter(sample_req_t *r, lt_err_t err, const char *why) {
  if (err == LT_ERR_UNSUPPORTED) lt_api_reply_error(r->req, 413, "too_large", "model", "%s: %s", r->model, why);
  else lt_api_reply_error(r->req, 400, "invalid", "model", "%s cannot be served: %s", r->model, why);
}

static void load_after(lt_api_t *api, void *ctx) {
  sample_req_t *r = ctx;
  if (r->adapter[0] && lt_api_job_deleted(api, r->job_id)) {
    /* deleted while the pool loaded it: the fold's forget came before the adapter was there */
    lt_api_sample_forget(api, r->tenant, r->job_id);
    lt_api_reply_error(r->req, 404, "model_not_found", "model",
                       "the model %s does not exist or you do not have access to it (GET /v1/models lists yours)",
                       r->model);
    req_free(r);
    return;
  }
  if (r->load_err) {
    lt_log_warn("sampler", "adapter %s not loaded: %s", r->adapter, r->load_msg);
    if (r->load_final) {
      /* it never will be (too large, or its files refused): remembered, so that a client retrying
       * is answered at once, not after the adapter was read, decrypted and parsed again */
      refused_t *f = lt_map_count(api->adapters_refused) < 4096 ? malloc(sizeof *f) : NULL;
      if (f) {
        f->err = r->load_err;
        snprintf(f->why, sizeof f->why, "%s", r->load_msg);
        if (lt_map_set(api->adapters_refused, r->adapter, f) != LT_OK) free(f);
      }
    }
    if (r->load_err == LT_ERR_QUOTA) {
      evhttp_add_header(evhttp_request_get_output_headers(r->req), "Retry-After", "1");
      lt_api_reply_error(r->req, 429, "rate_limited", NULL, "%s", r->load_msg);
    } else if (r->load_final) {
      refuse_adapter(r, r->load_err, r->load_msg);
    } else if (r->load_err == LT_ERR_CORRUPT || r->load_err == LT_ERR_INVALID) {
      /* the stored bytes, or their key, do not open: ours to mend, and the store's words (which
       * name its keys) stay in the log */
      lt_api_reply_error(r->req, 500, "internal", "model", "the adapter of %s could not be read", r->model);
    } else if (r->load_gone) { /* staging weights retention let go, or a session's end took */
      lt_api_reply_error(r->req, 404, "model_not_found", "model", "the weights of %s are no longer kept%s", r->model,
                         lt_api_is_session_id(r->job_id) ? ""
                                                         : " (a job keeps its newest checkpoints: see "
                                                           "GET /v1/fine_tuning/jobs/{id}/checkpoints)");
    } else {
      lt_api_reply_error(r->req, 503, "unavailable", "model", "the adapter of %s could not be loaded; retry", r->model);
    }
    req_free(r);
    return;
  }
  submit_all(r);
}

/* ---------------------------------------------------------------- the model */

/* The published object key of one of the job's artifacts, or NULL. */
static const char *artifact_key(lt_api_t *api, const char *job_id, const char *name) {
  json_t *arts = json_object_get(lt_proj_job_info(api->proj, job_id), "artifacts"), *a;
  size_t i;
  json_array_foreach(arts, i, a) if (strcmp(json_string_value(json_object_get(a, "name")), name) == 0) return json_string_value(
      json_object_get(a, "key"));
  return NULL;
}

/* ckpt-step-<N> of managed job j: the adapter of its committed checkpoint at step N (the newest
 * attempt's that committed there), in staging under the tenant's key, as
 * GET /v1/fine_tuning/jobs/{id}/checkpoints names it. Retention keeps a job's newest checkpoints
 * only: an older one's objects are gone, which the load answers 404. */
static bool resolve_checkpoint(lt_api_t *api, const lt_job_t *j, const char *name, sample_req_t *r) {
  const char *digits = strncmp(name, "ckpt-step-", 10) == 0 ? name + 10 : "";
  size_t nd = strlen(digits);
  if (nd == 0 || nd > 18 || strspn(digits, "0123456789") != nd || (digits[0] == '0' && nd > 1)) return false;
  int64_t step = strtoll(digits, NULL, 10);
  size_t n = 0;
  const lt_proj_ckpt_t *ck = lt_proj_job_checkpoints(api->proj, j->job_id, &n), *hit = NULL;
  for (size_t i = n; i-- > 0 && !hit;)
    if (ck[i].step == step) hit = &ck[i];
  if (!hit ||
      lt_publisher_staging_key(r->st_key, sizeof r->st_key, j->tenant_id, j->job_id, hit->attempt, step,
                               "adapter_model.safetensors") ||
      lt_publisher_staging_key(r->cfg_key, sizeof r->cfg_key, j->tenant_id, j->job_id, hit->attempt, step,
                               "adapter_config.json"))
    return false;
  snprintf(r->adapter, sizeof r->adapter, "%s/%s/ckpt-%d-%lld", j->tenant_id, j->job_id, (int)hit->attempt,
           (long long)step);
  r->dek_key[0] = '\0';
  return true;
}

/* ft:<base>:<id>[:<name>] of tenant t: a finished job's (or ended session's) published adapter,
 * or, with a name, the weights a live session saved under it (save_weights_for_sampler), or a
 * managed job's committed checkpoint (ckpt-step-N: resolve_checkpoint). */
static bool resolve_adapter(lt_api_call_t *c, sample_req_t *r) {
  lt_api_t *api = c->api;
  char base[LT_JOB_NAME_MAX] = "", id[LT_ID_MAX + 1] = "", name[LT_ID_MAX + 1] = "";
  const char *m = r->model + 3, *c1 = strchr(m, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
  if (!c1 || (size_t)(c1 - m) >= sizeof base) return false; /* the base: an id or ORG/NAME */
  size_t idlen = c2 ? (size_t)(c2 - c1 - 1) : strlen(c1 + 1);
  if (idlen > LT_ID_MAX || (c2 && strlen(c2 + 1) > LT_ID_MAX)) return false;
  memcpy(base, m, (size_t)(c1 - m));
  memcpy(id, c1 + 1, idlen);
  if (c2) snprintf(name, sizeof name, "%s", c2 + 1);
  const lt_job_t *j = lt_id_valid(id) ? lt_job_get(lt_proj_jobs(api->proj), id) : NULL;
  if (!j || strcmp(j->tenant_id, c->tenant->tenant_id) != 0 || lt_api_job_deleted(api, j->job_id) ||
      strcmp(j->base_model, base) != 0)
    return false;
  if (name[0] && !lt_api_is_session_id(j->job_id)) {
    if (!resolve_checkpoint(api, j, name, r)) return false;
  } else if (name[0]) { /* a live session's saved weights: in staging, under the tenant's key */
    int64_t ckpt = 0;
    const char *state = lt_id_valid(name) && lt_api_is_session_id(j->job_id) && !lt_job_state_is_terminal(j->state)
                            ? lt_api_sessions_saved(api, j->job_id, name, &ckpt)
                            : NULL;
    size_t dir = state ? strlen(state) - strlen("state.bin") : 0;
    if (!state || dir == 0 || dir >= LT_STORE_KEY_MAX - 32) return false;
    snprintf(r->st_key, sizeof r->st_key, "%.*sadapter_model.safetensors", (int)dir, state);
    snprintf(r->cfg_key, sizeof r->cfg_key, "%.*sadapter_config.json", (int)dir, state);
    snprintf(r->adapter, sizeof r->adapter, "%s/%s/%lld", j->tenant_id, j->job_id, (long long)ckpt);
    r->dek_key[0] = '\0';
  } else {
    const char *st = artifact_key(api, j->job_id, "adapter_model.safetensors");
    const char *cfg = artifact_key(api, j->job_id, "adapter_config.json");
    if (!st || !cfg) return false;
    snprintf(r->st_key, sizeof r->st_key, "%s", st);
    snprintf(r->cfg_key, sizeof r->cfg_key, "%s", cfg);
    snprintf(r->adapter, sizeof r->adapter, "%s/%s", j->tenant_id, j->job_id);
    lt_publisher_artifact_dek_key(r->dek_key, sizeof r->dek_key, j->tenant_id, j->job_id);
  }
  snprintf(r->base, sizeof r->base, "%s", j->base_model);
  snprintf(r->job_id, sizeof r->job_id, "%s", j->job_id);
  return true;
}

/* Whether the sampler beside this API serves base. */
static bool base_served(const lt_sample_ops_t *ops, const char *base) {
  for (const char *const *b = ops->models(ops->ctx); *b; b++)
    if (strcmp(*b, base) == 0) return true;
  return false;
}

/* Resolves r->model for the caller: a served base model, or one of its own adapters
 * (resolve_adapter). Replies 404 — the same for another tenant's job as for none — and returns
 * false. */
static bool resolve_model(lt_api_call_t *c, sample_req_t *r) {
  const lt_sample_ops_t *ops = c->api->conf.sampler;
  /* A key limited to some models (TenantUpserted v5) is told of another what it is told of a model
   * that does not exist, before anything is looked up. */
  bool allowed = lt_tenant_key_may_use(lt_tenant_key(c->tenant, c->key_id), r->model);
  if (allowed && strncmp(r->model, "ft:", 3) == 0) {
    if (!resolve_adapter(c, r)) r->base[0] = '\0';
    else if (!base_served(ops, r->base)) { /* its own adapter, of a base this sampler does not have */
      lt_api_reply_error(c->req, 404, "model_not_found", "model",
                         "the base model %s of %s is not served by this sampler (GET /v1/models lists what is)",
                         r->base, r->model);
      return false;
    }
  } else if (allowed && base_served(ops, r->model)) {
    snprintf(r->base, sizeof r->base, "%.*s", (int)sizeof r->base - 1, r->model); /* a served name fits */
  }
  if (r->base[0]) return true;
  lt_api_reply_error(c->req, 404, "model_not_found", "model",
                     "the model %s does not exist or you do not have access to it (GET /v1/models lists yours)", r->model);
  return false;
}

/* ---------------------------------------------------------------- requests */

/* A number field in [lo, hi] (absent or null: def). False after replying 400 naming it. */
static bool num_field(lt_api_call_t *c, json_t *body, const char *name, double lo, double hi, double def, bool integer,
                      double *out) {
  json_t *v = json_object_get(body, name);
  *out = def;
  if (!v || json_is_null(v)) return true;
  if (!json_is_number(v) || (integer && !json_is_integer(v)) || json_number_value(v) < lo || json_number_value(v) > hi ||
      !isfinite(json_number_value(v))) {
    lt_api_reply_error(c->req, 400, "invalid", name, "%s must be %s from %g to %g", name, integer ? "an integer" : "a number",
                       lo, hi);
    return false;
  }
  *out = json_number_value(v);
  return true;
}

/* The fields of a request this API reads; any other is refused by name (a typo is not silently
 * ignored). Fields OpenAI defines that change nothing here (user) are accepted. */
static const char *const completion_fields[] = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "seed",
                                                "stop", "n", "logprobs", "stream", "stream_options", "timeout", "user",
                                                "echo", "presence_penalty", "frequency_penalty", "best_of", NULL};
static const char *const chat_fields[] = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature",
                                          "top_p", "top_k", "seed", "stop", "n", "logprobs", "top_logprobs", "stream",
                                          "stream_options", "timeout", "user", "presence_penalty", "frequency_penalty",
                                          NULL};

static bool known_fields(lt_api_call_t *c, json_t *body, const char *const *fields) {
  const char *k;
  json_t *v;
  json_object_foreach(body, k, v) {
    bool ok = false;
    for (const char *const *f = fields; *f && !ok; f++) ok = strcmp(*f, k) == 0;
    if (!ok) {
      lt_api_reply_error(c->req, 400, "invalid", k, "unknown field \"%s\"", k);
      return false;
    }
  }
  /* Accepted for compatibility only at their neutral values. */
  static const char *const zero[] = {"presence_penalty", "frequency_penalty", NULL};
  for (const char *const *f = zero; *f; f++) {
    json_t *z = json_object_get(body, *f);
    if (z && !json_is_null(z) && (!json_is_number(z) || json_number_value(z) != 0)) {
      lt_api_reply_error(c->req, 400, "unsupported", *f, "%s is not supported (only 0)", *f);
      return false;
    }
  }
  json_t *e = json_object_get(body, "echo"), *b = json_object_get(body, "best_of");
  if ((e && !json_is_null(e) && !json_is_false(e)) || (b && !json_is_null(b) && !(json_is_integer(b) && json_integer_value(b) == 1))) {
    bool echo = e && !json_is_null(e) && !json_is_false(e);
    lt_api_reply_error(c->req, 400, "unsupported", echo ? "echo" : "best_of", "echo and best_of are not supported");
    return false;
  }
  return true;
}

/* The sampling parameters every request shares, into r->sreq. */
static bool read_params(lt_api_call_t *c, json_t *body, sample_req_t *r) {
  double max_tokens, temperature, top_p, top_k, n, timeout;
  /* chat: max_completion_tokens (OpenAI's newer name) wins; max_tokens, given too, is checked alike */
  bool mct = r->chat && json_object_get(body, "max_completion_tokens");
  if ((mct && !num_field(c, body, "max_tokens", 1, MAX_TOKENS_CAP, 0, true, &max_tokens)) ||
      !num_field(c, body, mct ? "max_completion_tokens" : "max_tokens", 1, MAX_TOKENS_CAP, r->chat ? 256 : 16, true,
                 &max_tokens) ||
      !num_field(c, body, "temperature", 0, 2, 1, false, &temperature) ||
      !num_field(c, body, "top_p", 1e-9, 1, 1, false, &top_p) || !num_field(c, body, "top_k", 0, 1e9, 0, true, &top_k) ||
      !num_field(c, body, "n", 1, MAX_N, 1, true, &n) ||
      !num_field(c, body, "timeout", 0.001, 3600, DEFAULT_TIMEOUT_S, false, &timeout))
    return false;
  /* seed: any 64-bit integer, taken exactly (not through a double), negative ones too */
  json_t *sd = json_object_get(body, "seed");
  if (sd && !json_is_null(sd) && !json_is_integer(sd)) {
    lt_api_reply_error(c->req, 400, "invalid", "seed", "seed must be an integer");
    return false;
  }
  json_t *stop = json_object_get(body, "stop"), *s;
  size_t i;
  if (json_is_string(stop)) stop = json_pack("[O]", stop);
  else if (!stop || json_is_null(stop)) stop = json_array();
  else json_incref(stop);
  bool ok = json_is_array(stop) && json_array_size(stop) <= LT_SAMPLE_MAX_STOP;
  json_array_foreach(stop, i, s) ok = ok && json_is_string(s) && json_string_length(s) > 0 && json_string_length(s) <= 256;
  if (!ok) {
    json_decref(stop);
    lt_api_reply_error(c->req, 400, "invalid", "stop", "stop must be a string or up to %d non-empty strings of at most 256 bytes",
                       LT_SAMPLE_MAX_STOP);
    return false;
  }
  json_array_foreach(stop, i, s) r->stop[i] = strdup(json_string_value(s));
  r->sreq.nstop = (int)json_array_size(stop);
  json_decref(stop);
  for (int k = 0; k < r->sreq.nstop; k++) r->sreq.stop[k] = r->stop[k];
  json_t *st = json_object_get(body, "stream"), *so = json_object_get(body, "stream_options");
  if (st && !json_is_boolean(st) && !json_is_null(st)) {
    lt_api_reply_error(c->req, 400, "invalid", "stream", "stream must be true or false");
    return false;
  }
  r->stream = json_is_true(st);
  r->usage_in_stream = json_is_true(json_object_get(so, "include_usage"));
  uint64_t rnd = 0;
  if (!json_is_integer(sd)) RAND_bytes((unsigned char *)&rnd, sizeof rnd); /* no seed given: a fresh one */
  r->sreq.seed = json_is_integer(sd) ? (uint64_t)json_integer_value(sd) : rnd;
  r->sreq.max_tokens = (int)max_tokens;
  r->sreq.temperature = (float)temperature;
  r->sreq.top_p = (float)top_p;
  r->sreq.top_k = (int)top_k;
  r->n = (int)n;
  r->sreq.deadline_ms = lt_time_mono_ms() + (int64_t)(timeout * 1000);
  return true;
}

/* logprobs: completions take an integer (alternatives, 0..20); chat a boolean and top_logprobs. */
static bool read_logprobs(lt_api_call_t *c, json_t *body, sample_req_t *r) {
  json_t *lp = json_object_get(body, "logprobs");
  double top = 0;
  r->logprobs = -1;
  if (r->chat) {
    if (lp && !json_is_boolean(lp) && !json_is_null(lp)) {
      lt_api_reply_error(c->req, 400, "invalid", "logprobs", "logprobs must be true or false");
      return false;
    }
    if (!num_field(c, body, "top_logprobs", 0, LT_SAMPLE_MAX_TOP, 0, true, &top)) return false;
    if (json_is_true(lp)) r->logprobs = (int)top;
  } else if (lp && !json_is_null(lp)) {
    if (!num_field(c, body, "logprobs", 0, 5, 0, true, &top)) return false;
    r->logprobs = (int)top;
  }
  r->sreq.top_logprobs = r->logprobs > 0 ? r->logprobs : 0;
  return true;
}

/* A message's content as text: a string, or an array of {type: "text", text} parts. */
static json_t *content_text(json_t *content) {
  if (json_is_string(content)) return json_incref(content);
  if (!json_is_array(content)) return NULL;
  char *buf = NULL;
  size_t len = 0, i;
  json_t *part;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return NULL;
  bool ok = true;
  json_array_foreach(content, i, part) {
    const char *t = json_string_value(json_object_get(part, "text"));
    ok = ok && t && strcmp(json_string_value(json_object_get(part, "type")) ? json_string_value(json_object_get(part, "type")) : "", "text") == 0;
    if (ok) fputs(t, f);
  }
  fclose(f);
  json_t *out = ok ? json_stringn(buf, len) : NULL;
  free(buf);
  return out;
}

/* The chat messages rendered with the base model's own template into r->prompt. */
static bool render_chat(lt_api_call_t *c, json_t *body, sample_req_t *r) {
  json_t *msgs = json_object_get(body, "messages"), *m, *norm = json_array();
  size_t i;
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    json_decref(norm);
    lt_api_reply_error(c->req, 400, "invalid", "messages", "messages must be a non-empty array of {role, content}");
    return false;
  }
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *text = content_text(json_object_get(m, "content"));
    if (!role || !text) {
      json_decref(text);
      json_decref(norm);
      lt_api_reply_error(c->req, 400, "invalid", "messages", "messages[%zu] needs a role and a text content", i);
      return false;
    }
    json_array_append_new(norm, json_pack("{s:s,s:o}", "role", role, "content", text));
  }
  const lt_sample_ops_t *ops = c->api->conf.sampler;
  char *tmpl = NULL, *bos = NULL, *eos = NULL, msg[256];
  lt_err_t err = ops->model_info(ops->ctx, r->base, &tmpl, &bos, &eos, msg, sizeof msg);
  if (!err && !tmpl)
    err = lt_errf(msg, sizeof msg, LT_ERR_INVALID, "the base model %s has no chat template (chat_template in its "
                  "tokenizer_config.json): use /v1/completions", r->base);
  if (!err) err = lt_chat_render(tmpl, norm, true, bos, eos, &r->prompt, msg, sizeof msg);
  free(tmpl);
  free(bos);
  free(eos);
  json_decref(norm);
  if (err == LT_ERR_UNSUPPORTED) /* the model's template, not the request: 400, for a 500 is retried */
    lt_api_reply_error(c->req, 400, "invalid", "model",
                       "the chat template of the base model %s is outside what this server renders (%s): use "
                       "/v1/completions", r->base, msg);
  else if (err) lt_api_reply_err(c->req, err, err == LT_ERR_INVALID ? "messages" : "model", msg);
  r->sreq.special = true; /* the template's own markers are special tokens */
  return !err;
}

static bool read_prompt(lt_api_call_t *c, json_t *body, sample_req_t *r) {
  json_t *p = json_object_get(body, "prompt");
  if (json_is_array(p) && json_array_size(p) == 1) p = json_array_get(p, 0);
  if (!json_is_string(p)) {
    lt_api_reply_error(c->req, 400, "invalid", "prompt", "prompt must be a string (or an array of one string)");
    return false;
  }
  r->prompt = strdup(json_string_value(p));
  if (!r->prompt) lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
  return r->prompt != NULL;
}

static void sample_route(lt_api_call_t *c, bool chat) {
  lt_api_t *api = c->api;
  if (!api->conf.sampler) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "sampling is served by the sampler (lathed --role sampler)");
    return;
  }
  char *text = lt_api_body_text(api, c->req, NULL);
  if (!text) return;
  json_error_t jerr;
  json_t *body = json_loads(text, 0, &jerr);
  OPENSSL_cleanse(text, strlen(text));
  free(text);
  if (!json_is_object(body)) {
    json_decref(body);
    lt_api_reply_error(c->req, 400, "invalid", NULL, "the body is not a JSON object (line %d: %s)", jerr.line, jerr.text);
    return;
  }
  sample_req_t *r = calloc(1, sizeof *r);
  const char *model = json_string_value(json_object_get(body, "model"));
  bool ok = r != NULL;
  if (!ok) lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
  if (ok) {
    r->api = api;
    r->req = c->req;
    r->evcon = evhttp_request_get_connection(c->req);
    r->chat = chat;
    r->created = lt_time_wall_ms() / 1000;
    r->tail = &r->head;
    pthread_mutex_init(&r->mu, NULL);
    snprintf(r->tenant, sizeof r->tenant, "%s", c->tenant->tenant_id);
    snprintf(r->key_id, sizeof r->key_id, "%s", c->key_id);
    unsigned char rnd[12];
    RAND_bytes(rnd, sizeof rnd);
    int k = snprintf(r->id, sizeof r->id, "%s", chat ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof rnd; i++) k += snprintf(r->id + k, sizeof r->id - (size_t)k, "%02x", rnd[i]);
    for (int i = 0; i < MAX_N; i++) r->ch[i] = (choice_t){.owner = r, .index = i, .ttft_ms = -1};
  }
  ok = ok && known_fields(c, body, chat ? chat_fields : completion_fields);
  if (ok && (!model || strlen(model) >= sizeof r->model)) {
    lt_api_reply_error(c->req, 400, "invalid", "model", "model must be a string: a base model or ft:<base>:<job-id>");
    ok = false;
  }
  if (ok) snprintf(r->model, sizeof r->model, "%s", model);
  ok = ok && read_params(c, body, r) && read_logprobs(c, body, r) && resolve_model(c, r) &&
       (chat ? render_chat(c, body, r) : read_prompt(c, body, r));
  json_decref(body);
  if (!ok) {
    if (r) req_free(r);
    return;
  }
  r->left = r->n;
  r->sreq.tenant = r->tenant;
  r->sreq.weight = c->tenant->weight > 0 ? c->tenant->weight : 1;
  r->sreq.base = r->base;
  r->sreq.adapter = r->adapter;
  r->sreq.prompt = r->prompt;
  r->ev = event_new(api->base, -1, 0, on_events, r);
  if (!r->ev) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    req_free(r);
    return;
  }
  const lt_sample_ops_t *ops = api->conf.sampler;
  const refused_t *refused = r->adapter[0] ? lt_map_get(api->adapters_refused, r->adapter) : NULL;
  if (refused) {
    refuse_adapter(r, refused->err, refused->why);
    req_free(r);
    return;
  }
  if (r->adapter[0] && !ops->has_adapter(ops->ctx, r->adapter)) {
    const lt_crypto_dek_t *dek = NULL;
    char msg[256];
    if (lt_keyring_tenant_dek(api->keyring, c->tenant, &dek, msg, sizeof msg) == LT_OK) r->tenant_dek = dek;
    lt_api_work(api, r->tenant, load_work, load_after, r);
    return;
  }
  submit_all(r);
}

void lt_api_sample_completions(lt_api_call_t *c) { sample_route(c, false); }
void lt_api_sample_chat(lt_api_call_t *c) { sample_route(c, true); }

/* GET /v1/models: the base models served, then the caller's own adapters (published, not deleted). */
typedef struct {
  lt_api_t *api;
  const char *tenant;
  const lt_tenant_key_t *key; /* the caller's: the models it may use (lt_tenant_key_may_use) */
  json_t *data;
} models_ctx_t;

static void add_model(models_ctx_t *m, const lt_job_t *j, const char *id) {
  if (!lt_tenant_key_may_use(m->key, id)) return;
  json_array_append_new(m->data, json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", id, "object", "model", "created",
                                           (json_int_t)(j->submitted_at_ms / 1000), "owned_by", j->tenant_id, "root",
                                           j->base_model));
}

static bool add_adapter_model(const lt_job_t *j, void *arg) {
  models_ctx_t *m = arg;
  const lt_sample_ops_t *ops = m->api->conf.sampler;
  if (strcmp(j->tenant_id, m->tenant) != 0 || lt_api_job_deleted(m->api, j->job_id) ||
      (ops && !base_served(ops, j->base_model))) /* the sampler lists what it can serve */
    return true;
  char id[256];
  if (lt_api_is_session_id(j->job_id) && !lt_job_state_is_terminal(j->state)) { /* its saved weights */
    json_t *names = lt_api_sessions_saved_names(m->api, j->job_id), *nm;
    size_t i;
    json_array_foreach(names, i, nm) {
      snprintf(id, sizeof id, "ft:%s:%s:%s", j->base_model, j->job_id, json_string_value(nm));
      add_model(m, j, id);
    }
    json_decref(names);
    return true;
  }
  if (!artifact_key(m->api, j->job_id, "adapter_model.safetensors") || !artifact_key(m->api, j->job_id, "adapter_config.json"))
    return true;
  snprintf(id, sizeof id, "ft:%s:%s", j->base_model, j->job_id);
  add_model(m, j, id);
  return true;
}

void lt_api_sample_models(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  models_ctx_t m = {.api = api, .tenant = c->tenant->tenant_id, .key = lt_tenant_key(c->tenant, c->key_id),
                    .data = json_array()};
  const lt_sample_ops_t *ops = api->conf.sampler;
  if (ops) {
    for (const char *const *b = ops->models(ops->ctx); *b; b++)
      if (lt_tenant_key_may_use(m.key, *b))
        json_array_append_new(m.data, json_pack("{s:s,s:s,s:i,s:s}", "id", *b, "object", "model", "created", 0, "owned_by", "lathe"));
  } else { /* the api role: the base models the workers serve (to fine-tune), from their heartbeats */
    json_t *seen = json_object(), *hb, *b;
    const char *wid;
    size_t i;
    json_object_foreach(lt_proj_workers(api->proj), wid, hb) json_array_foreach(json_object_get(hb, "base_models"), i, b) {
      if (!json_is_string(b) || json_object_get(seen, json_string_value(b)) ||
          !lt_tenant_key_may_use(m.key, json_string_value(b)))
        continue;
      json_object_set_new(seen, json_string_value(b), json_true());
      json_array_append_new(m.data, json_pack("{s:O,s:s,s:i,s:s}", "id", b, "object", "model", "created", 0, "owned_by", "lathe"));
    }
    json_decref(seen);
  }
  lt_job_foreach(lt_proj_jobs(api->proj), add_adapter_model, &m);
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:o}", "object", "list", "data", m.data));
}

bool lt_api_sample_resolve(lt_api_call_t *c) {
  lt_api_reply_error(c->req, 404, "not_found", NULL, "no such route");
  return false;
}

lt_err_t lt_api_sample_start(lt_api_t *api, char *errstr, size_t n) {
  lt_bus_topic_name(api->conf.bus, "usage", api->topic_usage, sizeof api->topic_usage);
  if (!(api->adapters_refused = lt_map_new(free))) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  return LT_OK;
}
