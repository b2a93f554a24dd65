/* bench_sample: the sampler's continuous batch in process — what `lathed --role
 * sampler` serves, without HTTP: workers/lt_sampler.h's table of functions, driven the way the
 * API's sampling routes drive it (submit with an on_event callback, events on the batch thread).
 *
 * Setting: a models directory holding only --model (a symlink in a temp dir, so the sampler
 * opens one base), a CPU backend of --threads threads, a KV cache big enough that no request is
 * preempted, and --adapters distinct PEFT LoRA adapters (rank --rank, alpha 2r, all 7 target
 * modules) made here: a session per adapter (seed 100 + i), two forward_backward + AdamW steps
 * (lr 1e-3) on random tokens so that B is nonzero and every adapter differs, lt_export_peft,
 * then the two files read back and handed to load_adapter, as the front does from the store.
 *
 * The requests: --streams at once, greedy (temperature 0), max_tokens --new-tokens, no stop
 * strings, one prompt of about --prompt-len tokens (--text, "The quick brown fox jumps over the
 * lazy dog. " by default, repeated and cut at that many tokens by the model's tokenizer; the
 * sampler tokenizes it again). The model's EOS may end a stream early: every rate is over the
 * tokens actually produced. The bundled model, trained on dates, ends a date prompt ("date: March
 * 5, 2021\n" repeated) after 2-7 tokens but runs the default one to max_tokens.
 *
 * Measured per run, from the event times (taken in the callback, on the batch thread):
 *   decode_tok_s  completion tokens of every stream / (first first-token -> last token)
 *   steady_tok_s  tokens after the last stream's first token / (that moment -> last token):
 *                 every stream decoding, no prefill in the window (what the PyTorch peer
 *                 measures: B*N / the decode steps)
 *   ttft          submit -> first token event, per request (p50, p99)
 *   itl           gaps between consecutive token events of a request, all requests (p50, p99)
 *
 * Two runs in one process, after an untimed warm-up (every stream, base model, a 4-token prompt, 4 tokens): --streams streams all on adapter 0,
 * then --streams streams on --adapters adapters (stream i on adapter i % A; A = 0: the base
 * model both times). Last line: `multi_adapter_ratio: R` = decode_tok_s distinct / single.
 * --rounds K: K such pairs, the order alternating (single first, then distinct first) so that a
 * drift in the shared machine's load falls on both; R is the median of the K paired ratios.
 * --batch-only B: one run of B streams on the base model instead; last line `decode_tok_s: X`
 * (steady_tok_s: the figure to hold against bench/sample_torch.py at the same B, P, N, threads).
 * --json adds one JSON line with every figure, before the last line.
 *
 * Usage: bench_sample --models DIR --model NAME [--threads T] [--streams S] [--adapters A]
 *                     [--prompt-len P] [--new-tokens N] [--rank R] [--batch-only B] [--text STR]
 *                     [--rounds K] [--precision f32|bf16] [--json] */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "lt_engine.h"
#include "lt_sampler.h"
#include "lt_time.h"
#include "lt_tok.h"

static char err[1024];

typedef struct opts {
  const char *models, *model;
  const char *line; /* the prompt's text, repeated */
  int threads, streams, adapters, prompt_len, new_tokens, rank, batch_only, rounds, json;
  int bf16; /* --precision bf16: the sampler reads bf16 copies of the base weights */
} opts_t;

/* One request's record, written by the batch thread's callback, read by main after done. */
typedef struct stream {
  int64_t submit_us;
  int64_t *tok_us; /* [cap] time of each token event */
  int ntok, cap, prompt_tokens;
  const char *finish;
  struct bench *b;
} stream_t;

typedef struct bench {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
} bench_t;

typedef struct result {
  double decode_tok_s, steady_tok_s, span_s, ttft_p50, ttft_p99, itl_p50, itl_p99;
  long tokens;
  int prompt_tokens, stopped_early;
} result_t;

