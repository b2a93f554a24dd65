/* lt_executor_session: a training session in its executor (docs/DESIGN.md §5).
 *
 * The session's adapter and AdamW state live here, over the shared base model, for as long as the
 * attempt runs. The worker sends the session's calls in sequence order ("call" lines, lt_proto.h);
 * each is run to its end before the next, and answered with one "result" line. Compute calls go
 * through lt_prim.c to the engine's primitives. The calls that keep state are checkpoints, made
 * exactly like a managed job's: save_state and save_weights_for_sampler write the state and the
 * PEFT adapter, the sealing thread seals them, and the result is sent only once the worker has
 * recorded the commit (CheckpointCommitted). A checkpoint's number (its "step" on the bus) is the
 * sequence number of the call that made it, so names never collide and a resumed attempt knows
 * every call up to it is done; the optimizer step is in the state and in each result.
 *
 * load_state reads a state file the worker fetched into this attempt's private directory. The end
 * of the session (the "end" call) makes the final checkpoint, which the publisher promotes as the
 * session's artifacts. A cancel stops at once; a preemption checkpoints first. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "lt_backend_cuda.h"
#include "lt_callspec.h"
#include "lt_executor_int.h"
#include "lt_prim.h"

typedef struct {
  exec_t *x;
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *sess;
  const lt_model_config_t *mc;
  int64_t last_seq;   /* the newest call done: the data cursor of every state this session saves */
  json_t *config;     /* what the session was made with (lathe_run.json) */
  char digest[65];
} sess_t;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static lt_err_t write_json(const char *dir, const char *name, json_t *v, char *errstr, size_t n) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  lt_err_t err = json_dump_file(v, path, JSON_COMPACT) == 0
                     ? LT_OK
                     : lt_errf(errstr, n, LT_ERR_IO, "cannot write %s: %s", name, strerror(errno));
  json_decref(v);
  return err;
}

/* The engine and a fresh session from the spec's lora_* and seed; the resumed state, if any. */
static lt_err_t open_session(sess_t *s, char *errstr, size_t n) {
  const lt_proto_assignment_t *a = s->x->asg;
  const lt_hparams_t *hp = &a->spec.hp;
  lt_err_t err = a->backend && strcmp(a->backend, "cuda") == 0
                     ? lt_backend_cuda_new_opts(a->device, NULL, &s->be, errstr, n) /* f32: as on the cpu */
                     : lt_backend_cpu_new(a->threads > 0 ? a->threads : 1, &s->be, errstr, n);
  if (!err) err = lt_engine_open(a->model_dir, s->be, &s->eng, errstr, n);
  if (err) return err;
  s->mc = lt_engine_config(s->eng);
  lt_session_config_t sc = lt_prim_session_config(hp->lora_rank, hp->lora_alpha, hp->lora_dropout,
                                                  hp->target_modules, hp->seed);
  if ((err = lt_session_new(s->eng, &sc, &s->sess, errstr, n))) return err;
  s->config = json_pack("{s:s,s:s,s:o}", "mode", "interactive", "base_model", a->spec.base_model, "spec",
                        lt_jobspec_to_json(&a->spec));
  char *canon = json_dumps(s->config, JSON_COMPACT | JSON_SORT_KEYS);
  uint8_t d[32];
  unsigned dl;
  EVP_Digest(canon, strlen(canon), d, &dl, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) snprintf(s->digest + 2 * i, 3, "%02x", d[i]);
  free(canon);
  if (!s->x->resume_path[0]) return LT_OK;
  uint64_t cursor = 0;
  if ((err = lt_load_state(s->sess, s->x->resume_path, &cursor, errstr, n))) return err;
  s->last_seq = (int64_t)cursor;
  return LT_OK;
}

/* Writes the session's checkpoint files (as lt_train_run's, so the publisher takes them alike) and
 * hands them to the sealing thread under number seq; then waits for the worker's commit. */
