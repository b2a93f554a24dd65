/* lt_bus_ce: the CloudEvents headers the producer puts on every Lathe record (docs/EVENTS.md).
 *
 * The header values are checked on lt_bus_ce_fill directly (what an odd envelope becomes), and
 * once through the real broker of ops/stack: a record produced by lt_bus comes back with its
 * headers, and a record produced with none is still read like any other. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_bus_int.h"
#include "lt_test.h"

#define T_MS 20000
#define EVENT_ID "6f1c7e52-55a4-4c1e-9e53-1d2a3b4c5d6e"

static lt_avro_registry_t *reg;
static lt_bus_ce_names_t *names;
static char err[1024];

static void setup(void) {
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_ce_names_new(&names, err, sizeof err), LT_OK, "%s", err);
}

static void teardown(void) {
  lt_bus_ce_names_destroy(names);
  lt_avro_registry_destroy(reg);
}

/* A StepCompleted with its envelope set and the rest at defaults, encoded into out. */
static size_t step_bytes(const char *event_id, const char *producer, uint8_t *out, size_t cap) {
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_set_string(r, "event_id", event_id), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "occurred_at", 1764400000123), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "producer", producer), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "job_id", "job-0001"), LT_OK);
  size_t len;
  cr_assert_eq(lt_avro_record_encode_to(r, out, cap, &len, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_destroy(r);
  return len;
}

static const char *header(const lt_bus_ce_t *ce, const char *name) {
  for (size_t i = 0; i < ce->n; i++)
    if (strcmp(ce->h[i].name, name) == 0) return ce->h[i].value;
  return NULL;
}

/* The fingerprint as the spec prints it: the 8 header bytes in wire order, in hex. */
static void wire_fp(const uint8_t *v, char out[17]) {
  for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", v[2 + i]);
}

TestSuite(bus_ce, .init = setup, .fini = teardown, .timeout = 120);

Test(bus_ce, a_record_is_named_by_its_schema_and_envelope) {
  uint8_t v[512];
  size_t len = step_bytes(EVENT_ID, "worker/w-1", v, sizeof v);
  lt_bus_record_t rec = {.topic = "t", .value = v, .value_size = len};
  lt_bus_ce_t ce;
  cr_assert_eq(lt_bus_ce_fill(names, "client", &rec, &ce), 8);
  char fp[17], schema[128];
  wire_fp(v, fp);
  snprintf(schema, sizeof schema, "lathe:schema/StepCompleted/v2/%s", fp);
  cr_assert_str_eq(header(&ce, "ce_specversion"), "1.0");
  cr_assert_str_eq(header(&ce, "ce_id"), EVENT_ID);
  cr_assert_str_eq(header(&ce, "ce_source"), "lathe/worker/w-1");
  cr_assert_str_eq(header(&ce, "ce_type"), "dev.lathe.StepCompleted");
  cr_assert_str_eq(header(&ce, "ce_time"), "2025-11-29T07:06:40.123Z");
  cr_assert_str_eq(header(&ce, "content-type"), "application/avro");
  cr_assert_str_eq(header(&ce, "ce_dataschema"), schema);
  cr_assert_str_eq(header(&ce, "lathe_schema_fingerprint"), fp);
}

Test(bus_ce, every_embedded_schema_has_a_name_and_the_envelope_the_reader_expects) {
  for (size_t i = 0; i < lt_avro_registry_count(reg); i++) {
    const lt_avro_schema_t *s = lt_avro_registry_at(reg, i);
    lt_avro_record_t *r;
    cr_assert_eq(lt_avro_record_new_schema(reg, s, &r, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_set_string(r, "event_id", "e-1"), LT_OK);
    cr_assert_eq(lt_avro_set_long(r, "occurred_at", 1000), LT_OK);
    cr_assert_eq(lt_avro_set_string(r, "producer", "p"), LT_OK);
    const uint8_t *v;
    size_t len;
    cr_assert_eq(lt_avro_record_encode(r, &v, &len, err, sizeof err), LT_OK, "%s", err);
    lt_bus_record_t rec = {.topic = "t", .value = v, .value_size = len};
    lt_bus_ce_t ce;
    lt_bus_ce_fill(names, NULL, &rec, &ce);
    char type[96], schema[128], fp[17];
    snprintf(type, sizeof type, "dev.lathe.%s", lt_avro_schema_name(s));
    wire_fp(v, fp);
    snprintf(schema, sizeof schema, "lathe:schema/%s/v%d/%s", lt_avro_schema_name(s),
             lt_avro_schema_version(s), fp);
    cr_assert_str_eq(header(&ce, "ce_type"), type);
    cr_assert_str_eq(header(&ce, "ce_dataschema"), schema);
    cr_assert_str_eq(header(&ce, "ce_id"), "e-1", "%s: envelope not read", type);
    cr_assert_str_eq(header(&ce, "ce_source"), "lathe/p");
    cr_assert_str_eq(header(&ce, "ce_time"), "1970-01-01T00:00:01.000Z");
    lt_avro_record_destroy(r);
  }
}

Test(bus_ce, an_envelope_that_is_not_an_id_never_reaches_a_header) {
  uint8_t v[512];
  size_t len = step_bytes("please summarise my medical notes", "a producer with spaces", v, sizeof v);
  lt_bus_record_t rec = {.topic = "t", .value = v, .value_size = len};
  lt_bus_ce_t ce, again;
  lt_bus_ce_fill(names, "lathe-cli", &rec, &ce);
  for (size_t i = 0; i < ce.n; i++)
    cr_assert_null(strstr(ce.h[i].value, "medical"), "%s carries content", ce.h[i].name);
  /* Derived from the bytes, so a retry or a replay of the same record gets the same id. */
  char fp[17], prefix[32];
  wire_fp(v, fp);
  snprintf(prefix, sizeof prefix, "%s-", fp);
  cr_assert_eq(strncmp(header(&ce, "ce_id"), prefix, 17), 0, "%s", header(&ce, "ce_id"));
  cr_assert_eq(strlen(header(&ce, "ce_id")), 33);
  lt_bus_ce_fill(names, "lathe-cli", &rec, &again);
  cr_assert_str_eq(header(&again, "ce_id"), header(&ce, "ce_id"));
  cr_assert_str_eq(header(&ce, "ce_source"), "lathe/lathe-cli");

  /* A NUL inside an id would cut the header short of what the record says. */
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_set_string_len(r, "event_id", "e-1\0tail", 8), LT_OK);
  const uint8_t *b;
  cr_assert_eq(lt_avro_record_encode(r, &b, &len, err, sizeof err), LT_OK, "%s", err);
  lt_bus_record_t nul = {.topic = "t", .value = b, .value_size = len};
  lt_bus_ce_fill(names, "c", &nul, &ce);
  cr_assert_eq(strlen(header(&ce, "ce_id")), 33, "%s", header(&ce, "ce_id"));
  lt_avro_record_destroy(r);
}

Test(bus_ce, bytes_that_are_not_a_known_schema_get_no_headers_and_callers_win) {
  lt_bus_ce_t ce;
  lt_bus_record_t tombstone = {.topic = "t"};
  cr_assert_eq(lt_bus_ce_fill(names, NULL, &tombstone, &ce), 0);
  lt_bus_record_t text = {.topic = "t", .value = "hello", .value_size = 5};
  cr_assert_eq(lt_bus_ce_fill(names, NULL, &text, &ce), 0);
  const uint8_t unknown[] = {0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0};
  lt_bus_record_t u = {.topic = "t", .value = unknown, .value_size = sizeof unknown};
  cr_assert_eq(lt_bus_ce_fill(names, NULL, &u, &ce), 0);
  /* A truncated body still has a type (from the header) and an id derived from its bytes. */
  uint8_t v[512];
  size_t len = step_bytes(EVENT_ID, "worker/w-1", v, sizeof v);
  lt_bus_record_t cut = {.topic = "t", .value = v, .value_size = LT_AVRO_HEADER_SIZE + 4};
  cr_assert_eq(lt_bus_ce_fill(names, "c", &cut, &ce), 7, "no time without an envelope");
  cr_assert_str_eq(header(&ce, "ce_type"), "dev.lathe.StepCompleted");
  cr_assert_null(header(&ce, "ce_time"));

  lt_bus_header_t mine[] = {{"ce_source", "lathe/elsewhere", 15}, {"x-mac", "m", 1}};
  lt_bus_record_t rec = {.topic = "t", .value = v, .value_size = len, .headers = mine,
                         .header_count = 2};
  cr_assert_eq(lt_bus_ce_fill(names, "c", &rec, &ce), 7);
  cr_assert_null(header(&ce, "ce_source"), "the caller's ce_source is not doubled");
}

/* Through the broker: lt_bus adds the headers, and a record without any is read all the same
 * (records written before the headers existed, or by another producer). */
Test(bus_ce, produced_records_carry_the_headers_and_bare_records_still_read) {
  char prefix[96];
  lt_bus_admin_t *admin;
  lt_bus_conf_t *conf = lt_test_bus_scratch("lt-test-ce-", prefix, sizeof prefix, &admin);
  char topic[256];
  lt_bus_topic_name(conf, "progress", topic, sizeof topic);
  cr_assert_eq(lt_bus_admin_create_topic(admin, topic, 1, -1, NULL, 0, T_MS, err, sizeof err),
               LT_OK, "Kafka broker not reachable or refused (run `ops/stack up`): %s", err);
  lt_bus_producer_t *p;
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK, "%s", err);
  uint8_t v[512];
  size_t len = step_bytes(EVENT_ID, "worker/w-1", v, sizeof v);
  lt_bus_record_t rec = {.topic = topic, .partition = 0, .key = "job-0001", .key_size = 8,
                         .value = v, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(p, &rec, T_MS, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  /* The same bytes without headers, through librdkafka itself (lt_bus would name them). */
  cr_assert_eq(rd_kafka_producev(lt_bus_producer_rk(p), RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(0),
                                 RD_KAFKA_V_VALUE(v, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END),
               RD_KAFKA_RESP_ERR_NO_ERROR);
  cr_assert_eq(rd_kafka_flush(lt_bus_producer_rk(p), T_MS), RD_KAFKA_RESP_ERR_NO_ERROR);
  lt_bus_producer_destroy(p, 1000);

  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_consumer_assign_topic(c, topic, LT_BUS_OFFSET_BEGINNING, T_MS, NULL, err,
                                            sizeof err),
               LT_OK, "%s", err);
  lt_avro_decoder_t *dec;
  cr_assert_eq(lt_avro_decoder_new(reg, &dec, err, sizeof err), LT_OK, "%s", err);
  char fp[17];
  wire_fp(v, fp);
  int got = 0;
  for (int i = 0; i < 100 && got < 2; i++) {
    const lt_bus_msg_t *m = NULL;
    cr_assert_eq(lt_bus_consumer_poll(c, 200, &m, err, sizeof err), LT_OK, "%s", err);
    if (!m) continue;
    const void *hv;
    size_t hs;
    if (got == 0) {
      cr_assert_eq(lt_bus_msg_header_count(m), 8);
      cr_assert(lt_bus_msg_header_get(m, "ce_type", &hv, &hs));
      cr_assert_eq(hs, strlen("dev.lathe.StepCompleted"));
      cr_assert_eq(memcmp(hv, "dev.lathe.StepCompleted", hs), 0);
      cr_assert(lt_bus_msg_header_get(m, "ce_id", &hv, &hs));
      cr_assert_eq(hs, strlen(EVENT_ID));
      cr_assert_eq(memcmp(hv, EVENT_ID, hs), 0);
      cr_assert(lt_bus_msg_header_get(m, "lathe_schema_fingerprint", &hv, &hs));
      cr_assert_eq(hs, 16);
      cr_assert_eq(memcmp(hv, fp, 16), 0);
    } else {
      cr_assert_eq(lt_bus_msg_header_count(m), 0);
    }
    size_t vs;
    const void *mv = lt_bus_msg_value(m, &vs);
    lt_avro_record_t *r;
    cr_assert_eq(lt_avro_decode(dec, mv, vs, &r, err, sizeof err), LT_OK, "%s", err);
    const char *id;
    cr_assert_eq(lt_avro_get_string(r, "event_id", &id, NULL), LT_OK);
    cr_assert_str_eq(id, EVENT_ID);
    got++;
  }
  cr_assert_eq(got, 2, "%d of 2 records came back", got);
  lt_avro_decoder_destroy(dec);
  lt_bus_consumer_destroy(c);

  const char *names_[] = {topic};
  lt_bus_admin_delete_topics(admin, names_, 1, 10000, NULL, 0);
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
}
