/* lt_engine: the training engine of the data plane (docs/DESIGN.md §7).
 *
 * A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention, optional q/k/v bias as
 * in Qwen2, tied or untied embeddings) loaded from a Hugging Face model directory (config.json +
 * safetensors), trained with LoRA or full-parameter AdamW, sampled with a KV cache. All compute
 * goes through an lt_backend_t (lt_backend.h); nothing here knows which backend it is.
 *
 * Two objects:
 *  - lt_engine_t: a loaded base model. Immutable after open; its weights are the read-only
 *    mmap of the safetensors files on the cpu backend, so every executor of a worker shares one
 *    copy. Several sessions may use one engine.
 *  - lt_session_t: one training run: the adapter (or, in full mode, a private copy of every
 *    weight), its gradients, AdamW moments, RNG, step counter and the activation buffers
 *    (allocated once per (batch, seq) shape: no allocation per step after warm-up). The LM
 *    head, the loss and its gradient run over the batch in chunks of rows, so the activations
 *    hold 256 rows of logits, never B*T x vocab.
 *
 * Primitives (the four of docs/DESIGN.md §5): lt_forward_backward, lt_optim_step, lt_save_state /
 * lt_load_state, lt_sample. Plus lt_export_peft (HF PEFT adapter files) and lt_export_model
 * (full weights, for the bundled base model).
 *
 * Threads: an engine, its backend and all its sessions are used by one thread at a time (the
 * executor's); the backend runs its own worker threads inside each call.
 * Errors: every fallible function returns lt_err_t and writes a one-line reason to errstr. */
#ifndef LT_ENGINE_H
#define LT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "lt_backend.h"
#include "lt_err.h"

/* ---- model configuration ---------------------------------------------------------------- */

typedef struct lt_model_config {
  int vocab_size;        /* V */
  int hidden_size;       /* D */
  int intermediate_size; /* F, the SwiGLU width */
  int num_layers;        /* L */
  int num_heads;         /* H */
  int num_kv_heads;      /* KV (H % KV == 0); == H without GQA */
  int head_dim;          /* hd; config "head_dim" or D / H */
  int max_position;      /* max_position_embeddings */
  float rms_norm_eps;
  float rope_theta;
  float rope_linear_factor; /* rope_scaling {"type": "linear", "factor": f}; 1 when null */
  int tie_embeddings;       /* tie_word_embeddings: lm_head is embed_tokens */
  int qkv_bias;             /* q/k/v_proj.bias present (Qwen2); set by lt_engine_open */
} lt_model_config_t;

/* Parses an HF config.json (text of `len` bytes; `name` is used in messages). Unsupported
 * settings (rope_scaling other than null/linear, hidden_act other than silu, mlp_bias, unknown
 * model_type) are LT_ERR_UNSUPPORTED naming the field. qkv_bias is set from "attention_bias" if
 * present, else 0 (lt_engine_open corrects it from the tensors present). */
lt_err_t lt_model_config_parse(const char *text, size_t len, const char *name,
                               lt_model_config_t *out, char *errstr, size_t errstr_size);
/* The same, of <dir>/config.json. */
lt_err_t lt_model_config_load(const char *dir, lt_model_config_t *out, char *errstr, size_t errstr_size);

/* Writes config.json for `cfg` (model_type "llama", or "qwen2" when qkv_bias) into `dir`. */
lt_err_t lt_model_config_write(const lt_model_config_t *cfg, const char *dir, char *errstr,
                               size_t errstr_size);

/* Makes a random model in `dir` (created if missing): config.json + model.safetensors (F32).
 * Linear and embedding weights ~ N(0, std), norms ~ 1 + N(0, norm_std) (0 gives exact ones),
 * biases ~ N(0, std) when cfg->qkv_bias. Deterministic in `seed`. For tests, benchmarks and as
 * the starting point of the bundled base model. */
lt_err_t lt_model_init_random(const lt_model_config_t *cfg, const char *dir, uint64_t seed,
                              float std, float norm_std, char *errstr, size_t errstr_size);

/* ---- engine (base model) ---------------------------------------------------------------- */

typedef struct lt_engine lt_engine_t;

/* Loads `model_dir` (config.json and model.safetensors or a sharded index). F32 tensors stay in
 * the mapping; F16/BF16 are converted once. Every tensor is checked for name, dtype and shape.
 * `be` is borrowed: it must outlive the engine. */
