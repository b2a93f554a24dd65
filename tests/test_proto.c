/* Tests of the worker <-> executor protocol (workers/lt_proto): every message type survives an
 * encode and a decode with its fields; the wire bytes of the lines the worker writes are exactly
 * what both sides have always read; what a confused or hostile executor could print (not JSON,
 * an assignment with a spec that does not validate, too many checkpoint keys, an unknown type)
 * is refused or ignored with a reason, never half-read. */
#include <math.h>
#include <string.h>

#include <criterion/criterion.h>

#include "lt_proto.h"

static lt_proto_msg_t roundtrip(const lt_proto_msg_t *in) {
  char *line = NULL, err[256] = "";
  size_t len = 0;
  cr_assert_eq(lt_proto_encode(in, &line, &len), LT_OK, "encode %s", lt_proto_type_name(in->type));
  cr_assert_eq(line[len - 1], '\n', "one line, newline included");
  cr_assert_null(memchr(line, '\n', len - 1), "no newline inside the line: %s", line);
  lt_proto_msg_t out;
  cr_assert_eq(lt_proto_decode(line, &out, err, sizeof err), LT_OK, "%s: %s", line, err);
  free(line);
  return out;
}

Test(proto, committed_line_is_the_bytes_the_executor_waits_for) {
  lt_proto_msg_t m = {.type = LT_PROTO_COMMITTED, .committed = {.step = 40}};
  char *line;
  size_t len;
  cr_assert_eq(lt_proto_encode(&m, &line, &len), LT_OK);
  cr_assert_str_eq(line, "{\"type\":\"committed\",\"step\":40}\n");
  cr_assert_eq(len, strlen(line));
  free(line);
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_eq(out.type, LT_PROTO_COMMITTED);
  cr_assert_eq(out.committed.step, 40);
  lt_proto_msg_release(&out);
}

Test(proto, step_and_eval_keep_their_metrics) {
  lt_proto_msg_t m = {.type = LT_PROTO_STEP,
                      .step = {.step = 7, .total_steps = 300, .loss = 1.25, .learning_rate = 2e-4,
                               .grad_norm = 0.5, .tokens = 1024, .tokens_per_s = 181.5, .elapsed_ms = 9000,
                               .eta_ms = 120000, .epoch = 0.75}};
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_eq(out.type, LT_PROTO_STEP);
  cr_assert_eq(out.step.step, 7);
  cr_assert_eq(out.step.total_steps, 300);
  cr_assert_float_eq(out.step.loss, 1.25, 1e-12);
  cr_assert_float_eq(out.step.learning_rate, 2e-4, 1e-12);
  cr_assert_eq(out.step.tokens, 1024);
  cr_assert_eq(out.step.eta_ms, 120000);
  cr_assert_float_eq(out.step.epoch, 0.75, 1e-12);
  lt_proto_msg_release(&out);

  lt_proto_msg_t e = {.type = LT_PROTO_EVAL,
                      .eval = {.step = 300, .final = true, .examples = 400, .val_loss = 0.5, .perplexity = 1.65,
                               .exact_match = 0.75, .em_ci_low = 0.69, .em_ci_high = 0.81,
                               .base_exact_match = 0.0}};
  strcpy(e.eval.config_digest, "ab12");
  out = roundtrip(&e);
  cr_assert_eq(out.type, LT_PROTO_EVAL);
  cr_assert(out.eval.final);
  cr_assert_eq(out.eval.examples, 400);
  cr_assert_float_eq(out.eval.exact_match, 0.75, 1e-9);
  cr_assert_float_eq(out.eval.em_ci_high, 0.81, 1e-9);
  cr_assert_str_eq(out.eval.config_digest, "ab12");
  lt_proto_msg_release(&out);
}

Test(proto, checkpoint_names_every_object_and_its_hash) {
  lt_proto_msg_t m = {.type = LT_PROTO_CHECKPOINT,
                      .checkpoint = {.step = 40, .final = false, .trigger = "interval", .bytes = 3400000}};
  static const char *keys[LT_CKPT_NAMES];
  char names[LT_CKPT_NAMES][64];
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) {
    snprintf(names[i], sizeof names[i], "staging/acme/job-1/1/40/object-%zu", i);
    keys[i] = names[i];
    m.checkpoint.keys[i] = keys[i];
  }
  memset(m.checkpoint.sha256_hex, 'f', 64);
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_eq(out.type, LT_PROTO_CHECKPOINT);
  cr_assert_eq(out.checkpoint.step, 40);
  cr_assert_str_eq(out.checkpoint.trigger, "interval");
  cr_assert_eq(out.checkpoint.bytes, 3400000);
  cr_assert_str_eq(out.checkpoint.sha256_hex, m.checkpoint.sha256_hex);
  for (size_t i = 0; i < LT_CKPT_NAMES; i++) cr_assert_str_eq(out.checkpoint.keys[i], names[i], "key %zu", i);
  lt_proto_msg_release(&out);
}

