/* lt_api_openai: OpenAI's fine-tuning API beside Lathe's own — /v1/files and
 * /v1/fine_tuning/jobs[/{id}[/cancel|/events|/checkpoints]] — so that clients written for it
 * (the `openai` packages) run unmodified.
 *
 * Nothing here is a second implementation: a file is a dataset (the same validator, encryption and
 * store, lt_api_datasets.c), a fine-tuning job is a job (the same spec, JobSubmitted record,
 * scheduler and state, lt_api_jobs.c), its events are the job's event history (lt_api_events.c).
 * This file translates OpenAI's request bodies into Lathe's and Lathe's answers into OpenAI's
 * objects; the router marks these routes (lt_api_call_t.openai) so that the shared handlers answer
 * in these shapes. Errors carry OpenAI's {type, param} beside Lathe's {code, field}
 * (lt_api_reply.c). */
#include "lt_api_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_jobspec.h"
#include "lt_utf8.h"

#include <openssl/crypto.h>

/* Lathe's default learning rate, the one OpenAI's learning_rate_multiplier multiplies, and the
 * largest learning rate a spec takes (lt_jobspec.c). */
#define BASE_LR 0.0002
#define MAX_LR 1.0

static json_t *ms_to_s(int64_t ms) { return ms > 0 ? json_integer(ms / 1000) : json_null(); }

/* ---------------------------------------------------------------- files */

json_t *lt_api_openai_file_json(const json_t *meta) {
  json_t *created = json_object_get(meta, "created_at");
  return json_pack("{s:O,s:s,s:O,s:I,s:O,s:s,s:s,s:n}", "id", json_object_get(meta, "id"), "object", "file",
                   "bytes", json_object_get(meta, "bytes"), "created_at",
                   (json_int_t)(json_integer_value(created) / 1000), "filename", json_object_get(meta, "name"),
                   "purpose", "fine-tune", "status", "processed", "status_details");
}

bool lt_api_header_param(const char *h, const char *name, char *out, size_t n) {
  size_t nl = strlen(name);
  for (const char *p = strchr(h, ';'); p; p = strchr(p + 1, ';')) {
    const char *s = p + 1;
    while (*s == ' ' || *s == '\t') s++;
    if (strncasecmp(s, name, nl) != 0 || s[nl] != '=') continue;
    s += nl + 1;
    size_t len = *s == '"' ? strcspn(s + 1, "\"") : strcspn(s, "; \t");
    if (*s == '"') s++;
    if (len == 0 || len >= n) return false;
    memcpy(out, s, len);
    out[len] = '\0';
    return true;
  }
  return false;
}

static const char *find_bytes(const char *hay, size_t hn, const char *needle, size_t nn) {
  return nn <= hn ? memmem(hay, hn, needle, nn) : NULL;
}

bool lt_api_form_parse(const char *body, size_t len, const char *boundary, lt_api_form_part_t *parts, int max,
                       int *count) {
  char delim[96];
  int dl = snprintf(delim, sizeof delim, "--%s", boundary);
  if (dl <= 2 || (size_t)dl >= sizeof delim) return false;
  const char *p = find_bytes(body, len, delim, (size_t)dl), *end = body + len;
  *count = 0;
  while (p) {
    p += dl;
    if (end - p >= 2 && p[0] == '-' && p[1] == '-') return true; /* the closing delimiter */
    if (end - p < 2 || p[0] != '\r' || p[1] != '\n' || *count == max) return false;
    p += 2;
    const char *hend = find_bytes(p, (size_t)(end - p), "\r\n\r\n", 4);
    if (!hend) return false;
    lt_api_form_part_t *f = &parts[(*count)++];
    memset(f, 0, sizeof *f);
    for (const char *line = p; line < hend;) {
      const char *eol = find_bytes(line, (size_t)(hend - line), "\r\n", 2);
      if (!eol) eol = hend;
      char h[512];
      snprintf(h, sizeof h, "%.*s", (int)(eol - line), line);
      if (strncasecmp(h, "Content-Disposition:", 20) == 0) {
        lt_api_header_param(h, "name", f->name, sizeof f->name);
        lt_api_header_param(h, "filename", f->filename, sizeof f->filename);
      }
      line = eol + 2;
    }
    f->data = hend + 4;
    char next[100];
    int nl = snprintf(next, sizeof next, "\r\n%s", delim);
    const char *stop = find_bytes(f->data, (size_t)(end - f->data), next, (size_t)nl);
    if (!stop) return false;
    f->len = (size_t)(stop - f->data);
    p = stop + 2;
  }
  return false;
}

