/* lt_cli_replay: `lathe admin replay` — rebuilds job states from lathe.jobs + lathe.control.
 *
 *   lathe admin replay [--from-beginning | --from-offset N | --from-time ISO8601] [--json] [--jobs]
 *
 * Reads both topics (read_committed) from the chosen start up to their ends as of start-up,
 * folds every record with lt_proj_fold (the same code the scheduler and the API
 * fold with), and prints the number of jobs per state and the state digest (lt_job_digest).
 * Two replays of the same log print the same digest (invariant 1). A replay that does not start
 * at the beginning sees only part of the log: control records of jobs submitted before the start
 * are not applied (they name unknown jobs), so its digest describes that window only.
 * Configuration from the environment (LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* timegm */
#endif
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_cli_args.h"
#include "lt_job.h"
#include "lt_scheduler.h"
#include "lt_time.h"

int lt_cli_admin_replay(int argc, char **argv);

#define MAX_TPS 128

static void usage(FILE *f) {
  fprintf(f, "usage: lathe admin replay [--from-beginning | --from-offset N | --from-time ISO8601] [--json] [--jobs]\n"
             "\n"
             "Rebuilds every job's state from lathe.jobs and lathe.control and prints the count of\n"
             "jobs per state and the state digest. --from-offset N starts every partition of both\n"
             "topics at offset N (past a partition's end: none of it; below its oldest record: there,\n"
             "said); --from-time at the first record at or after the time\n"
             "(e.g. 2026-11-29T10:00:00Z). --jobs adds every job's state as the digest hashes it, a\n"
             "line each (GET /debug/jobs on an api's operator port gives its own, to compare).\n"
             "Environment: LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX,\n"
             "the admin principal (LATHE_KAFKA_CONFIG_DIR/admin.properties, or LATHE_KAFKA_CONFIG).\n");
}

/* "YYYY-MM-DDTHH:MM:SS[.mmm](Z|+HH:MM|-HH:MM)" -> ms since the epoch. */
static int parse_time(const char *s, int64_t *out) {
  struct tm tm = {0};
  int ms = 0, n = 0;
  if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
             &tm.tm_sec, &n) != 6)
    return -1;
  const char *p = s + n;
  if (*p == '.') {
    p++;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
      if (digits < 3) ms = ms * 10 + (*p - '0'), digits++;
      p++;
    }
    while (digits++ < 3) ms *= 10;
  }
  int64_t off = 0;
  if (*p == 'Z') p++;
  else if (*p == '+' || *p == '-') {
    int hh, mm;
    if (sscanf(p + 1, "%2d:%2d", &hh, &mm) != 2) return -1;
    off = (int64_t)(hh * 60 + mm) * 60 * (*p == '+' ? 1 : -1);
    p += 6;
  }
  if (*p) return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  *out = ((int64_t)t - off) * 1000 + ms;
  return 0;
}

static bool count_state(const lt_job_t *j, void *ctx) {
  ((uint64_t *)ctx)[j->state]++;
  return true;
}

/* One replay: the clients, the partitions of both topics and what was folded. */
typedef struct replay {
  lt_bus_conf_t *conf;
  lt_avro_registry_t *reg;
  lt_proj_t *fold;
  lt_bus_consumer_t *c;
  char topics[2][200];
  lt_bus_tp_t tps[MAX_TPS]; /* where each partition starts */
  lt_bus_tp_t hw[MAX_TPS];  /* each partition's end as of start-up */
  int64_t low[MAX_TPS];     /* and the oldest offset it kept then */
  size_t ntps;
  uint64_t records, bad;
} replay_t;