/* The p-th percentile of sorted[0..n), interpolated between ranks (bench_session_call's). */
static double pct(const double *sorted, int n, double p) {
  if (n == 0) return NAN;
  double k = (n - 1) * p / 100.0;
  int lo = (int)floor(k), hi = lo + 1 < n ? lo + 1 : n - 1;
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (k - lo);
}

/* Reads a whole file into a malloc'd buffer (NULL on failure). */
static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) buf[n] = 0;
  *len = (size_t)n;
  return buf;
}

/* The batch thread's callback: notes the time of each token; DONE wakes main. */
static void on_event(void *ctx, const lt_sample_event_t *ev) {
  stream_t *st = ctx;
  if (ev->kind == LT_SAMPLE_TOKEN) {
    if (st->ntok < st->cap) st->tok_us[st->ntok++] = lt_time_mono_us();
    return;
  }
  st->finish = ev->finish;
  st->prompt_tokens = ev->prompt_tokens;
  if (ev->err) fprintf(stderr, "bench_sample: a request failed: %s\n", ev->msg ? ev->msg : "?");
  pthread_mutex_lock(&st->b->mu);
  st->b->done++;
  pthread_cond_signal(&st->b->cv);
  pthread_mutex_unlock(&st->b->mu);
}

/* A prompt of about P tokens: the repeated line, cut after P tokens of the model's tokenizer. */
static char *make_prompt(const char *model_dir, const char *line, int P) {
  char path[2400];
  snprintf(path, sizeof path, "%s/tokenizer.json", model_dir);
  lt_tok_t *tok = NULL;
  if (lt_tok_load_file(path, &tok, err, sizeof err)) return NULL;
  size_t ll = strlen(line), len = ll * (size_t)(P + 1);
  char *text = malloc(len + 1), *out = NULL;
  for (int i = 0; i <= P; i++) memcpy(text + (size_t)i * ll, line, ll);
  text[len] = 0;
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  size_t olen = 0;
  if (!lt_tok_encode(tok, text, len, 0, 1, &seq, err, sizeof err))
    lt_tok_decode(tok, seq.ids, seq.len < (size_t)P ? seq.len : (size_t)P, 0, &out, &olen, err, sizeof err);
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
  free(text);
  return out;
}

/* KV cache bytes for S sequences of T positions (F32 keys and values, 16-position blocks), with
 * half again to spare; 0 when the model's config cannot be read. */
static size_t kv_bytes(const char *model_dir, int S, int T) {
  char path[2400];
  size_t len = 0;
  snprintf(path, sizeof path, "%s/config.json", model_dir);
  char *text = slurp(path, &len);
  lt_model_config_t c;
  if (!text || lt_model_config_parse(text, len, path, &c, err, sizeof err)) {
    free(text);
    return 0;
  }
  free(text);
  size_t per_pos = 2 * (size_t)c.num_layers * (size_t)c.num_kv_heads * (size_t)c.head_dim * sizeof(float);
  size_t blocks = (size_t)S * (size_t)((T + 15) / 16 + 1);
  return blocks * 16 * per_pos * 3 / 2 + ((size_t)8 << 20);
}

/* Makes adapter i's PEFT files under work/aI: a LoRA session of its own seed, two steps on
 * random tokens. */
static lt_err_t make_adapter(lt_engine_t *eng, const opts_t *o, int i, const char *dir) {
  lt_session_config_t sc = {.rank = o->rank, .alpha = 2.0f * o->rank, .dropout = 0, .targets = LT_TARGET_ALL,
                            .seed = 100 + (uint64_t)i};
  lt_session_t *s = NULL;
  lt_err_t e = lt_session_new(eng, &sc, &s, err, sizeof err);
  int V = lt_engine_config(eng)->vocab_size, T = 16;
  int32_t tokens[16], targets[16];
  srand(1000 + (unsigned)i);
  lt_adamw_t opt = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0, .max_grad_norm = 1};
  for (int step = 0; step < 2 && !e; step++) {
    for (int t = 0; t < T; t++) tokens[t] = rand() % (V < 2048 ? V : 2048);
    for (int t = 0; t < T; t++) targets[t] = t + 1 < T ? tokens[t + 1] : tokens[0];
    lt_batch_t b = {.B = 1, .T = T, .tokens = tokens, .targets = targets};
    e = lt_forward_backward(s, &b, LT_LOSS_CROSS_ENTROPY, NULL, NULL, err, sizeof err);
    if (!e) e = lt_optim_step(s, &opt, NULL, err, sizeof err);
  }
  if (!e) e = lt_export_peft(s, dir, o->model, err, sizeof err);
  lt_session_destroy(s);
  return e;
}

