/* lt_bus: Lathe's Kafka module (producer, consumer, admin) over librdkafka.
 *
 * Kafka is the only channel between the control plane and the data plane (docs/DESIGN.md §2), so
 * this is the one place that knows librdkafka. The bus is payload-agnostic: records are bytes,
 * a key and headers; Avro lives in lt_avro. The one exception is naming: the producer reads a
 * value's single-object header and envelope to add CloudEvents headers (lt_bus_ce.c), so every
 * record says what it is to tools that do not know Lathe. What the bus guarantees:
 *   - every producer is idempotent with acks=all (invariant 5: nothing acknowledged is lost);
 *     lt_bus_produce_sync() returns LT_OK only when the broker has durably acknowledged;
 *   - every consumer reads read_committed and commits offsets only when told to;
 *   - errors come back classified as lt_err_t: LT_ERR_RETRIABLE (call again / redo the
 *     transaction), LT_ERR_FATAL (destroy the handle and create a new one), LT_ERR_FENCED (a
 *     newer instance owns the transactional id: stop), LT_ERR_TIMEOUT, LT_ERR_UNAVAILABLE;
 *   - topic names are always built from the configured prefix by lt_bus_topic_name().
 *
 * Types are opaque. Unless a function says otherwise, a handle is used by one thread at a time;
 * the producer is the exception (see lt_bus_producer_t). No librdkafka type crosses this header
 * (tests reach internals through lt_bus_int.h). */
#ifndef LT_BUS_H
#define LT_BUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

/* ---------------------------------------------------------------- configuration */

typedef struct lt_bus_conf lt_bus_conf_t;

/* Special partition and offset values (the same numbers as librdkafka's). */
#define LT_BUS_PARTITION_ANY (-1)    /* partition by the hash of the key (murmur2, like Java) */
#define LT_BUS_OFFSET_BEGINNING (-2) /* the oldest record still kept */
#define LT_BUS_OFFSET_END (-1)       /* the next record to be written */
#define LT_BUS_OFFSET_STORED (-1000) /* the group's committed offset (auto.offset.reset if none) */
#define LT_BUS_OFFSET_INVALID (-1001)

/* Default topic prefix when neither lt_bus_conf_set("lathe.topic.prefix") nor the environment
 * (LATHE_TOPIC_PREFIX) says otherwise. */
#define LT_BUS_DEFAULT_PREFIX "lathe."

/* A new configuration: bootstrap "127.0.0.1:9092", client id "lathe", prefix "lathe.".
 * Returns NULL only when out of memory. The caller owns it (lt_bus_conf_destroy). */
lt_bus_conf_t *lt_bus_conf_new(void);

/* Applies the environment: LATHE_KAFKA_BOOTSTRAP (bootstrap.servers), LATHE_TOPIC_PREFIX,
 * LATHE_KAFKA_CLIENT_ID, then the properties of the file LATHE_KAFKA_CONFIG names, then those of
 * LATHE_KAFKA_PROPERTIES (newline-separated name=value: lathed --config / --set kafka.NAME, lt_conf.h)
 * (lt_bus_conf_load_file: SASL, TLS or any librdkafka property, for every client of the
 * process). Unset variables leave the value alone. */
lt_err_t lt_bus_conf_from_env(lt_bus_conf_t *conf, char *errstr, size_t errstr_size);

/* Sets every property of a file of `name=value` lines (blank lines and lines starting with '#'
 * are skipped, spaces around name and value trimmed), each through lt_bus_conf_set. A bad line
 * fails with LT_ERR_INVALID naming file:line and the reason; properties of earlier lines stay
 * set. */
lt_err_t lt_bus_conf_load_file(lt_bus_conf_t *conf, const char *path, char *errstr, size_t errstr_size);

/* The principal of one role (api, scheduler, worker, publisher, admin): loads
 * $LATHE_KAFKA_CONFIG_DIR/<role>.properties over conf (after lt_bus_conf_from_env, so the role's
 * credentials win). LT_OK with nothing changed when LATHE_KAFKA_CONFIG_DIR is unset; LT_ERR_IO
 * naming the file when it is set and the role's file is missing (a role never falls back to
 * another principal). docs/DESIGN.md §5a. */
