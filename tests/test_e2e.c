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
 *   - the object server away when an attempt starts: its inputs' fetch waits it out and the job
 *     completes on attempt 1; cancelled while it waits, the attempt stops as cancelled (5, 6);
 *   - a partitioned worker (in its own network namespace behind a proxy the test cuts) kills its
 *     executor before the scheduler declares the attempt lost and dispatches a new one (2).
 *
 * Environment (tests/meson.build sets them): LATHE_TEST_LATHE, LATHE_TEST_LATHED (the binaries),
 * LATHE_E2E_CACHE (where the base model is cached), LATHE_SOURCE_ROOT; the stack's LATHE_KAFKA_*
 * and LATHE_S3_* from `eval "$(ops/stack env)"`. Tests run one at a time (CRITERION_JOBS=1): they
 * share two cores. The scheduler runs with a 10 s lease (LATHE_LEASE_MS) so lease expiry is quick. */

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
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
#include <unistd.h>

#include "lt_access.h"
#include "lt_backend_cuda.h"
#include "lt_crypto.h"
#include "lt_job_record.h"
#include "lt_jobspec.h"
#include "lt_store.h"
#include "lt_test.h"

#define MASTER_KEY "5b1f0c2d3e4f5061728394a5b6c7d8e9f0112233445566778899aabbccddeeff"
#define MODEL "lathe-tiny"
#define LEASE_MS 10000
#define LEASE_MARGIN_MS 3000
#define KILL_DEADLINE_MS 30000 /* lt_worker_conf_t's default; lathed does not change it */

static char err[1024];
static char models_dir[1024], tmp_dir[512], prefix[64], tenant[64], api_key[128];

static void sha256_hex(const void *p, size_t n, char out[65]) {
  uint8_t d[32];
  lt_crypto_sha256(p, n, d);
  lt_crypto_hex(d, 32, out);
}

/* ---------------------------------------------------------------- daemons */

/* Starts `lathed --role ROLE` as NAME (inside network namespace NETNS when not NULL); its output
 * goes to <tmp>/<name>.log. */
static lt_test_proc_t *spawn(const char *name, const char *role, const char *netns) {
  char log[600];
  snprintf(log, sizeof log, "%s/%s.log", tmp_dir, name);
  return lt_test_lathed(name, log, role, netns, NULL);
}

/* The pid of the executor a worker started for job/attempt, from its log line
 * "started <job> attempt <n> (pid <pid>)"; 0 if not (yet) there. */
static pid_t executor_pid(const lt_test_proc_t *w, const char *job, int attempt) {
  char *all = lt_test_slurp(w->log, NULL);
  if (!all) return 0;
  char pat[160];
  snprintf(pat, sizeof pat, "started %s attempt %d (pid ", job, attempt);
  char *p = strstr(all, pat);
  pid_t pid = p ? (pid_t)atoi(p + strlen(pat)) : 0;
  free(all);
  return pid;
}

/* ---------------------------------------------------------------- the log, read back */

static const char *const log_topics[] = {"control", "progress", "artifacts", "workers", NULL};

/* The records of a job in log order (its control partition's offsets; the other topics' records
 * in the order they were read). type NULL: any; attempt 0: any. New reference. */
static json_t *records(lt_test_tail_t *t, const char *type, const char *job, int attempt) {
  return lt_test_tail_select(t, NULL, type, job, attempt);
}

static json_t *first(lt_test_tail_t *t, const char *type, const char *job, int attempt) {
  json_t *all = records(t, type, job, attempt);
  json_t *r = json_array_size(all) ? json_array_get(all, 0) : NULL;
  json_decref(all); /* still referenced by the tail */
  return r;
}

/* Waits (polling the log, checking the daemons) until a record matches; fails after timeout. */
static json_t *wait_for(lt_test_tail_t *t, const char *type, const char *job, int attempt, int timeout_ms) {
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < timeout_ms;) {
    json_t *r = first(t, type, job, attempt);
    if (r) return r;
    lt_test_procs_check();
    lt_test_tail_poll(t, 200);
  }
  /* What the log did hold for the job, to tell a slow fleet from another outcome. */
  char seen[2048] = "";
  size_t used = 0, i;
  json_t *all = records(t, NULL, job, 0), *r;
  json_array_foreach(all, i, r) if (used < sizeof seen - 64) used += (size_t)snprintf(
      seen + used, sizeof seen - used, " %s(%lld)", json_string_value(json_object_get(r, "type")),
      (long long)lt_test_ri(r, "attempt"));
  json_decref(all);
  cr_assert_fail("no %s for job %s (attempt %d) within %d s; its records:%s", type, job ? job : "*", attempt,
                 timeout_ms / 1000, seen);
  return NULL;
}

/* Does a heartbeat of worker say it owns dispatch partitions (it joined the group)? */
static bool owns_partitions(lt_test_tail_t *t, const char *worker) {
  lt_test_tail_poll(t, 300);
  json_t *hbs = records(t, "WorkerHeartbeat", NULL, 0), *r;
  bool owns = false;
  size_t i;
  json_array_foreach(hbs, i, r) if (lt_test_rs(r, "worker_id") && !strcmp(lt_test_rs(r, "worker_id"), worker) &&
                                    json_array_size(json_object_get(json_object_get(r, "r"), "owned_partitions")) > 0)
      owns = true;
  json_decref(hbs);
  return owns;
}

static void wait_owns_partitions(lt_test_tail_t *t, const char *worker) {
  lt_test_wait_until(owns_partitions(t, worker), 120000, 0, "%s never reported owning dispatch partitions", worker);
}

/* ---------------------------------------------------------------- the API */

static lt_client_t *client;
static char api_url[64];

static void start_api(void) {
  lt_test_proc_t *api = spawn("api", "api", NULL);
  char *url = api_url;
  snprintf(url, sizeof api_url, "http://127.0.0.1:%u", lt_test_proc_port(api, 30000));
  client = lt_test_client(url, api_key, 120);
  /* Ready when it knows the tenant's key. */
  lt_test_wait_until(lt_test_get_status(client, "/v1/jobs", NULL, 0) == 200, 60000, 200,
                     "the api never accepted the tenant's key; log:\n%s", lt_test_log_tail(api->log));
}

static lt_client_resp_t req(const char *method, const char *path, const char *body, size_t len) {
  return lt_test_req(client, method, path, body, len);
}

static void upload_dataset(char *id, size_t n) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s/task_train.jsonl", models_dir, MODEL);
  size_t len;
  char *data = lt_test_slurp(path, &len);
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

