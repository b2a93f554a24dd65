/* lt_sched_gang: node groups and multi-worker gangs for the policy (lt_sched.h, "gang
 * allocation"). A job with more GPUs than the largest worker runs on several workers of one
 * node group (a rack, an NVLink domain), all or nothing: this file finds such a placement —
 * shared by the Lathe policy and its FIFO and LAS peers, so that comparisons are fair — and,
 * for the Lathe policy's starvation pass, the set of workers a waiting gang reserves (they
 * drain for it) and the preemptions a production gang asks for there.
 *
 * Cost: a group is looked at only when its free slots (or, to reserve, its slots) could hold
 * the gang; its workers are then sorted, O(w log w) for a group of w workers. The decide call's
 * scan bound keeps the number of gangs tried per call small. */
#include "lt_sched_int.h"

#include <assert.h>

/* ---- node groups ------------------------------------------------------------------------ */

/* The index of node group id, created the first time (or reusing an emptied row). */
static uint32_t group_index(lt_sched_t *s, uint32_t id) {
  uint32_t empty = NIL;
  for (uint32_t g = 0; g < s->ngroups; g++) {
    if (s->groups[g].id == id) return g;
    if (s->groups[g].head == NIL && empty == NIL) empty = g;
  }
  uint32_t g = s->ngroups < s->cfg.max_workers ? s->ngroups++ : empty;
  assert(g != NIL); /* a worker is in one group: max_workers rows always leave one empty */
  s->groups[g] = (group_t){.id = id, .head = NIL};
  return g;
}

void sched_group_join(lt_sched_t *s, uint32_t w, uint32_t id) {
  worker_t *wk = &s->workers[w];
  assert(!wk->up);
  if (wk->group != NIL && s->groups[wk->group].id == id) return;
  if (wk->group != NIL) { /* leave the old group (its lists are short, and this is rare) */
    uint32_t *p = &s->groups[wk->group].head;
    while (*p != w) p = &s->workers[*p].gnext;
    *p = wk->gnext;
  }
  uint32_t g = group_index(s, id);
  wk->group = g;
  wk->gnext = s->groups[g].head;
  s->groups[g].head = w;
}

void sched_group_free(lt_sched_t *s, uint32_t w, int64_t delta) {
  group_t *g = &s->groups[s->workers[w].group];
  g->free_slots = (uint32_t)((int64_t)g->free_slots + delta);
}

/* ---- placement -------------------------------------------------------------------------- */

/* How many of `slots` slots a part of job j may take on a worker with mem bytes: memory is
 * booked per GPU (sched_mem_per_gpu). */
static uint32_t mem_bound(const job_t *j, uint64_t mem, uint32_t slots) {
  uint64_t per = sched_mem_per_gpu(j);
  if (per == 0 || mem / per >= slots) return slots;
  return (uint32_t)(mem / per);
}

/* Moves key i of the max-heap k[0..n) down to its place. */
static void key_sift(uint64_t *k, uint32_t i, uint32_t n) {
  uint64_t x = k[i];
  for (uint32_t c; (c = 2 * i + 1) < n; i = c) {
    if (c + 1 < n && k[c + 1] > k[c]) c++;
    if (k[c] <= x) break;
    k[i] = k[c];
  }
  k[i] = x;
}

/* Sorts the n keys of s->gang_key ascending: (order << 32 | worker), so by order, then worker.
 * A heap sort, in place: decisions allocate nothing (qsort may). */
static void keys_sort(lt_sched_t *s, uint32_t n) {
  uint64_t *k = s->gang_key;
  for (uint32_t i = n / 2; i-- > 0;) key_sift(k, i, n);
  for (uint32_t m = n; m > 1; m--) {
    uint64_t t = k[0];
    k[0] = k[m - 1];
    k[m - 1] = t;
    key_sift(k, 0, m - 1);
  }
}
static uint32_t key_worker(uint64_t k) { return (uint32_t)k; }

/* The usable free slots of worker w for job jx, as sorted in gang_find's keys. */
static uint32_t usable(const lt_sched_t *s, uint32_t w, uint32_t jx) {
  const worker_t *wk = &s->workers[w];
  if (!wk->up || !sched_may_use(s, wk, jx)) return 0;
  return mem_bound(&s->jobs[jx], wk->mem_free, wk->free_slots);
}

