/* lt_job_record: Avro records <-> job events and job specs (see lt_job_record.h). */
#include "lt_job_record.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "lt_crypto.h"

/* A string field, or NULL when the field is null or absent in this record type. */
static const char *opt_str(lt_avro_record_t *rec, const char *path) {
  const char *s = NULL;
  if (lt_avro_get_string(rec, path, &s, NULL) != LT_OK) return NULL;
  return s;
}

/* The fields the fold reads. A reader knows their index in each job record schema, so the fold
 * reads them by index; without one (or for a field the schema lacks, whose error message must
 * name it) they are read by name. Both ways go through the one function below, so they cannot
 * disagree. */
enum {
  F_EVENT_ID, F_JOB_ID, F_TENANT_ID, F_OCCURRED_AT, F_ATTEMPT, F_BASE_MODEL, F_DATASET_ID, F_PRIORITY,
  F_GPUS, F_MAX_DURATION_S, F_WORKER_ID, F_LEASE_MS, F_STEP, F_OBJECT_KEYS, F_SHA256, F_BYTES, F_FINAL,
  F_REASON, F_DETAIL, F_SEQ, F__COUNT
};
static const char *const field_names[F__COUNT] = {
    "event_id", "job_id", "tenant_id", "occurred_at", "attempt", "base_model", "dataset_id", "priority",
    "gpus", "max_duration_s", "worker_id", "lease_ms", "step", "object_keys", "sha256", "bytes", "final",
    "reason", "detail", "seq"};

struct lt_job_reader {
  const lt_avro_schema_t *schema[LT_EV__COUNT]; /* newest version of each job record type */
  int idx[LT_EV__COUNT][F__COUNT];                 /* field index in it, -1: absent */
};

/* How event_fill reaches fields: by index (idx) or, when idx is NULL or says -1, by name. */
typedef struct {
  lt_avro_record_t *rec;
  const int *idx;
} acc_t;

static lt_err_t a_str(const acc_t *a, int f, const char **out) {
  return a->idx && a->idx[f] >= 0 ? lt_avro_get_string_at(a->rec, a->idx[f], out, NULL)
                                   : lt_avro_get_string(a->rec, field_names[f], out, NULL);
}
static const char *a_opt_str(const acc_t *a, int f) {
  const char *s = NULL;
  return a_str(a, f, &s) == LT_OK ? s : NULL;
}
static lt_err_t a_long(const acc_t *a, int f, int64_t *out) {
  return a->idx && a->idx[f] >= 0 ? lt_avro_get_long_at(a->rec, a->idx[f], out)
                                   : lt_avro_get_long(a->rec, field_names[f], out);
}
static lt_err_t a_int(const acc_t *a, int f, int32_t *out) {
  return a->idx && a->idx[f] >= 0 ? lt_avro_get_int_at(a->rec, a->idx[f], out)
                                   : lt_avro_get_int(a->rec, field_names[f], out);
}
static lt_err_t a_bool(const acc_t *a, int f, bool *out) {
  return a->idx && a->idx[f] >= 0 ? lt_avro_get_bool_at(a->rec, a->idx[f], out)
                                   : lt_avro_get_bool(a->rec, field_names[f], out);
}
static lt_err_t a_enum(const acc_t *a, int f, const char **out) {
  return a->idx && a->idx[f] >= 0 ? lt_avro_get_enum_at(a->rec, a->idx[f], out)
                                   : lt_avro_get_enum(a->rec, field_names[f], out);
}
/* First element of an array of strings ("object_keys[0]"), or NULL. */
static const char *a_opt_str0(const acc_t *a, int f) {
  const char *s = NULL;
  char path[64];
  lt_err_t err;
  if (a->idx && a->idx[f] >= 0) {
    err = lt_avro_get_array_string_at(a->rec, a->idx[f], 0, &s, NULL);
  } else {
    snprintf(path, sizeof path, "%s[0]", field_names[f]);
    err = lt_avro_get_string(a->rec, path, &s, NULL);
  }
  return err == LT_OK ? s : NULL;
}

static lt_err_t need_str(const acc_t *a, int f, const char **out, char *errstr, size_t n) {
  if (a_str(a, f, out) != LT_OK)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s: %s", lt_avro_record_type(a->rec), lt_avro_record_error(a->rec));
  return LT_OK;
}

