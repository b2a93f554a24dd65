/* lt_api_access: the staff-access lockbox's routes (docs/DESIGN.md §4 invariant 8, §5a).
 *
 * Tenants (their own API keys):
 *   GET  /v1/access                 every request for the tenant's data, with grants and uses
 *   GET  /v1/access/{id}
 *   POST /v1/access/{id}/approve    AccessApproved (approver "tenant:<key id>")
 *   POST /v1/access/{id}/deny       AccessDenied   {"reason": ...}
 *   POST /v1/access/{id}/revoke     AccessRevoked  {"reason": ...}
 * Staff (staff keys, lt_access.h):
 *   POST /v1/staff/access           AccessRequested {"tenant_id", "scope": [...], "justification", "duration_s"}
 *   GET  /v1/staff/access           the caller's own requests
 *   GET  /v1/staff/access/{id}      any request (a second approver must see what they approve)
 *   POST /v1/staff/access/{id}/approve   the second staff approval; never the requester's own
 *   POST /v1/staff/access/{id}/revoke
 *   GET  /v1/staff/access/{id}/datasets/{dataset}            a dataset's JSONL, under the grant
 *   GET  /v1/staff/access/{id}/jobs/{job}/artifacts/{name}   one artifact, under the grant
 *
 * A read under a grant writes AccessUsed to lathe.audit and waits for the broker's
 * acknowledgement before it reads a byte of the tenant's data; when the record cannot be written
 * the answer is 503 and nothing else. This file is the only place that decrypts customer data
 * for a staff principal. Every record this file writes carries the record MAC (lt_recmac.h), and
 * the fold refuses one without it. */
#include "lt_api_int.h"
#include "lt_time.h"

#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_dataset.h"
#include "lt_job_record.h"
#include "lt_log.h"
#include "lt_publisher.h"

static const char *const types[] = {"AccessRequested", "AccessApproved", "AccessDenied", "AccessRevoked",
                                    "AccessUsed"};

/* ---------------------------------------------------------------- start and fold */

lt_err_t lt_api_access_start(lt_api_t *api, char *errstr, size_t n) {
  lt_bus_topic_name(api->conf.bus, "audit", api->topic_audit, sizeof api->topic_audit);
  lt_err_t err = lt_access_table_new(api->conf.access_second_staff, &api->access);
  if (!err) err = lt_access_staff_load(api->conf.staff_keys_file, &api->staff, errstr, n);
  if (!err) err = lt_avro_decoder_new(api->reg, &api->audit_dec, errstr, n);
  if (!err && api->conf.kek) err = lt_recmac_key_new(api->conf.kek, LT_RECMAC_AUDIT, &api->audit_mac, errstr, n);
  for (size_t i = 0; !err && i < sizeof types / sizeof *types; i++)
    err = lt_avro_record_new(api->reg, types[i], &api->rec_access[i], errstr, n);
  return err;
}

void lt_api_access_free(lt_api_t *api) {
  free(api->audit_next);
  lt_access_table_destroy(api->access);
  lt_access_staff_destroy(api->staff);
  lt_avro_decoder_destroy(api->audit_dec);
  lt_recmac_key_destroy(api->audit_mac);
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) lt_avro_record_destroy(api->rec_access[i]);
}

/* Folds one record's bytes; the caller checked the MAC. */
static lt_err_t fold(lt_api_t *api, const void *v, size_t len, char *why, size_t n) {
  lt_avro_record_t *rec;
  lt_err_t err = lt_avro_decode(api->audit_dec, v, len, &rec, why, n);
  if (!err) err = lt_access_apply(api->access, rec, why, n);
  return err;
}

static void dead_letter_done(lt_api_t *api, void *ctx, lt_err_t err, const char *msg) {
  if (err) lt_log_error("api", "a refused audit record could not be dead-lettered: %s", msg);
}

/* A refused record goes to lathe.deadletter with the reason, once: only a record that arrived
 * while this API ran (at or past the partition's end when it started); older ones were
 * dead-lettered by the API that saw them arrive. */
static void dead_letter(lt_api_t *api, const lt_bus_msg_t *m, const char *reason) {
  int64_t hw = -1;
  for (size_t i = 0; i < api->nfeed; i++)
    if (strcmp(api->feed_parts[i].topic, lt_bus_msg_topic(m)) == 0 && api->feed_parts[i].partition == lt_bus_msg_partition(m))
      hw = api->feed_parts[i].offset;
  if (hw < 0 || lt_bus_msg_offset(m) < hw) return;
  lt_avro_record_t *rec = NULL;
  size_t klen = 0;
  const void *key = lt_bus_msg_key(m, &klen);
  const uint8_t *bytes;
  size_t len;
  char msg[256], topic[128];
  lt_err_t err = lt_avro_record_new(api->reg, "DeadLetter", &rec, msg, sizeof msg);
  if (!err)
    err = lt_avro_record_stamp(rec, api->conf.producer_id) ||
          lt_dead_letter_fill(rec, m, LT_ERR_AUTH, reason, api->conf.producer_id);
  if (!err) err = lt_avro_record_encode(rec, &bytes, &len, msg, sizeof msg);
  lt_bus_topic_name(api->conf.bus, "deadletter", topic, sizeof topic);
  char kstr[LT_ID_MAX + 1]; /* the original key (a tenant id), as the dead letter's key */
  snprintf(kstr, sizeof kstr, "%.*s", key ? (int)(klen < LT_ID_MAX ? klen : LT_ID_MAX) : 0, key ? (const char *)key : "");
  if (!err) err = lt_api_produce(api, topic, LT_BUS_PARTITION_ANY, kstr, bytes, len, false, dead_letter_done, NULL);
  if (err) lt_log_error("api", "a refused audit record could not be dead-lettered (%s)", lt_err_name(err));
  lt_avro_record_destroy(rec);
}