lt_err_t lt_bus_conf_for_role(lt_bus_conf_t *conf, const char *role, char *errstr, size_t errstr_size);

/* Sets one property. Lathe's own names:
 *   "bootstrap.servers"   host:port[,host:port...]
 *   "client.id"           client id shown in broker logs
 *   "lathe.topic.prefix"  prefix of every topic name (may be empty)
 * Any other name is passed through to librdkafka unchanged and checked now, so a typo fails
 * here with librdkafka's message. The safety settings (acks=all, enable.idempotence=true,
 * isolation.level=read_committed, enable.auto.commit=false) are applied after the pass-through
 * properties and cannot be weakened. Copies name and value. */
lt_err_t lt_bus_conf_set(lt_bus_conf_t *conf, const char *name, const char *value, char *errstr,
                         size_t errstr_size);

/* The current value of a property set on this conf (Lathe's or pass-through), or NULL.
 * The string is owned by conf and valid until the next set or destroy. */
const char *lt_bus_conf_get(const lt_bus_conf_t *conf, const char *name);

/* A deep copy, or NULL when out of memory. */
lt_bus_conf_t *lt_bus_conf_dup(const lt_bus_conf_t *conf);

void lt_bus_conf_destroy(lt_bus_conf_t *conf);

/* Writes the full topic name for a base name ("jobs" -> "lathe.jobs") into out, NUL-terminated.
 * Returns the length of the full name (like snprintf); a return >= out_size means truncated.
 * This is the only place topic names are made: every caller goes through it. */
size_t lt_bus_topic_name(const lt_bus_conf_t *conf, const char *base, char *out, size_t out_size);

/* ---------------------------------------------------------------- records */

/* One header, a borrowed view. value may be NULL (a null header value). */
typedef struct lt_bus_header {
  const char *name;
  const void *value;
  size_t size;
} lt_bus_header_t;

/* The headers the producer adds to every record whose value is a single-object Avro message of
 * a schema this build knows (the CloudEvents Kafka binding, binary content mode; docs/EVENTS.md).
 * A header of the same name given by the caller is kept and the bus's own is not added. They
 * name the record and say where it came from, never what it holds: ids, a time, a type. */
#define LT_BUS_CE_SPECVERSION "ce_specversion" /* "1.0" */
#define LT_BUS_CE_ID "ce_id"                   /* the record's event_id */
#define LT_BUS_CE_SOURCE "ce_source"           /* "lathe/" + the record's producer */
#define LT_BUS_CE_TYPE "ce_type"               /* LT_BUS_CE_TYPE_PREFIX + record name */
#define LT_BUS_CE_TIME "ce_time"               /* occurred_at, RFC 3339 UTC with ms */
#define LT_BUS_CE_CONTENT_TYPE "content-type"  /* LT_BUS_CE_MEDIA_TYPE */
#define LT_BUS_CE_DATASCHEMA "ce_dataschema"   /* "lathe:schema/<Name>/v<N>/<fingerprint>" */
#define LT_BUS_CE_FINGERPRINT "lathe_schema_fingerprint" /* 16 hex digits, header bytes 2..9 */
#define LT_BUS_CE_TYPE_PREFIX "dev.lathe."
#define LT_BUS_CE_MEDIA_TYPE "application/avro"

/* A record to produce. Every pointer is borrowed for the duration of the call only (the bus
 * copies what it keeps). topic is a full name (lt_bus_topic_name). */
typedef struct lt_bus_record {
  const char *topic;
  int32_t partition; /* LT_BUS_PARTITION_ANY: by key hash (random when key is NULL) */
  const void *key;   /* may be NULL */
  size_t key_size;
  const void *value; /* may be NULL (a tombstone on a compacted topic) */
  size_t value_size;
  const lt_bus_header_t *headers; /* header_count entries, may be NULL when 0 */
  size_t header_count;
  int64_t timestamp_ms; /* 0: now */
} lt_bus_record_t;

