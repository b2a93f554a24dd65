/* lt_avro_codec: Avro binary encoding and decoding of a record's value, and the resolution of
 * an old writer version to the record's (reader) version.
 *
 * The encoder and decoder follow the Avro specification directly over avro-c's value API (its
 * own avro_value_read allocates twice per string and its resolver cannot fill defaults).
 * Decoding goes through a resolution plan (lt_plan) from the writer version to the reader's,
 * built once per pair and kept in the record. This is the hot path: once a record's buffers have
 * grown to size, encoding and decoding allocate nothing. */
#include "lt_avro_int.h"

#include <stdarg.h>
#include <stdio.h>

/* ------------------------------------------------------------------------------------------ */
/* Resolution plans: how to read data of writer node w into a value of reader node r. */

/* What decode_value does. P_<T>: read a T as is; P_<W>_<R>: read a W, store it promoted to an R;
 * P_WUNION: the writer wrote a union (branch index, then that branch's plan); P_RUNION: the reader
 * holds a union (select rbranch, then its plan). */
typedef enum lt_plan_op {
  P_NULL, P_BOOL, P_INT, P_LONG, P_FLOAT, P_DOUBLE, P_STRING, P_BYTES, P_FIXED,
  P_INT_LONG, P_INT_FLOAT, P_INT_DOUBLE, P_LONG_FLOAT, P_LONG_DOUBLE, P_FLOAT_DOUBLE,
  P_STRING_BYTES, P_BYTES_STRING,
  P_RECORD, P_ENUM, P_ARRAY, P_MAP, P_WUNION, P_RUNION
} lt_plan_op;

struct lt_plan {
  lt_plan_op op;
  const lt_node *w, *r; /* writer and reader nodes */
  lt_plan **child; /* record: per writer field (NULL: skip); wunion: per writer branch */
  int *idx;        /* record: writer field -> reader field or -1; enum: writer -> reader symbol */
  size_t *defaults; /* record: reader fields absent from the writer */
  size_t ndefaults;
  int rbranch; /* runion */
  lt_plan *next;
};

typedef struct lt_planner {
  lt_plan **all;
  char *err;
  size_t errsz;
} lt_planner;

void lt_avro_plans_free(lt_plan *p) {
  while (p) {
    lt_plan *next = p->next;
    free(p->child);
    free(p->idx);
    free(p->defaults);
    free(p);
    p = next;
  }
}

static lt_plan *plan_new(lt_planner *pl, lt_plan_op op, const lt_node *w, const lt_node *r) {
  lt_plan *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->op = op;
  p->w = w;
  p->r = r;
  p->rbranch = -1;
  p->next = *pl->all;
  *pl->all = p;
  return p;
}

/* The op that reads a primitive w as a primitive r: the same type, or one of the specification's
 * promotions (int to long, string to bytes, ...); -1 when there is none. */
static int promotion(avro_type_t w, avro_type_t r) {
  if (w == r) {
    switch (w) {
      case AVRO_NULL: return P_NULL;
      case AVRO_BOOLEAN: return P_BOOL;
      case AVRO_INT32: return P_INT;
      case AVRO_INT64: return P_LONG;
      case AVRO_FLOAT: return P_FLOAT;
      case AVRO_DOUBLE: return P_DOUBLE;
      case AVRO_STRING: return P_STRING;
      case AVRO_BYTES: return P_BYTES;
      default: return -1;
    }
  }
  if (w == AVRO_INT32 && r == AVRO_INT64) return P_INT_LONG;
  if (w == AVRO_INT32 && r == AVRO_FLOAT) return P_INT_FLOAT;
  if (w == AVRO_INT32 && r == AVRO_DOUBLE) return P_INT_DOUBLE;
  if (w == AVRO_INT64 && r == AVRO_FLOAT) return P_LONG_FLOAT;
  if (w == AVRO_INT64 && r == AVRO_DOUBLE) return P_LONG_DOUBLE;
  if (w == AVRO_FLOAT && r == AVRO_DOUBLE) return P_FLOAT_DOUBLE;
  if (w == AVRO_STRING && r == AVRO_BYTES) return P_STRING_BYTES;
  if (w == AVRO_BYTES && r == AVRO_STRING) return P_BYTES_STRING;
  return -1;
}

static lt_plan *plan_build(lt_planner *pl, const lt_node *w, const lt_node *r, int depth,
                           bool quiet);

static lt_plan *plan_fail(lt_planner *pl, bool quiet, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lt_plan *plan_fail(lt_planner *pl, bool quiet, const char *fmt, ...) {
  if (!quiet && pl->err && pl->errsz) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pl->err, pl->errsz, fmt, ap);
    va_end(ap);
  }
  return NULL;
}

