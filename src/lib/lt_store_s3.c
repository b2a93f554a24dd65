/* lt_store_s3: the S3 backend (MinIO in production, S3Proxy in the local stack).
 *
 * Single-request operations (put, get, head, list, delete, copy) go through libs3 2.0: signature
 * V2, path-style URIs, plain HTTP to a local server. libs3 2.0 has no multipart upload, so the
 * four multipart requests (initiate, upload part, complete, abort) are sent here over libcurl
 * with the same V2 signature (HMAC-SHA1 from OpenSSL EVP).
 *
 * Every request is retried with exponential backoff and jitter on retriable failures (connection
 * errors, 5xx, SlowDown, RequestTimeout); after the last attempt the caller gets
 * LT_ERR_UNAVAILABLE. A multipart upload that fails is aborted, so no half-written object and no
 * orphaned parts remain. A retried get resumes at the byte where it stopped and pins the object
 * by its etag (If-Match), so the sink never sees bytes of two versions. */
#include "lt_store_int.h"

#include <ctype.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <curl/curl.h>
#include <libs3.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "lt_crypto.h"

/* libs3 2.0 dates every request with gmtime(), whose result is one static buffer for the whole
 * process: two threads signing requests at once (a worker's checkpoint uploader and its session
 * threads) can each read the other's half-written date, and the store refuses a request whose
 * Date is off (ThreadSanitizer saw the race in a chaos run). Defined here, in the executable,
 * gmtime is where libs3's call binds; this one keeps a buffer per thread, as POSIX allows. */
struct tm *gmtime(const time_t *t) {
  static __thread struct tm buf;
  return gmtime_r(t, &buf);
}

#define MIN_PART (5u * 1024 * 1024)
#define DEFAULT_PART (8u * 1024 * 1024)
#define BACKOFF_CAP_MS 5000
#define RESP_CAP (64 * 1024)

typedef struct s3_store {
  char host[256];
  char bucket[256];
  char access[256];
  char secret[256];
  S3BucketContext bc;
  int max_attempts;
  int backoff_ms;
  size_t part_size;
} s3_store_t;

/* ---- libs3 plumbing ------------------------------------------------------------------------- */

static pthread_once_t s3_once = PTHREAD_ONCE_INIT;
static S3Status s3_init_status;

static void s3_init(void) {
  /* Also initialises libcurl (S3_INIT_ALL), which the multipart path shares. */
  s3_init_status = S3_initialize("lathe", S3_INIT_ALL, NULL);
}

/* State of one libs3 request, shared by its callbacks. */
typedef struct req {
  S3Status status;
  char msg[256];
  /* response properties */
  bool have_props;
  uint64_t length;
  int64_t mtime;
  char etag[LT_STORE_ETAG_MAX];
  /* put */
  const uint8_t *data;
  size_t len, off;
  /* get */
  lt_store_sink_fn sink;
  void *ctx;
  lt_err_t sink_err;
  uint64_t delivered;
  /* copy */
  const char *dst;
  /* list */
  lt_store_list_fn fn;
  size_t listed;
  bool truncated;
  char last[LT_STORE_KEY_MAX + 1];
} req_t;

static S3Status on_props(const S3ResponseProperties *p, void *data) {
  req_t *r = data;
  r->have_props = true;
  r->length = p->contentLength;
  r->mtime = p->lastModified;
  snprintf(r->etag, sizeof r->etag, "%s", p->eTag ? p->eTag : "");
  return S3StatusOK;
}

static void on_complete(S3Status status, const S3ErrorDetails *err, void *data) {
  req_t *r = data;
  r->status = status;
  r->msg[0] = 0;
  if (err && err->message) snprintf(r->msg, sizeof r->msg, "%s", err->message);
}

static const S3ResponseHandler resp_handler = {on_props, on_complete};

static bool status_retriable(S3Status st) {
  /* libs3 2.0 has no ServiceUnavailable code: a 503 arrives as HttpErrorUnknown. A connection
   * that breaks mid-request (the server killed during an upload: curl's send/receive errors,
   * an empty reply) arrives as libs3's own InternalError, which S3_status_is_retryable leaves
   * out; it is as transient as a refused connection. */
  return S3_status_is_retryable(st) || st == S3StatusErrorInternalError || st == S3StatusInternalError ||
         st == S3StatusErrorSlowDown ||
         st == S3StatusErrorRequestTimeout || st == S3StatusHttpErrorUnknown;
}

