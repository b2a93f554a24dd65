/* lt_api: the HTTP server's core — the route table, the router, the operator port (/healthz,
 * /metrics), and the life cycle.
 * The router decodes the path, finds the route family by prefix, authenticates, splits the rest
 * as that family spells it, has the family look up {id}, then calls the row of the table that has
 * the path's pattern and the request's method. Handlers answer through lt_api_reply.c and never
 * call back here. See lt_api.h for the routes and lt_api_int.h for the files. */
#include "lt_api_int.h"
#include "lt_web.h"
#include "lt_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reply_health(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  /* digest: the projection's job-state digest, so a restart or replay can be compared. */
  char digest[65] = "";
  lt_api_digest(api, digest);
  json_t *body = json_pack("{s:s,s:b,s:I,s:I,s:s}", "status", api->ready ? "ok" : "starting", "ready", api->ready,
                           "jobs", (json_int_t)lt_job_count(lt_proj_jobs(api->proj)), "records_folded",
                           (json_int_t)lt_proj_applied(api->proj), "digest", digest);
  /* starting: which partition it still reads toward its start-up watermark */
  if (!api->ready && api->waiting_for[0]) json_object_set_new(body, "waiting_for", json_string(api->waiting_for));
  lt_api_reply_json(c->req, api->ready ? 200 : 503, body);
}

/* ---------------------------------------------------------------- the route table */

#define ANY 0 /* any method the server allows */

typedef struct lt_api_route {
  int method;                 /* an EVHTTP_REQ_* value, or ANY */
  const char *path;           /* pattern: {id} one segment, {n} a number, {name} the rest */
  lt_api_handler_fn *handler;
  lt_api_slot_t slot;         /* the family, for /metrics */
} lt_api_route_t;

/* The customer port's routes. /healthz and /metrics are on the operator port only
 * (on_operator_request): /metrics names every tenant. */

