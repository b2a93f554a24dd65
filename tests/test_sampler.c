/* Tests of the sampler backend (workers/lt_sampler.h) through its table of functions
 * (src/lib/lt_sampling.h), on a tiny random model (D=64, L=2) with a tokenizer trained on the
 * task corpus and three PEFT adapters: outputs independent of how requests were batched,
 * preemption and recompute on a short KV pool, weighted fair share, cancel, deadlines, queue
 * bounds, bad input, the adapter cache's LRU eviction, and stop strings.
 *
 * The model directory is made once per test run (under /tmp, named after the runner's pid) and
 * removed when the run ends. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_engine.h"
#include "lt_sampler.h"
#include "lt_task.h"
#include "lt_test.h"
#include "lt_time.h"
#include "lt_tok.h"
#include "lt_utf8.h"

static char errbuf[512];

#define OK(call)                                                                               \
  do {                                                                                         \
    errbuf[0] = 0;                                                                             \
    lt_err_t e_ = (call);                                                                      \
    cr_assert_eq(e_, LT_OK, "%s failed: %s (%s)", #call, errbuf, lt_err_name(e_));            \
  } while (0)

enum { NAD = 3, MAXT = 128 };
#define BASE "tiny"

/* ---------------------------------------------------------------- the model directory */

/* A whole file: it must be there. */
static char *slurp(const char *path, size_t *len) {
  char *b = lt_test_slurp(path, len);
  cr_assert_not_null(b, "%s", path);
  return b;
}

static void spit(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f, "%s", path);
  cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
  fclose(f);
}

/* A few AdamW steps on random tokens, so that B != 0 and the adapter changes the outputs. */
static void train(lt_session_t *s, int V, unsigned seed) {
  int32_t tok[2 * 16], tgt[2 * 16];
  lt_adamw_t opt = {.lr = 0.05f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  for (int step = 0; step < 4; step++) {
    for (int i = 0; i < 32; i++) tok[i] = (int32_t)(rand_r(&seed) % (unsigned)V);
    for (int i = 0; i < 32; i++) tgt[i] = (int32_t)(rand_r(&seed) % (unsigned)V);
    lt_batch_t b = {.B = 2, .T = 16, .tokens = tok, .targets = tgt};
    OK(lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, errbuf, sizeof errbuf));
    OK(lt_optim_step(s, &opt, NULL, errbuf, sizeof errbuf));
  }
}

/* Builds root/models/tiny/{tokenizer.json, config.json, model.safetensors} and root/adN/ (PEFT
 * files of rank 4 on every module, B trained away from 0). */
static void build(const char *root) {
  char path[600], *corpus, *json;
  size_t len;
  snprintf(path, sizeof path, "%s/models", root);
  cr_assert_eq(mkdir(path, 0700), 0);
  snprintf(path, sizeof path, "%s/models/" BASE, root);
  cr_assert_eq(mkdir(path, 0700), 0);
  OK(lt_task_corpus(7, 256u << 10, &corpus, &len, errbuf, sizeof errbuf));
  OK(lt_tok_train(corpus, len, 512, lt_task_specials, LT_TASK_N_SPECIAL, &json, errbuf, sizeof errbuf));
  free(corpus);
  lt_tok_t *tok;
  OK(lt_tok_load_json(json, strlen(json), &tok, errbuf, sizeof errbuf));
  int V = lt_tok_vocab_size(tok);
  lt_tok_destroy(tok);
  snprintf(path, sizeof path, "%s/models/" BASE "/tokenizer.json", root);
  spit(path, json);
  free(json);
  lt_model_config_t c = {.vocab_size = V, .hidden_size = 64, .intermediate_size = 96, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .max_position = 128,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f};
  snprintf(path, sizeof path, "%s/models/" BASE, root);
  OK(lt_model_init_random(&c, path, 7, 0.2f, 0.1f, errbuf, sizeof errbuf));
  lt_backend_t *be;
  lt_engine_t *eng;
  OK(lt_backend_cpu_new(1, &be, errbuf, sizeof errbuf));
  OK(lt_engine_open(path, be, &eng, errbuf, sizeof errbuf));
  for (int i = 0; i < NAD; i++) {
    lt_session_config_t sc = {.rank = 4, .alpha = 8, .targets = LT_TARGET_ALL, .seed = 100 + (uint64_t)i};
    lt_session_t *s;
    OK(lt_session_new(eng, &sc, &s, errbuf, sizeof errbuf));
    train(s, V, 11 + (unsigned)i);
    snprintf(path, sizeof path, "%s/ad%d", root, i);
    OK(lt_export_peft(s, path, BASE, errbuf, sizeof errbuf));
    lt_session_destroy(s);
  }
  lt_engine_close(eng);
  lt_backend_destroy(be);
}

/* The run's model directory: made by the first test that needs it (built aside, then renamed
 * into place, so tests running at once agree on one copy). */
static char g_root[256];
static const char *root_dir(void) {
  if (g_root[0]) return g_root;
  snprintf(g_root, sizeof g_root, "/tmp/lt_sampler_test_%d", (int)getppid());
  struct stat st;
  if (stat(g_root, &st) == 0) return g_root;
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.XXXXXX", g_root);
  cr_assert_not_null(mkdtemp(tmp));
  build(tmp);
  if (rename(tmp, g_root) != 0) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
  }
  return g_root;
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  (void)stats;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/lt_sampler_test_%d /tmp/lt_sampler_test_%d.*", (int)getpid(),
           (int)getpid());
  if (system(cmd) != 0) fprintf(stderr, "test_sampler: could not remove the model directory\n");
}

/* ---------------------------------------------------------------- a sampler and its events */

typedef struct tsampler {
  lt_sampler_t *s;
  lt_sample_ops_t ops;
} tsampler_t;

static void ts_open(tsampler_t *t, lt_sampler_conf_t conf) {
  char models[300];
  snprintf(models, sizeof models, "%s/models", root_dir());
  if (!conf.models_dir) conf.models_dir = models;
  conf.threads = 1;
  OK(lt_sampler_new(&conf, &t->s, errbuf, sizeof errbuf));
  lt_sampler_ops(t->s, &t->ops);
}

static void ts_close(tsampler_t *t) { lt_sampler_destroy(t->s); }

