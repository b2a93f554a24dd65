/* lt_api_datasets: /v1/uploads and /v1/datasets — streamed, validated, encrypted uploads.
 *
 * libevent 2.1's server hands a handler the whole request body, so a large file comes in parts:
 * POST /v1/uploads opens an upload, PUT /v1/uploads/{id}/parts/{n} (n = 1, 2, ... in order,
 * each at most 8 MiB) streams each part through the validator and the encryptor into a multipart
 * object, POST /v1/uploads/{id}/complete finishes it. At no time is more than one part in
 * memory. A file that fails validation, goes over quota, or is abandoned (10 minutes idle)
 * leaves nothing in the store. POST /v1/datasets with the file as body does all three at once
 * for files up to one part.
 *
 * Layout: tenants/<tenant>/datasets/<id>/{data.jsonl.lte, key.wrapped, meta.json.lte}. Each
 * dataset has its own data key, wrapped by the master key and bound to the tenant; DELETE
 * removes the wrapped key first (crypto-shred), then the objects. meta is written last: a
 * dataset exists when its meta does. */
#include "lt_api_int.h"
#include "lt_time.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <malloc.h>
#include <sys/queue.h>
#include <openssl/crypto.h>

struct lt_api_upload {
  char id[LT_ID_MAX + 1];
  char tenant[LT_ID_MAX + 1];
  char name[128];
  lt_dataset_check_t *check;
  lt_crypto_dek_t *dek;
  lt_sealed_writer_t *w;
  int next_part;
  uint64_t bytes;         /* plaintext fed so far */
  uint64_t claimed;       /* on the loop: bytes of its parts sent to the pool, the one there included */
  bool completing;        /* its completion is on the pool: its bytes may be in the store's listing */
  int64_t last_active_ms; /* monotonic */
  bool busy;              /* a part or the completion is on a pool thread: hands off */
  bool dropped;           /* aborted while busy: freed when that work comes back */
  lt_api_upload_t *next;
};

/* The API's memory of datasets known to exist: "tenant/id". */
static void seen_key(char *out, size_t n, const char *tenant, const char *id) { snprintf(out, n, "%s/%s", tenant, id); }

/* ---------------------------------------------------------------- uploads */

/* Hands freed pages back to the system. A part's bytes arrive as thousands of small evbuffer
 * chains and go through the pool threads' own malloc arenas; glibc keeps what such frees leave
 * inside its heaps until asked, so without this the API's RSS stays at its highest (measured:
 * +36 MiB after 8 uploads of 6 MiB had ended; tests/test_api_data.c checks it). */
static void give_back_memory(void) { malloc_trim(0); }

/* Frees an upload that no list holds. Its writer's abort is a store call (an S3 multipart
 * upload's, with retries) wherever something was stored: upload_drop runs it on the pool. */
static void upload_destroy(lt_api_upload_t *u) {
  if (!u) return;
  lt_sealed_writer_abort(u->w); /* no-op once committed or aborted (w is NULL then) */
  lt_dataset_check_destroy(u->check);
  lt_crypto_dek_destroy(u->dek);
  free(u);
  give_back_memory();
}

static void upload_unlink(lt_api_t *api, lt_api_upload_t *u) {
  for (lt_api_upload_t **pp = &api->uploads; *pp; pp = &(*pp)->next)
    if (*pp == u) {
      *pp = u->next;
      return;
    }
}

static lt_api_upload_t *upload_find(lt_api_t *api, const lt_tenant_t *t, const char *id) {
  for (lt_api_upload_t *u = api->uploads; u; u = u->next)
    if (!u->dropped && strcmp(u->id, id) == 0 && strcmp(u->tenant, t->tenant_id) == 0) return u;
  return NULL;
}

static void abort_work(void *arg) {
  lt_api_upload_t *u = arg;
  lt_sealed_writer_abort(u->w);
  u->w = NULL;
}

static void abort_after(lt_api_t *api, void *arg) {
  (void)api;
  upload_destroy(arg);
}

/* Drops an upload and whatever of it was stored: now, or when its pool work comes back. One
 * whose part still runs is found by no request but still counts against the tenant's open
 * uploads until the part ends (else a tenant could keep opening, feeding and aborting uploads,
 * each part, up to 8 MiB, still queued on the pool); an idle one goes at once, and the store's
 * abort of what it stored (an S3 multipart upload: a store call, with retries) runs on the pool. */
static void upload_drop(lt_api_t *api, lt_api_upload_t *u) {
  u->dropped = true;
  if (u->busy) return; /* upload_after comes back to it */
  upload_unlink(api, u);
  if (u->w) lt_api_work(api, u->tenant, abort_work, abort_after, u);
  else upload_destroy(u);
}

