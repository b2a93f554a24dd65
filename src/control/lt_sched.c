/* lt_sched: the scheduling policy (see lt_sched.h for the contract).
 *
 * Data layout, all sized once at lt_sched_new():
 *   - a job pool with intrusive links: each queued job sits on its tenant's per-class FIFO and
 *     on an age-ordered list (one per class for the Lathe policy, which aging scans from the
 *     oldest; one global list in arrival order for FIFO); a running job on its worker's list;
 *   - per class, a binary heap of the tenants that have queued work and room in their quota,
 *     keyed by DRF dominant share / weight, so picking the next tenant is O(log tenants);
 *   - per free-slot count k, a bitmap of workers with exactly k free slots, and per base model
 *     a bitmap of workers holding it, so best-fit warm placement is a few word ANDs.
 * Candidates that cannot be placed are set aside for the rest of a decide call (resources only
 * shrink during a call), and at most max_scan of them are examined per call. */
#include "lt_sched.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX
#define MAX_CACHE 64 /* models one worker may hold */
#define NHIST 64     /* wait histogram buckets: 0, then [0.1 * 1.25^(b-1), 0.1 * 1.25^b) */
#define STARVE_SCAN 16
#define STARVE_RETRY_S 1.0

enum { JS_FREE = 0, JS_QUEUED, JS_RUNNING };

typedef struct job {
  uint64_t id;
  uint64_t mem;
  uint64_t gpu_mask;
  double enq;   /* when it was (re)queued */
  double start; /* dispatch, then AttemptStarted */
  double starve_next; /* next time the starvation pass looks at it */
  uint32_t tenant, worker, model, attempt, gpus;
  uint32_t reserved; /* worker reserved for it */
  uint32_t hnext;
  uint32_t tprev, tnext; /* tenant-class queue (free list when free) */
  uint32_t aprev, anext; /* age list */
  uint32_t wprev, wnext; /* worker's running list */
  uint8_t cls, state;
  bool preempting, stop_sent;
} job_t;

typedef struct tenant {
  uint64_t id;
  double weight;
  uint32_t max_running, max_queued;
  double max_duration;
  uint32_t running_slots, queued;
  uint32_t run_slots_c[LT_CLASS__COUNT];
  uint64_t run_mem_c[LT_CLASS__COUNT];
  uint32_t queued_c[LT_CLASS__COUNT];
  uint64_t queued_gpus_c[LT_CLASS__COUNT];
  uint32_t qhead[LT_CLASS__COUNT], qtail[LT_CLASS__COUNT];
  uint32_t heap_pos[LT_CLASS__COUNT];
  double key[LT_CLASS__COUNT];
  uint8_t blocked; /* bit c: set aside in this decide call */
  uint32_t hnext;
  uint64_t dispatched;
  uint32_t hist[NHIST];
} tenant_t;

typedef struct worker {
  uint64_t id;
  uint64_t mem_total, mem_free, preempt_mem;
  uint64_t gpu_free; /* bit i: GPU i free */
  uint32_t slots, free_slots, preempt_slots;
  uint32_t cache_cap, nmodels;
  uint32_t models[MAX_CACHE];
  uint64_t lru[MAX_CACHE];
  uint32_t run_head;
  uint32_t reserved_job;
  uint32_t hnext;
  bool up;
} worker_t;

struct lt_sched {
  lt_sched_config_t cfg;
  job_t *jobs;
  uint32_t *job_hash, job_hmask, job_free, njobs;
  tenant_t *tenants;
  uint32_t *ten_hash, ten_hmask, ntenants;
  worker_t *workers;
  uint32_t *wrk_hash, wrk_hmask, nworkers, nup;
  char **model_names;
  uint32_t nmodels;

  size_t words;      /* 64-bit words per worker bitmap */
  uint64_t *free_bm; /* (MAX_WORKER_SLOTS + 1) bitmaps */
  uint64_t *model_bm;
  uint32_t max_slots; /* largest worker seen */

  uint32_t *heap[LT_CLASS__COUNT];
  uint32_t heap_n[LT_CLASS__COUNT];
  uint32_t *blocked[LT_CLASS__COUNT];
  uint32_t nblocked[LT_CLASS__COUNT];

  uint32_t ahead[LT_CLASS__COUNT], atail[LT_CLASS__COUNT];
  uint32_t cursor[LT_CLASS__COUNT];

  uint64_t total_mem;
  uint32_t total_slots, slots_used;
  uint32_t used_c[LT_CLASS__COUNT];
  uint32_t queued_c[LT_CLASS__COUNT];
  uint32_t queued, running;
  uint64_t tick; /* LRU clock */
  double next_deadline;
  double mean_run;
  uint64_t finished_n;
  uint64_t dispatches, preemptions, stops, cold_loads, requeues;
  uint32_t nreserved; /* workers reserved for a starving job */

  double *scratch_d, *scratch_w, *scratch_a; /* max_tenants each: visibility */
  uint32_t *scratch_t;
};