/* Loads adapter i (its PEFT files) as "OWNER/adi" (owner NULL: "ti", a tenant of its own). */
/* Test adapter i loaded under the cache id `id`. */
static lt_err_t ts_load_id(tsampler_t *t, int i, const char *id) {
  char path[400];
  size_t st_len, cfg_len;
  snprintf(path, sizeof path, "%s/ad%d/adapter_model.safetensors", root_dir(), i);
  char *st = slurp(path, &st_len);
  snprintf(path, sizeof path, "%s/ad%d/adapter_config.json", root_dir(), i);
  char *cfg = slurp(path, &cfg_len);
  lt_err_t err = t->ops.load_adapter(t->ops.ctx, id, BASE, st, st_len, cfg, cfg_len, errbuf, sizeof errbuf);
  free(st);
  free(cfg);
  return err;
}

static lt_err_t ts_load_as(tsampler_t *t, int i, const char *owner) {
  char id[64];
  if (owner) snprintf(id, sizeof id, "%s/ad%d", owner, i);
  else snprintf(id, sizeof id, "t%d/ad%d", i, i);
  return ts_load_id(t, i, id);
}

static lt_err_t ts_load(tsampler_t *t, int i) { return ts_load_as(t, i, NULL); }

/* A counter of the metrics text ("lathe_sampler_NAME VALUE"). */
static long long metric(tsampler_t *t, const char *name) {
  char *text = t->ops.metrics(t->ops.ctx), key[128];
  cr_assert_not_null(text);
  snprintf(key, sizeof key, "\nlathe_sampler_%s ", name); /* a sample line, not its HELP */
  char *at = strstr(text, key);
  cr_assert_not_null(at, "metric %s missing from:\n%s", name, text);
  long long v = strtoll(at + strlen(key), NULL, 10);
  free(text);
  return v;
}

/* Waits until the sampler is idle with every cache block free; false after 20 s. */
static bool idle_and_free(tsampler_t *t) {
  for (int i = 0; i < 2000; i++) {
    if (metric(t, "running") == 0 && metric(t, "queued") == 0 &&
        metric(t, "kv_blocks_free") == metric(t, "kv_blocks_capacity"))
      return true;
    usleep(10000);
  }
  return false;
}

/* The completion order across requests (fairness). */
static pthread_mutex_t g_order_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_order[64], g_norder;

/* What one request's events said. */
typedef struct rec {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int id;
  int32_t tok[MAXT];
  float logp[MAXT];
  int n, events;
  char text[4096];
  size_t text_len;
  bool deltas_valid; /* every delta was valid UTF-8 */
  bool done;
  char finish[16];
  lt_err_t err;
  bool cancel_returned; /* set right after cancel returned */
  int after_cancel;     /* events that came after that */
  int slow_us;          /* each event takes this long (keeps a request in the batch a while) */
} rec_t;

static void rec_init(rec_t *r, int id) {
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  pthread_cond_init(&r->cv, NULL);
  r->id = id;
  r->deltas_valid = true;
}

static void on_event(void *ctx, const lt_sample_event_t *ev) {
  rec_t *r = ctx;
  if (r->slow_us) usleep((useconds_t)r->slow_us);
  pthread_mutex_lock(&r->mu);
  r->events++;
  if (r->cancel_returned) r->after_cancel++;
  if (ev->kind == LT_SAMPLE_TOKEN) {
    if (r->n < MAXT) r->tok[r->n] = ev->token, r->logp[r->n] = ev->logp;
    r->n++;
    size_t len;
    char *clean = lt_utf8_sanitize(ev->text, ev->text_len, &len);
    if (!clean || len != ev->text_len || memcmp(clean, ev->text, len) != 0) r->deltas_valid = false;
    free(clean);
    if (r->text_len + ev->text_len < sizeof r->text) {
      memcpy(r->text + r->text_len, ev->text, ev->text_len);
      r->text_len += ev->text_len;
    }
  } else {
    r->done = true;
    snprintf(r->finish, sizeof r->finish, "%s", ev->finish ? ev->finish : "");
    r->err = ev->err;
    pthread_mutex_lock(&g_order_mu);
    if (g_norder < 64) g_order[g_norder++] = r->id;
    pthread_mutex_unlock(&g_order_mu);
  }
  pthread_cond_broadcast(&r->cv);
  pthread_mutex_unlock(&r->mu);
}

/* Waits until r has at least `tokens` tokens (or is done when tokens < 0); false after 30 s. */
static bool rec_wait(rec_t *r, int tokens) {
  int64_t end = lt_time_mono_ms() + 30000;
  pthread_mutex_lock(&r->mu);
  while (tokens < 0 ? !r->done : r->n < tokens && !r->done) {
    if (lt_time_mono_ms() > end) break;
    pthread_mutex_unlock(&r->mu);
    usleep(2000);
    pthread_mutex_lock(&r->mu);
  }
  bool ok = tokens < 0 ? r->done : r->n >= tokens;
  pthread_mutex_unlock(&r->mu);
  return ok;
}

static lt_sample_req_t req_of(rec_t *r, const char *tenant, const char *adapter, const char *prompt, int max_tokens,
                              float temperature, uint64_t seed) {
  return (lt_sample_req_t){.tenant = tenant, .weight = 1, .base = BASE, .adapter = adapter, .prompt = prompt,
                           .max_tokens = max_tokens, .temperature = temperature, .top_p = 1, .seed = seed,
                           .on_event = on_event, .ctx = r};
}

static uint64_t submit_ok(tsampler_t *t, const lt_sample_req_t *q) {
  uint64_t h = 0;
  OK(t->ops.submit(t->ops.ctx, q, &h, errbuf, sizeof errbuf));
  return h;
}

static const char *const k_prompts[] = {
    "Once upon a time there was a little fox who",
    "The market opened early and the farmer sold",
    "Question: what is two plus three? Answer:",
};
static const char *const k_adapters[] = {"", "t0/ad0", "t1/ad1", "t2/ad2"};

/* ---------------------------------------------------------------- tests */

/* 12 seeded requests over 3 adapters and the base model: one at a time and all at once give the
 * same tokens and logprobs, and the adapters do change the output. */