void lt_api_uploads_tick(lt_api_t *api) {
  int64_t now = lt_time_mono_ms();
  for (lt_api_upload_t *u = api->uploads, *next; u; u = next) {
    next = u->next;
    if (!u->busy && !u->dropped && now - u->last_active_ms > api->conf.upload_idle_ms) upload_drop(api, u);
  }
}

/* At the stop, once the pool answered what it held (lt_api_work_stop): none is busy, and each
 * store abort runs here. */
void lt_api_uploads_free(lt_api_t *api) {
  while (api->uploads) {
    lt_api_upload_t *u = api->uploads;
    api->uploads = u->next;
    upload_destroy(u);
  }
}

static int open_uploads(lt_api_t *api, const char *tenant) {
  int n = 0;
  for (lt_api_upload_t *u = api->uploads; u; u = u->next) n += strcmp(u->tenant, tenant) == 0;
  return n;
}

/* Opens an upload from the query's name and max_tokens; *field names the parameter a refusal is
 * about (NULL when none). */
static lt_err_t upload_open(lt_api_t *api, const lt_tenant_t *t, struct evkeyvalq *q, lt_api_upload_t **out,
                            const char **field, char *msg, size_t n) {
  *field = NULL;
  const char *name = lt_api_query(q, "name");
  if (name && (strlen(name) > 100 || !lt_utf8_valid(name, strlen(name), NULL))) {
    *field = "name";
    return lt_errf(msg, n, LT_ERR_INVALID, "name must be at most 100 bytes of UTF-8");
  }
  /* Each open upload may hold up to a part's bytes between its parts: the cap bounds a tenant's
   * share of the API's memory. */
  int open = open_uploads(api, t->tenant_id);
  if (open >= api->conf.max_open_uploads)
    return lt_errf(msg, n, LT_ERR_QUOTA,
                   "tenant %s has %d open uploads; the limit max_open_uploads is %d: complete or abort one "
                   "(DELETE /v1/uploads/{id}), or wait until an idle one expires after %lld s",
                   t->tenant_id, open, api->conf.max_open_uploads, (long long)(api->conf.upload_idle_ms / 1000));
  lt_dataset_limits_t lim = {.max_bytes = (uint64_t)t->quotas.max_dataset_bytes, .max_tokens = 1024};
  if (!lim.max_bytes || lim.max_bytes > api->conf.max_upload_bytes) lim.max_bytes = api->conf.max_upload_bytes;
  const char *mt = lt_api_query(q, "max_tokens");
  if (mt) {
    char *end;
    long v = strtol(mt, &end, 10);
    if (*end || v < 8 || v > 32768) {
      *field = "max_tokens";
      return lt_errf(msg, n, LT_ERR_INVALID, "max_tokens must be from 8 to 32768");
    }
    lim.max_tokens = (int32_t)v;
  }
  lt_api_upload_t *u = calloc(1, sizeof *u);
  if (!u) return LT_ERR_NOMEM;
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(u->id, sizeof u->id, "ds-%.24s", rnd);
  snprintf(u->tenant, sizeof u->tenant, "%s", t->tenant_id);
  snprintf(u->name, sizeof u->name, "%s", name ? name : u->id);
  u->next_part = 1;
  u->last_active_ms = lt_time_mono_ms();
  char key[512];
  lt_dataset_object_key(key, sizeof key, u->tenant, u->id, LT_DATASET_DATA);
  lt_err_t err = lt_dataset_check_new(&u->check, &lim, api->conf.tokens_fn, api->conf.tokens_ctx);
  if (!err) err = lt_crypto_dek_generate(&u->dek, u->tenant, u->id, msg, n);
  if (!err) err = lt_sealed_writer_new(api->conf.store, u->dek, key, &u->w, msg, n);
  if (err) {
    upload_destroy(u);
    return err;
  }
  u->next = api->uploads;
  api->uploads = u;
  *out = u;
  return LT_OK;
}

/* A part, a completion, or both (POST /v1/datasets), on its way through the pool. */
typedef struct upload_task {
  lt_api_t *api;
  struct evhttp_request *req;
  lt_api_upload_t *u;
  struct evbuffer *body; /* the part, moved out of the request; NULL: no part */
  bool complete;
  lt_err_t err;          /* of the part, or of storing the dataset */
  char msg[512];
  lt_err_t refused;      /* the validator's verdict at completion (LT_ERR_INVALID, _QUOTA) */
  lt_dataset_report_t r;
  json_t *report, *meta;
  uint64_t quota;        /* the tenant's storage quota (lt_api_storage_quota; 0: none), from the loop */
  uint64_t artifacts;    /* the tenant's artifact bytes (storage quota), from the loop */
  uint64_t others;       /* the parts of its other open uploads (not yet in the store's listing), from the loop */
  uint64_t datasets;     /* its datasets' stored bytes, measured on the pool thread */
  bool measured;
  uint64_t since;        /* the measure's mark */
  bool over_storage;     /* err is the storage quota's */
  bool openai;           /* answer with OpenAI's file object (POST /v1/files) */
} upload_task_t;

