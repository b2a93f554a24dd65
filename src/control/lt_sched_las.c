/* lt_sched_las: least attained service, the second comparison peer of the policy
 * (LT_SCHED_POLICY_LAS, lt_sched.h), after Tiresias's discretized 2D-LAS: a job's attained
 * service is gpus x seconds run over all its attempts; jobs below las_threshold_gpu_s form the
 * first queue and go before the others, FIFO by (re)queue time within a queue; what does not fit
 * is skipped (no head-of-line blocking); best fit by free slots, no classes, fairness, quotas or
 * model affinity. A first-queue job that cannot start preempts second-queue jobs on one worker,
 * which is reserved for it meanwhile (as the Lathe policy's starvation pass reserves one).
 *
 * It shares the Lathe policy's tables (lt_sched_int.h): queued jobs sit on the per-class age
 * lists, merged here by enq; running ones on their workers' lists. */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>

#define LAS_WALK 8 /* queued jobs walked per decide call and level, in units of max_scan */

static double las_attained(const job_t *j, double now) {
  double a = j->attained;
  if (j->state == JS_RUNNING && now > j->start) a += j->gpus * (now - j->start);
  return a;
}

/* 0: the first queue (under the threshold), 1: the second. */
static int las_level(const lt_sched_t *s, const job_t *j, double now) {
  double thr = s->cfg.las_threshold_gpu_s;
  return thr > 0 && las_attained(j, now) >= thr ? 1 : 0;
}

/* Best fit: the up worker with the fewest free slots that still holds gpus slots and mem bytes,
 * not reserved for another job. */
static uint32_t las_find_worker(lt_sched_t *s, uint32_t jx) {
  const job_t *j = &s->jobs[jx];
  for (uint32_t k = j->gpus; k <= s->max_slots; k++) {
    const uint64_t *fb = free_bm(s, k);
    for (size_t wi = 0; wi < s->words; wi++)
      for (uint64_t bits = fb[wi]; bits; bits &= bits - 1) {
        uint32_t w = (uint32_t)(wi * 64 + (size_t)__builtin_ctzll(bits));
        const worker_t *wk = &s->workers[w];
        if (!sched_may_use(s, wk, jx)) continue;
        if (wk->mem_free < j->mem) continue;
        return w;
      }
  }
  return NIL;
}

/* The queued job with the smallest enq among the heads at[0..classes), advancing that head;
 * NIL when all are done. */
static uint32_t las_next(const lt_sched_t *s, uint32_t at[LT_CLASS__COUNT]) {
  int best = -1;
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    if (at[c] != NIL && (best < 0 || s->jobs[at[c]].enq < s->jobs[at[best]].enq)) best = c;
  if (best < 0) return NIL;
  uint32_t jx = at[best];
  at[best] = s->jobs[jx].age.next;
  return jx;
}

/* Preempts second-queue running jobs on the worker where the fewest must stop for first-queue
 * job jx, reserves it for jx, and writes the PREEMPT decisions. */
static size_t las_preempt(lt_sched_t *s, uint32_t jx, double now, lt_sched_decision_t *out,
                          size_t cap) {
  const job_t *j = &s->jobs[jx];
  uint32_t best = NIL, best_cost = UINT32_MAX;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    const worker_t *wk = &s->workers[w];
    if (!wk->up || wk->cordoned || wk->reserved_job != NIL || wk->slots < j->gpus) continue;
    uint32_t slots = wk->free_slots, cost = 0;
    for (uint32_t r = wk->run.head; r != NIL && slots < j->gpus; r = s->parts[r].run.next) {
      const job_t *rj = &s->jobs[s->parts[r].job];
      if (rj->preempting || las_level(s, rj, now) == 0) continue;
      slots += s->parts[r].gpus;
      cost++;
    }
    if (slots >= j->gpus && cost < best_cost) best = w, best_cost = cost;
  }
  if (best == NIL || best_cost > cap) return 0;
  worker_t *wk = &s->workers[best];
  sched_reserve(s, best, jx);
  size_t n = 0;
  uint32_t slots = wk->free_slots;
  for (uint32_t r = wk->run.head; r != NIL && slots < j->gpus; r = s->parts[r].run.next) {
    job_t *rj = &s->jobs[s->parts[r].job];
    if (rj->preempting || las_level(s, rj, now) == 0) continue;
    size_t k = sched_preempt(s, rj, out + n, cap - n);
    if (k == 0) break;
    n += k;
    slots += s->parts[r].gpus;
  }
  return n;
}

