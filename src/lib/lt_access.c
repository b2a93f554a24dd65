/* lt_access: the staff-access lockbox fold (see lt_access.h). */
#include "lt_access.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "lt_crypto.h"
#include "lt_map.h"

struct lt_access_table {
  bool second_staff;
  lt_map_t *by_id;         /* request_id -> lt_access_req_t* (owned by order) */
  lt_map_t *events;        /* set of event ids applied */
  lt_access_req_t **order; /* every request, in the log's order */
  size_t n, cap;
};

lt_err_t lt_access_table_new(bool require_second_staff, lt_access_table_t **out) {
  lt_access_table_t *t = calloc(1, sizeof *t);
  if (!t) return LT_ERR_NOMEM;
  t->second_staff = require_second_staff;
  t->by_id = lt_map_new(NULL);
  t->events = lt_map_new(NULL);
  if (!t->by_id || !t->events) {
    lt_access_table_destroy(t);
    return LT_ERR_NOMEM;
  }
  *out = t;
  return LT_OK;
}

void lt_access_table_destroy(lt_access_table_t *t) {
  if (!t) return;
  lt_map_destroy(t->by_id);
  lt_map_destroy(t->events);
  for (size_t i = 0; i < t->n; i++) free(t->order[i]);
  free(t->order);
  free(t);
}

bool lt_access_needs_second_staff(const lt_access_table_t *t) { return t->second_staff; }

const lt_access_req_t *lt_access_get(const lt_access_table_t *t, const char *request_id) {
  return lt_map_get(t->by_id, request_id);
}

size_t lt_access_count(const lt_access_table_t *t) { return t->n; }

const lt_access_req_t *lt_access_at(const lt_access_table_t *t, size_t i) { return i < t->n ? t->order[i] : NULL; }

const char *lt_access_state_name(lt_access_state_t s) {
  static const char *const names[] = {"pending", "active", "expired", "denied", "revoked"};
  return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown";
}

lt_access_state_t lt_access_state(const lt_access_table_t *t, const lt_access_req_t *r, int64_t now_ms) {
  if (r->revoked) return LT_ACCESS_REVOKED;
  if (r->denied) return LT_ACCESS_DENIED;
  if (!r->tenant_approver[0] || (t->second_staff && !r->staff_approver[0])) return LT_ACCESS_PENDING;
  return now_ms < r->expires_at_ms ? LT_ACCESS_ACTIVE : LT_ACCESS_EXPIRED;
}

/* ---------------------------------------------------------------- scopes */

lt_err_t lt_access_scope_valid(const char *scope, char *errstr, size_t n) {
  if (strlen(scope) >= LT_ACCESS_SCOPE_LEN)
    return lt_errf(errstr, n, LT_ERR_INVALID, "scope is longer than %d bytes", LT_ACCESS_SCOPE_LEN - 1);
  char id[LT_ID_MAX + 2];
  const char *rest;
  if (strncmp(scope, "dataset:", 8) == 0 || strncmp(scope, "job:", 4) == 0) {
    rest = strchr(scope, ':') + 1;
    if (!lt_id_valid(rest))
      return lt_errf(errstr, n, LT_ERR_INVALID, "scope \"%s\": \"%s\" is not a valid id", scope, rest);
    return LT_OK;
  }
  if (strncmp(scope, "artifact:", 9) == 0) {
    rest = scope + 9;
    const char *slash = strchr(rest, '/');
    size_t idlen = slash ? (size_t)(slash - rest) : 0;
    if (!slash || idlen == 0 || idlen > LT_ID_MAX || !slash[1] || strstr(slash, ".."))
      return lt_errf(errstr, n, LT_ERR_INVALID, "scope \"%s\": want artifact:<job id>/<artifact name>", scope);
    memcpy(id, rest, idlen);
    id[idlen] = '\0';
    if (!lt_id_valid(id))
      return lt_errf(errstr, n, LT_ERR_INVALID, "scope \"%s\": \"%s\" is not a valid job id", scope, id);
    return LT_OK;
  }
  return lt_errf(errstr, n, LT_ERR_INVALID, "scope \"%s\": want dataset:<id>, job:<id> or artifact:<job>/<name>",
                 scope);
}

/* Does scope cover resource? "job:J" covers "artifact:J/<anything>" and "job:J" itself. */
static bool covers(const char *scope, const char *resource) {
  if (strcmp(scope, resource) == 0) return true;
  if (strncmp(scope, "job:", 4) != 0 || strncmp(resource, "artifact:", 9) != 0) return false;
  size_t idlen = strlen(scope + 4);
  return strncmp(resource + 9, scope + 4, idlen) == 0 && resource[9 + idlen] == '/';
}

