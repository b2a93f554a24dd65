/* lt_avro: schema registry, Parsing Canonical Form, CRC-64-AVRO, single-object encoding,
 * resolution of old writer versions, typed field access and JSON conversion.
 *
 * Each embedded .avsc is parsed twice: by avro-c (avro_schema_from_json_length, whose generic
 * value class holds record values) and into our own small node tree (lt_node), which keeps what
 * avro-c drops — field defaults, enum defaults, full names — and drives the canonical form, the
 * encoder, the decoder and JSON conversion. The binary encoder and decoder follow the Avro
 * specification directly over avro-c's value API; decoding goes through a resolution plan
 * (lt_plan) from the writer version to the record's (reader) version, built once per pair. */
#include "lt_avro.h"
#include "lt_time.h"

#include <avro.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define LT_AVRO_MAX_DEPTH 32 /* nesting limit of schemas (also refuses recursive ones) */

/* ------------------------------------------------------------------------------------------ */
/* Small growable string buffer (registry building and JSON only; never on the hot path). */

typedef struct lt_sb {
  char *p;
  size_t len, cap;
  bool oom;
} lt_sb;

static void sb_add(lt_sb *sb, const char *s, size_t n) {
  if (sb->oom) return;
  if (sb->len + n + 1 > sb->cap) {
    size_t cap = sb->cap ? sb->cap : 256;
    while (cap < sb->len + n + 1) cap *= 2;
    char *p = realloc(sb->p, cap);
    if (!p) {
      sb->oom = true;
      return;
    }
    sb->p = p;
    sb->cap = cap;
  }
  memcpy(sb->p + sb->len, s, n);
  sb->len += n;
  sb->p[sb->len] = '\0';
}
static void sb_puts(lt_sb *sb, const char *s) { sb_add(sb, s, strlen(s)); }
static void sb_str(lt_sb *sb, const char *s) { /* a JSON string; names need no escapes */
  sb_add(sb, "\"", 1);
  sb_puts(sb, s);
  sb_add(sb, "\"", 1);
}

/* ------------------------------------------------------------------------------------------ */
/* Schema node tree. */

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
  int64_t size; /* fixed */
  unsigned emitted; /* canonical-form pass that already wrote this named type in full */
  lt_node *next;    /* allocation list */
};

typedef struct lt_parse {
  lt_node *all;   /* every node, for freeing */
  lt_node **named;
  size_t nnamed, capnamed;
  char *err;
  size_t errsz;
  lt_err_t rc;
} lt_parse;

static const struct {
  const char *name;
  avro_type_t type;
} lt_primitives[] = {
    {"null", AVRO_NULL},     {"boolean", AVRO_BOOLEAN}, {"int", AVRO_INT32},
    {"long", AVRO_INT64},    {"float", AVRO_FLOAT},     {"double", AVRO_DOUBLE},
    {"bytes", AVRO_BYTES},   {"string", AVRO_STRING},
};

static const char *prim_name(avro_type_t t) {
  for (size_t i = 0; i < sizeof lt_primitives / sizeof lt_primitives[0]; i++)
    if (lt_primitives[i].type == t) return lt_primitives[i].name;
  return NULL;
}

static int prim_type(const char *name) {
  for (size_t i = 0; i < sizeof lt_primitives / sizeof lt_primitives[0]; i++)
    if (strcmp(lt_primitives[i].name, name) == 0) return (int)lt_primitives[i].type;
  return -1;
}

static const char *type_word(const lt_node *n) {
  switch (n->type) {
    case AVRO_RECORD: return "record";
    case AVRO_ENUM: return "enum";
    case AVRO_ARRAY: return "array";
    case AVRO_MAP: return "map";
    case AVRO_UNION: return "union";
    case AVRO_FIXED: return "fixed";
    default: return prim_name(n->type) ? prim_name(n->type) : "?";
  }
}

static void nodes_free(lt_node *n) {
  while (n) {
    lt_node *next = n->next;
    free(n->fullname);
    for (size_t i = 0; i < n->nfields; i++) free(n->fields[i].name);
    free(n->fields);
    for (size_t i = 0; i < n->nsymbols; i++) free(n->symbols[i]);
    free(n->symbols);
    free(n->branches);
    free(n);
    n = next;
  }
}

static lt_node *node_new(lt_parse *ps, avro_type_t t) {
  lt_node *n = calloc(1, sizeof *n);
  if (!n) {
    ps->rc = lt_errf(ps->err, ps->errsz, LT_ERR_NOMEM, "out of memory parsing a schema");
    return NULL;
  }
  n->type = t;
  n->enum_default = -1;
  n->next = ps->all;
  ps->all = n;
  return n;
}

static bool valid_name(const char *s) {
  if (!s || !*s) return false;
  if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return false;
  for (s++; *s; s++)
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') ||
          *s == '_'))
      return false;
  return true;
}

static lt_node *parse_fail(lt_parse *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static lt_node *parse_fail(lt_parse *ps, const char *fmt, ...) {
  if (ps->err && ps->errsz) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->err, ps->errsz, fmt, ap);
    va_end(ap);
  }
  ps->rc = LT_ERR_INVALID;
  return NULL;
}

/* Full name of a named schema: "a.b.C" as given, or namespace + "." + name. */
static char *make_fullname(const char *name, const char *ns) {
  size_t nl = strlen(name);
  if (strchr(name, '.') || !ns || !*ns) return strdup(name);
  size_t sl = strlen(ns);
  char *f = malloc(sl + 1 + nl + 1);
  if (!f) return NULL;
  memcpy(f, ns, sl);
  f[sl] = '.';
  memcpy(f + sl + 1, name, nl + 1);
  return f;
}

static lt_node *lookup_named(lt_parse *ps, const char *name, const char *ns) {
  char *full = make_fullname(name, ns);
  if (!full) return NULL;
  lt_node *hit = NULL;
  for (size_t i = 0; i < ps->nnamed && !hit; i++)
    if (strcmp(ps->named[i]->fullname, full) == 0) hit = ps->named[i];
  for (size_t i = 0; i < ps->nnamed && !hit; i++) /* a name in the null namespace */
    if (strcmp(ps->named[i]->fullname, name) == 0) hit = ps->named[i];
  free(full);
  return hit;
}

static lt_node *parse_node(lt_parse *ps, json_t *j, const char *ns, const char *where, int depth);

static bool register_named(lt_parse *ps, lt_node *n, json_t *j, const char *ns, const char *where) {
  const char *name = json_string_value(json_object_get(j, "name"));
  if (!name) return parse_fail(ps, "%s: a %s needs a \"name\"", where, type_word(n)), false;
  const char *own_ns = json_string_value(json_object_get(j, "namespace"));
  n->fullname = make_fullname(name, own_ns ? own_ns : ns);
  if (!n->fullname) return parse_fail(ps, "out of memory"), false;
  const char *dot = strrchr(n->fullname, '.');
  n->name = dot ? dot + 1 : n->fullname;
  if (!valid_name(n->name)) return parse_fail(ps, "%s: invalid name \"%s\"", where, name), false;
  for (size_t i = 0; i < ps->nnamed; i++)
    if (strcmp(ps->named[i]->fullname, n->fullname) == 0)
      return parse_fail(ps, "%s: type %s defined twice", where, n->fullname), false;
  if (ps->nnamed == ps->capnamed) {
    size_t cap = ps->capnamed ? ps->capnamed * 2 : 16;
    lt_node **p = realloc(ps->named, cap * sizeof *p);
    if (!p) return parse_fail(ps, "out of memory"), false;
    ps->named = p;
    ps->capnamed = cap;
  }
  ps->named[ps->nnamed++] = n;
  return true;
}