size_t sched_las_decide(lt_sched_t *s, double now, lt_sched_decision_t *out, size_t cap) {
  size_t n = 0;
  uint32_t blocked0 = NIL; /* the oldest first-queue job that could not start */
  for (int level = 0; level < 2 && n < cap; level++) {
    /* the smallest job that failed, per kind (0: one worker, 1: a multi-worker gang) */
    uint32_t at[LT_CLASS__COUNT], min_fail[2] = {UINT32_MAX, UINT32_MAX}, scanned = 0, walked = 0;
    for (int c = 0; c < LT_CLASS__COUNT; c++) at[c] = s->age[c].head;
    /* the walk is bounded too (LAS_WALK x max_scan jobs a level), so a long queue of jobs too
     * big for what is free costs a bounded time per call */
    for (uint32_t jx; n < cap && min_fail[0] > 1 && s->slots_used < s->total_slots &&
                      walked++ < LAS_WALK * s->cfg.max_scan && (jx = las_next(s, at)) != NIL;) {
      const job_t *j = &s->jobs[jx];
      if (las_level(s, j, now) != level) continue;
      /* resources only shrink within a call: a job as big as one that failed fails too */
      int multi = sched_multi(s, j);
      if (j->gpus >= min_fail[multi] && j->reserved == NIL) continue;
      if (multi) { /* the shared all-or-nothing placement on one node group */
        placement_t pl;
        if (sched_gang_find(s, jx, &pl) && pl.n <= cap - n) {
          sched_book(s, jx, &pl, j->cls, now, out + n);
          n += pl.n;
          continue;
        }
      } else {
        uint32_t w = las_find_worker(s, jx);
        if (w != NIL) {
          sched_book1(s, jx, w, j->cls, now, &out[n++]);
          continue;
        }
        /* a multi-worker gang does not preempt under LAS: the first blocked single-worker job
         * does */
        if (level == 0 && blocked0 == NIL) blocked0 = jx;
      }
      if (j->gpus < min_fail[multi]) min_fail[multi] = j->gpus;
      if (++scanned >= s->cfg.max_scan) break;
    }
    if (level == 0 && s->slots_used >= s->total_slots && blocked0 == NIL)
      for (uint32_t k = 0; k < LT_CLASS__COUNT && blocked0 == NIL; k++)
        for (uint32_t jx = s->age[k].head; jx != NIL; jx = s->jobs[jx].age.next)
          if (las_level(s, &s->jobs[jx], now) == 0 && !sched_multi(s, &s->jobs[jx])) {
            blocked0 = jx;
            break;
          }
  }
  uint32_t max_res = s->cfg.max_reservations ? s->cfg.max_reservations
                     : s->nup / 20 > 1     ? s->nup / 20
                                           : 1;
  if (s->cfg.las_preempt && s->cfg.las_threshold_gpu_s > 0 && blocked0 != NIL &&
      s->jobs[blocked0].reserved == NIL && s->nreserved < max_res && n < cap)
    n += las_preempt(s, blocked0, now, out + n, cap - n);
  assert(sched_ok(s));
  return n;
}

/* The earliest time after now at which a running job's attained service crosses the threshold
 * (it may then be preempted), while first-queue work waits; INFINITY otherwise. O(running). */
double sched_las_next_timer(const lt_sched_t *s, double now) {
  double thr = s->cfg.las_threshold_gpu_s, t = INFINITY;
  if (!s->cfg.las_preempt || thr <= 0 || s->queued == 0) return t;
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!s->workers[w].up) continue;
    for (uint32_t p = s->workers[w].run.head; p != NIL; p = s->parts[p].run.next) {
      if (s->parts[p].rank != 0) continue;
      const job_t *j = &s->jobs[s->parts[p].job];
      if (j->preempting || j->attained >= thr) continue;
      double at = j->start + (thr - j->attained) / j->gpus;
      if (at > now && at < t) t = at;
    }
  }
  return t;
}
