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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#define UPLOAD_IDLE_MS (10 * 60 * 1000)

struct lt_api_upload {
  char id[LT_ID_MAX + 1];
  char tenant[LT_ID_MAX + 1];
  char name[128];
  lt_dataset_check_t *check;
  lt_crypto_dek_t *dek;
  lt_sealed_writer_t *w;
  int next_part;
  int64_t last_active_ms;
  lt_api_upload_t *next;
};

/* The API's memory of datasets known to exist: "tenant/id". */
static void seen_key(char *out, size_t n, const char *tenant, const char *id) { snprintf(out, n, "%s/%s", tenant, id); }

/* ---------------------------------------------------------------- uploads */

static void upload_free(lt_api_upload_t *u) {
  if (!u) return;
  lt_sealed_writer_abort(u->w); /* no-op once committed (w is NULL then) */
  lt_dataset_check_destroy(u->check);
  lt_crypto_dek_destroy(u->dek);
  free(u);
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
    if (strcmp(u->id, id) == 0 && strcmp(u->tenant, t->tenant_id) == 0) return u;
  return NULL;
}

void lt_api_uploads_tick(lt_api_t *api) {
  int64_t now = lt_time_wall_ms();
  for (lt_api_upload_t *u = api->uploads, *next; u; u = next) {
    next = u->next;
    if (now - u->last_active_ms > UPLOAD_IDLE_MS) {
      upload_unlink(api, u);
      upload_free(u);
    }
  }
}

void lt_api_uploads_free(lt_api_t *api) {
  while (api->uploads) {
    lt_api_upload_t *u = api->uploads;
    api->uploads = u->next;
    upload_free(u);
  }
}

