/* lt_client: a synchronous HTTP client of the Lathe API over libevent's evhttp (see
 * lt_client.h). Each call runs the client's own event_base until its request is answered, so
 * the callers (CLI, tests, benchmark) stay simple sequential code. */
#include "lt_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "lt_time.h"

#define DEFAULT_URL "http://127.0.0.1:8080"
#define SSE_TIMEOUT_S (24 * 3600) /* a stream may be quiet for a long time */

struct lt_client {
  struct event_base *base;
  struct evhttp_connection *evcon;
  char url[512];
  char host[256];
  char hostport[300];
  char prefix[256]; /* path of the base URL without its trailing '/' ("" or "/api") */
  uint16_t port;
  char *api_key;
  int timeout_s;
  SSL_CTX *tls; /* https: verifies the server against the CA file and the host name */
};

/* State of one request while the loop runs. */
typedef struct call {
  lt_client_t *c;
  struct evhttp_request *req;
  bool done;
  bool got_headers;
  bool failed;
  enum evhttp_request_error error;
  bool have_error;
  int status;
  struct evbuffer *body;
  char retry_after[16];
  /* SSE */
  lt_client_event_fn *fn;
  void *ctx;
  bool stop;
  struct evbuffer *line; /* undelivered bytes of the stream */
  struct evbuffer *data; /* data lines of the event being read */
  char ev_id[256];
  char ev_name[64];
  bool ended; /* the server sent "event: end" */
} call_t;

/* The TLS context of an https:// client: peers verified against ca_file (NULL: the system's). */
static lt_err_t tls_new(const char *ca_file, SSL_CTX **out, char *errstr, size_t n) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot create a TLS context");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx);
  if (ok != 1) {
    char why[256];
    ERR_error_string_n(ERR_get_error(), why, sizeof why);
    SSL_CTX_free(ctx);
    return lt_errf(errstr, n, LT_ERR_INVALID, "the CA file \"%s\" cannot be read as PEM certificates (LATHE_API_CA_FILE "
                   "or --ca-file): %s", ca_file ? ca_file : "(system)", why);
  }
  *out = ctx;
  return LT_OK;
}

lt_err_t lt_client_new(const lt_client_opts_t *opts, lt_client_t **out, char *errstr, size_t n) {
  const char *url = opts && opts->url ? opts->url : getenv("LATHE_API_URL");
  if (!url || !*url) url = DEFAULT_URL;
  const char *key = opts && opts->api_key ? opts->api_key : getenv("LATHE_API_KEY");
  struct evhttp_uri *u = evhttp_uri_parse(url);
  const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
  bool https = scheme && strcmp(scheme, "https") == 0;
  if (!u || !scheme || (strcmp(scheme, "http") != 0 && !https) || !evhttp_uri_get_host(u) ||
      !*evhttp_uri_get_host(u) || strlen(url) >= 512) {
    if (u) evhttp_uri_free(u);
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "the API URL \"%s\" is not valid: use http://HOST[:PORT] or https://HOST[:PORT] (LATHE_API_URL or "
                   "--url)", url);
  }
  lt_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    evhttp_uri_free(u);
    return LT_ERR_NOMEM;
  }
  snprintf(c->url, sizeof c->url, "%s", url);
  size_t ul = strlen(c->url);
  while (ul > 0 && c->url[ul - 1] == '/') c->url[--ul] = '\0';
  snprintf(c->host, sizeof c->host, "%s", evhttp_uri_get_host(u));
  int port = evhttp_uri_get_port(u);
  c->port = (uint16_t)(port > 0 ? port : https ? 443 : 80);
  snprintf(c->hostport, sizeof c->hostport, "%s:%u", c->host, c->port);
  const char *path = evhttp_uri_get_path(u);
  snprintf(c->prefix, sizeof c->prefix, "%s", path ? path : "");
  size_t pl = strlen(c->prefix);
  while (pl > 0 && c->prefix[pl - 1] == '/') c->prefix[--pl] = '\0';
  evhttp_uri_free(u);
  c->timeout_s = opts && opts->timeout_s > 0 ? opts->timeout_s : 60;
  const char *ca = opts && opts->ca_file ? opts->ca_file : getenv("LATHE_API_CA_FILE");
  lt_err_t err = https ? tls_new(ca && *ca ? ca : NULL, &c->tls, errstr, n) : LT_OK;
  c->base = err ? NULL : event_base_new();
  if (!c->base) {
    if (!err) err = lt_errf(errstr, n, LT_ERR_NOMEM, "cannot create an event loop");
    SSL_CTX_free(c->tls);
    free(c);
    return err;
  }
  lt_client_set_api_key(c, key);
  *out = c;
  return LT_OK;
}

