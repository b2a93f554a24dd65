/* lt_sched_queue: the policy's state between decisions (see lt_sched_int.h for the layout) —
 * the tenants' queues and age lists, the per-class fair-share heaps, and what a running job books
 * on its worker (slots, GPUs, memory, model cache) and releases; and sched_ok(), the check of
 * the tables' invariants. Events (lt_sched.c) and decisions (lt_sched_decide.c) queue, book and
 * release jobs through these functions. */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>

/* ---- reservations and wait histograms ---------------------------------------------------- */

void sched_reserve(lt_sched_t *s, uint32_t w, uint32_t jx) {
  s->workers[w].reserved_job = jx;
  s->jobs[jx].reserved = w;
  s->nreserved++;
  s->reserved_free += s->workers[w].free_slots;
}

void sched_unreserve(lt_sched_t *s, uint32_t w) {
  uint32_t jx = s->workers[w].reserved_job;
  if (jx == NIL) return;
  s->jobs[jx].reserved = NIL;
  s->workers[w].reserved_job = NIL;
  s->nreserved--;
  s->reserved_free -= s->workers[w].free_slots;
}

static uint32_t hist_bucket(double w) {
  if (w < 0.1) return 0;
  double b = 1.0 + floor(log(w / 0.1) / log(1.25));
  return b >= NHIST - 1 ? NHIST - 1 : (uint32_t)b;
}