/* ---- small helpers ---------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint32_t pow2_at_least(uint32_t n) {
  uint32_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

static void bm_set(uint64_t *bm, uint32_t i) { bm[i >> 6] |= 1ULL << (i & 63); }
static void bm_clr(uint64_t *bm, uint32_t i) { bm[i >> 6] &= ~(1ULL << (i & 63)); }
static uint64_t *free_bm(lt_sched_t *s, uint32_t k) { return s->free_bm + (size_t)k * s->words; }
static uint64_t *model_bm(lt_sched_t *s, uint32_t m) {
  return s->model_bm + (size_t)m * s->words;
}

static uint32_t job_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->job_hash[mix64(id) & s->job_hmask]; i != NIL; i = s->jobs[i].hnext)
    if (s->jobs[i].id == id) return i;
  return NIL;
}
static uint32_t tenant_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->ten_hash[mix64(id) & s->ten_hmask]; i != NIL; i = s->tenants[i].hnext)
    if (s->tenants[i].id == id) return i;
  return NIL;
}
static uint32_t worker_find(const lt_sched_t *s, uint64_t id) {
  for (uint32_t i = s->wrk_hash[mix64(id) & s->wrk_hmask]; i != NIL; i = s->workers[i].hnext)
    if (s->workers[i].id == id) return i;
  return NIL;
}

static void job_hash_remove(lt_sched_t *s, uint32_t jx) {
  uint32_t *p = &s->job_hash[mix64(s->jobs[jx].id) & s->job_hmask];
  while (*p != jx) p = &s->jobs[*p].hnext;
  *p = s->jobs[jx].hnext;
}

/* Reserved workers drain, so they cost throughput: at most max_reservations at once. */
static uint32_t max_reserved(const lt_sched_t *s) {
  if (s->cfg.max_reservations) return s->cfg.max_reservations;
  return s->nup / 20 > 1 ? s->nup / 20 : 1;
}

static void reserve(lt_sched_t *s, uint32_t w, uint32_t jx) {
  s->workers[w].reserved_job = jx;
  s->jobs[jx].reserved = w;
  s->nreserved++;
}

static void unreserve(lt_sched_t *s, uint32_t w) {
  uint32_t jx = s->workers[w].reserved_job;
  if (jx == NIL) return;
  s->jobs[jx].reserved = NIL;
  s->workers[w].reserved_job = NIL;
  s->nreserved--;
}

static uint32_t hist_bucket(double w) {
  if (w < 0.1) return 0;
  double b = 1.0 + floor(log(w / 0.1) / log(1.25));
  return b >= NHIST - 1 ? NHIST - 1 : (uint32_t)b;
}

static double hist_quantile(const uint32_t *h, uint64_t n, double q) {
  if (n == 0) return 0;
  uint64_t want = (uint64_t)ceil(q * (double)n), acc = 0;
  if (want == 0) want = 1;
  for (uint32_t b = 0; b < NHIST; b++) {
    acc += h[b];
    if (acc >= want) return b == 0 ? 0.0 : 0.1 * pow(1.25, (double)b - 0.5);
  }
  return 0.1 * pow(1.25, NHIST - 1);
}

/* ---- tenant heaps ----------------------------------------------------------------------- */

static double tenant_key(const lt_sched_t *s, const tenant_t *t, int c) {
  double slots = s->total_slots ? (double)t->run_slots_c[c] / s->total_slots : 0.0;
  double mem = s->total_mem ? (double)t->run_mem_c[c] / (double)s->total_mem : 0.0;
  return (slots > mem ? slots : mem) / t->weight;
}

/* Heap order: lower dominant share first, then the older head job, then the tenant index. */
static bool heap_less(const lt_sched_t *s, int c, uint32_t a, uint32_t b) {
  const tenant_t *ta = &s->tenants[a], *tb = &s->tenants[b];
  if (ta->key[c] != tb->key[c]) return ta->key[c] < tb->key[c];
  double ea = s->jobs[ta->qhead[c]].enq, eb = s->jobs[tb->qhead[c]].enq;
  if (ea != eb) return ea < eb;
  return a < b;
}

static void heap_place(lt_sched_t *s, int c, uint32_t pos, uint32_t t) {
  s->heap[c][pos] = t;
  s->tenants[t].heap_pos[c] = pos;
}

static void heap_up(lt_sched_t *s, int c, uint32_t pos) {
  uint32_t t = s->heap[c][pos];
  while (pos > 0) {
    uint32_t parent = (pos - 1) / 2;
    if (!heap_less(s, c, t, s->heap[c][parent])) break;
    heap_place(s, c, pos, s->heap[c][parent]);
    pos = parent;
  }
  heap_place(s, c, pos, t);
}

static void heap_down(lt_sched_t *s, int c, uint32_t pos) {
  uint32_t n = s->heap_n[c], t = s->heap[c][pos];
  for (;;) {
    uint32_t l = 2 * pos + 1, best = pos;
    uint32_t bt = t;
    if (l < n && heap_less(s, c, s->heap[c][l], bt)) best = l, bt = s->heap[c][l];
    if (l + 1 < n && heap_less(s, c, s->heap[c][l + 1], bt)) best = l + 1, bt = s->heap[c][l + 1];
    if (best == pos) break;
    heap_place(s, c, pos, bt);
    pos = best;
  }
  heap_place(s, c, pos, t);
}

static void heap_remove(lt_sched_t *s, int c, uint32_t t) {
  uint32_t pos = s->tenants[t].heap_pos[c];
  assert(pos != NIL && s->heap[c][pos] == t);
  s->tenants[t].heap_pos[c] = NIL;
  uint32_t last = s->heap[c][--s->heap_n[c]];
  if (last == t) return;
  heap_place(s, c, pos, last);
  heap_up(s, c, pos);
  heap_down(s, c, s->tenants[last].heap_pos[c]);
}

/* Brings tenant t's membership and position in class c's heap up to date. */
static void tenant_refresh(lt_sched_t *s, uint32_t t, int c) {
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return;
  tenant_t *tt = &s->tenants[t];
  bool eligible = tt->queued_c[c] > 0 && !(tt->blocked & (1u << c)) &&
                  (tt->max_running == 0 || tt->running_slots < tt->max_running);
  tt->key[c] = tenant_key(s, tt, c);
  if (tt->heap_pos[c] != NIL) {
    if (!eligible) {
      heap_remove(s, c, t);
    } else {
      heap_up(s, c, tt->heap_pos[c]);
      heap_down(s, c, tt->heap_pos[c]);
    }
  } else if (eligible) {
    uint32_t pos = s->heap_n[c]++;
    heap_place(s, c, pos, t);
    heap_up(s, c, pos);
  }
}