static const lt_api_route_t routes[] = {
    {EVHTTP_REQ_POST, "/v1/jobs", lt_api_jobs_submit, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs", lt_api_jobs_list, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs/{id}", lt_api_jobs_show, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_DELETE, "/v1/jobs/{id}", lt_api_jobs_delete, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_POST, "/v1/jobs/{id}/cancel", lt_api_jobs_cancel, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs/{id}/events", lt_api_events_stream, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs/{id}/checkpoints", lt_api_jobs_checkpoints, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs/{id}/artifacts", lt_api_jobs_artifacts, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/jobs/{id}/artifacts/{name}", lt_api_jobs_artifacts, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_POST, "/v1/datasets", lt_api_datasets_upload, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_GET, "/v1/datasets", lt_api_datasets_list, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_GET, "/v1/datasets/{id}", lt_api_datasets_show, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_DELETE, "/v1/datasets/{id}", lt_api_datasets_delete, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_POST, "/v1/uploads", lt_api_uploads_open, LT_API_SLOT_UPLOADS},
    {EVHTTP_REQ_PUT, "/v1/uploads/{id}/parts/{n}", lt_api_uploads_part, LT_API_SLOT_UPLOADS},
    {EVHTTP_REQ_POST, "/v1/uploads/{id}/complete", lt_api_uploads_complete, LT_API_SLOT_UPLOADS},
    {EVHTTP_REQ_DELETE, "/v1/uploads/{id}", lt_api_uploads_abort, LT_API_SLOT_UPLOADS},
    {EVHTTP_REQ_GET, "/v1/access", lt_api_access_list, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_GET, "/v1/access/{id}", lt_api_access_show, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/access/{id}/approve", lt_api_access_approve, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/access/{id}/deny", lt_api_access_deny, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/access/{id}/revoke", lt_api_access_revoke, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/staff/access", lt_api_staff_access_request, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_GET, "/v1/staff/access", lt_api_staff_access_list, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_GET, "/v1/staff/access/{id}", lt_api_staff_access_show, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/staff/access/{id}/approve", lt_api_staff_access_approve, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/staff/access/{id}/revoke", lt_api_staff_access_revoke, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_GET, "/v1/staff/access/{id}/datasets/{name}", lt_api_staff_access_read_dataset, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_GET, "/v1/staff/access/{id}/jobs/{name}", lt_api_staff_access_read_artifact, LT_API_SLOT_ACCESS},
    {EVHTTP_REQ_POST, "/v1/sessions", lt_api_sessions_create, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions", lt_api_sessions_list, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}", lt_api_sessions_show, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_DELETE, "/v1/sessions/{id}", lt_api_sessions_delete, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_POST, "/v1/sessions/{id}/cancel", lt_api_jobs_cancel, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_POST, "/v1/sessions/{id}/calls", lt_api_sessions_call, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/calls/{name}", lt_api_sessions_call_show, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/events", lt_api_events_stream, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/artifacts", lt_api_jobs_artifacts, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_GET, "/v1/sessions/{id}/artifacts/{name}", lt_api_jobs_artifacts, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_POST, "/v1/tokenize", lt_api_tokenize, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_POST, "/v1/detokenize", lt_api_detokenize, LT_API_SLOT_SESSIONS},
    {EVHTTP_REQ_POST, "/v1/completions", lt_api_sample_completions, LT_API_SLOT_SAMPLE},
    {EVHTTP_REQ_POST, "/v1/chat/completions", lt_api_sample_chat, LT_API_SLOT_SAMPLE},
    {EVHTTP_REQ_GET, "/v1/models", lt_api_sample_models, LT_API_SLOT_SAMPLE},
    {EVHTTP_REQ_GET, "/v1/usage", lt_api_usage, LT_API_SLOT_OTHER},
    /* OpenAI's fine-tuning API over the same state (lt_api_openai.c) */
    {EVHTTP_REQ_POST, "/v1/files", lt_api_openai_files_create, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_GET, "/v1/files", lt_api_datasets_list, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_GET, "/v1/files/{id}", lt_api_datasets_show, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_DELETE, "/v1/files/{id}", lt_api_datasets_delete, LT_API_SLOT_DATASETS},
    {EVHTTP_REQ_POST, "/v1/fine_tuning/jobs", lt_api_openai_jobs_create, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/fine_tuning/jobs", lt_api_openai_jobs_list, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/fine_tuning/jobs/{id}", lt_api_openai_jobs_show, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_POST, "/v1/fine_tuning/jobs/{id}/cancel", lt_api_jobs_cancel, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/fine_tuning/jobs/{id}/events", lt_api_openai_jobs_events, LT_API_SLOT_JOBS},
    {EVHTTP_REQ_GET, "/v1/fine_tuning/jobs/{id}/checkpoints", lt_api_openai_jobs_checkpoints, LT_API_SLOT_JOBS},
};

/* Routes an admin key's alone: they delete the tenant's data or open it to staff (a member key,
 * made for automation, gets 403 and nothing is touched). What each does, for the answer. A member
 * key may still cancel a job or end a session, whose checkpoints go when the publisher cleans up
 * after them, abort an upload, and deny or revoke staff access: those stop work or close a door,
 * as automation must be able to. (DELETE /v1/sessions/{id} ends a session for a member key; with
 * purge=true it deletes one, an admin key's alone: lt_api_sessions_delete checks.) */
static const struct {
  int method;
  const char *path, *what;
} admin_routes[] = {
    {EVHTTP_REQ_DELETE, "/v1/jobs/{id}", "deleting a job shreds its artifacts and checkpoints"},
    {EVHTTP_REQ_DELETE, "/v1/datasets/{id}", "deleting a dataset destroys it"},
    {EVHTTP_REQ_DELETE, "/v1/files/{id}", "deleting a file destroys its dataset"},
    {EVHTTP_REQ_POST, "/v1/access/{id}/approve", "approving staff access opens the tenant's data to staff"},
};

/* ---------------------------------------------------------------- route families */

/* The path after a family's prefix, taken apart (lt_api_int.h). */
typedef lt_api_match_t path_t;

/* Splits rest (the path after prefix: "", "/..." or "?...") into p; false when it names
 * nothing the family has. */
typedef bool parse_fn(const char *prefix, const char *rest, path_t *p);

static bool is_collection(const char *rest) { return *rest == '\0' || strcmp(rest, "/") == 0; }

/* /v1/jobs/{id}[/{sub}[/{name}]]: {name} is the rest of the path; "/{sub}/" is "/{sub}". */
static bool parse_jobs(const char *prefix, const char *rest, path_t *p) {
  if (is_collection(rest)) return true;
  char sub[64] = "";
  const char *s = rest + 1, *slash = strchr(s, '/');
  size_t idlen = slash ? (size_t)(slash - s) : strlen(s);
  if (idlen == 0 || idlen > LT_ID_MAX) return false;
  memcpy(p->id, s, idlen);
  p->id[idlen] = '\0';
  if (slash) {
    const char *s2 = strchr(slash + 1, '/');
    snprintf(sub, sizeof sub, "%.*s", (int)(s2 ? s2 - slash - 1 : (long)strlen(slash + 1)), slash + 1);
    if (s2) snprintf(p->name, sizeof p->name, "%s", s2 + 1);
    snprintf(p->pattern, sizeof p->pattern, "%s/{id}/%s%s", prefix, sub, p->name[0] ? "/{name}" : "");
  } else {
    snprintf(p->pattern, sizeof p->pattern, "%s/{id}", prefix);
  }
  return true;
}

/* /v1/datasets/{id}: everything after the slash is the id. */
static bool parse_datasets(const char *prefix, const char *rest, path_t *p) {
  if (is_collection(rest)) return true;
  if (!lt_id_valid(rest + 1)) return false;
  snprintf(p->id, sizeof p->id, "%s", rest + 1);
  snprintf(p->pattern, sizeof p->pattern, "%s/{id}", prefix);
  return true;
}

/* /v1/uploads/{id}[/{what}[/{n}]], read leniently: whatever follows a field that does not parse
 * is ignored. */
static bool parse_uploads(const char *prefix, const char *rest, path_t *p) {
  if (is_collection(rest)) return true;
  char what[32] = "";
  if (sscanf(rest, "/%63[A-Za-z0-9._-]/%31[a-z]/%d", p->id, what, &p->part) < 1) return false;
  if (strcmp(what, "parts") == 0) snprintf(p->pattern, sizeof p->pattern, "%s/{id}/parts/{n}", prefix);
  else snprintf(p->pattern, sizeof p->pattern, "%s/{id}%s%s", prefix, what[0] ? "/" : "", what);
  return true;
}

/* What a path under a prefix can name, and how the family answers one the table does not serve. */
typedef struct route_family {
  const char *prefix;
  lt_api_slot_t slot;
  parse_fn *parse;
  lt_api_resolve_fn *resolve; /* looks up {id} before any method is considered */
  const char *nothing;        /* the 404 message for a path that names nothing */
  bool collection_405;        /* the collection with another method: 405 (else the 404 above) */
  bool item_405;              /* {id} with another route: 405 (else 404 "no such route under") */
  bool staff;                 /* authenticated by a staff key (lt_access.h), not a tenant's */
  bool sampler;               /* served by the sampler role too (lt_api_conf_t.sampler_only) */
  bool openai;                /* OpenAI-compatible: the handlers answer in its shapes */
} route_family_t;

static const route_family_t families[] = {
    {"/v1/jobs", LT_API_SLOT_JOBS, parse_jobs, lt_api_jobs_resolve, "no such job", true, false, false, false, false},
    {"/v1/datasets", LT_API_SLOT_DATASETS, parse_datasets, lt_api_datasets_resolve, "no such dataset",
     true, true, false, false, false},
    {"/v1/uploads", LT_API_SLOT_UPLOADS, parse_uploads, lt_api_uploads_resolve, "no such upload",
     false, false, false, false, false},
    {"/v1/access", LT_API_SLOT_ACCESS, parse_jobs, lt_api_access_resolve, "no such access request",
     true, false, false, false, false},
    {"/v1/staff/access", LT_API_SLOT_ACCESS, parse_jobs, lt_api_staff_access_resolve, "no such access request", true,
     false, true, false, false},
    {"/v1/sessions", LT_API_SLOT_SESSIONS, parse_jobs, lt_api_sessions_resolve, "no such session",
     true, false, false, false, false},
    {"/v1/tokenize", LT_API_SLOT_SESSIONS, parse_jobs, lt_api_sample_resolve, "no such route",
     true, false, false, true, false},
    {"/v1/detokenize", LT_API_SLOT_SESSIONS, parse_jobs, lt_api_sample_resolve, "no such route",
     true, false, false, true, false},
    {"/v1/completions", LT_API_SLOT_SAMPLE, parse_jobs, lt_api_sample_resolve, "no such route",
     true, false, false, true, false},
    {"/v1/chat/completions", LT_API_SLOT_SAMPLE, parse_jobs, lt_api_sample_resolve, "no such route",
     true, false, false, true, false},
    {"/v1/models", LT_API_SLOT_SAMPLE, parse_jobs, lt_api_sample_resolve, "no such route", true, false, false, true, false},
    {"/v1/usage", LT_API_SLOT_OTHER, parse_jobs, lt_api_sample_resolve, "no such route", true, false, false, false,
     false},
    {"/v1/files", LT_API_SLOT_DATASETS, parse_datasets, lt_api_datasets_resolve, "no such file", true, true, false,
     false, true},
    {"/v1/fine_tuning/jobs", LT_API_SLOT_JOBS, parse_jobs, lt_api_jobs_resolve, "no such fine-tuning job", true, false,
     false, false, true},
};

/* ---------------------------------------------------------------- routing */

/* The tenant of the request's API key, within the rate limits (docs/DESIGN.md §5a): an address
 * that failed too often is refused before its key is looked at; then the key's and the tenant's
 * buckets; the key's id into key_id. NULL after replying 401 or 429. */
static const lt_tenant_t *authenticate(lt_api_t *api, struct evhttp_request *req,
                                       char key_id[LT_TENANT_KEY_ID_LEN + 1]) {
  if (!api->ready) {
    /* Until the tenants are read back a good key would look revoked: say "not yet" instead. */
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    lt_api_reply_error(req, 503, "starting", NULL, "the API is starting (reading the log); retry in a moment");
    return NULL;
  }
  if (!lt_api_door_addr(api, req, false)) return NULL;
  const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
  const lt_tenant_t *t = NULL;
  const char *staff;
  /* A staff key reaches customer data only under a grant (/v1/staff/access): to it, every
   * customer route is one that does not exist. */
  if (h && strncmp(h, "Bearer ", 7) == 0 && lt_access_staff_authenticate(api->staff, h + 7, &staff) == LT_OK) {
    lt_api_reply_error(req, 404, "not_found", NULL, "no such route for a staff key: staff read customer data only "
                                                    "under an approved grant, through /v1/staff/access");
    return NULL;
  }
  if (!h || strncmp(h, "Bearer ", 7) != 0 ||
      lt_tenant_authenticate(lt_proj_tenants(api->proj), h + 7, &t) != LT_OK) {
    lt_api_door_addr(api, req, true);
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    lt_api_reply_error(req, 401, "unauthorized", NULL,
                       h ? "the API key is not valid (revoked, unknown or malformed)"
                         : "missing \"Authorization: Bearer <api key>\" header");
    return NULL;
  }
  /* A key that authenticated is "lt_<key_id>_<secret>". */
  snprintf(key_id, LT_TENANT_KEY_ID_LEN + 1, "%s", h + 7 + 3);
  return lt_api_door_tenant(api, req, t->tenant_id, key_id) ? t : NULL;
}

/* Strips prefix from path; returns the rest ("" or "/..."), or NULL when path is elsewhere. */
static const char *under(const char *path, const char *prefix) {
  size_t n = strlen(prefix);
  if (strncmp(path, prefix, n) != 0) return NULL;
  if (path[n] != '\0' && path[n] != '/' && path[n] != '?') return NULL;
  return path + n;
}

static const route_family_t *find_family(const char *path, const char **rest) {
  for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
    const route_family_t *f = &families[i];
    if ((*rest = under(path, f->prefix))) return f;
  }
  return NULL;
}

static const lt_api_route_t *find_route(const char *pattern, int method) {
  for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
    if (strcmp(routes[i].path, pattern) == 0 && (routes[i].method == ANY || routes[i].method == method))
      return &routes[i];
  return NULL;
}

static const struct {
  int method;
  const char *name;
} methods_served[] = {
    {EVHTTP_REQ_GET, "GET"}, {EVHTTP_REQ_POST, "POST"}, {EVHTTP_REQ_PUT, "PUT"}, {EVHTTP_REQ_DELETE, "DELETE"}};

static const char *method_name(int method) {
  for (size_t i = 0; i < sizeof methods_served / sizeof *methods_served; i++)
    if (methods_served[i].method == method) return methods_served[i].name;
  return "this method on";
}

/* The least role a key needs for route r (roles are ordered: a larger one may do less): a GET
 * reads (a viewer), the routes of admin_routes are an admin's, every other one changes the
 * tenant's state (a member). What the route does into what (n bytes), for a 403. */
static lt_tenant_role_t role_needed(const lt_api_route_t *r, const char *pattern, char *what, size_t n) {
  for (size_t i = 0; i < sizeof admin_routes / sizeof *admin_routes; i++)
    if (admin_routes[i].method == r->method && strcmp(admin_routes[i].path, r->path) == 0) {
      snprintf(what, n, "%s", admin_routes[i].what);
      return LT_TENANT_ROLE_ADMIN;
    }
  snprintf(what, n, "%s %s changes the tenant's state", method_name(r->method), pattern);
  return r->method == EVHTTP_REQ_GET ? LT_TENANT_ROLE_VIEWER : LT_TENANT_ROLE_MEMBER;
}

/* A path the family knows, asked with a method (or sub-route) the table does not have. */
static void reply_no_route(const route_family_t *f, const lt_api_call_t *c, const char *pattern) {
  if (!c->id[0] && !f->collection_405) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "%s", f->nothing);
  } else if (c->id[0] && !f->item_405) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "no such route under %s/%s", f->prefix, c->id);
  } else {
    char methods[64] = "";
    for (size_t i = 0; i < sizeof methods_served / sizeof *methods_served; i++)
      if (find_route(pattern, methods_served[i].method))
        snprintf(methods + strlen(methods), sizeof methods - strlen(methods), "%s%s", methods[0] ? " or " : "",
                 methods_served[i].name);
    lt_api_reply_error(c->req, 405, "method_not_allowed", NULL, "use %s on %s%s%s", methods, f->prefix,
                       c->id[0] ? "/" : "", c->id);
  }
}

