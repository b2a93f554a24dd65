/* lt_scheduler_decide: what `lathed scheduler` decides while it leads, and the records it writes
 * for it — validation (JobAccepted, JobRejected), lease and duration watch (AttemptStopped lost,
 * JobFailed), cancels, and lt_sched's dispatches and preemptions, kept in step with the fold
 * (lt_sched bookkeeping, rebuilt at the start of every term). */
#include "lt_scheduler_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_dataset.h"
#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_tenant.h"
#include "lt_time.h"

/* ---------------------------------------------------------------- record writers */

/* An attempt's workers by rank (n = 1: a job on one worker) and each rank's GPUs there. */
typedef struct placement {
  uint32_t n;
  size_t w[GANG_MAX];
  uint64_t mask[GANG_MAX];
} placement_t;

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
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.accepted++;
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
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.rejected++;
  sd->w_decided = true;
}

static void write_failed(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, const char *code, const char *reason) {
  lt_avro_record_t *rec = begin_rec(s, R_FAIL, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "code", code);
  lt_avro_set_string(rec, "reason", reason);
  lt_avro_set_int(rec, "attempts", j->attempt);
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.failed++;
  sd->w_terminal = true;
}

static void write_cancelled(lt_scheduler_t *s, side_t *sd, const lt_job_t *j) {
  lt_avro_record_t *rec = begin_rec(s, R_CANC, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "cancel_event_id", sd->cancel_event_id);
  lt_avro_set_string(rec, "requested_by", sd->requested_by[0] ? sd->requested_by : "customer");
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.cancelled++;
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
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.lost++;
  sd->w_lost_attempt = j->attempt;
}

static void write_preempt(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, int64_t now_ms, const char *why) {
  lt_avro_record_t *rec = begin_rec(s, R_PRE, sd, j);
  lt_avro_set_int(rec, "attempt", j->attempt);
  lt_avro_set_string(rec, "reason", why);
  lt_avro_set_long(rec, "checkpoint_deadline", now_ms + s->conf.checkpoint_deadline_ms);
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) == LT_OK) s->st.preempted++;
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

/* Where rank 0 of a gang listens: its worker's rendezvous host, at the worker's port plus the
 * lowest index of rank 0's GPUs (two gangs with rank 0 on one worker hold distinct GPUs). */
static bool gang_rendezvous(const worker_t *wk, uint64_t mask0, char *out, size_t size) {
  const char *colon = strrchr(wk->rdv, ':');
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!colon || !end || *end || port <= 0 || port + __builtin_ctzll(mask0 | (1ULL << 63)) > 65535) return false;
  snprintf(out, size, "%.*s:%ld", (int)(colon - wk->rdv), wk->rdv, port + __builtin_ctzll(mask0 | (1ULL << 63)));
  return true;
}

/* The gang fields of a dispatch across pl->n > 1 workers (rank 0's; write_dispatch sets each
 * rank's own). False when rank 0's worker has no usable rendezvous address. */
static bool set_gang(lt_scheduler_t *s, lt_avro_record_t *rec, const placement_t *pl) {
  char rdv[300];
  if (!gang_rendezvous(&s->workers[pl->w[0]], pl->mask[0], rdv, sizeof rdv)) return false;
  lt_avro_set_int(rec, "gang_world", (int32_t)pl->n);
  lt_avro_set_int(rec, "gang_rank", 0);
  lt_avro_set_string(rec, "gang_rendezvous", rdv);
  char path[48];
  for (uint32_t r = 0; r < pl->n; r++) {
    lt_avro_array_append_string(rec, "gang_workers", s->workers[pl->w[r]].id);
    snprintf(path, sizeof path, "gang_gpu_masks[%u]", r);
    lt_avro_set_long(rec, path, (int64_t)pl->mask[r]);
  }
  return true;
}

/* The attempt's JobDispatched: one on lathe.control (rank 0's worker; a gang's names every
 * worker), and one per rank on its class's dispatch topic, on a partition its worker owns. */
