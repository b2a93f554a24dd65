/* lt_ckpt: checkpoints sealed and uploaded off the training thread. Against the S3 server of
 * ops/stack (LATHE_S3_*; the S3 cases FAIL when it is not reachable) and a directory store. What
 * must hold: every object stored sealed under its deterministic key and reported once with the
 * hash and size the commit record carries; commits in step order; a failure is never lost (the
 * next call returns it); an abort stops a retrying upload, reports nothing and leaves nothing.
 * And the other direction, lt_xfer (an attempt's inputs fetched before its executor starts): a
 * store that is not there is waited out within retry_ms, and an abort ends the wait. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_ckpt.h"
#include "lt_crypto.h"
#include "lt_sealed.h"
#include "lt_store.h"
#include "lt_test.h"
#include "lt_xfer.h"

static char err[1024];

typedef struct {
  int calls;
  int64_t steps[8];
  lt_ckpt_done_t last;
  char keys[LT_CKPT_NAMES][LT_STORE_KEY_MAX + 1];
  char trigger[16];
} seen_t;

static void on_done(void *ctx, const lt_ckpt_done_t *d) {
  seen_t *s = ctx;
  if (s->calls < 8) s->steps[s->calls] = d->step;
  s->calls++;
  s->last = *d;
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) snprintf(s->keys[i], sizeof s->keys[i], "%s", d->keys[i]);
  snprintf(s->trigger, sizeof s->trigger, "%s", d->trigger);
}

static void make_dir(char *path, size_t n, const char *what) {
  snprintf(path, n, "/tmp/lt-ckpt-%s-XXXXXX", what);
  cr_assert_not_null(mkdtemp(path));
}

/* The content of file i of checkpoint step: distinct per file and step, ~100 KiB for the state. */
static size_t content(size_t i, int64_t step, char **out) {
  size_t len = i == 2 ? 100000 + (size_t)step : 40 + i;
  char *b = malloc(len);
  for (size_t k = 0; k < len; k++) b[k] = (char)('a' + (k * 7 + i * 13 + (size_t)step) % 26);
  *out = b;
  return len;
}

static void write_checkpoint(const char *dir, int64_t step) {
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    char path[PATH_MAX], *b;
    size_t len = content(i, step, &b);
    snprintf(path, sizeof path, "%s/%s", dir, lt_ckpt_names[i]);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "%s", path);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    fclose(f);
    free(b);
  }
}

static int count_files(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s", dir);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static lt_store_t *open_s3(int max_attempts, const char *endpoint) {
  lt_store_s3_conf_t c;
  if (lt_store_s3_conf_from_env(&c, err, sizeof err) != LT_OK)
    cr_assert_fail("needs the object store of ops/stack (eval \"$(ops/stack env)\"): %s", err);
  c.max_attempts = max_attempts;
  c.backoff_ms = 20;
  if (endpoint) c.endpoint = endpoint;
  lt_store_t *s = NULL;
  cr_assert_eq(lt_store_s3_new(&s, &c, err, sizeof err), LT_OK, "%s", err);
  return s;
}

static lt_crypto_dek_t *dek(void) {
  lt_crypto_dek_t *k = NULL;
  cr_assert_eq(lt_crypto_dek_generate(&k, "acme", "k1", err, sizeof err), LT_OK, "%s", err);
  return k;
}

/* An uploader over store (NULL: a directory store in a fresh root) with a fresh work and spool
 * directory, reporting into f->seen. */
typedef struct {
  char root[64], work[64], spool[64];
  lt_store_t *store;
  lt_crypto_dek_t *dek;
  lt_ckpt_t *u;
  seen_t seen;
} fix_t;

static void fix_open(fix_t *f, lt_store_t *store, const char *prefix, int64_t retry_ms) {
  memset(f, 0, sizeof *f);
  make_dir(f->work, sizeof f->work, "work");
  make_dir(f->spool, sizeof f->spool, "spool");
  if (!store) {
    make_dir(f->root, sizeof f->root, "root");
    cr_assert_eq(lt_store_dir_new(&store, f->root, err, sizeof err), LT_OK, "%s", err);
  }
  f->store = store;
  f->dek = dek();
  lt_ckpt_conf_t conf = {.store = store, .dek = f->dek, .prefix = prefix, .spool_dir = f->spool,
                         .retry_ms = retry_ms, .on_done = on_done, .ctx = &f->seen};
  cr_assert_eq(lt_ckpt_new(&conf, &f->u, err, sizeof err), LT_OK, "%s", err);
}

