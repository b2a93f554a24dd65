/* lt_sched_sim: the scheduling simulator behind `lathe sim` — the policy of lt_sched.c driven
 * with virtual time over a CSV trace, so Lathe's policy and FIFO are compared on the same
 * workload. Pure: the caller reads the file and prints the result.
 *
 * Model: a fleet of identical workers in node groups of workers_per_group; a job runs for its
 * trace duration plus the cold-load time when its worker (any worker of a multi-worker gang)
 * did not hold its base model; a job larger than a node group is refused at arrival; a PREEMPT decision stops the job
 * checkpoint_s later, keeping the work done until then; a STOP ends it at once. Fairness is
 * integrated over time: at every instant each class's held slots are split by weighted
 * max-min fair share of the demand (queued GPUs + running slots) into an entitlement. */
#include "lt_sched.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 63

typedef struct trace_row {
  double arrival, duration;
  uint32_t tenant, model, gpus, line;
  lt_job_class_t cls;
} trace_row_t;

struct lt_sched_trace {
  trace_row_t *rows;
  size_t n, cap;
  char (*tenants)[NAME_MAX_LEN + 1];
  size_t ntenants, tcap;
  char (*models)[NAME_MAX_LEN + 1];
  size_t nmodels, mcap;
  char *buf; /* the line being parsed */
  size_t bcap;
  uint32_t lineno;
  bool header;      /* the next non-blank line is the header */
  bool unsorted_ok; /* lt_sched_trace_parse: sort at the end instead of refusing */
};

static const char *const trace_cols[6] = {"arrival_s", "tenant", "class",
                                          "gpus", "duration_s", "base_model"};

static lt_err_t intern_name(char (**tab)[NAME_MAX_LEN + 1], size_t *n, size_t *cap,
                            const char *name, uint32_t *id) {
  for (size_t i = 0; i < *n; i++)
    if (strcmp((*tab)[i], name) == 0) {
      *id = (uint32_t)i;
      return LT_OK;
    }
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    void *p = realloc(*tab, nc * sizeof **tab);
    if (!p) return LT_ERR_NOMEM;
    *tab = p;
    *cap = nc;
  }
  snprintf((*tab)[*n], NAME_MAX_LEN + 1, "%s", name);
  *id = (uint32_t)(*n)++;
  return LT_OK;
}

static char *trim(char *s) {
  while (isspace((unsigned char)*s)) s++;
  char *e = s + strlen(s);
  while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
  return s;
}

static bool parse_double(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end || errno || !isfinite(v)) return false;
  *out = v;
  return true;
}

static lt_err_t parse_line(lt_sched_trace_t *t, char *line, uint32_t lineno, bool header,
                           char *errstr, size_t errstr_size) {
  char *f[6];
  int nf = 0;
  for (char *p = line;; nf++) {
    char *comma = strchr(p, ',');
    if (nf < 6) f[nf] = p;
    if (!comma) {
      nf++;
      break;
    }
    *comma = 0;
    p = comma + 1;
  }
  if (nf != 6)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "trace line %u: %d columns, expected 6 "
                   "(arrival_s,tenant,class,gpus,duration_s,base_model)",
                   lineno, nf);
  for (int i = 0; i < 6; i++) f[i] = trim(f[i]);
  if (header) {
    double d;
    if (parse_double(f[0], &d))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "trace line %u: expected the header line "
                     "arrival_s,tenant,class,gpus,duration_s,base_model, got data",
                     lineno);
    return LT_OK;
  }
#define COLERR(c, ...)                                                                         \
  lt_errf(errstr, errstr_size, LT_ERR_INVALID, "trace line %u, column %d (%s): " __VA_ARGS__)
  trace_row_t r = {.line = lineno};
  if (!parse_double(f[0], &r.arrival) || r.arrival < 0)
    return COLERR(1, "\"%s\" is not a time in seconds >= 0", lineno, 1, trace_cols[0], f[0]);
  if (!*f[1] || strlen(f[1]) > NAME_MAX_LEN)
    return COLERR(2, "tenant must be 1..%d characters", lineno, 2, trace_cols[1], NAME_MAX_LEN);
  if (lt_job_class_parse(f[2], &r.cls) != LT_OK)
    return COLERR(3, "\"%s\" is not production, standard or preemptible", lineno, 3,
                  trace_cols[2], f[2]);
  double g;
  if (!parse_double(f[3], &g) || g != floor(g) || g < 1 || g > LT_SCHED_MAX_JOB_GPUS)
    return COLERR(4, "\"%s\" is not a GPU count within 1..%d", lineno, 4, trace_cols[3], f[3],
                  LT_SCHED_MAX_JOB_GPUS);
  r.gpus = (uint32_t)g;
  if (!parse_double(f[4], &r.duration) || r.duration <= 0)
    return COLERR(5, "\"%s\" is not a duration in seconds > 0", lineno, 5, trace_cols[4], f[4]);
  if (!*f[5] || strlen(f[5]) > NAME_MAX_LEN)
    return COLERR(6, "base model must be 1..%d characters", lineno, 6, trace_cols[5],
                  NAME_MAX_LEN);
