/* lathe access / lathe admin access / lathe admin staff: the staff-access lockbox from the
 * command line (the routes are in src/control/lt_api_access.c; the rules in lt_access.h).
 *
 *   tenants (LATHE_API_KEY or --api-key):
 *     lathe access list | show ID | approve ID | deny ID [--reason TEXT] | revoke ID [--reason TEXT]
 *   staff (LATHE_STAFF_KEY or --api-key):
 *     lathe admin access request --tenant T --scope S [--scope S...] --reason TEXT [--ttl 1h]
 *     lathe admin access list | show|approve|revoke ID [--reason TEXT]
 *     lathe admin access read ID (--dataset D | --artifact JOB/NAME) [-o FILE]
 *   operators:
 *     lathe admin staff add NAME [--file FILE]     a new staff key; its hash line goes in FILE
 *   common: [--url URL] [--json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_access.h"
#include "lt_cli_api.h"

static void usage_tenant(FILE *f) {
  fprintf(f, "usage: lathe access list\n"
             "       lathe access show ID\n"
             "       lathe access approve ID\n"
             "       lathe access deny ID [--reason TEXT]\n"
             "       lathe access revoke ID [--reason TEXT]\n"
             "Staff may read your data only under a request you approved, for the time it names;\n"
             "every read is listed under \"uses\". Options: --url URL (LATHE_API_URL),\n"
             "--api-key KEY (LATHE_API_KEY), --json.\n");
}

static void usage_staff(FILE *f) {
  fprintf(f, "usage: lathe admin access request --tenant T --scope S [--scope S ...] --reason TEXT [--ttl 1h]\n"
             "       lathe admin access list\n"
             "       lathe admin access show|approve|revoke ID [--reason TEXT]\n"
             "       lathe admin access read ID (--dataset D | --artifact JOB/NAME) [-o FILE]\n"
             "       lathe admin staff add NAME [--file FILE]\n"
             "Scopes: dataset:ID, job:ID (the job's artifacts), artifact:JOB/NAME. --ttl: 90s, 30m, 1h, 2d\n"
             "(at most 7d). approve is the second staff approval (never your own request).\n"
             "Options: --url URL (LATHE_API_URL), --api-key KEY (LATHE_STAFF_KEY), --json.\n");
}

/* "90s", "30m", "1h", "2d" or plain seconds; -1 when malformed. */
static long long parse_ttl(const char *s) {
  char *end;
  long long v = strtoll(s, &end, 10);
  if (end == s || v <= 0) return -1;
  long long mul = !*end ? 1 : strcmp(end, "s") == 0 ? 1 : strcmp(end, "m") == 0 ? 60 : strcmp(end, "h") == 0 ? 3600
                              : strcmp(end, "d") == 0 ? 86400 : -1;
  return mul < 0 ? -1 : v * mul;
}

static void print_request(json_t *r) {
  char t[32];
  printf("%-30s %-16s %-12s %-8s expires %s  uses %lld\n", json_string_value(json_object_get(r, "id")),
         json_string_value(json_object_get(r, "tenant_id")), json_string_value(json_object_get(r, "staff")),
         json_string_value(json_object_get(r, "state")),
         lt_cli_time(json_integer_value(json_object_get(r, "expires_at_ms")), t, sizeof t),
         (long long)json_integer_value(json_object_get(r, "uses_total")));
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(r, "scope"), i, s) printf("    scope %s\n", json_string_value(s));
  printf("    reason %s\n", json_string_value(json_object_get(r, "justification")));
}

/* One call whose answer is a request or a list of them. */
static int call_and_print(lt_cli_opts_t *o, const char *what, const char *method, const char *path, json_t *body) {
  lt_client_resp_t resp;
  int rc = lt_cli_call(o, what, method, path, body, NULL, &resp);
  json_decref(body);
  if (rc) return rc;
  if (!o->json) {
    json_t *data = json_object_get(resp.json, "data");
    size_t i;
    json_t *r;
    if (data) json_array_foreach(data, i, r) print_request(r);
    else print_request(resp.json);
  }
  lt_client_resp_free(&resp);
  return 0;
}

enum { O_REASON = 256, O_TENANT, O_SCOPE, O_TTL, O_DATASET, O_ARTIFACT };

/* lt_cli_api_next for a lockbox verb; a staff member's client sends LATHE_STAFF_KEY unless
 * --api-key names another. */
static int next(lt_cli_opts_t *o, lt_cli_args_t *a, int argc, char **argv) {
  int c = lt_cli_api_next(o, a, argc, argv);
  if (c == LT_CLI_ARGS_END && a->usage == usage_staff && !o->api_key)
    lt_client_set_api_key(o->client, getenv("LATHE_STAFF_KEY"));
  return c;
}

