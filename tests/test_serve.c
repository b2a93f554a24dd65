/* Tests of serving (workers/engine/lt_serve): logits equal to a session's, bitwise batch
 * invariance across step composition, adapters and prefill chunking, the paged KV cache (pool
 * exhaustion, blocks returned and zeroed, sequences over many blocks), adapter loading errors,
 * zeroing on free, and the token picker shared with lt_sample. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <immintrin.h> /* _mm_getcsr: the bf16 reference's FTZ and DAZ */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_engine.h"
#include "lt_safetensors.h"
#include "lt_serve.h"
#include "lt_test.h"

static char errbuf[512];

#define OK(call)                                                                               \
  do {                                                                                         \
    errbuf[0] = 0;                                                                             \
    lt_err_t e_ = (call);                                                                      \
    cr_assert_eq(e_, LT_OK, "%s failed: %s (%s)", #call, errbuf, lt_err_name(e_));            \
  } while (0)

enum { V = 300, NAD = 3 };

/* A random model, three adapters of different ranks and targets (B trained away from 0), each
 * with its session (the reference) and its PEFT files in memory. */
typedef struct fixture {
  lt_model_config_t c;
  char dir[256];
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *base;          /* a fresh LoRA session: B = 0, the base model */
  lt_session_t *sess[NAD];
  lt_adapter_t *ad[NAD];
  char *st[NAD], *cfg[NAD];    /* the exported files */
  size_t st_len[NAD], cfg_len[NAD];
} fixture_t;

/* A whole file: it must be there. */
static char *slurp(const char *path, size_t *len) {
  char *b = lt_test_slurp(path, len);
  cr_assert_not_null(b, "%s", path);
  return b;
}

static void rand_tokens(int32_t *t, size_t n, unsigned *seed) {
  for (size_t i = 0; i < n; i++) t[i] = (int32_t)(rand_r(seed) % V);
}

/* A few AdamW steps on random data, so that B != 0 and the adapter changes the outputs. */
static void train(lt_session_t *s, unsigned seed) {
  int32_t tok[2 * 16], tgt[2 * 16];
  lt_adamw_t opt = {.lr = 0.03f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  for (int step = 0; step < 3; step++) {
    rand_tokens(tok, 32, &seed);
    rand_tokens(tgt, 32, &seed);
    lt_batch_t b = {.B = 2, .T = 16, .tokens = tok, .targets = tgt};
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  }
}

/* bf16: the backend keeps bf16 copies of every mapped weight, as the sampler's does with
 * LATHE_SAMPLER_PRECISION=bf16 (here down to the smallest tensor: this model's matrices are far
 * below the default threshold). */
static void fixture_open_prec(fixture_t *f, int bias, int tied, int bf16) {
  memset(f, 0, sizeof *f);
  f->c = (lt_model_config_t){.vocab_size = V, .hidden_size = 64, .intermediate_size = 96,
                             .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .head_dim = 16,
                             .max_position = 128, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                             .rope_linear_factor = 1.0f, .tie_embeddings = tied,
                             .qkv_bias = bias};
  snprintf(f->dir, sizeof f->dir, "/tmp/lt_serve_test_XXXXXX");
  cr_assert_not_null(mkdtemp(f->dir));
  char path[400];
  snprintf(path, sizeof path, "%s/model", f->dir);
  OK(lt_model_init_random(&f->c, path, 7, 0.3f, 0.1f, errbuf, sizeof errbuf));
  lt_cpu_opts_t o = {.threads = 2, .bf16_weights = bf16, .bf16_min_elems = 1};
  OK(lt_backend_cpu_new_opts(&o, &f->be, errbuf, sizeof errbuf));
  OK(lt_engine_open(path, f->be, &f->eng, errbuf, sizeof errbuf));
  static const int rank[NAD] = {4, 8, 2};
  static const unsigned targets[NAD] = {
      LT_TARGET_ALL, LT_TARGET_Q | LT_TARGET_V,
      LT_TARGET_GATE | LT_TARGET_UP | LT_TARGET_DOWN | LT_TARGET_O};
  lt_session_config_t bc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 99};
  OK(lt_session_new(f->eng, &bc, &f->base, errbuf, sizeof errbuf));
  for (int i = 0; i < NAD; i++) {
    lt_session_config_t sc = {.rank = rank[i], .alpha = 2.0f * rank[i] + i, .targets = targets[i],
                              .seed = 100 + (uint64_t)i};
    OK(lt_session_new(f->eng, &sc, &f->sess[i], errbuf, sizeof errbuf));
    train(f->sess[i], 11 + (unsigned)i);
    char ad[300];
    snprintf(ad, sizeof ad, "%s/adapter%d", f->dir, i);
    OK(lt_export_peft(f->sess[i], ad, "test", errbuf, sizeof errbuf));
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", ad);
    f->st[i] = slurp(path, &f->st_len[i]);
    snprintf(path, sizeof path, "%s/adapter_config.json", ad);
    f->cfg[i] = slurp(path, &f->cfg_len[i]);
    OK(lt_adapter_load(f->eng, f->st[i], f->st_len[i], f->cfg[i], f->cfg_len[i], &f->ad[i],
                       errbuf, sizeof errbuf));
  }
}

static void fixture_open(fixture_t *f, int bias, int tied) { fixture_open_prec(f, bias, tied, 0); }

static void fixture_close(fixture_t *f) {
  for (int i = 0; i < NAD; i++) {
    lt_adapter_free(f->ad[i]);
    lt_session_destroy(f->sess[i]);
    free(f->st[i]);
    free(f->cfg[i]);
  }
  lt_session_destroy(f->base);
  lt_engine_close(f->eng);
  lt_backend_destroy(f->be);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  cr_assert_eq(system(cmd), 0);
}

static lt_serve_t *serve_new(fixture_t *f, int bt, int blocks) {
  size_t per_block = 2ull * f->c.num_layers * bt * f->c.num_kv_heads * f->c.head_dim * 4;
  lt_serve_conf_t conf = {.block_tokens = bt, .kv_bytes = per_block * blocks, .max_rows = 64};
  lt_serve_t *srv;
  OK(lt_serve_new(f->eng, &conf, &srv, errbuf, sizeof errbuf));
  cr_assert_eq(lt_serve_blocks_total(srv), blocks);
  return srv;
}

/* Runs a whole prompt in one step on a fresh sequence; logits (n, V) of every position. */
static int prefill(lt_serve_t *srv, const lt_adapter_t *ad, const int32_t *tok, int n,
                   float *logits) {
  int seq;
  OK(lt_serve_seq_open(srv, ad, &seq, errbuf, sizeof errbuf));
  OK(lt_serve_seq_reserve(srv, seq, n, errbuf, sizeof errbuf));
  lt_serve_row_t rows[64];
  for (int i = 0; i < n; i++) rows[i] = (lt_serve_row_t){seq, tok[i], i, 1};
  OK(lt_serve_step(srv, rows, n, logits, errbuf, sizeof errbuf));
  return seq;
}

static double rel_err(const float *a, const float *b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return m > 0 ? d / m : d;
}

/* ---- equivalence with a session ------------------------------------------------------------ */

static void equivalence_case(int bias, int tied) {
  fixture_t f;
  fixture_open(&f, bias, tied);
  lt_serve_t *srv = serve_new(&f, 16, 16);
  enum { T = 20 };
  int32_t tok[T];
  unsigned seed = 5;
  rand_tokens(tok, T, &seed);
  float *got = malloc(sizeof(float) * T * V), *want = malloc(sizeof(float) * T * V),
        *base = malloc(sizeof(float) * T * V);
  OK(lt_logits(f.base, 1, T, tok, want, errbuf, sizeof errbuf));
  int s = prefill(srv, NULL, tok, T, got);
  memcpy(base, got, sizeof(float) * T * V);
  for (int t = 0; t < T; t++)
    cr_assert_lt(rel_err(got + (size_t)t * V, want + (size_t)t * V, V), 1e-4,
                 "base model, position %d", t);
  lt_serve_seq_close(srv, s);
  for (int i = 0; i < NAD; i++) {
    OK(lt_logits(f.sess[i], 1, T, tok, want, errbuf, sizeof errbuf));
    s = prefill(srv, f.ad[i], tok, T, got);
    for (int t = 0; t < T; t++)
      cr_assert_lt(rel_err(got + (size_t)t * V, want + (size_t)t * V, V), 1e-4,
                   "adapter %d, position %d", i, t);
    cr_assert_gt(rel_err(got, base, (size_t)T * V), 1e-3, "adapter %d changes nothing", i);
    lt_serve_seq_close(srv, s);
  }
  cr_assert_eq(lt_serve_blocks_free(srv), 16);
  free(got);
  free(want);
  free(base);
  lt_serve_free(srv);
  fixture_close(&f);
}

Test(serve, logits_equal_a_sessions_for_base_and_adapters_qwen2_bias) { equivalence_case(1, 0); }
Test(serve, logits_equal_a_sessions_with_tied_embeddings) { equivalence_case(0, 1); }

/* ---- batch invariance ---------------------------------------------------------------------- */

enum { XP = 20, XD = 10 };

/* What sequence X produced: its tokens, the logits of each pick, the picked log-probs. */
typedef struct xrun {
  int32_t tok[XD + 1];
  float lp[XD + 1];
  float logits[(XD + 1) * V];
} xrun_t;

static const lt_sample_params_t xparams = {.max_tokens = XD, .temperature = 0.9f, .top_p = 0.95f,
                                           .top_k = 50};

/* X alone: its prompt in one step, then XD decode steps of one row. */
static void run_alone(fixture_t *f, const int32_t *prompt, xrun_t *out) {
  lt_serve_t *srv = serve_new(f, 4, 64);
  lt_picker_t pk;
  OK(lt_picker_init(&pk, V, 1234, errbuf, sizeof errbuf));
  int seq;
  OK(lt_serve_seq_open(srv, f->ad[1], &seq, errbuf, sizeof errbuf));
  OK(lt_serve_seq_reserve(srv, seq, XP + XD, errbuf, sizeof errbuf));
  lt_serve_row_t rows[XP];
  for (int i = 0; i < XP; i++) rows[i] = (lt_serve_row_t){seq, prompt[i], i, i == XP - 1};
  OK(lt_serve_step(srv, rows, XP, out->logits, errbuf, sizeof errbuf));
  for (int d = 0;; d++) {
    out->tok[d] = lt_picker_pick(&pk, out->logits + (size_t)d * V, &xparams, &out->lp[d], 0,
                                 NULL, NULL);
    if (d == XD) break;
    lt_serve_row_t r = {seq, out->tok[d], XP + d, 1};
    OK(lt_serve_step(srv, &r, 1, out->logits + (size_t)(d + 1) * V, errbuf, sizeof errbuf));
  }
  lt_picker_free(&pk);
  lt_serve_free(srv);
}

/* X among 7 others (adapters 0, 1, 2 and base), its prompt in chunks of 3 and 7 mixed with
 * the others' decode rows, X's rows placed in the middle of each step. */
static void run_crowded(fixture_t *f, const int32_t *prompt, xrun_t *out) {
  enum { NO = 7, OP = 5 };
  lt_serve_t *srv = serve_new(f, 4, 64);
  lt_picker_t pk;
  OK(lt_picker_init(&pk, V, 1234, errbuf, sizeof errbuf));
  int seq, os[NO], opos[NO];
  int32_t onext[NO];
  unsigned seed = 77;
  float *lg = malloc(sizeof(float) * 64 * V);
  lt_serve_row_t rows[64];
  int n = 0;
  for (int o = 0; o < NO; o++) { /* the others' prompts, all in the first step */
    OK(lt_serve_seq_open(srv, o % 4 == 3 ? NULL : f->ad[o % 4], &os[o], errbuf, sizeof errbuf));
    OK(lt_serve_seq_reserve(srv, os[o], OP + 20, errbuf, sizeof errbuf));
    for (int i = 0; i < OP; i++)
      rows[n++] = (lt_serve_row_t){os[o], (int32_t)(rand_r(&seed) % V), i, i == OP - 1};
    opos[o] = OP;
  }
  OK(lt_serve_step(srv, rows, n, lg, errbuf, sizeof errbuf));
  for (int o = 0; o < NO; o++) onext[o] = (int32_t)(rand_r(&seed) % V);
  OK(lt_serve_seq_open(srv, f->ad[1], &seq, errbuf, sizeof errbuf));
  OK(lt_serve_seq_reserve(srv, seq, XP + XD, errbuf, sizeof errbuf));
  static const int chunks[] = {3, 7, 3, 7};
  int xdone = 0, ci = 0, d = 0;
  while (d <= XD) {
    n = 0;
    for (int o = 0; o < NO / 2; o++) rows[n++] = (lt_serve_row_t){os[o], onext[o], opos[o]++, 1};
    int xw = -1; /* index among the wanted rows of X's wanted row */
    if (xdone < XP) {
      int c = chunks[ci++];
      for (int i = 0; i < c; i++, xdone++)
        rows[n++] = (lt_serve_row_t){seq, prompt[xdone], xdone, xdone == XP - 1};
      if (xdone == XP) xw = NO / 2;
    } else {
      rows[n++] = (lt_serve_row_t){seq, out->tok[d - 1], XP + d - 1, 1};
      xw = NO / 2;
    }
    for (int o = NO / 2; o < NO; o++) rows[n++] = (lt_serve_row_t){os[o], onext[o], opos[o]++, 1};
    OK(lt_serve_step(srv, rows, n, lg, errbuf, sizeof errbuf));
    for (int o = 0; o < NO; o++) { /* the others decode greedily */
      int w = o < NO / 2 ? o : o + (xw >= 0);
      float best = -INFINITY;
      for (int j = 0; j < V; j++)
        if (lg[(size_t)w * V + j] > best) best = lg[(size_t)w * V + j], onext[o] = j;
    }
    if (xw >= 0) {
      memcpy(out->logits + (size_t)d * V, lg + (size_t)xw * V, sizeof(float) * V);
      out->tok[d] = lt_picker_pick(&pk, lg + (size_t)xw * V, &xparams, &out->lp[d], 0, NULL, NULL);
      d++;
    }
  }
  free(lg);
  lt_picker_free(&pk);
  lt_serve_free(srv);
}

static void invariance_case(int bf16) {
  fixture_t f;
  fixture_open_prec(&f, 1, 0, bf16);
  int32_t prompt[XP];
  unsigned seed = 3;
  rand_tokens(prompt, XP, &seed);
  xrun_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  run_alone(&f, prompt, a);
  run_crowded(&f, prompt, b);
  for (int d = 0; d <= XD; d++)
    cr_assert_eq(memcmp(a->logits + (size_t)d * V, b->logits + (size_t)d * V, sizeof(float) * V),
                 0, "logits of X's pick %d differ", d);
  cr_assert_eq(memcmp(a->tok, b->tok, sizeof a->tok), 0, "tokens differ");
  cr_assert_eq(memcmp(a->lp, b->lp, sizeof a->lp), 0, "log-probs differ");
  free(a);
  free(b);
  fixture_close(&f);
}

Test(serve, a_sequence_is_bitwise_the_same_whatever_shares_its_steps) { invariance_case(0); }
Test(serve, a_sequence_is_bitwise_the_same_whatever_shares_its_steps_bf16) { invariance_case(1); }

/* ---- serving precision --------------------------------------------------------------------- */

/* The bf16 product's element as workers/engine/lt_cpu_dot.h defines it, in scalar code: both
 * operands rounded to bf16 (nearest even; a subnormal activation to zero), 16 lanes, lane l of
 * chunk c taking the pair k = 32c + 2l + 1 then 32c + 2l (zeros past K), the lanes folded
 * pairwise, all with MXCSR's FTZ and DAZ set. */
static float bf16_round_daz(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7f800000u) == 0) return signbit(f) ? -0.0f : 0.0f;
  return lt_st_bf16_to_f32(lt_st_f32_to_bf16(f));
}

