/* lt_api_delete: DELETE /v1/jobs/{id} — a finished job, its artifacts and its staging objects.
 *
 * Only a finished job (completed, failed, cancelled, rejected) is deleted; a queued or running
 * one answers 409 and stays as it is: cancel it first. (Cancelling on the caller's behalf would
 * make a DELETE that the broker acknowledged but the worker has not yet acted on mean two
 * different things; the caller decides.)
 *
 * Order, so that a crash at any point leaves the job deleted or deletable again:
 *   1. JobDeleted into lathe.artifacts (kept forever, key job_id), answered only once the broker
 *      acknowledged it: from then on every reader of the log — this API after a restart, the
 *      publisher, a replay — treats the job as gone (its routes answer 410), and the publisher
 *      never publishes it;
 *   2. on a pool thread, the job's wrapped artifact key first (crypto-shred: a copy of an
 *      artifact that survives anywhere no longer decrypts), then its artifacts, then its staging
 *      objects (checkpoints and optimizer state);
 *   3. 200 with how many objects went. A store failure answers 503; DELETE again finishes it.
 * Another tenant's job is 404, like every route of it. */
#include "lt_api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_publisher.h"

bool lt_api_job_deleted(lt_api_t *api, const char *job_id) {
  return json_object_get(lt_proj_job_info(api->proj, job_id), "deleted") != NULL;
}

bool lt_api_job_gone(lt_api_call_t *c, const char *what) {
  if (!lt_api_job_deleted(c->api, c->job->job_id) || evhttp_request_get_command(c->req) == EVHTTP_REQ_DELETE)
    return false;
  lt_api_reply_error(c->req, 410, "gone", NULL, "%s %s was deleted", what, c->job->job_id);
  return true;
}

typedef struct delete_task {
  struct evhttp_request *req;
  lt_api_t *api;
  char tenant[LT_ID_MAX + 1];
  char job[LT_ID_MAX + 1];
  lt_err_t err;
  char msg[256];
  uint64_t deleted;
} delete_task_t;

/* Deletes every object under prefix; the wrapped key (when first is set) before the rest. */
static lt_err_t delete_prefix(delete_task_t *t, const char *prefix, const char *first) {
  lt_store_t *store = t->api->conf.store;
  lt_err_t err = LT_OK;
  lt_store_info_t info;
  if (first && lt_store_head(store, first, &info, NULL, 0) == LT_OK) t->deleted++; /* counted if there */
  if (first) err = lt_store_delete(store, first, t->msg, sizeof t->msg);
  return err ? err : lt_store_delete_prefix(store, prefix, &t->deleted, t->msg, sizeof t->msg);
}

/* On a pool thread: the key, the artifacts, the staging objects. */
static void delete_work(void *ctx) {
  delete_task_t *t = ctx;
  char prefix[LT_STORE_KEY_MAX + 1], dek_key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_dek_key(dek_key, sizeof dek_key, t->tenant, t->job);
  snprintf(prefix, sizeof prefix, "tenants/%s/artifacts/%s/", t->tenant, t->job);
  t->err = delete_prefix(t, prefix, dek_key);
  snprintf(prefix, sizeof prefix, "staging/%s/%s/", t->tenant, t->job);
  if (!t->err) t->err = delete_prefix(t, prefix, NULL);
  snprintf(prefix, sizeof prefix, "sessions/%s/%s/", t->tenant, t->job); /* a session's calls and results */
  if (!t->err && lt_api_is_session_id(t->job)) t->err = delete_prefix(t, prefix, NULL);
}

static void delete_after(lt_api_t *api, void *ctx) {
  delete_task_t *t = ctx;
  lt_api_stored_note(api, t->tenant, 0, false, 0); /* its checkpoints went: measured again when asked */
  if (t->err)
    lt_api_reply_store_fail(t->req, t->err, "the job's objects could not all be deleted; retry the delete", t->msg);
  else
    lt_api_reply_json(t->req, 200, json_pack("{s:s,s:b,s:I}", "id", t->job, "deleted", 1, "objects_deleted",
                                             (json_int_t)t->deleted));
  free(t);
}

/* The record is durable (or was already): the objects go. */
static void deleted_recorded(lt_api_t *api, void *ctx, lt_err_t err, const char *msg) {
  delete_task_t *t = ctx;
  (void)msg;
  if (err) {
    lt_api_reply_err(t->req, LT_ERR_UNAVAILABLE, NULL, "the deletion could not be recorded durably; nothing was "
                                                       "deleted, retry");
    free(t);
    return;
  }
  lt_api_work(api, t->tenant, delete_work, delete_after, t);
}

