/* bench_store: put and get throughput of one 64 MiB object on the S3 store (the server of
 * ops/stack, LATHE_S3_* from `eval "$(ops/stack env)"`; multipart, 8 MiB parts) against the
 * directory store (a temp directory) in the same run. Last line: `store_s3_vs_dir_put: ratio`.
 * Usage: bench_store [MiB, default 64] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_crypto.h"
#include "lt_store.h"

static char err[512];

static lt_err_t discard(void *ctx, const void *data, size_t len) {
  (void)data;
  *(size_t *)ctx += len;
  return LT_OK;
}

/* Best of 3 put and get times of one object of n bytes. */
static int run(lt_store_t *s, const char *key, const uint8_t *p, size_t n, double *put_s,
               double *get_s) {
  *put_s = *get_s = 1e9;
  uint8_t sha_put[32], sha_get[32];
  for (int rep = 0; rep < 3; rep++) {
    double t0 = bench_now_s();
    if (lt_store_put(s, key, p, n, sha_put, err, sizeof err)) {
      fprintf(stderr, "%s put: %s\n", lt_store_kind(s), err);
      return 1;
    }
    double t1 = bench_now_s();
    size_t got = 0;
    if (lt_store_get_stream(s, key, discard, &got, sha_get, err, sizeof err) || got != n ||
        memcmp(sha_put, sha_get, 32) != 0) {
      fprintf(stderr, "%s get: %s (got %zu)\n", lt_store_kind(s), err, got);
      return 1;
    }
    double t2 = bench_now_s();
    if (t1 - t0 < *put_s) *put_s = t1 - t0;
    if (t2 - t1 < *get_s) *get_s = t2 - t1;
  }
  lt_store_delete(s, key, err, sizeof err);
  return 0;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 64, n = mib << 20;
  uint8_t *p = malloc(n);
  lt_crypto_random(p, n);
  lt_store_s3_conf_t c;
  lt_store_t *s3, *dir;
  if (lt_store_s3_conf_from_env(&c, err, sizeof err) || lt_store_s3_new(&s3, &c, err, sizeof err)) {
    fprintf(stderr, "bench_store needs the S3 server of ops/stack: %s\n", err);
    return 1;
  }
  char root[] = "/tmp/lt-bench-store-XXXXXX";
  if (!mkdtemp(root) || lt_store_dir_new(&dir, root, err, sizeof err)) {
    fprintf(stderr, "dir store: %s\n", err);
    return 1;
  }
  char key[80], id[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(id);
  snprintf(key, sizeof key, "bench/%s/object", id);
  double s3_put, s3_get, dir_put, dir_get;
  if (run(dir, key, p, n, &dir_put, &dir_get) || run(s3, key, p, n, &s3_put, &s3_get)) return 1;
  double mb = (double)n / 1e6;
  printf("object: %zu MiB, best of 3, SHA-256 computed on both paths\n", mib);
  printf("dir store: put %.0f MB/s, get %.0f MB/s (root %s, fsync on put)\n", mb / dir_put,
         mb / dir_get, root);
  printf("s3 store:  put %.0f MB/s, get %.0f MB/s (%s, multipart above %d MiB)\n", mb / s3_put,
         mb / s3_get, c.endpoint, 8);
  printf("store_s3_vs_dir_get: %.3f\n", dir_get / s3_get);
  printf("store_s3_vs_dir_put: %.3f\n", dir_put / s3_put);
  lt_store_destroy(s3);
  lt_store_destroy(dir);
  rmdir(root);
  free(p);
  return 0;
}