/* Submits a managed job on base model `model`; returns its id. */
static void submit_on(const char *model, const char *dataset, int max_steps, int ckpt_interval, int seed, char *id,
                      size_t n) {
  json_t *body = json_pack("{s:s,s:s,s:{s:i,s:i,s:i,s:f,s:i,s:i,s:i}}", "base_model", model, "dataset_id", dataset,
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

/* Submits a managed job on the bundled model; returns its id. */
static void submit(const char *dataset, int max_steps, int ckpt_interval, int seed, char *id, size_t n) {
  submit_on(MODEL, dataset, max_steps, ckpt_interval, seed, id, n);
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

/* Waits until the API shows the job in a terminal state; returns that state (static). A job
 * produced upstream is 404 until the API has folded its JobSubmitted: that is waited out too. */
static const char *wait_terminal(const char *job, int timeout_ms) {
  static char state[32];
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < timeout_ms; lt_test_msleep(300)) {
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs/%s", job);
    lt_client_resp_t r = req("GET", path, NULL, 0);
    json_t *j = r.status == 200 ? json_incref(r.json) : NULL;
    cr_assert(r.status == 200 || r.status == 404, "%s: %d %s", path, r.status, r.body);
    lt_client_resp_free(&r);
    if (!j) {
      snprintf(state, sizeof state, "not yet folded");
      continue;
    }
    const char *sv = json_string_value(json_object_get(j, "state"));
    snprintf(state, sizeof state, "%s", sv ? sv : "?");
    for (char *p = state; *p; p++) *p = (char)toupper((unsigned char)*p); /* the API says "completed" */
    json_decref(j);
    if (!strcmp(state, "COMPLETED") || !strcmp(state, "FAILED") || !strcmp(state, "CANCELLED") ||
        !strcmp(state, "REJECTED"))
      return state;
    lt_test_procs_check();
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

static lt_err_t count_key(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key;
  (void)info;
  (*(int *)ctx)++;
  return LT_OK;
}

static int count_objects(const char *under) {
  lt_store_t *st = lt_test_store();
  int n = 0;
  char next[LT_STORE_KEY_MAX + 1] = "";
  cr_assert_eq(lt_store_list(st, under, NULL, 1000, count_key, &n, next, sizeof next, err, sizeof err), LT_OK, "%s",
               err);
  lt_store_destroy(st);
  return n;
}

/* The highest checkpoint step s in (from, to], a multiple of every, with any object staged under
 * PREFIX<s>/ (HEADs of the checkpoint's objects: a listing of a prefix where an upload was cut
 * by a kill fails on S3Proxy, whose filesystem backend lists the cut PUT's temporary file); 0 if
 * none. */
static json_int_t max_staged_step(const char *under, json_int_t from, json_int_t to, json_int_t every) {
  static const char *const names[] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                      "metrics.json", "eval.json", "lathe_run.json", "samples.json"};
  lt_store_t *st = lt_test_store();
  json_int_t found = 0;
  for (json_int_t step = from - from % every + every; step <= to; step += every)
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
      char key[512];
      lt_store_info_t info;
      snprintf(key, sizeof key, "%s%lld/%s", under, (long long)step, names[i]);
      if (lt_store_head(st, key, &info, NULL, 0) == LT_OK) found = step;
    }
  lt_store_destroy(st);
  return found;
}

/* No step of an attempt was reported while its newest commit lay more than one interval behind:
 * what a crash at that moment would have lost. Returns the largest lag seen. The worker stamps a
 * commit before it records it and a step when the executor reports it, and the executor reports
 * the step after a checkpoint only once the worker has told it the commit is recorded. */
static json_int_t commits_lag(lt_test_tail_t *t, const char *job, int attempt, json_int_t from, json_int_t interval) {
  json_t *cs = records(t, "CheckpointCommitted", job, attempt), *ps = records(t, "StepCompleted", job, attempt);
  cr_assert_gt(json_array_size(cs), 2, "attempt %d of %s committed too few checkpoints to judge", attempt, job);
  json_int_t worst = 0;
  size_t i, k;
  json_t *p, *c;
  json_array_foreach(ps, i, p) {
    json_int_t newest = from, at = lt_test_ri(p, "occurred_at");
    json_array_foreach(cs, k, c) if (lt_test_ri(c, "occurred_at") <= at && lt_test_ri(c, "step") > newest) newest = lt_test_ri(c, "step");
    json_int_t lag = lt_test_ri(p, "step") - newest;
    cr_assert_leq(lag, interval, "attempt %d reported step %lld while its newest commit was step %lld", attempt,
                  (long long)lt_test_ri(p, "step"), (long long)newest);
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
    snprintf(cmd, sizeof cmd, "'%s' model make --steps 20 --threads 2 --force --out '%s/%s' 2>&1",
             lt_test_lathe_bin(), models_dir, MODEL);
    int rc;
    char *out = lt_test_run(cmd, &rc);
    cr_assert_eq(rc, 0, "lathe model make failed: %s", out);
    free(out);
  }
  flock(fd, LOCK_UN);
  close(fd);
  cr_assert_eq(access(probe, R_OK), 0, "no %s after lathe model make", probe);
}

/* ---------------------------------------------------------------- per-test setup */

/* What every daemon of the test inherits: its topic prefix, a test master key, the cached model,
 * one training thread and slot per worker, and a short lease. */
static void set_daemon_env(void) {
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
}

static void setup(void) {
  lt_test_require_stack();
  ensure_model();
  char rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(prefix, sizeof prefix, "te2e%.8s.", rnd);
  set_daemon_env();
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/lathe-e2e-%d-%.8s", (int)getpid(), rnd);
  mkdir(tmp_dir, 0700);
  lt_test_admin_topics();
  snprintf(tenant, sizeof tenant, "e2e-%.10s", rnd);
  for (char *p = tenant; *p; p++) *p = (char)tolower((unsigned char)*p);
  lt_test_tenant_create(tenant, NULL, api_key, sizeof api_key);
}

static void teardown(void) {
  lt_test_procs_stop_all();
  lt_client_destroy(client);
  client = NULL;
  if (prefix[0]) lt_test_topics_delete(prefix); /* their records were only this test's */
  prefix[0] = '\0';
  if (!getenv("LATHE_E2E_KEEP") && tmp_dir[0]) lt_test_rm_rf(tmp_dir);
}

/* The control plane: api, scheduler, publisher. */
static void start_control_plane(void) {
  spawn("scheduler", "scheduler", NULL);
  spawn("publisher", "publisher", NULL);
  start_api();
}

/* The control plane, a worker w1 (inside network namespace netns when not NULL), a tail on the
 * log and the dataset uploaded (its id into ds). */
static lt_test_tail_t *start_fleet(const char *netns, lt_test_proc_t **w1, char *ds, size_t n) {
  start_control_plane();
  lt_test_proc_t *w = spawn("w1", "worker", netns);
  if (w1) *w1 = w;
  lt_test_tail_t *t = lt_test_tail_open(NULL, log_topics);
  upload_dataset(ds, n);
  return t;
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
static char *published_adapter(lt_test_tail_t *t, const char *job, size_t *len, char sha[65]) {
  json_t *ap = wait_for(t, "ArtifactPublished", job, 0, 120000);
  int status = 0;
  char *st = NULL;
  /* The API serves what its projection has folded; it may be a moment behind our consumer. */
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < 60000; lt_test_msleep(200)) {
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

/* A staff member enrolled for the API to come (LATHE_STAFF_KEYS_FILE): their key into key. */
static void enrol_staff(const char *name, char *key) {
  char line[256], path[700];
  cr_assert_eq(lt_access_staff_key_new(name, key, line, sizeof line, NULL, 0), LT_OK);
  snprintf(path, sizeof path, "%s/staff.keys", tmp_dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f, "%s", path);
  fprintf(f, "%s\n", line);
  fclose(f);
  setenv("LATHE_STAFF_KEYS_FILE", path, 1);
}

/* Staff read a published artifact under a job grant the tenant approved: the same bytes the
 * tenant downloads (streamed under the job's artifact key). */
static void staff_reads_artifact(const char *staff_key, const char *job, const char *name, const char *want,
                                 size_t want_len) {
  lt_client_t *staff = lt_test_client(api_url, staff_key, 120);
  char body[512], path[256];
  snprintf(body, sizeof body, "{\"tenant_id\":\"%s\",\"scope\":[\"job:%s\"],\"justification\":\"t-1\",\"duration_s\":600}",
           tenant, job);
  lt_client_resp_t r = lt_test_req(staff, "POST", "/v1/staff/access", body, strlen(body));
  cr_assert_eq(r.status, 201, "%s", r.body);
  char id[64];
  snprintf(id, sizeof id, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/access/%s/approve", id);
  r = lt_test_req(client, "POST", path, "{}", 2);
  cr_assert_eq(r.status, 200, "%s", r.body);
  lt_client_resp_free(&r);
  snprintf(path, sizeof path, "/v1/staff/access/%s/jobs/%s/artifacts/%s", id, job, name);
  r = lt_test_req(staff, "GET", path, NULL, 0);
  cr_assert_eq(r.status, 200, "%s", r.body);
  cr_assert_eq(r.len, want_len);
  cr_assert(memcmp(r.body, want, want_len) == 0, "the staff read differs from the tenant's download");
  lt_client_resp_free(&r);
  lt_client_destroy(staff);
}

Test(e2e, a_job_runs_from_upload_to_a_published_peft_adapter_with_eval_against_base) {
  char ds[64], job[64], staff_key[LT_ACCESS_STAFF_KEY_SIZE];
  enrol_staff("alice", staff_key);
  lt_test_tail_t *t = start_fleet(NULL, NULL, ds, sizeof ds);
  submit(ds, 8, 4, 11, job, sizeof job);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 1, 30000);
  json_t *ap = wait_for(t, "ArtifactPublished", job, 0, 120000);
  /* Publish after commit: the promoted checkpoint is the final commit JobCompleted names. */
  json_t *commits = records(t, "CheckpointCommitted", job, 1);
  cr_assert_geq(json_array_size(commits), 2, "a commit at step 4 and a final one at step 8");
  json_t *last = json_array_get(commits, json_array_size(commits) - 1);
  cr_assert(lt_test_rb(last, "final"));
  cr_assert_eq(lt_test_ri(last, "step"), 8);
  cr_assert_str_eq(lt_test_rs(done, "checkpoint_event_id"), lt_test_rs(last, "event_id"));
  cr_assert_str_eq(lt_test_rs(ap, "checkpoint_event_id"), lt_test_rs(last, "event_id"));
  json_decref(commits);
  /* The worker's heartbeats say what it trains on: this machine's GPUs, one a slot, or the cpu. */
  char why[512] = "";
  int gpus = 0;
  if (lt_cuda_device_count(&gpus, why, sizeof why)) gpus = 0;
  json_t *hbs = records(t, "WorkerHeartbeat", NULL, 0), *hb = json_array_get(hbs, json_array_size(hbs) - 1);
  cr_assert_not_null(hb, "no heartbeat");
  cr_assert_str_eq(lt_test_rs(hb, "backend"), gpus ? "cuda" : "cpu", "GPUs here: %d (%s)", gpus, why);
  cr_assert_eq(json_array_size(json_object_get(json_object_get(hb, "r"), "devices")), (size_t)gpus);
  json_decref(hbs);

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
  cr_assert_str_eq(json_string_value(json_object_get(e, "config_digest")), lt_test_rs(ap, "config_digest"));
  json_decref(e);
  staff_reads_artifact(staff_key, job, "eval.json", ev, ev_len);
  /* Staged-only objects are never served. */
  char *x = download(job, "state.bin", &x_len, &status);
  cr_assert_eq(status, 404, "state.bin answered %d", status);
  free(x);
  free(st);
  free(cfg);
  free(ev);
  lt_test_tail_close(t);
}

/* ================================================================ 2. kill -9 of a worker */

/* The lowest and highest "step" of a job's records of type in attempt (lo INT64_MAX and hi 0
 * when there are none). */
static void step_range(lt_test_tail_t *t, const char *type, const char *job, int attempt, json_int_t *lo,
                       json_int_t *hi) {
  json_t *all = records(t, type, job, attempt), *r;
  size_t i;
  *lo = INT64_MAX;
  *hi = 0;
  json_array_foreach(all, i, r) {
    json_int_t step = lt_test_ri(r, "step");
    if (step < *lo) *lo = step;
    if (step > *hi) *hi = step;
  }
  json_decref(all);
}

/* Waits (up to 300 s) until attempt 1 of job has reported a step past its newest commit, the
 * moment a kill loses progress; fails if the job completes first. Returns the commit's step. */
static json_int_t wait_past_a_commit(lt_test_tail_t *t, const char *job) {
  for (int64_t t0 = lt_time_wall_ms();; lt_test_tail_poll(t, 100)) {
    cr_assert_lt(lt_time_wall_ms() - t0, 300000, "attempt 1 never got past a commit");
    json_int_t lo, committed, reported;
    step_range(t, "CheckpointCommitted", job, 1, &lo, &committed);
    step_range(t, "StepCompleted", job, 1, &lo, &reported);
    if (committed > 0 && reported > committed) return committed;
    cr_assert(!first(t, "JobCompleted", job, 0), "the job completed before the kill: make it longer");
    lt_test_procs_check();
  }
}

/* An upstream submission (straight into lathe.jobs, as tests/upstream_python.py does) of job_id
 * on base model `model`: what the API would refuse, the scheduler still receives from upstream. */
static void produce_upstream(const char *job_id, const char *model, const char *dataset) {
  char field[96], msg[256];
  json_t *body = json_pack("{s:s,s:s,s:{s:i,s:i,s:i}}", "base_model", model, "dataset_id", dataset,
                           "hyperparameters", "max_steps", 4, "checkpoint_interval", 4, "max_seq_len", 64);
  lt_jobspec_t spec;
  cr_assert_eq(lt_jobspec_from_json(body, &spec, field, sizeof field, msg, sizeof msg), LT_OK, "%s", msg);
  json_decref(body);
  lt_avro_registry_t *reg;
  lt_avro_record_t *rec;
  cr_assert_eq(lt_avro_registry_new(&reg, err, sizeof err), LT_OK);
  cr_assert_eq(lt_avro_record_new(reg, "JobSubmitted", &rec, err, sizeof err), LT_OK);
  lt_avro_record_stamp(rec, "upstream/test");
  lt_avro_set_string(rec, "job_id", job_id);
  lt_avro_set_string(rec, "tenant_id", tenant);
  cr_assert_eq(lt_jobspec_to_record(&spec, rec, err, sizeof err), LT_OK, "%s", err);
  const uint8_t *b;
  size_t len;
  cr_assert_eq(lt_avro_record_encode(rec, &b, &len, err, sizeof err), LT_OK, "%s", err);
  lt_bus_conf_t *conf = lt_test_bus_env(); /* the admin principal */
  char topic[128];
  lt_bus_topic_name(conf, "jobs", topic, sizeof topic);
  lt_bus_producer_t *p;
  cr_assert_eq(lt_bus_producer_new(conf, NULL, &p, err, sizeof err), LT_OK, "%s", err);
  /* lathe.jobs: two partitions per class, in class order. */
  lt_bus_record_t r = {.topic = topic, .partition = (int32_t)spec.priority * 2, .key = job_id,
                       .key_size = strlen(job_id), .value = b, .value_size = len};
  cr_assert_eq(lt_bus_produce_sync(p, &r, 15000, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_bus_producer_destroy(p, 5000);
  lt_bus_conf_destroy(conf);
  lt_avro_record_destroy(rec);
  lt_avro_registry_destroy(reg);
}

/* A job that asks for bf16 base-weight products gets them through the whole fleet (API, record,
 * dispatch, executor): the same job in f32 and in bf16 publish under different config digests,
 * and the bf16 one's base loss is the f32 one's within bf16 rounding, not equal. On a chip
 * without AMX the bf16 job fails saying so. */
Test(e2e, a_job_asking_for_bf16_runs_it_and_its_digest_says_so) {
  char ds[64], jobs[2][64];
  lt_test_tail_t *t = start_fleet(NULL, NULL, ds, sizeof ds);
  for (int i = 0; i < 2; i++) {
    json_t *body = json_pack("{s:s,s:s,s:{s:i,s:i,s:i,s:i,s:s}}", "base_model", MODEL, "dataset_id", ds,
                             "hyperparameters", "max_steps", 4, "batch_size", 8, "seed", 5, "max_seq_len", 64,
                             "precision", i ? "bf16" : "f32");
    lt_client_resp_t r;
    cr_assert_eq(lt_client_json(client, "POST", "/v1/jobs", body, NULL, &r, err, sizeof err), LT_OK, "%s", err);
    json_decref(body);
    cr_assert_eq(r.status, 201, "%s", r.body);
    snprintf(jobs[i], sizeof jobs[i], "%s", json_string_value(json_object_get(r.json, "id")));
    lt_client_resp_free(&r);
  }
  cr_assert_str_eq(wait_terminal(jobs[0], 600000), "COMPLETED");
  const char *end = wait_terminal(jobs[1], 600000);
  if (strcmp(end, "FAILED") == 0) {
    json_t *j = job_info(jobs[1]);
    const char *reason = json_string_value(json_object_get(j, "reason"));
    cr_assert(reason && strstr(reason, "AMX"), "bf16 failed, not for want of AMX: %s", reason ? reason : "(none)");
    char why[512];
    snprintf(why, sizeof why, "%s", reason);
    json_decref(j); /* it held reason */
    cr_skip_test("skipped: no AMX here (%s)", why);
  }
  cr_assert_str_eq(end, "COMPLETED");
  json_t *ap0 = wait_for(t, "ArtifactPublished", jobs[0], 0, 120000), *ap1 = wait_for(t, "ArtifactPublished", jobs[1], 0, 120000);
  cr_assert_str_neq(lt_test_rs(ap0, "config_digest"), lt_test_rs(ap1, "config_digest"));
  double base[2];
  for (int i = 0; i < 2; i++) {
    json_t *ev = wait_for(t, "EvalCompleted", jobs[i], 1, 60000), *m;
    size_t k;
    base[i] = 0;
    json_array_foreach(json_object_get(json_object_get(ev, "r"), "metrics"), k, m) {
      if (strcmp(json_string_value(json_object_get(m, "name")), "val_loss") == 0)
        base[i] = json_number_value(json_object_get(m, "base_value"));
    }
  }
  cr_assert(base[0] > 0 && base[1] != base[0] && fabs(base[1] - base[0]) < 1e-2 * base[0],
            "base val loss f32 %.9g, bf16 %.9g", base[0], base[1]);
  lt_test_tail_close(t);
}

/* A base model no worker has. Through the API: refused at submission, naming the field, once
 * the worker's heartbeat says what it serves. From upstream (no API in the way): the attempts
 * fail at once (no executor starts), and the job fails with a reason that names the model and
 * nothing of the servers (no path, no worker name). */
Test(e2e, a_job_on_a_base_model_no_worker_has_fails_naming_the_model_and_no_server_path) {
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(NULL, NULL, ds, sizeof ds);
  json_t *body = json_pack("{s:s,s:s}", "base_model", "no-such-model", "dataset_id", ds);
  lt_client_resp_t r = {0};
  lt_test_wait_until((lt_client_resp_free(&r), lt_client_json(client, "POST", "/v1/jobs", body, NULL, &r, err, sizeof err),
                      r.status == 400),
                     60000, 300, "the API never refused a model no worker serves (last %d %s)", r.status, r.body);
  cr_expect_str_eq(json_string_value(json_object_get(json_object_get(r.json, "error"), "field")), "base_model", "%s",
                   r.body);
  lt_client_resp_free(&r);
  json_decref(body);
  snprintf(job, sizeof job, "job-upstream-%d", (int)getpid());
  produce_upstream(job, "no-such-model", ds);
  cr_assert_str_eq(wait_terminal(job, 120000), "FAILED");
  json_t *j = job_info(job);
  const char *reason = json_string_value(json_object_get(j, "reason"));
  cr_assert(reason, "no reason in %s", json_dumps(j, 0));
  cr_expect(strstr(reason, "\"no-such-model\" is not installed") != NULL, "reason: %s", reason);
  cr_expect(strchr(reason, '/') == NULL, "the reason shows a path: %s", reason);
  cr_expect(strstr(reason, "w1") == NULL, "the reason names the worker: %s", reason);
  wait_for(t, "JobFailed", job, 0, 30000); /* the tail has read the job to its end */
  cr_expect(!first(t, "StepCompleted", job, 0), "an attempt trained on a model that is not there");
  json_decref(j);
}

/* A job of `steps` (checkpoint every `interval`, seed 42) running on w1 (ds and job: 64 bytes
 * each), a second worker w2 owning dispatch partitions beside it, and attempt 1 a step past a
 * commit (*committed): the moment a stop of w1 can lose progress. */
static lt_test_tail_t *past_a_commit_beside_w2(int steps, int interval, lt_test_proc_t **w1, char *ds, char *job,
                                               json_int_t *committed) {
  lt_test_tail_t *t = start_fleet(NULL, w1, ds, 64);
  submit(ds, steps, interval, 42, job, 64);
  cr_assert_str_eq(lt_test_rs(wait_for(t, "AttemptStarted", job, 1, 300000), "worker_id"), "w1");
  spawn("w2", "worker", NULL);
  wait_owns_partitions(t, "w2");
  *committed = wait_past_a_commit(t, job);
  return t;
}

Test(e2e, a_worker_killed_mid_training_is_resumed_elsewhere_from_its_last_commit_bit_for_bit) {
  /* Long enough to be mid-training once w2 owns partitions: uploads run beside training, so a
   * 60-step job could finish before the kill. */
  const int steps = 300, interval = 4;
  lt_test_proc_t *w1;
  char ds[64], job[64], ref[64];
  json_int_t committed;
  /* Mid-interval: a step past the newest commit of attempt 1, then kill -9 the worker. */
  lt_test_tail_t *t = past_a_commit_beside_w2(steps, interval, &w1, ds, job, &committed);
  cr_assert_eq(committed % interval, 0);
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0, "w1 logged no executor pid");
  lt_test_proc_kill(w1, SIGKILL);
  int64_t killed_at = lt_time_wall_ms();
  cr_assert(!first(t, "JobCompleted", job, 0), "the job completed before the kill: make it longer");
  /* Its executor must not go on training a fenced attempt on a dead node. */
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < 10000 && !lt_test_pid_dead(ex);) lt_test_msleep(50);
  if (!lt_test_pid_dead(ex)) {
    kill(ex, SIGKILL);
    cr_assert_fail("the executor (pid %d) of the killed worker was still running 10 s later", (int)ex);
  }

  json_t *lost = wait_for(t, "AttemptStopped", job, 1, 120000);
  cr_assert_str_eq(lt_test_rs(lost, "reason"), "lost");
  json_t *s2 = wait_for(t, "AttemptStarted", job, 2, 120000);
  cr_assert_str_eq(lt_test_rs(s2, "worker_id"), "w2");
  /* The last commit of attempt 1 in the log is what attempt 2 resumes from. */
  json_t *commits1 = records(t, "CheckpointCommitted", job, 1);
  json_int_t last_commit = lt_test_ri(json_array_get(commits1, json_array_size(commits1) - 1), "step");
  json_decref(commits1);
  cr_assert_eq(lt_test_ri(s2, "resume_step"), last_commit, "attempt 2 resumes from step %lld, the last commit is %lld",
               (long long)lt_test_ri(s2, "resume_step"), (long long)last_commit);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 0, 30000);
  cr_assert_eq(lt_test_ri(done, "attempt"), 2);
  lt_test_tail_poll(t, 500);
  /* Steps lost: the progress attempt 1 reported beyond the commit, at most one interval. */
  json_int_t min1, max1, min2, max2;
  step_range(t, "StepCompleted", job, 1, &min1, &max1);
  step_range(t, "StepCompleted", job, 2, &min2, &max2);
  cr_assert_eq(min2, last_commit + 1, "attempt 2's first step is %lld", (long long)min2);
  /* Progress records the dead worker had not delivered die with it, so attempt 1's last reported
   * step can equal its last commit (a commit can land between the test's look and the kill).
   * Checkpoints upload while training goes on, but the executor holds the update after a
   * checkpoint until the worker has recorded its commit: at most one interval is lost. */
  cr_assert(max1 - last_commit <= interval && max1 >= last_commit,
            "attempt 1 reached step %lld, resumed from %lld", (long long)max1, (long long)last_commit);
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
              (long long)max1, (long long)last_commit, (long long)(lt_test_ri(s2, "occurred_at") - killed_at));

  /* The same spec uninterrupted, on the same kind of worker (one thread): the same bytes. */
  size_t len_a, len_b;
  char sha_a[65], sha_b[65];
  char *a = published_adapter(t, job, &len_a, sha_a);
  submit(ds, steps, interval, 42, ref, sizeof ref);
  cr_assert_str_eq(wait_terminal(ref, 600000), "COMPLETED");
  json_t *refdone = wait_for(t, "JobCompleted", ref, 0, 30000);
  cr_assert_eq(lt_test_ri(refdone, "attempt"), 1);
  /* At no moment of either run could a crash have lost more than one interval. */
  lt_test_tail_poll(t, 500);
  cr_log_info("steps past the newest commit, at most: %lld (resumed run), %lld (uninterrupted run)",
              (long long)commits_lag(t, job, 2, last_commit, interval), (long long)commits_lag(t, ref, 1, 0, interval));
  char *b = published_adapter(t, ref, &len_b, sha_b);
  cr_assert_eq(len_a, len_b);
  cr_assert_str_eq(sha_a, sha_b, "the resumed run's adapter differs from the uninterrupted run's");
  cr_assert(memcmp(a, b, len_a) == 0);
  free(a);
  free(b);
  lt_test_tail_close(t);
}

/* A graceful stop (SIGTERM, what systemd sends): the worker drains — its heartbeats say so and
 * the scheduler places nothing more there, its attempt checkpoints and stops as a preempted one
 * does — and exits 0; the job resumes on the other worker from the step it stopped at, charged
 * nothing. */
Test(e2e, a_worker_stopped_by_sigterm_drains_and_its_job_resumes_elsewhere_losing_no_step) {
  const int steps = 300, interval = 50;
  lt_test_proc_t *w1;
  char ds[64], job[64];
  json_int_t committed;
  lt_test_tail_t *t = past_a_commit_beside_w2(steps, interval, &w1, ds, job, &committed);
  lt_test_proc_kill(w1, SIGTERM);
  cr_assert(!first(t, "JobCompleted", job, 0), "the job completed before the stop: make it longer");

  json_t *stop = wait_for(t, "AttemptStopped", job, 1, 120000);
  cr_assert_str_eq(lt_test_rs(stop, "reason"), "preempt", "detail: %s", lt_test_rs(stop, "detail"));
  int st = -1;
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < 60000 && !lt_test_proc_exited(w1, &st);)
    lt_test_msleep(100);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "w1 did not exit 0 after its drain (status %d):\n%s", st,
            lt_test_log_tail(w1->log));
  cr_assert(lt_test_file_has(w1->log, "worker drained, stopping"), "%s", lt_test_log_tail(w1->log));
  json_t *d2 = wait_for(t, "JobDispatched", job, 2, 120000);
  cr_assert_str_eq(lt_test_rs(d2, "worker_id"), "w2", "the draining worker got attempt 2");
  json_t *s2 = wait_for(t, "AttemptStarted", job, 2, 120000);
  cr_assert_str_eq(lt_test_rs(s2, "worker_id"), "w2");
  /* the stop's own checkpoint is attempt 1's last commit: no step ran that was not kept */
  json_int_t lo1, last1, lo2, hi2, max1;
  step_range(t, "CheckpointCommitted", job, 1, &lo1, &last1);
  cr_assert_gt(last1, committed, "no checkpoint at the stop (last commit %lld)", (long long)last1);
  cr_assert_eq(lt_test_ri(s2, "resume_step"), last1);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  lt_test_tail_poll(t, 500);
  step_range(t, "StepCompleted", job, 1, &lo1, &max1);
  step_range(t, "StepCompleted", job, 2, &lo2, &hi2);
  cr_assert_leq(max1, last1, "attempt 1 reported step %lld past its last commit %lld", (long long)max1, (long long)last1);
  cr_assert_eq(lo2, last1 + 1);
  cr_assert_eq(hi2, steps);
  json_t *info = job_info(job);
  cr_assert_eq(json_integer_value(json_object_get(info, "failed_attempts")), 0);
  json_decref(info);
  cr_log_info("stopped at step %lld (interval %d): attempt 2 resumed there", (long long)last1, interval);
  lt_test_tail_close(t);
}

