/* lt_api_quota: a tenant's storage — its datasets, its checkpoints and its artifacts together —
 * against its quota: the tenant's own quotas.max_storage_bytes (TenantUpserted v2, `lathe admin
 * tenant --max-storage-bytes`) where set, else the API's conf.max_storage_bytes (0: no limit).
 *
 * Usage is measured where it lives: the datasets' and checkpoints' stored bytes by listing the
 * tenant's dataset, staging and session prefixes (a pool thread does it for each upload part, for
 * each session call that saves a state, and for a submission when the last measure is older than
 * LT_API_STORED_FRESH_MS), the artifacts' bytes from the publications the projection folded
 * (deleted jobs do not count). A session's save_state or save_weights_for_sampler is refused
 * (413) while the tenant is at or over its quota, or would be once the saving calls taken before
 * it (not completed) stored their states, each as large as its largest checkpoint stored now, or
 * all as large as their sessions' checkpoints are at least (from the base model's config: a first
 * burst has no checkpoint stored; the saving calls below): a live session keeps every state it saved. An
 * upload that would take the tenant over is refused at the part that would (413, naming the
 * quota, the usage and the upload) and leaves nothing; a job submission is refused while the tenant is at or over its quota (413), since its
 * artifacts would add to it. Two uploads of one tenant checked at the same moment can overshoot
 * by what the other adds meanwhile: the quota bounds storage, it is not a transaction.
 *
 * GET /v1/usage shows the tenant its quotas and what it uses against each, so that it learns how
 * close it is before a 413 or a 429 tells it. Each measure carries the mark of when its listing
 * began (lt_api_stored_mark), so one that ends after a newer measure or a change this API made
 * was noted is not kept; what other writers stored in the last minute (the worker's checkpoints
 * and results, another API process) may be missing from it. */
#include "lt_api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job.h"
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

/* A listing's sum, and (staging) its largest checkpoint: the objects of one directory, which
 * the listing gives one after another (keys in order). */
typedef struct {
  uint64_t total;
  bool ckpts;
  char dir[LT_STORE_KEY_MAX + 1];
  uint64_t dir_bytes, dir_max;
} size_acc_t;

static lt_err_t add_size(void *ctx, const char *key, const lt_store_info_t *info) {
  size_acc_t *a = ctx;
  a->total += info->size;
  if (!a->ckpts) return LT_OK;
  const char *slash = strrchr(key, '/');
  size_t dl = slash ? (size_t)(slash - key) : 0;
  if (strlen(a->dir) != dl || strncmp(a->dir, key, dl) != 0) {
    snprintf(a->dir, sizeof a->dir, "%.*s", (int)dl, key);
    a->dir_bytes = 0;
  }
  a->dir_bytes += info->size;
  if (a->dir_bytes > a->dir_max) a->dir_max = a->dir_bytes;
  return LT_OK;
}

lt_err_t lt_api_stored_bytes(lt_api_t *api, const char *tenant, uint64_t *out, uint64_t *since, uint64_t *ckpt_max,
                             char *msg, size_t n) {
  /* the datasets; the checkpoints (a live session keeps every state it saved); its calls' bodies */
  static const char *const where[] = {"tenants/%s/datasets/", "staging/%s/", "sessions/%s/"};
  char prefix[256], next[LT_STORE_KEY_MAX + 1], after[LT_STORE_KEY_MAX + 1];
  size_acc_t a = {.total = 0};
  *since = lt_api_stored_mark(api);
  lt_err_t err = LT_OK;
  for (size_t i = 0; i < sizeof where / sizeof *where && !err; i++) {
    snprintf(prefix, sizeof prefix, where[i], tenant);
    a.ckpts = i == 1;
    next[0] = '\0';
    do {
      snprintf(after, sizeof after, "%s", next);
      err = lt_store_list(api->conf.store, prefix, after, 0, add_size, &a, next, sizeof next, msg, n);
    } while (!err && next[0]);
  }
  *out = a.total;
  if (ckpt_max) *ckpt_max = a.dir_max;
  return err;
}

/* What is known of a tenant's stored bytes: a measure (known), or a change that made the last one
 * stale (not known); since: the mark its measure began at, or the change's own. */
typedef struct {
  uint64_t bytes;
  int64_t at_ms;
  uint64_t since;
  bool known;
} stored_t;

