/* lt_proj: decode-and-fold of the control topics into one projection (see lt_proj.h). */
#include "lt_proj.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job_record.h"

typedef struct orphan {
  struct orphan *next;
  char job_id[LT_JOB_ID_MAX];
  size_t len;
  unsigned char bytes[];
} orphan_t;

#define ORPHANS_MAX 100000

struct lt_proj {
  const lt_avro_registry_t *reg;
  lt_avro_decoder_t *dec;
  lt_job_table_t *jobs;
  lt_tenant_table_t *tenants;
  json_t *info;    /* job_id -> side document */
  json_t *workers; /* worker_id -> heartbeat */
  uint64_t applied;
  orphan_t *head, *tail; /* job records waiting for their JobSubmitted, in arrival order */
  size_t norphans;
  uint64_t dropped;
};

lt_err_t lt_proj_new(const lt_avro_registry_t *reg, lt_proj_t **out, char *errstr, size_t n) {
  lt_proj_t *p = calloc(1, sizeof *p);
  if (!p) return LT_ERR_NOMEM;
  p->reg = reg;
  lt_err_t err = lt_avro_decoder_new(reg, &p->dec, errstr, n);
  if (!err) err = lt_job_table_new(&p->jobs);
  if (!err) err = lt_tenant_table_new(&p->tenants);
  if (!err) {
    p->info = json_object();
    p->workers = json_object();
    if (!p->info || !p->workers) err = LT_ERR_NOMEM;
  }
  if (err) {
    lt_proj_destroy(p);
    return err;
  }
  *out = p;
  return LT_OK;
}

void lt_proj_destroy(lt_proj_t *p) {
  if (!p) return;
  for (orphan_t *o = p->head, *nx; o; o = nx) {
    nx = o->next;
    free(o);
  }
  lt_avro_decoder_destroy(p->dec);
  lt_job_table_destroy(p->jobs);
  lt_tenant_table_destroy(p->tenants);
  json_decref(p->info);
  json_decref(p->workers);
  free(p);
}

lt_job_table_t *lt_proj_jobs(lt_proj_t *p) { return p->jobs; }
lt_tenant_table_t *lt_proj_tenants(lt_proj_t *p) { return p->tenants; }
json_t *lt_proj_workers(lt_proj_t *p) { return p->workers; }
uint64_t lt_proj_applied(const lt_proj_t *p) { return p->applied; }

json_t *lt_proj_job_info(lt_proj_t *p, const char *job_id) {
  return job_id ? json_object_get(p->info, job_id) : NULL;
}

/* The record without the envelope fields every record has. */
static json_t *record_json(lt_avro_record_t *rec) {
  json_t *j = NULL;
  if (lt_avro_record_to_jansson(rec, &j, NULL, 0) != LT_OK) return NULL;
  json_object_del(j, "event_id");
  json_object_del(j, "producer");
  json_object_del(j, "job_id");
  json_object_del(j, "tenant_id");
  return j;
}

/* Progress and evaluation records of a job: only the current attempt's count (invariant 2). */
static bool current_attempt(lt_proj_t *p, lt_avro_record_t *rec, const char **job_id) {
  int32_t attempt = 0;
  if (lt_avro_get_string(rec, "job_id", job_id, NULL) != LT_OK) return false;
  lt_avro_get_int(rec, "attempt", &attempt);
  const lt_job_t *j = lt_job_get(p->jobs, *job_id);
  return j && j->attempt == attempt && json_object_get(p->info, *job_id);
}

static lt_err_t apply_job_record(lt_proj_t *p, lt_avro_record_t *rec, lt_proj_result_t *res, char *errstr,
                                 size_t n) {
  lt_job_event_t ev;
  lt_err_t err = lt_job_event_from_record(rec, &ev, errstr, n);
  if (err) return err;
  err = lt_job_apply(p->jobs, &ev, &res->job_outcome, errstr, n);
  if (err) return err;
  res->job_id = lt_job_get(p->jobs, ev.job_id) ? lt_job_get(p->jobs, ev.job_id)->job_id : NULL;
  if (res->job_outcome != LT_JOB_APPLIED) return LT_OK;
  if (ev.type == LT_EV_JOB_SUBMITTED) {
    json_t *doc = json_object();
    json_t *spec = record_json(rec);
    if (spec) {
      json_object_del(spec, "occurred_at");
      json_object_set_new(doc, "spec", spec);
    }
    json_object_set_new(doc, "evals", json_array());
    json_object_set_new(doc, "artifacts", json_array());
    json_object_set(p->info, ev.job_id, doc);
    json_decref(doc);
  } else if (ev.type == LT_EV_CHECKPOINT_COMMITTED) {
    json_t *doc = json_object_get(p->info, ev.job_id);
    json_t *keys = NULL;
    json_t *all = record_json(rec);
    const char *eid = NULL;
    if (all && lt_avro_get_string(rec, "event_id", &eid, NULL) == LT_OK)
      json_object_set_new(all, "event_id", json_string(eid)); /* JobCompleted names the commit by it */
    if (all) keys = json_incref(json_object_get(all, "object_keys"));
    if (doc && keys) json_object_set_new(doc, "checkpoint_keys", keys);
    else json_decref(keys);
    if (doc && all) json_object_set(doc, "checkpoint", all);
    json_decref(all);
  } else if (ev.type == LT_EV_JOB_DISPATCHED) {
    json_t *doc = json_object_get(p->info, ev.job_id);
    if (doc) json_object_del(doc, "progress"); /* a new attempt starts its own progress */
  }
  return LT_OK;
}

