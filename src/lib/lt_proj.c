/* lt_proj: decode-and-fold of the control topics into one projection (see lt_proj.h). */
#include "lt_proj.h"

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job_record.h"
#include "lt_map.h"

typedef struct orphan {
  struct orphan *next;
  char job_id[LT_ID_MAX + 1];
  lt_proj_origin_t origin;
  size_t len;
  unsigned char bytes[];
} orphan_t;

#define ORPHANS_MAX 100000

/* The newest CheckpointCommitted and StepCompleted of a job, kept as the bytes that were folded:
 * they come with every checkpoint and every step, and their JSON is wanted only when someone
 * asks for the job's side document, so it is built then (lt_proj_job_info). The buffers grow
 * to size and are reused: folding them allocates nothing (docs/STYLE.md habit 5). */
typedef struct lazy_buf {
  uint8_t *bytes;
  size_t len, cap;
  bool dirty; /* newer than what the side document shows */
} lazy_buf_t;

/* What the projection keeps of a job beside lt_job, from its JobSubmitted on. */
typedef struct info {
  json_t *doc; /* the side document (lt_proj_job_info) */
  lazy_buf_t ckpt, progress;
  lt_proj_ckpt_t *ckpts; /* every committed checkpoint, in commit order (lt_proj_job_checkpoints) */
  size_t nckpts, ckpts_cap;
} info_t;

struct lt_proj {
  const lt_avro_registry_t *reg;
  lt_avro_decoder_t *dec;
  lt_avro_decoder_t *lazy_dec; /* for lazy records: never reuses the record an apply handed out */
  lt_job_reader_t *reader;
  /* the newest schema of each other record type folded here (lt_avro_decode yields only those) */
  const lt_avro_schema_t *s_tenant, *s_step, *s_eval, *s_artifact, *s_deleted, *s_heartbeat;
  int step_job_id, step_attempt, eval_job_id, eval_attempt; /* field indexes */
  lt_job_table_t *jobs;
  lt_tenant_table_t *tenants;
  lt_map_t *info;  /* job_id -> info_t (owned) */
  json_t *workers; /* worker_id -> heartbeat */
  uint64_t applied;
  const lt_recmac_key_t *tenant_mac; /* borrowed; NULL: TenantUpserted is not checked */
  orphan_t *head, *tail; /* job records waiting for their JobSubmitted, in arrival order */
  size_t norphans;
  uint64_t dropped;
  lt_map_t *next_offset; /* "topic\npartition" -> the next offset to fold + 1 (0: none yet) */
  uint64_t redelivered;
  lt_map_t *early; /* job_id -> early_t (owned): jobs made by lt_proj_apply_early, not yet read */
  uint64_t reseeded;
};

static void release(lt_proj_t *p, const char *job_id, lt_proj_cb *cb, void *ctx);

/* Where the JobSubmitted that lt_proj_apply_early folded lies in the log. */
typedef struct early {
  int32_t partition;
  int64_t offset;
} early_t;

static void info_free(void *v) {
  info_t *in = v;
  json_decref(in->doc);
  free(in->ckpt.bytes);
  free(in->progress.bytes);
  free(in->ckpts);
  free(in);
}

void lt_proj_destroy(lt_proj_t *p) {
  if (!p) return;
  for (orphan_t *o = p->head, *nx; o; o = nx) {
    nx = o->next;
    free(o);
  }
  lt_avro_decoder_destroy(p->dec);
  lt_avro_decoder_destroy(p->lazy_dec);
  lt_job_reader_destroy(p->reader);
  lt_job_table_destroy(p->jobs);
  lt_tenant_table_destroy(p->tenants);
  lt_map_destroy(p->info);
  lt_map_destroy(p->next_offset);
  lt_map_destroy(p->early);
  json_decref(p->workers);
  free(p);
}

