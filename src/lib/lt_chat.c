/* lt_chat: lexing and parsing a chat template, and the two public calls (lt_chat.h).
 *
 * The lexer applies the environment's whitespace rules as it cuts text (trim_blocks,
 * lstrip_blocks, `-` markers), so every token keeps the line and column it has in the template
 * the customer sees. The parser is recursive descent with Jinja's precedence and a depth limit;
 * evaluation lives in lt_chat_eval.c. */
#include "lt_chat.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lt_chat_int.h"

#define CH_MAX_DEPTH 200 /* nesting of expressions and blocks: far above any real template */

enum { K_EOF, K_TEXT, K_VAR, K_VAREND, K_BLOCK, K_BLOCKEND, K_NAME, K_STR, K_INT, K_OP };

typedef struct {
  int k, line, col;
  char *s;      /* K_TEXT, K_STR, K_NAME (owned) */
  size_t n;
  long long i;  /* K_INT */
  char op[3];   /* K_OP */
} tok_t;

typedef struct {
  const char *src;
  size_t len, pos;
  int line, col;
  tok_t *toks;
  size_t ntoks, cap, at; /* at: the parser's cursor */
  int depth, block_depth; /* expression nesting, block nesting */
  ch_node_t *all;
  lt_err_t err;
  char *errstr;
  size_t errstr_size;
} ch_t;

#define FAIL(p, e, ln, cl, ...)                                                     \
  do {                                                                              \
    if ((p)->err == LT_OK) {                                                        \
      char m_[256];                                                                 \
      snprintf(m_, sizeof m_, __VA_ARGS__);                                         \
      (p)->err = lt_errf((p)->errstr, (p)->errstr_size, (e),                        \
                         "chat template line %d, column %d: %s", (ln), (cl), m_);   \
    }                                                                               \
  } while (0)

/* ---------------------------------------------------------------- lexing */

/* Moves the cursor n bytes, counting lines and columns. */
static void adv(ch_t *p, size_t n) {
  for (; n > 0 && p->pos < p->len; n--, p->pos++) {
    if (p->src[p->pos] == '\n') { p->line++; p->col = 1; }
    else p->col++;
  }
}

static tok_t *push(ch_t *p, int k) {
  if (p->ntoks == p->cap) {
    size_t cap = p->cap ? p->cap * 2 : 64;
    tok_t *t = realloc(p->toks, cap * sizeof *t);
    if (!t) {
      p->err = lt_errf(p->errstr, p->errstr_size, LT_ERR_NOMEM, "out of memory");
      return NULL;
    }
    p->toks = t;
    p->cap = cap;
  }
  tok_t *t = &p->toks[p->ntoks++];
  memset(t, 0, sizeof *t);
  t->k = k;
  t->line = p->line;
  t->col = p->col;
  return t;
}

/* Emits src[a, b) as text, honouring a `-` after the previous tag (lstrip_all) and what the next
 * tag asks: `{%-`/`{{-`/`{#-` strip all trailing whitespace, a block or comment tag alone on its
 * line so far strips the spaces and tabs before it (lstrip_blocks). */
static void emit_text(ch_t *p, size_t a, size_t b, bool lstrip_all, int next_tag, bool next_dash,
                      int line, int col) {
  if (lstrip_all) while (a < b && isspace((unsigned char)p->src[a])) a++;
  if (next_dash) {
    while (b > a && isspace((unsigned char)p->src[b - 1])) b--;
  } else if (next_tag == '%' || next_tag == '#') {
    size_t e = b;
    while (e > a && (p->src[e - 1] == ' ' || p->src[e - 1] == '\t')) e--;
    if (e == 0 || p->src[e - 1] == '\n') b = e;
  }
  if (b <= a) return;
  tok_t *t = push(p, K_TEXT);
  if (!t) return;
  t->line = line;
  t->col = col;
  t->s = strndup(p->src + a, b - a);
  t->n = b - a;
  if (!t->s) p->err = LT_ERR_NOMEM;
}

/* Whether \e is an escape a string literal takes (others are the backslash itself). */
static bool known_escape(char e) { return e && strchr("ntr'\"\\", e); }

