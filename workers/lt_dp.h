/* lt_dp: data parallelism across the executors of one gang (docs/DESIGN.md §7).
 *
 * The executors of a gang train one adapter data-parallel: each rank runs lt_forward_backward
 * on its share of the batch, the ranks all-reduce the gradient buffer
 * (lt_session_grad_buffer), each sets lt_session_set_accum to the number of micro-batches the
 * sum covers, and every rank applies the same lt_optim_step. This file is the CPU transport for
 * that: a rendezvous over TCP and a SUM whose order of additions is fixed, never timing's.
 *
 * Why a fixed order: float addition is not associative, so a sum whose order depends on which
 * peer answered first would give ranks different bits, and the gang a different adapter from one
 * process that accumulated the same micro-batches. Here every rank sends its buffer to rank 0,
 * rank 0 adds them in rank order, left to right ((b0 + b1) + b2) + ..., and sends the result
 * back: every rank gets the same bits, and they are the bits a single session gets by running
 * rank 0's micro-batch, then rank 1's, ... as lt_forward_backward calls (the engine adds each
 * call's gradient onto the buffer, 0 + g0 + g1 + ...; tests/test_dp.c checks it byte for byte).
 * That holds where each call adds one rounded value per gradient element: LoRA with alpha / r a
 * power of two and no dropout. OpenBLAS folds another scale into a fused multiply-add onto the
 * old gradient (rounded once, where a rank rounds its product before the sum), and dropout masks
 * follow each session's own call count: there the ranks still agree bit for bit and differ from
 * the single session within rounding (also checked).
 * A star through rank 0 moves (W - 1) buffers each way: right for a few CPU executors of LoRA
 * gradients (megabytes), not for a large world.
 *
 * Wire: one TCP connection from each rank r >= 1 to rank 0. Every message is a frame: a 32-byte
 * header (magic "LTDP", type, sequence number, sender rank, payload length, 64-bit checksum of
 * header and payload) and the payload. A hello carries the protocol version, the world size, the
 * sender's rank and the gang's token (job and attempt), so two gangs, or two attempts of one job,
 * never cross: rank 0 refuses a hello that does not match and keeps waiting for the right one.
 * Both ends must have the same float byte order (the hello checks it).
 *
 * Failures: every wait is bounded by the configured timeout. A peer that closes its connection
 * is LT_ERR_IO, a frame that does not verify LT_ERR_CORRUPT, a peer too slow LT_ERR_TIMEOUT, each
 * naming the rank. After any failure the handle is broken (LT_ERR_FATAL from then on) and its
 * connections are shut, so the other ranks fail at once rather than at their timeout.
 *
 * GPU: on the cuda backend the gradient buffer is device memory; the managed loop downloads it,
 * sums it here and uploads the sum (lt_train.c, gang_reduce; on cpu it sums in place). NCCL (lt_cuda_comm_t,
 * workers/engine/lt_backend_cuda.h) is not used across a gang: its bootstrap opens sockets of its
 * own, and an executor, confined, has none (lt_confine.h). lt_dp_ops_t below is the seam where a
 * transport over device buffers would plug in, keeping this rendezvous (NCCL's ring would sum
 * in its own order: the same bits on every rank, not a single process's).
 *
 * Threads: one handle is used by one thread at a time (the executor's training thread). */
#ifndef LT_DP_H
#define LT_DP_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>

#include "lt_err.h"

#define LT_DP_PROTO_VERSION 1
#define LT_DP_MAX_WORLD 1024
#define LT_DP_MAX_TOKEN 256

typedef struct lt_dp lt_dp_t;
typedef struct lt_dp_ops lt_dp_ops_t;

typedef struct lt_dp_conf {
  int rank, world;        /* 0 <= rank < world <= LT_DP_MAX_WORLD */
  const char *rendezvous; /* "host:port" (borrowed): rank 0 listens there, the others connect;
                             rank 0 may give port 0 for an ephemeral port (see on_listen) */
  const char *token;      /* the gang's identity, e.g. "<job>/<attempt>" (borrowed, 1..256 bytes) */
  int timeout_ms;         /* bound on the rendezvous and on each collective; > 0 */
  /* May be NULL: once *abort is set the rendezvous gives up within a second (a worker that
   * abandons a join: its listening port is free for the next attempt well before the timeout). */
  const atomic_int *abort;
  /* Rank 0 only, may be NULL: called once the socket listens, with the bound port, before it
   * waits for the others (how a test with port 0 tells the other ranks where to connect). */
  void (*on_listen)(void *ctx, int port);
  void *on_listen_ctx;
  /* The collectives after the rendezvous (borrowed, may be NULL): NULL is the TCP star of
   * lt_dp.c over host buffers. An NCCL transport would pass its own here, with its
   * communicator as ops_ctx (lt_dp_ops_ctx), and buffers in device memory. */
  const lt_dp_ops_t *ops;
  void *ops_ctx;
} lt_dp_conf_t;