static void backoff(const s3_store_t *s, int attempt) {
  long ms = (long)s->backoff_ms << (attempt < 16 ? attempt : 16);
  if (ms > BACKOFF_CAP_MS) ms = BACKOFF_CAP_MS;
  uint32_t r = 0;
  lt_crypto_random(&r, sizeof r);
  ms = ms / 2 + (long)(r % (uint32_t)(ms / 2 + 1)); /* "equal jitter" */
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
}

/* After attempt a (1-based) of a request: false when it succeeded, failed for good or used the
 * last attempt; otherwise sleeps the backoff and returns true (the one retry rule of the store). */
static bool try_again(const s3_store_t *s, const req_t *r, int a) {
  if (r->status == S3StatusOK || !status_retriable(r->status) || a >= s->max_attempts) return false;
  backoff(s, a - 1);
  return true;
}

/* Turns a final libs3 status into lt_err_t with a message naming the operation and key. */
static lt_err_t s3_err(const s3_store_t *s, const req_t *r, const char *op, const char *key,
                       int attempts, char *errstr, size_t errstr_size) {
  S3Status st = r->status;
  const char *name = S3_get_status_name(st);
  const char *detail = r->msg[0] ? r->msg : name;
  switch (st) {
  case S3StatusOK:
    return LT_OK;
  case S3StatusErrorNoSuchKey:
  case S3StatusHttpErrorNotFound:
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "%s '%s': no such object", op, key);
  case S3StatusErrorNoSuchBucket:
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE, "%s '%s': bucket '%s' does not exist "
                   "on %s (ops/stack up creates it)", op, key, s->bucket, s->host);
  case S3StatusErrorAccessDenied:
  case S3StatusErrorInvalidAccessKeyId:
  case S3StatusErrorSignatureDoesNotMatch:
  case S3StatusHttpErrorForbidden:
    return lt_errf(errstr, errstr_size, LT_ERR_AUTH, "%s '%s': %s refused the credentials of "
                   "access key '%s' (%s)", op, key, s->host, s->access, detail);
  case S3StatusErrorPreconditionFailed:
    return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE, "%s '%s': the object changed while it "
                   "was read; read it again", op, key);
  default:
    if (status_retriable(st))
      return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE, "%s '%s': object store %s failed "
                     "%d times (%s); is it running?", op, key, s->host, attempts, detail);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s '%s': object store %s answered %s (%s)", op,
                   key, s->host, name, detail);
  }
}

/* ---- put, get, head, delete, copy, list via libs3 ------------------------------------------- */

static int put_data(int size, char *buf, void *data) {
  req_t *r = data;
  size_t n = r->len - r->off < (size_t)size ? r->len - r->off : (size_t)size;
  memcpy(buf, r->data + r->off, n);
  r->off += n;
  return (int)n;
}

static lt_err_t mp_put_buffer(s3_store_t *s, const char *key, const uint8_t *data, size_t len,
                              char *errstr, size_t errstr_size);

/* Sends one libs3 request until try_again says stop. Every attempt starts from the request as
 * the caller filled *r (so a retried put sends from byte 0); *r ends as the last attempt left
 * it. Returns the number of attempts, which s3_err reports. */
static int send_retried(const s3_store_t *s, const char *key, req_t *r,
                        void (*send)(const s3_store_t *s, const char *key, req_t *r)) {
  const req_t init = *r;
  for (int a = 1;; a++) {
    *r = init;
    send(s, key, r);
    if (!try_again(s, r, a)) return a;
  }
}

static void send_put(const s3_store_t *s, const char *key, req_t *r) {
  S3PutObjectHandler h = {resp_handler, put_data};
  S3_put_object(&s->bc, key, r->len, NULL, NULL, &h, r);
}

static lt_err_t single_put(s3_store_t *s, const char *key, const uint8_t *data, size_t len,
                           char *errstr, size_t errstr_size) {
  req_t r = {.data = data, .len = len};
  int a = send_retried(s, key, &r, send_put);
  return s3_err(s, &r, "put", key, a, errstr, errstr_size);
}

static lt_err_t s3_put(lt_store_t *st, const char *key, const void *data, size_t len,
                       char *errstr, size_t errstr_size) {
  s3_store_t *s = st->impl;
  if (len > s->part_size) return mp_put_buffer(s, key, data, len, errstr, errstr_size);
  return single_put(s, key, data, len, errstr, errstr_size);
}

