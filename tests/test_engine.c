/* Tests of the training engine (workers/engine/lt_engine, lt_safetensors, lt_backend_cpu): parity with
 * the PyTorch reference in tests/reference/llama_ref.py (logits, loss, LoRA gradients, AdamW
 * steps, greedy sampling), determinism, batch invariance of sampling, state files, PEFT export,
 * full-parameter training and malformed safetensors. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_config.h"
#include "lt_engine.h"
#include "lt_engine_int.h"
#include "lt_safetensors.h"
#include "lt_test.h"

static char errbuf[512];

#define OK(call)                                                                               \
  do {                                                                                         \
    errbuf[0] = 0;                                                                             \
    lt_err_t e_ = (call);                                                                      \
    cr_assert_eq(e_, LT_OK, "%s failed: %s (%s)", #call, errbuf, lt_err_name(e_));            \
  } while (0)

static void mktmp(char *out, size_t n) {
  snprintf(out, n, "/tmp/lt_engine_test_XXXXXX");
  cr_assert_not_null(mkdtemp(out));
}

static void rm_rf(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static lt_model_config_t small_config(int H, int KV, int bias, int tied, float rope_factor) {
  lt_model_config_t c = {.vocab_size = 67,
                         .hidden_size = 32,
                         .intermediate_size = 44,
                         .num_layers = 2,
                         .num_heads = H,
                         .num_kv_heads = KV,
                         .head_dim = 32 / H,
                         .max_position = 64,
                         .rms_norm_eps = 1e-5f,
                         .rope_theta = 10000.0f,
                         .rope_linear_factor = rope_factor,
                         .tie_embeddings = tied,
                         .qkv_bias = bias};
  return c;
}

typedef struct fixture {
  lt_model_config_t c; /* the model's shape */
  char dir[256], model[300];
  lt_backend_t *be;
  lt_engine_t *eng;
} fixture_t;

/* A random model of shape c in a temporary directory, open on a CPU backend of threads. */
static void fixture_open(fixture_t *f, lt_model_config_t c, uint64_t seed, int threads) {
  f->c = c;
  mktmp(f->dir, sizeof f->dir);
  snprintf(f->model, sizeof f->model, "%s/model", f->dir);
  OK(lt_model_init_random(&f->c, f->model, seed, 0.3f, 0.1f, errbuf, sizeof errbuf));
  OK(lt_backend_cpu_new(threads, &f->be, errbuf, sizeof errbuf));
  OK(lt_engine_open(f->model, f->be, &f->eng, errbuf, sizeof errbuf));
}

static void fixture_close(fixture_t *f) {
  lt_engine_close(f->eng);
  lt_backend_destroy(f->be);
  rm_rf(f->dir);
}

/* A session of configuration sc on the fixture's engine. */
static lt_session_t *fixture_session(fixture_t *f, lt_session_config_t sc) {
  lt_session_t *s;
  OK(lt_session_new(f->eng, &sc, &s, errbuf, sizeof errbuf));
  return s;
}

/* Two sessions of one configuration on the fixture's engine: a pair trained side by side. */
static void open_pair(fixture_t *f, lt_session_config_t sc, lt_session_t **s, lt_session_t **t) {
  *s = fixture_session(f, sc);
  *t = fixture_session(f, sc);
}

static void close_pair(fixture_t *f, lt_session_t *s, lt_session_t *t) {
  lt_session_destroy(s);
  lt_session_destroy(t);
  fixture_close(f);
}

/* One optimizer step of each session of a pair: their gradient norms agree. */
static void step_pair(lt_session_t *s, lt_session_t *t, const lt_adamw_t *opt) {
  float n1, n2;
  OK(lt_optim_step(s, opt, &n1, errbuf, sizeof errbuf));
  OK(lt_optim_step(t, opt, &n2, errbuf, sizeof errbuf));
  cr_assert_float_eq(n1, n2, 1e-5 * n1, "grad norms %g vs %g", n1, n2);
}

static void rand_tokens(int32_t *t, size_t n, int V, unsigned *seed) {
  for (size_t i = 0; i < n; i++) t[i] = (int32_t)(rand_r(seed) % V);
}

/* ---- parity with PyTorch ------------------------------------------------------------------ */

/* max |a - b| / max |b|: the error relative to the reference's scale */
static double rel_err(const float *a, const float *b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    double x = fabs((double)a[i] - b[i]);
    d = x > d ? x : d;
    m = fabs((double)b[i]) > m ? fabs((double)b[i]) : m;
  }
  return m > 0 ? d / m : d;
}

/* Compares every tensor of `got` (a safetensors file) with `prefix`+name in ref. */
static void compare_tensors(const char *got_path, lt_st_t *ref, const char *prefix, double tol,
                            const char *what) {
  lt_st_t *got;
  OK(lt_st_open_file(got_path, &got, errbuf, sizeof errbuf));
  cr_assert_gt(lt_st_count(got), 0);
  double worst = 0;
  for (size_t i = 0; i < lt_st_count(got); i++) {
    const lt_st_tensor_t *t = lt_st_at(got, i);
    char name[256];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    const float *a, *b;
    float *oa, *ob;
    OK(lt_st_get_f32(got, t->name, t->ndim, t->shape, &a, &oa, errbuf, sizeof errbuf));
    OK(lt_st_get_f32(ref, name, t->ndim, t->shape, &b, &ob, errbuf, sizeof errbuf));
    double e = rel_err(a, b, (size_t)t->numel);
    cr_assert_lt(e, tol, "%s: %s relative error %.3g >= %.3g", what, t->name, e, tol);
    worst = e > worst ? e : worst;
    free(oa);
    free(ob);
  }
  cr_log_info("%s: worst relative error %.3g (tolerance %.3g)", what, worst, tol);
  lt_st_close(got);
}

static void parity_case(lt_model_config_t c, int importance) {
  fixture_t f;
  fixture_open(&f, c, 42, 2);
  const int B = 3, T = 11, N = B * T, V = c.vocab_size, n_greedy = 8;
  lt_session_config_t sc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 7};
  lt_session_t *s;
  OK(lt_session_new(f.eng, &sc, &s, errbuf, sizeof errbuf));
  lt_adamw_t opt = {.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                    .weight_decay = 0.1f, .max_grad_norm = importance ? 0.0f : 0.5f};
  char path[512];
  snprintf(path, sizeof path, "%s/p0", f.dir);
  OK(lt_export_peft(s, path, "test-model", errbuf, sizeof errbuf));

  /* two batches; prompt positions (first 3 of each row) have weight 0 */
  int32_t tok[2][N], tgt[2][N];
  float w[2][N], adv[2][N], slp[2][N], ftok[2][N], ftgt[2][N];
  unsigned seed = 3;
  for (int b = 0; b < 2; b++) {
    rand_tokens(tok[b], N, V, &seed);
    rand_tokens(tgt[b], N, V, &seed);
    for (int i = 0; i < N; i++) {
      w[b][i] = (i % T) < 3 ? 0.0f : 1.0f + 0.5f * (float)(i % 3);
      adv[b][i] = (float)((int)(rand_r(&seed) % 200) - 100) / 50.0f;
      slp[b][i] = -4.0f - (float)(rand_r(&seed) % 100) / 100.0f;
      ftok[b][i] = (float)tok[b][i];
      ftgt[b][i] = (float)tgt[b][i];
    }
  }
  int32_t prompt[5] = {1, 5, 9, 2, 60};
  float fprompt[5] = {1, 5, 9, 2, 60};
  lt_st_entry_t ent[16];
  char names[16][32];
  int ne = 0;
