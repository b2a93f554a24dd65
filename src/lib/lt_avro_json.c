/* lt_avro_json: records as JSON and back, and schema defaults (JSON in the .avsc) applied to
 * values.
 *
 * The JSON form is an object of the record's fields (lt_avro.h, "JSON"). Conversion from JSON
 * walks the schema node tree beside the JSON value and names the field path in every message;
 * it serves the API's submissions and the CLI, never the bus's hot path. */
#include "lt_avro_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

/* ------------------------------------------------------------------------------------------ */
/* JSON to a value. */

/* Where a conversion from JSON is: the record (its scratch buffer), the field path so far (a
 * buffer the caller owns; the functions append ".field" / "[i]" and restore it) and where
 * messages go. */
typedef struct lt_jin {
  lt_avro_record_t *rec;
  char *path;
  size_t pathlen;
  char *err;
  size_t errsz;
} lt_jin;

/* Appends to c's path; returns its old length, to restore it with c->path[old] = '\0'. */
static size_t path_push(const lt_jin *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static size_t path_push(const lt_jin *c, const char *fmt, ...) {
  size_t old = strlen(c->path);
  if (old + 1 < c->pathlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->path + old, c->pathlen - old, fmt, ap);
    va_end(ap);
  }
  return old;
}

static const char *json_kind(const json_t *j) {
  switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
  }
}

static lt_err_t jfail(const lt_jin *c, const char *expected, const json_t *got) {
  return lt_errf(c->err, c->errsz, LT_ERR_INVALID, "field %s: expected %s, got %s",
                 c->path[0] ? c->path : "(record)", expected, got ? json_kind(got) : "nothing");
}

/* Bytes in Avro's JSON form: a string whose code points are 0..255. Decoded into rec's scratch
 * buffer; *len bytes. */
static lt_err_t json_bytes(lt_avro_record_t *rec, const json_t *j, size_t *len) {
  const unsigned char *s = (const unsigned char *)json_string_value(j);
  size_t n = json_string_length(j), o = 0;
  if (lt_avro_scratch(rec, n + 1)) return LT_ERR_NOMEM;
  for (size_t i = 0; i < n;) {
    unsigned c = s[i];
    if (c < 0x80) {
      rec->scratch[o++] = (char)c;
      i++;
    } else if ((c & 0xe0) == 0xc0 && i + 1 < n && c <= 0xc3) {
      rec->scratch[o++] = (char)(((c & 0x1f) << 6) | (s[i + 1] & 0x3f));
      i += 2;
    } else {
      return LT_ERR_INVALID;
    }
  }
  *len = o;
  return LT_OK;
}

static lt_err_t json_to_value(const lt_jin *c, const lt_node *n, const json_t *j, avro_value_t *v,
                              bool is_default);

/* A primitive or a fixed. */
static lt_err_t json_to_scalar(const lt_jin *c, const lt_node *n, const json_t *j,
                               avro_value_t *v) {
  switch (n->type) {
    case AVRO_NULL:
      if (!json_is_null(j)) return jfail(c, "null", j);
      avro_value_set_null(v);
      return LT_OK;
    case AVRO_BOOLEAN:
      if (!json_is_boolean(j)) return jfail(c, "true or false", j);
      avro_value_set_boolean(v, json_is_true(j));
      return LT_OK;
    case AVRO_INT32: {
      if (!json_is_integer(j)) return jfail(c, "an integer (int)", j);
      json_int_t x = json_integer_value(j);
      if (x < INT32_MIN || x > INT32_MAX)
        return lt_errf(c->err, c->errsz, LT_ERR_INVALID,
                       "field %s: %lld does not fit an int (32 bits)", c->path, (long long)x);
      avro_value_set_int(v, (int32_t)x);
      return LT_OK;
    }
    case AVRO_INT64:
      if (!json_is_integer(j)) return jfail(c, "an integer (long)", j);
      avro_value_set_long(v, json_integer_value(j));
      return LT_OK;
    case AVRO_FLOAT:
    case AVRO_DOUBLE:
      if (!json_is_number(j)) return jfail(c, "a number", j);
      if (n->type == AVRO_FLOAT) avro_value_set_float(v, (float)json_number_value(j));
      else avro_value_set_double(v, json_number_value(j));
      return LT_OK;
    case AVRO_STRING:
      if (!json_is_string(j)) return jfail(c, "a string", j);
      if (lt_avro_value_string(c->rec, v, json_string_value(j), json_string_length(j)))
        return LT_ERR_NOMEM;
      return LT_OK;
    case AVRO_BYTES:
    case AVRO_FIXED: {
      size_t len = 0;
      if (!json_is_string(j) || json_bytes(c->rec, j, &len))
        return jfail(c, "a string of code points 0-255 (Avro bytes)", j);
      if (n->type == AVRO_FIXED) {
        if (len != (size_t)n->size)
          return lt_errf(c->err, c->errsz, LT_ERR_INVALID,
                         "field %s: expected %" PRId64 " bytes, got %zu", c->path, n->size, len);
        return avro_value_set_fixed(v, c->rec->scratch, len) ? LT_ERR_NOMEM : LT_OK;
      }
      return avro_value_set_bytes(v, c->rec->scratch, len) ? LT_ERR_NOMEM : LT_OK;
    }
    default:
      return lt_errf(c->err, c->errsz, LT_ERR_UNSUPPORTED, "field %s: unsupported type", c->path);
  }
}