static lt_node *parse_node(lt_parse *ps, json_t *j, const char *ns, const char *where, int depth) {
  if (depth > LT_AVRO_MAX_DEPTH) return parse_fail(ps, "%s: schema nested too deeply", where);
  if (json_is_string(j)) {
    const char *s = json_string_value(j);
    int pt = prim_type(s);
    if (pt >= 0) return node_new(ps, (avro_type_t)pt);
    lt_node *n = lookup_named(ps, s, ns);
    if (!n) return parse_fail(ps, "%s: unknown type \"%s\"", where, s);
    return n;
  }
  if (json_is_array(j)) {
    lt_node *n = node_new(ps, AVRO_UNION);
    if (!n) return NULL;
    n->nbranches = json_array_size(j);
    if (n->nbranches == 0) return parse_fail(ps, "%s: empty union", where);
    n->branches = calloc(n->nbranches, sizeof *n->branches);
    if (!n->branches) return parse_fail(ps, "out of memory");
    for (size_t i = 0; i < n->nbranches; i++) {
      n->branches[i] = parse_node(ps, json_array_get(j, i), ns, where, depth + 1);
      if (!n->branches[i]) return NULL;
      if (n->branches[i]->type == AVRO_UNION)
        return parse_fail(ps, "%s: a union may not hold a union", where);
    }
    return n;
  }
  if (!json_is_object(j)) return parse_fail(ps, "%s: a schema is a string, array or object", where);
  json_t *tj = json_object_get(j, "type");
  if (json_is_object(tj) || json_is_array(tj)) return parse_node(ps, tj, ns, where, depth + 1);
  const char *t = json_string_value(tj);
  if (!t) return parse_fail(ps, "%s: missing \"type\"", where);
  int pt = prim_type(t);
  if (pt >= 0) return node_new(ps, (avro_type_t)pt); /* logicalType and the like are ignored */
  lt_node *n;
  if (strcmp(t, "record") == 0 || strcmp(t, "error") == 0) {
    n = node_new(ps, AVRO_RECORD);
    if (!n || !register_named(ps, n, j, ns, where)) return NULL;
    /* Nested types take the record's namespace. */
    char *inner_ns = strdup(n->fullname);
    if (!inner_ns) return parse_fail(ps, "out of memory");
    char *dot = strrchr(inner_ns, '.');
    if (dot) *dot = '\0';
    else inner_ns[0] = '\0';
    json_t *fj = json_object_get(j, "fields");
    if (!json_is_array(fj)) {
      free(inner_ns);
      return parse_fail(ps, "%s: record %s needs a \"fields\" array", where, n->fullname);
    }
    n->nfields = json_array_size(fj);
    n->fields = calloc(n->nfields ? n->nfields : 1, sizeof *n->fields);
    if (!n->fields) {
      free(inner_ns);
      return parse_fail(ps, "out of memory");
    }
    for (size_t i = 0; i < n->nfields; i++) {
      json_t *f = json_array_get(fj, i);
      const char *fname = json_string_value(json_object_get(f, "name"));
      if (!valid_name(fname)) {
        free(inner_ns);
        return parse_fail(ps, "%s: field %zu of %s has an invalid name", where, i, n->fullname);
      }
      for (size_t k = 0; k < i; k++)
        if (strcmp(n->fields[k].name, fname) == 0) {
          free(inner_ns);
          return parse_fail(ps, "%s: field %s appears twice in %s", where, fname, n->fullname);
        }
      n->fields[i].name = strdup(fname);
      char fwhere[256];
      snprintf(fwhere, sizeof fwhere, "%s.%s", n->name, fname);
      n->fields[i].type = parse_node(ps, json_object_get(f, "type"), inner_ns, fwhere, depth + 1);
      n->fields[i].def = json_object_get(f, "default");
      if (!n->fields[i].name || !n->fields[i].type) {
        free(inner_ns);
        return ps->rc ? NULL : parse_fail(ps, "out of memory");
      }
    }
    free(inner_ns);
    return n;
  }
  if (strcmp(t, "enum") == 0) {
    n = node_new(ps, AVRO_ENUM);
    if (!n || !register_named(ps, n, j, ns, where)) return NULL;
    json_t *sj = json_object_get(j, "symbols");
    if (!json_is_array(sj) || json_array_size(sj) == 0)
      return parse_fail(ps, "%s: enum %s needs symbols", where, n->fullname);
    n->nsymbols = json_array_size(sj);
    n->symbols = calloc(n->nsymbols, sizeof *n->symbols);
    if (!n->symbols) return parse_fail(ps, "out of memory");
    for (size_t i = 0; i < n->nsymbols; i++) {
      const char *s = json_string_value(json_array_get(sj, i));
      if (!valid_name(s)) return parse_fail(ps, "%s: enum %s has an invalid symbol", where, n->fullname);
      n->symbols[i] = strdup(s);
      if (!n->symbols[i]) return parse_fail(ps, "out of memory");
    }
    const char *d = json_string_value(json_object_get(j, "default"));
    if (d) {
      for (size_t i = 0; i < n->nsymbols; i++)
        if (strcmp(n->symbols[i], d) == 0) n->enum_default = (int)i;
      if (n->enum_default < 0)
        return parse_fail(ps, "%s: enum default \"%s\" is not a symbol", where, d);
    }
    return n;
  }
  if (strcmp(t, "fixed") == 0) {
    n = node_new(ps, AVRO_FIXED);
    if (!n || !register_named(ps, n, j, ns, where)) return NULL;
    json_t *sz = json_object_get(j, "size");
    if (!json_is_integer(sz) || json_integer_value(sz) < 0)
      return parse_fail(ps, "%s: fixed %s needs a size", where, n->fullname);
    n->size = json_integer_value(sz);
    return n;
  }
  if (strcmp(t, "array") == 0 || strcmp(t, "map") == 0) {
    bool arr = t[0] == 'a';
    n = node_new(ps, arr ? AVRO_ARRAY : AVRO_MAP);
    if (!n) return NULL;
    json_t *ij = json_object_get(j, arr ? "items" : "values");
    if (!ij) return parse_fail(ps, "%s: %s needs \"%s\"", where, t, arr ? "items" : "values");
    n->items = parse_node(ps, ij, ns, where, depth + 1);
    return n->items ? n : NULL;
  }
  /* A bare name used as {"type": "lathe.Foo"}. */
  n = lookup_named(ps, t, ns);
  if (!n) return parse_fail(ps, "%s: unknown type \"%s\"", where, t);
  return n;
}

/* Parsing Canonical Form (Avro specification, "Transforming into Parsing Canonical Form"). */
static void canon_emit(lt_sb *sb, lt_node *n, unsigned pass) {
  switch (n->type) {
    case AVRO_RECORD:
    case AVRO_ENUM:
    case AVRO_FIXED:
      if (n->emitted == pass) {
        sb_str(sb, n->fullname);
        return;
      }
      n->emitted = pass;
      sb_puts(sb, "{\"name\":");
      sb_str(sb, n->fullname);
      if (n->type == AVRO_RECORD) {
        sb_puts(sb, ",\"type\":\"record\",\"fields\":[");
        for (size_t i = 0; i < n->nfields; i++) {
          if (i) sb_puts(sb, ",");
          sb_puts(sb, "{\"name\":");
          sb_str(sb, n->fields[i].name);
          sb_puts(sb, ",\"type\":");
          canon_emit(sb, n->fields[i].type, pass);
          sb_puts(sb, "}");
        }
        sb_puts(sb, "]}");
      } else if (n->type == AVRO_ENUM) {
        sb_puts(sb, ",\"type\":\"enum\",\"symbols\":[");
        for (size_t i = 0; i < n->nsymbols; i++) {
          if (i) sb_puts(sb, ",");
          sb_str(sb, n->symbols[i]);
        }
        sb_puts(sb, "]}");
      } else {
        char num[32];
        snprintf(num, sizeof num, "%" PRId64, n->size);
        sb_puts(sb, ",\"type\":\"fixed\",\"size\":");
        sb_puts(sb, num);
        sb_puts(sb, "}");
      }
      return;
    case AVRO_ARRAY:
    case AVRO_MAP:
      sb_puts(sb, n->type == AVRO_ARRAY ? "{\"type\":\"array\",\"items\":" : "{\"type\":\"map\",\"values\":");
      canon_emit(sb, n->items, pass);
      sb_puts(sb, "}");
      return;
    case AVRO_UNION:
      sb_puts(sb, "[");
      for (size_t i = 0; i < n->nbranches; i++) {
        if (i) sb_puts(sb, ",");
        canon_emit(sb, n->branches[i], pass);
      }
      sb_puts(sb, "]");
      return;
    default:
      sb_str(sb, prim_name(n->type));
  }
}

uint64_t lt_avro_crc64(const void *data, size_t len) {
  const uint64_t empty = UINT64_C(0xc15d213aa4d7a795);
  const uint8_t *p = data;
  uint64_t fp = empty;
  for (size_t i = 0; i < len; i++) {
    uint64_t x = (fp ^ p[i]) & 0xff;
    for (int k = 0; k < 8; k++) x = (x >> 1) ^ (empty & (0 - (x & 1)));
    fp = (fp >> 8) ^ x;
  }
  return fp;
}

/* Parses JSON text into a node tree; on success *root and *all are set (free with nodes_free). */
static lt_err_t parse_schema_text(const char *text, size_t len, json_t **tree, lt_node **root,
                                  lt_node **all, char *errstr, size_t errstr_size) {
  json_error_t jerr;
  json_t *j = json_loadb(text, len, JSON_DECODE_ANY, &jerr);
  if (!j)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema line %d column %d: %s", jerr.line,
                   jerr.column, jerr.text);
  lt_parse ps = {.err = errstr, .errsz = errstr_size};
  lt_node *n = parse_node(&ps, j, "", "schema", 0);
  free(ps.named);
  if (!n) {
    nodes_free(ps.all);
    json_decref(j);
    return ps.rc ? ps.rc : LT_ERR_INVALID;
  }
  *tree = j;
  *root = n;
  *all = ps.all;
  return LT_OK;
}

lt_err_t lt_avro_canonical_form(const char *json, size_t json_len, char **out, size_t *out_len,
                                char *errstr, size_t errstr_size) {
  json_t *tree;
  lt_node *root, *all;
  lt_err_t rc = parse_schema_text(json, json_len, &tree, &root, &all, errstr, errstr_size);
  if (rc) return rc;
  lt_sb sb = {0};
  canon_emit(&sb, root, 1);
  nodes_free(all);
  json_decref(tree);
  if (sb.oom || !sb.p) {
    free(sb.p);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  }
  *out = sb.p;
  if (out_len) *out_len = sb.len;
  return LT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Registry. */

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

static int cmp_embedded(const void *a, const void *b) {
  const lt_avro_embedded_t *x = *(const lt_avro_embedded_t *const *)a;
  const lt_avro_embedded_t *y = *(const lt_avro_embedded_t *const *)b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->version > y->version) - (x->version < y->version);
}

void lt_avro_registry_destroy(lt_avro_registry_t *reg) {
  if (!reg) return;
  for (size_t i = 0; i < reg->n; i++) {
    lt_avro_schema_t *s = &reg->schemas[i];
    if (s->iface) avro_value_iface_decref(s->iface);
    if (s->avro) avro_schema_decref(s->avro);
    nodes_free(s->nodes);
    json_decref(s->tree);
    free(s->canonical);
  }
  free(reg->schemas);
  free(reg);
}

