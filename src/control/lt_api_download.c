/* lt_api_download: GET /v1/jobs/{id}/artifacts/{name} — a published artifact, streamed.
 *
 * An artifact can be gigabytes; reading it whole into memory (and copying it into the reply)
 * would make the API's memory a function of what its customers download. Instead a thread of
 * the download's own reads the sealed object from the store in pieces (lt_store_get_stream),
 * decrypts them as they come (an LTE1 stream releases a chunk's plaintext only once its tag
 * verified), and hands the plaintext to the loop thread, which writes it to the client with
 * evhttp_send_reply_chunk_with_cb: the next piece goes out only once the previous one is on the
 * socket. The thread waits while conf.download_window bytes are waiting, so a download holds
 * about two windows whatever the artifact's size or the client's speed.
 *
 * Why a thread per download rather than the pool: a slow client holds its download for as long
 * as it reads, and must not hold a pool thread that other tenants' uploads need. The count is
 * capped (conf.max_downloads, and a quarter of it per tenant): beyond it, 429.
 *
 * A failure before the first byte answers an error; after it (a chunk that does not verify, the
 * store going away), the connection is dropped, so that the client sees a body shorter than its
 * Content-Length and never takes a truncated artifact for a whole one. Plaintext buffers are
 * scrubbed when evhttp is done with them.
 *
 * A staff read carries its grant: no piece goes out once the grant no longer holds, and the
 * connection is cut as soon as the API learns it was revoked (a folded access record) or sees it
 * ran out (the tick), whether or not the client is reading. So is a download of a deleted job's
 * artifact once the API folds the JobDeleted: the store may go on serving a GET begun before the
 * objects were removed, and the tenant asked for nothing of the job to leave after its DELETE. */
#include "lt_api_int.h"
#include "lt_log.h"
#include "lt_time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#define PIECE (64u * 1024) /* plaintext handed over at a time */

struct lt_api_download {
  lt_api_t *api;
  struct evhttp_request *req;
  struct evhttp_connection *evcon;
  char tenant[LT_ID_MAX + 1];
  char job[LT_ID_MAX + 1]; /* whose artifact ("": a dataset) */
  char key[LT_STORE_KEY_MAX + 1];
  char dek_key[LT_STORE_KEY_MAX + 1]; /* the job's wrapped artifact key */
  char content_type[64];
  const lt_crypto_dek_t *dek; /* the tenant's: artifacts published before jobs had keys */
  bool own_key;               /* sealed under dek_key's key only (a dataset): none is 404 */
  lt_crypto_dek_t *job_dek;   /* the job's, when it has one (the thread's) */
  uint64_t bytes;
  struct event *ev; /* the thread wakes the loop */
  pthread_t thread;
  bool thread_started;
  /* Under mu: */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct evbuffer *q; /* plaintext from the thread, not yet handed to evhttp */
  bool stop;          /* the loop asks the thread to stop */
  bool finished;      /* the thread is done; err and msg say how */
  lt_err_t err;
  char msg[LT_STORE_KEY_MAX + 512];
  /* Loop thread only: */
  bool started; /* the reply's headers went out */
  bool writing; /* a piece is in evhttp's output, not yet on the socket */
  bool gone;    /* the client's connection closed */
  bool granted; /* a staff read: grant must hold for each piece */
  bool deleted; /* its object was deleted here (lt_api_download_cut_object) */
  lt_api_grant_t grant;
  lt_crypto_stream_t *dec; /* the thread's */
  lt_api_download_t *next;
};

/* ---------------------------------------------------------------- the thread */

static void piece_cleanup(const void *data, size_t len, void *arg) {
  (void)arg;
  OPENSSL_cleanse((void *)data, len);
  free((void *)data);
}

