/* lt_train: the managed training loop and the base model's pretraining.
 *
 * lt_train_run() is what an executor runs for a managed job: it tokenises the decrypted dataset
 * (prompt/completion masking or the chat template), splits validation (given, or held out with
 * a seeded shuffle), shuffles per epoch from the seed, steps AdamW with warmup and a cosine /
 * linear / constant schedule and gradient accumulation, evaluates at intervals and at the end
 * (validation loss, perplexity, token accuracy and, for prompt/completion data, exact match of
 * greedy generation — each beside the base model's score, with a bootstrap 95 % interval),
 * and writes checkpoints (state, PEFT adapter, metrics, eval report, config digest) into a
 * private directory for the caller to seal and upload. The caller's hooks see every step and
 * may stop the run at any micro-step boundary (cancel, preempt). The same primitives the
 * interactive API exposes (lt_engine.h) are all it uses.
 *
 * Packing: each micro-step's batch_size examples are packed first-fit into rows of the
 * longest example's length, each example attending only to itself and counting its own
 * positions (lt_batch_t.positions), so a step computes what one row per example would (the
 * same loss and gradients up to float rounding; dropout masks fall elsewhere) on fewer rows
 * when examples are short beside the longest. Always on: it changes nothing but the cost.
 *
 * Resumption: from a state file (lt_save_state) and its data cursor; the run then continues
 * bit for bit as if it had never stopped (same batches, same RNG), on the same backend and
 * thread count.
 *
 * lt_train_pretrain() makes the bundled base model: a random Llama-family model trained on
 * every weight over the generated corpus, exported with its tokenizer.
 *
 * Threads: one run per thread; the engine's backend has its own worker threads. */
#ifndef LT_TRAIN_H
#define LT_TRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_dp.h"
#include "lt_engine.h"
#include "lt_err.h"
#include "lt_jobspec.h"

/* Why the hooks asked the run to stop. */
typedef enum lt_train_stop { LT_TRAIN_GO = 0, LT_TRAIN_STOP_CANCEL, LT_TRAIN_STOP_PREEMPT } lt_train_stop_t;

typedef struct lt_train_step {
  int64_t step, total_steps;
  double loss, learning_rate, grad_norm;
  int64_t tokens;         /* weighted (trained) tokens in this step */
  int64_t tokens_total;
  double tokens_per_s;    /* over the run so far */
  int64_t elapsed_ms, eta_ms;
  double epoch;           /* fractional epoch reached */
} lt_train_step_t;

/* Scores on the validation split, the fine-tuned model's and the base model's. */
typedef struct lt_train_eval {
  int64_t step;
  bool final;
  int64_t examples;
  double val_loss, perplexity, token_accuracy;
  double exact_match;        /* -1 when not measured (chat data) */
  double em_ci_low, em_ci_high;
  double base_val_loss, base_perplexity, base_token_accuracy, base_exact_match;
  char config_digest[65];    /* what produced these numbers (lt_train_result_t.config_digest) */
} lt_train_eval_t;

typedef struct lt_train_hooks {
  void *ctx;
  /* Checked before every micro-step; anything but LT_TRAIN_GO stops the run there. May be NULL. */
  lt_train_stop_t (*should_stop)(void *ctx);
  void (*on_step)(void *ctx, const lt_train_step_t *st);          /* may be NULL */
  void (*on_eval)(void *ctx, const lt_train_eval_t *ev);          /* may be NULL */
  /* The checkpoint's files are in dir (names: adapter_model.safetensors, adapter_config.json,
   * state.bin, metrics.json, eval.json, lathe_run.json, samples.json). A failure stops the run. */
  lt_err_t (*on_checkpoint)(void *ctx, const char *dir, int64_t step, bool final, char *errstr,
                            size_t errstr_size);
  /* Called before every optimizer update, after the step's forward and backward passes; may wait
   * (the executor waits there for the previous checkpoint's commit). A failure stops the run.
   * May be NULL. */
  lt_err_t (*before_update)(void *ctx, char *errstr, size_t errstr_size);
  /* The run's plan, enough to replay it outside the loop (lt_plan.h): on_batch sees each training
   * micro-batch right before its lt_forward_backward (LT_LOSS_CROSS_ENTROPY; never an evaluation
   * batch), on_update the AdamW parameters right before each lt_optim_step (lr after the
   * schedule), exactly as the loop passes them. step is the optimizer step they make, counted
   * from 1 as lt_train_step_t.step; micro counts from 0 within it. The batch, its arrays and opt
   * are borrowed for the call. Either may be NULL. Replaying the calls in order on a fresh
   * session of lt_train_session_config(hp) on the same model, backend and thread count gives a
   * byte-identical adapter: evaluation, sampling and checkpoints do not touch the trained
   * session's state (tests/test_train.c proves it). */
  void (*on_batch)(void *ctx, int64_t step, int micro, const lt_batch_t *batch);
  void (*on_update)(void *ctx, int64_t step, const lt_adamw_t *opt);
} lt_train_hooks_t;

