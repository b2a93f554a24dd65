/* lt_bus: configuration, topic names and the error classification of the Kafka module.
 *
 * The producer, consumer and admin handles live in lt_bus_producer.c, lt_bus_consumer.c and
 * lt_bus_admin.c; this file holds what they share. The classification table is the one place
 * that decides whether a librdkafka error is retried, aborts a transaction, or recreates a
 * handle (docs/DESIGN.md §9 "broker unavailable": bounded retry, never a false ack). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_bus_int.h"
#include "lt_log.h"
#include "lt_map.h"

#define LT_BUS_PREFIX_KEY "lathe.topic.prefix"

struct lt_bus_conf {
  char *prefix;
  lt_map_t *props; /* pass-through properties (owned strings), in the order first set */
};

void lt_bus_conf_destroy(lt_bus_conf_t *c) {
  if (!c) return;
  lt_map_destroy(c->props);
  free(c->prefix);
  free(c);
}

/* A conf with this prefix and no properties (new and dup fill it), or NULL when out of memory. */
static lt_bus_conf_t *conf_alloc(const char *prefix) {
  lt_bus_conf_t *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->prefix = strdup(prefix);
  c->props = lt_map_new(free);
  if (c->prefix && c->props) return c;
  lt_bus_conf_destroy(c);
  return NULL;
}

lt_bus_conf_t *lt_bus_conf_new(void) {
  lt_bus_conf_t *c = conf_alloc(LT_BUS_DEFAULT_PREFIX);
  if (c && (lt_bus_conf_set(c, "bootstrap.servers", "127.0.0.1:9092", NULL, 0) ||
            lt_bus_conf_set(c, "client.id", "lathe", NULL, 0))) {
    lt_bus_conf_destroy(c);
    return NULL;
  }
  return c;
}

/* Sets a property (a later set replaces the value in place). */
static lt_err_t conf_put(lt_bus_conf_t *c, const char *name, const char *value) {
  char *v = strdup(value);
  if (!v) return LT_ERR_NOMEM;
  lt_err_t e = lt_map_set(c->props, name, v);
  if (e) free(v);
  return e;
}

lt_err_t lt_bus_conf_set(lt_bus_conf_t *c, const char *name, const char *value, char *errstr,
                         size_t errstr_size) {
  if (!c || !name || !value)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lt_bus_conf_set: NULL argument");
  if (strcmp(name, LT_BUS_PREFIX_KEY) == 0) {
    char *p = strdup(value);
    if (!p) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    free(c->prefix);
    c->prefix = p;
    return LT_OK;
  }
  /* Check the property against librdkafka now, so a typo fails where it is written. */
  rd_kafka_conf_t *probe = rd_kafka_conf_new();
  char rderr[256];
  rd_kafka_conf_res_t res = rd_kafka_conf_set(probe, name, value, rderr, sizeof rderr);
  rd_kafka_conf_destroy(probe);
  if (res != RD_KAFKA_CONF_OK)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "kafka property \"%s\": %s", name,
                   rderr);
  if (conf_put(c, name, value) != LT_OK)
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  return LT_OK;
}

const char *lt_bus_conf_get(const lt_bus_conf_t *c, const char *name) {
  if (strcmp(name, LT_BUS_PREFIX_KEY) == 0) return c->prefix;
  return lt_map_get(c->props, name);
}

/* Trims spaces and tabs at both ends, in place. */
static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
  return s;
}

lt_err_t lt_bus_conf_load_file(lt_bus_conf_t *c, const char *path, char *errstr, size_t errstr_size) {
  FILE *f = fopen(path, "r");
  if (!f)
    return lt_errf(errstr, errstr_size, LT_ERR_IO, "kafka config %s: %s", path, strerror(errno));
  char line[4096], why[512];
  lt_err_t e = LT_OK;
  for (int no = 1; !e && fgets(line, sizeof line, f); no++) {
    size_t len = strlen(line);
    if (len == sizeof line - 1 && line[len - 1] != '\n') {
      e = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s:%d: line longer than %zu bytes", path, no,
                  sizeof line - 2);
      break;
    }
    if (len && line[len - 1] == '\n') line[len - 1] = '\0';
    char *l = trim(line);
    if (!*l || *l == '#') continue;
    char *eq = strchr(l, '=');
    if (!eq || eq == l) {
      e = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s:%d: want name=value", path, no);
      break;
    }
    *eq = '\0';
    if ((e = lt_bus_conf_set(c, trim(l), trim(eq + 1), why, sizeof why)))
      lt_errf(errstr, errstr_size, e, "%s:%d: %s", path, no, why);
  }
  if (!e && ferror(f)) e = lt_errf(errstr, errstr_size, LT_ERR_IO, "kafka config %s: read error", path);
  fclose(f);
  return e;
}

