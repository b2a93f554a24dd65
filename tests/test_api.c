/* lathed api from the outside: each test starts `lathed --role api --port 0` as a child process
 * with its own topic prefix (tapi<runner pid>.) and a test master key, against the real broker
 * and S3 server, creates tenants with `lathe admin tenant create`, and talks HTTP through
 * lt_client. Bad input of every endpoint gets the documented status and code and changes
 * nothing; an acknowledgement means the record is in the topic (read back with a consumer);
 * tenants are isolated (invariant 7); SSE is ordered and resumable; a restarted API answers the
 * same states and digest. Not here yet: the broker-down case (503, never 201), which needs an
 * in-process lt_api on librdkafka's mock cluster (the shared broker cannot be taken down). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "lt_api.h"
#include "lt_bus_int.h" /* rdkafka.h before rdkafka_mock.h */
#include "lt_crypto.h"
#include "lt_store.h"
#include "lt_tenant.h"
#include "lt_test.h"
#include <librdkafka/rdkafka_mock.h>

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static char prefix[64];
static char err[1024];

typedef struct srv {
  lt_test_proc_t *proc;
  char url[64];
  char ops_url[64]; /* the operator port: /healthz, /metrics */
  unsigned port, ops_port;
} srv_t;

static srv_t api;             /* the API of the current test */
static lt_client_t *ca, *cb;  /* tenants A and B */
static char tenant_a[64], tenant_b[64], key_a[128], key_b[128];

/* ---------------------------------------------------------------- lathed as a child */

/* `lathed --role api --port 0 --operator-port 0` with the extra arguments args and NAME=VALUE
 * strings env (each NULL-terminated, may be NULL), ready: the projection has caught up (healthz
 * 200 on the operator port). */
static srv_t start_api_with(const char *const *args, const char *const *env) {
  static int n;
  srv_t s = {0};
  char log[256];
  snprintf(log, sizeof log, "/tmp/test_api.%d.%d.log", (int)getpid(), n++);
  const char *argv[24] = {lt_test_lathed_bin(), "--role", "api", "--port", "0", "--operator-port", "0"};
  for (int i = 0; args && args[i] && i < 16; i++) argv[7 + i] = args[i];
  const char *envs[16] = {"LATHE_INSTANCE=api"};
  for (int i = 0; env && env[i] && i < 14; i++) envs[1 + i] = env[i];
  s.proc = lt_test_spawn(&(lt_test_spawn_t){.name = "api", .log = log, .argv = argv, .env = envs});
  s.port = lt_test_proc_port(s.proc, 30000);
  s.ops_port = lt_test_proc_operator_port(s.proc, 30000);
  snprintf(s.url, sizeof s.url, "http://127.0.0.1:%u", s.port);
  snprintf(s.ops_url, sizeof s.ops_url, "http://127.0.0.1:%u", s.ops_port);
  lt_test_wait_healthy(s.ops_url, log, 30000);
  return s;
}

static srv_t start_api(void) { return start_api_with(NULL, NULL); }

/* Stops it; the test fails unless it exits 0 (a sanitizer build's leak check included). */
static void stop_api(srv_t *s) { lt_test_proc_stop_clean(s->proc, 10000); }

/* ---------------------------------------------------------------- tenants, helpers */

static void new_tenant(const char *tag, const char *opts, char *id, size_t idn, char *key, size_t keyn) {
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(id, idn, "%s-%.10s", tag, rnd);
  lt_test_tenant_create(id, opts, key, keyn);
}

static lt_client_t *client_for(const char *key) { return lt_test_client(api.url, key, 90); }

/* One request; asserts the transport worked. */
static lt_client_resp_t req(lt_client_t *c, const char *method, const char *path, const char *body) {
  return lt_test_req(c, method, path, body, body ? strlen(body) : 0);
}
static const char *err_code(const lt_client_resp_t *r) {
  return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}

static void expect_error(lt_client_t *c, const char *method, const char *path, const char *body, int status,
                         const char *code) {
  lt_client_resp_t r = req(c, method, path, body);
  cr_expect_eq(r.status, status, "%s %s: status %d, wanted %d: %s", method, path, r.status, status, r.body);
  if (code) cr_expect_str_eq(err_code(&r) ? err_code(&r) : "(none)", code, "%s %s: %s", method, path, r.body);
  lt_client_resp_free(&r);
}

/* Waits until the API knows the tenant's key (it folds lathe.tenants asynchronously). */
static void wait_key(lt_client_t *c) {
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 200, 20000, 100,
                     "the API never accepted a new tenant's key");
}

static void produce_json(const char *base, const char *type, const char *key, json_t *obj);
static void produce_jsons(const char *base, const char *type, const char *key, json_t **objs, int n);
static void produce_job_cancelled(const char *job_id, const char *tenant);
static json_int_t pending_call(lt_client_t *c, char sess[64]);

static const char *valid_jsonl = "{\"prompt\":\"Say hi\",\"completion\":\"hi\"}\n"
                                 "{\"prompt\":\"2+2?\",\"completion\":\"4\"}\n";

static void upload(lt_client_t *c, char *id, size_t n) {
  lt_client_resp_t r = req(c, "POST", "/v1/datasets?name=small", valid_jsonl);
  cr_assert_eq(r.status, 201, "upload: %d %s", r.status, r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

static lt_client_resp_t submit(lt_client_t *c, const char *dataset, const char *idem) {
  char body[512];
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"lora_rank\":8}}",
           dataset);
  json_t *j = json_loads(body, 0, NULL);
  lt_client_resp_t r;
  cr_assert_eq(lt_client_json(c, "POST", "/v1/jobs", j, idem, &r, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  return r;
}

/* Submits a job on dataset (201 expected): its id into id. */
static void submit_ok(lt_client_t *c, const char *dataset, char *id, size_t n) {
  lt_client_resp_t r = submit(c, dataset, NULL);
  cr_assert_eq(r.status, 201, "%s", r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

static json_t *list_jobs(lt_client_t *c) {
  lt_client_resp_t r = req(c, "GET", "/v1/jobs?limit=500", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *jobs = json_incref(json_object_get(r.json, "jobs"));
  lt_client_resp_free(&r);
  return jobs;
}

/* The records of type (and job_id, NULL for any) in topic base, read from the beginning until the
 * topic is quiet for 1.5 s. New reference. */
static json_t *records_of(const char *base, const char *type, const char *job_id) {
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){base, NULL});
  lt_test_tail_settle(t, 1500);
  json_t *found = lt_test_tail_select(t, NULL, type, job_id, 0);
  lt_test_tail_close(t);
  return found;
}

static int count_records(const char *base, const char *type, const char *job_id) {
  json_t *found = records_of(base, type, job_id);
  int n = (int)json_array_size(found);
  json_decref(found);
  return n;
}

/* JobSubmitted records that name dataset ds, read from the beginning to the end. A fresh dataset's
 * count does not depend on records other tests write meanwhile, nor on one the settle missed. */
static int count_submissions_of(const char *ds) {
  json_t *found = records_of("jobs", "JobSubmitted", NULL), *rec;
  size_t i;
  int n = 0;
  json_array_foreach(found, i, rec) {
    const char *d = lt_test_rs(rec, "dataset_id");
    n += d && strcmp(d, ds) == 0;
  }
  json_decref(found);
  return n;
}

/* ---------------------------------------------------------------- suite */

static void setup(void) {
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT"))
    cr_assert_fail("needs the local stack: ops/stack up && eval \"$(ops/stack env)\"");
  /* One prefix for the whole run (the runner's pid): topics are made once and reused. */
  snprintf(prefix, sizeof prefix, "tapi%d.", (int)getppid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  /* These tests send bad keys and poll for new ones on purpose; the tests of the limits start
   * their own API with the limits they check. */
  setenv("LATHE_API_AUTH_FAIL_RATE", "100/1000", 1);
  lt_test_admin_topics();
  new_tenant("a", "--max-queued 3 --max-dataset-bytes 4096", tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  new_tenant("b", NULL, tenant_b, sizeof tenant_b, key_b, sizeof key_b);
  api = start_api();
  ca = client_for(key_a);
  cb = client_for(key_b);
  wait_key(ca);
  wait_key(cb);
}

static void teardown(void) {
  lt_client_destroy(ca);
  lt_client_destroy(cb);
  ca = cb = NULL;
  stop_api(&api);
}

TestSuite(api, .init = setup, .fini = teardown, .timeout = 240);

/* ---------------------------------------------------------------- acknowledgement = durable */

Test(api, acknowledged_submission_is_in_lathe_jobs_and_an_idempotency_key_makes_one_job) {
  char ds[64];
  upload(ca, ds, sizeof ds);
  lt_client_resp_t r1 = submit(ca, ds, "retry-me-1");
  cr_assert_eq(r1.status, 201, "%s", r1.body);
  const char *id = json_string_value(json_object_get(r1.json, "id"));
  cr_assert(id);
  cr_expect_str_eq(json_string_value(json_object_get(r1.json, "state")), "submitted");
  /* Acknowledged means durable: the record is in the topic right now. */
  cr_assert_eq(count_records("jobs", "JobSubmitted", id), 1);
  lt_client_resp_t r2 = submit(ca, ds, "retry-me-1");
  cr_assert_eq(r2.status, 200, "%s", r2.body);
  cr_assert_str_eq(json_string_value(json_object_get(r2.json, "id")), id);
  cr_assert_eq(count_records("jobs", "JobSubmitted", id), 1, "a second JobSubmitted for the same key");
  /* The same key with a different request is refused: answering with the first job would hide
   * that the second was never submitted. */
  char body[512];
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"lora_rank\":16}}",
           ds);
  json_t *other = json_loads(body, 0, NULL);
  lt_client_resp_t r4;
  cr_assert_eq(lt_client_json(ca, "POST", "/v1/jobs", other, "retry-me-1", &r4, err, sizeof err), LT_OK, "%s", err);
  json_decref(other);
  cr_expect_eq(r4.status, 422, "%s", r4.body);
  json_t *e4 = json_object_get(r4.json, "error");
  cr_expect_str_eq(json_string_value(json_object_get(e4, "code")), "idempotency_key_reused", "%s", r4.body);
  cr_expect_str_eq(json_string_value(json_object_get(e4, "field")), "Idempotency-Key", "%s", r4.body);
  cr_expect_eq(count_records("jobs", "JobSubmitted", id), 1, "the refused request recorded nothing");
  lt_client_resp_free(&r4);
  /* The same key from another tenant is another job. */
  char dsb[64];
  upload(cb, dsb, sizeof dsb);
  lt_client_resp_t r3 = submit(cb, dsb, "retry-me-1");
  cr_assert_eq(r3.status, 201, "%s", r3.body);
  cr_assert_str_neq(json_string_value(json_object_get(r3.json, "id")), id);
  lt_client_resp_free(&r1);
  lt_client_resp_free(&r2);
  lt_client_resp_free(&r3);
}

/* A job's precision reaches its record, and the API shows it back. */
Test(api, a_jobs_precision_is_recorded_and_shown_back) {
  char ds[64], body[512];
  upload(ca, ds, sizeof ds);
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\",\"hyperparameters\":"
           "{\"precision\":\"bf16\"}}", ds);
  lt_client_resp_t r = req(ca, "POST", "/v1/jobs", body);
  cr_assert_eq(r.status, 201, "%s", r.body);
  const char *id = json_string_value(json_object_get(r.json, "id"));
  cr_assert_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(r.json, "spec"), "hyperparameters"), "precision")),
                   "bf16",
                   "%s", r.body);
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"jobs", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *found = lt_test_tail_select(t, NULL, "JobSubmitted", id, 0);
  cr_assert_eq(json_array_size(found), 1);
  json_t *hp = json_object_get(json_object_get(json_array_get(found, 0), "r"), "hyperparameters");
  cr_assert_str_eq(json_string_value(json_object_get(hp, "precision")), "bf16");
  json_decref(found);
  lt_test_tail_close(t);
  lt_client_resp_free(&r);
}

/* ---------------------------------------------------------------- bad input */

Test(api, bad_job_submissions_get_their_documented_errors_and_record_nothing) {
  char ds[64], body[512];
  upload(ca, ds, sizeof ds);
  snprintf(body, sizeof body, "{\"base_model\":5,\"dataset_id\":\"%s\"}", ds);
  expect_error(ca, "POST", "/v1/jobs", body, 400, "invalid");
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\",\"colour\":\"red\"}", ds);
  expect_error(ca, "POST", "/v1/jobs", body, 400, "invalid");
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"lora_rank\":\"8\"}}", ds);
  expect_error(ca, "POST", "/v1/jobs", body, 400, "invalid");
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"learning_rate\":5}}", ds);
  lt_client_resp_t r = req(ca, "POST", "/v1/jobs", body);
  cr_expect_eq(r.status, 400);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")),
                   "hyperparameters.learning_rate", "%s", r.body);
  lt_client_resp_free(&r);
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"precision\":\"fp8\"}}",
           ds);
  r = req(ca, "POST", "/v1/jobs", body);
  cr_expect_eq(r.status, 400);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")),
                   "hyperparameters.precision", "%s", r.body);
  lt_client_resp_free(&r);
  expect_error(ca, "POST", "/v1/jobs", "{\"base_model\":", 400, "invalid");
  expect_error(ca, "POST", "/v1/jobs", "[1,2]", 400, "invalid");
  expect_error(ca, "POST", "/v1/jobs", "{\"base_model\":\"m\",\"dataset_id\":\"ds-none\"}", 404, "not_found");
  /* the look-up runs on the work pool: the answer still names the field and the dataset, in the
   * route's own words */
  r = req(ca, "POST", "/v1/jobs", "{\"base_model\":\"m\",\"dataset_id\":\"ds-none2\"}");
  cr_expect(r.status == 404 && strstr(r.body, "dataset_id: no dataset ds-none2"), "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\",\"validation_dataset_id\":\"ds-none3\"}", ds);
  r = req(ca, "POST", "/v1/jobs", body);
  cr_expect(r.status == 404 && strstr(r.body, "validation_dataset_id: no dataset ds-none3"), "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  r = req(ca, "POST", "/v1/fine_tuning/jobs", "{\"model\":\"m\",\"training_file\":\"ds-none4\"}");
  cr_expect(r.status == 404 && strstr(r.body, "training_file: no file ds-none4"), "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  /* A body over 64 KiB. */
  size_t big = 70 * 1024;
  char *huge = malloc(big + 64);
  snprintf(huge, 64, "{\"base_model\":\"m\",\"pad\":\"");
  size_t l = strlen(huge);
  memset(huge + l, 'x', big);
  strcpy(huge + l + big, "\"}");
  expect_error(ca, "POST", "/v1/jobs", huge, 413, "too_large");
  free(huge);
  /* A bad Idempotency-Key. */
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\"}", ds);
  lt_client_header_t h = {"Idempotency-Key", "../../etc"};
  cr_assert_eq(lt_client_request(ca, "POST", "/v1/jobs", &h, 1, body, strlen(body), NULL, &r, err, sizeof err), LT_OK);
  cr_expect_eq(r.status, 400, "%s", r.body);
  lt_client_resp_free(&r);
  /* Bad list parameters. */
  expect_error(ca, "GET", "/v1/jobs?limit=0", NULL, 400, "invalid");
  expect_error(ca, "GET", "/v1/jobs?limit=abc", NULL, 400, "invalid");
  expect_error(ca, "GET", "/v1/jobs?state=sleeping", NULL, 400, "invalid");
  /* Nothing changed: no job for the tenant, no JobSubmitted of the tenant in the topic. */
  json_t *jobs = list_jobs(ca);
  cr_expect_eq(json_array_size(jobs), 0);
  json_decref(jobs);
}

