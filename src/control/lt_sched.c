/* lt_sched: the scheduling policy's lifecycle, events and visibility (see lt_sched.h for the
 * contract). The queues and fair-share heaps are in lt_sched_queue.c, the decisions in
 * lt_sched_decide.c; the tables they share in lt_sched_int.h. */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t pow2_at_least(uint32_t n) {
  uint32_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

/* Puts entry idx, whose key is id and whose chain link is *hnext, at the head of its chain. */
static void hash_add(uint32_t *table, uint32_t mask, uint64_t id, uint32_t *hnext, uint32_t idx) {
  uint32_t *b = &table[mix64(id) & mask];
  *hnext = *b;
  *b = idx;
}

static void job_hash_remove(lt_sched_t *s, uint32_t jx) {
  uint32_t *p = &s->job_hash[mix64(s->jobs[jx].id) & s->job_hmask];
  while (*p != jx) p = &s->jobs[*p].hnext;
  *p = s->jobs[jx].hnext;
}

/* The next n items of size bytes in the tables block (16-byte aligned), advancing *off; with base
 * NULL only *off moves. */
static void *carve(char *base, size_t *off, size_t n, size_t size) {
  size_t at = (*off + 15) & ~(size_t)15;
  *off = at + n * size;
  return base ? base + at : NULL;
}

/* Points every table of s at its place in the block base (NULL: only measures it) and returns
 * the block's size. All sizes come from s->cfg, the hash masks and s->words, so one allocation
 * holds every table and lt_sched_destroy frees one block. */
static size_t sched_tables_layout(lt_sched_t *s, char *base) {
  const lt_sched_config_t *c = &s->cfg;
  size_t off = 0;
  s->jobs = carve(base, &off, c->max_jobs, sizeof *s->jobs);
  s->job_hash = carve(base, &off, (size_t)s->job_hmask + 1, sizeof *s->job_hash);
  s->tenants = carve(base, &off, c->max_tenants, sizeof *s->tenants);
  s->ten_hash = carve(base, &off, (size_t)s->ten_hmask + 1, sizeof *s->ten_hash);
  s->workers = carve(base, &off, c->max_workers, sizeof *s->workers);
  s->wrk_hash = carve(base, &off, (size_t)s->wrk_hmask + 1, sizeof *s->wrk_hash);
  s->model_names = carve(base, &off, c->max_models, sizeof *s->model_names);
  s->parts = carve(base, &off, s->parts_cap, sizeof *s->parts);
  s->groups = carve(base, &off, c->max_workers, sizeof *s->groups);
  s->gang_key = carve(base, &off, c->max_workers, sizeof *s->gang_key);
  s->free_bm = carve(base, &off, (LT_SCHED_MAX_WORKER_SLOTS + 1) * s->words, sizeof *s->free_bm);
  s->model_bm = carve(base, &off, (size_t)c->max_models * s->words, sizeof *s->model_bm);
  for (int k = 0; k < LT_CLASS__COUNT; k++) {
    s->heap[k] = carve(base, &off, c->max_tenants, sizeof *s->heap[k]);
    s->blocked[k] = carve(base, &off, c->max_tenants, sizeof *s->blocked[k]);
  }
  s->scratch_d = carve(base, &off, c->max_tenants, sizeof *s->scratch_d);
  s->scratch_w = carve(base, &off, c->max_tenants, sizeof *s->scratch_w);
  s->scratch_a = carve(base, &off, c->max_tenants, sizeof *s->scratch_a);
  s->scratch_t = carve(base, &off, c->max_tenants, sizeof *s->scratch_t);
  s->fair_t = carve(base, &off, c->max_tenants, sizeof *s->fair_t);
  return off;
}

/* ---- lifecycle -------------------------------------------------------------------------- */

void lt_sched_config_default(lt_sched_config_t *c) {
  *c = (lt_sched_config_t){.policy = LT_SCHED_POLICY_LATHE,
                           .max_tenants = 1024,
                           .max_workers = 1024,
                           .max_jobs = 65536,
                           .max_models = 256,
                           .aging_s = 600,
                           .aging_levels = 1,
                           .preempt_after_s = 120,
                           .gang_reserve_after_s = 300,
                           .production_reserve = 0.1,
                           .max_scan = 256,
                           .las_threshold_gpu_s = 3600,
                           .las_preempt = true};
}

lt_err_t lt_sched_new(const lt_sched_config_t *config, lt_sched_t **out, char *errstr,
                      size_t errstr_size) {
  *out = NULL;
  lt_sched_config_t cfg;
  if (config) cfg = *config;
  else lt_sched_config_default(&cfg);
  if (cfg.policy != LT_SCHED_POLICY_LATHE && cfg.policy != LT_SCHED_POLICY_FIFO &&
      cfg.policy != LT_SCHED_POLICY_LAS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sched: unknown policy %d",
                   (int)cfg.policy);
  if (cfg.max_tenants == 0 || cfg.max_workers == 0 || cfg.max_jobs == 0 || cfg.max_models == 0 ||
      cfg.max_jobs >= NIL / 2 || cfg.max_tenants >= NIL / 2 || cfg.max_workers >= NIL / 2)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: max_tenants, max_workers, max_jobs and max_models must be in 1..2^30");
  if (!(cfg.production_reserve >= 0 && cfg.production_reserve <= 1))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: production_reserve must be within 0..1, got %g",
                   cfg.production_reserve);
  if (!(cfg.aging_s >= 0) || cfg.aging_levels > 2)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: aging_s must be >= 0 and aging_levels within 0..2");
  if (cfg.max_scan == 0) cfg.max_scan = 1;

  lt_sched_t *s = calloc(1, sizeof *s);
  if (!s) goto nomem;
  s->cfg = cfg;
  s->job_hmask = pow2_at_least(cfg.max_jobs * 2) - 1;
  s->ten_hmask = pow2_at_least(cfg.max_tenants * 2) - 1;
  s->wrk_hmask = pow2_at_least(cfg.max_workers * 2) - 1;
  s->words = (cfg.max_workers + 63) / 64;
  /* a part holds at least one GPU of an up worker: max_workers full workers bound them */
  uint64_t parts = (uint64_t)cfg.max_workers * LT_SCHED_MAX_WORKER_SLOTS;
  s->parts_cap = parts < NIL / 2 ? (uint32_t)parts : NIL / 2;
  s->tables = calloc(1, sched_tables_layout(s, NULL));
  if (!s->tables) goto nomem;
  sched_tables_layout(s, s->tables);
  s->timers_cap = cfg.max_jobs > (NIL - 64) / 8 ? NIL - 64 : cfg.max_jobs * 8 + 64;
  s->timers = malloc((size_t)s->timers_cap * sizeof *s->timers);
  if (!s->timers) goto nomem;
  for (int c = 0; c < LT_CLASS__COUNT; c++) s->age[c].head = s->age[c].tail = s->cursor[c] = NIL;
  memset(s->job_hash, 0xff, ((size_t)s->job_hmask + 1) * sizeof(uint32_t));
  memset(s->ten_hash, 0xff, ((size_t)s->ten_hmask + 1) * sizeof(uint32_t));
  memset(s->wrk_hash, 0xff, ((size_t)s->wrk_hmask + 1) * sizeof(uint32_t));
  for (uint32_t i = 0; i < cfg.max_jobs; i++) s->jobs[i].tq.next = i + 1 < cfg.max_jobs ? i + 1 : NIL;
  s->job_free = 0;
  for (uint32_t i = 0; i < s->parts_cap; i++) s->parts[i].next = i + 1 < s->parts_cap ? i + 1 : NIL;
  s->part_free = 0;
  s->next_deadline = INFINITY;
  s->idle_at = -INFINITY;
  s->fair_at = -1;
  *out = s;
  return LT_OK;
nomem:
  lt_sched_destroy(s);
  return lt_errf(errstr, errstr_size, LT_ERR_NOMEM,
                 "sched: out of memory for %u jobs, %u tenants, %u workers", cfg.max_jobs,
                 cfg.max_tenants, cfg.max_workers);
}