static void tenant_refresh_all(lt_sched_t *s, uint32_t t) {
  for (int c = 0; c < LT_CLASS__COUNT; c++) tenant_refresh(s, t, c);
}

/* Keys depend on fleet totals: after a worker joins or leaves, recompute every key. */
static void heaps_rebuild(lt_sched_t *s) {
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    for (uint32_t i = 0; i < s->heap_n[c]; i++) {
      tenant_t *tt = &s->tenants[s->heap[c][i]];
      tt->key[c] = tenant_key(s, tt, c);
    }
    for (uint32_t i = s->heap_n[c] / 2 + 1; i-- > 0;)
      if (i < s->heap_n[c]) heap_down(s, c, i);
  }
}

/* ---- queues ----------------------------------------------------------------------------- */

static int age_list(const lt_sched_t *s, const job_t *j) {
  return s->cfg.policy == LT_SCHED_POLICY_FIFO ? 0 : j->cls;
}

static void queue_insert(lt_sched_t *s, uint32_t jx, bool front, double now) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  int c = j->cls, a = age_list(s, j);
  j->state = JS_QUEUED;
  j->enq = now;
  j->starve_next = now;
  j->preempting = false;
  j->stop_sent = false;
  j->worker = NIL;
  j->reserved = NIL;
  /* tenant queue: new jobs at the tail, requeued ones (already started once) at the head */
  if (front) {
    j->tprev = NIL;
    j->tnext = t->qhead[c];
    if (t->qhead[c] != NIL) s->jobs[t->qhead[c]].tprev = jx;
    else t->qtail[c] = jx;
    t->qhead[c] = jx;
  } else {
    j->tnext = NIL;
    j->tprev = t->qtail[c];
    if (t->qtail[c] != NIL) s->jobs[t->qtail[c]].tnext = jx;
    else t->qhead[c] = jx;
    t->qtail[c] = jx;
  }
  /* age list: always the tail, so it stays ordered by enq; FIFO puts requeued jobs first */
  if (front && s->cfg.policy == LT_SCHED_POLICY_FIFO) {
    j->aprev = NIL;
    j->anext = s->ahead[a];
    if (s->ahead[a] != NIL) s->jobs[s->ahead[a]].aprev = jx;
    else s->atail[a] = jx;
    s->ahead[a] = jx;
  } else {
    j->anext = NIL;
    j->aprev = s->atail[a];
    if (s->atail[a] != NIL) s->jobs[s->atail[a]].anext = jx;
    else s->ahead[a] = jx;
    s->atail[a] = jx;
  }
  t->queued++;
  t->queued_c[c]++;
  t->queued_gpus_c[c] += j->gpus;
  s->queued++;
  s->queued_c[c]++;
  tenant_refresh(s, j->tenant, c);
}

static void queue_remove(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  int c = j->cls, a = age_list(s, j);
  assert(j->state == JS_QUEUED);
  if (j->tprev != NIL) s->jobs[j->tprev].tnext = j->tnext;
  else t->qhead[c] = j->tnext;
  if (j->tnext != NIL) s->jobs[j->tnext].tprev = j->tprev;
  else t->qtail[c] = j->tprev;
  for (int k = 0; k < LT_CLASS__COUNT; k++)
    if (s->cursor[k] == jx) s->cursor[k] = j->anext;
  if (j->aprev != NIL) s->jobs[j->aprev].anext = j->anext;
  else s->ahead[a] = j->anext;
  if (j->anext != NIL) s->jobs[j->anext].aprev = j->aprev;
  else s->atail[a] = j->aprev;
  if (j->reserved != NIL) unreserve(s, j->reserved);
  t->queued--;
  t->queued_c[c]--;
  t->queued_gpus_c[c] -= j->gpus;
  s->queued--;
  s->queued_c[c]--;
  j->state = JS_FREE;
  tenant_refresh(s, j->tenant, c);
}

/* ---- workers ---------------------------------------------------------------------------- */

static void worker_set_free(lt_sched_t *s, uint32_t w, uint32_t free_slots) {
  worker_t *wk = &s->workers[w];
  if (wk->up) bm_clr(free_bm(s, wk->free_slots), w);
  wk->free_slots = free_slots;
  if (wk->up) bm_set(free_bm(s, free_slots), w);
}

static int worker_model_slot(const worker_t *wk, uint32_t m) {
  for (uint32_t i = 0; i < wk->nmodels; i++)
    if (wk->models[i] == m) return (int)i;
  return -1;
}

/* Records that worker w holds model m now (a cold load evicts the least recently used). */
static bool worker_touch_model(lt_sched_t *s, uint32_t w, uint32_t m) {
  worker_t *wk = &s->workers[w];
  int i = worker_model_slot(wk, m);
  if (i >= 0) {
    wk->lru[i] = ++s->tick;
    return false;
  }
  if (wk->nmodels < wk->cache_cap) {
    i = (int)wk->nmodels++;
  } else {
    i = 0;
    for (uint32_t k = 1; k < wk->nmodels; k++)
      if (wk->lru[k] < wk->lru[i]) i = (int)k;
    bm_clr(model_bm(s, wk->models[i]), w);
  }
  wk->models[i] = m;
  wk->lru[i] = ++s->tick;
  bm_set(model_bm(s, m), w);
  return true;
}

