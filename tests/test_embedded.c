/* lathed --role all --embedded from the outside: the whole service in one process with no server
 * to start. Each test runs `lathed --role all --embedded --port 0 --data <tmpdir>` as a child
 * with every Kafka and S3 variable removed from its environment (LATHE_KAFKA_BOOTSTRAP unset: the
 * shared stack's broker on 9092 is never needed), reads the exports it prints, and reaches it the
 * way a person would: `lathe` from another process through DIR/env, HTTP through lt_client. The
 * end-to-end test makes a tiny base model (`lathe model make --steps 10`), uploads a dataset,
 * runs a job to a published artifact and downloads it; while the process runs it checks that
 * nothing outside it was started or contacted, and after SIGTERM that nothing is left behind.
 * The mock-cluster hook (lt_bus_mock_*) is tested in-process at the end. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lt_crypto.h"
#include "lt_test.h"

static char err[1024];

typedef struct emb {
  lt_test_proc_t *proc; /* leads its own process group: the daemon and its executors */
  char dir[256];        /* --data */
  char out[300];        /* its stdout */
  char log[300];        /* its stderr */
  char bootstrap[128];  /* printed LATHE_KAFKA_BOOTSTRAP */
  char url[128];        /* printed LATHE_API_URL */
  char prefix[64];
  char key_file[300];
  unsigned api_port;
  unsigned ops_port;    /* the operator port: /healthz, /metrics */
  unsigned role_ops[2]; /* the worker's and the publisher's operator ports */
} emb_t;

/* The value of `export NAME='VALUE'` in text, into out; false when absent. */
static bool export_value(const char *text, const char *name, char *out, size_t n) {
  char pat[96];
  snprintf(pat, sizeof pat, "export %s='", name);
  const char *p = text ? strstr(text, pat) : NULL;
  if (!p) return false;
  p += strlen(pat);
  const char *q = strchr(p, '\'');
  if (!q) return false;
  snprintf(out, n, "%.*s", (int)(q - p), p);
  return true;
}

static void make_tmpdir(char *out, size_t n, const char *tag) {
  snprintf(out, n, "/tmp/test_embedded.%s.XXXXXX", tag);
  cr_assert(mkdtemp(out), "mkdtemp: %s", strerror(errno));
}

/* Has the daemon printed its API's URL (the last of its exports)? */
static bool printed_url(emb_t *e) {
  char *text = lt_test_slurp(e->out, NULL);
  bool yes = export_value(text, "LATHE_API_URL", e->url, sizeof e->url);
  free(text);
  return yes;
}

/* Starts the embedded daemon on data_dir (models_dir may be NULL) and waits for its exports.
 * The child leads a new process group, so its executors can be found and counted. */
static emb_t start_embedded(const char *data_dir, const char *models_dir) {
  static int starts;
  emb_t e = {0};
  snprintf(e.dir, sizeof e.dir, "%s", data_dir);
  snprintf(e.out, sizeof e.out, "%s.%d.out", data_dir, starts);
  snprintf(e.log, sizeof e.log, "%s.%d.log", data_dir, starts++);
  /* No server of any kind: nothing that could point at the shared stack. */
  static const char *const drop[] = {"LATHE_KAFKA_BOOTSTRAP", "LATHE_TOPIC_PREFIX", "LATHE_S3_ENDPOINT",
                                     "LATHE_S3_BUCKET", "LATHE_S3_ACCESS_KEY", "LATHE_S3_SECRET_KEY",
                                     "LATHE_STORE_DIR", "LATHE_MASTER_KEY", "LATHE_MASTER_KEY_FILE",
                                     "LATHE_API_URL", "LATHE_API_KEY", NULL};
  char models_env[400];
  snprintf(models_env, sizeof models_env, "LATHE_MODELS_DIR=%s", models_dir ? models_dir : "");
  const char *env[] = {"LATHE_INSTANCE=embedded-test", "LATHE_WORKER_THREADS=1", models_dir ? models_env : NULL, NULL};
  const char *argv[] = {lt_test_lathed_bin(), "--role", "all", "--embedded", "--port", "0", "--operator-port", "0",
                        "--data", data_dir, NULL};
  e.proc = lt_test_spawn(&(lt_test_spawn_t){.name = "lathed --embedded", .log = e.log, .out = e.out, .argv = argv,
                                            .env = env, .unset = drop, .own_group = true});
  lt_test_wait_until(printed_url(&e), 60000, 100, "lathed --embedded printed no LATHE_API_URL within 60 s; see %s",
                     e.log);
  char *text = lt_test_slurp(e.out, NULL);
  cr_assert(export_value(text, "LATHE_KAFKA_BOOTSTRAP", e.bootstrap, sizeof e.bootstrap), "%s", text);
  cr_assert(export_value(text, "LATHE_TOPIC_PREFIX", e.prefix, sizeof e.prefix), "%s", text);
  cr_assert(export_value(text, "LATHE_MASTER_KEY_FILE", e.key_file, sizeof e.key_file), "%s", text);
  cr_assert_eq(sscanf(strrchr(e.url, ':') + 1, "%u", &e.api_port), 1, "%s", e.url);
  free(text);
  /* Ready when the projection has caught up. */
  e.ops_port = lt_test_proc_operator_port(e.proc, 30000);
  e.role_ops[0] = lt_test_proc_port_of(e.proc, "worker operator endpoints", 30000);
  e.role_ops[1] = lt_test_proc_port_of(e.proc, "publisher operator endpoints", 30000);
  char ops_url[64];
  snprintf(ops_url, sizeof ops_url, "http://127.0.0.1:%u", e.ops_port);
  lt_test_wait_healthy(ops_url, e.log, 30000);
  return e;
}

