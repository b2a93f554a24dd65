/* bench_ckpt: checkpoint save and restore time and bytes, and the checkpoint's overhead on step
 * time, for a LoRA r16 session on two model shapes with random weights:
 *   tiny:   the bundled base model's shape (lt_train_default_model: d=192, 4 layers);
 *   smollm: SmolLM2-135M's shape (d=576, 30 layers, 9 heads / 3 kv, ffn 1536, vocab 49152).
 *
 * Save / restore: lt_save_state (write + fflush + fsync + rename) and lt_load_state, median of
 * K runs, beside the same number of bytes written with write + fsync + rename and read back with
 * read() in the same run (the disk's own ceiling for that file): the ratios say what the format
 * costs over moving the bytes.
 *
 * Overhead: what a managed job's checkpoint costs at checkpoint_interval N (default 1) — lt_save_state +
 * lt_export_peft into a private directory on the training thread, then the executor's own
 * uploader (lt_ckpt) sealing (LTE1, the tenant's key) and uploading every file to the object store
 * (the S3 server of ops/stack when LATHE_S3_* is set, else a directory store) on its thread while
 * training goes on — against the same steps without it. A block with checkpoints ends when its last
 * upload is stored, so every upload is counted. The two run in alternating blocks (R rounds of S
 * steps each) so the machine's swings hit both; the figure is the median of per-round ratios.
 *
 * Usage: bench_ckpt   (environment: LATHE_BENCH_THREADS (2), LATHE_BENCH_LAYERS (30),
 *        LATHE_BENCH_B (1), LATHE_BENCH_T (256), LATHE_BENCH_ROUNDS (3), LATHE_BENCH_STEPS (2),
 *        LATHE_BENCH_EVERY (1): a checkpoint every N of the STEPS steps)
 * Last line: `ckpt_overhead_pct: X` (smollm shape, interval LATHE_BENCH_EVERY; goal <= 5). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_engine.h"
#include "bench_util.h"
#include "lt_ckpt.h"
#include "lt_crypto.h"
#include "lt_engine.h"
#include "lt_store.h"
#include "lt_train.h"

static char err[1024];

static void die(const char *what) {
  fprintf(stderr, "bench_ckpt: %s: %s\n", what, err);
  exit(1);
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

/* The peer of lt_save_state: n bytes with write + fsync + rename. */
static double raw_write(const char *dir, const uint8_t *buf, size_t n) {
  char tmp[512], path[512];
  snprintf(tmp, sizeof tmp, "%.400s/raw.tmp", dir);
  snprintf(path, sizeof path, "%.400s/raw.bin", dir);
  double t = bench_now_s();
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return -1;
  for (size_t off = 0; off < n;) {
    ssize_t w = write(fd, buf + off, n - off > (1 << 20) ? 1 << 20 : n - off);
    if (w <= 0) return close(fd), -1;
    off += (size_t)w;
  }
  if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, path) != 0) return -1;
  return bench_now_s() - t;
}

/* The peer of lt_load_state: read() the file into a buffer. */
static double raw_read(const char *path, uint8_t *buf, size_t cap) {
  double t = bench_now_s();
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  size_t off = 0;
  ssize_t r;
  while (off < cap && (r = read(fd, buf + off, cap - off > (1 << 20) ? 1 << 20 : cap - off)) > 0) off += (size_t)r;
  close(fd);
  return bench_now_s() - t;
}

typedef struct {
  lt_store_t *store;
  lt_crypto_dek_t *dek;
  int seq;
} upload_t;

/* The small files of a checkpoint beside state and adapter; their content does not matter here. */
static void write_small_files(const char *dir) {
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    const char *name = lt_ckpt_names[i];
    if (!strstr(name, ".json") || !strcmp(name, "adapter_config.json")) continue; /* the engine's own */
    char path[512];
    snprintf(path, sizeof path, "%.400s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f || fputs("{}\n", f) < 0 || fclose(f) != 0) die("small files");
  }
}

/* One shape: prints save/restore figures; returns the median overhead of a checkpoint every
 * step, in percent of the step without. */
static double run_shape(const char *label, lt_model_config_t *c, int threads, int B, int T, int rounds,
                        int steps, int every, upload_t *up) {
  char dir[64], model[128], work[128], state[160];
  if (!bench_workspace("ckpt", dir, sizeof dir, model, work, sizeof model)) die("mkdtemp");
  snprintf(state, sizeof state, "%s/state.bin", work);
  double t0 = bench_now_s();
  if (lt_model_init_random(c, model, 1, 0.02f, 0.0f, err, sizeof err)) die("model");
  char st[192];
  snprintf(st, sizeof st, "%s/model.safetensors", model);
  printf("%s: model %.1f MB of f32 weights (made in %.1f s)\n", label, (double)file_size(st) / 1e6, bench_now_s() - t0);
  bench_engine_t be;
  if (bench_engine_open(&be, model, threads, err, sizeof err)) die("engine");
  lt_session_t *s = be.s;
  int32_t *tok = malloc((size_t)B * T * sizeof(int32_t)), *tgt = malloc((size_t)B * T * sizeof(int32_t));
  unsigned rs = 1;
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int32_t)(rand_r(&rs) % (unsigned)c->vocab_size);
    tgt[i] = (int32_t)(rand_r(&rs) % (unsigned)c->vocab_size);
  }
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                    .max_grad_norm = 1.0f};
  float loss;
  /* GATE runs between the passes and the update, as the executor's before_update does. */
