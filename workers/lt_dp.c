/* lt_dp: the rendezvous and the rank-ordered all-reduce of a data-parallel gang over TCP (see
 * lt_dp.h for why the order is fixed and what the wire carries). Every socket is non-blocking
 * and every wait is a poll bounded by a deadline on the monotonic clock, so no peer, dead or
 * talking garbage, holds a rank past its timeout. */
#include "lt_dp.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lt_time.h"

enum { F_HELLO = 1, F_WELCOME = 2, F_REFUSE = 3, F_DATA = 4, F_RESULT = 5 };
static const char *const frame_name[] = {"?", "hello", "welcome", "refusal", "data", "result"};

#define DP_MAGIC 0x5044544cu /* "LTDP" little-endian */
#define DP_ENDIAN 0x01020304u
#define HEAD_BYTES 32
#define HELLO_MAX (20 + LT_DP_MAX_TOKEN)
#define REFUSE_MAX 256
#define BIND_WAIT_MS 5000 /* rank 0: how long a rendezvous port in use is waited for */

struct lt_dp {
  const lt_dp_ops_t *ops;
  void *ops_ctx;
  int rank, world, timeout_ms;
  const atomic_int *abort; /* lt_dp_conf_t.abort: the rendezvous stops when set */
  int *fd;        /* rank 0: fd[r] is rank r's connection (r >= 1); others: fd[0] is rank 0's */
  uint32_t seq;   /* collectives so far; each frame of one carries its number */
  int broken;     /* a collective failed: the connections are shut */
  float *scratch; /* one peer's buffer (rank 0) or the result (the others), grown once */
  size_t scratch_cap;
  char token[LT_DP_MAX_TOKEN + 1];
  char where[300]; /* the rendezvous address, for messages */
};

/* ---- bytes, checksum, socket I/O with a deadline ------------------------------------------ */

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* 64-bit checksum of n bytes continuing from h, a word at a time (tail zero-padded). */
static uint64_t cks(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (;; p += 8, n -= 8) {
    uint64_t w = 0;
    if (n >= 8) memcpy(&w, p, 8);
    else if (n) memcpy(&w, p, n);
    else break;
    h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    if (n <= 8) break;
  }
  return h * 0xC2B2AE3D27D4EB4Full ^ (h >> 31);
}

enum { IO_OK, IO_EOF, IO_TIMEOUT, IO_ERR };

static bool aborted(const lt_dp_t *dp) { return dp->abort && atomic_load(dp->abort); }

/* Waits until fd is ready for `events` or the deadline passes. */
static int io_wait(int fd, short events, int64_t deadline) {
  for (;;) {
    int64_t left = deadline - lt_time_mono_ms();
    if (left <= 0) return IO_TIMEOUT;
    struct pollfd p = {.fd = fd, .events = events};
    int r = poll(&p, 1, left > 1000 ? 1000 : (int)left);
    if (r > 0) return IO_OK;
    if (r < 0 && errno != EINTR) return IO_ERR;
  }
}

static int io_write(int fd, const void *data, size_t n, int64_t deadline) {
  const char *p = data;
  while (n) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w, n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERR;
    int st = io_wait(fd, POLLOUT, deadline);
    if (st != IO_OK) return st;
  }
  return IO_OK;
}

static int io_read(int fd, void *data, size_t n, int64_t deadline) {
  char *p = data;
  while (n) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r, n -= (size_t)r;
      continue;
    }
    if (r == 0) return IO_EOF;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERR;
    int st = io_wait(fd, POLLIN, deadline);
    if (st != IO_OK) return st;
  }
  return IO_OK;
}

/* The error of an I/O status talking with rank `peer` while doing `what`. */
static lt_err_t io_fail(const lt_dp_t *dp, int st, int peer, const char *what, char *errstr,
                        size_t errstr_size) {
  if (st == IO_EOF)
    return lt_errf(errstr, errstr_size, LT_ERR_IO,
                   "dp rank %d: rank %d closed its connection during %s (did it die?)", dp->rank,
                   peer, what);
  if (st == IO_TIMEOUT)
    return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                   "dp rank %d: rank %d did not answer within %d ms during %s", dp->rank, peer,
                   dp->timeout_ms, what);
  return lt_errf(errstr, errstr_size, LT_ERR_IO, "dp rank %d: connection to rank %d, %s: %s",
                 dp->rank, peer, what, strerror(errno));
}