Test(sampler, outputs_do_not_depend_on_batching, .timeout = 120) {
  enum { N = 12 };
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){0});
  for (int i = 0; i < NAD; i++) OK(ts_load(&t, i));
  static rec_t one[N], all[N];
  for (int i = 0; i < N; i++) {
    rec_init(&one[i], i);
    lt_sample_req_t q = req_of(&one[i], "t", k_adapters[i % 4], k_prompts[i / 4], 24, 0.9f, 1000 + (uint64_t)(i / 4));
    submit_ok(&t, &q);
    cr_assert(rec_wait(&one[i], -1));
  }
  for (int i = 0; i < N; i++) {
    rec_init(&all[i], i);
    lt_sample_req_t q = req_of(&all[i], "t", k_adapters[i % 4], k_prompts[i / 4], 24, 0.9f, 1000 + (uint64_t)(i / 4));
    submit_ok(&t, &q);
  }
  for (int i = 0; i < N; i++) {
    cr_assert(rec_wait(&all[i], -1), "request %d did not finish", i);
    cr_assert_eq(all[i].err, LT_OK);
    cr_assert_eq(one[i].n, all[i].n, "request %d: %d tokens alone, %d batched", i, one[i].n, all[i].n);
    cr_assert(one[i].n > 0);
    cr_assert_eq(memcmp(one[i].tok, all[i].tok, (size_t)one[i].n * sizeof(int32_t)), 0, "request %d: tokens", i);
    cr_assert_eq(memcmp(one[i].logp, all[i].logp, (size_t)one[i].n * sizeof(float)), 0, "request %d: logprobs", i);
  }
  /* Same prompt and seed: the base model and the three adapters do not all agree. */
  for (int p = 0; p < 3; p++) {
    int differ = 0;
    for (int a = 1; a < 4; a++)
      differ += one[4 * p + a].n != one[4 * p].n ||
                memcmp(one[4 * p + a].tok, one[4 * p].tok, (size_t)one[4 * p].n * sizeof(int32_t)) != 0;
    cr_assert(differ > 0, "prompt %d: the adapters change nothing", p);
  }
  cr_assert(metric(&t, "rows_total") > metric(&t, "steps_total"), "nothing was ever batched");
  ts_close(&t);
}

/* Runs 8 long requests at once on a sampler with kv_bytes of KV cache (block_tokens 4); fills
 * out[8]. */
static void run_long(tsampler_t *t, rec_t *out, long long *preempted) {
  static const char *const adapters[] = {"", "t0/ad0", "t1/ad1", "t2/ad2"};
  char prompts[8][200];
  for (int i = 0; i < 8; i++) {
    snprintf(prompts[i], sizeof prompts[i], "Story %d. %s and then the %s", i, k_prompts[i % 3],
             k_prompts[(i + 1) % 3]);
    rec_init(&out[i], i);
    lt_sample_req_t q = req_of(&out[i], "t", adapters[i % 4], prompts[i], 40, 0.9f, 77 + (uint64_t)i);
    submit_ok(t, &q);
  }
  for (int i = 0; i < 8; i++) {
    cr_assert(rec_wait(&out[i], -1), "request %d did not finish", i);
    cr_assert_eq(out[i].err, LT_OK, "request %d: %s", i, out[i].finish);
  }
  *preempted = metric(t, "preempted_total");
  cr_assert(idle_and_free(t), "blocks still held after every request ended");
}

/* A KV pool for about 2-3 of 8 concurrent long requests: every one finishes, some are preempted
 * and recomputed, and the outputs equal those of a sampler with a large pool. */
Test(sampler, preempted_requests_recompute_the_same_tokens, .timeout = 180) {
  static rec_t small[8], chunked[8], large[8];
  long long pre_small, pre_chunked, pre_large;
  tsampler_t t;
  /* A block: 2 (K, V) x 2 layers x 4 positions x 2 kv heads x 16 dims x 4 bytes = 2 KiB. A
   * request holds up to ~70 positions (18 blocks): 40 blocks hold two and a bit. */
  ts_open(&t, (lt_sampler_conf_t){.kv_bytes = 40 * 2048, .block_tokens = 4});
  cr_assert_eq(metric(&t, "kv_blocks_capacity"), 40);
  for (int i = 0; i < NAD; i++) OK(ts_load(&t, i));
  run_long(&t, small, &pre_small);
  ts_close(&t);
  /* The same with prompts fed 5 rows a step: preempted mid-prefill as well. */
  ts_open(&t, (lt_sampler_conf_t){.kv_bytes = 40 * 2048, .block_tokens = 4, .prefill_chunk = 5});
  for (int i = 0; i < NAD; i++) OK(ts_load(&t, i));
  run_long(&t, chunked, &pre_chunked);
  ts_close(&t);
  ts_open(&t, (lt_sampler_conf_t){.block_tokens = 4});
  for (int i = 0; i < NAD; i++) OK(ts_load(&t, i));
  run_long(&t, large, &pre_large);
  ts_close(&t);
  cr_log_info("preempted: %lld, %lld with prefill chunks of 5", pre_small, pre_chunked);
  cr_assert(pre_small > 0 && pre_chunked > 0, "the small pool never preempted");
  cr_assert_eq(pre_large, 0);
  for (int i = 0; i < 8; i++) {
    cr_assert_eq(small[i].n, large[i].n, "request %d: %d tokens vs %d", i, small[i].n, large[i].n);
    cr_assert_eq(memcmp(small[i].tok, large[i].tok, (size_t)small[i].n * sizeof(int32_t)), 0, "request %d", i);
    cr_assert_eq(memcmp(small[i].logp, large[i].logp, (size_t)small[i].n * sizeof(float)), 0, "request %d", i);
    cr_assert_eq(strcmp(small[i].finish, large[i].finish), 0);
    cr_assert_eq(chunked[i].n, large[i].n, "request %d: %d tokens vs %d", i, chunked[i].n, large[i].n);
    cr_assert_eq(memcmp(chunked[i].tok, large[i].tok, (size_t)large[i].n * sizeof(int32_t)), 0, "request %d", i);
    cr_assert_eq(memcmp(chunked[i].logp, large[i].logp, (size_t)large[i].n * sizeof(float)), 0, "request %d", i);
    cr_assert_eq(small[i].text_len, large[i].text_len);
    cr_assert_eq(memcmp(small[i].text, large[i].text, large[i].text_len), 0, "request %d: text", i);
  }
}

/* One request runs at a time: tenant A (weight 2) completes about twice as many as tenant B
 * (weight 1) early on, and a tenant that arrives late is served soon, not after the backlog.
 * Every request is the same work (one prompt, 8 tokens), so completions count shares. */