static S3Status get_data(int size, const char *buf, void *data) {
  req_t *r = data;
  lt_err_t e = r->sink(r->ctx, buf, (size_t)size);
  if (e) {
    r->sink_err = e;
    return S3StatusAbortedByCallback;
  }
  r->delivered += (uint64_t)size;
  return S3StatusOK;
}

static lt_err_t s3_get(lt_store_t *st, const char *key, lt_store_sink_fn sink, void *ctx,
                       char *errstr, size_t errstr_size) {
  s3_store_t *s = st->impl;
  S3GetObjectHandler h = {resp_handler, get_data};
  req_t r = {.sink = sink, .ctx = ctx};
  char pinned[LT_STORE_ETAG_MAX] = "";
  int a;
  for (a = 1;; a++) {
    S3GetConditions cond = {-1, -1, pinned[0] ? pinned : NULL, NULL};
    r.have_props = false;
    S3_get_object(&s->bc, key, pinned[0] ? &cond : NULL, r.delivered, 0, NULL, &h, &r);
    if (r.sink_err)
      return r.sink_err;
    if (r.have_props && !pinned[0]) snprintf(pinned, sizeof pinned, "%s", r.etag);
    if (!try_again(s, &r, a)) break;
  }
  return s3_err(s, &r, "get", key, a, errstr, errstr_size);
}

static void send_head(const s3_store_t *s, const char *key, req_t *r) {
  S3_head_object(&s->bc, key, NULL, &resp_handler, r);
}

static lt_err_t s3_head(lt_store_t *st, const char *key, lt_store_info_t *info, char *errstr,
                        size_t errstr_size) {
  s3_store_t *s = st->impl;
  req_t r = {0};
  int a = send_retried(s, key, &r, send_head);
  lt_err_t e = s3_err(s, &r, "head", key, a, errstr, errstr_size);
  if (e) return e;
  info->size = r.length;
  info->mtime = r.mtime;
  snprintf(info->etag, sizeof info->etag, "%s", r.etag);
  return LT_OK;
}

static void send_delete(const s3_store_t *s, const char *key, req_t *r) {
  S3_delete_object(&s->bc, key, NULL, &resp_handler, r);
}

static lt_err_t s3_del(lt_store_t *st, const char *key, char *errstr, size_t errstr_size) {
  s3_store_t *s = st->impl;
  req_t r = {0};
  int a = send_retried(s, key, &r, send_delete);
  if (r.status == S3StatusErrorNoSuchKey || r.status == S3StatusHttpErrorNotFound) return LT_OK;
  return s3_err(s, &r, "delete", key, a, errstr, errstr_size);
}

static void send_copy(const s3_store_t *s, const char *src, req_t *r) {
  int64_t mtime = 0;
  char etag[LT_STORE_ETAG_MAX];
  S3_copy_object(&s->bc, src, s->bucket, r->dst, NULL, &mtime, (int)sizeof etag, etag, NULL,
                 &resp_handler, r);
}

static lt_err_t s3_copy(lt_store_t *st, const char *src, const char *dst, char *errstr,
                        size_t errstr_size) {
  s3_store_t *s = st->impl;
  req_t r = {.dst = dst};
  int a = send_retried(s, src, &r, send_copy);
  if (r.status == S3StatusErrorNoSuchKey || r.status == S3StatusHttpErrorNotFound)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "copy: no such object '%s'", src);
  return s3_err(s, &r, "copy to", dst, a, errstr, errstr_size);
}

static S3Status list_data(int truncated, const char *next_marker, int n,
                          const S3ListBucketContent *c, int np, const char **prefixes,
                          void *data) {
  (void)next_marker; /* NULL without a delimiter: the next marker is the last key */
  (void)np;
  (void)prefixes;
  req_t *r = data;
  r->truncated = truncated != 0;
  for (int i = 0; i < n; i++) {
    /* A retried page re-sends keys already delivered: skip them. */
    if (r->last[0] && strcmp(c[i].key, r->last) <= 0) continue;
    lt_store_info_t info = {0};
    info.size = c[i].size;
    info.mtime = c[i].lastModified;
    snprintf(info.etag, sizeof info.etag, "%s", c[i].eTag ? c[i].eTag : "");
    lt_err_t e = r->fn(r->ctx, c[i].key, &info);
    if (e) {
      r->sink_err = e;
      return S3StatusAbortedByCallback;
    }
    snprintf(r->last, sizeof r->last, "%s", c[i].key);
    r->listed++;
  }
  return S3StatusOK;
}