lt_err_t lt_proj_new(const lt_avro_registry_t *reg, lt_proj_t **out, char *errstr, size_t n) {
  lt_proj_t *p = calloc(1, sizeof *p);
  if (!p) return LT_ERR_NOMEM;
  p->reg = reg;
  lt_err_t err = lt_avro_decoder_new(reg, &p->dec, errstr, n);
  if (!err) err = lt_avro_decoder_new(reg, &p->lazy_dec, errstr, n);
  if (!err) err = lt_job_reader_new(reg, &p->reader);
  if (!err) {
    p->s_tenant = lt_avro_schema_latest(reg, "TenantUpserted");
    p->s_step = lt_avro_schema_latest(reg, "StepCompleted");
    p->s_eval = lt_avro_schema_latest(reg, "EvalCompleted");
    p->s_artifact = lt_avro_schema_latest(reg, "ArtifactPublished");
    p->s_deleted = lt_avro_schema_latest(reg, "JobDeleted");
    p->s_heartbeat = lt_avro_schema_latest(reg, "WorkerHeartbeat");
    p->step_job_id = p->s_step ? lt_avro_schema_field_index(p->s_step, "job_id") : -1;
    p->step_attempt = p->s_step ? lt_avro_schema_field_index(p->s_step, "attempt") : -1;
    p->eval_job_id = p->s_eval ? lt_avro_schema_field_index(p->s_eval, "job_id") : -1;
    p->eval_attempt = p->s_eval ? lt_avro_schema_field_index(p->s_eval, "attempt") : -1;
  }
  if (!err) err = lt_job_table_new(&p->jobs);
  if (!err) err = lt_tenant_table_new(&p->tenants);
  if (!err) {
    p->info = lt_map_new(info_free);
    p->next_offset = lt_map_new(NULL);
    p->early = lt_map_new(free);
    p->workers = json_object();
    if (!p->info || !p->next_offset || !p->early || !p->workers) err = LT_ERR_NOMEM;
  }
  if (err) {
    lt_proj_destroy(p);
    return err;
  }
  *out = p;
  return LT_OK;
}

lt_job_table_t *lt_proj_jobs(lt_proj_t *p) { return p->jobs; }
lt_tenant_table_t *lt_proj_tenants(lt_proj_t *p) { return p->tenants; }
json_t *lt_proj_workers(lt_proj_t *p) { return p->workers; }
uint64_t lt_proj_applied(const lt_proj_t *p) { return p->applied; }

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

/* Sets the side document of job_id (a JobSubmitted's; doc is taken): a new info_t, or the job's
 * with its document replaced and its lazy records kept. */
static void info_set_doc(lt_proj_t *p, const char *job_id, json_t *doc) {
  info_t *in = lt_map_get(p->info, job_id);
  if (!in) {
    in = calloc(1, sizeof *in);
    if (!in || lt_map_set(p->info, job_id, in)) {
      free(in);
      json_decref(doc);
      return;
    }
  }
  json_decref(in->doc);
  in->doc = doc;
}

/* Keeps a copy of the message; false only when out of memory: then nothing older stays pending
 * either (the caller builds the JSON now, and an older record must not overwrite it later). */
static bool lazy_keep(lazy_buf_t *b, const void *buf, size_t len) {
  if (len > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < len) cap *= 2;
    uint8_t *nb = realloc(b->bytes, cap);
    if (!nb) {
      b->dirty = false;
      return false;
    }
    b->bytes = nb;
    b->cap = cap;
  }
  memcpy(b->bytes, buf, len);
  b->len = len;
  b->dirty = true;
  return true;
}

/* The side document's "checkpoint_keys" and "checkpoint" from a CheckpointCommitted record. */
static void checkpoint_json(json_t *doc, lt_avro_record_t *rec) {
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
}

/* The side document's "progress" from a StepCompleted record. */
static void progress_json(json_t *doc, lt_avro_record_t *rec) {
  json_t *j = record_json(rec);
  if (j) json_object_set_new(doc, "progress", j);
}

