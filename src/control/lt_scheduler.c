/* lt_scheduler: `lathed scheduler` — group leadership, the fold, lt_sched and the records it
 * writes in transactions (see lt_scheduler.h for the contract). This file holds leadership and
 * membership, the fold feed and the transactions; what the scheduler decides and writes is in
 * lt_scheduler_decide.c.
 *
 * Everything a term of leadership needs (producer, fold consumer, projection, policy, per-job and
 * per-worker tables) is created when this instance starts leading and thrown away when it stops:
 * a new term rebuilds all of it from the log, so nothing survives that the log does not say. */
#include "lt_scheduler_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_time.h"

static const char *const rec_types[R_N] = {
    [R_ACC] = "JobAccepted",  [R_REJ] = "JobRejected",   [R_DISP] = "JobDispatched",
    [R_PRE] = "PreemptRequested", [R_FAIL] = "JobFailed", [R_CANC] = "JobCancelled",
    [R_STOP] = "AttemptStopped", [R_DEAD] = "DeadLetter"};

static void stop_leading(lt_scheduler_t *s, const char *why);

/* ---------------------------------------------------------------- small tables */

/* arr (n elements of size bytes in *cap) with room for one more: arr itself, or a larger copy
 * (capacity doubled, first when empty) with *cap updated; NULL when out of memory (arr is then
 * unchanged). */
static void *grow(void *arr, size_t n, size_t *cap, size_t size, size_t first) {
  if (n < *cap) return arr;
  size_t c = *cap ? *cap * 2 : first;
  void *p = realloc(arr, c * size);
  if (p) *cap = c;
  return p;
}

/* The term's indexes (side_idx, worker_idx, tenant_ids) map an id to index + 1, so that an
 * absent key (NULL) reads as 0. */
static size_t pos_get(const lt_map_t *m, const char *key) { return (uintptr_t)lt_map_get(m, key); }
static lt_err_t pos_set(lt_map_t *m, const char *key, size_t pos) {
  return lt_map_set(m, key, (void *)(uintptr_t)pos);
}

side_t *scheduler_side_get(lt_scheduler_t *s, const char *job_id, bool add, size_t *idx_out) {
  size_t pos = pos_get(s->side_idx, job_id);
  if (pos) {
    if (idx_out) *idx_out = pos - 1;
    return s->sides[pos - 1];
  }
  if (!add) return NULL;
  side_t **sides = grow(s->sides, s->nsides, &s->capsides, sizeof *sides, 1024);
  if (!sides) return NULL;
  s->sides = sides;
  side_t *sd = calloc(1, sizeof *sd);
  if (!sd) return NULL;
  snprintf(sd->job_id, sizeof sd->job_id, "%s", job_id);
  sd->first_seen_ms = lt_time_wall_ms();
  sd->spec_err = LT_ERR_INVALID;
  snprintf(sd->spec_msg, sizeof sd->spec_msg, "the submission was not read");
  if (pos_set(s->side_idx, job_id, s->nsides + 1)) {
    free(sd);
    return NULL;
  }
  s->sides[s->nsides] = sd;
  if (idx_out) *idx_out = s->nsides;
  s->nsides++;
  return sd;
}

static worker_t *worker_get(lt_scheduler_t *s, const char *id, size_t *idx_out) {
  size_t pos = pos_get(s->worker_idx, id);
  if (pos) {
    *idx_out = pos - 1;
    return &s->workers[pos - 1];
  }
  worker_t *workers = grow(s->workers, s->nworkers, &s->capworkers, sizeof *workers, 64);
  if (!workers) return NULL;
  s->workers = workers;
  if (pos_set(s->worker_idx, id, s->nworkers + 1)) return NULL;
  worker_t *w = &s->workers[s->nworkers];
  memset(w, 0, sizeof *w);
  snprintf(w->id, sizeof w->id, "%s", id);
  *idx_out = s->nworkers++;
  return w;
}

/* lt_sched id of a tenant name (1-based), adding it. */
uint64_t scheduler_tenant_id(lt_scheduler_t *s, const char *name) {
  size_t id = pos_get(s->tenant_ids, name);
  if (id) return id;
  char **names = grow(s->tenant_names, s->ntenants, &s->captenants, sizeof *names, 64);
  if (!names) return 0;
  s->tenant_names = names;
  if (pos_set(s->tenant_ids, name, s->ntenants + 1)) return 0;
  s->tenant_names[s->ntenants] = strdup(name);
  return ++s->ntenants;
}