/* A topic-partition with an offset (or a time, where a function says so). */
typedef struct lt_bus_tp {
  const char *topic; /* full topic name; borrowed */
  int32_t partition;
  int64_t offset;
} lt_bus_tp_t;

/* ---------------------------------------------------------------- producer */

/* An idempotent acks=all producer. Thread-safe: any number of threads may produce at once
 * (sync and async). A producer owns one internal thread that serves delivery reports, so
 * delivery callbacks run on that thread, never on the caller's. */
typedef struct lt_bus_producer lt_bus_producer_t;

/* The outcome of one produced record, passed to a delivery callback (borrowed, valid during
 * the callback only). */
typedef struct lt_bus_delivery {
  lt_err_t err;        /* LT_OK only when the broker durably acknowledged the record */
  const char *errmsg;  /* librdkafka's reason when err != LT_OK, "" otherwise */
  const char *topic;
  int32_t partition;
  int64_t offset;      /* LT_BUS_OFFSET_INVALID when not written */
  void *msg_opaque;    /* what lt_bus_produce() was given */
} lt_bus_delivery_t;

typedef void lt_bus_delivery_cb(void *opaque, const lt_bus_delivery_t *delivery);

typedef struct lt_bus_producer_opts {
  /* NULL: a plain idempotent producer. Else a transactional producer with this id; a second
   * producer with the same id fences this one (its calls then fail with LT_ERR_FENCED). */
  const char *transactional_id;
  /* Called on the producer's internal thread for each record given to lt_bus_produce().
   * May be NULL. Not called for lt_bus_produce_sync() records. */
  lt_bus_delivery_cb *delivery_cb;
  void *opaque; /* passed to delivery_cb */
  /* Transactional producers: timeout of the init_transactions call, ms (0: 30000). */
  int init_timeout_ms;
} lt_bus_producer_opts_t;

/* Creates a producer (and, with a transactional_id, runs init_transactions, which fences any
 * older producer with that id). opts may be NULL. conf is copied, the caller keeps it. */
lt_err_t lt_bus_producer_new(const lt_bus_conf_t *conf, const lt_bus_producer_opts_t *opts,
                             lt_bus_producer_t **out, char *errstr, size_t errstr_size);

/* Learns a topic's partitions and leaders now, waiting up to timeout_ms. Without it the first
 * record to a topic this producer has not met waits for librdkafka's topic scan, up to 1 s (a
 * cancel was acknowledged after ~900 ms in test_e2e). Best effort: nothing is lost if the broker
 * does not answer, the first record only waits as before. */
void lt_bus_producer_prepare(lt_bus_producer_t *p, const char *topic, int timeout_ms);

/* Produces one record and waits until its delivery report arrives or timeout_ms passes.
 * LT_OK means the record is durably in Kafka (acks=all) at *out_partition / *out_offset
 * (either may be NULL). LT_ERR_TIMEOUT means the outcome is unknown: the record may still be
 * written later (idempotence prevents duplicates from retries, not from a caller resubmitting).
 * LT_ERR_UNAVAILABLE / LT_ERR_RETRIABLE: not written, may retry. LT_ERR_NOT_FOUND: the
 * broker has no such topic (after about 5 s, topic.metadata.propagation.max.ms). LT_ERR_AUTH,
 * LT_ERR_INVALID (e.g. record too large): not written, do not retry. LT_ERR_FATAL: recreate the
 * producer. Never LT_OK for a record that is not acknowledged. Not for transactional producers
 * (use lt_bus_txn_*). Thread-safe. */
lt_err_t lt_bus_produce_sync(lt_bus_producer_t *p, const lt_bus_record_t *rec, int timeout_ms,
                             int32_t *out_partition, int64_t *out_offset, char *errstr,
                             size_t errstr_size);

/* Queues one record for batched delivery; the outcome goes to the delivery callback with
 * msg_opaque. The payload is copied. LT_ERR_RETRIABLE when the local queue is full (wait for
 * deliveries and retry), LT_ERR_NOT_FOUND for an unknown topic or partition, LT_ERR_FATAL.
 * In a transaction (after lt_bus_txn_begin) the record belongs to it. Thread-safe. */
