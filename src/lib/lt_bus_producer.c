/* lt_bus_producer: the idempotent (optionally transactional) producer of the Kafka module.
 *
 * Two paths share one librdkafka handle: lt_bus_produce_sync() for the API's "never
 * acknowledge what is not durable" (it returns LT_OK only on a delivery report that says
 * persisted), and lt_bus_produce() for batched throughput with delivery callbacks. One internal
 * thread serves delivery reports for both. A sync caller waits on a waiter slot taken from a
 * fixed pool inside the producer (nothing is allocated per record); a slot whose caller timed
 * out is marked abandoned and goes back to the pool when its late report arrives, so a report
 * never writes into a stack frame that is gone. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lt_bus_int.h"
#include "lt_time.h"

#define LT_BUS_SYNC_SLOTS 256 /* concurrent produce_sync calls; more wait for a slot */
#define LT_BUS_MAX_HEADERS 32 /* headers per record (lt_bus_produce rejects more) */

typedef struct lt_bus_waiter {
  struct lt_bus_waiter *next_free;
  pthread_cond_t cv;
  bool done, abandoned;
  rd_kafka_resp_err_t err;
  rd_kafka_msg_status_t status;
  int32_t partition;
  int64_t offset;
} lt_bus_waiter_t;

struct lt_bus_producer {
  rd_kafka_t *rk;
  pthread_t thread;
  atomic_bool stop;
  bool transactional;
  lt_bus_delivery_cb *cb;
  void *opaque;
  pthread_mutex_t mu; /* guards the waiter pool and every waiter's fields */
  pthread_cond_t slot_cv;
  lt_bus_waiter_t *free_list;
  lt_bus_waiter_t slots[LT_BUS_SYNC_SLOTS];
  lt_bus_ce_names_t *ce; /* record names by fingerprint, for the CloudEvents headers */
  char client_id[64];    /* ce_source of a record whose envelope names no producer */
};

static bool is_waiter(lt_bus_producer_t *p, void *ptr) {
  return (char *)ptr >= (char *)p->slots && (char *)ptr < (char *)(p->slots + LT_BUS_SYNC_SLOTS);
}

/* Delivery report, on the producer's thread. */
static void dr_msg_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  lt_bus_producer_t *p = opaque;
  if (is_waiter(p, m->_private)) {
    lt_bus_waiter_t *w = m->_private;
    pthread_mutex_lock(&p->mu);
    if (w->abandoned) {
      w->abandoned = false;
      w->next_free = p->free_list;
      p->free_list = w;
      pthread_cond_signal(&p->slot_cv);
    } else {
      w->err = m->err;
      w->status = rd_kafka_message_status(m);
      w->partition = m->partition;
      w->offset = m->offset;
      w->done = true;
      pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return;
  }
  if (!p->cb) return;
  lt_bus_delivery_t d = {
      .err = m->err ? lt_bus_err_from_code(m->err) : LT_OK,
      .errmsg = m->err ? rd_kafka_err2str(m->err) : "",
      .topic = rd_kafka_topic_name(m->rkt),
      .partition = m->partition,
      .offset = m->err ? LT_BUS_OFFSET_INVALID : m->offset,
      .msg_opaque = m->_private,
  };
  /* Durable means persisted; anything else is not an acknowledgement. */
  if (d.err == LT_OK && rd_kafka_message_status(m) != RD_KAFKA_MSG_STATUS_PERSISTED) {
    d.err = LT_ERR_UNAVAILABLE;
    d.errmsg = "record not persisted";
  }
  p->cb(p->opaque, &d);
}

static void *poll_thread(void *arg) {
  lt_bus_producer_t *p = arg;
  while (!atomic_load(&p->stop)) rd_kafka_poll(p->rk, 100);
  rd_kafka_poll(p->rk, 0);
  return NULL;
}

static lt_err_t txn_err(lt_bus_producer_t *p, rd_kafka_error_t *e, const char *what,
                        char *errstr, size_t errstr_size);

