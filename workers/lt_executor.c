/* lt_executor: one job attempt in its own process (`lathed --role executor`, spawned by the worker).
 *
 * Why a process: a job can be killed (SIGKILL at the kill deadline) without harming the worker or
 * its neighbours, and everything it held in memory dies with it (docs/DESIGN.md §7, §4.7). Base
 * weights are a read-only mmap of the model files, so every executor of a worker shares one copy
 * in the page cache.
 *
 * Why confined: it parses and trains on one tenant's data, so a bug in that code must reach
 * nothing else (docs/DESIGN.md §5a). Before it reads its assignment it confines itself as the
 * worker asked (lt_confine.h: no descriptors but its own, no network, no privileges, a seccomp
 * filter, rlimits). It holds no master key and no store or bus credentials: its environment has
 * none, the worker opened its datasets and resume state into memory files it inherited
 * (lt_xfer.h), and the one key it gets is its tenant's data key, to seal its checkpoints.
 *
 * It reads its assignment from stdin, runs the managed loop (lt_train.c) with its plaintext files
 * in a directory on a memory file system, and reports on stdout in the protocol of lt_proto.h;
 * checkpoints are sealed off the training thread (lt_ckpt.c) into a directory store on disk, from
 * which the worker uploads them. The executor never talks to Kafka or the object store. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "lt_ckpt.h"
#include "lt_log.h"
#include "lt_confine.h"
#include "lt_dp.h"
#include "lt_executor_int.h"
#include "lt_crypto.h"
#include "lt_proto.h"
#include "lt_store.h"
#include "lt_train.h"
#include "lt_worker.h"
#include "lt_worker_gang.h"

/* The highest descriptor an executor inherits: 0-2, then its inputs (lt_worker.c hands them on
 * 3-6: the datasets, the resume state, the base model's directory). Every other one is closed
 * before anything else. */
#define INPUT_FD_MAX (2 + LT_CONFINE_INPUTS)

/* The process-wide stop flags, set only by signal handlers. */
volatile sig_atomic_t lt_exec_stop_cancel, lt_exec_stop_preempt;
#define stop_cancel lt_exec_stop_cancel
#define stop_preempt lt_exec_stop_preempt

static void on_cancel(int sig) {
  (void)sig;
  stop_cancel = 1;
}

static void on_preempt(int sig) {
  (void)sig;
  stop_preempt = 1;
}


/* ---------------------------------------------------------------- the protocol's two channels */

/* What the worker reports on stdin (read by their own thread): the commits it recorded and, for a
 * session, its calls. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int64_t committed; /* the newest step committed */
  bool gone;         /* stdin ended: the worker will report nothing more */
  lt_exec_call_t *head, *tail; /* calls not yet taken, in order */
} acks = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false, NULL, NULL};

static void on_committed(lt_proto_msg_t *m) {
  pthread_mutex_lock(&acks.lock);
  if (m->committed.step > acks.committed) acks.committed = m->committed.step;
  pthread_cond_broadcast(&acks.cond);
  pthread_mutex_unlock(&acks.lock);
}

/* A session's call: queued whole (the message keeps its line's document). */
static void on_call(lt_proto_msg_t *m) {
  lt_exec_call_t *c = calloc(1, sizeof *c);
  if (!c) return; /* the worker's watchdog ends an attempt that stops answering */
  c->msg = *m;
  memset(m, 0, sizeof *m);
  pthread_mutex_lock(&acks.lock);
  if (acks.tail) acks.tail->next = c;
  else acks.head = c;
  acks.tail = c;
  pthread_cond_broadcast(&acks.cond);
  pthread_mutex_unlock(&acks.lock);
}

/* What the worker may say after the assignment; anything else is ignored. */
static void (*const stdin_handlers[LT_PROTO__COUNT])(lt_proto_msg_t *m) = {
    [LT_PROTO_COMMITTED] = on_committed,
    [LT_PROTO_CALL] = on_call,
};

static void *read_acks(void *arg) {
  (void)arg;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, stdin) > 0) {
    lt_proto_msg_t m;
    if (lt_proto_decode(line, &m, NULL, 0) == LT_OK && stdin_handlers[m.type]) stdin_handlers[m.type](&m);
    lt_proto_msg_release(&m);
    OPENSSL_cleanse(line, cap); /* a call's line holds the customer's data */
  }
  free(line);
  pthread_mutex_lock(&acks.lock);
  acks.gone = true;
  pthread_cond_broadcast(&acks.cond);
  pthread_mutex_unlock(&acks.lock);
  return NULL;
}