/* Best fit: among workers with enough free slots and memory, the fewest free slots; with
 * affinity, workers that hold the model first. A worker reserved for another job is skipped. */
static uint32_t find_worker(lt_sched_t *s, uint32_t jx, bool affinity) {
  const job_t *j = &s->jobs[jx];
  int pass0 = (affinity && j->model != LT_SCHED_NO_MODEL) ? 0 : 1;
  for (int pass = pass0; pass < 2; pass++) {
    const uint64_t *mb = pass == 0 ? model_bm(s, j->model) : NULL;
    for (uint32_t k = j->gpus; k <= s->max_slots; k++) {
      const uint64_t *fb = free_bm(s, k);
      for (size_t wi = 0; wi < s->words; wi++) {
        uint64_t bits = fb[wi];
        if (mb) bits &= mb[wi];
        while (bits) {
          uint32_t w = (uint32_t)(wi * 64 + (size_t)__builtin_ctzll(bits));
          bits &= bits - 1;
          const worker_t *wk = &s->workers[w];
          if (wk->reserved_job != NIL && wk->reserved_job != jx) continue;
          if (wk->mem_free < j->mem) continue;
          return w;
        }
      }
    }
  }
  return NIL;
}

static void run_link(lt_sched_t *s, uint32_t jx, uint32_t w) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[w];
  j->wprev = NIL;
  j->wnext = wk->run_head;
  if (wk->run_head != NIL) s->jobs[wk->run_head].wprev = jx;
  wk->run_head = jx;
}

/* Releases what a running job holds. */
static void run_release(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[j->worker];
  tenant_t *t = &s->tenants[j->tenant];
  assert(j->state == JS_RUNNING);
  if (j->wprev != NIL) s->jobs[j->wprev].wnext = j->wnext;
  else wk->run_head = j->wnext;
  if (j->wnext != NIL) s->jobs[j->wnext].wprev = j->wprev;
  wk->gpu_free |= j->gpu_mask;
  wk->mem_free += j->mem;
  if (j->cls == LT_CLASS_PREEMPTIBLE && !j->preempting) {
    wk->preempt_slots -= j->gpus;
    wk->preempt_mem -= j->mem;
  }
  worker_set_free(s, j->worker, wk->free_slots + j->gpus);
  t->running_slots -= j->gpus;
  t->run_slots_c[j->cls] -= j->gpus;
  t->run_mem_c[j->cls] -= j->mem;
  s->used_c[j->cls] -= j->gpus;
  s->slots_used -= j->gpus;
  s->running--;
  j->state = JS_FREE;
  j->worker = NIL;
  j->gpu_mask = 0;
  tenant_refresh_all(s, j->tenant);
}

static void dispatch(lt_sched_t *s, uint32_t jx, uint32_t w, int effective, double now,
                     lt_sched_decision_t *d) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[w];
  tenant_t *t = &s->tenants[j->tenant];
  double waited = now - j->enq;
  queue_remove(s, jx); /* also drops j's reservation */
  uint64_t mask = 0, freem = wk->gpu_free;
  for (uint32_t i = 0; i < j->gpus; i++) {
    uint64_t bit = freem & (~freem + 1);
    assert(bit);
    mask |= bit;
    freem &= ~bit;
  }
  wk->gpu_free = freem;
  wk->mem_free -= j->mem;
  worker_set_free(s, w, wk->free_slots - j->gpus);
  bool cold = j->model != LT_SCHED_NO_MODEL && worker_touch_model(s, w, j->model);
  j->state = JS_RUNNING;
  j->worker = w;
  j->gpu_mask = mask;
  j->start = now;
  j->attempt++;
  run_link(s, jx, w);
  if (j->cls == LT_CLASS_PREEMPTIBLE) {
    wk->preempt_slots += j->gpus;
    wk->preempt_mem += j->mem;
  }
  t->running_slots += j->gpus;
  t->run_slots_c[j->cls] += j->gpus;
  t->run_mem_c[j->cls] += j->mem;
  t->dispatched++;
  t->hist[hist_bucket(waited)]++;
  s->used_c[j->cls] += j->gpus;
  s->slots_used += j->gpus;
  s->running++;
  s->dispatches++;
  if (cold) s->cold_loads++;
  if (t->max_duration > 0 && now + t->max_duration < s->next_deadline)
    s->next_deadline = now + t->max_duration;
  tenant_refresh_all(s, j->tenant);
  *d = (lt_sched_decision_t){.action = LT_SCHED_DISPATCH,
                             .job_id = j->id,
                             .tenant_id = t->id,
                             .worker_id = wk->id,
                             .gpu_mask = mask,
                             .attempt = j->attempt,
                             .cls = (lt_job_class_t)j->cls,
                             .effective = (lt_job_class_t)effective,
                             .cold_load = cold,
                             .waited_s = waited};
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
                           .max_scan = 256};
}

