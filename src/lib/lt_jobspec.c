/* lt_jobspec: defaults, ranges and validation of job submissions (see lt_jobspec.h). */
#include "lt_jobspec.h"
#include "lt_dataset.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef enum { NUM_I32, NUM_I64, NUM_F64 } num_kind_t;

/* One numeric hyperparameter: where it lives, its default and its closed range
 * (min_open: the minimum itself is not allowed). The defaults equal the Avro schema's
 * (tests/test_jobspec.c checks it against schemas/JobSubmitted.v1.avsc). */
typedef struct {
  const char *name;
  num_kind_t kind;
  size_t offset;
  double def, min, max;
  bool min_open;
} num_field_t;

#define HP(f) offsetof(lt_jobspec_t, hp) + offsetof(lt_hparams_t, f)
static const num_field_t hp_fields[] = {
    {"epochs", NUM_I32, HP(epochs), 1, 1, 100, false},
    {"max_steps", NUM_I64, HP(max_steps), 0, 0, 1000000, false},
    {"learning_rate", NUM_F64, HP(learning_rate), 0.0002, 0, 1, true},
    {"warmup_steps", NUM_I32, HP(warmup_steps), 0, 0, 1000000, false},
    {"weight_decay", NUM_F64, HP(weight_decay), 0.0, 0, 1, false},
    {"lora_rank", NUM_I32, HP(lora_rank), 16, 1, 256, false},
    {"lora_alpha", NUM_F64, HP(lora_alpha), 32.0, 0, 4096, true},
    {"lora_dropout", NUM_F64, HP(lora_dropout), 0.05, 0, 0.9, false},
    {"batch_size", NUM_I32, HP(batch_size), 4, 1, 1024, false},
    {"grad_accum", NUM_I32, HP(grad_accum), 1, 1, 1024, false},
    {"max_seq_len", NUM_I32, HP(max_seq_len), 1024, 8, 32768, false},
    {"eval_interval", NUM_I32, HP(eval_interval), 0, 0, 1000000, false},
    {"checkpoint_interval", NUM_I32, HP(checkpoint_interval), 100, 0, 1000000, false},
    {"checkpoint_interval_s", NUM_I32, HP(checkpoint_interval_s), 600, 0, 86400, false},
    {"validation_fraction", NUM_F64, HP(validation_fraction), 0.05, 0, 0.5, false},
    {"seed", NUM_I64, HP(seed), 0, 0, 2147483647.0, false},
};
#undef HP

static const num_field_t top_fields[] = {
    {"max_duration_s", NUM_I64, offsetof(lt_jobspec_t, max_duration_s), 86400, 60, 30 * 86400.0, false},
    {"gpus", NUM_I32, offsetof(lt_jobspec_t, gpus), 0, 0, 8, false},
};

static const char *const target_names[] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                           "gate_proj", "up_proj", "down_proj"};
static const char *const schedule_names[] = {"cosine", "linear", "constant"};

const char *lt_target_name(uint32_t bit) {
  for (int i = 0; i < 7; i++)
    if (bit == (1u << i)) return target_names[i];
  return NULL;
}

uint32_t lt_target_parse(const char *name) {
  for (int i = 0; i < 7; i++)
    if (strcmp(name, target_names[i]) == 0) return 1u << i;
  return 0;
}

const char *lt_lr_schedule_name(lt_lr_schedule_t s) {
  return (unsigned)s < 3 ? schedule_names[s] : "?";
}

static const char *const precision_names[] = {"auto", "f32", "bf16"};

const char *lt_precision_name(lt_precision_t p) { return (unsigned)p < 3 ? precision_names[p] : "?"; }

lt_err_t lt_precision_parse(const char *name, lt_precision_t *out) {
  for (int i = 0; i < 3; i++)
    if (strcmp(name, precision_names[i]) == 0) {
      *out = (lt_precision_t)i;
      return LT_OK;
    }
  return LT_ERR_INVALID;
}

