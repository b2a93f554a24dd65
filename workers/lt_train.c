/* lt_train: the managed training loop and the base model's pretraining (see lt_train.h). */
#include "lt_train.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "lt_backend_cuda.h"
#include "lt_dataset.h"
#include "lt_rand.h"
#include "lt_task.h"
#include "lt_time.h"
#include "lt_tok.h"

/* ---------------------------------------------------------------- small helpers */

/* splitmix64: the data order and the bootstrap depend only on the seed. */
static uint64_t mix(uint64_t *s) { return lt_splitmix64(s); }

static void shuffle(uint32_t *v, size_t n, uint64_t seed) {
  uint64_t s = seed;
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(mix(&s) % i);
    uint32_t t = v[i - 1];
    v[i - 1] = v[j];
    v[j] = t;
  }
}

static lt_err_t write_file(const char *dir, const char *name, const char *text, char *errstr, size_t n);

/* The chat template of the bundled model: it was taught plain prompts ("date: ...\niso:"), so a
 * chat is the messages' contents, one per line (the sampler renders it for /v1/chat/completions). */
lt_err_t lt_train_write_chat_config(const char *dir, char *errstr, size_t n) {
  return write_file(dir, "tokenizer_config.json",
                    "{\"bos_token\": null, \"eos_token\": \"<|endoftext|>\", \"model_max_length\": 256,\n"
                    " \"chat_template\": \"{% for m in messages %}{{ m['content'] }}{% if not loop.last %}{{ '\\\\n' }}"
                    "{% endif %}{% endfor %}\"}\n",
                    errstr, n);
}

static lt_err_t write_file(const char *dir, const char *name, const char *text, char *errstr, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  size_t len = strlen(text);
  bool ok = fwrite(text, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  return ok ? LT_OK : lt_errf(errstr, n, LT_ERR_IO, "%s: write failed", path);
}

static lt_err_t write_json(const char *dir, const char *name, json_t *j, char *errstr, size_t n) {
  char *text = json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS | JSON_REAL_PRECISION(10));
  if (!text) return LT_ERR_NOMEM;
  lt_err_t err = write_file(dir, name, text, errstr, n);
  free(text);
  return err;
}

/* ---------------------------------------------------------------- examples */

typedef struct {
  int32_t *ids;     /* tokens of the whole example */
  float *w;         /* loss weight of each token (1 where the model must predict it) */
  int len;
  int prompt_len;   /* tokens before the completion (prompt/completion data), else 0 */
  char *completion; /* expected completion text (prompt/completion data), else NULL */
} example_t;

typedef struct {
  example_t *v;
  size_t n, cap;
  bool prompt_completion; /* every example is {"prompt","completion"} */
} examples_t;

static void examples_free(examples_t *e) {
  for (size_t i = 0; i < e->n; i++) {
    OPENSSL_cleanse(e->v[i].ids, (size_t)e->v[i].len * sizeof(int32_t));
    free(e->v[i].ids);
    free(e->v[i].w);
    if (e->v[i].completion) OPENSSL_cleanse(e->v[i].completion, strlen(e->v[i].completion));
    free(e->v[i].completion);
  }
  free(e->v);
  memset(e, 0, sizeof *e);
}

/* Tokenises every non-blank line; errors name the line. */
static lt_err_t tokenize(const lt_tok_t *tok, const char *text, size_t len, int max_seq, examples_t *out, char *errstr,
                         size_t n) {
  memset(out, 0, sizeof *out);
  out->prompt_completion = true;
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  size_t line_no = 0;
  const char *p = text, *end = text + len;
  lt_err_t err = LT_OK;
  while (p < end && !err) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t l = (size_t)((nl ? nl : end) - p);
    line_no++;
    const char *line = p;
    p = nl ? nl + 1 : end;
    if (line_no == 1) lt_dataset_skip_bom(&line, &l);
    size_t k = 0;
    while (k < l && (line[k] == ' ' || line[k] == '\t' || line[k] == '\r')) k++;
    if (k == l) continue;
    json_error_t je;
    json_t *obj = json_loadb(line, l, 0, &je);
    if (!obj) {
      err = lt_errf(errstr, n, LT_ERR_INVALID, "dataset line %zu: invalid JSON: %s", line_no, je.text);
      break;
    }
    lt_tok_seq_reset(&seq);
    char msg[256];
    example_t ex = {0};
    const json_t *pr = json_object_get(obj, "prompt"), *co = json_object_get(obj, "completion");
    if (json_is_string(pr) && json_is_string(co)) {
      err = lt_tok_encode(tok, json_string_value(pr), json_string_length(pr), 0, 0.0f, &seq, msg, sizeof msg);
      ex.prompt_len = (int)seq.len;
      if (!err) {
        lt_tok_seq_reset(&seq);
        err = lt_tok_encode_prompt_completion(tok, json_string_value(pr), json_string_length(pr), json_string_value(co),
                                              json_string_length(co), &seq, msg, sizeof msg);
      }
      ex.completion = strdup(json_string_value(co));
    } else {
      out->prompt_completion = false;
      err = lt_tok_encode_json_line(tok, line, l, &seq, msg, sizeof msg);
    }
    json_decref(obj);
    if (err) {
      free(ex.completion);
      err = lt_errf(errstr, n, err, "dataset line %zu: %s", line_no, msg);
      break;
    }
    if (seq.len < 2 || (int)seq.len > max_seq + 1) {
      free(ex.completion);
      err = lt_errf(errstr, n, LT_ERR_INVALID, "dataset line %zu: example has %zu tokens; it must have 2 to %d (max_seq_len + 1)",
                    line_no, seq.len, max_seq + 1);
      break;
    }
    ex.len = (int)seq.len;
    ex.ids = malloc(seq.len * sizeof *ex.ids);
    ex.w = malloc(seq.len * sizeof *ex.w);
    if (out->n == out->cap) {
      size_t cap = out->cap ? out->cap * 2 : 256;
      example_t *v = realloc(out->v, cap * sizeof *v);
      if (!v) err = LT_ERR_NOMEM;
      else {
        out->v = v;
        out->cap = cap;
      }
    }
    if (err || !ex.ids || !ex.w) {
      free(ex.ids);
      free(ex.w);
      free(ex.completion);
      err = LT_ERR_NOMEM;
      break;
    }
    memcpy(ex.ids, seq.ids, seq.len * sizeof *ex.ids);
    memcpy(ex.w, seq.weights, seq.len * sizeof *ex.w);
    out->v[out->n++] = ex;
  }
  lt_tok_seq_free(&seq);
  if (!err && out->n == 0) err = lt_errf(errstr, n, LT_ERR_INVALID, "the dataset has no examples");
  if (err) examples_free(out);
  return err;
}