/* An enum: one of its symbols, as a string. */
static lt_err_t json_to_enum(const lt_jin *c, const lt_node *n, const json_t *j, avro_value_t *v) {
  const char *s = json_string_value(j);
  for (size_t i = 0; s && i < n->nsymbols; i++)
    if (strcmp(s, n->symbols[i]) == 0) {
      avro_value_set_enum(v, (int)i);
      return LT_OK;
    }
  lt_sb sb = {0};
  lt_avro_sb_puts(&sb, "one of ");
  lt_avro_sb_symbols(&sb, n);
  lt_err_t rc = s ? lt_errf(c->err, c->errsz, LT_ERR_INVALID, "field %s: expected %s, got \"%s\"",
                            c->path, sb.p ? sb.p : "", s)
                  : jfail(c, sb.p ? sb.p : "an enum symbol", j);
  free(sb.p);
  return rc;
}

/* An array (a JSON array) or a map (a JSON object): v is emptied and every item added. */
static lt_err_t json_to_items(const lt_jin *c, const lt_node *n, const json_t *j, avro_value_t *v,
                              bool is_default) {
  bool map = n->type == AVRO_MAP;
  if (map ? !json_is_object(j) : !json_is_array(j))
    return jfail(c, map ? "an object (map)" : "an array", j);
  avro_value_reset(v);
  const char *key;
  json_t *val;
  size_t i;
  if (map) {
    json_object_foreach((json_t *)j, key, val) {
      avro_value_t e;
      if (avro_value_add(v, key, &e, NULL, NULL)) return LT_ERR_NOMEM;
      size_t old = path_push(c, ".%s", key);
      lt_err_t rc = json_to_value(c, n->items, val, &e, is_default);
      c->path[old] = '\0';
      if (rc) return rc;
    }
    return LT_OK;
  }
  json_array_foreach(j, i, val) {
    avro_value_t e;
    if (avro_value_append(v, &e, NULL)) return LT_ERR_NOMEM;
    size_t old = path_push(c, "[%zu]", i);
    lt_err_t rc = json_to_value(c, n->items, val, &e, is_default);
    c->path[old] = '\0';
    if (rc) return rc;
  }
  return LT_OK;
}

/* A union: null (its null branch), the tagged form {"long": 5} / {"lathe.Foo": {...}}, or a
 * bare value of the first non-null branch that takes it. A default is of the first branch. */
static lt_err_t json_to_union(const lt_jin *c, const lt_node *n, const json_t *j, avro_value_t *v,
                              bool is_default) {
  avro_value_t b;
  if (is_default) {
    if (avro_value_set_branch(v, 0, &b)) return LT_ERR_NOMEM;
    return json_to_value(c, n->branches[0], j, &b, true);
  }
  if (json_is_null(j)) {
    for (size_t i = 0; i < n->nbranches; i++)
      if (n->branches[i]->type == AVRO_NULL) {
        avro_value_set_branch(v, (int)i, &b);
        return avro_value_set_null(&b) ? LT_ERR_INTERNAL : LT_OK;
      }
    return jfail(c, "a value (the field is not nullable)", j);
  }
  if (json_is_object(j) && json_object_size(j) == 1) {
    const char *tag = json_object_iter_key(json_object_iter((json_t *)j));
    for (size_t i = 0; i < n->nbranches; i++) {
      const lt_node *bn = n->branches[i];
      const char *bname = bn->fullname ? bn->fullname : lt_avro_type_word(bn);
      if (strcmp(tag, bname) == 0 || (bn->name && strcmp(tag, bn->name) == 0)) {
        if (avro_value_set_branch(v, (int)i, &b)) return LT_ERR_NOMEM;
        return json_to_value(c, bn, json_object_get(j, tag), &b, false);
      }
    }
  }
  lt_err_t rc = LT_ERR_INVALID;
  for (size_t i = 0; i < n->nbranches; i++) {
    if (n->branches[i]->type == AVRO_NULL) continue;
    if (avro_value_set_branch(v, (int)i, &b)) return LT_ERR_NOMEM;
    rc = json_to_value(c, n->branches[i], j, &b, false);
    if (!rc) return LT_OK;
  }
  return rc;
}