/* A string literal at the cursor (quotes included), unescaped into a token. */
static void lex_string(ch_t *p) {
  char q = p->src[p->pos];
  int line = p->line, col = p->col;
  /* its bytes, as the loop below reads them: a buffer of the rest of the template for every
   * literal was quadratic (200,000 literals of a 1.4 MB template asked for 280 GB) */
  size_t end = p->pos + 1;
  while (end < p->len && p->src[end] != q)
    end += p->src[end] == '\\' && end + 1 < p->len && known_escape(p->src[end + 1]) ? 2 : 1;
  char *s = malloc(end - p->pos);
  size_t n = 0;
  if (!s) { p->err = LT_ERR_NOMEM; return; }
  adv(p, 1);
  while (p->pos < p->len && p->src[p->pos] != q) {
    char c = p->src[p->pos];
    if (c == '\\' && p->pos + 1 < p->len) {
      char e = p->src[p->pos + 1];
      const char *from = "ntr'\"\\", *to = "\n\t\r'\"\\";
      if (known_escape(e)) { s[n++] = to[strchr(from, e) - from]; adv(p, 2); continue; }
    }
    s[n++] = c;
    adv(p, 1);
  }
  if (p->pos >= p->len) {
    free(s);
    FAIL(p, LT_ERR_INVALID, line, col, "unterminated string literal");
    return;
  }
  adv(p, 1);
  s[n] = '\0';
  tok_t *t = push(p, K_STR);
  if (!t) { free(s); return; }
  t->line = line;
  t->col = col;
  t->s = s;
  t->n = n;
}

/* One token inside a tag; returns true when it was the tag's end (and whether it had `-`). */
static bool lex_in_tag(ch_t *p, int open, bool *dash) {
  while (p->pos < p->len && isspace((unsigned char)p->src[p->pos])) adv(p, 1);
  const char *s = p->src + p->pos;
  size_t left = p->len - p->pos;
  char close = open == '{' ? '}' : '%';
  *dash = left >= 3 && s[0] == '-' && s[1] == close && s[2] == '}';
  if (*dash || (left >= 2 && s[0] == close && s[1] == '}')) {
    push(p, open == '{' ? K_VAREND : K_BLOCKEND);
    adv(p, *dash ? 3 : 2);
    return true;
  }
  if (left == 0) return false;
  if (*s == '\'' || *s == '"') { lex_string(p); return false; }
  tok_t *t;
  if (isdigit((unsigned char)*s)) {
    size_t n = 0;
    while (n < left && isdigit((unsigned char)s[n])) n++;
    if (n < left && s[n] == '.' && n + 1 < left && isdigit((unsigned char)s[n + 1])) {
      FAIL(p, LT_ERR_UNSUPPORTED, p->line, p->col, "floating-point literals are not supported");
      return false;
    }
    if (!(t = push(p, K_INT))) return false;
    t->i = n > 18 ? -1 : strtoll(s, NULL, 10);
    if (t->i < 0) FAIL(p, LT_ERR_UNSUPPORTED, p->line, p->col, "integer literal too large");
    adv(p, n);
  } else if (isalpha((unsigned char)*s) || *s == '_') {
    size_t n = 0;
    while (n < left && (isalnum((unsigned char)s[n]) || s[n] == '_')) n++;
    if (!(t = push(p, K_NAME))) return false;
    if (!(t->s = strndup(s, n))) p->err = LT_ERR_NOMEM;
    t->n = n;
    adv(p, n);
  } else {
    static const char *two[] = {"==", "!=", "<=", ">=", "//", "**"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof two / sizeof *two; i++)
      if (left >= 2 && s[0] == two[i][0] && s[1] == two[i][1]) n = 2;
    if (n == 0 && strchr("+-*/%~<>()[]{}.,:=|", *s)) n = 1;
    if (n == 0) {
      FAIL(p, LT_ERR_INVALID, p->line, p->col, "unexpected character '%c' in a tag", *s);
      return false;
    }
    if (!(t = push(p, K_OP))) return false;
    memcpy(t->op, s, n);
    adv(p, n);
  }
  return false;
}