static lt_err_t upload_open(lt_api_t *api, const lt_tenant_t *t, struct evkeyvalq *q, lt_api_upload_t **out,
                            char *msg, size_t n) {
  const char *name = lt_api_query(q, "name");
  if (name && (strlen(name) > 100 || !lt_utf8_valid(name, strlen(name), NULL)))
    return lt_errf(msg, n, LT_ERR_INVALID, "name must be at most 100 bytes of UTF-8");
  lt_dataset_limits_t lim = {.max_bytes = (uint64_t)t->quotas.max_dataset_bytes, .max_tokens = 1024};
  if (!lim.max_bytes || lim.max_bytes > api->conf.max_upload_bytes) lim.max_bytes = api->conf.max_upload_bytes;
  const char *mt = lt_api_query(q, "max_tokens");
  if (mt) {
    char *end;
    long v = strtol(mt, &end, 10);
    if (*end || v < 8 || v > 32768) return lt_errf(msg, n, LT_ERR_INVALID, "max_tokens must be from 8 to 32768");
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
  u->last_active_ms = lt_time_wall_ms();
  char key[512];
  lt_dataset_object_key(key, sizeof key, u->tenant, u->id, LT_DATASET_DATA);
  lt_err_t err = lt_dataset_check_new(&u->check, &lim, api->conf.tokens_fn, api->conf.tokens_ctx);
  if (!err) err = lt_crypto_dek_generate(&u->dek, u->tenant, u->id, msg, n);
  if (!err) err = lt_sealed_writer_new(api->conf.store, u->dek, key, &u->w, msg, n);
  if (err) {
    upload_free(u);
    return err;
  }
  u->next = api->uploads;
  api->uploads = u;
  *out = u;
  return LT_OK;
}

/* Feeds one part; on quota or store failure the upload is gone (nothing stays). */
static lt_err_t upload_part(lt_api_t *api, lt_api_upload_t *u, struct evbuffer *body, char *msg, size_t n) {
  size_t len = evbuffer_get_length(body);
  const uint8_t *p = evbuffer_pullup(body, -1);
  lt_err_t err = lt_dataset_check_feed(u->check, p, len);
  if (err == LT_ERR_QUOTA) {
    lt_dataset_report_t r;
    lt_dataset_check_finish(u->check, &r);
    lt_errf(msg, n, LT_ERR_QUOTA, "%s", r.errors_kept ? r.errors[r.errors_kept - 1].reason : "over quota");
  } else {
    err = lt_sealed_writer_write(u->w, p, len, msg, n);
  }
  u->last_active_ms = lt_time_wall_ms();
  u->next_part++;
  if (err) {
    upload_unlink(api, u);
    upload_free(u);
  }
  return err;
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
  json_t *e = json_pack("{s:s,s:s,s:n}", "code", err == LT_ERR_QUOTA ? "over_quota" : "invalid_dataset", "message",
                        summary, "field");
  lt_api_reply_json(req, err == LT_ERR_QUOTA ? 429 : 400, json_pack("{s:o,s:o}", "error", e, "report", report));
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

/* Finishes: valid -> stored, reply 201 with the meta; invalid -> all dropped, reply 400 (429
 * over quota) with the report. Frees the upload either way. */
static void upload_complete(lt_api_t *api, struct evhttp_request *req, lt_api_upload_t *u) {
  upload_unlink(api, u);
  lt_dataset_report_t r;
  lt_err_t err = lt_dataset_check_finish(u->check, &r);
  json_t *report = lt_dataset_report_json(&r, 1), *meta = NULL;
  char msg[256];
  if (err) {
    reply_refused(req, err, &r, report);
  } else if ((err = store_dataset(api, u, report, &meta, msg, sizeof msg))) {
    lt_api_reply_store_err(req, err, msg);
    json_decref(report);
    json_decref(meta);
  } else {
    json_decref(report);
    char seen[160];
    seen_key(seen, sizeof seen, u->tenant, u->id);
    lt_map_set(api->datasets_seen, seen, NULL);
    lt_api_reply_json(req, 201, meta);
  }
  upload_free(u);
}

/* upload_open with the request's ?name=&max_tokens=. */
static lt_err_t upload_open_req(lt_api_call_t *c, lt_api_upload_t **u, char *msg, size_t n) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  lt_err_t err = upload_open(c->api, c->tenant, &q, u, msg, n);
  evhttp_clear_headers(&q);
  return err;
}

/* POST /v1/uploads?name=&max_tokens=: opens an upload; its parts follow. */
void lt_api_uploads_open(lt_api_call_t *c) {
  char msg[256];
  lt_api_upload_t *u;
  lt_err_t err = upload_open_req(c, &u, msg, sizeof msg);
  if (err) {
    lt_api_reply_err(c->req, err, err == LT_ERR_INVALID ? "name" : NULL, msg);
    return;
  }
  lt_api_reply_json(c->req, 201, json_pack("{s:s,s:i,s:i}", "upload_id", u->id, "next_part", u->next_part,
                                           "part_max_bytes", (int)LT_API_PART_MAX));
}

bool lt_api_uploads_resolve(lt_api_call_t *c) {
  c->upload = upload_find(c->api, c->tenant, c->id);
  if (c->upload) return true;
  lt_api_reply_error(c->req, 404, "not_found", NULL,
                     "no open upload %s for this tenant (finished, aborted, or idle for more than 10 minutes)", c->id);
  return false;
}

/* PUT /v1/uploads/{id}/parts/{n}: the next part, in order. */
void lt_api_uploads_part(lt_api_call_t *c) {
  lt_api_upload_t *u = c->upload;
  char msg[256];
  if (c->part != u->next_part) {
    lt_api_reply_error(c->req, 409, "conflict", "part", "part %d is out of order: the next part is %d", c->part,
                       u->next_part);
    return;
  }
  lt_err_t err = upload_part(c->api, u, evhttp_request_get_input_buffer(c->req), msg, sizeof msg);
  if (err) {
    lt_api_reply_store_err(c->req, err, msg);
    return;
  }
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:i}", "upload_id", u->id, "next_part", u->next_part));
}

void lt_api_uploads_complete(lt_api_call_t *c) { upload_complete(c->api, c->req, c->upload); }

/* DELETE /v1/uploads/{id}: drops the upload and whatever of it was stored. */
void lt_api_uploads_abort(lt_api_call_t *c) {
  upload_unlink(c->api, c->upload);
  upload_free(c->upload);
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:b}", "upload_id", c->id, "aborted", 1));
}

/* ---------------------------------------------------------------- datasets */