lt_err_t lt_sched_new(const lt_sched_config_t *config, lt_sched_t **out, char *errstr,
                      size_t errstr_size) {
  *out = NULL;
  lt_sched_config_t cfg;
  if (config) cfg = *config;
  else lt_sched_config_default(&cfg);
  if (cfg.policy != LT_SCHED_POLICY_LATHE && cfg.policy != LT_SCHED_POLICY_FIFO)
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
  s->jobs = calloc(cfg.max_jobs, sizeof *s->jobs);
  s->job_hmask = pow2_at_least(cfg.max_jobs * 2) - 1;
  s->job_hash = malloc(((size_t)s->job_hmask + 1) * sizeof(uint32_t));
  s->tenants = calloc(cfg.max_tenants, sizeof *s->tenants);
  s->ten_hmask = pow2_at_least(cfg.max_tenants * 2) - 1;
  s->ten_hash = malloc(((size_t)s->ten_hmask + 1) * sizeof(uint32_t));
  s->workers = calloc(cfg.max_workers, sizeof *s->workers);
  s->wrk_hmask = pow2_at_least(cfg.max_workers * 2) - 1;
  s->wrk_hash = malloc(((size_t)s->wrk_hmask + 1) * sizeof(uint32_t));
  s->model_names = calloc(cfg.max_models, sizeof(char *));
  s->words = (cfg.max_workers + 63) / 64;
  s->free_bm = calloc((LT_SCHED_MAX_WORKER_SLOTS + 1) * s->words, sizeof(uint64_t));
  s->model_bm = calloc((size_t)cfg.max_models * s->words, sizeof(uint64_t));
  s->scratch_d = malloc(cfg.max_tenants * sizeof(double));
  s->scratch_w = malloc(cfg.max_tenants * sizeof(double));
  s->scratch_a = malloc(cfg.max_tenants * sizeof(double));
  s->scratch_t = malloc(cfg.max_tenants * sizeof(uint32_t));
  if (!s->jobs || !s->job_hash || !s->tenants || !s->ten_hash || !s->workers || !s->wrk_hash ||
      !s->model_names || !s->free_bm || !s->model_bm || !s->scratch_d || !s->scratch_w ||
      !s->scratch_a || !s->scratch_t)
    goto nomem;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    s->heap[c] = malloc(cfg.max_tenants * sizeof(uint32_t));
    s->blocked[c] = malloc(cfg.max_tenants * sizeof(uint32_t));
    if (!s->heap[c] || !s->blocked[c]) goto nomem;
    s->ahead[c] = s->atail[c] = s->cursor[c] = NIL;
  }
  memset(s->job_hash, 0xff, ((size_t)s->job_hmask + 1) * sizeof(uint32_t));
  memset(s->ten_hash, 0xff, ((size_t)s->ten_hmask + 1) * sizeof(uint32_t));
  memset(s->wrk_hash, 0xff, ((size_t)s->wrk_hmask + 1) * sizeof(uint32_t));
  for (uint32_t i = 0; i < cfg.max_jobs; i++) s->jobs[i].tnext = i + 1 < cfg.max_jobs ? i + 1 : NIL;
  s->job_free = 0;
  s->next_deadline = INFINITY;
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
  if (s->model_names)
    for (uint32_t i = 0; i < s->nmodels; i++) free(s->model_names[i]);
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    free(s->heap[c]);
    free(s->blocked[c]);
  }
  free(s->model_names);
  free(s->jobs);
  free(s->job_hash);
  free(s->tenants);
  free(s->ten_hash);
  free(s->workers);
  free(s->wrk_hash);
  free(s->free_bm);
  free(s->model_bm);
  free(s->scratch_d);
  free(s->scratch_w);
  free(s->scratch_a);
  free(s->scratch_t);
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

/* ---- events ----------------------------------------------------------------------------- */

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
  if (t == NIL) {
    if (s->ntenants >= s->cfg.max_tenants)
      return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                     "sched: tenant table full (max_tenants %u)", s->cfg.max_tenants);
    t = s->ntenants++;
    tenant_t *tt = &s->tenants[t];
    memset(tt, 0, sizeof *tt);
    tt->id = in->id;
    for (int c = 0; c < LT_CLASS__COUNT; c++)
      tt->qhead[c] = tt->qtail[c] = tt->heap_pos[c] = NIL;
    uint32_t *b = &s->ten_hash[mix64(in->id) & s->ten_hmask];
    tt->hnext = *b;
    *b = t;
  }
  tenant_t *tt = &s->tenants[t];
  tt->weight = in->weight;
  tt->max_running = in->max_running_slots;
  tt->max_queued = in->max_queued_jobs;
  tt->max_duration = in->max_duration_s;
  s->next_deadline = -INFINITY; /* limits may have changed: rescan running jobs */
  tenant_refresh_all(s, t);
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
    if (wk->slots == in->slots && wk->mem_total == in->mem_bytes) return LT_OK;
    if (wk->run_head != NIL)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "sched: worker %llu changed capacity while running jobs: report it down "
                     "first",
                     (unsigned long long)in->id);
    lt_sched_worker_down(s, in->id, 0);
  }
  if (w == NIL) {
    if (s->nworkers >= s->cfg.max_workers)
      return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                     "sched: worker table full (max_workers %u)", s->cfg.max_workers);
    w = s->nworkers++;
    worker_t *wk = &s->workers[w];
    memset(wk, 0, sizeof *wk);
    wk->id = in->id;
    uint32_t *b = &s->wrk_hash[mix64(in->id) & s->wrk_hmask];
    wk->hnext = *b;
    *b = w;
  }
  worker_t *wk = &s->workers[w];
  wk->slots = in->slots;
  wk->mem_total = wk->mem_free = in->mem_bytes;
  wk->gpu_free = in->slots == 64 ? ~0ULL : (1ULL << in->slots) - 1;
  wk->preempt_slots = 0;
  wk->preempt_mem = 0;
  wk->cache_cap = in->model_cache == 0 ? 1 : in->model_cache > MAX_CACHE ? MAX_CACHE
                                                                         : in->model_cache;
  wk->nmodels = 0;
  wk->run_head = NIL;
  wk->reserved_job = NIL;
  wk->free_slots = in->slots;
  wk->up = true;
  bm_set(free_bm(s, in->slots), w);
  if (in->slots > s->max_slots) s->max_slots = in->slots;
  s->total_slots += in->slots;
  s->total_mem += in->mem_bytes;
  s->nup++;
  heaps_rebuild(s);
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
    if (models[i] >= s->nmodels || worker_model_slot(wk, models[i]) >= 0) continue;
    wk->models[wk->nmodels] = models[i];
    wk->lru[wk->nmodels++] = ++s->tick;
    bm_set(model_bm(s, models[i]), w);
  }
  return LT_OK;
}