static lt_err_t s3_list(lt_store_t *st, const char *prefix, const char *start_after,
                        size_t max_keys, lt_store_list_fn fn, void *ctx, char *next,
                        size_t next_size, char *errstr, size_t errstr_size) {
  s3_store_t *s = st->impl;
  S3ListBucketHandler h = {resp_handler, list_data};
  req_t r = {.fn = fn, .ctx = ctx};
  int a;
  for (a = 1;; a++) {
    const char *marker = r.last[0] ? r.last : start_after;
    S3_list_bucket(&s->bc, prefix[0] ? prefix : NULL, marker[0] ? marker : NULL, NULL,
                   (int)(max_keys - r.listed), NULL, &h, &r);
    if (r.sink_err) return r.sink_err;
    if (!try_again(s, &r, a)) break;
  }
  lt_err_t e = s3_err(s, &r, "list", prefix, a, errstr, errstr_size);
  if (e) return e;
  if (r.truncated && r.last[0]) snprintf(next, next_size, "%s", r.last);
  return LT_OK;
}

/* ---- multipart upload over libcurl ---------------------------------------------------------- */

typedef struct mp {
  s3_store_t *s;
  CURL *curl;
  char key[LT_STORE_KEY_MAX + 1];
  char enc_key[3 * LT_STORE_KEY_MAX + 1]; /* URL-encoded */
  char upload_id[512];
  char (*etags)[96];
  size_t nparts, cap;
  uint64_t total;
} mp_t;

/* Response of one curl request. */
typedef struct http_resp {
  long status;
  char body[RESP_CAP];
  size_t body_len;
  char etag[96];
  /* request body for uploads */
  const uint8_t *data;
  size_t len, off;
} http_resp_t;

static size_t on_body(char *p, size_t sz, size_t n, void *data) {
  http_resp_t *r = data;
  size_t len = sz * n, room = sizeof r->body - 1 - r->body_len;
  size_t take = len < room ? len : room;
  memcpy(r->body + r->body_len, p, take);
  r->body_len += take;
  r->body[r->body_len] = 0;
  return len;
}

static size_t on_header(char *p, size_t sz, size_t n, void *data) {
  http_resp_t *r = data;
  size_t len = sz * n;
  if (len > 5 && strncasecmp(p, "ETag:", 5) == 0) {
    size_t a = 5, b = len;
    while (a < b && isspace((unsigned char)p[a])) a++;
    while (b > a && isspace((unsigned char)p[b - 1])) b--;
    snprintf(r->etag, sizeof r->etag, "%.*s", (int)(b - a), p + a);
  }
  return len;
}

static size_t on_read(char *p, size_t sz, size_t n, void *data) {
  http_resp_t *r = data;
  size_t want = sz * n, left = r->len - r->off;
  size_t take = want < left ? want : left;
  memcpy(p, r->data + r->off, take);
  r->off += take;
  return take;
}

static void url_encode(const char *in, char *out, size_t cap, bool keep_slash) {
  static const char hx[] = "0123456789ABCDEF";
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)in; *p && o + 4 < cap; p++) {
    if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~' ||
        (keep_slash && *p == '/')) {
      out[o++] = (char)*p;
    } else {
      out[o++] = '%';
      out[o++] = hx[*p >> 4];
      out[o++] = hx[*p & 15];
    }
  }
  out[o] = 0;
}

/* One signed request (no retry). method: POST, PUT, DELETE; subres: the query string, which in
 * V2 is also part of the signed resource. Returns LT_OK when an HTTP answer came back (any status
 * in r->status), LT_ERR_UNAVAILABLE when none did. */