void lt_api_match(const char *path, int method, lt_api_match_t *m) {
  memset(m, 0, sizeof *m);
  m->family = -1;
  const char *rest;
  const route_family_t *f = find_family(path, &rest);
  if (!f) return;
  m->family = (int)(f - families);
  m->prefix = f->prefix;
  snprintf(m->pattern, sizeof m->pattern, "%s", f->prefix);
  if (!(m->parsed = f->parse(f->prefix, rest, m))) return;
  const lt_api_route_t *r = find_route(m->pattern, method);
  if (r) m->handler = r->handler;
}

/* Routes one request with a decoded path; returns the family's slot for the counters. The path
 * is matched first (lt_api_match, pure); what the request is told follows from the match in
 * this order: no family, a family the sampler does not serve, authentication, a path the family
 * does not have, an {id} the tenant does not have, then the handler or a 404/405. */
static lt_api_slot_t route(lt_api_t *api, struct evhttp_request *req, const char *path) {
  /* The dashboard's static files: public, they hold no data (lt_web.h). */
  if (!api->conf.sampler_only && lt_web_serve(req, path)) return LT_API_SLOT_OTHER;
  int method = evhttp_request_get_command(req);
  lt_api_match_t p;
  lt_api_match(path, method, &p);
  if (p.family < 0) {
    lt_api_reply_error(req, 404, "not_found", NULL, "no such route: %s", path);
    return LT_API_SLOT_OTHER;
  }
  const route_family_t *f = &families[p.family];
  /* The sampler role serves sampling (and the tokenizer) only; the api role everything else. */
  if (api->conf.sampler_only && !f->sampler) {
    lt_api_reply_error(req, 404, "not_found", NULL, "no such route on the sampler: %s is served by the api", f->prefix);
    return f->slot;
  }
  lt_api_call_t c = {.api = api, .req = req, .id = p.id, .name = p.name, .openai = f->openai};
  if (f->staff ? !(c.staff = lt_api_staff_authenticate(api, req)) : !(c.tenant = authenticate(api, req, c.key_id)))
    return f->slot;
  /* An inference key samples: what the sampler serves (the families marked sampler, whose every
   * route is sampling, the model list or the tokenizer, and none of which looks an {id} up), and
   * nothing else; refused before any id is looked up, so that it cannot tell the tenant's jobs or
   * datasets from none either. */
  const lt_tenant_key_t *k = c.tenant ? lt_tenant_key(c.tenant, c.key_id) : NULL;
  if (k && k->role == LT_TENANT_ROLE_INFERENCE && !f->sampler) {
    lt_api_reply_error(req, 403, "forbidden", NULL,
                       "API key %s of tenant %s is an inference key: it may call /v1/completions, "
                       "/v1/chat/completions, /v1/models, /v1/tokenize and /v1/detokenize, not %s",
                       c.key_id, c.tenant->tenant_id, f->prefix);
    return f->slot;
  }
  if (!p.parsed) {
    lt_api_reply_error(req, 404, "not_found", NULL, "%s", f->nothing);
    return f->slot;
  }
  c.part = p.part;
  if (p.id[0] && !f->resolve(&c)) return f->slot;
  const lt_api_route_t *r = find_route(p.pattern, method);
  char what[sizeof p.pattern + 96];
  lt_tenant_role_t needed = r && c.tenant ? role_needed(r, p.pattern, what, sizeof what) : LT_TENANT_ROLE_VIEWER;
  lt_tenant_role_t role = k ? k->role : LT_TENANT_ROLE_VIEWER; /* staff: their own checks */
  if (r && c.tenant && role != LT_TENANT_ROLE_INFERENCE && role > needed)
    lt_api_reply_error(req, 403, "forbidden", NULL,
                       "API key %s of tenant %s is a %s key, and %s: that needs %s (an operator makes one)", c.key_id,
                       c.tenant->tenant_id, lt_tenant_role_name(role), what,
                       needed == LT_TENANT_ROLE_ADMIN ? "one of the tenant's admin keys" : "a member or admin key");
  else if (r) r->handler(&c);
  else reply_no_route(f, &c, p.pattern);
  json_decref(c.meta);
  return r ? r->slot : f->slot;
}

