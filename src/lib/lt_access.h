/* lt_access: the staff-access lockbox, folded from lathe.audit (docs/DESIGN.md §4 invariant 8, §5a).
 *
 * A staff member asks for scoped, time-limited access to one tenant's data (AccessRequested); the
 * tenant approves or denies it (AccessApproved with approver "tenant:<key id>", AccessDenied);
 * where policy asks for it, a second staff member approves too (AccessApproved with approver
 * "staff:<name>", never the requester); anyone entitled may revoke it (AccessRevoked); each use is
 * AccessUsed. The grant is active from the last approval it needs until the tenant's approval time
 * plus the requested duration, unless denied or revoked first. Denied and revoked are final: an
 * approval that comes later (a replay, a copy) changes nothing.
 *
 * The table is the same fold in every process that reads lathe.audit; what reaches it has already
 * passed the record MAC (lt_recmac.h). A record that does not fit (unknown request, another
 * tenant's request, self-approval, a repeated event id, a malformed scope) is ignored and the
 * reason returned, so a forged or replayed record can change nothing.
 *
 * Scopes: "dataset:<id>" (that dataset's content), "job:<id>" (that job and all its artifacts),
 * "artifact:<job id>/<name>" (one artifact).
 *
 * Thread safety: one thread at a time per table. */
#ifndef LT_ACCESS_H
#define LT_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_avro.h"
#include "lt_err.h"
#include "lt_jobspec.h"

#define LT_ACCESS_SCOPE_MAX 8     /* scopes per request */
#define LT_ACCESS_SCOPE_LEN 192   /* bytes of one scope, NUL included */
#define LT_ACCESS_PRINCIPAL_LEN 96 /* "tenant:<key id>", "staff:<name>", NUL included */
#define LT_ACCESS_REASON_LEN 512
#define LT_ACCESS_MAX_DURATION_S (7 * 24 * 3600) /* the longest grant anyone may ask for */
#define LT_ACCESS_USES_KEPT 32    /* newest uses kept per request (all are in lathe.audit) */

typedef enum lt_access_state {
  LT_ACCESS_PENDING,  /* waiting for an approval it needs */
  LT_ACCESS_ACTIVE,   /* approved and not expired */
  LT_ACCESS_EXPIRED,  /* approved, and the time is up */
  LT_ACCESS_DENIED,
  LT_ACCESS_REVOKED
} lt_access_state_t;

typedef struct lt_access_use {
  int64_t at_ms;
  char resource[LT_ACCESS_SCOPE_LEN];
  char action[16];
} lt_access_use_t;

typedef struct lt_access_req {
  char request_id[LT_ID_MAX + 1];
  char tenant_id[LT_ID_MAX + 1];
  char staff[LT_ACCESS_PRINCIPAL_LEN];  /* the requester's staff name */
  size_t nscope;
  char scope[LT_ACCESS_SCOPE_MAX][LT_ACCESS_SCOPE_LEN];
  char justification[LT_ACCESS_REASON_LEN];
  int64_t duration_s;
  int64_t requested_at_ms;
  char tenant_approver[LT_ACCESS_PRINCIPAL_LEN]; /* "" until the tenant approved */
  int64_t expires_at_ms;                         /* set by the tenant's approval */
  char staff_approver[LT_ACCESS_PRINCIPAL_LEN];  /* "" until a second staff member approved */
  bool denied, revoked;
  char closed_by[LT_ACCESS_PRINCIPAL_LEN]; /* who denied or revoked */
  char reason[LT_ACCESS_REASON_LEN];       /* why */
  int64_t closed_at_ms;
  uint64_t uses_total;
  size_t nuses;                              /* min(uses_total, LT_ACCESS_USES_KEPT) */
  lt_access_use_t uses[LT_ACCESS_USES_KEPT]; /* ring: the newest at (uses_total - 1) % KEPT */
} lt_access_req_t;

typedef struct lt_access_table lt_access_table_t;

/* require_second_staff: a grant needs a second staff member's approval besides the tenant's. */
lt_err_t lt_access_table_new(bool require_second_staff, lt_access_table_t **out);
void lt_access_table_destroy(lt_access_table_t *t);
bool lt_access_needs_second_staff(const lt_access_table_t *t);

/* Folds one decoded Access* record. LT_OK: applied. LT_ERR_EXISTS: an event id already applied
 * (a replay). LT_ERR_INVALID, LT_ERR_NOT_FOUND, LT_ERR_AUTH: ignored, with the reason in errstr.
 * LT_ERR_UNSUPPORTED: not an Access* record. The table is unchanged unless LT_OK. */
lt_err_t lt_access_apply(lt_access_table_t *t, lt_avro_record_t *rec, char *errstr, size_t errstr_size);

/* The request, or NULL. Valid until the next apply. */
const lt_access_req_t *lt_access_get(const lt_access_table_t *t, const char *request_id);
size_t lt_access_count(const lt_access_table_t *t);
const lt_access_req_t *lt_access_at(const lt_access_table_t *t, size_t i); /* in the log's order */

lt_access_state_t lt_access_state(const lt_access_table_t *t, const lt_access_req_t *r, int64_t now_ms);
const char *lt_access_state_name(lt_access_state_t s); /* "pending", "active", ... */

/* May staff `staff` read `resource` ("dataset:<id>" or "artifact:<job>/<name>") now under request
 * request_id? LT_OK with *out set; LT_ERR_NOT_FOUND when there is no such request of this staff
 * member (another's request looks absent); LT_ERR_AUTH with the reason (pending, denied,
 * revoked, expired, outside the scope). */
lt_err_t lt_access_check(const lt_access_table_t *t, const char *request_id, const char *staff,
                         const char *resource, int64_t now_ms, const lt_access_req_t **out, char *errstr,
                         size_t errstr_size);

/* Checks one scope string's form (LT_ERR_INVALID naming what is wrong). */
lt_err_t lt_access_scope_valid(const char *scope, char *errstr, size_t errstr_size);

/* ---------------------------------------------------------------- staff keys
 *
 * Staff members authenticate with their own keys, "ls_<key id>_<secret>" (16 and 40 lowercase hex
 * characters), never a tenant's. The API reads them from a file the operator keeps (lathed's
 * LATHE_STAFF_KEYS_FILE), one staff member per line: "<name> <key id> <sha256 hex of the key>";
 * blank lines and lines starting with '#' are skipped. Only hashes are stored. */

#define LT_ACCESS_STAFF_KEY_SIZE (3 + 16 + 1 + 40 + 1)
#define LT_ACCESS_STAFF_MAX 256

typedef struct lt_access_staff lt_access_staff_t;

/* Loads the file (path NULL or "": no staff at all). LT_ERR_INVALID names the file and line. */
lt_err_t lt_access_staff_load(const char *path, lt_access_staff_t **out, char *errstr, size_t errstr_size);
void lt_access_staff_destroy(lt_access_staff_t *s);

/* LT_OK with *name (borrowed from s) when key is a staff key in s; LT_ERR_AUTH for anything else,
 * the same answer whatever was wrong. */
lt_err_t lt_access_staff_authenticate(const lt_access_staff_t *s, const char *key, const char **name);

/* True when key has a staff key's shape ("ls_" ...), valid or not. */
bool lt_access_is_staff_key(const char *key);

/* A fresh key for staff member `name` and the line that enrols it (NUL-terminated, no newline). */
lt_err_t lt_access_staff_key_new(const char *name, char key_out[LT_ACCESS_STAFF_KEY_SIZE], char *line, size_t line_size,
                                 char *errstr, size_t errstr_size);

#endif
