/* bench_util: what the benchmarks share — their LATHE_BENCH_* settings, a monotonic clock,
 * medians, and the CPU time of this process and of a local server process (the Kafka broker's or
 * the S3 server's JVM), so a benchmark can say whose CPU a cost is. Header-only, for bench/ and
 * the GPU benches of tests/gpu. */
#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* An integer setting from the environment (LATHE_BENCH_*), def when unset or empty. */
static inline int bench_env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v && *v ? atoi(v) : def;
}

/* Seconds of the monotonic clock (durations). */
static inline double bench_now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* qsort's comparison of doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n) (sorts v). */
static inline double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* A fresh directory /tmp/lt_bench_<tag>_XXXXXX into root, and the paths root/model and root/work
 * into model and work (n bytes each; work is made, the model's writer makes model); false when a
 * directory cannot be made. */
static inline bool bench_workspace(const char *tag, char *root, size_t root_n, char *model, char *work, size_t n) {
  snprintf(root, root_n, "/tmp/lt_bench_%s_XXXXXX", tag);
  if (!mkdtemp(root)) return false;
  snprintf(model, n, "%s/model", root);
  snprintf(work, n, "%s/work", root);
  return mkdir(work, 0700) == 0;
}

/* Removes a benchmark's directory tree; says so when it cannot. */
static inline void bench_rm_rf(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* CPU seconds of this whole process (every thread, librdkafka's and upload threads included). */
static inline double bench_proc_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* The first process whose command line holds both needles (e.g. "java", "kafka.Kafka"); 0 if none
 * (another machine, no permission). */
static inline int bench_find_pid(const char *needle1, const char *needle2) {
  for (int pid = 2; pid < 4194304; pid++) {
    char path[64], cmd[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(cmd, 1, sizeof cmd - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
      if (!cmd[i]) cmd[i] = ' ';
    cmd[n] = '\0';
    if (strstr(cmd, needle1) && strstr(cmd, needle2)) return pid;
  }
  return 0;
}

/* CPU seconds (user + system) of process pid so far; 0 when pid is 0 or gone. */
static inline double bench_pid_cpu_s(int pid) {
  if (!pid) return 0;
  char path[64], buf[2048];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  unsigned long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2) return 0;
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

#ifdef RD_KAFKA_VERSION
/* The admin principal's properties (LATHE_KAFKA_CONFIG_DIR/admin.properties, `ops/stack env`) on
 * a raw librdkafka peer's configuration, so the peer talks to the same authenticated broker as
 * lt_bus (docs/DESIGN.md §5a). Nothing when the variable is unset. Include after rdkafka.h. */
static inline void bench_rk_auth(rd_kafka_conf_t *rc) {
  const char *dir = getenv("LATHE_KAFKA_CONFIG_DIR");
  char path[4096], line[1024], e[256];
  if (!dir || !*dir) return;
  snprintf(path, sizeof path, "%s/admin.properties", dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    char *eq = strchr(line, '=');
    if (line[0] == '#' || !eq) continue;
    *eq = '\0';
    if (rd_kafka_conf_set(rc, line, eq + 1, e, sizeof e) != RD_KAFKA_CONF_OK) fprintf(stderr, "%s: %s\n", path, e);
  }
  fclose(f);
}
#endif

#endif
