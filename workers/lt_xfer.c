/* lt_xfer: an attempt's inputs fetched, opened and put into memory files (see lt_xfer.h). */
#include "lt_xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "lt_dataset.h"
#include "lt_log.h"
#include "lt_sealed.h"

struct lt_xfer {
  lt_store_t *store;
  const lt_crypto_kek_t *kek;
  char tenant[LT_CRYPTO_TENANT_MAX + 1];
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wrapped_len;
  char train[256], valid[256], resume[LT_STORE_KEY_MAX + 1];
  int notify_fd;
  int64_t retry_ms;
  atomic_int abort;
  pthread_t thread;
  /* Written by the thread, read after the join. */
  lt_xfer_inputs_t in;
  lt_err_t err;
  char errstr[640];
};

void lt_xfer_inputs_init(lt_xfer_inputs_t *in) {
  memset(in, 0, sizeof *in);
  in->train_fd = in->valid_fd = in->resume_fd = -1;
}

/* Zeroes a memory file in place (its pages are then freed with the last descriptor). */
static int64_t zero_memfd(int fd) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) return 0;
  void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return 0;
  OPENSSL_cleanse(p, (size_t)st.st_size);
  munmap(p, (size_t)st.st_size);
  return st.st_size;
}

int64_t lt_xfer_inputs_scrub(lt_xfer_inputs_t *in) {
  int64_t zeroed = 0;
  int *fds[] = {&in->train_fd, &in->valid_fd, &in->resume_fd};
  for (size_t i = 0; i < 3; i++) {
    zeroed += zero_memfd(*fds[i]);
    if (*fds[i] >= 0) close(*fds[i]);
    *fds[i] = -1;
  }
  OPENSSL_cleanse(in->key, sizeof in->key);
  in->bytes = 0;
  return zeroed;
}

