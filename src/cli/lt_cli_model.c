/* lathe model / lathe train: the bundled base model and local fine-tunes.
 *
 *   lathe model make [--out DIR] [--steps N] [--threads N] [--force]
 *       Makes the bundled base model "lathe-tiny" (a few million parameters): the seeded corpus,
 *       tokenizer and date-iso task (lt_task), a random Llama-family model pretrained on every
 *       weight over the corpus. Cached: a second call returns at once.
 *   lathe model path
 *       Prints where the bundled model lives ($LATHE_MODELS_DIR/lathe-tiny).
 *   lathe train --model DIR --train FILE [--valid FILE] [--set KEY=VALUE ...] [--out DIR]
 *               [--dump-plan FILE] [--threads N]
 *       A managed fine-tune run locally (no broker, no store): the same loop an executor runs.
 *       Prints progress and the eval against the base model; --out keeps the last checkpoint;
 *       --dump-plan writes the run's batches and AdamW updates as JSON lines (workers/lt_plan.h),
 *       which a training session can replay to the same adapter.
 *
 * Models live in $LATHE_MODELS_DIR (default: the meson option models_dir; ops/stack env sets
 * var/models in the checkout). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "lt_cli_args.h"
#include "lt_utf8.h"
#include "lt_config.h"
#include "lt_jobspec.h"
#include "lt_plan.h"
#include "lt_task.h"
#include "lt_train.h"

#define LT_MODEL_NAME "lathe-tiny"

static void models_dir(char *out, size_t n) {
  const char *d = getenv("LATHE_MODELS_DIR");
  if (d && *d) snprintf(out, n, "%s", d);
  else snprintf(out, n, "%s", LT_MODELS_DIR);
}

static int mkdirs(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(tmp, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void on_pretrain_step(void *ctx, int64_t step, int64_t total, double loss, double tps) {
  (void)ctx;
  if (step == 1 || step % 25 == 0 || step == total)
    fprintf(stderr, "lathe model make: step %lld/%lld loss %.3f (%.0f tokens/s)\n", (long long)step, (long long)total,
            loss, tps);
}

static void model_usage(FILE *f) {
  fprintf(f, "usage: lathe model make [--out DIR] [--steps N] [--threads N] [--force]\n"
             "       lathe model path\n"
             "make pretrains the bundled base model (%s) into DIR (default: lathe model path) and\n"
             "prints where it is; a model already there is kept unless --force. path prints where it goes.\n",
          LT_MODEL_NAME);
}

static int model_make(int argc, char **argv) {
  char dir[2048], out[2200], bundle[2200];
  models_dir(dir, sizeof dir);
  snprintf(out, sizeof out, "%s/%s", dir, LT_MODEL_NAME);
  long steps = 600, threads = sysconf(_SC_NPROCESSORS_ONLN);
  bool force = false;
  enum { O_OUT = 256, O_STEPS, O_THREADS, O_FORCE };
  static const struct option opts[] = {{"out", required_argument, NULL, O_OUT},
                                       {"steps", required_argument, NULL, O_STEPS},
                                       {"threads", required_argument, NULL, O_THREADS},
                                       {"force", no_argument, NULL, O_FORCE},
                                       {0}};
  lt_cli_args_t a = {.what = "model make", .usage = model_usage, .opts = opts};
  int c;
  double v;
  while ((c = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (c == O_OUT) snprintf(out, sizeof out, "%s", a.value);
    else if (c == O_STEPS && lt_cli_args_num(&a, "--steps", 1, 1000000, true, &v)) steps = (long)v;
    else if (c == O_THREADS && lt_cli_args_num(&a, "--threads", 1, 256, true, &v)) threads = (long)v;
    else if (c == O_STEPS || c == O_THREADS) return 2;
    else force = true;
  }
  if (c != LT_CLI_ARGS_END) return a.status;
  if (threads > 256) threads = 256; /* the default: this host's processors */
  /* Made: its task files are placed last, after the weights, tokenizer and chat config; a make
   * that stopped before them (a kill, a full disk) is made again, not taken for a model. */
  bool made = true;
  const char *const last[] = {"model.safetensors", "tokenizer.json", "task_train.jsonl", "task_eval.jsonl"};
  for (size_t i = 0; i < sizeof last / sizeof *last; i++) {
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/%s", out, last[i]);
    made = made && access(probe, R_OK) == 0;
  }
  if (!force && made) {
    /* A model made before it had a chat template gets one (the sampler reads it). */
    char cfg[4300], err[512];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", out);
    if (access(cfg, R_OK) != 0 && lt_train_write_chat_config(out, err, sizeof err)) {
      fprintf(stderr, "lathe model make: %s\n", err);
      return 1;
    }
    printf("%s\n", out);
    return 0;
  }
  snprintf(bundle, sizeof bundle, "%s/%s.bundle", dir, LT_MODEL_NAME);
  if (mkdirs(bundle) || mkdirs(out)) {
    fprintf(stderr, "lathe model make: cannot create %s: %s\n", out, strerror(errno));
    return 1;
  }
  for (size_t i = 0; i < sizeof last / sizeof *last; i++) { /* a rebuild is made again until its end */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/%s", out, last[i]);
    if (i >= 2) unlink(probe); /* the task files: placed last, so they mark a make that ended */
  }
  char err[512];
  fprintf(stderr, "lathe model make: writing the corpus, tokenizer and task to %s\n", bundle);
  if (lt_task_write_bundle(bundle, LT_TASK_BUNDLE_SEED, LT_TASK_BUNDLE_CORPUS_BYTES, LT_TASK_BUNDLE_VOCAB,
                           LT_TASK_BUNDLE_TRAIN, LT_TASK_BUNDLE_EVAL, err, sizeof err)) {
    fprintf(stderr, "lathe model make: %s\n", err);
    return 1;
  }
  lt_pretrain_conf_t pc = {.out_dir = out, .bundle_dir = bundle, .steps = steps, .batch = 16, .seq_len = 128,
                           .learning_rate = 3e-3, .seed = LT_TASK_BUNDLE_SEED, .threads = (int)threads,
                           .on_step = on_pretrain_step};
  lt_train_default_model(&pc.model);
  if (lt_train_pretrain(&pc, err, sizeof err)) {
    fprintf(stderr, "lathe model make: %s\n", err);
    return 1;
  }
  /* The task files travel with the model: the quickstart and the tests fine-tune on them. */
  const char *names[] = {"task_train.jsonl", "task_eval.jsonl"};
  for (int i = 0; i < 2; i++) {
    char src[8400], dst[8400];
    snprintf(src, sizeof src, "%s/%s", bundle, names[i]);
    snprintf(dst, sizeof dst, "%s/%s", out, names[i]);
    if (link(src, dst) != 0 && errno != EEXIST) {
      fprintf(stderr, "lathe model make: cannot place %s: %s\n", dst, strerror(errno));
      return 1;
    }
  }
  printf("%s\n", out);
  return 0;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  if (buf) {
    buf[n] = '\0';
    *len = (size_t)n;
  }
  return buf;
}

