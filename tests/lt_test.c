/* lt_test: the shared machinery of the C tests (see lt_test.h). Failures are Criterion
 * assertions: a helper that cannot do its part ends the test with a message saying why. */
#include "lt_test.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "lt_bus_int.h" /* lt_bus_admin_rk */
#include "lt_crypto.h"

static char err[1024];

/* ---------------------------------------------------------------- waiting, files, commands */

void lt_test_msleep(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&t, NULL);
}

/* Reads f to its end into a growing buffer (files and pipes alike). */
static char *read_all(FILE *f, size_t *len) {
  size_t cap = 1 << 16, n = 0, r;
  char *buf = malloc(cap);
  while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += r;
    if (n + 1 == cap) buf = realloc(buf, cap *= 2);
  }
  buf[n] = '\0';
  if (len) *len = n;
  return buf;
}

char *lt_test_slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = read_all(f, len);
  fclose(f);
  return buf;
}

bool lt_test_file_has(const char *path, const char *needle) {
  char *all = lt_test_slurp(path, NULL);
  bool yes = all && strstr(all, needle);
  free(all);
  return yes;
}

const char *lt_test_log_tail(const char *path) {
  static char buf[3000];
  size_t n = 0;
  char *all = lt_test_slurp(path, &n);
  if (!all) return "(no log)";
  const char *from = n > sizeof buf - 1 ? all + n - (sizeof buf - 1) : all;
  snprintf(buf, sizeof buf, "%s", from);
  free(all);
  return buf;
}

char *lt_test_run(const char *cmd, int *rc) {
  FILE *p = popen(cmd, "r");
  cr_assert(p, "popen %s", cmd);
  char *out = read_all(p, NULL);
  int st = pclose(p);
  if (rc) *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

void lt_test_rm_rf(const char *path) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  cr_expect_eq(system(cmd), 0, "%s", cmd);
}

bool lt_test_pid_dead(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return true;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')');
  return !rp || rp[2] == 'Z' || rp[2] == 'X';
}

/* ---------------------------------------------------------------- the environment */

static const char *env_or(const char *name, const char *def) {
  const char *v = getenv(name);
  return v && *v ? v : def;
}

const char *lt_test_lathe_bin(void) { return env_or("LATHE_TEST_LATHE", "./lathe"); }
const char *lt_test_lathed_bin(void) { return env_or("LATHE_TEST_LATHED", "./lathed"); }

const char *lt_test_source_path(const char *rel, char *out, size_t n) {
  snprintf(out, n, "%s/%s", env_or("LATHE_SOURCE_ROOT", "."), rel);
  return out;
}

void lt_test_require_stack(void) {
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT"))
    cr_skip_test("needs the local stack: eval \"$(ops/stack env)\"");
}

void lt_test_scratch_prefix(const char *tag, char *out, size_t n) {
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  cr_assert_eq(lt_crypto_random_id(rnd), LT_OK);
  snprintf(out, n, "%s%d-%.8s.", tag, (int)getpid(), rnd);
}

lt_bus_conf_t *lt_test_bus_env(void) {
  lt_bus_conf_t *conf = lt_bus_conf_new();
  cr_assert(conf);
  cr_assert_eq(lt_bus_conf_from_env(conf, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_conf_for_role(conf, "admin", err, sizeof err), LT_OK, "%s", err);
  return conf;
}

const char *lt_test_kafka_props(const char *role, char *out, size_t n) {
  const char *dir = getenv("LATHE_KAFKA_CONFIG_DIR");
  if (!dir || !*dir) return NULL;
  snprintf(out, n, "%s/%s.properties", dir, role);
  return out;
}

void lt_test_rd_conf_auth(rd_kafka_conf_t *rc, const char *role) {
  char path[1024], line[1024];
  if (!lt_test_kafka_props(role, path, sizeof path)) return;
  FILE *f = fopen(path, "r");
  cr_assert(f, "cannot read %s", path);
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    char *eq = strchr(line, '=');
    if (line[0] == '#' || !eq) continue;
    *eq = '\0';
    char rderr[256];
    cr_assert_eq(rd_kafka_conf_set(rc, line, eq + 1, rderr, sizeof rderr), RD_KAFKA_CONF_OK, "%s: %s", path, rderr);
  }
  fclose(f);
}

