/* lt_job_record: Avro records <-> job events and job specs (see lt_job_record.h). */
#include "lt_job_record.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* A string field, or NULL when the field is null or absent in this record type. */
static const char *opt_str(lt_avro_record_t *rec, const char *path) {
  const char *s = NULL;
  if (lt_avro_get_string(rec, path, &s, NULL) != LT_OK) return NULL;
  return s;
}

static lt_err_t need_str(lt_avro_record_t *rec, const char *path, const char **out, char *errstr,
                         size_t n) {
  if (lt_avro_get_string(rec, path, out, NULL) != LT_OK)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s: %s", lt_avro_record_type(rec), lt_avro_record_error(rec));
  return LT_OK;
}

lt_err_t lt_job_event_from_record(lt_avro_record_t *rec, lt_job_event_t *ev, char *errstr, size_t n) {
  memset(ev, 0, sizeof *ev);
  const char *type = lt_avro_record_type(rec);
  if (lt_job_event_type_parse(type, &ev->type) != LT_OK)
    return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "%s is not a job record", type);
  lt_err_t err;
  if ((err = need_str(rec, "event_id", &ev->event_id, errstr, n))) return err;
  if ((err = need_str(rec, "job_id", &ev->job_id, errstr, n))) return err;
  if ((err = need_str(rec, "tenant_id", &ev->tenant_id, errstr, n))) return err;
  lt_avro_get_long(rec, "occurred_at", &ev->occurred_at_ms);
  lt_avro_get_int(rec, "attempt", &ev->attempt); /* absent in non-attempt records: stays 0 */
  const char *sym = NULL;
  switch (ev->type) {
  case LT_EV_JOB_SUBMITTED:
    ev->base_model = opt_str(rec, "base_model");
    ev->dataset_id = opt_str(rec, "dataset_id");
    if (lt_avro_get_enum(rec, "priority", &sym) == LT_OK) lt_job_class_parse(sym, &ev->job_class);
    lt_avro_get_int(rec, "gpus", &ev->gpus);
    lt_avro_get_long(rec, "max_duration_s", &ev->max_duration_s);
    break;
  case LT_EV_JOB_DISPATCHED:
    ev->worker_id = opt_str(rec, "worker_id");
    lt_avro_get_long(rec, "lease_ms", &ev->lease_ms);
    break;
  case LT_EV_ATTEMPT_STARTED:
    ev->worker_id = opt_str(rec, "worker_id");
    break;
  case LT_EV_CHECKPOINT_COMMITTED:
    lt_avro_get_long(rec, "step", &ev->step);
    ev->object_key = opt_str(rec, "object_keys[0]");
    ev->sha256_hex = opt_str(rec, "sha256");
    lt_avro_get_long(rec, "bytes", &ev->bytes);
    lt_avro_get_bool(rec, "final", &ev->final_checkpoint);
    break;
  case LT_EV_ATTEMPT_STOPPED:
    if (lt_avro_get_enum(rec, "reason", &sym) != LT_OK || lt_job_stop_reason_parse(sym, &ev->stop_reason))
      return lt_errf(errstr, n, LT_ERR_INVALID, "AttemptStopped: field \"reason\" is not a stop reason");
    lt_avro_get_long(rec, "step", &ev->step);
    ev->reason = opt_str(rec, "detail");
    break;
  case LT_EV_JOB_REJECTED:
  case LT_EV_JOB_FAILED:
    ev->reason = opt_str(rec, "reason");
    break;
  case LT_EV_CANCEL_REQUESTED:
    ev->reason = opt_str(rec, "reason");
    break;
  default:
    break;
  }
  return LT_OK;
}

typedef struct {
  const char *name;
  char kind; /* i: int32, l: int64, d: double */
  size_t offset;
} hp_map_t;

#define HPF(f) offsetof(lt_hparams_t, f)
static const hp_map_t hp_map[] = {
    {"epochs", 'i', HPF(epochs)},
    {"max_steps", 'l', HPF(max_steps)},
    {"learning_rate", 'd', HPF(learning_rate)},
    {"warmup_steps", 'i', HPF(warmup_steps)},
    {"weight_decay", 'd', HPF(weight_decay)},
    {"lora_rank", 'i', HPF(lora_rank)},
    {"lora_alpha", 'd', HPF(lora_alpha)},
    {"lora_dropout", 'd', HPF(lora_dropout)},
    {"batch_size", 'i', HPF(batch_size)},
    {"grad_accum", 'i', HPF(grad_accum)},
    {"max_seq_len", 'i', HPF(max_seq_len)},
    {"eval_interval", 'i', HPF(eval_interval)},
    {"checkpoint_interval", 'i', HPF(checkpoint_interval)},
    {"checkpoint_interval_s", 'i', HPF(checkpoint_interval_s)},
    {"validation_fraction", 'd', HPF(validation_fraction)},
    {"seed", 'l', HPF(seed)},
};
#undef HPF

static void copy_id(char *dst, const char *src) {
  size_t k = src ? strnlen(src, LT_ID_MAX) : 0;
  memcpy(dst, src ? src : "", k);
  dst[k] = '\0';
}

