/* lathe jobs: customers' fine-tuning jobs over the API (lt_client).
 *
 *   lathe jobs submit --model M --dataset D [--validation D2] [--priority P]
 *                     [--set key=value ...] [--idempotency-key K]
 *   lathe jobs list [--state S] [--limit N] [--cursor C]
 *   lathe jobs show ID
 *   lathe jobs cancel ID
 *   lathe jobs delete ID     (a finished job: its artifacts are crypto-shredded)
 *   lathe jobs watch ID
 *   lathe jobs checkpoints ID
 *   lathe jobs download ID DIR
 *   common: [--url URL] [--api-key KEY] [--ca-file PEM] [--json] [--quiet]
 *
 * watch follows GET /v1/jobs/{id}/events (SSE) with a live progress line (step/total, loss,
 * tokens/s, ETA), reconnects with Last-Event-ID when the connection drops, and exits with the
 * outcome: 0 for completed, 1 for failed, cancelled or rejected. --json prints each event as a
 * JSON line {"id","event","data"} instead.
 *
 * download writes each published artifact to DIR/.NAME.part, checks its size and sha256 against
 * the listing (GET /v1/jobs/{id}/artifacts), and only then renames it to DIR/NAME: a file under
 * its own name is always the whole, verified artifact. A mismatch names the file and removes the
 * partial one; any failure exits 1. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <event2/http.h>

#include "lt_cli_api.h"
#include "lt_crypto.h"
#include "lt_utf8.h"

static void usage(FILE *f) {
  fprintf(f, "usage: lathe jobs submit --model M --dataset D [--validation D2] [--priority P]\n"
             "                        [--set key=value ...] [--idempotency-key K]\n"
             "       lathe jobs list [--state S] [--limit N] [--cursor C]\n"
             "       lathe jobs show ID\n"
             "       lathe jobs cancel ID\n"
             "       lathe jobs delete ID      a finished job, its artifacts and checkpoints (for good)\n"
             "       lathe jobs watch ID\n"
             "       lathe jobs checkpoints ID   the checkpoints it committed: step, metrics, time\n"
             "       lathe jobs download ID DIR  its published artifacts into DIR, each sha256 checked\n"
             "options for every command: --url URL (LATHE_API_URL, default http://127.0.0.1:8080; https://\n"
             "  verifies the server against --ca-file PEM, LATHE_API_CA_FILE or the system's CAs),\n"
             "  --api-key KEY (LATHE_API_KEY), --json (print the server's JSON), --quiet\n"
             "\n--set takes hyperparameters (lora_rank=8, learning_rate=1e-4, epochs=2,\n"
             "target_modules=q_proj,v_proj, ...) and the job fields max_duration_s, gpus, mode.\n"
             "P is production, standard (default) or preemptible.\n"
             "watch exits 0 when the job completed, 1 when it failed or was cancelled.\n");
}

/* ---------------------------------------------------------------- submit */

static bool is_top_field(const char *k) {
  static const char *const top[] = {"max_duration_s", "gpus", "mode", "priority", "base_model", "dataset_id",
                                    "validation_dataset_id"};
  for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
    if (strcmp(k, top[i]) == 0) return true;
  return false;
}

/* key=value: the value as JSON when it parses as a number, boolean or array; target_modules
 * takes a comma list; anything else is a string. */
