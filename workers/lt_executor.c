/* lt_executor: one job attempt in its own process (`lathed --role executor`, spawned by the worker).
 *
 * Why a process: a job can be killed (SIGKILL at the kill deadline) without harming the worker or
 * its neighbours, and everything it held in memory dies with it (docs/DESIGN.md §7, §4.7). Base
 * weights are a read-only mmap of the model files, so every executor of a worker shares one copy
 * in the page cache.
 *
 * It reads its assignment from stdin, runs the managed loop (lt_train.c), and reports on stdout
 * in the protocol of lt_proto.h; checkpoints are sealed and uploaded off the training thread
 * (lt_ckpt.c). The executor never talks to Kafka: the worker records what it reports.
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

#include <openssl/crypto.h>

#include "lt_ckpt.h"
#include "lt_crypto.h"
#include "lt_dataset.h"
#include "lt_proto.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_train.h"
#include "lt_worker.h"

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

/* One attempt's resources, from the assignment to the exit; also the training hooks' context. */
typedef struct {
  const lt_proto_assignment_t *asg;
  lt_crypto_kek_t *kek;
  lt_crypto_dek_t *dek;     /* the tenant's data key */
  lt_store_t *store;
  char *train, *valid;      /* the datasets' plaintext (valid may be NULL) */
  size_t train_len, valid_len;
  char train_sha[65];
  char resume_path[4200];   /* the state to resume from, written into work_dir; "" for none */
  lt_ckpt_t *ckpt;          /* uploads checkpoints off the training thread */
  int64_t awaited;          /* the step of the newest interval checkpoint handed to it (0: none) */
} exec_t;

/* ---------------------------------------------------------------- the protocol's two channels */

/* The commits the worker has recorded, as it reports them on stdin (read by their own thread). */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int64_t committed; /* the newest step committed */
  bool gone;         /* stdin ended: the worker will report nothing more */
} acks = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false};

static void on_committed(const lt_proto_msg_t *m) {
  pthread_mutex_lock(&acks.lock);
  if (m->committed.step > acks.committed) acks.committed = m->committed.step;
  pthread_cond_broadcast(&acks.cond);
  pthread_mutex_unlock(&acks.lock);
}

/* What the worker may say after the assignment; anything else is ignored. */
static void (*const stdin_handlers[LT_PROTO__COUNT])(const lt_proto_msg_t *m) = {
    [LT_PROTO_COMMITTED] = on_committed,
};

static void *read_acks(void *arg) {
  (void)arg;
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    lt_proto_msg_t m;
    if (lt_proto_decode(line, &m, NULL, 0) == LT_OK && stdin_handlers[m.type]) stdin_handlers[m.type](&m);
    lt_proto_msg_release(&m);
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

static void emit_line(const lt_proto_msg_t *m, bool last) {
  char *s;
  size_t len;
  if (lt_proto_encode(m, &s, &len)) return;
  pthread_mutex_lock(&output.lock);
  if (!output.closed) {
    fwrite(s, 1, len, stdout);
    fflush(stdout);
    output.closed = last;
  }
  pthread_mutex_unlock(&output.lock);
  free(s);
}

static void emit(const lt_proto_msg_t *m) { emit_line(m, false); }

/* ---------------------------------------------------------------- training hooks */

static lt_train_stop_t should_stop(void *ctx) {
  (void)ctx;
  if (stop_cancel) return LT_TRAIN_STOP_CANCEL;
  if (stop_preempt) return LT_TRAIN_STOP_PREEMPT;
  return LT_TRAIN_GO;
}

static void on_step(void *ctx, const lt_train_step_t *st) {
  (void)ctx;
  emit(&(lt_proto_msg_t){.type = LT_PROTO_STEP, .step = *st});
}

static void on_eval(void *ctx, const lt_train_eval_t *e) {
  (void)ctx;
  emit(&(lt_proto_msg_t){.type = LT_PROTO_EVAL, .eval = *e});
}

/* On the upload thread: the checkpoint is stored and sealed; the worker records
 * CheckpointCommitted only after this line. */
static void on_uploaded(void *ctx, const lt_ckpt_done_t *d) {
  (void)ctx;
  emit(&(lt_proto_msg_t){.type = LT_PROTO_CHECKPOINT, .checkpoint = *d});
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

/* Reports the failure that ends the attempt; returns the exit status. */
static int fail(const char *fmt, const char *detail) {
  char reason[768];
  snprintf(reason, sizeof reason, fmt, detail);
  emit_line(&(lt_proto_msg_t){.type = LT_PROTO_ERROR, .error.reason = reason}, true);
  return 1;
}

/* ---------------------------------------------------------------- the attempt's phases */

/* Makes this process fit to hold customer data: no core dumps, and it dies with its worker.
 * False when the worker is already gone. */
static bool setup_process(void) {
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);
  /* A worker killed with SIGKILL (or crashed) must not leave an executor training a fenced
   * attempt and staging its checkpoints (invariant 2). */
  pid_t worker = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != worker) return false; /* the worker died before the line above */
  signal(SIGUSR1, on_cancel);
  signal(SIGTERM, on_cancel);
  signal(SIGUSR2, on_preempt);
  signal(SIGPIPE, SIG_IGN);
  return true;
}