/* An enum: each writer symbol's index in the reader (its default when it has none). */
static lt_plan *plan_enum(lt_planner *pl, const lt_node *w, const lt_node *r, bool quiet) {
  if (strcmp(w->name, r->name) != 0)
    return plan_fail(pl, quiet, "enum %s cannot be read as enum %s", w->fullname, r->fullname);
  lt_plan *p = plan_new(pl, P_ENUM, w, r);
  if (!p || !(p->idx = calloc(w->nsymbols, sizeof *p->idx))) return NULL;
  for (size_t i = 0; i < w->nsymbols; i++) {
    p->idx[i] = r->enum_default;
    for (size_t k = 0; k < r->nsymbols; k++)
      if (strcmp(w->symbols[i], r->symbols[k]) == 0) p->idx[i] = (int)k;
  }
  return p;
}

/* A record: fields matched by name (a writer field the reader lacks is skipped), and the
 * reader's fields the writer lacks, which must have a default. */
static lt_plan *plan_record(lt_planner *pl, const lt_node *w, const lt_node *r, int depth,
                            bool quiet) {
  if (strcmp(w->name, r->name) != 0)
    return plan_fail(pl, quiet, "record %s cannot be read as record %s", w->fullname, r->fullname);
  lt_plan *p = plan_new(pl, P_RECORD, w, r);
  if (!p || !(p->child = calloc(w->nfields + 1, sizeof *p->child)) ||
      !(p->idx = calloc(w->nfields + 1, sizeof *p->idx)) ||
      !(p->defaults = calloc(r->nfields + 1, sizeof *p->defaults)))
    return NULL;
  for (size_t i = 0; i < w->nfields; i++) {
    p->idx[i] = -1;
    for (size_t k = 0; k < r->nfields; k++)
      if (strcmp(w->fields[i].name, r->fields[k].name) == 0) {
        p->idx[i] = (int)k;
        p->child[i] = plan_build(pl, w->fields[i].type, r->fields[k].type, depth + 1, quiet);
        if (!p->child[i]) {
          char inner[200];
          snprintf(inner, sizeof inner, "%s", pl->err ? pl->err : "incompatible");
          return plan_fail(pl, quiet, "%s.%s: %s", r->name, r->fields[k].name, inner);
        }
      }
  }
  for (size_t k = 0; k < r->nfields; k++) {
    bool in_writer = false;
    for (size_t i = 0; i < w->nfields; i++) in_writer |= p->idx[i] == (int)k;
    if (in_writer) continue;
    if (!r->fields[k].def)
      return plan_fail(pl, quiet, "%s.%s is not in the writer's schema and has no default",
                       r->name, r->fields[k].name);
    p->defaults[p->ndefaults++] = k;
  }
  return p;
}

/* The plan for writer node w read as reader node r; NULL when they do not resolve (quiet: no
 * message, as when trying the branches of a union). */