lt_err_t lt_bus_producer_new(const lt_bus_conf_t *conf, const lt_bus_producer_opts_t *opts,
                             lt_bus_producer_t **out, char *errstr, size_t errstr_size) {
  /* linger.ms 0: every record is waited for by someone (an HTTP answer, a session's call, a
   * commit), and batching them for 5 ms cost a session call ~12 ms of its ~28 ms of overhead
   * (bench/sessions). A configuration may set it back. */
  static const char *const defaults[] = {
      "linger.ms", "0", "message.timeout.ms", "60000", "log.connection.close", "false",
      /* Topics exist before anyone produces (ops/stack up, lt_bus_admin_create_*), so a record
       * for a topic the broker does not know fails after 5 s (LT_ERR_NOT_FOUND) instead of
       * waiting out the caller's deadline. */
      "topic.metadata.propagation.max.ms", "5000", NULL};
  static const char *const forced[] = {"acks", "all", "enable.idempotence", "true", NULL};
  lt_bus_producer_opts_t none = {0};
  if (!opts) opts = &none;
  *out = NULL;
  lt_bus_producer_t *p = calloc(1, sizeof *p);
  if (!p) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->slot_cv, NULL);
  for (int i = 0; i < LT_BUS_SYNC_SLOTS; i++) {
    pthread_cond_init(&p->slots[i].cv, NULL);
    p->slots[i].next_free = p->free_list;
    p->free_list = &p->slots[i];
  }
  p->cb = opts->delivery_cb;
  p->opaque = opts->opaque;
  p->transactional = opts->transactional_id != NULL;
  const char *cid = lt_bus_conf_get(conf, "client.id");
  snprintf(p->client_id, sizeof p->client_id, "%s", cid && *cid ? cid : "lathe");

  lt_err_t ret = lt_bus_ce_names_new(&p->ce, errstr, errstr_size);
  if (ret) goto err_free;
  ret = LT_ERR_INVALID;
  rd_kafka_conf_t *rc = lt_bus_rk_conf(conf, defaults, forced, errstr, errstr_size);
  if (!rc) goto err_free;
  char rderr[512];
  if (opts->transactional_id &&
      rd_kafka_conf_set(rc, "transactional.id", opts->transactional_id, rderr, sizeof rderr)) {
    rd_kafka_conf_destroy(rc);
    lt_errf(errstr, errstr_size, LT_ERR_INVALID, "transactional.id: %s", rderr);
    goto err_free;
  }
  rd_kafka_conf_set_dr_msg_cb(rc, dr_msg_cb);
  rd_kafka_conf_set_opaque(rc, p);
  p->rk = lt_bus_rk_new(RD_KAFKA_PRODUCER, rc, "producer", errstr, errstr_size);
  if (!p->rk) goto err_free;
  if (pthread_create(&p->thread, NULL, poll_thread, p) != 0) {
    rd_kafka_destroy(p->rk);
    ret = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cannot start the producer's poll thread");
    goto err_free;
  }
  if (p->transactional) {
    int t = opts->init_timeout_ms > 0 ? opts->init_timeout_ms : 30000;
    lt_err_t e = txn_err(p, rd_kafka_init_transactions(p->rk, t), "init_transactions", errstr,
                         errstr_size);
    if (e) {
      lt_bus_producer_destroy(p, 0);
      return e;
    }
  }
  *out = p;
  return LT_OK;
err_free:
  lt_bus_ce_names_destroy(p->ce);
  for (int i = 0; i < LT_BUS_SYNC_SLOTS; i++) pthread_cond_destroy(&p->slots[i].cv);
  pthread_cond_destroy(&p->slot_cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
  return ret;
}