static void files_take(lt_api_call_t *c, const char *body, size_t len, const char *boundary);

/* POST /v1/files (multipart/form-data: purpose=fine-tune, file=the JSONL): the file becomes a
 * dataset, validated and stored like POST /v1/datasets; 200 with OpenAI's file object. */
void lt_api_openai_files_create(lt_api_call_t *c) {
  const char *ct = evhttp_find_header(evhttp_request_get_input_headers(c->req), "Content-Type");
  char boundary[80];
  if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0 ||
      !lt_api_header_param(ct, "boundary", boundary, sizeof boundary)) {
    lt_api_reply_error(c->req, 400, "invalid", "file",
                       "send the file as multipart/form-data with the fields purpose and file");
    return;
  }
  struct evbuffer *in = evhttp_request_get_input_buffer(c->req);
  size_t len = evbuffer_get_length(in);
  char *body = (char *)evbuffer_pullup(in, -1);
  files_take(c, body, len, boundary);
  if (body) OPENSSL_cleanse(body, len); /* the file's plaintext, copied into the upload or refused */
}

static void files_take(lt_api_call_t *c, const char *body, size_t len, const char *boundary) {
  lt_api_form_part_t parts[8];
  int n = 0;
  if (!body || !lt_api_form_parse(body, len, boundary, parts, 8, &n)) {
    lt_api_reply_error(c->req, 400, "invalid", "file", "the multipart/form-data body is malformed");
    return;
  }
  const lt_api_form_part_t *file = NULL, *purpose = NULL;
  for (int i = 0; i < n; i++) {
    if (strcmp(parts[i].name, "file") == 0) file = &parts[i];
    else if (strcmp(parts[i].name, "purpose") == 0) purpose = &parts[i];
    else {
      lt_api_reply_error(c->req, 400, "invalid", parts[i].name, "%s: is not a known field (purpose and file are)",
                         parts[i].name[0] ? parts[i].name : "(unnamed part)");
      return;
    }
  }
  if (!purpose || purpose->len != 9 || memcmp(purpose->data, "fine-tune", 9) != 0) {
    lt_api_reply_error(c->req, 400, "invalid", "purpose", "purpose must be \"fine-tune\" (the only files Lathe keeps)");
    return;
  }
  if (!file) {
    lt_api_reply_error(c->req, 400, "invalid", "file", "file is required: the JSONL dataset");
    return;
  }
  size_t fl = strlen(file->filename);
  if (fl > 100 || !lt_utf8_valid(file->filename, fl, NULL)) { /* a header line is read up to 511 bytes */
    lt_api_reply_error(c->req, 400, "invalid", "file",
                       "the file's filename (%s%zu bytes) names the dataset: at most 100 bytes of UTF-8",
                       fl > 300 ? "over " : "", fl > 300 ? (size_t)300 : fl);
    return;
  }
  struct evbuffer *data = evbuffer_new();
  if (!data || evbuffer_add(data, file->data, file->len)) {
    if (data) evbuffer_free(data);
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  lt_api_datasets_upload_body(c, file->filename[0] ? file->filename : NULL, data);
}

/* ---------------------------------------------------------------- jobs: the view */

static const char *status_of(const lt_job_t *j) {
  switch (j->state) {
  case LT_JOB_SUBMITTED: return "validating_files";
  case LT_JOB_QUEUED:
  case LT_JOB_DISPATCHED: return "queued";
  case LT_JOB_RUNNING:
  case LT_JOB_PREEMPTING: return "running";
  case LT_JOB_COMPLETED: return "succeeded";
  case LT_JOB_CANCELLED: return "cancelled";
  default: return "failed";
  }
}

/* OpenAI's hyperparameters from the spec's. */
static json_t *hyperparameters(const json_t *hp) {
  double lr = json_number_value(json_object_get(hp, "learning_rate"));
  return json_pack("{s:O,s:O,s:f}", "n_epochs", json_object_get(hp, "epochs"), "batch_size",
                   json_object_get(hp, "batch_size"), "learning_rate_multiplier", lr > 0 ? lr / BASE_LR : 1.0);
}

/* The name the sampler serves the job's adapter under, once it is published. */
static json_t *model_name(lt_api_t *api, const lt_job_t *j) {
  if (j->state != LT_JOB_COMPLETED) return json_null();
  json_t *info = lt_proj_job_info(api->proj, j->job_id);
  if (!json_array_size(json_object_get(info, "artifacts"))) return json_null();
  char id[256];
  snprintf(id, sizeof id, "ft:%s:%s", j->base_model, j->job_id);
  return json_string(id);
}

json_t *lt_api_openai_job_json(lt_api_t *api, const lt_job_t *j) {
  /* OpenAI's clients poll until "succeeded" and then sample fine_tuned_model: a completed job
   * whose adapter is not published yet is still "running". */
  json_t *model = model_name(api, j);
  const char *status = j->state == LT_JOB_COMPLETED && json_is_null(model) ? "running" : status_of(j);
  bool finished = lt_job_state_is_terminal(j->state) && strcmp(status, "running") != 0;
  json_t *info = lt_proj_job_info(api->proj, j->job_id);
  json_t *spec = json_object_get(info, "spec"), *hp = json_object_get(spec, "hyperparameters");
  json_t *vfile = json_object_get(spec, "validation_dataset_id"), *suffix = json_object_get(spec, "suffix");
  json_t *meta = json_object_get(spec, "metadata"), *seed = json_object_get(hp, "seed");
  json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:o,s:o,s:s,s:s,s:s,s:O,s:[],s:o,s:n,s:[]}", "object", "fine_tuning.job",
                        "id", j->job_id, "model", j->base_model, "created_at", (json_int_t)(j->submitted_at_ms / 1000),
                        "finished_at", finished ? ms_to_s(j->ended_at_ms) : json_null(), "fine_tuned_model", model,
                        "organization_id", j->tenant_id, "status", status, "training_file", j->dataset_id,
                        "validation_file", json_is_string(vfile) ? vfile : json_null(), "result_files", "seed",
                        seed ? json_incref(seed) : json_integer(0), "estimated_finish", "integrations");
  json_t *h = hp ? hyperparameters(hp) : json_object();
  json_object_set_new(o, "hyperparameters", json_deep_copy(h));
  json_object_set_new(o, "method",
                      json_pack("{s:s,s:{s:o}}", "type", "supervised", "supervised", "hyperparameters", h));
  json_object_set_new(o, "user_provided_suffix", json_is_string(suffix) ? json_incref(suffix) : json_null());
  json_object_set_new(o, "metadata", json_object_size(meta) ? json_incref(meta) : json_null());
  /* StepCompleted counts a step's tokens, not the run's: no total is kept, so none is claimed. */
  json_object_set_new(o, "trained_tokens", json_null());
  if (j->state == LT_JOB_FAILED || j->state == LT_JOB_REJECTED) {
    char reason[sizeof j->reason + 256];
    lt_api_scrub(api, j->reason, reason, sizeof reason);
    json_object_set_new(o, "error", json_pack("{s:s,s:s,s:n}", "code", j->state == LT_JOB_REJECTED ? "invalid_request"
                                                                                                   : "job_failed",
                                              "message", reason, "param"));
  } else {
    json_object_set_new(o, "error", json_null());
  }
  return o;
}

