/* Tests of workers/lt_dp (the data-parallel gang's rendezvous and all-reduce) and of the engine's
 * seam for it (lt_session_grad_buffer, lt_session_set_accum). Ranks are threads of this process
 * on loopback; rank 0 binds an ephemeral port and posts it on a board the others read. What must
 * hold: the sum is rank-ordered and bit-identical on every rank; two ranks training on the two
 * halves of each batch end with the adapter of one session that accumulated both halves, byte
 * for byte; a hello of another world size or gang is refused by name; a rank that never comes,
 * a rank 0 that is not there, a peer that closes mid-reduce and a stranger talking garbage each
 * give a clear error within the timeout, never a hang. The managed loop as a gang of two
 * (lt_train_conf_t.dp) trains one executor's adapter (bit for bit when each rank runs one
 * micro-batch a step, within rounding when more), and one rank's preemption stops both at one
 * step. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lt_confine.h"
#include "lt_dp.h"
#include "lt_engine.h"
#include "lt_task.h"
#include "lt_test.h"
#include "lt_time.h"
#include "lt_train.h"
#include "lt_worker_gang.h"

/* ---- a gang of threads --------------------------------------------------------------------- */

/* Where rank 0 posts its port for the others. */
typedef struct board {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int port;
} board_t;

static void board_post(void *ctx, int port) {
  board_t *b = ctx;
  pthread_mutex_lock(&b->mu);
  b->port = port;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

static int board_wait(board_t *b) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += 20;
  pthread_mutex_lock(&b->mu);
  while (!b->port && pthread_cond_timedwait(&b->cv, &b->mu, &ts) == 0) {
  }
  int port = b->port;
  pthread_mutex_unlock(&b->mu);
  return port;
}

typedef struct rank_job rank_job_t;
struct rank_job {
  board_t *board;
  int rank, world, timeout_ms, connect_port; /* connect_port: fixed port instead of the board */
  const char *token;
  int delay_ms;                        /* before connecting */
  lt_err_t (*body)(rank_job_t *j, lt_dp_t *dp); /* after a successful open; may be NULL */
  void *arg;
  const lt_dp_ops_t *ops; /* the conf's collectives (NULL: TCP) */
  void *ops_ctx;
  lt_err_t err; /* of lt_dp_open, else of body */
  char errstr[512];
  int64_t ms;   /* how long the rank ran */
  float buf[1000];
  size_t n;
  bool detach;  /* take the connections out of the handle (lt_dp_detach) into keep */
  int keep[4], nkeep;
};

static void *rank_main(void *p) {
  rank_job_t *j = p;
  int64_t t0 = lt_time_mono_ms();
  char addr[64] = "127.0.0.1:0";
  if (j->rank != 0) {
    int port = j->connect_port ? j->connect_port : board_wait(j->board);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    if (j->delay_ms) lt_test_msleep(j->delay_ms);
  }
  lt_dp_conf_t c = {.rank = j->rank, .world = j->world, .rendezvous = addr, .token = j->token,
                    .timeout_ms = j->timeout_ms, .on_listen = board_post,
                    .on_listen_ctx = j->board, .ops = j->ops, .ops_ctx = j->ops_ctx};
  lt_dp_t *dp = NULL;
  j->err = lt_dp_open(&c, &dp, j->errstr, sizeof j->errstr);
  if (!j->err && j->body) j->err = j->body(j, dp);
  if (!j->err && j->detach) j->nkeep = lt_dp_detach(dp, j->keep);
  else lt_dp_close(dp);
  j->ms = lt_time_mono_ms() - t0;
  return NULL;
}

/* Runs the n jobs as one gang (each on its own thread) and waits for all of them. */
static void run_gang(rank_job_t *jobs, int n) {
  static board_t board;
  memset(&board, 0, sizeof board);
  pthread_mutex_init(&board.mu, NULL);
  pthread_cond_init(&board.cv, NULL);
  pthread_t th[8];
  for (int i = 0; i < n; i++) {
    jobs[i].board = &board;
    cr_assert_eq(pthread_create(&th[i], NULL, rank_main, &jobs[i]), 0);
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&board.mu);
  pthread_cond_destroy(&board.cv);
}

static rank_job_t job(int rank, int world, const char *token, int timeout_ms,
                      lt_err_t (*body)(rank_job_t *, lt_dp_t *)) {
  return (rank_job_t){.rank = rank, .world = world, .token = token, .timeout_ms = timeout_ms,
                      .body = body};
}

static void assert_fails(const rank_job_t *j, lt_err_t want, const char *needle) {
  cr_assert_eq(j->err, want, "rank %d: %s, expected %s (%s)", j->rank, lt_err_name(j->err),
               lt_err_name(want), j->errstr);
  cr_assert_not_null(strstr(j->errstr, needle), "rank %d: \"%s\" does not say \"%s\"", j->rank,
                     j->errstr, needle);
}

/* ---- the sum ------------------------------------------------------------------------------- */

/* Rank r's contribution: values over six orders of magnitude, so the order of additions shows. */
static void contribution(int r, float *x, size_t n) {
  unsigned s = 1000u + (unsigned)r;
  for (size_t i = 0; i < n; i++) {
    double m = (double)rand_r(&s) / RAND_MAX - 0.5, e = (double)(rand_r(&s) % 7) - 3;
    x[i] = (float)(m * pow(10.0, e));
  }
}

