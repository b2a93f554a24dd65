/* lt_sampler: the sampling backend of `lathed --role sampler` (docs/DESIGN.md §2, sampler):
 * base models, an adapter cache and one continuous batch, behind the table of functions the
 * API's sampling routes call (src/lib/lt_sampling.h).
 *
 * - Base models: every directory under models_dir with config.json, model.safetensors and
 *   tokenizer.json is served; its engine (one copy of the weights), tokenizer, chat template
 *   (tokenizer_config.json) and paged KV cache (lt_serve) are opened on first use.
 * - Adapters: loaded by the front from the store (decrypted with the owner's key) into a cache
 *   with a byte budget; the least recently used one no request holds is evicted, and zeroed.
 * - The batch: one thread. Each step it admits queued requests whose prefix fits in the free
 *   blocks (the tenant with the fewest rows run, prompt and decode, per unit of weight first),
 *   then runs one row per decoding request plus up to prefill_chunk prompt rows of those still prefilling, of every
 *   adapter, in one lt_serve_step; a request leaves the batch the step it ends. When the cache runs out of
 *   blocks mid-decode, the newest request is preempted: its blocks are freed and it is queued
 *   again at the front, to recompute its prefix later (bit for bit the same: the batch is
 *   invariant). A cancelled or timed-out request frees its slot and blocks at the end of the
 *   step under way.
 * - Admission: at most queue_per_tenant requests of one tenant and queue_total of all are in the
 *   sampler (queued or running); beyond that submit is LT_ERR_QUOTA (the front answers 429). A
 *   queued request is admitted when its prefix (and the next token) fits in the free blocks.
 *
 * Threads: see lt_sampling.h. */
#ifndef LT_SAMPLER_H
#define LT_SAMPLER_H

#include <stddef.h>

#include "lt_err.h"
#include "lt_sampling.h"

typedef struct lt_sampler lt_sampler_t;

typedef struct lt_sampler_conf {
  const char *models_dir;  /* base models (copied) */
  int threads;             /* compute threads of the cpu backend (1) */
  int cuda;                /* 1: the cuda backend (device 0) */
  int bf16_weights;        /* 1: the base weights' products read bf16 copies (lt_cpu_opts_t);
                            * on cuda, LATHE_CUDA_PRECISION=bf16 does this for the backend */
  size_t kv_bytes;         /* KV cache per base model (0: 64 MiB) */
  size_t adapter_bytes;    /* adapter cache (0: 256 MiB) */
  int adapter_hold_ms;     /* an adapter just loaded or found for a request is not evicted until
                            * that request submits (then it holds it), or this long at most
                            * (0: 1000; < 0: no hold) */
  int block_tokens;        /* KV block size (0: 16) */
  int max_running;         /* requests decoding at once (0: 64) */
  int prefill_chunk;       /* prompt rows per step, all requests together (0: 64) */
  int queue_per_tenant;    /* requests of one tenant in the sampler (0: 16) */
  int queue_total;         /* requests in the sampler (0: 128) */
} lt_sampler_conf_t;

lt_err_t lt_sampler_new(const lt_sampler_conf_t *conf, lt_sampler_t **out, char *errstr, size_t errstr_size);
/* Drops every request without an event (the front is gone first), joins the thread, zeroes the
 * caches and frees. NULL-safe. */
void lt_sampler_destroy(lt_sampler_t *s);
/* The table of functions over s, for lt_api_conf_t.sampler. */
void lt_sampler_ops(lt_sampler_t *s, lt_sample_ops_t *out);

#endif