/* Cuts the template into text and tag tokens. */
static void lex(ch_t *p) {
  bool lstrip_next = false;
  while (p->err == LT_OK && p->pos < p->len) {
    size_t a = p->pos;
    int tline = p->line, tcol = p->col;
    const char *nx = NULL;
    for (const char *q = p->src + a; (q = memchr(q, '{', p->len - (size_t)(q - p->src))); q++)
      if (q + 1 < p->src + p->len && (q[1] == '{' || q[1] == '%' || q[1] == '#')) { nx = q; break; }
    size_t b = nx ? (size_t)(nx - p->src) : p->len;
    int tag = nx ? nx[1] : 0;
    bool dash = nx && b + 2 < p->len && nx[2] == '-';
    emit_text(p, a, b, lstrip_next, tag, dash, tline, tcol);
    adv(p, b - a);
    if (!nx) break;
    int line = p->line, col = p->col;
    lstrip_next = false;
    if (tag == '#') {
      const char *end = NULL;
      for (size_t i = p->pos + 2; i + 1 < p->len; i++)
        if (p->src[i] == '#' && p->src[i + 1] == '}') { end = p->src + i; break; }
      if (!end) { FAIL(p, LT_ERR_INVALID, line, col, "unterminated comment '{#'"); return; }
      lstrip_next = end > p->src + p->pos + 2 && end[-1] == '-';
      adv(p, (size_t)(end - (p->src + p->pos)) + 2);
      if (!lstrip_next && p->pos < p->len && p->src[p->pos] == '\n') adv(p, 1);
      continue;
    }
    tok_t *t = push(p, tag == '{' ? K_VAR : K_BLOCK);
    if (!t) return;
    adv(p, dash ? 3 : 2);
    bool end_dash = false;
    while (p->err == LT_OK && p->pos < p->len && !lex_in_tag(p, tag, &end_dash)) {}
    if (p->err != LT_OK) return;
    if (p->toks[p->ntoks - 1].k != (tag == '{' ? K_VAREND : K_BLOCKEND)) {
      FAIL(p, LT_ERR_INVALID, line, col, "unterminated tag '%s': no '%s' before the end",
           tag == '{' ? "{{" : "{%", tag == '{' ? "}}" : "%}");
      return;
    }
    lstrip_next = end_dash;
    if (!end_dash && tag == '%' && p->pos < p->len && p->src[p->pos] == '\n') adv(p, 1);
  }
  push(p, K_EOF);
}

/* ---------------------------------------------------------------- parsing helpers */

static tok_t *peek(ch_t *p) { return &p->toks[p->at]; }
static tok_t *take(ch_t *p) {
  tok_t *t = &p->toks[p->at];
  if (t->k != K_EOF) p->at++;
  return t;
}
static bool is_op(const tok_t *t, const char *op) { return t->k == K_OP && !strcmp(t->op, op); }
static bool is_name(const tok_t *t, const char *n) { return t->k == K_NAME && !strcmp(t->s, n); }

static const char *tok_desc(const tok_t *t) {
  switch (t->k) {
  case K_EOF: return "the end of the template";
  case K_TEXT: return "text";
  case K_VAR: return "'{{'";
  case K_VAREND: return "'}}'";
  case K_BLOCK: return "'{%'";
  case K_BLOCKEND: return "'%}'";
  case K_NAME: return t->s;
  case K_STR: return "a string";
  case K_INT: return "a number";
  default: return t->op;
  }
}

static bool expect_op(ch_t *p, const char *op) {
  tok_t *t = peek(p);
  if (is_op(t, op)) { take(p); return true; }
  FAIL(p, LT_ERR_INVALID, t->line, t->col, "expected '%s', found %s", op, tok_desc(t));
  return false;
}

static bool expect_k(ch_t *p, int k, const char *what) {
  tok_t *t = peek(p);
  if (t->k == k) { take(p); return true; }
  FAIL(p, LT_ERR_INVALID, t->line, t->col, "expected %s, found %s", what, tok_desc(t));
  return false;
}

static ch_node_t *mk(ch_t *p, int type, const tok_t *at) {
  ch_node_t *n = calloc(1, sizeof *n);
  if (!n) {
    p->err = lt_errf(p->errstr, p->errstr_size, LT_ERR_NOMEM, "out of memory");
    return NULL;
  }
  n->type = type;
  n->line = at->line;
  n->col = at->col;
  n->all = p->all;
  p->all = n;
  return n;
}

static void add_kid(ch_t *p, ch_node_t *n, ch_node_t *kid, const char *kname) {
  if (!n || !kid) return;
  ch_node_t **k = realloc(n->kids, (n->nkids + 1) * sizeof *k);
  char **kn = realloc(n->knames, (n->nkids + 1) * sizeof *kn);
  if (k) n->kids = k;
  if (kn) n->knames = kn;
  if (!k || !kn) { p->err = LT_ERR_NOMEM; return; }
  n->kids[n->nkids] = kid;
  n->knames[n->nkids++] = kname ? strdup(kname) : NULL;
}

static void nodes_free(ch_node_t *all) {
  while (all) {
    ch_node_t *nx = all->all;
    for (size_t i = 0; i < all->nkids; i++) free(all->knames[i]);
    free(all->kids);
    free(all->knames);
    free(all->name);
    free(all->attr);
    json_decref(all->lit);
    free(all);
    all = nx;
  }
}

