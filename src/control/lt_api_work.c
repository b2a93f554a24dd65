/* lt_api_work: the API's thread pool for blocking work — tokenizing and validating upload parts,
 * encryption, object-store calls — so that the event loop only parses, routes and answers, and
 * one tenant's 8 MiB part does not stall another tenant's GET (bench/bench_api_stall.c measures
 * it).
 *
 * A handler hands over a task (work on a pool thread, then after on the loop thread) and returns
 * without replying; after replies. evhttp keeps a request valid until it is answered, even when
 * the client went away meanwhile: libevent 2.1 does not see a close before a reply has started,
 * and the reply's failed write then frees the request and its connection.
 *
 * Fair across tenants: a free thread takes the oldest task of the tenant with the fewest tasks
 * running, and no tenant runs on more than all threads but one, so that a tenant whose store
 * calls hang (or that sends many parts at once) leaves a thread to the others
 * (tests/test_api_data.c).
 * With conf.work_threads < 0 a task runs at once on the loop thread (the path before the pool;
 * the benchmark compares the two).
 *
 * Threads: lt_api_work and the after functions run on the loop thread; work functions run on a
 * pool thread and touch only their task's context (no loop state, no evhttp call; the one
 * exception, lt_api_stored_mark's counter, is atomic). */
#include "lt_api_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORK_THREADS_DEFAULT 4

typedef struct task {
  lt_api_work_fn *work;
  lt_api_after_fn *after;
  void *ctx;
  char tenant[LT_ID_MAX + 1];
  struct task *next;
} task_t;

typedef struct running {
  char tenant[LT_ID_MAX + 1];
  int n;
} running_t;

struct lt_api_pool {
  lt_api_t *api;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  task_t *queue;       /* FIFO, under mu */
  task_t *done;        /* finished, waiting for the loop (LIFO, reversed when run), under mu */
  running_t *running;  /* one row per thread: the tenants of the tasks running, under mu */
  struct event *done_ev;
  pthread_t *threads;
  int nthreads;
  bool stopping;
};

/* The count of running tasks of a tenant; with add, changes it by add first. Under mu. */
static int running_count(lt_api_pool_t *p, const char *tenant, int add) {
  running_t *free_row = NULL;
  for (int i = 0; i < p->nthreads; i++) {
    running_t *r = &p->running[i];
    if (r->n > 0 && strcmp(r->tenant, tenant) == 0) {
      r->n += add;
      return r->n;
    }
    if (r->n == 0 && !free_row) free_row = r;
  }
  if (add > 0 && free_row) { /* there is always one: at most nthreads tasks run */
    snprintf(free_row->tenant, sizeof free_row->tenant, "%s", tenant);
    free_row->n = add;
    return add;
  }
  return 0;
}

/* Most tasks one tenant runs at once: every thread but one (with one thread, that one). */
static int per_tenant(const lt_api_pool_t *p) { return p->nthreads > 1 ? p->nthreads - 1 : 1; }

/* Unlinks the oldest queued task of the tenant with the fewest running, among tenants under
 * per_tenant; NULL when no task may run now. Under mu. */
static task_t *take(lt_api_pool_t *p) {
  task_t **best = NULL;
  int best_n = 0;
  for (task_t **pp = &p->queue; *pp; pp = &(*pp)->next) {
    int n = running_count(p, (*pp)->tenant, 0);
    if (n >= per_tenant(p)) continue;
    if (!best || n < best_n) {
      best = pp;
      best_n = n;
      if (n == 0) break;
    }
  }
  if (!best) return NULL;
  task_t *t = *best;
  *best = t->next;
  t->next = NULL;
  return t;
}

static void *worker_main(void *arg) {
  lt_api_pool_t *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    task_t *t;
    /* A queued task of a tenant at its share waits for one of that tenant's tasks to end. */
    while (!(t = take(p)) && !(p->stopping && !p->queue)) pthread_cond_wait(&p->cv, &p->mu);
    if (!t) break; /* stopping, and nothing left */
    running_count(p, t->tenant, 1);
    pthread_mutex_unlock(&p->mu);
    t->work(t->ctx);
    pthread_mutex_lock(&p->mu);
    running_count(p, t->tenant, -1);
    t->next = p->done;
    p->done = t;
    pthread_cond_broadcast(&p->cv); /* a task held back by its tenant's share may run now */
    event_active(p->done_ev, 0, 0);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* On the loop thread: the after functions of finished tasks, in the order they finished. */
static void run_done(evutil_socket_t fd, short what, void *arg) {
  lt_api_pool_t *p = arg;
  (void)fd, (void)what;
  pthread_mutex_lock(&p->mu);
  task_t *list = p->done, *rev = NULL;
  p->done = NULL;
  pthread_mutex_unlock(&p->mu);
  while (list) {
    task_t *next = list->next;
    list->next = rev;
    rev = list;
    list = next;
  }
  while (rev) {
    task_t *next = rev->next;
    rev->after(p->api, rev->ctx);
    free(rev);
    rev = next;
  }
}

lt_err_t lt_api_work_start(lt_api_t *api, char *errstr, size_t n) {
  int threads = api->conf.work_threads ? api->conf.work_threads : WORK_THREADS_DEFAULT;
  if (threads < 0) return LT_OK; /* inline */
  lt_api_pool_t *p = calloc(1, sizeof *p);
  if (!p) return LT_ERR_NOMEM;
  api->pool = p;
  p->api = api;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->threads = calloc((size_t)threads, sizeof *p->threads);
  p->running = calloc((size_t)threads, sizeof *p->running);
  p->done_ev = event_new(api->base, -1, 0, run_done, p);
  if (!p->threads || !p->running || !p->done_ev) return lt_errf(errstr, n, LT_ERR_NOMEM, "api pool: no memory");
  for (; p->nthreads < threads; p->nthreads++)
    if (pthread_create(&p->threads[p->nthreads], NULL, worker_main, p))
      return lt_errf(errstr, n, LT_ERR_IO, "api pool: cannot start thread %d of %d", p->nthreads + 1, threads);
  return LT_OK;
}

void lt_api_work(lt_api_t *api, const char *tenant, lt_api_work_fn *work, lt_api_after_fn *after, void *ctx) {
  lt_api_pool_t *p = api->pool;
  task_t *t = p ? calloc(1, sizeof *t) : NULL;
  if (!t) { /* inline (or out of memory: still answered, only on this thread) */
    work(ctx);
    after(api, ctx);
    return;
  }
  t->work = work;
  t->after = after;
  t->ctx = ctx;
  snprintf(t->tenant, sizeof t->tenant, "%s", tenant ? tenant : "");
  pthread_mutex_lock(&p->mu);
  task_t **pp = &p->queue;
  while (*pp) pp = &(*pp)->next;
  *pp = t;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void lt_api_work_stop(lt_api_t *api) {
  lt_api_pool_t *p = api->pool;
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  p->stopping = true;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  api->pool = NULL; /* work an answer below starts (an upload's abort) runs inline: no thread is left */
  if (p->done_ev) run_done(-1, 0, p); /* every queued task ran; answer them before evhttp goes */
  if (p->done_ev) event_free(p->done_ev);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->cv);
  free(p->threads);
  free(p->running);
  free(p);
  api->pool = NULL;
}
