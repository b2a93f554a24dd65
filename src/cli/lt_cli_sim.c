/* lt_cli_sim: `lathe sim TRACE` — runs the scheduling policy over a CSV trace with virtual time
 * (lt_sched_sim_run) and prints per-tenant waits and shares, per-class waits and Jain's index,
 * utilisation, preemptions, cold loads and gangs, for Lathe's policy, FIFO and least attained
 * service side by side. This file only reads the trace (line by line) and prints; the simulation
 * itself is in the library, the trace generator (`lathe sim gen`) in lt_cli_sim_gen.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lt_cli_args.h"
#include "lt_sched.h"

int lt_cli_sim(int argc, char **argv);
int lt_cli_sim_gen(int argc, char **argv);

static void sim_usage(FILE *f) {
  fprintf(f,
          "usage: lathe sim TRACE [options]\n"
          "       lathe sim gen [options]       make a trace (lathe sim gen --help)\n"
          "  TRACE: CSV with a header line, then arrival_s,tenant,class,gpus,duration_s,"
          "base_model\n"
          "         per job, sorted by arrival_s ('#' and blank lines skipped); a job with more\n"
          "         GPUs than a worker's slots runs as a multi-worker gang within one node\n"
          "         group; one larger than a group is counted as refused_by_size, not run\n"
          "  --policy lathe|fifo|las|both|all  policies to simulate (default all; both: lathe\n"
          "                             and fifo)\n"
          "  --json                     print the results as one JSON object\n"
          "  --workers N                workers in the fleet (default 16)\n"
          "  --slots N                  GPU slots per worker (default 8)\n"
          "  --workers-per-group N      workers per node group, where one gang may span\n"
          "                             (default 0: all workers in one group)\n"
          "  --models-per-worker N      base models a worker holds at once (default 2)\n"
          "  --cold-load S              seconds to load a base model (default 60)\n"
          "  --checkpoint S             seconds from preempt request to stop (default 30)\n"
          "  --tick S                   also decide every S s while jobs wait (default 0: only\n"
          "                             on arrivals, ends and the policy's timers)\n"
          "  --las-threshold GPU_S      LAS: attained GPU-seconds of the first queue (3600)\n"
          "  --aging S                  wait after which standard work may use production's reserve (600)\n"
          "  --preempt-after S          wait before preemptible work is preempted (120)\n"
          "  --gang-reserve-after S     wait before a worker is reserved for a gang (300)\n"
          "  --reserve F                fraction of slots standard work may not hold (0.1)\n"
          "  --limit-factor F           each job declares a maximum duration of F (>= 1) times\n"
          "                             its own, which the policy backfills by (default 0: none)\n"
          "  --tenant NAME:W[:MAXRUN[:MAXDUR]]  weight, running-slot quota, max duration s\n"
          "                             (repeatable; tenants not named have weight 1)\n");
}

static int parse_num(const char *opt, const char *v, double lo, double *out) {
  char *end;
  errno = 0;
  double d = strtod(v, &end);
  if (end == v || *end || errno || !isfinite(d) || d < lo) {
    fprintf(stderr, "lathe sim: %s: \"%s\" is not a number >= %g\n", opt, v, lo);
    return -1;
  }
  *out = d;
  return 0;
}

/* A whole number within lo..hi, for a count the simulator keeps as 32 bits. */
static int parse_count(const char *opt, const char *v, double lo, double hi, uint32_t *out) {
  double d;
  if (parse_num(opt, v, lo, &d)) return -1;
  if (d > hi || d != floor(d)) {
    fprintf(stderr, "lathe sim: %s: \"%s\" is not a whole number from %g to %g\n", opt, v, lo, hi);
    return -1;
  }
  *out = (uint32_t)d;
  return 0;
}

static int parse_tenant(const char *v, lt_sched_sim_tenant_t *t) {
  memset(t, 0, sizeof *t);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", v);
  char *parts[4] = {0};
  int n = 0;
  char *p = buf;
  for (; p && n < 4; n++) {
    parts[n] = p;
    p = strchr(p, ':');
    if (p) *p++ = 0;
  }
  if (p || strlen(v) >= sizeof buf || n < 2 || !*parts[0] || strlen(parts[0]) >= sizeof t->name) {
    fprintf(stderr, "lathe sim: --tenant \"%s\": expected NAME:WEIGHT[:MAXRUN[:MAXDUR]]\n", v);
    return -1;
  }
  snprintf(t->name, sizeof t->name, "%s", parts[0]);
  if (parse_num("--tenant weight", parts[1], 1e-9, &t->weight)) return -1;
  if (n > 2 && parse_count("--tenant max running slots", parts[2], 0, 1e9, &t->max_running_slots)) return -1;
  if (n > 3 && parse_num("--tenant max duration", parts[3], 0, &t->max_duration_s)) return -1;
  return 0;
}

