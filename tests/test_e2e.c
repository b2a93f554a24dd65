/* End to end: the whole system as separate processes against the real broker and object server.
 *
 * Each test starts `lathed --role api|scheduler|publisher|worker` children with its own topic
 * prefix, a fresh tenant and a tiny base model (`lathe model make`, made once and cached), then
 * uploads, submits and cancels through the HTTP API and reads what happened back from the log
 * (lathe.control, lathe.progress, lathe.artifacts, lathe.workers) with its own consumer. Each test
 * tries to break one of docs/DESIGN.md §4's invariants:
 *   - a job runs from upload to a published, downloadable PEFT adapter with eval scores (4);
 *   - kill -9 of a worker mid-training: resumed under attempt 2 from the last commit, at most one
 *     checkpoint interval lost, and a bitwise identical adapter to an uninterrupted run (2, 5);
 *   - cancel while running: AttemptStopped(cancel) within the kill deadline, JobCancelled,
 *     nothing published, staging objects deleted (6, 4);
 *   - cancel racing completion: the outcome is the one the log order says (3, 4);
 *   - the object server down during a checkpoint: retried, the job completes (5);
 *   - a partitioned worker (in its own network namespace behind a proxy the test cuts) kills its
 *     executor before the scheduler declares the attempt lost and dispatches a new one (2).
 *
 * Environment (tests/meson.build sets them): LATHE_TEST_LATHE, LATHE_TEST_LATHED (the binaries),
 * LATHE_E2E_CACHE (where the base model is cached), LATHE_SOURCE_ROOT; the stack's LATHE_KAFKA_*
 * and LATHE_S3_* from `eval "$(ops/stack env)"`. Tests run one at a time (CRITERION_JOBS=1): they
 * share two cores. The scheduler runs with a 10 s lease (LATHE_LEASE_MS) so lease expiry is quick. */

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_client.h"
#include "lt_crypto.h"
#include "lt_store.h"

#define MASTER_KEY "5b1f0c2d3e4f5061728394a5b6c7d8e9f0112233445566778899aabbccddeeff"
#define MODEL "lathe-tiny"
#define LEASE_MS 10000
#define LEASE_MARGIN_MS 3000
#define KILL_DEADLINE_MS 30000 /* lt_worker_conf_t's default; lathed does not change it */

static char err[1024];
static char lathe_bin[1024], lathed_bin[1024], models_dir[1024], tmp_dir[512], tenant[64], api_key[128];
static lt_avro_registry_t *reg;

/* ---------------------------------------------------------------- small helpers */

static int64_t wall_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static void msleep(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&t, NULL);
}

/* Runs a shell command; its stdout (caller frees) and exit status. */
static char *run(const char *cmd, int *rc) {
  FILE *p = popen(cmd, "r");
  cr_assert(p, "popen %s", cmd);
  size_t cap = 1 << 16, n = 0, r;
  char *out = malloc(cap);
  while ((r = fread(out + n, 1, cap - n - 1, p)) > 0) n += r;
  out[n] = '\0';
  int st = pclose(p);
  if (rc) *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  size_t got = fread(b, 1, (size_t)n, f);
  fclose(f);
  b[got] = '\0';
  if (len) *len = got;
  return b;
}

static void sha256_hex(const void *p, size_t n, char out[65]) {
  uint8_t d[32];
  lt_crypto_sha256(p, n, d);
  lt_crypto_hex(d, 32, out);
}

/* ---------------------------------------------------------------- child processes */

typedef struct proc {
  pid_t pid;
  char name[32];
  char log[600];
  bool expect_exit; /* killed on purpose: its death is not a failure */
} proc_t;

#define MAX_PROCS 12
static proc_t procs[MAX_PROCS];
static int nprocs;

/* The last lines of a log, for failure messages (static buffer). */
static const char *log_tail(const char *path) {
  static char buf[3000];
  size_t n = 0;
  char *all = slurp(path, &n);
  if (!all) return "(no log)";
  const char *from = n > sizeof buf - 1 ? all + n - (sizeof buf - 1) : all;
  snprintf(buf, sizeof buf, "%s", from);
  free(all);
  return buf;
}

/* Starts `lathed --role ROLE` (inside network namespace NETNS when not NULL) with extra
 * environment NAME=VALUE strings; stdout and stderr go to <tmp>/<name>.log. */