/* ---------------------------------------------------------------- expressions */

static ch_node_t *expr(ch_t *p);

/* `(a, k=v, ...)` after a callee, filter or test: arguments onto n. */
static void call_args(ch_t *p, ch_node_t *n) {
  if (!expect_op(p, "(")) return;
  while (p->err == LT_OK && !is_op(peek(p), ")")) {
    const char *kname = NULL;
    if (peek(p)->k == K_NAME && is_op(&p->toks[p->at + 1], "=")) {
      kname = take(p)->s;
      take(p);
    }
    add_kid(p, n, expr(p), kname);
    if (!is_op(peek(p), ",")) break;
    take(p);
  }
  expect_op(p, ")");
}

static ch_node_t *lit(ch_t *p, const tok_t *t, json_t *v) {
  ch_node_t *n = mk(p, E_LIT, t);
  if (n) n->lit = v;
  else json_decref(v);
  return n;
}

/* A list `[a, b]` or dict `{k: v}` literal (the opening bracket taken). */
static ch_node_t *collection(ch_t *p, const tok_t *t, bool dict) {
  ch_node_t *n = mk(p, dict ? E_DICT : E_LIST, t);
  const char *close = dict ? "}" : "]";
  while (p->err == LT_OK && !is_op(peek(p), close)) {
    add_kid(p, n, expr(p), NULL);
    if (dict && expect_op(p, ":")) add_kid(p, n, expr(p), NULL);
    if (!is_op(peek(p), ",")) break;
    take(p);
  }
  expect_op(p, close);
  return n;
}

static ch_node_t *primary(ch_t *p) {
  tok_t *t = take(p);
  switch (t->k) {
  case K_STR: {
    size_t n = t->n, cap = n + 1;
    char *s = malloc(cap);
    if (!s) { p->err = LT_ERR_NOMEM; return NULL; }
    memcpy(s, t->s, n);
    while (peek(p)->k == K_STR) { /* adjacent literals join, as in Python */
      tok_t *u = take(p);
      char *g = realloc(s, n + u->n + 1);
      if (!g) { free(s); p->err = LT_ERR_NOMEM; return NULL; }
      s = g;
      memcpy(s + n, u->s, u->n);
      n += u->n;
    }
    ch_node_t *r = lit(p, t, json_stringn_nocheck(s, n));
    free(s);
    return r;
  }
  case K_INT: return lit(p, t, json_integer(t->i));
  case K_NAME:
    if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) return lit(p, t, json_true());
    if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) return lit(p, t, json_false());
    if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) return lit(p, t, json_null());
    {
      ch_node_t *n = mk(p, E_NAME, t);
      if (n && !(n->name = strdup(t->s))) p->err = LT_ERR_NOMEM;
      return n;
    }
  case K_OP:
    if (!strcmp(t->op, "(")) {
      ch_node_t *n = expr(p);
      if (is_op(peek(p), ",")) {
        FAIL(p, LT_ERR_UNSUPPORTED, t->line, t->col, "tuples are not supported");
        return n;
      }
      expect_op(p, ")");
      return n;
    }
    if (!strcmp(t->op, "[")) return collection(p, t, false);
    if (!strcmp(t->op, "{")) return collection(p, t, true);
    break;
  default: break;
  }
  FAIL(p, LT_ERR_INVALID, t->line, t->col, "expected an expression, found %s", tok_desc(t));
  return NULL;
}

/* `[i]` or `[lo:hi:step]` after obj (the '[' taken). */
static ch_node_t *subscript(ch_t *p, ch_node_t *obj, const tok_t *t) {
  ch_node_t *n = mk(p, E_ITEM, t);
  if (!n) return NULL;
  n->a = obj;
  ch_node_t *parts[3] = {NULL, NULL, NULL};
  int k = 0;
  for (;;) {
    if (!is_op(peek(p), ":") && !is_op(peek(p), "]")) parts[k] = expr(p);
    if (!is_op(peek(p), ":") || k == 2 || p->err) break;
    take(p);
    k++;
    n->type = E_SLICE;
  }
  expect_op(p, "]");
  if (n->type == E_ITEM) {
    n->b = parts[0];
    if (!n->b) FAIL(p, LT_ERR_INVALID, t->line, t->col, "empty subscript '[]'");
  } else {
    n->b = parts[0];
    n->c = parts[1];
    n->kids = malloc(sizeof *n->kids);
    n->knames = malloc(sizeof *n->knames);
    if (!n->kids || !n->knames) { p->err = LT_ERR_NOMEM; return n; }
    n->kids[0] = parts[2];
    n->knames[0] = NULL;
    n->nkids = 1;
  }
  return n;
}

