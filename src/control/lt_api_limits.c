/* lt_api_limits: the API's front door — what every connection and request meets before a route.
 *
 * - Connections. libevent 2.1 has no cap on them (evhttp_set_max_connections is 2.2) and no hook
 *   when one closes before its first request, so each connection is made here (evhttp_set_bevcb)
 *   and, on the next turn of the loop — after evhttp has wrapped it, before it can have read a
 *   request — found again (the bufferevent's callback argument is its evhttp_connection) and given
 *   a close callback. A connection past max_connections gets 503 naming the limit for its
 *   request, and is closed. The event streams chain their own close callback through here.
 *   (Between the accept and that turn libevent frees a connection only when it runs out of
 *   memory while wrapping it; the attach would then read a freed bufferevent. 2.2's
 *   evhttp_set_newreqcb and max_connections would remove this step.)
 * - Rate limits: token buckets per API key and per tenant, and per source address for failed
 *   authentications, so that guessing keys is slow; the address is checked before the key, so a
 *   throttled address learns nothing about the keys it tries. 429 with Retry-After.
 * - libevent's own rejections (a malformed request: 400; headers or body over the limits: 413;
 *   a method it does not allow: 501) are written by evhttp_send_error as an HTML page, with no
 *   hook in 2.1 (evhttp_set_errorcb is 2.2). Every connection's output buffer has a callback that
 *   sees such a page arrive — libevent adds the status line, headers and body in one call stack,
 *   and the socket is written only on a later turn of the loop — and replaces it with the JSON
 *   error envelope before a byte of it is sent. The API itself never answers text/html, so the
 *   page cannot be confused with a reply of ours.
 * - TLS: with a certificate and key, each customer connection is an OpenSSL bufferevent
 *   (libevent's bufferevent_openssl), and the same door stands behind it.
 *
 * Everything here runs on the API's event loop thread. See lt_api_int.h. */
#include "lt_api_int.h"
#include "lt_time.h"

#include <errno.h>
#include <linux/sockios.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <time.h>

#define OVER_CAP_TIMEOUT_S 5 /* a connection over max_connections is dropped when idle this long */

struct lt_api_conn {
  lt_api_t *api;
  struct bufferevent *bev;
  struct evhttp_connection *evcon; /* once attached */
  bool over_cap;                   /* opened past max_connections: its request gets 503 */
  void (*on_close)(void *);        /* chained (an event stream's) */
  void *on_close_arg;
  lt_api_conn_t *next;             /* in api->conns_new until attached */
  lt_api_slot_t answer_slot;       /* its request answered later (lt_api_door_count_later) */
  int64_t answer_t0_us;
  char key[32];
};

/* ---------------------------------------------------------------- rates */

bool lt_api_rate_parse(const char *text, lt_api_rate_t *out) {
  if (strcmp(text, "off") == 0) {
    *out = (lt_api_rate_t){-1, 0};
    return true;
  }
  char *end;
  double r = strtod(text, &end), b = fmax(1, 2 * r);
  if (end == text || r <= 0 || !isfinite(r)) return false;
  if (*end == '/') {
    const char *s = end + 1;
    b = strtod(s, &end);
    if (end == s || b < 1 || !isfinite(b)) return false;
  }
  if (*end) return false;
  *out = (lt_api_rate_t){r, b};
  return true;
}

typedef struct bucket {
  double tokens;
  int64_t at_ms; /* when tokens was last brought up to date */
  double per_s, burst;
} bucket_t;

/* The bucket of key brought up to now (made full when new); NULL when out of memory. */
static bucket_t *bucket(lt_api_t *api, const char *key, lt_api_rate_t rate, int64_t now) {
  bucket_t *b = lt_map_get(api->buckets, key);
  if (!b) {
    if (!(b = calloc(1, sizeof *b))) return NULL;
    *b = (bucket_t){.tokens = rate.burst, .at_ms = now};
    if (lt_map_set(api->buckets, key, b)) {
      free(b);
      return NULL;
    }
  }
  b->per_s = rate.per_s;
  b->burst = rate.burst;
  b->tokens = fmin(rate.burst, b->tokens + (double)(now - b->at_ms) * rate.per_s / 1000.0);
  b->at_ms = now;
  return b;
}