lt_err_t lt_avro_registry_new_from(const lt_avro_embedded_t *schemas, size_t count,
                                   lt_avro_registry_t **out, char *errstr, size_t errstr_size) {
  lt_err_t rc = LT_OK;
  lt_avro_registry_t *reg = calloc(1, sizeof *reg);
  const lt_avro_embedded_t **sorted = calloc(count ? count : 1, sizeof *sorted);
  if (!reg || !sorted || !(reg->schemas = calloc(count ? count : 1, sizeof *reg->schemas))) {
    rc = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory building the schema registry");
    goto err;
  }
  for (size_t i = 0; i < count; i++) sorted[i] = &schemas[i];
  qsort(sorted, count, sizeof *sorted, cmp_embedded);
  for (size_t i = 0; i < count; i++) {
    const lt_avro_embedded_t *e = sorted[i];
    lt_avro_schema_t *s = &reg->schemas[i];
    reg->n = i + 1;
    s->reg = reg;
    s->index = i;
    s->name = e->name;
    s->version = e->version;
    s->json = e->json;
    s->json_len = e->json_len;
    char sub[256];
    rc = parse_schema_text(e->json, e->json_len, &s->tree, &s->root, &s->nodes, sub, sizeof sub);
    if (rc) {
      rc = lt_errf(errstr, errstr_size, rc, "schema %s v%d: %s", e->name, e->version, sub);
      goto err;
    }
    if (s->root->type != AVRO_RECORD || strcmp(s->root->name, e->name) != 0) {
      rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "schema %s v%d: top level must be record %s", e->name, e->version, e->name);
      goto err;
    }
    if (i > 0 && strcmp(sorted[i - 1]->name, e->name) == 0 && sorted[i - 1]->version == e->version) {
      rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema %s v%d is given twice", e->name,
                   e->version);
      goto err;
    }
    lt_sb sb = {0};
    canon_emit(&sb, s->root, 1);
    if (sb.oom) {
      free(sb.p);
      rc = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
      goto err;
    }
    s->canonical = sb.p;
    s->canonical_len = sb.len;
    s->fingerprint = lt_avro_crc64(sb.p, sb.len);
    for (size_t k = 0; k < i; k++)
      if (reg->schemas[k].fingerprint == s->fingerprint) {
        rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "schemas %s v%d and %s v%d have the same fingerprint (identical canonical form)",
                     reg->schemas[k].name, reg->schemas[k].version, s->name, s->version);
        goto err;
      }
    if (avro_schema_from_json_length(e->json, e->json_len, &s->avro) != 0) {
      rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema %s v%d: avro-c: %s", e->name,
                   e->version, avro_strerror());
      goto err;
    }
    s->iface = avro_generic_class_from_schema(s->avro);
    if (!s->iface) {
      rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema %s v%d: avro-c: %s", e->name,
                   e->version, avro_strerror());
      goto err;
    }
  }
  /* Newest version of each name; versions are sorted within a name. */
  for (size_t i = 0; i < reg->n; i++) {
    size_t last = i;
    while (last + 1 < reg->n && strcmp(reg->schemas[last + 1].name, reg->schemas[i].name) == 0) last++;
    for (size_t k = i; k <= last; k++) {
      reg->schemas[k].latest = &reg->schemas[last];
      reg->schemas[k].type_index = reg->ntypes;
    }
    reg->ntypes++;
    i = last;
  }
  free(sorted);
  *out = reg;
  return LT_OK;
err:
  free(sorted);
  lt_avro_registry_destroy(reg);
  return rc;
}

lt_err_t lt_avro_registry_new(lt_avro_registry_t **out, char *errstr, size_t errstr_size) {
  return lt_avro_registry_new_from(lt_avro_embedded_schemas, lt_avro_embedded_count, out, errstr,
                                   errstr_size);
}

size_t lt_avro_registry_count(const lt_avro_registry_t *reg) { return reg->n; }
const lt_avro_schema_t *lt_avro_registry_at(const lt_avro_registry_t *reg, size_t i) {
  return i < reg->n ? &reg->schemas[i] : NULL;
}

static const char *short_name(const char *name) {
  if (strncmp(name, "lathe.", 6) == 0) return name + 6;
  return name;
}

const lt_avro_schema_t *lt_avro_schema_find(const lt_avro_registry_t *reg, const char *name,
                                            int version) {
  name = short_name(name);
  for (size_t i = 0; i < reg->n; i++)
    if (reg->schemas[i].version == version && strcmp(reg->schemas[i].name, name) == 0)
      return &reg->schemas[i];
  return NULL;
}

const lt_avro_schema_t *lt_avro_schema_latest(const lt_avro_registry_t *reg, const char *name) {
  name = short_name(name);
  for (size_t i = 0; i < reg->n; i++)
    if (strcmp(reg->schemas[i].name, name) == 0) return reg->schemas[i].latest;
  return NULL;
}

const lt_avro_schema_t *lt_avro_schema_by_fingerprint(const lt_avro_registry_t *reg, uint64_t fp) {
  for (size_t i = 0; i < reg->n; i++)
    if (reg->schemas[i].fingerprint == fp) return &reg->schemas[i];
  return NULL;
}

const char *lt_avro_schema_name(const lt_avro_schema_t *s) { return s->name; }
int lt_avro_schema_version(const lt_avro_schema_t *s) { return s->version; }
bool lt_avro_schema_is_latest(const lt_avro_schema_t *s) { return s->latest == s; }
uint64_t lt_avro_schema_fingerprint(const lt_avro_schema_t *s) { return s->fingerprint; }
const char *lt_avro_schema_canonical(const lt_avro_schema_t *s, size_t *len) {
  if (len) *len = s->canonical_len;
  return s->canonical;
}
const char *lt_avro_schema_json(const lt_avro_schema_t *s, size_t *len) {
  if (len) *len = s->json_len;
  return s->json;
}

void lt_avro_fingerprint_hex(uint64_t fp, char out[17]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < 8; i++) {
    uint8_t b = (uint8_t)(fp >> (8 * i));
    out[2 * i] = hex[b >> 4];
    out[2 * i + 1] = hex[b & 15];
  }
  out[16] = '\0';
}

lt_err_t lt_avro_peek(const void *buf, size_t len, uint64_t *fingerprint, char *errstr,
                      size_t errstr_size) {
  const uint8_t *p = buf;
  if (len < LT_AVRO_HEADER_SIZE)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "not an Avro single-object message: %zu bytes, the header alone is %d", len,
                   LT_AVRO_HEADER_SIZE);
  if (p[0] != 0xC3 || p[1] != 0x01)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT,
                   "not an Avro single-object message: magic is %02x %02x, expected c3 01", p[0],
                   p[1]);
  uint64_t fp = 0;
  for (int i = 0; i < 8; i++) fp |= (uint64_t)p[2 + i] << (8 * i);
  *fingerprint = fp;
  return LT_OK;
}

void lt_avro_uuid(char out[37]) {
  uint8_t b[16];
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t r = getrandom(b + got, sizeof b - got, 0);
    if (r > 0) got += (size_t)r;
    else if (r < 0 && errno != EINTR) break;
  }
  if (got < sizeof b) { /* no entropy source: still unique enough within a process */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uint64_t)(uintptr_t)out;
    for (size_t i = got; i < sizeof b; i++) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      b[i] = (uint8_t)(x >> 56);
    }
  }
  b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
  b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
  static const char hex[] = "0123456789abcdef";
  size_t o = 0;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
    out[o++] = hex[b[i] >> 4];
    out[o++] = hex[b[i] & 15];
  }
  out[o] = '\0';
}

/* ------------------------------------------------------------------------------------------ */
/* Resolution plans: how to read data of writer node w into a value of reader node r. */

enum {
  P_NULL, P_BOOL, P_INT, P_LONG, P_FLOAT, P_DOUBLE, P_STRING, P_BYTES, P_FIXED,
  P_INT_LONG, P_INT_FLOAT, P_INT_DOUBLE, P_LONG_FLOAT, P_LONG_DOUBLE, P_FLOAT_DOUBLE,
  P_STRING_BYTES, P_BYTES_STRING,
  P_RECORD, P_ENUM, P_ARRAY, P_MAP, P_WUNION, P_RUNION,
  P_ARRAY_RESET /* never planned: an array decoded again from scratch (decode_value, P_ARRAY) */
};