static float bf16_ref_dot(const float *a, const float *w, int K) {
  unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);
  volatile float lane[16] = {0};
  for (int c = 0; c < K; c += 32)
    for (int l = 0; l < 16; l++)
      for (int e = 1; e >= 0; e--) {
        int k = c + 2 * l + e;
        float x = k < K ? bf16_round_daz(a[k]) : 0.0f, y = k < K ? lt_st_bf16_to_f32(lt_st_f32_to_bf16(w[k])) : 0.0f;
        float p = x * y;
        lane[l] = lane[l] + p;
      }
  for (int s = 8; s >= 1; s /= 2)
    for (int i = 0; i < s; i++) lane[i] = lane[i] + lane[i + s];
  float r = lane[0];
  _mm_setcsr(csr);
  return r;
}

/* With bf16 weights, every element of matmul_rows is bitwise bf16_ref_dot: for every M (the
 * 8x2 and 4x4 tiles, the four-column and single-column kernels and their tails: M to 8 + 4 + 1),
 * K not a multiple of 32, a W that starts inside a mapped weight, activations and weights with
 * subnormals and values that round up to the smallest normal, matmul_rows_multi mixing a mapped and an unmapped W (read as
 * floats), alpha and beta. After free_const the floats are read again. */
Test(serve, bf16_weights_give_the_defined_bf16_pair_sum) {
  enum { N = 37, K = 53, MM = 13 };
  lt_backend_t *h, *f;
  lt_cpu_opts_t o = {.threads = 2, .bf16_weights = 1, .bf16_min_elems = 64};
  OK(lt_backend_cpu_new_opts(&o, &h, errbuf, sizeof errbuf));
  OK(lt_backend_cpu_new(2, &f, errbuf, sizeof errbuf));
  float *w = malloc(sizeof(float) * (N + 3) * K), *wc = malloc(sizeof(float) * (N + 3) * K),
        *a = malloc(sizeof(float) * MM * K), *c1 = malloc(sizeof(float) * MM * N),
        *c2 = malloc(sizeof(float) * MM * N);
  unsigned seed = 5;
  for (int i = 0; i < (N + 3) * K; i++) w[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
  for (int i = 0; i < MM * K; i++) a[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
  const float tiny[] = {1e-39f, -2e-40f, 1.1754942e-38f /* rounds up to the smallest normal */, 3e-20f};
  for (int i = 0; i < 4; i++) a[7 * i + 2] = tiny[i], w[11 * i + 5] = tiny[3 - i];
  memcpy(wc, w, sizeof(float) * (N + 3) * K);
  const float *dev = h->map_const(h, w, (size_t)(N + 3) * K);
  cr_assert_eq(dev, w, "the cpu backend maps weights in place");
  for (int M = 1; M <= MM; M++)
    for (int off = 0; off <= 3; off += 3) {
      const float *W = w + (size_t)off * K;
      for (int i = 0; i < M * N; i++) c1[i] = 1.0f;
      h->matmul_rows(h, M, N, K, 0.5f, a, K, W, K, 2.0f, c1, N);
      for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++) {
          float e = 0.5f * bf16_ref_dot(a + (size_t)r * K, W + (size_t)j * K, K) + 2.0f * 1.0f;
          cr_assert_eq(memcmp(&c1[r * N + j], &e, sizeof e), 0, "M %d, offset %d, [%d,%d]: %.9g, expected %.9g", M,
                       off, r, j, c1[r * N + j], e);
        }
    }
  f->matmul_rows(f, 4, N, K, 1.0f, a, K, w, K, 0.0f, c2, N);
  h->matmul_rows(h, 4, N, K, 1.0f, a, K, w, K, 0.0f, c1, N);
  cr_assert_neq(memcmp(c1, c2, sizeof(float) * 4 * N), 0, "the bf16 product equals the float one");
  lt_mr_desc_t d[2] = {{.M = 3, .N = N, .K = K, .alpha = 1, .A = a, .W = w, .C = c1, .lda = K, .ldw = K, .ldc = N},
                       {.M = 2, .N = N, .K = K, .alpha = 1, .A = a + 3 * K, .W = wc, .C = c1 + 3 * N, .lda = K,
                        .ldw = K, .ldc = N}};
  h->matmul_rows_multi(h, 2, d);
  for (int r = 0; r < 3; r++)
    for (int j = 0; j < N; j++) {
      float e = bf16_ref_dot(a + (size_t)r * K, w + (size_t)j * K, K);
      cr_assert_eq(memcmp(&c1[r * N + j], &e, sizeof e), 0, "matmul_rows_multi, mapped [%d,%d]", r, j);
    }
  f->matmul_rows(f, 2, N, K, 1.0f, a + 3 * K, K, wc, K, 0.0f, c2, N); /* wc is not mapped in h */
  cr_assert_eq(memcmp(c1 + 3 * N, c2, sizeof(float) * 2 * N), 0, "matmul_rows_multi, unmapped");
  h->free_const(h, dev);
  h->matmul_rows(h, 4, N, K, 1.0f, a, K, w, K, 0.0f, c1, N);
  f->matmul_rows(f, 4, N, K, 1.0f, a, K, w, K, 0.0f, c2, N);
  cr_assert_eq(memcmp(c1, c2, sizeof(float) * 4 * N), 0, "after free_const the floats are read");
  free(w), free(wc), free(a), free(c1), free(c2);
  lt_backend_destroy(h);
  lt_backend_destroy(f);
}

/* The AVX-512 kernels (4x4 and 8x2 tiles, 16-float registers; vdpbf16ps for bf16 copies) and the
 * narrow ones (AVX2 or baseline) give the same bits, for floats and bf16 copies, every M through
 * the tiles and their edges, K with and without a tail: the sampler's answers do not depend on
 * the machine. */
Test(serve, matmul_rows_is_the_same_bits_on_every_instruction_set) {
  enum { N = 37, MM = 13, KMAX = 64 };
  if (!__builtin_cpu_supports("avx512f"))
    fprintf(stderr, "note: no AVX-512 here: both backends run the narrow kernels\n");
  else if (!__builtin_cpu_supports("avx512bf16"))
    fprintf(stderr, "note: no AVX-512 BF16 here: both backends run the narrow bf16 kernels\n");
  float *w = malloc(sizeof(float) * N * KMAX), *a = malloc(sizeof(float) * MM * KMAX),
        *c1 = malloc(sizeof(float) * MM * N), *c2 = malloc(sizeof(float) * MM * N);
  unsigned seed = 11;
  for (int i = 0; i < N * KMAX; i++) w[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
  for (int i = 0; i < MM * KMAX; i++) a[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
  for (int bf16 = 0; bf16 <= 1; bf16++) {
    lt_backend_t *wide, *narrow;
    lt_cpu_opts_t o = {.threads = 2, .bf16_weights = bf16, .bf16_min_elems = 64};
    OK(lt_backend_cpu_new_opts(&o, &wide, errbuf, sizeof errbuf));
    o.narrow = 1;
    OK(lt_backend_cpu_new_opts(&o, &narrow, errbuf, sizeof errbuf));
    const float *d1 = wide->map_const(wide, w, (size_t)N * KMAX), *d2 = narrow->map_const(narrow, w, (size_t)N * KMAX);
    for (int K = 53; K <= KMAX; K += KMAX - 53)
      for (int M = 1; M <= MM; M++) {
        wide->matmul_rows(wide, M, N, K, 1.0f, a, KMAX, w, KMAX, 0.0f, c1, N);
        narrow->matmul_rows(narrow, M, N, K, 1.0f, a, KMAX, w, KMAX, 0.0f, c2, N);
        cr_assert_eq(memcmp(c1, c2, sizeof(float) * M * N), 0, "bf16 %d, K %d, M %d: the kernels differ", bf16, K, M);
      }
    wide->free_const(wide, d1);
    narrow->free_const(narrow, d2);
    lt_backend_destroy(wide);
    lt_backend_destroy(narrow);
  }
  free(w), free(a), free(c1), free(c2);
}

/* The same model served with bf16 weights: other logits than with floats (the copies are
 * read), close to them (rounding, not a different model). */
Test(serve, bf16_weights_change_logits_by_rounding_only) {
  fixture_t f32, b16;
  fixture_open_prec(&f32, 1, 0, 0);
  fixture_open_prec(&b16, 1, 0, 1);
  int32_t prompt[XP];
  unsigned seed = 3;
  rand_tokens(prompt, XP, &seed);
  xrun_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  run_alone(&f32, prompt, a);
  run_alone(&b16, prompt, b);
  double maxd = 0, maxa = 0;
  for (int i = 0; i < V; i++) { /* the prompt's logits: the same input on both */
    double dd = fabs((double)a->logits[i] - b->logits[i]);
    if (dd > maxd) maxd = dd;
    if (fabs(a->logits[i]) > maxa) maxa = fabs(a->logits[i]);
  }
  cr_assert_gt(maxd, 0.0, "bf16 serving gave the float logits: the copies were not read");
  cr_assert_lt(maxd, 0.02 * maxa + 1e-3, "bf16 moved a logit by %g (largest %g)", maxd, maxa);
  free(a);
  free(b);
  fixture_close(&f32);
  fixture_close(&b16);
}

/* ---- paging -------------------------------------------------------------------------------- */

static int all_zero(const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (x[i] != 0.0f) return 0;
  return 1;
}

Test(serve, pool_exhaustion_is_busy_and_closing_returns_zeroed_blocks) {
  fixture_t f;
  fixture_open(&f, 0, 0);
  enum { BT = 4 };
  lt_serve_t *srv = serve_new(&f, BT, 6);
  int a, b;
  int32_t tok[20];
  unsigned seed = 9;
  rand_tokens(tok, 20, &seed);
  float *lg = malloc(sizeof(float) * 20 * V);
  a = prefill(srv, f.ad[0], tok, 18, lg); /* 5 blocks */
  cr_assert_eq(lt_serve_blocks_free(srv), 1);
  cr_assert_eq(lt_serve_seq_positions(srv, a), 18);
  lt_serve_row_t skip = {a, 1, 19, 1};
  cr_assert_eq(lt_serve_step(srv, &skip, 1, lg, errbuf, sizeof errbuf), LT_ERR_INVALID,
               "a row skipping position 18 ran");
  cr_assert_not_null(strstr(errbuf, "row 0"), "%s", errbuf);
  OK(lt_serve_seq_open(srv, NULL, &b, errbuf, sizeof errbuf));
  cr_assert_eq(lt_serve_seq_reserve(srv, b, 8, errbuf, sizeof errbuf), LT_SERVE_BUSY);
  cr_assert_not_null(strstr(errbuf, "free"), "%s", errbuf);
  cr_assert_eq(lt_serve_blocks_free(srv), 1, "a refused reservation took blocks");
  cr_assert_eq(lt_serve_seq_blocks(srv, b, NULL, 0), 0);
  cr_assert_eq(lt_serve_seq_reserve(srv, b, 200, errbuf, sizeof errbuf), LT_ERR_INVALID);
  lt_serve_row_t r = {b, 1, 0, 0};
  cr_assert_eq(lt_serve_step(srv, &r, 1, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID,
               "a row at an unreserved position ran");
  int32_t ids[8];
  cr_assert_eq(lt_serve_seq_blocks(srv, a, ids, 8), 5);
  size_t bf = 2ull * f.c.num_layers * BT * f.c.num_kv_heads * f.c.head_dim;
  float *blk = malloc(sizeof(float) * bf);
  OK(lt_serve_block_read(srv, ids[2], blk, errbuf, sizeof errbuf));
  cr_assert(!all_zero(blk, bf), "the block held no keys or values");
  lt_serve_seq_close(srv, a);
  cr_assert_eq(lt_serve_blocks_free(srv), 6);
  for (int i = 0; i < 5; i++) {
    OK(lt_serve_block_read(srv, ids[i], blk, errbuf, sizeof errbuf));
    cr_assert(all_zero(blk, bf), "block %d was returned without being zeroed", ids[i]);
  }
  OK(lt_serve_seq_reserve(srv, b, 8, errbuf, sizeof errbuf));
  cr_assert_eq(lt_serve_blocks_free(srv), 4);
  free(blk);
  free(lg);
  lt_serve_free(srv);
  fixture_close(&f);
}

/* Two sequences grown in turns hold interleaved blocks; each matches a one-block server's. */
Test(serve, sequences_over_many_scattered_blocks_match_one_block) {
  fixture_t f;
  fixture_open(&f, 1, 0);
  enum { T = 30 };
  int32_t tok[2][T];
  unsigned seed = 21;
  rand_tokens(&tok[0][0], 2 * T, &seed);
  float *got[2], *ref = malloc(sizeof(float) * T * V);
  lt_serve_t *big = serve_new(&f, 64, 2), *small = serve_new(&f, 4, 20);
  int s[2];
  for (int k = 0; k < 2; k++) {
    got[k] = malloc(sizeof(float) * T * V);
    OK(lt_serve_seq_open(small, f.ad[k], &s[k], errbuf, sizeof errbuf));
  }
  for (int p = 0; p < T; p += 5) /* 5 positions of each sequence in turn, one step each */
    for (int k = 0; k < 2; k++) {
      OK(lt_serve_seq_reserve(small, s[k], p + 5, errbuf, sizeof errbuf));
      lt_serve_row_t rows[5];
      for (int i = 0; i < 5; i++) rows[i] = (lt_serve_row_t){s[k], tok[k][p + i], p + i, 1};
      OK(lt_serve_step(small, rows, 5, got[k] + (size_t)p * V, errbuf, sizeof errbuf));
    }
  int32_t ids[2][8];
  cr_assert_eq(lt_serve_seq_blocks(small, s[0], ids[0], 8), 8);
  cr_assert_eq(lt_serve_seq_blocks(small, s[1], ids[1], 8), 8);
  cr_assert_neq(ids[0][2], ids[0][1] + 1, "blocks are not interleaved");
  for (int k = 0; k < 2; k++) {
    int q = prefill(big, f.ad[k], tok[k], T, ref);
    cr_assert_eq(memcmp(got[k], ref, sizeof(float) * T * V), 0, "sequence %d differs", k);
    lt_serve_seq_close(big, q);
    free(got[k]);
  }
  free(ref);
  lt_serve_free(big);
  lt_serve_free(small);
  fixture_close(&f);
}

/* ---- adapters ------------------------------------------------------------------------------ */

/* The exported adapter 0 rewritten: tensor `drop` left out, tensor `reshape` given one more
 * row, an `extra` tensor added. */
static char *rewrite(fixture_t *f, const char *drop, const char *reshape, const char *extra,
                     size_t *len) {
  char path[400], out[400];
  snprintf(path, sizeof path, "%s/adapter0/adapter_model.safetensors", f->dir);
  snprintf(out, sizeof out, "%s/rewritten.safetensors", f->dir);
  lt_st_t *st;
  OK(lt_st_open_file(path, &st, errbuf, sizeof errbuf));
  size_t n = lt_st_count(st), m = 0;
  lt_st_entry_t *e = calloc(n + 1, sizeof *e);
  float *big = calloc(1 << 16, sizeof(float));
  for (size_t i = 0; i < n; i++) {
    const lt_st_tensor_t *t = lt_st_at(st, i);
    if (drop && !strcmp(t->name, drop)) continue;
    e[m] = (lt_st_entry_t){t->name, LT_ST_F32, 2, {t->shape[0], t->shape[1]},
                           (const float *)t->data};
    if (reshape && !strcmp(t->name, reshape)) {
      e[m].shape[0]++;
      e[m].data = big;
    }
    m++;
  }
  if (extra) e[m++] = (lt_st_entry_t){extra, LT_ST_F32, 2, {2, 2}, big};
  OK(lt_st_write(out, e, m, errbuf, sizeof errbuf));
  lt_st_close(st);
  free(e);
  free(big);
  return slurp(out, len);
}

static void expect_load_error(fixture_t *f, const char *st, size_t st_len, const char *cfg,
                              const char *needle) {
  lt_adapter_t *a = (lt_adapter_t *)1;
  errbuf[0] = 0;
  cr_assert_eq(lt_adapter_load(f->eng, st, st_len, cfg, strlen(cfg), &a, errbuf, sizeof errbuf),
               LT_ERR_INVALID, "loaded; expected an error naming %s", needle);
  cr_assert_null(a);
  cr_assert_not_null(strstr(errbuf, needle), "\"%s\" does not name %s", errbuf, needle);
}

Test(serve, bad_adapters_are_refused_naming_the_tensor_or_field) {
  fixture_t f;
  fixture_open(&f, 0, 0);
  const char *qa = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight",
             *db = "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight";
  size_t n;
  char *st = rewrite(&f, NULL, db, NULL, &n);
  expect_load_error(&f, st, n, f.cfg[0], db);
  free(st);
  st = rewrite(&f, qa, NULL, NULL, &n);
  expect_load_error(&f, st, n, f.cfg[0], qa);
  free(st);
  st = rewrite(&f, NULL, NULL, "base_model.model.model.layers.9.mlp.up_proj.lora_A.weight", &n);
  expect_load_error(&f, st, n, f.cfg[0], "layers.9.mlp.up_proj");
  free(st);
  /* rank: the config says 2, the tensors have 4 */
  json_t *j = json_loadb(f.cfg[0], f.cfg_len[0], 0, NULL);
  json_object_set_new(j, "r", json_integer(2));
  char *cfg2 = json_dumps(j, 0);
  expect_load_error(&f, f.st[0], f.st_len[0], cfg2, "rank");
  free(cfg2);
  json_object_set_new(j, "target_modules", json_pack("[s]", "qq_proj"));
  cfg2 = json_dumps(j, 0);
  expect_load_error(&f, f.st[0], f.st_len[0], cfg2, "target_modules");
  free(cfg2);
  json_decref(j);
  expect_load_error(&f, f.st[0], f.st_len[0], "{\"lora_alpha\": 8}", "\"r\"");
  expect_load_error(&f, f.st[0], f.st_len[0], "not json", "adapter_config.json");
  char garbage[4096];
  unsigned seed = 1;
  for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (char)rand_r(&seed);
  expect_load_error(&f, garbage, sizeof garbage, f.cfg[0], "adapter_model.safetensors");
  expect_load_error(&f, f.st[0], 100, f.cfg[0], "adapter_model.safetensors");
  /* a truncated data section */
  expect_load_error(&f, f.st[0], f.st_len[0] - 4, f.cfg[0], "data_offsets");
  fixture_close(&f);
}

Test(serve, adapter_free_zeroes_its_memory) {
  fixture_t f;
  fixture_open(&f, 0, 0);
  lt_adapter_t *a;
  OK(lt_adapter_load(f.eng, f.st[0], f.st_len[0], f.cfg[0], f.cfg_len[0], &a, errbuf,
                     sizeof errbuf));
  size_t bytes = lt_adapter_bytes(a);
  cr_assert_gt(bytes, 0);
  cr_assert_eq(lt_adapter_rank(a), 4);
  float *seen = malloc(bytes);
  memset(seen, 0xff, bytes);
  lt_adapter_free_observed(a, seen);
  cr_assert(all_zero(seen, bytes / sizeof(float)), "adapter memory was freed unzeroed");
  free(seen);
  fixture_close(&f);
}

/* ---- the picker ---------------------------------------------------------------------------- */

typedef struct {
  float z;
  int id;
} ref_cand_t;

static int ref_cmp(const void *a, const void *b) {
  const ref_cand_t *x = a, *y = b;
  if (x->z != y->z) return x->z > y->z ? -1 : 1;
  return x->id - y->id;
}

/* The truncated draw with the whole vocabulary sorted, as the picker did it before it selected
 * only the candidates the truncation reads: the reference it must equal. */
static int32_t ref_truncated(const float *lg, int nv, const lt_sample_params_t *sp, double u) {
  double mx = -INFINITY, t = sp->temperature;
  for (int j = 0; j < nv; j++) mx = fmax(mx, lg[j]);
  ref_cand_t *c = malloc((size_t)nv * sizeof *c);
  for (int j = 0; j < nv; j++) c[j] = (ref_cand_t){lg[j], j};
  qsort(c, (size_t)nv, sizeof *c, ref_cmp);
  int k = sp->top_k > 0 && sp->top_k < nv ? sp->top_k : nv;
  double tot = 0;
  if (k < nv || sp->top_p >= 1.0f)
    for (int j = 0; j < k; j++) tot += exp(((double)c[j].z - mx) / t);
  else
    for (int j = 0; j < nv; j++) tot += exp(((double)lg[j] - mx) / t);
  if (sp->top_p < 1.0f) {
    double cum = 0;
    int kk = 0;
    while (kk < k) {
      cum += exp(((double)c[kk].z - mx) / t) / tot;
      kk++;
      if (cum >= sp->top_p) break;
    }
    k = kk;
    tot = 0;
    for (int j = 0; j < k; j++) tot += exp(((double)c[j].z - mx) / t);
  }
  double acc = 0, target = u * tot;
  int32_t got = c[k - 1].id;
  for (int j = 0; j < k; j++) {
    acc += exp(((double)c[j].z - mx) / t);
    if (acc > target) {
      got = c[j].id;
      break;
    }
  }
  free(c);
  return got;
}

/* The picker reads only the candidates its truncation needs (a quickselect, then a sort of
 * those), not the whole vocabulary sorted at every token: over random vocabularies (with tied
 * logits, for the lowest-id rule), temperatures, top_k and top_p, every draw equals the
 * whole-sort reference's at the same u. */
Test(serve, the_truncated_draw_equals_the_whole_sort_at_every_setting) {
  unsigned seed = 11;
  const int sizes[] = {50, 500, 5000};
  const float tops[] = {1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.01f};
  int checked = 0;
  for (int round = 0; round < 1200; round++) {
    int nv = sizes[round % 3];
    float *lg = malloc((size_t)nv * sizeof *lg);
    bool peaked = round % 2;
    for (int j = 0; j < nv; j++) /* quantised: ties; peaked: a few tokens hold most of the mass */
      lg[j] = (float)((int)(rand_r(&seed) % 400)) / (peaked ? 10.0f : 100.0f);
    const int ks[] = {0, 1, 5, 40, nv - 1, nv + 3};
    lt_sample_params_t sp = {.max_tokens = 1, .temperature = 0.3f + (float)(rand_r(&seed) % 170) / 100.0f,
                             .top_p = tops[rand_r(&seed) % 6], .top_k = ks[rand_r(&seed) % 6]};
    lt_picker_t p;
    OK(lt_picker_init(&p, nv, 1, errbuf, sizeof errbuf));
    for (int d = 0; d < 4; d++) {
      double u = (double)(rand_r(&seed) % 1000000) / 1e6;
      int32_t got = lt_picker_truncated(&p, lg, &sp, u), want = ref_truncated(lg, nv, &sp, u);
      cr_assert_eq(got, want, "nv %d, temperature %g, top_k %d, top_p %g, u %g: %d, the whole sort %d", nv,
                   (double)sp.temperature, sp.top_k, (double)sp.top_p, u, got, want);
      checked++;
    }
    lt_picker_free(&p);
    free(lg);
  }
  cr_assert_eq(checked, 4800);
}

Test(serve, picker_is_seeded_and_top_alternatives_are_sorted_log_softmax) {
  enum { PV = 500, N = 40 };
  float *lg = malloc(sizeof(float) * PV);
  unsigned seed = 8;
  for (int j = 0; j < PV; j++) lg[j] = (float)(rand_r(&seed) % 1000) / 100.0f;
  lg[17] = lg[3] = 12.0f; /* a tie at the top: lowest id first */
  lt_picker_t a, b, c;
  OK(lt_picker_init(&a, PV, 42, errbuf, sizeof errbuf));
  OK(lt_picker_init(&b, PV, 42, errbuf, sizeof errbuf));
  OK(lt_picker_init(&c, PV, 43, errbuf, sizeof errbuf));
  lt_sample_params_t sp = {.max_tokens = 1, .temperature = 1.5f, .top_p = 0.9f, .top_k = 0};
  int same = 1;
  for (int i = 0; i < N; i++) {
    float la, lb, lc;
    int32_t ta = lt_picker_pick(&a, lg, &sp, &la, 0, NULL, NULL);
    int32_t tb = lt_picker_pick(&b, lg, &sp, &lb, 0, NULL, NULL);
    int32_t tc = lt_picker_pick(&c, lg, &sp, &lc, 0, NULL, NULL);
    cr_assert_eq(ta, tb);
    cr_assert_eq(la, lb);
    same &= ta == tc;
  }
  cr_assert(!same, "another seed picked the same %d tokens", N);
  double mx = -INFINITY, sum = 0;
  for (int j = 0; j < PV; j++) mx = fmax(mx, lg[j]);
  for (int j = 0; j < PV; j++) sum += exp(lg[j] - mx);
  int32_t ids[LT_PICKER_MAX_TOP];
  float lp[LT_PICKER_MAX_TOP], plp;
  lt_sample_params_t greedy = {.max_tokens = 1, .temperature = 0, .top_p = 1};
  int32_t t = lt_picker_pick(&a, lg, &greedy, &plp, LT_PICKER_MAX_TOP, ids, lp);
  cr_assert_eq(t, 3);
  cr_assert_eq(ids[0], 3);
  cr_assert_eq(ids[1], 17);
  cr_assert_float_eq(plp, lp[0], 1e-6);
  for (int k = 0; k < LT_PICKER_MAX_TOP; k++) {
    cr_assert_float_eq(lp[k], lg[ids[k]] - mx - log(sum), 1e-5, "top %d", k);
    if (k) cr_assert(lg[ids[k - 1]] > lg[ids[k]] || (lg[ids[k - 1]] == lg[ids[k]] &&
                                                    ids[k - 1] < ids[k]), "not sorted at %d", k);
    int above = 0; /* exactly k tokens rank above the k-th */
    for (int j = 0; j < PV; j++)
      above += lg[j] > lg[ids[k]] || (lg[j] == lg[ids[k]] && j < ids[k]);
    cr_assert_eq(above, k, "top %d is not the %d-th most likely", k, k);
  }
  lt_picker_free(&a);
  lt_picker_free(&b);
  lt_picker_free(&c);
  free(lg);
}