lt_err_t lt_jobspec_from_record(lt_avro_record_t *rec, lt_jobspec_t *spec, char *errstr, size_t n) {
  lt_jobspec_defaults(spec);
  /* An id longer than LT_ID_MAX is cut here and then fails lt_id_valid's character check only
   * if it is malformed; so refuse it explicitly for a clear message. */
  const char *ids[][2] = {{"base_model", NULL}, {"dataset_id", NULL}, {"validation_dataset_id", NULL},
                          {"idempotency_key", NULL}};
  char *dst[] = {spec->base_model, spec->dataset_id, spec->validation_dataset_id, spec->idempotency_key};
  for (int i = 0; i < 4; i++) {
    ids[i][1] = opt_str(rec, ids[i][0]);
    if (ids[i][1] && strlen(ids[i][1]) > LT_ID_MAX)
      return lt_errf(errstr, n, LT_ERR_INVALID, "%s: is longer than %d characters", ids[i][0], LT_ID_MAX);
    copy_id(dst[i], ids[i][1]);
  }
  const char *sym;
  if (lt_avro_get_enum(rec, "priority", &sym) == LT_OK) lt_job_class_parse(sym, &spec->priority);
  if (lt_avro_get_enum(rec, "mode", &sym) == LT_OK)
    spec->mode = strcmp(sym, "interactive") == 0 ? LT_MODE_INTERACTIVE : LT_MODE_MANAGED;
  lt_avro_get_long(rec, "max_duration_s", &spec->max_duration_s);
  lt_avro_get_int(rec, "gpus", &spec->gpus);
  char path[64];
  for (size_t i = 0; i < sizeof hp_map / sizeof *hp_map; i++) {
    snprintf(path, sizeof path, "hyperparameters.%s", hp_map[i].name);
    char *p = (char *)&spec->hp + hp_map[i].offset;
    lt_err_t err = hp_map[i].kind == 'i'   ? lt_avro_get_int(rec, path, (int32_t *)p)
                   : hp_map[i].kind == 'l' ? lt_avro_get_long(rec, path, (int64_t *)p)
                                           : lt_avro_get_double(rec, path, (double *)p);
    if (err) return lt_errf(errstr, n, LT_ERR_INVALID, "%s", lt_avro_record_error(rec));
  }
  const char *sched = opt_str(rec, "hyperparameters.lr_schedule");
  if (sched && lt_lr_schedule_parse(sched, &spec->hp.lr_schedule))
    return lt_errf(errstr, n, LT_ERR_INVALID,
                   "hyperparameters.lr_schedule: \"%s\" is not cosine, linear or constant", sched);
  size_t count = 0;
  if (lt_avro_array_size(rec, "hyperparameters.target_modules", &count) == LT_OK) {
    uint32_t bits = 0;
    for (size_t i = 0; i < count; i++) {
      snprintf(path, sizeof path, "hyperparameters.target_modules[%zu]", i);
      const char *m = opt_str(rec, path);
      uint32_t b = m ? lt_target_parse(m) : 0;
      if (!b)
        return lt_errf(errstr, n, LT_ERR_INVALID, "hyperparameters.target_modules: \"%s\" is not a module name",
                       m ? m : "");
      bits |= b;
    }
    spec->hp.target_modules = bits;
  }
  return LT_OK;
}

lt_err_t lt_jobspec_to_record(const lt_jobspec_t *spec, lt_avro_record_t *rec, char *errstr, size_t n) {
  lt_err_t err = LT_OK;
#define TRY(x)                                                                                     \
  do {                                                                                             \
    if ((err = (x))) return lt_errf(errstr, n, err, "%s", lt_avro_record_error(rec));             \
  } while (0)
  TRY(lt_avro_set_string(rec, "base_model", spec->base_model));
  TRY(lt_avro_set_string(rec, "dataset_id", spec->dataset_id));
  if (spec->validation_dataset_id[0]) TRY(lt_avro_set_string(rec, "validation_dataset_id", spec->validation_dataset_id));
  else TRY(lt_avro_set_null(rec, "validation_dataset_id"));
  if (strcmp(lt_avro_record_type(rec), "JobSubmitted") == 0) {
    if (spec->idempotency_key[0]) TRY(lt_avro_set_string(rec, "idempotency_key", spec->idempotency_key));
    else TRY(lt_avro_set_null(rec, "idempotency_key"));
  }
  TRY(lt_avro_set_enum(rec, "priority", lt_job_class_name(spec->priority)));
  TRY(lt_avro_set_enum(rec, "mode", spec->mode == LT_MODE_INTERACTIVE ? "interactive" : "managed"));
  TRY(lt_avro_set_long(rec, "max_duration_s", spec->max_duration_s));
  TRY(lt_avro_set_int(rec, "gpus", spec->gpus));
  char path[64];
  for (size_t i = 0; i < sizeof hp_map / sizeof *hp_map; i++) {
    snprintf(path, sizeof path, "hyperparameters.%s", hp_map[i].name);
    const char *p = (const char *)&spec->hp + hp_map[i].offset;
    TRY(hp_map[i].kind == 'i'   ? lt_avro_set_int(rec, path, *(const int32_t *)p)
        : hp_map[i].kind == 'l' ? lt_avro_set_long(rec, path, *(const int64_t *)p)
                                : lt_avro_set_double(rec, path, *(const double *)p));
  }
  TRY(lt_avro_set_string(rec, "hyperparameters.lr_schedule", lt_lr_schedule_name(spec->hp.lr_schedule)));
  TRY(lt_avro_array_clear(rec, "hyperparameters.target_modules"));
  for (uint32_t b = 1; b <= LT_MODULE_DOWN; b <<= 1)
    if (spec->hp.target_modules & b) TRY(lt_avro_array_append_string(rec, "hyperparameters.target_modules", lt_target_name(b)));
#undef TRY
  return LT_OK;
}
