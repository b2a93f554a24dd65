/* lt_access: the lockbox fold. A grant is active only after the approvals it needs, only within
 * its scope and time, and nothing after a deny or revoke brings it back: self-approval, replayed
 * and copied approvals, another tenant's approval, a second request with the same id. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "lt_access.h"
#include "lt_recmac.h"

static lt_avro_registry_t *reg;
static lt_access_table_t *tab;
static char why[512];
static int seq;

static void setup(void) {
  cr_assert_eq(lt_avro_registry_new(&reg, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_access_table_new(false, &tab), LT_OK);
}

static void teardown(void) {
  lt_access_table_destroy(tab);
  lt_avro_registry_destroy(reg);
}

/* A record of `type` with the common fields; the caller sets the rest. */
static lt_avro_record_t *rec_new(const char *type, const char *event_id, const char *req, const char *tenant,
                                 int64_t at_ms) {
  lt_avro_record_t *r;
  cr_assert_eq(lt_avro_record_new(reg, type, &r, why, sizeof why), LT_OK, "%s", why);
  char ev[64];
  if (!event_id) snprintf(ev, sizeof ev, "ev-%d", ++seq), event_id = ev;
  cr_assert_eq(lt_avro_set_string(r, "event_id", event_id), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "occurred_at", at_ms), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "producer", "test"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "request_id", req), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "tenant_id", tenant), LT_OK);
  return r;
}

static lt_err_t apply(lt_avro_record_t *r) {
  lt_err_t e = lt_access_apply(tab, r, why, sizeof why);
  lt_avro_record_destroy(r);
  return e;
}

static lt_err_t request(const char *req, const char *tenant, const char *staff, const char *scope, int64_t dur_s) {
  lt_avro_record_t *r = rec_new("AccessRequested", NULL, req, tenant, 1000);
  cr_assert_eq(lt_avro_set_string(r, "staff_principal", staff), LT_OK);
  cr_assert_eq(lt_avro_array_append_string(r, "scope", scope), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "justification", "ticket 42"), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "duration_s", dur_s), LT_OK);
  return apply(r);
}

static lt_err_t approve(const char *event_id, const char *req, const char *tenant, const char *who, int64_t at_ms) {
  lt_avro_record_t *r = rec_new("AccessApproved", event_id, req, tenant, at_ms);
  cr_assert_eq(lt_avro_set_string(r, "approver", who), LT_OK);
  cr_assert_eq(lt_avro_set_long(r, "expires_at", at_ms + 3600 * 1000), LT_OK);
  return apply(r);
}

static lt_err_t close_req(const char *type, const char *req, const char *tenant, const char *who) {
  lt_avro_record_t *r = rec_new(type, NULL, req, tenant, 2000);
  cr_assert_eq(lt_avro_set_string(r, strcmp(type, "AccessDenied") == 0 ? "approver" : "revoked_by", who), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "reason", "no"), LT_OK);
  return apply(r);
}

static lt_err_t check(const char *req, const char *staff, const char *resource, int64_t now) {
  const lt_access_req_t *out = NULL;
  return lt_access_check(tab, req, staff, resource, now, &out, why, sizeof why);
}

TestSuite(access, .init = setup, .fini = teardown);

Test(access, a_grant_opens_only_after_the_tenant_approves_and_closes_at_expiry) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK, "%s", why);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 1500), LT_ERR_AUTH);
  cr_assert(strstr(why, "tenant's approval"), "%s", why);
  cr_assert_eq(approve(NULL, "r1", "acme", "tenant:k1", 2000), LT_OK, "%s", why);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 2001), LT_OK, "%s", why);
  /* The record's expires_at says an hour; the request asked for 600 s, so 600 s it is. */
  cr_assert_eq(lt_access_get(tab, "r1")->expires_at_ms, 2000 + 600 * 1000);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 2000 + 600 * 1000), LT_ERR_AUTH);
  cr_assert(strstr(why, "expired"), "%s", why);
}

