/* lt_plan: a managed run's plan as JSON lines (see lt_plan.h). The writer prints with fprintf,
 * without building a tree, since a plan is a batch per micro-step; the reader uses jansson. */
#include "lt_plan.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- writing */

static void write_ints(FILE *f, const char *name, const int32_t *v, int T) {
  fprintf(f, "\"%s\":[", name);
  for (int t = 0; t < T; t++) fprintf(f, t ? ",%" PRId32 : "%" PRId32, v[t]);
  fputc(']', f);
}

/* %.9g: FLT_DECIMAL_DIG significant digits name every float exactly. */
static void write_floats(FILE *f, const char *name, const float *v, int T) {
  fprintf(f, "\"%s\":[", name);
  for (int t = 0; t < T; t++) fprintf(f, t ? ",%.9g" : "%.9g", (double)v[t]);
  fputc(']', f);
}

void lt_plan_write_batch(FILE *f, int64_t step, int micro, const lt_batch_t *b) {
  fprintf(f, "{\"type\":\"batch\",\"step\":%" PRId64 ",\"micro\":%d,\"rows\":[", step, micro);
  for (int r = 0; r < b->B; r++) {
    size_t at = (size_t)r * b->T;
    fputs(r ? ",{" : "{", f);
    write_ints(f, "tokens", b->tokens + at, b->T);
    fputc(',', f);
    write_ints(f, "targets", b->targets + at, b->T);
    if (b->weights) {
      fputc(',', f);
      write_floats(f, "weights", b->weights + at, b->T);
    }
    if (b->positions) {
      fputc(',', f);
      write_ints(f, "positions", b->positions + at, b->T);
    }
    fputc('}', f);
  }
  fputs("]}\n", f);
}

void lt_plan_write_update(FILE *f, int64_t step, const lt_adamw_t *o) {
  fprintf(f,
          "{\"type\":\"optim\",\"step\":%" PRId64 ",\"adam\":{\"lr\":%.9g,\"beta1\":%.9g,"
          "\"beta2\":%.9g,\"eps\":%.9g,\"weight_decay\":%.9g,\"grad_clip\":%.9g}}\n",
          step, (double)o->lr, (double)o->beta1, (double)o->beta2, (double)o->eps,
          (double)o->weight_decay, (double)o->max_grad_norm);
}

/* ---------------------------------------------------------------- reading */

/* rows[r][name], T numbers, into out + r * T (int32 when ints, else float). Absent: *present
 * = 0 when it may be, else an error. */
static lt_err_t read_row_array(const json_t *row, size_t r, const char *name, size_t T, int ints,
                               void *out, int *present, char *errstr, size_t n) {
  const json_t *a = json_object_get(row, name);
  if (!a && present) {
    *present = 0;
    return LT_OK;
  }
  if (present) *present = 1;
  if (!json_is_array(a) || json_array_size(a) != T)
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "plan: rows[%zu].%s: expected an array of %zu numbers", r, name, T);
  for (size_t t = 0; t < T; t++) {
    const json_t *x = json_array_get(a, t);
    if (ints ? !json_is_integer(x) : !json_is_number(x))
      return lt_errf(errstr, n, LT_ERR_INVALID, "plan: rows[%zu].%s[%zu]: expected %s", r, name,
                     t, ints ? "an integer" : "a number");
    if (ints) ((int32_t *)out)[r * T + t] = (int32_t)json_integer_value(x);
    else ((float *)out)[r * T + t] = (float)json_number_value(x);
  }
  return LT_OK;
}