/* ---- frames -------------------------------------------------------------------------------- */

typedef struct frame {
  uint32_t type, seq, rank;
  uint64_t len;
} frame_t;

/* Sends one frame (header, then payload) to rank `peer` on fd. */
static lt_err_t frame_send(lt_dp_t *dp, int fd, int peer, uint32_t type, const void *payload,
                           size_t len, int64_t deadline, char *errstr, size_t errstr_size) {
  unsigned char h[HEAD_BYTES] = {0};
  put32(h, DP_MAGIC);
  put32(h + 4, type);
  put32(h + 8, dp->seq);
  put32(h + 12, (uint32_t)dp->rank);
  put64(h + 16, len);
  put64(h + 24, cks(cks(0, h, 24), payload, len));
  int st = io_write(fd, h, sizeof h, deadline);
  if (st == IO_OK && len) st = io_write(fd, payload, len, deadline);
  return st == IO_OK ? LT_OK : io_fail(dp, st, peer, frame_name[type], errstr, errstr_size);
}

/* Receives one frame from rank `peer` (-1: not yet known, a hello) into payload (cap bytes at
 * most). The frame must carry `type` (or F_REFUSE where refusal_ok), this collective's sequence
 * number, the sender's rank and a checksum that verifies: anything else is LT_ERR_CORRUPT. */
static lt_err_t frame_recv(lt_dp_t *dp, int fd, int peer, uint32_t type, int refusal_ok,
                           frame_t *f, void *payload, size_t cap, int64_t deadline,
                           char *errstr, size_t errstr_size) {
  unsigned char h[HEAD_BYTES];
  const char *what = frame_name[type];
  int st = io_read(fd, h, sizeof h, deadline);
  if (st != IO_OK) return io_fail(dp, st, peer, what, errstr, errstr_size);
  int who = peer < 0 ? (int)get32(h + 12) : peer;
  f->type = get32(h + 4), f->seq = get32(h + 8), f->rank = get32(h + 12), f->len = get64(h + 16);
  if (get32(h) != DP_MAGIC && peer < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "dp rank %d: a connection sent bytes that are not an lt_dp hello (bad magic; "
                   "not a rank of a gang?)", dp->rank);
  if (get32(h) != DP_MAGIC)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "dp rank %d: rank %d sent bytes that are not an lt_dp frame (bad magic) "
                   "where a %s was due", dp->rank, who, what);
  if (f->len > cap)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "dp rank %d: rank %d sent a %llu-byte %s, at most %zu expected", dp->rank,
                   who, (unsigned long long)f->len, what, cap);
  if (f->len && (st = io_read(fd, payload, f->len, deadline)) != IO_OK)
    return io_fail(dp, st, who, what, errstr, errstr_size);
  if (cks(cks(0, h, 24), payload, f->len) != get64(h + 24))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "dp rank %d: a %s from rank %d fails its checksum (damaged in transit)",
                   dp->rank, what, who);
  int type_ok = f->type == type || (refusal_ok && f->type == F_REFUSE);
  if (!type_ok || f->seq != dp->seq || (peer >= 0 && f->rank != (uint32_t)peer))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "dp rank %d: expected a %s #%u from rank %d, got frame type %u #%u from rank "
                   "%u (ranks out of step)", dp->rank, what, dp->seq, who, f->type, f->seq,
                   f->rank);
  return LT_OK;
}

/* ---- addresses and sockets ----------------------------------------------------------------- */

/* Splits "host:port" (host may be "[v6]") and resolves it. */
static lt_err_t resolve(const char *addr, int passive, struct addrinfo **res, char *errstr,
                        size_t errstr_size) {
  char host[256];
  const char *orig = addr, *colon = strrchr(addr, ':');
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (hl && addr[0] == '[' && addr[hl - 1] == ']') addr++, hl -= 2;
  if (!colon || !hl || hl >= sizeof host || !colon[1])
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "dp rendezvous \"%s\": expected HOST:PORT", orig);
  memcpy(host, addr, hl);
  host[hl] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  int rc = getaddrinfo(host, colon + 1, &hints, res);
  if (rc)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "dp rendezvous \"%s\": %s", orig,
                   gai_strerror(rc));
  return LT_OK;
}