static lt_plan *plan_build(lt_planner *pl, const lt_node *w, const lt_node *r, int depth,
                           bool quiet) {
  if (depth > LT_AVRO_MAX_DEPTH) return plan_fail(pl, quiet, "schema nested too deeply");
  if (w->type == AVRO_UNION) {
    lt_plan *p = plan_new(pl, P_WUNION, w, r);
    if (!p || !(p->child = calloc(w->nbranches, sizeof *p->child))) return NULL;
    bool any = false;
    for (size_t i = 0; i < w->nbranches; i++) {
      p->child[i] = plan_build(pl, w->branches[i], r, depth + 1, true);
      any |= p->child[i] != NULL;
    }
    if (any) return p;
    return plan_fail(pl, quiet, "no branch of the writer's union can be read as %s",
                     lt_avro_type_word(r));
  }
  if (r->type == AVRO_UNION) {
    /* The first reader branch of the same type, else the first one the writer promotes to. */
    for (int pass = 0; pass < 2; pass++)
      for (size_t i = 0; i < r->nbranches; i++) {
        const lt_node *rb = r->branches[i];
        bool same = rb->type == w->type &&
                    (!rb->fullname || !w->fullname || strcmp(rb->name, w->name) == 0);
        if (pass == 0 && !same) continue;
        lt_plan *c = plan_build(pl, w, rb, depth + 1, true);
        if (!c) continue;
        lt_plan *p = plan_new(pl, P_RUNION, w, r);
        if (!p || !(p->child = calloc(1, sizeof *p->child))) return NULL;
        p->child[0] = c;
        p->rbranch = (int)i;
        return p;
      }
    return plan_fail(pl, quiet, "writer type %s matches no branch of the reader's union",
                     lt_avro_type_word(w));
  }
  int op = promotion(w->type, r->type);
  if (op >= 0) return plan_new(pl, (lt_plan_op)op, w, r);
  if (w->type != r->type)
    return plan_fail(pl, quiet, "writer type %s cannot be read as %s", lt_avro_type_word(w),
                     lt_avro_type_word(r));
  switch (w->type) {
    case AVRO_FIXED:
      if (strcmp(w->name, r->name) != 0 || w->size != r->size)
        return plan_fail(pl, quiet, "fixed %s cannot be read as fixed %s", w->fullname,
                         r->fullname);
      return plan_new(pl, P_FIXED, w, r);
    case AVRO_ENUM: return plan_enum(pl, w, r, quiet);
    case AVRO_ARRAY:
    case AVRO_MAP: {
      lt_plan *c = plan_build(pl, w->items, r->items, depth + 1, quiet);
      if (!c) return NULL;
      lt_plan *p = plan_new(pl, w->type == AVRO_ARRAY ? P_ARRAY : P_MAP, w, r);
      if (!p || !(p->child = calloc(1, sizeof *p->child))) return NULL;
      p->child[0] = c;
      return p;
    }
    case AVRO_RECORD: return plan_record(pl, w, r, depth, quiet);
    default:
      return plan_fail(pl, quiet, "cannot resolve %s", lt_avro_type_word(w));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Binary encoding. Writes past cap are counted, not made: a first pass into a small buffer
 * measures what a second one needs. */

typedef struct lt_wr {
  uint8_t *buf;
  size_t cap, pos;
} lt_wr;

static inline void wr_bytes(lt_wr *w, const void *p, size_t n) {
  if (w->pos + n <= w->cap) memcpy(w->buf + w->pos, p, n);
  w->pos += n;
}

/* A long or an int: zig-zag, then a varint. */
static inline void wr_long(lt_wr *w, int64_t v) {
  uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
  uint8_t tmp[10];
  size_t n = 0;
  while (z > 0x7f) {
    tmp[n++] = (uint8_t)((z & 0x7f) | 0x80);
    z >>= 7;
  }
  tmp[n++] = (uint8_t)z;
  wr_bytes(w, tmp, n);
}

/* The low n bytes of u, least significant first (floats, doubles, the header's fingerprint). */
static inline void wr_le(lt_wr *w, uint64_t u, size_t n) {
  uint8_t b[8];
  for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(u >> (8 * i));
  wr_bytes(w, b, n);
}

static lt_err_t enc_fail(lt_avro_record_t *rec, const char *field, const char *what) {
  return lt_errf(rec->err, sizeof rec->err, LT_ERR_INVALID, "%s: field %s: %s", rec->schema->name,
                 field ? field : "(top)", what);
}

static lt_err_t encode_value(lt_avro_record_t *rec, lt_wr *w, const lt_node *n, avro_value_t *v,
                             const char *field);

/* An array or a map: one block of every item (a map's with its key), then the empty block. */
static lt_err_t encode_items(lt_avro_record_t *rec, lt_wr *w, const lt_node *n, avro_value_t *v,
                             const char *field) {
  size_t count = 0;
  if (avro_value_get_size(v, &count)) return enc_fail(rec, field, "not an array or map");
  if (count) {
    wr_long(w, (int64_t)count);
    for (size_t i = 0; i < count; i++) {
      avro_value_t e;
      const char *key = NULL;
      if (avro_value_get_by_index(v, i, &e, n->type == AVRO_MAP ? &key : NULL))
        return enc_fail(rec, field, "cannot read element");
      if (n->type == AVRO_MAP) {
        size_t kl = strlen(key);
        wr_long(w, (int64_t)kl);
        wr_bytes(w, key, kl);
      }
      lt_err_t rc = encode_value(rec, w, n->items, &e, field);
      if (rc) return rc;
    }
  }
  wr_long(w, 0);
  return LT_OK;
}

/* A record: its fields in schema order, each named in messages. */
static lt_err_t encode_record(lt_avro_record_t *rec, lt_wr *w, const lt_node *n, avro_value_t *v) {
  for (size_t i = 0; i < n->nfields; i++) {
    avro_value_t f;
    if (avro_value_get_by_index(v, i, &f, NULL)) return enc_fail(rec, n->fields[i].name, "missing");
    lt_err_t rc = encode_value(rec, w, n->fields[i].type, &f, n->fields[i].name);
    if (rc) return rc;
  }
  return LT_OK;
}

/* Any value v of schema node n. field is the record field it belongs to (messages). Primitives
 * are written here, in the one switch, so that each costs a single dispatch. */
static lt_err_t encode_value(lt_avro_record_t *rec, lt_wr *w, const lt_node *n, avro_value_t *v,
                             const char *field) {
  switch (n->type) {
    case AVRO_NULL: return LT_OK;
    case AVRO_BOOLEAN: {
      int b = 0;
      if (avro_value_get_boolean(v, &b)) return enc_fail(rec, field, "not a boolean");
      wr_le(w, b ? 1 : 0, 1);
      return LT_OK;
    }
    case AVRO_INT32:
    case AVRO_INT64: { /* both a zig-zag varint */
      bool is_int = n->type == AVRO_INT32;
      int32_t i = 0;
      int64_t x = 0;
      if (is_int ? avro_value_get_int(v, &i) : avro_value_get_long(v, &x))
        return enc_fail(rec, field, is_int ? "not an int" : "not a long");
      wr_long(w, is_int ? i : x);
      return LT_OK;
    }
    case AVRO_FLOAT:
    case AVRO_DOUBLE: { /* IEEE 754 bits, little-endian */
      bool is_float = n->type == AVRO_FLOAT;
      float f = 0;
      double d = 0;
      if (is_float ? avro_value_get_float(v, &f) : avro_value_get_double(v, &d))
        return enc_fail(rec, field, is_float ? "not a float" : "not a double");
      uint32_t u32;
      uint64_t u64;
      memcpy(&u32, &f, 4);
      memcpy(&u64, &d, 8);
      if (is_float) wr_le(w, u32, 4);
      else wr_le(w, u64, 8);
      return LT_OK;
    }
    case AVRO_STRING: {
      const char *s = NULL;
      size_t size = 0;
      if (avro_value_get_string(v, &s, &size)) return enc_fail(rec, field, "not a string");
      size_t len = size ? size - 1 : 0;
      wr_long(w, (int64_t)len);
      wr_bytes(w, s, len);
      return LT_OK;
    }
    case AVRO_BYTES:
    case AVRO_FIXED: { /* bytes: a length, then the bytes; fixed: the bytes of its size */
      const void *p = NULL;
      size_t size = 0;
      if (n->type == AVRO_BYTES) {
        if (avro_value_get_bytes(v, &p, &size)) return enc_fail(rec, field, "not bytes");
        wr_long(w, (int64_t)size);
      } else if (avro_value_get_fixed(v, &p, &size) || size != (size_t)n->size) {
        return enc_fail(rec, field, "fixed value has the wrong size");
      }
      wr_bytes(w, p, size);
      return LT_OK;
    }
    case AVRO_ENUM: {
      int e = 0;
      if (avro_value_get_enum(v, &e) || e < 0 || (size_t)e >= n->nsymbols)
        return enc_fail(rec, field, "enum value out of range");
      wr_long(w, e);
      return LT_OK;
    }
    case AVRO_UNION: {
      int d = -1;
      avro_value_t b;
      if (avro_value_get_discriminant(v, &d) || d < 0 || (size_t)d >= n->nbranches ||
          avro_value_get_current_branch(v, &b))
        return enc_fail(rec, field, "union has no value");
      wr_long(w, d);
      return encode_value(rec, w, n->branches[d], &b, field);
    }
    case AVRO_ARRAY:
    case AVRO_MAP: return encode_items(rec, w, n, v, field);
    case AVRO_RECORD: return encode_record(rec, w, n, v);
    default: return enc_fail(rec, field, "unsupported type");
  }
}

/* Encodes rec into buf (header: single-object framing); *need is the full size, which may
 * exceed cap (then buf holds only a prefix). */
static lt_err_t encode_into(lt_avro_record_t *rec, uint8_t *buf, size_t cap, bool header,
                            size_t *need) {
  lt_wr w = {.buf = buf, .cap = cap, .pos = 0};
  if (header) {
    static const uint8_t magic[2] = {0xC3, 0x01};
    wr_bytes(&w, magic, sizeof magic);
    wr_le(&w, rec->schema->fingerprint, 8);
  }
  lt_err_t rc = encode_value(rec, &w, rec->schema->root, &rec->value, NULL);
  *need = w.pos;
  return rc;
}

static lt_err_t encode_own(lt_avro_record_t *rec, bool header, const uint8_t **out,
                           size_t *out_len, char *errstr, size_t errstr_size) {
  size_t need = 0;
  lt_err_t rc = encode_into(rec, rec->buf, rec->cap, header, &need);
  if (rc) return lt_errf(errstr, errstr_size, rc, "%s", rec->err);
  if (need > rec->cap) {
    size_t cap = rec->cap ? rec->cap : 256;
    while (cap < need) cap *= 2;
    uint8_t *p = realloc(rec->buf, cap);
    if (!p)
      return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory encoding %s",
                     rec->schema->name);
    rec->buf = p;
    rec->cap = cap;
    rc = encode_into(rec, rec->buf, rec->cap, header, &need);
    if (rc) return lt_errf(errstr, errstr_size, rc, "%s", rec->err);
  }
  *out = rec->buf;
  *out_len = need;
  return LT_OK;
}

lt_err_t lt_avro_record_encode(lt_avro_record_t *rec, const uint8_t **out, size_t *out_len,
                               char *errstr, size_t errstr_size) {
  return encode_own(rec, true, out, out_len, errstr, errstr_size);
}

lt_err_t lt_avro_record_encode_body(lt_avro_record_t *rec, const uint8_t **out, size_t *out_len,
                                    char *errstr, size_t errstr_size) {
  return encode_own(rec, false, out, out_len, errstr, errstr_size);
}

lt_err_t lt_avro_record_encode_to(lt_avro_record_t *rec, void *buf, size_t cap, size_t *out_len,
                                  char *errstr, size_t errstr_size) {
  size_t need = 0;
  lt_err_t rc = encode_into(rec, buf, cap, true, &need);
  if (rc) return lt_errf(errstr, errstr_size, rc, "%s", rec->err);
  *out_len = need;
  if (need > cap)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s needs %zu bytes, the buffer has %zu", rec->schema->name, need, cap);
  return LT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Binary decoding through a plan. */

typedef struct lt_rd {
  const uint8_t *start, *p, *end;
  const char *field; /* for messages */
  lt_err_t rc;
  char *msg;
  size_t msgsz;
} lt_rd;

static lt_err_t rd_fail(lt_rd *r, lt_err_t rc, const char *what) {
  r->rc = rc;
  lt_errf(r->msg, r->msgsz, rc, "%s at body byte %zu (field %s)", what, (size_t)(r->p - r->start),
          r->field ? r->field : "(top)");
  return rc;
}

static inline lt_err_t rd_long(lt_rd *r, int64_t *out) {
  uint64_t z = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (r->p >= r->end) return rd_fail(r, LT_ERR_CORRUPT, "truncated body: varint cut short");
    uint8_t b = *r->p++;
    if (shift == 63 && (b & 0x7e)) return rd_fail(r, LT_ERR_CORRUPT, "varint overflows 64 bits");
    z |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
      return LT_OK;
    }
  }
  return rd_fail(r, LT_ERR_CORRUPT, "varint longer than 10 bytes");
}

