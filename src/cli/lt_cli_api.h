/* lt_cli_api: what the customer commands of `lathe` (lt_cli_jobs.c, lt_cli_datasets.c,
 * lt_cli_sessions.c, lt_cli_access.c) share: the common options (--url, --api-key, --ca-file,
 * --json, --quiet) read through lt_cli_args, one call-and-report helper, and formatting. Not a
 * library API: only the CLI uses it. Single-threaded. */
#ifndef LT_CLI_API_H
#define LT_CLI_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "lt_cli_args.h"
#include "lt_client.h"

typedef struct lt_cli_opts {
  lt_client_t *client; /* owned; made at the end of the options; lt_cli_close frees it */
  bool json;           /* --json: print the server's JSON on stdout */
  bool quiet;          /* --quiet, -q: no progress output */
  const char *url, *api_key, *ca_file; /* --url, --api-key, --ca-file (NULL: the environment's) */
} lt_cli_opts_t;

/* The common options, for a command's option table (before its {0}), and alone (ends with {0}:
 * what lt_cli_args_dispatch lets come before the verb). */
enum { LT_CLI_O_URL = 0x1000, LT_CLI_O_API_KEY, LT_CLI_O_CA_FILE, LT_CLI_O_JSON };
#define LT_CLI_API_OPTIONS                                                                                          \
  {"url", required_argument, NULL, LT_CLI_O_URL}, {"api-key", required_argument, NULL, LT_CLI_O_API_KEY},          \
      {"ca-file", required_argument, NULL, LT_CLI_O_CA_FILE}, {"json", no_argument, NULL, LT_CLI_O_JSON},           \
      {"quiet", no_argument, NULL, 'q'}
extern const struct option lt_cli_api_options[];

/* lt_cli_args_next for a verb over the API (a->opts includes LT_CLI_API_OPTIONS; o zeroed before
 * the first call): takes the common options into o and returns the verb's own; at the end of the
 * options makes o->client (a bad --url or --ca-file: LT_CLI_ARGS_STOP, status 2). */
int lt_cli_api_next(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv);

/* A verb with the common options only (a->opts may be NULL): parses argv and makes the client.
 * Returns -1 to go on (the operands in a), or the exit status to return. */
int lt_cli_api_open(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv);

/* A list verb: the common options, and each of flags (pairs: "state", "state", "cursor", "after",
 * ..., NULL: --state VALUE becomes the query's state=VALUE, encoded) appended to path ("/v1/jobs").
 * Returns -1 to go on, or the exit status to return. */
int lt_cli_api_list_open(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv, const char *const *flags,
                         char *path, size_t n);
void lt_cli_close(lt_cli_opts_t *o);

/* Sends a JSON request (body borrowed, may be NULL). On a 2xx answer fills *resp (the caller
 * frees it), prints the body when --json, returns 0. Otherwise prints "lathe WHAT: <error>" on
 * stderr (and the body on stdout when --json) and returns 1. */
int lt_cli_call(lt_cli_opts_t *o, const char *what, const char *method, const char *path, const json_t *body,
                const char *idempotency_key, lt_client_resp_t *resp);

/* prefix + URI-encoded id + suffix (may be NULL) into out; false (message printed) when the id
 * is empty or too long. */
bool lt_cli_path_id(char *out, size_t n, const char *prefix, const char *id, const char *suffix);

/* "2026-11-29 14:03:07" (UTC) from ms since the epoch; "-" for 0. */
const char *lt_cli_time(int64_t ms, char *out, size_t n);

/* "1h02m", "3m20s", "12s" */
const char *lt_cli_duration(double s, char *out, size_t n);

#endif
