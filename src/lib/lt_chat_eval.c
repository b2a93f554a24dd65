/* lt_chat_eval: evaluating a parsed chat template (lt_chat_int.h).
 *
 * Values are jansson values (string, integer, real, true/false, null for none, arrays, objects);
 * Jinja's undefined is a NULL pointer, so it renders as "" and is falsy. A namespace() is an
 * object carrying a marker key, the one value `{% set ns.attr %}` may change. Scopes are a stack
 * of objects: a for loop pushes one, so what is set inside it does not leak out, as in Jinja.
 * Every evaluated node costs a step and output is capped, so no template runs away. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_chat_int.h"

#define CH_MAX_OUT (1u << 20)      /* 1 MiB of rendered prompt, or of any string built */
#define CH_MAX_STEPS 2000000       /* evaluated nodes; a real template uses a few per message */
#define CH_MAX_LIST 100000        /* items of a list the template builds */
#define CH_NS_MARK "\x01namespace" /* the key that makes an object a namespace() */

typedef struct {
  char *p;
  size_t n, cap;
} sbuf_t;

typedef struct {
  json_t *frames; /* array of objects, innermost last */
  long steps;
  sbuf_t out;
  lt_err_t err;
  char *errstr;
  size_t errstr_size;
} ev_t;

static void fail(ev_t *e, lt_err_t err, const ch_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail(ev_t *e, lt_err_t err, const ch_node_t *n, const char *fmt, ...) {
  if (e->err != LT_OK) return;
  char m[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m, sizeof m, fmt, ap);
  va_end(ap);
  e->err = lt_errf(e->errstr, e->errstr_size, err, "chat template line %d, column %d: %s",
                   n ? n->line : 0, n ? n->col : 0, m);
}

static void put(ev_t *e, sbuf_t *b, const char *s, size_t n, const ch_node_t *at) {
  if (e->err) return;
  if (b->n + n > CH_MAX_OUT) {
    fail(e, LT_ERR_INVALID, at, "output over %u bytes: the template runs away", CH_MAX_OUT);
    return;
  }
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) { fail(e, LT_ERR_NOMEM, at, "out of memory"); return; }
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

/* ---------------------------------------------------------------- values */

static const char *type_name(const json_t *v) {
  if (!v) return "undefined";
  switch (json_typeof(v)) {
  case JSON_STRING: return "string";
  case JSON_INTEGER: return "integer";
  case JSON_REAL: return "float";
  case JSON_TRUE: case JSON_FALSE: return "boolean";
  case JSON_NULL: return "none";
  case JSON_ARRAY: return "list";
  default: return json_object_get(v, CH_NS_MARK) ? "namespace" : "dict";
  }
}

static bool truthy(const json_t *v) {
  if (!v) return false;
  switch (json_typeof(v)) {
  case JSON_STRING: return json_string_length(v) > 0;
  case JSON_INTEGER: return json_integer_value(v) != 0;
  case JSON_REAL: return json_real_value(v) != 0;
  case JSON_TRUE: return true;
  case JSON_ARRAY: return json_array_size(v) > 0;
  case JSON_OBJECT: return json_object_size(v) > 0;
  default: return false;
  }
}

static json_t *str_new(const char *s, size_t n) { return json_stringn_nocheck(s, n); }

/* Appends v as Jinja prints it: strings as they are, True/False/None, numbers in decimal. */
static void put_value(ev_t *e, sbuf_t *b, const json_t *v, const ch_node_t *at) {
  char num[64];
  if (!v) return;
  switch (json_typeof(v)) {
  case JSON_STRING: put(e, b, json_string_value(v), json_string_length(v), at); return;
  case JSON_INTEGER: snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)); break;
  case JSON_REAL: snprintf(num, sizeof num, "%.17g", json_real_value(v)); break;
  case JSON_TRUE: snprintf(num, sizeof num, "True"); break;
  case JSON_FALSE: snprintf(num, sizeof num, "False"); break;
  case JSON_NULL: snprintf(num, sizeof num, "None"); break;
  default: {
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (s) put(e, b, s, strlen(s), at);
    free(s);
    return;
  }
  }
  put(e, b, num, strlen(num), at);
}

static json_t *to_string(ev_t *e, const json_t *v, const ch_node_t *at) {
  if (json_is_string(v)) return json_incref((json_t *)v);
  sbuf_t b = {0};
  put_value(e, &b, v, at);
  json_t *r = e->err ? NULL : str_new(b.p ? b.p : "", b.n);
  free(b.p);
  return r;
}

/* Number of code points of a UTF-8 string. */
static size_t utf8_len(const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
  return k;
}

/* Byte offset of code point i. */
static size_t utf8_off(const char *s, size_t n, size_t i) {
  size_t b = 0;
  while (b < n && i > 0) {
    b++;
    while (b < n && ((unsigned char)s[b] & 0xC0) == 0x80) b++;
    i--;
  }
  return b;
}

static bool equal(const json_t *a, const json_t *b) {
  if (!a || !b) return !a && !b;
  if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
  return json_equal((json_t *)a, (json_t *)b);
}