static void audit_folded(lt_api_t *api, int32_t part, int64_t offset);

void lt_api_access_on_record(lt_api_t *api, const lt_bus_msg_t *m) {
  size_t vlen = 0;
  const void *v = lt_bus_msg_value(m, &vlen);
  char why[512];
  if (!api->audit_mac || !lt_recmac_msg_ok(api->audit_mac, "audit", m, why, sizeof why)) {
    api->stats.refused++;
    lt_log_warn("api", "lathe.audit offset %lld refused: %s", (long long)lt_bus_msg_offset(m),
                api->audit_mac ? why : "no master key to check the record MAC");
    if (api->audit_mac) dead_letter(api, m, why);
  } else {
    lt_err_t err = fold(api, v, vlen, why, sizeof why);
    if (err && err != LT_ERR_EXISTS)
      lt_log_warn("api", "lathe.audit offset %lld ignored: %s", (long long)lt_bus_msg_offset(m), why);
  }
  audit_folded(api, lt_bus_msg_partition(m), lt_bus_msg_offset(m));
  lt_api_download_recheck(api); /* a revoke cuts the reads it closes */
}

/* ---------------------------------------------------------------- records out */

typedef void access_then_fn(lt_api_t *api, void *ctx, lt_err_t err);

/* A record this API wrote, waiting until the feed has folded its partition up to it: records
 * are folded in log order only, so what another API process wrote before it (a deny before this
 * approval, a revoke before this use) is known when it is answered. */
struct lt_api_audit_wait {
  lt_api_t *api;
  access_then_fn *then;
  void *ctx;
  int32_t partition;
  int64_t offset;
  struct event *timer; /* the bound: LT_API_AUDIT_WAIT_MS */
  struct lt_api_audit_wait *next;
};
typedef struct lt_api_audit_wait produced_t;

#define LT_API_AUDIT_WAIT_MS 15000 /* past the feed's 10 s stall healing (lt_api_feed.c) */

/* The next offset of audit partition part the feed will fold (0: none folded yet). */
static int64_t audit_next(const lt_api_t *api, int32_t part) {
  return part >= 0 && (size_t)part < api->naudit_next ? api->audit_next[part] : 0;
}

/* Unlinks p, answers it and frees it. */
static void wait_end(produced_t *p, lt_err_t err) {
  lt_api_t *api = p->api;
  for (produced_t **q = &api->audit_waits; *q; q = &(*q)->next)
    if (*q == p) {
      *q = p->next;
      break;
    }
  if (p->timer) event_free(p->timer);
  p->then(api, p->ctx, err);
  free(p);
}

static void wait_timeout(evutil_socket_t fd, short what, void *arg) {
  produced_t *p = arg;
  lt_log_warn("api", "lathe.audit partition %d: not folded up to this API's own record at offset %lld in %d ms",
              (int)p->partition, (long long)p->offset, LT_API_AUDIT_WAIT_MS);
  wait_end(p, LT_ERR_RETRIABLE); /* in the log, not read here yet: not the broker's own timeout */
}

/* The feed folded audit partition part up to offset: what waited for it is answered. */
static void audit_folded(lt_api_t *api, int32_t part, int64_t offset) {
  if (part < 0) return;
  if ((size_t)part >= api->naudit_next) {
    int64_t *v = realloc(api->audit_next, ((size_t)part + 1) * sizeof *v);
    if (!v) return; /* what waits for it runs into its bound */
    for (size_t i = api->naudit_next; i <= (size_t)part; i++) v[i] = 0;
    api->audit_next = v;
    api->naudit_next = (size_t)part + 1;
  }
  api->audit_next[part] = offset + 1;
  for (produced_t *p = api->audit_waits, *next; p; p = next) {
    next = p->next;
    if (p->partition == part && p->offset <= offset) wait_end(p, LT_OK);
  }
}

static void produced(lt_api_t *api, void *arg, lt_err_t err, const char *msg) {
  produced_t *p = arg;
  (void)msg;
  p->partition = api->done_partition;
  p->offset = api->done_offset;
  if (err || audit_next(api, p->partition) > p->offset) { /* failed, or folded already */
    p->then(api, p->ctx, err);
    free(p);
    return;
  }
  struct timeval tv = {LT_API_AUDIT_WAIT_MS / 1000, (LT_API_AUDIT_WAIT_MS % 1000) * 1000};
  if (!(p->timer = evtimer_new(api->base, wait_timeout, p)) || evtimer_add(p->timer, &tv)) {
    if (p->timer) event_free(p->timer);
    p->then(api, p->ctx, LT_ERR_NOMEM);
    free(p);
    return;
  }
  p->next = api->audit_waits;
  api->audit_waits = p;
}

