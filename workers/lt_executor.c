/* lt_executor: one job attempt in its own process (`lathed --role executor`, spawned by the worker).
 *
 * Why a process: a job can be killed (SIGKILL at the kill deadline) without harming the worker or
 * its neighbours, and everything it held in memory dies with it (docs/DESIGN.md §7, §4.7). Base
 * weights are a read-only mmap of the model files, so every executor of a worker shares one copy
 * in the page cache.
 *
 * Protocol with the worker (lt_worker.c):
 *   stdin   one JSON line, the assignment: {"job_id","tenant_id","attempt","spec":{..jobspec..},
 *           "model_dir","work_dir","threads","dataset":{"train":ID,"valid":ID|null},
 *           "tenant_key":{"key_id","wrapped_hex"},"resume_state_key":KEY|null}
 *           then one line per checkpoint the worker recorded: {"type":"committed","step"}
 *   stdout  JSON lines, one per event:
 *           {"type":"step",...lt_train_step_t...}      every optimizer step
 *           {"type":"eval",...lt_train_eval_t...}      at each evaluation
 *           {"type":"checkpoint","step","final","trigger","keys":[..],"sha256","bytes"}
 *                                                 uploaded and sealed (by the upload thread, so it
 *                                                 may follow later steps' lines; always before
 *                                                 "stopped" (preempt) and "done")
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
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>

#include "lt_ckpt.h"
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
  lt_ckpt_t *ckpt;  /* uploads checkpoints off the training thread */
  int64_t awaited;  /* the step of the newest interval checkpoint handed to it (0: none) */
} exec_t;

/* The commits the worker has recorded, as it reports them on stdin (read by their own thread). */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int64_t committed; /* the newest step committed */
  bool gone;         /* stdin ended: the worker will report nothing more */
} acks = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void *read_acks(void *arg) {
  (void)arg;
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    json_t *o = json_loads(line, 0, NULL);
    const char *type = json_string_value(json_object_get(o, "type"));
    if (type && strcmp(type, "committed") == 0) {
      json_int_t step = json_integer_value(json_object_get(o, "step"));
      pthread_mutex_lock(&acks.lock);
      if (step > acks.committed) acks.committed = step;
      pthread_cond_broadcast(&acks.cond);
      pthread_mutex_unlock(&acks.lock);
    }
    json_decref(o);
  }
  pthread_mutex_lock(&acks.lock);
  acks.gone = true;
  pthread_cond_broadcast(&acks.cond);
  pthread_mutex_unlock(&acks.lock);
  return NULL;
}

/* The executor's one output channel, stdout, shared by the training thread and the checkpoint
 * upload thread: a line is written whole, and nothing follows the line that ends the attempt. */
static struct {
  pthread_mutex_t lock;
  bool closed;
} output = {PTHREAD_MUTEX_INITIALIZER, false};

static void emit_line(json_t *o, bool last) {
  char *s = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
  json_decref(o);
  if (!s) return;
  pthread_mutex_lock(&output.lock);
  if (!output.closed) {
    fprintf(stdout, "%s\n", s);
    fflush(stdout);
    output.closed = last;
  }
  pthread_mutex_unlock(&output.lock);
  free(s);
}

static void emit(json_t *o) { emit_line(o, false); }

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

/* On the upload thread: the checkpoint is stored and sealed; the worker records
 * CheckpointCommitted only after this line. */
static void on_uploaded(void *ctx, const lt_ckpt_done_t *d) {
  (void)ctx;
  json_t *keys = json_array();
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) json_array_append_new(keys, json_string(d->keys[i]));
  emit(json_pack("{s:s,s:I,s:b,s:s,s:o,s:s,s:I}", "type", "checkpoint", "step", (json_int_t)d->step, "final",
                 d->final, "trigger", d->trigger, "keys", keys, "sha256", d->sha256_hex, "bytes",
                 (json_int_t)d->bytes));
}

/* The training loop wrote a checkpoint's files into dir: hand them to the upload thread, which
 * reports them once stored (the previous upload, if still going, is waited for first). */
static lt_err_t on_checkpoint(void *ctx, const char *dir, int64_t step, bool final, char *errstr, size_t n) {
  exec_t *x = ctx;
  const char *trigger = final ? "final" : stop_preempt ? "preempt" : "interval";
  lt_err_t err = lt_ckpt_submit(x->ckpt, dir, step, final, trigger, errstr, n);
  if (!err && !final) x->awaited = step;
  return err;
}