/* ---------------------------------------------------------------- scopes */

static json_t *lookup(ev_t *e, const char *name) {
  for (size_t i = json_array_size(e->frames); i-- > 0;) {
    json_t *v = json_object_get(json_array_get(e->frames, i), name);
    if (v) return json_incref(v);
  }
  return NULL;
}

static void assign(ev_t *e, const char *name, json_t *v) {
  json_t *top = json_array_get(e->frames, json_array_size(e->frames) - 1);
  if (v) json_object_set(top, name, v);
  else json_object_del(top, name);
}

/* ---------------------------------------------------------------- operators */

static json_t *eval(ev_t *e, const ch_node_t *n);

static json_t *arith(ev_t *e, const ch_node_t *n, const json_t *a, const json_t *b) {
  int op = n->op;
  if (op == OP_ADD && json_is_string(a) && json_is_string(b)) {
    sbuf_t s = {0};
    put(e, &s, json_string_value(a), json_string_length(a), n);
    put(e, &s, json_string_value(b), json_string_length(b), n);
    json_t *r = e->err ? NULL : str_new(s.p ? s.p : "", s.n);
    free(s.p);
    return r;
  }
  if (op == OP_ADD && json_is_array(a) && json_is_array(b)) {
    if (json_array_size(a) + json_array_size(b) > CH_MAX_LIST) {
      fail(e, LT_ERR_INVALID, n, "list over %d items: the template runs away", CH_MAX_LIST);
      return NULL;
    }
    json_t *r = json_copy((json_t *)a);
    json_array_extend(r, (json_t *)b);
    return r;
  }
  if (op == OP_MUL && json_is_string(a) && json_is_integer(b)) {
    sbuf_t s = {0};
    for (json_int_t i = 0; json_string_length(a) && i < json_integer_value(b) && !e->err; i++)
      put(e, &s, json_string_value(a), json_string_length(a), n);
    json_t *r = e->err ? NULL : str_new(s.p ? s.p : "", s.n);
    free(s.p);
    return r;
  }
  if (!json_is_number(a) || !json_is_number(b) || json_is_boolean(a)) {
    static const char *names[] = {"+", "-", "*", "/", "//", "%"};
    fail(e, LT_ERR_INVALID, n, "cannot apply '%s' to %s and %s", names[op], type_name(a),
         type_name(b));
    return NULL;
  }
  if (json_is_integer(a) && json_is_integer(b) && op != OP_DIV) {
    long long x = json_integer_value(a), y = json_integer_value(b), r = 0;
    if ((op == OP_FDIV || op == OP_MOD) && y == 0) {
      fail(e, LT_ERR_INVALID, n, "division by zero");
      return NULL;
    }
    switch (op) {
    case OP_ADD: r = (long long)((unsigned long long)x + (unsigned long long)y); break;
    case OP_SUB: r = (long long)((unsigned long long)x - (unsigned long long)y); break;
    case OP_MUL: r = (long long)((unsigned long long)x * (unsigned long long)y); break;
    case OP_FDIV: r = (y == -1) ? (long long)(0ULL - (unsigned long long)x) : x / y - ((x % y != 0) && ((x < 0) != (y < 0))); break;
    default: r = (y == -1) ? 0 : x % y; if (r != 0 && ((r < 0) != (y < 0))) r += y; break;
    }
    return json_integer(r);
  }
  double x = json_number_value(a), y = json_number_value(b);
  if ((op == OP_DIV || op == OP_FDIV || op == OP_MOD) && y == 0) {
    fail(e, LT_ERR_INVALID, n, "division by zero");
    return NULL;
  }
  fail(e, LT_ERR_UNSUPPORTED, n, "floating-point arithmetic is not supported");
  (void)x;
  return NULL;
}

static bool contains(const json_t *hay, const json_t *needle) {
  if (json_is_string(hay))
    return json_is_string(needle) &&
           strstr(json_string_value(hay), json_string_value(needle)) != NULL;
  if (json_is_array(hay)) {
    for (size_t i = 0; i < json_array_size(hay); i++)
      if (equal(json_array_get(hay, i), needle)) return true;
    return false;
  }
  if (json_is_object(hay))
    return json_is_string(needle) && json_object_get(hay, json_string_value(needle)) != NULL;
  return false;
}