/* The collectives, as a vtable (the seam where a transport over device buffers would plug in). */
struct lt_dp_ops {
  const char *name; /* "tcp", "nccl" */
  lt_err_t (*allreduce_sum)(lt_dp_t *dp, float *buf, size_t n, char *errstr, size_t errstr_size);
  lt_err_t (*barrier)(lt_dp_t *dp, char *errstr, size_t errstr_size);
};

/* conf->ops_ctx of the handle (for an lt_dp_ops_t implementation). */
void *lt_dp_ops_ctx(const lt_dp_t *dp);

/* Joins the gang: rank 0 listens and waits for ranks 1..world-1, the others connect (retrying
 * until the timeout) and say hello. Returns when the whole gang has joined, on every rank.
 * A refused hello (world size, token, protocol version, rank) is LT_ERR_INVALID saying which
 * field; a gang not complete within the timeout is LT_ERR_TIMEOUT naming the missing ranks
 * (rank 0, and the ranks that joined: they wait up to half the timeout, at most 2 s, past it
 * for rank 0's verdict) or the unreachable address (the others). The caller owns *out
 * (lt_dp_close). */
lt_err_t lt_dp_open(const lt_dp_conf_t *conf, lt_dp_t **out, char *errstr, size_t errstr_size);

/* In place: buf (n floats) becomes the sum over the ranks, through conf->ops. The TCP star
 * (host memory) adds in rank order, ((rank 0 + rank 1) + rank 2) + ..., bit-identical on every
 * rank. Every rank calls it with the same n, in the same order of collectives; a rank with
 * another n fails the call everywhere. */
lt_err_t lt_dp_allreduce_sum(lt_dp_t *dp, float *buf, size_t n, char *errstr,
                             size_t errstr_size);

/* Returns once every rank has entered it (an all-reduce of nothing). */
lt_err_t lt_dp_barrier(lt_dp_t *dp, char *errstr, size_t errstr_size);

/* The gang's connections outlive the process that made them: a worker (which may use the network)
 * joins the gang with lt_dp_open, takes the connections out with lt_dp_detach, and hands them to
 * its executor as inherited descriptors; the executor, confined with no network of its own
 * (lt_confine.h: no socket but AF_UNIX), takes them up with lt_dp_adopt and runs the collectives
 * on them. The connections are already verified (the hello checked world size, rank and token).
 *
 * lt_dp_detach: writes the handle's connections into fds and frees the handle without closing
 * them; the caller owns them. Rank 0 gets world - 1 of them (fds[r - 1] is rank r's), every
 * other rank one (rank 0's). Returns how many; -1 for a broken handle (its connections are shut:
 * nothing worth handing on), which is freed and closed. lt_dp_peer_count says how many first. */
int lt_dp_peer_count(const lt_dp_t *dp);
int lt_dp_detach(lt_dp_t *dp, int *fds);
/* The handle of a rank over connections from lt_dp_detach of the same rank (conf: rank, world,
 * token, timeout_ms, ops; rendezvous is not used and may be NULL). The handle owns the fds from
 * then on, even on failure (closed). Both ends of a connection must adopt before their first
 * collective: the collectives' sequence numbers start again at 0. LT_ERR_INVALID naming the
 * field for a conf lt_dp_open would refuse, or an fd that is not an open stream socket. */
lt_err_t lt_dp_adopt(const lt_dp_conf_t *conf, const int *fds, int nfds, lt_dp_t **out, char *errstr,
                     size_t errstr_size);

/* The token of attempt `attempt` of job `job_id`'s gang, "<job>/<attempt>", into buf (at least
 * LT_DP_MAX_TOKEN + 1 bytes): what the worker joins with and the executor adopts with. */
static inline void lt_dp_token(char *buf, size_t size, const char *job_id, int attempt) {
  snprintf(buf, size, "%.200s/%d", job_id, attempt);
}

int lt_dp_rank(const lt_dp_t *dp);
int lt_dp_world(const lt_dp_t *dp);

/* Closes the connections (a peer still waiting sees LT_ERR_IO) and frees. NULL-safe. */
void lt_dp_close(lt_dp_t *dp);

#endif