/* The first line on stdin: what to run. */
static lt_err_t read_assignment(lt_proto_msg_t *m, char *errstr, size_t n) {
  char line[1 << 16];
  memset(m, 0, sizeof *m);
  if (!fgets(line, sizeof line, stdin)) return lt_errf(errstr, n, LT_ERR_INVALID, "no assignment on stdin");
  char err[640];
  lt_err_t e = lt_proto_decode(line, m, err, sizeof err);
  if (e == LT_ERR_CORRUPT) return lt_errf(errstr, n, e, "the assignment is not JSON: %s", err);
  if (e) return lt_errf(errstr, n, e, "%s", err);
  if (m->type != LT_PROTO_ASSIGNMENT)
    return lt_errf(errstr, n, LT_ERR_INVALID, "the first line is a \"%s\" message, not the assignment",
                   lt_proto_type_name(m->type));
  return LT_OK;
}

/* The master key from the environment and the tenant's data key it unwraps. */
static lt_err_t open_keys(exec_t *x, char *errstr, size_t n) {
  const char *hex = x->asg->wrapped_hex;
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wlen = strlen(hex) / 2;
  char err[512];
  if (lt_crypto_kek_from_env(&x->kek, err, sizeof err) ||
      (wlen > sizeof wrapped ? lt_errf(err, sizeof err, LT_ERR_INVALID, "tenant key too long")
                             : lt_crypto_unhex(hex, wrapped, wlen, err, sizeof err)) ||
      lt_crypto_dek_unwrap(x->kek, x->asg->tenant_id, wrapped, wlen, &x->dek, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_INVALID, "cannot open the tenant's data key: %s", err);
  return LT_OK;
}

/* A dataset's plaintext: its own data key (wrapped by the master key) opens it. */
static lt_err_t load_dataset(const exec_t *x, const char *id, char **out, size_t *len, char sha_hex[65],
                             char *errstr, size_t n) {
  const char *tenant = x->asg->tenant_id;
  char key[1024];
  void *wrapped = NULL;
  size_t wlen = 0;
  lt_crypto_dek_t *dek = NULL;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_KEY);
  lt_err_t err = lt_store_get(x->store, key, LT_CRYPTO_WRAPPED_MAX, &wrapped, &wlen, NULL, errstr, n);
  if (!err) err = lt_crypto_dek_unwrap(x->kek, tenant, wrapped, wlen, &dek, errstr, n);
  free(wrapped);
  if (err) return err;
  lt_dataset_object_key(key, sizeof key, tenant, id, LT_DATASET_DATA);
  void *data = NULL;
  err = lt_sealed_get(x->store, dek, key, (size_t)1 << 32, &data, len, errstr, n);
  lt_crypto_dek_destroy(dek);
  if (err) return err;
  uint8_t d[32];
  lt_crypto_sha256(data, *len, d);
  lt_crypto_hex(d, 32, sha_hex);
  *out = data;
  return LT_OK;
}