static const lt_sched_sim_row_t *find_row(const lt_sched_sim_result_t *r, size_t tenant, int c) {
  for (size_t i = 0; i < r->n_rows; i++)
    if (r->rows[i].tenant == tenant && (int)r->rows[i].cls == c) return &r->rows[i];
  return NULL;
}

/* GPU-hours and cold loads of tenant ti under result r, over its classes. */
static void tenant_usage(const lt_sched_sim_result_t *r, size_t ti, double *gpu_h, uint64_t *cold) {
  *gpu_h = 0;
  *cold = 0;
  for (size_t i = 0; i < r->n_rows; i++)
    if (r->rows[i].tenant == ti) {
      *gpu_h += r->rows[i].gpu_hours;
      *cold += r->rows[i].cold_loads;
    }
}

#define TOP_TENANTS 8

/* The tenants that ran the most GPU-hours under the first policy (all of them are in --json),
 * with their GPU-hours and cold loads under each policy. */
static void print_top_tenants(const lt_sched_trace_t *tr, const lt_sched_sim_result_t *res,
                              size_t nres) {
  size_t top[TOP_TENANTS], ntop = 0, nt = lt_sched_trace_tenants(tr);
  double top_h[TOP_TENANTS];
  for (size_t ti = 0; ti < nt; ti++) { /* insertion into the top list, largest first */
    double h;
    uint64_t cold;
    tenant_usage(&res[0], ti, &h, &cold);
    size_t at = ntop;
    while (at > 0 && top_h[at - 1] < h) at--;
    if (at >= TOP_TENANTS) continue;
    size_t last = ntop < TOP_TENANTS ? ntop : TOP_TENANTS - 1;
    for (size_t k = last; k > at; k--) top[k] = top[k - 1], top_h[k] = top_h[k - 1];
    top[at] = ti;
    top_h[at] = h;
    if (ntop < TOP_TENANTS) ntop++;
  }
  printf("\n%-28s", nt > TOP_TENANTS ? "gpu_hours (top tenants)" : "gpu_hours");
  for (size_t k = 0; k < nres; k++) printf(" | %5s %8s %6s", lt_sched_policy_name(res[k].policy), "gpu_h", "cold");
  printf("\n");
  for (size_t i = 0; i < ntop; i++) {
    printf("%-28s", lt_sched_trace_tenant_name(tr, top[i]));
    for (size_t k = 0; k < nres; k++) {
      double h;
      uint64_t cold;
      tenant_usage(&res[k], top[i], &h, &cold);
      printf(" | %5s %8.1f %6llu", "", h, (unsigned long long)cold);
    }
    printf("\n");
  }
}

static void print_summary(const lt_sched_sim_result_t *res, size_t nres);

static void print_results(const lt_sched_trace_t *tr, const lt_sched_sim_result_t *res,
                          size_t nres) {
  printf("%-16s %-11s %6s %5s", "tenant", "class", "weight", "jobs");
  for (size_t k = 0; k < nres; k++) {
    const char *p = lt_sched_policy_name(res[k].policy);
    printf(" | %5s %9s %9s %6s %6s", p, "wait_p50", "wait_p99", "share", "entit");
  }
  printf("\n");
  for (size_t ti = 0; ti < lt_sched_trace_tenants(tr); ti++)
    for (int c = 0; c < LT_CLASS__COUNT; c++) {
      const lt_sched_sim_row_t *r0 = find_row(&res[0], ti, c);
      if (!r0) continue;
      printf("%-16s %-11s %6.2f %5u", lt_sched_trace_tenant_name(tr, ti),
             lt_job_class_name((lt_job_class_t)c), r0->weight, r0->jobs);
      for (size_t k = 0; k < nres; k++) {
        const lt_sched_sim_row_t *r = find_row(&res[k], ti, c);
        printf(" | %5s %8.0fs %8.0fs %5.1f%% %5.1f%%", "", r->wait_p50_s, r->wait_p99_s,
               100 * r->share, 100 * r->entitlement);
      }
      printf("\n");
    }
  print_top_tenants(tr, res, nres);
  print_summary(res, nres);
}

