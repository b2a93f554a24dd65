/* engine_parity: the engine end to end on the cuda backend against the cpu backend — one random
 * model, one LoRA session on each, the same batches: the loss and every token's log-prob, every
 * adapter gradient, the adapter after one AdamW step, and greedy sampling (tokens and
 * log-probs), on unpacked rows and on packed ones (two examples a row). f32 on both sides
 * (cuBLAS with TF32 off), so the tolerances are those of float sums in another order. Then the
 * cuda backend in bf16 (tensor cores, f32 accumulation) against the same f32 cpu run: the loss
 * within 1 %, and a second bf16 run the same bits (the kernels' sums run in a fixed order).
 *
 * One line a check; exit 0 when all pass, 1 when one fails, 77 when there is no GPU (meson
 * reports a skip; the line says "skipped: no GPU"). Built by meson (suite gpu) and by
 * tests/gpu/run_on_device.sh. --cpu-peer runs the same checks with a second cpu backend (one
 * thread, and AMX tiles for the bf16 part, where the chip has them) in the GPU's place: the
 * driver's own check, on any machine.
 *   engine_parity [--cpu-peer] [scratch-dir]      (default: a new directory under /tmp) */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_backend_cuda.h"
#include "lt_engine.h"
#include "lt_safetensors.h"

static char err[1024];
static int failed;

/* One check's line: what, ok or FAIL, and the figures (printf-style). */
__attribute__((format(printf, 3, 4))) static void check(int ok, const char *what, const char *fmt, ...) {
  char detail[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  printf("%-58s %s  %s\n", what, ok ? "ok" : "FAIL", detail);
  fflush(stdout);
  if (!ok) failed = 1;
}

static void die(const char *what) {
  printf("%s: %s\n", what, err);
  exit(1);
}

/* max |a - b| / (atol + rtol |b|) over n: <= 1 passes. */
static double worst(const float *a, const float *b, size_t n, double atol, double rtol) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
    if (!(d <= w)) w = d; /* NaN counts as the worst */
  }
  return w;
}

/* Compares every tensor of two lt_dump_tensors files. */
static double compare_dumps(const char *a, const char *b, double atol, double rtol) {
  lt_st_t *sa, *sb;
  if (lt_st_open_file(a, &sa, err, sizeof err) || lt_st_open_file(b, &sb, err, sizeof err)) die("dump");
  double w = 0;
  for (size_t i = 0; i < lt_st_count(sa); i++) {
    const lt_st_tensor_t *t = lt_st_at(sa, i), *u = lt_st_find(sb, t->name);
    if (!u || u->numel != t->numel) {
      printf("tensor %s: missing or another shape on the other side\n", t->name);
      return INFINITY;
    }
    const float *x, *y;
    float *ox, *oy;
    if (lt_st_get_f32(sa, t->name, t->ndim, t->shape, &x, &ox, err, sizeof err) ||
        lt_st_get_f32(sb, t->name, u->ndim, u->shape, &y, &oy, err, sizeof err))
      die("dump tensor");
    double d = worst(y, x, (size_t)t->numel, atol, rtol);
    if (d > w) w = d;
    free(ox), free(oy);
  }
  lt_st_close(sa), lt_st_close(sb);
  return w;
}

typedef struct side {
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *s;
} side_t;

static int cpu_peer;
static const char *peer = "cuda";

/* The backend under test: cuda (bf16: tensor cores), or with --cpu-peer a one-thread cpu
 * backend (bf16: AMX tiles). */
static lt_err_t peer_new(int bf16, lt_backend_t **out) {
  if (cpu_peer) {
    lt_cpu_opts_t o = {.threads = 1, .amx_bf16 = bf16, .bf16_min_elems = 4096};
    return lt_backend_cpu_new_opts(&o, out, err, sizeof err);
  }
  lt_cuda_opts_t o = {bf16, 4096}; /* the matrices in bf16, the norms and biases (which kernels read as floats) not */
  return lt_backend_cuda_new_opts(0, &o, out, err, sizeof err);
}

static void side_open(side_t *x, lt_backend_t *be, const char *model, const lt_session_config_t *sc) {
  x->be = be;
  if (lt_engine_open(model, be, &x->eng, err, sizeof err)) die("engine");
  if (lt_session_new(x->eng, sc, &x->s, err, sizeof err)) die("session");
}

static void side_close(side_t *x) {
  lt_session_destroy(x->s);
  lt_engine_close(x->eng);
  lt_backend_destroy(x->be);
}

