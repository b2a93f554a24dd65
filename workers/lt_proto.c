/* lt_proto: the worker <-> executor messages to and from their JSON lines (see lt_proto.h).
 *
 * Every line is written by json_pack with one fixed format per type: the key order of the format
 * is the key order on the wire, and a value json_pack refuses (a NULL string, a NaN) refuses the
 * whole line, as the peers always did. The executor's lines carry reals to 10 significant digits
 * (metrics); the assignment carries them in full, since its spec's hyperparameters must arrive
 * exactly as the job asked for them. */
#include "lt_proto.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

static const char *const type_names[LT_PROTO__COUNT] = {
    [LT_PROTO_UNKNOWN] = "",       [LT_PROTO_ASSIGNMENT] = "",        [LT_PROTO_COMMITTED] = "committed",
    [LT_PROTO_STEP] = "step",      [LT_PROTO_EVAL] = "eval",          [LT_PROTO_CHECKPOINT] = "checkpoint",
    [LT_PROTO_STOPPED] = "stopped", [LT_PROTO_DONE] = "done",         [LT_PROTO_ERROR] = "error",
    [LT_PROTO_CALL] = "call",       [LT_PROTO_RESULT] = "result",     [LT_PROTO_READY] = "ready"};

const char *lt_proto_type_name(lt_proto_type_t type) {
  return (unsigned)type < LT_PROTO__COUNT ? type_names[type] : "";
}

/* ---------------------------------------------------------------- encoding */

static json_t *pack_assignment(const lt_proto_assignment_t *a) {
  json_t *o = json_pack("{s:s,s:s,s:i,s:o,s:s,s:s,s:s,s:i,s:{s:i,s:i,s:i},s:{s:s,s:s}}", "job_id", a->job_id,
                   "tenant_id", a->tenant_id, "attempt", (int)a->attempt, "spec", lt_jobspec_to_json(&a->spec),
                   "model_dir", a->model_dir, "work_dir", a->work_dir, "sealed_dir", a->sealed_dir, "threads",
                   a->threads, "inputs", "train_fd", a->train_fd, "valid_fd", a->valid_fd, "resume_fd", a->resume_fd,
                   "tenant_key", "key_id", a->key_id, "key_hex", a->key_hex);
  if (o && a->backend && strcmp(a->backend, "cpu") != 0)
    json_object_set_new(o, "device", json_pack("{s:s,s:i}", "backend", a->backend, "index", a->device));
  if (o && a->gang_world > 1)
    json_object_set_new(o, "gang", json_pack("{s:i,s:i,s:i,s:i}", "rank", a->gang_rank, "world", a->gang_world,
                                             "fd0", a->gang_fd0, "nfds", a->gang_nfds));
  return o;
}

static json_t *pack_step(const lt_train_step_t *st) {
  return json_pack("{s:s,s:I,s:I,s:f,s:f,s:f,s:I,s:I,s:f,s:I,s:I,s:f}", "type", "step", "step", (json_int_t)st->step,
                   "total_steps", (json_int_t)st->total_steps, "loss", st->loss, "learning_rate", st->learning_rate,
                   "grad_norm", st->grad_norm, "tokens", (json_int_t)st->tokens, "tokens_total",
                   (json_int_t)st->tokens_total, "tokens_per_s", st->tokens_per_s, "elapsed_ms",
                   (json_int_t)st->elapsed_ms, "eta_ms", (json_int_t)st->eta_ms, "epoch", st->epoch);
}

static json_t *pack_eval(const lt_train_eval_t *e) {
  return json_pack("{s:s,s:s,s:I,s:b,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}", "type", "eval", "config_digest",
                   e->config_digest, "step", (json_int_t)e->step, "final", e->final, "examples",
                   (json_int_t)e->examples, "val_loss", e->val_loss, "perplexity", e->perplexity, "token_accuracy",
                   e->token_accuracy, "exact_match", e->exact_match, "exact_match_ci_low", e->em_ci_low,
                   "exact_match_ci_high", e->em_ci_high, "base_val_loss", e->base_val_loss, "base_perplexity",
                   e->base_perplexity, "base_token_accuracy", e->base_token_accuracy, "base_exact_match",
                   e->base_exact_match);
}

