/* lt_avro: records — creation at their schema defaults, copy and clear, and typed field access
 * by path ("hyperparameters.lora_rank", "leases[1].job_id") or by top-level field index.
 *
 * The module's other files: lt_avro_schema.c (schemas, canonical form, fingerprints, registry),
 * lt_avro_codec.c (binary encoding, decoding and resolution of old writer versions),
 * lt_avro_json.c (records as JSON); lt_avro_int.h holds what they share. Field access walks the
 * schema node tree beside avro-c's value: the node says what the value may hold (a nullable
 * union, an enum's symbols) and names the path in messages. */
#include "lt_avro_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "lt_time.h"

/* ------------------------------------------------------------------------------------------ */
/* Records. */

lt_err_t lt_avro_value_init(lt_avro_record_t *rec, const lt_node *n, avro_value_t *v) {
  switch (n->type) {
    case AVRO_NULL: return avro_value_set_null(v) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_BOOLEAN: return avro_value_set_boolean(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT32: return avro_value_set_int(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT64: return avro_value_set_long(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FLOAT: return avro_value_set_float(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_DOUBLE: return avro_value_set_double(v, 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_STRING: return lt_avro_value_string(rec, v, "", 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_BYTES: return avro_value_set_bytes(v, (void *)"", 0) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FIXED: {
      if (lt_avro_scratch(rec, (size_t)n->size + 1)) return LT_ERR_NOMEM;
      memset(rec->scratch, 0, (size_t)n->size);
      return avro_value_set_fixed(v, rec->scratch, (size_t)n->size) ? LT_ERR_INTERNAL : LT_OK;
    }
    case AVRO_ENUM:
      return avro_value_set_enum(v, n->enum_default >= 0 ? n->enum_default : 0) ? LT_ERR_INTERNAL
                                                                                  : LT_OK;
    case AVRO_ARRAY:
    case AVRO_MAP: return avro_value_reset(v) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_UNION: {
      avro_value_t b;
      if (avro_value_set_branch(v, 0, &b)) return LT_ERR_INTERNAL;
      return lt_avro_value_init(rec, n->branches[0], &b);
    }
    case AVRO_RECORD:
      for (size_t i = 0; i < n->nfields; i++) {
        avro_value_t f;
        if (avro_value_get_by_index(v, i, &f, NULL)) return LT_ERR_INTERNAL;
        const lt_nfield *fd = &n->fields[i];
        lt_err_t rc = fd->def ? lt_avro_value_default(rec, fd->type, fd->def, &f)
                              : lt_avro_value_init(rec, fd->type, &f);
        if (rc) return rc;
      }
      return LT_OK;
    default: return LT_ERR_INTERNAL;
  }
}

void lt_avro_record_destroy(lt_avro_record_t *rec) {
  if (!rec) return;
  if (rec->value.iface) avro_value_decref(&rec->value);
  lt_avro_plans_free(rec->plan_mem);
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
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory creating a %s record",
                   schema->name);
  }
  rec->reg = reg;
  rec->schema = schema;
  if (avro_generic_value_new(schema->iface, &rec->value)) {
    rec->value.iface = NULL;
    lt_avro_record_destroy(rec);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "avro-c: %s", avro_strerror());
  }
  lt_err_t rc = lt_avro_value_init(rec, schema->root, &rec->value);
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
  lt_avro_value_init(rec, rec->schema->root, &rec->value);
}

lt_err_t lt_avro_record_copy(lt_avro_record_t *dst, const lt_avro_record_t *src) {
  if (dst->schema != src->schema)
    return lt_errf(dst->err, sizeof dst->err, LT_ERR_INVALID, "cannot copy a %s v%d into a %s v%d",
                   src->schema->name, src->schema->version, dst->schema->name,
                   dst->schema->version);
  if (avro_value_copy_fast(&dst->value, &src->value))
    return lt_errf(dst->err, sizeof dst->err, LT_ERR_NOMEM, "avro-c: %s", avro_strerror());
  dst->writer_version = src->writer_version;
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

/* Steps *cur, a nullable union (*node), into its value branch. A null value is LT_ERR_NOT_FOUND
 * for a getter; a setter (for_set) selects the branch, at its defaults. */
static lt_err_t enter_union(lt_avro_record_t *rec, const char *path, bool for_set,
                            avro_value_t *cur, const lt_node **node) {
  int bi = -1, d = -1;
  const lt_node *bn = nonnull_branch(*node, &bi);
  if (!bn) return acc_fail(rec, path, "union has no value branch");
  avro_value_get_discriminant(cur, &d);
  avro_value_t b;
  if (d != bi) {
    if (!for_set) return acc_fail(rec, path, "is null"), LT_ERR_NOT_FOUND;
    if (avro_value_set_branch(cur, bi, &b)) return acc_fail(rec, path, "cannot select branch");
    if (lt_avro_value_init(rec, bn, &b)) return LT_ERR_INTERNAL;
  } else if (avro_value_get_current_branch(cur, &b)) {
    return acc_fail(rec, path, "cannot read union");
  }
  *cur = b;
  *node = bn;
  return LT_OK;
}

/* Steps *cur, an array (*node), to element idx; a setter (for_set) may append at [size]. */
static lt_err_t enter_index(lt_avro_record_t *rec, const char *path, bool for_set,
                            unsigned long long idx, avro_value_t *cur, const lt_node **node) {
  if ((*node)->type != AVRO_ARRAY)
    return acc_fail(rec, path, "indexes a %s, not an array", lt_avro_type_word(*node));
  size_t size = 0;
  avro_value_get_size(cur, &size);
  avro_value_t e;
  if (idx < size) {
    if (avro_value_get_by_index(cur, (size_t)idx, &e, NULL))
      return acc_fail(rec, path, "cannot read element");
  } else if (idx == size && for_set) {
    if (avro_value_append(cur, &e, NULL) || lt_avro_value_init(rec, (*node)->items, &e))
      return acc_fail(rec, path, "cannot append");
  } else {
    return acc_fail(rec, path, "index %llu out of range (array has %zu elements)", idx, size);
  }
  *cur = e;
  *node = (*node)->items;
  return LT_OK;
}

/* Steps *cur, a record (*node), to its field named by the len bytes at name. */
static lt_err_t enter_field(lt_avro_record_t *rec, const char *path, const char *name, size_t len,
                            avro_value_t *cur, const lt_node **node) {
  const lt_node *r = *node;
  if (r->type != AVRO_RECORD) return acc_fail(rec, path, "%s has no fields", lt_avro_type_word(r));
  size_t i;
  for (i = 0; i < r->nfields; i++)
    if (strncmp(r->fields[i].name, name, len) == 0 && r->fields[i].name[len] == '\0') break;
  if (i == r->nfields)
    return acc_fail(rec, path, "no field \"%.*s\" in %s", (int)len, name, r->name);
  avro_value_t f;
  if (avro_value_get_by_index(cur, i, &f, NULL)) return acc_fail(rec, path, "cannot read field");
  *cur = f;
  *node = r->fields[i].type;
  return LT_OK;
}

/* Walks path from the record root. On success *v and *n are the target value and its schema
 * node (possibly a union). for_set: step into unions' value branch and append at [size]. */
static lt_err_t resolve_path(lt_avro_record_t *rec, const char *path, bool for_set,
                             avro_value_t *v, const lt_node **n) {
  avro_value_t cur = rec->value;
  const lt_node *node = rec->schema->root;
  const char *p = path;
  lt_err_t rc;
  if (!p || !*p) return acc_fail(rec, "", "empty field path");
  do {
    /* Step through a union into its non-null branch before a '.' or '['. */
    if (node->type == AVRO_UNION && (rc = enter_union(rec, path, for_set, &cur, &node))) return rc;
    if (*p == '[') {
      char *endp;
      unsigned long long idx = strtoull(p + 1, &endp, 10);
      if (endp == p + 1 || *endp != ']') return acc_fail(rec, path, "bad index syntax");
      if ((rc = enter_index(rec, path, for_set, idx, &cur, &node))) return rc;
      p = endp + 1;
    } else {
      if (*p == '.') p++;
      size_t len = strcspn(p, ".[");
      if ((rc = enter_field(rec, path, p, len, &cur, &node))) return rc;
      p += len;
    }
  } while (*p);
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
          if (avro_value_set_branch(v, (int)i, &b))
            return acc_fail(rec, path, "cannot select branch");
          if (d != (int)i && lt_avro_value_init(rec, u->branches[i], &b)) return LT_ERR_INTERNAL;
          *v = b;
          *n = u->branches[i];
          return LT_OK;
        }
    return acc_fail(rec, path, "union has no branch of this type");
  }
  for (size_t t = 0; t < ntypes; t++)
    if ((*n)->type == types[t]) return LT_OK;
  return acc_fail(rec, path, "is a %s", lt_avro_type_word(*n));
}

/* A setter's argument before the field's type is known: the schema types it may be stored as,
 * preferred first (want[1] == want[0] when only one fits), and the C value. */
typedef struct lt_in {
  avro_type_t want[2];
  union {
    bool b;
    int64_t i; /* int and long */
    double d;  /* double and float */
    struct {   /* string and bytes */
      const void *p;
      size_t len;
      bool nul; /* p[len] is a NUL: avro-c may copy from p itself */
    };
    const char *symbol;
  };
} lt_in;

/* Sets enum value v (of node n) to symbol; the message lists the symbols when it is not one. */
static lt_err_t set_symbol(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                           const lt_node *n, const char *symbol) {
  for (size_t i = 0; symbol && i < n->nsymbols; i++)
    if (strcmp(n->symbols[i], symbol) == 0)
      return avro_value_set_enum(v, (int)i) ? LT_ERR_INTERNAL : LT_OK;
  lt_sb sb = {0};
  lt_avro_sb_symbols(&sb, n);
  acc_fail(rec, path, "\"%s\" is not one of %s", symbol ? symbol : "(null)", sb.p ? sb.p : "");
  free(sb.p);
  return LT_ERR_INVALID;
}

/* Every setter: stores x at path, converted to the type found there. */
static lt_err_t set_path(lt_avro_record_t *rec, const char *path, const lt_in *x) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_set(rec, path, x->want, 2, &v, &n);
  if (rc) return rc;
  switch (n->type) {
    case AVRO_NULL: return avro_value_set_null(&v) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_BOOLEAN: return avro_value_set_boolean(&v, x->b) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT32:
      if (x->i < INT32_MIN || x->i > INT32_MAX)
        return acc_fail(rec, path, "%" PRId64 " does not fit an int", x->i);
      return avro_value_set_int(&v, (int32_t)x->i) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_INT64: return avro_value_set_long(&v, x->i) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_DOUBLE: return avro_value_set_double(&v, x->d) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FLOAT: return avro_value_set_float(&v, (float)x->d) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_STRING:
      if (x->nul) return avro_value_set_string_len(&v, x->p, x->len + 1) ? LT_ERR_NOMEM : LT_OK;
      return lt_avro_value_string(rec, &v, x->p, x->len) ? LT_ERR_NOMEM : LT_OK;
    case AVRO_BYTES:
      return avro_value_set_bytes(&v, (void *)(x->p ? x->p : ""), x->len) ? LT_ERR_NOMEM : LT_OK;
    case AVRO_FIXED:
      if (x->len != (size_t)n->size)
        return acc_fail(rec, path, "fixed needs %" PRId64 " bytes, got %zu", n->size, x->len);
      return avro_value_set_fixed(&v, (void *)x->p, x->len) ? LT_ERR_NOMEM : LT_OK;
    case AVRO_ENUM: return set_symbol(rec, path, &v, n, x->symbol);
    default: return acc_fail(rec, path, "is a %s", lt_avro_type_word(n));
  }
}

lt_err_t lt_avro_set_null(lt_avro_record_t *rec, const char *path) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_NULL, AVRO_NULL}});
}