void lt_client_destroy(lt_client_t *c) {
  if (!c) return;
  if (c->evcon) evhttp_connection_free(c->evcon);
  event_base_free(c->base);
  SSL_CTX_free(c->tls);
  free(c->api_key);
  free(c);
}

const char *lt_client_url(const lt_client_t *c) { return c->url; }

void lt_client_set_api_key(lt_client_t *c, const char *api_key) {
  free(c->api_key);
  c->api_key = api_key && *api_key ? strdup(api_key) : NULL;
}

void lt_client_resp_free(lt_client_resp_t *r) {
  if (!r) return;
  free(r->body);
  json_decref(r->json);
  memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- request machinery */

/* A TLS bufferevent for the client's host: SNI, and the certificate must name the host (or the
 * address, when the URL gives one). */
static struct bufferevent *tls_bev(lt_client_t *c) {
  SSL *ssl = SSL_new(c->tls);
  if (!ssl) return NULL;
  unsigned char ip[16];
  bool is_ip = inet_pton(AF_INET, c->host, ip) == 1 || inet_pton(AF_INET6, c->host, ip) == 1;
  X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
  int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, c->host)
                 : SSL_set_tlsext_host_name(ssl, c->host) && X509_VERIFY_PARAM_set1_host(param, c->host, 0);
  struct bufferevent *bev = ok ? bufferevent_openssl_socket_new(c->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                                BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS)
                               : NULL;
  if (!bev) {
    SSL_free(ssl);
    return NULL;
  }
  /* The server may close without close_notify after its answer. */
  bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
  return bev;
}

static struct evhttp_connection *connection(lt_client_t *c, int timeout_s) {
  struct evhttp_connection *evcon;
  if (c->tls) {
    struct bufferevent *bev = tls_bev(c);
    evcon = bev ? evhttp_connection_base_bufferevent_new(c->base, NULL, bev, c->host, c->port) : NULL;
  } else {
    evcon = evhttp_connection_base_new(c->base, NULL, c->host, c->port);
  }
  if (evcon) evhttp_connection_set_timeout(evcon, timeout_s);
  return evcon;
}

static void on_error(enum evhttp_request_error e, void *arg) {
  call_t *k = arg;
  k->have_error = true;
  k->error = e;
}

static int on_headers(struct evhttp_request *req, void *arg) {
  call_t *k = arg;
  k->got_headers = true;
  k->status = evhttp_request_get_response_code(req);
  const char *ra = evhttp_find_header(evhttp_request_get_input_headers(req), "Retry-After");
  if (ra) snprintf(k->retry_after, sizeof k->retry_after, "%s", ra);
  return 0;
}