static json_t *pack_checkpoint(const lt_ckpt_done_t *d) {
  json_t *keys = json_array();
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) json_array_append_new(keys, json_string(d->keys[i]));
  return json_pack("{s:s,s:I,s:b,s:s,s:o,s:s,s:I}", "type", "checkpoint", "step", (json_int_t)d->step, "final",
                   d->final, "trigger", d->trigger, "keys", keys, "sha256", d->sha256_hex, "bytes",
                   (json_int_t)d->bytes);
}

static json_t *pack_result(const lt_proto_result_t *r) {
  json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:I,s:I,s:f}", "type", "result", "seq", (json_int_t)r->seq, "kind",
                        r->kind, "status", r->ok ? "done" : "failed", "step", (json_int_t)r->step, "tokens",
                        (json_int_t)r->tokens, "duration_ms", r->duration_ms);
  if (!o) return NULL;
  /* A metric the kind does not have (NAN) is left out; so is one that is not finite. */
  if (isfinite(r->loss)) json_object_set_new(o, "loss", json_real(r->loss));
  if (isfinite(r->grad_norm)) json_object_set_new(o, "grad_norm", json_real(r->grad_norm));
  const char *strs[4][2] = {{"error_code", r->error_code}, {"error_field", r->error_field},
                            {"error_reason", r->error_reason}, {"body", r->body}};
  for (int i = 0; i < 4; i++)
    if (strs[i][1]) json_object_set_new(o, strs[i][0], json_string(strs[i][1]));
  return o;
}

static json_t *pack(const lt_proto_msg_t *m) {
  switch (m->type) {
  case LT_PROTO_ASSIGNMENT: return pack_assignment(&m->assignment);
  case LT_PROTO_COMMITTED:
  case LT_PROTO_READY:
    return json_pack("{s:s,s:I}", "type", type_names[m->type], "step", (json_int_t)m->committed.step);
  case LT_PROTO_STEP: return pack_step(&m->step);
  case LT_PROTO_EVAL: return pack_eval(&m->eval);
  case LT_PROTO_CHECKPOINT: return pack_checkpoint(&m->checkpoint);
  case LT_PROTO_STOPPED:
    return json_pack("{s:s,s:s,s:I}", "type", "stopped", "why",
                     m->stopped.why == LT_TRAIN_STOP_CANCEL ? "cancel" : "preempt", "step",
                     (json_int_t)m->stopped.step);
  case LT_PROTO_DONE:
    return json_pack("{s:s,s:I,s:s}", "type", "done", "step", (json_int_t)m->done.step, "config_digest",
                     m->done.config_digest);
  case LT_PROTO_ERROR: return json_pack("{s:s,s:s}", "type", "error", "reason", m->error.reason);
  case LT_PROTO_CALL:
    return json_pack("{s:s,s:I,s:s,s:s?}", "type", "call", "seq", (json_int_t)m->call.seq, "kind", m->call.kind,
                     "body", m->call.body);
  case LT_PROTO_RESULT: return pack_result(&m->result);
  default: return NULL;
  }
}

lt_err_t lt_proto_encode(const lt_proto_msg_t *msg, char **line, size_t *len) {
  *line = NULL;
  *len = 0;
  json_t *o = pack(msg);
  if (!o) return LT_ERR_INVALID;
  size_t flags = JSON_COMPACT | (msg->type == LT_PROTO_ASSIGNMENT ? 0 : JSON_REAL_PRECISION(10));
  char *s = json_dumps(o, flags);
  json_decref(o);
  if (!s) return LT_ERR_NOMEM;
  size_t n = strlen(s);
  char *out = realloc(s, n + 2);
  if (!out) {
    free(s);
    return LT_ERR_NOMEM;
  }
  out[n] = '\n';
  out[n + 1] = '\0';
  *line = out;
  *len = n + 1;
  return LT_OK;
}

/* ---------------------------------------------------------------- decoding */

static int64_t get_int(const json_t *o, const char *k) { return json_integer_value(json_object_get(o, k)); }
static double get_num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *get_str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }
static bool get_bool(const json_t *o, const char *k) { return json_is_true(json_object_get(o, k)); }