lt_err_t lt_avro_set_bool(lt_avro_record_t *rec, const char *path, bool b) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_BOOLEAN, AVRO_BOOLEAN}, .b = b});
}

lt_err_t lt_avro_set_int(lt_avro_record_t *rec, const char *path, int32_t x) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_INT32, AVRO_INT64}, .i = x});
}

lt_err_t lt_avro_set_long(lt_avro_record_t *rec, const char *path, int64_t x) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_INT64, AVRO_INT32}, .i = x});
}

lt_err_t lt_avro_set_double(lt_avro_record_t *rec, const char *path, double x) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_DOUBLE, AVRO_FLOAT}, .d = x});
}

lt_err_t lt_avro_set_string_len(lt_avro_record_t *rec, const char *path, const char *s,
                                size_t len) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_STRING, AVRO_STRING}, .p = s, .len = len});
}

lt_err_t lt_avro_set_string(lt_avro_record_t *rec, const char *path, const char *s) {
  if (!s) return acc_fail(rec, path, "NULL string (use lt_avro_set_null)");
  lt_in x = {.want = {AVRO_STRING, AVRO_STRING}, .p = s, .len = strlen(s), .nul = true};
  return set_path(rec, path, &x);
}

lt_err_t lt_avro_set_bytes(lt_avro_record_t *rec, const char *path, const void *p, size_t len) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_BYTES, AVRO_FIXED}, .p = p, .len = len});
}