static void sock_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0: listens on the rendezvous address and reports the bound port. */
static lt_err_t listen_open(lt_dp_t *dp, const lt_dp_conf_t *c, int *lfd, char *errstr,
                            size_t errstr_size) {
  struct addrinfo *res;
  lt_err_t err = resolve(c->rendezvous, 1, &res, errstr, errstr_size);
  if (err) return err;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1, bound = -1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  /* the port in use: the gang's previous attempt, abandoned, may hold it for up to a second more
   * (lt_dp_conf_t.abort); waited out for a few seconds, not the whole rendezvous */
  for (int64_t until = lt_time_mono_ms() + BIND_WAIT_MS;
       fd >= 0 && (bound = bind(fd, res->ai_addr, res->ai_addrlen)) != 0 && errno == EADDRINUSE &&
       lt_time_mono_ms() < until && !aborted(dp);)
    nanosleep(&(struct timespec){.tv_nsec = 50 * 1000000}, NULL);
  if (fd < 0 || bound != 0 || listen(fd, c->world)) {
    err = lt_errf(errstr, errstr_size, LT_ERR_IO, "dp rank 0: cannot listen on %s: %s",
                  c->rendezvous, strerror(errno));
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return err;
  }
  freeaddrinfo(res);
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(fd, (struct sockaddr *)&ss, &sl);
  int port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                            : ((struct sockaddr_in *)&ss)->sin_port);
  *lfd = fd;
  if (c->on_listen) c->on_listen(c->on_listen_ctx, port);
  return LT_OK;
}

/* One non-blocking connect attempt to ai, waiting at most until deadline. fd or -1. */
static int connect_once(const struct addrinfo *ai, int64_t deadline) {
  int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno == EINPROGRESS && io_wait(fd, POLLOUT, deadline) == IO_OK) {
    int so = 0;
    socklen_t sl = sizeof so;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) == 0 && so == 0) return fd;
    errno = so;
  }
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}

/* Ranks >= 1: connects to rank 0, retrying until the deadline (rank 0 may start later). */
static lt_err_t peer_connect(lt_dp_t *dp, const char *addr, int64_t deadline, char *errstr,
                             size_t errstr_size) {
  struct addrinfo *res;
  lt_err_t err = resolve(addr, 0, &res, errstr, errstr_size);
  if (err) return err;
  int last = ETIMEDOUT;
  while (dp->fd[0] < 0 && lt_time_mono_ms() < deadline && !aborted(dp)) {
    for (struct addrinfo *ai = res; ai && dp->fd[0] < 0; ai = ai->ai_next) {
      dp->fd[0] = connect_once(ai, deadline);
      if (dp->fd[0] < 0) last = errno;
    }
    if (dp->fd[0] < 0) nanosleep(&(struct timespec){.tv_nsec = 50 * 1000000}, NULL);
  }
  freeaddrinfo(res);
  if (dp->fd[0] < 0)
    return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                   "dp rank %d: rank 0 not reachable at %s within %d ms (last: %s)", dp->rank,
                   addr, dp->timeout_ms, strerror(last));
  sock_tune(dp->fd[0]);
  return LT_OK;
}

/* ---- rendezvous ---------------------------------------------------------------------------- */

/* The hello this rank sends: version, byte order, rank, world, token. Returns its length. */
static size_t hello_encode(const lt_dp_t *dp, unsigned char *p) {
  size_t tl = strlen(dp->token);
  put32(p, LT_DP_PROTO_VERSION);
  put32(p + 4, DP_ENDIAN);
  put32(p + 8, (uint32_t)dp->rank);
  put32(p + 12, (uint32_t)dp->world);
  put32(p + 16, (uint32_t)tl);
  memcpy(p + 20, dp->token, tl);
  return 20 + tl;
}

