/* lt_store: what every backend shares — key rules, argument checks, content hashing while bytes
 * stream past, the whole-object get built on the streamed one — and the dispatch through the
 * backend vtable (lt_store_int.h). */
#include "lt_store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lt_crypto.h"

struct lt_store_writer {
  lt_store_t *s;
  void *impl;
  lt_crypto_sha256_t *sha;
  uint64_t size;
  char key[LT_STORE_KEY_MAX + 1];
};

lt_err_t lt_store__new(lt_store_t **out, const lt_store_ops_t *ops, void *impl) {
  lt_store_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  s->ops = ops;
  s->impl = impl;
  *out = s;
  return LT_OK;
}

void lt_store_destroy(lt_store_t *s) {
  if (!s) return;
  s->ops->destroy(s);
  free(s);
}

const char *lt_store_kind(const lt_store_t *s) { return s->ops->kind; }

bool lt_store_err_retriable(lt_err_t err) {
  return err == LT_ERR_UNAVAILABLE || err == LT_ERR_RETRIABLE || err == LT_ERR_TIMEOUT;
}

bool lt_store_retry_wait(const atomic_int *abort, int64_t *waited_ms, int64_t *delay_ms) {
  for (int64_t t = 0; t < *delay_ms; t += 50) {
    if (atomic_load(abort)) return false;
    usleep(50000);
  }
  if (atomic_load(abort)) return false;
  *waited_ms += *delay_ms;
  *delay_ms = *delay_ms * 2 > 5000 ? 5000 : *delay_ms * 2;
  return true;
}

lt_err_t lt_store_key_check(const char *key, size_t len, char *errstr, size_t errstr_size) {
  if (!key) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key is missing");
  /* Print at most 200 bytes of a bad key, and only up to a NUL. */
  int show = (int)(len < 200 ? len : 200);
  if (len == 0) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key is empty");
  if (len > LT_STORE_KEY_MAX)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s...' is %zu bytes; the "
                   "limit is %d", 60, key, len, LT_STORE_KEY_MAX);
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)key[i];
    if (c == 0)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%s' has a NUL byte at "
                     "offset %zu", key, i);
    if (c < 0x20 || c == 0x7f)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s' has control "
                     "character 0x%02x at offset %zu", show, key, c, i);
  }
  if (key[0] == '/')
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s' is absolute (starts "
                   "with '/')", show, key);
  if (key[len - 1] == '/')
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s' ends with '/'", show,
                   key);
  for (size_t a = 0; a < len;) {
    size_t b = a;
    while (b < len && key[b] != '/') b++;
    size_t n = b - a;
    if (n == 0)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s' has an empty "
                     "segment ('//') at offset %zu", show, key, a);
    if ((n == 1 && key[a] == '.') || (n == 2 && key[a] == '.' && key[a + 1] == '.'))
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key '%.*s' has a '%.*s' "
                     "segment at offset %zu", show, key, (int)n, key + a, a);
    a = b + 1;
  }
  return LT_OK;
}

static lt_err_t check(const char *key, char *errstr, size_t errstr_size) {
  if (!key) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "object key is missing");
  return lt_store_key_check(key, strnlen(key, LT_STORE_KEY_MAX + 1), errstr, errstr_size);
}

lt_err_t lt_store_put(lt_store_t *s, const char *key, const void *data, size_t len,
                      uint8_t sha256[32], char *errstr, size_t errstr_size) {
  lt_err_t e = check(key, errstr, errstr_size);
  if (e) return e;
  if (!data && len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "put '%s': no data for %zu bytes", key,
                   len);
  e = s->ops->put(s, key, len ? data : "", len, errstr, errstr_size);
  if (!e && sha256) lt_crypto_sha256(len ? data : "", len, sha256);
  return e;
}

/* Hashes what passes to the caller's sink. */
struct hashing_sink {
  lt_store_sink_fn sink;
  void *ctx;
  lt_crypto_sha256_t *sha;
};

static lt_err_t hash_then_sink(void *ctx, const void *data, size_t len) {
  struct hashing_sink *h = ctx;
  if (h->sha) lt_crypto_sha256_update(h->sha, data, len);
  return h->sink(h->ctx, data, len);
}