static proc_t *spawn(const char *name, const char *role, const char *netns, const char *const *env) {
  cr_assert(nprocs < MAX_PROCS);
  proc_t *p = &procs[nprocs++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  snprintf(p->log, sizeof p->log, "%s/%s.log", tmp_dir, name);
  p->pid = fork();
  cr_assert(p->pid >= 0);
  if (p->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a test that dies takes its daemons with it */
    int fd = open(p->log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    setenv("LATHE_INSTANCE", name, 1);
    for (int i = 0; env && env[i]; i++) putenv((char *)env[i]);
    if (netns)
      execl("/usr/sbin/ip", "ip", "netns", "exec", netns, lathed_bin, "--role", role, (char *)NULL);
    else if (strcmp(role, "api") == 0)
      execl(lathed_bin, "lathed", "--role", role, "--port", "0", (char *)NULL);
    else
      execl(lathed_bin, "lathed", "--role", role, (char *)NULL);
    _exit(127);
  }
  return p;
}

/* Fails the test if a daemon died that should not have. */
static void check_alive(void) {
  for (int i = 0; i < nprocs; i++) {
    proc_t *p = &procs[i];
    int st;
    if (p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == p->pid) {
      p->pid = 0;
      if (!p->expect_exit) cr_assert_fail("%s exited (status %d); its log ends:\n%s", p->name, st, log_tail(p->log));
    }
  }
}

static void kill_proc(proc_t *p, int sig) {
  if (p->pid <= 0) return;
  p->expect_exit = true;
  kill(p->pid, sig);
  if (sig == SIGKILL) {
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
  }
}

static void stop_all(void) {
  for (int i = 0; i < nprocs; i++)
    if (procs[i].pid > 0) {
      procs[i].expect_exit = true;
      kill(procs[i].pid, SIGTERM);
    }
  for (int i = 0; i < nprocs; i++) {
    proc_t *p = &procs[i];
    for (int k = 0; p->pid > 0 && k < 100; k++) {
      if (waitpid(p->pid, NULL, WNOHANG) == p->pid) p->pid = 0;
      else msleep(100);
    }
    if (p->pid > 0) {
      kill(p->pid, SIGKILL);
      waitpid(p->pid, NULL, 0);
      p->pid = 0;
    }
  }
  nprocs = 0;
}

/* Is this pid gone or a zombie? */
static bool pid_dead(pid_t pid) {
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

/* The pid of the executor a worker started for job/attempt, from its log line
 * "started <job> attempt <n> (pid <pid>)"; 0 if not (yet) there. */
static pid_t executor_pid(const proc_t *w, const char *job, int attempt) {
  char *all = slurp(w->log, NULL);
  if (!all) return 0;
  char pat[160];
  snprintf(pat, sizeof pat, "started %s attempt %d (pid ", job, attempt);
  char *p = strstr(all, pat);
  pid_t pid = p ? (pid_t)atoi(p + strlen(pat)) : 0;
  free(all);
  return pid;
}

static bool log_has(const proc_t *p, const char *needle) {
  char *all = slurp(p->log, NULL);
  bool yes = all && strstr(all, needle);
  free(all);
  return yes;
}

/* ---------------------------------------------------------------- the log, read back */

typedef struct tail {
  lt_bus_consumer_t *c;
  lt_avro_decoder_t *dec;
  json_t *recs; /* every record so far: {"topic": base name, "partition", "offset", "type", "r": {..}} */
  char names[4][128];
} tail_t;

static const char *const tail_topics[4] = {"control", "progress", "artifacts", "workers"};

static tail_t *tail_open(void) {
  tail_t *t = calloc(1, sizeof *t);
  lt_bus_conf_t *conf = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_from_env(conf, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_avro_decoder_new(reg, &t->dec, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_consumer_new(conf, NULL, &t->c, err, sizeof err), LT_OK, "%s", err);
  lt_bus_admin_t *admin;
  cr_assert_eq(lt_bus_admin_new(conf, &admin, err, sizeof err), LT_OK, "%s", err);
  lt_bus_tp_t parts[128];
  size_t np = 0;
  for (int i = 0; i < 4; i++) {
    int count = 0;
    lt_bus_topic_name(conf, tail_topics[i], t->names[i], sizeof t->names[i]);
    cr_assert_eq(lt_bus_admin_describe_topic(admin, t->names[i], 10000, &count, err, sizeof err), LT_OK, "%s", err);
    for (int p = 0; p < count && np < 128; p++)
      parts[np++] = (lt_bus_tp_t){.topic = t->names[i], .partition = p, .offset = LT_BUS_OFFSET_BEGINNING};
  }
  lt_bus_admin_destroy(admin);
  cr_assert_eq(lt_bus_consumer_assign(t->c, parts, np, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_destroy(conf);
  t->recs = json_array();
  return t;
}

static void tail_close(tail_t *t) {
  if (!t) return;
  lt_bus_consumer_destroy(t->c);
  lt_avro_decoder_destroy(t->dec);
  json_decref(t->recs);
  free(t);
}

/* Takes in whatever arrived, waiting up to ms for the first record. */
static void tail_poll(tail_t *t, int ms) {
  for (int i = 0; i < 10000; i++) {
    const lt_bus_msg_t *m = NULL;
    if (lt_bus_consumer_poll(t->c, i == 0 ? ms : 0, &m, err, sizeof err) != LT_OK || !m) return;
    size_t len;
    const void *v = lt_bus_msg_value(m, &len);
    lt_avro_record_t *rec;
    json_t *j = NULL;
    if (!v || lt_avro_decode(t->dec, v, len, &rec, NULL, 0) != LT_OK ||
        lt_avro_record_to_jansson(rec, &j, NULL, 0) != LT_OK)
      continue;
    const char *topic = lt_bus_msg_topic(m), *base = topic;
    for (int k = 0; k < 4; k++)
      if (strcmp(topic, t->names[k]) == 0) base = tail_topics[k];
    json_array_append_new(t->recs, json_pack("{s:s,s:i,s:I,s:s,s:o}", "topic", base, "partition",
                                             (int)lt_bus_msg_partition(m), "offset",
                                             (json_int_t)lt_bus_msg_offset(m), "type", lt_avro_record_type(rec),
                                             "r", j));
  }
}

static const char *rs(json_t *rec, const char *field) {
  return json_string_value(json_object_get(json_object_get(rec, "r"), field));
}
static json_int_t ri(json_t *rec, const char *field) {
  return json_integer_value(json_object_get(json_object_get(rec, "r"), field));
}
static bool rb(json_t *rec, const char *field) { return json_is_true(json_object_get(json_object_get(rec, "r"), field)); }

/* The records of a job in log order (its control partition's offsets; the other topics' records
 * in the order they were read). type NULL: any; attempt 0: any. New reference. */
static json_t *records(tail_t *t, const char *type, const char *job, int attempt) {
  json_t *out = json_array();
  size_t i;
  json_t *r;
  json_array_foreach(t->recs, i, r) {
    if (type && strcmp(json_string_value(json_object_get(r, "type")), type) != 0) continue;
    if (job && (!rs(r, "job_id") || strcmp(rs(r, "job_id"), job) != 0)) continue;
    if (attempt && ri(r, "attempt") != attempt) continue;
    json_array_append(out, r);
  }
  return out;
}

static json_t *first(tail_t *t, const char *type, const char *job, int attempt) {
  json_t *all = records(t, type, job, attempt);
  json_t *r = json_array_size(all) ? json_array_get(all, 0) : NULL;
  json_decref(all); /* still referenced by t->recs */
  return r;
}

/* Waits (polling the log, checking the daemons) until a record matches; fails after timeout. */
static json_t *wait_for(tail_t *t, const char *type, const char *job, int attempt, int timeout_ms) {
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < timeout_ms;) {
    json_t *r = first(t, type, job, attempt);
    if (r) return r;
    check_alive();
    tail_poll(t, 200);
  }
  /* What the log did hold for the job, to tell a slow fleet from another outcome. */
  char seen[2048] = "";
  size_t used = 0, i;
  json_t *all = records(t, NULL, job, 0), *r;
  json_array_foreach(all, i, r) if (used < sizeof seen - 64) used += (size_t)snprintf(
      seen + used, sizeof seen - used, " %s(%lld)", json_string_value(json_object_get(r, "type")),
      (long long)ri(r, "attempt"));
  json_decref(all);
  cr_assert_fail("no %s for job %s (attempt %d) within %d s; its records:%s", type, job ? job : "*", attempt,
                 timeout_ms / 1000, seen);
  return NULL;
}

/* Waits until a worker's heartbeat shows it owns dispatch partitions (it joined the group). */
static void wait_owns_partitions(tail_t *t, const char *worker) {
  for (int64_t t0 = wall_ms();; tail_poll(t, 300)) {
    cr_assert_lt(wall_ms() - t0, 120000, "%s never reported owning dispatch partitions", worker);
    json_t *hbs = records(t, "WorkerHeartbeat", NULL, 0);
    bool owns = false;
    size_t i;
    json_t *r;
    json_array_foreach(hbs, i, r) if (rs(r, "worker_id") && !strcmp(rs(r, "worker_id"), worker) &&
                                      json_array_size(json_object_get(json_object_get(r, "r"), "owned_partitions")) > 0)
        owns = true;
    json_decref(hbs);
    if (owns) return;
    check_alive();
  }
}

/* ---------------------------------------------------------------- the API */

static lt_client_t *client;
static proc_t *api_proc;

static void start_api(void) {
  api_proc = spawn("api", "api", NULL, NULL);
  unsigned port = 0;
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 30000 && !port; msleep(100)) {
    check_alive();
    char *all = slurp(api_proc->log, NULL);
    char *p = all ? strstr(all, "listening on http://") : NULL;
    if (p) sscanf(strchr(p + strlen("listening on http://"), ':') + 1, "%u", &port);
    free(all);
  }
  cr_assert(port, "the api printed no port; log:\n%s", log_tail(api_proc->log));
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", port);
  lt_client_opts_t o = {.url = url, .api_key = api_key, .timeout_s = 120};
  cr_assert_eq(lt_client_new(&o, &client, err, sizeof err), LT_OK, "%s", err);
  /* Ready when it knows the tenant's key. */
  int status = 0;
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 60000 && status != 200; msleep(200)) {
    lt_client_resp_t r;
    if (lt_client_request(client, "GET", "/v1/jobs", NULL, 0, NULL, 0, NULL, &r, err, sizeof err) == LT_OK) {
      status = r.status;
      lt_client_resp_free(&r);
    }
    check_alive();
  }
  cr_assert_eq(status, 200, "the api never accepted the tenant's key; log:\n%s", log_tail(api_proc->log));
}

static lt_client_resp_t req(const char *method, const char *path, const char *body, size_t len) {
  lt_client_resp_t r;
  cr_assert_eq(lt_client_request(client, method, path, NULL, 0, body, len, NULL, &r, err, sizeof err), LT_OK,
               "%s %s: %s", method, path, err);
  return r;
}

static void upload_dataset(char *id, size_t n) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s/task_train.jsonl", models_dir, MODEL);
  size_t len;
  char *data = slurp(path, &len);
  cr_assert(data, "no %s", path);
  /* The first 400 examples: 20 held out for eval keep the final eval (greedy generation) short. */
  char *cut = data;
  for (int lines = 0; cut && lines < 400; lines++) cut = strchr(cut, '\n') ? strchr(cut, '\n') + 1 : NULL;
  if (cut) len = (size_t)(cut - data);
  lt_client_resp_t r = req("POST", "/v1/datasets?name=date-iso", data, len);
  free(data);
  cr_assert_eq(r.status, 201, "upload: %d %s", r.status, r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

/* Submits a managed job; returns its id. */
static void submit(const char *dataset, int max_steps, int ckpt_interval, int seed, char *id, size_t n) {
  json_t *body = json_pack("{s:s,s:s,s:{s:i,s:i,s:i,s:f,s:i,s:i,s:i}}", "base_model", MODEL, "dataset_id", dataset,
                           "hyperparameters", "max_steps", max_steps, "batch_size", 8, "checkpoint_interval",
                           ckpt_interval, "lora_dropout", 0.0, "seed", seed, "warmup_steps", 2, "max_seq_len", 64);
  lt_client_resp_t r;
  cr_assert_eq(lt_client_json(client, "POST", "/v1/jobs", body, NULL, &r, err, sizeof err), LT_OK, "%s", err);
  json_decref(body);
  cr_assert(r.status == 201 || r.status == 202, "submit: %d %s", r.status, r.body);
  const char *jid = json_string_value(json_object_get(r.json, "id"));
  if (!jid) jid = json_string_value(json_object_get(r.json, "job_id"));
  cr_assert(jid, "no job id in %s", r.body);
  snprintf(id, n, "%s", jid);
  lt_client_resp_free(&r);
}

static int cancel(const char *job) {
  char path[512];
  snprintf(path, sizeof path, "/v1/jobs/%s/cancel", job);
  lt_client_resp_t r = req("POST", path, NULL, 0);
  int status = r.status;
  lt_client_resp_free(&r);
  return status;
}

/* GET /v1/jobs/{id} (new reference). */
static json_t *job_info(const char *job) {
  char path[512];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  lt_client_resp_t r = req("GET", path, NULL, 0);
  cr_assert_eq(r.status, 200, "%s: %d %s", path, r.status, r.body);
  json_t *j = json_incref(r.json);
  lt_client_resp_free(&r);
  return j;
}

/* Waits until the API shows the job in a terminal state; returns that state (static). */
static const char *wait_terminal(const char *job, int timeout_ms) {
  static char state[32];
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < timeout_ms; msleep(300)) {
    json_t *j = job_info(job);
    const char *sv = json_string_value(json_object_get(j, "state"));
    snprintf(state, sizeof state, "%s", sv ? sv : "?");
    for (char *p = state; *p; p++) *p = (char)toupper((unsigned char)*p); /* the API says "completed" */
    json_decref(j);
    if (!strcmp(state, "COMPLETED") || !strcmp(state, "FAILED") || !strcmp(state, "CANCELLED") ||
        !strcmp(state, "REJECTED"))
      return state;
    check_alive();
  }
  cr_assert_fail("job %s not terminal within %d s (last state %s)", job, timeout_ms / 1000, state);
  return NULL;
}

/* Downloads a published artifact; *status gets the HTTP status. Caller frees. */
static char *download(const char *job, const char *name, size_t *len, int *status) {
  char path[512];
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/%s", job, name);
  lt_client_resp_t r = req("GET", path, NULL, 0);
  *status = r.status;
  char *b = malloc(r.len + 1);
  memcpy(b, r.body, r.len);
  b[r.len] = '\0';
  *len = r.len;
  lt_client_resp_free(&r);
  return b;
}

/* ---------------------------------------------------------------- store */

static lt_store_t *open_store(void) {
  lt_store_s3_conf_t s3;
  lt_store_t *st;
  cr_assert_eq(lt_store_s3_conf_from_env(&s3, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_s3_new(&st, &s3, err, sizeof err), LT_OK, "%s", err);
  return st;
}

static lt_err_t count_key(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key;
  (void)info;
  (*(int *)ctx)++;
  return LT_OK;
}

static int count_objects(const char *prefix) {
  lt_store_t *st = open_store();
  int n = 0;
  char next[LT_STORE_KEY_MAX + 1] = "";
  cr_assert_eq(lt_store_list(st, prefix, NULL, 1000, count_key, &n, next, sizeof next, err, sizeof err), LT_OK, "%s",
               err);
  lt_store_free(st);
  return n;
}

/* The highest checkpoint step s in (from, to], a multiple of every, with any object staged under
 * PREFIX<s>/ (HEADs of the checkpoint's objects: a listing of a prefix where an upload was cut
 * by a kill fails on S3Proxy, whose filesystem backend lists the cut PUT's temporary file); 0 if
 * none. */
static json_int_t max_staged_step(const char *prefix, json_int_t from, json_int_t to, json_int_t every) {
  static const char *const names[] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                      "metrics.json", "eval.json", "config.json", "samples.json"};
  lt_store_t *st = open_store();
  json_int_t found = 0;
  for (json_int_t step = from - from % every + every; step <= to; step += every)
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
      char key[512];
      lt_store_info_t info;
      snprintf(key, sizeof key, "%s%lld/%s", prefix, (long long)step, names[i]);
      if (lt_store_head(st, key, &info, NULL, 0) == LT_OK) found = step;
    }
  lt_store_free(st);
  return found;
}

/* No step of an attempt was reported while its newest commit lay more than one interval behind:
 * what a crash at that moment would have lost. Returns the largest lag seen. The worker stamps a
 * commit before it records it and a step when the executor reports it, and the executor reports
 * the step after a checkpoint only once the worker has told it the commit is recorded. */
static json_int_t commits_lag(tail_t *t, const char *job, int attempt, json_int_t from, json_int_t interval) {
  json_t *cs = records(t, "CheckpointCommitted", job, attempt), *ps = records(t, "StepCompleted", job, attempt);
  cr_assert_gt(json_array_size(cs), 2, "attempt %d of %s committed too few checkpoints to judge", attempt, job);
  json_int_t worst = 0;
  size_t i, k;
  json_t *p, *c;
  json_array_foreach(ps, i, p) {
    json_int_t newest = from, at = ri(p, "occurred_at");
    json_array_foreach(cs, k, c) if (ri(c, "occurred_at") <= at && ri(c, "step") > newest) newest = ri(c, "step");
    json_int_t lag = ri(p, "step") - newest;
    cr_assert_leq(lag, interval, "attempt %d reported step %lld while its newest commit was step %lld", attempt,
                  (long long)ri(p, "step"), (long long)newest);
    if (lag > worst) worst = lag;
  }
  json_decref(cs);
  json_decref(ps);
  return worst;
}

/* ---------------------------------------------------------------- the base model (cached) */

static void ensure_model(void) {
  const char *cache = getenv("LATHE_E2E_CACHE");
  snprintf(models_dir, sizeof models_dir, "%s", cache && *cache ? cache : "/tmp/lathe-e2e-models");
  mkdir(models_dir, 0755);
  char lock[1100], probe[1100];
  snprintf(lock, sizeof lock, "%s/.lock", models_dir);
  snprintf(probe, sizeof probe, "%s/%s/task_train.jsonl", models_dir, MODEL);
  int fd = open(lock, O_RDWR | O_CREAT, 0644);
  cr_assert(fd >= 0);
  flock(fd, LOCK_EX); /* one maker at a time */
  if (access(probe, R_OK) != 0) {
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "'%s' model make --steps 20 --threads 2 --force --out '%s/%s' 2>&1", lathe_bin,
             models_dir, MODEL);
    int rc;
    char *out = run(cmd, &rc);
    cr_assert_eq(rc, 0, "lathe model make failed: %s", out);
    free(out);
  }
  flock(fd, LOCK_UN);
  close(fd);
  cr_assert_eq(access(probe, R_OK), 0, "no %s after lathe model make", probe);
}

/* ---------------------------------------------------------------- per-test setup */

static char prefix[64];

static void setup(void) {
  if (!getenv("LATHE_KAFKA_BOOTSTRAP") || !getenv("LATHE_S3_ENDPOINT"))
    cr_skip_test("needs the local stack: eval \"$(ops/stack env)\"");
  const char *l = getenv("LATHE_TEST_LATHE"), *d = getenv("LATHE_TEST_LATHED");
  snprintf(lathe_bin, sizeof lathe_bin, "%s", l ? l : "./lathe");
  snprintf(lathed_bin, sizeof lathed_bin, "%s", d ? d : "./lathed");
  ensure_model();
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(prefix, sizeof prefix, "te2e%.8s.", rnd);
  setenv("LATHE_TOPIC_PREFIX", prefix, 1);
  setenv("LATHE_MASTER_KEY", MASTER_KEY, 1);
  unsetenv("LATHE_MASTER_KEY_FILE");
  unsetenv("LATHE_STORE_DIR");
  setenv("LATHE_MODELS_DIR", models_dir, 1);
  setenv("LATHE_WORKER_THREADS", "1", 1);
  setenv("LATHE_WORKER_SLOTS", "1", 1);
  char v[32];
  snprintf(v, sizeof v, "%d", LEASE_MS);
  setenv("LATHE_LEASE_MS", v, 1);
  snprintf(v, sizeof v, "%d", LEASE_MARGIN_MS);
  setenv("LATHE_LEASE_MARGIN_MS", v, 1);
  setenv("LATHE_START_TIMEOUT_MS", "30000", 1);
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/lathe-e2e-%d-%.8s", (int)getpid(), rnd);
  mkdir(tmp_dir, 0700);
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK, "%s", err);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' admin topics 2>&1", lathe_bin);
  int rc;
  char *out = run(cmd, &rc);
  cr_assert_eq(rc, 0, "lathe admin topics: %s", out);
  free(out);
  snprintf(tenant, sizeof tenant, "e2e-%.10s", rnd);
  for (char *p = tenant; *p; p++)
    if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
  snprintf(cmd, sizeof cmd, "'%s' admin tenant create %s --json", lathe_bin, tenant);
  out = run(cmd, &rc);
  cr_assert_eq(rc, 0, "%s: %s", cmd, out);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert(j && json_string_value(json_object_get(j, "api_key")), "no api_key in %s", out);
  snprintf(api_key, sizeof api_key, "%s", json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
}

static void teardown(void) {
  stop_all();
  lt_client_destroy(client);
  client = NULL;
  if (reg) {
    /* The topics of this prefix go; their records were only this test's. */
    lt_bus_conf_t *conf = lt_bus_conf_new();
    lt_bus_admin_t *admin = NULL;
    char **names = NULL;
    size_t nn = 0;
    if (lt_bus_conf_from_env(conf, NULL, 0) == LT_OK && lt_bus_admin_new(conf, &admin, NULL, 0) == LT_OK &&
        lt_bus_admin_list_topics(admin, 10000, &names, &nn, NULL, 0) == LT_OK) {
      const char *mine[64];
      size_t n = 0;
      for (size_t i = 0; i < nn && n < 64; i++)
        if (strncmp(names[i], prefix, strlen(prefix)) == 0) mine[n++] = names[i];
      if (n) lt_bus_admin_delete_topics(admin, mine, n, 10000, NULL, 0);
      lt_bus_admin_free_names(names);
    }
    lt_bus_admin_destroy(admin);
    lt_bus_conf_destroy(conf);
    lt_avro_registry_destroy(reg);
    reg = NULL;
  }
  if (!getenv("LATHE_E2E_KEEP") && tmp_dir[0]) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    int rc = system(cmd);
    (void)rc;
  }
}

