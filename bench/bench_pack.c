/* bench_pack: what packing short examples buys the managed loop (lt_train_run), against the
 * same loop with one row per example, on the same model, data, seed and thread count in the same
 * run. The math is the same either way (test_engine: packed rows compute what separate rows
 * compute), so trained tokens per second compare directly.
 *
 * Data: chat-like lengths — 80 % of the examples are short (a few to ~30 tokens), 20 % long
 * (~150-250 tokens) — so one row per example pads most rows to the longest example, while
 * packing fills rows first-fit. A second dataset of near-equal lengths (nothing to pack) shows
 * that packing costs nothing when it cannot help. Model: random Llama-family weights, d=256,
 * 4 layers, 8 heads / 4 kv, ffn 704, tokenizer trained by lt_task (vocab 1024).
 *
 * Usage: bench_pack   (LATHE_BENCH_THREADS (2), LATHE_BENCH_STEPS (6), LATHE_BENCH_ROUNDS (3))
 * Last line: `pack_speedup: X` (median per-round ratio of tokens/s, packed / one row per
 * example, on the chat-like data). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_engine.h"
#include "lt_task.h"
#include "lt_train.h"

static char err[1024];

static void die(const char *what) {
  fprintf(stderr, "bench_pack: %s: %s\n", what, err);
  exit(1);
}

static const char *const words[] = {"the", "model", "learns", "a", "mapping", "from", "dates", "to",
                                    "their", "iso", "form", "and", "then", "some", "more", "text"};

/* n examples; `skewed`: 80 % short, 20 % long; else all about the same length. */
static char *dataset(int n, int skewed, size_t *len) {
  size_t cap = (size_t)n * 2048, off = 0;
  char *d = malloc(cap);
  unsigned rs = 5;
  for (int i = 0; i < n; i++) {
    int nw = skewed ? (rand_r(&rs) % 5 == 0 ? 120 + rand_r(&rs) % 80 : 2 + rand_r(&rs) % 20) : 60 + rand_r(&rs) % 8;
    off += (size_t)snprintf(d + off, cap - off, "{\"prompt\":\"question %d:\",\"completion\":\"", i);
    for (int w = 0; w < nw; w++) off += (size_t)snprintf(d + off, cap - off, "%s%s", w ? " " : "", words[rand_r(&rs) % 16]);
    off += (size_t)snprintf(d + off, cap - off, "\"}\n");
  }
  *len = off;
  return d;
}

typedef struct {
  double tokens_per_s;
} last_t;

static void on_step(void *ctx, const lt_train_step_t *st) { ((last_t *)ctx)->tokens_per_s = st->tokens_per_s; }

static double run(const char *model, const char *work, const char *data, size_t len, int pack, int threads,
                  int steps, lt_train_result_t *res) {
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  spec.hp.max_steps = steps;
  spec.hp.batch_size = 8;
  spec.hp.checkpoint_interval = 0;
  spec.hp.checkpoint_interval_s = 0;
  spec.hp.validation_fraction = 0;
  spec.hp.lora_dropout = 0;
  spec.hp.max_seq_len = 512;
  lt_train_conf_t tc = {.model_dir = model, .base_model_name = "bench", .train = data, .train_len = len,
                        .hp = spec.hp, .threads = threads, .work_dir = work, .one_row_per_example = !pack};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  last_t last = {0};
  lt_train_hooks_t hooks = {.ctx = &last, .on_step = on_step};
  if (lt_train_run(&tc, &hooks, res, err, sizeof err)) die("train");
  return last.tokens_per_s;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int threads = bench_env_int("LATHE_BENCH_THREADS", 2), steps = bench_env_int("LATHE_BENCH_STEPS", 6),
      rounds = bench_env_int("LATHE_BENCH_ROUNDS", 3);
  if (threads < 1 || steps < 1 || rounds < 1 || rounds > 20) {
    fprintf(stderr, "bench_pack: bad LATHE_BENCH_* settings\n");
    return 2;
  }
  char root[64], bundle[128], model[128], work[128], cmd[512];
  if (!bench_workspace("pack", root, sizeof root, model, work, sizeof model)) die("mkdtemp");
  snprintf(bundle, sizeof bundle, "%s/bundle", root);
  mkdir(bundle, 0700);
  if (lt_task_write_bundle(bundle, 1, 400000, 1024, 10, 2, err, sizeof err)) die("tokenizer");
  lt_model_config_t c = {.vocab_size = 1024, .hidden_size = 256, .intermediate_size = 704, .num_layers = 4,
                         .num_heads = 8, .num_kv_heads = 4, .head_dim = 32, .max_position = 1024,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  if (lt_model_init_random(&c, model, 3, 0.02f, 0.0f, err, sizeof err)) die("model");
  snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/'", bundle, model);
  if (system(cmd) != 0) die("copy tokenizer");
  double ratio_out = 0;
  for (int skewed = 1; skewed >= 0; skewed--) {
    size_t len;
    char *data = dataset(400, skewed, &len);
    double ratio[20];
    lt_train_result_t rp = {0}, ru = {0};
    for (int r = 0; r < rounds; r++) {
      double tp = 0, tu = 0;
      for (int side = 0; side < 2; side++) { /* alternate which goes first */
        int pack = (side == 0) == (r % 2 == 0);
        double t = run(model, work, data, len, pack, threads, steps, pack ? &rp : &ru);
        if (pack) tp = t;
        else tu = t;
      }
      ratio[r] = tp / tu;
      printf("%s: round %d: packed %.0f tokens/s (%lld rows for %lld examples), one row per example %.0f tokens/s "
             "(%lld rows): %.2fx\n",
             skewed ? "chat-like lengths" : "equal lengths", r + 1, tp, (long long)rp.rows, (long long)rp.examples, tu,
             (long long)ru.rows, ratio[r]);
    }
    double med = bench_median(ratio, rounds);
    printf("%s: packed / one row per example, median of %d rounds: %.2fx\n",
           skewed ? "chat-like lengths" : "equal lengths", rounds, med);
    if (skewed) ratio_out = med;
    free(data);
  }
  bench_rm_rf(root);
  printf("pack_speedup: %.2f\n", ratio_out);
  return 0;
}
