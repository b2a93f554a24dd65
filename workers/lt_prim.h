/* lt_prim: a training session's calls, from the JSON a customer sent to the engine's primitives
 * and back (docs/DESIGN.md §5).
 *
 * A session's executor (lt_executor_session.c) hands each compute call here: forward_backward,
 * forward (the losses cross_entropy, importance_sampling, ppo), optim_step and sample. This module
 * checks every field against the model (token ids within the vocabulary, lengths that agree,
 * finite weights, advantages and log-probs, lengths within the model's positions), builds the
 * engine's batch (examples of different lengths padded with weight 0) and calls the same engine
 * primitives the managed loop calls (lt_forward_backward, lt_forward, lt_optim_step, lt_sample).
 * A call that fails a check changes nothing in the session, and its error names the field as a
 * path: "data[2].targets[5]".
 *
 * The calls that checkpoint (save_state, load_state, save_weights_for_sampler, the end of the
 * session) are the executor's: they need the worker.
 *
 * Threads: one call at a time per session (the executor's thread). */
#ifndef LT_PRIM_H
#define LT_PRIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "lt_engine.h"
#include "lt_err.h"

/* Limits of one call (the API checks the same before it accepts one). */
#define LT_PRIM_MAX_EXAMPLES 1024   /* examples of a forward_backward or forward */
#define LT_PRIM_MAX_TOKENS 262144   /* examples x their padded length */
#define LT_PRIM_MAX_PROMPTS 256     /* prompts x num_samples of a sample call */

/* How a call ended. On failure: code "invalid" (bad input: the session is unchanged) or
 * "internal", the field at fault ("" when none) and a sentence. */
typedef struct lt_prim_out {
  json_t *body;      /* the result (new reference) on success, else NULL */
  int64_t tokens;    /* weighted tokens (forward_backward, forward), generated tokens (sample) */
  double loss;       /* NAN when the kind has none */
  double grad_norm;  /* NAN when the kind has none */
  char code[16];
  char field[96];
  char reason[320];
} lt_prim_out_t;

/* Runs one compute call ("forward_backward", "forward", "optim_step" or "sample") of body on s,
 * a session of the model mc describes.
 * LT_OK with out->body, or an error with out->code/field/reason (LT_ERR_INVALID for bad input,
 * LT_ERR_UNSUPPORTED for a kind that is not a compute call). */
lt_err_t lt_prim_run(lt_session_t *s, const lt_model_config_t *mc, const char *kind, const json_t *body,
                     lt_prim_out_t *out);

/* True for the kinds lt_prim_run runs. */
bool lt_prim_is_compute(const char *kind);

/* The session's LoRA configuration from a spec's lora_* hyperparameters and seed. */
lt_session_config_t lt_prim_session_config(int rank, double alpha, double dropout, unsigned targets, int64_t seed);

#endif
