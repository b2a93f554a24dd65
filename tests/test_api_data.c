/* lathed api's data paths from the outside: uploads, downloads and what they cost the other
 * tenants. Each test starts `lathed --role api --port 0` as a child with its own settings (the
 * LATHE_API_* variables), against the real broker and S3 server, with tenants made by `lathe
 * admin tenant create`, and talks HTTP through lt_client.
 *
 * - a tenant's upload whose store call hangs does not hold up another tenant's requests: the
 *   blocking work runs off the event loop (a fake S3 endpoint that never answers proves it,
 *   with no clock in the assertion);
 * - open uploads are capped per tenant, with an error naming the limit, and an abort frees a slot;
 * - an open upload between its parts holds less than a part of the API's memory, and the memory
 *   goes back when the upload is aborted or expires (the child's RSS);
 * - an artifact bigger than the download window streams whole, verified, with the API's peak
 *   memory independent of its size; a corrupted one never arrives as a whole 200; a client that
 *   goes away mid-download frees its slot;
 * - no tenant runs on every pool thread: with one tenant's uploads all hanging, another's is
 *   answered;
 * - DELETE of a finished job: recorded, its artifact key destroyed first, its objects deleted,
 *   410 on its routes after a restart too; 409 for a running one, 404 for another tenant;
 * - the storage quota (datasets, checkpoints and artifacts together): 413 naming quota and usage;
 * - `lathe jobs download` writes every published artifact, each checked against its listed
 *   sha256 and size, and on a mismatch names the file and leaves no file or partial one;
 *   `lathe jobs checkpoints` and GET /v1/jobs/{id}/checkpoints list the live attempt's commits
 *   with an evaluation's metrics, never a fenced attempt's, and another tenant gets 404. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_crypto.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_tenant.h"
#include "lt_test.h"

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define MIB (1024 * 1024)
#define ONE "{\"prompt\":\"p\",\"completion\":\"c\"}\n" /* a valid dataset */

static char prefix[64], err[1024];
static lt_test_proc_t *proc;
static char url[64];
static char tenant_a[64], tenant_b[64], key_a[128], key_b[128];
static lt_client_t *ca, *cb;

/* ---------------------------------------------------------------- fixture */

static void new_tenant(const char *tag, char *id, size_t idn, char *key, size_t keyn) {
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(id, idn, "%s-%.10s", tag, rnd);
  lt_test_tenant_create(id, NULL, key, keyn);
}

/* The API with extra NAME=VALUE settings, ready (healthz 200 on its operator port) and knowing
 * both tenants. The front door's rate limits are off: these tests are about the data paths. */
static void start_api(const char *const *env) {
  static int n;
  char log[256], ops[64];
  const char *envs[16] = {"LATHE_API_KEY_RATE=off", "LATHE_API_TENANT_RATE=off"};
  for (int i = 0; env && env[i] && i < 12; i++) envs[2 + i] = env[i];
  snprintf(log, sizeof log, "/tmp/test_api_data.%d.%d.log", (int)getpid(), n++);
  proc = lt_test_lathed("api", log, "api", NULL, envs);
  snprintf(url, sizeof url, "http://127.0.0.1:%u", lt_test_proc_port(proc, 30000));
  snprintf(ops, sizeof ops, "http://127.0.0.1:%u", lt_test_proc_operator_port(proc, 30000));
  lt_test_wait_healthy(ops, log, 30000);
  ca = lt_test_client(url, key_a, 120);
  cb = lt_test_client(url, key_b, 120);
  lt_test_wait_until(lt_test_get_status(ca, "/v1/jobs", NULL, 0) == 200 &&
                         lt_test_get_status(cb, "/v1/jobs", NULL, 0) == 200,
                     20000, 100, "the API never accepted the tenants' keys");
}

static void setup(void) {
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT"))
    cr_assert_fail("needs the local stack: ops/stack up && eval \"$(ops/stack env)\"");
  snprintf(prefix, sizeof prefix, "tapd%d.", (int)getppid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  lt_test_admin_topics();
  new_tenant("a", tenant_a, sizeof tenant_a, key_a, sizeof key_a);
  new_tenant("b", tenant_b, sizeof tenant_b, key_b, sizeof key_b);
}

static void teardown(void) {
  lt_client_destroy(ca);
  lt_client_destroy(cb);
  ca = cb = NULL;
  lt_test_proc_stop_clean(proc, 10000);
  proc = NULL;
}

TestSuite(api_data, .init = setup, .fini = teardown, .timeout = 300);

/* ---------------------------------------------------------------- helpers */

static lt_client_resp_t req(lt_client_t *c, const char *method, const char *path, const void *body, size_t len) {
  return lt_test_req(c, method, path, body, len);
}

static const char *err_code(const lt_client_resp_t *r) {
  return json_string_value(json_object_get(json_object_get(r->json, "error"), "code"));
}
static const char *err_msg(const lt_client_resp_t *r) {
  const char *m = json_string_value(json_object_get(json_object_get(r->json, "error"), "message"));
  return m ? m : "";
}

/* Opens an upload; its id into id. */
static int open_upload(lt_client_t *c, char *id, size_t n, lt_client_resp_t *out) {
  lt_client_resp_t r = req(c, "POST", "/v1/uploads?name=d", NULL, 0);
  int status = r.status;
  if (status == 201) snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "upload_id")));
  if (out) *out = r;
  else lt_client_resp_free(&r);
  return status;
}

/* size bytes of valid JSONL (prompt/completion lines), different each call. */
static char *jsonl(size_t size) {
  static int salt;
  char *buf = malloc(size + 1);
  size_t off = 0;
  salt++;
  while (off < size) {
    char line[160];
    int len = snprintf(line, sizeof line, "{\"prompt\":\"q%d-%zu\",\"completion\":\"an answer of some length %zu\"}\n",
                       salt, off, off * 7);
    if (off + (size_t)len > size) { /* pad the last line to fit exactly */
      memset(buf + off, ' ', size - off);
      buf[size - 1] = '\n';
      off = size;
      break;
    }
    memcpy(buf + off, line, (size_t)len);
    off += (size_t)len;
  }
  buf[size] = '\0';
  return buf;
}

static int put_part(lt_client_t *c, const char *id, int n, const char *data, size_t len) {
  char path[640];
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/%d", id, n);
  lt_client_resp_t r = req(c, "PUT", path, data, len);
  int status = r.status;
  cr_expect(status == 200, "part %d of %s: %d %s", n, id, r.status, r.body);
  lt_client_resp_free(&r);
  return status;
}

static int abort_upload(lt_client_t *c, const char *id) {
  char path[640];
  snprintf(path, sizeof path, "/v1/uploads/%s", id);
  lt_client_resp_t r = req(c, "DELETE", path, NULL, 0);
  int status = r.status;
  lt_client_resp_free(&r);
  return status;
}

/* A field of the child's /proc/PID/status in KiB ("VmRSS", "VmHWM"). */
static long proc_kib(const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)proc->pid);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  long v = -1;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, field, fl) == 0 && line[fl] == ':') v = atol(line + fl + 1);
  fclose(f);
  cr_assert_geq(v, 0, "no %s in %s", field, path);
  return v;
}

/* ---------------------------------------------------------------- no tenant stalls another */

/* A pretend S3 endpoint that accepts connections and reads requests but answers nothing until
 * released: a store call to it hangs. With fwd_port set it passes each connection through to the
 * real S3 server on that port instead (the requests are signed for this endpoint's address, which
 * the server does not check), until hang_release cuts them all. */
typedef struct hang_srv {
  int fd;
  uint16_t port;
  pthread_t th;
  pthread_mutex_t mu;
  int accepted;
  int conns[64];
  bool released;
  uint16_t fwd_port;
  int fwd[256], nfwd; /* client sides passed through (never closed here: no fd is reused under them) */
} hang_srv_t;

/* Bytes both ways between a client and the real server until either side ends. */
static void *pass_main(void *arg) {
  int *fds = arg;
  struct pollfd p[2] = {{.fd = fds[0], .events = POLLIN}, {.fd = fds[1], .events = POLLIN}};
  char buf[65536];
  for (bool open = true; open && poll(p, 2, -1) > 0;)
    for (int i = 0; i < 2 && open; i++) {
      if (!p[i].revents) continue;
      ssize_t n = read(p[i].fd, buf, sizeof buf);
      open = n > 0 && write(p[1 - i].fd, buf, (size_t)n) == n;
    }
  shutdown(fds[0], SHUT_RDWR);
  close(fds[1]);
  free(fds);
  return NULL;
}

static void *hang_main(void *arg) {
  hang_srv_t *h = arg;
  for (;;) {
    int c = accept(h->fd, NULL, NULL);
    if (c < 0) return NULL;
    pthread_mutex_lock(&h->mu);
    if (h->released || h->accepted == 64 || (h->fwd_port && h->nfwd == 256)) {
      close(c);
    } else if (h->fwd_port) {
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                              .sin_port = htons(h->fwd_port)};
      int s = socket(AF_INET, SOCK_STREAM, 0), *fds = malloc(2 * sizeof *fds);
      pthread_t t;
      if (s < 0 || !fds || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(c);
        if (s >= 0) close(s);
        free(fds);
      } else {
        fds[0] = c, fds[1] = s;
        h->fwd[h->nfwd++] = c;
        pthread_create(&t, NULL, pass_main, fds);
        pthread_detach(t);
      }
    } else {
      h->conns[h->accepted++] = c;
    }
    pthread_mutex_unlock(&h->mu);
  }
}

static void hang_start(hang_srv_t *h) {
  memset(h, 0, sizeof *h);
  pthread_mutex_init(&h->mu, NULL);
  h->fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(h->fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(h->fd, 64), 0);
  socklen_t sl = sizeof a;
  getsockname(h->fd, (struct sockaddr *)&a, &sl);
  h->port = ntohs(a.sin_port);
  pthread_create(&h->th, NULL, hang_main, h);
}

static int hang_accepted(hang_srv_t *h) {
  pthread_mutex_lock(&h->mu);
  int n = h->accepted;
  pthread_mutex_unlock(&h->mu);
  return n;
}

/* Closes every held connection, cuts every passed-through one (the store calls fail), and
 * refuses the next ones. */
static void hang_release(hang_srv_t *h) {
  pthread_mutex_lock(&h->mu);
  h->released = true;
  for (int i = 0; i < h->accepted; i++) close(h->conns[i]);
  for (int i = 0; i < h->nfwd; i++) shutdown(h->fwd[i], SHUT_RDWR);
  pthread_mutex_unlock(&h->mu);
}

/* Passes connections through to the real server on port from now on. */
static void hang_pass(hang_srv_t *h, uint16_t port) {
  pthread_mutex_lock(&h->mu);
  h->released = false;
  h->fwd_port = port;
  pthread_mutex_unlock(&h->mu);
}

static void hang_stop(hang_srv_t *h) {
  shutdown(h->fd, SHUT_RDWR);
  close(h->fd);
  pthread_join(h->th, NULL);
}

typedef struct {
  lt_client_t *c;
  const char *body;
  int status;
  char text[512];
} upload_call_t;

static void *upload_thread(void *arg) {
  upload_call_t *u = arg;
  lt_client_resp_t r;
  memset(&r, 0, sizeof r);
  lt_err_t e = lt_client_request(u->c, "POST", "/v1/datasets?name=hang", NULL, 0, u->body, strlen(u->body), NULL,
                                 &r, u->text, sizeof u->text);
  u->status = e ? -1 : r.status;
  if (!e) snprintf(u->text, sizeof u->text, "%s", r.body ? r.body : "");
  lt_client_resp_free(&r);
  return NULL;
}