Test(access, the_scope_is_the_limit) {
  cr_assert_eq(request("r1", "acme", "alice", "job:j-1", 600), LT_OK, "%s", why);
  cr_assert_eq(approve(NULL, "r1", "acme", "tenant:k1", 2000), LT_OK, "%s", why);
  cr_assert_eq(check("r1", "alice", "artifact:j-1/adapter.safetensors", 3000), LT_OK, "%s", why);
  cr_assert_eq(check("r1", "alice", "artifact:j-10/adapter.safetensors", 3000), LT_ERR_AUTH, "a prefix is not a job");
  cr_assert_eq(check("r1", "alice", "dataset:j-1", 3000), LT_ERR_AUTH);
  cr_assert(strstr(why, "outside the scope"), "%s", why);
}

Test(access, another_staff_members_request_looks_absent) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(approve(NULL, "r1", "acme", "tenant:k1", 2000), LT_OK);
  cr_assert_eq(check("r1", "mallory", "dataset:ds-1", 3000), LT_ERR_NOT_FOUND);
  cr_assert_eq(check("r9", "alice", "dataset:ds-1", 3000), LT_ERR_NOT_FOUND);
}

Test(access, another_tenants_approval_changes_nothing) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(approve(NULL, "r1", "globex", "tenant:k9", 2000), LT_ERR_AUTH);
  cr_assert(strstr(why, "not tenant globex's"), "%s", why);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 3000), LT_ERR_AUTH);
}

Test(access, denied_and_revoked_are_final) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(close_req("AccessDenied", "r1", "acme", "tenant:k1"), LT_OK, "%s", why);
  cr_assert_eq(approve(NULL, "r1", "acme", "tenant:k1", 3000), LT_ERR_AUTH, "an approval after a deny");
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 3500), LT_ERR_AUTH);
  cr_assert(strstr(why, "denied"), "%s", why);

  cr_assert_eq(request("r2", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(approve("ev-approve-r2", "r2", "acme", "tenant:k1", 2000), LT_OK);
  cr_assert_eq(check("r2", "alice", "dataset:ds-1", 2500), LT_OK);
  cr_assert_eq(close_req("AccessDenied", "r2", "acme", "tenant:k1"), LT_ERR_AUTH, "deny after approval: revoke");
  cr_assert_eq(close_req("AccessRevoked", "r2", "acme", "tenant:k1"), LT_OK, "%s", why);
  cr_assert_eq(check("r2", "alice", "dataset:ds-1", 2600), LT_ERR_AUTH);
  cr_assert(strstr(why, "revoked"), "%s", why);
  /* The same approval record again (a replay) and a fresh copy of it: neither reopens it. */
  cr_assert_eq(approve("ev-approve-r2", "r2", "acme", "tenant:k1", 2000), LT_ERR_EXISTS);
  cr_assert_eq(approve(NULL, "r2", "acme", "tenant:k1", 2700), LT_ERR_AUTH);
  cr_assert_eq(check("r2", "alice", "dataset:ds-1", 2800), LT_ERR_AUTH);
}

Test(access, a_request_id_is_taken_once) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(request("r1", "acme", "mallory", "dataset:ds-2", 600), LT_ERR_EXISTS);
  cr_assert_str_eq(lt_access_get(tab, "r1")->staff, "alice");
  cr_assert_eq(lt_access_count(tab), 1);
}

Test(access, malformed_requests_are_refused_with_the_field) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:../x", 600), LT_ERR_INVALID);
  cr_assert(strstr(why, "not a valid id"), "%s", why);
  cr_assert_eq(request("r2", "acme", "alice", "everything", 600), LT_ERR_INVALID);
  cr_assert_eq(request("r3", "acme", "alice", "artifact:j-1/../../x", 600), LT_ERR_INVALID);
  cr_assert_eq(request("r4", "acme", "alice", "dataset:ds-1", 0), LT_ERR_INVALID);
  cr_assert(strstr(why, "duration_s"), "%s", why);
  cr_assert_eq(request("r5", "acme", "alice", "dataset:ds-1", LT_ACCESS_MAX_DURATION_S + 1), LT_ERR_INVALID);
  cr_assert_eq(request("r6", "acme", "", "dataset:ds-1", 60), LT_ERR_INVALID);
  cr_assert_eq(lt_access_count(tab), 0, "nothing malformed is kept");
}