lt_err_t lt_access_check(const lt_access_table_t *t, const char *request_id, const char *staff, const char *resource,
                         int64_t now_ms, const lt_access_req_t **out, char *errstr, size_t n) {
  const lt_access_req_t *r = lt_access_get(t, request_id);
  if (!r || strcmp(r->staff, staff) != 0)
    return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "no access request %s of yours", request_id);
  switch (lt_access_state(t, r, now_ms)) {
    case LT_ACCESS_PENDING:
      return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s awaits %s", request_id,
                     !r->tenant_approver[0] ? "the tenant's approval" : "a second staff member's approval");
    case LT_ACCESS_DENIED:
      return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s was denied by %s", request_id, r->closed_by);
    case LT_ACCESS_REVOKED:
      return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s was revoked by %s", request_id, r->closed_by);
    case LT_ACCESS_EXPIRED:
      return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s expired at %lld ms", request_id,
                     (long long)r->expires_at_ms);
    case LT_ACCESS_ACTIVE:
      break;
  }
  for (size_t i = 0; i < r->nscope; i++)
    if (covers(r->scope[i], resource)) {
      *out = r;
      return LT_OK;
    }
  return lt_errf(errstr, n, LT_ERR_AUTH, "%s is outside the scope of access request %s", resource, request_id);
}

/* ---------------------------------------------------------------- the fold */

/* The fields every Access* record has. */
typedef struct {
  const char *event_id, *request_id, *tenant_id;
  int64_t at_ms;
} common_t;

static lt_err_t get_str(lt_avro_record_t *rec, const char *field, const char **out, char *errstr, size_t n) {
  if (lt_avro_get_string(rec, field, out, NULL))
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s: no string field \"%s\"", lt_avro_record_type(rec), field);
  return LT_OK;
}

/* Copies a string field into dst, refusing one that does not fit. */
static lt_err_t copy_str(lt_avro_record_t *rec, const char *field, char *dst, size_t cap, char *errstr, size_t n) {
  const char *s;
  lt_err_t err = get_str(rec, field, &s, errstr, n);
  if (err) return err;
  if (strlen(s) >= cap)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s.%s is longer than %zu bytes", lt_avro_record_type(rec), field,
                   cap - 1);
  memcpy(dst, s, strlen(s) + 1);
  return LT_OK;
}

static lt_err_t read_common(lt_avro_record_t *rec, common_t *c, char *errstr, size_t n) {
  lt_err_t err = get_str(rec, "event_id", &c->event_id, errstr, n);
  if (!err) err = get_str(rec, "request_id", &c->request_id, errstr, n);
  if (!err) err = get_str(rec, "tenant_id", &c->tenant_id, errstr, n);
  if (!err && lt_avro_get_long(rec, "occurred_at", &c->at_ms))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "%s: no occurred_at", lt_avro_record_type(rec));
  if (!err && (!lt_id_valid(c->request_id) || !lt_id_valid(c->tenant_id)))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "%s: request_id or tenant_id is not a valid id", lt_avro_record_type(rec));
  return err;
}