#define ADD(nm, ptr, d0, d1, nd)                                                               \
  do {                                                                                         \
    snprintf(names[ne], sizeof names[ne], "%s", nm);                                           \
    ent[ne] = (lt_st_entry_t){.name = names[ne], .dtype = LT_ST_F32, .ndim = nd, .data = ptr}; \
    ent[ne].shape[0] = d0;                                                                     \
    ent[ne].shape[1] = d1;                                                                     \
    ne++;                                                                                      \
  } while (0)
  for (int b = 0; b < 2; b++) {
    char nm[32];
    snprintf(nm, sizeof nm, "b%d.tokens", b);
    ADD(nm, ftok[b], B, T, 2);
    snprintf(nm, sizeof nm, "b%d.targets", b);
    ADD(nm, ftgt[b], B, T, 2);
    snprintf(nm, sizeof nm, "b%d.weights", b);
    ADD(nm, w[b], B, T, 2);
    snprintf(nm, sizeof nm, "b%d.adv", b);
    ADD(nm, adv[b], B, T, 2);
    snprintf(nm, sizeof nm, "b%d.slogp", b);
    ADD(nm, slp[b], B, T, 2);
  }
  ADD("prompt", fprompt, 5, 0, 1);
  snprintf(path, sizeof path, "%s/inputs.safetensors", f.dir);
  OK(lt_st_write(path, ent, (size_t)ne, errbuf, sizeof errbuf));
  snprintf(path, sizeof path, "%s/params.json", f.dir);
  FILE *fp = fopen(path, "w");
  cr_assert_not_null(fp);
  fprintf(fp,
          "{\"lr\": %.9g, \"beta1\": %.9g, \"beta2\": %.9g, \"eps\": %.9g, \"weight_decay\": "
          "%.9g, \"max_grad_norm\": %.9g, \"rank\": %d, \"alpha\": %.9g, \"loss\": \"%s\", "
          "\"n_greedy\": %d}\n",
          (double)opt.lr, (double)opt.beta1, (double)opt.beta2, (double)opt.eps,
          (double)opt.weight_decay, (double)opt.max_grad_norm, sc.rank, (double)sc.alpha,
          importance ? "is" : "ce", n_greedy);
  fclose(fp);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/llama_ref.py %s",
           LT_SOURCE_ROOT, f.dir);
  cr_assert_eq(system(cmd), 0, "reference failed: %s", cmd);
  lt_st_t *ref;
  snprintf(path, sizeof path, "%s/ref.safetensors", f.dir);
  OK(lt_st_open_file(path, &ref, errbuf, sizeof errbuf));

  lt_loss_t kind = importance ? LT_LOSS_IMPORTANCE : LT_LOSS_CROSS_ENTROPY;
  lt_batch_t b0 = {.B = B, .T = T, .tokens = tok[0], .targets = tgt[0], .weights = w[0], .advantages = adv[0], .sampler_logp = slp[0]};
  lt_batch_t b1 = {.B = B, .T = T, .tokens = tok[1], .targets = tgt[1], .weights = w[1], .advantages = adv[1], .sampler_logp = slp[1]};
  float loss, logp[N];
  OK(lt_forward_backward(s, &b0, kind, &loss, NULL, errbuf, sizeof errbuf));
  OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  snprintf(path, sizeof path, "%s/p1.safetensors", f.dir);
  OK(lt_dump_tensors(s, 0, path, errbuf, sizeof errbuf));
  compare_tensors(path, ref, "p1.", 1e-4, "adapter after AdamW step 1");

  /* logits, loss, log-probs and gradients on batch 1 */
  float *logits = malloc((size_t)N * V * sizeof(float));
  OK(lt_logits(s, B, T, tok[1], logits, errbuf, sizeof errbuf));
  const float *rl, *rloss, *rlogp;
  float *o1, *o2, *o3;
  int64_t lshape[3] = {B, T, V}, one = 1, bt[2] = {B, T};
  OK(lt_st_get_f32(ref, "logits1", 3, lshape, &rl, &o1, errbuf, sizeof errbuf));
  double le = rel_err(logits, rl, (size_t)N * V);
  cr_log_info("logits relative error %.3g", le);
  cr_assert_lt(le, 1e-4, "logits relative error %.3g", le);
  OK(lt_forward_backward(s, &b1, kind, &loss, logp, errbuf, sizeof errbuf));
  OK(lt_st_get_f32(ref, "loss1", 1, &one, &rloss, &o2, errbuf, sizeof errbuf));
  OK(lt_st_get_f32(ref, "logp1", 2, bt, &rlogp, &o3, errbuf, sizeof errbuf));
  cr_log_info("loss %.7f reference %.7f", (double)loss, (double)rloss[0]);
  cr_assert_lt(fabs((double)loss - rloss[0]), 1e-4 * fabs((double)rloss[0]) + 1e-6);
  cr_assert_lt(rel_err(logp, rlogp, (size_t)N), 1e-4);
  snprintf(path, sizeof path, "%s/g1.safetensors", f.dir);
  OK(lt_dump_tensors(s, 1, path, errbuf, sizeof errbuf));
  compare_tensors(path, ref, "grad1.", 1e-3, "LoRA gradients");
  OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  snprintf(path, sizeof path, "%s/p2.safetensors", f.dir);
  OK(lt_dump_tensors(s, 0, path, errbuf, sizeof errbuf));
  /* 1e-3, as the gradients it follows from: AdamW divides each first moment by the root of the
   * second, so where both are small (lora_B, which starts at zero) the gradients' last bits show.
   * The BLAS kernels OpenBLAS picks for the chip sum in their own order: an AVX2-only AMD EPYC
   * gave 1.34e-4 here on the importance-loss case, AVX-512 machines about 1e-5. */
  compare_tensors(path, ref, "p2.", 1e-3, "adapter after AdamW step 2");

  /* greedy sampling gives the reference's tokens */
  const int32_t *pp[1] = {prompt};
  int plen = 5, glen;
  int32_t gen[n_greedy];
  lt_sample_params_t sp = {.max_tokens = n_greedy, .temperature = 0, .top_p = 1};
  OK(lt_sample(s, 1, pp, &plen, &sp, gen, NULL, &glen, errbuf, sizeof errbuf));
  const float *rg;
  float *o4;
  int64_t ng = n_greedy;
  OK(lt_st_get_f32(ref, "greedy", 1, &ng, &rg, &o4, errbuf, sizeof errbuf));
  cr_assert_eq(glen, n_greedy);
  for (int i = 0; i < n_greedy; i++)
    cr_assert_eq(gen[i], (int32_t)rg[i], "greedy token %d: %d, reference %d", i, gen[i],
                 (int)rg[i]);
  free(o1), free(o2), free(o3), free(o4);
  free(logits);
  lt_st_close(ref);
  lt_session_destroy(s);
  fixture_close(&f);
}

Test(engine, matches_pytorch_with_gqa_qkv_bias_untied_cross_entropy, .timeout = 300) {
  parity_case(small_config(4, 2, 1, 0, 1.0f), 0);
}

Test(engine, matches_pytorch_with_tied_embeddings_linear_rope_importance_loss, .timeout = 300) {
  parity_case(small_config(4, 4, 0, 1, 2.0f), 1);
}

/* ---- determinism and invariance ---------------------------------------------------------- */

static void train_steps(lt_engine_t *eng, uint64_t seed, int steps, const char *dump) {
  lt_session_config_t sc = {.rank = 8, .alpha = 16, .dropout = 0.1f, .targets = LT_TARGET_ALL,
                            .seed = seed};
  lt_session_t *s;
  OK(lt_session_new(eng, &sc, &s, errbuf, sizeof errbuf));
  const lt_model_config_t *c = lt_engine_config(eng);
  int B = 2, T = 16, N = B * T;
  int32_t tok[N], tgt[N];
  unsigned rs = 11;
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                    .weight_decay = 0.01f, .max_grad_norm = 1.0f};
  for (int k = 0; k < steps; k++) {
    rand_tokens(tok, N, c->vocab_size, &rs);
    rand_tokens(tgt, N, c->vocab_size, &rs);
    lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  }
  OK(lt_dump_tensors(s, 0, dump, errbuf, sizeof errbuf));
  lt_session_destroy(s);
}

static int files_equal(const char *a, const char *b) {
  char cmd[1100];
  snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
  return system(cmd) == 0;
}

Test(engine, same_seed_and_data_give_bitwise_identical_adapter) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 5, 2);
  char a[512], b[512], d[512];
  snprintf(a, sizeof a, "%s/a.safetensors", f.dir);
  snprintf(b, sizeof b, "%s/b.safetensors", f.dir);
  snprintf(d, sizeof d, "%s/d.safetensors", f.dir);
  train_steps(f.eng, 99, 4, a);
  train_steps(f.eng, 99, 4, b);
  train_steps(f.eng, 100, 4, d);
  cr_assert(files_equal(a, b), "two runs with the same seed differ");
  cr_assert(!files_equal(a, d), "a different seed gave the same adapter");
  fixture_close(&f);
}

Test(engine, sampled_tokens_do_not_depend_on_the_rest_of_the_batch) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 8, 2);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 1});
  enum { NP = 4, MT = 12 };
  int32_t p0[3] = {1, 2, 3}, p1[7] = {9, 8, 7, 6, 5, 4, 3}, p2[1] = {40}, p3[5] = {3, 3, 3, 3, 3};
  const int32_t *prompts[NP] = {p0, p1, p2, p3};
  int lens[NP] = {3, 7, 1, 5};
  uint64_t seeds[NP] = {101, 202, 303, 404};
  int32_t stop[1] = {13};
  lt_sample_params_t sp = {.max_tokens = MT, .temperature = 0.9f, .top_p = 0.95f, .top_k = 30,
                           .stop = stop, .n_stop = 1, .seeds = seeds};
  int32_t all_t[NP * MT];
  float all_l[NP * MT];
  int all_n[NP];
  OK(lt_sample(s, NP, prompts, lens, &sp, all_t, all_l, all_n, errbuf, sizeof errbuf));
  for (int i = 0; i < NP; i++) {
    int32_t t[MT];
    float l[MT];
    int n;
    lt_sample_params_t one = sp;
    one.seeds = &seeds[i];
    OK(lt_sample(s, 1, &prompts[i], &lens[i], &one, t, l, &n, errbuf, sizeof errbuf));
    cr_assert_eq(n, all_n[i], "prompt %d: %d tokens alone, %d in the batch", i, n, all_n[i]);
    cr_assert_eq(memcmp(t, all_t + i * MT, (size_t)n * sizeof(int32_t)), 0,
                 "prompt %d: tokens differ alone and in the batch", i);
    cr_assert_eq(memcmp(l, all_l + i * MT, (size_t)n * sizeof(float)), 0,
                 "prompt %d: log-probs differ alone and in the batch", i);
    for (int j = 0; j < n; j++) cr_assert(l[j] <= 0 && isfinite(l[j]));
  }
  /* different seeds give different samples at this temperature */
  cr_assert(memcmp(all_t, all_t + 2 * MT, 4 * sizeof(int32_t)) != 0 || all_n[0] < 4);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* ---- state files ------------------------------------------------------------------------- */

/* `steps` AdamW steps of x on one batch of random tokens drawn from `seed` (B=2, T=16). */
static void random_steps(lt_session_t *x, int vocab, unsigned seed, int steps) {
  int32_t tok[32], tgt[32];
  rand_tokens(tok, 32, vocab, &seed);
  rand_tokens(tgt, 32, vocab, &seed);
  lt_batch_t b = {.B = 2, .T = 16, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  for (int k = 0; k < steps; k++) {
    OK(lt_forward_backward(x, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(x, &opt, NULL, errbuf, sizeof errbuf));
  }
}

Test(engine, save_then_load_resumes_training_bitwise) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 9, 2);
  lt_session_config_t sc = {.rank = 4, .alpha = 4, .targets = LT_TARGET_Q | LT_TARGET_V |
                                                                 LT_TARGET_DOWN, .seed = 3};
  lt_session_t *s, *t;
  OK(lt_session_new(f.eng, &sc, &s, errbuf, sizeof errbuf));
  lt_session_config_t sc2 = sc;
  sc2.seed = 12345; /* the state overrides it */
  OK(lt_session_new(f.eng, &sc2, &t, errbuf, sizeof errbuf));
  random_steps(s, f.c.vocab_size, 4, 2);
  char st[512], a[512], bb[512];
  snprintf(st, sizeof st, "%s/state.bin", f.dir);
  snprintf(a, sizeof a, "%s/a.safetensors", f.dir);
  snprintf(bb, sizeof bb, "%s/b.safetensors", f.dir);
  OK(lt_save_state(s, st, 777, errbuf, sizeof errbuf));
  uint64_t cursor = 0;
  OK(lt_load_state(t, st, &cursor, errbuf, sizeof errbuf));
  cr_assert_eq(cursor, 777);
  cr_assert_eq(lt_session_step(t), 2);
  random_steps(s, f.c.vocab_size, 4, 1);
  random_steps(t, f.c.vocab_size, 4, 1);
  OK(lt_dump_tensors(s, 0, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t, 0, bb, errbuf, sizeof errbuf));
  cr_assert(files_equal(a, bb), "resumed run differs from the uninterrupted one");
  close_pair(&f, s, t);
}

static lt_err_t load_expect(lt_session_t *s, const char *path, const char *needle) {
  errbuf[0] = 0;
  lt_err_t e = lt_load_state(s, path, NULL, errbuf, sizeof errbuf);
  cr_assert_neq(e, LT_OK, "loading %s should fail", path);
  cr_assert_not_null(strstr(errbuf, needle), "message \"%s\" lacks \"%s\"", errbuf, needle);
  return e;
}

