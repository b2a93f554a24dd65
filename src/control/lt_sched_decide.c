/* lt_sched_decide: the policy's decisions (lt_sched_decide()) — duration stops, strict priority
 * with aging, weighted fair share by DRF, best-fit placement with model affinity, and the
 * starvation pass that reserves workers for gangs and preempts preemptible work (lt_sched.h
 * states the policy; lt_sched_int.h the tables). */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>

#define STARVE_SCAN 16     /* oldest blocked jobs per class the starvation pass looks at */
#define STARVE_RETRY_S 1.0 /* before the starvation pass looks at the same job again */

/* Reserved workers drain, so they cost throughput: at most max_reservations at once. */
static uint32_t max_reserved(const lt_sched_t *s) {
  if (s->cfg.max_reservations) return s->cfg.max_reservations;
  return s->nup / 20 > 1 ? s->nup / 20 : 1;
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
  sched_book(s, jx, w, effective, now, d);
  return true;
}

static size_t check_deadlines(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  if (now < s->next_deadline) return 0;
  size_t n = 0;
  double next = INFINITY;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!s->workers[w].up) continue;
    for (uint32_t jx = s->workers[w].run.head; jx != NIL; jx = s->jobs[jx].run.next) {
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
    for (uint32_t r = wk->run.head; r != NIL && (slots < j->gpus || mem < j->mem);
         r = s->jobs[r].run.next) {
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
  sched_reserve(s, best, jx);
  size_t n = 0;
  uint32_t slots = wk->free_slots;
  uint64_t mem = wk->mem_free;
  for (uint32_t r = wk->run.head; r != NIL && (slots < j->gpus || mem < j->mem);
       r = s->jobs[r].run.next) {
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
  sched_reserve(s, best, jx);
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
    for (uint32_t jx = s->age[c].head; jx != NIL && looked < STARVE_SCAN; jx = s->jobs[jx].age.next) {
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
    if (try_dispatch(s, s->tenants[t].q[c].head, effective, now, d)) return true;
    sched_heap_remove(s, c, t);
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
  while (n < cap && s->age[0].head != NIL && s->slots_used < s->total_slots)
    if (!try_dispatch(s, s->age[0].head, s->jobs[s->age[0].head].cls, now, &out[n])) break;
    else n++;
  return n;
}

/* Starts one job of a lower class that aged into level e: the oldest first (AGE_JOBS), or the
 * class's fair order (AGE_CLASS). Returns true when one started. */
static bool pick_aged(lt_sched_t *s, int e, double now, lt_sched_decision_t *d, uint32_t *scanned,
                      bool *limited) {
  const lt_sched_config_t *cfg = &s->cfg;
  for (int c = e + 1; c < LT_CLASS__COUNT && c <= e + (int)cfg->aging_levels; c++) {
    int mode = aging_mode(s, e, c);
    if (mode == AGE_NONE) continue;
    double thr = cfg->aging_s * (c - e);
    if (mode == AGE_CLASS) {
      if (s->age[c].head != NIL && now - s->jobs[s->age[c].head].enq >= thr &&
          pick_fair(s, c, e, now, d, scanned, limited))
        return true;
      if (*limited) return false;
      continue;
    }
    while (s->cursor[c] != NIL && now - s->jobs[s->cursor[c]].enq >= thr) {
      uint32_t jx = s->cursor[c];
      s->cursor[c] = s->jobs[jx].age.next;
      if (try_dispatch(s, jx, e, now, d)) return true;
      if (++*scanned >= cfg->max_scan) {
        *limited = true;
        return false;
      }
    }
  }
  return false;
}

/* Puts the tenants set aside during this call back in their heaps, and resets the cursors. */
static void unblock_all(lt_sched_t *s) {
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    for (uint32_t i = 0; i < s->nblocked[c]; i++) {
      uint32_t t = s->blocked[c][i];
      s->tenants[t].blocked &= (uint8_t)~(1u << c);
      sched_tenant_refresh(s, t, c);
    }
    s->nblocked[c] = 0;
    s->cursor[c] = NIL;
  }
}

size_t lt_sched_decide(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = check_deadlines(s, now, out, cap);
  if (s->cfg.policy == LT_SCHED_POLICY_LAS) return n + sched_las_decide(s, now, out + n, cap - n);
  if (s->cfg.policy == LT_SCHED_POLICY_FIFO) {
    n += decide_fifo(s, now, out + n, cap - n);
    assert(sched_ok(s));
    return n;
  }

  uint32_t scanned = 0;
  bool limited = false;
  for (int c = 0; c < LT_CLASS__COUNT; c++) s->cursor[c] = s->age[c].head;
  /* one job per round, from the highest level that can start one */
  while (!limited) {
    if (n >= cap) {
      limited = true;
      break;
    }
    if (s->slots_used >= s->total_slots) break;
    bool placed = false;
    for (int e = 0; e < LT_CLASS__COUNT && !placed && !limited; e++) {
      /* jobs of lower classes that aged into e go first, then class e's own jobs, the tenant
       * with the lowest weighted dominant share first */
      if (s->cfg.aging_s > 0 && pick_aged(s, e, now, &out[n], &scanned, &limited)) placed = true;
      else if (!limited && pick_fair(s, e, e, now, &out[n], &scanned, &limited)) placed = true;
    }
    if (!placed) break;
    n++;
  }
  unblock_all(s);
  if (!limited && n < cap) n += starvation_pass(s, now, out + n, cap - n);
  assert(sched_ok(s));
  return n;
}
