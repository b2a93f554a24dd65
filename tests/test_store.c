/* lt_store: one contract suite run against both backends — the directory store in a temp
 * directory and the S3 store against the real server of ops/stack (LATHE_S3_* from
 * `eval "$(ops/stack env)"`; the S3 tests FAIL when it is not reachable). Plus what is particular
 * to each backend: path safety of the directory store, retries against a closed port, refused
 * credentials. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lt_crypto.h"
#include "lt_store.h"
#include "lt_test.h"

static char err[1024];

/* ---- backends ------------------------------------------------------------------------------- */

static char dir_root[PATH_MAX];

static lt_store_t *open_dir(void) {
  snprintf(dir_root, sizeof dir_root, "/tmp/lt-store-test-XXXXXX");
  cr_assert_not_null(mkdtemp(dir_root));
  lt_store_t *s = NULL;
  cr_assert_eq(lt_store_dir_new(&s, dir_root, err, sizeof err), LT_OK, "%s", err);
  cr_assert_str_eq(lt_store_kind(s), "dir");
  return s;
}

static lt_store_t *open_s3_conf(lt_store_s3_conf_t *c) {
  lt_store_t *s = NULL;
  cr_assert_eq(lt_store_s3_new(&s, c, err, sizeof err), LT_OK, "%s", err);
  return s;
}

static lt_err_t count_key(void *ctx, const char *key, const lt_store_info_t *info) {
  (void)key; (void)info;
  (*(int *)ctx)++;
  return LT_OK;
}

static lt_store_t *open_s3(void) {
  lt_store_s3_conf_t c;
  if (lt_store_s3_conf_from_env(&c, err, sizeof err) != LT_OK)
    cr_assert_fail("S3 integration test needs the object store of ops/stack: %s", err);
  c.max_attempts = 3;
  lt_store_t *s = open_s3_conf(&c);
  char next[LT_STORE_KEY_MAX + 1];
  int n = 0;
  lt_err_t e = lt_store_list(s, "no-such-prefix/", NULL, 1, count_key, &n, next, sizeof next, err,
                             sizeof err);
  if (e) cr_assert_fail("S3 store at %s (bucket %s) is not usable: %s — run ops/stack up", c.endpoint,
                  c.bucket, err);
  cr_assert_str_eq(lt_store_kind(s), "s3");
  return s;
}