void lt_bus_producer_destroy(lt_bus_producer_t *p, int timeout_ms) {
  if (!p) return;
  if (timeout_ms > 0) rd_kafka_flush(p->rk, timeout_ms);
  if (rd_kafka_outq_len(p->rk) > 0) {
    /* Whatever is left gets a purge report now, so no waiter or caller hangs. */
    rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_flush(p->rk, 1000);
  }
  atomic_store(&p->stop, true);
  pthread_join(p->thread, NULL);
  rd_kafka_destroy(p->rk);
  lt_bus_ce_names_destroy(p->ce);
  for (int i = 0; i < LT_BUS_SYNC_SLOTS; i++) pthread_cond_destroy(&p->slots[i].cv);
  pthread_cond_destroy(&p->slot_cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* Queues one record with opaque; shared by the sync and async paths. */
static lt_err_t enqueue(lt_bus_producer_t *p, const lt_bus_record_t *rec, void *opaque,
                        char *errstr, size_t errstr_size) {
  if (!rec || !rec->topic)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "record has no topic");
  if (rec->header_count > LT_BUS_MAX_HEADERS)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "record to %s has %zu headers, the limit is %d", rec->topic,
                   rec->header_count, LT_BUS_MAX_HEADERS);
  rd_kafka_vu_t vu[8 + LT_BUS_MAX_HEADERS + LT_BUS_CE_MAX];
  size_t n = 0;
  vu[n].vtype = RD_KAFKA_VTYPE_TOPIC;
  vu[n++].u.cstr = rec->topic;
  vu[n].vtype = RD_KAFKA_VTYPE_PARTITION;
  vu[n++].u.i32 = rec->partition;
  vu[n].vtype = RD_KAFKA_VTYPE_VALUE;
  vu[n].u.mem.ptr = (void *)rec->value;
  vu[n++].u.mem.size = rec->value ? rec->value_size : 0;
  if (rec->key) {
    vu[n].vtype = RD_KAFKA_VTYPE_KEY;
    vu[n].u.mem.ptr = (void *)rec->key;
    vu[n++].u.mem.size = rec->key_size;
  }
  vu[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
  vu[n++].u.i32 = RD_KAFKA_MSG_F_COPY;
  vu[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
  vu[n++].u.ptr = opaque;
  if (rec->timestamp_ms) {
    vu[n].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
    vu[n++].u.i64 = rec->timestamp_ms;
  }
  for (size_t i = 0; i < rec->header_count; i++) {
    vu[n].vtype = RD_KAFKA_VTYPE_HEADER;
    vu[n].u.header.name = rec->headers[i].name;
    vu[n].u.header.val = rec->headers[i].value;
    vu[n++].u.header.size = rec->headers[i].value ? (ssize_t)rec->headers[i].size : 0;
  }
  lt_bus_ce_t ce; /* its strings must live until produceva has copied them */
  lt_bus_ce_fill(p->ce, p->client_id, rec, &ce);
  for (size_t i = 0; i < ce.n; i++) {
    vu[n].vtype = RD_KAFKA_VTYPE_HEADER;
    vu[n].u.header.name = ce.h[i].name;
    vu[n].u.header.val = ce.h[i].value;
    vu[n++].u.header.size = (ssize_t)ce.h[i].size;
  }
  rd_kafka_error_t *e = rd_kafka_produceva(p->rk, vu, n);
  if (!e) return LT_OK;
  rd_kafka_resp_err_t code = rd_kafka_error_code(e);
  lt_err_t le;
  if (code == RD_KAFKA_RESP_ERR__FATAL) {
    le = lt_bus_producer_fatal(p, errstr, errstr_size);
    if (le == LT_OK) le = LT_ERR_FATAL;
  } else {
    le = code == RD_KAFKA_RESP_ERR__QUEUE_FULL ? LT_ERR_RETRIABLE : lt_bus_err_from_code(code);
    lt_errf(errstr, errstr_size, le, "produce to %s: %s", rec->topic, rd_kafka_error_string(e));
  }
  rd_kafka_error_destroy(e);
  return le;
}

lt_err_t lt_bus_produce(lt_bus_producer_t *p, const lt_bus_record_t *rec, void *msg_opaque,
                        char *errstr, size_t errstr_size) {
  return enqueue(p, rec, msg_opaque, errstr, errstr_size);
}

static void deadline_after(struct timespec *ts, int ms) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_sec += ms / 1000;
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

void lt_bus_producer_prepare(lt_bus_producer_t *p, const char *topic, int timeout_ms) {
  lt_bus_learn_topic(p->rk, topic, timeout_ms);
}

lt_err_t lt_bus_produce_sync(lt_bus_producer_t *p, const lt_bus_record_t *rec, int timeout_ms,
                             int32_t *out_partition, int64_t *out_offset, char *errstr,
                             size_t errstr_size) {
  if (p->transactional)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "lt_bus_produce_sync on a transactional producer: use lt_bus_txn_*");
  struct timespec deadline;
  deadline_after(&deadline, timeout_ms > 0 ? timeout_ms : 0);

  pthread_mutex_lock(&p->mu);
  while (!p->free_list) {
    if (pthread_cond_timedwait(&p->slot_cv, &p->mu, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&p->mu);
      return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                     "produce to %s: no free sync slot within %d ms (%d in flight)", rec->topic,
                     timeout_ms, LT_BUS_SYNC_SLOTS);
    }
  }
  lt_bus_waiter_t *w = p->free_list;
  p->free_list = w->next_free;
  w->done = w->abandoned = false;
  pthread_mutex_unlock(&p->mu);

  lt_err_t e = enqueue(p, rec, w, errstr, errstr_size);
  pthread_mutex_lock(&p->mu);
  if (e) {
    w->next_free = p->free_list;
    p->free_list = w;
    pthread_cond_signal(&p->slot_cv);
    pthread_mutex_unlock(&p->mu);
    return e;
  }
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &p->mu, &deadline) == ETIMEDOUT) break;
  if (!w->done) {
    w->abandoned = true; /* the late report returns the slot */
    pthread_mutex_unlock(&p->mu);
    /* Say why, when librdkafka knows: a broker that is down shows as a fatal or transport
     * state only in logs, so report the timeout plainly. */
    return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT,
                   "produce to %s: no acknowledgement within %d ms; the record may or may not "
                   "be written (broker unavailable?)",
                   rec->topic, timeout_ms);
  }
  rd_kafka_resp_err_t err = w->err;
  rd_kafka_msg_status_t status = w->status;
  int32_t part = w->partition;
  int64_t off = w->offset;
  w->next_free = p->free_list;
  p->free_list = w;
  pthread_cond_signal(&p->slot_cv);
  pthread_mutex_unlock(&p->mu);

  if (err) {
    lt_err_t le = lt_bus_err_from_code(err);
    if (err == RD_KAFKA_RESP_ERR__FATAL) {
      le = lt_bus_producer_fatal(p, NULL, 0);
      if (le == LT_OK) le = LT_ERR_FATAL;
    }
    return lt_errf(errstr, errstr_size, le, "produce to %s: %s", rec->topic,
                   rd_kafka_err2str(err));
  }
  if (status != RD_KAFKA_MSG_STATUS_PERSISTED)
    return lt_errf(errstr, errstr_size, LT_ERR_UNAVAILABLE,
                   "produce to %s: delivery report without persisted status", rec->topic);
  if (out_partition) *out_partition = part;
  if (out_offset) *out_offset = off;
  return LT_OK;
}