static bool write_dispatch(lt_scheduler_t *s, side_t *sd, const lt_job_t *j, const placement_t *pl, int64_t now_ms) {
  int32_t attempt = (j->attempt > sd->w_dispatch_attempt ? j->attempt : sd->w_dispatch_attempt) + 1;
  lt_avro_record_t *rec = begin_rec(s, R_DISP, sd, j);
  char err[256];
  if (lt_jobspec_to_record(&sd->spec, rec, err, sizeof err) != LT_OK) {
    lt_log(LT_LOG_ERROR, "scheduler", LT_LOG_JOB(sd->job_id), "job %s: %s", sd->job_id, err);
    return false;
  }
  if (pl->n > 1 && !set_gang(s, rec, pl)) {
    lt_log(LT_LOG_WARN, "scheduler", LT_LOG_JOB(sd->job_id),
           "job %s: worker %s has no usable rendezvous address (\"%s\") for a gang", sd->job_id,
           s->workers[pl->w[0]].id, s->workers[pl->w[0]].rdv);
    return false;
  }
  lt_avro_set_int(rec, "attempt", attempt);
  lt_avro_set_string(rec, "worker_id", s->workers[pl->w[0]].id);
  lt_avro_set_long(rec, "memory_bytes", 0);
  lt_avro_set_long(rec, "lease_ms", s->conf.lease_ms);
  lt_avro_set_long(rec, "lease_deadline", now_ms + s->conf.lease_ms);
  if (j->ckpt_attempt > 0 && j->ckpt_key[0]) {
    lt_avro_set_long(rec, "resume_step", j->ckpt_step);
    if (sd->ckpt_event_id[0]) lt_avro_set_string(rec, "resume_checkpoint_event_id", sd->ckpt_event_id);
  }
  if (scheduler_emit(s, O_CONTROL, sd->job_id, NULL, 0, rec) != LT_OK) return false;
  int topic = O_DISPATCH0 + (int)sd->spec.priority;
  for (uint32_t r = 0; r < pl->n; r++) {
    const char *worker = s->workers[pl->w[r]].id;
    lt_avro_set_string(rec, "worker_id", worker);
    if (pl->n > 1) lt_avro_set_int(rec, "gang_rank", (int32_t)r);
    if (scheduler_emit(s, topic, sd->job_id, NULL, 0, rec) != LT_OK) return false;
    s->out[s->nout - 1].partition = dispatch_partition(s, worker, s->out_topics[topic]);
  }
  sd->gang_n = pl->n > 1 ? pl->n : 0;
  for (uint32_t r = 0; r < pl->n && pl->n > 1; r++) {
    sd->gang_w[r] = (uint32_t)pl->w[r];
    sd->gang_mask[r] = pl->mask[r];
  }
  sd->w_dispatch_attempt = attempt;
  s->st.dispatched++;
  return true;
}

void scheduler_write_deadletter(lt_scheduler_t *s, const lt_bus_msg_t *m, lt_err_t code, const char *reason) {
  lt_avro_record_t *rec = begin_rec(s, R_DEAD, NULL, NULL);
  size_t klen = 0;
  const void *key = lt_bus_msg_key(m, &klen);
  if (klen > LT_DEAD_LETTER_KEY_MAX) klen = LT_DEAD_LETTER_KEY_MAX; /* as the record's own key field */
  lt_dead_letter_fill(rec, m, code, reason, s->producer_id);
  if (scheduler_emit(s, O_DEADLETTER, NULL, key, klen, rec) == LT_OK) s->st.deadlettered++;
}

/* ---------------------------------------------------------------- lt_sched bookkeeping */

void scheduler_sched_full(lt_scheduler_t *s, const char *why) {
  if (!s->sched_full)
    lt_log_warn("scheduler", "%s: this term ends, and the next sizes the policy's tables for what the log holds", why);
  s->sched_full = true;
}

