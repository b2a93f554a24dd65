/* bench/train_cpu: LoRA training step of the cpu engine against PyTorch and the sgemm ceiling.
 *
 * SmolLM2-135M shape (d=576, 30 layers, 9 heads, 3 kv heads, ffn 1536, vocab 49152, tied
 * embeddings; random weights), LoRA rank 16 on q,k,v,o,gate,up,down, batch 4 x 256 tokens,
 * forward + backward + AdamW. In the same run: the same step in PyTorch
 * (bench/train_cpu_torch.py, same thread count), OpenBLAS sgemm at n = 2048 (its own
 * threads) and the chip's fp32 FMA peak (independent FMA chains on the widest vectors it has,
 * one thread per core asked), so the figures are ratios measured under the same load.
 *
 * --lengths T1,T2,... first sweeps over row lengths at a fixed number of tokens per step
 * (--tokens, default the largest length: B = tokens / T rows), the engine in a child process
 * so that its peak RSS is its own: one `length T: ...` line each (attention's share of time and
 * memory grows with T), then the PyTorch peer on the same rows (`torch length T: ...`, with the
 * ratio), its address space capped at --torch-mem-gib (16): where it runs out of memory it runs
 * again with per-layer checkpointing, and says so. With --no-torch the engine's lines are all
 * the sweep prints.
 *
 * Usage: train_cpu [--threads N] [--steps K] [--layers L] [--no-torch] [--lengths T1,T2,...]
 *                  [--tokens N] [--torch-mem-gib G] [--recompute] [--bf16]
 * --recompute: the engine keeps one layer's activations and recomputes each in backward.
 * --bf16: the 4 x 256 step also runs with the frozen base weights in bf16 on AMX tiles
 * (lt_cpu_opts_t.amx_bf16), in alternating rounds with the f32 engine: `train_cpu_bf16_vs_f32: R`
 * (tokens/s ratio) before the last line, which stays the f32 engine's against PyTorch; in a
 * sweep, each length runs a second time so (`length T (bf16 base weights): ...`).
 * Last line: `train_cpu_vs_torch: <engine tokens/s / torch tokens/s>` (batch 4 x 256), or
 * `train_cpu_vs_torch: none (...)` with --no-torch: no ratio is made up. */
#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_config.h"
#include "lt_engine.h"

void openblas_set_num_threads(int num_threads);


/* B rows of T random tokens and targets over the model's vocabulary (seed 1); the caller frees
 * *tok and *tgt. */
static lt_batch_t random_batch(const lt_model_config_t *c, int B, int T, int32_t **tok, int32_t **tgt) {
  size_t n = (size_t)B * T;
  *tok = malloc(n * sizeof(int32_t));
  *tgt = malloc(n * sizeof(int32_t));
  unsigned rs = 1;
  for (size_t i = 0; i < n; i++) {
    (*tok)[i] = (int32_t)(rand_r(&rs) % c->vocab_size);
    (*tgt)[i] = (int32_t)(rand_r(&rs) % c->vocab_size);
  }
  return (lt_batch_t){.B = B, .T = T, .tokens = *tok, .targets = *tgt};
}

static double sgemm_gflops(int threads) {
  const int n = 2048;
  float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float)),
        *c = malloc((size_t)n * n * sizeof(float));
  for (size_t i = 0; i < (size_t)n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
  openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  double best = 1e9;
  for (int r = 0; r < 3; r++) {
    double t = bench_now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    t = bench_now_s() - t;
    best = t < best ? t : best;
  }
  free(a), free(b), free(c);
  return 2.0 * n * n * (double)n / best / 1e9;
}

/* One thread of fma_peak: 12 independent chains of `iters` FMAs on 16 (AVX-512) or 8 (AVX2)
 * lanes, enough to cover two FMA units' latency; the chains stay in registers, and each starts
 * from its own value (chains from one value are one computation to the compiler, which then
 * runs it once). */
