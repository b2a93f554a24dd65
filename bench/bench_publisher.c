/* bench_publisher: promotion throughput of lathed publisher's step (lt_publisher_promote: read
 * every staged object, SHA-256 over the stored bytes, decrypt, re-encrypt under the artifact key,
 * write) on a ~16 MiB checkpoint, against a plain copy of the same objects in the same run
 * (lt_store_get + lt_store_put of each object to another key: the floor set by the store alone).
 * Both move the same objects through the same S3 server (ops/stack env), alternating, ROUNDS
 * rounds; MB/s counts stored staging bytes read. Last line: `publisher_vs_copy_ratio: X`
 * (median of the per-round ratios; 1.0 would mean crypto and hashing cost nothing). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "lt_crypto.h"
#include "lt_publisher.h"
#include "lt_sealed.h"
#include "lt_store.h"

#define ROUNDS 5

#define CHECK(call)                                                                                                    \
  do {                                                                                                                 \
    lt_err_t e_ = (call);                                                                                              \
    if (e_) {                                                                                                          \
      fprintf(stderr, "bench_publisher: %s: %s (%s)\n", #call, err, lt_err_name(e_));                                  \
      return 1;                                                                                                        \
    }                                                                                                                  \
  } while (0)

int main(void) {
  char err[512] = "";
  lt_store_s3_conf_t sc;
  lt_store_t *store;
  CHECK(lt_store_s3_conf_from_env(&sc, err, sizeof err));
  CHECK(lt_store_s3_new(&store, &sc, err, sizeof err));
  char tenant[48], rid[33];
  CHECK(lt_crypto_random_id(rid));
  snprintf(tenant, sizeof tenant, "bench-%.12s", rid);
  const char *job = "job-bench";
  lt_crypto_dek_t *dek;
  CHECK(lt_crypto_dek_generate(&dek, tenant, "dek-1", err, sizeof err));

  /* The checkpoint: a 14 MiB adapter, its config, a 2 MiB optimizer state, small JSON files. */
  static const char *const names[] = {"adapter_model.safetensors", "adapter_config.json", "state.bin",
                                      "eval.json", "metrics.json", "config.json"};
  const size_t sizes[] = {14u << 20, 1024, 2u << 20, 4096, 65536, 0};
  char keys[6][LT_STORE_KEY_MAX + 1];
  const char *kv[6];
  lt_crypto_sha256_t *h;
  CHECK(lt_crypto_sha256_new(&h));
  uint64_t total = 0;
  for (int i = 0; i < 6; i++) {
    size_t len = sizes[i];
    char *plain = malloc(len ? len : 256);
    if (i == 5) {
      len = (size_t)snprintf(plain, 256, "{\"config_digest\":\"%064d\",\"spec\":{}}", 0);
    } else {
      CHECK(lt_crypto_random(plain, len));
    }
    CHECK(lt_publisher_staging_key(keys[i], sizeof keys[i], tenant, job, 1, 1000, names[i]));
    kv[i] = keys[i];
    size_t cap = lt_crypto_sealed_size(dek, len, 0), slen;
    uint8_t *sealed = malloc(cap);
    CHECK(lt_crypto_seal(dek, keys[i], 0, plain, len, sealed, cap, &slen, err, sizeof err));
    CHECK(lt_store_put(store, keys[i], sealed, slen, NULL, err, sizeof err));
    lt_crypto_sha256_update(h, sealed, slen);
    total += slen;
    free(sealed);
    free(plain);
  }
  uint8_t d[32];
  char sha[65];
  lt_crypto_sha256_final(h, d);
  lt_crypto_hex(d, 32, sha);
  lt_crypto_sha256_destroy(h);
  lt_publisher_checkpoint_t ck = {.tenant_id = tenant, .job_id = job, .attempt = 1, .step = 1000, .object_keys = kv,
                                  .nkeys = 6, .sha256_hex = sha, .bytes = total};
  printf("checkpoint: %d objects, %.2f MiB stored, S3 at %s\n", 6, total / 1048576.0, sc.endpoint);

  lt_publisher_promotion_t *pr = malloc(sizeof *pr);
  double pub_mbs[ROUNDS], copy_mbs[ROUNDS], ratio[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = bench_now_s();
    CHECK(lt_publisher_promote(store, dek, &ck, 1ull << 30, pr, err, sizeof err));
    double t1 = bench_now_s();
    for (int i = 0; i < 6; i++) {
      void *data;
      size_t len;
      char dst[LT_STORE_KEY_MAX + 1];
      snprintf(dst, sizeof dst, "tenants/%s/copy/%s/%s", tenant, job, names[i]);
      CHECK(lt_store_get(store, keys[i], 1u << 30, &data, &len, NULL, err, sizeof err));
      CHECK(lt_store_put(store, dst, data, len, NULL, err, sizeof err));
      free(data);
    }
    double t2 = bench_now_s();
    pub_mbs[r] = total / 1e6 / (t1 - t0);
    copy_mbs[r] = total / 1e6 / (t2 - t1);
    ratio[r] = pub_mbs[r] / copy_mbs[r];
    printf("round %d: publisher %.1f MB/s (%.3f s), plain get+put %.1f MB/s (%.3f s), ratio %.3f\n", r + 1, pub_mbs[r],
           t1 - t0, copy_mbs[r], t2 - t1, ratio[r]);
  }
  /* Check what was published decrypts to a plaintext of the right hash (a benchmark of a wrong
   * result is worth nothing). */
  for (size_t i = 0; i < pr->n; i++) {
    void *data;
    size_t len;
    CHECK(lt_sealed_get(store, dek, pr->artifacts[i].key, 1u << 30, &data, &len, err, sizeof err));
    char hex[65];
    lt_crypto_sha256(data, len, d);
    if (strcmp(lt_crypto_hex(d, 32, hex), pr->artifacts[i].sha256) != 0) {
      fprintf(stderr, "bench_publisher: %s does not decrypt to its recorded hash\n", pr->artifacts[i].key);
      return 1;
    }
    free(data);
  }
  /* Clean up every object of this run. */
  for (int i = 0; i < 6; i++) {
    char dst[LT_STORE_KEY_MAX + 1];
    snprintf(dst, sizeof dst, "tenants/%s/copy/%s/%s", tenant, job, names[i]);
    lt_store_delete(store, dst, NULL, 0);
    lt_store_delete(store, keys[i], NULL, 0);
  }
  for (size_t i = 0; i < pr->n; i++) lt_store_delete(store, pr->artifacts[i].key, NULL, 0);
  qsort(pub_mbs, ROUNDS, sizeof(double), bench_cmp_double);
  qsort(copy_mbs, ROUNDS, sizeof(double), bench_cmp_double);
  qsort(ratio, ROUNDS, sizeof(double), bench_cmp_double);
  printf("publisher promote: median %.1f MB/s, best %.1f MB/s\n", pub_mbs[ROUNDS / 2], pub_mbs[ROUNDS - 1]);
  printf("plain get+put:     median %.1f MB/s, best %.1f MB/s\n", copy_mbs[ROUNDS / 2], copy_mbs[ROUNDS - 1]);
  printf("publisher_vs_copy_ratio: %.3f\n", ratio[ROUNDS / 2]);
  free(pr);
  lt_crypto_dek_destroy(dek);
  lt_store_destroy(store);
  return 0;
}