uint64_t lt_api_stored_mark(lt_api_t *api) { return __atomic_add_fetch(&api->stored_marks, 1, __ATOMIC_SEQ_CST); }

/* Measures run side by side on the pool and end in any order: one begun before another that was
 * noted already, or before a change (an upload's completion, a deleted job, a saved state), is
 * older than what is known and would put back bytes that no longer are. */
void lt_api_stored_note(lt_api_t *api, const char *tenant, uint64_t since, bool measured, uint64_t bytes) {
  stored_t *m = lt_map_get(api->stored_bytes, tenant);
  if (measured && (since < api->stored_floor || (m && since < m->since))) return;
  if (!m && (!(m = malloc(sizeof *m)) || lt_map_set(api->stored_bytes, tenant, m) != LT_OK)) {
    free(m);
    if (!measured) api->stored_floor = lt_api_stored_mark(api); /* no entry to say it: every tenant's */
    return;
  }
  if (measured) *m = (stored_t){bytes, lt_time_mono_ms(), since, true};
  else *m = (stored_t){0, 0, lt_api_stored_mark(api), false};
}

bool lt_api_stored_recent(lt_api_t *api, const char *tenant, uint64_t *bytes, int64_t *age_ms) {
  const stored_t *m = lt_map_get(api->stored_bytes, tenant);
  int64_t age = m ? lt_time_mono_ms() - m->at_ms : 0;
  if (!m || !m->known || age > LT_API_STORED_FRESH_MS) return false;
  *bytes = m->bytes;
  if (age_ms) *age_ms = age;
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

/* ---------------------------------------------------------------- GET /v1/usage */

typedef struct {
  const char *tenant;
  lt_api_jobs_count_t n;
} jobs_acc_t;

static bool count_jobs(const lt_job_t *j, void *ctx) {
  jobs_acc_t *acc = ctx;
  lt_api_jobs_count_t *a = &acc->n;
  if (strcmp(j->tenant_id, acc->tenant) != 0 || lt_job_state_is_terminal(j->state)) return true;
  a->live++;
  a->sessions += lt_api_is_session_id(j->job_id);
  if (j->state == LT_JOB_DISPATCHED || j->state == LT_JOB_RUNNING || j->state == LT_JOB_PREEMPTING) {
    a->running++;
    a->slots += j->gpus > 0 ? j->gpus : 1;
  }
  return true;
}

lt_api_jobs_count_t lt_api_tenant_jobs(lt_api_t *api, const char *tenant) {
  jobs_acc_t acc = {.tenant = tenant};
  lt_job_scan(lt_proj_jobs(api->proj), count_jobs, &acc);
  return acc.n;
}

#define USAGE_WAITERS 16 /* requests one measure answers; more at once: 503 */

typedef struct {
  lt_api_t *api; /* its conf.store, from the pool */
  char tenant_id[LT_ID_MAX + 1];
  uint64_t since; /* the measure's mark */
  struct evhttp_request *req[USAGE_WAITERS];
  int nreq;
  uint64_t stored;
  lt_err_t measured;
} usage_task_t;

/* The answer of GET /v1/usage (new reference). */
static json_t *usage_json(lt_api_t *api, const lt_tenant_t *t, uint64_t stored, int64_t age_ms) {
  lt_api_jobs_count_t a = lt_api_tenant_jobs(api, t->tenant_id);
  uint64_t artifacts = lt_api_artifact_bytes(api, t->tenant_id), quota = lt_api_storage_quota(api, t);
  /* what one upload may be: the tenant's limit where it is lower than the API's */
  uint64_t own = t->quotas.max_dataset_bytes > 0 ? (uint64_t)t->quotas.max_dataset_bytes : 0;
  uint64_t per_dataset = own && own < api->conf.max_upload_bytes ? own : api->conf.max_upload_bytes;
  json_t *body = json_pack(
      "{s:s,s:{s:i,s:i,s:I,s:I,s:I,s:s},s:{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}}", "tenant_id", t->tenant_id, "quotas",
      "max_running_slots", t->quotas.max_running_slots, "max_queued_jobs", t->quotas.max_queued_jobs,
      "max_job_duration_s", (json_int_t)t->quotas.max_job_duration_s, "max_dataset_bytes", (json_int_t)per_dataset,
      "max_storage_bytes", (json_int_t)quota, "max_storage_bytes_from",
      t->quotas.max_storage_bytes > 0 ? "tenant" : quota ? "service" : "none", "usage", "queued_or_running_jobs",
      (json_int_t)a.live, "sessions", (json_int_t)a.sessions, "running_jobs", (json_int_t)a.running,
      "running_slots", (json_int_t)a.slots, "stored_bytes", (json_int_t)stored, "artifact_bytes",
      (json_int_t)artifacts, "storage_bytes", (json_int_t)(stored + artifacts), "stored_bytes_age_s",
      (double)age_ms / 1000.0);
  return body;
}

static void usage_work(void *ctx) {
  usage_task_t *u = ctx;
  u->measured = lt_api_stored_bytes(u->api, u->tenant_id, &u->stored, &u->since, NULL, NULL, 0);
}

/* Answers every request that waited on the measure. A store failure is 503 naming only its kind
 * (the store's own message may name its host and credentials); a measure begun before a measure or
 * a change already noted (an upload, a deletion) still answers, but is not remembered over it. */
static void usage_after(lt_api_t *api, void *ctx) {
  usage_task_t *u = ctx;
  lt_map_del(api->usage_flight, u->tenant_id);
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), u->tenant_id);
  if (!u->measured && t) lt_api_stored_note(api, u->tenant_id, u->since, true, u->stored);
  json_t *body = !u->measured && t && !t->disabled ? usage_json(api, t, u->stored, 0) : NULL;
  for (int i = 0; i < u->nreq; i++) {
    if (u->measured) {
      char why[256];
      snprintf(why, sizeof why, "the object store could not say how much tenant %s stores (%s); retry",
               u->tenant_id, lt_err_str(u->measured));
      lt_api_reply_err(u->req[i], LT_ERR_UNAVAILABLE, NULL, why);
    } else if (!t || t->disabled) { /* disabled while it was measured */
      lt_api_reply_error(u->req[i], 401, "unauthorized", NULL, "the API key's tenant is disabled or unknown");
    } else {
      lt_api_reply_json(u->req[i], 200, json_incref(body));
    }
  }
  json_decref(body);
  free(u);
}