/* SIGTERM, then waits for a clean exit (status 0) within 30 s. Returns the exit status. */
static int stop_embedded(emb_t *e) {
  if (!e->proc || e->proc->pid <= 0) return -1;
  pid_t pid = e->proc->pid;
  int st = lt_test_proc_stop(e->proc, 30000); /* kills the group when it has to */
  if (st == -1) {
    cr_expect_fail("lathed --embedded did not stop within 30 s of SIGTERM; see %s", e->log);
    return -1;
  }
  cr_expect(WIFEXITED(st), "lathed --embedded died of signal %d (pid %d); see %s", WTERMSIG(st), (int)pid, e->log);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void cleanup(emb_t *e) {
  if (e->proc) lt_test_proc_kill(e->proc, SIGKILL);
}

static bool port_accepts(unsigned port) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "exec 3<>/dev/tcp/127.0.0.1/%u", port);
  pid_t p = fork();
  if (p == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execl("/bin/bash", "bash", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  int st;
  waitpid(p, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* `lathe ARGS` with DIR/env sourced, as another shell would run it. Returns stdout. */
static char *lathe_with_env(const emb_t *e, const char *api_key, const char *args, int *rc) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "env -u LATHE_KAFKA_BOOTSTRAP -u LATHE_TOPIC_PREFIX -u LATHE_MASTER_KEY -u LATHE_MASTER_KEY_FILE "
           "sh -c '. \"%s/env\" && LATHE_API_KEY=%s exec \"%s\" %s'",
           e->dir, api_key ? api_key : "", lt_test_lathe_bin(), args);
  return lt_test_run(cmd, rc);
}

static void create_tenant(const emb_t *e, const char *id, char *key, size_t keyn) {
  char args[256];
  snprintf(args, sizeof args, "admin tenant create %s --json", id);
  int rc;
  char *out = lathe_with_env(e, NULL, args, &rc);
  cr_assert_eq(rc, 0, "lathe admin tenant create through %s/env failed: %s", e->dir, out);
  json_t *j = json_loads(out, 0, NULL);
  cr_assert(j && json_string_value(json_object_get(j, "api_key")), "no api_key in %s", out);
  snprintf(key, keyn, "%s", json_string_value(json_object_get(j, "api_key")));
  json_decref(j);
  free(out);
}

static lt_client_t *client_for(const emb_t *e, const char *key) { return lt_test_client(e->url, key, 60); }

/* Waits until the API has folded the tenant (its key answers 200). */
static void wait_key(lt_client_t *c) {
  lt_test_wait_until(lt_test_get_status(c, "/v1/jobs", NULL, 0) == 200, 20000, 100,
                     "the API never accepted the new tenant's key");
}

/* ---------------------------------------------------------------- what is running, what is open */

/* Ports this process listens on (TCP, v4 and v6), from its socket inodes and /proc/net/tcp*. */
typedef struct sockscan {
  unsigned listen[32];
  int nlisten;
  int to_9092; /* connections of this process whose remote port is 9092 */
} sockscan_t;

static bool pid_has_inode(pid_t pid, unsigned long inode) {
  char path[64], link[128], want[64];
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  snprintf(want, sizeof want, "socket:[%lu]", inode);
  DIR *d = opendir(path);
  if (!d) return false;
  bool found = false;
  for (struct dirent *de; !found && (de = readdir(d));) {
    char fd[64 + sizeof de->d_name];
    snprintf(fd, sizeof fd, "%s/%s", path, de->d_name);
    ssize_t n = readlink(fd, link, sizeof link - 1);
    if (n > 0) {
      link[n] = '\0';
      found = strcmp(link, want) == 0;
    }
  }
  closedir(d);
  return found;
}

static sockscan_t scan_sockets(pid_t pid) {
  sockscan_t s = {0};
  const char *files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int f = 0; f < 2; f++) {
    FILE *fp = fopen(files[f], "r");
    if (!fp) continue;
    char line[512];
    fgets(line, sizeof line, fp); /* header */
    while (fgets(line, sizeof line, fp)) {
      char local[64], remote[64];
      unsigned st;
      unsigned long inode;
      if (sscanf(line, "%*d: %63s %63s %x %*s %*s %*s %*s %*s %lu", local, remote, &st, &inode) != 4) continue;
      if (!inode || !pid_has_inode(pid, inode)) continue;
      unsigned lport = (unsigned)strtoul(strrchr(local, ':') + 1, NULL, 16);
      unsigned rport = (unsigned)strtoul(strrchr(remote, ':') + 1, NULL, 16);
      if (st == 0x0A && s.nlisten < 32) s.listen[s.nlisten++] = lport;
      if (st != 0x0A && rport == 9092) s.to_9092++;
    }
    fclose(fp);
  }
  return s;
}