/* The sealed state of the checkpoint to resume from, opened into work_dir/resume.bin. */
static lt_err_t fetch_resume_state(exec_t *x, char *errstr, size_t n) {
  void *state = NULL;
  size_t slen = 0;
  char err[512];
  if (lt_sealed_get(x->store, x->dek, x->asg->resume_state_key, (size_t)1 << 34, &state, &slen, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot read the checkpoint to resume from: %s", err);
  snprintf(x->resume_path, sizeof x->resume_path, "%s/resume.bin", x->asg->work_dir);
  FILE *f = fopen(x->resume_path, "wb");
  bool ok = f && fwrite(state, 1, slen, f) == slen;
  if (f) ok = fclose(f) == 0 && ok;
  OPENSSL_cleanse(state, slen);
  free(state);
  if (!ok) return lt_errf(errstr, n, LT_ERR_IO, "cannot write the resume state: %s", strerror(errno));
  return LT_OK;
}

/* Everything the run reads: keys, the store, the datasets and the state to resume from. */
static lt_err_t open_inputs(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  char err[512], vsha[65];
  lt_err_t e = open_keys(x, errstr, n);
  if (e) return e;
  const char *dir = getenv("LATHE_STORE_DIR");
  lt_store_s3_conf_t s3;
  if (dir && *dir ? lt_store_dir_new(&x->store, dir, err, sizeof err)
                  : (lt_store_s3_conf_from_env(&s3, err, sizeof err) ||
                     lt_store_s3_new(&x->store, &s3, err, sizeof err)))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot open the object store: %s", err);
  if (load_dataset(x, a->train_id, &x->train, &x->train_len, x->train_sha, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot read the training dataset: %s", err);
  if (a->valid_id && load_dataset(x, a->valid_id, &x->valid, &x->valid_len, vsha, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot read the validation dataset: %s", err);
  return a->resume_state_key ? fetch_resume_state(x, errstr, n) : LT_OK;
}

/* The checkpoint uploader, spooling in work_dir/upload, and the reader of the worker's commits. */
static lt_err_t start_uploads(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  char prefix[512], spool[4200], err[512];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/%lld/", a->tenant_id, a->job_id, (long long)a->attempt);
  snprintf(spool, sizeof spool, "%s/upload", a->work_dir);
  lt_ckpt_conf_t cc = {.store = x->store, .dek = x->dek, .prefix = prefix, .spool_dir = spool, .retry_ms = 120000,
                       .on_done = on_uploaded};
  if (mkdir(spool, 0700) != 0 && errno != EEXIST)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot make the checkpoint spool directory: %s", strerror(errno));
  if (lt_ckpt_new(&cc, &x->ckpt, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot prepare the checkpoint upload: %s", err);
  pthread_t acks_thread;
  if (pthread_create(&acks_thread, NULL, read_acks, NULL) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot start the commit reader");
  pthread_detach(acks_thread); /* blocked on stdin until the process ends */
  return LT_OK;
}

/* Runs the managed loop and reports how it ended: stopped, done, or (returned) an error. */
static lt_err_t train_and_report(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  lt_train_conf_t tc = {.model_dir = a->model_dir, .base_model_name = a->spec.base_model, .train = x->train,
                        .train_len = x->train_len, .valid = x->valid, .valid_len = x->valid_len, .hp = a->spec.hp,
                        .threads = a->threads, .work_dir = a->work_dir,
                        .resume_state = x->resume_path[0] ? x->resume_path : NULL};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%s", x->train_sha);
  lt_train_hooks_t hooks = {.ctx = x, .should_stop = should_stop, .on_step = on_step, .on_eval = on_eval,
                            .on_checkpoint = on_checkpoint, .before_update = before_update};
  lt_train_result_t res;
  lt_err_t e = lt_train_run(&tc, &hooks, &res, errstr, n);
  if (e) {
    lt_ckpt_abort(x->ckpt);
    return e;
  }
  if (res.stopped == LT_TRAIN_STOP_CANCEL) {
    /* Confirmed at once; a checkpoint still uploading is of no use to a cancelled job. */
    emit_line(&(lt_proto_msg_t){.type = LT_PROTO_STOPPED, .stopped = {LT_TRAIN_STOP_CANCEL, res.steps}}, true);
    lt_ckpt_destroy(x->ckpt);
    x->ckpt = NULL;
    return LT_OK;
  }
  /* The preemption's or the final checkpoint must be committed before the attempt ends. */
  if ((e = lt_ckpt_flush(x->ckpt, errstr, n))) return e;
  if (res.stopped == LT_TRAIN_STOP_PREEMPT)
    emit_line(&(lt_proto_msg_t){.type = LT_PROTO_STOPPED, .stopped = {LT_TRAIN_STOP_PREEMPT, res.steps}}, true);
  else
    emit_line(&(lt_proto_msg_t){.type = LT_PROTO_DONE, .done = {res.steps, res.config_digest}}, true);
  return LT_OK;
}

int lt_executor_main(void) {
  if (!setup_process()) return 1;
  lt_proto_msg_t m;
  char err[768];
  if (read_assignment(&m, err, sizeof err)) {
    lt_proto_msg_release(&m);
    return fail("%s", err);
  }
  exec_t x = {.asg = &m.assignment};
  lt_err_t e = open_inputs(&x, err, sizeof err);
  if (!e) e = start_uploads(&x, err, sizeof err);
  if (!e) e = train_and_report(&x, err, sizeof err);
  if (e) fail("%s", err);
  lt_ckpt_destroy(x.ckpt);
  if (x.train) OPENSSL_cleanse(x.train, x.train_len);
  if (x.valid) OPENSSL_cleanse(x.valid, x.valid_len);
  free(x.train);
  free(x.valid);
  lt_store_destroy(x.store);
  lt_crypto_dek_destroy(x.dek);
  lt_crypto_kek_destroy(x.kek);
  lt_proto_msg_release(&m);
  return e ? 1 : 0;
}