/* list, staff or tenant. */
static int list(int argc, char **argv, void (*usage)(FILE *f)) {
  bool staff = usage == usage_staff;
  const char *what = staff ? "admin access list" : "access list";
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = what, .usage = usage, .opts = lt_cli_api_options};
  int c;
  while ((c = next(&o, &a, argc, argv)) >= 0) {
  }
  int rc = c == LT_CLI_ARGS_END ? call_and_print(&o, what, "GET", staff ? "/v1/staff/access" : "/v1/access", NULL)
                                : a.status;
  lt_cli_close(&o);
  return rc;
}

/* show ID, approve ID, deny ID [--reason TEXT], revoke ID [--reason TEXT]: a decision's path and
 * body, staff or tenant. */
static int decision(int argc, char **argv, void (*usage)(FILE *f)) {
  static const struct option opts[] = {{"reason", required_argument, NULL, O_REASON}, LT_CLI_API_OPTIONS, {0}};
  bool staff = usage == usage_staff, show = strcmp(argv[0], "show") == 0;
  char what[64], path[512], suffix[32];
  snprintf(what, sizeof what, "%saccess %s", staff ? "admin " : "", argv[0]);
  snprintf(suffix, sizeof suffix, "/%s", argv[0]);
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = what, .usage = usage, .opts = opts, .min = 1, .max = 1};
  const char *reason = "";
  int c, rc;
  while ((c = next(&o, &a, argc, argv)) >= 0) reason = a.value;
  if (c != LT_CLI_ARGS_END) rc = a.status;
  else if (!lt_cli_path_id(path, sizeof path, staff ? "/v1/staff/access/" : "/v1/access/", a.operands[0],
                           show ? NULL : suffix))
    rc = 2;
  else rc = call_and_print(&o, what, show ? "GET" : "POST", path, show ? NULL : json_pack("{s:s}", "reason", reason));
  lt_cli_close(&o);
  return rc;
}

static int tenant_list(int argc, char **argv) { return list(argc, argv, usage_tenant); }
static int tenant_decision(int argc, char **argv) { return decision(argc, argv, usage_tenant); }

int lt_cli_access(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"list", tenant_list},        {"show", tenant_decision},
                                        {"approve", tenant_decision}, {"deny", tenant_decision},
                                        {"revoke", tenant_decision}};
  return lt_cli_args_dispatch("access", usage_tenant, verbs, sizeof verbs / sizeof *verbs, lt_cli_api_options, argc,
                              argv);
}

/* ---------------------------------------------------------------- staff */

static int staff_request(int argc, char **argv) {
  static const struct option opts[] = {{"tenant", required_argument, NULL, O_TENANT},
                                       {"scope", required_argument, NULL, O_SCOPE},
                                       {"reason", required_argument, NULL, O_REASON},
                                       {"ttl", required_argument, NULL, O_TTL},
                                       LT_CLI_API_OPTIONS,
                                       {0}};
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = "admin access request", .usage = usage_staff, .opts = opts};
  const char *tenant = NULL, *reason = NULL;
  long long ttl = 3600;
  json_t *scope = json_array();
  int c, rc = -1; /* -1: going on */
  while (rc < 0 && (c = next(&o, &a, argc, argv)) >= 0) {
    if (c == O_TENANT) tenant = a.value;
    else if (c == O_SCOPE) json_array_append_new(scope, json_string(a.value));
    else if (c == O_REASON) reason = a.value;
    else if ((ttl = parse_ttl(a.value)) < 0) rc = lt_cli_args_fail(&a, "--ttl \"%s\": want 90s, 30m, 1h or 2d", a.value);
  }
  if (rc < 0 && c == LT_CLI_ARGS_STOP) rc = a.status;
  if (rc < 0 && (!tenant || !reason || json_array_size(scope) == 0))
    rc = lt_cli_args_fail(&a, "--tenant, --scope and --reason are required");
  if (rc < 0)
    rc = call_and_print(&o, "admin access request", "POST", "/v1/staff/access",
                        json_pack("{s:s,s:O,s:s,s:I}", "tenant_id", tenant, "scope", scope, "justification", reason,
                                  "duration_s", (json_int_t)ttl));
  json_decref(scope);
  lt_cli_close(&o);
  return rc;
}

static int staff_read_to(lt_cli_opts_t *o, const char *id, const char *dataset, const char *artifact, const char *out);