/* Processes of the group pgid (the daemon and its executors): how many, and how many of them
 * are not the lathed binary. */
static void scan_group(pid_t pgid, int *n, int *foreign, char *what, size_t what_n) {
  *n = *foreign = 0;
  what[0] = '\0';
  char real_lathed[1024];
  const char *lathed = lt_test_lathed_bin();
  if (!realpath(lathed, real_lathed)) snprintf(real_lathed, sizeof real_lathed, "%s", lathed);
  DIR *d = opendir("/proc");
  for (struct dirent *de; d && (de = readdir(d));) {
    pid_t p = (pid_t)atoi(de->d_name);
    if (p <= 0 || getpgid(p) != pgid) continue;
    char exe[64], target[1024];
    snprintf(exe, sizeof exe, "/proc/%d/exe", (int)p);
    ssize_t k = readlink(exe, target, sizeof target - 1);
    if (k < 0) continue; /* exiting */
    target[k] = '\0';
    (*n)++;
    if (strcmp(target, real_lathed) != 0) {
      (*foreign)++;
      size_t used = strlen(what);
      snprintf(what + used, what_n - used, "%s ", target);
    }
  }
  if (d) closedir(d);
}

/* One look at the running daemon: only lathed in its group, no connection to port 9092, and it
 * listens on its API (customer and operator), the worker's and publisher's operator ports and
 * the mock broker's, and nothing else. Returns how many processes the
 * group holds (the daemon and its executors). */
static int look_at_group(const emb_t *e) {
  int n, foreign;
  char what[1024];
  scan_group(e->proc->pid, &n, &foreign, what, sizeof what);
  cr_expect_eq(foreign, 0, "processes other than lathed in its group: %s", what);
  cr_expect_geq(n, 1);
  sockscan_t sk = scan_sockets(e->proc->pid);
  unsigned mock_port = (unsigned)atoi(strrchr(e->bootstrap, ':') + 1);
  cr_expect_eq(sk.to_9092, 0, "lathed --embedded has %d connection(s) to port 9092", sk.to_9092);
  for (int i = 0; i < sk.nlisten; i++)
    cr_expect(sk.listen[i] == e->api_port || sk.listen[i] == e->ops_port || sk.listen[i] == e->role_ops[0] ||
                  sk.listen[i] == e->role_ops[1] || sk.listen[i] == mock_port,
              "lathed --embedded listens on %u (API %u, mock broker %u)", sk.listen[i], e->api_port, mock_port);
  bool api = false, mock = false;
  for (int i = 0; i < sk.nlisten; i++) api |= sk.listen[i] == e->api_port, mock |= sk.listen[i] == mock_port;
  cr_expect(api && mock, "the API (%u) and the mock broker (%u) listen in the lathed process", e->api_port,
            mock_port);
  return n;
}