/* Makes the A adapters and loads them into the sampler as "bench/aI". */
static lt_err_t load_adapters(const lt_sample_ops_t *ops, const opts_t *o, const char *model_dir, const char *work) {
  if (o->adapters == 0) return LT_OK;
  lt_backend_t *be = NULL;
  lt_engine_t *eng = NULL;
  double t0 = bench_now_s();
  lt_err_t e = lt_backend_cpu_new(o->threads, &be, err, sizeof err);
  if (!e) e = lt_engine_open(model_dir, be, &eng, err, sizeof err);
  for (int i = 0; i < o->adapters && !e; i++) {
    char dir[2400], path[2500], id[64];
    snprintf(dir, sizeof dir, "%s/a%d", work, i);
    snprintf(id, sizeof id, "bench/a%d", i);
    if ((e = make_adapter(eng, o, i, dir))) break;
    size_t st_len = 0, cfg_len = 0;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    char *st = slurp(path, &st_len);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *cfg = slurp(path, &cfg_len);
    if (!st || !cfg) e = lt_errf(err, sizeof err, LT_ERR_IO, "cannot read the PEFT files in %s", dir);
    if (!e) e = ops->load_adapter(ops->ctx, id, o->model, st, st_len, cfg, cfg_len, err, sizeof err);
    free(st);
    free(cfg);
  }
  lt_engine_close(eng);
  lt_backend_destroy(be);
  if (!e)
    printf("made and loaded %d LoRA adapters (r%d, all 7 modules, 2 steps each) in %.1f s\n", o->adapters, o->rank,
           bench_now_s() - t0);
  return e;
}

