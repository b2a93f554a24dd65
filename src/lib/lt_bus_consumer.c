/* lt_bus_consumer: the read_committed consumer of the Kafka module.
 *
 * Group consumption with explicit offset commits, manual assignment and seeks (replay from the
 * beginning, an offset or a time), pause/resume, and a wake-up pipe so a libevent loop polls
 * only when librdkafka has queued something. Records are handed out as borrowed views of
 * librdkafka's own message (lt_bus_msg_t is rd_kafka_message_t): nothing is copied, and the
 * previous message is released at the next poll. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_bus_int.h"
#include "lt_time.h"

struct lt_bus_consumer {
  rd_kafka_t *rk;
  rd_kafka_queue_t *queue; /* the consumer queue, with io events on pipefd[1] */
  int pipefd[2];
  rd_kafka_message_t *cur; /* the record last handed out, released at the next poll */
  bool has_group;
  lt_bus_rebalance_cb *cb;
  void *opaque;
  rd_kafka_resp_err_t async_commit_err; /* last async commit failure, reported once */
  bool fd_armed;                        /* lt_bus_consumer_fd() was called */
  /* lt_bus_consumer_heal_stalls: each assigned partition's position when it last moved, and
   * where a fetch started over begins (where lt_bus_consumer_assign started it, then the last
   * position it reached) */
  struct watch {
    char *topic;
    int32_t partition;
    int64_t pos, since_ms, start;
  } *watch;
  size_t nwatch, capwatch;
  int64_t watched_ms; /* when heal_stalls last looked */
};

rd_kafka_t *lt_bus_consumer_rk(lt_bus_consumer_t *c) { return c->rk; }

/* ---------------------------------------------------------------- message views */

static const rd_kafka_message_t *rkm(const lt_bus_msg_t *m) {
  return (const rd_kafka_message_t *)m;
}

const char *lt_bus_msg_topic(const lt_bus_msg_t *m) { return rd_kafka_topic_name(rkm(m)->rkt); }
int32_t lt_bus_msg_partition(const lt_bus_msg_t *m) { return rkm(m)->partition; }
int64_t lt_bus_msg_offset(const lt_bus_msg_t *m) { return rkm(m)->offset; }

int64_t lt_bus_msg_timestamp(const lt_bus_msg_t *m) {
  rd_kafka_timestamp_type_t t;
  return rd_kafka_message_timestamp(rkm(m), &t);
}

const void *lt_bus_msg_key(const lt_bus_msg_t *m, size_t *size) {
  if (size) *size = rkm(m)->key ? rkm(m)->key_len : 0;
  return rkm(m)->key;
}

const void *lt_bus_msg_value(const lt_bus_msg_t *m, size_t *size) {
  if (size) *size = rkm(m)->payload ? rkm(m)->len : 0;
  return rkm(m)->payload;
}

static rd_kafka_headers_t *msg_headers(const lt_bus_msg_t *m) {
  rd_kafka_headers_t *h = NULL;
  if (rd_kafka_message_headers(rkm(m), &h)) return NULL;
  return h;
}

size_t lt_bus_msg_header_count(const lt_bus_msg_t *m) {
  rd_kafka_headers_t *h = msg_headers(m);
  return h ? rd_kafka_header_cnt(h) : 0;
}

bool lt_bus_msg_header(const lt_bus_msg_t *m, size_t i, lt_bus_header_t *out) {
  rd_kafka_headers_t *h = msg_headers(m);
  const char *name;
  const void *val;
  size_t size;
  if (!h || rd_kafka_header_get_all(h, i, &name, &val, &size)) return false;
  out->name = name;
  out->value = val;
  out->size = size;
  return true;
}

bool lt_bus_msg_header_get(const lt_bus_msg_t *m, const char *name, const void **value,
                           size_t *size) {
  rd_kafka_headers_t *h = msg_headers(m);
  if (!h || rd_kafka_header_get_last(h, name, value, size)) return false;
  return true;
}