/* The fleet lines: one column per policy. */
static void print_summary(const lt_sched_sim_result_t *res, size_t nres) {
  printf("\n%-28s", "summary");
  for (size_t k = 0; k < nres; k++) printf(" %14s", lt_sched_policy_name(res[k].policy));
  printf("\n");
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    if (!res[0].class_present[c]) continue;
    char label[64];
    snprintf(label, sizeof label, "jain_%s", lt_job_class_name((lt_job_class_t)c));
    printf("%-28s", label);
    for (size_t k = 0; k < nres; k++) printf(" %14.4f", res[k].jain[c]);
    printf("\n");
  }
  for (int c = 0; c < LT_CLASS__COUNT; c++) {
    if (!res[0].class_present[c]) continue;
    char label[64];
    for (int q = 0; q < 2; q++) {
      snprintf(label, sizeof label, "wait_%s_%s_s", q ? "p99" : "p50",
               lt_job_class_name((lt_job_class_t)c));
      printf("%-28s", label);
      for (size_t k = 0; k < nres; k++)
        printf(" %14.0f", q ? res[k].wait_p99_s[c] : res[k].wait_p50_s[c]);
      printf("\n");
    }
  }
  printf("%-28s", "utilisation");
  for (size_t k = 0; k < nres; k++) printf(" %13.1f%%", 100 * res[k].utilisation);
  printf("\n%-28s", "makespan_s");
  for (size_t k = 0; k < nres; k++) printf(" %14.0f", res[k].makespan_s);
  printf("\n%-28s", "preemptions");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].preemptions);
  printf("\n%-28s", "backfills");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].backfills);
  printf("\n%-28s", "cold_model_loads");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].cold_loads);
  printf("\n%-28s", "duration_stops");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].stops);
  printf("\n%-28s", "gangs_started");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].gangs_started);
  printf("\n%-28s", "multi_worker_gangs_started");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].multi_started);
  printf("\n%-28s", "multi_worker_gangs_finished");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].multi_finished);
  printf("\n%-28s", "jobs_completed");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].completed);
  printf("\n%-28s", "refused_by_size");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].refused_size);
  printf("\n%-28s", "decide_calls");
  for (size_t k = 0; k < nres; k++) printf(" %14llu", (unsigned long long)res[k].decide_calls);
  printf("\n%-28s", "gpu_hours");
  for (size_t k = 0; k < nres; k++) printf(" %14.1f", res[k].gpu_hours);
  printf("\n%-28s", "reserved_idle_slot_hours");
  for (size_t k = 0; k < nres; k++) printf(" %14.2f", res[k].reserved_idle_slot_hours);
  printf("\n%-28s", "fragmented_slots_mean");
  for (size_t k = 0; k < nres; k++) printf(" %14.3f", res[k].fragmented_slots_mean);
  printf("\n");
  if (res[0].refused_size)
    printf("\nrefused_by_size: %llu jobs need more GPUs than a node group has (the first: trace "
           "line %u, %u GPUs)\n",
           (unsigned long long)res[0].refused_size, res[0].refused_first_line,
           res[0].refused_first_gpus);
}

/* The same results as one JSON object (--json), for scripts: per policy, per (tenant, class)
 * rows, Jain's index per class and the fleet figures. */