bool sched_gang_find(lt_sched_t *s, uint32_t jx, placement_t *pl) {
  const job_t *j = &s->jobs[jx];
  uint32_t best_n = UINT32_MAX, best_left = UINT32_MAX;
  for (uint32_t g = 0; g < s->ngroups; g++) {
    const group_t *gr = &s->groups[g];
    if (gr->free_slots < j->gpus) continue;
    uint32_t n = 0, total = 0;
    for (uint32_t w = gr->head; w != NIL; w = s->workers[w].gnext) {
      uint32_t u = usable(s, w, jx);
      if (u == 0) continue;
      /* most usable slots first: whole free workers, so the fewest workers */
      s->gang_key[n++] = (uint64_t)(LT_SCHED_MAX_WORKER_SLOTS - u) << 32 | w;
      total += u;
    }
    if (total < j->gpus) continue;
    keys_sort(s, n);
    uint32_t k = 0, sum = 0;
    while (sum < j->gpus) sum += usable(s, key_worker(s->gang_key[k++]), jx);
    uint32_t left = gr->free_slots - j->gpus; /* the group's free slots after it */
    if (k > LT_SCHED_MAX_GANG_WORKERS || k > best_n || (k == best_n && left >= best_left))
      continue;
    /* the last part best fit: the worker with the fewest usable slots that still holds it */
    uint32_t need = j->gpus - (sum - usable(s, key_worker(s->gang_key[k - 1]), jx)), last = k - 1;
    for (uint32_t i = k; i < n && usable(s, key_worker(s->gang_key[i]), jx) >= need; i++) last = i;
    best_n = k;
    best_left = left;
    pl->n = k;
    for (uint32_t r = 0; r + 1 < k; r++) {
      pl->worker[r] = key_worker(s->gang_key[r]);
      pl->gpus[r] = usable(s, pl->worker[r], jx);
    }
    pl->worker[k - 1] = key_worker(s->gang_key[last]);
    pl->gpus[k - 1] = need;
  }
  return best_n != UINT32_MAX;
}

/* ---- reservation and preemption for a waiting gang --------------------------------------- */

/* The workers of one node group a gang would take once they are free (prod: once their
 * preemptible work stops as well): unreserved up workers, those with the most free slots first,
 * until their slots cover it; of the groups, the one needing the fewest workers, then the one
 * whose chosen workers have the most free slots. Writes them to pl (workers only) and returns
 * false when no group can hold it. */
static bool gang_target(lt_sched_t *s, uint32_t jx, bool prod, placement_t *pl) {
  const job_t *j = &s->jobs[jx];
  uint32_t best_n = UINT32_MAX, best_free = 0;
  for (uint32_t g = 0; g < s->ngroups; g++) {
    const group_t *gr = &s->groups[g];
    if (gr->slots < j->gpus) continue;
    uint32_t n = 0;
    for (uint32_t w = gr->head; w != NIL; w = s->workers[w].gnext) {
      const worker_t *wk = &s->workers[w];
      if (!wk->up || wk->cordoned || wk->reserved_job != NIL) continue;
      uint32_t f = prod ? wk->free_slots + wk->preempt_slots : wk->free_slots;
      s->gang_key[n++] = (uint64_t)(LT_SCHED_MAX_WORKER_SLOTS - f) << 32 | w;
    }
    keys_sort(s, n);
    uint32_t k = 0, sum = 0, free_sum = 0;
    for (; k < n && k < LT_SCHED_MAX_GANG_WORKERS && sum < j->gpus; k++) {
      const worker_t *wk = &s->workers[key_worker(s->gang_key[k])];
      uint32_t cap = prod ? mem_bound(j, wk->mem_free + wk->preempt_mem,
                                      wk->free_slots + wk->preempt_slots)
                          : mem_bound(j, wk->mem_total, wk->slots);
      sum += cap;
      free_sum += wk->free_slots;
    }
    if (sum < j->gpus || k > best_n || (k == best_n && free_sum <= best_free)) continue;
    best_n = k;
    best_free = free_sum;
    pl->n = k;
    for (uint32_t r = 0; r < k; r++) pl->worker[r] = key_worker(s->gang_key[r]);
  }
  return best_n != UINT32_MAX;
}

bool sched_gang_reserve(lt_sched_t *s, uint32_t jx, uint32_t room) {
  placement_t pl;
  if (!gang_target(s, jx, false, &pl) || pl.n > room) return false;
  for (uint32_t r = 0; r < pl.n; r++) sched_reserve(s, pl.worker[r], jx);
  return true;
}

/* For a production gang: reserves the workers where free slots and preemptible work cover it,
 * and on each asks preemptible jobs (newest first: least work lost) to stop until the worker's
 * share of the gang is free. A preempted multi-worker gang frees its other parts as well. */
size_t sched_gang_preempt(lt_sched_t *s, uint32_t jx, lt_sched_decision_t *out, size_t cap) {
  const job_t *j = &s->jobs[jx];
  placement_t pl;
  if (!gang_target(s, jx, true, &pl)) return 0;
  size_t n = 0;
  uint32_t need = j->gpus;
  for (uint32_t r = 0; r < pl.n; r++) {
    uint32_t w = pl.worker[r];
    worker_t *wk = &s->workers[w];
    sched_reserve(s, w, jx);
    uint32_t want = mem_bound(j, wk->mem_free + wk->preempt_mem, wk->free_slots + wk->preempt_slots);
    if (want > need) want = need;
    need -= want;
    uint32_t slots = wk->free_slots;
    for (uint32_t p = wk->run.head; p != NIL && slots < want; p = s->parts[p].run.next) {
      job_t *rj = &s->jobs[s->parts[p].job];
      if (rj->cls != LT_CLASS_PREEMPTIBLE || rj->preempting) continue;
      size_t k = sched_preempt(s, rj, out + n, cap - n);
      if (k == 0) return n; /* out of room: the retry asks the rest */
      n += k;
      slots += s->parts[p].gpus;
    }
  }
  return n;
}