/* ---------------------------------------------------------------- lifecycle */

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque) {
  lt_bus_consumer_t *c = opaque;
  bool coop = strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
  lt_bus_tp_t *arr = c->cb ? lt_bus_tparray_from(parts) : NULL;
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    if (coop) {
      rd_kafka_error_t *e = rd_kafka_incremental_assign(rk, parts);
      if (e) rd_kafka_error_destroy(e);
    } else {
      rd_kafka_assign(rk, parts);
    }
    if (arr) c->cb(c->opaque, c, LT_BUS_ASSIGNED, arr, (size_t)parts->cnt);
  } else {
    if (arr) c->cb(c->opaque, c, LT_BUS_REVOKED, arr, (size_t)parts->cnt);
    if (coop) {
      rd_kafka_error_t *e = rd_kafka_incremental_unassign(rk, parts);
      if (e) rd_kafka_error_destroy(e);
    } else {
      rd_kafka_assign(rk, NULL);
    }
  }
  free(arr);
}

static void offset_commit_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                             rd_kafka_topic_partition_list_t *offsets, void *opaque) {
  lt_bus_consumer_t *c = opaque;
  if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) c->async_commit_err = err;
}

lt_err_t lt_bus_consumer_new(const lt_bus_conf_t *conf, const lt_bus_consumer_opts_t *opts,
                             lt_bus_consumer_t **out, char *errstr, size_t errstr_size) {
  /* queued.min.messages: librdkafka stops fetching a partition whose local queue passed this
   * many records and looks again only after a 1 s back-off. A consumer folding a backlog (replay,
   * start-up, a standby taking over) is slower than the fetch, so at librdkafka's default of
   * 100,000 it stalled ~1 s every few hundred thousand records (bench_replay: 185k records/s
   * folded against 438k consumed). The memory bound stays queued.max.messages.kbytes. */
  static const char *const defaults[] = {"log.connection.close", "false",
                                         "allow.auto.create.topics", "false",
                                         "queued.min.messages", "1000000", NULL};
  static const char *const forced[] = {"isolation.level", "read_committed",
                                       "enable.auto.commit", "false", NULL};
  lt_bus_consumer_opts_t none = {0};
  if (!opts) opts = &none;
  *out = NULL;
  lt_bus_consumer_t *c = calloc(1, sizeof *c);
  if (!c) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  c->pipefd[0] = c->pipefd[1] = -1;
  c->cb = opts->rebalance_cb;
  c->opaque = opts->opaque;
  c->has_group = opts->group_id != NULL;

  lt_err_t ret = LT_ERR_INVALID;
  char rderr[512];
  rd_kafka_conf_t *rc = lt_bus_rk_conf(conf, defaults, forced, errstr, errstr_size);
  if (!rc) goto err;
  /* librdkafka polls only through a consumer group handle, so an assign-only consumer gets a
   * group id too; it never joins (no subscribe) and never commits (has_group is false). It still
   * looks up the group's coordinator, which needs Describe on the group: the name takes the
   * prefix, so ops/acls.tsv grants it per deployment. */
  char assign_only[256];
  lt_bus_topic_name(conf, "assign-only", assign_only, sizeof assign_only);
  if (rd_kafka_conf_set(rc, "group.id", opts->group_id ? opts->group_id : assign_only,
                        rderr, sizeof rderr) ||
      rd_kafka_conf_set(rc, "auto.offset.reset",
                        opts->auto_offset_reset ? opts->auto_offset_reset : "earliest", rderr,
                        sizeof rderr)) {
    rd_kafka_conf_destroy(rc);
    lt_errf(errstr, errstr_size, LT_ERR_INVALID, "consumer options: %s", rderr);
    goto err;
  }
  rd_kafka_conf_set_rebalance_cb(rc, rebalance_cb);
  rd_kafka_conf_set_offset_commit_cb(rc, offset_commit_cb);
  rd_kafka_conf_set_opaque(rc, c);
  c->rk = lt_bus_rk_new(RD_KAFKA_CONSUMER, rc, "consumer", errstr, errstr_size);
  if (!c->rk) goto err;
  rd_kafka_poll_set_consumer(c->rk);
  if (pipe2(c->pipefd, O_NONBLOCK | O_CLOEXEC) != 0) {
    ret = lt_errf(errstr, errstr_size, LT_ERR_IO, "consumer wake-up pipe: %s", strerror(errno));
    goto err;
  }
  c->queue = rd_kafka_queue_get_consumer(c->rk);
  *out = c;
  return LT_OK;
err:
  lt_bus_consumer_destroy(c);
  return ret;
}

