/* fuzz_crypto: the encrypted container every object at rest is (LTE1 streams, lt_crypto.c;
 * lt_sealed_get is a store read and lt_crypto_open) and the wrapped data keys of lathe.tenants
 * (lt_crypto_dek_unwrap), under a fixed test master key and data key.
 *
 * First byte: mode (low 2 bits); the rest:
 *   0  an LTE1 object of tenant t1 at OBJECT_KEY: opened in one piece (lt_crypto_open) and
 *      streamed in pieces whose size the next byte picks; its key id peeked
 *   1  chunk size byte, 2 position bytes, a mask byte, then a plaintext: sealed, opened, then
 *      one byte of the sealed object flipped by the mask (or the object cut at the position)
 *   2  a wrapped data key for tenant t1
 * Properties: the one-piece and streamed reads agree (same plaintext or both refused); what is
 * sealed opens to the same bytes; any flipped byte or cut is refused; an unwrapped key wraps
 * and unwraps to the same key. */
#include <string.h>

#include "fuzz.h"
#include "lt_crypto.h"

#define OBJECT_KEY "tenants/t1/datasets/ds-1/data.jsonl.lte"

typedef struct {
  lt_crypto_kek_t *kek;
  lt_crypto_dek_t *dek;
} keys_t;

static const keys_t *keys(void) {
  static keys_t k;
  if (!k.dek) {
    static const uint8_t raw[LT_CRYPTO_KEY_BYTES] = "0123456789abcdef0123456789abcde";
    char err[256];
    if (lt_crypto_kek_from_text(&k.kek, "master-1",
                                "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", err,
                                sizeof err) ||
        lt_crypto_dek_import(&k.dek, "t1", "k1", raw, err, sizeof err)) {
      fprintf(stderr, "fuzz_crypto: %s\n", err);
      abort();
    }
  }
  return &k;
}

/* Opens in (len bytes) in pieces of `piece` bytes; *out (malloc'd) and *out_len on success. */
static lt_err_t open_streamed(const lt_crypto_dek_t *dek, const uint8_t *in, size_t len, size_t piece,
                              uint8_t **out, size_t *out_len) {
  char err[256];
  lt_crypto_stream_t *s = NULL;
  *out = NULL;
  lt_err_t e = lt_crypto_dec_new(&s, dek, OBJECT_KEY, err, sizeof err);
  FUZZ_CHECK(e == LT_OK, "dec_new: %s", err);
  uint8_t *buf = malloc(len + 1);
  size_t pos = 0;
  uint8_t *tmp = NULL;
  for (size_t off = 0; off < len && !e; off += piece) {
    size_t n = len - off < piece ? len - off : piece, got = 0;
    size_t cap = lt_crypto_stream_out_max(s, n);
    tmp = realloc(tmp, cap ? cap : 1);
    e = lt_crypto_stream_update(s, in + off, n, tmp, cap, &got, err, sizeof err);
    FUZZ_CHECK(e || pos + got <= len, "a stream gave more plaintext than its input");
    if (!e) memcpy(buf + pos, tmp, got);
    pos += got;
  }
  if (!e) {
    size_t cap = lt_crypto_stream_out_max(s, 0), got = 0;
    tmp = realloc(tmp, cap ? cap : 1);
    e = lt_crypto_stream_final(s, tmp, cap, &got, err, sizeof err);
    FUZZ_CHECK(e || pos + got <= len, "a stream gave more plaintext than its input");
    if (!e) memcpy(buf + pos, tmp, got);
    pos += got;
  }
  free(tmp);
  lt_crypto_stream_destroy(s);
  if (e) {
    free(buf);
    return e;
  }
  *out = buf;
  *out_len = pos;
  return LT_OK;
}