/* Waits on acks.cond (acks.lock held) for at most ms milliseconds. */
static void wait_acks(long ms) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += ms * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&acks.cond, &acks.lock, &until);
}

lt_exec_call_t *lt_exec_next_call(bool *gone) {
  pthread_mutex_lock(&acks.lock);
  while (!acks.head && !acks.gone && !stop_cancel && !stop_preempt) {
    wait_acks(50); /* the signal handlers only set flags: look again now and then */
  }
  /* A stop wins over the calls still queued: a client that pipelines keeps the queue full, and
   * serving it first ran into the kill deadline. The calls not taken are the next attempt's. */
  lt_exec_call_t *c = stop_cancel || stop_preempt ? NULL : acks.head;
  if (c) {
    acks.head = c->next;
    if (!acks.head) acks.tail = NULL;
  }
  *gone = acks.gone;
  pthread_mutex_unlock(&acks.lock);
  return c;
}

void lt_exec_call_free(lt_exec_call_t *c) {
  if (!c) return;
  lt_proto_msg_release(&c->msg);
  free(c);
}

/* The executor's one output channel, stdout, shared by the training thread and the checkpoint
 * upload thread: a line is written whole, and nothing follows the line that ends the attempt. */
static struct {
  pthread_mutex_t lock;
  bool closed;
} output = {PTHREAD_MUTEX_INITIALIZER, false};

void lt_exec_emit_line(const lt_proto_msg_t *m, bool last) {
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

static void emit(const lt_proto_msg_t *m) { lt_exec_emit_line(m, false); }
#define emit_line lt_exec_emit_line

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
  if (!err) x->submitted = step;
  return err;
}

/* Waits until the worker has recorded the commit of the checkpoint at step (0: none to wait
 * for). A cancel ends the wait when cancel_ends is set; an upload that failed, or a worker that is
 * gone, is an error. */
lt_err_t lt_exec_wait_committed(exec_t *x, int64_t step, bool cancel_ends, char *errstr, size_t n) {
  pthread_mutex_lock(&acks.lock);
  while (acks.committed < step && !acks.gone && !(cancel_ends && stop_cancel)) {
    if (!lt_ckpt_busy(x->ckpt)) {
      /* The sealing ended: failed, or its line is out and the worker is uploading it. */
      pthread_mutex_unlock(&acks.lock);
      lt_err_t err = lt_ckpt_flush(x->ckpt, errstr, n);
      if (err) return err;
      pthread_mutex_lock(&acks.lock);
    }
    wait_acks(20); /* the signal handlers only set flags: look again now and then */
  }
  bool gone = acks.committed < step && acks.gone && !(cancel_ends && stop_cancel);
  pthread_mutex_unlock(&acks.lock);
  if (gone)
    return lt_errf(errstr, n, LT_ERR_IO, "the worker stopped reporting commits before the checkpoint at step %lld",
                   (long long)step);
  return LT_OK;
}

/* Before each optimizer update: the newest checkpoint must be committed first. At any moment the
 * steps done since the newest commit are then at most one checkpoint interval, which is what a
 * crash may lose, while the upload overlaps the forward and backward passes of the step after
 * it. A cancel ends the wait (the run stops at its next micro-step). */
static lt_err_t before_update(void *ctx, char *errstr, size_t n) {
  exec_t *x = ctx;
  return lt_exec_wait_committed(x, x->awaited, true, errstr, n);
}

/* Reports the failure that ends the attempt; returns the exit status. */
static int fail(const char *fmt, const char *detail) {
  char reason[768];
  snprintf(reason, sizeof reason, fmt, detail);
  emit_line(&(lt_proto_msg_t){.type = LT_PROTO_ERROR, .error.reason = reason}, true);
  return 1;
}

/* ---------------------------------------------------------------- the attempt's phases */

/* Makes this process fit to hold customer data: confined as the worker asked (lt_confine.h), no
 * core dumps, and it dies with its worker. False (reported) when it cannot be. */
