/* lathe datasets: customers' datasets over the API (lt_client).
 *
 *   lathe datasets upload FILE [--name N] [--max-tokens T]
 *   lathe datasets list
 *   lathe datasets show ID
 *   lathe datasets delete ID
 *   common: [--url URL] [--api-key KEY] [--ca-file PEM] [--json]   (else LATHE_API_URL, LATHE_API_KEY)
 *
 * upload streams the file in parts (POST /v1/uploads, PUT .../parts/N, POST .../complete) so no
 * file is held in memory whole, with a progress bar on stderr when it is a terminal (a line
 * every 10% otherwise). A file the server refuses prints one `FILE:LINE: field: reason` line per
 * error and exits 1; an interrupted upload is aborted so nothing stays on the server. */
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
#include "lt_job.h"
#include "lt_time.h"

static void usage(FILE *f) {
  fprintf(f, "usage: lathe datasets upload FILE [--name N] [--max-tokens T]\n"
             "       lathe datasets list\n"
             "       lathe datasets show ID\n"
             "       lathe datasets delete ID\n"
             "options for every command: --url URL (LATHE_API_URL, default http://127.0.0.1:8080; https://\n"
             "  verifies the server against --ca-file PEM, LATHE_API_CA_FILE or the system's CAs),\n"
             "  --api-key KEY (LATHE_API_KEY), --json (print the server's JSON)\n"
             "\nA dataset is JSONL, one {\"prompt\",\"completion\"} or {\"messages\":[...]} object a line.\n");
}

/* ---------------------------------------------------------------- progress */

typedef struct {
  bool tty;
  uint64_t total;
  double t0;
  int last_decile;
} progress_t;

static void progress_show(progress_t *p, uint64_t done, bool final) {
  double el = (lt_time_mono_us() / 1e6) - p->t0;
  double mbs = el > 0 ? (double)done / 1e6 / el : 0;
  int pct = p->total ? (int)(done * 100 / p->total) : 100;
  if (p->tty) {
    char bar[31];
    int fill = pct * 30 / 100;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r[%s] %3d%%  %.1f/%.1f MB  %.1f MB/s%s", bar, pct, done / 1e6, p->total / 1e6, mbs,
            final ? "\n" : "");
    fflush(stderr);
  } else if (pct / 10 > p->last_decile || (final && done < p->total)) {
    p->last_decile = pct / 10;
    fprintf(stderr, "uploaded %" PRIu64 " of %" PRIu64 " bytes (%d%%), %.1f MB/s\n", done, p->total, pct, mbs);
  }
}

/* ---------------------------------------------------------------- upload */

static void print_report_errors(const char *file, json_t *report) {
  json_t *errs = json_object_get(report, "errors");
  size_t i;
  json_t *e;
  json_array_foreach(errs, i, e) {
    json_int_t line = json_integer_value(json_object_get(e, "line"));
    const char *field = json_string_value(json_object_get(e, "field"));
    const char *reason = json_string_value(json_object_get(e, "reason"));
    if (line > 0)
      fprintf(stderr, "%s:%" JSON_INTEGER_FORMAT ": %s: %s\n", file, line, field && *field ? field : "(line)",
              reason ? reason : "invalid");
    else
      fprintf(stderr, "%s: %s%s%s\n", file, field && *field ? field : "", field && *field ? ": " : "",
              reason ? reason : "invalid");
  }
  json_int_t count = json_integer_value(json_object_get(report, "error_count"));
  if (count > (json_int_t)json_array_size(errs))
    fprintf(stderr, "%s: %" JSON_INTEGER_FORMAT " error(s) in all, %zu shown\n", file, count, json_array_size(errs));
}

static void print_dataset(json_t *meta) {
  printf("dataset %s (%s): %" JSON_INTEGER_FORMAT " bytes, sha256 %s\n", json_string_value(json_object_get(meta, "id")),
         json_string_value(json_object_get(meta, "name")), json_integer_value(json_object_get(meta, "bytes")),
         json_string_value(json_object_get(meta, "sha256")));
  json_t *r = json_object_get(meta, "report");
  if (r)
    printf("  format %s, %" JSON_INTEGER_FORMAT " examples, %" JSON_INTEGER_FORMAT " tokens, longest example %" JSON_INTEGER_FORMAT
           " tokens (line %" JSON_INTEGER_FORMAT ")%s",
           json_string_value(json_object_get(r, "format")), json_integer_value(json_object_get(r, "examples")),
           json_integer_value(json_object_get(r, "tokens")), json_integer_value(json_object_get(r, "longest_example_tokens")),
           json_integer_value(json_object_get(r, "longest_example_line")),
           json_object_get(r, "estimated_cost_token_steps") ? "" : "\n");
  if (r && json_object_get(r, "estimated_cost_token_steps"))
    printf(", estimated cost %" JSON_INTEGER_FORMAT " token-steps\n",
           json_integer_value(json_object_get(r, "estimated_cost_token_steps")));
}

