/* lt_avro_schema: schemas and the registry — our parse of each .avsc into a node tree, the
 * Parsing Canonical Form and its CRC-64-AVRO fingerprint, the registry of every version, the
 * single-object header and event UUIDs.
 *
 * Each embedded .avsc is parsed twice: by avro-c (avro_schema_from_json_length, whose generic
 * value class holds record values) and into our own node tree (lt_avro_int.h), which keeps what
 * avro-c drops — field defaults, enum defaults, full names. Nothing here is on the hot path: it
 * runs once per registry. */
#include "lt_avro_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/random.h>
#include <time.h>

/* ------------------------------------------------------------------------------------------ */
/* Growable string buffer. */

void lt_avro_sb_add(lt_sb *sb, const char *s, size_t n) {
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

void lt_avro_sb_puts(lt_sb *sb, const char *s) { lt_avro_sb_add(sb, s, strlen(s)); }

static void sb_str(lt_sb *sb, const char *s) { /* a JSON string; names need no escapes */
  lt_avro_sb_add(sb, "\"", 1);
  lt_avro_sb_puts(sb, s);
  lt_avro_sb_add(sb, "\"", 1);
}

void lt_avro_sb_symbols(lt_sb *sb, const lt_node *n) {
  for (size_t i = 0; i < n->nsymbols; i++) {
    if (i) lt_avro_sb_puts(sb, ", ");
    lt_avro_sb_puts(sb, n->symbols[i]);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Schema node tree. */

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

const char *lt_avro_type_word(const lt_node *n) {
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

/* A full name: names joined by dots ("lathe.JobRejected"). The namespace is checked as well as
 * the last name: the canonical form writes full names unescaped (sb_str). */
static bool valid_fullname(const char *s) {
  char part[256];
  for (const char *p = s;;) {
    size_t n = strcspn(p, ".");
    if (n == 0 || n >= sizeof part) return false;
    memcpy(part, p, n);
    part[n] = '\0';
    if (!valid_name(part)) return false;
    if (!p[n]) return true;
    p += n + 1;
  }
}

static lt_node *parse_fail(lt_parse *ps, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
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
  if (!name) return parse_fail(ps, "%s: a %s needs a \"name\"", where, lt_avro_type_word(n)), false;
  const char *own_ns = json_string_value(json_object_get(j, "namespace"));
  n->fullname = make_fullname(name, own_ns ? own_ns : ns);
  if (!n->fullname) return parse_fail(ps, "out of memory"), false;
  const char *dot = strrchr(n->fullname, '.');
  n->name = dot ? dot + 1 : n->fullname;
  if (!valid_fullname(n->fullname)) return parse_fail(ps, "%s: invalid name \"%s\"", where, name), false;
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

/* A type given by name: a primitive, or a named type defined earlier. */
static lt_node *parse_type_name(lt_parse *ps, const char *s, const char *ns, const char *where) {
  int pt = prim_type(s);
  if (pt >= 0) return node_new(ps, (avro_type_t)pt);
  lt_node *n = lookup_named(ps, s, ns);
  if (!n) return parse_fail(ps, "%s: unknown type \"%s\"", where, s);
  return n;
}

/* A union (a JSON array): its branches, none of them a union. */
static lt_node *parse_union(lt_parse *ps, json_t *j, const char *ns, const char *where, int depth) {
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

/* The fields of record n, from the "fields" array fj; their types take namespace ns. */
static bool parse_fields(lt_parse *ps, lt_node *n, json_t *fj, const char *ns, const char *where,
                         int depth) {
  n->nfields = json_array_size(fj);
  n->fields = calloc(n->nfields ? n->nfields : 1, sizeof *n->fields);
  if (!n->fields) return parse_fail(ps, "out of memory"), false;
  for (size_t i = 0; i < n->nfields; i++) {
    json_t *f = json_array_get(fj, i);
    const char *fname = json_string_value(json_object_get(f, "name"));
    if (!valid_name(fname))
      return parse_fail(ps, "%s: field %zu of %s has an invalid name", where, i, n->fullname),
             false;
    for (size_t k = 0; k < i; k++)
      if (strcmp(n->fields[k].name, fname) == 0)
        return parse_fail(ps, "%s: field %s appears twice in %s", where, fname, n->fullname), false;
    n->fields[i].name = strdup(fname);
    char fwhere[256];
    snprintf(fwhere, sizeof fwhere, "%s.%s", n->name, fname);
    n->fields[i].type = parse_node(ps, json_object_get(f, "type"), ns, fwhere, depth + 1);
    n->fields[i].def = json_object_get(f, "default");
    if (!n->fields[i].name || !n->fields[i].type) {
      if (!ps->rc) parse_fail(ps, "out of memory");
      return false;
    }
  }
  return true;
}

/* A record: its name, then its fields (nested types take the record's namespace). */
static lt_node *parse_record(lt_parse *ps, json_t *j, const char *ns, const char *where,
                             int depth) {
  lt_node *n = node_new(ps, AVRO_RECORD);
  if (!n || !register_named(ps, n, j, ns, where)) return NULL;
  char *inner_ns = strdup(n->fullname);
  if (!inner_ns) return parse_fail(ps, "out of memory");
  char *dot = strrchr(inner_ns, '.');
  if (dot) *dot = '\0';
  else inner_ns[0] = '\0';
  json_t *fj = json_object_get(j, "fields");
  bool ok = json_is_array(fj);
  if (ok) ok = parse_fields(ps, n, fj, inner_ns, where, depth);
  else parse_fail(ps, "%s: record %s needs a \"fields\" array", where, n->fullname);
  free(inner_ns);
  return ok ? n : NULL;
}

/* An enum: its name, symbols and optional default symbol. */
static lt_node *parse_enum(lt_parse *ps, json_t *j, const char *ns, const char *where) {
  lt_node *n = node_new(ps, AVRO_ENUM);
  if (!n || !register_named(ps, n, j, ns, where)) return NULL;
  json_t *sj = json_object_get(j, "symbols");
  if (!json_is_array(sj) || json_array_size(sj) == 0)
    return parse_fail(ps, "%s: enum %s needs symbols", where, n->fullname);
  n->nsymbols = json_array_size(sj);
  n->symbols = calloc(n->nsymbols, sizeof *n->symbols);
  if (!n->symbols) return parse_fail(ps, "out of memory");
  for (size_t i = 0; i < n->nsymbols; i++) {
    const char *s = json_string_value(json_array_get(sj, i));
    if (!valid_name(s))
      return parse_fail(ps, "%s: enum %s has an invalid symbol", where, n->fullname);
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

/* A fixed: its name and size. */
static lt_node *parse_fixed(lt_parse *ps, json_t *j, const char *ns, const char *where) {
  lt_node *n = node_new(ps, AVRO_FIXED);
  if (!n || !register_named(ps, n, j, ns, where)) return NULL;
  json_t *sz = json_object_get(j, "size");
  if (!json_is_integer(sz) || json_integer_value(sz) < 0)
    return parse_fail(ps, "%s: fixed %s needs a size", where, n->fullname);
  n->size = json_integer_value(sz);
  return n;
}

/* An array (t is "array": its "items") or a map (its "values"). */
static lt_node *parse_items(lt_parse *ps, json_t *j, const char *t, const char *ns,
                            const char *where, int depth) {
  bool arr = t[0] == 'a';
  lt_node *n = node_new(ps, arr ? AVRO_ARRAY : AVRO_MAP);
  if (!n) return NULL;
  json_t *ij = json_object_get(j, arr ? "items" : "values");
  if (!ij) return parse_fail(ps, "%s: %s needs \"%s\"", where, t, arr ? "items" : "values");
  n->items = parse_node(ps, ij, ns, where, depth + 1);
  return n->items ? n : NULL;
}

/* Any schema: a type name, a union or an object with a "type". where names the place for
 * messages; ns is the enclosing namespace. */
static lt_node *parse_node(lt_parse *ps, json_t *j, const char *ns, const char *where, int depth) {
  if (depth > LT_AVRO_MAX_DEPTH) return parse_fail(ps, "%s: schema nested too deeply", where);
  if (json_is_string(j)) return parse_type_name(ps, json_string_value(j), ns, where);
  if (json_is_array(j)) return parse_union(ps, j, ns, where, depth);
  if (!json_is_object(j)) return parse_fail(ps, "%s: a schema is a string, array or object", where);
  json_t *tj = json_object_get(j, "type");
  if (json_is_object(tj) || json_is_array(tj)) return parse_node(ps, tj, ns, where, depth + 1);
  const char *t = json_string_value(tj);
  if (!t) return parse_fail(ps, "%s: missing \"type\"", where);
  if (strcmp(t, "record") == 0 || strcmp(t, "error") == 0)
    return parse_record(ps, j, ns, where, depth);
  if (strcmp(t, "enum") == 0) return parse_enum(ps, j, ns, where);
  if (strcmp(t, "fixed") == 0) return parse_fixed(ps, j, ns, where);
  if (strcmp(t, "array") == 0 || strcmp(t, "map") == 0)
    return parse_items(ps, j, t, ns, where, depth);
  /* A primitive (logicalType and the like are ignored) or a bare name: {"type": "lathe.Foo"}. */
  return parse_type_name(ps, t, ns, where);
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
      lt_avro_sb_puts(sb, "{\"name\":");
      sb_str(sb, n->fullname);
      if (n->type == AVRO_RECORD) {
        lt_avro_sb_puts(sb, ",\"type\":\"record\",\"fields\":[");
        for (size_t i = 0; i < n->nfields; i++) {
          if (i) lt_avro_sb_puts(sb, ",");
          lt_avro_sb_puts(sb, "{\"name\":");
          sb_str(sb, n->fields[i].name);
          lt_avro_sb_puts(sb, ",\"type\":");
          canon_emit(sb, n->fields[i].type, pass);
          lt_avro_sb_puts(sb, "}");
        }
        lt_avro_sb_puts(sb, "]}");
      } else if (n->type == AVRO_ENUM) {
        lt_avro_sb_puts(sb, ",\"type\":\"enum\",\"symbols\":[");
        for (size_t i = 0; i < n->nsymbols; i++) {
          if (i) lt_avro_sb_puts(sb, ",");
          sb_str(sb, n->symbols[i]);
        }
        lt_avro_sb_puts(sb, "]}");
      } else {
        char num[32];
        snprintf(num, sizeof num, "%" PRId64, n->size);
        lt_avro_sb_puts(sb, ",\"type\":\"fixed\",\"size\":");
        lt_avro_sb_puts(sb, num);
        lt_avro_sb_puts(sb, "}");
      }
      return;
    case AVRO_ARRAY:
    case AVRO_MAP:
      lt_avro_sb_puts(sb, n->type == AVRO_ARRAY ? "{\"type\":\"array\",\"items\":"
                                                : "{\"type\":\"map\",\"values\":");
      canon_emit(sb, n->items, pass);
      lt_avro_sb_puts(sb, "}");
      return;
    case AVRO_UNION:
      lt_avro_sb_puts(sb, "[");
      for (size_t i = 0; i < n->nbranches; i++) {
        if (i) lt_avro_sb_puts(sb, ",");
        canon_emit(sb, n->branches[i], pass);
      }
      lt_avro_sb_puts(sb, "]");
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

/* Fills reg->schemas[i] from e: our parse, its checks, the canonical form and fingerprint
 * (unique among the schemas before it) and avro-c's value class. prev is the entry sorted just
 * before e (NULL for the first), to refuse a version given twice. */
static lt_err_t schema_load(lt_avro_registry_t *reg, size_t i, const lt_avro_embedded_t *e,
                            const lt_avro_embedded_t *prev, char *errstr, size_t errstr_size) {
  lt_avro_schema_t *s = &reg->schemas[i];
  s->reg = reg;
  s->index = i;
  s->name = e->name;
  s->version = e->version;
  s->json = e->json;
  s->json_len = e->json_len;
  char sub[256];
  lt_err_t rc =
      parse_schema_text(e->json, e->json_len, &s->tree, &s->root, &s->nodes, sub, sizeof sub);
  if (rc) return lt_errf(errstr, errstr_size, rc, "schema %s v%d: %s", e->name, e->version, sub);
  if (s->root->type != AVRO_RECORD || strcmp(s->root->name, e->name) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "schema %s v%d: top level must be record %s", e->name, e->version, e->name);
  if (prev && strcmp(prev->name, e->name) == 0 && prev->version == e->version)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema %s v%d is given twice", e->name,
                   e->version);
  lt_sb sb = {0};
  canon_emit(&sb, s->root, 1);
  if (sb.oom) {
    free(sb.p);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
  }
  s->canonical = sb.p;
  s->canonical_len = sb.len;
  s->fingerprint = lt_avro_crc64(sb.p, sb.len);
  for (size_t k = 0; k < i; k++)
    if (reg->schemas[k].fingerprint == s->fingerprint)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "schemas %s v%d and %s v%d have the same fingerprint "
                     "(identical canonical form)",
                     reg->schemas[k].name, reg->schemas[k].version, s->name, s->version);
  if (avro_schema_from_json_length(e->json, e->json_len, &s->avro) != 0 ||
      !(s->iface = avro_generic_class_from_schema(s->avro)))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "schema %s v%d: avro-c: %s", e->name,
                   e->version, avro_strerror());
  return LT_OK;
}

/* Points every version at the newest of its name and numbers the record types; versions are
 * sorted within a name. */
static void link_versions(lt_avro_registry_t *reg) {
  for (size_t i = 0; i < reg->n; i++) {
    size_t last = i;
    while (last + 1 < reg->n && strcmp(reg->schemas[last + 1].name, reg->schemas[i].name) == 0)
      last++;
    for (size_t k = i; k <= last; k++) {
      reg->schemas[k].latest = &reg->schemas[last];
      reg->schemas[k].type_index = reg->ntypes;
    }
    reg->ntypes++;
    i = last;
  }
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
    reg->n = i + 1; /* what registry_destroy frees */
    rc = schema_load(reg, i, sorted[i], i ? sorted[i - 1] : NULL, errstr, errstr_size);
    if (rc) goto err;
  }
  link_versions(reg);
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