/* One piece of a part through the validator, then the encryptor into the store. */
static lt_err_t feed_piece(lt_api_upload_t *u, const void *p, size_t len, char *msg, size_t n) {
  lt_err_t err = lt_dataset_check_feed(u->check, p, len);
  if (err == LT_ERR_QUOTA) {
    lt_dataset_report_t r;
    lt_dataset_check_finish(u->check, &r);
    return lt_errf(msg, n, LT_ERR_QUOTA, "%s", r.errors_kept ? r.errors[r.errors_kept - 1].reason : "over quota");
  }
  return lt_sealed_writer_write(u->w, p, len, msg, n);
}

/* A part's buffer freed, its plaintext zeroed first (fed or not). */
static void body_free(struct evbuffer *b) {
  if (!b) return;
  struct evbuffer_ptr at;
  struct evbuffer_iovec v;
  evbuffer_ptr_set(b, &at, 0, EVBUFFER_PTR_SET);
  while (evbuffer_peek(b, -1, &at, &v, 1) > 0) {
    OPENSSL_cleanse(v.iov_base, v.iov_len);
    if (evbuffer_ptr_set(b, &at, v.iov_len, EVBUFFER_PTR_ADD) < 0) break;
  }
  evbuffer_free(b);
}

/* On a pool thread: the part, piece by piece as it came off the socket (no copy of the whole);
 * then its memory goes back and the writer keeps less than a store part until the next one. */
static lt_err_t feed_part(upload_task_t *t) {
  int nvec = evbuffer_peek(t->body, -1, NULL, NULL, 0);
  struct evbuffer_iovec *v = calloc(nvec > 0 ? (size_t)nvec : 1, sizeof *v);
  if (!v) return LT_ERR_NOMEM;
  evbuffer_peek(t->body, -1, NULL, v, nvec);
  lt_err_t err = LT_OK;
  for (int i = 0; i < nvec && !err; i++) err = feed_piece(t->u, v[i].iov_base, v[i].iov_len, t->msg, sizeof t->msg);
  free(v);
  t->u->bytes += evbuffer_get_length(t->body);
  body_free(t->body); /* the part's plaintext */
  t->body = NULL;
  if (!err && !t->complete) err = lt_sealed_writer_flush(t->u->w, t->msg, sizeof t->msg);
  give_back_memory();
  return err;
}

static lt_err_t store_dataset(lt_api_t *api, lt_api_upload_t *u, json_t *report, json_t **meta, char *msg, size_t n);

/* On a pool thread: the part, then (complete) the validator's verdict and, when valid, the
 * dataset stored. */
static void upload_work(void *ctx) {
  upload_task_t *t = ctx;
  bool quota = t->quota > 0;
  if (t->body && quota) { /* the storage quota, before a byte of this part is stored */
    t->err = lt_api_stored_bytes(t->api, t->u->tenant, &t->datasets, &t->since, NULL, t->msg, sizeof t->msg);
    t->measured = !t->err;
    if (!t->err)
      t->err = lt_api_storage_check(t->quota, t->u->tenant, t->datasets + t->others, t->artifacts,
                                    t->u->bytes + evbuffer_get_length(t->body), NULL, t->msg, sizeof t->msg);
    t->over_storage = t->err == LT_ERR_QUOTA;
  }
  if (t->body && !t->err) t->err = feed_part(t);
  if (t->err || !t->complete) return;
  t->refused = lt_dataset_check_finish(t->u->check, &t->r);
  t->report = lt_dataset_report_json(&t->r, 1);
  if (!t->refused) t->err = store_dataset(t->api, t->u, t->report, &t->meta, t->msg, sizeof t->msg);
  if (!t->refused && !t->err && quota)
    t->measured = !lt_api_stored_bytes(t->api, t->u->tenant, &t->datasets, &t->since, NULL, NULL, 0);
}

/* An invalid (400) or over-quota (429) dataset: the error names the first bad line, and the
 * report goes along. Takes report. */
static void reply_refused(struct evhttp_request *req, lt_err_t err, const lt_dataset_report_t *r, json_t *report) {
  char summary[320];
  if (r->errors_kept && r->errors[0].line)
    snprintf(summary, sizeof summary, "the dataset has %llu error(s); the first: line %llu%s%s: %s",
             (unsigned long long)r->error_count, (unsigned long long)r->errors[0].line,
             r->errors[0].field[0] ? ", field " : "", r->errors[0].field, r->errors[0].reason);
  else
    snprintf(summary, sizeof summary, "the dataset was refused: %s", r->errors_kept ? r->errors[0].reason : "invalid");
  int status = err == LT_ERR_QUOTA ? 429 : 400;
  json_t *e = lt_api_error_json(status, err == LT_ERR_QUOTA ? "over_quota" : "invalid_dataset", NULL, summary);
  lt_api_reply_json(req, status, json_pack("{s:o,s:o}", "error", e, "report", report));
}