void lt_bus_consumer_destroy(lt_bus_consumer_t *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nwatch; i++) free(c->watch[i].topic);
  free(c->watch);
  if (c->cur) rd_kafka_message_destroy(c->cur);
  if (c->rk) {
    if (c->queue) {
      rd_kafka_queue_io_event_enable(c->queue, -1, NULL, 0);
      rd_kafka_queue_destroy(c->queue);
    }
    rd_kafka_consumer_close(c->rk);
    rd_kafka_destroy(c->rk);
  }
  if (c->pipefd[0] >= 0) close(c->pipefd[0]);
  if (c->pipefd[1] >= 0) close(c->pipefd[1]);
  free(c);
}

/* The wake-up pipe is armed on first use: librdkafka writes to it when the queue becomes
 * non-empty, which costs a syscall per wake-up that consumers without an event loop need not
 * pay. */
int lt_bus_consumer_fd(lt_bus_consumer_t *c) {
  if (!c->fd_armed) {
    rd_kafka_queue_io_event_enable(c->queue, c->pipefd[1], "1", 1);
    c->fd_armed = true;
  }
  return c->pipefd[0];
}

/* ---------------------------------------------------------------- subscription, poll */

lt_err_t lt_bus_consumer_subscribe(lt_bus_consumer_t *c, const char *const *topics, size_t n,
                                   char *errstr, size_t errstr_size) {
  if (!c->has_group)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "subscribe needs a consumer group id");
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new((int)n);
  for (size_t i = 0; i < n; i++)
    rd_kafka_topic_partition_list_add(l, topics[i], RD_KAFKA_PARTITION_UA);
  rd_kafka_resp_err_t e = rd_kafka_subscribe(c->rk, l);
  rd_kafka_topic_partition_list_destroy(l);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "subscribe: %s",
                   rd_kafka_err2str(e));
  return LT_OK;
}

/* Learns the leaders of a topic's partitions before they are assigned. librdkafka creates a
 * partition's state on assign; one whose leader this handle does not know yet waits for a
 * metadata refresh and then for its offset-query retry timer, ~500 ms before the first fetch
 * (seen in every start-up and replay). A metadata request through a topic handle made first
 * gives the partitions their leader, and assign fetches at once. Best effort: on failure (the
 * broker down) librdkafka's own retry takes over, as before. */
static void learn_leaders(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n) {
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t k = 0; k < i && !seen; k++) seen = strcmp(parts[k].topic, parts[i].topic) == 0;
    if (seen) continue;
    lt_bus_learn_topic(c->rk, parts[i].topic, 2000);
  }
}

static struct watch *watch_of(lt_bus_consumer_t *c, const char *topic, int32_t partition, int64_t now);

lt_err_t lt_bus_consumer_assign(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                                char *errstr, size_t errstr_size) {
  learn_leaders(c, parts, n);
  int64_t now = lt_time_mono_ms();
  for (size_t i = 0; i < n; i++) { /* a fresh start for heal_stalls: nothing delivered yet */
    struct watch *w = watch_of(c, parts[i].topic, parts[i].partition, now);
    if (!w) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    w->start = parts[i].offset;
    w->pos = RD_KAFKA_OFFSET_INVALID;
    w->since_ms = now;
  }
  rd_kafka_topic_partition_list_t *l = n ? lt_bus_tplist_from(parts, n) : NULL;
  rd_kafka_resp_err_t e = rd_kafka_assign(c->rk, l);
  if (l) rd_kafka_topic_partition_list_destroy(l);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "assign: %s",
                   rd_kafka_err2str(e));
  return LT_OK;
}