Test(sampler, tenants_share_the_batch_by_weight, .timeout = 120) {
  enum { PER = 12 };
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .queue_per_tenant = 64, .queue_total = 128});
  static rec_t r[2 * PER + 2];
  g_norder = 0;
  for (int i = 0; i < 2 * PER; i++) {
    rec_init(&r[i], i);
    bool a = i < PER;
    r[i].slow_us = 1000; /* 8 ms a request: the newcomer arrives while the backlog is long */
    lt_sample_req_t q = req_of(&r[i], a ? "A" : "B", "", k_prompts[0], 8, 0, 1);
    q.weight = a ? 2 : 1;
    submit_ok(&t, &q);
  }
  cr_assert(rec_wait(&r[0], -1));
  pthread_mutex_lock(&g_order_mu);
  int arrived = g_norder; /* completions before the newcomer came */
  pthread_mutex_unlock(&g_order_mu);
  for (int i = 2 * PER; i < 2 * PER + 2; i++) {
    rec_init(&r[i], i);
    lt_sample_req_t q = req_of(&r[i], "C", "", k_prompts[0], 8, 0, 1);
    submit_ok(&t, &q);
  }
  for (int i = 0; i < 2 * PER + 2; i++) cr_assert(rec_wait(&r[i], -1), "request %d did not finish", i);
  pthread_mutex_lock(&g_order_mu);
  int na = 0, nb = 0, last_c = -1;
  for (int k = 0; k < g_norder; k++) {
    if (k < 9 && g_order[k] < PER) na++;
    else if (k < 9 && g_order[k] < 2 * PER) nb++;
    if (g_order[k] >= 2 * PER) last_c = k;
  }
  cr_assert_eq(g_norder, 2 * PER + 2);
  char seen[64] = "";
  for (int k = 0; k < g_norder; k++) seen[k] = g_order[k] < PER ? 'A' : g_order[k] < 2 * PER ? 'B' : 'C';
  pthread_mutex_unlock(&g_order_mu);
  cr_log_info("completion order: %s", seen);
  cr_assert(na >= 5 && nb >= 2, "first 9 completions: A %d, B %d (%s)", na, nb, seen);
  cr_assert(last_c >= 0 && last_c - arrived < 8, "the newcomer came after %d completions; its last request "
            "finished %dth of %d (%s)", arrived, last_c + 1, 2 * PER + 2, seen);
  ts_close(&t);
}

/* A tenant that comes back after others were served a while starts level with them: it does not
 * get the decode it did not use while away (its requests interleave with the backlog). */
Test(sampler, returning_tenant_brings_no_saved_credit, .timeout = 120) {
  enum { PER = 12 };
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .queue_per_tenant = 64, .queue_total = 128});
  static rec_t r[2 * PER + 5];
  rec_init(&r[2 * PER], 2 * PER);
  lt_sample_req_t q = req_of(&r[2 * PER], "C", "", k_prompts[0], 8, 0, 1);
  submit_ok(&t, &q); /* C alone, then gone */
  cr_assert(rec_wait(&r[2 * PER], -1));
  g_norder = 0;
  for (int i = 0; i < 2 * PER; i++) {
    rec_init(&r[i], i);
    r[i].slow_us = 1000;
    q = req_of(&r[i], i < PER ? "A" : "B", "", k_prompts[i % 3], 8, 0, 1);
    q.weight = i < PER ? 2 : 1;
    submit_ok(&t, &q);
  }
  for (int k = 0; k < 3000; k++) {
    pthread_mutex_lock(&g_order_mu);
    int done = g_norder;
    pthread_mutex_unlock(&g_order_mu);
    if (done >= 14) break;
    usleep(1000);
  }
  pthread_mutex_lock(&g_order_mu);
  int arrived = g_norder;
  pthread_mutex_unlock(&g_order_mu);
  for (int i = 2 * PER + 1; i < 2 * PER + 5; i++) {
    rec_init(&r[i], i);
    r[i].slow_us = 1000;
    q = req_of(&r[i], "C", "", k_prompts[1], 8, 0, 1);
    submit_ok(&t, &q);
  }
  for (int i = 0; i < 2 * PER + 5; i++) cr_assert(rec_wait(&r[i], -1), "request %d did not finish", i);
  char seen[64] = "";
  int nc = 0;
  pthread_mutex_lock(&g_order_mu);
  for (int k = 0; k < g_norder; k++) seen[k] = g_order[k] < PER ? 'A' : g_order[k] < 2 * PER ? 'B' : 'C';
  for (int k = arrived + 1; k < arrived + 5 && k < g_norder; k++) nc += g_order[k] >= 2 * PER;
  pthread_mutex_unlock(&g_order_mu);
  cr_log_info("completion order: %s (C back after %d)", seen, arrived);
  cr_assert(nc <= 2, "C came back after %d completions and took %d of the next 4 (%s)", arrived, nc, seen);
  ts_close(&t);
}

static void long_prompt(int tokens, char *out, size_t n);

/* A prompt's rows count on its tenant's clock as decoded tokens do: a tenant sending long prompts
 * for one token each is admitted no more often than their rows allow. Before, the clock counted
 * decode alone and such a tenant took nearly every slot (8 of the first 9 completions here). */
Test(sampler, long_prompts_are_charged_as_decode_is, .timeout = 120) {
  enum { PER = 8 };
  static char lp[4096];
  long_prompt(100, lp, sizeof lp); /* ~100 rows a request of A, ~11 of B (a few prompt, 8 decode) */
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .queue_per_tenant = 64, .queue_total = 128});
  static rec_t r[2 * PER];
  g_norder = 0;
  for (int i = 0; i < 2 * PER; i++) { /* A, B, A, B, ...: the first comes in alone */
    rec_init(&r[i], i);
    bool a = i % 2 == 0;
    r[i].slow_us = 1000;
    lt_sample_req_t q = req_of(&r[i], a ? "A" : "B", "", a ? lp : "the fox ran", a ? 1 : 8, 0, 1);
    submit_ok(&t, &q);
  }
  for (int i = 0; i < 2 * PER; i++) cr_assert(rec_wait(&r[i], -1), "request %d did not finish", i);
  char seen[64] = "";
  int na = 0;
  pthread_mutex_lock(&g_order_mu);
  cr_assert_eq(g_norder, 2 * PER);
  for (int k = 0; k < g_norder; k++) seen[k] = g_order[k] % 2 == 0 ? 'A' : 'B';
  for (int k = 0; k < 9; k++) na += g_order[k] % 2 == 0;
  pthread_mutex_unlock(&g_order_mu);
  cr_log_info("completion order: %s", seen);
  for (int i = 0; i < 2 * PER; i++)
    cr_assert_eq(r[i].n, i % 2 == 0 ? 1 : 8, "request %d: %d tokens (%s)", i, r[i].n, r[i].finish);
  cr_assert(na <= 3, "long prompts took %d of the first 9 completions (%s)", na, seen);
  ts_close(&t);
}

/* Cancel: a running request gets no event after cancel returns and its blocks come back; a
 * queued one gets no event at all. */
