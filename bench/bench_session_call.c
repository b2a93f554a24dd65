/* bench_session_call: one training-session call in process — the peer of bench/sessions, which
 * times the same call through the API (POST /v1/sessions/{id}/calls, then its long poll).
 *
 * Opens the model the way a session's executor does (lt_executor_session.c: a CPU backend of
 * LATHE_BENCH_THREADS threads, the engine, a session of lt_prim_session_config(rank, alpha,
 * dropout, every target module, seed)) and times lt_prim_run(kind, body) on the exact body the
 * API was sent, N times after one untimed warm-up call. Each forward_backward accumulates into
 * the session's gradient, as N calls in a row through the API do; nothing steps the optimizer.
 * The parse of the body text (json_loads) is counted, as the executor counts it in duration_ms.
 *
 * Usage: bench_session_call MODEL_DIR BODY.json [N]
 *        bench_session_call --store BODY.json [N]
 *        bench_session_call --make-model DIR --shape smollm
 *   LATHE_BENCH_THREADS (1: lathed's worker default, LATHE_WORKER_THREADS), LATHE_BENCH_RANK (4),
 *   LATHE_BENCH_ALPHA (8), LATHE_BENCH_SEED (5); dropout 0.
 * Prints the setting, then `inproc_ms p50 P p99 P mean M min M max M n N` (milliseconds per call:
 * parse of the body, lt_prim_run, serialization of the result) and, last,
 * `session_call_inproc_p50_ms: P`.
 *
 * --store: the store's share of a call instead. The API seals a call's body into the store
 * (lt_sealed_put) before it answers the POST, the worker reads it back (lt_sealed_get), and the
 * result takes the same two trips the other way. This times one sealed put and one sealed get of
 * BODY.json's bytes against the S3 server of ops/stack (LATHE_S3_*), N times, under a fresh DEK;
 * prints `store_put_ms ...` and `store_get_ms ...` lines like inproc_ms, and deletes the keys.
 *
 * --make-model DIR --shape smollm: writes a randomly initialised model of SmolLM2-135M's shape
 * (d 576, 30 layers, 9 heads / 3 kv heads of 64, ffn 1536, vocab 49152, tied embeddings; F32,
 * N(0, 0.02), seed 1) into DIR (config.json + model.safetensors), for bench/sessions --smollm. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench_util.h"
#include "lt_engine.h"
#include "lt_prim.h"
#include "lt_sealed.h"
#include "lt_store.h"

static char err[1024];

/* The p-th percentile of sorted[0..n), interpolated between ranks (as bench/sessions computes it). */
static double pct(const double *sorted, int n, double p) {
  double k = (n - 1) * p / 100.0;
  int lo = (int)floor(k), hi = lo + 1 < n ? lo + 1 : n - 1;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo);
}

static void print_ms(const char *name, double *ms, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) sum += ms[i];
  qsort(ms, (size_t)n, sizeof *ms, bench_cmp_double);
  printf("%s p50 %.3f p99 %.3f mean %.3f min %.3f max %.3f n %d\n", name, pct(ms, n, 50), pct(ms, n, 99), sum / n,
         ms[0], ms[n - 1], n);
}

static int store_mode(const char *text, size_t len, int n) {
  lt_store_s3_conf_t c;
  lt_store_t *st = NULL;
  lt_crypto_dek_t *dek = NULL;
  if (lt_store_s3_conf_from_env(&c, err, sizeof err) || lt_store_s3_new(&st, &c, err, sizeof err) ||
      lt_crypto_dek_generate(&dek, "bench", "dek-1", err, sizeof err)) {
    fprintf(stderr, "bench_session_call --store needs the S3 server of ops/stack: %s\n", err);
    return 1;
  }
  double *put = calloc((size_t)n, sizeof *put), *get = calloc((size_t)n, sizeof *get);
  for (int i = -1; i < n; i++) { /* i == -1: warm-up (connection) */
    char key[128];
    snprintf(key, sizeof key, "bench/session_call/%d/%d", (int)getpid(), i + 1);
    double t0 = bench_now_s();
    if (lt_sealed_put(st, dek, key, text, len, NULL, err, sizeof err)) {
      fprintf(stderr, "bench_session_call: put: %s\n", err);
      return 1;
    }
    double t1 = bench_now_s();
    void *data = NULL;
    size_t got = 0;
    if (lt_sealed_get(st, dek, key, len + 65536, &data, &got, err, sizeof err) || got != len) {
      fprintf(stderr, "bench_session_call: get: %s (got %zu)\n", err, got);
      return 1;
    }
    double t2 = bench_now_s();
    free(data);
    lt_store_delete(st, key, NULL, 0);
    if (i >= 0) {
      put[i] = (t1 - t0) * 1e3;
      get[i] = (t2 - t1) * 1e3;
    }
  }
  printf("sealed put+get of %zu bytes, S3 (ops/stack), %d times\n", len, n);
  print_ms("store_put_ms", put, n);
  print_ms("store_get_ms", get, n);
  free(put);
  free(get);
  lt_crypto_dek_destroy(dek);
  lt_store_destroy(st);
  return 0;
}