lt_err_t lt_lr_schedule_parse(const char *name, lt_lr_schedule_t *out) {
  for (int i = 0; i < 3; i++)
    if (strcmp(name, schedule_names[i]) == 0) {
      *out = (lt_lr_schedule_t)i;
      return LT_OK;
    }
  return LT_ERR_INVALID;
}

bool lt_model_id_valid(const char *s) {
  if (!s || strlen(s) >= LT_JOB_NAME_MAX) return false;
  const char *slash = strchr(s, '/');
  if (!slash) return lt_id_valid(s);
  char org[LT_JOB_NAME_MAX];
  snprintf(org, sizeof org, "%.*s", (int)(slash - s), s);
  /* "ORG/NAME" as the Hub spells ids: one slash, each side an id (so never "..", never a path). */
  return lt_id_valid(org) && lt_id_valid(slash + 1);
}

bool lt_id_valid(const char *s) {
  if (!s) return false;
  size_t n = strlen(s);
  if (n == 0 || n > LT_ID_MAX || s[0] == '.' || s[0] == '-') return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  }
  return true;
}

static void num_set(void *base, const num_field_t *f, double v) {
  char *p = (char *)base + f->offset;
  switch (f->kind) {
  case NUM_I32: *(int32_t *)p = (int32_t)v; break;
  case NUM_I64: *(int64_t *)p = (int64_t)v; break;
  case NUM_F64: *(double *)p = v; break;
  }
}

static double num_get(const void *base, const num_field_t *f) {
  const char *p = (const char *)base + f->offset;
  switch (f->kind) {
  case NUM_I32: return *(const int32_t *)p;
  case NUM_I64: return (double)*(const int64_t *)p;
  case NUM_F64: return *(const double *)p;
  }
  return 0;
}

void lt_jobspec_defaults(lt_jobspec_t *spec) {
  memset(spec, 0, sizeof *spec);
  for (size_t i = 0; i < sizeof hp_fields / sizeof *hp_fields; i++) num_set(spec, &hp_fields[i], hp_fields[i].def);
  for (size_t i = 0; i < sizeof top_fields / sizeof *top_fields; i++) num_set(spec, &top_fields[i], top_fields[i].def);
  spec->hp.lr_schedule = LT_LR_COSINE;
  spec->hp.target_modules = LT_MODULE_ALL;
  spec->priority = LT_CLASS_STANDARD;
  spec->mode = LT_MODE_MANAGED;
}

static lt_err_t bad(char *field, size_t field_size, const char *path, char *errstr, size_t n,
                    const char *fmt, const char *detail) {
  if (field && field_size) snprintf(field, field_size, "%s", path);
  char msg[256];
  snprintf(msg, sizeof msg, fmt, detail ? detail : "");
  return lt_errf(errstr, n, LT_ERR_INVALID, "%s: %s", path, msg);
}

static lt_err_t check_num(const num_field_t *f, double v, const char *prefix, char *field, size_t fs,
                          char *errstr, size_t n) {
  char path[96], detail[128];
  snprintf(path, sizeof path, "%s%s", prefix, f->name);
  if (!isfinite(v)) return bad(field, fs, path, errstr, n, "%s", "must be a finite number");
  if (f->kind != NUM_F64 && v != floor(v))
    return bad(field, fs, path, errstr, n, "%s", "must be a whole number");
  if (v < f->min || (f->min_open && v == f->min)) {
    snprintf(detail, sizeof detail, "%g is below the minimum %s%g", v, f->min_open ? "(exclusive) " : "", f->min);
    return bad(field, fs, path, errstr, n, "%s", detail);
  }
  if (v > f->max) {
    snprintf(detail, sizeof detail, "%g is above the maximum %g", v, f->max);
    return bad(field, fs, path, errstr, n, "%s", detail);
  }
  return LT_OK;
}

