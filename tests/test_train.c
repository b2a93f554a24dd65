/* lt_train: the managed training loop on a small random model with a tokenizer trained by
 * lt_task. What must hold: short examples are packed several to a row (fewer rows than
 * examples); the run is deterministic (the same seed and data give a bitwise identical adapter,
 * dropout on); a run resumed from a checkpoint's state ends with the adapter of the run that
 * never stopped (docs/DESIGN.md §4.5: a crash loses only the steps since the last commit); bad
 * data fails naming the line; and the run's plan (its batches and AdamW updates, lt_plan.h),
 * replayed on a fresh session, gives the managed run's adapter byte for byte. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lt_backend_cuda.h"
#include "lt_engine.h"
#include "lt_plan.h"
#include "lt_task.h"
#include "lt_train.h"
#include "lt_test.h"

static char err[1024];
static char root[64], model[128];

static void make_model(void) {
  snprintf(root, sizeof root, "/tmp/lt-train-test-XXXXXX");
  cr_assert_not_null(mkdtemp(root));
  char bundle[128], cmd[512];
  snprintf(bundle, sizeof bundle, "%s/bundle", root);
  snprintf(model, sizeof model, "%s/model", root);
  mkdir(bundle, 0700);
  cr_assert_eq(lt_task_write_bundle(bundle, 1, 200000, 512, 10, 2, err, sizeof err), LT_OK, "%s", err);
  lt_model_config_t c = {.vocab_size = 512, .hidden_size = 32, .intermediate_size = 48, .num_layers = 2,
                         .num_heads = 4, .num_kv_heads = 2, .head_dim = 8, .max_position = 128,
                         .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_linear_factor = 1.0f,
                         .tie_embeddings = 1};
  cr_assert_eq(lt_model_init_random(&c, model, 7, 0.05f, 0.0f, err, sizeof err), LT_OK, "%s", err);
  snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer.json'", bundle, model);
  cr_assert_eq(system(cmd), 0);
}

/* The hyperparameters a job gets for `hp_json` (its "hyperparameters" object): read and checked
 * as the API reads a submission, the defaults for the rest. */
static lt_hparams_t job_hparams(const char *hp_json) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"base_model\": \"tiny\", \"dataset_id\": \"d\", \"hyperparameters\": %s}", hp_json);
  json_t *j = json_loads(body, 0, NULL);
  cr_assert_not_null(j, "%s", body);
  lt_jobspec_t spec;
  cr_assert_eq(lt_jobspec_from_json(j, &spec, NULL, 0, err, sizeof err), LT_OK, "%s", err);
  json_decref(j);
  return spec.hp;
}

