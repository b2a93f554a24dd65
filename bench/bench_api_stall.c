/* bench_api_stall: what one tenant's uploads cost another tenant's small requests. Tenant A
 * streams 8 MiB dataset parts through `lathed api` on U connections (open, parts, abort, again)
 * while tenant B sends GET /v1/jobs one at a time; the figure is B's p99 latency.
 *
 * The peer in the same run: the same API with LATHE_API_THREADS=-1, which runs the blocking
 * work (validation, tokenizing, encryption, store calls) inline on the event loop as the API did
 * before its thread pool. The ratio inline/pool says how much the pool takes off B's tail; B's
 * p99 with no upload running is printed as the floor.
 *
 *   bench_api_stall [N=300] [U=2]      needs the local stack (eval "$(ops/stack env)")
 * Last line: `api_get_p99_under_uploads_ratio: X`. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

#include "bench_util.h"
#include "lt_bus.h"

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#define PART (8u << 20)
#define PARTS_PER_UPLOAD 3

static char *run(const char *cmd) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  char *out = calloc(1, 65536);
  size_t n = fread(out, 1, 65535, p);
  out[n] = '\0';
  if (pclose(p) != 0) {
    fprintf(stderr, "bench_api_stall: %s failed: %s\n", cmd, out);
    free(out);
    return NULL;
  }
  return out;
}

static double pct(double *v, int n, double p) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[(int)(p * (n - 1) + 0.5)];
}

/* ---------------------------------------------------------------- the load */

typedef struct run run_t;

typedef struct uploader {
  run_t *r;
  struct evhttp_connection *evcon;
  char id[64];
  int part; /* 0: opening; 1..PARTS_PER_UPLOAD; then the abort */
} uploader_t;

struct run {
  struct event_base *base;
  unsigned port;
  char auth_a[256], auth_b[256];
  const char *part; /* PART bytes of JSONL */
  /* B */
  struct evhttp_connection *reader;
  struct event *pause;
  int n, done;
  double t0, *lat;
  /* A */
  uploader_t *up;
  int nup;
  bool stop;
  long parts_sent, upload_errors;
  double elapsed;
};

static void request(run_t *r, struct evhttp_connection *evcon, const char *auth, enum evhttp_cmd_type m,
                    const char *path, const void *body, size_t len, void (*cb)(struct evhttp_request *, void *),
                    void *arg) {
  struct evhttp_request *req = evhttp_request_new(cb, arg);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Host", "127.0.0.1");
  evhttp_add_header(h, "Authorization", auth);
  if (body) evbuffer_add_reference(evhttp_request_get_output_buffer(req), body, len, NULL, NULL);
  evhttp_make_request(evcon, req, m, path);
  (void)r;
}

static void upload_step(uploader_t *u);

static void on_upload(struct evhttp_request *req, void *arg) {
  uploader_t *u = arg;
  int status = req ? evhttp_request_get_response_code(req) : 0;
  if (u->part == 0 && status == 201) {
    char buf[512] = "";
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    evbuffer_copyout(b, buf, sizeof buf - 1);
    json_t *j = json_loads(buf, 0, NULL);
    snprintf(u->id, sizeof u->id, "%s", json_string_value(json_object_get(j, "upload_id")));
    json_decref(j);
    u->part = 1;
  } else if (u->part >= 1 && u->part <= PARTS_PER_UPLOAD && status == 200) {
    u->r->parts_sent++;
    u->part++;
  } else {
    if (u->part <= PARTS_PER_UPLOAD) u->r->upload_errors++;
    u->part = 0; /* aborted (or failed): open another */
  }
  upload_step(u);
}

static void upload_step(uploader_t *u) {
  run_t *r = u->r;
  char path[160];
  if (r->stop) return;
  if (u->part == 0) {
    request(r, u->evcon, r->auth_a, EVHTTP_REQ_POST, "/v1/uploads?name=bench", NULL, 0, on_upload, u);
  } else if (u->part <= PARTS_PER_UPLOAD) {
    snprintf(path, sizeof path, "/v1/uploads/%s/parts/%d", u->id, u->part);
    request(r, u->evcon, r->auth_a, EVHTTP_REQ_PUT, path, r->part, PART, on_upload, u);
  } else {
    snprintf(path, sizeof path, "/v1/uploads/%s", u->id);
    request(r, u->evcon, r->auth_a, EVHTTP_REQ_DELETE, path, NULL, 0, on_upload, u);
  }
}