Test(sampler, cancel_stops_events_and_frees_blocks, .timeout = 120) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .block_tokens = 4});
  static rec_t run, queued;
  rec_init(&run, 0);
  rec_init(&queued, 1);
  run.slow_us = queued.slow_us = 5000;
  lt_sample_req_t q = req_of(&run, "t", "", k_prompts[0], 100, 0.9f, 5);
  uint64_t h = submit_ok(&t, &q);
  q = req_of(&queued, "t", "", k_prompts[1], 100, 0.9f, 6);
  uint64_t hq = submit_ok(&t, &q);
  cr_assert(rec_wait(&run, 3));
  int pt = -1, ct = -1; /* what it read and generated: its usage, which no DONE reports */
  t.ops.cancel(t.ops.ctx, h, &pt, &ct);
  pthread_mutex_lock(&run.mu);
  run.cancel_returned = true;
  int got = run.n;
  pthread_mutex_unlock(&run.mu);
  cr_expect(pt > 0 && ct >= 3 && ct >= got, "cancelled after %d tokens: %d prompt, %d generated", got, pt, ct);
  /* The queued one is admitted once the first leaves: cancel it before or after, no matter. */
  t.ops.cancel(t.ops.ctx, hq, NULL, NULL);
  pthread_mutex_lock(&queued.mu);
  queued.cancel_returned = true;
  pthread_mutex_unlock(&queued.mu);
  cr_assert(idle_and_free(&t), "blocks still held after cancel");
  usleep(100000);
  cr_assert_eq(run.after_cancel, 0, "%d events after cancel returned", run.after_cancel);
  cr_assert(!run.done, "a cancelled request got DONE after cancel");
  cr_assert(run.n < 100);
  cr_assert_eq(queued.after_cancel, 0);
  cr_assert_eq(metric(&t, "cancelled_total"), 2);
  ts_close(&t);

  /* Strictly queued: behind a running request with max_running 1, cancelled before admission. */
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .block_tokens = 4});
  rec_init(&run, 0);
  rec_init(&queued, 1);
  run.slow_us = 5000;
  q = req_of(&run, "t", "", k_prompts[0], 100, 0.9f, 5);
  h = submit_ok(&t, &q);
  cr_assert(rec_wait(&run, 1));
  q = req_of(&queued, "t", "", k_prompts[1], 100, 0.9f, 6);
  hq = submit_ok(&t, &q);
  t.ops.cancel(t.ops.ctx, hq, NULL, NULL);
  cr_assert_eq(metric(&t, "queued"), 0, "the cancelled request is still queued");
  t.ops.cancel(t.ops.ctx, h, NULL, NULL);
  cr_assert(idle_and_free(&t));
  usleep(50000);
  cr_assert_eq(queued.events, 0, "a request cancelled while queued got %d events", queued.events);
  cr_assert(!run.done);
  cr_assert_eq(metric(&t, "cancelled_total"), 2);
  ts_close(&t);
}

/* A deadline already past: DONE "timeout" with LT_ERR_TIMEOUT, and nothing generated. */
Test(sampler, past_deadline_ends_with_timeout, .timeout = 60) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){0});
  static rec_t r;
  rec_init(&r, 0);
  lt_sample_req_t q = req_of(&r, "t", "", k_prompts[0], 50, 0, 1);
  q.deadline_ms = lt_time_mono_ms() - 1;
  submit_ok(&t, &q);
  cr_assert(rec_wait(&r, -1));
  cr_assert_str_eq(r.finish, "timeout");
  cr_assert_eq(r.err, LT_ERR_TIMEOUT);
  cr_assert_eq(r.n, 0);
  cr_assert_eq(metric(&t, "timeouts_total"), 1);
  cr_assert(idle_and_free(&t));
  /* A deadline reached mid-stream (10 ms an event, 200 ms to go): DONE "timeout" after some tokens,
   * and the blocks come back. */
  static rec_t mid;
  rec_init(&mid, 1);
  mid.slow_us = 10000;
  q = req_of(&mid, "t", "", k_prompts[0], 100, 0.9f, 1);
  q.deadline_ms = lt_time_mono_ms() + 200;
  submit_ok(&t, &q);
  cr_assert(rec_wait(&mid, -1));
  cr_assert_str_eq(mid.finish, "timeout");
  cr_assert_eq(mid.err, LT_ERR_TIMEOUT);
  cr_assert(mid.n > 0 && mid.n < 100, "%d tokens", mid.n);
  cr_assert_eq(metric(&t, "timeouts_total"), 2);
  cr_assert(idle_and_free(&t));
  ts_close(&t);
}

/* queue_per_tenant and queue_total: LT_ERR_QUOTA past each, other tenants unaffected by one's. */
Test(sampler, queue_bounds_answer_quota, .timeout = 60) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.max_running = 1, .queue_per_tenant = 2, .queue_total = 3});
  static rec_t r[5];
  uint64_t h[5] = {0};
  for (int i = 0; i < 5; i++) rec_init(&r[i], i), r[i].slow_us = 5000;
  lt_sample_req_t q = req_of(&r[0], "A", "", k_prompts[0], 100, 0.9f, 1);
  h[0] = submit_ok(&t, &q);
  q.ctx = &r[1];
  h[1] = submit_ok(&t, &q);
  q.ctx = &r[2];
  char msg[256] = "";
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h[2], msg, sizeof msg), LT_ERR_QUOTA);
  cr_assert(strstr(msg, "tenant") != NULL, "%s", msg);
  q.tenant = "B";
  h[2] = submit_ok(&t, &q);
  q.ctx = &r[3];
  q.tenant = "C";
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h[3], msg, sizeof msg), LT_ERR_QUOTA);
  cr_assert(strstr(msg, "full") != NULL, "%s", msg);
  cr_assert_eq(metric(&t, "rejected_total"), 2);
  for (int i = 0; i < 3; i++) t.ops.cancel(t.ops.ctx, h[i], NULL, NULL);
  cr_assert(idle_and_free(&t));
  h[3] = submit_ok(&t, &q); /* room again */
  cr_assert(rec_wait(&r[3], 1));
  t.ops.cancel(t.ops.ctx, h[3], NULL, NULL);
  ts_close(&t);
}

/* Bad requests are refused at submit with the right error and a message naming the problem;
 * garbage adapter bytes leave the cache as it was. */
