/* lt_cli_api: the shared options and helpers of `lathe jobs` and `lathe datasets` (see
 * lt_cli_api.h). */
#include "lt_cli_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <event2/http.h>

int lt_cli_open(lt_cli_opts_t *o, const char *cmd, void (*usage)(FILE *f), int *argc, char **argv) {
  memset(o, 0, sizeof *o);
  o->cmd = cmd;
  if (*argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(*argc < 2 ? stderr : stdout);
    return *argc < 2 ? 2 : 0;
  }
  const char *url = NULL, *key = NULL, *ca = NULL;
  int w = 1;
  for (int i = 1; i < *argc; i++) {
    if ((strcmp(argv[i], "--url") == 0 || strcmp(argv[i], "--api-key") == 0 || strcmp(argv[i], "--ca-file") == 0) &&
        i + 1 >= *argc) {
      fprintf(stderr, "lathe %s: %s needs a value\n", cmd, argv[i]);
      return 2;
    }
    if (strcmp(argv[i], "--url") == 0) url = argv[++i];
    else if (strcmp(argv[i], "--api-key") == 0) key = argv[++i];
    else if (strcmp(argv[i], "--ca-file") == 0) ca = argv[++i];
    else if (strcmp(argv[i], "--json") == 0) o->json = true;
    else if (strcmp(argv[i], "--quiet") == 0 || strcmp(argv[i], "-q") == 0) o->quiet = true;
    else argv[w++] = argv[i];
  }
  *argc = w;
  argv[w] = NULL;
  if (w < 2) { /* only shared options, no verb: `lathe jobs --json` */
    fprintf(stderr, "lathe %s: which command? (see lathe %s --help)\n", cmd, cmd);
    usage(stderr);
    return 2;
  }
  char err[512];
  lt_client_opts_t co = {.url = url, .api_key = key, .ca_file = ca};
  if (lt_client_new(&co, &o->client, err, sizeof err)) {
    fprintf(stderr, "lathe %s: %s\n", cmd, err);
    return 2;
  }
  return -1;
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

bool lt_cli_list_query(char *path, size_t n, const char *what, int argc, char **argv, const char *const *flags) {
  char sep = '?';
  for (int i = 1; i < argc; i++) {
    const char *name = NULL;
    for (const char *const *f = flags; *f && !name; f += 2)
      if (strcmp(argv[i], f[0]) == 0) name = f[1];
    if (!name || i + 1 >= argc) {
      fprintf(stderr, "lathe %s: unexpected argument \"%s\"\n", what, argv[i]);
      return false;
    }
    char *enc = evhttp_uriencode(argv[++i], -1, 0);
    size_t len = strlen(path);
    snprintf(path + len, n - len, "%c%s=%s", sep, name, enc ? enc : "");
    free(enc);
    sep = '&';
  }
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
