/* bench_replay: control records folded per second, read back from the real broker.
 *
 * Produces J JobSubmitted records to a scratch lathe.jobs and N control records (JobAccepted,
 * JobDispatched, AttemptStarted, then CheckpointCommitted at rising steps, per job in turn) to a
 * scratch lathe.control, then reads both topics back twice through lt_bus in the same run:
 *   raw:  consume only (touch the bytes) — what the broker and librdkafka give;
 *   fold: consume and fold every record with lt_scheduler_fold (lt_proj + lt_job), i.e. what
 *         `lathe admin replay` and a scheduler taking over do.
 * Prints both rates and their ratio; the last line is `replay_records_per_s: N` (fold).
 * LATHE_BENCH_N (default 300000) sets N. Needs the local stack (ops/stack up). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_jobspec.h"
#include "lt_job_record.h"
#include "lt_scheduler.h"

#define JOBS 1000

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    lt_err_t e_ = (x);                                                                             \
    if (e_) {                                                                                      \
      fprintf(stderr, "bench_replay: %s: %s (%s)\n", #x, lt_err_name(e_), err);                     \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

static char err[1024];

static lt_err_t send_rec(lt_bus_producer_t *p, const char *topic, const char *key, lt_avro_record_t *rec) {
  const uint8_t *b;
  size_t len;
  lt_err_t e = lt_avro_record_encode(rec, &b, &len, err, sizeof err);
  if (e) return e;
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = key, .key_size = strlen(key),
                       .value = b, .value_size = len};
  for (;;) {
    e = lt_bus_produce(p, &r, NULL, err, sizeof err);
    if (e != LT_ERR_RETRIABLE) return e;
    lt_bus_producer_flush(p, 100, NULL, 0);
  }
}

/* Reads every record of both topics; returns records read, and bytes in *bytes. */
static uint64_t read_all(const lt_bus_conf_t *conf, const char *t1, const char *t2, uint64_t expect,
                         lt_scheduler_fold_t *fold, uint64_t *bytes, uint64_t *bad) {
  lt_bus_consumer_t *c;
  if (lt_bus_consumer_new(conf, NULL, &c, err, sizeof err)) return 0;
  lt_bus_tp_t tps[12];
  for (int p = 0; p < 6; p++) {
    tps[p] = (lt_bus_tp_t){t1, p, LT_BUS_OFFSET_BEGINNING};
    tps[6 + p] = (lt_bus_tp_t){t2, p, LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_consumer_assign(c, tps, 12, NULL, 0);
  uint64_t n = 0, sum = 0;
  double quiet = now_s();
  while (n < expect && now_s() - quiet < 10) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(c, 100, &m, err, sizeof err) || !m) continue;
    quiet = now_s();
    size_t len;
    const unsigned char *v = lt_bus_msg_value(m, &len);
    n++;
    if (!v) continue;
    if (fold) {
      if (lt_scheduler_fold_apply(fold, v, len, NULL, NULL, NULL, 0)) (*bad)++;
    } else {
      sum += len + v[len - 1];
    }
  }
  *bytes = sum;
  lt_bus_consumer_destroy(c);
  return n;
}

