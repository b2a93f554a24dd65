/* lt_worker_gang: a worker joins its part of a gang across workers (docs/DESIGN.md §6, §7).
 *
 * A gang's attempt is dispatched to several workers, one record each with its rank, the gang's
 * size and rank 0's rendezvous address (JobDispatched v2). Each worker, once its inputs are
 * fetched, joins the gang here — on a thread, since joining waits for the others (lt_dp_open:
 * rank 0 listens, the others connect; the hello checks world size, rank and the token
 * "<job>/<attempt>", so two gangs or two attempts of one job never cross) — then takes the
 * verified connections out (lt_dp_detach) and hands them to its executor as inherited
 * descriptors: the executor has no network of its own (lt_confine.h) and adopts them
 * (lt_dp_adopt) for its training loop's all-reduce (lt_train_conf_t.dp).
 *
 * Lifetime: the join runs on its own thread with its own copy of the notify descriptor; it
 * writes one byte ('g') there when it ends. lt_wgang_abandon() may be called at any time (the
 * attempt was stopped or fenced): the rendezvous gives up within a second (a listening rank 0
 * frees its port for the next attempt), and the thread then frees itself and closes what it
 * joined, never touching the attempt. */
#ifndef LT_WORKER_GANG_H
#define LT_WORKER_GANG_H

#include <stddef.h>

#include "lt_err.h"

/* Connections an executor can inherit: one per other rank at rank 0, so the largest gang is
 * LT_WGANG_MAX_FDS + 1 workers. */
#define LT_WGANG_MAX_FDS 8

typedef struct lt_wgang lt_wgang_t;

typedef struct lt_wgang_conf {
  int rank, world;          /* 0 <= rank < world, 2 <= world <= LT_WGANG_MAX_FDS + 1 */
  const char *rendezvous;   /* rank 0's "host:port" (copied) */
  const char *job_id;       /* with attempt: the gang's token */
  int attempt;
  int timeout_ms;           /* for the whole join */
  int notify_fd;            /* gets 'g' when the join ends (dup'ed: the caller may close its own) */
} lt_wgang_conf_t;

/* Starts the join. LT_ERR_INVALID naming the field for a conf that cannot join. */
lt_err_t lt_wgang_start(const lt_wgang_conf_t *c, lt_wgang_t **out, char *errstr, size_t errstr_size);

/* After the 'g': the connections (the caller owns them; *nfds of them) or why the join failed.
 * Frees g either way. */
lt_err_t lt_wgang_finish(lt_wgang_t *g, int *fds, int *nfds, char *errstr, size_t errstr_size);

/* The attempt no longer wants the join; g is not to be used again. NULL-safe. */
void lt_wgang_abandon(lt_wgang_t *g);

#endif