/* Looks at the daemon (look_at_group) every 50 ms until the API says job ended (within 300 s);
 * its last state into state. Returns the most processes the group held at once. */
static int watch_until_done(const emb_t *e, lt_client_t *c, const char *job, char *state, size_t n) {
  char path[300];
  snprintf(path, sizeof path, "/v1/jobs/%s", job);
  int most = 0;
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < 300000; lt_test_msleep(50)) {
    int procs = look_at_group(e);
    if (procs > most) most = procs;
    lt_client_resp_t r = lt_test_req(c, "GET", path, NULL, 0);
    const char *s = json_string_value(json_object_get(r.json, "state"));
    snprintf(state, n, "%s", s ? s : "?");
    lt_client_resp_free(&r);
    if (!strcmp(state, "completed") || !strcmp(state, "failed") || !strcmp(state, "cancelled") ||
        !strcmp(state, "rejected"))
      break;
  }
  return most;
}

/* The published adapter and its config, downloaded: the listed size and SHA-256, LoRA tensors,
 * a PEFT config of rank 4. */
static void check_downloads(const emb_t *e, lt_client_t *c, const char *job) {
  char path[300];
  lt_client_resp_t r;
  snprintf(path, sizeof path, "/v1/jobs/%s/artifacts", job);
  json_t *list = NULL;
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < 60000 && !list; lt_test_msleep(200)) {
    cr_assert_eq(lt_client_request(c, "GET", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err), LT_OK, "%s", err);
    json_t *a = json_object_get(r.json, "artifacts");
    if (r.status == 200 && json_array_size(a) > 0) list = json_incref(a);
    lt_client_resp_free(&r);
  }
  cr_assert(list, "no artifact of %s was published within 60 s; see %s", job, e->log);
  bool got_adapter = false, got_config = false;
  size_t i;
  json_t *a;
  json_array_foreach(list, i, a) {
    const char *name = json_string_value(json_object_get(a, "name"));
    if (strcmp(name, "adapter_model.safetensors") != 0 && strcmp(name, "adapter_config.json") != 0) continue;
    snprintf(path, sizeof path, "/v1/jobs/%s/artifacts/%s", job, name);
    cr_assert_eq(lt_client_request(c, "GET", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err), LT_OK, "%s", err);
    cr_assert_eq(r.status, 200, "GET %s: %d", path, r.status);
    cr_expect_eq((json_int_t)r.len, json_integer_value(json_object_get(a, "bytes")), "%s: size", name);
    uint8_t sha[LT_CRYPTO_SHA256_BYTES];
    char hex[2 * LT_CRYPTO_SHA256_BYTES + 1];
    lt_crypto_sha256(r.body, r.len, sha);
    cr_expect_str_eq(lt_crypto_hex(sha, sizeof sha, hex), json_string_value(json_object_get(a, "sha256")),
                     "%s: the downloaded bytes do not have the listed SHA-256", name);
    if (!strcmp(name, "adapter_model.safetensors")) {
      /* safetensors: 8-byte little-endian header length, then a JSON header naming LoRA tensors. */
      cr_assert_gt(r.len, 8);
      uint64_t hl = 0;
      for (int b = 7; b >= 0; b--) hl = hl << 8 | (uint8_t)r.body[b];
      cr_assert_lt(hl, r.len - 8);
      json_t *h = json_loadb(r.body + 8, hl, 0, NULL);
      cr_assert(h, "the safetensors header is not JSON");
      bool lora_a = false;
      const char *k;
      json_t *v;
      json_object_foreach(h, k, v) lora_a |= strstr(k, ".lora_A.weight") != NULL;
      cr_expect(lora_a, "no lora_A tensor in the adapter");
      json_decref(h);
      got_adapter = true;
    } else {
      json_t *cfg = json_loadb(r.body, r.len, 0, NULL);
      cr_assert(cfg, "adapter_config.json is not JSON");
      cr_expect_str_eq(json_string_value(json_object_get(cfg, "peft_type")), "LORA");
      cr_expect_eq(json_integer_value(json_object_get(cfg, "r")), 4);
      json_decref(cfg);
      got_config = true;
    }
    lt_client_resp_free(&r);
  }
  json_decref(list);
  cr_expect(got_adapter && got_config, "the artifact list lacks the adapter or its config");
}