/* The plan's hooks: one JSON line per training micro-batch and per update, into FILE. */
static void plan_batch(void *ctx, int64_t step, int micro, const lt_batch_t *batch) {
  lt_plan_write_batch(ctx, step, micro, batch);
}

static void plan_update(void *ctx, int64_t step, const lt_adamw_t *opt) {
  lt_plan_write_update(ctx, step, opt);
}

static void on_step(void *ctx, const lt_train_step_t *st) {
  (void)ctx;
  if (st->step == 1 || st->step % 10 == 0 || st->step == st->total_steps)
    fprintf(stderr, "step %lld/%lld loss %.4f lr %.2e %.0f tokens/s eta %llds\n", (long long)st->step,
            (long long)st->total_steps, st->loss, st->learning_rate, st->tokens_per_s, (long long)(st->eta_ms / 1000));
}

static void on_eval(void *ctx, const lt_train_eval_t *e) {
  (void)ctx;
  fprintf(stderr, "eval @%lld: val_loss %.4f (base %.4f) token_acc %.3f (base %.3f)", (long long)e->step, e->val_loss,
          e->base_val_loss, e->token_accuracy, e->base_token_accuracy);
  if (e->exact_match >= 0)
    fprintf(stderr, " exact_match %.3f [%.3f, %.3f] (base %.3f)", e->exact_match, e->em_ci_low, e->em_ci_high,
            e->base_exact_match);
  fprintf(stderr, "\n");
}

