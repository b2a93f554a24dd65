/* lt_scheduler: `lathed scheduler` — group leadership, the fold, lt_sched and the records it
 * writes in transactions (see lt_scheduler.h for the contract).
 *
 * Everything a term of leadership needs (producer, fold consumer, projection, policy, per-job and
 * per-worker tables) is created when this instance starts leading and thrown away when it stops:
 * a new term rebuilds all of it from the log, so nothing survives that the log does not say. */
#include "lt_scheduler.h"

#include "lt_dataset.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lt_job_record.h"
#include "lt_jobspec.h"
#include "lt_tenant.h"
#include "lt_time.h"

enum { T_JOBS = 0, T_CONTROL, T_WORKERS, T_TENANTS, T_NFOLD };
enum { O_CONTROL = 0, O_DISPATCH0, O_DEADLETTER = O_DISPATCH0 + LT_CLASS__COUNT, O_N };
#define MAX_TPS 256
#define MAX_MODELS 16
#define DECIDE_CAP 256
#define FILLER_TENANT (UINT64_MAX - 1)
#define FILLER_JOB0 (UINT64_MAX / 2)

/* Per-job bookkeeping of a term. The first part is derived from folded records (so it is rebuilt
 * by replay); the w_* part remembers what this term wrote and has not read back yet. */
typedef struct side {
  char job_id[LT_JOB_ID_MAX];
  char submitted_event_id[40];
  char cancel_event_id[40];
  char requested_by[64];
  char ckpt_event_id[40];
  lt_jobspec_t spec;
  lt_err_t spec_err;
  char spec_field[96];
  char spec_msg[256];
  int64_t first_seen_ms;
  int64_t dispatched_at_ms; /* current attempt's JobDispatched */
  int64_t lease_deadline_ms; /* newest known for the current attempt */
  /* this term's writes */
  int32_t w_dispatch_attempt;
  int32_t w_lost_attempt;
  int32_t w_preempt_attempt;
  int32_t redispatch_for;
  bool w_decided, w_terminal;
  /* lt_sched's view */
  bool in_sched, sched_running, dirty;
  uint32_t sched_worker;
} side_t;

typedef struct worker {
  char id[LT_JOB_ID_MAX];
  uint32_t slots;
  uint64_t mem;
  int64_t last_hb_ms;
  bool draining, up;
  int nmodels;
  char models[MAX_MODELS][LT_JOB_NAME_MAX];
  bool models_changed;
} worker_t;

typedef struct out_rec {
  int topic;
  char key[LT_JOB_ID_MAX];
  bool has_key;
  void *bytes;
  size_t len;
  int32_t partition; /* LT_BUS_PARTITION_ANY, or the one a dispatch must reach */
} out_rec_t;

struct lt_scheduler {
  struct event_base *base;
  lt_scheduler_conf_t conf;
  char producer_id[160], txn_id[200], group_id[200];
  lt_sched_config_t policy;
  char fold_topics[T_NFOLD][200];
  char out_topics[O_N][200];
  /* membership */
  lt_bus_consumer_t *group;
  struct event *group_ev, *tick_ev;
  bool own_p0, fenced;
  lt_scheduler_role_t role;
  lt_scheduler_stats_t st;
  /* the term */
  lt_bus_producer_t *prod;
  lt_bus_consumer_t *fold_c;
  struct event *fold_ev;
  lt_proj_t *fold;
  lt_sched_t *sched;
  lt_avro_record_t *rec[8];
  side_t **sides;
  size_t nsides, capsides;
  json_t *side_idx;   /* job_id -> index */
  worker_t *workers;
  size_t nworkers, capworkers;
  json_t *worker_idx; /* worker_id -> index */
  json_t *tenant_ids; /* tenant_id -> lt_sched id */
  char **tenant_names;
  size_t ntenants, captenants;
  lt_bus_tp_t tps[MAX_TPS];
  int64_t next[MAX_TPS], committed[MAX_TPS], hwm[MAX_TPS];
  size_t ntps;
  int tp_base[T_NFOLD], tp_count[T_NFOLD];
  int64_t last_msg_ms, catchup_since_ms, last_scan_ms;
  double now_s;
  out_rec_t *out;
  size_t nout, capout;
  bool offsets_dirty;
};

static const char *const rec_types[] = {"JobAccepted",  "JobRejected",    "JobDispatched", "PreemptRequested",
                                        "JobFailed",    "JobCancelled",   "AttemptStopped", "DeadLetter"};
enum { R_ACC, R_REJ, R_DISP, R_PRE, R_FAIL, R_CANC, R_STOP, R_DEAD };

static void stop_leading(lt_scheduler_t *s, const char *why);

/* ---------------------------------------------------------------- small tables */

static side_t *side_get(lt_scheduler_t *s, const char *job_id, bool add, size_t *idx_out) {
  json_t *v = json_object_get(s->side_idx, job_id);
  if (v) {
    size_t i = (size_t)json_integer_value(v);
    if (idx_out) *idx_out = i;
    return s->sides[i];
  }
  if (!add) return NULL;
  if (s->nsides == s->capsides) {
    size_t cap = s->capsides ? s->capsides * 2 : 1024;
    side_t **n = realloc(s->sides, cap * sizeof *n);
    if (!n) return NULL;
    s->sides = n;
    s->capsides = cap;
  }
  side_t *sd = calloc(1, sizeof *sd);
  if (!sd) return NULL;
  snprintf(sd->job_id, sizeof sd->job_id, "%s", job_id);
  sd->first_seen_ms = lt_time_wall_ms();
  sd->spec_err = LT_ERR_INVALID;
  snprintf(sd->spec_msg, sizeof sd->spec_msg, "the submission was not read");
  s->sides[s->nsides] = sd;
  json_object_set_new(s->side_idx, job_id, json_integer((json_int_t)s->nsides));
  if (idx_out) *idx_out = s->nsides;
  s->nsides++;
  return sd;
}