/* On the loop: answers the part or the completion. A failed part (but one whose quota could not
 * be checked, which went nowhere), or any completion, ends the upload; a part of an upload aborted
 * meanwhile answers 404. */
static void upload_after(lt_api_t *api, void *ctx) {
  upload_task_t *t = ctx;
  lt_api_upload_t *u = t->u;
  u->busy = false;
  lt_api_stored_note(api, u->tenant, t->since, t->measured, t->datasets);
  if (u->dropped && !(t->complete && !t->err && !t->refused)) { /* a stored dataset still answers 201 */
    lt_api_reply_error(t->req, 404, "not_found", NULL, "upload %s was aborted while this part was processed", u->id);
    upload_drop(api, u);
  } else if (t->over_storage) {
    upload_drop(api, u);
    lt_api_reply_storage(t->req, t->msg);
  } else if (t->err == LT_ERR_QUOTA) { /* the checker's own limit: its words */
    upload_drop(api, u);
    lt_api_reply_err(t->req, t->err, NULL, t->msg);
  } else if (t->err && t->body && !t->complete) {
    /* The storage quota could not be measured: not a byte of the part went anywhere, so the
     * upload stays where it was and the same part may come again. */
    u->claimed -= evbuffer_get_length(t->body);
    u->last_active_ms = lt_time_mono_ms();
    lt_api_reply_store_fail(t->req, t->err,
                            "the storage quota could not be checked, so the part was not taken: send it again", t->msg);
  } else if (t->err) {
    upload_drop(api, u);
    lt_api_reply_store_fail(t->req, t->err, "the part could not be stored: the upload is dropped, start it again",
                            t->msg);
  } else if (!t->complete) {
    u->next_part++;
    u->last_active_ms = lt_time_mono_ms();
    lt_api_reply_json(t->req, 200, json_pack("{s:s,s:i}", "upload_id", u->id, "next_part", u->next_part));
  } else if (t->refused) {
    reply_refused(t->req, t->refused, &t->r, t->report);
    t->report = NULL;
    upload_drop(api, u);
  } else {
    char seen[160];
    seen_key(seen, sizeof seen, u->tenant, u->id);
    lt_map_set(api->datasets_seen, seen, NULL);
    if (t->openai) lt_api_reply_json(t->req, 200, lt_api_openai_file_json(t->meta));
    else lt_api_reply_json(t->req, 201, json_incref(t->meta));
    upload_drop(api, u);
  }
  json_decref(t->report);
  json_decref(t->meta);
  body_free(t->body); /* a part not fed: refused by the storage quota, or not measured */
  free(t);
}

/* Hands a part (body: the one given, taken, or else the request's, moved), a completion, or both
 * to the pool. */