static void on_done(struct evhttp_request *req, void *arg) {
  call_t *k = arg;
  k->done = true;
  if (!req || evhttp_request_get_response_code(req) == 0) {
    k->failed = true;
  } else {
    k->status = evhttp_request_get_response_code(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (k->body) evbuffer_add_buffer(k->body, in);
  }
  k->req = NULL;
  event_base_loopbreak(k->c->base);
}

static enum evhttp_cmd_type method_of(const char *m) {
  if (strcmp(m, "POST") == 0) return EVHTTP_REQ_POST;
  if (strcmp(m, "PUT") == 0) return EVHTTP_REQ_PUT;
  if (strcmp(m, "DELETE") == 0) return EVHTTP_REQ_DELETE;
  if (strcmp(m, "HEAD") == 0) return EVHTTP_REQ_HEAD;
  return EVHTTP_REQ_GET;
}

/* Why a TLS connection failed, when it was the certificate: a person's line into out. */
static bool tls_refused(const lt_client_t *c, struct evhttp_connection *evcon, char *out, size_t n) {
  struct bufferevent *bev = c->tls && evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
  SSL *ssl = bev ? bufferevent_openssl_get_ssl(bev) : NULL;
  long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
  if (v == X509_V_OK) return false;
  snprintf(out, n, "the TLS certificate of the Lathe API at %s is not accepted: %s (LATHE_API_CA_FILE names the CA "
           "to trust)", c->url, X509_verify_cert_error_string(v));
  return true;
}

static lt_err_t failure(const lt_client_t *c, struct evhttp_connection *evcon, const call_t *k, char *errstr,
                        size_t n) {
  char why[1024];
  if (!k->got_headers && tls_refused(c, evcon, why, sizeof why)) return lt_errf(errstr, n, LT_ERR_AUTH, "%s", why);
  if (!k->got_headers) {
    if (k->have_error && k->error == EVREQ_HTTP_TIMEOUT)
      return lt_errf(errstr, n, LT_ERR_TIMEOUT, "the Lathe API at %s did not answer within %d s", c->url,
                     c->timeout_s);
    return lt_errf(errstr, n, LT_ERR_UNAVAILABLE, "cannot reach the Lathe API at %s: is lathed running?%s", c->url,
                   k->have_error ? " (the connection closed)" : " (connection refused)");
  }
  if (k->have_error && k->error == EVREQ_HTTP_TIMEOUT)
    return lt_errf(errstr, n, LT_ERR_TIMEOUT, "the Lathe API at %s stopped answering (timeout after %d s)", c->url,
                   c->timeout_s);
  return lt_errf(errstr, n, LT_ERR_IO, "the connection to the Lathe API at %s broke during the answer", c->url);
}

/* Builds a request on k with the common headers. */
static struct evhttp_request *new_request(lt_client_t *c, call_t *k, const lt_client_header_t *headers, size_t nh) {
  struct evhttp_request *req = evhttp_request_new(on_done, k);
  if (!req) return NULL;
  evhttp_request_set_error_cb(req, on_error);
  evhttp_request_set_header_cb(req, on_headers);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Host", c->hostport);
  evhttp_add_header(h, "User-Agent", "lathe-cli");
  if (c->api_key) {
    char auth[512];
    snprintf(auth, sizeof auth, "Bearer %s", c->api_key);
    evhttp_add_header(h, "Authorization", auth);
  }
  for (size_t i = 0; i < nh; i++)
    if (headers[i].name && headers[i].value) evhttp_add_header(h, headers[i].name, headers[i].value);
  k->req = req;
  return req;
}

static lt_err_t request_once(lt_client_t *c, const char *method, const char *path, const lt_client_header_t *headers,
                             size_t nheaders, const void *body, size_t len, const char *content_type,
                             lt_client_resp_t *resp, char *errstr, size_t n) {
  memset(resp, 0, sizeof *resp);
  /* A TLS session cannot be reconnected in place, as evhttp would after the server closed an
   * idle connection: each request over https has a connection of its own. */
  if (c->tls && c->evcon) {
    evhttp_connection_free(c->evcon);
    c->evcon = NULL;
  }
  if (!c->evcon && !(c->evcon = connection(c, c->timeout_s)))
    return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot create a connection");
  call_t k = {.c = c, .body = evbuffer_new()};
  if (!k.body) return LT_ERR_NOMEM;
  struct evhttp_request *req = new_request(c, &k, headers, nheaders);
  if (!req) {
    evbuffer_free(k.body);
    return LT_ERR_NOMEM;
  }
  if (body) {
    evbuffer_add(evhttp_request_get_output_buffer(req), body, len);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      content_type ? content_type : "application/json");
  }
  char uri[2048];
  snprintf(uri, sizeof uri, "%s%s", c->prefix, path);
  if (evhttp_make_request(c->evcon, req, method_of(method), uri) != 0) {
    /* evhttp frees req when make_request fails. */
    evbuffer_free(k.body);
    evhttp_connection_free(c->evcon);
    c->evcon = NULL;
    return lt_errf(errstr, n, LT_ERR_UNAVAILABLE, "cannot reach the Lathe API at %s: is lathed running?", c->url);
  }
  while (!k.done) event_base_dispatch(c->base);
  lt_err_t err = LT_OK;
  if (k.failed) {
    err = failure(c, c->evcon, &k, errstr, n);
    /* A broken connection is not reused: the next call starts a fresh one. */
    evhttp_connection_free(c->evcon);
    c->evcon = NULL;
  } else {
    resp->status = k.status;
    resp->len = evbuffer_get_length(k.body);
    resp->body = malloc(resp->len + 1);
    if (!resp->body) {
      err = LT_ERR_NOMEM;
    } else {
      evbuffer_remove(k.body, resp->body, resp->len);
      resp->body[resp->len] = '\0';
      json_error_t je;
      resp->json = resp->len ? json_loadb(resp->body, resp->len, 0, &je) : NULL;
      snprintf(resp->retry_after, sizeof resp->retry_after, "%s", k.retry_after);
    }
  }
  evbuffer_free(k.body);
  return err;
}