static inline lt_err_t rd_need(lt_rd *r, size_t n) {
  if ((size_t)(r->end - r->p) < n) return rd_fail(r, LT_ERR_CORRUPT, "truncated body");
  return LT_OK;
}

static lt_err_t rd_len(lt_rd *r, size_t *len) {
  int64_t l;
  if (rd_long(r, &l)) return r->rc;
  if (l < 0) return rd_fail(r, LT_ERR_CORRUPT, "negative length");
  if ((uint64_t)l > (uint64_t)(r->end - r->p))
    return rd_fail(r, LT_ERR_CORRUPT, "truncated body: length runs past the end");
  *len = (size_t)l;
  return LT_OK;
}

static lt_err_t rd_float(lt_rd *r, float *f) {
  if (rd_need(r, 4)) return r->rc;
  uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
               (uint32_t)r->p[3] << 24;
  memcpy(f, &u, 4);
  r->p += 4;
  return LT_OK;
}

static lt_err_t rd_double(lt_rd *r, double *d) {
  if (rd_need(r, 8)) return r->rc;
  uint64_t u = 0;
  for (int i = 0; i < 8; i++) u |= (uint64_t)r->p[i] << (8 * i);
  memcpy(d, &u, 8);
  r->p += 8;
  return LT_OK;
}