static worker_t *worker_get(lt_scheduler_t *s, const char *id, size_t *idx_out) {
  json_t *v = json_object_get(s->worker_idx, id);
  if (v) {
    *idx_out = (size_t)json_integer_value(v);
    return &s->workers[*idx_out];
  }
  if (s->nworkers == s->capworkers) {
    size_t cap = s->capworkers ? s->capworkers * 2 : 64;
    worker_t *n = realloc(s->workers, cap * sizeof *n);
    if (!n) return NULL;
    s->workers = n;
    s->capworkers = cap;
  }
  worker_t *w = &s->workers[s->nworkers];
  memset(w, 0, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", id);
  json_object_set_new(s->worker_idx, id, json_integer((json_int_t)s->nworkers));
  *idx_out = s->nworkers++;
  return w;
}

/* lt_sched id of a tenant name (1-based), adding it. */
static uint64_t tenant_id64(lt_scheduler_t *s, const char *name) {
  json_t *v = json_object_get(s->tenant_ids, name);
  if (v) return (uint64_t)json_integer_value(v);
  if (s->ntenants == s->captenants) {
    size_t cap = s->captenants ? s->captenants * 2 : 64;
    char **n = realloc(s->tenant_names, cap * sizeof *n);
    if (!n) return 0;
    s->tenant_names = n;
    s->captenants = cap;
  }
  s->tenant_names[s->ntenants] = strdup(name);
  json_object_set_new(s->tenant_ids, name, json_integer((json_int_t)s->ntenants + 1));
  return ++s->ntenants;
}

/* ---------------------------------------------------------------- output batch */

static lt_err_t emit(lt_scheduler_t *s, int topic, const char *key, const void *key_bytes, size_t key_len,
                     lt_avro_record_t *rec) {
  const uint8_t *bytes;
  size_t len;
  char err[256];
  lt_err_t e = lt_avro_record_encode(rec, &bytes, &len, err, sizeof err);
  if (e) {
    fprintf(stderr, "lathed scheduler: cannot encode %s: %s\n", lt_avro_record_type(rec), err);
    return e;
  }
  if (s->nout == s->capout) {
    size_t cap = s->capout ? s->capout * 2 : 64;
    out_rec_t *n = realloc(s->out, cap * sizeof *n);
    if (!n) return LT_ERR_NOMEM;
    s->out = n;
    s->capout = cap;
  }
  out_rec_t *o = &s->out[s->nout];
  memset(o, 0, sizeof *o);
  o->topic = topic;
  o->partition = LT_BUS_PARTITION_ANY;
  if (key) {
    snprintf(o->key, sizeof o->key, "%s", key);
    o->has_key = true;
  } else if (key_bytes && key_len) {
    size_t k = key_len < sizeof o->key - 1 ? key_len : sizeof o->key - 1;
    memcpy(o->key, key_bytes, k);
    o->key[k] = '\0';
    o->has_key = true;
  }
  o->bytes = malloc(len);
  if (!o->bytes) return LT_ERR_NOMEM;
  memcpy(o->bytes, bytes, len);
  o->len = len;
  s->nout++;
  return LT_OK;
}

static void out_clear(lt_scheduler_t *s) {
  for (size_t i = 0; i < s->nout; i++) free(s->out[i].bytes);
  s->nout = 0;
}

/* One transaction: the batch and the fold's offsets of every partition it consumed. */
static void flush_batch(lt_scheduler_t *s) {
  if (!s->prod || (s->nout == 0 && !s->offsets_dirty)) return;
  if (s->nout == 0) return; /* offsets alone ride with the next batch */
  char err[512];
  lt_err_t e = lt_bus_txn_begin(s->prod, err, sizeof err);
  for (size_t i = 0; !e && i < s->nout; i++) {
    out_rec_t *o = &s->out[i];
    lt_bus_record_t r = {.topic = s->out_topics[o->topic],
                         .partition = o->partition,
                         .key = o->has_key ? o->key : NULL,
                         .key_size = o->has_key ? strlen(o->key) : 0,
                         .value = o->bytes,
                         .value_size = o->len};
    e = lt_bus_produce(s->prod, &r, NULL, err, sizeof err);
  }
  lt_bus_tp_t offs[MAX_TPS];
  size_t no = 0;
  for (size_t i = 0; i < s->ntps; i++)
    if (s->next[i] > s->committed[i] && s->next[i] >= 0)
      offs[no++] = (lt_bus_tp_t){.topic = s->tps[i].topic, .partition = s->tps[i].partition, .offset = s->next[i]};
  if (!e && no) e = lt_bus_txn_send_offsets(s->prod, s->group, offs, no, 10000, err, sizeof err);
  if (!e) e = lt_bus_txn_commit(s->prod, 30000, err, sizeof err);
  if (!e) {
    s->st.txns++;
    for (size_t i = 0; i < s->ntps; i++)
      if (s->next[i] > s->committed[i]) s->committed[i] = s->next[i];
    s->offsets_dirty = false;
    out_clear(s);
    return;
  }
  s->st.txn_failures++;
  out_clear(s);
  if (e == LT_ERR_FENCED) {
    s->fenced = true;
    s->st.fenced = true;
    stop_leading(s, err);
    return;
  }
  /* Aborted or unknown: throw the term away; the next one rebuilds from the log. */
  stop_leading(s, err);
}

/* ---------------------------------------------------------------- record writers */

static lt_avro_record_t *begin_rec(lt_scheduler_t *s, int r, const side_t *sd, const lt_job_t *j) {
  lt_avro_record_t *rec = s->rec[r];
  lt_avro_record_clear(rec);
  lt_avro_record_stamp(rec, s->producer_id);
  if (sd) lt_avro_set_string(rec, "job_id", sd->job_id);
  if (j) lt_avro_set_string(rec, "tenant_id", j->tenant_id);
  return rec;
}

static void write_accept(lt_scheduler_t *s, side_t *sd, const lt_job_t *j) {
  lt_avro_record_t *rec = begin_rec(s, R_ACC, sd, j);
  lt_avro_set_string(rec, "submitted_event_id", sd->submitted_event_id);
  lt_avro_set_enum(rec, "priority", lt_job_class_name(sd->spec.priority));
  lt_avro_set_int(rec, "gpus", sd->spec.gpus);
  lt_avro_set_long(rec, "max_duration_s", sd->spec.max_duration_s);
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.accepted++;
  sd->w_decided = true;
}

static void write_reject(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, const char *code, const char *field,
                         const char *reason) {
  lt_avro_record_t *rec = begin_rec(s, R_REJ, sd, j);
  lt_avro_set_string(rec, "submitted_event_id", sd->submitted_event_id);
  lt_avro_set_string(rec, "code", code);
  lt_avro_set_string(rec, "reason", reason);
  if (field && *field) lt_avro_set_string(rec, "field", field);
  else lt_avro_set_null(rec, "field");
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.rejected++;
  sd->w_decided = true;
}

static void write_failed(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, const char *code, const char *reason) {
  lt_avro_record_t *rec = begin_rec(s, R_FAIL, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "code", code);
  lt_avro_set_string(rec, "reason", reason);
  lt_avro_set_int(rec, "attempts", j->attempt);
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.failed++;
  sd->w_terminal = true;
}

static void write_cancelled(lt_scheduler_t *s, side_t *sd, const lt_job_t *j) {
  lt_avro_record_t *rec = begin_rec(s, R_CANC, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "cancel_event_id", sd->cancel_event_id);
  lt_avro_set_string(rec, "requested_by", sd->requested_by[0] ? sd->requested_by : "customer");
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.cancelled++;
  sd->w_terminal = true;
}

static void write_lost(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, int64_t deadline) {
  lt_avro_record_t *rec = begin_rec(s, R_STOP, sd, j);
  char detail[256];
  snprintf(detail, sizeof detail, "lease of attempt %d on worker %s expired at %" PRId64 " ms and was not renewed",
           (int)j->attempt, j->worker_id[0] ? j->worker_id : "(none)", deadline);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_enum(rec, "reason", "lost");
  lt_avro_set_long(rec, "step", j->ckpt_attempt ? j->ckpt_step : 0);
  lt_avro_set_bool(rec, "killed", false);
  lt_avro_set_string(rec, "detail", detail);
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.lost++;
  sd->w_lost_attempt = j->attempt;
}

static void write_preempt(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, int64_t now_ms) {
  lt_avro_record_t *rec = begin_rec(s, R_PRE, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "reason", "a higher priority class is waiting: checkpoint and stop");
  lt_avro_set_long(rec, "checkpoint_deadline", now_ms + s->conf.checkpoint_deadline_ms);
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.preempted++;
  sd->w_preempt_attempt = j->attempt;
}

/* The dispatch must land on a partition the chosen worker owns in the workers' group: its latest
 * heartbeat lists them. Without one (no heartbeat yet) the key hash decides. */
static int32_t dispatch_partition(lt_scheduler_t *s, const char *worker, const char *topic) {
  json_t *hb = json_object_get(lt_proj_workers(s->fold), worker);
  json_t *owned = hb ? json_object_get(hb, "owned_partitions") : NULL;
  size_t i;
  json_t *p;
  json_array_foreach(owned, i, p) {
    const char *t = json_string_value(json_object_get(p, "topic"));
    if (t && strcmp(t, topic) == 0) return (int32_t)json_integer_value(json_object_get(p, "partition"));
  }
  return LT_BUS_PARTITION_ANY;
}

static bool write_dispatch(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, const char *worker, int64_t now_ms) {
  int32_t attempt = (j->attempt > sd->w_dispatch_attempt ? j->attempt : sd->w_dispatch_attempt) + 1;
  lt_avro_record_t *rec = begin_rec(s, R_DISP, sd, j);
  char err[256];
  if (lt_jobspec_to_record(&sd->spec, rec, err, sizeof err) != LT_OK) {
    fprintf(stderr, "lathed scheduler: job %s: %s\n", sd->job_id, err);
    return false;
  }
  lt_avro_set_int(rec, "attempt", attempt);
  lt_avro_set_string(rec, "worker_id", worker);
  lt_avro_set_long(rec, "memory_bytes", 0);
  lt_avro_set_long(rec, "lease_ms", s->conf.lease_ms);
  lt_avro_set_long(rec, "lease_deadline", now_ms + s->conf.lease_ms);
  if (j->ckpt_attempt > 0 && j->ckpt_key[0]) {
    lt_avro_set_long(rec, "resume_step", j->ckpt_step);
    if (sd->ckpt_event_id[0]) lt_avro_set_string(rec, "resume_checkpoint_event_id", sd->ckpt_event_id);
  }
  if (emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) != LT_OK) return false;
  if (emit(s, O_DISPATCH0 + (int)sd->spec.priority, sd->job_id, NULL, 0, rec) != LT_OK) return false;
  s->out[s->nout - 1].partition = dispatch_partition(s, worker, s->out_topics[O_DISPATCH0 + (int)sd->spec.priority]);
  sd->w_dispatch_attempt = attempt;
  s->st.dispatched++;
  return true;
}