/* Every test works under its own random prefix, so runs never see each other's keys. */
static void fresh_prefix(char *p, size_t n) {
  char id[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  cr_assert_eq(lt_crypto_random_id(id), LT_OK);
  snprintf(p, n, "test/%s/", id);
}

static char *k(const char *prefix, const char *rest) {
  static char buf[8][LT_STORE_KEY_MAX + 1];
  static int i;
  i = (i + 1) % 8;
  snprintf(buf[i], sizeof buf[i], "%s%s", prefix, rest);
  return buf[i];
}

static uint8_t *pattern(size_t n, unsigned seed) {
  uint8_t *p = malloc(n ? n : 1);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
  return p;
}

typedef void (*contract_fn)(lt_store_t *s, const char *prefix);

static void run_contract(lt_store_t *s, contract_fn fn) {
  char prefix[64];
  fresh_prefix(prefix, sizeof prefix);
  fn(s, prefix);
  lt_store_destroy(s);
}

/* Defines the same test for both backends. */
#define CONTRACT(name)                                                                           \
  static void name(lt_store_t *s, const char *prefix);                                          \
  Test(store_dir, name) { run_contract(open_dir(), name); }                                     \
  Test(store_s3, name, .timeout = 300) { run_contract(open_s3(), name); }                       \
  static void name(lt_store_t *s, const char *prefix)

/* ---- the contract --------------------------------------------------------------------------- */

static void expect_content(lt_store_t *s, const char *key, const uint8_t *want, size_t n) {
  void *got = NULL;
  size_t got_len = 0;
  uint8_t sha_get[32], sha_want[32];
  cr_assert_eq(lt_store_get(s, key, (size_t)1 << 30, &got, &got_len, sha_get, err, sizeof err),
               LT_OK, "get %s: %s", key, err);
  cr_assert_eq(got_len, n, "get %s: %zu bytes, put %zu", key, got_len, n);
  cr_assert(n == 0 || memcmp(got, want, n) == 0, "get %s: bytes differ", key);
  lt_crypto_sha256(want, n, sha_want);
  cr_assert(memcmp(sha_get, sha_want, 32) == 0, "get %s: content hash differs", key);
  free(got);
  lt_store_info_t info;
  cr_assert_eq(lt_store_head(s, key, &info, err, sizeof err), LT_OK, "head %s: %s", key, err);
  cr_assert_eq(info.size, n, "head %s: size %llu, put %zu", key, (unsigned long long)info.size, n);
}

CONTRACT(put_then_get_returns_identical_bytes_and_head_their_size) {
  size_t sizes[] = {0, 1, 1000, 1024 * 1024 + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    char name[32];
    snprintf(name, sizeof name, "obj-%zu", i);
    uint8_t *p = pattern(sizes[i], (unsigned)i), sha_put[32], sha[32];
    cr_assert_eq(lt_store_put(s, k(prefix, name), p, sizes[i], sha_put, err, sizeof err), LT_OK,
                 "%s", err);
    lt_crypto_sha256(p, sizes[i], sha);
    cr_assert(memcmp(sha, sha_put, 32) == 0, "put's content hash is wrong");
    expect_content(s, k(prefix, name), p, sizes[i]);
    lt_store_info_t info;
    cr_assert_eq(lt_store_head(s, k(prefix, name), &info, err, sizeof err), LT_OK);
    cr_assert(info.etag[0] != 0, "head gives an etag");
    cr_assert(info.mtime > time(NULL) - 3600 && info.mtime < time(NULL) + 3600, "mtime %lld",
              (long long)info.mtime);
    lt_store_delete(s, k(prefix, name), err, sizeof err);
    free(p);
  }
}

CONTRACT(overwrite_replaces_the_whole_object) {
  uint8_t *a = pattern(5000, 1), *b = pattern(300, 2);
  const char *key = k(prefix, "over");
  cr_assert_eq(lt_store_put(s, key, a, 5000, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_store_info_t i1, i2;
  cr_assert_eq(lt_store_head(s, key, &i1, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_put(s, key, b, 300, NULL, err, sizeof err), LT_OK, "%s", err);
  expect_content(s, key, b, 300);
  cr_assert_eq(lt_store_head(s, key, &i2, err, sizeof err), LT_OK);
  cr_assert_str_neq(i1.etag, i2.etag, "etag must change with the content");
  lt_store_delete(s, key, err, sizeof err);
  free(a); free(b);
}

CONTRACT(missing_key_is_not_found_and_delete_is_idempotent) {
  const char *key = k(prefix, "never-written");
  void *d;
  size_t n;
  lt_store_info_t info;
  cr_assert_eq(lt_store_get(s, key, 100, &d, &n, NULL, err, sizeof err), LT_ERR_NOT_FOUND, "%s",
               err);
  cr_assert(strstr(err, "never-written") != NULL, "message names the key: %s", err);
  cr_assert_eq(lt_store_head(s, key, &info, err, sizeof err), LT_ERR_NOT_FOUND);
  cr_assert_eq(lt_store_copy(s, key, k(prefix, "dst"), err, sizeof err), LT_ERR_NOT_FOUND, "%s",
               err);
  cr_assert_eq(lt_store_delete(s, key, err, sizeof err), LT_OK, "%s", err);

  cr_assert_eq(lt_store_put(s, key, "x", 1, NULL, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_delete(s, key, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_head(s, key, &info, err, sizeof err), LT_ERR_NOT_FOUND);
  cr_assert_eq(lt_store_delete(s, key, err, sizeof err), LT_OK, "second delete: %s", err);
}

struct collected {
  char keys[64][LT_STORE_KEY_MAX + 1];
  uint64_t sizes[64];
  int n;
};

static lt_err_t collect(void *ctx, const char *key, const lt_store_info_t *info) {
  struct collected *c = ctx;
  cr_assert_lt(c->n, 64);
  snprintf(c->keys[c->n], sizeof c->keys[0], "%s", key);
  c->sizes[c->n++] = info->size;
  return LT_OK;
}

static int list_all(lt_store_t *s, const char *prefix, size_t page, struct collected *c,
                    int *pages) {
  char start[LT_STORE_KEY_MAX + 1] = "", next[LT_STORE_KEY_MAX + 1];
  c->n = 0;
  *pages = 0;
  do {
    int before = c->n;
    cr_assert_eq(lt_store_list(s, prefix, start, page, collect, c, next, sizeof next, err,
                               sizeof err), LT_OK, "list %s: %s", prefix, err);
    cr_assert_leq((size_t)(c->n - before), page ? page : LT_STORE_LIST_MAX,
                  "a page holds at most max_keys");
    (*pages)++;
    cr_assert_lt(*pages, 50, "pagination does not end");
    snprintf(start, sizeof start, "%s", next);
  } while (start[0]);
  return c->n;
}

CONTRACT(list_by_prefix_pages_through_every_key_once_in_order) {
  for (int i = 0; i < 25; i++) {
    char name[32];
    snprintf(name, sizeof name, "a/%02d", i);
    cr_assert_eq(lt_store_put(s, k(prefix, name), name, strlen(name), NULL, err, sizeof err),
                 LT_OK, "%s", err);
  }
  cr_assert_eq(lt_store_put(s, k(prefix, "ab"), "ab", 2, NULL, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_put(s, k(prefix, "b/x"), "bx", 2, NULL, err, sizeof err), LT_OK);

  struct collected *c = calloc(1, sizeof *c);
  int pages;
  cr_assert_eq(list_all(s, k(prefix, "a/"), 10, c, &pages), 25);
  cr_assert_eq(pages, 3, "25 keys in pages of 10 take 3 pages, took %d", pages);
  for (int i = 0; i < 25; i++) {
    char name[32];
    snprintf(name, sizeof name, "a/%02d", i);
    cr_assert_str_eq(c->keys[i], k(prefix, name), "key %d out of order", i);
    cr_assert_eq(c->sizes[i], 4);
  }
  cr_assert_eq(list_all(s, k(prefix, "a"), 7, c, &pages), 26, "prefix 'a' also matches 'ab'");
  cr_assert_str_eq(c->keys[25], k(prefix, "ab"));
  cr_assert_eq(list_all(s, prefix, 1000, c, &pages), 27);
  cr_assert_eq(pages, 1);
  cr_assert_eq(list_all(s, k(prefix, "zzz"), 10, c, &pages), 0);

  cr_assert_eq(lt_store_delete(s, k(prefix, "a/13"), err, sizeof err), LT_OK);
  cr_assert_eq(list_all(s, k(prefix, "a/"), 10, c, &pages), 24, "a deleted key is not listed");
  for (int i = 0; i < 24; i++) cr_assert_str_neq(c->keys[i], k(prefix, "a/13"));
  cr_assert_eq(list_all(s, prefix, 0, c, &pages), 26);
  for (int i = 0; i < c->n; i++) lt_store_delete(s, c->keys[i], err, sizeof err);
  cr_assert_eq(list_all(s, prefix, 0, c, &pages), 0);
  free(c);
}

CONTRACT(delete_prefix_deletes_what_is_under_it_and_nothing_beside_it) {
  for (int i = 0; i < 12; i++) {
    char name[32];
    snprintf(name, sizeof name, "job-a/%d/%02d", i % 3, i);
    cr_assert_eq(lt_store_put(s, k(prefix, name), "x", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  }
  cr_assert_eq(lt_store_put(s, k(prefix, "job-ab/0"), "y", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  uint64_t deleted = 0;
  cr_assert_eq(lt_store_delete_prefix(s, k(prefix, "job-a/"), &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(deleted, 12, "deleted %llu of 12", (unsigned long long)deleted);
  struct collected *c = calloc(1, sizeof *c);
  int pages;
  cr_assert_eq(list_all(s, prefix, 0, c, &pages), 1, "only the neighbour with a longer name is left");
  cr_assert_str_eq(c->keys[0], k(prefix, "job-ab/0"));
  deleted = 0;
  cr_assert_eq(lt_store_delete_prefix(s, k(prefix, "job-a/"), &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(deleted, 0, "nothing left to delete: a second call deletes nothing");
  cr_assert_eq(lt_store_delete_prefix(s, "", &deleted, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "empty prefix") != NULL, "%s", err);
  cr_assert_eq(list_all(s, prefix, 0, c, &pages), 1, "the refused call deleted nothing");
  lt_store_delete(s, k(prefix, "job-ab/0"), err, sizeof err);
  free(c);
}

/* More keys than one list page holds: every page is deleted (the directory store: 1,000 puts
 * there take a moment, on S3 a minute). */
Test(store_dir, delete_prefix_goes_past_one_list_page) {
  lt_store_t *s = open_dir();
  int n = LT_STORE_LIST_MAX + 7;
  for (int i = 0; i < n; i++) {
    char key[64];
    snprintf(key, sizeof key, "many/%05d", i);
    cr_assert_eq(lt_store_put(s, key, "z", 1, NULL, err, sizeof err), LT_OK, "%s", err);
  }
  uint64_t deleted = 0;
  cr_assert_eq(lt_store_delete_prefix(s, "many/", &deleted, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(deleted, (uint64_t)n, "deleted %llu of %d", (unsigned long long)deleted, n);
  char next[LT_STORE_KEY_MAX + 1];
  struct collected *c = calloc(1, sizeof *c);
  cr_assert_eq(lt_store_list(s, "many/", NULL, 0, collect, c, next, sizeof next, err, sizeof err), LT_OK);
  cr_assert_eq(c->n, 0, "%d keys left", c->n);
  free(c);
  lt_store_destroy(s);
}

/* 20 MiB: three 8 MiB parts on S3. Written through the streaming writer in odd-sized pieces and
 * through the buffer put; read back streamed, hashes compared. */
struct hash_sink {
  lt_crypto_sha256_t *h;
  uint64_t n;
  size_t max_piece;
};

static lt_err_t hash_sink(void *ctx, const void *data, size_t len) {
  struct hash_sink *hs = ctx;
  lt_crypto_sha256_update(hs->h, data, len);
  hs->n += len;
  if (len > hs->max_piece) hs->max_piece = len;
  return LT_OK;
}

CONTRACT(multipart_sized_object_round_trips_with_matching_sha256) {
  size_t n = 20 * 1024 * 1024 + 12345;
  uint8_t *p = pattern(n, 7), want[32], got_w[32], got_get[32], got_sink[32];
  lt_crypto_sha256(p, n, want);

  lt_store_writer_t *w;
  cr_assert_eq(lt_store_writer_new(s, k(prefix, "big-streamed"), &w, err, sizeof err), LT_OK);
  for (size_t off = 0, step = 1; off < n;) {
    size_t take = step < n - off ? step : n - off;
    cr_assert_eq(lt_store_writer_write(w, p + off, take, err, sizeof err), LT_OK, "%s", err);
    off += take;
    step = step * 7 + 13;
    if (step > 3 * 1024 * 1024) step = 1000;
  }
  uint64_t size = 0;
  cr_assert_eq(lt_store_writer_commit(w, got_w, &size, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(size, n);
  cr_assert(memcmp(got_w, want, 32) == 0, "writer's content hash is wrong");

  struct hash_sink hs = {0};
  cr_assert_eq(lt_crypto_sha256_new(&hs.h), LT_OK);
  cr_assert_eq(lt_store_get_stream(s, k(prefix, "big-streamed"), hash_sink, &hs, got_get, err,
                                   sizeof err), LT_OK, "%s", err);
  lt_crypto_sha256_final(hs.h, got_sink);
  lt_crypto_sha256_destroy(hs.h);
  cr_assert_eq(hs.n, n);
  cr_assert(memcmp(got_sink, want, 32) == 0 && memcmp(got_get, want, 32) == 0,
            "streamed get hash differs");
  cr_assert_lt(hs.max_piece, n, "get_stream delivered the object in one piece");

  uint8_t sha_put[32];
  cr_assert_eq(lt_store_put(s, k(prefix, "big-put"), p, n, sha_put, err, sizeof err), LT_OK, "%s",
               err);
  cr_assert(memcmp(sha_put, want, 32) == 0);
  expect_content(s, k(prefix, "big-put"), p, n);
  lt_store_delete(s, k(prefix, "big-streamed"), err, sizeof err);
  lt_store_delete(s, k(prefix, "big-put"), err, sizeof err);
  free(p);
}

CONTRACT(aborted_writer_leaves_no_object) {
  size_t n = 10 * 1024 * 1024; /* past one part on S3: a multipart upload is under way */
  uint8_t *p = pattern(n, 9);
  lt_store_writer_t *w;
  cr_assert_eq(lt_store_writer_new(s, k(prefix, "aborted"), &w, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_writer_write(w, p, n, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_writer_write(w, p, 1, err, sizeof err), LT_OK, "%s", err);
  lt_store_writer_abort(w);
  lt_store_info_t info;
  cr_assert_eq(lt_store_head(s, k(prefix, "aborted"), &info, err, sizeof err), LT_ERR_NOT_FOUND);
  /* Nothing is visible before commit either. */
  cr_assert_eq(lt_store_writer_new(s, k(prefix, "pending"), &w, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_writer_write(w, p, 100, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_head(s, k(prefix, "pending"), &info, err, sizeof err), LT_ERR_NOT_FOUND);
  cr_assert_eq(lt_store_writer_commit(w, NULL, NULL, err, sizeof err), LT_OK, "%s", err);
  expect_content(s, k(prefix, "pending"), p, 100);
  lt_store_delete(s, k(prefix, "pending"), err, sizeof err);
  free(p);
}

CONTRACT(copy_makes_an_independent_object) {
  uint8_t *a = pattern(70000, 3), *b = pattern(10, 4);
  cr_assert_eq(lt_store_put(s, k(prefix, "staging/x"), a, 70000, NULL, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_copy(s, k(prefix, "staging/x"), k(prefix, "published/x"), err,
                             sizeof err), LT_OK, "%s", err);
  expect_content(s, k(prefix, "published/x"), a, 70000);
  /* Copying twice (a retried promotion) gives the same object. */
  cr_assert_eq(lt_store_copy(s, k(prefix, "staging/x"), k(prefix, "published/x"), err,
                             sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_store_put(s, k(prefix, "staging/x"), b, 10, NULL, err, sizeof err), LT_OK);
  expect_content(s, k(prefix, "published/x"), a, 70000);
  cr_assert_eq(lt_store_delete(s, k(prefix, "staging/x"), err, sizeof err), LT_OK);
  expect_content(s, k(prefix, "published/x"), a, 70000);
  lt_store_delete(s, k(prefix, "published/x"), err, sizeof err);
  free(a); free(b);
}

CONTRACT(bad_keys_are_rejected_with_the_key_and_the_rule) {
  struct { const char *key; const char *says; } bad[] = {
      {"../etc/passwd", "'..'"}, {"a/../../b", "'..'"}, {"/abs/path", "absolute"},
      {"a//b", "empty segment"}, {"a/./b", "'.'"},     {"a/", "ends with"},
      {"", "empty"},             {"a\nb", "control"},   {"tab\there", "control"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    lt_err_t e = lt_store_put(s, bad[i].key, "x", 1, NULL, err, sizeof err);
    cr_assert_eq(e, LT_ERR_INVALID, "key '%s' accepted", bad[i].key);
    cr_assert(strstr(err, bad[i].says) != NULL, "key '%s': message '%s' lacks '%s'", bad[i].key,
              err, bad[i].says);
    void *d;
    size_t n;
    cr_assert_eq(lt_store_get(s, bad[i].key, 10, &d, &n, NULL, err, sizeof err), LT_ERR_INVALID);
    cr_assert_eq(lt_store_delete(s, bad[i].key, err, sizeof err), LT_ERR_INVALID);
  }
  cr_assert_eq(lt_store_key_check("a\0b", 3, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "NUL") != NULL, "%s", err);
  char long_key[LT_STORE_KEY_MAX + 2];
  memset(long_key, 'a', sizeof long_key - 1);
  long_key[sizeof long_key - 1] = 0;
  cr_assert_eq(lt_store_put(s, long_key, "x", 1, NULL, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "1024") != NULL, "%s", err);
  (void)prefix;
}

CONTRACT(sink_error_stops_the_read_and_is_returned) {
  uint8_t *p = pattern(3 * 1024 * 1024, 5);
  cr_assert_eq(lt_store_put(s, k(prefix, "s"), p, 3 * 1024 * 1024, NULL, err, sizeof err), LT_OK);
  void *d;
  size_t n;
  cr_assert_eq(lt_store_get(s, k(prefix, "s"), 1024 * 1024, &d, &n, NULL, err, sizeof err),
               LT_ERR_INVALID, "an object above max_len is refused");
  cr_assert(strstr(err, "limit") != NULL, "%s", err);
  lt_store_delete(s, k(prefix, "s"), err, sizeof err);
  free(p);
}

/* The pipeline the API and workers use: encrypt while uploading, decrypt while downloading. */
struct dec_sink {
  lt_crypto_stream_t *dec;
  lt_crypto_sha256_t *h;
  uint8_t *tmp;
  size_t tmp_cap;
  uint64_t n;
};

static lt_err_t decrypt_sink(void *ctx, const void *data, size_t len) {
  struct dec_sink *d = ctx;
  size_t need = lt_crypto_stream_out_max(d->dec, len), o;
  if (need > d->tmp_cap) {
    d->tmp = realloc(d->tmp, need);
    d->tmp_cap = need;
  }
  lt_err_t e = lt_crypto_stream_update(d->dec, data, len, d->tmp, d->tmp_cap, &o, err, sizeof err);
  if (e) return e;
  lt_crypto_sha256_update(d->h, d->tmp, o);
  d->n += o;
  return LT_OK;
}

CONTRACT(encrypted_stream_through_the_store_round_trips_and_detects_a_rename) {
  lt_crypto_dek_t *dek;
  cr_assert_eq(lt_crypto_dek_generate(&dek, "tenant-1", "k1", err, sizeof err), LT_OK);
  const char *key = k(prefix, "tenants/tenant-1/datasets/d1/data");
  size_t n = 9 * 1024 * 1024 + 77;
  uint8_t *p = pattern(n, 11), want[32], got[32];
  lt_crypto_sha256(p, n, want);
  lt_crypto_stream_t *enc;
  cr_assert_eq(lt_crypto_enc_new(&enc, dek, key, 0, err, sizeof err), LT_OK);
  lt_store_writer_t *w;
  cr_assert_eq(lt_store_writer_new(s, key, &w, err, sizeof err), LT_OK);
  size_t piece = 100000, cap = lt_crypto_stream_out_max(enc, piece) + 2 * LT_CRYPTO_CHUNK_DEFAULT;
  uint8_t *out = malloc(cap);
  size_t o;
  for (size_t off = 0; off < n; off += piece) {
    size_t take = piece < n - off ? piece : n - off;
    cr_assert_eq(lt_crypto_stream_update(enc, p + off, take, out, cap, &o, err, sizeof err),
                 LT_OK, "%s", err);
    cr_assert_eq(lt_store_writer_write(w, out, o, err, sizeof err), LT_OK, "%s", err);
  }
  cr_assert_eq(lt_crypto_stream_final(enc, out, cap, &o, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_writer_write(w, out, o, err, sizeof err), LT_OK);
  uint64_t stored = 0;
  cr_assert_eq(lt_store_writer_commit(w, NULL, &stored, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(stored, lt_crypto_sealed_size(dek, n, 0));

  struct dec_sink d = {0};
  cr_assert_eq(lt_crypto_dec_new(&d.dec, dek, key, err, sizeof err), LT_OK);
  cr_assert_eq(lt_crypto_sha256_new(&d.h), LT_OK);
  cr_assert_eq(lt_store_get_stream(s, key, decrypt_sink, &d, NULL, err, sizeof err), LT_OK, "%s",
               err);
  uint8_t tail[LT_CRYPTO_CHUNK_DEFAULT + 64];
  cr_assert_eq(lt_crypto_stream_final(d.dec, tail, sizeof tail, &o, err, sizeof err), LT_OK,
               "%s", err);
  lt_crypto_sha256_update(d.h, tail, o);
  lt_crypto_sha256_final(d.h, got);
  cr_assert_eq(d.n + o, n);
  cr_assert(memcmp(got, want, 32) == 0, "decrypted content differs");

  /* Copied under another key, the object no longer decrypts: the key is bound. */
  const char *moved = k(prefix, "tenants/tenant-1/datasets/d2/data");
  cr_assert_eq(lt_store_copy(s, key, moved, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_crypto_stream_reset(d.dec, moved, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_get_stream(s, moved, decrypt_sink, &d, NULL, err, sizeof err),
               LT_ERR_CORRUPT, "a renamed object must not decrypt");
  lt_store_delete(s, key, err, sizeof err);
  lt_store_delete(s, moved, err, sizeof err);
  lt_crypto_stream_destroy(d.dec);
  lt_crypto_stream_destroy(enc);
  lt_crypto_sha256_destroy(d.h);
  lt_crypto_dek_destroy(dek);
  free(d.tmp); free(out); free(p);
}

/* ---- directory store ------------------------------------------------------------------------ */

static void walk_check_inside(const char *root, const char *dir, int *files) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    char path[PATH_MAX], real[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
    cr_assert_not_null(realpath(path, real));
    cr_assert(strncmp(real, root, strlen(root)) == 0, "%s is outside the root", real);
    struct stat st;
    lstat(path, &st);
    if (S_ISDIR(st.st_mode)) walk_check_inside(root, path, files);
    else (*files)++;
  }
  closedir(d);
}

Test(store_dir, odd_keys_stay_inside_the_root_and_do_not_collide) {
  lt_store_t *s = open_dir();
  const char *keys[] = {"a", "a/b", "a%o", "a%o/x", ".hidden/x", "sp ace/é/%41", "a/b%2Fc",
                        "..x/y", "x/...", ".tmp/z"};
  size_t nk = sizeof keys / sizeof *keys;
  for (size_t i = 0; i < nk; i++)
    cr_assert_eq(lt_store_put(s, keys[i], keys[i], strlen(keys[i]), NULL, err, sizeof err), LT_OK,
                 "%s: %s", keys[i], err);
  for (size_t i = 0; i < nk; i++) expect_content(s, keys[i], (const uint8_t *)keys[i],
                                                 strlen(keys[i]));
  struct collected *c = calloc(1, sizeof *c);
  int pages;
  cr_assert_eq(list_all(s, "", 3, c, &pages), (int)nk);
  for (int i = 1; i < c->n; i++)
    cr_assert(strcmp(c->keys[i - 1], c->keys[i]) < 0, "list out of order at %d", i);
  char real_root[PATH_MAX];
  cr_assert_not_null(realpath(dir_root, real_root));
  int files = 0;
  walk_check_inside(real_root, real_root, &files);
  cr_assert_eq(files, (int)nk, "one file per object, no temp files left (%d)", files);
  free(c);
  lt_store_destroy(s);
}

Test(store_dir, a_store_reopened_on_the_same_root_sees_the_objects) {
  lt_store_t *s = open_dir();
  cr_assert_eq(lt_store_put(s, "k/1", "one", 3, NULL, err, sizeof err), LT_OK);
  lt_store_destroy(s);
  cr_assert_eq(lt_store_dir_new(&s, dir_root, err, sizeof err), LT_OK);
  expect_content(s, "k/1", (const uint8_t *)"one", 3);
  lt_store_destroy(s);
}

/* A directory store may sit in a directory another process writes (a confined executor's sealed
 * checkpoints, read by its worker): an object replaced by a link to a file outside, or by a FIFO
 * that would block the reader, is refused, and the file outside is not read. */
Test(store_dir, an_object_replaced_by_a_link_or_a_fifo_is_refused_not_followed) {
  lt_store_t *s = open_dir();
  cr_assert_eq(lt_store_put(s, "k/linked", "sealed", 6, NULL, err, sizeof err), LT_OK);
  cr_assert_eq(lt_store_put(s, "k/fifo", "sealed", 6, NULL, err, sizeof err), LT_OK);
  char outside[PATH_MAX + 16], obj[PATH_MAX + 32];
  snprintf(outside, sizeof outside, "%s.outside", dir_root);
  FILE *f = fopen(outside, "w");
  cr_assert(f);
  fputs("the host's secret", f);
  fclose(f);
  snprintf(obj, sizeof obj, "%s/k/linked%%o", dir_root);
  cr_assert_eq(unlink(obj), 0, "%s: %s", obj, strerror(errno));
  cr_assert_eq(symlink(outside, obj), 0);
  void *data = NULL;
  size_t len = 0;
  cr_assert_neq(lt_store_get(s, "k/linked", 1024, &data, &len, NULL, err, sizeof err), LT_OK,
                "a link was followed: got %zu bytes", len);
  free(data);
  data = NULL;
  snprintf(obj, sizeof obj, "%s/k/fifo%%o", dir_root);
  cr_assert_eq(unlink(obj), 0);
  cr_assert_eq(mkfifo(obj, 0600), 0);
  cr_assert_neq(lt_store_get(s, "k/fifo", 1024, &data, &len, NULL, err, sizeof err), LT_OK, "a FIFO was read");
  free(data);
  unlink(outside);
  lt_store_destroy(s);
}

/* ---- S3 store ------------------------------------------------------------------------------- */

Test(store_s3, unreachable_store_is_retried_then_unavailable_in_bounded_time, .timeout = 60) {
  lt_store_s3_conf_t c = {.endpoint = "127.0.0.1:1", .bucket = "lathe", .access_key = "a",
                          .secret_key = "b", .max_attempts = 4, .backoff_ms = 100};
  lt_store_t *s = open_s3_conf(&c);
  int64_t t0 = lt_time_mono_us();
  lt_err_t e = lt_store_put(s, "k", "x", 1, NULL, err, sizeof err);
  double secs = (double)(lt_time_mono_us() - t0) / 1e6;
  cr_assert_eq(e, LT_ERR_UNAVAILABLE, "got %s: %s", lt_err_name(e), err);
  cr_assert(lt_store_err_retriable(e));
  cr_assert(strstr(err, "4 times") != NULL, "message says how often it tried: %s", err);
  /* Three backoffs of 100, 200, 400 ms with equal jitter: 0.35 s .. 0.7 s, plus connects. */
  cr_assert(secs >= 0.3 && secs < 5.0, "took %.2f s", secs);

  void *d;
  size_t n;
  cr_assert_eq(lt_store_get(s, "k", 10, &d, &n, NULL, err, sizeof err), LT_ERR_UNAVAILABLE);
  lt_store_info_t info;
  cr_assert_eq(lt_store_head(s, "k", &info, err, sizeof err), LT_ERR_UNAVAILABLE);
  /* The multipart path (curl) fails the same way. */
  size_t big = 9 * 1024 * 1024;
  uint8_t *p = calloc(1, big);
  e = lt_store_put(s, "big", p, big, NULL, err, sizeof err);
  cr_assert_eq(e, LT_ERR_UNAVAILABLE, "multipart: got %s: %s", lt_err_name(e), err);
  free(p);
  lt_store_destroy(s);
}

/* A server that reads the start of each request and hangs up without answering: what a client
 * sees when the object server dies in the middle of an upload. */
typedef struct {
  int fd, hangups;
} hangup_server_t;

static void *hangup_main(void *arg) {
  hangup_server_t *h = arg;
  for (;;) {
    int c = accept(h->fd, NULL, NULL);
    if (c < 0) return NULL;
    char buf[512];
    (void)!read(c, buf, sizeof buf);
    struct linger lg = {1, 0}; /* RST, not FIN: the connection breaks */
    setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    __atomic_add_fetch(&h->hangups, 1, __ATOMIC_SEQ_CST); /* before the close the client sees */
    close(c);
  }
}

Test(store_s3, a_connection_broken_mid_request_is_retried_then_unavailable, .timeout = 60) {
  hangup_server_t h = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(h.fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(h.fd, 16), 0);
  socklen_t l = sizeof a;
  getsockname(h.fd, (struct sockaddr *)&a, &l);
  pthread_t th;
  pthread_create(&th, NULL, hangup_main, &h);
  char endpoint[32];
  snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", ntohs(a.sin_port));
  lt_store_s3_conf_t c = {.endpoint = endpoint, .bucket = "lathe", .access_key = "a", .secret_key = "b",
                          .max_attempts = 3, .backoff_ms = 20};
  lt_store_t *s = open_s3_conf(&c);
  char body[4096];
  memset(body, 'x', sizeof body);
  lt_err_t e = lt_store_put(s, "k", body, sizeof body, NULL, err, sizeof err);
  cr_assert_eq(e, LT_ERR_UNAVAILABLE, "got %s: %s", lt_err_name(e), err);
  cr_assert(lt_store_err_retriable(e), "a broken connection is worth retrying later");
  cr_assert(strstr(err, "3 times") != NULL, "message says how often it tried: %s", err);
  int hangups = __atomic_load_n(&h.hangups, __ATOMIC_SEQ_CST);
  cr_assert_geq(hangups, 3, "every attempt reached the server (%d)", hangups);
  lt_store_destroy(s);
  shutdown(h.fd, SHUT_RDWR);
  close(h.fd);
  pthread_join(th, NULL);
}

Test(store_s3, wrong_credentials_are_refused_not_retried) {
  lt_store_s3_conf_t c;
  if (lt_store_s3_conf_from_env(&c, err, sizeof err) != LT_OK)
    cr_assert_fail("S3 integration test needs the object store of ops/stack: %s", err);
  c.secret_key = "not-the-secret";
  lt_store_t *s = open_s3_conf(&c);
  lt_err_t e = lt_store_put(s, "test/creds", "x", 1, NULL, err, sizeof err);
  cr_assert_eq(e, LT_ERR_AUTH, "got %s: %s", lt_err_name(e), err);
  cr_assert(!lt_store_err_retriable(e));
  lt_store_destroy(s);
}

Test(store_s3, configuration_errors_name_the_field_or_variable) {
  lt_store_s3_conf_t c = {.endpoint = "127.0.0.1:9000", .bucket = "lathe", .access_key = "a",
                          .secret_key = ""};
  lt_store_t *s;
  cr_assert_eq(lt_store_s3_new(&s, &c, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "secret_key") != NULL, "%s", err);
  c.secret_key = "b";
  c.part_size = 1024;
  cr_assert_eq(lt_store_s3_new(&s, &c, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "part_size") != NULL, "%s", err);
  char *saved = getenv("LATHE_S3_BUCKET") ? strdup(getenv("LATHE_S3_BUCKET")) : NULL;
  unsetenv("LATHE_S3_BUCKET");
  setenv("LATHE_S3_ENDPOINT", getenv("LATHE_S3_ENDPOINT") ? getenv("LATHE_S3_ENDPOINT") : "x", 1);
  cr_assert_eq(lt_store_s3_conf_from_env(&c, err, sizeof err), LT_ERR_INVALID);
  cr_assert(strstr(err, "LATHE_S3_") != NULL, "%s", err);
  if (saved) setenv("LATHE_S3_BUCKET", saved, 1);
  free(saved);
}

/* libs3 dates each request with gmtime(); lt_store_s3.c gives it a buffer per thread (glibc's is
 * one for the process, and threads signing at once tore each other's Date). The gmtime that
 * libs3 binds to is the process's first definition: this one, per thread. */
static void *gmtime_in_thread(void *arg) {
  time_t t = *(time_t *)arg;
  struct tm *(*fn)(const time_t *);
  void *sym = dlsym(RTLD_DEFAULT, "gmtime");
  memcpy(&fn, &sym, sizeof fn);
  return fn(&t);
}

Test(store_s3, gmtime_as_libs3_binds_it_keeps_one_buffer_per_thread) {
  time_t a = 0, b = 86400 * 365;
  struct tm *mine = gmtime(&b);
  pthread_t ta;
  void *ra;
  pthread_create(&ta, NULL, gmtime_in_thread, &a);
  pthread_join(ta, &ra);
  cr_assert_neq(ra, (void *)mine, "another thread got this thread's gmtime buffer (glibc's static one)");
  cr_assert_eq(mine->tm_year, 71, "another thread's gmtime changed this one's: year %d", mine->tm_year + 1900);
  void *self = dlsym(RTLD_DEFAULT, "gmtime"), *libc = dlsym(RTLD_NEXT, "gmtime");
  cr_assert_neq(self, libc, "libs3's gmtime binds to glibc's");
}
