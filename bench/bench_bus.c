/* bench_bus: produce + consume of encoded StepCompleted records through lt_bus, against raw
 * librdkafka moving payloads of the same bytes in the same run, on the real broker.
 *
 *   bench_bus [N [ROUNDS]]     (defaults 100000 records, 5 rounds)
 *
 * Each round runs both sides on fresh topics (3 partitions, keyed by job id): the async
 * batched producer (acks=all, idempotent, linger 5 ms on both sides) until every delivery
 * report is in, then a read_committed consumer from the beginning until all N came back
 * (records/s over produce + consume time). The two sides of a round run back to back, in an
 * order that alternates between rounds, so each round gives one paired ratio; the figure is
 * the median of those ratios (on a shared 2-core machine single runs swing by 2x, and pairing
 * cancels most of it). The last line is `bus_vs_raw_ratio: X` (lt_bus over raw; goal >= 0.8).
 * Environment: LATHE_KAFKA_BOOTSTRAP. */
#include <librdkafka/rdkafka.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_avro.h"
#include "lt_bus.h"

#define NKEYS 64

static char err[1024];
static uint8_t payload[256];
static size_t payload_len;
static char keys[NKEYS][16];
static const char *bootstrap;

static void die(const char *what) {
  fprintf(stderr, "bench_bus: %s: %s\n", what, err);
  exit(1);
}

/* One real StepCompleted record, encoded by lt_avro: the payload both sides send. */
static void make_payload(void) {
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  if (lt_avro_registry_new(&reg, err, sizeof err) ||
      lt_avro_record_new(reg, "StepCompleted", &rec, err, sizeof err))
    die("avro");
  /* the event header is a placeholder here: lt_avro_record_stamp() writes the real one */
  static const char step[] =
      "{\"event_id\": \"\", \"occurred_at\": 0, \"producer\": \"\", \"job_id\": \"job-0123456789\","
      " \"tenant_id\": \"tenant-bench\", \"attempt\": 1, \"step\": 1234, \"total_steps\": 10000,"
      " \"loss\": 1.2345, \"learning_rate\": 1e-4, \"tokens\": 1024, \"tokens_per_s\": 81.0,"
      " \"elapsed_ms\": 123456, \"eta_ms\": 654321}";
  if (lt_avro_record_from_json(rec, step, strlen(step), err, sizeof err) ||
      lt_avro_record_stamp(rec, "worker/bench-1"))
    die("avro");
  const uint8_t *buf;
  if (lt_avro_record_encode(rec, &buf, &payload_len, err, sizeof err)) die("encode");
  if (payload_len > sizeof payload) die("payload too large");
  memcpy(payload, buf, payload_len);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
  for (int i = 0; i < NKEYS; i++) snprintf(keys[i], sizeof keys[i], "job-%04d", i);
}

/* ---------------------------------------------------------------- lt_bus side */

/* One side's figures: produce over [t0, t1], consume over [t2, t3]; checks that every byte came
 * back. Prints them and returns the records/s of produce and consume together. */
static double side_rate(const char *label, const char *side, long n, size_t bytes, double t0, double t1, double t2,
                        double t3) {
  char what[64];
  snprintf(what, sizeof what, "%s consumed wrong sizes", side);
  if (bytes != (size_t)n * payload_len) die(what);
  double secs = (t1 - t0) + (t3 - t2);
  printf("  %s produce %.0f rec/s, consume %.0f rec/s, both %.0f rec/s\n", label, n / (t1 - t0), n / (t3 - t2),
         n / secs);
  return n / secs;
}

static atomic_long bus_delivered, bus_failed;

static void bus_dr(void *opaque, const lt_bus_delivery_t *d) {
  if (d->err) atomic_fetch_add(&bus_failed, 1);
  else atomic_fetch_add(&bus_delivered, 1);
}