static int apply_set(json_t *body, const char *kv) {
  const char *eq = strchr(kv, '=');
  if (!eq || eq == kv) {
    fprintf(stderr, "lathe jobs submit: --set wants key=value, not \"%s\"\n", kv);
    return 2;
  }
  char key[128];
  snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
  const char *v = eq + 1, *k = key;
  if (strncmp(k, "hyperparameters.", 16) == 0) k += 16;
  json_t *val;
  if (strcmp(k, "target_modules") == 0 && v[0] != '[') {
    val = json_array();
    char *dup = strdup(v), *save = NULL;
    bool utf8 = true; /* jansson makes no string of bytes that are not UTF-8: refused below */
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save))
      utf8 = json_array_append_new(val, json_string(t)) == 0 && utf8;
    if (!utf8) json_decref(val), val = NULL;
    free(dup);
  } else {
    val = json_loads(v, JSON_DECODE_ANY, NULL);
    if (!val || json_is_object(val) || json_is_null(val)) {
      json_decref(val);
      val = json_string(v);
    }
  }
  json_t *into = body;
  if (k != key || !is_top_field(k)) {
    into = json_object_get(body, "hyperparameters");
    if (!into) json_object_set_new(body, "hyperparameters", into = json_object());
  }
  if (json_object_set_new(into, k, val) != 0) { /* jansson takes no key or string that is not UTF-8 */
    size_t n;
    char *shown = lt_utf8_sanitize(key, strlen(key), &n);
    fprintf(stderr, "lathe jobs submit: --set %.60s: the key and value must be UTF-8\n", shown ? shown : "");
    free(shown);
    return 2;
  }
  return 0;
}

static void print_job_line(json_t *j) {
  printf("job %s: %s", json_string_value(json_object_get(j, "id")), json_string_value(json_object_get(j, "state")));
  json_t *qp = json_object_get(j, "queue_position");
  if (qp) {
    char d[32];
    printf(", queue position %" JSON_INTEGER_FORMAT ", wait about %s", json_integer_value(qp),
           lt_cli_duration((double)json_integer_value(json_object_get(j, "wait_estimate_s")), d, sizeof d));
  }
  if (json_is_true(json_object_get(j, "cancel_requested")) && strcmp(json_string_value(json_object_get(j, "state")), "cancelled"))
    printf(", cancel requested");
  printf("\n");
}

enum { O_MODEL = 256, O_DATASET, O_VALIDATION, O_PRIORITY, O_IDEM, O_SET };

static int submit(int argc, char **argv) {
  static const struct option opts[] = {
      {"model", required_argument, NULL, O_MODEL},       {"dataset", required_argument, NULL, O_DATASET},
      {"validation", required_argument, NULL, O_VALIDATION}, {"priority", required_argument, NULL, O_PRIORITY},
      {"idempotency-key", required_argument, NULL, O_IDEM},  {"set", required_argument, NULL, O_SET},
      LT_CLI_API_OPTIONS,                                    {0}};
  static const char *const fields[] = {[O_MODEL - O_MODEL] = "base_model", [O_DATASET - O_MODEL] = "dataset_id",
                                       [O_VALIDATION - O_MODEL] = "validation_dataset_id",
                                       [O_PRIORITY - O_MODEL] = "priority"};
  lt_cli_opts_t ob = {0}, *o = &ob;
  lt_cli_args_t a = {.what = "jobs submit", .usage = usage, .opts = opts};
  json_t *body = json_object();
  const char *idem = NULL;
  int rc = -1, c; /* -1: going on */
  while (rc < 0 && (c = lt_cli_api_next(o, &a, argc, argv)) >= 0) {
    if (c == O_IDEM) idem = a.value;
    else if (c == O_SET) rc = apply_set(body, a.value) ? 2 : -1;
    else json_object_set_new(body, fields[c - O_MODEL], json_string(a.value));
  }
  if (rc < 0 && c == LT_CLI_ARGS_STOP) rc = a.status;
  if (rc < 0 && (!json_object_get(body, "base_model") || !json_object_get(body, "dataset_id")))
    rc = lt_cli_args_fail(&a, "--model and --dataset are required");
  lt_client_resp_t r;
  if (rc < 0 && !(rc = lt_cli_call(o, "jobs submit", "POST", "/v1/jobs", body, idem, &r))) {
    if (!o->json) {
      if (r.status == 200) printf("(the job this Idempotency-Key already submitted)\n");
      print_job_line(r.json);
    }
    lt_client_resp_free(&r);
  }
  json_decref(body);
  lt_cli_close(o);
  return rc;
}

/* ---------------------------------------------------------------- list, show */

