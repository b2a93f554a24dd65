/* lt_chat_int.h: the parsed form of a chat template, shared by the parser (lt_chat.c) and the
 * evaluator (lt_chat_eval.c). Private to src/lib; lt_chat.h never includes it. */
#ifndef LT_CHAT_INT_H
#define LT_CHAT_INT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "lt_err.h"

/* Node types: statements (S_) linked through `next`, expressions (E_) as trees. */
enum {
  S_TEXT, S_OUT, S_IF, S_FOR, S_SET,
  E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_BIN, E_NOT, E_NEG, E_AND, E_OR, E_COND, E_CALL,
  E_FILTER, E_TEST, E_LIST, E_DICT,
};

/* Binary operators of E_BIN. */
enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FDIV, OP_MOD, OP_CAT, OP_EQ, OP_NE, OP_LT, OP_GT, OP_LE,
       OP_GE, OP_IN, OP_NOTIN };

typedef struct ch_node ch_node_t;
struct ch_node {
  int type, op;          /* op: E_BIN's operator; E_TEST's negation */
  int line, col;         /* where it starts in the template */
  char *name;            /* E_NAME, E_ATTR, E_FILTER, E_TEST, S_FOR's variable, S_SET's target */
  char *attr;            /* S_SET ns.attr's attribute */
  json_t *lit;           /* E_LIT's value, S_TEXT's text */
  ch_node_t *a, *b, *c;  /* operands; S_IF: cond/then/else; S_FOR: iter/body/else;
                          * E_SLICE: object/lo/hi (its step is kids[0]) */
  ch_node_t **kids;      /* E_CALL/E_FILTER/E_TEST arguments, E_LIST items, E_DICT keys and
                          * values in turn */
  char **knames;         /* keyword names parallel to kids (NULL for a positional one) */
  size_t nkids;
  ch_node_t *next;       /* the next statement */
  ch_node_t *all;        /* every node of a parse, for freeing */
};

/* Renders the statement list `body` with `vars` (an object: the template's globals) into a
 * malloc'd string. */
lt_err_t ch_eval_render(const ch_node_t *body, json_t *vars, char **out, char *errstr,
                        size_t errstr_size);

/* Is `name` a filter / test the evaluator knows (the parser rejects others up front)? */
bool ch_filter_known(const char *name);
bool ch_test_known(const char *name);

#endif