Test(engine, damaged_or_foreign_state_files_fail_clearly) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 9, 1);
  lt_session_config_t sc = {.rank = 4, .alpha = 4, .targets = LT_TARGET_ALL, .seed = 3};
  lt_session_t *s, *other;
  OK(lt_session_new(f.eng, &sc, &s, errbuf, sizeof errbuf));
  char st[512], bad[512], cmd[1200];
  snprintf(st, sizeof st, "%s/state.bin", f.dir);
  snprintf(bad, sizeof bad, "%s/bad.bin", f.dir);
  OK(lt_save_state(s, st, 1, errbuf, sizeof errbuf));
  struct stat sb;
  cr_assert_eq(stat(st, &sb), 0);
  /* one flipped byte in the payload */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", st, bad);
  cr_assert_eq(system(cmd), 0);
  int fd = open(bad, O_RDWR);
  unsigned char byte;
  cr_assert_eq(pread(fd, &byte, 1, sb.st_size / 2), 1);
  byte ^= 0x10;
  cr_assert_eq(pwrite(fd, &byte, 1, sb.st_size / 2), 1);
  close(fd);
  cr_assert_eq(load_expect(s, bad, "checksum"), LT_ERR_CORRUPT);
  /* truncated */
  cr_assert_eq(truncate(bad, sb.st_size - 100), 0);
  cr_assert_eq(load_expect(s, bad, "truncated"), LT_ERR_CORRUPT);
  /* foreign file */
  snprintf(cmd, sizeof cmd, "cp '%s/config.json' '%s'", f.model, bad);
  cr_assert_eq(system(cmd), 0);
  cr_assert_eq(load_expect(s, bad, "not a Lathe training state"), LT_ERR_CORRUPT);
  /* another adapter shape */
  lt_session_config_t sc2 = sc;
  sc2.rank = 8;
  OK(lt_session_new(f.eng, &sc2, &other, errbuf, sizeof errbuf));
  cr_assert_eq(load_expect(other, st, "rank"), LT_ERR_INVALID);
  /* a newer format is refused by its version */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", st, bad);
  cr_assert_eq(system(cmd), 0);
  fd = open(bad, O_RDWR);
  unsigned char v3 = 3;
  cr_assert_eq(pwrite(fd, &v3, 1, 8), 1);
  close(fd);
  cr_assert_eq(load_expect(s, bad, "version 3"), LT_ERR_UNSUPPORTED);
  /* a failed load leaves the session usable and unchanged: its tensors are the same bytes as
   * before the damaged files were tried (a restore checks the whole file before copying) */
  char before[512], after[512];
  snprintf(before, sizeof before, "%s/before.safetensors", f.dir);
  snprintf(after, sizeof after, "%s/after.safetensors", f.dir);
  lt_session_t *u;
  OK(lt_session_new(f.eng, &sc, &u, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(u, 0, before, errbuf, sizeof errbuf));
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", st, bad);
  cr_assert_eq(system(cmd), 0);
  fd = open(bad, O_RDWR);
  cr_assert_eq(pread(fd, &byte, 1, sb.st_size - 9), 1); /* the payload's last byte */
  byte ^= 0x01;
  cr_assert_eq(pwrite(fd, &byte, 1, sb.st_size - 9), 1);
  close(fd);
  cr_assert_eq(load_expect(u, bad, "checksum"), LT_ERR_CORRUPT);
  OK(lt_dump_tensors(u, 0, after, errbuf, sizeof errbuf));
  cr_assert(files_equal(before, after), "a damaged state file changed the session");
  lt_session_destroy(u);
  OK(lt_load_state(s, st, NULL, errbuf, sizeof errbuf));
  lt_session_destroy(other);
  lt_session_destroy(s);
  fixture_close(&f);
}

Test(engine, a_version_1_state_file_is_still_restored) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 9, 1);
  lt_session_config_t sc = {.rank = 4, .alpha = 4, .targets = LT_TARGET_ALL, .seed = 3};
  lt_session_t *s, *t;
  OK(lt_session_new(f.eng, &sc, &s, errbuf, sizeof errbuf));
  OK(lt_session_new(f.eng, &sc, &t, errbuf, sizeof errbuf));
  random_steps(s, f.c.vocab_size, 5, 1);
  char st[512], a[512], bb[512];
  snprintf(st, sizeof st, "%s/state.bin", f.dir);
  snprintf(a, sizeof a, "%s/a.safetensors", f.dir);
  snprintf(bb, sizeof bb, "%s/b.safetensors", f.dir);
  OK(lt_save_state(s, st, 41, errbuf, sizeof errbuf));
  /* rewrite it as the version-1 format wrote it: version field 1, the old checksum */
  size_t len;
  unsigned char *buf = (unsigned char *)lt_test_slurp(st, &len);
  cr_assert(buf && len > 16);
  buf[8] = 1;
  uint64_t sum = lt_engine_state_cks_v1(buf, len - 8);
  for (int j = 0; j < 8; j++) buf[len - 8 + j] = (unsigned char)(sum >> (8 * j));
  FILE *fp = fopen(st, "wb");
  cr_assert(fp && fwrite(buf, 1, len, fp) == len && fclose(fp) == 0);
  uint64_t cursor = 0;
  OK(lt_load_state(t, st, &cursor, errbuf, sizeof errbuf));
  cr_assert_eq(cursor, 41);
  cr_assert_eq(lt_session_step(t), 1);
  OK(lt_dump_tensors(s, 0, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t, 0, bb, errbuf, sizeof errbuf));
  cr_assert(files_equal(a, bb), "the version-1 file restored other tensors");
  /* and the old checksum is checked: one flipped payload byte is refused */
  buf[len / 2] ^= 0x01;
  fp = fopen(st, "wb");
  cr_assert(fp && fwrite(buf, 1, len, fp) == len && fclose(fp) == 0);
  cr_assert_eq(load_expect(t, st, "checksum"), LT_ERR_CORRUPT);
  free(buf);
  lt_session_destroy(s);
  lt_session_destroy(t);
  fixture_close(&f);
}

/* ---- PEFT export ------------------------------------------------------------------------- */

Test(engine, peft_export_has_peft_names_shapes_and_config) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 2, 1);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = 4, .alpha = 16, .dropout = 0.05f,
                            .targets = LT_TARGET_Q | LT_TARGET_O | LT_TARGET_DOWN, .seed = 3});
  char dir[512], path[600];
  snprintf(dir, sizeof dir, "%s/peft", f.dir);
  OK(lt_export_peft(s, dir, "lathe/tiny", errbuf, sizeof errbuf));
  snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
  lt_st_t *st;
  OK(lt_st_open_file(path, &st, errbuf, sizeof errbuf));
  cr_assert_eq(lt_st_count(st), 2 * 2 * 3);
  const lt_st_tensor_t *a =
      lt_st_find(st, "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight");
  const lt_st_tensor_t *b =
      lt_st_find(st, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  cr_assert_not_null(a);
  cr_assert_not_null(b);
  cr_assert(a->ndim == 2 && a->shape[0] == 4 && a->shape[1] == 32, "lora_A is [r, in]");
  cr_assert(b->ndim == 2 && b->shape[0] == 32 && b->shape[1] == 4, "lora_B is [out, r]");
  cr_assert_eq(a->dtype, LT_ST_F32);
  /* A within PEFT's kaiming-uniform bound 1/sqrt(in), B zero */
  const float *ad = a->data, *bd = b->data;
  double bound = 1.0 / sqrt(32.0), amax = 0;
  for (int i = 0; i < 4 * 32; i++) amax = fabs(ad[i]) > amax ? fabs(ad[i]) : amax;
  cr_assert(amax <= bound && amax > 0.5 * bound);
  for (int i = 0; i < 32 * 4; i++) cr_assert_eq(bd[i], 0.0f);
  lt_st_close(st);
  snprintf(path, sizeof path, "%s/adapter_config.json", dir);
  json_error_t je;
  json_t *j = json_load_file(path, 0, &je);
  cr_assert_not_null(j);
  cr_assert_str_eq(json_string_value(json_object_get(j, "peft_type")), "LORA");
  cr_assert_str_eq(json_string_value(json_object_get(j, "task_type")), "CAUSAL_LM");
  cr_assert_str_eq(json_string_value(json_object_get(j, "bias")), "none");
  cr_assert_str_eq(json_string_value(json_object_get(j, "base_model_name_or_path")),
                   "lathe/tiny");
  cr_assert_eq(json_integer_value(json_object_get(j, "r")), 4);
  cr_assert_float_eq(json_number_value(json_object_get(j, "lora_alpha")), 16.0, 1e-9);
  cr_assert_float_eq(json_number_value(json_object_get(j, "lora_dropout")), 0.05, 1e-6);
  json_t *tm = json_object_get(j, "target_modules");
  cr_assert_eq(json_array_size(tm), 3);
  cr_assert_str_eq(json_string_value(json_array_get(tm, 0)), "q_proj");
  cr_assert_str_eq(json_string_value(json_array_get(tm, 1)), "o_proj");
  cr_assert_str_eq(json_string_value(json_array_get(tm, 2)), "down_proj");
  json_decref(j);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* What a storage quota counts a saving call as before any checkpoint is stored: the state file
 * and the adapter's tensors, known from the model's config alone. The files a session writes are
 * that much, plus only the safetensors header (its tensors' names, a few hundred bytes each). */
Test(engine, a_checkpoints_bytes_are_known_from_the_config_before_it_is_written) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 2, 1);
  unsigned targets[] = {LT_TARGET_Q | LT_TARGET_O | LT_TARGET_DOWN, LT_TARGET_ALL, LT_TARGET_K};
  int ranks[] = {4, 8, 1};
  for (int i = 0; i < 3; i++) {
    lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = ranks[i], .alpha = 16, .targets = targets[i],
                                                                .seed = 3});
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/ckpt%d", f.dir, i);
    OK(lt_export_peft(s, dir, "lathe/tiny", errbuf, sizeof errbuf));
    snprintf(path, sizeof path, "%s/state.bin", dir);
    OK(lt_save_state(s, path, 1, errbuf, sizeof errbuf));
    struct stat st_state, st_adapter;
    cr_assert_eq(stat(path, &st_state), 0);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    cr_assert_eq(stat(path, &st_adapter), 0);
    uint64_t est = lt_lora_checkpoint_bytes(lt_engine_config(f.eng), ranks[i], targets[i]);
    uint64_t n = lt_session_num_params(s), written = (uint64_t)st_state.st_size + (uint64_t)st_adapter.st_size;
    cr_expect_eq(est, written - (st_adapter.st_size - 4 * n), "rank %d targets 0x%x: %llu estimated, %llu written",
                 ranks[i], targets[i], (unsigned long long)est, (unsigned long long)written);
    cr_expect((uint64_t)st_adapter.st_size - 4 * n < 200 * 2 * 2 * 7, "the header only: %lld bytes for %llu params",
              (long long)st_adapter.st_size, (unsigned long long)n);
    lt_session_destroy(s);
  }
  fixture_close(&f);
}