/* The session's gradient buffer, copied to the host (the caller frees it). */
static float *host_grads(side_t *x, size_t *n) {
  float *g = lt_session_grad_buffer(x->s, n), *h = malloc(*n * sizeof *h);
  if (!g || !h || x->be->download(x->be, h, g, *n * sizeof *h)) die("gradients");
  return h;
}

enum { B = 2, T = 48, N = B * T, NEW = 12 };

int main(int argc, char **argv) {
  int a = 1;
  if (argc > 1 && !strcmp(argv[1], "--cpu-peer")) cpu_peer = 1, peer = "cpu peer", a++;
  lt_backend_t *gb;
  lt_err_t e = peer_new(0, &gb);
  if (e == LT_ERR_UNAVAILABLE) {
    printf("engine parity: skipped: no GPU (%s)\n", err);
    return 77;
  }
  if (e) die("cuda backend");
  char dir[512];
  if (argc > a) snprintf(dir, sizeof dir, "%s", argv[a]);
  else {
    snprintf(dir, sizeof dir, "/tmp/lt_engine_parity_XXXXXX");
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  }
  char model[600];
  snprintf(model, sizeof model, "%s/model", dir);
  /* GQA, untied head, q/k/v bias: every branch of the forward pass */
  lt_model_config_t mc = {.vocab_size = 384, .hidden_size = 128, .intermediate_size = 352,
                          .num_layers = 3, .num_heads = 4, .num_kv_heads = 2, .head_dim = 32,
                          .max_position = 256, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_linear_factor = 1.0f, .tie_embeddings = 0, .qkv_bias = 1};
  if (lt_model_init_random(&mc, model, 11, 0.05f, 0.1f, err, sizeof err)) die("model");
  lt_session_config_t sc = {.rank = 8, .alpha = 16, .targets = LT_TARGET_ALL, .seed = 5};
  lt_backend_t *cb;
  if (lt_backend_cpu_new(2, &cb, err, sizeof err)) die("cpu backend");
  side_t cpu, gpu;
  side_open(&cpu, cb, model, &sc);
  side_open(&gpu, gb, model, &sc);

  int32_t tok[N], tgt[N], pos[N];
  float w[N];
  unsigned rs = 3;
  for (int i = 0; i < N; i++) {
    tok[i] = (int32_t)(rand_r(&rs) % mc.vocab_size);
    tgt[i] = (int32_t)(rand_r(&rs) % mc.vocab_size);
    w[i] = i % T < 5 ? 0.0f : 1.0f; /* a prompt's tokens are not scored */
    pos[i] = i % T < 20 ? i % T : i % T - 20; /* packed: examples of 20 and 28 tokens a row */
  }
  /* eps 1e-3, not 1e-8: AdamW's first steps move an element by about lr whatever its gradient's
   * size, so a gradient near 0 whose sign differs between the backends would move it by lr
   * either way; with eps at 1e-3 such an element hardly moves, and the adapters are compared
   * to 2e-3 (a fifth of lr) */
  lt_adamw_t opt = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-3f, .max_grad_norm = 1.0f};
  for (int packed = 0; packed < 2; packed++) {
    lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .weights = w,
                    .positions = packed ? pos : NULL};
    const char *rows = packed ? "packed" : "unpacked";
    char what[128];
    float lc, lg, pc[N], pg[N];
    if (lt_forward_backward(cpu.s, &b, LT_LOSS_CROSS_ENTROPY, &lc, pc, err, sizeof err)) die("cpu forward_backward");
    if (lt_forward_backward(gpu.s, &b, LT_LOSS_CROSS_ENTROPY, &lg, pg, err, sizeof err)) die("cuda forward_backward");
    snprintf(what, sizeof what, "%s: loss", rows);
    check(fabs((double)lg - lc) <= 1e-4 * fabs((double)lc), what, "cpu %.7g %s %.7g", lc, peer, lg);
    snprintf(what, sizeof what, "%s: log-probs (atol 2e-4)", rows);
    double d = worst(pg, pc, N, 2e-4, 0);
    check(d <= 1, what, "worst %.3g of the tolerance", d);
    size_t n, n2;
    float *gc = host_grads(&cpu, &n), *gg = host_grads(&gpu, &n2);
    double gmax = 0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs((double)gc[i]));
    d = n == n2 ? worst(gg, gc, n, 1e-3 * gmax, 1e-3) : INFINITY;
    snprintf(what, sizeof what, "%s: %zu adapter gradients (1e-3 rel + 1e-3 max)", rows, n);
    check(d <= 1, what, "worst %.3g of the tolerance, max |g| %.3g", d, gmax);
    free(gc), free(gg);
    float nc, ng;
    if (lt_optim_step(cpu.s, &opt, &nc, err, sizeof err) || lt_optim_step(gpu.s, &opt, &ng, err, sizeof err))
      die("optim_step");
    snprintf(what, sizeof what, "%s: gradient norm", rows);
    check(fabs((double)ng - nc) <= 1e-3 * nc, what, "cpu %.7g %s %.7g", nc, peer, ng);
    char fc[700], fg[700];
    snprintf(fc, sizeof fc, "%s/cpu_%d.safetensors", dir, packed);
    snprintf(fg, sizeof fg, "%s/cuda_%d.safetensors", dir, packed);
    if (lt_dump_tensors(cpu.s, 0, fc, err, sizeof err) || lt_dump_tensors(gpu.s, 0, fg, err, sizeof err))
      die("dump");
    d = compare_dumps(fc, fg, 2e-3, 1e-3);
    snprintf(what, sizeof what, "%s: adapter after AdamW (atol 2e-3)", rows);
    check(d <= 1, what, "worst %.3g of the tolerance", d);
  }

  /* greedy sampling from the trained adapter: the same tokens, log-probs within 2e-4 */
  int32_t p0[7] = {1, 5, 9, 14, 20, 27, 35}, p1[3] = {3, 1, 4};
  const int32_t *prompts[2] = {p0, p1};
  int lens[2] = {7, 3}, oc[2], og[2];
  int32_t tc[2 * NEW], tg[2 * NEW];
  float lpc[2 * NEW], lpg[2 * NEW];
  lt_sample_params_t sp = {.max_tokens = NEW, .temperature = 0, .top_p = 1, .seed = 1};
  if (lt_sample(cpu.s, 2, prompts, lens, &sp, tc, lpc, oc, err, sizeof err) ||
      lt_sample(gpu.s, 2, prompts, lens, &sp, tg, lpg, og, err, sizeof err))
    die("sample");
  int same = oc[0] == og[0] && oc[1] == og[1] && !memcmp(tc, tg, sizeof tc);
  check(same, "greedy sampling: the same tokens", "%d and %d tokens generated", og[0] + og[1], oc[0] + oc[1]);
  double d = same ? worst(lpg, lpc, 2 * NEW, 2e-4, 0) : INFINITY;
  check(d <= 1, "greedy sampling: log-probs (atol 2e-4)", "worst %.3g of the tolerance", d);
  side_close(&gpu);

  /* bf16 on the tensor cores against the f32 cpu run, and against itself */
  float lb[2];
  for (int k = 0; k < 2; k++) {
    lt_backend_t *bb;
    e = peer_new(1, &bb);
    if (e == LT_ERR_UNSUPPORTED && cpu_peer) {
      printf("bf16: skipped: %s\n", err);
      side_close(&cpu);
      printf("engine parity: %s\n", failed ? "FAILED" : "all passed");
      return failed;
    }
    if (e) die("backend under test, bf16");
    side_t x;
    side_open(&x, bb, model, &sc);
    lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .weights = w};
    if (lt_forward_backward(x.s, &b, LT_LOSS_CROSS_ENTROPY, &lb[k], NULL, err, sizeof err)) die("bf16 forward_backward");
    side_close(&x);
  }
  lt_session_t *fresh;
  float lf;
  if (lt_session_new(cpu.eng, &sc, &fresh, err, sizeof err)) die("session");
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt, .weights = w};
  if (lt_forward(fresh, &b, LT_LOSS_CROSS_ENTROPY, &lf, NULL, err, sizeof err)) die("cpu forward");
  lt_session_destroy(fresh);
  check(lb[0] != lf && fabs((double)lb[0] - lf) <= 1e-2 * fabs((double)lf),
        "bf16: the loss within 1 % of f32 cpu's, not its bits", "cpu %.7g, %s in bf16 %.7g", lf, peer, lb[0]);
  check(lb[0] == lb[1], "bf16: two runs, the same loss bits", "%.9g and %.9g", lb[0], lb[1]);
  side_close(&cpu);
  printf("engine parity: %s\n", failed ? "FAILED" : "all passed");
  return failed;
}
