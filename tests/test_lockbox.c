/* The staff-access lockbox from the outside (docs/DESIGN.md §4 invariant 8): `lathed --role api`
 * as a child against the real broker and S3 server, staff keys in a file, tenants made with
 * `lathe admin tenant create`. Staff read a tenant's data only under a request the tenant
 * approved, within its scope and time, and each read is in lathe.audit before a byte comes back.
 * Every bypass is probed: a staff key on customer routes, a pending, denied, revoked or expired
 * grant, the wrong scope, another staff member's grant, another tenant's request, self-approval,
 * forged records (no MAC, another master key's MAC) and a replayed approval; and, on librdkafka's
 * mock cluster, an audit write that fails (503, no data). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lt_access.h"
#include "lt_bus_int.h" /* rdkafka.h before rdkafka_mock.h */
#include "lt_crypto.h"
#include "lt_recmac.h"
#include "lt_test.h"
#include "lt_time.h"
#include <librdkafka/rdkafka_mock.h>

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define OTHER_KEY "ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static char prefix[64], err[1024], staff_file[64] = "";
static char tenant_a[64], tenant_b[64], key_a[128], key_b[128];
static char key_alice[LT_ACCESS_STAFF_KEY_SIZE], key_bob[LT_ACCESS_STAFF_KEY_SIZE];
static char url[64];
static lt_test_proc_t *api;
static lt_client_t *ca, *cb, *alice, *bob;

static const char *canary_jsonl = "{\"prompt\":\"canary-7f3a\",\"completion\":\"private\"}\n";

static void start_api(bool second_staff) {
  static int n;
  char log[256], keys_env[128];
  snprintf(log, sizeof log, "/tmp/test_lockbox.%d.%d.log", (int)getpid(), n++);
  snprintf(keys_env, sizeof keys_env, "LATHE_STAFF_KEYS_FILE=%s", staff_file);
  const char *env[] = {keys_env, second_staff ? "LATHE_ACCESS_SECOND_STAFF=1" : "LATHE_ACCESS_SECOND_STAFF=0", NULL};
  api = lt_test_lathed("api", log, "api", NULL, env);
  snprintf(url, sizeof url, "http://127.0.0.1:%u", lt_test_proc_port(api, 30000));
  char ops[64];
  snprintf(ops, sizeof ops, "http://127.0.0.1:%u", lt_test_proc_operator_port(api, 30000));
  lt_test_wait_healthy(ops, log, 30000);
  lt_client_destroy(ca), lt_client_destroy(cb), lt_client_destroy(alice), lt_client_destroy(bob);
  ca = lt_test_client(url, key_a, 60);
  cb = lt_test_client(url, key_b, 60);
  alice = lt_test_client(url, key_alice, 60);
  bob = lt_test_client(url, key_bob, 60);
  lt_test_wait_until(lt_test_get_status(ca, "/v1/jobs", NULL, 0) == 200 && lt_test_get_status(cb, "/v1/jobs", NULL, 0) == 200,
                     20000, 100, "the API never accepted the tenants' keys");
}

static void stop_api(void) {
  lt_test_proc_stop_clean(api, 10000);
  api = NULL;
}

static void enrol(const char *name, char *key, FILE *f) {
  char line[256];
  cr_assert_eq(lt_access_staff_key_new(name, key, line, sizeof line, err, sizeof err), LT_OK, "%s", err);
  fprintf(f, "%s\n", line);
}