#define FMA_CHAINS(V, FMA, SET1)                                                                    \
  V a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f), a3 = SET1(3.f), a4 = SET1(4.f), a5 = SET1(5.f); \
  V a6 = SET1(6.f), a7 = SET1(7.f), a8 = SET1(8.f), a9 = SET1(9.f), a10 = SET1(10.f), a11 = SET1(11.f); \
  for (long k = 0; k < iters; k++) {                                                                \
    a0 = FMA(a0, b, c), a1 = FMA(a1, b, c), a2 = FMA(a2, b, c), a3 = FMA(a3, b, c);                 \
    a4 = FMA(a4, b, c), a5 = FMA(a5, b, c), a6 = FMA(a6, b, c), a7 = FMA(a7, b, c);                 \
    a8 = FMA(a8, b, c), a9 = FMA(a9, b, c), a10 = FMA(a10, b, c), a11 = FMA(a11, b, c);             \
    __asm__ volatile("" : "+v"(a0), "+v"(a4), "+v"(a8));                                            \
  }                                                                                                 \
  V t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;

__attribute__((target("avx512f"))) static float fma_chains_512(long iters) {
  __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  FMA_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps)
  return t[0];
}

__attribute__((target("avx2,fma"))) static float fma_chains_256(long iters) {
  __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  FMA_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps)
  return t[0];
}

static volatile float fma_sink;
static void *fma_thread(void *arg) {
  long iters = *(long *)arg;
  fma_sink = __builtin_cpu_supports("avx512f") ? fma_chains_512(iters) : fma_chains_256(iters);
  return NULL;
}

/* The chip's fp32 FMA peak over `threads` threads, GFLOP/s (0 without AVX2 and FMA). */
static double fma_peak_gflops(int threads) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return 0;
  int lanes = __builtin_cpu_supports("avx512f") ? 16 : 8;
  long iters = 50000000;
  pthread_t th[64];
  threads = threads < 64 ? threads : 64;
  double best = 0;
  for (int r = 0; r < 3; r++) {
    double t = bench_now_s();
    for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, fma_thread, &iters);
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    t = bench_now_s() - t;
    double g = 2.0 * lanes * 12 * (double)iters * threads / t / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

/* Matrix FLOPs the step needs (causal attention counted at half the square). */
static double step_flops(const lt_model_config_t *c, int B, int T, int r) {
  double N = (double)B * T, D = c->hidden_size, F = c->intermediate_size,
         QD = (double)c->num_heads * c->head_dim, KD = (double)c->num_kv_heads * c->head_dim,
         V = c->vocab_size, L = c->num_layers;
  double lin = D * QD * 2 + D * KD * 2 + 3 * D * F;          /* base weights per layer */
  double lora = r * ((D + QD) * 2 + (D + KD) * 2 + 3 * (D + F)); /* A and B per layer */
  double att = 2.0 * B * c->num_heads * (double)T * T * c->head_dim; /* QK^T + PV, causal */
  double fwd = L * (2 * N * lin + 2 * N * lora + att) + 2 * N * V * D;
  /* backward: base dX only (frozen), LoRA dX + dA + dB + dla, attention x2, lm_head dX */
  double bwd = L * (2 * N * lin + 3 * 2 * N * lora + 2 * att) + 2 * N * V * D;
  return fwd + bwd;
}

/* The shape the benchmark trains; max_position covers the longest row asked for. */
static lt_model_config_t bench_config(int layers, int max_t) {
  lt_model_config_t c = {.vocab_size = 49152, .hidden_size = 576, .intermediate_size = 1536,
                         .num_layers = layers, .num_heads = 9, .num_kv_heads = 3,
                         .head_dim = 64, .max_position = max_t > 2048 ? max_t : 2048,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                         .rope_linear_factor = 1.0f, .tie_embeddings = 1};
  return c;
}

/* CPU seconds (user + system) of this process, all its threads: on a loaded machine the work
 * a step did, where wall time also says how much of the machine it got. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

/* The PyTorch peer (bench/train_cpu_torch.py) on B x T rows: its seconds per step and peak RSS.
 * mem_gib > 0 caps its address space; checkpoint: per-layer recompute. 0 when it ran, 3 when
 * it ran out of memory under the cap, 1 otherwise. */
