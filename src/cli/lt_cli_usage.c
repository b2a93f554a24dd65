/* lathe usage: the tenant's quotas and what it uses against each (GET /v1/usage, over the API;
 * the route is in src/control/lt_api_quota.c).
 *
 *   lathe usage [--url URL] [--api-key KEY] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_cli_api.h"

static void usage(FILE *f) {
  fprintf(f, "usage: lathe usage [--json]\n"
             "Your quotas and what you use against each: jobs and sessions not ended, running slots,\n"
             "stored bytes (datasets, checkpoints, session calls; at most a minute old) and published\n"
             "artifacts. A limit of 0 is none. Options: --url URL (LATHE_API_URL), --api-key KEY\n"
             "(LATHE_API_KEY), --json.\n");
}

static long long num(json_t *o, const char *k) { return (long long)json_integer_value(json_object_get(o, k)); }

/* One line: what is used of a limit (0: none). */
static void row(const char *what, long long used, long long limit, const char *unit) {
  if (limit > 0)
    printf("  %-24s %14lld of %-14lld %s (%.0f %%)\n", what, used, limit, unit, 100.0 * (double)used / (double)limit);
  else printf("  %-24s %14lld %-17s %s\n", what, used, "(no limit)", unit);
}

int lt_cli_usage(int argc, char **argv) {
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = "usage", .usage = usage, .max = 0};
  int rc = lt_cli_api_open(&o, &a, argc, argv);
  if (rc >= 0) return rc;
  lt_client_resp_t r;
  if ((rc = lt_cli_call(&o, "usage", "GET", "/v1/usage", NULL, NULL, &r)) == 0 && !o.json) {
    json_t *q = json_object_get(r.json, "quotas"), *u = json_object_get(r.json, "usage");
    const char *from = json_string_value(json_object_get(q, "max_storage_bytes_from"));
    printf("tenant %s\n", json_string_value(json_object_get(r.json, "tenant_id")));
    row("jobs and sessions", num(u, "queued_or_running_jobs"), num(q, "max_queued_jobs"), "not ended");
    row("running slots", num(u, "running_slots"), num(q, "max_running_slots"), "slots");
    row("storage", num(u, "storage_bytes"), num(q, "max_storage_bytes"), "bytes");
    printf("    stored %lld bytes (measured %.0f s ago), artifacts %lld bytes; storage limit: %s\n",
           num(u, "stored_bytes"), json_number_value(json_object_get(u, "stored_bytes_age_s")), num(u, "artifact_bytes"),
           from && !strcmp(from, "tenant") ? "yours" : from && !strcmp(from, "service") ? "the service's" : "none");
    printf("  %-24s %lld bytes\n", "a dataset at most", num(q, "max_dataset_bytes"));
    long long d = num(q, "max_job_duration_s");
    if (d > 0) printf("  %-24s %lld s\n", "job duration at most", d);
  }
  if (rc == 0) lt_client_resp_free(&r);
  lt_cli_close(&o);
  return rc;
}
