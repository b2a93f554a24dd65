/* lt_executor: one job attempt in its own process (`lathed --role executor`, spawned by the worker).
 *
 * Why a process: a job can be killed (SIGKILL at the kill deadline) without harming the worker or
 * its neighbours, and everything it held in memory dies with it (DESIGN.md §7, §4.7). Base
 * weights are a read-only mmap of the model files, so every executor of a worker shares one copy
 * in the page cache.
 *
 * Protocol with the worker (lt_worker.c):
 *   stdin   one JSON line, the assignment: {"job_id","tenant_id","attempt","spec":{..jobspec..},
 *           "model_dir","work_dir","threads","dataset":{"train":ID,"valid":ID|null},
 *           "tenant_key":{"key_id","wrapped_hex"},"resume_state_key":KEY|null}
 *   stdout  JSON lines, one per event:
 *           {"type":"step",...lt_train_step_t...}      every optimizer step
 *           {"type":"eval",...lt_train_eval_t...}      at each evaluation
 *           {"type":"checkpoint","step","final","keys":[..],"sha256","bytes"}   uploaded, sealed
 *           {"type":"stopped","why":"cancel|preempt","step"}                    stopped on request
 *           {"type":"done","step","config_digest"}                              finished
 *           {"type":"error","reason"}                                           failed (exit 1)
 *   signals SIGUSR1 or SIGTERM: stop at the next micro-step boundary (cancel);
 *           SIGUSR2: checkpoint at the next step boundary, then stop (preempt).
 * The executor never talks to Kafka: the worker records what it reports. Customer text never
 * reaches stdout, only ids, hashes and metrics.
 *
 * Environment: the store (LATHE_S3_* or LATHE_STORE_DIR) and the master key, inherited. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "lt_crypto.h"
#include "lt_dataset.h"
#include "lt_jobspec.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_train.h"

/* The process-wide stop flags, set only by signal handlers. */
static volatile sig_atomic_t stop_cancel, stop_preempt;

static void on_cancel(int sig) {
  (void)sig;
  stop_cancel = 1;
}

static void on_preempt(int sig) {
  (void)sig;
  stop_preempt = 1;
}

typedef struct {
  lt_store_t *store;
  const lt_crypto_dek_t *dek;
  char prefix[512]; /* staging/<tenant>/<job>/<attempt>/ */
  int64_t upload_retry_ms;
} exec_t;

static void emit(json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
  json_decref(o);
  if (!s) return;
  fprintf(stdout, "%s\n", s);
  fflush(stdout);
  free(s);
}

static lt_train_stop_t should_stop(void *ctx) {
  (void)ctx;
  if (stop_cancel) return LT_TRAIN_STOP_CANCEL;
  if (stop_preempt) return LT_TRAIN_STOP_PREEMPT;
  return LT_TRAIN_GO;
}

static void on_step(void *ctx, const lt_train_step_t *st) {
  (void)ctx;
  emit(json_pack("{s:s,s:I,s:I,s:f,s:f,s:f,s:I,s:I,s:f,s:I,s:I,s:f}", "type", "step", "step", (json_int_t)st->step,
                 "total_steps", (json_int_t)st->total_steps, "loss", st->loss, "learning_rate", st->learning_rate,
                 "grad_norm", st->grad_norm, "tokens", (json_int_t)st->tokens, "tokens_total",
                 (json_int_t)st->tokens_total, "tokens_per_s", st->tokens_per_s, "elapsed_ms",
                 (json_int_t)st->elapsed_ms, "eta_ms", (json_int_t)st->eta_ms, "epoch", st->epoch));
}