static lt_err_t reduce_twice(rank_job_t *j, lt_dp_t *dp) {
  j->n = sizeof j->buf / sizeof j->buf[0];
  contribution(j->rank, j->buf, j->n);
  float again[1000];
  memcpy(again, j->buf, sizeof again);
  lt_err_t err = lt_dp_allreduce_sum(dp, j->buf, j->n, j->errstr, sizeof j->errstr);
  if (!err) err = lt_dp_barrier(dp, j->errstr, sizeof j->errstr);
  if (!err) err = lt_dp_allreduce_sum(dp, again, j->n, j->errstr, sizeof j->errstr);
  if (!err && memcmp(again, j->buf, sizeof again))
    return lt_errf(j->errstr, sizeof j->errstr, LT_ERR_INTERNAL, "a second reduce differs");
  return err;
}

Test(dp, allreduce_of_three_ranks_is_the_rank_ordered_sum_with_the_same_bits_everywhere) {
  rank_job_t g[3];
  for (int r = 0; r < 3; r++) g[r] = job(r, 3, "job-a/1", 10000, reduce_twice);
  run_gang(g, 3);
  size_t n = 1000;
  float x[1000], want[1000], reversed[1000];
  contribution(0, want, n);
  for (int r = 1; r < 3; r++) {
    contribution(r, x, n);
    for (size_t i = 0; i < n; i++) want[i] += x[i];
  }
  contribution(2, reversed, n);
  for (int r = 1; r >= 0; r--) {
    contribution(r, x, n);
    for (size_t i = 0; i < n; i++) reversed[i] += x[i];
  }
  cr_assert_neq(memcmp(want, reversed, sizeof want), 0, "the data cannot tell orders apart");
  for (int r = 0; r < 3; r++) {
    cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
    cr_assert_eq(memcmp(g[r].buf, want, sizeof want), 0, "rank %d: not ((b0 + b1) + b2)", r);
  }
}

/* ---- data-parallel training equals accumulation -------------------------------------------- */

#define STEPS 3
#define SEQ 16

typedef struct train_ctx {
  char model[300], out[300];
  int32_t tok[STEPS][2 * SEQ], tgt[STEPS][2 * SEQ]; /* each step's batch: row 0, row 1 */
  lt_session_config_t cfg;
} train_ctx_t;

static const lt_session_config_t lora_cfg = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL,
                                             .seed = 11};
static const lt_adamw_t adamw = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.01f, .max_grad_norm = 0.5f};

/* Trains STEPS steps: with dp, row `rank` of each batch then an all-reduce; without, both rows
 * as two accumulated calls. Writes the adapter to `path`. */
static lt_err_t train(const train_ctx_t *c, lt_dp_t *dp, const char *path, char *errstr,
                      size_t errstr_size) {
  lt_backend_t *be = NULL;
  lt_engine_t *eng = NULL;
  lt_session_t *s = NULL;
  lt_err_t err = lt_backend_cpu_new(1, &be, errstr, errstr_size);
  if (!err) err = lt_engine_open(c->model, be, &eng, errstr, errstr_size);
  if (!err) err = lt_session_new(eng, &c->cfg, &s, errstr, errstr_size);
  for (int k = 0; k < STEPS && !err; k++) {
    for (int row = 0; row < 2 && !err; row++) {
      if (dp && row != lt_dp_rank(dp)) continue;
      lt_batch_t b = {.B = 1, .T = SEQ, .tokens = c->tok[k] + row * SEQ,
                      .targets = c->tgt[k] + row * SEQ};
      err = lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errstr, errstr_size);
    }
    if (dp && !err) {
      size_t n;
      float *g = lt_session_grad_buffer(s, &n);
      err = lt_dp_allreduce_sum(dp, g, n, errstr, errstr_size);
      if (!err) err = lt_session_set_accum(s, lt_dp_world(dp), errstr, errstr_size);
    }
    if (!err) err = lt_optim_step(s, &adamw, NULL, errstr, errstr_size);
  }
  if (!err) err = lt_dump_tensors(s, 0, path, errstr, errstr_size);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  return err;
}

static lt_err_t train_rank(rank_job_t *j, lt_dp_t *dp) {
  const train_ctx_t *c = j->arg;
  char path[400];
  snprintf(path, sizeof path, "%s/rank%d.safetensors", c->out, j->rank);
  return train(c, dp, path, j->errstr, sizeof j->errstr);
}

/* The adapters of one session accumulating both halves of each batch (out[0]) and of ranks 0
 * and 1 training on one half each (out[1], out[2]), as safetensors bytes (lengths in len). */
static void dp_vs_one(float alpha, char *out[3], size_t len[3]) {
  static train_ctx_t c;
  char root[] = "/tmp/lt-dp-test-XXXXXX", err[512], path[400];
  cr_assert_not_null(mkdtemp(root));
  snprintf(c.model, sizeof c.model, "%s/model", root);
  snprintf(c.out, sizeof c.out, "%s", root);
  c.cfg = lora_cfg;
  c.cfg.alpha = alpha;
  lt_model_config_t mc = {.vocab_size = 67, .hidden_size = 32, .intermediate_size = 44,
                          .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 8,
                          .max_position = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_linear_factor = 1.0f};
  cr_assert_eq(lt_model_init_random(&mc, c.model, 3, 0.3f, 0.1f, err, sizeof err), LT_OK, "%s",
               err);
  unsigned rs = 7;
  for (int k = 0; k < STEPS; k++)
    for (int i = 0; i < 2 * SEQ; i++) {
      c.tok[k][i] = (int32_t)(rand_r(&rs) % mc.vocab_size);
      c.tgt[k][i] = (int32_t)(rand_r(&rs) % mc.vocab_size);
    }
  snprintf(path, sizeof path, "%s/one.safetensors", root);
  cr_assert_eq(train(&c, NULL, path, err, sizeof err), LT_OK, "one session: %s", err);
  out[0] = lt_test_slurp(path, &len[0]);
  rank_job_t g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = job(r, 2, "job-b/1", 30000, train_rank);
    g[r].arg = &c;
  }
  run_gang(g, 2);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
    snprintf(path, sizeof path, "%s/rank%d.safetensors", root, r);
    out[1 + r] = lt_test_slurp(path, &len[1 + r]);
  }
  cr_assert(out[0] && out[1] && out[2]);
  lt_test_rm_rf(root);
}

