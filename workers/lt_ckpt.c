/* lt_ckpt: checkpoint upload off the training thread (see lt_ckpt.h). */
#include "lt_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "lt_log.h"
#include "lt_sealed.h"

const char *const lt_ckpt_names[LT_CKPT_NAMES] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                                  "metrics.json", "eval.json", "lathe_run.json", "samples.json"};

struct lt_ckpt {
  lt_ckpt_conf_t conf;
  char prefix[512];
  char spool[3584];
  pthread_t thread;
  bool running;       /* a thread was started and not yet joined */
  atomic_int abort;   /* set by lt_ckpt_abort: the thread stops at its next write or wait */
  atomic_int ended;   /* set by the thread as its last act: lt_ckpt_busy() turns false */
  /* The upload in flight (written before the thread starts, read by it; its result after join). */
  int64_t step;
  bool final;
  char trigger[16];
  char keys[LT_CKPT_NAMES][LT_STORE_KEY_MAX + 1];
  lt_err_t err;
  char errstr[512];
  char buf[1 << 16]; /* the upload thread's read buffer, scrubbed after each file */
};

static void spool_path(const lt_ckpt_t *u, size_t i, char *out, size_t n) {
  snprintf(out, n, "%s/%s", u->spool, lt_ckpt_names[i]);
}

static void delete_stored(lt_ckpt_t *u, size_t count) {
  for (size_t i = 0; i < count; i++) lt_store_delete(u->conf.store, u->keys[i], NULL, 0);
}

/* The copy of one sealed object from copy_from into store, hashed as it goes. */
typedef struct copy_ctx {
  lt_ckpt_t *u;
  lt_store_writer_t *w;
  lt_crypto_sha256_t *h;
  char *errstr;
  size_t n;
} copy_ctx_t;

static lt_err_t copy_sink(void *ctx, const void *data, size_t len) {
  copy_ctx_t *c = ctx;
  if (atomic_load(&c->u->abort)) return lt_errf(c->errstr, c->n, LT_ERR_CANCELLED, "checkpoint upload aborted");
  lt_crypto_sha256_update(c->h, data, len);
  return lt_store_writer_write(c->w, data, len, c->errstr, c->n);
}

/* Copies object i (already sealed) into the store; its stored size into *bytes. */
static lt_err_t copy_object(lt_ckpt_t *u, size_t i, lt_crypto_sha256_t *h, uint64_t *bytes, char *errstr, size_t n) {
  copy_ctx_t c = {.u = u, .h = h, .errstr = errstr, .n = n};
  lt_err_t err = lt_store_writer_new(u->conf.store, u->keys[i], &c.w, errstr, n);
  if (err) return err;
  err = lt_store_get_stream(u->conf.copy_from, u->keys[i], copy_sink, &c, NULL, errstr, n);
  if (err) {
    lt_store_writer_abort(c.w);
    return err;
  }
  return lt_store_writer_commit(c.w, NULL, bytes, errstr, n);
}

/* Opens a spooled file: a regular file, never a link. */
static FILE *open_spooled(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  if (fd < 0) return NULL;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    errno = EINVAL;
    return NULL;
  }
  FILE *f = fdopen(fd, "rb");
  if (!f) close(fd);
  return f;
}

/* Seals and stores every file once (or copies every sealed object); on failure nothing of this
 * try stays in the store. */
static lt_err_t upload_once(lt_ckpt_t *u, lt_ckpt_done_t *d, char *errstr, size_t n) {
  lt_crypto_sha256_t *h = NULL;
  lt_err_t err = lt_crypto_sha256_new(&h);
  if (err) return err;
  size_t stored = 0;
  d->bytes = 0;
  char *buf = u->buf;
  for (size_t i = 0; i < LT_CKPT_NAMES && !err; i++) {
    if (u->conf.copy_from) {
      uint64_t object_bytes = 0;
      if (!(err = copy_object(u, i, h, &object_bytes, errstr, n))) {
        stored++;
        d->bytes += object_bytes;
      }
      continue;
    }
    char path[4096];
    spool_path(u, i, path, sizeof path);
    FILE *f = open_spooled(path);
    if (!f) {
      err = lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
      break;
    }
    lt_sealed_writer_t *w = NULL;
    err = lt_sealed_writer_new(u->conf.store, u->conf.dek, u->keys[i], &w, errstr, n);
    if (!err) lt_sealed_writer_hash(w, h);
    size_t got;
    while (!err && (got = fread(buf, 1, sizeof u->buf, f)) > 0) {
      if (atomic_load(&u->abort)) err = lt_errf(errstr, n, LT_ERR_CANCELLED, "checkpoint upload aborted");
      else err = lt_sealed_writer_write(w, buf, got, errstr, n);
    }
    OPENSSL_cleanse(buf, sizeof u->buf);
    fclose(f);
    uint64_t object_bytes = 0;
    if (!err) err = lt_sealed_writer_commit(w, NULL, NULL, &object_bytes, errstr, n);
    else lt_sealed_writer_abort(w);
    if (!err) {
      stored++;
      d->bytes += object_bytes;
    }
  }
  uint8_t sha[32];
  lt_crypto_sha256_final(h, sha);
  lt_crypto_sha256_destroy(h);
  if (err) {
    delete_stored(u, stored);
    return err;
  }
  lt_crypto_hex(sha, 32, d->sha256_hex);
  return LT_OK;
}