/* Runs S streams (stream i on adapter adapter_of(i), "" = base) to the end; fills r. */
static lt_err_t run(const lt_sample_ops_t *ops, const opts_t *o, const char *prompt, int S, int nadapters,
                    int max_tokens, result_t *r) {
  bench_t b = {.done = 0};
  pthread_mutex_init(&b.mu, NULL);
  pthread_cond_init(&b.cv, NULL);
  stream_t *st = calloc((size_t)S, sizeof *st);
  char (*ids)[64] = calloc((size_t)S, sizeof *ids);
  lt_err_t e = LT_OK;
  for (int i = 0; i < S; i++) {
    st[i].b = &b;
    st[i].cap = max_tokens;
    st[i].tok_us = calloc((size_t)max_tokens, sizeof *st[i].tok_us);
    if (nadapters > 0) snprintf(ids[i], sizeof ids[i], "bench/a%d", i % nadapters);
  }
  for (int i = 0; i < S && !e; i++) {
    lt_sample_req_t q = {.tenant = "bench", .weight = 1, .base = o->model, .adapter = ids[i], .prompt = prompt,
                         .max_tokens = max_tokens, .temperature = 0, .top_p = 1, .seed = (uint64_t)i,
                         .on_event = on_event, .ctx = &st[i]};
    uint64_t h;
    st[i].submit_us = lt_time_mono_us();
    e = ops->submit(ops->ctx, &q, &h, err, sizeof err);
    if (e) { /* wait for those already submitted */
      pthread_mutex_lock(&b.mu);
      while (b.done < i) pthread_cond_wait(&b.cv, &b.mu);
      pthread_mutex_unlock(&b.mu);
    }
  }
  if (!e) {
    pthread_mutex_lock(&b.mu);
    while (b.done < S) pthread_cond_wait(&b.cv, &b.mu);
    pthread_mutex_unlock(&b.mu);
  }
  /* The figures, from the event times. */
  int64_t first = INT64_MAX, last = 0, all_in = 0;
  long tokens = 0, steady = 0;
  int ngaps = 0, early = 0;
  for (int i = 0; i < S; i++) {
    if (st[i].ntok == 0) continue;
    tokens += st[i].ntok;
    if (st[i].tok_us[0] < first) first = st[i].tok_us[0];
    if (st[i].tok_us[0] > all_in) all_in = st[i].tok_us[0];
    if (st[i].tok_us[st[i].ntok - 1] > last) last = st[i].tok_us[st[i].ntok - 1];
    ngaps += st[i].ntok - 1;
    early += st[i].ntok < max_tokens;
  }
  double *ttft = calloc((size_t)S, sizeof *ttft), *itl = calloc((size_t)ngaps + 1, sizeof *itl);
  int nt = 0, ni = 0;
  for (int i = 0; i < S; i++) {
    if (st[i].ntok == 0) continue;
    ttft[nt++] = (double)(st[i].tok_us[0] - st[i].submit_us) / 1e3;
    for (int k = 1; k < st[i].ntok; k++) {
      itl[ni++] = (double)(st[i].tok_us[k] - st[i].tok_us[k - 1]) / 1e3;
      if (st[i].tok_us[k] > all_in) steady++;
    }
  }
  qsort(ttft, (size_t)nt, sizeof *ttft, bench_cmp_double);
  qsort(itl, (size_t)ni, sizeof *itl, bench_cmp_double);
  *r = (result_t){.tokens = tokens, .span_s = (double)(last - first) / 1e6, .stopped_early = early,
                  .prompt_tokens = S > 0 ? st[0].prompt_tokens : 0, .ttft_p50 = pct(ttft, nt, 50),
                  .ttft_p99 = pct(ttft, nt, 99), .itl_p50 = pct(itl, ni, 50), .itl_p99 = pct(itl, ni, 99)};
  r->decode_tok_s = last > first ? (double)tokens / r->span_s : NAN;
  r->steady_tok_s = last > all_in ? (double)steady / ((double)(last - all_in) / 1e6) : NAN;
  for (int i = 0; i < S; i++) free(st[i].tok_us);
  free(st);
  free(ids);
  free(ttft);
  free(itl);
  pthread_mutex_destroy(&b.mu);
  pthread_cond_destroy(&b.cv);
  return e;
}

static void print_result(const char *name, int S, const result_t *r) {
  printf("%s: %d streams, prompt %d tokens, %ld tokens generated (%d streams ended before max_tokens) in %.2f s\n",
         name, S, r->prompt_tokens, r->tokens, r->stopped_early, r->span_s);
  printf("  decode_tok_s %.1f  steady_tok_s %.1f  ttft_ms p50 %.1f p99 %.1f  itl_ms p50 %.1f p99 %.1f\n",
         r->decode_tok_s, r->steady_tok_s, r->ttft_p50, r->ttft_p99, r->itl_p50, r->itl_p99);
  fflush(stdout);
}

static void json_result(const char *name, const result_t *r, int comma) {
  printf("\"%s\":{\"decode_tok_s\":%.3f,\"steady_tok_s\":%.3f,\"tokens\":%ld,\"span_s\":%.4f,"
         "\"ttft_p50_ms\":%.3f,\"ttft_p99_ms\":%.3f,\"itl_p50_ms\":%.3f,\"itl_p99_ms\":%.3f,"
         "\"prompt_tokens\":%d,\"stopped_early\":%d}%s",
         name, r->decode_tok_s, r->steady_tok_s, r->tokens, r->span_s, r->ttft_p50, r->ttft_p99, r->itl_p50,
         r->itl_p99, r->prompt_tokens, r->stopped_early, comma ? "," : "");
}