void lt_sched_destroy(lt_sched_t *s) {
  if (!s) return;
  if (s->tables)
    for (uint32_t i = 0; i < s->nmodels; i++) free(s->model_names[i]);
  free(s->tables);
  free(s->timers);
  free(s);
}

lt_err_t lt_sched_model_intern(lt_sched_t *s, const char *name, uint32_t *id_out, char *errstr,
                               size_t errstr_size) {
  for (uint32_t i = 0; i < s->nmodels; i++)
    if (strcmp(s->model_names[i], name) == 0) {
      *id_out = i;
      return LT_OK;
    }
  if (s->nmodels >= s->cfg.max_models)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "sched: model table full (max_models %u): raise max_models",
                   s->cfg.max_models);
  char *copy = strdup(name);
  if (!copy) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "sched: out of memory");
  s->model_names[s->nmodels] = copy;
  *id_out = s->nmodels++;
  return LT_OK;
}

const char *lt_sched_model_name(const lt_sched_t *s, uint32_t id) {
  return id < s->nmodels ? s->model_names[id] : NULL;
}

/* A new tenant row for id, with empty queues and out of every heap: its index, or NIL when the
 * table is full. */
static uint32_t tenant_add(lt_sched_t *s, uint64_t id) {
  if (s->ntenants >= s->cfg.max_tenants) return NIL;
  uint32_t t = s->ntenants++;
  tenant_t *tt = &s->tenants[t];
  *tt = (tenant_t){.id = id};
  for (int c = 0; c < LT_CLASS__COUNT; c++) tt->q[c].head = tt->q[c].tail = tt->heap_pos[c] = NIL;
  hash_add(s->ten_hash, s->ten_hmask, id, &tt->hnext, t);
  return t;
}