/* The control plane: api, scheduler, publisher. */
static void start_control_plane(void) {
  spawn("scheduler", "scheduler", NULL, NULL);
  spawn("publisher", "publisher", NULL, NULL);
  start_api();
}

TestSuite(e2e, .init = setup, .fini = teardown, .timeout = 900);

/* ---------------------------------------------------------------- artifact checks */

/* A safetensors file by its format: 8-byte LE header length, JSON header, F32 tensors laid out
 * back to back; PEFT names; lora_A (r, in) and lora_B (out, r); B trained away from zero. */
static void check_peft_pair(const char *st, size_t st_len, const char *cfg_text) {
  json_t *cfg = json_loads(cfg_text, 0, NULL);
  cr_assert(cfg, "adapter_config.json is not JSON: %s", cfg_text);
  cr_assert_str_eq(json_string_value(json_object_get(cfg, "peft_type")), "LORA");
  json_int_t r = json_integer_value(json_object_get(cfg, "r"));
  cr_assert(r > 0, "adapter_config.json has no r");
  cr_assert(json_is_number(json_object_get(cfg, "lora_alpha")));
  cr_assert(json_array_size(json_object_get(cfg, "target_modules")) > 0);
  cr_assert(st_len > 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)st[i];
  cr_assert(hlen > 2 && 8 + hlen <= st_len, "bad safetensors header length %llu", (unsigned long long)hlen);
  json_t *h = json_loadb(st + 8, hlen, 0, NULL);
  cr_assert(h, "safetensors header is not JSON");
  const char *name;
  json_t *t;
  size_t tensors = 0, a = 0, b = 0;
  uint64_t data_len = st_len - 8 - hlen, covered = 0;
  bool b_nonzero = false;
  json_object_foreach(h, name, t) {
    if (!strcmp(name, "__metadata__")) continue;
    tensors++;
    cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32", "%s", name);
    json_t *shape = json_object_get(t, "shape"), *off = json_object_get(t, "data_offsets");
    cr_assert_eq(json_array_size(shape), 2, "%s", name);
    json_int_t d0 = json_integer_value(json_array_get(shape, 0)), d1 = json_integer_value(json_array_get(shape, 1));
    json_int_t o0 = json_integer_value(json_array_get(off, 0)), o1 = json_integer_value(json_array_get(off, 1));
    cr_assert(o0 >= 0 && o1 >= o0 && (uint64_t)o1 <= data_len, "%s: offsets outside the data", name);
    cr_assert_eq(o1 - o0, d0 * d1 * 4, "%s: %lld bytes for shape (%lld, %lld)", name, (long long)(o1 - o0),
                 (long long)d0, (long long)d1);
    covered += (uint64_t)(o1 - o0);
    int layer;
    char kind[16], proj[16], ab;
    cr_assert_eq(sscanf(name, "base_model.model.model.layers.%d.%15[a-z_].%15[a-z_].lora_%c.weight", &layer, kind,
                        proj, &ab),
                 4, "not a PEFT tensor name: %s", name);
    cr_assert(!strcmp(kind, "self_attn") || !strcmp(kind, "mlp"), "%s", name);
    if (ab == 'A') {
      a++;
      cr_assert_eq(d0, r, "%s: lora_A is (r, in)", name);
    } else {
      cr_assert_eq(ab, 'B', "%s", name);
      b++;
      cr_assert_eq(d1, r, "%s: lora_B is (out, r)", name);
      const char *p = st + 8 + hlen + o0;
      for (json_int_t k = 0; k < d0 * d1 && !b_nonzero; k++) {
        float f;
        memcpy(&f, p + 4 * k, 4);
        cr_assert(isfinite(f), "%s holds a non-finite value", name);
        if (f != 0) b_nonzero = true;
      }
    }
  }
  cr_assert(tensors > 0 && a == b, "%zu tensors, %zu lora_A, %zu lora_B", tensors, a, b);
  cr_assert_eq(covered, data_len, "tensors cover %llu of %llu data bytes", (unsigned long long)covered,
               (unsigned long long)data_len);
  cr_assert(b_nonzero, "every lora_B is zero: the adapter was not trained");
  json_decref(h);
  json_decref(cfg);
}

