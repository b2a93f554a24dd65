/* lt_sealed: encrypted objects in the store, and the tenant keyring (see lt_sealed.h). */
#include "lt_sealed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

struct lt_sealed_writer {
  lt_store_writer_t *w;
  lt_crypto_stream_t *enc;
  uint8_t *buf;
  size_t cap;
  uint64_t plain;
  lt_crypto_sha256_t *hash; /* optional running hash of the stored bytes */
};

void lt_sealed_writer_hash(lt_sealed_writer_t *w, lt_crypto_sha256_t *h) { w->hash = h; }

static lt_err_t store_write(lt_sealed_writer_t *s, const void *p, size_t len, char *errstr, size_t n) {
  if (s->hash) lt_crypto_sha256_update(s->hash, p, len);
  return lt_store_writer_write(s->w, p, len, errstr, n);
}

lt_err_t lt_sealed_writer_new(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key,
                              lt_sealed_writer_t **out, char *errstr, size_t n) {
  lt_sealed_writer_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  lt_err_t err = lt_crypto_enc_new(&s->enc, dek, key, 0, errstr, n);
  if (!err) err = lt_store_writer_new(store, key, &s->w, errstr, n);
  if (err) {
    lt_crypto_stream_destroy(s->enc);
    free(s);
    return err;
  }
  *out = s;
  return LT_OK;
}

static lt_err_t ensure(lt_sealed_writer_t *s, size_t need) {
  if (need <= s->cap) return LT_OK;
  uint8_t *b = realloc(s->buf, need);
  if (!b) return LT_ERR_NOMEM;
  s->buf = b;
  s->cap = need;
  return LT_OK;
}

lt_err_t lt_sealed_writer_write(lt_sealed_writer_t *s, const void *data, size_t len, char *errstr, size_t n) {
  const uint8_t *p = data;
  while (len > 0) {
    /* Bounded pieces keep the buffer at a few chunks whatever the caller hands in. */
    size_t piece = len < (1u << 20) ? len : (1u << 20);
    size_t out_len = 0;
    if (ensure(s, lt_crypto_stream_out_max(s->enc, piece))) return LT_ERR_NOMEM;
    lt_err_t err = lt_crypto_stream_update(s->enc, p, piece, s->buf, s->cap, &out_len, errstr, n);
    if (!err && out_len) err = store_write(s, s->buf, out_len, errstr, n);
    if (err) return err;
    s->plain += piece;
    p += piece;
    len -= piece;
  }
  return LT_OK;
}

lt_err_t lt_sealed_writer_flush(lt_sealed_writer_t *s, char *errstr, size_t n) {
  if (s->buf) OPENSSL_cleanse(s->buf, s->cap);
  free(s->buf);
  s->buf = NULL;
  s->cap = 0;
  return lt_store_writer_flush(s->w, errstr, n);
}

static void writer_free(lt_sealed_writer_t *s) {
  lt_crypto_stream_destroy(s->enc);
  if (s->buf) OPENSSL_cleanse(s->buf, s->cap);
  free(s->buf);
  free(s);
}

lt_err_t lt_sealed_writer_commit(lt_sealed_writer_t *s, uint8_t sha256[32], uint64_t *plain_bytes,
                                 uint64_t *stored_bytes, char *errstr, size_t n) {
  size_t out_len = 0;
  lt_err_t err = ensure(s, lt_crypto_stream_out_max(s->enc, 0));
  if (!err) err = lt_crypto_stream_final(s->enc, s->buf, s->cap, &out_len, errstr, n);
  if (!err && out_len) err = store_write(s, s->buf, out_len, errstr, n);
  if (err) {
    lt_store_writer_abort(s->w);
    writer_free(s);
    return err;
  }
  uint64_t stored = 0;
  err = lt_store_writer_commit(s->w, sha256, &stored, errstr, n);
  if (plain_bytes) *plain_bytes = s->plain;
  if (stored_bytes) *stored_bytes = stored;
  writer_free(s);
  return err;
}

void lt_sealed_writer_abort(lt_sealed_writer_t *s) {
  if (!s) return;
  lt_store_writer_abort(s->w);
  writer_free(s);
}