/* An id's alphabet, up to 64 characters (a suffix becomes part of a model's name). */
static bool suffix_valid(const char *s) {
  size_t len = strlen(s);
  if (len == 0 || len > 64 || s[0] == '.' || s[0] == '-') return false;
  return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == len;
}

lt_err_t lt_jobspec_validate(const lt_jobspec_t *s, char *field, size_t fs, char *errstr, size_t n) {
  if (!lt_model_id_valid(s->base_model))
    return bad(field, fs, "base_model", errstr, n, "%s",
               "is required: 1-63 characters of A-Z a-z 0-9 . _ - (not starting with . or -), or a Hugging "
               "Face id ORG/NAME of two such");
  /* A session (mode interactive) gets its data call by call; a managed job trains on a dataset. */
  if (s->mode == LT_MODE_INTERACTIVE ? s->dataset_id[0] && !lt_id_valid(s->dataset_id) : !lt_id_valid(s->dataset_id))
    return bad(field, fs, "dataset_id", errstr, n, "%s",
               "is required: 1-63 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
  if (s->validation_dataset_id[0] && !lt_id_valid(s->validation_dataset_id))
    return bad(field, fs, "validation_dataset_id", errstr, n, "%s", "is not a valid dataset id");
  if (s->idempotency_key[0] && !lt_id_valid(s->idempotency_key))
    return bad(field, fs, "idempotency_key", errstr, n, "%s",
               "must be 1-63 characters of A-Z a-z 0-9 . _ -");
  if (s->suffix[0] && !suffix_valid(s->suffix))
    return bad(field, fs, "suffix", errstr, n, "%s",
               "must be up to 64 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
  if (s->nmeta < 0 || s->nmeta > LT_JOBSPEC_META_MAX)
    return bad(field, fs, "metadata", errstr, n, "%s", "has more than 16 keys");
  /* What read_metadata (and JSON itself) ensures of a body, checked here for a record too: an
   * upstream JobSubmitted's map may repeat a key or hold bytes that are not UTF-8, which no
   * JSON view of the job could show. */
  for (int i = 0; i < s->nmeta; i++) {
    size_t kl = strnlen(s->meta[i].key, sizeof s->meta[i].key);
    if (kl == 0 || kl > LT_JOBSPEC_META_KEY_MAX || !lt_utf8_valid(s->meta[i].key, kl, NULL) ||
        !lt_utf8_valid(s->meta[i].value, strnlen(s->meta[i].value, sizeof s->meta[i].value), NULL))
      return bad(field, fs, "metadata", errstr, n, "%s", "keys must be 1-64 bytes and values at most 512 of UTF-8");
    for (int j = 0; j < i; j++)
      if (strcmp(s->meta[i].key, s->meta[j].key) == 0)
        return bad(field, fs, "metadata", errstr, n, "%s", "names a key twice");
  }
  if ((unsigned)s->priority >= LT_CLASS__COUNT)
    return bad(field, fs, "priority", errstr, n, "%s", "must be production, standard or preemptible");
  if ((unsigned)s->mode > LT_MODE_INTERACTIVE)
    return bad(field, fs, "mode", errstr, n, "%s", "must be managed or interactive");
  if ((unsigned)s->hp.lr_schedule > LT_LR_CONSTANT)
    return bad(field, fs, "hyperparameters.lr_schedule", errstr, n, "%s", "must be cosine, linear or constant");
  if ((unsigned)s->hp.precision > LT_PRECISION_BF16)
    return bad(field, fs, "hyperparameters.precision", errstr, n, "%s", "must be auto, f32 or bf16");
  if (s->hp.target_modules == 0 || (s->hp.target_modules & ~(uint32_t)LT_MODULE_ALL))
    return bad(field, fs, "hyperparameters.target_modules", errstr, n, "%s",
               "must name at least one of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
  lt_err_t err;
  for (size_t i = 0; i < sizeof top_fields / sizeof *top_fields; i++)
    if ((err = check_num(&top_fields[i], num_get(s, &top_fields[i]), "", field, fs, errstr, n))) return err;
  for (size_t i = 0; i < sizeof hp_fields / sizeof *hp_fields; i++)
    if ((err = check_num(&hp_fields[i], num_get(s, &hp_fields[i]), "hyperparameters.", field, fs, errstr, n)))
      return err;
  return LT_OK;
}

static lt_err_t read_id(const json_t *v, const char *path, char *dst, char *field, size_t fs, char *errstr,
                        size_t n) {
  /* "" is no id, as null: lt_jobspec_to_json writes a session's absent dataset so. */
  if (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) return LT_OK;
  if (!json_is_string(v)) return bad(field, fs, path, errstr, n, "%s", "must be a string");
  if (json_string_length(v) > LT_ID_MAX) return bad(field, fs, path, errstr, n, "%s", "is longer than 63 characters");
  if (!lt_id_valid(json_string_value(v)))
    return bad(field, fs, path, errstr, n, "%s", "must be 1-63 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
  snprintf(dst, LT_ID_MAX + 1, "%s", json_string_value(v));
  return LT_OK;
}

/* suffix: a string (lt_jobspec_validate checks its characters). */
static lt_err_t read_suffix(const json_t *v, lt_jobspec_t *s, char *field, size_t fs, char *errstr, size_t n) {
  if (json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0)) return LT_OK;
  if (!json_is_string(v) || json_string_length(v) > 64 || strlen(json_string_value(v)) != json_string_length(v))
    return bad(field, fs, "suffix", errstr, n, "%s",
               "must be up to 64 characters of A-Z a-z 0-9 . _ - (not starting with . or -)");
  snprintf(s->suffix, sizeof s->suffix, "%s", json_string_value(v));
  return LT_OK;
}

/* metadata: an object of up to 16 string values, keys up to 64 bytes, values up to 512, UTF-8. */
static lt_err_t read_metadata(const json_t *v, lt_jobspec_t *s, char *field, size_t fs, char *errstr, size_t n) {
  s->nmeta = 0;
  if (json_is_null(v)) return LT_OK;
  if (!json_is_object(v)) return bad(field, fs, "metadata", errstr, n, "%s", "must be an object of strings");
  char detail[96];
  if (json_object_size(v) > LT_JOBSPEC_META_MAX) {
    snprintf(detail, sizeof detail, "has %zu keys, over the limit of %d", json_object_size(v), LT_JOBSPEC_META_MAX);
    return bad(field, fs, "metadata", errstr, n, "%s", detail);
  }
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)v, key, val) {
    char path[96];
    snprintf(path, sizeof path, "metadata.%.60s", key);
    size_t kl = strlen(key);
    if (kl == 0 || kl > LT_JOBSPEC_META_KEY_MAX || !lt_utf8_valid(key, kl, NULL))
      return bad(field, fs, path, errstr, n, "%s", "keys must be 1-64 bytes of UTF-8");
    if (!json_is_string(val)) return bad(field, fs, path, errstr, n, "%s", "must be a string");
    if (json_string_length(val) > LT_JOBSPEC_META_VALUE_MAX || strlen(json_string_value(val)) != json_string_length(val))
      return bad(field, fs, path, errstr, n, "%s", "must be at most 512 bytes (and hold no NUL)");
    snprintf(s->meta[s->nmeta].key, sizeof s->meta[0].key, "%s", key);
    snprintf(s->meta[s->nmeta].value, sizeof s->meta[0].value, "%s", json_string_value(val));
    s->nmeta++;
  }
  return LT_OK;
}

/* base_model: an id or a Hugging Face id ORG/NAME (lt_jobspec_validate checks it). */
static lt_err_t read_model_id(const json_t *v, lt_jobspec_t *s, char *field, size_t fs, char *errstr, size_t n) {
  if (json_is_null(v)) return LT_OK;
  if (!json_is_string(v) || json_string_length(v) >= sizeof s->base_model ||
      strlen(json_string_value(v)) != json_string_length(v))
    return bad(field, fs, "base_model", errstr, n, "%s", "must be a model id of at most 127 characters");
  snprintf(s->base_model, sizeof s->base_model, "%s", json_string_value(v));
  return LT_OK;
}

static lt_err_t read_num(const json_t *v, const num_field_t *f, void *base, const char *prefix, char *field,
                         size_t fs, char *errstr, size_t n) {
  char path[96];
  snprintf(path, sizeof path, "%s%s", prefix, f->name);
  if (!json_is_number(v)) return bad(field, fs, path, errstr, n, "%s", "must be a number");
  double d = json_number_value(v);
  lt_err_t err = check_num(f, d, prefix, field, fs, errstr, n);
  if (err) return err;
  num_set(base, f, d);
  return LT_OK;
}

static lt_err_t read_hparams(const json_t *hp, lt_jobspec_t *s, char *field, size_t fs, char *errstr, size_t n) {
  if (!json_is_object(hp)) return bad(field, fs, "hyperparameters", errstr, n, "%s", "must be an object");
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)hp, key, v) {
    char path[96];
    snprintf(path, sizeof path, "hyperparameters.%.60s", key);
    bool known = false;
    for (size_t i = 0; i < sizeof hp_fields / sizeof *hp_fields && !known; i++) {
      if (strcmp(key, hp_fields[i].name) != 0) continue;
      known = true;
      lt_err_t err = read_num(v, &hp_fields[i], s, "hyperparameters.", field, fs, errstr, n);
      if (err) return err;
    }
    if (known) continue;
    if (strcmp(key, "lr_schedule") == 0) {
      if (!json_is_string(v) || lt_lr_schedule_parse(json_string_value(v), &s->hp.lr_schedule))
        return bad(field, fs, path, errstr, n, "%s", "must be \"cosine\", \"linear\" or \"constant\"");
    } else if (strcmp(key, "precision") == 0) {
      if (!json_is_string(v) || lt_precision_parse(json_string_value(v), &s->hp.precision))
        return bad(field, fs, path, errstr, n, "%s", "must be \"auto\", \"f32\" or \"bf16\"");
    } else if (strcmp(key, "target_modules") == 0) {
      if (!json_is_array(v) || json_array_size(v) == 0)
        return bad(field, fs, path, errstr, n, "%s", "must be a non-empty array of module names");
      uint32_t bits = 0;
      size_t i;
      json_t *m;
      json_array_foreach(v, i, m) {
        uint32_t b = json_is_string(m) ? lt_target_parse(json_string_value(m)) : 0;
        if (!b)
          return bad(field, fs, path, errstr, n, "%s",
                     "has an unknown module; use q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
        bits |= b;
      }
      s->hp.target_modules = bits;
    } else {
      return bad(field, fs, path, errstr, n, "%s", "is not a known hyperparameter");
    }
  }
  return LT_OK;
}