lt_err_t lt_bus_consumer_assign_topic(lt_bus_consumer_t *c, const char *topic, int64_t offset,
                                      int timeout_ms, int *out_partitions, char *errstr,
                                      size_t errstr_size) {
  const struct rd_kafka_metadata *md = NULL;
  lt_err_t ret = lt_bus_topic_metadata(c->rk, topic, timeout_ms, &md, errstr, errstr_size);
  if (ret) return ret;
  if (md->topic_cnt != 1 || md->topics[0].err || md->topics[0].partition_cnt == 0) {
    rd_kafka_resp_err_t te = md->topic_cnt == 1 ? md->topics[0].err : RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC;
    ret = lt_errf(errstr, errstr_size, te ? lt_bus_err_from_code(te) : LT_ERR_NOT_FOUND,
                  "topic %s: %s", topic, te ? rd_kafka_err2str(te) : "no partitions");
    if (ret == LT_ERR_RETRIABLE && te == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
      ret = LT_ERR_NOT_FOUND;
  } else {
    int np = md->topics[0].partition_cnt;
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(np);
    for (int i = 0; i < np; i++)
      rd_kafka_topic_partition_list_add(l, topic, md->topics[0].partitions[i].id)->offset = offset;
    rd_kafka_resp_err_t e = rd_kafka_assign(c->rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    if (e)
      ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "assign %s: %s", topic,
                    rd_kafka_err2str(e));
    else if (out_partitions)
      *out_partitions = np;
  }
  rd_kafka_metadata_destroy(md);
  return ret;
}

static void drain_pipe(lt_bus_consumer_t *c) {
  char buf[64];
  while (read(c->pipefd[0], buf, sizeof buf) > 0) {
  }
}

lt_err_t lt_bus_consumer_poll(lt_bus_consumer_t *c, int timeout_ms, const lt_bus_msg_t **out,
                              char *errstr, size_t errstr_size) {
  *out = NULL;
  if (c->cur) {
    rd_kafka_message_destroy(c->cur);
    c->cur = NULL;
  }
  rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, timeout_ms);
  if (!m && c->fd_armed) {
    /* Drain only when the queue looked empty, then look once more: a record queued before
     * the drain is caught by this poll, one queued after it writes a new wake-up byte. So the
     * fd never sleeps on a non-empty queue, and a busy consumer makes no extra syscall. */
    drain_pipe(c);
    m = rd_kafka_consumer_poll(c->rk, 0);
  }
  if (c->async_commit_err) {
    rd_kafka_resp_err_t ce = c->async_commit_err;
    c->async_commit_err = 0;
    if (m) rd_kafka_message_destroy(m);
    return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE, "async offset commit failed: %s",
                   rd_kafka_err2str(ce));
  }
  if (!m) return LT_OK;
  if (!m->err) {
    c->cur = m;
    *out = (const lt_bus_msg_t *)m;
    return LT_OK;
  }
  rd_kafka_resp_err_t err = m->err;
  char what[256];
  snprintf(what, sizeof what, "%s [%d]: %s", m->rkt ? rd_kafka_topic_name(m->rkt) : "-",
           (int)m->partition, rd_kafka_message_errstr(m));
  rd_kafka_message_destroy(m);
  if (err == RD_KAFKA_RESP_ERR__PARTITION_EOF) return LT_OK;
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    char reason[256];
    rd_kafka_resp_err_t fe = rd_kafka_fatal_error(c->rk, reason, sizeof reason);
    return lt_errf(errstr, errstr_size, LT_ERR_FATAL, "consumer fatal error %s: %s",
                   rd_kafka_err2name(fe), reason);
  }
  lt_err_t le = lt_bus_err_from_code(err);
  if (le != LT_ERR_NOT_FOUND && le != LT_ERR_AUTH && le != LT_ERR_FATAL) le = LT_ERR_RETRIABLE;
  return lt_errf(errstr, errstr_size, le, "consume %s", what);
}