/* ---- training behaviour ------------------------------------------------------------------ */

Test(engine, full_parameter_training_overfits_a_batch_and_exports_a_loadable_model) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 1, 1.0f), 21, 2);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.full = 1, .seed = 1});
  int32_t tok[48], tgt[48];
  unsigned rs = 17;
  rand_tokens(tok, 48, f.c.vocab_size, &rs);
  rand_tokens(tgt, 48, f.c.vocab_size, &rs);
  lt_batch_t b = {.B = 3, .T = 16, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                    .max_grad_norm = 1.0f};
  float first = 0, loss = 0;
  for (int k = 0; k < 60; k++) {
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &loss, NULL, errbuf, sizeof errbuf));
    if (k == 0) first = loss;
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  }
  cr_log_info("full fine-tune: loss %.3f -> %.3f", (double)first, (double)loss);
  cr_assert_gt(first, 3.0f);
  cr_assert_lt(loss, 0.5f * first, "loss %.3f did not drop from %.3f", loss, first);
  /* the exported model reproduces the session's loss when loaded as a base model */
  char dir[512];
  snprintf(dir, sizeof dir, "%s/trained", f.dir);
  OK(lt_export_model(s, dir, errbuf, sizeof errbuf));
  float l1, l2;
  OK(lt_forward(s, &b, LT_LOSS_CROSS_ENTROPY, &l1, NULL, errbuf, sizeof errbuf));
  lt_engine_t *e2;
  OK(lt_engine_open(dir, f.be, &e2, errbuf, sizeof errbuf));
  lt_session_config_t lc = {.rank = 2, .alpha = 2, .targets = LT_TARGET_Q, .seed = 1};
  lt_session_t *s2;
  OK(lt_session_new(e2, &lc, &s2, errbuf, sizeof errbuf));
  OK(lt_forward(s2, &b, LT_LOSS_CROSS_ENTROPY, &l2, NULL, errbuf, sizeof errbuf));
  cr_assert_float_eq(l1, l2, 1e-5, "exported model: loss %.6f vs %.6f", l2, l1);
  lt_session_destroy(s2);
  lt_engine_close(e2);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* Every trainable tensor of s and t (dumped into dir) agrees within tol, relative. */
static void assert_same_tensors(lt_session_t *s, lt_session_t *t, const char *dir, double tol, const char *what) {
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/a.safetensors", dir);
  snprintf(b, sizeof b, "%s/b.safetensors", dir);
  OK(lt_dump_tensors(s, 0, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t, 0, b, errbuf, sizeof errbuf));
  lt_st_t *sa, *sb;
  OK(lt_st_open_file(a, &sa, errbuf, sizeof errbuf));
  OK(lt_st_open_file(b, &sb, errbuf, sizeof errbuf));
  for (size_t i = 0; i < lt_st_count(sa); i++) {
    const lt_st_tensor_t *x = lt_st_at(sa, i), *y = lt_st_find(sb, x->name);
    cr_assert_not_null(y);
    double e = rel_err(x->data, y->data, (size_t)x->numel);
    cr_assert_lt(e, tol, "%s: %s differ by %.3g", x->name, what, e);
  }
  lt_st_close(sa);
  lt_st_close(sb);
}

Test(engine, gradient_accumulation_of_two_halves_equals_one_full_batch) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 31, 1);
  lt_session_t *s, *t;
  open_pair(&f, (lt_session_config_t){.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 5}, &s, &t);
  int32_t tok[32], tgt[32];
  unsigned rs = 2;
  rand_tokens(tok, 32, f.c.vocab_size, &rs);
  rand_tokens(tgt, 32, f.c.vocab_size, &rs);
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                    .max_grad_norm = 0.1f};
  for (int k = 0; k < 2; k++) { /* step 1 makes B nonzero, step 2 compares */
    lt_batch_t full = {.B = 2, .T = 16, .tokens = tok, .targets = tgt};
    lt_batch_t h0 = {.B = 1, .T = 16, .tokens = tok, .targets = tgt};
    lt_batch_t h1 = {.B = 1, .T = 16, .tokens = tok + 16, .targets = tgt + 16};
    OK(lt_forward_backward(s, &full, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_forward_backward(t, &h0, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_forward_backward(t, &h1, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    step_pair(s, t, &opt);
  }
  assert_same_tensors(s, t, f.dir, 1e-4, "accumulated vs full batch");
  close_pair(&f, s, t);
}

/* The LM head, the loss and its gradient run over the batch in chunks of rows
 * (LT_ENGINE_HEAD_ROWS), so N x V logits never exist: chunks of 7 rows (7 chunks, the last of
 * 6) compute what one chunk of all 48 computes — loss, log-probs, logits, and after two AdamW
 * steps every trainable tensor, the LM head's too in full training — within float rounding. */
static void head_chunks_case(int full) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 37, 2);
  lt_session_config_t sc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 9, .full = full};
  lt_session_t *s, *t;
  open_pair(&f, sc, &s, &t);
  enum { B = 3, T = 16, N = B * T };
  int32_t tok[N], tgt[N];
  unsigned rs = 4;
  rand_tokens(tok, N, f.c.vocab_size, &rs);
  rand_tokens(tgt, N, f.c.vocab_size, &rs);
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_grad_norm = 1.0f};
  float ls = 0, lt = 0, ps[N], pt[N];
  for (int k = 0; k < 2; k++) {
    lt_engine_head_rows = 0; /* the default, 256: one chunk */
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &ls, ps, errbuf, sizeof errbuf));
    lt_engine_head_rows = 7;
    OK(lt_forward_backward(t, &b, LT_LOSS_CROSS_ENTROPY, &lt, pt, errbuf, sizeof errbuf));
    cr_assert_eq(s->a.head_cap, (size_t)N, "one chunk holds the batch");
    cr_assert_eq(t->a.head_cap, (size_t)7, "t holds 7 rows of logits, not %zu", t->a.head_cap);
    cr_assert_lt(fabs((double)ls - lt), 1e-5 * fabs((double)ls), "step %d: loss %.8g in one chunk, %.8g in 7", k, ls,
                 lt);
    cr_assert_lt(rel_err(pt, ps, N), 1e-5, "step %d: log-probs differ by %.3g", k, rel_err(pt, ps, N));
    step_pair(s, t, &opt);
  }
  assert_same_tensors(s, t, f.dir, 1e-4, full ? "full training, head in chunks vs one" : "head in chunks vs one");
  size_t nl = (size_t)N * f.c.vocab_size;
  float *la = malloc(nl * sizeof(float)), *lb = malloc(nl * sizeof(float));
  cr_assert(la && lb);
  lt_engine_head_rows = 0;
  OK(lt_logits(s, B, T, tok, la, errbuf, sizeof errbuf));
  lt_engine_head_rows = 7;
  OK(lt_logits(s, B, T, tok, lb, errbuf, sizeof errbuf));
  cr_assert_lt(rel_err(lb, la, nl), 1e-6, "lt_logits in chunks differ by %.3g", rel_err(lb, la, nl));
  lt_engine_head_rows = 0;
  free(la), free(lb);
  close_pair(&f, s, t);
}

Test(engine, the_head_and_loss_in_chunks_of_rows_compute_what_one_chunk_computes) {
  head_chunks_case(0);
  head_chunks_case(1);
}

/* lt_eval_tokens, evaluation without N x V logits: the log-prob of each target and the most
 * likely next token at every position, the head in chunks of 7 rows, are what lt_logits' full
 * rows give (a masked position, target -100, is skipped). */
Test(engine, eval_tokens_give_what_the_full_logits_give) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 43, 2);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL,
                                                              .seed = 5});
  enum { B = 3, T = 16, N = B * T };
  int32_t tok[N], tgt[N], am[N];
  float lp[N], w[N];
  unsigned rs = 8;
  rand_tokens(tok, N, f.c.vocab_size, &rs);
  rand_tokens(tgt, N, f.c.vocab_size, &rs);
  for (int i = 0; i < N; i++) w[i] = i % 5 == 4 ? 0.0f : 1.0f;
  tgt[4] = -100;
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .weights = w};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf)); /* an adapter != 0 */
  OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  lt_engine_head_rows = 7;
  OK(lt_eval_tokens(s, &b, lp, am, errbuf, sizeof errbuf));
  OK(lt_eval_tokens(s, &b, NULL, NULL, errbuf, sizeof errbuf));
  lt_engine_head_rows = 0;
  int V = f.c.vocab_size;
  float *lg = malloc((size_t)N * V * sizeof(float));
  cr_assert(lg);
  OK(lt_logits(s, B, T, tok, lg, errbuf, sizeof errbuf));
  for (int i = 0; i < N; i++) {
    const float *row = lg + (size_t)i * V;
    int arg = 0;
    for (int v = 1; v < V; v++)
      if (row[v] > row[arg]) arg = v;
    cr_assert_eq(am[i], arg, "position %d: most likely token %d, the full row says %d", i, am[i], arg);
    if (w[i] == 0) continue;
    double z = 0;
    for (int v = 0; v < V; v++) z += exp((double)row[v] - row[arg]);
    double want = (double)row[tgt[i]] - row[arg] - log(z);
    cr_assert_lt(fabs(lp[i] - want), 1e-4, "position %d: log-prob %.7g, the full row gives %.7g", i, lp[i], want);
  }
  free(lg);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* ---- bf16 base weights on AMX (lt_cpu_opts_t.amx_bf16) ------------------------------------ */

/* A cpu backend with the frozen weights' products on AMX; the test is skipped, saying so, on a
 * chip or kernel without it. */
static lt_backend_t *amx_backend(int threads) {
  lt_backend_t *be = NULL;
  lt_cpu_opts_t o = {.threads = threads, .amx_bf16 = 1, .bf16_min_elems = 1};
  lt_err_t e = lt_backend_cpu_new_opts(&o, &be, errbuf, sizeof errbuf);
  if (e == LT_ERR_UNSUPPORTED) cr_skip_test("skipped: no AMX here (%s)", errbuf);
  OK(e);
  return be;
}