lt_err_t lt_jobspec_from_json(const json_t *body, lt_jobspec_t *s, char *field, size_t fs, char *errstr,
                              size_t n) {
  lt_jobspec_defaults(s);
  if (field && fs) field[0] = '\0';
  if (!json_is_object(body)) return bad(field, fs, "(body)", errstr, n, "%s", "must be a JSON object");
  const char *key;
  json_t *v;
  lt_err_t err = LT_OK;
  json_object_foreach((json_t *)body, key, v) {
    char path[96];
    snprintf(path, sizeof path, "%.60s", key);
    if (strcmp(key, "base_model") == 0) err = read_model_id(v, s, field, fs, errstr, n);
    else if (strcmp(key, "dataset_id") == 0) err = read_id(v, key, s->dataset_id, field, fs, errstr, n);
    else if (strcmp(key, "validation_dataset_id") == 0)
      err = read_id(v, key, s->validation_dataset_id, field, fs, errstr, n);
    else if (strcmp(key, "hyperparameters") == 0) err = read_hparams(v, s, field, fs, errstr, n);
    else if (strcmp(key, "suffix") == 0) err = read_suffix(v, s, field, fs, errstr, n);
    else if (strcmp(key, "metadata") == 0) err = read_metadata(v, s, field, fs, errstr, n);
    else if (strcmp(key, "priority") == 0) {
      if (!json_is_string(v) || lt_job_class_parse(json_string_value(v), &s->priority))
        err = bad(field, fs, key, errstr, n, "%s", "must be \"production\", \"standard\" or \"preemptible\"");
    } else if (strcmp(key, "mode") == 0) {
      const char *m = json_is_string(v) ? json_string_value(v) : "";
      if (strcmp(m, "managed") == 0) s->mode = LT_MODE_MANAGED;
      else if (strcmp(m, "interactive") == 0) s->mode = LT_MODE_INTERACTIVE;
      else err = bad(field, fs, key, errstr, n, "%s", "must be \"managed\" or \"interactive\"");
    } else {
      bool known = false;
      for (size_t i = 0; i < sizeof top_fields / sizeof *top_fields && !known; i++) {
        if (strcmp(key, top_fields[i].name) != 0) continue;
        known = true;
        err = read_num(v, &top_fields[i], s, "", field, fs, errstr, n);
      }
      if (!known) err = bad(field, fs, path, errstr, n, "%s", "is not a known field");
    }
    if (err) return err;
  }
  return lt_jobspec_validate(s, field, fs, errstr, n);
}

