/* lt_cpu_pool: the cpu backend's thread pool (lt_cpu_pool.h). */
#include "lt_cpu_pool.h"

#include <immintrin.h> /* _mm_pause */
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "lt_time.h"

/* How long a pool thread waits awake before it sleeps, and how many pauses of that wait come
 * before it yields the CPU at each turn instead (so a machine with more runnable threads than
 * cores runs them). Measured on the 2-vCPU VM (bench_sample, SmolLM2 shape, bf16): a wait of
 * 5 us decoded 29 tokens/s at batch 1, 50 us 40-42, 200 us 41-62, 1 ms 50-55 (asleep at once:
 * 30-33); batch 8 143 -> 203-235. */
#define POOL_AWAKE_US 1000
#define POOL_PAUSES 2048

/* Waits awake while (*v == x) == eq, for at most POOL_AWAKE_US; returns *v. */
static long spin_while(_Atomic long *v, long x, bool eq) {
  long now = atomic_load(v);
  int64_t end = 0;
  for (int i = 1; (now == x) == eq; i++) {
    _mm_pause();
    now = atomic_load(v);
    if ((i & 63) == 0) {
      int64_t t = lt_time_mono_us();
      if (!end) end = t + POOL_AWAKE_US;
      else if (t > end) break;
    }
    if (i > POOL_PAUSES) sched_yield();
  }
  return now;
}

typedef struct start {
  lt_cpu_pool_t *p;
  int tid;
} start_t;

static void *worker_main(void *arg) {
  start_t st = *(start_t *)arg;
  free(arg);
  lt_cpu_pool_t *p = st.p;
  long seen = 0;
  for (;;) {
    long g = spin_while(&p->gen, seen, true);
    if (g == seen) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);
      while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->go, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    if (p->quit) break;
    seen = g;
    p->fn(p->arg, st.tid, p->nt);
    if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->waiting)) {
      pthread_mutex_lock(&p->mu);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->mu);
    }
  }
  return NULL;
}

int lt_cpu_pool_start(lt_cpu_pool_t *p, int nt) {
  *p = (lt_cpu_pool_t){.nt = 1};
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->go, NULL);
  pthread_cond_init(&p->done, NULL);
  if (nt > 1 && !(p->threads = calloc((size_t)nt, sizeof *p->threads))) {
    lt_cpu_pool_stop(p);
    return 1;
  }
  for (int t = 1; t < nt; t++) {
    start_t *st = malloc(sizeof *st);
    if (st) *st = (start_t){p, t};
    if (!st || pthread_create(&p->threads[t], NULL, worker_main, st) != 0) {
      free(st);
      lt_cpu_pool_stop(p);
      return t;
    }
    p->nt = t + 1;
  }
  return 0;
}

void lt_cpu_pool_run(lt_cpu_pool_t *p, lt_cpu_pool_fn fn, void *arg) {
  if (p->nt == 1) {
    fn(arg, 0, 1);
    return;
  }
  p->fn = fn;
  p->arg = arg;
  atomic_store(&p->pending, p->nt - 1);
  atomic_fetch_add(&p->gen, 1);
  if (atomic_load(&p->sleepers)) {
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
  }
  fn(arg, 0, p->nt);
  if (!spin_while(&p->pending, 0, false)) return;
  pthread_mutex_lock(&p->mu);
  atomic_store(&p->waiting, 1);
  while (atomic_load(&p->pending)) pthread_cond_wait(&p->done, &p->mu);
  atomic_store(&p->waiting, 0);
  pthread_mutex_unlock(&p->mu);
}

void lt_cpu_pool_stop(lt_cpu_pool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->quit = 1;
  atomic_fetch_add(&p->gen, 1);
  pthread_cond_broadcast(&p->go);
  pthread_mutex_unlock(&p->mu);
  for (int t = 1; t < p->nt; t++) pthread_join(p->threads[t], NULL);
  free(p->threads);
  p->threads = NULL;
  p->nt = 1;
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->go);
  pthread_cond_destroy(&p->done);
}