/* ---------------------------------------------------------------- output batch */

lt_err_t scheduler_emit(lt_scheduler_t *s, int topic, const char *key, const void *key_bytes, size_t key_len,
                     lt_avro_record_t *rec) {
  const uint8_t *bytes;
  size_t len;
  char err[256];
  lt_err_t e = lt_avro_record_encode(rec, &bytes, &len, err, sizeof err);
  if (e) {
    lt_log_error("scheduler", "cannot encode %s: %s", lt_avro_record_type(rec), err);
    return e;
  }
  out_rec_t *out = grow(s->out, s->nout, &s->capout, sizeof *out, 64);
  if (!out) return LT_ERR_NOMEM;
  s->out = out;
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
void scheduler_flush(lt_scheduler_t *s) {
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

/* ---------------------------------------------------------------- the fold feed */

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

/* Copies the string field `name` of rec into dst, when rec has it. */
static void copy_field(lt_avro_record_t *rec, const char *name, char *dst, size_t n) {
  const char *str = NULL;
  if (lt_avro_get_string(rec, name, &str, NULL) == LT_OK) snprintf(dst, n, "%s", str);
}

/* The workers of a dispatched gang, rank order (gang_workers of its JobDispatched on
 * lathe.control, and each rank's GPUs from gang_gpu_masks, v4; none for a job on one worker), so
 * that a new term books the gang where it runs
 * and every term stops it when one of them goes down or drains. A gang naming more than GANG_MAX
 * workers, or one of them twice, is none: such a dispatch was never written. */
static void fold_gang(lt_scheduler_t *s, lt_avro_record_t *rec, side_t *sd) {
  size_t n = 0;
  sd->gang_n = 0;
  if (lt_avro_array_size(rec, "gang_workers", &n) != LT_OK || n < 2 || n > GANG_MAX) return;
  char path[48];
  for (size_t r = 0; r < n; r++) {
    const char *id = NULL;
    size_t w;
    snprintf(path, sizeof path, "gang_workers[%zu]", r);
    if (lt_avro_get_string(rec, path, &id, NULL) != LT_OK || !id || !*id || !worker_get(s, id, &w)) return;
    for (size_t q = 0; q < r; q++)
      if (sd->gang_w[q] == w) return;
    sd->gang_w[r] = (uint32_t)w;
    int64_t mask = 0;
    snprintf(path, sizeof path, "gang_gpu_masks[%zu]", r);
    sd->gang_mask[r] = lt_avro_get_long(rec, path, &mask) == LT_OK ? (uint64_t)mask : 0;
  }
  sd->gang_n = (uint32_t)n;
}

/* A job record the fold applied: what the side table keeps of it (ids a later record quotes, the
 * spec, lease deadlines), and what lt_sched must learn (started, back in the queue, gone). */
static void fold_job(lt_scheduler_t *s, const lt_proj_result_t *res) {
  lt_avro_record_t *rec = res->record;
  size_t idx;
  side_t *sd = scheduler_side_get(s, res->job_id, true, &idx);
  if (!sd) return;
  int64_t v = 0;
  lt_job_event_type_t et;
  lt_job_event_type_parse(res->type, &et);
  switch (et) {
  case LT_EV_JOB_SUBMITTED:
    copy_field(rec, "event_id", sd->submitted_event_id, sizeof sd->submitted_event_id);
    sd->spec_err = lt_jobspec_from_record(rec, &sd->spec, sd->spec_msg, sizeof sd->spec_msg);
    if (sd->spec_err) field_of(sd->spec_msg, sd->spec_field, sizeof sd->spec_field);
    else sd->spec_err = lt_jobspec_validate(&sd->spec, sd->spec_field, sizeof sd->spec_field, sd->spec_msg,
                                            sizeof sd->spec_msg);
    break;
  case LT_EV_JOB_DISPATCHED:
    lt_avro_get_long(rec, "occurred_at", &sd->dispatched_at_ms);
    if (lt_avro_get_long(rec, "lease_deadline", &v) == LT_OK) sd->lease_deadline_ms = v;
    fold_gang(s, rec, sd);
    break;
  case LT_EV_ATTEMPT_STARTED:
    if (lt_avro_get_long(rec, "lease_deadline", &v) == LT_OK && v > sd->lease_deadline_ms) sd->lease_deadline_ms = v;
    if (s->sched && sd->sched_running) lt_sched_job_started(s->sched, idx + 1, s->now_s);
    if (s->sched) {
      const lt_job_t *sj = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
      if (sj && sj->worker_id[0]) scheduler_worker_started(s, sj->worker_id);
    }
    break;
  case LT_EV_CANCEL_REQUESTED:
    copy_field(rec, "event_id", sd->cancel_event_id, sizeof sd->cancel_event_id);
    copy_field(rec, "requested_by", sd->requested_by, sizeof sd->requested_by);
    break;
  case LT_EV_CHECKPOINT_COMMITTED:
    copy_field(rec, "event_id", sd->ckpt_event_id, sizeof sd->ckpt_event_id);
    break;
  case LT_EV_ATTEMPT_STOPPED:
    if (s->sched && sd->in_sched) {
      const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
      if (j && j->state == LT_JOB_QUEUED && sd->sched_running && !j->parked &&
          lt_sched_job_requeue(s->sched, idx + 1, s->now_s) == LT_OK)
        sd->sched_running = false;
      else
        scheduler_drop(s, sd);
    }
    break;
  case LT_EV_JOB_COMPLETED:
  case LT_EV_JOB_FAILED:
  case LT_EV_JOB_CANCELLED:
  case LT_EV_JOB_REJECTED:
    if (s->sched) scheduler_drop(s, sd);
    break;
  default:
    break;
  }
  sd->dirty = true;
}

/* A heartbeat's capacity. lt_sched takes a new one only from a worker with nothing booked: a
 * busy worker keeps the capacity it came up with until its jobs are gone. */
static void heartbeat_capacity(lt_scheduler_t *s, lt_avro_record_t *rec, size_t w) {
  worker_t *wk = &s->workers[w];
  int64_t mem = 0;
  int32_t slots = 0;
  lt_avro_get_int(rec, "slots_total", &slots);
  lt_avro_get_long(rec, "memory_total_bytes", &mem);
  lt_avro_get_bool(rec, "draining", &wk->draining);
  /* a partition of every class's dispatch topic: a worker with none of one class would get that
   * class's dispatches on another worker's partition (sync_workers) */
  size_t owned = 0;
  lt_avro_array_size(rec, "owned_partitions", &owned);
  unsigned classes = 0;
  for (size_t i = 0; i < owned; i++) {
    char path[64];
    const char *topic = NULL;
    snprintf(path, sizeof path, "owned_partitions[%zu].topic", i);
    if (lt_avro_get_string(rec, path, &topic, NULL) != LT_OK || !topic) continue;
    for (int c = 0; c < LT_CLASS__COUNT; c++)
      if (strcmp(topic, s->out_topics[O_DISPATCH0 + c]) == 0) classes |= 1u << c;
  }
  wk->owns_partitions = classes == (1u << LT_CLASS__COUNT) - 1;
  const char *grp = NULL, *rdv = NULL; /* v2; a v1 heartbeat reads "" */
  lt_avro_get_string(rec, "node_group", &grp, NULL);
  lt_avro_get_string(rec, "rendezvous", &rdv, NULL);
  bool moved = strcmp(wk->group, grp ? grp : "") != 0 || strcmp(wk->rdv, rdv ? rdv : "") != 0;
  if (wk->up && s->sched && ((uint32_t)(slots > 0 ? slots : 0) != wk->slots || (uint64_t)mem != wk->mem || moved)) {
    bool busy = false;
    for (size_t i = 0; i < s->nsides && !busy; i++) busy = s->sides[i]->sched_running && scheduler_side_on_worker(s->sides[i], w);
    if (!busy) {
      lt_sched_worker_down(s->sched, w + 1, s->now_s);
      wk->up = false;
    }
  }
  if (!wk->up) {
    wk->slots = slots > 0 ? (uint32_t)slots : 0;
    wk->mem = mem > 0 ? (uint64_t)mem : 0;
    snprintf(wk->group, sizeof wk->group, "%s", grp ? grp : "");
    snprintf(wk->rdv, sizeof wk->rdv, "%s", rdv ? rdv : "");
  }
}

/* A heartbeat's base models: what the worker holds now (sync_workers tells lt_sched). */
static void heartbeat_models(lt_avro_record_t *rec, worker_t *wk) {
  size_t nm = 0;
  lt_avro_array_size(rec, "base_models", &nm);
  int old = wk->nmodels;
  wk->nmodels = 0;
  char path[64];
  const char *name = NULL;
  for (size_t i = 0; i < nm && wk->nmodels < MAX_MODELS; i++) {
    snprintf(path, sizeof path, "base_models[%zu]", i);
    if (lt_avro_get_string(rec, path, &name, NULL) == LT_OK)
      snprintf(wk->models[wk->nmodels++], LT_JOB_NAME_MAX, "%s", name);
  }
  wk->models_changed = wk->models_changed || old != wk->nmodels || nm > 0;
}

/* A heartbeat's leases: a later deadline for a job's current attempt extends what the scheduler
 * waits for before it declares the attempt lost. */
static void heartbeat_leases(lt_scheduler_t *s, lt_avro_record_t *rec) {
  size_t nl = 0;
  lt_avro_array_size(rec, "leases", &nl);
  lt_job_table_t *jobs = lt_proj_jobs(s->fold);
  char path[64];
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
    side_t *sd = j ? scheduler_side_get(s, jid, false, NULL) : NULL;
    if (sd && j->attempt == attempt && dl > sd->lease_deadline_ms) sd->lease_deadline_ms = dl;
  }
}

/* A WorkerHeartbeat: capacity, models and leases. One older than the last seen is ignored
 * (compaction keeps the newest). */
static void fold_heartbeat(lt_scheduler_t *s, lt_avro_record_t *rec) {
  const char *wid = NULL;
  if (lt_avro_get_string(rec, "worker_id", &wid, NULL) != LT_OK || !wid || !*wid) return;
  size_t w;
  worker_t *wk = worker_get(s, wid, &w);
  if (!wk) return;
  int64_t at = 0;
  lt_avro_get_long(rec, "occurred_at", &at);
  if (at < wk->last_hb_ms) return; /* an older heartbeat */
  wk->last_hb_ms = at;
  heartbeat_capacity(s, rec, w);
  heartbeat_models(rec, wk);
  heartbeat_leases(s, rec);
}

/* lt_proj_fold's callback for every record read: job records, heartbeats, tenant changes. */
static void on_folded(void *ctx, const lt_proj_result_t *res) {
  lt_scheduler_t *s = ctx;
  s->st.folded++;
  if (!res->type) return;
  if (res->job_id && res->job_outcome == LT_JOB_APPLIED) {
    fold_job(s, res);
    return;
  }
  if (strcmp(res->type, "WorkerHeartbeat") == 0) {
    fold_heartbeat(s, res->record);
    return;
  }
  if (strcmp(res->type, "TenantUpserted") == 0 && s->sched && res->record) {
    const char *tid = NULL;
    if (lt_avro_get_string(res->record, "tenant_id", &tid, NULL) == LT_OK && lt_map_has(s->tenant_ids, tid))
      scheduler_tenant_into_sched(s, tid, false);
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
  for (size_t i = 0; all && i < s->ntps; i++) all = lt_bus_read_to(pos[i].offset, s->next[i], s->low[i], s->hwm[i]);
  /* read_committed stops before commit markers and open transactions: after a quiet second the
   * log has nothing more to give */
  return all || now_ms - s->last_msg_ms > 1000;
}

/* The fold consumer's next record; NULL when it has none now or polling failed (said on stderr;
 * a fatal failure ends the term). */
static const lt_bus_msg_t *fold_next(lt_scheduler_t *s) {
  const lt_bus_msg_t *m = NULL;
  char err[512];
  lt_err_t e = lt_bus_consumer_poll(s->fold_c, 0, &m, err, sizeof err);
  if (!e) return m;
  lt_log_error("scheduler", "fold consumer: %s", err);
  if (e == LT_ERR_FATAL) stop_leading(s, err);
  return NULL;
}

static void feed(lt_scheduler_t *s) {
  if (!s->fold_c) return;
  int64_t now_ms = lt_time_wall_ms();
  bool more = false;
  for (int i = 0; i < 5000; i++) {
    const lt_bus_msg_t *m = fold_next(s);
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
    char err[512];
    lt_err_t e = lt_proj_fold_msg(s->fold, m, NULL, on_folded, s, err, sizeof err);
    if (e == LT_ERR_AUTH) lt_log_warn("scheduler", "%s", err);
    /* Dead-lettered once: by the leader that first reads it (later terms start past it). */
    if (e && tp >= 0 && off >= s->committed[tp]) scheduler_write_deadletter(s, m, e, err);
  }
  if (s->role == LT_SCHEDULER_CATCHUP && caught_up(s, now_ms)) {
    char err[512];
    s->now_s = (double)now_ms / 1000.0;
    if (scheduler_rebuild(s, now_ms, err, sizeof err)) {
      stop_leading(s, err);
      return;
    }
    s->role = LT_SCHEDULER_LEADING;
    lt_log_info("scheduler", "leading (term %" PRIu64 ", %zu jobs, %zu workers folded)", s->st.terms,
                s->nsides, s->nworkers);
  }
  if (s->role == LT_SCHEDULER_LEADING && s->sched_full) {
    scheduler_flush(s); /* what the term wrote so far goes out first (a failure ends it too) */
    if (s->role == LT_SCHEDULER_LEADING) stop_leading(s, "the policy's tables are full");
    return;
  }
  if (s->role == LT_SCHEDULER_LEADING) scheduler_step(s);
  else if (s->nout) scheduler_flush(s); /* dead letters found while catching up */
  if (more && s->fold_ev) event_active(s->fold_ev, EV_READ, 0);
}

static void on_fold_fd(evutil_socket_t fd, short what, void *arg) { feed(arg); }

/* ---------------------------------------------------------------- terms of leadership */

static void stop_leading(lt_scheduler_t *s, const char *why) {
  if (s->role == LT_SCHEDULER_STANDBY && !s->prod) return;
  lt_log_info("scheduler", "stops leading: %s", why ? why : "");
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
  s->nworkers = 0;
  for (size_t i = 0; i < s->ntenants; i++) free(s->tenant_names[i]);
  s->ntenants = 0;
  lt_map_t **indexes[] = {&s->side_idx, &s->worker_idx, &s->tenant_ids};
  for (size_t i = 0; i < sizeof indexes / sizeof *indexes; i++) {
    lt_map_destroy(*indexes[i]);
    *indexes[i] = NULL;
  }
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
  if (!err && s->conf.tenant_mac) lt_proj_require_tenant_mac(s->fold, s->conf.tenant_mac);
  if (err) return err;
  s->side_idx = lt_map_new(NULL);
  s->worker_idx = lt_map_new(NULL);
  s->tenant_ids = lt_map_new(NULL);
  if (!s->side_idx || !s->worker_idx || !s->tenant_ids)
    return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory for the term's indexes");
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
  if ((err = lt_bus_consumer_watermarks(s->fold_c, tmp, s->ntps, s->low, 10000, errstr, n))) return err;
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
      lt_log_error("scheduler", "cannot start leading: %s", err);
      stop_leading(s, err);
    }
  }
}