static void on_eval(void *ctx, const lt_train_eval_t *e) {
  (void)ctx;
  emit(json_pack("{s:s,s:s,s:I,s:b,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "type", "eval", "config_digest",
                 e->config_digest, "step",
                 (json_int_t)e->step, "final", e->final, "examples", (json_int_t)e->examples, "val_loss", e->val_loss,
                 "perplexity", e->perplexity, "token_accuracy", e->token_accuracy, "exact_match", e->exact_match,
                 "exact_match_ci_low", e->em_ci_low, "exact_match_ci_high", e->em_ci_high, "base_val_loss",
                 e->base_val_loss, "base_perplexity", e->base_perplexity, "base_token_accuracy",
                 e->base_token_accuracy, "base_exact_match", e->base_exact_match));
}

/* The checkpoint's objects in the order the commit names them (the publisher relies on it). */
static const char *const ckpt_names[] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                         "metrics.json", "eval.json", "config.json", "samples.json"};

static lt_err_t upload_once(exec_t *x, const char *dir, int64_t step, json_t *keys, uint8_t sha[32], uint64_t *bytes,
                            char *errstr, size_t n) {
  lt_crypto_sha256_t *h = NULL;
  lt_err_t err = lt_crypto_sha256_new(&h);
  if (err) return err;
  *bytes = 0;
  json_array_clear(keys);
  for (size_t i = 0; i < sizeof ckpt_names / sizeof *ckpt_names && !err; i++) {
    char path[4096], key[1024];
    snprintf(path, sizeof path, "%s/%s", dir, ckpt_names[i]);
    snprintf(key, sizeof key, "%s%lld/%s", x->prefix, (long long)step, ckpt_names[i]);
    FILE *f = fopen(path, "rb");
    if (!f) {
      err = lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
      break;
    }
    lt_sealed_writer_t *w = NULL;
    err = lt_sealed_writer_new(x->store, x->dek, key, &w, errstr, n);
    if (!err) lt_sealed_writer_hash(w, h);
    char buf[1 << 16];
    size_t got;
    while (!err && (got = fread(buf, 1, sizeof buf, f)) > 0) err = lt_sealed_writer_write(w, buf, got, errstr, n);
    OPENSSL_cleanse(buf, sizeof buf);
    fclose(f);
    uint64_t plain = 0;
    if (!err) err = lt_sealed_writer_commit(w, NULL, &plain, errstr, n);
    else lt_sealed_writer_abort(w);
    json_array_append_new(keys, json_string(key));
  }
  if (!err) {
    lt_crypto_sha256_final(h, sha);
  }
  lt_crypto_sha256_free(h);
  return err;
}

/* Uploads a checkpoint, retrying while the store is unavailable (the job goes on once it is
 * back), then reports it. The worker records CheckpointCommitted only after this line. */
static lt_err_t on_checkpoint(void *ctx, const char *dir, int64_t step, bool final, char *errstr, size_t n) {
  exec_t *x = ctx;
  json_t *keys = json_array();
  uint8_t sha[32];
  uint64_t bytes = 0;
  lt_err_t err;
  int64_t waited = 0, delay = 200;
  for (;;) {
    err = upload_once(x, dir, step, keys, sha, &bytes, errstr, n);
    if (!err || !lt_store_err_retriable(err) || waited >= x->upload_retry_ms) break;
    fprintf(stderr, "executor: checkpoint upload failed (%s); retrying in %lld ms\n", errstr, (long long)delay);
    usleep((useconds_t)delay * 1000);
    waited += delay;
    delay = delay * 2 > 5000 ? 5000 : delay * 2;
  }
  if (err) {
    json_decref(keys);
    return err;
  }
  /* Size of the stored objects: the sum the commit record carries. */
  for (size_t i = 0; i < json_array_size(keys); i++) {
    lt_store_info_t info;
    if (lt_store_head(x->store, json_string_value(json_array_get(keys, i)), &info, NULL, 0) == LT_OK) bytes += info.size;
  }
  char hex[65];
  emit(json_pack("{s:s,s:I,s:b,s:o,s:s,s:I}", "type", "checkpoint", "step", (json_int_t)step, "final", final, "keys",
                 keys, "sha256", lt_crypto_hex(sha, 32, hex), "bytes", (json_int_t)bytes));
  return LT_OK;
}