/* Brings the side document up to the job's newest lazy records. */
static void lazy_build(lt_proj_t *p, info_t *in) {
  lazy_buf_t *bufs[2] = {&in->ckpt, &in->progress};
  void (*build[2])(json_t *, lt_avro_record_t *) = {checkpoint_json, progress_json};
  for (int i = 0; i < 2; i++) {
    if (!bufs[i]->dirty) continue;
    bufs[i]->dirty = false;
    lt_avro_record_t *rec = NULL;
    /* the bytes decoded when they were folded: they decode again */
    if (lt_avro_decode(p->lazy_dec, bufs[i]->bytes, bufs[i]->len, &rec, NULL, 0) == LT_OK) build[i](in->doc, rec);
  }
}

/* Adds the checkpoint ev committed to the job's list; the list doubles when full, so a job's
 * checkpoints cost an allocation now and then, not one each. */
static void ckpt_add(info_t *in, const lt_job_event_t *ev) {
  if (in->nckpts == in->ckpts_cap) {
    size_t cap = in->ckpts_cap ? 2 * in->ckpts_cap : 8;
    lt_proj_ckpt_t *grown = realloc(in->ckpts, cap * sizeof *grown);
    if (!grown) return; /* the list misses one entry; the job's state does not */
    in->ckpts = grown;
    in->ckpts_cap = cap;
  }
  in->ckpts[in->nckpts++] = (lt_proj_ckpt_t){.attempt = ev->attempt, .step = ev->step, .bytes = ev->bytes,
                                             .committed_at_ms = ev->occurred_at_ms, .final = ev->final_checkpoint};
}

const lt_proj_ckpt_t *lt_proj_job_checkpoints(lt_proj_t *p, const char *job_id, size_t *n) {
  info_t *in = job_id ? lt_map_get(p->info, job_id) : NULL;
  *n = in ? in->nckpts : 0;
  return in ? in->ckpts : NULL;
}

json_t *lt_proj_job_info(lt_proj_t *p, const char *job_id) {
  info_t *in = job_id ? lt_map_get(p->info, job_id) : NULL;
  if (!in) return NULL;
  if (in->ckpt.dirty || in->progress.dirty) lazy_build(p, in);
  return in->doc;
}

const char *lt_proj_resume_key(lt_proj_t *p, const char *job_id) {
  json_t *info = lt_proj_job_info(p, job_id);
  json_t *keys = info ? json_object_get(info, "checkpoint_keys") : NULL;
  size_t i;
  json_t *k;
  json_array_foreach(keys, i, k) {
    const char *s = json_string_value(k);
    size_t l = s ? strlen(s) : 0;
    if (l > 10 && strcmp(s + l - 10, "/state.bin") == 0) return s;
  }
  return NULL;
}

/* Progress and evaluation records of a job: only the current attempt's count (invariant 2). */
static bool current_attempt(lt_proj_t *p, lt_avro_record_t *rec, int f_job_id, int f_attempt, const char **job_id) {
  int32_t attempt = 0;
  if (lt_avro_get_string_at(rec, f_job_id, job_id, NULL) != LT_OK) return false;
  lt_avro_get_int_at(rec, f_attempt, &attempt);
  const lt_job_t *j = lt_job_get(p->jobs, *job_id);
  return j && j->attempt == attempt && lt_map_get(p->info, *job_id);
}

/* The job info's "spec": the JobSubmitted record, without its time. */
static void set_spec(json_t *doc, lt_avro_record_t *rec) {
  json_t *spec = record_json(rec);
  if (!spec) return;
  json_object_del(spec, "occurred_at");
  json_object_set_new(doc, "spec", spec);
}

/* The consumer reads a JobSubmitted (m) of a job lt_proj_apply_early made from a record further
 * on in the log: the first one read is the log's first of that id (the consumer reads a partition
 * in order), so it is the job, as a fold in log order has it. The early record itself, read in
 * its turn, only ends the watch. */