/* ---------------------------------------------------------------- batches */

/* Buffers of one (B, T) batch, allocated once as one block. */
typedef struct {
  int B, T;
  void *block;
  int32_t *tokens, *targets, *positions;
  float *weights, *logp;
} batch_buf_t;

_Static_assert(sizeof(int32_t) == sizeof(float), "batch arrays share one block of 4-byte cells");

/* Carves the five (B, T) arrays from one zeroed block. */
static lt_err_t batch_alloc(batch_buf_t *b, int B, int T) {
  size_t N = (size_t)B * T;
  b->B = B;
  b->T = T;
  b->block = calloc(5 * N, sizeof(float));
  if (!b->block) return LT_ERR_NOMEM;
  b->tokens = b->block;
  b->targets = b->tokens + N;
  b->positions = b->targets + N;
  b->weights = (float *)(void *)(b->positions + N);
  b->logp = b->weights + N;
  return LT_OK;
}

static void batch_free(batch_buf_t *b) { free(b->block); }

/* Lays examples idx[0..count) (count <= b->B) into rows of b->T tokens: one row each when
 * one_per_row, else packed first-fit into as few rows as they fit, in the given order (so the
 * packing is a function of the data order: resumption repeats it). Each example keeps its own
 * positions 0, 1, ... (the engine's attention stays within it), so a packed step computes what
 * one row per example would, on fewer rows; padding continues the row's last example with
 * weight 0 (one per row: positions 0..T-1, the engine's default). Returns the rows used;
 * *tokens gets the weighted token count. */
static int batch_fill(batch_buf_t *b, const examples_t *ex, const uint32_t *idx, int count, bool one_per_row,
                      int64_t *tokens) {
  int used[1024] = {0}; /* tokens placed in each row; count <= b->B <= 1024 */
  int rows = 0;
  *tokens = 0;
  memset(b->tokens, 0, (size_t)b->B * b->T * sizeof *b->tokens);
  memset(b->targets, 0, (size_t)b->B * b->T * sizeof *b->targets);
  memset(b->weights, 0, (size_t)b->B * b->T * sizeof *b->weights);
  for (int i = 0; i < count; i++) {
    const example_t *e = &ex->v[idx[i]];
    int n = e->len - 1 < b->T ? e->len - 1 : b->T;
    int r = one_per_row ? rows : 0;
    while (r < rows && used[r] + n > b->T) r++;
    if (r == rows) rows++;
    size_t at = (size_t)r * b->T + (size_t)used[r];
    for (int t = 0; t < n; t++) {
      b->tokens[at + t] = e->ids[t];
      b->targets[at + t] = e->ids[t + 1];
      b->positions[at + t] = t;
      b->weights[at + t] = e->w[t + 1];
      *tokens += e->w[t + 1] > 0;
    }
    used[r] += n;
  }
  for (int r = 0; r < rows; r++) {
    int32_t *pos = b->positions + (size_t)r * b->T;
    for (int t = used[r]; t < b->T; t++) pos[t] = t > 0 ? pos[t - 1] + 1 : 0;
  }
  return rows;
}

/* ---------------------------------------------------------------- evaluation */

#define SAMPLES_KEPT 5

typedef struct {
  double loss_sum, weight_sum;
  int64_t correct, counted;
  int64_t em_n;
  uint8_t *em;                 /* per scored example, 0/1 */
  char *texts[SAMPLES_KEPT];   /* greedy outputs of the first examples (samples.json) */
} eval_acc_t;

static void acc_free(eval_acc_t *a) {
  free(a->em);
  for (int i = 0; i < SAMPLES_KEPT; i++) free(a->texts[i]);
  memset(a, 0, sizeof *a);
}

#define EVAL_T_STEP 64 /* evaluation rows are a multiple of this long (or the longest row) */

/* Validation examples by length, shortest first (ties by index): the batches of eval_split,
 * each as long as its own longest row (length-bucketed), not the dataset's. */
static int by_len(const void *x, const void *y, void *ctx) {
  const examples_t *val = ctx;
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  int la = val->v[a].len, lb = val->v[b].len;
  return la != lb ? (la > lb) - (la < lb) : (a > b) - (a < b);
}

/* Loss and token accuracy of the validation split through lt_eval_tokens (no B x T x V logits),
 * in length-bucketed batches of b->B rows; then greedy exact match. The sums are over tokens,
 * so they do not depend on how the examples were batched. */
static lt_err_t eval_split(lt_session_t *s, const lt_tok_t *tok, const examples_t *val, batch_buf_t *b,
                           int eval_max, int gen_max, eval_acc_t *acc, char *errstr, size_t n) {
  memset(acc, 0, sizeof *acc);
  uint32_t *order = malloc((val->n ? val->n : 1) * sizeof *order);
  int32_t *argmax = malloc((size_t)b->B * b->T * sizeof *argmax);
  lt_err_t err = order && argmax ? LT_OK : LT_ERR_NOMEM;
  for (size_t i = 0; i < val->n && order; i++) order[i] = (uint32_t)i;
  if (!err) qsort_r(order, val->n, sizeof *order, by_len, (void *)val);
  int T_all = b->T;
  for (size_t i = 0; i < val->n && !err; i += (size_t)b->B) {
    int count = (int)(val->n - i < (size_t)b->B ? val->n - i : (size_t)b->B);
    int T = 1;
    for (int r = 0; r < count; r++) {
      int len = val->v[order[i + (size_t)r]].len - 1;
      T = len > T ? len : T;
    }
    T = (T + EVAL_T_STEP - 1) / EVAL_T_STEP * EVAL_T_STEP; /* few shapes: the engine keeps its buffers */
    b->T = T < T_all ? T : T_all;
    int64_t unused;
    batch_fill(b, val, order + i, count, true, &unused);
    lt_batch_t eb = {.B = count, .T = b->T, .tokens = b->tokens, .targets = b->targets, .weights = b->weights,
                     .positions = b->positions};
    err = lt_eval_tokens(s, &eb, b->logp, argmax, errstr, n);
    for (size_t k = 0; !err && k < (size_t)count * b->T; k++) {
      float w = b->weights[k];
      if (w <= 0) continue;
      acc->loss_sum += -(double)b->logp[k] * w;
      acc->weight_sum += w;
      acc->correct += argmax[k] == b->targets[k];
      acc->counted++;
    }
  }
  b->T = T_all;
  free(order);
  free(argmax);
  if (err) return err;
  if (!val->prompt_completion) return LT_OK;
  /* Exact match of greedy generation on up to eval_max examples, in fixed order. */
  size_t m = val->n < (size_t)eval_max ? val->n : (size_t)eval_max;
  acc->em = calloc(m ? m : 1, 1);
  if (!acc->em) return LT_ERR_NOMEM;
  int32_t eos = lt_tok_eos_id(tok);
  lt_sample_params_t sp = {.max_tokens = gen_max, .temperature = 0, .top_p = 1, .stop = &eos, .n_stop = eos >= 0};
  enum { G = 16 };
  const int32_t *prompts[G];
  int plens[G], olens[G];
  int32_t *out = malloc((size_t)G * gen_max * sizeof *out);
  if (!out) return LT_ERR_NOMEM;
  for (size_t i = 0; i < m && !err; i += G) {
    int count = (int)(m - i < G ? m - i : G);
    for (int r = 0; r < count; r++) {
      prompts[r] = val->v[i + (size_t)r].ids;
      plens[r] = val->v[i + (size_t)r].prompt_len;
    }
    err = lt_sample(s, count, prompts, plens, &sp, out, NULL, olens, errstr, n);
    for (int r = 0; r < count && !err; r++) {
      int len = olens[r];
      if (len > 0 && out[r * gen_max + len - 1] == eos) len--;
      char *text = NULL;
      size_t tl = 0;
      err = lt_tok_decode(tok, out + r * gen_max, (size_t)len, 1, &text, &tl, errstr, n);
      if (err) break;
      const char *want = val->v[i + (size_t)r].completion;
      acc->em[i + (size_t)r] = (uint8_t)lt_task_exact_match(want, strlen(want), text, tl);
      if (i + (size_t)r < SAMPLES_KEPT) acc->texts[i + (size_t)r] = text;
      else free(text);
    }
  }
  free(out);
  acc->em_n = (int64_t)m;
  return err;
}

