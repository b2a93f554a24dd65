/* lt_callspec: a session call's fields checked (see lt_callspec.h). */
#include "lt_callspec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "lt_jobspec.h"

typedef struct {
  char *field;
  size_t fs;
  char *msg;
  size_t n;
} out_t;

static lt_err_t bad(out_t *o, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static lt_err_t bad(out_t *o, const char *field, const char *fmt, ...) {
  char m[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  if (o->field) snprintf(o->field, o->fs, "%s", field);
  return lt_errf(o->msg, o->n, LT_ERR_INVALID, "%s: %s", field, m);
}

/* ---------------------------------------------------------------- parsing */

/* The path of the value that starts at off in text (a JSON document cut short there). */
static void path_at(const char *text, size_t off, char *out, size_t n) {
  struct {
    bool obj;
    int index;
    char key[48];
  } st[32];
  int depth = -1;
  bool want_key = false;
  for (size_t i = 0; i < off; i++) {
    char ch = text[i];
    if (ch == '"') {
      size_t k = 0, j = i + 1;
      char key[48] = "";
      for (; j < off && text[j] != '"'; j++) {
        if (text[j] == '\\') j++;
        else if (k + 1 < sizeof key) key[k++] = text[j], key[k] = '\0';
      }
      if (depth >= 0 && st[depth].obj && want_key) {
        snprintf(st[depth].key, sizeof st[depth].key, "%s", key);
        want_key = false;
      }
      i = j;
    } else if ((ch == '{' || ch == '[') && depth + 1 < 32) {
      depth++;
      st[depth].obj = ch == '{';
      st[depth].index = 0;
      st[depth].key[0] = '\0';
      want_key = st[depth].obj;
    } else if ((ch == '}' || ch == ']') && depth >= 0) {
      depth--;
    } else if (ch == ',' && depth >= 0) {
      if (st[depth].obj) want_key = true;
      else st[depth].index++;
    }
  }
  size_t len = 0;
  out[0] = '\0';
  for (int d = 0; d <= depth && len < n; d++) {
    if (st[d].obj) len += (size_t)snprintf(out + len, n - len, "%s%s", len ? "." : "", st[d].key);
    else len += (size_t)snprintf(out + len, n - len, "[%d]", st[d].index);
  }
}

/* True when the len bytes of text hold word at offset at (text need not be NUL-terminated). */
static bool word_at(const char *text, size_t len, size_t at, const char *word) {
  size_t wl = strlen(word);
  return at <= len && len - at >= wl && memcmp(text + at, word, wl) == 0;
}

json_t *lt_callspec_parse(const char *text, size_t len, char *field, size_t fs, char *errstr, size_t n) {
  json_error_t je;
  json_t *body = json_loadb(text, len, 0, &je);
  if (field && fs) field[0] = '\0';
  if (body) return body;
  /* jansson stops just after the token it refused: find where that token starts. */
  size_t end = je.position > 0 && (size_t)je.position <= len ? (size_t)je.position : 0, start = end;
  while (start > 0 && ((text[start - 1] && strchr("-+", text[start - 1])) ||
                       ((text[start - 1] | 32) >= 'a' && (text[start - 1] | 32) <= 'z')))
    start--;
  static const char *const nans[] = {"NaN", "Infinity", "-Infinity", "nan", "inf", "-inf"};
  bool not_a_number = false;
  for (size_t i = 0; i < sizeof nans / sizeof *nans; i++) not_a_number |= word_at(text, len, start, nans[i]);
  if (!not_a_number) {
    lt_errf(errstr, n, LT_ERR_INVALID, "the body is not valid JSON: %s at line %d column %d", je.text, je.line,
            je.column);
    return NULL;
  }
  char path[160];
  path_at(text, start, path, sizeof path);
  if (field) snprintf(field, fs, "%s", path);
  lt_errf(errstr, n, LT_ERR_INVALID, "%s: is not a finite number (NaN and Infinity are not numbers JSON has)",
          path[0] ? path : "body");
  return NULL;
}

/* ---------------------------------------------------------------- fields */

/* Only these fields (NULL-terminated) may be in o. */
static lt_err_t only(out_t *o, const json_t *obj, const char *where, const char *const *allowed) {
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)obj, k, v) {
    bool ok = false;
    for (const char *const *a = allowed; *a && !ok; a++) ok = strcmp(*a, k) == 0;
    if (!ok) {
      char path[128];
      snprintf(path, sizeof path, "%s%s%s", where, where[0] ? "." : "", k);
      return bad(o, path, "unknown field");
    }
  }
  return LT_OK;
}

