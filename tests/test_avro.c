/* Tests of lt_avro: canonical forms and fingerprints against Debian's python3-avro, round trips of
 * every record type, interop both ways with python3-avro, schema evolution both ways, refusal of
 * unknown fingerprints, wrong magic and truncated bodies, typed access, JSON errors, no allocation
 * per record, and no schema field that suggests customer content.
 *
 * The Python side is tests/schema_check.py, run with /usr/bin/python3 (Debian's python3-avro is
 * visible only to the system interpreter). */
#include <avro.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_avro.h"
#include "lt_tenant.h"

static lt_avro_registry_t *reg;
static char err[512];

static void setup(void) {
  err[0] = '\0';
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "registry: %s", err);
}
static void teardown(void) { lt_avro_registry_destroy(reg); }

TestSuite(avro, .init = setup, .fini = teardown);

static const char *src_root(void) {
  const char *r = getenv("LATHE_SOURCE_ROOT");
  return r ? r : ".";
}

static int run_python(const char *args) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/schema_check.py %s", src_root(), args);
  int st = system(cmd);
  return st == -1 ? -1 : WEXITSTATUS(st);
}

static void hex_encode(const uint8_t *p, size_t n, FILE *f) {
  for (size_t i = 0; i < n; i++) fprintf(f, "%02x", p[i]);
}

static size_t hex_decode(const char *h, uint8_t *out, size_t cap) {
  size_t n = 0;
  while (h[0] && h[1] && n < cap) {
    unsigned b;
    sscanf(h, "%2x", &b);
    out[n++] = (uint8_t)b;
    h += 2;
  }
  return n;
}

/* A StepCompleted (newest version) with every field set. */
static void fill_step(lt_avro_record_t *r, int64_t step) {
  cr_assert_eq(lt_avro_set_string(r, "event_id", "6f1c7e52-55a4-4c1e-9e53-1d2a3b4c5d6e"), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "occurred_at", 1764400000000 + step), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "producer", "worker/w-1"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "job_id", "job-0001"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "tenant_id", "tenant-a"), LT_OK);
  cr_assert_eq(lt_avro_set_int(r, "attempt", 2), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "step", step), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "total_steps", 1000), LT_OK);
  cr_assert_eq(lt_avro_set_double(r, "loss", 2.5 - step * 0.001), LT_OK);
  cr_assert_eq(lt_avro_set_double(r, "learning_rate", 2e-4), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "tokens", 4096), LT_OK);
  cr_assert_eq(lt_avro_set_double(r, "tokens_per_s", 812.5), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "elapsed_ms", 5000 + step), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "eta_ms", 95000), LT_OK);
}