lt_err_t lt_proj_apply(lt_proj_t *p, const void *buf, size_t len, lt_proj_result_t *res, char *errstr, size_t n) {
  lt_proj_result_t dummy;
  if (!res) res = &dummy;
  memset(res, 0, sizeof *res);
  res->job_outcome = LT_JOB_IGNORED;
  lt_avro_record_t *rec = NULL;
  lt_err_t err = lt_avro_decode(p->dec, buf, len, &rec, errstr, n);
  if (err) return err;
  res->record = rec;
  res->type = lt_avro_record_type(rec);
  p->applied++;
  lt_job_event_type_t et;
  if (lt_job_event_type_parse(res->type, &et) == LT_OK) return apply_job_record(p, rec, res, errstr, n);

  const char *job_id = NULL;
  if (strcmp(res->type, "TenantUpserted") == 0) {
    lt_tenant_t t;
    if ((err = lt_tenant_from_record(rec, &t, errstr, n))) return err;
    return lt_tenant_upsert(p->tenants, &t);
  }
  if (strcmp(res->type, "StepCompleted") == 0) {
    if (current_attempt(p, rec, &job_id)) {
      json_t *j = record_json(rec);
      if (j) json_object_set_new(json_object_get(p->info, job_id), "progress", j);
    }
    return LT_OK;
  }
  if (strcmp(res->type, "EvalCompleted") == 0) {
    if (current_attempt(p, rec, &job_id)) {
      json_t *j = record_json(rec);
      if (j) json_array_append_new(json_object_get(json_object_get(p->info, job_id), "evals"), j);
    }
    return LT_OK;
  }
  if (strcmp(res->type, "ArtifactPublished") == 0) {
    if (lt_avro_get_string(rec, "job_id", &job_id, NULL) != LT_OK) return LT_ERR_INVALID;
    json_t *doc = json_object_get(p->info, job_id);
    json_t *j = record_json(rec);
    /* Publication is idempotent: a second record for the same job replaces, never adds. */
    if (doc && j) json_object_set_new(doc, "artifacts", json_incref(json_object_get(j, "artifacts")));
    if (doc && j) json_object_set(doc, "published", j);
    json_decref(j);
    return LT_OK;
  }
  if (strcmp(res->type, "WorkerHeartbeat") == 0) {
    const char *wid;
    if (lt_avro_get_string(rec, "worker_id", &wid, NULL) != LT_OK) return LT_ERR_INVALID;
    json_t *j = NULL;
    if (lt_avro_record_to_jansson(rec, &j, NULL, 0) == LT_OK) json_object_set_new(p->workers, wid, j);
    return LT_OK;
  }
  return LT_OK;
}

size_t lt_proj_orphans(const lt_proj_t *p, uint64_t *dropped) {
  if (dropped) *dropped = p->dropped;
  return p->norphans;
}

static void keep_aside(lt_proj_t *p, const char *job_id, const void *buf, size_t len) {
  if (p->norphans >= ORPHANS_MAX) { /* drop the oldest: bounded memory */
    orphan_t *o = p->head;
    p->head = o->next;
    if (!p->head) p->tail = NULL;
    free(o);
    p->norphans--;
    p->dropped++;
  }
  orphan_t *o = malloc(sizeof *o + len);
  if (!o || strlen(job_id) >= LT_JOB_ID_MAX) {
    free(o);
    p->dropped++;
    return;
  }
  o->next = NULL;
  snprintf(o->job_id, sizeof o->job_id, "%s", job_id);
  o->len = len;
  memcpy(o->bytes, buf, len);
  if (p->tail) p->tail->next = o;
  else p->head = o;
  p->tail = o;
  p->norphans++;
}

/* Applies, in arrival order, every record kept aside for job_id. */
static void release(lt_proj_t *p, const char *job_id, lt_proj_cb *cb, void *ctx) {
  char id[LT_JOB_ID_MAX];
  snprintf(id, sizeof id, "%s", job_id); /* job_id points into a record the applies reuse */
  orphan_t **pp = &p->head, *prev = NULL;
  while (*pp) {
    orphan_t *o = *pp;
    if (strcmp(o->job_id, id) != 0) {
      prev = o;
      pp = &o->next;
      continue;
    }
    *pp = o->next;
    if (p->tail == o) p->tail = prev;
    p->norphans--;
    lt_proj_result_t res;
    if (lt_proj_apply(p, o->bytes, o->len, &res, NULL, 0) == LT_OK && cb) cb(ctx, &res);
    free(o);
  }
}

lt_err_t lt_proj_fold(lt_proj_t *p, const void *buf, size_t len, lt_proj_cb *cb, void *ctx, char *errstr, size_t n) {
  lt_proj_result_t res;
  lt_err_t err = lt_proj_apply(p, buf, len, &res, errstr, n);
  if (err) return err;
  if (res.job_outcome == LT_JOB_UNKNOWN_JOB && res.record) {
    const char *job_id = NULL;
    if (lt_avro_get_string(res.record, "job_id", &job_id, NULL) == LT_OK && job_id && *job_id)
      keep_aside(p, job_id, buf, len);
    return LT_OK;
  }
  if (cb) cb(ctx, &res);
  if (p->norphans && res.type && res.job_id && res.job_outcome == LT_JOB_APPLIED && strcmp(res.type, "JobSubmitted") == 0)
    release(p, res.job_id, cb, ctx);
  return LT_OK;
}
