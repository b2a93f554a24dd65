/* bench_api: acknowledged job submissions per second through `lathed api` against the real
 * broker (acks=all, idempotent), with p50/p99 latency, from a libevent load generator on
 * loopback holding C connections, each with one request in flight (HTTP/1.1 keep-alive).
 *
 * The peer in the same run: raw librdkafka (acks=all, idempotence) producing the same number of
 * records of the JobSubmitted record's exact size, with the same C records in flight, each
 * latency from produce to delivery report. The ratio says what the API costs on top of Kafka.
 *
 *   bench_api [N=5000] [C=32]      needs the local stack (eval "$(ops/stack env)")
 * Last line: `api_submissions_per_s: N`. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "bench_util.h"
#include "lt_bus.h"
#include "lt_client.h"

#define MASTER_KEY "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static double pct(double *v, int n, double p) {
  if (n == 0) return 0;
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  int i = (int)(p * (n - 1) + 0.5);
  return v[i];
}

static char *run(const char *cmd) {
  FILE *p = popen(cmd, "r");
  if (!p) return NULL;
  char *out = calloc(1, 65536);
  size_t n = fread(out, 1, 65535, p);
  out[n] = '\0';
  if (pclose(p) != 0) {
    fprintf(stderr, "bench_api: %s failed: %s\n", cmd, out);
    free(out);
    return NULL;
  }
  return out;
}

/* ---------------------------------------------------------------- HTTP load */

typedef struct load load_t;
typedef struct conn {
  load_t *l;
  struct evhttp_connection *evcon;
  double t0;
} conn_t;

struct load {
  struct event_base *base;
  const char *body;
  char auth[256];
  int total, started, done, ok, other;
  double *lat;
  int first_bad_status;
};

static void send_one(conn_t *c);

static void on_answer(struct evhttp_request *req, void *arg) {
  conn_t *c = arg;
  load_t *l = c->l;
  int status = req ? evhttp_request_get_response_code(req) : 0;
  if (status == 201) l->lat[l->ok++] = bench_now_s() - c->t0;
  else {
    l->other++;
    if (!l->first_bad_status) l->first_bad_status = status ? status : -1;
  }
  l->done++;
  if (l->done == l->total) event_base_loopbreak(l->base);
  else send_one(c);
}

static void send_one(conn_t *c) {
  load_t *l = c->l;
  if (l->started >= l->total) return;
  l->started++;
  struct evhttp_request *req = evhttp_request_new(on_answer, c);
  struct evkeyvalq *h = evhttp_request_get_output_headers(req);
  evhttp_add_header(h, "Host", "127.0.0.1");
  evhttp_add_header(h, "Authorization", l->auth);
  evhttp_add_header(h, "Content-Type", "application/json");
  evbuffer_add(evhttp_request_get_output_buffer(req), l->body, strlen(l->body));
  c->t0 = bench_now_s();
  evhttp_make_request(c->evcon, req, EVHTTP_REQ_POST, "/v1/jobs");
}

/* ---------------------------------------------------------------- raw librdkafka peer */

typedef struct {
  double *lat;
  int ok, failed;
} peer_t;

static void on_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  peer_t *p = opaque;
  double *t0 = m->_private;
  if (m->err) p->failed++;
  else p->lat[p->ok++] = bench_now_s() - *t0;
  free(t0);
  (void)rk;
}