/* Fills *ev (type already set) from the record behind a. */
static lt_err_t event_fill(const acc_t *a, lt_job_event_t *ev, char *errstr, size_t n) {
  lt_err_t err;
  if ((err = need_str(a, F_EVENT_ID, &ev->event_id, errstr, n))) return err;
  if ((err = need_str(a, F_JOB_ID, &ev->job_id, errstr, n))) return err;
  if ((err = need_str(a, F_TENANT_ID, &ev->tenant_id, errstr, n))) return err;
  a_long(a, F_OCCURRED_AT, &ev->occurred_at_ms);
  a_int(a, F_ATTEMPT, &ev->attempt); /* absent in non-attempt records: stays 0 */
  const char *sym = NULL;
  switch (ev->type) {
  case LT_EV_JOB_SUBMITTED:
    ev->base_model = a_opt_str(a, F_BASE_MODEL);
    ev->dataset_id = a_opt_str(a, F_DATASET_ID);
    if (a_enum(a, F_PRIORITY, &sym) == LT_OK) lt_job_class_parse(sym, &ev->job_class);
    a_int(a, F_GPUS, &ev->gpus);
    a_long(a, F_MAX_DURATION_S, &ev->max_duration_s);
    break;
  case LT_EV_JOB_DISPATCHED:
    ev->worker_id = a_opt_str(a, F_WORKER_ID);
    a_long(a, F_LEASE_MS, &ev->lease_ms);
    break;
  case LT_EV_ATTEMPT_STARTED:
    ev->worker_id = a_opt_str(a, F_WORKER_ID);
    break;
  case LT_EV_CHECKPOINT_COMMITTED:
    a_long(a, F_STEP, &ev->step);
    ev->object_key = a_opt_str0(a, F_OBJECT_KEYS);
    ev->sha256_hex = a_opt_str(a, F_SHA256);
    a_long(a, F_BYTES, &ev->bytes);
    a_bool(a, F_FINAL, &ev->final_checkpoint);
    break;
  case LT_EV_ATTEMPT_STOPPED:
    if (a_enum(a, F_REASON, &sym) != LT_OK || lt_job_stop_reason_parse(sym, &ev->stop_reason))
      return lt_errf(errstr, n, LT_ERR_INVALID, "AttemptStopped: field \"reason\" is not a stop reason");
    a_long(a, F_STEP, &ev->step);
    ev->reason = a_opt_str(a, F_DETAIL);
    break;
  case LT_EV_JOB_REJECTED:
  case LT_EV_JOB_FAILED:
    ev->reason = a_opt_str(a, F_REASON);
    break;
  case LT_EV_CANCEL_REQUESTED:
    ev->reason = a_opt_str(a, F_REASON);
    break;
  case LT_EV_SESSION_IDLE:
  case LT_EV_SESSION_WOKEN:
    a_long(a, F_SEQ, &ev->step); /* the call's sequence number */
    break;
  default:
    break;
  }
  return LT_OK;
}

lt_err_t lt_job_event_from_record(lt_avro_record_t *rec, lt_job_event_t *ev, char *errstr, size_t n) {
  memset(ev, 0, sizeof *ev);
  const char *type = lt_avro_record_type(rec);
  if (lt_job_event_type_parse(type, &ev->type) != LT_OK)
    return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "%s is not a job record", type);
  acc_t a = {rec, NULL};
  return event_fill(&a, ev, errstr, n);
}

lt_err_t lt_job_reader_new(const lt_avro_registry_t *reg, lt_job_reader_t **out) {
  lt_job_reader_t *r = calloc(1, sizeof *r);
  if (!r) return LT_ERR_NOMEM;
  for (int t = 0; t < LT_EV__COUNT; t++) {
    r->schema[t] = lt_avro_schema_latest(reg, lt_job_event_type_name((lt_job_event_type_t)t));
    for (int f = 0; f < F__COUNT; f++)
      r->idx[t][f] = r->schema[t] ? lt_avro_schema_field_index(r->schema[t], field_names[f]) : -1;
  }
  *out = r;
  return LT_OK;
}

void lt_job_reader_destroy(lt_job_reader_t *r) { free(r); }