lt_err_t lt_sched_worker_down(lt_sched_t *s, uint64_t worker_id, double now) {
  uint32_t w = worker_find(s, worker_id);
  if (w == NIL || !s->workers[w].up) return LT_ERR_NOT_FOUND;
  worker_t *wk = &s->workers[w];
  while (wk->run_head != NIL) {
    uint32_t jx = wk->run_head;
    run_release(s, jx);
    s->requeues++;
    queue_insert(s, jx, true, now);
  }
  unreserve(s, w);
  for (uint32_t i = 0; i < wk->nmodels; i++) bm_clr(model_bm(s, wk->models[i]), w);
  wk->nmodels = 0;
  bm_clr(free_bm(s, wk->free_slots), w);
  wk->up = false;
  s->total_slots -= wk->slots;
  s->total_mem -= wk->mem_total;
  s->nup--;
  heaps_rebuild(s);
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
  if (in->gpus == 0 || in->gpus > LT_SCHED_MAX_WORKER_SLOTS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sched: job %llu: gpus must be within 1..%d, got %u",
                   (unsigned long long)in->id, LT_SCHED_MAX_WORKER_SLOTS, in->gpus);
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
  uint32_t jx = s->job_free;
  job_t *j = &s->jobs[jx];
  s->job_free = j->tnext;
  memset(j, 0, sizeof *j);
  j->id = in->id;
  j->tenant = t;
  j->cls = (uint8_t)in->cls;
  j->gpus = in->gpus;
  j->mem = in->mem_bytes;
  j->model = in->model;
  j->attempt = in->attempt;
  uint32_t *b = &s->job_hash[mix64(in->id) & s->job_hmask];
  j->hnext = *b;
  *b = jx;
  s->njobs++;
  queue_insert(s, jx, false, now);
  return LT_OK;
}

lt_err_t lt_sched_job_started(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_RUNNING) return LT_ERR_NOT_FOUND;
  s->jobs[jx].start = now;
  return LT_OK;
}

lt_err_t lt_sched_job_finished(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL) return LT_ERR_NOT_FOUND;
  job_t *j = &s->jobs[jx];
  if (j->state == JS_RUNNING) {
    double ran = now - j->start;
    if (ran >= 0) {
      s->finished_n++;
      s->mean_run += (ran - s->mean_run) / (double)(s->finished_n < 1000 ? s->finished_n : 1000);
    }
    run_release(s, jx);
  } else {
    queue_remove(s, jx);
  }
  job_hash_remove(s, jx);
  j->state = JS_FREE;
  j->tnext = s->job_free;
  s->job_free = jx;
  s->njobs--;
  return LT_OK;
}

lt_err_t lt_sched_job_cancelled(lt_sched_t *s, uint64_t job_id, double now) {
  return lt_sched_job_finished(s, job_id, now);
}

lt_err_t lt_sched_job_requeue(lt_sched_t *s, uint64_t job_id, double now) {
  uint32_t jx = job_find(s, job_id);
  if (jx == NIL || s->jobs[jx].state != JS_RUNNING) return LT_ERR_NOT_FOUND;
  run_release(s, jx);
  s->requeues++;
  queue_insert(s, jx, true, now);
  return LT_OK;
}

/* ---- the policy ------------------------------------------------------------------------- */

/* Tries to start queued job jx competing in class `effective`; false when it cannot now. */
static bool try_dispatch(lt_sched_t *s, uint32_t jx, int effective, double now,
                         lt_sched_decision_t *d) {
  const job_t *j = &s->jobs[jx];
  const tenant_t *t = &s->tenants[j->tenant];
  if (s->cfg.policy == LT_SCHED_POLICY_LATHE) {
    if (t->max_running && t->running_slots + j->gpus > t->max_running) return false;
    if (j->cls == LT_CLASS_STANDARD && effective == LT_CLASS_STANDARD) {
      uint32_t reserve = (uint32_t)(s->cfg.production_reserve * s->total_slots);
      if (s->used_c[LT_CLASS_STANDARD] + j->gpus > s->total_slots - reserve) return false;
    }
  }
  uint32_t w = find_worker(s, jx, s->cfg.policy == LT_SCHED_POLICY_LATHE);
  if (w == NIL) return false;
  dispatch(s, jx, w, effective, now, d);
  return true;
}

static size_t check_deadlines(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  if (now < s->next_deadline) return 0;
  size_t n = 0;
  double next = INFINITY;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!s->workers[w].up) continue;
    for (uint32_t jx = s->workers[w].run_head; jx != NIL; jx = s->jobs[jx].wnext) {
      job_t *j = &s->jobs[jx];
      const tenant_t *t = &s->tenants[j->tenant];
      if (j->stop_sent || t->max_duration <= 0) continue;
      double dl = j->start + t->max_duration;
      if (dl > now) {
        if (dl < next) next = dl;
        continue;
      }
      if (n == cap) {
        next = now;
        continue;
      }
      j->stop_sent = true;
      s->stops++;
      out[n++] = (lt_sched_decision_t){.action = LT_SCHED_STOP,
                                       .job_id = j->id,
                                       .tenant_id = t->id,
                                       .worker_id = s->workers[w].id,
                                       .gpu_mask = j->gpu_mask,
                                       .attempt = j->attempt,
                                       .cls = (lt_job_class_t)j->cls,
                                       .effective = (lt_job_class_t)j->cls};
    }
  }
  s->next_deadline = next;
  return n;
}

