/* lt_dataset: streamed JSONL validation of customer datasets (see lt_dataset.h). */
#include "lt_dataset.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

struct lt_dataset_check {
  lt_dataset_limits_t lim;
  lt_dataset_tokens_fn *tokens_fn;
  void *ctx;
  char *line;          /* the current line, up to lim.max_line_bytes (after errors[]) */
  size_t line_len;
  bool line_too_long;  /* the current line passed the limit: skip to its end */
  lt_dataset_report_t r;
  bool finished;
  lt_dataset_error_t errors[]; /* lim.max_errors kept for the report */
};

const char *lt_dataset_format_name(lt_dataset_format_t f) {
  switch (f) {
  case LT_DATASET_PROMPT_COMPLETION: return "prompt_completion";
  case LT_DATASET_MESSAGES: return "messages";
  default: return "unknown";
  }
}

bool lt_utf8_valid(const char *str, size_t n, size_t *bad_offset) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    unsigned c = s[i];
    size_t len;
    unsigned cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      goto bad;
    }
    if (i + len > n) goto bad;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) goto bad;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      goto bad;
    i += len;
  }
  return true;
bad:
  if (bad_offset) *bad_offset = i;
  return false;
}

lt_err_t lt_dataset_check_new(lt_dataset_check_t **out, const lt_dataset_limits_t *limits,
                              lt_dataset_tokens_fn *tokens_fn, void *ctx) {
  lt_dataset_limits_t lim = limits ? *limits : (lt_dataset_limits_t){0};
  if (!lim.max_line_bytes) lim.max_line_bytes = 1 << 20;
  if (!lim.max_errors) lim.max_errors = 100;
  /* One allocation: the checker, its kept errors, then the line buffer. */
  size_t fixed = sizeof(lt_dataset_check_t) + lim.max_line_bytes + 1;
  if (fixed <= lim.max_line_bytes || lim.max_errors > (SIZE_MAX - fixed) / sizeof(lt_dataset_error_t))
    return LT_ERR_NOMEM;
  lt_dataset_check_t *c = calloc(1, fixed + lim.max_errors * sizeof(lt_dataset_error_t));
  if (!c) return LT_ERR_NOMEM;
  c->lim = lim;
  c->tokens_fn = tokens_fn;
  c->ctx = ctx;
  c->line = (char *)(c->errors + lim.max_errors);
  *out = c;
  return LT_OK;
}

void lt_dataset_check_destroy(lt_dataset_check_t *c) {
  if (!c) return;
  /* the line buffer holds a line of the tenant's data; kept errors may quote it */
  OPENSSL_cleanse(c->errors, c->lim.max_errors * sizeof(lt_dataset_error_t) + c->lim.max_line_bytes + 1);
  free(c);
}

static void add_error(lt_dataset_check_t *c, uint64_t line, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_error(lt_dataset_check_t *c, uint64_t line, const char *field, const char *fmt, ...) {
  c->r.error_count++;
  if (c->r.errors_kept >= c->lim.max_errors) return;
  lt_dataset_error_t *e = &c->errors[c->r.errors_kept++];
  e->line = line;
  snprintf(e->field, sizeof e->field, "%s", field ? field : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->reason, sizeof e->reason, fmt, ap);
  va_end(ap);
}

/* A required, non-empty string field of obj. */
static bool need_text(lt_dataset_check_t *c, uint64_t ln, const json_t *obj, const char *name,
                      const char *path) {
  const json_t *v = json_object_get(obj, name);
  if (!v) {
    add_error(c, ln, path, "missing field \"%s\"", name);
    return false;
  }
  if (!json_is_string(v)) {
    add_error(c, ln, path, "must be a string");
    return false;
  }
  const char *s = json_string_value(v);
  size_t n = json_string_length(v);
  size_t k = 0;
  while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r')) k++;
  if (k == n) {
    add_error(c, ln, path, "is empty");
    return false;
  }
  return true;
}

static bool check_messages(lt_dataset_check_t *c, uint64_t ln, const json_t *msgs) {
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    add_error(c, ln, "messages", "must be a non-empty array of {\"role\",\"content\"} objects");
    return false;
  }
  bool ok = true, assistant = false;
  size_t i;
  const json_t *m;
  json_array_foreach(msgs, i, m) {
    char path[48];
    snprintf(path, sizeof path, "messages[%zu]", i);
    if (!json_is_object(m)) {
      add_error(c, ln, path, "must be an object with \"role\" and \"content\"");
      ok = false;
      continue;
    }
    const json_t *role = json_object_get(m, "role");
    const char *r = json_is_string(role) ? json_string_value(role) : NULL;
    snprintf(path, sizeof path, "messages[%zu].role", i);
    if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))) {
      add_error(c, ln, path, "must be \"system\", \"user\" or \"assistant\"");
      ok = false;
    }
    /* OpenAI's per-message weight: 0 keeps an assistant turn as context without learning it. */
    const json_t *w = json_object_get(m, "weight");
    bool is_assistant = r && strcmp(r, "assistant") == 0;
    snprintf(path, sizeof path, "messages[%zu].weight", i);
    if (w && !is_assistant) {
      add_error(c, ln, path, "only assistant messages take a weight");
      ok = false;
    } else if (w && !(json_is_integer(w) && (json_integer_value(w) == 0 || json_integer_value(w) == 1))) {
      add_error(c, ln, path, "must be 0 or 1");
      ok = false;
    } else if (is_assistant && (!w || json_integer_value(w) == 1)) {
      assistant = true;
    }
    snprintf(path, sizeof path, "messages[%zu].content", i);
    if (!need_text(c, ln, m, "content", path)) ok = false;
  }
  if (ok && !assistant) {
    add_error(c, ln, "messages", "has no \"assistant\" message with weight 1: there is nothing to learn");
    ok = false;
  }
  return ok;
}

