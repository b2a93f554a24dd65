/* bench_mem: memory of N concurrent executors on one base model (docs/DESIGN.md §7: base weights
 * mapped once per worker and shared by every executor).
 *
 * A random Llama-shaped model of ~150 MB of f32 weights (vocab 32000, d=512, 6 layers, ffn
 * 1536, tied embeddings), so the shared mapping dominates. For N = 1, 2, 4: N child processes
 * each do what an executor does with the model — lt_engine_open (read-only mmap), a LoRA r16
 * session, one forward+backward+AdamW step of 1 x 128 tokens (every weight page touched) —
 * then wait while the parent reads their PSS (/proc/<pid>/smaps_rollup) and the PSS of their
 * model.safetensors mapping (/proc/<pid>/smaps). Goal: the base is counted once, so the total
 * PSS is about base + N x private, where private is one executor's PSS outside the model.
 *
 * The peer, in the same run: N children that each read the same file into private memory (what
 * executors loading their own copy of the weights would cost), total PSS about N x base.
 *
 * Last line: `mem_pss_vs_ideal_n4: X` = total PSS of 4 executors / (PSS of one + 3 x its private
 * part), both measured in the run (1.0 when the base is counted once; about
 * 1 + 3 x base / (base + 4 x private) if every executor had its own copy). Environment: LATHE_BENCH_THREADS (1 per executor). */
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_engine.h"

static char err[1024];

static void die(const char *what) {
  fprintf(stderr, "bench_mem: %s: %s\n", what, err);
  exit(1);
}

/* kB of `field` summed over the mappings of pid whose path ends with `suffix` (smaps), or over
 * the whole process (suffix NULL: smaps_rollup). */
static long smaps_kb(pid_t pid, const char *field, const char *suffix) {
  char path[64], line[1024];
  snprintf(path, sizeof path, suffix ? "/proc/%d/smaps" : "/proc/%d/smaps_rollup", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long sum = 0;
  size_t fl = strlen(field);
  bool in = suffix == NULL;
  while (fgets(line, sizeof line, f)) {
    size_t l = strlen(line);
    if (l && line[l - 1] == '\n') line[--l] = '\0';
    unsigned long a, b;
    char perms[8];
    if (suffix && sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3) { /* a mapping's header line */
      size_t sl = strlen(suffix);
      in = l >= sl && strcmp(line + l - sl, suffix) == 0;
      continue;
    }
    if (in && strncmp(line, field, fl) == 0 && line[fl] == ':') sum += strtol(line + fl + 1, NULL, 10);
  }
  fclose(f);
  return sum;
}

/* An executor's use of the base model; writes one byte to `ready` and waits to be killed. */
static void child_engine(const char *model, int threads, int ready) {
  bench_engine_t be;
  if (bench_engine_open(&be, model, threads, err, sizeof err)) die("engine");
  lt_session_t *s = be.s;
  const lt_model_config_t *c = lt_engine_config(be.eng);
  enum { B = 1, T = 128 };
  int32_t tok[B * T], tgt[B * T];
  for (int i = 0; i < B * T; i++) {
    tok[i] = (int32_t)((i * 7919) % c->vocab_size);
    tgt[i] = (int32_t)((i * 104729 + 1) % c->vocab_size);
  }
  lt_batch_t b = {.B = B, .T = T, .tokens = tok, .targets = tgt};
  lt_adamw_t opt = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
  float loss;
  if (lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, &loss, NULL, err, sizeof err) ||
      lt_optim_step(s, &opt, NULL, err, sizeof err))
    die("step");
  if (write(ready, "r", 1) != 1) _exit(1);
  for (;;) pause();
}

/* The peer: a private copy of the weights file. */
static void child_copy(const char *file, int ready) {
  struct stat st;
  int fd = open(file, O_RDONLY);
  if (fd < 0 || fstat(fd, &st) != 0) _exit(1);
  char *buf = malloc((size_t)st.st_size);
  if (!buf) _exit(1);
  size_t off = 0;
  ssize_t r;
  while (off < (size_t)st.st_size && (r = read(fd, buf + off, (size_t)st.st_size - off)) > 0) off += (size_t)r;
  close(fd);
  if (write(ready, "r", 1) != 1) _exit(1);
  for (;;) pause();
}