/* Skips a value of writer type n (a writer field the reader does not have). */
static lt_err_t skip_value(lt_rd *r, const lt_node *n, int depth) {
  int64_t x;
  size_t len;
  if (depth > LT_AVRO_MAX_DEPTH) return rd_fail(r, LT_ERR_CORRUPT, "nesting too deep");
  switch (n->type) {
    case AVRO_NULL: return LT_OK;
    case AVRO_BOOLEAN: if (rd_need(r, 1)) return r->rc; r->p++; return LT_OK;
    case AVRO_INT32:
    case AVRO_INT64:
    case AVRO_ENUM: return rd_long(r, &x);
    case AVRO_FLOAT: if (rd_need(r, 4)) return r->rc; r->p += 4; return LT_OK;
    case AVRO_DOUBLE: if (rd_need(r, 8)) return r->rc; r->p += 8; return LT_OK;
    case AVRO_STRING:
    case AVRO_BYTES: if (rd_len(r, &len)) return r->rc; r->p += len; return LT_OK;
    case AVRO_FIXED: if (rd_need(r, (size_t)n->size)) return r->rc; r->p += n->size; return LT_OK;
    case AVRO_UNION:
      if (rd_long(r, &x)) return r->rc;
      if (x < 0 || (uint64_t)x >= n->nbranches)
        return rd_fail(r, LT_ERR_CORRUPT, "union index out of range");
      return skip_value(r, n->branches[x], depth + 1);
    case AVRO_RECORD:
      for (size_t i = 0; i < n->nfields; i++)
        if (skip_value(r, n->fields[i].type, depth + 1)) return r->rc;
      return LT_OK;
    case AVRO_ARRAY:
    case AVRO_MAP:
      for (;;) {
        int64_t count;
        if (rd_long(r, &count)) return r->rc;
        if (count == 0) return LT_OK;
        if (count < 0) {
          int64_t bytes;
          if (rd_long(r, &bytes)) return r->rc;
          if (bytes < 0 || (uint64_t)bytes > (uint64_t)(r->end - r->p))
            return rd_fail(r, LT_ERR_CORRUPT, "bad block size");
          r->p += bytes;
          continue;
        }
        if ((uint64_t)count > (uint64_t)(r->end - r->p))
          return rd_fail(r, LT_ERR_CORRUPT, "truncated body: block count runs past the end");
        for (int64_t i = 0; i < count; i++) {
          if (n->type == AVRO_MAP && rd_len(r, &len)) return r->rc;
          if (n->type == AVRO_MAP) r->p += len;
          if (skip_value(r, n->items, depth + 1)) return r->rc;
        }
      }
    default: return rd_fail(r, LT_ERR_INTERNAL, "unsupported type");
  }
}