lt_err_t lt_engine_open(const char *model_dir, lt_backend_t *be, lt_engine_t **out,
                        char *errstr, size_t errstr_size);
void lt_engine_close(lt_engine_t *eng); /* NULL-safe; close every session first */
const lt_model_config_t *lt_engine_config(const lt_engine_t *eng);
lt_backend_t *lt_engine_backend(const lt_engine_t *eng);

/* ---- session (one training run) --------------------------------------------------------- */

/* LoRA target modules (PEFT names q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
 * down_proj). */
enum {
  LT_TARGET_Q = 1 << 0,
  LT_TARGET_K = 1 << 1,
  LT_TARGET_V = 1 << 2,
  LT_TARGET_O = 1 << 3,
  LT_TARGET_GATE = 1 << 4,
  LT_TARGET_UP = 1 << 5,
  LT_TARGET_DOWN = 1 << 6,
  LT_TARGET_ALL = (1 << 7) - 1,
};

typedef struct lt_session_config {
  int full;         /* 0: LoRA (base frozen, no gradients for it); 1: train every weight */
  int rank;         /* LoRA r >= 1 */
  float alpha;      /* LoRA alpha; the update is scaled by alpha / r */
  float dropout;    /* LoRA dropout on the adapter input, in [0, 1) */
  unsigned targets; /* LT_TARGET_* bits, at least one */
  uint64_t seed;    /* adapter init (A ~ U(-1/sqrt(in), 1/sqrt(in)) as PEFT's kaiming-uniform,
                       B = 0) and dropout masks */
  int recompute;    /* 1: keep only each layer's input through the forward pass and run the
                       layer's forward again before its backward (one layer's activations
                       instead of every layer's, for one more forward pass); the same bits.
                       A session turns it on by itself when every layer's activations for a
                       batch cannot be allocated (lt_session_recomputes) */
} lt_session_config_t;

typedef struct lt_session lt_session_t;

/* A new session on `eng` (borrowed; must outlive it). */
lt_err_t lt_session_new(lt_engine_t *eng, const lt_session_config_t *cfg, lt_session_t **out,
                        char *errstr, size_t errstr_size);
/* Scrubs every buffer (tenant isolation) and frees. NULL-safe. */
void lt_session_destroy(lt_session_t *s);

/* 1 when the session recomputes each layer in backward (asked, or fallen back to). */
int lt_session_recomputes(const lt_session_t *s);

/* A batch of B sequences of T tokens, row-major (B, T). Pointers are borrowed for the call. */
typedef struct lt_batch {
  int B, T;
  const int32_t *tokens;       /* inputs, each in [0, V) */
  const int32_t *targets;      /* next tokens, in [0, V) where weight != 0 (else ignored) */
  const float *weights;        /* per-token loss weight >= 0 (0 masks prompt/padding); NULL = 1 */
  const float *advantages;     /* LT_LOSS_IMPORTANCE and LT_LOSS_PPO: per-token advantage */
  const float *sampler_logp;   /* LT_LOSS_IMPORTANCE and LT_LOSS_PPO: log-prob under the sampler */
  /* Packing: each token's position within its own example, so that one row may hold several
   * examples one after the other (each counting 0, 1, 2, ...); a token attends only to the
   * earlier tokens of its example and RoPE sees its position there, so a packed row computes
   * exactly what one row per example would. NULL: one example per row (0..T-1). */
  const int32_t *positions;
  /* LT_LOSS_PPO only: the ratio is clipped to [1 - clip_low, 1 + clip_high], each finite and in
   * [0, 10); 0 means the default 0.2 (PPO's epsilon), so a designated initialiser that leaves
   * them out gets the usual symmetric clip. */
  float clip_low, clip_high;
} lt_batch_t;

typedef enum lt_loss {
  /* loss = sum_t w_t * (-logp_t) / sum_t w_t   (weighted mean cross-entropy) */
  LT_LOSS_CROSS_ENTROPY = 0,
  /* loss = -sum_t w_t * exp(logp_t - sampler_logp_t) * adv_t / sum_t w_t
   * (importance-sampled policy gradient; its gradient is the REINFORCE estimator reweighted by
   * the ratio of the current policy to the sampler's). */
  LT_LOSS_IMPORTANCE = 1,
  /* loss = -sum_t w_t * min(r_t * adv_t, clip(r_t, 1 - clip_low, 1 + clip_high) * adv_t) / sum_t w_t
   * with r_t = exp(logp_t - sampler_logp_t) (PPO's clipped surrogate). Where the min takes the
   * clipped, constant term the token's gradient is 0; where the ratio is inside the clip range
   * loss and gradient are exactly LT_LOSS_IMPORTANCE's. */
  LT_LOSS_PPO = 2,
} lt_loss_t;

