/* The authenticated bus and the tenant record MAC, attacked on the real broker of ops/stack
 * (docs/DESIGN.md §5a).
 *
 * The attack this suite holds shut: anyone who reached Kafka appended a key hash to another
 * tenant's TenantUpserted and then read that tenant's artifacts with the new key. Now
 *   (a) a principal without Write on lathe.tenants (the worker's) is refused by the broker;
 *   (b) a principal with Write (the admin's) but without the master key writes a record no role
 *       folds: the forged key answers 401, the tenant's real key still works, and the scheduler
 *       dead-letters the record with the reason;
 * and a role cannot read a topic it was not granted, and nothing connects without credentials,
 * on either listener. Every test uses its own scratch prefix, with the roles' ACLs made by the
 * harness (ops/acls.tsv). Needs the stack's principals: `eval "$(ops/stack env)"`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_proj.h"
#include "lt_recmac.h"
#include "lt_tenant.h"
#include "lt_test.h"
#include "lt_time.h"

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define OTHER_KEY "f0e0d0c0b0a090807060504030201000f0e0d0c0b0a090807060504030201000"

static char err[1024];
static char prefix[96];

/* A scratch prefix with its topics and the roles' ACLs, as `lathe admin topics` makes them. */
static void setup(void) {
  lt_test_require_stack();
  if (!getenv("LATHE_KAFKA_CONFIG_DIR"))
    cr_assert_fail("needs the stack's principals (LATHE_KAFKA_CONFIG_DIR): eval \"$(ops/stack env)\"");
  lt_test_scratch_prefix("authz", prefix, sizeof prefix);
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  lt_test_admin_topics();
}

static void teardown(void) {
  lt_test_procs_stop_all();
  if (prefix[0]) lt_test_topics_delete(prefix);
}

TestSuite(authz, .init = setup, .fini = teardown, .timeout = 240);

/* The environment's bus configuration (this test's prefix) as role. */
static lt_bus_conf_t *bus_as(const char *role) {
  lt_bus_conf_t *c = lt_bus_conf_new();
  cr_assert(c);
  cr_assert_eq(lt_bus_conf_from_env(c, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_conf_for_role(c, role, err, sizeof err), LT_OK, "%s", err);
  return c;
}

/* A consumer of lathe.tenants (its name into topic) from its first record. */
static lt_bus_consumer_t *tenants_from_start(lt_bus_conf_t *conf, char topic[200]) {
  lt_bus_consumer_t *c;
  lt_bus_topic_name(conf, "tenants", topic, 200);
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_consumer_assign_topic(c, topic, LT_BUS_OFFSET_BEGINNING, 10000, NULL, err, sizeof err), LT_OK,
               "%s", err);
  return c;
}