static void progress_text(json_t *j, char *out, size_t n) {
  json_t *p = json_object_get(j, "progress");
  if (!p) {
    snprintf(out, n, "-");
    return;
  }
  json_int_t step = json_integer_value(json_object_get(p, "step"));
  json_int_t total = json_integer_value(json_object_get(p, "total_steps"));
  snprintf(out, n, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT " loss %.4g", step, total,
           json_number_value(json_object_get(p, "loss")));
}

static int list(int argc, char **argv) {
  char path[1024] = "/v1/jobs";
  static const char *const flags[] = {"state", "state", "limit", "limit", "cursor", "cursor", NULL};
  lt_cli_opts_t ob = {0}, *o = &ob;
  lt_cli_args_t a = {.what = "jobs list", .usage = usage};
  lt_client_resp_t r;
  int rc = lt_cli_api_list_open(o, &a, argc, argv, flags, path, sizeof path);
  if (rc < 0) rc = lt_cli_call(o, "jobs list", "GET", path, NULL, NULL, &r);
  else if (rc == 0) rc = -1; /* --help: said */
  if (rc) {
    lt_cli_close(o);
    return rc < 0 ? 0 : rc;
  }
  if (!o->json) {
    printf("%-28s %-11s %-12s %-20s %-28s %-19s %s\n", "ID", "STATE", "PRIORITY", "MODEL", "DATASET", "SUBMITTED (UTC)",
           "PROGRESS");
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(r.json, "jobs"), i, j) {
      char when[32], prog[64];
      lt_cli_time(json_integer_value(json_object_get(j, "submitted_at")), when, sizeof when);
      progress_text(j, prog, sizeof prog);
      printf("%-28s %-11s %-12s %-20.20s %-28.28s %-19s %s\n", json_string_value(json_object_get(j, "id")),
             json_string_value(json_object_get(j, "state")), json_string_value(json_object_get(j, "priority")),
             json_string_value(json_object_get(j, "base_model")), json_string_value(json_object_get(j, "dataset_id")),
             when, prog);
    }
    const char *next = json_string_value(json_object_get(r.json, "next_cursor"));
    if (next) printf("(more: lathe jobs list --cursor %s)\n", next);
  }
  lt_client_resp_free(&r);
  lt_cli_close(o);
  return 0;
}

static void show_job(json_t *j) {
  char t[32], prog[64];
  printf("id:          %s\n", json_string_value(json_object_get(j, "id")));
  printf("state:       %s%s\n", json_string_value(json_object_get(j, "state")),
         json_is_true(json_object_get(j, "cancel_requested")) ? " (cancel requested)" : "");
  printf("priority:    %s\n", json_string_value(json_object_get(j, "priority")));
  printf("base model:  %s\n", json_string_value(json_object_get(j, "base_model")));
  printf("dataset:     %s\n", json_string_value(json_object_get(j, "dataset_id")));
  printf("attempt:     %" JSON_INTEGER_FORMAT " (%" JSON_INTEGER_FORMAT " failed)\n",
         json_integer_value(json_object_get(j, "attempt")), json_integer_value(json_object_get(j, "failed_attempts")));
  printf("submitted:   %s UTC\n", lt_cli_time(json_integer_value(json_object_get(j, "submitted_at")), t, sizeof t));
  if (json_object_get(j, "started_at"))
    printf("started:     %s UTC\n", lt_cli_time(json_integer_value(json_object_get(j, "started_at")), t, sizeof t));
  if (json_object_get(j, "ended_at"))
    printf("ended:       %s UTC\n", lt_cli_time(json_integer_value(json_object_get(j, "ended_at")), t, sizeof t));
  if (json_object_get(j, "queue_position"))
    printf("queue:       position %" JSON_INTEGER_FORMAT ", wait about %s\n",
           json_integer_value(json_object_get(j, "queue_position")),
           lt_cli_duration((double)json_integer_value(json_object_get(j, "wait_estimate_s")), t, sizeof t));
  if (json_object_get(j, "reason")) printf("reason:      %s\n", json_string_value(json_object_get(j, "reason")));
  progress_text(j, prog, sizeof prog);
  printf("progress:    %s\n", prog);
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(j, "artifacts"), i, a)
    printf("artifact:    %s (%" JSON_INTEGER_FORMAT " bytes, sha256 %s)\n", json_string_value(json_object_get(a, "name")),
           json_integer_value(json_object_get(a, "bytes")), json_string_value(json_object_get(a, "sha256")));
  json_t *spec = json_object_get(j, "spec");
  if (spec) {
    char *s = json_dumps(json_object_get(spec, "hyperparameters") ? json_object_get(spec, "hyperparameters") : spec,
                         JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(6));
    if (s) printf("hyperparams: %s\n", s);
    free(s);
  }
}