static lt_err_t http_once(mp_t *m, const char *method, const char *subres, const char *ctype,
                          const uint8_t *body, size_t body_len, http_resp_t *r, char *errstr,
                          size_t errstr_size) {
  s3_store_t *s = m->s;
  char date[64], sts[6144], url[6144], auth[512], hdate[96], hctype[160];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  snprintf(sts, sizeof sts, "%s\n\n%s\n%s\n/%s/%s?%s", method, ctype, date, s->bucket, m->enc_key,
           subres);
  uint8_t mac[EVP_MAX_MD_SIZE];
  size_t mac_len = 0;
  if (!EVP_Q_mac(NULL, "HMAC", NULL, "SHA1", NULL, s->secret, strlen(s->secret),
                 (const unsigned char *)sts, strlen(sts), mac, sizeof mac, &mac_len))
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "HMAC-SHA1 failed in OpenSSL");
  char sig[64];
  EVP_EncodeBlock((unsigned char *)sig, mac, (int)mac_len);
  snprintf(auth, sizeof auth, "Authorization: AWS %s:%s", s->access, sig);
  snprintf(hdate, sizeof hdate, "Date: %s", date);
  snprintf(hctype, sizeof hctype, "Content-Type: %s", ctype);
  snprintf(url, sizeof url, "http://%s/%s/%s?%s", s->host, s->bucket, m->enc_key, subres);

  CURL *c = m->curl;
  curl_easy_reset(c);
  struct curl_slist *hdrs = NULL;
  hdrs = curl_slist_append(hdrs, hdate);
  hdrs = curl_slist_append(hdrs, auth);
  hdrs = curl_slist_append(hdrs, hctype);
  hdrs = curl_slist_append(hdrs, "Expect:");
  memset(r, 0, offsetof(http_resp_t, data));
  r->body[0] = 0;
  r->data = body;
  r->len = body_len;
  r->off = 0;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 30L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
  if (strcmp(method, "PUT") == 0) {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(c, CURLOPT_READDATA, r);
    curl_easy_setopt(c, CURLOPT_UPLOAD_BUFFERSIZE, 512L * 1024); /* fewer read callbacks per part */
  } else if (strcmp(method, "POST") == 0) {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? (const char *)body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  } else {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }
  CURLcode cc = curl_easy_perform(c);
  curl_slist_free_all(hdrs);
  if (cc != CURLE_OK)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE, "%s", curl_easy_strerror(cc));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
  return LT_OK;
}

/* Extracts <tag>value</tag> from an XML answer. */
static bool xml_value(const char *xml, const char *tag, char *out, size_t cap) {
  char open[64], close_[64];
  snprintf(open, sizeof open, "<%s>", tag);
  snprintf(close_, sizeof close_, "</%s>", tag);
  const char *a = strstr(xml, open);
  if (!a) return false;
  a += strlen(open);
  const char *b = strstr(a, close_);
  if (!b || (size_t)(b - a) >= cap) return false;
  memcpy(out, a, (size_t)(b - a));
  out[b - a] = 0;
  return true;
}

/* A signed request with retries; 2xx without an <Error> body is success. */
static lt_err_t http_retry(mp_t *m, const char *op, const char *method, const char *subres,
                           const char *ctype, const uint8_t *body, size_t body_len,
                           http_resp_t *r, char *errstr, size_t errstr_size) {
  s3_store_t *s = m->s;
  char why[256] = "";
  int a;
  for (a = 1;; a++) {
    lt_err_t e = http_once(m, method, subres, ctype, body, body_len, r, why, sizeof why);
    if (e && e != LT_ERR_UNAVAILABLE) return lt_errf(errstr, errstr_size, e, "%s", why);
    bool error_body = !e && strstr(r->body, "<Error>") != NULL;
    if (!e && r->status / 100 == 2 && !error_body) return LT_OK;
    char code[64] = "";
    if (!e) {
      xml_value(r->body, "Code", code, sizeof code);
      snprintf(why, sizeof why, "HTTP %ld %s", r->status, code);
    }
    bool retriable = e || r->status >= 500 || strcmp(code, "SlowDown") == 0 ||
                     strcmp(code, "InternalError") == 0 || strcmp(code, "RequestTimeout") == 0;
    if (!retriable) {
      lt_err_t k = r->status == 403 ? LT_ERR_AUTH : r->status == 404 ? LT_ERR_NOT_FOUND : LT_ERR_IO;
      return lt_errf(errstr, errstr_size, k, "%s '%s': object store %s answered %s", op, m->key,
                     s->host, why);
    }
    if (a >= s->max_attempts) break;
    backoff(s, a - 1);
  }
  return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE, "%s '%s': object store %s failed %d "
                 "times (%s); is it running?", op, m->key, s->host, a, why);
}

static void mp_free(mp_t *m) {
  if (!m) return;
  if (m->curl) curl_easy_cleanup(m->curl);
  free(m->etags);
  free(m);
}

