/* lt_bus_acl: the roles' Kafka ACLs from ops/acls.tsv (docs/DESIGN.md §5a).
 *
 * ops/stack applies the same file for the prefix "lathe." as the broker's super user, in Java;
 * this is the C reader, for `lathe admin topics` (an operator setting up a prefix) and for the
 * tests, whose scratch prefixes need the roles' ACLs before any role can use them. The table is
 * compiled in (lt_acls_gen.c), like ops/topics.tsv. Creating an ACL that exists is a no-op in
 * Kafka, so applying the file twice is harmless. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_bus_int.h"
#include "lt_time.h"

extern const char lt_acls_builtin[];

#define MAX_BINDINGS 512

typedef struct acl_set {
  rd_kafka_AclBinding_t *b[MAX_BINDINGS];
  size_t n;
  size_t skipped; /* transactional-id lines */
} acl_set_t;

static rd_kafka_ResourceType_t resource_type(const char *s) {
  if (strcmp(s, "topic") == 0) return RD_KAFKA_RESOURCE_TOPIC;
  if (strcmp(s, "group") == 0) return RD_KAFKA_RESOURCE_GROUP;
  if (strcmp(s, "cluster") == 0) return RD_KAFKA_RESOURCE_BROKER; /* the cluster resource */
  return RD_KAFKA_RESOURCE_UNKNOWN;
}

static rd_kafka_AclOperation_t operation(const char *s) {
  static const struct {
    const char *name;
    rd_kafka_AclOperation_t op;
  } ops[] = {
      {"Read", RD_KAFKA_ACL_OPERATION_READ},
      {"Write", RD_KAFKA_ACL_OPERATION_WRITE},
      {"Describe", RD_KAFKA_ACL_OPERATION_DESCRIBE},
      {"Create", RD_KAFKA_ACL_OPERATION_CREATE},
      {"Delete", RD_KAFKA_ACL_OPERATION_DELETE},
      {"Alter", RD_KAFKA_ACL_OPERATION_ALTER},
      {"DescribeConfigs", RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS},
      {"AlterConfigs", RD_KAFKA_ACL_OPERATION_ALTER_CONFIGS},
      {"IdempotentWrite", RD_KAFKA_ACL_OPERATION_IDEMPOTENT_WRITE},
  };
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (strcmp(s, ops[i].name) == 0) return ops[i].op;
  return RD_KAFKA_ACL_OPERATION_UNKNOWN;
}

/* One line's bindings (one per operation) into set; errors name where. */
static lt_err_t parse_line(const lt_bus_conf_t *conf, char *line, const char *where, acl_set_t *set,
                           char *errstr, size_t n) {
  char *f[5] = {0};
  int nf = 0;
  for (char *save = NULL, *t = strtok_r(line, "\t", &save); t && nf < 5; t = strtok_r(NULL, "\t", &save)) f[nf++] = t;
  if (nf != 5)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%swant 5 TAB-separated columns (role, resource, name, pattern, "
                   "operations), got %d", where, nf);
  /* librdkafka 2.0.2 has no TRANSACTIONAL_ID resource type: those lines are ops/stack's (Java)
   * or the operator's (kafka-acls) to apply. */
  if (strcmp(f[1], "transactional-id") == 0) {
    set->skipped++;
    return LT_OK;
  }
  rd_kafka_ResourceType_t rt = resource_type(f[1]);
  if (rt == RD_KAFKA_RESOURCE_UNKNOWN)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%sunknown resource \"%s\" (topic, group, transactional-id, cluster)",
                   where, f[1]);
  bool prefixed = strcmp(f[3], "prefixed") == 0;
  if (!prefixed && strcmp(f[3], "literal") != 0)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%spattern must be literal or prefixed, got \"%s\"", where, f[3]);
  char name[256], principal[128];
  if (rt == RD_KAFKA_RESOURCE_BROKER) snprintf(name, sizeof name, "%s", f[2]);
  else if (lt_bus_topic_name(conf, strcmp(f[2], "*") == 0 ? "" : f[2], name, sizeof name) >= sizeof name)
    return lt_errf(errstr, n, LT_ERR_INVALID, "%sname too long", where);
  if (!*name) return lt_errf(errstr, n, LT_ERR_INVALID, "%s\"*\" needs a non-empty topic prefix", where);
  snprintf(principal, sizeof principal, "User:%s", f[0]);
  for (char *save = NULL, *op = strtok_r(f[4], ",", &save); op; op = strtok_r(NULL, ",", &save)) {
    rd_kafka_AclOperation_t o = operation(op);
    if (o == RD_KAFKA_ACL_OPERATION_UNKNOWN)
      return lt_errf(errstr, n, LT_ERR_INVALID, "%sunknown operation \"%s\"", where, op);
    if (set->n == MAX_BINDINGS) return lt_errf(errstr, n, LT_ERR_INVALID, "%smore than %d ACLs", where, MAX_BINDINGS);
    char rderr[256];
    rd_kafka_AclBinding_t *b = rd_kafka_AclBinding_new(
        rt, name, prefixed ? RD_KAFKA_RESOURCE_PATTERN_PREFIXED : RD_KAFKA_RESOURCE_PATTERN_LITERAL, principal, "*",
        o, RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW, rderr, sizeof rderr);
    if (!b) return lt_errf(errstr, n, LT_ERR_INVALID, "%s%s", where, rderr);
    set->b[set->n++] = b;
  }
  return LT_OK;
}