/* ---------------------------------------------------------------- jobs: create */

/* Sets field and msg (as lt_errf does) and answers false: the body is refused. */
static bool refuse(char *field, size_t fn, const char *f, char *msg, size_t mn, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static bool refuse(char *field, size_t fn, const char *f, char *msg, size_t mn, const char *fmt, ...) {
  snprintf(field, fn, "%s", f ? f : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, mn, fmt, ap);
  va_end(ap);
  return false;
}

/* A number or "auto" (Lathe's default) for one of OpenAI's hyperparameters, into native hp. A
 * scaled one (the multiplier) is checked as it was sent: the spec's check would name the product. */
static bool map_hp(json_t *src, const char *from, json_t *dst, const char *to, double scale, char *field, size_t fn,
                   char *msg, size_t mn) {
  json_t *v = json_object_get(src, from);
  char f[64];
  snprintf(f, sizeof f, "hyperparameters.%s", from);
  if (!v || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)) return true;
  if (!json_is_number(v)) return refuse(field, fn, f, msg, mn, "%s: must be a number or \"auto\"", f);
  double d = json_number_value(v) * scale;
  if (scale != 1.0 && !(d > 0 && d <= MAX_LR))
    return refuse(field, fn, f, msg, mn, "%s: %g is outside (0, %g]: it multiplies the base learning rate %g", f,
                  json_number_value(v), MAX_LR / scale, scale);
  json_object_set_new(dst, to, scale != 1.0 ? json_real(d) : json_incref(v));
  return true;
}