void lt_api_access_settle(lt_api_t *api) {
  while (api->audit_waits) wait_end(api->audit_waits, LT_ERR_UNAVAILABLE);
}

/* Starts a record of one of the five types for request_id of tenant_id. */
static lt_avro_record_t *record_start(lt_api_t *api, int type, const char *request_id, const char *tenant_id) {
  lt_avro_record_t *rec = api->rec_access[type];
  lt_avro_record_clear(rec);
  if (lt_avro_record_stamp(rec, api->conf.producer_id) || lt_avro_set_string(rec, "request_id", request_id) ||
      lt_avro_set_string(rec, "tenant_id", tenant_id))
    return NULL;
  return rec;
}

/* Encodes rec, signs it and produces it to lathe.audit keyed by the tenant; then(ctx, err) runs on
 * the loop once the broker answered and the feed folded the log up to the record
 * (LT_ERR_RETRIABLE when it did not within LT_API_AUDIT_WAIT_MS; LT_ERR_TIMEOUT: the broker did
 * not answer in time, the outcome unknown). Replies 500/503 itself and returns false when it
 * cannot start. */
static bool send_record(lt_api_t *api, struct evhttp_request *req, lt_avro_record_t *rec, lt_err_t fill_err,
                        const char *tenant_id, access_then_fn *then, void *ctx) {
  const uint8_t *bytes;
  size_t len;
  char msg[256];
  if (fill_err || lt_avro_record_encode(rec, &bytes, &len, msg, sizeof msg)) {
    lt_api_reply_error(req, 500, "internal", NULL, "cannot encode the %s record: %s", lt_avro_record_type(rec),
                       lt_avro_record_error(rec));
    return false;
  }
  if (!api->audit_mac) {
    lt_api_reply_error(req, 503, "unavailable", NULL, "this API has no master key: it cannot sign access records");
    return false;
  }
  produced_t *p = calloc(1, sizeof *p);
  uint8_t mac[LT_RECMAC_BYTES];
  if (!p) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return false;
  }
  p->api = api;
  p->then = then;
  p->ctx = ctx;
  lt_recmac_sign(api->audit_mac, "audit", tenant_id, strlen(tenant_id), bytes, len, mac);
  lt_bus_header_t h = {.name = LT_RECMAC_HEADER, .value = mac, .size = sizeof mac};
  lt_err_t err = lt_api_produce_h(api, api->topic_audit, LT_BUS_PARTITION_ANY, tenant_id, bytes, len, &h, 1, false,
                                  produced, p);
  if (err) {
    free(p);
    lt_api_reply_err(req, LT_ERR_UNAVAILABLE, NULL, "the broker did not take the access record");
    return false;
  }
  return true;
}

/* ---------------------------------------------------------------- JSON */

static json_t *request_json(lt_api_t *api, const lt_access_req_t *r) {
  int64_t now = lt_time_wall_ms();
  json_t *scope = json_array(), *uses = json_array();
  for (size_t i = 0; i < r->nscope; i++) json_array_append_new(scope, json_string(r->scope[i]));
  for (size_t i = 0; i < r->nuses; i++) {
    const lt_access_use_t *u = &r->uses[(r->uses_total - 1 - i) % LT_ACCESS_USES_KEPT];
    json_array_append_new(uses, json_pack("{s:I,s:s,s:s}", "at_ms", (json_int_t)u->at_ms, "resource", u->resource,
                                          "action", u->action));
  }
  json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:I,s:I,s:I,s:o,s:I}", "id", r->request_id, "object", "access_request",
                        "tenant_id", r->tenant_id, "staff", r->staff, "scope", scope, "justification", r->justification,
                        "duration_s", (json_int_t)r->duration_s, "requested_at_ms", (json_int_t)r->requested_at_ms,
                        "expires_at_ms", (json_int_t)r->expires_at_ms, "uses", uses, "uses_total",
                        (json_int_t)r->uses_total);
  json_object_set_new(o, "state", json_string(lt_access_state_name(lt_access_state(api->access, r, now))));
  json_object_set_new(o, "tenant_approver", r->tenant_approver[0] ? json_string(r->tenant_approver) : json_null());
  json_object_set_new(o, "staff_approver", r->staff_approver[0] ? json_string(r->staff_approver) : json_null());
  json_object_set_new(o, "second_staff_required", json_boolean(lt_access_needs_second_staff(api->access)));
  if (r->denied || r->revoked)
    json_object_set_new(o, "closed", json_pack("{s:s,s:s,s:I}", "by", r->closed_by, "reason", r->reason, "at_ms",
                                               (json_int_t)r->closed_at_ms));
  return o;
}

