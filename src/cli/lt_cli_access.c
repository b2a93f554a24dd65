/* lathe access / lathe admin access / lathe admin staff: the staff-access lockbox from the
 * command line (the routes are in src/control/lt_api_access.c; the rules in lt_access.h).
 *
 *   tenants (LATHE_API_KEY or --api-key):
 *     lathe access list | show ID | approve ID | deny ID [--reason TEXT] | revoke ID [--reason TEXT]
 *   staff (LATHE_STAFF_KEY or --api-key):
 *     lathe admin access request --tenant T --scope S [--scope S...] --reason TEXT [--ttl 1h]
 *     lathe admin access list | show ID | approve ID | revoke ID [--reason TEXT]
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
             "       lathe admin access list | show ID | approve ID | revoke ID [--reason TEXT]\n"
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

/* ID [--reason TEXT] after the verb: the path of the decision and its body. */
static int decision(lt_cli_opts_t *o, const char *what, const char *prefix, int argc, char **argv) {
  const char *reason = NULL, *id = NULL;
  for (int i = 2; i < argc; i++) {
    if (strcmp(argv[i], "--reason") == 0 && i + 1 < argc) reason = argv[++i];
    else if (!id && argv[i][0] != '-') id = argv[i];
    else {
      fprintf(stderr, "%s: unexpected argument \"%s\"\n", what, argv[i]);
      return 2;
    }
  }
  char path[512], suffix[32];
  snprintf(suffix, sizeof suffix, "/%s", argv[1]);
  if (!id) {
    fprintf(stderr, "%s: which access request? (an ID from list)\n", what);
    return 2;
  }
  if (!lt_cli_path_id(path, sizeof path, prefix, id, strcmp(argv[1], "show") == 0 ? NULL : suffix)) return 2;
  bool show = strcmp(argv[1], "show") == 0;
  return call_and_print(o, what, show ? "GET" : "POST", path,
                        show ? NULL : json_pack("{s:s}", "reason", reason ? reason : ""));
}

int lt_cli_access(int argc, char **argv) {
  lt_cli_opts_t o;
  int rc = lt_cli_open(&o, "access", usage_tenant, &argc, argv);
  if (rc >= 0) return rc;
  const char *v = argv[1];
  if (strcmp(v, "list") == 0) rc = call_and_print(&o, "lathe access list", "GET", "/v1/access", NULL);
  else if (!strcmp(v, "show") || !strcmp(v, "approve") || !strcmp(v, "deny") || !strcmp(v, "revoke"))
    rc = decision(&o, "lathe access", "/v1/access/", argc, argv);
  else {
    fprintf(stderr, "lathe access: unknown command \"%s\"\n", v);
    usage_tenant(stderr);
    rc = 2;
  }
  lt_cli_close(&o);
  return rc;
}

/* ---------------------------------------------------------------- staff */

static int staff_request(lt_cli_opts_t *o, int argc, char **argv) {
  const char *tenant = NULL, *reason = NULL;
  long long ttl = 3600;
  json_t *scope = json_array();
  for (int i = 2; i < argc; i++) {
    bool has = i + 1 < argc;
    if (strcmp(argv[i], "--tenant") == 0 && has) tenant = argv[++i];
    else if (strcmp(argv[i], "--scope") == 0 && has) json_array_append_new(scope, json_string(argv[++i]));
    else if (strcmp(argv[i], "--reason") == 0 && has) reason = argv[++i];
    else if (strcmp(argv[i], "--ttl") == 0 && has) {
      if ((ttl = parse_ttl(argv[++i])) < 0) {
        fprintf(stderr, "lathe admin access request: --ttl \"%s\": want 90s, 30m, 1h or 2d\n", argv[i]);
        json_decref(scope);
        return 2;
      }
    } else {
      fprintf(stderr, "lathe admin access request: unexpected argument \"%s\"\n", argv[i]);
      json_decref(scope);
      return 2;
    }
  }
  if (!tenant || !reason || json_array_size(scope) == 0) {
    fprintf(stderr, "lathe admin access request: --tenant, --scope and --reason are required\n");
    json_decref(scope);
    return 2;
  }
  return call_and_print(o, "lathe admin access request", "POST", "/v1/staff/access",
                        json_pack("{s:s,s:o,s:s,s:I}", "tenant_id", tenant, "scope", scope, "justification", reason,
                                  "duration_s", (json_int_t)ttl));
}