static int make_model(const char *dir, const char *shape) {
  if (strcmp(shape, "smollm") != 0) {
    fprintf(stderr, "bench_session_call: --shape %s: only smollm\n", shape);
    return 2;
  }
  lt_model_config_t c = {.vocab_size = 49152, .hidden_size = 576, .intermediate_size = 1536, .num_layers = 30,
                         .num_heads = 9, .num_kv_heads = 3, .head_dim = 64, .max_position = 2048,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  double t0 = bench_now_s();
  if (lt_model_init_random(&c, dir, 1, 0.02f, 0.0f, err, sizeof err)) {
    fprintf(stderr, "bench_session_call: --make-model %s: %s\n", dir, err);
    return 1;
  }
  printf("made %s: SmolLM2-135M shape, random (seed 1), %.1f s\n", dir, bench_now_s() - t0);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--make-model") == 0 && strcmp(argv[3], "--shape") == 0)
    return make_model(argv[2], argv[4]);
  if (argc < 3) {
    fprintf(stderr, "usage: bench_session_call MODEL_DIR BODY.json [N]\n       bench_session_call --store BODY.json [N]\n"
                    "       bench_session_call --make-model DIR --shape smollm\n");
    return 2;
  }
  int n = argc > 3 ? atoi(argv[3]) : 40;
  if (n < 1) n = 1;
  int threads = bench_env_int("LATHE_BENCH_THREADS", 1), rank = bench_env_int("LATHE_BENCH_RANK", 4);
  int alpha = bench_env_int("LATHE_BENCH_ALPHA", 8), seed = bench_env_int("LATHE_BENCH_SEED", 5);

  FILE *f = fopen(argv[2], "rb");
  if (!f) {
    perror(argv[2]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)len + 1);
  if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) {
    fprintf(stderr, "bench_session_call: cannot read %s\n", argv[2]);
    return 1;
  }
  text[len] = 0;
  fclose(f);
  if (strcmp(argv[1], "--store") == 0) return store_mode(text, (size_t)len, n);

  lt_backend_t *be = NULL;
  lt_engine_t *eng = NULL;
  lt_session_t *s = NULL;
  lt_err_t e = lt_backend_cpu_new(threads, &be, err, sizeof err);
  if (!e) e = lt_engine_open(argv[1], be, &eng, err, sizeof err);
  lt_session_config_t sc = lt_prim_session_config(rank, alpha, 0.0, LT_TARGET_ALL, seed);
  if (!e) e = lt_session_new(eng, &sc, &s, err, sizeof err);
  if (e) {
    fprintf(stderr, "bench_session_call: %s\n", err);
    return 1;
  }
  const lt_model_config_t *mc = lt_engine_config(eng);

  double *ms = calloc((size_t)n, sizeof *ms);
  const char *kind = NULL;
  for (int i = -1; i < n; i++) { /* i == -1: the warm-up call, not timed */
    double t0 = bench_now_s();
    json_error_t je;
    json_t *body = json_loads(text, 0, &je);
    if (!body) {
      fprintf(stderr, "bench_session_call: %s: %s\n", argv[2], je.text);
      return 1;
    }
    kind = json_string_value(json_object_get(body, "kind"));
    lt_prim_out_t out;
    e = lt_prim_run(s, mc, kind ? kind : "", body, &out);
    if (e) {
      fprintf(stderr, "bench_session_call: %s failed: %s %s %s\n", kind, out.code, out.field, out.reason);
      return 1;
    }
    /* The executor also serializes the result it reports; count that too. */
    char *res = json_dumps(out.body, JSON_COMPACT | JSON_REAL_PRECISION(9));
    double t1 = bench_now_s();
    free(res);
    json_decref(out.body);
    json_decref(body);
    if (i >= 0) ms[i] = (t1 - t0) * 1e3;
  }
  printf("model %s, %d thread(s), LoRA r%d alpha %d, body %ld bytes, %d timed calls\n", argv[1], threads, rank,
         alpha, len, n);
  print_ms("inproc_ms", ms, n);
  printf("session_call_inproc_p50_ms: %.3f\n", pct(ms, n, 50));
  free(ms);
  free(text);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  return 0;
}
