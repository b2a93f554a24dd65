/* lt_serve: the engine side of multi-tenant sampling (continuous batching).
 *
 * Many sequences share one base model (an lt_engine_t); each uses its own LoRA adapter
 * (lt_adapter_t, loaded from PEFT files in memory) or none. One lt_serve_step runs a set of rows
 * (a row: one token of one sequence at one position), decode rows and chunks of prefill rows
 * mixed, through the model, and returns the logits of the rows that ask for them. The caller (a
 * scheduler) decides which rows run together; the token picker (lt_picker_t) turns logits into
 * tokens exactly as lt_sample does.
 *
 * Design.
 *  - Paged KV cache. The cache is one pool of fixed-size blocks (block_tokens positions of every
 *    layer's keys and values), allocated once from a byte budget. A sequence holds a block table
 *    and grows it block by block (lt_serve_seq_reserve, which answers LT_SERVE_BUSY rather than
 *    waiting when the pool is short), so memory follows the tokens actually held, never a
 *    per-request worst case. Closing a sequence zeroes its blocks before they return to the pool:
 *    the next tenant never reads the last one's keys and values.
 *  - Batch invariance, bit for bit. Every product on this path is the backend's row-wise
 *    matmul_rows (one fixed reduction order per output, whatever the number of rows), attention
 *    reads each row's own sequence in increasing position order (attn_paged), and the other ops
 *    are per row. So a sequence's logits do not depend on which rows share its step, which
 *    adapters they use, or how its prompt was chunked: a scheduler may batch freely and a
 *    request's output is reproducible from its seed alone.
 *  - Grouped LoRA. A step first orders its rows by adapter (stable: first appearance, then row
 *    order). Each linear module runs ONE base product over all rows, then, for each adapter
 *    targeting the module, la = X_g A^T and Y_g += (alpha / r) la B^T over that adapter's
 *    contiguous rows only; ranks may differ between adapters. Logits are computed for the wanted
 *    rows only and handed back in the caller's row order.
 *
 * Ownership: an adapter borrows its engine; a server borrows its engine; a sequence borrows its
 * adapter (which must outlive it). Every buffer is allocated by lt_serve_new / lt_adapter_load /
 * lt_serve_seq_open: lt_serve_step allocates nothing (docs/STYLE.md habit 5).
 * Threads: a server, its engine and its adapters are used by one thread at a time (the engine's
 * rule); the backend runs its own threads inside each call. A picker belongs to one request.
 * Errors: lt_err_t, a one-line reason in errstr (bad input is LT_ERR_INVALID naming the row,
 * tensor or field). */
#ifndef LT_SERVE_H
#define LT_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "lt_engine.h"
#include "lt_err.h"

/* "The pool is short now; retry when sequences have closed": lt_err.h's transient failure. */
#define LT_SERVE_BUSY LT_ERR_RETRIABLE

/* ---- adapters --------------------------------------------------------------------------- */

typedef struct lt_adapter lt_adapter_t;

/* Loads a PEFT LoRA adapter for eng from memory: the bytes of adapter_model.safetensors (F32, F16
 * or BF16) and the text of adapter_config.json (r, lora_alpha, target_modules, use_rslora;
 * tensors named base_model.model.model.layers.N.<self_attn|mlp>.<module>.lora_A.weight [r, in]
 * and lora_B.weight [out, r], as lt_export_peft writes them). Every name, shape and dtype is
 * checked against the model and the config (LT_ERR_INVALID naming the tensor or field); the
 * rank must be at most the model's hidden size. Copies into backend memory; the caller keeps its
 * buffers. */
lt_err_t lt_adapter_load(lt_engine_t *eng, const void *st, size_t st_len, const char *cfg_json,
                         size_t cfg_len, lt_adapter_t **out, char *errstr, size_t errstr_size);
size_t lt_adapter_bytes(const lt_adapter_t *a); /* backend memory it holds (a cache's budget) */
int lt_adapter_rank(const lt_adapter_t *a);
/* Zeroes its backend memory, then frees it. NULL-safe. No sequence may still use it. */
void lt_adapter_free(lt_adapter_t *a);
/* Tests: lt_adapter_free that first downloads the adapter's memory, after zeroing and before
 * freeing, into `seen` (lt_adapter_bytes(a) bytes of host memory), so a test can prove the
 * zeroing happens. */
void lt_adapter_free_observed(lt_adapter_t *a, void *seen);

/* ---- server ----------------------------------------------------------------------------- */

typedef struct lt_serve_conf {
  int block_tokens; /* KV cache block size in positions (16 when 0) */
  size_t kv_bytes;  /* KV cache budget in bytes: the block pool is allocated once from it */
  int max_rows;     /* most rows one step may run (256 when 0) */
} lt_serve_conf_t;

typedef struct lt_serve lt_serve_t;

/* A server on eng (borrowed; must outlive it): the block pool (kv_bytes / bytes per block
 * blocks, at least one) and the buffers of a step of max_rows rows. */