static int usage(void) {
  fprintf(stderr, "usage: bench_sample --models DIR --model NAME [--threads T] [--streams S] [--adapters A]\n"
                  "                    [--prompt-len P] [--new-tokens N] [--rank R] [--batch-only B] [--text STR]\n"
                  "                    [--rounds K] [--precision f32|bf16] [--json]\n");
  return 2;
}

int main(int argc, char **argv) {
  opts_t o = {.threads = 2, .streams = 32, .adapters = 32, .prompt_len = 64, .new_tokens = 64, .rank = 8, .rounds = 1,
            .line = "The quick brown fox jumps over the lazy dog. "};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--json") == 0) { o.json = 1; continue; }
    if (!v) return usage();
    i++;
    if (strcmp(a, "--models") == 0) o.models = v;
    else if (strcmp(a, "--model") == 0) o.model = v;
    else if (strcmp(a, "--threads") == 0) o.threads = atoi(v);
    else if (strcmp(a, "--precision") == 0) o.bf16 = strcmp(v, "bf16") == 0 ? 1 : strcmp(v, "f32") == 0 ? 0 : -1;
    else if (strcmp(a, "--streams") == 0) o.streams = atoi(v);
    else if (strcmp(a, "--adapters") == 0) o.adapters = atoi(v);
    else if (strcmp(a, "--prompt-len") == 0) o.prompt_len = atoi(v);
    else if (strcmp(a, "--new-tokens") == 0) o.new_tokens = atoi(v);
    else if (strcmp(a, "--rank") == 0) o.rank = atoi(v);
    else if (strcmp(a, "--text") == 0) o.line = v;
    else if (strcmp(a, "--rounds") == 0) o.rounds = atoi(v);
    else if (strcmp(a, "--batch-only") == 0) o.batch_only = atoi(v);
    else return usage();
  }
  if (!o.models || !o.model || o.threads < 1 || o.streams < 1 || o.adapters < 0 || o.prompt_len < 1 ||
      o.new_tokens < 1 || o.rank < 1 || o.batch_only < 0 || o.bf16 < 0 || o.rounds < 1 || o.rounds > 16)
    return usage();
  if (o.batch_only) o.streams = o.batch_only, o.adapters = 0;

  /* A models directory holding only the model asked for: the sampler opens every one it finds. */
  char root[256], mdir[1024], work[1024], src[2400], link[1200];
  if (!bench_workspace("sample", root, sizeof root, mdir, work, sizeof mdir) || mkdir(mdir, 0700) != 0) {
    fprintf(stderr, "bench_sample: cannot make a temp dir\n");
    return 1;
  }
  snprintf(src, sizeof src, "%s/%s", o.models, o.model);
  char *real = realpath(src, NULL);
  snprintf(link, sizeof link, "%s/%s", mdir, o.model);
  if (!real || symlink(real, link) != 0) {
    fprintf(stderr, "bench_sample: no model %s\n", src);
    bench_rm_rf(root);
    return 1;
  }
  free(real);
  char *prompt = make_prompt(link, o.line, o.prompt_len);
  if (!prompt) {
    fprintf(stderr, "bench_sample: %s: %s\n", link, err);
    bench_rm_rf(root);
    return 1;
  }

  /* A cache holding every stream's prompt and tokens with room to spare (no preemption), every
   * adapter, no queue cap. */
  int S = o.streams;
  size_t kv = kv_bytes(link, S, o.prompt_len + o.new_tokens);
  if (!kv) {
    fprintf(stderr, "bench_sample: %s/config.json: %s\n", link, err);
    bench_rm_rf(root);
    return 1;
  }
  lt_sampler_conf_t conf = {.models_dir = mdir, .threads = o.threads, .bf16_weights = o.bf16, .kv_bytes = kv,
                            .adapter_bytes = (size_t)2 << 30, .max_running = S, .queue_per_tenant = 4 * S + 8,
                            .queue_total = 4 * S + 8};
  lt_sampler_t *smp = NULL;
  lt_sample_ops_t ops;
  double t0 = bench_now_s();
  if (lt_sampler_new(&conf, &smp, err, sizeof err)) {
    fprintf(stderr, "bench_sample: sampler: %s\n", err);
    bench_rm_rf(root);
    return 1;
  }
  lt_sampler_ops(smp, &ops);
  printf("model %s (%s), %d thread(s), sampler opened in %.1f s\n", o.model, src, o.threads, bench_now_s() - t0);
  if (load_adapters(&ops, &o, link, work)) {
    fprintf(stderr, "bench_sample: adapters: %s\n", err);
    lt_sampler_destroy(smp);
    bench_rm_rf(root);
    return 1;
  }

  result_t warm, one, many;
  int rc = 0;
  /* Warm-up, untimed: every stream on the base model, a short prompt, a few tokens (first-use
   * allocations at the full batch, pages of the weights). */
  if (run(&ops, &o, "The quick brown fox", S, 0, 4, &warm)) goto fail;
  if (o.batch_only) {
    if (run(&ops, &o, prompt, S, 0, o.new_tokens, &one)) goto fail;
    print_result("base model", S, &one);
    if (o.json) {
      printf("{\"batch\":%d,\"prompt_len\":%d,\"new_tokens\":%d,\"threads\":%d,", S, o.prompt_len, o.new_tokens,
             o.threads);
      json_result("base", &one, 0);
      printf("}\n");
    }
    printf("decode_tok_s: %.2f\n", one.steady_tok_s);
  } else {
    /* Rounds of the pair, the order alternating (single first, then distinct first) so that a
     * drift in the machine's load falls on both; the figure is the median of the paired ratios. */
    double ratios[16], tok1[16], tokm[16];
    char name[64];
    snprintf(name, sizeof name, "%d distinct adapters", o.adapters);
    for (int k = 0; k < o.rounds; k++) {
      for (int half = 0; half < 2; half++) {
        int distinct = (half + k) % 2;
        result_t *r = distinct ? &many : &one;
        if (run(&ops, &o, prompt, S, distinct ? o.adapters : (o.adapters > 0 ? 1 : 0), o.new_tokens, r)) goto fail;
        printf("round %d ", k + 1);
        print_result(distinct ? name : (o.adapters > 0 ? "one adapter" : "base model"), S, r);
      }
      tok1[k] = one.decode_tok_s;
      tokm[k] = many.decode_tok_s;
      ratios[k] = many.decode_tok_s / one.decode_tok_s;
      printf("round %d ratio %.3f\n", k + 1, ratios[k]);
    }
    double sorted[16];
    memcpy(sorted, ratios, sizeof sorted);
    double ratio = bench_median(sorted, o.rounds);
    if (o.json) {
      printf("{\"streams\":%d,\"adapters\":%d,\"prompt_len\":%d,\"new_tokens\":%d,\"threads\":%d,\"rank\":%d,"
             "\"rounds\":%d,", S, o.adapters, o.prompt_len, o.new_tokens, o.threads, o.rank, o.rounds);
      json_result("single", &one, 1); /* the last round's */
      json_result("distinct", &many, 1);
      printf("\"ratios\":[");
      for (int k = 0; k < o.rounds; k++) printf("%s%.4f", k ? "," : "", ratios[k]);
      printf("],\"single_tok_s\":[");
      for (int k = 0; k < o.rounds; k++) printf("%s%.3f", k ? "," : "", tok1[k]);
      printf("],\"distinct_tok_s\":[");
      for (int k = 0; k < o.rounds; k++) printf("%s%.3f", k ? "," : "", tokm[k]);
      printf("],\"multi_adapter_ratio\":%.4f}\n", ratio);
    }
    printf("multi_adapter_ratio: %.3f\n", ratio);
  }
  goto done;
fail:
  fprintf(stderr, "bench_sample: submit: %s\n", err);
  rc = 1;
done:
  lt_sampler_destroy(smp);
  free(prompt);
  bench_rm_rf(root);
  return rc;
}