static int torch_peer(int threads, int steps, int layers, int B, int T, double mem_gib, bool checkpoint,
                      double *step_s, double *rss_mib) {
  char cmd[4200], line[512];
  snprintf(cmd, sizeof cmd,
           "/usr/bin/python3 %s/bench/train_cpu_torch.py --threads %d --steps %d --layers %d --batch %d --seq %d "
           "--mem-gib %g%s",
           LT_SOURCE_ROOT, threads, steps, layers, B, T, mem_gib, checkpoint ? " --checkpoint" : "");
  fflush(stdout);
  FILE *p = popen(cmd, "r");
  *step_s = *rss_mib = 0;
  bool oom = false;
  while (p && fgets(line, sizeof line, p)) {
    sscanf(line, "torch_step_s: %lf", step_s);
    sscanf(line, "torch_peak_rss_mib: %lf", rss_mib);
    if (!strncmp(line, "torch_oom:", 10)) oom = true, fprintf(stderr, "torch peer: %s", line);
  }
  if (p) pclose(p);
  if (oom) return 3;
  if (*step_s <= 0) return fprintf(stderr, "torch peer failed: %s\n", cmd), 1;
  return 0;
}

/* One length of --lengths, in a child process: B x T rows, `steps` timed steps after a warm-up
 * one; prints the engine's tokens/s and the child's peak RSS into *tps. Returns 0 on success. */
static int recompute; /* --recompute: per-layer activation recompute in every engine run */

/* Seconds per step over `steps` LoRA steps of s on b. */
static double time_steps(lt_session_t *s, const lt_batch_t *b, int steps, float *loss) {
  lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                    .weight_decay = 0.01f, .max_grad_norm = 1.0f};
  char err[512];
  double t0 = bench_now_s();
  for (int k = 0; k < steps; k++)
    if (lt_forward_backward(s, b, LT_LOSS_CROSS_ENTROPY, loss, NULL, err, sizeof err) ||
        lt_optim_step(s, &opt, NULL, err, sizeof err)) {
      fprintf(stderr, "step: %s\n", err);
      exit(1);
    }
  return (bench_now_s() - t0) / steps;
}

static int sweep_length(int threads, int steps, int layers, int B, int T, bool bf16, double *tps) {
  int fd[2];
  if (pipe(fd)) return perror("pipe"), 1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return perror("fork"), 1;
  if (pid == 0) {
    char err[512];
    lt_model_config_t c = bench_config(layers, T);
    char dir[] = "/tmp/lt_bench_train_cpu_XXXXXX";
    if (!mkdtemp(dir)) _exit(1);
    lt_backend_t *be;
    lt_engine_t *eng;
    lt_session_t *s;
    lt_session_config_t sc = {.rank = 16, .alpha = 32, .targets = LT_TARGET_ALL, .seed = 1, .recompute = recompute};
    lt_cpu_opts_t bo = {.threads = threads, .amx_bf16 = bf16};
    if (lt_model_init_random(&c, dir, 1, 0.02f, 0.0f, err, sizeof err) ||
        lt_backend_cpu_new_opts(&bo, &be, err, sizeof err) ||
        lt_engine_open(dir, be, &eng, err, sizeof err) ||
        lt_session_new(eng, &sc, &s, err, sizeof err)) {
      fprintf(stderr, "engine: %s\n", err);
      _exit(1);
    }
    int N = B * T;
    int32_t *tok, *tgt;
    lt_batch_t b = random_batch(&c, B, T, &tok, &tgt);
    lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                      .weight_decay = 0.01f, .max_grad_norm = 1.0f};
    float loss = 0;
    double t0 = 0, c0 = 0;
    for (int k = 0; k <= steps; k++) {
      if (k == 1) t0 = bench_now_s(), c0 = cpu_s();
      if (lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &loss, NULL, err, sizeof err) ||
          lt_optim_step(s, &opt, NULL, err, sizeof err)) {
        fprintf(stderr, "step: %s\n", err);
        _exit(1);
      }
    }
    double step_s = (bench_now_s() - t0) / steps, cpu_step = (cpu_s() - c0) / steps, r = N / step_s;
    printf("length %d%s: %d x %d tokens, %.3f s/step, %.1f tokens/s, %.1f CPU s/step, loss %.3f", T,
           bf16 ? " (bf16 base weights)" : "", B, T, step_s, r, cpu_step, (double)loss);
    fflush(stdout);
    if (write(fd[1], &r, sizeof r) != sizeof r) _exit(1);
    bench_rm_rf(dir);
    _exit(0);
  }
  close(fd[1]);
  int st;
  struct rusage ru;
  bool got = read(fd[0], tps, sizeof *tps) == sizeof *tps;
  close(fd[0]);
  if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !got) {
    fprintf(stderr, "length %d failed\n", T);
    return 1;
  }
  printf(", peak RSS %.0f MiB\n", (double)ru.ru_maxrss / 1024.0);
  return 0;
}