typedef struct lt_plan lt_plan;
struct lt_plan {
  int op;
  const lt_node *w, *r;
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

static void plans_free(lt_plan *p) {
  while (p) {
    lt_plan *next = p->next;
    free(p->child);
    free(p->idx);
    free(p->defaults);
    free(p);
    p = next;
  }
}

static lt_plan *plan_new(lt_planner *pl, int op, const lt_node *w, const lt_node *r) {
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
    return any ? p : plan_fail(pl, quiet, "no branch of the writer's union can be read as %s", type_word(r));
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
    return plan_fail(pl, quiet, "writer type %s matches no branch of the reader's union", type_word(w));
  }
  int op = promotion(w->type, r->type);
  if (op >= 0) return plan_new(pl, op, w, r);
  if (w->type != r->type)
    return plan_fail(pl, quiet, "writer type %s cannot be read as %s", type_word(w), type_word(r));
  switch (w->type) {
    case AVRO_FIXED:
      if (strcmp(w->name, r->name) != 0 || w->size != r->size)
        return plan_fail(pl, quiet, "fixed %s cannot be read as fixed %s", w->fullname, r->fullname);
      return plan_new(pl, P_FIXED, w, r);
    case AVRO_ENUM: {
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
    case AVRO_ARRAY:
    case AVRO_MAP: {
      lt_plan *c = plan_build(pl, w->items, r->items, depth + 1, quiet);
      if (!c) return NULL;
      lt_plan *p = plan_new(pl, w->type == AVRO_ARRAY ? P_ARRAY : P_MAP, w, r);
      if (!p || !(p->child = calloc(1, sizeof *p->child))) return NULL;
      p->child[0] = c;
      return p;
    }
    case AVRO_RECORD: {
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
          return plan_fail(pl, quiet,
                           "%s.%s is not in the writer's schema and has no default",
                           r->name, r->fields[k].name);
        p->defaults[p->ndefaults++] = k;
      }
      return p;
    }
    default:
      return plan_fail(pl, quiet, "cannot resolve %s", type_word(w));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Records. */

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

static lt_err_t json_to_value(lt_avro_record_t *rec, const lt_node *n, const json_t *j,
                              avro_value_t *v, bool is_default, char *path, size_t pathlen,
                              char *errstr, size_t errstr_size);
static lt_err_t init_value(lt_avro_record_t *rec, const lt_node *n, avro_value_t *v);

static lt_err_t ensure_scratch(lt_avro_record_t *rec, size_t n) {
  if (n <= rec->scratch_cap) return LT_OK;
  size_t cap = rec->scratch_cap ? rec->scratch_cap : 64;
  while (cap < n) cap *= 2;
  char *p = realloc(rec->scratch, cap);
  if (!p) return LT_ERR_NOMEM;
  rec->scratch = p;
  rec->scratch_cap = cap;
  return LT_OK;
}

/* avro-c's string setter copies size bytes (size counts a NUL): give it a terminated copy. */
static int set_string_n(lt_avro_record_t *rec, avro_value_t *v, const char *s, size_t len) {
  if (ensure_scratch(rec, len + 1)) return ENOMEM;
  memcpy(rec->scratch, s, len);
  rec->scratch[len] = '\0';
  return avro_value_set_string_len(v, rec->scratch, len + 1);
}

static lt_err_t set_default(lt_avro_record_t *rec, const lt_node *n, const json_t *def,
                            avro_value_t *v) {
  char path[8] = "";
  return json_to_value(rec, n, def, v, true, path, sizeof path, rec->err, sizeof rec->err);
}

/* A fresh value: defaults where the schema has them, zero otherwise; unions on branch 0. */
static lt_err_t init_value(lt_avro_record_t *rec, const lt_node *n, avro_value_t *v) {
  switch (n->type) {
    case AVRO_NULL: return avro_value_set_null(v) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_BOOLEAN: return avro_value_set_boolean(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT32: return avro_value_set_int(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT64: return avro_value_set_long(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FLOAT: return avro_value_set_float(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_DOUBLE: return avro_value_set_double(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_STRING: return set_string_n(rec, v, "", 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_BYTES: return avro_value_set_bytes(v, (void *)"", 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FIXED: {
      if (ensure_scratch(rec, (size_t)n->size + 1)) return LT_ERR_NOMEM;
      memset(rec->scratch, 0, (size_t)n->size);
      return avro_value_set_fixed(v, rec->scratch, (size_t)n->size) ? LT_ERR_INTERNAL : LT_OK;
    }
    case AVRO_ENUM:
      return avro_value_set_enum(v, n->enum_default >= 0 ? n->enum_default : 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_ARRAY:
    case AVRO_MAP: return avro_value_reset(v) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_UNION: {
      avro_value_t b;
      if (avro_value_set_branch(v, 0, &b)) return LT_ERR_INTERNAL;
      return init_value(rec, n->branches[0], &b);
    }
    case AVRO_RECORD:
      for (size_t i = 0; i < n->nfields; i++) {
        avro_value_t f;
        if (avro_value_get_by_index(v, i, &f, NULL)) return LT_ERR_INTERNAL;
        lt_err_t rc = n->fields[i].def ? set_default(rec, n->fields[i].type, n->fields[i].def, &f)
                                       : init_value(rec, n->fields[i].type, &f);
        if (rc) return rc;
      }
      return LT_OK;
    default: return LT_ERR_INTERNAL;
  }
}

void lt_avro_record_destroy(lt_avro_record_t *rec) {
  if (!rec) return;
  if (rec->value.iface) avro_value_decref(&rec->value);
  plans_free(rec->plan_mem);
  free(rec->plans);
  free(rec->buf);
  free(rec->scratch);
  free(rec);
}

lt_err_t lt_avro_record_new_schema(const lt_avro_registry_t *reg, const lt_avro_schema_t *schema,
                                   lt_avro_record_t **out, char *errstr, size_t errstr_size) {
  lt_avro_record_t *rec = calloc(1, sizeof *rec);
  if (!rec || !(rec->plans = calloc(reg->n, sizeof *rec->plans))) {
    free(rec);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory creating a %s record", schema->name);
  }
  rec->reg = reg;
  rec->schema = schema;
  if (avro_generic_value_new(schema->iface, &rec->value)) {
    rec->value.iface = NULL;
    lt_avro_record_destroy(rec);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "avro-c: %s", avro_strerror());
  }
  lt_err_t rc = init_value(rec, schema->root, &rec->value);
  if (rc) {
    lt_errf(errstr, errstr_size, rc, "%s v%d: cannot set defaults: %s", schema->name,
            schema->version, rec->err);
    lt_avro_record_destroy(rec);
    return rc;
  }
  *out = rec;
  return LT_OK;
}

lt_err_t lt_avro_record_new(const lt_avro_registry_t *reg, const char *name,
                            lt_avro_record_t **out, char *errstr, size_t errstr_size) {
  const lt_avro_schema_t *s = lt_avro_schema_latest(reg, name);
  if (!s)
    return lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND,
                   "no record type \"%s\" (lathe record schemas lists them)", name);
  return lt_avro_record_new_schema(reg, s, out, errstr, errstr_size);
}

const lt_avro_schema_t *lt_avro_record_schema(const lt_avro_record_t *rec) { return rec->schema; }
const char *lt_avro_record_type(const lt_avro_record_t *rec) { return rec->schema->name; }
int lt_avro_record_writer_version(const lt_avro_record_t *rec) { return rec->writer_version; }
const char *lt_avro_record_error(const lt_avro_record_t *rec) { return rec->err; }

void lt_avro_record_clear(lt_avro_record_t *rec) {
  rec->writer_version = 0;
  init_value(rec, rec->schema->root, &rec->value);
}

lt_err_t lt_avro_record_copy(lt_avro_record_t *dst, const lt_avro_record_t *src) {
  if (dst->schema != src->schema)
    return lt_errf(dst->err, sizeof dst->err, LT_ERR_INVALID, "cannot copy a %s v%d into a %s v%d",
                   src->schema->name, src->schema->version, dst->schema->name, dst->schema->version);
  if (avro_value_copy_fast(&dst->value, &src->value))
    return lt_errf(dst->err, sizeof dst->err, LT_ERR_NOMEM, "avro-c: %s", avro_strerror());
  dst->writer_version = src->writer_version;
  return LT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Binary encoding. */

typedef struct lt_wr {
  uint8_t *buf;
  size_t cap, pos;
} lt_wr;

static inline void wr_bytes(lt_wr *w, const void *p, size_t n) {
  if (w->pos + n <= w->cap) memcpy(w->buf + w->pos, p, n);
  w->pos += n;
}

static inline void wr_long(lt_wr *w, int64_t v) {
  uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
  uint8_t tmp[10];
  size_t n = 0;
  while (z > 0x7f) {
    tmp[n++] = (uint8_t)((z & 0x7f) | 0x80);
    z >>= 7;
  }
  tmp[n++] = (uint8_t)z;
  if (w->pos + n <= w->cap) memcpy(w->buf + w->pos, tmp, n);
  w->pos += n;
}

static lt_err_t enc_fail(lt_avro_record_t *rec, const char *field, const char *what) {
  return lt_errf(rec->err, sizeof rec->err, LT_ERR_INVALID, "%s: field %s: %s", rec->schema->name,
                 field ? field : "(top)", what);
}

static lt_err_t encode_value(lt_avro_record_t *rec, lt_wr *w, const lt_node *n, avro_value_t *v,
                             const char *field) {
  switch (n->type) {
    case AVRO_NULL: return LT_OK;
    case AVRO_BOOLEAN: {
      int b = 0;
      if (avro_value_get_boolean(v, &b)) return enc_fail(rec, field, "not a boolean");
      uint8_t c = b ? 1 : 0;
      wr_bytes(w, &c, 1);
      return LT_OK;
    }
    case AVRO_INT32: {
      int32_t x = 0;
      if (avro_value_get_int(v, &x)) return enc_fail(rec, field, "not an int");
      wr_long(w, x);
      return LT_OK;
    }
    case AVRO_INT64: {
      int64_t x = 0;
      if (avro_value_get_long(v, &x)) return enc_fail(rec, field, "not a long");
      wr_long(w, x);
      return LT_OK;
    }
    case AVRO_FLOAT: {
      float f = 0;
      if (avro_value_get_float(v, &f)) return enc_fail(rec, field, "not a float");
      uint32_t u;
      memcpy(&u, &f, 4);
      uint8_t b[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
      wr_bytes(w, b, 4);
      return LT_OK;
    }
    case AVRO_DOUBLE: {
      double d = 0;
      if (avro_value_get_double(v, &d)) return enc_fail(rec, field, "not a double");
      uint64_t u;
      memcpy(&u, &d, 8);
      uint8_t b[8];
      for (int i = 0; i < 8; i++) b[i] = (uint8_t)(u >> (8 * i));
      wr_bytes(w, b, 8);
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
    case AVRO_BYTES: {
      const void *p = NULL;
      size_t size = 0;
      if (avro_value_get_bytes(v, &p, &size)) return enc_fail(rec, field, "not bytes");
      wr_long(w, (int64_t)size);
      wr_bytes(w, p, size);
      return LT_OK;
    }
    case AVRO_FIXED: {
      const void *p = NULL;
      size_t size = 0;
      if (avro_value_get_fixed(v, &p, &size) || size != (size_t)n->size)
        return enc_fail(rec, field, "fixed value has the wrong size");
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
    case AVRO_MAP: {
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
    case AVRO_RECORD:
      for (size_t i = 0; i < n->nfields; i++) {
        avro_value_t f;
        if (avro_value_get_by_index(v, i, &f, NULL)) return enc_fail(rec, n->fields[i].name, "missing");
        lt_err_t rc = encode_value(rec, w, n->fields[i].type, &f, n->fields[i].name);
        if (rc) return rc;
      }
      return LT_OK;
    default: return enc_fail(rec, field, "unsupported type");
  }
}

static lt_err_t encode_into(lt_avro_record_t *rec, uint8_t *buf, size_t cap, bool header,
                            size_t *need) {
  lt_wr w = {.buf = buf, .cap = cap, .pos = 0};
  if (header) {
    uint8_t h[LT_AVRO_HEADER_SIZE] = {0xC3, 0x01};
    for (int i = 0; i < 8; i++) h[2 + i] = (uint8_t)(rec->schema->fingerprint >> (8 * i));
    wr_bytes(&w, h, sizeof h);
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
    if (!p) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory encoding %s", rec->schema->name);
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
  if ((uint64_t)l > (uint64_t)(r->end - r->p)) return rd_fail(r, LT_ERR_CORRUPT, "truncated body: length runs past the end");
  *len = (size_t)l;
  return LT_OK;
}

static lt_err_t rd_float(lt_rd *r, float *f) {
  if (rd_need(r, 4)) return r->rc;
  uint32_t u = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 | (uint32_t)r->p[3] << 24;
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
      if (x < 0 || (uint64_t)x >= n->nbranches) return rd_fail(r, LT_ERR_CORRUPT, "union index out of range");
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
          if (bytes < 0 || (uint64_t)bytes > (uint64_t)(r->end - r->p)) return rd_fail(r, LT_ERR_CORRUPT, "bad block size");
          r->p += bytes;
          continue;
        }
        if ((uint64_t)count > (uint64_t)(r->end - r->p)) return rd_fail(r, LT_ERR_CORRUPT, "truncated body: block count runs past the end");
        for (int64_t i = 0; i < count; i++) {
          if (n->type == AVRO_MAP && rd_len(r, &len)) return r->rc;
          if (n->type == AVRO_MAP) r->p += len;
          if (skip_value(r, n->items, depth + 1)) return r->rc;
        }
      }
    default: return rd_fail(r, LT_ERR_INTERNAL, "unsupported type");
  }
}

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
      if (rd_long(r, &x)) return r->rc;
      avro_value_set_long(v, x);
      return LT_OK;
    case P_INT_FLOAT:
    case P_LONG_FLOAT:
      if (rd_long(r, &x)) return r->rc;
      avro_value_set_float(v, (float)x);
      return LT_OK;
    case P_INT_DOUBLE:
    case P_LONG_DOUBLE:
      if (rd_long(r, &x)) return r->rc;
      avro_value_set_double(v, (double)x);
      return LT_OK;
    case P_FLOAT: {
      float f;
      if (rd_float(r, &f)) return r->rc;
      avro_value_set_float(v, f);
      return LT_OK;
    }
    case P_FLOAT_DOUBLE: {
      float f;
      if (rd_float(r, &f)) return r->rc;
      avro_value_set_double(v, f);
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
      if (set_string_n(rec, v, (const char *)r->p, len)) return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += len;
      return LT_OK;
    case P_BYTES:
    case P_STRING_BYTES:
      if (rd_len(r, &len)) return r->rc;
      if (avro_value_set_bytes(v, (void *)r->p, len)) return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += len;
      return LT_OK;
    case P_FIXED:
      if (rd_need(r, (size_t)pl->r->size)) return r->rc;
      if (avro_value_set_fixed(v, (void *)r->p, (size_t)pl->r->size)) return rd_fail(r, LT_ERR_NOMEM, "out of memory");
      r->p += pl->r->size;
      return LT_OK;
    case P_ENUM:
      if (rd_long(r, &x)) return r->rc;
      if (x < 0 || (uint64_t)x >= pl->w->nsymbols) return rd_fail(r, LT_ERR_CORRUPT, "enum index out of range");
      if (pl->idx[x] < 0) return rd_fail(r, LT_ERR_INVALID, "enum symbol unknown to the reader and no default");
      avro_value_set_enum(v, pl->idx[x]);
      return LT_OK;
    case P_WUNION: {
      if (rd_long(r, &x)) return r->rc;
      if (x < 0 || (uint64_t)x >= pl->w->nbranches) return rd_fail(r, LT_ERR_CORRUPT, "union index out of range");
      if (!pl->child[x]) return rd_fail(r, LT_ERR_INVALID, "writer's union branch has no match in the reader");
      return decode_value(rec, r, pl->child[x], v, depth + 1);
    }
    case P_RUNION: {
      avro_value_t b;
      if (avro_value_set_branch(v, pl->rbranch, &b)) return rd_fail(r, LT_ERR_NOMEM, "cannot select union branch");
      return decode_value(rec, r, pl->child[0], &b, depth + 1);
    }
    case P_ARRAY: {
      /* Elements already in the array are decoded over (each decode sets its whole value), so
       * a record decoded again and again keeps its element buffers: no allocation once warm.
       * Resetting would free every element and appending make it anew. Fewer elements than
       * before: reset and decode the array again from its start (the rare case). */
      size_t had = 0, i = 0;
      const uint8_t *start = r->p;
      avro_value_get_size(v, &had);
      for (;;) {
        int64_t count;
        if (rd_long(r, &count)) return r->rc;
        if (count == 0) break;
        if (count < 0) {
          int64_t bytes;
          if (count == INT64_MIN || rd_long(r, &bytes)) return r->rc ? r->rc : rd_fail(r, LT_ERR_CORRUPT, "bad block count");
          count = -count;
        }
        if ((uint64_t)count > (uint64_t)(r->end - r->p) + 1 && pl->child[0]->op != P_NULL)
          return rd_fail(r, LT_ERR_CORRUPT, "truncated body: block count runs past the end");
        for (int64_t k = 0; k < count; k++, i++) {
          avro_value_t e;
          if (i < had ? avro_value_get_by_index(v, i, &e, NULL) : avro_value_append(v, &e, NULL))
            return rd_fail(r, LT_ERR_NOMEM, "cannot append array element");
          lt_err_t rc = decode_value(rec, r, pl->child[0], &e, depth + 1);
          if (rc) return rc;
        }
      }
      if (i >= had) return LT_OK;
      if (avro_value_reset(v)) return rd_fail(r, LT_ERR_NOMEM, "cannot reset array");
      r->p = start;
      lt_plan again = *pl;
      again.op = P_ARRAY_RESET;
      return decode_value(rec, r, &again, v, depth);
    }
    case P_ARRAY_RESET:
    case P_MAP:
      if (avro_value_reset(v)) return rd_fail(r, LT_ERR_NOMEM, "cannot reset array");
      for (;;) {
        int64_t count;
        if (rd_long(r, &count)) return r->rc;
        if (count == 0) return LT_OK;
        if (count < 0) {
          int64_t bytes;
          if (count == INT64_MIN || rd_long(r, &bytes)) return r->rc ? r->rc : rd_fail(r, LT_ERR_CORRUPT, "bad block count");
          count = -count;
        }
        /* Every element takes at least one byte unless it is null-like: bound the count. */
        if ((uint64_t)count > (uint64_t)(r->end - r->p) + 1 && pl->child[0]->op != P_NULL)
          return rd_fail(r, LT_ERR_CORRUPT, "truncated body: block count runs past the end");
        for (int64_t i = 0; i < count; i++) {
          avro_value_t e;
          if (pl->op == P_MAP) {
            if (rd_len(r, &len)) return r->rc;
            if (ensure_scratch(rec, len + 1)) return rd_fail(r, LT_ERR_NOMEM, "out of memory");
            memcpy(rec->scratch, r->p, len);
            rec->scratch[len] = '\0';
            r->p += len;
            if (avro_value_add(v, rec->scratch, &e, NULL, NULL)) return rd_fail(r, LT_ERR_NOMEM, "cannot add map entry");
          } else if (avro_value_append(v, &e, NULL)) {
            return rd_fail(r, LT_ERR_NOMEM, "cannot append array element");
          }
          lt_err_t rc = decode_value(rec, r, pl->child[0], &e, depth + 1);
          if (rc) return rc;
        }
      }
    case P_RECORD: {
      const lt_node *w = pl->w, *rn = pl->r;
      for (size_t i = 0; i < w->nfields; i++) {
        r->field = w->fields[i].name;
        if (pl->idx[i] < 0) {
          if (skip_value(r, w->fields[i].type, depth + 1)) return r->rc;
          continue;
        }
        avro_value_t f;
        if (avro_value_get_by_index(v, (size_t)pl->idx[i], &f, NULL)) return rd_fail(r, LT_ERR_INTERNAL, "no such field");
        lt_err_t rc = decode_value(rec, r, pl->child[i], &f, depth + 1);
        if (rc) return rc;
      }
      for (size_t k = 0; k < pl->ndefaults; k++) {
        size_t fi = pl->defaults[k];
        avro_value_t f;
        if (avro_value_get_by_index(v, fi, &f, NULL)) return rd_fail(r, LT_ERR_INTERNAL, "no such field");
        if (set_default(rec, rn->fields[fi].type, rn->fields[fi].def, &f))
          return rd_fail(r, LT_ERR_INTERNAL, "cannot apply default");
      }
      return LT_OK;
    }
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
                     writer->name, writer->version, rec->schema->version, msg[0] ? msg : "out of memory");
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
                   "record is a %s v%d, expected a %s", writer->name, writer->version, rec->schema->name);
  lt_plan *plan = NULL;
  lt_err_t rc = plan_for(rec, writer, &plan, errstr, errstr_size);
  if (rc) return rc;
  char msg[200] = "";
  lt_rd r = {.start = body, .p = body, .end = (const uint8_t *)body + len, .msg = msg, .msgsz = sizeof msg};
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

/* ------------------------------------------------------------------------------------------ */
/* Field access by path. */

static lt_err_t acc_fail(lt_avro_record_t *rec, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static lt_err_t acc_fail(lt_avro_record_t *rec, const char *path, const char *fmt, ...) {
  char what[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(rec->err, sizeof rec->err, "%s: \"%s\": %s", rec->schema->name, path, what);
  return LT_ERR_INVALID;
}

static const lt_node *nonnull_branch(const lt_node *u, int *idx) {
  for (size_t i = 0; i < u->nbranches; i++)
    if (u->branches[i]->type != AVRO_NULL) {
      *idx = (int)i;
      return u->branches[i];
    }
  return NULL;
}

/* Walks path from the record root. On success *v and *n are the target value and its schema
 * node (possibly a union). for_set: step into unions' value branch and append at [size]. */
static lt_err_t resolve_path(lt_avro_record_t *rec, const char *path, bool for_set,
                             avro_value_t *v, const lt_node **n) {
  avro_value_t cur = rec->value;
  const lt_node *node = rec->schema->root;
  const char *p = path;
  if (!p || !*p) return acc_fail(rec, "", "empty field path");
  for (;;) {
    /* Step through a union into its non-null branch before a '.' or '['. */
    if (node->type == AVRO_UNION) {
      int bi = -1, d = -1;
      const lt_node *bn = nonnull_branch(node, &bi);
      if (!bn) return acc_fail(rec, path, "union has no value branch");
      avro_value_get_discriminant(&cur, &d);
      avro_value_t b;
      if (d != bi) {
        if (!for_set) return acc_fail(rec, path, "is null"), LT_ERR_NOT_FOUND;
        if (avro_value_set_branch(&cur, bi, &b)) return acc_fail(rec, path, "cannot select branch");
        if (init_value(rec, bn, &b)) return LT_ERR_INTERNAL;
      } else if (avro_value_get_current_branch(&cur, &b)) {
        return acc_fail(rec, path, "cannot read union");
      }
      cur = b;
      node = bn;
    }
    if (*p == '[') {
      char *endp;
      unsigned long long idx = strtoull(p + 1, &endp, 10);
      if (endp == p + 1 || *endp != ']') return acc_fail(rec, path, "bad index syntax");
      if (node->type != AVRO_ARRAY) return acc_fail(rec, path, "indexes a %s, not an array", type_word(node));
      size_t size = 0;
      avro_value_get_size(&cur, &size);
      avro_value_t e;
      if (idx < size) {
        if (avro_value_get_by_index(&cur, (size_t)idx, &e, NULL)) return acc_fail(rec, path, "cannot read element");
      } else if (idx == size && for_set) {
        if (avro_value_append(&cur, &e, NULL) || init_value(rec, node->items, &e))
          return acc_fail(rec, path, "cannot append");
      } else {
        return acc_fail(rec, path, "index %llu out of range (array has %zu elements)", idx, size);
      }
      cur = e;
      node = node->items;
      p = endp + 1;
    } else {
      if (*p == '.') p++;
      size_t len = strcspn(p, ".[");
      if (node->type != AVRO_RECORD) return acc_fail(rec, path, "%s has no fields", type_word(node));
      size_t i;
      for (i = 0; i < node->nfields; i++)
        if (strncmp(node->fields[i].name, p, len) == 0 && node->fields[i].name[len] == '\0') break;
      if (i == node->nfields) return acc_fail(rec, path, "no field \"%.*s\" in %s", (int)len, p, node->name);
      avro_value_t f;
      if (avro_value_get_by_index(&cur, i, &f, NULL)) return acc_fail(rec, path, "cannot read field");
      cur = f;
      node = node->fields[i].type;
      p += len;
    }
    if (!*p) break;
  }
  *v = cur;
  *n = node;
  return LT_OK;
}

/* For a setter: target value of the kind wanted (a union selects the first branch of that type). */
static lt_err_t target_for_set(lt_avro_record_t *rec, const char *path, const avro_type_t *types,
                               size_t ntypes, avro_value_t *v, const lt_node **n) {
  lt_err_t rc = resolve_path(rec, path, true, v, n);
  if (rc) return rc;
  if ((*n)->type == AVRO_UNION) {
    const lt_node *u = *n;
    for (size_t t = 0; t < ntypes; t++)
      for (size_t i = 0; i < u->nbranches; i++)
        if (u->branches[i]->type == types[t]) {
          avro_value_t b;
          int d = -1;
          avro_value_get_discriminant(v, &d);
          if (avro_value_set_branch(v, (int)i, &b)) return acc_fail(rec, path, "cannot select branch");
          if (d != (int)i && init_value(rec, u->branches[i], &b)) return LT_ERR_INTERNAL;
          *v = b;
          *n = u->branches[i];
          return LT_OK;
        }
    return acc_fail(rec, path, "union has no branch of this type");
  }
  for (size_t t = 0; t < ntypes; t++)
    if ((*n)->type == types[t]) return LT_OK;
  return acc_fail(rec, path, "is a %s", type_word(*n));
}

lt_err_t lt_avro_set_null(lt_avro_record_t *rec, const char *path) {
  static const avro_type_t t[] = {AVRO_NULL};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 1, &v, &n);
  return rc ? rc : (avro_value_set_null(&v) ? LT_ERR_INTERNAL : LT_OK);
}

lt_err_t lt_avro_set_bool(lt_avro_record_t *rec, const char *path, bool b) {
  static const avro_type_t t[] = {AVRO_BOOLEAN};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 1, &v, &n);
  return rc ? rc : (avro_value_set_boolean(&v, b) ? LT_ERR_INTERNAL : LT_OK);
}

lt_err_t lt_avro_set_int(lt_avro_record_t *rec, const char *path, int32_t x) {
  static const avro_type_t t[] = {AVRO_INT32, AVRO_INT64};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 2, &v, &n);
  if (rc) return rc;
  return (n->type == AVRO_INT32 ? avro_value_set_int(&v, x) : avro_value_set_long(&v, x)) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_set_long(lt_avro_record_t *rec, const char *path, int64_t x) {
  static const avro_type_t t[] = {AVRO_INT64, AVRO_INT32};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 2, &v, &n);
  if (rc) return rc;
  if (n->type == AVRO_INT32) {
    if (x < INT32_MIN || x > INT32_MAX) return acc_fail(rec, path, "%" PRId64 " does not fit an int", x);
    return avro_value_set_int(&v, (int32_t)x) ? LT_ERR_INTERNAL : LT_OK;
  }
  return avro_value_set_long(&v, x) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_set_double(lt_avro_record_t *rec, const char *path, double x) {
  static const avro_type_t t[] = {AVRO_DOUBLE, AVRO_FLOAT};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 2, &v, &n);
  if (rc) return rc;
  return (n->type == AVRO_DOUBLE ? avro_value_set_double(&v, x) : avro_value_set_float(&v, (float)x)) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_set_string_len(lt_avro_record_t *rec, const char *path, const char *s, size_t len) {
  static const avro_type_t t[] = {AVRO_STRING};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 1, &v, &n);
  if (rc) return rc;
  return set_string_n(rec, &v, s, len) ? LT_ERR_NOMEM : LT_OK;
}

lt_err_t lt_avro_set_string(lt_avro_record_t *rec, const char *path, const char *s) {
  static const avro_type_t t[] = {AVRO_STRING};
  avro_value_t v;
  const lt_node *n;
  if (!s) return acc_fail(rec, path, "NULL string (use lt_avro_set_null)");
  lt_err_t rc = target_for_set(rec, path, t, 1, &v, &n);
  if (rc) return rc;
  return avro_value_set_string_len(&v, s, strlen(s) + 1) ? LT_ERR_NOMEM : LT_OK;
}

lt_err_t lt_avro_set_bytes(lt_avro_record_t *rec, const char *path, const void *p, size_t len) {
  static const avro_type_t t[] = {AVRO_BYTES, AVRO_FIXED};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 2, &v, &n);
  if (rc) return rc;
  if (n->type == AVRO_FIXED) {
    if (len != (size_t)n->size) return acc_fail(rec, path, "fixed needs %" PRId64 " bytes, got %zu", n->size, len);
    return avro_value_set_fixed(&v, (void *)p, len) ? LT_ERR_NOMEM : LT_OK;
  }
  return avro_value_set_bytes(&v, (void *)(p ? p : ""), len) ? LT_ERR_NOMEM : LT_OK;
}

lt_err_t lt_avro_set_enum(lt_avro_record_t *rec, const char *path, const char *symbol) {
  static const avro_type_t t[] = {AVRO_ENUM};
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, t, 1, &v, &n);
  if (rc) return rc;
  for (size_t i = 0; symbol && i < n->nsymbols; i++)
    if (strcmp(n->symbols[i], symbol) == 0) return avro_value_set_enum(&v, (int)i) ? LT_ERR_INTERNAL : LT_OK;
  lt_sb sb = {0};
  for (size_t i = 0; i < n->nsymbols; i++) {
    if (i) sb_puts(&sb, ", ");
    sb_puts(&sb, n->symbols[i]);
  }
  acc_fail(rec, path, "\"%s\" is not one of %s", symbol ? symbol : "(null)", sb.p ? sb.p : "");
  free(sb.p);
  return LT_ERR_INVALID;
}

/* For a getter: steps from the resolved value into a union's current branch (null:
 * LT_ERR_NOT_FOUND). */
static lt_err_t step_for_get(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                             const lt_node **n) {
  if ((*n)->type == AVRO_UNION) {
    int d = -1;
    avro_value_t b;
    if (avro_value_get_discriminant(v, &d) || d < 0 || avro_value_get_current_branch(v, &b))
      return acc_fail(rec, path, "union has no value");
    *n = (*n)->branches[d];
    *v = b;
  }
  if ((*n)->type == AVRO_NULL) {
    acc_fail(rec, path, "is null");
    return LT_ERR_NOT_FOUND;
  }
  return LT_OK;
}

/* For a getter: the value at path, stepping into a union's current branch. */
static lt_err_t target_for_get(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                               const lt_node **n) {
  lt_err_t rc = resolve_path(rec, path, false, v, n);
  return rc ? rc : step_for_get(rec, path, v, n);
}

/* Top-level field `field` of rec as resolve_path(name) finds it (no union step yet). */
static lt_err_t field_at(lt_avro_record_t *rec, int field, avro_value_t *v, const lt_node **n) {
  const lt_node *root = rec->schema->root;
  if (field < 0 || (size_t)field >= root->nfields)
    return acc_fail(rec, "#", "no field number %d in %s", field, root->name);
  if (avro_value_get_by_index(&rec->value, (size_t)field, v, NULL))
    return acc_fail(rec, root->fields[field].name, "cannot read field");
  *n = root->fields[field].type;
  return LT_OK;
}

/* For a getter by index: as target_for_get with the field's name as the path. */
static lt_err_t target_at(lt_avro_record_t *rec, int field, avro_value_t *v, const lt_node **n,
                          const char **name) {
  lt_err_t rc = field_at(rec, field, v, n);
  if (rc) return rc;
  *name = rec->schema->root->fields[field].name;
  return step_for_get(rec, *name, v, n);
}

int lt_avro_schema_field_index(const lt_avro_schema_t *s, const char *name) {
  const lt_node *root = s->root;
  for (size_t i = 0; name && i < root->nfields; i++)
    if (strcmp(root->fields[i].name, name) == 0) return (int)i;
  return -1;
}

lt_err_t lt_avro_is_null(lt_avro_record_t *rec, const char *path, bool *is_null) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  if (rc == LT_ERR_NOT_FOUND) {
    *is_null = true;
    return LT_OK;
  }
  if (rc == LT_OK) *is_null = false;
  return rc;
}

/* The typed tails of the getters: v and n are the target after step_for_get; path names it in
 * messages. */
static lt_err_t read_bool(lt_avro_record_t *rec, const char *path, avro_value_t *v, const lt_node *n, bool *out) {
  if (n->type != AVRO_BOOLEAN) return acc_fail(rec, path, "is a %s, not a boolean", type_word(n));
  int b = 0;
  avro_value_get_boolean(v, &b);
  *out = b != 0;
  return LT_OK;
}

static lt_err_t read_int(lt_avro_record_t *rec, const char *path, avro_value_t *v, const lt_node *n, int32_t *out) {
  if (n->type != AVRO_INT32) return acc_fail(rec, path, "is a %s, not an int", type_word(n));
  return avro_value_get_int(v, out) ? LT_ERR_INTERNAL : LT_OK;
}

static lt_err_t read_long(lt_avro_record_t *rec, const char *path, avro_value_t *v, const lt_node *n, int64_t *out) {
  if (n->type == AVRO_INT32) {
    int32_t x = 0;
    avro_value_get_int(v, &x);
    *out = x;
    return LT_OK;
  }
  if (n->type != AVRO_INT64) return acc_fail(rec, path, "is a %s, not a long", type_word(n));
  return avro_value_get_long(v, out) ? LT_ERR_INTERNAL : LT_OK;
}

static lt_err_t read_string(lt_avro_record_t *rec, const char *path, avro_value_t *v, const lt_node *n,
                            const char **s, size_t *len) {
  if (n->type != AVRO_STRING) return acc_fail(rec, path, "is a %s, not a string", type_word(n));
  size_t size = 0;
  if (avro_value_get_string(v, s, &size)) return LT_ERR_INTERNAL;
  if (!*s) *s = "";
  if (len) *len = size ? size - 1 : 0;
  return LT_OK;
}

static lt_err_t read_enum(lt_avro_record_t *rec, const char *path, avro_value_t *v, const lt_node *n,
                          const char **symbol) {
  if (n->type != AVRO_ENUM) return acc_fail(rec, path, "is a %s, not an enum", type_word(n));
  int e = 0;
  avro_value_get_enum(v, &e);
  if (e < 0 || (size_t)e >= n->nsymbols) return acc_fail(rec, path, "enum out of range");
  *symbol = n->symbols[e];
  return LT_OK;
}

lt_err_t lt_avro_get_bool(lt_avro_record_t *rec, const char *path, bool *out) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read_bool(rec, path, &v, n, out);
}

lt_err_t lt_avro_get_int(lt_avro_record_t *rec, const char *path, int32_t *out) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read_int(rec, path, &v, n, out);
}

lt_err_t lt_avro_get_long(lt_avro_record_t *rec, const char *path, int64_t *out) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read_long(rec, path, &v, n, out);
}

lt_err_t lt_avro_get_double(lt_avro_record_t *rec, const char *path, double *out) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  if (rc) return rc;
  switch (n->type) {
    case AVRO_DOUBLE: return avro_value_get_double(&v, out) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FLOAT: { float f = 0; avro_value_get_float(&v, &f); *out = f; return LT_OK; }
    case AVRO_INT32: { int32_t x = 0; avro_value_get_int(&v, &x); *out = x; return LT_OK; }
    case AVRO_INT64: { int64_t x = 0; avro_value_get_long(&v, &x); *out = (double)x; return LT_OK; }
    default: return acc_fail(rec, path, "is a %s, not a number", type_word(n));
  }
}

lt_err_t lt_avro_get_string(lt_avro_record_t *rec, const char *path, const char **s, size_t *len) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read_string(rec, path, &v, n, s, len);
}

lt_err_t lt_avro_get_bool_at(lt_avro_record_t *rec, int field, bool *out) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read_bool(rec, name, &v, n, out);
}