/* Every binding of the file (path NULL: the built-in copy). */
static lt_err_t read_acls(const lt_bus_conf_t *conf, const char *path, acl_set_t *set, char *errstr, size_t n) {
  FILE *f = path ? fopen(path, "r") : fmemopen((void *)lt_acls_builtin, strlen(lt_acls_builtin), "r");
  if (!path) path = "ops/acls.tsv (built in)";
  if (!f) return lt_errf(errstr, n, LT_ERR_IO, "%s: %s", path, strerror(errno));
  char line[1024], where[300];
  lt_err_t e = LT_OK;
  for (int no = 1; !e && fgets(line, sizeof line, f); no++) {
    line[strcspn(line, "\r\n")] = '\0';
    if (!line[0] || line[0] == '#') continue;
    snprintf(where, sizeof where, "%s:%d: ", path, no);
    e = parse_line(conf, line, where, set, errstr, n);
  }
  fclose(f);
  return e;
}

/* A broker without an authorizer answers SECURITY_DISABLED: nothing to set there, which is
 * LT_ERR_UNSUPPORTED (callers say so and go on), never LT_ERR_INVALID (a bad file). */
static lt_err_t acl_err(rd_kafka_resp_err_t e) {
  return e == RD_KAFKA_RESP_ERR_SECURITY_DISABLED ? LT_ERR_UNSUPPORTED : lt_bus_err_from_code(e);
}

/* Does the broker's authorizer list binding b yet? (DescribeAcls is answered by the same
 * authorizer that checks requests, so once it lists b, b is in force.) */
static bool acl_listed(rd_kafka_t *rk, const rd_kafka_AclBinding_t *b, int timeout_ms) {
  char rderr[256];
  rd_kafka_AclBindingFilter_t *f = rd_kafka_AclBindingFilter_new(
      rd_kafka_AclBinding_restype(b), rd_kafka_AclBinding_name(b), rd_kafka_AclBinding_resource_pattern_type(b),
      rd_kafka_AclBinding_principal(b), rd_kafka_AclBinding_host(b), rd_kafka_AclBinding_operation(b),
      rd_kafka_AclBinding_permission_type(b), rderr, sizeof rderr);
  rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
  bool listed = false;
  if (f) {
    rd_kafka_DescribeAcls(rk, f, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, timeout_ms);
    size_t cnt = 0;
    if (ev && !rd_kafka_event_error(ev))
      rd_kafka_DescribeAcls_result_acls(rd_kafka_event_DescribeAcls_result(ev), &cnt);
    listed = cnt > 0;
    if (ev) rd_kafka_event_destroy(ev);
    rd_kafka_AclBinding_destroy(f);
  }
  rd_kafka_queue_destroy(q);
  return listed;
}

lt_err_t lt_bus_admin_create_acls(lt_bus_admin_t *a, const char *path, int timeout_ms, size_t *out_n,
                                  size_t *out_skipped, char *errstr, size_t errstr_size) {
  acl_set_t *set = calloc(1, sizeof *set);
  if (!set) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  lt_err_t ret = read_acls(lt_bus_admin_conf(a), path, set, errstr, errstr_size);
  rd_kafka_t *rk = lt_bus_admin_rk(a);
  rd_kafka_queue_t *q = ret ? NULL : rd_kafka_queue_new(rk);
  rd_kafka_AdminOptions_t *ao = q ? rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATEACLS) : NULL;
  rd_kafka_event_t *ev = NULL;
  if (ao) {
    char rderr[256];
    rd_kafka_AdminOptions_set_request_timeout(ao, timeout_ms, rderr, sizeof rderr);
    rd_kafka_CreateAcls(rk, set->b, set->n, ao, q);
    ev = rd_kafka_queue_poll(q, timeout_ms + 2000);
    if (!ev) ret = lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "create ACLs: no answer in %d ms", timeout_ms);
  }
  if (ev && rd_kafka_event_error(ev))
    ret = lt_errf(errstr, errstr_size, acl_err(rd_kafka_event_error(ev)), "create ACLs: %s",
                  rd_kafka_event_error_string(ev));
  else if (ev) {
    size_t cnt = 0;
    const rd_kafka_acl_result_t **res = rd_kafka_CreateAcls_result_acls(rd_kafka_event_CreateAcls_result(ev), &cnt);
    for (size_t i = 0; i < cnt && !ret; i++) {
      const rd_kafka_error_t *err = rd_kafka_acl_result_error(res[i]);
      if (err)
        ret = lt_errf(errstr, errstr_size, acl_err(rd_kafka_error_code(err)),
                      "create ACLs (as the admin principal, which needs Alter on the cluster): %s",
                      rd_kafka_error_string(err));
    }
  }
  /* KRaft applies new ACLs through the metadata log, a moment after CreateAcls answers: wait
   * until the last one is in force, so the caller may use it at once (a topic created right
   * after under a new prefix was refused without this). All came in one request. */
  int64_t t0 = lt_time_mono_ms();
  while (!ret && set->n && !acl_listed(rk, set->b[set->n - 1], timeout_ms)) {
    if (lt_time_mono_ms() - t0 > timeout_ms) {
      ret = lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "the new ACLs were not in force after %d ms", timeout_ms);
      break;
    }
    struct timespec nap = {0, 100 * 1000000L};
    nanosleep(&nap, NULL);
  }
  if (!ret && out_n) *out_n = set->n;
  if (!ret && out_skipped) *out_skipped = set->skipped;
  if (ev) rd_kafka_event_destroy(ev);
  if (ao) rd_kafka_AdminOptions_destroy(ao);
  if (q) rd_kafka_queue_destroy(q);
  for (size_t i = 0; i < set->n; i++) rd_kafka_AclBinding_destroy(set->b[i]);
  free(set);
  return ret;
}