/* Seconds until the bucket holds a whole token (at least 1, as Retry-After counts). */
static long retry_after_s(const bucket_t *b) {
  double s = ceil((1.0 - b->tokens) / b->per_s);
  return s < 1 ? 1 : (long)s;
}

static void reply_limited(lt_api_t *api, struct evhttp_request *req, const bucket_t *b, const char *what) {
  api->stats.rate_limited++;
  char ra[24];
  long s = retry_after_s(b);
  snprintf(ra, sizeof ra, "%ld", s);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", ra);
  lt_api_reply_error(req, 429, "rate_limited", NULL,
                     "too many requests for %s: the limit is %g a second with bursts of %g; retry after %ld s", what,
                     b->per_s, b->burst, s);
}

/* Takes a token from key's bucket when take; false (after replying 429) when there is none. */
static bool spend(lt_api_t *api, struct evhttp_request *req, const char *key, lt_api_rate_t rate, bool take,
                  const char *what) {
  if (rate.per_s < 0) return true;
  bucket_t *b = bucket(api, key, rate, lt_time_mono_ms());
  if (!b) return true; /* out of memory: the door stays open rather than shut on everyone */
  if (b->tokens < 1.0) {
    reply_limited(api, req, b, what);
    return false;
  }
  if (take) b->tokens -= 1.0;
  return true;
}

static const char *peer_addr(struct evhttp_request *req) {
  char *addr = NULL;
  ev_uint16_t port = 0;
  struct evhttp_connection *evcon = evhttp_request_get_connection(req);
  if (evcon) evhttp_connection_get_peer(evcon, &addr, &port);
  return addr && *addr ? addr : "unknown";
}

bool lt_api_door_addr(lt_api_t *api, struct evhttp_request *req, bool fail) {
  char key[128], what[128];
  const char *addr = peer_addr(req);
  snprintf(key, sizeof key, "addr:%s", addr);
  snprintf(what, sizeof what, "failed authentications from %s", addr);
  return spend(api, req, key, api->conf.auth_fail_rate, fail, what);
}

bool lt_api_door_tenant(lt_api_t *api, struct evhttp_request *req, const char *tenant_id, const char *key_id) {
  char key[128], what[128];
  snprintf(key, sizeof key, "key:%s", key_id);
  snprintf(what, sizeof what, "API key %s", key_id);
  if (!spend(api, req, key, api->conf.key_rate, true, what)) return false;
  snprintf(key, sizeof key, "tenant:%s", tenant_id);
  snprintf(what, sizeof what, "tenant %s", tenant_id);
  return spend(api, req, key, api->conf.tenant_rate, true, what);
}

/* A client that closed while its request waits for an answer not yet started (a long poll, a
 * completion being generated, a download before its first byte): libevent reads nothing from
 * the connection then, so it does not see the close, and the request would run on for nobody
 * until its own timeout. Each connection whose owner watches it (on_close) is peeked: at its
 * end of stream (or a reset) it is freed, which calls on_close with the request still attached
 * (libevent frees it with the connection, as at shutdown). A TLS client's close notice is data,
 * so only a bare close is seen there; a client that half-closes after its request is taken for
 * gone, as libevent takes it once a reply has started. */
static void door_reap(lt_api_t *api) {
  struct evhttp_connection *gone[64];
  size_t n = 0;
  lt_map_iter_t it = {0};
  while (n < sizeof gone / sizeof *gone && lt_map_next(api->conns, &it)) {
    const lt_api_conn_t *cn = it.value;
    evutil_socket_t fd = cn->on_close && cn->evcon ? bufferevent_getfd(cn->bev) : -1;
    char c;
    ssize_t r = fd >= 0 ? recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) : 1;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone[n++] = cn->evcon;
  }
  for (size_t i = 0; i < n; i++) evhttp_connection_free(gone[i]); /* conn_closed: on_close, then cn freed */
}