static void early_read(lt_proj_t *p, const lt_job_event_t *ev, lt_avro_record_t *rec, const lt_bus_msg_t *m) {
  early_t *e = lt_map_get(p->early, ev->job_id);
  if (!e || lt_bus_msg_partition(m) != e->partition) return;
  if (lt_bus_msg_offset(m) != e->offset && lt_job_reseed(p->jobs, ev)) {
    info_t *in = lt_map_get(p->info, ev->job_id);
    if (in) set_spec(in->doc, rec);
    p->reseeded++;
  }
  lt_map_del(p->early, ev->job_id);
}

static lt_err_t apply_job_record(lt_proj_t *p, lt_avro_record_t *rec, const void *buf, size_t len,
                                 const lt_bus_msg_t *m, lt_proj_result_t *res, char *errstr, size_t n) {
  lt_job_event_t ev;
  lt_err_t err = lt_job_event_read(p->reader, rec, &ev, errstr, n);
  if (err) return err;
  err = lt_job_apply(p->jobs, &ev, &res->job_outcome, errstr, n);
  if (err) return err;
  const lt_job_t *job = lt_job_get(p->jobs, ev.job_id);
  res->job_id = job ? job->job_id : NULL;
  if (ev.type == LT_EV_JOB_SUBMITTED && m && lt_map_count(p->early)) early_read(p, &ev, rec, m);
  if (res->job_outcome != LT_JOB_APPLIED) return LT_OK;
  assert(job); /* a record the fold applied is about a job in the table */
  if (ev.type == LT_EV_JOB_SUBMITTED) {
    json_t *doc = json_object();
    set_spec(doc, rec);
    json_object_set_new(doc, "evals", json_array());
    json_object_set_new(doc, "artifacts", json_array());
    info_set_doc(p, ev.job_id, doc);
  } else if (ev.type == LT_EV_CHECKPOINT_COMMITTED) {
    info_t *in = lt_map_get(p->info, ev.job_id);
    if (in && !lazy_keep(&in->ckpt, buf, len)) checkpoint_json(in->doc, rec); /* no room: now */
    if (in) ckpt_add(in, &ev);
  } else if (ev.type == LT_EV_JOB_DISPATCHED) {
    info_t *in = lt_map_get(p->info, ev.job_id);
    if (in) {
      in->progress.dirty = false;
      json_object_del(in->doc, "progress"); /* a new attempt starts its own progress */
    }
  }
  return LT_OK;
}

void lt_proj_require_tenant_mac(lt_proj_t *p, const lt_recmac_key_t *key) { p->tenant_mac = key; }

/* A TenantUpserted folds only with a MAC of its message under the tenants key (docs/DESIGN.md
 * §5a): anyone who can write lathe.tenants without the master key could otherwise add an API
 * key to another tenant. The previous state of the tenant stays. */
static lt_err_t tenant_checked(lt_proj_t *p, lt_avro_record_t *rec, const lt_bus_msg_t *m, char *errstr, size_t n) {
  const char *tid = NULL;
  char why[160];
  lt_avro_get_string(rec, "tenant_id", &tid, NULL);
  if (!m)
    return lt_errf(errstr, n, LT_ERR_AUTH, "TenantUpserted for tenant \"%.64s\" refused: folded without its "
                   "message, so its MAC cannot be checked", tid ? tid : "?");
  if (!lt_recmac_msg_ok(p->tenant_mac, "tenants", m, why, sizeof why))
    return lt_errf(errstr, n, LT_ERR_AUTH, "TenantUpserted for tenant \"%.64s\" refused, the tenant keeps its "
                   "previous state: %s", tid ? tid : "?", why);
  return LT_OK;
}