/* A new worker row for id, down until lt_sched_worker_up fills it: its index, or NIL when the
 * table is full. */
static uint32_t worker_add(lt_sched_t *s, uint64_t id) {
  if (s->nworkers >= s->cfg.max_workers) return NIL;
  uint32_t w = s->nworkers++;
  s->workers[w] = (worker_t){.id = id, .group = NIL, .gnext = NIL};
  hash_add(s->wrk_hash, s->wrk_hmask, id, &s->workers[w].hnext, w);
  return w;
}

/* ---- events ----------------------------------------------------------------------------- */

/* Running job jx stops at now without finishing: what it ran counts as attained service (LAS). */
static void job_attain(lt_sched_t *s, uint32_t jx, double now) {
  job_t *j = &s->jobs[jx];
  if (now > j->start) j->attained += j->gpus * (now - j->start);
}

/* Running job jx stopped without finishing at now: it frees every part and goes back to the
 * head of its tenant's queue, as a new attempt. */
static void job_requeue(lt_sched_t *s, uint32_t jx, double now) {
  sched_stats_advance(s, now);
  sched_stats_ran(s, jx, now);
  job_attain(s, jx, now);
  sched_run_release(s, jx);
  s->requeues++;
  sched_queue_insert(s, jx, true, now);
  sched_timers_push(s, jx, now);
}

lt_err_t lt_sched_tenant_upsert(lt_sched_t *s, const lt_sched_tenant_t *in, char *errstr,
                                size_t errstr_size) {
  if (!(in->weight > 0) || !isfinite(in->weight))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: tenant %llu: weight must be > 0, got %g",
                   (unsigned long long)in->id, in->weight);
  if (!(in->max_duration_s >= 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: tenant %llu: max_duration_s must be >= 0",
                   (unsigned long long)in->id);
  uint32_t t = tenant_find(s, in->id);
  if (t == NIL && (t = tenant_add(s, in->id)) == NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "sched: tenant table full (max_tenants %u)", s->cfg.max_tenants);
  tenant_t *tt = &s->tenants[t];
  tt->weight = in->weight;
  tt->max_running = in->max_running_slots;
  tt->max_queued = in->max_queued_jobs;
  tt->max_duration = in->max_duration_s;
  s->next_deadline = -INFINITY; /* limits may have changed: rescan running jobs */
  sched_tenant_refresh_all(s, t);
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_admit(const lt_sched_t *s, uint64_t tenant_id, char *errstr,
                        size_t errstr_size) {
  uint32_t t = tenant_find(s, tenant_id);
  if (t == NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "tenant %llu is not known",
                   (unsigned long long)tenant_id);
  const tenant_t *tt = &s->tenants[t];
  if (tt->max_queued && tt->queued >= tt->max_queued)
    return lt_errf(errstr, errstr_size, LT_ERR_QUOTA,
                   "tenant %llu has %u queued jobs, its max_queued_jobs quota is %u: wait for "
                   "some to start or cancel some",
                   (unsigned long long)tenant_id, tt->queued, tt->max_queued);
  if (s->njobs >= s->cfg.max_jobs)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "scheduler job table is full (%u jobs): retry later", s->cfg.max_jobs);
  return LT_OK;
}