/* ---------------------------------------------------------------- offsets */

lt_err_t lt_bus_consumer_commit(lt_bus_consumer_t *c, const lt_bus_tp_t *offsets, size_t n,
                                bool async, char *errstr, size_t errstr_size) {
  if (!c->has_group)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "commit needs a consumer group id");
  if (c->async_commit_err && !async) c->async_commit_err = 0;
  rd_kafka_topic_partition_list_t *l = offsets ? lt_bus_tplist_from(offsets, n) : NULL;
  rd_kafka_resp_err_t e = rd_kafka_commit(c->rk, l, async ? 1 : 0);
  lt_err_t ret = LT_OK;
  if (e == RD_KAFKA_RESP_ERR__NO_OFFSET) e = 0; /* nothing consumed: nothing to commit */
  if (!e && l && !async) {
    for (int i = 0; i < l->cnt; i++)
      if (l->elems[i].err) {
        e = l->elems[i].err;
        break;
      }
  }
  if (e)
    ret = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e) == LT_ERR_INVALID
                                           ? LT_ERR_INVALID
                                           : LT_ERR_RETRIABLE,
                  "offset commit: %s", rd_kafka_err2str(e));
  if (l) rd_kafka_topic_partition_list_destroy(l);
  return ret;
}

lt_err_t lt_bus_consumer_commit_msg(lt_bus_consumer_t *c, const lt_bus_msg_t *m, bool async,
                                    char *errstr, size_t errstr_size) {
  if (!c->has_group)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "commit needs a consumer group id");
  rd_kafka_resp_err_t e = rd_kafka_commit_message(c->rk, rkm(m), async ? 1 : 0);
  if (e)
    return lt_errf(errstr, errstr_size, LT_ERR_RETRIABLE, "offset commit of %s [%d] @%lld: %s",
                   lt_bus_msg_topic(m), (int)lt_bus_msg_partition(m),
                   (long long)lt_bus_msg_offset(m), rd_kafka_err2str(e));
  return LT_OK;
}

/* Ends a committed or position request over list l: on success copies its offsets back into
 * parts (LT_BUS_OFFSET_INVALID where it has none), then frees l. */
static lt_err_t offsets_back(lt_bus_tp_t *parts, size_t n, rd_kafka_topic_partition_list_t *l,
                             rd_kafka_resp_err_t e, const char *what, char *errstr,
                             size_t errstr_size) {
  for (size_t i = 0; !e && i < n; i++) {
    const rd_kafka_topic_partition_t *tp =
        rd_kafka_topic_partition_list_find(l, parts[i].topic, parts[i].partition);
    parts[i].offset = tp && !tp->err && tp->offset >= 0 ? tp->offset : LT_BUS_OFFSET_INVALID;
  }
  rd_kafka_topic_partition_list_destroy(l);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "%s: %s", what,
                   rd_kafka_err2str(e));
  return LT_OK;
}

lt_err_t lt_bus_consumer_committed(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                   int timeout_ms, char *errstr, size_t errstr_size) {
  rd_kafka_topic_partition_list_t *l = lt_bus_tplist_from(parts, n);
  return offsets_back(parts, n, l, rd_kafka_committed(c->rk, l, timeout_ms), "committed offsets",
                      errstr, errstr_size);
}

lt_err_t lt_bus_consumer_position(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                  char *errstr, size_t errstr_size) {
  rd_kafka_topic_partition_list_t *l = lt_bus_tplist_from(parts, n);
  return offsets_back(parts, n, l, rd_kafka_position(c->rk, l), "position", errstr, errstr_size);
}

