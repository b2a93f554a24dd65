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
 * and the heap allocations it makes per record (malloc/calloc/realloc of Lathe's code, jansson and
 * avro-c, counted through -Wl,--wrap and the libraries' allocator hooks; 0 is the goal,
 * docs/STYLE.md habit 5).
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

#include <avro.h>
#include <jansson.h>

#include "bench_util.h"
#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_jobspec.h"
#include "lt_job_record.h"
#include "lt_scheduler.h"

#define JOBS 1000

/* Heap calls counted without replacing the allocator: bench/meson.build links this program with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc, so Lathe's own code (liblathe, ltcontrol,
 * linked statically) calls the __wrap_ functions below; jansson and avro-c, shared libraries,
 * are given the same counting functions through their allocator hooks at the start of main.
 * librdkafka's allocations are not counted (no client is alive during the in-memory fold). */
void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
static atomic_ulong heap_calls;
void *__wrap_malloc(size_t n) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __real_malloc(n);
}
void *__wrap_calloc(size_t a, size_t b) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __real_calloc(a, b);
}
void *__wrap_realloc(void *p, size_t n) {
  atomic_fetch_add_explicit(&heap_calls, 1, memory_order_relaxed);
  return __real_realloc(p, n);
}

/* avro-c's allocator: realloc-like, nsize 0 frees. */
static void *avro_counted(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud, (void)osize;
  if (nsize) return __wrap_realloc(ptr, nsize);
  free(ptr);
  return NULL;
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

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    lt_err_t e_ = (x);                                                                             \
    if (e_) {                                                                                      \
      fprintf(stderr, "bench_replay: %s: %s (%s)\n", #x, lt_err_name(e_), err);                     \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

/* In a phase of main: a failure is returned to main, whose CHECK reports it. */
#define PCHECK(x)                                                                                  \
  do {                                                                                             \
    lt_err_t e_ = (x);                                                                             \
    if (e_) return e_;                                                                             \
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
  double quiet = bench_now_s();
  while (n < expect && bench_now_s() - quiet < 10) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(c, 100, &m, err, sizeof err) || !m) continue;
    quiet = bench_now_s();
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
  bench_rk_auth(rc);
  if (rd_kafka_conf_set(rc, "bootstrap.servers", bootstrap, e, sizeof e) ||
      rd_kafka_conf_set(rc, "group.id", t1, e, sizeof e) || /* under the run's prefix */
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
  double quiet = bench_now_s();
  if (batch > 1024) batch = 1024;
  while (n < expect && bench_now_s() - quiet < 10) {
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
        quiet = bench_now_s();
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

/* Produces JOBS JobSubmitted to tj and N control records to tc (p NULL: only kept in memory, by
 * send_rec): per job in turn JobAccepted, JobDispatched, AttemptStarted, then CheckpointCommitted
 * at rising steps. */
static lt_err_t produce_all(lt_bus_producer_t *p, lt_avro_registry_t *reg, const char *tj, const char *tc,
                            uint64_t N) {
  lt_avro_record_t *sub, *acc, *disp, *start, *ckpt;
  PCHECK(lt_avro_record_new(reg, "JobSubmitted", &sub, err, sizeof err));
  PCHECK(lt_avro_record_new(reg, "JobAccepted", &acc, err, sizeof err));
  PCHECK(lt_avro_record_new(reg, "JobDispatched", &disp, err, sizeof err));
  PCHECK(lt_avro_record_new(reg, "AttemptStarted", &start, err, sizeof err));
  PCHECK(lt_avro_record_new(reg, "CheckpointCommitted", &ckpt, err, sizeof err));
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  snprintf(spec.base_model, sizeof spec.base_model, "llama-bench");
  snprintf(spec.dataset_id, sizeof spec.dataset_id, "ds-bench");
  spec.max_duration_s = 3600;
  spec.gpus = 1;
  char id[32];
  for (int j = 0; j < JOBS; j++) {
    snprintf(id, sizeof id, "job-%05d", j);
    lt_avro_record_stamp(sub, "bench");
    lt_avro_set_string(sub, "job_id", id);
    lt_avro_set_string(sub, "tenant_id", "bench");
    PCHECK(lt_jobspec_to_record(&spec, sub, err, sizeof err));
    PCHECK(send_rec(p, tj, id, sub));
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
      PCHECK(lt_jobspec_to_record(&spec, r, err, sizeof err));
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
    PCHECK(send_rec(p, tc, id, r));
  }
  lt_avro_record_destroy(sub);
  lt_avro_record_destroy(acc);
  lt_avro_record_destroy(disp);
  lt_avro_record_destroy(start);
  lt_avro_record_destroy(ckpt);
  return LT_OK;
}

/* What folding the kept bytes from memory gave (the median of MEM_PASSES passes). */
#define MEM_PASSES 5
typedef struct mem_fold {
  double wall, cpu;            /* records per wall second, per CPU second of this thread */
  unsigned long calls;         /* heap calls of the first pass */
  unsigned long steady_calls;  /* ... once every job had its state */
  size_t steady_n;             /* records folded in that steady state */
  size_t njobs;
  uint64_t bad;                /* records that did not fold */
  char digest[65];
} mem_fold_t;

/* Folds the kept records from memory, with no broker, MEM_PASSES times into fresh projections,
 * counting the heap calls of the first pass. */
static lt_err_t fold_in_memory(lt_avro_registry_t *reg, mem_fold_t *m) {
  memset(m, 0, sizeof *m);
  double m_wall[MEM_PASSES], m_cpu[MEM_PASSES];
  for (int f = 0; f < MEM_PASSES; f++) {
    lt_proj_t *fold;
    PCHECK(lt_proj_new(reg, &fold, err, sizeof err));
    /* Heap calls are read at the start of the steady state: after every job's JobSubmitted,
     * first three control records and first checkpoint (which make its state). */
    size_t warm = (size_t)JOBS * 5 < kept.count ? (size_t)JOBS * 5 : kept.count;
    unsigned long c0 = atomic_load(&heap_calls), c1 = c0;
    double w0 = bench_now_s(), c_0 = cpu_s();
    for (size_t i = 0; i < kept.count; i++) {
      if (i == warm) c1 = atomic_load(&heap_calls);
      if (lt_proj_fold(fold, kept.bytes + kept.off[i], kept.off[i + 1] - kept.off[i], NULL, NULL, NULL, 0))
        m->bad++;
    }
    m_wall[f] = (double)kept.count / (bench_now_s() - w0);
    m_cpu[f] = (double)kept.count / (cpu_s() - c_0);
    if (f == 0) {
      m->calls = atomic_load(&heap_calls) - c0;
      m->steady_calls = atomic_load(&heap_calls) - c1;
      m->steady_n = kept.count - warm;
    }
    m->njobs = lt_job_count(lt_proj_jobs(fold));
    lt_job_digest(lt_proj_jobs(fold), m->digest);
    lt_proj_destroy(fold);
  }
  m->wall = bench_median(m_wall, MEM_PASSES);
  m->cpu = bench_median(m_cpu, MEM_PASSES);
  return LT_OK;
}

int main(void) {
  const char *ns = getenv("LATHE_BENCH_N"), *rs = getenv("LATHE_BENCH_ROUNDS");
  uint64_t N = ns ? strtoull(ns, NULL, 10) : 300000;
  int R = rs ? atoi(rs) : 3; /* 0: the in-memory fold only, nothing sent (for profilers) */
  if (R < 0 || R > 50) R = 3;
  json_set_alloc_funcs(__wrap_malloc, free);
  avro_set_allocator(avro_counted, NULL);
  lt_bus_conf_t *conf = lt_bus_conf_new();
  CHECK(lt_bus_conf_from_env(conf, err, sizeof err));
  CHECK(lt_bus_conf_for_role(conf, "admin", err, sizeof err));
  char prefix[96];
  snprintf(prefix, sizeof prefix, "lt-bench-replay-%d-%ld.", (int)getpid(), (long)time(NULL));
  CHECK(lt_bus_conf_set(conf, "lathe.topic.prefix", prefix, err, sizeof err));
  lt_bus_admin_t *admin;
  CHECK(lt_bus_admin_new(conf, &admin, err, sizeof err));
  /* On an authenticated broker the admin principal may use a new prefix once its ACLs exist. */
  if (getenv("LATHE_KAFKA_CONFIG_DIR")) CHECK(lt_bus_admin_create_acls(admin, NULL, 30000, NULL, NULL, err, sizeof err));
  char tj[200], tc[200];
  lt_bus_topic_name(conf, "jobs", tj, sizeof tj);
  lt_bus_topic_name(conf, "control", tc, sizeof tc);
  CHECK(lt_bus_admin_create_topic(admin, tj, 6, -1, NULL, 0, 30000, err, sizeof err));
  CHECK(lt_bus_admin_create_topic(admin, tc, 6, -1, NULL, 0, 30000, err, sizeof err));
  lt_avro_registry_t *reg;
  CHECK(lt_avro_registry_new(&reg, err, sizeof err));
  lt_bus_producer_t *p = NULL;
  if (R > 0) CHECK(lt_bus_producer_new(conf, NULL, &p, err, sizeof err));
  double t0 = bench_now_s();
  CHECK(produce_all(p, reg, tj, tc, N));
  if (p) CHECK(lt_bus_producer_flush(p, 120000, err, sizeof err));
  double t_prod = bench_now_s() - t0;
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
    t0 = bench_now_s();
    cpu_mark_t cm = cpu_mark();
    n_rk = read_raw_rdkafka(bootstrap, tj, tc, total, 0, &bytes);
    r_rk[round] = (double)n_rk / (bench_now_s() - t0);
    cpu_since(cm, n_rk, &cu[0][round], &bu[0][round]);
    t0 = bench_now_s();
    cm = cpu_mark();
    n_rkb = read_raw_rdkafka(bootstrap, tj, tc, total, 1000, &bytes);
    r_rkb[round] = (double)n_rkb / (bench_now_s() - t0);
    cpu_since(cm, n_rkb, &cu[1][round], &bu[1][round]);
    if (n_rk != total || n_rkb != total) fprintf(stderr, "bench_replay: rdkafka peer read %" PRIu64 " / %" PRIu64 "\n", n_rk, n_rkb);
    for (int side = 0; side < 2; side++) {
      bool do_fold = (side == 0) == (round % 2 == 1); /* raw first in even rounds */
      if (!do_fold) {
        t0 = bench_now_s();
        cpu_mark_t cm2 = cpu_mark();
        n_raw = read_all(conf, tj, tc, total, NULL, &bytes, &bad);
        t_raw = bench_now_s() - t0;
        cpu_since(cm2, n_raw, &cu[2][round], &bu[2][round]);
      } else {
        lt_proj_t *fold;
        CHECK(lt_proj_new(reg, &fold, err, sizeof err));
        t0 = bench_now_s();
        cpu_mark_t cm2 = cpu_mark();
        n_fold = read_all(conf, tj, tc, total, fold, &bytes, &bad);
        t_fold = bench_now_s() - t0;
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
  mem_fold_t mem;
  CHECK(fold_in_memory(reg, &mem));
  bad += mem.bad;
  njobs = mem.njobs;

  double med_raw = R ? bench_median(r_raw, R) : 0, med_fold = R ? bench_median(r_fold, R) : 0, med_ratio = R ? bench_median(ratio, R) : 0;
  double la[3] = {0};
  FILE *lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
    fclose(lf);
  }
  printf("in-memory fold (no broker, %zu records, median of %d): %.0f records/s wall, %.0f records/s per CPU "
         "second\n",
         kept.count, MEM_PASSES, mem.wall, mem.cpu);
  printf("heap calls (malloc/calloc/realloc) of the in-memory fold: %.3f per record in steady state (%lu over "
         "%zu records), %.2f per record overall (%lu, jobs' creation included)\n",
         mem.steady_n ? (double)mem.steady_calls / (double)mem.steady_n : 0.0, mem.steady_calls, mem.steady_n,
         (double)mem.calls / (double)kept.count, mem.calls);
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
  if (R == 0) memcpy(digest0, mem.digest, sizeof digest0);
  printf("jobs: %zu, digest %s (rounds %s; in-memory fold %s)\n", njobs, digest0,
         digests_agree ? "agree" : "DISAGREE", strcmp(mem.digest, digest0) == 0 ? "agrees" : "DIFFERS");
  printf("load average at the end: %.2f %.2f %.2f on %ld CPUs\n", la[0], la[1], la[2], sysconf(_SC_NPROCESSORS_ONLN));
  const char *del[2] = {tj, tc};
  lt_bus_admin_delete_topics(admin, del, 2, 30000, NULL, 0);
  lt_avro_registry_destroy(reg);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
  free(kept.bytes);
  free(kept.off);
  printf("replay_records_per_s: %.0f\n", med_fold);
  return R == 0 || (n_fold == total && n_raw == total && digests_agree) ? 0 : 1;
}