static void upload_run(lt_api_call_t *c, lt_api_upload_t *u, bool part, bool complete, struct evbuffer *body) {
  upload_task_t *t = calloc(1, sizeof *t);
  if (t && body) t->body = body;
  else if (t && part && (t->body = evbuffer_new())) evbuffer_add_buffer(t->body, evhttp_request_get_input_buffer(c->req));
  else if (body) body_free(body);
  if (!t || (part && !t->body)) {
    free(t);
    upload_drop(c->api, u);
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  t->api = c->api;
  t->req = c->req;
  t->u = u;
  t->complete = complete;
  t->openai = c->openai;
  t->quota = lt_api_storage_quota(c->api, c->tenant);
  if (t->quota && part) {
    t->artifacts = lt_api_artifact_bytes(c->api, u->tenant);
    /* The tenant's other uploads: their parts are in no listing until they complete. */
    for (const lt_api_upload_t *o = c->api->uploads; o; o = o->next)
      if (o != u && !o->dropped && !o->completing && strcmp(o->tenant, u->tenant) == 0) t->others += o->claimed;
  }
  if (part) u->claimed += evbuffer_get_length(t->body);
  u->completing = complete;
  u->busy = true;
  lt_api_work(c->api, u->tenant, upload_work, upload_after, t);
}

/* Stores a valid dataset: commits the data, then its wrapped key, then its meta (last: a dataset
 * exists when its meta does). On failure removes whatever of it made it. *meta is the caller's. */
static lt_err_t store_dataset(lt_api_t *api, lt_api_upload_t *u, json_t *report, json_t **meta, char *msg, size_t n) {
  uint8_t sha[32];
  uint64_t plain = 0;
  lt_sealed_writer_t *w = u->w;
  u->w = NULL;
  lt_err_t err = lt_sealed_writer_commit(w, sha, &plain, NULL, msg, n);
  char key[512], hex[65];
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wlen = 0;
  if (!err) err = lt_crypto_dek_wrap(api->conf.kek, u->dek, wrapped, sizeof wrapped, &wlen, msg, n);
  if (!err) {
    lt_dataset_object_key(key, sizeof key, u->tenant, u->id, LT_DATASET_KEY);
    err = lt_store_put(api->conf.store, key, wrapped, wlen, NULL, msg, n);
  }
  if (!err) {
    *meta = json_pack("{s:s,s:s,s:I,s:s,s:I,s:O}", "id", u->id, "name", u->name, "created_at",
                      (json_int_t)lt_time_wall_ms(), "sha256", lt_crypto_hex(sha, 32, hex), "bytes", (json_int_t)plain,
                      "report", report);
    char *text = json_dumps(*meta, JSON_COMPACT);
    lt_dataset_object_key(key, sizeof key, u->tenant, u->id, LT_DATASET_META);
    err = text ? lt_sealed_put(api->conf.store, u->dek, key, text, strlen(text), NULL, msg, n) : LT_ERR_NOMEM;
    free(text);
  }
  if (err) {
    /* Nothing half-stored. */
    const char *leaves[] = {LT_DATASET_META, LT_DATASET_KEY, LT_DATASET_DATA};
    for (int i = 0; i < 3; i++) {
      lt_dataset_object_key(key, sizeof key, u->tenant, u->id, leaves[i]);
      lt_store_delete(api->conf.store, key, NULL, 0);
    }
  }
  return err;
}

/* upload_open with the request's ?name=&max_tokens=. */
static lt_err_t upload_open_req(lt_api_call_t *c, lt_api_upload_t **u, const char **field, char *msg, size_t n) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  lt_err_t err = upload_open(c->api, c->tenant, &q, u, field, msg, n);
  evhttp_clear_headers(&q);
  return err;
}

/* POST /v1/uploads?name=&max_tokens=: opens an upload; its parts follow. */
void lt_api_uploads_open(lt_api_call_t *c) {
  char msg[512];
  lt_api_upload_t *u;
  const char *field;
  lt_err_t err = upload_open_req(c, &u, &field, msg, sizeof msg);
  if (err) {
    lt_api_reply_err(c->req, err, field, msg);
    return;
  }
  lt_api_reply_json(c->req, 201, json_pack("{s:s,s:i,s:i}", "upload_id", u->id, "next_part", u->next_part,
                                           "part_max_bytes", (int)LT_API_PART_MAX));
}

bool lt_api_uploads_resolve(lt_api_call_t *c) {
  c->upload = upload_find(c->api, c->tenant, c->id);
  if (c->upload) return true;
  lt_api_reply_error(c->req, 404, "not_found", NULL,
                     "no open upload %s for this tenant (finished, aborted, or idle for more than %lld s)", c->id,
                     (long long)(c->api->conf.upload_idle_ms / 1000));
  return false;
}

/* Refuses (409) a request for an upload whose previous part is still being processed. */
static bool upload_busy(lt_api_call_t *c) {
  if (!c->upload->busy) return false;
  lt_api_reply_error(c->req, 409, "conflict", "part",
                     "upload %s is still processing part %d: send the next request after its answer", c->id,
                     c->upload->next_part);
  return true;
}

/* PUT /v1/uploads/{id}/parts/{n}: the next part, in order. */
void lt_api_uploads_part(lt_api_call_t *c) {
  lt_api_upload_t *u = c->upload;
  if (upload_busy(c)) return;
  if (c->part != u->next_part) {
    lt_api_reply_error(c->req, 409, "conflict", "part", "part %d is out of order: the next part is %d", c->part,
                       u->next_part);
    return;
  }
  upload_run(c, u, true, false, NULL);
}

/* POST /v1/uploads/{id}/complete. */
void lt_api_uploads_complete(lt_api_call_t *c) {
  if (!upload_busy(c)) upload_run(c, c->upload, false, true, NULL);
}

/* DELETE /v1/uploads/{id}: drops the upload and whatever of it was stored. */
void lt_api_uploads_abort(lt_api_call_t *c) {
  if (c->upload->busy && c->upload->completing) { /* it may be stored already: an abort would say it is not */
    lt_api_reply_error(c->req, 409, "conflict", NULL,
                       "upload %s is completing: its dataset is being stored, and the completion answers whether "
                       "it was; delete the dataset once it is (DELETE /v1/datasets/%s)",
                       c->id, c->id);
    return;
  }
  upload_drop(c->api, c->upload);
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:b}", "upload_id", c->id, "aborted", 1));
}

/* ---------------------------------------------------------------- datasets */