static void setup_env(const char *tag) {
  snprintf(prefix, sizeof prefix, "%s%d.", tag, (int)getppid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  snprintf(staff_file, sizeof staff_file, "/tmp/lathe-staff-%d", (int)getpid());
  FILE *f = fopen(staff_file, "w");
  cr_assert_not_null(f);
  fprintf(f, "# test staff\n");
  enrol("alice", key_alice, f);
  enrol("bob", key_bob, f);
  fclose(f);
}

static void new_tenant(const char *tag, char *id, size_t idn, char *key, size_t keyn) {
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(id, idn, "%s-%.10s", tag, rnd);
  lt_test_tenant_create(id, NULL, key, keyn);
}

static void setup(void) {
  lt_test_require_stack();
  setup_env("tlock");
  lt_test_admin_topics();
  new_tenant("a", tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  new_tenant("b", tenant_b, sizeof tenant_b, key_b, sizeof key_b);
  start_api(false);
}

static void teardown(void) {
  lt_client_destroy(ca), lt_client_destroy(cb), lt_client_destroy(alice), lt_client_destroy(bob);
  ca = cb = alice = bob = NULL;
  stop_api();
  unlink(staff_file);
}

TestSuite(lockbox, .init = setup, .fini = teardown, .timeout = 240);

/* ---------------------------------------------------------------- helpers */

static lt_client_resp_t req(lt_client_t *c, const char *method, const char *path, const char *body) {
  return lt_test_req(c, method, path, body, body ? strlen(body) : 0);
}

static int status_of(lt_client_t *c, const char *method, const char *path, const char *body, char *out, size_t n) {
  lt_client_resp_t r = req(c, method, path, body);
  int s = r.status;
  if (out) snprintf(out, n, "%s", r.body ? r.body : "");
  lt_client_resp_free(&r);
  return s;
}

static void upload(lt_client_t *c, const char *text, char *id, size_t n) {
  lt_client_resp_t r = req(c, "POST", "/v1/datasets?name=private", text);
  cr_assert_eq(r.status, 201, "upload: %d %s", r.status, r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

/* alice (or who) asks for scope on tenant for ttl_s: the request id into id. */
static void ask(lt_client_t *who, const char *tenant, const char *scope, int ttl_s, char *id, size_t n) {
  char body[512];
  snprintf(body, sizeof body, "{\"tenant_id\":\"%s\",\"scope\":[\"%s\"],\"justification\":\"ticket 7\",\"duration_s\":%d}",
           tenant, scope, ttl_s);
  lt_client_resp_t r = req(who, "POST", "/v1/staff/access", body);
  cr_assert_eq(r.status, 201, "request: %d %s", r.status, r.body);
  cr_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "pending", "%s", r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

static int decide(lt_client_t *c, const char *base, const char *id, const char *verb) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s/%s", base, id, verb);
  return status_of(c, "POST", path, "{\"reason\":\"test\"}", NULL, 0);
}

static int read_dataset(lt_client_t *who, const char *id, const char *ds, char *body, size_t n) {
  char path[256];
  snprintf(path, sizeof path, "/v1/staff/access/%s/datasets/%s", id, ds);
  return status_of(who, "GET", path, NULL, body, n);
}

/* Waits until the API at looker shows access request id in state ("active", "revoked", ...):
 * GET /v1/staff/access/{id}, one request, not the staff member's list (which pages, and which the
 * suite's earlier tests make long). */
static void grant_listed(lt_client_t *looker, const char *id, const char *state, const char *log) {
  char path[128], want[64], body[8192] = "";
  snprintf(path, sizeof path, "/v1/staff/access/%s", id);
  snprintf(want, sizeof want, "\"state\":\"%s\"", state);
  lt_test_wait_until(status_of(looker, "GET", path, NULL, body, sizeof body) == 200 && strstr(body, want), 30000, 100,
                     "the api never showed access request %s %s: %s; see %s", id, state, body, log ? log : "");
}

/* Tenant A's dataset, into ds (64 bytes), and alice's grant to read it, approved, into id (64);
 * scope (128) gets the grant's scope. */
static void granted(char *ds, char *id, char *scope) {
  upload(ca, canary_jsonl, ds, 64);
  snprintf(scope, 128, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, 64);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
}

/* Records of type for request id in this prefix's lathe.audit. */
static int audit_count(const char *type, const char *request_id) {
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"audit", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *all = lt_test_tail_select(t, NULL, type, NULL, 0);
  int n = 0;
  size_t i;
  json_t *r;
  json_array_foreach(all, i, r) n += strcmp(lt_test_rs(r, "request_id") ? lt_test_rs(r, "request_id") : "", request_id) == 0;
  json_decref(all);
  lt_test_tail_close(t);
  return n;
}

/* ---------------------------------------------------------------- the path that works */

Test(lockbox, approved_read_returns_the_data_and_is_audited_first) {
  char ds[64], id[64], body[4096];
  upload(ca, canary_jsonl, ds, sizeof ds);
  char scope[128];
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 403, "pending: %s", body);
  cr_assert(strstr(body, "tenant's approval"), "%s", body);
  /* The tenant sees the request, with who asked and why. */
  lt_client_resp_t r = req(ca, "GET", "/v1/access", NULL);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_assert_eq(json_array_size(json_object_get(r.json, "data")), 1, "%s", r.body);
  json_t *q = json_array_get(json_object_get(r.json, "data"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(q, "staff")), "alice");
  cr_expect_str_eq(json_string_value(json_object_get(q, "justification")), "ticket 7");
  lt_client_resp_free(&r);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "approved: %s", body);
  cr_assert_str_eq(body, canary_jsonl);
  cr_assert_eq(audit_count("AccessUsed", id), 1, "each read is one AccessUsed in lathe.audit");
  cr_assert_eq(audit_count("AccessRequested", id), 1);
  cr_assert_eq(audit_count("AccessApproved", id), 1);
  r = req(ca, "GET", "/v1/access", NULL);
  q = json_array_get(json_object_get(r.json, "data"), 0);
  cr_expect_eq(json_integer_value(json_object_get(q, "uses_total")), 1, "%s", r.body);
  cr_expect_str_eq(json_string_value(json_object_get(q, "state")), "active", "%s", r.body);
  lt_client_resp_free(&r);
  /* A restarted API folds the same state from lathe.audit. */
  stop_api();
  start_api(false);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "after a restart: %s", body);
  cr_assert_eq(audit_count("AccessUsed", id), 2);
}

/* A dataset of many encryption chunks comes back whole and exact under a grant: it is streamed
 * (the API holds a window of it, not the dataset), with the plaintext's Content-Length. */
Test(lockbox, a_large_dataset_is_streamed_whole_under_a_grant) {
  size_t n = 0, cap = 3u << 20;
  char *big = malloc(cap + 128), ds[64], id[64], scope[128], path[256];
  for (int i = 0; n + 128 < cap; i++)
    n += (size_t)snprintf(big + n, 128, "{\"prompt\":\"row %06d canary-7f3a\",\"completion\":\"private %d\"}\n", i, i * 7);
  upload(ca, big, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  snprintf(path, sizeof path, "/v1/staff/access/%s/datasets/%s", id, ds);
  lt_client_resp_t r = req(alice, "GET", path, NULL);
  cr_assert_eq(r.status, 200, "%d %s", r.status, r.body ? r.body : "");
  cr_expect_eq(r.len, n, "%zu bytes back of %zu", r.len, n);
  cr_expect(r.len == n && memcmp(r.body, big, n) == 0, "the bytes differ from the upload");
  lt_client_resp_free(&r);
  cr_assert_eq(audit_count("AccessUsed", id), 1);
  free(big);
}

/* An api (lathed --role api, as `name`) whose object store is a socket that takes connections and
 * says nothing (lt_test_mute_store): *hole is that socket, api_url the api's, log its log. */
static lt_test_proc_t *mute_api(const char *name, char *log, size_t logn, int *hole, char *api_url, size_t urln) {
  char keys_env[128], s3_env[64];
  *hole = lt_test_mute_store(s3_env, sizeof s3_env);
  snprintf(log, logn, "/tmp/test_lockbox.%d.%s.log", (int)getpid(), name);
  snprintf(keys_env, sizeof keys_env, "LATHE_STAFF_KEYS_FILE=%s", staff_file);
  lt_test_proc_t *p = lt_test_lathed(name, log, "api", NULL,
                                     (const char *const[]){keys_env, "LATHE_ACCESS_SECOND_STAFF=0", s3_env, NULL});
  snprintf(api_url, urln, "http://127.0.0.1:%u", lt_test_proc_port(p, 30000));
  return p;
}

/* A staff read on its own thread: its answer's status once it came back. */
typedef struct {
  lt_client_t *c;
  const char *id, *ds;
  int status;
  volatile int done;
} read_bg_t;

static void *read_bg(void *arg) {
  read_bg_t *b = arg;
  char body[4096];
  b->status = read_dataset(b->c, b->id, b->ds, body, sizeof body);
  __atomic_store_n(&b->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* A store that takes the connection and never answers holds the staff reads that ask it whether
 * the dataset exists (and then for its bytes), not the loop every tenant's requests share: both run
 * on the work pool. (Before, the look-up and the whole read ran on the loop.) Two grants on one
 * dataset, each read waiting on the store; one grant is revoked meanwhile. When the store goes away,
 * the read under the grant still held answers 503 (retry), not 404; the one under the revoked grant
 * 403, saying nothing of the dataset; neither wrote AccessUsed. */
Test(lockbox, a_store_that_never_answers_holds_the_staff_read_not_every_other_request) {
  char ds[64], held[64], revoked[64], scope[128], body[4096];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, held, sizeof held);
  ask(alice, tenant_a, scope, 600, revoked, sizeof revoked);
  cr_assert_eq(decide(ca, "/v1/access", held, "approve"), 200);
  cr_assert_eq(decide(ca, "/v1/access", revoked, "approve"), 200);
  char log[256], mute_url[64];
  int hole;
  lt_test_proc_t *mute = mute_api("api-mute", log, sizeof log, &hole, mute_url, sizeof mute_url);
  /* a client each (a client is one thread's at a time, and one connection carries one request) */
  lt_client_t *staff = lt_test_client(mute_url, key_alice, 120), *staff2 = lt_test_client(mute_url, key_alice, 120),
              *looker = lt_test_client(mute_url, key_alice, 10), *other = lt_test_client(mute_url, key_b, 10);
  lt_test_wait_until(lt_test_get_status(other, "/v1/jobs", NULL, 0) == 200 &&
                         status_of(looker, "GET", "/v1/staff/access", NULL, NULL, 0) == 200,
                     30000, 100, "the mute api never knew the keys; see %s", log);
  for (int fd; (fd = accept(hole, NULL, NULL)) >= 0;) close(fd); /* whatever came before the reads */
  read_bg_t b[2] = {{.c = staff, .id = held, .ds = ds}, {.c = staff2, .id = revoked, .ds = ds}};
  pthread_t th[2];
  int taken = -1; /* the first read's look-up, connected and waiting for an answer that never comes (the
                   * second's waits behind it in the tenant's queue of the work pool, or beside it) */
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, read_bg, &b[i]), 0);
  lt_test_wait_until((taken = accept(hole, NULL, NULL)) >= 0, 30000, 20, "the api never asked the store");
  usleep(500 * 1000); /* the second read reaches the api too */
  /* meanwhile another tenant's request is answered, and the staff reads still wait */
  int st = status_of(other, "GET", "/v1/jobs", NULL, body, sizeof body);
  int waiting = !__atomic_load_n(&b[0].done, __ATOMIC_SEQ_CST) && !__atomic_load_n(&b[1].done, __ATOMIC_SEQ_CST);
  cr_expect_eq(st, 200, "another tenant's request while the store is mute: %d %s", st, body);
  cr_expect(waiting, "a staff read was answered before the store said anything (%d, %d)", b[0].status, b[1].status);
  /* the tenant revokes one grant; the mute api folds it from lathe.audit */
  cr_assert_eq(decide(ca, "/v1/access", revoked, "revoke"), 200);
  grant_listed(looker, revoked, "revoked", NULL); /* the mute api folded the revoke */
  /* the store goes away */
  close(taken);
  for (int fd; (fd = accept(hole, NULL, NULL)) >= 0;) close(fd); /* the second look-up, if it came */
  close(hole);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  cr_expect_eq(b[0].status, 503, "the read under the grant still held, once the store was gone: %d", b[0].status);
  cr_expect_eq(b[1].status, 403, "the read under the grant revoked while it waited: %d", b[1].status);
  cr_expect_eq(audit_count("AccessUsed", held) + audit_count("AccessUsed", revoked), 0,
               "no AccessUsed for a read that could not look the dataset up");
  lt_client_destroy(staff);
  lt_client_destroy(staff2);
  lt_client_destroy(looker);
  lt_client_destroy(other);
  lt_test_proc_stop_clean(mute, 10000);
}

/* Reads one HTTP request's head from fd (the store's side of a connection), at most 5 s. */
static bool read_head(int fd, char *buf, size_t n) {
  size_t len = 0;
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  while (len + 1 < n) {
    ssize_t k = read(fd, buf + len, n - 1 - len);
    if (k <= 0) return false;
    len += (size_t)k;
    buf[len] = '\0';
    if (strstr(buf, "\r\n\r\n")) return true;
  }
  return false;
}

/* read_bg, where a connection cut off is status 0 rather than a failed assertion. */
static void *read_or_cut_bg(void *arg) {
  read_bg_t *b = arg;
  char path[256], why[256];
  snprintf(path, sizeof path, "/v1/staff/access/%s/datasets/%s", b->id, b->ds);
  lt_client_resp_t r;
  if (lt_client_request(b->c, "GET", path, NULL, 0, NULL, 0, NULL, &r, why, sizeof why) == LT_OK) {
    b->status = r.status;
    lt_client_resp_free(&r);
  }
  __atomic_store_n(&b->done, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* An API stopped (SIGTERM) while a staff read waits on the store: the store then answers the
 * look-up, so the read's next step (AccessUsed into lathe.audit) starts while the API shuts down,
 * and its answer comes back after the pool has stopped. The read is answered (not cut off) and
 * the process exits 0: before, the reply went out on a request evhttp_free had already freed
 * (AddressSanitizer: heap-use-after-free, exit 1). */
Test(lockbox, an_api_stopped_mid_read_answers_it_before_its_connections_go) {
  char ds[64], id[64], scope[128];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  char log[256], mute_url[64], head[8192];
  int hole;
  lt_test_proc_t *stopping = mute_api("api-stop", log, sizeof log, &hole, mute_url, sizeof mute_url);
  lt_client_t *staff = lt_test_client(mute_url, key_alice, 60), *looker = lt_test_client(mute_url, key_alice, 10);
  grant_listed(looker, id, "active", log);
  for (int fd; (fd = accept(hole, NULL, NULL)) >= 0;) close(fd); /* whatever came before the read */
  read_bg_t b = {.c = staff, .id = id, .ds = ds};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, read_or_cut_bg, &b), 0);
  int look = -1;
  lt_test_wait_until((look = accept(hole, NULL, NULL)) >= 0 || __atomic_load_n(&b.done, __ATOMIC_SEQ_CST), 30000, 20,
                     "the api never asked the store");
  cr_assert(look >= 0, "the read was answered %d before the api asked the store", b.status);
  cr_assert(read_head(look, head, sizeof head), "no request from the api");
  cr_assert(strncmp(head, "HEAD ", 5) == 0, "the look-up is a HEAD: %.80s", head);
  lt_test_proc_kill(stopping, SIGTERM); /* lathed stops its loop, then waits for the pool's look-up */
  lt_test_wait_until(strstr(lt_test_log_tail(log), "SIGTERM, stopping"), 30000, 50, "no SIGTERM in %s", log);
  lt_test_msleep(500); /* past the loop's last turn: the look-up's answer now comes to lt_api_work_stop */
  const char *ok = "HTTP/1.1 200 OK\r\nContent-Length: 64\r\nETag: \"0\"\r\nConnection: close\r\n\r\n";
  cr_assert(write(look, ok, strlen(ok)) == (ssize_t)strlen(ok));
  close(look);
  /* the read itself, if it comes, finds the store gone */
  int st = 0;
  bool exited = false;
  for (int64_t t0 = lt_time_mono_ms(); !exited && lt_time_mono_ms() - t0 < 60000; lt_test_msleep(20)) {
    for (int fd; (fd = accept(hole, NULL, NULL)) >= 0;) close(fd);
    exited = lt_test_proc_exited(stopping, &st);
  }
  close(hole);
  pthread_join(th, NULL);
  cr_expect(exited, "the api did not exit within 60 s of SIGTERM; see %s", log);
  cr_expect(exited && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the api's exit: status %d; its log ends:\n%s", st,
            lt_test_log_tail(log));
  cr_expect(b.status == 503, "the read in flight at the stop got %d (0: no answer, cut off)", b.status);
  cr_expect_eq(audit_count("AccessUsed", id), 1, "the read's AccessUsed, written while the api stopped");
  lt_client_destroy(staff);
  lt_client_destroy(looker);
  if (exited && st == 0) unlink(log);
}

/* Tenant A's dataset of 6 MiB into ds (64 bytes); its size. */
static size_t big_dataset(char *ds) {
  size_t n = 0, cap = 6u << 20;
  char *big = malloc(cap + 128);
  for (int i = 0; n + 128 < cap; i++)
    n += (size_t)snprintf(big + n, 128, "{\"prompt\":\"row %06d canary-7f3a\",\"completion\":\"private %d\"}\n", i, i * 7);
  upload(ca, big, ds, 64);
  free(big);
  return n;
}

/* An API of its own (lathed --role api as name, with env besides the staff keys and a 64 KiB
 * download window, so most of a big read waits on its side): its URL into api_url (64), log into log
 * (256). */
static lt_test_proc_t *own_api(const char *name, const char *env, char *api_url, char *log) {
  char keys_env[128];
  snprintf(log, 256, "/tmp/test_lockbox.%d.%s.log", (int)getpid(), name);
  snprintf(keys_env, sizeof keys_env, "LATHE_STAFF_KEYS_FILE=%s", staff_file);
  lt_test_proc_t *p = lt_test_lathed(name, log, "api", NULL,
                                     (const char *const[]){keys_env, "LATHE_API_DOWNLOAD_WINDOW=65536", env, NULL});
  snprintf(api_url, 64, "http://127.0.0.1:%u", lt_test_proc_port(p, 30000));
  return p;
}

/* A staff read of ds under grant id as key, on a socket with a small receive buffer that the
 * caller reads when it likes: the socket, once the 200 head came; *length its Content-Length,
 * *got the body bytes that came with the head. */
static int read_held(const char *api_url, const char *key, const char *id, const char *ds, size_t *length, size_t *got) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), rcv = 8192;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(strrchr(api_url, ':') + 1)),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv) == 0 &&
            connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  char get[512], head[8192];
  int gl = snprintf(get, sizeof get,
                    "GET /v1/staff/access/%s/datasets/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", id, ds,
                    api_url + 7, key);
  cr_assert(write(fd, get, (size_t)gl) == gl);
  cr_assert(read_head(fd, head, sizeof head), "no answer's head");
  cr_assert(strncmp(head, "HTTP/1.1 200", 12) == 0, "%.200s", head);
  const char *cl = strcasestr(head, "Content-Length:");
  cr_assert(cl, "%s", head);
  *length = strtoull(cl + 15, NULL, 10);
  *got = strlen(strstr(head, "\r\n\r\n") + 4);
  return fd;
}