lt_err_t lt_avro_set_enum(lt_avro_record_t *rec, const char *path, const char *symbol) {
  return set_path(rec, path, &(lt_in){.want = {AVRO_ENUM, AVRO_ENUM}, .symbol = symbol});
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

/* Fails an access to a value of node n that is not `what` ("a string"). */
static lt_err_t wrong_type(lt_avro_record_t *rec, const char *path, const lt_node *n, const char *what) {
  return acc_fail(rec, path, "is a %s, not %s", lt_avro_type_word(n), what);
}

/* The typed tails of the getters: v and n are the target after step_for_get, path names it in
 * messages; out (and len: strings, bytes) are the public getter's, out of the type it names. */
typedef lt_err_t (*lt_reader)(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                              const lt_node *n, void *out, size_t *len);

static lt_err_t read_bool(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                          const lt_node *n, void *out, size_t *len) {
  if (n->type != AVRO_BOOLEAN) return wrong_type(rec, path, n, "a boolean");
  int b = 0;
  avro_value_get_boolean(v, &b);
  *(bool *)out = b != 0;
  return LT_OK;
}

static lt_err_t read_int(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                         const lt_node *n, void *out, size_t *len) {
  if (n->type != AVRO_INT32) return wrong_type(rec, path, n, "an int");
  return avro_value_get_int(v, out) ? LT_ERR_INTERNAL : LT_OK;
}

static lt_err_t read_long(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                          const lt_node *n, void *out, size_t *len) {
  if (n->type == AVRO_INT32) {
    int32_t x = 0;
    avro_value_get_int(v, &x);
    *(int64_t *)out = x;
    return LT_OK;
  }
  if (n->type != AVRO_INT64) return wrong_type(rec, path, n, "a long");
  return avro_value_get_long(v, out) ? LT_ERR_INTERNAL : LT_OK;
}

static lt_err_t read_double(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                            const lt_node *n, void *out, size_t *len) {
  double *d = out;
  switch (n->type) {
    case AVRO_DOUBLE: return avro_value_get_double(v, d) ? LT_ERR_INTERNAL : LT_OK;
    case AVRO_FLOAT: { float f = 0; avro_value_get_float(v, &f); *d = f; return LT_OK; }
    case AVRO_INT32: { int32_t x = 0; avro_value_get_int(v, &x); *d = x; return LT_OK; }
    case AVRO_INT64: { int64_t x = 0; avro_value_get_long(v, &x); *d = (double)x; return LT_OK; }
    default: return wrong_type(rec, path, n, "a number");
  }
}

static lt_err_t read_string(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                            const lt_node *n, void *out, size_t *len) {
  const char **s = out;
  if (n->type != AVRO_STRING) return wrong_type(rec, path, n, "a string");
  size_t size = 0;
  if (avro_value_get_string(v, s, &size)) return LT_ERR_INTERNAL;
  if (!*s) *s = "";
  if (len) *len = size ? size - 1 : 0;
  return LT_OK;
}

static lt_err_t read_bytes(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                           const lt_node *n, void *out, size_t *len) {
  const void **p = out;
  size_t size = 0;
  lt_err_t rc;
  if (n->type == AVRO_BYTES) rc = avro_value_get_bytes(v, p, &size) ? LT_ERR_INTERNAL : LT_OK;
  else if (n->type == AVRO_FIXED) rc = avro_value_get_fixed(v, p, &size) ? LT_ERR_INTERNAL : LT_OK;
  else return wrong_type(rec, path, n, "bytes");
  if (!*p) *p = "";
  *len = size;
  return rc;
}

static lt_err_t read_enum(lt_avro_record_t *rec, const char *path, avro_value_t *v,
                          const lt_node *n, void *out, size_t *len) {
  if (n->type != AVRO_ENUM) return wrong_type(rec, path, n, "an enum");
  int e = 0;
  avro_value_get_enum(v, &e);
  if (e < 0 || (size_t)e >= n->nsymbols) return acc_fail(rec, path, "enum out of range");
  *(const char **)out = n->symbols[e];
  return LT_OK;
}

/* Every getter by path: the value at path, read by read. */
static lt_err_t get_path(lt_avro_record_t *rec, const char *path, lt_reader read, void *out,
                         size_t *len) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = target_for_get(rec, path, &v, &n);
  return rc ? rc : read(rec, path, &v, n, out, len);
}