static double run_bus(lt_bus_conf_t *conf, const char *topic, long n) {
  lt_bus_producer_t *p;
  lt_bus_producer_opts_t o = {.delivery_cb = bus_dr};
  atomic_store(&bus_delivered, 0);
  atomic_store(&bus_failed, 0);
  if (lt_bus_producer_new(conf, &o, &p, err, sizeof err)) die("bus producer");
  double t0 = bench_now_s();
  for (long i = 0; i < n; i++) {
    lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY,
                         .key = keys[i % NKEYS], .key_size = strlen(keys[i % NKEYS]),
                         .value = payload, .value_size = payload_len};
    lt_err_t e;
    while ((e = lt_bus_produce(p, &r, NULL, err, sizeof err)) == LT_ERR_RETRIABLE) usleep(200);
    if (e) die("bus produce");
  }
  if (lt_bus_producer_flush(p, 120000, err, sizeof err)) die("bus flush");
  double t1 = bench_now_s();
  if (atomic_load(&bus_failed) || atomic_load(&bus_delivered) != n) {
    snprintf(err, sizeof err, "%ld delivered, %ld failed", atomic_load(&bus_delivered),
             atomic_load(&bus_failed));
    die("bus delivery");
  }
  lt_bus_producer_destroy(p, 1000);

  lt_bus_consumer_t *c;
  if (lt_bus_consumer_new(conf, NULL, &c, err, sizeof err)) die("bus consumer");
  double t2 = bench_now_s();
  if (lt_bus_consumer_assign_topic(c, topic, LT_BUS_OFFSET_BEGINNING, 10000, NULL, err,
                                   sizeof err))
    die("bus assign");
  long got = 0;
  size_t bytes = 0;
  while (got < n) {
    const lt_bus_msg_t *m;
    if (lt_bus_consumer_poll(c, 1000, &m, err, sizeof err) == LT_ERR_FATAL) die("bus poll");
    if (m) {
      size_t sz;
      lt_bus_msg_value(m, &sz);
      bytes += sz;
      got++;
    }
    if (bench_now_s() - t2 > 120) die("bus consume timed out");
  }
  double t3 = bench_now_s();
  lt_bus_consumer_destroy(c);
  return side_rate("lt_bus:", "bus", n, bytes, t0, t1, t2, t3);
}

/* ---------------------------------------------------------------- raw librdkafka side */

static long raw_delivered, raw_failed;

static void raw_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  if (m->err) raw_failed++;
  else raw_delivered++;
}

static rd_kafka_conf_t *raw_conf(void) {
  rd_kafka_conf_t *rc = rd_kafka_conf_new();
  rd_kafka_conf_set(rc, "bootstrap.servers", bootstrap, NULL, 0);
  bench_rk_auth(rc);
  rd_kafka_conf_set(rc, "log.connection.close", "false", NULL, 0);
  return rc;
}