lt_err_t lt_store_get_stream(lt_store_t *s, const char *key, lt_store_sink_fn sink, void *ctx,
                             uint8_t sha256[32], char *errstr, size_t errstr_size) {
  lt_err_t e = check(key, errstr, errstr_size);
  if (e) return e;
  if (!sink) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "get '%s': no sink", key);
  struct hashing_sink h = {sink, ctx, NULL};
  if (sha256 && lt_crypto_sha256_new(&h.sha))
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "get '%s': no memory for a hash", key);
  e = s->ops->get(s, key, hash_then_sink, &h, errstr, errstr_size);
  if (!e && h.sha) lt_crypto_sha256_final(h.sha, sha256);
  lt_crypto_sha256_destroy(h.sha);
  return e;
}

struct grow_buf {
  uint8_t *p;
  size_t len, cap, max;
  const char *key;
  char *errstr;
  size_t errstr_size;
};

static lt_err_t grow_sink(void *ctx, const void *data, size_t len) {
  struct grow_buf *g = ctx;
  if (len > g->max - g->len)
    return lt_errf(g->errstr, g->errstr_size, LT_ERR_INVALID, "object '%s' is larger than the "
                   "limit of %zu bytes for a whole-object get", g->key, g->max);
  if (g->len + len > g->cap) {
    size_t cap = g->cap ? g->cap : 64 * 1024;
    while (cap < g->len + len) cap *= 2;
    if (cap > g->max) cap = g->max;
    uint8_t *p = realloc(g->p, cap);
    if (!p) return LT_ERR_NOMEM;
    g->p = p;
    g->cap = cap;
  }
  memcpy(g->p + g->len, data, len);
  g->len += len;
  return LT_OK;
}

lt_err_t lt_store_get(lt_store_t *s, const char *key, size_t max_len, void **data, size_t *len,
                      uint8_t sha256[32], char *errstr, size_t errstr_size) {
  struct grow_buf g = {NULL, 0, 0, max_len, key, errstr, errstr_size};
  lt_err_t e = lt_store_get_stream(s, key, grow_sink, &g, sha256, errstr, errstr_size);
  if (e) {
    free(g.p);
    return e;
  }
  if (!g.p && !(g.p = malloc(1))) return LT_ERR_NOMEM;
  *data = g.p;
  *len = g.len;
  return LT_OK;
}

lt_err_t lt_store_head(lt_store_t *s, const char *key, lt_store_info_t *info, char *errstr,
                       size_t errstr_size) {
  lt_err_t e = check(key, errstr, errstr_size);
  if (e) return e;
  memset(info, 0, sizeof *info);
  return s->ops->head(s, key, info, errstr, errstr_size);
}

lt_err_t lt_store_delete(lt_store_t *s, const char *key, char *errstr, size_t errstr_size) {
  lt_err_t e = check(key, errstr, errstr_size);
  if (e) return e;
  return s->ops->del(s, key, errstr, errstr_size);
}

lt_err_t lt_store_copy(lt_store_t *s, const char *src, const char *dst, char *errstr,
                       size_t errstr_size) {
  lt_err_t e = check(src, errstr, errstr_size);
  if (!e) e = check(dst, errstr, errstr_size);
  if (e) return e;
  if (strcmp(src, dst) == 0) return LT_OK;
  return s->ops->copy(s, src, dst, errstr, errstr_size);
}

lt_err_t lt_store_list(lt_store_t *s, const char *prefix, const char *start_after,
                       size_t max_keys, lt_store_list_fn fn, void *ctx, char *next,
                       size_t next_size, char *errstr, size_t errstr_size) {
  if (!prefix) prefix = "";
  if (!start_after) start_after = "";
  if (!fn) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "list: no callback");
  if (!next || next_size < LT_STORE_KEY_MAX + 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "list: next buffer must hold %d bytes",
                   LT_STORE_KEY_MAX + 1);
  if (strlen(prefix) > LT_STORE_KEY_MAX || strlen(start_after) > LT_STORE_KEY_MAX)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "list: prefix or start_after is longer "
                   "than %d bytes", LT_STORE_KEY_MAX);
  if (max_keys == 0 || max_keys > LT_STORE_LIST_MAX) max_keys = LT_STORE_LIST_MAX;
  next[0] = 0;
  return s->ops->list(s, prefix, start_after, max_keys, fn, ctx, next, next_size, errstr,
                      errstr_size);
}

