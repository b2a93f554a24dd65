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
  assert(s->workers[w].reserved_job == NIL);
  s->workers[w].reserved_job = jx;
  s->jobs[jx].reserved = w;
  s->jobs[jx].nres++;
  s->nreserved++;
  s->reserved_free += s->workers[w].free_slots;
}

/* A multi-worker gang's reservation spans several workers, found by a scan of the workers:
 * reservations are rare events (a bounded few at once), not per decision. */
void sched_unreserve(lt_sched_t *s, uint32_t w) {
  uint32_t jx = s->workers[w].reserved_job;
  if (jx == NIL) return;
  job_t *j = &s->jobs[jx];
  if (j->nres > 1) {
    for (uint32_t k = 0; k < s->nworkers; k++)
      if (s->workers[k].reserved_job == jx) {
        s->workers[k].reserved_job = NIL;
        s->reserved_free -= s->workers[k].free_slots;
      }
  } else {
    s->workers[w].reserved_job = NIL;
    s->reserved_free -= s->workers[w].free_slots;
  }
  s->nreserved -= j->nres;
  j->nres = 0;
  j->reserved = NIL;
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

/* Lists link elements of one table: jobs (their tq and age links) or parts (their run link). */
typedef struct ltab {
  char *base;
  size_t size, off; /* element size, and the link's offset in it */
} ltab_t;

#define JOB_LINK(s, field) ((ltab_t){(char *)(s)->jobs, sizeof(job_t), offsetof(job_t, field)})
#define PART_RUN(s) ((ltab_t){(char *)(s)->parts, sizeof(part_t), offsetof(part_t, run)})

static link_t *tab_link(ltab_t t, uint32_t i) { return (link_t *)(t.base + i * t.size + t.off); }

/* Puts element i on list l at the head, or at the tail. */
static void list_push(ltab_t t, list_t *l, uint32_t i, bool front) {
  link_t *n = tab_link(t, i);
  if (front) {
    n->prev = NIL;
    n->next = l->head;
    if (l->head != NIL) tab_link(t, l->head)->prev = i;
    else l->tail = i;
    l->head = i;
  } else {
    n->next = NIL;
    n->prev = l->tail;
    if (l->tail != NIL) tab_link(t, l->tail)->next = i;
    else l->head = i;
    l->tail = i;
  }
}

static void list_unlink(ltab_t t, list_t *l, uint32_t i) {
  const link_t *n = tab_link(t, i);
  if (n->prev != NIL) tab_link(t, n->prev)->next = n->next;
  else l->head = n->next;
  if (n->next != NIL) tab_link(t, n->next)->prev = n->prev;
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
  if (c == LT_CLASS_PREEMPTIBLE && !t->in_fair) { /* fair_advance's list */
    t->in_fair = true;
    s->fair_t[s->nfair++] = j->tenant;
  }
  j->preempting = false;
  j->stop_sent = false;
  j->part = NIL;
  j->world = 0;
  j->reserved = NIL;
  j->nres = 0;
  /* tenant queue: new jobs at the tail, requeued ones (already started once) at the head;
   * age list: the tail, so it stays ordered by enq, except FIFO puts requeued jobs first */
  list_push(JOB_LINK(s, tq), &t->q[c], jx, front);
  list_push(JOB_LINK(s, age), &s->age[a], jx, front && s->cfg.policy == LT_SCHED_POLICY_FIFO);
  t->queued++;
  t->queued_c[c]++;
  t->queued_gpus_c[c] += j->gpus;
  s->queued++;
  s->queued_c[c]++;
  s->queued_by_gpus[j->gpus <= LT_SCHED_MAX_WORKER_SLOTS ? j->gpus : LT_SCHED_MAX_WORKER_SLOTS + 1]++;
  sched_tenant_refresh(s, j->tenant, c);
}

void sched_queue_remove(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  int c = j->cls, a = age_list(s, j);
  assert(j->state == JS_QUEUED);
  list_unlink(JOB_LINK(s, tq), &t->q[c], jx);
  for (int k = 0; k < LT_CLASS__COUNT; k++)
    if (s->cursor[k] == jx) s->cursor[k] = j->age.next;
  list_unlink(JOB_LINK(s, age), &s->age[a], jx);
  if (j->reserved != NIL) sched_unreserve(s, j->reserved);
  t->queued--;
  t->queued_c[c]--;
  t->queued_gpus_c[c] -= j->gpus;
  s->queued--;
  s->queued_c[c]--;
  s->queued_by_gpus[j->gpus <= LT_SCHED_MAX_WORKER_SLOTS ? j->gpus : LT_SCHED_MAX_WORKER_SLOTS + 1]--;
  j->state = JS_FREE;
  sched_tenant_refresh(s, j->tenant, c);
}

/* ---- workers ---------------------------------------------------------------------------- */

static void worker_set_free(lt_sched_t *s, uint32_t w, uint32_t free_slots) {
  worker_t *wk = &s->workers[w];
  if (wk->up) bm_clr(free_bm(s, wk->free_slots), w);
  if (wk->reserved_job != NIL) s->reserved_free = s->reserved_free - wk->free_slots + free_slots;
  if (wk->up) sched_group_free(s, w, (int64_t)free_slots - wk->free_slots);
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

/* Releases what a running job holds: every part. */
void sched_run_release(lt_sched_t *s, uint32_t jx) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  assert(j->state == JS_RUNNING);
  for (uint32_t p = j->part, next; p != NIL; p = next) {
    part_t *pt = &s->parts[p];
    worker_t *wk = &s->workers[pt->worker];
    next = pt->next;
    list_unlink(PART_RUN(s), &wk->run, p);
    wk->gpu_free |= pt->mask;
    wk->mem_free += pt->mem;
    if (j->cls == LT_CLASS_PREEMPTIBLE && !j->preempting) {
      wk->preempt_slots -= pt->gpus;
      wk->preempt_mem -= pt->mem;
    }
    worker_set_free(s, pt->worker, wk->free_slots + pt->gpus);
    pt->next = s->part_free;
    s->part_free = p;
  }
  t->running_slots -= j->gpus;
  t->run_slots_c[j->cls] -= j->gpus;
  t->run_mem_c[j->cls] -= j->mem;
  s->used_c[j->cls] -= j->gpus;
  s->slots_used -= j->gpus;
  s->running--;
  j->state = JS_FREE;
  j->part = NIL;
  j->world = 0;
  sched_tenant_refresh_all(s, j->tenant);
}

lt_sched_decision_t sched_part_decision(const lt_sched_t *s, const job_t *j, uint32_t p,
                                        lt_sched_action_t action) {
  const part_t *pt = &s->parts[p];
  return (lt_sched_decision_t){.action = action,
                               .job_id = j->id,
                               .tenant_id = s->tenants[j->tenant].id,
                               .worker_id = s->workers[pt->worker].id,
                               .gpu_mask = pt->mask,
                               .rank = pt->rank,
                               .world = j->world,
                               .attempt = j->attempt,
                               .cls = (lt_job_class_t)j->cls,
                               .effective = (lt_job_class_t)j->cls};
}

/* Books gpus GPUs (those of want, free ones of the worker; want 0: the lowest free ones) and mem
 * bytes of worker w for job jx as its part of rank `rank`; returns the part and whether the
 * worker loaded the job's model cold. */
static uint32_t book_part(lt_sched_t *s, uint32_t jx, uint32_t w, uint32_t gpus, uint64_t want, uint64_t mem,
                          uint32_t rank, bool *cold) {
  job_t *j = &s->jobs[jx];
  worker_t *wk = &s->workers[w];
  uint64_t mask = want, freem = wk->gpu_free & ~want;
  assert((want & wk->gpu_free) == want && (uint32_t)__builtin_popcountll(want) == (want ? gpus : 0));
  for (uint32_t i = 0; i < gpus && !want; i++) {
    uint64_t bit = freem & (~freem + 1);
    assert(bit);
    mask |= bit;
    freem &= ~bit;
  }
  wk->gpu_free = freem;
  assert(wk->mem_free >= mem);
  wk->mem_free -= mem;
  worker_set_free(s, w, wk->free_slots - gpus);
  *cold = j->model != LT_SCHED_NO_MODEL && worker_touch_model(s, w, j->model);
  uint32_t p = s->part_free;
  assert(p != NIL); /* parts_cap: one a GPU of max_workers full workers */
  part_t *pt = &s->parts[p];
  s->part_free = pt->next;
  *pt = (part_t){.mask = mask, .mem = mem, .job = jx, .worker = w, .gpus = gpus, .rank = rank,
                 .next = NIL};
  list_push(PART_RUN(s), &wk->run, p, true);
  if (j->cls == LT_CLASS_PREEMPTIBLE) {
    wk->preempt_slots += gpus;
    wk->preempt_mem += mem;
  }
  return p;
}

double sched_job_bound(const lt_sched_t *s, const job_t *j) {
  double b = j->limit, t = s->tenants[j->tenant].max_duration;
  if (t > 0 && (b <= 0 || t < b)) b = t;
  return b;
}

bool sched_backfill_ok(const lt_sched_t *s, const worker_t *wk, uint32_t jx) {
  double b = sched_job_bound(s, &s->jobs[jx]);
  if (b <= 0) return false;
  const job_t *r = &s->jobs[wk->reserved_job];
  if (r->cls == LT_CLASS_PRODUCTION) return false; /* production preempts for its gangs */
  uint32_t need = r->gpus < wk->slots ? r->gpus : wk->slots, have = wk->free_slots;
  if (have >= need) return false; /* it can start now: the slots are its */
  double ends[LT_SCHED_MAX_WORKER_SLOTS];
  uint32_t gpus[LT_SCHED_MAX_WORKER_SLOTS], n = 0;
  for (uint32_t p = wk->run.head; p != NIL && n < LT_SCHED_MAX_WORKER_SLOTS; p = s->parts[p].run.next) {
    const job_t *rj = &s->jobs[s->parts[p].job];
    if (rj->preempting) return false;
    double rb = sched_job_bound(s, rj);
    if (rb <= 0) continue; /* never ends, as far as the shadow goes */
    double e = rj->start + rb;
    uint32_t i = n++; /* insertion sort: a worker runs at most `slots` parts */
    for (; i > 0 && ends[i - 1] > e; i--) {
      ends[i] = ends[i - 1];
      gpus[i] = gpus[i - 1];
    }
    ends[i] = e;
    gpus[i] = s->parts[p].gpus;
  }
  for (uint32_t i = 0; i < n; i++) {
    have += gpus[i];
    if (have >= need) return s->now + b <= ends[i];
  }
  return false;
}

void sched_book(lt_sched_t *s, uint32_t jx, const placement_t *pl, int effective, double now,
                lt_sched_decision_t *d) {
  sched_book_on(s, jx, pl, NULL, effective, now, d);
}

void sched_book_on(lt_sched_t *s, uint32_t jx, const placement_t *pl, const uint64_t *masks, int effective,
                   double now, lt_sched_decision_t *d) {
  job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  double waited = now - j->enq;
  for (uint32_t r = 0; r < pl->n; r++) { /* on a worker held for another job it may only use
                                           * as a higher class or by backfill: count the latter */
    uint32_t h = s->workers[pl->worker[r]].reserved_job;
    if (h != NIL && h != jx && j->cls >= s->jobs[h].cls) {
      s->backfills++;
      break;
    }
  }
  sched_queue_remove(s, jx); /* also drops j's reservation */
  j->state = JS_RUNNING;
  j->start = now;
  j->attempt++;
  j->world = pl->n;
  /* memory is split by GPUs, rounded up, the last part taking what is left: no part needs more
   * than sched_gang_find counted for it (sched_mem_per_gpu) */
  uint64_t per_gpu = sched_mem_per_gpu(j), left = j->mem;
  uint32_t *link = &j->part;
  bool any_cold = false;
  for (uint32_t r = 0; r < pl->n; r++) {
    bool cold;
    uint64_t mem = per_gpu * pl->gpus[r] < left ? per_gpu * pl->gpus[r] : left;
    left -= mem;
    uint32_t p = book_part(s, jx, pl->worker[r], pl->gpus[r], masks ? masks[r] : 0, mem, r, &cold);
    *link = p;
    link = &s->parts[p].next;
    any_cold |= cold;
    d[r] = sched_part_decision(s, j, p, LT_SCHED_DISPATCH);
    d[r].effective = (lt_job_class_t)effective;
    d[r].cold_load = cold;
    d[r].waited_s = waited;
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
  if (any_cold) {
    s->cold_loads++;
    t->cold_c[j->cls]++;
  }
  if (t->max_duration > 0 && now + t->max_duration < s->next_deadline)
    s->next_deadline = now + t->max_duration;
  sched_tenant_refresh_all(s, j->tenant);
}

void sched_book1(lt_sched_t *s, uint32_t jx, uint32_t w, int effective, double now,
                 lt_sched_decision_t *d) {
  placement_t pl;
  pl.n = 1;
  pl.worker[0] = w;
  pl.gpus[0] = s->jobs[jx].gpus;
  sched_book(s, jx, &pl, effective, now, d);
}

/* ---- invariants ------------------------------------------------------------------------- */

/* Running job jx's parts: world of them, in rank order, on distinct up workers, adding up to its
 * GPUs and memory. */
static bool job_parts_ok(const lt_sched_t *s, uint32_t jx) {
  const job_t *j = &s->jobs[jx];
  uint32_t n = 0, gpus = 0;
  uint64_t mem = 0;
  for (uint32_t p = j->part; p != NIL; p = s->parts[p].next, n++) {
    const part_t *pt = &s->parts[p];
    if (pt->job != jx || pt->rank != n || n >= LT_SCHED_MAX_GANG_WORKERS || !s->workers[pt->worker].up)
      return false;
    for (uint32_t q = j->part; q != p; q = s->parts[q].next)
      if (s->parts[q].worker == pt->worker) return false;
    gpus += pt->gpus;
    mem += pt->mem;
  }
  return n == j->world && n >= 1 && gpus == j->gpus && mem == j->mem;
}

/* Worker w's run list books exactly what the worker lacks: GPUs (disjoint masks, none of them
 * free), slots, memory, and the preemptible part of it; each part's job is consistent. */
static bool worker_ok(const lt_sched_t *s, uint32_t w, uint32_t *running) {
  const worker_t *wk = &s->workers[w];
  if (!wk->up) return wk->run.head == NIL && wk->reserved_job == NIL;
  if (wk->free_slots > wk->slots || wk->mem_free > wk->mem_total) return false;
  if ((uint32_t)__builtin_popcountll(wk->gpu_free) != wk->free_slots) return false;
  if (!(s->free_bm[(size_t)wk->free_slots * s->words + (w >> 6)] & (1ULL << (w & 63)))) return false;
  uint64_t masks = 0, mem = 0, pmem = 0;
  uint32_t slots = 0, pslots = 0;
  for (uint32_t p = wk->run.head; p != NIL; p = s->parts[p].run.next) {
    const part_t *pt = &s->parts[p];
    const job_t *j = &s->jobs[pt->job];
    if (j->state != JS_RUNNING || pt->worker != w || (pt->mask & (masks | wk->gpu_free)) ||
        (uint32_t)__builtin_popcountll(pt->mask) != pt->gpus)
      return false;
    masks |= pt->mask;
    slots += pt->gpus;
    mem += pt->mem;
    if (j->cls == LT_CLASS_PREEMPTIBLE && !j->preempting) pslots += pt->gpus, pmem += pt->mem;
    if (pt->rank == 0) {
      if (j->part != p || !job_parts_ok(s, pt->job)) return false;
      ++*running;
    }
  }
  return slots == wk->slots - wk->free_slots && mem == wk->mem_total - wk->mem_free &&
         pslots == wk->preempt_slots && pmem == wk->preempt_mem;
}

/* Each node group's free and total slots are those of its up workers. */
static bool groups_ok(const lt_sched_t *s) {
  for (uint32_t g = 0; g < s->ngroups; g++) {
    uint32_t slots = 0, free_slots = 0;
    for (uint32_t w = s->groups[g].head; w != NIL; w = s->workers[w].gnext) {
      if (s->workers[w].group != g) return false;
      if (!s->workers[w].up) continue;
      slots += s->workers[w].slots;
      free_slots += s->workers[w].free_slots;
    }
    if (slots != s->groups[g].slots || free_slots != s->groups[g].free_slots) return false;
  }
  return true;
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
    if (jx != NIL) {
      const job_t *j = &s->jobs[jx];
      if (j->state != JS_QUEUED || j->reserved == NIL || j->nres == 0 ||
          s->workers[j->reserved].reserved_job != jx)
        return false;
      uint32_t held = 0; /* every worker reserved for jx, counted once at the one it names */
      if (j->reserved == w)
        for (uint32_t k = 0; k < s->nworkers; k++) held += s->workers[k].reserved_job == jx;
      if (j->reserved == w && held != j->nres) return false;
    }
    reserved += jx != NIL;
  }
  if (!groups_ok(s)) return false;
  for (uint32_t t = 0; t < s->ntenants; t++)
    if (!tenant_ok(s, t, &in_queues)) return false;
  return running == s->running && in_queues == s->queued && reserved == s->nreserved;
}