/* The published adapter's bytes, checked against ArtifactPublished's plaintext SHA-256. */
static char *published_adapter(tail_t *t, const char *job, size_t *len, char sha[65]) {
  json_t *ap = wait_for(t, "ArtifactPublished", job, 0, 120000);
  int status = 0;
  char *st = NULL;
  /* The API serves what its projection has folded; it may be a moment behind our consumer. */
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 60000; msleep(200)) {
    free(st);
    st = download(job, "adapter_model.safetensors", len, &status);
    if (status != 404) break;
  }
  cr_assert_eq(status, 200, "adapter download: %d %s", status, st);
  sha256_hex(st, *len, sha);
  size_t i;
  json_t *a;
  bool listed = false;
  json_array_foreach(json_object_get(json_object_get(ap, "r"), "artifacts"), i, a) {
    if (strcmp(json_string_value(json_object_get(a, "name")), "adapter_model.safetensors") == 0) {
      listed = true;
      cr_assert_str_eq(json_string_value(json_object_get(a, "sha256")), sha,
                       "the served adapter is not the one ArtifactPublished names");
    }
  }
  cr_assert(listed, "ArtifactPublished does not list adapter_model.safetensors");
  return st;
}

/* ================================================================ 1. upload -> published */

Test(e2e, a_job_runs_from_upload_to_a_published_peft_adapter_with_eval_against_base) {
  start_control_plane();
  spawn("w1", "worker", NULL, NULL);
  tail_t *t = tail_open();
  char ds[64], job[64];
  upload_dataset(ds, sizeof ds);
  submit(ds, 8, 4, 11, job, sizeof job);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 1, 30000);
  json_t *ap = wait_for(t, "ArtifactPublished", job, 0, 120000);
  /* Publish after commit: the promoted checkpoint is the final commit JobCompleted names. */
  json_t *commits = records(t, "CheckpointCommitted", job, 1);
  cr_assert_geq(json_array_size(commits), 2, "a commit at step 4 and a final one at step 8");
  json_t *last = json_array_get(commits, json_array_size(commits) - 1);
  cr_assert(rb(last, "final"));
  cr_assert_eq(ri(last, "step"), 8);
  cr_assert_str_eq(rs(done, "checkpoint_event_id"), rs(last, "event_id"));
  cr_assert_str_eq(rs(ap, "checkpoint_event_id"), rs(last, "event_id"));
  json_decref(commits);

  size_t st_len, cfg_len, ev_len, x_len;
  char sha[65];
  int status;
  char *st = published_adapter(t, job, &st_len, sha);
  char *cfg = download(job, "adapter_config.json", &cfg_len, &status);
  cr_assert_eq(status, 200, "%s", cfg);
  check_peft_pair(st, st_len, cfg);
  char *ev = download(job, "eval.json", &ev_len, &status);
  cr_assert_eq(status, 200, "%s", ev);
  json_t *e = json_loads(ev, 0, NULL);
  cr_assert(e, "eval.json is not JSON: %s", ev);
  const char *sides[2] = {"fine_tuned", "base"};
  for (int s = 0; s < 2; s++) {
    json_t *m = json_object_get(e, sides[s]);
    cr_assert(json_is_object(m), "eval.json has no \"%s\": %s", sides[s], ev);
    double vl = json_number_value(json_object_get(m, "val_loss"));
    double acc = json_number_value(json_object_get(m, "token_accuracy"));
    cr_assert(isfinite(vl) && vl > 0, "%s val_loss %g", sides[s], vl);
    cr_assert(acc >= 0 && acc <= 1, "%s token_accuracy %g", sides[s], acc);
    cr_assert(json_is_number(json_object_get(m, "perplexity")), "%s perplexity", sides[s]);
  }
  cr_assert(json_is_true(json_object_get(e, "final")));
  cr_assert_str_eq(json_string_value(json_object_get(e, "config_digest")), rs(ap, "config_digest"));
  json_decref(e);
  /* Staged-only objects are never served. */
  char *x = download(job, "state.bin", &x_len, &status);
  cr_assert_eq(status, 404, "state.bin answered %d", status);
  free(x);
  free(st);
  free(cfg);
  free(ev);
  tail_close(t);
}