/* Removes the files in flight (with copy_from: the sealed objects in the executor's spool). */
static void remove_spooled(lt_ckpt_t *u) {
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    if (u->conf.copy_from) {
      if (u->keys[i][0]) lt_store_delete(u->conf.copy_from, u->keys[i], NULL, 0);
      continue;
    }
    char path[4096];
    spool_path(u, i, path, sizeof path);
    unlink(path);
  }
}

/* The upload thread: retries while the store is unavailable (the job goes on once it is back),
 * then reports. The spooled files are removed whatever happened. */
static void *upload_main(void *arg) {
  lt_ckpt_t *u = arg;
  lt_ckpt_done_t d = {.step = u->step, .final = u->final, .trigger = u->trigger};
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) d.keys[i] = u->keys[i];
  int64_t waited = 0, delay = 200;
  for (;;) {
    u->err = upload_once(u, &d, u->errstr, sizeof u->errstr);
    if (!u->err || !lt_store_err_retriable(u->err) || waited >= u->conf.retry_ms) break;
    lt_log_warn("worker", "%s: checkpoint upload failed at step %lld (%s); retrying in %lld ms", u->prefix,
                (long long)u->step, u->errstr, (long long)delay);
    if (!lt_store_retry_wait(&u->abort, &waited, &delay)) {
      u->err = lt_errf(u->errstr, sizeof u->errstr, LT_ERR_CANCELLED, "checkpoint upload aborted");
      break;
    }
  }
  if (!u->err && atomic_load(&u->abort)) {
    delete_stored(u, LT_CKPT_NAMES); /* stored, but its owner no longer wants it reported */
    u->err = lt_errf(u->errstr, sizeof u->errstr, LT_ERR_CANCELLED, "checkpoint upload aborted");
  }
  if (!u->err && u->conf.on_done) u->conf.on_done(u->conf.ctx, &d);
  remove_spooled(u);
  atomic_store(&u->ended, 1);
  if (u->conf.on_end) u->conf.on_end(u->conf.ctx);
  return NULL;
}

lt_err_t lt_ckpt_new(const lt_ckpt_conf_t *conf, lt_ckpt_t **out, char *errstr, size_t n) {
  *out = NULL;
  if (!conf->store || !conf->prefix || (!conf->copy_from && (!conf->dek || !conf->spool_dir)))
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "lt_ckpt_new: store, prefix and dek and spool_dir (or copy_from) are required");
  lt_ckpt_t *u = calloc(1, sizeof *u);
  if (!u) return LT_ERR_NOMEM;
  u->conf = *conf;
  if ((size_t)snprintf(u->prefix, sizeof u->prefix, "%s", conf->prefix) >= sizeof u->prefix ||
      (size_t)snprintf(u->spool, sizeof u->spool, "%s", conf->spool_dir ? conf->spool_dir : "") >= sizeof u->spool) {
    free(u);
    return lt_errf(errstr, n, LT_ERR_INVALID, "lt_ckpt_new: prefix or spool_dir too long");
  }
  u->conf.prefix = u->prefix;
  u->conf.spool_dir = u->spool;
  atomic_init(&u->abort, 0);
  atomic_init(&u->ended, 0);
  *out = u;
  return LT_OK;
}

lt_err_t lt_ckpt_flush(lt_ckpt_t *u, char *errstr, size_t n) {
  if (!u->running) return LT_OK;
  pthread_join(u->thread, NULL);
  u->running = false;
  if (u->err) return lt_errf(errstr, n, u->err, "checkpoint at step %lld: %s", (long long)u->step, u->errstr);
  return LT_OK;
}

lt_err_t lt_ckpt_submit(lt_ckpt_t *u, const char *dir, int64_t step, bool final, const char *trigger, char *errstr,
                        size_t n) {
  lt_err_t err = lt_ckpt_flush(u, errstr, n);
  if (err) return err;
  atomic_store(&u->abort, 0);
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", dir, lt_ckpt_names[i]);
    spool_path(u, i, to, sizeof to);
    if (!u->conf.copy_from && rename(from, to) != 0)
      return lt_errf(errstr, n, LT_ERR_IO, "checkpoint at step %lld: %s -> %s: %s", (long long)step, from, to,
                     strerror(errno));
    if ((size_t)snprintf(u->keys[i], sizeof u->keys[i], "%s%lld/%s", u->prefix, (long long)step, lt_ckpt_names[i]) >=
        sizeof u->keys[i])
      return lt_errf(errstr, n, LT_ERR_INVALID, "checkpoint at step %lld: object key too long", (long long)step);
  }
  u->step = step;
  u->final = final;
  snprintf(u->trigger, sizeof u->trigger, "%s", trigger ? trigger : (final ? "final" : "interval"));
  u->err = LT_OK;
  u->errstr[0] = '\0';
  atomic_store(&u->ended, 0);
  int rc = pthread_create(&u->thread, NULL, upload_main, u);
  if (rc != 0) return lt_errf(errstr, n, LT_ERR_IO, "checkpoint upload thread: %s", strerror(rc));
  u->running = true;
  return LT_OK;
}

bool lt_ckpt_busy(lt_ckpt_t *u) { return u->running && !atomic_load(&u->ended); }

void lt_ckpt_abort(lt_ckpt_t *u) {
  if (!u || !u->running) return;
  atomic_store(&u->abort, 1);
  pthread_join(u->thread, NULL);
  u->running = false;
}

void lt_ckpt_destroy(lt_ckpt_t *u) {
  if (!u) return;
  lt_ckpt_abort(u);
  if (!u->conf.copy_from) remove_spooled(u);
  free(u);
}
