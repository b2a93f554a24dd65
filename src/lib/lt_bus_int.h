/* lt_bus_int: internals shared by the lt_bus_*.c files and their tests (not a public header).
 *
 * Holds the librdkafka-facing pieces: the configuration's pass-through table, the
 * error classification (one table, so every caller retries, aborts or recreates the same way)
 * and the handle structs the producer, consumer and admin files share. */
#ifndef LT_BUS_INT_H
#define LT_BUS_INT_H

#include <librdkafka/rdkafka.h>

#include "lt_bus.h"

/* What a caller must do about a librdkafka error. */
typedef enum lt_bus_class {
  LT_BUS_CLASS_OK = 0,
  LT_BUS_CLASS_RETRIABLE, /* transient: the same call may succeed later */
  LT_BUS_CLASS_ABORTABLE, /* the current transaction must be aborted, then redone */
  LT_BUS_CLASS_FATAL,     /* the handle is unusable: destroy and recreate it */
  LT_BUS_CLASS_FENCED,    /* a newer producer owns the transactional id: stop */
  LT_BUS_CLASS_PERMANENT, /* this request can never succeed as is (bad input, unknown topic) */
} lt_bus_class_t;

const char *lt_bus_class_name(lt_bus_class_t cls);

/* Classification of a bare response code (delivery reports, consumer errors, admin results). */
lt_bus_class_t lt_bus_classify_code(rd_kafka_resp_err_t err);

/* The lt_err_t a bare response code becomes. */
lt_err_t lt_bus_err_from_code(rd_kafka_resp_err_t err);

/* Classification of an error object (transactional API), resolving a fatal error to the
 * underlying cause via rd_kafka_fatal_error(rk) so fencing is told apart. rk may be NULL. */
lt_bus_class_t lt_bus_classify_error(rd_kafka_t *rk, const rd_kafka_error_t *error);

/* True for the response codes that mean "a newer producer with this transactional id". */
bool lt_bus_code_is_fenced(rd_kafka_resp_err_t err);

/* Builds a librdkafka configuration: first `defaults` (name, value pairs, NULL-terminated),
 * then the conf's pass-through properties, then `forced` pairs that may not be overridden.
 * Returns NULL with errstr set on failure. */
/* librdkafka's log callback: its lines through lt_log (every handle's conf sets it). */
void lt_bus_rk_log(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

rd_kafka_conf_t *lt_bus_rk_conf(const lt_bus_conf_t *conf, const char *const *defaults,
                                const char *const *forced, char *errstr, size_t errstr_size);

/* rd_kafka_new for the handles: takes rc in every case (librdkafka frees it only on success).
 * NULL on failure, with "cannot create kafka WHAT: <reason>" in errstr. */
rd_kafka_t *lt_bus_rk_new(rd_kafka_type_t type, rd_kafka_conf_t *rc, const char *what, char *errstr,
                          size_t errstr_size);

/* Converts between librdkafka partition lists and lt_bus_tp_t arrays. The array form borrows
 * topic names from the list. */
rd_kafka_topic_partition_list_t *lt_bus_tplist_from(const lt_bus_tp_t *parts, size_t n);
lt_bus_tp_t *lt_bus_tparray_from(const rd_kafka_topic_partition_list_t *list);

/* Asks for one topic's metadata through a topic handle, so librdkafka knows its partitions and
 * their leaders now. A client that meets a topic first in a produce or an assign waits for its
 * own topic scan (once a second) or a metadata retry first. Best effort: on failure librdkafka's
 * own retry takes over. */
void lt_bus_learn_topic(rd_kafka_t *rk, const char *topic, int timeout_ms);

/* Metadata of one topic into *out (the caller frees it with rd_kafka_metadata_destroy); the
 * request's own failure (bad name, broker down) as an error naming the topic. The topic's
 * error, if any, is in (*out)->topics[0].err for the caller to judge. */
lt_err_t lt_bus_topic_metadata(rd_kafka_t *rk, const char *topic, int timeout_ms,
                               const struct rd_kafka_metadata **out, char *errstr, size_t errstr_size);

/* The handles' librdkafka instances (send_offsets needs the consumer's; tests read the
 * effective configuration). */
rd_kafka_t *lt_bus_consumer_rk(lt_bus_consumer_t *c);

/* ops/topics.tsv as it was when lathe was built (lt_topics_gen.c, made by src/lib/meson.build). */
extern const char lt_topics_builtin[];

/* The one reader of a topics file (ops/topics.tsv): for each topic line, fn gets the full name
 * (conf's prefix), partitions, configs ("key=value") and "path:line: " for messages. Stops at the
 * first error (a malformed line names its file and line). The admin client and the mock cluster
 * create topics through it. */
typedef lt_err_t lt_bus_topic_fn(void *ctx, const char *topic, int partitions, const char *const *configs,
                                 size_t nconfigs, const char *where, char *errstr, size_t errstr_size);
lt_err_t lt_bus_topics_file_each(const char *path, const lt_bus_conf_t *conf, lt_bus_topic_fn *fn, void *ctx,
                                 char *errstr, size_t errstr_size);
/* The CloudEvents names of produced records (lt_bus_ce.c): a table from schema fingerprint to
 * record name and version, built once per producer from the schemas embedded in the build. */
typedef struct lt_bus_ce_names lt_bus_ce_names_t;
lt_err_t lt_bus_ce_names_new(lt_bus_ce_names_t **out, char *errstr, size_t errstr_size);
void lt_bus_ce_names_destroy(lt_bus_ce_names_t *t); /* NULL is fine */

#define LT_BUS_CE_MAX 8 /* headers lt_bus_ce_fill may add */

/* The headers of one record: h[0..n) are views into the strings beside them. */
typedef struct lt_bus_ce {
  lt_bus_header_t h[LT_BUS_CE_MAX];
  size_t n;
  char id[96], source[80], type[96], time[32], dataschema[128], fingerprint[17];
} lt_bus_ce_t;

/* Fills out with the LT_BUS_CE_* headers of rec that rec's caller did not set itself, and
 * returns how many (0 when rec's value is not a single-object message of a known schema).
 * fallback_source names the producer when the record's envelope does not (the client id). */
size_t lt_bus_ce_fill(const lt_bus_ce_names_t *t, const char *fallback_source,
                      const lt_bus_record_t *rec, lt_bus_ce_t *out);

rd_kafka_t *lt_bus_producer_rk(lt_bus_producer_t *p);
rd_kafka_t *lt_bus_admin_rk(lt_bus_admin_t *a);
const lt_bus_conf_t *lt_bus_admin_conf(const lt_bus_admin_t *a);

#endif