#undef COLERR
  if (intern_name(&t->tenants, &t->ntenants, &t->tcap, f[1], &r.tenant) ||
      intern_name(&t->models, &t->nmodels, &t->mcap, f[5], &r.model))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "trace: out of memory");
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 256;
    void *p = realloc(t->rows, nc * sizeof *t->rows);
    if (!p) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "trace: out of memory");
    t->rows = p;
    t->cap = nc;
  }
  t->rows[t->n++] = r;
  return LT_OK;
}

static int row_cmp(const void *a, const void *b) {
  const trace_row_t *x = a, *y = b;
  if (x->arrival != y->arrival) return x->arrival < y->arrival ? -1 : 1;
  return x->line < y->line ? -1 : x->line > y->line;
}

void lt_sched_trace_destroy(lt_sched_trace_t *t) {
  if (!t) return;
  free(t->rows);
  free(t->tenants);
  free(t->models);
  free(t->buf);
  free(t);
}

lt_err_t lt_sched_trace_new(lt_sched_trace_t **out, char *errstr, size_t errstr_size) {
  *out = calloc(1, sizeof **out);
  if (!*out) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "trace: out of memory");
  (*out)->header = true;
  return LT_OK;
}

lt_err_t lt_sched_trace_add_line(lt_sched_trace_t *t, const char *text, size_t len,
                                 char *errstr, size_t errstr_size) {
  uint32_t lineno = ++t->lineno;
  if (len && text[len - 1] == '\n') len--;
  if (len + 1 > t->bcap) {
    char *nb = realloc(t->buf, len + 64);
    if (!nb) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "trace: out of memory");
    t->buf = nb;
    t->bcap = len + 64;
  }
  if (memchr(text, 0, len))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "trace line %u: contains a NUL byte",
                   lineno);
  memcpy(t->buf, text, len);
  t->buf[len] = 0;
  char *s = trim(t->buf);
  if (!*s || *s == '#') return LT_OK;
  lt_err_t err = parse_line(t, s, lineno, t->header, errstr, errstr_size);
  if (err || t->header) {
    t->header = false;
    return err;
  }
  const trace_row_t *r = &t->rows[t->n - 1];
  if (!t->unsorted_ok && t->n > 1 && r->arrival < t->rows[t->n - 2].arrival)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "trace line %u, column 1 (arrival_s): %g is before line %u's %g: a trace "
                   "must be sorted by arrival time (sort -t, -k1,1g, keeping the header first)",
                   lineno, r->arrival, t->rows[t->n - 2].line, t->rows[t->n - 2].arrival);
  return LT_OK;
}

lt_err_t lt_sched_trace_finish(lt_sched_trace_t *t, char *errstr, size_t errstr_size) {
  if (t->n == 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "trace: no job lines after the header");
  if (t->unsorted_ok) qsort(t->rows, t->n, sizeof *t->rows, row_cmp);
  free(t->buf);
  t->buf = NULL;
  t->bcap = 0;
  return LT_OK;
}

lt_err_t lt_sched_trace_parse(const char *text, size_t len, lt_sched_trace_t **out,
                              char *errstr, size_t errstr_size) {
  lt_sched_trace_t *t;
  lt_err_t err = lt_sched_trace_new(&t, errstr, errstr_size);
  if (err) return err;
  t->unsorted_ok = true;
  for (size_t pos = 0; !err && pos < len;) {
    const char *nl = memchr(text + pos, '\n', len - pos);
    size_t end = nl ? (size_t)(nl - text) : len;
    err = lt_sched_trace_add_line(t, text + pos, end - pos, errstr, errstr_size);
    pos = end + 1;
  }
  if (!err) err = lt_sched_trace_finish(t, errstr, errstr_size);
  if (err) {
    lt_sched_trace_destroy(t);
    t = NULL;
  }
  *out = t;
  return err;
}

size_t lt_sched_trace_jobs(const lt_sched_trace_t *t) { return t->n; }
size_t lt_sched_trace_tenants(const lt_sched_trace_t *t) { return t->ntenants; }
const char *lt_sched_trace_tenant_name(const lt_sched_trace_t *t, size_t i) {
  return i < t->ntenants ? t->tenants[i] : NULL;
}

/* ---- the simulation --------------------------------------------------------------------- */

void lt_sched_sim_config_default(lt_sched_sim_config_t *c) {
  memset(c, 0, sizeof *c);
  lt_sched_config_default(&c->sched);
  c->workers = 16;
  c->slots_per_worker = 8;
  c->mem_per_slot = 80ULL << 30;
  c->models_per_worker = 2;
  c->cold_load_s = 60;
  c->checkpoint_s = 30;
  c->tick_s = 0;
  c->limit_factor = 0;
}