/* The operator port: /healthz, /metrics and /debug/jobs (every job's state as the digest hashes
 * it, to compare two processes job by job), nothing else. */
static lt_api_slot_t route_operator(lt_api_t *api, struct evhttp_request *req, const char *path) {
  lt_api_call_t c = {.api = api, .req = req, .id = "", .name = ""};
  bool health = strcmp(path, "/healthz") == 0, metrics = strcmp(path, "/metrics") == 0,
       jobs = strcmp(path, "/debug/jobs") == 0;
  if (!health && !metrics && !jobs) {
    lt_api_reply_error(req, 404, "not_found", NULL,
                       "no such route: %s (the operator port serves /healthz, /metrics and /debug/jobs)", path);
    return LT_API_SLOT_OTHER;
  }
  if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
    lt_api_reply_error(req, 405, "method_not_allowed", NULL, "use GET on %s", path);
  } else if (health) {
    reply_health(&c);
  } else if (jobs) {
    char digest[65] = "";
    lt_api_digest(api, digest);
    lt_api_reply_json(req, 200, json_pack("{s:s,s:o}", "digest", digest, "jobs", lt_proj_job_lines(api->proj)));
  } else {
    lt_api_metrics_reply(&c);
  }
  return metrics ? LT_API_SLOT_METRICS : LT_API_SLOT_HEALTH;
}