/* 503 "starting": the API has not read the log back yet and refused before looking at the request
 * (docs/DESIGN.md §5a), so sending it again is safe whatever its method. */
static bool starting(const lt_client_resp_t *r) {
  json_t *e = r->status == 503 && r->json ? json_object_get(r->json, "error") : NULL;
  const char *code = json_string_value(json_object_get(e, "code"));
  return code && strcmp(code, "starting") == 0;
}

lt_err_t lt_client_request(lt_client_t *c, const char *method, const char *path, const lt_client_header_t *headers,
                           size_t nheaders, const void *body, size_t len, const char *content_type,
                           lt_client_resp_t *resp, char *errstr, size_t n) {
  int64_t t0 = lt_time_mono_ms();
  for (;;) {
    lt_err_t err = request_once(c, method, path, headers, nheaders, body, len, content_type, resp, errstr, n);
    if (err || !starting(resp)) return err;
    /* Waits as Retry-After says (1 to 5 s), within the client's timeout; past it, the 503 is the answer. */
    long wait = atol(resp->retry_after);
    wait = wait < 1 ? 1 : wait > 5 ? 5 : wait;
    if (lt_time_mono_ms() - t0 + wait * 1000 > (int64_t)c->timeout_s * 1000) return LT_OK;
    lt_client_resp_free(resp);
    /* A fresh connection: one the server closed while we slept would fail the write. */
    if (c->evcon) evhttp_connection_free(c->evcon);
    c->evcon = NULL;
    nanosleep(&(struct timespec){.tv_sec = wait}, NULL);
  }
}

lt_err_t lt_client_json(lt_client_t *c, const char *method, const char *path, const json_t *body,
                        const char *idempotency_key, lt_client_resp_t *resp, char *errstr, size_t n) {
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  if (body && !text) return LT_ERR_NOMEM;
  lt_client_header_t h[1] = {{"Idempotency-Key", idempotency_key}};
  lt_err_t err = lt_client_request(c, method, path, h, idempotency_key ? 1 : 0, text, text ? strlen(text) : 0, NULL,
                                   resp, errstr, n);
  free(text);
  return err;
}

const char *lt_client_error_text(const lt_client_resp_t *r, char *out, size_t n) {
  json_t *e = r->json ? json_object_get(r->json, "error") : NULL;
  const char *code = json_string_value(json_object_get(e, "code"));
  const char *msg = json_string_value(json_object_get(e, "message"));
  const char *field = json_string_value(json_object_get(e, "field"));
  if (code && msg) {
    if (field && !strstr(msg, field))
      snprintf(out, n, "HTTP %d %s: %s (field %s)", r->status, code, msg, field);
    else
      snprintf(out, n, "HTTP %d %s: %s", r->status, code, msg);
  } else {
    size_t len = r->len;
    while (len > 0 && (r->body[len - 1] == '\n' || r->body[len - 1] == '\r')) len--;
    snprintf(out, n, "HTTP %d: %.*s", r->status, (int)(len > 300 ? 300 : len), r->body ? r->body : "");
  }
  return out;
}

/* ---------------------------------------------------------------- Server-Sent Events */

/* Parses complete lines out of k->line and dispatches events (the WHATWG EventSource rules,
 * minus retry:). */
static void sse_parse(call_t *k) {
  for (;;) {
    size_t len;
    char *line = evbuffer_readln(k->line, &len, EVBUFFER_EOL_CRLF);
    if (!line) return;
    if (len == 0) {
      /* Blank line: dispatch the event being read, if it has data. */
      size_t dl = evbuffer_get_length(k->data);
      if (dl > 0 || k->ev_name[0]) {
        char *data = malloc(dl + 1);
        if (data) {
          evbuffer_remove(k->data, data, dl);
          if (dl > 0 && data[dl - 1] == '\n') dl--; /* the last data line's newline */
          data[dl] = '\0';
          if (strcmp(k->ev_name, "end") == 0) k->ended = true;
          lt_client_event_t ev = {.id = k->ev_id, .event = k->ev_name, .data = data};
          if (!k->stop && k->fn(k->ctx, &ev)) k->stop = true;
          free(data);
        }
        evbuffer_drain(k->data, evbuffer_get_length(k->data));
        k->ev_name[0] = '\0';
      }
    } else if (line[0] != ':') {
      char *colon = strchr(line, ':');
      const char *value = "";
      if (colon) {
        *colon = '\0';
        value = colon + 1;
        if (*value == ' ') value++;
      }
      if (strcmp(line, "data") == 0) {
        evbuffer_add(k->data, value, strlen(value));
        evbuffer_add(k->data, "\n", 1);
      } else if (strcmp(line, "event") == 0) {
        snprintf(k->ev_name, sizeof k->ev_name, "%s", value);
      } else if (strcmp(line, "id") == 0) {
        /* The last event id persists across events until a new one comes (EventSource). */
        snprintf(k->ev_id, sizeof k->ev_id, "%s", value);
      }
    }
    free(line);
    if (k->stop) return;
  }
}