lt_err_t lt_bus_produce(lt_bus_producer_t *p, const lt_bus_record_t *rec, void *msg_opaque,
                        char *errstr, size_t errstr_size);

/* Waits until every queued record has a delivery report (callbacks ran) or timeout_ms passes
 * (LT_ERR_TIMEOUT). Thread-safe. */
lt_err_t lt_bus_producer_flush(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                               size_t errstr_size);

/* Number of records queued and not yet reported. */
int lt_bus_producer_outq_len(lt_bus_producer_t *p);

/* LT_OK, or LT_ERR_FENCED / LT_ERR_FATAL when the producer hit a fatal error and must be
 * destroyed (and, unless fenced, recreated). Writes librdkafka's reason to errstr. */
lt_err_t lt_bus_producer_fatal(lt_bus_producer_t *p, char *errstr, size_t errstr_size);

/* Flushes for at most timeout_ms (0: no wait; records not delivered by then get a delivery
 * report with an error), stops the internal thread and frees. NULL is a no-op. */
void lt_bus_producer_destroy(lt_bus_producer_t *p, int timeout_ms);

/* Transactions (consume-process-produce). A step is:
 *   lt_bus_txn_begin; lt_bus_produce...; lt_bus_txn_send_offsets; lt_bus_txn_commit.
 * Every txn call returns:
 *   LT_OK;
 *   LT_ERR_RETRIABLE  the transaction was aborted (by the bus) or the call may be repeated:
 *                     rewind the consumer to its committed offsets and redo the step;
 *   LT_ERR_FENCED     a newer producer owns the transactional id: stop this instance;
 *   LT_ERR_FATAL      destroy this producer and create a new one (also when commit or abort
 *                     times out: librdkafka 2.0.2 has no client-side KIP-890, so the state of
 *                     a timed-out commit is unknown and the producer must be recreated). */
typedef struct lt_bus_consumer lt_bus_consumer_t;

lt_err_t lt_bus_txn_begin(lt_bus_producer_t *p, char *errstr, size_t errstr_size);

/* Adds the consumer's offsets to the transaction. offsets: the next offsets to read (last
 * processed + 1) for each partition; NULL means the consumer's current positions. */
lt_err_t lt_bus_txn_send_offsets(lt_bus_producer_t *p, lt_bus_consumer_t *c,
                                 const lt_bus_tp_t *offsets, size_t n, int timeout_ms,
                                 char *errstr, size_t errstr_size);

/* Commits: flushes the transaction's records and makes them and the offsets visible to
 * read_committed consumers. Retriable failures are retried within timeout_ms; a failure that
 * requires abort aborts and returns LT_ERR_RETRIABLE. */
lt_err_t lt_bus_txn_commit(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                           size_t errstr_size);

/* Aborts: the transaction's records are never shown to read_committed consumers. */
lt_err_t lt_bus_txn_abort(lt_bus_producer_t *p, int timeout_ms, char *errstr,
                          size_t errstr_size);

/* ---------------------------------------------------------------- consumer */

/* A received record, borrowed from the consumer: valid until the next lt_bus_consumer_poll()
 * or lt_bus_consumer_destroy() on the same consumer. Nothing is copied. */
typedef struct lt_bus_msg lt_bus_msg_t;

const char *lt_bus_msg_topic(const lt_bus_msg_t *m);
int32_t lt_bus_msg_partition(const lt_bus_msg_t *m);
int64_t lt_bus_msg_offset(const lt_bus_msg_t *m);
int64_t lt_bus_msg_timestamp(const lt_bus_msg_t *m); /* ms since the epoch, -1 if none */
const void *lt_bus_msg_key(const lt_bus_msg_t *m, size_t *size);   /* NULL if no key */
const void *lt_bus_msg_value(const lt_bus_msg_t *m, size_t *size); /* NULL if no value */
size_t lt_bus_msg_header_count(const lt_bus_msg_t *m);
/* The i-th header (0-based); false when i is out of range. Views into the message. */
bool lt_bus_msg_header(const lt_bus_msg_t *m, size_t i, lt_bus_header_t *out);
/* The last header called name; false when absent. */
bool lt_bus_msg_header_get(const lt_bus_msg_t *m, const char *name, const void **value,
                           size_t *size);