/* ---------------------------------------------------------------- tests */

TestSuite(embedded, .fini = lt_test_procs_stop_all, .timeout = 900);

/* lathed refuses --embedded with a single role: the log of the mock cluster lives in its
 * process, so a role that ran alone on it would have nobody to talk to. */
Test(embedded, embedded_needs_role_all) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "'%s' --role api --embedded --port 0 2>&1", lt_test_lathed_bin());
  int rc;
  char *out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
  cr_expect(strstr(out, "--role all"), "%s", out);
  free(out);
  snprintf(cmd, sizeof cmd, "'%s' --help", lt_test_lathed_bin());
  out = lt_test_run(cmd, &rc);
  cr_expect_eq(rc, 0);
  cr_expect(strstr(out, "--embedded") && strstr(out, "IN MEMORY"), "usage does not document --embedded: %s", out);
  free(out);
}

/* The exports lathed prints are the ones in DIR/env (mode 0600), they point at a mock cluster
 * on loopback (not the shared broker) and at a generated 0600 master key; the mock's topics have
 * the partition counts of ops/topics.tsv; `lathe admin tenant create` works from another process
 * through DIR/env. A restart forgets every tenant (the log was in memory) but keeps the master
 * key; DIR/env disappears when the process stops. */
Test(embedded, env_file_reaches_the_in_memory_cluster_and_a_restart_forgets_the_log) {
  char tmp[256], data[300];
  make_tmpdir(tmp, sizeof tmp, "env");
  snprintf(data, sizeof data, "%s/data", tmp);
  emb_t e = start_embedded(data, NULL);

  char env_path[400];
  snprintf(env_path, sizeof env_path, "%s/env", data);
  struct stat st;
  cr_assert_eq(stat(env_path, &st), 0, "%s: %s", env_path, strerror(errno));
  cr_expect_eq(st.st_mode & 0777, 0600, "DIR/env has mode %o", st.st_mode & 0777);
  char *file = lt_test_slurp(env_path, NULL), v[300];
  cr_assert(export_value(file, "LATHE_KAFKA_BOOTSTRAP", v, sizeof v));
  cr_expect_str_eq(v, e.bootstrap);
  cr_assert(export_value(file, "LATHE_API_URL", v, sizeof v));
  cr_expect_str_eq(v, e.url);
  free(file);
  cr_expect(strncmp(e.bootstrap, "127.0.0.1:", 10) == 0, "bootstrap %s is not loopback", e.bootstrap);
  cr_expect_neq(atoi(strrchr(e.bootstrap, ':') + 1), 9092, "embedded mode must not use the broker on 9092");
  cr_expect_str_eq(e.prefix, "lathe.");

  char key_path[400];
  snprintf(key_path, sizeof key_path, "%s/master.key", data);
  cr_expect_str_eq(e.key_file, key_path);
  cr_assert_eq(stat(key_path, &st), 0);
  cr_expect_eq(st.st_mode & 0777, 0600, "master.key has mode %o", st.st_mode & 0777);
  char *key1 = lt_test_slurp(key_path, NULL);
  cr_expect_eq(strspn(key1, "0123456789abcdef"), 64, "master.key is not 64 hex characters: %s", key1);

  /* The topics, as another Kafka client sees them. */
  lt_bus_conf_t *bus = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_set(bus, "bootstrap.servers", e.bootstrap, err, sizeof err), LT_OK, "%s", err);
  lt_bus_admin_t *admin;
  cr_assert_eq(lt_bus_admin_new(bus, &admin, err, sizeof err), LT_OK, "%s", err);
  const struct { const char *topic; int parts; } want[] = {
      {"lathe.jobs", 6}, {"lathe.control", 6}, {"lathe.dispatch.production", 4}, {"lathe.tenants", 1},
      {"lathe.workers", 3}, {"lathe.deadletter", 1}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    int parts = 0;
    cr_expect_eq(lt_bus_admin_describe_topic(admin, want[i].topic, 10000, &parts, err, sizeof err), LT_OK, "%s: %s",
                 want[i].topic, err);
    cr_expect_eq(parts, want[i].parts, "%s has %d partitions, ops/topics.tsv says %d", want[i].topic, parts,
                 want[i].parts);
  }
  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(bus);

  char key[160];
  create_tenant(&e, "emb-restart", key, sizeof key);
  lt_client_t *c = client_for(&e, key);
  wait_key(c);
  lt_client_destroy(c);
  unsigned mock_port = (unsigned)atoi(strrchr(e.bootstrap, ':') + 1);
  cr_expect_eq(stop_embedded(&e), 0, "lathed --embedded exited non-zero on SIGTERM; see %s", e.log);
  cr_expect_neq(access(env_path, F_OK), 0, "DIR/env outlived the process");
  cr_expect(!port_accepts(mock_port), "the mock broker on %u still listens after exit", mock_port);

  emb_t again = start_embedded(data, NULL);
  c = client_for(&again, key);
  cr_expect_eq(lt_test_get_status(c, "/v1/jobs", NULL, 0), 401, "a tenant of the previous run is still known after a restart");
  lt_client_destroy(c);
  char *key2 = lt_test_slurp(key_path, NULL);
  cr_expect_str_eq(key2, key1, "the master key changed across a restart");
  free(key1);
  free(key2);
  cr_expect_eq(stop_embedded(&again), 0);
  cleanup(&again);
  lt_test_rm_rf(tmp);
  unlink(e.out), unlink(e.log), unlink(again.out), unlink(again.log);
}