/* The tenant as the log holds it now (folded without checks: what an attacker can read). */
static lt_tenant_t read_tenant(const char *id) {
  lt_avro_registry_t *reg;
  lt_proj_t *proj;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_proj_new(reg, &proj, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_t *conf = lt_test_bus_env();
  char topic[200];
  lt_bus_consumer_t *c = tenants_from_start(conf, topic);
  for (;;) {
    const lt_bus_msg_t *m;
    cr_assert_eq(lt_bus_consumer_poll(c, 2000, &m, err, sizeof err), LT_OK, "%s", err);
    if (!m) break;
    lt_proj_fold_msg(proj, m, NULL, NULL, NULL, NULL, 0);
  }
  const lt_tenant_t *got = lt_tenant_get(lt_proj_tenants(proj), id);
  cr_assert(got, "tenant %s is not in %s", id, topic);
  lt_tenant_t out = *got;
  lt_bus_consumer_destroy(c);
  lt_bus_conf_destroy(conf);
  lt_proj_destroy(proj);
  lt_avro_registry_destroy(reg);
  return out;
}

/* The forgery: the victim's record with one more live key (written to forged_key), encoded. The
 * caller frees the record. */
static lt_avro_record_t *forged_record(lt_avro_registry_t *reg, const char *victim, char *forged_key,
                                       const uint8_t **bytes, size_t *len) {
  lt_tenant_t t = read_tenant(victim);
  cr_assert_eq(lt_tenant_add_key(&t, false, lt_time_wall_ms(), forged_key), LT_OK);
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_record_new(reg, "TenantUpserted", &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_stamp(rec, "admin/cli"), LT_OK);
  cr_assert_eq(lt_tenant_to_record(&t, rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_encode(rec, bytes, len, err, sizeof err), LT_OK, "%s", err);
  return rec;
}

/* Writes a record to lathe.tenants as role, with a lathe-mac header when mac is not NULL. */
static lt_err_t produce_tenant(const char *role, const char *victim, const void *bytes, size_t len,
                               const uint8_t *mac, char *why, size_t whyn) {
  lt_bus_conf_t *conf = bus_as(role);
  char topic[200];
  lt_bus_topic_name(conf, "tenants", topic, sizeof topic);
  lt_bus_producer_t *p;
  lt_err_t e = lt_bus_producer_new(conf, NULL, &p, why, whyn);
  if (!e) {
    lt_bus_header_t h = {.name = LT_RECMAC_HEADER, .value = mac, .size = LT_RECMAC_BYTES};
    lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = victim, .key_size = strlen(victim),
                         .value = bytes, .value_size = len, .headers = mac ? &h : NULL, .header_count = mac ? 1 : 0};
    e = lt_bus_produce_sync(p, &r, 20000, NULL, NULL, why, whyn);
  }
  lt_bus_producer_destroy(p, 0);
  lt_bus_conf_destroy(conf);
  return e;
}

static void new_tenant(char *id, size_t idn, char *key, size_t keyn) {
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(id, idn, "victim-%.10s", rnd);
  lt_test_tenant_create(id, NULL, key, keyn);
}

static char ops[64]; /* the API's operator endpoints (/healthz, /metrics) */

/* `lathed --role ROLE` (api: its URL into url, ready once /healthz answers 200). */
static lt_test_proc_t *start_role(const char *role, char *url, size_t urln) {
  char log[256];
  snprintf(log, sizeof log, "/tmp/test_authz.%d.%s.log", (int)getpid(), role);
  lt_test_proc_t *p = lt_test_lathed(role, log, role, NULL, NULL);
  if (url) {
    snprintf(url, urln, "http://127.0.0.1:%u", lt_test_proc_port(p, 30000));
    snprintf(ops, sizeof ops, "http://127.0.0.1:%u", lt_test_proc_operator_port(p, 30000));
    lt_test_wait_healthy(ops, log, 30000);
  }
  return p;
}

/* The API's count of refused signed records (/metrics), or -1. */
/* The API's count of records refused for their MAC, from /metrics on its operator port. */
static long refused_count(void) {
  lt_client_t *c = lt_test_client(ops, NULL, 0);
  lt_client_resp_t r = lt_test_req(c, "GET", "/metrics", NULL, 0);
  long n = -1;
  const char *at = r.body ? strstr(r.body, "\nlathe_api_refused_records_total ") : NULL; /* the sample, not HELP */
  if (at) n = strtol(at + strlen("\nlathe_api_refused_records_total "), NULL, 10);
  lt_client_resp_free(&r);
  lt_client_destroy(c);
  return n;
}

/* The DeadLetter records of lathe.deadletter whose key is tenant, as JSON (new reference). */
static json_t *dead_letters_for(const char *tenant) {
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"deadletter", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *all = lt_test_tail_select(t, "deadletter", "DeadLetter", NULL, 0), *mine = json_array();
  size_t i;
  json_t *r;
  json_array_foreach(all, i, r) {
    const char *topic = lt_test_rs(r, "topic"), *reason = lt_test_rs(r, "reason");
    if (topic && strstr(topic, "tenants") && reason && strstr(reason, tenant)) json_array_append(mine, r);
  }
  json_decref(all);
  lt_test_tail_close(t);
  return mine;
}

/* (a) The worker's principal may not write lathe.tenants: the broker refuses the record, and
 * the error says so. Nothing reaches the topic. */
Test(authz, a_worker_principal_writing_tenants_is_refused_by_the_broker) {
  char victim[64], key[LT_TENANT_API_KEY_SIZE + 8], forged[LT_TENANT_API_KEY_SIZE];
  new_tenant(victim, sizeof victim, key, sizeof key);
  lt_avro_registry_t *reg;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  const uint8_t *bytes;
  size_t len;
  lt_avro_record_t *rec = forged_record(reg, victim, forged, &bytes, &len);
  char why[512] = "";
  lt_err_t e = produce_tenant("worker", victim, bytes, len, NULL, why, sizeof why);
  cr_assert_eq(e, LT_ERR_AUTH, "the worker wrote lathe.tenants: %s (%s)", lt_err_name(e), why);
  cr_assert(strstr(why, "Topic authorization failed"), "the error does not say why: %s", why);
  /* The reproduction as it was found: the victim's record read back and produced again with
   * `lathe topic produce`, here given the worker's credentials; the broker refuses it. */
  char cmd[3000], props[600];
  cr_assert(lt_test_kafka_props("worker", props, sizeof props));
  snprintf(cmd, sizeof cmd,
           "'%s' topic tail tenants --from-beginning --max 1 --timeout-ms 5000 | /usr/bin/python3 -c "
           "'import json,sys; print(json.dumps(json.loads(sys.stdin.readline())[\"record\"]))' | "
           "LATHE_KAFKA_CONFIG='%s' LATHE_KAFKA_CONFIG_DIR= '%s' topic produce tenants TenantUpserted 2>&1",
           lt_test_lathe_bin(), props, lt_test_lathe_bin());
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_neq(rc, 0, "lathe topic produce as the worker succeeded: %s", out);
  cr_assert(strstr(out, "Topic authorization failed"), "the CLI does not say why: %s", out);
  free(out);
  lt_tenant_t t = read_tenant(victim);
  cr_assert_eq(t.nkeys, 1, "the tenant has %d keys: the forgery got in", t.nkeys);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
}

/* (b) The admin's principal may write lathe.tenants, but without the master key it cannot sign:
 * an unsigned record and one signed under another master key both reach the topic, and no role
 * folds them. The forged key answers 401, the real key keeps working, the scheduler dead-letters
 * each with the reason, and the API counts them. */
Test(authz, a_tenant_record_forged_without_the_master_key_is_refused_and_dead_lettered) {
  char victim[64], key[LT_TENANT_API_KEY_SIZE + 8], forged[LT_TENANT_API_KEY_SIZE], url[200];
  new_tenant(victim, sizeof victim, key, sizeof key);
  start_role("scheduler", NULL, 0);
  lt_test_proc_t *api = start_role("api", url, sizeof url);
  lt_client_t *real = lt_test_client(url, key, 30);
  lt_test_wait_until(lt_test_get_status(real, "/v1/jobs", NULL, 0) == 200, 30000, 100, "the real key never worked");

  lt_avro_registry_t *reg;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  const uint8_t *bytes;
  size_t len;
  lt_avro_record_t *rec = forged_record(reg, victim, forged, &bytes, &len);
  char why[512];
  cr_assert_eq(produce_tenant("admin", victim, bytes, len, NULL, why, sizeof why), LT_OK, "%s", why);
  /* Signed, but under a key derived from another master key. */
  lt_crypto_kek_t *other;
  lt_recmac_key_t *wrong;
  uint8_t mac[LT_RECMAC_BYTES];
  cr_assert_eq(lt_crypto_kek_from_text(&other, "attacker", OTHER_KEY, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_recmac_key_new(other, LT_RECMAC_TENANTS, &wrong, err, sizeof err), LT_OK, "%s", err);
  lt_recmac_sign(wrong, "tenants", victim, strlen(victim), bytes, len, mac);
  cr_assert_eq(produce_tenant("admin", victim, bytes, len, mac, why, sizeof why), LT_OK, "%s", why);

  /* Both were read and refused by the API before anything is judged. */
  long n = 0;
  lt_test_wait_until((n = refused_count()) >= 2, 30000, 200, "the API refused %ld records, want 2; see %s", n,
                     api->log);
  cr_assert_eq(n, 2);
  cr_assert(lt_test_file_has(api->log, "refused, the tenant keeps its previous state: no lathe-mac header"),
            "%s", lt_test_log_tail(api->log));
  cr_assert(lt_test_file_has(api->log, "the record MAC does not verify"), "%s", lt_test_log_tail(api->log));
  lt_client_t *bad = lt_test_client(url, forged, 30);
  cr_assert_eq(lt_test_get_status(bad, "/v1/jobs", NULL, 0), 401, "the forged key was accepted");
  cr_assert_eq(lt_test_get_status(real, "/v1/jobs", NULL, 0), 200, "the real key stopped working");

  json_t *dl = NULL;
  lt_test_wait_until((json_decref(dl), dl = dead_letters_for(victim), json_array_size(dl) >= 2), 30000, 500,
                     "the scheduler dead-lettered %zu of the 2 forged records", json_array_size(dl));
  cr_assert_eq(json_array_size(dl), 2);
  const char *r0 = lt_test_rs(json_array_get(dl, 0), "reason"), *r1 = lt_test_rs(json_array_get(dl, 1), "reason");
  cr_assert(r0 && strstr(r0, "no lathe-mac header") && strstr(r0, victim), "reason: %s", r0);
  cr_assert(r1 && strstr(r1, "does not verify"), "reason: %s", r1);
  cr_assert_str_eq(lt_test_rs(json_array_get(dl, 0), "error_code"), "LT_ERR_AUTH");
  json_decref(dl);

  /* An operator's next change re-signs the tenant as it really was, never the forged key. */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "'%s' admin tenant update %s --weight 2 2>&1", lt_test_lathe_bin(), victim);
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  free(out);
  lt_test_msleep(1500);
  cr_assert_eq(lt_test_get_status(bad, "/v1/jobs", NULL, 0), 401, "the update carried the forged key forward");
  cr_assert_eq(lt_test_get_status(real, "/v1/jobs", NULL, 0), 200);
  lt_client_destroy(bad);
  lt_client_destroy(real);
  lt_recmac_key_destroy(wrong);
  lt_crypto_kek_destroy(other);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
}

/* The newest record of tenant id in lathe.tenants as written, bytes and MAC (caller frees *bytes):
 * what anyone who may read the topic can copy. */
static void newest_signed(const char *id, void **bytes, size_t *len, uint8_t mac[LT_RECMAC_BYTES]) {
  lt_bus_conf_t *conf = lt_test_bus_env();
  char topic[200];
  lt_bus_consumer_t *c = tenants_from_start(conf, topic);
  *bytes = NULL;
  for (;;) {
    const lt_bus_msg_t *m;
    cr_assert_eq(lt_bus_consumer_poll(c, 2000, &m, err, sizeof err), LT_OK, "%s", err);
    if (!m) break;
    size_t klen = 0, vlen = 0, hlen = 0;
    const void *k = lt_bus_msg_key(m, &klen), *v = lt_bus_msg_value(m, &vlen), *h = NULL;
    if (!k || klen != strlen(id) || memcmp(k, id, klen) || !v ||
        !lt_bus_msg_header_get(m, LT_RECMAC_HEADER, &h, &hlen) || hlen != LT_RECMAC_BYTES)
      continue;
    free(*bytes);
    *bytes = malloc(vlen);
    memcpy(*bytes, v, vlen);
    *len = vlen;
    memcpy(mac, h, LT_RECMAC_BYTES);
  }
  cr_assert(*bytes, "no signed record of %s in %s", id, topic);
  lt_bus_consumer_destroy(c);
  lt_bus_conf_destroy(conf);
}

/* The principal that may write lathe.tenants, without the master key, cannot sign a new record;
 * it can copy an old signed one and write it again: the tenant's record from before a key was
 * revoked, to bring the key back. Every role folded it (latest wins); now a record older than the
 * one folded is refused and counted, and the key stays revoked. */
Test(authz, a_tenant_record_written_again_after_a_newer_one_brings_no_revoked_key_back) {
  char victim[64], key[LT_TENANT_API_KEY_SIZE + 8], url[200];
  new_tenant(victim, sizeof victim, key, sizeof key);
  start_role("api", url, sizeof url);
  lt_client_t *c = lt_test_client(url, key, 30);
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 200, 30000, 100, "the key never worked");
  void *old = NULL;
  size_t old_len = 0;
  uint8_t old_mac[LT_RECMAC_BYTES];
  newest_signed(victim, &old, &old_len, old_mac);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %.16s 2>&1", lt_test_lathe_bin(), victim, key + 3);
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  free(out);
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 401, 30000, 100, "the revoked key still works");
  long before = refused_count();
  char why[512];
  cr_assert_eq(produce_tenant("admin", victim, old, old_len, old_mac, why, sizeof why), LT_OK, "%s", why);
  long n = 0;
  lt_test_wait_until((n = refused_count()) > before, 30000, 200, "the API did not refuse the old record (%ld)", n);
  cr_assert_eq(lt_test_get_status(c, "/v1/jobs", NULL, 0), 401, "the old record brought the revoked key back");
  /* an operator's next change is folded: its record is dated after the newest, whatever its clock */
  snprintf(cmd, sizeof cmd, "'%s' admin tenant update %s --weight 2 2>&1", lt_test_lathe_bin(), victim);
  out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  free(out);
  lt_test_wait_until(read_tenant(victim).weight == 2, 30000, 200, "the update was not folded");
  cr_assert_eq(refused_count(), n, "the operator's update was refused");
  free(old);
  lt_client_destroy(c);
}

