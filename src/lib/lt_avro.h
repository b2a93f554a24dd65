/* lt_avro: Lathe's Avro records — the schema registry, single-object encoding, typed access.
 *
 * Every record on every Lathe topic is one schema of schemas/<Record>.v<N>.avsc (embedded into the binary by
 * the build), written in Avro single-object encoding (docs/DESIGN.md §3):
 *
 *   C3 01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's Parsing
 *   Canonical Form | Avro binary body
 *
 * Decoding looks the fingerprint up among every schema version ever used and resolves the writer
 * version to the newest version of that record (reader fields missing in the writer take their
 * schema default). An unknown fingerprint, a wrong magic or a truncated body is refused, never
 * misread.
 *
 * Values live in avro-c generic values. Encoding and decoding are written here (avro-c's own
 * avro_value_read allocates twice per string and its resolver cannot fill defaults), walking the
 * values with avro-c's value API; after a record's buffers have grown to size, encoding and
 * decoding allocate nothing.
 *
 * Threads: a registry is immutable after lt_avro_registry_new() and may be shared by all threads.
 * A record or a decoder is used by one thread at a time. */
#ifndef LT_AVRO_H
#define LT_AVRO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lt_err.h"

struct json_t; /* jansson */

#define LT_AVRO_HEADER_SIZE 10 /* C3 01 + 8-byte fingerprint */

/* ---- schemas embedded by the build (schemas/gen_schemas.py) ---- */

typedef struct lt_avro_embedded {
  const char *name; /* record name without namespace: "StepCompleted" */
  int version;      /* N of <name>.v<N>.avsc */
  const char *json; /* the schema, minified, docs and defaults kept */
  size_t json_len;
} lt_avro_embedded_t;

extern const lt_avro_embedded_t lt_avro_embedded_schemas[];
extern const size_t lt_avro_embedded_count;

/* ---- registry ---- */

typedef struct lt_avro_registry lt_avro_registry_t; /* every schema version; immutable */
typedef struct lt_avro_schema lt_avro_schema_t;     /* one version of one record; owned by the registry */
typedef struct lt_avro_record lt_avro_record_t;     /* a reusable value of one record type */
typedef struct lt_avro_decoder lt_avro_decoder_t;   /* decodes records of any type (mixed topics) */

/* Builds the registry of every embedded schema: parses each (avro-c and our own parser), computes
 * its canonical form and fingerprint, checks names, versions and that fingerprints are unique.
 * The caller owns *out (lt_avro_registry_destroy). */
lt_err_t lt_avro_registry_new(lt_avro_registry_t **out, char *errstr, size_t errstr_size);

/* Same from a given list (tests, tools). The list and its strings must outlive the registry. */
lt_err_t lt_avro_registry_new_from(const lt_avro_embedded_t *schemas, size_t count,
                                   lt_avro_registry_t **out, char *errstr, size_t errstr_size);

void lt_avro_registry_destroy(lt_avro_registry_t *reg); /* NULL is fine */

/* Schema versions in the registry, sorted by name then version; i < lt_avro_registry_count(). */
size_t lt_avro_registry_count(const lt_avro_registry_t *reg);
const lt_avro_schema_t *lt_avro_registry_at(const lt_avro_registry_t *reg, size_t i);

/* Lookups; NULL when there is no such schema. name is "StepCompleted" or "lathe.StepCompleted". */
const lt_avro_schema_t *lt_avro_schema_latest(const lt_avro_registry_t *reg, const char *name);
const lt_avro_schema_t *lt_avro_schema_find(const lt_avro_registry_t *reg, const char *name,
                                            int version);
const lt_avro_schema_t *lt_avro_schema_by_fingerprint(const lt_avro_registry_t *reg,
                                                      uint64_t fingerprint);