/* Preemption for job jx: the unreserved worker where stopping the fewest preemptible jobs
 * (newest first: least work lost) makes room; reserves it and emits PREEMPT decisions. */
static size_t starve_preempt(lt_sched_t *s, uint32_t jx, lt_sched_decision_t *out, size_t cap) {
  job_t *j = &s->jobs[jx];
  uint32_t best = NIL, best_cost = UINT32_MAX;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    const worker_t *wk = &s->workers[w];
    if (!wk->up || wk->reserved_job != NIL || wk->slots < j->gpus) continue;
    if (wk->free_slots + wk->preempt_slots < j->gpus || wk->mem_free + wk->preempt_mem < j->mem)
      continue;
    /* run lists are newest first; count how many preemptible jobs must go */
    uint32_t slots = wk->free_slots, cost = 0;
    uint64_t mem = wk->mem_free;
    for (uint32_t r = wk->run_head; r != NIL && (slots < j->gpus || mem < j->mem);
         r = s->jobs[r].wnext) {
      const job_t *rj = &s->jobs[r];
      if (rj->cls != LT_CLASS_PREEMPTIBLE || rj->preempting) continue;
      slots += rj->gpus;
      mem += rj->mem;
      cost++;
    }
    if (cost < best_cost) best = w, best_cost = cost;
  }
  if (best == NIL || best_cost > cap) return 0;
  worker_t *wk = &s->workers[best];
  reserve(s, best, jx);
  size_t n = 0;
  uint32_t slots = wk->free_slots;
  uint64_t mem = wk->mem_free;
  for (uint32_t r = wk->run_head; r != NIL && (slots < j->gpus || mem < j->mem);
       r = s->jobs[r].wnext) {
    job_t *rj = &s->jobs[r];
    if (rj->cls != LT_CLASS_PREEMPTIBLE || rj->preempting) continue;
    slots += rj->gpus;
    mem += rj->mem;
    rj->preempting = true;
    wk->preempt_slots -= rj->gpus;
    wk->preempt_mem -= rj->mem;
    s->preemptions++;
    out[n++] = (lt_sched_decision_t){.action = LT_SCHED_PREEMPT,
                                     .job_id = rj->id,
                                     .tenant_id = s->tenants[rj->tenant].id,
                                     .worker_id = wk->id,
                                     .gpu_mask = rj->gpu_mask,
                                     .attempt = rj->attempt,
                                     .cls = LT_CLASS_PREEMPTIBLE,
                                     .effective = LT_CLASS_PREEMPTIBLE};
  }
  return n;
}

/* Gang reservation for job jx: the unreserved worker big enough for it with the most free
 * slots; nothing else starts there until jx does. */
static void starve_reserve(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  uint32_t best = NIL;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    const worker_t *wk = &s->workers[w];
    if (!wk->up || wk->reserved_job != NIL || wk->slots < j->gpus || wk->mem_total < j->mem)
      continue;
    if (best == NIL || wk->free_slots > s->workers[best].free_slots) best = w;
  }
  if (best == NIL) return;
  reserve(s, best, jx);
}

/* After dispatching what fits: the oldest waiting jobs that are still blocked get a reserved
 * worker, by preempting preemptible work (production, standard) or by draining (gangs). */
static size_t starvation_pass(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = 0;
  const lt_sched_config_t *cfg = &s->cfg;
  double first_bound[LT_CLASS__COUNT];
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    double b = cfg->gang_reserve_after_s >= 0 ? cfg->gang_reserve_after_s : INFINITY;
    if (c != LT_CLASS_PREEMPTIBLE && cfg->preempt_after_s >= 0 && cfg->preempt_after_s < b)
      b = cfg->preempt_after_s;
    first_bound[c] = b;
  }
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    uint32_t looked = 0;
    for (uint32_t jx = s->ahead[c]; jx != NIL && looked < STARVE_SCAN; jx = s->jobs[jx].anext) {
      job_t *j = &s->jobs[jx];
      double waited = now - j->enq;
      if (waited < first_bound[c]) break; /* the list is oldest first: younger jobs follow */
      looked++;
      bool may_preempt = c != LT_CLASS_PREEMPTIBLE && cfg->preempt_after_s >= 0 &&
                         waited >= cfg->preempt_after_s;
      bool may_reserve = j->gpus > 1 && cfg->gang_reserve_after_s >= 0 &&
                         waited >= cfg->gang_reserve_after_s;
      if (!may_preempt && !may_reserve) continue;
      if (j->reserved != NIL || now < j->starve_next) continue;
      if (s->nreserved >= max_reserved(s)) return n;
      const tenant_t *t = &s->tenants[j->tenant];
      if (t->max_running && t->running_slots + j->gpus > t->max_running) continue;
      if (c == LT_CLASS_STANDARD && !(cfg->aging_s > 0 && cfg->aging_levels > 0 &&
                                      waited >= cfg->aging_s)) {
        uint32_t reserve = (uint32_t)(cfg->production_reserve * s->total_slots);
        if (s->used_c[LT_CLASS_STANDARD] + j->gpus > s->total_slots - reserve) continue;
      }
      if (find_worker(s, jx, false) != NIL) continue; /* it fits: the next decide starts it */
      j->starve_next = now + STARVE_RETRY_S;
      if (may_preempt) n += starve_preempt(s, jx, out + n, cap - n);
      if (j->reserved == NIL && may_reserve) starve_reserve(s, jx);
      if (n == cap) return n;
    }
  }
  return n;
}