static lt_err_t checkpoint(sess_t *s, int64_t seq, const char *name, bool final, const char *trigger, char *errstr,
                           size_t n) {
  exec_t *x = s->x;
  const char *dir = x->asg->work_dir;
  char path[4200];
  snprintf(path, sizeof path, "%s/state.bin", dir);
  lt_err_t err = lt_save_state(s->sess, path, (uint64_t)seq, errstr, n);
  char base_ref[256];
  lt_train_base_ref(x->asg->model_dir, x->asg->spec.base_model, base_ref, sizeof base_ref);
  if (!err) err = lt_export_peft(s->sess, dir, base_ref, errstr, n);
  if (!err)
    err = write_json(dir, "metrics.json",
                     json_pack("{s:s,s:I,s:I}", "name", name, "step", (json_int_t)lt_session_step(s->sess), "seq",
                               (json_int_t)seq),
                     errstr, n);
  if (!err) err = write_json(dir, "eval.json", json_object(), errstr, n);
  if (!err)
    err = write_json(dir, "lathe_run.json", json_pack("{s:s,s:O}", "config_digest", s->digest, "config", s->config),
                     errstr, n);
  if (!err) err = write_json(dir, "samples.json", json_array(), errstr, n);
  if (!err) err = lt_ckpt_submit(x->ckpt, dir, seq, final, trigger, errstr, n);
  if (err) return err;
  x->submitted = seq;
  return lt_exec_wait_committed(x, seq, false, errstr, n);
}

/* A state the worker fetched for load_state: a file in this attempt's private directory, removed
 * once read. */