/* ---------------------------------------------------------------- watch */

typedef struct {
  lt_cli_opts_t *o;
  bool tty;
  char last_id[256];
  char state[32];
  char outcome_event[48];
  char reason[256];
  bool drew; /* a progress line is on the terminal without its newline */
  int64_t last_step_logged;
} watch_t;

static bool terminal_state(const char *s) {
  return strcmp(s, "completed") == 0 || strcmp(s, "failed") == 0 || strcmp(s, "cancelled") == 0 ||
         strcmp(s, "rejected") == 0;
}

static void end_line(watch_t *w) {
  if (w->drew) fputc('\n', stderr);
  w->drew = false;
}

static bool on_event(void *ctx, const lt_client_event_t *ev) {
  watch_t *w = ctx;
  if (ev->id[0]) snprintf(w->last_id, sizeof w->last_id, "%s", ev->id);
  if (strcmp(ev->event, "end") == 0) return true;
  json_t *d = json_loads(ev->data, 0, NULL);
  const char *st = json_string_value(json_object_get(d, "state"));
  if (st) snprintf(w->state, sizeof w->state, "%s", st);
  const char *reason = json_string_value(json_object_get(d, "reason"));
  if (reason && *reason) snprintf(w->reason, sizeof w->reason, "%s", reason);
  if (w->o->json) {
    json_t *line = json_pack("{s:s,s:s,s:O}", "id", ev->id, "event", ev->event, "data", d ? d : json_null());
    char *s = json_dumps(line, JSON_COMPACT | JSON_REAL_PRECISION(15));
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(line);
  } else if (strcmp(ev->event, "StepCompleted") == 0) {
    int64_t step = json_integer_value(json_object_get(d, "step"));
    int64_t total = json_integer_value(json_object_get(d, "total_steps"));
    double loss = json_number_value(json_object_get(d, "loss"));
    double tps = json_number_value(json_object_get(d, "tokens_per_s"));
    double eta = (double)json_integer_value(json_object_get(d, "eta_ms")) / 1000.0;
    int pct = total > 0 ? (int)(step * 100 / total) : 0;
    char e[32];
    lt_cli_duration(eta, e, sizeof e);
    if (w->tty) {
      char bar[26];
      for (int i = 0; i < 25; i++) bar[i] = i < pct / 4 ? '#' : ' ';
      bar[25] = '\0';
      fprintf(stderr, "\r[%s] step %" PRId64 "/%" PRId64 " (%3d%%)  loss %.4f  %.0f tok/s  ETA %s   ", bar, step, total,
              pct, loss, tps, e);
      fflush(stderr);
      w->drew = true;
    } else if (!w->o->quiet && (total <= 0 || step * 10 / total > w->last_step_logged * 10 / (total > 0 ? total : 1) ||
                                step == total || w->last_step_logged == 0)) {
      fprintf(stderr, "step %" PRId64 "/%" PRId64 " (%d%%) loss %.4f %.0f tok/s ETA %s\n", step, total, pct, loss, tps,
              e);
    }
    w->last_step_logged = step;
  } else if (!w->o->quiet) {
    end_line(w);
    const char *attempt = "";
    char at[32] = "";
    json_t *a = json_object_get(d, "attempt");
    if (json_is_integer(a)) snprintf(at, sizeof at, " (attempt %" JSON_INTEGER_FORMAT ")", json_integer_value(a)), attempt = at;
    if (strcmp(ev->event, "EvalCompleted") == 0) {
      /* EvalCompleted.metrics: [{name, value, base_value, ci_low, ci_high}] */
      fprintf(stderr, "eval at step %" JSON_INTEGER_FORMAT ":", json_integer_value(json_object_get(d, "step")));
      size_t i;
      json_t *m;
      json_array_foreach(json_object_get(d, "metrics"), i, m) {
        fprintf(stderr, " %s %.4f", json_string_value(json_object_get(m, "name")),
                json_number_value(json_object_get(m, "value")));
        if (json_is_number(json_object_get(m, "base_value")))
          fprintf(stderr, " (base %.4f)", json_number_value(json_object_get(m, "base_value")));
      }
      fprintf(stderr, "\n");
    } else
      fprintf(stderr, "%s%s -> %s%s%s\n", ev->event, attempt, st ? st : "?", reason && *reason ? ": " : "",
              reason && *reason ? reason : "");
  }
  if (strncmp(ev->event, "Job", 3) == 0 && st && terminal_state(st))
    snprintf(w->outcome_event, sizeof w->outcome_event, "%s", ev->event);
  json_decref(d);
  return false;
}