/* Rank 0: why a hello of `len` bytes cannot join this gang (into why), or 0 and *rank. */
static int hello_check(const lt_dp_t *dp, const unsigned char *p, size_t len, int *rank,
                       char *why, size_t why_size) {
  uint32_t ver = len >= 20 ? get32(p) : 0, r = len >= 20 ? get32(p + 8) : 0;
  uint32_t world = len >= 20 ? get32(p + 12) : 0, tl = len >= 20 ? get32(p + 16) : 0;
  if (len < 20 || tl != len - 20) snprintf(why, why_size, "malformed hello");
  else if (ver != LT_DP_PROTO_VERSION)
    snprintf(why, why_size, "protocol version %u, rank 0 speaks %d", ver, LT_DP_PROTO_VERSION);
  else if (get32(p + 4) != DP_ENDIAN) snprintf(why, why_size, "another float byte order");
  else if (world != (uint32_t)dp->world)
    snprintf(why, why_size, "world size %u, this gang's is %d", world, dp->world);
  else if (tl != strlen(dp->token) || memcmp(p + 20, dp->token, tl))
    snprintf(why, why_size, "token does not match this gang's (another job or attempt)");
  else if (r < 1 || r >= (uint32_t)dp->world)
    snprintf(why, why_size, "rank %u is not in 1..%d", r, dp->world - 1);
  else if (dp->fd[r] >= 0) snprintf(why, why_size, "rank %u has already joined", r);
  else {
    *rank = (int)r;
    return 0;
  }
  return -1;
}

/* Rank 0: takes one connection and its hello; a hello that does not fit is refused (the
 * connection closed, the reason kept in why) and the gang keeps waiting. */
static void accept_one(lt_dp_t *dp, int lfd, int64_t deadline, int *refused, char *why,
                       size_t why_size) {
  int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return;
  sock_tune(fd);
  unsigned char p[HELLO_MAX];
  frame_t f;
  char err[256];
  int rank = -1;
  int64_t hello_by = lt_time_mono_ms() + 1000; /* a silent stranger does not stall the gang */
  if (frame_recv(dp, fd, -1, F_HELLO, 0, &f, p, sizeof p, hello_by < deadline ? hello_by : deadline,
                 err, sizeof err)) {
    snprintf(why, why_size, "%s", err);
  } else if (hello_check(dp, p, f.len, &rank, why, why_size) == 0) {
    dp->fd[rank] = fd;
    return;
  } else {
    char msg[REFUSE_MAX];
    snprintf(msg, sizeof msg, "%s", why);
    frame_send(dp, fd, (int)f.rank, F_REFUSE, msg, strlen(msg), deadline, err, sizeof err);
  }
  (*refused)++;
  close(fd);
}

/* Rank 0: the names of the ranks not yet joined, e.g. "2, 3". */
static void missing_ranks(const lt_dp_t *dp, char *out, size_t size) {
  size_t o = 0;
  out[0] = 0;
  for (int r = 1; r < dp->world && o + 16 < size; r++)
    if (dp->fd[r] < 0) o += (size_t)snprintf(out + o, size - o, "%s%d", o ? ", " : "", r);
}

/* Rank 0: waits for ranks 1..world-1, then welcomes them all (or tells them it gave up). */
static lt_err_t root_gather(lt_dp_t *dp, int lfd, int64_t deadline, char *errstr,
                            size_t errstr_size) {
  int joined = 0, refused = 0;
  char why[256] = "";
  while (joined < dp->world - 1 && !aborted(dp)) {
    int64_t slice = lt_time_mono_ms() + 1000; /* aborted is looked at every second */
    int st = io_wait(lfd, POLLIN, slice < deadline ? slice : deadline);
    if (st == IO_TIMEOUT && slice < deadline) continue;
    if (st != IO_OK) break;
    accept_one(dp, lfd, deadline, &refused, why, sizeof why);
    joined = 0;
    for (int r = 1; r < dp->world; r++) joined += dp->fd[r] >= 0;
  }
  int complete = joined == dp->world - 1;
  char msg[REFUSE_MAX] = "", missing[128] = "", scratch[256];
  if (!complete) {
    missing_ranks(dp, missing, sizeof missing);
    snprintf(msg, sizeof msg, "rank 0 gave up: rank %s never joined within %d ms", missing,
             dp->timeout_ms);
  }
  for (int r = 1; r < dp->world; r++)
    if (dp->fd[r] >= 0 && frame_send(dp, dp->fd[r], r, complete ? F_WELCOME : F_REFUSE, msg,
                                     complete ? 0 : strlen(msg), deadline, scratch,
                                     sizeof scratch) && complete)
      return lt_errf(errstr, errstr_size, LT_ERR_IO, "%s", scratch);
  if (complete) return LT_OK;
  return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                 "dp rank 0 at %s: rank %s never joined within %d ms%s%s%s", dp->where, missing,
                 dp->timeout_ms, refused ? " (refused a connection: " : "", refused ? why : "",
                 refused ? ")" : "");
}