static void fuzz_open(const uint8_t *data, size_t size) {
  const lt_crypto_dek_t *dek = keys()->dek;
  size_t piece = 1 + (size_t)fuzz_take(&data, &size) * 7;
  char err[256], key_id[LT_CRYPTO_ID_MAX + 1];
  if (lt_crypto_peek_key_id(data, size, key_id, sizeof key_id, err, sizeof err) == LT_OK)
    FUZZ_CHECK(strlen(key_id) >= 1 && strlen(key_id) <= LT_CRYPTO_ID_MAX, "key id of %zu bytes", strlen(key_id));
  uint8_t *one = malloc(size ? size : 1), *streamed = NULL;
  size_t one_len = 0, streamed_len = 0;
  lt_err_t a = lt_crypto_open(dek, OBJECT_KEY, data, size, one, size, &one_len, err, sizeof err);
  lt_err_t b = open_streamed(dek, data, size, piece, &streamed, &streamed_len);
  FUZZ_CHECK((a == LT_OK) == (b == LT_OK), "one piece says %s, pieces of %zu say %s", lt_err_name(a), piece,
             lt_err_name(b));
  if (a == LT_OK)
    FUZZ_CHECK(one_len == streamed_len && memcmp(one, streamed, one_len) == 0, "the plaintexts differ");
  free(one);
  free(streamed);
}

static void fuzz_seal(const uint8_t *data, size_t size) {
  const lt_crypto_dek_t *dek = keys()->dek;
  size_t chunk = 1 + fuzz_take(&data, &size);
  size_t where = fuzz_take(&data, &size);
  where = where << 8 | fuzz_take(&data, &size);
  uint8_t mask = fuzz_take(&data, &size);
  char err[256];
  size_t cap = lt_crypto_sealed_size(dek, size, chunk), sealed_len = 0;
  uint8_t *sealed = malloc(cap), *plain = malloc(cap);
  lt_err_t e = lt_crypto_seal(dek, OBJECT_KEY, chunk, data, size, sealed, cap, &sealed_len, err, sizeof err);
  FUZZ_CHECK(e == LT_OK && sealed_len == cap, "seal: %s (%zu bytes of %zu)", err, sealed_len, cap);
  size_t plain_len = 0;
  e = lt_crypto_open(dek, OBJECT_KEY, sealed, sealed_len, plain, cap, &plain_len, err, sizeof err);
  FUZZ_CHECK(e == LT_OK && plain_len == size && memcmp(plain, data, size) == 0, "sealed bytes do not open: %s", err);
  where %= sealed_len;
  if (mask) {
    sealed[where] ^= mask;
    e = lt_crypto_open(dek, OBJECT_KEY, sealed, sealed_len, plain, cap, &plain_len, err, sizeof err);
    FUZZ_CHECK(e != LT_OK, "byte %zu of %zu flipped by %02x, yet it opens", where, sealed_len, mask);
  } else {
    e = lt_crypto_open(dek, OBJECT_KEY, sealed, where, plain, cap, &plain_len, err, sizeof err);
    FUZZ_CHECK(e != LT_OK, "cut to %zu bytes of %zu, yet it opens", where, sealed_len);
  }
  e = lt_crypto_open(dek, "tenants/t1/datasets/ds-2/data.jsonl.lte", sealed, sealed_len, plain, cap, &plain_len,
                     err, sizeof err);
  FUZZ_CHECK(e != LT_OK, "an object opens under another key");
  free(sealed);
  free(plain);
}

static void fuzz_unwrap(const uint8_t *data, size_t size) {
  const keys_t *k = keys();
  char err[256];
  lt_crypto_dek_t *dek = NULL, *again = NULL;
  if (lt_crypto_dek_unwrap(k->kek, "t1", data, size, &dek, err, sizeof err) != LT_OK) return;
  uint8_t blob[LT_CRYPTO_WRAPPED_MAX], a[LT_CRYPTO_KEY_BYTES], b[LT_CRYPTO_KEY_BYTES];
  size_t blen = 0;
  FUZZ_CHECK(lt_crypto_dek_wrap(k->kek, dek, blob, sizeof blob, &blen, err, sizeof err) == LT_OK, "%s", err);
  FUZZ_CHECK(lt_crypto_dek_unwrap(k->kek, "t1", blob, blen, &again, err, sizeof err) == LT_OK, "%s", err);
  lt_crypto_dek_export(dek, a);
  lt_crypto_dek_export(again, b);
  FUZZ_CHECK(memcmp(a, b, sizeof a) == 0 && strcmp(lt_crypto_dek_key_id(dek), lt_crypto_dek_key_id(again)) == 0,
             "wrap and unwrap changed the key");
  lt_crypto_dek_destroy(dek);
  lt_crypto_dek_destroy(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  switch (fuzz_take(&data, &size) & 3) {
  case 0: fuzz_open(data, size); break;
  case 1: fuzz_seal(data, size); break;
  default: fuzz_unwrap(data, size); break;
  }
  return 0;
}