Test(proto, last_messages_say_how_the_attempt_ended) {
  lt_proto_msg_t s = {.type = LT_PROTO_STOPPED, .stopped = {.why = LT_TRAIN_STOP_CANCEL, .step = 12}};
  lt_proto_msg_t out = roundtrip(&s);
  cr_assert_eq(out.type, LT_PROTO_STOPPED);
  cr_assert_eq(out.stopped.why, LT_TRAIN_STOP_CANCEL);
  cr_assert_eq(out.stopped.step, 12);
  lt_proto_msg_release(&out);
  s.stopped.why = LT_TRAIN_STOP_PREEMPT;
  out = roundtrip(&s);
  cr_assert_eq(out.stopped.why, LT_TRAIN_STOP_PREEMPT);
  lt_proto_msg_release(&out);

  lt_proto_msg_t d = {.type = LT_PROTO_DONE, .done = {.step = 300, .config_digest = "cafe"}};
  out = roundtrip(&d);
  cr_assert_eq(out.type, LT_PROTO_DONE);
  cr_assert_eq(out.done.step, 300);
  cr_assert_str_eq(out.done.config_digest, "cafe");
  lt_proto_msg_release(&out);

  lt_proto_msg_t f = {.type = LT_PROTO_ERROR, .error = {.reason = "checkpoint upload failed: store down"}};
  out = roundtrip(&f);
  cr_assert_eq(out.type, LT_PROTO_ERROR);
  cr_assert_str_eq(out.error.reason, "checkpoint upload failed: store down");
  lt_proto_msg_release(&out);
}

Test(proto, assignment_carries_the_spec_the_input_descriptors_and_the_data_key) {
  lt_proto_msg_t m = {.type = LT_PROTO_ASSIGNMENT,
                      .assignment = {.job_id = "job-1", .tenant_id = "acme", .attempt = 2,
                                     .model_dir = "/models/lathe-tiny/", .work_dir = "/dev/shm/a1",
                                     .sealed_dir = "/work/a1", .threads = 2, .train_fd = 3, .valid_fd = -1,
                                     .resume_fd = 5, .key_id = "k1", .key_hex = "00ff"}};
  lt_jobspec_defaults(&m.assignment.spec);
  snprintf(m.assignment.spec.base_model, sizeof m.assignment.spec.base_model, "lathe-tiny");
  snprintf(m.assignment.spec.dataset_id, sizeof m.assignment.spec.dataset_id, "ds-1");
  m.assignment.spec.hp.max_steps = 60;
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_eq(out.type, LT_PROTO_ASSIGNMENT);
  lt_proto_assignment_t *a = &out.assignment;
  cr_assert_str_eq(a->job_id, "job-1");
  cr_assert_str_eq(a->tenant_id, "acme");
  cr_assert_eq(a->attempt, 2);
  cr_assert_eq(a->threads, 2);
  cr_assert_eq(a->train_fd, 3);
  cr_assert_eq(a->valid_fd, -1);
  cr_assert_eq(a->resume_fd, 5);
  cr_assert_str_eq(a->sealed_dir, "/work/a1");
  cr_assert_str_eq(a->key_hex, "00ff");
  cr_assert_eq(a->spec.hp.max_steps, 60);
  cr_assert_str_eq(a->spec.base_model, "lathe-tiny");
  lt_proto_msg_release(&out);
}

/* The GPU a worker gives an attempt travels in the assignment; a cpu attempt's line has none and
 * reads as cpu; a device the worker could not have meant is refused, naming the field. */
Test(proto, assignment_names_the_gpu_and_a_device_that_is_not_one_is_refused) {
  lt_proto_msg_t m = {.type = LT_PROTO_ASSIGNMENT,
                      .assignment = {.job_id = "job-1", .tenant_id = "acme", .attempt = 1, .model_dir = "/m",
                                     .work_dir = "/dev/shm/a1", .sealed_dir = "/work/a1", .threads = 1,
                                     .backend = "cuda", .device = 3, .train_fd = 3, .valid_fd = -1,
                                     .resume_fd = -1, .key_id = "k1", .key_hex = "00ff"}};
  lt_jobspec_defaults(&m.assignment.spec);
  snprintf(m.assignment.spec.base_model, sizeof m.assignment.spec.base_model, "lathe-tiny");
  snprintf(m.assignment.spec.dataset_id, sizeof m.assignment.spec.dataset_id, "ds-1");
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_str_eq(out.assignment.backend, "cuda");
  cr_assert_eq(out.assignment.device, 3);
  lt_proto_msg_release(&out);

  m.assignment.backend = "cpu";
  char *line = NULL, err[256] = "";
  size_t len = 0;
  cr_assert_eq(lt_proto_encode(&m, &line, &len), LT_OK);
  cr_assert_null(strstr(line, "\"device\""), "a cpu attempt's line names no device: %s", line);
  out = roundtrip(&m);
  cr_assert_str_eq(out.assignment.backend, "cpu");
  cr_assert_eq(out.assignment.device, -1);
  lt_proto_msg_release(&out);

  static const char *const forged[] = {"{\"backend\":\"tpu\",\"index\":0}", "{\"backend\":\"cuda\",\"index\":-1}",
                                       "{\"backend\":\"cuda\"}", "{\"index\":0}"};
  for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
    char buf[4096];
    snprintf(buf, sizeof buf, "{\"device\":%s,%s", forged[i], line + 1);
    lt_proto_msg_t bad;
    cr_assert_eq(lt_proto_decode(buf, &bad, err, sizeof err), LT_ERR_INVALID, "%s", forged[i]);
    cr_assert(strstr(err, "device") != NULL, "%s: %s", forged[i], err);
  }
  free(line);
}