static void print_json(const char *path, const lt_sched_trace_t *tr, const lt_sched_sim_config_t *cfg,
                       const lt_sched_sim_result_t *res, size_t nres) {
  json_t *out = json_pack("{s:s,s:I,s:I,s:{s:i,s:i,s:i,s:i},s:[]}", "trace", path, "jobs", (json_int_t)lt_sched_trace_jobs(tr),
                          "tenants", (json_int_t)lt_sched_trace_tenants(tr), "fleet", "workers", (int)cfg->workers,
                          "slots_per_worker", (int)cfg->slots_per_worker, "workers_per_group",
                          (int)cfg->workers_per_group, "models_per_worker",
                          (int)cfg->models_per_worker, "policies");
  for (size_t k = 0; k < nres; k++) {
    const lt_sched_sim_result_t *r = &res[k];
    json_t *rows = json_array(), *jain = json_object();
    for (size_t i = 0; i < r->n_rows; i++) {
      const lt_sched_sim_row_t *w = &r->rows[i];
      json_t *row = json_pack("{s:f,s:I}", "gpu_hours", w->gpu_hours, "cold_loads", (json_int_t)w->cold_loads);
      json_object_update_new(row, json_pack("{s:s,s:s,s:f,s:i,s:f,s:f,s:f,s:f,s:f}", "tenant",
                                            lt_sched_trace_tenant_name(tr, w->tenant), "class",
                                            lt_job_class_name(w->cls), "weight", w->weight, "jobs", (int)w->jobs,
                                            "wait_p50_s", w->wait_p50_s, "wait_p99_s", w->wait_p99_s, "wait_max_s",
                                            w->wait_max_s, "share", w->share, "entitlement", w->entitlement));
      json_array_append_new(rows, row);
    }
    json_t *waits = json_object();
    for (int c = 0; c < LT_CLASS__COUNT; c++) {
      if (!r->class_present[c]) continue;
      json_object_set_new(jain, lt_job_class_name((lt_job_class_t)c), json_real(r->jain[c]));
      json_object_set_new(waits, lt_job_class_name((lt_job_class_t)c),
                          json_pack("{s:f,s:f}", "p50_s", r->wait_p50_s[c], "p99_s",
                                    r->wait_p99_s[c]));
    }
    json_t *pj = json_pack("{s:o,s:I,s:I,s:I,s:I,s:I,s:I}", "class_waits", waits, "gangs_started",
                           (json_int_t)r->gangs_started, "multi_worker_gangs_started",
                           (json_int_t)r->multi_started, "multi_worker_gangs_finished",
                           (json_int_t)r->multi_finished, "refused_by_size",
                           (json_int_t)r->refused_size, "refused_first_line",
                           (json_int_t)r->refused_first_line, "decide_calls",
                           (json_int_t)r->decide_calls);
    json_object_set_new(pj, "backfills", json_integer((json_int_t)r->backfills));
    json_object_update_new(pj, json_pack("{s:f,s:f,s:f}", "gpu_hours", r->gpu_hours,
                                         "reserved_idle_slot_hours", r->reserved_idle_slot_hours,
                                         "fragmented_slots_mean", r->fragmented_slots_mean));
    json_object_update_new(pj, json_pack("{s:s,s:o,s:o,s:f,s:f,s:I,s:I,s:I,s:I,s:I}", "policy",
                                    lt_sched_policy_name(r->policy), "rows", rows, "jain", jain, "utilisation",
                                    r->utilisation, "makespan_s", r->makespan_s, "dispatches",
                                    (json_int_t)r->dispatches, "preemptions", (json_int_t)r->preemptions, "stops",
                                    (json_int_t)r->stops, "cold_loads", (json_int_t)r->cold_loads, "completed",
                                    (json_int_t)r->completed));
    json_array_append_new(json_object_get(out, "policies"), pj);
  }
  char *text = json_dumps(out, JSON_COMPACT | JSON_REAL_PRECISION(6));
  if (text) puts(text);
  free(text);
  json_decref(out);
}

/* What the command line asks for. */
typedef struct sim_args {
  lt_sched_sim_config_t cfg;
  lt_sched_sim_tenant_t tenants[256]; /* --tenant, in cfg.tenants */
  size_t ntenants;
  int policies; /* bit 0 lathe, bit 1 fifo, bit 2 las */
  bool json;
  const char *path;
} sim_args_t;

enum { O_POLICY = 256, O_WORKERS, O_GROUP, O_SLOTS, O_MODELS, O_COLD, O_CKPT, O_TICK, O_AGING,
       O_PREEMPT, O_GANG, O_RESERVE, O_TENANT, O_JSON, O_LAS, O_LIMIT };