#define STEP_GATED(GATE)                                                                           \
  do {                                                                                             \
    if (lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &loss, NULL, err, sizeof err)) die("step"); \
    GATE;                                                                                          \
    if (lt_optim_step(s, &opt, NULL, err, sizeof err)) die("step");                                \
  } while (0)
#define STEP() STEP_GATED((void)0)
  STEP(); /* warm: activations allocated, AdamW moments non-zero */

  /* save / restore, beside raw write / read of as many bytes */
  enum { K = 5 };
  double ts[K], tl[K], tw[K], tr[K];
  if (lt_save_state(s, state, 7, err, sizeof err)) die("save");
  size_t bytes = (size_t)file_size(state);
  uint8_t *buf = malloc(bytes);
  if (!buf) die("malloc");
  memset(buf, 0x5a, bytes);
  char rawp[192];
  snprintf(rawp, sizeof rawp, "%s/raw.bin", work);
  for (int k = 0; k < K; k++) {
    double t = bench_now_s();
    if (lt_save_state(s, state, 7, err, sizeof err)) die("save");
    ts[k] = bench_now_s() - t;
    tw[k] = raw_write(work, buf, bytes);
    uint64_t cursor = 0;
    t = bench_now_s();
    if (lt_load_state(s, state, &cursor, err, sizeof err) || cursor != 7) die("load");
    tl[k] = bench_now_s() - t;
    tr[k] = raw_read(rawp, buf, bytes);
  }
  double ms = bench_median(ts, K), ml = bench_median(tl, K), mw = bench_median(tw, K), mr = bench_median(tr, K);
  printf("%s: state %zu bytes (%zu trainable params, LoRA r16 on all 7 projections)\n", label, bytes,
         lt_session_num_params(s));
  printf("%s: save %.1f ms (%.0f MB/s), raw write+fsync+rename %.1f ms: ratio %.2f\n", label, ms * 1e3,
         (double)bytes / ms / 1e6, mw * 1e3, ms / mw);
  printf("%s: restore %.1f ms (%.0f MB/s), raw read %.1f ms: ratio %.2f\n", label, ml * 1e3, (double)bytes / ml / 1e6,
         mr * 1e3, ml / mr);
  free(buf);

  /* overhead of a checkpoint every step: the executor's own uploader (lt_ckpt) */
  char spool[160], prefix[128];
  snprintf(spool, sizeof spool, "%s/spool", dir);
  mkdir(spool, 0700);
  snprintf(prefix, sizeof prefix, "staging/bench-ckpt/job-%d/1/", (int)getpid());
  lt_ckpt_t *ck_up = NULL;
  if (up) {
    lt_ckpt_conf_t cc = {.store = up->store, .dek = up->dek, .prefix = prefix, .spool_dir = spool};
    if (lt_ckpt_new(&cc, &ck_up, err, sizeof err)) die("uploader");
  }
  double *ratio = calloc((size_t)rounds, sizeof *ratio), plain_sum = 0, ck_sum = 0, ck_parts[3] = {0};
  /* CPU seconds per step, [0] without and [1] with checkpoints: this process, the S3 server */
  double cpu_self[2] = {0}, cpu_server[2] = {0};
  int server = up && strcmp(lt_store_kind(up->store), "s3") == 0 ? bench_find_pid("java", "s3proxy") : 0;
  for (int r = 0; r < rounds; r++) {
    double tp = 0, tc = 0;
    for (int side = 0; side < 2; side++) {
      bool ck = (side == 0) == (r % 2 == 1);
      double t = bench_now_s(), c_self = bench_proc_cpu_s(), c_server = bench_pid_cpu_s(server);
      bool awaiting = false;
      for (int k = 0; k < steps; k++) {
        /* The executor holds the update after a checkpoint until its commit is recorded (a crash
         * loses at most one interval); here, until it is stored, the commit being one produce. */
        STEP_GATED(if (awaiting) {
          double g = bench_now_s();
          if (ck_up && lt_ckpt_flush(ck_up, err, sizeof err)) die("upload");
          ck_parts[2] += bench_now_s() - g;
          awaiting = false;
        });
        if (ck && (k + 1) % every == 0) {
          double a = bench_now_s();
          if (lt_save_state(s, state, (uint64_t)k, err, sizeof err)) die("save");
          double bb = bench_now_s();
          if (lt_export_peft(s, work, "bench", err, sizeof err)) die("export");
          double cc = bench_now_s();
          write_small_files(work);
          if (ck_up && lt_ckpt_submit(ck_up, work, up->seq++ % 4, false, NULL, err, sizeof err)) die("upload");
          awaiting = true;
          ck_parts[0] += bb - a;
          ck_parts[1] += cc - bb;
          ck_parts[2] += bench_now_s() - cc;
        }
      }
      /* The block ends when its last checkpoint is stored: its upload is counted whole. */
      if (ck) {
        double f = bench_now_s();
        if (ck_up && lt_ckpt_flush(ck_up, err, sizeof err)) die("upload");
        ck_parts[2] += bench_now_s() - f;
      }
      t = (bench_now_s() - t) / steps;
      cpu_self[ck] += (bench_proc_cpu_s() - c_self) / steps;
      cpu_server[ck] += (bench_pid_cpu_s(server) - c_server) / steps;
      if (ck) tc = t;
      else tp = t;
    }
    ratio[r] = tc / tp;
    plain_sum += tp;
    ck_sum += tc;
    printf("%s: round %d: step %.3f s, with a checkpoint every %d step(s) %.3f s (+%.1f%%)\n", label, r + 1, tp,
           every, tc, (tc / tp - 1) * 100);
  }
  double n_ck = (double)rounds * steps; /* per step, checkpointed or not */
  lt_ckpt_destroy(ck_up);
  printf("%s: checkpoint parts per step on the training thread: save_state %.1f ms, export_peft %.1f ms, "
         "waiting for the background seal+upload (%s) %.1f ms\n", label,
         ck_parts[0] / n_ck * 1e3, ck_parts[1] / n_ck * 1e3, up ? lt_store_kind(up->store) : "none",
         ck_parts[2] / n_ck * 1e3);
  printf("%s: CPU per step without / with checkpoints: this process %.2f / %.2f s, the S3 server %s %.2f / %.2f s "
         "(a checkpoint costs %.2f + %.2f CPU s)\n",
         label, cpu_self[0] / rounds, cpu_self[1] / rounds, server ? "(s3proxy JVM)" : "(none found)",
         cpu_server[0] / rounds, cpu_server[1] / rounds, (cpu_self[1] - cpu_self[0]) / rounds,
         (cpu_server[1] - cpu_server[0]) / rounds);
  double over = (bench_median(ratio, rounds) - 1) * 100;
  printf("%s: B=%d T=%d, %d threads: checkpoint overhead (median of %d rounds) %.1f%% of the step time "
         "(mean step %.3f s without, %.3f s with)\n",
         label, B, T, threads, rounds, over, plain_sum / rounds, ck_sum / rounds);
  free(ratio);
  free(tok);
  free(tgt);
  bench_engine_close(&be);
  bench_rm_rf(dir);
  return over;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int threads = bench_env_int("LATHE_BENCH_THREADS", 2), layers = bench_env_int("LATHE_BENCH_LAYERS", 30);
  int B = bench_env_int("LATHE_BENCH_B", 1), T = bench_env_int("LATHE_BENCH_T", 256);
  int rounds = bench_env_int("LATHE_BENCH_ROUNDS", 3), steps = bench_env_int("LATHE_BENCH_STEPS", 2);
  int every = bench_env_int("LATHE_BENCH_EVERY", 1); /* checkpoint_interval */
  if (rounds < 1 || rounds > 50 || steps < 1 || B < 1 || T < 2 || every < 1 || every > steps) {
    fprintf(stderr, "bench_ckpt: bad LATHE_BENCH_* settings\n");
    return 2;
  }
  upload_t up = {0}, *upp = &up;
  lt_store_s3_conf_t sc;
  if (lt_store_s3_conf_from_env(&sc, err, sizeof err) == LT_OK) {
    if (lt_store_s3_new(&up.store, &sc, err, sizeof err)) die("s3 store");
  } else {
    char root[] = "/tmp/lt_bench_ckpt_store_XXXXXX";
    if (!mkdtemp(root) || lt_store_dir_new(&up.store, root, err, sizeof err)) die("dir store");
  }
  if (lt_crypto_dek_generate(&up.dek, "bench-ckpt", "k1", err, sizeof err)) die("dek");

  lt_model_config_t tiny;
  lt_train_default_model(&tiny);
  run_shape("tiny", &tiny, threads, B, T > tiny.max_position ? tiny.max_position : T, rounds, steps, every, upp);
  lt_model_config_t smol = {.vocab_size = 49152, .hidden_size = 576, .intermediate_size = 1536, .num_layers = layers,
                            .num_heads = 9, .num_kv_heads = 3, .head_dim = 64, .max_position = 2048,
                            .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                            .tie_embeddings = 1};
  double over = run_shape("smollm", &smol, threads, B, T, rounds, steps, every, upp);
  for (int i = 0; i < 4; i++) {
    for (int k = 0; k < LT_CKPT_NAMES; k++) {
      char key[256];
      snprintf(key, sizeof key, "staging/bench-ckpt/job-%d/1/%d/%s", (int)getpid(), i, lt_ckpt_names[k]);
      lt_store_delete(up.store, key, NULL, 0);
    }
  }
  lt_crypto_dek_destroy(up.dek);
  lt_store_destroy(up.store);
  double la[3] = {0};
  FILE *lf = fopen("/proc/loadavg", "r");
  if (lf) {
    if (fscanf(lf, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
    fclose(lf);
  }
  printf("load average at the end: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
  printf("ckpt_overhead_pct: %.1f\n", over);
  return 0;
}