static void train_usage(FILE *f) {
  fprintf(f, "usage: lathe train --model DIR --train FILE [--valid FILE] [--set KEY=VALUE ...] [--out DIR]\n"
             "                   [--dump-plan FILE] [--threads N] [--precision f32|bf16]\n"
             "  --dump-plan FILE  write every training batch and AdamW update as one JSON line each\n"
             "                    (workers/lt_plan.h): the plan a training session replays exactly\n"
             "  --threads N       compute threads (default: the online CPUs); a worker uses\n"
             "                    LATHE_WORKER_THREADS, and the result depends on the count\n"
             "  --precision bf16  the frozen base weights' products in bf16 on AMX tiles, f32\n"
             "                    accumulation (a cpu with AMX-BF16; default f32)\n");
}

/* The run's work directory: out, made now (refused before the run, not at its first checkpoint a
 * hundred steps on), or a fresh one under /tmp (work, which work_dir_drop removes). 0, or 1 after
 * saying why. */
static int work_dir_for(const char *out, char *work, const char **dir) {
  struct stat st;
  if (!out) {
    if (!mkdtemp(work)) {
      fprintf(stderr, "lathe train: mkdtemp: %s\n", strerror(errno));
      return 1;
    }
    *dir = work;
    return 0;
  }
  int why = mkdirs(out) != 0 || stat(out, &st) != 0 ? errno : !S_ISDIR(st.st_mode) ? ENOTDIR : 0;
  if (why) fprintf(stderr, "lathe train: --out %s: cannot make it a directory: %s\n", out, strerror(why));
  *dir = out;
  return why ? 1 : 0;
}

static void work_dir_drop(const char *out, const char *work) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
  if (!out && system(cmd) != 0) fprintf(stderr, "lathe train: could not remove %s\n", work);
}