/* Rebalance hook: called on the thread that calls lt_bus_consumer_poll(), with the partitions
 * (borrowed) being assigned (after the bus assigned them: the hook may seek or pause) or
 * revoked (before the bus unassigns them: the hook may commit). */
typedef enum lt_bus_rebalance { LT_BUS_ASSIGNED = 1, LT_BUS_REVOKED = 2 } lt_bus_rebalance_t;
typedef void lt_bus_rebalance_cb(void *opaque, lt_bus_consumer_t *c, lt_bus_rebalance_t what,
                                 const lt_bus_tp_t *parts, size_t n);

typedef struct lt_bus_consumer_opts {
  /* Consumer group id. NULL: no group (manual assign only, no offset commits). */
  const char *group_id;
  lt_bus_rebalance_cb *rebalance_cb; /* may be NULL */
  void *opaque;                      /* passed to rebalance_cb */
  /* Where a group without a committed offset starts: "earliest" (NULL) or "latest". */
  const char *auto_offset_reset;
} lt_bus_consumer_opts_t;

/* Creates a read_committed consumer with auto commit off. opts may be NULL (no group).
 * conf is copied, the caller keeps it. */
lt_err_t lt_bus_consumer_new(const lt_bus_conf_t *conf, const lt_bus_consumer_opts_t *opts,
                             lt_bus_consumer_t **out, char *errstr, size_t errstr_size);

/* Joins the group for these topics (full names). Needs a group id. */
lt_err_t lt_bus_consumer_subscribe(lt_bus_consumer_t *c, const char *const *topics, size_t n,
                                   char *errstr, size_t errstr_size);

/* Replaces the assignment with exactly these partitions, each starting at its offset (an
 * offset or LT_BUS_OFFSET_BEGINNING/END/STORED). n == 0 unassigns everything. Asks the broker
 * for each topic's metadata first (at most 2 s a topic, best effort) so fetching starts at once;
 * fetching begins on return, so make synchronous queries (watermarks) before, not after: they
 * would wait behind long-poll fetches of empty partitions. */
lt_err_t lt_bus_consumer_assign(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                                char *errstr, size_t errstr_size);

/* Assigns every partition of one topic at the same start offset (replay, `topic tail`).
 * LT_ERR_NOT_FOUND when the topic does not exist. Writes the partition count to
 * *out_partitions (may be NULL). */
lt_err_t lt_bus_consumer_assign_topic(lt_bus_consumer_t *c, const char *topic, int64_t offset,
                                      int timeout_ms, int *out_partitions, char *errstr,
                                      size_t errstr_size);

/* Waits up to timeout_ms for the next record. LT_OK with *out set to a borrowed record, or
 * LT_OK with *out == NULL when nothing came. Errors: LT_ERR_FATAL (recreate), LT_ERR_NOT_FOUND
 * (a subscribed or assigned topic does not exist), LT_ERR_RETRIABLE (a transient consumer
 * error, already retried by librdkafka, or a failed async commit: log it and keep polling).
 * Rebalance hooks run inside. */
lt_err_t lt_bus_consumer_poll(lt_bus_consumer_t *c, int timeout_ms, const lt_bus_msg_t **out,
                              char *errstr, size_t errstr_size);

/* Commits offsets to the group. offsets: the next offset to read for each partition; NULL
 * commits the current positions (everything returned by poll so far). async: return at once
 * (a failure is returned once, as LT_ERR_RETRIABLE, by the next lt_bus_consumer_poll). */
lt_err_t lt_bus_consumer_commit(lt_bus_consumer_t *c, const lt_bus_tp_t *offsets, size_t n,
                                bool async, char *errstr, size_t errstr_size);

