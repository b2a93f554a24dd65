/* lt_api_reply: how the API answers — JSON bodies, the error envelope
 * {"error":{"code","message","field","type","param"}} (OpenAI's shape: type from the status,
 * param = field) with the status an lt_err_t maps to — and the request
 * helpers every handler uses (body text, query string). See lt_api_int.h. */
#include "lt_api_int.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_log.h"

char *lt_api_json_text(json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15));
  json_decref(body);
  return text;
}

void lt_api_reply_json(struct evhttp_request *req, int status, json_t *body) {
  lt_api_reply_text(req, status, lt_api_json_text(body));
}

void lt_api_reply_text(struct evhttp_request *req, int status, char *text) {
  struct evbuffer *out = evbuffer_new();
  if (text) {
    evbuffer_add(out, text, strlen(text));
    evbuffer_add(out, "\n", 1);
  }
  free(text);
  evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
  const char *reason = status == 200 ? "OK" : status == 201 ? "Created" : status == 202 ? "Accepted" : NULL;
  evhttp_send_reply(req, status, reason, out);
  evbuffer_free(out);
}

/* OpenAI's error type for a status: clients written for it branch on this. */
static const char *error_type(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404:
  case 410: return "not_found_error";
  case 409: return "conflict_error";
  case 429: return "rate_limit_error";
  default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

json_t *lt_api_error_json(int status, const char *code, const char *field, const char *msg) {
  json_t *f = field && *field ? json_string(field) : json_null();
  return json_pack("{s:s,s:s,s:O,s:s,s:o}", "code", code, "message", msg, "field", f, "type", error_type(status),
                   "param", f);
}

void lt_api_reply_error(struct evhttp_request *req, int status, const char *code, const char *field,
                        const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lt_api_reply_json(req, status, json_pack("{s:o}", "error", lt_api_error_json(status, code, field, msg)));
}

void lt_api_reply_err(struct evhttp_request *req, lt_err_t err, const char *field, const char *msg) {
  switch (err) {
  case LT_ERR_INVALID: lt_api_reply_error(req, 400, "invalid", field, "%s", msg); break;
  case LT_ERR_NOT_FOUND: lt_api_reply_error(req, 404, "not_found", field, "%s", msg); break;
  case LT_ERR_QUOTA: lt_api_reply_error(req, 429, "over_quota", field, "%s", msg); break;
  case LT_ERR_AUTH: lt_api_reply_error(req, 401, "unauthorized", NULL, "%s", msg); break;
  case LT_ERR_EXISTS: lt_api_reply_error(req, 409, "conflict", field, "%s", msg); break;
  case LT_ERR_UNAVAILABLE:
  case LT_ERR_TIMEOUT:
  case LT_ERR_RETRIABLE:
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    lt_api_reply_error(req, 503, "unavailable", NULL, "%s", msg);
    break;
  default: lt_api_reply_error(req, 500, "internal", NULL, "%s", msg); break;
  }
}

void lt_api_reply_store_err(struct evhttp_request *req, lt_err_t err, const char *msg) {
  lt_err_t as = lt_store_err_retriable(err) ? LT_ERR_UNAVAILABLE
                : err == LT_ERR_NOT_FOUND     ? LT_ERR_NOT_FOUND
                                              : LT_ERR_INTERNAL;
  lt_api_reply_err(req, as, NULL, msg);
}

void lt_api_reply_store_fail(struct evhttp_request *req, lt_err_t err, const char *what, const char *store_msg) {
  const char *uri = evhttp_request_get_uri(req), *q = strchr(uri, '?'); /* a query may hold a tenant's names */
  lt_log_warn("api", "%.*s: %s: %s (%s)", (int)(q ? (size_t)(q - uri) : strlen(uri)), uri, what,
              store_msg ? store_msg : "", lt_err_name(err));
  lt_api_reply_store_err(req, err, what);
}

char *lt_api_body_text(lt_api_t *api, struct evhttp_request *req, size_t *len) {
  struct evbuffer *in = evhttp_request_get_input_buffer(req);
  size_t n = evbuffer_get_length(in);
  if (n > api->conf.max_json_body) {
    lt_api_reply_error(req, 413, "too_large", NULL, "request body is %zu bytes, over the limit of %zu", n,
                       api->conf.max_json_body);
    return NULL;
  }
  char *s = malloc(n + 1);
  if (!s) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  evbuffer_copyout(in, s, n);
  s[n] = '\0';
  if (len) *len = n;
  return s;
}

void lt_api_parse_query(struct evhttp_request *req, struct evkeyvalq *q) {
  const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
  evhttp_parse_query_str(query ? query : "", q);
}

const char *lt_api_query(struct evkeyvalq *q, const char *name) { return evhttp_find_header(q, name); }

/* Characters a server path is made of, after its leading '/'. */
static bool path_char(char ch) { return isalnum((unsigned char)ch) || strchr("._/-+~@%", ch); }

/* Replaces every occurrence of name in text (in place, within n bytes) with repl. */
static void replace_all(char *text, size_t n, const char *name, const char *repl) {
  size_t nl = strlen(name), rl = strlen(repl);
  if (nl < 3) return; /* a short name would match inside ordinary words */
  for (char *p = strstr(text, name); p; p = strstr(p + rl, name)) {
    size_t tail = strlen(p + nl);
    if ((size_t)(p - text) + rl + tail + 1 > n) return;
    memmove(p + rl, p + nl, tail + 1);
    memcpy(p, repl, rl);
  }
}

void lt_api_scrub(lt_api_t *api, const char *in, char *out, size_t n) {
  size_t o = 0;
  for (size_t i = 0; in[i] && o + 1 < n;) {
    bool starts = in[i] == '/' && (i == 0 || strchr(" \t'\"(=:,[", in[i - 1])) && path_char(in[i + 1]);
    if (!starts) {
      out[o++] = in[i++];
      continue;
    }
    while (in[i] && path_char(in[i])) i++;
    o += (size_t)snprintf(out + o, n - o, "(path)");
    if (o >= n) o = n - 1;
  }
  out[o] = '\0';
  /* Worker ids are host names unless configured otherwise; so may this API's own be. */
  const char *wid;
  json_t *hb;
  json_object_foreach(lt_proj_workers(api->proj), wid, hb) replace_all(out, n, wid, "(worker)");
  char host[256];
  if (gethostname(host, sizeof host) == 0) {
    host[sizeof host - 1] = '\0';
    replace_all(out, n, host, "(host)");
  }
}