json_t *lt_jobspec_to_json(const lt_jobspec_t *s) {
  json_t *hp = json_object();
  for (size_t i = 0; i < sizeof hp_fields / sizeof *hp_fields; i++) {
    const num_field_t *f = &hp_fields[i];
    double v = num_get(s, f);
    json_object_set_new(hp, f->name, f->kind == NUM_F64 ? json_real(v) : json_integer((json_int_t)v));
  }
  json_object_set_new(hp, "lr_schedule", json_string(lt_lr_schedule_name(s->hp.lr_schedule)));
  json_t *mods = json_array();
  for (int i = 0; i < 7; i++)
    if (s->hp.target_modules & (1u << i)) json_array_append_new(mods, json_string(target_names[i]));
  json_object_set_new(hp, "target_modules", mods);
  if (s->hp.precision != LT_PRECISION_AUTO) /* absent: auto, and the JSON of every job before it */
    json_object_set_new(hp, "precision", json_string(lt_precision_name(s->hp.precision)));
  json_t *o = json_object();
  json_object_set_new(o, "base_model", json_string(s->base_model));
  json_object_set_new(o, "dataset_id", json_string(s->dataset_id));
  json_object_set_new(o, "validation_dataset_id",
                      s->validation_dataset_id[0] ? json_string(s->validation_dataset_id) : json_null());
  json_object_set_new(o, "priority", json_string(lt_job_class_name(s->priority)));
  json_object_set_new(o, "mode", json_string(s->mode == LT_MODE_MANAGED ? "managed" : "interactive"));
  json_object_set_new(o, "max_duration_s", json_integer(s->max_duration_s));
  json_object_set_new(o, "gpus", json_integer(s->gpus));
  json_object_set_new(o, "hyperparameters", hp);
  if (s->suffix[0]) json_object_set_new(o, "suffix", json_string(s->suffix));
  if (s->nmeta) {
    json_t *m = json_object();
    for (int i = 0; i < s->nmeta; i++) json_object_set_new(m, s->meta[i].key, json_string(s->meta[i].value));
    json_object_set_new(o, "metadata", m);
  }
  return o;
}