static lt_err_t mp_begin(s3_store_t *s, const char *key, mp_t **out, char *errstr,
                         size_t errstr_size) {
  mp_t *m = calloc(1, sizeof *m);
  if (!m || !(m->curl = curl_easy_init())) {
    free(m);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "multipart '%s': no memory", key);
  }
  m->s = s;
  snprintf(m->key, sizeof m->key, "%s", key);
  url_encode(key, m->enc_key, sizeof m->enc_key, true);
  http_resp_t *r = malloc(sizeof *r);
  if (!r) {
    mp_free(m);
    return LT_ERR_NOMEM;
  }
  lt_err_t e = http_retry(m, "multipart initiate", "POST", "uploads", "application/octet-stream",
                          NULL, 0, r, errstr, errstr_size);
  char id[sizeof m->upload_id];
  if (!e && !xml_value(r->body, "UploadId", id, sizeof id))
    e = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "multipart initiate '%s': no UploadId in the "
                "answer of %s", key, s->host);
  free(r);
  if (e) {
    mp_free(m);
    return e;
  }
  snprintf(m->upload_id, sizeof m->upload_id, "%s", id);
  *out = m;
  return LT_OK;
}

static lt_err_t mp_part(mp_t *m, const uint8_t *data, size_t len, char *errstr,
                        size_t errstr_size) {
  if (m->nparts == 10000)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "multipart '%s': more than 10000 parts; "
                   "raise the part size", m->key);
  if (m->nparts == m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 16;
    void *p = realloc(m->etags, cap * sizeof *m->etags);
    if (!p) return LT_ERR_NOMEM;
    m->etags = p;
    m->cap = cap;
  }
  char subres[2048], enc_id[3 * sizeof m->upload_id];
  url_encode(m->upload_id, enc_id, sizeof enc_id, false);
  snprintf(subres, sizeof subres, "partNumber=%zu&uploadId=%s", m->nparts + 1, enc_id);
  http_resp_t *r = malloc(sizeof *r);
  if (!r) return LT_ERR_NOMEM;
  lt_err_t e = http_retry(m, "multipart part", "PUT", subres, "", data, len, r, errstr,
                          errstr_size);
  if (!e && !r->etag[0])
    e = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "multipart part %zu of '%s': no ETag in the "
                "answer", m->nparts + 1, m->key);
  if (!e) {
    snprintf(m->etags[m->nparts++], sizeof m->etags[0], "%s", r->etag);
    m->total += len;
  }
  free(r);
  return e;
}

/* Aborts the upload (best effort: parts left behind by a failed abort are the store's to expire)
 * and frees m. */
static void mp_abort(mp_t *m) {
  if (!m) return;
  char subres[2048], enc_id[3 * sizeof m->upload_id];
  url_encode(m->upload_id, enc_id, sizeof enc_id, false);
  snprintf(subres, sizeof subres, "uploadId=%s", enc_id);
  http_resp_t *r = malloc(sizeof *r);
  if (r) http_retry(m, "multipart abort", "DELETE", subres, "", NULL, 0, r, NULL, 0);
  free(r);
  mp_free(m);
}

/* Completes the upload and frees m (aborting it on failure). */
static lt_err_t mp_complete(mp_t *m, char *errstr, size_t errstr_size) {
  size_t cap = 64 + m->nparts * 160;
  char *xml = malloc(cap);
  http_resp_t *r = malloc(sizeof *r);
  if (!xml || !r) {
    free(xml);
    free(r);
    mp_abort(m);
    return LT_ERR_NOMEM;
  }
  size_t o = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < m->nparts; i++)
    o += (size_t)snprintf(xml + o, cap - o, "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag>"
                          "</Part>", i + 1, m->etags[i]);
  o += (size_t)snprintf(xml + o, cap - o, "</CompleteMultipartUpload>");
  char subres[2048], enc_id[3 * sizeof m->upload_id];
  url_encode(m->upload_id, enc_id, sizeof enc_id, false);
  snprintf(subres, sizeof subres, "uploadId=%s", enc_id);
  lt_err_t e = http_retry(m, "multipart complete", "POST", subres, "application/xml",
                          (const uint8_t *)xml, o, r, errstr, errstr_size);
  if (e == LT_ERR_NOT_FOUND) {
    /* A complete whose answer was lost and was retried finds the upload gone: it succeeded if
     * the object is there whole. */
    lt_store_t tmp = {.impl = m->s};
    lt_store_info_t info;
    if (s3_head(&tmp, m->key, &info, NULL, 0) == LT_OK && info.size == m->total) e = LT_OK;
  }
  free(xml);
  free(r);
  if (e) {
    mp_abort(m);
    return e;
  }
  mp_free(m);
  return LT_OK;
}

