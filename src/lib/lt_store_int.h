/* lt_store_int: the backend vtable behind lt_store.h. lt_store.c checks keys and arguments, hashes
 * content and counts bytes; a backend only moves bytes. Private to src/lib/lt_store*.c. */
#ifndef LT_STORE_INT_H
#define LT_STORE_INT_H

#include "lt_store.h"

/* Each member returns lt_err_t and writes one line to errstr on failure. Keys are checked. */
typedef struct lt_store_ops {
  const char *kind;
  lt_err_t (*put)(lt_store_t *s, const char *key, const void *data, size_t len, char *errstr,
                  size_t errstr_size);
  /* Calls sink with consecutive pieces; a sink error stops the read and is returned as is. */
  lt_err_t (*get)(lt_store_t *s, const char *key, lt_store_sink_fn sink, void *ctx,
                  char *errstr, size_t errstr_size);
  lt_err_t (*head)(lt_store_t *s, const char *key, lt_store_info_t *info, char *errstr,
                   size_t errstr_size);
  lt_err_t (*del)(lt_store_t *s, const char *key, char *errstr, size_t errstr_size);
  lt_err_t (*copy)(lt_store_t *s, const char *src, const char *dst, char *errstr,
                   size_t errstr_size);
  /* max_keys is 1..LT_STORE_LIST_MAX; start_after is never NULL. */
  lt_err_t (*list)(lt_store_t *s, const char *prefix, const char *start_after, size_t max_keys,
                   lt_store_list_fn fn, void *ctx, char *next, size_t next_size, char *errstr,
                   size_t errstr_size);
  /* A streamed write: open gives the backend's writer state. */
  lt_err_t (*w_open)(lt_store_t *s, const char *key, void **w, char *errstr, size_t errstr_size);
  lt_err_t (*w_write)(void *w, const void *data, size_t len, char *errstr, size_t errstr_size);
  lt_err_t (*w_commit)(void *w, char *errstr, size_t errstr_size); /* frees w, also on error */
  void (*w_abort)(void *w);                                         /* frees w */
  /* Optional (NULL: nothing buffered to release): lt_store_writer_flush. */
  lt_err_t (*w_flush)(void *w, char *errstr, size_t errstr_size);
  void (*destroy)(lt_store_t *s);                                   /* frees impl */
} lt_store_ops_t;

struct lt_store {
  const lt_store_ops_t *ops;
  void *impl;
};

/* Wraps impl in a handle (for the backends' constructors). */
lt_err_t lt_store__new(lt_store_t **out, const lt_store_ops_t *ops, void *impl);

#endif
