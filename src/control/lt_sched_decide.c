/* lt_sched_decide: the policy's decisions (lt_sched_decide()) — duration stops, strict priority
 * with aging, weighted fair share by DRF, best-fit placement with model affinity, and the
 * starvation pass that reserves workers for gangs and preempts preemptible work (lt_sched.h
 * states the policy; lt_sched_int.h the tables). */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>

#define STARVE_SCAN 16     /* oldest blocked jobs per class the starvation pass looks at */
#define STARVE_RETRY_S 1.0 /* before the starvation pass looks at the same job again */
#define FAIR_PERIOD_S 60.0    /* fair_advance integrates at most this often */
#define FAIR_QUANTUM_S 3600.0 /* preemptible: run time before fair share may preempt a job */

/* Reserved workers drain, so they cost throughput: at most max_reservations at once (production
 * is not bounded by it). The default, 1/8 of the workers, was 1/20: on an overloaded 16 x 8
 * fleet that left one reservation, and standard 8-GPU gangs waited longer than preemptible
 * ones, since 1-GPU and 4-GPU work kept filling every hole. */
static uint32_t max_reserved(const lt_sched_t *s) {
  if (s->cfg.max_reservations) return s->cfg.max_reservations;
  return s->nup / 8 > 1 ? s->nup / 8 : 1;
}

/* A worker reserved (draining) for a job holds its free slots for that job, and against every
 * job of the same or a lower class (sched_may_use); a job of a higher class may still use them,
 * since class order comes first (docs/DESIGN.md §4 invariant 9): a standard gang draining a
 * worker must not keep a production job off a slot it could use now. */

/* Best fit: among workers with enough free slots and memory, the fewest free slots; with
 * affinity, workers that hold the model first. A worker reserved for another job is skipped
 * unless that job is of a lower class. */
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
          if (!sched_may_use(s, wk, jx)) continue;
          if (wk->mem_free < j->mem) continue;
          return w;
        }
      }
    }
  }
  return NIL;
}

/* ---- the policy ------------------------------------------------------------------------- */

/* What try_dispatch did: started the job, held it back by policy (a quota, the production
 * reserve, no room left in the output for a gang's rows), or found no worker with room. */
enum { TRY_STARTED, TRY_HELD, TRY_NOFIT };

/* Tries to start queued job jx competing in class `effective`, writing its decisions (one a
 * worker part) into d, room rows at most; *nd says how many. A job that fits on one worker
 * goes on one (best fit); a larger one on workers of one node group (sched_gang_find), all or
 * nothing. */
static int try_dispatch(lt_sched_t *s, uint32_t jx, int effective, double now,
                        lt_sched_decision_t *d, size_t room, size_t *nd) {
  const job_t *j = &s->jobs[jx];
  const tenant_t *t = &s->tenants[j->tenant];
  if (s->cfg.policy == LT_SCHED_POLICY_LATHE) {
    if (t->max_running && t->running_slots + j->gpus > t->max_running) return TRY_HELD;
    if (j->cls == LT_CLASS_STANDARD && effective == LT_CLASS_STANDARD) {
      uint32_t reserve = (uint32_t)(s->cfg.production_reserve * s->total_slots);
      if (s->used_c[LT_CLASS_STANDARD] + j->gpus > s->total_slots - reserve) return TRY_HELD;
    }
  }
  if (sched_multi(s, j)) {
    placement_t pl;
    if (!sched_gang_find(s, jx, &pl)) return TRY_NOFIT;
    if (pl.n > room) return TRY_HELD;
    sched_book(s, jx, &pl, effective, now, d);
    *nd = pl.n;
    return TRY_STARTED;
  }
  uint32_t w = find_worker(s, jx, s->cfg.policy == LT_SCHED_POLICY_LATHE);
  if (w == NIL) return TRY_NOFIT;
  sched_book1(s, jx, w, effective, now, d);
  *nd = 1;
  return TRY_STARTED;
}

/* STOP decisions for running jobs past their tenant's max duration: one row a part, from the
 * part of rank 0 (a job's rows are never split: one that does not fit waits for the next call). */