static void reply_list(lt_api_t *api, struct evhttp_request *req, const char *tenant, const char *staff) {
  json_t *data = json_array();
  for (size_t i = 0; i < lt_access_count(api->access); i++) {
    const lt_access_req_t *r = lt_access_at(api->access, i);
    if ((tenant && strcmp(r->tenant_id, tenant) == 0) || (staff && strcmp(r->staff, staff) == 0))
      json_array_append_new(data, request_json(api, r));
  }
  lt_api_reply_json(req, 200, json_pack("{s:s,s:o}", "object", "list", "data", data));
}

/* The answer once a record is durable and folded in log order: the request as it now stands, or
 * 409 when a decision another API process wrote first left this one nothing to do. */
typedef struct {
  struct evhttp_request *req;
  char request_id[LT_ID_MAX + 1];
  int status;
  int type;                        /* 0 a request, 1 an approval, 2 a deny, 3 a revoke */
  char who[LT_ACCESS_PRINCIPAL_LEN]; /* who decided */
} answer_t;

/* Whether a's decision is the one r holds. */
static bool decision_took(const answer_t *a, const lt_access_req_t *r) {
  switch (a->type) {
    case 1:
      return strcmp(r->tenant_approver, a->who) == 0 || strcmp(r->staff_approver, a->who) == 0;
    case 2:
      return r->denied && strcmp(r->closed_by, a->who) == 0;
    case 3:
      return r->revoked && strcmp(r->closed_by, a->who) == 0;
    default:
      return true;
  }
}

static void answer(lt_api_t *api, void *arg, lt_err_t err) {
  answer_t *a = arg;
  const lt_access_req_t *r = lt_access_get(api->access, a->request_id);
  if (err == LT_ERR_RETRIABLE)
    lt_api_reply_error(a->req, 503, "unavailable", NULL, "the %saccess request %s is in the log, but this API has not "
                       "read the log up to it yet: see %s", a->type ? "decision on " : "", a->request_id,
                       a->type ? "GET /v1/access/{id}" : "GET /v1/staff/access");
  else if (err)
    lt_api_reply_err(a->req, LT_ERR_UNAVAILABLE, NULL, "the access record could not be written durably; retry");
  else if (!r)
    lt_api_reply_error(a->req, 500, "internal", NULL, "the access record was written but is not folded");
  else if (!decision_took(a, r))
    lt_api_reply_error(a->req, 409, "conflict", NULL, "access request %s is %s: a decision recorded before this one "
                       "stands", r->request_id, lt_access_state_name(lt_access_state(api->access, r, lt_time_wall_ms())));
  else
    lt_api_reply_json(a->req, a->status, request_json(api, r));
  free(a);
}

static answer_t *answer_new(struct evhttp_request *req, const char *request_id, int status, int type, const char *who) {
  answer_t *a = calloc(1, sizeof *a);
  if (!a) {
    lt_api_reply_error(req, 500, "internal", NULL, "out of memory");
    return NULL;
  }
  a->req = req;
  a->status = status;
  a->type = type;
  snprintf(a->who, sizeof a->who, "%s", who ? who : "");
  snprintf(a->request_id, sizeof a->request_id, "%s", request_id);
  return a;
}

/* A JSON body's optional "reason" (max LT_ACCESS_REASON_LEN - 1 bytes); false when replied 400. */
static bool read_reason(lt_api_t *api, struct evhttp_request *req, char *out, size_t cap) {
  size_t len;
  char *text = lt_api_body_text(api, req, &len);
  if (!text) return false;
  json_error_t je;
  json_t *b = len ? json_loadb(text, len, 0, &je) : json_object();
  free(text);
  const char *s = json_string_value(json_object_get(b, "reason"));
  bool ok = b && json_is_object(b) && (!json_object_get(b, "reason") || s) && (!s || strlen(s) < cap);
  if (!ok)
    lt_api_reply_error(req, 400, "invalid", "reason", "want a JSON object with an optional string \"reason\" of at most %zu bytes",
                       cap - 1);
  else snprintf(out, cap, "%s", s ? s : "");
  json_decref(b);
  return ok;
}

/* ---------------------------------------------------------------- tenant routes */

bool lt_api_access_resolve(lt_api_call_t *c) {
  const lt_access_req_t *r = lt_access_get(c->api->access, c->id);
  if (r && strcmp(r->tenant_id, c->tenant->tenant_id) == 0) return true;
  lt_api_reply_error(c->req, 404, "not_found", NULL, "no such access request");
  return false;
}

void lt_api_access_list(lt_api_call_t *c) { reply_list(c->api, c->req, c->tenant->tenant_id, NULL); }

void lt_api_access_show(lt_api_call_t *c) {
  lt_api_reply_json(c->req, 200, request_json(c->api, lt_access_get(c->api->access, c->id)));
}

/* The key id of the request's bearer key: "tenant:<key id>" names who decided. */
static void tenant_principal(const lt_api_call_t *c, char *out, size_t n) {
  snprintf(out, n, "tenant:%s", c->key_id[0] ? c->key_id : "?");
}