enum { EV_COMPLETE = 0, EV_PREEMPT_STOP = 1 };

typedef struct sim_ev {
  double t;
  uint64_t seq;
  uint32_t job, gen, kind;
} sim_ev_t;

typedef struct sim_job {
  double remaining; /* seconds of work left */
  double run_from;  /* when the current attempt started useful work */
  double first_dispatch;
  uint32_t gen;
  bool running, preempting, done;
  bool multi; /* its current attempt runs on several workers */
} sim_job_t;

typedef struct evheap {
  sim_ev_t *a;
  size_t n, cap;
  uint64_t seq;
} evheap_t;

static bool ev_less(const sim_ev_t *x, const sim_ev_t *y) {
  return x->t != y->t ? x->t < y->t : x->seq < y->seq;
}

static lt_err_t ev_push(evheap_t *h, double t, uint32_t kind, uint32_t job, uint32_t gen) {
  if (h->n == h->cap) {
    size_t nc = h->cap ? h->cap * 2 : 1024;
    void *p = realloc(h->a, nc * sizeof *h->a);
    if (!p) return LT_ERR_NOMEM;
    h->a = p;
    h->cap = nc;
  }
  sim_ev_t e = {t, h->seq++, job, gen, kind};
  size_t i = h->n++;
  while (i > 0 && ev_less(&e, &h->a[(i - 1) / 2])) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = e;
  return LT_OK;
}

static sim_ev_t ev_pop(evheap_t *h) {
  sim_ev_t top = h->a[0], last = h->a[--h->n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, b = i;
    const sim_ev_t *bv = &last;
    if (l < h->n && ev_less(&h->a[l], bv)) b = l, bv = &h->a[l];
    if (l + 1 < h->n && ev_less(&h->a[l + 1], bv)) b = l + 1, bv = &h->a[l + 1];
    if (b == i) break;
    h->a[i] = h->a[b];
    i = b;
  }
  if (h->n) h->a[i] = last;
  return top;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double quantile_sorted(const double *v, size_t n, double q) {
  if (n == 0) return 0;
  size_t i = (size_t)ceil(q * (double)n);
  if (i == 0) i = 1;
  return v[i - 1];
}

void lt_sched_sim_result_free(lt_sched_sim_result_t *r) {
  if (!r) return;
  free(r->rows);
  r->rows = NULL;
  r->n_rows = 0;
}

/* One run's state: the trace, the policy under test, the jobs' progress, the event heap and what
 * the run integrates over time (slot-seconds each (tenant, class) held, and its entitlement). */
typedef struct sim {
  const lt_sched_trace_t *tr;
  const lt_sched_sim_config_t *cfg;
  lt_sched_t *s;
  sim_job_t *jobs;        /* per trace row; one block with the tables below (sim_open) */
  double *waits;          /* per trace row: scratch for quantiles */
  double *got, *ent;      /* per (tenant, class): slot-seconds held, entitled slot-seconds */
  uint32_t *njobs;        /* per (tenant, class): jobs in the trace */
  double *weights;        /* per tenant */
  /* The fairness integrals, kept by the simulator from what it applies (the policy's own
   * lt_sched_tenants_stats() costs O(all tenants) a call): per (tenant, class) k, slots running
   * and GPUs queued; got[k] is integrated lazily (since last[k]), and ent[k] holds the integral
   * of (entitlement - running), added only while the class has queued work (otherwise each
   * tenant's entitlement is what it runs). act[c]: the tenants with demand in class c. */
  double *run, *qd, *last;
  uint32_t *act[LT_CLASS__COUNT], nact[LT_CLASS__COUNT];
  uint8_t *in_act;
  double *sd, *sw;       /* per tenant: waterfill scratch */
  /* Per class, the last water-filling (alloc[c][i] for tenant act[c][i], i < nalloc[c]) holds
   * until a change in the class (dirty); the seconds it held since its last flush are pend[c]. */
  double *alloc[LT_CLASS__COUNT], pend[LT_CLASS__COUNT];
  uint32_t nalloc[LT_CLASS__COUNT];
  bool dirty[LT_CLASS__COUNT];
  void *fair_block;
  evheap_t ev;
  size_t nt, nrow_slots;  /* tenants; tenants * classes */
  size_t next_arrival, completed;
  double now, last_decide, busy, t_end;
  double frag;            /* fragmented slots integrated over time (slot-seconds) */
  double retry_at;        /* the starvation pass's next look, armed by a change */
  bool changed;           /* an event, an arrival or a decision at now */
  uint64_t gangs, decides, refused;
  uint64_t multi_started, multi_finished;
  uint32_t group_slots;   /* GPUs of the largest node group: larger jobs are refused */
  uint32_t refused_line, refused_gpus;
  char *errstr;
  size_t errstr_size;
} sim_t;

/* Refuses a fleet that cannot run anything. */
static lt_err_t sim_check(const lt_sched_sim_config_t *cfg, char *errstr, size_t errstr_size) {
  if (cfg->workers == 0 || cfg->slots_per_worker == 0 || cfg->workers_per_group > cfg->workers ||
      cfg->slots_per_worker > LT_SCHED_MAX_WORKER_SLOTS || !(cfg->tick_s >= 0))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "sim: need workers >= 1, slots per worker within 1..%d, workers per group "
                   "within 0..workers and tick >= 0",
                   LT_SCHED_MAX_WORKER_SLOTS);
  return LT_OK;
}