lt_err_t lt_store_writer_new(lt_store_t *s, const char *key, lt_store_writer_t **out,
                             char *errstr, size_t errstr_size) {
  lt_err_t e = check(key, errstr, errstr_size);
  if (e) return e;
  lt_store_writer_t *w = calloc(1, sizeof *w);
  if (!w || lt_crypto_sha256_new(&w->sha)) {
    free(w);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "writer for '%s': no memory", key);
  }
  w->s = s;
  snprintf(w->key, sizeof w->key, "%s", key);
  e = s->ops->w_open(s, key, &w->impl, errstr, errstr_size);
  if (e) {
    lt_crypto_sha256_destroy(w->sha);
    free(w);
    return e;
  }
  *out = w;
  return LT_OK;
}

lt_err_t lt_store_writer_write(lt_store_writer_t *w, const void *data, size_t len, char *errstr,
                               size_t errstr_size) {
  if (!len) return LT_OK;
  lt_err_t e = w->s->ops->w_write(w->impl, data, len, errstr, errstr_size);
  if (e) return e;
  lt_crypto_sha256_update(w->sha, data, len);
  w->size += len;
  return LT_OK;
}

lt_err_t lt_store_writer_commit(lt_store_writer_t *w, uint8_t sha256[32], uint64_t *size,
                                char *errstr, size_t errstr_size) {
  lt_err_t e = w->s->ops->w_commit(w->impl, errstr, errstr_size);
  if (!e) {
    if (sha256) lt_crypto_sha256_final(w->sha, sha256);
    if (size) *size = w->size;
  }
  lt_crypto_sha256_destroy(w->sha);
  free(w);
  return e;
}

lt_err_t lt_store_writer_flush(lt_store_writer_t *w, char *errstr, size_t errstr_size) {
  return w->s->ops->w_flush ? w->s->ops->w_flush(w->impl, errstr, errstr_size) : LT_OK;
}

void lt_store_writer_abort(lt_store_writer_t *w) {
  if (!w) return;
  w->s->ops->w_abort(w->impl);
  lt_crypto_sha256_destroy(w->sha);
  free(w);
}

typedef struct {
  char (*keys)[LT_STORE_KEY_MAX + 1];
  size_t n;
} page_t;

static lt_err_t collect_key(void *ctx, const char *key, const lt_store_info_t *info) {
  page_t *p = ctx;
  (void)info;
  if (p->n >= LT_STORE_LIST_MAX) return LT_ERR_INVALID; /* the list promised at most that many */
  snprintf(p->keys[p->n++], sizeof p->keys[0], "%s", key);
  return LT_OK;
}

lt_err_t lt_store_delete_prefix(lt_store_t *s, const char *prefix, uint64_t *deleted, char *errstr,
                                size_t errstr_size) {
  if (!prefix || !prefix[0])
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "delete_prefix: an empty prefix would delete everything");
  page_t p = {.keys = malloc(LT_STORE_LIST_MAX * sizeof *p.keys)};
  char after[LT_STORE_KEY_MAX + 1] = "", next[LT_STORE_KEY_MAX + 1];
  if (!p.keys) return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "delete_prefix: out of memory");
  lt_err_t err = LT_OK;
  do {
    p.n = 0;
    err = lt_store_list(s, prefix, after, LT_STORE_LIST_MAX, collect_key, &p, next, sizeof next, errstr,
                        errstr_size);
    for (size_t i = 0; !err && i < p.n; i++)
      if (!(err = lt_store_delete(s, p.keys[i], errstr, errstr_size)) && deleted) ++*deleted;
    memcpy(after, next, sizeof after);
  } while (!err && after[0]);
  free(p.keys);
  return err;
}