/* Ranks >= 1: says hello and waits for rank 0 to welcome the complete gang. */
static lt_err_t peer_join(lt_dp_t *dp, int64_t deadline, char *errstr, size_t errstr_size) {
  unsigned char p[HELLO_MAX];
  lt_err_t err = frame_send(dp, dp->fd[0], 0, F_HELLO, p, hello_encode(dp, p), deadline, errstr,
                            errstr_size);
  if (err) return err;
  char msg[REFUSE_MAX + 1];
  frame_t f;
  /* rank 0's verdict names the missing ranks: wait a little past our own deadline for it */
  int64_t verdict_by = deadline + (dp->timeout_ms / 2 < 2000 ? dp->timeout_ms / 2 : 2000);
  if ((err = frame_recv(dp, dp->fd[0], 0, F_WELCOME, 1, &f, msg, REFUSE_MAX, verdict_by, errstr,
                        errstr_size))) {
    if (err == LT_ERR_TIMEOUT)
      return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                     "dp rank %d: joined rank 0 at %s but the gang was not complete within %d ms",
                     dp->rank, dp->where, dp->timeout_ms);
    return err;
  }
  if (f.type == F_WELCOME) return LT_OK;
  msg[f.len] = 0;
  return lt_errf(errstr, errstr_size, strstr(msg, "gave up") ? LT_ERR_TIMEOUT : LT_ERR_INVALID,
                 "dp rank %d: rank 0 at %s refused to join: %s", dp->rank, dp->where, msg);
}

/* ---- collectives --------------------------------------------------------------------------- */

static lt_err_t scratch_ensure(lt_dp_t *dp, size_t n, char *errstr, size_t errstr_size) {
  if (n <= dp->scratch_cap) return LT_OK;
  float *p = realloc(dp->scratch, n * sizeof(float));
  if (!p) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "dp: %zu floats: out of memory", n);
  dp->scratch = p;
  dp->scratch_cap = n;
  return LT_OK;
}

/* Shuts every connection so the other ranks fail now, not at their timeout. */
static void dp_break(lt_dp_t *dp) {
  dp->broken = 1;
  for (int r = 0; r < dp->world; r++)
    if (dp->fd[r] >= 0) shutdown(dp->fd[r], SHUT_RDWR);
}

/* Rank 0: buf += rank 1's, then rank 2's, ... (left to right), then sends the sum back. */
static lt_err_t root_reduce(lt_dp_t *dp, float *buf, size_t n, int64_t deadline, char *errstr,
                            size_t errstr_size) {
  frame_t f;
  lt_err_t err;
  for (int r = 1; r < dp->world; r++) {
    if ((err = frame_recv(dp, dp->fd[r], r, F_DATA, 0, &f, dp->scratch, dp->scratch_cap *
                          sizeof(float), deadline, errstr, errstr_size)))
      return err;
    if (f.len != n * sizeof(float))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "dp rank 0: rank %d all-reduces %llu floats, rank 0 %zu: every rank must "
                     "reduce the same buffer", r, (unsigned long long)(f.len / sizeof(float)), n);
    const float *x = dp->scratch;
    for (size_t i = 0; i < n; i++) buf[i] += x[i];
  }
  for (int r = 1; r < dp->world; r++)
    if ((err = frame_send(dp, dp->fd[r], r, F_RESULT, buf, n * sizeof(float), deadline, errstr,
                          errstr_size)))
      return err;
  return LT_OK;
}