/* Starts reading topic (base name) as role: the error code. */
static lt_err_t read_as(const char *role, const char *base, char *why, size_t whyn) {
  lt_bus_conf_t *conf = bus_as(role);
  char topic[200];
  lt_bus_topic_name(conf, base, topic, sizeof topic);
  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, err, sizeof err), LT_OK, "%s", err);
  /* How the roles start reading (lt_bus_consumer_assign_topic, or describe then assign): the
   * broker's metadata answer carries the topic's authorization error. */
  lt_err_t e = lt_bus_consumer_assign_topic(c, topic, LT_BUS_OFFSET_BEGINNING, 10000, NULL, why, whyn);
  const lt_bus_msg_t *m;
  if (!e) e = lt_bus_consumer_poll(c, 500, &m, why, whyn);
  lt_bus_consumer_destroy(c);
  lt_bus_conf_destroy(conf);
  return e;
}

/* The worker may read tenants (data keys) but not the staff-access audit trail; the publisher
 * may not read worker heartbeats. The broker says why. A granted read works. */
Test(authz, a_role_reading_a_topic_it_was_not_granted_fails) {
  char why[512] = "";
  lt_err_t e = read_as("worker", "audit", why, sizeof why);
  cr_assert_eq(e, LT_ERR_AUTH, "the worker read lathe.audit: %s %s", lt_err_name(e), why);
  cr_assert(strstr(why, "authorization failed"), "%s", why);
  e = read_as("publisher", "workers", why, sizeof why);
  cr_assert_eq(e, LT_ERR_AUTH, "the publisher read lathe.workers: %s %s", lt_err_name(e), why);
  e = read_as("worker", "tenants", why, sizeof why);
  cr_assert_eq(e, LT_OK, "the worker could not read lathe.tenants: %s", why);
}