/* A record: an object with no unknown field, and every field given or defaulted. */
static lt_err_t json_to_record(const lt_jin *c, const lt_node *n, const json_t *j,
                               avro_value_t *v, bool is_default) {
  if (!json_is_object(j)) return jfail(c, "an object", j);
  const char *key;
  json_t *val;
  json_object_foreach((json_t *)j, key, val) {
    size_t i;
    for (i = 0; i < n->nfields; i++)
      if (strcmp(n->fields[i].name, key) == 0) break;
    if (i == n->nfields)
      return lt_errf(c->err, c->errsz, LT_ERR_INVALID, "field %s%s%s: %s has no such field",
                     c->path, c->path[0] ? "." : "", key, n->name);
  }
  for (size_t i = 0; i < n->nfields; i++) {
    const lt_nfield *f = &n->fields[i];
    avro_value_t fv;
    if (avro_value_get_by_index(v, i, &fv, NULL)) return LT_ERR_INTERNAL;
    size_t old = path_push(c, "%s%s", c->path[0] ? "." : "", f->name);
    json_t *fj = json_object_get(j, f->name);
    lt_err_t rc;
    if (fj) rc = json_to_value(c, f->type, fj, &fv, is_default);
    else if (f->def) rc = json_to_value(c, f->type, f->def, &fv, true);
    else rc = lt_errf(c->err, c->errsz, LT_ERR_INVALID, "field %s: missing (%s, no default)",
                      c->path, lt_avro_type_word(f->type));
    c->path[old] = '\0';
    if (rc) return rc;
  }
  return LT_OK;
}

/* Sets v (of node n) from JSON j. is_default: j is a schema default (a union's is of its first
 * branch). */
static lt_err_t json_to_value(const lt_jin *c, const lt_node *n, const json_t *j, avro_value_t *v,
                              bool is_default) {
  switch (n->type) {
    case AVRO_ENUM: return json_to_enum(c, n, j, v);
    case AVRO_ARRAY:
    case AVRO_MAP: return json_to_items(c, n, j, v, is_default);
    case AVRO_UNION: return json_to_union(c, n, j, v, is_default);
    case AVRO_RECORD: return json_to_record(c, n, j, v, is_default);
    default: return json_to_scalar(c, n, j, v);
  }
}

lt_err_t lt_avro_value_default(lt_avro_record_t *rec, const lt_node *n, const json_t *def,
                               avro_value_t *v) {
  char path[8] = "";
  lt_jin c = {.rec = rec, .path = path, .pathlen = sizeof path, .err = rec->err,
              .errsz = sizeof rec->err};
  return json_to_value(&c, n, def, v, true);
}

lt_err_t lt_avro_record_from_jansson(lt_avro_record_t *rec, const json_t *obj, char *errstr,
                                     size_t errstr_size) {
  char path[256] = "";
  lt_jin c = {.rec = rec, .path = path, .pathlen = sizeof path, .err = errstr,
              .errsz = errstr_size};
  rec->writer_version = 0;
  lt_err_t rc = json_to_value(&c, rec->schema->root, obj, &rec->value, false);
  if (rc && errstr && errstr_size) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s: %s", rec->schema->name, errstr);
    snprintf(errstr, errstr_size, "%s", tmp);
  }
  return rc;
}

lt_err_t lt_avro_record_from_json(lt_avro_record_t *rec, const char *text, size_t len,
                                  char *errstr, size_t errstr_size) {
  json_error_t jerr;
  json_t *j = json_loadb(text, len, JSON_ALLOW_NUL, &jerr); /* bytes may hold \u0000 */
  if (!j)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "JSON line %d column %d: %s", jerr.line,
                   jerr.column, jerr.text);
  lt_err_t rc = lt_avro_record_from_jansson(rec, j, errstr, errstr_size);
  json_decref(j);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* A value to JSON. */