lt_err_t lt_bus_conf_from_env(lt_bus_conf_t *c, char *errstr, size_t errstr_size) {
  static const struct {
    const char *env, *prop;
  } map[] = {
      {"LATHE_KAFKA_BOOTSTRAP", "bootstrap.servers"},
      {"LATHE_TOPIC_PREFIX", LT_BUS_PREFIX_KEY},
      {"LATHE_KAFKA_CLIENT_ID", "client.id"},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    const char *v = getenv(map[i].env);
    if (!v) continue;
    lt_err_t e = lt_bus_conf_set(c, map[i].prop, v, errstr, errstr_size);
    if (e) return e;
  }
  const char *file = getenv("LATHE_KAFKA_CONFIG");
  lt_err_t e = file && *file ? lt_bus_conf_load_file(c, file, errstr, errstr_size) : LT_OK;
  /* name=value lines that lathed --config / --set passed through (lt_conf.h), after the file. */
  const char *props = getenv("LATHE_KAFKA_PROPERTIES");
  for (const char *p = props; !e && p && *p;) {
    size_t len = strcspn(p, "\n");
    char line[4200];
    snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), p);
    char *eq = strchr(line, '=');
    if (!eq) e = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "LATHE_KAFKA_PROPERTIES: \"%.60s\" is not name=value", line);
    else {
      *eq = '\0';
      e = lt_bus_conf_set(c, line, eq + 1, errstr, errstr_size);
    }
    p += len + (p[len] == '\n');
  }
  return e;
}

lt_err_t lt_bus_conf_for_role(lt_bus_conf_t *c, const char *role, char *errstr, size_t errstr_size) {
  const char *dir = getenv("LATHE_KAFKA_CONFIG_DIR");
  if (!dir || !*dir) return LT_OK;
  for (const char *r = role; *r; r++)
    if (!((*r >= 'a' && *r <= 'z') || *r == '-'))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "kafka role \"%s\": want lowercase letters", role);
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s/%s.properties", dir, role) >= sizeof path)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "LATHE_KAFKA_CONFIG_DIR is too long");
  if (access(path, R_OK) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_IO,
                   "no Kafka credentials for role %s: %s: %s (LATHE_KAFKA_CONFIG_DIR holds one "
                   "ROLE.properties per role; ops/stack env sets it for the local stack)",
                   role, path, strerror(errno));
  return lt_bus_conf_load_file(c, path, errstr, errstr_size);
}

lt_bus_conf_t *lt_bus_conf_dup(const lt_bus_conf_t *src) {
  lt_bus_conf_t *c = conf_alloc(src->prefix);
  lt_map_iter_t it = {0};
  while (c && lt_map_next(src->props, &it))
    if (conf_put(c, it.key, it.value)) {
      lt_bus_conf_destroy(c);
      return NULL;
    }
  return c;
}

size_t lt_bus_topic_name(const lt_bus_conf_t *c, const char *base, char *out, size_t out_size) {
  size_t pl = strlen(c->prefix), bl = strlen(base);
  if (out_size > 0) {
    size_t room = out_size - 1;
    size_t a = pl < room ? pl : room;
    memcpy(out, c->prefix, a);
    size_t b = bl < room - a ? bl : room - a;
    memcpy(out + a, base, b);
    out[a + b] = '\0';
  }
  return pl + bl;
}

/* librdkafka's own lines (from its threads) as the process's log lines, so that with
 * --log-format json every stderr line is still one JSON object. Syslog levels: 0-3 error. */