lt_err_t lt_avro_get_int_at(lt_avro_record_t *rec, int field, int32_t *out) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read_int(rec, name, &v, n, out);
}

lt_err_t lt_avro_get_long_at(lt_avro_record_t *rec, int field, int64_t *out) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read_long(rec, name, &v, n, out);
}

lt_err_t lt_avro_get_string_at(lt_avro_record_t *rec, int field, const char **s, size_t *len) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read_string(rec, name, &v, n, s, len);
}

lt_err_t lt_avro_get_enum_at(lt_avro_record_t *rec, int field, const char **symbol) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read_enum(rec, name, &v, n, symbol);
}

/* As lt_avro_get_string(rec, "<field>[<i>]"): the same steps resolve_path and target_for_get
 * take, with the path written out only for a message. */
lt_err_t lt_avro_get_array_string_at(lt_avro_record_t *rec, int field, size_t i, const char **s, size_t *len) {
  avro_value_t v, e;
  const lt_node *n;
  lt_err_t rc = field_at(rec, field, &v, &n);
  if (rc) return rc;
  char path[96];
  path[0] = '\0';
#define PATH() (path[0] ? path : (snprintf(path, sizeof path, "%s[%zu]", rec->schema->root->fields[field].name, i), path))
  if (n->type == AVRO_UNION) {
    int bi = -1, d = -1;
    const lt_node *bn = nonnull_branch(n, &bi);
    if (!bn) return acc_fail(rec, PATH(), "union has no value branch");
    avro_value_get_discriminant(&v, &d);
    if (d != bi) return acc_fail(rec, PATH(), "is null"), LT_ERR_NOT_FOUND;
    avro_value_t b;
    if (avro_value_get_current_branch(&v, &b)) return acc_fail(rec, PATH(), "cannot read union");
    v = b;
    n = bn;
  }
  if (n->type != AVRO_ARRAY) return acc_fail(rec, PATH(), "indexes a %s, not an array", type_word(n));
  size_t size = 0;
  avro_value_get_size(&v, &size);
  if (i >= size) return acc_fail(rec, PATH(), "index %zu out of range (array has %zu elements)", i, size);
  if (avro_value_get_by_index(&v, i, &e, NULL)) return acc_fail(rec, PATH(), "cannot read element");
  n = n->items;
  if (n->type == AVRO_UNION || n->type == AVRO_NULL) {
    rc = step_for_get(rec, PATH(), &e, &n);
    if (rc) return rc;
  }
  if (n->type != AVRO_STRING) return acc_fail(rec, PATH(), "is a %s, not a string", type_word(n));
  return read_string(rec, PATH(), &e, n, s, len);
#undef PATH
}