/* Decodes the request's path and hands it to route (the customer port) or route_operator. */
static void serve(lt_api_t *api, struct evhttp_request *req, bool operator) {
  int64_t t0 = lt_time_mono_us();
  const char *uri = evhttp_request_get_uri(req);
  struct evhttp_uri *parsed = evhttp_uri_parse(uri);
  const char *path = parsed ? evhttp_uri_get_path(parsed) : NULL;
  size_t dlen = 0;
  char *decoded = path ? evhttp_uridecode(path, 0, &dlen) : NULL;
  lt_api_slot_t slot = LT_API_SLOT_OTHER;
  if (api->closing) {
    evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    lt_api_reply_error(req, 503, "unavailable", NULL, "this API process is shutting down; retry");
  } else if (!operator && !lt_api_door_admit(api, req)) slot = LT_API_SLOT_OTHER;
  else if (!decoded) lt_api_reply_error(req, 400, "invalid", NULL, "the request URI cannot be parsed");
  else if (strlen(decoded) != dlen) lt_api_reply_error(req, 400, "invalid", NULL, "the path holds a NUL byte");
  else slot = operator ? route_operator(api, req, decoded) : route(api, req, decoded);
  free(decoded);
  if (parsed) evhttp_uri_free(parsed);
  /* A request not answered yet (a submission waiting for the broker) is counted when it is, with
   * the status it gets: a 503 must not count as a success. */
  int code = evhttp_request_get_response_code(req);
  if (code || operator || !lt_api_door_count_later(api, req, slot, t0))
    lt_api_metrics_observe(api, slot, code, lt_time_mono_us() - t0);
}