static lt_err_t read_assignment(const json_t *o, lt_proto_assignment_t *a, char *errstr, size_t n) {
  json_t *in = json_object_get(o, "inputs"), *tk = json_object_get(o, "tenant_key");
  a->job_id = get_str(o, "job_id");
  a->tenant_id = get_str(o, "tenant_id");
  a->attempt = (int32_t)get_int(o, "attempt");
  a->model_dir = get_str(o, "model_dir");
  a->work_dir = get_str(o, "work_dir");
  a->sealed_dir = get_str(o, "sealed_dir");
  a->threads = (int)get_int(o, "threads");
  a->train_fd = json_is_integer(json_object_get(in, "train_fd")) ? (int)get_int(in, "train_fd") : -1;
  a->valid_fd = json_is_integer(json_object_get(in, "valid_fd")) ? (int)get_int(in, "valid_fd") : -1;
  a->resume_fd = json_is_integer(json_object_get(in, "resume_fd")) ? (int)get_int(in, "resume_fd") : -1;
  a->key_id = get_str(tk, "key_id");
  a->key_hex = get_str(tk, "key_hex");
  if (!a->tenant_id || !a->job_id || a->attempt < 1 || !a->model_dir || !a->work_dir || !a->sealed_dir ||
      !a->key_id || !a->key_hex)
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "the assignment lacks a field (job_id, tenant_id, attempt, model_dir, work_dir, sealed_dir, "
                   "tenant_key.key_id, tenant_key.key_hex)");
  char field[96], err[512];
  if (lt_jobspec_from_json(json_object_get(o, "spec"), &a->spec, field, sizeof field, err, sizeof err))
    return lt_errf(errstr, n, LT_ERR_INVALID, "the job spec is invalid: %s", err);
  if (a->train_fd < 0 && a->spec.mode == LT_MODE_MANAGED)
    return lt_errf(errstr, n, LT_ERR_INVALID, "the assignment of a managed job lacks inputs.train_fd");
  json_t *d = json_object_get(o, "device");
  a->backend = d ? get_str(d, "backend") : "cpu";
  a->device = d ? (int)get_int(d, "index") : -1;
  if (d && (!a->backend || strcmp(a->backend, "cuda") != 0 || !json_is_integer(json_object_get(d, "index")) ||
            a->device < 0))
    return lt_errf(errstr, n, LT_ERR_INVALID, "device: want {\"backend\": \"cuda\", \"index\": GPU >= 0}, got "
                   "backend %s, index %d", a->backend ? a->backend : "(none)", a->device);
  json_t *g = json_object_get(o, "gang");
  a->gang_rank = (int)get_int(g, "rank");
  a->gang_world = g ? (int)get_int(g, "world") : 1;
  a->gang_fd0 = (int)get_int(g, "fd0");
  a->gang_nfds = (int)get_int(g, "nfds");
  if (g && (a->gang_world < 2 || a->gang_rank < 0 || a->gang_rank >= a->gang_world || a->gang_fd0 < 3 ||
            a->gang_nfds != (a->gang_rank == 0 ? a->gang_world - 1 : 1) || a->spec.mode != LT_MODE_MANAGED))
    return lt_errf(errstr, n, LT_ERR_INVALID, "gang: rank %d of world %d on %d descriptors from %d is not a "
                   "managed job's gang", a->gang_rank, a->gang_world, a->gang_nfds, a->gang_fd0);
  return LT_OK;
}

static void read_step(const json_t *o, lt_train_step_t *st) {
  st->step = get_int(o, "step");
  st->total_steps = get_int(o, "total_steps");
  st->loss = get_num(o, "loss");
  st->learning_rate = get_num(o, "learning_rate");
  st->grad_norm = get_num(o, "grad_norm");
  st->tokens = get_int(o, "tokens");
  st->tokens_total = get_int(o, "tokens_total");
  st->tokens_per_s = get_num(o, "tokens_per_s");
  st->elapsed_ms = get_int(o, "elapsed_ms");
  st->eta_ms = get_int(o, "eta_ms");
  st->epoch = get_num(o, "epoch");
}

static void read_eval(const json_t *o, lt_train_eval_t *e) {
  const char *digest = get_str(o, "config_digest");
  snprintf(e->config_digest, sizeof e->config_digest, "%s", digest ? digest : "");
  e->step = get_int(o, "step");
  e->final = get_bool(o, "final");
  e->examples = get_int(o, "examples");
  e->val_loss = get_num(o, "val_loss");
  e->perplexity = get_num(o, "perplexity");
  e->token_accuracy = get_num(o, "token_accuracy");
  e->exact_match = get_num(o, "exact_match");
  e->em_ci_low = get_num(o, "exact_match_ci_low");
  e->em_ci_high = get_num(o, "exact_match_ci_high");
  e->base_val_loss = get_num(o, "base_val_loss");
  e->base_perplexity = get_num(o, "base_perplexity");
  e->base_token_accuracy = get_num(o, "base_token_accuracy");
  e->base_exact_match = get_num(o, "base_exact_match");
}