/* ================================================================ 2. kill -9 of a worker */

Test(e2e, a_worker_killed_mid_training_is_resumed_elsewhere_from_its_last_commit_bit_for_bit) {
  /* Long enough to be mid-training once w2 owns partitions: uploads run beside training, so a
   * 60-step job could finish before the kill. */
  const int steps = 300, interval = 4;
  start_control_plane();
  proc_t *w1 = spawn("w1", "worker", NULL, NULL);
  tail_t *t = tail_open();
  char ds[64], job[64], ref[64];
  upload_dataset(ds, sizeof ds);
  submit(ds, steps, interval, 42, job, sizeof job);
  cr_assert_str_eq(rs(wait_for(t, "AttemptStarted", job, 1, 300000), "worker_id"), "w1");
  /* A second worker waits in the group (it owns dispatch partitions before w1 dies). */
  spawn("w2", "worker", NULL, NULL);
  wait_owns_partitions(t, "w2");
  /* Mid-interval: a step past the newest commit of attempt 1, then kill -9 the worker. */
  json_int_t committed = 0;
  for (int64_t t0 = wall_ms();; tail_poll(t, 100)) {
    cr_assert_lt(wall_ms() - t0, 300000, "attempt 1 never got past a commit");
    json_t *cs = records(t, "CheckpointCommitted", job, 1), *ps = records(t, "StepCompleted", job, 1);
    json_int_t max = 0;
    size_t i;
    json_t *r;
    committed = 0;
    json_array_foreach(cs, i, r) if (ri(r, "step") > committed) committed = ri(r, "step");
    json_array_foreach(ps, i, r) if (ri(r, "step") > max) max = ri(r, "step");
    json_decref(cs);
    json_decref(ps);
    if (committed > 0 && max > committed) break;
    cr_assert(!first(t, "JobCompleted", job, 0), "the job completed before the kill: make it longer");
    check_alive();
  }
  cr_assert_eq(committed % interval, 0);
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0, "w1 logged no executor pid");
  kill_proc(w1, SIGKILL);
  int64_t killed_at = wall_ms();
  cr_assert(!first(t, "JobCompleted", job, 0), "the job completed before the kill: make it longer");
  /* Its executor must not go on training a fenced attempt on a dead node. */
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 10000 && !pid_dead(ex);) msleep(50);
  if (!pid_dead(ex)) {
    kill(ex, SIGKILL);
    cr_assert_fail("the executor (pid %d) of the killed worker was still running 10 s later", (int)ex);
  }

  json_t *lost = wait_for(t, "AttemptStopped", job, 1, 120000);
  cr_assert_str_eq(rs(lost, "reason"), "lost");
  json_t *s2 = wait_for(t, "AttemptStarted", job, 2, 120000);
  cr_assert_str_eq(rs(s2, "worker_id"), "w2");
  /* The last commit of attempt 1 in the log is what attempt 2 resumes from. */
  json_t *commits1 = records(t, "CheckpointCommitted", job, 1);
  json_int_t last_commit = ri(json_array_get(commits1, json_array_size(commits1) - 1), "step");
  json_decref(commits1);
  cr_assert_eq(ri(s2, "resume_step"), last_commit, "attempt 2 resumes from step %lld, the last commit is %lld",
               (long long)ri(s2, "resume_step"), (long long)last_commit);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 0, 30000);
  cr_assert_eq(ri(done, "attempt"), 2);
  tail_poll(t, 500);
  /* Steps lost: the progress attempt 1 reported beyond the commit, at most one interval. */
  json_t *p1 = records(t, "StepCompleted", job, 1), *p2 = records(t, "StepCompleted", job, 2);
  json_int_t max1 = 0, min2 = steps + 1;
  size_t i;
  json_t *r;
  json_array_foreach(p1, i, r) if (ri(r, "step") > max1) max1 = ri(r, "step");
  json_array_foreach(p2, i, r) if (ri(r, "step") < min2) min2 = ri(r, "step");
  cr_assert_eq(min2, last_commit + 1, "attempt 2's first step is %lld", (long long)min2);
  /* Progress records the dead worker had not delivered die with it, so attempt 1's last reported
   * step can equal its last commit (a commit can land between the test's look and the kill).
   * Checkpoints upload while training goes on, but the executor holds the update after a
   * checkpoint until the worker has recorded its commit: at most one interval is lost. */
  cr_assert(max1 - last_commit <= interval && max1 >= last_commit,
            "attempt 1 reached step %lld, resumed from %lld", (long long)max1, (long long)last_commit);
  json_decref(p1);
  json_decref(p2);
  /* The dead worker's executor did not go on training attempt 1 (and staging its checkpoints). */
  char staged1[256];
  snprintf(staged1, sizeof staged1, "staging/%s/%s/1/", tenant, job);
  /* One upload after the last commit may have been under way, none further (an executor that
   * lived on would also stop there, waiting for a commit its dead worker cannot record). */
  json_int_t staged = max_staged_step(staged1, last_commit + 2 * interval, steps, interval);
  cr_assert_eq(staged, 0,
                "attempt 1 staged a checkpoint of step %lld after its worker died at step ~%lld: its executor lived on",
                (long long)staged, (long long)max1);
  cr_log_info("attempt 1 reached step %lld, attempt 2 resumed from %lld and started %lld ms after the kill",
              (long long)max1, (long long)last_commit, (long long)(ri(s2, "occurred_at") - killed_at));

  /* The same spec uninterrupted, on the same kind of worker (one thread): the same bytes. */
  size_t len_a, len_b;
  char sha_a[65], sha_b[65];
  char *a = published_adapter(t, job, &len_a, sha_a);
  submit(ds, steps, interval, 42, ref, sizeof ref);
  cr_assert_str_eq(wait_terminal(ref, 600000), "COMPLETED");
  json_t *refdone = wait_for(t, "JobCompleted", ref, 0, 30000);
  cr_assert_eq(ri(refdone, "attempt"), 1);
  /* At no moment of either run could a crash have lost more than one interval. */
  tail_poll(t, 500);
  cr_log_info("steps past the newest commit, at most: %lld (resumed run), %lld (uninterrupted run)",
              (long long)commits_lag(t, job, 2, last_commit, interval), (long long)commits_lag(t, ref, 1, 0, interval));
  char *b = published_adapter(t, ref, &len_b, sha_b);
  cr_assert_eq(len_a, len_b);
  cr_assert_str_eq(sha_a, sha_b, "the resumed run's adapter differs from the uninterrupted run's");
  cr_assert(memcmp(a, b, len_a) == 0);
  free(a);
  free(b);
  tail_close(t);
}