/* Allocates the run's tables and sets up the policy: the trace's models and tenants (weights
 * and quotas by name from the config), and the fleet. */
static lt_err_t sim_open(sim_t *m) {
  const lt_sched_trace_t *tr = m->tr;
  const lt_sched_sim_config_t *cfg = m->cfg;
  lt_sched_config_t sc = cfg->sched;
  sc.max_tenants = (uint32_t)tr->ntenants;
  sc.max_workers = cfg->workers;
  sc.max_jobs = (uint32_t)tr->n;
  sc.max_models = (uint32_t)tr->nmodels;
  size_t nt = m->nt = tr->ntenants;
  m->nrow_slots = nt * LT_CLASS__COUNT;
  /* One block holds the tables, widest elements first; sim_close frees it as m->jobs. */
  size_t nts = nt ? nt : 1;
  m->jobs = calloc(1, tr->n * sizeof *m->jobs + (tr->n + 2 * m->nrow_slots + nts) * sizeof(double) +
                          m->nrow_slots * sizeof *m->njobs);
  m->fair_block = calloc(1, (3 * m->nrow_slots + 2 * nts + m->nrow_slots) * sizeof(double) +
                                m->nrow_slots * (sizeof(uint32_t) + 1));
  if (!m->fair_block) return lt_errf(m->errstr, m->errstr_size, LT_ERR_NOMEM, "sim: out of memory");
  m->run = m->fair_block;
  m->qd = m->run + m->nrow_slots;
  m->last = m->qd + m->nrow_slots;
  m->sd = m->last + m->nrow_slots;
  m->sw = m->sd + nts;
  for (int c = 0; c < LT_CLASS__COUNT; c++) m->alloc[c] = m->sw + nts + (size_t)c * nts;
  for (int c = 0; c < LT_CLASS__COUNT; c++)
    m->act[c] = (uint32_t *)(m->alloc[0] + m->nrow_slots) + (size_t)c * nts;
  m->in_act = (uint8_t *)(m->act[0] + m->nrow_slots);
  if (!m->jobs) return lt_errf(m->errstr, m->errstr_size, LT_ERR_NOMEM, "sim: out of memory");
  m->waits = (double *)(m->jobs + tr->n);
  m->got = m->waits + tr->n;
  m->ent = m->got + m->nrow_slots;
  m->weights = m->ent + m->nrow_slots;
  m->njobs = (uint32_t *)(m->weights + nts);
  lt_err_t err = lt_sched_new(&sc, &m->s, m->errstr, m->errstr_size);
  for (size_t k = 0; !err && k < tr->nmodels; k++) {
    uint32_t id;
    err = lt_sched_model_intern(m->s, tr->models[k], &id, m->errstr, m->errstr_size);
  }
  for (size_t i = 0; !err && i < nt; i++) {
    lt_sched_tenant_t ten = {.id = i + 1, .weight = 1};
    for (size_t k = 0; k < cfg->n_tenants; k++)
      if (strcmp(cfg->tenants[k].name, tr->tenants[i]) == 0) {
        ten.weight = cfg->tenants[k].weight;
        ten.max_running_slots = cfg->tenants[k].max_running_slots;
        ten.max_duration_s = cfg->tenants[k].max_duration_s;
      }
    m->weights[i] = ten.weight;
    err = lt_sched_tenant_upsert(m->s, &ten, m->errstr, m->errstr_size);
  }
  for (uint32_t w = 0; !err && w < cfg->workers; w++) {
    lt_sched_worker_t wk = {.id = w + 1,
                            .slots = cfg->slots_per_worker,
                            .mem_bytes = cfg->slots_per_worker * cfg->mem_per_slot,
                            .model_cache = cfg->models_per_worker,
                            .node_group = cfg->workers_per_group ? w / cfg->workers_per_group : 0};
    err = lt_sched_worker_up(m->s, &wk, m->errstr, m->errstr_size);
  }
  uint32_t group = cfg->workers_per_group ? cfg->workers_per_group : cfg->workers;
  if (group > LT_SCHED_MAX_GANG_WORKERS) group = LT_SCHED_MAX_GANG_WORKERS;
  m->group_slots = group * cfg->slots_per_worker;
  for (size_t i = 0; i < tr->n; i++) {
    m->jobs[i].remaining = tr->rows[i].duration;
    m->jobs[i].first_dispatch = -1;
  }
  return err;
}