static void write_deadletter(lt_scheduler_t *s, const lt_bus_msg_t *m, lt_err_t code, const char *reason) {
  lt_avro_record_t *rec = begin_rec(s, R_DEAD, NULL, NULL);
  size_t klen = 0, vlen = 0;
  const void *key = lt_bus_msg_key(m, &klen);
  const void *val = lt_bus_msg_value(m, &vlen);
  lt_avro_set_string(rec, "topic", lt_bus_msg_topic(m));
  lt_avro_set_int(rec, "partition", lt_bus_msg_partition(m));
  lt_avro_set_long(rec, "offset", lt_bus_msg_offset(m));
  if (key) lt_avro_set_bytes(rec, "key", key, klen);
  else lt_avro_set_null(rec, "key");
  lt_avro_set_bytes(rec, "payload", val ? val : "", vlen);
  uint64_t fp;
  char hex[17];
  if (val && lt_avro_peek(val, vlen, &fp, NULL, 0) == LT_OK) {
    lt_avro_fingerprint_hex(fp, hex);
    lt_avro_set_string(rec, "fingerprint", hex);
  } else {
    lt_avro_set_null(rec, "fingerprint");
  }
  lt_avro_set_string(rec, "error_code", lt_err_name(code));
  lt_avro_set_string(rec, "reason", reason);
  lt_avro_set_string(rec, "consumer", s->producer_id);
  if (emit(s, O_DEADLETTER, NULL, key, klen, rec) == LT_OK) s->st.deadlettered++;
}

/* ---------------------------------------------------------------- lt_sched bookkeeping */

static uint64_t tenant_into_sched(lt_scheduler_t *s, const char *tenant, bool placing) {
  uint64_t id = tenant_id64(s, tenant);
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(s->fold), tenant);
  lt_sched_tenant_t st = {.id = id, .weight = t && t->weight > 0 ? t->weight : 1.0};
  if (t && !placing && t->quotas.max_running_slots > 0) st.max_running_slots = (uint32_t)t->quotas.max_running_slots;
  /* max_queued_jobs is counted by the API before it accepts; durations are enforced here. */
  lt_sched_tenant_upsert(s->sched, &st, NULL, 0);
  return id;
}

static bool sched_enqueue(lt_scheduler_t *s, size_t idx, int32_t attempt, lt_job_class_t cls) {
  side_t *sd = s->sides[idx];
  const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
  if (!j) return false;
  uint32_t model = LT_SCHED_NO_MODEL;
  if (j->base_model[0]) lt_sched_model_intern(s->sched, j->base_model, &model, NULL, 0);
  lt_sched_job_t sj = {.id = idx + 1,
                       .tenant_id = tenant_into_sched(s, j->tenant_id, false),
                       .cls = cls,
                       .gpus = j->gpus > 0 ? (uint32_t)j->gpus : 1,
                       .model = model,
                       .attempt = attempt > 0 ? (uint32_t)attempt : 0};
  char err[256];
  if (lt_sched_job_enqueue(s->sched, &sj, s->now_s, err, sizeof err) != LT_OK) return false;
  sd->in_sched = true;
  sd->sched_running = false;
  return true;
}

static void sched_drop(lt_scheduler_t *s, side_t *sd) {
  if (!sd->in_sched) return;
  size_t idx;
  side_get(s, sd->job_id, false, &idx);
  lt_sched_job_finished(s->sched, idx + 1, s->now_s);
  sd->in_sched = sd->sched_running = false;
}

static void worker_models(lt_scheduler_t *s, size_t w) {
  uint32_t ids[MAX_MODELS];
  size_t n = 0;
  for (int i = 0; i < s->workers[w].nmodels; i++)
    if (lt_sched_model_intern(s->sched, s->workers[w].models[i], &ids[n], NULL, 0) == LT_OK) n++;
  lt_sched_worker_heartbeat(s->sched, w + 1, ids, n, NULL, 0);
  s->workers[w].models_changed = false;
}

static bool worker_alive(const lt_scheduler_t *s, const worker_t *w, int64_t now_ms) {
  return w->slots > 0 && now_ms - w->last_hb_ms <= s->conf.worker_timeout_ms;
}

static void worker_bring_up(lt_scheduler_t *s, size_t w) {
  worker_t *wk = &s->workers[w];
  lt_sched_worker_t sw = {.id = w + 1,
                          .slots = wk->slots > LT_SCHED_MAX_WORKER_SLOTS ? LT_SCHED_MAX_WORKER_SLOTS : wk->slots,
                          .mem_bytes = wk->mem,
                          .model_cache = wk->nmodels > 4 ? (uint32_t)wk->nmodels : 4};
  char err[256];
  if (lt_sched_worker_up(s->sched, &sw, err, sizeof err) != LT_OK) {
    fprintf(stderr, "lathed scheduler: worker %s: %s\n", wk->id, err);
    return;
  }
  wk->up = true;
  worker_models(s, w);
}

/* Workers whose heartbeats stopped go down; new or returning ones come up. A job booked on a
 * worker that goes down leaves lt_sched: it comes back only when the log says it is queued
 * again (AttemptStopped lost after its lease expired), never earlier (invariant 2). */
