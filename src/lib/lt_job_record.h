/* lt_job_record: the bridge between Avro records and the job fold.
 *
 * lt_job_event_from_record() reads a decoded lathe.jobs / lathe.control record into the flat
 * lt_job_event_t that lt_job_apply() folds; lt_jobspec_from_record() / lt_jobspec_to_record()
 * move a job's spec in and out of JobSubmitted and JobDispatched records, so an upstream
 * record and an API submission are validated by the same lt_jobspec_validate().
 *
 * The event views strings inside the record: valid until the record changes. */
#ifndef LT_JOB_RECORD_H
#define LT_JOB_RECORD_H

#include "lt_avro.h"
#include "lt_bus.h"
#include "lt_job.h"
#include "lt_jobspec.h"

/* Fills *ev from rec. LT_ERR_NOT_FOUND when rec's type is not a job record (callers skip it);
 * LT_ERR_INVALID when a field the fold needs is missing or malformed (the message names it). */
lt_err_t lt_job_event_from_record(lt_avro_record_t *rec, lt_job_event_t *ev, char *errstr,
                                  size_t errstr_size);

/* A reader for the fold's hot path: it looks up once, per job record type, where each field
 * the fold needs sits in the newest schema (what lt_avro_decode yields), so lt_job_event_read
 * reads by index with no path parsed or name compared and nothing allocated. Its events are
 * those of lt_job_event_from_record, errors and messages included (both share one filler); a
 * record of an older schema version is read by name. Immutable once made; reg must outlive it.
 * The caller owns *out. */
typedef struct lt_job_reader lt_job_reader_t;
lt_err_t lt_job_reader_new(const lt_avro_registry_t *reg, lt_job_reader_t **out);
void lt_job_reader_destroy(lt_job_reader_t *r); /* NULL is fine */
lt_err_t lt_job_event_read(const lt_job_reader_t *r, lt_avro_record_t *rec, lt_job_event_t *ev,
                           char *errstr, size_t errstr_size);
/* The job event type of records of schema s (as lt_job_event_type_parse of its name, by pointer
 * for the newest versions); LT_ERR_NOT_FOUND when s is not a job record type. */
lt_err_t lt_job_reader_type(const lt_job_reader_t *r, const lt_avro_schema_t *s,
                            lt_job_event_type_t *out);

/* Reads the spec fields of a JobSubmitted or JobDispatched record (no validation). */
lt_err_t lt_jobspec_from_record(lt_avro_record_t *rec, lt_jobspec_t *spec, char *errstr,
                                size_t errstr_size);

/* Writes the spec fields into a JobSubmitted or JobDispatched record (ids, events and times are
 * the caller's). */
lt_err_t lt_jobspec_to_record(const lt_jobspec_t *spec, lt_avro_record_t *rec, char *errstr,
                              size_t errstr_size);

/* The partition of lathe.calls that holds a training session's calls: the API produces each
 * SessionCall there and the session's worker reads only it (FNV-1a of the id over the topic's
 * LT_CALLS_PARTITIONS partitions, as ops/topics.tsv creates it). */
#define LT_CALLS_PARTITIONS 6
int32_t lt_calls_partition(const char *job_id);

/* The call id of a session's call sent with an Idempotency-Key: "k" and 32 hex digits of SHA-256
 * over the tenant, the session and the key, so a retry names the same call on any API process and
 * after a restart. Random call ids are 32 hex digits, without the "k": lt_call_id_keyed tells the
 * two apart (the worker runs the first call of a keyed id and skips any later record of it). */
#define LT_CALL_ID_MAX 40
void lt_call_id_for_key(const char *tenant_id, const char *job_id, const char *key, char out[LT_CALL_ID_MAX]);
bool lt_call_id_keyed(const char *call_id);

/* A keyed call's body once the body itself is gone (its worker deletes it when the call was
 * answered, and stores this sealed as "<body key>.digest"): 64 hex digits of SHA-256 over its
 * JSON with sorted keys, without "state_key" (the API's addition to a load_state). The API
 * compares a retry of the call with it: the worker that writes it and the API that checks it must
 * compute it alike (this function, one jansson), or every retry after an answer is 422. False
 * when out of memory. */
struct json_t;
bool lt_call_body_digest(const struct json_t *body, char hex[65]);
/* Where that digest is: "<body key>.digest". */
void lt_call_digest_key(char *out, size_t n, const char *body_key);

/* Fills a DeadLetter record (stamping is the caller's) for consumed record m refused with code:
 * its topic, partition, offset, key, payload and writer fingerprint, the reason and the consumer
 * that refused it. A payload over LT_DEAD_LETTER_PAYLOAD_MAX bytes, or a key over
 * LT_DEAD_LETTER_KEY_MAX, is kept to that many first bytes and the reason says so: a DeadLetter
 * of a whole record as large as its topic takes would be over the producer's own limit, and the
 * writer that cannot write it (the scheduler: its transaction) would meet the record again at
 * every term. LT_ERR_INVALID with lt_avro_record_error(rec) when a field does not take. */
#define LT_DEAD_LETTER_PAYLOAD_MAX 65536
#define LT_DEAD_LETTER_KEY_MAX 4096
lt_err_t lt_dead_letter_fill(lt_avro_record_t *rec, const lt_bus_msg_t *m, lt_err_t code, const char *reason,
                             const char *consumer);

#endif