/* lt_proj_apply, with the message the bytes came from (NULL: bytes only). */
static lt_err_t apply_msg(lt_proj_t *p, const void *buf, size_t len, const lt_bus_msg_t *m, lt_proj_result_t *res,
                          char *errstr, size_t n) {
  lt_proj_result_t dummy;
  if (!res) res = &dummy;
  memset(res, 0, sizeof *res);
  res->message = buf;
  res->message_len = len;
  res->job_outcome = LT_JOB_IGNORED;
  lt_avro_record_t *rec = NULL;
  lt_err_t err = lt_avro_decode(p->dec, buf, len, &rec, errstr, n);
  if (err) return err;
  res->record = rec;
  res->type = lt_avro_record_type(rec);
  p->applied++;
  const lt_avro_schema_t *s = lt_avro_record_schema(rec); /* the newest version of its type */
  lt_job_event_type_t et;
  if (lt_job_reader_type(p->reader, s, &et) == LT_OK) return apply_job_record(p, rec, buf, len, m, res, errstr, n);

  const char *job_id = NULL;
  if (s == p->s_tenant) {
    lt_tenant_t t;
    if (p->tenant_mac && (err = tenant_checked(p, rec, m, errstr, n))) return err;
    if ((err = lt_tenant_from_record(rec, &t, errstr, n))) return err;
    /* Signed records are only as fresh as their signature: a principal that may write the topic,
     * without the master key, could write an older signed record again (a revoked key's, a
     * disabled tenant's) after the newer one. A process that folded the newer one keeps it; one
     * that starts after compaction removed it cannot tell (docs/THREAT_MODEL.md, T1). */
    const lt_tenant_t *cur = lt_tenant_get(p->tenants, t.tenant_id);
    if (p->tenant_mac && cur && t.updated_at_ms < cur->updated_at_ms)
      return lt_errf(errstr, n, LT_ERR_AUTH,
                     "TenantUpserted for tenant \"%.64s\" refused, the tenant keeps its state: written at %lld ms, "
                     "before the one folded (%lld ms): an older record written again",
                     t.tenant_id, (long long)t.updated_at_ms, (long long)cur->updated_at_ms);
    return lt_tenant_upsert(p->tenants, &t);
  }
  if (s == p->s_step) {
    if (current_attempt(p, rec, p->step_job_id, p->step_attempt, &job_id)) {
      info_t *in = lt_map_get(p->info, job_id);
      if (!lazy_keep(&in->progress, buf, len)) progress_json(in->doc, rec); /* no room: now */
    }
    return LT_OK;
  }
  if (s == p->s_eval) {
    if (current_attempt(p, rec, p->eval_job_id, p->eval_attempt, &job_id)) {
      info_t *in = lt_map_get(p->info, job_id);
      json_t *j = record_json(rec);
      if (j) json_array_append_new(json_object_get(in->doc, "evals"), j);
    }
    return LT_OK;
  }
  if (s == p->s_deleted) {
    /* Deleted for good: its artifacts are no longer listed, whatever comes after. */
    if (lt_avro_get_string(rec, "job_id", &job_id, NULL) != LT_OK) return LT_ERR_INVALID;
    info_t *in = lt_map_get(p->info, job_id);
    json_t *j = in ? record_json(rec) : NULL;
    if (j && !json_object_get(in->doc, "deleted")) json_object_set(in->doc, "deleted", j);
    if (in) json_object_set_new(in->doc, "artifacts", json_array());
    json_decref(j);
    return LT_OK;
  }
  if (s == p->s_artifact) {
    if (lt_avro_get_string(rec, "job_id", &job_id, NULL) != LT_OK) return LT_ERR_INVALID;
    info_t *in = lt_map_get(p->info, job_id);
    json_t *doc = in && !json_object_get(in->doc, "deleted") ? in->doc : NULL;
    json_t *j = record_json(rec);
    /* Publication is idempotent: a second record for the same job replaces, never adds. */
    if (doc && j) json_object_set_new(doc, "artifacts", json_incref(json_object_get(j, "artifacts")));
    if (doc && j) json_object_set(doc, "published", j);
    json_decref(j);
    return LT_OK;
  }
  if (s == p->s_heartbeat) {
    const char *wid;
    if (lt_avro_get_string(rec, "worker_id", &wid, NULL) != LT_OK) return LT_ERR_INVALID;
    json_t *j = NULL;
    if (lt_avro_record_to_jansson(rec, &j, NULL, 0) == LT_OK) json_object_set_new(p->workers, wid, j);
    return LT_OK;
  }
  return LT_OK;
}

