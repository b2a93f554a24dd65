/* lt_executor: a session's executor process (`lathed --role executor`) driven as its worker
 * drives it, over its stdin and stdout (lt_proto.h), on a small random model. What must hold: a
 * stop the worker asks for (SIGUSR2: drain or preemption) is served between two calls, even with
 * calls still queued — a client that pipelines keeps the queue full, and an executor that drained
 * it first ran into the kill deadline and lost the session's state (docs/DESIGN.md §5). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "lt_confine.h"
#include "lt_engine.h"
#include "lt_proto.h"
#include "lt_task.h"
#include "lt_test.h"

static char err[1024];
static char root[64], model[128], mem[160], sealed[160];

static void make_model(void) {
  snprintf(root, sizeof root, "/tmp/lt-exec-test-XXXXXX");
  cr_assert_not_null(mkdtemp(root));
  char bundle[128], cmd[512];
  snprintf(bundle, sizeof bundle, "%s/bundle", root);
  snprintf(model, sizeof model, "%s/model", root);
  snprintf(mem, sizeof mem, "%s/mem", root);
  snprintf(sealed, sizeof sealed, "%s/sealed", root);
  mkdir(bundle, 0700);
  mkdir(mem, 0700);
  mkdir(sealed, 0700);
  cr_assert_eq(lt_task_write_bundle(bundle, 1, 200000, 512, 10, 2, err, sizeof err), LT_OK, "%s", err);
  lt_model_config_t c = {.vocab_size = 512, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position = 128,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  cr_assert_eq(lt_model_init_random(&c, model, 7, 0.05f, 0.0f, err, sizeof err), LT_OK, "%s", err);
  snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer.json'", bundle, model);
  cr_assert_eq(system(cmd), 0);
}

static void remove_all(void) {
  if (root[0]) lt_test_rm_rf(root);
}

TestSuite(executor, .init = make_model, .fini = remove_all, .timeout = 120);

/* A session's executor, started as a worker starts one (no namespaces, no filter). */
typedef struct {
  pid_t pid;
  int in_fd;
  FILE *out;
} exec_t;

static void send_msg(exec_t *x, const lt_proto_msg_t *m) {
  char *line;
  size_t len;
  cr_assert_eq(lt_proto_encode(m, &line, &len), LT_OK);
  cr_assert_eq(write(x->in_fd, line, len), (ssize_t)len);
  free(line);
}