static lt_err_t mp_put_buffer(s3_store_t *s, const char *key, const uint8_t *data, size_t len,
                              char *errstr, size_t errstr_size) {
  mp_t *m;
  lt_err_t e = mp_begin(s, key, &m, errstr, errstr_size);
  if (e) return e;
  for (size_t off = 0; off < len && !e; off += s->part_size)
    e = mp_part(m, data + off, len - off < s->part_size ? len - off : s->part_size, errstr,
                errstr_size);
  if (e) {
    mp_abort(m);
    return e;
  }
  return mp_complete(m, errstr, errstr_size);
}

/* ---- streamed writer: one part buffered at a time ------------------------------------------- */

typedef struct s3_writer {
  s3_store_t *s;
  char key[LT_STORE_KEY_MAX + 1];
  uint8_t *buf;
  size_t len, cap;
  mp_t *mp; /* NULL until the object outgrows one part */
} s3_writer_t;

static lt_err_t s3_w_open(lt_store_t *st, const char *key, void **out, char *errstr,
                          size_t errstr_size) {
  s3_writer_t *w = calloc(1, sizeof *w);
  if (!w) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "writer '%s': no memory", key);
  w->s = st->impl;
  snprintf(w->key, sizeof w->key, "%s", key);
  *out = w;
  return LT_OK;
}

static void s3_w_abort(void *wv) {
  s3_writer_t *w = wv;
  if (!w) return;
  mp_abort(w->mp);
  free(w->buf);
  free(w);
}

static lt_err_t s3_w_write(void *wv, const void *data, size_t len, char *errstr,
                           size_t errstr_size) {
  s3_writer_t *w = wv;
  const uint8_t *p = data;
  size_t part = w->s->part_size;
  while (len) {
    if (w->len == part) { /* full and more follows: it is a part */
      lt_err_t e = LT_OK;
      if (!w->mp) e = mp_begin(w->s, w->key, &w->mp, errstr, errstr_size);
      if (!e) e = mp_part(w->mp, w->buf, w->len, errstr, errstr_size);
      if (e) return e;
      w->len = 0;
    }
    size_t take = part - w->len < len ? part - w->len : len;
    if (w->len + take > w->cap) { /* grow lazily: small objects stay small */
      size_t cap = w->cap ? w->cap : 256 * 1024;
      while (cap < w->len + take) cap *= 2;
      if (cap > part) cap = part;
      uint8_t *nb = realloc(w->buf, cap);
      if (!nb) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "writer '%s': no memory", w->key);
      w->buf = nb;
      w->cap = cap;
    }
    memcpy(w->buf + w->len, p, take);
    w->len += take;
    p += take;
    len -= take;
  }
  return LT_OK;
}

/* Sends the buffer as a part when S3 takes it as one (any part but the last must be at least
 * MIN_PART), then sizes the buffer to what is left in it. */
static lt_err_t s3_w_flush(void *wv, char *errstr, size_t errstr_size) {
  s3_writer_t *w = wv;
  if (w->len >= MIN_PART) {
    lt_err_t e = LT_OK;
    if (!w->mp) e = mp_begin(w->s, w->key, &w->mp, errstr, errstr_size);
    if (!e) e = mp_part(w->mp, w->buf, w->len, errstr, errstr_size);
    if (e) return e;
    w->len = 0;
  }
  if (w->cap > w->len) {
    uint8_t *nb = w->len ? realloc(w->buf, w->len) : NULL;
    if (w->len && !nb) return LT_OK; /* keeps the larger buffer */
    if (!w->len) free(w->buf);
    w->buf = nb;
    w->cap = w->len;
  }
  return LT_OK;
}

static lt_err_t s3_w_commit(void *wv, char *errstr, size_t errstr_size) {
  s3_writer_t *w = wv;
  lt_err_t e;
  if (!w->mp) {
    e = single_put(w->s, w->key, w->buf ? w->buf : (const uint8_t *)"", w->len, errstr,
                   errstr_size);
  } else {
    e = w->len ? mp_part(w->mp, w->buf, w->len, errstr, errstr_size) : LT_OK;
    if (!e) e = mp_complete(w->mp, errstr, errstr_size); /* frees mp */
    else mp_abort(w->mp);
    w->mp = NULL;
  }
  free(w->buf);
  free(w);
  return e;
}