lt_err_t lt_avro_get_bytes(lt_avro_record_t *rec, const char *path, const void **p, size_t *len) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  if (rc) return rc;
  size_t size = 0;
  if (n->type == AVRO_BYTES) rc = avro_value_get_bytes(&v, p, &size) ? LT_ERR_INTERNAL : LT_OK;
  else if (n->type == AVRO_FIXED) rc = avro_value_get_fixed(&v, p, &size) ? LT_ERR_INTERNAL : LT_OK;
  else return acc_fail(rec, path, "is a %s, not bytes", type_word(n));
  if (!*p) *p = "";
  *len = size;
  return rc;
}

lt_err_t lt_avro_get_enum(lt_avro_record_t *rec, const char *path, const char **symbol) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read_enum(rec, path, &v, n, symbol);
}

static lt_err_t array_target(lt_avro_record_t *rec, const char *path, bool for_set,
                             avro_value_t *v, const lt_node **n) {
  lt_err_t rc = for_set ? resolve_path(rec, path, true, v, n) : target_for_get(rec, path, v, n);
  if (rc) return rc;
  if ((*n)->type == AVRO_UNION) { /* nullable array: select its array branch */
    static const avro_type_t t[] = {AVRO_ARRAY};
    return target_for_set(rec, path, t, 1, v, n);
  }
  if ((*n)->type != AVRO_ARRAY) return acc_fail(rec, path, "is a %s, not an array", type_word(*n));
  return LT_OK;
}