/* ================================================================ 3. cancel while running */

Test(e2e, cancel_while_running_stops_within_the_kill_deadline_publishes_nothing_and_deletes_staging) {
  start_control_plane();
  spawn("w1", "worker", NULL, NULL);
  tail_t *t = tail_open();
  char ds[64], job[64];
  upload_dataset(ds, sizeof ds);
  submit(ds, 400, 2, 5, job, sizeof job);
  json_t *c = wait_for(t, "CheckpointCommitted", job, 1, 600000);
  char staging[256];
  snprintf(staging, sizeof staging, "staging/%s/%s/", tenant, job);
  cr_assert_gt(count_objects(staging), 0, "the commit's objects are in staging");
  (void)c;
  int64_t asked = wall_ms();
  int status = cancel(job);
  cr_assert(status == 200 || status == 202, "cancel answered %d", status);
  json_t *cr = wait_for(t, "CancelRequested", job, 0, 30000);
  json_t *stopped = wait_for(t, "AttemptStopped", job, 1, KILL_DEADLINE_MS + 30000);
  int64_t stop_at = ri(stopped, "occurred_at");
  cr_assert_str_eq(rs(stopped, "reason"), "cancel");
  cr_assert(!rb(stopped, "killed"), "the executor had to be killed: it did not stop at a micro-step");
  cr_assert_lt(stop_at - ri(cr, "occurred_at"), KILL_DEADLINE_MS, "stop %lld ms after the cancel record",
               (long long)(stop_at - ri(cr, "occurred_at")));
  cr_assert_lt(stop_at - asked, KILL_DEADLINE_MS);
  cr_assert_lt(ri(stopped, "step"), 400);
  /* How far training went on after the cancel was recorded (reported, not asserted: the worker
   * sees the record some time after it is written; the bound asserted is the kill deadline). */
  json_t *prog = records(t, "StepCompleted", job, 1);
  json_int_t before = 0;
  size_t i;
  json_t *r;
  json_array_foreach(prog, i, r) if (ri(r, "occurred_at") <= ri(cr, "occurred_at") && ri(r, "step") > before) before =
      ri(r, "step");
  json_decref(prog);
  cr_log_info("progress at step %lld when the cancel was recorded, stopped at step %lld, %lld ms later",
              (long long)before, (long long)ri(stopped, "step"), (long long)(stop_at - ri(cr, "occurred_at")));
  cr_assert_str_eq(wait_terminal(job, 60000), "CANCELLED");
  wait_for(t, "JobCancelled", job, 0, 30000);
  json_t *clean = wait_for(t, "CleanupDone", job, 1, 60000);
  cr_assert_gt(ri(clean, "staging_objects_deleted"), 0);
  cr_assert_eq(count_objects(staging), 0, "staging objects of the cancelled job remain");
  cr_assert(!first(t, "JobCompleted", job, 0));
  /* Nothing published: none recorded, none served, none in the artifacts prefix. */
  tail_poll(t, 2000);
  cr_assert(!first(t, "ArtifactPublished", job, 0), "a cancelled job was published");
  size_t len;
  char *x = download(job, "adapter_model.safetensors", &len, &status);
  cr_assert_eq(status, 404, "a cancelled job's adapter answered %d", status);
  free(x);
  char arts[256];
  snprintf(arts, sizeof arts, "tenants/%s/artifacts/%s/", tenant, job);
  cr_assert_eq(count_objects(arts), 0);
  cr_log_info("cancel -> AttemptStopped: %lld ms (step %lld)", (long long)(stop_at - asked), (long long)ri(stopped, "step"));
  tail_close(t);
}

/* ================================================================ 4. cancel racing completion */

/* The first moment lands well before completion (a cancel that must win), the others straddle
 * it: the log decides each, and both outcomes must occur for the race to have been exercised. */
typedef enum { AT_FIRST_STEP, AT_LAST_STEP, AT_FINAL_COMMIT, AT_COMPLETED, AT__N } moment_t;
static const char *const moment_names[AT__N] = {"the first step", "the last step",
                                                "the final checkpoint commit", "the completion"};

Test(e2e, cancel_racing_completion_ends_as_the_log_order_says_and_publishes_only_completions) {
  const int steps = 10;
  start_control_plane();
  spawn("w1", "worker", NULL, NULL);
  spawn("w2", "worker", NULL, NULL);
  tail_t *t = tail_open();
  char ds[64], jobs[AT__N][64];
  bool asked[AT__N] = {0};
  upload_dataset(ds, sizeof ds);
  /* The first job runs long enough that a cancel seen at its first step must come first. */
  for (int k = 0; k < AT__N; k++) submit(ds, k == AT_FIRST_STEP ? 40 * steps : steps, 3, 100 + k, jobs[k], sizeof jobs[k]);
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 900000;) {
    int pending = 0;
    for (int k = 0; k < AT__N; k++) {
      if (asked[k]) continue;
      pending++;
      json_t *hit = NULL, *all;
      size_t i;
      json_t *r;
      switch ((moment_t)k) {
      case AT_FIRST_STEP:
      case AT_LAST_STEP:
        all = records(t, "StepCompleted", jobs[k], 0);
        json_array_foreach(all, i, r) if (ri(r, "step") == (k == AT_LAST_STEP ? steps : 1)) hit = r;
        json_decref(all);
        break;
      case AT_FINAL_COMMIT:
        all = records(t, "CheckpointCommitted", jobs[k], 0);
        json_array_foreach(all, i, r) if (rb(r, "final")) hit = r;
        json_decref(all);
        break;
      default:
        hit = first(t, "JobCompleted", jobs[k], 0);
      }
      if (hit) {
        int st = cancel(jobs[k]);
        cr_assert(st == 200 || st == 202 || st == 409, "cancel of %s answered %d", jobs[k], st);
        asked[k] = true;
      }
    }
    if (!pending) break;
    check_alive();
    tail_poll(t, 50);
  }
  for (int k = 0; k < AT__N; k++) cr_assert(asked[k], "never reached %s for job %d", moment_names[k], k);
  /* Every job ends; then replay the control log and compare. */
  const char *states[AT__N];
  char saved[AT__N][32];
  for (int k = 0; k < AT__N; k++) {
    states[k] = wait_terminal(jobs[k], 300000);
    snprintf(saved[k], sizeof saved[k], "%s", states[k]);
  }
  for (int k = 0; k < AT__N; k++) {
    /* Our consumer may be a moment behind the API: wait for the job's terminal record too. */
    for (int64_t t0 = wall_ms(); !first(t, "JobCompleted", jobs[k], 0) && !first(t, "JobCancelled", jobs[k], 0) &&
                                 !first(t, "JobFailed", jobs[k], 0);
         tail_poll(t, 200))
      cr_assert_lt(wall_ms() - t0, 60000, "job %d: the API says %s, the log has no terminal record", k, saved[k]);
    if (!strcmp(saved[k], "COMPLETED")) wait_for(t, "ArtifactPublished", jobs[k], 0, 120000);
  }
  tail_poll(t, 3000); /* whatever else the publisher would have written by now */
  int cancelled = 0, completed = 0;
  for (int k = 0; k < AT__N; k++) {
    json_t *ctl = records(t, NULL, jobs[k], 0);
    long cancel_at = -1, terminal_at = -1;
    const char *terminal = NULL;
    size_t i;
    json_t *r;
    json_array_foreach(ctl, i, r) {
      if (strcmp(json_string_value(json_object_get(r, "topic")), "control")) continue;
      const char *type = json_string_value(json_object_get(r, "type"));
      long off = (long)json_integer_value(json_object_get(r, "offset"));
      if (!strcmp(type, "CancelRequested") && cancel_at < 0) cancel_at = off;
      if ((!strcmp(type, "JobCompleted") || !strcmp(type, "JobCancelled") || !strcmp(type, "JobFailed")) &&
          terminal_at < 0) {
        terminal_at = off;
        terminal = type;
      }
    }
    json_decref(ctl);
    cr_assert(terminal, "job %d has no terminal record", k);
    cr_assert_str_neq(terminal, "JobFailed", "job %d failed", k);
    bool want_cancel = cancel_at >= 0 && cancel_at < terminal_at;
    const char *want = want_cancel ? "CANCELLED" : "COMPLETED";
    json_t *pubs = records(t, "ArtifactPublished", jobs[k], 0);
    cr_assert_str_eq(saved[k], want,
                     "job %d (cancel at %s): the API says %s, the log says %s (cancel at offset %ld, first terminal "
                     "%s at %ld; %zu publications)",
                     k, moment_names[k], saved[k], want, cancel_at, terminal, terminal_at, json_array_size(pubs));
    cr_assert_eq(json_array_size(pubs), want_cancel ? 0u : 1u, "job %d (%s): %zu publications", k, want,
                 json_array_size(pubs));
    json_decref(pubs);
    /* A later GET still answers the same: one terminal outcome. */
    json_t *j = job_info(jobs[k]);
    cr_assert(strcasecmp(json_string_value(json_object_get(j, "state")), want) == 0, "job %d is now %s", k,
              json_string_value(json_object_get(j, "state")));
    json_decref(j);
    want_cancel ? cancelled++ : completed++;
    cr_log_info("job %d, cancel at %s: %s", k, moment_names[k], want);
  }
  /* A cancel after the completion cannot undo it; and the moments straddled completion (both
   * outcomes happened; which job lands where depends on timing, the log decides each). */
  cr_assert_str_eq(saved[AT_COMPLETED], "COMPLETED");
  cr_assert(cancelled > 0 && completed > 0, "%d cancelled, %d completed: the race was not exercised", cancelled,
            completed);
  tail_close(t);
}