/* With the stack's principals (ops/stack env), the roles' ACLs of ops/acls.tsv under admin's
 * prefix: the admin principal itself may create topics there only then (docs/DESIGN.md §5a). */
static void scratch_acls(lt_bus_admin_t *admin, int timeout_ms) {
  char path[1024];
  if (!getenv("LATHE_KAFKA_CONFIG_DIR")) return;
  lt_test_source_path("ops/acls.tsv", path, sizeof path);
  cr_assert_eq(lt_bus_admin_create_acls(admin, path, timeout_ms, NULL, NULL, err, sizeof err), LT_OK,
               "cannot create the ACLs of %s: %s", path, err);
}

lt_bus_conf_t *lt_test_bus_scratch(const char *tag, char *prefix, size_t n, lt_bus_admin_t **admin) {
  lt_bus_conf_t *conf = lt_test_bus_env();
  lt_test_scratch_prefix(tag, prefix, n);
  cr_assert_eq(lt_bus_conf_set(conf, "lathe.topic.prefix", prefix, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_admin_new(conf, admin, err, sizeof err), LT_OK, "%s", err);
  scratch_acls(*admin, 30000);
  return conf;
}

void lt_test_topics_create(lt_bus_conf_t *conf, lt_bus_admin_t *admin, int timeout_ms) {
  char path[1024];
  scratch_acls(admin, timeout_ms);
  lt_test_source_path("ops/topics.tsv", path, sizeof path);
  if (lt_bus_admin_create_from_file(admin, path, -1, timeout_ms, NULL, err, sizeof err) != LT_OK)
    cr_assert_fail("cannot create the topics of %s on %s (%s): start the broker with `ops/stack up` and "
                   "`eval \"$(ops/stack env)\"`",
                   path, lt_bus_conf_get(conf, "bootstrap.servers"), err);
}

void lt_test_topics_delete(const char *prefix) {
  lt_bus_conf_t *conf = lt_bus_conf_new();
  lt_bus_admin_t *admin = NULL;
  char **names = NULL;
  size_t nn = 0;
  if (lt_bus_conf_from_env(conf, NULL, 0) == LT_OK && lt_bus_conf_for_role(conf, "admin", NULL, 0) == LT_OK &&
      lt_bus_admin_new(conf, &admin, NULL, 0) == LT_OK &&
      lt_bus_admin_list_topics(admin, 10000, &names, &nn, NULL, 0) == LT_OK) {
    const char *mine[64];
    size_t n = 0;
    for (size_t i = 0; i < nn && n < 64; i++)
      if (strncmp(names[i], prefix, strlen(prefix)) == 0) mine[n++] = names[i];
    if (n) lt_bus_admin_delete_topics(admin, mine, n, 30000, NULL, 0);
    lt_bus_admin_free_names(names);
  }
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(conf);
}

int64_t lt_test_empty_partition(const lt_bus_conf_t *conf, const char *topic, int32_t partition) {
  char e[512];
  lt_bus_admin_t *admin;
  cr_assert_eq(lt_bus_admin_new(conf, &admin, e, sizeof e), LT_OK, "%s", e);
  rd_kafka_t *rk = lt_bus_admin_rk(admin);
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, partition)->offset = RD_KAFKA_OFFSET_END; /* all of it */
  rd_kafka_DeleteRecords_t *del = rd_kafka_DeleteRecords_new(l);
  rd_kafka_topic_partition_list_destroy(l);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  rd_kafka_DeleteRecords(rk, &del, 1, NULL, q);
  rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 15000);
  cr_assert(ev, "DeleteRecords: no answer in 15 s");
  cr_assert_eq(rd_kafka_event_error(ev), RD_KAFKA_RESP_ERR_NO_ERROR, "DeleteRecords: %s", rd_kafka_event_error_string(ev));
  const rd_kafka_topic_partition_list_t *res =
      rd_kafka_DeleteRecords_result_offsets(rd_kafka_event_DeleteRecords_result(ev));
  cr_assert(res && res->cnt == 1 && !res->elems[0].err && res->elems[0].offset > 0, "DeleteRecords of %s [%d]: %s",
            topic, (int)partition, res && res->cnt ? rd_kafka_err2str(res->elems[0].err) : "no partition");
  int64_t end = res->elems[0].offset;
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_DeleteRecords_destroy(del);
  lt_bus_admin_destroy(admin);
  lt_bus_consumer_t *c;
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &c, e, sizeof e), LT_OK, "%s", e);
  lt_bus_tp_t tp = {.topic = topic, .partition = partition};
  int64_t low = -1;
  cr_assert_eq(lt_bus_consumer_watermarks(c, &tp, 1, &low, 10000, e, sizeof e), LT_OK, "%s", e);
  cr_assert(low == end && tp.offset == end, "%s [%d] holds %lld..%lld, wanted it empty at %lld", topic, (int)partition,
            (long long)low, (long long)tp.offset, (long long)end);
  lt_bus_consumer_destroy(c);
  return end;
}