/* A staff read streaming when its grant ends — the tenant revokes it (how 'r') or it runs out
 * (ttl_s) — or when the tenant deletes the dataset on the API serving the read (how 'd'), is cut
 * there: the rest of the dataset does not go out, and the client gets fewer bytes than its
 * Content-Length. The client reads nothing until the API lists the grant as ended, or the DELETE
 * answered. Before, a read begun under a grant ran to its end whatever came after it. */
static void read_cut_when_grant_ends(char how, int ttl_s) {
  bool revoke = how == 'r';
  char ds[64], id[64], scope[128], body[4096] = "";
  size_t n = big_dataset(ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, ttl_s, id, sizeof id);
  char log[256], cut_url[64];
  lt_test_proc_t *cutter = own_api("api-cut", NULL, cut_url, log);
  lt_client_t *looker = lt_test_client(cut_url, key_alice, 10);
  grant_listed(looker, id, "pending", log); /* the API is up and has read the log: ttl_s runs from here */
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  grant_listed(looker, id, "active", log);
  size_t length, got;
  int fd = read_held(cut_url, key_alice, id, ds, &length, &got);
  cr_assert_eq(length, n, "Content-Length %zu for %zu bytes", length, n);
  if (revoke) cr_assert_eq(decide(ca, "/v1/access", id, "revoke"), 200);
  if (how == 'd') {
    lt_client_t *owner = lt_test_client(cut_url, key_a, 10);
    snprintf(body, sizeof body, "/v1/datasets/%s", ds);
    lt_client_resp_t r = lt_test_req(owner, "DELETE", body, NULL, 0);
    cr_assert_eq(r.status, 200, "the owner's DELETE: %d %s", r.status, r.body);
    lt_client_resp_free(&r);
    lt_client_destroy(owner);
  } else {
    grant_listed(looker, id, revoke ? "revoked" : "expired", log);
  }
  /* now all of it that will ever come */
  struct timeval tv = {30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  static char buf[1 << 16];
  for (ssize_t k; (k = read(fd, buf, sizeof buf)) > 0;) got += (size_t)k;
  close(fd);
  cr_expect_lt(got, length, "the read ran on past the point it was to be cut: %zu of %zu bytes", got, length);
  cr_expect(strstr(lt_test_log_tail(log), "cut: "), "the api says why it cut the read; see %s", log);
  char metrics[65536];
  snprintf(body, sizeof body, "http://127.0.0.1:%u", lt_test_proc_operator_port(cutter, 30000));
  lt_client_t *ops = lt_test_client(body, NULL, 10);
  cr_assert_eq(lt_test_get_status(ops, "/metrics", metrics, sizeof metrics), 200);
  cr_expect(strstr(metrics, how == 'd' ? "lathe_api_downloads_cut_deleted_total 1" : "lathe_api_staff_reads_cut_total 1"),
            "no cut counted in /metrics");
  lt_client_destroy(ops);
  lt_client_destroy(looker);
  lt_test_proc_stop_clean(cutter, 10000);
  unlink(log);
}

Test(lockbox, a_revoke_cuts_a_staff_read_in_flight) { read_cut_when_grant_ends('r', 600); }

/* The same when the tenant deletes the dataset on the API that streams it: the read holds the
 * dataset's key, unwrapped before the DELETE shredded it. (Another API learns of no dataset
 * delete: no record of one is written.) */
Test(lockbox, deleting_the_dataset_cuts_a_staff_read_of_it_in_flight) { read_cut_when_grant_ends('d', 600); }

/* The same when the grant runs out while its read streams (6 s: time to fold it and start). */
Test(lockbox, a_grant_running_out_cuts_its_read_in_flight) { read_cut_when_grant_ends('e', 6); }

/* Staff reads count against the staff member's download slots, not the tenant's: with one slot
 * each (max_downloads 4), alice's second read while her first streams is 429 counting her reads
 * only, and bob's read of the same tenant goes through. Before, both counted against tenant A's
 * slot: bob got 429, which told him tenant A had a download open, and its message said how many. */
Test(lockbox, staff_reads_take_the_staff_members_slots_not_the_tenants) {
  char ds[64], id_a[64], id_b[64], scope[128], body[4096] = "", log[256], own_url[64];
  big_dataset(ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id_a, sizeof id_a);
  ask(bob, tenant_a, scope, 600, id_b, sizeof id_b);
  cr_assert_eq(decide(ca, "/v1/access", id_a, "approve"), 200);
  cr_assert_eq(decide(ca, "/v1/access", id_b, "approve"), 200);
  lt_test_proc_t *own = own_api("api-slots", "LATHE_API_MAX_DOWNLOADS=4", own_url, log);
  lt_client_t *a = lt_test_client(own_url, key_alice, 60), *b = lt_test_client(own_url, key_bob, 60);
  grant_listed(a, id_a, "active", log);
  grant_listed(b, id_b, "active", log);
  size_t length, got;
  int fd = read_held(own_url, key_alice, id_a, ds, &length, &got);
  cr_expect_eq(read_dataset(a, id_a, ds, body, sizeof body), 429, "alice's second read: %s", body);
  cr_expect(strstr(body, "1 of yours") && !strstr(body, tenant_a) && !strstr(body, "in progress"),
            "the 429 counts alice's reads only: %s", body);
  char path[256];
  snprintf(path, sizeof path, "/v1/staff/access/%s/datasets/%s", id_b, ds);
  lt_client_resp_t r = req(b, "GET", path, NULL);
  cr_expect_eq(r.status, 200, "bob's read of the same tenant: %d %.300s", r.status, r.status == 200 ? "" : r.body);
  cr_expect_eq(r.len, length, "bob read %zu bytes of %zu", r.len, length);
  lt_client_resp_free(&r);
  close(fd);
  lt_client_destroy(a);
  lt_client_destroy(b);
  lt_test_proc_stop_clean(own, 10000);
  unlink(log);
}

/* A member key (`lathe admin tenant add-key --role member`, TenantUpserted v3) may do what the
 * tenant may but approve staff access: its approval is 403 and opens nothing; it may deny and
 * revoke (any key closes the door); an admin key approves. */
Test(lockbox, a_member_key_cannot_approve_staff_access_but_can_deny_and_revoke) {
  char cmd[512], member_key[128], ds[64], opened[64], refused[64], scope[128], body[4096];
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant add-key %s --role member --json", lt_test_lathe_bin(), tenant_a);
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  json_t *j = json_loads(out, 0, NULL);
  snprintf(member_key, sizeof member_key, "%s", json_string_value(json_object_get(j, "api_key")));
  int members = 0;
  size_t i;
  json_t *k;
  json_array_foreach(json_object_get(j, "keys"), i, k) {
    const char *role = json_string_value(json_object_get(k, "role")); /* null: a revoked key */
    members += role && !strcmp(role, "member");
  }
  cr_expect_eq(members, 1, "one member key listed: %s", out);
  json_decref(j);
  free(out);
  lt_client_t *cm = lt_test_client(url, member_key, 30);
  lt_test_wait_until(status_of(cm, "GET", "/v1/access", NULL, NULL, 0) == 200, 20000, 100, "the API never knew the member key");
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, opened, sizeof opened);
  cr_assert_eq(decide(cm, "/v1/access", opened, "approve"), 403, "a member key approved staff access");
  char path[256];
  snprintf(path, sizeof path, "/v1/access/%s/approve", opened);
  status_of(cm, "POST", path, "{\"reason\":\"test\"}", body, sizeof body);
  cr_expect(strstr(body, "member key") && strstr(body, "admin key"), "%s", body);
  cr_expect_eq(read_dataset(alice, opened, ds, body, sizeof body), 403, "the member's approval opened it: %s", body);
  cr_assert_eq(decide(ca, "/v1/access", opened, "approve"), 200, "the admin key approves");
  cr_assert_eq(read_dataset(alice, opened, ds, body, sizeof body), 200, "%s", body);
  /* any key closes the door */
  ask(alice, tenant_a, scope, 600, refused, sizeof refused);
  cr_expect_eq(decide(cm, "/v1/access", refused, "deny"), 200, "a member key denies");
  cr_expect_eq(decide(cm, "/v1/access", opened, "revoke"), 200, "a member key revokes");
  cr_expect_eq(read_dataset(alice, opened, ds, body, sizeof body), 403, "revoked by the member key: %s", body);
  cr_expect_eq(audit_count("AccessApproved", opened), 1, "only the admin key's approval is in the audit log");
  lt_client_destroy(cm);
}