lt_err_t lt_sealed_put(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key, const void *data, size_t len,
                       uint8_t sha256[32], char *errstr, size_t n) {
  size_t cap = lt_crypto_sealed_size(dek, len, 0);
  uint8_t *buf = malloc(cap ? cap : 1);
  if (!buf) return LT_ERR_NOMEM;
  size_t out_len = 0;
  lt_err_t err = lt_crypto_seal(dek, key, 0, data, len, buf, cap, &out_len, errstr, n);
  if (!err) err = lt_store_put(store, key, buf, out_len, sha256, errstr, n);
  free(buf);
  return err;
}

lt_err_t lt_sealed_get(lt_store_t *store, const lt_crypto_dek_t *dek, const char *key, size_t max_len, void **data,
                       size_t *len, char *errstr, size_t n) {
  void *sealed = NULL;
  size_t sealed_len = 0;
  lt_err_t err = lt_store_get(store, key, max_len, &sealed, &sealed_len, NULL, errstr, n);
  if (err) return err;
  uint8_t *plain = malloc(sealed_len ? sealed_len : 1);
  if (!plain) {
    free(sealed);
    return LT_ERR_NOMEM;
  }
  size_t plain_len = 0;
  err = lt_crypto_open(dek, key, sealed, sealed_len, plain, sealed_len, &plain_len, errstr, n);
  free(sealed);
  if (err) {
    OPENSSL_cleanse(plain, sealed_len);
    free(plain);
    return err;
  }
  *data = plain;
  *len = plain_len;
  return LT_OK;
}

typedef struct {
  char tenant[LT_ID_MAX + 1];
  char key_id[LT_ID_MAX + 1];
  lt_crypto_dek_t *dek;
} ring_entry_t;

struct lt_keyring {
  const lt_crypto_kek_t *kek;
  ring_entry_t *v;
  size_t n, cap;
};

lt_err_t lt_keyring_new(const lt_crypto_kek_t *kek, lt_keyring_t **out) {
  lt_keyring_t *kr = calloc(1, sizeof *kr);
  if (!kr) return LT_ERR_NOMEM;
  kr->kek = kek;
  *out = kr;
  return LT_OK;
}

void lt_keyring_destroy(lt_keyring_t *kr) {
  if (!kr) return;
  for (size_t i = 0; i < kr->n; i++) lt_crypto_dek_destroy(kr->v[i].dek);
  free(kr->v);
  free(kr);
}

lt_err_t lt_keyring_tenant_dek(lt_keyring_t *kr, const lt_tenant_t *t, const lt_crypto_dek_t **out, char *errstr,
                               size_t n) {
  for (size_t i = 0; i < kr->n; i++)
    if (strcmp(kr->v[i].tenant, t->tenant_id) == 0 && strcmp(kr->v[i].key_id, t->data_key_id) == 0) {
      *out = kr->v[i].dek;
      return LT_OK;
    }
  if (t->wrapped_data_key_len == 0)
    return lt_errf(errstr, n, LT_ERR_NOT_FOUND, "tenant %s has no data key", t->tenant_id);
  lt_crypto_dek_t *dek = NULL;
  lt_err_t err = lt_crypto_dek_unwrap(kr->kek, t->tenant_id, t->wrapped_data_key, t->wrapped_data_key_len, &dek,
                                      errstr, n);
  if (err) return err;
  if (kr->n == kr->cap) {
    size_t cap = kr->cap ? kr->cap * 2 : 8;
    ring_entry_t *v = realloc(kr->v, cap * sizeof *v);
    if (!v) {
      lt_crypto_dek_destroy(dek);
      return LT_ERR_NOMEM;
    }
    kr->v = v;
    kr->cap = cap;
  }
  ring_entry_t *e = &kr->v[kr->n++];
  snprintf(e->tenant, sizeof e->tenant, "%s", t->tenant_id);
  snprintf(e->key_id, sizeof e->key_id, "%s", t->data_key_id);
  e->dek = dek;
  *out = dek;
  return LT_OK;
}