lt_err_t lt_api_dataset_open(lt_api_t *api, const char *tenant, const char *id, lt_crypto_dek_t **dek, json_t **meta,
                             char *msg, size_t n) {
  char key[512];
  void *wrapped = NULL, *text = NULL;
  size_t wlen = 0, tlen = 0;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_KEY);
  lt_err_t err = lt_store_get(api->conf.store, key, LT_CRYPTO_WRAPPED_MAX, &wrapped, &wlen, NULL, msg, n);
  if (!err) err = lt_crypto_dek_unwrap(api->conf.kek, tenant, wrapped, wlen, dek, msg, n);
  free(wrapped);
  if (err) return err;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_META);
  err = lt_sealed_get(api->conf.store, *dek, key, 1 << 20, &text, &tlen, msg, n);
  if (!err) {
    json_error_t je;
    *meta = json_loadb(text, tlen, 0, &je);
    if (!*meta) err = lt_errf(msg, n, LT_ERR_CORRUPT, "dataset %s: its metadata does not parse", id);
  }
  free(text);
  if (err) {
    lt_crypto_dek_destroy(*dek);
    *dek = NULL;
  }
  return err;
}

bool lt_api_dataset_seen(lt_api_t *api, const char *tenant, const char *dataset_id) {
  char seen[160];
  seen_key(seen, sizeof seen, tenant, dataset_id);
  return lt_map_has(api->datasets_seen, seen);
}

void lt_api_dataset_mark_seen(lt_api_t *api, const char *tenant, const char *dataset_id) {
  char seen[160];
  seen_key(seen, sizeof seen, tenant, dataset_id);
  lt_map_set(api->datasets_seen, seen, NULL);
}

lt_err_t lt_api_dataset_head(lt_api_t *api, const char *tenant, const char *dataset_id) {
  if (!lt_id_valid(dataset_id)) return LT_ERR_NOT_FOUND;
  char key[512];
  lt_store_info_t info;
  lt_dataset_object_key(key, sizeof key, tenant, dataset_id, LT_DATASET_META);
  return lt_store_head(api->conf.store, key, &info, NULL, 0);
}

void lt_api_reply_store_unsure(struct evhttp_request *req, const char *field, const char *id, lt_err_t err) {
  evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
  lt_api_reply_error(req, 503, "unavailable", field, "%s%sthe object store could not say whether dataset %s exists (%s); retry",
                     field ? field : "", field ? ": " : "", id, lt_err_str(err));
}

/* A dataset request on its way through the pool. */
typedef struct ds_task {
  lt_api_t *api;
  struct evhttp_request *req;
  char tenant[LT_ID_MAX + 1];
  char id[LT_ID_MAX + 1];
  lt_err_t err;
  char msg[512];
  json_t *out;
  uint64_t quota;    /* the tenant's storage quota (lt_api_storage_quota; 0: none) */
  uint64_t datasets; /* after a delete, with a storage quota: the tenant's dataset bytes */
  bool measured;
  uint64_t since;    /* the measure's mark */
  int limit;         /* list: datasets a page */
  bool more;         /* list: another page follows */
  bool openai;       /* answer with OpenAI's file objects (/v1/files) */
  bool shredding;    /* delete: the dataset was there, and its key went (or was tried) */
} ds_task_t;

/* Hands a dataset request to the pool (limit: a list's page size); after answers it and frees
 * the task. */
static void ds_run_limit(lt_api_call_t *c, lt_api_work_fn *work, lt_api_after_fn *after, int limit) {
  ds_task_t *t = calloc(1, sizeof *t);
  if (!t) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  t->api = c->api;
  t->req = c->req;
  snprintf(t->tenant, sizeof t->tenant, "%s", c->tenant->tenant_id);
  snprintf(t->id, sizeof t->id, "%s", c->id);
  t->quota = lt_api_storage_quota(c->api, c->tenant);
  t->limit = limit;
  t->openai = c->openai;
  lt_api_work(c->api, t->tenant, work, after, t);
}

static void ds_run(lt_api_call_t *c, lt_api_work_fn *work, lt_api_after_fn *after) { ds_run_limit(c, work, after, 0); }

/* Answers a failed dataset request: 404 for a dataset the tenant does not have. */
static void ds_reply_err(ds_task_t *t) {
  if (t->err == LT_ERR_NOT_FOUND)
    lt_api_reply_error(t->req, 404, "not_found", NULL, "no dataset %s for this tenant", t->id);
  else
    lt_api_reply_store_fail(t->req, t->err, "the object store could not be asked for the dataset", t->msg);
}

static void ds_free(ds_task_t *t) {
  json_decref(t->out);
  free(t);
}

typedef struct {
  lt_api_t *api;
  const char *tenant;
  json_t *out;
  int limit;
  bool more;
} list_ctx_t;