/* approve, deny or revoke by the tenant. */
static void tenant_decides(lt_api_call_t *c, int type) {
  lt_api_t *api = c->api;
  const lt_access_req_t *r = lt_access_get(api->access, c->id);
  lt_access_state_t st = lt_access_state(api->access, r, lt_time_wall_ms());
  char who[LT_ACCESS_PRINCIPAL_LEN], reason[LT_ACCESS_REASON_LEN] = "";
  tenant_principal(c, who, sizeof who);
  /* who may: route() (lt_api.c, admin_routes): any key but a viewer's closes the door (deny,
   * revoke); only an admin key opens it */
  if (st == LT_ACCESS_DENIED || st == LT_ACCESS_REVOKED || (type != 3 && r->tenant_approver[0])) {
    lt_api_reply_error(c->req, 409, "conflict", NULL, "access request %s is %s%s", r->request_id,
                       lt_access_state_name(st), r->tenant_approver[0] && type == 2 ? ": revoke it instead" : "");
    return;
  }
  if (type != 1 && !read_reason(api, c->req, reason, sizeof reason)) return;
  lt_avro_record_t *rec = record_start(api, type, r->request_id, r->tenant_id);
  lt_err_t err = rec ? LT_OK : LT_ERR_INTERNAL;
  if (!err && type == 1)
    err = lt_avro_set_string(rec, "approver", who) ||
          lt_avro_set_long(rec, "expires_at", lt_time_wall_ms() + r->duration_s * 1000);
  if (!err && type == 2) err = lt_avro_set_string(rec, "approver", who) || lt_avro_set_string(rec, "reason", reason);
  if (!err && type == 3) err = lt_avro_set_string(rec, "revoked_by", who) || lt_avro_set_string(rec, "reason", reason);
  answer_t *a = answer_new(c->req, r->request_id, 200, type, who);
  if (a && !send_record(api, c->req, rec ? rec : api->rec_access[type], err, r->tenant_id, answer, a)) free(a);
}

void lt_api_access_approve(lt_api_call_t *c) { tenant_decides(c, 1); }
void lt_api_access_deny(lt_api_call_t *c) { tenant_decides(c, 2); }
void lt_api_access_revoke(lt_api_call_t *c) { tenant_decides(c, 3); }

/* ---------------------------------------------------------------- staff routes */

const char *lt_api_staff_authenticate(lt_api_t *api, struct evhttp_request *req) {
  if (!api->ready) {
    /* Until lathe.audit is read back a grant's approval may be known here and its revoke not. */
    evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "1");
    lt_api_reply_error(req, 503, "starting", NULL, "the API is starting (reading the log); retry in a moment");
    return NULL;
  }
  /* Staff keys are guessed at the same rate as tenants' keys: the failed-login budget of the
   * source address (lt_api_limits.c). */
  if (!lt_api_door_addr(api, req, false)) return NULL;
  const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
  const char *name = NULL;
  if (!h || strncmp(h, "Bearer ", 7) != 0 || lt_access_staff_authenticate(api->staff, h + 7, &name) != LT_OK) {
    lt_api_door_addr(api, req, true);
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    lt_api_reply_error(req, 401, "unauthorized", NULL, "staff routes take a staff key (\"Authorization: Bearer ls_...\")");
    return NULL;
  }
  return name;
}

bool lt_api_staff_access_resolve(lt_api_call_t *c) {
  if (lt_access_get(c->api->access, c->id)) return true;
  lt_api_reply_error(c->req, 404, "not_found", NULL, "no such access request");
  return false;
}

void lt_api_staff_access_list(lt_api_call_t *c) { reply_list(c->api, c->req, NULL, c->staff); }

void lt_api_staff_access_show(lt_api_call_t *c) {
  lt_api_reply_json(c->req, 200, request_json(c->api, lt_access_get(c->api->access, c->id)));
}

/* POST /v1/staff/access: validates everything the fold will check, so a request the API accepts
 * is one the fold keeps. */