/* One more operator on a left-deep chain (a + b + c, a.b.c, a | f | g): evaluating it recurses
 * once an operator, so a chain counts against the nesting limit as parentheses do (200,000
 * `+ 1` overflowed the stack). The caller gives the links back when the chain ends. */
static bool chain_link(ch_t *p, const tok_t *t, int *links) {
  (*links)++;
  if (++p->depth <= CH_MAX_DEPTH) return true;
  FAIL(p, LT_ERR_UNSUPPORTED, t->line, t->col, "expression nested too deeply");
  return false;
}

/* Attribute, subscript and call suffixes, then filters `| f(args)` and tests `is [not] t(args)`. */
static ch_node_t *postfix(ch_t *p) {
  ch_node_t *n = primary(p);
  int links = 0;
  while (p->err == LT_OK) {
    tok_t *t = peek(p);
    if ((is_op(t, ".") || is_op(t, "[") || is_op(t, "(") || is_op(t, "|") || is_name(t, "is")) &&
        !chain_link(p, t, &links))
      break;
    if (is_op(t, ".")) {
      take(p);
      tok_t *a = peek(p);
      if (!expect_k(p, K_NAME, "an attribute name")) break;
      ch_node_t *m = mk(p, E_ATTR, a);
      if (!m) break;
      m->a = n;
      if (!(m->name = strdup(a->s))) p->err = LT_ERR_NOMEM;
      n = m;
    } else if (is_op(t, "[")) {
      take(p);
      n = subscript(p, n, t);
    } else if (is_op(t, "(")) {
      ch_node_t *m = mk(p, E_CALL, t);
      if (!m) break;
      m->a = n;
      if (n) { m->line = n->line; m->col = n->col; } /* errors point at the callee */
      call_args(p, m);
      n = m;
    } else if (is_op(t, "|") || is_name(t, "is")) {
      bool filter = is_op(t, "|");
      take(p);
      ch_node_t *m = mk(p, filter ? E_FILTER : E_TEST, t);
      if (!m) break;
      m->a = n;
      if (!filter && is_name(peek(p), "not")) { take(p); m->op = 1; }
      tok_t *f = peek(p);
      if (f->k == K_NAME) take(p);
      else { FAIL(p, LT_ERR_INVALID, f->line, f->col, "expected a %s name, found %s",
                  filter ? "filter" : "test", tok_desc(f)); break; }
      if (!(m->name = strdup(f->s))) { p->err = LT_ERR_NOMEM; break; }
      if (filter ? !ch_filter_known(f->s) : !ch_test_known(f->s))
        FAIL(p, LT_ERR_UNSUPPORTED, f->line, f->col, "unknown %s \"%s\"",
             filter ? "filter" : "test", f->s);
      if (is_op(peek(p), "(")) call_args(p, m);
      n = m;
    } else {
      break;
    }
  }
  p->depth -= links;
  return n;
}

static ch_node_t *unary(ch_t *p) {
  tok_t *t = peek(p);
  if (is_op(t, "-") || is_op(t, "+")) {
    if (++p->depth > CH_MAX_DEPTH) { /* a run of signs nests as deep as parentheses do */
      FAIL(p, LT_ERR_UNSUPPORTED, t->line, t->col, "expression nested too deeply");
      return NULL;
    }
    take(p);
    ch_node_t *n = mk(p, E_NEG, t);
    if (n) n->a = unary(p);
    if (n && !strcmp(t->op, "+")) n->op = 1;
    p->depth--;
    return n;
  }
  return postfix(p);
}

static ch_node_t *bin(ch_t *p, int op, ch_node_t *l, ch_node_t *r, const tok_t *t) {
  ch_node_t *n = mk(p, E_BIN, t);
  if (!n) return NULL;
  n->op = op;
  n->a = l;
  n->b = r;
  return n;
}