lt_err_t lt_sched_worker_up(lt_sched_t *s, const lt_sched_worker_t *in, char *errstr,
                            size_t errstr_size) {
  if (in->slots == 0 || in->slots > LT_SCHED_MAX_WORKER_SLOTS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: worker %llu: slots must be within 1..%d, got %u",
                   (unsigned long long)in->id, LT_SCHED_MAX_WORKER_SLOTS, in->slots);
  uint32_t w = worker_find(s, in->id);
  if (w != NIL && s->workers[w].up) {
    worker_t *wk = &s->workers[w];
    if (wk->slots == in->slots && wk->mem_total == in->mem_bytes &&
        s->groups[wk->group].id == in->node_group)
      return LT_OK;
    if (wk->run.head != NIL)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "sched: worker %llu changed capacity or node group while running jobs: "
                     "report it down first",
                     (unsigned long long)in->id);
    lt_sched_worker_down(s, in->id, 0);
  }
  if (w == NIL && (w = worker_add(s, in->id)) == NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "sched: worker table full (max_workers %u)", s->cfg.max_workers);
  worker_t *wk = &s->workers[w];
  wk->slots = in->slots;
  wk->mem_total = wk->mem_free = in->mem_bytes;
  wk->gpu_free = in->slots == 64 ? ~0ULL : (1ULL << in->slots) - 1;
  wk->preempt_slots = 0;
  wk->preempt_mem = 0;
  wk->cache_cap = in->model_cache == 0 ? 1 : in->model_cache > MAX_CACHE ? MAX_CACHE
                                                                         : in->model_cache;
  wk->nmodels = 0;
  wk->run = (list_t){NIL, NIL};
  wk->reserved_job = NIL;
  wk->free_slots = in->slots;
  sched_group_join(s, w, in->node_group);
  wk->up = true;
  wk->cordoned = false;
  sched_group_free(s, w, in->slots);
  s->groups[wk->group].slots += in->slots;
  bm_set(free_bm(s, in->slots), w);
  if (in->slots > s->max_slots) s->max_slots = in->slots;
  s->total_slots += in->slots;
  s->total_mem += in->mem_bytes;
  s->nup++;
  sched_heaps_rebuild(s);
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_worker_heartbeat(lt_sched_t *s, uint64_t worker_id, const uint32_t *models,
                                   size_t n_models, char *errstr, size_t errstr_size) {
  uint32_t w = worker_find(s, worker_id);
  if (w == NIL || !s->workers[w].up)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "sched: worker %llu is not up",
                   (unsigned long long)worker_id);
  worker_t *wk = &s->workers[w];
  for (uint32_t i = 0; i < wk->nmodels; i++) bm_clr(model_bm(s, wk->models[i]), w);
  wk->nmodels = 0;
  for (size_t i = 0; i < n_models && wk->nmodels < wk->cache_cap; i++) {
    if (models[i] >= s->nmodels || sched_worker_model_slot(wk, models[i]) >= 0) continue;
    wk->models[wk->nmodels] = models[i];
    wk->lru[wk->nmodels++] = ++s->tick;
    bm_set(model_bm(s, models[i]), w);
  }
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_worker_cordon(lt_sched_t *s, uint64_t worker_id, bool on) {
  uint32_t w = worker_find(s, worker_id);
  if (w == NIL || !s->workers[w].up) return LT_ERR_NOT_FOUND;
  if (s->workers[w].cordoned == on) return LT_OK;
  s->workers[w].cordoned = on;
  if (on) sched_unreserve(s, w); /* a gang waiting for it looks elsewhere */
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_worker_down(lt_sched_t *s, uint64_t worker_id, double now) {
  uint32_t w = worker_find(s, worker_id);
  if (w == NIL || !s->workers[w].up) return LT_ERR_NOT_FOUND;
  worker_t *wk = &s->workers[w];
  /* a multi-worker gang with a part here is requeued whole: its other parts are freed too */
  while (wk->run.head != NIL) job_requeue(s, s->parts[wk->run.head].job, now);
  sched_unreserve(s, w);
  for (uint32_t i = 0; i < wk->nmodels; i++) bm_clr(model_bm(s, wk->models[i]), w);
  wk->nmodels = 0;
  bm_clr(free_bm(s, wk->free_slots), w);
  sched_group_free(s, w, -(int64_t)wk->free_slots);
  s->groups[wk->group].slots -= wk->slots;
  wk->up = false;
  s->total_slots -= wk->slots;
  s->total_mem -= wk->mem_total;
  s->nup--;
  sched_heaps_rebuild(s);
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_job_enqueue(lt_sched_t *s, const lt_sched_job_t *in, double now,
                              char *errstr, size_t errstr_size) {
  uint32_t t = tenant_find(s, in->tenant_id);
  if (t == NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND,
                   "sched: job %llu: tenant %llu is not known", (unsigned long long)in->id,
                   (unsigned long long)in->tenant_id);
  if ((unsigned)in->cls >= LT_CLASS__COUNT)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "sched: job %llu: bad class %d",
                   (unsigned long long)in->id, (int)in->cls);
  if (in->gpus == 0 || in->gpus > LT_SCHED_MAX_JOB_GPUS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: job %llu: gpus must be within 1..%d, got %u",
                   (unsigned long long)in->id, LT_SCHED_MAX_JOB_GPUS, in->gpus);
  if (in->model != LT_SCHED_NO_MODEL && in->model >= s->nmodels)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: job %llu: model id %u was not interned", (unsigned long long)in->id,
                   in->model);
  if (job_find(s, in->id) != NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_EXISTS, "sched: job %llu is already known",
                   (unsigned long long)in->id);
  if (s->job_free == NIL)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "sched: job table full (max_jobs %u)", s->cfg.max_jobs);
  sched_stats_advance(s, now);
  uint32_t jx = s->job_free;
  job_t *j = &s->jobs[jx];
  s->job_free = j->tq.next;
  memset(j, 0, sizeof *j);
  j->id = in->id;
  j->tenant = t;
  j->cls = (uint8_t)in->cls;
  j->gpus = in->gpus;
  j->mem = in->mem_bytes;
  j->limit = in->limit_s > 0 ? in->limit_s : 0;
  j->model = in->model;
  j->attempt = in->attempt;
  hash_add(s->job_hash, s->job_hmask, in->id, &j->hnext, jx);
  s->njobs++;
  sched_queue_insert(s, jx, false, now);
  sched_timers_push(s, jx, now);
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_job_started(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_RUNNING) return LT_ERR_NOT_FOUND;
  sched_stats_advance(s, now);
  s->jobs[jx].start = now;
  return LT_OK;
}