/* The main job in one process: tenant, dataset, job, published artifact, download, with
 * LATHE_KAFKA_BOOTSTRAP unset. While it runs, the process group holds only lathed (the daemon
 * and its executors: no broker, no object server), its listening sockets are the API and the
 * mock broker, and no socket of it goes to port 9092. After SIGTERM nothing of it is left. */
Test(embedded, a_job_runs_from_upload_to_downloaded_artifact_with_no_server) {
  char tmp[256], data[300], models[300], train[300];
  make_tmpdir(tmp, sizeof tmp, "job");
  snprintf(data, sizeof data, "%s/data", tmp);
  snprintf(models, sizeof models, "%s/models", tmp);
  snprintf(train, sizeof train, "%s/train.jsonl", tmp);

  /* A tiny base model (lathe-tiny, 10 pretraining steps), and a dataset of its task. */
  char cmd[4096];
  int rc;
  snprintf(cmd, sizeof cmd,
           "LATHE_MODELS_DIR='%s' '%s' model make --steps 10 --threads 2 --out '%s/lathe-tiny' 2>/dev/null && "
           "head -n 64 '%s/lathe-tiny/task_train.jsonl' > '%s'",
           models, lt_test_lathe_bin(), models, models, train);
  char *out = lt_test_run(cmd, &rc);
  cr_assert_eq(rc, 0, "lathe model make failed: %s", out);
  free(out);

  emb_t e = start_embedded(data, models);
  char key[160];
  create_tenant(&e, "emb-e2e", key, sizeof key);
  lt_client_t *c = client_for(&e, key);
  wait_key(c);

  /* Upload with the CLI through DIR/env, as a customer's shell would. */
  char args[600];
  snprintf(args, sizeof args, "datasets upload '%s' --name emb-train --json 2>/dev/null", train);
  out = lathe_with_env(&e, key, args, &rc);
  cr_assert_eq(rc, 0, "lathe datasets upload failed: %s", out);
  json_t *ds = json_loads(out, 0, NULL);
  cr_assert(ds && json_string_value(json_object_get(ds, "id")), "no dataset id in %s", out);
  char ds_id[128];
  snprintf(ds_id, sizeof ds_id, "%s", json_string_value(json_object_get(ds, "id")));
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(ds, "report"), "examples")), 64, "%s", out);
  json_decref(ds);
  free(out);

  json_t *body = json_pack("{s:s, s:s, s:{s:i, s:i, s:i, s:i, s:f, s:i}}", "base_model", "lathe-tiny", "dataset_id",
                           ds_id, "hyperparameters", "max_steps", 6, "batch_size", 4, "lora_rank", 4,
                           "checkpoint_interval", 3, "validation_fraction", 0.25, "seed", 7);
  lt_client_resp_t r;
  cr_assert_eq(lt_client_json(c, "POST", "/v1/jobs", body, NULL, &r, err, sizeof err), LT_OK, "%s", err);
  json_decref(body);
  cr_assert_eq(r.status, 201, "POST /v1/jobs: %d %s", r.status, r.body);
  char job[128];
  snprintf(job, sizeof job, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);

  /* Until it ends: what the process group is and what its sockets are, every 50 ms from the
   * submission on. An executor is in the group only while it trains, and the API's state may
   * say running before or after that (its view follows the log), so every look counts and one
   * of them must have seen the executor. */
  char state[32] = "";
  int most = watch_until_done(&e, c, job, state, sizeof state);
  cr_assert_str_eq(state, "completed", "job %s ended %s; see %s", job, state, e.log);
  cr_expect_geq(most, 2, "no executor process was seen in lathed's group while the job ran");

  /* The published artifact, downloaded and checked against its listing. */
  check_downloads(&e, c, job);
  lt_client_destroy(c);

  /* Stop: a clean exit, nothing of it left running or listening. */
  pid_t pgid = e.proc->pid;
  unsigned mock_port = (unsigned)atoi(strrchr(e.bootstrap, ':') + 1);
  cr_expect_eq(stop_embedded(&e), 0, "lathed --embedded exited non-zero on SIGTERM; see %s", e.log);
  lt_test_msleep(200);
  int n, foreign;
  char what[1024];
  scan_group(pgid, &n, &foreign, what, sizeof what);
  cr_expect_eq(n, 0, "%d process(es) of lathed --embedded outlived it: %s", n, what);
  cr_expect(!port_accepts(mock_port), "the mock broker on %u still listens after exit", mock_port);
  cr_expect(!port_accepts(e.api_port), "the API on %u still listens after exit", e.api_port);
  cleanup(&e);
  lt_test_rm_rf(tmp);
  unlink(e.out), unlink(e.log);
}