/* lora alpha / r = 2: the engine adds each call's gradient onto the buffer as one rounded value
 * per element (0 + g0 + g1), which is exactly what the rank-ordered sum computes. */
Test(dp, two_ranks_on_half_batches_give_the_accumulating_session_adapter_byte_for_byte,
     .timeout = 120) {
  char *a[3];
  size_t n[3];
  dp_vs_one(8, a, n);
  cr_assert(n[1] == n[0] && memcmp(a[1], a[0], n[0]) == 0,
            "rank 0's adapter differs from one session's");
  cr_assert(n[2] == n[0] && memcmp(a[2], a[0], n[0]) == 0,
            "rank 1's adapter differs from one session's");
  for (int i = 0; i < 3; i++) free(a[i]);
}

/* lora alpha / r = 1.5: OpenBLAS folds the scale into a fused multiply-add onto the old
 * gradient, g0 + 1.5 * p1 rounded once, where a rank rounds 1.5 * p1 before the sum. The ranks
 * still agree bit for bit; the single session differs only in the last bits. */
Test(dp, with_a_scale_that_rounds_the_ranks_agree_and_match_one_session_within_rounding,
     .timeout = 120) {
  char *a[3];
  size_t n[3];
  dp_vs_one(6, a, n);
  cr_assert(n[1] == n[2] && memcmp(a[1], a[2], n[1]) == 0, "the ranks' adapters differ");
  cr_assert_eq(n[1], n[0]);
  uint64_t hl = 0;
  memcpy(&hl, a[0], 8); /* safetensors: header length, header, then the F32 payload */
  cr_assert_eq(memcmp(a[0], a[1], 8 + hl), 0, "the tensors' names or shapes differ");
  double worst = 0, scale = 0;
  for (size_t o = 8 + hl; o + sizeof(float) <= n[0]; o += sizeof(float)) {
    float x, y;
    memcpy(&x, a[0] + o, sizeof x);
    memcpy(&y, a[1] + o, sizeof y);
    worst = fmax(worst, fabs((double)x - y));
    scale = fmax(scale, fabs((double)x));
  }
  /* the last bits of float sums over a few steps, in the order the chip's BLAS kernels take: an
   * AVX2-only AMD EPYC gave 1.6e-5 of the scale, AVX-512 machines under 1e-5 */
  cr_assert_lt(worst, 1e-4 * scale, "dp vs one session: %g (scale %g)", worst, scale);
  for (int i = 0; i < 3; i++) free(a[i]);
}