lt_err_t lt_bus_producer_flush(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                               size_t errstr_size) {
  rd_kafka_resp_err_t e = rd_kafka_flush(p->rk, timeout_ms);
  if (e == RD_KAFKA_RESP_ERR__TIMED_OUT)
    return lt_errf(errstr, errstr_size, LT_ERR_TIMEOUT, "flush: %d records still queued after %d ms",
                   rd_kafka_outq_len(p->rk), timeout_ms);
  return LT_OK;
}

rd_kafka_t *lt_bus_producer_rk(lt_bus_producer_t *p) { return p->rk; }

int lt_bus_producer_outq_len(lt_bus_producer_t *p) { return rd_kafka_outq_len(p->rk); }

lt_err_t lt_bus_producer_fatal(lt_bus_producer_t *p, char *errstr, size_t errstr_size) {
  char reason[512];
  rd_kafka_resp_err_t e = rd_kafka_fatal_error(p->rk, reason, sizeof reason);
  if (!e) return LT_OK;
  lt_err_t le = lt_bus_code_is_fenced(e) ? LT_ERR_FENCED : LT_ERR_FATAL;
  return lt_errf(errstr, errstr_size, le, "producer fatal error %s: %s", rd_kafka_err2name(e),
                 reason);
}

/* ---------------------------------------------------------------- transactions */

/* Turns a txn call's error object into lt_err_t (and destroys it). An abortable error is not
 * resolved here: callers decide whether to abort. */
static lt_err_t txn_err(lt_bus_producer_t *p, rd_kafka_error_t *e, const char *what,
                        char *errstr, size_t errstr_size) {
  if (!e) return LT_OK;
  lt_bus_class_t cls = lt_bus_classify_error(p->rk, e);
  lt_err_t le;
  switch (cls) {
  case LT_BUS_CLASS_FENCED: le = LT_ERR_FENCED; break;
  case LT_BUS_CLASS_FATAL: le = LT_ERR_FATAL; break;
  case LT_BUS_CLASS_RETRIABLE:
  case LT_BUS_CLASS_ABORTABLE: le = LT_ERR_RETRIABLE; break;
  default: le = lt_bus_err_from_code(rd_kafka_error_code(e)); break;
  }
  if (le == LT_OK) le = LT_ERR_INTERNAL;
  lt_errf(errstr, errstr_size, le, "%s: %s (%s, %s)", what, rd_kafka_error_string(e),
          rd_kafka_error_name(e), lt_bus_class_name(cls));
  rd_kafka_error_destroy(e);
  return le;
}

lt_err_t lt_bus_txn_begin(lt_bus_producer_t *p, char *errstr, size_t errstr_size) {
  if (!p->transactional)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "producer has no transactional_id");
  return txn_err(p, rd_kafka_begin_transaction(p->rk), "begin_transaction", errstr, errstr_size);
}

lt_err_t lt_bus_txn_abort(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                          size_t errstr_size) {
  rd_kafka_error_t *e = rd_kafka_abort_transaction(p->rk, timeout_ms);
  if (!e) return LT_OK;
  lt_bus_class_t cls = lt_bus_classify_error(p->rk, e);
  /* A timed-out or otherwise failed abort leaves the transaction's state unknown; without
   * KIP-890 on this client the only safe way on is a new producer. */
  lt_err_t le = cls == LT_BUS_CLASS_FENCED ? LT_ERR_FENCED : LT_ERR_FATAL;
  lt_errf(errstr, errstr_size, le, "abort_transaction: %s (%s); recreate the producer",
          rd_kafka_error_string(e), rd_kafka_error_name(e));
  rd_kafka_error_destroy(e);
  return le;
}