lt_err_t lt_job_reader_type(const lt_job_reader_t *r, const lt_avro_schema_t *s, lt_job_event_type_t *out) {
  for (int t = 0; t < LT_EV__COUNT; t++)
    if (r->schema[t] == s) {
      *out = (lt_job_event_type_t)t;
      return LT_OK;
    }
  /* not a newest version: by name, as lt_job_event_from_record */
  return lt_job_event_type_parse(lt_avro_schema_name(s), out);
}

lt_err_t lt_job_event_read(const lt_job_reader_t *r, lt_avro_record_t *rec, lt_job_event_t *ev, char *errstr,
                           size_t n) {
  memset(ev, 0, sizeof *ev);
  const lt_avro_schema_t *s = lt_avro_record_schema(rec);
  for (int t = 0; t < LT_EV__COUNT; t++)
    if (r->schema[t] == s) {
      ev->type = (lt_job_event_type_t)t;
      acc_t a = {rec, r->idx[t]};
      return event_fill(&a, ev, errstr, n);
    }
  return lt_job_event_from_record(rec, ev, errstr, n);
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
  const char *model = opt_str(rec, "base_model");
  if (model && strlen(model) >= sizeof spec->base_model)
    return lt_errf(errstr, n, LT_ERR_INVALID, "base_model: is longer than %d characters", LT_JOB_NAME_MAX - 1);
  if (model) snprintf(spec->base_model, sizeof spec->base_model, "%s", model);
  const char *ids[][2] = {{"dataset_id", NULL}, {"validation_dataset_id", NULL}, {"idempotency_key", NULL}};
  char *dst[] = {spec->dataset_id, spec->validation_dataset_id, spec->idempotency_key};
  for (int i = 0; i < 3; i++) {
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
  const char *prec = opt_str(rec, "hyperparameters.precision"); /* v3 */
  if (prec && lt_precision_parse(prec, &spec->hp.precision))
    return lt_errf(errstr, n, LT_ERR_INVALID, "hyperparameters.precision: \"%.40s\" is not auto, f32 or bf16", prec);
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
  const char *suffix = opt_str(rec, "suffix");
  if (suffix && strlen(suffix) >= sizeof spec->suffix)
    return lt_errf(errstr, n, LT_ERR_INVALID, "suffix: is longer than 64 characters");
  if (suffix) snprintf(spec->suffix, sizeof spec->suffix, "%s", suffix);
  size_t nmeta = 0;
  if (lt_avro_map_size(rec, "metadata", &nmeta) == LT_OK) {
    if (nmeta > LT_JOBSPEC_META_MAX)
      return lt_errf(errstr, n, LT_ERR_INVALID, "metadata: has %zu keys, over the limit of %d", nmeta,
                     LT_JOBSPEC_META_MAX);
    for (size_t i = 0; i < nmeta; i++) {
      const char *k, *v;
      if (lt_avro_map_get_string_at(rec, "metadata", i, &k, &v))
        return lt_errf(errstr, n, LT_ERR_INVALID, "%s", lt_avro_record_error(rec));
      if (!*k || strlen(k) > LT_JOBSPEC_META_KEY_MAX || strlen(v) > LT_JOBSPEC_META_VALUE_MAX)
        return lt_errf(errstr, n, LT_ERR_INVALID, "metadata.%.64s: keys must be 1-%d bytes, values at most %d",
                       k, LT_JOBSPEC_META_KEY_MAX, LT_JOBSPEC_META_VALUE_MAX);
      snprintf(spec->meta[i].key, sizeof spec->meta[i].key, "%s", k);
      snprintf(spec->meta[i].value, sizeof spec->meta[i].value, "%s", v);
    }
    spec->nmeta = (int32_t)nmeta;
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
    if (spec->suffix[0]) TRY(lt_avro_set_string(rec, "suffix", spec->suffix));
    else TRY(lt_avro_set_null(rec, "suffix"));
    for (int i = 0; i < spec->nmeta; i++) TRY(lt_avro_map_set_string(rec, "metadata", spec->meta[i].key, spec->meta[i].value));
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
  TRY(lt_avro_set_string(rec, "hyperparameters.precision", lt_precision_name(spec->hp.precision)));
  TRY(lt_avro_array_clear(rec, "hyperparameters.target_modules"));
  for (uint32_t b = 1; b <= LT_MODULE_DOWN; b <<= 1)
    if (spec->hp.target_modules & b) TRY(lt_avro_array_append_string(rec, "hyperparameters.target_modules", lt_target_name(b)));
#undef TRY
  return LT_OK;
}

lt_err_t lt_dead_letter_fill(lt_avro_record_t *rec, const lt_bus_msg_t *m, lt_err_t code, const char *reason,
                             const char *consumer) {
  size_t klen = 0, vlen = 0;
  const void *key = lt_bus_msg_key(m, &klen), *val = lt_bus_msg_value(m, &vlen);
  uint64_t fp;
  char hex[17];
  bool has_fp = val && lt_avro_peek(val, vlen, &fp, NULL, 0) == LT_OK;
  if (has_fp) lt_avro_fingerprint_hex(fp, hex);
  char cut[768];
  if (vlen > LT_DEAD_LETTER_PAYLOAD_MAX || klen > LT_DEAD_LETTER_KEY_MAX) {
    snprintf(cut, sizeof cut, "%s (kept: the first %zu of the payload's %zu bytes, the first %zu of the key's %zu)",
             reason, vlen > LT_DEAD_LETTER_PAYLOAD_MAX ? (size_t)LT_DEAD_LETTER_PAYLOAD_MAX : vlen, vlen,
             klen > LT_DEAD_LETTER_KEY_MAX ? (size_t)LT_DEAD_LETTER_KEY_MAX : klen, klen);
    reason = cut;
    if (vlen > LT_DEAD_LETTER_PAYLOAD_MAX) vlen = LT_DEAD_LETTER_PAYLOAD_MAX;
    if (klen > LT_DEAD_LETTER_KEY_MAX) klen = LT_DEAD_LETTER_KEY_MAX;
  }
  if (lt_avro_set_string(rec, "topic", lt_bus_msg_topic(m)) || lt_avro_set_int(rec, "partition", lt_bus_msg_partition(m)) ||
      lt_avro_set_long(rec, "offset", lt_bus_msg_offset(m)) ||
      (key ? lt_avro_set_bytes(rec, "key", key, klen) : lt_avro_set_null(rec, "key")) ||
      lt_avro_set_bytes(rec, "payload", val ? val : "", vlen) ||
      (has_fp ? lt_avro_set_string(rec, "fingerprint", hex) : lt_avro_set_null(rec, "fingerprint")) ||
      lt_avro_set_string(rec, "error_code", lt_err_name(code)) || lt_avro_set_string(rec, "reason", reason) ||
      lt_avro_set_string(rec, "consumer", consumer))
    return LT_ERR_INVALID;
  return LT_OK;
}

int32_t lt_calls_partition(const char *job_id) {
  uint32_t h = 2166136261u;
  for (const char *c = job_id; *c; c++) h = (h ^ (unsigned char)*c) * 16777619u;
  return (int32_t)(h % LT_CALLS_PARTITIONS);
}

void lt_call_id_for_key(const char *tenant_id, const char *job_id, const char *key, char out[LT_CALL_ID_MAX]) {
  char seed[256];
  uint8_t h[32];
  int n = snprintf(seed, sizeof seed, "%s\n%s\n%s", tenant_id, job_id, key);
  lt_crypto_sha256(seed, n < 0 ? 0 : (size_t)n < sizeof seed ? (size_t)n : sizeof seed - 1, h);
  out[0] = 'k';
  lt_crypto_hex(h, 16, out + 1);
}

bool lt_call_body_digest(const json_t *body, char hex[65]) {
  json_t *c = json_deep_copy(body);
  if (c) json_object_del(c, "state_key");
  char *text = c ? json_dumps(c, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
  json_decref(c);
  if (!text) return false;
  uint8_t h[32];
  unsigned hl = 0;
  bool ok = EVP_Digest(text, strlen(text), h, &hl, EVP_sha256(), NULL) == 1 && hl == sizeof h;
  OPENSSL_cleanse(text, strlen(text));
  free(text);
  if (ok) lt_crypto_hex(h, sizeof h, hex);
  return ok;
}

void lt_call_digest_key(char *out, size_t n, const char *body_key) { snprintf(out, n, "%s.digest", body_key); }

bool lt_call_id_keyed(const char *call_id) {
  if (!call_id || call_id[0] != 'k' || strlen(call_id) != 33) return false;
  for (const char *c = call_id + 1; *c; c++)
    if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return false;
  return true;
}