/* ================================================================ 5. object server down */

static pid_t s3_pid;

/* A private S3Proxy on PORT with its data under DIR (the stack's jars), and its bucket. */
static pid_t start_s3proxy(int port, const char *dir) {
  const char *root = getenv("LATHE_SOURCE_ROOT");
  char props[700], logf[700], cp[1100];
  snprintf(props, sizeof props, "%s/s3proxy.properties", dir);
  snprintf(logf, sizeof logf, "%s/s3proxy.log", dir);
  snprintf(cp, sizeof cp, "%s/.stack/lib/s3proxy/*", root ? root : ".");
  FILE *f = fopen(props, "w");
  cr_assert(f);
  fprintf(f,
          "s3proxy.endpoint=http://127.0.0.1:%d\ns3proxy.authorization=aws-v2-or-v4\n"
          "s3proxy.identity=%s\ns3proxy.credential=%s\njclouds.provider=filesystem-nio2\n"
          "jclouds.identity=%s\njclouds.credential=%s\njclouds.filesystem.basedir=%s/data\n",
          port, getenv("LATHE_S3_ACCESS_KEY"), getenv("LATHE_S3_SECRET_KEY"), getenv("LATHE_S3_ACCESS_KEY"),
          getenv("LATHE_S3_SECRET_KEY"), dir);
  fclose(f);
  char data[720];
  snprintf(data, sizeof data, "%s/data", dir);
  mkdir(data, 0700);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    execlp("java", "java", "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp,
           "org.gaul.s3proxy.Main", "--properties", props, (char *)NULL);
    _exit(127);
  }
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "curl -s -o /dev/null -w '%%{http_code}' --max-time 5 -X PUT --aws-sigv4 aws:amz:us-east-1:s3 "
           "--user '%s:%s' -H 'x-amz-content-sha256: "
           "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' http://127.0.0.1:%d/%s",
           getenv("LATHE_S3_ACCESS_KEY"), getenv("LATHE_S3_SECRET_KEY"), port, getenv("LATHE_S3_BUCKET"));
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 120000; msleep(500)) {
    char *out = run(cmd, NULL);
    bool ok = !strcmp(out, "200") || !strcmp(out, "409");
    free(out);
    if (ok) return pid;
    int st;
    cr_assert(waitpid(pid, &st, WNOHANG) != pid, "s3proxy exited:\n%s", log_tail(logf));
  }
  cr_assert_fail("the private s3proxy did not answer in 120 s:\n%s", log_tail(logf));
  return 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  socklen_t l = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &l);
  close(fd);
  return ntohs(a.sin_port);
}

static void s3_fini(void) {
  if (s3_pid > 0) {
    kill(s3_pid, SIGKILL);
    waitpid(s3_pid, NULL, 0);
    s3_pid = 0;
  }
  teardown();
}

Test(e2e, the_object_server_down_during_a_checkpoint_is_retried_and_the_job_completes, .fini = s3_fini) {
  char dir[700], endpoint[64];
  snprintf(dir, sizeof dir, "%s/s3", tmp_dir);
  mkdir(dir, 0700);
  int port = free_port();
  s3_pid = start_s3proxy(port, dir);
  snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", port);
  setenv("LATHE_S3_ENDPOINT", endpoint, 1); /* every daemon of this test, and the test's own reads */
  start_control_plane();
  proc_t *w1 = spawn("w1", "worker", NULL, NULL);
  tail_t *t = tail_open();
  char ds[64], job[64];
  upload_dataset(ds, sizeof ds);
  /* Checkpoints every 3 of 60 steps: uploads run beside training, so the outage must last
   * long enough to meet one (the next upload waits for the one that retries). */
  submit(ds, 60, 3, 9, job, sizeof job);
  json_t *c1 = wait_for(t, "CheckpointCommitted", job, 1, 600000);
  cr_assert_eq(ri(c1, "step"), 3);
  /* Down while training goes on: the next checkpoints cannot be stored. */
  kill(s3_pid, SIGKILL);
  waitpid(s3_pid, NULL, 0);
  s3_pid = 0;
  int64_t down_at = wall_ms();
  /* Wait until a checkpoint upload has failed at least twice, then bring the server back. */
  for (int64_t t0 = wall_ms(); wall_ms() - t0 < 100000; msleep(200)) {
    char *all = slurp(w1->log, NULL);
    int fails = 0;
    for (char *p = all; p && (p = strstr(p, "checkpoint upload failed")); p++) fails++;
    free(all);
    if (fails >= 2) break;
    check_alive();
  }
  cr_assert(log_has(w1, "checkpoint upload failed"), "no checkpoint upload met the outage");
  /* An upload that finished before the kill may still be reported; once uploads fail, no
   * commit may be recorded until the store is back. */
  tail_poll(t, 500);
  json_t *commits = records(t, "CheckpointCommitted", job, 1);
  size_t before = json_array_size(commits);
  json_decref(commits);
  msleep(1500);
  tail_poll(t, 500);
  commits = records(t, "CheckpointCommitted", job, 1);
  cr_assert_eq(json_array_size(commits), before, "a checkpoint was committed while the store was down");
  json_decref(commits);
  s3_pid = start_s3proxy(port, dir);
  cr_log_info("object server down for %lld ms", (long long)(wall_ms() - down_at));
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  wait_for(t, "JobCompleted", job, 1, 30000);
  commits = records(t, "CheckpointCommitted", job, 0);
  json_int_t want = 3;
  size_t i;
  json_t *r;
  json_array_foreach(commits, i, r) {
    cr_assert_eq(ri(r, "step"), want, "commits at 3, 6, 9, ..., 60 in order");
    want += 3;
  }
  cr_assert_eq(want, 63);
  json_decref(commits);
  size_t len;
  char sha[65];
  char *a = published_adapter(t, job, &len, sha);
  free(a);
  tail_close(t);
}

/* ================================================================ 6. a partitioned worker */

/* The worker's network: its own namespace whose 127.0.0.1:9092 and :9000 are this proxy's
 * listeners, relayed to the real broker and object server. SIGUSR1 cuts every connection's
 * traffic (nothing is read or written, nothing new is accepted: packets go nowhere, like a
 * partition), SIGUSR2 heals. */
static volatile sig_atomic_t proxy_cut;
static void proxy_on_cut(int s) { (void)s; proxy_cut = 1; }
static void proxy_on_heal(int s) { (void)s; proxy_cut = 0; }

static void write_all(int fd, const char *p, ssize_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, (size_t)n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= w;
  }
}