Test(access, policy_second_staff_never_the_requester) {
  lt_access_table_destroy(tab);
  cr_assert_eq(lt_access_table_new(true, &tab), LT_OK);
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  cr_assert_eq(approve(NULL, "r1", "acme", "tenant:k1", 2000), LT_OK);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 2100), LT_ERR_AUTH);
  cr_assert(strstr(why, "second staff"), "%s", why);
  cr_assert_eq(approve(NULL, "r1", "acme", "staff:alice", 2200), LT_ERR_AUTH, "self-approval");
  cr_assert(strstr(why, "own access request"), "%s", why);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 2300), LT_ERR_AUTH);
  cr_assert_eq(approve(NULL, "r1", "acme", "staff:bob", 2400), LT_OK, "%s", why);
  cr_assert_eq(check("r1", "alice", "dataset:ds-1", 2500), LT_OK, "%s", why);
  cr_assert_eq(lt_access_state(tab, lt_access_get(tab, "r1"), 2500), LT_ACCESS_ACTIVE);
}

Test(access, uses_are_kept_newest_first_in_a_ring) {
  cr_assert_eq(request("r1", "acme", "alice", "dataset:ds-1", 600), LT_OK);
  for (int i = 0; i < LT_ACCESS_USES_KEPT + 5; i++) {
    lt_avro_record_t *r = rec_new("AccessUsed", NULL, "r1", "acme", 3000 + i);
    cr_assert_eq(lt_avro_set_string(r, "staff_principal", "alice"), LT_OK);
    cr_assert_eq(lt_avro_set_string(r, "resource", "dataset:ds-1"), LT_OK);
    cr_assert_eq(lt_avro_set_string(r, "action", "read"), LT_OK);
    cr_assert_eq(apply(r), LT_OK, "%s", why);
  }
  const lt_access_req_t *q = lt_access_get(tab, "r1");
  cr_assert_eq(q->uses_total, LT_ACCESS_USES_KEPT + 5);
  cr_assert_eq(q->nuses, LT_ACCESS_USES_KEPT);
  cr_assert_eq(q->uses[(q->uses_total - 1) % LT_ACCESS_USES_KEPT].at_ms, 3000 + LT_ACCESS_USES_KEPT + 4);
  /* A use of another tenant's request id is not folded into this one. */
  lt_avro_record_t *r = rec_new("AccessUsed", NULL, "r1", "globex", 9000);
  cr_assert_eq(lt_avro_set_string(r, "resource", "dataset:ds-1"), LT_OK);
  cr_assert_eq(lt_avro_set_string(r, "action", "read"), LT_OK);
  cr_assert_eq(apply(r), LT_ERR_NOT_FOUND);
}