/* An optional number in [lo, hi]; whole when whole. */
static lt_err_t num(out_t *o, const json_t *obj, const char *key, const char *path, double lo, double hi, bool whole) {
  const json_t *v = json_object_get(obj, key);
  if (!v) return LT_OK;
  double d = json_number_value(v);
  if (!json_is_number(v) || !isfinite(d)) return bad(o, path, "must be a number");
  if (whole && (!json_is_integer(v))) return bad(o, path, "must be a whole number");
  if (d < lo || d > hi) return bad(o, path, "%g is outside [%g, %g]", d, lo, hi);
  return LT_OK;
}

/* An array of len numbers (len < 0: any non-empty length, written back); ids in [0, vocab) where
 * vocab > 0, numbers finite in [lo, hi] otherwise. */
static lt_err_t numbers(out_t *o, const json_t *a, const char *path, long *len, bool ids, int vocab, double lo,
                        double hi) {
  if (!json_is_array(a)) return bad(o, path, "must be an array of %s", ids ? "token ids" : "numbers");
  long got = (long)json_array_size(a);
  if (*len < 0 && got == 0) return bad(o, path, "must not be empty");
  if (*len >= 0 && got != *len)
    return bad(o, path, "has %ld entries; tokens has %ld (an example's arrays have one entry per token)", got, *len);
  *len = got;
  for (long i = 0; i < got; i++) {
    const json_t *v = json_array_get(a, (size_t)i);
    char p[128];
    snprintf(p, sizeof p, "%s[%ld]", path, i);
    double d = json_number_value(v);
    if (ids) {
      if (!json_is_integer(v)) return bad(o, p, "must be a token id (a whole number)");
      if (d < lo || (vocab > 0 && d >= vocab))
        return bad(o, p, "%lld is not a token id of this model (0 to %d)", (long long)d, vocab - 1);
    } else if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi) {
      return bad(o, p, "must be a finite number in [%g, %g]", lo, hi);
    }
  }
  return LT_OK;
}

static const char *const example_fields[] = {"tokens", "targets", "weights", "positions", "logprobs", "advantages", NULL};

static lt_err_t example(out_t *o, const json_t *ex, int i, bool policy, int vocab, long *longest) {
  char base[32], p[64];
  snprintf(base, sizeof base, "data[%d]", i);
  if (!json_is_object(ex)) return bad(o, base, "must be an object with tokens and targets");
  lt_err_t err = only(o, ex, base, example_fields);
  long len = -1, l2;
  snprintf(p, sizeof p, "%s.tokens", base);
  if (!err) err = numbers(o, json_object_get(ex, "tokens"), p, &len, true, vocab, 0, 0);
  /* targets: ids where weighted; a masked position may hold anything whole (-100 as HF). */
  snprintf(p, sizeof p, "%s.targets", base);
  if (!err && !json_object_get(ex, "targets")) err = bad(o, p, "is required: the next token at each position");
  if (!err) err = numbers(o, json_object_get(ex, "targets"), p, (l2 = len, &l2), true, 0, -1e9, 0);
  const char *opt[4] = {"weights", "positions", "logprobs", "advantages"};
  for (int k = 0; k < 4 && !err; k++) {
    const json_t *v = json_object_get(ex, opt[k]);
    snprintf(p, sizeof p, "%s.%s", base, opt[k]);
    if (!v && k >= 2 && policy) err = bad(o, p, "is required by this loss");
    else if (v && k == 1) err = numbers(o, v, p, (l2 = len, &l2), true, 0, 0, 0);
    else if (v) err = numbers(o, v, p, (l2 = len, &l2), false, 0, k == 0 ? 0 : k == 2 ? -1e30 : -1e30,
                              k == 0 ? 1e6 : k == 2 ? 0 : 1e30);
  }
  if (!err && vocab > 0) { /* weighted targets must be ids */
    const json_t *t = json_object_get(ex, "targets"), *w = json_object_get(ex, "weights");
    for (long k = 0; k < len; k++) {
      double id = json_number_value(json_array_get(t, (size_t)k));
      if ((w ? json_number_value(json_array_get(w, (size_t)k)) : 1) != 0 && (id < 0 || id >= vocab)) {
        snprintf(p, sizeof p, "%s.targets[%ld]", base, k);
        return bad(o, p, "%lld is not a token id of this model (0 to %d) and its weight is not 0", (long long)id,
                   vocab - 1);
      }
    }
  }
  if (len > *longest) *longest = len;
  return err;
}