Test(api_data, a_tenants_hanging_store_call_does_not_hold_up_another_tenants_requests) {
  hang_srv_t h;
  hang_start(&h);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "LATHE_S3_ENDPOINT=127.0.0.1:%u", h.port);
  start_api((const char *const[]){endpoint, NULL});
  /* Tenant A's upload reaches the store, which holds the call. */
  upload_call_t u = {.c = lt_test_client(url, key_a, 120), .body = ONE}; /* a client per thread */
  pthread_t th;
  pthread_create(&th, NULL, upload_thread, &u);
  lt_test_wait_until(hang_accepted(&h) > 0, 30000, 20, "the upload never reached the store");
  /* While that call hangs, tenant B is answered: the loop is free. */
  for (int i = 0; i < 5; i++) {
    lt_client_resp_t r = req(cb, "GET", "/v1/jobs", NULL, 0);
    cr_assert_eq(r.status, 200, "tenant B's GET /v1/jobs while A's store call hangs: %d %s", r.status, r.body);
    lt_client_resp_free(&r);
    r = req(ca, "GET", "/v1/jobs", NULL, 0);
    cr_assert_eq(r.status, 200, "%s", r.body);
    lt_client_resp_free(&r);
  }
  pthread_mutex_lock(&h.mu);
  bool still_held = !h.released;
  pthread_mutex_unlock(&h.mu);
  cr_assert(still_held && u.status == 0, "A's upload must still be waiting on the store (status %d)", u.status);
  /* Released: the store calls fail, A hears 503 (nothing stored), and the API goes on. */
  hang_release(&h);
  pthread_join(th, NULL);
  lt_client_destroy(u.c);
  cr_expect_eq(u.status, 503, "A's upload after the store failed: %d %s", u.status, u.text);
  lt_client_resp_t r = req(cb, "GET", "/v1/jobs", NULL, 0);
  cr_expect_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  hang_stop(&h);
}

/* A store that refuses this service's credentials (here: the stack's S3 server, a wrong secret)
 * is the service's fault: 500, in words of the API's own. Before, the store's message reached
 * the tenant with 401 "unauthorized" (telling a client with a good key that its key was bad)
 * and named the store's host and the service's S3 access key; it goes to the log now. */
static int post_status(lt_client_t *c, const char *path, const char *body, char *msg, size_t msgn);

Test(api_data, a_store_that_refuses_the_services_credentials_is_500_naming_neither_store_nor_key) {
  const char *access = getenv("LATHE_S3_ACCESS_KEY"), *endpoint = getenv("LATHE_S3_ENDPOINT");
  cr_assert(access && *access && endpoint && *endpoint, "the stack's S3 settings");
  start_api((const char *const[]){"LATHE_S3_SECRET_KEY=not-the-secret", NULL});
  char msg[2048];
  int st = post_status(ca, "/v1/datasets?name=refused", ONE, msg, sizeof msg);
  cr_expect_eq(st, 500, "an upload the store refused: %d %s", st, msg);
  cr_expect(!strstr(msg, access), "the service's S3 access key in the answer: %s", msg);
  cr_expect(!strstr(msg, endpoint), "the store's address in the answer: %s", msg);
  cr_expect(strstr(msg, "could not be stored"), "%s", msg);
  lt_client_resp_t r = req(ca, "GET", "/v1/datasets/ds-none", NULL, 0);
  cr_expect(r.status == 500 || r.status == 404, "a show the store refused: %d %s", r.status, r.body);
  cr_expect(!r.body || (!strstr(r.body, access) && !strstr(r.body, endpoint)), "%s", r.body);
  lt_client_resp_free(&r);
}

/* The pool (lt_api_work.c) runs no tenant on every thread: with A's four uploads hanging in the
 * store, a thread is left, and B's upload, which needs a pool thread but not the store (it is
 * refused by the validator), is answered. */
Test(api_data, a_tenant_whose_uploads_all_hang_leaves_a_pool_thread_to_another_tenant) {
  hang_srv_t h;
  hang_start(&h);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "LATHE_S3_ENDPOINT=127.0.0.1:%u", h.port);
  start_api((const char *const[]){endpoint, "LATHE_API_THREADS=4", NULL});
  enum { N = 4 };
  upload_call_t u[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    u[i] = (upload_call_t){.c = lt_test_client(url, key_a, 120), .body = ONE};
    pthread_create(&th[i], NULL, upload_thread, &u[i]);
  }
  /* Three of A's four run (each holds a store connection); the fourth waits for one of them. */
  lt_test_wait_until(hang_accepted(&h) >= 3, 30000, 20, "A's uploads never reached the store");
  lt_client_t *b = lt_test_client(url, key_b, 30); /* without a thread left it would never answer */
  lt_client_resp_t r;
  memset(&r, 0, sizeof r);
  lt_err_t e = lt_client_request(b, "POST", "/v1/datasets?name=bad", NULL, 0, "not json\n", 9, NULL, &r, err,
                                 sizeof err);
  lt_client_destroy(b);
  cr_expect(e == LT_OK && r.status == 400, "B's upload while A's hang: %s %d %s", e ? err : "", r.status,
            r.body ? r.body : "");
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "(none)", "invalid_dataset");
  lt_client_resp_free(&r);
  pthread_mutex_lock(&h.mu);
  bool held = !h.released;
  pthread_mutex_unlock(&h.mu);
  cr_expect(held, "A's store calls were still hanging while B was answered");
  hang_release(&h);
  for (int i = 0; i < N; i++) {
    pthread_join(th[i], NULL);
    lt_client_destroy(u[i].c);
    cr_expect_eq(u[i].status, 503, "A's upload %d after the store failed: %d %s", i, u[i].status, u[i].text);
  }
  hang_stop(&h);
}

/* ---------------------------------------------------------------- the open-upload cap */

/* One request on its own thread: its status once it came back. */
typedef struct {
  lt_client_t *c;
  const char *method;
  char path[160];
  const char *body;
  size_t len;
  int status;
} part_call_t;

static void *part_thread(void *arg) {
  part_call_t *p = arg;
  lt_client_resp_t r = req(p->c, p->method, p->path, p->body, p->len);
  p->status = r.status;
  lt_client_resp_free(&r);
  return NULL;
}

/* An upload aborted while its part is still on a pool thread keeps its place under the cap
 * until the part ends (it is found by no request meanwhile): the store here holds every part.
 * Before, the abort freed the place at once, so a tenant could open, feed and abort uploads
 * without end, each part (up to 8 MiB, its validator and writer) still queued on the pool. */
Test(api_data, an_upload_aborted_while_its_part_runs_holds_its_place_until_the_part_ends) {
  hang_srv_t h;
  hang_start(&h);
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "LATHE_S3_ENDPOINT=127.0.0.1:%u", h.port);
  start_api((const char *const[]){endpoint, "LATHE_API_MAX_OPEN_UPLOADS=2", "LATHE_API_THREADS=4", NULL});
  char *big = jsonl(6 << 20), id[3][64];
  part_call_t p[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(open_upload(ca, id[i], sizeof id[i], NULL), 201);
    p[i] = (part_call_t){.c = lt_test_client(url, key_a, 120), .method = "PUT", .body = big, .len = 6 << 20};
    snprintf(p[i].path, sizeof p[i].path, "/v1/uploads/%s/parts/1", id[i]);
    pthread_create(&th[i], NULL, part_thread, &p[i]);
    lt_test_wait_until(hang_accepted(&h) > i, 30000, 20, "part %d never reached the store", i);
    cr_assert_eq(abort_upload(ca, id[i]), 200);
    cr_expect_eq(abort_upload(ca, id[i]), 404, "an aborted upload is found by no request");
  }
  lt_client_resp_t r;
  cr_expect_eq(open_upload(ca, id[2], sizeof id[2], &r), 429, "a third upload while the aborted two's parts run: %d %s",
               r.status, r.body);
  cr_expect(strstr(err_msg(&r), "has 2 open uploads"), "%s", err_msg(&r));
  lt_client_resp_free(&r);
  hang_release(&h);
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    lt_client_destroy(p[i].c);
    cr_expect(p[i].status == 404 || p[i].status == 503, "the aborted upload's part: %d", p[i].status);
  }
  int st = 0;
  lt_test_wait_until((st = open_upload(ca, id[2], sizeof id[2], NULL)) == 201, 20000, 100,
                     "the places never came back once the parts ended (%d)", st);
  free(big);
  hang_stop(&h);
}

/* A part whose storage quota could not be checked (the store's listing failed) went nowhere: the
 * upload stays open, and the part sent again once the store is back is taken. Before, the upload
 * was dropped with a 503 saying to retry, and the retry found no upload (404): up to a gigabyte
 * of parts sent before it was lost to a failed listing. */
Test(api_data, a_part_whose_storage_quota_could_not_be_checked_leaves_the_upload_open) {
  const char *s3 = getenv("LATHE_S3_ENDPOINT");
  cr_assert(s3 && strrchr(s3, ':'), "the stack's S3 endpoint");
  uint16_t s3_port = (uint16_t)atoi(strrchr(s3, ':') + 1);
  hang_srv_t h;
  hang_start(&h);
  hang_pass(&h, s3_port);
  char endpoint[64], id[64], path[160];
  snprintf(endpoint, sizeof endpoint, "LATHE_S3_ENDPOINT=127.0.0.1:%u", h.port);
  start_api((const char *const[]){endpoint, "LATHE_API_MAX_STORAGE_BYTES=1000000000", NULL});
  size_t len = 200000;
  char *p1 = jsonl(len), *p2 = jsonl(len);
  cr_assert_eq(open_upload(ca, id, sizeof id, NULL), 201);
  cr_assert_eq(put_part(ca, id, 1, p1, len), 200);
  hang_release(&h); /* the store is unreachable: the quota's listing fails */
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/2", id);
  lt_client_resp_t r = req(ca, "PUT", path, p2, len);
  cr_expect_eq(r.status, 503, "part 2 with the store gone: %d %s", r.status, r.body);
  cr_expect(strstr(err_msg(&r), "send it again"), "%s", err_msg(&r));
  lt_client_resp_free(&r);
  hang_pass(&h, s3_port); /* back */
  cr_expect_eq(put_part(ca, id, 2, p2, len), 200, "part 2 sent again once the store is back");
  snprintf(path, sizeof path, "/v1/uploads/%s/complete", id);
  r = req(ca, "POST", path, NULL, 0);
  cr_expect_eq(r.status, 201, "%d %s", r.status, r.body);
  cr_expect_eq(json_integer_value(json_object_get(r.json, "bytes")), (json_int_t)(2 * len), "%s", r.body);
  lt_client_resp_free(&r);
  free(p1);
  free(p2);
  hang_stop(&h);
}

/* An abort while the upload completes is refused (409): the dataset may be stored already, and
 * the completion's own answer says whether it was. Before, the abort answered 200 "aborted" and
 * the completion went on to store the dataset. The store here holds the completion. */
Test(api_data, an_abort_while_the_upload_completes_is_409_not_a_false_aborted) {
  hang_srv_t h;
  hang_start(&h);
  char endpoint[64], id[64], path[160];
  snprintf(endpoint, sizeof endpoint, "LATHE_S3_ENDPOINT=127.0.0.1:%u", h.port);
  start_api((const char *const[]){endpoint, NULL});
  cr_assert_eq(open_upload(ca, id, sizeof id, NULL), 201);
  put_part(ca, id, 1, ONE, strlen(ONE));
  part_call_t done = {.c = lt_test_client(url, key_a, 120), .method = "POST"};
  snprintf(done.path, sizeof done.path, "/v1/uploads/%s/complete", id);
  pthread_t th;
  pthread_create(&th, NULL, part_thread, &done);
  lt_test_wait_until(hang_accepted(&h) > 0, 30000, 20, "the completion never reached the store");
  snprintf(path, sizeof path, "/v1/uploads/%s", id);
  char msg[1024];
  lt_client_resp_t r = req(ca, "DELETE", path, NULL, 0);
  snprintf(msg, sizeof msg, "%s", r.body ? r.body : "");
  cr_expect_eq(r.status, 409, "an abort while the upload completes: %d %s", r.status, msg);
  cr_expect(strstr(msg, "is completing"), "%s", msg);
  lt_client_resp_free(&r);
  hang_release(&h);
  pthread_join(th, NULL);
  lt_client_destroy(done.c);
  cr_expect_eq(done.status, 503, "the completion, its store gone: %d", done.status);
  hang_stop(&h);
}

