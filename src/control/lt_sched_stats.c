/* lt_sched_stats: what operators see of the policy beyond its counters (lt_sched.h,
 * visibility) — GPU-seconds and cold loads per tenant and class, idle-but-reserved slot time
 * and fragmentation. Like the rest of lt_sched: pure, no clock (now comes in), no allocation.
 *
 * Reserved idle time is integrated here rather than sampled by the caller, so the scheduler
 * daemon and the simulator report the same figure for the same calls: every event and decide
 * call that takes now first adds (free slots on reserved workers) x (now - the last call), a
 * value that only changes inside those calls (kept as a running sum, reserved_free, so an event
 * costs O(1) here). */
#include "lt_sched_int.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* Free slots now on up workers reserved for a waiting job, counted (lt_sched_queue.c keeps the
 * same sum in reserved_free as slots and reservations change); *workers_out: how many such
 * workers. O(workers): for visibility and the invariant check only. */
static uint32_t held_free(const lt_sched_t *s, uint32_t *workers_out) {
  uint32_t held = 0, n = 0;
  if (s->nreserved > 0)
    for (uint32_t w = 0; w < s->nworkers; w++) {
      const worker_t *wk = &s->workers[w];
      if (!wk->up || wk->reserved_job == NIL) continue;
      held += wk->free_slots;
      n++;
    }
  if (workers_out) *workers_out = n;
  return held;
}

void sched_stats_advance(lt_sched_t *s, double now) {
  assert(!s->cfg.check_invariants || s->reserved_free == held_free(s, NULL));
  if (!(now > s->idle_at)) return;
  if (s->reserved_free) s->idle_reserved_s += s->reserved_free * (now - s->idle_at);
  s->idle_at = now; /* from -INFINITY at the first call, when nothing can be reserved yet */
}

void sched_stats_ran(lt_sched_t *s, uint32_t jx, double now) {
  const job_t *j = &s->jobs[jx];
  assert(j->state == JS_RUNNING);
  if (now > j->start) s->tenants[j->tenant].gpu_s_c[j->cls] += j->gpus * (now - j->start);
}

const double lt_sched_wait_bounds_s[LT_SCHED_WAIT_BUCKETS] = {
    1, 5, 15, 60, 300, 900, 1800, 3600, 3 * 3600, 12 * 3600, 86400, INFINITY};

void sched_stats_waited(lt_sched_t *s, uint32_t jx, double waited, uint32_t hb) {
  const job_t *j = &s->jobs[jx];
  tenant_t *t = &s->tenants[j->tenant];
  uint32_t b = 0;
  while (b < LT_SCHED_WAIT_BUCKETS - 1 && !(waited <= lt_sched_wait_bounds_s[b])) b++;
  t->wait_n_c[j->cls][b]++;
  t->wait_sum_c[j->cls] += waited > 0 ? waited : 0;
  t->hist_c[j->cls][hb]++;
}

/* Row t of lt_sched_tenants_usage() from tenant t's counters (the running jobs come after). */
static void usage_row(const tenant_t *tt, lt_sched_usage_t *u) {
  memset(u, 0, sizeof *u);
  u->tenant_id = tt->id;
  memcpy(u->gpu_seconds, tt->gpu_s_c, sizeof u->gpu_seconds);
  memcpy(u->cold_loads, tt->cold_c, sizeof u->cold_loads);
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    uint64_t n = 0;
    for (int b = 0; b < LT_SCHED_WAIT_BUCKETS; b++) u->wait_le[c][b] = n += tt->wait_n_c[c][b];
    u->waits[c] = n;
    u->wait_sum_s[c] = tt->wait_sum_c[c];
    u->wait_p50_s[c] = sched_hist_quantile(tt->hist_c[c], n, 0.5);
    u->wait_p99_s[c] = sched_hist_quantile(tt->hist_c[c], n, 0.99);
  }
}

size_t lt_sched_tenants_usage(const lt_sched_t *s, double now, lt_sched_usage_t *out,
                              size_t cap) {
  for (uint32_t t = 0; t < s->ntenants && t < cap; t++) usage_row(&s->tenants[t], &out[t]);
  for (uint32_t w = 0; w < s->nworkers; w++) {
    if (!s->workers[w].up) continue;
    for (uint32_t px = s->workers[w].run.head; px != NIL; px = s->parts[px].run.next) {
      const part_t *p = &s->parts[px];
      const job_t *j = &s->jobs[p->job];
      if (j->tenant < cap && now > j->start) out[j->tenant].gpu_seconds[j->cls] += p->gpus * (now - j->start);
    }
  }
  return s->ntenants;
}

uint32_t lt_sched_smallest_queued(const lt_sched_t *s) {
  if (s->queued == 0) return 0;
  for (uint32_t g = 1; g <= LT_SCHED_MAX_WORKER_SLOTS + 1; g++)
    if (s->queued_by_gpus[g]) return g;
  assert(!"queued jobs but no GPU count"); /* queued_by_gpus sums to queued */
  return 0;
}

uint32_t lt_sched_fragmented_slots(const lt_sched_t *s) {
  uint32_t g = lt_sched_smallest_queued(s), frag = 0;
  if (g <= 1) return 0; /* nothing waits, or every free slot fits a 1-GPU job */
  bool multi = g > s->max_slots; /* only a gang across workers waits: a group's free slots count */
  for (uint32_t w = 0; w < s->nworkers; w++) {
    const worker_t *wk = &s->workers[w];
    uint32_t room = multi ? s->groups[wk->group].free_slots : wk->free_slots;
    if (wk->up && wk->reserved_job == NIL && room < g) frag += wk->free_slots;
  }
  return frag;
}

double lt_sched_reserved_idle_slot_s(const lt_sched_t *s, double now) {
  double total = s->idle_reserved_s;
  if (now > s->idle_at && s->reserved_free) total += s->reserved_free * (now - s->idle_at);
  return total;
}

uint32_t lt_sched_reserved_idle_slots(const lt_sched_t *s, uint32_t *workers_out) {
  return held_free(s, workers_out);
}