/* Binary levels, loosest last: * / // %, + -, ~, comparisons. */
static ch_node_t *binary(ch_t *p, int level) {
  static const struct { const char *tok; int op, level; } ops[] = {
    {"*", OP_MUL, 0}, {"/", OP_DIV, 0}, {"//", OP_FDIV, 0}, {"%", OP_MOD, 0},
    {"+", OP_ADD, 1}, {"-", OP_SUB, 1}, {"~", OP_CAT, 2},
    {"==", OP_EQ, 3}, {"!=", OP_NE, 3}, {"<", OP_LT, 3}, {">", OP_GT, 3}, {"<=", OP_LE, 3},
    {">=", OP_GE, 3},
  };
  if (++p->depth > CH_MAX_DEPTH) {
    FAIL(p, LT_ERR_UNSUPPORTED, peek(p)->line, peek(p)->col, "expression nested too deeply");
    return NULL;
  }
  ch_node_t *n = level == 0 ? unary(p) : binary(p, level - 1);
  int links = 0;
  while (p->err == LT_OK) {
    tok_t *t = peek(p);
    int op = -1;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
      if (ops[i].level == level && is_op(t, ops[i].tok)) op = ops[i].op;
    if (level == 3 && is_name(t, "in")) op = OP_IN;
    if (level == 3 && is_name(t, "not") && is_name(&p->toks[p->at + 1], "in")) {
      take(p);
      op = OP_NOTIN;
    }
    if (op < 0 || !chain_link(p, t, &links)) break;
    take(p);
    n = bin(p, op, n, level == 0 ? unary(p) : binary(p, level - 1), t);
  }
  p->depth -= links + 1;
  return n;
}

static ch_node_t *not_expr(ch_t *p) {
  tok_t *t = peek(p);
  if (is_name(t, "not")) {
    take(p);
    if (++p->depth > CH_MAX_DEPTH) {
      FAIL(p, LT_ERR_UNSUPPORTED, t->line, t->col, "expression nested too deeply");
      return NULL;
    }
    ch_node_t *n = mk(p, E_NOT, t);
    if (n) n->a = not_expr(p);
    p->depth--;
    return n;
  }
  return binary(p, 3);
}

static ch_node_t *logic(ch_t *p, bool is_or) {
  ch_node_t *n = is_or ? logic(p, false) : not_expr(p);
  int links = 0;
  while (p->err == LT_OK && is_name(peek(p), is_or ? "or" : "and") && chain_link(p, peek(p), &links)) {
    tok_t *t = take(p);
    ch_node_t *m = mk(p, is_or ? E_OR : E_AND, t);
    if (!m) break;
    m->a = n;
    m->b = is_or ? logic(p, false) : not_expr(p);
    n = m;
  }
  p->depth -= links;
  return n;
}

/* An expression: `a if cond else b` over or/and/not/comparisons. */
static ch_node_t *expr(ch_t *p) {
  if (++p->depth > CH_MAX_DEPTH) {
    FAIL(p, LT_ERR_UNSUPPORTED, peek(p)->line, peek(p)->col, "expression nested too deeply");
    return NULL;
  }
  ch_node_t *n = logic(p, true);
  if (p->err == LT_OK && is_name(peek(p), "if")) {
    tok_t *t = take(p);
    ch_node_t *m = mk(p, E_COND, t);
    if (m) {
      m->a = logic(p, true);
      m->b = n;
      if (is_name(peek(p), "else")) { take(p); m->c = expr(p); }
      n = m;
    }
  }
  p->depth--;
  return n;
}

/* ---------------------------------------------------------------- statements */

static ch_node_t *body(ch_t *p, const char *const *ends, const char **which);

/* `{% if %}` (the keyword taken): the then-branch, elifs as nested ifs, the else-branch. */
static ch_node_t *if_stmt(ch_t *p, const tok_t *t) {
  static const char *const ends[] = {"elif", "else", "endif", NULL};
  ch_node_t *n = mk(p, S_IF, t);
  if (!n) return NULL;
  n->a = expr(p);
  expect_k(p, K_BLOCKEND, "'%}'");
  const char *which = NULL;
  n->b = body(p, ends, &which);
  if (p->err || !which) return n;
  if (!strcmp(which, "elif")) { /* each elif nests an if: counted as a block */
    if (++p->block_depth > CH_MAX_DEPTH) {
      FAIL(p, LT_ERR_UNSUPPORTED, p->toks[p->at - 1].line, p->toks[p->at - 1].col, "blocks nested too deeply");
      return n;
    }
    n->c = if_stmt(p, &p->toks[p->at - 1]);
    p->block_depth--;
    return n;
  }
  if (!strcmp(which, "else")) {
    static const char *const endif[] = {"endif", NULL};
    expect_k(p, K_BLOCKEND, "'%}'");
    n->c = body(p, endif, &which);
  }
  expect_k(p, K_BLOCKEND, "'%}'");
  return n;
}

