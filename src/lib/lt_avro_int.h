/* lt_avro_int: internals shared by the lt_avro*.c files (not a public header).
 *
 * lt_avro_schema.c parses each schema into the node tree below and builds the registry;
 * lt_avro_codec.c encodes and decodes a record's value (through resolution plans, private to
 * it); lt_avro.c creates records and gives typed field access; lt_avro_json.c converts records
 * and JSON (and applies schema defaults, which are JSON). They share the structs here, the
 * record's scratch buffer and a few helpers. */
#ifndef LT_AVRO_INT_H
#define LT_AVRO_INT_H

#include <avro.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "lt_avro.h"

#define LT_AVRO_MAX_DEPTH 32 /* nesting limit of schemas (also refuses recursive ones) */

/* ---- schema node tree ----
 *
 * Our own parse of a schema: it keeps what avro-c drops (field defaults, enum defaults, full
 * names) and drives the canonical form, the encoder, the decoder and JSON conversion. Nodes are
 * owned by their schema (lt_avro_schema.nodes) and immutable once the registry is built. */

typedef struct lt_node lt_node;

typedef struct lt_nfield {
  char *name;
  lt_node *type;
  json_t *def; /* borrowed from the schema's JSON tree; NULL when the field has no default */
} lt_nfield;

struct lt_node {
  avro_type_t type; /* AVRO_STRING ... AVRO_UNION; never AVRO_LINK */
  char *fullname;   /* named types: "lathe.StepCompleted" */
  const char *name; /* named types: the part after the last dot */
  lt_nfield *fields;
  size_t nfields;
  char **symbols;
  size_t nsymbols;
  int enum_default; /* index, or -1 */
  lt_node *items;   /* array items, map values */
  lt_node **branches;
  size_t nbranches;
  int64_t size;     /* fixed */
  unsigned emitted; /* canonical-form pass that already wrote this named type in full */
  lt_node *next;    /* allocation list */
};

/* The schema's word for n's type ("record", "long", ...), for messages. */
const char *lt_avro_type_word(const lt_node *n);

/* ---- registry ---- */

struct lt_avro_schema {
  const lt_avro_registry_t *reg;
  size_t index; /* in reg->schemas */
  const char *name;
  int version;
  const char *json;
  size_t json_len;
  char *canonical;
  size_t canonical_len;
  uint64_t fingerprint;
  json_t *tree;
  lt_node *root, *nodes;
  avro_schema_t avro;
  avro_value_iface_t *iface;
  const lt_avro_schema_t *latest;
  size_t type_index; /* index of the record type among the registry's types */
};

struct lt_avro_registry {
  lt_avro_schema_t *schemas;
  size_t n;
  size_t ntypes;
};

/* ---- records ---- */

typedef struct lt_plan lt_plan; /* how to read one writer version: lt_avro_codec.c */

struct lt_avro_record {
  const lt_avro_registry_t *reg;
  const lt_avro_schema_t *schema;
  avro_value_t value;
  lt_plan **plans;  /* per writer schema index in reg; built on first use */
  lt_plan *plan_mem;
  int writer_version;
  uint8_t *buf;     /* encode buffer */
  size_t cap;
  char *scratch;    /* NUL-terminated copies of decoded strings and map keys */
  size_t scratch_cap;
  char err[256];
};

/* Frees every plan of a record's allocation list (NULL is fine). */
void lt_avro_plans_free(lt_plan *p);

/* A fresh value of n: defaults where the schema has them, zero otherwise; unions on branch 0. */
lt_err_t lt_avro_value_init(lt_avro_record_t *rec, const lt_node *n, avro_value_t *v);

/* Sets v to the schema default def (JSON) of node n; a message goes to rec->err. */
lt_err_t lt_avro_value_default(lt_avro_record_t *rec, const lt_node *n, const json_t *def,
                               avro_value_t *v);

/* Grows rec's scratch buffer to at least n bytes (kept for the record's life: no allocation once
 * warm). */
static inline lt_err_t lt_avro_scratch(lt_avro_record_t *rec, size_t n) {
  if (n <= rec->scratch_cap) return LT_OK;
  size_t cap = rec->scratch_cap ? rec->scratch_cap : 64;
  while (cap < n) cap *= 2;
  char *p = realloc(rec->scratch, cap);
  if (!p) return LT_ERR_NOMEM;
  rec->scratch = p;
  rec->scratch_cap = cap;
  return LT_OK;
}

/* avro-c's string setter copies size bytes (size counts a NUL): give it a terminated copy.
 * Returns avro-c's result (0 or an errno). On the decoder's hot path, hence inline. */
static inline int lt_avro_value_string(lt_avro_record_t *rec, avro_value_t *v, const char *s,
                                       size_t len) {
  if (lt_avro_scratch(rec, len + 1)) return ENOMEM;
  memcpy(rec->scratch, s, len);
  rec->scratch[len] = '\0';
  return avro_value_set_string_len(v, rec->scratch, len + 1);
}

/* ---- growable string buffer (registry building and messages; never on the hot path) ---- */

typedef struct lt_sb {
  char *p;
  size_t len, cap;
  bool oom;
} lt_sb;

void lt_avro_sb_add(lt_sb *sb, const char *s, size_t n);
void lt_avro_sb_puts(lt_sb *sb, const char *s);
/* Appends an enum's symbols as "A, B, C" (for messages that list what is allowed). */
void lt_avro_sb_symbols(lt_sb *sb, const lt_node *n);

#endif