static bool setup_process(void) {
  /* A worker killed with SIGKILL (or crashed) must not leave an executor training a fenced
   * attempt and staging its checkpoints (invariant 2). */
  pid_t worker = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != worker) return false; /* the worker died before the line above */
  lt_confine_conf_t cc;
  char report[512], err[512];
  if (lt_confine_conf_from_executor_env(&cc, err, sizeof err) ||
      lt_confine_apply(&cc, INPUT_FD_MAX, report, sizeof report, err, sizeof err)) {
    fail("cannot confine the executor: %s", err);
    return false;
  }
  if (report[0])
    lt_log_warn("executor", "(pid %d) confinement not applied in full: %s", (int)getpid(), report);
  /* PR_SET_PDEATHSIG is cleared by a change of credentials: set it again. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != worker) return false;
  signal(SIGUSR1, on_cancel);
  signal(SIGTERM, on_cancel);
  signal(SIGUSR2, on_preempt);
  signal(SIGPIPE, SIG_IGN);
  return true;
}

/* The first line on stdin: what to run. The line holds the data key: cleansed once read. */
static lt_err_t read_assignment(lt_proto_msg_t *m, char *errstr, size_t n) {
  static char line[1 << 16];
  memset(m, 0, sizeof *m);
  if (!fgets(line, sizeof line, stdin)) return lt_errf(errstr, n, LT_ERR_INVALID, "no assignment on stdin");
  char err[640];
  lt_err_t e = lt_proto_decode(line, m, err, sizeof err);
  OPENSSL_cleanse(line, sizeof line);
  if (e == LT_ERR_CORRUPT) return lt_errf(errstr, n, e, "the assignment is not JSON: %s", err);
  if (e) return lt_errf(errstr, n, e, "%s", err);
  if (m->type != LT_PROTO_ASSIGNMENT)
    return lt_errf(errstr, n, LT_ERR_INVALID, "the first line is a \"%s\" message, not the assignment",
                   lt_proto_type_name(m->type));
  return LT_OK;
}

/* A read-only map of an input memory file (an empty file maps to an empty string). */
static lt_err_t map_input(int fd, const char *what, char **out, size_t *len, char *errstr, size_t n) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "the %s (descriptor %d): %s", what, fd, strerror(errno));
  *len = (size_t)st.st_size;
  if (*len == 0) {
    *out = NULL;
    return LT_OK;
  }
  void *p = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return lt_errf(errstr, n, LT_ERR_IO, "cannot map the %s: %s", what, strerror(errno));
  *out = p;
  return LT_OK;
}

/* Everything the run reads: the data key, the datasets and the state to resume from. */
static lt_err_t open_inputs(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  char err[512];
  lt_err_t e = strlen(a->key_hex) != 2 * sizeof key
                   ? lt_errf(err, sizeof err, LT_ERR_INVALID, "the data key is not %zu bytes", sizeof key)
                   : lt_crypto_unhex(a->key_hex, key, sizeof key, err, sizeof err);
  if (!e) e = lt_crypto_dek_import(&x->dek, a->tenant_id, a->key_id, key, err, sizeof err);
  OPENSSL_cleanse(key, sizeof key);
  OPENSSL_cleanse((char *)a->key_hex, strlen(a->key_hex));
  if (e) return lt_errf(errstr, n, LT_ERR_INVALID, "cannot open the tenant's data key: %s", err);
  if (a->train_fd >= 0 && (e = map_input(a->train_fd, "training dataset", &x->train, &x->train_len, errstr, n)))
    return e;
  if (a->valid_fd >= 0 && (e = map_input(a->valid_fd, "validation dataset", &x->valid, &x->valid_len, errstr, n)))
    return e;
  uint8_t d[32];
  lt_crypto_sha256(x->train ? x->train : "", x->train_len, d);
  lt_crypto_hex(d, 32, x->train_sha);
  /* The engine reads its state from a path: this process's own descriptor is one. */
  if (a->resume_fd >= 0) snprintf(x->resume_path, sizeof x->resume_path, "/proc/self/fd/%d", a->resume_fd);
  return LT_OK;
}

/* The checkpoint sealer (plaintext spooled in work_dir/upload, sealed into sealed_dir, which the
 * worker uploads from) and the reader of the worker's commits. */
