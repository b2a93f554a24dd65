/* lt_cli_sim_gen: `lathe sim gen` — a seeded generator of the CSV traces `lathe sim` reads, shaped
 * like a public multi-tenant GPU cluster's: heavy-tailed jobs per tenant, a class mix, a GPU-count
 * mix dominated by single-GPU jobs with 8-GPU gangs and rare huge ones, log-normal-like durations
 * from minutes to weeks, and bursty arrivals. The same options give the same bytes: the random
 * numbers come from one splitmix64 stream seeded by --seed, used in a fixed order. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/stat.h>
#include <unistd.h>

#include "lt_cli_args.h"
#include "lt_rand.h"
#include "lt_sched.h"

int lt_cli_sim_gen(int argc, char **argv);

static void gen_usage(FILE *f) {
  fprintf(f,
          "usage: lathe sim gen [--jobs N] [--days D] [--seed S] [--load L --workers W "
          "--slots G] [--out FILE]\n"
          "  Writes a trace for `lathe sim` (stdout, or FILE): the header line\n"
          "    arrival_s,tenant,class,gpus,duration_s,base_model\n"
          "  then one job a line, sorted by arrival_s (seconds from the trace's start, >= 0);\n"
          "  tenant and base_model are names (1..63 characters), class is production, standard\n"
          "  or preemptible, gpus 1..64 (all on one worker), duration_s the run time (> 0).\n"
          "  --jobs N     jobs (default 15000)          --days D   arrival span (default 125)\n"
          "  --seed S     random seed (default 1); the same options give the same bytes\n"
          "  --load L     scale every duration by one factor so that the jobs that fit on a worker\n"
          "               ask for L times the GPU-seconds of W workers x G slots over D days\n"
          "               (--workers, default 100; --slots, default 8); without it, durations\n"
          "               follow p10 18 min, p50 4.1 h, p90 3.8 d, p99 35 d\n"
          "  Mix: tenants with 3..2000 jobs each (Pareto); classes 15%% production, 60%%\n"
          "  standard, 25%% preemptible; GPUs 1: 68.65%%, 2: 3%%, 4: 13.4%%, 8: 12.6%%, 16: 1.7%%,\n"
          "  32: 0.6%%, 64: 0.05%%; arrivals Poisson, switching between calm and bursts (8x the\n"
          "  rate, ~1 h in 13).\n");
}

typedef struct rng {
  uint64_t x;
} rng_t;

static uint64_t rng_u64(rng_t *r) { return lt_splitmix64(&r->x); }
static double rng_unit(rng_t *r) { return ((double)(rng_u64(r) >> 11) + 0.5) / 9007199254740992.0; }
static double rng_exp(rng_t *r, double mean) { return -mean * log(rng_unit(r)); }
static double rng_normal(rng_t *r) {
  return sqrt(-2 * log(rng_unit(r))) * cos(6.283185307179586 * rng_unit(r));
}

/* A duration: log-duration piecewise linear in a standard normal z through the target quantiles
 * (z = -1.2816, 0, 1.2816, 2.3263 at 18 min, 4.1 h, 3.8 d, 35 d), extended with the end slopes;
 * kept within 1 min..180 d. */
static double gen_duration(rng_t *r) {
  static const double kz[4] = {-1.2816, 0, 1.2816, 2.3263};
  static const double kd[4] = {1080, 14760, 328320, 3024000};
  double z = rng_normal(r);
  int i = z < kz[1] ? 0 : z < kz[2] ? 1 : 2;
  double l0 = log(kd[i]), l1 = log(kd[i + 1]);
  double d = exp(l0 + (l1 - l0) * (z - kz[i]) / (kz[i + 1] - kz[i]));
  return d < 60 ? 60 : d > 180 * 86400.0 ? 180 * 86400.0 : d;
}

static uint32_t gen_gpus(rng_t *r) {
  static const double cum[7] = {0.6865, 0.7165, 0.8505, 0.9765, 0.9935, 0.9995, 1.0};
  static const uint32_t g[7] = {1, 2, 4, 8, 16, 32, 64};
  double u = rng_unit(r);
  for (int i = 0; i < 6; i++)
    if (u < cum[i]) return g[i];
  return g[6];
}

typedef struct gen_job {
  double arrival, duration;
  uint32_t tenant, gpus, model;
  uint8_t cls;
} gen_job_t;

typedef struct gen_args {
  long jobs;
  double days, load;
  uint64_t seed;
  uint32_t workers, slots;
  const char *out;
} gen_args_t;

static const char *const gen_models[8] = {"llama-8b", "qwen-7b",  "mistral-7b", "llama-70b",
                                          "gemma-9b", "phi-3",    "qwen-32b",   "llama-3b"};
static const char *const gen_classes[3] = {"production", "standard", "preemptible"};