static void on_request(struct evhttp_request *req, void *arg) { serve(arg, req, false); }
static void on_operator_request(struct evhttp_request *req, void *arg) { serve(arg, req, true); }

/* ---------------------------------------------------------------- life cycle */

/* Makes an HTTP server on addr:port with the front door on it (port 0: any free port, read
 * back into *bound). */
static lt_err_t listen_http(lt_api_t *api, struct evhttp **out, const char *addr, uint16_t port, bool operator,
                            uint16_t *bound, char *errstr, size_t n) {
  struct evhttp *http = *out = evhttp_new(api->base);
  if (!http) return lt_errf(errstr, n, LT_ERR_NOMEM, "evhttp_new failed");
  evhttp_set_max_body_size(http, LT_API_PART_MAX + 4096);
  evhttp_set_max_headers_size(http, 16384);
  evhttp_set_timeout(http, 120);
  evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
  evhttp_set_gencb(http, operator ? on_operator_request : on_request, api);
  lt_err_t err = lt_api_door_open(api, http, !operator, errstr, n);
  if (err) return err;
  struct evhttp_bound_socket *s = evhttp_bind_socket_with_handle(http, addr, port);
  if (!s)
    return lt_errf(errstr, n, LT_ERR_IO, "cannot listen on %s:%u%s (in use, or not an address of this host)", addr,
                   port, operator ? " (the operator port)" : "");
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&ss, &sl);
  *bound = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  return LT_OK;
}