void lt_api_door_tick(lt_api_t *api) {
  int64_t now = lt_time_mono_ms();
  lt_map_iter_t it = {0};
  while (lt_map_next(api->buckets, &it)) {
    const bucket_t *b = it.value;
    if (b->tokens + (double)(now - b->at_ms) * b->per_s / 1000.0 >= b->burst) lt_map_del(api->buckets, it.key);
  }
  if (api->conns) door_reap(api);
}

/* ---------------------------------------------------------------- libevent's HTML, as JSON */

static const char page_mark[] = "\r\n\r\n<HTML><HEAD>\n<TITLE>";
static const char page_end[] = "</BODY></HTML>\n";

/* What the envelope says for a status libevent answered by itself. */
static void page_json(const lt_api_t *api, int status, const char *reason, char *out, size_t n) {
  const char *code = status == 413 ? "too_large" : status == 501 ? "not_implemented" : status == 400 ? "invalid"
                                                                                                     : "http_error";
  char msg[300];
  if (status == 413)
    snprintf(msg, sizeof msg,
             "the request is over the server's limits (headers at most 16384 bytes, a body at most %u bytes), or "
             "its chunked body is malformed",
             (unsigned)(LT_API_PART_MAX + 4096));
  else if (status == 501)
    snprintf(msg, sizeof msg, "the method is not supported: the API answers GET, POST, PUT and DELETE");
  else if (status == 400)
    snprintf(msg, sizeof msg,
             "the request cannot be read as HTTP/1.1: a malformed request line, header or chunked body, or "
             "headers over 16384 bytes");
  else
    snprintf(msg, sizeof msg, "%s", reason);
  (void)api;
  json_t *body = json_pack("{s:o}", "error", lt_api_error_json(status, code, NULL, msg));
  char *text = json_dumps(body, JSON_COMPACT);
  snprintf(out, n, "%s\n", text ? text : "{}");
  free(text);
  json_decref(body);
}

/* Rebuilds the page that starts at text (len bytes: status line, headers, HTML) as a JSON reply
 * with the same status and the other headers kept, into out. */
static void page_rewrite(const lt_api_t *api, const char *text, size_t len, struct evbuffer *out) {
  const char *eol = memchr(text, '\n', len);
  int status = 0;
  char version[16] = "HTTP/1.1", reason[64] = "";
  sscanf(text, "%15s %d %63[^\r\n]", version, &status, reason);
  char body[512];
  page_json(api, status, reason, body, sizeof body);
  evbuffer_add_printf(out, "%s %d %s\r\n", version, status, reason);
  const char *end = strstr(text, "\r\n\r\n");
  for (const char *h = eol ? eol + 1 : text + len; end && h < end;) {
    const char *next = strstr(h, "\r\n");
    size_t hl = (size_t)(next - h);
    if (hl && strncasecmp(h, "Content-Type:", 13) != 0 && strncasecmp(h, "Content-Length:", 15) != 0)
      evbuffer_add_printf(out, "%.*s\r\n", (int)hl, h);
    h = next + 2;
  }
  evbuffer_add_printf(out, "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", strlen(body), body);
}

/* Replaces a complete libevent error page at the end of buf (unfrozen) with its JSON. */
static void rewrite_page(lt_api_t *api, struct evbuffer *buf) {
  size_t len = evbuffer_get_length(buf), tail = sizeof page_end - 1;
  char window[2048];
  struct evbuffer_ptr at;
  /* Every answer passes here: its last bytes first, the window only for a page's ending. */
  if (len < tail || evbuffer_ptr_set(buf, &at, len - tail, EVBUFFER_PTR_SET) != 0 ||
      evbuffer_copyout_from(buf, &at, window, tail) != (ev_ssize_t)tail || memcmp(window, page_end, tail) != 0)
    return;
  size_t wn = len < sizeof window - 1 ? len : sizeof window - 1;
  if (evbuffer_ptr_set(buf, &at, len - wn, EVBUFFER_PTR_SET) != 0 ||
      evbuffer_copyout_from(buf, &at, window, wn) != (ev_ssize_t)wn)
    return;
  window[wn] = '\0';
  /* The page's status line: the last "HTTP/1." before its blank line. */
  char *mark = NULL, *start = NULL;
  for (char *p = window; (p = strstr(p, page_mark)); p++) mark = p;
  if (!mark) return;
  for (char *p = window; (p = strstr(p, "HTTP/1.")) && p < mark; p++) start = p;
  if (!start || !strcasestr(start, "Content-Type: text/html")) return;
  struct evbuffer *keep = evbuffer_new();
  if (!keep) return;
  evbuffer_remove_buffer(buf, keep, len - wn + (size_t)(start - window));
  evbuffer_drain(buf, evbuffer_get_length(buf));
  page_rewrite(api, start, (size_t)(window + wn - start), keep);
  evbuffer_add_buffer(buf, keep);
  api->stats.pages_rewritten++;
  evbuffer_free(keep);
}