/* ---------------------------------------------------------------- bypasses */

Test(lockbox, a_staff_key_is_no_key_on_customer_routes_and_a_tenant_key_none_on_staff_routes) {
  char ds[64], path[128];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(path, sizeof path, "/v1/datasets/%s", ds);
  cr_expect_eq(status_of(alice, "GET", "/v1/jobs", NULL, NULL, 0), 404);
  cr_expect_eq(status_of(alice, "GET", path, NULL, NULL, 0), 404);
  cr_expect_eq(status_of(alice, "GET", "/v1/access", NULL, NULL, 0), 404);
  cr_expect_eq(status_of(ca, "GET", "/v1/staff/access", NULL, NULL, 0), 401);
  cr_expect_eq(status_of(ca, "POST", "/v1/staff/access", "{}", NULL, 0), 401);
  lt_client_t *forged = lt_test_client(url, "ls_0123456789abcdef_0123456789abcdef0123456789abcdef01234567", 30);
  cr_expect_eq(status_of(forged, "GET", "/v1/staff/access", NULL, NULL, 0), 401, "an unenrolled staff-shaped key");
  lt_client_destroy(forged);
}

Test(lockbox, scope_time_deny_and_revoke_each_close_the_door) {
  char ds1[64], ds2[64], id[64], body[4096], scope[128];
  upload(ca, canary_jsonl, ds1, sizeof ds1);
  upload(ca, canary_jsonl, ds2, sizeof ds2);
  snprintf(scope, sizeof scope, "dataset:%s", ds1);
  /* Wrong scope. */
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  cr_expect_eq(read_dataset(alice, id, ds2, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "outside the scope"), "%s", body);
  /* An artifact under a dataset grant: refused before anything says whether the job exists. */
  char path[256];
  snprintf(path, sizeof path, "/v1/staff/access/%s/jobs/j-none/artifacts/adapter.safetensors", id);
  cr_expect_eq(status_of(alice, "GET", path, NULL, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "outside the scope"), "%s", body);
  /* Revoked by the tenant. */
  cr_assert_eq(read_dataset(alice, id, ds1, body, sizeof body), 200, "%s", body);
  cr_assert_eq(decide(ca, "/v1/access", id, "revoke"), 200);
  cr_expect_eq(read_dataset(alice, id, ds1, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "revoked"), "%s", body);
  cr_expect_eq(decide(ca, "/v1/access", id, "approve"), 409, "a revoked request cannot be approved again");
  /* Denied. */
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "deny"), 200);
  cr_expect_eq(read_dataset(alice, id, ds1, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "denied"), "%s", body);
  /* Expired: a two-second grant, read after it ran out. */
  ask(alice, tenant_a, scope, 2, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  lt_test_msleep(2500);
  cr_expect_eq(read_dataset(alice, id, ds1, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "expired"), "%s", body);
  cr_expect_eq(audit_count("AccessUsed", id), 0, "a refused read is no use");
  /* Under a job grant, an artifact the job does not have: 404, and no use recorded. */
  ask(alice, tenant_a, "job:j-none", 600, id, sizeof id);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  snprintf(path, sizeof path, "/v1/staff/access/%s/jobs/j-none/artifacts/adapter.safetensors", id);
  cr_expect_eq(status_of(alice, "GET", path, NULL, body, sizeof body), 404, "%s", body);
  cr_expect_eq(audit_count("AccessUsed", id), 0);
}