static lt_err_t list_one(void *ctx, const char *key, const lt_store_info_t *info) {
  list_ctx_t *l = ctx;
  size_t klen = strlen(key), leaf = strlen("/" LT_DATASET_META);
  if (klen <= leaf || strcmp(key + klen - leaf, "/" LT_DATASET_META) != 0) return LT_OK;
  if ((int)json_array_size(l->out) == l->limit) { /* a dataset past the page: say so and stop */
    l->more = true;
    return LT_ERR_CANCELLED;
  }
  const char *idstart = key + klen - leaf;
  while (idstart > key && idstart[-1] != '/') idstart--;
  char id[LT_ID_MAX + 1];
  snprintf(id, sizeof id, "%.*s", (int)(key + klen - leaf - idstart), idstart);
  lt_crypto_dek_t *dek = NULL;
  json_t *meta = NULL;
  lt_err_t err = lt_api_dataset_open(l->api, l->tenant, id, &dek, &meta, NULL, 0);
  if (err == LT_OK) {
    json_object_del(meta, "report");
    json_array_append_new(l->out, meta);
  }
  lt_crypto_dek_destroy(dek);
  /* the store away for a moment: the page fails (503), rather than go on without the dataset and
   * move a client paging through past it for good; one deleted meanwhile is simply not listed */
  return lt_store_err_retriable(err) ? err : LT_OK;
}

/* POST /v1/datasets?name=&max_tokens=: open, the body as the one part, complete. */
void lt_api_datasets_upload(lt_api_call_t *c) {
  char msg[512];
  lt_api_upload_t *u;
  const char *field;
  lt_err_t err = upload_open_req(c, &u, &field, msg, sizeof msg);
  if (err) {
    lt_api_reply_err(c->req, err, field, msg);
    return;
  }
  upload_run(c, u, true, true, NULL);
}

void lt_api_datasets_upload_body(lt_api_call_t *c, const char *name, struct evbuffer *body) {
  char msg[512];
  struct evkeyvalq q;
  TAILQ_INIT(&q);
  if (name) evhttp_add_header(&q, "name", name);
  lt_api_upload_t *u;
  const char *field;
  lt_err_t err = upload_open(c->api, c->tenant, &q, &u, &field, msg, sizeof msg);
  evhttp_clear_headers(&q);
  if (err) {
    body_free(body);
    lt_api_reply_err(c->req, err, err == LT_ERR_INVALID ? "file" : NULL, msg);
    return;
  }
  upload_run(c, u, true, true, body);
}

/* On a pool thread: a page of the tenant's datasets in store order (t->id: the last id of the
 * page before, "" for the first), without the validation reports. */
static void list_work(void *ctx) {
  ds_task_t *t = ctx;
  char prefix[256], next[2048] = "", after[2048] = "";
  snprintf(prefix, sizeof prefix, "tenants/%s/datasets/", t->tenant);
  /* Past every object of the dataset named: its keys are "<id>/data...", "<id>/key...",
   * "<id>/meta...", all before "<id>/~". */
  if (t->id[0]) snprintf(next, sizeof next, "%s%s/~", prefix, t->id);
  list_ctx_t l = {.api = t->api, .tenant = t->tenant, .out = json_array(), .limit = t->limit};
  do {
    snprintf(after, sizeof after, "%s", next);
    next[0] = '\0';
    t->err = lt_store_list(t->api->conf.store, prefix, after, 0, list_one, &l, next, sizeof next, t->msg,
                           sizeof t->msg);
  } while (!t->err && next[0]);
  if (l.more && t->err == LT_ERR_CANCELLED) t->err = LT_OK;
  t->more = l.more;
  t->out = l.out;
}

static void list_after(lt_api_t *api, void *ctx) {
  ds_task_t *t = ctx;
  (void)api;
  size_t n = json_array_size(t->out);
  json_t *first = n ? json_object_get(json_array_get(t->out, 0), "id") : NULL;
  json_t *last = n ? json_object_get(json_array_get(t->out, n - 1), "id") : NULL;
  if (t->err) ds_reply_err(t);
  else if (t->openai) {
    json_t *files = json_array(), *m;
    size_t i;
    json_array_foreach(t->out, i, m) json_array_append_new(files, lt_api_openai_file_json(m));
    lt_api_reply_json(t->req, 200, json_pack("{s:s,s:o,s:b,s:O,s:O}", "object", "list", "data", files, "has_more",
                                             t->more, "first_id", first ? first : json_null(), "last_id",
                                             last ? last : json_null()));
  } else
    lt_api_reply_json(t->req, 200,
                      json_pack("{s:s,s:O,s:b,s:O,s:O}", "object", "list", "datasets", t->out, "has_more", t->more,
                                "first_id", first ? first : json_null(), "last_id", last ? last : json_null()));
  ds_free(t);
}

