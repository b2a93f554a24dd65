/* lt_cli_replay: `lathe admin replay` — rebuilds job states from lathe.jobs + lathe.control.
 *
 *   lathe admin replay [--from-beginning | --from-offset N | --from-time ISO8601] [--json]
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
#include "lt_job.h"
#include "lt_scheduler.h"
#include "lt_time.h"

int lt_cli_admin_replay(int argc, char **argv);

#define MAX_TPS 128

static void usage(FILE *f) {
  fprintf(f, "usage: lathe admin replay [--from-beginning | --from-offset N | --from-time ISO8601] [--json]\n"
             "\n"
             "Rebuilds every job's state from lathe.jobs and lathe.control and prints the count of\n"
             "jobs per state and the state digest. --from-offset N starts every partition of both\n"
             "topics at offset N; --from-time at the first record at or after the time\n"
             "(e.g. 2026-11-29T10:00:00Z). Environment: LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX.\n");
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

int lt_cli_admin_replay(int argc, char **argv) {
  int64_t start = LT_BUS_OFFSET_BEGINNING, time_ms = -1;
  bool as_json = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--from-beginning") == 0) start = LT_BUS_OFFSET_BEGINNING;
    else if (strcmp(argv[i], "--from-offset") == 0 && i + 1 < argc) {
      char *end;
      long long v = strtoll(argv[++i], &end, 10);
      if (*end || v < 0) {
        fprintf(stderr, "lathe admin replay: --from-offset needs an offset >= 0, not \"%s\"\n", argv[i]);
        return 2;
      }
      start = v;
    } else if (strcmp(argv[i], "--from-time") == 0 && i + 1 < argc) {
      if (parse_time(argv[++i], &time_ms)) {
        fprintf(stderr, "lathe admin replay: --from-time needs an ISO 8601 time such as 2026-11-29T10:00:00Z, "
                        "not \"%s\"\n", argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--json") == 0) as_json = true;
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "lathe admin replay: unknown argument \"%s\"\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  char err[512] = "";
  int rc = 1;
  lt_bus_conf_t *conf = lt_bus_conf_new();
  lt_avro_registry_t *reg = NULL;
  lt_proj_t *fold = NULL;
  lt_bus_admin_t *admin = NULL;
  lt_bus_consumer_t *c = NULL;
  char topics[2][200];
  lt_bus_tp_t tps[MAX_TPS], hw[MAX_TPS];
  size_t ntps = 0;
  uint64_t records = 0, bad = 0;
  lt_err_t e = conf ? lt_bus_conf_from_env(conf, err, sizeof err) : LT_ERR_NOMEM;
  if (!e) e = lt_avro_registry_new(&reg, err, sizeof err);
  if (!e) e = lt_proj_new(reg, &fold, err, sizeof err);
  if (!e) e = lt_bus_admin_new(conf, &admin, err, sizeof err);
  lt_bus_topic_name(conf, "jobs", topics[0], sizeof topics[0]);
  lt_bus_topic_name(conf, "control", topics[1], sizeof topics[1]);
  for (int t = 0; t < 2 && !e; t++) {
    int count = 0;
    e = lt_bus_admin_describe_topic(admin, topics[t], 10000, &count, err, sizeof err);
    for (int p = 0; !e && p < count && ntps < MAX_TPS; p++)
      tps[ntps++] = (lt_bus_tp_t){.topic = topics[t], .partition = p, .offset = time_ms >= 0 ? time_ms : start};
  }
  if (!e) e = lt_bus_consumer_new(conf, NULL, &c, err, sizeof err);
  if (!e && time_ms >= 0) e = lt_bus_consumer_offsets_for_times(c, tps, ntps, 10000, err, sizeof err);
  memcpy(hw, tps, ntps * sizeof *hw);
  if (!e) e = lt_bus_consumer_watermarks(c, hw, ntps, NULL, 10000, err, sizeof err);
  if (!e) e = lt_bus_consumer_assign(c, tps, ntps, err, sizeof err);
  int64_t next[MAX_TPS] = {0};
  int64_t quiet_since = lt_time_wall_ms();
  while (!e) {
    const lt_bus_msg_t *m = NULL;
    e = lt_bus_consumer_poll(c, 100, &m, err, sizeof err);
    if (e == LT_ERR_RETRIABLE) e = LT_OK;
    if (e) break;
    if (m) {
      quiet_since = lt_time_wall_ms();
      for (size_t i = 0; i < ntps; i++)
        if (tps[i].partition == lt_bus_msg_partition(m) && strcmp(tps[i].topic, lt_bus_msg_topic(m)) == 0)
          next[i] = lt_bus_msg_offset(m) + 1;
      size_t len;
      const void *v = lt_bus_msg_value(m, &len);
      records++;
      if (v && lt_proj_fold(fold, v, len, NULL, NULL, NULL, 0) != LT_OK) bad++;
      continue;
    }
    /* Done when every partition reached its end as of start-up (commit markers and aborted
     * records occupy offsets read_committed never returns: a quiet second ends it too). */
    lt_bus_tp_t pos[MAX_TPS];
    memcpy(pos, tps, ntps * sizeof *pos);
    bool done = lt_bus_consumer_position(c, pos, ntps, NULL, 0) == LT_OK;
    for (size_t i = 0; done && i < ntps; i++) {
      int64_t p = pos[i].offset >= 0 ? pos[i].offset : next[i];
      if (p < hw[i].offset && next[i] < hw[i].offset) done = false;
    }
    if (done || lt_time_wall_ms() - quiet_since > 2000) break;
  }
  if (!e) {
    lt_job_table_t *jobs = lt_proj_jobs(fold);
    uint64_t count[LT_JOB__STATE_COUNT] = {0};
    char digest[65];
    lt_job_digest(jobs, digest);
    lt_job_foreach(jobs, count_state, count);
    uint64_t dropped = 0;
    size_t orphans = lt_proj_orphans(fold, &dropped);
    if (as_json) {
      json_t *states = json_object();
      for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
        json_object_set_new(states, lt_job_state_name((lt_job_state_t)s), json_integer((json_int_t)count[s]));
      json_t *o = json_pack("{s:I,s:o,s:I,s:I,s:I,s:s}", "jobs", (json_int_t)lt_job_count(jobs), "states", states,
                            "records", (json_int_t)records, "undecodable", (json_int_t)bad, "unknown_job_records",
                            (json_int_t)(orphans + dropped), "digest", digest);
      char *text = json_dumps(o, JSON_COMPACT);
      printf("%s\n", text);
      free(text);
      json_decref(o);
    } else {
      printf("jobs: %zu\n", lt_job_count(jobs));
      for (int s = 0; s < LT_JOB__STATE_COUNT; s++)
        printf("  %-11s %" PRIu64 "\n", lt_job_state_name((lt_job_state_t)s), count[s]);
      printf("records: %" PRIu64 " (undecodable or not applicable: %" PRIu64 ", naming unknown jobs: %" PRIu64 ")\n",
             records, bad, (uint64_t)orphans + dropped);
      printf("digest: %s\n", digest);
    }
    rc = 0;
  } else {
    fprintf(stderr, "lathe admin replay: %s\n", err);
  }
  lt_bus_consumer_destroy(c);
  lt_bus_admin_destroy(admin);
  lt_proj_destroy(fold);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(conf);
  return rc;
}