/* The dataset's key and meta; *dek and *meta are the caller's. */
static lt_err_t dataset_open(lt_api_t *api, const char *tenant, const char *id, lt_crypto_dek_t **dek, json_t **meta,
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

bool lt_api_dataset_exists(lt_api_t *api, const char *tenant, const char *dataset_id) {
  if (!lt_id_valid(dataset_id)) return false;
  char key[512], seen[160];
  seen_key(seen, sizeof seen, tenant, dataset_id);
  if (lt_map_has(api->datasets_seen, seen)) return true; /* no store round trip per submission */
  lt_store_info_t info;
  lt_dataset_object_key(key, sizeof key, tenant, dataset_id, LT_DATASET_META);
  if (lt_store_head(api->conf.store, key, &info, NULL, 0) != LT_OK) return false;
  lt_map_set(api->datasets_seen, seen, NULL);
  return true;
}

typedef struct {
  lt_api_t *api;
  const char *tenant;
  json_t *out;
} list_ctx_t;

static lt_err_t list_one(void *ctx, const char *key, const lt_store_info_t *info) {
  list_ctx_t *l = ctx;
  size_t klen = strlen(key), leaf = strlen("/" LT_DATASET_META);
  if (klen <= leaf || strcmp(key + klen - leaf, "/" LT_DATASET_META) != 0) return LT_OK;
  const char *idstart = key + klen - leaf;
  while (idstart > key && idstart[-1] != '/') idstart--;
  char id[LT_ID_MAX + 1];
  snprintf(id, sizeof id, "%.*s", (int)(key + klen - leaf - idstart), idstart);
  lt_crypto_dek_t *dek = NULL;
  json_t *meta = NULL;
  if (dataset_open(l->api, l->tenant, id, &dek, &meta, NULL, 0) == LT_OK) {
    json_object_del(meta, "report");
    json_array_append_new(l->out, meta);
  }
  lt_crypto_dek_destroy(dek);
  return LT_OK;
}

/* POST /v1/datasets?name=&max_tokens=: open, the body as the one part, complete. */
void lt_api_datasets_upload(lt_api_call_t *c) {
  char msg[256];
  lt_api_upload_t *u;
  lt_err_t err = upload_open_req(c, &u, msg, sizeof msg);
  if (!err) err = upload_part(c->api, u, evhttp_request_get_input_buffer(c->req), msg, sizeof msg);
  if (err) {
    lt_api_reply_store_err(c->req, err, msg);
    return;
  }
  upload_complete(c->api, c->req, u);
}

/* GET /v1/datasets: every dataset of the tenant, without the validation reports. */
void lt_api_datasets_list(lt_api_call_t *c) {
  char prefix[256], next[2048] = "", after[2048] = "", msg[256];
  snprintf(prefix, sizeof prefix, "tenants/%s/datasets/", c->tenant->tenant_id);
  list_ctx_t l = {.api = c->api, .tenant = c->tenant->tenant_id, .out = json_array()};
  lt_err_t err;
  do {
    snprintf(after, sizeof after, "%s", next);
    next[0] = '\0';
    err = lt_store_list(c->api->conf.store, prefix, after, 0, list_one, &l, next, sizeof next, msg, sizeof msg);
  } while (!err && next[0]);
  if (err) {
    json_decref(l.out);
    lt_api_reply_store_err(c->req, err, msg);
    return;
  }
  lt_api_reply_json(c->req, 200, json_pack("{s:o}", "datasets", l.out));
}

bool lt_api_datasets_resolve(lt_api_call_t *c) {
  char msg[256];
  lt_crypto_dek_t *dek = NULL;
  lt_err_t err = dataset_open(c->api, c->tenant->tenant_id, c->id, &dek, &c->meta, msg, sizeof msg);
  lt_crypto_dek_destroy(dek);
  if (err == LT_ERR_NOT_FOUND) lt_api_reply_error(c->req, 404, "not_found", NULL, "no dataset %s for this tenant", c->id);
  else if (err) lt_api_reply_store_err(c->req, err, msg);
  return !err;
}

/* GET /v1/datasets/{id}: the dataset's meta, its validation report included. */
void lt_api_datasets_show(lt_api_call_t *c) {
  lt_api_reply_json(c->req, 200, c->meta);
  c->meta = NULL;
}

/* DELETE /v1/datasets/{id}. Crypto-shred: without its wrapped key the data cannot be read even
 * if a copy survives, so the key goes first. */
void lt_api_datasets_delete(lt_api_call_t *c) {
  char seen[160], msg[256];
  seen_key(seen, sizeof seen, c->tenant->tenant_id, c->id);
  lt_map_del(c->api->datasets_seen, seen);
  const char *leaves[] = {LT_DATASET_KEY, LT_DATASET_DATA, LT_DATASET_META};
  for (int i = 0; i < 3; i++) {
    char key[512];
    lt_dataset_object_key(key, sizeof key, c->tenant->tenant_id, c->id, leaves[i]);
    lt_err_t err = lt_store_delete(c->api->conf.store, key, msg, sizeof msg);
    if (err) {
      lt_api_reply_store_err(c->req, err, msg);
      return;
    }
  }
  lt_api_reply_json(c->req, 200, json_pack("{s:s,s:b}", "id", c->id, "deleted", 1));
}