uint64_t scheduler_tenant_into_sched(lt_scheduler_t *s, const char *tenant, bool placing) {
  uint64_t id = scheduler_tenant_id(s, tenant);
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(s->fold), tenant);
  lt_sched_tenant_t st = {.id = id, .weight = t && t->weight > 0 ? t->weight : 1.0};
  if (t && !placing && t->quotas.max_running_slots > 0) st.max_running_slots = (uint32_t)t->quotas.max_running_slots;
  /* max_queued_jobs is counted by the API before it accepts; durations are enforced here. */
  char err[256];
  if (lt_sched_tenant_upsert(s->sched, &st, err, sizeof err) == LT_ERR_UNAVAILABLE) scheduler_sched_full(s, err);
  return id;
}

/* A job's run-time bound per attempt: the spec's max_duration_s or the tenant's, the lower;
 * 0: none. examine() fails a job past it; lt_sched backfills by it. */
static int64_t duration_limit_s(lt_scheduler_t *s, const side_t *sd, const lt_job_t *j) {
  int64_t lim = sd->spec_err ? j->max_duration_s : sd->spec.max_duration_s;
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(s->fold), j->tenant_id);
  if (t && t->quotas.max_job_duration_s > 0 && (lim <= 0 || t->quotas.max_job_duration_s < lim))
    lim = t->quotas.max_job_duration_s;
  return lim;
}

static bool sched_enqueue(lt_scheduler_t *s, size_t idx, int32_t attempt, lt_job_class_t cls) {
  side_t *sd = s->sides[idx];
  const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
  if (!j) return false;
  uint32_t model = LT_SCHED_NO_MODEL;
  if (j->base_model[0]) lt_sched_model_intern(s->sched, j->base_model, &model, NULL, 0);
  lt_sched_job_t sj = {.id = idx + 1,
                       .tenant_id = scheduler_tenant_into_sched(s, j->tenant_id, false),
                       .cls = cls,
                       .gpus = j->gpus > 0 ? (uint32_t)j->gpus : 1,
                       .model = model,
                       .attempt = attempt > 0 ? (uint32_t)attempt : 0,
                       .limit_s = (double)duration_limit_s(s, sd, j)};
  char err[256];
  lt_err_t e = lt_sched_job_enqueue(s->sched, &sj, s->now_s, err, sizeof err);
  if (e == LT_ERR_UNAVAILABLE) scheduler_sched_full(s, err);
  if (e) return false;
  sd->in_sched = true;
  sd->sched_running = false;
  return true;
}