/* Commits m's offset + 1 (sync or async). */
lt_err_t lt_bus_consumer_commit_msg(lt_bus_consumer_t *c, const lt_bus_msg_t *m, bool async,
                                    char *errstr, size_t errstr_size);

/* Fills parts[i].offset with the group's committed offset (LT_BUS_OFFSET_INVALID if none). */
lt_err_t lt_bus_consumer_committed(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                   int timeout_ms, char *errstr, size_t errstr_size);

/* Fills parts[i].offset with the consumer's position (the next offset poll will return,
 * LT_BUS_OFFSET_INVALID if nothing was consumed). */
lt_err_t lt_bus_consumer_position(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                  char *errstr, size_t errstr_size);

/* Records behind: over the assigned partitions, the high watermark the last fetch saw minus
 * the position (never a request to the broker, so a scrape may call it). -1 when the
 * assignment or positions cannot be read. Call from the thread that polls c. */
int64_t lt_bus_consumer_lag(lt_bus_consumer_t *c);

/* For a consumer that assigns its partitions itself and never pauses them: a partition whose
 * position has not moved for stall_ms although the log goes on past it (its high watermark, one
 * request per leader within timeout_ms, asked at most once per stall_ms for each) is unassigned
 * and assigned again at its position, so its fetcher starts over; *healed says how many. One that
 * has delivered nothing since lt_bus_consumer_assign started it (no position) stands still when the
 * log keeps a record at or past its start (the oldest kept: retention may have emptied it), and
 * is assigned again at that start. librdkafka
 * 2.0 can leave a partition's fetcher stopped after a broker restart (a chaos run's API folded
 * two records less than the log, seed 6204). A partition that waits on an open transaction looks
 * the same and only fetches again. A call within stall_ms / 2 of the last look returns at once, so a
 * caller's periodic timer may call it every tick. Call from the thread that polls c. */
lt_err_t lt_bus_consumer_heal_stalls(lt_bus_consumer_t *c, int64_t stall_ms, int timeout_ms, size_t *healed,
                                     char *errstr, size_t errstr_size);

/* Asks the broker for each partition's high watermark (the offset the next record will get) and
 * writes it into parts[i].offset; low (may be NULL, n entries) gets the oldest offset kept. A
 * consumer that reached the high watermark of every partition it was given has read the topic
 * as it was when it asked (replay "caught up"). */
lt_err_t lt_bus_consumer_watermarks(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n, int64_t *low,
                                    int timeout_ms, char *errstr, size_t errstr_size);

/* Has a consumer read a partition to hw, its high watermark when it started (read "caught up"),
 * low the oldest offset the partition kept then? pos: the consumer's position
 * (lt_bus_consumer_position; LT_BUS_OFFSET_INVALID until it delivers a record), next: the offset
 * after the last record the caller took from it (0 when none; read_committed skips commit markers,
 * which only the position counts). A partition that kept nothing (empty, or emptied by retention:
 * hw <= low) gives no position and is read. */
bool lt_bus_read_to(int64_t pos, int64_t next, int64_t low, int64_t hw);

/* Moves an assigned partition to offset (or LT_BUS_OFFSET_BEGINNING/END). */
lt_err_t lt_bus_consumer_seek(lt_bus_consumer_t *c, const char *topic, int32_t partition,
                              int64_t offset, int timeout_ms, char *errstr, size_t errstr_size);

/* Finds, for each parts[i] (whose offset field holds a time in ms since the epoch), the
 * first offset whose timestamp is >= that time, and writes it back into parts[i].offset
 * (LT_BUS_OFFSET_END when no such record). */
lt_err_t lt_bus_consumer_offsets_for_times(lt_bus_consumer_t *c, lt_bus_tp_t *parts, size_t n,
                                           int timeout_ms, char *errstr, size_t errstr_size);

/* Moves an assigned partition to the first record at or after time_ms. */
lt_err_t lt_bus_consumer_seek_time(lt_bus_consumer_t *c, const char *topic, int32_t partition,
                                   int64_t time_ms, int timeout_ms, char *errstr,
                                   size_t errstr_size);

