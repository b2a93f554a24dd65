/* lt_cli_api: the shared options and helpers of the customer commands (see lt_cli_api.h). */
#include "lt_cli_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/http.h>

const struct option lt_cli_api_options[] = {LT_CLI_API_OPTIONS, {0}};

int lt_cli_api_next(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv) {
  for (;;) {
    int c = lt_cli_args_next(a, argc, argv);
    switch (c) {
    case LT_CLI_O_URL: o->url = a->value; continue;
    case LT_CLI_O_API_KEY: o->api_key = a->value; continue;
    case LT_CLI_O_CA_FILE: o->ca_file = a->value; continue;
    case LT_CLI_O_JSON: o->json = true; continue;
    case 'q': o->quiet = true; continue;
    case LT_CLI_ARGS_END: break;
    default: return c;
    }
    char err[512];
    lt_client_opts_t co = {.url = o->url, .api_key = o->api_key, .ca_file = o->ca_file};
    if (lt_client_new(&co, &o->client, err, sizeof err)) {
      a->status = lt_cli_args_fail(a, "%s", err);
      return LT_CLI_ARGS_STOP;
    }
    return LT_CLI_ARGS_END;
  }
}

int lt_cli_api_open(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv) {
  static const struct option common[] = {LT_CLI_API_OPTIONS, {0}};
  if (!a->opts) a->opts = common;
  int c;
  while ((c = lt_cli_api_next(o, a, argc, argv)) >= 0) {
  }
  return c == LT_CLI_ARGS_END ? -1 : a->status;
}

int lt_cli_api_list_open(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv, const char *const *flags,
                         char *path, size_t n) {
  struct option opts[LT_CLI_ARGS_MAX] = {LT_CLI_API_OPTIONS};
  size_t k = 0;
  while (opts[k].name) k++; /* after the common ones */
  for (int i = 0; flags[i] && k < LT_CLI_ARGS_MAX - 2; i += 2, k++)
    opts[k] = (struct option){flags[i], required_argument, NULL, 0x2000 + i};
  a->opts = opts;
  char sep = strchr(path, '?') ? '&' : '?';
  int c;
  while ((c = lt_cli_api_next(o, a, argc, argv)) >= 0) {
    char *enc = evhttp_uriencode(a->value, -1, 0);
    size_t len = strlen(path);
    snprintf(path + len, n - len, "%c%s=%s", sep, flags[c - 0x2000 + 1], enc ? enc : "");
    free(enc);
    sep = '&';
  }
  return c == LT_CLI_ARGS_END ? -1 : a->status;
}

void lt_cli_close(lt_cli_opts_t *o) {
  lt_client_destroy(o->client);
  o->client = NULL;
}

int lt_cli_call(lt_cli_opts_t *o, const char *what, const char *method, const char *path, const json_t *body,
                const char *idempotency_key, lt_client_resp_t *resp) {
  char err[512];
  if (lt_client_json(o->client, method, path, body, idempotency_key, resp, err, sizeof err)) {
    fprintf(stderr, "lathe %s: %s\n", what, err);
    return 1;
  }
  if (o->json && resp->body) printf("%s%s", resp->body, resp->len && resp->body[resp->len - 1] == '\n' ? "" : "\n");
  if (resp->status >= 200 && resp->status < 300) return 0;
  char line[700];
  fprintf(stderr, "lathe %s: %s\n", what, lt_client_error_text(resp, line, sizeof line));
  if (resp->status == 401 && !getenv("LATHE_API_KEY"))
    fprintf(stderr, "lathe %s: set LATHE_API_KEY (or --api-key) to the key `lathe admin tenant create` printed\n",
            what);
  lt_client_resp_free(resp);
  return 1;
}

bool lt_cli_path_id(char *out, size_t n, const char *prefix, const char *id, const char *suffix) {
  if (!id || !*id || strlen(id) > 200) {
    fprintf(stderr, "lathe: the id \"%s\" is empty or too long\n", id ? id : "");
    return false;
  }
  char *enc = evhttp_uriencode(id, -1, 0);
  if (!enc) return false;
  snprintf(out, n, "%s%s%s", prefix, enc, suffix ? suffix : "");
  free(enc);
  return true;
}

const char *lt_cli_time(int64_t ms, char *out, size_t n) {
  if (ms <= 0) {
    snprintf(out, n, "-");
    return out;
  }
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(out, n, "%Y-%m-%d %H:%M:%S", &tm);
  return out;
}

const char *lt_cli_duration(double s, char *out, size_t n) {
  if (s < 0 || s != s) s = 0;
  long v = (long)(s + 0.5);
  if (v >= 3600) snprintf(out, n, "%ldh%02ldm", v / 3600, (v % 3600) / 60);
  else if (v >= 60) snprintf(out, n, "%ldm%02lds", v / 60, v % 60);
  else snprintf(out, n, "%lds", v);
  return out;
}