static void sim_close(sim_t *m) {
  lt_sched_destroy(m->s);
  free(m->jobs); /* and the tables carved from it */
  free(m->fair_block);
  free(m->ev.a);
}

/* Adds to class c's entitlement integrals the seconds its last water-filling held. */
static void sim_fair_flush(sim_t *m, int c) {
  if (m->pend[c] <= 0) return;
  for (uint32_t i = 0; i < m->nalloc[c]; i++) {
    size_t k = (size_t)m->act[c][i] * LT_CLASS__COUNT + c;
    m->ent[k] += (m->alloc[c][i] - m->run[k]) * m->pend[c];
  }
  m->pend[c] = 0;
}

/* Row ji's (tenant, class) runs dr more slots and queues dq more GPUs from now on. */
static void sim_fair(sim_t *m, uint32_t ji, double dr, double dq) {
  const trace_row_t *r = &m->tr->rows[ji];
  size_t k = (size_t)r->tenant * LT_CLASS__COUNT + r->cls;
  sim_fair_flush(m, r->cls);
  m->dirty[r->cls] = true;
  m->got[k] += m->run[k] * (m->now - m->last[k]);
  m->last[k] = m->now;
  m->run[k] += dr;
  m->qd[k] += dq;
  if (!m->in_act[k] && m->run[k] + m->qd[k] > 0) {
    m->in_act[k] = 1;
    m->act[r->cls][m->nact[r->cls]++] = r->tenant;
  }
}

/* Job ji is done at now (completed, or stopped past its tenant's max duration). */
static void sim_done(sim_t *m, uint32_t ji) {
  sim_job_t *j = &m->jobs[ji];
  lt_sched_job_finished(m->s, ji + 1, m->now);
  if (j->running) sim_fair(m, ji, -(double)m->tr->rows[ji].gpus, 0);
  if (j->running && j->multi) m->multi_finished++;
  j->running = false;
  j->done = true;
  m->completed++;
  m->t_end = m->now;
}

/* The events due at now: completions, and preempted jobs that reached their checkpoint (the
 * work until then is kept; the job goes back to its queue). Stale events are skipped. */
static void sim_events(sim_t *m) {
  while (m->ev.n && m->ev.a[0].t <= m->now) {
    sim_ev_t e = ev_pop(&m->ev);
    sim_job_t *j = &m->jobs[e.job];
    if (e.gen != j->gen || !j->running) continue;
    if (e.kind == EV_COMPLETE) {
      sim_done(m, e.job);
    } else if (j->preempting) {
      double worked = m->now - j->run_from;
      if (worked > 0) j->remaining -= worked;
      if (j->remaining < 0) j->remaining = 0;
      lt_sched_job_requeue(m->s, e.job + 1, m->now);
      sim_fair(m, e.job, -(double)m->tr->rows[e.job].gpus, m->tr->rows[e.job].gpus);
      j->running = false;
      j->preempting = false;
      j->gen++;
    }
    m->changed = true;
  }
}

/* The trace's jobs that arrived by now enter their queues. */
static lt_err_t sim_arrivals(sim_t *m) {
  const lt_sched_trace_t *tr = m->tr;
  while (m->next_arrival < tr->n && tr->rows[m->next_arrival].arrival <= m->now) {
    const trace_row_t *r = &tr->rows[m->next_arrival];
    m->njobs[r->tenant * LT_CLASS__COUNT + r->cls]++;
    m->changed = true;
    if (r->gpus > m->group_slots) { /* larger than a node group: set aside, counted */
      if (m->refused++ == 0) m->refused_line = r->line, m->refused_gpus = r->gpus;
      m->jobs[m->next_arrival++].done = true;
      continue;
    }
    lt_sched_job_t job = {.id = m->next_arrival + 1,
                          .tenant_id = r->tenant + 1,
                          .cls = r->cls,
                          .gpus = r->gpus,
                          .mem_bytes = r->gpus * m->cfg->mem_per_slot,
                          .model = r->model,
                          .limit_s = m->cfg->limit_factor > 0
                                         ? m->cfg->limit_factor * r->duration + m->cfg->cold_load_s
                                         : 0};
    lt_err_t err = lt_sched_job_enqueue(m->s, &job, m->now, m->errstr, m->errstr_size);
    if (err) return err;
    sim_fair(m, (uint32_t)m->next_arrival, 0, r->gpus);
    m->next_arrival++;
  }
  return LT_OK;
}

/* Applies one decision at now — a job's world rows (d[0..world), rank 0 first) as one: a
 * dispatch schedules the completion (after a cold load when a worker lacked the model), a
 * preemption the checkpoint, a stop ends the job. */