lt_err_t lt_avro_array_size(lt_avro_record_t *rec, const char *path, size_t *count) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = array_target(rec, path, false, &v, &n);
  if (rc) return rc;
  return avro_value_get_size(&v, count) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_array_clear(lt_avro_record_t *rec, const char *path) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = array_target(rec, path, true, &v, &n);
  if (rc) return rc;
  return avro_value_reset(&v) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_array_append(lt_avro_record_t *rec, const char *path, size_t *index) {
  avro_value_t v, e;
  const lt_node *n;
  lt_err_t rc = array_target(rec, path, true, &v, &n);
  if (rc) return rc;
  size_t idx = 0;
  if (avro_value_append(&v, &e, &idx)) return acc_fail(rec, path, "cannot append");
  rc = init_value(rec, n->items, &e);
  if (!rc && index) *index = idx;
  return rc;
}

lt_err_t lt_avro_array_append_string(lt_avro_record_t *rec, const char *path, const char *s) {
  avro_value_t v, e;
  const lt_node *n;
  lt_err_t rc = array_target(rec, path, true, &v, &n);
  if (rc) return rc;
  if (n->items->type != AVRO_STRING) return acc_fail(rec, path, "is not an array of strings");
  if (!s) return acc_fail(rec, path, "NULL string");
  if (avro_value_append(&v, &e, NULL)) return acc_fail(rec, path, "cannot append");
  return avro_value_set_string_len(&e, s, strlen(s) + 1) ? LT_ERR_NOMEM : LT_OK;
}