static size_t check_deadlines(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  if (now < s->next_deadline) return 0;
  size_t n = 0;
  double next = INFINITY;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!s->workers[w].up) continue;
    for (uint32_t p = s->workers[w].run.head; p != NIL; p = s->parts[p].run.next) {
      if (s->parts[p].rank != 0) continue;
      job_t *j = &s->jobs[s->parts[p].job];
      const tenant_t *t = &s->tenants[j->tenant];
      if (j->stop_sent || t->max_duration <= 0) continue;
      double dl = j->start + t->max_duration;
      if (dl > now) {
        if (dl < next) next = dl;
        continue;
      }
      if (cap - n < j->world) {
        next = now;
        continue;
      }
      j->stop_sent = true;
      s->stops++;
      for (uint32_t q = j->part; q != NIL; q = s->parts[q].next)
        out[n++] = sched_part_decision(s, j, q, LT_SCHED_STOP);
    }
  }
  s->next_deadline = next;
  return n;
}

size_t sched_preempt(lt_sched_t *s, job_t *rj, lt_sched_decision_t *out, size_t cap) {
  if (cap < rj->world) return 0;
  rj->preempting = true;
  size_t n = 0;
  for (uint32_t p = rj->part; p != NIL; p = s->parts[p].next) {
    const part_t *pt = &s->parts[p];
    if (rj->cls == LT_CLASS_PREEMPTIBLE) { /* the tables count preemptible slots not yet asked */
      worker_t *wk = &s->workers[pt->worker];
      wk->preempt_slots -= pt->gpus;
      wk->preempt_mem -= pt->mem;
    }
    out[n++] = sched_part_decision(s, rj, p, LT_SCHED_PREEMPT);
  }
  s->preemptions++;
  return n;
}

/* Whether running job rj may be preempted for waiting job j: preemptible work for a higher class;
 * for a preemptible job (fair share within the class), only a job of a tenant that would still
 * hold more of the class against its weight (DRF key) than j's tenant once the slots moved, so
 * two tenants never take slots back and forth, and a move that only levels them is not made
 * (measured on the overloaded trace: the strict rule gave the class a better Jain's index than
 * levelling, 0.483 against 0.466, and fewer checkpoints lost to preemption). */
static bool victim_ok(const lt_sched_t *s, const job_t *j, const job_t *rj) {
  if (rj->cls != LT_CLASS_PREEMPTIBLE || rj->preempting) return false;
  if (j->cls != LT_CLASS_PREEMPTIBLE) return true;
  if (rj->tenant == j->tenant || !s->total_slots) return false;
  const tenant_t *tv = &s->tenants[rj->tenant], *tr = &s->tenants[j->tenant];
  if (s->now - rj->start >= FAIR_QUANTUM_S && tr->deficit_p > tv->deficit_p + FAIR_QUANTUM_S * j->gpus)
    return true;
  double moved = (double)rj->gpus / s->total_slots;
  double kv = sched_tenant_key(s, tv, LT_CLASS_PREEMPTIBLE) - moved / tv->weight;
  double kr = sched_tenant_key(s, tr, LT_CLASS_PREEMPTIBLE) + (double)j->gpus / s->total_slots / tr->weight;
  return kv > kr; /* the move back would then need kr - m > kv + m: never */
}

/* The preemptible class's fairness over time: each tenant's deficit (docs/DESIGN.md §6). The
 * class gets what production and standard leave, often a few slots for days, so an
 * instantaneous rule alone (two tenants with one job each never preempt each other) lets the
 * first tenant in keep its slots while later ones wait: their entitlement accrues and nothing
 * runs. Integrated at most every FAIR_PERIOD_S, each period with the share and the running
 * count of its start (a heuristic, not an account: a tenant alone in the class stays at 0, where
 * the running count of the period's end made a tenant that had just started jobs look
 * over-served); a tenant with no work in the class starts again from 0. */
static void fair_advance(lt_sched_t *s, double now) {
  const int c = LT_CLASS_PREEMPTIBLE;
  if (s->fair_at >= 0 && now - s->fair_at < FAIR_PERIOD_S) return;
  double dt = s->fair_at >= 0 ? now - s->fair_at : 0;
  size_t n = 0;
  for (uint32_t i = 0; i < s->nfair; i++) {
    uint32_t t = s->fair_t[i];
    tenant_t *tt = &s->tenants[t];
    tt->deficit_p += (tt->alloc_p - tt->run_p) * dt;
    double demand = (double)tt->queued_gpus_c[c] + tt->run_slots_c[c];
    if (demand <= 0) { /* off the list until it queues preemptible work again */
      tt->alloc_p = tt->deficit_p = tt->run_p = 0;
      tt->in_fair = false;
      s->fair_t[i--] = s->fair_t[--s->nfair];
      continue;
    }
    s->scratch_t[n] = t;
    s->scratch_d[n] = demand;
    s->scratch_w[n] = tt->weight;
    n++;
  }
  lt_sched_waterfill(n, s->scratch_d, s->scratch_w, s->used_c[c], s->scratch_a);
  for (size_t i = 0; i < n; i++) {
    tenant_t *tt = &s->tenants[s->scratch_t[i]];
    tt->alloc_p = s->scratch_a[i];
    tt->run_p = tt->run_slots_c[c];
  }
  s->fair_at = now;
}