/* Before each optimizer update: the newest checkpoint must be committed first. At any moment the
 * steps done since the newest commit are then at most one checkpoint interval, which is what a
 * crash may lose, while the upload overlaps the forward and backward passes of the step after
 * it. A cancel ends the wait (the run stops at its next micro-step); an upload that failed, or a
 * worker that is gone, fails the run. */
static lt_err_t before_update(void *ctx, char *errstr, size_t n) {
  exec_t *x = ctx;
  pthread_mutex_lock(&acks.lock);
  while (acks.committed < x->awaited && !acks.gone && !stop_cancel) {
    if (!lt_ckpt_busy(x->ckpt)) {
      /* The upload ended: failed, or its line is out and the worker is recording it. */
      pthread_mutex_unlock(&acks.lock);
      lt_err_t err = lt_ckpt_flush(x->ckpt, errstr, n);
      if (err) return err;
      pthread_mutex_lock(&acks.lock);
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 20 * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&acks.cond, &acks.lock, &until);
  }
  bool gone = acks.committed < x->awaited && acks.gone && !stop_cancel;
  pthread_mutex_unlock(&acks.lock);
  if (gone)
    return lt_errf(errstr, n, LT_ERR_IO, "the worker stopped reporting commits before the checkpoint at step %lld",
                   (long long)x->awaited);
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
  emit_line(json_pack("{s:s,s:s}", "type", "error", "reason", reason), true);
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
  exec_t x = {0};
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
  char prefix[512], spool[4200];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/%lld/", tenant, job, (long long)attempt);
  snprintf(spool, sizeof spool, "%s/upload", work_dir);
  lt_ckpt_conf_t cc = {.store = store, .dek = dek, .prefix = prefix, .spool_dir = spool, .retry_ms = 120000,
                       .on_done = on_uploaded};
  if (mkdir(spool, 0700) != 0 && errno != EEXIST) {
    fail("cannot make the checkpoint spool directory: %s", strerror(errno));
    goto out;
  }
  if (lt_ckpt_new(&cc, &x.ckpt, err, sizeof err)) {
    fail("cannot prepare the checkpoint upload: %s", err);
    goto out;
  }
  lt_train_conf_t tc = {.model_dir = model_dir, .base_model_name = spec.base_model, .train = train,
                        .train_len = train_len, .valid = valid, .valid_len = valid_len, .hp = spec.hp,
                        .threads = (int)json_integer_value(json_object_get(a, "threads")), .work_dir = work_dir,
                        .resume_state = resume_path[0] ? resume_path : NULL};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%s", sha_hex);
  lt_train_hooks_t hooks = {.ctx = &x, .should_stop = should_stop, .on_step = on_step, .on_eval = on_eval,
                            .on_checkpoint = on_checkpoint, .before_update = before_update};
  pthread_t acks_thread;
  if (pthread_create(&acks_thread, NULL, read_acks, NULL) != 0) {
    fail("%s", "cannot start the commit reader");
    goto out;
  }
  pthread_detach(acks_thread); /* blocked on stdin until the process ends */
  lt_train_result_t res;
  if (lt_train_run(&tc, &hooks, &res, err, sizeof err)) {
    lt_ckpt_abort(x.ckpt);
    fail("%s", err);
    goto out;
  }
  if (res.stopped == LT_TRAIN_STOP_CANCEL) {
    /* Confirmed at once; a checkpoint still uploading is of no use to a cancelled job. */
    emit_line(json_pack("{s:s,s:s,s:I}", "type", "stopped", "why", "cancel", "step", (json_int_t)res.steps), true);
    lt_ckpt_free(x.ckpt);
    x.ckpt = NULL;
  } else if (lt_ckpt_flush(x.ckpt, err, sizeof err)) {
    /* The preemption's or the final checkpoint must be committed before the attempt ends. */
    fail("%s", err);
    goto out;
  } else if (res.stopped == LT_TRAIN_STOP_PREEMPT) {
    emit_line(json_pack("{s:s,s:s,s:I}", "type", "stopped", "why", "preempt", "step", (json_int_t)res.steps), true);
  } else {
    emit_line(json_pack("{s:s,s:I,s:s}", "type", "done", "step", (json_int_t)res.steps, "config_digest",
                        res.config_digest),
              true);
  }
  rc = 0;
out:
  lt_ckpt_free(x.ckpt);
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