/* Ranks >= 1: sends buf to rank 0 and takes the sum it sends back. */
static lt_err_t peer_reduce(lt_dp_t *dp, float *buf, size_t n, int64_t deadline, char *errstr,
                            size_t errstr_size) {
  frame_t f = {0};
  lt_err_t err = frame_send(dp, dp->fd[0], 0, F_DATA, buf, n * sizeof(float), deadline, errstr,
                            errstr_size);
  if (!err)
    err = frame_recv(dp, dp->fd[0], 0, F_RESULT, 0, &f, dp->scratch, n * sizeof(float), deadline,
                     errstr, errstr_size);
  if (!err && f.len != n * sizeof(float))
    err = lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                  "dp rank %d: rank 0 sent a %llu-byte result for %zu floats", dp->rank,
                  (unsigned long long)f.len, n);
  if (!err && n) memcpy(buf, dp->scratch, n * sizeof(float));
  return err;
}

static lt_err_t tcp_allreduce_sum(lt_dp_t *dp, float *buf, size_t n, char *errstr,
                                  size_t errstr_size) {
  if (dp->broken)
    return lt_errf(errstr, errstr_size, LT_ERR_FATAL,
                   "dp rank %d: an earlier collective failed; the gang must start again",
                   dp->rank);
  if (dp->world == 1) return LT_OK;
  lt_err_t err = scratch_ensure(dp, n ? n : 1, errstr, errstr_size);
  if (err) return err;
  dp->seq++;
  int64_t deadline = lt_time_mono_ms() + dp->timeout_ms;
  err = dp->rank == 0 ? root_reduce(dp, buf, n, deadline, errstr, errstr_size)
                      : peer_reduce(dp, buf, n, deadline, errstr, errstr_size);
  if (err) dp_break(dp);
  return err;
}

static lt_err_t tcp_barrier(lt_dp_t *dp, char *errstr, size_t errstr_size) {
  float none = 0;
  return tcp_allreduce_sum(dp, &none, 0, errstr, errstr_size);
}

static const lt_dp_ops_t tcp_ops = {"tcp", tcp_allreduce_sum, tcp_barrier};

/* ---- lifecycle ----------------------------------------------------------------------------- */

static lt_err_t conf_check(const lt_dp_conf_t *c, bool adopting, char *errstr, size_t errstr_size) {
  if (c->world < 1 || c->world > LT_DP_MAX_WORLD || c->rank < 0 || c->rank >= c->world)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "dp: rank %d of world %d: expected 0 <= rank < world <= %d", c->rank, c->world,
                   LT_DP_MAX_WORLD);
  if (!c->token || !c->token[0] || strlen(c->token) > LT_DP_MAX_TOKEN)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "dp: the gang token must be 1..%d bytes (job and attempt)", LT_DP_MAX_TOKEN);
  if (c->timeout_ms <= 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "dp: timeout %d ms: expected > 0",
                   c->timeout_ms);
  if (c->world > 1 && (!c->rendezvous || strlen(c->rendezvous) >= 256) && !adopting)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "dp: a gang of %d needs a rendezvous HOST:PORT", c->world);
  return LT_OK;
}

/* A handle of conf c with no connection yet. */
static lt_err_t dp_new(const lt_dp_conf_t *c, lt_dp_t **out, char *errstr, size_t errstr_size) {
  lt_dp_t *dp = calloc(1, sizeof *dp);
  if (dp) dp->fd = malloc((size_t)c->world * sizeof *dp->fd);
  if (!dp || !dp->fd) {
    if (dp) free(dp);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "dp: out of memory");
  }
  for (int r = 0; r < c->world; r++) dp->fd[r] = -1;
  dp->ops = c->ops ? c->ops : &tcp_ops;
  dp->ops_ctx = c->ops_ctx;
  dp->rank = c->rank, dp->world = c->world, dp->timeout_ms = c->timeout_ms, dp->abort = c->abort;
  snprintf(dp->token, sizeof dp->token, "%s", c->token);
  snprintf(dp->where, sizeof dp->where, "%s", c->rendezvous ? c->rendezvous : "adopted connections");
  *out = dp;
  return LT_OK;
}