static void fill_uniform(float *x, size_t n, unsigned *rs) {
  for (size_t i = 0; i < n; i++) x[i] = (float)rand_r(rs) / RAND_MAX - 0.5f;
}

/* Both forms against the f32 products, shapes off every tile edge: within bf16 rounding; each
 * row the same bits whatever rows share the product, and whatever the thread count; a weight
 * that is not mapped, or a part of one, takes the f32 product. */
Test(engine, amx_products_of_mapped_weights_are_bf16_close_and_row_invariant) {
  lt_backend_t *a1 = amx_backend(1), *a2 = amx_backend(2), *ref = NULL, *ref1 = NULL;
  OK(lt_backend_cpu_new(2, &ref, errbuf, sizeof errbuf));
  OK(lt_backend_cpu_new(1, &ref1, errbuf, sizeof errbuf));
  enum { M = 37, N = 45, K = 70 };
  static float A[M * K], W[N * K], U[N * K], C1[M * N], C2[M * N], C5[5 * N], R[M * N];
  unsigned rs = 12;
  fill_uniform(A, M * K, &rs);
  fill_uniform(W, N * K, &rs);
  memcpy(U, W, sizeof W);
  a1->map_const(a1, W, N * K);
  a2->map_const(a2, W, N * K);
  for (int tb = 1; tb >= 0; tb--) { /* A W^T with W N x K; A W with W K x N */
    int ldb = tb ? K : N;
    for (int i = 0; i < M * N; i++) C1[i] = C2[i] = R[i] = 0.25f;
    a1->matmul(a1, 0, tb, M, N, K, 0.5f, A, K, W, ldb, 1.0f, C1, N);
    a2->matmul(a2, 0, tb, M, N, K, 0.5f, A, K, W, ldb, 1.0f, C2, N);
    a2->matmul(a2, 0, tb, 5, N, K, 0.5f, A + 7 * K, K, W, ldb, 0.0f, C5, N);
    ref->matmul(ref, 0, tb, M, N, K, 0.5f, A, K, W, ldb, 1.0f, R, N);
    double e = rel_err(C1, R, M * N);
    cr_assert(e > 0 && e < 1e-2, "tb %d: bf16 products differ from f32 by %.3g", tb, e);
    cr_assert(memcmp(C1, C2, sizeof C1) == 0, "tb %d: 1 and 2 threads give other bits", tb);
    for (int i = 0; i < 5 * N; i++) C5[i] += 0.25f; /* beta 1 against beta 0 plus the same C */
    cr_assert(memcmp(C5, C1 + 7 * N, sizeof C5) == 0, "tb %d: rows 7..11 alone differ from within 37 rows", tb);
    a1->matmul(a1, 0, tb, M, N, K, 1.0f, A, K, U, ldb, 0.0f, C1, N); /* not mapped: f32 */
    ref1->matmul(ref1, 0, tb, M, N, K, 1.0f, A, K, U, ldb, 0.0f, R, N);
    cr_assert(memcmp(C1, R, sizeof C1) == 0, "tb %d: an unmapped weight went to AMX", tb);
  }
  lt_backend_destroy(a1);
  lt_backend_destroy(a2);
  lt_backend_destroy(ref);
  lt_backend_destroy(ref1);
}

/* grad_f32 (the engine marks the LM head): a marked weight's A W^T still runs in bf16, its
 * A W (the input gradient) is the f32 product, bit for bit; a weight not marked keeps both on
 * the tiles. */
Test(engine, amx_grad_f32_keeps_only_the_input_gradient_in_f32) {
  lt_backend_t *a = amx_backend(2), *ref = NULL;
  OK(lt_backend_cpu_new(2, &ref, errbuf, sizeof errbuf));
  enum { M = 33, N = 40, K = 72 };
  static float A[M * K], W[N * K], V[N * K], C[M * N], R[M * N];
  unsigned rs = 19;
  fill_uniform(A, M * K, &rs);
  fill_uniform(W, N * K, &rs);
  memcpy(V, W, sizeof W);
  a->map_const(a, W, N * K);
  a->map_const(a, V, N * K);
  cr_assert(a->grad_f32, "the cpu backend has no grad_f32");
  a->grad_f32(a, W);
  for (int tb = 1; tb >= 0; tb--) {
    int ldb = tb ? K : N;
    for (int marked = 1; marked >= 0; marked--) {
      a->matmul(a, 0, tb, M, N, K, 1.0f, A, K, marked ? W : V, ldb, 0.0f, C, N);
      ref->matmul(ref, 0, tb, M, N, K, 1.0f, A, K, marked ? W : V, ldb, 0.0f, R, N);
      bool same = memcmp(C, R, sizeof C) == 0;
      if (marked && !tb)
        cr_assert(same, "the marked weight's A W is not the f32 product (rel err %.3g)", rel_err(C, R, M * N));
      else
        cr_assert(!same && rel_err(C, R, M * N) < 1e-2, "%s weight, tb %d: not the bf16 product (rel err %.3g)",
                  marked ? "the marked" : "an unmarked", tb, rel_err(C, R, M * N));
    }
  }
  lt_backend_destroy(a);
  lt_backend_destroy(ref);
}

/* LoRA training with the base weights in bf16: the loss follows the f32 run within 1 % over
 * three AdamW steps and after them (the adapters' elements themselves do not: AdamW's first
 * steps move each by about lr whatever its gradient's size, so a small gradient rounded
 * otherwise moves it as far the other way); run twice, the same bits (the LM head's f32
 * product, like every other, depends on the thread count: the products test checks that the bf16
 * ones do not). */
Test(engine, lora_on_amx_bf16_base_weights_follows_f32_and_repeats_bitwise) {
  lt_model_config_t cfg = small_config(4, 2, 1, 0, 1.0f);
  fixture_t f;
  fixture_open(&f, cfg, 47, 2);
  lt_backend_t *ab[2] = {amx_backend(2), amx_backend(2)};
  lt_engine_t *ae[2];
  for (int i = 0; i < 2; i++) OK(lt_engine_open(f.model, ab[i], &ae[i], errbuf, sizeof errbuf));
  lt_session_config_t sc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 2};
  lt_session_t *s = fixture_session(&f, sc), *t[2];
  for (int i = 0; i < 2; i++) OK(lt_session_new(ae[i], &sc, &t[i], errbuf, sizeof errbuf));
  enum { B = 2, T = 24, N = B * T };
  int32_t tok[N], tgt[N];
  unsigned rs = 5;
  rand_tokens(tok, N, f.c.vocab_size, &rs);
  rand_tokens(tgt, N, f.c.vocab_size, &rs);
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_grad_norm = 1.0f};
  for (int k = 0; k < 3; k++) {
    float ls, lt[2];
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &ls, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
    for (int i = 0; i < 2; i++) {
      OK(lt_forward_backward(t[i], &b, LT_LOSS_CROSS_ENTROPY, &lt[i], NULL, errbuf, sizeof errbuf));
      OK(lt_optim_step(t[i], &opt, NULL, errbuf, sizeof errbuf));
    }
    cr_assert(lt[0] != ls, "step %d: bf16 gave the f32 loss exactly: the products did not run on AMX", k);
    cr_assert_lt(fabs((double)lt[0] - ls), 1e-2 * fabs((double)ls), "step %d: loss %.7g f32, %.7g bf16", k, ls, lt[0]);
    cr_assert(lt[0] == lt[1], "step %d: two bf16 runs' losses %.9g and %.9g", k, lt[0], lt[1]);
  }
  char a[512], c[512];
  snprintf(a, sizeof a, "%s/amx0.safetensors", f.dir);
  snprintf(c, sizeof c, "%s/amx1.safetensors", f.dir);
  OK(lt_dump_tensors(t[0], 0, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t[1], 0, c, errbuf, sizeof errbuf));
  cr_assert(files_equal(a, c), "two bf16 runs gave other adapters");
  float lf, lb;
  OK(lt_forward(s, &b, LT_LOSS_CROSS_ENTROPY, &lf, NULL, errbuf, sizeof errbuf));
  OK(lt_forward(t[0], &b, LT_LOSS_CROSS_ENTROPY, &lb, NULL, errbuf, sizeof errbuf));
  cr_assert_lt(fabs((double)lb - lf), 1e-2 * fabs((double)lf), "trained: loss %.7g f32, %.7g bf16", lf, lb);
  lt_session_destroy(s);
  for (int i = 0; i < 2; i++) {
    lt_session_destroy(t[i]);
    lt_engine_close(ae[i]);
    lt_backend_destroy(ab[i]);
  }
  fixture_close(&f);
}

/* Per-layer recompute (lt_session_config_t.recompute) keeps one layer's activations and runs
 * each layer's forward again before its backward: the same bits as keeping them all — every
 * trainable tensor after three AdamW steps on packed rows, with LoRA dropout (the masks must
 * come back the same) and in full training. */
static void recompute_case(int full) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 41, 2);
  lt_session_config_t sc = {.rank = 4, .alpha = 8, .dropout = full ? 0.0f : 0.1f, .targets = LT_TARGET_ALL,
                            .seed = 3, .full = full};
  lt_session_t *s = fixture_session(&f, sc);
  sc.recompute = 1;
  lt_session_t *t = fixture_session(&f, sc);
  enum { B = 2, T = 24, N = B * T };
  int32_t tok[N], tgt[N], pos[N];
  for (int i = 0; i < N; i++) pos[i] = i % T < 10 ? i % T : i % T - 10; /* two examples a row */
  unsigned rs = 6;
  rand_tokens(tok, N, f.c.vocab_size, &rs);
  rand_tokens(tgt, N, f.c.vocab_size, &rs);
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .positions = pos};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_grad_norm = 1.0f};
  for (int k = 0; k < 3; k++) {
    float ls, lt;
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &ls, NULL, errbuf, sizeof errbuf));
    OK(lt_forward_backward(t, &b, LT_LOSS_CROSS_ENTROPY, &lt, NULL, errbuf, sizeof errbuf));
    cr_assert(ls == lt, "step %d: loss %.9g kept, %.9g recomputed", k, ls, lt);
    /* the block holds ln1 of every layer, or of one (the pieces are carved back to back) */
    size_t one = (size_t)N * f.c.hidden_size * sizeof(float);
    cr_assert((size_t)((char *)s->a.rstd1 - (char *)s->a.ln1) >= one * f.c.num_layers);
    cr_assert((size_t)((char *)t->a.rstd1 - (char *)t->a.ln1) < 2 * one, "recompute holds one layer");
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(t, &opt, NULL, errbuf, sizeof errbuf));
  }
  char a[512], c[512];
  snprintf(a, sizeof a, "%s/kept.safetensors", f.dir);
  snprintf(c, sizeof c, "%s/recomputed.safetensors", f.dir);
  OK(lt_dump_tensors(s, 0, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t, 0, c, errbuf, sizeof errbuf));
  cr_assert(files_equal(a, c), "%s: recomputing each layer changed the trained tensors", full ? "full" : "LoRA");
  lt_session_destroy(s);
  lt_session_destroy(t);
  fixture_close(&f);
}