static void s3_destroy(lt_store_t *st) {
  s3_store_t *s = st->impl;
  OPENSSL_cleanse(s->secret, sizeof s->secret);
  free(s);
}

static const lt_store_ops_t s3_ops = {
    .kind = "s3",
    .put = s3_put,
    .get = s3_get,
    .head = s3_head,
    .del = s3_del,
    .copy = s3_copy,
    .list = s3_list,
    .w_open = s3_w_open,
    .w_write = s3_w_write,
    .w_commit = s3_w_commit,
    .w_abort = s3_w_abort,
    .w_flush = s3_w_flush,
    .destroy = s3_destroy,
};

/* ---- construction --------------------------------------------------------------------------- */

lt_err_t lt_store_s3_conf_from_env(lt_store_s3_conf_t *conf, char *errstr, size_t errstr_size) {
  static const char *names[] = {"LATHE_S3_ENDPOINT", "LATHE_S3_BUCKET", "LATHE_S3_ACCESS_KEY",
                                "LATHE_S3_SECRET_KEY"};
  const char *v[4];
  memset(conf, 0, sizeof *conf);
  for (int i = 0; i < 4; i++) {
    v[i] = getenv(names[i]);
    if (!v[i] || !*v[i])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s is not set (eval \"$(ops/stack "
                     "env)\" sets it for the local stack)", names[i]);
  }
  conf->endpoint = v[0];
  if (strncmp(v[0], "http://", 7) == 0) conf->endpoint = v[0] + 7;
  else if (strncmp(v[0], "https://", 8) == 0) {
    conf->endpoint = v[0] + 8;
    conf->https = true;
  }
  conf->bucket = v[1];
  conf->access_key = v[2];
  conf->secret_key = v[3];
  return LT_OK;
}

lt_err_t lt_store_s3_new(lt_store_t **out, const lt_store_s3_conf_t *conf, char *errstr,
                         size_t errstr_size) {
  const char *fields[] = {"endpoint", "bucket", "access_key", "secret_key"};
  const char *vals[] = {conf->endpoint, conf->bucket, conf->access_key, conf->secret_key};
  for (int i = 0; i < 4; i++) {
    if (!vals[i] || !*vals[i])
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "S3 store: %s is empty", fields[i]);
    if (strlen(vals[i]) >= 256)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "S3 store: %s is longer than 255 bytes",
                     fields[i]);
  }
  if (conf->https)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "S3 store: https is not supported yet "
                   "(the multipart path speaks plain HTTP); use an http endpoint");
  if (strchr(conf->endpoint, '/'))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "S3 store: endpoint '%s' must be host:port "
                   "without a path", conf->endpoint);
  if (conf->part_size && conf->part_size < MIN_PART)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "S3 store: part_size %zu is below S3's "
                   "minimum of %u bytes", conf->part_size, MIN_PART);
  if (S3_validate_bucket_name(conf->bucket, S3UriStylePath) != S3StatusOK)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "S3 store: bucket name '%s' is not valid",
                   conf->bucket);
  pthread_once(&s3_once, s3_init);
  if (s3_init_status != S3StatusOK)
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "libs3 initialisation failed: %s",
                   S3_get_status_name(s3_init_status));
  s3_store_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  snprintf(s->host, sizeof s->host, "%s", conf->endpoint);
  snprintf(s->bucket, sizeof s->bucket, "%s", conf->bucket);
  snprintf(s->access, sizeof s->access, "%s", conf->access_key);
  snprintf(s->secret, sizeof s->secret, "%s", conf->secret_key);
  s->max_attempts = conf->max_attempts > 0 ? conf->max_attempts : 5;
  s->backoff_ms = conf->backoff_ms > 0 ? conf->backoff_ms : 100;
  s->part_size = conf->part_size ? conf->part_size : DEFAULT_PART;
  s->bc.hostName = s->host;
  s->bc.bucketName = s->bucket;
  s->bc.protocol = S3ProtocolHTTP;
  s->bc.uriStyle = S3UriStylePath;
  s->bc.accessKeyId = s->access;
  s->bc.secretAccessKey = s->secret;
  lt_err_t e = lt_store__new(out, &s3_ops, s);
  if (e) free(s);
  return e;
}