static ch_node_t *for_stmt(ch_t *p, const tok_t *t) {
  static const char *const ends[] = {"else", "endfor", NULL};
  ch_node_t *n = mk(p, S_FOR, t);
  tok_t *v = peek(p);
  if (!n || !expect_k(p, K_NAME, "a loop variable")) return n;
  if (!(n->name = strdup(v->s))) { p->err = LT_ERR_NOMEM; return n; }
  if (is_op(peek(p), ",")) {
    FAIL(p, LT_ERR_UNSUPPORTED, v->line, v->col, "unpacking in a for loop is not supported");
    return n;
  }
  tok_t *in = peek(p);
  if (!is_name(in, "in")) {
    FAIL(p, LT_ERR_INVALID, in->line, in->col, "expected 'in', found %s", tok_desc(in));
    return n;
  }
  take(p);
  n->a = logic(p, true);
  if (is_name(peek(p), "if") || is_name(peek(p), "recursive")) {
    FAIL(p, LT_ERR_UNSUPPORTED, peek(p)->line, peek(p)->col, "'for ... %s' is not supported",
         peek(p)->s);
    return n;
  }
  expect_k(p, K_BLOCKEND, "'%}'");
  const char *which = NULL;
  n->b = body(p, ends, &which);
  if (!p->err && which && !strcmp(which, "else")) {
    static const char *const endfor[] = {"endfor", NULL};
    expect_k(p, K_BLOCKEND, "'%}'");
    n->c = body(p, endfor, &which);
  }
  expect_k(p, K_BLOCKEND, "'%}'");
  return n;
}

static ch_node_t *set_stmt(ch_t *p, const tok_t *t) {
  ch_node_t *n = mk(p, S_SET, t);
  tok_t *v = peek(p);
  if (!n || !expect_k(p, K_NAME, "a variable name")) return n;
  if (!(n->name = strdup(v->s))) { p->err = LT_ERR_NOMEM; return n; }
  if (is_op(peek(p), ".")) {
    take(p);
    tok_t *a = peek(p);
    if (!expect_k(p, K_NAME, "an attribute name")) return n;
    if (!(n->attr = strdup(a->s))) { p->err = LT_ERR_NOMEM; return n; }
  }
  if (!is_op(peek(p), "=")) {
    FAIL(p, LT_ERR_UNSUPPORTED, t->line, t->col, "only '{%% set name = value %%}' is supported");
    return n;
  }
  take(p);
  n->a = expr(p);
  expect_k(p, K_BLOCKEND, "'%}'");
  return n;
}

/* One statement at the cursor, or NULL at an end keyword in `ends` (stored in *which). */
static ch_node_t *stmt(ch_t *p, const char *const *ends, const char **which, bool *stop) {
  tok_t *t = take(p);
  if (t->k == K_TEXT) {
    ch_node_t *n = mk(p, S_TEXT, t);
    if (n) n->lit = json_stringn_nocheck(t->s, t->n);
    return n;
  }
  if (t->k == K_VAR) {
    ch_node_t *n = mk(p, S_OUT, t);
    if (n) n->a = expr(p);
    expect_k(p, K_VAREND, "'}}'");
    return n;
  }
  tok_t *kw = peek(p);
  if (!expect_k(p, K_NAME, "a statement keyword")) return NULL;
  for (size_t i = 0; ends && ends[i]; i++)
    if (!strcmp(kw->s, ends[i])) { *which = ends[i]; *stop = true; return NULL; }
  if (!strcmp(kw->s, "if")) return if_stmt(p, kw);
  if (!strcmp(kw->s, "for")) return for_stmt(p, kw);
  if (!strcmp(kw->s, "set")) return set_stmt(p, kw);
  FAIL(p, strncmp(kw->s, "end", 3) && strcmp(kw->s, "elif") && strcmp(kw->s, "else")
              ? LT_ERR_UNSUPPORTED : LT_ERR_INVALID,
       kw->line, kw->col, "'{%% %s %%}' is %s", kw->s,
       strncmp(kw->s, "end", 3) && strcmp(kw->s, "elif") && strcmp(kw->s, "else")
           ? "not supported" : "not inside a block it closes");
  return NULL;
}