/* A dataset's plaintext: its own data key (wrapped by the master key) opens it. */
static lt_err_t load_dataset(lt_store_t *store, const lt_crypto_kek_t *kek, const char *tenant, const char *id,
                             char **out, size_t *len, char sha_hex[65], char *errstr, size_t n) {
  char key[1024];
  void *wrapped = NULL;
  size_t wlen = 0;
  lt_crypto_dek_t *dek = NULL;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_KEY);
  lt_err_t err = lt_store_get(store, key, LT_CRYPTO_WRAPPED_MAX, &wrapped, &wlen, NULL, errstr, n);
  if (!err) err = lt_crypto_dek_unwrap(kek, tenant, wrapped, wlen, &dek, errstr, n);
  free(wrapped);
  if (err) return err;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_DATA);
  void *data = NULL;
  err = lt_sealed_get(store, dek, key, (size_t)1 << 32, &data, len, errstr, n);
  lt_crypto_dek_free(dek);
  if (err) return err;
  uint8_t d[32];
  lt_crypto_sha256(data, *len, d);
  lt_crypto_hex(d, 32, sha_hex);
  *out = data;
  return LT_OK;
}

static int fail(const char *fmt, const char *detail) {
  char reason[768];
  snprintf(reason, sizeof reason, fmt, detail);
  emit(json_pack("{s:s,s:s}", "type", "error", "reason", reason));
  return 1;
}