static double em_rate(const eval_acc_t *a) {
  if (a->em_n == 0) return -1;
  int64_t k = 0;
  for (int64_t i = 0; i < a->em_n; i++) k += a->em[i];
  return (double)k / (double)a->em_n;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

/* Percentile bootstrap of the exact-match rate: 1000 resamples, seeded. */
static void bootstrap(const eval_acc_t *a, uint64_t seed, double *lo, double *hi) {
  *lo = *hi = -1;
  if (a->em_n == 0) return;
  enum { R = 1000 };
  double *r = malloc(R * sizeof *r);
  if (!r) return;
  uint64_t s = seed ^ 0xb007b007ULL;
  for (int k = 0; k < R; k++) {
    int64_t hits = 0;
    for (int64_t i = 0; i < a->em_n; i++) hits += a->em[mix(&s) % (uint64_t)a->em_n];
    r[k] = (double)hits / (double)a->em_n;
  }
  qsort(r, R, sizeof *r, cmp_double);
  *lo = r[(int)(0.025 * R)];
  *hi = r[(int)(0.975 * R) - 1];
  free(r);
}

/* ---------------------------------------------------------------- the run */

static double lr_at(const lt_hparams_t *hp, int64_t step, int64_t total) {
  double lr = hp->learning_rate;
  if (hp->warmup_steps > 0 && step < hp->warmup_steps) return lr * (double)(step + 1) / (double)hp->warmup_steps;
  double span = (double)(total - hp->warmup_steps);
  double prog = span > 0 ? (double)(step - hp->warmup_steps) / span : 1.0;
  if (prog > 1) prog = 1;
  switch (hp->lr_schedule) {
  case LT_LR_LINEAR: return lr * (1.0 - prog);
  case LT_LR_CONSTANT: return lr;
  default: return lr * 0.5 * (1.0 + cos(M_PI * prog));
  }
}

/* The base weights' products in bf16: as conf.precision says when set (lathe train --precision),
 * else as the job's hyperparameter does, auto meaning bf16 on a GPU only. */
static bool bf16_base(const lt_train_conf_t *c) {
  if (c->precision) return strcmp(c->precision, "bf16") == 0;
  return c->hp.precision == LT_PRECISION_BF16 ||
         (c->hp.precision == LT_PRECISION_AUTO && c->backend && strcmp(c->backend, "cuda") == 0);
}

/* The config digest: SHA-256 of the canonical JSON of what determines the result. */
static json_t *config_json(const lt_train_conf_t *c, int gen_max) {
  lt_jobspec_t spec;
  lt_jobspec_defaults(&spec);
  snprintf(spec.base_model, sizeof spec.base_model, "%s", c->base_model_name ? c->base_model_name : "base");
  snprintf(spec.dataset_id, sizeof spec.dataset_id, "dataset");
  spec.hp = c->hp;
  spec.hp.precision = LT_PRECISION_AUTO; /* what ran, not what was asked, goes in: "precision" below */
  json_t *full = lt_jobspec_to_json(&spec);
  json_t *hp = json_incref(json_object_get(full, "hyperparameters"));
  json_decref(full);
  json_t *o = json_pack("{s:s,s:s,s:o,s:{s:s,s:i,s:f},s:s,s:i}", "base_model", spec.base_model, "dataset_sha256",
                        c->dataset_sha256, "hyperparameters", hp, "decoding", "strategy", "greedy", "max_tokens",
                        gen_max, "temperature", 0.0, "backend", c->backend ? c->backend : "cpu", "threads",
                        c->threads > 0 ? c->threads : 1);
  if (o && bf16_base(c)) json_object_set_new(o, "precision", json_string("bf16")); /* f32 runs keep their digest */
  return o;
}

/* One run, from the model it loads to where its loop stands. */
typedef struct {
  const lt_train_conf_t *conf;
  const lt_hparams_t *hp;
  const lt_train_hooks_t *hooks; /* may be NULL */
  lt_train_result_t *out;
  lt_backend_t *be;
  lt_engine_t *eng;
  const lt_model_config_t *mc;
  lt_tok_t *tok;
  examples_t train, val;   /* validation examples are moved out of train, not copied */
  int T;                   /* batch row length: the longest example */
  int gen_max, eval_max;   /* greedy generation budget; examples scored by generation */
  int64_t total;           /* optimizer steps of the whole run */
  batch_buf_t b, vb;       /* a training and an evaluation batch */
  lt_session_config_t sc;
  lt_session_t *sess;
  eval_acc_t base_acc;     /* the base model's scores on the validation split */
  json_t *metrics;         /* steps so far */
  json_t *config;
  char digest[65];
  lt_train_eval_t last_eval;
  bool have_eval;
  json_t *samples;         /* [{prompt, expected, base, fine_tuned}] once the final eval ran */
  /* Where the loop stands: all of it but the clocks is in a checkpoint or follows from one. */
  uint32_t *order;         /* this epoch's shuffled example order */
  uint64_t cursor;         /* examples consumed since the start of training (the data cursor) */
  uint64_t epoch_loaded;   /* the epoch order holds (UINT64_MAX: none yet) */
  int64_t step;
  lt_adamw_t opt;
  int64_t t0, last_ckpt_ms, ckpt_every_ms, tokens_total;
  int rank, world;         /* of the gang (conf->dp); 0 and 1 alone */
  float *gang_host;        /* the gradients on the host for the gang's sum (gang_reduce) */
  size_t gang_n;           /* its floats */
} run_t;

static json_t *eval_json(const lt_train_eval_t *e, const char *digest) {
  json_t *m = json_pack("{s:f,s:f,s:f}", "val_loss", e->val_loss, "perplexity", e->perplexity, "token_accuracy",
                        e->token_accuracy);
  json_t *b = json_pack("{s:f,s:f,s:f}", "val_loss", e->base_val_loss, "perplexity", e->base_perplexity,
                        "token_accuracy", e->base_token_accuracy);
  if (e->exact_match >= 0) {
    json_object_set_new(m, "exact_match", json_real(e->exact_match));
    json_object_set_new(m, "exact_match_ci95", json_pack("[f,f]", e->em_ci_low, e->em_ci_high));
    json_object_set_new(b, "exact_match", json_real(e->base_exact_match));
  }
  return json_pack("{s:I,s:b,s:I,s:o,s:o,s:s}", "step", (json_int_t)e->step, "final", e->final, "examples",
                   (json_int_t)e->examples, "fine_tuned", m, "base", b, "config_digest", digest);
}

static lt_err_t checkpoint(run_t *r, bool final, char *errstr, size_t n) {
  const char *dir = r->conf->work_dir;
  char path[4096];
  snprintf(path, sizeof path, "%s/state.bin", dir);
  lt_err_t err = lt_save_state(r->sess, path, r->cursor, errstr, n);
  char base_ref[256];
  lt_train_base_ref(r->conf->model_dir, r->conf->base_model_name ? r->conf->base_model_name : "base", base_ref,
                    sizeof base_ref);
  if (!err) err = lt_export_peft(r->sess, dir, base_ref, errstr, n);
  if (!err) err = write_json(dir, "metrics.json", r->metrics, errstr, n);
  json_t *ev = r->have_eval ? eval_json(&r->last_eval, r->digest) : json_object();
  if (!err) err = write_json(dir, "eval.json", ev, errstr, n);
  json_decref(ev);
  /* recompute: the batches' activations did not fit for every layer at once, so each layer ran
   * its forward pass again in backward (slower; the same adapter, bit for bit) */
  json_t *cfg = json_pack("{s:s,s:O,s:b}", "config_digest", r->digest, "config", r->config, "recompute",
                          lt_session_recomputes(r->sess));
  if (!err) err = write_json(dir, "lathe_run.json", cfg, errstr, n);
  json_decref(cfg);
  json_t *samples = r->samples ? json_incref(r->samples) : json_array();
  if (!err) err = write_json(dir, "samples.json", samples, errstr, n);
  json_decref(samples);
  const lt_train_hooks_t *hooks = r->hooks;
  if (!err && hooks && hooks->on_checkpoint) err = hooks->on_checkpoint(hooks->ctx, dir, r->step, final, errstr, n);
  return err;
}

/* ---------------------------------------------------------------- the run's setup */

/* The backend, the base model and its tokenizer. */
static lt_err_t open_model(run_t *r, char *errstr, size_t n) {
  const lt_train_conf_t *c = r->conf;
  char path[4096];
  lt_err_t err;
  if (c->precision && !bf16_base(c) && strcmp(c->precision, "f32") != 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "precision must be \"f32\" or \"bf16\", not \"%.40s\"", c->precision);
  if (c->backend && strcmp(c->backend, "cpu") != 0 && strcmp(c->backend, "cuda") != 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "backend must be \"cpu\" or \"cuda\", not \"%.40s\"", c->backend);
  if (c->backend && strcmp(c->backend, "cuda") == 0) {
    /* bf16: the mapped weights' products on tensor cores, f32 accumulation (lt_backend_cuda.h) */
    lt_cuda_opts_t o = {.bf16 = bf16_base(c)};
    err = lt_backend_cuda_new_opts(c->device, &o, &r->be, errstr, n);
  } else {
    /* every mapped weight: the norms never reach a product, the rest all do */
    lt_cpu_opts_t o = {.threads = c->threads > 0 ? c->threads : 1, .amx_bf16 = bf16_base(c), .bf16_min_elems = 1};
    err = lt_backend_cpu_new_opts(&o, &r->be, errstr, n);
  }
  if (err) return err;
  if ((err = lt_engine_open(c->model_dir, r->be, &r->eng, errstr, n))) return err;
  r->mc = lt_engine_config(r->eng);
  snprintf(path, sizeof path, "%s/tokenizer.json", c->model_dir);
  return lt_tok_load_file(path, &r->tok, errstr, n);
}

/* Moves a seeded share of the training examples to the validation split: the same examples on
 * every attempt. */
static lt_err_t hold_out(run_t *r) {
  examples_t *all = &r->train, *val = &r->val;
  size_t nv = (size_t)((double)all->n * r->hp->validation_fraction + 0.5);
  if (nv == 0 && all->n > 1 && r->hp->validation_fraction > 0) nv = 1;
  if (nv >= all->n) nv = all->n - 1;
  uint32_t *perm = malloc(all->n * sizeof *perm);
  if (!perm) return LT_ERR_NOMEM;
  for (size_t i = 0; i < all->n; i++) perm[i] = (uint32_t)i;
  shuffle(perm, all->n, (uint64_t)r->hp->seed ^ 0x5eedULL);
  examples_t t2 = {.prompt_completion = all->prompt_completion};
  val->prompt_completion = all->prompt_completion;
  t2.v = malloc((all->n - nv) * sizeof *t2.v);
  val->v = malloc((nv ? nv : 1) * sizeof *val->v);
  if (!t2.v || !val->v) {
    free(perm);
    free(t2.v);
    return LT_ERR_NOMEM;
  }
  for (size_t i = 0; i < all->n; i++) {
    if (i < nv) val->v[val->n++] = all->v[perm[i]];
    else t2.v[t2.n++] = all->v[perm[i]];
  }
  free(perm);
  free(all->v);
  *all = t2;
  all->cap = all->n;
  val->cap = val->n;
  return LT_OK;
}

/* Tokenises both splits (the validation one given or held out), then sizes the run from them:
 * row length, generation budget, batches, steps. */
static lt_err_t read_examples(run_t *r, char *errstr, size_t n) {
  const lt_train_conf_t *c = r->conf;
  const lt_hparams_t *hp = r->hp;
  int max_seq = hp->max_seq_len < r->mc->max_position ? hp->max_seq_len : r->mc->max_position;
  lt_err_t err = tokenize(r->tok, c->train, c->train_len, max_seq, &r->train, errstr, n);
  if (err) return err;
  err = c->valid ? tokenize(r->tok, c->valid, c->valid_len, max_seq, &r->val, errstr, n) : hold_out(r);
  if (err) return err;
  const examples_t *train = &r->train, *val = &r->val;
  r->T = 1;
  for (size_t i = 0; i < train->n; i++) r->T = train->v[i].len - 1 > r->T ? train->v[i].len - 1 : r->T;
  for (size_t i = 0; i < val->n; i++) r->T = val->v[i].len - 1 > r->T ? val->v[i].len - 1 : r->T;
  r->gen_max = c->gen_max_tokens;
  if (r->gen_max <= 0) {
    r->gen_max = 8;
    for (size_t i = 0; i < val->n; i++) {
      int cl = val->v[i].len - val->v[i].prompt_len + 8;
      r->gen_max = cl > r->gen_max ? cl : r->gen_max;
    }
  }
  int B = hp->batch_size;
  if ((err = batch_alloc(&r->b, B, r->T)) || (err = batch_alloc(&r->vb, B < 16 ? B : 16, r->T)))
    return err;
  int64_t per_step = (int64_t)B * hp->grad_accum;
  r->total = hp->max_steps > 0 ? hp->max_steps
                               : (int64_t)ceil((double)hp->epochs * (double)train->n / (double)per_step);
  if (r->total < 1) r->total = 1;
  return LT_OK;
}

/* The adapter session, the config digest, and the state resumed from, if any. */
void lt_train_session_config(const lt_hparams_t *hp, lt_session_config_t *out) {
  *out = (lt_session_config_t){.rank = hp->lora_rank, .alpha = (float)hp->lora_alpha,
                               .dropout = (float)hp->lora_dropout, .targets = hp->target_modules,
                               .seed = (uint64_t)hp->seed};
}

static lt_err_t start_session(run_t *r, char *errstr, size_t n) {
  lt_train_session_config(r->hp, &r->sc);
  lt_err_t err = lt_session_new(r->eng, &r->sc, &r->sess, errstr, n);
  if (err) return err;
  r->metrics = json_array();
  r->config = config_json(r->conf, r->gen_max);
  char *canon = json_dumps(r->config, JSON_COMPACT | JSON_SORT_KEYS);
  uint8_t d[32];
  unsigned dl;
  EVP_Digest(canon, strlen(canon), d, &dl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(r->digest + 2 * i, 3, "%02x", d[i]);
  free(canon);
  memcpy(r->out->config_digest, r->digest, sizeof r->digest);
  r->cursor = 0;
  if (r->conf->resume_state) return lt_load_state(r->sess, r->conf->resume_state, &r->cursor, errstr, n);
  return LT_OK;
}

/* The base model's scores: a fresh adapter has B = 0, so it computes exactly the base. */
static lt_err_t score_base(run_t *r, char *errstr, size_t n) {
  r->eval_max = r->conf->eval_max_examples > 0 ? r->conf->eval_max_examples : 200;
  if (r->val.n == 0 || r->rank != 0) return LT_OK;
  lt_session_t *base = NULL;
  lt_err_t err = lt_session_new(r->eng, &r->sc, &base, errstr, n);
  if (err) return err;
  err = eval_split(base, r->tok, &r->val, &r->vb, r->eval_max, r->gen_max, &r->base_acc, errstr, n);
  lt_session_destroy(base);
  return err;
}

/* The loop's starting point: the session's step, the optimizer, the clocks. */
static lt_err_t prepare_loop(run_t *r) {
  const lt_hparams_t *hp = r->hp;
  r->order = malloc(r->train.n * sizeof *r->order);
  if (!r->order) return LT_ERR_NOMEM;
  r->t0 = lt_time_mono_ms();
  r->last_ckpt_ms = lt_time_mono_ms();
  r->tokens_total = 0;
  r->ckpt_every_ms = r->conf->checkpoint_every_ms ? r->conf->checkpoint_every_ms
                                                  : (int64_t)hp->checkpoint_interval_s * 1000;
  r->epoch_loaded = UINT64_MAX;
  r->step = lt_session_step(r->sess);
  r->opt = (lt_adamw_t){.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = (float)hp->weight_decay,
                        .max_grad_norm = 1.0f};
  return LT_OK;
}

static void run_free(run_t *r) {
  acc_free(&r->base_acc);
  json_decref(r->samples);
  free(r->order);
  batch_free(&r->b);
  batch_free(&r->vb);
  json_decref(r->metrics);
  json_decref(r->config);
  if (r->gang_host) explicit_bzero(r->gang_host, r->gang_n * sizeof(float)); /* a tenant's gradients */
  free(r->gang_host);
  lt_session_destroy(r->sess);
  examples_free(&r->train);
  examples_free(&r->val);
  lt_tok_destroy(r->tok);
  lt_engine_close(r->eng);
  lt_backend_destroy(r->be);
}

/* ---------------------------------------------------------------- one step */

/* The next count example indices in the data order: each epoch is shuffled from the seed and the
 * epoch number, so the order depends only on the cursor (resumption repeats it). */
static void next_examples(run_t *r, uint32_t *idx, int count) {
  const examples_t *train = &r->train;
  for (int k = 0; k < count; k++) {
    uint64_t epoch = r->cursor / train->n;
    if (epoch != r->epoch_loaded) {
      for (size_t i = 0; i < train->n; i++) r->order[i] = (uint32_t)i;
      shuffle(r->order, train->n, (uint64_t)r->hp->seed * 1000003ULL + epoch);
      r->epoch_loaded = epoch;
    }
    idx[k] = r->order[r->cursor % train->n];
    r->cursor++;
  }
}

/* The gang's step (lt_train_conf_t.dp): every rank's gradients summed in rank order, the count
 * of micro-batches and of calls one executor would have, and the loss and tokens of the whole
 * step (tokens in two exact halves: a float holds integers up to 2^24). On the cpu backend the
 * buffer is host memory and is summed in place; elsewhere (cuda: device memory) the gradients
 * are downloaded into a host buffer, summed over the gang's connections and uploaded. */
static lt_err_t gang_reduce(run_t *r, uint64_t calls0, double *loss_sum, int64_t *step_tokens, char *errstr,
                            size_t n) {
  size_t np;
  float *g = lt_session_grad_buffer(r->sess, &np);
  lt_err_t err;
  if (!strcmp(r->be->name, "cpu")) {
    err = lt_dp_allreduce_sum(r->conf->dp, g, np, errstr, n);
  } else {
    if (!r->gang_host && !(r->gang_host = malloc(np * sizeof(float))))
      return lt_errf(errstr, n, LT_ERR_NOMEM, "gang: no memory for %zu gradients on the host", np);
    r->gang_n = np;
    if ((err = r->be->download(r->be, r->gang_host, g, np * sizeof(float))))
      return lt_errf(errstr, n, err, "gang: gradients to the host: %s", r->be->last_error(r->be));
    if (!(err = lt_dp_allreduce_sum(r->conf->dp, r->gang_host, np, errstr, n)) &&
        (err = r->be->upload(r->be, g, r->gang_host, np * sizeof(float))))
      return lt_errf(errstr, n, err, "gang: the sum back to the backend: %s", r->be->last_error(r->be));
  }
  if (err) return err;
  float sums[3] = {(float)*loss_sum, (float)(*step_tokens >> 16), (float)(*step_tokens & 0xffff)};
  if ((err = lt_dp_allreduce_sum(r->conf->dp, sums, 3, errstr, n))) return err;
  *loss_sum = sums[0];
  *step_tokens = ((int64_t)sums[1] << 16) + (int64_t)sums[2];
  lt_session_set_call_index(r->sess, calls0 + (uint64_t)r->hp->grad_accum);
  return lt_session_set_accum(r->sess, r->hp->grad_accum, errstr, n);
}

/* The ranks' verdict on the hooks' should_stop before a step: one rank's cancel stops all,
 * else one rank's preemption does; so every rank stops at the same step boundary. */
static lt_err_t gang_vote(run_t *r, lt_train_stop_t *why, char *errstr, size_t n) {
  const lt_train_hooks_t *hooks = r->hooks;
  lt_train_stop_t mine = hooks && hooks->should_stop ? hooks->should_stop(hooks->ctx) : LT_TRAIN_GO;
  float v[2] = {mine == LT_TRAIN_STOP_CANCEL, mine == LT_TRAIN_STOP_PREEMPT};
  lt_err_t err = lt_dp_allreduce_sum(r->conf->dp, v, 2, errstr, n);
  *why = err ? LT_TRAIN_GO : v[0] > 0 ? LT_TRAIN_STOP_CANCEL : v[1] > 0 ? LT_TRAIN_STOP_PREEMPT : LT_TRAIN_GO;
  return err;
}

/* The forward and backward passes of one step's micro-batches, gradients accumulated. The hooks
 * may stop it before any micro-batch (*why says why): a cancel at once, a preemption only before
 * the first, so that the step it leaves is whole. */
static lt_err_t accumulate(run_t *r, double *loss_sum, int64_t *step_tokens, lt_train_stop_t *why, char *errstr,
                           size_t n) {
  const lt_train_hooks_t *hooks = r->hooks;
  const lt_train_conf_t *c = r->conf;
  uint64_t calls0 = lt_session_call_index(r->sess);
  *loss_sum = 0;
  *step_tokens = 0;
  for (int micro = 0; micro < r->hp->grad_accum; micro++) {
    *why = hooks && hooks->should_stop && !c->dp ? hooks->should_stop(hooks->ctx) : LT_TRAIN_GO;
    if (*why == LT_TRAIN_STOP_PREEMPT && micro > 0) *why = LT_TRAIN_GO;
    if (*why != LT_TRAIN_GO) return LT_OK;
    uint32_t idx[1024];
    int count = r->hp->batch_size;
    next_examples(r, idx, count);
    if (micro % r->world != r->rank) continue; /* another rank's micro-batch */
    if (c->dp) lt_session_set_call_index(r->sess, calls0 + (uint64_t)micro);
    int64_t micro_tokens = 0;
    int rows = batch_fill(&r->b, &r->train, idx, count, c->one_row_per_example, &micro_tokens);
    *step_tokens += micro_tokens;
    r->out->rows += rows;
    r->out->examples += count;
    lt_batch_t batch = {.B = rows, .T = r->T, .tokens = r->b.tokens, .targets = r->b.targets,
                        .weights = r->b.weights, .positions = c->one_row_per_example ? NULL : r->b.positions};
    if (hooks && hooks->on_batch) hooks->on_batch(hooks->ctx, r->step + 1, micro, &batch);
    float loss = 0;
    lt_err_t err = lt_forward_backward(r->sess, &batch, LT_LOSS_CROSS_ENTROPY, &loss, NULL, errstr, n);
    if (err) return err;
    *loss_sum += loss;
  }
  return c->dp ? gang_reduce(r, calls0, loss_sum, step_tokens, errstr, n) : LT_OK;
}

/* The step's numbers: into metrics.json and to the hooks. */
static void report_step(run_t *r, double loss_sum, int64_t step_tokens, float gnorm) {
  int64_t el = lt_time_mono_ms() - r->t0;
  lt_train_step_t st = {.step = r->step, .total_steps = r->total, .loss = loss_sum / r->hp->grad_accum,
                        .learning_rate = r->opt.lr, .grad_norm = gnorm, .tokens = step_tokens,
                        .tokens_total = r->tokens_total, .elapsed_ms = el,
                        .epoch = (double)r->cursor / (double)r->train.n};
  st.tokens_per_s = el > 0 ? (double)r->tokens_total * 1000.0 / (double)el : 0;
  st.eta_ms = r->step > 0 ? el * (r->total - r->step) / r->step : 0;
  json_array_append_new(r->metrics, json_pack("{s:I,s:f,s:f,s:f,s:I}", "step", (json_int_t)r->step, "loss", st.loss,
                                              "learning_rate", st.learning_rate, "grad_norm", st.grad_norm,
                                              "tokens", (json_int_t)step_tokens));
  if (r->hooks && r->hooks->on_step) r->hooks->on_step(r->hooks->ctx, &st);
}

/* One optimizer step: its micro-batches, the update (once the hooks allow it), its report. */
static lt_err_t train_step(run_t *r, lt_train_stop_t *why, char *errstr, size_t n) {
  const lt_train_hooks_t *hooks = r->hooks;
  double loss_sum;
  int64_t step_tokens;
  lt_err_t err = r->conf->dp ? gang_vote(r, why, errstr, n) : LT_OK;
  if (err || *why != LT_TRAIN_GO) return err;
  err = accumulate(r, &loss_sum, &step_tokens, why, errstr, n);
  if (err || *why != LT_TRAIN_GO) return err;
  if (hooks && hooks->before_update && (err = hooks->before_update(hooks->ctx, errstr, n))) return err;
  r->opt.lr = (float)lr_at(r->hp, r->step, r->total);
  if (hooks && hooks->on_update) hooks->on_update(hooks->ctx, r->step + 1, &r->opt);
  float gnorm = 0;
  if ((err = lt_optim_step(r->sess, &r->opt, &gnorm, errstr, n))) return err;
  r->step = lt_session_step(r->sess);
  r->tokens_total += step_tokens;
  report_step(r, loss_sum, step_tokens, gnorm);
  return LT_OK;
}

/* A few outputs beside the base model's: what the customer sees in samples.json. */
static void keep_samples(run_t *r, const eval_acc_t *acc) {
  const examples_t *val = &r->val;
  json_decref(r->samples);
  r->samples = json_array();
  for (size_t k = 0; k < SAMPLES_KEPT && k < val->n; k++) {
    char *prompt = NULL;
    size_t pl = 0;
    if (lt_tok_decode(r->tok, val->v[k].ids, (size_t)val->v[k].prompt_len, 1, &prompt, &pl, NULL, 0)) continue;
    json_array_append_new(r->samples, json_pack("{s:s,s:s,s:s,s:s}", "prompt", prompt, "expected",
                                                val->v[k].completion, "base",
                                                r->base_acc.texts[k] ? r->base_acc.texts[k] : "", "fine_tuned",
                                                acc->texts[k] ? acc->texts[k] : ""));
    free(prompt);
  }
}

/* Scores the adapter on the validation split beside the base model, at the eval interval and
 * after the last step. */
static lt_err_t evaluate(run_t *r, bool last, char *errstr, size_t n) {
  const lt_hparams_t *hp = r->hp;
  bool due = last || (hp->eval_interval > 0 && r->step % hp->eval_interval == 0);
  if (!due || r->val.n == 0 || r->rank != 0) return LT_OK;
  eval_acc_t acc;
  const eval_acc_t *base = &r->base_acc;
  lt_err_t err = eval_split(r->sess, r->tok, &r->val, &r->vb, r->eval_max, r->gen_max, &acc,
                            errstr, n);
  if (!err) {
    lt_train_eval_t ev = {.step = r->step, .final = last, .examples = (int64_t)r->val.n};
    memcpy(ev.config_digest, r->digest, sizeof ev.config_digest);
    ev.val_loss = acc.weight_sum > 0 ? acc.loss_sum / acc.weight_sum : 0;
    ev.perplexity = exp(ev.val_loss);
    ev.token_accuracy = acc.counted ? (double)acc.correct / (double)acc.counted : 0;
    ev.exact_match = em_rate(&acc);
    bootstrap(&acc, (uint64_t)hp->seed, &ev.em_ci_low, &ev.em_ci_high);
    ev.base_val_loss = base->weight_sum > 0 ? base->loss_sum / base->weight_sum : 0;
    ev.base_perplexity = exp(ev.base_val_loss);
    ev.base_token_accuracy = base->counted ? (double)base->correct / (double)base->counted : 0;
    ev.base_exact_match = em_rate(base);
    r->last_eval = ev;
    r->have_eval = true;
    if (last) r->out->final_eval = ev;
    if (last && r->val.prompt_completion) keep_samples(r, &acc);
    if (r->hooks && r->hooks->on_eval) r->hooks->on_eval(r->hooks->ctx, &ev);
  }
  acc_free(&acc);
  return err;
}

/* A checkpoint after the last step, every checkpoint_interval steps and every ckpt_every_ms. */
static lt_err_t maybe_checkpoint(run_t *r, bool last, char *errstr, size_t n) {
  const lt_hparams_t *hp = r->hp;
  bool by_steps = hp->checkpoint_interval > 0 && r->step % hp->checkpoint_interval == 0;
  bool by_time = r->ckpt_every_ms > 0 && lt_time_mono_ms() - r->last_ckpt_ms >= r->ckpt_every_ms;
  if ((!last && !by_steps && !by_time) || r->rank != 0) return LT_OK;
  lt_err_t err = checkpoint(r, last, errstr, n);
  if (err) return err;
  r->out->last_checkpoint_step = r->step;
  r->last_ckpt_ms = lt_time_mono_ms();
  return LT_OK;
}

/* The hooks stopped the run before a step: a preempted run leaves a checkpoint of the last
 * completed step to resume from — the one that step made already, if it made one (a second of
 * the same step would be sealed under the same object keys as the first). */
static lt_err_t stop_run(run_t *r, lt_train_stop_t why, char *errstr, size_t n) {
  lt_err_t err = LT_OK;
  r->out->stopped = why;
  if (why == LT_TRAIN_STOP_PREEMPT && r->step > 0 && r->rank == 0 && r->out->last_checkpoint_step != r->step) {
    err = checkpoint(r, false, errstr, n);
    if (!err) r->out->last_checkpoint_step = r->step;
  }
  r->out->steps = r->step;
  return err;
}

lt_err_t lt_train_run(const lt_train_conf_t *c, const lt_train_hooks_t *hooks, lt_train_result_t *out, char *errstr,
                      size_t n) {
  memset(out, 0, sizeof *out);
  out->last_checkpoint_step = -1;
  run_t r = {.conf = c, .hp = &c->hp, .hooks = hooks, .out = out, .world = 1};
  if (c->dp) {
    r.rank = lt_dp_rank(c->dp);
    r.world = lt_dp_world(c->dp);
  }
  lt_err_t err = open_model(&r, errstr, n);
  if (!err) err = read_examples(&r, errstr, n);
  if (!err) err = start_session(&r, errstr, n);
  if (!err) err = score_base(&r, errstr, n);
  if (!err) err = prepare_loop(&r);
  /* Resumed at its last step: the final checkpoint it resumed from was committed by an attempt
   * lost before the job's completion was recorded. It is written again (evaluated, checkpointed)
   * under this attempt, whose final commit the worker completes the job with and the publisher
   * promotes; without it every retry resumed there and failed. */
  if (!err && r.step >= r.total && !(err = evaluate(&r, true, errstr, n))) err = maybe_checkpoint(&r, true, errstr, n);
  while (!err && r.step < r.total) {
    lt_train_stop_t why = LT_TRAIN_GO;
    if ((err = train_step(&r, &why, errstr, n))) break;
    if (why != LT_TRAIN_GO) {
      err = stop_run(&r, why, errstr, n);
      run_free(&r);
      return err;
    }
    bool last = r.step >= r.total;
    if (!(err = evaluate(&r, last, errstr, n))) err = maybe_checkpoint(&r, last, errstr, n);
  }
  if (!err) {
    out->steps = r.step;
    out->stopped = LT_TRAIN_GO;
  }
  run_free(&r);
  return err;
}

/* ---------------------------------------------------------------- pretraining */

void lt_train_default_model(lt_model_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->vocab_size = LT_TASK_BUNDLE_VOCAB;
  cfg->hidden_size = 192;
  cfg->intermediate_size = 512;
  cfg->num_layers = 4;
  cfg->num_heads = 6;
  cfg->num_kv_heads = 2;
  cfg->head_dim = 32;
  cfg->max_position = 256;
  cfg->rms_norm_eps = 1e-5f;
  cfg->rope_theta = 10000.0f;
  cfg->rope_linear_factor = 1.0f;
  cfg->tie_embeddings = 1;
}

lt_err_t lt_train_read_file(const char *path, char **out, size_t *len, char *errstr, size_t n) {
  FILE *f = fopen(path, "rb");
  if (!f) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)sz + 1);
  if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
    free(buf);
    fclose(f);
    return lt_errf(errstr, n, LT_ERR_IO, "%s: read failed", path);
  }
  fclose(f);
  buf[sz] = '\0';
  *out = buf;
  *len = (size_t)sz;
  return LT_OK;
}

