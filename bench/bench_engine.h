/* bench_engine: a model opened the way an executor opens it — a CPU backend, the engine, one
 * LoRA r16 session on every target — for the engine benchmarks (bench_ckpt, bench_mem).
 * Header-only, for bench/ alone. */
#ifndef BENCH_ENGINE_H
#define BENCH_ENGINE_H

#include "lt_engine.h"

typedef struct bench_engine {
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *s;
} bench_engine_t;

/* Opens model on threads CPU threads; LT_OK, or the error with its message in err. */
static inline lt_err_t bench_engine_open(bench_engine_t *b, const char *model, int threads, char *err, size_t n) {
  lt_session_config_t sc = {.rank = 16, .alpha = 32, .targets = LT_TARGET_ALL, .seed = 1};
  lt_err_t e = lt_backend_cpu_new(threads, &b->be, err, n);
  if (!e) e = lt_engine_open(model, b->be, &b->eng, err, n);
  if (!e) e = lt_session_new(b->eng, &sc, &b->s, err, n);
  return e;
}

static inline void bench_engine_close(bench_engine_t *b) {
  lt_session_destroy(b->s);
  lt_engine_close(b->eng);
  lt_backend_destroy(b->be);
}

#endif