static int watch(lt_cli_opts_t *o, const char *id) {
  char path[512], err[512];
  if (!lt_cli_path_id(path, sizeof path, "/v1/jobs/", id, "/events")) return 2;
  watch_t w = {.o = o, .tty = isatty(2) && !o->quiet && !o->json};
  int failures = 0; /* in a row: a connection that brought an event resets the count */
  for (;;) {
    int status = 0;
    char before[sizeof w.last_id];
    snprintf(before, sizeof before, "%s", w.last_id);
    lt_err_t e = lt_client_events(o->client, path, w.last_id[0] ? w.last_id : NULL, on_event, &w, &status, err,
                                  sizeof err);
    if (e == LT_OK) break;
    end_line(&w);
    if (status && status != 200) {
      fprintf(stderr, "lathe jobs watch: %s\n", err);
      return 1;
    }
    /* The stream dropped (API restarted, network): resume after the last event seen. A long job
     * outlives many drops; only 30 in a row without an event between them is giving up. */
    if (strcmp(before, w.last_id) != 0) failures = 0;
    if (++failures > 30) {
      fprintf(stderr, "lathe jobs watch: giving up: %s\n", err);
      return 1;
    }
    if (!o->quiet) fprintf(stderr, "lathe jobs watch: %s; reconnecting%s%s\n", err, w.last_id[0] ? " after event " : "",
                           w.last_id);
    sleep(failures < 5 ? 1 : 2);
  }
  end_line(&w);
  /* The stream ended: the job is terminal. Its state from the API decides the exit status. */
  char jpath[512];
  lt_client_resp_t r;
  lt_cli_path_id(jpath, sizeof jpath, "/v1/jobs/", id, NULL);
  bool saved = o->json;
  o->json = false;
  int rc = lt_cli_call(o, "jobs watch", "GET", jpath, NULL, NULL, &r);
  o->json = saved;
  if (rc) return 1;
  const char *st = json_string_value(json_object_get(r.json, "state"));
  const char *reason = json_string_value(json_object_get(r.json, "reason"));
  bool ok = st && strcmp(st, "completed") == 0;
  if (!o->json)
    printf("job %s %s%s%s\n", id, st ? st : "?", reason && *reason ? ": " : "", reason && *reason ? reason : "");
  lt_client_resp_free(&r);
  return ok ? 0 : 1;
}

/* ---------------------------------------------------------------- main */

/* ---------------------------------------------------------------- checkpoints, download */