static int staff_read(lt_cli_opts_t *o, int argc, char **argv) {
  const char *id = NULL, *dataset = NULL, *artifact = NULL, *out = NULL;
  for (int i = 2; i < argc; i++) {
    bool has = i + 1 < argc;
    if (strcmp(argv[i], "--dataset") == 0 && has) dataset = argv[++i];
    else if (strcmp(argv[i], "--artifact") == 0 && has) artifact = argv[++i];
    else if (strcmp(argv[i], "-o") == 0 && has) out = argv[++i];
    else if (!id && argv[i][0] != '-') id = argv[i];
    else {
      fprintf(stderr, "lathe admin access read: unexpected argument \"%s\"\n", argv[i]);
      return 2;
    }
  }
  const char *slash = artifact ? strchr(artifact, '/') : NULL;
  if (!id || !!dataset == !!artifact || (artifact && !slash)) {
    fprintf(stderr, "lathe admin access read: want ID and one of --dataset D or --artifact JOB/NAME\n");
    return 2;
  }
  char path[1024], suffix[600];
  if (dataset) snprintf(suffix, sizeof suffix, "/datasets/%s", dataset);
  else snprintf(suffix, sizeof suffix, "/jobs/%.*s/artifacts/%s", (int)(slash - artifact), artifact, slash + 1);
  if (!lt_cli_path_id(path, sizeof path, "/v1/staff/access/", id, suffix)) return 2;
  lt_client_resp_t resp;
  bool json = o->json;
  o->json = false; /* the body is the tenant's data, not JSON to echo */
  int rc = lt_cli_call(o, "lathe admin access read", "GET", path, NULL, NULL, &resp);
  o->json = json;
  if (rc) return rc;
  FILE *f = out ? fopen(out, "wb") : stdout;
  if (!f || fwrite(resp.body, 1, resp.len, f) != resp.len || (out && fclose(f))) {
    fprintf(stderr, "lathe admin access read: cannot write %s\n", out ? out : "stdout");
    rc = 1;
  }
  if (out) fprintf(stderr, "wrote %zu bytes to %s (this read is in the tenant's audit log)\n", resp.len, out);
  lt_client_resp_free(&resp);
  return rc;
}

int lt_cli_admin_access(int argc, char **argv) {
  bool has_key = false;
  for (int i = 1; i < argc; i++) has_key |= strcmp(argv[i], "--api-key") == 0;
  lt_cli_opts_t o;
  int rc = lt_cli_open(&o, "admin access", usage_staff, &argc, argv);
  if (rc >= 0) return rc;
  if (!has_key) lt_client_set_api_key(o.client, getenv("LATHE_STAFF_KEY"));
  const char *v = argv[1];
  if (strcmp(v, "request") == 0) rc = staff_request(&o, argc, argv);
  else if (strcmp(v, "list") == 0) rc = call_and_print(&o, "lathe admin access list", "GET", "/v1/staff/access", NULL);
  else if (strcmp(v, "read") == 0) rc = staff_read(&o, argc, argv);
  else if (!strcmp(v, "show") || !strcmp(v, "approve") || !strcmp(v, "revoke"))
    rc = decision(&o, "lathe admin access", "/v1/staff/access/", argc, argv);
  else {
    fprintf(stderr, "lathe admin access: unknown command \"%s\"\n", v);
    usage_staff(stderr);
    rc = 2;
  }
  lt_cli_close(&o);
  return rc;
}

int lt_cli_admin_staff(int argc, char **argv) {
  if (argc < 3 || strcmp(argv[1], "add") != 0) {
    usage_staff(stderr);
    return 2;
  }
  const char *name = argv[2], *file = argc == 5 && strcmp(argv[3], "--file") == 0 ? argv[4] : NULL;
  if (argc != 3 && !file) {
    usage_staff(stderr);
    return 2;
  }
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
