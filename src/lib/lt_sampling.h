/* lt_sampling: the contract between the sampling front (the HTTP routes /v1/completions,
 * /v1/chat/completions and /v1/models in src/control/lt_api_sample.c) and a sampling backend
 * (workers/lt_sampler.c: base models, an adapter cache and the continuous batch; docs/DESIGN.md
 * §2, sampler). Types only: the control plane never links the engine (§2, layers), so lathed
 * hands the API a backend as this table of functions.
 *
 * One request is one completion choice: the front fans `n` choices out as n requests (seeds
 * seed, seed + 1, ...) and gathers them. Text in, text out: the backend tokenizes the prompt with
 * the base model's tokenizer and hands back text deltas that never cut a UTF-8 character and never
 * show text that may turn out to be the start of a stop string.
 *
 * Threads: submit, cancel, has_adapter, load_adapter, model_info and models may be called from
 * any thread; load_adapter blocks (it is called from the API's pool). Events come on the
 * backend's own thread, in order, and the last event of a request is LT_SAMPLE_DONE; after
 * cancel(handle) returns, no event of that request comes any more. An event callback must not
 * call back into the backend (it runs under the backend's lock): it hands the event over and
 * returns. */
#ifndef LT_SAMPLING_H
#define LT_SAMPLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

#define LT_SAMPLE_MAX_STOP 4      /* stop strings per request (OpenAI's limit) */
#define LT_SAMPLE_MAX_TOP 20      /* alternatives per token for logprobs */
#define LT_SAMPLE_ADAPTER_MAX 160 /* "tenant/job" */

typedef enum lt_sample_event_kind {
  LT_SAMPLE_TOKEN = 1, /* one generated token (text may be empty: held back) */
  LT_SAMPLE_DONE,      /* the end: finish says why; err/msg when it failed */
} lt_sample_event_kind_t;

typedef struct lt_sample_event {
  lt_sample_event_kind_t kind;
  /* LT_SAMPLE_TOKEN */
  int32_t token;
  float logp;                  /* log softmax at temperature 1 */
  const char *text;            /* text released by this token (borrowed for the call) */
  size_t text_len;
  const char *token_text;      /* the token's own bytes, invalid UTF-8 replaced (logprobs) */
  int ntop;
  const int32_t *top_ids;      /* [ntop] most likely tokens, best first */
  const float *top_logp;
  const char *const *top_text; /* [ntop] their text */
  /* LT_SAMPLE_DONE */
  const char *finish;          /* "stop", "length", "cancelled", "timeout", "error" */
  lt_err_t err;
  const char *msg;
  int prompt_tokens, completion_tokens;
  int64_t ttft_ms, duration_ms; /* from submit: first token, and the end */
} lt_sample_event_t;

typedef void lt_sample_event_fn(void *ctx, const lt_sample_event_t *ev);

typedef struct lt_sample_req {
  const char *tenant;      /* whose request (fair share, queue bounds) */
  double weight;           /* the tenant's share of decode capacity (> 0) */
  const char *base;        /* base model name */
  const char *adapter;     /* "" or NULL: the base model; else an id has_adapter knows */
  const char *prompt;      /* text, NUL-terminated; rendered already for chat */
  bool special;            /* the prompt's special tokens are recognised (a chat template's) */
  int max_tokens;          /* >= 1 */
  float temperature;       /* 0: greedy */
  float top_p;             /* (0, 1] */
  int top_k;               /* 0: off */
  uint64_t seed;
  const char *stop[LT_SAMPLE_MAX_STOP];
  int nstop;
  int top_logprobs;        /* 0..LT_SAMPLE_MAX_TOP alternatives per token */
  int64_t deadline_ms;     /* monotonic ms (lt_time.h); 0: none */
  lt_sample_event_fn *on_event;
  void *ctx;
} lt_sample_req_t;

typedef struct lt_sample_ops {
  void *ctx;
  /* Queues a request (copied). LT_ERR_QUOTA when the tenant's or the overall queue is full (the
   * front answers 429), LT_ERR_NOT_FOUND when the base model is not served or the adapter is not
   * loaded (load it and submit again), LT_ERR_INVALID for a bad parameter or a prompt too long
   * (msg names it). *handle identifies it for cancel. */
  lt_err_t (*submit)(void *ctx, const lt_sample_req_t *req, uint64_t *handle, char *msg, size_t n);
  /* Stops a request now: its sequence slot and cache blocks are freed at once. *prompt_tokens and
   * *completion_tokens (either may be NULL) get what it read and generated until then, which no
   * LT_SAMPLE_DONE reports now (left as they are for a request that already ended). */
  void (*cancel)(void *ctx, uint64_t handle, int *prompt_tokens, int *completion_tokens);
  /* Whether the adapter is in the cache (a hit refreshes its place in the LRU order). */
  bool (*has_adapter)(void *ctx, const char *adapter);
  /* Loads an adapter (PEFT adapter_model.safetensors bytes and adapter_config.json text, owned
   * by the caller, who scrubs them) for base into the cache, evicting the least recently used
   * ones (zeroed) to stay in its byte budget. Blocks. LT_ERR_QUOTA while every adapter that would
   * have to go is in use (retry), LT_ERR_UNSUPPORTED for one larger than the whole budget (never). */
  lt_err_t (*load_adapter)(void *ctx, const char *adapter, const char *base, const void *st, size_t st_len,
                           const char *config, size_t config_len, char *msg, size_t n);
  /* The base model's chat template and special tokens from its tokenizer_config.json (malloc'd
   * copies, NULL when absent); LT_ERR_NOT_FOUND when the model is not served. */
  lt_err_t (*model_info)(void *ctx, const char *base, char **chat_template, char **bos, char **eos, char *msg,
                         size_t n);
  /* The names of the base models served, NULL-terminated (static until the backend is freed). */
  const char *const *(*models)(void *ctx);
  /* Prometheus lines of the backend's counters, appended to /metrics (malloc'd; may be NULL). */
  char *(*metrics)(void *ctx);
  /* A job was deleted: the adapters "tenant/job" and "tenant/job/..." leave the cache (zeroed),
   * now or when the last request holding one ends. May be NULL. */
  void (*forget)(void *ctx, const char *tenant_job);
} lt_sample_ops_t;

#endif