lt_err_t lt_sched_job_book(lt_sched_t *s, uint64_t job_id, const uint64_t *workers, const uint64_t *masks,
                           uint32_t n, double now, char *errstr, size_t errstr_size) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_QUEUED)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND, "sched: job %llu is not queued",
                   (unsigned long long)job_id);
  if (n == 0 || n > LT_SCHED_MAX_GANG_WORKERS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: job %llu: %u workers, expected 1..%d", (unsigned long long)job_id, n,
                   LT_SCHED_MAX_GANG_WORKERS);
  job_t *j = &s->jobs[jx];
  uint64_t per_gpu = sched_mem_per_gpu(j);
  placement_t pl = {.n = n};
  uint32_t left = j->gpus;
  for (uint32_t r = 0; r < n; r++) {
    uint32_t w = worker_find(s, workers[r]);
    if (w == NIL || !s->workers[w].up)
      return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND,
                     "sched: job %llu: worker %llu (rank %u) is not up", (unsigned long long)job_id,
                     (unsigned long long)workers[r], r);
    for (uint32_t q = 0; q < r; q++)
      if (pl.worker[q] == w)
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "sched: job %llu: worker %llu named twice", (unsigned long long)job_id,
                       (unsigned long long)workers[r]);
    const worker_t *wk = &s->workers[w];
    if (r > 0 && wk->group != s->workers[pl.worker[0]].group)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "sched: job %llu: worker %llu is not in rank 0's node group",
                     (unsigned long long)job_id, (unsigned long long)workers[r]);
    uint64_t m = masks ? masks[r] : 0;
    uint32_t g;
    if (m) { /* the GPUs the dispatch named: free, and no more than the job has left */
      g = (uint32_t)__builtin_popcountll(m);
      if ((m & wk->gpu_free) != m || g > left || (r + 1 == n && g < left) ||
          (per_gpu > 0 && wk->mem_free / per_gpu < g))
        return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                       "sched: job %llu: rank %u's GPUs (mask 0x%llx) on worker %llu are not free, or not "
                       "its share of %u", (unsigned long long)job_id, r, (unsigned long long)m,
                       (unsigned long long)workers[r], j->gpus);
    } else { /* each part takes what its worker has free, the last what is left (sched_book splits
              * the memory the same way) */
      g = wk->free_slots < left ? wk->free_slots : left;
      if (n == 1 ? wk->mem_free < j->mem : per_gpu > 0 && wk->mem_free / per_gpu < g)
        g = n == 1 ? 0 : (uint32_t)(wk->mem_free / per_gpu); /* one worker: the job's memory whole, as decide */
      if (g == 0 || (r + 1 == n && g < left))
        return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                       "sched: job %llu needs %u GPUs: its %u workers have %u of them free",
                       (unsigned long long)job_id, j->gpus, n, j->gpus - left + g);
    }
    pl.worker[r] = w;
    pl.gpus[r] = g;
    left -= g;
  }
  sched_stats_advance(s, now);
  lt_sched_decision_t d[LT_SCHED_MAX_GANG_WORKERS];
  sched_book_on(s, jx, &pl, masks, j->cls, now, d);
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_job_finished(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL) return LT_ERR_NOT_FOUND;
  job_t *j = &s->jobs[jx];
  sched_stats_advance(s, now);
  if (j->state == JS_RUNNING) {
    sched_stats_ran(s, jx, now);
    double ran = now - j->start;
    if (ran >= 0) {
      s->finished_n++;
      s->mean_run += (ran - s->mean_run) / (double)(s->finished_n < 1000 ? s->finished_n : 1000);
    }
    sched_run_release(s, jx);
  } else {
    sched_queue_remove(s, jx);
  }
  job_hash_remove(s, jx);
  j->state = JS_FREE;
  j->tq.next = s->job_free;
  s->job_free = jx;
  s->njobs--;
  assert(sched_ok(s));
  return LT_OK;
}