lt_err_t lt_train_pretrain(const lt_pretrain_conf_t *c, char *errstr, size_t n) {
  char path[4096], tmp_dir[4096];
  char *corpus = NULL, *tokjson = NULL;
  size_t corpus_len = 0, tokjson_len = 0;
  lt_tok_t *tok = NULL;
  lt_tok_seq_t seq;
  lt_tok_seq_init(&seq);
  lt_backend_t *be = NULL;
  lt_engine_t *eng = NULL;
  lt_session_t *s = NULL;
  batch_buf_t b = {0};
  lt_err_t err;
  snprintf(path, sizeof path, "%s/corpus.txt", c->bundle_dir);
  if ((err = lt_train_read_file(path, &corpus, &corpus_len, errstr, n))) goto out;
  snprintf(path, sizeof path, "%s/tokenizer.json", c->bundle_dir);
  if ((err = lt_train_read_file(path, &tokjson, &tokjson_len, errstr, n))) goto out;
  if ((err = lt_tok_load_json(tokjson, tokjson_len, &tok, errstr, n))) goto out;
  /* Special tokens in the corpus (<|endoftext|> between documents) are real tokens here. */
  if ((err = lt_tok_encode(tok, corpus, corpus_len, LT_TOK_SPECIAL, 1.0f, &seq, errstr, n))) goto out;
  lt_model_config_t mc = c->model;
  mc.vocab_size = lt_tok_vocab_size(tok);
  snprintf(tmp_dir, sizeof tmp_dir, "%s.init", c->out_dir);
  mkdir(tmp_dir, 0755);
  if ((err = lt_model_init_random(&mc, tmp_dir, c->seed, 0.02f, 0.0f, errstr, n))) goto out;
  if ((err = lt_backend_cpu_new(c->threads > 0 ? c->threads : 1, &be, errstr, n))) goto out;
  if ((err = lt_engine_open(tmp_dir, be, &eng, errstr, n))) goto out;
  lt_session_config_t sc = {.full = 1, .rank = 1, .alpha = 1, .targets = LT_TARGET_ALL, .seed = c->seed};
  if ((err = lt_session_new(eng, &sc, &s, errstr, n))) goto out;
  int B = c->batch, T = c->seq_len;
  if ((err = batch_alloc(&b, B, T))) goto out;
  size_t windows = (seq.len - 1) / (size_t)T;
  if (windows < (size_t)B) {
    err = lt_errf(errstr, n, LT_ERR_INVALID, "the corpus has %zu tokens: too few for batches of %dx%d", seq.len, B, T);
    goto out;
  }
  uint32_t *order = malloc(windows * sizeof *order);
  if (!order) {
    err = LT_ERR_NOMEM;
    goto out;
  }
  uint64_t cursor = 0, epoch_loaded = UINT64_MAX;
  int64_t t0 = lt_time_mono_ms();
  for (int64_t step = 0; step < c->steps; step++) {
    for (int r = 0; r < B; r++) {
      uint64_t epoch = cursor / windows;
      if (epoch != epoch_loaded) {
        for (size_t i = 0; i < windows; i++) order[i] = (uint32_t)i;
        shuffle(order, windows, c->seed + epoch);
        epoch_loaded = epoch;
      }
      size_t w = order[cursor % windows];
      cursor++;
      memcpy(b.tokens + r * T, seq.ids + w * (size_t)T, (size_t)T * sizeof(int32_t));
      memcpy(b.targets + r * T, seq.ids + w * (size_t)T + 1, (size_t)T * sizeof(int32_t));
      for (int t = 0; t < T; t++) b.weights[r * T + t] = 1.0f;
    }
    lt_batch_t batch = {.B = B, .T = T, .tokens = b.tokens, .targets = b.targets, .weights = b.weights};
    float loss = 0;
    if ((err = lt_forward_backward(s, &batch, LT_LOSS_CROSS_ENTROPY, &loss, NULL, errstr, n))) break;
    lt_hparams_t hp = {.learning_rate = c->learning_rate, .warmup_steps = (int32_t)(c->steps / 20 + 1),
                       .lr_schedule = LT_LR_COSINE};
    lt_adamw_t opt = {.lr = (float)lr_at(&hp, step, c->steps), .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                      .weight_decay = 0.01f, .max_grad_norm = 1.0f};
    if ((err = lt_optim_step(s, &opt, NULL, errstr, n))) break;
    if (c->on_step) {
      int64_t el = lt_time_mono_ms() - t0;
      c->on_step(c->ctx, step + 1, c->steps, loss, el > 0 ? (double)(step + 1) * B * T * 1000.0 / (double)el : 0);
    }
  }
  free(order);
  if (!err) err = lt_export_model(s, c->out_dir, errstr, n);
  if (!err) err = write_file(c->out_dir, "tokenizer.json", tokjson, errstr, n);
  if (!err) err = lt_train_write_chat_config(c->out_dir, errstr, n);
out:
  batch_free(&b);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
  lt_tok_seq_free(&seq);
  lt_tok_destroy(tok);
  free(corpus);
  free(tokjson);
  return err;
}

void lt_train_base_ref(const char *model_dir, const char *name, char *out, size_t n) {
  snprintf(out, n, "%s", name);
  char path[4200], *text = NULL;
  size_t len;
  snprintf(path, sizeof path, "%s/config.json", model_dir ? model_dir : ".");
  if (!model_dir || lt_train_read_file(path, &text, &len, NULL, 0)) return;
  json_t *cfg = json_loadb(text, len, 0, NULL);
  free(text);
  const char *id = json_string_value(json_object_get(cfg, "_name_or_path"));
  /* "org/name" as the Hub spells ids: one slash, no path (a local save records its directory). */
  if (id && strlen(id) < n && strchr(id, '/') && strchr(id, '/') == strrchr(id, '/') && id[0] != '/' && id[0] != '.' &&
      strspn(id, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/") == strlen(id))
    snprintf(out, n, "%s", id);
  json_decref(cfg);
}