/* The native field a spec error names, in OpenAI's words. */
static const char *openai_field(const char *f) {
  static const char *const map[][2] = {
      {"base_model", "model"}, {"dataset_id", "training_file"}, {"validation_dataset_id", "validation_file"},
      {"hyperparameters.epochs", "hyperparameters.n_epochs"},
      {"hyperparameters.learning_rate", "hyperparameters.learning_rate_multiplier"}, {"hyperparameters.seed", "seed"}};
  for (size_t i = 0; i < sizeof map / sizeof *map; i++)
    if (strcmp(f, map[i][0]) == 0) return map[i][1];
  return f;
}

/* OpenAI's create body as a native submission; NULL with field and msg when it is refused. */
static json_t *native_body(json_t *b, char *field, size_t fn, char *msg, size_t mn) {
  static const char *const known[] = {"model", "training_file", "validation_file", "hyperparameters", "suffix",
                                      "seed", "metadata", "method", "integrations"};
  const char *key;
  json_t *v;
  json_object_foreach(b, key, v) {
    bool ok = false;
    for (size_t i = 0; i < sizeof known / sizeof *known && !ok; i++) ok = strcmp(key, known[i]) == 0;
    if (!ok) {
      refuse(field, fn, key, msg, mn, "%.60s: is not a known field", key);
      return NULL;
    }
  }
  json_t *integ = json_object_get(b, "integrations");
  if (json_array_size(integ) || (integ && !json_is_array(integ) && !json_is_null(integ))) {
    refuse(field, fn, "integrations", msg, mn, "integrations are not supported here");
    return NULL;
  }
  json_t *src = json_object_get(b, "hyperparameters"), *method = json_object_get(b, "method");
  if (method) {
    const char *type = json_string_value(json_object_get(method, "type"));
    if (!type || strcmp(type, "supervised") != 0) {
      refuse(field, fn, "method.type", msg, mn, "method.type must be \"supervised\"");
      return NULL;
    }
    json_t *m = json_object_get(json_object_get(method, "supervised"), "hyperparameters");
    if (m) src = m;
  }
  if (src && !json_is_object(src)) {
    refuse(field, fn, "hyperparameters", msg, mn, "hyperparameters must be an object");
    return NULL;
  }
  json_object_foreach(src, key, v) {
    if (strcmp(key, "n_epochs") && strcmp(key, "batch_size") && strcmp(key, "learning_rate_multiplier")) {
      refuse(field, fn, "hyperparameters", msg, mn,
             "hyperparameters.%.40s: is not known (n_epochs, batch_size, learning_rate_multiplier are)", key);
      return NULL;
    }
  }
  json_t *hp = json_object(), *n = json_object();
  if (!map_hp(src, "n_epochs", hp, "epochs", 1.0, field, fn, msg, mn) ||
      !map_hp(src, "batch_size", hp, "batch_size", 1.0, field, fn, msg, mn) ||
      !map_hp(src, "learning_rate_multiplier", hp, "learning_rate", BASE_LR, field, fn, msg, mn)) {
    json_decref(hp);
    json_decref(n);
    return NULL;
  }
  if (json_object_get(b, "seed") && !json_is_null(json_object_get(b, "seed")))
    json_object_set(hp, "seed", json_object_get(b, "seed"));
  json_object_set_new(n, "hyperparameters", hp);
  static const char *const copy[][2] = {{"model", "base_model"}, {"training_file", "dataset_id"},
                                        {"validation_file", "validation_dataset_id"}, {"suffix", "suffix"},
                                        {"metadata", "metadata"}};
  for (size_t i = 0; i < sizeof copy / sizeof *copy; i++)
    if ((v = json_object_get(b, copy[i][0]))) json_object_set(n, copy[i][1], v);
  return n;
}

