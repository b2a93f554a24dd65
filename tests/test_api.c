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
} srv_t;

static srv_t api;             /* the API of the current test */
static lt_client_t *ca, *cb;  /* tenants A and B */
static char tenant_a[64], tenant_b[64], key_a[128], key_b[128];

/* ---------------------------------------------------------------- lathed as a child */

/* `lathed --role api --port 0`, ready: the projection has caught up (healthz 200). */
static srv_t start_api(void) {
  static int n;
  srv_t s = {0};
  char log[256];
  snprintf(log, sizeof log, "/tmp/test_api.%d.%d.log", (int)getpid(), n++);
  s.proc = lt_test_lathed("api", log, "api", NULL, NULL);
  snprintf(s.url, sizeof s.url, "http://127.0.0.1:%u", lt_test_proc_port(s.proc, 30000));
  lt_client_t *c = lt_test_client(s.url, NULL, 0);
  lt_test_wait_until(lt_test_get_status(c, "/healthz", NULL, 0) == 200, 30000, 100,
                     "lathed's /healthz never answered 200; see %s", log);
  lt_client_destroy(c);
  return s;
}

/* Stops it; its log goes when it stopped cleanly. */
static void stop_api(srv_t *s) {
  if (!s->proc || s->proc->pid <= 0) return;
  if (lt_test_proc_stop(s->proc, 10000) != -1) unlink(s->proc->log);
}

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

/* Records of one type (and job id, when not NULL) in a topic of this prefix, read from the
 * beginning to the end. */
static int count_records(const char *base, const char *type, const char *job_id) {
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){base, NULL});
  lt_test_tail_settle(t, 1500);
  json_t *found = lt_test_tail_select(t, NULL, type, job_id, 0);
  int n = (int)json_array_size(found);
  json_decref(found);
  lt_test_tail_close(t);
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
  expect_error(ca, "POST", "/v1/jobs", "{\"base_model\":", 400, "invalid");
  expect_error(ca, "POST", "/v1/jobs", "[1,2]", 400, "invalid");
  expect_error(ca, "POST", "/v1/jobs", "{\"base_model\":\"m\",\"dataset_id\":\"ds-none\"}", 404, "not_found");
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
  lt_store_s3_conf_t s3;
  lt_store_t *st;
  cr_assert_eq(lt_store_s3_conf_from_env(&s3, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_s3_new(&st, &s3, err, sizeof err), LT_OK, "%s", err);
  char prefix_key[128], next[2048] = "";
  snprintf(prefix_key, sizeof prefix_key, "tenants/%s/", tenant_a);
  int count = 0;
  lt_err_t e = lt_store_list(st, prefix_key, "", 0, count_object, &count, next, sizeof next, err, sizeof err);
  cr_assert_eq(e, LT_OK, "%s", err);
  cr_expect_eq(count, 0, "objects of a refused upload stayed in the bucket");
  lt_store_destroy(st);
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
  lt_client_t *c = lt_test_client(api.url, NULL, 0);
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
  json_decref(before);
  json_decref(after);
  free(d1);
  free(d2);
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