static void remove_all(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (root[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
}

/* 40 examples: most a few tokens long, every tenth one long, so several short ones fit in a
 * row of the longest's length. */
static char *dataset(size_t *len) {
  size_t cap = 1 << 16, n = 0;
  char *d = malloc(cap);
  for (int i = 0; i < 40; i++) {
    if (i % 10 == 3)
      n += (size_t)snprintf(d + n, cap - n,
                            "{\"prompt\":\"Write the date %d March 2020 in the long form please:\","
                            "\"completion\":\" the %dth day of the third month of the year 2020\"}\n",
                            i % 28 + 1, i % 28 + 1);
    else
      n += (size_t)snprintf(d + n, cap - n, "{\"prompt\":\"%d+1=\",\"completion\":\"%d\"}\n", i, i + 1);
  }
  *len = n;
  return d;
}

typedef struct {
  char keep_state[256]; /* where the step-3 state.bin is copied */
  char keep_final[256]; /* where the final checkpoint's state.bin is copied */
  int updates;          /* before_update calls */
  int fail_at;          /* the before_update call that fails (0: none) */
  int64_t preempt_at;   /* a preemption comes right after the checkpoint of this step (0: none) */
  bool preempting;      /* should_stop says so */
  int ckpts[8];         /* on_checkpoint calls per step (0-7) */
  int finals;           /* on_checkpoint calls with final */
} hooks_ctx_t;

static lt_err_t count_update(void *ctx, char *errstr, size_t n) {
  hooks_ctx_t *h = ctx;
  if (++h->updates == h->fail_at) return lt_errf(errstr, n, LT_ERR_IO, "the commit never came");
  return LT_OK;
}

static lt_train_stop_t preempt_when_asked(void *ctx) {
  hooks_ctx_t *h = ctx;
  return h->preempting ? LT_TRAIN_STOP_PREEMPT : LT_TRAIN_GO;
}

/* Counts the checkpoints; copies the step-3 state to keep_state and the final one to keep_final
 * when they are named. */
static lt_err_t keep_step3(void *ctx, const char *dir, int64_t step, bool final, char *errstr, size_t n) {
  hooks_ctx_t *h = ctx;
  if (step >= 0 && step < 8) h->ckpts[step]++;
  h->finals += final;
  if (step == h->preempt_at) h->preempting = true;
  const char *keep = final ? h->keep_final : step == 3 ? h->keep_state : "";
  if (!keep[0]) return LT_OK;
  char cmd[700];
  snprintf(cmd, sizeof cmd, "cp '%s/state.bin' '%s'", dir, keep);
  return system(cmd) == 0 ? LT_OK : lt_errf(errstr, n, LT_ERR_IO, "cannot copy the step-%lld state", (long long)step);
}

/* One run into work dir `name` (6 steps of 8, a checkpoint every 3) with hooks on hc; the final
 * adapter stays in that dir. Returns what lt_train_run returned. */
static lt_err_t run_with(const char *name, const char *resume, hooks_ctx_t *hc, lt_train_result_t *res) {
  char work[256];
  snprintf(work, sizeof work, "%s/%s", root, name);
  mkdir(work, 0700);
  size_t len;
  char *data = dataset(&len);
  lt_hparams_t hp = job_hparams("{\"max_steps\": 6, \"batch_size\": 8, \"checkpoint_interval\": 3, "
                                "\"checkpoint_interval_s\": 0, \"lora_rank\": 4, \"lora_dropout\": 0.1, "
                                "\"learning_rate\": 0.01, \"validation_fraction\": 0.1, \"seed\": 11, "
                                "\"max_seq_len\": 64}");
  lt_train_conf_t tc = {.model_dir = model, .base_model_name = "tiny", .train = data, .train_len = len,
                        .hp = hp, .threads = 1, .work_dir = work, .resume_state = resume,
                        .gen_max_tokens = 8};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  lt_train_hooks_t hooks = {.ctx = hc, .should_stop = preempt_when_asked, .on_checkpoint = keep_step3,
                            .before_update = count_update};
  lt_err_t e = lt_train_run(&tc, &hooks, res, err, sizeof err);
  free(data);
  return e;
}

/* A run that must succeed; returns its result. */
static lt_train_result_t run(const char *name, const char *resume, const char *keep_state) {
  hooks_ctx_t hc = {.fail_at = 0};
  if (keep_state) snprintf(hc.keep_state, sizeof hc.keep_state, "%s", keep_state);
  lt_train_result_t res;
  cr_assert_eq(run_with(name, resume, &hc, &res), LT_OK, "%s: %s", name, err);
  cr_assert_eq(res.stopped, LT_TRAIN_GO);
  cr_assert_eq(res.steps, 6);
  cr_assert_eq(hc.updates, res.examples / 8, "%s: one before_update per optimizer update", name);
  return res;
}

static char *slurp(const char *path, size_t *len) {
  char *b = lt_test_slurp(path, len);
  cr_assert_not_null(b, "%s", path);
  return b;
}

static void assert_same_adapter(const char *a, const char *b, const char *why) {
  char pa[256], pb[256];
  snprintf(pa, sizeof pa, "%s/%s/adapter_model.safetensors", root, a);
  snprintf(pb, sizeof pb, "%s/%s/adapter_model.safetensors", root, b);
  size_t la, lb;
  char *x = slurp(pa, &la), *y = slurp(pb, &lb);
  cr_assert(la == lb && memcmp(x, y, la) == 0, "%s: %s and %s differ", why, pa, pb);
  free(x);
  free(y);
}

Test(train, packs_short_examples_is_deterministic_and_resumes_bit_for_bit, .init = make_model,
     .fini = remove_all, .timeout = 300) {
  char state3[256];
  snprintf(state3, sizeof state3, "%s/state3.bin", root);
  lt_train_result_t a = run("a", NULL, state3);
  cr_assert_eq(a.examples, 6 * 8, "6 steps of 8 examples");
  cr_assert_lt(a.rows, a.examples, "packing put several short examples in a row: %lld rows for %lld examples",
               (long long)a.rows, (long long)a.examples);
  cr_log_info("packing: %lld rows for %lld examples", (long long)a.rows, (long long)a.examples);
  lt_train_result_t b = run("b", NULL, NULL);
  cr_assert_eq(b.rows, a.rows);
  assert_same_adapter("a", "b", "the same seed and data (dropout on) must give the same adapter");
  lt_train_result_t c = run("c", state3, NULL);
  cr_assert_eq(c.examples, 3 * 8, "the resumed run trains only steps 4 to 6");
  assert_same_adapter("a", "c", "a run resumed from step 3 must end where the uninterrupted one did");
}

/* The executor waits in before_update for the previous checkpoint's commit; a failure there (the
 * upload failed, the worker is gone) must end the run with that error, not train on. */
Test(train, a_failing_before_update_stops_the_run_with_its_error, .init = make_model, .fini = remove_all,
     .timeout = 120) {
  hooks_ctx_t hc = {.fail_at = 4}; /* the update after the step-3 checkpoint */
  lt_train_result_t res;
  cr_assert_eq(run_with("gate", NULL, &hc, &res), LT_ERR_IO);
  cr_assert_not_null(strstr(err, "the commit never came"), "the hook's error is the run's: %s", err);
  cr_assert_eq(hc.updates, 4, "nothing ran after the failure");
}

/* A preemption that lands right after a checkpoint step (the executor's SIGUSR2 while step 3's
 * checkpoint was handed to the sealer): the run stops at step 3 with that checkpoint as the one
 * to resume from, and writes no second one of the same step. A second one was sealed under the
 * same object keys: the worker killed the executor for it, or deleted the committed objects. */
Test(train, a_preemption_after_a_checkpoint_step_checkpoints_that_step_once, .init = make_model,
     .fini = remove_all, .timeout = 120) {
  hooks_ctx_t hc = {.preempt_at = 3};
  lt_train_result_t res;
  cr_assert_eq(run_with("preempt", NULL, &hc, &res), LT_OK, "%s", err);
  cr_assert_eq(res.stopped, LT_TRAIN_STOP_PREEMPT);
  cr_assert_eq(res.steps, 3);
  cr_expect_eq(res.last_checkpoint_step, 3, "the step-3 checkpoint is the one to resume from");
  cr_expect_eq(hc.ckpts[3], 1, "step 3 was checkpointed %d times", hc.ckpts[3]);
}

/* The final checkpoint was committed, then the attempt was lost before the job's completion was
 * recorded: the next attempt resumes from that checkpoint, at the run's last step. It must end
 * with a final checkpoint (and evaluation) of its own, the adapter unchanged: the worker completes
 * a job only with its attempt's final commit, and the publisher promotes only the current
 * attempt's. Without one, every retry failed ("finished without a final checkpoint"). */
Test(train, a_run_resumed_from_its_final_checkpoint_checkpoints_it_again_as_final, .init = make_model,
     .fini = remove_all, .timeout = 120) {
  hooks_ctx_t full = {.fail_at = 0};
  snprintf(full.keep_final, sizeof full.keep_final, "%s/state6.bin", root);
  lt_train_result_t a;
  cr_assert_eq(run_with("full", NULL, &full, &a), LT_OK, "%s", err);
  cr_assert_eq(full.finals, 1);
  hooks_ctx_t hc = {.fail_at = 0};
  lt_train_result_t res;
  cr_assert_eq(run_with("again", full.keep_final, &hc, &res), LT_OK, "%s", err);
  cr_assert_eq(res.stopped, LT_TRAIN_GO);
  cr_assert_eq(res.steps, 6);
  cr_expect_eq(res.examples, 0, "nothing is trained again");
  cr_expect_eq(hc.updates, 0);
  cr_expect_eq(hc.finals, 1, "the resumed run made %d final checkpoints", hc.finals);
  cr_expect_eq(hc.ckpts[6], 1, "the final checkpoint is of step 6");
  cr_expect_eq(res.last_checkpoint_step, 6);
  cr_expect(res.final_eval.final && res.final_eval.step == 6, "the final evaluation is of step 6");
  cr_expect_eq(res.final_eval.val_loss, a.final_eval.val_loss, "the same adapter scores the same");
  assert_same_adapter("full", "again", "the final checkpoint holds the adapter resumed from");
}

/* Evaluation in length-bucketed batches without N x V logits (eval_split, lt_eval_tokens):
 * the base model's loss and token accuracy on a validation set of mixed lengths do not depend on
 * how its examples were batched: one at a time (batch_size 1) or sorted into buckets of 5. */
static void keep_eval(void *ctx, const lt_train_eval_t *ev) { *(lt_train_eval_t *)ctx = *ev; }

static lt_train_eval_t eval_with_batch(int batch) {
  char work[256], hpj[256];
  snprintf(work, sizeof work, "%s/eval-b%d", root, batch);
  mkdir(work, 0700);
  size_t len, vlen = 0;
  char *data = dataset(&len), valid[4096];
  for (int i = 0; i < 12; i++) /* long and short interleaved, so the buckets reorder them */
    vlen += (size_t)snprintf(valid + vlen, sizeof valid - vlen,
                             i % 3 ? "{\"prompt\":\"%d+2=\",\"completion\":\"%d\"}\n"
                                   : "{\"prompt\":\"Count on from %d by two for a while:\","
                                     "\"completion\":\" %d and then some more numbers after it\"}\n",
                             i, i + 2);
  snprintf(hpj, sizeof hpj, "{\"max_steps\": 1, \"batch_size\": %d, \"lora_rank\": 4, \"seed\": 3, "
           "\"max_seq_len\": 64, \"checkpoint_interval\": 0, \"checkpoint_interval_s\": 0}", batch);
  lt_train_conf_t tc = {.model_dir = model, .base_model_name = "tiny", .train = data, .train_len = len,
                        .valid = valid, .valid_len = vlen, .hp = job_hparams(hpj), .threads = 1,
                        .work_dir = work, .gen_max_tokens = 8};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  lt_train_eval_t ev = {.step = -1};
  lt_train_hooks_t hooks = {.ctx = &ev, .on_eval = keep_eval};
  lt_train_result_t res;
  cr_assert_eq(lt_train_run(&tc, &hooks, &res, err, sizeof err), LT_OK, "batch %d: %s", batch, err);
  free(data);
  cr_assert(ev.final, "batch %d: a final evaluation", batch);
  return ev;
}

Test(train, evaluation_does_not_depend_on_how_examples_are_batched, .init = make_model, .fini = remove_all,
     .timeout = 120) {
  lt_train_eval_t a = eval_with_batch(1), b = eval_with_batch(5);
  cr_assert(a.base_val_loss > 0 && a.base_token_accuracy >= 0, "base loss %g, accuracy %g", a.base_val_loss,
            a.base_token_accuracy);
  cr_assert_lt(fabs(a.base_val_loss - b.base_val_loss), 1e-6 * a.base_val_loss,
               "base loss %.9g one at a time, %.9g in buckets of 5", a.base_val_loss, b.base_val_loss);
  cr_assert_eq(a.base_token_accuracy, b.base_token_accuracy, "base token accuracy %.6f one at a time, %.6f in "
               "buckets of 5", a.base_token_accuracy, b.base_token_accuracy);
}

/* --precision: "bf16" trains with the base weights' products on AMX (skipped, saying so, on a
 * chip without it), the same base scores within bf16 rounding, and another config digest (the
 * numbers came from another computation); anything but f32 or bf16 is refused by name. */
/* A short run on backend; precision as lathe train --precision gives it, hp_precision as a job's
 * hyperparameters do (NULL: neither said). */
static lt_err_t run_on(const char *name, const char *backend, const char *precision, const char *hp_precision,
                       lt_train_eval_t *ev, lt_train_result_t *res) {
  char work[256];
  snprintf(work, sizeof work, "%s/%s", root, name);
  mkdir(work, 0700);
  size_t len;
  char *data = dataset(&len), hp[300];
  snprintf(hp, sizeof hp, "{\"max_steps\": 2, \"batch_size\": 4, \"lora_rank\": 4, \"seed\": 3, \"max_seq_len\": 64, "
           "\"validation_fraction\": 0.2%s%s%s}", hp_precision ? ", \"precision\": \"" : "",
           hp_precision ? hp_precision : "", hp_precision ? "\"" : "");
  lt_train_conf_t tc = {.model_dir = model, .base_model_name = "tiny", .train = data, .train_len = len,
                        .hp = job_hparams(hp),
                        .threads = 1, .work_dir = work, .gen_max_tokens = 8, .precision = precision,
                        .backend = backend};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  lt_train_hooks_t hooks = {.ctx = ev, .on_eval = keep_eval};
  lt_err_t e = lt_train_run(&tc, &hooks, res, err, sizeof err);
  free(data);
  return e;
}

Test(train, precision_bf16_runs_on_amx_and_a_bad_precision_is_refused, .init = make_model, .fini = remove_all,
     .timeout = 120) {
  lt_train_eval_t ef, eb;
  lt_train_result_t rf, rb;
  cr_assert_eq(run_on("p-f16", NULL, "f16", NULL, &ef, &rf), LT_ERR_INVALID);
  cr_assert(strstr(err, "precision") && strstr(err, "\"f16\""), "%s", err);
  cr_assert_eq(run_on("p-f32", NULL, NULL, NULL, &ef, &rf), LT_OK, "%s", err);
  lt_err_t e = run_on("p-bf16", NULL, "bf16", NULL, &eb, &rb);
  if (e == LT_ERR_UNSUPPORTED) cr_skip_test("skipped: no AMX here (%s)", err);
  cr_assert_eq(e, LT_OK, "%s", err);
  cr_assert(strcmp(rf.config_digest, rb.config_digest) != 0, "bf16 and f32 runs share a config digest");
  cr_assert(eb.base_val_loss != ef.base_val_loss, "bf16 gave the f32 base loss exactly: no product ran in bf16");
  cr_assert_lt(fabs(eb.base_val_loss - ef.base_val_loss), 1e-2 * ef.base_val_loss, "base loss %.7g f32, %.7g bf16",
               ef.base_val_loss, eb.base_val_loss);
  /* The job's own hyperparameter picks the same: its digest records what ran, not how it was asked. */
  lt_train_eval_t eh, e3;
  lt_train_result_t rh, r3;
  cr_assert_eq(run_on("p-hp-bf16", NULL, NULL, "bf16", &eh, &rh), LT_OK, "%s", err);
  cr_assert_str_eq(rh.config_digest, rb.config_digest);
  cr_assert(eh.base_val_loss == eb.base_val_loss, "hp bf16 %.9g, --precision bf16 %.9g", eh.base_val_loss,
            eb.base_val_loss);
  cr_assert_eq(run_on("p-hp-f32", NULL, NULL, "f32", &e3, &r3), LT_OK, "%s", err);
  cr_assert_str_eq(r3.config_digest, rf.config_digest, "an explicit f32 digests as auto on the cpu");
  cr_assert(e3.base_val_loss == ef.base_val_loss);
}

/* What a cuda worker's executor asks for: the cuda backend in bf16. Without a GPU (this project's
 * CI) it is refused with the runtime's reason, and a backend that is none is refused by name;
 * with one, it trains and its base loss is the cpu's within bf16 rounding. */
Test(train, the_cuda_backend_trains_where_a_gpu_is_and_is_refused_with_a_reason_where_none_is,
     .init = make_model, .fini = remove_all, .timeout = 300) {
  lt_train_eval_t ef, eg;
  lt_train_result_t rf, rg;
  cr_assert_eq(run_on("b-tpu", "tpu", NULL, NULL, &ef, &rf), LT_ERR_INVALID);
  cr_assert(strstr(err, "backend") && strstr(err, "\"tpu\""), "%s", err);
  char why[512] = "";
  int gpus = 0;
  if (lt_cuda_device_count(&gpus, why, sizeof why)) gpus = 0;
  lt_err_t e = run_on("b-cuda", "cuda", NULL, NULL, &eg, &rg);
  if (gpus == 0) {
    cr_assert_eq(e, LT_ERR_UNAVAILABLE, "no GPU here (%s), yet: %s", why, err);
    return;
  }
  cr_assert_eq(e, LT_OK, "%s", err);
  cr_assert_eq(run_on("b-cpu", NULL, NULL, NULL, &ef, &rf), LT_OK, "%s", err);
  cr_assert_lt(fabs(eg.base_val_loss - ef.base_val_loss), 1e-2 * ef.base_val_loss, "base loss %.7g cpu, %.7g cuda",
               ef.base_val_loss, eg.base_val_loss);
}

Test(train, bad_data_fails_naming_the_line, .init = make_model, .fini = remove_all, .timeout = 120) {
  char work[256];
  snprintf(work, sizeof work, "%s/bad", root);
  mkdir(work, 0700);
  const char *data = "{\"prompt\":\"1+1=\",\"completion\":\"2\"}\n{\"prompt\":\"2+2=\",\"completion\":\"4\"}\n"
                     "{\"prompt\":\"oops\"\n";
  lt_train_conf_t tc = {.model_dir = model, .train = data, .train_len = strlen(data),
                        .hp = job_hparams("{\"max_steps\": 1}"),
                        .threads = 1, .work_dir = work};
  lt_train_result_t res;
  cr_assert_eq(lt_train_run(&tc, NULL, &res, err, sizeof err), LT_ERR_INVALID);
  cr_assert_not_null(strstr(err, "line 3"), "the message names the line: %s", err);
}

Test(train, a_byte_order_mark_and_crlf_line_ends_train_like_the_plain_file, .init = make_model,
     .fini = remove_all, .timeout = 120) {
  /* The validator accepts such a file (test_dataset); the trainer must read the same examples. */
  const char *plain = "{\"prompt\":\"1+1=\",\"completion\":\"2\"}\n{\"prompt\":\"2+2=\",\"completion\":\"4\"}\n";
  const char *windows =
      "\xEF\xBB\xBF{\"prompt\":\"1+1=\",\"completion\":\"2\"}\r\n{\"prompt\":\"2+2=\",\"completion\":\"4\"}\r\n";
  lt_train_result_t res[2];
  const char *texts[2] = {plain, windows};
  for (int i = 0; i < 2; i++) {
    char work[256];
    snprintf(work, sizeof work, "%s/bom%d", root, i);
    mkdir(work, 0700);
    lt_train_conf_t tc = {.model_dir = model, .train = texts[i], .train_len = strlen(texts[i]),
                          .hp = job_hparams("{\"max_steps\": 2, \"batch_size\": 2, \"seed\": 3}"),
                          .threads = 1, .work_dir = work};
    cr_assert_eq(lt_train_run(&tc, NULL, &res[i], err, sizeof err), LT_OK, "file %d: %s", i, err);
  }
  cr_expect_eq(res[1].examples, res[0].examples);
  cr_expect_eq(res[1].steps, res[0].steps);
}

/* ---- the plan: a loop outside lt_train_run replays the run byte for byte ------------------ */

/* The plan as the hooks saw it: the events copied in order, and the same events as JSON lines
 * (lt_plan) in `lines`. */
typedef struct {
  lt_plan_event_t ev[64];
  int n;
  FILE *lines;
  int evals, exact_match_evals;
} plan_capture_t;

static int32_t *copy_i32(const int32_t *v, size_t n) {
  if (!v) return NULL;
  int32_t *c = malloc(n * sizeof *c);
  memcpy(c, v, n * sizeof *c);
  return c;
}

static void capture_batch(void *ctx, int64_t step, int micro, const lt_batch_t *b) {
  plan_capture_t *p = ctx;
  cr_assert_lt(p->n, 64);
  lt_plan_event_t *e = &p->ev[p->n++];
  size_t N = (size_t)b->B * b->T;
  *e = (lt_plan_event_t){.kind = LT_PLAN_BATCH, .step = step, .micro = micro};
  e->tokens = copy_i32(b->tokens, N);
  e->targets = copy_i32(b->targets, N);
  e->positions = copy_i32(b->positions, N);
  e->weights = malloc(N * sizeof(float));
  memcpy(e->weights, b->weights, N * sizeof(float));
  e->batch = (lt_batch_t){.B = b->B, .T = b->T, .tokens = e->tokens, .targets = e->targets,
                          .weights = e->weights, .positions = e->positions};
  lt_plan_write_batch(p->lines, step, micro, b);
}

static void capture_update(void *ctx, int64_t step, const lt_adamw_t *opt) {
  plan_capture_t *p = ctx;
  cr_assert_lt(p->n, 64);
  p->ev[p->n++] = (lt_plan_event_t){.kind = LT_PLAN_OPTIM, .step = step, .adam = *opt};
  lt_plan_write_update(p->lines, step, opt);
}

static void count_eval(void *ctx, const lt_train_eval_t *ev) {
  plan_capture_t *p = ctx;
  p->evals++;
  p->exact_match_evals += ev->exact_match >= 0;
}

/* Replays events on a fresh session of the run's configuration and exports its adapter into
 * root/dir. */
static void replay(const lt_hparams_t *hp, const lt_plan_event_t *ev, int n, const char *dir) {
  lt_backend_t *be;
  lt_engine_t *eng;
  lt_session_t *s;
  lt_session_config_t sc;
  lt_train_session_config(hp, &sc);
  cr_assert_eq(lt_backend_cpu_new(1, &be, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_engine_open(model, be, &eng, err, sizeof err), LT_OK, "%s", err);
  cr_assert_eq(lt_session_new(eng, &sc, &s, err, sizeof err), LT_OK, "%s", err);
  for (int i = 0; i < n; i++) {
    lt_err_t e = ev[i].kind == LT_PLAN_BATCH
                     ? lt_forward_backward(s, &ev[i].batch, LT_LOSS_CROSS_ENTROPY, NULL, NULL, err, sizeof err)
                     : lt_optim_step(s, &ev[i].adam, NULL, err, sizeof err);
    cr_assert_eq(e, LT_OK, "event %d: %s", i, err);
  }
  char out[256];
  snprintf(out, sizeof out, "%s/%s", root, dir);
  cr_assert_eq(lt_export_peft(s, out, "tiny", err, sizeof err), LT_OK, "%s", err);
  lt_session_destroy(s);
  lt_engine_close(eng);
  lt_backend_destroy(be);
}

/* The plan's JSON lines parse back to exactly the events the hooks saw. */
static int parse_lines(FILE *f, lt_plan_event_t *out, const plan_capture_t *p) {
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  int n = 0;
  rewind(f);
  while ((len = getline(&line, &cap, f)) > 0) {
    cr_assert_lt(n, p->n, "more lines than events");
    cr_assert_eq(lt_plan_parse(line, (size_t)len, &out[n], err, sizeof err), LT_OK, "line %d: %s", n + 1, err);
    const lt_plan_event_t *a = &p->ev[n], *b = &out[n];
    cr_assert(a->kind == b->kind && a->step == b->step && a->micro == b->micro, "line %d: another event", n + 1);
    if (a->kind == LT_PLAN_OPTIM)
      cr_assert_eq(memcmp(&a->adam, &b->adam, sizeof a->adam), 0, "line %d: the AdamW floats changed", n + 1);
    else {
      size_t N = (size_t)a->batch.B * a->batch.T;
      cr_assert(b->batch.B == a->batch.B && b->batch.T == a->batch.T, "line %d: shape", n + 1);
      cr_assert(memcmp(a->tokens, b->tokens, N * 4) == 0 && memcmp(a->targets, b->targets, N * 4) == 0 &&
                    memcmp(a->weights, b->weights, N * 4) == 0 &&
                    (a->positions ? memcmp(a->positions, b->batch.positions, N * 4) == 0 : !b->batch.positions),
                "line %d: the batch changed on its way through JSON", n + 1);
    }
    n++;
  }
  free(line);
  return n;
}

/* Dropout on, evaluation (loss, token accuracy, greedy exact match) every 2 steps, checkpoints
 * every 3, gradient accumulation and packing: none of it may make the managed run's adapter
 * differ from a replay of its batches and updates on a fresh session. */
Test(train, replaying_the_plan_on_a_fresh_session_gives_the_same_adapter, .init = make_model,
     .fini = remove_all, .timeout = 300) {
  char work[256];
  snprintf(work, sizeof work, "%s/managed", root);
  mkdir(work, 0700);
  size_t len;
  char *data = dataset(&len);
  lt_hparams_t hp = job_hparams("{\"max_steps\": 6, \"batch_size\": 6, \"grad_accum\": 2, \"eval_interval\": 2, "
                                "\"checkpoint_interval\": 3, \"checkpoint_interval_s\": 0, \"lora_rank\": 4, "
                                "\"lora_dropout\": 0.1, \"learning_rate\": 0.01, \"warmup_steps\": 2, "
                                "\"weight_decay\": 0.05, \"validation_fraction\": 0.1, \"seed\": 13, "
                                "\"max_seq_len\": 64}");
  lt_train_conf_t tc = {.model_dir = model, .base_model_name = "tiny", .train = data, .train_len = len,
                        .hp = hp, .threads = 1, .work_dir = work, .gen_max_tokens = 8};
  snprintf(tc.dataset_sha256, sizeof tc.dataset_sha256, "%064d", 0);
  static plan_capture_t p;
  memset(&p, 0, sizeof p);
  p.lines = tmpfile();
  cr_assert_not_null(p.lines);
  lt_train_hooks_t hooks = {.ctx = &p, .on_batch = capture_batch, .on_update = capture_update,
                            .on_eval = count_eval};
  lt_train_result_t res;
  cr_assert_eq(lt_train_run(&tc, &hooks, &res, err, sizeof err), LT_OK, "%s", err);
  free(data);
  cr_assert_eq(res.steps, 6);
  cr_assert_eq(p.n, 6 * 3, "two micro-batches and an update per step: %d events", p.n);
  cr_assert_eq(p.evals, 3, "evaluations at steps 2, 4 and 6");
  cr_assert_eq(p.exact_match_evals, 3, "each evaluation sampled greedily for exact match");
  for (int i = 0; i < p.n; i++) {
    cr_assert_eq(p.ev[i].step, i / 3 + 1, "event %d: step", i);
    cr_assert_eq(p.ev[i].kind, i % 3 == 2 ? LT_PLAN_OPTIM : LT_PLAN_BATCH, "event %d: kind", i);
    if (p.ev[i].kind == LT_PLAN_BATCH) cr_assert_eq(p.ev[i].micro, i % 3, "event %d: micro", i);
  }
  cr_assert_not_null(p.ev[0].positions, "packing: the batches carry positions");
  cr_assert_gt(p.ev[2].adam.lr, 0);
  cr_assert_neq(p.ev[2].adam.lr, p.ev[5].adam.lr, "the lr is the schedule's at each step");
  cr_assert_float_eq(p.ev[2].adam.weight_decay, 0.05f, 1e-9);
  replay(&hp, p.ev, p.n, "replay_memory");
  assert_same_adapter("managed", "replay_memory", "the batches and updates the hooks saw, replayed");
  static lt_plan_event_t parsed[64];
  int n = parse_lines(p.lines, parsed, &p);
  cr_assert_eq(n, p.n);
  replay(&hp, parsed, n, "replay_json");
  assert_same_adapter("managed", "replay_json", "the plan's JSON lines, parsed and replayed");
  for (int i = 0; i < p.n; i++) {
    lt_plan_event_free(&p.ev[i]);
    lt_plan_event_free(&parsed[i]);
  }
  fclose(p.lines);
}

Test(train, a_bad_plan_line_is_refused_naming_the_field) {
  static const struct {
    const char *line, *needle;
  } cases[] = {
      {"{\"type\":\"batch\",\"step\":1,\"micro\":0,\"rows\":[{\"tokens\":[1,2],\"targets\":[2]}]}",
       "rows[0].targets"},
      {"{\"type\":\"batch\",\"step\":1,\"micro\":0,\"rows\":[{\"tokens\":[1,2],\"targets\":[2,3],"
       "\"weights\":[1,\"x\"]}]}",
       "rows[0].weights[1]"},
      {"{\"type\":\"optim\",\"step\":1,\"adam\":{\"lr\":0.1,\"beta1\":0.9,\"beta2\":0.99,\"eps\":1e-8,"
       "\"weight_decay\":0}}",
       "adam.grad_clip"},
      {"{\"type\":\"step\",\"step\":1}", "type"},
      {"{\"type\":\"optim\"}", "step"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    lt_plan_event_t ev;
    cr_assert_eq(lt_plan_parse(cases[i].line, strlen(cases[i].line), &ev, err, sizeof err), LT_ERR_INVALID,
                 "%s", cases[i].line);
    cr_assert_not_null(strstr(err, cases[i].needle), "%s: %s", cases[i].line, err);
    lt_plan_event_free(&ev);
  }
}

/* base_model_name_or_path: the Hub id a base came from, else the bundle's name (never a path of the
 * machine that trained it). */
Test(train, an_adapter_names_its_base_by_hub_id_when_the_base_has_one) {
  char dir[] = "/tmp/lt-baseref-XXXXXX", path[256], out[256];
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/config.json", dir);
  const char *cases[][2] = {{"{\"_name_or_path\": \"HuggingFaceTB/SmolLM2-135M\"}", "HuggingFaceTB/SmolLM2-135M"},
                            {"{\"_name_or_path\": \"/home/ops/models/smol\"}", "smol-bundle"},
                            {"{\"_name_or_path\": \"a/b/c\"}", "smol-bundle"},
                            {"{\"hidden_size\": 64}", "smol-bundle"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    FILE *f = fopen(path, "w");
    fputs(cases[i][0], f);
    fclose(f);
    lt_train_base_ref(dir, "smol-bundle", out, sizeof out);
    cr_expect_str_eq(out, cases[i][1], "case %zu", i);
  }
  unlink(path);
  lt_train_base_ref(dir, "smol-bundle", out, sizeof out);
  cr_expect_str_eq(out, "smol-bundle", "no config.json");
  rmdir(dir);
}