/* The output buffer's callback. A socket bufferevent keeps its output frozen at the front (only
 * the socket drains it): thawed for the look and the rewrite. */
static void on_output(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
  lt_api_t *api = arg;
  if (api->rewriting || !info->n_added) return;
  api->rewriting = true;
  evbuffer_unfreeze(buf, 1);
  rewrite_page(api, buf);
  evbuffer_freeze(buf, 1);
  api->rewriting = false;
}

/* The same for a TLS bufferevent, whose output is not frozen. */
static void on_output_tls(struct evbuffer *buf, const struct evbuffer_cb_info *info, void *arg) {
  lt_api_t *api = arg;
  if (api->rewriting || !info->n_added) return;
  api->rewriting = true;
  rewrite_page(api, buf);
  api->rewriting = false;
}

/* ---------------------------------------------------------------- connections */

static void conn_closed(struct evhttp_connection *evcon, void *arg) {
  lt_api_conn_t *cn = arg;
  lt_api_t *api = cn->api;
  if (cn->on_close) cn->on_close(cn->on_close_arg);
  lt_map_del(api->conns, cn->key); /* frees cn */
}

/* The next turn of the loop after accepts: each new connection's evhttp_connection is its
 * bufferevent's callback argument (evhttp sets it when it wraps the socket). */
static void conns_attach(evutil_socket_t fd, short what, void *arg) {
  lt_api_t *api = arg;
  lt_api_conn_t *fifo = NULL; /* in the order they were accepted: the first ones are in the cap */
  while (api->conns_new) {
    lt_api_conn_t *cn = api->conns_new;
    api->conns_new = cn->next;
    cn->next = fifo;
    fifo = cn;
  }
  while (fifo) {
    lt_api_conn_t *cn = fifo;
    fifo = cn->next;
    cn->next = NULL;
    void *cbarg = NULL;
    bufferevent_getcb(cn->bev, NULL, NULL, NULL, &cbarg);
    cn->evcon = cbarg;
    snprintf(cn->key, sizeof cn->key, "%p", (void *)cn->evcon);
    if (!cn->evcon || lt_map_set(api->conns, cn->key, cn)) {
      free(cn);
      continue;
    }
    cn->over_cap = (int)lt_map_count(api->conns) > api->conf.max_connections;
    evhttp_connection_set_closecb(cn->evcon, conn_closed, cn);
    /* One over the cap that sends nothing must not hold its socket for the whole idle timeout. */
    if (cn->over_cap) evhttp_connection_set_timeout(cn->evcon, OVER_CAP_TIMEOUT_S);
  }
}

/* evhttp's bevcb for the customer port: a socket bufferevent with the page rewrite, and the
 * connection queued for conns_attach. */
static struct bufferevent *conn_new(struct event_base *base, void *arg) {
  lt_api_t *api = arg;
  struct bufferevent *bev = NULL;
  if (api->tls) {
    SSL *ssl = SSL_new(api->tls);
    /* The bufferevent owns ssl (SSL_free on close): BEV_OPT_CLOSE_ON_FREE. */
    if (ssl && !(bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING, BEV_OPT_CLOSE_ON_FREE)))
      SSL_free(ssl);
  } else {
    bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  }
  if (!bev) return NULL;
  evbuffer_add_cb(bufferevent_get_output(bev), api->tls ? on_output_tls : on_output, api);
  lt_api_conn_t *cn = calloc(1, sizeof *cn);
  if (cn) {
    cn->api = api;
    cn->bev = bev;
    cn->next = api->conns_new;
    api->conns_new = cn;
    event_active(api->conns_ev, EV_TIMEOUT, 0);
  }
  return bev;
}