/* Preemption for job jx: the unreserved worker where stopping the fewest jobs it may preempt
 * (victim_ok; newest first: least work lost) makes room; reserves it and emits PREEMPT
 * decisions. */
static size_t starve_preempt(lt_sched_t *s, uint32_t jx, lt_sched_decision_t *out, size_t cap) {
  job_t *j = &s->jobs[jx];
  uint32_t best = NIL, best_cost = UINT32_MAX;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    const worker_t *wk = &s->workers[w];
    if (!wk->up || wk->cordoned || wk->reserved_job != NIL || wk->slots < j->gpus) continue;
    if (wk->free_slots + wk->preempt_slots < j->gpus || wk->mem_free + wk->preempt_mem < j->mem)
      continue;
    /* run lists are newest first; count how many preemptible jobs must go */
    uint32_t slots = wk->free_slots, cost = 0;
    uint64_t mem = wk->mem_free;
    for (uint32_t r = wk->run.head; r != NIL && (slots < j->gpus || mem < j->mem);
         r = s->parts[r].run.next) {
      const job_t *rj = &s->jobs[s->parts[r].job];
      if (!victim_ok(s, j, rj)) continue;
      slots += s->parts[r].gpus;
      mem += s->parts[r].mem;
      cost++;
    }
    if ((slots >= j->gpus && mem >= j->mem) && cost < best_cost) best = w, best_cost = cost;
  }
  if (best == NIL || best_cost > cap) return 0;
  worker_t *wk = &s->workers[best];
  sched_reserve(s, best, jx);
  size_t n = 0;
  uint32_t slots = wk->free_slots;
  uint64_t mem = wk->mem_free;
  for (uint32_t r = wk->run.head; r != NIL && (slots < j->gpus || mem < j->mem);
       r = s->parts[r].run.next) {
    job_t *rj = &s->jobs[s->parts[r].job];
    if (!victim_ok(s, j, rj)) continue;
    size_t k = sched_preempt(s, rj, out + n, cap - n);
    if (k == 0) break; /* out of room: the retry asks the rest */
    n += k;
    slots += s->parts[r].gpus;
    mem += s->parts[r].mem;
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
    if (!wk->up || wk->cordoned || wk->reserved_job != NIL || wk->slots < j->gpus || wk->mem_total < j->mem)
      continue;
    if (best == NIL || wk->free_slots > s->workers[best].free_slots) best = w;
  }
  if (best == NIL) return;
  sched_reserve(s, best, jx);
}

/* Whether a preemption asked of a worker reserved for job jx is still in flight (a preempted
 * job has not stopped). */
static bool reservation_preempting(const lt_sched_t *s, uint32_t jx) {
  const job_t *j = &s->jobs[jx];
  for (uint32_t w = j->nres > 1 ? 0 : j->reserved; w < s->nworkers; w++) {
    if (s->workers[w].reserved_job != jx) continue;
    for (uint32_t r = s->workers[w].run.head; r != NIL; r = s->parts[r].run.next)
      if (s->jobs[s->parts[r].job].preempting) return true;
    if (j->nres <= 1) break;
  }
  return false;
}

/* Whether standard job j is held back by the production reserve: it may use the reserved part
 * once it has aged (docs/DESIGN.md §6). */
static bool reserve_holds(const lt_sched_t *s, const job_t *j, double waited) {
  const lt_sched_config_t *cfg = &s->cfg;
  if (cfg->aging_s > 0 && cfg->aging_levels > 0 && waited >= cfg->aging_s) return false;
  uint32_t reserve = (uint32_t)(cfg->production_reserve * s->total_slots);
  return s->used_c[LT_CLASS_STANDARD] + j->gpus > s->total_slots - reserve;
}