bool lt_bus_read_to(int64_t pos, int64_t next, int64_t low, int64_t hw) {
  if (hw <= low) return true;
  return (pos >= 0 ? pos : next) >= hw || next >= hw;
}

lt_err_t lt_bus_consumer_watermarks(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n, int64_t *low,
                                    int timeout_ms, char *errstr, size_t errstr_size) {
  int64_t deadline = lt_time_mono_ms() + timeout_ms;
  for (size_t i = 0; i < n; i++) {
    int64_t lo = 0, hi = 0;
    rd_kafka_resp_err_t e;
    /* A partition of a topic created a moment ago may have no leader yet, or one its metadata does
     * not know: that passes within the time allowed. */
    for (;;) {
      int64_t left = deadline - lt_time_mono_ms();
      e = rd_kafka_query_watermark_offsets(c->rk, parts[i].topic, parts[i].partition, &lo, &hi,
                                           left > 0 ? (int)left : 1);
      bool transient = e == RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION || e == RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE;
      if (!transient || lt_time_mono_ms() + 100 > deadline) break;
      usleep(100 * 1000);
    }
    if (e)
      return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "watermarks of %s [%d]: %s", parts[i].topic,
                     (int)parts[i].partition, rd_kafka_err2str(e));
    parts[i].offset = hi;
    if (low) low[i] = lo;
  }
  return LT_OK;
}

/* The watch entry of (topic, partition), added (position unknown) the first time; NULL when out of
 * memory. */
static struct watch *watch_of(lt_bus_consumer_t *c, const char *topic, int32_t partition, int64_t now) {
  for (size_t i = 0; i < c->nwatch; i++)
    if (c->watch[i].partition == partition && strcmp(c->watch[i].topic, topic) == 0) return &c->watch[i];
  if (c->nwatch == c->capwatch) {
    size_t cap = c->capwatch ? 2 * c->capwatch : 32;
    struct watch *w = realloc(c->watch, cap * sizeof *w);
    if (!w) return NULL;
    c->watch = w;
    c->capwatch = cap;
  }
  struct watch *w = &c->watch[c->nwatch];
  if (!(w->topic = strdup(topic))) return NULL;
  w->partition = partition;
  w->pos = RD_KAFKA_OFFSET_INVALID;
  w->since_ms = now;
  w->start = RD_KAFKA_OFFSET_INVALID; /* not assigned through lt_bus_consumer_assign */
  c->nwatch++;
  return w;
}