const char *lt_avro_schema_name(const lt_avro_schema_t *s); /* "StepCompleted" */
int lt_avro_schema_version(const lt_avro_schema_t *s);
bool lt_avro_schema_is_latest(const lt_avro_schema_t *s);
/* CRC-64-AVRO of the canonical form. In the header it is stored little-endian. */
uint64_t lt_avro_schema_fingerprint(const lt_avro_schema_t *s);
/* Parsing Canonical Form (NUL-terminated; *len may be NULL). */
const char *lt_avro_schema_canonical(const lt_avro_schema_t *s, size_t *len);
/* The .avsc as embedded (minified, with docs and defaults). */
const char *lt_avro_schema_json(const lt_avro_schema_t *s, size_t *len);

/* ---- pure helpers ---- */

/* CRC-64-AVRO (the Avro specification's fingerprint) of len bytes. */
uint64_t lt_avro_crc64(const void *data, size_t len);

/* Parsing Canonical Form of a schema given as JSON text. *out is malloc'd (caller frees),
 * NUL-terminated, *out_len its length. */
lt_err_t lt_avro_canonical_form(const char *json, size_t json_len, char **out, size_t *out_len,
                                char *errstr, size_t errstr_size);

/* Checks the single-object header of buf and gives its fingerprint. LT_ERR_CORRUPT when buf is
 * shorter than the header or the magic is not C3 01. Does not look the fingerprint up. */
lt_err_t lt_avro_peek(const void *buf, size_t len, uint64_t *fingerprint, char *errstr,
                      size_t errstr_size);

/* Fingerprint as 16 lowercase hex digits of its 8 header bytes (little-endian order, as the
 * specification prints them: "int" is 8f5c393f1ad57572). out holds at least 17 bytes. */
void lt_avro_fingerprint_hex(uint64_t fingerprint, char out[17]);

/* A random UUID (version 4) in its 36-character form, for event_id. out holds 37 bytes. */
void lt_avro_uuid(char out[37]);

/* ---- records ---- */

/* A record of the newest version of type `name` ("JobSubmitted"), with every field at its schema
 * default (fields without a default: 0, "", empty array, false). The caller owns *out.
 * LT_ERR_NOT_FOUND names the type when there is none. */
lt_err_t lt_avro_record_new(const lt_avro_registry_t *reg, const char *name,
                            lt_avro_record_t **out, char *errstr, size_t errstr_size);

/* A record of one given schema version (an old reader: tests of evolution, tools). */
lt_err_t lt_avro_record_new_schema(const lt_avro_registry_t *reg, const lt_avro_schema_t *schema,
                                   lt_avro_record_t **out, char *errstr, size_t errstr_size);

void lt_avro_record_destroy(lt_avro_record_t *rec); /* NULL is fine */

const lt_avro_schema_t *lt_avro_record_schema(const lt_avro_record_t *rec);
/* Record type name ("StepCompleted"): for a decoded record, the type that was decoded. */
const char *lt_avro_record_type(const lt_avro_record_t *rec);
/* Writer version of the last record decoded into rec (0 if none was decoded). */
int lt_avro_record_writer_version(const lt_avro_record_t *rec);

/* Every field back to its default. Keeps buffers (no allocation once warm). */
void lt_avro_record_clear(lt_avro_record_t *rec);

/* dst = src; both of the same schema. */
lt_err_t lt_avro_record_copy(lt_avro_record_t *dst, const lt_avro_record_t *src);

/* Sets event_id to a new UUID, occurred_at to now and producer to `producer`. */
lt_err_t lt_avro_record_stamp(lt_avro_record_t *rec, const char *producer);

/* Message of the last failed accessor call on rec (names the path and what was wrong). */
const char *lt_avro_record_error(const lt_avro_record_t *rec);

/* Encodes rec as a single-object message into a buffer the record owns; *out stays valid until
 * the next encode or destroy of rec. The buffer grows on demand and is then reused. */
lt_err_t lt_avro_record_encode(lt_avro_record_t *rec, const uint8_t **out, size_t *out_len,
                               char *errstr, size_t errstr_size);

/* Encodes into the caller's buffer. When cap is too small: LT_ERR_INVALID, *out_len = bytes
 * needed. */
lt_err_t lt_avro_record_encode_to(lt_avro_record_t *rec, void *buf, size_t cap, size_t *out_len,
                                  char *errstr, size_t errstr_size);