int main(int argc, char **argv) {
  int threads = 2, steps = 2, layers = 30, torch = 1, tokens = 0, nlen = 0, lens[16], bf16 = 0;
  double mem_gib = 16;
  setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows when piped to a log */
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-torch")) torch = 0;
    else if (!strcmp(argv[i], "--recompute")) recompute = 1;
    else if (!strcmp(argv[i], "--bf16")) bf16 = 1;
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--torch-mem-gib") && i + 1 < argc) mem_gib = atof(argv[++i]);
    else if (!strcmp(argv[i], "--lengths") && i + 1 < argc) {
      for (char *p = argv[++i], *e; *p && nlen < 16; p = *e ? e + 1 : e) {
        lens[nlen] = (int)strtol(p, &e, 10);
        if (lens[nlen++] < 1 || (*e && *e != ',')) nlen = 17;
      }
      if (nlen > 16) nlen = -1;
    } else nlen = -1;
    if (nlen < 0) {
      fprintf(stderr,
              "usage: %s [--threads N] [--steps K] [--layers L] [--no-torch] "
              "[--lengths T1,T2,...] [--tokens N] [--torch-mem-gib G] [--recompute] [--bf16]\n",
              argv[0]);
      return 2;
    }
  }
  if (nlen) {
    int most = 0;
    for (int i = 0; i < nlen; i++) most = lens[i] > most ? lens[i] : most;
    if (tokens <= 0) tokens = most;
    printf("length sweep: %d tokens per step, %d layers, %d threads, %d steps%s\n", tokens, layers,
           threads, steps, recompute ? ", the engine recomputing each layer" : "");
    for (int i = 0; i < nlen; i++) {
      int rows = tokens / lens[i] > 0 ? tokens / lens[i] : 1;
      double tps, tstep, rss, tb;
      if (sweep_length(threads, steps, layers, rows, lens[i], false, &tps)) return 1;
      if (bf16 && sweep_length(threads, steps, layers, rows, lens[i], true, &tb)) return 1;
      if (!torch) continue;
      /* PyTorch keeps B*H*T*T probabilities per layer: past some length it cannot run on this
       * machine at all; then it runs again with per-layer recompute, labelled as such. */
      int rc = torch_peer(threads, steps, layers, rows, lens[i], mem_gib, false, &tstep, &rss);
      bool ckpt = rc == 3;
      if (ckpt) {
        printf("torch length %d: out of memory under a %.0f GiB cap; again with per-layer checkpointing\n",
               lens[i], mem_gib);
        rc = torch_peer(threads, steps, layers, rows, lens[i], mem_gib, true, &tstep, &rss);
      }
      if (rc == 3) printf("torch length %d: out of memory under a %.0f GiB cap, checkpointed too: no ratio\n",
                          lens[i], mem_gib);
      else if (rc) return 1;
      else
        printf("torch length %d%s: %.3f s/step, %.1f tokens/s, peak RSS %.0f MiB; engine / torch: %.2f\n", lens[i],
               ckpt ? " (checkpointed)" : "", tstep, rows * lens[i] / tstep, rss, tps * tstep / (rows * lens[i]));
    }
    if (!torch) { /* the sweep alone: no peer to compare the 4 x 256 run with */
      printf("train_cpu_vs_torch: none (--no-torch: no peer ran)\n");
      return 0;
    }
  }
  char err[512];
  lt_model_config_t c = bench_config(layers, 2048);
  const int B = 4, T = 256, R = 16;
  char dir[] = "/tmp/lt_bench_train_cpu_XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;

  double ceiling = sgemm_gflops(threads), peak = fma_peak_gflops(threads);
  printf("openblas sgemm n=2048, %d threads: %.1f GFLOP/s (OpenBLAS core %s)\n", threads, ceiling,
         openblas_get_corename());
  printf("fp32 FMA peak, %d threads, %s: %.1f GFLOP/s (sgemm at %.0f%% of it)\n", threads,
         __builtin_cpu_supports("avx512f") ? "AVX-512" : "AVX2", peak, peak > 0 ? 100.0 * ceiling / peak : 0);

  if (lt_model_init_random(&c, dir, 1, 0.02f, 0.0f, err, sizeof err)) {
    fprintf(stderr, "init: %s\n", err);
    return 1;
  }
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *s;
  lt_session_config_t sc = {.rank = R, .alpha = 32, .targets = LT_TARGET_ALL, .seed = 1, .recompute = recompute};
  if (lt_backend_cpu_new(threads, &be, err, sizeof err) ||
      lt_engine_open(dir, be, &eng, err, sizeof err) ||
      lt_session_new(eng, &sc, &s, err, sizeof err)) {
    fprintf(stderr, "engine: %s\n", err);
    return 1;
  }
  /* --bf16: the same model and batch on a backend with the base weights on AMX */
  lt_backend_t *bb = NULL;
  lt_engine_t *eb = NULL;
  lt_session_t *sb = NULL;
  lt_cpu_opts_t bo = {.threads = threads, .amx_bf16 = 1};
  if (bf16 && (lt_backend_cpu_new_opts(&bo, &bb, err, sizeof err) || lt_engine_open(dir, bb, &eb, err, sizeof err) ||
               lt_session_new(eb, &sc, &sb, err, sizeof err))) {
    fprintf(stderr, "bf16 engine: %s\n", err);
    return 1;
  }
  int32_t *tok, *tgt;
  lt_batch_t b = random_batch(&c, B, T, &tok, &tgt);
  float loss = 0, loss_b = 0;
  time_steps(s, &b, 1, &loss); /* warm-up: allocates activations, packs the bf16 weights */
  if (sb) time_steps(sb, &b, 1, &loss_b);
  int rounds = sb ? 2 : 1; /* alternating, so both see the machine alike */
  double step_s = 0, step_b = 0;
  for (int r = 0; r < rounds; r++) {
    step_s += time_steps(s, &b, steps, &loss) / rounds;
    if (sb) step_b += time_steps(sb, &b, steps, &loss_b) / rounds;
  }
  double tps = B * T / step_s, flops = step_flops(&c, B, T, R);
  printf("engine: %d layers, %.3f s/step, %.1f tokens/s, loss %.3f\n", layers, step_s, tps,
         (double)loss);
  if (sb) {
    printf("engine, bf16 base weights on AMX: %.3f s/step, %.1f tokens/s, loss %.3f\n", step_b, B * T / step_b,
           (double)loss_b);
    printf("train_cpu_bf16_vs_f32: %.2f\n", step_s / step_b);
    lt_session_destroy(sb);
    lt_engine_close(eb);
    lt_backend_destroy(bb);
  }
  printf("engine: %.1f GFLOP/step, %.1f GFLOP/s = %.0f%% of the sgemm ceiling, %.0f%% of the FMA peak\n",
         flops / 1e9, flops / step_s / 1e9, 100.0 * flops / step_s / 1e9 / ceiling,
         peak > 0 ? 100.0 * flops / step_s / 1e9 / peak : 0);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  bench_rm_rf(dir);

  double ratio = 0;
  if (torch) {
    double tstep, rss;
    if (torch_peer(threads, steps, layers, B, T, 0, false, &tstep, &rss)) return 1;
    printf("torch: %.3f s/step, %.1f tokens/s, %.1f GFLOP/s\n", tstep, B * T / tstep,
           flops / tstep / 1e9);
    ratio = tstep / step_s;
  }
  if (torch) printf("train_cpu_vs_torch: %.2f\n", ratio);
  else printf("train_cpu_vs_torch: none (--no-torch: no peer ran)\n");
  return 0;
}