static lt_err_t apply_requested(lt_access_table_t *t, lt_avro_record_t *rec, const common_t *c, char *errstr,
                                size_t n) {
  if (lt_map_get(t->by_id, c->request_id))
    return lt_errf(errstr, n, LT_ERR_EXISTS, "access request %s exists already", c->request_id);
  lt_access_req_t *r = calloc(1, sizeof *r);
  if (!r) return LT_ERR_NOMEM;
  snprintf(r->request_id, sizeof r->request_id, "%s", c->request_id);
  snprintf(r->tenant_id, sizeof r->tenant_id, "%s", c->tenant_id);
  r->requested_at_ms = c->at_ms;
  size_t ns = 0;
  lt_err_t err = copy_str(rec, "staff_principal", r->staff, sizeof r->staff, errstr, n);
  if (!err) err = copy_str(rec, "justification", r->justification, sizeof r->justification, errstr, n);
  if (!err && lt_avro_get_long(rec, "duration_s", &r->duration_s))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "AccessRequested: no duration_s");
  if (!err && (r->duration_s <= 0 || r->duration_s > LT_ACCESS_MAX_DURATION_S))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "AccessRequested.duration_s %lld is outside 1..%d", (long long)r->duration_s,
                  LT_ACCESS_MAX_DURATION_S);
  if (!err && !r->staff[0]) err = lt_errf(errstr, n, LT_ERR_INVALID, "AccessRequested.staff_principal is empty");
  if (!err && (lt_avro_array_size(rec, "scope", &ns) || ns == 0 || ns > LT_ACCESS_SCOPE_MAX))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "AccessRequested.scope: want 1..%d scopes", LT_ACCESS_SCOPE_MAX);
  for (size_t i = 0; !err && i < ns; i++) {
    char path[32];
    const char *s;
    snprintf(path, sizeof path, "scope[%zu]", i);
    err = get_str(rec, path, &s, errstr, n);
    if (!err) err = lt_access_scope_valid(s, errstr, n);
    if (!err) snprintf(r->scope[r->nscope++], LT_ACCESS_SCOPE_LEN, "%s", s);
  }
  if (!err && t->n == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 16;
    lt_access_req_t **o = realloc(t->order, cap * sizeof *o);
    if (!o) err = LT_ERR_NOMEM;
    else t->order = o, t->cap = cap;
  }
  if (!err) err = lt_map_set(t->by_id, r->request_id, r);
  if (err) {
    free(r);
    return err;
  }
  t->order[t->n++] = r;
  return LT_OK;
}

/* The request a decision is about: it must exist, belong to the record's tenant and be open. */
static lt_err_t open_request(lt_access_table_t *t, const common_t *c, lt_access_req_t **out, char *errstr,
                             size_t n) {
  lt_access_req_t *r = lt_map_get(t->by_id, c->request_id);
  if (!r) return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "no access request %s", c->request_id);
  if (strcmp(r->tenant_id, c->tenant_id) != 0)
    return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s is not tenant %s's", c->request_id, c->tenant_id);
  if (r->denied || r->revoked)
    return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s is %s already", c->request_id,
                   r->denied ? "denied" : "revoked");
  *out = r;
  return LT_OK;
}

static lt_err_t apply_approved(lt_access_table_t *t, lt_avro_record_t *rec, const common_t *c, char *errstr,
                               size_t n) {
  lt_access_req_t *r;
  const char *who;
  int64_t expires;
  lt_err_t err = open_request(t, c, &r, errstr, n);
  if (!err) err = get_str(rec, "approver", &who, errstr, n);
  if (!err && lt_avro_get_long(rec, "expires_at", &expires))
    err = lt_errf(errstr, n, LT_ERR_INVALID, "AccessApproved: no expires_at");
  if (err) return err;
  if (strlen(who) >= LT_ACCESS_PRINCIPAL_LEN)
    return lt_errf(errstr, n, LT_ERR_INVALID, "AccessApproved.approver is too long");
  if (strncmp(who, "tenant:", 7) == 0) {
    if (r->tenant_approver[0])
      return lt_errf(errstr, n, LT_ERR_EXISTS, "access request %s is approved by the tenant already", r->request_id);
    snprintf(r->tenant_approver, sizeof r->tenant_approver, "%s", who);
    /* The grant runs from the tenant's decision for the duration asked, never longer. */
    int64_t limit = c->at_ms + r->duration_s * 1000;
    r->expires_at_ms = expires < limit ? expires : limit;
    return LT_OK;
  }
  if (strncmp(who, "staff:", 6) == 0) {
    if (strcmp(who + 6, r->staff) == 0)
      return lt_errf(errstr, n, LT_ERR_AUTH, "%s cannot approve their own access request %s", who + 6, r->request_id);
    if (r->staff_approver[0])
      return lt_errf(errstr, n, LT_ERR_EXISTS, "access request %s has a second approval already", r->request_id);
    snprintf(r->staff_approver, sizeof r->staff_approver, "%s", who);
    return LT_OK;
  }
  return lt_errf(errstr, n, LT_ERR_INVALID, "AccessApproved.approver \"%s\": want tenant:<key id> or staff:<name>", who);
}