/* Applies option o (one of O_*) with its argument; 0, or 2 after saying what is wrong. */
static int sim_option(sim_args_t *a, int o, const char *arg) {
  lt_sched_sim_config_t *cfg = &a->cfg;
  switch (o) {
  case O_POLICY:
    if (strcmp(arg, "lathe") == 0) a->policies = 1;
    else if (strcmp(arg, "fifo") == 0) a->policies = 2;
    else if (strcmp(arg, "las") == 0) a->policies = 4;
    else if (strcmp(arg, "both") == 0) a->policies = 3;
    else if (strcmp(arg, "all") == 0) a->policies = 7;
    else {
      fprintf(stderr, "lathe sim: --policy must be lathe, fifo, las, both or all, got \"%s\"\n",
              arg);
      return 2;
    }
    return 0;
  case O_WORKERS: return parse_count("--workers", arg, 1, 1e6, &cfg->workers) ? 2 : 0;
  case O_GROUP: return parse_count("--workers-per-group", arg, 0, 1e6, &cfg->workers_per_group) ? 2 : 0;
  case O_SLOTS:
    return parse_count("--slots", arg, 1, LT_SCHED_MAX_WORKER_SLOTS, &cfg->slots_per_worker) ? 2 : 0;
  case O_MODELS: return parse_count("--models-per-worker", arg, 1, 1e6, &cfg->models_per_worker) ? 2 : 0;
  case O_COLD: return parse_num("--cold-load", arg, 0, &cfg->cold_load_s) ? 2 : 0;
  case O_CKPT: return parse_num("--checkpoint", arg, 0, &cfg->checkpoint_s) ? 2 : 0;
  case O_TICK: /* a tick under a millisecond decides billions of times over a trace's days */
    if (parse_num("--tick", arg, 0, &cfg->tick_s)) return 2;
    if (cfg->tick_s > 0 && cfg->tick_s < 1e-3) {
      fprintf(stderr, "lathe sim: --tick: \"%s\" is under 0.001 s (0: event-driven)\n", arg);
      return 2;
    }
    return 0;
  case O_LAS: return parse_num("--las-threshold", arg, 0, &cfg->sched.las_threshold_gpu_s) ? 2 : 0;
  case O_AGING: return parse_num("--aging", arg, 0, &cfg->sched.aging_s) ? 2 : 0;
  case O_PREEMPT:
    return parse_num("--preempt-after", arg, 0, &cfg->sched.preempt_after_s) ? 2 : 0;
  case O_GANG:
    return parse_num("--gang-reserve-after", arg, 0, &cfg->sched.gang_reserve_after_s) ? 2 : 0;
  case O_RESERVE:
    if (parse_num("--reserve", arg, 0, &cfg->sched.production_reserve) ||
        cfg->sched.production_reserve > 1) {
      fprintf(stderr, "lathe sim: --reserve must be within 0..1\n");
      return 2;
    }
    return 0;
  case O_TENANT:
    if (a->ntenants == sizeof a->tenants / sizeof a->tenants[0]) {
      fprintf(stderr, "lathe sim: at most %zu --tenant options\n", a->ntenants);
      return 2;
    }
    if (parse_tenant(arg, &a->tenants[a->ntenants])) return 2;
    a->ntenants++;
    return 0;
  case O_JSON:
    a->json = true;
    return 0;
  case O_LIMIT:
    if (parse_num("--limit-factor", arg, 0, &cfg->limit_factor)) return 2;
    if (cfg->limit_factor > 0 && cfg->limit_factor < 1) {
      fprintf(stderr, "lathe sim: --limit-factor must be 0 or >= 1 (a job never runs past its bound), got %s\n", arg);
      return 2;
    }
    return 0;
  }
  return 2;
}