Test(access, staff_keys_authenticate_only_their_own_hash) {
  char key[LT_ACCESS_STAFF_KEY_SIZE], key2[LT_ACCESS_STAFF_KEY_SIZE], line[256], line2[256];
  cr_assert_eq(lt_access_staff_key_new("alice", key, line, sizeof line, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_access_staff_key_new("bob", key2, line2, sizeof line2, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_access_staff_key_new("../x", key2, line2, sizeof line2, why, sizeof why), LT_ERR_INVALID);
  char path[] = "/tmp/lathe-staff-XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  dprintf(fd, "# staff\n\n%s\n", line);
  close(fd);
  lt_access_staff_t *s;
  cr_assert_eq(lt_access_staff_load(path, &s, why, sizeof why), LT_OK, "%s", why);
  const char *name;
  cr_assert_eq(lt_access_staff_authenticate(s, key, &name), LT_OK);
  cr_assert_str_eq(name, "alice");
  cr_assert_eq(lt_access_staff_authenticate(s, key2, &name), LT_ERR_AUTH, "bob is not enrolled");
  key[strlen(key) - 1] ^= 1; /* one character of the secret off */
  cr_assert_eq(lt_access_staff_authenticate(s, key, &name), LT_ERR_AUTH);
  cr_assert_eq(lt_access_staff_authenticate(s, "lt_0123456789abcdef_0123456789abcdef0123456789abcdef01234567", &name),
               LT_ERR_AUTH, "a tenant-shaped key is not a staff key");
  lt_access_staff_destroy(s);
  /* A bad line is refused with its file and line number. */
  fd = open(path, O_WRONLY | O_TRUNC);
  dprintf(fd, "%s\nbob 123 abc\n", line);
  close(fd);
  cr_assert_eq(lt_access_staff_load(path, &s, why, sizeof why), LT_ERR_INVALID);
  cr_assert(strstr(why, ":2:"), "%s", why);
  /* A comment longer than any buffer is one comment: a staff line at its end enrols no one (it
   * did when lines were read 511 bytes at a time). */
  fd = open(path, O_WRONLY | O_TRUNC);
  dprintf(fd, "# %0*d%s\n", 509, 0, line2);
  close(fd);
  cr_assert_eq(lt_access_staff_load(path, &s, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_access_staff_authenticate(s, key2, &name), LT_ERR_AUTH, "bob, inside a comment, is not enrolled");
  lt_access_staff_destroy(s);
  unlink(path);
}

/* The record MAC: only the master key that made it, for the purpose it was made for, over exactly
 * the topic, key and value it was made on. */
Test(access, the_record_mac_binds_master_key_purpose_topic_key_and_value) {
  lt_crypto_kek_t *kek, *other;
  cr_assert_eq(lt_crypto_kek_from_text(&kek, "m1", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", why,
                                       sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_crypto_kek_from_text(&other, "m1", "ff112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", why,
                                       sizeof why), LT_OK, "%s", why);
  lt_recmac_key_t *t, *a, *o;
  cr_assert_eq(lt_recmac_key_new(kek, LT_RECMAC_TENANTS, &t, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_recmac_key_new(kek, LT_RECMAC_AUDIT, &a, why, sizeof why), LT_OK, "%s", why);
  cr_assert_eq(lt_recmac_key_new(other, LT_RECMAC_TENANTS, &o, why, sizeof why), LT_OK, "%s", why);
  uint8_t mac[LT_RECMAC_BYTES];
  lt_recmac_sign(t, "tenants", "acme", 4, "value", 5, mac);
  cr_assert(lt_recmac_verify(t, "tenants", "acme", 4, "value", 5, mac, sizeof mac));
  cr_assert_not(lt_recmac_verify(o, "tenants", "acme", 4, "value", 5, mac, sizeof mac), "another master key");
  cr_assert_not(lt_recmac_verify(a, "tenants", "acme", 4, "value", 5, mac, sizeof mac), "another purpose");
  cr_assert_not(lt_recmac_verify(t, "audit", "acme", 4, "value", 5, mac, sizeof mac), "another topic");
  cr_assert_not(lt_recmac_verify(t, "tenants", "acm", 3, "evalue", 6, mac, sizeof mac), "a byte moved key->value");
  cr_assert_not(lt_recmac_verify(t, "tenants", "acme", 4, "valuE", 5, mac, sizeof mac), "another value");
  cr_assert_not(lt_recmac_verify(t, "tenants", "acme", 4, "value", 5, mac, sizeof mac - 1), "a short MAC");
  mac[0] ^= 1;
  cr_assert_not(lt_recmac_verify(t, "tenants", "acme", 4, "value", 5, mac, sizeof mac), "a flipped bit");
  lt_recmac_key_destroy(t);
  lt_recmac_key_destroy(a);
  lt_recmac_key_destroy(o);
  lt_crypto_kek_destroy(kek);
  lt_crypto_kek_destroy(other);
}