static lt_err_t load_named(sess_t *s, const json_t *body, lt_prim_out_t *out, char *errstr, size_t n) {
  const char *file = json_string_value(json_object_get(body, "state_file"));
  const char *name = json_string_value(json_object_get(body, "name"));
  if (!file || !name || strchr(file, '/')) {
    snprintf(out->code, sizeof out->code, "invalid");
    snprintf(out->field, sizeof out->field, "name");
    snprintf(out->reason, sizeof out->reason, "name: no saved state of that name in this session");
    return LT_ERR_INVALID;
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", s->x->asg->work_dir, file);
  uint64_t cursor = 0;
  lt_err_t err = lt_load_state(s->sess, path, &cursor, errstr, n);
  unlink(path);
  if (err) {
    snprintf(out->code, sizeof out->code, "internal");
    snprintf(out->reason, sizeof out->reason, "the saved state %s does not load: %s", name, errstr);
    return err;
  }
  out->body = json_pack("{s:s,s:I}", "name", name, "step", (json_int_t)lt_session_step(s->sess));
  return LT_OK;
}

/* Runs one call; *fatal is set when the attempt cannot go on (a checkpoint that did not commit). */
static void run_call(sess_t *s, const lt_proto_call_t *c, const json_t *body, lt_prim_out_t *out, bool *ended,
                     lt_err_t *fatal, char *errstr, size_t n) {
  const char *kind = c->kind ? c->kind : "";
  if (lt_prim_is_compute(kind)) {
    lt_prim_run(s->sess, s->mc, kind, body, out);
    return;
  }
  memset(out, 0, sizeof *out);
  out->loss = out->grad_norm = NAN;
  const char *name = json_string_value(json_object_get(body, "name"));
  bool save = lt_callspec_saves_state(kind);
  if (save || strcmp(kind, "end") == 0) {
    *ended = !save;
    *fatal = checkpoint(s, c->seq, name ? name : "final", !save, save ? "save_state" : "final", errstr, n);
    if (!*fatal)
      out->body = json_pack("{s:s,s:I,s:I}", "name", name ? name : "final", "step",
                            (json_int_t)lt_session_step(s->sess), "checkpoint", (json_int_t)c->seq);
    return;
  }
  if (strcmp(kind, "load_state") == 0) {
    load_named(s, body, out, errstr, n);
    return;
  }
  snprintf(out->code, sizeof out->code, "invalid");
  snprintf(out->field, sizeof out->field, "kind");
  snprintf(out->reason, sizeof out->reason, "kind: unknown call \"%.40s\"", kind);
}

/* Runs the call and reports it; false when the attempt must end (*fatal says why, or the call
 * ended the session). */
static bool serve_one(sess_t *s, lt_exec_call_t *call, lt_err_t *fatal, bool *ended, char *errstr, size_t n) {
  const lt_proto_call_t *c = &call->msg.call;
  double t0 = now_ms();
  if (!lt_callspec_runs_after(c->kind, c->seq, s->last_seq)) { /* the state holds it: answered, not run */
    lt_proto_result_t r = {.seq = c->seq, .kind = c->kind, .ok = false, .error_code = "internal",
                           .error_reason = "the call ran before the state this attempt resumed from",
                           .step = lt_session_step(s->sess), .loss = NAN, .grad_norm = NAN};
    lt_exec_emit_line(&(lt_proto_msg_t){.type = LT_PROTO_RESULT, .result = r}, false);
    return true;
  }
  json_error_t je;
  json_t *body = c->body ? json_loads(c->body, 0, &je) : json_object();
  lt_prim_out_t out;
  if (!body) {
    memset(&out, 0, sizeof out);
    out.loss = out.grad_norm = NAN;
    snprintf(out.code, sizeof out.code, "invalid");
    snprintf(out.field, sizeof out.field, "body");
    snprintf(out.reason, sizeof out.reason, "the call is not JSON: %s", je.text);
  } else {
    run_call(s, c, body, &out, ended, fatal, errstr, n);
  }
  json_decref(body);
  if (*fatal) return false;
  char *text = out.body ? json_dumps(out.body, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
  bool ok = out.body != NULL;
  lt_proto_result_t r = {.seq = c->seq, .kind = c->kind, .ok = ok, .error_code = ok ? NULL : out.code,
                         .error_field = !ok && out.field[0] ? out.field : NULL, .error_reason = ok ? NULL : out.reason,
                         .step = lt_session_step(s->sess), .tokens = out.tokens, .loss = out.loss,
                         .grad_norm = out.grad_norm, .duration_ms = now_ms() - t0, .body = text};
  lt_exec_emit_line(&(lt_proto_msg_t){.type = LT_PROTO_RESULT, .result = r}, false);
  if (text) {
    OPENSSL_cleanse(text, strlen(text));
    free(text);
  }
  json_decref(out.body);
  s->last_seq = c->seq;
  return !*ended;
}

static void sess_close(sess_t *s) {
  lt_session_destroy(s->sess);
  lt_engine_close(s->eng);
  lt_backend_destroy(s->be);
  json_decref(s->config);
}

lt_err_t lt_exec_session(exec_t *x, char *errstr, size_t n) {
  sess_t s = {.x = x};
  lt_err_t err = open_session(&s, errstr, n);
  if (!err) lt_exec_emit_line(&(lt_proto_msg_t){.type = LT_PROTO_READY, .committed.step = lt_session_step(s.sess)}, false);
  bool ended = false, gone = false;
  while (!err && !ended) {
    lt_exec_call_t *c = lt_exec_next_call(&gone);
    if (!c) {
      if (lt_exec_stop_cancel || lt_exec_stop_preempt || gone) break;
      continue;
    }
    serve_one(&s, c, &err, &ended, errstr, n);
    lt_exec_call_free(c);
  }
  if (!err && ended) {
    lt_exec_emit_line(&(lt_proto_msg_t){.type = LT_PROTO_DONE, .done = {lt_session_step(s.sess), s.digest}}, true);
  } else if (!err && lt_exec_stop_cancel) {
    lt_exec_emit_line(&(lt_proto_msg_t){.type = LT_PROTO_STOPPED, .stopped = {LT_TRAIN_STOP_CANCEL, lt_session_step(s.sess)}},
                      true);
  } else if (!err && lt_exec_stop_preempt) {
    /* The state as of the last call, unless that call saved it already. */
    if (s.last_seq > 0 && x->submitted != s.last_seq)
      err = checkpoint(&s, s.last_seq, "preempt", false, "preempt", errstr, n);
    if (!err)
      lt_exec_emit_line(
          &(lt_proto_msg_t){.type = LT_PROTO_STOPPED, .stopped = {LT_TRAIN_STOP_PREEMPT, lt_session_step(s.sess)}}, true);
  } else if (!err && gone) {
    err = lt_errf(errstr, n, LT_ERR_IO, "the worker closed the session's calls");
  }
  if (err) lt_ckpt_abort(x->ckpt);
  sess_close(&s);
  return err;
}