static void fix_close(fix_t *f) {
  lt_ckpt_destroy(f->u);
  lt_crypto_dek_destroy(f->dek);
  lt_store_destroy(f->store);
}

Test(ckpt, stores_every_object_sealed_and_reports_hash_and_size) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "staging/acme/job-ckpt-%d/2/", (int)getpid());
  fix_t f;
  fix_open(&f, open_s3(3, NULL), prefix, 0);
  write_checkpoint(f.work, 5);
  cr_assert_eq(lt_ckpt_submit(f.u, f.work, 5, false, "preempt", err, sizeof err), LT_OK, "%s", err);
  /* The loop's directory is free at once for the next checkpoint. */
  cr_assert_eq(count_files(f.work), 0, "the files must be moved out of the work directory");
  cr_assert_eq(lt_ckpt_flush(f.u, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(f.seen.calls, 1);
  cr_assert_eq(f.seen.last.step, 5);
  cr_assert_not(f.seen.last.final);
  cr_assert_str_eq(f.seen.trigger, "preempt");
  cr_assert_eq(count_files(f.spool), 0, "spooled files must be removed after the upload");

  lt_crypto_sha256_t *h = NULL;
  cr_assert_eq(lt_crypto_sha256_new(&h), LT_OK);
  uint64_t stored_bytes = 0;
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    char want_key[512];
    snprintf(want_key, sizeof want_key, "%s5/%s", prefix, lt_ckpt_names[i]);
    cr_assert_str_eq(f.seen.keys[i], want_key);
    char *want;
    size_t want_len = content(i, 5, &want);
    void *plain = NULL, *raw = NULL;
    size_t plain_len = 0, raw_len = 0;
    cr_assert_eq(lt_sealed_get(f.store, f.dek, want_key, 1 << 24, &plain, &plain_len, err, sizeof err), LT_OK, "%s",
                 err);
    cr_assert_eq(plain_len, want_len, "%s", want_key);
    cr_assert_eq(memcmp(plain, want, want_len), 0, "%s decrypts to what was written", want_key);
    cr_assert_eq(lt_store_get(f.store, want_key, 1 << 24, &raw, &raw_len, NULL, err, sizeof err), LT_OK, "%s", err);
    cr_assert(raw_len > want_len, "%s is stored sealed, not in the clear", want_key);
    cr_assert_null(memmem(raw, raw_len, want, want_len < 40 ? want_len : 40), "%s holds plaintext", want_key);
    lt_crypto_sha256_update(h, raw, raw_len);
    stored_bytes += raw_len;
    free(plain);
    free(raw);
    free(want);
    lt_store_delete(f.store, want_key, NULL, 0);
  }
  uint8_t sha[32];
  char hex[65];
  lt_crypto_sha256_final(h, sha);
  lt_crypto_sha256_destroy(h);
  cr_assert_str_eq(f.seen.last.sha256_hex, lt_crypto_hex(sha, 32, hex), "the hash covers the stored bytes in order");
  cr_assert_eq(f.seen.last.bytes, stored_bytes);
  fix_close(&f);
}