/* The operator who will not wait: a second SIGTERM while the worker drains stops it at once,
 * its executor killed with it (the attempt is then lost like a dead worker's). */
Test(e2e, a_second_sigterm_stops_a_draining_worker_at_once) {
  lt_test_proc_t *w1;
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(NULL, &w1, ds, sizeof ds);
  submit(ds, 3000, 1000, 42, job, sizeof job); /* no commit before the stop's own checkpoint */
  wait_for(t, "AttemptStarted", job, 1, 300000);
  for (int64_t t0 = lt_time_wall_ms(); !first(t, "StepCompleted", job, 1); lt_test_tail_poll(t, 100))
    cr_assert_lt(lt_time_wall_ms() - t0, 120000, "attempt 1 never reported a step");
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0, "w1 logged no executor pid");
  kill(ex, SIGSTOP); /* it cannot checkpoint: the drain would wait for the kill deadline */
  lt_test_proc_kill(w1, SIGTERM);
  lt_test_wait_until(lt_test_file_has(w1->log, "draining: 1 attempt(s) asked"), 30000, 50, "no drain:\n%s",
                     lt_test_log_tail(w1->log));
  int64_t again = lt_time_mono_ms();
  kill(w1->pid, SIGTERM);
  int st = -1;
  while (lt_time_mono_ms() - again < 20000 && !lt_test_proc_exited(w1, &st)) lt_test_msleep(20);
  int64_t took = lt_time_mono_ms() - again;
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "w1 did not exit 0 (status %d):\n%s", st, lt_test_log_tail(w1->log));
  cr_assert(lt_test_file_has(w1->log, "SIGTERM, stopping"), "%s", lt_test_log_tail(w1->log));
  cr_assert(!lt_test_file_has(w1->log, "worker drained"), "%s", lt_test_log_tail(w1->log));
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < 10000 && !lt_test_pid_dead(ex);) lt_test_msleep(50);
  if (!lt_test_pid_dead(ex)) {
    kill(ex, SIGKILL);
    cr_assert_fail("the executor (pid %d) outlived its worker", (int)ex);
  }
  lt_test_tail_poll(t, 500);
  json_t *stop = first(t, "AttemptStopped", job, 1); /* none yet, or lost once the lease expired */
  cr_assert(!stop || strcmp(lt_test_rs(stop, "reason"), "preempt") != 0, "the drain went on to stop the attempt");
  cr_log_info("the second SIGTERM stopped w1 in %lld ms", (long long)took);
  lt_test_tail_close(t);
}