lt_err_t lt_sched_job_cancelled(lt_sched_t *s, uint64_t job_id, double now) {
  return lt_sched_job_finished(s, job_id, now);
}

lt_err_t lt_sched_job_requeue(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_RUNNING) return LT_ERR_NOT_FOUND;
  job_requeue(s, jx, now);
  assert(sched_ok(s));
  return LT_OK;
}

/* ---- visibility ------------------------------------------------------------------------- */

void lt_sched_counters(const lt_sched_t *s, lt_sched_counters_t *o) {
  memset(o, 0, sizeof *o);
  o->dispatches = s->dispatches;
  o->preemptions = s->preemptions;
  o->stops = s->stops;
  o->cold_loads = s->cold_loads;
  o->requeues = s->requeues;
  o->backfills = s->backfills;
  o->queued = s->queued;
  o->running = s->running;
  o->tenants = s->ntenants;
  o->workers = s->nup;
  o->slots_total = s->total_slots;
  o->slots_used = s->slots_used;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    o->slots_used_class[c] = s->used_c[c];
    o->queued_class[c] = s->queued_c[c];
  }
}

lt_err_t lt_sched_job_position(const lt_sched_t *s, uint64_t job_id, uint32_t *position,
                               double *wait_est_s) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_QUEUED) return LT_ERR_NOT_FOUND;
  const job_t *j = &s->jobs[jx];
  double pos = 0;
  if (s->cfg.policy == LT_SCHED_POLICY_FIFO) {
    for (uint32_t k = s->age[0].head; k != jx; k = s->jobs[k].age.next) pos++;
  } else {
    int c = j->cls;
    for (int h = 0; h < c; h++) pos += s->queued_c[h];
    uint32_t idx = 0;
    for (uint32_t k = s->tenants[j->tenant].q[c].head; k != jx; k = s->jobs[k].tq.next) idx++;
    double w = s->tenants[j->tenant].weight;
    for (uint32_t t = 0; t < s->ntenants; t++) {
      const tenant_t *o = &s->tenants[t];
      if (t == j->tenant || o->queued_c[c] == 0) continue;
      double ahead = ceil((idx + 1) * o->weight / w);
      pos += ahead < o->queued_c[c] ? ahead : o->queued_c[c];
    }
    pos += idx;
  }
  *position = (uint32_t)pos;
  if (wait_est_s) {
    uint32_t freeslots = s->total_slots - s->slots_used;
    if (s->finished_n == 0 || s->total_slots == 0) *wait_est_s = -1;
    else if (pos < freeslots) *wait_est_s = 0;
    else *wait_est_s = (pos - freeslots + 1) / s->total_slots * s->mean_run;
  }
  return LT_OK;
}