static const char *const fb_fields[] = {"kind", "loss", "loss_config", "data", NULL};

static lt_err_t check_fb(out_t *o, const json_t *b, const lt_callspec_limits_t *lim) {
  lt_err_t err = only(o, b, "", fb_fields);
  if (err) return err;
  const json_t *l = json_object_get(b, "loss");
  const char *loss = l ? json_string_value(l) : "cross_entropy";
  if (!loss || (strcmp(loss, "cross_entropy") && strcmp(loss, "importance_sampling") && strcmp(loss, "ppo")))
    return bad(o, "loss", "must be cross_entropy, importance_sampling or ppo");
  const json_t *lc = json_object_get(b, "loss_config");
  static const char *const lc_fields[] = {"clip_low", "clip_high", NULL};
  if (lc && (!json_is_object(lc) || strcmp(loss, "ppo") != 0))
    return bad(o, "loss_config", "is an object {clip_low, clip_high}, for the ppo loss only");
  if (lc && ((err = only(o, lc, "loss_config", lc_fields)) ||
             (err = num(o, lc, "clip_low", "loss_config.clip_low", 0, 9.99, false)) ||
             (err = num(o, lc, "clip_high", "loss_config.clip_high", 0, 9.99, false))))
    return err;
  const json_t *data = json_object_get(b, "data");
  if (!json_is_array(data) || json_array_size(data) == 0) return bad(o, "data", "must be a non-empty array of examples");
  if (json_array_size(data) > LT_CALLSPEC_MAX_EXAMPLES)
    return bad(o, "data", "has %zu examples; a call takes at most %d", json_array_size(data), LT_CALLSPEC_MAX_EXAMPLES);
  long longest = 0;
  for (size_t i = 0; i < json_array_size(data); i++)
    if ((err = example(o, json_array_get(data, i), (int)i, strcmp(loss, "cross_entropy") != 0, lim->vocab_size,
                       &longest)))
      return err;
  if ((long)json_array_size(data) * longest > lim->max_tokens_per_call)
    return bad(o, "data", "%zu examples padded to %ld tokens exceed %d tokens a call: split the batch",
               json_array_size(data), longest, lim->max_tokens_per_call);
  return LT_OK;
}