/* Parses argv. Returns -1 to go on, else the exit status (after saying what is wrong). */
static int parse_args(int argc, char **argv, int64_t *start, int64_t *time_ms, bool *as_json, bool *job_lines) {
  enum { O_BEGINNING = 256, O_OFFSET, O_TIME, O_JSON, O_JOBS };
  static const struct option opts[] = {{"from-beginning", no_argument, NULL, O_BEGINNING},
                                       {"from-offset", required_argument, NULL, O_OFFSET},
                                       {"from-time", required_argument, NULL, O_TIME},
                                       {"json", no_argument, NULL, O_JSON},
                                       {"jobs", no_argument, NULL, O_JOBS},
                                       {0}};
  lt_cli_args_t a = {.what = "admin replay", .usage = usage, .opts = opts};
  int c;
  double d;
  while ((c = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (c == O_BEGINNING) *start = LT_BUS_OFFSET_BEGINNING;
    else if (c == O_JSON) *as_json = true;
    else if (c == O_JOBS) *job_lines = true;
    else if (c == O_OFFSET && lt_cli_args_num(&a, "--from-offset", 0, 9e18, true, &d)) *start = (int64_t)d;
    else if (c == O_OFFSET) return 2;
    else if (parse_time(a.value, time_ms))
      return lt_cli_args_fail(&a, "--from-time needs an ISO 8601 time such as 2026-11-29T10:00:00Z, not \"%s\"",
                              a.value);
  }
  return c == LT_CLI_ARGS_END ? -1 : a.status;
}

/* Lists every partition of both topics into r->tps, each starting at `from` (an offset, or a
 * time that offsets_for_times turns into one). Only this step needs an admin client. */
static lt_err_t list_partitions(replay_t *r, int64_t from, char *err, size_t n) {
  lt_bus_admin_t *admin = NULL;
  lt_err_t e = lt_bus_admin_new(r->conf, &admin, err, n);
  for (int t = 0; t < 2 && !e; t++) {
    int count = 0;
    e = lt_bus_admin_describe_topic(admin, r->topics[t], 10000, &count, err, n);
    for (int p = 0; !e && p < count && r->ntps < MAX_TPS; p++)
      r->tps[r->ntps++] = (lt_bus_tp_t){.topic = r->topics[t], .partition = p, .offset = from};
  }
  lt_bus_admin_destroy(admin);
  return e;
}

/* Connects, lists every partition of lathe.jobs and lathe.control, finds where each starts
 * (an offset, or the first record at or after time_ms) and ends, and assigns them. */
static lt_err_t replay_open(replay_t *r, int64_t start, int64_t time_ms, char *err, size_t n) {
  r->conf = lt_bus_conf_new();
  lt_err_t e = r->conf ? lt_bus_conf_from_env(r->conf, err, n) : LT_ERR_NOMEM;
  if (!e) e = lt_bus_conf_for_role(r->conf, "admin", err, n);
  if (!e) e = lt_avro_registry_new(&r->reg, err, n);
  if (!e) e = lt_proj_new(r->reg, &r->fold, err, n);
  if (e) return e;
  lt_bus_topic_name(r->conf, "jobs", r->topics[0], sizeof r->topics[0]);
  lt_bus_topic_name(r->conf, "control", r->topics[1], sizeof r->topics[1]);
  e = list_partitions(r, time_ms >= 0 ? time_ms : start, err, n);
  if (!e) e = lt_bus_consumer_new(r->conf, NULL, &r->c, err, n);
  if (!e && time_ms >= 0) e = lt_bus_consumer_offsets_for_times(r->c, r->tps, r->ntps, 10000, err, n);
  memcpy(r->hw, r->tps, r->ntps * sizeof *r->hw);
  if (!e) e = lt_bus_consumer_watermarks(r->c, r->hw, r->ntps, r->low, 10000, err, n);
  /* --from-offset N past a partition's end reads nothing of it, and below the oldest record it
   * keeps reads from that record, said: the broker answers both "out of range", which the
   * consumer's reset turned into a replay from the oldest record without a word. */
  for (size_t i = 0; !e && start >= 0 && time_ms < 0 && i < r->ntps; i++) {
    if (r->tps[i].offset > r->hw[i].offset) r->tps[i].offset = r->hw[i].offset;
    if (r->tps[i].offset >= r->low[i]) continue;
    fprintf(stderr, "lathe admin replay: %s [%d] keeps records from offset %lld only: replayed from there\n",
            r->tps[i].topic, (int)r->tps[i].partition, (long long)r->low[i]);
    r->tps[i].offset = r->low[i];
  }
  if (!e) e = lt_bus_consumer_assign(r->c, r->tps, r->ntps, err, n);
  return e;
}

/* True when every partition reached its end as of start-up. Commit markers and aborted records
 * occupy offsets read_committed never returns, so the position counts as well as the next
 * offset after the last record read. */
static bool replay_at_end(replay_t *r, const int64_t *next) {
  lt_bus_tp_t pos[MAX_TPS];
  memcpy(pos, r->tps, r->ntps * sizeof *pos);
  if (lt_bus_consumer_position(r->c, pos, r->ntps, NULL, 0) != LT_OK) return false;
  for (size_t i = 0; i < r->ntps; i++) {
    if (r->tps[i].offset == LT_BUS_OFFSET_END || r->tps[i].offset >= r->hw[i].offset) continue; /* started at its end */
    if (!lt_bus_read_to(pos[i].offset, next[i], r->low[i], r->hw[i].offset)) return false;
  }
  return true;
}

/* Folds every record up to the ends (or until a quiet second and more). */
static lt_err_t replay_read(replay_t *r, char *err, size_t n) {
  int64_t next[MAX_TPS] = {0};
  int64_t quiet_since = lt_time_mono_ms();
  for (;;) {
    const lt_bus_msg_t *m = NULL;
    lt_err_t e = lt_bus_consumer_poll(r->c, 100, &m, err, n);
    if (e == LT_ERR_RETRIABLE) e = LT_OK;
    if (e) return e;
    if (!m) {
      if (replay_at_end(r, next) || lt_time_mono_ms() - quiet_since > 2000) return LT_OK;
      continue;
    }
    quiet_since = lt_time_mono_ms();
    for (size_t i = 0; i < r->ntps; i++)
      if (r->tps[i].partition == lt_bus_msg_partition(m) && strcmp(r->tps[i].topic, lt_bus_msg_topic(m)) == 0)
        next[i] = lt_bus_msg_offset(m) + 1;
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    r->records++;
    if (v && lt_proj_fold(r->fold, v, len, NULL, NULL, NULL, 0) != LT_OK) r->bad++;
  }
}

/* Prints the jobs per state, the record counts and the state digest, as text or one JSON line. */
static void replay_print(replay_t *r, bool as_json, bool job_lines) {
  lt_job_table_t *jobs = lt_proj_jobs(r->fold);
  uint64_t count[LT_JOB__STATE_COUNT] = {0};
  char digest[65];
  lt_job_digest(jobs, digest);
  lt_job_foreach(jobs, count_state, count);
  uint64_t dropped = 0;
  size_t orphans = lt_proj_orphans(r->fold, &dropped);
  if (as_json) {
    json_t *states = json_object();
    for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
      json_object_set_new(states, lt_job_state_name((lt_job_state_t)s), json_integer((json_int_t)count[s]));
    json_t *o = json_pack("{s:I,s:o,s:I,s:I,s:I,s:s}", "jobs", (json_int_t)lt_job_count(jobs), "states", states,
                          "records", (json_int_t)r->records, "undecodable", (json_int_t)r->bad,
                          "unknown_job_records", (json_int_t)(orphans + dropped), "digest", digest);
    if (o && job_lines) json_object_set_new(o, "job_lines", lt_proj_job_lines(r->fold));
    char *text = json_dumps(o, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(o);
    return;
  }
  printf("jobs: %zu\n", lt_job_count(jobs));
  for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
    printf("  %-11s %" PRIu64 "\n", lt_job_state_name((lt_job_state_t)s), count[s]);
  printf("records: %" PRIu64 " (undecodable or not applicable: %" PRIu64 ", naming unknown jobs: %" PRIu64 ")\n",
         r->records, r->bad, (uint64_t)orphans + dropped);
  printf("digest: %s\n", digest);
  if (job_lines) {
    json_t *lines = lt_proj_job_lines(r->fold), *l;
    size_t i;
    json_array_foreach(lines, i, l) printf("%s\n", json_string_value(l));
    json_decref(lines);
  }
}

static void replay_close(replay_t *r) {
  lt_bus_consumer_destroy(r->c);
  lt_proj_destroy(r->fold);
  lt_avro_registry_destroy(r->reg);
  lt_bus_conf_destroy(r->conf);
}

int lt_cli_admin_replay(int argc, char **argv) {
  int64_t start = LT_BUS_OFFSET_BEGINNING, time_ms = -1;
  bool as_json = false, job_lines = false;
  int rc = parse_args(argc, argv, &start, &time_ms, &as_json, &job_lines);
  if (rc >= 0) return rc;
  char err[512] = "";
  replay_t r = {0};
  lt_err_t e = replay_open(&r, start, time_ms, err, sizeof err);
  if (!e) e = replay_read(&r, err, sizeof err);
  if (!e) replay_print(&r, as_json, job_lines);
  else fprintf(stderr, "lathe admin replay: %s\n", err);
  replay_close(&r);
  return e ? 1 : 0;
}