static double run_raw(const char *topic, long n) {
  rd_kafka_conf_t *rc = raw_conf();
  /* The same durability settings the bus forces: a fair peer. */
  rd_kafka_conf_set(rc, "acks", "all", NULL, 0);
  rd_kafka_conf_set(rc, "enable.idempotence", "true", NULL, 0);
  rd_kafka_conf_set(rc, "linger.ms", "5", NULL, 0);
  rd_kafka_conf_set_dr_msg_cb(rc, raw_dr);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, err, sizeof err);
  if (!rk) die("raw producer");
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  raw_delivered = raw_failed = 0;
  double t0 = bench_now_s();
  for (long i = 0; i < n; i++) {
    while (rd_kafka_produce(rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, payload,
                            payload_len, keys[i % NKEYS], strlen(keys[i % NKEYS]), NULL) == -1) {
      if (rd_kafka_last_error() != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        snprintf(err, sizeof err, "%s", rd_kafka_err2str(rd_kafka_last_error()));
        die("raw produce");
      }
      rd_kafka_poll(rk, 1);
    }
    rd_kafka_poll(rk, 0);
  }
  rd_kafka_flush(rk, 120000);
  double t1 = bench_now_s();
  if (raw_failed || raw_delivered != n) {
    snprintf(err, sizeof err, "%ld delivered, %ld failed", raw_delivered, raw_failed);
    die("raw delivery");
  }
  rd_kafka_topic_destroy(rkt);
  rd_kafka_destroy(rk);

  rc = raw_conf();
  rd_kafka_conf_set(rc, "group.id", "bench-raw", NULL, 0);
  rd_kafka_conf_set(rc, "isolation.level", "read_committed", NULL, 0);
  rd_kafka_conf_set(rc, "enable.auto.commit", "false", NULL, 0);
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, rc, err, sizeof err);
  if (!rk) die("raw consumer");
  rd_kafka_poll_set_consumer(rk);
  double t2 = bench_now_s();
  const struct rd_kafka_metadata *md;
  rkt = rd_kafka_topic_new(rk, topic, NULL);
  if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) || md->topic_cnt != 1) die("raw metadata");
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(3);
  for (int i = 0; i < md->topics[0].partition_cnt; i++)
    rd_kafka_topic_partition_list_add(l, topic, md->topics[0].partitions[i].id)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(rkt);
  rd_kafka_assign(rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  long got = 0;
  size_t bytes = 0;
  while (got < n) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 1000);
    if (m) {
      if (!m->err) {
        bytes += m->len;
        got++;
      }
      rd_kafka_message_destroy(m);
    }
    if (bench_now_s() - t2 > 120) die("raw consume timed out");
  }
  double t3 = bench_now_s();
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return side_rate("raw:   ", "raw", n, bytes, t0, t1, t2, t3);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 100000;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  if (n <= 0 || rounds <= 0) {
    fprintf(stderr, "usage: bench_bus [N [ROUNDS]]\n");
    return 2;
  }
  lt_bus_conf_t *conf = lt_bus_conf_new();
  if (lt_bus_conf_from_env(conf, err, sizeof err) || lt_bus_conf_for_role(conf, "admin", err, sizeof err)) die("conf");
  char prefix[64];
  snprintf(prefix, sizeof prefix, "bench-%d-%ld.", (int)getpid(), (long)time(NULL));
  lt_bus_conf_set(conf, "lathe.topic.prefix", prefix, NULL, 0);
  bootstrap = lt_bus_conf_get(conf, "bootstrap.servers");
  make_payload();
  lt_bus_admin_t *admin;
  if (lt_bus_admin_new(conf, &admin, err, sizeof err)) die("admin");
  char **names;
  size_t nn;
  if (lt_bus_admin_list_topics(admin, 10000, &names, &nn, err, sizeof err)) {
    fprintf(stderr, "bench_bus: Kafka broker at %s is not reachable (%s): run `ops/stack up`\n",
            bootstrap, err);
    return 1;
  }
  lt_bus_admin_free_names(names);
  /* Under a new prefix the admin principal may create topics only once its ACLs exist. */
  if (getenv("LATHE_KAFKA_CONFIG_DIR") && lt_bus_admin_create_acls(admin, NULL, 30000, NULL, NULL, err, sizeof err))
    die("acls");
  printf("bench_bus: %ld StepCompleted records of %zu bytes (lt_avro-encoded), %d rounds, "
         "broker %s\n", n, payload_len, rounds, bootstrap);

  double best_bus = 0, best_raw = 0;
  double *ratios = calloc((size_t)rounds, sizeof *ratios);
  char (*made)[128] = calloc((size_t)rounds * 2, sizeof *made);
  for (int r = 0; r < rounds; r++) {
    char base[32];
    snprintf(base, sizeof base, "bus%d", r);
    lt_bus_topic_name(conf, base, made[2 * r], sizeof made[0]);
    snprintf(base, sizeof base, "raw%d", r);
    lt_bus_topic_name(conf, base, made[2 * r + 1], sizeof made[0]);
    for (int k = 0; k < 2; k++)
      if (lt_bus_admin_create_topic(admin, made[2 * r + k], 3, -1, NULL, 0, 30000, err,
                                    sizeof err))
        die("create topic");
    printf("round %d\n", r + 1);
    double b, w;
    if (r % 2 == 0) {
      w = run_raw(made[2 * r + 1], n);
      b = run_bus(conf, made[2 * r], n);
    } else {
      b = run_bus(conf, made[2 * r], n);
      w = run_raw(made[2 * r + 1], n);
    }
    ratios[r] = b / w;
    printf("  ratio %.3f\n", ratios[r]);
    if (b > best_bus) best_bus = b;
    if (w > best_raw) best_raw = w;
  }
  const char **del = calloc((size_t)rounds * 2, sizeof *del);
  for (int i = 0; i < rounds * 2; i++) del[i] = made[i];
  lt_bus_admin_delete_topics(admin, del, (size_t)rounds * 2, 30000, NULL, 0);
  free(del);
  free(made);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
  qsort(ratios, (size_t)rounds, sizeof *ratios, bench_cmp_double);
  double median = rounds % 2 ? ratios[rounds / 2]
                             : (ratios[rounds / 2 - 1] + ratios[rounds / 2]) / 2;
  printf("lt_bus best: %.0f rec/s; raw librdkafka best: %.0f rec/s (best/best %.3f); "
         "per-round ratios %.3f..%.3f\n",
         best_bus, best_raw, best_bus / best_raw, ratios[0], ratios[rounds - 1]);
  free(ratios);
  printf("bus_vs_raw_ratio: %.3f\n", median);
  return 0;
}