Test(sampler, bad_input_is_refused_at_submit, .timeout = 60) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){0});
  OK(ts_load(&t, 0));
  static rec_t r;
  rec_init(&r, 0);
  uint64_t h;
  char msg[256];
  lt_sample_req_t q = req_of(&r, "t", "", k_prompts[0], 8, 0, 1);
  q.base = "nope";
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, msg, sizeof msg), LT_ERR_NOT_FOUND);
  cr_assert(strstr(msg, "nope") != NULL, "%s", msg);
  q.base = BASE;
  q.adapter = "tenant/missing";
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, msg, sizeof msg), LT_ERR_NOT_FOUND);
  cr_assert(strstr(msg, "tenant/missing") != NULL, "%s", msg);
  q.adapter = "";
  q.max_tokens = 200;
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, msg, sizeof msg), LT_ERR_INVALID);
  cr_assert(strstr(msg, "max_tokens") != NULL && strstr(msg, "128") != NULL, "%s", msg);
  q.max_tokens = 8;
  q.prompt = "";
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, msg, sizeof msg), LT_ERR_INVALID);
  cr_assert(strstr(msg, "prompt") != NULL, "%s", msg);
  q.prompt = k_prompts[0];
  q.max_tokens = 0;
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, msg, sizeof msg), LT_ERR_INVALID);
  cr_assert(strstr(msg, "max_tokens") != NULL, "%s", msg);
  long long bytes = metric(&t, "adapter_cache_bytes");
  cr_assert(bytes > 0);
  static const char garbage[] = "\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}not a safetensors file";
  cr_assert_neq(t.ops.load_adapter(t.ops.ctx, "tenant/bad", BASE, garbage, sizeof garbage, "{\"r\":4}", 7, msg,
                                   sizeof msg),
                LT_OK);
  cr_assert(!t.ops.has_adapter(t.ops.ctx, "tenant/bad"));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  cr_assert_eq(metric(&t, "adapter_cache_bytes"), bytes);
  cr_assert_eq(metric(&t, "adapter_loads_total"), 1);
  cr_assert_eq(metric(&t, "requests_total"), 0);
  ts_close(&t);
}

/* The bytes one test adapter takes in the cache. */
static long long one_adapter_bytes(void) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){0});
  OK(ts_load(&t, 0));
  long long one = metric(&t, "adapter_cache_bytes");
  ts_close(&t);
  return one;
}

/* A cache for two adapters: a third evicts the least recently used one that no request holds;
 * when every adapter is held, loading fails with LT_ERR_QUOTA and evicts nothing. */
Test(sampler, adapter_cache_evicts_lru_not_in_use, .timeout = 120) {
  tsampler_t t;
  long long one = one_adapter_bytes();
  /* no hold: the LRU order alone (the hold has a test of its own, below) */
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one * 5 / 2), .max_running = 4, .adapter_hold_ms = -1});
  OK(ts_load(&t, 0));
  OK(ts_load(&t, 1));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t0/ad0")); /* ad1 is now the least recently used */
  OK(ts_load(&t, 2));
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 1);
  cr_assert(!t.ops.has_adapter(t.ops.ctx, "t1/ad1"));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t2/ad2"));
  /* Both held by requests: nothing can go. */
  static rec_t r[2];
  uint64_t h[2];
  for (int i = 0; i < 2; i++) {
    rec_init(&r[i], i);
    r[i].slow_us = 10000;
    lt_sample_req_t q = req_of(&r[i], "t", i ? "t2/ad2" : "t0/ad0", k_prompts[i], 100, 0.9f, 3);
    h[i] = submit_ok(&t, &q);
  }
  cr_assert(rec_wait(&r[0], 1) && rec_wait(&r[1], 1));
  cr_assert_eq(ts_load(&t, 1), LT_ERR_QUOTA, "%s", errbuf);
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 1);
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t2/ad2"));
  /* One released: it goes. ad2 was asked for last, so the LRU is ad0; hold ad2 only. */
  t.ops.cancel(t.ops.ctx, h[0], NULL, NULL);
  for (int i = 0; i < 200 && metric(&t, "running") > 1; i++) usleep(10000);
  cr_assert_eq(metric(&t, "running"), 1);
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t2/ad2"));
  OK(ts_load(&t, 1));
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 2);
  cr_assert(!t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t2/ad2"));
  t.ops.cancel(t.ops.ctx, h[1], NULL, NULL);
  cr_assert(idle_and_free(&t));
  ts_close(&t);
  /* An adapter larger than the whole cache can never be served: not "full, retry" but a refusal
   * that says so, and nothing is evicted for it. */
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one / 2)});
  cr_assert_eq(ts_load(&t, 0), LT_ERR_UNSUPPORTED, "%s", errbuf);
  cr_expect(strstr(errbuf, "more than this sampler's whole adapter cache"), "%s", errbuf);
  cr_assert(!t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  ts_close(&t);
}

/* A deleted job's adapters leave the cache when the API folds its JobDeleted (ops.forget): before,
 * the tenant's decrypted weights stayed in the sampler until the LRU evicted them. The job's
 * published adapter ("t/job1") and its checkpoint's ("t/job1/ckpt-1-5") go, zeroed; one a request
 * holds is found by no other request and goes when that request ends; another job whose id
 * begins the same ("t/job10") stays. */
Test(sampler, a_deleted_jobs_adapters_leave_the_cache, .timeout = 120) {
  tsampler_t t;
  long long one = one_adapter_bytes();
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one * 4), .max_running = 4, .adapter_hold_ms = -1});
  OK(ts_load_id(&t, 0, "t/job1"));
  OK(ts_load_id(&t, 1, "t/job1/ckpt-1-5"));
  OK(ts_load_id(&t, 2, "t/job10"));
  static rec_t r;
  rec_init(&r, 0);
  r.slow_us = 10000;
  lt_sample_req_t q = req_of(&r, "t", "t/job1/ckpt-1-5", k_prompts[0], 100, 0.9f, 3);
  uint64_t h = submit_ok(&t, &q);
  cr_assert(rec_wait(&r, 1), "the request never started");
  long long before = metric(&t, "adapter_cache_bytes");
  t.ops.forget(t.ops.ctx, "t/job1");
  cr_expect(!t.ops.has_adapter(t.ops.ctx, "t/job1"), "the deleted job's adapter is still served");
  cr_expect(!t.ops.has_adapter(t.ops.ctx, "t/job1/ckpt-1-5"), "the deleted job's checkpoint is still served");
  cr_expect(t.ops.has_adapter(t.ops.ctx, "t/job10"), "another job's adapter went");
  cr_expect_eq(metric(&t, "adapter_forgotten_total"), 1, "the adapter no request holds goes at once");
  long long now = metric(&t, "adapter_cache_bytes");
  cr_expect(now < before && now > before / 3, "cache bytes %lld before, %lld after", before, now);
  t.ops.cancel(t.ops.ctx, h, NULL, NULL);
  cr_assert(idle_and_free(&t));
  cr_expect_eq(metric(&t, "adapter_forgotten_total"), 2, "the held one goes when its request ends");
  cr_expect_eq(metric(&t, "adapter_evictions_total"), 0);
  cr_expect(metric(&t, "adapter_cache_bytes") > 0 && metric(&t, "adapter_cache_bytes") <= now / 2 + 1,
            "only t/job10 is left (%lld bytes)", metric(&t, "adapter_cache_bytes"));
  OK(ts_load_id(&t, 0, "t/job2")); /* the cache takes others as before */
  ts_close(&t);
}