Test(dp, set_accum_refuses_a_count_below_one) {
  char root[] = "/tmp/lt-dp-test-XXXXXX", model[300], err[512];
  cr_assert_not_null(mkdtemp(root));
  snprintf(model, sizeof model, "%s/model", root);
  lt_model_config_t mc = {.vocab_size = 17, .hidden_size = 8, .intermediate_size = 12,
                          .num_layers = 1, .num_heads = 2, .num_kv_heads = 2, .head_dim = 4,
                          .max_position = 16, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_linear_factor = 1.0f};
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *s;
  cr_assert_eq(lt_model_init_random(&mc, model, 3, 0.3f, 0.1f, err, sizeof err), LT_OK);
  cr_assert_eq(lt_backend_cpu_new(1, &be, err, sizeof err), LT_OK);
  cr_assert_eq(lt_engine_open(model, be, &eng, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_session_new(eng, &lora_cfg, &s, err, sizeof err), LT_OK, "%s", err);
  size_t n;
  cr_assert_not_null(lt_session_grad_buffer(s, &n));
  cr_assert_eq(n, lt_session_num_params(s));
  cr_assert_eq(lt_session_set_accum(s, 0, err, sizeof err), LT_ERR_INVALID);
  cr_assert_not_null(strstr(err, "micro-batches"), "%s", err);
  /* a set count is what optim_step needs: no forward_backward, yet a (zero) gradient to apply */
  cr_assert_eq(lt_session_set_accum(s, 2, err, sizeof err), LT_OK);
  cr_assert_eq(lt_optim_step(s, &adamw, NULL, err, sizeof err), LT_OK, "%s", err);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  lt_test_rm_rf(root);
}

/* ---- refusals and failures ----------------------------------------------------------------- */

Test(dp, a_hello_with_another_world_size_or_token_is_refused_by_name) {
  rank_job_t g[2] = {job(0, 2, "job-c/1", 1500, NULL), job(1, 3, "job-c/1", 1500, NULL)};
  run_gang(g, 2);
  assert_fails(&g[1], LT_ERR_INVALID, "world size 3, this gang's is 2");
  assert_fails(&g[0], LT_ERR_TIMEOUT, "rank 1 never joined");
  assert_fails(&g[0], LT_ERR_TIMEOUT, "world size 3");

  rank_job_t h[2] = {job(0, 2, "job-c/1", 1500, NULL), job(1, 2, "job-c/2", 1500, NULL)};
  run_gang(h, 2);
  assert_fails(&h[1], LT_ERR_INVALID, "token does not match");
  assert_fails(&h[0], LT_ERR_TIMEOUT, "rank 1 never joined");
}

Test(dp, a_rank_that_never_connects_times_out_naming_it) {
  rank_job_t g[2] = {job(0, 3, "job-d/1", 1000, NULL), job(1, 3, "job-d/1", 1000, NULL)};
  run_gang(g, 2);
  assert_fails(&g[0], LT_ERR_TIMEOUT, "rank 2 never joined within 1000 ms");
  assert_fails(&g[1], LT_ERR_TIMEOUT, "rank 2 never joined");
  for (int r = 0; r < 2; r++)
    cr_assert_lt(g[r].ms, 3000, "rank %d took %lld ms", r, (long long)g[r].ms);
}

Test(dp, a_missing_rank_0_times_out_naming_its_address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  getsockname(fd, (struct sockaddr *)&sa, &sl);
  close(fd); /* a port nobody listens on */
  rank_job_t g[1] = {job(1, 2, "job-e/1", 800, NULL)};
  g[0].connect_port = ntohs(sa.sin_port);
  run_gang(g, 1);
  assert_fails(&g[0], LT_ERR_TIMEOUT, "rank 0 not reachable at 127.0.0.1:");
  cr_assert_lt(g[0].ms, 2500);
}

static lt_err_t leave_at_once(rank_job_t *j, lt_dp_t *dp) { return LT_OK; }

static lt_err_t reduce_then_again(rank_job_t *j, lt_dp_t *dp) {
  float x[1000] = {1};
  lt_err_t err = lt_dp_allreduce_sum(dp, x, 1000, j->errstr, sizeof j->errstr);
  char again[256];
  if (err && lt_dp_allreduce_sum(dp, x, 1000, again, sizeof again) != LT_ERR_FATAL)
    return lt_errf(j->errstr, sizeof j->errstr, LT_ERR_INTERNAL, "a broken gang reduced again");
  return err;
}

Test(dp, a_peer_that_closes_mid_reduce_is_an_io_error_on_every_rank_not_a_hang) {
  rank_job_t g[3] = {job(0, 3, "job-f/1", 20000, reduce_then_again),
                     job(1, 3, "job-f/1", 20000, reduce_then_again),
                     job(2, 3, "job-f/1", 20000, leave_at_once)};
  run_gang(g, 3);
  cr_assert_eq(g[2].err, LT_OK, "%s", g[2].errstr);
  assert_fails(&g[0], LT_ERR_IO, "rank 2 closed its connection");
  assert_fails(&g[1], LT_ERR_IO, "rank 0 closed its connection");
  for (int r = 0; r < 2; r++)
    cr_assert_lt(g[r].ms, 5000, "rank %d took %lld ms", r, (long long)g[r].ms);
}

/* A stranger that connects to rank 0 and talks something else (HTTP) is turned away; the gang
 * still forms. */
static int stranger_hung_up; /* written by the stranger's thread, read after the join */

static void *stranger(void *p) {
  board_t *b = p;
  int port = board_wait(b);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    const char *req = "GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: curl\r\n\r\n";
    ssize_t w = write(fd, req, strlen(req));
    char c;
    if (w > 0 && read(fd, &c, 1) <= 0) stranger_hung_up = 1; /* EOF, or a reset */
  }
  close(fd);
  return NULL;
}

Test(dp, a_stranger_talking_garbage_is_turned_away_and_the_gang_still_forms) {
  board_t b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
  pthread_t th[3];
  rank_job_t g[2] = {job(0, 2, "job-g/1", 5000, reduce_twice),
                     job(1, 2, "job-g/1", 5000, reduce_twice)};
  g[1].delay_ms = 300; /* after the stranger */
  g[0].board = g[1].board = &b;
  cr_assert_eq(pthread_create(&th[2], NULL, stranger, &b), 0);
  for (int r = 0; r < 2; r++) cr_assert_eq(pthread_create(&th[r], NULL, rank_main, &g[r]), 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int r = 0; r < 2; r++) cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
  cr_assert_eq(memcmp(g[0].buf, g[1].buf, sizeof g[0].buf), 0);
  cr_assert(stranger_hung_up, "rank 0 did not hang up on the stranger");
}

static lt_err_t reduce_own_size(rank_job_t *j, lt_dp_t *dp) {
  float x[16] = {0};
  return lt_dp_allreduce_sum(dp, x, j->rank == 2 ? 16 : 12, j->errstr, sizeof j->errstr);
}

Test(dp, ranks_that_reduce_different_sizes_fail_naming_the_rank) {
  rank_job_t g[3];
  for (int r = 0; r < 3; r++) g[r] = job(r, 3, "job-h/1", 5000, reduce_own_size);
  run_gang(g, 3);
  cr_assert_neq(g[0].err, LT_OK);
  cr_assert_not_null(strstr(g[0].errstr, "rank 2 sent a 64-byte data"), "%s", g[0].errstr);
  assert_fails(&g[1], LT_ERR_IO, "rank 0 closed its connection");
  assert_fails(&g[2], LT_ERR_IO, "rank 0 closed its connection");
}

/* The seam for NCCL: a conf's ops take the collectives after the TCP rendezvous. */
static int fake_calls;
static lt_err_t fake_allreduce(lt_dp_t *dp, float *buf, size_t n, char *errstr,
                               size_t errstr_size) {
  __atomic_add_fetch((int *)lt_dp_ops_ctx(dp), 1, __ATOMIC_SEQ_CST);
  for (size_t i = 0; i < n; i++) buf[i] *= (float)lt_dp_world(dp); /* as if all ranks agreed */
  return LT_OK;
}
static lt_err_t fake_barrier(lt_dp_t *dp, char *errstr, size_t errstr_size) {
  return fake_allreduce(dp, NULL, 0, errstr, errstr_size);
}
static const lt_dp_ops_t fake_ops = {"fake", fake_allreduce, fake_barrier};