Test(engine, recomputing_each_layer_in_backward_gives_the_same_bits) {
  recompute_case(0);
  recompute_case(1);
}

/* A batch whose activations cannot all be allocated falls back to recompute instead of failing;
 * one that does not fit even so fails naming its size. */
Test(engine, a_batch_too_large_for_every_layer_falls_back_to_recompute) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 43, 1);
  lt_session_config_t sc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 3};
  lt_session_t *s = fixture_session(&f, sc), *t = fixture_session(&f, sc), *u = fixture_session(&f, sc);
  enum { B = 2, T = 32, N = B * T };
  int32_t tok[N], tgt[N];
  unsigned rs = 8;
  rand_tokens(tok, N, f.c.vocab_size, &rs);
  rand_tokens(tgt, N, f.c.vocab_size, &rs);
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  float ls, lt;
  OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &ls, NULL, errbuf, sizeof errbuf));
  cr_assert(!lt_session_recomputes(s));
  /* between one layer's block and every layer's */
  size_t one_layer = (size_t)((char *)s->a.rstd1 - (char *)s->a.ln1) / f.c.num_layers;
  lt_engine_act_limit = (size_t)((char *)s->a.ln1 - (char *)s->a.block) + 4 * one_layer * 8;
  OK(lt_forward_backward(t, &b, LT_LOSS_CROSS_ENTROPY, &lt, NULL, errbuf, sizeof errbuf));
  cr_assert(lt_session_recomputes(t), "the session did not fall back to recompute");
  cr_assert(ls == lt, "loss %.9g, %.9g after the fallback", ls, lt);
  lt_engine_act_limit = 1000; /* not even one layer */
  cr_assert_eq(lt_forward_backward(u, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_NOMEM);
  cr_assert(strstr(errbuf, "activations for batch 2 x 32 tokens"), "%s", errbuf);
  lt_engine_act_limit = 0;
  lt_session_destroy(s);
  lt_session_destroy(t);
  lt_session_destroy(u);
  fixture_close(&f);
}

/* Packing: two examples in one row, each attending only within itself and counting its
 * positions from 0, compute what one row per example computes — loss, per-token log-probs,
 * gradients (hence the adapter after AdamW steps) — within float rounding. And a plain batch
 * after a packed one is plain again (the positions go back to 0..T-1). */
Test(engine, packed_rows_compute_what_one_row_per_example_computes) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 1, 0, 1.0f), 41, 1);
  lt_session_t *s, *t;
  open_pair(&f, (lt_session_config_t){.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 9}, &s, &t);
  enum { T1 = 7, T2 = 12 };
  static const int len[3] = {5, 7, 4};
  int32_t ex_tok[3][T1], ex_tgt[3][T1];
  unsigned rs = 3;
  for (int e = 0; e < 3; e++) {
    rand_tokens(ex_tok[e], T1, f.c.vocab_size, &rs);
    rand_tokens(ex_tgt[e], T1, f.c.vocab_size, &rs);
  }
  /* One row per example, padded to 7 with weight 0. */
  int32_t u_tok[3 * T1] = {0}, u_tgt[3 * T1] = {0};
  float u_w[3 * T1] = {0};
  for (int e = 0; e < 3; e++)
    for (int i = 0; i < len[e]; i++) {
      u_tok[e * T1 + i] = ex_tok[e][i];
      u_tgt[e * T1 + i] = ex_tgt[e][i];
      u_w[e * T1 + i] = i == 0 ? 0.0f : 1.0f; /* a masked "prompt" token too */
    }
  /* Packed: row 0 = example 0 then example 1 (12 tokens), row 1 = example 2 and padding. */
  int32_t p_tok[2 * T2] = {0}, p_tgt[2 * T2] = {0}, p_pos[2 * T2];
  float p_w[2 * T2] = {0};
  int at[3] = {0, 5, 12}; /* where each example starts in the packed buffer */
  for (int e = 0; e < 3; e++)
    for (int i = 0; i < len[e]; i++) {
      p_tok[at[e] + i] = ex_tok[e][i];
      p_tgt[at[e] + i] = ex_tgt[e][i];
      p_w[at[e] + i] = i == 0 ? 0.0f : 1.0f;
    }
  for (int i = 0; i < T2; i++) {
    p_pos[i] = i < 5 ? i : i - 5;
    p_pos[T2 + i] = i; /* example 2, then padding that continues it (weight 0) */
  }
  lt_batch_t ub = {.B = 3, .T = T1, .tokens = u_tok, .targets = u_tgt, .weights = u_w};
  lt_batch_t pb = {.B = 2, .T = T2, .tokens = p_tok, .targets = p_tgt, .weights = p_w, .positions = p_pos};
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_grad_norm = 1.0f};
  for (int k = 0; k < 2; k++) { /* step 1 makes B nonzero, step 2 compares every gradient */
    float lu, lp, ulogp[3 * T1], plogp[2 * T2];
    OK(lt_forward_backward(s, &ub, LT_LOSS_CROSS_ENTROPY, &lu, ulogp, errbuf, sizeof errbuf));
    OK(lt_forward_backward(t, &pb, LT_LOSS_CROSS_ENTROPY, &lp, plogp, errbuf, sizeof errbuf));
    cr_assert_float_eq(lu, lp, 1e-5 * fabsf(lu), "step %d: loss %.8g unpacked vs %.8g packed", k, lu, lp);
    for (int e = 0; e < 3; e++)
      for (int i = 0; i < len[e]; i++)
        cr_assert_float_eq(ulogp[e * T1 + i], plogp[at[e] + i], 1e-4,
                           "step %d: example %d token %d: logp %.7g unpacked vs %.7g packed", k, e, i,
                           ulogp[e * T1 + i], plogp[at[e] + i]);
    step_pair(s, t, &opt);
  }
  assert_same_tensors(s, t, f.dir, 1e-4, "packed vs one row per example");
  /* A plain batch after the packed one: the same logits as the session that never packed. */
  float *ls = malloc(sizeof(float) * 3 * T1 * f.c.vocab_size), *lt = malloc(sizeof(float) * 3 * T1 * f.c.vocab_size);
  OK(lt_logits(s, 3, T1, u_tok, ls, errbuf, sizeof errbuf));
  OK(lt_logits(t, 3, T1, u_tok, lt, errbuf, sizeof errbuf));
  double e = rel_err(lt, ls, (size_t)3 * T1 * f.c.vocab_size);
  cr_assert_lt(e, 1e-4, "logits of a plain batch after a packed one differ by %.3g", e);
  free(ls);
  free(lt);
  /* Rows of the same length reuse the block: after two packed rows, one plain row, then two plain
   * rows — the second row must not keep the packed positions. */
  int32_t q_pos[2 * T2];
  for (int i = 0; i < T2; i++) q_pos[i] = i, q_pos[T2 + i] = i < 5 ? i : i - 5; /* row 1 restarts */
  lt_batch_t qb = pb;
  qb.positions = q_pos;
  OK(lt_forward(t, &qb, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
  float *one = malloc(sizeof(float) * T2 * f.c.vocab_size), *two = malloc(sizeof(float) * 2 * T2 * f.c.vocab_size),
        *want = malloc(sizeof(float) * 2 * T2 * f.c.vocab_size);
  OK(lt_logits(t, 1, T2, p_tok, one, errbuf, sizeof errbuf));
  OK(lt_logits(t, 2, T2, p_tok, two, errbuf, sizeof errbuf));
  OK(lt_logits(s, 2, T2, p_tok, want, errbuf, sizeof errbuf));
  e = rel_err(two, want, (size_t)2 * T2 * f.c.vocab_size);
  cr_assert_lt(e, 1e-4, "two plain rows after packed ones differ by %.3g", e);
  free(one);
  free(two);
  free(want);
  /* Positions that do not count up from 0 within a row are refused, naming the place. */
  p_pos[3] = 5;
  cr_assert_eq(lt_forward_backward(t, &pb, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf),
               LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "positions[0][3] = 5"), "%s", errbuf);
  close_pair(&f, s, t);
}