/* Every getter by index: top-level field `field`, read by read (messages name the field). */
static lt_err_t get_at(lt_avro_record_t *rec, int field, lt_reader read, void *out, size_t *len) {
  avro_value_t v;
  const lt_node *n;
  const char *name = NULL;
  lt_err_t rc = target_at(rec, field, &v, &n, &name);
  return rc ? rc : read(rec, name, &v, n, out, len);
}

lt_err_t lt_avro_get_bool(lt_avro_record_t *rec, const char *path, bool *out) {
  return get_path(rec, path, read_bool, out, NULL);
}

lt_err_t lt_avro_get_int(lt_avro_record_t *rec, const char *path, int32_t *out) {
  return get_path(rec, path, read_int, out, NULL);
}

lt_err_t lt_avro_get_long(lt_avro_record_t *rec, const char *path, int64_t *out) {
  return get_path(rec, path, read_long, out, NULL);
}

lt_err_t lt_avro_get_double(lt_avro_record_t *rec, const char *path, double *out) {
  return get_path(rec, path, read_double, out, NULL);
}

lt_err_t lt_avro_get_string(lt_avro_record_t *rec, const char *path, const char **s, size_t *len) {
  return get_path(rec, path, read_string, s, len);
}

lt_err_t lt_avro_get_bytes(lt_avro_record_t *rec, const char *path, const void **p, size_t *len) {
  return get_path(rec, path, read_bytes, p, len);
}

