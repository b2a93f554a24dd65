/* lt_callspec: what a training session's call may hold (docs/DESIGN.md §5), checked once, at the
 * API, before anything is stored or recorded; the executor checks again against the model
 * (workers/lt_prim.h) and trusts nothing it was sent.
 *
 * A call is a JSON object with a "kind" and that kind's fields (src/control/lt_api_sessions.c
 * documents them). Every refusal names the field as a path, "data[2].weights[7]", and says what
 * it must be; unknown fields are refused, so a misspelt option never silently does nothing.
 *
 * Threads: no state; any thread. */
#ifndef LT_CALLSPEC_H
#define LT_CALLSPEC_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "lt_err.h"

#define LT_CALLSPEC_MAX_EXAMPLES 1024  /* examples of a forward_backward or forward */
#define LT_CALLSPEC_MAX_TOKENS 262144  /* examples x their padded length */
#define LT_CALLSPEC_MAX_SAMPLES 256    /* prompts x num_samples of a sample call */

typedef struct lt_callspec_limits {
  int vocab_size; /* token ids must be below it; 0: unknown (the executor checks) */
  int max_tokens_per_call;
} lt_callspec_limits_t;

/* Whether a call of this kind saves a state (save_state, save_weights_for_sampler): the worker
 * writes a checkpoint for it, which the storage quota counts. */
bool lt_callspec_saves_state(const char *kind);

/* Whether call seq of this kind runs on a state that holds every call up to `held` (an attempt
 * resumed from a checkpoint taken at call `held`, or an executor that ran up to it): the calls
 * after it, and an end at it — the end a final checkpoint was taken for, whose completion was
 * lost with its attempt: run again, it ends the session from that same state. The worker, which
 * hands calls over, and the executor, which runs them, both go by it. */
bool lt_callspec_runs_after(const char *kind, int64_t seq, int64_t held);

/* Parses a call's JSON. NULL when it is not JSON, with the position and, for a NaN or an
 * Infinity (which JSON does not have), the field that holds it. */
json_t *lt_callspec_parse(const char *text, size_t len, char *field, size_t field_size, char *errstr,
                          size_t errstr_size);

/* Checks a call: LT_OK with *kind (borrowed from body), or LT_ERR_INVALID naming the field. */
lt_err_t lt_callspec_check(const json_t *body, const lt_callspec_limits_t *lim, const char **kind, char *field,
                           size_t field_size, char *errstr, size_t errstr_size);

#endif