int lt_executor_main(void) {
  /* No core dumps: an executor's memory holds customer data. */
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);
  /* The attempt dies with its worker: a worker killed with SIGKILL (or crashed) must not leave an
   * executor training a fenced attempt and staging its checkpoints (invariant 2). */
  pid_t worker = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != worker) return 1; /* the worker died before the line above */
  signal(SIGUSR1, on_cancel);
  signal(SIGTERM, on_cancel);
  signal(SIGUSR2, on_preempt);
  signal(SIGPIPE, SIG_IGN);

  char line[1 << 16];
  if (!fgets(line, sizeof line, stdin)) return fail("%s", "no assignment on stdin");
  json_error_t je;
  json_t *a = json_loads(line, 0, &je);
  if (!a) return fail("the assignment is not JSON: %s", je.text);
  const char *tenant = json_string_value(json_object_get(a, "tenant_id"));
  const char *job = json_string_value(json_object_get(a, "job_id"));
  json_int_t attempt = json_integer_value(json_object_get(a, "attempt"));
  const char *model_dir = json_string_value(json_object_get(a, "model_dir"));
  const char *work_dir = json_string_value(json_object_get(a, "work_dir"));
  json_t *ds = json_object_get(a, "dataset");
  const char *train_id = json_string_value(json_object_get(ds, "train"));
  const char *valid_id = json_string_value(json_object_get(ds, "valid"));
  json_t *tk = json_object_get(a, "tenant_key");
  const char *wrapped_hex = json_string_value(json_object_get(tk, "wrapped_hex"));
  const char *resume_key = json_string_value(json_object_get(a, "resume_state_key"));
  if (!tenant || !job || attempt < 1 || !model_dir || !work_dir || !train_id || !wrapped_hex)
    return fail("%s", "the assignment lacks a field (job_id, tenant_id, attempt, model_dir, work_dir, dataset.train, "
                      "tenant_key.wrapped_hex)");
  lt_jobspec_t spec;
  char field[96], err[512];
  if (lt_jobspec_from_json(json_object_get(a, "spec"), &spec, field, sizeof field, err, sizeof err))
    return fail("the job spec is invalid: %s", err);

  lt_crypto_kek_t *kek = NULL;
  lt_crypto_dek_t *dek = NULL;
  lt_store_t *store = NULL;
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wlen = strlen(wrapped_hex) / 2;
  int rc = 1;
  char *train = NULL, *valid = NULL;
  size_t train_len = 0, valid_len = 0;
  char sha_hex[65], vsha[65];
  if (lt_crypto_kek_from_env(&kek, err, sizeof err) ||
      (wlen > sizeof wrapped ? lt_errf(err, sizeof err, LT_ERR_INVALID, "tenant key too long")
                             : lt_crypto_unhex(wrapped_hex, wrapped, wlen, err, sizeof err)) ||
      lt_crypto_dek_unwrap(kek, tenant, wrapped, wlen, &dek, err, sizeof err)) {
    fail("cannot open the tenant's data key: %s", err);
    goto out;
  }
  const char *dir = getenv("LATHE_STORE_DIR");
  lt_store_s3_conf_t s3;
  if (dir && *dir ? lt_store_dir_new(&store, dir, err, sizeof err)
                  : (lt_store_s3_conf_from_env(&s3, err, sizeof err) || lt_store_s3_new(&store, &s3, err, sizeof err))) {
    fail("cannot open the object store: %s", err);
    goto out;
  }
  if (load_dataset(store, kek, tenant, train_id, &train, &train_len, sha_hex, err, sizeof err)) {
    fail("cannot read the training dataset: %s", err);
    goto out;
  }
  if (valid_id && load_dataset(store, kek, tenant, valid_id, &valid, &valid_len, vsha, err, sizeof err)) {
    fail("cannot read the validation dataset: %s", err);
    goto out;
  }
  char resume_path[4200] = "";
  if (resume_key) {
    void *state = NULL;
    size_t slen = 0;
    if (lt_sealed_get(store, dek, resume_key, (size_t)1 << 34, &state, &slen, err, sizeof err)) {
      fail("cannot read the checkpoint to resume from: %s", err);
      goto out;
    }
    snprintf(resume_path, sizeof resume_path, "%s/resume.bin", work_dir);
    FILE *f = fopen(resume_path, "wb");
    bool ok = f && fwrite(state, 1, slen, f) == slen;
    if (f) ok = fclose(f) == 0 && ok;
    OPENSSL_cleanse(state, slen);
    free(state);
    if (!ok) {
      fail("cannot write the resume state: %s", strerror(errno));
      goto out;
    }
  }
  exec_t x = {.store = store, .dek = dek, .upload_retry_ms = 120000};
  snprintf(x.prefix, sizeof x.prefix, "staging/%s/%s/%lld/", tenant, job, (long long)attempt);
  lt_train_conf_t tc = {.model_dir = model_dir, .base_model_name = spec.base_model, .train = train,
                        .train_len = train_len, .valid = valid, .valid_len = valid_len, .hp = spec.hp,
                        .threads = (int)json_integer_value(json_object_get(a, "threads")), .work_dir = work_dir,
                        .resume_state = resume_path[0] ? resume_path : NULL};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%s", sha_hex);
  lt_train_hooks_t hooks = {.ctx = &x, .should_stop = should_stop, .on_step = on_step, .on_eval = on_eval,
                            .on_checkpoint = on_checkpoint};
  lt_train_result_t res;
  if (lt_train_run(&tc, &hooks, &res, err, sizeof err)) {
    fail("%s", err);
    goto out;
  }
  if (res.stopped != LT_TRAIN_GO)
    emit(json_pack("{s:s,s:s,s:I}", "type", "stopped", "why", res.stopped == LT_TRAIN_STOP_CANCEL ? "cancel" : "preempt",
                   "step", (json_int_t)res.steps));
  else
    emit(json_pack("{s:s,s:I,s:s}", "type", "done", "step", (json_int_t)res.steps, "config_digest", res.config_digest));
  rc = 0;
out:
  if (train) OPENSSL_cleanse(train, train_len);
  if (valid) OPENSSL_cleanse(valid, valid_len);
  free(train);
  free(valid);
  lt_store_free(store);
  lt_crypto_dek_free(dek);
  lt_crypto_kek_free(kek);
  json_decref(a);
  return rc;
}