/* Bytes in Avro's JSON form: each byte is the code point of the same value (UTF-8 encoded). */
static json_t *bytes_to_json(const void *p, size_t size) {
  char *u = malloc(size * 2 + 1);
  if (!u) return NULL;
  size_t o = 0;
  for (size_t i = 0; i < size; i++) {
    unsigned c = ((const unsigned char *)p)[i];
    if (c < 0x80) u[o++] = (char)c;
    else {
      u[o++] = (char)(0xc0 | (c >> 6));
      u[o++] = (char)(0x80 | (c & 0x3f));
    }
  }
  json_t *s = json_stringn(u, o);
  free(u);
  return s;
}

/* JSON of v (of node n); NULL when a value is missing or out of memory. */
static json_t *value_to_json(const lt_node *n, avro_value_t *v) {
  switch (n->type) {
    case AVRO_NULL: return json_null();
    case AVRO_BOOLEAN: { int b = 0; avro_value_get_boolean(v, &b); return json_boolean(b); }
    case AVRO_INT32: { int32_t x = 0; avro_value_get_int(v, &x); return json_integer(x); }
    case AVRO_INT64: { int64_t x = 0; avro_value_get_long(v, &x); return json_integer(x); }
    case AVRO_FLOAT: { float f = 0; avro_value_get_float(v, &f); return json_real(f); }
    case AVRO_DOUBLE: { double d = 0; avro_value_get_double(v, &d); return json_real(d); }
    case AVRO_STRING: {
      const char *s = NULL;
      size_t size = 0;
      avro_value_get_string(v, &s, &size);
      return json_stringn(s ? s : "", size ? size - 1 : 0);
    }
    case AVRO_BYTES:
    case AVRO_FIXED: {
      const void *p = NULL;
      size_t size = 0;
      if (n->type == AVRO_BYTES) avro_value_get_bytes(v, &p, &size);
      else avro_value_get_fixed(v, &p, &size);
      return bytes_to_json(p, size);
    }
    case AVRO_ENUM: {
      int e = 0;
      avro_value_get_enum(v, &e);
      return (e >= 0 && (size_t)e < n->nsymbols) ? json_string(n->symbols[e]) : NULL;
    }
    case AVRO_UNION: {
      int d = -1;
      avro_value_t b;
      if (avro_value_get_discriminant(v, &d) || d < 0 || avro_value_get_current_branch(v, &b))
        return NULL;
      return value_to_json(n->branches[d], &b);
    }
    case AVRO_ARRAY:
    case AVRO_MAP: {
      size_t count = 0;
      avro_value_get_size(v, &count);
      json_t *out = n->type == AVRO_ARRAY ? json_array() : json_object();
      for (size_t i = 0; out && i < count; i++) {
        avro_value_t e;
        const char *key = NULL;
        avro_value_get_by_index(v, i, &e, n->type == AVRO_MAP ? &key : NULL);
        json_t *c = value_to_json(n->items, &e);
        if (!c || (n->type == AVRO_ARRAY ? json_array_append_new(out, c)
                                         : json_object_set_new(out, key, c))) {
          json_decref(out);
          return NULL;
        }
      }
      return out;
    }
    case AVRO_RECORD: {
      json_t *out = json_object();
      for (size_t i = 0; out && i < n->nfields; i++) {
        avro_value_t f;
        avro_value_get_by_index(v, i, &f, NULL);
        json_t *c = value_to_json(n->fields[i].type, &f);
        if (!c || json_object_set_new(out, n->fields[i].name, c)) {
          json_decref(out);
          return NULL;
        }
      }
      return out;
    }
    default: return NULL;
  }
}

lt_err_t lt_avro_record_to_jansson(lt_avro_record_t *rec, json_t **out, char *errstr,
                                   size_t errstr_size) {
  json_t *j = value_to_json(rec->schema->root, &rec->value);
  if (!j)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "%s: a field has no value (or out of memory)", rec->schema->name);
  *out = j;
  return LT_OK;
}

lt_err_t lt_avro_record_to_json(lt_avro_record_t *rec, char **out, char *errstr,
                                size_t errstr_size) {
  json_t *j = NULL;
  lt_err_t rc = lt_avro_record_to_jansson(rec, &j, errstr, errstr_size);
  if (rc) return rc;
  *out = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
  json_decref(j);
  return *out ? LT_OK : lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
}