/* JobDeleted, encoded; *rec is the caller's. */
static lt_err_t encode(lt_api_t *api, const delete_task_t *t, const char *by, lt_avro_record_t **rec,
                       const uint8_t **bytes, size_t *len) {
  lt_err_t err = lt_avro_record_new(api->reg, "JobDeleted", rec, NULL, 0);
  if (!err) err = lt_avro_record_stamp(*rec, api->conf.producer_id);
  if (!err) err = lt_avro_set_string(*rec, "job_id", t->job);
  if (!err) err = lt_avro_set_string(*rec, "tenant_id", t->tenant);
  if (!err) err = lt_avro_set_string(*rec, "requested_by", by);
  if (!err) err = lt_avro_record_encode(*rec, bytes, len, NULL, 0);
  return err;
}

/* DELETE /v1/jobs/{id}. */
void lt_api_jobs_delete(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  const lt_job_t *j = c->job;
  if (!lt_job_state_is_terminal(j->state)) {
    lt_api_reply_error(c->req, 409, "conflict", NULL,
                       "job %s is %s: only a finished job is deleted; cancel it first (POST /v1/jobs/%s/cancel) "
                       "and delete it once it is cancelled",
                       j->job_id, lt_job_state_name(j->state), j->job_id);
    return;
  }
  delete_task_t *t = calloc(1, sizeof *t);
  if (!t) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  t->req = c->req;
  t->api = api;
  snprintf(t->tenant, sizeof t->tenant, "%s", c->tenant->tenant_id);
  snprintf(t->job, sizeof t->job, "%s", j->job_id);
  if (lt_api_job_deleted(api, j->job_id)) { /* recorded before: finish what a failure left */
    lt_api_work(api, t->tenant, delete_work, delete_after, t);
    return;
  }
  lt_avro_record_t *rec = NULL;
  const uint8_t *bytes;
  size_t len;
  char topic[256];
  lt_bus_topic_name(api->conf.bus, "artifacts", topic, sizeof topic);
  lt_err_t err = encode(api, t, "customer", &rec, &bytes, &len);
  /* Folded at once on success (read-your-writes): a deletion is sticky and idempotent, so its
   * place in the log order does not matter, unlike a job's control records. */
  if (!err) err = lt_api_produce(api, topic, LT_BUS_PARTITION_ANY, t->job, bytes, len, true, deleted_recorded, t);
  lt_avro_record_destroy(rec);
  if (err) {
    free(t);
    lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the broker cannot take the deletion now; retry");
  }
}

/* DELETE /v1/sessions/{id}: the session's end (lt_api_sessions_end); with purge=true, a finished
 * session is deleted as a finished job is — JobDeleted, then its adapter's key, its artifacts,
 * its checkpoints and saved states, its calls' bodies and results. A live one is 409: end or
 * cancel it first (the same rule as a job's, for the same reason). */
void lt_api_sessions_delete(lt_api_call_t *c) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  const char *v = lt_api_query(&q, "purge");
  bool purge = v && strcmp(v, "true") == 0, bad = v && !purge && strcmp(v, "false") != 0;
  evhttp_clear_headers(&q);
  const lt_job_t *j = c->job;
  const lt_tenant_key_t *k = lt_tenant_key(c->tenant, c->key_id);
  if (bad)
    lt_api_reply_error(c->req, 400, "invalid", "purge", "purge must be true or false");
  else if (purge && (!k || k->role != LT_TENANT_ROLE_ADMIN)) /* as DELETE /v1/jobs/{id} (lt_api.c) */
    lt_api_reply_error(c->req, 403, "forbidden", NULL,
                       "API key %s of tenant %s is a %s key, and deleting a session shreds its adapter, checkpoints "
                       "and calls: that needs one of the tenant's admin keys (an operator makes one)",
                       c->key_id, c->tenant->tenant_id, k ? lt_tenant_role_name(k->role) : "unknown");
  else if (lt_api_job_deleted(c->api, j->job_id) && !purge)
    lt_api_reply_error(c->req, 410, "gone", NULL, "session %s was deleted", j->job_id);
  else if (!purge)
    lt_api_sessions_end(c);
  else if (!lt_job_state_is_terminal(j->state))
    lt_api_reply_error(c->req, 409, "conflict", NULL,
                       "session %s is %s: only a finished session is deleted; end it (DELETE /v1/sessions/%s) or "
                       "cancel it (POST /v1/sessions/%s/cancel) first",
                       j->job_id, lt_job_state_name(j->state), j->job_id, j->job_id);
  else
    lt_api_jobs_delete(c);
}