/* ================================================================ 3. cancel while running */

Test(e2e, cancel_while_running_stops_within_the_kill_deadline_publishes_nothing_and_deletes_staging) {
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(NULL, NULL, ds, sizeof ds);
  submit(ds, 400, 2, 5, job, sizeof job);
  json_t *c = wait_for(t, "CheckpointCommitted", job, 1, 600000);
  char staging[256];
  snprintf(staging, sizeof staging, "staging/%s/%s/", tenant, job);
  cr_assert_gt(count_objects(staging), 0, "the commit's objects are in staging");
  (void)c;
  int64_t asked = lt_time_wall_ms();
  int status = cancel(job);
  cr_assert(status == 200 || status == 202, "cancel answered %d", status);
  json_t *cr = wait_for(t, "CancelRequested", job, 0, 30000);
  json_t *stopped = wait_for(t, "AttemptStopped", job, 1, KILL_DEADLINE_MS + 30000);
  int64_t stop_at = lt_test_ri(stopped, "occurred_at");
  cr_assert_str_eq(lt_test_rs(stopped, "reason"), "cancel");
  cr_assert(!lt_test_rb(stopped, "killed"), "the executor had to be killed: it did not stop at a micro-step");
  cr_assert_lt(stop_at - lt_test_ri(cr, "occurred_at"), KILL_DEADLINE_MS, "stop %lld ms after the cancel record",
               (long long)(stop_at - lt_test_ri(cr, "occurred_at")));
  cr_assert_lt(stop_at - asked, KILL_DEADLINE_MS);
  cr_assert_lt(lt_test_ri(stopped, "step"), 400);
  /* How far training went on after the cancel was recorded (reported, not asserted: the worker
   * sees the record some time after it is written; the bound asserted is the kill deadline). */
  json_t *prog = records(t, "StepCompleted", job, 1);
  json_int_t before = 0;
  size_t i;
  json_t *r;
  json_array_foreach(prog, i, r) if (lt_test_ri(r, "occurred_at") <= lt_test_ri(cr, "occurred_at") && lt_test_ri(r, "step") > before) before =
      lt_test_ri(r, "step");
  json_decref(prog);
  cr_log_info("progress at step %lld when the cancel was recorded, stopped at step %lld, %lld ms later",
              (long long)before, (long long)lt_test_ri(stopped, "step"), (long long)(stop_at - lt_test_ri(cr, "occurred_at")));
  cr_assert_str_eq(wait_terminal(job, 60000), "CANCELLED");
  wait_for(t, "JobCancelled", job, 0, 30000);
  json_t *clean = wait_for(t, "CleanupDone", job, 1, 60000);
  cr_assert_gt(lt_test_ri(clean, "staging_objects_deleted"), 0);
  cr_assert_eq(count_objects(staging), 0, "staging objects of the cancelled job remain");
  cr_assert(!first(t, "JobCompleted", job, 0));
  /* Nothing published: none recorded, none served, none in the artifacts prefix. */
  lt_test_tail_poll(t, 2000);
  cr_assert(!first(t, "ArtifactPublished", job, 0), "a cancelled job was published");
  size_t len;
  char *x = download(job, "adapter_model.safetensors", &len, &status);
  cr_assert_eq(status, 404, "a cancelled job's adapter answered %d", status);
  free(x);
  char arts[256];
  snprintf(arts, sizeof arts, "tenants/%s/artifacts/%s/", tenant, job);
  cr_assert_eq(count_objects(arts), 0);
  cr_log_info("cancel -> AttemptStopped: %lld ms (step %lld)", (long long)(stop_at - asked), (long long)lt_test_ri(stopped, "step"));
  lt_test_tail_close(t);
}

/* ================================================================ 4. cancel racing completion */

/* The first moment lands well before completion (a cancel that must win), the others straddle
 * it: the log decides each, and both outcomes must occur for the race to have been exercised. */
typedef enum { AT_FIRST_STEP, AT_LAST_STEP, AT_FINAL_COMMIT, AT_COMPLETED, AT__N } moment_t;
static const char *const moment_names[AT__N] = {"the first step", "the last step",
                                                "the final checkpoint commit", "the completion"};

/* Has job (of steps steps) reached moment k in the log? */
static bool reached(lt_test_tail_t *t, moment_t k, const char *job, int steps) {
  if (k == AT_COMPLETED) return first(t, "JobCompleted", job, 0) != NULL;
  json_t *all = records(t, k == AT_FINAL_COMMIT ? "CheckpointCommitted" : "StepCompleted", job, 0), *r;
  bool hit = false;
  size_t i;
  json_array_foreach(all, i, r) {
    if (k == AT_FINAL_COMMIT) hit |= lt_test_rb(r, "final");
    else hit |= lt_test_ri(r, "step") == (k == AT_LAST_STEP ? steps : 1);
  }
  json_decref(all);
  return hit;
}

