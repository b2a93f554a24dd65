/* lt_tsan_c11: C11 threads on top of POSIX threads, linked only into ThreadSanitizer builds
 * (src/lib/meson.build).
 *
 * librdkafka runs its threads with C11 threads. glibc's thrd_create, mtx_* and cnd_* call the
 * library's internal pthread functions, not the exported ones ThreadSanitizer intercepts, so under
 * TSan a librdkafka thread starts without TSan's thread state (it crashes at its first malloc) and
 * its locks are invisible (every access under them would look like a race). An executable that
 * defines these functions is where librdkafka's calls bind (the executable comes first in symbol
 * lookup); each is the POSIX call TSan sees. The types are glibc's: thrd_t is a pthread_t, mtx_t
 * and cnd_t have pthread_mutex_t's and pthread_cond_t's size and alignment. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

_Static_assert(sizeof(thrd_t) == sizeof(pthread_t), "thrd_t is a pthread_t");
_Static_assert(sizeof(mtx_t) == sizeof(pthread_mutex_t), "mtx_t is a pthread_mutex_t");
_Static_assert(sizeof(cnd_t) == sizeof(pthread_cond_t), "cnd_t is a pthread_cond_t");

static int c11(int e) {
  switch (e) {
  case 0: return thrd_success;
  case ENOMEM:
  case EAGAIN: return thrd_nomem;
  case ETIMEDOUT: return thrd_timedout;
  case EBUSY: return thrd_busy;
  default: return thrd_error;
  }
}

typedef struct {
  thrd_start_t fn;
  void *arg;
} start_t;

static void *start(void *p) {
  start_t s = *(start_t *)p;
  free(p);
  return (void *)(intptr_t)s.fn(s.arg);
}

int thrd_create(thrd_t *thr, thrd_start_t fn, void *arg) {
  start_t *s = malloc(sizeof *s);
  if (!s) return thrd_nomem;
  *s = (start_t){fn, arg};
  int e = pthread_create((pthread_t *)thr, NULL, start, s);
  if (e) free(s);
  return c11(e);
}

int thrd_join(thrd_t thr, int *res) {
  void *v = NULL;
  int e = pthread_join((pthread_t)thr, &v);
  if (!e && res) *res = (int)(intptr_t)v;
  return c11(e);
}

int thrd_detach(thrd_t thr) { return c11(pthread_detach((pthread_t)thr)); }

_Noreturn void thrd_exit(int res) { pthread_exit((void *)(intptr_t)res); }

int mtx_init(mtx_t *m, int type) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, type & mtx_recursive ? PTHREAD_MUTEX_RECURSIVE : PTHREAD_MUTEX_NORMAL);
  int e = pthread_mutex_init((pthread_mutex_t *)m, &a);
  pthread_mutexattr_destroy(&a);
  return c11(e);
}

int mtx_lock(mtx_t *m) { return c11(pthread_mutex_lock((pthread_mutex_t *)m)); }
int mtx_trylock(mtx_t *m) { return c11(pthread_mutex_trylock((pthread_mutex_t *)m)); }
int mtx_timedlock(mtx_t *restrict m, const struct timespec *restrict ts) {
  return c11(pthread_mutex_timedlock((pthread_mutex_t *)m, ts));
}
int mtx_unlock(mtx_t *m) { return c11(pthread_mutex_unlock((pthread_mutex_t *)m)); }
void mtx_destroy(mtx_t *m) { pthread_mutex_destroy((pthread_mutex_t *)m); }

int cnd_init(cnd_t *c) { return c11(pthread_cond_init((pthread_cond_t *)c, NULL)); }
int cnd_signal(cnd_t *c) { return c11(pthread_cond_signal((pthread_cond_t *)c)); }
int cnd_broadcast(cnd_t *c) { return c11(pthread_cond_broadcast((pthread_cond_t *)c)); }
int cnd_wait(cnd_t *c, mtx_t *m) { return c11(pthread_cond_wait((pthread_cond_t *)c, (pthread_mutex_t *)m)); }
int cnd_timedwait(cnd_t *restrict c, mtx_t *restrict m, const struct timespec *restrict ts) {
  return c11(pthread_cond_timedwait((pthread_cond_t *)c, (pthread_mutex_t *)m, ts));
}
void cnd_destroy(cnd_t *c) { pthread_cond_destroy((pthread_cond_t *)c); }

_Static_assert(sizeof(once_flag) == sizeof(pthread_once_t), "once_flag is a pthread_once_t");
void call_once(once_flag *flag, void (*fn)(void)) { pthread_once((pthread_once_t *)flag, fn); }