void lt_api_staff_access_request(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  size_t len;
  char *text = lt_api_body_text(api, c->req, &len);
  if (!text) return;
  json_error_t je;
  json_t *b = json_loadb(text, len, 0, &je), *scope = json_object_get(b, "scope");
  free(text);
  const char *tenant = json_string_value(json_object_get(b, "tenant_id"));
  const char *just = json_string_value(json_object_get(b, "justification"));
  json_int_t dur = json_integer_value(json_object_get(b, "duration_s"));
  char why[256];
  const char *field = NULL;
  if (!b || !json_is_object(b)) field = "body", snprintf(why, sizeof why, "want a JSON object");
  else if (!tenant || !lt_tenant_get(lt_proj_tenants(api->proj), tenant))
    field = "tenant_id", snprintf(why, sizeof why, "no such tenant");
  else if (!json_is_array(scope) || json_array_size(scope) == 0 || json_array_size(scope) > LT_ACCESS_SCOPE_MAX)
    field = "scope", snprintf(why, sizeof why, "want an array of 1 to %d scopes", LT_ACCESS_SCOPE_MAX);
  else if (!just || !*just || strlen(just) >= LT_ACCESS_REASON_LEN)
    field = "justification", snprintf(why, sizeof why, "want a reason (a ticket) of 1 to %d bytes", LT_ACCESS_REASON_LEN - 1);
  else if (!json_is_integer(json_object_get(b, "duration_s")) || dur <= 0 || dur > LT_ACCESS_MAX_DURATION_S)
    field = "duration_s", snprintf(why, sizeof why, "want whole seconds from 1 to %d", LT_ACCESS_MAX_DURATION_S);
  for (size_t i = 0; !field && i < json_array_size(scope); i++) {
    const char *s = json_string_value(json_array_get(scope, i));
    if (!s) field = "scope", snprintf(why, sizeof why, "scope[%zu] is not a string", i);
    else if (lt_access_scope_valid(s, why, sizeof why)) field = "scope";
  }
  if (field) {
    lt_api_reply_error(c->req, field[0] == 't' && strcmp(why, "no such tenant") == 0 ? 404 : 400,
                       strcmp(why, "no such tenant") == 0 ? "not_found" : "invalid", field, "%s", why);
    json_decref(b);
    return;
  }
  char id[LT_ID_MAX + 1], rnd[LT_CRYPTO_RANDOM_ID_CHARS + 1];
  lt_crypto_random_id(rnd);
  snprintf(id, sizeof id, "acc-%.24s", rnd);
  lt_avro_record_t *rec = record_start(api, 0, id, tenant);
  lt_err_t err = rec ? LT_OK : LT_ERR_INTERNAL;
  if (!err) err = lt_avro_set_string(rec, "staff_principal", c->staff) || lt_avro_set_string(rec, "justification", just) ||
                  lt_avro_set_long(rec, "duration_s", dur);
  for (size_t i = 0; !err && i < json_array_size(scope); i++)
    err = lt_avro_array_append_string(rec, "scope", json_string_value(json_array_get(scope, i)));
  answer_t *a = answer_new(c->req, id, 201, 0, NULL);
  if (a && !send_record(api, c->req, rec ? rec : api->rec_access[0], err, tenant, answer, a)) free(a);
  json_decref(b);
}

/* approve (a second staff member) or revoke. */
static void staff_decides(lt_api_call_t *c, int type) {
  lt_api_t *api = c->api;
  const lt_access_req_t *r = lt_access_get(api->access, c->id);
  lt_access_state_t st = lt_access_state(api->access, r, lt_time_wall_ms());
  char who[LT_ACCESS_PRINCIPAL_LEN], reason[LT_ACCESS_REASON_LEN] = "";
  snprintf(who, sizeof who, "staff:%s", c->staff);
  if (type == 1 && strcmp(r->staff, c->staff) == 0) {
    lt_api_reply_error(c->req, 403, "forbidden", NULL, "the second approval must come from someone other than %s",
                       c->staff);
    return;
  }
  if (st == LT_ACCESS_DENIED || st == LT_ACCESS_REVOKED || (type == 1 && r->staff_approver[0])) {
    lt_api_reply_error(c->req, 409, "conflict", NULL, "access request %s is %s%s", r->request_id,
                       lt_access_state_name(st), r->staff_approver[0] ? " (approved by a second person already)" : "");
    return;
  }
  if (type == 3 && !read_reason(api, c->req, reason, sizeof reason)) return;
  lt_avro_record_t *rec = record_start(api, type, r->request_id, r->tenant_id);
  lt_err_t err = rec ? LT_OK : LT_ERR_INTERNAL;
  if (!err && type == 1)
    err = lt_avro_set_string(rec, "approver", who) ||
          lt_avro_set_long(rec, "expires_at", lt_time_wall_ms() + r->duration_s * 1000);
  if (!err && type == 3) err = lt_avro_set_string(rec, "revoked_by", who) || lt_avro_set_string(rec, "reason", reason);
  answer_t *a = answer_new(c->req, r->request_id, 200, type, who);
  if (a && !send_record(api, c->req, rec ? rec : api->rec_access[type], err, r->tenant_id, answer, a)) free(a);
}

void lt_api_staff_access_approve(lt_api_call_t *c) { staff_decides(c, 1); }
void lt_api_staff_access_revoke(lt_api_call_t *c) { staff_decides(c, 3); }

/* ---------------------------------------------------------------- reads under a grant */

typedef struct {
  lt_api_t *api;
  struct evhttp_request *req;
  char request_id[LT_ID_MAX + 1];
  char staff[LT_ACCESS_PRINCIPAL_LEN];
  char tenant[LT_ID_MAX + 1];
  char resource[LT_ACCESS_SCOPE_LEN];
  char object_key[512]; /* the sealed object (a dataset's: set once its size is known) */
  char job[LT_ID_MAX + 1];
  uint64_t bytes;       /* the plaintext size (a dataset's: from its metadata) */
  char dataset[LT_ID_MAX + 1];
  /* datasets: what the work pool found (the look-up, then the size) */
  lt_err_t err;
  char msg[256];
} read_t;

/* Whether r's grant still holds now (it may be revoked, or run out, at any step); when not, answers
 * 403 or 404 saying why, and the caller frees r. */