Test(lockbox, other_staff_other_tenants_and_self_approval_get_nothing) {
  char ds[64], id[64], body[4096], scope[128], path[256];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  /* Tenant B cannot see, approve or deny A's request. */
  snprintf(path, sizeof path, "/v1/access/%s", id);
  cr_expect_eq(status_of(cb, "GET", path, NULL, NULL, 0), 404);
  cr_expect_eq(decide(cb, "/v1/access", id, "approve"), 404);
  cr_expect_eq(decide(cb, "/v1/access", id, "deny"), 404);
  /* Alice cannot approve her own request as the second person. */
  cr_expect_eq(decide(alice, "/v1/staff/access", id, "approve"), 403);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  /* Bob cannot read under Alice's grant. */
  cr_expect_eq(read_dataset(bob, id, ds, body, sizeof body), 404, "%s", body);
  /* Staff asking for a tenant that does not exist, or with a scope that is not one. */
  cr_expect_eq(status_of(alice, "POST", "/v1/staff/access",
                         "{\"tenant_id\":\"nobody\",\"scope\":[\"dataset:x\"],\"justification\":\"t\",\"duration_s\":60}",
                         NULL, 0), 404);
  snprintf(path, sizeof path, "{\"tenant_id\":\"%s\",\"scope\":[\"everything\"],\"justification\":\"t\",\"duration_s\":60}",
           tenant_a);
  cr_expect_eq(status_of(alice, "POST", "/v1/staff/access", path, body, sizeof body), 400, "%s", body);
  cr_expect(strstr(body, "\"scope\""), "the error names the field: %s", body);
  snprintf(path, sizeof path, "{\"tenant_id\":\"%s\",\"scope\":[\"dataset:x\"],\"justification\":\"t\",\"duration_s\":9999999}",
           tenant_a);
  cr_expect_eq(status_of(alice, "POST", "/v1/staff/access", path, body, sizeof body), 400, "%s", body);
}