Test(api_data, a_tenant_at_its_open_upload_cap_gets_429_naming_the_limit_and_an_abort_frees_a_slot) {
  start_api((const char *const[]){"LATHE_API_MAX_OPEN_UPLOADS=2", NULL});
  char id1[64], id2[64], id3[64], idb[64];
  cr_assert_eq(open_upload(ca, id1, sizeof id1, NULL), 201);
  cr_assert_eq(open_upload(ca, id2, sizeof id2, NULL), 201);
  lt_client_resp_t r;
  cr_assert_eq(open_upload(ca, id3, sizeof id3, &r), 429, "a third open upload: %d %s", r.status, r.body);
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "(none)", "over_quota");
  cr_expect(strstr(err_msg(&r), "max_open_uploads is 2") && strstr(err_msg(&r), "has 2 open uploads"),
            "the error names the limit and the usage: %s", err_msg(&r));
  lt_client_resp_free(&r);
  /* The one-request upload is an open upload too while it runs. */
  r = req(ca, "POST", "/v1/datasets?name=x", ONE, strlen(ONE));
  cr_expect_eq(r.status, 429, "POST /v1/datasets at the cap: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  /* The cap is per tenant: B is not affected. */
  cr_expect_eq(open_upload(cb, idb, sizeof idb, NULL), 201, "another tenant's upload");
  /* An abort frees a slot; so does a completion. */
  cr_assert_eq(abort_upload(ca, id1), 200);
  cr_assert_eq(open_upload(ca, id3, sizeof id3, NULL), 201, "after an abort");
  char path[640];
  put_part(ca, id2, 1, ONE, strlen(ONE));
  snprintf(path, sizeof path, "/v1/uploads/%s/complete", id2);
  r = req(ca, "POST", path, NULL, 0);
  cr_assert_eq(r.status, 201, "complete: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(open_upload(ca, id1, sizeof id1, NULL), 201, "after a completion");
}

/* ---------------------------------------------------------------- upload memory */

Test(api_data, open_uploads_hold_less_than_a_part_between_parts_and_give_memory_back) {
  enum { UPLOADS = 8 };
  start_api((const char *const[]){"LATHE_API_MAX_OPEN_UPLOADS=8", "LATHE_API_UPLOAD_IDLE_MS=15000", NULL});
  size_t part = 6 * MIB; /* over S3's 5 MiB minimum part, under the store's 8 MiB part size */
  char ids[UPLOADS][64];
  /* Warm the allocator and the connections with one upload through, then take the baseline. */
  char *data = jsonl(part);
  cr_assert_eq(open_upload(ca, ids[0], sizeof ids[0], NULL), 201);
  put_part(ca, ids[0], 1, data, part);
  cr_assert_eq(abort_upload(ca, ids[0]), 200);
  long base = proc_kib("VmRSS");
  for (int i = 0; i < UPLOADS; i++) {
    cr_assert_eq(open_upload(ca, ids[i], sizeof ids[i], NULL), 201);
    put_part(ca, ids[i], 1, data, part);
  }
  long open = proc_kib("VmRSS");
  /* What stays is the validator's line buffer and a partial encryption chunk, about 1 MiB; the
   * part itself (6 MiB here) went to the store as an S3 part and its buffers back to the system. */
  cr_expect_lt(open - base, UPLOADS * 1536L,
               "%d open uploads between 6 MiB parts hold %ld KiB (under 1.5 MiB each wanted)", UPLOADS, open - base);
  for (int i = 0; i < UPLOADS / 2; i++) cr_assert_eq(abort_upload(ca, ids[i]), 200);
  /* The other half expires (idle for 15 s): its memory goes back too, and its id is gone. */
  char path[640];
  snprintf(path, sizeof path, "/v1/uploads/%s", ids[UPLOADS - 1]);
  char body[1024] = "";
  lt_test_wait_until(lt_test_get_status(ca, path, body, sizeof body) == 404 && strstr(body, "no open upload"), 60000,
                     250, "an idle upload never expired: %s", body);
  long after = proc_kib("VmRSS");
  cr_expect_lt(after - base, 4 * 1024L, "after aborts and expiry the API holds %ld KiB over its baseline", after - base);
  free(data);
}

/* ---------------------------------------------------------------- streamed downloads */

/* Tenant A's data key, unwrapped from its TenantUpserted record with the master key. */
static lt_crypto_dek_t *tenant_dek(lt_crypto_kek_t *kek, lt_keyring_t **kr) {
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"tenants", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *recs = lt_test_tail_select(t, NULL, "TenantUpserted", NULL, 0), *r, *mine = NULL;
  size_t i;
  json_array_foreach(recs, i, r) if (strcmp(lt_test_rs(r, "tenant_id"), tenant_a) == 0) mine = r;
  cr_assert_not_null(mine, "no TenantUpserted for %s", tenant_a);
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_new(reg, "TenantUpserted", &rec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_record_from_jansson(rec, json_object_get(mine, "r"), err, sizeof err), LT_OK, "%s", err);
  lt_tenant_t ten;
  cr_assert_eq(lt_tenant_from_record(rec, &ten, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *dek;
  cr_assert_eq(lt_keyring_new(kek, kr), LT_OK);
  cr_assert_eq(lt_keyring_tenant_dek(*kr, &ten, &dek, err, sizeof err), LT_OK, "%s", err);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
  json_decref(recs);
  lt_test_tail_close(t);
  return (lt_crypto_dek_t *)dek;
}

/* Seals an artifact of job under its published key, as the publisher would; adds its entry to
 * arts (for publish). */
static void seal_artifact(lt_store_t *store, const lt_crypto_dek_t *dek, const char *job, const char *name,
                          const void *data, size_t len, char *key, size_t keyn, json_t *arts) {
  snprintf(key, keyn, "tenants/%s/artifacts/%s/%s", tenant_a, job, name);
  uint8_t sha[32];
  char hex[65];
  cr_assert_eq(lt_sealed_put(store, dek, key, data, len, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_crypto_sha256(data, len, sha);
  json_array_append_new(arts, json_pack("{s:s,s:s,s:s,s:I}", "name", name, "key", key, "sha256",
                                        lt_crypto_hex(sha, 32, hex), "bytes", (json_int_t)len));
}

/* `lathe topic produce TOPIC TYPE` of one record (taken). */
static void produce(const char *topic, const char *type, json_t *rec) {
  char file[128], cmd[1200];
  snprintf(file, sizeof file, "/tmp/test_api_data.%d.rec", (int)getpid());
  FILE *f = fopen(file, "w");
  json_dumpf(rec, f, JSON_COMPACT);
  fputc('\n', f);
  fclose(f);
  json_decref(rec);
  snprintf(cmd, sizeof cmd, "'%s' topic produce %s %s < %s 2>&1", lt_test_lathe_bin(), topic, type, file);
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  free(out);
  unlink(file);
}

/* Records ArtifactPublished for job with arts (one record: a second one replaces the first). */
static void publish(const char *job, json_t *arts) {
  produce("artifacts", "ArtifactPublished",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:s,s:O,s:s}", "event_id", job, "occurred_at", 1, "producer", "test",
                    "job_id", job, "tenant_id", tenant_a, "attempt", 1, "checkpoint_event_id", job, "artifacts", arts,
                    "config_digest", ""));
}

/* A job of tenant A (its submission through the API), to hang artifacts on. */
static void a_job(char *job, size_t n) {
  lt_client_resp_t r = req(ca, "POST", "/v1/datasets?name=s", ONE, strlen(ONE));
  cr_assert_eq(r.status, 201, "%s", r.body);
  char body[256];
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}",
           json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  r = req(ca, "POST", "/v1/jobs", body, strlen(body));
  cr_assert_eq(r.status, 201, "%s", r.body);
  snprintf(job, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

Test(api_data, an_artifact_bigger_than_the_window_streams_whole_with_flat_memory_and_a_corrupt_one_never_arrives_whole) {
  start_api((const char *const[]){"LATHE_API_DOWNLOAD_WINDOW=262144", "LATHE_API_MAX_DOWNLOADS=1", NULL});
  lt_crypto_kek_t *kek;
  lt_keyring_t *kr = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "master-1", MASTER_KEY, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *dek = tenant_dek(kek, &kr);
  lt_store_t *store = lt_test_store();
  char job[64], key[512], bad_key[512];
  a_job(job, sizeof job);
  size_t len = 48 * MIB;
  uint8_t *data = malloc(len);
  cr_assert_eq(lt_crypto_random(data, len), LT_OK);
  json_t *arts = json_array();
  seal_artifact(store, dek, job, "adapter_model.safetensors", data, len, key, sizeof key, arts);
  seal_artifact(store, dek, job, "samples.json", data, 3 * MIB, bad_key, sizeof bad_key, arts);
  /* Corrupt one byte in the middle of the second's stored object. */
  void *sealed;
  size_t slen;
  cr_assert_eq(lt_store_get(store, bad_key, 64 * MIB, &sealed, &slen, NULL, err, sizeof err), LT_OK, "%s", err);
  ((uint8_t *)sealed)[slen / 2] ^= 0x40;
  cr_assert_eq(lt_store_put(store, bad_key, sealed, slen, NULL, err, sizeof err), LT_OK, "%s", err);
  free(sealed);
  publish(job, arts);
  json_decref(arts);
  char path[256];
  char list[4096] = "";
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
  lt_test_wait_until(lt_test_get_status(ca, path, list, sizeof list) == 200 && strstr(list, "samples.json"), 20000, 100,
                     "the publication never showed: %s", list);
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/adapter_model.safetensors", job);
  long hwm0 = proc_kib("VmHWM");
  lt_client_resp_t r = req(ca, "GET", path, NULL, 0);
  cr_assert_eq(r.status, 200, "%d", r.status);
  cr_assert_eq(r.len, len, "the whole artifact: %zu of %zu bytes", r.len, len);
  cr_assert(memcmp(r.body, data, len) == 0, "the bytes are the artifact's");
  lt_client_resp_free(&r);
  long grew = proc_kib("VmHWM") - hwm0;
  cr_expect_lt(grew, 16 * 1024L, "serving a 48 MiB artifact raised the API's peak memory by %ld KiB", grew);
  /* Another tenant's id is 404 on the download route too. */
  r = req(cb, "GET", path, NULL, 0);
  cr_expect_eq(r.status, 404, "another tenant: %d", r.status);
  lt_client_resp_free(&r);
  /* The corrupt one: an error, or a cut connection; never 200 with every byte. */
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/samples.json", job);
  memset(&r, 0, sizeof r);
  lt_err_t e = lt_client_request(ca, "GET", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err);
  cr_expect(e != LT_OK || r.status != 200 || r.len < 3 * MIB, "a corrupt artifact arrived whole (%d, %zu bytes)",
            r.status, r.len);
  lt_client_resp_free(&r);
  /* A client that goes away mid-download: its stream stops and frees its slot (one download at
   * a time here), so the next download is served whole, not refused. */
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/adapter_model.safetensors", job);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                          .sin_port = htons((uint16_t)atoi(strrchr(url, ':') + 1))};
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char head[1024];
  int hl = snprintf(head, sizeof head, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, key_a);
  cr_assert_eq(write(fd, head, (size_t)hl), hl);
  size_t got = 0;
  char buf[65536];
  while (got < 1u << 20) {
    ssize_t n = read(fd, buf, sizeof buf);
    cr_assert_gt(n, 0, "the download ended after %zu bytes", got);
    got += (size_t)n;
  }
  close(fd);
  int status = 0;
  lt_test_wait_until((status = lt_test_get_status(ca, path, NULL, 0)) == 200, 20000, 200,
                     "after a client went away mid-download the next one got %d", status);
  r = req(ca, "GET", path, NULL, 0);
  cr_expect(r.status == 200 && r.len == len && memcmp(r.body, data, len) == 0, "the next download is whole: %d %zu",
            r.status, r.len);
  lt_client_resp_free(&r);
  /* The API is still there. */
  cr_expect_eq(lt_test_get_status(ca, "/v1/jobs", NULL, 0), 200);
  lt_store_delete(store, key, NULL, 0);
  lt_store_delete(store, bad_key, NULL, 0);
  free(data);
  lt_store_destroy(store);
  lt_keyring_destroy(kr);
  lt_crypto_kek_destroy(kek);
}

/* ---------------------------------------------------------------- deletion */

static int status_of(lt_client_t *c, const char *method, const char *fmt, const char *job) {
  char path[256];
  snprintf(path, sizeof path, fmt, job);
  lt_client_resp_t r = req(c, method, path, NULL, 0);
  int st = r.status;
  lt_client_resp_free(&r);
  return st;
}

static bool exists(lt_store_t *store, const char *key) {
  lt_store_info_t info;
  return lt_store_head(store, key, &info, NULL, 0) == LT_OK;
}

Test(api_data, deleting_a_finished_job_shreds_its_key_deletes_its_objects_and_stays_deleted_after_a_restart) {
  start_api(NULL);
  lt_crypto_kek_t *kek;
  lt_keyring_t *kr = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "master-1", MASTER_KEY, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *tdek = tenant_dek(kek, &kr);
  lt_store_t *store = lt_test_store();
  char job[64];
  a_job(job, sizeof job);
  /* Not finished: refused, nothing changes. */
  lt_client_resp_t r;
  char path[256];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  r = req(ca, "DELETE", path, NULL, 0);
  cr_assert_eq(r.status, 409, "DELETE of a submitted job: %d %s", r.status, r.body);
  cr_expect(strstr(err_msg(&r), "cancel it first"), "%s", err_msg(&r));
  lt_client_resp_free(&r);
  /* The same from the CLI: it fails, saying why. */
  char cmd[1024];
  int rc;
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_API_KEY=%s '%s' jobs delete %s 2>&1", url, key_a, lt_test_lathe_bin(),
           job);
  char *out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 1, "%s", out);
  cr_expect(strstr(out, "409") && strstr(out, "cancel it first"), "%s", out);
  free(out);
  /* Finished (rejected), with artifacts under the job's own key, as the publisher writes them. */
  produce("control", "JobRejected",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:n,s:s,s:s,s:n}", "event_id", job, "occurred_at", 1, "producer", "test",
                    "job_id", job, "tenant_id", tenant_a, "submitted_event_id", "code", "invalid", "reason", "test",
                    "field"));
  lt_crypto_dek_t *jdek;
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wlen;
  char dek_key[512], art_key[512], stage_key[512];
  snprintf(dek_key, sizeof dek_key, "tenants/%s/artifacts/%s/key.wrapped", tenant_a, job);
  cr_assert_eq(lt_crypto_dek_generate(&jdek, tenant_a, job, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_dek_wrap(kek, jdek, wrapped, sizeof wrapped, &wlen, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_put(store, dek_key, wrapped, wlen, NULL, err, sizeof err), LT_OK, "%s", err);
  json_t *arts = json_array();
  const char *text = "{\"lora\":\"weights\"}";
  seal_artifact(store, jdek, job, "adapter_config.json", text, strlen(text), art_key, sizeof art_key, arts);
  publish(job, arts);
  json_decref(arts);
  snprintf(stage_key, sizeof stage_key, "staging/%s/%s/1/10/state.bin", tenant_a, job);
  cr_assert_eq(lt_sealed_put(store, tdek, stage_key, "optimizer", 9, NULL, err, sizeof err), LT_OK, "%s", err);
  void *copy; /* what a backup or a lagging replica would still hold */
  size_t copy_len;
  cr_assert_eq(lt_store_get(store, art_key, 1 << 20, &copy, &copy_len, NULL, err, sizeof err), LT_OK, "%s", err);
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/adapter_config.json", job);
  lt_test_wait_until(lt_test_get_status(ca, path, NULL, 0) == 200, 20000, 100, "the artifact never showed");
  r = req(ca, "GET", path, NULL, 0);
  cr_assert(r.status == 200 && r.len == strlen(text) && memcmp(r.body, text, r.len) == 0,
            "the artifact decrypts with the job's key: %d %.*s", r.status, (int)r.len, r.body);
  lt_client_resp_free(&r);
  char body[4096] = "";
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  lt_test_wait_until(lt_test_get_status(ca, path, body, sizeof body) == 200 && strstr(body, "\"rejected\""), 20000,
                     100, "the job never showed as rejected: %s", body);

  /* Another tenant's DELETE: 404, nothing happens. */
  cr_assert_eq(status_of(cb, "DELETE", "/v1/jobs/%s", job), 404);
  cr_assert(exists(store, dek_key) && exists(store, art_key));
  /* The owner's: 200; the key, the artifacts and the staging objects are gone. */
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  r = req(ca, "DELETE", path, NULL, 0);
  cr_assert_eq(r.status, 200, "DELETE: %d %s", r.status, r.body);
  cr_expect_eq(json_integer_value(json_object_get(r.json, "objects_deleted")), 3, "%s", r.body);
  lt_client_resp_free(&r);
  cr_expect(!exists(store, dek_key), "the job's key is destroyed");
  cr_expect(!exists(store, art_key), "the artifact is deleted");
  cr_expect(!exists(store, stage_key), "the staging objects (optimizer state) are deleted");
  /* What survived elsewhere opens with nothing the service still has: not the tenant's key. */
  uint8_t *plain = malloc(copy_len);
  size_t plen;
  cr_expect_neq(lt_crypto_open(tdek, art_key, copy, copy_len, plain, copy_len, &plen, err, sizeof err), LT_OK,
                "a surviving copy decrypted with the tenant's key");
  free(plain);
  free(copy);
  /* Gone on every route, and from the list. */
  cr_expect_eq(status_of(ca, "GET", "/v1/jobs/%s", job), 410);
  cr_expect_eq(status_of(ca, "GET", "/v1/jobs/%s/artifacts", job), 410);
  cr_expect_eq(status_of(ca, "GET", "/v1/jobs/%s/artifacts/adapter_config.json", job), 410);
  cr_expect_eq(status_of(ca, "POST", "/v1/jobs/%s/cancel", job), 410);
  cr_expect_eq(status_of(cb, "GET", "/v1/jobs/%s", job), 404, "another tenant still sees nothing");
  r = req(ca, "GET", "/v1/jobs?limit=500", NULL, 0);
  cr_expect(r.status == 200 && !strstr(r.body, job), "the list still names %s: %s", job, r.body);
  lt_client_resp_free(&r);
  /* A restarted API folds the log again: still deleted. DELETE again is harmless. */
  lt_client_destroy(ca);
  lt_client_destroy(cb);
  cr_assert_neq(lt_test_proc_stop(proc, 10000), -1);
  start_api(NULL);
  cr_expect_eq(status_of(ca, "GET", "/v1/jobs/%s", job), 410, "after a restart (replay)");
  r = req(ca, "DELETE", path, NULL, 0);
  cr_expect(r.status == 200 && json_integer_value(json_object_get(r.json, "objects_deleted")) == 0, "again: %d %s",
            r.status, r.body);
  lt_client_resp_free(&r);
  lt_crypto_dek_destroy(jdek);
  lt_store_destroy(store);
  lt_keyring_destroy(kr);
  lt_crypto_kek_destroy(kek);
}

/* A download under way when its job is deleted is cut once the API folds the JobDeleted: the
 * store goes on serving a read begun before the objects were removed (S3Proxy reads an unlinked
 * file to its end), and before, the rest of the artifact reached the client after the DELETE
 * had answered. */
Test(api_data, a_download_under_way_is_cut_when_its_job_is_deleted) {
  start_api((const char *const[]){"LATHE_API_DOWNLOAD_WINDOW=262144", NULL});
  lt_crypto_kek_t *kek;
  lt_keyring_t *kr = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "master-1", MASTER_KEY, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *dek = tenant_dek(kek, &kr);
  lt_store_t *store = lt_test_store();
  char job[64], key[512], path[256];
  a_job(job, sizeof job);
  produce("control", "JobRejected",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:n,s:s,s:s,s:n}", "event_id", job, "occurred_at", 1, "producer", "test",
                    "job_id", job, "tenant_id", tenant_a, "submitted_event_id", "code", "invalid", "reason", "test",
                    "field"));
  size_t len = 32 * MIB;
  uint8_t *data = malloc(len);
  cr_assert_eq(lt_crypto_random(data, len), LT_OK);
  json_t *arts = json_array();
  seal_artifact(store, dek, job, "adapter_model.safetensors", data, len, key, sizeof key, arts);
  free(data);
  publish(job, arts);
  json_decref(arts);
  char seen[4096] = "";
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  lt_test_wait_until(lt_test_get_status(ca, path, seen, sizeof seen) == 200 && strstr(seen, "\"rejected\""), 20000, 100,
                     "the job never showed as rejected: %s", seen);
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
  lt_test_wait_until(lt_test_get_status(ca, path, seen, sizeof seen) == 200 && strstr(seen, "adapter_model"), 20000,
                     100, "the artifact never showed: %s", seen);
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/adapter_model.safetensors", job);
  int fd = socket(AF_INET, SOCK_STREAM, 0), rcv = 8192; /* little held in the kernel, whatever the host's tuning */
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                          .sin_port = htons((uint16_t)atoi(strrchr(url, ':') + 1))};
  cr_assert_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv), 0);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char head[1024], buf[65536];
  int hl = snprintf(head, sizeof head, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, key_a);
  cr_assert_eq(write(fd, head, (size_t)hl), hl);
  size_t got = 0;
  while (got < 1u << 20) {
    ssize_t n = read(fd, buf, sizeof buf);
    cr_assert_gt(n, 0, "the download ended after %zu bytes", got);
    got += (size_t)n;
  }
  /* The client stops reading; the owner deletes the job, and the API has folded it (410). */
  cr_assert_eq(status_of(ca, "DELETE", "/v1/jobs/%s", job), 200);
  int st = 0;
  lt_test_wait_until((st = status_of(ca, "GET", "/v1/jobs/%s", job)) == 410, 20000, 100, "GET after DELETE: %d", st);
  for (ssize_t n; got < len && (n = read(fd, buf, sizeof buf)) > 0;) got += (size_t)n; /* whole: no EOF (keep-alive) */
  close(fd);
  cr_expect_lt(got, len, "%zu bytes of the %zu-byte artifact reached the client after its job was deleted", got, len);
  cr_log_info("the download was cut after %zu of %zu bytes", got, len);
  cr_expect_eq(lt_test_get_status(ca, "/v1/jobs", NULL, 0), 200, "the API is still there");
  lt_store_destroy(store);
  lt_keyring_destroy(kr);
  lt_crypto_kek_destroy(kek);
}

