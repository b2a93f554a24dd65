/* lathe sessions: customers' training sessions over the API (lt_client). A session's calls come
 * from the customer's own code (clients/python); this command looks at sessions and ends them.
 *
 *   lathe sessions list [--limit N] [--cursor C]
 *   lathe sessions show ID       state, attempt, the step its state is at, saved states, idle
 *   lathe sessions end ID        after its queued calls: a final state, then its adapter is published
 *   lathe sessions cancel ID     stop it now
 *   common: [--url URL] [--api-key KEY] [--ca-file PEM] [--json] [--quiet] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_cli_api.h"

static void usage(FILE *f) {
  fprintf(f, "usage: lathe sessions list [--limit N] [--cursor C]\n"
             "       lathe sessions show|end|cancel ID\n"
             "       common: [--url URL] [--api-key KEY] [--ca-file PEM] [--json] [--quiet]\n"
             "A session's calls come from your own code: clients/python (docs/DESIGN.md §5).\n");
}

static void print_session(json_t *s, bool header) {
  if (header) printf("%-30s %-11s %-8s %-6s %-6s %-14s %s\n", "ID", "STATE", "ATTEMPT", "STEP", "CALLS", "MODEL", "SAVED");
  json_t *saved = json_object_get(s, "saved"), *v;
  size_t i;
  char names[256] = "";
  json_array_foreach(saved, i, v) {
    size_t len = strlen(names);
    snprintf(names + len, sizeof names - len, "%s%s@%lld", len ? " " : "", json_string_value(json_object_get(v, "name")),
             (long long)json_integer_value(json_object_get(v, "step")));
  }
  printf("%-30s %-11s %-8lld %-6lld %-6lld %-14.14s %s%s\n", json_string_value(json_object_get(s, "id")),
         json_string_value(json_object_get(s, "state")), (long long)json_integer_value(json_object_get(s, "attempt")),
         (long long)json_integer_value(json_object_get(s, "step")),
         (long long)json_integer_value(json_object_get(s, "calls_completed")),
         json_string_value(json_object_get(s, "base_model")), names,
         json_is_true(json_object_get(s, "idle")) ? " (idle: holds no slot)" : "");
}

static int list(int argc, char **argv) {
  char path[512] = "/v1/sessions";
  static const char *const flags[] = {"limit", "limit", "cursor", "after", NULL};
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = "sessions list", .usage = usage};
  lt_client_resp_t r;
  int rc = lt_cli_api_list_open(&o, &a, argc, argv, flags, path, sizeof path);
  if (rc < 0 && !(rc = lt_cli_call(&o, "sessions list", "GET", path, NULL, NULL, &r))) {
    if (!o.json) {
      size_t i;
      json_t *s;
      json_array_foreach(json_object_get(r.json, "data"), i, s) print_session(s, i == 0);
      const char *next = json_string_value(json_object_get(r.json, "next_cursor"));
      if (next) printf("(more: lathe sessions list --cursor %s)\n", next);
    }
    lt_client_resp_free(&r);
  }
  lt_cli_close(&o);
  return rc;
}

/* show, end, cancel: ID and the common options. */
static int one_session(int argc, char **argv) {
  const char *verb = argv[0];
  bool show = strcmp(verb, "show") == 0, end = strcmp(verb, "end") == 0;
  char path[512], what[64];
  snprintf(what, sizeof what, "sessions %s", verb);
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = what, .usage = usage, .min = 1, .max = 1};
  lt_client_resp_t r;
  int rc = lt_cli_api_open(&o, &a, argc, argv);
  if (rc >= 0) return rc;
  const char *id = a.operands[0];
  if (!lt_cli_path_id(path, sizeof path, "/v1/sessions/", id, show || end ? NULL : "/cancel")) rc = 2;
  else if (!(rc = lt_cli_call(&o, what, show ? "GET" : end ? "DELETE" : "POST", path, NULL, NULL, &r))) {
    if (!o.json && json_object_get(r.json, "id")) print_session(r.json, true);
    else if (!o.json) printf("%s: %s queued (seq %lld)\n", id, verb, (long long)json_integer_value(json_object_get(r.json, "seq")));
    lt_client_resp_free(&r);
  }
  lt_cli_close(&o);
  return rc;
}

int lt_cli_sessions(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {
      {"list", list}, {"show", one_session}, {"end", one_session}, {"cancel", one_session}};
  return lt_cli_args_dispatch("sessions", usage, verbs, sizeof verbs / sizeof *verbs, lt_cli_api_options, argc, argv);
}