static json_t *binop(ev_t *e, const ch_node_t *n) {
  json_t *a = eval(e, n->a), *b = e->err ? NULL : eval(e, n->b), *r = NULL;
  if (e->err) goto done;
  switch (n->op) {
  case OP_EQ: r = json_boolean(equal(a, b)); break;
  case OP_NE: r = json_boolean(!equal(a, b)); break;
  case OP_IN: case OP_NOTIN:
    if (!json_is_string(b) && !json_is_array(b) && !json_is_object(b)) {
      fail(e, LT_ERR_INVALID, n, "'in' needs a string, list or dict on the right, not %s",
           type_name(b));
      break;
    }
    r = json_boolean(contains(b, a) == (n->op == OP_IN));
    break;
  case OP_LT: case OP_GT: case OP_LE: case OP_GE: {
    int c;
    if (json_is_number(a) && json_is_number(b))
      c = (json_number_value(a) > json_number_value(b)) -
          (json_number_value(a) < json_number_value(b));
    else if (json_is_string(a) && json_is_string(b))
      c = strcmp(json_string_value(a), json_string_value(b));
    else {
      fail(e, LT_ERR_INVALID, n, "cannot compare %s with %s", type_name(a), type_name(b));
      break;
    }
    r = json_boolean(n->op == OP_LT   ? c < 0
                     : n->op == OP_GT ? c > 0
                     : n->op == OP_LE ? c <= 0
                                      : c >= 0);
    break;
  }
  case OP_CAT: {
    json_t *x = to_string(e, a, n), *y = to_string(e, b, n);
    if (!e->err) r = arith(e, &(ch_node_t){.op = OP_ADD, .line = n->line, .col = n->col}, x, y);
    json_decref(x);
    json_decref(y);
    break;
  }
  default: r = arith(e, n, a, b); break;
  }
done:
  json_decref(a);
  json_decref(b);
  return r;
}

/* ---------------------------------------------------------------- access */

/* Python's slice of a sequence of len elements: the indices it visits. */
static size_t slice_idx(ev_t *e, const ch_node_t *n, long long len, long long *start,
                        long long *step) {
  json_t *lo = n->b ? eval(e, n->b) : NULL, *hi = n->c ? eval(e, n->c) : NULL;
  json_t *st = n->kids[0] ? eval(e, n->kids[0]) : NULL;
  long long s = 1, a, b;
  size_t cnt = 0;
  if ((lo && !json_is_null(lo) && !json_is_integer(lo)) ||
      (hi && !json_is_null(hi) && !json_is_integer(hi)) ||
      (st && !json_is_null(st) && !json_is_integer(st))) {
    fail(e, LT_ERR_INVALID, n, "slice bounds must be integers");
    goto done;
  }
  if (json_is_integer(st)) s = json_integer_value(st);
  if (s == 0) { fail(e, LT_ERR_INVALID, n, "slice step cannot be zero"); goto done; }
  a = json_is_integer(lo) ? json_integer_value(lo) : (s > 0 ? 0 : len - 1);
  b = json_is_integer(hi) ? json_integer_value(hi) : (s > 0 ? len : -len - 1);
  if (json_is_integer(lo) && a < 0) a += len;
  if (json_is_integer(hi) && b < 0) b += len;
  if (s > 0) {
    a = a < 0 ? 0 : a > len ? len : a;
    b = b < 0 ? 0 : b > len ? len : b;
    cnt = b > a ? (size_t)((b - a + s - 1) / s) : 0;
  } else {
    a = a < -1 ? -1 : a > len - 1 ? len - 1 : a;
    b = b < -1 ? -1 : b > len - 1 ? len - 1 : b;
    cnt = a > b ? (size_t)((a - b - s - 1) / -s) : 0;
  }
  *start = a;
  *step = s;
done:
  json_decref(lo);
  json_decref(hi);
  json_decref(st);
  return cnt;
}

static json_t *slice(ev_t *e, const ch_node_t *n) {
  json_t *obj = eval(e, n->a), *r = NULL;
  if (e->err) goto done;
  if (!json_is_array(obj) && !json_is_string(obj)) {
    fail(e, LT_ERR_INVALID, n, "cannot slice %s", type_name(obj));
    goto done;
  }
  const char *s = json_string_value(obj);
  size_t sn = json_string_length(obj);
  long long len = json_is_array(obj) ? (long long)json_array_size(obj) : (long long)utf8_len(s, sn);
  long long start = 0, step = 1;
  size_t cnt = slice_idx(e, n, len, &start, &step);
  if (e->err) goto done;
  sbuf_t b = {0};
  r = json_is_array(obj) ? json_array() : NULL;
  for (size_t i = 0; i < cnt && !e->err; i++, start += step) {
    if (r) { json_array_append(r, json_array_get(obj, (size_t)start)); continue; }
    size_t o = utf8_off(s, sn, (size_t)start), o2 = utf8_off(s, sn, (size_t)start + 1);
    put(e, &b, s + o, o2 - o, n);
  }
  if (!json_is_array(obj) && !e->err) r = str_new(b.p ? b.p : "", b.n);
  free(b.p);
done:
  json_decref(obj);
  return r;
}

/* obj[key] / obj.key: a missing key or index is undefined, as in Jinja. */
static json_t *item(ev_t *e, const ch_node_t *n, json_t *obj, const json_t *key) {
  if (json_is_object(obj) && json_is_string(key))
    return json_incref(json_object_get(obj, json_string_value(key)));
  if ((json_is_array(obj) || json_is_string(obj)) && json_is_integer(key)) {
    long long i = json_integer_value(key);
    const char *s = json_string_value(obj);
    size_t sn = json_string_length(obj);
    long long len = s ? (long long)utf8_len(s, sn) : (long long)json_array_size(obj);
    if (i < 0) i += len;
    if (i < 0 || i >= len) return NULL;
    if (!s) return json_incref(json_array_get(obj, (size_t)i));
    size_t o = utf8_off(s, sn, (size_t)i);
    return str_new(s + o, utf8_off(s, sn, (size_t)i + 1) - o);
  }
  if (!obj || json_is_null(obj)) {
    fail(e, LT_ERR_INVALID, n, "%s has no attribute or item: it is %s",
         n->a->type == E_NAME ? n->a->name : "the value", type_name(obj));
  }
  return NULL;
}