/* ---------------------------------------------------------------- the storage quota */

Test(api_data, a_tenant_at_its_storage_quota_gets_413_naming_quota_and_usage_and_nothing_more_is_stored) {
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=1500000", NULL});
  lt_crypto_kek_t *kek;
  lt_keyring_t *kr = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "master-1", MASTER_KEY, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *tdek = tenant_dek(kek, &kr);
  lt_store_t *store = lt_test_store();
  char job[64], big_id[64], id[64];
  a_job(job, sizeof job);
  char *big = jsonl(1000000);
  lt_client_resp_t r = req(ca, "POST", "/v1/datasets?name=big", big, strlen(big));
  cr_assert_eq(r.status, 201, "1 MB under a 1.5 MB quota: %d %s", r.status, r.body);
  snprintf(big_id, sizeof big_id, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  /* Another 1 MB would pass the quota: refused at its part, naming quota, usage and upload. */
  cr_assert_eq(open_upload(ca, id, sizeof id, NULL), 201);
  char path[640];
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/1", id);
  r = req(ca, "PUT", path, big, strlen(big));
  cr_assert_eq(r.status, 413, "over the storage quota: %d %s", r.status, r.body);
  cr_expect_str_eq(err_code(&r) ? err_code(&r) : "(none)", "storage_quota_exceeded");
  cr_expect(strstr(err_msg(&r), "max_storage_bytes is 1500000") && strstr(err_msg(&r), "datasets ") &&
                strstr(err_msg(&r), "this upload would add 1000000"),
            "%s", err_msg(&r));
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/2", id);
  r = req(ca, "PUT", path, "x", 1);
  cr_expect_eq(r.status, 404, "the refused upload is gone: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  r = req(ca, "GET", "/v1/datasets", NULL, 0);
  cr_expect_eq(json_array_size(json_object_get(r.json, "datasets")), 2, "nothing more was stored: %s", r.body);
  lt_client_resp_free(&r);
  /* Artifacts count too: 600 kB published, and the tenant is over; a new job is refused. */
  json_t *arts = json_array();
  char art_key[512];
  char *blob = malloc(600000);
  memset(blob, 'w', 600000);
  seal_artifact(store, tdek, job, "adapter_model.safetensors", blob, 600000, art_key, sizeof art_key, arts);
  publish(job, arts);
  json_decref(arts);
  char list[4096] = "";
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
  lt_test_wait_until(lt_test_get_status(ca, path, list, sizeof list) == 200 && strstr(list, "safetensors"), 20000, 100,
                     "the publication never showed: %s", list);
  char body[256];
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}", big_id);
  r = req(ca, "POST", "/v1/jobs", body, strlen(body));
  cr_expect_eq(r.status, 413, "a job while over the quota: %d %s", r.status, r.body);
  cr_expect(strstr(err_msg(&r), "artifacts 600000"), "%s", err_msg(&r));
  lt_client_resp_free(&r);
  /* Another tenant is not affected. */
  r = req(cb, "POST", "/v1/datasets?name=big", big, strlen(big));
  cr_expect_eq(r.status, 201, "tenant B: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  /* Deleting the big dataset brings A under again. */
  snprintf(path, sizeof path, "/v1/datasets/%s", big_id);
  r = req(ca, "DELETE", path, NULL, 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  r = req(ca, "POST", "/v1/datasets?name=small", ONE, strlen(ONE));
  cr_expect_eq(r.status, 201, "under the quota again: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  lt_store_delete(store, art_key, NULL, 0);
  free(blob);
  free(big);
  lt_store_destroy(store);
  lt_keyring_destroy(kr);
  lt_crypto_kek_destroy(kek);
}


/* Job (or session) id of tenant A finished as rejected (a JobRejected in lathe.control), and the
 * API showing it so at base/id ("/v1/jobs" or "/v1/sessions"). */
static void finish_rejected(const char *base, const char *id) {
  produce("control", "JobRejected",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:n,s:s,s:s,s:n}", "event_id", id, "occurred_at", 1, "producer", "test",
                    "job_id", id, "tenant_id", tenant_a, "submitted_event_id", "code", "invalid", "reason", "test",
                    "field"));
  char path[128], msg[4096] = "";
  snprintf(path, sizeof path, "%s/%s", base, id);
  lt_test_wait_until(lt_test_get_status(ca, path, msg, sizeof msg) == 200 && strstr(msg, "\"rejected\""), 20000, 100,
                     "%s never showed as finished: %s", id, msg);
}

/* DELETE of a session with an Idempotency-Key, sent again (a lost answer), answers the first
 * end's seq and queues no second end; the key used for a call with a body is 422; without a key a
 * DELETE queues another end (its seq differs), as before. */
static json_int_t end_seq(const char *sess, const char *key, int *status) {
  char path[128];
  snprintf(path, sizeof path, "/v1/sessions/%s", sess);
  lt_client_resp_t r;
  cr_assert_eq(lt_client_json(ca, "DELETE", path, NULL, key, &r, err, sizeof err), LT_OK, "%s", err);
  *status = r.status;
  cr_assert(r.status == 202 || r.status == 409, "DELETE with key %s: %d %s", key ? key : "(none)", r.status, r.body);
  json_int_t seq = json_integer_value(json_object_get(r.json, "seq"));
  lt_client_resp_free(&r);
  return seq;
}

/* Two uploads open at once: their parts are in no listing of the store until they complete, so
 * each part is checked with the other uploads' parts added (before, each saw only its own, and
 * a tenant with N uploads open could store N times what its quota left). */
Test(api_data, parts_of_uploads_open_side_by_side_count_against_one_storage_quota) {
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=1500000", NULL});
  char id[2][64], path[640];
  char *part = jsonl(900000);
  for (int i = 0; i < 2; i++) cr_assert_eq(open_upload(ca, id[i], sizeof id[i], NULL), 201);
  cr_assert_eq(put_part(ca, id[0], 1, part, strlen(part)), 200, "0.9 MB under a 1.5 MB quota");
  snprintf(path, sizeof path, "/v1/uploads/%s/parts/1", id[1]);
  lt_client_resp_t r = req(ca, "PUT", path, part, strlen(part));
  cr_expect_eq(r.status, 413, "another 0.9 MB in the second upload: %d %s", r.status, r.body);
  cr_expect(strstr(err_msg(&r), "max_storage_bytes is 1500000"), "%s", err_msg(&r));
  lt_client_resp_free(&r);
  /* the first completes: 201, one dataset stored */
  snprintf(path, sizeof path, "/v1/uploads/%s/complete", id[0]);
  r = req(ca, "POST", path, NULL, 0);
  cr_expect_eq(r.status, 201, "%d %s", r.status, r.body);
  lt_client_resp_free(&r);
  r = req(ca, "GET", "/v1/datasets", NULL, 0);
  cr_expect_eq(json_array_size(json_object_get(r.json, "datasets")), 1, "%s", r.body);
  lt_client_resp_free(&r);
  /* another tenant's open upload is not tenant A's */
  char theirs[64];
  cr_assert_eq(open_upload(cb, theirs, sizeof theirs, NULL), 201);
  cr_expect_eq(put_part(cb, theirs, 1, part, strlen(part)), 200, "tenant B");
  free(part);
}

Test(api_data, a_session_end_sent_again_with_its_key_queues_one_end) {
  start_api(NULL);
  const char *open_body = "{\"base_model\":\"tiny-llama\",\"lora\":{\"rank\":4}}";
  lt_client_resp_t r = req(ca, "POST", "/v1/sessions", open_body, strlen(open_body));
  cr_assert(r.status == 201 || r.status == 202, "%d %s", r.status, r.body);
  char sess[64], path[128], msg[2048];
  snprintf(sess, sizeof sess, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  int st = 0;
  json_int_t first = end_seq(sess, "end-1", &st), again = 0;
  cr_assert(st == 202 && first > 0, "the first end: %d", st);
  for (int i = 0; i < 50 && (again = end_seq(sess, "end-1", &st), st == 409); i++) lt_test_msleep(100);
  cr_expect(st == 202 && again == first, "the same key answered %d, seq %lld; the first end was seq %lld", st,
            (long long)again, (long long)first);
  /* the key names the end: a call with a body under it is another request */
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  lt_client_header_t h = {"Idempotency-Key", "end-1"};
  const char *save = "{\"kind\":\"save_state\",\"name\":\"s\"}";
  cr_assert_eq(lt_client_request(ca, "POST", path, &h, 1, save, strlen(save), NULL, &r, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(r.status, 422, "%d %s", r.status, r.body);
  snprintf(msg, sizeof msg, "%s", r.body ? r.body : "");
  lt_client_resp_free(&r);
  cr_expect(strstr(msg, "idempotency_key_reused") && strstr(msg, "its end"), "%s", msg);
  /* without a key, a DELETE is another end */
  json_int_t other = end_seq(sess, NULL, &st);
  cr_expect(st == 202 && other != first, "a DELETE without a key: %d, seq %lld", st, (long long)other);
  /* in the log: two ends, the keyed one once */
  lt_test_tail_t *t = lt_test_tail_open(NULL, (const char *const[]){"calls", NULL});
  lt_test_tail_settle(t, 1500);
  json_t *calls = lt_test_tail_select(t, NULL, "SessionCall", sess, 0), *rec;
  int ends = 0;
  size_t i;
  json_array_foreach(calls, i, rec) ends += strcmp(lt_test_rs(rec, "kind") ? lt_test_rs(rec, "kind") : "", "end") == 0;
  cr_expect_eq(ends, 2, "end calls recorded for the session: %d", ends);
  json_decref(calls);
  lt_test_tail_close(t);
  /* finished (here: rejected), a retry of the keyed DELETE still answers its end's seq; a DELETE
   * under a key never used answers 200 with the session */
  finish_rejected("/v1/sessions", sess);
  snprintf(path, sizeof path, "/v1/sessions/%s", sess);
  again = end_seq(sess, "end-1", &st);
  cr_expect(st == 202 && again == first, "the keyed DELETE after the end: %d, seq %lld", st, (long long)again);
  cr_assert_eq(lt_client_json(ca, "DELETE", path, NULL, "end-2", &r, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(r.status, 200, "a new key after the end: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
}

/* A session's saved states and a job's checkpoints (staging) count in the storage quota with the
 * datasets: over it, an upload, a submission and a session's save_state are refused (413, naming
 * "datasets and checkpoints"), a call that saves nothing is not; DELETE of the finished job whose
 * checkpoint it was brings the tenant under at once (no stale measure). (Before, checkpoints did
 * not count: a live session could save states without bound.) */
Test(api_data, checkpoints_count_in_the_storage_quota_and_a_session_cannot_save_past_it) {
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=1500000", NULL});
  lt_store_t *store = lt_test_store();
  const char *open_body = "{\"base_model\":\"tiny-llama\",\"lora\":{\"rank\":4}}";
  lt_client_resp_t r = req(ca, "POST", "/v1/sessions", open_body, strlen(open_body));
  cr_assert(r.status == 201 || r.status == 202, "a session under the quota: %d %s", r.status, r.body);
  char sess[64], job[64], ds[64], path[256], key[512], msg[2048], body[256];
  snprintf(sess, sizeof sess, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  r = req(ca, "POST", "/v1/datasets?name=small", ONE, strlen(ONE));
  cr_assert_eq(r.status, 201, "%s", r.body);
  snprintf(ds, sizeof ds, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  /* a finished job, and what a worker saved for it: 1.6 MB under the tenant's staging prefix */
  a_job(job, sizeof job);
  finish_rejected("/v1/jobs", job);
  size_t ck = 1600000;
  char *state = malloc(ck);
  memset(state, 's', ck);
  snprintf(key, sizeof key, "staging/%s/%s/1/3/state.bin", tenant_a, job);
  cr_assert_eq(lt_store_put(store, key, state, ck, NULL, err, sizeof err), LT_OK, "%s", err);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"s1\"}", msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "storage_quota_exceeded") && strstr(msg, "datasets and checkpoints 16") &&
                strstr(msg, "and a save_state keeps a state while the session lives"),
            "%s", msg);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}", msg, sizeof msg), 202,
               "a call that saves nothing: %s", msg);
  cr_expect_eq(post_status(ca, "/v1/datasets?name=small", ONE, msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "datasets and checkpoints 16"), "%s", msg);
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}", ds);
  cr_expect_eq(post_status(ca, "/v1/jobs", body, msg, sizeof msg), 413, "a job while over: %s", msg);
  cr_expect(strstr(msg, "a new job's artifacts would add to it"), "%s", msg);
  /* another tenant's checkpoints are not tenant A's */
  cr_expect_eq(post_status(cb, "/v1/datasets?name=small", ONE, msg, sizeof msg), 201, "tenant B: %s", msg);
  /* the finished job deleted with its checkpoint: under the quota again at once */
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  r = req(ca, "DELETE", path, NULL, 0);
  cr_assert_eq(r.status, 200, "DELETE: %d %s", r.status, r.body);
  lt_client_resp_free(&r);
  cr_expect(!exists(store, key), "the checkpoint went with the job");
  cr_expect_eq(post_status(ca, "/v1/jobs", body, msg, sizeof msg), 201, "a job right after the DELETE: %s", msg);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"s1\"}", msg, sizeof msg), 202, "%s", msg);
  free(state);
  lt_store_destroy(store);
}

/* A session of client c's tenant into id (capacity 64). */
static void open_session(lt_client_t *c, char *id) {
  const char *open_body = "{\"base_model\":\"tiny-llama\",\"lora\":{\"rank\":4}}";
  lt_client_resp_t r = req(c, "POST", "/v1/sessions", open_body, strlen(open_body));
  cr_assert(r.status == 201 || r.status == 202, "a session: %d %s", r.status, r.body);
  snprintf(id, 64, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

/* What a worker records when tenant A's session call seq completes (a save, here). */
static void call_completed(const char *sess, json_int_t seq, const char *event_id) {
  produce("progress", "PrimitiveCompleted",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:I,s:s,s:s,s:i,s:i,s:f,s:i}", "event_id", event_id, "occurred_at", 1,
                    "producer", "test", "job_id", sess, "tenant_id", tenant_a, "attempt", 0, "seq", seq, "kind",
                    "save_state", "status", "done", "step", 0, "tokens", 0, "duration_ms", 1.0, "result_bytes", 0));
}

/* A burst of saving calls, each checked before any of their states is written, counts the states
 * to come, each as the tenant's largest checkpoint stored now. No worker runs here, so a call
 * completes only when the test records its PrimitiveCompleted: with one checkpoint of 1 MB stored
 * under a 10 MB quota, nine save_state calls are taken and the tenth is refused (413, naming the
 * calls in flight), and so is it again (a refused call is not counted); a call that saves nothing
 * is still taken; a restarted API counts them again from lathe.calls; once one of the nine
 * completed, one more is taken; tenant B's saves are its own; once the session ends, its saves no
 * longer count. (Before, every one was taken: a tenant at
 * 99 % of its quota could store a state per call.) */
static void put_checkpoint(lt_store_t *store, const char *tenant, const char *job) {
  static const char *const names[] = {"state.bin", "adapter_model.safetensors"};
  size_t sizes[] = {600000, 400000};
  char key[512];
  for (int i = 0; i < 2; i++) {
    char *bytes = malloc(sizes[i]);
    memset(bytes, 'c', sizes[i]);
    snprintf(key, sizeof key, "staging/%s/%s/1/3/%s", tenant, job, names[i]);
    cr_assert_eq(lt_store_put(store, key, bytes, sizes[i], NULL, err, sizeof err), LT_OK, "%s", err);
    free(bytes);
  }
}

Test(api_data, a_burst_of_saving_calls_counts_the_states_they_will_write) {
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=10000000", NULL});
  lt_store_t *store = lt_test_store();
  char sess[64], sess2[64], sess_b[64], job[64], path[256], msg[2048], body[128];
  open_session(ca, sess);
  open_session(ca, sess2);
  open_session(cb, sess_b);
  /* what a worker saved for a finished job of A, and for B's session: 1 MB in two objects each */
  a_job(job, sizeof job);
  finish_rejected("/v1/jobs", job);
  put_checkpoint(store, tenant_a, job);
  put_checkpoint(store, tenant_b, sess_b);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  int taken = 0, st = 0;
  json_int_t first_seq = 0;
  for (int i = 1; i <= 12; i++) {
    snprintf(body, sizeof body, "{\"kind\":\"save_state\",\"name\":\"s%d\"}", i);
    st = post_status(ca, path, body, msg, sizeof msg);
    cr_assert(st == 202 || st == 413, "save %d: %d %s", i, st, msg);
    if (st == 413) break;
    if (!taken++) {
      json_t *ans = json_loads(msg, 0, NULL);
      first_seq = json_integer_value(json_object_get(ans, "seq"));
      json_decref(ans);
    }
  }
  cr_expect_eq(taken, 9, "saving calls taken under a 10 MB quota with 1 MB stored: %d", taken);
  cr_expect(strstr(msg, "storage_quota_exceeded") && strstr(msg, "the 9 saving call(s) taken before this save_state") &&
                strstr(msg, "about 1000000 bytes each"),
            "%s", msg);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"again\"}", msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "the 9 saving call(s)"), "a refused call is not counted: %s", msg);
  /* a restarted API reads the nine back from lathe.calls (as another API process would): still
   * counted */
  lt_client_destroy(ca);
  lt_client_destroy(cb);
  lt_test_proc_stop_clean(proc, 10000);
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=10000000", NULL});
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"again\"}", msg, sizeof msg), 413,
               "after a restart: %s", msg);
  cr_expect(strstr(msg, "the 9 saving call(s)"), "after a restart: %s", msg);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}", msg, sizeof msg), 202,
               "a call that saves nothing: %s", msg);
  /* the calls in flight are the tenant's, across its sessions */
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess2);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_weights_for_sampler\",\"name\":\"w\"}", msg, sizeof msg), 413,
               "another session of A: %s", msg);
  /* B, with a checkpoint of its own, is not held by A's nine */
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess_b);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(post_status(cb, path, "{\"kind\":\"save_state\",\"name\":\"b\"}", msg, sizeof msg), 202,
                 "tenant B, save %d: %s", i, msg);
  /* the first of the nine completes (what a worker records): one more is taken */
  call_completed(sess, first_seq, "pc-burst-1");
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess2);
  for (int i = 0; i < 100 && (st = post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"w\"}", msg, sizeof msg)) == 413; i++)
    lt_test_msleep(100);
  cr_expect_eq(st, 202, "once one of the nine completed: %s", msg);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"w2\"}", msg, sizeof msg), 413,
               "and then nine are in flight again: %s", msg);
  /* the first session ended: its eight states will never be written */
  finish_rejected("/v1/sessions", sess);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_weights_for_sampler\",\"name\":\"w3\"}", msg, sizeof msg), 202,
               "after the session with the eight ended: %s", msg);
  lt_store_destroy(store);
}