/* Encodes only the Avro binary body (no header) — for other framings and interop tests. */
lt_err_t lt_avro_record_encode_body(lt_avro_record_t *rec, const uint8_t **out, size_t *out_len,
                                    char *errstr, size_t errstr_size);

/* Decodes a single-object message into rec. The writer may be any version of rec's record type;
 * it is resolved to rec's schema. Errors: LT_ERR_CORRUPT (short header, wrong magic, truncated or
 * malformed body, trailing bytes), LT_ERR_UNKNOWN_SCHEMA (fingerprint not in the registry; the
 * message gives it in hex), LT_ERR_INVALID (a known schema of another record type). On error rec
 * holds no meaningful value. */
lt_err_t lt_avro_record_decode(lt_avro_record_t *rec, const void *buf, size_t len, char *errstr,
                               size_t errstr_size);

/* Decodes a bare binary body written with schema `writer` (a version of rec's type). */
lt_err_t lt_avro_record_decode_body(lt_avro_record_t *rec, const lt_avro_schema_t *writer,
                                    const void *body, size_t len, char *errstr,
                                    size_t errstr_size);

/* ---- decoder for topics that carry several record types ---- */

lt_err_t lt_avro_decoder_new(const lt_avro_registry_t *reg, lt_avro_decoder_t **out,
                             char *errstr, size_t errstr_size);
void lt_avro_decoder_destroy(lt_avro_decoder_t *dec); /* NULL is fine */

/* Decodes any known record; *rec (the newest version of the writer's record type) is owned by
 * the decoder and stays valid until the next lt_avro_decode that yields the same type, or
 * lt_avro_decoder_destroy. Errors as lt_avro_record_decode. */
lt_err_t lt_avro_decode(lt_avro_decoder_t *dec, const void *buf, size_t len,
                        lt_avro_record_t **rec, char *errstr, size_t errstr_size);

/* ---- typed field access ----
 *
 * path names a field: "step", a nested field "hyperparameters.lora_rank", an array element
 * "object_keys[0]" or a field of one "leases[1].job_id". Setting element [n] of an array of n
 * elements appends. On a nullable union (["null", T]) a setter selects branch T and
 * lt_avro_set_null the null branch; a getter on a null value answers LT_ERR_NOT_FOUND.
 * Failures return LT_ERR_INVALID (no such field, wrong type, index out of range, unknown enum
 * symbol) and leave the message in lt_avro_record_error(rec). Strings and bytes are copied in;
 * pointers handed out stay valid until that field is changed, rec is decoded into or destroyed. */
lt_err_t lt_avro_set_null(lt_avro_record_t *rec, const char *path);
lt_err_t lt_avro_set_bool(lt_avro_record_t *rec, const char *path, bool v);
lt_err_t lt_avro_set_int(lt_avro_record_t *rec, const char *path, int32_t v);
lt_err_t lt_avro_set_long(lt_avro_record_t *rec, const char *path, int64_t v); /* long (or int if it fits) */
lt_err_t lt_avro_set_double(lt_avro_record_t *rec, const char *path, double v); /* double or float */
lt_err_t lt_avro_set_string(lt_avro_record_t *rec, const char *path, const char *s);
lt_err_t lt_avro_set_string_len(lt_avro_record_t *rec, const char *path, const char *s, size_t len);
lt_err_t lt_avro_set_bytes(lt_avro_record_t *rec, const char *path, const void *p, size_t len);
lt_err_t lt_avro_set_enum(lt_avro_record_t *rec, const char *path, const char *symbol);

lt_err_t lt_avro_is_null(lt_avro_record_t *rec, const char *path, bool *is_null);
lt_err_t lt_avro_get_bool(lt_avro_record_t *rec, const char *path, bool *v);
lt_err_t lt_avro_get_int(lt_avro_record_t *rec, const char *path, int32_t *v);
lt_err_t lt_avro_get_long(lt_avro_record_t *rec, const char *path, int64_t *v); /* long or int */
lt_err_t lt_avro_get_double(lt_avro_record_t *rec, const char *path, double *v); /* any number */
/* *s is NUL-terminated; len may be NULL. */
lt_err_t lt_avro_get_string(lt_avro_record_t *rec, const char *path, const char **s, size_t *len);
lt_err_t lt_avro_get_bytes(lt_avro_record_t *rec, const char *path, const void **p, size_t *len);
lt_err_t lt_avro_get_enum(lt_avro_record_t *rec, const char *path, const char **symbol);