/* One tenant's requests may use at most half the adapter cache at once (a first adapter always):
 * requests hold their adapters until they end, and before, one tenant's long requests on three
 * checkpoints kept every other tenant's adapter out of a cache for three (429 "cache full" for as
 * long as they ran). Its further request is refused naming the share; another tenant's adapter
 * still loads and serves; once the first tenant's request ends, its next one is taken. */
Test(sampler, one_tenants_requests_use_at_most_half_the_adapter_cache, .timeout = 120) {
  tsampler_t t;
  long long one = one_adapter_bytes();
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one * 3 + one / 2), .max_running = 4, .adapter_hold_ms = -1});
  for (int i = 0; i < 3; i++) OK(ts_load_as(&t, i, "a"));
  static rec_t r[4];
  uint64_t h[2];
  for (int i = 0; i < 2; i++) { /* a/ad0 alone is under half; a/ad1 beside it is past it */
    rec_init(&r[i], i);
    r[i].slow_us = 10000;
    lt_sample_req_t q = req_of(&r[i], "a", i ? "a/ad1" : "a/ad0", k_prompts[i], 100, 0.9f, 3);
    lt_err_t e = t.ops.submit(t.ops.ctx, &q, &h[i], errbuf, sizeof errbuf);
    if (i == 0) cr_assert_eq(e, LT_OK, "%s", errbuf);
    else cr_assert_eq(e, LT_ERR_QUOTA, "a second adapter past half the cache was taken: %s", errbuf);
  }
  cr_expect(strstr(errbuf, "use 1 other adapter(s)") && strstr(errbuf, "at most half"), "%s", errbuf);
  rec_init(&r[2], 2); /* the same adapter again: it uses nothing more */
  lt_sample_req_t q = req_of(&r[2], "a", "a/ad0", k_prompts[2], 3, 0.9f, 3);
  submit_ok(&t, &q);
  OK(ts_load_as(&t, 2, "b")); /* the cache has room for another tenant's: evicts an idle one of a's */
  rec_init(&r[3], 3);
  q = req_of(&r[3], "b", "b/ad2", k_prompts[0], 3, 0.9f, 3);
  submit_ok(&t, &q);
  cr_assert(rec_wait(&r[3], -1) && rec_wait(&r[2], -1), "the other requests never finished");
  t.ops.cancel(t.ops.ctx, h[0], NULL, NULL);
  for (int i = 0; i < 200 && metric(&t, "running") > 0; i++) usleep(10000);
  cr_assert_eq(metric(&t, "running"), 0, "the cancelled request still runs");
  if (!t.ops.has_adapter(t.ops.ctx, "a/ad1")) OK(ts_load_as(&t, 1, "a"));
  rec_init(&r[1], 1);
  q = req_of(&r[1], "a", "a/ad1", k_prompts[1], 3, 0.9f, 3);
  submit_ok(&t, &q); /* a uses nothing now: taken */
  cr_assert(rec_wait(&r[1], -1));
  cr_assert(idle_and_free(&t));
  ts_close(&t);
}

/* An adapter loaded (or found) for a request is kept until that request submits: another request's
 * load does not evict it first. Before, with room for one adapter, loading ad1 between a request's
 * load of ad0 and its submit evicted ad0, and the request was told its model was not found (a 404
 * from the API under a busy cache). Now that load is refused as the cache being full (429,
 * Retry-After). The submit ends the hold (the request holds it then), so once the request is done
 * ad1 evicts ad0 at once; a hold no submit ends runs out after adapter_hold_ms. has_adapter and a
 * load that finds the adapter loaded already hold it the same way. */
Test(sampler, an_adapter_loaded_for_a_request_stays_until_it_submits, .timeout = 120) {
  tsampler_t t;
  long long one = one_adapter_bytes();
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one * 3 / 2), .adapter_hold_ms = 800});
  OK(ts_load(&t, 0)); /* request A's load */
  cr_assert_eq(ts_load(&t, 1), LT_ERR_QUOTA, "request B's load evicted the adapter A loaded: %s", errbuf);
  cr_expect(strstr(errbuf, "just loaded for a request"), "%s", errbuf);
  static rec_t r;
  rec_init(&r, 0);
  lt_sample_req_t q = req_of(&r, "t", "t0/ad0", k_prompts[0], 3, 0.9f, 3);
  submit_ok(&t, &q); /* A submits: its adapter is there */
  cr_assert(rec_wait(&r, -1), "request A never finished");
  cr_assert(idle_and_free(&t));
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 0);
  OK(ts_load(&t, 1)); /* A's submit ended the hold, A is done: nothing keeps ad0 */
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 1);
  cr_assert(!t.ops.has_adapter(t.ops.ctx, "t0/ad0"));
  usleep(1000 * 1000); /* ad1 was never submitted to: its hold runs out */
  cr_assert(t.ops.has_adapter(t.ops.ctx, "t1/ad1")); /* found for a request: held */
  cr_assert_eq(ts_load(&t, 0), LT_ERR_QUOTA, "a load evicted the adapter has_adapter had just found: %s", errbuf);
  usleep(1000 * 1000);
  OK(ts_load(&t, 1)); /* loaded already, for another request: held */
  cr_assert_eq(ts_load(&t, 0), LT_ERR_QUOTA, "a load evicted the adapter another load had just found: %s", errbuf);
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 1);
  usleep(1000 * 1000);
  OK(ts_load(&t, 0));
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 2, "the hold never ran out");
  ts_close(&t);
}

/* A request refused at submit ends its adapter's hold, whatever refused it. Before, one refused
 * for its own input (an empty prompt) left the hold, so that a tenant sending such requests to its
 * adapter kept it unevictable for good, at no cost, and another tenant's load was refused (429)
 * on a cache with room for one adapter. */
Test(sampler, a_request_refused_for_its_input_holds_its_adapter_no_longer, .timeout = 120) {
  tsampler_t t;
  long long one = one_adapter_bytes();
  ts_open(&t, (lt_sampler_conf_t){.adapter_bytes = (size_t)(one * 3 / 2), .adapter_hold_ms = 5000});
  OK(ts_load(&t, 0));
  static rec_t r;
  rec_init(&r, 0);
  lt_sample_req_t q = req_of(&r, "t0", "t0/ad0", "", 3, 0.9f, 3);
  uint64_t h = 0;
  cr_assert_eq(t.ops.submit(t.ops.ctx, &q, &h, errbuf, sizeof errbuf), LT_ERR_INVALID, "an empty prompt: %s", errbuf);
  OK(ts_load(&t, 1)); /* another tenant's adapter: ad0 is held by nothing now */
  cr_assert_eq(metric(&t, "adapter_evictions_total"), 1);
  ts_close(&t);
}