/* POST /v1/uploads: starts an upload named name and fills upload_id and *part_max (the largest
 * part the server takes). False, with the message printed, when the server said no. */
static bool upload_begin(lt_cli_opts_t *o, const char *name, const char *max_tokens, char *upload_id,
                         size_t id_size, size_t *part_max) {
  char err[512], path[1024], line[700];
  char *ename = evhttp_uriencode(name, -1, 0);
  snprintf(path, sizeof path, "/v1/uploads?name=%s%s%s", ename ? ename : "", max_tokens ? "&max_tokens=" : "",
           max_tokens ? max_tokens : "");
  free(ename);
  lt_client_resp_t r;
  if (lt_client_request(o->client, "POST", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err)) {
    fprintf(stderr, "lathe datasets upload: %s\n", err);
    return false;
  }
  if (r.status != 201) {
    fprintf(stderr, "lathe datasets upload: %s\n", lt_client_error_text(&r, line, sizeof line));
    lt_client_resp_free(&r);
    return false;
  }
  const char *id = json_string_value(json_object_get(r.json, "upload_id"));
  snprintf(upload_id, id_size, "%s", id ? id : "");
  *part_max = (size_t)json_integer_value(json_object_get(r.json, "part_max_bytes"));
  lt_client_resp_free(&r);
  if (!upload_id[0] || *part_max == 0) {
    fprintf(stderr, "lathe datasets upload: the server's answer to POST /v1/uploads has no upload_id\n");
    return false;
  }
  return true;
}

enum { O_NAME = 256, O_MAX_TOKENS };

static int upload_file(lt_cli_opts_t *o, const char *file, const char *name, const char *max_tokens);

static int upload(int argc, char **argv) {
  static const struct option opts[] = {{"name", required_argument, NULL, O_NAME},
                                       {"max-tokens", required_argument, NULL, O_MAX_TOKENS}, LT_CLI_API_OPTIONS, {0}};
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = "datasets upload", .usage = usage, .opts = opts, .min = 1, .max = 1};
  const char *name = NULL, *max_tokens = NULL;
  int c;
  while ((c = lt_cli_api_next(&o, &a, argc, argv)) >= 0) {
    if (c == O_NAME) name = a.value;
    else max_tokens = a.value;
  }
  int rc = c == LT_CLI_ARGS_END ? upload_file(&o, a.operands[0], name, max_tokens) : a.status;
  lt_cli_close(&o);
  return rc;
}

static int upload_file(lt_cli_opts_t *o, const char *file, const char *name, const char *max_tokens) {
  FILE *f = fopen(file, "rb");
  struct stat st;
  if (!f || fstat(fileno(f), &st) != 0) {
    fprintf(stderr, "lathe datasets upload: cannot open %s: %s\n", file, strerror(errno));
    if (f) fclose(f);
    return 1;
  }
  if (!name) {
    const char *slash = strrchr(file, '/');
    name = slash ? slash + 1 : file;
  }
  char err[512], path[1024], line[700];
  lt_client_resp_t r;
  int rc = 1;
  char upload_id[128] = "";
  size_t part_max = 0;
  uint8_t *buf = NULL;
  if (!upload_begin(o, name, max_tokens, upload_id, sizeof upload_id, &part_max)) goto out;
  buf = malloc(part_max);
  if (!buf) {
    fprintf(stderr, "lathe datasets upload: out of memory\n");
    goto abort;
  }
  progress_t pr = {.tty = isatty(2), .total = (uint64_t)st.st_size, .t0 = (lt_time_mono_us() / 1e6), .last_decile = -1};
  if (o->quiet) pr.tty = false, pr.last_decile = 100;
  uint64_t sent = 0;
  progress_show(&pr, 0, false);
  for (int part = 1;; part++) {
    size_t got = fread(buf, 1, part_max, f);
    if (got == 0) {
      if (ferror(f)) {
        fprintf(stderr, "lathe datasets upload: reading %s: %s\n", file, strerror(errno));
        goto abort;
      }
      break;
    }
    snprintf(path, sizeof path, "/v1/uploads/%s/parts/%d", upload_id, part);
    if (lt_client_request(o->client, "PUT", path, NULL, 0, buf, got, "application/x-ndjson", &r, err, sizeof err)) {
      if (pr.tty) fputc('\n', stderr);
      fprintf(stderr, "lathe datasets upload: part %d: %s\n", part, err);
      goto abort;
    }
    if (r.status != 200) {
      if (pr.tty) fputc('\n', stderr);
      fprintf(stderr, "lathe datasets upload: %s: %s\n", file, lt_client_error_text(&r, line, sizeof line));
      lt_client_resp_free(&r);
      upload_id[0] = '\0'; /* the server dropped it (quota) or it is gone */
      goto out;
    }
    lt_client_resp_free(&r);
    sent += got;
    if (!o->quiet) progress_show(&pr, sent, false);
    if (got < part_max) break;
  }
  if (!o->quiet) progress_show(&pr, sent, true);
  snprintf(path, sizeof path, "/v1/uploads/%s/complete", upload_id);
  if (lt_client_request(o->client, "POST", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err)) {
    fprintf(stderr, "lathe datasets upload: completing: %s\n", err);
    goto abort;
  }
  upload_id[0] = '\0'; /* complete frees the upload whatever the outcome */
  if (o->json) printf("%s%s", r.body, r.len && r.body[r.len - 1] == '\n' ? "" : "\n");
  if (r.status == 201) {
    if (!o->json) print_dataset(r.json);
    rc = 0;
  } else {
    json_t *report = json_object_get(r.json, "report");
    if (report && json_array_size(json_object_get(report, "errors"))) print_report_errors(file, report);
    fprintf(stderr, "lathe datasets upload: %s\n", lt_client_error_text(&r, line, sizeof line));
  }
  lt_client_resp_free(&r);
  goto out;
abort:
  if (upload_id[0]) {
    snprintf(path, sizeof path, "/v1/uploads/%s", upload_id);
    if (lt_client_request(o->client, "DELETE", path, NULL, 0, NULL, 0, NULL, &r, err, sizeof err) == LT_OK)
      lt_client_resp_free(&r);
  }
out:
  free(buf);
  fclose(f);
  return rc;
}