/* Where a job's first CancelRequested and its first terminal record (JobCompleted, JobCancelled
 * or JobFailed) stand in its control partition (-1: none); returns that terminal record's type,
 * NULL when there is none (owned by the tail). */
static const char *log_order(lt_test_tail_t *t, const char *job, long *cancel_at, long *terminal_at) {
  json_t *ctl = lt_test_tail_select(t, "control", NULL, job, 0), *r;
  const char *terminal = NULL;
  size_t i;
  *cancel_at = *terminal_at = -1;
  json_array_foreach(ctl, i, r) {
    const char *type = json_string_value(json_object_get(r, "type"));
    long off = (long)json_integer_value(json_object_get(r, "offset"));
    if (!strcmp(type, "CancelRequested") && *cancel_at < 0) *cancel_at = off;
    if ((!strcmp(type, "JobCompleted") || !strcmp(type, "JobCancelled") || !strcmp(type, "JobFailed")) &&
        *terminal_at < 0) {
      *terminal_at = off;
      terminal = type;
    }
  }
  json_decref(ctl);
  return terminal;
}

Test(e2e, cancel_racing_completion_ends_as_the_log_order_says_and_publishes_only_completions) {
  const int steps = 10;
  char ds[64], jobs[AT__N][64];
  bool asked[AT__N] = {0};
  lt_test_tail_t *t = start_fleet(NULL, NULL, ds, sizeof ds);
  spawn("w2", "worker", NULL);
  /* The first job runs long enough that a cancel seen at its first step must come first. */
  for (int k = 0; k < AT__N; k++) submit(ds, k == AT_FIRST_STEP ? 40 * steps : steps, 3, 100 + k, jobs[k], sizeof jobs[k]);
  for (int64_t t0 = lt_time_wall_ms(); lt_time_wall_ms() - t0 < 900000;) {
    int pending = 0;
    for (int k = 0; k < AT__N; k++) {
      if (asked[k]) continue;
      pending++;
      if (reached(t, (moment_t)k, jobs[k], steps)) {
        int st = cancel(jobs[k]);
        cr_assert(st == 200 || st == 202 || st == 409, "cancel of %s answered %d", jobs[k], st);
        asked[k] = true;
      }
    }
    if (!pending) break;
    lt_test_procs_check();
    lt_test_tail_poll(t, 50);
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
    for (int64_t t0 = lt_time_wall_ms(); !first(t, "JobCompleted", jobs[k], 0) && !first(t, "JobCancelled", jobs[k], 0) &&
                                 !first(t, "JobFailed", jobs[k], 0);
         lt_test_tail_poll(t, 200))
      cr_assert_lt(lt_time_wall_ms() - t0, 60000, "job %d: the API says %s, the log has no terminal record", k, saved[k]);
    if (!strcmp(saved[k], "COMPLETED")) wait_for(t, "ArtifactPublished", jobs[k], 0, 120000);
  }
  lt_test_tail_poll(t, 3000); /* whatever else the publisher would have written by now */
  int cancelled = 0, completed = 0;
  for (int k = 0; k < AT__N; k++) {
    long cancel_at, terminal_at;
    const char *terminal = log_order(t, jobs[k], &cancel_at, &terminal_at);
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
  lt_test_tail_close(t);
}

/* ================================================================ 5. object server down */

/* Did the bucket PUT (a curl command printing the status) make the bucket, or find it made? */
static bool bucket_made(const char *cmd) {
  char *out = lt_test_run(cmd, NULL);
  bool ok = !strcmp(out, "200") || !strcmp(out, "409");
  free(out);
  return ok;
}

/* A private S3Proxy on PORT with its data under DIR (the stack's jars), and its bucket. */
static lt_test_proc_t *start_s3proxy(int port, const char *dir) {
  char props[700], logf[700], cp[1100];
  snprintf(props, sizeof props, "%s/s3proxy.properties", dir);
  snprintf(logf, sizeof logf, "%s/s3proxy.log", dir);
  lt_test_source_path(".stack/lib/s3proxy/*", cp, sizeof cp);
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
  const char *argv[] = {"java", "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp,
                        "org.gaul.s3proxy.Main", "--properties", props, NULL};
  lt_test_proc_t *s3 = lt_test_spawn(&(lt_test_spawn_t){.name = "s3proxy", .log = logf, .argv = argv});
  char cmd[1200];
  snprintf(cmd, sizeof cmd,
           "curl -s -o /dev/null -w '%%{http_code}' --max-time 5 -X PUT --aws-sigv4 aws:amz:us-east-1:s3 "
           "--user '%s:%s' -H 'x-amz-content-sha256: "
           "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' http://127.0.0.1:%d/%s",
           getenv("LATHE_S3_ACCESS_KEY"), getenv("LATHE_S3_SECRET_KEY"), port, getenv("LATHE_S3_BUCKET"));
  lt_test_wait_until(bucket_made(cmd), 120000, 500, "the private s3proxy did not answer in 120 s:\n%s",
                     lt_test_log_tail(logf));
  return s3;
}

/* How many times `needle` is in worker w's log once it is there `times` times or timeout_ms
 * passed (the daemons checked meanwhile). */
static int log_count_within(const lt_test_proc_t *w, const char *needle, int times, int timeout_ms) {
  int count = 0;
  for (int64_t t0 = lt_time_wall_ms();; lt_test_msleep(200)) {
    char *all = lt_test_slurp(w->log, NULL);
    count = 0;
    for (char *p = all; p && (p = strstr(p, needle)); p++) count++;
    free(all);
    if (count >= times || lt_time_wall_ms() - t0 >= timeout_ms) return count;
    lt_test_procs_check();
  }
}

Test(e2e, the_object_server_down_during_a_checkpoint_is_retried_and_the_job_completes) {
  char dir[700], endpoint[64];
  snprintf(dir, sizeof dir, "%s/s3", tmp_dir);
  mkdir(dir, 0700);
  int port = lt_test_free_port();
  lt_test_proc_t *s3 = start_s3proxy(port, dir);
  snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", port);
  setenv("LATHE_S3_ENDPOINT", endpoint, 1); /* every daemon of this test, and the test's own reads */
  lt_test_proc_t *w1;
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(NULL, &w1, ds, sizeof ds);
  /* Checkpoints every 3 of 60 steps: uploads run beside training, so the outage must last
   * long enough to meet one (the next upload waits for the one that retries). */
  submit(ds, 60, 3, 9, job, sizeof job);
  json_t *c1 = wait_for(t, "CheckpointCommitted", job, 1, 600000);
  cr_assert_eq(lt_test_ri(c1, "step"), 3);
  /* Down while training goes on: the next checkpoints cannot be stored. */
  lt_test_proc_kill(s3, SIGKILL);
  int64_t down_at = lt_time_wall_ms();
  /* Wait until a checkpoint upload has failed at least twice, then bring the server back. */
  log_count_within(w1, "checkpoint upload failed", 2, 100000);
  cr_assert(lt_test_file_has(w1->log, "checkpoint upload failed"), "no checkpoint upload met the outage");
  /* An upload that finished before the kill may still be reported; once uploads fail, no
   * commit may be recorded until the store is back. */
  lt_test_tail_poll(t, 500);
  json_t *commits = records(t, "CheckpointCommitted", job, 1);
  size_t before = json_array_size(commits);
  json_decref(commits);
  lt_test_msleep(1500);
  lt_test_tail_poll(t, 500);
  commits = records(t, "CheckpointCommitted", job, 1);
  cr_assert_eq(json_array_size(commits), before, "a checkpoint was committed while the store was down");
  json_decref(commits);
  start_s3proxy(port, dir);
  cr_log_info("object server down for %lld ms", (long long)(lt_time_wall_ms() - down_at));
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  wait_for(t, "JobCompleted", job, 1, 30000);
  commits = records(t, "CheckpointCommitted", job, 0);
  json_int_t want = 3;
  size_t i;
  json_t *r;
  json_array_foreach(commits, i, r) {
    cr_assert_eq(lt_test_ri(r, "step"), want, "commits at 3, 6, 9, ..., 60 in order");
    want += 3;
  }
  cr_assert_eq(want, 63);
  json_decref(commits);
  size_t len;
  char sha[65];
  char *a = published_adapter(t, job, &len, sha);
  free(a);
  lt_test_tail_close(t);
}

/* The object server away from the worker when an attempt starts: the worker reaches its store
 * through a relay that is not listening yet (connection refused), so the fetch of the attempt's
 * inputs fails as unavailable; it waits the outage out (lt_xfer's retry) and the job completes on
 * its first attempt. Before, the attempt failed at once, and an outage across three attempts
 * failed the job (docs/DESIGN.md §9: worst loss none). */
static lt_test_relay_t *relay;
static void relay_fini(void) {
  lt_test_relay_stop(relay);
  relay = NULL;
  teardown();
}

/* A fleet whose worker reaches the store through 127.0.0.1:port (and with env1, NULL or one more
 * of its environment's entries), with a job of max_steps (checkpoints every 3, seed) submitted. */
static lt_test_tail_t *fleet_via_port(int port, const char *env1, int max_steps, int seed, lt_test_proc_t **w1,
                                      char *job, size_t n) {
  char env0[64], log[600], ds[64];
  snprintf(env0, sizeof env0, "LATHE_S3_ENDPOINT=127.0.0.1:%d", port);
  const char *env[] = {env0, env1, NULL};
  start_control_plane();
  snprintf(log, sizeof log, "%s/w1.log", tmp_dir);
  *w1 = lt_test_lathed("w1", log, "worker", NULL, env);
  lt_test_tail_t *t = lt_test_tail_open(NULL, log_topics);
  upload_dataset(ds, sizeof ds);
  submit(ds, max_steps, 3, seed, job, n);
  return t;
}

/* The same where nothing listens yet at *port, with the worker's fetch for the job failed twice. */
static lt_test_tail_t *fleet_with_store_away(int *port, const char *env1, char *job, size_t n) {
  *port = lt_test_free_port();
  lt_test_proc_t *w1;
  lt_test_tail_t *t = fleet_via_port(*port, env1, 6, 5, &w1, job, n);
  cr_assert(log_count_within(w1, "fetching an attempt's inputs failed", 2, 60000) >= 2,
            "the fetch did not meet the outage in 60 s:\n%s", lt_test_log_tail(w1->log));
  return t;
}

Test(e2e, the_object_server_away_when_an_attempt_starts_is_waited_out_on_attempt_one, .fini = relay_fini) {
  int up = lt_test_local_port("LATHE_S3_ENDPOINT"), port;
  char job[64];
  lt_test_tail_t *t = fleet_with_store_away(&port, NULL, job, sizeof job);
  relay = lt_test_relay_start(port, up);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  wait_for(t, "JobCompleted", job, 1, 30000);
  json_t *stops = records(t, "AttemptStopped", job, 0), *dispatches = records(t, "JobDispatched", job, 0);
  cr_assert_eq(json_array_size(stops), 0, "an attempt stopped during the outage");
  cr_assert_eq(json_array_size(dispatches), 1, "the job took %zu attempts", json_array_size(dispatches));
  json_decref(stops);
  json_decref(dispatches);
  lt_test_tail_close(t);
}

/* Cancelled while its fetch waits for the store: the wait ends at once (the attempt never had an
 * executor) and the attempt stops as cancelled, not failed. */
Test(e2e, cancel_while_the_fetch_waits_for_the_object_server_stops_as_cancelled, .fini = relay_fini) {
  int port;
  char job[64];
  lt_test_local_port("LATHE_S3_ENDPOINT");
  lt_test_tail_t *t = fleet_with_store_away(&port, NULL, job, sizeof job);
  cr_assert_eq(cancel(job), 202);
  json_t *st = wait_for(t, "AttemptStopped", job, 1, 30000);
  cr_assert_str_eq(lt_test_rs(st, "reason"), "cancel");
  cr_assert_str_eq(wait_terminal(job, 60000), "CANCELLED");
  lt_test_tail_close(t);
}

/* Away past the worker's retry window (1.5 s here, 2 min by default): each attempt stops as
 * unavailable, its executor never started, and goes back to the queue without spending the job's
 * attempts — more such stops than max_attempts (3), then the store returns and the job completes
 * with no failed attempt (docs/DESIGN.md §9). */
Test(e2e, attempts_the_object_server_stays_away_from_never_count_against_the_job, .fini = relay_fini) {
  int up = lt_test_local_port("LATHE_S3_ENDPOINT"), port;
  char job[64];
  lt_test_tail_t *t = fleet_with_store_away(&port, "LATHE_WORKER_STORE_RETRY_MS=1500", job, sizeof job);
  json_t *stops = NULL;
  for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < 120000; lt_test_tail_poll(t, 300)) {
    lt_test_procs_check();
    json_decref(stops);
    stops = records(t, "AttemptStopped", job, 0);
    if (json_array_size(stops) >= 4) break;
  }
  cr_assert_geq(json_array_size(stops), 4, "%zu attempts stopped in 2 minutes", json_array_size(stops));
  size_t i;
  json_t *r;
  json_array_foreach(stops, i, r) {
    cr_assert_str_eq(lt_test_rs(r, "reason"), "unavailable", "attempt %lld", (long long)lt_test_ri(r, "attempt"));
    cr_assert(strstr(lt_test_rs(r, "detail"), "cannot read"), "detail: %s", lt_test_rs(r, "detail"));
  }
  json_decref(stops);
  cr_assert_null(first(t, "StepCompleted", job, 0), "a step ran while the store was away");
  relay = lt_test_relay_start(port, up);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 0, 30000);
  cr_assert_gt(lt_test_ri(done, "attempt"), 4);
  cr_assert_null(first(t, "JobFailed", job, 0));
  json_t *info = job_info(job);
  cr_assert_eq(json_integer_value(json_object_get(info, "failed_attempts")), 0);
  json_decref(info);
  lt_test_tail_close(t);
}