static void sync_workers(lt_scheduler_t *s, int64_t now_ms) {
  for (size_t w = 0; w < s->nworkers; w++) {
    worker_t *wk = &s->workers[w];
    bool alive = worker_alive(s, wk, now_ms);
    if (wk->up && !alive) {
      for (size_t i = 0; i < s->nsides; i++)
        if (s->sides[i]->sched_running && s->sides[i]->sched_worker == w) sched_drop(s, s->sides[i]);
      lt_sched_worker_down(s->sched, w + 1, s->now_s);
      wk->up = false;
    } else if (!wk->up && alive && !wk->draining) {
      worker_bring_up(s, w);
    } else if (wk->up && wk->models_changed) {
      worker_models(s, w);
    }
  }
}

static bool live_state(lt_job_state_t st) {
  return st == LT_JOB_DISPATCHED || st == LT_JOB_RUNNING || st == LT_JOB_PREEMPTING;
}

typedef struct {
  size_t idx;
  int64_t at;
} order_t;

static int cmp_order(const void *a, const void *b) {
  const order_t *x = a, *y = b;
  if (x->at != y->at) return x->at < y->at ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Builds lt_sched from the fold when a term starts. lt_sched has no call that books a running
 * job on a given worker, so each live worker comes up alone with its own running jobs queued and
 * one decide() places them there; a filler job then takes the worker's free slots so the next
 * worker's jobs cannot land on it; fillers leave at the end. A job that cannot be placed this way
 * stays out of lt_sched (its slots look free) and is logged. */
static lt_err_t sched_rebuild(lt_scheduler_t *s, int64_t now_ms, char *errstr, size_t n) {
  lt_err_t err = lt_sched_new(&s->policy, &s->sched, errstr, n);
  if (err) return err;
  lt_job_table_t *jobs = lt_proj_jobs(s->fold);
  lt_sched_tenant_t filler_t = {.id = FILLER_TENANT, .weight = 1};
  lt_sched_tenant_upsert(s->sched, &filler_t, NULL, 0);
  uint64_t filler = FILLER_JOB0;
  lt_sched_decision_t d[DECIDE_CAP];
  for (size_t w = 0; w < s->nworkers; w++) {
    worker_t *wk = &s->workers[w];
    if (!worker_alive(s, wk, now_ms)) continue;
    uint32_t placed = 0, want = 0;
    for (size_t i = 0; i < s->nsides; i++) {
      side_t *sd = s->sides[i];
      const lt_job_t *j = lt_job_get(jobs, sd->job_id);
      if (!j || !live_state(j->state) || j->attempt_stopped || strcmp(j->worker_id, wk->id) != 0) continue;
      tenant_into_sched(s, j->tenant_id, true);
      if (sched_enqueue(s, i, j->attempt - 1, j->job_class)) want++;
    }
    if (!want && wk->draining) continue;
    worker_bring_up(s, w);
    if (!wk->up) continue;
    for (int round = 0; round < 2 && placed < want; round++) {
      size_t nd = lt_sched_decide(s->sched, s->now_s, d, DECIDE_CAP);
      for (size_t k = 0; k < nd; k++) {
        if (d[k].action != LT_SCHED_DISPATCH || d[k].job_id == 0 || d[k].job_id > s->nsides) continue;
        side_t *sd = s->sides[d[k].job_id - 1];
        sd->sched_running = true;
        sd->sched_worker = (uint32_t)(d[k].worker_id - 1);
        placed++;
      }
      if (placed < want && round == 0) {
        /* the production reserve may hold standard jobs back: place them as production */
        for (size_t i = 0; i < s->nsides; i++) {
          side_t *sd = s->sides[i];
          if (!sd->in_sched || sd->sched_running) continue;
          const lt_job_t *j = lt_job_get(jobs, sd->job_id);
          sched_drop(s, sd);
          if (j) sched_enqueue(s, i, j->attempt - 1, LT_CLASS_PRODUCTION);
        }
      }
    }
    for (size_t i = 0; i < s->nsides; i++) {
      side_t *sd = s->sides[i];
      if (sd->in_sched && !sd->sched_running) {
        fprintf(stderr, "lathed scheduler: job %s running on %s could not be booked there\n", sd->job_id, wk->id);
        sched_drop(s, sd);
      }
    }
    uint32_t used = 0;
    for (size_t i = 0; i < s->nsides; i++)
      if (s->sides[i]->sched_running && s->sides[i]->sched_worker == w) {
        const lt_job_t *j = lt_job_get(jobs, s->sides[i]->job_id);
        used += j && j->gpus > 0 ? (uint32_t)j->gpus : 1;
      }
    if (used < wk->slots) {
      lt_sched_job_t fj = {.id = filler++, .tenant_id = FILLER_TENANT, .cls = LT_CLASS_PRODUCTION,
                           .gpus = wk->slots - used, .model = LT_SCHED_NO_MODEL};
      if (lt_sched_job_enqueue(s->sched, &fj, s->now_s, NULL, 0) == LT_OK) lt_sched_decide(s->sched, s->now_s, d, DECIDE_CAP);
    }
  }
  for (uint64_t f = FILLER_JOB0; f < filler; f++) lt_sched_job_finished(s->sched, f, s->now_s);
  /* real quotas, then the queue in the order jobs entered it */
  for (size_t t = 0; t < s->ntenants; t++) tenant_into_sched(s, s->tenant_names[t], false);
  order_t *q = malloc((s->nsides ? s->nsides : 1) * sizeof *q);
  if (!q) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  size_t nq = 0;
  for (size_t i = 0; i < s->nsides; i++) {
    const lt_job_t *j = lt_job_get(jobs, s->sides[i]->job_id);
    if (j && j->state == LT_JOB_QUEUED && !j->cancel_requested && j->failed_attempts < s->conf.max_attempts)
      q[nq++] = (order_t){i, j->queued_at_ms};
  }
  qsort(q, nq, sizeof *q, cmp_order);
  for (size_t k = 0; k < nq; k++) {
    const lt_job_t *j = lt_job_get(jobs, s->sides[q[k].idx]->job_id);
    sched_enqueue(s, q[k].idx, j->attempt, j->job_class);
  }
  free(q);
  return LT_OK;
}

/* ---------------------------------------------------------------- decisions */

/* The field a jobspec message names ("hyperparameters.lr_schedule: ..."). */
static void field_of(const char *msg, char *field, size_t n) {
  field[0] = '\0';
  const char *c = strchr(msg, ':');
  if (!c || (size_t)(c - msg) >= n) return;
  for (const char *p = msg; p < c; p++)
    if (!(*p == '.' || *p == '_' || *p == '[' || *p == ']' || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
      return;
  memcpy(field, msg, (size_t)(c - msg));
  field[c - msg] = '\0';
}

static void validate(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, int64_t now_ms) {
  if (!lt_id_valid(sd->job_id)) {
    write_reject(s, sd, j, "invalid", "job_id", "job_id: must be 1-63 characters of A-Z a-z 0-9 . _ -");
    return;
  }
  if (sd->spec_err) {
    write_reject(s, sd, j, "invalid", sd->spec_field, sd->spec_msg);
    return;
  }
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(s->fold), j->tenant_id);
  if (!t) {
    if (now_ms - sd->first_seen_ms < s->conf.tenant_grace_ms) return; /* its record may still come */
    char msg[256];
    snprintf(msg, sizeof msg, "tenant_id: no tenant %s", j->tenant_id);
    write_reject(s, sd, j, "unknown_tenant", "tenant_id", msg);
    return;
  }
  if (t->disabled) {
    write_reject(s, sd, j, "tenant_disabled", "tenant_id", "tenant_id: the tenant is disabled");
    return;
  }
  /* The datasets must be the tenant's, exactly as POST /v1/jobs checks them. */
  const char *ds_fields[2] = {"dataset_id", "validation_dataset_id"};
  const char *ds_ids[2] = {sd->spec.dataset_id, sd->spec.validation_dataset_id};
  for (int k = 0; k < 2 && s->conf.store; k++) {
    if (!ds_ids[k][0]) continue;
    char key[512], msg[256];
    lt_store_info_t info;
    lt_dataset_object_key(key, sizeof key, j->tenant_id, ds_ids[k], LT_DATASET_META);
    lt_err_t e = lt_store_head(s->conf.store, key, &info, NULL, 0);
    if (e == LT_ERR_NOT_FOUND) {
      snprintf(msg, sizeof msg, "%s: no dataset %s for this tenant", ds_fields[k], ds_ids[k]);
      write_reject(s, sd, j, "not_found", ds_fields[k], msg);
      return;
    }
    if (e) return; /* the store is unavailable: decide on a later tick */
  }
  if (t->quotas.max_job_duration_s > 0 && sd->spec.max_duration_s > t->quotas.max_job_duration_s) {
    char msg[256];
    snprintf(msg, sizeof msg, "max_duration_s: %lld is over the tenant's limit max_job_duration_s = %lld",
             (long long)sd->spec.max_duration_s, (long long)t->quotas.max_job_duration_s);
    write_reject(s, sd, j, "invalid", "max_duration_s", msg);
    return;
  }
  write_accept(s, sd, j);
}

static int64_t duration_limit_s(lt_scheduler_t *s, const side_t *sd, const lt_job_t *j) {
  int64_t lim = sd->spec_err ? j->max_duration_s : sd->spec.max_duration_s;
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(s->fold), j->tenant_id);
  if (t && t->quotas.max_job_duration_s > 0 && (lim <= 0 || t->quotas.max_job_duration_s < lim))
    lim = t->quotas.max_job_duration_s;
  return lim;
}

/* Everything the fold says should happen to one job now, except dispatch (lt_sched's). */
static void examine(lt_scheduler_t *s, size_t idx, int64_t now_ms) {
  side_t *sd = s->sides[idx];
  const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
  if (!j) return;
  if (lt_job_state_is_terminal(j->state) || sd->w_terminal) {
    sched_drop(s, sd);
    return;
  }
  bool mine_read_back = j->attempt >= sd->w_dispatch_attempt;
  if (j->cancel_requested) {
    if (j->state == LT_JOB_SUBMITTED || j->state == LT_JOB_QUEUED || j->state == LT_JOB_DISPATCHED ||
        j->attempt_stopped) {
      if (mine_read_back) {
        write_cancelled(s, sd, j);
        sched_drop(s, sd);
        return;
      }
    }
  }
  if (j->state == LT_JOB_SUBMITTED) {
    if (!sd->w_decided) validate(s, sd, j, now_ms);
    return;
  }
  if (j->state == LT_JOB_QUEUED) {
    if (j->failed_attempts >= s->conf.max_attempts) {
      char why[LT_JOB_REASON_MAX + 64];
      snprintf(why, sizeof why, "failed %d attempts; last: %s", (int)j->failed_attempts,
               j->reason[0] ? j->reason : "(no reason given)");
      write_failed(s, sd, j, "too_many_attempts", why);
      sched_drop(s, sd);
      return;
    }
    if (!sd->in_sched && mine_read_back && !j->cancel_requested)
      sched_enqueue(s, idx, j->attempt, j->job_class);
    return;
  }
  if (!live_state(j->state) || j->attempt_stopped || !mine_read_back) return;
  if (j->state == LT_JOB_DISPATCHED) {
    int64_t since = sd->dispatched_at_ms ? sd->dispatched_at_ms : now_ms;
    if (now_ms - since > s->conf.start_timeout_ms && sd->redispatch_for != j->attempt && !j->cancel_requested) {
      /* not started in time: a new attempt (the new number fences this one) */
      sd->redispatch_for = j->attempt;
      if (sd->in_sched && sd->sched_running) {
        size_t i;
        side_get(s, sd->job_id, false, &i);
        if (lt_sched_job_requeue(s->sched, i + 1, s->now_s) == LT_OK) sd->sched_running = false;
        else sched_drop(s, sd);
      }
      if (!sd->in_sched) sched_enqueue(s, idx, j->attempt, j->job_class);
    }
    return;
  }
  /* RUNNING or PREEMPTING: the lease, then the duration */
  int64_t deadline = sd->lease_deadline_ms;
  int64_t base = j->started_at_ms > sd->dispatched_at_ms ? j->started_at_ms : sd->dispatched_at_ms;
  if (base + j->lease_ms > deadline) deadline = base + (j->lease_ms > 0 ? j->lease_ms : s->conf.lease_ms);
  if (now_ms > deadline + s->conf.lease_margin_ms) {
    if (sd->w_lost_attempt != j->attempt) {
      write_lost(s, sd, j, deadline);
      sched_drop(s, sd); /* back in lt_sched when the log says it is queued */
    }
    return;
  }
  int64_t lim = duration_limit_s(s, sd, j);
  if (lim > 0 && j->state == LT_JOB_RUNNING && j->started_at_ms && now_ms - j->started_at_ms > lim * 1000) {
    char why[128];
    snprintf(why, sizeof why, "ran past its maximum duration of %lld s", (long long)lim);
    write_failed(s, sd, j, "max_duration", why);
    sched_drop(s, sd);
  }
}

static void run_decisions(lt_scheduler_t *s, int64_t now_ms) {
  lt_job_table_t *jobs = lt_proj_jobs(s->fold);
  lt_sched_decision_t d[DECIDE_CAP];
  for (int round = 0; round < 64; round++) {
    size_t nd = lt_sched_decide(s->sched, s->now_s, d, DECIDE_CAP);
    for (size_t k = 0; k < nd; k++) {
      if (d[k].job_id == 0 || d[k].job_id > s->nsides) continue;
      side_t *sd = s->sides[d[k].job_id - 1];
      const lt_job_t *j = lt_job_get(jobs, sd->job_id);
      if (!j) continue;
      if (d[k].action == LT_SCHED_DISPATCH) {
        size_t w = (size_t)(d[k].worker_id - 1);
        bool ok = !lt_job_state_is_terminal(j->state) && !sd->w_terminal && !j->cancel_requested &&
                  j->attempt >= sd->w_dispatch_attempt &&
                  (j->state == LT_JOB_QUEUED || (j->state == LT_JOB_DISPATCHED && sd->redispatch_for == j->attempt));
        sd->sched_running = true;
        sd->sched_worker = (uint32_t)w;
        if (!ok || w >= s->nworkers || !write_dispatch(s, sd, j, s->workers[w].id, now_ms)) sched_drop(s, sd);
      } else if (d[k].action == LT_SCHED_PREEMPT) {
        if (j->state == LT_JOB_RUNNING && !j->attempt_stopped && sd->w_preempt_attempt != j->attempt)
          write_preempt(s, sd, j, now_ms);
      }
    }
    if (nd < DECIDE_CAP) break;
  }
}

static void step(lt_scheduler_t *s) {
  if (s->role != LT_SCHEDULER_LEADING) return;
  int64_t now_ms = lt_time_wall_ms();
  double now = (double)now_ms / 1000.0;
  if (now > s->now_s) s->now_s = now;
  sync_workers(s, now_ms);
  bool scan = now_ms - s->last_scan_ms >= 250;
  if (scan) {
    s->last_scan_ms = now_ms;
    for (size_t i = 0; i < s->nsides; i++) {
      s->sides[i]->dirty = false;
      examine(s, i, now_ms);
    }
  } else {
    for (size_t i = 0; i < s->nsides; i++)
      if (s->sides[i]->dirty) {
        s->sides[i]->dirty = false;
        examine(s, i, now_ms);
      }
  }
  run_decisions(s, now_ms);
  flush_batch(s);
}

/* ---------------------------------------------------------------- the fold feed */

static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_scheduler_t *s = ctx;
  s->st.folded++;
  if (!res->type) return;
  lt_avro_record_t *rec = res->record;
  if (res->job_id && res->job_outcome == LT_JOB_APPLIED) {
    size_t idx;
    side_t *sd = side_get(s, res->job_id, true, &idx);
    if (!sd) return;
    const char *str = NULL;
    int64_t v = 0;
    lt_job_event_type_t et;
    lt_job_event_type_parse(res->type, &et);
    switch (et) {
    case LT_EV_JOB_SUBMITTED:
      if (lt_avro_get_string(rec, "event_id", &str, NULL) == LT_OK)
        snprintf(sd->submitted_event_id, sizeof sd->submitted_event_id, "%s", str);
      sd->spec_err = lt_jobspec_from_record(rec, &sd->spec, sd->spec_msg, sizeof sd->spec_msg);
      if (sd->spec_err) field_of(sd->spec_msg, sd->spec_field, sizeof sd->spec_field);
      else sd->spec_err = lt_jobspec_validate(&sd->spec, sd->spec_field, sizeof sd->spec_field, sd->spec_msg,
                                              sizeof sd->spec_msg);
      break;
    case LT_EV_JOB_DISPATCHED:
      lt_avro_get_long(rec, "occurred_at", &sd->dispatched_at_ms);
      if (lt_avro_get_long(rec, "lease_deadline", &v) == LT_OK) sd->lease_deadline_ms = v;
      break;
    case LT_EV_ATTEMPT_STARTED:
      if (lt_avro_get_long(rec, "lease_deadline", &v) == LT_OK && v > sd->lease_deadline_ms) sd->lease_deadline_ms = v;
      if (s->sched && sd->sched_running) lt_sched_job_started(s->sched, idx + 1, s->now_s);
      break;
    case LT_EV_CANCEL_REQUESTED:
      if (lt_avro_get_string(rec, "event_id", &str, NULL) == LT_OK)
        snprintf(sd->cancel_event_id, sizeof sd->cancel_event_id, "%s", str);
      if (lt_avro_get_string(rec, "requested_by", &str, NULL) == LT_OK)
        snprintf(sd->requested_by, sizeof sd->requested_by, "%s", str);
      break;
    case LT_EV_CHECKPOINT_COMMITTED:
      if (lt_avro_get_string(rec, "event_id", &str, NULL) == LT_OK)
        snprintf(sd->ckpt_event_id, sizeof sd->ckpt_event_id, "%s", str);
      break;
    case LT_EV_ATTEMPT_STOPPED:
      if (s->sched && sd->in_sched) {
        const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
        if (j && j->state == LT_JOB_QUEUED && sd->sched_running &&
            lt_sched_job_requeue(s->sched, idx + 1, s->now_s) == LT_OK)
          sd->sched_running = false;
        else
          sched_drop(s, sd);
      }
      break;
    case LT_EV_JOB_COMPLETED:
    case LT_EV_JOB_FAILED:
    case LT_EV_JOB_CANCELLED:
    case LT_EV_JOB_REJECTED:
      if (s->sched) sched_drop(s, sd);
      break;
    default:
      break;
    }
    sd->dirty = true;
    return;
  }
  if (strcmp(res->type, "WorkerHeartbeat") == 0) {
    const char *wid = NULL;
    if (lt_avro_get_string(rec, "worker_id", &wid, NULL) != LT_OK || !wid || !*wid) return;
    size_t w;
    worker_t *wk = worker_get(s, wid, &w);
    if (!wk) return;
    int64_t at = 0, mem = 0;
    int32_t slots = 0;
    lt_avro_get_long(rec, "occurred_at", &at);
    if (at < wk->last_hb_ms) return; /* an older heartbeat (compaction keeps the newest) */
    wk->last_hb_ms = at;
    lt_avro_get_int(rec, "slots_total", &slots);
    lt_avro_get_long(rec, "memory_total_bytes", &mem);
    lt_avro_get_bool(rec, "draining", &wk->draining);
    if (wk->up && s->sched && ((uint32_t)(slots > 0 ? slots : 0) != wk->slots || (uint64_t)mem != wk->mem)) {
      /* capacity changed: lt_sched takes it only from a worker with nothing booked */
      bool busy = false;
      for (size_t i = 0; i < s->nsides && !busy; i++) busy = s->sides[i]->sched_running && s->sides[i]->sched_worker == w;
      if (!busy) {
        lt_sched_worker_down(s->sched, w + 1, s->now_s);
        wk->up = false;
      }
    }
    if (!wk->up) {
      wk->slots = slots > 0 ? (uint32_t)slots : 0;
      wk->mem = mem > 0 ? (uint64_t)mem : 0;
    }
    size_t nm = 0;
    lt_avro_array_size(rec, "base_models", &nm);
    int old = wk->nmodels;
    wk->nmodels = 0;
    char path[64];
    for (size_t i = 0; i < nm && wk->nmodels < MAX_MODELS; i++) {
      snprintf(path, sizeof path, "base_models[%zu]", i);
      if (lt_avro_get_string(rec, path, &wid, NULL) == LT_OK)
        snprintf(wk->models[wk->nmodels++], LT_JOB_NAME_MAX, "%s", wid);
    }
    wk->models_changed = wk->models_changed || old != wk->nmodels || nm > 0;
    size_t nl = 0;
    lt_avro_array_size(rec, "leases", &nl);
    lt_job_table_t *jobs = lt_proj_jobs(s->fold);
    for (size_t i = 0; i < nl; i++) {
      const char *jid = NULL;
      int32_t attempt = 0;
      int64_t dl = 0;
      snprintf(path, sizeof path, "leases[%zu].job_id", i);
      if (lt_avro_get_string(rec, path, &jid, NULL) != LT_OK) continue;
      snprintf(path, sizeof path, "leases[%zu].attempt", i);
      lt_avro_get_int(rec, path, &attempt);
      snprintf(path, sizeof path, "leases[%zu].lease_deadline", i);
      lt_avro_get_long(rec, path, &dl);
      const lt_job_t *j = lt_job_get(jobs, jid);
      side_t *sd = j ? side_get(s, jid, false, NULL) : NULL;
      if (sd && j->attempt == attempt && dl > sd->lease_deadline_ms) sd->lease_deadline_ms = dl;
    }
    return;
  }
  if (strcmp(res->type, "TenantUpserted") == 0 && s->sched && res->record) {
    const char *tid = NULL;
    if (lt_avro_get_string(rec, "tenant_id", &tid, NULL) == LT_OK && json_object_get(s->tenant_ids, tid))
      tenant_into_sched(s, tid, false);
  }
}