void lt_bus_rk_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf) {
  lt_log(level <= 3 ? LT_LOG_ERROR : level == 4 ? LT_LOG_WARN : level <= 6 ? LT_LOG_INFO : LT_LOG_DEBUG, NULL, NULL,
         "kafka %s %s: %s", fac, rk ? rd_kafka_name(rk) : "", buf);
}

rd_kafka_conf_t *lt_bus_rk_conf(const lt_bus_conf_t *c, const char *const *defaults,
                                const char *const *forced, char *errstr, size_t errstr_size) {
  rd_kafka_conf_t *rc = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(rc, lt_bus_rk_log);
  char rderr[256];
  const char *bad = NULL;
  for (size_t i = 0; defaults && defaults[i]; i += 2)
    if (rd_kafka_conf_set(rc, defaults[i], defaults[i + 1], rderr, sizeof rderr)) {
      bad = defaults[i];
      goto err;
    }
  lt_map_iter_t it = {0};
  while (lt_map_next(c->props, &it))
    if (rd_kafka_conf_set(rc, it.key, it.value, rderr, sizeof rderr)) {
      bad = it.key;
      goto err;
    }
  for (size_t i = 0; forced && forced[i]; i += 2)
    if (rd_kafka_conf_set(rc, forced[i], forced[i + 1], rderr, sizeof rderr)) {
      bad = forced[i];
      goto err;
    }
  return rc;
err:
  lt_errf(errstr, errstr_size, LT_ERR_INVALID, "kafka property \"%s\": %s", bad, rderr);
  rd_kafka_conf_destroy(rc);
  return NULL;
}

rd_kafka_t *lt_bus_rk_new(rd_kafka_type_t type, rd_kafka_conf_t *rc, const char *what, char *errstr,
                          size_t errstr_size) {
  char rderr[512];
  rd_kafka_t *rk = rd_kafka_new(type, rc, rderr, sizeof rderr);
  if (!rk) {
    rd_kafka_conf_destroy(rc);
    lt_errf(errstr, errstr_size, LT_ERR_INVALID, "cannot create kafka %s: %s", what, rderr);
  }
  return rk;
}

/* ---------------------------------------------------------------- classification */

const char *lt_bus_class_name(lt_bus_class_t cls) {
  switch (cls) {
  case LT_BUS_CLASS_OK: return "ok";
  case LT_BUS_CLASS_RETRIABLE: return "retriable";
  case LT_BUS_CLASS_ABORTABLE: return "abortable";
  case LT_BUS_CLASS_FATAL: return "fatal";
  case LT_BUS_CLASS_FENCED: return "fenced";
  case LT_BUS_CLASS_PERMANENT: return "permanent";
  }
  return "?";
}

bool lt_bus_code_is_fenced(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR__FENCED || err == RD_KAFKA_RESP_ERR_PRODUCER_FENCED ||
         err == RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH ||
         err == RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
}

lt_bus_class_t lt_bus_classify_code(rd_kafka_resp_err_t err) {
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return LT_BUS_CLASS_OK;
  if (lt_bus_code_is_fenced(err)) return LT_BUS_CLASS_FENCED;
  switch (err) {
  case RD_KAFKA_RESP_ERR__FATAL:
  case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
  case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
  case RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE:
  case RD_KAFKA_RESP_ERR__INCONSISTENT:
  case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    return LT_BUS_CLASS_FATAL;
  case RD_KAFKA_RESP_ERR_INVALID_TXN_STATE:
    return LT_BUS_CLASS_ABORTABLE;
  case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
  case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
  case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
  case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
  case RD_KAFKA_RESP_ERR_INVALID_RECORD:
  case RD_KAFKA_RESP_ERR__INVALID_ARG:
  case RD_KAFKA_RESP_ERR__STATE:
  case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
  case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
  case RD_KAFKA_RESP_ERR_INVALID_REPLICATION_FACTOR:
  case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
  case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS:
  case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
  case RD_KAFKA_RESP_ERR__AUTHENTICATION:
  case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
  case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
  case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
  case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
  case RD_KAFKA_RESP_ERR__DESTROY:
    return LT_BUS_CLASS_PERMANENT;
  default:
    /* Timeouts, transport failures, leader moves, coordinator loads, not enough replicas,
     * a full local queue: librdkafka retries these itself, and a caller may too. */
    return LT_BUS_CLASS_RETRIABLE;
  }
}