bool lt_api_openai_job_spec(const char *text, size_t len, lt_jobspec_t *spec, char *field, size_t fn, char *msg,
                            size_t mn) {
  json_error_t je;
  json_t *b = json_loadb(text, len, 0, &je);
  if (!json_is_object(b)) {
    refuse(field, fn, NULL, msg, mn, "the body must be a JSON object (%s)", b ? "not an object" : je.text);
    json_decref(b);
    return false;
  }
  json_t *n = native_body(b, field, fn, msg, mn);
  json_decref(b);
  if (!n) return false;
  char nf[96], nm[256];
  lt_err_t err = lt_jobspec_from_json(n, spec, nf, sizeof nf, nm, sizeof nm);
  json_decref(n);
  if (err) {
    const char *of = openai_field(nf);
    /* the message starts with the native path: say it in OpenAI's words */
    const char *rest = strncmp(nm, nf, strlen(nf)) == 0 ? nm + strlen(nf) : nm;
    return refuse(field, fn, of, msg, mn, "%s%s", rest != nm ? of : "", rest);
  }
  return true;
}

/* POST /v1/fine_tuning/jobs: OpenAI's body mapped onto a job spec, then the one submission path
 * (lt_api_jobs_submit_spec): the same checks, record and answer-when-durable; OpenAI's job object. */
void lt_api_openai_jobs_create(lt_api_call_t *c) {
  size_t len;
  char *text = lt_api_body_text(c->api, c->req, &len);
  if (!text) return;
  lt_jobspec_t spec;
  char field[LT_API_FIELD_MAX], msg[512];
  bool ok = lt_api_openai_job_spec(text, len, &spec, field, sizeof field, msg, sizeof msg);
  free(text);
  if (!ok) {
    lt_api_reply_error(c->req, 400, "invalid", field[0] ? field : NULL, "%s", msg);
    return;
  }
  if (lt_api_model_unserved(c->api, c->req, spec.base_model, "model")) return;
  lt_api_jobs_submit_spec(c, &spec); /* training_file and validation_file looked up there, off the loop */
}

/* ---------------------------------------------------------------- jobs: read */

void lt_api_openai_jobs_list(lt_api_call_t *c) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  if (!lt_api_query(&q, "limit")) evhttp_add_header(&q, "limit", "20"); /* OpenAI's default page */
  json_t *data;
  bool more;
  if (lt_api_jobs_page(c, &q, false, lt_api_openai_job_json, &data, &more) == LT_OK)
    lt_api_reply_json(c->req, 200, json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", more));
  evhttp_clear_headers(&q);
}

void lt_api_openai_jobs_show(lt_api_call_t *c) {
  lt_api_reply_json(c->req, 200, lt_api_openai_job_json(c->api, c->job));
}

static const char *reason_of(const json_t *d) {
  const char *r = json_string_value(json_object_get(d, "reason"));
  return r ? r : "";
}

/* One of the job's records as OpenAI's event: a sentence, a level, and for steps and evaluations
 * the numbers (type "metrics"). */