static double run_peer(const char *bootstrap, const char *topic, size_t size, int n, int inflight, double *p50,
                       double *p99) {
  char err[512];
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  peer_t p = {.lat = calloc((size_t)n, sizeof(double))};
  rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof err);
  bench_rk_auth(conf);
  rd_kafka_conf_set(conf, "acks", "all", err, sizeof err);
  rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof err);
  rd_kafka_conf_set(conf, "linger.ms", "5", err, sizeof err); /* lt_bus's setting */
  rd_kafka_conf_set_dr_msg_cb(conf, on_dr);
  rd_kafka_conf_set_opaque(conf, &p);
  rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (!rk) {
    fprintf(stderr, "bench_api: %s\n", err);
    exit(1);
  }
  char *value = malloc(size);
  memset(value, 'v', size);
  double t0 = bench_now_s();
  for (int i = 0; i < n; i++) {
    while (rd_kafka_outq_len(rk) >= inflight) rd_kafka_poll(rk, 1);
    char key[32];
    snprintf(key, sizeof key, "job-%d", i);
    double *ts = malloc(sizeof *ts);
    *ts = bench_now_s();
    rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)), RD_KAFKA_V_VALUE(value, size),
                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(ts), RD_KAFKA_V_END);
  }
  rd_kafka_flush(rk, 60000);
  double el = bench_now_s() - t0;
  *p50 = pct(p.lat, p.ok, 0.5);
  *p99 = pct(p.lat, p.ok, 0.99);
  if (p.failed) fprintf(stderr, "bench_api: peer: %d records failed\n", p.failed);
  rd_kafka_destroy(rk);
  free(value);
  free(p.lat);
  return p.ok / el;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 5000, conc = argc > 2 ? atoi(argv[2]) : 32;
  const char *bootstrap = getenv("LATHE_KAFKA_BOOTSTRAP");
  if (!bootstrap || !getenv("LATHE_S3_ENDPOINT")) {
    fprintf(stderr, "bench_api: needs the local stack: eval \"$(ops/stack env)\"\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  const char *lathe = getenv("LATHE_BENCH_LATHE") ? getenv("LATHE_BENCH_LATHE") : "./lathe";
  const char *lathed = getenv("LATHE_BENCH_LATHED") ? getenv("LATHE_BENCH_LATHED") : "./lathed";
  char prefix[64], cmd[2048], tenant[64];
  snprintf(prefix, sizeof prefix, "bapi%d.", (int)getpid());
  snprintf(tenant, sizeof tenant, "bench-%d", (int)getpid());
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  /* One key submits as fast as it can: the rate limits would measure themselves. */
  setenv("LATHE_API_KEY_RATE", "off", 1);
  setenv("LATHE_API_TENANT_RATE", "off", 1);
  snprintf(cmd, sizeof cmd, "'%s' admin topics", lathe);
  char *out = run(cmd);
  if (!out) return 1;
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' admin tenant create %s --max-queued 0 --json", lathe, tenant);
  if (!(out = run(cmd))) return 1;
  json_t *tj = json_loads(out, 0, NULL);
  char key[128];
  snprintf(key, sizeof key, "%s", json_string_value(json_object_get(tj, "api_key")));
  json_decref(tj);
  free(out);
  char log[128];
  snprintf(log, sizeof log, "/tmp/bench_api.%d.log", (int)getpid());
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    execl(lathed, "lathed", "--role", "api", "--port", "0", "--operator-port", "0", (char *)NULL);
    _exit(127);
  }
  unsigned port = 0;
  for (int i = 0; i < 300 && !port; i++) {
    usleep(100000);
    FILE *f = fopen(log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      char *p = strstr(line, "listening on http://");
      if (p) sscanf(strrchr(p, ':') + 1, "%u", &port);
    }
    if (f) fclose(f);
  }
  int rc = 1;
  lt_client_t *c = NULL;
  char url[64], err[512], ds[64] = "";
  snprintf(url, sizeof url, "http://127.0.0.1:%u", port);
  lt_client_opts_t o = {.url = url, .api_key = key};
  if (!port || lt_client_new(&o, &c, err, sizeof err)) {
    fprintf(stderr, "bench_api: lathed did not start (see %s)\n", log);
    goto out;
  }
  /* Wait until the API knows the tenant, then upload the dataset the jobs name. */
  for (int i = 0; i < 200 && !ds[0]; i++) {
    lt_client_resp_t r;
    const char *body = "{\"prompt\":\"Say hi\",\"completion\":\"hi\"}\n";
    if (lt_client_request(c, "POST", "/v1/datasets?name=bench", NULL, 0, body, strlen(body), "application/x-ndjson", &r,
                          err, sizeof err) == LT_OK) {
      if (r.status == 201) snprintf(ds, sizeof ds, "%s", json_string_value(json_object_get(r.json, "id")));
      lt_client_resp_free(&r);
    }
    if (!ds[0]) usleep(100000);
  }
  if (!ds[0]) {
    fprintf(stderr, "bench_api: cannot upload the dataset\n");
    goto out;
  }
  char body[512];
  snprintf(body, sizeof body,
           "{\"base_model\":\"smollm2-135m\",\"dataset_id\":\"%s\",\"hyperparameters\":{\"lora_rank\":16,"
           "\"learning_rate\":0.0002}}",
           ds);
  load_t l = {.base = event_base_new(), .body = body, .total = n, .lat = calloc((size_t)n, sizeof(double))};
  snprintf(l.auth, sizeof l.auth, "Bearer %s", key);
  conn_t *conns = calloc((size_t)conc, sizeof *conns);
  for (int i = 0; i < conc; i++) {
    conns[i].l = &l;
    conns[i].evcon = evhttp_connection_base_new(l.base, NULL, "127.0.0.1", (uint16_t)port);
    evhttp_connection_set_timeout(conns[i].evcon, 60);
  }
  double t0 = bench_now_s();
  for (int i = 0; i < conc; i++) send_one(&conns[i]);
  event_base_dispatch(l.base);
  double el = bench_now_s() - t0;
  double api_rate = l.ok / el, a50 = pct(l.lat, l.ok, 0.5), a99 = pct(l.lat, l.ok, 0.99);
  for (int i = 0; i < conc; i++) evhttp_connection_free(conns[i].evcon);
  event_base_free(l.base);
  free(conns);
  free(l.lat);
  kill(pid, SIGTERM); /* the API is done: the peer runs alone */
  waitpid(pid, NULL, 0);
  pid = 0;
  if (l.other) fprintf(stderr, "bench_api: %d submissions not acknowledged (first status %d)\n", l.other, l.first_bad_status);

  /* The exact size of one JobSubmitted record, read back from the topic. */
  size_t size = 0;
  {
    lt_bus_conf_t *bc = lt_bus_conf_new();
    lt_bus_consumer_t *cons = NULL;
    char topic[128];
    lt_bus_conf_from_env(bc, err, sizeof err);
    lt_bus_conf_for_role(bc, "admin", err, sizeof err);
    lt_bus_topic_name(bc, "jobs", topic, sizeof topic);
    if (lt_bus_consumer_new(bc, NULL, &cons, err, sizeof err) == LT_OK &&
        lt_bus_consumer_assign_topic(cons, topic, LT_BUS_OFFSET_BEGINNING, 10000, NULL, err, sizeof err) == LT_OK) {
      for (int i = 0; i < 100 && !size; i++) {
        const lt_bus_msg_t *m;
        if (lt_bus_consumer_poll(cons, 100, &m, err, sizeof err) == LT_OK && m) lt_bus_msg_value(m, &size);
      }
    }
    lt_bus_consumer_destroy(cons);
    lt_bus_conf_destroy(bc);
  }
  if (!size) size = 200;
  char ptopic[128];
  snprintf(ptopic, sizeof ptopic, "%sjobs", prefix);
  double p50, p99;
  double peer_rate = run_peer(bootstrap, ptopic, size, n, conc, &p50, &p99);
  printf("bench_api: %d submissions, %d connections, record %zu bytes, acks=all, real broker %s\n", n, conc, size,
         bootstrap);
  printf("api  (lathed, HTTP)      %9.0f acked/s  p50 %7.2f ms  p99 %7.2f ms  (%d acked)\n", api_rate, a50 * 1e3,
         a99 * 1e3, l.ok);
  printf("peer (raw librdkafka)    %9.0f acked/s  p50 %7.2f ms  p99 %7.2f ms\n", peer_rate, p50 * 1e3, p99 * 1e3);
  printf("ratio api/peer: %.2f\n", peer_rate > 0 ? api_rate / peer_rate : 0);
  printf("api_submissions_per_s: %.0f\n", api_rate);
  rc = l.ok == n ? 0 : 1;
out:
  lt_client_destroy(c);
  if (pid > 0) {
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
  }
  if (rc == 0) unlink(log);
  /* The run's topics go away with it. */
  lt_bus_conf_t *bc = lt_bus_conf_new();
  lt_bus_admin_t *adm = NULL;
  char **names = NULL;
  size_t nn = 0;
  if (lt_bus_conf_from_env(bc, err, sizeof err) == LT_OK && lt_bus_conf_for_role(bc, "admin", err, sizeof err) == LT_OK &&
      lt_bus_admin_new(bc, &adm, err, sizeof err) == LT_OK &&
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
  return rc;
}
