/* lathe admin queue: what the leading scheduler's policy sees now, per tenant and class and for
 * the fleet — from the scheduler's operator endpoint (GET /v1/admin/queue, lt_scheduler_ops.c),
 * which lathed serves with --scheduler-port or LATHE_SCHEDULER_PORT.
 *
 *   lathe admin queue [--url URL] [--json]
 *
 * URL: --url, else LATHE_SCHEDULER_URL, else http://127.0.0.1:8082. The endpoint is plain HTTP
 * without authentication, on loopback like the API's operator port; no API key is sent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "lt_cli_args.h"
#include "lt_client.h"

#define DEFAULT_URL "http://127.0.0.1:8082"

static void usage(FILE *f) {
  fprintf(f, "usage: lathe admin queue [--url URL] [--json]\n"
             "\nThe leading scheduler's view: per tenant and class the queued jobs, running slots, share\n"
             "and entitlement of the class's slots, wait p50/p99, GPU-hours and cold loads (this\n"
             "leader's term); then the fleet: slots used/total, reserved-idle slot-hours, fragmented\n"
             "slots (free, but too few for the smallest queued job) and Jain's index per class.\n"
             "URL: the scheduler's operator endpoint (lathed --scheduler-port), --url or\n"
             "LATHE_SCHEDULER_URL, default " DEFAULT_URL ". --json prints the endpoint's JSON.\n");
}

static double num(const json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *str(const json_t *o, const char *k) {
  const char *v = json_string_value(json_object_get(o, k));
  return v ? v : "?";
}

/* A wait in seconds, short: "0.4s", "12s", "9m", "3.1h", "2.0d". */
static const char *dur(double s, char *out, size_t n) {
  if (s < 10) snprintf(out, n, "%.1fs", s);
  else if (s < 600) snprintf(out, n, "%.0fs", s);
  else if (s < 36000) snprintf(out, n, "%.0fm", s / 60);
  else if (s < 86400 * 3) snprintf(out, n, "%.1fh", s / 3600);
  else snprintf(out, n, "%.1fd", s / 86400);
  return out;
}

static void print_table(const json_t *q) {
  const json_t *rows = json_object_get(q, "rows"), *fleet = json_object_get(q, "fleet");
  printf("%-24s %-11s %6s %7s %6s %6s %8s %8s %9s %5s\n", "TENANT", "CLASS", "QUEUED", "RUNNING",
         "SHARE", "ENTIT", "WAIT_P50", "WAIT_P99", "GPU_HOURS", "COLD");
  size_t i;
  const json_t *r;
  json_array_foreach(rows, i, r) {
    char p50[16], p99[16];
    printf("%-24s %-11s %6.0f %7.0f %5.1f%% %5.1f%% %8s %8s %9.2f %5.0f\n", str(r, "tenant"),
           str(r, "class"), num(r, "queued"), num(r, "running_slots"), 100 * num(r, "share"),
           100 * num(r, "entitlement"), dur(num(r, "wait_p50_s"), p50, sizeof p50),
           dur(num(r, "wait_p99_s"), p99, sizeof p99), num(r, "gpu_hours"), num(r, "cold_loads"));
  }
  if (json_array_size(rows) == 0) printf("(no tenant has queued, running or run work)\n");
  printf("\nslots used/total          %.0f/%.0f (%.0f workers)\n", num(fleet, "slots_used"),
         num(fleet, "slots_total"), num(fleet, "workers"));
  printf("queued jobs               %.0f (smallest: %.0f GPUs)\n", num(fleet, "queued"),
         num(fleet, "smallest_queued_gpus"));
  printf("reserved idle             %.0f slots now on %.0f workers, %.3f slot-hours\n",
         num(fleet, "reserved_idle_slots"), num(fleet, "reserved_workers"),
         num(fleet, "reserved_idle_slot_hours"));
  printf("fragmented slots          %.0f\n", num(fleet, "fragmented_slots"));
  printf("cold loads                %.0f\n", num(fleet, "cold_loads"));
  printf("gpu hours                 %.2f\n", num(fleet, "gpu_hours"));
  const json_t *jain = json_object_get(q, "jain");
  const char *cls;
  const json_t *v;
  json_object_foreach((json_t *)jain, cls, v) printf("jain %-20s %.4f\n", cls, json_number_value(v));
}

int lt_cli_admin_queue(int argc, char **argv) {
  enum { O_URL = 256, O_JSON };
  static const struct option opts[] = {
      {"url", required_argument, NULL, O_URL}, {"json", no_argument, NULL, O_JSON}, {0}};
  lt_cli_args_t a = {.what = "admin queue", .usage = usage, .opts = opts};
  const char *url = NULL;
  bool json = false;
  int o;
  while ((o = lt_cli_args_next(&a, argc, argv)) >= 0) {
    if (o == O_URL) url = a.value;
    else json = true;
  }
  if (o != LT_CLI_ARGS_END) return a.status;
  if (!url) url = getenv("LATHE_SCHEDULER_URL");
  if (!url || !*url) url = DEFAULT_URL;
  char err[512];
  lt_client_opts_t co = {.url = url, .timeout_s = 30};
  lt_client_t *c;
  if (lt_client_new(&co, &c, err, sizeof err)) {
    fprintf(stderr, "lathe admin queue: %s\n", err);
    return 2;
  }
  lt_client_set_api_key(c, NULL); /* an operator endpoint: no tenant's key goes there */
  lt_client_resp_t r = {0};
  int rc = 1;
  if (lt_client_json(c, "GET", "/v1/admin/queue", NULL, NULL, &r, err, sizeof err)) {
    fprintf(stderr, "lathe admin queue: %s (is the scheduler serving its operator port at %s? "
                    "lathed --scheduler-port N, or LATHE_SCHEDULER_PORT)\n", err, url);
  } else if (r.status != 200 || !r.json) {
    char line[700];
    fprintf(stderr, "lathe admin queue: %s\n", lt_client_error_text(&r, line, sizeof line));
  } else {
    if (json) printf("%.*s%s", (int)r.len, r.body, r.len && r.body[r.len - 1] == '\n' ? "" : "\n");
    else print_table(r.json);
    rc = 0;
  }
  lt_client_resp_free(&r);
  lt_client_destroy(c);
  return rc;
}