Test(engine, bad_batches_are_refused_with_the_position) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 1, 1);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = 2, .alpha = 2, .targets = LT_TARGET_Q, .seed = 5});
  int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 500}, tgt[8] = {0};
  lt_batch_t b = {.B = 2, .T = 4, .tokens = tok, .targets = tgt};
  cr_assert_eq(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf,
                                   sizeof errbuf),
               LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "tokens[1][3] = 500"), "%s", errbuf);
  tok[7] = 7;
  float w[8] = {0};
  b.weights = w;
  cr_assert_eq(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf,
                                   sizeof errbuf),
               LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "weight 0"), "%s", errbuf);
  lt_adamw_t opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  cr_assert_eq(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* ---- PPO's clipped surrogate ------------------------------------------------------------- */

/* Every tensor of a dump (lt_dump_tensors) in file order, concatenated: *n floats, malloc'd. */
static float *read_dump(const char *path, size_t *n) {
  lt_st_t *st;
  OK(lt_st_open_file(path, &st, errbuf, sizeof errbuf));
  size_t total = 0;
  for (size_t i = 0; i < lt_st_count(st); i++) total += (size_t)lt_st_at(st, i)->numel;
  float *v = malloc(total * sizeof(float));
  cr_assert_not_null(v);
  size_t at = 0;
  for (size_t i = 0; i < lt_st_count(st); i++) {
    const lt_st_tensor_t *t = lt_st_at(st, i);
    cr_assert_eq(t->dtype, LT_ST_F32);
    memcpy(v + at, t->data, (size_t)t->numel * sizeof(float));
    at += (size_t)t->numel;
  }
  lt_st_close(st);
  *n = total;
  return v;
}

enum { PB = 2, PT = 12, PN = PB * PT };

/* A batch for the policy losses on a session whose adapter has taken one cross-entropy step
 * (so that lora_B, and with it every LoRA gradient, is nonzero): random tokens and targets, the
 * first two positions of a row masked, advantages of both signs, and sampler_logp = the current
 * logp + shift(i) so that each token's ratio is exp(-shift(i)). */
typedef struct {
  int32_t tok[PN], tgt[PN];
  float w[PN], adv[PN], slp[PN], logp[PN];
  lt_batch_t b;
} ppo_batch_t;

static void ppo_batch(lt_session_t *s, int V, ppo_batch_t *p, double (*shift)(int i, float adv)) {
  unsigned rs = 17;
  rand_tokens(p->tok, PN, V, &rs);
  rand_tokens(p->tgt, PN, V, &rs);
  for (int i = 0; i < PN; i++) {
    p->w[i] = (i % PT) < 2 ? 0.0f : 1.0f + 0.25f * (float)(i % 3);
    p->adv[i] = (float)((int)(rand_r(&rs) % 200) - 100) / 40.0f;
  }
  p->b = (lt_batch_t){.B = PB, .T = PT, .tokens = p->tok, .targets = p->tgt, .weights = p->w,
                      .advantages = p->adv, .sampler_logp = p->slp};
  OK(lt_forward(s, &p->b, LT_LOSS_CROSS_ENTROPY, NULL, p->logp, errbuf, sizeof errbuf));
  for (int i = 0; i < PN; i++) p->slp[i] = (float)(p->logp[i] + shift(i, p->adv[i]));
}

/* A session on f after one cross-entropy AdamW step on random data. */
static lt_session_t *stepped_session(fixture_t *f) {
  lt_session_t *s = fixture_session(f, (lt_session_config_t){.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 3});
  int32_t tok[PN], tgt[PN];
  unsigned rs = 5;
  rand_tokens(tok, PN, f->c.vocab_size, &rs);
  rand_tokens(tgt, PN, f->c.vocab_size, &rs);
  lt_batch_t b = {.B = PB, .T = PT, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 2e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
  OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  return s;
}

/* log-ratios within +-0.1: inside [0.8, 1.2] */
static double shift_inside(int i, float adv) {
  (void)adv;
  return 0.1 * (double)((i % 5) - 2) / 2.0;
}

/* Ratio e^4 where the advantage is positive, e^-4 where it is not: min() takes the clipped term
 * (1.2 A, resp. 0.8 A) for every token. */
static double shift_clipped(int i, float adv) {
  (void)i;
  return adv > 0 ? -4.0 : 4.0;
}

/* Most tokens inside the range, every third one clipped: a loss with both kinds of term. */
static double shift_mixed(int i, float adv) {
  return i % 3 == 0 ? shift_clipped(i, adv) : shift_inside(i, adv);
}

Test(engine, ppo_with_ratios_inside_the_clip_range_is_importance_sampling) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 51, 1);
  lt_session_t *s = stepped_session(&f), *t = stepped_session(&f);
  ppo_batch_t p;
  ppo_batch(s, f.c.vocab_size, &p, shift_inside);
  float l_is, l_ppo, l_fwd, lp_is[PN], lp_ppo[PN];
  OK(lt_forward_backward(s, &p.b, LT_LOSS_IMPORTANCE, &l_is, lp_is, errbuf, sizeof errbuf));
  OK(lt_forward_backward(t, &p.b, LT_LOSS_PPO, &l_ppo, lp_ppo, errbuf, sizeof errbuf));
  OK(lt_forward(t, &p.b, LT_LOSS_PPO, &l_fwd, NULL, errbuf, sizeof errbuf));
  cr_assert_eq(l_is, l_ppo, "loss: importance sampling %.9g, PPO %.9g", l_is, l_ppo);
  cr_assert_eq(l_fwd, l_ppo, "lt_forward's PPO loss %.9g, lt_forward_backward's %.9g", l_fwd, l_ppo);
  cr_assert_eq(memcmp(lp_is, lp_ppo, sizeof lp_is), 0, "the log-probs differ");
  char a[512], b[512];
  snprintf(a, sizeof a, "%s/g_is.safetensors", f.dir);
  snprintf(b, sizeof b, "%s/g_ppo.safetensors", f.dir);
  OK(lt_dump_tensors(s, 1, a, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(t, 1, b, errbuf, sizeof errbuf));
  size_t n;
  float *g = read_dump(b, &n);
  double norm = 0;
  for (size_t i = 0; i < n; i++) norm += (double)g[i] * g[i];
  cr_assert_gt(norm, 0, "the gradient is not trivially zero");
  free(g);
  cr_assert(files_equal(a, b), "the gradients of the two losses differ");
  lt_session_destroy(s);
  lt_session_destroy(t);
  fixture_close(&f);
}

Test(engine, ppo_gives_no_gradient_where_every_token_is_clipped) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 52, 1);
  lt_session_t *s = stepped_session(&f);
  ppo_batch_t p;
  ppo_batch(s, f.c.vocab_size, &p, shift_clipped);
  float loss;
  OK(lt_forward_backward(s, &p.b, LT_LOSS_PPO, &loss, NULL, errbuf, sizeof errbuf));
  double W = 0, want = 0;
  for (int i = 0; i < PN; i++) {
    W += p.w[i];
    want += -(double)p.w[i] * (p.adv[i] > 0 ? 1.2 : 0.8) * p.adv[i];
  }
  cr_assert_float_eq(loss, want / W, 1e-5, "loss %.7g, the clipped terms give %.7g", loss, want / W);
  char a[512];
  snprintf(a, sizeof a, "%s/g.safetensors", f.dir);
  OK(lt_dump_tensors(s, 1, a, errbuf, sizeof errbuf));
  size_t n;
  float *g = read_dump(a, &n);
  cr_assert_gt(n, 0);
  for (size_t i = 0; i < n; i++) cr_assert_eq(g[i], 0.0f, "gradient[%zu] = %g", i, (double)g[i]);
  free(g);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* The gradient is the loss's: along the AdamW update d the optimizer then takes (every LoRA
 * parameter moves), L(theta + d) - L(theta) matches g . d, with a third of the tokens clipped.
 * A gradient from a clipped token would show here, since its term does not move the loss. */
Test(engine, ppo_gradient_matches_a_finite_difference_of_its_loss) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 53, 1);
  lt_session_t *s = stepped_session(&f);
  ppo_batch_t p;
  ppo_batch(s, f.c.vocab_size, &p, shift_mixed);
  p.b.clip_low = 0.25f; /* an asymmetric range: tokens at e^-0.1 .. e^0.1 stay inside */
  char p0[512], p1[512], g[512];
  snprintf(p0, sizeof p0, "%s/p0.safetensors", f.dir);
  snprintf(p1, sizeof p1, "%s/p1.safetensors", f.dir);
  snprintf(g, sizeof g, "%s/g.safetensors", f.dir);
  float l0, l1;
  OK(lt_dump_tensors(s, 0, p0, errbuf, sizeof errbuf));
  OK(lt_forward_backward(s, &p.b, LT_LOSS_PPO, &l0, NULL, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(s, 1, g, errbuf, sizeof errbuf));
  lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  OK(lt_dump_tensors(s, 0, p1, errbuf, sizeof errbuf));
  OK(lt_forward(s, &p.b, LT_LOSS_PPO, &l1, NULL, errbuf, sizeof errbuf));
  size_t n0, n1, ng;
  float *x0 = read_dump(p0, &n0), *x1 = read_dump(p1, &n1), *gr = read_dump(g, &ng);
  cr_assert(n0 == n1 && n0 == ng);
  double dot = 0;
  for (size_t i = 0; i < n0; i++) dot += (double)gr[i] * ((double)x1[i] - x0[i]);
  double fd = (double)l1 - l0;
  cr_log_info("PPO: L(theta + d) - L(theta) = %.6g, g . d = %.6g", fd, dot);
  cr_assert_lt(dot, 0, "AdamW went downhill: g . d = %g", dot);
  cr_assert_lt(fabs(fd - dot), 0.01 * fabs(dot), "finite difference %.6g vs g . d %.6g", fd, dot);
  free(x0), free(x1), free(gr);
  lt_session_destroy(s);
  fixture_close(&f);
}

Test(engine, ppo_refuses_bad_inputs_naming_the_field) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 54, 1);
  lt_session_t *s = fixture_session(&f, (lt_session_config_t){.rank = 2, .alpha = 2, .targets = LT_TARGET_Q, .seed = 5});
  ppo_batch_t p;
  ppo_batch(s, f.c.vocab_size, &p, shift_inside);
  p.adv[PT + 3] = NAN;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "advantages[1][3] = nan"), "%s", errbuf);
  cr_assert_eq(lt_forward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  p.adv[PT + 3] = 1;
  p.slp[4] = INFINITY;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "sampler_logp[0][4] = inf"), "%s", errbuf);
  p.slp[4] = -1;
  p.w[0] = 0;
  p.slp[0] = NAN; /* a masked token's inputs are not read */
  p.b.clip_high = 10;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "clip_high = 10"), "%s", errbuf);
  p.b.clip_high = 0;
  p.b.clip_low = NAN;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "clip_low = nan"), "%s", errbuf);
  p.b.clip_low = 0;
  p.b.advantages = NULL;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "advantages missing"), "%s", errbuf);
  p.b.advantages = p.adv;
  OK(lt_forward_backward(s, &p.b, LT_LOSS_PPO, NULL, NULL, errbuf, sizeof errbuf));
  lt_session_destroy(s);
  fixture_close(&f);
}

/* A sampler log-prob far below the policy's (a tenant's own session may send any finite one)
 * makes the importance ratio exp(logp - sampler_logp) overflow: the call is refused naming the
 * loss, and no gradient is kept (the optim_step that follows finds none). Before, the gradients
 * went to inf and NaN, the call reported a loss of 0, and the next step made every weight NaN.
 * An optim_step whose lr x weight_decay passes 1 (the decay would flip the weights' sign) is
 * refused as well, and one over gradients that are not finite drops them and takes no step. */