/* Reads a block's item count into *count (0: the array or map ends). A negative count is
 * followed by the block's size in bytes, which decoding does not need. Every item takes at least
 * one byte unless it is null-like (item's plan is P_NULL), which bounds the count by what is
 * left. */
static lt_err_t rd_block_count(lt_rd *r, const lt_plan *item, int64_t *count) {
  if (rd_long(r, count)) return r->rc;
  if (*count < 0) {
    int64_t bytes;
    if (*count == INT64_MIN || rd_long(r, &bytes))
      return r->rc ? r->rc : rd_fail(r, LT_ERR_CORRUPT, "bad block count");
    *count = -*count;
  }
  if ((uint64_t)*count > (uint64_t)(r->end - r->p) + 1 && item->op != P_NULL)
    return rd_fail(r, LT_ERR_CORRUPT, "truncated body: block count runs past the end");
  return LT_OK;
}

static lt_err_t decode_value(lt_avro_record_t *rec, lt_rd *r, const lt_plan *pl, avro_value_t *v,
                             int depth);

/* A map (map true), or an array decoded from its start: v is emptied and every entry added. */
static lt_err_t decode_entries(lt_avro_record_t *rec, lt_rd *r, const lt_plan *pl, avro_value_t *v,
                               int depth, bool map) {
  size_t len;
  if (avro_value_reset(v)) return rd_fail(r, LT_ERR_NOMEM, "cannot reset array");
  for (;;) {
    int64_t count;
    if (rd_block_count(r, pl->child[0], &count)) return r->rc;
    if (count == 0) return LT_OK;
    for (int64_t i = 0; i < count; i++) {
      avro_value_t e;
      if (map) {
        if (rd_len(r, &len)) return r->rc;
        if (lt_avro_scratch(rec, len + 1)) return rd_fail(r, LT_ERR_NOMEM, "out of memory");
        memcpy(rec->scratch, r->p, len);
        rec->scratch[len] = '\0';
        r->p += len;
        if (avro_value_add(v, rec->scratch, &e, NULL, NULL))
          return rd_fail(r, LT_ERR_NOMEM, "cannot add map entry");
      } else if (avro_value_append(v, &e, NULL)) {
        return rd_fail(r, LT_ERR_NOMEM, "cannot append array element");
      }
      lt_err_t rc = decode_value(rec, r, pl->child[0], &e, depth + 1);
      if (rc) return rc;
    }
  }
}

/* An array. Elements already in the array are decoded over (each decode sets its whole value),
 * so a record decoded again and again keeps its element buffers: no allocation once warm.
 * Resetting would free every element and appending make it anew. Fewer elements than before:
 * decode the array again from its start, from empty (the rare case). */
static lt_err_t decode_array(lt_avro_record_t *rec, lt_rd *r, const lt_plan *pl, avro_value_t *v,
                             int depth) {
  size_t had = 0, i = 0;
  const uint8_t *start = r->p;
  avro_value_get_size(v, &had);
  for (;;) {
    int64_t count;
    if (rd_block_count(r, pl->child[0], &count)) return r->rc;
    if (count == 0) break;
    for (int64_t k = 0; k < count; k++, i++) {
      avro_value_t e;
      if (i < had ? avro_value_get_by_index(v, i, &e, NULL) : avro_value_append(v, &e, NULL))
        return rd_fail(r, LT_ERR_NOMEM, "cannot append array element");
      lt_err_t rc = decode_value(rec, r, pl->child[0], &e, depth + 1);
      if (rc) return rc;
    }
  }
  if (i >= had) return LT_OK;
  r->p = start;
  return decode_entries(rec, r, pl, v, depth, false);
}

/* A record: the writer's fields in its order (those the reader lacks skipped), then the
 * defaults of the reader's fields the writer lacks. */
static lt_err_t decode_record(lt_avro_record_t *rec, lt_rd *r, const lt_plan *pl, avro_value_t *v,
                              int depth) {
  const lt_node *w = pl->w, *rn = pl->r;
  for (size_t i = 0; i < w->nfields; i++) {
    r->field = w->fields[i].name;
    if (pl->idx[i] < 0) {
      if (skip_value(r, w->fields[i].type, depth + 1)) return r->rc;
      continue;
    }
    avro_value_t f;
    if (avro_value_get_by_index(v, (size_t)pl->idx[i], &f, NULL))
      return rd_fail(r, LT_ERR_INTERNAL, "no such field");
    lt_err_t rc = decode_value(rec, r, pl->child[i], &f, depth + 1);
    if (rc) return rc;
  }
  for (size_t k = 0; k < pl->ndefaults; k++) {
    size_t fi = pl->defaults[k];
    avro_value_t f;
    if (avro_value_get_by_index(v, fi, &f, NULL))
      return rd_fail(r, LT_ERR_INTERNAL, "no such field");
    if (lt_avro_value_default(rec, rn->fields[fi].type, rn->fields[fi].def, &f))
      return rd_fail(r, LT_ERR_INTERNAL, "cannot apply default");
  }
  return LT_OK;
}