/* How aging applies to class c's jobs competing at level e < c. Aging lets a job pass the
 * classes above its own, oldest first (AGE_JOBS) — when jobs of those classes wait. When none
 * waits there is nothing to pass, and the class's fair order must not turn into FIFO; the one
 * thing that can still hold standard work back is the production reserve, and once standard
 * work has waited aging_s the class may use it, in its own fair order (AGE_CLASS). */
enum { AGE_NONE, AGE_JOBS, AGE_CLASS };
static int aging_mode(const lt_sched_t *s, int e, int c) {
  for (int k = e; k < c; k++)
    if (s->queued_c[k] > 0) return AGE_JOBS;
  if (c == LT_CLASS_STANDARD && e == LT_CLASS_PRODUCTION) {
    uint32_t reserve = (uint32_t)(s->cfg.production_reserve * s->total_slots);
    if (reserve > 0 && s->used_c[LT_CLASS_STANDARD] + 1 > s->total_slots - reserve)
      return AGE_CLASS;
  }
  return AGE_NONE;
}

/* Starts the head job of the tenant with the lowest weighted dominant share in class c's
 * heap, competing at level `effective`; tenants that cannot start are set aside for the rest
 * of the call. Returns true when one started. */
static bool pick_fair(lt_sched_t *s, int c, int effective, double now, lt_sched_decision_t *d,
                      uint32_t *scanned, bool *limited) {
  while (s->heap_n[c] > 0) {
    uint32_t t = s->heap[c][0];
    if (try_dispatch(s, s->tenants[t].qhead[c], effective, now, d)) return true;
    heap_remove(s, c, t);
    s->tenants[t].blocked |= (uint8_t)(1u << c);
    s->blocked[c][s->nblocked[c]++] = t;
    if (++*scanned >= s->cfg.max_scan) {
      *limited = true;
      return false;
    }
  }
  return false;
}

static size_t decide_fifo(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = 0;
  while (n < cap && s->ahead[0] != NIL && s->slots_used < s->total_slots)
    if (!try_dispatch(s, s->ahead[0], s->jobs[s->ahead[0]].cls, now, &out[n])) break;
    else n++;
  return n;
}

size_t lt_sched_decide(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = check_deadlines(s, now, out, cap);
  if (s->cfg.policy == LT_SCHED_POLICY_FIFO) return n + decide_fifo(s, now, out + n, cap - n);

  const lt_sched_config_t *cfg = &s->cfg;
  uint32_t scanned = 0;
  bool limited = false;
  for (int c = 0; c < LT_CLASS__COUNT; c++) s->cursor[c] = s->ahead[c];
  while (!limited) {
    if (n >= cap) {
      limited = true;
      break;
    }
    if (s->slots_used >= s->total_slots) break;
    bool placed = false;
    for (int e = 0; e < LT_CLASS__COUNT && !placed && !limited; e++) {
      /* jobs of lower classes that aged into e go first */
      if (cfg->aging_s > 0) {
        for (int c = e + 1; c < LT_CLASS__COUNT && c <= e + (int)cfg->aging_levels && !placed;
             c++) {
          int mode = aging_mode(s, e, c);
          if (mode == AGE_NONE) continue;
          double thr = cfg->aging_s * (c - e);
          if (mode == AGE_CLASS) {
            if (s->ahead[c] != NIL && now - s->jobs[s->ahead[c]].enq >= thr &&
                pick_fair(s, c, e, now, &out[n], &scanned, &limited)) {
              n++;
              placed = true;
            }
            if (limited) break;
            continue;
          }
          while (s->cursor[c] != NIL && now - s->jobs[s->cursor[c]].enq >= thr) {
            uint32_t jx = s->cursor[c];
            s->cursor[c] = s->jobs[jx].anext;
            if (try_dispatch(s, jx, e, now, &out[n])) {
              n++;
              placed = true;
              break;
            }
            if (++scanned >= cfg->max_scan) {
              limited = true;
              break;
            }
          }
          if (limited) break;
        }
      }
      /* then class e's own jobs, tenant with the lowest weighted dominant share first */
      if (!placed && !limited && pick_fair(s, e, e, now, &out[n], &scanned, &limited)) {
        n++;
        placed = true;
      }
    }
    if (!placed) break;
  }
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    for (uint32_t i = 0; i < s->nblocked[c]; i++) {
      uint32_t t = s->blocked[c][i];
      s->tenants[t].blocked &= (uint8_t)~(1u << c);
      tenant_refresh(s, t, c);
    }
    s->nblocked[c] = 0;
    s->cursor[c] = NIL;
  }
  if (!limited && n < cap) n += starvation_pass(s, now, out + n, cap - n);
  return n;
}

/* ---- visibility ------------------------------------------------------------------------- */

void lt_sched_counters(const lt_sched_t *s, lt_sched_counters_t *o) {
  memset(o, 0, sizeof *o);
  o->dispatches = s->dispatches;
  o->preemptions = s->preemptions;
  o->stops = s->stops;
  o->cold_loads = s->cold_loads;
  o->requeues = s->requeues;
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
    for (uint32_t k = s->ahead[0]; k != jx; k = s->jobs[k].anext) pos++;
  } else {
    int c = j->cls;
    for (int h = 0; h < c; h++) pos += s->queued_c[h];
    uint32_t idx = 0;
    for (uint32_t k = s->tenants[j->tenant].qhead[c]; k != jx; k = s->jobs[k].tnext) idx++;
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
        .dominant_share = tenant_key(s, tt, c),
        .wait_p50_s = hist_quantile(tt->hist, nd, 0.5),
        .wait_p99_s = hist_quantile(tt->hist, nd, 0.99),
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
  return p == LT_SCHED_POLICY_FIFO ? "fifo" : p == LT_SCHED_POLICY_LATHE ? "lathe" : "?";
}