/* GET /v1/usage: the tenant's quotas (0: none) and its use of each. Stored bytes as measured in
 * the last LT_API_STORED_FRESH_MS (their age said), else measured now on the work pool (the store
 * listed), one measure a tenant at a time: requests that come while one runs wait for it. */
void lt_api_usage(lt_api_call_t *c) {
  uint64_t stored;
  int64_t age_ms;
  const char *tenant = c->tenant->tenant_id;
  if (lt_api_stored_recent(c->api, tenant, &stored, &age_ms)) {
    lt_api_reply_json(c->req, 200, usage_json(c->api, c->tenant, stored, age_ms));
    return;
  }
  usage_task_t *u = lt_map_get(c->api->usage_flight, tenant);
  if (u) {
    if (u->nreq == USAGE_WAITERS) {
      lt_api_reply_err(c->req, LT_ERR_UNAVAILABLE, NULL, "the tenant's storage is being measured for other requests");
      return;
    }
    u->req[u->nreq++] = c->req;
    return;
  }
  if (!(u = calloc(1, sizeof *u)) || lt_map_set(c->api->usage_flight, tenant, u) != LT_OK) {
    free(u);
    lt_api_reply_err(c->req, LT_ERR_NOMEM, NULL, "no memory to measure the tenant's storage");
    return;
  }
  u->api = c->api;
  u->req[u->nreq++] = c->req;
  snprintf(u->tenant_id, sizeof u->tenant_id, "%s", tenant);
  lt_api_work(c->api, u->tenant_id, usage_work, usage_after, u);
}

/* ---------------------------------------------------------------- saving calls in flight */

/* The saving calls (save_state, save_weights_for_sampler) of a tenant with a storage quota, taken
 * and not completed: this API's from when it takes them, any API process's once read back from
 * lathe.calls. The quota counts the state each will write (a burst of them, each checked before
 * any wrote, passed it by one state a call before). Per tenant, an object: the call's body key ->
 * {job, seq, bytes}, seq 0 while this API records the call, bytes what its session's checkpoint
 * writes at least (lt_api_session_ckpt_bytes), once the session is known. */
void lt_api_saving_free(void *v) { json_decref(v); }