/* Statements up to one of `ends` (NULL: the end of the template). */
static ch_node_t *body(ch_t *p, const char *const *ends, const char **which) {
  ch_node_t *head = NULL, **tail = &head;
  const tok_t *open = p->at > 0 ? &p->toks[p->at - 1] : &p->toks[0];
  int line = open->line, col = open->col;
  if (++p->block_depth > CH_MAX_DEPTH) {
    FAIL(p, LT_ERR_UNSUPPORTED, line, col, "blocks nested too deeply");
    return NULL;
  }
  bool stop = false;
  while (p->err == LT_OK && !stop) {
    if (peek(p)->k == K_EOF) {
      if (ends)
        FAIL(p, LT_ERR_INVALID, line, col, "block not closed: no '{%% %s %%}' before the end",
             ends[0] && !strcmp(ends[0], "elif") ? "endif" : ends[1] ? ends[1] : ends[0]);
      break;
    }
    ch_node_t *n = stmt(p, ends, which, &stop);
    if (n) { *tail = n; tail = &n->next; }
  }
  p->block_depth--;
  return head;
}

/* ---------------------------------------------------------------- the public calls */

/* Are messages what the API promises: an array of objects with string role and content? */
static lt_err_t check_messages(const json_t *messages, char *errstr, size_t errstr_size) {
  if (!json_is_array(messages))
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "messages is not an array");
  for (size_t i = 0; i < json_array_size(messages); i++) {
    const json_t *m = json_array_get(messages, i);
    if (!json_is_object(m))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "messages[%zu] is not an object", i);
    if (!json_is_string(json_object_get(m, "role")))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "messages[%zu].role is not a string", i);
    if (!json_is_string(json_object_get(m, "content")))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "messages[%zu].content is not a string", i);
  }
  return LT_OK;
}

lt_err_t lt_chat_render(const char *tmpl, const json_t *messages, bool add_generation_prompt,
                        const char *bos_token, const char *eos_token, char **out, char *errstr,
                        size_t errstr_size) {
  if (!tmpl) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "no chat template");
  lt_err_t err = check_messages(messages, errstr, errstr_size);
  if (err) return err;
  ch_t p = {.src = tmpl, .len = strlen(tmpl), .line = 1, .col = 1, .errstr = errstr,
            .errstr_size = errstr_size};
  if (p.len > 0 && tmpl[p.len - 1] == '\n') p.len--; /* keep_trailing_newline=False */
  lex(&p);
  ch_node_t *prog = NULL;
  if (p.err == LT_OK) prog = body(&p, NULL, NULL);
  err = p.err;
  if (err == LT_OK) {
    json_t *vars = json_object();
    /* messages is only read: the cast lets the globals object hold a reference. */
    json_object_set(vars, "messages", (json_t *)messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    json_object_set_new(vars, "bos_token", json_string(bos_token ? bos_token : ""));
    json_object_set_new(vars, "eos_token", json_string(eos_token ? eos_token : ""));
    err = ch_eval_render(prog, vars, out, errstr, errstr_size);
    json_decref(vars);
  }
  for (size_t i = 0; i < p.ntoks; i++) free(p.toks[i].s);
  free(p.toks);
  nodes_free(p.all);
  return err;
}

/* A token field: a string, or an object with a string "content"; NULL when absent. */
static const char *token_text(const json_t *v) {
  if (json_is_object(v)) v = json_object_get(v, "content");
  return json_string_value(v);
}

lt_err_t lt_chat_config_parse(const char *json_text, size_t len, char **tmpl, char **bos,
                              char **eos, char *errstr, size_t errstr_size) {
  json_error_t je;
  json_t *root = json_loadb(json_text, len, 0, &je);
  if (!root)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "tokenizer_config.json line %d, column %d: %s", je.line, je.column, je.text);
  lt_err_t err = LT_OK;
  const json_t *ct = json_object_get(root, "chat_template");
  const char *t = json_string_value(ct);
  if (json_is_array(ct)) {
    for (size_t i = 0; i < json_array_size(ct); i++) {
      const json_t *e = json_array_get(ct, i);
      const char *name = json_string_value(json_object_get(e, "name"));
      if (name && !strcmp(name, "default")) t = json_string_value(json_object_get(e, "template"));
    }
  }
  if (!json_is_object(root))
    err = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "tokenizer_config.json is not an object");
  else if (!t)
    err = lt_errf(errstr, errstr_size, LT_ERR_NOT_FOUND,
                  "tokenizer_config.json has no chat_template (a string, or a list with one "
                  "named \"default\")");
  if (err == LT_OK) {
    const char *b = token_text(json_object_get(root, "bos_token"));
    const char *e = token_text(json_object_get(root, "eos_token"));
    char *ts = strdup(t), *bs = strdup(b ? b : ""), *es = strdup(e ? e : "");
    if (!ts || !bs || !es) {
      free(ts); free(bs); free(es);
      err = lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "out of memory");
    } else {
      *tmpl = ts; *bos = bs; *eos = es;
    }
  }
  json_decref(root);
  return err;
}