lt_err_t lt_api_new(struct event_base *base, const lt_api_conf_t *conf, lt_api_t **out, char *errstr, size_t n) {
  lt_api_t *api = calloc(1, sizeof *api);
  if (!api) return LT_ERR_NOMEM;
  api->conf = *conf;
  api->base = base;
  if (!api->conf.bind_addr) api->conf.bind_addr = "127.0.0.1";
  /* conf's strings may live on the caller's stack (lathed's start_api): keep a copy. */
  snprintf(api->producer_id, sizeof api->producer_id, "%s", conf->producer_id ? conf->producer_id : "api");
  api->conf.producer_id = api->producer_id;
  if (!api->conf.produce_timeout_ms) api->conf.produce_timeout_ms = 5000;
  if (!api->conf.max_json_body) api->conf.max_json_body = 65536;
  if (!api->conf.max_upload_bytes) api->conf.max_upload_bytes = 1ull << 30;
  if (!api->conf.max_open_uploads) api->conf.max_open_uploads = 4;
  if (!api->conf.max_saving_calls) api->conf.max_saving_calls = 256;
  if (!api->conf.upload_idle_ms) api->conf.upload_idle_ms = 10 * 60 * 1000;
  if (!api->conf.max_downloads) api->conf.max_downloads = 16;
  if (!api->conf.download_window) api->conf.download_window = 1u << 20;
  if (!api->conf.stream_backlog) api->conf.stream_backlog = 4u << 20;
  if (!api->conf.operator_bind_addr) api->conf.operator_bind_addr = "127.0.0.1";
  if (api->conf.max_connections <= 0) api->conf.max_connections = 1024;
  if (!api->conf.key_rate.per_s) api->conf.key_rate = (lt_api_rate_t){20, 40};
  if (!api->conf.tenant_rate.per_s) api->conf.tenant_rate = (lt_api_rate_t){50, 100};
  if (!api->conf.auth_fail_rate.per_s) api->conf.auth_fail_rate = (lt_api_rate_t){2, 30};
  if (api->conf.sse_history <= 0) api->conf.sse_history = 1024;
  if (api->conf.sse_keep_ended_ms <= 0) api->conf.sse_keep_ended_ms = 10 * 60 * 1000;
  lt_err_t err = LT_OK;
  api->reg = conf->registry;
  if (!api->reg) {
    err = lt_avro_registry_new(&api->own_registry, errstr, n);
    api->reg = api->own_registry;
  }
  if (!err) err = lt_proj_new(api->reg, &api->proj, errstr, n);
  if (!err && conf->tenant_mac) lt_proj_require_tenant_mac(api->proj, conf->tenant_mac);
  if (!err) err = lt_keyring_new(conf->kek, &api->keyring);
  if (!err) err = lt_avro_record_new(api->reg, "JobSubmitted", &api->rec_submit, errstr, n);
  if (!err) err = lt_avro_record_new(api->reg, "CancelRequested", &api->rec_cancel, errstr, n);
  if (!err) {
    api->history = lt_map_new(lt_api_history_free);
    api->datasets_seen = lt_map_new(NULL);
    api->cancels_sent = lt_map_new(NULL);
    api->stored_bytes = lt_map_new(free);
    api->usage_flight = lt_map_new(NULL); /* the tasks free themselves */
    api->submitting = lt_map_new(free);
    api->saving = lt_map_new(lt_api_saving_free);
    if (!api->history || !api->datasets_seen || !api->cancels_sent || !api->stored_bytes || !api->usage_flight ||
        !api->submitting || !api->saving)
      err = LT_ERR_NOMEM;
  }
  if (!err) err = lt_api_work_start(api, errstr, n);
  if (!err) err = lt_api_access_start(api, errstr, n);
  if (!err) err = lt_api_sessions_start(api, errstr, n);
  if (!err) err = lt_api_sample_start(api, errstr, n);
  if (!err) err = lt_api_feed_start(api, errstr, n);
  if (!err) err = listen_http(api, &api->http, api->conf.bind_addr, api->conf.port, false, &api->port, errstr, n);
  if (!err)
    err = listen_http(api, &api->ops_http, api->conf.operator_bind_addr, api->conf.operator_port, true, &api->ops_port,
                      errstr, n);
  if (err) {
    lt_api_destroy(api);
    return err;
  }
  *out = api;
  return LT_OK;
}