static void proxy_main(const char *netns, const int *ports, int nports) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  struct sigaction sa = {.sa_handler = proxy_on_cut};
  sigaction(SIGUSR1, &sa, NULL);
  sa.sa_handler = proxy_on_heal;
  sigaction(SIGUSR2, &sa, NULL);
  char path[256];
  snprintf(path, sizeof path, "/var/run/netns/%s", netns);
  int self = open("/proc/self/ns/net", O_RDONLY), there = open(path, O_RDONLY);
  if (self < 0 || there < 0 || setns(there, CLONE_NEWNET)) _exit(3);
  int lfd[4];
  for (int i = 0; i < nports; i++) {
    lfd[i] = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(lfd[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i]),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(lfd[i], (struct sockaddr *)&a, sizeof a) || listen(lfd[i], 64)) _exit(4);
  }
  if (setns(self, CLONE_NEWNET)) _exit(5); /* upstream connections from the real namespace */
  int pa[512], pb[512], np = 0;
  static char buf[1 << 16];
  for (;;) {
    struct pollfd pf[4 + 1024];
    int n = 0;
    if (!proxy_cut) {
      for (int i = 0; i < nports; i++) pf[n++] = (struct pollfd){.fd = lfd[i], .events = POLLIN};
      for (int i = 0; i < np; i++) {
        pf[n++] = (struct pollfd){.fd = pa[i], .events = POLLIN};
        pf[n++] = (struct pollfd){.fd = pb[i], .events = POLLIN};
      }
    }
    if (poll(pf, (nfds_t)n, 100) <= 0 || proxy_cut) continue;
    for (int i = 0; i < nports; i++)
      if (pf[i].revents & POLLIN) {
        int c = accept(lfd[i], NULL, NULL);
        if (c < 0) continue;
        int u = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i]),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(u, (struct sockaddr *)&a, sizeof a) || np == 512) {
          close(c);
          close(u);
          continue;
        }
        pa[np] = c;
        pb[np++] = u;
      }
    for (int i = np - 1, k = nports + 2 * (np - 1); i >= 0; i--, k -= 2) {
      if (k >= n) continue; /* accepted in this round */
      bool drop = false;
      for (int side = 0; side < 2 && !drop; side++) {
        if (!(pf[k + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t got = read(side ? pb[i] : pa[i], buf, sizeof buf);
        if (got <= 0) drop = true;
        else write_all(side ? pa[i] : pb[i], buf, got);
      }
      if (drop) {
        close(pa[i]);
        close(pb[i]);
        pa[i] = pa[np - 1];
        pb[i] = pb[np - 1];
        np--;
      }
    }
  }
}

static char netns_name[32];
static pid_t proxy_pid;

static void netns_fini(void) {
  if (proxy_pid > 0) {
    kill(proxy_pid, SIGKILL);
    waitpid(proxy_pid, NULL, 0);
    proxy_pid = 0;
  }
  teardown(); /* the worker in the namespace dies before the namespace goes */
  if (netns_name[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null", netns_name);
    int rc = system(cmd);
    (void)rc;
    netns_name[0] = '\0';
  }
}

Test(e2e, a_partitioned_worker_kills_its_attempt_before_the_scheduler_starts_another, .fini = netns_fini) {
  if (geteuid() != 0 || access("/usr/sbin/ip", X_OK) != 0) cr_skip_test("needs root and ip(8) for a network namespace");
  snprintf(netns_name, sizeof netns_name, "lte2e%d", (int)getpid());
  char cmd[256];
  snprintf(cmd, sizeof cmd, "ip netns add %s && ip netns exec %s ip link set lo up", netns_name, netns_name);
  int rc = system(cmd);
  if (rc != 0) {
    netns_name[0] = '\0';
    cr_skip_test("cannot create a network namespace here (%s)", cmd);
  }
  /* The proxy forwards the broker's and the object server's ports, as the stack names them. */
  int ports[2];
  const char *kb = getenv("LATHE_KAFKA_BOOTSTRAP"), *se = getenv("LATHE_S3_ENDPOINT");
  cr_assert(strncmp(kb, "127.0.0.1:", 10) == 0 && strncmp(se, "127.0.0.1:", 10) == 0,
            "the proxy handles a local stack only (%s, %s)", kb, se);
  ports[0] = atoi(kb + 10);
  ports[1] = atoi(se + 10);
  proxy_pid = fork();
  cr_assert(proxy_pid >= 0);
  if (proxy_pid == 0) proxy_main(netns_name, ports, 2);

  start_control_plane();
  proc_t *w1 = spawn("w1", "worker", netns_name, NULL);
  tail_t *t = tail_open();
  char ds[64], job[64];
  upload_dataset(ds, sizeof ds);
  submit(ds, 200, 4, 3, job, sizeof job);
  json_t *s1 = wait_for(t, "AttemptStarted", job, 1, 300000);
  cr_assert_str_eq(rs(s1, "worker_id"), "w1");
  /* A second worker joins the dispatch group while w1 can still take part in the rebalance. */
  spawn("w2", "worker", NULL, NULL);
  wait_owns_partitions(t, "w2");
  wait_for(t, "CheckpointCommitted", job, 1, 300000);
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0 && !pid_dead(ex), "w1's executor is not running");
  cr_assert(!first(t, "JobCompleted", job, 0), "the job ended before the partition: make it longer");

  kill(proxy_pid, SIGUSR1);
  int64_t cut_at = wall_ms(), dead_at = 0;
  while (wall_ms() - cut_at < 120000) {
    if (pid_dead(ex)) {
      dead_at = wall_ms();
      break;
    }
    msleep(20);
  }
  cr_assert(dead_at, "the partitioned worker's executor still runs 120 s after the cut");
  /* Two guards see a partition: the lease that cannot be renewed, and a checkpoint commit that
   * cannot be recorded (the executor uploads beside training, so a commit may fall in the cut).
   * Either kills the attempt; what counts is that it happens before the lease could expire. */
  bool by_lease = log_has(w1, "its lease could not be renewed");
  cr_assert(by_lease || log_has(w1, "its checkpoint could not be recorded"),
            "the executor died, but not by one of the worker's guards:\n%s", log_tail(w1->log));
  json_t *lost = wait_for(t, "AttemptStopped", job, 1, 120000);
  json_t *d2 = wait_for(t, "JobDispatched", job, 2, 120000);
  json_t *s2 = wait_for(t, "AttemptStarted", job, 2, 120000);
  cr_assert_str_eq(rs(lost, "reason"), "lost");
  cr_assert_str_eq(rs(s2, "worker_id"), "w2");
  cr_log_info("killed by the %s guard", by_lease ? "lease" : "commit");
  cr_log_info("cut at +0; executor dead at +%lld ms; lost at +%lld; attempt 2 dispatched at +%lld, started at +%lld",
              (long long)(dead_at - cut_at), (long long)(ri(lost, "occurred_at") - cut_at),
              (long long)(ri(d2, "occurred_at") - cut_at), (long long)(ri(s2, "occurred_at") - cut_at));
  /* One live attempt: attempt 1's process was gone before attempt 2 existed. */
  cr_assert_lt(dead_at, ri(lost, "occurred_at"));
  cr_assert_lt(dead_at, ri(d2, "occurred_at"));
  cr_assert_lt(dead_at, ri(s2, "occurred_at"));
  /* And before its lease (the last one renewed before the cut) could expire. */
  json_t *hbs = records(t, "WorkerHeartbeat", NULL, 0);
  int64_t lease_end = 0;
  size_t i;
  json_t *r;
  json_array_foreach(hbs, i, r) {
    if (!rs(r, "worker_id") || strcmp(rs(r, "worker_id"), "w1")) continue;
    size_t k;
    json_t *l;
    json_array_foreach(json_object_get(json_object_get(r, "r"), "leases"), k, l) {
      int64_t dl = json_integer_value(json_object_get(l, "lease_deadline"));
      if (dl > lease_end) lease_end = dl;
    }
  }
  json_decref(hbs);
  cr_assert_gt(lease_end, 0, "w1 renewed no lease before the cut");
  cr_assert_lt(dead_at, lease_end, "the executor died %lld ms after its lease expired", (long long)(dead_at - lease_end));
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 0, 30000);
  cr_assert_eq(ri(done, "attempt"), 2);
  tail_close(t);
}
