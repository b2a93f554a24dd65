/* lt_worker_gang: a worker's join of a gang across workers (see lt_worker_gang.h). */
#include "lt_worker_gang.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_dp.h"

struct lt_wgang {
  pthread_mutex_t mu;
  pthread_t thread;
  int rank, world, timeout_ms, notify_fd;
  char rendezvous[300], token[LT_DP_MAX_TOKEN + 1];
  bool done, abandoned;
  atomic_int abort; /* set with abandoned: the rendezvous gives up (lt_dp_conf_t.abort) */
  lt_err_t err;
  char errstr[512];
  int fds[LT_WGANG_MAX_FDS], nfds;
};

static void close_all(lt_wgang_t *g) {
  for (int i = 0; i < g->nfds; i++) close(g->fds[i]);
  g->nfds = 0;
}

static void *join_main(void *p) {
  lt_wgang_t *g = p;
  lt_dp_conf_t c = {.rank = g->rank, .world = g->world, .rendezvous = g->rendezvous, .token = g->token,
                    .timeout_ms = g->timeout_ms, .abort = &g->abort};
  lt_dp_t *dp = NULL;
  char errstr[512];
  lt_err_t err = lt_dp_open(&c, &dp, errstr, sizeof errstr);
  int fds[LT_WGANG_MAX_FDS], n = 0;
  if (!err && (n = lt_dp_detach(dp, fds)) < 0)
    err = LT_ERR_IO, snprintf(errstr, sizeof errstr, "gang %s: the connections broke as they were joined", g->token);
  pthread_mutex_lock(&g->mu);
  g->err = err;
  if (err) snprintf(g->errstr, sizeof g->errstr, "%s", errstr);
  for (int i = 0; i < n; i++) g->fds[i] = fds[i];
  g->nfds = n > 0 ? n : 0;
  g->done = true;
  bool abandoned = g->abandoned;
  int notify_fd = g->notify_fd; /* past the unlock g is the attempt's (or freed), unless abandoned */
  pthread_mutex_unlock(&g->mu);
  char b = 'g';
  while (!abandoned && write(notify_fd, &b, 1) < 0 && errno == EINTR) {
  }
  close(notify_fd);
  if (abandoned) {
    close_all(g);
    pthread_mutex_destroy(&g->mu);
    free(g);
  }
  return NULL;
}

lt_err_t lt_wgang_start(const lt_wgang_conf_t *c, lt_wgang_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  if (c->world < 2 || c->world > LT_WGANG_MAX_FDS + 1 || c->rank < 0 || c->rank >= c->world)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "gang_rank %d of gang_world %d: expected 0 <= rank < world, "
                   "2 <= world <= %d", c->rank, c->world, LT_WGANG_MAX_FDS + 1);
  if (!c->rendezvous || !c->rendezvous[0] || strlen(c->rendezvous) >= 300)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "gang_rendezvous: want host:port");
  lt_wgang_t *g = calloc(1, sizeof *g);
  if (!g) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "gang: out of memory");
  g->rank = c->rank, g->world = c->world, g->timeout_ms = c->timeout_ms > 0 ? c->timeout_ms : 60000;
  snprintf(g->rendezvous, sizeof g->rendezvous, "%s", c->rendezvous);
  lt_dp_token(g->token, sizeof g->token, c->job_id, c->attempt);
  pthread_mutex_init(&g->mu, NULL);
  if ((g->notify_fd = fcntl(c->notify_fd, F_DUPFD_CLOEXEC, 0)) < 0 || pthread_create(&g->thread, NULL, join_main, g) != 0) {
    if (g->notify_fd >= 0) close(g->notify_fd);
    pthread_mutex_destroy(&g->mu);
    free(g);
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "gang: cannot start the join: %s", strerror(errno));
  }
  pthread_detach(g->thread);
  *out = g;
  return LT_OK;
}

lt_err_t lt_wgang_finish(lt_wgang_t *g, int *fds, int *nfds, char *errstr, size_t errstr_size) {
  pthread_mutex_lock(&g->mu);
  bool done = g->done;
  pthread_mutex_unlock(&g->mu);
  if (!done) return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE, "gang %s: the join is still going", g->token);
  lt_err_t err = g->err;
  if (err) lt_errf(errstr, errstr_size, err, "%s", g->errstr);
  for (int i = 0; i < g->nfds; i++) fds[i] = g->fds[i];
  *nfds = err ? 0 : g->nfds;
  if (err) close_all(g);
  pthread_mutex_destroy(&g->mu);
  free(g);
  return err;
}

void lt_wgang_abandon(lt_wgang_t *g) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  bool done = g->done;
  g->abandoned = true;
  atomic_store(&g->abort, 1); /* its port is free within a second, for the next attempt */
  pthread_mutex_unlock(&g->mu);
  if (!done) return; /* the thread frees it */
  close_all(g);
  pthread_mutex_destroy(&g->mu);
  free(g);
}
