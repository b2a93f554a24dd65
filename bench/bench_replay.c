/* bench_replay: control records folded per second, read back from the real broker.
 *
 * Produces J JobSubmitted records to a scratch lathe.jobs and N control records (JobAccepted,
 * JobDispatched, AttemptStarted, then CheckpointCommitted at rising steps, per job in turn) to a
 * scratch lathe.control, then, in each of R rounds, reads both topics back through lt_bus twice
 * (in an order that alternates between rounds):
 *   raw:  consume only (touch the bytes) — what the broker and librdkafka give;
 *   fold: consume and fold every record with lt_proj_fold (lt_proj + lt_job), i.e. what
 *         `lathe admin replay` and a scheduler taking over do.
 * Then the same bytes (kept at produce time) are folded from memory, with no broker, F times:
 * the fold's own ceiling, in records per wall second and per CPU second of the folding thread,
 * and the heap allocations it makes per record (malloc/calloc/realloc are counted by wrappers
 * in this program; 0 is the goal, docs/STYLE.md habit 5).
 * Prints per-round rates, medians and the median of the per-round fold/raw ratios (the machine
 * is shared: pairing cancels most of its swings); the last line is `replay_records_per_s: N`
 * (median consume+fold rate). LATHE_BENCH_N (default 300000) sets N, LATHE_BENCH_ROUNDS
 * (default 3) R. Needs the local stack (ops/stack up). */
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_jobspec.h"
#include "lt_job_record.h"
#include "lt_scheduler.h"

#define JOBS 1000

/* Heap calls counted process-wide (librdkafka's threads included: the in-memory fold runs with
 * no client alive). glibc's __libc_* are the real allocator. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static atomic_ulong heap_calls;
void *malloc(size_t n) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __libc_realloc(p, n);
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* Client and broker CPU of one pass, in microseconds per record. */
typedef struct {
  double c0, b0;
} cpu_mark_t;
static int g_broker;
static cpu_mark_t cpu_mark(void) { return (cpu_mark_t){bench_proc_cpu_s(), bench_pid_cpu_s(g_broker)}; }
static void cpu_since(cpu_mark_t m, uint64_t n, double *client_us, double *broker_us) {
  *client_us = n ? (bench_proc_cpu_s() - m.c0) * 1e6 / (double)n : 0;
  *broker_us = n && g_broker ? (bench_pid_cpu_s(g_broker) - m.b0) * 1e6 / (double)n : 0;
}

/* Every message produced, in produce order, for the in-memory fold. */
typedef struct {
  uint8_t *bytes;
  size_t len, cap;
  size_t *off; /* start of message i; off[count] = len */
  size_t count, ocap;
} kept_t;

static kept_t kept;

static void keep(const uint8_t *b, size_t len) {
  if (kept.len + len > kept.cap) {
    kept.cap = kept.cap ? kept.cap * 2 : 1 << 20;
    kept.bytes = realloc(kept.bytes, kept.cap);
  }
  if (kept.count + 2 > kept.ocap) {
    kept.ocap = kept.ocap ? kept.ocap * 2 : 1 << 16;
    kept.off = realloc(kept.off, kept.ocap * sizeof *kept.off);
  }
  if (!kept.bytes || !kept.off) abort();
  kept.off[kept.count++] = kept.len;
  memcpy(kept.bytes + kept.len, b, len);
  kept.len += len;
  kept.off[kept.count] = kept.len;
}

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
  keep(b, len);
  if (!p) return LT_OK;
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
                         lt_proj_t *fold, uint64_t *bytes, uint64_t *bad) {
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
      if (lt_proj_fold(fold, v, len, NULL, NULL, NULL, 0)) (*bad)++;
    } else {
      sum += len + v[len - 1];
    }
  }
  *bytes = sum;
  lt_bus_consumer_destroy(c);
  return n;
}

/* The peer: librdkafka alone, same broker, same partitions, same isolation level (lt_bus forces
 * read_committed). batch = 0: rd_kafka_consumer_poll per message, as lt_bus_consumer_poll does;
 * batch > 0: rd_kafka_consume_batch_queue, `batch` messages per call. */
