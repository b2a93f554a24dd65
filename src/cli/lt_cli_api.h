/* lt_cli_api: what the customer commands of `lathe` (lt_cli_jobs.c, lt_cli_datasets.c) share:
 * the common options (--url, --api-key, --json, --quiet), one call-and-report helper, and
 * formatting. Not a library API: only the CLI uses it. Single-threaded. */
#ifndef LT_CLI_API_H
#define LT_CLI_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "lt_client.h"

typedef struct lt_cli_opts {
  lt_client_t *client; /* owned; lt_cli_close frees it */
  bool json;           /* --json: print the server's JSON on stdout */
  bool quiet;          /* --quiet: no progress output */
  const char *cmd;     /* "jobs", "datasets": the prefix of messages */
} lt_cli_opts_t;

/* The prologue of a command: without a verb prints usage on stderr (exit status 2), for --help
 * or -h on stdout (0). Otherwise removes the common options from argv (argv[0] stays), updates
 * *argc and creates the client. Returns -1 to go on, or the exit status to return (2: usage,
 * 1: failure, message printed). */
int lt_cli_open(lt_cli_opts_t *o, const char *cmd, void (*usage)(FILE *f), int *argc, char **argv);
void lt_cli_close(lt_cli_opts_t *o);

/* Sends a JSON request (body borrowed, may be NULL). On a 2xx answer fills *resp (the caller
 * frees it), prints the body when --json, returns 0. Otherwise prints "lathe WHAT: <error>" on
 * stderr (and the body on stdout when --json) and returns 1. */
int lt_cli_call(lt_cli_opts_t *o, const char *what, const char *method, const char *path, const json_t *body,
                const char *idempotency_key, lt_client_resp_t *resp);

/* prefix + URI-encoded id + suffix (may be NULL) into out; false (message printed) when the id
 * is empty or too long. */
bool lt_cli_path_id(char *out, size_t n, const char *prefix, const char *id, const char *suffix);

/* A list route's path with its query: path holds the route ("/v1/jobs"); each "--flag VALUE" of
 * argv[1..argc) whose flag is in flags (pairs: "--state", "state", ..., NULL) is appended as
 * name=VALUE, encoded. False (after saying which, naming what) on another argument. */
bool lt_cli_list_query(char *path, size_t n, const char *what, int argc, char **argv, const char *const *flags);

/* "2026-11-29 14:03:07" (UTC) from ms since the epoch; "-" for 0. */
const char *lt_cli_time(int64_t ms, char *out, size_t n);

/* "1h02m", "3m20s", "12s" */
const char *lt_cli_duration(double s, char *out, size_t n);

#endif