uint16_t lt_api_port(const lt_api_t *api) { return api->port; }
uint16_t lt_api_operator_port(const lt_api_t *api) { return api->ops_port; }
bool lt_api_ready(const lt_api_t *api) { return api->ready; }
lt_err_t lt_api_digest(lt_api_t *api, char out_hex[65]) { return lt_job_digest(lt_proj_jobs(api->proj), out_hex); }

void lt_api_destroy(lt_api_t *api) {
  if (!api) return;
  api->closing = true;            /* a request that still comes in answers 503 */
  lt_api_work_stop(api);          /* answers what is still in the pool */
  lt_api_feed_settle(api);        /* and what waits for the broker, while evhttp holds it */
  lt_api_access_settle(api);      /* and access records waiting for the feed */
  lt_api_download_stop_all(api);
  /* the feed and the tick fold into and prune the sessions freed next: neither runs again */
  if (api->consumer_ev) event_del(api->consumer_ev);
  if (api->tick_ev) event_del(api->tick_ev);
  lt_api_sessions_free(api);      /* long polls go unanswered: their connections are going */
  lt_api_door_flush(api, 1000);   /* the answers above reach their sockets */
  if (api->http) evhttp_free(api->http);
  if (api->ops_http) evhttp_free(api->ops_http);
  lt_api_events_free(api);
  lt_api_door_free(api);
  lt_api_uploads_free(api);
  if (api->consumer_ev) event_free(api->consumer_ev);
  if (api->tick_ev) event_free(api->tick_ev);
  lt_bus_consumer_destroy(api->consumer);
  /* Records still in flight get their delivery report (and free their pending) here. */
  if (api->producer) {
    lt_bus_producer_destroy(api->producer, 5000);
    event_base_loop(api->base, EVLOOP_NONBLOCK);
  }
  lt_avro_record_destroy(api->rec_submit);
  lt_avro_record_destroy(api->rec_cancel);
  lt_avro_record_destroy(api->rec_call);
  lt_api_access_free(api);
  lt_keyring_destroy(api->keyring);
  lt_proj_destroy(api->proj);
  lt_avro_registry_destroy(api->own_registry);
  lt_map_destroy(api->history);
  lt_map_destroy(api->datasets_seen);
  lt_map_destroy(api->cancels_sent);
  lt_map_destroy(api->stored_bytes);
  lt_map_destroy(api->usage_flight);
  lt_map_destroy(api->submitting);
  lt_map_destroy(api->saving);
  lt_map_destroy(api->adapters_refused);
  free(api->feed_parts);
  free(api->feed_low);
  free(api->feed_names);
  free(api);
}