void lt_test_admin_topics(void) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' admin topics 2>&1", lt_test_lathe_bin());
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "lathe admin topics: %s", out);
  free(out);
}

void lt_test_tenant_create(const char *id, const char *opts, char *key, size_t keyn) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "'%s' admin tenant create %s %s --json", lt_test_lathe_bin(), id, opts ? opts : "");
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s failed: %s", cmd, out);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert(j && json_string_value(json_object_get(j, "api_key")), "no api_key in %s", out);
  snprintf(key, keyn, "%s", json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
}

/* ---------------------------------------------------------------- child processes */

#define MAX_PROCS 16
static lt_test_proc_t procs[MAX_PROCS];
static int nprocs;

/* In the child, before exec: where its output goes and what its environment holds. */
static void child_prepare(const lt_test_spawn_t *s) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies takes its daemons with it */
  if (s->own_group) setpgid(0, 0);
  int fd = open(s->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
  int out = s->out ? open(s->out, O_WRONLY | O_CREAT | O_TRUNC, 0600) : fd;
  dup2(out, 1);
  dup2(fd, 2);
  for (int i = 0; s->unset && s->unset[i]; i++) unsetenv(s->unset[i]);
  for (int i = 0; s->env && s->env[i]; i++) putenv((char *)s->env[i]);
}