/* What an executor could print that is not a message: each is refused with a reason. */
static const struct {
  const char *line;
  lt_err_t want;
} bad_lines[] = {
    {"not json at all", LT_ERR_CORRUPT},
    {"{\"type\":\"step\",", LT_ERR_CORRUPT},
    {"{\"job_id\":\"j\"}", LT_ERR_INVALID}, /* an assignment missing its fields */
    {"{\"type\":\"checkpoint\",\"step\":1,\"keys\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}",
     LT_ERR_INVALID},
};

Test(proto, lines_that_are_not_messages_are_refused_with_a_reason) {
  for (size_t i = 0; i < sizeof bad_lines / sizeof bad_lines[0]; i++) {
    lt_proto_msg_t m;
    char err[256] = "";
    lt_err_t e = lt_proto_decode(bad_lines[i].line, &m, err, sizeof err);
    cr_expect_eq(e, bad_lines[i].want, "%s: %s (%s)", bad_lines[i].line, lt_err_name(e), err);
    cr_expect_neq(err[0], '\0', "%s: no reason given", bad_lines[i].line);
    lt_proto_msg_release(&m);
  }
}

Test(proto, a_type_this_version_does_not_know_is_read_as_unknown) {
  lt_proto_msg_t m;
  char err[256] = "";
  cr_assert_eq(lt_proto_decode("{\"type\":\"telemetry\",\"x\":1}\n", &m, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(m.type, LT_PROTO_UNKNOWN);
  lt_proto_msg_release(&m);
}

Test(proto, a_value_that_cannot_be_written_is_an_error_not_a_line) {
  lt_proto_msg_t m = {.type = LT_PROTO_DONE, .done = {.step = 1, .config_digest = NULL}};
  char *line = (char *)1;
  size_t len = 1;
  cr_assert_eq(lt_proto_encode(&m, &line, &len), LT_ERR_INVALID);
  cr_assert_null(line);
  cr_assert_eq(len, 0);
}

/* A training session's messages: the call's body crosses whole (a JSON text inside a JSON string,
 * newlines and quotes included); a result keeps its error fields, leaves out a metric it does not
 * have (NAN) and reads it back as NAN; "ready" carries the step the state was loaded at. */
Test(proto, a_sessions_call_result_and_ready_survive_the_line) {
  const char *body = "{\"kind\":\"forward_backward\",\"data\":[{\"tokens\":[1,2],\"note\":\"a \\\"q\\\"\\nline\"}]}";
  lt_proto_msg_t m = {.type = LT_PROTO_CALL, .call = {.seq = 17, .kind = "forward_backward", .body = body}};
  lt_proto_msg_t out = roundtrip(&m);
  cr_assert_eq(out.type, LT_PROTO_CALL);
  cr_assert_eq(out.call.seq, 17);
  cr_assert_str_eq(out.call.kind, "forward_backward");
  cr_assert_str_eq(out.call.body, body);
  lt_proto_msg_release(&out);

  lt_proto_msg_t r = {.type = LT_PROTO_RESULT,
                      .result = {.seq = 18, .kind = "optim_step", .ok = false, .error_code = "invalid",
                                 .error_field = "kind", .error_reason = "no gradient", .step = 3, .tokens = 0,
                                 .loss = NAN, .grad_norm = 1.5, .duration_ms = 2.25, .body = NULL}};
  out = roundtrip(&r);
  cr_assert_eq(out.type, LT_PROTO_RESULT);
  cr_assert(!out.result.ok && out.result.seq == 18 && out.result.step == 3);
  cr_assert_str_eq(out.result.error_code, "invalid");
  cr_assert_str_eq(out.result.error_field, "kind");
  cr_assert_str_eq(out.result.error_reason, "no gradient");
  cr_assert(isnan(out.result.loss), "a metric the kind has not is absent, read back as NAN");
  cr_assert_float_eq(out.result.grad_norm, 1.5, 1e-9);
  cr_assert_null(out.result.body);
  lt_proto_msg_release(&out);

  lt_proto_msg_t ready = {.type = LT_PROTO_READY, .committed = {.step = 5}};
  out = roundtrip(&ready);
  cr_assert_eq(out.type, LT_PROTO_READY);
  cr_assert_eq(out.committed.step, 5);
  lt_proto_msg_release(&out);
}
