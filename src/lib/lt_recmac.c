/* lt_recmac: HMAC-SHA256 on security-relevant records (see lt_recmac.h). */
#include "lt_recmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdlib.h>
#include <string.h>

struct lt_recmac_key {
  uint8_t key[32];
};

static const char *const labels[] = {"lathe record mac v1: tenants", "lathe record mac v1: audit",
                                     "lathe record mac v1: operator"};

lt_err_t lt_recmac_key_new(const lt_crypto_kek_t *kek, lt_recmac_purpose_t purpose, lt_recmac_key_t **out,
                           char *errstr, size_t n) {
  if ((unsigned)purpose >= sizeof labels / sizeof *labels)
    return lt_errf(errstr, n, LT_ERR_INVALID, "lt_recmac_key_new: unknown purpose %d", (int)purpose);
  lt_recmac_key_t *k = calloc(1, sizeof *k);
  if (!k) return LT_ERR_NOMEM;
  lt_err_t err = lt_crypto_kek_derive(kek, labels[purpose], k->key, sizeof k->key, errstr, n);
  if (err) {
    free(k);
    return err;
  }
  *out = k;
  return LT_OK;
}

void lt_recmac_key_destroy(lt_recmac_key_t *k) {
  if (!k) return;
  OPENSSL_cleanse(k->key, sizeof k->key);
  free(k);
}

static void put64(EVP_MAC_CTX *c, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (56 - 8 * i));
  EVP_MAC_update(c, b, sizeof b);
}

void lt_recmac_sign(const lt_recmac_key_t *k, const char *topic_base, const void *key, size_t key_len,
                    const void *value, size_t value_len, uint8_t out[LT_RECMAC_BYTES]) {
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *c = mac ? EVP_MAC_CTX_new(mac) : NULL;
  OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_construct_end()};
  size_t outl = 0;
  bool ok = c && EVP_MAC_init(c, k->key, sizeof k->key, p) == 1;
  if (ok) {
    size_t tl = strlen(topic_base);
    put64(c, tl);
    EVP_MAC_update(c, (const uint8_t *)topic_base, tl);
    put64(c, key ? key_len : 0);
    if (key && key_len) EVP_MAC_update(c, key, key_len);
    put64(c, value ? value_len : 0);
    if (value && value_len) EVP_MAC_update(c, value, value_len);
    ok = EVP_MAC_final(c, out, &outl, LT_RECMAC_BYTES) == 1 && outl == LT_RECMAC_BYTES;
  }
  /* A MAC that could not be made is all zeroes: it verifies against nothing real. */
  if (!ok) memset(out, 0, LT_RECMAC_BYTES);
  EVP_MAC_CTX_free(c);
  EVP_MAC_free(mac);
}

bool lt_recmac_verify(const lt_recmac_key_t *k, const char *topic_base, const void *key, size_t key_len,
                      const void *value, size_t value_len, const void *mac, size_t mac_len) {
  static const uint8_t zero[LT_RECMAC_BYTES];
  uint8_t want[LT_RECMAC_BYTES];
  if (!mac || mac_len != LT_RECMAC_BYTES) return false;
  lt_recmac_sign(k, topic_base, key, key_len, value, value_len, want);
  return !lt_crypto_ct_equal(want, zero, sizeof want) && lt_crypto_ct_equal(want, mac, sizeof want);
}

bool lt_recmac_msg_ok(const lt_recmac_key_t *k, const char *topic_base, const lt_bus_msg_t *m, char *errstr,
                      size_t n) {
  const void *mac = NULL;
  size_t mac_len = 0, klen = 0, vlen = 0;
  if (!lt_bus_msg_header_get(m, LT_RECMAC_HEADER, &mac, &mac_len) || !mac) {
    lt_errf(errstr, n, LT_ERR_AUTH, "no %s header", LT_RECMAC_HEADER);
    return false;
  }
  const void *key = lt_bus_msg_key(m, &klen), *value = lt_bus_msg_value(m, &vlen);
  if (!lt_recmac_verify(k, topic_base, key, klen, value, vlen, mac, mac_len)) {
    lt_errf(errstr, n, LT_ERR_AUTH, "the record MAC does not verify (not made with this master key)");
    return false;
  }
  return true;
}

lt_err_t lt_recmac_produce_sync(lt_bus_producer_t *p, const lt_recmac_key_t *k, const char *topic,
                                const char *topic_base, const char *key, const void *value, size_t value_len,
                                int timeout_ms, char *errstr, size_t n) {
  uint8_t mac[LT_RECMAC_BYTES];
  lt_recmac_sign(k, topic_base, key, strlen(key), value, value_len, mac);
  lt_bus_header_t h = {.name = LT_RECMAC_HEADER, .value = mac, .size = sizeof mac};
  lt_bus_record_t r = {.topic = topic, .partition = LT_BUS_PARTITION_ANY, .key = key, .key_size = strlen(key),
                       .value = value, .value_size = value_len, .headers = &h, .header_count = 1};
  return lt_bus_produce_sync(p, &r, timeout_ms, NULL, NULL, errstr, n);
}