Test(ckpt, commits_come_in_step_order_one_upload_at_a_time) {
  fix_t f;
  fix_open(&f, NULL, "staging/acme/job-1/1/", 0);
  for (int64_t step = 1; step <= 4; step++) {
    write_checkpoint(f.work, step);
    cr_assert_eq(lt_ckpt_submit(f.u, f.work, step, step == 4, NULL, err, sizeof err), LT_OK, "%s", err);
  }
  cr_assert_eq(lt_ckpt_flush(f.u, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(f.seen.calls, 4);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(f.seen.steps[i], i + 1, "commit %d reported step %lld", i, (long long)f.seen.steps[i]);
  cr_assert(f.seen.last.final);
  cr_assert_str_eq(f.seen.trigger, "final");
  /* Each step's state holds that step's bytes: a later checkpoint never overwrote an earlier one in flight. */
  for (int64_t step = 1; step <= 4; step++) {
    char key[128], *want;
    snprintf(key, sizeof key, "staging/acme/job-1/1/%lld/state.bin", (long long)step);
    size_t want_len = content(2, step, &want);
    void *plain = NULL;
    size_t len = 0;
    cr_assert_eq(lt_sealed_get(f.store, f.dek, key, 1 << 24, &plain, &len, err, sizeof err), LT_OK, "%s", err);
    cr_assert(len == want_len && memcmp(plain, want, len) == 0, "%s holds step %lld's state", key, (long long)step);
    free(plain);
    free(want);
  }
  fix_close(&f);
}

Test(ckpt, a_failed_upload_is_returned_by_the_next_call_and_reports_nothing) {
  fix_t f;
  fix_open(&f, NULL, "staging/acme/job-2/1/", 60000);
  /* The store's root becomes a file: every put fails, and not in a way worth retrying. */
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && touch '%s'", f.root, f.root);
  cr_assert_eq(system(cmd), 0);
  write_checkpoint(f.work, 7);
  cr_assert_eq(lt_ckpt_submit(f.u, f.work, 7, false, NULL, err, sizeof err), LT_OK, "%s", err);
  write_checkpoint(f.work, 8);
  err[0] = '\0';
  lt_err_t e = lt_ckpt_submit(f.u, f.work, 8, false, NULL, err, sizeof err);
  cr_assert_neq(e, LT_OK, "the failure of step 7's upload must not be lost");
  cr_assert(strstr(err, "step 7"), "the message names the checkpoint: %s", err);
  cr_assert_eq(count_files(f.work), LT_CKPT_NAMES, "step 8 was not taken after the failure");
  cr_assert_eq(f.seen.calls, 0);
  cr_assert_eq(lt_ckpt_flush(f.u, err, sizeof err), LT_OK, "nothing is in flight any more");
  fix_close(&f);
  unlink(f.root);
}

Test(ckpt, a_missing_file_is_refused_naming_it) {
  fix_t f;
  fix_open(&f, NULL, "staging/acme/job-3/1/", 0);
  write_checkpoint(f.work, 1);
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/eval.json", f.work);
  unlink(path);
  cr_assert_eq(lt_ckpt_submit(f.u, f.work, 1, false, NULL, err, sizeof err), LT_ERR_IO);
  cr_assert(strstr(err, "eval.json"), "the message names the file: %s", err);
  cr_assert_eq(lt_ckpt_flush(f.u, err, sizeof err), LT_OK);
  cr_assert_eq(f.seen.calls, 0);
  fix_close(&f);
}

Test(ckpt, abort_stops_an_upload_that_retries_and_reports_nothing) {
  /* A port nobody listens on: every request fails as unavailable, the uploader keeps retrying. */
  fix_t f;
  fix_open(&f, open_s3(1, "127.0.0.1:1"), "staging/acme/job-4/1/", 600000);
  write_checkpoint(f.work, 3);
  cr_assert_eq(lt_ckpt_submit(f.u, f.work, 3, false, NULL, err, sizeof err), LT_OK, "%s", err);
  usleep(400000); /* let it fail and start retrying */
  lt_ckpt_abort(f.u); /* returns only once the thread stopped: a hang here is the test's timeout */
  cr_assert_eq(f.seen.calls, 0, "an aborted upload is never reported");
  cr_assert_eq(lt_ckpt_flush(f.u, err, sizeof err), LT_OK, "nothing is in flight after an abort");
  cr_assert_eq(count_files(f.spool), 0, "the spooled files are removed");
  fix_close(&f);
}

/* The worker's mode: an executor sealed a checkpoint into a directory store (the executor's
 * mode, above); the worker copies those objects byte for byte into the real store, gets the same
 * hash and size the executor reported, and leaves nothing in the executor's directory. */
Test(ckpt, copy_mode_uploads_the_sealed_objects_unchanged_and_empties_the_sealed_directory) {
  char prefix[128];
  snprintf(prefix, sizeof prefix, "staging/acme/job-copy-%d/1/", (int)getpid());
  fix_t sealer;
  fix_open(&sealer, NULL, prefix, 0); /* the executor: seals into a directory store */
  write_checkpoint(sealer.work, 8);
  cr_assert_eq(lt_ckpt_submit(sealer.u, sealer.work, 8, true, "final", err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_ckpt_flush(sealer.u, err, sizeof err), LT_OK, "%s", err);

  lt_store_t *s3 = open_s3(3, NULL);
  seen_t up = {0};
  lt_ckpt_conf_t conf = {.store = s3, .copy_from = sealer.store, .prefix = prefix, .retry_ms = 0,
                         .on_done = on_done, .ctx = &up};
  lt_ckpt_t *u = NULL;
  cr_assert_eq(lt_ckpt_new(&conf, &u, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_ckpt_submit(u, "", 8, true, "final", err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_ckpt_flush(u, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(up.calls, 1);
  cr_assert_str_eq(up.last.sha256_hex, sealer.seen.last.sha256_hex, "the copy is not the sealed bytes");
  cr_assert_eq(up.last.bytes, sealer.seen.last.bytes);
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    void *plain = NULL;
    size_t len = 0;
    char *want;
    size_t want_len = content(i, 8, &want);
    cr_assert_eq(lt_sealed_get(s3, sealer.dek, up.keys[i], 1 << 24, &plain, &len, err, sizeof err), LT_OK, "%s", err);
    cr_assert(len == want_len && memcmp(plain, want, len) == 0, "%s does not open to what was sealed", up.keys[i]);
    lt_store_info_t info;
    cr_assert_eq(lt_store_head(sealer.store, up.keys[i], &info, NULL, 0), LT_ERR_NOT_FOUND,
                 "%s is still in the sealed directory", up.keys[i]);
    free(plain);
    free(want);
    lt_store_delete(s3, up.keys[i], NULL, 0);
  }
  lt_ckpt_destroy(u);
  lt_store_destroy(s3);
  fix_close(&sealer);
}

/* ---- lt_xfer: the inputs fetched while the store is away ------------------------------------ */

/* A state sealed in the stack's store with a fresh tenant key, and that key wrapped by a master
 * key, as the worker finds them when an attempt resumes. */
typedef struct {
  lt_crypto_kek_t *kek;
  uint8_t wrapped[LT_CRYPTO_WRAPPED_MAX];
  size_t wrapped_len;
  char key[128];
  char *blob;
  size_t len;
  int notify[2];
} xfix_t;

static void xfix_open(xfix_t *f) {
  memset(f, 0, sizeof *f);
  cr_assert_eq(lt_crypto_kek_from_text(&f->kek, "m1", "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                                       err, sizeof err), LT_OK, "%s", err);
  lt_crypto_dek_t *k = dek();
  cr_assert_eq(lt_crypto_dek_wrap(f->kek, k, f->wrapped, sizeof f->wrapped, &f->wrapped_len, err, sizeof err), LT_OK);
  f->len = content(2, 5, &f->blob);
  snprintf(f->key, sizeof f->key, "staging/acme/xfer-%d/1/state.bin", (int)getpid());
  lt_store_t *s3 = open_s3(3, NULL);
  uint8_t sha[32];
  cr_assert_eq(lt_sealed_put(s3, k, f->key, f->blob, f->len, sha, err, sizeof err), LT_OK, "%s", err);
  lt_store_destroy(s3);
  lt_crypto_dek_destroy(k);
  cr_assert_eq(pipe(f->notify), 0);
}

static void xfix_close(xfix_t *f) {
  lt_store_t *s3 = open_s3(3, NULL);
  lt_store_delete(s3, f->key, NULL, 0);
  lt_store_destroy(s3);
  lt_crypto_kek_destroy(f->kek);
  free(f->blob);
  close(f->notify[0]);
  close(f->notify[1]);
}

static lt_xfer_t *xfer_start(xfix_t *f, lt_store_t *store, int64_t retry_ms) {
  lt_xfer_conf_t c = {.store = store, .kek = f->kek, .tenant_id = "acme", .wrapped_key = f->wrapped,
                      .wrapped_key_len = f->wrapped_len, .resume_key = f->key, .notify_fd = f->notify[1],
                      .retry_ms = retry_ms};
  lt_xfer_t *x = NULL;
  cr_assert_eq(lt_xfer_start(&c, &x, err, sizeof err), LT_OK, "%s", err);
  return x;
}

/* Waits for the fetch's 'f' (a fetch that never ends fails here, not by the suite's timeout). */
static void xfer_wait_end(xfix_t *f, int timeout_ms) {
  struct pollfd p = {.fd = f->notify[0], .events = POLLIN};
  cr_assert_eq(poll(&p, 1, timeout_ms), 1, "the fetch did not end within %d ms", timeout_ms);
  char c = 0;
  cr_assert_eq(read(f->notify[0], &c, 1), 1);
  cr_assert_eq(c, 'f');
}

/* The store is away when an attempt starts (connection refused: unavailable) and comes back
 * a second later: the fetch waits it out and hands over the state, byte for byte. Before, the
 * attempt failed at once, and an outage across three attempts failed the job. */
Test(ckpt, xfer_waits_out_a_store_that_is_away_and_hands_over_the_inputs) {
  xfix_t f;
  xfix_open(&f);
  int up = lt_test_local_port("LATHE_S3_ENDPOINT"), port = lt_test_free_port();
  char ep[32];
  snprintf(ep, sizeof ep, "127.0.0.1:%d", port);
  lt_store_t *away = open_s3(1, ep);
  lt_xfer_t *x = xfer_start(&f, away, 60000);
  usleep(1000000); /* it fails and retries meanwhile */
  struct pollfd p = {.fd = f.notify[0], .events = POLLIN};
  cr_assert_eq(poll(&p, 1, 0), 0, "the fetch gave up while the store was away");
  lt_test_relay_t *r = lt_test_relay_start(port, up);
  xfer_wait_end(&f, 30000);
  lt_xfer_inputs_t in;
  cr_assert_eq(lt_xfer_finish(x, &in, err, sizeof err), LT_OK, "%s", err);
  lt_test_relay_stop(r);
  cr_assert_eq(in.bytes, f.len);
  char *got = malloc(f.len);
  cr_assert_eq(pread(in.resume_fd, got, f.len, 0), (ssize_t)f.len);
  cr_assert(memcmp(got, f.blob, f.len) == 0, "the state is not what was sealed");
  free(got);
  lt_xfer_inputs_scrub(&in);
  lt_store_destroy(away);
  xfix_close(&f);
}

/* An attempt stopped while its fetch waits for the store: the wait ends at the abort, as
 * cancelled, with nothing handed over; and with no retry at all the failure says the store is
 * unavailable (the code the worker keeps) and names what it could not read. */
Test(ckpt, xfer_abort_ends_the_wait_and_no_retry_fails_as_unavailable) {
  xfix_t f;
  xfix_open(&f);
  lt_store_t *down = open_s3(1, "127.0.0.1:1");
  lt_xfer_t *x = xfer_start(&f, down, 600000);
  usleep(300000);
  lt_xfer_abort(x);
  xfer_wait_end(&f, 10000);
  lt_xfer_inputs_t in;
  cr_assert_eq(lt_xfer_finish(x, &in, err, sizeof err), LT_ERR_CANCELLED, "%s", err);
  cr_assert(in.resume_fd == -1 && in.bytes == 0, "an aborted fetch hands over nothing");

  x = xfer_start(&f, down, 0);
  xfer_wait_end(&f, 30000);
  cr_assert_eq(lt_xfer_finish(x, &in, err, sizeof err), LT_ERR_UNAVAILABLE, "%s", err);
  cr_assert(strstr(err, "the checkpoint to resume from"), "%s", err);
  lt_store_destroy(down);
  xfix_close(&f);
}