/* Forward and backward pass: adds this batch's gradient of `loss` to the accumulated
 * gradients. *loss_out (may be NULL) gets the loss; logp_out (B*T floats, may be NULL) gets
 * log p(targets[t] | tokens[..t]) for every position (a masked position whose target is outside
 * the vocabulary, e.g. -100, reports token 0's). Calls accumulate until lt_optim_step,
 * which averages over them. */
lt_err_t lt_forward_backward(lt_session_t *s, const lt_batch_t *batch, lt_loss_t loss,
                             float *loss_out, float *logp_out, char *errstr,
                             size_t errstr_size);

/* Forward only (evaluation): the same loss and log-probs, no gradient. */
lt_err_t lt_forward(lt_session_t *s, const lt_batch_t *batch, lt_loss_t loss, float *loss_out,
                    float *logp_out, char *errstr, size_t errstr_size);

/* Forward only, for evaluation: log p(targets[t] | tokens[..t]) (logp_out, B*T floats, may be
 * NULL) and the most likely next token (argmax_out, B*T, the first of equal logits; may be
 * NULL) at every position, through the head in chunks: no B*T*V logits are ever held. The
 * batch's weights only mark where targets must be valid. */
lt_err_t lt_eval_tokens(lt_session_t *s, const lt_batch_t *batch, float *logp_out, int32_t *argmax_out,
                        char *errstr, size_t errstr_size);

/* Logits (B*T*V floats, host) of the current model (base + adapter) for `tokens` (B, T). */
lt_err_t lt_logits(lt_session_t *s, int B, int T, const int32_t *tokens, float *logits_out,
                   char *errstr, size_t errstr_size);

typedef struct lt_adamw {
  float lr;
  float beta1, beta2; /* 0.9, 0.999 as PyTorch's defaults */
  float eps;          /* 1e-8 */
  float weight_decay; /* decoupled, as torch.optim.AdamW (its default is 0.01) */
  float max_grad_norm; /* clip the global L2 norm of the (averaged) gradient; <= 0: no clipping */
} lt_adamw_t;

/* One AdamW update from the gradients accumulated since the last step, averaged over the
 * forward_backward calls (gradient accumulation), clipped like torch's clip_grad_norm_. Then
 * zeroes the gradients. *grad_norm_out (may be NULL) gets the norm before clipping.
 * LT_ERR_INVALID if no forward_backward happened since the last step. */
lt_err_t lt_optim_step(lt_session_t *s, const lt_adamw_t *opt, float *grad_norm_out,
                       char *errstr, size_t errstr_size);

/* Number of optimizer steps taken. */
long lt_session_step(const lt_session_t *s);

/* Data parallelism (workers/lt_dp.h): the gradients accumulated since the last step, for an
 * all-reduce across the ranks of a gang. *n (may be NULL) gets their count, which is
 * lt_session_num_params. The buffer is the backend's memory (host memory on the cpu backend,
 * device memory on cuda) and belongs to the session: it stays valid until lt_session_destroy and
 * is zeroed by every lt_optim_step. LoRA: the adapters' gradients; full: every weight's. */
float *lt_session_grad_buffer(lt_session_t *s, size_t *n);

/* Data parallelism: how many micro-batches the gradient buffer now sums over, so that
 * lt_optim_step averages over them. A rank that ran one lt_forward_backward and then received
 * the sum over W ranks sets W. Replaces the count of forward_backward calls since the last step
 * (the next forward_backward counts on from it); LT_ERR_INVALID unless micro_batches >= 1. */
lt_err_t lt_session_set_accum(lt_session_t *s, long micro_batches, char *errstr,
                              size_t errstr_size);

/* Data parallelism: the session's count of lt_forward_backward calls since it began (saved in
 * its state), which seeds the next call's dropout masks; and setting it. A rank of a gang that
 * runs micro-batch i of a step sets the count a single session running all of the step's
 * micro-batches would be at (and, after the step, the count that session ends it with), so the
 * gang draws the masks one session draws. */