/* A prompt of at least `tokens` tokens of the test model, repeating one sentence, into out. */
static void long_prompt(int tokens, char *out, size_t n) {
  char path[400];
  snprintf(path, sizeof path, "%s/models/" BASE "/tokenizer.json", root_dir());
  lt_tok_t *tok;
  OK(lt_tok_load_file(path, &tok, errbuf, sizeof errbuf));
  out[0] = '\0';
  for (size_t len = 0;;) {
    lt_tok_seq_t seq;
    lt_tok_seq_init(&seq);
    OK(lt_tok_encode(tok, out, len, 0, 1, &seq, errbuf, sizeof errbuf));
    size_t have = seq.len;
    lt_tok_seq_free(&seq);
    if (have >= (size_t)tokens) break;
    cr_assert(len + 32 < n, "no prompt of %d tokens fits %zu bytes", tokens, n);
    len += (size_t)snprintf(out + len, n - len, "the fox ran home. ");
  }
  lt_tok_destroy(tok);
}

/* Two base models, each with a KV cache of its own (32 blocks of 4 positions here): a request
 * of one base that does not fit its cache (another request holds it) waits, and a request of the
 * other base, behind it in the queue, starts meanwhile. Before, the sampler admitted nothing at
 * all while the request next in fair order waited for blocks: the other base's request started
 * only once the first base's long request had ended. */
Test(sampler, a_request_waiting_for_its_bases_cache_holds_up_no_other_base, .timeout = 120) {
  char models[400], link[500], target[500];
  snprintf(models, sizeof models, "%s/models2.%d", root_dir(), (int)getpid());
  cr_assert(mkdir(models, 0700) == 0 || errno == EEXIST);
  snprintf(target, sizeof target, "%s/models/" BASE, root_dir());
  const char *names[] = {BASE, "tiny2"};
  for (int i = 0; i < 2; i++) {
    snprintf(link, sizeof link, "%s/%s", models, names[i]);
    cr_assert(symlink(target, link) == 0 || errno == EEXIST, "%s", link);
  }
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){.kv_bytes = 32 * 2048, .block_tokens = 4, .models_dir = models});
  static char pa[4096], pb[4096];
  long_prompt(90, pa, sizeof pa); /* A holds ~24 of its base's 32 blocks */
  long_prompt(60, pb, sizeof pb); /* B needs 16: it waits for A */
  static rec_t a, b, c;
  rec_init(&a, 0), rec_init(&b, 1), rec_init(&c, 2);
  a.slow_us = 20000; /* A's 20 tokens take 0.4 s and more */
  lt_sample_req_t q = req_of(&a, "ta", "", pa, 20, 0, 1);
  submit_ok(&t, &q);
  cr_assert(rec_wait(&a, 1));
  q = req_of(&b, "tb", "", pb, 4, 0, 2);
  submit_ok(&t, &q);
  q = req_of(&c, "tc", "", k_prompts[0], 4, 0, 3);
  q.base = "tiny2";
  submit_ok(&t, &q);
  cr_assert(rec_wait(&c, 1), "the other base's request never started");
  pthread_mutex_lock(&a.mu);
  bool a_done = a.done;
  int a_n = a.n;
  pthread_mutex_unlock(&a.mu);
  pthread_mutex_lock(&b.mu);
  int b_n = b.n;
  pthread_mutex_unlock(&b.mu);
  cr_expect(!a_done && b_n == 0, "tiny2's request started only after A ended (A: %d tokens, done %d; B: %d tokens)", a_n,
            a_done, b_n);
  cr_assert(rec_wait(&a, -1) && rec_wait(&b, -1) && rec_wait(&c, -1));
  cr_expect_eq(a.n, 20, "A (greedy) stopped early, at %d tokens: the test needs it to hold its blocks", a.n);
  cr_expect(a.err == LT_OK && b.err == LT_OK && c.err == LT_OK);
  cr_assert(idle_and_free(&t));
  ts_close(&t);
  for (int i = 0; i < 2; i++) {
    snprintf(link, sizeof link, "%s/%s", models, names[i]);
    unlink(link);
  }
  rmdir(models);
}

/* A stop string from the greedy output: the text released ends right before it, finish "stop",
 * and no delta ever showed it or broke a UTF-8 character. */
Test(sampler, stop_string_cuts_the_text_before_it, .timeout = 60) {
  tsampler_t t;
  ts_open(&t, (lt_sampler_conf_t){0});
  static rec_t full, cut;
  rec_init(&full, 0);
  lt_sample_req_t q = req_of(&full, "t", "", k_prompts[2], 40, 0, 1);
  submit_ok(&t, &q);
  cr_assert(rec_wait(&full, -1));
  cr_assert(full.deltas_valid);
  cr_assert(full.text_len >= 8, "greedy output too short: %zu bytes", full.text_len);
  /* Three ASCII bytes from the middle of the text. */
  size_t at = full.text_len / 2;
  while (at + 3 <= full.text_len &&
         ((unsigned char)full.text[at] >= 0x80 || (unsigned char)full.text[at + 1] >= 0x80 ||
          (unsigned char)full.text[at + 2] >= 0x80))
    at++;
  cr_assert(at + 3 <= full.text_len, "no ASCII in the greedy output");
  char stop[4] = {full.text[at], full.text[at + 1], full.text[at + 2], 0};
  size_t first = (size_t)((char *)memmem(full.text, full.text_len, stop, 3) - full.text);
  rec_init(&cut, 1);
  q = req_of(&cut, "t", "", k_prompts[2], 40, 0, 1);
  q.stop[0] = "never appears \x01";
  q.stop[1] = stop;
  q.nstop = 2;
  submit_ok(&t, &q);
  cr_assert(rec_wait(&cut, -1));
  cr_assert_str_eq(cut.finish, "stop");
  cr_assert(cut.deltas_valid);
  cr_assert_eq(cut.text_len, first, "released %zu bytes, the stop string \"%s\" is at %zu", cut.text_len, stop, first);
  cr_assert_eq(memcmp(cut.text, full.text, first), 0);
  cr_assert_null(memmem(cut.text, cut.text_len, stop, 3));
  ts_close(&t);
}