Test(api, missing_garbage_and_revoked_keys_answer_401_on_every_route) {
  lt_client_t *none = client_for(NULL), *junk = client_for("lt_garbage_key_0000000000000000");
  const char *routes[][2] = {{"GET", "/v1/jobs"},         {"POST", "/v1/jobs"},         {"GET", "/v1/jobs/job-x"},
                             {"POST", "/v1/jobs/job-x/cancel"}, {"GET", "/v1/jobs/job-x/events"}, {"GET", "/v1/datasets"},
                             {"POST", "/v1/datasets"},    {"DELETE", "/v1/datasets/ds-x"}, {"POST", "/v1/uploads"}};
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    expect_error(none, routes[i][0], routes[i][1], routes[i][0][0] == 'P' ? "{}" : NULL, 401, "unauthorized");
    expect_error(junk, routes[i][0], routes[i][1], routes[i][0][0] == 'P' ? "{}" : NULL, 401, "unauthorized");
  }
  lt_client_destroy(none);
  lt_client_destroy(junk);
  /* rotate-key revokes the old key: once the API folds the record, the old key is refused. */
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' admin tenant rotate-key %s --json", lt_test_lathe_bin(), tenant_b);
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  json_t *j = json_loads(out, 0, NULL);
  lt_client_t *fresh = client_for(json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
  wait_key(fresh);
  expect_error(cb, "GET", "/v1/jobs", NULL, 401, "unauthorized");
  expect_error(cb, "GET", "/v1/datasets", NULL, 401, "unauthorized");
  lt_client_destroy(fresh);
}

/* A key of tenant_a (lathe admin tenant add-key --role ROLE [OPTIONS]) into key, once the API knows
 * it: its client. */
static lt_client_t *key_client(const char *role_and_options, char key[128]) {
  char cmd[1200];
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant add-key %s --role %s --json", lt_test_lathe_bin(), tenant_a,
           role_and_options);
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  json_t *j = json_loads(out, 0, NULL);
  snprintf(key, 128, "%s", json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
  lt_client_t *c = client_for(key);
  /* /v1/models: every role may list them (an inference key may read nothing else) */
  lt_test_wait_until(lt_test_get_status(c, "/v1/models", NULL, 0) == 200, 20000, 100,
                     "the API never accepted a new %s key", role_and_options);
  return c;
}

/* revoke-key revokes the one key (a leaked key) and keeps the tenant's others; another tenant's
 * name with it finds no such key and revokes nothing; a second revoke writes nothing. */
Test(api, one_revoked_key_is_refused_and_the_tenants_other_keys_keep_working) {
  char cmd[1200], key[128], key_id[LT_TENANT_KEY_ID_LEN + 1];
  int rc;
  lt_client_t *second = key_client("member", key);
  memcpy(key_id, key + 3, LT_TENANT_KEY_ID_LEN);
  key_id[LT_TENANT_KEY_ID_LEN] = 0;
  char *out;
  json_t *j;
  int records = count_records("tenants", "TenantUpserted", NULL);
  /* named under the wrong tenant: refused, and the key still works */
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %s 2>&1", lt_test_lathe_bin(), tenant_b, key_id);
  out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 1, "%s", out);
  cr_expect(strstr(out, "has no key") && strstr(out, key_id), "%s", out);
  free(out);
  /* the whole key is refused as an argument: it would sit in the process list */
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %s 2>&1", lt_test_lathe_bin(), tenant_a, key);
  out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 2, "%s", out);
  cr_expect(strstr(out, "not the key"), "%s", out);
  free(out);
  cr_expect_eq(count_records("tenants", "TenantUpserted", NULL), records, "a refused revoke-key wrote a record");
  cr_expect_eq(lt_test_get_status(second, "/v1/jobs", NULL, 0), 200, "a refused revoke-key revoked the key");
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %s --json", lt_test_lathe_bin(), tenant_a, key_id);
  out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", out);
  j = json_loads(out, 0, NULL);
  size_t i, revoked = 0, live = 0;
  json_t *k;
  json_array_foreach(json_object_get(j, "keys"), i, k) {
    bool gone = json_is_true(json_object_get(k, "revoked"));
    if (!strcmp(json_string_value(json_object_get(k, "key_id")), key_id)) revoked += gone;
    else live += !gone;
  }
  json_decref(j);
  free(out);
  cr_expect_eq(revoked, 1, "the key is listed as revoked");
  cr_expect_geq(live, 1, "the tenant's first key is still live");
  lt_test_wait_until(lt_test_get_status(second, "/v1/jobs", NULL, 0) == 401, 20000, 100,
                     "the revoked key still works");
  expect_error(second, "GET", "/v1/datasets", NULL, 401, "unauthorized");
  expect_error(second, "POST", "/v1/jobs", "{}", 401, "unauthorized");
  cr_expect_eq(lt_test_get_status(ca, "/v1/jobs", NULL, 0), 200, "the tenant's other key was revoked too");
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %s 2>&1", lt_test_lathe_bin(), tenant_a, key_id);
  out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "already revoked"), "%s", out);
  free(out);
  int after = count_records("tenants", "TenantUpserted", NULL);
  cr_expect_eq(after, records + 1, "one record revoked the key, once: %d records, then %d", records, after);
  lt_client_destroy(second);
}

/* A member key works the tenant's data but cannot delete it: DELETE of a dataset (or of its
 * /v1/files alias) is 403 whatever the id, of one of the tenant's finished jobs or sessions 403
 * (another tenant's job is 404, as on every route), and nothing is gone; the admin key deletes
 * them. */