/* The hook lathed --embedded uses: one mock cluster, the topics of ops/topics.tsv with their
 * partition counts and the configured prefix, created once (a second call creates nothing). */
Test(embedded, mock_cluster_gets_every_topic_of_the_topics_file) {
  char topics_file[1100];
  lt_test_source_path("ops/topics.tsv", topics_file, sizeof topics_file);
  lt_bus_mock_t *m;
  cr_assert_eq(lt_bus_mock_new(1, &m, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_t *bus = lt_bus_conf_new();
  cr_assert_eq(lt_bus_conf_set(bus, "lathe.topic.prefix", "emb.", err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_bus_conf_set(bus, "bootstrap.servers", lt_bus_mock_bootstraps(m), err, sizeof err), LT_OK, "%s",
               err);
  int created = -1;
  cr_assert_eq(lt_bus_mock_create_from_file(m, bus, topics_file, &created, err, sizeof err), LT_OK, "%s", err);

  /* Expected: every non-comment line of the file. */
  FILE *f = fopen(topics_file, "r");
  cr_assert(f, "%s", topics_file);
  char line[1024];
  int lines = 0;
  lt_bus_admin_t *admin;
  cr_assert_eq(lt_bus_admin_new(bus, &admin, err, sizeof err), LT_OK, "%s", err);
  while (fgets(line, sizeof line, f)) {
    char name[128];
    int parts;
    if (line[0] == '#' || sscanf(line, "%127s %d", name, &parts) != 2) continue;
    lines++;
    char full[160];
    snprintf(full, sizeof full, "emb.%s", name);
    int got = 0;
    cr_expect_eq(lt_bus_admin_describe_topic(admin, full, 10000, &got, err, sizeof err), LT_OK, "%s: %s", full, err);
    cr_expect_eq(got, parts, "%s: %d partitions, the file says %d", full, got, parts);
  }
  fclose(f);
  cr_expect_geq(lines, 10);
  cr_expect_eq(created, lines, "created %d of %d topics", created, lines);
  cr_expect_eq(lt_bus_mock_create_from_file(m, bus, topics_file, &created, err, sizeof err), LT_OK, "%s", err);
  cr_expect_eq(created, 0, "a second call created %d topics", created);

  /* A malformed file names its line. */
  char bad[] = "/tmp/test_embedded.topics.XXXXXX";
  int fd = mkstemp(bad);
  cr_assert(fd >= 0);
  dprintf(fd, "# comment\njobs\tsix\t-\n");
  close(fd);
  cr_expect_eq(lt_bus_mock_create_from_file(m, bus, bad, NULL, err, sizeof err), LT_ERR_INVALID);
  cr_expect(strstr(err, ":2:"), "the error does not name line 2: %s", err);
  unlink(bad);

  lt_bus_admin_destroy(admin);
  lt_bus_conf_destroy(bus);
  lt_bus_mock_destroy(m);
}