static json_t *access_(ev_t *e, const ch_node_t *n) {
  json_t *obj = eval(e, n->a), *key = NULL, *r = NULL;
  if (e->err) goto done;
  key = n->type == E_ATTR ? json_string(n->name) : eval(e, n->b);
  if (!e->err) r = item(e, n, obj, key);
done:
  json_decref(obj);
  json_decref(key);
  return r;
}

/* ---------------------------------------------------------------- calls, filters, tests */

/* Arguments of a call, filter or test: positional into pos (after `self` when given), keyword
 * ones into kw. */
static bool args(ev_t *e, const ch_node_t *n, json_t *self, json_t *pos, json_t *kw) {
  if (self) json_array_append(pos, self);
  for (size_t i = 0; i < n->nkids && !e->err; i++) {
    json_t *v = eval(e, n->kids[i]);
    if (e->err) break;
    if (!v) v = json_null(); /* an undefined argument: none is the closest a list can hold */
    if (n->knames[i]) json_object_set_new(kw, n->knames[i], v);
    else json_array_append_new(pos, v);
  }
  return !e->err;
}

static json_t *ch_call_method(ev_t *e, const ch_node_t *n, json_t *self, const char *name,
                              json_t *pos, json_t *kw);
static json_t *ch_filter(ev_t *e, const ch_node_t *n, json_t *pos, json_t *kw);
static bool ch_test(ev_t *e, const ch_node_t *n, json_t *pos);

static json_t *call(ev_t *e, const ch_node_t *n) {
  json_t *pos = json_array(), *kw = json_object(), *self = NULL, *r = NULL;
  const ch_node_t *f = n->a;
  if (f->type == E_ATTR) {
    self = eval(e, f->a);
    if (!e->err && args(e, n, NULL, pos, kw)) r = ch_call_method(e, n, self, f->name, pos, kw);
  } else if (f->type == E_NAME && args(e, n, NULL, pos, kw)) {
    const char *fn = f->name;
    if (!strcmp(fn, "raise_exception")) {
      const char *msg = json_string_value(json_array_get(pos, 0));
      fail(e, LT_ERR_INVALID, n, "raise_exception: %s", msg ? msg : "(no message)");
    } else if (!strcmp(fn, "namespace")) {
      r = json_deep_copy(kw);
      json_object_set_new(r, CH_NS_MARK, json_true());
    } else if (!strcmp(fn, "range")) {
      json_t *a = json_array_get(pos, 0), *b = json_array_get(pos, 1);
      long long lo = b ? json_integer_value(a) : 0, hi = json_integer_value(b ? b : a);
      /* the count in unsigned: hi - lo overflows for bounds far apart */
      if (hi > lo && (unsigned long long)hi - (unsigned long long)lo > CH_MAX_LIST)
        fail(e, LT_ERR_INVALID, n, "range() over %d items", CH_MAX_LIST);
      r = json_array();
      for (long long i = lo; i < hi && !e->err; i++)
        if (json_array_append_new(r, json_integer(i))) fail(e, LT_ERR_NOMEM, n, "out of memory");
    } else {
      fail(e, LT_ERR_UNSUPPORTED, n, "unknown function \"%s\"", fn);
    }
  } else if (!e->err) {
    fail(e, LT_ERR_UNSUPPORTED, n, "only named functions and methods can be called");
  }
  json_decref(pos);
  json_decref(kw);
  json_decref(self);
  return e->err ? (json_decref(r), NULL) : r;
}

static json_t *filter_or_test(ev_t *e, const ch_node_t *n) {
  json_t *v = eval(e, n->a), *pos = json_array(), *kw = json_object(), *r = NULL;
  if (!e->err) {
    json_array_append(pos, v ? v : json_null()); /* slot 0: the operand */
    if (args(e, n, NULL, pos, kw)) {
      if (n->type == E_FILTER) {
        json_object_set_new(kw, "\x01" "defined", json_boolean(v != NULL));
        r = ch_filter(e, n, pos, kw);
      } else {
        bool t = !strcmp(n->name, "defined") ? v != NULL
                 : !strcmp(n->name, "undefined") ? v == NULL
                 : v ? ch_test(e, n, pos) : false;
        r = e->err ? NULL : json_boolean(t != (n->op != 0));
      }
    }
  }
  json_decref(v);
  json_decref(pos);
  json_decref(kw);
  return r;
}

/* ---------------------------------------------------------------- expressions */