/* A standard job that starves while the reservations are all taken takes one back from the
 * preemptible class (one whose preemptions are not in flight): a lower class's reservation never
 * holds a higher class's job back (invariant 9). Whether one was (dry: could be) given up. */
static bool yield_reservation(lt_sched_t *s, bool dry) {
  for (uint32_t w = 0; w < s->nworkers; w++) {
    uint32_t rj = s->workers[w].reserved_job;
    if (rj == NIL || s->jobs[rj].cls != LT_CLASS_PREEMPTIBLE || reservation_preempting(s, rj)) continue;
    if (!dry) sched_unreserve(s, w);
    return true;
  }
  return false;
}

/* After dispatching what fits: the oldest waiting jobs that are still blocked get a reserved
 * worker, by preempting preemptible work (production, standard) or by draining (gangs). A
 * production gang does both at once — it needs a whole hole that 1-GPU work of lower classes
 * would otherwise keep filling, and under class order a slot freed there is its (invariant 9);
 * while nothing it can preempt makes room, it drains a worker, and retries preempting every
 * STARVE_RETRY_S. Other jobs preempt after preempt_after_s; other gangs reserve after
 * gang_reserve_after_s, within max_reservations. */
static size_t starvation_pass(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = 0;
  const lt_sched_config_t *cfg = &s->cfg;
  double first_bound[LT_CLASS__COUNT];
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    double b = cfg->gang_reserve_after_s >= 0 ? cfg->gang_reserve_after_s : INFINITY;
    if (cfg->preempt_after_s >= 0 && cfg->preempt_after_s < b) b = cfg->preempt_after_s;
    first_bound[c] = c == LT_CLASS_PRODUCTION ? 0 : b;
  }
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    bool prod = c == LT_CLASS_PRODUCTION;
    uint32_t looked = 0;
    for (uint32_t jx = s->age[c].head; jx != NIL && looked < STARVE_SCAN;
         jx = s->jobs[jx].age.next) {
      job_t *j = &s->jobs[jx];
      double waited = now - j->enq;
      if (waited < first_bound[c]) break; /* the list is oldest first: younger jobs follow */
      looked++;
      /* in the preemptible class only a tenant the class owes (deficit >= 0, to a GPU-second of
       * rounding) may drain or preempt, and a tenant that became over-served gives its
       * reservation up: an 8-GPU job of the class drains a worker that higher classes keep
       * refilling, so without this the reservations went to the oldest jobs, of the most
       * over-served tenants, and held for weeks (measured: all 12 on the 100-worker fleet, for
       * 26 days) while the tenants the class owed had none to act with */
      if (c == LT_CLASS_PREEMPTIBLE && s->tenants[j->tenant].deficit_p < -1.0) {
        if (j->reserved != NIL) sched_unreserve(s, j->reserved);
        continue;
      }
      /* preemptible work preempts within its class only for fair share (victim_ok), and a
       * multi-worker gang never does */
      bool may_preempt = cfg->preempt_after_s >= 0 && (waited >= cfg->preempt_after_s || (prod && j->gpus > 1)) &&
                         (c != LT_CLASS_PREEMPTIBLE || !sched_multi(s, j));
      bool may_reserve = j->gpus > 1 && (prod || (cfg->gang_reserve_after_s >= 0 &&
                                                  waited >= cfg->gang_reserve_after_s));
      if ((!may_preempt && !may_reserve) || now < j->starve_next) continue;
      if (j->reserved != NIL && !(prod && may_preempt && !reservation_preempting(s, jx)))
        continue;
      bool full = !prod && s->nreserved >= max_reserved(s);
      if (full && c != LT_CLASS_STANDARD) return n;
      const tenant_t *t = &s->tenants[j->tenant];
      if (t->max_running && t->running_slots + j->gpus > t->max_running) continue;
      if (c == LT_CLASS_STANDARD && reserve_holds(s, j, waited)) continue;
      bool multi = sched_multi(s, j);
      placement_t pl;
      /* it fits: the next decide starts it */
      if (multi ? sched_gang_find(s, jx, &pl) : find_worker(s, jx, false) != NIL) continue;
      /* a multi-worker gang's reservation is made against the budget, so one is given back first;
       * a job on one worker gives one back only once its preemption or drain took a worker (it
       * may find none) */
      if (full && !yield_reservation(s, !multi)) return n;
      j->starve_next = now + STARVE_RETRY_S;
      if (j->reserved != NIL && may_preempt) sched_unreserve(s, j->reserved);
      uint32_t held = s->nreserved;
      if (multi) { /* a multi-worker gang: the workers of one group, bounded in number */
        uint32_t room = prod ? UINT32_MAX : max_reserved(s) - s->nreserved;
        if (j->reserved == NIL && may_preempt) n += sched_gang_preempt(s, jx, out + n, cap - n);
        if (j->reserved == NIL && may_reserve) sched_gang_reserve(s, jx, room);
      } else {
        if (j->reserved == NIL && may_preempt) n += starve_preempt(s, jx, out + n, cap - n);
        if (j->reserved == NIL && may_reserve) starve_reserve(s, jx);
        if (full && s->nreserved > held) yield_reservation(s, false);
      }
      if (n == cap) return n;
    }
  }
  return n;
}