typedef struct {
  long pss, model_pss, model_rss;
} usage_t;

/* Starts n children of one kind, measures them once all are ready, stops them. */
static usage_t measure(int n, bool copy, const char *model, const char *file, int threads, long *priv_mean) {
  int p[2];
  if (pipe(p) != 0) die("pipe");
  pid_t pids[8];
  for (int i = 0; i < n; i++) {
    pids[i] = fork();
    if (pids[i] < 0) die("fork");
    if (pids[i] == 0) {
      close(p[0]);
      if (copy) child_copy(file, p[1]);
      else child_engine(model, threads, p[1]);
      _exit(0);
    }
  }
  close(p[1]);
  for (int i = 0; i < n; i++) {
    char c;
    if (read(p[0], &c, 1) != 1) {
      snprintf(err, sizeof err, "a child died before it was ready");
      die("child");
    }
  }
  close(p[0]);
  usage_t u = {0};
  long priv = 0;
  for (int i = 0; i < n; i++) {
    long pss = smaps_kb(pids[i], "Pss", NULL), mp = copy ? 0 : smaps_kb(pids[i], "Pss", "model.safetensors");
    long mr = copy ? 0 : smaps_kb(pids[i], "Rss", "model.safetensors");
    u.pss += pss;
    u.model_pss += mp;
    if (mr > u.model_rss) u.model_rss = mr;
    priv += pss - mp;
  }
  for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
  for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
  if (priv_mean) *priv_mean = priv / n;
  return u;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *th = getenv("LATHE_BENCH_THREADS");
  int threads = th ? atoi(th) : 1;
  lt_model_config_t c = {.vocab_size = 32000, .hidden_size = 512, .intermediate_size = 1536, .num_layers = 6,
                         .num_heads = 8, .num_kv_heads = 8, .head_dim = 64, .max_position = 512,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  char dir[] = "/tmp/lt_bench_mem_XXXXXX";
  if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
  char model[64], file[96];
  snprintf(model, sizeof model, "%s/model", dir);
  snprintf(file, sizeof file, "%s/model.safetensors", model);
  if (lt_model_init_random(&c, model, 1, 0.02f, 0.0f, err, sizeof err)) die("model");
  struct stat st;
  if (stat(file, &st) != 0) die("stat");
  double base_mb = (double)st.st_size / 1e6;
  printf("base model: %.1f MB of f32 weights (%s)\n", base_mb, file);
  double ratio4 = 0;
  long private1 = 0, pss1 = 0;
  const int ns[3] = {1, 2, 4};
  for (int k = 0; k < 3; k++) {
    int n = ns[k];
    long priv = 0;
    usage_t e = measure(n, false, model, file, threads, &priv);
    usage_t cp = measure(n, true, model, file, threads, NULL);
    if (n == 1) {
      private1 = priv;
      pss1 = e.pss;
    }
    double base_kb = (double)e.model_rss; /* the model's resident pages, counted once */
    /* from N = 1 alone: its PSS (base + private) plus one more private part per executor */
    double ideal = (double)pss1 + (double)(n - 1) * (double)private1;
    double copies = base_kb > 0 ? (double)e.model_pss / base_kb : 0;
    printf("N=%d executors: total PSS %.1f MB = model mapping %.1f MB (resident %.1f MB, counted %.2f times) + "
           "private %.1f MB each; ideal (PSS of N=1) + (N-1) x private(N=1) %.1f MB: ratio %.3f | peer, %d private copies of the "
           "weights: total PSS %.1f MB (%.2f x the shared executors)\n",
           n, (double)e.pss / 1e3, (double)e.model_pss / 1e3, base_kb / 1e3, copies, (double)priv / 1e3, ideal / 1e3,
           (double)e.pss / ideal, n, (double)cp.pss / 1e3, (double)cp.pss / (double)e.pss);
    if (n == 4) ratio4 = (double)e.pss / ideal;
  }
  printf("private memory of one executor (PSS outside the model mapping): %.1f MB\n", (double)private1 / 1e3);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  printf("mem_pss_vs_ideal_n4: %.3f\n", ratio4);
  return 0;
}