/* Reads the command line into *a: -1 to go on, otherwise the exit code (--help: 0). */
static int sim_parse_args(int argc, char **argv, sim_args_t *a) {
  static const struct option opts[] = {
      {"policy", required_argument, 0, O_POLICY},
      {"workers", required_argument, 0, O_WORKERS},
      {"workers-per-group", required_argument, 0, O_GROUP},
      {"slots", required_argument, 0, O_SLOTS},
      {"models-per-worker", required_argument, 0, O_MODELS},
      {"cold-load", required_argument, 0, O_COLD},
      {"checkpoint", required_argument, 0, O_CKPT},
      {"tick", required_argument, 0, O_TICK},
      {"aging", required_argument, 0, O_AGING},
      {"preempt-after", required_argument, 0, O_PREEMPT},
      {"gang-reserve-after", required_argument, 0, O_GANG},
      {"reserve", required_argument, 0, O_RESERVE},
      {"tenant", required_argument, 0, O_TENANT},
      {"json", no_argument, 0, O_JSON},
      {"las-threshold", required_argument, 0, O_LAS},
      {"limit-factor", required_argument, 0, O_LIMIT},
      {0, 0, 0, 0},
  };
  lt_sched_sim_config_default(&a->cfg);
  a->ntenants = 0;
  a->policies = 7;
  a->json = false;
  lt_cli_args_t p = {.what = "sim", .usage = sim_usage, .opts = opts, .min = 1, .max = 1};
  int o;
  while ((o = lt_cli_args_next(&p, argc, argv)) >= 0)
    if (sim_option(a, o, p.value)) return 2;
  if (o != LT_CLI_ARGS_END) return p.status;
  a->path = p.operands[0];
  a->cfg.tenants = a->tenants;
  a->cfg.n_tenants = a->ntenants;
  return -1;
}

/* Reads and parses the trace; warns about --tenant names it does not have. NULL after saying
 * why it could not. */
static lt_sched_trace_t *sim_load(const sim_args_t *a) {
  FILE *f = fopen(a->path, "r");
  if (!f) {
    fprintf(stderr, "lathe sim: cannot read %s: %s\n", a->path, strerror(errno));
    return NULL;
  }
  char err[512];
  lt_sched_trace_t *tr = NULL;
  lt_err_t e = lt_sched_trace_new(&tr, err, sizeof err);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while (!e && (n = getline(&line, &cap, f)) >= 0)
    e = lt_sched_trace_add_line(tr, line, (size_t)n, err, sizeof err);
  if (!e && ferror(f)) e = lt_errf(err, sizeof err, LT_ERR_IO, "read error: %s", strerror(errno));
  if (!e) e = lt_sched_trace_finish(tr, err, sizeof err);
  free(line);
  fclose(f);
  if (e) {
    fprintf(stderr, "lathe sim: %s: %s\n", a->path, err);
    lt_sched_trace_destroy(tr);
    return NULL;
  }
  for (size_t k = 0; k < a->ntenants; k++) {
    bool seen = false;
    for (size_t i = 0; i < lt_sched_trace_tenants(tr); i++)
      seen |= strcmp(lt_sched_trace_tenant_name(tr, i), a->tenants[k].name) == 0;
    if (!seen)
      fprintf(stderr, "lathe sim: warning: --tenant %s: no such tenant in the trace\n",
              a->tenants[k].name);
  }
  return tr;
}

int lt_cli_sim(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "gen") == 0) return lt_cli_sim_gen(argc - 1, argv + 1);
  sim_args_t a;
  int rc = sim_parse_args(argc, argv, &a);
  if (rc >= 0) return rc;
  lt_sched_trace_t *tr = sim_load(&a);
  if (!tr) return 1;

  /* Lathe's policy, FIFO and LAS, on the same trace and fleet */
  static const lt_sched_policy_t order[3] = {LT_SCHED_POLICY_LATHE, LT_SCHED_POLICY_FIFO,
                                             LT_SCHED_POLICY_LAS};
  lt_sched_sim_result_t res[3];
  size_t nres = 0;
  char err[512];
  rc = 0;
  for (int p = 0; p < 3; p++) {
    if (!(a.policies & (1 << p))) continue;
    a.cfg.sched.policy = order[p];
    if (lt_sched_sim_run(tr, &a.cfg, &res[nres], err, sizeof err)) {
      fprintf(stderr, "lathe sim: %s policy: %s\n", lt_sched_policy_name(a.cfg.sched.policy), err);
      rc = 1;
      break;
    }
    nres++;
  }
  if (rc == 0 && a.json) {
    print_json(a.path, tr, &a.cfg, res, nres);
  } else if (rc == 0) {
    printf("trace %s: %zu jobs, %zu tenants; fleet %u workers x %u slots, %u models per "
           "worker\n\n",
           a.path, lt_sched_trace_jobs(tr), lt_sched_trace_tenants(tr), a.cfg.workers,
           a.cfg.slots_per_worker, a.cfg.models_per_worker);
    print_results(tr, res, nres);
  }
  for (size_t k = 0; k < nres; k++) lt_sched_sim_result_free(&res[k]);
  lt_sched_trace_destroy(tr);
  return rc;
}