/* One decide call's scan state. Resources only shrink during a call, so a job of class c that
 * found no worker proves that no job of class c or lower (which may use fewer reserved
 * workers) needing at least its GPUs and memory, and bounded no tighter (backfill), finds one
 * either (nofit_*), unless a worker is reserved for it. */
typedef struct scan {
  uint32_t scanned; /* candidates tried; at cfg.max_scan the call stops (limited) */
  uint32_t walked;  /* queued jobs passed over; at 64 * max_scan the call stops too */
  bool limited;
  /* per kind (0: one worker, 1: a multi-worker gang, which a full worker does not stop) and
   * class, the smallest shape known not to fit */
  uint32_t nofit_gpus[2][LT_CLASS__COUNT];
  uint64_t nofit_mem[2][LT_CLASS__COUNT];
  double nofit_bound[2][LT_CLASS__COUNT]; /* INFINITY: no bound */
} scan_t;

static double scan_bound(const lt_sched_t *s, const job_t *j) {
  double b = sched_job_bound(s, j);
  return b > 0 ? b : INFINITY;
}

static bool scan_nofit(const lt_sched_t *s, const scan_t *sc, const job_t *j) {
  int m = sched_multi(s, j);
  return j->reserved == NIL && j->gpus >= sc->nofit_gpus[m][j->cls] &&
         j->mem >= sc->nofit_mem[m][j->cls] && scan_bound(s, j) >= sc->nofit_bound[m][j->cls];
}

static void scan_note_nofit(const lt_sched_t *s, scan_t *sc, const job_t *j) {
  if (j->reserved != NIL) return;
  int m = sched_multi(s, j);
  double b = scan_bound(s, j);
  for (int k = j->cls; k < LT_CLASS__COUNT; k++)
    if (j->gpus <= sc->nofit_gpus[m][k] && j->mem <= sc->nofit_mem[m][k] && b <= sc->nofit_bound[m][k]) {
      sc->nofit_gpus[m][k] = j->gpus;
      sc->nofit_mem[m][k] = j->mem;
      sc->nofit_bound[m][k] = b;
    }
}

/* Tries tenant t's queued jobs of class c in FIFO order, competing at level `effective`: the
 * head first, then, when it cannot start (a gang too big for any free hole, a quota), the jobs
 * behind it, so that a blocked gang never keeps its own tenant's smaller jobs of the class off
 * a slot that lower classes would then take. Returns the decisions written (0: none started). */
static size_t try_tenant(lt_sched_t *s, uint32_t t, int c, int effective, double now,
                         lt_sched_decision_t *d, size_t room, scan_t *sc) {
  uint32_t held = UINT32_MAX; /* a quota or the reserve holds back jobs of this many GPUs */
  for (uint32_t jx = s->tenants[t].q[c].head; jx != NIL; jx = s->jobs[jx].tq.next) {
    const job_t *j = &s->jobs[jx];
    if (++sc->walked >= 64 * s->cfg.max_scan) break;
    if (j->gpus >= held || scan_nofit(s, sc, j)) continue;
    size_t nd = 0;
    int r = try_dispatch(s, jx, effective, now, d, room, &nd);
    if (r == TRY_STARTED) return nd;
    if (r == TRY_NOFIT) scan_note_nofit(s, sc, j);
    if (r == TRY_HELD) held = j->gpus;
    if (++sc->scanned >= s->cfg.max_scan) break;
  }
  sc->limited = sc->scanned >= s->cfg.max_scan || sc->walked >= 64 * s->cfg.max_scan;
  return 0;
}

