/* lt_jobspec: what a job asks for, and the one validation of it.
 *
 * A submission reaches Lathe two ways: JSON through the API, or a JobSubmitted record that an
 * upstream service produced straight into lathe.jobs. Both end up as an lt_jobspec_t and go
 * through lt_jobspec_validate(), so they get the same checks and the same messages
 * (docs/DESIGN.md §1). Defaults and ranges live in one table (lt_jobspec.c) that the API
 * documentation and a test compare against schemas/JobSubmitted.v1.avsc.
 *
 * Pure: no I/O. Thread-safe (no shared state). */
#ifndef LT_JOBSPEC_H
#define LT_JOBSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "lt_err.h"
#include "lt_job.h"

/* Target modules as a bit set, in PEFT's names. */
enum {
  LT_MODULE_Q = 1 << 0,    /* q_proj */
  LT_MODULE_K = 1 << 1,    /* k_proj */
  LT_MODULE_V = 1 << 2,    /* v_proj */
  LT_MODULE_O = 1 << 3,    /* o_proj */
  LT_MODULE_GATE = 1 << 4, /* gate_proj */
  LT_MODULE_UP = 1 << 5,   /* up_proj */
  LT_MODULE_DOWN = 1 << 6, /* down_proj */
  LT_MODULE_ALL = 0x7f
};

typedef enum lt_lr_schedule { LT_LR_COSINE = 0, LT_LR_LINEAR, LT_LR_CONSTANT } lt_lr_schedule_t;
/* What the frozen base weights' products read: auto (f32 on a cpu worker, bf16 on a GPU), f32, or
 * bf16 operands with f32 sums (AMX tiles on a cpu, tensor cores on a GPU; lt_train.h). */
typedef enum lt_precision { LT_PRECISION_AUTO = 0, LT_PRECISION_F32, LT_PRECISION_BF16 } lt_precision_t;
typedef enum lt_job_mode { LT_MODE_MANAGED = 0, LT_MODE_INTERACTIVE } lt_job_mode_t;

typedef struct lt_hparams {
  int32_t epochs;
  int64_t max_steps;
  double learning_rate;
  lt_lr_schedule_t lr_schedule;
  int32_t warmup_steps;
  double weight_decay;
  int32_t lora_rank;
  double lora_alpha;
  double lora_dropout;
  uint32_t target_modules; /* LT_MODULE_* bits */
  int32_t batch_size;
  int32_t grad_accum;
  int32_t max_seq_len;
  int32_t eval_interval;
  int32_t checkpoint_interval;
  int32_t checkpoint_interval_s;
  double validation_fraction;
  int64_t seed;
  lt_precision_t precision; /* JobSubmitted v3; shown in JSON only when not auto */
} lt_hparams_t;

#define LT_JOBSPEC_META_MAX 16       /* metadata pairs (OpenAI's limit) */
#define LT_JOBSPEC_META_KEY_MAX 64   /* bytes of a metadata key */
#define LT_JOBSPEC_META_VALUE_MAX 512 /* bytes of a metadata value */

typedef struct lt_jobspec {
  char base_model[LT_JOB_NAME_MAX]; /* an id, or a Hugging Face id ORG/NAME (lt_model_id_valid) */
  char dataset_id[LT_ID_MAX + 1];
  char validation_dataset_id[LT_ID_MAX + 1]; /* "" when none */
  char idempotency_key[LT_ID_MAX + 1];       /* "" when none */
  lt_job_class_t priority;
  lt_job_mode_t mode;
  int64_t max_duration_s;
  int32_t gpus;
  lt_hparams_t hp;
  char suffix[LT_ID_MAX + 2]; /* "" when none; else up to 64 characters of an id's alphabet */
  int32_t nmeta;              /* the customer's labels (metadata), in the order given */
  struct {
    char key[LT_JOBSPEC_META_KEY_MAX + 1];
    char value[LT_JOBSPEC_META_VALUE_MAX + 1];
  } meta[LT_JOBSPEC_META_MAX];
} lt_jobspec_t;

/* Fills every field with its documented default (ids empty). */
void lt_jobspec_defaults(lt_jobspec_t *spec);

/* Reads a JSON submission (the body of POST /v1/jobs) into spec: defaults first, then the
 * fields present. Unknown fields, wrong types and values out of range are errors whose message
 * names the field as a path ("hyperparameters.learning_rate: 5 is above the maximum 1");
 * *field (may be NULL) gets the path, for the API's {"error":{"field":...}}. Calls
 * lt_jobspec_validate at the end. */
lt_err_t lt_jobspec_from_json(const json_t *body, lt_jobspec_t *spec, char *field, size_t field_size,
                              char *errstr, size_t errstr_size);

/* Checks ranges and required fields of a spec however it was made (JSON or a JobSubmitted
 * record). LT_ERR_INVALID with the field path in *field and a sentence in errstr. */
lt_err_t lt_jobspec_validate(const lt_jobspec_t *spec, char *field, size_t field_size, char *errstr,
                             size_t errstr_size);

/* The spec as JSON (every field, defaults included): what GET /v1/jobs/{id} shows. New ref. */
json_t *lt_jobspec_to_json(const lt_jobspec_t *spec);

/* True when s is a valid id: 1..LT_ID_MAX bytes of [A-Za-z0-9._-], not starting with '.' or
 * '-' (so never a path, never "..", never an option). */
bool lt_id_valid(const char *s);

/* True when s names a base model: an id (lt_id_valid), or a Hugging Face id "ORG/NAME" whose two
 * sides are ids (one slash; never a path), under LT_JOB_NAME_MAX bytes. */
bool lt_model_id_valid(const char *s);

/* PEFT module name of one LT_MODULE_* bit ("q_proj"), or NULL. */
const char *lt_target_name(uint32_t bit);
/* Parses a PEFT module name into its bit; 0 when unknown. */
uint32_t lt_target_parse(const char *name);
const char *lt_lr_schedule_name(lt_lr_schedule_t s);
lt_err_t lt_lr_schedule_parse(const char *name, lt_lr_schedule_t *out);
const char *lt_precision_name(lt_precision_t p);
lt_err_t lt_precision_parse(const char *name, lt_precision_t *out);

#endif