/* Stops / restarts fetching these partitions (the offset field is ignored). */
lt_err_t lt_bus_consumer_pause(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                               char *errstr, size_t errstr_size);
lt_err_t lt_bus_consumer_resume(lt_bus_consumer_t *c, const lt_bus_tp_t *parts, size_t n,
                                char *errstr, size_t errstr_size);

/* A file descriptor that becomes readable when records or events are queued for this consumer,
 * for a libevent loop: register it with EV_READ|EV_PERSIST and, when it fires, call
 * lt_bus_consumer_poll(c, 0, ...) until it returns no record (the poll that finds the queue
 * empty drains the fd). Armed by the first call (consumers that never ask pay nothing). Owned
 * by the consumer (do not close). */
int lt_bus_consumer_fd(lt_bus_consumer_t *c);

/* Leaves the group (revoke hook runs, no implicit commit) and frees. NULL is a no-op. */
void lt_bus_consumer_destroy(lt_bus_consumer_t *c);

/* ---------------------------------------------------------------- admin */

typedef struct lt_bus_admin lt_bus_admin_t;

lt_err_t lt_bus_admin_new(const lt_bus_conf_t *conf, lt_bus_admin_t **out, char *errstr,
                          size_t errstr_size);
void lt_bus_admin_destroy(lt_bus_admin_t *a);

/* Creates a topic (full name) with partitions, replication factor (-1: broker default) and
 * configs ("key=value" strings, may be NULL when nconfigs is 0). Idempotent: an existing topic
 * is LT_OK (its settings are not changed or checked). LT_ERR_AUTH when the principal may not:
 * only after 10 s of retries, since KRaft's controller sees new ACLs a moment after they are
 * made (this and lt_bus_admin_create_from_file). */
lt_err_t lt_bus_admin_create_topic(lt_bus_admin_t *a, const char *topic, int partitions,
                                   int replication, const char *const *configs, size_t nconfigs,
                                   int timeout_ms, char *errstr, size_t errstr_size);

/* Creates every topic listed in a topics file (ops/topics.tsv): one topic a line,
 * tab-separated `base-name  partitions  configs`, configs a comma-separated list of key=value
 * (or "-" / empty for none); '#' starts a comment. Names get the conf's prefix. Idempotent.
 * A malformed line fails with LT_ERR_INVALID naming the file and line. *out_created (may be
 * NULL) receives how many topics were new. path NULL: the copy of ops/topics.tsv built into
 * the library (an installed lathe reads no source tree). */
lt_err_t lt_bus_admin_create_from_file(lt_bus_admin_t *a, const char *path, int replication,
                                       int timeout_ms, int *out_created, char *errstr,
                                       size_t errstr_size);

/* Brings the topics of a topics file that exist already to the file's configs: each config the
 * file sets that the broker holds another value for (or none) is altered, the topic's other
 * configs of its own carried over (librdkafka 2.0.2 has no incremental AlterConfigs; a plain one
 * resets what it is not given). A topic not made yet is left to its creation. Idempotent.
 * *out_altered (may be NULL) gets how many topics were altered, changes (may be NULL) one
 * "topic key old -> new" per change, "; "-separated. A value the broker refuses fails naming the
 * topic; other topics of that request may have been altered (the broker applies each alone). */
lt_err_t lt_bus_admin_reconcile_from_file(lt_bus_admin_t *a, const char *path, int timeout_ms, int *out_altered,
                                          char *changes, size_t changes_size, char *errstr, size_t errstr_size);

/* Creates the roles' ACLs of an ACL file (ops/acls.tsv: role, resource, name, pattern,
 * operations, TAB-separated; names get the conf's prefix, "*" is the prefix itself) for
 * principals User:<role>. Idempotent. Needs Alter on the cluster (the admin principal). A
 * malformed line fails with LT_ERR_INVALID naming the file and line; a refused request with
 * LT_ERR_AUTH; a broker without an authorizer with LT_ERR_UNSUPPORTED. Returns once the broker
 * lists the new ACLs. path NULL: the copy of ops/acls.tsv built into the library. *out_n (may be NULL)
 * gets the number of ACLs. Transactional-id lines are skipped and counted in *out_skipped (may
 * be NULL): librdkafka 2.0.2 cannot express that resource type, so ops/stack (Kafka's Java
 * admin client) or Kafka's own tools apply them. docs/DESIGN.md §5a. */