/* The bytes a checkpoint of session j writes at least, from its base model's config and its
 * adapter (conf.checkpoint_bytes_fn); 0 when not known here. */
uint64_t lt_api_session_ckpt_bytes(lt_api_t *api, const lt_job_t *j) {
  if (!api->conf.checkpoint_bytes_fn) return 0;
  json_t *hp = json_object_get(json_object_get(lt_proj_job_info(api->proj, j->job_id), "spec"), "hyperparameters"), *m;
  json_int_t rank = json_integer_value(json_object_get(hp, "lora_rank"));
  unsigned targets = 0;
  size_t i;
  json_array_foreach(json_object_get(hp, "target_modules"), i, m) {
    if (json_is_string(m)) targets |= lt_target_parse(json_string_value(m));
  }
  if (rank <= 0 || rank > INT32_MAX || !targets) return 0;
  return api->conf.checkpoint_bytes_fn(api->conf.tokenize_ctx, j->base_model, (int)rank, targets);
}

json_t *lt_api_saving_of(lt_api_t *api, const char *tenant, bool create) {
  json_t *o = lt_map_get(api->saving, tenant);
  if (o || !create) return o;
  if (!(o = json_object()) || lt_map_set(api->saving, tenant, o) != LT_OK) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Drops the tenant's saving calls that will write nothing more — completed, a later record of a
 * keyed call (the worker skips it), at or before the session's committed checkpoint (a resumed
 * attempt starts after it, and its bytes are in the listing), of a session that ended or is not
 * the tenant's (a session not folded yet counts while the feed catches up) — and counts the rest;
 * *bytes (may be NULL) gets what their checkpoints write at least, where their sessions are known. */
uint32_t lt_api_saving_prune(lt_api_t *api, const char *tenant, uint64_t *bytes) {
  json_t *o = lt_api_saving_of(api, tenant, false), *e, *tmp;
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tenant);
  if (bytes) *bytes = 0;
  if (o && api->ready && (!t || !lt_api_storage_quota(api, t))) { /* none to count against */
    lt_map_del(api->saving, tenant);
    return 0;
  }
  const char *k;
  uint32_t n = 0;
  json_object_foreach_safe(o, tmp, k, e) {
    const char *job_id = json_string_value(json_object_get(e, "job"));
    int64_t seq = json_integer_value(json_object_get(e, "seq"));
    const lt_job_t *j = job_id ? lt_job_get(lt_proj_jobs(api->proj), job_id) : NULL;
    if ((!j && api->ready) || (j && (strcmp(j->tenant_id, tenant) != 0 || lt_job_state_is_terminal(j->state))) ||
        (j && seq > 0 && (seq <= j->ckpt_step || lt_api_sessions_call_settled(api, job_id, seq))))
    {
      json_object_del(o, k);
      continue;
    }
    n++;
    if (!j || !bytes) continue;
    json_t *b = json_object_get(e, "bytes");
    if (!b) json_object_set_new(e, "bytes", b = json_integer((json_int_t)lt_api_session_ckpt_bytes(api, j)));
    *bytes += (uint64_t)json_integer_value(b);
  }
  if (o && !n) lt_map_del(api->saving, tenant);
  return n;
}

/* A saving call read back from lathe.calls at seq: this API's own (the same body key), or one
 * another API process took, or one taken before this process started — counted alike, for a
 * tenant with a storage quota (while the feed catches up, for any: its tenant's record may come
 * after, and the prune drops what has no quota to count against). */
void lt_api_saving_note(lt_api_t *api, const char *tenant, const char *job_id, const char *body_key, int64_t seq) {
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), tenant);
  if (api->ready && (!t || !lt_api_storage_quota(api, t))) return; /* catching up: the tenant may come later */
  char k[LT_STORE_KEY_MAX + 1];
  if (body_key) snprintf(k, sizeof k, "%s", body_key);
  else snprintf(k, sizeof k, "%s:%lld", job_id, (long long)seq);
  json_t *o = lt_api_saving_of(api, tenant, true), *e = o ? json_object_get(o, k) : NULL;
  if (e) json_object_set_new(e, "seq", json_integer(seq));
  else if (o) json_object_set_new(o, k, json_pack("{s:s,s:I}", "job", job_id, "seq", (json_int_t)seq));
}