static lt_err_t reduce_one(rank_job_t *j, lt_dp_t *dp) {
  j->buf[0] = 3;
  lt_err_t err = lt_dp_allreduce_sum(dp, j->buf, 1, j->errstr, sizeof j->errstr);
  return err ? err : lt_dp_barrier(dp, j->errstr, sizeof j->errstr);
}

Test(dp, a_conf_with_its_own_ops_gets_the_collectives_after_the_rendezvous) {
  rank_job_t g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = job(r, 2, "job-i/1", 5000, reduce_one);
    g[r].ops = &fake_ops;
    g[r].ops_ctx = &fake_calls;
  }
  run_gang(g, 2);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
    cr_assert_eq(g[r].buf[0], 6.0f);
  }
  cr_assert_eq(fake_calls, 4, "the fake ops saw %d calls, expected 2 per rank", fake_calls);
}

/* ---- connections handed to a confined process ------------------------------------------ */

/* The worker's half in a child confined as an executor is (lt_confine_conf_from_env: a network
 * namespace of its own where privileges allow, the seccomp filter: no socket but AF_UNIX): it adopts rank 1's connection, inherited on descriptor 3, and reduces with rank 0
 * here. Exit status: 0 when the sum came back right; otherwise which step failed. */
static void confined_rank1(int fd) {
  if (dup2(fd, 3) != 3) _exit(10);
  lt_confine_conf_t cc;
  char report[512], e[512];
  unsetenv("LATHE_EXECUTOR_USER");
  if (lt_confine_conf_from_env(&cc, 1, e, sizeof e)) _exit(11);
  if (lt_confine_apply(&cc, 3, report, sizeof report, e, sizeof e)) _exit(16);
  if (socket(AF_INET, SOCK_STREAM, 0) >= 0) _exit(12); /* not confined: the test proves nothing */
  lt_dp_conf_t c = {.rank = 1, .world = 2, .token = "job-c/1", .timeout_ms = 20000};
  int in = 3;
  lt_dp_t *dp;
  if (lt_dp_adopt(&c, &in, 1, &dp, e, sizeof e)) _exit(13);
  float x[3] = {1, 2, 3};
  if (lt_dp_allreduce_sum(dp, x, 3, e, sizeof e)) _exit(14);
  lt_dp_close(dp);
  _exit(x[0] == 11 && x[1] == 22 && x[2] == 33 ? 0 : 15);
}

Test(dp, connections_joined_here_carry_the_collectives_of_a_confined_process, .timeout = 60) {
  rank_job_t g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = job(r, 2, "job-c/1", 20000, NULL);
    g[r].detach = true;
  }
  run_gang(g, 2);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
    cr_assert_eq(g[r].nkeep, 1, "rank %d kept %d connections", r, g[r].nkeep);
  }
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) confined_rank1(g[1].keep[0]);
  close(g[1].keep[0]);
  lt_dp_conf_t c = {.rank = 0, .world = 2, .token = "job-c/1", .timeout_ms = 20000};
  lt_dp_t *dp;
  char e[512];
  cr_assert_eq(lt_dp_adopt(&c, g[0].keep, 1, &dp, e, sizeof e), LT_OK, "%s", e);
  float x[3] = {10, 20, 30};
  lt_err_t re = lt_dp_allreduce_sum(dp, x, 3, e, sizeof e);
  lt_dp_close(dp);
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the confined rank failed at step %d", WEXITSTATUS(st));
  cr_assert_eq(re, LT_OK, "%s", e);
  cr_assert(x[0] == 11 && x[1] == 22 && x[2] == 33, "rank 0 got %g %g %g", x[0], x[1], x[2]);
}

Test(dp, adopting_the_wrong_number_of_connections_or_a_non_socket_is_refused) {
  lt_dp_conf_t c = {.rank = 0, .world = 3, .token = "job-x/1", .timeout_ms = 1000};
  int p[2];
  cr_assert_eq(pipe(p), 0);
  lt_dp_t *dp = NULL;
  char e[512];
  cr_assert_eq(lt_dp_adopt(&c, p, 1, &dp, e, sizeof e), LT_ERR_INVALID);
  cr_assert_not_null(strstr(e, "takes 2 connections, not 1"), "%s", e);
  cr_assert_eq(pipe(p), 0);
  cr_assert_eq(lt_dp_adopt(&c, p, 2, &dp, e, sizeof e), LT_ERR_INVALID);
  cr_assert_not_null(strstr(e, "not an open stream socket"), "%s", e);
  cr_assert_null(dp);
  cr_assert_eq(fcntl(p[0], F_GETFD), -1, "a refused adopt still owns (closes) its fds");
}

/* ---- the managed loop as a gang (lt_train_conf_t.dp) --------------------------------------- */

/* A small model with the bundled task's tokenizer, 48 prompt/completion lines, and the runs'
 * work directories: [0] one executor, [1] and [2] ranks 0 and 1. */
typedef struct managed {
  char root[64], model[128], work[3][128];
  char *data;
  size_t len;
  lt_hparams_t hp;
  lt_train_result_t res[3];
  int steps_seen[3];  /* on_step calls */
  int ckpts[3];       /* on_checkpoint calls */
  int preempt_after;  /* rank 1 asks to stop (preempt) after this many steps; 0: never */
} managed_t;

typedef struct managed_hook {
  managed_t *m;
  int who; /* index into the arrays above */
} managed_hook_t;

static void managed_on_step(void *ctx, const lt_train_step_t *st) {
  managed_hook_t *h = ctx;
  h->m->steps_seen[h->who]++;
}

static lt_err_t managed_on_ckpt(void *ctx, const char *dir, int64_t step, bool final, char *errstr, size_t n) {
  managed_hook_t *h = ctx;
  h->m->ckpts[h->who]++;
  return LT_OK;
}