/* ... but not for ever: a job whose attempts the store kept from starting LATHE_MAX_UNAVAILABLE_STOPS
 * times (2 here, 30 by default) fails as store_unavailable, naming the store, with no failed
 * attempt — a worker that can never reach its store does not cycle a job through it for good. */
Test(e2e, a_job_the_object_server_stays_away_from_fails_as_store_unavailable_at_the_bound, .fini = relay_fini) {
  setenv("LATHE_MAX_UNAVAILABLE_STOPS", "2", 1);
  lt_test_local_port("LATHE_S3_ENDPOINT");
  int port;
  char job[64];
  lt_test_tail_t *t = fleet_with_store_away(&port, "LATHE_WORKER_STORE_RETRY_MS=1500", job, sizeof job);
  cr_assert_str_eq(wait_terminal(job, 120000), "FAILED");
  json_t *failed = wait_for(t, "JobFailed", job, 0, 30000);
  cr_assert_str_eq(lt_test_rs(failed, "code"), "store_unavailable");
  cr_assert(strstr(lt_test_rs(failed, "reason"), "object store could not be reached"), "%s",
            lt_test_rs(failed, "reason"));
  json_t *stops = records(t, "AttemptStopped", job, 0);
  cr_assert_eq(json_array_size(stops), 2);
  size_t i;
  json_t *r;
  json_array_foreach(stops, i, r) cr_assert_str_eq(lt_test_rs(r, "reason"), "unavailable");
  json_decref(stops);
  json_t *info = job_info(job);
  cr_assert_eq(json_integer_value(json_object_get(info, "failed_attempts")), 0);
  json_decref(info);
  lt_test_tail_close(t);
}

/* Away while a job trains, past the worker's retry window (1.5 s here): the checkpoint upload
 * that meets the outage stops the attempt as unavailable, not failed — what it trained after its
 * last commit is redone from that commit — and attempts wait on; the store back, the job
 * completes with no failed attempt and every commit once, in step order (docs/DESIGN.md §9).
 * Before, each such attempt counted, and three failed the job. */
Test(e2e, a_checkpoint_the_object_server_stays_away_from_is_redone_not_charged, .fini = relay_fini) {
  int up = lt_test_local_port("LATHE_S3_ENDPOINT"), port = lt_test_free_port();
  relay = lt_test_relay_start(port, up);
  char job[64];
  lt_test_proc_t *w1;
  lt_test_tail_t *t = fleet_via_port(port, "LATHE_WORKER_STORE_RETRY_MS=1500", 60, 9, &w1, job, sizeof job);
  wait_for(t, "CheckpointCommitted", job, 1, 600000);
  lt_test_relay_stop(relay); /* the worker's connections cut, and nothing listening */
  relay = NULL;
  json_t *st = wait_for(t, "AttemptStopped", job, 1, 120000);
  cr_assert_str_eq(lt_test_rs(st, "reason"), "unavailable", "detail: %s", lt_test_rs(st, "detail"));
  cr_assert(strstr(lt_test_rs(st, "detail"), "checkpoint at step"), "detail: %s", lt_test_rs(st, "detail"));
  cr_assert(lt_test_file_has(w1->log, "checkpoint upload failed"), "%s", lt_test_log_tail(w1->log));
  relay = lt_test_relay_start(port, up);
  cr_assert_str_eq(wait_terminal(job, 600000), "COMPLETED");
  json_t *done = wait_for(t, "JobCompleted", job, 0, 30000);
  cr_assert_gt(lt_test_ri(done, "attempt"), 1);
  cr_assert_null(first(t, "JobFailed", job, 0));
  json_t *stops = records(t, "AttemptStopped", job, 0), *commits = records(t, "CheckpointCommitted", job, 0), *r;
  size_t i;
  json_array_foreach(stops, i, r) cr_assert_str_eq(lt_test_rs(r, "reason"), "unavailable");
  json_int_t want = 3;
  json_array_foreach(commits, i, r) {
    cr_assert_eq(lt_test_ri(r, "step"), want, "commits at 3, 6, 9, ..., 60, each once, in order");
    want += 3;
  }
  cr_assert_eq(want, 63);
  json_decref(stops);
  json_decref(commits);
  json_t *info = job_info(job);
  cr_assert_eq(json_integer_value(json_object_get(info, "failed_attempts")), 0);
  json_decref(info);
  lt_test_tail_close(t);
}

/* ================================================================ 6. a partitioned worker */

/* The worker's network: its own namespace whose broker and object-server ports (as the stack
 * names them: LATHE_KAFKA_BOOTSTRAP, LATHE_S3_ENDPOINT) are this proxy's listeners, relayed byte
 * for byte to the real servers (so SASL passes through untouched). SIGUSR1 cuts every connection's
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
  ports[0] = lt_test_local_port("LATHE_KAFKA_BOOTSTRAP");
  ports[1] = lt_test_local_port("LATHE_S3_ENDPOINT");
  proxy_pid = fork();
  cr_assert(proxy_pid >= 0);
  if (proxy_pid == 0) proxy_main(netns_name, ports, 2);

  lt_test_proc_t *w1;
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(netns_name, &w1, ds, sizeof ds);
  submit(ds, 200, 4, 3, job, sizeof job);
  json_t *s1 = wait_for(t, "AttemptStarted", job, 1, 300000);
  cr_assert_str_eq(lt_test_rs(s1, "worker_id"), "w1");
  /* A second worker joins the dispatch group while w1 can still take part in the rebalance. */
  spawn("w2", "worker", NULL);
  wait_owns_partitions(t, "w2");
  wait_for(t, "CheckpointCommitted", job, 1, 300000);
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0 && !lt_test_pid_dead(ex), "w1's executor is not running");
  cr_assert(!first(t, "JobCompleted", job, 0), "the job ended before the partition: make it longer");

  kill(proxy_pid, SIGUSR1);
  int64_t cut_at = lt_time_wall_ms(), dead_at = 0;
  while (lt_time_wall_ms() - cut_at < 120000) {
    if (lt_test_pid_dead(ex)) {
      dead_at = lt_time_wall_ms();
      break;
    }
    lt_test_msleep(20);
  }
  cr_assert(dead_at, "the partitioned worker's executor still runs 120 s after the cut");
  /* Two guards see a partition: the lease that cannot be renewed, and a checkpoint commit that
   * cannot be recorded (the executor uploads beside training, so a commit may fall in the cut).
   * Either kills the attempt; what counts is that it happens before the lease could expire. */
  bool by_lease = lt_test_file_has(w1->log, "its lease could not be renewed");
  cr_assert(by_lease || lt_test_file_has(w1->log, "its checkpoint could not be recorded"),
            "the executor died, but not by one of the worker's guards:\n%s", lt_test_log_tail(w1->log));
  json_t *lost = wait_for(t, "AttemptStopped", job, 1, 120000);
  json_t *d2 = wait_for(t, "JobDispatched", job, 2, 120000);
  json_t *s2 = wait_for(t, "AttemptStarted", job, 2, 120000);
  cr_assert_str_eq(lt_test_rs(lost, "reason"), "lost");
  cr_assert_str_eq(lt_test_rs(s2, "worker_id"), "w2");
  cr_log_info("killed by the %s guard", by_lease ? "lease" : "commit");
  cr_log_info("cut at +0; executor dead at +%lld ms; lost at +%lld; attempt 2 dispatched at +%lld, started at +%lld",
              (long long)(dead_at - cut_at), (long long)(lt_test_ri(lost, "occurred_at") - cut_at),
              (long long)(lt_test_ri(d2, "occurred_at") - cut_at), (long long)(lt_test_ri(s2, "occurred_at") - cut_at));
  /* One live attempt: attempt 1's process was gone before attempt 2 existed. */
  cr_assert_lt(dead_at, lt_test_ri(lost, "occurred_at"));
  cr_assert_lt(dead_at, lt_test_ri(d2, "occurred_at"));
  cr_assert_lt(dead_at, lt_test_ri(s2, "occurred_at"));
  /* And before its lease (the last one renewed before the cut) could expire. */
  json_t *hbs = records(t, "WorkerHeartbeat", NULL, 0);
  int64_t lease_end = 0;
  size_t i;
  json_t *r;
  json_array_foreach(hbs, i, r) {
    if (!lt_test_rs(r, "worker_id") || strcmp(lt_test_rs(r, "worker_id"), "w1")) continue;
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
  cr_assert_eq(lt_test_ri(done, "attempt"), 2);
  lt_test_tail_close(t);
}