/* The operator port's bevcb: the page rewrite only. */
static struct bufferevent *ops_conn_new(struct event_base *base, void *arg) {
  struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
  if (bev) evbuffer_add_cb(bufferevent_get_output(bev), on_output, arg);
  return bev;
}

static lt_api_conn_t *conn_of(lt_api_t *api, struct evhttp_connection *evcon) {
  char key[32];
  snprintf(key, sizeof key, "%p", (void *)evcon);
  return lt_map_get(api->conns, key);
}

bool lt_api_door_admit(lt_api_t *api, struct evhttp_request *req) {
  lt_api_conn_t *cn = conn_of(api, evhttp_request_get_connection(req));
  if (!cn || !cn->over_cap) return true;
  api->stats.over_connections++;
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Retry-After", "1");
  evhttp_add_header(h, "Connection", "close");
  lt_api_reply_error(req, 503, "too_many_connections", NULL,
                     "the API has %zu connections open, over its limit max_connections = %d: retry later, and "
                     "reuse one connection for many requests",
                     lt_map_count(api->conns), api->conf.max_connections);
  return false;
}

bool lt_api_door_on_close(lt_api_t *api, struct evhttp_connection *evcon, void (*fn)(void *), void *arg) {
  lt_api_conn_t *cn = conn_of(api, evcon);
  if (!cn) return false;
  cn->on_close = fn;
  cn->on_close_arg = arg;
  return true;
}

void lt_api_door_release(struct evhttp_request *req) {
  if (req && !evhttp_request_get_connection(req)) evhttp_send_reply_end(req);
}

/* The reply of a request answered later went out: its status and time are what /metrics counts. */
static void on_answered(struct evhttp_request *req, void *arg) {
  lt_api_conn_t *cn = arg;
  lt_api_metrics_observe(cn->api, cn->answer_slot, evhttp_request_get_response_code(req),
                         lt_time_mono_us() - cn->answer_t0_us);
}

bool lt_api_door_count_later(lt_api_t *api, struct evhttp_request *req, lt_api_slot_t slot, int64_t t0_us) {
  lt_api_conn_t *cn = conn_of(api, evhttp_request_get_connection(req));
  if (!cn) return false;
  /* evhttp reads a connection's next request only after answering this one: one slot suffices.
   * A connection that closes first frees cn, and libevent then never calls on_answered. */
  cn->answer_slot = slot;
  cn->answer_t0_us = t0_us;
  evhttp_request_set_on_complete_cb(req, on_answered, cn);
  return true;
}

/* A TLS context (TLS 1.2 and newer) from conf's PEM files into *out, and its certificate's notAfter
 * into *not_after; nothing in *out on an error. */
static lt_err_t tls_ctx_new(lt_api_t *api, SSL_CTX **out, int64_t *not_after, char *errstr, size_t n) {
  const char *cert = api->conf.tls_cert_file, *key = api->conf.tls_key_file;
  *out = NULL;
  SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot create a TLS context");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  char why[256] = "";
  lt_err_t err = LT_OK;
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
    ERR_error_string_n(ERR_get_error(), why, sizeof why);
    err = lt_errf(errstr, n, LT_ERR_INVALID, "the TLS certificate %s cannot be used: %s", cert, why);
  } else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    ERR_error_string_n(ERR_get_error(), why, sizeof why);
    err = lt_errf(errstr, n, LT_ERR_INVALID, "the TLS key %s cannot be used with %s: %s", key, cert, why);
  }
  ERR_clear_error(); /* the rest of the queue: no later SSL call on this thread may read it as its own */
  struct tm tm;
  X509 *x = err ? NULL : SSL_CTX_get0_certificate(ctx);
  *not_after = x && ASN1_TIME_to_tm(X509_get0_notAfter(x), &tm) == 1 ? (int64_t)timegm(&tm) : 0;
  if (err) SSL_CTX_free(ctx);
  else *out = ctx;
  return err;
}