static lt_train_stop_t managed_should_stop(void *ctx) {
  managed_hook_t *h = ctx;
  bool ask = h->who == 2 && h->m->preempt_after && h->m->steps_seen[2] >= h->m->preempt_after;
  return ask ? LT_TRAIN_STOP_PREEMPT : LT_TRAIN_GO;
}

static lt_err_t managed_run(managed_t *m, int who, lt_dp_t *dp, char *errstr, size_t n) {
  managed_hook_t h = {m, who};
  lt_train_hooks_t hooks = {.ctx = &h, .on_step = managed_on_step, .on_checkpoint = managed_on_ckpt,
                            .should_stop = managed_should_stop};
  lt_train_conf_t tc = {.model_dir = m->model, .base_model_name = "tiny", .train = m->data, .train_len = m->len,
                        .hp = m->hp, .threads = 1, .work_dir = m->work[who], .gen_max_tokens = 6, .dp = dp};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  return lt_train_run(&tc, &hooks, &m->res[who], errstr, n);
}

static lt_err_t managed_rank(rank_job_t *j, lt_dp_t *dp) {
  return managed_run(j->arg, 1 + j->rank, dp, j->errstr, sizeof j->errstr);
}

/* Sets up m with hyperparameters hp_json (a job's "hyperparameters" object). */
static void managed_open(managed_t *m, const char *hp_json) {
  char err[512], body[600], cmd[1400];
  memset(m, 0, sizeof *m);
  snprintf(m->root, sizeof m->root, "/tmp/lt-dp-managed-XXXXXX");
  cr_assert_not_null(mkdtemp(m->root));
  snprintf(m->model, sizeof m->model, "%s/model", m->root);
  for (int i = 0; i < 3; i++) {
    snprintf(m->work[i], sizeof m->work[i], "%s/work%d", m->root, i);
    cr_assert_eq(mkdir(m->work[i], 0700), 0);
  }
  snprintf(body, sizeof body, "%s/bundle", m->root);
  mkdir(body, 0700);
  cr_assert_eq(lt_task_write_bundle(body, 1, 200000, 512, 10, 2, err, sizeof err), LT_OK, "%s", err);
  lt_model_config_t c = {.vocab_size = 512, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position = 128,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  cr_assert_eq(lt_model_init_random(&c, m->model, 7, 0.05f, 0.0f, err, sizeof err), LT_OK, "%s", err);
  snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer.json'", body, m->model);
  cr_assert_eq(system(cmd), 0);
  size_t cap = 1 << 14;
  m->data = malloc(cap);
  for (int i = 0; i < 48; i++)
    m->len += (size_t)snprintf(m->data + m->len, cap - m->len, "{\"prompt\":\"%d+1=\",\"completion\":\"%d\"}\n", i,
                               i + 1);
  snprintf(body, sizeof body, "{\"base_model\": \"tiny\", \"dataset_id\": \"d\", \"hyperparameters\": %s}", hp_json);
  json_t *j = json_loads(body, 0, NULL);
  cr_assert_not_null(j, "%s", body);
  lt_jobspec_t spec;
  cr_assert_eq(lt_jobspec_from_json(j, &spec, NULL, 0, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  m->hp = spec.hp;
}

/* One executor, then a gang of two on the same hyperparameters. */
static void managed_both(managed_t *m) {
  char err[512];
  cr_assert_eq(managed_run(m, 0, NULL, err, sizeof err), LT_OK, "one executor: %s", err);
  rank_job_t g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = job(r, 2, "job-m/1", 60000, managed_rank);
    g[r].arg = m;
  }
  run_gang(g, 2);
  for (int r = 0; r < 2; r++) cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
}

static char *managed_adapter(const managed_t *m, int who, size_t *len) {
  char path[256];
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", m->work[who]);
  return lt_test_slurp(path, len);
}

/* grad_accum 2 over two ranks, dropout on: each rank runs one micro-batch a step with the masks
 * one executor draws for it, so rank 0's published adapter, its evaluation and the step count
 * are one executor's exactly; rank 1 writes no checkpoint and scores nothing. */
Test(dp, a_managed_gang_of_two_trains_one_executors_adapter_bit_for_bit, .timeout = 300) {
  managed_t m;
  managed_open(&m, "{\"max_steps\": 5, \"batch_size\": 4, \"grad_accum\": 2, \"lora_rank\": 4, "
                   "\"lora_alpha\": 16, \"lora_dropout\": 0.1, \"learning_rate\": 0.01, \"checkpoint_interval\": 2, "
                   "\"checkpoint_interval_s\": 0, \"validation_fraction\": 0.1, \"seed\": 5, \"max_seq_len\": 64}");
  managed_both(&m);
  size_t l0, l1, l2;
  char *a0 = managed_adapter(&m, 0, &l0), *a1 = managed_adapter(&m, 1, &l1), *a2 = managed_adapter(&m, 2, &l2);
  cr_assert(a0 && a1, "the adapters were not written");
  cr_assert(l0 == l1 && memcmp(a0, a1, l0) == 0, "rank 0's adapter differs from one executor's");
  cr_assert_null(a2, "rank 1 wrote a checkpoint");
  cr_assert_eq(m.ckpts[2], 0);
  cr_assert_eq(m.ckpts[1], m.ckpts[0], "rank 0 checkpoints as one executor does");
  cr_assert_eq(m.res[1].steps, 5);
  cr_assert_eq(m.res[2].steps, 5);
  cr_assert_eq(m.steps_seen[2], 5, "every rank sees every step");
  cr_assert(m.res[1].final_eval.val_loss == m.res[0].final_eval.val_loss &&
                m.res[1].final_eval.exact_match == m.res[0].final_eval.exact_match,
            "rank 0's evaluation differs from one executor's");
  free(a0), free(a1), free(a2), free(m.data);
  lt_test_rm_rf(m.root);
}

/* grad_accum 4 over two ranks: each rank sums two micro-batches before the rank-ordered sum, so
 * the additions group differently from one executor's: the same adapter within rounding. */
Test(dp, more_micro_batches_than_ranks_match_one_executor_within_rounding, .timeout = 300) {
  managed_t m;
  managed_open(&m, "{\"max_steps\": 3, \"batch_size\": 2, \"grad_accum\": 4, \"lora_rank\": 4, "
                   "\"lora_alpha\": 16, \"lora_dropout\": 0.1, \"learning_rate\": 0.01, \"checkpoint_interval\": 0, "
                   "\"checkpoint_interval_s\": 0, \"validation_fraction\": 0.1, \"seed\": 6, \"max_seq_len\": 64}");
  managed_both(&m);
  size_t l0, l1;
  char *a0 = managed_adapter(&m, 0, &l0), *a1 = managed_adapter(&m, 1, &l1);
  cr_assert(a0 && a1 && l0 == l1);
  uint64_t hl = 0;
  memcpy(&hl, a0, 8);
  cr_assert_eq(memcmp(a0, a1, 8 + hl), 0, "the tensors' names or shapes differ");
  double worst = 0, scale = 0;
  for (size_t o = 8 + hl; o + sizeof(float) <= l0; o += sizeof(float)) {
    float x, y;
    memcpy(&x, a0 + o, sizeof x);
    memcpy(&y, a1 + o, sizeof y);
    worst = fmax(worst, fabs((double)x - y));
    scale = fmax(scale, fabs((double)x));
  }
  cr_assert_gt(scale, 0.0);
  cr_assert_lt(worst, 1e-4 * scale, "gang vs one executor: %g (scale %g)", worst, scale);
  free(a0), free(a1), free(m.data);
  lt_test_rm_rf(m.root);
}

/* Rank 1's hooks ask for a preemption after step 2: the gang votes, both ranks stop at the same
 * step boundary, and rank 0 alone leaves the checkpoint to resume from. */
Test(dp, one_ranks_preemption_stops_the_whole_gang_at_one_step, .timeout = 300) {
  managed_t m;
  managed_open(&m, "{\"max_steps\": 6, \"batch_size\": 4, \"grad_accum\": 2, \"lora_rank\": 4, "
                   "\"lora_dropout\": 0.0, \"learning_rate\": 0.01, \"checkpoint_interval\": 0, "
                   "\"checkpoint_interval_s\": 0, \"validation_fraction\": 0.1, \"seed\": 7, \"max_seq_len\": 64}");
  m.preempt_after = 2;
  rank_job_t g[2];
  for (int r = 0; r < 2; r++) {
    g[r] = job(r, 2, "job-p/1", 60000, managed_rank);
    g[r].arg = &m;
  }
  run_gang(g, 2);
  for (int r = 0; r < 2; r++) {
    cr_assert_eq(g[r].err, LT_OK, "rank %d: %s", r, g[r].errstr);
    cr_assert_eq(m.res[1 + r].stopped, LT_TRAIN_STOP_PREEMPT, "rank %d did not stop", r);
    cr_assert_eq(m.res[1 + r].steps, 2, "rank %d stopped after %lld steps", r, (long long)m.res[1 + r].steps);
  }
  cr_assert_eq(m.ckpts[1], 1, "rank 0 checkpoints the last whole step");
  cr_assert_eq(m.res[1].last_checkpoint_step, 2);
  cr_assert_eq(m.ckpts[2], 0, "rank 1 writes no checkpoint");
  free(m.data);
  lt_test_rm_rf(m.root);
}

/* A thread's all-reduce of two floats on its handle (the join tests). */
typedef struct red {
  lt_dp_t *dp;
  float *x;
} red_t;

static void *reduce_two(void *p) {
  red_t *r = p;
  char e[256];
  lt_dp_allreduce_sum(r->dp, r->x, 2, e, sizeof e);
  return NULL;
}

/* ---- a worker's join (lt_worker_gang.h) ------------------------------------------------------ */

static int read_byte(int fd, int timeout_ms) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  char b = 0;
  if (poll(&p, 1, timeout_ms) != 1 || read(fd, &b, 1) != 1) return -1;
  return b;
}

/* Two workers' joins (threads of their own) end with a 'g' each and one verified connection
 * each, which carry a sum once adopted; the token is the job and attempt. */
/* Ranks 0 and 1 (c0, c1; their pipes' read ends r0, r1) join a gang of two: each hands over its
 * one connection (into f0[0], f1[0]). */
static void join_pair(const lt_wgang_conf_t *c0, const lt_wgang_conf_t *c1, int r0, int r1, int *f0, int *f1) {
  char e[512];
  lt_wgang_t *g0, *g1;
  int n0 = 0, n1 = 0;
  cr_assert_eq(lt_wgang_start(c0, &g0, e, sizeof e), LT_OK, "%s", e);
  cr_assert_eq(lt_wgang_start(c1, &g1, e, sizeof e), LT_OK, "%s", e);
  cr_assert_eq(read_byte(r0, 20000), 'g');
  cr_assert_eq(read_byte(r1, 20000), 'g');
  cr_assert_eq(lt_wgang_finish(g0, f0, &n0, e, sizeof e), LT_OK, "%s", e);
  cr_assert_eq(lt_wgang_finish(g1, f1, &n1, e, sizeof e), LT_OK, "%s", e);
  cr_assert(n0 == 1 && n1 == 1);
}

Test(dp, two_workers_join_a_gang_and_hand_over_its_connections, .timeout = 60) {
  int p0[2], p1[2], port = 0;
  cr_assert_eq(pipe(p0), 0);
  cr_assert_eq(pipe(p1), 0);
  { /* a free port for rank 0 */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    getsockname(s, (struct sockaddr *)&a, &len);
    port = ntohs(a.sin_port);
    close(s);
  }
  char rdv[64], e[512];
  snprintf(rdv, sizeof rdv, "127.0.0.1:%d", port);
  lt_wgang_conf_t c0 = {.rank = 0, .world = 2, .rendezvous = rdv, .job_id = "job-w", .attempt = 3,
                        .timeout_ms = 20000, .notify_fd = p0[1]};
  lt_wgang_conf_t c1 = c0;
  c1.rank = 1, c1.notify_fd = p1[1];
  int f0[LT_WGANG_MAX_FDS], f1[LT_WGANG_MAX_FDS];
  join_pair(&c0, &c1, p0[0], p1[0], f0, f1);
  lt_dp_conf_t a0 = {.rank = 0, .world = 2, .token = "job-w/3", .timeout_ms = 20000}, a1 = a0;
  a1.rank = 1;
  lt_dp_t *d0, *d1;
  cr_assert_eq(lt_dp_adopt(&a0, f0, 1, &d0, e, sizeof e), LT_OK, "%s", e);
  cr_assert_eq(lt_dp_adopt(&a1, f1, 1, &d1, e, sizeof e), LT_OK, "%s", e);
  float x1[2] = {1, 2}, x0[2] = {10, 20};
  pthread_t t;
  red_t r1 = {d1, x1};
  cr_assert_eq(pthread_create(&t, NULL, reduce_two, &r1), 0);
  cr_assert_eq(lt_dp_allreduce_sum(d0, x0, 2, e, sizeof e), LT_OK, "%s", e);
  pthread_join(t, NULL);
  cr_assert(x0[0] == 11 && x0[1] == 22 && x1[0] == 11 && x1[1] == 22);
  lt_dp_close(d0);
  lt_dp_close(d1);
  for (int i = 0; i < 2; i++) close(p0[i]), close(p1[i]);
}

/* An attempt stopped while it joins abandons the join at once; the join's thread ends on its own
 * (its timeout here) and frees what it holds, and the attempt's notify pipe gets nothing. */
/* A rank 0 abandoned while it waits for the others (its attempt stopped: a peer's store stayed
 * away) and the gang's next attempt at once, with rank 0 on the same port (the worker's
 * rendezvous port plus its first slot): the old join gives the port up within a second, not at
 * its 60 s timeout (lt_dp_conf_t.abort), and the new rank 0 waits for it to be free instead of
 * failing (measured before both: "cannot listen …: Address already in use", a counted failure). */
Test(dp, the_next_attempt_of_a_gang_listens_where_an_abandoned_join_did, .timeout = 30) {
  int p0[2], p1[2], p2[2];
  cr_assert(pipe(p0) == 0 && pipe(p1) == 0 && pipe(p2) == 0);
  char rdv[64], e[512];
  snprintf(rdv, sizeof rdv, "127.0.0.1:%d", lt_test_free_port());
  lt_wgang_t *old;
  lt_wgang_conf_t c = {.rank = 0, .world = 2, .rendezvous = rdv, .job_id = "job-p", .attempt = 1,
                       .timeout_ms = 60000, .notify_fd = p0[1]};
  cr_assert_eq(lt_wgang_start(&c, &old, e, sizeof e), LT_OK, "%s", e);
  lt_test_msleep(300); /* it listens */
  lt_wgang_abandon(old);
  int64_t t0 = lt_time_mono_ms();
  lt_wgang_conf_t c0 = c, c1 = c;
  c0.attempt = c1.attempt = 2, c0.timeout_ms = c1.timeout_ms = 10000;
  c0.notify_fd = p1[1], c1.rank = 1, c1.notify_fd = p2[1];
  int f0[LT_WGANG_MAX_FDS], f1[LT_WGANG_MAX_FDS];
  join_pair(&c0, &c1, p1[0], p2[0], f0, f1);
  cr_log_info("the next attempt's gang formed %lld ms after the abandon", (long long)(lt_time_mono_ms() - t0));
  close(f0[0]), close(f1[0]);
  close(p0[1]);
  cr_assert_eq(read_byte(p0[0], 1000), -1, "the abandoned join wrote to its attempt's pipe");
  for (int i = 0; i < 2; i++) close(p1[i]), close(p2[i]);
  close(p0[0]);
}

Test(dp, an_abandoned_join_returns_at_once_and_tells_nobody, .timeout = 30) {
  int p[2];
  cr_assert_eq(pipe(p), 0);
  char e[512];
  lt_wgang_t *g;
  lt_wgang_conf_t c = {.rank = 0, .world = 2, .rendezvous = "127.0.0.1:0", .job_id = "job-a", .attempt = 1,
                       .timeout_ms = 1500, .notify_fd = p[1]};
  cr_assert_eq(lt_wgang_start(&c, &g, e, sizeof e), LT_OK, "%s", e);
  int64_t t0 = lt_time_mono_ms();
  lt_wgang_abandon(g);
  cr_assert_lt(lt_time_mono_ms() - t0, 500, "abandon waited for the join");
  close(p[1]);
  cr_assert_eq(read_byte(p[0], 4000), -1, "an abandoned join wrote to the attempt's pipe");
  close(p[0]);
  lt_wgang_conf_t bad = c;
  bad.world = 1;
  cr_assert_eq(lt_wgang_start(&bad, &g, e, sizeof e), LT_ERR_INVALID);
  cr_assert_not_null(strstr(e, "gang_world"), "%s", e);
}