static lt_err_t sim_apply(sim_t *m, const lt_sched_decision_t *d) {
  uint32_t ji = (uint32_t)(d->job_id - 1);
  sim_job_t *j = &m->jobs[ji];
  double now = m->now;
  switch (d->action) {
  case LT_SCHED_DISPATCH: {
    bool any_cold = false;
    for (uint32_t r = 0; r < d->world; r++) any_cold |= d[r].cold_load;
    double cold = any_cold ? m->cfg->cold_load_s : 0;
    j->running = true;
    j->gen++;
    j->run_from = now + cold;
    j->multi = d->world > 1;
    if (j->first_dispatch < 0) j->first_dispatch = now;
    if (m->tr->rows[ji].gpus > 1) m->gangs++;
    if (j->multi) m->multi_started++;
    sim_fair(m, ji, m->tr->rows[ji].gpus, -(double)m->tr->rows[ji].gpus);
    if (ev_push(&m->ev, now + cold + j->remaining, EV_COMPLETE, ji, j->gen)) return LT_ERR_NOMEM;
    break;
  }
  case LT_SCHED_PREEMPT:
    j->preempting = true;
    if (ev_push(&m->ev, now + m->cfg->checkpoint_s, EV_PREEMPT_STOP, ji, j->gen))
      return LT_ERR_NOMEM;
    break;
  case LT_SCHED_STOP:
    sim_done(m, ji);
    j->gen++;
    break;
  }
  return LT_OK;
}

/* The policy at now, until it has nothing more to say. */
static lt_err_t sim_decide(sim_t *m) {
  lt_sched_decision_t dec[256];
  size_t nd;
  size_t cap = sizeof dec / sizeof dec[0];
  do {
    nd = lt_sched_decide(m->s, m->now, dec, cap);
    m->decides++;
    if (nd) m->changed = true;
    for (size_t k = 0; k < nd; k += dec[k].world) /* a job's rows are consecutive, rank 0 first */
      if (sim_apply(m, &dec[k]))
        return lt_errf(m->errstr, m->errstr_size, LT_ERR_NOMEM, "sim: out of memory");
    /* a gang whose rows did not fit in what was left of dec waits for the next call */
  } while (nd + LT_SCHED_MAX_GANG_WORKERS > cap);
  m->last_decide = m->now;
  return LT_OK;
}

/* A real deadlock: jobs wait, none runs, and nothing is to come. Names the first few waiting
 * jobs by trace line, and why each can never start. */
static lt_err_t sim_stalled(sim_t *m, const lt_sched_counters_t *cnt) {
  char why[384] = "";
  size_t len = 0, named = 0;
  for (size_t i = 0; i < m->next_arrival && named < 3; i++) {
    const sim_job_t *j = &m->jobs[i];
    if (j->done || j->running) continue;
    const trace_row_t *r = &m->tr->rows[i];
    uint32_t quota = 0;
    for (size_t k = 0; k < m->cfg->n_tenants; k++)
      if (strcmp(m->cfg->tenants[k].name, m->tr->tenants[r->tenant]) == 0)
        quota = m->cfg->tenants[k].max_running_slots;
    char reason[128];
    if (quota && r->gpus > quota && m->cfg->sched.policy == LT_SCHED_POLICY_LATHE)
      snprintf(reason, sizeof reason, "tenant %s's running-slot quota is %u",
               m->tr->tenants[r->tenant], quota);
    else
      snprintf(reason, sizeof reason, "the policy does not start it on an idle fleet");
    int w = snprintf(why + len, sizeof why - len, "%strace line %u (tenant %s, %u GPUs): %s",
                     named ? "; " : "", r->line, m->tr->tenants[r->tenant], r->gpus, reason);
    if (w < 0 || (size_t)w >= sizeof why - len) break;
    len += (size_t)w;
    named++;
  }
  return lt_errf(m->errstr, m->errstr_size, LT_ERR_INTERNAL,
                 "sim: deadlock at t=%.0f s: %u jobs queued, none running, nothing to come; "
                 "never starts: %s",
                 m->now, cnt->queued, why);
}

/* Adds to the run's integrals what the fleet looked like from now for dt seconds: busy slots,
 * and, per class with queued work, each tenant's weighted max-min fair entitlement of the slots
 * the class holds (water-filling its demand, queued GPUs + running slots) less what it runs. */
static void sim_integrate(sim_t *m, const lt_sched_counters_t *cnt, double dt) {
  if (dt <= 0) return;
  m->busy += cnt->slots_used * dt;
  if (cnt->queued > 0) m->frag += lt_sched_fragmented_slots(m->s) * dt;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    if (m->dirty[c]) { /* water-fill again: the class changed since */
      m->dirty[c] = false;
      m->nalloc[c] = 0;
      if (cnt->queued_class[c] == 0 || cnt->slots_used_class[c] == 0) continue;
      uint32_t n = 0;
      for (uint32_t i = 0; i < m->nact[c]; i++) { /* drop the tenants without demand */
        uint32_t t = m->act[c][i];
        size_t k = (size_t)t * LT_CLASS__COUNT + c;
        if (m->run[k] + m->qd[k] <= 0) {
          m->in_act[k] = 0;
          continue;
        }
        m->act[c][n] = t;
        m->sd[n] = m->run[k] + m->qd[k];
        m->sw[n++] = m->weights[t];
      }
      m->nact[c] = m->nalloc[c] = n;
      lt_sched_waterfill(n, m->sd, m->sw, cnt->slots_used_class[c], m->alloc[c]);
    }
    if (m->nalloc[c]) m->pend[c] += dt;
  }
}