/* ---- typed field access by index ----
 *
 * The getters above for a top-level field given by its index in the record's schema, for hot
 * paths that read the same fields of every record (a fold): no path is parsed, no name compared.
 * Results, errors and messages are those of the path getter called with the field's name (or
 * "<name>[<i>]"). The index is the schema's: look it up once per schema with
 * lt_avro_schema_field_index and use it only with records of that schema. */
int lt_avro_schema_field_index(const lt_avro_schema_t *s, const char *name); /* -1: no such field */
lt_err_t lt_avro_get_bool_at(lt_avro_record_t *rec, int field, bool *v);
lt_err_t lt_avro_get_int_at(lt_avro_record_t *rec, int field, int32_t *v);
lt_err_t lt_avro_get_long_at(lt_avro_record_t *rec, int field, int64_t *v); /* long or int */
lt_err_t lt_avro_get_string_at(lt_avro_record_t *rec, int field, const char **s, size_t *len);
lt_err_t lt_avro_get_enum_at(lt_avro_record_t *rec, int field, const char **symbol);
/* Element i of an array of strings (or nullable array / nullable strings). */
lt_err_t lt_avro_get_array_string_at(lt_avro_record_t *rec, int field, size_t i, const char **s,
                                     size_t *len);

/* Arrays: element count, removal of all elements, and appending one element at its defaults
 * (*index, may be NULL, gets its position; set its fields through "path[index]..."). */
lt_err_t lt_avro_array_size(lt_avro_record_t *rec, const char *path, size_t *n);
lt_err_t lt_avro_array_clear(lt_avro_record_t *rec, const char *path);
lt_err_t lt_avro_array_append(lt_avro_record_t *rec, const char *path, size_t *index);
lt_err_t lt_avro_array_append_string(lt_avro_record_t *rec, const char *path, const char *s);

/* Maps of strings: sets the value under key (replacing one there), the entry count, and entry
 * i (in insertion order; *key and *s are the record's, valid until it changes). */
lt_err_t lt_avro_map_set_string(lt_avro_record_t *rec, const char *path, const char *key, const char *s);
lt_err_t lt_avro_map_size(lt_avro_record_t *rec, const char *path, size_t *n);
lt_err_t lt_avro_map_get_string_at(lt_avro_record_t *rec, const char *path, size_t i, const char **key,
                                   const char **s);

/* ---- JSON ----
 *
 * The JSON form of a record is an object of its fields. Nullable unions are written as the value
 * or null (the tagged Avro form {"string": "x"} is accepted too); bytes are strings of code points
 * 0-255 as in Avro's JSON encoding; enums are their symbol; timestamps are integers (ms). */

/* Fills rec from JSON text: every field of the schema must be given unless it has a default;
 * unknown fields are refused. Errors (LT_ERR_INVALID) name the field path and what was expected. */
lt_err_t lt_avro_record_from_json(lt_avro_record_t *rec, const char *json, size_t len,
                                  char *errstr, size_t errstr_size);
/* Same from a jansson value (borrowed). */
lt_err_t lt_avro_record_from_jansson(lt_avro_record_t *rec, const struct json_t *obj,
                                     char *errstr, size_t errstr_size);
/* JSON text of rec, compact, fields in schema order. *out is malloc'd (caller frees). */
lt_err_t lt_avro_record_to_json(lt_avro_record_t *rec, char **out, char *errstr,
                                size_t errstr_size);
/* Same as a new jansson object (caller owns the reference). */
lt_err_t lt_avro_record_to_jansson(lt_avro_record_t *rec, struct json_t **out, char *errstr,
                                   size_t errstr_size);

#endif