static bool grant_holds(lt_api_t *api, read_t *r) {
  const lt_access_req_t *q;
  char why[512];
  lt_err_t err = lt_access_check(api->access, r->request_id, r->staff, r->resource, lt_time_wall_ms(), &q, why,
                                 sizeof why);
  if (err)
    lt_api_reply_error(r->req, err == LT_ERR_NOT_FOUND ? 404 : 403, err == LT_ERR_NOT_FOUND ? "not_found" : "forbidden",
                       NULL, "%s", why);
  return !err;
}

/* A dataset's plaintext size, from its metadata opened under the dataset's key (work pool: two
 * small objects); the bytes themselves are then streamed like an artifact (lt_api_download.c), so
 * the API holds a window of them, not the dataset. */
static void dataset_size_work(void *arg) {
  read_t *r = arg;
  lt_crypto_dek_t *dek = NULL;
  json_t *meta = NULL;
  r->err = lt_api_dataset_open(r->api, r->tenant, r->dataset, &dek, &meta, r->msg, sizeof r->msg);
  json_t *bytes = json_object_get(meta, "bytes");
  if (!r->err && !json_is_integer(bytes)) r->err = lt_errf(r->msg, sizeof r->msg, LT_ERR_CORRUPT, "its metadata has no size");
  if (!r->err) r->bytes = (uint64_t)json_integer_value(bytes);
  json_decref(meta);
  lt_crypto_dek_destroy(dek);
}

/* Streams object_key to r's request, sealed under the key wrapped at dek_key (a dataset's, or a
 * job's artifact key), with the tenant's key for what has none. Frees r. */
static void stream_to(lt_api_t *api, read_t *r, const char *dek_key, bool own_key, const char *type) {
  const lt_tenant_t *t = lt_tenant_get(lt_proj_tenants(api->proj), r->tenant);
  const lt_crypto_dek_t *dek;
  char msg[256];
  lt_err_t err = t ? lt_keyring_tenant_dek(api->keyring, t, &dek, msg, sizeof msg) : LT_ERR_NOT_FOUND;
  if (err) lt_api_reply_err(r->req, LT_ERR_INTERNAL, NULL, "the tenant's key could not be opened");
  else {
    lt_api_grant_t g;
    snprintf(g.request_id, sizeof g.request_id, "%s", r->request_id);
    snprintf(g.staff, sizeof g.staff, "%s", r->staff);
    snprintf(g.resource, sizeof g.resource, "%s", r->resource);
    lt_api_download_start_granted(api, r->req, dek, dek_key, own_key, r->object_key, r->bytes, type,
                                  r->dataset[0] ? NULL : r->job, &g);
  }
  free(r);
}

static void dataset_size_after(lt_api_t *api, void *arg) {
  read_t *r = arg;
  if (r->err) {
    lt_api_reply_store_err(r->req, r->err, "the object could not be read");
    free(r);
  } else if (!grant_holds(api, r)) { /* revoked while the pool read: not a byte goes out */
    free(r);
  } else {
    char dek_key[LT_STORE_KEY_MAX + 1];
    lt_dataset_object_key(dek_key, sizeof dek_key, r->tenant, r->dataset, LT_DATASET_KEY);
    lt_dataset_object_key(r->object_key, sizeof r->object_key, r->tenant, r->dataset, LT_DATASET_DATA);
    stream_to(api, r, dek_key, true, "application/jsonl");
  }
}

/* The audit record is durable (or not): only now is the data read. */
static void read_after_audit(lt_api_t *api, void *arg, lt_err_t err) {
  read_t *r = arg;
  if (err) {
    lt_api_reply_error(r->req, 503, "unavailable", NULL,
                       err == LT_ERR_RETRIABLE ? "this API has not read the audit log up to this access's record, so "
                                                 "nothing is returned; retry"
                                               : "the audit record of this access could not be written durably, so "
                                                 "nothing is returned; retry");
    free(r);
    return;
  }
  /* again now, with the log read up to the use: revoked (by any API process, before the use was
   * recorded) or run out while the record was written */
  if (!grant_holds(api, r)) {
    free(r);
    return;
  }
  if (r->dataset[0]) {
    lt_api_work(api, r->tenant, dataset_size_work, dataset_size_after, r);
    return;
  }
  /* An artifact: streamed like the tenant's own download, under the job's artifact key. */
  char dek_key[LT_STORE_KEY_MAX + 1];
  lt_publisher_artifact_dek_key(dek_key, sizeof dek_key, r->tenant, r->job);
  stream_to(api, r, dek_key, false, "application/octet-stream");
}

/* The grant checked again (it may have been revoked while the store was asked), then AccessUsed
 * written: only once it is durable is anything read (read_after_audit). */
static void audit_then_read(lt_api_t *api, read_t *r) {
  /* no room to stream it now (the staff member's download slots): 429 before anything is audited, so
   * that a retry does not write an AccessUsed for each refusal (the slots are checked again when
   * the bytes start) */
  if (!grant_holds(api, r) || !lt_api_download_room(api, r->req, r->tenant, r->staff)) {
    free(r);
    return;
  }
  lt_avro_record_t *rec = record_start(api, 4, r->request_id, r->tenant);
  lt_err_t err = rec ? LT_OK : LT_ERR_INTERNAL;
  if (!err)
    err = lt_avro_set_string(rec, "staff_principal", r->staff) || lt_avro_set_string(rec, "resource", r->resource) ||
          lt_avro_set_string(rec, "action", "read");
  if (!send_record(api, r->req, rec ? rec : api->rec_access[4], err, r->tenant, read_after_audit, r)) free(r);
}