lt_err_t lt_bus_consumer_heal_stalls(lt_bus_consumer_t *c, int64_t stall_ms, int timeout_ms, size_t *healed,
                                     char *errstr, size_t errstr_size) {
  *healed = 0;
  int64_t now = lt_time_mono_ms();
  if (c->watched_ms && now - c->watched_ms < stall_ms / 2) return LT_OK; /* called every tick: look less often */
  c->watched_ms = now;
  rd_kafka_topic_partition_list_t *l = NULL, *idle = NULL, *oldest = NULL, *stuck = NULL;
  if (rd_kafka_assignment(c->rk, &l) || !l) return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "no assignment");
  lt_err_t err = LT_OK;
  if (rd_kafka_position(c->rk, l)) err = lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "positions not readable");
  idle = rd_kafka_topic_partition_list_new(l->cnt > 0 ? l->cnt : 1);
  oldest = rd_kafka_topic_partition_list_new(l->cnt > 0 ? l->cnt : 1);
  for (int i = 0; !err && i < l->cnt; i++) {
    rd_kafka_topic_partition_t *e = &l->elems[i];
    struct watch *w = watch_of(c, e->topic, e->partition, now);
    if (!w) {
      err = LT_ERR_NOMEM;
      break;
    }
    /* A partition that has delivered nothing since it was assigned has no position: it stands
     * still behind the log when the log holds a record at or past where it was started. */
    bool fresh = e->offset < 0 && (w->start == RD_KAFKA_OFFSET_BEGINNING || w->start >= 0);
    if (e->offset != w->pos) { /* it moved (or is seen for the first time) */
      w->pos = e->offset;
      w->since_ms = now;
      /* Where a fetch that starts over begins: the position it reached, not where it was first
       * assigned. A heal leaves the position unknown until the next record (librdkafka 2.0), and
       * a later heal from the first start would deliver everything since then again. */
      if (e->offset >= 0) w->start = e->offset;
    } else if ((e->offset >= 0 || fresh) && now - w->since_ms >= stall_ms) {
      rd_kafka_topic_partition_list_add(idle, e->topic, e->partition)->offset = RD_KAFKA_OFFSET_END;
      if (fresh) rd_kafka_topic_partition_list_add(oldest, e->topic, e->partition)->offset = RD_KAFKA_OFFSET_BEGINNING;
    }
  }
  if (!err && idle->cnt > 0) {
    /* One ListOffsets per leader for all of them (latest: the high watermark), and one more for
     * the oldest record kept of those that never delivered (retention may have emptied them). */
    rd_kafka_resp_err_t e = rd_kafka_offsets_for_times(c->rk, idle, timeout_ms);
    if (!e && oldest->cnt > 0) e = rd_kafka_offsets_for_times(c->rk, oldest, timeout_ms);
    if (e) err = lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "watermarks: %s", rd_kafka_err2str(e));
    stuck = rd_kafka_topic_partition_list_new(idle->cnt);
    for (int i = 0; !err && i < idle->cnt; i++) {
      rd_kafka_topic_partition_t *h = &idle->elems[i];
      struct watch *w = watch_of(c, h->topic, h->partition, now);
      w->since_ms = now; /* asked: not again before another stall_ms */
      int64_t from = w->pos;
      if (from < 0) { /* fresh: from where it was started, or the oldest record kept */
        const rd_kafka_topic_partition_t *o = rd_kafka_topic_partition_list_find(oldest, h->topic, h->partition);
        if (!o || o->err || o->offset < 0) continue;
        from = w->start > o->offset ? w->start : o->offset;
      }
      if (!h->err && h->offset > from)
        rd_kafka_topic_partition_list_add(stuck, h->topic, h->partition)->offset = w->pos >= 0 ? w->pos : w->start;
    }
    if (!err && stuck->cnt > 0) {
      /* Dropped and added again at the position: the fetcher of each starts over. */
      rd_kafka_error_t *ue = rd_kafka_incremental_unassign(c->rk, stuck);
      rd_kafka_error_t *ae = ue ? NULL : rd_kafka_incremental_assign(c->rk, stuck);
      rd_kafka_error_t *fe = ue ? ue : ae;
      if (fe) {
        err = lt_errf(errstr, errstr_size, lt_bus_err_from_code(rd_kafka_error_code(fe)), "reassigning: %s",
                      rd_kafka_error_string(fe));
        rd_kafka_error_destroy(fe);
      } else {
        rd_kafka_resume_partitions(c->rk, stuck); /* and a fetch stopped by a pause flag (none of ours) */
        *healed = (size_t)stuck->cnt;
      }
    }
  }
  if (stuck) rd_kafka_topic_partition_list_destroy(stuck);
  rd_kafka_topic_partition_list_destroy(oldest);
  rd_kafka_topic_partition_list_destroy(idle);
  rd_kafka_topic_partition_list_destroy(l);
  return err;
}

int64_t lt_bus_consumer_lag(lt_bus_consumer_t *c) {
  rd_kafka_topic_partition_list_t *l = NULL;
  if (rd_kafka_assignment(c->rk, &l) || !l) return -1;
  int64_t lag = 0;
  if (rd_kafka_position(c->rk, l)) lag = -1;
  for (int i = 0; lag >= 0 && i < l->cnt; i++) {
    int64_t lo = 0, hi = 0;
    /* The watermarks the last fetch brought (no request): -1 until the first one. */
    if (rd_kafka_get_watermark_offsets(c->rk, l->elems[i].topic, l->elems[i].partition, &lo, &hi) || hi < 0)
      continue;
    int64_t pos = l->elems[i].offset >= 0 ? l->elems[i].offset : lo;
    if (hi > pos) lag += hi - pos;
  }
  rd_kafka_topic_partition_list_destroy(l);
  return lag;
}