static void read_one(evutil_socket_t fd, short what, void *arg);

static void on_read(struct evhttp_request *req, void *arg) {
  run_t *r = arg;
  int status = req ? evhttp_request_get_response_code(req) : 0;
  if (status == 200) r->lat[r->done++] = bench_now_s() - r->t0;
  else fprintf(stderr, "bench_api_stall: GET /v1/jobs answered %d\n", status);
  if (r->done >= r->n || status != 200) {
    r->stop = true;
    event_base_loopbreak(r->base);
    return;
  }
  struct timeval tv = {0, 20000}; /* B: a request every 20 ms, not a flood */
  evtimer_add(r->pause, &tv);
}

static void read_one(evutil_socket_t fd, short what, void *arg) {
  run_t *r = arg;
  (void)fd, (void)what;
  r->t0 = bench_now_s();
  request(r, r->reader, r->auth_b, EVHTTP_REQ_GET, "/v1/jobs", NULL, 0, on_read, r);
}

/* B's n GET latencies (seconds, into lat) while nup uploaders of A run; returns A's parts. */
static long measure(run_t *r, int nup) {
  r->base = event_base_new();
  r->done = 0;
  r->stop = false;
  r->parts_sent = r->upload_errors = 0;
  r->nup = nup;
  r->reader = evhttp_connection_base_new(r->base, NULL, "127.0.0.1", (uint16_t)r->port);
  evhttp_connection_set_timeout(r->reader, 120);
  r->pause = evtimer_new(r->base, read_one, r);
  r->up = calloc((size_t)(nup ? nup : 1), sizeof *r->up);
  for (int i = 0; i < nup; i++) {
    r->up[i] = (uploader_t){.r = r, .evcon = evhttp_connection_base_new(r->base, NULL, "127.0.0.1", (uint16_t)r->port)};
    evhttp_connection_set_timeout(r->up[i].evcon, 120);
    upload_step(&r->up[i]);
  }
  /* B starts once A's first parts are on their way. */
  struct timeval first = {0, nup ? 300000 : 0};
  evtimer_add(r->pause, &first);
  double t0 = bench_now_s();
  event_base_dispatch(r->base);
  r->elapsed = bench_now_s() - t0;
  for (int i = 0; i < nup; i++) evhttp_connection_free(r->up[i].evcon);
  evhttp_connection_free(r->reader);
  event_free(r->pause);
  event_base_free(r->base);
  free(r->up);
  return r->parts_sent;
}

/* ---------------------------------------------------------------- lathed */

static pid_t start_lathed(const char *lathed, const char *threads, const char *log, unsigned *port) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    setenv("LATHE_API_THREADS", threads, 1);
    setenv("LATHE_API_MAX_OPEN_UPLOADS", "64", 1);
    setenv("LATHE_API_KEY_RATE", "off", 1); /* B's 50 GETs a second are the measurement */
    setenv("LATHE_API_TENANT_RATE", "off", 1);
    execl(lathed, "lathed", "--role", "api", "--port", "0", "--operator-port", "0", (char *)NULL);
    _exit(127);
  }
  *port = 0;
  for (int i = 0; i < 300 && !*port; i++) {
    usleep(100000);
    FILE *f = fopen(log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      char *p = strstr(line, "listening on http://");
      if (p) sscanf(strrchr(p, ':') + 1, "%u", port);
    }
    if (f) fclose(f);
  }
  return pid;
}

static char *tenant(const char *lathe, const char *id) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "'%s' admin tenant create %s --json", lathe, id);
  char *out = run(cmd);
  if (!out) exit(1);
  json_t *j = json_loads(out, 0, NULL);
  char *key = strdup(json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
  return key;
}