/* Plaintext into a new memory file; the plaintext buffer is cleansed and freed either way. */
static lt_err_t to_memfd(const char *name, void *data, size_t len, int *fd_out, char *errstr, size_t n) {
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  lt_err_t err = LT_OK;
  if (fd < 0) err = lt_errf(errstr, n, LT_ERR_IO, "memfd_create: %s", strerror(errno));
  for (size_t off = 0; !err && off < len;) {
    ssize_t w = write(fd, (char *)data + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) err = lt_errf(errstr, n, LT_ERR_IO, "writing the %s memory file: %s", name, strerror(errno));
    else off += (size_t)w;
  }
  /* Its size is fixed from here: the executor cannot grow it (and make the worker's scrub zero
   * whatever size it set) nor shrink it under the scrub's mapping. */
  if (!err && fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    err = lt_errf(errstr, n, LT_ERR_IO, "sealing the %s memory file: %s", name, strerror(errno));
  OPENSSL_cleanse(data, len);
  free(data);
  if (err) {
    if (fd >= 0) close(fd);
    return err;
  }
  *fd_out = fd;
  return LT_OK;
}

/* A dataset's plaintext: its own data key (wrapped by the master key) opens it. */
static lt_err_t fetch_dataset(lt_xfer_t *x, const char *id, int *fd, char *errstr, size_t n) {
  char key[1024];
  void *wrapped = NULL, *data = NULL;
  size_t wlen = 0, len = 0;
  lt_crypto_dek_t *dek = NULL;
  lt_dataset_object_key(key, sizeof key, x->tenant, id, LT_DATASET_KEY);
  lt_err_t err = lt_store_get(x->store, key, LT_CRYPTO_WRAPPED_MAX, &wrapped, &wlen, NULL, errstr, n);
  if (!err) err = lt_crypto_dek_unwrap(x->kek, x->tenant, wrapped, wlen, &dek, errstr, n);
  free(wrapped);
  if (err) return err;
  lt_dataset_object_key(key, sizeof key, x->tenant, id, LT_DATASET_DATA);
  err = lt_sealed_get(x->store, dek, key, (size_t)1 << 32, &data, &len, errstr, n);
  lt_crypto_dek_destroy(dek);
  if (err) return err;
  x->in.bytes += len;
  return to_memfd("lathe-dataset", data, len, fd, errstr, n);
}

/* A failure to read `what`: the store's own code when it is one a retry may mend, else LT_ERR_IO. */
static lt_err_t read_failed(lt_xfer_t *x, lt_err_t e, const char *what, const char *err) {
  return lt_errf(x->errstr, sizeof x->errstr, lt_store_err_retriable(e) ? e : LT_ERR_IO, "cannot read %s: %s",
                 what, err);
}

static lt_err_t fetch_all(lt_xfer_t *x) {
  char err[512];
  lt_crypto_dek_t *dek = NULL;
  if (lt_crypto_dek_unwrap(x->kek, x->tenant, x->wrapped, x->wrapped_len, &dek, err, sizeof err))
    return lt_errf(x->errstr, sizeof x->errstr, LT_ERR_INVALID, "cannot open the tenant's data key: %s", err);
  lt_crypto_dek_export(dek, x->in.key);
  snprintf(x->in.key_id, sizeof x->in.key_id, "%s", lt_crypto_dek_key_id(dek));
  lt_err_t e = LT_OK;
  if (x->train[0] && (e = fetch_dataset(x, x->train, &x->in.train_fd, err, sizeof err)))
    e = read_failed(x, e, "the training dataset", err);
  else if (x->valid[0] && (e = fetch_dataset(x, x->valid, &x->in.valid_fd, err, sizeof err)))
    e = read_failed(x, e, "the validation dataset", err);
  else if (x->resume[0]) {
    void *state = NULL;
    size_t len = 0;
    e = lt_sealed_get(x->store, dek, x->resume, (size_t)1 << 34, &state, &len, err, sizeof err);
    if (!e) x->in.bytes += len, e = to_memfd("lathe-resume", state, len, &x->in.resume_fd, err, sizeof err);
    if (e) e = read_failed(x, e, "the checkpoint to resume from", err);
  }
  lt_crypto_dek_destroy(dek);
  return e;
}

static void *fetch_main(void *arg) {
  lt_xfer_t *x = arg;
  int64_t waited = 0, delay = 200;
  for (;;) {
    x->err = fetch_all(x);
    if (x->err) lt_xfer_inputs_scrub(&x->in); /* a retry starts from nothing */
    if (!x->err || !lt_store_err_retriable(x->err) || waited >= x->retry_ms) break;
    lt_log_warn("worker", "tenant %s: fetching an attempt's inputs failed (%s); retrying in %lld ms", x->tenant,
                x->errstr, (long long)delay);
    if (!lt_store_retry_wait(&x->abort, &waited, &delay)) break;
  }
  if (atomic_load(&x->abort)) {
    lt_xfer_inputs_scrub(&x->in);
    x->err = lt_errf(x->errstr, sizeof x->errstr, LT_ERR_CANCELLED, "the fetch of the inputs was aborted");
  }
  char one = 'f';
  while (write(x->notify_fd, &one, 1) < 0 && errno == EINTR) {
  }
  return NULL;
}

lt_err_t lt_xfer_start(const lt_xfer_conf_t *c, lt_xfer_t **out, char *errstr, size_t n) {
  *out = NULL;
  if (!c->store || !c->kek || !c->tenant_id || c->wrapped_key_len > LT_CRYPTO_WRAPPED_MAX)
    return lt_errf(errstr, n, LT_ERR_INVALID, "lt_xfer_start: store, kek, tenant and a key are required");
  lt_xfer_t *x = calloc(1, sizeof *x);
  if (!x) return LT_ERR_NOMEM;
  x->store = c->store;
  x->kek = c->kek;
  x->notify_fd = c->notify_fd;
  x->retry_ms = c->retry_ms;
  memcpy(x->wrapped, c->wrapped_key, c->wrapped_key_len);
  x->wrapped_len = c->wrapped_key_len;
  snprintf(x->tenant, sizeof x->tenant, "%s", c->tenant_id);
  snprintf(x->train, sizeof x->train, "%s", c->train_id ? c->train_id : "");
  snprintf(x->valid, sizeof x->valid, "%s", c->valid_id ? c->valid_id : "");
  snprintf(x->resume, sizeof x->resume, "%s", c->resume_key ? c->resume_key : "");
  lt_xfer_inputs_init(&x->in);
  int rc = pthread_create(&x->thread, NULL, fetch_main, x);
  if (rc != 0) {
    free(x);
    return lt_errf(errstr, n, LT_ERR_IO, "cannot start the input fetch: %s", strerror(rc));
  }
  *out = x;
  return LT_OK;
}

lt_err_t lt_xfer_finish(lt_xfer_t *x, lt_xfer_inputs_t *in, char *errstr, size_t n) {
  pthread_join(x->thread, NULL);
  lt_err_t err = x->err;
  if (err) {
    lt_errf(errstr, n, err, "%s", x->errstr);
    lt_xfer_inputs_init(in);
  } else {
    *in = x->in;
  }
  OPENSSL_cleanse(&x->in, sizeof x->in);
  free(x);
  return err;
}

void lt_xfer_abort(lt_xfer_t *x) {
  if (x) atomic_store(&x->abort, 1);
}

void lt_xfer_destroy(lt_xfer_t *x) {
  if (!x) return;
  lt_xfer_abort(x);
  pthread_join(x->thread, NULL);
  lt_xfer_inputs_scrub(&x->in);
  free(x);
}
