/* lt_prim: a session's compute calls, checked, on the engine's primitives (see lt_prim.h). */
#include "lt_prim.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- errors */

static lt_err_t bad(lt_prim_out_t *out, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static lt_err_t bad(lt_prim_out_t *out, const char *field, const char *fmt, ...) {
  snprintf(out->code, sizeof out->code, "invalid");
  snprintf(out->field, sizeof out->field, "%s", field);
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(out->reason, sizeof out->reason, "%s: %s", field, msg);
  return LT_ERR_INVALID;
}

/* An engine failure: bad input the checks here did not see is still the caller's ("invalid");
 * anything else is ours. */
static lt_err_t engine_failed(lt_prim_out_t *out, lt_err_t err, const char *field, const char *msg) {
  snprintf(out->code, sizeof out->code, "%s", err == LT_ERR_INVALID ? "invalid" : "internal");
  snprintf(out->field, sizeof out->field, "%s", field);
  snprintf(out->reason, sizeof out->reason, "%s", msg);
  return err;
}

/* ---------------------------------------------------------------- reading numbers */

/* A number field of an object: *v keeps its default when absent; min/max inclusive. */
static lt_err_t opt_num(const json_t *o, const char *name, const char *path, double min, double max, double *v,
                        lt_prim_out_t *out) {
  const json_t *j = json_object_get(o, name);
  if (!j) return LT_OK;
  if (!json_is_number(j)) return bad(out, path, "must be a number");
  double d = json_number_value(j);
  if (!isfinite(d) || d < min || d > max) return bad(out, path, "%g is outside [%g, %g]", d, min, max);
  *v = d;
  return LT_OK;
}

/* An array of numbers into dst (n entries): whole numbers in [lo, hi) when ints, else finite. */
static lt_err_t num_array(const json_t *a, const char *path, size_t n, bool ints, double lo, double hi, int32_t *idst,
                          float *fdst, lt_prim_out_t *out) {
  if (!json_is_array(a)) return bad(out, path, "must be an array of numbers");
  if (json_array_size(a) != n)
    return bad(out, path, "has %zu entries; tokens has %zu (every array of an example has the same length)",
               json_array_size(a), n);
  for (size_t i = 0; i < n; i++) {
    const json_t *v = json_array_get(a, i);
    char p[96];
    snprintf(p, sizeof p, "%s[%zu]", path, i);
    if (!json_is_number(v)) return bad(out, p, "must be a number");
    double d = json_number_value(v);
    if (ints) {
      if (!json_is_integer(v) || d < lo || d >= hi) return bad(out, p, "%g is not a whole number in [%g, %g)", d, lo, hi);
      idst[i] = (int32_t)d;
    } else {
      if (!isfinite(d) || d < lo || d > hi) return bad(out, p, "must be a finite number in [%g, %g]", lo, hi);
      fdst[i] = (float)d;
    }
  }
  return LT_OK;
}

/* ---------------------------------------------------------------- batches */

/* The engine's (B, T) batch built from the call's examples, padded with weight 0. */
typedef struct {
  int B, T;
  int *len;           /* each example's own length */
  int32_t *tokens, *targets, *positions;
  float *weights, *adv, *slogp, *logp;
} batch_t;

static void batch_free(batch_t *b) {
  free(b->len);
  free(b->tokens);
  free(b->targets);
  free(b->positions);
  free(b->weights);
  free(b->adv);
  free(b->slogp);
  free(b->logp);
  memset(b, 0, sizeof *b);
}

static lt_err_t parse_loss(const json_t *body, lt_loss_t *loss, lt_prim_out_t *out) {
  const json_t *l = json_object_get(body, "loss");
  const char *name = l ? json_string_value(l) : "cross_entropy";
  if (!name) return bad(out, "loss", "must be a string: cross_entropy, importance_sampling or ppo");
  if (strcmp(name, "cross_entropy") == 0) *loss = LT_LOSS_CROSS_ENTROPY;
  else if (strcmp(name, "importance_sampling") == 0) *loss = LT_LOSS_IMPORTANCE;
  else if (strcmp(name, "ppo") == 0) *loss = LT_LOSS_PPO;
  else return bad(out, "loss", "unknown loss \"%.40s\": cross_entropy, importance_sampling or ppo", name);
  return LT_OK;
}

/* Sizes the batch from the examples' token arrays; every limit checked. */
static lt_err_t size_batch(const json_t *data, int max_pos, batch_t *b, lt_prim_out_t *out) {
  if (!json_is_array(data) || json_array_size(data) == 0)
    return bad(out, "data", "must be a non-empty array of examples");
  if (json_array_size(data) > LT_PRIM_MAX_EXAMPLES)
    return bad(out, "data", "has %zu examples; the limit is %d", json_array_size(data), LT_PRIM_MAX_EXAMPLES);
  b->B = (int)json_array_size(data);
  b->len = calloc((size_t)b->B, sizeof *b->len);
  if (!b->len) return bad(out, "data", "out of memory");
  for (int i = 0; i < b->B; i++) {
    const json_t *ex = json_array_get(data, (size_t)i), *t = json_object_get(ex, "tokens");
    char p[64];
    snprintf(p, sizeof p, "data[%d].tokens", i);
    if (!json_is_object(ex)) return bad(out, p, "the example must be an object");
    if (!json_is_array(t) || json_array_size(t) == 0) return bad(out, p, "must be a non-empty array of token ids");
    if (json_array_size(t) > (size_t)max_pos)
      return bad(out, p, "has %zu tokens; the model takes at most %d", json_array_size(t), max_pos);
    b->len[i] = (int)json_array_size(t);
    if (b->len[i] > b->T) b->T = b->len[i];
  }
  if ((size_t)b->B * (size_t)b->T > LT_PRIM_MAX_TOKENS)
    return bad(out, "data", "%d examples padded to %d tokens exceed the limit of %d tokens a call", b->B, b->T,
               LT_PRIM_MAX_TOKENS);
  size_t n = (size_t)b->B * (size_t)b->T;
  b->tokens = calloc(n, sizeof *b->tokens);
  b->targets = calloc(n, sizeof *b->targets);
  b->weights = calloc(n, sizeof *b->weights);
  b->logp = calloc(n, sizeof *b->logp);
  if (!b->tokens || !b->targets || !b->weights || !b->logp) return bad(out, "data", "out of memory");
  return LT_OK;
}

/* One example's arrays into row i of the batch. */
static lt_err_t fill_row(const json_t *ex, int i, int V, lt_loss_t loss, batch_t *b, lt_prim_out_t *out) {
  size_t n = (size_t)b->len[i], off = (size_t)i * (size_t)b->T;
  char p[64];
  lt_err_t err;
  snprintf(p, sizeof p, "data[%d].tokens", i);
  if ((err = num_array(json_object_get(ex, "tokens"), p, n, true, 0, V, b->tokens + off, NULL, out))) return err;
  snprintf(p, sizeof p, "data[%d].weights", i);
  const json_t *w = json_object_get(ex, "weights");
  if (w && (err = num_array(w, p, n, false, 0, 1e6, NULL, b->weights + off, out))) return err;
  if (!w)
    for (size_t t = 0; t < n; t++) b->weights[off + t] = 1;
  snprintf(p, sizeof p, "data[%d].targets", i);
  /* A target is read where its weight is not 0; elsewhere (-100 and the like) it is ignored. */
  const json_t *tg = json_object_get(ex, "targets");
  if (!tg) return bad(out, p, "is required: the next token at each position");
  if ((err = num_array(tg, p, n, true, -1e9, 1e9, b->targets + off, NULL, out))) return err;
  for (size_t t = 0; t < n; t++) {
    if (b->weights[off + t] == 0) b->targets[off + t] = 0;
    else if (b->targets[off + t] < 0 || b->targets[off + t] >= V)
      return bad(out, p, "entry %zu is %d: a weighted target must be a token id in [0, %d)", t, b->targets[off + t], V);
  }
  const json_t *pos = json_object_get(ex, "positions");
  if (pos) {
    snprintf(p, sizeof p, "data[%d].positions", i);
    if ((err = num_array(pos, p, n, true, 0, b->T, b->positions + off, NULL, out))) return err;
  }
  if (loss == LT_LOSS_CROSS_ENTROPY) return LT_OK;
  snprintf(p, sizeof p, "data[%d].logprobs", i);
  if (!json_object_get(ex, "logprobs")) return bad(out, p, "is required by this loss: the sampler's log-probs");
  if ((err = num_array(json_object_get(ex, "logprobs"), p, n, false, -1e30, 0, NULL, b->slogp + off, out))) return err;
  snprintf(p, sizeof p, "data[%d].advantages", i);
  if (!json_object_get(ex, "advantages")) return bad(out, p, "is required by this loss");
  return num_array(json_object_get(ex, "advantages"), p, n, false, -1e30, 1e30, NULL, b->adv + off, out);
}

static lt_err_t read_batch(const lt_model_config_t *mc, const json_t *body, lt_loss_t loss, batch_t *b,
                         lt_prim_out_t *out) {
  const json_t *data = json_object_get(body, "data");
  lt_err_t err = size_batch(data, mc->max_position, b, out);
  if (err) return err;
  size_t n = (size_t)b->B * (size_t)b->T;
  bool any_pos = false;
  for (int i = 0; i < b->B; i++) any_pos |= json_object_get(json_array_get(data, (size_t)i), "positions") != NULL;
  if (any_pos && !(b->positions = calloc(n, sizeof *b->positions))) return bad(out, "data", "out of memory");
  if (loss != LT_LOSS_CROSS_ENTROPY &&
      (!(b->adv = calloc(n, sizeof *b->adv)) || !(b->slogp = calloc(n, sizeof *b->slogp))))
    return bad(out, "data", "out of memory");
  for (int i = 0; i < b->B; i++) {
    if ((err = fill_row(json_array_get(data, (size_t)i), i, mc->vocab_size, loss, b, out))) return err;
    /* Padding and rows without positions count on from their last position. */
    if (b->positions) {
      const json_t *pos = json_object_get(json_array_get(data, (size_t)i), "positions");
      for (int t = pos ? b->len[i] : 0; t < b->T; t++)
        b->positions[(size_t)i * b->T + t] = pos ? b->positions[(size_t)i * b->T + t - 1] + 1 : t;
    }
  }
  return LT_OK;
}

/* ---------------------------------------------------------------- the calls */

static lt_err_t run_fb(lt_session_t *s, const lt_model_config_t *mc, const json_t *body, bool backward,
                       lt_prim_out_t *out) {
  lt_loss_t loss = LT_LOSS_CROSS_ENTROPY;
  lt_err_t err = parse_loss(body, &loss, out);
  if (err) return err;
  double clip_low = 0.2, clip_high = 0.2;
  const json_t *lc = json_object_get(body, "loss_config");
  if (lc && !json_is_object(lc)) return bad(out, "loss_config", "must be an object");
  if ((err = opt_num(lc, "clip_low", "loss_config.clip_low", 0, 10, &clip_low, out)) ||
      (err = opt_num(lc, "clip_high", "loss_config.clip_high", 0, 10, &clip_high, out)))
    return err;
  batch_t b = {0};
  if ((err = read_batch(mc, body, loss, &b, out))) {
    batch_free(&b);
    return err;
  }
  lt_batch_t eb = {.B = b.B, .T = b.T, .tokens = b.tokens, .targets = b.targets, .weights = b.weights,
                   .advantages = b.adv, .sampler_logp = b.slogp, .positions = b.positions,
                   .clip_low = (float)clip_low, .clip_high = (float)clip_high};
  float l = 0;
  char msg[256];
  err = backward ? lt_forward_backward(s, &eb, loss, &l, b.logp, msg, sizeof msg)
                 : lt_forward(s, &eb, loss, &l, b.logp, msg, sizeof msg);
  if (err) {
    batch_free(&b);
    return engine_failed(out, err, "data", msg);
  }
  json_t *lps = json_array();
  int64_t tokens = 0;
  for (int i = 0; i < b.B; i++) {
    json_t *row = json_array();
    for (int t = 0; t < b.len[i]; t++) {
      size_t k = (size_t)i * b.T + t;
      json_array_append_new(row, json_real(isfinite(b.logp[k]) ? b.logp[k] : -1e30));
      tokens += b.weights[k] != 0;
    }
    json_array_append_new(lps, row);
  }
  batch_free(&b);
  out->loss = l;
  out->tokens = tokens;
  /* the loss of a batch whose every token is masked is 0 / 0: null, not a number JSON lacks */
  out->body = json_pack("{s:o,s:o,s:I}", "loss", isfinite(l) ? json_real(l) : json_null(), "logprobs", lps, "tokens",
                        (json_int_t)tokens);
  return LT_OK;
}

static lt_err_t run_optim(lt_session_t *s, const json_t *body, lt_prim_out_t *out) {
  const json_t *a = json_object_get(body, "adam");
  if (!json_is_object(a)) return bad(out, "adam", "is required: {lr, beta1, beta2, eps, weight_decay, grad_clip}");
  if (!json_object_get(a, "lr")) return bad(out, "adam.lr", "is required");
  double lr = 0, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0, clip = 0;
  lt_err_t err;
  if ((err = opt_num(a, "lr", "adam.lr", 0, 1, &lr, out)) || (err = opt_num(a, "beta1", "adam.beta1", 0, 0.9999999, &b1, out)) ||
      (err = opt_num(a, "beta2", "adam.beta2", 0, 0.9999999, &b2, out)) ||
      (err = opt_num(a, "eps", "adam.eps", 1e-30, 1, &eps, out)) ||
      (err = opt_num(a, "weight_decay", "adam.weight_decay", 0, 10, &wd, out)) ||
      (err = opt_num(a, "grad_clip", "adam.grad_clip", 0, 1e9, &clip, out)))
    return err;
  if (lr * wd > 1)
    return bad(out, "adam.weight_decay", "times adam.lr must be at most 1 (each step scales the weights by 1 - lr x "
               "weight_decay)");
  lt_adamw_t opt = {.lr = (float)lr, .beta1 = (float)b1, .beta2 = (float)b2, .eps = (float)eps,
                    .weight_decay = (float)wd, .max_grad_norm = (float)clip};
  float gn = 0;
  char msg[256];
  if ((err = lt_optim_step(s, &opt, &gn, msg, sizeof msg))) return engine_failed(out, err, "kind", msg);
  out->grad_norm = gn;
  out->body = json_pack("{s:I,s:f}", "step", (json_int_t)lt_session_step(s), "grad_norm", isfinite(gn) ? (double)gn : -1.0);
  return LT_OK;
}

/* The sample call's prompts, each repeated num_samples times (prompt-major). */
typedef struct {
  int n, per;
  int32_t **prompts;
  int *lens;
  int32_t stop[64];
  int n_stop;
} prompts_t;

static void prompts_free(prompts_t *p) {
  for (int i = 0; p->prompts && i < p->n; i++) free(p->prompts[i]);
  free(p->prompts);
  free(p->lens);
}

static lt_err_t read_prompts(const json_t *body, int V, int max_pos, int max_tokens, prompts_t *p, lt_prim_out_t *out) {
  const json_t *ps = json_object_get(body, "prompts");
  if (!json_is_array(ps) || json_array_size(ps) == 0) return bad(out, "prompts", "must be a non-empty array of token arrays");
  double per = 1;
  lt_err_t err = opt_num(body, "num_samples", "num_samples", 1, 64, &per, out);
  if (err) return err;
  if (per != floor(per)) return bad(out, "num_samples", "must be a whole number");
  p->per = (int)per;
  if (json_array_size(ps) * (size_t)p->per > LT_PRIM_MAX_PROMPTS)
    return bad(out, "prompts", "%zu prompts x %d samples exceed the limit of %d", json_array_size(ps), p->per,
               LT_PRIM_MAX_PROMPTS);
  p->n = (int)json_array_size(ps) * p->per;
  p->prompts = calloc((size_t)p->n, sizeof *p->prompts);
  p->lens = calloc((size_t)p->n, sizeof *p->lens);
  if (!p->prompts || !p->lens) return bad(out, "prompts", "out of memory");
  for (size_t i = 0; i < json_array_size(ps); i++) {
    const json_t *pr = json_array_get(ps, i);
    char path[48];
    snprintf(path, sizeof path, "prompts[%zu]", i);
    size_t len = json_is_array(pr) ? json_array_size(pr) : 0;
    if (len == 0) return bad(out, path, "must be a non-empty array of token ids");
    if ((int)len + max_tokens > max_pos)
      return bad(out, path, "%zu tokens + max_tokens %d exceed the model's %d positions", len, max_tokens, max_pos);
    for (int k = 0; k < p->per; k++) {
      int j = (int)i * p->per + k;
      if (!(p->prompts[j] = malloc(len * sizeof(int32_t)))) return bad(out, "prompts", "out of memory");
      p->lens[j] = (int)len;
      if ((err = num_array(pr, path, len, true, 0, V, p->prompts[j], NULL, out))) return err;
    }
  }
  const json_t *st = json_object_get(body, "stop");
  if (st) {
    size_t ns = json_is_array(st) ? json_array_size(st) : 0;
    if (!json_is_array(st) || ns > 64) return bad(out, "stop", "must be an array of at most 64 token ids");
    if ((err = num_array(st, "stop", ns, true, 0, V, p->stop, NULL, out))) return err;
    p->n_stop = (int)ns;
  }
  return LT_OK;
}

static lt_err_t run_sample(lt_session_t *s, const lt_model_config_t *mc, const json_t *body, lt_prim_out_t *out) {
  double max_tokens = 16, temp = 1, top_p = 1, seed = 0;
  lt_err_t err;
  if ((err = opt_num(body, "max_tokens", "max_tokens", 1, mc->max_position - 1, &max_tokens, out)) ||
      (err = opt_num(body, "temperature", "temperature", 0, 100, &temp, out)) ||
      (err = opt_num(body, "top_p", "top_p", 1e-9, 1, &top_p, out)) ||
      (err = opt_num(body, "seed", "seed", 0, 9007199254740991.0, &seed, out)))
    return err;
  if (max_tokens != floor(max_tokens)) return bad(out, "max_tokens", "must be a whole number");
  prompts_t p = {0};
  int mt = (int)max_tokens;
  if ((err = read_prompts(body, mc->vocab_size, mc->max_position, mt, &p, out))) {
    prompts_free(&p);
    return err;
  }
  int32_t *toks = calloc((size_t)p.n * mt, sizeof *toks);
  float *lps = calloc((size_t)p.n * mt, sizeof *lps);
  int *lens = calloc((size_t)p.n, sizeof *lens);
  lt_sample_params_t sp = {.max_tokens = mt, .temperature = (float)temp, .top_p = (float)top_p, .stop = p.stop,
                           .n_stop = p.n_stop, .seed = (uint64_t)seed};
  char msg[256];
  err = toks && lps && lens ? lt_sample(s, p.n, (const int32_t *const *)p.prompts, p.lens, &sp, toks, lps, lens, msg, sizeof msg)
                            : (snprintf(msg, sizeof msg, "out of memory"), LT_ERR_NOMEM);
  if (!err) {
    json_t *samples = json_array();
    for (int i = 0; i < p.n; i++) {
      json_t *t = json_array(), *l = json_array();
      for (int k = 0; k < lens[i]; k++) {
        json_array_append_new(t, json_integer(toks[(size_t)i * mt + k]));
        json_array_append_new(l, json_real(isfinite(lps[(size_t)i * mt + k]) ? lps[(size_t)i * mt + k] : -1e30));
      }
      out->tokens += lens[i];
      json_array_append_new(samples, json_pack("{s:i,s:o,s:o}", "prompt", i / p.per, "tokens", t, "logprobs", l));
    }
    out->body = json_pack("{s:o}", "samples", samples);
  }
  free(toks);
  free(lps);
  free(lens);
  prompts_free(&p);
  return err ? engine_failed(out, err, "prompts", msg) : LT_OK;
}

bool lt_prim_is_compute(const char *kind) {
  return kind && (strcmp(kind, "forward_backward") == 0 || strcmp(kind, "forward") == 0 ||
                  strcmp(kind, "optim_step") == 0 || strcmp(kind, "sample") == 0);
}

lt_err_t lt_prim_run(lt_session_t *s, const lt_model_config_t *mc, const char *kind, const json_t *body,
                     lt_prim_out_t *out) {
  memset(out, 0, sizeof *out);
  out->loss = NAN;
  out->grad_norm = NAN;
  if (!json_is_object(body)) return bad(out, "body", "the call must be a JSON object");
  if (!kind) return bad(out, "kind", "is required");
  if (strcmp(kind, "forward_backward") == 0) return run_fb(s, mc, body, true, out);
  if (strcmp(kind, "forward") == 0) return run_fb(s, mc, body, false, out);
  if (strcmp(kind, "optim_step") == 0) return run_optim(s, body, out);
  if (strcmp(kind, "sample") == 0) return run_sample(s, mc, body, out);
  bad(out, "kind", "\"%.40s\" is not a compute call", kind);
  return LT_ERR_UNSUPPORTED;
}

lt_session_config_t lt_prim_session_config(int rank, double alpha, double dropout, unsigned targets, int64_t seed) {
  return (lt_session_config_t){.rank = rank, .alpha = (float)alpha, .dropout = (float)dropout, .targets = targets,
                               .seed = (uint64_t)seed};
}