static lt_err_t check_optim(out_t *o, const json_t *b) {
  static const char *const top[] = {"kind", "adam", NULL};
  static const char *const adam[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", NULL};
  lt_err_t err = only(o, b, "", top);
  const json_t *a = json_object_get(b, "adam");
  if (!err && !json_is_object(a)) return bad(o, "adam", "is required: {lr, beta1, beta2, eps, weight_decay, grad_clip}");
  if (!err && !json_object_get(a, "lr")) return bad(o, "adam.lr", "is required");
  if (!err) err = only(o, a, "adam", adam);
  if (!err) err = num(o, a, "lr", "adam.lr", 0, 1, false);
  if (!err) err = num(o, a, "beta1", "adam.beta1", 0, 0.9999999, false);
  if (!err) err = num(o, a, "beta2", "adam.beta2", 0, 0.9999999, false);
  if (!err) err = num(o, a, "eps", "adam.eps", 1e-30, 1, false);
  if (!err) err = num(o, a, "weight_decay", "adam.weight_decay", 0, 10, false);
  if (!err) err = num(o, a, "grad_clip", "adam.grad_clip", 0, 1e9, false);
  double lr = json_number_value(json_object_get(a, "lr")), wd = json_number_value(json_object_get(a, "weight_decay"));
  if (!err && lr * wd > 1)
    return bad(o, "adam.weight_decay", "times adam.lr is %g: at most 1 (each step scales the weights by 1 - lr x "
               "weight_decay)", lr * wd);
  return err;
}

static lt_err_t check_named(out_t *o, const json_t *b) {
  static const char *const top[] = {"kind", "name", NULL};
  lt_err_t err = only(o, b, "", top);
  const char *name = json_string_value(json_object_get(b, "name"));
  if (!err && (!name || !lt_id_valid(name)))
    return bad(o, "name", "is required: 1-63 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
  return err;
}

static lt_err_t check_sample(out_t *o, const json_t *b, const lt_callspec_limits_t *lim) {
  static const char *const top[] = {"kind", "prompts", "num_samples", "max_tokens", "temperature", "top_p", "stop",
                                    "seed", NULL};
  lt_err_t err = only(o, b, "", top);
  const json_t *ps = json_object_get(b, "prompts");
  if (!err && (!json_is_array(ps) || json_array_size(ps) == 0))
    return bad(o, "prompts", "must be a non-empty array of prompts (arrays of token ids)");
  if (!err) err = num(o, b, "num_samples", "num_samples", 1, 64, true);
  if (!err) err = num(o, b, "max_tokens", "max_tokens", 1, 4096, true);
  if (!err) err = num(o, b, "temperature", "temperature", 0, 100, false);
  if (!err) err = num(o, b, "top_p", "top_p", 1e-9, 1, false);
  if (!err) err = num(o, b, "seed", "seed", 0, 9007199254740991.0, true);
  json_int_t per = json_is_integer(json_object_get(b, "num_samples")) ? json_integer_value(json_object_get(b, "num_samples")) : 1;
  if (!err && (json_int_t)json_array_size(ps) * per > LT_CALLSPEC_MAX_SAMPLES)
    return bad(o, "prompts", "%zu prompts x %lld samples exceed %d a call", json_array_size(ps), (long long)per,
               LT_CALLSPEC_MAX_SAMPLES);
  for (size_t i = 0; !err && i < json_array_size(ps); i++) {
    char p[48];
    long len = -1;
    snprintf(p, sizeof p, "prompts[%zu]", i);
    err = numbers(o, json_array_get(ps, i), p, &len, true, lim->vocab_size, 0, 0);
  }
  const json_t *stop = json_object_get(b, "stop");
  long sl = (long)json_array_size(stop);
  if (!err && stop && (!json_is_array(stop) || sl > 64)) return bad(o, "stop", "must be an array of at most 64 token ids");
  if (!err && stop && sl) err = numbers(o, stop, "stop", &sl, true, lim->vocab_size, 0, 0);
  return err;
}

bool lt_callspec_saves_state(const char *kind) {
  return kind && (strcmp(kind, "save_state") == 0 || strcmp(kind, "save_weights_for_sampler") == 0);
}

bool lt_callspec_runs_after(const char *kind, int64_t seq, int64_t held) {
  return seq > held || (seq == held && kind && strcmp(kind, "end") == 0);
}

lt_err_t lt_callspec_check(const json_t *body, const lt_callspec_limits_t *lim, const char **kind, char *field, size_t fs,
                           char *errstr, size_t n) {
  out_t o = {field, fs, errstr, n};
  if (field && fs) field[0] = '\0';
  if (!json_is_object(body)) return bad(&o, "body", "the call must be a JSON object");
  const char *k = json_string_value(json_object_get(body, "kind"));
  *kind = k;
  if (!k) return bad(&o, "kind", "is required");
  if (!strcmp(k, "forward_backward") || !strcmp(k, "forward")) return check_fb(&o, body, lim);
  if (!strcmp(k, "optim_step")) return check_optim(&o, body);
  if (lt_callspec_saves_state(k) || !strcmp(k, "load_state"))
    return check_named(&o, body);
  if (!strcmp(k, "sample")) return check_sample(&o, body, lim);
  return bad(&o, "kind", "\"%.40s\" is not a call: forward_backward, forward, optim_step, save_state, load_state, "
                         "save_weights_for_sampler or sample (DELETE the session to end it)", k);
}
