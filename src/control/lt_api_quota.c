/* lt_api_quota: a tenant's storage — its datasets, its checkpoints and its artifacts together —
 * against its quota: the tenant's own quotas.max_storage_bytes (TenantUpserted v2, `lathe admin
 * tenant --max-storage-bytes`) where set, else the API's conf.max_storage_bytes (0: no limit).
 *
 * Usage is measured where it lives: the datasets' and checkpoints' stored bytes by listing the
 * tenant's dataset, staging and session prefixes (a pool thread does it for each upload part, for
 * each session call that saves a state, and for a submission when the last measure is older than
 * LT_API_STORED_FRESH_MS), the artifacts' bytes from the publications the projection folded
 * (deleted jobs do not count). A session's save_state or save_weights_for_sampler is refused
 * (413) while the tenant is at or over its quota: a live session keeps every state it saved. An upload that would take the tenant over
 * is refused at the part that would (413, naming the quota, the usage and the upload) and leaves
 * nothing; a job submission is refused while the tenant is at or over its quota (413), since its
 * artifacts would add to it. Two uploads of one tenant checked at the same moment can overshoot
 * by what the other adds meanwhile: the quota bounds storage, it is not a transaction. */
#include "lt_api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_time.h"

typedef struct {
  lt_api_t *api;
  const char *tenant;
  uint64_t bytes;
} art_acc_t;

static bool add_artifacts(const lt_job_t *j, void *ctx) {
  art_acc_t *a = ctx;
  if (strcmp(j->tenant_id, a->tenant) != 0 || lt_api_job_deleted(a->api, j->job_id)) return true;
  size_t i;
  json_t *art;
  json_array_foreach(json_object_get(lt_proj_job_info(a->api->proj, j->job_id), "artifacts"), i, art)
      a->bytes += (uint64_t)json_integer_value(json_object_get(art, "bytes"));
  return true;
}

uint64_t lt_api_artifact_bytes(lt_api_t *api, const char *tenant) {
  art_acc_t a = {.api = api, .tenant = tenant};
  lt_job_scan(lt_proj_jobs(api->proj), add_artifacts, &a);
  return a.bytes;
}

static lt_err_t add_size(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key;
  *(uint64_t *)ctx += info->size;
  return LT_OK;
}

lt_err_t lt_api_stored_bytes(lt_api_t *api, const char *tenant, uint64_t *out, char *msg, size_t n) {
  /* the datasets; the checkpoints (a live session keeps every state it saved); its calls' bodies */
  static const char *const where[] = {"tenants/%s/datasets/", "staging/%s/", "sessions/%s/"};
  char prefix[256], next[LT_STORE_KEY_MAX + 1], after[LT_STORE_KEY_MAX + 1];
  *out = 0;
  lt_err_t err = LT_OK;
  for (size_t i = 0; i < sizeof where / sizeof *where && !err; i++) {
    snprintf(prefix, sizeof prefix, where[i], tenant);
    next[0] = '\0';
    do {
      snprintf(after, sizeof after, "%s", next);
      err = lt_store_list(api->conf.store, prefix, after, 0, add_size, out, next, sizeof next, msg, n);
    } while (!err && next[0]);
  }
  return err;
}

typedef struct {
  uint64_t bytes;
  int64_t at_ms;
} stored_t;

void lt_api_stored_note(lt_api_t *api, const char *tenant, bool measured, uint64_t bytes) {
  stored_t *m = measured ? malloc(sizeof *m) : NULL;
  if (!m || lt_map_set(api->stored_bytes, tenant, m) != LT_OK) { /* unknown: measured again when asked */
    free(m);
    lt_map_del(api->stored_bytes, tenant);
    return;
  }
  *m = (stored_t){bytes, lt_time_mono_ms()};
}

bool lt_api_stored_recent(lt_api_t *api, const char *tenant, uint64_t *bytes) {
  const stored_t *m = lt_map_get(api->stored_bytes, tenant);
  if (!m || lt_time_mono_ms() - m->at_ms > LT_API_STORED_FRESH_MS) return false;
  *bytes = m->bytes;
  return true;
}

uint64_t lt_api_storage_quota(const lt_api_t *api, const lt_tenant_t *t) {
  return t && t->quotas.max_storage_bytes > 0 ? (uint64_t)t->quotas.max_storage_bytes : api->conf.max_storage_bytes;
}

lt_err_t lt_api_storage_check(uint64_t quota, const char *tenant, uint64_t datasets, uint64_t artifacts,
                              uint64_t adding, const char *why, char *msg, size_t n) {
  uint64_t used = datasets + artifacts;
  if (!quota || (adding ? used + adding <= quota : used < quota)) return LT_OK;
  char what[96];
  if (adding) snprintf(what, sizeof what, " and this upload would add %llu", (unsigned long long)adding);
  else snprintf(what, sizeof what, "%s", why ? why : ", and a new job's artifacts would add to it");
  return lt_errf(msg, n, LT_ERR_QUOTA,
                 "tenant %s's storage quota max_storage_bytes is %llu bytes; it uses %llu (datasets and "
                 "checkpoints %llu, artifacts %llu)%s: delete datasets (DELETE /v1/datasets/{id}) or finished "
                 "jobs and sessions (DELETE /v1/jobs/{id})",
                 tenant, (unsigned long long)quota, (unsigned long long)used, (unsigned long long)datasets,
                 (unsigned long long)artifacts, what);
}

void lt_api_reply_storage(struct evhttp_request *req, const char *msg) {
  lt_api_reply_error(req, 413, "storage_quota_exceeded", NULL, "%s", msg);
}