bool lt_dataset_skip_bom(const char **s, size_t *n) {
  if (*n < 3 || memcmp(*s, "\xEF\xBB\xBF", 3) != 0) return false;
  *s += 3;
  *n -= 3;
  return true;
}

static void check_line(lt_dataset_check_t *c, const char *s, size_t n) {
  uint64_t ln = c->r.lines;
  if (ln == 1) lt_dataset_skip_bom(&s, &n); /* Windows editors start a file with one */
  if (n > 0 && s[n - 1] == '\r') n--; /* CRLF files */
  size_t k = 0;
  while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
  if (k == n) return; /* blank lines are allowed and ignored */
  size_t bad;
  if (!lt_utf8_valid(s, n, &bad)) {
    add_error(c, ln, "", "invalid UTF-8 at byte %zu of the line", bad + 1);
    return;
  }
  json_error_t je;
  json_t *obj = json_loadb(s, n, JSON_REJECT_DUPLICATES, &je);
  if (!obj) {
    add_error(c, ln, "", "invalid JSON at column %d: %s", je.column, je.text);
    return;
  }
  if (!json_is_object(obj)) {
    add_error(c, ln, "", "must be a JSON object, one example per line");
    json_decref(obj);
    return;
  }
  lt_dataset_format_t f = json_object_get(obj, "messages") ? LT_DATASET_MESSAGES : LT_DATASET_PROMPT_COMPLETION;
  /* A line in both formats: the trainer reads a prompt and a completion that are both strings
   * (lt_train.c), not the messages checked here. */
  bool both = json_is_string(json_object_get(obj, "prompt")) && json_is_string(json_object_get(obj, "completion"));
  if (f == LT_DATASET_MESSAGES && both) {
    add_error(c, ln, "messages", "has both \"messages\" and a \"prompt\" and \"completion\": an example is in one "
              "format, chat or prompt/completion");
    json_decref(obj);
    return;
  }
  bool ok;
  if (f == LT_DATASET_MESSAGES) {
    ok = check_messages(c, ln, json_object_get(obj, "messages"));
  } else {
    bool p = need_text(c, ln, obj, "prompt", "prompt");
    bool q = need_text(c, ln, obj, "completion", "completion");
    ok = p && q;
  }
  if (ok && c->r.format != LT_DATASET_UNKNOWN && f != c->r.format) {
    add_error(c, ln, f == LT_DATASET_MESSAGES ? "messages" : "prompt",
              "is in the %s format, but earlier lines are in the %s format: use one per file",
              lt_dataset_format_name(f), lt_dataset_format_name(c->r.format));
    ok = false;
  }
  if (ok && c->tokens_fn) {
    int64_t t = c->tokens_fn(c->ctx, f, obj);
    if (t < 0) {
      add_error(c, ln, "", "cannot be tokenised");
      ok = false;
    } else if (c->lim.max_tokens > 0 && t > c->lim.max_tokens) {
      add_error(c, ln, "", "example has %lld tokens, over the limit of %d (max_tokens of POST /v1/datasets and "
                "/v1/uploads, 8 to 32768; 1024 for /v1/files)", (long long)t, c->lim.max_tokens);
      ok = false;
    } else {
      c->r.tokens += (uint64_t)t;
      if (t > c->r.longest_tokens) {
        c->r.longest_tokens = t;
        c->r.longest_line = ln;
      }
    }
  }
  if (ok) {
    if (c->r.format == LT_DATASET_UNKNOWN) c->r.format = f;
    c->r.examples++;
  }
  json_decref(obj);
}