/* The customer port's TLS context, when conf names the files. */
static lt_err_t tls_open(lt_api_t *api, char *errstr, size_t n) {
  const char *cert = api->conf.tls_cert_file, *key = api->conf.tls_key_file;
  if (!cert && !key) return LT_OK;
  if (!cert || !key)
    return lt_errf(errstr, n, LT_ERR_INVALID, "TLS needs both a certificate and its key (--tls-cert and --tls-key)");
  return tls_ctx_new(api, &api->tls, &api->tls_not_after, errstr, n);
}

lt_err_t lt_api_tls_reload(lt_api_t *api, char *errstr, size_t n) {
  if (!api->tls) return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "this API serves plain HTTP: no certificate to reload");
  SSL_CTX *ctx;
  int64_t not_after;
  lt_err_t err = tls_ctx_new(api, &ctx, &not_after, errstr, n);
  if (err) {
    api->stats.tls_reload_failures++;
    return err;
  }
  SSL_CTX_free(api->tls); /* each open connection's SSL holds its own reference to the old one */
  api->tls = ctx;
  api->tls_not_after = not_after;
  api->stats.tls_reloads++;
  return LT_OK;
}

lt_err_t lt_api_door_open(lt_api_t *api, struct evhttp *http, bool track, char *errstr, size_t n) {
  if (!track) {
    evhttp_set_bevcb(http, ops_conn_new, api);
    return LT_OK;
  }
  api->buckets = lt_map_new(free);
  api->conns = lt_map_new(free);
  api->conns_ev = event_new(api->base, -1, 0, conns_attach, api);
  if (!api->buckets || !api->conns || !api->conns_ev) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  lt_err_t err = tls_open(api, errstr, n);
  if (err) return err;
  evhttp_set_bevcb(http, conn_new, api);
  return LT_OK;
}

void lt_api_door_flush(lt_api_t *api, int max_ms) {
  if (!api->conns) return; /* it never listened (lt_api_new failed before) */
  for (int64_t t0 = lt_time_mono_ms();;) {
    bool left = false;
    lt_map_iter_t it = {0};
    while (!left && lt_map_next(api->conns, &it))
      left = evbuffer_get_length(bufferevent_get_output(((lt_api_conn_t *)it.value)->bev)) > 0;
    if (!left || lt_time_mono_ms() - t0 >= max_ms) return;
    event_base_loop(api->base, EVLOOP_NONBLOCK); /* the sockets' write events */
    nanosleep(&(struct timespec){0, 1000000}, NULL);
  }
}

void lt_api_door_free(lt_api_t *api) {
  while (api->conns_new) {
    lt_api_conn_t *cn = api->conns_new;
    api->conns_new = cn->next;
    free(cn);
  }
  if (api->conns_ev) event_free(api->conns_ev);
  lt_map_destroy(api->conns);
  lt_map_destroy(api->buckets);
  SSL_CTX_free(api->tls);
}

bool lt_api_hold_room(lt_api_t *api, struct evhttp_request *req, const char *tenant) {
  int per = api->conf.max_connections / 4 > 0 ? api->conf.max_connections / 4 : 1;
  int mine = lt_api_sessions_waiting_of(api, tenant) + lt_api_events_streams_of(api, tenant);
  if (mine < per) return true;
  api->stats.held_refused++;
  evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
  lt_api_reply_error(req, 429, "over_quota", NULL,
                     "%d long polls and event streams of yours are open; the limit is %d per tenant (a quarter of "
                     "max_connections = %d): close one, or poll with wait=0",
                     mine, per, api->conf.max_connections);
  return false;
}

/* Bytes written to a connection its client has not taken: in the connection's output buffer and
 * in the socket's send queue (Linux's SIOCOUTQ: unsent and unacknowledged), which the kernel holds
 * for it too and grows to megabytes. */
size_t lt_api_unread_bytes(struct evhttp_connection *evcon) {
  struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
  if (!bev) return 0;
  size_t n = evbuffer_get_length(bufferevent_get_output(bev));
  int queued = 0;
  evutil_socket_t fd = bufferevent_getfd(bev);
  if (fd >= 0 && ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0) n += (size_t)queued;
  return n;
}