static uint64_t read_raw_rdkafka(const char *bootstrap, const char *t1, const char *t2, uint64_t expect, int batch,
                                 uint64_t *bytes) {
  char e[512];
  rd_kafka_conf_t *rc = rd_kafka_conf_new();
  if (rd_kafka_conf_set(rc, "bootstrap.servers", bootstrap, e, sizeof e) ||
      rd_kafka_conf_set(rc, "group.id", "bench-replay-raw", e, sizeof e) ||
      rd_kafka_conf_set(rc, "enable.auto.commit", "false", e, sizeof e) ||
      rd_kafka_conf_set(rc, "isolation.level", "read_committed", e, sizeof e)) {
    fprintf(stderr, "bench_replay: rdkafka conf: %s\n", e);
    return 0;
  }
  /* LATHE_BENCH_RK_CONF="name=value,name=value": extra settings for the peer (fetch tuning) */
  const char *extra = getenv("LATHE_BENCH_RK_CONF");
  if (extra && *extra) {
    char list[1024], *save = NULL;
    snprintf(list, sizeof list, "%s", extra);
    for (char *kv = strtok_r(list, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
      char *eq = strchr(kv, '=');
      if (!eq) continue;
      *eq = '\0';
      if (rd_kafka_conf_set(rc, kv, eq + 1, e, sizeof e)) fprintf(stderr, "bench_replay: %s: %s\n", kv, e);
    }
  }
  /* Configured as lt_bus configures its consumers, so the peer differs only in the code path:
   * the same local queue bound, and the partitions' leaders learnt before assign. */
  if (rd_kafka_conf_set(rc, "queued.min.messages", "1000000", e, sizeof e)) {
    fprintf(stderr, "bench_replay: rdkafka conf: %s\n", e);
    return 0;
  }
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, rc, e, sizeof e);
  if (!rk) return 0;
  rd_kafka_poll_set_consumer(rk);
  const char *topics[2] = {t1, t2};
  for (int t = 0; t < 2; t++) {
    rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topics[t], NULL);
    const struct rd_kafka_metadata *md = NULL;
    if (rkt && rd_kafka_metadata(rk, 0, rkt, &md, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR) rd_kafka_metadata_destroy(md);
    if (rkt) rd_kafka_topic_destroy(rkt);
  }
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(12);
  for (int p = 0; p < 6; p++) {
    rd_kafka_topic_partition_list_add(l, t1, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_topic_partition_list_add(l, t2, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
  }
  rd_kafka_assign(rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_queue_t *q = rd_kafka_queue_get_consumer(rk);
  rd_kafka_message_t *ms[1024];
  uint64_t n = 0, sum = 0;
  double quiet = now_s();
  if (batch > 1024) batch = 1024;
  while (n < expect && now_s() - quiet < 10) {
    ssize_t got;
    if (batch > 0) {
      got = rd_kafka_consume_batch_queue(q, 100, ms, (size_t)batch);
    } else {
      ms[0] = rd_kafka_consumer_poll(rk, 100);
      got = ms[0] ? 1 : 0;
    }
    for (ssize_t i = 0; i < got; i++) {
      rd_kafka_message_t *m = ms[i];
      if (!m->err) {
        quiet = now_s();
        n++;
        if (m->payload && m->len) sum += m->len + ((const uint8_t *)m->payload)[m->len - 1];
      }
      rd_kafka_message_destroy(m);
    }
  }
  *bytes = sum;
  rd_kafka_queue_destroy(q);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return n;
}

int main(void) {
  const char *ns = getenv("LATHE_BENCH_N"), *rs = getenv("LATHE_BENCH_ROUNDS");
  uint64_t N = ns ? strtoull(ns, NULL, 10) : 300000;
  int R = rs ? atoi(rs) : 3; /* 0: the in-memory fold only, nothing sent (for profilers) */
  if (R < 0 || R > 50) R = 3;
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
  lt_bus_producer_t *p = NULL;
  if (R > 0) CHECK(lt_bus_producer_new(conf, NULL, &p, err, sizeof err));
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
  if (p) CHECK(lt_bus_producer_flush(p, 120000, err, sizeof err));
  double t_prod = now_s() - t0;
  uint64_t total = N + JOBS;
  printf("produced: %" PRIu64 " records (%d JobSubmitted + %" PRIu64 " control) in %.2f s\n", total, JOBS, N, t_prod);

  if (p) lt_bus_producer_destroy(p, 1000);
  p = NULL;

  uint64_t bytes = 0, bad = 0, n_raw = 0, n_fold = 0;
  double r_raw[50], r_fold[50], ratio[50];
  char digest[65] = "", digest0[65] = "";
  bool digests_agree = true;
  size_t njobs = 0;
  const char *bootstrap = getenv("LATHE_KAFKA_BOOTSTRAP");
  if (!bootstrap) bootstrap = "127.0.0.1:9092";
  double r_rk[50], r_rkb[50];
  /* CPU per record: [0] librdkafka poll, [1] librdkafka batch, [2] lt_bus, [3] lt_bus + fold;
   * client (this process) and broker */
  double cu[4][50], bu[4][50];
  g_broker = bench_find_pid("java", "kafka.Kafka");
  for (int round = 0; round < R; round++) {
    double t_raw = 0, t_fold = 0;
    uint64_t n_rk, n_rkb;
    t0 = now_s();
    cpu_mark_t cm = cpu_mark();
    n_rk = read_raw_rdkafka(bootstrap, tj, tc, total, 0, &bytes);
    r_rk[round] = (double)n_rk / (now_s() - t0);
    cpu_since(cm, n_rk, &cu[0][round], &bu[0][round]);
    t0 = now_s();
    cm = cpu_mark();
    n_rkb = read_raw_rdkafka(bootstrap, tj, tc, total, 1000, &bytes);
    r_rkb[round] = (double)n_rkb / (now_s() - t0);
    cpu_since(cm, n_rkb, &cu[1][round], &bu[1][round]);
    if (n_rk != total || n_rkb != total) fprintf(stderr, "bench_replay: rdkafka peer read %" PRIu64 " / %" PRIu64 "\n", n_rk, n_rkb);
    for (int side = 0; side < 2; side++) {
      bool do_fold = (side == 0) == (round % 2 == 1); /* raw first in even rounds */
      if (!do_fold) {
        t0 = now_s();
        cpu_mark_t cm2 = cpu_mark();
        n_raw = read_all(conf, tj, tc, total, NULL, &bytes, &bad);
        t_raw = now_s() - t0;
        cpu_since(cm2, n_raw, &cu[2][round], &bu[2][round]);
      } else {
        lt_proj_t *fold;
        CHECK(lt_proj_new(reg, &fold, err, sizeof err));
        t0 = now_s();
        cpu_mark_t cm2 = cpu_mark();
        n_fold = read_all(conf, tj, tc, total, fold, &bytes, &bad);
        t_fold = now_s() - t0;
        cpu_since(cm2, n_fold, &cu[3][round], &bu[3][round]);
        lt_job_digest(lt_proj_jobs(fold), digest);
        njobs = lt_job_count(lt_proj_jobs(fold));
        if (round == 0) memcpy(digest0, digest, sizeof digest);
        else if (strcmp(digest, digest0) != 0) digests_agree = false;
        lt_proj_destroy(fold);
      }
    }
    r_raw[round] = (double)n_raw / t_raw;
    r_fold[round] = (double)n_fold / t_fold;
    ratio[round] = r_fold[round] / r_raw[round];
    printf("round %d: librdkafka poll %.0f, librdkafka batch %.0f, lt_bus consume %.0f, lt_bus consume+fold %.0f "
           "records/s; fold/consume %.2f\n", round + 1, r_rk[round], r_rkb[round], r_raw[round], r_fold[round], ratio[round]);
    fflush(stdout);
  }

  /* The fold alone, from memory: fresh projection each pass, same bytes in produce order. */
  int F = 5;
  double m_wall[5], m_cpu[5];
  unsigned long calls = 0, steady_calls = 0;
  size_t steady_n = 0;
  char digest_mem[65] = "";
  for (int f = 0; f < F; f++) {
    lt_proj_t *fold;
    CHECK(lt_proj_new(reg, &fold, err, sizeof err));
    /* Heap calls are read at the start of the steady state: after every job's JobSubmitted,
     * first three control records and first checkpoint (which make its state). */
    size_t warm = (size_t)JOBS * 5 < kept.count ? (size_t)JOBS * 5 : kept.count;
    unsigned long c0 = atomic_load(&heap_calls), c1 = c0;
    double w0 = now_s(), c_0 = cpu_s();
    for (size_t i = 0; i < kept.count; i++) {
      if (i == warm) c1 = atomic_load(&heap_calls);
      if (lt_proj_fold(fold, kept.bytes + kept.off[i], kept.off[i + 1] - kept.off[i], NULL, NULL, NULL, 0))
        bad++;
    }
    m_wall[f] = (double)kept.count / (now_s() - w0);
    m_cpu[f] = (double)kept.count / (cpu_s() - c_0);
    if (f == 0) {
      calls = atomic_load(&heap_calls) - c0;
      steady_calls = atomic_load(&heap_calls) - c1;
      steady_n = kept.count - warm;
    }
    njobs = lt_job_count(lt_proj_jobs(fold));
    lt_job_digest(lt_proj_jobs(fold), digest_mem);
    lt_proj_destroy(fold);
  }
  double med_wall = bench_median(m_wall, F), med_cpu = bench_median(m_cpu, F);

  double med_raw = R ? bench_median(r_raw, R) : 0, med_fold = R ? bench_median(r_fold, R) : 0, med_ratio = R ? bench_median(ratio, R) : 0;
  double la[3] = {0};
  FILE *lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
    fclose(lf);
  }
  printf("in-memory fold (no broker, %zu records, median of %d): %.0f records/s wall, %.0f records/s per CPU "
         "second\n",
         kept.count, F, med_wall, med_cpu);
  printf("heap calls (malloc/calloc/realloc) of the in-memory fold: %.3f per record in steady state (%lu over "
         "%zu records), %.2f per record overall (%lu, jobs' creation included)\n",
         steady_n ? (double)steady_calls / (double)steady_n : 0.0, steady_calls, steady_n,
         (double)calls / (double)kept.count, calls);
  if (R) {
    double med_rk = bench_median(r_rk, R), med_rkb = bench_median(r_rkb, R);
    printf("librdkafka alone, rd_kafka_consumer_poll (median of %d): %.0f records/s\n", R, med_rk);
    printf("librdkafka alone, rd_kafka_consume_batch_queue x1000 (median of %d): %.0f records/s\n", R, med_rkb);
    static const char *const what[4] = {"librdkafka poll", "librdkafka batch", "lt_bus consume", "lt_bus consume+fold"};
    printf("CPU per record, median of %d (client = this process, all threads; broker = %s):\n", R,
           g_broker ? "the kafka.Kafka JVM" : "not found");
    for (int k = 0; k < 4; k++)
      printf("  %-20s client %.2f us, broker %.2f us\n", what[k], bench_median(cu[k], R), bench_median(bu[k], R));
  }
  printf("raw consume through lt_bus (median of %d):  %.0f records/s\n", R, med_raw);
  printf("consume+fold (median of %d): %.0f records/s (failed to fold: %" PRIu64 ")\n", R, med_fold, bad);
  printf("fold/raw ratio (median of per-round ratios): %.2f\n", med_ratio);
  if (R == 0) memcpy(digest0, digest_mem, sizeof digest0);
  printf("jobs: %zu, digest %s (rounds %s; in-memory fold %s)\n", njobs, digest0,
         digests_agree ? "agree" : "DISAGREE", strcmp(digest_mem, digest0) == 0 ? "agrees" : "DIFFERS");
  printf("load average at the end: %.2f %.2f %.2f on %ld CPUs\n", la[0], la[1], la[2], sysconf(_SC_NPROCESSORS_ONLN));
  const char *del[2] = {tj, tc};
  lt_bus_admin_delete_topics(admin, del, 2, 30000, NULL, 0);
  lt_avro_record_destroy(sub);
  lt_avro_record_destroy(acc);
  lt_avro_record_destroy(disp);
  lt_avro_record_destroy(start);
  lt_avro_record_destroy(ckpt);
  lt_avro_registry_destroy(reg);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
  free(kept.bytes);
  free(kept.off);
  printf("replay_records_per_s: %.0f\n", med_fold);
  return R == 0 || (n_fold == total && n_raw == total && digests_agree) ? 0 : 1;
}