/* ---------------------------------------------------------------- list, show, delete */

/* Every page (--json: the server's pages as they come, one JSON object each). */
static int list_pages(lt_cli_opts_t *o) {
  char path[256] = "/v1/datasets?limit=500", last[LT_ID_MAX + 1] = "";
  if (!o->json) printf("%-28s %-28s %12s  %-20s\n", "ID", "NAME", "BYTES", "CREATED (UTC)");
  for (bool more = true; more;) {
    lt_client_resp_t r;
    int rc = lt_cli_call(o, "datasets list", "GET", path, NULL, NULL, &r);
    if (rc) return rc;
    json_t *ds = json_object_get(r.json, "datasets");
    size_t i;
    json_t *d;
    if (!o->json) json_array_foreach(ds, i, d) {
        char when[32];
        lt_cli_time(json_integer_value(json_object_get(d, "created_at")), when, sizeof when);
        printf("%-28s %-28.28s %12" JSON_INTEGER_FORMAT "  %-20s\n", json_string_value(json_object_get(d, "id")),
               json_string_value(json_object_get(d, "name")), json_integer_value(json_object_get(d, "bytes")), when);
      }
    const char *l = json_string_value(json_object_get(r.json, "last_id"));
    more = json_is_true(json_object_get(r.json, "has_more")) && l && strlen(l) <= LT_ID_MAX && strcmp(l, last) != 0;
    if (more) {
      snprintf(last, sizeof last, "%s", l);
      if (!lt_cli_path_id(path, sizeof path, "/v1/datasets?limit=500&after=", last, NULL)) more = false;
    }
    lt_client_resp_free(&r);
  }
  return 0;
}

/* list; show ID, delete ID. */
static int datasets_verb(int argc, char **argv) {
  const char *verb = argv[0];
  bool list = strcmp(verb, "list") == 0, show = strcmp(verb, "show") == 0;
  char what[32], path[512];
  snprintf(what, sizeof what, "datasets %s", verb);
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = what, .usage = usage, .min = !list, .max = !list};
  lt_client_resp_t r;
  int rc = lt_cli_api_open(&o, &a, argc, argv);
  if (rc >= 0) return rc;
  if (list) rc = list_pages(&o);
  else if (!lt_cli_path_id(path, sizeof path, "/v1/datasets/", a.operands[0], NULL)) rc = 2;
  else if (!(rc = lt_cli_call(&o, what, show ? "GET" : "DELETE", path, NULL, NULL, &r))) {
    if (show && !o.json) print_dataset(r.json);
    else if (!o.json) printf("dataset %s deleted (its key is shredded)\n", a.operands[0]);
    lt_client_resp_free(&r);
  }
  lt_cli_close(&o);
  return rc;
}

int lt_cli_datasets(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {
      {"upload", upload}, {"list", datasets_verb}, {"show", datasets_verb}, {"delete", datasets_verb}};
  return lt_cli_args_dispatch("datasets", usage, verbs, sizeof verbs / sizeof *verbs, lt_cli_api_options, argc, argv);
}