static void on_group_fd(evutil_socket_t fd, short what, void *arg) { poll_group(arg); }

static void on_tick(evutil_socket_t fd, short what, void *arg) {
  lt_scheduler_t *s = arg;
  poll_group(s);
  feed(s);
  if (s->fold_c) { /* a partition's fetcher may stop: see lt_bus.h */
    size_t healed = 0;
    char err[256];
    if (lt_bus_consumer_heal_stalls(s->fold_c, 10000, 500, &healed, err, sizeof err) == LT_OK && healed)
      lt_log_warn("scheduler", "fold: %zu partition(s) stood still behind the log for 10 s: fetching them again",
                  healed);
  }
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
  if (c->max_unavailable_stops <= 0) c->max_unavailable_stops = 30;
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
  lt_err_t err = LT_OK;
  for (int r = 0; !err && r < R_N; r++) err = lt_avro_record_new(c->registry, rec_types[r], &s->rec[r], errstr, n);
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
  if (!err) err = scheduler_ops_open(s, errstr, n);
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
  scheduler_ops_close(s);
  if (s->group_ev) event_free(s->group_ev);
  if (s->tick_ev) event_free(s->tick_ev);
  lt_bus_consumer_destroy(s->group);
  for (int r = 0; r < R_N; r++) lt_avro_record_destroy(s->rec[r]);
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