void scheduler_drop(lt_scheduler_t *s, side_t *sd) {
  if (!sd->in_sched) return;
  size_t idx;
  scheduler_side_get(s, sd->job_id, false, &idx);
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

bool scheduler_side_on_worker(const side_t *sd, size_t w) {
  if (sd->sched_worker == w) return true;
  for (uint32_t r = 0; r < sd->gang_n; r++)
    if (sd->gang_w[r] == w) return true;
  return false;
}

static bool worker_alive(const lt_scheduler_t *s, const worker_t *w, int64_t now_ms) {
  return w->slots > 0 && now_ms - w->last_hb_ms <= s->conf.worker_timeout_ms;
}

/* The policy's node group of worker w: the workers naming one group (and a rendezvous) share
 * an id, the first such worker's index + 1; a worker without both is a group of its own
 * (2^31 + index), so no gang spans it. */
static uint32_t worker_group(const lt_scheduler_t *s, size_t w) {
  const worker_t *wk = &s->workers[w];
  if (!wk->group[0] || !wk->rdv[0]) return 0x80000000u + (uint32_t)w;
  for (size_t k = 0; k < w; k++)
    if (s->workers[k].rdv[0] && strcmp(s->workers[k].group, wk->group) == 0) return (uint32_t)k + 1;
  return (uint32_t)w + 1;
}

static void worker_bring_up(lt_scheduler_t *s, size_t w) {
  worker_t *wk = &s->workers[w];
  lt_sched_worker_t sw = {.id = w + 1, .node_group = worker_group(s, w),
                          .slots = wk->slots > LT_SCHED_MAX_WORKER_SLOTS ? LT_SCHED_MAX_WORKER_SLOTS : wk->slots,
                          .mem_bytes = wk->mem,
                          .model_cache = wk->nmodels > 4 ? (uint32_t)wk->nmodels : 4};
  char err[256];
  lt_err_t e = lt_sched_worker_up(s->sched, &sw, err, sizeof err);
  if (e == LT_ERR_UNAVAILABLE) scheduler_sched_full(s, err);
  if (e) {
    lt_log_error("scheduler", "worker %s: %s", wk->id, err);
    return;
  }
  wk->up = true;
  worker_models(s, w);
}

static worker_t *worker_find(lt_scheduler_t *s, const char *id, size_t *w) {
  size_t pos = (uintptr_t)lt_map_get(s->worker_idx, id);
  if (!pos) return NULL;
  *w = pos - 1;
  return &s->workers[pos - 1];
}

void scheduler_worker_missed_start(lt_scheduler_t *s, const char *worker_id, int64_t now_ms) {
  size_t w;
  worker_t *wk = worker_find(s, worker_id, &w);
  if (!wk) return;
  int shift = wk->missed_starts < 3 ? wk->missed_starts : 3;
  wk->missed_starts++;
  wk->cordon_until_ms = now_ms + ((int64_t)s->conf.start_timeout_ms << shift);
  if (wk->up) lt_sched_worker_cordon(s->sched, w + 1, true);
  lt_log_warn("scheduler", "worker %s: %d dispatch(es) in a row not started in %lld ms: no new work for it for %lld ms",
              wk->id, wk->missed_starts, (long long)s->conf.start_timeout_ms,
              (long long)(wk->cordon_until_ms - now_ms));
}

void scheduler_worker_started(lt_scheduler_t *s, const char *worker_id) {
  size_t w;
  worker_t *wk = worker_find(s, worker_id, &w);
  if (!wk) return;
  wk->missed_starts = 0;
  if (wk->cordon_until_ms) {
    wk->cordon_until_ms = 0;
    if (wk->up && s->sched) lt_sched_worker_cordon(s->sched, w + 1, wk->draining);
  }
}

/* A worker whose heartbeat lists no dispatch partition of some class while another's lists one
 * of each: the workers' group left it none (more workers than a class topic has partitions; the
 * range assignor gives the extra ones nothing) or has not assigned it yet. A dispatch to it would
 * land on a partition another worker owns, which drops it as not its own: it takes no work until
 * it owns one of each. Where no worker lists them (none assigned yet, or workers that do not
 * say), the key hash decides. */
static bool partless(worker_t *wk, bool any) {
  bool none = !wk->owns_partitions && any;
  if (none && !wk->partless_said)
    lt_log_warn("scheduler", "worker %s owns no partition of some class's dispatch topic in the workers' group: it "
                "takes no work until it owns one of each (more workers than partitions of lathe.dispatch.*? "
                "ops/topics.tsv)", wk->id);
  wk->partless_said = none;
  return none;
}

/* Whether the log says sd's job runs on worker w (a gang's rank there, or the job's worker):
 * not sched_worker, which only a booking sets. */
static bool runs_on(lt_scheduler_t *s, const side_t *sd, size_t w) {
  for (uint32_t r = 0; r < sd->gang_n; r++)
    if (sd->gang_w[r] == w) return true;
  const lt_job_t *j = sd->gang_n ? NULL : lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
  return j && strcmp(j->worker_id, s->workers[w].id) == 0;
}

/* Workers whose heartbeats stopped go down; new or returning ones come up. A job booked on a
 * worker that goes down leaves lt_sched, and is not queued again before the log says so
 * (AttemptStopped lost after its lease expired: invariant 2); when the worker comes back within
 * the lease, its jobs still running there are booked on it again (examine, before any decision
 * of the step could give their slots away). */
static void sync_workers(lt_scheduler_t *s, int64_t now_ms) {
  bool any = false; /* a live worker lists dispatch partitions */
  for (size_t w = 0; w < s->nworkers && !any; w++)
    any = s->workers[w].owns_partitions && worker_alive(s, &s->workers[w], now_ms);
  for (size_t w = 0; w < s->nworkers; w++) {
    worker_t *wk = &s->workers[w];
    bool alive = worker_alive(s, wk, now_ms);
    if (wk->up && !alive) {
      for (size_t i = 0; i < s->nsides; i++)
        if (s->sides[i]->sched_running && scheduler_side_on_worker(s->sides[i], w)) {
          scheduler_drop(s, s->sides[i]);
          s->sides[i]->unbooked_tried = 0; /* booked again if the worker comes back in time */
        }
      lt_sched_worker_down(s->sched, w + 1, s->now_s);
      wk->up = false;
    } else if (!wk->up && alive && !wk->draining) {
      worker_bring_up(s, w);
      for (size_t i = 0; i < s->nsides && wk->up; i++)
        if (!s->sides[i]->sched_running && runs_on(s, s->sides[i], w)) s->sides[i]->dirty = true;
    } else if (wk->up && wk->models_changed) {
      worker_models(s, w);
    }
    /* a cordon (scheduler_worker_missed_start) ends with its time, one that came up again gets
     * what is left of it; a worker whose heartbeat says it drains (a graceful stop) gets no new
     * work while its attempts checkpoint and stop */
    if (wk->up)
      lt_sched_worker_cordon(s->sched, w + 1, wk->draining || now_ms < wk->cordon_until_ms || partless(wk, any));
    if (wk->cordon_until_ms && now_ms >= wk->cordon_until_ms) wk->cordon_until_ms = 0;
  }
}

static bool live_state(lt_job_state_t st) {
  return st == LT_JOB_DISPATCHED || st == LT_JOB_RUNNING || st == LT_JOB_PREEMPTING;
}

/* A queued job of the side table (idx) and when it entered the queue (at). */
typedef struct {
  size_t idx;
  int64_t at;
} order_t;

/* Queue order: by entry time; ties by side index, the order the fold met the jobs. */
static int cmp_order(const void *a, const void *b) {
  const order_t *x = a, *y = b;
  int by_time = (x->at > y->at) - (x->at < y->at);
  return by_time ? by_time : (x->idx > y->idx) - (x->idx < y->idx);
}

/* Books live job sd where the log says it runs: on its worker, or a gang's on its workers in
 * rank order (JobDispatched's gang_workers); queued first unless lt_sched holds it queued. Logged
 * and left out of lt_sched when that cannot be done (a worker of it is not up, or its slots are
 * taken): its slots then look free. */
static void rebuild_running(lt_scheduler_t *s, size_t i, const lt_job_t *j) {
  side_t *sd = s->sides[i];
  uint64_t ids[GANG_MAX];
  uint32_t n = sd->gang_n ? sd->gang_n : 1;
  size_t w0 = 0;
  if (!sd->gang_n && !worker_find(s, j->worker_id, &w0)) return;
  for (uint32_t r = 0; r < n; r++) ids[r] = (sd->gang_n ? sd->gang_w[r] : w0) + 1;
  char err[256] = "";
  if ((!sd->in_sched && !sched_enqueue(s, i, j->attempt - 1, j->job_class)) ||
      lt_sched_job_book(s->sched, i + 1, ids, sd->gang_n ? sd->gang_mask : NULL, n, s->now_s, err, sizeof err) !=
          LT_OK) {
    lt_log(LT_LOG_WARN, "scheduler", LT_LOG_JOB(sd->job_id), "job %s running on %s could not be booked there: %s",
           sd->job_id, j->worker_id, err[0] ? err : "not queued");
    scheduler_drop(s, sd);
    return;
  }
  sd->sched_running = true;
  sd->sched_worker = (uint32_t)ids[0] - 1;
}

/* Whether every worker live job sd runs on (a gang's, or its one) is up in lt_sched. */
static bool workers_up(lt_scheduler_t *s, const side_t *sd, const lt_job_t *j) {
  size_t w = 0;
  if (!sd->gang_n) return worker_find(s, j->worker_id, &w) && s->workers[w].up;
  for (uint32_t r = 0; r < sd->gang_n; r++)
    if (sd->gang_w[r] >= s->nworkers || !s->workers[sd->gang_w[r]].up) return false;
  return true;
}

/* A queued job is out of attempts: max_attempts failed, or max_unavailable_stops that the object
 * store stopped (away for their inputs or a checkpoint); examine() records its JobFailed. */
static bool attempts_spent(const lt_scheduler_t *s, const lt_job_t *j) {
  return j->failed_attempts >= s->conf.max_attempts || j->unavailable_stops >= s->conf.max_unavailable_stops;
}

/* Queues the jobs the log says are queued, in the order they entered the queue. */
static lt_err_t rebuild_queue(lt_scheduler_t *s, char *errstr, size_t n) {
  lt_job_table_t *jobs = lt_proj_jobs(s->fold);
  order_t *q = malloc((s->nsides ? s->nsides : 1) * sizeof *q);
  if (!q) return lt_errf(errstr, n, LT_ERR_NOMEM, "out of memory");
  size_t nq = 0;
  for (size_t i = 0; i < s->nsides; i++) {
    const lt_job_t *j = lt_job_get(jobs, s->sides[i]->job_id);
    if (j && j->state == LT_JOB_QUEUED && !j->cancel_requested && !j->parked && !attempts_spent(s, j))
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

/* Builds lt_sched from the fold when a term starts: the live workers come up (a draining one
 * only when something runs there), each running job is booked where the log says it runs
 * (lt_sched_job_book), then the tenants' quotas and the queue. */
lt_err_t scheduler_rebuild(lt_scheduler_t *s, int64_t now_ms, char *errstr, size_t n) {
  /* The policy's tables are sized once: twice what the log holds, the configured sizes at least
   * (lathe.workers keeps a heartbeat of every worker id ever; a term that meets more than fit
   * ends, scheduler_sched_full, and the next one sizes them again). */
  lt_sched_config_t cfg = s->policy;
  size_t tenants = lt_tenant_count(lt_proj_tenants(s->fold)), live = 0;
  for (size_t i = 0; i < s->nsides; i++) {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), s->sides[i]->job_id);
    live += j && !lt_job_state_is_terminal(j->state);
  }
  if (2 * tenants > cfg.max_tenants) cfg.max_tenants = (uint32_t)(2 * tenants);
  if (2 * s->nworkers > cfg.max_workers) cfg.max_workers = (uint32_t)(2 * s->nworkers);
  if (2 * live > cfg.max_jobs) cfg.max_jobs = (uint32_t)(2 * live);
  s->sched_full = false;
  lt_err_t err = lt_sched_new(&cfg, &s->sched, errstr, n);
  if (err) return err;
  lt_job_table_t *jobs = lt_proj_jobs(s->fold);
  for (size_t w = 0; w < s->nworkers; w++) {
    bool hosts = false;
    for (size_t i = 0; i < s->nsides && s->workers[w].draining && !hosts; i++) {
      const lt_job_t *j = lt_job_get(jobs, s->sides[i]->job_id);
      bool part = j && strcmp(j->worker_id, s->workers[w].id) == 0;
      for (uint32_t r = 0; r < s->sides[i]->gang_n; r++) part |= s->sides[i]->gang_w[r] == w;
      hosts = part && j && live_state(j->state) && !j->attempt_stopped;
    }
    if (worker_alive(s, &s->workers[w], now_ms) && (!s->workers[w].draining || hosts)) worker_bring_up(s, w);
  }
  /* gangs on the GPUs their dispatch named first, then gangs whose record named none (v2, v3:
   * free GPUs in rank order), then the jobs on one worker (free GPUs: only their count matters) */
  for (int pass = 0; pass < 3; pass++)
    for (size_t i = 0; i < s->nsides; i++) {
      const side_t *sd = s->sides[i];
      const lt_job_t *j = lt_job_get(jobs, sd->job_id);
      int kind = sd->gang_n == 0 ? 2 : sd->gang_mask[0] ? 0 : 1;
      if (j && live_state(j->state) && !j->attempt_stopped && kind == pass) rebuild_running(s, i, j);
    }
  /* real quotas, then the queue */
  for (size_t t = 0; t < s->ntenants; t++) scheduler_tenant_into_sched(s, s->tenant_names[t], false);
  return rebuild_queue(s, errstr, n);
}

/* ---------------------------------------------------------------- decisions */

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

/* Whether a worker of gang sd says in its heartbeat that it drains. */
static bool gang_draining(const lt_scheduler_t *s, const side_t *sd) {
  for (uint32_t r = 0; r < sd->gang_n; r++)
    if (s->workers[sd->gang_w[r]].draining) return true;
  return false;
}

/* Everything the fold says should happen to one job now, except dispatch (lt_sched's). */
static void examine(lt_scheduler_t *s, size_t idx, int64_t now_ms) {
  side_t *sd = s->sides[idx];
  const lt_job_t *j = lt_job_get(lt_proj_jobs(s->fold), sd->job_id);
  if (!j) return;
  if (lt_job_state_is_terminal(j->state) || sd->w_terminal) {
    scheduler_drop(s, sd);
    return;
  }
  bool mine_read_back = j->attempt >= sd->w_dispatch_attempt;
  if (j->cancel_requested) {
    if (j->state == LT_JOB_SUBMITTED || j->state == LT_JOB_QUEUED || j->state == LT_JOB_DISPATCHED ||
        j->attempt_stopped) {
      if (mine_read_back) {
        write_cancelled(s, sd, j);
        scheduler_drop(s, sd);
        return;
      }
    }
  }
  if (j->state == LT_JOB_SUBMITTED) {
    if (!sd->w_decided) validate(s, sd, j, now_ms);
    return;
  }
  if (j->state == LT_JOB_QUEUED) {
    if (attempts_spent(s, j)) {
      bool away = j->failed_attempts < s->conf.max_attempts; /* the store's bound, not failures */
      const char *last = j->reason[0] ? j->reason : "(no reason given)";
      char why[LT_JOB_REASON_MAX + 192];
      if (away)
        snprintf(why, sizeof why,
                 "the object store could not be reached on %d attempts (for their inputs, or for a checkpoint); "
                 "last: %s; submit it again once the store is back", (int)j->unavailable_stops, last);
      else
        snprintf(why, sizeof why, "failed %d attempts; last: %s", (int)j->failed_attempts, last);
      write_failed(s, sd, j, away ? "store_unavailable" : "too_many_attempts", why);
      scheduler_drop(s, sd);
      return;
    }
    /* A parked session waits out of the queue, holding nothing, until a call wakes it. */
    if (!sd->in_sched && mine_read_back && !j->cancel_requested && !j->parked)
      sched_enqueue(s, idx, j->attempt, j->job_class);
    return;
  }
  if (!live_state(j->state) || j->attempt_stopped || !mine_read_back) return;
  if (j->state == LT_JOB_DISPATCHED) {
    int64_t since = sd->dispatched_at_ms ? sd->dispatched_at_ms : now_ms;
    if (now_ms - since > s->conf.start_timeout_ms && sd->redispatch_for != j->attempt && !j->cancel_requested) {
      /* not started in time: a new attempt (the new number fences this one), not on that worker
       * for a while */
      sd->redispatch_for = j->attempt;
      scheduler_worker_missed_start(s, j->worker_id, now_ms);
      if (sd->in_sched && sd->sched_running) {
        size_t i;
        scheduler_side_get(s, sd->job_id, false, &i);
        if (lt_sched_job_requeue(s->sched, i + 1, s->now_s) == LT_OK) sd->sched_running = false;
        else scheduler_drop(s, sd);
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
      scheduler_drop(s, sd); /* back in lt_sched when the log says it is queued */
    }
    return;
  }
  if (!sd->sched_running && sd->unbooked_tried != j->attempt && workers_up(s, sd, j)) {
    /* running, and not booked in lt_sched: started after lt_sched requeued it at the start
     * timeout (a dispatch read late, a slot freed late), or on a worker that missed heartbeats
     * and came back before the lease ran out (its jobs were dropped with it). Booked where it
     * runs, once an attempt, or its worker would look free and no quota or preemption apply. */
    sd->unbooked_tried = j->attempt;
    rebuild_running(s, idx, j);
  }
  if (j->state == LT_JOB_RUNNING && sd->preempt_owed == j->attempt && sd->w_preempt_attempt != j->attempt)
    write_preempt(s, sd, j, now_ms, "a higher priority class is waiting: checkpoint and stop");
  /* a gang with a part on a draining worker: rank 0, elsewhere, checkpoints and stops it (the
   * draining worker stops only what it speaks for, lt_worker_drain) */
  if (j->state == LT_JOB_RUNNING && sd->gang_n && sd->w_preempt_attempt != j->attempt && gang_draining(s, sd))
    write_preempt(s, sd, j, now_ms, "a worker of the gang drains: checkpoint and stop");
  int64_t lim = duration_limit_s(s, sd, j);
  if (lim > 0 && j->state == LT_JOB_RUNNING && j->started_at_ms && now_ms - j->started_at_ms > lim * 1000) {
    char why[128];
    snprintf(why, sizeof why, "ran past its maximum duration of %lld s", (long long)lim);
    write_failed(s, sd, j, "max_duration", why);
    scheduler_drop(s, sd);
  }
}

/* The placement of the dispatch rows d[0..] of one job (a gang's world rows, rank 0 first, come
 * together: lt_sched.h); false for rows that are not one whole gang, or one wider than
 * GANG_MAX workers (logged; the caller drops the job from the policy, which frees its parts). */
static bool placement_of(const lt_scheduler_t *s, const lt_sched_decision_t *d, size_t left, placement_t *pl) {
  uint32_t n = d[0].world > 1 ? d[0].world : 1;
  pl->n = n;
  pl->mask[0] = d[0].gpu_mask;
  pl->w[0] = d[0].worker_id > 0 ? (size_t)(d[0].worker_id - 1) : 0;
  if (n > GANG_MAX || n > left) {
    lt_log_error("scheduler", "job placed on %u workers: a gang spans at most %d", n, GANG_MAX);
    return false;
  }
  for (uint32_t r = 0; r < n; r++) {
    if (d[r].job_id != d[0].job_id || d[r].rank != r || d[r].worker_id == 0 || d[r].worker_id > s->nworkers)
      return false;
    pl->w[r] = (size_t)(d[r].worker_id - 1);
    pl->mask[r] = d[r].gpu_mask;
  }
  return true;
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
        placement_t pl;
        bool whole = placement_of(s, &d[k], nd - k, &pl);
        k += (whole ? pl.n : 1) - 1; /* the gang's other rows are in pl */
        bool ok = !lt_job_state_is_terminal(j->state) && !sd->w_terminal && !j->cancel_requested &&
                  j->attempt >= sd->w_dispatch_attempt &&
                  (j->state == LT_JOB_QUEUED || (j->state == LT_JOB_DISPATCHED && sd->redispatch_for == j->attempt));
        sd->sched_running = true;
        sd->sched_worker = (uint32_t)pl.w[0];
        if (!whole || !ok || !write_dispatch(s, sd, j, &pl, now_ms)) scheduler_drop(s, sd);
      } else if (d[k].action == LT_SCHED_PREEMPT) {
        if (j->state == LT_JOB_RUNNING && !j->attempt_stopped && sd->w_preempt_attempt != j->attempt)
          write_preempt(s, sd, j, now_ms, "a higher priority class is waiting: checkpoint and stop");
        else if (j->state == LT_JOB_QUEUED || j->state == LT_JOB_DISPATCHED)
          /* dispatched, maybe in this very call, and not started: lt_sched counts it preempting
           * and will not ask again, so it is asked when its attempt starts (examine) */
          sd->preempt_owed = j->state == LT_JOB_QUEUED ? sd->w_dispatch_attempt : j->attempt;
      }
    }
    if (nd < DECIDE_CAP) break;
  }
}

void scheduler_step(lt_scheduler_t *s) {
  if (s->role != LT_SCHEDULER_LEADING) return;
  if (s->sched_full) return; /* the term ends (feed) */
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
  scheduler_flush(s);
}