static void print_checkpoints(json_t *r) {
  printf("%-8s %-10s %-12s %-6s %-20s %s\n", "ATTEMPT", "STEP", "BYTES", "FINAL", "COMMITTED (UTC)", "METRICS");
  size_t i, k;
  json_t *c, *m;
  json_array_foreach(json_object_get(r, "checkpoints"), i, c) {
    char when[32];
    lt_cli_time(json_integer_value(json_object_get(c, "committed_at")), when, sizeof when);
    printf("%-8" JSON_INTEGER_FORMAT " %-10" JSON_INTEGER_FORMAT " %-12" JSON_INTEGER_FORMAT " %-6s %-20s",
           json_integer_value(json_object_get(c, "attempt")), json_integer_value(json_object_get(c, "step")),
           json_integer_value(json_object_get(c, "bytes")), json_is_true(json_object_get(c, "final")) ? "yes" : "no",
           when);
    json_array_foreach(json_object_get(c, "metrics"), k, m)
      printf(" %s %.4g", json_string_value(json_object_get(m, "name")), json_number_value(json_object_get(m, "value")));
    printf("%s\n", json_array_size(json_object_get(c, "metrics")) ? "" : " -");
  }
  if (!json_array_size(json_object_get(r, "checkpoints")))
    printf("(job %s, %s, has committed no checkpoint)\n", json_string_value(json_object_get(r, "job_id")),
           json_string_value(json_object_get(r, "state")));
}

/* A name the server listed, safe as a file name in DIR: no path, no dot file. */
static bool plain_name(const char *n) { return n && *n && *n != '.' && !strchr(n, '/') && strlen(n) < 200; }

/* Downloads one listed artifact into dir through a temporary name; 0, or 1 after saying which file
 * failed and why (the temporary file removed). */
static int download_one(lt_cli_opts_t *o, const char *id, const char *dir, json_t *art) {
  const char *name = json_string_value(json_object_get(art, "name"));
  const char *want = json_string_value(json_object_get(art, "sha256"));
  json_int_t bytes = json_integer_value(json_object_get(art, "bytes"));
  char path[1024], part[1024], dest[1024], err[512], hex[65], line[700];
  if (!plain_name(name) || !want) {
    fprintf(stderr, "lathe jobs download: the server listed an artifact named \"%s\": not a plain file name\n",
            name ? name : "");
    return 1;
  }
  char *enc = evhttp_uriencode(name, -1, 0);
  bool ok = enc && lt_cli_path_id(path, sizeof path, "/v1/jobs/", id, "/artifacts/");
  if (ok) strncat(path, enc, sizeof path - strlen(path) - 1);
  free(enc);
  snprintf(part, sizeof part, "%s/.%s.part", dir, name);
  snprintf(dest, sizeof dest, "%s/%s", dir, name);
  lt_client_resp_t r = {0};
  if (!ok || lt_client_request(o->client, "GET", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err)) {
    fprintf(stderr, "lathe jobs download: %s: %s\n", name, ok ? err : "bad id");
    return 1;
  }
  int rc = 1;
  uint8_t sha[LT_CRYPTO_SHA256_BYTES];
  lt_crypto_sha256(r.body, r.len, sha);
  lt_crypto_hex(sha, sizeof sha, hex);
  FILE *f = NULL;
  if (r.status != 200) {
    fprintf(stderr, "lathe jobs download: %s: %s\n", name, lt_client_error_text(&r, line, sizeof line));
  } else if (!(f = fopen(part, "wb")) || fwrite(r.body, 1, r.len, f) != r.len || fflush(f) || fsync(fileno(f))) {
    fprintf(stderr, "lathe jobs download: %s: cannot write %s: %s\n", name, part, strerror(errno));
  } else if ((json_int_t)r.len != bytes) {
    fprintf(stderr, "lathe jobs download: %s: %zu bytes arrived, the job published %" JSON_INTEGER_FORMAT
                    "; removed it\n", name, r.len, bytes);
  } else if (strcmp(hex, want) != 0) {
    fprintf(stderr, "lathe jobs download: %s: sha256 %s does not match the published %s; removed it\n", name, hex,
            want);
  } else if (rename(part, dest) != 0) {
    fprintf(stderr, "lathe jobs download: %s: cannot rename %s to %s: %s\n", name, part, dest, strerror(errno));
  } else {
    rc = 0;
    if (!o->quiet && !o->json) printf("%-32s %12zu bytes  sha256 %s  ok\n", name, r.len, hex);
  }
  if (f) fclose(f);
  if (rc) unlink(part);
  lt_client_resp_free(&r);
  return rc;
}