Test(avro, registry_holds_every_schema_version_and_knows_the_newest) {
  cr_assert_eq(lt_avro_registry_count(reg), lt_avro_embedded_count);
  cr_assert_geq(lt_avro_registry_count(reg), 25);
  const lt_avro_schema_t *s = lt_avro_schema_latest(reg, "StepCompleted");
  cr_assert_not_null(s);
  cr_assert_eq(lt_avro_schema_version(s), 2);
  cr_assert(lt_avro_schema_is_latest(s));
  const lt_avro_schema_t *v1 = lt_avro_schema_find(reg, "lathe.StepCompleted", 1);
  cr_assert_not_null(v1);
  cr_assert(!lt_avro_schema_is_latest(v1));
  cr_assert_eq(lt_avro_schema_by_fingerprint(reg, lt_avro_schema_fingerprint(v1)), v1);
  cr_assert_null(lt_avro_schema_latest(reg, "NoSuchRecord"));
  const char *names[] = {"JobSubmitted", "JobAccepted", "JobRejected", "JobDispatched",
                         "AttemptStarted", "CancelRequested", "PreemptRequested",
                         "CheckpointCommitted", "AttemptStopped", "JobCompleted", "JobFailed",
                         "JobCancelled", "CleanupDone", "StepCompleted", "EvalCompleted",
                         "WorkerHeartbeat", "ArtifactPublished", "TenantUpserted",
                         "AccessRequested", "AccessApproved", "AccessDenied", "AccessUsed",
                         "AccessRevoked", "DeadLetter"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    cr_assert_not_null(lt_avro_schema_latest(reg, names[i]), "no schema for %s", names[i]);
}

Test(avro, crc64_of_int_is_the_specification_value) {
  uint64_t fp = lt_avro_crc64("\"int\"", 5);
  const uint8_t want[8] = {0x8f, 0x5c, 0x39, 0x3f, 0x1a, 0xd5, 0x75, 0x72};
  for (int i = 0; i < 8; i++) cr_assert_eq((uint8_t)(fp >> (8 * i)), want[i], "byte %d", i);
  char hex[17];
  lt_avro_fingerprint_hex(fp, hex);
  cr_assert_str_eq(hex, "8f5c393f1ad57572");
}

Test(avro, canonical_form_strips_docs_defaults_and_logical_types_and_orders_keys) {
  const char *in =
      "{ \"namespace\": \"x.y\", \"doc\": \"d\", \"fields\": [ {\"doc\": \"f\", \"type\": "
      "{\"logicalType\": \"timestamp-millis\", \"type\": \"long\"}, \"name\": \"t\", \"default\": 0},"
      " {\"name\": \"e\", \"type\": {\"type\": \"enum\", \"symbols\": [\"A\", \"B\"], \"name\": \"E\", \"default\": \"A\"}},"
      " {\"name\": \"e2\", \"type\": \"E\"}, {\"name\": \"f\", \"type\": {\"type\": \"fixed\", \"size\": 016, \"name\": \"z.F\"}},"
      " {\"name\": \"u\", \"type\": [\"null\", {\"type\": \"map\", \"values\": \"string\"}]}],"
      " \"type\": \"record\", \"name\": \"R\", \"aliases\": [\"Q\"] }";
  /* 016 is not valid JSON; use 16. */
  char fixed[2048];
  snprintf(fixed, sizeof fixed, "%s", in);
  char *p = strstr(fixed, "016");
  memmove(p, p + 1, strlen(p));
  char *out = NULL;
  size_t len = 0;
  cr_assert_eq(lt_avro_canonical_form(fixed, strlen(fixed), &out, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(out,
                   "{\"name\":\"x.y.R\",\"type\":\"record\",\"fields\":[{\"name\":\"t\",\"type\":\"long\"},"
                   "{\"name\":\"e\",\"type\":{\"name\":\"x.y.E\",\"type\":\"enum\",\"symbols\":[\"A\",\"B\"]}},"
                   "{\"name\":\"e2\",\"type\":\"x.y.E\"},"
                   "{\"name\":\"f\",\"type\":{\"name\":\"z.F\",\"type\":\"fixed\",\"size\":16}},"
                   "{\"name\":\"u\",\"type\":[\"null\",{\"type\":\"map\",\"values\":\"string\"}]}]}");
  cr_assert_eq(len, strlen(out));
  free(out);
}

/* Found by tests/fuzz/fuzz_avro: a namespace holding a tab (or any non-name) was accepted, and
 * the canonical form wrote it raw: not JSON, so the canonical form of it did not parse. */
Test(avro, namespaces_are_names_too) {
  static const char *const bad[] = {"l\\the", "a..b", ".a", "a.", "a.1b", "a b"};
  char text[256], *out = NULL;
  size_t len = 0;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(text, sizeof text, "{\"type\":\"record\",\"name\":\"R\",\"namespace\":\"%s\",\"fields\":[]}", bad[i]);
    cr_assert_eq(lt_avro_canonical_form(text, strlen(text), &out, &len, err, sizeof err), LT_ERR_INVALID,
                 "namespace %s", bad[i]);
    cr_assert(strstr(err, "invalid name"), "%s", err);
  }
  snprintf(text, sizeof text, "{\"type\":\"record\",\"name\":\"x.y.R\",\"namespace\":\"\",\"fields\":[]}");
  cr_assert_eq(lt_avro_canonical_form(text, strlen(text), &out, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(out, "{\"name\":\"x.y.R\",\"type\":\"record\",\"fields\":[]}");
  free(out);
}

Test(avro, canonical_forms_and_fingerprints_match_python_avro) {
  char path[] = "/tmp/lt_avro_ours_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  FILE *f = fdopen(fd, "w");
  for (size_t i = 0; i < lt_avro_registry_count(reg); i++) {
    const lt_avro_schema_t *s = lt_avro_registry_at(reg, i);
    char hex[17];
    lt_avro_fingerprint_hex(lt_avro_schema_fingerprint(s), hex);
    fprintf(f, "%s\t%d\t%s\t%s\n", lt_avro_schema_name(s), lt_avro_schema_version(s), hex,
            lt_avro_schema_canonical(s, NULL));
  }
  fclose(f);
  char args[1024];
  snprintf(args, sizeof args, "check %s %s/schemas", path, src_root());
  int rc = run_python(args);
  unlink(path);
  cr_assert_eq(rc, 0, "tests/schema_check.py check failed (see its output above)");
}

/* Samples written by python3-avro: one per schema version, every field set. */
typedef struct sample {
  char name[64];
  int version;
  char *json;
  uint8_t *msg;
  size_t msg_len;
} sample_t;

static size_t load_samples(sample_t *out, size_t cap) {
  char path[] = "/tmp/lt_avro_samples_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  char args[1024];
  snprintf(args, sizeof args, "samples %s/schemas %s", src_root(), path);
  cr_assert_eq(run_python(args), 0, "schema_check.py samples failed");
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  size_t n = 0;
  char *line = NULL;
  size_t lcap = 0;
  while (n < cap && getline(&line, &lcap, f) > 0) {
    char *name = strtok(line, "\t"), *ver = strtok(NULL, "\t"), *js = strtok(NULL, "\t"),
         *hex = strtok(NULL, "\t\n");
    cr_assert(name && ver && js && hex);
    snprintf(out[n].name, sizeof out[n].name, "%s", name);
    out[n].version = atoi(ver);
    out[n].json = strdup(js);
    out[n].msg = malloc(strlen(hex) / 2 + 1);
    out[n].msg_len = hex_decode(hex, out[n].msg, strlen(hex) / 2 + 1);
    n++;
  }
  free(line);
  fclose(f);
  unlink(path);
  return n;
}

static void free_samples(sample_t *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(s[i].json);
    free(s[i].msg);
  }
}

Test(avro, every_record_type_round_trips_through_json_and_binary) {
  sample_t s[64];
  size_t n = load_samples(s, 64);
  cr_assert_eq(n, lt_avro_registry_count(reg));
  for (size_t i = 0; i < n; i++) {
    const lt_avro_schema_t *sch = lt_avro_schema_find(reg, s[i].name, s[i].version);
    cr_assert_not_null(sch, "%s v%d", s[i].name, s[i].version);
    lt_avro_record_t *a, *b;
    cr_assert_eq(lt_avro_record_new_schema(reg, sch, &a, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_record_new_schema(reg, sch, &b, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_record_from_json(a, s[i].json, strlen(s[i].json), err, sizeof err), LT_OK,
                 "%s v%d: %s", s[i].name, s[i].version, err);
    const uint8_t *bytes;
    size_t len;
    cr_assert_eq(lt_avro_record_encode(a, &bytes, &len, err, sizeof err), LT_OK, "%s", err);
    /* Avro's binary encoding is deterministic: the same datum gives python3-avro's bytes. */
    cr_assert_eq(len, s[i].msg_len, "%s v%d: %zu bytes, python3-avro wrote %zu", s[i].name,
                 s[i].version, len, s[i].msg_len);
    cr_assert_eq(memcmp(bytes, s[i].msg, len), 0, "%s v%d: bytes differ from python3-avro's",
                 s[i].name, s[i].version);
    cr_assert_eq(lt_avro_record_decode(b, bytes, len, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_record_writer_version(b), s[i].version);
    json_t *ja, *jb, *want = json_loads(s[i].json, JSON_ALLOW_NUL, NULL);
    cr_assert_eq(lt_avro_record_to_jansson(a, &ja, err, sizeof err), LT_OK);
    cr_assert_eq(lt_avro_record_to_jansson(b, &jb, err, sizeof err), LT_OK);
    cr_assert(json_equal(ja, jb), "%s: decoded record differs", s[i].name);
    cr_assert(json_equal(jb, want), "%s: decoded record differs from the sample", s[i].name);
    json_decref(ja);
    json_decref(jb);
    json_decref(want);
    lt_avro_record_destroy(a);
    lt_avro_record_destroy(b);
  }
  free_samples(s, n);
}

Test(avro, we_decode_what_python_avro_wrote) {
  sample_t s[64];
  size_t n = load_samples(s, 64);
  lt_avro_decoder_t *dec;
  cr_assert_eq(lt_avro_decoder_new(reg, &dec, err, sizeof err), LT_OK);
  for (size_t i = 0; i < n; i++) {
    lt_avro_record_t *r;
    cr_assert_eq(lt_avro_decode(dec, s[i].msg, s[i].msg_len, &r, err, sizeof err), LT_OK,
                 "%s v%d: %s", s[i].name, s[i].version, err);
    cr_assert_str_eq(lt_avro_record_type(r), s[i].name);
    cr_assert_eq(lt_avro_record_writer_version(r), s[i].version);
    if (!lt_avro_schema_is_latest(lt_avro_schema_find(reg, s[i].name, s[i].version))) continue;
    json_t *got, *want = json_loads(s[i].json, JSON_ALLOW_NUL, NULL);
    cr_assert_eq(lt_avro_record_to_jansson(r, &got, err, sizeof err), LT_OK);
    char *g = json_dumps(got, JSON_COMPACT);
    cr_assert(json_equal(got, want), "%s: got %s", s[i].name, g);
    free(g);
    json_decref(got);
    json_decref(want);
  }
  lt_avro_decoder_destroy(dec);
  free_samples(s, n);
}

Test(avro, python_avro_decodes_what_we_wrote) {
  sample_t s[64];
  size_t n = load_samples(s, 64);
  char path[] = "/tmp/lt_avro_ourbytes_XXXXXX";
  int fd = mkstemp(path);
  FILE *f = fdopen(fd, "w");
  for (size_t i = 0; i < n; i++) {
    lt_avro_record_t *a;
    cr_assert_eq(lt_avro_record_new_schema(reg, lt_avro_schema_find(reg, s[i].name, s[i].version), &a, err, sizeof err), LT_OK);
    cr_assert_eq(lt_avro_record_from_json(a, s[i].json, strlen(s[i].json), err, sizeof err), LT_OK, "%s", err);
    const uint8_t *bytes;
    size_t len;
    cr_assert_eq(lt_avro_record_encode(a, &bytes, &len, err, sizeof err), LT_OK, "%s", err);
    fprintf(f, "%s\t%d\t%s\t", s[i].name, s[i].version, s[i].json);
    hex_encode(bytes, len, f);
    fprintf(f, "\n");
    lt_avro_record_destroy(a);
  }
  fclose(f);
  char args[1024];
  snprintf(args, sizeof args, "verify %s/schemas %s", src_root(), path);
  int rc = run_python(args);
  unlink(path);
  free_samples(s, n);
  cr_assert_eq(rc, 0, "python3-avro could not read our bytes (see output above)");
}

Test(avro, new_reader_reads_old_data_with_defaults) {
  lt_avro_record_t *v1, *v2;
  cr_assert_eq(lt_avro_record_new_schema(reg, lt_avro_schema_find(reg, "StepCompleted", 1), &v1, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &v2, err, sizeof err), LT_OK);
  fill_step(v1, 42);
  cr_assert_eq(lt_avro_set_double(v2, "epoch", 9.0), LT_OK); /* must be overwritten by the default */
  cr_assert_eq(lt_avro_set_double(v2, "grad_norm", 9.0), LT_OK);
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(v1, &b, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_decode(v2, b, len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_writer_version(v2), 1);
  int64_t step;
  double loss, epoch;
  bool null;
  cr_assert_eq(lt_avro_get_long(v2, "step", &step), LT_OK);
  cr_assert_eq(step, 42);
  cr_assert_eq(lt_avro_get_double(v2, "loss", &loss), LT_OK);
  cr_assert_float_eq(loss, 2.5 - 0.042, 1e-12);
  cr_assert_eq(lt_avro_get_double(v2, "epoch", &epoch), LT_OK);
  cr_assert_eq(epoch, 0.0);
  cr_assert_eq(lt_avro_is_null(v2, "grad_norm", &null), LT_OK);
  cr_assert(null);
  cr_assert_eq(lt_avro_get_double(v2, "grad_norm", &epoch), LT_ERR_NOT_FOUND);
  lt_avro_record_destroy(v1);
  lt_avro_record_destroy(v2);
  char args[512];
  snprintf(args, sizeof args, "evolve %s/schemas", src_root());
  cr_assert_eq(run_python(args), 0, "python3-avro disagrees on StepCompleted evolution");
}

/* A TenantUpserted record of this version (0: the newest). */
static lt_avro_record_t *tenant_record(int version) {
  lt_avro_record_t *r;
  const lt_avro_schema_t *s = version ? lt_avro_schema_find(reg, "TenantUpserted", version)
                                      : lt_avro_schema_latest(reg, "TenantUpserted");
  cr_assert_eq(lt_avro_record_new_schema(reg, s, &r, err, sizeof err), LT_OK, "%s", err);
  return r;
}

/* Tenant "acme" (weight 1, data key dek-1) with n new keys, admin keys all. */
static void acme_with_keys(lt_tenant_t *t, int n) {
  snprintf(t->tenant_id, sizeof t->tenant_id, "acme");
  snprintf(t->data_key_id, sizeof t->data_key_id, "dek-1");
  t->weight = 1.0;
  char key[LT_TENANT_API_KEY_SIZE];
  for (int i = 0; i < n; i++) cr_assert_eq(lt_tenant_add_key(t, false, i + 1, key), LT_OK);
}

/* t written as w's version, encoded, decoded into r (resolved to r's version) and folded into back. */
static void tenant_through(const lt_tenant_t *t, lt_avro_record_t *w, lt_avro_record_t *r, lt_tenant_t *back) {
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_tenant_to_record(t, w, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_encode(w, &b, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_decode(r, b, len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_tenant_from_record(r, back, err, sizeof err), LT_OK, "%s", err);
}

/* TenantUpserted v2 added quotas.max_storage_bytes: a v1 record (every tenant made before it)
 * reads as no quota of its own, a v2 one carries it, and a negative one is refused by name. */
Test(avro, a_tenant_record_of_v1_has_no_storage_quota_and_a_negative_one_is_refused) {
  lt_tenant_t t = {0}, back;
  acme_with_keys(&t, 0);
  t.quotas = (lt_tenant_quotas_t){.max_queued_jobs = 7, .max_storage_bytes = 123456};
  lt_avro_record_t *v1 = tenant_record(1), *v2 = tenant_record(0);
  cr_assert_eq(lt_avro_schema_version(lt_avro_schema_latest(reg, "TenantUpserted")), 5);
  /* v1 has no such field: a tenant with a quota of its own needs v2; one without is written v1
   * (`lathe admin tenant`), which every reader decodes */
  cr_assert_neq(lt_tenant_to_record(&t, v1, err, sizeof err), LT_OK);
  cr_assert(strstr(err, "max_storage_bytes (123456 asked)"), "%s", err);
  t.quotas.max_storage_bytes = 0;
  cr_assert_eq(lt_avro_set_long(v2, "quotas.max_storage_bytes", 99), LT_OK); /* the default overwrites it */
  tenant_through(&t, v1, v2, &back);
  cr_expect_eq(back.quotas.max_storage_bytes, 0);
  cr_expect_eq(back.quotas.max_queued_jobs, 7);
  t.quotas.max_storage_bytes = 123456;
  tenant_through(&t, v2, v2, &back);
  cr_expect_eq(back.quotas.max_storage_bytes, 123456);
  cr_assert_eq(lt_avro_set_long(v2, "quotas.max_storage_bytes", -5), LT_OK);
  cr_assert_eq(lt_tenant_from_record(v2, &back, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "quotas.max_storage_bytes is -5"), "%s", err);
  lt_avro_record_destroy(v1);
  lt_avro_record_destroy(v2);
}

/* A key's role (TenantUpserted v3): a key of an earlier record reads as an admin key; a member key
 * needs v3 to be written; a role this version does not know (a forged or broken record: a later
 * role comes in a later version) leaves the key authenticating nowhere. */
Test(avro, a_tenant_key_role_needs_v3_and_an_older_record_reads_as_admin_keys) {
  lt_tenant_t t = {0}, back;
  acme_with_keys(&t, 2);
  cr_assert_eq(t.keys[1].role, LT_TENANT_ROLE_ADMIN, "a new key is an admin key");
  lt_avro_record_t *v2 = tenant_record(2), *v3 = tenant_record(0);
  /* v2 (both admin keys) read by this version: admin keys */
  tenant_through(&t, v2, v3, &back);
  cr_expect(back.nkeys == 2 && back.keys[0].role == LT_TENANT_ROLE_ADMIN && back.keys[1].role == LT_TENANT_ROLE_ADMIN);
  /* a member key cannot be written as v2, and round-trips through v3 */
  t.keys[1].role = LT_TENANT_ROLE_MEMBER;
  cr_assert_eq(lt_tenant_to_record(&t, v2, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "is a member key: write v3"), "%s", err);
  tenant_through(&t, v3, v3, &back);
  cr_expect(back.keys[0].role == LT_TENANT_ROLE_ADMIN && back.keys[1].role == LT_TENANT_ROLE_MEMBER);
  cr_expect_eq(lt_tenant_key(&back, t.keys[1].key_id), &back.keys[1]);
  cr_expect_null(lt_tenant_key(&back, "0000000000000000"));
  /* a revoked member key's role is moot: v2 takes it (its key stays revoked) */
  back.keys[1].revoked = true;
  cr_assert_eq(lt_tenant_to_record(&back, v2, err, sizeof err), LT_OK, "%s", err);
  /* a role from a later version: the least this one knows */
  cr_assert_eq(lt_avro_set_string(v3, "api_keys[0].role", "owner"), LT_OK);
  cr_assert_eq(lt_tenant_from_record(v3, &back, err, sizeof err), LT_OK, "%s", err);
  cr_expect(back.keys[0].revoked && !back.keys[1].revoked, "an unknown role's key is revoked, the other kept");
  lt_avro_record_destroy(v2);
  lt_avro_record_destroy(v3);
}

/* A viewer key or a key's label needs v4: v3, which a reader not yet upgraded decodes, would hold a
 * viewer key as a member key there (an unknown role counts as member), so it refuses both; v4
 * round-trips them, and a v3 record reads with no labels. */
Test(avro, a_viewer_key_or_a_label_needs_v4) {
  lt_tenant_t t = {0}, back;
  acme_with_keys(&t, 3);
  t.keys[1].role = LT_TENANT_ROLE_MEMBER;
  t.keys[2].role = LT_TENANT_ROLE_VIEWER;
  lt_avro_record_t *v3 = tenant_record(3), *v4 = tenant_record(4);
  cr_assert_eq(lt_tenant_to_record(&t, v3, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "is a viewer key: write v4"), "%s", err);
  t.keys[2].role = LT_TENANT_ROLE_MEMBER;
  snprintf(t.keys[1].label, sizeof t.keys[1].label, "grafana");
  cr_assert_eq(lt_tenant_to_record(&t, v3, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "has no api_keys[].label") && strstr(err, "grafana"), "%s", err);
  t.keys[1].revoked = true; /* a revoked key's label is moot */
  tenant_through(&t, v3, v4, &back);
  cr_expect(back.nkeys == 3 && !back.keys[1].label[0] && back.keys[2].role == LT_TENANT_ROLE_MEMBER);
  t.keys[1].revoked = false;
  t.keys[2].role = LT_TENANT_ROLE_VIEWER;
  snprintf(t.keys[2].label, sizeof t.keys[2].label, "ci \"nightly\"");
  tenant_through(&t, v4, v4, &back);
  cr_expect(back.keys[0].role == LT_TENANT_ROLE_ADMIN && back.keys[1].role == LT_TENANT_ROLE_MEMBER &&
            back.keys[2].role == LT_TENANT_ROLE_VIEWER);
  cr_expect_str_eq(back.keys[1].label, "grafana");
  cr_expect_str_eq(back.keys[2].label, "ci \"nightly\"");
  cr_expect_eq(lt_avro_record_writer_version(v4), 4);
  lt_avro_record_destroy(v3);
  lt_avro_record_destroy(v4);
}

/* An inference key, or a key limited to some models, needs v5: a reader of v4 would take an
 * inference key for a viewer (which reads every GET) and a limited key for one that may use every
 * model, so v4 refuses both; v5 round-trips them, a revoked key's are moot, and a record whose
 * models break the limits is refused naming the field. */
Test(avro, an_inference_key_or_a_keys_models_need_v5) {
  lt_tenant_t t = {0}, back;
  acme_with_keys(&t, 2);
  t.keys[1].role = LT_TENANT_ROLE_INFERENCE;
  lt_avro_record_t *v4 = tenant_record(4), *v5 = tenant_record(5);
  cr_assert_eq(lt_tenant_to_record(&t, v4, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "is an inference key: write v5"), "%s", err);
  t.keys[1].role = LT_TENANT_ROLE_MEMBER;
  cr_assert(lt_tenant_key_add_model(&t.keys[1], "ft:tiny:job-1", err, sizeof err), "%s", err);
  cr_assert_eq(lt_tenant_to_record(&t, v4, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "has no api_keys[].models") && strstr(err, "ft:tiny:job-1") && strstr(err, "write v5"), "%s", err);
  t.keys[1].revoked = true; /* moot once revoked */
  tenant_through(&t, v4, v5, &back);
  cr_expect(back.nkeys == 2 && !back.keys[1].models[0], "a v4 record reads with no models");
  t.keys[1].revoked = false;
  t.keys[1].role = LT_TENANT_ROLE_INFERENCE;
  cr_assert(lt_tenant_key_add_model(&t.keys[1], "tiny", err, sizeof err), "%s", err);
  tenant_through(&t, v5, v5, &back);
  cr_expect_eq(back.keys[1].role, LT_TENANT_ROLE_INFERENCE);
  cr_expect_str_eq(back.keys[1].models, "ft:tiny:job-1 tiny");
  cr_expect(!back.keys[0].models[0] && back.keys[0].role == LT_TENANT_ROLE_ADMIN);
  cr_expect(lt_tenant_key_may_use(&back.keys[1], "tiny") && lt_tenant_key_may_use(&back.keys[1], "ft:tiny:job-1"));
  cr_expect(!lt_tenant_key_may_use(&back.keys[1], "ft:tiny:job-2") && !lt_tenant_key_may_use(&back.keys[1], "tin") &&
                !lt_tenant_key_may_use(&back.keys[1], "ft:tiny:job-1 tiny") && !lt_tenant_key_may_use(&back.keys[1], ""),
            "only the listed ids, whole");
  cr_expect(lt_tenant_key_may_use(&back.keys[0], "anything") && lt_tenant_key_may_use(NULL, "anything"));
  /* the tokenizers: of the models it may use, and of the bases of its adapters */
  lt_tenant_key_t only = {0};
  cr_assert(lt_tenant_key_add_model(&only, "ft:base2:job-9", err, sizeof err), "%s", err);
  cr_expect(lt_tenant_key_may_tokenize(&only, "base2") && !lt_tenant_key_may_tokenize(&only, "base") &&
            !lt_tenant_key_may_tokenize(&only, "base22") && !lt_tenant_key_may_tokenize(&only, "ft"));
  cr_expect(lt_tenant_key_may_tokenize(&back.keys[1], "tiny") && lt_tenant_key_may_tokenize(NULL, "any"));
  cr_expect_eq(lt_avro_record_writer_version(v5), 5);
  /* the limits, in the CLI's helper and in a record that breaks them */
  lt_tenant_key_t k = {0};
  const char *bad[] = {"", "a b", "caf\xc3\xa9", "tab\there"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    cr_expect(!lt_tenant_key_add_model(&k, bad[i], err, sizeof err), "model \"%s\" was taken", bad[i]);
  char big[LT_TENANT_MODELS_BYTES + 8];
  memset(big, 'm', sizeof big - 1);
  big[sizeof big - 1] = 0;
  cr_expect(!lt_tenant_key_add_model(&k, big, err, sizeof err) && strstr(err, "over 255"), "%s", err);
  for (int i = 0; i < LT_TENANT_MODELS_MAX; i++) {
    char id[16];
    snprintf(id, sizeof id, "m%d", i);
    cr_assert(lt_tenant_key_add_model(&k, id, err, sizeof err), "%s", err);
  }
  cr_expect(!lt_tenant_key_add_model(&k, "m9", err, sizeof err) && strstr(err, "more than 8"), "%s", err);
  cr_expect(!lt_tenant_key_add_model(&k, "m3", err, sizeof err), "a model listed twice");
  cr_assert_eq(lt_avro_array_append_string(v5, "api_keys[1].models", "has space"), LT_OK);
  cr_assert_eq(lt_tenant_from_record(v5, &back, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, "api_keys[1].models[2]") && strstr(err, "space"), "%s", err);
  /* a forged record's other ways past the limits: each refused naming the field */
  const char *forged[][2] = {{"", "is empty"}, {"tiny", "listed twice"}, {"t\0x", "NUL"}, {NULL, "more than 8"}};
  for (size_t f = 0; f < sizeof forged / sizeof *forged; f++) {
    cr_assert_eq(lt_avro_array_clear(v5, "api_keys[1].models"), LT_OK);
    cr_assert_eq(lt_avro_array_append_string(v5, "api_keys[1].models", "tiny"), LT_OK);
    size_t idx;
    char at[64];
    if (forged[f][0] && f == 2) { /* a string with a NUL inside: set as bytes of that length */
      cr_assert_eq(lt_avro_array_append(v5, "api_keys[1].models", &idx), LT_OK);
      snprintf(at, sizeof at, "api_keys[1].models[%zu]", idx);
      cr_assert_eq(lt_avro_set_string_len(v5, at, "t\0x", 3), LT_OK);
    } else if (forged[f][0]) {
      cr_assert_eq(lt_avro_array_append_string(v5, "api_keys[1].models", forged[f][0]), LT_OK);
    } else {
      for (int m = 0; m < LT_TENANT_MODELS_MAX; m++) {
        snprintf(at, sizeof at, "m%d", m);
        cr_assert_eq(lt_avro_array_append_string(v5, "api_keys[1].models", at), LT_OK);
      }
    }
    cr_assert_eq(lt_tenant_from_record(v5, &back, err, sizeof err), LT_ERR_INVALID, "forged case %zu was taken", f);
    cr_expect(strstr(err, "api_keys[1].models[") && strstr(err, forged[f][1]), "%s", err);
  }
  lt_avro_record_destroy(v4);
  lt_avro_record_destroy(v5);
}

Test(avro, old_reader_reads_new_data) {
  lt_avro_record_t *v1, *v2;
  cr_assert_eq(lt_avro_record_new_schema(reg, lt_avro_schema_find(reg, "StepCompleted", 1), &v1, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &v2, err, sizeof err), LT_OK);
  fill_step(v2, 7);
  cr_assert_eq(lt_avro_set_double(v2, "epoch", 1.25), LT_OK);
  cr_assert_eq(lt_avro_set_double(v2, "grad_norm", 0.5), LT_OK);
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(v2, &b, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_decode(v1, b, len, err, sizeof err), LT_OK, "%s", err);
  int64_t step, eta;
  const char *job;
  cr_assert_eq(lt_avro_get_long(v1, "step", &step), LT_OK);
  cr_assert_eq(step, 7);
  cr_assert_eq(lt_avro_get_long(v1, "eta_ms", &eta), LT_OK);
  cr_assert_eq(eta, 95000);
  cr_assert_eq(lt_avro_get_string(v1, "job_id", &job, NULL), LT_OK);
  cr_assert_str_eq(job, "job-0001");
  double x;
  cr_assert_eq(lt_avro_get_double(v1, "epoch", &x), LT_ERR_INVALID); /* v1 has no such field */
  lt_avro_record_destroy(v1);
  lt_avro_record_destroy(v2);
}

/* An enum symbol an old reader does not know reads as the enum's default: AttemptStopped v2's
 * "unavailable" (an attempt that never ran, not to be counted) is "failed" to a v1 reader, which
 * counts it, the safe side; a symbol both know passes unchanged. */
Test(avro, old_reader_reads_a_new_enum_symbol_as_its_default) {
  static const char *const sent[] = {"unavailable", "preempt"}, *const seen[] = {"failed", "preempt"};
  for (int i = 0; i < 2; i++) {
    lt_avro_record_t *v1, *v2;
    cr_assert_eq(lt_avro_record_new_schema(reg, lt_avro_schema_find(reg, "AttemptStopped", 1), &v1, err, sizeof err),
                 LT_OK);
    cr_assert_eq(lt_avro_record_new(reg, "AttemptStopped", &v2, err, sizeof err), LT_OK);
    char json[512];
    snprintf(json, sizeof json,
             "{\"event_id\": \"e1\", \"occurred_at\": 1, \"producer\": \"worker/w1\", \"job_id\": \"j1\", "
             "\"tenant_id\": \"t1\", \"attempt\": 4, \"reason\": \"%s\", \"step\": 0, \"killed\": false, "
             "\"detail\": null}",
             sent[i]);
    cr_assert_eq(lt_avro_record_from_json(v2, json, strlen(json), err, sizeof err), LT_OK, "%s", err);
    const uint8_t *b;
    size_t len;
    cr_assert_eq(lt_avro_record_encode(v2, &b, &len, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_record_decode(v1, b, len, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(lt_avro_record_writer_version(v1), 2);
    const char *reason;
    cr_assert_eq(lt_avro_get_enum(v1, "reason", &reason), LT_OK);
    cr_assert_str_eq(reason, seen[i]);
    lt_avro_record_destroy(v1);
    lt_avro_record_destroy(v2);
  }
}

static lt_avro_record_t *encoded_step(const uint8_t **b, size_t *len) {
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err), LT_OK);
  fill_step(r, 3);
  cr_assert_eq(lt_avro_record_encode(r, b, len, err, sizeof err), LT_OK, "%s", err);
  return r;
}

/* A StepCompleted encoded into b/len, a copy of its bytes to damage (msg) and a StepCompleted to
 * decode into (d). */
typedef struct damaged {
  lt_avro_record_t *r, *d;
  const uint8_t *b;
  size_t len;
  uint8_t msg[512];
} damaged_t;

static void damaged_open(damaged_t *x) {
  x->r = encoded_step(&x->b, &x->len);
  memcpy(x->msg, x->b, x->len);
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &x->d, err, sizeof err), LT_OK);
}

static void damaged_close(damaged_t *x) {
  lt_avro_record_destroy(x->d);
  lt_avro_record_destroy(x->r);
}

Test(avro, unknown_fingerprint_is_refused_and_named) {
  damaged_t x;
  damaged_open(&x);
  x.msg[2] ^= 0x01;
  char hex[17];
  uint64_t fp;
  cr_assert_eq(lt_avro_peek(x.msg, x.len, &fp, NULL, 0), LT_OK);
  lt_avro_fingerprint_hex(fp, hex);
  cr_assert_eq(lt_avro_record_decode(x.d, x.msg, x.len, err, sizeof err), LT_ERR_UNKNOWN_SCHEMA);
  cr_assert(strstr(err, hex), "message does not name the fingerprint: %s", err);
  lt_avro_decoder_t *dec;
  lt_avro_record_t *out;
  cr_assert_eq(lt_avro_decoder_new(reg, &dec, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_decode(dec, x.msg, x.len, &out, err, sizeof err), LT_ERR_UNKNOWN_SCHEMA);
  lt_avro_decoder_destroy(dec);
  damaged_close(&x);
}

Test(avro, wrong_magic_and_short_header_are_refused) {
  damaged_t x;
  damaged_open(&x);
  x.msg[0] = 0x4f; /* e.g. a JSON or Confluent-framed payload */
  cr_assert_eq(lt_avro_record_decode(x.d, x.msg, x.len, err, sizeof err), LT_ERR_CORRUPT);
  cr_assert(strstr(err, "magic"), "%s", err);
  x.msg[0] = 0xC3;
  x.msg[1] = 0x02;
  cr_assert_eq(lt_avro_record_decode(x.d, x.msg, x.len, err, sizeof err), LT_ERR_CORRUPT);
  for (size_t cut = 0; cut < LT_AVRO_HEADER_SIZE; cut++)
    cr_assert_eq(lt_avro_record_decode(x.d, x.b, cut, err, sizeof err), LT_ERR_CORRUPT, "cut %zu", cut);
  damaged_close(&x);
}

Test(avro, every_truncation_and_trailing_bytes_are_refused) {
  damaged_t x;
  damaged_open(&x);
  for (size_t cut = LT_AVRO_HEADER_SIZE; cut < x.len; cut++) {
    lt_err_t rc = lt_avro_record_decode(x.d, x.msg, cut, err, sizeof err);
    cr_assert_eq(rc, LT_ERR_CORRUPT, "truncated to %zu of %zu bytes gave %s", cut, x.len, lt_err_name(rc));
  }
  x.msg[x.len] = 0;
  cr_assert_eq(lt_avro_record_decode(x.d, x.msg, x.len + 1, err, sizeof err), LT_ERR_CORRUPT);
  cr_assert(strstr(err, "trailing"), "%s", err);
  cr_assert_eq(lt_avro_record_decode(x.d, x.msg, x.len, err, sizeof err), LT_OK, "%s", err);
  damaged_close(&x);
}

Test(avro, record_of_another_type_is_refused) {
  const uint8_t *b;
  size_t len;
  lt_avro_record_t *r = encoded_step(&b, &len), *d;
  cr_assert_eq(lt_avro_record_new(reg, "JobFailed", &d, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_decode(d, b, len, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "StepCompleted"), "%s", err);
  lt_avro_record_destroy(d);
  lt_avro_record_destroy(r);
}

Test(avro, typed_access_handles_nested_fields_arrays_unions_and_enums) {
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &r, err, sizeof err), LT_OK);
  int32_t rank;
  cr_assert_eq(lt_avro_get_int(r, "hyperparameters.lora_rank", &rank), LT_OK);
  cr_assert_eq(rank, 16, "schema default");
  size_t n;
  cr_assert_eq(lt_avro_array_size(r, "hyperparameters.target_modules", &n), LT_OK);
  cr_assert_eq(n, 7);
  cr_assert_eq(lt_avro_set_int(r, "hyperparameters.lora_rank", 8), LT_OK);
  cr_assert_eq(lt_avro_array_clear(r, "hyperparameters.target_modules"), LT_OK);
  cr_assert_eq(lt_avro_array_append_string(r, "hyperparameters.target_modules", "q_proj"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "hyperparameters.target_modules[1]", "v_proj"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "hyperparameters.target_modules[5]", "x"), LT_ERR_INVALID);
  cr_assert(strstr(lt_avro_record_error(r), "out of range"), "%s", lt_avro_record_error(r));
  const char *sym, *s;
  cr_assert_eq(lt_avro_get_enum(r, "priority", &sym), LT_OK);
  cr_assert_str_eq(sym, "standard");
  cr_assert_eq(lt_avro_set_enum(r, "priority", "production"), LT_OK);
  cr_assert_eq(lt_avro_set_enum(r, "priority", "urgent"), LT_ERR_INVALID);
  cr_assert(strstr(lt_avro_record_error(r), "production"), "%s", lt_avro_record_error(r));
  bool null;
  cr_assert_eq(lt_avro_is_null(r, "validation_dataset_id", &null), LT_OK);
  cr_assert(null);
  cr_assert_eq(lt_avro_set_string(r, "validation_dataset_id", "ds-val"), LT_OK);
  cr_assert_eq(lt_avro_get_string(r, "validation_dataset_id", &s, NULL), LT_OK);
  cr_assert_str_eq(s, "ds-val");
  cr_assert_eq(lt_avro_set_string(r, "no_such_field", "x"), LT_ERR_INVALID);
  cr_assert(strstr(lt_avro_record_error(r), "no_such_field"));
  cr_assert_eq(lt_avro_set_string(r, "gpus", "x"), LT_ERR_INVALID);
  cr_assert_eq(lt_avro_record_stamp(r, "api/test"), LT_OK);
  cr_assert_eq(lt_avro_get_string(r, "event_id", &s, &n), LT_OK);
  cr_assert_eq(n, 36);
  /* Round trip keeps all of it. */
  lt_avro_record_t *d;
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(r, &b, &len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &d, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_decode(d, b, len, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_get_int(d, "hyperparameters.lora_rank", &rank), LT_OK);
  cr_assert_eq(rank, 8);
  cr_assert_eq(lt_avro_get_string(d, "hyperparameters.target_modules[1]", &s, NULL), LT_OK);
  cr_assert_str_eq(s, "v_proj");
  cr_assert_eq(lt_avro_get_enum(d, "priority", &sym), LT_OK);
  cr_assert_str_eq(sym, "production");
  /* Arrays of records: heartbeat leases. */
  lt_avro_record_t *hb;
  cr_assert_eq(lt_avro_record_new(reg, "WorkerHeartbeat", &hb, err, sizeof err), LT_OK);
  size_t idx;
  cr_assert_eq(lt_avro_array_append(hb, "leases", &idx), LT_OK);
  cr_assert_eq(idx, 0);
  cr_assert_eq(lt_avro_set_string(hb, "leases[0].job_id", "job-9"), LT_OK);
  cr_assert_eq(lt_avro_set_int(hb, "leases[0].attempt", 3), LT_OK);
  cr_assert_eq(lt_avro_set_string(hb, "leases[1].job_id", "job-10"), LT_OK);
  cr_assert_eq(lt_avro_array_size(hb, "leases", &n), LT_OK);
  cr_assert_eq(n, 2);
  int32_t att;
  cr_assert_eq(lt_avro_get_int(hb, "leases[0].attempt", &att), LT_OK);
  cr_assert_eq(att, 3);
  lt_avro_record_destroy(hb);
  lt_avro_record_destroy(d);
  lt_avro_record_destroy(r);
}

Test(avro, bad_json_names_the_field_and_what_was_expected) {
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err), LT_OK);
  const char *missing = "{\"event_id\":\"e\",\"occurred_at\":1,\"producer\":\"p\"}";
  cr_assert_eq(lt_avro_record_from_json(r, missing, strlen(missing), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "job_id") && strstr(err, "missing"), "%s", err);
  const char *wrong = "{\"event_id\":\"e\",\"occurred_at\":\"yesterday\"}";
  cr_assert_eq(lt_avro_record_from_json(r, wrong, strlen(wrong), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "occurred_at") && strstr(err, "integer"), "%s", err);
  const char *unknown = "{\"prompt\":\"hello\"}";
  cr_assert_eq(lt_avro_record_from_json(r, unknown, strlen(unknown), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "prompt"), "%s", err);
  const char *syntax = "{\"event_id\":";
  cr_assert_eq(lt_avro_record_from_json(r, syntax, strlen(syntax), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "line 1"), "%s", err);
  lt_avro_record_t *j;
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &j, err, sizeof err), LT_OK);
  const char *nested =
      "{\"event_id\":\"e\",\"occurred_at\":1,\"producer\":\"p\",\"job_id\":\"j\",\"tenant_id\":\"t\","
      "\"base_model\":\"m\",\"dataset_id\":\"d\",\"hyperparameters\":{\"lora_rank\":\"big\"},"
      "\"priority\":\"standard\",\"max_duration_s\":60,\"gpus\":0,\"mode\":\"managed\"}";
  cr_assert_eq(lt_avro_record_from_json(j, nested, strlen(nested), err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "hyperparameters.lora_rank"), "%s", err);
  lt_avro_record_destroy(j);
  lt_avro_record_destroy(r);
}

/* avro-c allocator that counts calls, to prove the hot path allocates nothing once warm. */
static size_t avro_allocs;
static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  (void)osize;
  if (nsize == 0) {
    free(ptr);
    return NULL;
  }
  avro_allocs++;
  return realloc(ptr, nsize);
}

Test(avro, encode_and_decode_allocate_nothing_once_warm) {
  avro_set_allocator(counting_alloc, NULL);
  lt_avro_record_t *w, *r;
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &w, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, "StepCompleted", &r, err, sizeof err), LT_OK);
  const uint8_t *b;
  size_t len;
  for (int warm = 0; warm < 3; warm++) {
    fill_step(w, warm);
    cr_assert_eq(lt_avro_record_encode(w, &b, &len, err, sizeof err), LT_OK);
    cr_assert_eq(lt_avro_record_decode(r, b, len, err, sizeof err), LT_OK);
  }
  avro_allocs = 0;
  for (int i = 0; i < 1000; i++) {
    cr_assert_eq(lt_avro_set_long(w, "step", i), LT_OK);
    cr_assert_eq(lt_avro_set_double(w, "loss", 1.0 / (i + 1)), LT_OK);
    cr_assert_eq(lt_avro_set_string(w, "job_id", i % 2 ? "job-0001" : "job-0002"), LT_OK);
    cr_assert_eq(lt_avro_record_encode(w, &b, &len, err, sizeof err), LT_OK);
    cr_assert_eq(lt_avro_record_decode(r, b, len, err, sizeof err), LT_OK);
  }
  cr_assert_eq(avro_allocs, 0, "%zu avro-c allocations in 1000 encode+decode", avro_allocs);
  int64_t step;
  cr_assert_eq(lt_avro_get_long(r, "step", &step), LT_OK);
  cr_assert_eq(step, 999);
  lt_avro_record_destroy(w);
  lt_avro_record_destroy(r);
}

/* Words that would mean a field holds what customers wrote or what a model generated. */
static const char *content_words[] = {"text", "texts", "prompt", "prompts", "completion",
                                      "completions", "content", "contents", "message", "messages",
                                      "chat", "conversation", "input", "inputs", "output",
                                      "outputs", "response", "responses", "instruction",
                                      "sample", "samples", "generation", "generated", "answer",
                                      "question", "transcript", "document", "example_text"};

static void check_names(const json_t *t, const char *rec, int *bad) {
  if (json_is_array(t)) {
    for (size_t i = 0; i < json_array_size(t); i++) check_names(json_array_get(t, i), rec, bad);
    return;
  }
  if (!json_is_object(t)) return;
  json_t *fields = json_object_get(t, "fields");
  for (size_t i = 0; i < json_array_size(fields); i++) {
    json_t *f = json_array_get(fields, i);
    const char *name = json_string_value(json_object_get(f, "name"));
    char buf[128];
    snprintf(buf, sizeof buf, "%s", name);
    for (char *w = strtok(buf, "_"); w; w = strtok(NULL, "_"))
      for (size_t k = 0; k < sizeof content_words / sizeof content_words[0]; k++)
        if (strcmp(w, content_words[k]) == 0) {
          cr_log_error("%s.%s suggests customer content", rec, name);
          (*bad)++;
        }
    check_names(json_object_get(f, "type"), rec, bad);
  }
  check_names(json_object_get(t, "items"), rec, bad);
  check_names(json_object_get(t, "values"), rec, bad);
  if (json_is_object(json_object_get(t, "type"))) check_names(json_object_get(t, "type"), rec, bad);
}

Test(avro, no_schema_field_name_suggests_customer_content) {
  int bad = 0;
  for (size_t i = 0; i < lt_avro_registry_count(reg); i++) {
    const lt_avro_schema_t *s = lt_avro_registry_at(reg, i);
    size_t len;
    const char *js = lt_avro_schema_json(s, &len);
    json_t *t = json_loadb(js, len, 0, NULL);
    cr_assert_not_null(t);
    check_names(t, lt_avro_schema_name(s), &bad);
    json_decref(t);
  }
  cr_assert_eq(bad, 0, "%d field names suggest customer content", bad);
}