static json_t *eval(ev_t *e, const ch_node_t *n) {
  if (e->err || !n) return NULL;
  if (++e->steps > CH_MAX_STEPS) {
    fail(e, LT_ERR_INVALID, n, "over %d evaluation steps: the template runs away", CH_MAX_STEPS);
    return NULL;
  }
  json_t *v;
  switch (n->type) {
  case E_LIT: return json_incref(n->lit);
  case E_NAME: return lookup(e, n->name);
  case E_ATTR: case E_ITEM: return access_(e, n);
  case E_SLICE: return slice(e, n);
  case E_BIN: return binop(e, n);
  case E_NOT: {
    v = eval(e, n->a);
    bool t = truthy(v);
    json_decref(v);
    return e->err ? NULL : json_boolean(!t);
  }
  case E_NEG:
    v = eval(e, n->a);
    if (!e->err && !json_is_integer(v))
      fail(e, LT_ERR_INVALID, n, "cannot negate %s", type_name(v));
    if (e->err) { json_decref(v); return NULL; }
    if (n->op) return v;
    json_t *neg = json_integer((json_int_t)(0ULL - (unsigned long long)json_integer_value(v))); /* wraps as + does */
    json_decref(v);
    return neg;
  case E_AND: case E_OR:
    v = eval(e, n->a);
    if (e->err || truthy(v) == (n->type == E_OR)) return v;
    json_decref(v);
    return eval(e, n->b);
  case E_COND: {
    v = eval(e, n->a);
    bool t = truthy(v);
    json_decref(v);
    return e->err ? NULL : eval(e, t ? n->b : n->c);
  }
  case E_CALL: return call(e, n);
  case E_FILTER: case E_TEST: return filter_or_test(e, n);
  case E_LIST: case E_DICT: {
    json_t *r = n->type == E_LIST ? json_array() : json_object();
    for (size_t i = 0; i < n->nkids && !e->err; i++) {
      json_t *x = eval(e, n->kids[i]);
      if (!x) x = json_null();
      if (n->type == E_LIST) { json_array_append_new(r, x); continue; }
      json_t *y = e->err ? NULL : eval(e, n->kids[++i]);
      if (!e->err && !json_is_string(x))
        fail(e, LT_ERR_UNSUPPORTED, n, "dict keys must be strings");
      if (!e->err) json_object_set_new(r, json_string_value(x), y ? y : json_null());
      json_decref(x);
    }
    if (e->err) { json_decref(r); return NULL; }
    return r;
  }
  default:
    fail(e, LT_ERR_INTERNAL, n, "unknown node type %d", n->type);
    return NULL;
  }
}

/* ---------------------------------------------------------------- statements */

static void exec(ev_t *e, const ch_node_t *s);

static void exec_for(ev_t *e, const ch_node_t *s) {
  json_t *it = eval(e, s->a), *items = NULL;
  if (e->err) return;
  if (json_is_array(it)) {
    items = json_incref(it);
  } else if (json_is_object(it)) { /* a dict iterates over its keys */
    items = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(it, k, v) json_array_append_new(items, json_string(k));
  } else if (it) {
    fail(e, LT_ERR_INVALID, s, "cannot loop over %s", type_name(it));
  } else {
    items = json_array(); /* undefined: no iterations */
  }
  json_decref(it);
  size_t len = json_array_size(items);
  if (!e->err && len == 0) exec(e, s->c);
  for (size_t i = 0; i < len && !e->err; i++) {
    if (++e->steps > CH_MAX_STEPS) {
      fail(e, LT_ERR_INVALID, s, "over %d evaluation steps: the template runs away", CH_MAX_STEPS);
      break;
    }
    json_t *frame = json_object(), *loop = json_object();
    json_object_set_new(loop, "index", json_integer((json_int_t)i + 1));
    json_object_set_new(loop, "index0", json_integer((json_int_t)i));
    json_object_set_new(loop, "revindex", json_integer((json_int_t)(len - i)));
    json_object_set_new(loop, "revindex0", json_integer((json_int_t)(len - i - 1)));
    json_object_set_new(loop, "first", json_boolean(i == 0));
    json_object_set_new(loop, "last", json_boolean(i + 1 == len));
    json_object_set_new(loop, "length", json_integer((json_int_t)len));
    if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
    if (i + 1 < len) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
    json_object_set_new(frame, "loop", loop);
    json_object_set(frame, s->name, json_array_get(items, i));
    json_array_append_new(e->frames, frame);
    exec(e, s->b);
    json_array_remove(e->frames, json_array_size(e->frames) - 1);
  }
  json_decref(items);
}

static void exec_set(ev_t *e, const ch_node_t *s) {
  json_t *v = eval(e, s->a);
  if (e->err) return;
  if (!s->attr) {
    assign(e, s->name, v);
  } else {
    json_t *ns = lookup(e, s->name);
    if (!json_is_object(ns) || !json_object_get(ns, CH_NS_MARK))
      fail(e, LT_ERR_INVALID, s, "cannot set %s.%s: %s is %s, not a namespace()", s->name, s->attr,
           s->name, type_name(ns));
    else
      json_object_set(ns, s->attr, v ? v : json_null());
    json_decref(ns);
  }
  json_decref(v);
}