static void on_chunk(struct evhttp_request *req, void *arg) {
  call_t *k = arg;
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  if (k->status != 200) {
    evbuffer_add_buffer(k->body, in); /* an error answer: keep it for the message */
    return;
  }
  evbuffer_add_buffer(k->line, in);
  sse_parse(k);
  if (k->stop) event_base_loopbreak(k->c->base);
}

lt_err_t lt_client_events(lt_client_t *c, const char *path, const char *last_event_id, lt_client_event_fn *fn,
                          void *ctx, int *status, char *errstr, size_t n) {
  if (status) *status = 0;
  /* A stream has its own connection: it may stay open for hours and end by being dropped. */
  struct evhttp_connection *evcon = connection(c, SSE_TIMEOUT_S);
  call_t k = {.c = c, .fn = fn, .ctx = ctx, .body = evbuffer_new(), .line = evbuffer_new(), .data = evbuffer_new()};
  lt_err_t err = LT_OK;
  if (!evcon || !k.body || !k.line || !k.data) {
    err = LT_ERR_NOMEM;
    goto out;
  }
  lt_client_header_t h[2] = {{"Accept", "text/event-stream"}, {"Last-Event-ID", last_event_id}};
  struct evhttp_request *req = new_request(c, &k, h, last_event_id ? 2 : 1);
  if (!req) {
    err = LT_ERR_NOMEM;
    goto out;
  }
  evhttp_request_set_chunked_cb(req, on_chunk);
  if (last_event_id) snprintf(k.ev_id, sizeof k.ev_id, "%s", last_event_id);
  char uri[2048];
  snprintf(uri, sizeof uri, "%s%s", c->prefix, path);
  if (evhttp_make_request(evcon, req, EVHTTP_REQ_GET, uri) != 0) {
    err = lt_errf(errstr, n, LT_ERR_UNAVAILABLE, "cannot reach the Lathe API at %s: is lathed running?", c->url);
    goto out;
  }
  while (!k.done && !k.stop) event_base_dispatch(c->base);
  if (status) *status = k.status;
  if (k.stop) {
    err = LT_OK;
  } else if (k.failed) {
    err = failure(c, evcon, &k, errstr, n);
  } else if (k.status != 200) {
    lt_client_resp_t r = {.status = k.status};
    r.len = evbuffer_get_length(k.body);
    r.body = calloc(1, r.len + 1);
    if (r.body) evbuffer_remove(k.body, r.body, r.len);
    r.json = r.body ? json_loadb(r.body, r.len, 0, NULL) : NULL;
    char line[600];
    lt_client_error_text(&r, line, sizeof line);
    lt_client_resp_free(&r);
    err = lt_errf(errstr, n,
                  k.status == 404   ? LT_ERR_NOT_FOUND
                  : k.status == 401 ? LT_ERR_AUTH
                  : k.status >= 500 ? LT_ERR_UNAVAILABLE
                                    : LT_ERR_INVALID,
                  "%s", line);
  } else {
    /* The answer completed: the server ended the stream (after "event: end", or it was cut). */
    err = k.ended ? LT_OK : lt_errf(errstr, n, LT_ERR_IO, "the event stream ended without its end event");
  }
out:
  /* Freeing the connection cancels the request if it is still open; its callbacks (if any)
   * run now, while k is alive. */
  if (evcon) evhttp_connection_free(evcon);
  if (k.body) evbuffer_free(k.body);
  if (k.line) evbuffer_free(k.line);
  if (k.data) evbuffer_free(k.data);
  return err;
}