static lt_err_t apply_closed(lt_access_table_t *t, lt_avro_record_t *rec, const common_t *c, bool deny, char *errstr,
                             size_t n) {
  lt_access_req_t *r;
  lt_err_t err = open_request(t, c, &r, errstr, n);
  if (err) return err;
  if (deny && r->tenant_approver[0])
    return lt_errf(errstr, n, LT_ERR_AUTH, "access request %s is approved already: revoke it instead", r->request_id);
  char by[LT_ACCESS_PRINCIPAL_LEN], reason[LT_ACCESS_REASON_LEN];
  err = copy_str(rec, deny ? "approver" : "revoked_by", by, sizeof by, errstr, n);
  if (!err) err = copy_str(rec, "reason", reason, sizeof reason, errstr, n);
  if (err) return err;
  memcpy(r->closed_by, by, sizeof by);
  memcpy(r->reason, reason, sizeof reason);
  r->closed_at_ms = c->at_ms;
  if (deny) r->denied = true;
  else r->revoked = true;
  return LT_OK;
}

static lt_err_t apply_used(lt_access_table_t *t, lt_avro_record_t *rec, const common_t *c, char *errstr, size_t n) {
  lt_access_req_t *r = lt_map_get(t->by_id, c->request_id);
  if (!r || strcmp(r->tenant_id, c->tenant_id) != 0)
    return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "AccessUsed names no access request %s of tenant %s", c->request_id,
                   c->tenant_id);
  lt_access_use_t u = {.at_ms = c->at_ms};
  lt_err_t err = copy_str(rec, "resource", u.resource, sizeof u.resource, errstr, n);
  if (!err) err = copy_str(rec, "action", u.action, sizeof u.action, errstr, n);
  if (err) return err;
  r->uses[r->uses_total % LT_ACCESS_USES_KEPT] = u;
  r->uses_total++;
  r->nuses = r->uses_total < LT_ACCESS_USES_KEPT ? (size_t)r->uses_total : LT_ACCESS_USES_KEPT;
  return LT_OK;
}

lt_err_t lt_access_apply(lt_access_table_t *t, lt_avro_record_t *rec, char *errstr, size_t n) {
  const char *type = lt_avro_record_type(rec);
  if (strncmp(type, "Access", 6) != 0)
    return lt_errf(errstr, n, LT_ERR_UNSUPPORTED, "%s is not an access record", type);
  common_t c;
  lt_err_t err = read_common(rec, &c, errstr, n);
  if (err) return err;
  if (lt_map_has(t->events, c.event_id))
    return lt_errf(errstr, n, LT_ERR_EXISTS, "event %s was applied already (a replay)", c.event_id);
  if (strcmp(type, "AccessRequested") == 0) err = apply_requested(t, rec, &c, errstr, n);
  else if (strcmp(type, "AccessApproved") == 0) err = apply_approved(t, rec, &c, errstr, n);
  else if (strcmp(type, "AccessDenied") == 0) err = apply_closed(t, rec, &c, true, errstr, n);
  else if (strcmp(type, "AccessRevoked") == 0) err = apply_closed(t, rec, &c, false, errstr, n);
  else if (strcmp(type, "AccessUsed") == 0) err = apply_used(t, rec, &c, errstr, n);
  else err = lt_errf(errstr, n, LT_ERR_UNSUPPORTED, "%s is not an access record Lathe knows", type);
  if (!err) err = lt_map_set(t->events, c.event_id, NULL);
  return err;
}

/* ---------------------------------------------------------------- staff keys */

#define KEY_ID_LEN 16
#define SECRET_LEN 40

typedef struct {
  char name[LT_ID_MAX + 1];
  char key_id[KEY_ID_LEN + 1];
  uint8_t sha256[LT_CRYPTO_SHA256_BYTES];
} staff_t;

struct lt_access_staff {
  size_t n;
  staff_t v[LT_ACCESS_STAFF_MAX];
};

static bool is_hex(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

bool lt_access_is_staff_key(const char *key) { return key && strncmp(key, "ls_", 3) == 0; }

static lt_err_t parse_staff_line(lt_access_staff_t *s, char *line, const char *path, int lineno, char *errstr,
                                 size_t n) {
  char name[128], id[64], hex[128], extra[8];
  int got = sscanf(line, "%127s %63s %127s %7s", name, id, hex, extra);
  if (got != 3)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: want \"<name> <key id> <sha256 hex>\", got %d field(s)", path,
                   lineno, got < 0 ? 0 : got);
  if (!lt_id_valid(name)) return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: \"%s\" is not a valid name", path, lineno, name);
  if (strlen(id) != KEY_ID_LEN || !is_hex(id, KEY_ID_LEN))
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: the key id must be %d lowercase hex characters", path, lineno,
                   KEY_ID_LEN);
  if (strlen(hex) != 2 * LT_CRYPTO_SHA256_BYTES || !is_hex(hex, strlen(hex)))
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: the hash must be 64 lowercase hex characters", path, lineno);
  for (size_t i = 0; i < s->n; i++)
    if (strcmp(s->v[i].key_id, id) == 0)
      return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: key id %s appears twice", path, lineno, id);
  if (s->n == LT_ACCESS_STAFF_MAX)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%s:%d: more than %d staff keys", path, lineno, LT_ACCESS_STAFF_MAX);
  staff_t *st = &s->v[s->n++];
  memcpy(st->name, name, strlen(name) + 1);  /* lt_id_valid: at most LT_ID_MAX */
  memcpy(st->key_id, id, KEY_ID_LEN + 1);
  for (int i = 0; i < LT_CRYPTO_SHA256_BYTES; i++) sscanf(hex + 2 * i, "%2hhx", &st->sha256[i]);
  return LT_OK;
}