/* A tenant's first burst, before any checkpoint of it is stored: each call in flight counts as
 * what its session's checkpoint writes at least, known from the base model's config.json (the
 * adapter, f32, and the state file with both AdamW moments). Model "quota-model" here: hidden
 * 512, FFN 1024, 8 layers of 8 heads of 64; a session of rank 4 over all seven modules holds
 * 8 x 4 x (4 x 1024 + 3 x 1536) = 278,528 parameters, so 16 bytes each and the state file's
 * 208 bytes of framing make 4,456,656 bytes. Under a 20 MB quota with nothing stored, five are
 * taken (the fifth sees four coming, 17.8 MB) and the sixth is refused (five, 22.3 MB), naming
 * the bytes; after a restart too (the calls read back from lathe.calls); a session on a base
 * model this API has no config of counts nothing until a checkpoint is stored (the gap left:
 * docs/DESIGN.md §6). Before, all twelve were taken. */
Test(api_data, a_first_burst_of_saving_calls_counts_the_states_their_base_model_makes) {
  char models[128], dir[192], path[256], msg[2048], body[128], sess[64], other[64];
  snprintf(models, sizeof models, "/tmp/test_api_data.models.%d", (int)getpid());
  snprintf(dir, sizeof dir, "%s/quota-model", models);
  mkdir(models, 0755);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *fp = fopen(path, "w");
  cr_assert(fp);
  fputs("{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":1000,"
        "\"hidden_size\":512,\"intermediate_size\":1024,\"num_hidden_layers\":8,\"num_attention_heads\":8,"
        "\"num_key_value_heads\":8,\"max_position_embeddings\":512,\"rms_norm_eps\":1e-5,\"rope_theta\":10000,"
        "\"hidden_act\":\"silu\",\"tie_word_embeddings\":true}",
        fp);
  fclose(fp);
  char env_models[192];
  snprintf(env_models, sizeof env_models, "LATHE_MODELS_DIR=%s", models);
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=20000000", env_models, NULL});
  const char *open_body = "{\"base_model\":\"quota-model\",\"lora\":{\"rank\":4}}";
  lt_client_resp_t r = req(ca, "POST", "/v1/sessions", open_body, strlen(open_body));
  cr_assert(r.status == 201 || r.status == 202, "a session: %d %s", r.status, r.body);
  snprintf(sess, sizeof sess, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  int taken = 0, st = 0;
  for (int i = 1; i <= 12; i++) {
    snprintf(body, sizeof body, "{\"kind\":\"save_state\",\"name\":\"s%d\"}", i);
    st = post_status(ca, path, body, msg, sizeof msg);
    cr_assert(st == 202 || st == 413, "save %d: %d %s", i, st, msg);
    if (st == 413) break;
    taken++;
  }
  cr_expect_eq(taken, 5, "saving calls taken under a 20 MB quota, nothing stored: %d", taken);
  cr_expect(strstr(msg, "storage_quota_exceeded") && strstr(msg, "the 5 saving call(s) taken before this save_state") &&
                strstr(msg, "at least 22283280 bytes in all"),
            "%s", msg);
  lt_client_destroy(ca);
  lt_client_destroy(cb);
  lt_test_proc_stop_clean(proc, 10000);
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=20000000", env_models, NULL});
  for (int i = 0; i < 100 && (st = post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"again\"}", msg,
                                               sizeof msg)) == 503; i++)
    lt_test_msleep(100);
  cr_expect_eq(st, 413, "after a restart: %s", msg);
  cr_expect(strstr(msg, "the 5 saving call(s)") && strstr(msg, "at least 22283280 bytes"), "after a restart: %s", msg);
  /* a session on a base model with no config here: its first burst is not held by its own calls */
  open_session(cb, other);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", other);
  for (int i = 0; i < 6; i++)
    cr_expect_eq(post_status(cb, path, "{\"kind\":\"save_state\",\"name\":\"b\"}", msg, sizeof msg), 202,
                 "a base model without a config here, save %d: %s", i, msg);
  snprintf(path, sizeof path, "%s/config.json", dir);
  unlink(path);
  rmdir(dir);
  rmdir(models);
}

