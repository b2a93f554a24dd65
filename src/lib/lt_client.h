/* lt_client: the customer side of the Lathe API — a small synchronous HTTP/1.1 client over
 * libevent's evhttp, used by the `lathe jobs|datasets` commands, the API tests and the API
 * benchmark.
 *
 * One client holds one event_base and one keep-alive connection to the API (reconnected by
 * evhttp when it drops). With an https:// URL every request has a TLS connection of its own: the
 * server's certificate is verified against the CA file (opts.ca_file, else $LATHE_API_CA_FILE,
 * else the system's trust store) and must name the URL's host. Every call blocks until the answer is complete or the timeout passes.
 * Failures to reach the server are LT_ERR_UNAVAILABLE with the message
 * "cannot reach the Lathe API at URL: is lathed running? (...)"; an HTTP answer, whatever its
 * status, is LT_OK and the caller reads resp->status. lt_client_error_text() turns the API's
 * {"error":{"code","message","field"}} into one line for a person.
 *
 * Threads: a client is used by one thread at a time. Different clients are independent. */
#ifndef LT_CLIENT_H
#define LT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "lt_err.h"

typedef struct lt_client lt_client_t;

typedef struct lt_client_opts {
  const char *url;     /* NULL: $LATHE_API_URL, else "http://127.0.0.1:8080"; http:// or https:// */
  const char *ca_file; /* https: PEM CA certificates to trust; NULL: $LATHE_API_CA_FILE, else the system's */
  const char *api_key; /* NULL: $LATHE_API_KEY; may end up NULL (requests go without auth) */
  int timeout_s;       /* per request (0: 60); SSE streams wait without a limit */
} lt_client_opts_t;

/* Creates a client. opts may be NULL. Only the URL (scheme http or https, a host) and the CA file
 * are checked here; nothing is connected until the first request. Copies every string. */
lt_err_t lt_client_new(const lt_client_opts_t *opts, lt_client_t **out, char *errstr, size_t errstr_size);

void lt_client_destroy(lt_client_t *c); /* NULL is a no-op */

/* The base URL in use ("http://127.0.0.1:8080"); owned by the client. */
const char *lt_client_url(const lt_client_t *c);

/* Replaces the API key (NULL: none). Copies it. */
void lt_client_set_api_key(lt_client_t *c, const char *api_key);

/* One extra request header (borrowed for the call). */
typedef struct lt_client_header {
  const char *name;
  const char *value;
} lt_client_header_t;

/* An answer. body is NUL-terminated (len excludes the NUL); json is the parsed body when it is
 * JSON, else NULL. Free with lt_client_resp_free (the struct itself is the caller's). */
typedef struct lt_client_resp {
  int status;
  char *body;
  size_t len;
  json_t *json;
  char retry_after[16]; /* the Retry-After header, "" when absent */
} lt_client_resp_t;

void lt_client_resp_free(lt_client_resp_t *r);

/* Sends method (GET POST PUT DELETE) to path (starts with '/', may hold a query) with an
 * optional body (len bytes, NULL when none) of content_type (NULL: application/json), and the
 * given extra headers. Fills *resp. LT_ERR_UNAVAILABLE when the server cannot be reached,
 * LT_ERR_TIMEOUT when it did not answer in time, LT_ERR_IO when the connection broke mid-way.
 * A 503 `starting` (the API still reading the log back) is sent again after its Retry-After,
 * until the client's timeout; then it is the answer. */
lt_err_t lt_client_request(lt_client_t *c, const char *method, const char *path, const lt_client_header_t *headers,
                           size_t nheaders, const void *body, size_t len, const char *content_type,
                           lt_client_resp_t *resp, char *errstr, size_t errstr_size);

/* lt_client_request with a JSON body (borrowed; NULL: no body) and an optional Idempotency-Key. */
lt_err_t lt_client_json(lt_client_t *c, const char *method, const char *path, const json_t *body,
                        const char *idempotency_key, lt_client_resp_t *resp, char *errstr, size_t errstr_size);

/* One line for a person from a non-2xx answer: "HTTP 429 over_quota: <message> (field x)".
 * Writes into out and returns it. */
const char *lt_client_error_text(const lt_client_resp_t *r, char *out, size_t out_size);

/* ---------------------------------------------------------------- Server-Sent Events */

/* One event, borrowed for the callback. id and event are "" when the server sent none. */
typedef struct lt_client_event {
  const char *id;
  const char *event;
  const char *data; /* the data lines joined with '\n' */
} lt_client_event_t;

/* Called for each event; return true to stop reading (the stream is closed, LT_OK). */
typedef bool lt_client_event_fn(void *ctx, const lt_client_event_t *ev);

/* Opens an event stream at path (GET, Accept: text/event-stream, Last-Event-ID when
 * last_event_id is not NULL) and calls fn for each event until the server ends the stream
 * (LT_OK), fn asks to stop (LT_OK), or the connection drops (LT_ERR_IO: reconnect with the
 * last id seen). A non-200 answer is LT_ERR_INVALID / LT_ERR_NOT_FOUND / LT_ERR_AUTH with the
 * API's message, its status in *status (may be NULL). */
lt_err_t lt_client_events(lt_client_t *c, const char *path, const char *last_event_id, lt_client_event_fn *fn,
                          void *ctx, int *status, char *errstr, size_t errstr_size);

#endif