int main(void) {
  const char *ns = getenv("LATHE_BENCH_N");
  uint64_t N = ns ? strtoull(ns, NULL, 10) : 300000;
  lt_bus_conf_t *conf = lt_bus_conf_new();
  CHECK(lt_bus_conf_from_env(conf, err, sizeof err));
  char prefix[96];
  snprintf(prefix, sizeof prefix, "lt-bench-replay-%d-%ld.", (int)getpid(), (long)time(NULL));
  CHECK(lt_bus_conf_set(conf, "lathe.topic.prefix", prefix, err, sizeof err));
  lt_bus_admin_t *admin;
  CHECK(lt_bus_admin_new(conf, &admin, err, sizeof err));
  char tj[200], tc[200];
  lt_bus_topic_name(conf, "jobs", tj, sizeof tj);
  lt_bus_topic_name(conf, "control", tc, sizeof tc);
  CHECK(lt_bus_admin_create_topic(admin, tj, 6, -1, NULL, 0, 30000, err, sizeof err));
  CHECK(lt_bus_admin_create_topic(admin, tc, 6, -1, NULL, 0, 30000, err, sizeof err));
  lt_avro_registry_t *reg;
  CHECK(lt_avro_registry_new(&reg, err, sizeof err));
  lt_bus_producer_t *p;
  CHECK(lt_bus_producer_new(conf, NULL, &p, err, sizeof err));
  lt_avro_record_t *sub, *acc, *disp, *start, *ckpt;
  CHECK(lt_avro_record_new(reg, "JobSubmitted", &sub, err, sizeof err));
  CHECK(lt_avro_record_new(reg, "JobAccepted", &acc, err, sizeof err));
  CHECK(lt_avro_record_new(reg, "JobDispatched", &disp, err, sizeof err));
  CHECK(lt_avro_record_new(reg, "AttemptStarted", &start, err, sizeof err));
  CHECK(lt_avro_record_new(reg, "CheckpointCommitted", &ckpt, err, sizeof err));
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  snprintf(spec.base_model, sizeof spec.base_model, "llama-bench");
  snprintf(spec.dataset_id, sizeof spec.dataset_id, "ds-bench");
  spec.max_duration_s = 3600;
  spec.gpus = 1;
  char id[32];
  double t0 = now_s();
  for (int j = 0; j < JOBS; j++) {
    snprintf(id, sizeof id, "job-%05d", j);
    lt_avro_record_stamp(sub, "bench");
    lt_avro_set_string(sub, "job_id", id);
    lt_avro_set_string(sub, "tenant_id", "bench");
    CHECK(lt_jobspec_to_record(&spec, sub, err, sizeof err));
    CHECK(send_rec(p, tj, id, sub));
  }
  lt_avro_record_t *first[3] = {acc, disp, start};
  for (uint64_t i = 0; i < N; i++) {
    int j = (int)(i % JOBS);
    uint64_t round = i / JOBS;
    snprintf(id, sizeof id, "job-%05d", j);
    lt_avro_record_t *r = round < 3 ? first[round] : ckpt;
    lt_avro_record_stamp(r, "bench");
    lt_avro_set_string(r, "job_id", id);
    lt_avro_set_string(r, "tenant_id", "bench");
    if (r != acc) lt_avro_set_int(r, "attempt", 1);
    if (r == disp) {
      lt_avro_set_string(r, "worker_id", "w-bench");
      CHECK(lt_jobspec_to_record(&spec, r, err, sizeof err));
    }
    if (r == start) lt_avro_set_string(r, "worker_id", "w-bench");
    if (r == ckpt) {
      char key[128];
      snprintf(key, sizeof key, "staging/bench/%s/1/%" PRIu64 "/state", id, round);
      lt_avro_set_long(r, "step", (int64_t)round * 10);
      lt_avro_array_clear(r, "object_keys");
      lt_avro_array_append_string(r, "object_keys", key);
      lt_avro_set_string(r, "sha256", "0000000000000000000000000000000000000000000000000000000000000000");
      lt_avro_set_long(r, "bytes", 1 << 20);
      lt_avro_set_string(r, "trigger", "interval");
    }
    CHECK(send_rec(p, tc, id, r));
  }
  CHECK(lt_bus_producer_flush(p, 120000, err, sizeof err));
  double t_prod = now_s() - t0;
  uint64_t total = N + JOBS;
  printf("produced: %" PRIu64 " records (%d JobSubmitted + %" PRIu64 " control) in %.2f s\n", total, JOBS, N, t_prod);

  uint64_t bytes = 0, bad = 0;
  t0 = now_s();
  uint64_t n_raw = read_all(conf, tj, tc, total, NULL, &bytes, &bad);
  double t_raw = now_s() - t0;
  lt_scheduler_fold_t *fold;
  CHECK(lt_scheduler_fold_new(reg, 0, &fold, err, sizeof err));
  t0 = now_s();
  uint64_t n_fold = read_all(conf, tj, tc, total, fold, &bytes, &bad);
  double t_fold = now_s() - t0;
  char digest[65];
  lt_job_digest(lt_proj_jobs(lt_scheduler_fold_proj(fold)), digest);
  double r_raw = (double)n_raw / t_raw, r_fold = (double)n_fold / t_fold;
  printf("raw consume:  %" PRIu64 " records in %.3f s = %.0f records/s\n", n_raw, t_raw, r_raw);
  printf("consume+fold: %" PRIu64 " records in %.3f s = %.0f records/s (failed to fold: %" PRIu64 ")\n", n_fold,
         t_fold, r_fold, bad);
  printf("fold/raw ratio: %.2f\n", r_fold / r_raw);
  printf("jobs: %zu, digest %s\n", lt_job_count(lt_proj_jobs(lt_scheduler_fold_proj(fold))), digest);
  const char *del[2] = {tj, tc};
  lt_bus_admin_delete_topics(admin, del, 2, 30000, NULL, 0);
  lt_scheduler_fold_destroy(fold);
  lt_avro_record_destroy(sub);
  lt_avro_record_destroy(acc);
  lt_avro_record_destroy(disp);
  lt_avro_record_destroy(start);
  lt_avro_record_destroy(ckpt);
  lt_bus_producer_destroy(p, 1000);
  lt_avro_registry_destroy(reg);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
  printf("replay_records_per_s: %.0f\n", r_fold);
  return n_fold == total && n_raw == total ? 0 : 1;
}