/* Waits until the API answers B's GET /v1/jobs with 200 (it knows the tenants). */
static bool ready(run_t *r) {
  for (int i = 0; i < 300; i++) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' -H 'Authorization: %s' http://127.0.0.1:%u/v1/jobs",
             r->auth_b, r->port);
    FILE *p = popen(cmd, "r");
    char code[8] = "";
    if (p) {
      if (!fgets(code, sizeof code, p)) code[0] = '\0';
      pclose(p);
    }
    if (strcmp(code, "200") == 0) return true;
    usleep(100000);
  }
  return false;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 300, nup = argc > 2 ? atoi(argv[2]) : 2;
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT")) {
    fprintf(stderr, "bench_api_stall: needs the local stack: eval \"$(ops/stack env)\"\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  const char *lathe = getenv("LATHE_BENCH_LATHE") ? getenv("LATHE_BENCH_LATHE") : "./lathe";
  const char *lathed = getenv("LATHE_BENCH_LATHED") ? getenv("LATHE_BENCH_LATHED") : "./lathed";
  char prefix[64], cmd[1024], ida[64], idb[64], err[512];
  snprintf(prefix, sizeof prefix, "bstall%d.", (int)getpid());
  snprintf(ida, sizeof ida, "upl-%d", (int)getpid());
  snprintf(idb, sizeof idb, "rdr-%d", (int)getpid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  snprintf(cmd, sizeof cmd, "'%s' admin topics", lathe);
  free(run(cmd));
  char *ka = tenant(lathe, ida), *kb = tenant(lathe, idb);
  run_t r = {.n = n, .lat = calloc((size_t)n, sizeof(double))};
  snprintf(r.auth_a, sizeof r.auth_a, "Bearer %s", ka);
  snprintf(r.auth_b, sizeof r.auth_b, "Bearer %s", kb);
  /* A's part: valid JSONL, so each part is validated, tokenized and encrypted in full. */
  char *part = malloc(PART);
  size_t off = 0;
  for (int i = 0; off < PART; i++) {
    char line[200];
    int len = snprintf(line, sizeof line, "{\"prompt\":\"question %d about the weather\",\"completion\":\"answer %d\"}\n", i,
                       i * 7);
    if (off + (size_t)len > PART) {
      memset(part + off, ' ', PART - off - 1);
      part[PART - 1] = '\n';
      break;
    }
    memcpy(part + off, line, (size_t)len);
    off += (size_t)len;
  }
  r.part = part;
  const char *modes[2][2] = {{"inline", "-1"}, {"pool", "0"}};
  double p99[2][2], p50[2][2];
  double parts[2] = {0, 0};
  int rc = 0;
  for (int m = 0; m < 2; m++) {
    char log[128];
    snprintf(log, sizeof log, "/tmp/bench_api_stall.%d.%s.log", (int)getpid(), modes[m][0]);
    pid_t pid = start_lathed(lathed, modes[m][1], log, &r.port);
    if (!r.port || !ready(&r)) {
      fprintf(stderr, "bench_api_stall: lathed (%s) did not start; see %s\n", modes[m][0], log);
      rc = 1;
    } else {
      for (int withup = 0; withup < 2; withup++) {
        long sent = measure(&r, withup ? nup : 0);
        if (withup) parts[m] = (double)sent / r.elapsed;
        p50[m][withup] = pct(r.lat, r.done, 0.5) * 1e3;
        p99[m][withup] = pct(r.lat, r.done, 0.99) * 1e3;
        if (r.done < n) rc = 1;
      }
      unlink(log);
    }
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
  }
  printf("bench_api_stall: tenant B's GET /v1/jobs (%d, one at a time) while tenant A uploads 8 MiB parts on %d "
         "connections\n", n, nup);
  for (int m = 0; m < 2; m++)
    printf("%-7s idle: p50 %7.2f ms p99 %7.2f ms | under uploads: p50 %7.2f ms p99 %8.2f ms | A: %.2f parts/s\n",
           modes[m][0], p50[m][0], p99[m][0], p50[m][1], p99[m][1], parts[m]);
  printf("api_get_p99_under_uploads_ratio: %.1f\n", p99[1][1] > 0 ? p99[0][1] / p99[1][1] : 0);
  /* The run's topics go away with it. */
  lt_bus_conf_t *bc = lt_bus_conf_new();
  lt_bus_admin_t *adm = NULL;
  char **names = NULL;
  size_t nn = 0;
  if (lt_bus_conf_from_env(bc, err, sizeof err) == LT_OK && lt_bus_admin_new(bc, &adm, err, sizeof err) == LT_OK &&
      lt_bus_admin_list_topics(adm, 10000, &names, &nn, err, sizeof err) == LT_OK) {
    const char *mine[64];
    size_t k = 0;
    for (size_t i = 0; i < nn && k < 64; i++)
      if (strncmp(names[i], prefix, strlen(prefix)) == 0) mine[k++] = names[i];
    lt_bus_admin_delete_topics(adm, mine, k, 30000, err, sizeof err);
    lt_bus_admin_free_names(names);
  }
  lt_bus_admin_destroy(adm);
  lt_bus_conf_destroy(bc);
  free(part);
  free(ka);
  free(kb);
  free(r.lat);
  return rc;
}