/* At the end of the run: the lazily integrated slot-seconds up to now, and the entitlements. */
static void sim_integrate_close(sim_t *m) {
  for (int c = 0; c < LT_CLASS__COUNT; c++) sim_fair_flush(m, c);
  for (size_t k = 0; k < m->nrow_slots; k++) {
    m->got[k] += m->run[k] * (m->now - m->last[k]);
    m->last[k] = m->now;
    m->ent[k] += m->got[k];
  }
}

/* Moves now to the next instant something can happen — an event, an arrival, a policy timer
 * (lt_sched_next_timer), the starvation pass's retry after a change, or (tick_s > 0) the next
 * tick while jobs wait — integrating the fleet until then. Fails only on a real deadlock. */
static lt_err_t sim_advance(sim_t *m) {
  const lt_sched_trace_t *tr = m->tr;
  lt_sched_counters_t cnt;
  lt_sched_counters(m->s, &cnt);
  double next = INFINITY;
  if (m->ev.n) next = m->ev.a[0].t;
  if (m->next_arrival < tr->n && tr->rows[m->next_arrival].arrival < next)
    next = tr->rows[m->next_arrival].arrival;
  if (cnt.queued > 0 && m->cfg->tick_s > 0) { /* the tick-based simulator, for comparison */
    /* nothing running, nothing to come, no timer of the policy's: no tick will start what waits */
    if (cnt.running == 0 && !isfinite(next) && !isfinite(lt_sched_next_timer(m->s, m->now)) &&
        !(lt_sched_next_retry(m->s, m->now) > m->now && isfinite(lt_sched_next_retry(m->s, m->now))))
      return sim_stalled(m, &cnt);
    if (m->last_decide + m->cfg->tick_s < next) next = m->last_decide + m->cfg->tick_s;
  } else if (cnt.queued > 0 || cnt.running > 0) {
    double t = lt_sched_next_timer(m->s, m->now);
    if (t < next) next = t;
    if (m->changed) m->retry_at = lt_sched_next_retry(m->s, m->now);
    if (m->retry_at > m->now && m->retry_at < next) next = m->retry_at;
  }
  m->changed = false;
  if (!isfinite(next)) return sim_stalled(m, &cnt);
  sim_integrate(m, &cnt, next - m->now);
  m->now = next;
  return LT_OK;
}

/* Row (ti, c) of the result: exact wait quantiles of its jobs, and its share and entitlement of
 * what its class held over the run. */
static void sim_row(sim_t *m, size_t ti, int c, const double *class_got, const double *class_ent,
                    lt_sched_sim_row_t *row) {
  const lt_sched_trace_t *tr = m->tr;
  size_t k = ti * LT_CLASS__COUNT + c, nw = 0;
  double *waits = m->waits;
  for (size_t i = 0; i < tr->n; i++)
    if (tr->rows[i].tenant == ti && (int)tr->rows[i].cls == c && m->jobs[i].first_dispatch >= 0)
      waits[nw++] = m->jobs[i].first_dispatch - tr->rows[i].arrival;
  qsort(waits, nw, sizeof *waits, dbl_cmp);
  row->tenant = ti;
  row->cls = (lt_job_class_t)c;
  row->jobs = m->njobs[k];
  row->weight = m->weights[ti];
  row->wait_p50_s = quantile_sorted(waits, nw, 0.5);
  row->wait_p99_s = quantile_sorted(waits, nw, 0.99);
  row->wait_max_s = nw ? waits[nw - 1] : 0;
  row->share = class_got[c] > 0 ? m->got[k] / class_got[c] : 0;
  row->entitlement = class_ent[c] > 0 ? m->ent[k] / class_ent[c] : 0;
}

/* GPU-hours and cold loads into the rows, from the policy's per-tenant usage (tenant id =
 * trace tenant + 1); the run is over, so nothing runs any more. */
static lt_err_t sim_usage(sim_t *m, lt_sched_sim_result_t *res) {
  lt_sched_usage_t *u = calloc(m->nt ? m->nt : 1, sizeof *u);
  if (!u) return lt_errf(m->errstr, m->errstr_size, LT_ERR_NOMEM, "sim: out of memory");
  size_t n = lt_sched_tenants_usage(m->s, m->now, u, m->nt);
  for (size_t i = 0; i < res->n_rows; i++) {
    lt_sched_sim_row_t *row = &res->rows[i];
    for (size_t k = 0; k < n && k < m->nt; k++) {
      if (u[k].tenant_id != row->tenant + 1) continue;
      row->gpu_hours = u[k].gpu_seconds[row->cls] / 3600;
      row->cold_loads = u[k].cold_loads[row->cls];
    }
    res->gpu_hours += row->gpu_hours;
  }
  free(u);
  res->reserved_idle_slot_hours = lt_sched_reserved_idle_slot_s(m->s, m->now) / 3600;
  double span = m->now - m->tr->rows[0].arrival;
  res->fragmented_slots_mean = span > 0 ? m->frag / span : 0;
  return LT_OK;
}