uint64_t lt_session_call_index(const lt_session_t *s);
void lt_session_set_call_index(lt_session_t *s, uint64_t calls);

/* Trainable parameter count (LoRA: adapter only). */
size_t lt_session_num_params(const lt_session_t *s);

/* ---- state ------------------------------------------------------------------------------ */

/* Writes the training state to `path` atomically: adapter (or full weights), AdamW moments,
 * RNG state, step count and the caller's data cursor, in the versioned binary format
 * "LTSTATE1" (magic, version, header, payload, 64-bit checksum). Accumulated gradients of an
 * unfinished accumulation are not saved. */
lt_err_t lt_save_state(lt_session_t *s, const char *path, uint64_t data_cursor, char *errstr,
                       size_t errstr_size);

/* Restores a state saved by lt_save_state on a session of the same model and configuration.
 * A foreign file, another version, a damaged file (checksum) or a different model/LoRA shape
 * fails with a message saying which; the session is unchanged on failure.
 * *data_cursor (may be NULL) gets the saved cursor. */
lt_err_t lt_load_state(lt_session_t *s, const char *path, uint64_t *data_cursor, char *errstr,
                       size_t errstr_size);

/* The bytes a LoRA session of rank `rank` over modules `targets` (LT_TARGET_*) on model c writes
 * in one checkpoint at least: its state file (lt_save_state: the adapter and both AdamW moments,
 * f32) and its adapter's tensors (lt_export_peft, f32), without the safetensors header or the
 * small JSON files beside them. Known before any state is saved, from the model's config alone:
 * what a storage quota counts a saving call as before the tenant has a checkpoint stored. */
uint64_t lt_lora_checkpoint_bytes(const lt_model_config_t *c, int rank, unsigned targets);

/* Writes adapter_model.safetensors (PEFT names, e.g.
 * base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r, in], lora_B [out, r]) and
 * adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
 * base_model_name_or_path, task_type CAUSAL_LM, bias none) into `dir` (created if missing).
 * LoRA sessions only. */
lt_err_t lt_export_peft(lt_session_t *s, const char *dir, const char *base_model_name,
                        char *errstr, size_t errstr_size);

/* Writes config.json + model.safetensors (F32, HF names) of the current weights into `dir`:
 * full-mode sessions, or LoRA sessions with the adapter merged (W + alpha/r * B A). */
lt_err_t lt_export_model(lt_session_t *s, const char *dir, char *errstr, size_t errstr_size);

/* Diagnostics and tests: writes the trainable tensors (which = 0) or their accumulated gradients
 * (which = 1, summed over the forward_backward calls since the last step) to a safetensors file,
 * F32, under PEFT names (LoRA) or HF names (full). */
lt_err_t lt_dump_tensors(lt_session_t *s, int which, const char *path, char *errstr,
                         size_t errstr_size);

/* ---- sampling --------------------------------------------------------------------------- */

typedef struct lt_sample_params {
  int max_tokens;        /* >= 1 new tokens per prompt at most */
  float temperature;     /* 0: greedy (argmax, lowest id on ties) */
  float top_p;           /* nucleus mass in (0, 1]; 1 disables */
  int top_k;             /* keep the k most likely; 0 disables */
  const int32_t *stop;   /* generation stops after emitting any of these (it is included) */
  int n_stop;
  uint64_t seed;         /* prompt i uses seeds[i] if given, else seed + i */
  const uint64_t *seeds; /* optional per-prompt seeds (n_prompts) */
} lt_sample_params_t;

/* Samples continuations of n prompts (prompts[i] has prompt_lens[i] >= 1 tokens) with a KV
 * cache, all prompts batched. out_tokens and out_logp are (n, max_tokens) row-major; out_lens[i]
 * gets the number generated. out_logp (may be NULL) is log softmax of the model's logits at
 * temperature 1 without truncation (the quantity lt_forward_backward's log-probs measure, so
 * importance ratios start at 1). Each prompt has its own RNG stream and no computation mixes
 * prompts: a prompt's tokens and log-probs do not depend on the rest of the batch. */
lt_err_t lt_sample(lt_session_t *s, int n, const int32_t *const *prompts,
                   const int *prompt_lens, const lt_sample_params_t *params,
                   int32_t *out_tokens, float *out_logp, int *out_lens, char *errstr,
                   size_t errstr_size);

#endif