lt_err_t lt_avro_record_stamp(lt_avro_record_t *rec, const char *producer) {
  char id[37];
  lt_avro_uuid(id);
  lt_err_t rc = lt_avro_set_string(rec, "event_id", id);
  if (!rc) rc = lt_avro_set_long(rec, "occurred_at", lt_time_wall_ms());
  if (!rc) rc = lt_avro_set_string(rec, "producer", producer ? producer : "");
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* JSON. */

/* path is a buffer the caller owns; the functions append ".field" / "[i]" and restore it. */
static size_t path_push(char *path, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static size_t path_push(char *path, size_t size, const char *fmt, ...) {
  size_t old = strlen(path);
  if (old + 1 < size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path + old, size - old, fmt, ap);
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

static lt_err_t jfail(char *errstr, size_t errstr_size, const char *path, const char *expected,
                      const json_t *got) {
  return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "field %s: expected %s, got %s",
                 path[0] ? path : "(record)", expected, got ? json_kind(got) : "nothing");
}

/* Bytes in Avro's JSON form: a string whose code points are 0..255. */
static lt_err_t json_bytes(lt_avro_record_t *rec, const json_t *j, size_t *len) {
  const unsigned char *s = (const unsigned char *)json_string_value(j);
  size_t n = json_string_length(j), o = 0;
  if (ensure_scratch(rec, n + 1)) return LT_ERR_NOMEM;
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

static lt_err_t json_to_value(lt_avro_record_t *rec, const lt_node *n, const json_t *j,
                              avro_value_t *v, bool is_default, char *path, size_t pathlen,
                              char *errstr, size_t errstr_size) {
  switch (n->type) {
    case AVRO_NULL:
      if (!json_is_null(j)) return jfail(errstr, errstr_size, path, "null", j);
      avro_value_set_null(v);
      return LT_OK;
    case AVRO_BOOLEAN:
      if (!json_is_boolean(j)) return jfail(errstr, errstr_size, path, "true or false", j);
      avro_value_set_boolean(v, json_is_true(j));
      return LT_OK;
    case AVRO_INT32: {
      if (!json_is_integer(j)) return jfail(errstr, errstr_size, path, "an integer (int)", j);
      json_int_t x = json_integer_value(j);
      if (x < INT32_MIN || x > INT32_MAX)
        return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                       "field %s: %lld does not fit an int (32 bits)", path, (long long)x);
      avro_value_set_int(v, (int32_t)x);
      return LT_OK;
    }
    case AVRO_INT64:
      if (!json_is_integer(j)) return jfail(errstr, errstr_size, path, "an integer (long)", j);
      avro_value_set_long(v, json_integer_value(j));
      return LT_OK;
    case AVRO_FLOAT:
    case AVRO_DOUBLE:
      if (!json_is_number(j)) return jfail(errstr, errstr_size, path, "a number", j);
      if (n->type == AVRO_FLOAT) avro_value_set_float(v, (float)json_number_value(j));
      else avro_value_set_double(v, json_number_value(j));
      return LT_OK;
    case AVRO_STRING:
      if (!json_is_string(j)) return jfail(errstr, errstr_size, path, "a string", j);
      return set_string_n(rec, v, json_string_value(j), json_string_length(j)) ? LT_ERR_NOMEM : LT_OK;
    case AVRO_BYTES:
    case AVRO_FIXED: {
      size_t len = 0;
      if (!json_is_string(j) || json_bytes(rec, j, &len))
        return jfail(errstr, errstr_size, path, "a string of code points 0-255 (Avro bytes)", j);
      if (n->type == AVRO_FIXED) {
        if (len != (size_t)n->size)
          return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "field %s: expected %" PRId64 " bytes, got %zu", path, n->size, len);
        return avro_value_set_fixed(v, rec->scratch, len) ? LT_ERR_NOMEM : LT_OK;
      }
      return avro_value_set_bytes(v, rec->scratch, len) ? LT_ERR_NOMEM : LT_OK;
    }
    case AVRO_ENUM: {
      const char *s = json_string_value(j);
      for (size_t i = 0; s && i < n->nsymbols; i++)
        if (strcmp(s, n->symbols[i]) == 0) {
          avro_value_set_enum(v, (int)i);
          return LT_OK;
        }
      lt_sb sb = {0};
      sb_puts(&sb, "one of ");
      for (size_t i = 0; i < n->nsymbols; i++) {
        if (i) sb_puts(&sb, ", ");
        sb_puts(&sb, n->symbols[i]);
      }
      lt_err_t rc = s ? lt_errf(errstr, errstr_size, LT_ERR_INVALID, "field %s: expected %s, got \"%s\"", path, sb.p ? sb.p : "", s)
                      : jfail(errstr, errstr_size, path, sb.p ? sb.p : "an enum symbol", j);
      free(sb.p);
      return rc;
    }
    case AVRO_ARRAY: {
      if (!json_is_array(j)) return jfail(errstr, errstr_size, path, "an array", j);
      avro_value_reset(v);
      for (size_t i = 0; i < json_array_size(j); i++) {
        avro_value_t e;
        if (avro_value_append(v, &e, NULL)) return LT_ERR_NOMEM;
        size_t old = path_push(path, pathlen, "[%zu]", i);
        lt_err_t rc = json_to_value(rec, n->items, json_array_get(j, i), &e, is_default, path, pathlen, errstr, errstr_size);
        path[old] = '\0';
        if (rc) return rc;
      }
      return LT_OK;
    }
    case AVRO_MAP: {
      if (!json_is_object(j)) return jfail(errstr, errstr_size, path, "an object (map)", j);
      avro_value_reset(v);
      const char *key;
      json_t *val;
      json_object_foreach((json_t *)j, key, val) {
        avro_value_t e;
        if (avro_value_add(v, key, &e, NULL, NULL)) return LT_ERR_NOMEM;
        size_t old = path_push(path, pathlen, ".%s", key);
        lt_err_t rc = json_to_value(rec, n->items, val, &e, is_default, path, pathlen, errstr, errstr_size);
        path[old] = '\0';
        if (rc) return rc;
      }
      return LT_OK;
    }
    case AVRO_UNION: {
      avro_value_t b;
      if (is_default) { /* a union's default is of its first branch */
        if (avro_value_set_branch(v, 0, &b)) return LT_ERR_NOMEM;
        return json_to_value(rec, n->branches[0], j, &b, true, path, pathlen, errstr, errstr_size);
      }
      if (json_is_null(j)) {
        for (size_t i = 0; i < n->nbranches; i++)
          if (n->branches[i]->type == AVRO_NULL) {
            avro_value_set_branch(v, (int)i, &b);
            return avro_value_set_null(&b) ? LT_ERR_INTERNAL : LT_OK;
          }
        return jfail(errstr, errstr_size, path, "a value (the field is not nullable)", j);
      }
      /* Tagged form {"long": 5} / {"lathe.Foo": {...}}. */
      if (json_is_object(j) && json_object_size(j) == 1) {
        const char *tag = json_object_iter_key(json_object_iter((json_t *)j));
        for (size_t i = 0; i < n->nbranches; i++) {
          const lt_node *bn = n->branches[i];
          const char *bname = bn->fullname ? bn->fullname : type_word(bn);
          if (strcmp(tag, bname) == 0 || (bn->name && strcmp(tag, bn->name) == 0)) {
            if (avro_value_set_branch(v, (int)i, &b)) return LT_ERR_NOMEM;
            return json_to_value(rec, bn, json_object_get(j, tag), &b, false, path, pathlen, errstr, errstr_size);
          }
        }
      }
      lt_err_t rc = LT_ERR_INVALID;
      for (size_t i = 0; i < n->nbranches; i++) {
        if (n->branches[i]->type == AVRO_NULL) continue;
        if (avro_value_set_branch(v, (int)i, &b)) return LT_ERR_NOMEM;
        rc = json_to_value(rec, n->branches[i], j, &b, false, path, pathlen, errstr, errstr_size);
        if (!rc) return LT_OK;
      }
      return rc;
    }
    case AVRO_RECORD: {
      if (!json_is_object(j)) return jfail(errstr, errstr_size, path, "an object", j);
      const char *key;
      json_t *val;
      json_object_foreach((json_t *)j, key, val) {
        size_t i;
        for (i = 0; i < n->nfields; i++)
          if (strcmp(n->fields[i].name, key) == 0) break;
        if (i == n->nfields)
          return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "field %s%s%s: %s has no such field",
                         path, path[0] ? "." : "", key, n->name);
      }
      for (size_t i = 0; i < n->nfields; i++) {
        const lt_nfield *f = &n->fields[i];
        avro_value_t fv;
        if (avro_value_get_by_index(v, i, &fv, NULL)) return LT_ERR_INTERNAL;
        size_t old = path_push(path, pathlen, "%s%s", path[0] ? "." : "", f->name);
        json_t *fj = json_object_get(j, f->name);
        lt_err_t rc;
        if (fj) rc = json_to_value(rec, f->type, fj, &fv, is_default, path, pathlen, errstr, errstr_size);
        else if (f->def) rc = json_to_value(rec, f->type, f->def, &fv, true, path, pathlen, errstr, errstr_size);
        else rc = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "field %s: missing (%s, no default)", path, type_word(f->type));
        path[old] = '\0';
        if (rc) return rc;
      }
      return LT_OK;
    }
    default: return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "field %s: unsupported type", path);
  }
}

lt_err_t lt_avro_record_from_jansson(lt_avro_record_t *rec, const json_t *obj, char *errstr,
                                     size_t errstr_size) {
  char path[256] = "";
  rec->writer_version = 0;
  lt_err_t rc = json_to_value(rec, rec->schema->root, obj, &rec->value, false, path, sizeof path,
                              errstr, errstr_size);
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
    case AVRO_ENUM: {
      int e = 0;
      avro_value_get_enum(v, &e);
      return (e >= 0 && (size_t)e < n->nsymbols) ? json_string(n->symbols[e]) : NULL;
    }
    case AVRO_UNION: {
      int d = -1;
      avro_value_t b;
      if (avro_value_get_discriminant(v, &d) || d < 0 || avro_value_get_current_branch(v, &b)) return NULL;
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
        if (!c || (n->type == AVRO_ARRAY ? json_array_append_new(out, c) : json_object_set_new(out, key, c))) {
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
  if (!j) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s: a field has no value (or out of memory)", rec->schema->name);
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