/* Fills res from the finished run: counters, utilisation, a row per (tenant, class) with jobs,
 * and Jain's index of share / entitlement per class. */
static lt_err_t sim_results(sim_t *m, lt_sched_sim_result_t *res) {
  sim_integrate_close(m);
  lt_sched_counters_t cnt;
  lt_sched_counters(m->s, &cnt);
  res->dispatches = cnt.dispatches;
  res->preemptions = cnt.preemptions;
  res->stops = cnt.stops;
  res->cold_loads = cnt.cold_loads;
  res->backfills = cnt.backfills;
  res->completed = m->completed;
  res->gangs_started = m->gangs;
  res->multi_started = m->multi_started;
  res->multi_finished = m->multi_finished;
  res->decide_calls = m->decides;
  res->refused_size = m->refused;
  res->refused_first_line = m->refused_line;
  res->refused_first_gpus = m->refused_gpus;
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    size_t nw = 0;
    for (size_t i = 0; i < m->tr->n; i++)
      if ((int)m->tr->rows[i].cls == c && m->jobs[i].first_dispatch >= 0)
        m->waits[nw++] = m->jobs[i].first_dispatch - m->tr->rows[i].arrival;
    qsort(m->waits, nw, sizeof *m->waits, dbl_cmp);
    res->wait_p50_s[c] = quantile_sorted(m->waits, nw, 0.5);
    res->wait_p99_s[c] = quantile_sorted(m->waits, nw, 0.99);
  }
  res->makespan_s = m->t_end - m->tr->rows[0].arrival;
  res->utilisation =
      res->makespan_s > 0
          ? m->busy / ((double)m->cfg->workers * m->cfg->slots_per_worker * res->makespan_s)
          : 0;
  size_t nrows = 0;
  for (size_t i = 0; i < m->nrow_slots; i++) nrows += m->njobs[i] > 0;
  res->rows = calloc(nrows ? nrows : 1, sizeof *res->rows);
  if (!res->rows) return lt_errf(m->errstr, m->errstr_size, LT_ERR_NOMEM, "sim: out of memory");
  double class_got[LT_CLASS__COUNT] = {0}, class_ent[LT_CLASS__COUNT] = {0};
  for (size_t i = 0; i < m->nrow_slots; i++) {
    class_got[i % LT_CLASS__COUNT] += m->got[i];
    class_ent[i % LT_CLASS__COUNT] += m->ent[i];
  }
  for (size_t ti = 0; ti < m->nt; ti++)
    for (int c = 0; c < LT_CLASS__COUNT; c++) {
      if (!m->njobs[ti * LT_CLASS__COUNT + c]) continue;
      sim_row(m, ti, c, class_got, class_ent, &res->rows[res->n_rows++]);
      res->class_present[c] = true;
    }
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    size_t k = 0;
    for (size_t i = 0; i < res->n_rows; i++)
      if ((int)res->rows[i].cls == c && res->rows[i].entitlement > 0)
        m->waits[k++] = res->rows[i].share / res->rows[i].entitlement;
    res->jain[c] = lt_sched_jain_index(k, m->waits);
  }
  return sim_usage(m, res);
}

lt_err_t lt_sched_sim_run(const lt_sched_trace_t *tr, const lt_sched_sim_config_t *cfg,
                          lt_sched_sim_result_t *res, char *errstr, size_t errstr_size) {
  memset(res, 0, sizeof *res);
  res->policy = cfg->sched.policy;
  lt_err_t err = sim_check(cfg, errstr, errstr_size);
  if (err) return err;
  sim_t m = {.tr = tr, .cfg = cfg, .errstr = errstr, .errstr_size = errstr_size};
  err = sim_open(&m);
  if (!err) {
    m.now = tr->rows[0].arrival;
    m.last_decide = -INFINITY;
    m.retry_at = INFINITY;
    m.t_end = m.now;
  }
  while (!err && m.completed + m.refused < tr->n) {
    /* what happens at now: ends, checkpoints, arrivals, then the policy */
    sim_events(&m);
    err = sim_arrivals(&m);
    if (!err) err = sim_decide(&m);
    if (err || m.completed + m.refused == tr->n) break;
    err = sim_advance(&m);
  }
  if (!err) err = sim_results(&m, res);
  if (err) lt_sched_sim_result_free(res);
  sim_close(&m);
  return err;
}