lt_test_proc_t *lt_test_spawn(const lt_test_spawn_t *s) {
  cr_assert(nprocs < MAX_PROCS, "more than %d child processes", MAX_PROCS);
  lt_test_proc_t *p = &procs[nprocs++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", s->name);
  snprintf(p->log, sizeof p->log, "%s", s->log);
  p->own_group = s->own_group;
  p->pid = fork();
  cr_assert(p->pid >= 0);
  if (p->pid == 0) {
    child_prepare(s);
    execvp(s->argv[0], (char *const *)s->argv);
    _exit(127);
  }
  if (s->own_group) setpgid(p->pid, p->pid); /* also here: no race with the first kill(-pid) */
  return p;
}

lt_test_proc_t *lt_test_lathed(const char *name, const char *log, const char *role, const char *netns,
                               const char *const *env) {
  const char *lathed = lt_test_lathed_bin();
  const char *in_netns[] = {"/usr/sbin/ip", "netns", "exec", netns, lathed, "--role", role, NULL};
  const char *api[] = {lathed, "--role", role, "--port", "0", "--operator-port", "0", NULL};
  const char *plain[] = {lathed, "--role", role, NULL};
  char instance[64];
  snprintf(instance, sizeof instance, "LATHE_INSTANCE=%s", name);
  const char *envs[32] = {instance};
  for (int i = 0; env && env[i] && i < 30; i++) envs[i + 1] = env[i];
  lt_test_spawn_t s = {.name = name, .log = log, .env = envs};
  s.argv = netns ? in_netns : strcmp(role, "api") == 0 ? api : plain;
  return lt_test_spawn(&s);
}

bool lt_test_proc_exited(lt_test_proc_t *p, int *status) {
  int st = 0;
  if (p->pid <= 0 || waitpid(p->pid, &st, WNOHANG) != p->pid) return false;
  p->pid = 0;
  if (status) *status = st;
  return true;
}

void lt_test_procs_check(void) {
  for (int i = 0; i < nprocs; i++) {
    lt_test_proc_t *p = &procs[i];
    int st;
    if (!p->expect_exit && lt_test_proc_exited(p, &st))
      cr_assert_fail("%s exited (status %d); its log ends:\n%s", p->name, st, lt_test_log_tail(p->log));
  }
}

void lt_test_proc_kill(lt_test_proc_t *p, int sig) {
  if (p->pid <= 0) return;
  p->expect_exit = true;
  kill(p->own_group ? -p->pid : p->pid, sig);
  if (sig == SIGKILL) {
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
  }
}

int lt_test_proc_stop(lt_test_proc_t *p, int timeout_ms) { return lt_test_proc_stop_by(p, SIGTERM, timeout_ms); }

void lt_test_proc_stop_clean(lt_test_proc_t *p, int timeout_ms) {
  if (!p || p->pid <= 0) return;
  int st = lt_test_proc_stop(p, timeout_ms);
  bool clean = st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  if (clean) {
    unlink(p->log);
    return;
  }
  /* Criterion ignores an assertion that fails in a suite's fini, where this is called, and counts
   * a crash there only as a warning (the test still passes); but the runner then exits non-zero,
   * which meson and ops/test count as a failure of the suite. */
  fprintf(stderr, "%s did not stop cleanly (wait status %d%s); its log ends:\n%s\n", p->name, st,
          st == -1 ? ": killed" : "", lt_test_log_tail(p->log));
  abort();
}

int lt_test_proc_stop_by(lt_test_proc_t *p, int sig, int timeout_ms) {
  if (p->pid <= 0) return -1;
  p->expect_exit = true;
  kill(p->pid, sig);
  int st = 0;
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < timeout_ms; lt_test_msleep(100))
    if (lt_test_proc_exited(p, &st)) return st;
  lt_test_proc_kill(p, SIGKILL);
  return -1;
}

void lt_test_procs_stop_all(void) {
  for (int i = 0; i < nprocs; i++)
    if (procs[i].own_group) /* a group left running: the test failed mid-way, nothing to wait for */
      lt_test_proc_kill(&procs[i], SIGKILL);
    else if (procs[i].pid > 0) { /* SIGINT: a worker stops now (SIGTERM would drain it first) */
      procs[i].expect_exit = true;
      kill(procs[i].pid, SIGINT);
    }
  for (int i = 0; i < nprocs; i++) lt_test_proc_stop_by(&procs[i], SIGINT, 10000);
  nprocs = 0;
}

/* The port of the last "MARK...://HOST:PORT" in a log; 0 if none yet. */
static unsigned log_port(const char *log, const char *mark) {
  char *all = lt_test_slurp(log, NULL);
  unsigned port = 0;
  size_t ml = strlen(mark);
  for (const char *p = all; p && (p = strstr(p, mark)); p += ml) {
    const char *scheme = strstr(p + ml, "://"), *colon = scheme ? strchr(scheme + 3, ':') : NULL;
    if (colon) sscanf(colon + 1, "%u", &port);
  }
  free(all);
  return port;
}