lt_err_t lt_bus_err_from_code(rd_kafka_resp_err_t err) {
  switch (err) {
  case RD_KAFKA_RESP_ERR_NO_ERROR: return LT_OK;
  case RD_KAFKA_RESP_ERR__TIMED_OUT:
  case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
  case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
  case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    return LT_ERR_TIMEOUT;
  case RD_KAFKA_RESP_ERR__TRANSPORT:
  case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
  case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
  case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
  case RD_KAFKA_RESP_ERR__RESOLVE:
  case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
  case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    return LT_ERR_UNAVAILABLE;
  case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
  case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
  case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    return LT_ERR_NOT_FOUND;
  case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS: return LT_ERR_EXISTS;
  case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
  case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    return LT_ERR_AUTH;
  case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
  case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
    return LT_ERR_UNSUPPORTED;
  case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
  case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
  case RD_KAFKA_RESP_ERR__DESTROY:
    return LT_ERR_CANCELLED;
  default: break;
  }
  switch (lt_bus_classify_code(err)) {
  case LT_BUS_CLASS_FENCED: return LT_ERR_FENCED;
  case LT_BUS_CLASS_FATAL: return LT_ERR_FATAL;
  case LT_BUS_CLASS_PERMANENT: return LT_ERR_INVALID;
  default: return LT_ERR_RETRIABLE;
  }
}

lt_bus_class_t lt_bus_classify_error(rd_kafka_t *rk, const rd_kafka_error_t *error) {
  if (!error) return LT_BUS_CLASS_OK;
  rd_kafka_resp_err_t code = rd_kafka_error_code(error);
  if (lt_bus_code_is_fenced(code)) return LT_BUS_CLASS_FENCED;
  if (rd_kafka_error_is_fatal(error)) {
    if (rk) {
      char buf[8];
      rd_kafka_resp_err_t cause = rd_kafka_fatal_error(rk, buf, sizeof buf);
      if (lt_bus_code_is_fenced(cause)) return LT_BUS_CLASS_FENCED;
    }
    return LT_BUS_CLASS_FATAL;
  }
  if (rd_kafka_error_txn_requires_abort(error)) return LT_BUS_CLASS_ABORTABLE;
  if (rd_kafka_error_is_retriable(error)) return LT_BUS_CLASS_RETRIABLE;
  return lt_bus_classify_code(code);
}

/* ---------------------------------------------------------------- partition lists */

rd_kafka_topic_partition_list_t *lt_bus_tplist_from(const lt_bus_tp_t *parts, size_t n) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)(n ? n : 1));
  for (size_t i = 0; i < n; i++)
    rd_kafka_topic_partition_list_add(l, parts[i].topic, parts[i].partition)->offset =
        parts[i].offset;
  return l;
}

lt_bus_tp_t *lt_bus_tparray_from(const rd_kafka_topic_partition_list_t *l) {
  lt_bus_tp_t *a = calloc(l->cnt ? (size_t)l->cnt : 1, sizeof *a);
  if (!a) return NULL;
  for (int i = 0; i < l->cnt; i++) {
    a[i].topic = l->elems[i].topic;
    a[i].partition = l->elems[i].partition;
    a[i].offset = l->elems[i].offset;
  }
  return a;
}

lt_err_t lt_bus_topic_metadata(rd_kafka_t *rk, const char *topic, int timeout_ms,
                               const struct rd_kafka_metadata **out, char *errstr, size_t errstr_size) {
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  if (!rkt)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "topic \"%s\": %s", topic,
                   rd_kafka_err2str(rd_kafka_last_error()));
  rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, rkt, out, timeout_ms);
  rd_kafka_topic_destroy(rkt);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "metadata of %s: %s", topic,
                   rd_kafka_err2str(e));
  return LT_OK;
}

void lt_bus_learn_topic(rd_kafka_t *rk, const char *topic, int timeout_ms) {
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  if (!rkt) return;
  const struct rd_kafka_metadata *md = NULL;
  if (rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) == RD_KAFKA_RESP_ERR_NO_ERROR) rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(rkt);
}