typedef struct lt_train_conf {
  const char *model_dir;        /* config.json, model.safetensors, tokenizer.json */
  const char *base_model_name;  /* recorded in adapter_config.json and the config digest */
  const char *train;            /* the training JSONL (plaintext, borrowed) */
  size_t train_len;
  const char *valid;            /* a validation JSONL or NULL: hold out hp.validation_fraction */
  size_t valid_len;
  char dataset_sha256[65];      /* recorded in the config digest */
  lt_hparams_t hp;
  int threads;                  /* cpu backend threads (0: 1) */
  const char *backend;          /* "cpu" (default) or "cuda" */
  int device;                   /* cuda: the GPU (0 ..) */
  /* "f32" or "bf16": the frozen base weights' products in bf16, f32 accumulation: on AMX tiles
   * (cpu backend; LT_ERR_UNSUPPORTED on a chip without AMX) or tensor cores (cuda). NULL: as
   * hp.precision says (auto: bf16 on cuda, f32 on the cpu). What ran is in the config digest. */
  const char *precision;
  const char *work_dir;         /* private directory for checkpoint files (must exist, 0700) */
  const char *resume_state;     /* state.bin of the checkpoint to resume from, or NULL */
  int eval_max_examples;        /* validation examples scored by generation (0: 200) */
  int gen_max_tokens;           /* greedy generation budget (0: longest completion + 8) */
  int64_t checkpoint_every_ms;  /* time-based checkpoints (hp.checkpoint_interval_s if 0) */
  bool one_row_per_example;     /* no packing: bench/bench_pack's peer */
  /* Data parallel (borrowed, NULL: one executor): this run is rank lt_dp_rank() of a gang of
   * lt_dp_world() executors, all given the same conf (data, hp, resume state). Every rank walks
   * the whole data order; of each step's grad_accum micro-batches, rank r runs those with
   * micro % world == r, drawing the dropout masks one executor would draw for them
   * (lt_session_set_call_index); the ranks sum their gradients (lt_dp_allreduce_sum, in rank
   * order), and each applies the same update. The adapter is one executor's on the same hp:
   * bit for bit when grad_accum == world (each rank's buffer then holds one micro-batch's
   * gradient, and the rank-ordered sum is the one an executor accumulates), within float
   * rounding otherwise (the additions are grouped by rank). At each step's start the ranks
   * vote on the hooks' should_stop (one stops: all stop there, a preemption checkpointing the
   * whole step). Rank 0 alone scores the base model, evaluates and writes checkpoints (the
   * others' hooks never see on_eval or on_checkpoint); every rank sees on_step with the gang's
   * loss and tokens. On any backend: on cuda the gradients cross host memory for the sum
   * (downloaded, summed over the gang's connections, uploaded), since the executor has no
   * network of its own for NCCL's bootstrap to open (lt_dp.h, GPU). */
  lt_dp_t *dp;
} lt_train_conf_t;

typedef struct lt_train_result {
  lt_train_stop_t stopped;      /* LT_TRAIN_GO when the run finished */
  int64_t steps;                /* optimizer steps done */
  int64_t last_checkpoint_step; /* -1 when none */
  lt_train_eval_t final_eval;   /* valid when stopped == LT_TRAIN_GO */
  int64_t examples, rows;       /* examples trained on (this run) and the batch rows they took:
                                 * packing puts several short examples in one row */
  char config_digest[65];
} lt_train_result_t;

/* The adapter session a run of hp trains (LoRA rank, alpha, dropout, targets, seed): what a
 * replay of its plan must start from. */
void lt_train_session_config(const lt_hparams_t *hp, lt_session_config_t *out);

/* Runs (or resumes) a managed fine-tune. Bad data gets LT_ERR_INVALID naming the line. */
lt_err_t lt_train_run(const lt_train_conf_t *conf, const lt_train_hooks_t *hooks, lt_train_result_t *out,
                      char *errstr, size_t errstr_size);

typedef struct lt_pretrain_conf {
  const char *out_dir;       /* the model directory to make (config.json, model.safetensors, tokenizer.json) */
  const char *bundle_dir;    /* lt_task_write_bundle output: corpus.txt, tokenizer.json */
  lt_model_config_t model;   /* vocab_size is taken from the tokenizer */
  int64_t steps;
  int batch, seq_len;
  double learning_rate;
  uint64_t seed;
  int threads;
  void (*on_step)(void *ctx, int64_t step, int64_t total, double loss, double tokens_per_s);
  void *ctx;
} lt_pretrain_conf_t;

/* Pretrains a small base model over the bundle's corpus (full-parameter AdamW) and writes it. */
lt_err_t lt_train_pretrain(const lt_pretrain_conf_t *conf, char *errstr, size_t errstr_size);

/* Reads a whole file into a malloc'd, NUL-terminated buffer (*len its bytes). */
lt_err_t lt_train_read_file(const char *path, char **out, size_t *len, char *errstr, size_t errstr_size);

/* What an adapter's base_model_name_or_path names (PEFT loads the base from it): the Hugging Face
 * id the base came from (its config.json's "_name_or_path", when that is "org/name"), else name,
 * the bundle's directory name under the models directory. Into out (n bytes). */
void lt_train_base_ref(const char *model_dir, const char *name, char *out, size_t n);

/* Writes the bundled model's tokenizer_config.json (its eos token and chat template) into dir. */
lt_err_t lt_train_write_chat_config(const char *dir, char *errstr, size_t errstr_size);

/* The bundled base model's shape (a few million parameters), for `lathe model make`. */
void lt_train_default_model(lt_model_config_t *cfg);

#endif