/* download ID DIR: every published artifact, each verified (see the top of the file). */
static int download(lt_cli_opts_t *o, const char *id, const char *dir) {
  char path[512];
  lt_client_resp_t r;
  if (!lt_cli_path_id(path, sizeof path, "/v1/jobs/", id, "/artifacts")) return 2;
  int rc = lt_cli_call(o, "jobs download", "GET", path, NULL, NULL, &r);
  if (rc) return rc;
  json_t *arts = json_object_get(r.json, "artifacts");
  if (json_array_size(arts) == 0) {
    fprintf(stderr, "lathe jobs download: job %s (%s) has no published artifacts yet\n", id,
            json_string_value(json_object_get(r.json, "state")));
    rc = 1;
  } else if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "lathe jobs download: cannot create %s: %s\n", dir, strerror(errno));
    rc = 1;
  }
  size_t i;
  json_t *a;
  if (!rc) json_array_foreach(arts, i, a) rc |= download_one(o, id, dir, a);
  lt_client_resp_free(&r);
  return rc;
}

/* show, cancel, delete, watch, checkpoints: ID; download: ID DIR; and the common options. */
static int one_job(int argc, char **argv) {
  const char *verb = argv[0];
  char what[32], path[512];
  snprintf(what, sizeof what, "jobs %s", verb);
  lt_cli_opts_t o = {0};
  bool dl = strcmp(verb, "download") == 0;
  lt_cli_args_t a = {.what = what, .usage = usage, .min = 1 + dl, .max = 1 + dl};
  int rc = lt_cli_api_open(&o, &a, argc, argv);
  if (rc >= 0) return rc;
  const char *id = a.operands[0];
  bool show = strcmp(verb, "show") == 0, cancel = strcmp(verb, "cancel") == 0;
  bool ckpts = strcmp(verb, "checkpoints") == 0;
  lt_client_resp_t r;
  if (strcmp(verb, "watch") == 0) rc = watch(&o, id);
  else if (dl) rc = download(&o, id, a.operands[1]);
  else if (ckpts && lt_cli_path_id(path, sizeof path, "/v1/jobs/", id, "/checkpoints")) {
    if (!(rc = lt_cli_call(&o, what, "GET", path, NULL, NULL, &r)) && !o.json) print_checkpoints(r.json);
    if (!rc) lt_client_resp_free(&r);
  } else if (ckpts) rc = 2;
  else if (!lt_cli_path_id(path, sizeof path, "/v1/jobs/", id, cancel ? "/cancel" : NULL)) rc = 2;
  else if (!(rc = lt_cli_call(&o, what, show ? "GET" : cancel ? "POST" : "DELETE", path, NULL, NULL, &r))) {
    if (show && !o.json) show_job(r.json);
    else if (cancel && !o.json) print_job_line(r.json);
    else if (!o.json) printf("%s deleted (its artifacts and checkpoints cannot be read again)\n", id);
    lt_client_resp_free(&r);
  }
  lt_cli_close(&o);
  return rc;
}

int lt_cli_jobs(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"submit", submit}, {"list", list},       {"show", one_job},
                                        {"cancel", one_job}, {"delete", one_job}, {"watch", one_job},
                                        {"checkpoints", one_job}, {"download", one_job}};
  return lt_cli_args_dispatch("jobs", usage, verbs, sizeof verbs / sizeof *verbs, lt_cli_api_options, argc, argv);
}