lt_err_t lt_dp_open(const lt_dp_conf_t *c, lt_dp_t **out, char *errstr, size_t errstr_size) {
  *out = NULL;
  lt_err_t err = conf_check(c, false, errstr, errstr_size);
  lt_dp_t *dp = NULL;
  if (!err) err = dp_new(c, &dp, errstr, errstr_size);
  if (err) return err;
  int64_t deadline = lt_time_mono_ms() + c->timeout_ms;
  if (c->world > 1 && c->rank == 0) {
    int lfd = -1;
    err = listen_open(dp, c, &lfd, errstr, errstr_size);
    if (!err) err = root_gather(dp, lfd, deadline, errstr, errstr_size);
    if (lfd >= 0) close(lfd);
  } else if (c->world > 1) {
    /* rank 0 of an earlier attempt of the gang may hold the address for a second more
     * (abandoned: lt_dp_conf_t.abort): its refusal of this attempt's token, or its closing before
     * a verdict, is tried again until the deadline, and the last error kept */
    for (;;) {
      err = peer_connect(dp, c->rendezvous, deadline, errstr, errstr_size);
      if (!err) err = peer_join(dp, deadline, errstr, errstr_size);
      bool stale = err == LT_ERR_IO || (err == LT_ERR_INVALID && strstr(errstr, "token does not match"));
      if (!stale || aborted(dp) || lt_time_mono_ms() + 100 >= deadline) break;
      close(dp->fd[0]);
      dp->fd[0] = -1;
      nanosleep(&(struct timespec){.tv_nsec = 100 * 1000000}, NULL);
    }
  }
  if (err) {
    lt_dp_close(dp);
    return err;
  }
  *out = dp;
  return LT_OK;
}

lt_err_t lt_dp_allreduce_sum(lt_dp_t *dp, float *buf, size_t n, char *errstr,
                             size_t errstr_size) {
  return dp->ops->allreduce_sum(dp, buf, n, errstr, errstr_size);
}

lt_err_t lt_dp_barrier(lt_dp_t *dp, char *errstr, size_t errstr_size) {
  return dp->ops->barrier(dp, errstr, errstr_size);
}

int lt_dp_peer_count(const lt_dp_t *dp) { return dp->world == 1 ? 0 : dp->rank == 0 ? dp->world - 1 : 1; }

int lt_dp_detach(lt_dp_t *dp, int *fds) {
  int n = lt_dp_peer_count(dp);
  if (dp->broken) {
    lt_dp_close(dp);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    int r = dp->rank == 0 ? i + 1 : 0;
    fds[i] = dp->fd[r];
    dp->fd[r] = -1;
  }
  lt_dp_close(dp);
  return n;
}

lt_err_t lt_dp_adopt(const lt_dp_conf_t *c, const int *fds, int nfds, lt_dp_t **out, char *errstr,
                     size_t errstr_size) {
  *out = NULL;
  lt_err_t err = conf_check(c, true, errstr, errstr_size);
  lt_dp_t *dp = NULL;
  if (!err) err = dp_new(c, &dp, errstr, errstr_size);
  int want = c->world == 1 ? 0 : c->rank == 0 ? c->world - 1 : 1;
  if (!err && nfds != want)
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "dp: adopt: rank %d of %d takes %d connections, not %d",
                  c->rank, c->world, want, nfds);
  for (int i = 0; i < nfds; i++) {
    int type = 0;
    socklen_t tl = sizeof type;
    if (!err && (getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM))
      err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "dp: adopt: fds[%d] = %d is not an open stream socket",
                    i, fds[i]);
    if (dp && i < want) dp->fd[c->rank == 0 ? i + 1 : 0] = fds[i];
    else close(fds[i]);
  }
  for (int i = 0; !err && i < nfds; i++) {
    int fl = fcntl(fds[i], F_GETFL);
    if (fl < 0 || fcntl(fds[i], F_SETFL, fl | O_NONBLOCK) != 0)
      err = lt_errf(errstr, errstr_size, LT_ERR_IO, "dp: adopt: fds[%d]: cannot make it non-blocking", i);
  }
  if (err) {
    lt_dp_close(dp);
    return err;
  }
  *out = dp;
  return LT_OK;
}

int lt_dp_rank(const lt_dp_t *dp) { return dp->rank; }
void *lt_dp_ops_ctx(const lt_dp_t *dp) { return dp->ops_ctx; }
int lt_dp_world(const lt_dp_t *dp) { return dp->world; }

void lt_dp_close(lt_dp_t *dp) {
  if (!dp) return;
  for (int r = 0; r < dp->world; r++)
    if (dp->fd[r] >= 0) close(dp->fd[r]);
  free(dp->fd);
  free(dp->scratch);
  free(dp);
}