/* ---------------------------------------------------------------- forged and replayed records */

/* The newest record of type for request id in lathe.audit: its value, key and MAC header. */
typedef struct {
  void *value, *mac;
  size_t len, mac_len;
} raw_t;

static raw_t find_raw(const char *type, const char *request_id) {
  raw_t out = {0};
  lt_bus_conf_t *conf = lt_test_bus_env(); /* the admin principal */
  lt_avro_registry_t *reg;
  lt_avro_decoder_t *dec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_decoder_new(reg, &dec, err, sizeof err), LT_OK);
  lt_bus_consumer_t *c;
  lt_bus_consumer_opts_t o = {0};
  cr_assert_eq(lt_bus_consumer_new(conf, &o, &c, err, sizeof err), LT_OK, "%s", err);
  char topic[128];
  lt_bus_topic_name(conf, "audit", topic, sizeof topic);
  lt_bus_tp_t tp[3];
  for (int p = 0; p < 3; p++) tp[p] = (lt_bus_tp_t){.topic = topic, .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  cr_assert_eq(lt_bus_consumer_assign(c, tp, 3, err, sizeof err), LT_OK, "%s", err);
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < 5000;) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(c, 200, &m, err, sizeof err) || !m) continue;
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    lt_avro_record_t *rec;
    const char *rid;
    if (!v || lt_avro_decode(dec, v, len, &rec, err, sizeof err) || strcmp(lt_avro_record_type(rec), type) != 0 ||
        lt_avro_get_string(rec, "request_id", &rid, NULL) || strcmp(rid, request_id) != 0)
      continue;
    const void *mac;
    size_t ml;
    free(out.value), free(out.mac);
    out.value = malloc(len), out.len = len;
    memcpy(out.value, v, len);
    if (lt_bus_msg_header_get(m, LT_RECMAC_HEADER, &mac, &ml)) out.mac = malloc(ml), out.mac_len = ml, memcpy(out.mac, mac, ml);
  }
  lt_bus_consumer_destroy(c);
  lt_avro_decoder_destroy(dec);
  lt_avro_registry_destroy(reg);
  lt_bus_conf_destroy(conf);
  cr_assert_not_null(out.value, "no %s for %s in lathe.audit", type, request_id);
  return out;
}

static void produce_raw(const void *value, size_t len, const char *tenant, const void *mac, size_t mac_len) {
  lt_bus_conf_t *conf = lt_test_bus_env(); /* the admin principal */
  lt_bus_producer_t *p;
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK, "%s", err);
  char topic[128];
  lt_bus_topic_name(conf, "audit", topic, sizeof topic);
  lt_bus_header_t h = {.name = LT_RECMAC_HEADER, .value = mac, .size = mac_len};
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = tenant, .key_size = strlen(tenant),
                       .value = value, .value_size = len, .headers = mac ? &h : NULL, .header_count = mac ? 1 : 0};
  cr_assert_eq(lt_bus_produce_sync(p, &r, 10000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_bus_producer_destroy(p, 5000);
  lt_bus_conf_destroy(conf);
}

/* A decision on request id made here, as another API process would write it: type
 * AccessApproved, AccessDenied or AccessRevoked, a fresh event id, by `who`, signed with
 * master_hex's audit key (NULL: no MAC). */
static raw_t forge_decision(const char *type, const char *id, const char *tenant, const char *who,
                            const char *master_hex) {
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, type, &rec, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_stamp(rec, "api/forger"), LT_OK);
  bool approved = strcmp(type, "AccessApproved") == 0, revoked = strcmp(type, "AccessRevoked") == 0;
  cr_assert_eq(lt_avro_set_string(rec, "request_id", id) || lt_avro_set_string(rec, "tenant_id", tenant) ||
                   lt_avro_set_string(rec, revoked ? "revoked_by" : "approver", who) ||
                   (approved ? lt_avro_set_long(rec, "expires_at", lt_time_wall_ms() + 3600000)
                             : lt_avro_set_string(rec, "reason", "another API's")),
               LT_OK);
  const uint8_t *b;
  raw_t out = {0};
  cr_assert_eq(lt_avro_record_encode(rec, &b, &out.len, err, sizeof err), LT_OK);
  out.value = malloc(out.len);
  memcpy(out.value, b, out.len);
  if (master_hex) {
    lt_crypto_kek_t *kek;
    lt_recmac_key_t *k;
    cr_assert_eq(lt_crypto_kek_from_text(&kek, "m", master_hex, err, sizeof err), LT_OK);
    cr_assert_eq(lt_recmac_key_new(kek, LT_RECMAC_AUDIT, &k, err, sizeof err), LT_OK);
    out.mac = malloc(LT_RECMAC_BYTES), out.mac_len = LT_RECMAC_BYTES;
    lt_recmac_sign(k, "audit", tenant, strlen(tenant), out.value, out.len, out.mac);
    lt_recmac_key_destroy(k);
    lt_crypto_kek_destroy(kek);
  }
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
  return out;
}

/* An AccessApproved for request id, made here: approver "tenant:forged". */
static raw_t forge_approval(const char *id, const char *tenant, const char *master_hex) {
  return forge_decision("AccessApproved", id, tenant, "tenant:forged", master_hex);
}