lt_err_t lt_bus_consumer_seek(lt_bus_consumer_t *c, const char *topic, int32_t partition,
                              int64_t offset, int timeout_ms, char *errstr, size_t errstr_size) {
  rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(l, topic, partition)->offset = offset;
  rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, l, timeout_ms);
  rd_kafka_resp_err_t pe = l->elems[0].err;
  rd_kafka_topic_partition_list_destroy(l);
  if (e) {
    lt_err_t le = lt_bus_err_from_code(rd_kafka_error_code(e));
    lt_errf(errstr, errstr_size, le, "seek %s [%d] to %lld: %s", topic, (int)partition,
            (long long)offset, rd_kafka_error_string(e));
    rd_kafka_error_destroy(e);
    return le;
  }
  if (pe)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(pe), "seek %s [%d] to %lld: %s",
                   topic, (int)partition, (long long)offset, rd_kafka_err2str(pe));
  return LT_OK;
}

lt_err_t lt_bus_consumer_offsets_for_times(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                           int timeout_ms, char *errstr, size_t errstr_size) {
  rd_kafka_topic_partition_list_t *l = lt_bus_tplist_from(parts, n);
  rd_kafka_resp_err_t e = rd_kafka_offsets_for_times(c->rk, l, timeout_ms);
  if (!e) {
    for (size_t i = 0; i < n && !e; i++) {
      const rd_kafka_topic_partition_t *tp =
          rd_kafka_topic_partition_list_find(l, parts[i].topic, parts[i].partition);
      if (!tp) e = RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION;
      else if (tp->err) e = tp->err;
      else parts[i].offset = tp->offset >= 0 ? tp->offset : LT_BUS_OFFSET_END;
    }
  }
  rd_kafka_topic_partition_list_destroy(l);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "offsets for times: %s",
                   rd_kafka_err2str(e));
  return LT_OK;
}

lt_err_t lt_bus_consumer_seek_time(lt_bus_consumer_t *c, const char *topic, int32_t partition,
                                   int64_t time_ms, int timeout_ms, char *errstr,
                                   size_t errstr_size) {
  lt_bus_tp_t tp = {topic, partition, time_ms};
  lt_err_t e = lt_bus_consumer_offsets_for_times(c, &tp, 1, timeout_ms, errstr, errstr_size);
  if (e) return e;
  return lt_bus_consumer_seek(c, topic, partition, tp.offset, timeout_ms, errstr, errstr_size);
}

static lt_err_t pause_resume(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                             bool pause, char *errstr, size_t errstr_size) {
  rd_kafka_topic_partition_list_t *l = lt_bus_tplist_from(parts, n);
  rd_kafka_resp_err_t e =
      pause ? rd_kafka_pause_partitions(c->rk, l) : rd_kafka_resume_partitions(c->rk, l);
  for (int i = 0; !e && i < l->cnt; i++) e = l->elems[i].err;
  rd_kafka_topic_partition_list_destroy(l);
  if (e)
    return lt_errf(errstr, errstr_size, lt_bus_err_from_code(e), "%s: %s",
                   pause ? "pause" : "resume", rd_kafka_err2str(e));
  return LT_OK;
}

lt_err_t lt_bus_consumer_pause(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                               char *errstr, size_t errstr_size) {
  return pause_resume(c, parts, n, true, errstr, errstr_size);
}

lt_err_t lt_bus_consumer_resume(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                                char *errstr, size_t errstr_size) {
  return pause_resume(c, parts, n, false, errstr, errstr_size);
}