#define LIST_LIMIT_DEFAULT 100
#define LIST_LIMIT_MAX 500

/* GET /v1/datasets?limit=&after=: a page at a time like /v1/jobs (each dataset costs a store
 * read, so a page bounds the work). */
void lt_api_datasets_list(lt_api_call_t *c) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  const char *v = lt_api_query(&q, "limit"), *after = lt_api_query(&q, "after");
  long n = LIST_LIMIT_DEFAULT;
  char *end = NULL;
  if (v) n = strtol(v, &end, 10);
  if (v && (*end || end == v || n < 1 || n > LIST_LIMIT_MAX))
    lt_api_reply_error(c->req, 400, "invalid", "limit", "limit must be a whole number from 1 to %d (default %d), not \"%.40s\"",
                       LIST_LIMIT_MAX, LIST_LIMIT_DEFAULT, v);
  else if (after && !lt_id_valid(after))
    lt_api_reply_error(c->req, 400, "invalid", "after", "after must be the last id of a page (the last_id it gave)");
  else {
    lt_api_call_t page = *c;
    page.id = after ? after : "";
    ds_run_limit(&page, list_work, list_after, (int)n);
  }
  evhttp_clear_headers(&q);
}

/* {id} is looked up by the handler, on a pool thread (it costs store round trips). */
bool lt_api_datasets_resolve(lt_api_call_t *c) {
  (void)c;
  return true;
}

/* On a pool thread: the dataset's meta, its validation report included. */
static void show_work(void *ctx) {
  ds_task_t *t = ctx;
  lt_crypto_dek_t *dek = NULL;
  t->err = lt_api_dataset_open(t->api, t->tenant, t->id, &dek, &t->out, t->msg, sizeof t->msg);
  lt_crypto_dek_destroy(dek);
}

static void show_after(lt_api_t *api, void *ctx) {
  ds_task_t *t = ctx;
  (void)api;
  if (t->err) ds_reply_err(t);
  else lt_api_reply_json(t->req, 200, t->openai ? lt_api_openai_file_json(t->out) : json_incref(t->out));
  ds_free(t);
}

/* GET /v1/datasets/{id}. */
void lt_api_datasets_show(lt_api_call_t *c) { ds_run(c, show_work, show_after); }

/* On a pool thread. Crypto-shred: without its wrapped key the data cannot be read even if a copy
 * survives, so the key goes first. A dataset the tenant does not have is 404. */
static void delete_work(void *ctx) {
  ds_task_t *t = ctx;
  char key[512];
  lt_store_info_t info;
  /* meta goes last, so a dataset half deleted before (a store failure) still answers here. */
  lt_dataset_object_key(key, sizeof key, t->tenant, t->id, LT_DATASET_META);
  t->err = lt_store_head(t->api->conf.store, key, &info, t->msg, sizeof t->msg);
  t->shredding = !t->err;
  const char *leaves[] = {LT_DATASET_KEY, LT_DATASET_DATA, LT_DATASET_META};
  for (int i = 0; i < 3 && !t->err; i++) {
    lt_dataset_object_key(key, sizeof key, t->tenant, t->id, leaves[i]);
    t->err = lt_store_delete(t->api->conf.store, key, t->msg, sizeof t->msg);
  }
  if (!t->err && t->quota)
    t->measured = !lt_api_stored_bytes(t->api, t->tenant, &t->datasets, &t->since, NULL, NULL, 0);
}

static void delete_after(lt_api_t *api, void *ctx) {
  ds_task_t *t = ctx;
  char seen[160];
  seen_key(seen, sizeof seen, t->tenant, t->id);
  lt_map_del(api->datasets_seen, seen);
  lt_api_stored_note(api, t->tenant, t->since, t->measured, t->datasets);
  if (t->shredding) { /* a staff read of it streaming here stops (another API learns of no delete) */
    char key[512];
    lt_dataset_object_key(key, sizeof key, t->tenant, t->id, LT_DATASET_DATA);
    lt_api_download_cut_object(api, key);
  }
  if (t->err) ds_reply_err(t);
  else if (t->openai) lt_api_reply_json(t->req, 200, json_pack("{s:s,s:s,s:b}", "id", t->id, "object", "file", "deleted", 1));
  else lt_api_reply_json(t->req, 200, json_pack("{s:s,s:b}", "id", t->id, "deleted", 1));
  ds_free(t);
}

/* DELETE /v1/datasets/{id}. */
void lt_api_datasets_delete(lt_api_call_t *c) {
  char seen[160];
  seen_key(seen, sizeof seen, c->tenant->tenant_id, c->id);
  lt_map_del(c->api->datasets_seen, seen); /* no submission names it from now on */
  ds_run(c, delete_work, delete_after);
}