static int staff_read(int argc, char **argv) {
  static const struct option opts[] = {{"dataset", required_argument, NULL, O_DATASET},
                                       {"artifact", required_argument, NULL, O_ARTIFACT},
                                       {"output", required_argument, NULL, 'o'},
                                       LT_CLI_API_OPTIONS,
                                       {0}};
  lt_cli_opts_t o = {0};
  lt_cli_args_t a = {.what = "admin access read", .usage = usage_staff, .opts = opts, .min = 1, .max = 1};
  const char *dataset = NULL, *artifact = NULL, *out = NULL;
  int c, rc;
  while ((c = next(&o, &a, argc, argv)) >= 0) {
    if (c == O_DATASET) dataset = a.value;
    else if (c == O_ARTIFACT) artifact = a.value;
    else out = a.value;
  }
  if (c != LT_CLI_ARGS_END) rc = a.status;
  else if (!!dataset == !!artifact || (artifact && !strchr(artifact, '/')))
    rc = lt_cli_args_fail(&a, "want ID and one of --dataset D or --artifact JOB/NAME");
  else rc = staff_read_to(&o, a.operands[0], dataset, artifact, out);
  lt_cli_close(&o);
  return rc;
}

static int staff_read_to(lt_cli_opts_t *o, const char *id, const char *dataset, const char *artifact, const char *out) {
  const char *slash = artifact ? strchr(artifact, '/') : NULL;
  char path[1024], suffix[600];
  if (dataset) snprintf(suffix, sizeof suffix, "/datasets/%s", dataset);
  else snprintf(suffix, sizeof suffix, "/jobs/%.*s/artifacts/%s", (int)(slash - artifact), artifact, slash + 1);
  if (!lt_cli_path_id(path, sizeof path, "/v1/staff/access/", id, suffix)) return 2;
  lt_client_resp_t resp;
  bool json = o->json;
  o->json = false; /* the body is the tenant's data, not JSON to echo */
  int rc = lt_cli_call(o, "admin access read", "GET", path, NULL, NULL, &resp);
  o->json = json;
  if (rc) return rc;
  FILE *f = out ? fopen(out, "wb") : stdout;
  bool wrote = f && fwrite(resp.body, 1, resp.len, f) == resp.len;
  if (f && out && fclose(f) != 0) wrote = false; /* closed whatever the write gave */
  if (!wrote) {
    fprintf(stderr, "lathe admin access read: cannot write %s\n", out ? out : "stdout");
    rc = 1;
  } else if (out) {
    fprintf(stderr, "wrote %zu bytes to %s (this read is in the tenant's audit log)\n", resp.len, out);
  }
  lt_client_resp_free(&resp);
  return rc;
}

static int staff_list(int argc, char **argv) { return list(argc, argv, usage_staff); }
static int staff_decision(int argc, char **argv) { return decision(argc, argv, usage_staff); }

int lt_cli_admin_access(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"request", staff_request}, {"list", staff_list},
                                        {"read", staff_read},       {"show", staff_decision},
                                        {"approve", staff_decision}, {"revoke", staff_decision}};
  return lt_cli_args_dispatch("admin access", usage_staff, verbs, sizeof verbs / sizeof *verbs, lt_cli_api_options,
                              argc, argv);
}

static int staff_add(int argc, char **argv) {
  static const struct option opts[] = {{"file", required_argument, NULL, 'f'}, {0}};
  lt_cli_args_t a = {.what = "admin staff add", .usage = usage_staff, .opts = opts, .min = 1, .max = 1};
  const char *file = NULL;
  int c;
  while ((c = lt_cli_args_next(&a, argc, argv)) >= 0) file = a.value;
  if (c != LT_CLI_ARGS_END) return a.status;
  const char *name = a.operands[0];
  char key[LT_ACCESS_STAFF_KEY_SIZE], line[256], err[256];
  if (lt_access_staff_key_new(name, key, line, sizeof line, err, sizeof err)) {
    fprintf(stderr, "lathe admin staff add: %s\n", err);
    return 2;
  }
  if (file) {
    FILE *f = fopen(file, "a");
    if (!f || fprintf(f, "%s\n", line) < 0 || fclose(f)) {
      fprintf(stderr, "lathe admin staff add: cannot append to %s\n", file);
      return 1;
    }
    fprintf(stderr, "added %s to %s; the API reads it at start (LATHE_STAFF_KEYS_FILE)\n", name, file);
  } else {
    printf("%s\n", line);
    fprintf(stderr, "append the line above to the staff keys file (LATHE_STAFF_KEYS_FILE)\n");
  }
  printf("staff key for %s (shown once, store it now): %s\n", name, key);
  return 0;
}

int lt_cli_admin_staff(int argc, char **argv) {
  static const lt_cli_verb_t verbs[] = {{"add", staff_add}};
  return lt_cli_args_dispatch("admin staff", usage_staff, verbs, 1, NULL, argc, argv);
}