static int tp_index(lt_scheduler_t *s, const char *topic, int32_t partition) {
  for (int t = 0; t < T_NFOLD; t++)
    if (strcmp(topic, s->fold_topics[t]) == 0)
      return partition >= 0 && partition < s->tp_count[t] ? s->tp_base[t] + partition : -1;
  return -1;
}

static bool caught_up(lt_scheduler_t *s, int64_t now_ms) {
  lt_bus_tp_t pos[MAX_TPS];
  memcpy(pos, s->tps, s->ntps * sizeof *pos);
  bool all = lt_bus_consumer_position(s->fold_c, pos, s->ntps, NULL, 0) == LT_OK;
  for (size_t i = 0; all && i < s->ntps; i++) {
    int64_t p = pos[i].offset >= 0 ? pos[i].offset : s->next[i];
    if (p < s->hwm[i] && s->next[i] < s->hwm[i]) all = false;
  }
  /* read_committed stops before commit markers and open transactions: after a quiet second the
   * log has nothing more to give */
  return all || now_ms - s->last_msg_ms > 1000;
}

static void feed(lt_scheduler_t *s) {
  if (!s->fold_c) return;
  int64_t now_ms = lt_time_wall_ms();
  bool more = false;
  for (int i = 0; i < 5000; i++) {
    const lt_bus_msg_t *m = NULL;
    char err[512];
    lt_err_t e = lt_bus_consumer_poll(s->fold_c, 0, &m, err, sizeof err);
    if (e) {
      fprintf(stderr, "lathed scheduler: fold consumer: %s\n", err);
      if (e == LT_ERR_FATAL) {
        stop_leading(s, err);
        return;
      }
      break;
    }
    if (!m) break;
    if (i == 4999) more = true;
    s->last_msg_ms = now_ms;
    int tp = tp_index(s, lt_bus_msg_topic(m), lt_bus_msg_partition(m));
    int64_t off = lt_bus_msg_offset(m);
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    if (tp >= 0 && off + 1 > s->next[tp]) s->next[tp] = off + 1;
    s->offsets_dirty = true;
    if (!v) continue; /* a tombstone on a compacted topic */
    e = lt_proj_fold(s->fold, v, len, on_folded, s, err, sizeof err);
    if (e && tp >= 0 && off >= s->committed[tp]) write_deadletter(s, m, e, err);
  }
  if (s->role == LT_SCHEDULER_CATCHUP && caught_up(s, now_ms)) {
    char err[512];
    s->now_s = (double)now_ms / 1000.0;
    if (sched_rebuild(s, now_ms, err, sizeof err)) {
      stop_leading(s, err);
      return;
    }
    s->role = LT_SCHEDULER_LEADING;
    fprintf(stderr, "lathed scheduler: leading (term %" PRIu64 ", %zu jobs, %zu workers folded)\n", s->st.terms,
            s->nsides, s->nworkers);
  }
  if (s->role == LT_SCHEDULER_LEADING) step(s);
  else if (s->nout) flush_batch(s); /* dead letters found while catching up */
  if (more && s->fold_ev) event_active(s->fold_ev, EV_READ, 0);
}