/* Reads one value as plan pl says into v. Primitives, enums and fixed are read here, in the one
 * switch, so that each costs a single dispatch. */
static lt_err_t decode_value(lt_avro_record_t *rec, lt_rd *r, const lt_plan *pl, avro_value_t *v,
                             int depth) {
  int64_t x;
  size_t len;
  if (depth > LT_AVRO_MAX_DEPTH) return rd_fail(r, LT_ERR_CORRUPT, "nesting too deep");
  switch (pl->op) {
    case P_NULL: avro_value_set_null(v); return LT_OK;
    case P_BOOL:
      if (rd_need(r, 1)) return r->rc;
      if (*r->p > 1) return rd_fail(r, LT_ERR_CORRUPT, "boolean byte is neither 0 nor 1");
      avro_value_set_boolean(v, *r->p++);
      return LT_OK;
    case P_INT:
      if (rd_long(r, &x)) return r->rc;
      if (x < INT32_MIN || x > INT32_MAX) return rd_fail(r, LT_ERR_CORRUPT, "int out of range");
      avro_value_set_int(v, (int32_t)x);
      return LT_OK;
    case P_LONG:
    case P_INT_LONG:
    case P_INT_FLOAT:
    case P_LONG_FLOAT:
    case P_INT_DOUBLE:
    case P_LONG_DOUBLE: /* a varint, stored as the reader's long, float or double */
      if (rd_long(r, &x)) return r->rc;
      if (pl->op == P_LONG || pl->op == P_INT_LONG) avro_value_set_long(v, x);
      else if (pl->op == P_INT_FLOAT || pl->op == P_LONG_FLOAT) avro_value_set_float(v, (float)x);
      else avro_value_set_double(v, (double)x);
      return LT_OK;
    case P_FLOAT:
    case P_FLOAT_DOUBLE: {
      float f;
      if (rd_float(r, &f)) return r->rc;
      if (pl->op == P_FLOAT) avro_value_set_float(v, f);
      else avro_value_set_double(v, f);
      return LT_OK;
    }
    case P_DOUBLE: {
      double d;
      if (rd_double(r, &d)) return r->rc;
      avro_value_set_double(v, d);
      return LT_OK;
    }
    case P_STRING:
    case P_BYTES_STRING:
      if (rd_len(r, &len)) return r->rc;
      if (lt_avro_value_string(rec, v, (const char *)r->p, len))
        return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += len;
      return LT_OK;
    case P_BYTES:
    case P_STRING_BYTES:
      if (rd_len(r, &len)) return r->rc;
      if (avro_value_set_bytes(v, (void *)r->p, len))
        return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += len;
      return LT_OK;
    case P_FIXED:
      if (rd_need(r, (size_t)pl->r->size)) return r->rc;
      if (avro_value_set_fixed(v, (void *)r->p, (size_t)pl->r->size))
        return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += pl->r->size;
      return LT_OK;
    case P_ENUM:
      if (rd_long(r, &x)) return r->rc;
      if (x < 0 || (uint64_t)x >= pl->w->nsymbols)
        return rd_fail(r, LT_ERR_CORRUPT, "enum index out of range");
      if (pl->idx[x] < 0)
        return rd_fail(r, LT_ERR_INVALID, "enum symbol unknown to the reader and no default");
      avro_value_set_enum(v, pl->idx[x]);
      return LT_OK;
    case P_WUNION:
      if (rd_long(r, &x)) return r->rc;
      if (x < 0 || (uint64_t)x >= pl->w->nbranches)
        return rd_fail(r, LT_ERR_CORRUPT, "union index out of range");
      if (!pl->child[x])
        return rd_fail(r, LT_ERR_INVALID, "writer's union branch has no match in the reader");
      return decode_value(rec, r, pl->child[x], v, depth + 1);
    case P_RUNION: {
      avro_value_t b;
      if (avro_value_set_branch(v, pl->rbranch, &b))
        return rd_fail(r, LT_ERR_NOMEM, "cannot select union branch");
      return decode_value(rec, r, pl->child[0], &b, depth + 1);
    }
    case P_ARRAY: return decode_array(rec, r, pl, v, depth);
    case P_MAP: return decode_entries(rec, r, pl, v, depth, true);
    case P_RECORD: return decode_record(rec, r, pl, v, depth);
    default: return rd_fail(r, LT_ERR_INTERNAL, "bad plan");
  }
}