static void exec(ev_t *e, const ch_node_t *s) {
  for (; s && !e->err; s = s->next) {
    if (++e->steps > CH_MAX_STEPS) {
      fail(e, LT_ERR_INVALID, s, "over %d evaluation steps: the template runs away", CH_MAX_STEPS);
      return;
    }
    switch (s->type) {
    case S_TEXT: put(e, &e->out, json_string_value(s->lit), json_string_length(s->lit), s); break;
    case S_OUT: {
      json_t *v = eval(e, s->a);
      put_value(e, &e->out, v, s);
      json_decref(v);
      break;
    }
    case S_IF: {
      json_t *v = eval(e, s->a);
      bool t = truthy(v);
      json_decref(v);
      if (!e->err) exec(e, t ? s->b : s->c);
      break;
    }
    case S_FOR: exec_for(e, s); break;
    case S_SET: exec_set(e, s); break;
    default: fail(e, LT_ERR_INTERNAL, s, "unknown statement type %d", s->type); break;
    }
  }
}

lt_err_t ch_eval_render(const ch_node_t *body, json_t *vars, char **out, char *errstr,
                        size_t errstr_size) {
  ev_t e = {.frames = json_array(), .errstr = errstr, .errstr_size = errstr_size};
  json_array_append(e.frames, vars);
  json_array_append_new(e.frames, json_object()); /* the template's own top-level sets */
  put(&e, &e.out, "", 0, NULL);
  exec(&e, body);
  json_decref(e.frames);
  if (e.err) {
    free(e.out.p);
    return e.err;
  }
  *out = e.out.p;
  return LT_OK;
}

/* ---------------------------------------------------------------- strings */

/* s stripped of `chars` (NULL: whitespace) on the left and/or right. */
static json_t *strip(const json_t *v, const char *chars, bool left, bool right) {
  const char *s = json_string_value(v);
  size_t a = 0, b = json_string_length(v);
#define CH_STRIPPABLE(c) (chars ? strchr(chars, (c)) != NULL && (c) : isspace((unsigned char)(c)))
  while (left && a < b && CH_STRIPPABLE(s[a])) a++;
  while (right && b > a && CH_STRIPPABLE(s[b - 1])) b--;
#undef CH_STRIPPABLE
  return str_new(s + a, b - a);
}

/* ASCII case mapping: mode 'u' upper, 'l' lower, 'c' capitalize, 't' title. */
static json_t *recase(const json_t *v, int mode) {
  size_t n = json_string_length(v);
  char *s = strndup(json_string_value(v), n);
  if (!s) return NULL;
  bool start = true;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    bool up = mode == 'u' || ((mode == 'c' && i == 0) || (mode == 't' && start));
    s[i] = (char)(up ? toupper(c) : tolower(c));
    start = !isalnum(c);
  }
  json_t *r = str_new(s, n);
  free(s);
  return r;
}

static json_t *split(ev_t *e, const ch_node_t *n, const json_t *v, const char *sep) {
  const char *s = json_string_value(v), *end = s + json_string_length(v);
  json_t *r = json_array();
  while (!e->err && s <= end) {
    if (!sep) {
      while (s < end && isspace((unsigned char)*s)) s++;
      if (s == end) break;
    }
    const char *q = s;
    if (sep) q = *sep ? strstr(s, sep) : NULL;
    else while (q < end && !isspace((unsigned char)*q)) q++;
    if (!q) q = end;
    json_array_append_new(r, str_new(s, (size_t)(q - s)));
    if (json_array_size(r) > CH_MAX_LIST)
      fail(e, LT_ERR_INVALID, n, "split() over %d items", CH_MAX_LIST);
    if (q == end) break;
    s = q + (sep ? strlen(sep) : 0);
  }
  return r;
}

static json_t *replace(ev_t *e, const ch_node_t *n, const json_t *v, const json_t *from,
                       const json_t *to) {
  if (!json_is_string(from) || !json_is_string(to) || !json_string_length(from)) {
    fail(e, LT_ERR_INVALID, n, "replace() needs two strings, the first not empty");
    return NULL;
  }
  const char *s = json_string_value(v), *f = json_string_value(from), *q;
  size_t fl = json_string_length(from);
  sbuf_t b = {0};
  while ((q = strstr(s, f))) {
    put(e, &b, s, (size_t)(q - s), n);
    put(e, &b, json_string_value(to), json_string_length(to), n);
    s = q + fl;
  }
  put(e, &b, s, strlen(s), n);
  json_t *r = e->err ? NULL : str_new(b.p ? b.p : "", b.n);
  free(b.p);
  return r;
}

/* A dict's items as [key, value] pairs (a namespace's marker left out). */
static json_t *items(const json_t *obj, int which) {
  json_t *r = json_array(), *v;
  const char *k;
  json_object_foreach((json_t *)obj, k, v) {
    if (!strcmp(k, CH_NS_MARK)) continue;
    if (which == 'k') json_array_append_new(r, json_string(k));
    else if (which == 'v') json_array_append(r, v);
    else json_array_append_new(r, json_pack("[sO]", k, v));
  }
  return r;
}