static lt_err_t start_sealing(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  char prefix[512], spool[4200], err[512];
  snprintf(prefix, sizeof prefix, "staging/%s/%s/%lld/", a->tenant_id, a->job_id, (long long)a->attempt);
  snprintf(spool, sizeof spool, "%s/upload", a->work_dir);
  if (lt_store_dir_new(&x->sealed, a->sealed_dir, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot open the sealed checkpoint directory: %s", err);
  lt_ckpt_conf_t cc = {.store = x->sealed, .dek = x->dek, .prefix = prefix, .spool_dir = spool, .retry_ms = 0,
                       .on_done = on_uploaded};
  if (mkdir(spool, 0700) != 0 && errno != EEXIST)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot make the checkpoint spool directory: %s", strerror(errno));
  if (lt_ckpt_new(&cc, &x->ckpt, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_IO, "cannot prepare the checkpoint sealing: %s", err);
  pthread_t acks_thread;
  if (pthread_create(&acks_thread, NULL, read_acks, NULL) != 0)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot start the commit reader");
  pthread_detach(acks_thread); /* blocked on stdin until the process ends */
  return LT_OK;
}

/* Runs the managed loop and reports how it ended: stopped, done, or (returned) an error. */
static lt_err_t train_and_report(exec_t *x, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = x->asg;
  lt_train_conf_t tc = {.model_dir = a->model_dir, .base_model_name = a->spec.base_model,
                        .train = x->train ? x->train : "",
                        .train_len = x->train_len, .valid = x->valid, .valid_len = x->valid_len, .hp = a->spec.hp,
                        .threads = a->threads, .work_dir = a->work_dir, .backend = a->backend,
                        .device = a->device, /* the precision is the job's (hp.precision) */
                        .resume_state = x->resume_path[0] ? x->resume_path : NULL};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%s", x->train_sha);
  lt_train_hooks_t hooks = {.ctx = x, .should_stop = should_stop, .on_step = on_step, .on_eval = on_eval,
                            .on_checkpoint = on_checkpoint, .before_update = before_update};
  lt_train_result_t res;
  lt_err_t e = LT_OK;
  if (a->gang_world > 1) {
    /* The gang's connections, joined and verified by the worker: this process has no network. A
     * collective waits for the slowest rank, which may be evaluating or checkpointing (rank 0):
     * the bound is generous; a dead peer is seen at once, as a closed connection. */
    int fds[LT_WGANG_MAX_FDS];
    char token[LT_DP_MAX_TOKEN + 1];
    lt_dp_token(token, sizeof token, a->job_id, (int)a->attempt);
    for (int i = 0; i < a->gang_nfds && i < LT_WGANG_MAX_FDS; i++) fds[i] = a->gang_fd0 + i;
    lt_dp_conf_t dc = {.rank = a->gang_rank, .world = a->gang_world, .token = token, .timeout_ms = 30 * 60 * 1000};
    e = lt_dp_adopt(&dc, fds, a->gang_nfds, &tc.dp, errstr, n);
  }
  if (!e) e = lt_train_run(&tc, &hooks, &res, errstr, n);
  lt_dp_close(tc.dp);
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
  /* The preemption's or the final checkpoint must be committed before the attempt ends: sealed
   * here, then uploaded and recorded by the worker. */
  if ((e = lt_ckpt_flush(x->ckpt, errstr, n))) return e;
  if ((e = lt_exec_wait_committed(x, x->submitted, false, errstr, n))) return e;
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
  if (!e) e = start_sealing(&x, err, sizeof err);
  if (!e) e = m.assignment.spec.mode == LT_MODE_INTERACTIVE ? lt_exec_session(&x, err, sizeof err)
                                                             : train_and_report(&x, err, sizeof err);
  if (e) fail("%s", err);
  lt_ckpt_destroy(x.ckpt);
  /* The maps are of the worker's memory files, which it zeroes when the attempt ends. */
  if (x.train) munmap(x.train, x.train_len);
  if (x.valid) munmap(x.valid, x.valid_len);
  lt_store_destroy(x.sealed);
  lt_crypto_dek_destroy(x.dek);
  lt_proto_msg_release(&m);
  return e ? 1 : 0;
}