Test(api, a_member_key_cannot_delete_datasets_or_jobs) {
  char key[128], ds[64], spare[64], job[64], path[256];
  lt_client_t *cm = key_client("member", key);
  upload(cm, ds, sizeof ds); /* a member uploads and submits */
  upload(cm, spare, sizeof spare);
  submit_ok(cm, ds, job, sizeof job);
  /* finished (cancelled), so that the admin key's DELETE would delete it */
  produce_job_cancelled(job, tenant_a);
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  char body[4096] = "";
  lt_test_wait_until(lt_test_get_status(ca, path, body, sizeof body) == 200 && strstr(body, "\"cancelled\""), 20000,
                     100, "the job never showed as cancelled: %s", body);
  const char *doomed[][2] = {{"/v1/datasets/%s", spare}, {"/v1/files/%s", spare}, {"/v1/jobs/%s", job}};
  for (size_t i = 0; i < sizeof doomed / sizeof *doomed; i++) {
    snprintf(path, sizeof path, doomed[i][0], doomed[i][1]);
    lt_client_resp_t r = req(cm, "DELETE", path, NULL);
    cr_expect_eq(r.status, 403, "a member key's DELETE %s: %d %s", path, r.status, r.body);
    cr_expect(strstr(r.body, "member key") && strstr(r.body, "admin key"), "%s", r.body);
    lt_client_resp_free(&r);
  }
  snprintf(path, sizeof path, "/v1/datasets/%s", spare);
  cr_expect_eq(lt_test_get_status(ca, path, NULL, 0), 200, "the member's DELETE removed the dataset");
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  cr_expect_eq(lt_test_get_status(ca, path, NULL, 0), 200, "the member's DELETE removed the job");
  /* another tenant's dataset, and one that never was: the same 403, which says nothing of either */
  char theirs[64];
  upload(cb, theirs, sizeof theirs);
  snprintf(path, sizeof path, "/v1/datasets/%s", theirs);
  expect_error(cm, "DELETE", path, NULL, 403, "forbidden");
  cr_expect_eq(lt_test_get_status(cb, path, NULL, 0), 200, "another tenant's dataset is gone");
  expect_error(cm, "DELETE", "/v1/datasets/ds-000000000000000000000000", NULL, 403, "forbidden");
  snprintf(path, sizeof path, "/v1/datasets/%s", spare);
  lt_client_resp_t r = req(ca, "DELETE", path, NULL);
  cr_expect_eq(r.status, 200, "the admin key's DELETE: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  lt_test_wait_until(lt_test_get_status(cm, path, NULL, 0) == 404, 20000, 100, "the dataset is still there");
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  r = req(ca, "DELETE", path, NULL);
  cr_expect_eq(r.status, 200, "the admin key's DELETE of the job: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(lt_test_get_status(cm, path, NULL, 0), 410, "the job is deleted");
  /* A finished session of the member's: ending one is a member's, deleting it is not. */
  char sess[64], show[160], purge[200];
  pending_call(cm, sess);
  produce_job_cancelled(sess, tenant_a);
  snprintf(show, sizeof show, "/v1/sessions/%s", sess);
  lt_test_wait_until(lt_test_get_status(cm, show, body, sizeof body) == 200 && strstr(body, "\"cancelled\""), 20000, 100,
                     "the session never showed as cancelled: %s", body);
  snprintf(purge, sizeof purge, "/v1/sessions/%s?purge=true", sess);
  r = req(cm, "DELETE", purge, NULL);
  cr_expect_eq(r.status, 403, "a member key's purge of a session: %d %s", r.status, r.body);
  cr_expect(strstr(r.body, "member key") && strstr(r.body, "admin key"), "%s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(lt_test_get_status(cm, show, NULL, 0), 200, "the member's purge deleted the session");
  r = req(ca, "DELETE", purge, NULL);
  cr_expect_eq(r.status, 200, "the admin key's purge of the session: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(lt_test_get_status(cm, show, NULL, 0), 410, "the session is deleted");
  lt_client_destroy(cm);
}

/* The writer's version of the newest TenantUpserted of tenant, read from the beginning. */
static int newest_tenant_version(const char *tenant) {
  json_t *found = records_of("tenants", "TenantUpserted", NULL), *rec;
  size_t i;
  int version = 0;
  json_array_foreach(found, i, rec) {
    const char *t = lt_test_rs(rec, "tenant_id");
    if (t && !strcmp(t, tenant)) version = (int)json_integer_value(json_object_get(rec, "version"));
  }
  json_decref(found);
  return version;
}

/* `lathe admin tenant list --json` holds fragment. */
static void expect_listed(const char *fragment) {
  char cmd[600];
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant list --json", lt_test_lathe_bin());
  char *out = lt_test_run(cmd, &rc);
  cr_expect(rc == 0 && strstr(out, fragment), "no %s in: %s", fragment, out);
  free(out);
}

/* Revokes tenant A's key (by its id, the 16 characters after "lt_"). */
static void revoke_a(const char *key) {
  char cmd[600];
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant revoke-key %s %.16s 2>&1", lt_test_lathe_bin(), tenant_a, key + 3);
  char *out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 0, "%s", out);
  free(out);
}

/* A viewer key (TenantUpserted v4) reads: every GET answers as for the tenant's other keys, every
 * other method is 403 naming the role and changes nothing; its label shows in the listing. Bad
 * roles and labels are refused before anything is written. */
Test(api, a_viewer_key_reads_and_changes_nothing) {
  char key[128], cmd[1200], ds[64], job[64], path[256];
  int rc;
  const char *bad[] = {"--role owner", "--role viewer --label \"$(printf 'a\\tb')\"",
                       "--label \"$(printf 'caf\\303\\251')\"",
                       "--role viewer --label 0123456789012345678901234567890123456789012345678901234567890123"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(cmd, sizeof cmd, "'%s' admin tenant add-key %s %s 2>&1", lt_test_lathe_bin(), tenant_a, bad[i]);
    char *out = lt_test_run(cmd, &rc);
    cr_expect_eq(rc, 2, "%s: %s", bad[i], out);
    free(out);
  }
  char member[128];
  lt_client_t *cm = key_client("member", member);
  cr_expect_eq(newest_tenant_version(tenant_a), 3, "a live member key and no label: v3, which v3 readers read");
  lt_client_destroy(cm);
  lt_client_t *cv = key_client("viewer --label 'status board'", key);
  cr_expect_eq(newest_tenant_version(tenant_a), 4, "a live viewer key: v4, which a v3 reader cannot take for a member");
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, job, sizeof job);
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  const char *reads[] = {"/v1/jobs", path, "/v1/datasets", "/v1/usage", "/v1/sessions", "/v1/access"};
  for (size_t i = 0; i < sizeof reads / sizeof *reads; i++)
    cr_expect_eq(lt_test_get_status(cv, reads[i], NULL, 0), 200, "a viewer's GET %s", reads[i]);
  snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
  char dpath[256];
  snprintf(dpath, sizeof dpath, "/v1/datasets/%s", ds);
  const char *writes[][3] = {{"POST", "/v1/jobs", "{}"},      {"POST", path, NULL},
                             {"DELETE", dpath, NULL},         {"POST", "/v1/datasets", "{}"},
                             {"POST", "/v1/uploads", "{}"},   {"POST", "/v1/sessions", "{}"},
                             {"POST", "/v1/completions", "{}"}, {"POST", "/v1/tokenize", "{}"}};
  for (size_t i = 0; i < sizeof writes / sizeof *writes; i++) {
    lt_client_resp_t r = req(cv, writes[i][0], writes[i][1], writes[i][2]);
    cr_expect_eq(r.status, 403, "a viewer's %s %s: %d %s", writes[i][0], writes[i][1], r.status, r.body);
    cr_expect(strstr(r.body, "viewer key"), "%s", r.body);
    lt_client_resp_free(&r);
  }
  cr_expect_eq(count_submissions_of(ds), 1, "a viewer's POST submitted a job");
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  char body[4096] = "";
  cr_expect(lt_test_get_status(ca, path, body, sizeof body) == 200 && !strstr(body, "cancel_requested\":true"),
            "a viewer's cancel asked for one: %s", body);
  cr_expect_eq(lt_test_get_status(ca, dpath, NULL, 0), 200, "a viewer deleted the dataset");
  expect_listed("\"role\":\"viewer\",\"label\":\"status board\"");
  revoke_a(key); /* the viewer revoked: back to v3 (its label and role are moot) */
  cr_expect_eq(newest_tenant_version(tenant_a), 3, "no live viewer key nor label: v3 again");
  lt_client_destroy(cv);
}

/* An inference key (TenantUpserted v5) samples and does nothing else: every route outside what the
 * sampler serves is 403 naming its role, before any id is looked up (the tenant's job and a job
 * that never was get the same answer), and changes nothing; sampling and the tokenizer pass the
 * role check (this API has no sampler: 404 saying so). --model is for inference keys only, within
 * its limits; the listing shows the role, label and models; revoked, v5 is no longer needed. */
Test(api, an_inference_key_samples_and_reaches_none_of_the_tenants_data) {
  char key[128], cmd[1200], ds[64], job[64], path[256], other[256];
  int rc;
  const char *bad[] = {"--model ft:x:job-1", "--role member --model ft:x:job-1", "--role inference --model 'a b'",
                       "--role inference --model ''", "--role inference --model m --model m",
                       "--role inference --model m1 --model m2 --model m3 --model m4 --model m5 --model m6 --model m7 "
                       "--model m8 --model m9"};
  int before = count_records("tenants", "TenantUpserted", NULL);
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(cmd, sizeof cmd, "'%s' admin tenant add-key %s %s 2>&1", lt_test_lathe_bin(), tenant_a, bad[i]);
    char *out = lt_test_run(cmd, &rc);
    cr_expect(rc == 2 && strstr(out, "--model"), "%s: exit %d: %s", bad[i], rc, out);
    free(out);
  }
  cr_expect_eq(count_records("tenants", "TenantUpserted", NULL), before, "a refused add-key wrote a record");
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, job, sizeof job);
  lt_client_t *ci = key_client("inference --label 'chat app' --model ft:tiny:job-x --model tiny", key);
  cr_expect_eq(newest_tenant_version(tenant_a), 5, "a live inference key: v5, which a v4 reader cannot take for a viewer");
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  snprintf(other, sizeof other, "/v1/jobs/job-%s", "000000000000000000000000");
  char dpath[256];
  snprintf(dpath, sizeof dpath, "/v1/datasets/%s", ds);
  const char *refused[][3] = {
      {"GET", "/v1/jobs", NULL},        {"GET", path, NULL},          {"GET", other, NULL},
      {"GET", "/v1/datasets", NULL},    {"GET", dpath, NULL},         {"GET", "/v1/usage", NULL},
      {"GET", "/v1/sessions", NULL},    {"GET", "/v1/access", NULL},  {"GET", "/v1/files", NULL},
      {"GET", "/v1/fine_tuning/jobs", NULL}, {"POST", "/v1/jobs", "{}"}, {"POST", "/v1/uploads", "{}"},
      {"POST", "/v1/sessions", "{}"},   {"DELETE", dpath, NULL}};
  char first_job[1024] = "";
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
    lt_client_resp_t r = req(ci, refused[i][0], refused[i][1], refused[i][2]);
    cr_expect_eq(r.status, 403, "an inference key's %s %s: %d %s", refused[i][0], refused[i][1], r.status, r.body);
    cr_expect(r.body && strstr(r.body, "inference key") && strstr(r.body, "/v1/completions"), "%s", r.body);
    if (i == 1) snprintf(first_job, sizeof first_job, "%s", r.body ? r.body : "");
    if (i == 2) cr_expect_str_eq(r.body ? r.body : "", first_job, "the tenant's job and none answer alike");
    lt_client_resp_free(&r);
  }
  cr_expect_eq(count_submissions_of(ds), 1, "an inference key's POST submitted a job");
  cr_expect_eq(lt_test_get_status(ca, dpath, NULL, 0), 200, "an inference key deleted the dataset");
  /* what the sampler serves passes the role check */
  lt_client_resp_t r = req(ci, "POST", "/v1/completions", "{\"model\":\"tiny\",\"prompt\":\"x\"}");
  cr_expect(r.status == 404 && r.body && strstr(r.body, "served by the sampler"), "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  r = req(ci, "POST", "/v1/chat/completions", "{}");
  cr_expect(r.status == 404 && r.body && strstr(r.body, "served by the sampler"), "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  r = req(ci, "POST", "/v1/tokenize", "{}");
  cr_expect(r.status != 403 && r.status != 401, "the tokenizer: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  /* the tokenizer's paths look no id up: a session's id gets what any word gets */
  const char *under[] = {"/v1/tokenize/sess-000000000000000000000000", "/v1/detokenize/x"};
  for (size_t i = 0; i < 2; i++) {
    r = req(ci, "POST", under[i], "{}");
    cr_expect(r.status == 404 && r.body && strstr(r.body, "no such route") && !strstr(r.body, "session"), "%s: %d %s",
              under[i], r.status, r.body);
    lt_client_resp_free(&r);
  }
  expect_listed("\"role\":\"inference\",\"label\":\"chat app\",\"models\":[\"ft:tiny:job-x\",\"tiny\"]");
  revoke_a(key);
  cr_expect_lt(newest_tenant_version(tenant_a), 5, "no live inference key nor models: below v5 again");
  lt_test_wait_until(lt_test_get_status(ci, "/v1/models", NULL, 0) == 401, 20000, 100, "the revoked key still works");
  lt_client_destroy(ci);
}

/* ---------------------------------------------------------------- the front door */

/* A connection to the API's port from source address src (NULL: any), to send bytes as they are. */
static int raw_connect(unsigned port, const char *src) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  if (src) {
    inet_pton(AF_INET, src, &a.sin_addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind %s: %s", src, strerror(errno));
  }
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect: %s", strerror(errno));
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

/* Sends text on fd and reads one answer with a Content-Length body (NUL-terminated; caller frees). */
static char *raw_exchange(int fd, const char *text, size_t len) {
  for (size_t off = 0; off < len;) {
    ssize_t w = send(fd, text + off, len - off, MSG_NOSIGNAL);
    if (w <= 0) break; /* the server may answer and close before reading everything */
    off += (size_t)w;
  }
  size_t cap = 65536, n = 0;
  char *out = calloc(1, cap + 1);
  for (;;) {
    ssize_t r = recv(fd, out + n, cap - n, 0);
    if (r <= 0) break;
    n += (size_t)r;
    out[n] = '\0';
    const char *end = strstr(out, "\r\n\r\n"), *cl = strcasestr(out, "Content-Length:");
    if (end && cl && cl < end && n >= (size_t)(end + 4 - out) + (size_t)atol(cl + 15)) break;
  }
  return out;
}

/* One request on a new connection (from src, NULL: any): the raw answer (caller frees). */
static char *raw_http(unsigned port, const char *src, const char *text, size_t len) {
  int fd = raw_connect(port, src);
  char *out = raw_exchange(fd, text, len);
  close(fd);
  return out;
}

/* A raw answer's status, and its error code when it is the JSON error envelope (else "(not json)"). */
static int raw_status(const char *answer) {
  int status = 0;
  sscanf(answer, "HTTP/1.%*d %d", &status);
  return status;
}
static void raw_expect_envelope(const char *answer, int status, const char *code) {
  cr_expect_eq(raw_status(answer), status, "wanted %d: %.400s", status, answer);
  const char *end = strstr(answer, "\r\n\r\n");
  cr_assert(end, "no header end: %.300s", answer);
  cr_expect(strcasestr(answer, "Content-Type: application/json") != NULL, "not JSON: %.400s", answer);
  cr_expect(!strstr(answer, "<HTML>"), "an HTML page: %.400s", answer);
  json_t *j = json_loads(end + 4, JSON_DISABLE_EOF_CHECK, NULL);
  const char *got = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
  cr_expect_str_eq(got ? got : "(not json)", code, "%.400s", answer);
  cr_expect(json_is_string(json_object_get(json_object_get(j, "error"), "message")), "%.400s", answer);
  json_decref(j);
}

Test(api, healthz_and_metrics_answer_only_on_the_operator_port) {
  /* The customer port: 404 in the envelope, with or without a key. */
  lt_client_t *none = client_for(NULL);
  expect_error(none, "GET", "/healthz", NULL, 404, "not_found");
  expect_error(none, "GET", "/metrics", NULL, 404, "not_found");
  lt_client_destroy(none);
  expect_error(ca, "GET", "/healthz", NULL, 404, "not_found");
  expect_error(ca, "GET", "/metrics", NULL, 404, "not_found");
  expect_error(ca, "GET", "/debug/jobs", NULL, 404, "not_found"); /* every tenant's job states */
  /* The operator port: both, and nothing of the customers' API. */
  lt_client_t *ops = lt_test_client(api.ops_url, NULL, 0);
  lt_client_resp_t r = req(ops, "GET", "/healthz", NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  cr_expect(json_is_true(json_object_get(r.json, "ready")), "%s", r.body);
  lt_client_resp_free(&r);
  r = req(ops, "GET", "/metrics", NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  cr_expect(strstr(r.body, "lathe_jobs{") != NULL, "%.300s", r.body);
  lt_client_resp_free(&r);
  expect_error(ops, "GET", "/v1/jobs", NULL, 404, "not_found");
  expect_error(ops, "POST", "/healthz", "{}", 405, "method_not_allowed");
  lt_client_destroy(ops);
}

Test(api, what_libevent_refuses_itself_is_answered_in_the_json_envelope) {
  char *a;
  /* A method libevent knows but the API does not serve, and one nobody knows: 501. */
  const char *patch = "PATCH /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n", *brew = "BREW / HTTP/1.1\r\nHost: x\r\n\r\n";
  a = raw_http(api.port, NULL, patch, strlen(patch));
  raw_expect_envelope(a, 501, "not_implemented");
  free(a);
  a = raw_http(api.port, NULL, brew, strlen(brew));
  raw_expect_envelope(a, 501, "not_implemented");
  free(a);
  /* A malformed request line: 400. */
  a = raw_http(api.port, NULL, "GARBAGE\r\n\r\n", 11);
  raw_expect_envelope(a, 400, "invalid");
  free(a);
  /* Headers over 16 KiB: libevent answers 413, or 400 when the limit falls inside a line it is
   * still reading; either way in the envelope, which says the limit. */
  size_t big = 20000;
  char *huge = malloc(big + 128);
  int hl = snprintf(huge, 128, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Pad: ");
  memset(huge + hl, 'a', big);
  strcpy(huge + hl + big, "\r\n\r\n");
  a = raw_http(api.port, NULL, huge, strlen(huge));
  raw_expect_envelope(a, raw_status(a) == 413 ? 413 : 400, raw_status(a) == 413 ? "too_large" : "invalid");
  cr_expect(strstr(a, "16384") != NULL, "the message names the header limit: %.400s", a);
  free(a);
  free(huge);
  /* A body announced over the limit: 413, before a byte of it is read. */
  const char *cl = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n{";
  a = raw_http(api.port, NULL, cl, strlen(cl));
  raw_expect_envelope(a, 413, "too_large");
  free(a);
  /* A chunk size that is no number: libevent 2.1 answers it as it answers a body too large. */
  const char *chunk = "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n";
  a = raw_http(api.port, NULL, chunk, strlen(chunk));
  raw_expect_envelope(a, 413, "too_large");
  cr_expect(strstr(a, "chunked") != NULL, "the message mentions the chunked body: %.400s", a);
  free(a);
  /* Behind an answer of the API's own on the same connection, the page is still rewritten. */
  char two[256];
  snprintf(two, sizeof two, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n%s", brew);
  int fd = raw_connect(api.port, NULL);
  a = raw_exchange(fd, two, strlen(two));
  raw_expect_envelope(a, 401, "unauthorized");
  const char *second = strstr(a + 1, "HTTP/1.1 "); /* both answers may come in one read */
  char *b = second ? strdup(second) : raw_exchange(fd, "", 0);
  raw_expect_envelope(b, 501, "not_implemented");
  close(fd);
  free(a);
  free(b);
}

/* The key id of an API key "lt_<key_id>_<secret>". */
static const char *key_id_of(const char *key, char *out, size_t n) {
  snprintf(out, n, "%.*s", (int)(strchr(key + 3, '_') - key - 3), key + 3);
  return out;
}

Test(api, failed_authentications_from_one_address_get_429_with_retry_after_and_no_verdict_on_keys) {
  srv_t s = start_api_with(NULL, (const char *const[]){"LATHE_API_AUTH_FAIL_RATE=0.05/5", NULL});
  lt_client_t *junk = lt_test_client(s.url, "lt_0123456789abcdef_guess", 30), *a = lt_test_client(s.url, key_a, 30);
  int n401 = 0, n429 = 0;
  for (int i = 0; i < 12; i++) {
    lt_client_resp_t r = req(junk, "GET", "/v1/jobs", NULL);
    if (r.status == 401) n401++;
    if (r.status == 429) {
      n429++;
      cr_expect_str_eq(err_code(&r), "rate_limited", "%s", r.body);
      cr_expect(atoi(r.retry_after) >= 1, "Retry-After \"%s\"", r.retry_after);
      cr_expect(strstr(r.body, "failed authentications from 127.0.0.1") != NULL, "%s", r.body);
    }
    lt_client_resp_free(&r);
  }
  cr_expect_eq(n401, 5, "the burst of 5 failures is answered 401");
  cr_expect_eq(n429, 7, "every guess past the burst is 429");
  /* A throttled address gets 429 whatever key it sends, so a guess learns nothing; a forwarded-for
   * header does not make it another address; another address is not slowed. */
  expect_error(a, "GET", "/v1/jobs", NULL, 429, "rate_limited");
  lt_client_header_t xff[] = {{"X-Forwarded-For", "203.0.113.9"}, {"X-Real-IP", "203.0.113.9"}};
  lt_client_resp_t rf;
  cr_assert_eq(lt_client_request(junk, "GET", "/v1/jobs", xff, 2, NULL, 0, NULL, &rf, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(rf.status, 429, "a forged X-Forwarded-For escaped the limit: %s", rf.body);
  lt_client_resp_free(&rf);
  char text[512];
  snprintf(text, sizeof text, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", key_a);
  char *ans = raw_http(s.port, "127.0.0.2", text, strlen(text));
  cr_expect_eq(raw_status(ans), 200, "from 127.0.0.2: %.300s", ans);
  free(ans);
  /* The operator sees the refusals. */
  lt_client_t *ops = lt_test_client(s.ops_url, NULL, 0);
  lt_client_resp_t m = req(ops, "GET", "/metrics", NULL);
  const char *line = strstr(m.body ? m.body : "", "lathe_api_refused_total{reason=\"rate_limited\"} ");
  cr_assert(line, "no refusal counter in /metrics");
  cr_expect_eq(atoi(strchr(line, ' ') + 1), 9, "%.80s", line);
  lt_client_resp_free(&m);
  lt_client_destroy(ops);
  lt_client_destroy(junk);
  lt_client_destroy(a);
  stop_api(&s);
}

/* Requests with key until one is refused; how many were answered 200 (at most max). */
static int until_limited(lt_client_t *c, int max, lt_client_resp_t *refused) {
  for (int i = 0; i < max; i++) {
    *refused = req(c, "GET", "/v1/jobs", NULL);
    if (refused->status != 200) return i;
    lt_client_resp_free(refused);
  }
  return max;
}

Test(api, a_key_or_tenant_over_its_rate_gets_429_naming_it_and_other_tenants_are_not_slowed) {
  char kid[32];
  srv_t s = start_api_with(NULL, (const char *const[]){"LATHE_API_KEY_RATE=0.05/3", "LATHE_API_TENANT_RATE=off", NULL});
  lt_client_t *a = lt_test_client(s.url, key_a, 30), *b = lt_test_client(s.url, key_b, 30);
  lt_client_resp_t r;
  cr_expect_eq(until_limited(a, 10, &r), 3, "a burst of 3 for the key");
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect_str_eq(err_code(&r), "rate_limited", "%s", r.body);
  cr_expect(strstr(r.body, key_id_of(key_a, kid, sizeof kid)) != NULL, "names the key %s: %s", kid, r.body);
  cr_expect(atoi(r.retry_after) >= 1 && atoi(r.retry_after) <= 20, "Retry-After \"%s\"", r.retry_after);
  lt_client_resp_free(&r);
  cr_expect_eq(until_limited(b, 3, &r), 3, "tenant B is not slowed by A");
  lt_client_destroy(a);
  lt_client_destroy(b);
  stop_api(&s);
  s = start_api_with(NULL, (const char *const[]){"LATHE_API_KEY_RATE=off", "LATHE_API_TENANT_RATE=0.05/2", NULL});
  a = lt_test_client(s.url, key_a, 30);
  cr_expect_eq(until_limited(a, 10, &r), 2, "a burst of 2 for the tenant");
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect(strstr(r.body, tenant_a) != NULL, "names the tenant: %s", r.body);
  lt_client_resp_free(&r);
  lt_client_destroy(a);
  stop_api(&s);
}

Test(api, connections_past_max_connections_get_503_naming_the_limit_until_one_closes) {
  srv_t s = start_api_with((const char *const[]){"--max-connections", "3", NULL}, NULL);
  /* Three connections, each counted: one had an answer (401: no key) and stays open, two never
   * send a byte (as a slow client holding sockets would). */
  const char *get = "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n";
  int fds[3];
  for (int i = 0; i < 3; i++) fds[i] = raw_connect(s.port, NULL);
  char *first = raw_exchange(fds[2], get, strlen(get));
  cr_assert_eq(raw_status(first), 401, "%.300s", first);
  free(first);
  /* One more that sends nothing is not left to hold its socket: the server closes it. */
  int idle = raw_connect(s.port, NULL);
  char byte;
  ssize_t got = -1;
  lt_test_wait_until((got = recv(idle, &byte, 1, MSG_DONTWAIT)) == 0, 30000, 200,
                     "an idle connection over the cap was never closed (recv %zd)", got);
  close(idle);
  char *a = raw_http(s.port, NULL, get, strlen(get));
  raw_expect_envelope(a, 503, "too_many_connections");
  cr_expect(strstr(a, "max_connections = 3") != NULL, "names the limit: %.400s", a);
  cr_expect(strcasestr(a, "Retry-After:") != NULL, "%.400s", a);
  free(a);
  /* The first three still work; once one closes, a new connection is served. */
  a = raw_exchange(fds[0], get, strlen(get));
  cr_expect_eq(raw_status(a), 401, "%.300s", a);
  free(a);
  close(fds[0]);
  int status = 0;
  lt_test_wait_until((a = raw_http(s.port, NULL, get, strlen(get)), status = raw_status(a), free(a), status == 401), 10000,
                     100, "after a close, new connections still get %d", status);
  close(fds[1]);
  close(fds[2]);
  stop_api(&s);
}

/* The API's open customer connections, from /metrics on its operator port. */
static int open_connections(void) {
  lt_client_t *ops = lt_test_client(api.ops_url, NULL, 0);
  lt_client_resp_t m = req(ops, "GET", "/metrics", NULL);
  const char *line = strstr(m.body ? m.body : "", "\nlathe_api_connections ");
  int n = line ? atoi(line + strlen("\nlathe_api_connections ")) : -1;
  lt_client_resp_free(&m);
  lt_client_destroy(ops);
  return n;
}

/* A client that closes its long poll before the answer: libevent does not read a connection
 * whose request waits, so it never saw the close, and the connection stayed open (counted
 * against max_connections) until the poll's wait ran out. */
/* A new session of c's tenant (its id into sess) with one call no worker runs: its seq. */
static json_int_t pending_call(lt_client_t *c, char sess[64]) {
  lt_client_resp_t r = req(c, "POST", "/v1/sessions", "{\"base_model\":\"tiny-llama\",\"lora\":{\"rank\":4}}");
  cr_assert(r.status == 201 || r.status == 202, "%d %s", r.status, r.body);
  char path[160];
  snprintf(sess, 64, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  for (int i = 0; i < 100; i++) { /* the API folds the session from the log; no worker runs the call */
    r = req(c, "POST", path, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}");
    if (r.status != 404) break;
    lt_client_resp_free(&r);
    lt_test_msleep(100);
  }
  cr_assert_eq(r.status, 202, "%s", r.body);
  json_int_t seq = json_integer_value(json_object_get(r.json, "seq"));
  lt_client_resp_free(&r);
  return seq;
}

Test(api, a_long_poll_whose_client_left_is_closed_before_its_wait_ends) {
  char sess[64], text[512];
  json_int_t seq = pending_call(ca, sess);
  int before = open_connections();
  cr_assert_geq(before, 0, "no lathe_api_connections in /metrics");
  int fd = raw_connect(api.port, NULL);
  int n = snprintf(text, sizeof text,
                   "GET /v1/sessions/%s/calls/%lld?wait=60 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                   sess, (long long)seq, key_a);
  cr_assert_eq(send(fd, text, (size_t)n, MSG_NOSIGNAL), n);
  int during = -1;
  lt_test_wait_until((during = open_connections()) == before + 1, 10000, 100, "the poll's connection is not counted (%d, %d before)", during, before);
  lt_test_msleep(500);
  char got[600] = "";
  cr_expect_eq(recv(fd, got, sizeof got - 1, MSG_DONTWAIT), -1, "the poll was answered before its call ran: %s", got);
  close(fd);
  int after = -1;
  lt_test_wait_until((after = open_connections()) == before, 15000, 200,
                     "the closed poll's connection is still open (%d, %d before)", after, before);
}

/* The worker parks an idle session a moment after a call reached the log, before it read it; the
 * API that took the call had not read the park then, so it woke nothing, and a client that polls
 * without waiting (or long-polls another API) woke nothing either: the call waited for good. The
 * API now wakes a parked session when it reads the park after a call. Stood in for by a park
 * written after the call (attempt 0: no worker ran the session here). */
/* A SessionIdle as the session's worker writes it: parked after call seq (attempt 0: no worker
 * ran the session here). */
static void park_session(const char *sess, json_int_t seq) {
  char eid[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  cr_assert_eq(lt_crypto_random_id(eid), LT_OK);
  produce_json("control", "SessionIdle", sess,
               json_pack("{s:s,s:I,s:s,s:s,s:s,s:i,s:I}", "event_id", eid, "occurred_at", (json_int_t)lt_time_wall_ms(),
                         "producer", "worker/test", "job_id", sess, "tenant_id", tenant_a, "attempt", 0, "seq", seq));
}

/* The SessionWoken records of sess once n of them are there (or after 10 s), then settle_ms more. */
static json_t *wakes_of(lt_test_tail_t *t, const char *sess, size_t n, int settle_ms) {
  json_t *woken = NULL;
  for (int i = 0; i < 100 && json_array_size(woken) < n; i++) {
    json_decref(woken);
    lt_test_tail_poll(t, 100);
    woken = lt_test_tail_select(t, "control", "SessionWoken", sess, 0);
  }
  if (settle_ms <= 0) return woken;
  lt_test_tail_settle(t, settle_ms);
  json_decref(woken);
  return lt_test_tail_select(t, "control", "SessionWoken", sess, 0);
}

Test(api, a_session_parked_after_a_call_it_had_not_read_is_woken_with_nobody_waiting) {
  char sess[64], path[160];
  json_int_t seq = pending_call(ca, sess);
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"control", NULL});
  park_session(sess, seq - 1);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls/%lld?wait=0", sess, (long long)seq);
  lt_client_resp_t r = req(ca, "GET", path, NULL); /* a poll that does not wait */
  cr_expect_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  json_t *woken = wakes_of(t, sess, 1, 0);
  cr_assert_eq(json_array_size(woken), 1, "the parked session was woken %zu times", json_array_size(woken));
  cr_expect_eq(lt_test_ri(json_array_get(woken, 0), "seq"), seq, "by the call after its park");
  json_decref(woken);
  /* Parked again after the same call at once (within one of the API's 2 s prunes), as when its
   * worker never ran the call after it (another tenant's record, one its reader passed over): not
   * woken again for it, at every park. */
  park_session(sess, seq - 1);
  woken = wakes_of(t, sess, 2, 1000);
  cr_expect_eq(json_array_size(woken), 1, "woken again for the same call: %zu wakes", json_array_size(woken));
  json_decref(woken);
  /* A new call wakes that second park (the first park's wake is not taken for it). */
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  r = req(ca, "POST", path, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}");
  cr_assert_eq(r.status, 202, "%s", r.body);
  json_int_t next = json_integer_value(json_object_get(r.json, "seq"));
  lt_client_resp_free(&r);
  woken = wakes_of(t, sess, 2, 1000);
  cr_expect_eq(json_array_size(woken), 2, "the second park was woken %zu times in all", json_array_size(woken) - 1);
  cr_expect_eq(lt_test_ri(json_array_get(woken, 1), "seq"), next, "by the new call");
  json_decref(woken);
  lt_test_tail_close(t);
}

/* Objects under a prefix of the bucket (the first page: enough for a test's few). */
static lt_err_t count_object(void *ctx, const char *key, const lt_store_info_t *info);
static int objects_under(const char *where) {
  lt_store_t *st = lt_test_store();
  char next[2048] = "";
  int n = 0;
  lt_err_t e = lt_store_list(st, where, "", 0, count_object, &n, next, sizeof next, err, sizeof err);
  lt_store_destroy(st);
  cr_assert_eq(e, LT_OK, "%s", err);
  return n;
}

/* A finished session is deleted (DELETE /v1/sessions/{id}?purge=true) as a finished job is: before,
 * a session could only be ended, and what it made (its adapter, checkpoints, saved states, its
 * calls' bodies and results) stayed in the store, counted against the tenant's quota. A live
 * session is 409 and keeps everything, another tenant's is 404; once deleted its routes answer 410,
 * the listing leaves it out, and its calls' bodies are gone at once (not after the GC's hour). */
Test(api, a_finished_session_is_deleted_with_everything_it_made) {
  char sess[64], path[200], where[200];
  pending_call(ca, sess);
  snprintf(where, sizeof where, "sessions/%s/%s/", tenant_a, sess);
  cr_assert_geq(objects_under(where), 1, "the call's body is not in the store");
  snprintf(path, sizeof path, "/v1/sessions/%s?purge=maybe", sess);
  expect_error(ca, "DELETE", path, NULL, 400, "invalid");
  snprintf(path, sizeof path, "/v1/sessions/%s?purge=true", sess);
  expect_error(ca, "DELETE", path, NULL, 409, "conflict");
  expect_error(cb, "DELETE", path, NULL, 404, "not_found");
  cr_assert_geq(objects_under(where), 1, "a refused delete deleted the call's body");
  produce_job_cancelled(sess, tenant_a);
  char show[160];
  snprintf(show, sizeof show, "/v1/sessions/%s", sess);
  lt_client_resp_t r = {0};
  lt_test_wait_until((lt_client_resp_free(&r), r = req(ca, "GET", show, NULL),
                      json_string_value(json_object_get(r.json, "state")) &&
                          strcmp(json_string_value(json_object_get(r.json, "state")), "cancelled") == 0),
                     15000, 100, "the session never read as cancelled: %s", r.body);
  lt_client_resp_free(&r);
  r = req(ca, "DELETE", path, NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect(json_is_true(json_object_get(r.json, "deleted")), "%s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(count_records("artifacts", "JobDeleted", sess), 1);
  cr_expect_eq(objects_under(where), 0, "the session's calls' bodies are still in the store");
  expect_error(ca, "GET", show, NULL, 410, "gone");
  char calls[200];
  snprintf(calls, sizeof calls, "/v1/sessions/%s/calls", sess);
  expect_error(ca, "POST", calls, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}", 410, "gone");
  expect_error(ca, "DELETE", show, NULL, 410, "gone");
  r = req(ca, "GET", "/v1/sessions", NULL);
  cr_expect(r.status == 200 && !strstr(r.body, sess), "the listing still shows the deleted session: %s", r.body);
  lt_client_resp_free(&r);
  r = req(ca, "DELETE", path, NULL); /* again: finishes a deletion, changes nothing more */
  cr_expect_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(count_records("artifacts", "JobDeleted", sess), 1, "a second JobDeleted");
}

/* An event stream outlives the request that opened it: when its key is revoked, the API cuts it
 * at its next tick after folding the tenant's record (before, it went on until the job ended:
 * days of a session's events to a leaked key). The same tenant's other key's stream goes on. */
Test(api, a_revoked_keys_open_event_stream_is_cut_and_the_others_go_on) {
  char key[128];
  lt_client_t *second = key_client("member", key);
  char sess[64];
  pending_call(second, sess);
  const char *keys[2] = {key, key_a};
  int fds[2];
  for (int i = 0; i < 2; i++) {
    char text[512];
    int n = snprintf(text, sizeof text, "GET /v1/sessions/%s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                     sess, keys[i]);
    fds[i] = raw_connect(api.port, NULL);
    cr_assert_eq(send(fds[i], text, (size_t)n, MSG_NOSIGNAL), n);
    char got[256] = "";
    ssize_t k = recv(fds[i], got, sizeof got - 1, 0);
    cr_assert(k > 0 && raw_status(got) == 200, "stream %d did not start: %zd %.200s", i, k, got);
  }
  revoke_a(key);
  bool closed[2] = {false, false};
  for (int t = 0; t < 200 && !closed[0]; t++) {
    for (int i = 0; i < 2; i++) {
      char buf[4096];
      ssize_t k = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed[i] = true;
    }
    if (!closed[0]) lt_test_msleep(100);
  }
  cr_expect(closed[0], "the revoked key's event stream is still open 20 s after the revoke");
  cr_expect(!closed[1], "the tenant's other key's event stream was cut too");
  close(fds[0]);
  close(fds[1]);
  lt_client_destroy(second);
  lt_client_t *ops = lt_test_client(api.ops_url, NULL, 0);
  lt_client_resp_t m = req(ops, "GET", "/metrics", NULL);
  cr_expect(strstr(m.body ? m.body : "", "lathe_api_event_streams_cut_total{reason=\"key\"} 1\n"), "%s", m.body);
  lt_client_resp_free(&m);
  lt_client_destroy(ops);
}

/* A client that opens a job's event stream and reads nothing does not make the API keep its
 * events: past stream_backlog bytes unread the stream is cut, as a sampling stream is. Before,
 * every event of the job went to the connection's buffer for as long as the job ran. */
Test(api, an_event_stream_its_client_does_not_read_is_cut_past_the_backlog) {
  srv_t s = start_api_with(NULL, (const char *const[]){"LATHE_API_STREAM_BACKLOG=65536", NULL});
  lt_client_t *a = lt_test_client(s.url, key_a, 30);
  char sess[64], text[512];
  pending_call(a, sess);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int small = 4096; /* the kernel holds little for it: the rest waits in the API */
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s.port)};
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0, "connect: %s", strerror(errno));
  int n = snprintf(text, sizeof text, "GET /v1/sessions/%s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                   sess, key_a);
  cr_assert_eq(send(fd, text, (size_t)n, MSG_NOSIGNAL), n);
  lt_test_msleep(500);
  enum { STEPS = 800 }; /* about 300 bytes each on the stream: 240 KB, past 64 KiB + the kernel's */
  json_t *steps[STEPS];
  for (int i = 0; i < STEPS; i++) {
    char eid[LT_CRYPTO_RANDOM_ID_CHARS + 1];
    cr_assert_eq(lt_crypto_random_id(eid), LT_OK);
    steps[i] = json_pack("{s:s,s:I,s:s,s:s,s:s,s:i,s:I,s:I,s:f,s:f,s:I,s:f,s:I,s:I,s:f,s:n}", "event_id", eid,
                         "occurred_at", (json_int_t)lt_time_wall_ms(), "producer", "worker/test", "job_id", sess,
                         "tenant_id", tenant_a, "attempt", 1, "step", (json_int_t)i + 1, "total_steps",
                         (json_int_t)STEPS, "loss", 1.5, "learning_rate", 0.001, "tokens", (json_int_t)4096,
                         "tokens_per_s", 100.0, "elapsed_ms", (json_int_t)1000, "eta_ms", (json_int_t)1000, "epoch",
                         0.5, "grad_norm");
  }
  produce_jsons("progress", "StepCompleted", sess, steps, STEPS);
  lt_client_t *ops = lt_test_client(s.ops_url, NULL, 0);
  bool cut = false;
  for (int t = 0; t < 100 && !cut; t++) {
    lt_client_resp_t m = req(ops, "GET", "/metrics", NULL);
    cut = m.body && strstr(m.body, "lathe_api_event_streams_cut_total{reason=\"unread\"} 1\n");
    lt_client_resp_free(&m);
    if (!cut) lt_test_msleep(200);
  }
  cr_expect(cut, "a stream its client does not read was not cut");
  /* reading now, the client finds the end of the connection, not the rest of the events */
  struct timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  char buf[65536];
  ssize_t k;
  size_t got = 0;
  while ((k = recv(fd, buf, sizeof buf, 0)) > 0) got += (size_t)k;
  cr_expect_eq(k, 0, "the cut stream's connection did not end (%zd, %s)", k, strerror(errno));
  cr_expect_lt(got, (size_t)STEPS * 250, "the whole stream arrived (%zu bytes): nothing was cut", got);
  close(fd);
  lt_client_destroy(ops);
  lt_client_destroy(a);
  stop_api(&s);
}

/* One tenant's held requests (long polls of its sessions' calls, event streams) take at most a
 * quarter of max_connections: before, a tenant within its rate limits could hold every connection
 * open (a long poll waits up to 60 s, a stream for as long as its job runs), and every other
 * tenant got 503. Past its share a held request is 429 naming the limit; a poll that does not
 * wait is still answered, another tenant is served, and once one closes the next is held. */
Test(api, one_tenants_long_polls_and_streams_hold_at_most_a_quarter_of_the_connections) {
  srv_t s = start_api_with((const char *const[]){"--max-connections", "8", NULL}, NULL);
  lt_client_t *a = lt_test_client(s.url, key_a, 30), *b = lt_test_client(s.url, key_b, 30);
  char sess[64], poll[512], stream[512];
  json_int_t seq = pending_call(a, sess);
  int np = snprintf(poll, sizeof poll,
                    "GET /v1/sessions/%s/calls/%lld?wait=60 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                    sess, (long long)seq, key_a);
  int ns = snprintf(stream, sizeof stream, "GET /v1/sessions/%s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                    sess, key_a);
  int held[2] = {raw_connect(s.port, NULL), raw_connect(s.port, NULL)};
  cr_assert_eq(send(held[0], poll, (size_t)np, MSG_NOSIGNAL), np);
  cr_assert_eq(send(held[1], stream, (size_t)ns, MSG_NOSIGNAL), ns);
  char got[256] = "";
  ssize_t k = recv(held[1], got, sizeof got - 1, 0); /* the stream's headers: both are held now */
  cr_assert(k > 0 && raw_status(got) == 200, "the event stream did not start: %zd %.200s", k, got);
  lt_test_msleep(200);
  char *third = raw_http(s.port, NULL, poll, (size_t)np);
  raw_expect_envelope(third, 429, "over_quota");
  cr_expect(strstr(third, "the limit is 2 per tenant") && strcasestr(third, "Retry-After:"), "%.500s", third);
  free(third);
  char with_query[600]; /* a refused stream's query is freed too (the sanitizer build's exit says) */
  int nq = snprintf(with_query, sizeof with_query,
                    "GET /v1/sessions/%s/events?last_event_id=x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                    sess, key_a);
  third = raw_http(s.port, NULL, with_query, (size_t)nq);
  raw_expect_envelope(third, 429, "over_quota");
  free(third);
  char path[200];
  snprintf(path, sizeof path, "/v1/sessions/%s/calls/%lld?wait=0", sess, (long long)seq);
  lt_client_resp_t r = req(a, "GET", path, NULL);
  cr_expect_eq(r.status, 200, "a poll that does not wait is answered: %s", r.body);
  lt_client_resp_free(&r);
  r = req(b, "GET", "/v1/sessions", NULL);
  cr_expect_eq(r.status, 200, "another tenant is served: %s", r.body);
  lt_client_resp_free(&r);
  close(held[0]); /* the poll's client leaves: its place is free again */
  bool taken = false;
  for (int i = 0; i < 50 && !taken; i++) {
    int fd = raw_connect(s.port, NULL);
    cr_assert_eq(send(fd, poll, (size_t)np, MSG_NOSIGNAL), np);
    lt_test_msleep(300);
    taken = recv(fd, got, sizeof got - 1, MSG_DONTWAIT) < 0; /* no answer yet: it is held */
    close(fd);
  }
  cr_expect(taken, "after a held poll closed, the next one is still refused");
  close(held[1]);
  lt_client_destroy(a);
  lt_client_destroy(b);
  stop_api(&s);
}

Test(api, another_tenants_and_path_like_ids_answer_404_and_change_nothing) {
  char ds[64];
  char id[64], path[256];
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, id, sizeof id);
  /* Tenant B sees none of A's: job, cancel, events, dataset, delete, and as a submission input. */
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  expect_error(cb, "GET", path, NULL, 404, "not_found");
  snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
  expect_error(cb, "POST", path, NULL, 404, "not_found");
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  expect_error(cb, "GET", path, NULL, 404, "not_found");
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", id);
  expect_error(cb, "GET", path, NULL, 404, "not_found");
  snprintf(path, sizeof path, "/v1/datasets/%s", ds);
  expect_error(cb, "GET", path, NULL, 404, "not_found");
  expect_error(cb, "DELETE", path, NULL, 404, "not_found");
  char body[256];
  snprintf(body, sizeof body, "{\"base_model\":\"m\",\"dataset_id\":\"%s\"}", ds);
  expect_error(cb, "POST", "/v1/jobs", body, 404, "not_found");
  /* Path-like ids. */
  const char *bad[] = {"/v1/jobs/..%2Fx",         "/v1/jobs/%2e%2e",         "/v1/jobs/..",
                       "/v1/datasets/..%2F..%2Fx", "/v1/datasets/%2e%2e",     "/v1/datasets/.hidden",
                       "/v1/jobs/%2e%2e/cancel",  "/v1/uploads/..%2Fx/complete"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    const char *m = strstr(bad[i], "cancel") || strstr(bad[i], "complete") ? "POST" : "GET";
    expect_error(ca, m, bad[i], NULL, 404, "not_found");
  }
  expect_error(ca, "DELETE", "/v1/datasets/..%2F..%2Fx", NULL, 404, "not_found");
  /* A's job and dataset are untouched. */
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  lt_client_resp_t r = req(ca, "GET", path, NULL);
  cr_expect_eq(r.status, 200);
  cr_expect_eq(json_is_true(json_object_get(r.json, "cancel_requested")), 0);
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/datasets/%s", ds);
  r = req(ca, "GET", path, NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(count_records("control", "CancelRequested", id), 0);
}

/* An api whose object store cannot be reached does not know whether a dataset exists: a
 * submission naming one answers 503 (retry), never 404 (which tells the client its dataset is
 * gone), on /v1/jobs and the OpenAI route alike, and records nothing; an unknown id is 503 there
 * too (it cannot be told apart). The api with the store answers 201 for the same dataset. (Found
 * by the chaos suite: an S3 restart turned submissions into 404s.) */
Test(api, a_store_that_cannot_be_reached_makes_a_submission_503_not_404) {
  char ds[64], body[512];
  upload(ca, ds, sizeof ds);
  srv_t blind = start_api_with(NULL, (const char *const[]){"LATHE_S3_ENDPOINT=127.0.0.1:1", NULL});
  lt_client_t *c = lt_test_client(blind.url, key_a, 90);
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 200, 20000, 100, "the api never knew the key");
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}", ds);
  lt_client_resp_t r = req(c, "POST", "/v1/jobs", body);
  cr_expect_eq(r.status, 503, "%s", r.body);
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "(none)", "unavailable", "%s", r.body);
  cr_expect(strstr(r.body, "dataset_id") && strstr(r.body, ds), "names the field and the dataset: %s", r.body);
  cr_expect(atoi(r.retry_after) >= 1, "Retry-After \"%s\"", r.retry_after);
  lt_client_resp_free(&r);
  snprintf(body, sizeof body, "{\"model\":\"tiny-llama\",\"training_file\":\"%s\"}", ds);
  r = req(c, "POST", "/v1/fine_tuning/jobs", body);
  cr_expect_eq(r.status, 503, "%s", r.body);
  cr_expect(strstr(r.body, "training_file") != NULL, "names the field: %s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(count_submissions_of(ds), 0, "a refused submission recorded a job");
  lt_client_destroy(c);
  stop_api(&blind);
  char id[64];
  submit_ok(ca, ds, id, sizeof id); /* the dataset was there all along */
}

/* One request on its own thread (its client its own while it runs): the answer's status and JSON
 * body (the caller decrefs json) once it came back. */
typedef struct {
  lt_client_t *c;
  const char *method, *path, *body;
  int status;
  json_t *json;
  volatile int done;
} req_bg_t;

static void *req_bg(void *arg) {
  req_bg_t *b = arg;
  lt_client_resp_t r = req(b->c, b->method, b->path, b->body);
  b->status = r.status;
  b->json = json_incref(r.json);
  lt_client_resp_free(&r);
  __atomic_store_n(&b->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* A store that takes the connection and never answers holds the submission asking it whether a
 * dataset exists, not the loop every tenant's requests share: the look-up runs on the work pool.
 * (Before, the HEAD ran on the loop, and every request waited out libs3's timeouts with it.) */
Test(api, a_store_that_never_answers_holds_the_submission_not_every_other_request) {
  char env[64];
  int hole = lt_test_mute_store(env, sizeof env);
  srv_t mute = start_api_with(NULL, (const char *const[]){env, NULL});
  lt_client_t *c = lt_test_client(mute.url, key_a, 120), *c2 = lt_test_client(mute.url, key_b, 10);
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 200 && lt_test_get_status(c2, "/v1/jobs", NULL, 0) == 200,
                     20000, 100, "the api never knew the keys");
  for (int fd; (fd = accept(hole, NULL, NULL)) >= 0;) close(fd); /* whatever came before the submission */
  req_bg_t b = {.c = c, .method = "POST", .path = "/v1/jobs",
                .body = "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"ds-never-seen-here\"}"};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, req_bg, &b), 0);
  int taken = -1; /* the api's HEAD, connected and waiting for an answer that never comes */
  lt_test_wait_until((taken = accept(hole, NULL, NULL)) >= 0, 30000, 20, "the api never asked the store");
  /* meanwhile another tenant's request is answered, and the submission still waits */
  lt_client_resp_t r = req(c2, "GET", "/v1/jobs", NULL);
  int waiting = !__atomic_load_n(&b.done, __ATOMIC_SEQ_CST);
  cr_expect_eq(r.status, 200, "another tenant's request while the store is mute: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  cr_expect(waiting, "the submission was answered before the store said anything (status %d)", b.status);
  /* the store goes away: the submission is answered 503 (retry), not 404 */
  close(taken);
  close(hole);
  pthread_join(th, NULL);
  cr_expect_eq(b.status, 503, "the submission once the store was gone: %d", b.status);
  json_decref(b.json);
  lt_client_destroy(c);
  lt_client_destroy(c2);
  stop_api(&mute);
}

Test(api, invalid_utf8_dataset_is_refused_naming_the_line_and_stores_nothing) {
  const char *bad = "{\"prompt\":\"ok\",\"completion\":\"fine\"}\n"
                    "{\"prompt\":\"caf\xc3\x28\",\"completion\":\"x\"}\n"
                    "{\"prompt\":\"\",\"completion\":\"x\"}\n";
  lt_client_resp_t r = req(ca, "POST", "/v1/datasets?name=bad", bad);
  cr_assert_eq(r.status, 400, "%s", r.body);
  json_t *errs = json_object_get(json_object_get(r.json, "report"), "errors");
  cr_assert_geq(json_array_size(errs), 2, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(json_array_get(errs, 0), "line")), 2, "%s", r.body);
  cr_expect(strstr(json_string_value(json_object_get(json_array_get(errs, 0), "reason")), "UTF-8"), "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(json_array_get(errs, 1), "line")), 3, "%s", r.body);
  lt_client_resp_free(&r);
  /* Not JSON lines, wrong types. */
  expect_error(ca, "POST", "/v1/datasets", "not json\n", 400, "invalid_dataset");
  expect_error(ca, "POST", "/v1/datasets", "{\"prompt\":1,\"completion\":\"x\"}\n", 400, "invalid_dataset");
  expect_error(ca, "POST", "/v1/datasets", "", 400, "invalid_dataset");
  r = req(ca, "GET", "/v1/datasets", NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  cr_expect(json_is_array(json_object_get(r.json, "datasets")), "%s", r.body);
  cr_expect_eq(json_array_size(json_object_get(r.json, "datasets")), 0, "%s", r.body);
  lt_client_resp_free(&r);
}

/* fn over the tenant's objects under tenants/<tenant>/ in the bucket (the first page: enough for a
 * test's few). */
/* Every object the bucket keeps for the tenant: its datasets and artifacts, its checkpoints, its
 * sessions' call bodies. */
static void list_tenant_objects(const char *tenant, lt_store_list_fn fn, void *ctx) {
  lt_store_t *st = lt_test_store();
  static const char *const prefixes[] = {"tenants/%s/", "staging/%s/", "sessions/%s/"};
  lt_err_t e = LT_OK;
  for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes && !e; i++) {
    char where[128], next[2048] = "";
    snprintf(where, sizeof where, prefixes[i], tenant);
    e = lt_store_list(st, where, "", 0, fn, ctx, next, sizeof next, err, sizeof err);
  }
  lt_store_destroy(st);
  cr_assert_eq(e, LT_OK, "%s", err);
}

static lt_err_t count_object(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key, (void)info;
  ++*(int *)ctx;
  return LT_OK;
}

Test(api, dataset_over_the_tenants_byte_quota_is_429_and_nothing_is_stored) {
  /* Tenant A's max_dataset_bytes is 4096. */
  size_t n = 0;
  char *big = malloc(8192);
  while (n + 60 < 6000) n += (size_t)sprintf(big + n, "{\"prompt\":\"line %zu\",\"completion\":\"yes\"}\n", n);
  lt_client_resp_t r = req(ca, "POST", "/v1/datasets?name=big", big);
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "", "over_quota", "%s", r.body);
  cr_expect(strstr(r.body, "4096"), "the limit is not named: %s", r.body);
  lt_client_resp_free(&r);
  /* The same through the parts route. */
  r = req(ca, "POST", "/v1/uploads?name=big2", NULL);
  cr_assert_eq(r.status, 201, "%s", r.body);
  char path[256];
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/1", json_string_value(json_object_get(r.json, "upload_id")));
  lt_client_resp_free(&r);
  r = req(ca, "PUT", path, big);
  cr_expect_eq(r.status, 429, "%s", r.body);
  lt_client_resp_free(&r);
  free(big);
  r = req(ca, "GET", "/v1/datasets", NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  cr_expect(json_is_array(json_object_get(r.json, "datasets")), "%s", r.body);
  cr_expect_eq(json_array_size(json_object_get(r.json, "datasets")), 0, "%s", r.body);
  lt_client_resp_free(&r);
  /* And nothing of the tenant in the bucket. */
  int count = 0;
  list_tenant_objects(tenant_a, count_object, &count);
  cr_expect_eq(count, 0, "objects of a refused upload stayed in the bucket");
}

static lt_err_t sum_sizes(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key;
  *(int64_t *)ctx += (int64_t)info->size;
  return LT_OK;
}

/* GET /v1/usage of a fresh tenant: the quotas its record set (0: none), nothing used; after an
 * upload and a submission, the job counted and the stored bytes those of its objects in the bucket;
 * another tenant's usage is its own. */
Test(api, usage_shows_each_quota_and_what_the_tenant_uses) {
  char tn[64], key[128], ds[64], job[64];
  new_tenant("u", "--max-queued 7 --max-running 5 --max-storage-bytes 10000000 --max-dataset-bytes 2048", tn,
             sizeof tn, key, sizeof key);
  lt_client_t *cu = client_for(key);
  wait_key(cu);
  lt_client_resp_t r = req(cu, "GET", "/v1/usage", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *q = json_object_get(r.json, "quotas"), *u = json_object_get(r.json, "usage");
  cr_expect_str_eq(json_string_value(json_object_get(r.json, "tenant_id")), tn);
  cr_expect_eq(json_integer_value(json_object_get(q, "max_queued_jobs")), 7, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(q, "max_running_slots")), 5, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(q, "max_dataset_bytes")), 2048, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(q, "max_storage_bytes")), 10000000, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(q, "max_storage_bytes_from")), "tenant", "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(u, "stored_bytes")), 0, "a new tenant stores nothing: %s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(u, "queued_or_running_jobs")), 0, "%s", r.body);
  lt_client_resp_free(&r);
  upload(cu, ds, sizeof ds);
  submit_ok(cu, ds, job, sizeof job);
  int64_t in_bucket = 0;
  list_tenant_objects(tn, sum_sizes, &in_bucket);
  cr_assert_gt(in_bucket, 0);
  int64_t live = -1, stored = -1, total = -1;
  for (int i = 0; i < 200 && live != 1; i++) { /* the API folds the submission from the log */
    r = req(cu, "GET", "/v1/usage", NULL);
    cr_assert_eq(r.status, 200, "%s", r.body);
    u = json_object_get(r.json, "usage");
    live = json_integer_value(json_object_get(u, "queued_or_running_jobs"));
    stored = json_integer_value(json_object_get(u, "stored_bytes"));
    total = json_integer_value(json_object_get(u, "storage_bytes"));
    lt_client_resp_free(&r);
    if (live != 1) lt_test_msleep(100);
  }
  cr_expect_eq(live, 1, "the queued job is not counted");
  cr_expect_eq(stored, in_bucket, "stored bytes %lld, the bucket holds %lld", (long long)stored, (long long)in_bucket);
  cr_expect_eq(total, stored, "no artifacts yet: storage is the stored bytes");
  r = req(cu, "GET", "/v1/usage", NULL);
  u = json_object_get(r.json, "usage");
  cr_expect(json_integer_value(json_object_get(u, "running_jobs")) == 0 &&
                json_integer_value(json_object_get(u, "running_slots")) == 0 &&
                json_integer_value(json_object_get(u, "sessions")) == 0,
            "a queued job holds no slot and is no session: %s", r.body);
  lt_client_resp_free(&r);
  /* tenant b: the defaults of tenant create (100 queued jobs), no storage quota (so no upload
   * measures it: /v1/usage lists the bucket itself), none of u's use */
  char theirs[64];
  upload(cb, theirs, sizeof theirs);
  upload(cb, theirs, sizeof theirs);
  int64_t b_bucket = 0;
  list_tenant_objects(tenant_b, sum_sizes, &b_bucket);
  r = req(cb, "GET", "/v1/usage", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(r.json, "tenant_id")), tenant_b);
  q = json_object_get(r.json, "quotas");
  u = json_object_get(r.json, "usage");
  cr_expect_eq(json_integer_value(json_object_get(q, "max_queued_jobs")), 100, "%s", r.body);
  cr_expect_gt(json_integer_value(json_object_get(q, "max_dataset_bytes")), 2048, "the service's bound: %s", r.body);
  cr_expect(strcmp(json_string_value(json_object_get(q, "max_storage_bytes_from")), "tenant") != 0, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(u, "queued_or_running_jobs")), 0, "%s", r.body);
  cr_expect(b_bucket > in_bucket && json_integer_value(json_object_get(u, "stored_bytes")) == b_bucket,
            "tenant b's two datasets: %lld bytes in the bucket: %s", (long long)b_bucket, r.body);
  lt_client_resp_free(&r);
  /* lathe usage prints the same */
  char cmd[1024];
  int rc;
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_API_KEY=%s '%s' usage 2>&1", api.url, key, lt_test_lathe_bin());
  char *out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 0, "%s", out);
  char want[128];
  snprintf(want, sizeof want, "stored %lld bytes", (long long)stored);
  cr_expect(strstr(out, tn) && strstr(out, "1 of 7") && strstr(out, want), "%s", out);
  free(out);
  expect_error(cu, "GET", "/v1/usage/other", NULL, 404, "not_found");
  expect_error(cu, "POST", "/v1/usage", "{}", 405, NULL);
  lt_client_t *none = client_for(NULL);
  expect_error(none, "GET", "/v1/usage", NULL, 401, "unauthorized");
  lt_client_destroy(none);
  lt_client_destroy(cu);
}

/* Requests that come while a tenant's storage is measured wait for that one measure, and every
 * one of them is answered. */
/* A save_state call's body is stored after the measure that checked the storage quota: the
 * next /v1/usage counts it (the measure from before it is not kept as if it were current). */
Test(api, usage_counts_a_session_calls_body_at_once) {
  char tn[64], key[128], sess[64], path[128];
  new_tenant("s", "--max-storage-bytes 10000000", tn, sizeof tn, key, sizeof key);
  lt_client_t *cs = client_for(key);
  wait_key(cs);
  lt_client_resp_t r = req(cs, "POST", "/v1/sessions", "{\"base_model\":\"tiny-llama\",\"lora\":{\"rank\":4}}");
  cr_assert(r.status == 201 || r.status == 202, "%d %s", r.status, r.body);
  snprintf(sess, sizeof sess, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  for (int i = 0; i < 100; i++) { /* the API folds the session from the log */
    r = req(cs, "POST", path, "{\"kind\":\"save_state\",\"name\":\"s1\"}");
    if (r.status != 404) break;
    lt_client_resp_free(&r);
    lt_test_msleep(100);
  }
  cr_assert_eq(r.status, 202, "%s", r.body);
  lt_client_resp_free(&r);
  int64_t in_bucket = 0;
  list_tenant_objects(tn, sum_sizes, &in_bucket);
  cr_assert_gt(in_bucket, 0, "the call's sealed body is in the bucket");
  r = req(cs, "GET", "/v1/usage", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(r.json, "usage"), "stored_bytes")), in_bucket,
               "the bucket holds %lld bytes: %s", (long long)in_bucket, r.body);
  lt_client_resp_free(&r);
  lt_client_destroy(cs);
}

Test(api, usage_asked_at_once_answers_every_request) {
  char tn[64], key[128], ds[64];
  new_tenant("w", NULL, tn, sizeof tn, key, sizeof key);
  lt_client_t *cw = client_for(key);
  wait_key(cw);
  upload(cw, ds, sizeof ds); /* no storage quota: nothing measured yet */
  enum { N = 8 };
  req_bg_t b[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    b[i] = (req_bg_t){.c = client_for(key), .method = "GET", .path = "/v1/usage"};
    cr_assert_eq(pthread_create(&th[i], NULL, req_bg, &b[i]), 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  json_int_t first = json_integer_value(json_object_get(json_object_get(b[0].json, "usage"), "stored_bytes"));
  for (int i = 0; i < N; i++) {
    json_int_t stored = json_integer_value(json_object_get(json_object_get(b[i].json, "usage"), "stored_bytes"));
    cr_expect_eq(b[i].status, 200, "request %d: %d", i, b[i].status);
    cr_expect(stored > 0 && stored == first, "request %d: %lld bytes, the first %lld", i, (long long)stored,
              (long long)first);
    json_decref(b[i].json);
    lt_client_destroy(b[i].c);
  }
  lt_client_destroy(cw);
}

Test(api, max_queued_jobs_exceeded_is_429_naming_the_limit) {
  char ds[64];
  upload(ca, ds, sizeof ds);
  for (int i = 0; i < 3; i++) {
    lt_client_resp_t r = submit(ca, ds, NULL);
    cr_assert_eq(r.status, 201, "%s", r.body);
    lt_client_resp_free(&r);
  }
  lt_client_resp_t r = submit(ca, ds, "one-too-many");
  cr_expect_eq(r.status, 429, "%s", r.body);
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "", "over_quota");
  cr_expect(strstr(r.body, "max_queued_jobs"), "%s", r.body);
  lt_client_resp_free(&r);
  json_t *jobs = list_jobs(ca);
  cr_expect_eq(json_array_size(jobs), 3);
  json_decref(jobs);
}

/* Submissions sent all at once: the ones past the limit are refused even while the first are
 * still on their way to the broker (before, each was checked against the jobs folded so far, so
 * a burst passed the limit by as many as were in flight). */
Test(api, a_burst_of_submissions_stops_at_max_queued_jobs) {
  char ds[64], body[256];
  upload(ca, ds, sizeof ds); /* seen by this API: no store look-up between the check and the send */
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}", ds);
  enum { N = 12 };
  req_bg_t b[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    b[i] = (req_bg_t){.c = client_for(key_a), .method = "POST", .path = "/v1/jobs", .body = body};
    cr_assert_eq(pthread_create(&th[i], NULL, req_bg, &b[i]), 0);
  }
  int created = 0, refused = 0;
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    created += b[i].status == 201;
    refused += b[i].status == 429;
    json_decref(b[i].json);
    lt_client_destroy(b[i].c);
  }
  cr_expect(created == 3 && refused == N - 3, "max_queued_jobs 3: %d created, %d refused of %d", created, refused, N);
  json_t *jobs = list_jobs(ca);
  cr_expect_eq(json_array_size(jobs), 3);
  json_decref(jobs);
  cr_expect_eq(count_records("jobs", "JobSubmitted", NULL), 3, "the log holds what was acknowledged, no more");
}

Test(api, cancel_twice_is_idempotent_and_records_one_cancel) {
  char ds[64], path[256];
  char id[64];
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, id, sizeof id);
  lt_client_resp_t r;
  snprintf(path, sizeof path, "/v1/jobs/%s/cancel", id);
  for (int i = 0; i < 2; i++) {
    r = req(ca, "POST", path, NULL);
    cr_expect_eq(r.status, 202, "cancel #%d: %s", i + 1, r.body);
    cr_expect(json_is_true(json_object_get(r.json, "cancel_requested")), "%s", r.body);
    lt_client_resp_free(&r);
  }
  cr_expect_eq(count_records("control", "CancelRequested", id), 1);
}

/* ---------------------------------------------------------------- SSE */

typedef struct {
  char ids[8][64];
  char events[8][48];
  int n;
  int stop_after;
} events_t;

static bool collect(void *ctx, const lt_client_event_t *ev) {
  events_t *e = ctx;
  if (strcmp(ev->event, "end") == 0) return true;
  if (e->n < 8) {
    snprintf(e->ids[e->n], sizeof e->ids[0], "%s", ev->id);
    snprintf(e->events[e->n], sizeof e->events[0], "%s", ev->event);
    e->n++;
  }
  return e->stop_after && e->n >= e->stop_after;
}

/* What the scheduler would write when it honours a cancel before dispatch. */
static void produce_job_cancelled(const char *job_id, const char *tenant) {
  lt_bus_conf_t *conf = lt_test_bus_env();
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  lt_bus_producer_t *p;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, "JobCancelled", &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, "scheduler/test");
  lt_avro_set_string(rec, "job_id", job_id);
  lt_avro_set_string(rec, "tenant_id", tenant);
  lt_avro_set_int(rec, "attempt", 0);
  lt_avro_set_string(rec, "cancel_event_id", "test");
  lt_avro_set_string(rec, "requested_by", "customer");
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(rec, &b, &len, err, sizeof err), LT_OK, "%s", err);
  char topic[128];
  lt_bus_topic_name(conf, "control", topic, sizeof topic);
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK);
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = job_id, .key_size = strlen(job_id),
                       .value = b, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(p, &r, 15000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_bus_producer_destroy(p, 5000);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(conf);
}

Test(api, events_arrive_in_order_and_last_event_id_resumes_after_that_event) {
  char ds[64], path[256], jpath[256];
  char id[64];
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, id, sizeof id);
  lt_client_resp_t r;
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  snprintf(jpath, sizeof jpath, "/v1/jobs/%s/cancel", id);
  r = req(ca, "POST", jpath, NULL);
  cr_assert_eq(r.status, 202);
  lt_client_resp_free(&r);
  events_t e = {.stop_after = 2};
  cr_assert_eq(lt_client_events(ca, path, NULL, collect, &e, NULL, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(e.n, 2);
  cr_expect_str_eq(e.events[0], "JobSubmitted");
  cr_expect_str_eq(e.events[1], "CancelRequested");
  cr_expect_str_neq(e.ids[0], e.ids[1]);
  /* Open a live stream from after the first event, then the terminal record arrives. */
  produce_job_cancelled(id, tenant_a);
  events_t e2 = {0};
  cr_assert_eq(lt_client_events(ca, path, e.ids[0], collect, &e2, NULL, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(e2.n, 2, "resumed stream had %d events", e2.n);
  cr_expect_str_eq(e2.ids[0], e.ids[1], "the stream did not resume right after the given id");
  cr_expect_str_eq(e2.events[1], "JobCancelled");
  /* A terminal job's stream ends by itself, after its history. */
  events_t e3 = {0};
  cr_assert_eq(lt_client_events(ca, path, e2.ids[0], collect, &e3, NULL, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(e3.n, 1);
  cr_expect_str_eq(e3.events[0], "JobCancelled");
}

/* ---------------------------------------------------------------- listing */

/* Datasets page like jobs: each costs a store read, so a page bounds the work. The pages cover
 * every dataset once; another tenant's id as the cursor shows nothing of theirs. */
/* A stream of a job nothing happens to (no scheduler here: it stays submitted) still says something
 * every 15 s, so that proxies with idle timeouts do not cut it. */
Test(api, an_idle_event_stream_gets_a_keepalive_comment) {
  char ds[64], id[64], text[512];
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, id, sizeof id);
  int fd = raw_connect(api.port, NULL);
  int n = snprintf(text, sizeof text, "GET /v1/jobs/%s/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
                   id, key_a);
  cr_assert_eq(send(fd, text, (size_t)n, MSG_NOSIGNAL), n);
  char buf[8192] = "";
  size_t got = 0;
  time_t t0 = time(NULL);
  while (!strstr(buf, ": keepalive") && time(NULL) - t0 < 40 && got + 1 < sizeof buf) {
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0); /* SO_RCVTIMEO 10 s */
    if (r > 0) buf[got += (size_t)r] = '\0';
    else if (r == 0) break;
  }
  close(fd);
  cr_expect(strstr(buf, "text/event-stream"), "%s", buf);
  cr_expect(strstr(buf, "\n: keepalive\n\n"), "no keepalive within %lld s: %s", (long long)(time(NULL) - t0), buf);
}

Test(api, dataset_listing_pages_with_limit_after_and_has_more) {
  char ds[3][64], ids[3][64], path[256];
  for (int i = 0; i < 3; i++) upload(ca, ds[i], sizeof ds[i]);
  lt_client_resp_t r = req(ca, "GET", "/v1/datasets?limit=2", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  json_t *page = json_object_get(r.json, "datasets");
  cr_assert_eq(json_array_size(page), 2, "%s", r.body);
  cr_assert(json_is_true(json_object_get(r.json, "has_more")), "%s", r.body);
  for (int i = 0; i < 2; i++)
    snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(json_array_get(page, i), "id")));
  cr_assert_str_eq(json_string_value(json_object_get(r.json, "last_id")), ids[1]);
  snprintf(path, sizeof path, "/v1/datasets?limit=2&after=%s", ids[1]);
  lt_client_resp_free(&r);
  r = req(ca, "GET", path, NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  page = json_object_get(r.json, "datasets");
  cr_assert_eq(json_array_size(page), 1, "%s", r.body);
  cr_assert(json_is_false(json_object_get(r.json, "has_more")), "%s", r.body);
  snprintf(ids[2], sizeof ids[2], "%s", json_string_value(json_object_get(json_array_get(page, 0), "id")));
  lt_client_resp_free(&r);
  for (int i = 0; i < 3; i++) {
    int seen = 0;
    for (int k = 0; k < 3; k++) seen += strcmp(ds[i], ids[k]) == 0;
    cr_expect_eq(seen, 1, "dataset %s appears %d times across the pages", ds[i], seen);
  }
  /* Tenant B with A's id as the cursor: B's own (none), never A's. */
  snprintf(path, sizeof path, "/v1/datasets?after=%s", ids[0]);
  r = req(cb, "GET", path, NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_eq(json_array_size(json_object_get(r.json, "datasets")), 0, "%s", r.body);
  lt_client_resp_free(&r);
  expect_error(ca, "GET", "/v1/datasets?limit=0", NULL, 400, "invalid");
  expect_error(ca, "GET", "/v1/datasets?limit=501", NULL, 400, "invalid");
  expect_error(ca, "GET", "/v1/datasets?after=../x", NULL, 400, "invalid");
}

Test(api, job_listing_pages_with_limit_after_and_has_more) {
  char ds[64], ids[3][64];
  upload(cb, ds, sizeof ds);
  for (int i = 0; i < 3; i++) submit_ok(cb, ds, ids[i], sizeof ids[i]);
  lt_client_resp_t r = req(cb, "GET", "/v1/jobs?limit=2", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(r.json, "object")), "list");
  cr_expect_eq(json_array_size(json_object_get(r.json, "jobs")), 2);
  cr_expect(json_is_true(json_object_get(r.json, "has_more")), "%s", r.body);
  char path[256], seen[3][64];
  json_int_t at[3];
  const char *last = json_string_value(json_object_get(r.json, "last_id"));
  cr_assert(last, "%s", r.body);
  for (int i = 0; i < 2; i++) {
    json_t *job = json_array_get(json_object_get(r.json, "jobs"), i);
    snprintf(seen[i], sizeof seen[i], "%s", json_string_value(json_object_get(job, "id")));
    at[i] = json_integer_value(json_object_get(job, "submitted_at"));
  }
  cr_expect_str_eq(last, seen[1]);
  snprintf(path, sizeof path, "/v1/jobs?limit=2&after=%s", last);
  lt_client_resp_free(&r);
  r = req(cb, "GET", path, NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_eq(json_array_size(json_object_get(r.json, "jobs")), 1, "%s", r.body);
  cr_expect(json_is_false(json_object_get(r.json, "has_more")), "%s", r.body);
  cr_expect(json_is_null(json_object_get(r.json, "next_cursor")), "%s", r.body);
  json_t *third = json_array_get(json_object_get(r.json, "jobs"), 0);
  snprintf(seen[2], sizeof seen[2], "%s", json_string_value(json_object_get(third, "id")));
  at[2] = json_integer_value(json_object_get(third, "submitted_at"));
  lt_client_resp_free(&r);
  /* The pages hold each job once, newest first (by submission time, then id). */
  for (int i = 0; i < 2; i++)
    cr_expect(at[i] > at[i + 1] || (at[i] == at[i + 1] && strcmp(seen[i], seen[i + 1]) > 0), "%s@%lld then %s@%lld",
              seen[i], (long long)at[i], seen[i + 1], (long long)at[i + 1]);
  cr_expect_str_eq(seen[0], ids[2], "the job submitted last comes first");
  int found = 0;
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 3; k++) found += strcmp(ids[i], seen[k]) == 0;
  cr_expect_eq(found, 3);
  /* The bounds are named in the error; a cursor that is no id is refused. */
  r = req(cb, "GET", "/v1/jobs?limit=501", NULL);
  cr_expect_eq(r.status, 400);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")), "limit");
  cr_expect(strstr(r.body, "1 to 500") && strstr(r.body, "default 50"), "%s", r.body);
  lt_client_resp_free(&r);
  expect_error(cb, "GET", "/v1/jobs?after=..%2F..", NULL, 400, "invalid");
  /* Another tenant's job id as the cursor is refused as any id that is not the caller's: it
   * shows nothing of that tenant, not even that the id exists. */
  char ads[64], aid[64];
  upload(ca, ads, sizeof ads);
  submit_ok(ca, ads, aid, sizeof aid);
  snprintf(path, sizeof path, "/v1/jobs?limit=500&after=%s", aid);
  r = req(cb, "GET", path, NULL);
  lt_client_resp_t none = req(cb, "GET", "/v1/jobs?limit=500&after=job-000000000000000000000000", NULL);
  cr_expect_eq(r.status, 400, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")), "after");
  cr_expect_str_eq(r.body, none.body, "another tenant's id and no id answer alike");
  cr_expect(!strstr(r.body, tenant_a), "tenant A shows in B's listing: %s", r.body);
  lt_client_resp_free(&r);
  lt_client_resp_free(&none);
}

/* ---------------------------------------------------------------- SSE history, bounded */

typedef struct {
  char ids[8][48], events[8][48], data[8][400];
  int n, stop_after;
} stream_t;

static bool collect_all(void *ctx, const lt_client_event_t *ev) {
  stream_t *e = ctx;
  if (strcmp(ev->event, "end") == 0) return true;
  if (e->n < 8) {
    snprintf(e->ids[e->n], sizeof e->ids[0], "%s", ev->id);
    snprintf(e->events[e->n], sizeof e->events[0], "%s", ev->event);
    snprintf(e->data[e->n], sizeof e->data[0], "%s", ev->data);
    e->n++;
  }
  return e->stop_after && e->n >= e->stop_after;
}

static stream_t stream(lt_client_t *c, const char *path, const char *last, int stop_after) {
  stream_t e = {.stop_after = stop_after};
  cr_assert_eq(lt_client_events(c, path, last, collect_all, &e, NULL, err, sizeof err), LT_OK, "%s", err);
  return e;
}

static void produce_cancel_requested(const char *job, const char *event_id) {
  produce_json("control", "CancelRequested", job,
               json_pack("{s:s,s:I,s:s,s:s,s:s,s:s,s:n}", "event_id", event_id, "occurred_at",
                         (json_int_t)lt_time_wall_ms(), "producer", "api/test", "job_id", job, "tenant_id", tenant_a,
                         "requested_by", "customer", "reason"));
}

Test(api, sse_history_keeps_the_newest_events_and_says_gap_for_what_it_dropped) {
  srv_t s = start_api_with(NULL, (const char *const[]){"LATHE_API_SSE_HISTORY=3", "LATHE_API_SSE_KEEP_ENDED_MS=1", NULL});
  lt_client_t *a = lt_test_client(s.url, key_a, 30);
  char ds[64], id[64], path[256];
  upload(ca, ds, sizeof ds);
  submit_ok(ca, ds, id, sizeof id);
  /* The job was submitted through the suite's API: this one knows it once it folded it. */
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  lt_test_wait_until(lt_test_get_status(a, path, NULL, 0) == 200, 20000, 100, "the second API never folded %s", id);
  snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
  stream_t first = stream(a, path, NULL, 1);
  cr_assert_str_eq(first.events[0], "JobSubmitted");
  const char *ev[] = {"c1", "c2", "c3", "c4"};
  for (int i = 0; i < 4; i++) produce_cancel_requested(id, ev[i]);
  /* Once c3 and c4 are folded, resuming after c3 gives c4. */
  stream_t e;
  lt_test_wait_until((e = stream(a, path, "c3", 1), strcmp(e.ids[0], "c4") == 0), 20000, 200,
                     "resuming after c3 gave %s %s", e.events[0], e.ids[0]);
  /* Only the newest 3 are kept. */
  e = stream(a, path, NULL, 3);
  cr_expect_str_eq(e.ids[0], "c2");
  cr_expect_str_eq(e.ids[1], "c3");
  cr_expect_str_eq(e.ids[2], "c4");
  /* Resuming after a dropped event: a gap first, saying how many were dropped, then the oldest kept. */
  e = stream(a, path, first.ids[0], 2);
  cr_expect_str_eq(e.events[0], "gap", "%s: %s", e.events[0], e.data[0]);
  json_t *gap = json_loads(e.data[0], 0, NULL);
  cr_expect_eq(json_integer_value(json_object_get(gap, "dropped")), 2, "%s", e.data[0]);
  cr_expect_str_eq(json_string_value(json_object_get(gap, "oldest_id")), "c2", "%s", e.data[0]);
  json_decref(gap);
  cr_expect_str_eq(e.ids[1], "c2");
  /* A finished job's buffer goes after LATHE_API_SSE_KEEP_ENDED_MS: the stream only ends. */
  produce_job_cancelled(id, tenant_a);
  lt_test_wait_until((e = stream(a, path, NULL, 0), e.n == 0), 20000, 300,
                     "the finished job's events were never forgotten (%d, first %s)", e.n, e.events[0]);
  lt_client_destroy(a);
  stop_api(&s);
}

/* ---------------------------------------------------------------- TLS */

/* Runs a shell command that must succeed (what names it in the failure). */
static void sh_ok(const char *cmd, const char *what) {
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", what, out);
  free(out);
}

/* A self-signed certificate for subject alt name san, and its key, made with the openssl CLI in
 * dir as NAME.pem and NAME.key. */
static void make_cert(const char *dir, const char *name, const char *san) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=lathe-test -addext subjectAltName=%s "
           "-keyout '%s/%s.key' -out '%s/%s.pem' 2>&1",
           san, dir, name, dir, name);
  sh_ok(cmd, "openssl req");
}

Test(api, the_api_speaks_tls_and_the_client_verifies_the_certificate_and_host) {
  char dir[] = "/tmp/test_api_tls.XXXXXX";
  cr_assert(mkdtemp(dir));
  make_cert(dir, "good", "IP:127.0.0.1");
  make_cert(dir, "other", "DNS:other.example");
  char cert[300], key[300], good_ca[300], other_ca[300];
  snprintf(cert, sizeof cert, "%s/good.pem", dir);
  snprintf(key, sizeof key, "%s/good.key", dir);
  snprintf(good_ca, sizeof good_ca, "%s/good.pem", dir);
  snprintf(other_ca, sizeof other_ca, "%s/other.pem", dir);
  srv_t s = start_api_with((const char *const[]){"--tls-cert", cert, "--tls-key", key, NULL}, NULL);
  char url[80];
  snprintf(url, sizeof url, "https://127.0.0.1:%u", s.port);
  cr_expect(strncmp(s.url, "http://", 7) == 0); /* start_api_with's plain URL is not used below */
  /* Trusting the certificate: the whole API over TLS, SSE included. */
  lt_client_opts_t o = {.url = url, .api_key = key_a, .ca_file = good_ca, .timeout_s = 30};
  lt_client_t *c;
  cr_assert_eq(lt_client_new(&o, &c, err, sizeof err), LT_OK, "%s", err);
  lt_client_resp_t r = req(c, "GET", "/v1/jobs", NULL);
  cr_expect_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  char ds[64], jid[64], path[256];
  r = req(c, "POST", "/v1/datasets?name=tls", valid_jsonl);
  cr_assert_eq(r.status, 201, "%s", r.body);
  snprintf(ds, sizeof ds, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  submit_ok(c, ds, jid, sizeof jid);
  snprintf(path, sizeof path, "/v1/jobs/%s/events", jid);
  events_t e = {.stop_after = 1};
  cr_expect_eq(lt_client_events(c, path, NULL, collect, &e, NULL, err, sizeof err), LT_OK, "%s", err);
  cr_expect_str_eq(e.events[0], "JobSubmitted");
  lt_client_destroy(c);
  /* A certificate for another name, or one nobody vouches for: refused, saying why. */
  const char *cas[] = {other_ca, NULL};
  const char *whys[] = {"not accepted", "not accepted"};
  for (int i = 0; i < 2; i++) {
    lt_client_opts_t bad = {.url = url, .api_key = key_a, .ca_file = cas[i], .timeout_s = 30};
    if (!cas[i]) unsetenv("LATHE_API_CA_FILE");
    cr_assert_eq(lt_client_new(&bad, &c, err, sizeof err), LT_OK, "%s", err);
    lt_client_resp_t rb;
    lt_err_t got = lt_client_request(c, "GET", "/v1/jobs", NULL, 0, NULL, 0, NULL, &rb, err, sizeof err);
    cr_expect_eq(got, LT_ERR_AUTH, "case %d: %s (%d)", i, err, rb.status);
    cr_expect(strstr(err, whys[i]) != NULL, "case %d: %s", i, err);
    lt_client_resp_free(&rb);
    lt_client_destroy(c);
  }
  /* libevent's own rejections come in the envelope over TLS too. */
  char cmd[400];
  snprintf(cmd, sizeof cmd,
           "printf 'BREW / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n' | timeout 10 openssl s_client -quiet -connect "
           "127.0.0.1:%u 2>/dev/null",
           s.port);
  int rc;
  char *out = lt_test_run(cmd, &rc);
  raw_expect_envelope(out, 501, "not_implemented");
  free(out);
  /* Plain HTTP to the TLS port gets no answer. */
  lt_client_t *plain = lt_test_client(s.url, key_a, 5);
  lt_client_resp_t rp;
  cr_expect_neq(lt_client_request(plain, "GET", "/v1/jobs", NULL, 0, NULL, 0, NULL, &rp, err, sizeof err), LT_OK);
  lt_client_resp_free(&rp);
  lt_client_destroy(plain);
  stop_api(&s);
  lt_test_rm_rf(dir);
}

/* The SHA-256 fingerprint of the certificate the API on port serves, or of the PEM file at path
 * (port 0), into out. */
static void fingerprint(unsigned port, const char *path, char *out, size_t n) {
  char cmd[600];
  if (port)
    snprintf(cmd, sizeof cmd, "timeout 10 openssl s_client -connect 127.0.0.1:%u </dev/null 2>/dev/null | "
             "openssl x509 -noout -fingerprint -sha256 2>&1", port);
  else
    snprintf(cmd, sizeof cmd, "openssl x509 -in '%s' -noout -fingerprint -sha256 2>&1", path);
  int rc;
  char *got = lt_test_run(cmd, &rc);
  snprintf(out, n, "%s", rc == 0 ? got : "(none)");
  free(got);
}

/* cp from to (both in dir). */
static void copy_in(const char *dir, const char *from, const char *to) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "cp '%s/%s' '%s/%s.tmp' && mv '%s/%s.tmp' '%s/%s' 2>&1", dir, from, dir, to, dir, to, dir, to);
  sh_ok(cmd, "cp");
}

/* A renewed certificate without a restart: on SIGHUP the API reads its certificate and key files
 * again, and new connections get the new one; files that cannot be used (a certificate whose key
 * is another's, a file that is no certificate) are refused, counted, and the certificate served
 * before stays. /metrics says when the one served expires. Before, SIGHUP killed lathed. */
Test(api, sighup_reloads_the_certificate_and_a_bad_one_is_refused) {
  char dir[] = "/tmp/test_api_tls.XXXXXX";
  cr_assert(mkdtemp(dir));
  make_cert(dir, "one", "IP:127.0.0.1");
  make_cert(dir, "two", "IP:127.0.0.1");
  copy_in(dir, "one.pem", "cert.pem");
  copy_in(dir, "one.key", "key.pem");
  char cert[300], key[300], want1[200], want2[200], got[200];
  snprintf(cert, sizeof cert, "%s/cert.pem", dir);
  snprintf(key, sizeof key, "%s/key.pem", dir);
  snprintf(got, sizeof got, "%s/one.pem", dir);
  fingerprint(0, got, want1, sizeof want1);
  snprintf(got, sizeof got, "%s/two.pem", dir);
  fingerprint(0, got, want2, sizeof want2);
  cr_assert(strncmp(want1, "sha256", 6) == 0 || strncmp(want1, "SHA256", 6) == 0, "%s", want1);
  srv_t s = start_api_with((const char *const[]){"--tls-cert", cert, "--tls-key", key, NULL}, NULL);
  fingerprint(s.port, NULL, got, sizeof got);
  cr_expect_str_eq(got, want1, "the first certificate is not the one served");
  /* renewed: two's files in place, SIGHUP */
  copy_in(dir, "two.pem", "cert.pem");
  copy_in(dir, "two.key", "key.pem");
  lt_test_proc_kill(s.proc, SIGHUP);
  lt_test_wait_until((fingerprint(s.port, NULL, got, sizeof got), strcmp(got, want2) == 0), 20000, 200,
                     "the renewed certificate was never served: %s", got);
  int status;
  cr_assert(!lt_test_proc_exited(s.proc, &status), "SIGHUP stopped lathed (status %d)", status);
  /* a certificate with another's key, then a file that is no certificate: refused, two stays */
  copy_in(dir, "one.pem", "cert.pem");
  lt_test_proc_kill(s.proc, SIGHUP);
  lt_client_t *ops = lt_test_client(s.ops_url, NULL, 10);
  char body[65536] = "";
  lt_test_wait_until(lt_test_get_status(ops, "/metrics", body, sizeof body) == 200 &&
                         strstr(body, "lathe_api_tls_reloads_total{result=\"refused\"} 1\n"),
                     20000, 200, "the mismatched pair was not refused once");
  fingerprint(s.port, NULL, got, sizeof got);
  cr_expect_str_eq(got, want2, "a refused reload changed the certificate served");
  FILE *f = fopen(cert, "w");
  cr_assert_not_null(f);
  fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n", f);
  fclose(f);
  lt_test_proc_kill(s.proc, SIGHUP);
  lt_test_wait_until(lt_test_get_status(ops, "/metrics", body, sizeof body) == 200 &&
                         strstr(body, "lathe_api_tls_reloads_total{result=\"refused\"} 2\n"),
                     20000, 200, "the garbage certificate was not refused");
  cr_expect(strstr(body, "lathe_api_tls_reloads_total{result=\"ok\"} 1\n"), "%s", body);
  const char *na = strstr(body, "\nlathe_api_tls_certificate_not_after_seconds ");
  double not_after = na ? atof(na + strlen("\nlathe_api_tls_certificate_not_after_seconds ")) : 0;
  double now = (double)time(NULL);
  cr_expect(not_after > now && not_after < now + 3 * 86400, "notAfter %.0f, now %.0f (a one-day certificate)",
            not_after, now);
  fingerprint(s.port, NULL, got, sizeof got);
  cr_expect_str_eq(got, want2, "a refused reload changed the certificate served");
  /* the whole API still answers over TLS, with the certificate it kept */
  char url[80], trust[300];
  snprintf(url, sizeof url, "https://127.0.0.1:%u", s.port);
  snprintf(trust, sizeof trust, "%s/two.pem", dir);
  lt_client_opts_t o = {.url = url, .api_key = key_a, .ca_file = trust, .timeout_s = 30};
  lt_client_t *c;
  cr_assert_eq(lt_client_new(&o, &c, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(lt_test_get_status(c, "/v1/jobs", NULL, 0), 200);
  lt_client_destroy(c);
  lt_client_destroy(ops);
  cr_assert(!lt_test_proc_exited(s.proc, &status), "lathed stopped after the SIGHUPs (status %d)", status);
  stop_api(&s);
  lt_test_rm_rf(dir);
}

/* ---------------------------------------------------------------- restart */

static json_t *states(lt_client_t *c) {
  json_t *jobs = list_jobs(c), *out = json_object();
  size_t i;
  json_t *j;
  json_array_foreach(jobs, i, j) json_object_set(out, json_string_value(json_object_get(j, "id")), json_object_get(j, "state"));
  json_decref(jobs);
  return out;
}

/* Does GET path say the job's cancel was requested? */
static bool cancel_requested(lt_client_t *c, const char *path) {
  lt_client_resp_t r = req(c, "GET", path, NULL);
  bool yes = json_is_true(json_object_get(r.json, "cancel_requested"));
  lt_client_resp_free(&r);
  return yes;
}

static char *health_digest(void) {
  lt_client_t *c = lt_test_client(api.ops_url, NULL, 0);
  lt_client_resp_t r = req(c, "GET", "/healthz", NULL);
  const char *d = json_string_value(json_object_get(r.json, "digest"));
  cr_assert(d, "/healthz has no digest: %s", r.body);
  char *out = strdup(d);
  lt_client_resp_free(&r);
  lt_client_destroy(c);
  return out;
}

Test(api, a_restarted_api_answers_the_same_job_states_and_digest) {
  char ds[64], path[256];
  upload(ca, ds, sizeof ds);
  char ids[2][64];
  for (int i = 0; i < 2; i++) submit_ok(ca, ds, ids[i], sizeof ids[i]);
  snprintf(path, sizeof path, "/v1/jobs/%s/cancel", ids[1]);
  lt_client_resp_t r = req(ca, "POST", path, NULL);
  cr_assert_eq(r.status, 202);
  lt_client_resp_free(&r);
  /* The digest before the restart is taken once the API has read its own cancel back from the
   * log (GET answers from the fold): the restarted API folds it too. */
  snprintf(path, sizeof path, "/v1/jobs/%s", ids[1]);
  lt_test_wait_until(cancel_requested(ca, path), 10000, 100, "the API did not fold its own cancel within 10 s");
  json_t *before = states(ca);
  char *d1 = health_digest();
  stop_api(&api);
  api = start_api();
  lt_client_destroy(ca);
  ca = client_for(key_a);
  /* start_api waits for /healthz 200, which the API answers only once its fold reached the
   * topics' end as of start-up: the digest must be the same at once. */
  json_t *after = states(ca);
  char *d2 = health_digest();
  cr_expect(json_equal(before, after), "job states differ after a restart");
  cr_expect_str_eq(d1, d2, "the projection digest differs after a restart");
  snprintf(path, sizeof path, "/v1/jobs/%s", ids[1]);
  r = req(ca, "GET", path, NULL);
  cr_expect(json_is_true(json_object_get(r.json, "cancel_requested")), "%s", r.body);
  lt_client_resp_free(&r);
  /* /debug/jobs: the lines the digest hashes, one per job (an operator diffs two processes') */
  lt_client_t *ops = lt_test_client(api.ops_url, NULL, 0);
  r = req(ops, "GET", "/debug/jobs", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(r.json, "digest")), d2);
  json_t *lines = json_object_get(r.json, "jobs"), *l;
  size_t i, mine = 0;
  json_array_foreach(lines, i, l) {
    const char *t = json_string_value(l);
    cr_assert(t && strchr(t, '|'), "a job line is not the digest's form: %s", r.body);
    mine += strncmp(t, ids[0], strlen(ids[0])) == 0 || strncmp(t, ids[1], strlen(ids[1])) == 0;
  }
  cr_expect_eq(mine, 2, "the two jobs' lines: %s", r.body);
  lt_client_resp_free(&r);
  lt_client_destroy(ops);
  json_decref(before);
  json_decref(after);
  free(d1);
  free(d2);
}

/* Retention emptied a partition the API reads (its oldest offset is its high watermark, > 0):
 * it holds nothing to wait for, and gives the consumer no position. A restarted API is ready all
 * the same, not 503 "starting" for ever. DeleteRecords stands in for retention (same effect on
 * the log: the start offset moves to the end). */
Test(api, a_restarted_api_is_ready_though_retention_emptied_a_partition) {
  lt_bus_conf_t *conf = lt_test_bus_env(); /* the admin principal */
  char topic[128];
  lt_bus_topic_name(conf, "progress", topic, sizeof topic);
  lt_bus_producer_t *p;
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK, "%s", err);
  lt_bus_record_t r = {.topic = topic, .partition = 0, .key = "k", .key_size = 1, .value = "x", .value_size = 1};
  cr_assert_eq(lt_bus_produce_sync(p, &r, 15000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_bus_producer_destroy(p, 5000);
  lt_test_empty_partition(conf, topic, 0);
  lt_bus_conf_destroy(conf);

  stop_api(&api);
  api = start_api(); /* fails unless /healthz answers 200 within 30 s */
  lt_client_t *ops = lt_test_client(api.ops_url, NULL, 0);
  lt_client_resp_t h = req(ops, "GET", "/healthz", NULL);
  cr_expect(h.status == 200 && json_is_true(json_object_get(h.json, "ready")) &&
                !json_object_get(h.json, "waiting_for"),
            "%d %s", h.status, h.body);
  lt_client_resp_free(&h);
  lt_client_destroy(ops);
  lt_client_destroy(ca);
  ca = client_for(key_a);
  wait_key(ca); /* and it knows the tenants */
}

/* ---------------------------------------------------------------- rate text (no server) */

Test(api_rates, rate_limits_read_as_r_slash_b_r_alone_or_off_and_refuse_anything_else) {
  lt_api_rate_t r;
  cr_assert(lt_api_rate_parse("20/40", &r));
  cr_expect(r.per_s == 20 && r.burst == 40);
  cr_assert(lt_api_rate_parse("0.5", &r));
  cr_expect(r.per_s == 0.5 && r.burst == 1, "a slow rate alone still allows one request: %g", r.burst);
  cr_assert(lt_api_rate_parse("3", &r));
  cr_expect(r.burst == 6);
  cr_assert(lt_api_rate_parse("off", &r));
  cr_expect(r.per_s < 0);
  const char *bad[] = {"", "0", "-1/5", "5/0", "5/", "abc", "5/x", "5 /5", "inf", "nan/3", "2/3/4"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) cr_expect(!lt_api_rate_parse(bad[i], &r), "\"%s\"", bad[i]);
}

/* ---------------------------------------------------------------- base models, reasons */

/* Produces a record given as JSON (every field of its schema) to a topic of this prefix. */
/* Records of type from the JSON objects objs[0..n) (taken), in order, keyed key, through one
 * producer: one acknowledged before it returns; several queued, then flushed (a record that did
 * not go shows in what the caller reads back). */
static void produce_jsons(const char *base, const char *type, const char *key, json_t **objs, int n) {
  lt_bus_conf_t *conf = lt_test_bus_env(); /* the admin principal */
  lt_avro_registry_t *reg;
  lt_bus_producer_t *p;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK);
  char topic[128];
  lt_bus_topic_name(conf, base, topic, sizeof topic);
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK);
  for (int i = 0; i < n; i++) {
    lt_avro_record_t *rec;
    cr_assert_eq(lt_avro_record_new(reg, type, &rec, err, sizeof err), LT_OK);
    cr_assert_eq(lt_avro_record_from_jansson(rec, objs[i], err, sizeof err), LT_OK, "%s", err);
    const uint8_t *b;
    size_t len;
    cr_assert_eq(lt_avro_record_encode(rec, &b, &len, err, sizeof err), LT_OK, "%s", err);
    lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = key, .key_size = strlen(key),
                         .value = b, .value_size = len};
    if (n == 1) cr_assert_eq(lt_bus_produce_sync(p, &r, 15000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
    else cr_assert_eq(lt_bus_produce(p, &r, NULL, err, sizeof err), LT_OK, "%s", err);
    lt_avro_record_destroy(rec);
    json_decref(objs[i]);
  }
  cr_assert_eq(lt_bus_producer_flush(p, 30000, err, sizeof err), LT_OK, "%s", err);
  lt_bus_producer_destroy(p, 5000);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(conf);
}

static void produce_json(const char *base, const char *type, const char *key, json_t *obj) {
  produce_jsons(base, type, key, &obj, 1);
}

static lt_client_resp_t submit_model(lt_client_t *c, const char *model, const char *dataset) {
  char body[512];
  snprintf(body, sizeof body, "{\"base_model\":\"%s\",\"dataset_id\":\"%s\"}", model, dataset);
  return req(c, "POST", "/v1/jobs", body);
}

static int submit_status(lt_client_t *c, const char *model, const char *dataset) {
  lt_client_resp_t r = submit_model(c, model, dataset);
  int status = r.status;
  lt_client_resp_free(&r);
  return status;
}

/* A suite of its own: its heartbeat would refuse the other suites' models. */
static void models_setup(void) {
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT"))
    cr_assert_fail("needs the local stack: ops/stack up && eval \"$(ops/stack env)\"");
  lt_test_scratch_prefix("tmod", prefix, sizeof prefix);
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  lt_test_admin_topics();
  new_tenant("m", NULL, tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  api = start_api();
  ca = client_for(key_a);
  wait_key(ca);
}

TestSuite(api_models, .init = models_setup, .fini = teardown, .timeout = 240);

Test(api_models, a_base_model_no_worker_serves_is_400_naming_the_field_and_records_nothing) {
  char ds[64], id[64];
  upload(ca, ds, sizeof ds);
  /* No worker has reported yet: the fleet has said nothing, and the submission is accepted. */
  lt_client_resp_t r = submit_model(ca, "not-yet-known", ds);
  cr_assert_eq(r.status, 201, "before any heartbeat: %s", r.body);
  lt_client_resp_free(&r);
  char wid[96];
  snprintf(wid, sizeof wid, "worker-host-%d", (int)getpid());
  produce_json("workers", "WorkerHeartbeat", wid,
               json_pack("{s:s,s:I,s:s,s:s,s:I,s:s,s:i,s:i,s:I,s:I,s:[s,s],s:[],s:[],s:b}", "event_id", "hb-1",
                         "occurred_at", (json_int_t)lt_time_wall_ms(), "producer", "worker/test", "worker_id", wid,
                         "seq", (json_int_t)1, "backend", "cpu", "slots_total", 1, "slots_free", 1,
                         "memory_total_bytes", (json_int_t)1, "memory_free_bytes", (json_int_t)1, "base_models",
                         "lathe-tiny", "other-model", "owned_partitions", "leases", "draining", 0));
  int status = 0;
  lt_test_wait_until((status = submit_status(ca, "no-such-model", ds)) == 400, 20000, 200,
                     "the API never refused a model no worker serves (last %d)", status);
  r = submit_model(ca, "no-such-model", ds);
  json_t *e = json_object_get(r.json, "error");
  cr_expect_str_eq(json_string_value(json_object_get(e, "field")), "base_model", "%s", r.body);
  cr_expect(strstr(json_string_value(json_object_get(e, "message")), "lathe-tiny, other-model") != NULL, "%s", r.body);
  lt_client_resp_free(&r);
  r = submit_model(ca, "lathe-tiny", ds);
  cr_assert_eq(r.status, 201, "a served model: %s", r.body);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  /* Two submissions recorded (before the heartbeat, and the served model); the refused none. */
  cr_expect_eq(count_records("jobs", "JobSubmitted", NULL), 2);

  /* A failure reason names a server path and the worker: the customer sees neither. */
  char reason[300];
  snprintf(reason, sizeof reason, "cannot open /var/lib/lathe/models/lathe-tiny/config.json on %s: gone", wid);
  produce_json("control", "JobFailed", id,
               json_pack("{s:s,s:I,s:s,s:s,s:s,s:i,s:s,s:s,s:i}", "event_id", "failed-1", "occurred_at",
                         (json_int_t)lt_time_wall_ms(), "producer", "scheduler/test", "job_id", id, "tenant_id",
                         tenant_a, "attempt", 1, "code", "executor_error", "reason", reason, "attempts", 3));
  char path[256];
  snprintf(path, sizeof path, "/v1/jobs/%s", id);
  lt_test_wait_until((r = req(ca, "GET", path, NULL),
                      status = strcmp(json_string_value(json_object_get(r.json, "state")), "failed") == 0,
                      status || (lt_client_resp_free(&r), 0)),
                     20000, 200, "the API never showed the job failed");
  const char *shown = json_string_value(json_object_get(r.json, "reason"));
  cr_assert(shown, "%s", r.body);
  cr_expect(!strstr(shown, "/var/lib") && !strstr(shown, wid), "the reason shows server details: %s", shown);
  cr_expect(strstr(shown, "cannot open (path) on (worker): gone") != NULL, "%s", shown);
  lt_client_resp_free(&r);
}

/* ---------------------------------------------------------------- broker down (mock cluster) */

/* Invariant 5: an acknowledgement means the record is in Kafka. The real broker cannot be taken
 * down under the other suites, so this API talks to librdkafka's mock cluster, run in this
 * process and reached over loopback; the store is the real one. */
Test(api_down, a_broker_that_cannot_take_the_submission_gets_503_and_never_201, .timeout = 300) {
  if (!getenv("LATHE_S3_ENDPOINT")) cr_assert_fail("needs the local stack's S3 server: ops/stack up");
  char errs[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  cr_assert_eq(rd_kafka_conf_set(kc, "test.mock.num.brokers", "1", errs, sizeof errs), RD_KAFKA_CONF_OK, "%s", errs);
  rd_kafka_t *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, errs, sizeof errs);
  cr_assert_not_null(mrk, "%s", errs);
  rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(mrk);
  cr_assert_not_null(mc);
  setenv("LATHE_KAFKA_BOOTSTRAP", rd_kafka_mock_cluster_bootstraps(mc), 1);
  unsetenv("LATHE_KAFKA_CONFIG_DIR"); /* the mock cluster has no SASL */
  snprintf(prefix, sizeof prefix, "tdown%d.", (int)getpid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  /* librdkafka 2.0.2's mock cluster answers no CreateTopics: make ops/topics.tsv's topics with
   * its own call. */
  char path[1200], line[512];
  lt_test_source_path("ops/topics.tsv", path, sizeof path);
  FILE *tf = fopen(path, "r");
  cr_assert_not_null(tf, "%s", path);
  int made = 0;
  while (fgets(line, sizeof line, tf)) {
    char base[128];
    int parts;
    if (line[0] == '#' || sscanf(line, "%127s %d", base, &parts) != 2) continue;
    char topic[256];
    snprintf(topic, sizeof topic, "%s%s", prefix, base);
    cr_assert_eq(rd_kafka_mock_topic_create(mc, topic, parts, 1), RD_KAFKA_RESP_ERR_NO_ERROR, "%s", topic);
    made++;
  }
  fclose(tf);
  cr_assert_gt(made, 10);
  new_tenant("d", NULL, tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  api = start_api();
  ca = client_for(key_a);
  wait_key(ca);
  char ds[64];
  upload(ca, ds, sizeof ds);
  lt_client_resp_t r = submit(ca, ds, "k-up");
  cr_assert_eq(r.status, 201, "with the broker up: %d %s", r.status, r.body);
  lt_client_resp_free(&r);

  rd_kafka_mock_broker_set_down(mc, 1);
  int64_t t0 = lt_time_mono_ms();
  r = submit(ca, ds, "k-down");
  int64_t took = lt_time_mono_ms() - t0;
  cr_assert_eq(r.status, 503, "with the broker down the API answered %d: %s", r.status, r.body);
  cr_assert_lt(took, 60000, "the 503 must come at the produce deadline, not never");
  lt_client_resp_free(&r);

  /* Back up: the same key gives one job, whether the first record landed late or not. */
  rd_kafka_mock_broker_set_up(mc, 1);
  int status = 0;
  char job[64] = "";
  for (int64_t t1 = lt_time_mono_ms(); lt_time_mono_ms() - t1 < 90000 && status != 200 && status != 201; lt_test_msleep(500)) {
    r = submit(ca, ds, "k-down");
    status = r.status;
    if (status == 200 || status == 201) snprintf(job, sizeof job, "%s", json_string_value(json_object_get(r.json, "id")));
    lt_client_resp_free(&r);
  }
  cr_assert(status == 200 || status == 201, "after the broker came back the retry got %d", status);
  json_t *jobs = list_jobs(ca);
  cr_expect_eq(json_array_size(jobs), 2, "two keys, two jobs (the 503 made no third)");
  json_decref(jobs);
  cr_expect_geq(count_records("jobs", "JobSubmitted", job), 1, "the acknowledged job is in the topic");
  lt_client_destroy(ca);
  ca = NULL;
  stop_api(&api);
  rd_kafka_destroy(mrk);
}