/* Jobs per tenant: Pareto(1.1) counts within 3..2000 until they sum to n (the last one trimmed);
 * returns how many tenants, with each job's tenant in owner[] shuffled. NULL-free: owner is
 * caller-sized n. */
static uint32_t gen_tenants(rng_t *r, long n, uint32_t *owner) {
  long filled = 0;
  uint32_t t = 0;
  while (filled < n) {
    double c = 3.0 / pow(rng_unit(r), 1 / 1.1);
    long k = c > 2000 ? 2000 : (long)c;
    if (k > n - filled) k = n - filled;
    long rest = n - filled - k; /* no tenant with fewer than 3 jobs at the end */
    if (rest > 0 && rest < 3) k = k - (3 - rest) >= 3 ? k - (3 - rest) : n - filled;
    for (long i = 0; i < k; i++) owner[filled++] = t;
    t++;
  }
  for (long i = n - 1; i > 0; i--) { /* Fisher-Yates */
    long j = (long)(rng_u64(r) % (uint64_t)(i + 1));
    uint32_t x = owner[i];
    owner[i] = owner[j];
    owner[j] = x;
  }
  return t;
}

/* Arrival instants over [0, days): a Poisson process whose rate switches between calm (mean
 * 12 h) and burst (mean 1 h, 8x the rate) periods, then scaled so the span is the request. */
static void gen_arrivals(rng_t *r, gen_job_t *jobs, long n, double days) {
  double t = 0, state_end = rng_exp(r, 12 * 3600.0);
  bool burst = false;
  for (long i = 0; i < n; i++) {
    double gap = rng_exp(r, burst ? 1.0 / 8 : 1.0);
    while (t + gap > state_end) { /* memoryless: restart the draw at the switch */
      t = state_end;
      burst = !burst;
      state_end = t + rng_exp(r, burst ? 3600.0 : 12 * 3600.0);
      gap = rng_exp(r, burst ? 1.0 / 8 : 1.0);
    }
    t += gap;
    jobs[i].arrival = t;
  }
  double scale = n > 0 && t > 0 ? days * 86400.0 * (double)n / ((double)n + 1) / t : 1;
  for (long i = 0; i < n; i++) jobs[i].arrival *= scale;
}

static int gen_parse(int argc, char **argv, gen_args_t *a) {
  static const struct option opts[] = {
      {"jobs", required_argument, 0, 'n'}, {"days", required_argument, 0, 'd'},
      {"seed", required_argument, 0, 's'}, {"load", required_argument, 0, 'l'},
      {"workers", required_argument, 0, 'w'}, {"slots", required_argument, 0, 'g'},
      {"out", required_argument, 0, 'o'}, {0, 0, 0, 0}};
  *a = (gen_args_t){.jobs = 15000, .days = 125, .seed = 1, .workers = 100, .slots = 8};
  lt_cli_args_t p = {.what = "sim gen", .usage = gen_usage, .opts = opts};
  int o;
  while ((o = lt_cli_args_next(&p, argc, argv)) >= 0) {
    char *end = NULL;
    double v = 0;
    if (o != 'o') {
      /* the largest of each: a trace this machine can hold, a seed a double carries exactly */
      double max = o == 'n' ? 1e8 : o == 'd' ? 36500 : o == 's' ? 9007199254740991.0 : o == 'l' ? 1e6
                   : o == 'w' ? 1e6 : LT_SCHED_MAX_WORKER_SLOTS;
      errno = 0;
      v = strtod(p.value, &end);
      if (end == p.value || *end || errno || !isfinite(v) || v <= 0 || v > max ||
          (o != 'd' && o != 'l' && v != floor(v))) {
        fprintf(stderr, "lathe sim gen: --%s: \"%s\" is not a %s above 0 and at most %.16g\n",
                o == 'n' ? "jobs" : o == 'd' ? "days" : o == 's' ? "seed" : o == 'l' ? "load"
                : o == 'w' ? "workers" : "slots",
                p.value, (o == 'd' || o == 'l') ? "number" : "whole number", max);
        return 2;
      }
    }
    switch (o) {
    case 'n': a->jobs = (long)v; break;
    case 'd': a->days = v; break;
    case 's': a->seed = (uint64_t)v; break;
    case 'l': a->load = v; break;
    case 'w': a->workers = (uint32_t)v; break;
    case 'g': a->slots = (uint32_t)v; break;
    case 'o': a->out = p.value; break;
    }
  }
  if (o != LT_CLI_ARGS_END) return p.status;
  return -1;
}

/* A tenant's favourite model: a fixed hash of its index, so it does not consume random numbers. */
static uint64_t mix_fav(uint64_t x) {
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
  return x ^ (x >> 33);
}