static int train_cmd(int argc, char **argv) {
  const char *model = NULL, *train = NULL, *valid = NULL, *out = NULL, *plan_path = NULL, *precision = NULL;
  long threads = sysconf(_SC_NPROCESSORS_ONLN);
  enum { O_MODEL = 256, O_TRAIN, O_VALID, O_OUT, O_PLAN, O_PRECISION, O_SET, O_THREADS };
  static const struct option opts[] = {
      {"model", required_argument, NULL, O_MODEL}, {"train", required_argument, NULL, O_TRAIN},
      {"valid", required_argument, NULL, O_VALID}, {"out", required_argument, NULL, O_OUT},
      {"dump-plan", required_argument, NULL, O_PLAN}, {"precision", required_argument, NULL, O_PRECISION},
      {"set", required_argument, NULL, O_SET}, {"threads", required_argument, NULL, O_THREADS}, {0}};
  lt_cli_args_t a = {.what = "train", .usage = train_usage, .opts = opts};
  const char **dest[] = {[O_MODEL - O_MODEL] = &model, [O_TRAIN - O_MODEL] = &train, [O_VALID - O_MODEL] = &valid,
                         [O_OUT - O_MODEL] = &out, [O_PLAN - O_MODEL] = &plan_path,
                         [O_PRECISION - O_MODEL] = &precision};
  json_t *hp = json_object();
  int o;
  while ((o = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (o == O_THREADS) {
      char *end;
      threads = strtol(a.value, &end, 10);
      if (*end || end == a.value || threads < 1 || threads > 256) {
        json_decref(hp);
        return lt_cli_args_fail(&a, "--threads must be 1..256, not \"%s\"", a.value);
      }
      continue;
    }
    if (o != O_SET) {
      *dest[o - O_MODEL] = a.value;
      continue;
    }
    char *kv = (char *)a.value, *eq = strchr(kv, '=');
    if (!eq) {
      json_decref(hp);
      return lt_cli_args_fail(&a, "--set wants KEY=VALUE, not \"%s\"", kv);
    }
    *eq = '\0';
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (json_object_set_new(hp, kv, v ? v : json_string(eq + 1)) != 0) { /* a key or value not UTF-8 */
      size_t n;
      char *shown = lt_utf8_sanitize(kv, strlen(kv), &n);
      json_decref(hp);
      int rc = lt_cli_args_fail(&a, "--set %.60s: the key and value must be UTF-8", shown ? shown : "");
      free(shown);
      return rc;
    }
  }
  if (o != LT_CLI_ARGS_END) {
    json_decref(hp);
    return a.status;
  }
  if (!model || !train) {
    fprintf(stderr, "lathe train: --model and --train are required\n");
    json_decref(hp);
    return 2;
  }
  json_t *body = json_pack("{s:s,s:s,s:o}", "base_model", "local", "dataset_id", "local", "hyperparameters", hp);
  lt_jobspec_t spec;
  char field[96], err[512];
  if (lt_jobspec_from_json(body, &spec, field, sizeof field, err, sizeof err)) {
    fprintf(stderr, "lathe train: %s\n", err);
    json_decref(body);
    return 2;
  }
  json_decref(body);
  lt_train_conf_t c = {.model_dir = model, .base_model_name = model, .hp = spec.hp,
                       .threads = (int)threads, .precision = precision};
  size_t tl = 0, vl = 0;
  char *tt = slurp(train, &tl), *vt = valid ? slurp(valid, &vl) : NULL;
  if (!tt || (valid && !vt)) {
    fprintf(stderr, "lathe train: cannot read %s: %s\n", !tt ? train : valid, strerror(errno));
    free(tt);
    free(vt);
    return 1;
  }
  c.train = tt;
  c.train_len = tl;
  c.valid = vt;
  c.valid_len = vl;
  char work[] = "/tmp/lathe-train-XXXXXX", plan_tmp[4200] = "";
  if (work_dir_for(out, work, &c.work_dir)) {
    free(tt);
    free(vt);
    return 1;
  }
  /* The plan is written aside and renamed into place once the run ended well: a plan cut short
   * by a failure has no end marker and would replay as another run. */
  struct stat pst; /* aside only for a file or none: a pipe, a device or a link is written in place */
  bool aside = plan_path && (lstat(plan_path, &pst) != 0 ? errno == ENOENT : S_ISREG(pst.st_mode));
  if (aside) snprintf(plan_tmp, sizeof plan_tmp, "%s.tmp.%d", plan_path, (int)getpid());
  FILE *plan = plan_path ? fopen(aside ? plan_tmp : plan_path, "w") : NULL;
  if (plan_path && !plan) {
    fprintf(stderr, "lathe train: cannot write the plan to %s: %s\n", plan_path, strerror(errno));
    free(tt);
    free(vt);
    work_dir_drop(out, work);
    return 1;
  }
  lt_train_hooks_t hooks = {.ctx = plan, .on_step = on_step, .on_eval = on_eval,
                            .on_batch = plan ? plan_batch : NULL, .on_update = plan ? plan_update : NULL};
  lt_train_result_t res;
  lt_err_t e = lt_train_run(&c, &hooks, &res, err, sizeof err);
  free(tt);
  free(vt);
  if (plan && (ferror(plan) | fclose(plan)) && !e)
    e = lt_errf(err, sizeof err, LT_ERR_IO, "writing the plan to %s failed", plan_path);
  if (aside && !e && rename(plan_tmp, plan_path) != 0)
    e = lt_errf(err, sizeof err, LT_ERR_IO, "cannot place the plan at %s: %s", plan_path, strerror(errno));
  if (aside && e) unlink(plan_tmp);
  if (e) {
    fprintf(stderr, "lathe train: %s\n", err);
    work_dir_drop(out, work); /* that of a run that failed goes too */
    return 1;
  }
  printf("{\"steps\":%lld,\"config_digest\":\"%s\",\"val_loss\":%.6f,\"base_val_loss\":%.6f,\"exact_match\":%.4f,"
         "\"base_exact_match\":%.4f,\"exact_match_ci95\":[%.4f,%.4f]}\n",
         (long long)res.steps, res.config_digest, res.final_eval.val_loss, res.final_eval.base_val_loss,
         res.final_eval.exact_match, res.final_eval.base_exact_match, res.final_eval.em_ci_low,
         res.final_eval.em_ci_high);
  work_dir_drop(out, work);
  return 0;
}

static int model_path(int argc, char **argv) {
  lt_cli_args_t a = {.what = "model path", .usage = model_usage};
  if (lt_cli_args_next(&a, argc, argv) != LT_CLI_ARGS_END) return a.status;
  char dir[4096];
  models_dir(dir, sizeof dir);
  printf("%s/%s\n", dir, LT_MODEL_NAME);
  return 0;
}

int lt_cli_model(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"make", model_make}, {"path", model_path}};
  return lt_cli_args_dispatch("model", model_usage, verbs, 2, NULL, argc, argv);
}

int lt_cli_train(int argc, char **argv) { return train_cmd(argc, argv); }