/* Decrypts what the store handed over and queues the plaintext; waits while a window waits. */
static lt_err_t sink(void *ctx, const void *data, size_t len) {
  lt_api_download_t *d = ctx;
  const uint8_t *p = data;
  do {
    size_t in = len < PIECE ? len : PIECE, cap = lt_crypto_stream_out_max(d->dec, in), out = 0;
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!buf) return LT_ERR_NOMEM;
    char msg[256];
    lt_err_t err = in ? lt_crypto_stream_update(d->dec, p, in, buf, cap, &out, msg, sizeof msg)
                      : lt_crypto_stream_final(d->dec, buf, cap, &out, msg, sizeof msg);
    if (err) {
      free(buf);
      pthread_mutex_lock(&d->mu);
      snprintf(d->msg, sizeof d->msg, "object %s: %s", d->key, msg);
      pthread_mutex_unlock(&d->mu);
      return err;
    }
    pthread_mutex_lock(&d->mu);
    while (!d->stop && evbuffer_get_length(d->q) >= d->api->conf.download_window) pthread_cond_wait(&d->cv, &d->mu);
    bool stop = d->stop;
    if (!stop && out) evbuffer_add_reference(d->q, buf, out, piece_cleanup, NULL);
    pthread_mutex_unlock(&d->mu);
    if (stop || !out) piece_cleanup(buf, cap, NULL);
    if (stop) return LT_ERR_CANCELLED;
    event_active(d->ev, 0, 0);
    p += in;
    len -= in;
  } while (len);
  return LT_OK;
}

/* The job's artifact key when it has one (lt_publisher.h: Keys), else the tenant's. */
static lt_err_t pick_dek(lt_api_download_t *d, const lt_crypto_dek_t **dek, char *msg, size_t n) {
  void *blob = NULL;
  size_t len = 0;
  lt_err_t err = lt_store_get(d->api->conf.store, d->dek_key, LT_CRYPTO_WRAPPED_MAX, &blob, &len, NULL, msg, n);
  if (!err) err = lt_crypto_dek_unwrap(d->api->conf.kek, d->tenant, blob, len, &d->job_dek, msg, n);
  free(blob);
  *dek = d->job_dek ? d->job_dek : d->dek;
  return err == LT_ERR_NOT_FOUND && !d->own_key ? LT_OK : err;
}

static void *download_main(void *arg) {
  lt_api_download_t *d = arg;
  char msg[256] = "";
  const lt_crypto_dek_t *dek = NULL;
  lt_err_t err = pick_dek(d, &dek, msg, sizeof msg);
  if (!err) err = lt_crypto_dec_new(&d->dec, dek, d->key, msg, sizeof msg);
  if (!err) err = lt_store_get_stream(d->api->conf.store, d->key, sink, d, NULL, msg, sizeof msg);
  if (!err) err = sink(d, NULL, 0); /* the final chunk: verifies the stream was not cut short */
  lt_crypto_stream_destroy(d->dec);
  d->dec = NULL;
  pthread_mutex_lock(&d->mu);
  d->finished = true;
  d->err = err;
  if (err && !d->msg[0]) snprintf(d->msg, sizeof d->msg, "object %s: %s", d->key, msg[0] ? msg : lt_err_str(err));
  pthread_mutex_unlock(&d->mu);
  event_active(d->ev, 0, 0);
  return NULL;
}

/* ---------------------------------------------------------------- the loop side */

static void download_free(lt_api_download_t *d) {
  lt_api_t *api = d->api;
  for (lt_api_download_t **pp = &api->downloads; *pp; pp = &(*pp)->next)
    if (*pp == d) {
      *pp = d->next;
      api->ndownloads--;
      break;
    }
  if (d->thread_started) pthread_join(d->thread, NULL);
  if (d->ev) event_free(d->ev);
  if (d->q) evbuffer_free(d->q);
  lt_crypto_dek_destroy(d->job_dek);
  pthread_mutex_destroy(&d->mu);
  pthread_cond_destroy(&d->cv);
  free(d);
}