static json_t *event_json(const json_t *e) {
  const char *type = json_string_value(json_object_get(e, "event"));
  json_t *d = json_object_get(e, "data");
  char msg[512];
  const char *level = "info", *kind = "message";
  json_t *data = json_object();
  json_int_t step = json_integer_value(json_object_get(d, "step"));
  if (strcmp(type, "JobSubmitted") == 0) snprintf(msg, sizeof msg, "Created fine-tuning job");
  else if (strcmp(type, "JobAccepted") == 0) snprintf(msg, sizeof msg, "Files validated; the job is queued");
  else if (strcmp(type, "JobDispatched") == 0) snprintf(msg, sizeof msg, "Fine-tuning job placed on a worker");
  else if (strcmp(type, "AttemptStarted") == 0)
    snprintf(msg, sizeof msg, "Fine-tuning started (attempt %lld)",
             (long long)json_integer_value(json_object_get(d, "attempt")));
  else if (strcmp(type, "StepCompleted") == 0) {
    double loss = json_number_value(json_object_get(d, "loss"));
    snprintf(msg, sizeof msg, "Step %lld/%lld: training loss=%.4f", (long long)step,
             (long long)json_integer_value(json_object_get(d, "total_steps")), loss);
    kind = "metrics";
    json_object_set_new(data, "step", json_integer(step));
    json_object_set_new(data, "train_loss", json_real(loss));
    json_object_set(data, "total_steps", json_object_get(d, "total_steps"));
    json_object_set(data, "learning_rate", json_object_get(d, "learning_rate"));
  } else if (strcmp(type, "EvalCompleted") == 0) {
    snprintf(msg, sizeof msg, "Evaluation at step %lld", (long long)step);
    kind = "metrics";
    json_object_set_new(data, "step", json_integer(step));
    json_object_set(data, "metrics", json_object_get(d, "metrics"));
  } else if (strcmp(type, "CheckpointCommitted") == 0)
    snprintf(msg, sizeof msg, "Checkpoint saved at step %lld", (long long)step);
  else if (strcmp(type, "ArtifactPublished") == 0) snprintf(msg, sizeof msg, "New fine-tuned model created");
  else if (strcmp(type, "JobCompleted") == 0) snprintf(msg, sizeof msg, "The job has successfully completed");
  else if (strcmp(type, "JobCancelled") == 0) snprintf(msg, sizeof msg, "The job was cancelled");
  else if (strcmp(type, "JobFailed") == 0 || strcmp(type, "JobRejected") == 0) {
    level = "error";
    snprintf(msg, sizeof msg, "The job failed: %s", reason_of(d));
  } else if (strcmp(type, "AttemptStopped") == 0 || strcmp(type, "PreemptRequested") == 0) {
    level = "warn";
    snprintf(msg, sizeof msg, "%s (%s)",
             strcmp(type, "AttemptStopped") == 0 ? "Attempt stopped" : "Preemption requested",
             reason_of(d));
  } else {
    snprintf(msg, sizeof msg, "%s", type);
  }
  return json_pack("{s:s,s:O,s:I,s:s,s:s,s:o,s:s}", "object", "fine_tuning.job.event", "id", json_object_get(e, "id"),
                   "created_at", (json_int_t)(json_integer_value(json_object_get(d, "occurred_at")) / 1000), "level",
                   level, "message", msg, "data", data, "type", kind);
}

/* A list query's limit (1..100, default 20) and after; false after replying 400. */
static bool list_query(lt_api_call_t *c, struct evkeyvalq *q, long *limit, const char **after) {
  const char *v = lt_api_query(q, "limit");
  *limit = 20;
  *after = lt_api_query(q, "after");
  if (v) {
    char *end;
    *limit = strtol(v, &end, 10);
    if (*end || end == v || *limit < 1 || *limit > 100) {
      lt_api_reply_error(c->req, 400, "invalid", "limit", "limit must be a whole number from 1 to 100 (default 20)");
      return false;
    }
  }
  return true;
}

static const char *id_of(const json_t *item) {
  const char *id = json_string_value(json_object_get(item, "id"));
  return id ? id : "";
}

/* A newest-first page of items (an array, newest last) after the id `after`: 400 naming after
 * when no item has that id (an event no longer kept, or another job's). Takes items. */
static void reply_page(lt_api_call_t *c, json_t *items, long limit, const char *after, bool ids) {
  size_t n = json_array_size(items);
  bool known = !after;
  for (size_t k = 0; k < n && !known; k++)
    known = strcmp(id_of(json_array_get(items, k)), after) == 0;
  if (!known) {
    json_decref(items);
    lt_api_reply_error(c->req, 400, "invalid", "after",
                       "after: %.80s is not an id of this list (or is no longer kept): start from the first page",
                       after);
    return;
  }
  json_t *data = json_array();
  bool started = !after, more = false;
  for (size_t k = n; k-- > 0;) {
    json_t *it = json_array_get(items, k);
    const char *id = json_string_value(json_object_get(it, "id"));
    if (!started) {
      started = id && strcmp(id, after) == 0;
      continue;
    }
    if (json_array_size(data) == (size_t)limit) {
      more = true;
      break;
    }
    json_array_append(data, it);
  }
  json_decref(items);
  size_t m = json_array_size(data);
  json_t *o = json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", more);
  if (ids) {
    json_object_set(o, "first_id", m ? json_object_get(json_array_get(data, 0), "id") : json_null());
    json_object_set(o, "last_id", m ? json_object_get(json_array_get(data, m - 1), "id") : json_null());
  }
  lt_api_reply_json(c->req, 200, o);
}