lt_err_t lt_avro_get_enum(lt_avro_record_t *rec, const char *path, const char **symbol) {
  return get_path(rec, path, read_enum, symbol, NULL);
}

lt_err_t lt_avro_get_bool_at(lt_avro_record_t *rec, int field, bool *out) {
  return get_at(rec, field, read_bool, out, NULL);
}

lt_err_t lt_avro_get_int_at(lt_avro_record_t *rec, int field, int32_t *out) {
  return get_at(rec, field, read_int, out, NULL);
}

lt_err_t lt_avro_get_long_at(lt_avro_record_t *rec, int field, int64_t *out) {
  return get_at(rec, field, read_long, out, NULL);
}

lt_err_t lt_avro_get_string_at(lt_avro_record_t *rec, int field, const char **s, size_t *len) {
  return get_at(rec, field, read_string, s, len);
}

lt_err_t lt_avro_get_enum_at(lt_avro_record_t *rec, int field, const char **symbol) {
  return get_at(rec, field, read_enum, symbol, NULL);
}

/* As lt_avro_get_string(rec, "<field>[<i>]"): the same steps resolve_path and target_for_get
 * take, without parsing a path. */
lt_err_t lt_avro_get_array_string_at(lt_avro_record_t *rec, int field, size_t i, const char **s,
                                     size_t *len) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = field_at(rec, field, &v, &n);
  if (rc) return rc;
  char path[96];
  snprintf(path, sizeof path, "%s[%zu]", rec->schema->root->fields[field].name, i);
  if (n->type == AVRO_UNION && (rc = enter_union(rec, path, false, &v, &n))) return rc;
  if ((rc = enter_index(rec, path, false, i, &v, &n))) return rc;
  if ((n->type == AVRO_UNION || n->type == AVRO_NULL) && (rc = step_for_get(rec, path, &v, &n)))
    return rc;
  return read_string(rec, path, &v, n, s, len);
}

