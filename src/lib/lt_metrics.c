/* lt_metrics: the Prometheus text format and the operator endpoint (see lt_metrics.h). */
#include "lt_metrics.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

struct lt_metrics {
  FILE *f; /* an open_memstream over text */
  char *text;
  size_t len;
  char family[128];
  lt_metric_type_t type;
};

lt_metrics_t *lt_metrics_new(void) {
  lt_metrics_t *m = calloc(1, sizeof *m);
  if (m && !(m->f = open_memstream(&m->text, &m->len))) {
    free(m);
    return NULL;
  }
  return m;
}

static const char *const type_names[] = {"counter", "gauge", "histogram"};

void lt_metrics_family(lt_metrics_t *m, const char *name, lt_metric_type_t type, const char *help) {
  if (!m) return;
  snprintf(m->family, sizeof m->family, "%s", name);
  m->type = type;
  fprintf(m->f, "# HELP %s ", name);
  for (const char *p = help; *p; p++) { /* HELP escapes only \ and newline */
    if (*p == '\\') fputs("\\\\", m->f);
    else if (*p == '\n') fputs("\\n", m->f);
    else fputc(*p, m->f);
  }
  fprintf(m->f, "\n# TYPE %s %s\n", name, type_names[type]);
}

/* name{labels[,le="bound"]} — the braces only when there is a label. */
static void put_name(lt_metrics_t *m, const char *suffix, const lt_metric_label_t *labels, const char *le) {
  fprintf(m->f, "%s%s", m->family, suffix);
  bool any = false;
  for (const lt_metric_label_t *l = labels; l && l->name; l++) {
    fprintf(m->f, "%s%s=\"", any ? "," : "{", l->name);
    for (const char *p = l->value ? l->value : ""; *p; p++) {
      if (*p == '\\' || *p == '"') fputc('\\', m->f);
      if (*p == '\n') fputs("\\n", m->f);
      else fputc(*p, m->f);
    }
    fputc('"', m->f);
    any = true;
  }
  if (le) fprintf(m->f, "%sle=\"%s\"", any ? "," : "{", le), any = true;
  fputs(any ? "} " : " ", m->f);
}

/* Whole numbers as integers (counters past 2^53 aside, exact), others with 15 digits. */
static void put_value(lt_metrics_t *m, double v) {
  if (isnan(v)) fputs("NaN\n", m->f);
  else if (isinf(v)) fputs(v > 0 ? "+Inf\n" : "-Inf\n", m->f);
  else if (v == floor(v) && fabs(v) < 9.2e18) fprintf(m->f, "%" PRId64 "\n", (int64_t)v);
  else fprintf(m->f, "%.15g\n", v);
}

void lt_metrics_sample(lt_metrics_t *m, const lt_metric_label_t *labels, double value) {
  if (!m) return;
  put_name(m, "", labels, NULL);
  put_value(m, value);
}

void lt_metrics_one(lt_metrics_t *m, const char *name, lt_metric_type_t type, const char *help, double value) {
  lt_metrics_family(m, name, type, help);
  lt_metrics_sample(m, NULL, value);
}

void lt_metrics_hist_init(lt_metrics_hist_t *h, const double *bounds, int nbounds) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->nbounds = nbounds < LT_METRICS_BUCKETS_MAX ? nbounds : LT_METRICS_BUCKETS_MAX;
}

void lt_metrics_hist_observe(lt_metrics_hist_t *h, double v) {
  int b = 0;
  while (b < h->nbounds && v > h->bounds[b]) b++;
  h->le[b]++;
  h->count++;
  h->sum += v;
}

void lt_metrics_buckets(lt_metrics_t *m, const lt_metric_label_t *labels, const double *bounds,
                        const uint64_t *cumulative, int n, double sum, uint64_t count) {
  if (!m) return;
  char le[32];
  for (int b = 0; b < n; b++) {
    snprintf(le, sizeof le, "%.9g", bounds[b]);
    put_name(m, "_bucket", labels, le);
    put_value(m, (double)cumulative[b]);
  }
  put_name(m, "_bucket", labels, "+Inf");
  put_value(m, (double)count);
  put_name(m, "_sum", labels, NULL);
  put_value(m, sum);
  put_name(m, "_count", labels, NULL);
  put_value(m, (double)count);
}