/* Handles an abortable failure: abort, and say the step must be redone. */
static lt_err_t abort_and_retry(lt_bus_producer_t *p, const char *what, const char *why,
                                int timeout_ms, char *errstr, size_t errstr_size) {
  char aerr[512];
  lt_err_t e = lt_bus_txn_abort(p, timeout_ms > 0 ? timeout_ms : 10000, aerr, sizeof aerr);
  if (e) return lt_errf(errstr, errstr_size, e, "%s failed (%s), then %s", what, why, aerr);
  return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE,
                 "%s failed (%s); transaction aborted: rewind and redo the step", what, why);
}

lt_err_t lt_bus_txn_send_offsets(lt_bus_producer_t *p, lt_bus_consumer_t *c,
                                 const lt_bus_tp_t *offsets, size_t n, int timeout_ms,
                                 char *errstr, size_t errstr_size) {
  rd_kafka_t *crk = lt_bus_consumer_rk(c);
  rd_kafka_topic_partition_list_t *l;
  if (offsets) {
    l = lt_bus_tplist_from(offsets, n);
  } else {
    rd_kafka_resp_err_t ae = rd_kafka_assignment(crk, &l);
    if (ae)
      return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE, "send_offsets: assignment: %s",
                     rd_kafka_err2str(ae));
    rd_kafka_position(crk, l);
  }
  rd_kafka_consumer_group_metadata_t *cgmd = rd_kafka_consumer_group_metadata(crk);
  if (!cgmd) {
    rd_kafka_topic_partition_list_destroy(l);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "send_offsets: the consumer has no group id");
  }
  int64_t deadline = lt_time_mono_ms() + timeout_ms;
  lt_err_t result = LT_OK;
  for (;;) {
    int left = (int)(deadline - lt_time_mono_ms());
    rd_kafka_error_t *e =
        rd_kafka_send_offsets_to_transaction(p->rk, l, cgmd, left > 0 ? left : 1);
    if (!e) break;
    lt_bus_class_t cls = lt_bus_classify_error(p->rk, e);
    if (cls == LT_BUS_CLASS_RETRIABLE && lt_time_mono_ms() < deadline) {
      rd_kafka_error_destroy(e);
      continue;
    }
    if (cls == LT_BUS_CLASS_ABORTABLE || cls == LT_BUS_CLASS_RETRIABLE) {
      char why[256];
      snprintf(why, sizeof why, "%s", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
      result = abort_and_retry(p, "send_offsets_to_transaction", why, timeout_ms, errstr,
                               errstr_size);
      break;
    }
    result = txn_err(p, e, "send_offsets_to_transaction", errstr, errstr_size);
    break;
  }
  rd_kafka_consumer_group_metadata_destroy(cgmd);
  rd_kafka_topic_partition_list_destroy(l);
  return result;
}

lt_err_t lt_bus_txn_commit(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                           size_t errstr_size) {
  int64_t deadline = lt_time_mono_ms() + timeout_ms;
  for (;;) {
    int left = (int)(deadline - lt_time_mono_ms());
    rd_kafka_error_t *e = rd_kafka_commit_transaction(p->rk, left > 0 ? left : 1);
    if (!e) return LT_OK;
    lt_bus_class_t cls = lt_bus_classify_error(p->rk, e);
    if (cls == LT_BUS_CLASS_RETRIABLE && lt_time_mono_ms() < deadline) {
      rd_kafka_error_destroy(e);
      continue;
    }
    if (cls == LT_BUS_CLASS_ABORTABLE) {
      char why[256];
      snprintf(why, sizeof why, "%s", rd_kafka_error_string(e));
      rd_kafka_error_destroy(e);
      return abort_and_retry(p, "commit_transaction", why, timeout_ms, errstr, errstr_size);
    }
    if (cls == LT_BUS_CLASS_RETRIABLE) {
      /* The commit's outcome is unknown and 2.0.2 cannot resume it safely (no KIP-890). */
      lt_errf(errstr, errstr_size, LT_ERR_FATAL,
              "commit_transaction: %s after %d ms; outcome unknown, recreate the producer",
              rd_kafka_error_string(e), timeout_ms);
      rd_kafka_error_destroy(e);
      return LT_ERR_FATAL;
    }
    return txn_err(p, e, "commit_transaction", errstr, errstr_size);
  }
}