double sched_hist_quantile(const uint32_t *h, uint64_t n, double q) {
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

double sched_tenant_key(const lt_sched_t *s, const tenant_t *t, int c) {
  double slots = s->total_slots ? (double)t->run_slots_c[c] / s->total_slots : 0.0;
  double mem = s->total_mem ? (double)t->run_mem_c[c] / (double)s->total_mem : 0.0;
  return (slots > mem ? slots : mem) / t->weight;
}

/* Heap order: lower dominant share first, then the older head job, then the tenant index. */
static bool heap_less(const lt_sched_t *s, int c, uint32_t a, uint32_t b) {
  const tenant_t *ta = &s->tenants[a], *tb = &s->tenants[b];
  if (ta->key[c] != tb->key[c]) return ta->key[c] < tb->key[c];
  double ea = s->jobs[ta->q[c].head].enq, eb = s->jobs[tb->q[c].head].enq;
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

void sched_heap_remove(lt_sched_t *s, int c, uint32_t t) {
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
void sched_tenant_refresh(lt_sched_t *s, uint32_t t, int c) {
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return;
  tenant_t *tt = &s->tenants[t];
  bool eligible = tt->queued_c[c] > 0 && !(tt->blocked & (1u << c)) &&
                  (tt->max_running == 0 || tt->running_slots < tt->max_running);
  tt->key[c] = sched_tenant_key(s, tt, c);
  if (tt->heap_pos[c] != NIL) {
    if (!eligible) {
      sched_heap_remove(s, c, t);
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

void sched_tenant_refresh_all(lt_sched_t *s, uint32_t t) {
  for (int c = 0; c < LT_CLASS__COUNT; c++) sched_tenant_refresh(s, t, c);
}

/* Keys depend on fleet totals: after a worker joins or leaves, recompute every key. */
void sched_heaps_rebuild(lt_sched_t *s) {
  if (s->cfg.policy != LT_SCHED_POLICY_LATHE) return;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    for (uint32_t i = 0; i < s->heap_n[c]; i++) {
      tenant_t *tt = &s->tenants[s->heap[c][i]];
      tt->key[c] = sched_tenant_key(s, tt, c);
    }
    for (uint32_t i = s->heap_n[c] / 2 + 1; i-- > 0;)
      if (i < s->heap_n[c]) heap_down(s, c, i);
  }
}

/* ---- queues ----------------------------------------------------------------------------- */

/* The link_t at byte offset off in job jx: one of its tq, age or run links. */
static link_t *job_link(lt_sched_t *s, uint32_t jx, size_t off) {
  return (link_t *)((char *)&s->jobs[jx] + off);
}

/* Puts job jx on list l (through its link at offset off) at the head, or at the tail. */
static void list_push(lt_sched_t *s, list_t *l, uint32_t jx, size_t off, bool front) {
  link_t *n = job_link(s, jx, off);
  if (front) {
    n->prev = NIL;
    n->next = l->head;
    if (l->head != NIL) job_link(s, l->head, off)->prev = jx;
    else l->tail = jx;
    l->head = jx;
  } else {
    n->next = NIL;
    n->prev = l->tail;
    if (l->tail != NIL) job_link(s, l->tail, off)->next = jx;
    else l->head = jx;
    l->tail = jx;
  }
}

static void list_unlink(lt_sched_t *s, list_t *l, uint32_t jx, size_t off) {
  const link_t *n = job_link(s, jx, off);
  if (n->prev != NIL) job_link(s, n->prev, off)->next = n->next;
  else l->head = n->next;
  if (n->next != NIL) job_link(s, n->next, off)->prev = n->prev;
  else l->tail = n->prev;
}

static int age_list(const lt_sched_t *s, const job_t *j) {
  return s->cfg.policy == LT_SCHED_POLICY_FIFO ? 0 : j->cls;
}

void sched_queue_insert(lt_sched_t *s, uint32_t jx, bool front, double now) {
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
  /* tenant queue: new jobs at the tail, requeued ones (already started once) at the head;
   * age list: the tail, so it stays ordered by enq, except FIFO puts requeued jobs first */
  list_push(s, &t->q[c], jx, offsetof(job_t, tq), front);
  list_push(s, &s->age[a], jx, offsetof(job_t, age), front && s->cfg.policy == LT_SCHED_POLICY_FIFO);
  t->queued++;
  t->queued_c[c]++;
  t->queued_gpus_c[c] += j->gpus;
  s->queued++;
  s->queued_c[c]++;
  s->queued_by_gpus[j->gpus]++;
  sched_tenant_refresh(s, j->tenant, c);
}

void sched_queue_remove(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  int c = j->cls, a = age_list(s, j);
  assert(j->state == JS_QUEUED);
  list_unlink(s, &t->q[c], jx, offsetof(job_t, tq));
  for (int k = 0; k < LT_CLASS__COUNT; k++)
    if (s->cursor[k] == jx) s->cursor[k] = j->age.next;
  list_unlink(s, &s->age[a], jx, offsetof(job_t, age));
  if (j->reserved != NIL) sched_unreserve(s, j->reserved);
  t->queued--;
  t->queued_c[c]--;
  t->queued_gpus_c[c] -= j->gpus;
  s->queued--;
  s->queued_c[c]--;
  s->queued_by_gpus[j->gpus]--;
  j->state = JS_FREE;
  sched_tenant_refresh(s, j->tenant, c);
}

/* ---- workers ---------------------------------------------------------------------------- */

static void worker_set_free(lt_sched_t *s, uint32_t w, uint32_t free_slots) {
  worker_t *wk = &s->workers[w];
  if (wk->up) bm_clr(free_bm(s, wk->free_slots), w);
  if (wk->reserved_job != NIL) s->reserved_free = s->reserved_free - wk->free_slots + free_slots;
  wk->free_slots = free_slots;
  if (wk->up) bm_set(free_bm(s, free_slots), w);
}

int sched_worker_model_slot(const worker_t *wk, uint32_t m) {
  for (uint32_t i = 0; i < wk->nmodels; i++)
    if (wk->models[i] == m) return (int)i;
  return -1;
}

/* Records that worker w holds model m now (a cold load evicts the least recently used). */
static bool worker_touch_model(lt_sched_t *s, uint32_t w, uint32_t m) {
  worker_t *wk = &s->workers[w];
  int i = sched_worker_model_slot(wk, m);
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

/* Releases what a running job holds. */
void sched_run_release(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[j->worker];
  tenant_t *t = &s->tenants[j->tenant];
  assert(j->state == JS_RUNNING);
  list_unlink(s, &wk->run, jx, offsetof(job_t, run));
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
  sched_tenant_refresh_all(s, j->tenant);
}

void sched_book(lt_sched_t *s, uint32_t jx, uint32_t w, int effective, double now,
                     lt_sched_decision_t *d) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[w];
  tenant_t *t = &s->tenants[j->tenant];
  double waited = now - j->enq;
  sched_queue_remove(s, jx); /* also drops j's reservation */
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
  list_push(s, &wk->run, jx, offsetof(job_t, run), true);
  if (j->cls == LT_CLASS_PREEMPTIBLE) {
    wk->preempt_slots += j->gpus;
    wk->preempt_mem += j->mem;
  }
  t->running_slots += j->gpus;
  t->run_slots_c[j->cls] += j->gpus;
  t->run_mem_c[j->cls] += j->mem;
  t->dispatched++;
  t->hist[hist_bucket(waited)]++;
  sched_stats_waited(s, jx, waited, hist_bucket(waited));
  s->used_c[j->cls] += j->gpus;
  s->slots_used += j->gpus;
  s->running++;
  s->dispatches++;
  if (cold) {
    s->cold_loads++;
    t->cold_c[j->cls]++;
  }
  if (t->max_duration > 0 && now + t->max_duration < s->next_deadline)
    s->next_deadline = now + t->max_duration;
  sched_tenant_refresh_all(s, j->tenant);
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

/* ---- invariants ------------------------------------------------------------------------- */

/* Worker w's run list books exactly what the worker lacks: GPUs (disjoint masks, none of them
 * free), slots, memory, and the preemptible part of it. */
static bool worker_ok(const lt_sched_t *s, uint32_t w, uint32_t *running) {
  const worker_t *wk = &s->workers[w];
  if (!wk->up) return wk->run.head == NIL && wk->reserved_job == NIL;
  if (wk->free_slots > wk->slots || wk->mem_free > wk->mem_total) return false;
  if ((uint32_t)__builtin_popcountll(wk->gpu_free) != wk->free_slots) return false;
  if (!(s->free_bm[(size_t)wk->free_slots * s->words + (w >> 6)] & (1ULL << (w & 63)))) return false;
  uint64_t masks = 0, mem = 0, pmem = 0;
  uint32_t slots = 0, pslots = 0;
  for (uint32_t jx = wk->run.head; jx != NIL; jx = s->jobs[jx].run.next) {
    const job_t *j = &s->jobs[jx];
    if (j->state != JS_RUNNING || j->worker != w || (j->gpu_mask & (masks | wk->gpu_free)) ||
        (uint32_t)__builtin_popcountll(j->gpu_mask) != j->gpus)
      return false;
    masks |= j->gpu_mask;
    slots += j->gpus;
    mem += j->mem;
    if (j->cls == LT_CLASS_PREEMPTIBLE && !j->preempting) pslots += j->gpus, pmem += j->mem;
    ++*running;
  }
  return slots == wk->slots - wk->free_slots && mem == wk->mem_total - wk->mem_free &&
         pslots == wk->preempt_slots && pmem == wk->preempt_mem;
}

/* Tenant t's queues hold what its counters say, in (re)queue state. */
static bool tenant_ok(const lt_sched_t *s, uint32_t t, uint32_t *queued) {
  const tenant_t *tt = &s->tenants[t];
  uint32_t n = 0, run = 0;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    uint32_t k = 0;
    uint64_t gpus = 0;
    for (uint32_t jx = tt->q[c].head; jx != NIL; jx = s->jobs[jx].tq.next) {
      const job_t *j = &s->jobs[jx];
      if (j->state != JS_QUEUED || j->tenant != t || j->cls != c) return false;
      k++;
      gpus += j->gpus;
    }
    if (k != tt->queued_c[c] || gpus != tt->queued_gpus_c[c]) return false;
    n += k;
    run += tt->run_slots_c[c];
  }
  *queued += n;
  return n == tt->queued && run == tt->running_slots;
}

bool sched_ok(const lt_sched_t *s) {
  uint32_t used = 0, queued = 0;
  for (int c = 0; c < LT_CLASS__COUNT; c++) used += s->used_c[c], queued += s->queued_c[c];
  if (used != s->slots_used || queued != s->queued || s->slots_used > s->total_slots ||
      s->queued + s->running != s->njobs)
    return false;
  if (!s->cfg.check_invariants) return true;
  uint32_t running = 0, in_queues = 0, reserved = 0;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!worker_ok(s, w, &running)) return false;
    uint32_t jx = s->workers[w].reserved_job;
    if (jx != NIL && (s->jobs[jx].state != JS_QUEUED || s->jobs[jx].reserved != w)) return false;
    reserved += jx != NIL;
  }
  for (uint32_t t = 0; t < s->ntenants; t++)
    if (!tenant_ok(s, t, &in_queues)) return false;
  return running == s->running && in_queues == s->queued && reserved == s->nreserved;
}