static unsigned wait_port(lt_test_proc_t *p, const char *mark, int timeout_ms) {
  unsigned port = 0;
  lt_test_wait_until((port = log_port(p->log, mark)) != 0, timeout_ms, 50,
                     "%s printed no \"%s\" port within %d s; log:\n%s", p->name, mark, timeout_ms / 1000,
                     lt_test_log_tail(p->log));
  return port;
}

unsigned lt_test_proc_port(lt_test_proc_t *p, int timeout_ms) { return wait_port(p, "listening on http", timeout_ms); }

unsigned lt_test_proc_operator_port(lt_test_proc_t *p, int timeout_ms) {
  return wait_port(p, "api operator endpoints (/healthz, /metrics) at http", timeout_ms);
}

unsigned lt_test_proc_port_of(lt_test_proc_t *p, const char *mark, int timeout_ms) {
  return wait_port(p, mark, timeout_ms);
}

lt_store_t *lt_test_store(void) {
  lt_store_s3_conf_t sc;
  lt_store_t *store = NULL;
  char why[512];
  cr_assert_eq(lt_store_s3_conf_from_env(&sc, why, sizeof why), LT_OK, "%s (run `eval \"$(ops/stack env)\"`)", why);
  cr_assert_eq(lt_store_s3_new(&store, &sc, why, sizeof why), LT_OK, "%s", why);
  return store;
}

/* ---------------------------------------------------------------- HTTP */

lt_client_t *lt_test_client(const char *url, const char *api_key, int timeout_s) {
  lt_client_opts_t o = {.url = url, .api_key = api_key, .timeout_s = timeout_s};
  lt_client_t *c;
  cr_assert_eq(lt_client_new(&o, &c, err, sizeof err), LT_OK, "%s", err);
  return c;
}

