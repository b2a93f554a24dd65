/* bench_gpu_engine: LoRA training through lt_engine itself on the cuda backend in bf16 — the
 * embedding, every layer, the LM head in chunks, the loss and AdamW, as a job runs them — on a
 * random 1B-class Llama (defaults: D 2048, 16 layers, 32 heads, 8 kv heads, FFN 8192, vocabulary
 * 32,000, tied embeddings; B 4 x T 2048, LoRA rank 16 on all seven maps). tests/gpu/bench_gpu.c
 * times the layer stack alone; this is the whole step.
 *
 * Useful FLOPs per token: per layer the frozen maps 4P (forward and input gradient), LoRA
 * 6r(in + out) a map, causal attention 6 T H hd; the LM head 4 D V (logits and their input
 * gradient). MFU is against the device's bf16 ceiling measured in the same run (a 8192^3
 * product through the same backend, bf16 weights, f32 accumulation), and against the card's
 * nominal dense peak (LATHE_PEAK_TFLOPS overrides it). Last lines: `gpu_engine_tokens_per_s: N`,
 * `gpu_engine_mfu: P` (percent of the measured ceiling).
 *   bench_gpu_engine [layers D H KV FFN V B T rank steps] */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../bench/bench_util.h" /* bench_now_s, bench_rm_rf */
#include "lt_backend_cuda.h"
#include "lt_engine.h"
#include "lt_gpu_peak.h"

/* TFLOP/s of the backend's bf16 product C = A W^T at n x n x n (W mapped, so bf16). */
static double ceiling(lt_backend_t *be, int n) {
  size_t nn = (size_t)n * n;
  float *h = malloc(nn * sizeof *h);
  for (size_t i = 0; i < nn; i++) h[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
  const float *W = be->map_const(be, h, nn);
  float *A = be->alloc(be, nn * sizeof(float)), *C = be->alloc(be, nn * sizeof(float));
  if (!W || !A || !C) {
    fprintf(stderr, "bench_gpu_engine: ceiling buffers: %s\n", be->last_error(be));
    exit(1);
  }
  be->upload(be, A, h, nn * sizeof(float));
  double best = 1e30;
  for (int i = 0; i < 6; i++) {
    double t = bench_now_s();
    be->matmul(be, 0, 1, n, n, n, 1.0f, A, n, W, n, 0.0f, C, n);
    be->sumsq(be, C, 1); /* waits for the stream */
    t = bench_now_s() - t;
    if (i && t < best) best = t;
  }
  be->free(be, A), be->free(be, C), be->free_const(be, W);
  free(h);
  return 2.0 * n * (double)n * n / best / 1e12;
}

int main(int argc, char **argv) {
  int L = 16, D = 2048, H = 32, KV = 8, F = 8192, V = 32000, B = 4, T = 2048, R = 16, steps = 4;
  int *args[] = {&L, &D, &H, &KV, &F, &V, &B, &T, &R, &steps};
  for (int i = 1; i < argc && i <= 10; i++) *args[i - 1] = atoi(argv[i]);
  char err[1024];
  lt_backend_t *be;
  lt_cuda_opts_t o = {1, 0};
  lt_err_t e = lt_backend_cuda_new_opts(0, &o, &be, err, sizeof err);
  if (e) {
    printf("bench_gpu_engine: no cuda backend: %s\n", err);
    return e == LT_ERR_UNAVAILABLE ? 0 : 1;
  }
  struct cudaDeviceProp prop;
  memset(&prop, 0, sizeof prop);
  cudaGetDeviceProperties(&prop, 0);
  double nominal = lt_gpu_nominal_peak_tflops(prop.name);
  double ceil_tf = ceiling(be, 8192);
  printf("device: %s; bf16 ceiling measured %.1f TFLOP/s (nominal %.1f)\n", prop.name, ceil_tf, nominal);

  char dir[] = "/tmp/lt_bench_gpu_engine_XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  int hd = D / H;
  lt_model_config_t mc = {.vocab_size = V, .hidden_size = D, .intermediate_size = F, .num_layers = L,
                          .num_heads = H, .num_kv_heads = KV, .head_dim = hd, .max_position = T,
                          .rms_norm_eps = 1e-5f, .rope_theta = 500000.0f, .rope_linear_factor = 1.0f,
                          .tie_embeddings = 1};
  double t0 = bench_now_s();
  if (lt_model_init_random(&mc, dir, 1, 0.02f, 0.0f, err, sizeof err)) {
    printf("bench_gpu_engine: model: %s\n", err);
    return 1;
  }
  lt_engine_t *eng;
  lt_session_t *s;
  lt_session_config_t sc = {.rank = R, .alpha = 2.0f * R, .targets = LT_TARGET_ALL, .seed = 1};
  if (lt_engine_open(dir, be, &eng, err, sizeof err) || lt_session_new(eng, &sc, &s, err, sizeof err)) {
    printf("bench_gpu_engine: engine: %s\n", err);
    return 1;
  }
  printf("shape: layers=%d D=%d H=%d KV=%d hd=%d FFN=%d V=%d B=%d T=%d lora_r=%d (model made and loaded in %.1f s)\n",
         L, D, H, KV, hd, F, V, B, T, R, bench_now_s() - t0);
  size_t n = (size_t)B * T;
  int32_t *tok = malloc(n * sizeof *tok), *tgt = malloc(n * sizeof *tgt);
  unsigned rs = 1;
  for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(rand_r(&rs) % V), tgt[i] = (int32_t)(rand_r(&rs) % V);
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .max_grad_norm = 1.0f};
  double best = 1e30;
  for (int k = 0; k <= steps; k++) {
    float loss, gn;
    double t = bench_now_s();
    if (lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &loss, NULL, err, sizeof err) ||
        lt_optim_step(s, &opt, &gn, err, sizeof err)) {
      printf("bench_gpu_engine: step %d: %s\n", k, err);
      return 1;
    }
    t = bench_now_s() - t;
    printf("step %d: %.2f ms, loss %.4f, grad norm %.3g%s\n", k, t * 1e3, loss, gn, k ? "" : " (warm-up)");
    fflush(stdout);
    if (k && t < best) best = t;
  }
  int Dk = KV * hd;
  double P = 2.0 * D * D + 2.0 * D * Dk + 3.0 * D * F;
  double lora = 6.0 * R * ((D + D) * 2 + (D + Dk) * 2 + (D + F) * 3);
  double flops = (double)n * (L * (4 * P + lora + 6.0 * T * H * hd) + 4.0 * D * V);
  double tf = flops / best / 1e12;
  printf("best step: %.2f ms, %.0f tokens/s, %.1f TFLOP/s useful = %.1f %% of the measured ceiling, %.1f %% of nominal\n",
         best * 1e3, n / best, tf, 100 * tf / ceil_tf, 100 * tf / nominal);
  printf("gpu_engine_tokens_per_s: %.0f\n", n / best);
  printf("gpu_engine_mfu: %.1f\n", 100 * tf / ceil_tf);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  bench_rm_rf(dir);
  free(tok), free(tgt);
  return 0;
}