Test(lockbox, forged_and_replayed_approvals_open_nothing) {
  char ds[64], id[64], body[4096], scope[128];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  /* An approval with no MAC, and one with another master key's MAC, written straight to the topic. */
  raw_t none = forge_approval(id, tenant_a, NULL), other = forge_approval(id, tenant_a, OTHER_KEY);
  produce_raw(none.value, none.len, tenant_a, NULL, 0);
  produce_raw(other.value, other.len, tenant_a, other.mac, other.mac_len);
  /* Control: the same forgery signed with the right master key would open it, so the two above
   * fail for their MAC alone. It goes on another request, which the test then leaves. */
  char id2[64];
  ask(alice, tenant_a, scope, 600, id2, sizeof id2);
  raw_t good = forge_approval(id2, tenant_a, MASTER_KEY);
  produce_raw(good.value, good.len, tenant_a, good.mac, good.mac_len);
  lt_test_wait_until(read_dataset(alice, id2, ds, body, sizeof body) == 200, 10000, 200,
                     "a correctly signed approval was never folded: %s", body);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 403, "a forged approval opened the grant: %s", body);
  cr_expect(strstr(body, "tenant's approval"), "%s", body);
  /* Both forgeries are dead-lettered with the reason. */
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"deadletter", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *dead = lt_test_tail_select(t, NULL, "DeadLetter", NULL, 0);
  int no_mac = 0, bad_mac = 0;
  size_t i;
  json_t *d;
  json_array_foreach(dead, i, d) {
    const char *reason = lt_test_rs(d, "reason"), *topic = lt_test_rs(d, "topic");
    if (!reason || !topic || !strstr(topic, "audit")) continue;
    no_mac += strstr(reason, "no lathe-mac header") != NULL;
    bad_mac += strstr(reason, "does not verify") != NULL;
  }
  json_decref(dead);
  lt_test_tail_close(t);
  cr_expect_geq(no_mac, 1, "no DeadLetter for the approval without a MAC");
  cr_expect_geq(bad_mac, 1, "no DeadLetter for the approval with another master key's MAC");
  /* A genuine approval, revoked, then replayed byte for byte with its MAC: still revoked. */
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  cr_assert_eq(decide(ca, "/v1/access", id, "revoke"), 200);
  raw_t genuine = find_raw("AccessApproved", id);
  produce_raw(genuine.value, genuine.len, tenant_a, genuine.mac, genuine.mac_len);
  lt_test_msleep(1500);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 403, "a replayed approval reopened a revoked grant: %s", body);
  /* After a restart the fold from the log gives the same answers. */
  stop_api();
  start_api(false);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 403, "%s", body);
  cr_expect_eq(read_dataset(alice, id2, ds, body, sizeof body), 200, "%s", body);
  free(none.value), free(other.value), free(other.mac), free(good.value), free(good.mac);
  free(genuine.value), free(genuine.mac);
}

Test(lockbox, policy_a_second_staff_member_must_approve_and_never_the_requester) {
  stop_api();
  start_api(true);
  char ds[64], id[64], body[4096], scope[128];
  granted(ds, id, scope);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 403, "%s", body);
  cr_expect(strstr(body, "second staff"), "%s", body);
  cr_expect_eq(decide(alice, "/v1/staff/access", id, "approve"), 403, "self-approval");
  cr_assert_eq(decide(bob, "/v1/staff/access", id, "approve"), 200);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "%s", body);
  cr_expect_eq(decide(bob, "/v1/staff/access", id, "approve"), 409, "a second approval is given once");
}

/* ---------------------------------------------------------------- audit write fails */

/* The audit record must be durable before any byte: with the broker down the read answers 503
 * and no data. The shared broker cannot be taken down, so this API talks to librdkafka's mock
 * cluster (in this process, over loopback); the store is the real one. */
/* librdkafka's mock cluster (in this process, over loopback) with every topic of ops/topics.tsv
 * under a new prefix, tenants d and e on it, and an API on it; *mrk: the handle to destroy. */
static rd_kafka_mock_cluster_t *mock_up(rd_kafka_t **mrk) {
  lt_test_require_stack();
  char errs[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  cr_assert_eq(rd_kafka_conf_set(kc, "test.mock.num.brokers", "1", errs, sizeof errs), RD_KAFKA_CONF_OK, "%s", errs);
  *mrk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, errs, sizeof errs);
  cr_assert_not_null(*mrk, "%s", errs);
  rd_kafka_mock_cluster_t *mc = rd_kafka_handle_mock_cluster(*mrk);
  setenv("LATHE_KAFKA_BOOTSTRAP", rd_kafka_mock_cluster_bootstraps(mc), 1);
  unsetenv("LATHE_KAFKA_CONFIG_DIR"); /* the mock cluster has no SASL */
  setup_env("tlockdown");
  char path[1200], line[512];
  lt_test_source_path("ops/topics.tsv", path, sizeof path);
  FILE *tf = fopen(path, "r");
  cr_assert_not_null(tf, "%s", path);
  while (fgets(line, sizeof line, tf)) {
    char base[128], topic[256];
    int parts;
    if (line[0] == '#' || sscanf(line, "%127s %d", base, &parts) != 2) continue;
    snprintf(topic, sizeof topic, "%s%s", prefix, base);
    cr_assert_eq(rd_kafka_mock_topic_create(mc, topic, parts, 1), RD_KAFKA_RESP_ERR_NO_ERROR, "%s", topic);
  }
  fclose(tf);
  new_tenant("d", tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  new_tenant("e", tenant_b, sizeof tenant_b, key_b, sizeof key_b);
  start_api(false);
  return mc;
}

enum { FETCH_API_KEY = 1 }; /* the Kafka protocol's ApiKey of a Fetch request */

/* Every Fetch of the mock cluster fails (NOT_LEADER) until rd_kafka_mock_clear_request_errors:
 * an API's feed reads nothing meanwhile. */
static void fetches_fail(rd_kafka_mock_cluster_t *mc) {
  enum { HELD = 100000 };
  rd_kafka_resp_err_t *errors = malloc(HELD * sizeof *errors);
  cr_assert_not_null(errors);
  for (int i = 0; i < HELD; i++) errors[i] = RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION;
  rd_kafka_mock_push_request_errors_array(mc, FETCH_API_KEY, HELD, errors);
  free(errors);
}

Test(lockbox_down, no_audit_record_no_data, .timeout = 300) {
  rd_kafka_t *mrk;
  rd_kafka_mock_cluster_t *mc = mock_up(&mrk);
  char ds[64], id[64], body[4096], scope[128];
  granted(ds, id, scope);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "with the broker up: %s", body);
  rd_kafka_mock_broker_set_down(mc, 1);
  cr_expect_eq(read_dataset(alice, id, ds, body, sizeof body), 503, "with the audit write failing: %s", body);
  cr_expect(strstr(body, "canary-7f3a") == NULL, "no byte of the data without its audit record: %s", body);
  rd_kafka_mock_broker_set_up(mc, 1);
  teardown();
  rd_kafka_destroy(mrk);
}

/* An API process that has not read lathe.audit back yet may know a grant's approval and not the
 * revoke after it (the log is read in turns of 2,000 records, HTTP requests between them): until
 * it has caught up, staff routes answer 503 "starting", as customer routes do. Here a new API's
 * fetches fail (the mock cluster's errors) until the test clears them: it knows no grant, and
 * before, it answered the staff list 200 (empty) and a read 404 while it read the log. Once it
 * has read it, the read under the revoked grant is refused as revoked. */