/* ================================================================ 7. confined executors */

/* A file of /proc/<pid>/ (NUL bytes, as in environ, read as spaces); caller frees. */
static char *proc_file(pid_t pid, const char *name, size_t *len) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
  size_t n = 0;
  char *s = lt_test_slurp(path, &n);
  cr_assert(s, "cannot read %s", path);
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\0') s[i] = ' ';
  if (len) *len = n;
  return s;
}

/* The first number of a line "Field:\t..." of /proc/<pid>/status. */
static long long proc_status(pid_t pid, const char *field, int base) {
  char *s = proc_file(pid, "status", NULL), pat[64];
  snprintf(pat, sizeof pat, "\n%s:", field);
  char *p = strstr(s, pat);
  cr_assert(p, "no %s in /proc/%d/status", field, (int)pid);
  long long v = strtoll(p + strlen(pat), NULL, base);
  free(s);
  return v;
}

/* The port of LATHE_KAFKA_BOOTSTRAP's first broker (host:port). */
static int broker_port(void) {
  const char *b = getenv("LATHE_KAFKA_BOOTSTRAP");
  const char *colon = b ? strrchr(b, ':') : NULL;
  cr_assert(colon, "LATHE_KAFKA_BOOTSTRAP is not host:port");
  return atoi(colon + 1);
}

/* In a child that joined the network namespace of pid (or stayed in ours, pid 0): connect() to
 * 127.0.0.1:port. 0 when it connected, else the errno. */
static int connect_from(pid_t pid, int port) {
  pid_t c = fork();
  cr_assert(c >= 0);
  if (c == 0) {
    if (pid > 0) {
      char path[64];
      snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
      int ns = open(path, O_RDONLY);
      if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) _exit(200);
    }
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    _exit(s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0 ? 0 : errno);
  }
  int st = 0;
  waitpid(c, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 200, "could not join the namespace of pid %d", (int)pid);
  return WEXITSTATUS(st);
}

/* The executor's pid once its worker logged it (0 after timeout_ms). */
static pid_t wait_executor(const lt_test_proc_t *w, const char *job, int attempt, int timeout_ms) {
  pid_t pid = 0;
  for (int64_t t0 = lt_time_mono_ms(); !pid && lt_time_mono_ms() - t0 < timeout_ms; lt_test_msleep(20)) {
    pid = executor_pid(w, job, attempt);
    lt_test_procs_check();
  }
  return pid;
}

Test(e2e, a_running_executor_holds_no_credential_privilege_network_or_other_descriptor) {
  lt_test_proc_t *w1;
  char ds[64], job[64];
  lt_test_tail_t *t = start_fleet(NULL, &w1, ds, sizeof ds);
  submit(ds, 3000, 50, 7, job, sizeof job);
  wait_for(t, "StepCompleted", job, 1, 300000);
  pid_t ex = executor_pid(w1, job, 1);
  cr_assert(ex > 0, "w1 logged no executor pid");
  cr_assert(!lt_test_pid_dead(ex), "the executor ended before it could be looked at: make the job longer");

  /* Its environment: none of the worker's secrets or servers. */
  char *env = proc_file(ex, "environ", NULL);
  const char *s3_secret = getenv("LATHE_S3_SECRET_KEY");
  cr_assert(!strstr(env, "LATHE_MASTER_KEY") && !strstr(env, MASTER_KEY), "the master key reached it: %s", env);
  cr_assert(!strstr(env, "LATHE_S3_") && !(s3_secret && *s3_secret && strstr(env, s3_secret)),
            "store credentials reached it: %s", env);
  cr_assert(!strstr(env, "LATHE_KAFKA_") && !strstr(env, "LATHE_TOPIC_PREFIX"), "the bus reached it: %s", env);
  cr_log_info("executor environment: %s", env);
  free(env);

  /* Its descriptors: its pipes, its inputs (memory files), its own files; no socket. */
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d/fd", (int)ex);
  DIR *d = opendir(dir);
  cr_assert(d, "cannot list %s", dir);
  struct dirent *e;
  int fds = 0;
  char list[2048] = "";
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char link[600], target[512] = "";
    snprintf(link, sizeof link, "%s/%s", dir, e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) continue; /* closed meanwhile */
    target[n] = '\0';
    fds++;
    size_t used = strlen(list);
    snprintf(list + used, sizeof list - used, " %s->%s", e->d_name, target);
    cr_assert(strncmp(target, "socket:", 7) != 0, "descriptor %s is a socket: %s", e->d_name, list);
    /* Its stderr is its worker's (the worker's log): a diagnostic channel, holding no secret. */
    char wlink[64], werr[512] = "";
    snprintf(wlink, sizeof wlink, "/proc/%d/fd/2", (int)w1->pid);
    if (!strcmp(e->d_name, "2") && readlink(wlink, werr, sizeof werr - 1) > 0 && !strcmp(werr, target)) continue;
    bool ok = !strncmp(target, "pipe:", 5) || !strncmp(target, "/memfd:lathe-", 13) ||
              !strcmp(target, "/dev/null") || !strncmp(target, "/tmp/lathe-w1/", 14) ||
              !strncmp(target, models_dir, strlen(models_dir));
    cr_assert(ok, "descriptor %s is %s, which an executor has no business with:%s", e->d_name, target, list);
  }
  closedir(d);
  cr_log_info("executor descriptors (%d):%s", fds, list);
  cr_assert(strstr(list, " 3->/memfd:lathe-dataset"), "the dataset is not the memory file on 3:%s", list);

  /* Its credentials: no capability, no new privileges, a seccomp filter, not root. */
  cr_assert_eq(proc_status(ex, "CapEff", 16), 0, "the executor holds capabilities");
  cr_assert_eq(proc_status(ex, "CapPrm", 16), 0, "the executor holds permitted capabilities");
  cr_assert_eq(proc_status(ex, "NoNewPrivs", 10), 1);
  cr_assert_eq(proc_status(ex, "Seccomp", 10), 2, "no seccomp filter");
  if (geteuid() == 0) cr_assert_eq(proc_status(ex, "Uid", 10), 65534, "a root worker's executor is not nobody");
  cr_assert_eq(proc_status(ex, "Uid", 10) == 0, false, "the executor runs as root");

  /* Its network: a namespace of its own, from which the broker cannot be reached. */
  int port = broker_port();
  cr_assert_eq(connect_from(0, port), 0, "the broker's port %d is not reachable from the test itself", port);
  char mine[128] = "", its[128] = "", path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/net", (int)ex);
  cr_assert(readlink("/proc/self/ns/net", mine, sizeof mine - 1) > 0 && readlink(path, its, sizeof its - 1) > 0);
  cr_assert_str_neq(mine, its, "the executor shares the worker's network namespace");
  int why = connect_from(ex, port);
  cr_assert_neq(why, 0, "127.0.0.1:%d is reachable from the executor's network namespace", port);
  cr_log_info("connect() to the broker from the executor's namespace: %s", strerror(why));
  int status = cancel(job);
  cr_assert(status == 200 || status == 202, "cancel answered %d", status);
  wait_for(t, "CleanupDone", job, 1, 120000);
  lt_test_tail_close(t);
}

/* ================================================================ 8. nothing of a tenant left */

/* Occurrences of needle in [p, p + n). */
static int count_in(const char *p, size_t n, const char *needle) {
  int hits = 0;
  size_t k = strlen(needle);
  for (const char *q = p; n >= k && (q = memmem(q, n - (size_t)(q - p), needle, k)); q += k) hits++;
  return hits;
}

/* Occurrences of needle in the readable memory of pid (its /proc/<pid>/maps regions). */
static int memory_hits(pid_t pid, const char *needle, size_t *scanned) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
  FILE *maps = fopen(path, "r");
  snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
  int mem = open(path, O_RDONLY);
  cr_assert(maps && mem >= 0, "cannot read the memory of pid %d: %s", (int)pid, strerror(errno));
  char line[512];
  int hits = 0;
  size_t cap = 1 << 20;
  char *buf = malloc(cap + 256);
  *scanned = 0;
  while (fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 || perms[0] != 'r' || strstr(line, "[vvar]") ||
        strstr(line, "[vsyscall]"))
      continue;
    /* Chunks overlap by the needle's length less one; a match counts in the chunk it starts in. */
    size_t k = strlen(needle);
    for (unsigned long at = lo; at < hi; at += cap) {
      size_t want = hi - at < cap + k - 1 ? hi - at : cap + k - 1;
      ssize_t got = pread(mem, buf, want, (off_t)at);
      if (got <= 0) break;
      size_t own = (size_t)got < cap ? (size_t)got : cap;
      *scanned += own;
      for (const char *q = buf; (q = memmem(q, (size_t)got - (size_t)(q - buf), needle, k)) && q < buf + own; q++)
        hits++;
    }
  }
  free(buf);
  close(mem);
  fclose(maps);
  return hits;
}

/* Occurrences of needle in every regular file under path (recursively; a missing path: 0). */
static int file_hits(const char *path, const char *needle, int *files) {
  struct stat st;
  if (lstat(path, &st) != 0) return 0;
  if (S_ISREG(st.st_mode)) {
    size_t n = 0;
    char *s = lt_test_slurp(path, &n);
    int hits = s ? count_in(s, n, needle) : 0;
    (*files)++;
    if (hits) cr_log_error("%d canary hit(s) in %s", hits, path);
    free(s);
    return hits;
  }
  if (!S_ISDIR(st.st_mode)) return 0;
  DIR *d = opendir(path);
  struct dirent *e;
  int hits = 0;
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
    hits += file_hits(sub, needle, files);
  }
  if (d) closedir(d);
  return hits;
}