lt_err_t lt_access_staff_load(const char *path, lt_access_staff_t **out, char *errstr, size_t n) {
  lt_access_staff_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  if (!path || !*path) {
    *out = s;
    return LT_OK;
  }
  FILE *f = fopen(path, "r");
  if (!f) {
    free(s);
    return lt_errf(errstr, n, LT_ERR_IO, "cannot read staff keys file %s", path);
  }
  char *line = NULL; /* whole lines, however long: the tail of a long comment is no key */
  size_t cap = 0;
  lt_err_t err = LT_OK;
  for (int lineno = 1; !err && getline(&line, &cap, f) >= 0; lineno++) {
    char *p = line;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '#' || *p == '\n' || *p == '\0') continue;
    err = parse_staff_line(s, p, path, lineno, errstr, n);
  }
  free(line);
  fclose(f);
  if (err) {
    free(s);
    return err;
  }
  *out = s;
  return LT_OK;
}

void lt_access_staff_destroy(lt_access_staff_t *s) { free(s); }

lt_err_t lt_access_staff_authenticate(const lt_access_staff_t *s, const char *key, const char **name) {
  *name = NULL;
  if (!key || strlen(key) != LT_ACCESS_STAFF_KEY_SIZE - 1 || !lt_access_is_staff_key(key) ||
      key[3 + KEY_ID_LEN] != '_' || !is_hex(key + 3, KEY_ID_LEN) || !is_hex(key + 4 + KEY_ID_LEN, SECRET_LEN))
    return LT_ERR_AUTH;
  uint8_t h[LT_CRYPTO_SHA256_BYTES];
  lt_crypto_sha256(key, strlen(key), h);
  for (size_t i = 0; i < s->n; i++) {
    if (memcmp(s->v[i].key_id, key + 3, KEY_ID_LEN) != 0) continue;
    if (!lt_crypto_ct_equal(s->v[i].sha256, h, sizeof h)) return LT_ERR_AUTH;
    *name = s->v[i].name;
    return LT_OK;
  }
  return LT_ERR_AUTH;
}

lt_err_t lt_access_staff_key_new(const char *name, char key_out[LT_ACCESS_STAFF_KEY_SIZE], char *line, size_t line_size,
                                 char *errstr, size_t n) {
  if (!lt_id_valid(name))
    return lt_errf(errstr, n, LT_ERR_INVALID, "staff name \"%s\": use 1-%d of A-Z a-z 0-9 . _ -", name, LT_ID_MAX);
  uint8_t raw[(KEY_ID_LEN + SECRET_LEN) / 2];
  lt_err_t err = lt_crypto_random(raw, sizeof raw);
  if (err) return lt_errf(errstr, n, err, "no randomness for a staff key");
  char *p = key_out;
  p += sprintf(p, "ls_");
  for (size_t i = 0; i < KEY_ID_LEN / 2; i++) p += sprintf(p, "%02x", raw[i]);
  *p++ = '_';
  for (size_t i = KEY_ID_LEN / 2; i < sizeof raw; i++) p += sprintf(p, "%02x", raw[i]);
  OPENSSL_cleanse(raw, sizeof raw);
  uint8_t h[LT_CRYPTO_SHA256_BYTES];
  lt_crypto_sha256(key_out, strlen(key_out), h);
  int w = snprintf(line, line_size, "%s %.*s ", name, KEY_ID_LEN, key_out + 3);
  for (int i = 0; i < LT_CRYPTO_SHA256_BYTES && w > 0 && (size_t)w < line_size; i++)
    w += snprintf(line + w, line_size - (size_t)w, "%02x", h[i]);
  return LT_OK;
}