/* Draws the jobs: tenants, then per job (in arrival order) class, GPUs, duration and model, each
 * tenant having a favourite model it uses 80% of the time. */
static uint32_t gen_draw(rng_t *r, const gen_args_t *a, gen_job_t *jobs, uint32_t *owner) {
  uint32_t nt = gen_tenants(r, a->jobs, owner);
  gen_arrivals(r, jobs, a->jobs, a->days);
  for (long i = 0; i < a->jobs; i++) {
    gen_job_t *j = &jobs[i];
    j->tenant = owner[i];
    double u = rng_unit(r);
    j->cls = u < 0.15 ? 0 : u < 0.75 ? 1 : 2;
    j->gpus = gen_gpus(r);
    j->duration = gen_duration(r);
    uint32_t fav = (uint32_t)(mix_fav(j->tenant) % 8);
    j->model = rng_unit(r) < 0.8 ? fav : (uint32_t)(rng_u64(r) % 8);
  }
  return nt;
}

/* Writes the trace; durations scaled by k (--load). 0, or 1 after saying why not. A file is
 * written aside and renamed into place once whole: a failed write leaves the old one, and no
 * trace cut short that would still read as one. */
static int gen_write(const gen_args_t *a, const gen_job_t *jobs, double k) {
  char tmp[4200];
  struct stat st; /* aside only for a file or none: a pipe, a device or a link is written in place */
  bool aside = a->out && (lstat(a->out, &st) != 0 ? errno == ENOENT : S_ISREG(st.st_mode));
  if (aside) snprintf(tmp, sizeof tmp, "%s.tmp.%d", a->out, (int)getpid());
  FILE *f = a->out ? fopen(aside ? tmp : a->out, "w") : stdout;
  if (!f) {
    fprintf(stderr, "lathe sim gen: cannot write %s: %s\n", a->out, strerror(errno));
    return 1;
  }
  int why = fputs("arrival_s,tenant,class,gpus,duration_s,base_model\n", f) < 0 ? errno : 0;
  for (long i = 0; i < a->jobs; i++) {
    const gen_job_t *j = &jobs[i];
    double d = round(j->duration * k);
    if (fprintf(f, "%.1f,t%04u,%s,%u,%.0f,%s\n", j->arrival, j->tenant, gen_classes[j->cls], j->gpus,
                d < 1 ? 1 : d, gen_models[j->model]) < 0 && !why)
      why = errno;
  }
  errno = 0;
  int bad = ferror(f);
  if (a->out) bad |= fclose(f);
  else bad |= fflush(f);
  if (!why) why = errno;
  if (!bad && aside && rename(tmp, a->out) != 0) bad = 1, why = errno;
  if (bad) {
    fprintf(stderr, "lathe sim gen: writing %s failed: %s\n", a->out ? a->out : "stdout",
            why ? strerror(why) : "an I/O error");
    if (aside) unlink(tmp);
    return 1;
  }
  return 0;
}

int lt_cli_sim_gen(int argc, char **argv) {
  gen_args_t a;
  int rc = gen_parse(argc, argv, &a);
  if (rc >= 0) return rc;
  gen_job_t *jobs = calloc((size_t)a.jobs, sizeof *jobs);
  uint32_t *owner = calloc((size_t)a.jobs, sizeof *owner);
  if (!jobs || !owner) {
    fprintf(stderr, "lathe sim gen: out of memory for %ld jobs\n", a.jobs);
    free(jobs);
    free(owner);
    return 1;
  }
  rng_t r = {.x = a.seed};
  uint32_t nt = gen_draw(&r, &a, jobs, owner);
  double k = 1, gpu_s = 0;
  for (long i = 0; i < a.jobs; i++) /* what the fleet can run: jobs that fit on a worker */
    if (jobs[i].gpus <= a.slots) gpu_s += jobs[i].gpus * jobs[i].duration;
  if (a.load > 0 && gpu_s <= 0) {
    fprintf(stderr, "lathe sim gen: --load: no job of the trace fits on a worker of %u slots, so none can be "
            "scaled to it\n", a.slots);
    free(jobs);
    free(owner);
    return 2;
  }
  if (a.load > 0) k = a.load * a.workers * a.slots * a.days * 86400.0 / gpu_s;
  rc = gen_write(&a, jobs, k);
  if (rc == 0)
    fprintf(stderr,
            "lathe sim gen: %ld jobs, %u tenants over %g days, seed %llu; offered load %.2f of "
            "%u workers x %u slots%s\n",
            a.jobs, nt, a.days, (unsigned long long)a.seed,
            gpu_s * k / ((double)a.workers * a.slots * a.days * 86400.0), a.workers, a.slots,
            a.load > 0 ? " (durations scaled to it)" : "");
  free(jobs);
  free(owner);
  return rc;
}