/* A batch line's rows into the event's own arrays. */
static lt_err_t parse_rows(const json_t *rows, lt_plan_event_t *ev, char *errstr, size_t n) {
  if (!json_is_array(rows) || json_array_size(rows) == 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "plan: rows: expected a non-empty array");
  size_t B = json_array_size(rows);
  const json_t *first = json_object_get(json_array_get(rows, 0), "tokens");
  size_t T = json_is_array(first) ? json_array_size(first) : 0;
  if (T == 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "plan: rows[0].tokens: expected a non-empty array");
  ev->tokens = malloc(B * T * sizeof(int32_t));
  ev->targets = malloc(B * T * sizeof(int32_t));
  ev->positions = malloc(B * T * sizeof(int32_t));
  ev->weights = malloc(B * T * sizeof(float));
  if (!ev->tokens || !ev->targets || !ev->positions || !ev->weights) return LT_ERR_NOMEM;
  int has_w = 1, has_pos = 1;
  for (size_t r = 0; r < B; r++) {
    const json_t *row = json_array_get(rows, r);
    int w = 0, pos = 0;
    lt_err_t err;
    if ((err = read_row_array(row, r, "tokens", T, 1, ev->tokens, NULL, errstr, n)) ||
        (err = read_row_array(row, r, "targets", T, 1, ev->targets, NULL, errstr, n)) ||
        (err = read_row_array(row, r, "weights", T, 0, ev->weights, &w, errstr, n)) ||
        (err = read_row_array(row, r, "positions", T, 1, ev->positions, &pos, errstr, n)))
      return err;
    if (r > 0 && (w != has_w || pos != has_pos))
      return lt_errf(errstr, n, LT_ERR_INVALID,
                     "plan: rows[%zu]: weights/positions present in some rows only", r);
    has_w = w;
    has_pos = pos;
  }
  ev->batch = (lt_batch_t){.B = (int)B, .T = (int)T, .tokens = ev->tokens, .targets = ev->targets,
                           .weights = has_w ? ev->weights : NULL,
                           .positions = has_pos ? ev->positions : NULL};
  return LT_OK;
}

/* An optim line's "adam" object. */
static lt_err_t parse_adam(const json_t *adam, lt_adamw_t *o, char *errstr, size_t n) {
  static const char *names[6] = {"lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"};
  float *dst[6] = {&o->lr, &o->beta1, &o->beta2, &o->eps, &o->weight_decay, &o->max_grad_norm};
  for (int k = 0; k < 6; k++) {
    const json_t *x = json_object_get(adam, names[k]);
    if (!json_is_number(x))
      return lt_errf(errstr, n, LT_ERR_INVALID, "plan: adam.%s: expected a number", names[k]);
    *dst[k] = (float)json_number_value(x);
  }
  return LT_OK;
}

lt_err_t lt_plan_parse(const char *line, size_t len, lt_plan_event_t *ev, char *errstr, size_t n) {
  memset(ev, 0, sizeof *ev);
  json_error_t je;
  json_t *j = json_loadb(line, len, 0, &je);
  if (!j) return lt_errf(errstr, n, LT_ERR_INVALID, "plan: invalid JSON: %s", je.text);
  const char *type = json_string_value(json_object_get(j, "type"));
  const json_t *step = json_object_get(j, "step");
  lt_err_t err = LT_OK;
  if (!json_is_integer(step))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "plan: step: expected an integer");
  else if (type && strcmp(type, "batch") == 0) {
    ev->kind = LT_PLAN_BATCH;
    const json_t *micro = json_object_get(j, "micro");
    if (!json_is_integer(micro))
      err = lt_errf(errstr, n, LT_ERR_INVALID, "plan: micro: expected an integer");
    else {
      ev->micro = (int)json_integer_value(micro);
      err = parse_rows(json_object_get(j, "rows"), ev, errstr, n);
    }
  } else if (type && strcmp(type, "optim") == 0) {
    ev->kind = LT_PLAN_OPTIM;
    err = parse_adam(json_object_get(j, "adam"), &ev->adam, errstr, n);
  } else
    err = lt_errf(errstr, n, LT_ERR_INVALID, "plan: type: expected \"batch\" or \"optim\"");
  if (!err) ev->step = (int64_t)json_integer_value(step);
  json_decref(j);
  return err;
}

void lt_plan_event_free(lt_plan_event_t *ev) {
  free(ev->tokens);
  free(ev->targets);
  free(ev->positions);
  free(ev->weights);
  memset(ev, 0, sizeof *ev);
}