lt_err_t lt_proj_apply(lt_proj_t *p, const void *buf, size_t len, lt_proj_result_t *res, char *errstr, size_t n) {
  return apply_msg(p, buf, len, NULL, res, errstr, n);
}

lt_err_t lt_proj_apply_early(lt_proj_t *p, const void *buf, size_t len, int32_t partition, int64_t offset,
                             lt_proj_cb *cb, void *ctx, lt_proj_result_t *res, char *errstr, size_t n) {
  lt_proj_result_t dummy;
  if (!res) res = &dummy;
  lt_err_t err = apply_msg(p, buf, len, NULL, res, errstr, n);
  if (err) return err;
  if (cb) cb(ctx, res);
  if (offset < 0 || !res->job_id || res->job_outcome != LT_JOB_APPLIED || !res->type ||
      strcmp(res->type, "JobSubmitted") != 0)
    return LT_OK;
  early_t *e = malloc(sizeof *e);
  if (!e) return LT_ERR_NOMEM;
  *e = (early_t){partition, offset};
  char id[LT_ID_MAX + 1];
  snprintf(id, sizeof id, "%s", res->job_id);
  if (lt_map_set(p->early, id, e)) {
    free(e);
    return LT_ERR_NOMEM;
  }
  /* The job's records the consumer read before it knew the job: the log's JobSubmitted, read
   * later, folds as a duplicate and would release nothing. (Each apply reuses the decoder: res's
   * record is not the early one's after this.) */
  if (p->norphans) release(p, id, cb, ctx);
  return LT_OK;
}

uint64_t lt_proj_reseeded(const lt_proj_t *p) { return p->reseeded; }

/* The orphan list is bounded, and its ends and count agree. */
static bool orphans_ok(const lt_proj_t *p) {
  return p->norphans <= ORPHANS_MAX && (p->norphans == 0) == (p->head == NULL) &&
         (p->head == NULL) == (p->tail == NULL) && (!p->tail || !p->tail->next);
}

size_t lt_proj_orphans(const lt_proj_t *p, uint64_t *dropped) {
  if (dropped) *dropped = p->dropped;
  return p->norphans;
}

static void keep_aside(lt_proj_t *p, const char *job_id, const lt_proj_origin_t *origin, const void *buf, size_t len) {
  if (p->norphans >= ORPHANS_MAX) { /* drop the oldest: bounded memory */
    orphan_t *o = p->head;
    p->head = o->next;
    if (!p->head) p->tail = NULL;
    free(o);
    p->norphans--;
    p->dropped++;
  }
  orphan_t *o = malloc(sizeof *o + len);
  if (!o || strlen(job_id) > LT_ID_MAX) {
    free(o);
    p->dropped++;
    return;
  }
  o->next = NULL;
  snprintf(o->job_id, sizeof o->job_id, "%s", job_id);
  o->origin = *origin;
  o->len = len;
  memcpy(o->bytes, buf, len);
  if (p->tail) p->tail->next = o;
  else p->head = o;
  p->tail = o;
  p->norphans++;
  assert(orphans_ok(p));
}

/* Applies, in arrival order, every record kept aside for job_id. */
static void release(lt_proj_t *p, const char *job_id, lt_proj_cb *cb, void *ctx) {
  char id[LT_ID_MAX + 1];
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
    if (lt_proj_apply(p, o->bytes, o->len, &res, NULL, 0) == LT_OK && cb) {
      res.origin = o->origin;
      cb(ctx, &res);
    }
    free(o);
  }
  assert(orphans_ok(p));
}