/* self.name(args): Python's string methods and dict.items/keys/values/get. */
static json_t *ch_call_method(ev_t *e, const ch_node_t *n, json_t *self, const char *name,
                              json_t *pos, json_t *kw) {
  const json_t *a0 = json_array_get(pos, 0);
  (void)kw;
  if (json_is_string(self)) {
    const char *s = json_string_value(self);
    size_t sn = json_string_length(self);
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip"))
      return strip(self, json_string_value(a0), name[0] != 'r', name[0] != 'l');
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
      if (!json_is_string(a0)) {
        fail(e, LT_ERR_INVALID, n, "%s() needs a string", name);
        return NULL;
      }
      size_t k = json_string_length(a0);
      const char *at = name[0] == 's' ? s : s + sn - (k <= sn ? k : 0);
      return json_boolean(k <= sn && !memcmp(at, json_string_value(a0), k));
    }
    if (!strcmp(name, "split")) return split(e, n, self, json_string_value(a0));
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") ||
        !strcmp(name, "capitalize"))
      return recase(self, name[0] == 'c' ? 'c' : name[0] == 't' ? 't' : name[0] == 'u' ? 'u' : 'l');
    if (!strcmp(name, "replace")) return replace(e, n, self, a0, json_array_get(pos, 1));
  } else if (json_is_object(self)) {
    if (!strcmp(name, "items")) return items(self, 'i');
    if (!strcmp(name, "keys")) return items(self, 'k');
    if (!strcmp(name, "values")) return items(self, 'v');
    if (!strcmp(name, "get") && json_is_string(a0)) {
      json_t *v = json_object_get(self, json_string_value(a0));
      return json_incref(v ? v : json_array_get(pos, 1));
    }
  }
  fail(e, LT_ERR_UNSUPPORTED, n, "unknown method \"%s\" of %s", name, type_name(self));
  return NULL;
}

/* ---------------------------------------------------------------- filters and tests */

static const char *const filters[] = {"trim", "length", "count", "upper", "lower", "capitalize",
  "title", "tojson", "default", "d", "string", "join", "first", "last", "list", "items",
  "replace", "selectattr", "rejectattr", "map", NULL};
static const char *const tests[] = {"defined", "undefined", "none", "string", "number", "integer",
  "boolean", "mapping", "iterable", "sequence", "true", "false", "odd", "even", "equalto", "eq",
  NULL};

static bool known(const char *const *names, const char *name) {
  for (size_t i = 0; names[i]; i++)
    if (!strcmp(names[i], name)) return true;
  return false;
}
bool ch_filter_known(const char *name) { return known(filters, name); }
bool ch_test_known(const char *name) { return known(tests, name); }

static json_t *tojson(ev_t *e, const ch_node_t *n, const json_t *v, const json_t *kw) {
  const json_t *ind = json_object_get(kw, "indent");
  size_t flags = JSON_ENCODE_ANY;
  if (json_is_integer(ind)) flags |= JSON_INDENT(json_integer_value(ind) & 31);
  char *s = json_dumps(v ? v : json_null(), flags);
  if (!s) { fail(e, LT_ERR_NOMEM, n, "out of memory"); return NULL; }
  json_t *r = json_string_nocheck(s);
  free(s);
  return r;
}

/* list | selectattr/rejectattr(attr[, test[, arg]]) and list | map(attribute=attr): items kept
 * by a test on one attribute (truthiness without a test), or that attribute of every item. */
static json_t *by_attr(ev_t *e, const ch_node_t *n, const json_t *list, json_t *pos, json_t *kw) {
  bool map = n->name[0] == 'm', reject = n->name[0] == 'r';
  const char *attr =
      json_string_value(map ? json_object_get(kw, "attribute") : json_array_get(pos, 1));
  const char *test = map ? NULL : json_string_value(json_array_get(pos, 2));
  if (!json_is_array(list) || !attr) {
    fail(e, LT_ERR_INVALID, n, "%s needs a list and an attribute name%s", n->name,
         map ? " (map(attribute='name'))" : "");
    return NULL;
  }
  if (test && !ch_test_known(test)) {
    fail(e, LT_ERR_UNSUPPORTED, n, "unknown test \"%s\"", test);
    return NULL;
  }
  json_t *r = json_array();
  for (size_t i = 0; i < json_array_size(list) && !e->err; i++) {
    json_t *it = json_array_get(list, i);
    json_t *v = json_is_object(it) ? json_object_get(it, attr) : NULL;
    if (map) { json_array_append(r, v ? v : json_null()); continue; }
    bool keep;
    if (!test) keep = truthy(v);
    else if (!strcmp(test, "defined") || !strcmp(test, "undefined"))
      keep = (v != NULL) == (test[0] == 'd');
    else if (!v) keep = false;
    else {
      json_t *arg = json_array_get(pos, 3);
      json_t *args = json_pack("[OO]", v, arg ? arg : json_null());
      ch_node_t t = *n;
      t.name = (char *)test;
      keep = ch_test(e, &t, args);
      json_decref(args);
    }
    if (keep != reject) json_array_append(r, it);
  }
  if (e->err) { json_decref(r); return NULL; }
  return r;
}

