/* lt_bus_mock: librdkafka's in-process mock cluster behind lt_bus's types (see lt_bus.h).
 *
 * `lathed --embedded` runs every role of Lathe in one process with no broker to start: one mock
 * cluster serves all its clients (api, scheduler, publisher, worker) and, because the mock brokers
 * listen on loopback TCP, the `lathe` CLI of other processes too. The cluster must be created
 * once and shared: a client configured with `test.mock.num.brokers` would start a private cluster
 * of its own that no other client sees. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_bus_int.h" /* rdkafka.h, which rdkafka_mock.h needs first */
#include <librdkafka/rdkafka_mock.h>

struct lt_bus_mock {
  rd_kafka_t *rk; /* owns the cluster (test.mock.num.brokers) and its broker threads */
  rd_kafka_mock_cluster_t *mc;
};

lt_err_t lt_bus_mock_new(int brokers, lt_bus_mock_t **out, char *errstr, size_t errstr_size) {
  if (brokers < 1 || brokers > 16)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "a mock cluster has 1 to 16 brokers, not %d", brokers);
  lt_bus_mock_t *m = calloc(1, sizeof *m);
  if (!m) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  char n[16], rkerr[512];
  snprintf(n, sizeof n, "%d", brokers);
  rd_kafka_conf_t *rc = rd_kafka_conf_new();
  rd_kafka_conf_set_log_cb(rc, lt_bus_rk_log);
  /* The handle only carries the cluster: it never produces, so keep it from logging. */
  if (rd_kafka_conf_set(rc, "test.mock.num.brokers", n, rkerr, sizeof rkerr) != RD_KAFKA_CONF_OK ||
      rd_kafka_conf_set(rc, "client.id", "lathe-mock", rkerr, sizeof rkerr) != RD_KAFKA_CONF_OK) {
    rd_kafka_conf_destroy(rc);
    free(m);
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "mock cluster: %s", rkerr);
  }
  m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, rc, rkerr, sizeof rkerr);
  if (!m->rk) {
    rd_kafka_conf_destroy(rc);
    free(m);
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "mock cluster: %s", rkerr);
  }
  m->mc = rd_kafka_handle_mock_cluster(m->rk);
  if (!m->mc) {
    rd_kafka_destroy(m->rk);
    free(m);
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL,
                   "mock cluster: this librdkafka did not start one (test.mock.num.brokers)");
  }
  *out = m;
  return LT_OK;
}

const char *lt_bus_mock_bootstraps(const lt_bus_mock_t *m) { return rd_kafka_mock_cluster_bootstraps(m->mc); }

/* As lt_bus_mock_create_topic; *out_new says whether the topic was created now. */
static lt_err_t create_topic(lt_bus_mock_t *m, const char *topic, int partitions, bool *out_new, char *errstr,
                             size_t errstr_size) {
  if (partitions < 1 || partitions > 10000)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: partitions must be 1..10000, not %d", topic,
                   partitions);
  rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(m->mc, topic, partitions, 1);
  if (e && e != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "mock cluster: creating %s: %s", topic,
                   rd_kafka_err2str(e));
  if (out_new) *out_new = e == RD_KAFKA_RESP_ERR_NO_ERROR;
  return LT_OK;
}

lt_err_t lt_bus_mock_create_topic(lt_bus_mock_t *m, const char *topic, int partitions, char *errstr,
                                  size_t errstr_size) {
  return create_topic(m, topic, partitions, NULL, errstr, errstr_size);
}

typedef struct {
  lt_bus_mock_t *m;
  int created;
} mock_topics_t;

/* The mock keeps no topic configs (compaction, retention): only names and partition counts. */
static lt_err_t mock_topic(void *ctx, const char *topic, int partitions, const char *const *configs, size_t nconfigs,
                           const char *where, char *errstr, size_t errstr_size) {
  mock_topics_t *c = ctx;
  (void)configs, (void)nconfigs, (void)where;
  bool is_new = false;
  lt_err_t ret = create_topic(c->m, topic, partitions, &is_new, errstr, errstr_size);
  if (!ret && is_new) c->created++;
  return ret;
}

lt_err_t lt_bus_mock_create_from_file(lt_bus_mock_t *m, const lt_bus_conf_t *conf, const char *path,
                                      int *out_created, char *errstr, size_t errstr_size) {
  mock_topics_t c = {.m = m};
  lt_err_t ret = lt_bus_topics_file_each(path, conf, mock_topic, &c, errstr, errstr_size);
  if (!ret && out_created) *out_created = c.created;
  return ret;
}

void lt_bus_mock_destroy(lt_bus_mock_t *m) {
  if (!m) return;
  rd_kafka_destroy(m->rk); /* destroys the cluster it started */
  free(m);
}