void lt_sched_waterfill(size_t n, const double *demand, const double *weight, double capacity,
                        double *alloc) {
  double rem = capacity > 0 ? capacity : 0;
  for (size_t i = 0; i < n; i++) alloc[i] = demand[i] > 0 ? -1.0 : 0.0;
  for (;;) {
    double wsum = 0;
    for (size_t i = 0; i < n; i++)
      if (alloc[i] < 0) wsum += weight[i];
    if (wsum <= 0) return;
    double level = rem / wsum;
    bool any = false;
    for (size_t i = 0; i < n; i++) {
      if (alloc[i] >= 0 || demand[i] > level * weight[i]) continue;
      alloc[i] = demand[i];
      rem -= demand[i];
      any = true;
    }
    if (!any) {
      for (size_t i = 0; i < n; i++)
        if (alloc[i] < 0) alloc[i] = level * weight[i];
      return;
    }
  }
}

double lt_sched_jain_index(size_t n, const double *x) {
  double sum = 0, sq = 0;
  for (size_t i = 0; i < n; i++) {
    sum += x[i];
    sq += x[i] * x[i];
  }
  if (n == 0 || sq == 0) return 1.0;
  return sum * sum / ((double)n * sq);
}

size_t lt_sched_tenants_stats(lt_sched_t *s, lt_job_class_t cls, lt_sched_tenant_stats_t *out,
                              size_t cap) {
  int c = cls;
  size_t n = 0;
  for (uint32_t t = 0; t < s->ntenants; t++) {
    const tenant_t *tt = &s->tenants[t];
    if (tt->queued_c[c] == 0 && tt->run_slots_c[c] == 0 && tt->dispatched == 0) continue;
    s->scratch_t[n] = t;
    s->scratch_d[n] = (double)tt->queued_gpus_c[c] + tt->run_slots_c[c];
    s->scratch_w[n] = tt->weight;
    n++;
  }
  lt_sched_waterfill(n, s->scratch_d, s->scratch_w, s->used_c[c], s->scratch_a);
  for (size_t i = 0; i < n && i < cap; i++) {
    const tenant_t *tt = &s->tenants[s->scratch_t[i]];
    uint64_t nd = 0;
    for (int b = 0; b < NHIST; b++) nd += tt->hist[b];
    double used = s->used_c[c];
    out[i] = (lt_sched_tenant_stats_t){
        .tenant_id = tt->id,
        .weight = tt->weight,
        .queued = tt->queued_c[c],
        .running_slots = tt->run_slots_c[c],
        .demand_slots = s->scratch_d[i],
        .share = used > 0 ? tt->run_slots_c[c] / used : 0,
        .entitlement = used > 0 ? s->scratch_a[i] / used : 0,
        .dominant_share = sched_tenant_key(s, tt, c),
        .wait_p50_s = sched_hist_quantile(tt->hist, nd, 0.5),
        .wait_p99_s = sched_hist_quantile(tt->hist, nd, 0.99),
        .dispatched = tt->dispatched,
    };
  }
  return n;
}

double lt_sched_jain(lt_sched_t *s, lt_job_class_t cls) {
  int c = cls;
  size_t n = 0;
  for (uint32_t t = 0; t < s->ntenants; t++) {
    const tenant_t *tt = &s->tenants[t];
    double d = (double)tt->queued_gpus_c[c] + tt->run_slots_c[c];
    if (d <= 0) continue;
    s->scratch_t[n] = t;
    s->scratch_d[n] = d;
    s->scratch_w[n] = tt->weight;
    n++;
  }
  lt_sched_waterfill(n, s->scratch_d, s->scratch_w, s->used_c[c], s->scratch_a);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (s->scratch_a[i] <= 0) continue;
    s->scratch_d[m++] = s->tenants[s->scratch_t[i]].run_slots_c[c] / s->scratch_a[i];
  }
  return lt_sched_jain_index(m, s->scratch_d);
}