static lt_err_t read_checkpoint(const json_t *o, lt_ckpt_done_t *d, char *errstr, size_t n) {
  const json_t *keys = json_object_get(o, "keys");
  if (json_array_size(keys) > LT_CKPT_NAMES)
    return lt_errf(errstr, n, LT_ERR_INVALID, "a checkpoint names %zu objects, not %d", json_array_size(keys),
                   LT_CKPT_NAMES);
  for (size_t i = 0; i < json_array_size(keys); i++) d->keys[i] = json_string_value(json_array_get(keys, i));
  const char *sha = get_str(o, "sha256");
  snprintf(d->sha256_hex, sizeof d->sha256_hex, "%s", sha ? sha : "");
  d->step = get_int(o, "step");
  d->final = get_bool(o, "final");
  d->trigger = get_str(o, "trigger");
  d->bytes = (uint64_t)get_int(o, "bytes");
  return LT_OK;
}

static double get_metric(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

static void read_result(const json_t *o, lt_proto_result_t *r) {
  const char *status = get_str(o, "status");
  r->seq = get_int(o, "seq");
  r->kind = get_str(o, "kind");
  r->ok = status && strcmp(status, "done") == 0;
  r->error_code = get_str(o, "error_code");
  r->error_field = get_str(o, "error_field");
  r->error_reason = get_str(o, "error_reason");
  r->step = get_int(o, "step");
  r->tokens = get_int(o, "tokens");
  r->loss = get_metric(o, "loss");
  r->grad_norm = get_metric(o, "grad_norm");
  r->duration_ms = get_num(o, "duration_ms");
  r->body = get_str(o, "body");
}

static lt_proto_type_t type_of(const json_t *o) {
  const json_t *t = json_object_get(o, "type");
  if (!t) return LT_PROTO_ASSIGNMENT;
  const char *name = json_string_value(t);
  for (int i = LT_PROTO_COMMITTED; name && i < LT_PROTO__COUNT; i++)
    if (strcmp(name, type_names[i]) == 0) return (lt_proto_type_t)i;
  return LT_PROTO_UNKNOWN;
}

lt_err_t lt_proto_decode(const char *line, lt_proto_msg_t *msg, char *errstr, size_t n) {
  memset(msg, 0, sizeof *msg);
  json_error_t je;
  json_t *o = json_loads(line, 0, &je);
  if (!o) return lt_errf(errstr, n, LT_ERR_CORRUPT, "%s", je.text);
  msg->doc_ = o;
  msg->type = type_of(o);
  switch (msg->type) {
  case LT_PROTO_ASSIGNMENT: return read_assignment(o, &msg->assignment, errstr, n);
  case LT_PROTO_COMMITTED:
  case LT_PROTO_READY: msg->committed.step = get_int(o, "step"); break;
  case LT_PROTO_STEP: read_step(o, &msg->step); break;
  case LT_PROTO_EVAL: read_eval(o, &msg->eval); break;
  case LT_PROTO_CHECKPOINT: return read_checkpoint(o, &msg->checkpoint, errstr, n);
  case LT_PROTO_STOPPED: {
    const char *why = get_str(o, "why");
    msg->stopped.why = why && strcmp(why, "cancel") == 0 ? LT_TRAIN_STOP_CANCEL : LT_TRAIN_STOP_PREEMPT;
    msg->stopped.step = get_int(o, "step");
    break;
  }
  case LT_PROTO_DONE:
    msg->done.step = get_int(o, "step");
    msg->done.config_digest = get_str(o, "config_digest");
    break;
  case LT_PROTO_ERROR: msg->error.reason = get_str(o, "reason"); break;
  case LT_PROTO_CALL:
    msg->call.seq = get_int(o, "seq");
    msg->call.kind = get_str(o, "kind");
    msg->call.body = get_str(o, "body");
    break;
  case LT_PROTO_RESULT: read_result(o, &msg->result); break;
  default: break;
  }
  return LT_OK;
}

void lt_proto_msg_release(lt_proto_msg_t *msg) {
  json_decref(msg->doc_);
  memset(msg, 0, sizeof *msg);
}