lt_err_t lt_serve_new(lt_engine_t *eng, const lt_serve_conf_t *conf, lt_serve_t **out,
                      char *errstr, size_t errstr_size);
/* Zeroes the KV pool and frees everything. NULL-safe. Adapters are not freed (borrowed). */
void lt_serve_free(lt_serve_t *srv);
int lt_serve_blocks_free(const lt_serve_t *srv);
int lt_serve_blocks_total(const lt_serve_t *srv);
int lt_serve_block_tokens(const lt_serve_t *srv);
int lt_serve_max_rows(const lt_serve_t *srv);

/* Opens a sequence (no blocks yet); *seq_out gets its id (>= 0, the lowest free one). adapter
 * is borrowed (NULL: the base model) and must outlive the sequence. */
lt_err_t lt_serve_seq_open(lt_serve_t *srv, const lt_adapter_t *adapter, int *seq_out,
                           char *errstr, size_t errstr_size);
/* Makes sure seq has blocks for positions [0, n_positions). LT_SERVE_BUSY, with nothing changed,
 * when the pool lacks free blocks; LT_ERR_INVALID beyond the model's positions. Never shrinks. */
lt_err_t lt_serve_seq_reserve(lt_serve_t *srv, int seq, int n_positions, char *errstr,
                              size_t errstr_size);
/* Zeroes the sequence's blocks and returns them to the pool; the id becomes free. A closed or
 * unknown id is a no-op. */
void lt_serve_seq_close(lt_serve_t *srv, int seq);
/* Positions of seq written so far (its next decode row's position); 0 when not open. */
int lt_serve_seq_positions(const lt_serve_t *srv, int seq);
/* Number of blocks seq holds, and (if ids != NULL) their ids, at most max (tests, metrics). */
int lt_serve_seq_blocks(const lt_serve_t *srv, int seq, int32_t *ids, int max);
/* Tests: block `block`'s contents in every layer (K then V per layer: 2 * L * block_tokens *
 * KV*hd floats) into host memory `out`. */
lt_err_t lt_serve_block_read(const lt_serve_t *srv, int block, float *out, char *errstr,
                             size_t errstr_size);

typedef struct lt_serve_row {
  int seq;       /* an open sequence */
  int32_t token; /* in [0, V) */
  int pos;       /* reserved; rows of one sequence in increasing position order */
  int logits;    /* 1: want this row's logits */
} lt_serve_row_t;

/* Runs n rows (1 <= n <= max_rows): stores the key and value of every row and writes the logits
 * (V floats each, host memory, in row order) of the rows with .logits = 1 into logits_out (may
 * be NULL when none asks). A row may attend to positions written by earlier rows of the same
 * call; a sequence's first row in the call must be at most one past the positions written so
 * far. A row's logits are bitwise independent of the other rows (see Design). */
lt_err_t lt_serve_step(lt_serve_t *srv, const lt_serve_row_t *rows, int n, float *logits_out,
                       char *errstr, size_t errstr_size);

/* ---- token picker ----------------------------------------------------------------------- */

/* Turns one logits row into a token: greedy (temperature 0, lowest id on ties) or sampled at
 * temperature with top-k / top-p, from the picker's own RNG (xoshiro256** seeded by SplitMix64,
 * the engine's). lt_sample picks with the same code, so a served request and lt_sample with the
 * same seed and logits pick the same tokens. */
typedef struct lt_picker {
  uint64_t s[4]; /* RNG state */
  void *scratch; /* V candidates for top-k / top-p */
  int V;
} lt_picker_t;

#define LT_PICKER_MAX_TOP 20

lt_err_t lt_picker_init(lt_picker_t *p, int V, uint64_t seed, char *errstr, size_t errstr_size);
/* Restarts the RNG stream at `seed`, keeping the scratch. A copy of an initialised picker,
 * reseeded, may share its scratch (one thread); only the original is freed. */
void lt_picker_reseed(lt_picker_t *p, uint64_t seed);
void lt_picker_free(lt_picker_t *p); /* NULL-safe; zeroes the state */
/* Picks a token from logits (V floats, host). sp supplies temperature, top_p, top_k (other fields
 * unused; they must be valid as lt_sample checks them). *logp (may be NULL) gets log softmax at
 * temperature 1 of the token. top_n (0..LT_PICKER_MAX_TOP) alternatives: the most likely tokens,
 * most likely first (lowest id on ties), with their log softmax at temperature 1, into top_ids
 * and top_logp (OpenAI `logprobs`). */
int32_t lt_picker_pick(lt_picker_t *p, const float *logits, const lt_sample_params_t *sp,
                       float *logp, int top_n, int32_t *top_ids, float *top_logp);
/* lt_picker_pick's draw at temperature > 0 with top_k or top_p, at u in [0, 1) (for tests and
 * benches): the tokens in order of logit (lowest id on ties), the top_k of them, then the
 * smallest prefix whose mass (over the top_k's, or the whole vocabulary's summed in id order) is
 * top_p, sampled at u. */
int32_t lt_picker_truncated(const lt_picker_t *p, const float *logits, const lt_sample_params_t *sp, double u);

#endif