/* The array or map at path (a nullable one: its non-null branch selected), for get or set. */
static lt_err_t container_target(lt_avro_record_t *rec, const char *path, bool for_set, avro_type_t type,
                                 avro_value_t *v, const lt_node **n) {
  lt_err_t rc = for_set ? resolve_path(rec, path, true, v, n) : target_for_get(rec, path, v, n);
  if (rc) return rc;
  if ((*n)->type == AVRO_UNION) {
    const avro_type_t t[] = {type};
    return target_for_set(rec, path, t, 1, v, n);
  }
  if ((*n)->type != type) return wrong_type(rec, path, *n, type == AVRO_ARRAY ? "an array" : "a map");
  return LT_OK;
}

static lt_err_t array_target(lt_avro_record_t *rec, const char *path, bool for_set, avro_value_t *v,
                             const lt_node **n) {
  return container_target(rec, path, for_set, AVRO_ARRAY, v, n);
}

/* Element count of the array or map at path. */
static lt_err_t container_size(lt_avro_record_t *rec, const char *path, avro_type_t type, size_t *count) {
  avro_value_t v;
  const lt_node *n;
  lt_err_t rc = container_target(rec, path, false, type, &v, &n);
  if (rc) return rc;
  return avro_value_get_size(&v, count) ? LT_ERR_INTERNAL : LT_OK;
}

lt_err_t lt_avro_array_size(lt_avro_record_t *rec, const char *path, size_t *count) {
  return container_size(rec, path, AVRO_ARRAY, count);
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
  rc = lt_avro_value_init(rec, n->items, &e);
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

/* Maps of strings (or nullable maps): the value under key set, and entry i read back. */
static lt_err_t map_target(lt_avro_record_t *rec, const char *path, bool for_set, avro_value_t *v,
                           const lt_node **n) {
  lt_err_t rc = container_target(rec, path, for_set, AVRO_MAP, v, n);
  if (!rc && (*n)->items->type != AVRO_STRING) return acc_fail(rec, path, "is not a map of strings");
  return rc;
}

lt_err_t lt_avro_map_set_string(lt_avro_record_t *rec, const char *path, const char *key, const char *s) {
  avro_value_t v, e;
  const lt_node *n;
  lt_err_t rc = map_target(rec, path, true, &v, &n);
  if (rc) return rc;
  if (!key || !s) return acc_fail(rec, path, "NULL key or value");
  if (avro_value_add(&v, key, &e, NULL, NULL)) return acc_fail(rec, path, "cannot add to the map");
  return avro_value_set_string_len(&e, s, strlen(s) + 1) ? LT_ERR_NOMEM : LT_OK;
}

lt_err_t lt_avro_map_size(lt_avro_record_t *rec, const char *path, size_t *count) {
  return container_size(rec, path, AVRO_MAP, count);
}

lt_err_t lt_avro_map_get_string_at(lt_avro_record_t *rec, const char *path, size_t i, const char **key,
                                   const char **s) {
  avro_value_t v, e;
  const lt_node *n;
  lt_err_t rc = map_target(rec, path, false, &v, &n);
  if (rc) return rc;
  size_t len;
  if (avro_value_get_by_index(&v, i, &e, key) || avro_value_get_string(&e, s, &len))
    return acc_fail(rec, path, "no such entry");
  return LT_OK;
}

lt_err_t lt_avro_record_stamp(lt_avro_record_t *rec, const char *producer) {
  char id[37];
  lt_avro_uuid(id);
  lt_err_t rc = lt_avro_set_string(rec, "event_id", id);
  if (!rc) rc = lt_avro_set_long(rec, "occurred_at", lt_time_wall_ms());
  if (!rc) rc = lt_avro_set_string(rec, "producer", producer ? producer : "");
  return rc;
}