/* Asks the thread to stop (it ends at its next piece). */
static void download_cancel(lt_api_download_t *d) {
  pthread_mutex_lock(&d->mu);
  d->stop = true;
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* Through the front door's close hook (lt_api_limits.c), which owns the connection's close
 * callback: setting our own would leave the connection counted against max_connections. */
static void on_closed(void *arg) {
  lt_api_download_t *d = arg;
  d->gone = true;
  lt_api_door_release(d->req);
  d->req = NULL;
  download_cancel(d);
}

/* The end: a whole body is finished; a cut one drops the connection (Content-Length then tells
 * the client it is short). Frees d. */
static void download_end(lt_api_download_t *d, bool whole) {
  if (d->gone) { /* the request went with on_closed */
  } else if (whole) {
    lt_api_door_on_close(d->api, d->evcon, NULL, NULL);
    evhttp_send_reply_end(d->req);
  } else {
    lt_api_door_on_close(d->api, d->evcon, NULL, NULL);
    evhttp_connection_free(d->evcon); /* frees the request too */
  }
  download_free(d);
}

static void pump(lt_api_download_t *d);

static void on_written(struct evhttp_connection *evcon, void *arg) {
  lt_api_download_t *d = arg;
  (void)evcon;
  d->writing = false;
  pump(d);
}

/* Starts the reply once there is something to say: the headers, or an error before any byte. */
static bool reply_start(lt_api_download_t *d, bool have, bool finished, lt_err_t err) {
  if (!have && !finished) return false;
  if (!have && err) {
    lt_api_door_on_close(d->api, d->evcon, NULL, NULL);
    /* A published artifact that is not there is the service's fault, not the client's; a dataset
     * (own_key) deleted since it was looked up is gone: 404. */
    if (err == LT_ERR_NOT_FOUND && d->own_key)
      lt_api_reply_error(d->req, 404, "not_found", NULL, "the object is gone: deleted since it was looked up");
    else
      lt_api_reply_store_fail(d->req, err == LT_ERR_NOT_FOUND ? LT_ERR_INTERNAL : err, "the object could not be read",
                              d->msg);
    download_free(d);
    return false;
  }
  char len[32];
  snprintf(len, sizeof len, "%llu", (unsigned long long)d->bytes);
  struct evkeyvalq *h = evhttp_request_get_output_headers(d->req);
  evhttp_add_header(h, "Content-Type", d->content_type);
  evhttp_add_header(h, "Content-Length", len);
  evhttp_send_reply_start(d->req, 200, "OK");
  d->started = true;
  return true;
}

/* A staff read whose grant was revoked or ran out, or a download of a job deleted since it
 * started: its connection is cut now, as a client that leaves does (on_closed stops the thread;
 * the download ends once it has). True when it was. */
static bool cut_ungranted(lt_api_download_t *d) {
  char why[512];
  const lt_access_req_t *q;
  if (d->gone) return false;
  if (d->deleted || (d->job[0] && lt_api_job_deleted(d->api, d->job))) {
    lt_log_info("api", "download of %s cut: %s was deleted", d->key, d->job[0] ? "its job" : "it");
    d->api->stats.downloads_cut_deleted++;
  } else if (d->granted && lt_access_check(d->api->access, d->grant.request_id, d->grant.staff, d->grant.resource,
                                           lt_time_wall_ms(), &q, why, sizeof why)) {
    lt_log_info("api", "staff read of %s under access request %s cut: %s", d->grant.resource, d->grant.request_id,
                why);
    d->api->stats.staff_reads_cut++;
  } else {
    return false;
  }
  lt_api_door_on_close(d->api, d->evcon, NULL, NULL);
  on_closed(d);
  evhttp_connection_free(d->evcon); /* frees the request too */
  return true;
}

/* On the loop: hands the next waiting piece to evhttp, or ends. */
static void pump(lt_api_download_t *d) {
  if (cut_ungranted(d)) {
    pump(d); /* gone now: ends if the thread has */
    return;
  }
  pthread_mutex_lock(&d->mu);
  bool finished = d->finished, have = evbuffer_get_length(d->q) > 0;
  lt_err_t err = d->err;
  pthread_mutex_unlock(&d->mu);
  if (d->gone) { /* before the writing check: a piece in flight when the client went never reports */
    if (finished) download_end(d, false);
    return;
  }
  if (d->writing) return;
  struct evbuffer *out = NULL;
  if (have && (out = evbuffer_new())) {
    pthread_mutex_lock(&d->mu);
    evbuffer_add_buffer(out, d->q);
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
  }
  if (!d->started && !reply_start(d, have, finished, err)) {
    if (out) evbuffer_free(out);
    return;
  }
  if (out) {
    d->writing = true;
    evhttp_send_reply_chunk_with_cb(d->req, out, on_written, d);
    evbuffer_free(out);
  } else if (finished) {
    download_end(d, err == LT_OK);
  }
}

static void on_wake(evutil_socket_t fd, short what, void *arg) {
  (void)fd, (void)what;
  pump(arg);
}

/* The tenant's own open downloads (staff NULL), or staff member staff's open reads: neither counts
 * the other's. */
static int downloads_of(lt_api_t *api, const char *tenant, const char *staff) {
  int n = 0;
  for (lt_api_download_t *d = api->downloads; d; d = d->next)
    n += staff ? d->granted && strcmp(d->grant.staff, staff) == 0 : !d->granted && strcmp(d->tenant, tenant) == 0;
  return n;
}

bool lt_api_download_room(lt_api_t *api, struct evhttp_request *req, const char *tenant, const char *staff) {
  int per = api->conf.max_downloads / 4 > 0 ? api->conf.max_downloads / 4 : 1;
  int mine = downloads_of(api, tenant, staff);
  if (api->ndownloads < api->conf.max_downloads && mine < per) return true;
  evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
  /* a staff read counts against the staff member's share, not the tenant's, and its refusal gives
   * no count that holds the tenant's own downloads: whether the tenant is downloading now is not
   * for staff to learn */
  if (staff)
    lt_api_reply_error(req, 429, "over_quota", NULL,
                       "downloads are at a limit (%d of yours of %d per staff member, or max_downloads in all): "
                       "retry when one finished",
                       mine, per);
  else
    lt_api_reply_error(req, 429, "over_quota", NULL,
                       "%d downloads (artifacts, staff reads) are in progress (%d of tenant %s); the limits are %d in "
                       "all (max_downloads) and %d per tenant: retry when one finished",
                       api->ndownloads, mine, tenant, api->conf.max_downloads, per);
  return false;
}

void lt_api_download_start(lt_api_t *api, struct evhttp_request *req, const lt_crypto_dek_t *dek, const char *dek_key,
                           bool own_key, const char *key, uint64_t bytes, const char *content_type, const char *job) {
  lt_api_download_start_granted(api, req, dek, dek_key, own_key, key, bytes, content_type, job, NULL);
}

void lt_api_download_start_granted(lt_api_t *api, struct evhttp_request *req, const lt_crypto_dek_t *dek,
                                   const char *dek_key, bool own_key, const char *key, uint64_t bytes,
                                   const char *content_type, const char *job, const lt_api_grant_t *g) {
  /* A request whose client left while it waited (a staff read waits for its audit record) has
   * no connection any more: answering frees it. */
  if (!evhttp_request_get_connection(req)) {
    lt_api_reply_error(req, 503, "unavailable", NULL, "the client went away");
    return;
  }
  const char *tenant = lt_crypto_dek_tenant(dek);
  if (!lt_api_download_room(api, req, tenant, g ? g->staff : NULL)) return;
  lt_api_download_t *d = calloc(1, sizeof *d);
  if (!d) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return;
  }
  d->api = api;
  d->req = req;
  d->evcon = evhttp_request_get_connection(req);
  d->dek = dek;
  d->own_key = own_key;
  d->bytes = bytes;
  snprintf(d->tenant, sizeof d->tenant, "%s", tenant);
  snprintf(d->job, sizeof d->job, "%s", job ? job : "");
  snprintf(d->key, sizeof d->key, "%s", key);
  snprintf(d->dek_key, sizeof d->dek_key, "%s", dek_key);
  snprintf(d->content_type, sizeof d->content_type, "%s", content_type);
  if ((d->granted = g != NULL)) d->grant = *g;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  d->next = api->downloads;
  api->downloads = d;
  api->ndownloads++;
  d->q = evbuffer_new();
  d->ev = event_new(api->base, -1, 0, on_wake, d);
  if (!d->q || !d->ev || pthread_create(&d->thread, NULL, download_main, d)) {
    lt_api_reply_error(req, 500, "internal", NULL, "cannot start the download");
    download_free(d);
    return;
  }
  d->thread_started = true;
  if (!lt_api_door_on_close(api, d->evcon, on_closed, d)) {
    /* Its close could not be watched (out of memory when it opened): no stream to it. */
    download_cancel(d);
    pthread_join(d->thread, NULL);
    d->thread_started = false;
    lt_api_reply_error(req, 503, "unavailable", NULL, "cannot watch this connection; retry");
    download_free(d);
  }
}

void lt_api_download_stop_all(lt_api_t *api) {
  while (api->downloads) {
    lt_api_download_t *d = api->downloads;
    download_cancel(d);
    if (d->thread_started) pthread_join(d->thread, NULL);
    d->thread_started = false;
    download_end(d, false);
  }
}

void lt_api_download_cut_object(lt_api_t *api, const char *key) {
  for (lt_api_download_t *d = api->downloads; d; d = d->next)
    if (strcmp(d->key, key) == 0) d->deleted = true;
  lt_api_download_recheck(api);
}

void lt_api_download_recheck(lt_api_t *api) {
  for (lt_api_download_t *d = api->downloads, *next; d; d = next) {
    next = d->next;
    if (cut_ungranted(d)) pump(d); /* may free d */
  }
}
