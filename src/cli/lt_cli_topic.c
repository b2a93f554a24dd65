/* lathe topic: operators' and tests' window on Lathe's topics.
 *
 *   lathe topic tail TOPIC [--from-beginning] [--max N] [--timeout-ms T]
 *   lathe topic produce TOPIC TYPE < records.jsonl
 *
 * prints every record of every partition of TOPIC decoded to JSON, one line each:
 *   {"topic":..,"partition":P,"offset":O,"timestamp":ms,"key":"..","type":"StepCompleted",
 *    "writer_version":1,"record":{...}}
 * A record that does not decode (unknown fingerprint, wrong magic, truncated body) prints
 *   {"topic":..,"partition":P,"offset":O,...,"error":"..."}
 * and tailing goes on. TOPIC is a base name ("progress", the configured prefix is added) or a
 * full name that already starts with the prefix. Reads read_committed, joins no group, commits
 * nothing. Stops after N records (--max), after T ms without a record (--timeout-ms), or on
 * SIGINT/SIGTERM; without either it follows the topic. Connection settings come from the
 * environment (LATHE_KAFKA_BOOTSTRAP, LATHE_TOPIC_PREFIX).
 *
 * `produce` encodes each JSON line on stdin as the newest version of TYPE (fields with a
 * default may be left out), keys it by its job_id (or tenant_id, worker_id) when the type has
 * one (a SessionCall goes to its session's partition of lathe.calls), and writes it with the idempotent producer, waiting for the durable acknowledgement; it
 * prints {"partition":P,"offset":O} per record. For operators injecting a record by hand and
 * for interop tests. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_cli_args.h"
#include "lt_job_record.h"
#include "lt_time.h"

static volatile sig_atomic_t lt_cli_topic_stop;

static void on_signal(int sig) { lt_cli_topic_stop = 1; }

static void topic_usage(FILE *f) {
  fprintf(f,
          "usage: lathe topic tail TOPIC [--from-beginning] [--max N] [--timeout-ms T]\n"
          "  Prints TOPIC's records decoded to JSON, one line each (read_committed).\n"
          "  TOPIC            base name (\"progress\") or full name (\"lathe.progress\")\n"
          "  --from-beginning start at the oldest record (default: only new records)\n"
          "  --max N          stop after N records\n"
          "  --timeout-ms T   stop after T ms without a record\n"
          "usage: lathe topic produce TOPIC TYPE < records.jsonl\n"
          "  Encodes each JSON line as the newest version of TYPE and writes it (acks=all),\n"
          "  keyed by job_id / tenant_id / worker_id; prints partition and offset per record.\n"
          "  Environment: LATHE_KAFKA_BOOTSTRAP (default 127.0.0.1:9092), LATHE_TOPIC_PREFIX, the admin\n"
          "  principal (LATHE_KAFKA_CONFIG_DIR/admin.properties, or LATHE_KAFKA_CONFIG)\n");
}

/* Prints one record (or its decode error) as a JSON line. */
static void print_record(lt_avro_decoder_t *dec, const lt_bus_msg_t *m) {
  json_t *line = json_object();
  json_object_set_new(line, "topic", json_string(lt_bus_msg_topic(m)));
  json_object_set_new(line, "partition", json_integer(lt_bus_msg_partition(m)));
  json_object_set_new(line, "offset", json_integer(lt_bus_msg_offset(m)));
  json_object_set_new(line, "timestamp", json_integer(lt_bus_msg_timestamp(m)));
  size_t ks;
  const char *key = lt_bus_msg_key(m, &ks);
  json_t *jk = key ? json_stringn(key, ks) : json_null();
  if (!jk) { /* not UTF-8: show it in hex */
    char *hex = malloc(ks * 2 + 1);
    for (size_t i = 0; hex && i < ks; i++) sprintf(hex + 2 * i, "%02x", (unsigned char)key[i]);
    if (hex) hex[ks * 2] = '\0';
    json_object_set_new(line, "key_hex", hex ? json_string(hex) : json_null());
    free(hex);
    jk = json_null();
  }
  json_object_set_new(line, "key", jk);

  size_t vs;
  const void *v = lt_bus_msg_value(m, &vs);
  char err[512];
  lt_avro_record_t *rec = NULL;
  json_t *body = NULL;
  lt_err_t e = v ? lt_avro_decode(dec, v, vs, &rec, err, sizeof err)
                 : lt_errf(err, sizeof err, LT_ERR_CORRUPT, "record has no value (tombstone)");
  if (e == LT_OK) e = lt_avro_record_to_jansson(rec, &body, err, sizeof err);
  if (e == LT_OK) {
    json_object_set_new(line, "type", json_string(lt_avro_record_type(rec)));
    json_object_set_new(line, "writer_version", json_integer(lt_avro_record_writer_version(rec)));
    json_object_set_new(line, "record", body);
  } else {
    char msg[700];
    snprintf(msg, sizeof msg, "partition %d offset %lld: %s: %s", (int)lt_bus_msg_partition(m),
             (long long)lt_bus_msg_offset(m), lt_err_name(e), err);
    json_object_set_new(line, "error", json_string(msg));
  }
  char *text = json_dumps(line, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (text) {
    fputs(text, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    free(text);
  }
  json_decref(line);
}

/* TOPIC as given on the command line -> full name. */
static void full_topic(const lt_bus_conf_t *conf, const char *topic, char *full, size_t size) {
  const char *prefix = lt_bus_conf_get(conf, "lathe.topic.prefix");
  if (*prefix && strncmp(topic, prefix, strlen(prefix)) == 0)
    snprintf(full, size, "%s", topic);
  else
    lt_bus_topic_name(conf, topic, full, size);
}

/* What a command opens: the bus configuration from the environment, the schema registry,
 * TOPIC's full name, then a decoder and a consumer (tail) or a record and a producer (produce). */
typedef struct topic_session {
  lt_bus_conf_t *conf;
  lt_avro_registry_t *reg;
  char full[512];
  lt_avro_decoder_t *dec;  /* tail */
  lt_bus_consumer_t *c;    /* tail */
  lt_avro_record_t *rec;   /* produce: a record of this type */
  lt_bus_producer_t *p;    /* produce */
} topic_session_t;

/* Opens *t for tail (type NULL) or produce (type: the record type to encode). On failure the
 * message is in err; topic_close frees *t in every case. */
static lt_err_t topic_open(topic_session_t *t, const char *topic, const char *type, char *err,
                           size_t n) {
  memset(t, 0, sizeof *t);
  t->conf = lt_bus_conf_new();
  if (!t->conf) return lt_errf(err, n, LT_ERR_NOMEM, "out of memory");
  lt_err_t e = lt_bus_conf_from_env(t->conf, err, n);
  if (!e) e = lt_bus_conf_for_role(t->conf, "admin", err, n); /* an operator's tool */
  if (!e) e = lt_avro_registry_new(&t->reg, err, n);
  if (e) return e;
  full_topic(t->conf, topic, t->full, sizeof t->full);
  if (!type) {
    e = lt_avro_decoder_new(t->reg, &t->dec, err, n);
    if (!e) e = lt_bus_consumer_new(t->conf, NULL, &t->c, err, n);
  } else {
    e = lt_avro_record_new(t->reg, type, &t->rec, err, n);
    if (!e) e = lt_bus_producer_new(t->conf, NULL, &t->p, err, n);
  }
  return e;
}

static void topic_close(topic_session_t *t) {
  lt_bus_producer_destroy(t->p, 10000);
  lt_bus_consumer_destroy(t->c);
  lt_avro_decoder_destroy(t->dec);
  lt_avro_record_destroy(t->rec);
  lt_avro_registry_destroy(t->reg);
  lt_bus_conf_destroy(t->conf);
}

static int topic_tail(int argc, char **argv) {
  enum { O_BEGINNING = 256, O_MAX, O_TIMEOUT };
  static const struct option opts[] = {{"from-beginning", no_argument, NULL, O_BEGINNING},
                                       {"max", required_argument, NULL, O_MAX},
                                       {"timeout-ms", required_argument, NULL, O_TIMEOUT},
                                       {0}};
  lt_cli_args_t a = {.what = "topic tail", .usage = topic_usage, .opts = opts, .min = 1, .max = 1};
  bool from_beginning = false;
  long max = -1, timeout_ms = -1;
  int c;
  double d;
  while ((c = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (c == O_BEGINNING) from_beginning = true;
    else if (!lt_cli_args_num(&a, c == O_MAX ? "--max" : "--timeout-ms", 0, 1e15, true, &d)) return 2;
    else if (c == O_MAX) max = (long)d;
    else timeout_ms = (long)d;
  }
  if (c != LT_CLI_ARGS_END) return a.status;
  const char *topic = a.operands[0];

  char err[1024];
  int rc = 1;
  topic_session_t t;
  if (topic_open(&t, topic, NULL, err, sizeof err)) {
    fprintf(stderr, "lathe topic tail: %s\n", err);
    goto out;
  }
  lt_err_t e = lt_bus_consumer_assign_topic(t.c, t.full, from_beginning ? LT_BUS_OFFSET_BEGINNING
                                                                    : LT_BUS_OFFSET_END,
                                            10000, NULL, err, sizeof err);
  if (e) {
    fprintf(stderr, "lathe topic tail: %s%s\n", err,
            e == LT_ERR_NOT_FOUND ? " (is the name right? is `ops/stack up` done?)" : "");
    goto out;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  long count = 0;
  int64_t last = lt_time_mono_ms();
  rc = 0;
  while (!lt_cli_topic_stop && (max < 0 || count < max)) {
    const lt_bus_msg_t *m;
    e = lt_bus_consumer_poll(t.c, 200, &m, err, sizeof err);
    if (e == LT_ERR_FATAL || e == LT_ERR_NOT_FOUND || e == LT_ERR_AUTH) {
      fprintf(stderr, "lathe topic tail: %s\n", err);
      rc = 1;
      break;
    }
    if (e) fprintf(stderr, "lathe topic tail: %s (continuing)\n", err);
    if (m) {
      print_record(t.dec, m);
      count++;
      last = lt_time_mono_ms();
    } else if (timeout_ms >= 0 && lt_time_mono_ms() - last >= timeout_ms) {
      break;
    }
  }
out:
  topic_close(&t);
  return rc;
}

static int topic_produce(int argc, char **argv) {
  lt_cli_args_t a = {.what = "topic produce", .usage = topic_usage, .min = 2, .max = 2};
  if (lt_cli_args_next(&a, argc, argv) != LT_CLI_ARGS_END) return a.status;
  char err[1024];
  int rc = 1;
  topic_session_t t;
  char *line = NULL;
  size_t cap = 0;
  if (topic_open(&t, a.operands[0], a.operands[1], err, sizeof err)) {
    fprintf(stderr, "lathe topic produce: %s\n", err);
    goto out;
  }
  lt_avro_record_t *rec = t.rec;
  ssize_t n;
  int lineno = 0;
  rc = 0;
  while ((n = getline(&line, &cap, stdin)) > 0) {
    lineno++;
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (n == 0) continue;
    lt_avro_record_clear(rec);
    const uint8_t *buf;
    size_t len;
    if (lt_avro_record_from_json(rec, line, (size_t)n, err, sizeof err) ||
        lt_avro_record_encode(rec, &buf, &len, err, sizeof err)) {
      fprintf(stderr, "lathe topic produce: stdin line %d: %s\n", lineno, err);
      rc = 1;
      break;
    }
    const char *key = NULL;
    static const char *const key_fields[] = {"job_id", "tenant_id", "worker_id"};
    for (size_t i = 0; i < 3 && !key; i++)
      if (lt_avro_get_string(rec, key_fields[i], &key, NULL) != LT_OK) key = NULL;
    /* A session's calls are on the partition its worker reads (lt_job_record.h), not the key's hash. */
    bool call = key && strcmp(lt_avro_record_type(rec), "SessionCall") == 0;
    lt_bus_record_t r = {.topic = t.full, .partition = call ? lt_calls_partition(key) : LT_BUS_PARTITION_ANY, .key = key,
                         .key_size = key ? strlen(key) : 0, .value = buf, .value_size = len};
    int32_t part;
    int64_t off;
    lt_err_t e = lt_bus_produce_sync(t.p, &r, 30000, &part, &off, err, sizeof err);
    if (e) {
      fprintf(stderr, "lathe topic produce: stdin line %d: %s\n", lineno, err);
      rc = 1;
      break;
    }
    printf("{\"partition\":%d,\"offset\":%lld}\n", (int)part, (long long)off);
  }
  fflush(stdout);
out:
  free(line);
  topic_close(&t);
  return rc;
}

int lt_cli_topic(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"tail", topic_tail}, {"produce", topic_produce}};
  return lt_cli_args_dispatch("topic", topic_usage, verbs, 2, NULL, argc, argv);
}