/* lt_proj_fold_at, with the message the bytes came from (NULL: bytes only). */
static lt_err_t fold(lt_proj_t *p, const void *buf, size_t len, const lt_bus_msg_t *m, const lt_proj_origin_t *origin,
                     lt_proj_cb *cb, void *ctx, char *errstr, size_t n) {
  static const lt_proj_origin_t none;
  if (!origin) origin = &none;
  lt_proj_result_t res;
  lt_err_t err = apply_msg(p, buf, len, m, &res, errstr, n);
  if (err) return err;
  res.origin = *origin;
  const char *job_id = NULL;
  bool unknown_publication = res.type &&
                             (strcmp(res.type, "ArtifactPublished") == 0 || strcmp(res.type, "JobDeleted") == 0) &&
                             lt_avro_get_string(res.record, "job_id", &job_id, NULL) == LT_OK &&
                             !lt_proj_job_info(p, job_id);
  if ((res.job_outcome == LT_JOB_UNKNOWN_JOB || unknown_publication) && res.record) {
    if (lt_avro_get_string(res.record, "job_id", &job_id, NULL) == LT_OK && job_id && *job_id)
      keep_aside(p, job_id, origin, buf, len);
    return LT_OK;
  }
  if (cb) cb(ctx, &res);
  if (p->norphans && res.type && res.job_id && res.job_outcome == LT_JOB_APPLIED && strcmp(res.type, "JobSubmitted") == 0)
    release(p, res.job_id, cb, ctx);
  return LT_OK;
}

lt_err_t lt_proj_fold_at(lt_proj_t *p, const void *buf, size_t len, const lt_proj_origin_t *origin, lt_proj_cb *cb,
                         void *ctx, char *errstr, size_t n) {
  return fold(p, buf, len, NULL, origin, cb, ctx, errstr, n);
}

lt_err_t lt_proj_fold_msg(lt_proj_t *p, const lt_bus_msg_t *m, const lt_proj_origin_t *origin, lt_proj_cb *cb,
                          void *ctx, char *errstr, size_t n) {
  /* A partition read again from an earlier offset (a consumer whose offset was reset after a broker
   * restart rereads from the beginning) folds nothing twice. */
  char key[300];
  snprintf(key, sizeof key, "%s\n%d", lt_bus_msg_topic(m), (int)lt_bus_msg_partition(m));
  int64_t off = lt_bus_msg_offset(m);
  uintptr_t next = (uintptr_t)lt_map_get(p->next_offset, key);
  if (off >= 0 && next && off + 1 < (int64_t)next) {
    p->redelivered++;
    return LT_OK;
  }
  if (off >= 0 && lt_map_set(p->next_offset, key, (void *)(uintptr_t)(off + 2)))
    return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  size_t len = 0;
  const void *v = lt_bus_msg_value(m, &len);
  if (!v) return LT_OK; /* a tombstone on a compacted topic */
  return fold(p, v, len, m, origin, cb, ctx, errstr, n);
}

uint64_t lt_proj_redelivered(const lt_proj_t *p) { return p->redelivered; }

static bool add_line(const lt_job_t *j, void *ctx) {
  char line[2048];
  lt_job_line(j, line, sizeof line);
  size_t n = strlen(line);
  if (n && line[n - 1] == '\n') line[n - 1] = '\0';
  return json_array_append_new(ctx, json_string(line)) == 0;
}

json_t *lt_proj_job_lines(lt_proj_t *p) {
  json_t *a = json_array();
  if (a) lt_job_foreach(p->jobs, add_line, a);
  return a;
}

lt_err_t lt_proj_fold(lt_proj_t *p, const void *buf, size_t len, lt_proj_cb *cb, void *ctx, char *errstr, size_t n) {
  return lt_proj_fold_at(p, buf, len, NULL, cb, ctx, errstr, n);
}