/* A call's seq, from its 202. */
static json_int_t call_seq(const char *sess, const char *body) {
  char path[160], msg[2048];
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  cr_assert_eq(post_status(ca, path, body, msg, sizeof msg), 202, "%s", msg);
  json_t *ans = json_loads(msg, 0, NULL);
  json_int_t seq = json_integer_value(json_object_get(ans, "seq"));
  json_decref(ans);
  return seq;
}

/* What the worker records when session sess's call seq ends in attempt: done (with the name of
 * a state it saved), or failed with code. */
static const char *g_reason = "the attempt that ran it was lost";

static void call_ended(const char *sess, int attempt, json_int_t seq, const char *kind, const char *name, const char *code,
                       const char *event_id) {
  json_t *r = json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:I,s:s,s:s,s:i,s:i,s:f,s:i}", "event_id", event_id, "occurred_at", 1,
                        "producer", "test", "job_id", sess, "tenant_id", tenant_a, "attempt", attempt, "seq", seq,
                        "kind", kind, "status", code ? "failed" : "done", "step", 0, "tokens", 0, "duration_ms", 1.0,
                        "result_bytes", 0);
  if (name) json_object_set_new(r, "checkpoint_name", json_string(name));
  if (code) {
    json_object_set_new(r, "error_code", json_string(code));
    json_object_set_new(r, "error_reason", json_string(g_reason));
  }
  produce("progress", "PrimitiveCompleted", r);
}