void lt_metrics_hist(lt_metrics_t *m, const lt_metric_label_t *labels, const lt_metrics_hist_t *h) {
  uint64_t cum[LT_METRICS_BUCKETS_MAX], total = 0;
  for (int b = 0; b < h->nbounds; b++) cum[b] = total += h->le[b];
  lt_metrics_buckets(m, labels, h->bounds, cum, h->nbounds, h->sum, h->count);
}

char *lt_metrics_text(lt_metrics_t *m, size_t *len) {
  if (!m) return NULL;
  bool ok = !ferror(m->f);
  fclose(m->f); /* text and len are final after this */
  char *text = ok ? m->text : NULL;
  if (!ok) free(m->text);
  if (len) *len = ok ? m->len : 0;
  free(m);
  return text;
}

/* ---------------------------------------------------------------- the operator endpoint */

struct lt_metrics_server {
  struct evhttp *http;
  uint16_t port;
  lt_metrics_render_fn render;
  lt_metrics_health_fn health;
  void *ctx;
};

static void reply(struct evhttp_request *req, int code, const char *type, char *body) {
  struct evbuffer *b = evbuffer_new();
  if (b && body) evbuffer_add(b, body, strlen(body));
  free(body);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
  evhttp_send_reply(req, code, code == 200 ? "OK" : code == 404 ? "Not Found" : "Service Unavailable", b);
  if (b) evbuffer_free(b);
}

static void on_request(struct evhttp_request *req, void *arg) {
  lt_metrics_server_t *s = arg;
  const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
  if (path && strcmp(path, "/metrics") == 0) {
    char *text = s->render(s->ctx);
    if (text) reply(req, 200, "text/plain; version=0.0.4", text);
    else reply(req, 503, "application/json", strdup("{\"error\":{\"code\":\"unavailable\"}}\n"));
  } else if (path && strcmp(path, "/healthz") == 0) {
    char *json = NULL;
    int code = s->health(s->ctx, &json);
    reply(req, code, "application/json", json);
  } else {
    reply(req, 404, "application/json",
          strdup("{\"error\":{\"code\":\"not_found\",\"message\":\"the operator port serves GET /healthz "
                 "and /metrics\"}}\n"));
  }
}

lt_err_t lt_metrics_server_new(struct event_base *base, const char *addr, uint16_t port,
                               lt_metrics_render_fn render, lt_metrics_health_fn health, void *ctx,
                               lt_metrics_server_t **out, char *errstr, size_t n) {
  *out = NULL;
  lt_metrics_server_t *s = calloc(1, sizeof *s);
  if (!s || !(s->http = evhttp_new(base))) {
    free(s);
    return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  }
  s->render = render;
  s->health = health;
  s->ctx = ctx;
  evhttp_set_timeout(s->http, 30);
  evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET);
  evhttp_set_gencb(s->http, on_request, s);
  struct evhttp_bound_socket *b = evhttp_bind_socket_with_handle(s->http, addr, port);
  if (!b) {
    lt_metrics_server_destroy(s);
    return lt_errf(errstr, n, LT_ERR_IO,
                   "cannot listen on %s:%u (the operator port: in use, or not an address of this host; "
                   "--operator-port 0 picks a free one)",
                   addr, port);
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(evhttp_bound_socket_get_fd(b), (struct sockaddr *)&ss, &sl);
  s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                     : ntohs(((struct sockaddr_in *)&ss)->sin_port);
  *out = s;
  return LT_OK;
}

uint16_t lt_metrics_server_port(const lt_metrics_server_t *s) { return s ? s->port : 0; }

void lt_metrics_server_destroy(lt_metrics_server_t *s) {
  if (!s) return;
  if (s->http) evhttp_free(s->http);
  free(s);
}
