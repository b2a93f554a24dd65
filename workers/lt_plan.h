/* lt_plan: a managed run's plan as JSON lines, so that a loop outside it (a training session,
 * docs/DESIGN.md §5) can replay the run exactly.
 *
 * The managed loop (lt_train_run) reports each training micro-batch and each AdamW update
 * through its on_batch / on_update hooks; `lathe train --dump-plan FILE` writes them here, one
 * line per event, in order:
 *
 *   {"type":"batch","step":S,"micro":M,"rows":[{"tokens":[..],"targets":[..],"weights":[..],
 *    "positions":[..]}, ..]}
 *   {"type":"optim","step":S,"adam":{"lr":..,"beta1":..,"beta2":..,"eps":..,
 *    "weight_decay":..,"grad_clip":..}}
 *
 * Every row of a batch has the batch's length T; "weights" is left out only when the batch has
 * none (every weight 1), "positions" is there only when the batch has them (packing). Floats
 * are printed with %.9g, which names every float exactly: parsing a line back (lt_plan_parse)
 * gives the bits the loop passed. Replaying the batches through
 * lt_forward_backward (LT_LOSS_CROSS_ENTROPY) and the updates through lt_optim_step on a fresh
 * session of lt_train_session_config(hp) gives the managed run's adapter byte for byte, on the
 * same model, backend and thread count.
 *
 * Threads: no state; any thread. */
#ifndef LT_PLAN_H
#define LT_PLAN_H

#include <stdint.h>
#include <stdio.h>

#include "lt_engine.h"
#include "lt_err.h"

/* One line each; fprintf's errors stay in f (ferror) for the caller to check once. */
void lt_plan_write_batch(FILE *f, int64_t step, int micro, const lt_batch_t *batch);
void lt_plan_write_update(FILE *f, int64_t step, const lt_adamw_t *opt);

typedef enum lt_plan_kind { LT_PLAN_BATCH = 1, LT_PLAN_OPTIM = 2 } lt_plan_kind_t;

/* One parsed line. For LT_PLAN_BATCH, batch points into the event's own arrays (positions NULL
 * when the line has none); for LT_PLAN_OPTIM, adam holds the update. */
typedef struct lt_plan_event {
  lt_plan_kind_t kind;
  int64_t step;
  int micro;
  lt_batch_t batch;
  lt_adamw_t adam;
  int32_t *tokens, *targets, *positions; /* owned, (B, T) */
  float *weights;                        /* owned, (B, T) */
} lt_plan_event_t;

/* Parses one line (len bytes, no newline needed) into *ev, which the caller releases with
 * lt_plan_event_free (also after a failure). Errors name the field. */
lt_err_t lt_plan_parse(const char *line, size_t len, lt_plan_event_t *ev, char *errstr,
                       size_t errstr_size);
void lt_plan_event_free(lt_plan_event_t *ev);

#endif