/* The entries of dir whose names begin with start, counted; each also scanned for needle. */
static int leftovers(const char *dir, const char *start, const char *needle, int *hits, int *files) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, start, strlen(start)) != 0) continue;
    char sub[1200];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    cr_log_error("left behind: %s", sub);
    *hits += file_hits(sub, needle, files);
    n++;
  }
  if (d) closedir(d);
  return n;
}

/* Uploads the first 400 examples with the canary at the start of every prompt; the id into id. */
static void upload_canary_dataset(const char *canary, char *id, size_t n) {
  char path[1200];
  snprintf(path, sizeof path, "%s/%s/task_train.jsonl", models_dir, MODEL);
  size_t len;
  char *data = lt_test_slurp(path, &len);
  cr_assert(data, "no %s", path);
  size_t cap = len * 2 + 400 * 64, used = 0;
  char *out = malloc(cap);
  char *line = data;
  for (int lines = 0; line && *line && lines < 400; lines++) {
    char *nl = strchr(line, '\n');
    json_t *j = json_loadb(line, nl ? (size_t)(nl - line) : strlen(line), 0, NULL);
    cr_assert(j, "task_train.jsonl line %d is not JSON", lines + 1);
    char *prompt = NULL;
    cr_assert(asprintf(&prompt, "%s %s", canary, json_string_value(json_object_get(j, "prompt"))) > 0);
    json_object_set_new(j, "prompt", json_string(prompt));
    char *text = json_dumps(j, JSON_COMPACT);
    used += (size_t)snprintf(out + used, cap - used, "%s\n", text);
    free(text);
    free(prompt);
    json_decref(j);
    line = nl ? nl + 1 : NULL;
  }
  free(data);
  lt_client_resp_t r = req("POST", "/v1/datasets?name=canary", out, used);
  free(out);
  cr_assert_eq(r.status, 201, "upload: %d %s", r.status, r.body);
  snprintf(id, n, "%s", json_string_value(json_object_get(r.json, "id")));
  lt_client_resp_free(&r);
}

/* Kills attempt `attempt` of job at a point chosen by how: 0 during its start (the input fetch or
 * the first steps), 1 right after a checkpoint step (its upload in flight), 2 at a random moment
 * of training. Returns the pid killed. */
static pid_t kill_attempt_at(lt_test_tail_t *t, lt_test_proc_t *w, const char *job, int attempt, int how,
                             int interval) {
  unsigned r = 0;
  lt_crypto_random(&r, sizeof r);
  if (how == 0) {
    wait_for(t, "AttemptStarted", job, attempt, 300000);
    lt_test_msleep((int)(r % 400));
  } else {
    wait_for(t, "CheckpointCommitted", job, attempt, 300000);
    if (how == 2) lt_test_msleep((int)(r % 1500));
  }
  pid_t pid = wait_executor(w, job, attempt, 120000);
  cr_assert(pid > 0, "no executor for attempt %d", attempt);
  if (how == 1) {
    /* The next checkpoint step: the worker starts uploading as soon as the executor sealed it. */
    json_int_t seen = 0;
    for (int64_t t0 = lt_time_mono_ms(); lt_time_mono_ms() - t0 < 60000; lt_test_tail_poll(t, 5)) {
      json_t *steps = records(t, "StepCompleted", job, attempt);
      size_t ns = json_array_size(steps);
      json_int_t last = ns ? lt_test_ri(json_array_get(steps, ns - 1), "step") : 0;
      json_decref(steps);
      if (!seen) seen = last;
      if (last > seen && last % interval == 0) break;
    }
  }
  kill(pid, SIGKILL);
  return pid;
}

Test(e2e, a_tenants_canary_is_nowhere_after_its_attempts_are_killed_at_random_points) {
  lt_test_proc_t *w1;
  char ds[64], canary_ds[64], job[64], later[64], canary[64], rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_test_tail_t *t = start_fleet(NULL, &w1, ds, sizeof ds);
  lt_crypto_random_id(rnd);
  snprintf(canary, sizeof canary, "CANARY%sZ", rnd);
  upload_canary_dataset(canary, canary_ds, sizeof canary_ds);
  const int interval = 2;
  submit(canary_ds, 5000, interval, 11, job, sizeof job);

  /* The scan finds the canary where it must be: in the memory of the attempt that trains on it. */
  wait_for(t, "StepCompleted", job, 1, 300000);
  pid_t first = executor_pid(w1, job, 1);
  size_t scanned = 0;
  int live_hits = memory_hits(first, canary, &scanned);
  cr_assert_gt(live_hits, 0, "the scan finds no canary in the executor that trains on it (%zu bytes scanned)",
               scanned);
  cr_log_info("control: %d canary hits in the memory of the executor training on it", live_hits);

  /* Every attempt (max_attempts: 3) killed: after a step, just after a checkpoint (its upload
   * in flight), and during its start. */
  kill_attempt_at(t, w1, job, 1, 2, interval);
  kill_attempt_at(t, w1, job, 2, 1, interval);
  kill_attempt_at(t, w1, job, 3, 0, interval);
  cr_assert_str_eq(wait_terminal(job, 300000), "FAILED");
  json_t *clean = wait_for(t, "CleanupDone", job, 3, 120000);
  cr_log_info("attempt 3's cleanup zeroed %lld bytes", (long long)lt_test_ri(clean, "host_bytes_zeroed"));

  /* A later attempt of another job on the same worker. */
  submit(ds, 3000, 50, 12, later, sizeof later);
  wait_for(t, "StepCompleted", later, 1, 300000);
  pid_t next = executor_pid(w1, later, 1);
  cr_assert(next > 0 && !lt_test_pid_dead(next), "the later executor is not running");
  int hits = 0, files = 0, mem = memory_hits(next, canary, &scanned);
  cr_log_info("later executor (pid %d): %d canary hits in %zu bytes of memory", (int)next, mem, scanned);
  hits += mem;
  size_t wscanned = 0;
  int wmem = memory_hits(w1->pid, canary, &wscanned);
  cr_log_info("worker (pid %d): %d canary hits in %zu bytes of memory", (int)w1->pid, wmem, wscanned);
  hits += wmem;
  /* Files: no directory of the job's attempts is left, anywhere the worker writes; the later
   * job's directories and every log hold no canary. */
  char prefix_dirs[96];
  snprintf(prefix_dirs, sizeof prefix_dirs, "%s-", job);
  int left = leftovers("/tmp/lathe-w1", prefix_dirs, canary, &hits, &files) +
             leftovers("/dev/shm/lathe-w1", prefix_dirs, canary, &hits, &files);
  cr_assert_eq(left, 0, "the killed attempts left directories behind");
  char later_dirs[96];
  snprintf(later_dirs, sizeof later_dirs, "%s-", later);
  DIR *d = opendir("/tmp/lathe-w1");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    char sub[1200];
    snprintf(sub, sizeof sub, "/tmp/lathe-w1/%s", e->d_name);
    if (!strncmp(e->d_name, later_dirs, strlen(later_dirs))) hits += file_hits(sub, canary, &files);
  }
  if (d) closedir(d);
  hits += file_hits("/dev/shm", canary, &files);
  hits += file_hits(tmp_dir, canary, &files); /* every daemon's log */
  /* Records: every payload of the test's topics, decoded. */
  lt_test_tail_settle(t, 1000);
  char *all = json_dumps(lt_test_tail_records(t), JSON_COMPACT);
  int rec_hits = count_in(all, strlen(all), canary);
  cr_log_info("%zu records, %zu bytes of them: %d canary hits", json_array_size(lt_test_tail_records(t)),
              strlen(all), rec_hits);
  hits += rec_hits;
  free(all);
  cr_log_info("canary hits: %d (%d files scanned)", hits, files);
  cr_assert_eq(hits, 0, "the canary of a killed job was found %d times", hits);
  /* The scans can outlast the API's idle timeout (120 s) on a loaded machine: a new connection. */
  lt_client_destroy(client);
  client = lt_test_client(api_url, api_key, 120);
  int status = cancel(later);
  cr_assert(status == 200 || status == 202, "cancel answered %d", status);
  wait_for(t, "CleanupDone", later, 1, 120000);
  lt_test_tail_close(t);
}

/* An executor that is not what it should be (what a bug in code that parses customer data could
 * turn one into): it names another tenant's staging keys in its checkpoint line. The worker
 * uploads only keys of the attempt's own prefix: it ends the attempt and stores nothing. */
Test(e2e, a_forged_checkpoint_naming_another_tenants_objects_is_refused_and_nothing_is_stored) {
  char script[700], keys[2048] = "", ds[64], job[64];
  static const char *const names[] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                      "metrics.json", "eval.json", "lathe_run.json", "samples.json"};
  for (size_t i = 0; i < 7; i++) {
    size_t used = strlen(keys);
    snprintf(keys + used, sizeof keys - used, "%s\"staging/victim-tenant/job-victim/1/2/%s\"", i ? "," : "", names[i]);
  }
  snprintf(script, sizeof script, "%s/forger.sh", tmp_dir);
  FILE *f = fopen(script, "w");
  cr_assert(f);
  fprintf(f,
          "#!/bin/sh\nread -r assignment\n"
          "echo '{\"type\":\"checkpoint\",\"step\":2,\"final\":false,\"trigger\":\"interval\",\"keys\":[%s],"
          "\"sha256\":\"00\",\"bytes\":1}'\nexec sleep 60\n",
          keys);
  fclose(f);
  chmod(script, 0755);
  setenv("LATHE_WORKER_EXECUTOR", script, 1);
  lt_test_proc_t *w1;
  lt_test_tail_t *t = start_fleet(NULL, &w1, ds, sizeof ds);
  unsetenv("LATHE_WORKER_EXECUTOR");
  submit(ds, 10, 2, 3, job, sizeof job);
  json_t *stopped = wait_for(t, "AttemptStopped", job, 1, 120000);
  cr_assert_str_eq(lt_test_rs(stopped, "reason"), "failed");
  cr_assert(strstr(lt_test_rs(stopped, "detail"), "outside its attempt"), "AttemptStopped says: %s",
            lt_test_rs(stopped, "detail"));
  cr_assert(!first(t, "CheckpointCommitted", job, 0), "a forged checkpoint was committed");
  cr_assert_eq(count_objects("staging/victim-tenant/"), 0, "something was stored under another tenant's prefix");
  lt_test_tail_close(t);
}