/* Starts a job of the tenant with the lowest weighted dominant share in class c's heap,
 * competing at level `effective`; tenants that cannot start are set aside for the rest of the
 * call. Returns the decisions written (0: none started). */
static size_t pick_fair(lt_sched_t *s, int c, int effective, double now, lt_sched_decision_t *d,
                        size_t room, scan_t *sc) {
  while (s->heap_n[c] > 0 && !sc->limited) {
    uint32_t t = s->heap[c][0];
    size_t nd = try_tenant(s, t, c, effective, now, d, room, sc);
    if (nd) return nd;
    sched_heap_remove(s, c, t);
    s->tenants[t].blocked |= (uint8_t)(1u << c);
    s->blocked[c][s->nblocked[c]++] = t;
  }
  return 0;
}

static size_t decide_fifo(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = 0, nd = 0;
  while (n < cap && s->age[0].head != NIL && s->slots_used < s->total_slots &&
         try_dispatch(s, s->age[0].head, s->jobs[s->age[0].head].cls, now, out + n, cap - n,
                      &nd) == TRY_STARTED)
    n += nd;
  return n;
}

/* Aging, bounded by class order (docs/DESIGN.md §6): it never puts a job ahead of a waiting
 * job of a higher class. What it lifts is the production reserve: called once no production
 * job can start in this round (none waits, or none fits a free slot; a worker draining for a
 * production gang stays held), standard work that has waited aging_s may use the slots
 * reserved for production, in the class's own fair order, competing as production. Before
 * this bound, every standard job that had waited aging_s competed ahead of production's own
 * jobs, oldest first; in overload every standard job ages, so aged standard work took nearly
 * every slot before fresh production work (production waited ~9x longer than standard on an
 * overloaded trace). */
static size_t pick_aged_reserve(lt_sched_t *s, double now, lt_sched_decision_t *d, size_t room,
                                scan_t *sc) {
  const lt_sched_config_t *cfg = &s->cfg;
  if (cfg->aging_s <= 0 || cfg->aging_levels == 0) return 0;
  uint32_t reserve = (uint32_t)(cfg->production_reserve * s->total_slots);
  if (reserve == 0 || s->used_c[LT_CLASS_STANDARD] + 1 <= s->total_slots - reserve) return 0;
  uint32_t oldest = s->age[LT_CLASS_STANDARD].head;
  if (oldest == NIL || now - s->jobs[oldest].enq < cfg->aging_s) return 0;
  return pick_fair(s, LT_CLASS_STANDARD, LT_CLASS_PRODUCTION, now, d, room, sc);
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
  sched_stats_advance(s, now);
  s->now = now;
  if (s->cfg.policy == LT_SCHED_POLICY_LATHE) fair_advance(s, now);
  size_t n = check_deadlines(s, now, out, cap);
  if (s->cfg.policy == LT_SCHED_POLICY_LAS) return n + sched_las_decide(s, now, out + n, cap - n);
  if (s->cfg.policy == LT_SCHED_POLICY_FIFO) {
    n += decide_fifo(s, now, out + n, cap - n);
    assert(sched_ok(s));
    return n;
  }

  scan_t sc = {.scanned = 0};
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    for (int m = 0; m < 2; m++) {
      sc.nofit_gpus[m][c] = UINT32_MAX;
      sc.nofit_mem[m][c] = UINT64_MAX;
      sc.nofit_bound[m][c] = INFINITY;
    }
    s->cursor[c] = NIL;
  }
  /* one job per round, from the highest class that can start one */
  while (n < cap && !sc.limited && s->slots_used < s->total_slots) {
    size_t placed = 0;
    for (int e = 0; e < LT_CLASS__COUNT && !placed && !sc.limited; e++) {
      /* class e's own jobs, the tenant with the lowest weighted dominant share first; only
       * when none can start does a lower class get the round (class order, invariant 9) */
      placed = pick_fair(s, e, e, now, &out[n], cap - n, &sc);
      if (!placed && e == LT_CLASS_PRODUCTION && !sc.limited)
        placed = pick_aged_reserve(s, now, &out[n], cap - n, &sc);
    }
    if (!placed) break;
    n += placed;
  }
  unblock_all(s);
  /* the starvation pass runs even when the scan bound stopped the call: it is what preempts
   * for production, and its own cost is bounded (STARVE_SCAN) */
  if (n < cap) n += starvation_pass(s, now, out + n, cap - n);
  assert(sched_ok(s));
  return n;
}