/* GET /v1/fine_tuning/jobs/{id}/events?after=&limit=: the job's events newest first (the API keeps
 * a job's newest conf.sse_history records, and a finished job's for conf.sse_keep_ended_ms). */
void lt_api_openai_jobs_events(lt_api_call_t *c) {
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  long limit;
  const char *after;
  if (list_query(c, &q, &limit, &after)) {
    json_t *hist = lt_api_events_history(c->api, c->job->job_id), *items = json_array(), *e;
    size_t i;
    json_array_foreach(hist, i, e) json_array_append_new(items, event_json(e));
    reply_page(c, items, limit, after, false);
  }
  evhttp_clear_headers(&q);
}

/* The training loss the job reported at step, from its event history; NULL when not kept. */
static json_t *train_loss_at(lt_api_t *api, const char *job_id, int64_t step) {
  json_t *hist = lt_api_events_history(api, job_id), *e;
  size_t i;
  json_array_foreach(hist, i, e) {
    json_t *d = json_object_get(e, "data");
    if (strcmp(json_string_value(json_object_get(e, "event")), "StepCompleted") == 0 &&
        json_integer_value(json_object_get(d, "step")) == step)
      return json_object_get(d, "loss");
  }
  return NULL;
}

/* GET /v1/fine_tuning/jobs/{id}/checkpoints: the committed checkpoints newest first, with the
 * training loss of their step and the evaluation's metrics (valid_loss, ...) when one ran there. */
void lt_api_openai_jobs_checkpoints(lt_api_call_t *c) {
  const lt_job_t *j = c->job;
  struct evkeyvalq q;
  lt_api_parse_query(c->req, &q);
  long limit;
  const char *after;
  if (!list_query(c, &q, &limit, &after)) {
    evhttp_clear_headers(&q);
    return;
  }
  size_t n;
  const lt_proj_ckpt_t *ck = lt_proj_job_checkpoints(c->api->proj, j->job_id, &n);
  json_t *info = lt_proj_job_info(c->api->proj, j->job_id);
  json_t *evals = json_object_get(info, "evals"), *items = json_array(), *e;
  json_t *final_name = model_name(c->api, j);
  for (size_t i = 0; i < n; i++) {
    json_t *metrics = json_object(), *loss = train_loss_at(c->api, j->job_id, ck[i].step);
    if (loss) json_object_set(metrics, "train_loss", loss);
    size_t k;
    json_array_foreach(evals, k, e) {
      if (json_integer_value(json_object_get(e, "step")) == ck[i].step &&
          json_integer_value(json_object_get(e, "attempt")) == ck[i].attempt)
        json_object_update(metrics, json_object_get(e, "metrics"));
    }
    if (json_object_get(metrics, "loss") && !json_object_get(metrics, "valid_loss"))
      json_object_set(metrics, "valid_loss", json_object_get(metrics, "loss"));
    char id[128], name[320];
    snprintf(id, sizeof id, "ftckpt-%s-%d-%lld", j->job_id, ck[i].attempt, (long long)ck[i].step);
    snprintf(name, sizeof name, "ft:%s:%s:ckpt-step-%lld", j->base_model, j->job_id, (long long)ck[i].step);
    bool served = ck[i].final && json_is_string(final_name);
    json_array_append_new(items, json_pack("{s:s,s:s,s:I,s:s,s:I,s:o,s:s}", "object", "fine_tuning.job.checkpoint",
                                           "id", id, "created_at", (json_int_t)(ck[i].committed_at_ms / 1000),
                                           "fine_tuned_model_checkpoint", served ? json_string_value(final_name) : name,
                                           "step_number", (json_int_t)ck[i].step, "metrics", metrics,
                                           "fine_tuning_job_id", j->job_id));
  }
  json_decref(final_name);
  reply_page(c, items, limit, after, true);
  evhttp_clear_headers(&q);
}