static lt_err_t plan_for(lt_avro_record_t *rec, const lt_avro_schema_t *writer, lt_plan **out,
                         char *errstr, size_t errstr_size) {
  if (!rec->plans[writer->index]) {
    char msg[256] = "";
    lt_planner pl = {.all = &rec->plan_mem, .err = msg, .errsz = sizeof msg};
    lt_plan *p = plan_build(&pl, writer->root, rec->schema->root, 0, false);
    if (!p)
      return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "%s v%d cannot be read as v%d: %s",
                     writer->name, writer->version, rec->schema->version,
                     msg[0] ? msg : "out of memory");
    rec->plans[writer->index] = p;
  }
  *out = rec->plans[writer->index];
  return LT_OK;
}

lt_err_t lt_avro_record_decode_body(lt_avro_record_t *rec, const lt_avro_schema_t *writer,
                                    const void *body, size_t len, char *errstr,
                                    size_t errstr_size) {
  if (writer->reg != rec->reg || strcmp(writer->name, rec->schema->name) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "record is a %s v%d, expected a %s", writer->name, writer->version,
                   rec->schema->name);
  lt_plan *plan = NULL;
  lt_err_t rc = plan_for(rec, writer, &plan, errstr, errstr_size);
  if (rc) return rc;
  char msg[200] = "";
  lt_rd r = {.start = body, .p = body, .end = (const uint8_t *)body + len, .msg = msg,
             .msgsz = sizeof msg};
  rc = decode_value(rec, &r, plan, &rec->value, 0);
  if (!rc && r.p != r.end) {
    r.field = NULL;
    rc = rd_fail(&r, LT_ERR_CORRUPT, "trailing bytes after the record");
  }
  if (rc) {
    rec->writer_version = 0;
    return lt_errf(errstr, errstr_size, rc, "%s v%d: %s", writer->name, writer->version, msg);
  }
  rec->writer_version = writer->version;
  return LT_OK;
}

static lt_err_t lookup_writer(const lt_avro_registry_t *reg, const void *buf, size_t len,
                              const lt_avro_schema_t **writer, char *errstr, size_t errstr_size) {
  uint64_t fp;
  lt_err_t rc = lt_avro_peek(buf, len, &fp, errstr, errstr_size);
  if (rc) return rc;
  *writer = lt_avro_schema_by_fingerprint(reg, fp);
  if (!*writer) {
    char hex[17];
    lt_avro_fingerprint_hex(fp, hex);
    return lt_errf(errstr, errstr_size, LT_ERR_UNKNOWN_SCHEMA,
                   "unknown schema fingerprint %s: written with a schema this build does not "
                   "have (add its .avsc to schemas/ or upgrade)", hex);
  }
  return LT_OK;
}

lt_err_t lt_avro_record_decode(lt_avro_record_t *rec, const void *buf, size_t len, char *errstr,
                               size_t errstr_size) {
  const lt_avro_schema_t *writer;
  lt_err_t rc = lookup_writer(rec->reg, buf, len, &writer, errstr, errstr_size);
  if (rc) return rc;
  return lt_avro_record_decode_body(rec, writer, (const uint8_t *)buf + LT_AVRO_HEADER_SIZE,
                                    len - LT_AVRO_HEADER_SIZE, errstr, errstr_size);
}

/* ------------------------------------------------------------------------------------------ */
/* Decoder for mixed topics. */

struct lt_avro_decoder {
  const lt_avro_registry_t *reg;
  lt_avro_record_t **records; /* per record type, created on first use */
};

lt_err_t lt_avro_decoder_new(const lt_avro_registry_t *reg, lt_avro_decoder_t **out,
                             char *errstr, size_t errstr_size) {
  lt_avro_decoder_t *d = calloc(1, sizeof *d);
  if (!d || !(d->records = calloc(reg->ntypes ? reg->ntypes : 1, sizeof *d->records))) {
    free(d);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory creating a decoder");
  }
  d->reg = reg;
  *out = d;
  return LT_OK;
}

void lt_avro_decoder_destroy(lt_avro_decoder_t *d) {
  if (!d) return;
  for (size_t i = 0; i < d->reg->ntypes; i++) lt_avro_record_destroy(d->records[i]);
  free(d->records);
  free(d);
}

lt_err_t lt_avro_decode(lt_avro_decoder_t *d, const void *buf, size_t len, lt_avro_record_t **rec,
                        char *errstr, size_t errstr_size) {
  const lt_avro_schema_t *writer;
  lt_err_t rc = lookup_writer(d->reg, buf, len, &writer, errstr, errstr_size);
  if (rc) return rc;
  lt_avro_record_t **slot = &d->records[writer->type_index];
  if (!*slot) {
    rc = lt_avro_record_new_schema(d->reg, writer->latest, slot, errstr, errstr_size);
    if (rc) return rc;
  }
  rc = lt_avro_record_decode_body(*slot, writer, (const uint8_t *)buf + LT_AVRO_HEADER_SIZE,
                                  len - LT_AVRO_HEADER_SIZE, errstr, errstr_size);
  if (rc) return rc;
  *rec = *slot;
  return LT_OK;
}