static void end_line(lt_dataset_check_t *c) {
  c->r.lines++;
  if (c->line_too_long)
    add_error(c, c->r.lines, "", "line is longer than %zu bytes", c->lim.max_line_bytes);
  else
    check_line(c, c->line, c->line_len);
  c->line_len = 0;
  c->line_too_long = false;
}

/* Splits len bytes into lines and checks each line it completes. */
static void feed_lines(lt_dataset_check_t *c, const void *data, size_t len) {
  const char *p = data, *end = p + len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t n = (size_t)((nl ? nl : end) - p);
    if (!c->line_too_long) {
      if (c->line_len + n > c->lim.max_line_bytes) {
        c->line_too_long = true;
      } else {
        memcpy(c->line + c->line_len, p, n);
        c->line_len += n;
      }
    }
    if (!nl) break;
    end_line(c);
    p = nl + 1;
  }
}

lt_err_t lt_dataset_check_feed(lt_dataset_check_t *c, const void *data, size_t len) {
  if (c->r.over_quota) return LT_ERR_QUOTA;
  if (c->lim.max_bytes && c->r.bytes + len > c->lim.max_bytes) {
    /* The bytes up to the quota are read first (their complete lines checked), so the report
     * is the same however the body was cut into pieces; the quota error is kept even when the
     * kept errors are full, since the API answers with it. */
    size_t room = (size_t)(c->lim.max_bytes - c->r.bytes);
    feed_lines(c, data, room);
    c->r.bytes += room;
    c->r.over_quota = true;
    if (c->r.errors_kept == c->lim.max_errors) c->r.errors_kept--;
    add_error(c, 0, "", "the file is over the tenant's dataset quota of %llu bytes",
              (unsigned long long)c->lim.max_bytes);
    return LT_ERR_QUOTA;
  }
  c->r.bytes += len;
  feed_lines(c, data, len);
  return LT_OK;
}

lt_err_t lt_dataset_check_finish(lt_dataset_check_t *c, lt_dataset_report_t *report) {
  if (!c->finished) {
    c->finished = true;
    if (!c->r.over_quota && (c->line_len > 0 || c->line_too_long)) end_line(c);
    if (!c->r.over_quota && c->r.error_count == 0 && c->r.examples == 0)
      add_error(c, 0, "", "the file has no examples");
  }
  c->r.errors = c->errors;
  *report = c->r;
  if (c->r.over_quota) return LT_ERR_QUOTA;
  return c->r.error_count ? LT_ERR_INVALID : LT_OK;
}

json_t *lt_dataset_report_json(const lt_dataset_report_t *r, int32_t epochs) {
  json_t *o = json_object();
  json_object_set_new(o, "format", json_string(lt_dataset_format_name(r->format)));
  json_object_set_new(o, "bytes", json_integer((json_int_t)r->bytes));
  json_object_set_new(o, "lines", json_integer((json_int_t)r->lines));
  json_object_set_new(o, "examples", json_integer((json_int_t)r->examples));
  json_object_set_new(o, "tokens", json_integer((json_int_t)r->tokens));
  json_object_set_new(o, "longest_example_tokens", json_integer(r->longest_tokens));
  json_object_set_new(o, "longest_example_line", json_integer((json_int_t)r->longest_line));
  if (epochs > 0)
    json_object_set_new(o, "estimated_cost_token_steps", json_integer((json_int_t)(r->tokens * (uint64_t)epochs)));
  json_object_set_new(o, "error_count", json_integer((json_int_t)r->error_count));
  json_t *errs = json_array();
  for (size_t i = 0; i < r->errors_kept; i++) {
    json_t *e = json_object();
    json_object_set_new(e, "line", json_integer((json_int_t)r->errors[i].line));
    json_object_set_new(e, "field", json_string(r->errors[i].field));
    json_object_set_new(e, "reason", json_string(r->errors[i].reason));
    json_array_append_new(errs, e);
  }
  json_object_set_new(o, "errors", errs);
  return o;
}

void lt_dataset_object_key(char *out, size_t n, const char *tenant, const char *dataset_id, const char *leaf) {
  snprintf(out, n, "tenants/%s/datasets/%s/%s", tenant, dataset_id, leaf);
}