/* Call seq of sess as the API answers it now (?wait=0): its status, and its error code if any. */
static void call_now(const char *sess, json_int_t seq, char *status, size_t sn, char *code, size_t cn) {
  char path[160];
  snprintf(path, sizeof path, "/v1/sessions/%s/calls/%lld?wait=0", sess, (long long)seq);
  lt_client_resp_t r = req(ca, "GET", path, NULL, 0);
  const char *st = json_string_value(json_object_get(r.json, "status"));
  const char *co = json_string_value(json_object_get(json_object_get(r.json, "error"), "code"));
  snprintf(status, sn, "%s", st ? st : "?");
  snprintf(code, cn, "%s", co ? co : "");
  lt_client_resp_free(&r);
}

/* A session's attempt 1 is lost after call s1 (save_state "a", in the checkpoint attempt 2
 * resumes from) and call s2 (run on a state that is gone). The log, read in any order across
 * its topics, says: s1 done by attempt 1 — attempt 2 does not answer it again — and s2 failed
 * session_restarted by attempt 2, though attempt 1's done for it comes later. Here the API reads
 * attempt 2's dispatch before attempt 1's answers, as any API may on a replay (the topics are
 * read side by side). Before, it dropped every answer of attempt 1 once it knew attempt 2: s1
 * stayed pending for good and "a" was no saved state (load_state "a": 400). */
Test(api_data, a_lost_attempts_answers_stand_where_the_next_attempt_gives_none_in_any_read_order) {
  start_api(NULL);
  char sess[64], path[160], msg[4096], status[32], code[64];
  open_session(ca, sess);
  json_int_t s1 = call_seq(sess, "{\"kind\":\"save_state\",\"name\":\"a\"}");
  json_int_t s2 = call_seq(sess, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}");
  json_int_t s3 = call_seq(sess, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}");
  produce("control", "JobAccepted",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:s,s:i,s:i}", "event_id", "acc-r", "occurred_at", 1, "producer", "test",
                    "job_id", sess, "tenant_id", tenant_a, "submitted_event_id", sess, "priority", "standard", "gpus",
                    1, "max_duration_s", 3600));
  for (int attempt = 1; attempt <= 2; attempt++) {
    char ev[16];
    snprintf(ev, sizeof ev, "dis-r%d", attempt);
    produce("control", "JobDispatched",
            json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:s,s:s,s:n,s:{},s:s,s:i,s:i,s:s,s:s,s:i,s:i,s:i,s:n,s:n}",
                      "event_id", ev, "occurred_at", 2, "producer", "test", "job_id", sess, "tenant_id", tenant_a,
                      "attempt", attempt, "base_model", "tiny-llama", "dataset_id", "", "validation_dataset_id",
                      "hyperparameters", "priority", "standard", "max_duration_s", 3600, "gpus", 1, "mode",
                      "interactive", "worker_id", "w1", "memory_bytes", 0, "lease_ms", 60000, "lease_deadline", 3,
                      "resume_step", "resume_checkpoint_event_id", "gang_rendezvous"));
    if (attempt == 2) break;
    produce("control", "AttemptStopped",
            json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:s,s:b,s:i,s:n}", "event_id", "stop-r1", "occurred_at", 3, "producer",
                      "test", "job_id", sess, "tenant_id", tenant_a, "attempt", 1, "reason", "lost", "killed", 0,
                      "step", 0, "detail"));
  }
  snprintf(path, sizeof path, "/v1/sessions/%s", sess);
  lt_test_wait_until(lt_test_get_status(ca, path, msg, sizeof msg) == 200 && strstr(msg, "\"attempt\":2"), 20000, 100,
                     "the API never read attempt 2's dispatch: %s", msg);
  call_ended(sess, 1, s1, "save_state", "a", NULL, "pc-r1");
  call_ended(sess, 2, s2, "optim_step", NULL, "session_restarted", "pc-r2");
  call_ended(sess, 1, s2, "optim_step", NULL, NULL, "pc-r3");
  call_ended(sess, 2, s3, "optim_step", NULL, NULL, "pc-r4"); /* after the others in the partition */
  for (int round = 0; round < 2; round++) { /* as read live, then as a restarted API reads the log */
    lt_test_wait_until((call_now(sess, s3, status, sizeof status, code, sizeof code), strcmp(status, "done") == 0),
                       10000, 100, "call %lld, the last answer, never read (round %d)", (long long)s3, round);
    lt_test_wait_until((call_now(sess, s1, status, sizeof status, code, sizeof code), strcmp(status, "pending") != 0),
                       10000, 100, "call %lld still pending (round %d)", (long long)s1, round);
    cr_expect_str_eq(status, "done", "s1, answered by the lost attempt alone (round %d)", round);
    lt_test_wait_until(lt_test_get_status(ca, path, msg, sizeof msg) == 200 && strstr(msg, "\"name\":\"a\""), 10000,
                       100, "the state s1 saved is not the session's (round %d): %s", round, msg);
    call_now(sess, s2, status, sizeof status, code, sizeof code);
    cr_expect(strcmp(status, "failed") == 0 && strcmp(code, "session_restarted") == 0,
              "s2, answered by both attempts: the newer's stands (round %d): %s %s", round, status, code);
    if (round) break;
    lt_client_destroy(ca);
    lt_client_destroy(cb);
    lt_test_proc_stop_clean(proc, 10000);
    start_api(NULL);
  }
}

/* A call's error as the executor wrote it may name its files (a state it could not load, in its
 * private directory): the answer shows "(path)" instead, as a job's failure reason does. */
Test(api_data, a_calls_error_names_no_server_path) {
  start_api(NULL);
  char sess[64], path[160];
  open_session(ca, sess);
  json_int_t s1 = call_seq(sess, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}");
  g_reason = "the saved state a does not load: /dev/shm/lathe-exec/j-1-Ab3dEf/load-7.bin: truncated header";
  call_ended(sess, 0, s1, "load_state", NULL, "internal", "pc-path");
  g_reason = "the attempt that ran it was lost";
  snprintf(path, sizeof path, "/v1/sessions/%s/calls/%lld?wait=30", sess, (long long)s1);
  lt_client_resp_t r = req(ca, "GET", path, NULL, 0);
  const char *m = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
  cr_expect(m && strstr(m, "does not load: (path): truncated header") && !strstr(m, "/dev/shm"), "%d %s", r.status,
            r.body);
  lt_client_resp_free(&r);
}

/* Under a storage quota each saving call in flight is kept and walked at the next one: a tenant
 * may have max_saving_calls of them (here 2) before a third is refused (429 naming the limit),
 * whatever its stored bytes; another tenant is not held by them; one that completes frees a place. */
Test(api_data, saving_calls_in_flight_are_capped_per_tenant) {
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=10000000", "LATHE_API_MAX_SAVING_CALLS=2", NULL});
  char sess[64], sess_b[64], path[256], msg[2048];
  open_session(ca, sess);
  open_session(cb, sess_b);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  json_int_t first_seq = 0;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"s\"}", msg, sizeof msg), 202, "%s", msg);
    json_t *ans = json_loads(msg, 0, NULL);
    if (!i) first_seq = json_integer_value(json_object_get(ans, "seq"));
    json_decref(ans);
  }
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"s\"}", msg, sizeof msg), 429, "%s", msg);
  cr_expect(strstr(msg, "over_quota") && strstr(msg, "has 2 saving calls") && strstr(msg, "max_saving_calls is 2"), "%s", msg);
  cr_expect_eq(post_status(ca, path, "{\"kind\":\"optim_step\",\"adam\":{\"lr\":0.001}}", msg, sizeof msg), 202,
               "a call that saves nothing: %s", msg);
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess_b);
  cr_expect_eq(post_status(cb, path, "{\"kind\":\"save_state\",\"name\":\"b\"}", msg, sizeof msg), 202, "tenant B: %s", msg);
  call_completed(sess, first_seq, "pc-cap-1");
  snprintf(path, sizeof path, "/v1/sessions/%s/calls", sess);
  int st = 0;
  for (int i = 0; i < 100 && (st = post_status(ca, path, "{\"kind\":\"save_state\",\"name\":\"s\"}", msg, sizeof msg)) == 429; i++)
    lt_test_msleep(100);
  cr_expect_eq(st, 202, "once one completed: %s", msg);
}

/* POST path with body as client c: the status, the answer's body into msg. */
static int post_status(lt_client_t *c, const char *path, const char *body, char *msg, size_t msgn) {
  lt_client_resp_t r = req(c, "POST", path, body, strlen(body));
  int st = r.status;
  if (msg) snprintf(msg, msgn, "%s", r.body ? r.body : "");
  lt_client_resp_free(&r);
  return st;
}

/* A tenant's own storage quota (TenantUpserted v2, `lathe admin tenant --max-storage-bytes`)
 * replaces the API's figure for that tenant alone, lower or higher; set back to 0, the API's
 * applies again. */
Test(api_data, a_tenants_own_storage_quota_replaces_the_apis_for_that_tenant_alone) {
  char low[64], high[64], key_low[128], key_high[128], rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1], msg[2048];
  lt_crypto_random_id(rnd);
  snprintf(low, sizeof low, "low-%.10s", rnd);
  snprintf(high, sizeof high, "high-%.10s", rnd);
  lt_test_tenant_create(low, "--max-storage-bytes 500000", key_low, sizeof key_low);
  lt_test_tenant_create(high, "--max-storage-bytes 2500000", key_high, sizeof key_high);
  start_api((const char *const[]){"LATHE_API_MAX_STORAGE_BYTES=1500000", NULL});
  lt_client_t *cl = lt_test_client(url, key_low, 120), *ch = lt_test_client(url, key_high, 120);
  lt_test_wait_until(lt_test_get_status(cl, "/v1/jobs", NULL, 0) == 200 && lt_test_get_status(ch, "/v1/jobs", NULL, 0) == 200,
                     20000, 100, "the API never accepted the new tenants' keys");
  char *big = jsonl(1000000);
  /* below the API's 1.5 MB, above its own 500 kB: refused, naming its own quota */
  cr_expect_eq(post_status(cl, "/v1/datasets?name=q", big, msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "max_storage_bytes is 500000") && strstr(msg, low), "%s", msg);
  /* above the API's 1.5 MB, within its own 2.5 MB: two fit, a third does not */
  cr_expect_eq(post_status(ch, "/v1/datasets?name=q", big, msg, sizeof msg), 201, "%s", msg);
  cr_expect_eq(post_status(ch, "/v1/datasets?name=q", big, msg, sizeof msg), 201, "2 MB under its own 2.5 MB: %s", msg);
  cr_expect_eq(post_status(ch, "/v1/datasets?name=q", big, msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "max_storage_bytes is 2500000"), "%s", msg);
  /* tenant A has none of its own: the API's figure, as before */
  cr_expect_eq(post_status(ca, "/v1/datasets?name=q", big, msg, sizeof msg), 201, "%s", msg);
  cr_expect_eq(post_status(ca, "/v1/datasets?name=q", big, msg, sizeof msg), 413, "%s", msg);
  cr_expect(strstr(msg, "max_storage_bytes is 1500000"), "%s", msg);
  /* the low tenant's own quota set back to 0: the API's 1.5 MB applies to it once it reads that */
  char cmd[512];
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant update %s --max-storage-bytes 0 --json", lt_test_lathe_bin(), low);
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  cr_expect(strstr(out, "\"max_storage_bytes\":0"), "%s", out);
  free(out);
  lt_test_wait_until(post_status(cl, "/v1/datasets?name=q", big, msg, sizeof msg) == 201, 20000, 200,
                     "the API never applied the tenant's quota set back to 0: %s", msg);
  lt_client_destroy(cl);
  lt_client_destroy(ch);
  free(big);
}