lt_err_t lt_bus_admin_create_acls(lt_bus_admin_t *a, const char *path, int timeout_ms, size_t *out_n,
                                  size_t *out_skipped, char *errstr, size_t errstr_size);

/* Partition count of a topic; LT_ERR_NOT_FOUND when it does not exist. */
lt_err_t lt_bus_admin_describe_topic(lt_bus_admin_t *a, const char *topic, int timeout_ms,
                                     int *out_partitions, char *errstr, size_t errstr_size);

/* Names of all topics (internal "__" topics excluded), sorted. *out_names is a NULL-terminated
 * array the caller frees with lt_bus_admin_free_names. */
lt_err_t lt_bus_admin_list_topics(lt_bus_admin_t *a, int timeout_ms, char ***out_names,
                                  size_t *out_n, char *errstr, size_t errstr_size);
void lt_bus_admin_free_names(char **names);

/* Deletes topics (full names); a missing topic is LT_OK. */
lt_err_t lt_bus_admin_delete_topics(lt_bus_admin_t *a, const char *const *topics, size_t n,
                                    int timeout_ms, char *errstr, size_t errstr_size);

/* ---------------------------------------------------------------- mock cluster */

/* librdkafka's in-process mock cluster (rdkafka_mock.h), for `lathed --embedded` and tests: Kafka
 * brokers that run on threads of this process and listen on loopback TCP ports, so any client
 * of this process or of another one on the host reaches them through lt_bus_mock_bootstraps().
 * Everything is in memory: the log is gone when the cluster is destroyed. What it models:
 * produce/fetch, consumer groups, offset commits, idempotent and transactional producers. What it
 * does not (librdkafka 2.0.2, NOTES.md): zombie fencing (a second producer with the same
 * transactional id gets a fresh producer id instead of fencing the first), commit/abort
 * markers (read_committed consumers also see records of aborted transactions), topic configs
 * (no compaction, no retention), and the CreateTopics admin request: topics are created with
 * lt_bus_mock_create_topic / lt_bus_mock_create_from_file, never with lt_bus_admin_*. A topic
 * a client names before it was created is auto-created with the mock's default partition count,
 * so create the topics before any client starts. Thread-safe. */
typedef struct lt_bus_mock lt_bus_mock_t;

/* Starts a mock cluster of `brokers` brokers (1..16) on 127.0.0.1, ephemeral ports. The caller
 * owns it (lt_bus_mock_destroy, after every client that uses it is destroyed). */
lt_err_t lt_bus_mock_new(int brokers, lt_bus_mock_t **out, char *errstr, size_t errstr_size);

/* "127.0.0.1:PORT[,...]": the bootstrap.servers of the cluster. Owned by m. */
const char *lt_bus_mock_bootstraps(const lt_bus_mock_t *m);

/* Creates a topic (full name) with `partitions` partitions, replication factor 1. An existing
 * topic is LT_OK and left as it is. */
lt_err_t lt_bus_mock_create_topic(lt_bus_mock_t *m, const char *topic, int partitions, char *errstr,
                                  size_t errstr_size);

/* Creates every topic of a topics file (the format of lt_bus_admin_create_from_file; the
 * configs column is read and ignored: the mock has no topic configs; path NULL: the built-in
 * copy of ops/topics.tsv), named with conf's prefix.
 * *out_created (may be NULL) receives how many topics were new. */
lt_err_t lt_bus_mock_create_from_file(lt_bus_mock_t *m, const lt_bus_conf_t *conf, const char *path,
                                      int *out_created, char *errstr, size_t errstr_size);

/* Stops the brokers and frees. Clients still connected see their brokers go down. NULL is a
 * no-op. */
void lt_bus_mock_destroy(lt_bus_mock_t *m);

#endif