/* v | name(args): pos[0] is the operand (none when undefined: kw's marker says which). */
static json_t *ch_filter(ev_t *e, const ch_node_t *n, json_t *pos, json_t *kw) {
  const char *f = n->name;
  bool defined = json_is_true(json_object_get(kw, "\x01" "defined"));
  json_t *v = defined ? json_array_get(pos, 0) : NULL, *a1 = json_array_get(pos, 1);
  if (!strcmp(f, "default") || !strcmp(f, "d")) {
    bool use = !defined || (truthy(json_array_get(pos, 2)) && !truthy(v));
    if (use && !a1) return json_string("");
    return json_incref(use ? a1 : v);
  }
  if (!strcmp(f, "tojson")) return tojson(e, n, v, kw);
  if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr") || !strcmp(f, "map"))
    return by_attr(e, n, v, pos, kw);
  if (!strcmp(f, "length") || !strcmp(f, "count")) {
    if (json_is_string(v))
      return json_integer((json_int_t)utf8_len(json_string_value(v), json_string_length(v)));
    if (json_is_array(v)) return json_integer((json_int_t)json_array_size(v));
    if (json_is_object(v)) {
      json_t *k = items(v, 'k');
      json_t *r = json_integer((json_int_t)json_array_size(k));
      json_decref(k);
      return r;
    }
    if (!v) return json_integer(0);
  } else if (!strcmp(f, "list") && json_is_array(v)) {
    return json_incref(v);
  } else if (!strcmp(f, "items") && json_is_object(v)) {
    return items(v, 'i');
  } else if ((!strcmp(f, "first") || !strcmp(f, "last")) &&
             (json_is_array(v) || json_is_string(v))) {
    json_t *idx = json_integer(f[0] == 'f' ? 0 : -1), *r = item(e, n, v, idx);
    json_decref(idx);
    return r;
  } else if (!strcmp(f, "join") && json_is_array(v)) {
    sbuf_t b = {0};
    for (size_t i = 0; i < json_array_size(v) && !e->err; i++) {
      if (i && json_is_string(a1)) put(e, &b, json_string_value(a1), json_string_length(a1), n);
      put_value(e, &b, json_array_get(v, i), n);
    }
    json_t *r = e->err ? NULL : str_new(b.p ? b.p : "", b.n);
    free(b.p);
    return r;
  } else if (json_is_string(v) || !v || !json_is_array(v)) {
    /* the string filters: they work on the operand's string form, as in Jinja */
    json_t *s = v ? to_string(e, v, n) : json_string(""), *r = NULL;
    if (e->err) { json_decref(s); return NULL; }
    if (!strcmp(f, "string")) return s;
    if (!strcmp(f, "trim")) r = strip(s, json_string_value(a1), true, true);
    else if (!strcmp(f, "upper")) r = recase(s, 'u');
    else if (!strcmp(f, "lower")) r = recase(s, 'l');
    else if (!strcmp(f, "capitalize")) r = recase(s, 'c');
    else if (!strcmp(f, "title")) r = recase(s, 't');
    else if (!strcmp(f, "replace")) r = replace(e, n, s, a1, json_array_get(pos, 2));
    json_decref(s);
    if (r || e->err) return r;
  }
  fail(e, LT_ERR_INVALID, n, "filter \"%s\" does not apply to %s", f, type_name(v));
  return NULL;
}

/* v is name(args) for a defined v (pos[0]). */
static bool ch_test(ev_t *e, const ch_node_t *n, json_t *pos) {
  const char *t = n->name;
  const json_t *v = json_array_get(pos, 0);
  if (!strcmp(t, "none")) return json_is_null(v);
  if (!strcmp(t, "string")) return json_is_string(v);
  if (!strcmp(t, "number")) return json_is_number(v);
  if (!strcmp(t, "integer")) return json_is_integer(v);
  if (!strcmp(t, "boolean")) return json_is_boolean(v);
  if (!strcmp(t, "true")) return json_is_true(v);
  if (!strcmp(t, "false")) return json_is_false(v);
  if (!strcmp(t, "mapping")) return json_is_object(v);
  if (!strcmp(t, "iterable")) return json_is_array(v) || json_is_object(v) || json_is_string(v);
  if (!strcmp(t, "sequence")) return json_is_array(v) || json_is_object(v) || json_is_string(v);
  if (!strcmp(t, "odd") || !strcmp(t, "even")) {
    if (!json_is_integer(v)) {
      fail(e, LT_ERR_INVALID, n, "test \"%s\" needs an integer, not %s", t, type_name(v));
      return false;
    }
    return (json_integer_value(v) % 2 != 0) == (t[0] == 'o');
  }
  return equal(v, json_array_get(pos, 1)); /* equalto, eq */
}