/* A tenant quota with no API-wide figure, set after the tenant's datasets were stored (so this API
 * never measured them): a job submission measures them first (off the loop) and is refused while
 * they are over the quota, then accepted once a delete brings them under. */
Test(api_data, a_storage_quota_set_after_the_uploads_is_checked_on_the_next_submission) {
  start_api(NULL);
  char *big = jsonl(1000000), ids[2][64], msg[2048], body[256], path[128], cmd[512];
  for (int i = 0; i < 2; i++) {
    lt_client_resp_t r = req(ca, "POST", "/v1/datasets?name=big", big, strlen(big));
    cr_assert_eq(r.status, 201, "no quota yet: %d %s", r.status, r.body);
    snprintf(ids[i], sizeof ids[i], "%s", json_string_value(json_object_get(r.json, "id")));
    lt_client_resp_free(&r);
  }
  int rc;
  snprintf(cmd, sizeof cmd, "'%s' admin tenant update %s --max-storage-bytes 1500000 --json", lt_test_lathe_bin(), tenant_a);
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  free(out);
  snprintf(body, sizeof body, "{\"base_model\":\"tiny-llama\",\"dataset_id\":\"%s\"}", ids[0]);
  int st = 0;
  lt_test_wait_until((st = post_status(ca, "/v1/jobs", body, msg, sizeof msg)) == 413, 20000, 200,
                     "2 MB stored under a 1.5 MB quota set afterwards: a submission got %d %s", st, msg);
  cr_expect(strstr(msg, "max_storage_bytes is 1500000") && strstr(msg, "datasets and checkpoints 2"), "%s", msg);
  snprintf(path, sizeof path, "/v1/datasets/%s", ids[1]);
  lt_client_resp_t r = req(ca, "DELETE", path, NULL, 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  st = post_status(ca, "/v1/jobs", body, msg, sizeof msg);
  cr_expect_eq(st, 201, "1 MB under the quota: %d %s", st, msg);
  free(big);
}

/* ---------------------------------------------------------------- lathe jobs download, checkpoints */

/* `lathe jobs VERB ARGS` as tenant A (or B) against this API: exit status in *rc, output taken. */
static char *cli(const char *key, const char *args, int *rc) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "LATHE_API_URL=%s LATHE_API_KEY=%s '%s' jobs %s 2>&1", url, key, lt_test_lathe_bin(), args);
  return lt_test_run(cmd, rc);
}

static bool file_is(const char *path, const void *data, size_t len) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char *buf = malloc(len + 1);
  size_t got = fread(buf, 1, len + 1, f);
  fclose(f);
  bool same = got == len && memcmp(buf, data, len) == 0;
  free(buf);
  return same;
}

Test(api_data, jobs_download_checks_every_sha256_and_jobs_checkpoints_lists_the_live_attempts_commits) {
  start_api(NULL);
  lt_crypto_kek_t *kek;
  lt_keyring_t *kr = NULL;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "master-1", MASTER_KEY, err, sizeof err), LT_OK, "%s", err);
  const lt_crypto_dek_t *dek = tenant_dek(kek, &kr);
  lt_store_t *store = lt_test_store();
  char job[64], k1[512], k2[512], dir[128], args[512], path[256], list[4096] = "";
  a_job(job, sizeof job);
  const char *cfg = "{\"r\":4}";
  size_t len = 300000;
  uint8_t *data = malloc(len);
  cr_assert_eq(lt_crypto_random(data, len), LT_OK);
  json_t *arts = json_array();
  seal_artifact(store, dek, job, "adapter_model.safetensors", data, len, k1, sizeof k1, arts);
  seal_artifact(store, dek, job, "adapter_config.json", cfg, strlen(cfg), k2, sizeof k2, arts);
  publish(job, arts);
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
  lt_test_wait_until(lt_test_get_status(ca, path, list, sizeof list) == 200 && strstr(list, "adapter_config"), 20000,
                     100, "the publication never showed: %s", list);
  /* Whole and verified: both files under their names, no partial one left. */
  snprintf(dir, sizeof dir, "/tmp/test_api_data.%d.dl", (int)getpid());
  snprintf(args, sizeof args, "download %s %s", job, dir);
  int rc;
  char *out = cli(key_a, args, &rc), f1[256], f2[256], part[256];
  cr_expect_eq(rc, 0, "%s", out);
  cr_expect(strstr(out, "adapter_model.safetensors") && strstr(out, "ok"), "%s", out);
  free(out);
  snprintf(f1, sizeof f1, "%s/adapter_model.safetensors", dir);
  snprintf(f2, sizeof f2, "%s/adapter_config.json", dir);
  snprintf(part, sizeof part, "%s/.adapter_config.json.part", dir);
  cr_expect(file_is(f1, data, len), "%s is the artifact", f1);
  cr_expect(file_is(f2, cfg, strlen(cfg)), "%s is the artifact", f2);
  unlink(f1);
  unlink(f2);
  /* The listing says another sha256 for one file (a second publication replaces the first):
   * that file is named, neither it nor its partial file stays, the other one lands, exit 1. */
  json_t *bad = json_deep_copy(arts);
  json_object_set_new(json_array_get(bad, 1), "sha256", json_string("00" "11223344556677889900112233445566778899"
                                                                       "00112233445566778899001122334455"));
  publish(job, bad);
  json_decref(bad);
  lt_test_wait_until(lt_test_get_status(ca, path, list, sizeof list) == 200 && strstr(list, "\"0011223344"), 20000,
                     100, "the second publication never showed: %s", list);
  out = cli(key_a, args, &rc);
  cr_expect_eq(rc, 1, "%s", out);
  cr_expect(strstr(out, "adapter_config.json: sha256") && strstr(out, "does not match"), "%s", out);
  free(out);
  struct stat st;
  cr_expect(stat(f2, &st) != 0 && stat(part, &st) != 0, "no file and no partial file for the mismatch");
  cr_expect(file_is(f1, data, len), "the verified one landed");
  unlink(f1);
  rmdir(dir);
  /* Another tenant: 404 from the API, exit 1 from the CLI. */
  snprintf(args, sizeof args, "download %s %s", job, dir);
  out = cli(key_b, args, &rc);
  cr_expect(rc == 1 && strstr(out, "404"), "%d %s", rc, out);
  free(out);
  json_decref(arts);

  /* Checkpoints: attempt 1 commits steps 10 and 20 (an evaluation at 20); attempt 2 was never
   * dispatched, so its commit is fenced and not listed. */
  produce("control", "JobAccepted",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:s,s:s,s:i,s:i}", "event_id", "acc", "occurred_at", 1, "producer", "test",
                    "job_id", job, "tenant_id", tenant_a, "submitted_event_id", job, "priority", "standard", "gpus", 1,
                    "max_duration_s", 3600));
  produce("control", "JobDispatched",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:s,s:s,s:n,s:{},s:s,s:i,s:i,s:s,s:n,s:i,s:i,s:i,s:n,s:n}", "event_id",
                    "dis", "occurred_at", 2, "producer", "test", "job_id", job, "tenant_id", tenant_a, "attempt", 1,
                    "base_model", "tiny-llama", "dataset_id", "d", "validation_dataset_id", "hyperparameters",
                    "priority", "standard", "max_duration_s", 3600, "gpus", 1, "mode", "managed", "worker_id",
                    "memory_bytes", 0, "lease_ms", 60000, "lease_deadline", 3, "resume_step",
                    "resume_checkpoint_event_id", "gang_rendezvous"));
  const int64_t at[3] = {1764000000000, 1764000060000, 1764000120000};
  for (int i = 0; i < 3; i++)
    produce("control", "CheckpointCommitted",
            json_pack("{s:s,s:I,s:s,s:s,s:s,s:i,s:i,s:[s],s:s,s:i,s:b,s:s}", "event_id", i == 0 ? "c1" : i == 1 ? "c2" : "c3",
                      "occurred_at", (json_int_t)at[i], "producer", "test", "job_id", job, "tenant_id", tenant_a,
                      "attempt", i == 2 ? 2 : 1, "step", 10 * (i + 1), "object_keys", "k", "sha256", "", "bytes",
                      1000 + i, "final", i == 1, "trigger", "interval"));
  produce("progress", "EvalCompleted",
          json_pack("{s:s,s:i,s:s,s:s,s:s,s:i,s:i,s:b,s:i,s:[{s:s,s:f,s:n,s:n,s:n}],s:s}", "event_id", "ev",
                    "occurred_at", 4, "producer", "test", "job_id", job, "tenant_id", tenant_a, "attempt", 1, "step",
                    20, "final", 1, "examples", 8, "metrics", "name", "exact_match", "value", 0.75, "base_value",
                    "ci_low", "ci_high", "config_digest", ""));
  snprintf(path, sizeof path, "/v1/jobs/%s/checkpoints", job);
  lt_test_wait_until(lt_test_get_status(ca, path, list, sizeof list) == 200 && strstr(list, "exact_match"), 20000, 100,
                     "the checkpoints never showed: %s", list);
  lt_client_resp_t r = req(ca, "GET", path, NULL, 0);
  json_t *cks = json_object_get(r.json, "checkpoints");
  cr_assert_eq(json_array_size(cks), 2, "attempt 1's two commits only: %s", r.body);
  json_t *c0 = json_array_get(cks, 0), *c1 = json_array_get(cks, 1);
  cr_expect(json_integer_value(json_object_get(c0, "step")) == 10 && json_integer_value(json_object_get(c1, "step")) == 20,
            "%s", r.body);
  cr_expect(json_integer_value(json_object_get(c1, "committed_at")) == at[1] && json_is_true(json_object_get(c1, "final")) &&
                json_integer_value(json_object_get(c1, "bytes")) == 1001, "%s", r.body);
  cr_expect(!json_object_get(c0, "metrics") &&
                json_real_value(json_object_get(json_array_get(json_object_get(c1, "metrics"), 0), "value")) == 0.75,
            "the evaluation at step 20 beside its checkpoint: %s", r.body);
  lt_client_resp_free(&r);
  cr_expect_eq(lt_test_get_status(cb, path, NULL, 0), 404, "another tenant's job");
  snprintf(args, sizeof args, "checkpoints %s", job);
  out = cli(key_a, args, &rc);
  cr_expect(rc == 0 && strstr(out, "2025-11-24 16:01:00") && strstr(out, "exact_match 0.75"), "%s", out);
  free(out);
  out = cli(key_b, args, &rc);
  cr_expect(rc == 1 && strstr(out, "404"), "another tenant from the CLI: %d %s", rc, out);
  free(out);
  lt_store_delete(store, k1, NULL, 0);
  lt_store_delete(store, k2, NULL, 0);
  free(data);
  lt_store_destroy(store);
  lt_keyring_destroy(kr);
  lt_crypto_kek_destroy(kek);
}