/* A metadata request with this configuration (properties name=value pairs, NULL-terminated)
 * on bootstrap: LT_OK only when the broker answered. */
static lt_err_t describe_with(const char *bootstrap, const char *const *props, char *why, size_t whyn) {
  lt_bus_conf_t *c = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_set(c, "bootstrap.servers", bootstrap, err, sizeof err), LT_OK, "%s", err);
  for (size_t i = 0; props && props[i]; i += 2)
    cr_assert_eq(lt_bus_conf_set(c, props[i], props[i + 1], err, sizeof err), LT_OK, "%s", err);
  lt_bus_admin_t *a;
  cr_assert_eq(lt_bus_admin_new(c, &a, err, sizeof err), LT_OK, "%s", err);
  int np = 0;
  lt_err_t e = lt_bus_admin_describe_topic(a, "__consumer_offsets", 5000, &np, why, whyn);
  lt_bus_admin_destroy(a);
  lt_bus_conf_destroy(c);
  return e;
}

/* No listener answers a client without credentials, nor one with a wrong password; the same
 * request with the admin's credentials is answered (so the failures are about credentials). */
Test(authz, no_anonymous_connection_works_on_any_listener) {
  const char *kb = getenv("LATHE_KAFKA_BOOTSTRAP"), *ctl = getenv("LATHE_KAFKA_CONTROLLER");
  cr_assert(ctl, "ops/stack env sets LATHE_KAFKA_CONTROLLER (the controller listener)");
  char why[512];
  const char *listeners[] = {kb, ctl};
  for (int i = 0; i < 2; i++) {
    lt_err_t e = describe_with(listeners[i], NULL, why, sizeof why);
    cr_assert_neq(e, LT_OK, "an anonymous client got metadata from %s", listeners[i]);
    const char *wrong[] = {"security.protocol", "sasl_plaintext", "sasl.mechanisms", "PLAIN", "sasl.username", "admin",
                           "sasl.password", "not-the-password", NULL};
    e = describe_with(listeners[i], wrong, why, sizeof why);
    cr_assert_neq(e, LT_OK, "a wrong password got metadata from %s", listeners[i]);
  }
  lt_bus_conf_t *admin = lt_test_bus_env();
  lt_bus_admin_t *a;
  cr_assert_eq(lt_bus_admin_new(admin, &a, err, sizeof err), LT_OK, "%s", err);
  char topic[200];
  int np = 0;
  lt_bus_topic_name(admin, "tenants", topic, sizeof topic);
  cr_assert_eq(lt_bus_admin_describe_topic(a, topic, 10000, &np, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(np, 1);
  lt_bus_admin_destroy(a);
  lt_bus_conf_destroy(admin);
}