Test(engine, an_overflowing_loss_keeps_no_gradient_and_no_step_makes_the_weights_nan) {
  fixture_t f;
  fixture_open(&f, small_config(4, 2, 0, 0, 1.0f), 54, 1);
  lt_session_t *s = stepped_session(&f);
  ppo_batch_t p;
  ppo_batch(s, f.c.vocab_size, &p, shift_inside);
  p.slp[PT + 5] = -1e30f;
  cr_assert_eq(lt_forward_backward(s, &p.b, LT_LOSS_IMPORTANCE, NULL, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_expect(strstr(errbuf, "the loss is not finite") && strstr(errbuf, "no gradient was kept"), "%s", errbuf);
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  cr_assert_eq(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID, "a gradient was kept");
  cr_expect(strstr(errbuf, "no forward_backward since the last step"), "%s", errbuf);
  p.slp[PT + 5] = p.logp[PT + 5];
  OK(lt_forward_backward(s, &p.b, LT_LOSS_IMPORTANCE, NULL, NULL, errbuf, sizeof errbuf));
  lt_adamw_t flip = {.lr = 0.5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 4};
  cr_assert_eq(lt_optim_step(s, &flip, NULL, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_expect(strstr(errbuf, "lr x weight_decay <= 1"), "%s", errbuf);
  size_t n;
  float *g = lt_session_grad_buffer(s, &n);
  g[0] = INFINITY; /* on the cpu backend: host memory */
  float gn = 0;
  cr_assert_eq(lt_optim_step(s, &opt, &gn, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_expect(strstr(errbuf, "not finite") && strstr(errbuf, "dropped"), "%s", errbuf);
  cr_expect_eq(g[0], 0.0f, "the gradients were not dropped");
  OK(lt_forward_backward(s, &p.b, LT_LOSS_IMPORTANCE, NULL, NULL, errbuf, sizeof errbuf));
  OK(lt_optim_step(s, &opt, &gn, errbuf, sizeof errbuf));
  cr_expect(isfinite(gn), "%g", (double)gn);
  char path[600];
  snprintf(path, sizeof path, "%s/after.safetensors", f.dir);
  OK(lt_dump_tensors(s, 0, path, errbuf, sizeof errbuf));
  lt_st_t *st;
  OK(lt_st_open_file(path, &st, errbuf, sizeof errbuf));
  for (size_t i = 0; i < lt_st_count(st); i++) {
    const lt_st_tensor_t *t = lt_st_at(st, i);
    const float *v = t->data;
    size_t cnt = 1;
    for (int d = 0; d < t->ndim; d++) cnt *= (size_t)t->shape[d];
    for (size_t k = 0; k < cnt; k++) cr_assert(isfinite(v[k]), "%s[%zu] = %g", t->name, k, (double)v[k]);
  }
  lt_st_close(st);
  lt_session_destroy(s);
  fixture_close(&f);
}

/* ---- configuration ----------------------------------------------------------------------- */

Test(engine, config_refuses_unsupported_rope_scaling_and_reads_linear) {
  lt_model_config_t c;
  const char *yarn = "{\"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 16, "
                     "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                     "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}";
  cr_assert_eq(lt_model_config_parse(yarn, strlen(yarn), "config.json", &c, errbuf,
                                     sizeof errbuf),
               LT_ERR_UNSUPPORTED);
  cr_assert_not_null(strstr(errbuf, "rope_scaling"), "%s", errbuf);
  cr_assert_not_null(strstr(errbuf, "yarn"), "%s", errbuf);
  const char *lin = "{\"vocab_size\": 10, \"hidden_size\": 8, \"intermediate_size\": 16, "
                    "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
                    "\"num_key_value_heads\": 1, \"rope_scaling\": {\"rope_type\": \"linear\", "
                    "\"factor\": 4.0}, \"tie_word_embeddings\": true}";
  OK(lt_model_config_parse(lin, strlen(lin), "config.json", &c, errbuf, sizeof errbuf));
  cr_assert_float_eq(c.rope_linear_factor, 4.0f, 0);
  cr_assert_eq(c.head_dim, 4);
  cr_assert_eq(c.num_kv_heads, 1);
  cr_assert_eq(c.tie_embeddings, 1);
  const char *miss = "{\"vocab_size\": 10, \"hidden_size\": 8}";
  cr_assert_eq(lt_model_config_parse(miss, strlen(miss), "m/config.json", &c, errbuf,
                                     sizeof errbuf),
               LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "m/config.json: field \"intermediate_size\""), "%s", errbuf);
}

/* ---- safetensors ------------------------------------------------------------------------- */

static void write_raw(const char *path, const char *header, size_t data_bytes, int64_t hlen) {
  FILE *fp = fopen(path, "wb");
  cr_assert_not_null(fp);
  uint64_t n = hlen >= 0 ? (uint64_t)hlen : strlen(header);
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
  fwrite(len8, 1, 8, fp);
  fwrite(header, 1, strlen(header), fp);
  for (size_t i = 0; i < data_bytes; i++) fputc(0, fp);
  fclose(fp);
}

static void st_expect(const char *path, lt_err_t want, const char *needle) {
  lt_st_t *st = NULL;
  errbuf[0] = 0;
  lt_err_t e = lt_st_open_file(path, &st, errbuf, sizeof errbuf);
  cr_assert_eq(e, want, "%s: got %s (%s), want %s", needle, lt_err_name(e), errbuf,
               lt_err_name(want));
  cr_assert_null(st);
  cr_assert_not_null(strstr(errbuf, needle), "message \"%s\" lacks \"%s\"", errbuf, needle);
  cr_assert_not_null(strstr(errbuf, path), "message \"%s\" lacks the file name", errbuf);
}

Test(safetensors, malformed_files_fail_naming_file_tensor_and_expectation) {
  char dir[256], p[512];
  mktmp(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/x.safetensors", dir);
  FILE *fp = fopen(p, "wb");
  fwrite("abc", 1, 3, fp);
  fclose(fp);
  st_expect(p, LT_ERR_CORRUPT, "truncated");
  write_raw(p, "{}", 0, 1000);
  st_expect(p, LT_ERR_CORRUPT, "beyond the end of the file");
  write_raw(p, "{\"a\": {\"dtype\": \"F32\", ", 0, -1);
  st_expect(p, LT_ERR_CORRUPT, "not valid JSON");
  write_raw(p, "[1, 2]", 0, -1);
  st_expect(p, LT_ERR_CORRUPT, "not a JSON object");
  write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}", 8,
            -1);
  st_expect(p, LT_ERR_CORRUPT, "tensor \"w\": data_offsets [0, 16] out of range");
  write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 16]}}", 16,
            -1);
  st_expect(p, LT_ERR_CORRUPT, "tensor \"w\": data_offsets span 16 bytes but dtype F32 and shape "
                               "need 24");
  write_raw(p,
            "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}, "
            "\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}",
            16, -1);
  st_expect(p, LT_ERR_CORRUPT, "overlap");
  write_raw(p, "{\"w\": {\"dtype\": \"Q4\", \"shape\": [2], \"data_offsets\": [0, 1]}}", 1, -1);
  st_expect(p, LT_ERR_UNSUPPORTED, "unknown dtype \"Q4\"");
  write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8, -1);
  st_expect(p, LT_ERR_CORRUPT, "shape[0]");
  write_raw(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8, -1);
  lt_st_t *st;
  OK(lt_st_open_file(p, &st, errbuf, sizeof errbuf));
  const float *d;
  float *own;
  int64_t want[2] = {1, 2};
  cr_assert_eq(lt_st_get_f32(st, "w", 2, want, &d, &own, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "tensor \"w\" has shape [2], expected [1, 2]"), "%s", errbuf);
  cr_assert_eq(lt_st_get_f32(st, "v", 1, want, &d, &own, errbuf, sizeof errbuf),
               LT_ERR_NOT_FOUND);
  cr_assert_not_null(strstr(errbuf, "tensor \"v\" is missing"), "%s", errbuf);
  lt_st_close(st);
  rm_rf(dir);
}

Test(safetensors, half_precision_tensors_load_as_f32) {
  char dir[256], p[512];
  mktmp(dir, sizeof dir);
  snprintf(p, sizeof p, "%s/h.safetensors", dir);
  float v[6] = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-5f, 0.0f};
  lt_st_entry_t e[2] = {{.name = "f16", .dtype = LT_ST_F16, .ndim = 1, .shape = {6}, .data = v},
                        {.name = "bf16", .dtype = LT_ST_BF16, .ndim = 2, .shape = {2, 3},
                         .data = v}};
  OK(lt_st_write(p, e, 2, errbuf, sizeof errbuf));
  lt_st_t *st;
  OK(lt_st_open_file(p, &st, errbuf, sizeof errbuf));
  const float *d;
  float *own;
  int64_t s1 = 6, s2[2] = {2, 3};
  OK(lt_st_get_f32(st, "f16", 1, &s1, &d, &own, errbuf, sizeof errbuf));
  cr_assert_not_null(own, "converted tensors are copies");
  for (int i = 0; i < 6; i++)
    cr_assert_float_eq(d[i], v[i], fabs(v[i]) * 1e-3 + 1e-7, "f16[%d] = %g", i, (double)d[i]);
  free(own);
  OK(lt_st_get_f32(st, "bf16", 2, s2, &d, &own, errbuf, sizeof errbuf));
  for (int i = 0; i < 6; i++)
    cr_assert_float_eq(d[i], v[i], fabs(v[i]) * 8e-3, "bf16[%d] = %g", i, (double)d[i]);
  free(own);
  lt_st_close(st);
  rm_rf(dir);
}

Test(engine, model_with_a_missing_or_misshapen_tensor_is_refused_by_name) {
  lt_model_config_t c = small_config(4, 2, 0, 0, 1.0f);
  char dir[256];
  mktmp(dir, sizeof dir);
  OK(lt_model_init_random(&c, dir, 1, 0.1f, 0, errbuf, sizeof errbuf));
  /* the same files with a config claiming a larger FFN */
  lt_model_config_t c2 = c;
  c2.intermediate_size = 50;
  OK(lt_model_config_write(&c2, dir, errbuf, sizeof errbuf));
  lt_backend_t *be;
  OK(lt_backend_cpu_new(1, &be, errbuf, sizeof errbuf));
  lt_engine_t *e = NULL;
  cr_assert_eq(lt_engine_open(dir, be, &e, errbuf, sizeof errbuf), LT_ERR_INVALID);
  cr_assert_not_null(strstr(errbuf, "model.layers.0.mlp.gate_proj.weight\" has shape [44, 32], "
                                    "expected [50, 32]"),
                     "%s", errbuf);
  /* untied config, but the file has no lm_head */
  lt_model_config_t c3 = c;
  c3.tie_embeddings = 1;
  OK(lt_model_init_random(&c3, dir, 1, 0.1f, 0, errbuf, sizeof errbuf));
  OK(lt_model_config_write(&c, dir, errbuf, sizeof errbuf));
  cr_assert_eq(lt_engine_open(dir, be, &e, errbuf, sizeof errbuf), LT_ERR_NOT_FOUND);
  cr_assert_not_null(strstr(errbuf, "tensor \"lm_head.weight\" is missing"), "%s", errbuf);
  cr_assert_null(e);
  lt_backend_destroy(be);
  rm_rf(dir);
}