int lt_test_mute_store(char *env, size_t n) {
  int hole = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  cr_assert(hole >= 0 && bind(hole, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(hole, 16) == 0 &&
            getsockname(hole, (struct sockaddr *)&sa, &sl) == 0);
  fcntl(hole, F_SETFD, FD_CLOEXEC);
  fcntl(hole, F_SETFL, O_NONBLOCK);
  snprintf(env, n, "LATHE_S3_ENDPOINT=127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
  return hole;
}

lt_client_resp_t lt_test_req(lt_client_t *c, const char *method, const char *path, const char *body, size_t len) {
  lt_client_resp_t r;
  cr_assert_eq(lt_client_request(c, method, path, NULL, 0, body, len, NULL, &r, err, sizeof err), LT_OK, "%s %s: %s",
               method, path, err);
  return r;
}

int lt_test_get_status(lt_client_t *c, const char *path, char *last_body, size_t n) {
  lt_client_resp_t r;
  if (lt_client_request(c, "GET", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err) != LT_OK) {
    if (last_body) snprintf(last_body, n, "%s", err);
    return 0;
  }
  int status = r.status;
  if (last_body) snprintf(last_body, n, "%.*s", (int)r.len, r.body ? r.body : "");
  lt_client_resp_free(&r);
  return status;
}

void lt_test_wait_healthy(const char *ops_url, const char *log, int timeout_ms) {
  lt_client_t *c = lt_test_client(ops_url, NULL, 0);
  int status = 0;
  char body[1100] = "";
  lt_test_wait_until((status = lt_test_get_status(c, "/healthz", body, sizeof body)) == 200, timeout_ms, 100,
                     "/healthz never answered 200 within %d s (last: %d %s); %s ends:\n%s", timeout_ms / 1000, status,
                     body, log, lt_test_log_tail(log));
  lt_client_destroy(c);
}

/* ---------------------------------------------------------------- the log, read back */

#define TAIL_TOPICS 8

struct lt_test_tail {
  lt_avro_registry_t *reg;
  lt_bus_consumer_t *c;
  lt_avro_decoder_t *dec;
  json_t *recs;
  int ntopics;
  const char *bases[TAIL_TOPICS];
  char names[TAIL_TOPICS][200];
};

lt_test_tail_t *lt_test_tail_open(const lt_bus_conf_t *conf, const char *const *bases) {
  lt_test_tail_t *t = calloc(1, sizeof *t);
  lt_bus_conf_t *env = NULL;
  if (!conf) conf = env = lt_test_bus_env();
  cr_assert_eq(lt_avro_registry_new(&t->reg, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_decoder_new(t->reg, &t->dec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &t->c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_admin_t *admin;
  cr_assert_eq(lt_bus_admin_new(conf, &admin, err, sizeof err), LT_OK, "%s", err);
  lt_bus_tp_t parts[128];
  size_t np = 0;
  for (; bases[t->ntopics] && t->ntopics < TAIL_TOPICS; t->ntopics++) {
    int i = t->ntopics, count = 0;
    t->bases[i] = bases[i];
    lt_bus_topic_name(conf, bases[i], t->names[i], sizeof t->names[i]);
    cr_assert_eq(lt_bus_admin_describe_topic(admin, t->names[i], 10000, &count, err, sizeof err), LT_OK, "%s", err);
    for (int p = 0; p < count && np < 128; p++)
      parts[np++] = (lt_bus_tp_t){.topic = t->names[i], .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_admin_destroy(admin);
  cr_assert_eq(lt_bus_consumer_assign(t->c, parts, np, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_destroy(env);
  t->recs = json_array();
  return t;
}

void lt_test_tail_close(lt_test_tail_t *t) {
  if (!t) return;
  lt_bus_consumer_destroy(t->c);
  lt_avro_decoder_destroy(t->dec);
  lt_avro_registry_destroy(t->reg);
  json_decref(t->recs);
  free(t);
}

/* One consumed message as a tail record; false when it is not a record Lathe can decode. */
static bool tail_take(lt_test_tail_t *t, const lt_bus_msg_t *m) {
  size_t len;
  const void *v = lt_bus_msg_value(m, &len);
  lt_avro_record_t *rec;
  json_t *j = NULL;
  if (!v || lt_avro_decode(t->dec, v, len, &rec, NULL, 0) != LT_OK ||
      lt_avro_record_to_jansson(rec, &j, NULL, 0) != LT_OK)
    return false;
  const char *topic = lt_bus_msg_topic(m), *base = topic;
  for (int k = 0; k < t->ntopics; k++)
    if (strcmp(topic, t->names[k]) == 0) base = t->bases[k];
  json_array_append_new(t->recs, json_pack("{s:s,s:i,s:I,s:s,s:i,s:o}", "topic", base, "partition",
                                           (int)lt_bus_msg_partition(m), "offset", (json_int_t)lt_bus_msg_offset(m),
                                           "type", lt_avro_record_type(rec), "version",
                                           lt_avro_record_writer_version(rec), "r", j));
  return true;
}

void lt_test_tail_poll(lt_test_tail_t *t, int ms) {
  for (int i = 0; i < 10000; i++) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(t->c, i == 0 ? ms : 0, &m, err, sizeof err) != LT_OK || !m) return;
    tail_take(t, m);
  }
}

void lt_test_tail_settle(lt_test_tail_t *t, int idle_ms) {
  for (size_t before = (size_t)-1; before != json_array_size(t->recs);) {
    before = json_array_size(t->recs);
    lt_test_tail_poll(t, idle_ms);
  }
}

json_t *lt_test_tail_records(lt_test_tail_t *t) { return t->recs; }

static json_t *field(json_t *rec, const char *name) { return json_object_get(json_object_get(rec, "r"), name); }
const char *lt_test_rs(json_t *rec, const char *name) { return json_string_value(field(rec, name)); }
json_int_t lt_test_ri(json_t *rec, const char *name) { return json_integer_value(field(rec, name)); }
bool lt_test_rb(json_t *rec, const char *name) { return json_is_true(field(rec, name)); }

/* Does s equal want (want NULL: anything)? */
static bool matches(const char *s, const char *want) { return !want || (s && strcmp(s, want) == 0); }

json_t *lt_test_tail_select(lt_test_tail_t *t, const char *topic, const char *type, const char *job, int attempt) {
  json_t *out = json_array(), *r;
  size_t i;
  json_array_foreach(t->recs, i, r) {
    if (!matches(json_string_value(json_object_get(r, "topic")), topic) ||
        !matches(json_string_value(json_object_get(r, "type")), type) || !matches(lt_test_rs(r, "job_id"), job) ||
        (attempt && lt_test_ri(r, "attempt") != attempt))
      continue;
    json_array_append(out, r);
  }
  return out;
}

/* ---------------------------------------------------------------- a relay */

int lt_test_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &al) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

int lt_test_local_port(const char *var) {
  const char *v = getenv(var);
  cr_assert(v && strncmp(v, "127.0.0.1:", 10) == 0, "a relay or proxy handles a local stack only (%s=%s)", var,
            v ? v : "(unset)");
  return atoi(v + 10);
}

struct lt_test_relay {
  int port, up_port, lfd;
  atomic_int stop;
  pthread_t thread;
};

/* Reads what `from` has and writes it all to `to`; false when either side is done. */
static bool relay_pass(int from, int to) {
  char buf[1 << 14];
  ssize_t got = read(from, buf, sizeof buf);
  for (ssize_t off = 0; got > 0 && off < got;) {
    ssize_t w = write(to, buf + off, (size_t)(got - off));
    if (w <= 0) return false;
    off += w;
  }
  return got > 0;
}

static void *relay_main(void *arg) {
  lt_test_relay_t *r = arg;
  int pa[16], pb[16], np = 0;
  while (!atomic_load(&r->stop)) {
    struct pollfd pf[1 + 32];
    int n = 0;
    pf[n++] = (struct pollfd){.fd = r->lfd, .events = POLLIN};
    for (int i = 0; i < np; i++) {
      pf[n++] = (struct pollfd){.fd = pa[i], .events = POLLIN};
      pf[n++] = (struct pollfd){.fd = pb[i], .events = POLLIN};
    }
    if (poll(pf, (nfds_t)n, 50) <= 0) continue;
    for (int i = np - 1; i >= 0; i--) {
      bool keep = (!pf[1 + 2 * i].revents || relay_pass(pa[i], pb[i])) &&
                  (!pf[2 + 2 * i].revents || relay_pass(pb[i], pa[i]));
      if (!keep) {
        close(pa[i]);
        close(pb[i]);
        pa[i] = pa[np - 1], pb[i] = pb[np - 1], np--;
      }
    }
    if ((pf[0].revents & POLLIN) && np < 16) {
      int c = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC), u = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->up_port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
      if (c < 0 || connect(u, (struct sockaddr *)&a, sizeof a) != 0) {
        if (c >= 0) close(c);
        close(u);
        continue;
      }
      pa[np] = c, pb[np++] = u;
    }
  }
  for (int i = 0; i < np; i++) close(pa[i]), close(pb[i]);
  return NULL;
}

lt_test_relay_t *lt_test_relay_start(int port, int up_port) {
  lt_test_relay_t *r = calloc(1, sizeof *r);
  cr_assert_not_null(r);
  r->port = port, r->up_port = up_port;
  /* close-on-exec: a daemon started after the relay must not keep its port listening (and
   * accepting into a backlog no one reads) once the relay stops */
  r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert(bind(r->lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(r->lfd, 16) == 0,
            "cannot listen on 127.0.0.1:%d", port);
  cr_assert_eq(pthread_create(&r->thread, NULL, relay_main, r), 0);
  return r;
}

void lt_test_relay_stop(lt_test_relay_t *r) {
  if (!r) return;
  atomic_store(&r->stop, 1);
  pthread_join(r->thread, NULL);
  close(r->lfd);
  free(r);
}