static void on_fold_fd(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  feed(arg);
}

/* ---------------------------------------------------------------- terms of leadership */

static void stop_leading(lt_scheduler_t *s, const char *why) {
  if (s->role == LT_SCHEDULER_STANDBY && !s->prod) return;
  fprintf(stderr, "lathed scheduler: stops leading: %s\n", why ? why : "");
  if (s->fold_ev) event_free(s->fold_ev);
  s->fold_ev = NULL;
  lt_bus_consumer_destroy(s->fold_c);
  s->fold_c = NULL;
  lt_bus_producer_destroy(s->prod, 0);
  s->prod = NULL;
  lt_sched_destroy(s->sched);
  s->sched = NULL;
  lt_proj_destroy(s->fold);
  s->fold = NULL;
  for (size_t i = 0; i < s->nsides; i++) free(s->sides[i]);
  s->nsides = 0;
  json_object_clear(s->side_idx);
  s->nworkers = 0;
  json_object_clear(s->worker_idx);
  for (size_t i = 0; i < s->ntenants; i++) free(s->tenant_names[i]);
  s->ntenants = 0;
  json_object_clear(s->tenant_ids);
  out_clear(s);
  s->role = LT_SCHEDULER_STANDBY;
}

static lt_err_t start_leading(lt_scheduler_t *s, char *errstr, size_t n) {
  s->st.terms++;
  s->st.folded = 0;
  lt_bus_producer_opts_t popts = {.transactional_id = s->txn_id};
  /* init_transactions fences the previous leader before anything is read */
  lt_err_t err = lt_bus_producer_new(s->conf.bus, &popts, &s->prod, errstr, n);
  for (int o = 0; o < O_N && !err; o++) lt_bus_producer_prepare(s->prod, s->out_topics[o], 2000);
  if (!err) err = lt_proj_new(s->conf.registry, &s->fold, errstr, n);
  if (err) return err;
  lt_bus_admin_t *admin = NULL;
  if ((err = lt_bus_admin_new(s->conf.bus, &admin, errstr, n))) return err;
  s->ntps = 0;
  for (int t = 0; t < T_NFOLD && !err; t++) {
    int count = 0;
    err = lt_bus_admin_describe_topic(admin, s->fold_topics[t], 10000, &count, errstr, n);
    s->tp_base[t] = (int)s->ntps;
    s->tp_count[t] = 0;
    for (int p = 0; !err && p < count && s->ntps < MAX_TPS; p++, s->tp_count[t]++)
      s->tps[s->ntps++] = (lt_bus_tp_t){.topic = s->fold_topics[t], .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_admin_destroy(admin);
  if (err) return err;
  lt_bus_tp_t tmp[MAX_TPS];
  memcpy(tmp, s->tps, s->ntps * sizeof *tmp);
  if ((err = lt_bus_consumer_committed(s->group, tmp, s->ntps, 10000, errstr, n))) return err;
  for (size_t i = 0; i < s->ntps; i++) {
    s->committed[i] = tmp[i].offset >= 0 ? tmp[i].offset : 0;
    s->next[i] = 0;
  }
  lt_bus_consumer_opts_t copts = {0};
  if ((err = lt_bus_consumer_new(s->conf.bus, &copts, &s->fold_c, errstr, n))) return err;
  memcpy(tmp, s->tps, s->ntps * sizeof *tmp);
  if ((err = lt_bus_consumer_watermarks(s->fold_c, tmp, s->ntps, NULL, 10000, errstr, n))) return err;
  for (size_t i = 0; i < s->ntps; i++) s->hwm[i] = tmp[i].offset;
  if ((err = lt_bus_consumer_assign(s->fold_c, s->tps, s->ntps, errstr, n))) return err;
  s->fold_ev = event_new(s->base, lt_bus_consumer_fd(s->fold_c), EV_READ | EV_PERSIST, on_fold_fd, s);
  if (!s->fold_ev || event_add(s->fold_ev, NULL)) return lt_errf(errstr, n, LT_ERR_NOMEM, "cannot watch the fold");
  s->last_msg_ms = s->catchup_since_ms = lt_time_wall_ms();
  s->role = LT_SCHEDULER_CATCHUP;
  s->fenced = false;
  s->st.fenced = false;
  return LT_OK;
}

/* ---------------------------------------------------------------- membership */

static void on_rebalance(void *opaque, lt_bus_consumer_t *c, lt_bus_rebalance_t what, const lt_bus_tp_t *parts,
                         size_t n) {
  lt_scheduler_t *s = opaque;
  bool p0 = false;
  for (size_t i = 0; i < n; i++) p0 = p0 || parts[i].partition == 0;
  if (what == LT_BUS_ASSIGNED) {
    /* membership only: the fold consumer reads the records */
    lt_bus_consumer_pause(c, parts, n, NULL, 0);
    if (p0) {
      s->own_p0 = true;
      s->fenced = false; /* the group chose us again */
    }
  } else if (p0) {
    s->own_p0 = false;
  }
}

static void poll_group(lt_scheduler_t *s) {
  for (int i = 0; i < 100; i++) {
    const lt_bus_msg_t *m = NULL;
    char err[256];
    if (lt_bus_consumer_poll(s->group, 0, &m, err, sizeof err) || !m) break;
  }
  if (!s->own_p0 && s->role != LT_SCHEDULER_STANDBY) stop_leading(s, "lost lathe.jobs partition 0 to another instance");
  if (s->own_p0 && !s->fenced && s->role == LT_SCHEDULER_STANDBY) {
    char err[512];
    if (start_leading(s, err, sizeof err)) {
      fprintf(stderr, "lathed scheduler: cannot start leading: %s\n", err);
      stop_leading(s, err);
    }
  }
}

static void on_group_fd(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  poll_group(arg);
}

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  lt_scheduler_t *s = arg;
  poll_group(s);
  feed(s);
}

lt_err_t lt_scheduler_new(struct event_base *base, const lt_scheduler_conf_t *conf, lt_scheduler_t **out,
                          char *errstr, size_t n) {
  *out = NULL;
  if (!base || !conf || !conf->bus || !conf->registry)
    return lt_errf(errstr, n, LT_ERR_INVALID, "scheduler: base, conf, conf->bus and conf->registry are required");
  lt_scheduler_t *s = calloc(1, sizeof *s);
  if (!s) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  s->base = base;
  s->conf = *conf;
  lt_scheduler_conf_t *c = &s->conf;
  if (c->lease_ms <= 0) c->lease_ms = 30000;
  if (c->lease_margin_ms <= 0) c->lease_margin_ms = 5000;
  if (c->start_timeout_ms <= 0) c->start_timeout_ms = 60000;
  if (c->worker_timeout_ms <= 0) c->worker_timeout_ms = c->lease_ms;
  if (c->tenant_grace_ms < 0) c->tenant_grace_ms = 0;
  else if (c->tenant_grace_ms == 0) c->tenant_grace_ms = 5000;
  if (c->checkpoint_deadline_ms <= 0) c->checkpoint_deadline_ms = 30000;
  if (c->max_attempts <= 0) c->max_attempts = 3;
  if (c->tick_ms <= 0) c->tick_ms = 100;
  snprintf(s->producer_id, sizeof s->producer_id, "%s", c->producer_id ? c->producer_id : "scheduler");
  c->producer_id = s->producer_id;
  char prefixed[200];
  lt_bus_topic_name(c->bus, "scheduler", prefixed, sizeof prefixed);
  snprintf(s->txn_id, sizeof s->txn_id, "%s", c->transactional_id ? c->transactional_id : prefixed);
  snprintf(s->group_id, sizeof s->group_id, "%s", c->group_id ? c->group_id : prefixed);
  c->transactional_id = s->txn_id;
  c->group_id = s->group_id;
  if (c->policy) s->policy = *c->policy;
  else lt_sched_config_default(&s->policy);
  c->policy = &s->policy;
  static const char *const fold_bases[T_NFOLD] = {"jobs", "control", "workers", "tenants"};
  for (int t = 0; t < T_NFOLD; t++) lt_bus_topic_name(c->bus, fold_bases[t], s->fold_topics[t], sizeof s->fold_topics[t]);
  lt_bus_topic_name(c->bus, "control", s->out_topics[O_CONTROL], sizeof s->out_topics[O_CONTROL]);
  for (int k = 0; k < LT_CLASS__COUNT; k++) {
    char b[64];
    snprintf(b, sizeof b, "dispatch.%s", lt_job_class_name((lt_job_class_t)k));
    lt_bus_topic_name(c->bus, b, s->out_topics[O_DISPATCH0 + k], sizeof s->out_topics[O_DISPATCH0 + k]);
  }
  lt_bus_topic_name(c->bus, "deadletter", s->out_topics[O_DEADLETTER], sizeof s->out_topics[O_DEADLETTER]);
  s->side_idx = json_object();
  s->worker_idx = json_object();
  s->tenant_ids = json_object();
  lt_err_t err = (!s->side_idx || !s->worker_idx || !s->tenant_ids) ? LT_ERR_NOMEM : LT_OK;
  for (int r = 0; !err && r < 8; r++) err = lt_avro_record_new(c->registry, rec_types[r], &s->rec[r], errstr, n);
  lt_bus_conf_t *gconf = err ? NULL : lt_bus_conf_dup(c->bus);
  if (!err && !gconf) err = LT_ERR_NOMEM;
  if (!err) err = lt_bus_conf_set(gconf, "partition.assignment.strategy", "cooperative-sticky", errstr, n);
  if (!err) err = lt_bus_conf_set(gconf, "session.timeout.ms", "6000", errstr, n);
  if (!err) err = lt_bus_conf_set(gconf, "heartbeat.interval.ms", "1000", errstr, n);
  lt_bus_consumer_opts_t gopts = {.group_id = s->group_id, .rebalance_cb = on_rebalance, .opaque = s};
  if (!err) err = lt_bus_consumer_new(gconf, &gopts, &s->group, errstr, n);
  lt_bus_conf_destroy(gconf);
  const char *topics[1] = {s->fold_topics[T_JOBS]};
  if (!err) err = lt_bus_consumer_subscribe(s->group, topics, 1, errstr, n);
  if (!err) {
    s->group_ev = event_new(base, lt_bus_consumer_fd(s->group), EV_READ | EV_PERSIST, on_group_fd, s);
    s->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, s);
    struct timeval tv = {c->tick_ms / 1000, (c->tick_ms % 1000) * 1000};
    if (!s->group_ev || !s->tick_ev || event_add(s->group_ev, NULL) || event_add(s->tick_ev, &tv))
      err = lt_errf(errstr, n, LT_ERR_NOMEM, "cannot register the scheduler's events");
  }
  if (err) {
    lt_scheduler_destroy(s);
    return err;
  }
  *out = s;
  return LT_OK;
}

void lt_scheduler_destroy(lt_scheduler_t *s) {
  if (!s) return;
  stop_leading(s, "shutting down");
  if (s->group_ev) event_free(s->group_ev);
  if (s->tick_ev) event_free(s->tick_ev);
  lt_bus_consumer_destroy(s->group);
  for (int r = 0; r < 8; r++) lt_avro_record_destroy(s->rec[r]);
  json_decref(s->side_idx);
  json_decref(s->worker_idx);
  json_decref(s->tenant_ids);
  free(s->sides);
  free(s->workers);
  free(s->tenant_names);
  free(s->out);
  free(s);
}

void lt_scheduler_stats(const lt_scheduler_t *s, lt_scheduler_stats_t *out) {
  *out = s->st;
  out->role = s->role;
  out->fenced = s->fenced;
}

lt_err_t lt_scheduler_digest(lt_scheduler_t *s, char out_hex[65]) {
  if (!s->fold) return LT_ERR_UNAVAILABLE;
  return lt_job_digest(lt_proj_jobs(s->fold), out_hex);
}

lt_proj_t *lt_scheduler_proj(lt_scheduler_t *s) { return s->fold ? s->fold : NULL; }