Test(lockbox_down, a_starting_api_answers_no_staff_route_before_it_has_read_the_log, .timeout = 300) {
  rd_kafka_t *mrk;
  rd_kafka_mock_cluster_t *mc = mock_up(&mrk);
  char ds[64], id[64], body[4096], scope[128];
  granted(ds, id, scope);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "%s", body);
  cr_assert_eq(decide(ca, "/v1/access", id, "revoke"), 200);
  stop_api();
  fetches_fail(mc);
  char log[256], keys_env[128], held_url[64];
  snprintf(log, sizeof log, "/tmp/test_lockbox.%d.held.log", (int)getpid());
  snprintf(keys_env, sizeof keys_env, "LATHE_STAFF_KEYS_FILE=%s", staff_file);
  api = lt_test_lathed("api", log, "api", NULL, (const char *const[]){keys_env, NULL});
  snprintf(held_url, sizeof held_url, "http://127.0.0.1:%u", lt_test_proc_port(api, 30000));
  /* the client sends a 503 "starting" again within its timeout: 2 s, not 30 s, for each probe */
  lt_client_t *staff = lt_test_client(held_url, key_alice, 30), *tenant = lt_test_client(held_url, key_a, 2),
              *staff_now = lt_test_client(held_url, key_alice, 2);
  lt_test_msleep(1000);
  cr_expect_eq(status_of(tenant, "GET", "/v1/jobs", NULL, body, sizeof body), 503, "not read yet: %s", body);
  int st = read_dataset(staff_now, id, ds, body, sizeof body);
  cr_expect_eq(st, 503, "a staff read while the API is starting: %d %s", st, body);
  cr_expect(strstr(body, "starting") && !strstr(body, "canary-7f3a"), "%s", body);
  cr_expect_eq(status_of(staff_now, "GET", "/v1/staff/access", NULL, body, sizeof body), 503, "the staff list: %s", body);
  rd_kafka_mock_clear_request_errors(mc, FETCH_API_KEY);
  lt_test_wait_until((st = read_dataset(staff, id, ds, body, sizeof body)) != 503, 60000, 100,
                     "the API never read the log once its fetches worked; see %s", log);
  cr_expect_eq(st, 403, "once read: %d %s", st, body);
  cr_expect(strstr(body, "revoked"), "%s", body);
  lt_client_destroy(staff);
  lt_client_destroy(staff_now);
  lt_client_destroy(tenant);
  teardown();
  rd_kafka_destroy(mrk);
}

/* A request on its own thread (a staff read, a tenant's decision): its answer once it came back. */
typedef struct {
  lt_client_t *c;
  const char *method;
  char path[256];
  int status;
  char body[4096];
} call_bg_t;

static void *call_bg(void *arg) {
  call_bg_t *b = arg;
  b->status = status_of(b->c, b->method, b->path, strcmp(b->method, "POST") == 0 ? "{}" : NULL, b->body, sizeof b->body);
  return NULL;
}

/* Another API process's decisions, written to lathe.audit while this API's feed cannot read
 * (its fetches fail): what this API writes after them is answered only once it has read the log
 * up to its own record, in log order. A read under a grant another API revoked first is refused
 * and returns nothing; an approval after another API's deny answers 409 and the request stays
 * denied. Before, this API folded its own record at the broker's acknowledgement: the read
 * returned the dataset, and the approval answered 200 "active" and kept the grant open here
 * (while every other API process, and this one after a restart, said denied). */
Test(lockbox_down, records_another_api_wrote_first_are_folded_before_this_apis_answer, .timeout = 300) {
  rd_kafka_t *mrk;
  rd_kafka_mock_cluster_t *mc = mock_up(&mrk);
  char ds[64], id[64], id2[64], body[4096], scope[128];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(scope, sizeof scope, "dataset:%s", ds);
  ask(alice, tenant_a, scope, 600, id, sizeof id);
  ask(alice, tenant_a, scope, 600, id2, sizeof id2);
  cr_assert_eq(decide(ca, "/v1/access", id, "approve"), 200);
  cr_assert_eq(read_dataset(alice, id, ds, body, sizeof body), 200, "%s", body);
  fetches_fail(mc);
  raw_t revoke = forge_decision("AccessRevoked", id, tenant_a, "tenant:other-api", MASTER_KEY);
  raw_t deny = forge_decision("AccessDenied", id2, tenant_a, "tenant:other-api", MASTER_KEY);
  produce_raw(revoke.value, revoke.len, tenant_a, revoke.mac, revoke.mac_len);
  produce_raw(deny.value, deny.len, tenant_a, deny.mac, deny.mac_len);
  call_bg_t rd = {.c = alice, .method = "GET"}, ap = {.c = ca, .method = "POST"};
  snprintf(rd.path, sizeof rd.path, "/v1/staff/access/%s/datasets/%s", id, ds);
  snprintf(ap.path, sizeof ap.path, "/v1/access/%s/approve", id2);
  pthread_t t1, t2;
  pthread_create(&t1, NULL, call_bg, &rd);
  pthread_create(&t2, NULL, call_bg, &ap);
  lt_test_msleep(2000); /* both records written, both waiting for the feed */
  rd_kafka_mock_clear_request_errors(mc, FETCH_API_KEY);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  cr_expect_eq(rd.status, 403, "a read under a grant another API revoked: %d %s", rd.status, rd.body);
  cr_expect(strstr(rd.body, "revoked") && !strstr(rd.body, "canary-7f3a"), "%s", rd.body);
  cr_expect_eq(ap.status, 409, "an approval after another API's deny: %d %s", ap.status, ap.body);
  cr_expect(strstr(ap.body, "denied"), "%s", ap.body);
  snprintf(body, sizeof body, "/v1/access/%s", id2);
  char got[4096];
  cr_expect_eq(status_of(ca, "GET", body, NULL, got, sizeof got), 200, "%s", got);
  cr_expect(strstr(got, "\"state\":\"denied\""), "the request as this API holds it: %s", got);
  free(revoke.value), free(revoke.mac), free(deny.value), free(deny.mac);
  teardown();
  rd_kafka_destroy(mrk);
}

/* The same path from the command line: staff ask, the tenant approves, staff read into a file. */
Test(lockbox, the_cli_asks_approves_and_reads) {
  char ds[64], cmd[2048], out[128], id[64];
  upload(ca, canary_jsonl, ds, sizeof ds);
  snprintf(out, sizeof out, "/tmp/test_lockbox.read.%d", (int)getpid());
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_STAFF_KEY=%s '%s' admin access request --tenant %s --scope dataset:%s "
           "--reason 'ticket 9' --ttl 10m --json 2>&1", url, key_alice, lt_test_lathe_bin(), tenant_a, ds);
  int rc;
  char *o = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", o);
  json_t *j = json_loads(o, 0, NULL);
  cr_assert(j && json_string_value(json_object_get(j, "id")), "%s", o);
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
  cr_expect_eq(json_integer_value(json_object_get(j, "duration_s")), 600, "--ttl 10m: %s", o);
  json_decref(j);
  free(o);
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_STAFF_KEY=%s '%s' admin access read %s --dataset %s -o %s 2>&1", url,
           key_alice, lt_test_lathe_bin(), id, ds, out);
  o = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 1, "a read before approval fails: %s", o);
  cr_expect(strstr(o, "403"), "%s", o);
  free(o);
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_API_KEY=%s '%s' access approve %s 2>&1", url, key_a,
           lt_test_lathe_bin(), id);
  o = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", o);
  cr_expect(strstr(o, "active"), "%s", o);
  free(o);
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_STAFF_KEY=%s '%s' admin access read %s --dataset %s -o %s 2>&1", url,
           key_alice, lt_test_lathe_bin(), id, ds, out);
  o = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", o);
  free(o);
  size_t len;
  char *got = lt_test_slurp(out, &len);
  cr_assert_str_eq(got, canary_jsonl);
  free(got);
  unlink(out);
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_API_KEY=%s '%s' access list 2>&1", url, key_a, lt_test_lathe_bin());
  o = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s", o);
  cr_expect(strstr(o, id) && strstr(o, "alice") && strstr(o, "uses 1"), "%s", o);
  free(o);
}