const char *lt_sched_policy_name(lt_sched_policy_t p) {
  return p == LT_SCHED_POLICY_FIFO ? "fifo" : p == LT_SCHED_POLICY_LATHE ? "lathe"
       : p == LT_SCHED_POLICY_LAS ? "las" : "?";
}

/* ---- timers: when waiting changes a decision (lt_sched_next_timer) ----------------------- */

static bool timer_less(const struct sched_timer *a, const struct sched_timer *b) {
  return a->t < b->t || (a->t == b->t && a->jx < b->jx);
}

static void timer_sift_down(lt_sched_t *s, uint32_t i) {
  struct sched_timer *h = s->timers, x = h[i];
  for (;;) {
    uint32_t l = 2 * i + 1, b = i;
    const struct sched_timer *bv = &x;
    if (l < s->ntimers && timer_less(&h[l], bv)) b = l, bv = &h[l];
    if (l + 1 < s->ntimers && timer_less(&h[l + 1], bv)) b = l + 1, bv = &h[l + 1];
    if (b == i) break;
    h[i] = h[b];
    i = b;
  }
  h[i] = x;
}

/* True while the entry's job is still queued since the time the entry was pushed for. */
static bool timer_live(const lt_sched_t *s, const struct sched_timer *e) {
  const job_t *j = &s->jobs[e->jx];
  return j->state == JS_QUEUED && j->enq == e->enq;
}

/* Drops every entry whose job left the queue, then restores the heap: O(entries), when full. */
static void timers_compact(lt_sched_t *s) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < s->ntimers; i++)
    if (timer_live(s, &s->timers[i])) s->timers[n++] = s->timers[i];
  s->ntimers = n;
  for (uint32_t i = n / 2; i-- > 0;) timer_sift_down(s, i);
}

static void timer_push(lt_sched_t *s, uint32_t jx, double t) {
  if (s->ntimers == s->timers_cap) timers_compact(s);
  if (s->ntimers == s->timers_cap) return; /* cannot happen: at most 4 live entries a job */
  struct sched_timer e = {t, s->jobs[jx].enq, jx};
  uint32_t i = s->ntimers++;
  while (i > 0 && timer_less(&e, &s->timers[(i - 1) / 2])) {
    s->timers[i] = s->timers[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  s->timers[i] = e;
}

/* The times at which a job queued at now starts to count as aged (each level), starving
 * (preempt_after_s, production and standard) or a waiting gang (gang_reserve_after_s): the
 * thresholds lt_sched_decide() compares waits with (docs/DESIGN.md §6). FIFO and LAS compare
 * none. */
void sched_timers_push(lt_sched_t *s, uint32_t jx, double now) {
  const lt_sched_config_t *c = &s->cfg;
  const job_t *j = &s->jobs[jx];
  if (c->policy != LT_SCHED_POLICY_LATHE) return;
  if (c->aging_s > 0)
    for (uint32_t k = 1; k <= c->aging_levels && k <= j->cls; k++)
      timer_push(s, jx, now + c->aging_s * k);
  if (j->cls != LT_CLASS_PREEMPTIBLE && c->preempt_after_s >= 0)
    timer_push(s, jx, now + c->preempt_after_s);
  if (j->gpus > 1 && c->gang_reserve_after_s >= 0)
    timer_push(s, jx, now + c->gang_reserve_after_s);
}

double lt_sched_next_timer(lt_sched_t *s, double now) {
  while (s->ntimers && (s->timers[0].t <= now || !timer_live(s, &s->timers[0]))) {
    s->timers[0] = s->timers[--s->ntimers];
    if (s->ntimers) timer_sift_down(s, 0);
  }
  double t = s->ntimers ? s->timers[0].t : INFINITY;
  if (s->next_deadline > now && s->next_deadline < t) t = s->next_deadline;
  if (s->cfg.policy == LT_SCHED_POLICY_LAS) {
    double l = sched_las_next_timer(s, now);
    if (l < t) t = l;
  }
  return t;
}

double lt_sched_next_retry(const lt_sched_t *s, double now) {
  double t = INFINITY;
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return t;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    uint32_t looked = 0; /* the starvation pass looks at no more than the 16 oldest a class */
    for (uint32_t jx = s->age[c].head; jx != NIL && looked < 32; jx = s->jobs[jx].age.next) {
      looked++;
      double r = s->jobs[jx].starve_next;
      if (r > now && r < t) t = r;
    }
  }
  return t;
}