static void start_session(exec_t *x) {
  /* Run as root, as a worker would: the executor runs as nobody, who can read the model and
   * write its two directories. */
  lt_confine_conf_t cc = {.uid = -1, .gid = -1};
  if (geteuid() == 0) {
    cc.uid = cc.gid = 65534;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "chmod -R a+rX '%s' && chown 65534:65534 '%s' '%s'", root, mem, sealed);
    cr_assert_eq(system(cmd), 0);
  }
  int model_fd = open(model, O_PATH | O_DIRECTORY | O_CLOEXEC);
  cr_assert(model_fd >= 0);
  int inputs[LT_CONFINE_INPUTS] = {-1, -1, -1, model_fd};
  for (int i = 4; i < LT_CONFINE_INPUTS; i++) inputs[i] = -1;
  int out_fd;
  cr_assert_eq(lt_confine_spawn(lt_test_lathed_bin(), &cc, inputs, &x->pid, &x->in_fd, &out_fd, err, sizeof err),
               LT_OK, "%s", err);
  close(model_fd);
  x->out = fdopen(out_fd, "r");
  json_t *j = json_loads("{\"base_model\": \"tiny\", \"mode\": \"interactive\", "
                         "\"hyperparameters\": {\"lora_rank\": 4, \"seed\": 3}}",
                         0, NULL);
  lt_proto_msg_t m = {.type = LT_PROTO_ASSIGNMENT,
                      .assignment = {.job_id = "ses-exec", .tenant_id = "tenant-exec", .attempt = 1,
                                     .model_dir = "/proc/self/fd/6", .work_dir = mem, .sealed_dir = sealed,
                                     .threads = 1, .device = -1, .train_fd = -1, .valid_fd = -1, .resume_fd = -1,
                                     .key_id = "dek-1",
                                     .key_hex = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"}};
  cr_assert_eq(lt_jobspec_from_json(j, &m.assignment.spec, NULL, 0, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  send_msg(x, &m);
}

/* The executor's next line, decoded into m (released by the caller); false at its end. */
static bool next_line(exec_t *x, lt_proto_msg_t *m, char **line, size_t *cap) {
  memset(m, 0, sizeof *m);
  if (getline(line, cap, x->out) <= 0) return false;
  cr_assert_eq(lt_proto_decode(*line, m, err, sizeof err), LT_OK, "%s: %s", *line, err);
  return true;
}

static void send_call(exec_t *x, int64_t seq, const char *kind, const char *body) {
  send_msg(x, &(lt_proto_msg_t){.type = LT_PROTO_CALL, .call = {.seq = seq, .kind = kind, .body = body}});
}

/* Whether a signal sent to pid is still waiting to be delivered to it. */
static bool signal_pending(pid_t pid) {
  char path[64], *status;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  size_t len;
  cr_assert_not_null(status = lt_test_slurp(path, &len));
  const char *p = strstr(status, "ShdPnd:");
  bool pending = p && strspn(p + 7, "\t 0") < strcspn(p + 7, "\n");
  free(status);
  return pending;
}

/* A pipelining client (clients/python/examples/sft_loop.py sends step k+1 before it awaits step
 * k): a save_state, then four calls queued behind it. The preemption arrives while the save's
 * checkpoint waits for its commit; once committed, the executor answers the save and stops, its
 * state the save's own (no second checkpoint): the four calls are left to the next attempt, which
 * resumes from that state and runs them. */
Test(executor, a_preemption_stops_a_session_between_calls_with_calls_still_queued) {
  exec_t x;
  start_session(&x);
  char *line = NULL;
  size_t cap = 0;
  lt_proto_msg_t m;
  cr_assert(next_line(&x, &m, &line, &cap), "the executor ended before it was ready");
  cr_assert_eq(m.type, LT_PROTO_READY, "%s", line);
  lt_proto_msg_release(&m);
  const char *fb = "{\"data\":[{\"tokens\":[1,2,3],\"targets\":[2,3,4],\"weights\":[1,1,1]}]}";
  send_call(&x, 1, "forward_backward", fb);
  send_call(&x, 2, "save_state", "{\"name\":\"s1\"}");
  for (int64_t seq = 3; seq <= 6; seq++) send_call(&x, seq, "forward_backward", fb);
  char results[256] = "";
  int checkpoints = 0;
  lt_proto_msg_t end = {0};
  while (next_line(&x, &m, &line, &cap)) {
    if (m.type == LT_PROTO_RESULT) {
      cr_expect(m.result.ok, "call %lld failed: %s", (long long)m.result.seq, line);
      snprintf(results + strlen(results), sizeof results - strlen(results), "%s%lld", results[0] ? " " : "",
               (long long)m.result.seq);
    } else if (m.type == LT_PROTO_CHECKPOINT) {
      if (checkpoints++ == 0) { /* the save's: the preemption comes before its commit */
        cr_assert_eq(m.checkpoint.step, 2, "%s", line);
        cr_assert_eq(kill(x.pid, SIGUSR2), 0);
        lt_test_wait_until(!signal_pending(x.pid), 10000, 5, "the executor did not take SIGUSR2");
      }
      send_msg(&x, &(lt_proto_msg_t){.type = LT_PROTO_COMMITTED, .committed.step = m.checkpoint.step});
    } else if (m.type == LT_PROTO_STOPPED || m.type == LT_PROTO_DONE || m.type == LT_PROTO_ERROR) {
      end = m;
      break;
    }
    lt_proto_msg_release(&m);
  }
  cr_assert_eq(end.type, LT_PROTO_STOPPED, "the session ended without a stop: %s", line);
  cr_expect_eq(end.stopped.why, LT_TRAIN_STOP_PREEMPT, "%s", line);
  lt_proto_msg_release(&end);
  cr_expect_str_eq(results, "1 2", "the executor answered calls [%s] before it stopped", results);
  cr_expect_eq(checkpoints, 1, "the save's state is the preemption's: no second checkpoint");
  close(x.in_fd);
  int status;
  cr_assert_eq(waitpid(x.pid, &status, 0), x.pid);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the executor's status is %d", status);
  fclose(x.out);
  free(line);
}