/* Whether the granted dataset exists, asked of the store on the work pool (once per dataset and
 * API process: lt_api_dataset_seen). */
static void dataset_lookup_work(void *arg) {
  read_t *r = arg;
  r->err = lt_api_dataset_head(r->api, r->tenant, r->dataset);
}

static void dataset_lookup_after(lt_api_t *api, void *arg) {
  read_t *r = arg;
  if (!grant_holds(api, r)) { /* first: whether the dataset exists is the tenant's data too */
    free(r);
    return;
  }
  if (r->err == LT_ERR_NOT_FOUND) {
    lt_api_reply_error(r->req, 404, "not_found", NULL, "tenant %s has no dataset %s", r->tenant, r->dataset);
  } else if (r->err) {
    lt_api_reply_store_unsure(r->req, NULL, r->dataset, r->err);
  } else {
    lt_api_dataset_mark_seen(api, r->tenant, r->dataset);
    audit_then_read(api, r);
    return;
  }
  free(r);
}

/* Finds what a path names, checks the grant, then writes AccessUsed before anything is read. */
static void read_under_grant(lt_api_call_t *c, read_t *r) {
  lt_api_t *api = c->api;
  const lt_access_req_t *q;
  char why[512];
  lt_err_t err = lt_access_check(api->access, c->id, c->staff, r->resource, lt_time_wall_ms(), &q, why, sizeof why);
  if (err) {
    lt_api_reply_error(c->req, err == LT_ERR_NOT_FOUND ? 404 : 403, err == LT_ERR_NOT_FOUND ? "not_found" : "forbidden",
                       NULL, "%s", why);
    free(r);
    return;
  }
  snprintf(r->tenant, sizeof r->tenant, "%s", q->tenant_id);
  snprintf(r->request_id, sizeof r->request_id, "%s", q->request_id);
  snprintf(r->staff, sizeof r->staff, "%s", c->staff);
  r->api = api;
  r->req = c->req;
  if (r->dataset[0] && !lt_api_dataset_seen(api, r->tenant, r->dataset))
    lt_api_work(api, r->tenant, dataset_lookup_work, dataset_lookup_after, r);
  else
    audit_then_read(api, r);
}

/* GET /v1/staff/access/{id}/datasets/{name} */
void lt_api_staff_access_read_dataset(lt_api_call_t *c) {
  read_t *r = calloc(1, sizeof *r);
  if (!r) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  if (!lt_id_valid(c->name)) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "no such dataset");
    free(r);
    return;
  }
  snprintf(r->dataset, sizeof r->dataset, "%s", c->name);
  snprintf(r->resource, sizeof r->resource, "dataset:%s", c->name);
  read_under_grant(c, r);
}

/* GET /v1/staff/access/{id}/jobs/{name}, where {name} is "<job>/artifacts/<artifact name>". */
void lt_api_staff_access_read_artifact(lt_api_call_t *c) {
  lt_api_t *api = c->api;
  char job[LT_ID_MAX + 1];
  const char *art = strstr(c->name, "/artifacts/");
  size_t jl = art ? (size_t)(art - c->name) : 0;
  if (!art || jl == 0 || jl > LT_ID_MAX || !art[11]) {
    lt_api_reply_error(c->req, 404, "not_found", NULL, "want /v1/staff/access/{id}/jobs/{job}/artifacts/{name}");
    return;
  }
  read_t *r = calloc(1, sizeof *r);
  if (!r) {
    lt_api_reply_error(c->req, 500, "internal", NULL, "out of memory");
    return;
  }
  memcpy(job, c->name, jl);
  job[jl] = '\0';
  snprintf(r->job, sizeof r->job, "%s", job);
  snprintf(r->resource, sizeof r->resource, "artifact:%s/%s", job, art + 11);
  /* The grant is checked first: whether a job or artifact exists is the tenant's data too. */
  const lt_access_req_t *q;
  char why[512];
  if (lt_access_check(api->access, c->id, c->staff, r->resource, lt_time_wall_ms(), &q, why, sizeof why) == LT_OK) {
    const lt_job_t *j = lt_job_get(lt_proj_jobs(api->proj), job);
    json_t *info = j && strcmp(j->tenant_id, q->tenant_id) == 0 ? lt_proj_job_info(api->proj, job) : NULL;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(info, "artifacts"), i, a) {
      if (strcmp(json_string_value(json_object_get(a, "name")), art + 11) == 0) {
        snprintf(r->object_key, sizeof r->object_key, "%s", json_string_value(json_object_get(a, "key")));
        r->bytes = (uint64_t)json_integer_value(json_object_get(a, "bytes"));
      }
    }
    if (!r->object_key[0]) {
      lt_api_reply_error(c->req, 404, "not_found", NULL, "job %s has no published artifact \"%s\"", job, art + 11);
      free(r);
      return;
    }
  }
  read_under_grant(c, r);
}
