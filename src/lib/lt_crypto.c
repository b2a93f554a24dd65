/* lt_crypto: envelope encryption (KEK wraps per-tenant DEKs) and the chunked AES-256-GCM "LTE1"
 * object format; see lt_crypto.h for the format and what it guarantees. Only OpenSSL 3 EVP
 * primitives are used (AES-256-GCM, HKDF-SHA256, SHA-256, RAND_bytes, CRYPTO_memcmp). */
#include "lt_crypto.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#define HDR_FIXED 44 /* header bytes before the key id */
#define SALT_BYTES 32
#define NONCE_BYTES 12
#define NONCE_PREFIX 8
#define VERSION 1
#define ALG_AES256GCM_HKDF 1
#define WRAP_FIXED 20 /* wrapped-blob bytes before the ids */
#define WRAP_NONCE 12
static const char MAGIC[4] = {'L', 'T', 'E', '1'};
static const char WRAP_MAGIC[4] = {'L', 'T', 'W', '1'};
static const char HKDF_INFO[] = "lathe LTE1 object key";

struct lt_crypto_kek {
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  char id[LT_CRYPTO_ID_MAX + 1];
};

struct lt_crypto_dek {
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  char key_id[LT_CRYPTO_ID_MAX + 1];
  char tenant[LT_CRYPTO_TENANT_MAX + 1];
};

struct lt_crypto_stream {
  bool enc;
  bool failed;
  bool hdr_done;     /* enc: header written; dec: header parsed */
  const lt_crypto_dek_t *dek;
  char object_key[LT_CRYPTO_OBJECT_KEY_MAX + 1];
  EVP_CIPHER_CTX *cctx;
  EVP_KDF *hkdf;
  uint8_t hdr[LT_CRYPTO_HEADER_MAX];
  size_t hdr_len;    /* enc: full header length; dec: bytes of header gathered so far */
  size_t chunk;      /* plaintext bytes per chunk */
  uint8_t nonce[NONCE_BYTES];
  uint8_t aad[LT_CRYPTO_SHA256_BYTES + 5]; /* context digest | BE32 index | final flag */
  uint64_t index;    /* next chunk */
  uint8_t *buf;      /* enc: <= chunk plaintext bytes; dec: <= chunk + tag ciphertext bytes */
  size_t buf_cap, buf_len;
};

struct lt_crypto_sha256 {
  EVP_MD_CTX *md;
};

/* ---- small helpers ------------------------------------------------------------------------- */

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}
static uint32_t get_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static lt_err_t check_id(const char *what, const char *id, size_t max, char *errstr,
                         size_t errstr_size) {
  if (!id || !id[0])
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s is empty", what);
  size_t n = strnlen(id, max + 1);
  if (n > max)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%s is longer than %zu bytes", what, max);
  return LT_OK;
}

lt_err_t lt_crypto_random(void *out, size_t len) {
  if (len == 0) return LT_OK;
  return RAND_bytes(out, (int)len) == 1 ? LT_OK : LT_ERR_INTERNAL;
}

lt_err_t lt_crypto_random_id(char out[LT_CRYPTO_RANDOM_ID_CHARS + 1]) {
  uint8_t b[LT_CRYPTO_RANDOM_ID_CHARS / 2];
  lt_err_t e = lt_crypto_random(b, sizeof b);
  if (e) return e;
  lt_crypto_hex(b, sizeof b, out);
  return LT_OK;
}

char *lt_crypto_hex(const uint8_t *in, size_t len, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = d[in[i] >> 4];
    out[2 * i + 1] = d[in[i] & 15];
  }
  out[2 * len] = 0;
  return out;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

lt_err_t lt_crypto_unhex(const char *hex, uint8_t *out, size_t out_len, char *errstr,
                         size_t errstr_size) {
  size_t n = strlen(hex);
  if (n != 2 * out_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "hex string has %zu characters, expected %zu", n, 2 * out_len);
  for (size_t i = 0; i < out_len; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "hex string has a non-hex character at "
                     "offset %zu", hi < 0 ? 2 * i : 2 * i + 1);
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return LT_OK;
}

bool lt_crypto_ct_equal(const void *a, const void *b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

/* ---- SHA-256 ------------------------------------------------------------------------------- */

lt_err_t lt_crypto_sha256_new(lt_crypto_sha256_t **out) {
  lt_crypto_sha256_t *h = calloc(1, sizeof *h);
  if (!h) return LT_ERR_NOMEM;
  h->md = EVP_MD_CTX_new();
  if (!h->md || EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) != 1) {
    lt_crypto_sha256_destroy(h);
    return LT_ERR_NOMEM;
  }
  *out = h;
  return LT_OK;
}

void lt_crypto_sha256_update(lt_crypto_sha256_t *h, const void *data, size_t len) {
  if (len) EVP_DigestUpdate(h->md, data, len);
}

void lt_crypto_sha256_final(lt_crypto_sha256_t *h, uint8_t out[LT_CRYPTO_SHA256_BYTES]) {
  unsigned n = 0;
  EVP_DigestFinal_ex(h->md, out, &n);
}

void lt_crypto_sha256_reset(lt_crypto_sha256_t *h) {
  EVP_DigestInit_ex(h->md, EVP_sha256(), NULL);
}

void lt_crypto_sha256_destroy(lt_crypto_sha256_t *h) {
  if (!h) return;
  EVP_MD_CTX_free(h->md);
  free(h);
}

void lt_crypto_sha256(const void *data, size_t len, uint8_t out[LT_CRYPTO_SHA256_BYTES]) {
  unsigned n = 0;
  EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

/* ---- master key ---------------------------------------------------------------------------- */

lt_err_t lt_crypto_kek_from_text(lt_crypto_kek_t **out, const char *id, const char *text,
                                 char *errstr, size_t errstr_size) {
  lt_err_t e = check_id("master key id", id, LT_CRYPTO_ID_MAX, errstr, errstr_size);
  if (e) return e;
  if (!text) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "master key text is missing");
  while (isspace((unsigned char)*text)) text++;
  size_t n = strlen(text);
  while (n && isspace((unsigned char)text[n - 1])) n--;
  /* The secure heap when the process set one up (CRYPTO_secure_malloc_init), else plain heap. */
  lt_crypto_kek_t *k = OPENSSL_secure_zalloc(sizeof *k);
  if (!k) return LT_ERR_NOMEM;
  snprintf(k->id, sizeof k->id, "%s", id);
  if (n == 2 * LT_CRYPTO_KEY_BYTES) {
    char tmp[2 * LT_CRYPTO_KEY_BYTES + 1];
    memcpy(tmp, text, n);
    tmp[n] = 0;
    e = lt_crypto_unhex(tmp, k->key, sizeof k->key, NULL, 0);
    OPENSSL_cleanse(tmp, sizeof tmp);
    if (e) {
      lt_crypto_kek_destroy(k);
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "master key '%s': 64 characters but not hex", id);
    }
  } else if (n == 44) {
    uint8_t raw[33 + 3];
    int got = EVP_DecodeBlock(raw, (const unsigned char *)text, 44);
    /* EVP_DecodeBlock counts the '=' padding as zero bytes: 44 chars -> 33, one '=' -> 32. */
    if (got != 33 || text[43] != '=' || text[42] == '=') {
      OPENSSL_cleanse(raw, sizeof raw);
      lt_crypto_kek_destroy(k);
      return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                     "master key '%s': 44 characters but not base64 of 32 bytes", id);
    }
    memcpy(k->key, raw, LT_CRYPTO_KEY_BYTES);
    OPENSSL_cleanse(raw, sizeof raw);
  } else {
    lt_crypto_kek_destroy(k);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID,
                   "master key '%s' is %zu characters; expected 32 bytes as 64 hex or 44 base64 "
                   "characters", id, n);
  }
  *out = k;
  return LT_OK;
}

lt_err_t lt_crypto_kek_from_file(lt_crypto_kek_t **out, const char *id, const char *path,
                                 char *errstr, size_t errstr_size) {
  FILE *f = fopen(path, "re");
  if (!f)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "master key file %s: %s", path,
                   strerror(errno));
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && (st.st_mode & 077)) {
    fclose(f);
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "master key file %s is readable by group "
                   "or others (mode %03o); chmod 600 it", path, (unsigned)(st.st_mode & 0777));
  }
  char text[256];
  size_t n = fread(text, 1, sizeof text - 1, f);
  int big = !feof(f) && fgetc(f) != EOF;
  fclose(f);
  text[n] = 0;
  lt_err_t e;
  if (big)
    e = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "master key file %s is longer than %zu bytes",
                path, sizeof text - 1);
  else
    e = lt_crypto_kek_from_text(out, id, text, errstr, errstr_size);
  OPENSSL_cleanse(text, sizeof text);
  return e;
}

lt_err_t lt_crypto_kek_from_env(lt_crypto_kek_t **out, char *errstr, size_t errstr_size) {
  const char *id = getenv("LATHE_MASTER_KEY_ID");
  if (!id || !*id) id = "master-1";
  const char *file = getenv("LATHE_MASTER_KEY_FILE");
  if (file && *file) return lt_crypto_kek_from_file(out, id, file, errstr, errstr_size);
  const char *text = getenv("LATHE_MASTER_KEY");
  if (!text || !*text)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "no master key: set LATHE_MASTER_KEY_FILE "
                   "(a 0600 file with 64 hex or 44 base64 characters) or LATHE_MASTER_KEY");
  lt_err_t e = lt_crypto_kek_from_text(out, id, text, errstr, errstr_size);
  if (e == LT_ERR_INVALID && errstr && errstr_size) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "LATHE_MASTER_KEY: %s", errstr);
    snprintf(errstr, errstr_size, "%s", tmp);
  }
  return e;
}

/* HKDF-SHA256(key, info = label) into out (1..64 bytes). */
static lt_err_t hkdf(const uint8_t key[LT_CRYPTO_KEY_BYTES], const char *label, uint8_t *out, size_t len,
                     char *errstr, size_t errstr_size) {
  EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
  EVP_KDF_CTX *k = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
  OSSL_PARAM p[] = {OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
                    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)key, LT_CRYPTO_KEY_BYTES),
                    OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)label, strlen(label)),
                    OSSL_PARAM_construct_end()};
  int ok = k && EVP_KDF_derive(k, out, len, p) == 1;
  EVP_KDF_CTX_free(k);
  EVP_KDF_free(kdf);
  if (!ok) return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "HKDF derivation failed");
  return LT_OK;
}

lt_err_t lt_crypto_kek_derive(const lt_crypto_kek_t *kek, const char *label, uint8_t *out, size_t len,
                              char *errstr, size_t errstr_size) {
  if (!kek || !label || !*label || !out || len == 0 || len > 64)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lt_crypto_kek_derive: want a label and 1..64 bytes");
  return hkdf(kek->key, label, out, len, errstr, errstr_size);
}

const char *lt_crypto_kek_id(const lt_crypto_kek_t *kek) { return kek->id; }

void lt_crypto_kek_destroy(lt_crypto_kek_t *kek) {
  if (!kek) return;
  OPENSSL_secure_clear_free(kek, sizeof *kek); /* cleanses either way */
}

/* ---- data key ------------------------------------------------------------------------------ */

lt_err_t lt_crypto_dek_import(lt_crypto_dek_t **out, const char *tenant, const char *key_id,
                              const uint8_t key[LT_CRYPTO_KEY_BYTES], char *errstr,
                              size_t errstr_size) {
  lt_err_t e = check_id("tenant id", tenant, LT_CRYPTO_TENANT_MAX, errstr, errstr_size);
  if (!e) e = check_id("data key id", key_id, LT_CRYPTO_ID_MAX, errstr, errstr_size);
  if (e) return e;
  lt_crypto_dek_t *d = calloc(1, sizeof *d);
  if (!d) return LT_ERR_NOMEM;
  memcpy(d->key, key, LT_CRYPTO_KEY_BYTES);
  snprintf(d->tenant, sizeof d->tenant, "%s", tenant);
  snprintf(d->key_id, sizeof d->key_id, "%s", key_id);
  *out = d;
  return LT_OK;
}

void lt_crypto_dek_export(const lt_crypto_dek_t *dek, uint8_t out[LT_CRYPTO_KEY_BYTES]) {
  memcpy(out, dek->key, LT_CRYPTO_KEY_BYTES);
}

lt_err_t lt_crypto_dek_generate(lt_crypto_dek_t **out, const char *tenant, const char *key_id,
                                char *errstr, size_t errstr_size) {
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  if (lt_crypto_random(key, sizeof key))
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "RAND_bytes failed for a data key");
  lt_err_t e = lt_crypto_dek_import(out, tenant, key_id, key, errstr, errstr_size);
  OPENSSL_cleanse(key, sizeof key);
  return e;
}

lt_err_t lt_crypto_dek_derive(const lt_crypto_dek_t *parent, const char *label, const char *key_id,
                              lt_crypto_dek_t **out, char *errstr, size_t errstr_size) {
  if (!parent || !label || !*label || !out)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "lt_crypto_dek_derive: want a parent key and a label");
  uint8_t key[LT_CRYPTO_KEY_BYTES];
  lt_err_t e = hkdf(parent->key, label, key, sizeof key, errstr, errstr_size);
  if (!e) e = lt_crypto_dek_import(out, parent->tenant, key_id, key, errstr, errstr_size);
  OPENSSL_cleanse(key, sizeof key);
  return e;
}

const char *lt_crypto_dek_tenant(const lt_crypto_dek_t *dek) { return dek->tenant; }
const char *lt_crypto_dek_key_id(const lt_crypto_dek_t *dek) { return dek->key_id; }

void lt_crypto_dek_destroy(lt_crypto_dek_t *dek) {
  if (!dek) return;
  OPENSSL_cleanse(dek, sizeof *dek);
  free(dek);
}

/* One AES-256-GCM operation on a short buffer (the wrap). enc: tag out; dec: tag in. Returns 1
 * on success, 0 when the tag does not verify, -1 on an OpenSSL failure. */
static int gcm_once(bool enc, const uint8_t key[32], const uint8_t nonce[12], const uint8_t *aad,
                    size_t aad_len, const uint8_t *in, size_t len, uint8_t *out, uint8_t tag[16]) {
  EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
  int ok = -1, n;
  if (!c) return -1;
  if (EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, key, nonce, enc ? 1 : 0) != 1) goto done;
  if (EVP_CipherUpdate(c, NULL, &n, aad, (int)aad_len) != 1) goto done;
  if (EVP_CipherUpdate(c, out, &n, in, (int)len) != 1) goto done;
  if (enc) {
    if (EVP_CipherFinal_ex(c, out + n, &n) != 1) goto done;
    if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) != 1) goto done;
    ok = 1;
  } else {
    if (EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, 16, tag) != 1) goto done;
    ok = EVP_CipherFinal_ex(c, out + n, &n) == 1 ? 1 : 0;
  }
done:
  EVP_CIPHER_CTX_free(c);
  return ok;
}

/* AAD of a wrap: the blob's bytes before the ciphertext, then BE16 tenant length and tenant. */
static size_t wrap_aad(uint8_t *aad, const uint8_t *blob, size_t pre, const char *tenant) {
  size_t tl = strlen(tenant);
  memcpy(aad, blob, pre);
  aad[pre] = (uint8_t)(tl >> 8);
  aad[pre + 1] = (uint8_t)tl;
  memcpy(aad + pre + 2, tenant, tl);
  return pre + 2 + tl;
}

lt_err_t lt_crypto_dek_wrap(const lt_crypto_kek_t *kek, const lt_crypto_dek_t *dek, uint8_t *out,
                            size_t out_cap, size_t *out_len, char *errstr, size_t errstr_size) {
  size_t kl = strlen(kek->id), dl = strlen(dek->key_id);
  size_t pre = WRAP_FIXED + kl + dl, total = pre + LT_CRYPTO_KEY_BYTES + 16;
  if (out_cap < total)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "wrap buffer of %zu bytes is too small "
                   "(need %zu)", out_cap, total);
  memcpy(out, WRAP_MAGIC, 4);
  out[4] = VERSION;
  out[5] = (uint8_t)kl;
  out[6] = (uint8_t)dl;
  out[7] = 0;
  if (lt_crypto_random(out + 8, WRAP_NONCE))
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "RAND_bytes failed for a wrap nonce");
  memcpy(out + WRAP_FIXED, kek->id, kl);
  memcpy(out + WRAP_FIXED + kl, dek->key_id, dl);
  uint8_t aad[LT_CRYPTO_WRAPPED_MAX + 2 + LT_CRYPTO_TENANT_MAX];
  size_t al = wrap_aad(aad, out, pre, dek->tenant);
  if (gcm_once(true, kek->key, out + 8, aad, al, dek->key, LT_CRYPTO_KEY_BYTES, out + pre,
               out + pre + LT_CRYPTO_KEY_BYTES) != 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "AES-256-GCM wrap failed in OpenSSL");
  *out_len = total;
  return LT_OK;
}

lt_err_t lt_crypto_dek_unwrap(const lt_crypto_kek_t *kek, const char *tenant, const uint8_t *blob,
                              size_t blob_len, lt_crypto_dek_t **out, char *errstr,
                              size_t errstr_size) {
  lt_err_t e = check_id("tenant id", tenant, LT_CRYPTO_TENANT_MAX, errstr, errstr_size);
  if (e) return e;
  if (blob_len < WRAP_FIXED || memcmp(blob, WRAP_MAGIC, 4) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "wrapped data key for tenant '%s' is not "
                   "an LTW1 blob", tenant);
  if (blob[4] != VERSION)
    return lt_errf(errstr, errstr_size, LT_ERR_UNSUPPORTED, "wrapped data key for tenant '%s' has "
                   "version %u; this build reads version %u", tenant, blob[4], VERSION);
  size_t kl = blob[5], dl = blob[6], pre = WRAP_FIXED + kl + dl;
  if (kl == 0 || dl == 0 || kl > LT_CRYPTO_ID_MAX || dl > LT_CRYPTO_ID_MAX || blob[7] != 0 ||
      blob_len != pre + LT_CRYPTO_KEY_BYTES + 16)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "wrapped data key for tenant '%s' is "
                   "malformed (%zu bytes)", tenant, blob_len);
  char kid[LT_CRYPTO_ID_MAX + 1], did[LT_CRYPTO_ID_MAX + 1];
  memcpy(kid, blob + WRAP_FIXED, kl);
  kid[kl] = 0;
  memcpy(did, blob + WRAP_FIXED + kl, dl);
  did[dl] = 0;
  if (strcmp(kid, kek->id) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "data key '%s' of tenant '%s' was wrapped "
                   "by master key '%s', not by '%s'", did, tenant, kid, kek->id);
  uint8_t aad[LT_CRYPTO_WRAPPED_MAX + 2 + LT_CRYPTO_TENANT_MAX];
  size_t al = wrap_aad(aad, blob, pre, tenant);
  uint8_t key[LT_CRYPTO_KEY_BYTES], tag[16];
  memcpy(tag, blob + pre + LT_CRYPTO_KEY_BYTES, 16);
  int r = gcm_once(false, kek->key, blob + 8, aad, al, blob + pre, LT_CRYPTO_KEY_BYTES, key, tag);
  if (r != 1) {
    OPENSSL_cleanse(key, sizeof key);
    if (r < 0)
      return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "AES-256-GCM unwrap failed in OpenSSL");
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "data key '%s' does not unwrap for tenant "
                   "'%s' with master key '%s': wrong master key, wrong tenant, or altered blob",
                   did, tenant, kek->id);
  }
  e = lt_crypto_dek_import(out, tenant, did, key, errstr, errstr_size);
  OPENSSL_cleanse(key, sizeof key);
  return e;
}

/* ---- LTE1 streams -------------------------------------------------------------------------- */

static lt_err_t fail(lt_crypto_stream_t *s, char *errstr, size_t errstr_size, lt_err_t err,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static lt_err_t fail(lt_crypto_stream_t *s, char *errstr, size_t errstr_size, lt_err_t err,
                     const char *fmt, ...) {
  s->failed = true;
  if (errstr && errstr_size) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errstr, errstr_size, fmt, ap);
    va_end(ap);
  }
  return err;
}

/* Derives the object key and nonce prefix from the DEK and the header's salt, loads the key into
 * the cipher context, and computes the context digest of the associated data. Needs s->hdr. */
static lt_err_t stream_keys(lt_crypto_stream_t *s, char *errstr, size_t errstr_size) {
  uint8_t okm[LT_CRYPTO_KEY_BYTES + NONCE_PREFIX];
  EVP_KDF_CTX *k = EVP_KDF_CTX_new(s->hkdf);
  if (!k) return fail(s, errstr, errstr_size, LT_ERR_NOMEM, "HKDF context allocation failed");
  OSSL_PARAM p[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)s->dek->key,
                                        LT_CRYPTO_KEY_BYTES),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, s->hdr + 12, SALT_BYTES),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)HKDF_INFO,
                                        sizeof HKDF_INFO - 1),
      OSSL_PARAM_construct_end()};
  int ok = EVP_KDF_derive(k, okm, sizeof okm, p) == 1;
  EVP_KDF_CTX_free(k);
  if (ok) ok = EVP_CipherInit_ex(s->cctx, EVP_aes_256_gcm(), NULL, okm, NULL, s->enc ? 1 : 0) == 1;
  memcpy(s->nonce, okm + LT_CRYPTO_KEY_BYTES, NONCE_PREFIX);
  OPENSSL_cleanse(okm, sizeof okm);
  if (!ok) return fail(s, errstr, errstr_size, LT_ERR_INTERNAL, "HKDF or AES-256-GCM init failed");

  /* Context digest: SHA-256 of header | BE16 len | tenant | BE16 len | object key. */
  uint8_t lens[2];
  size_t tl = strlen(s->dek->tenant), ol = strlen(s->object_key);
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1;
  if (ok) {
    EVP_DigestUpdate(md, s->hdr, s->hdr_len);
    lens[0] = (uint8_t)(tl >> 8); lens[1] = (uint8_t)tl;
    EVP_DigestUpdate(md, lens, 2);
    EVP_DigestUpdate(md, s->dek->tenant, tl);
    lens[0] = (uint8_t)(ol >> 8); lens[1] = (uint8_t)ol;
    EVP_DigestUpdate(md, lens, 2);
    EVP_DigestUpdate(md, s->object_key, ol);
    ok = EVP_DigestFinal_ex(md, s->aad, NULL) == 1;
  }
  EVP_MD_CTX_free(md);
  if (!ok) return fail(s, errstr, errstr_size, LT_ERR_INTERNAL, "SHA-256 failed");
  return LT_OK;
}

/* Encrypts (or decrypts and verifies) one chunk: in -> out, len bytes of payload; the tag is
 * written to / read from tag. Returns 1 ok, 0 tag mismatch, -1 OpenSSL failure. */
static int chunk_op(lt_crypto_stream_t *s, bool final, const uint8_t *in, size_t len, uint8_t *out,
                    uint8_t *tag) {
  uint8_t nonce[NONCE_BYTES];
  memcpy(nonce, s->nonce, NONCE_PREFIX);
  put_be32(nonce + NONCE_PREFIX, (uint32_t)s->index);
  put_be32(s->aad + LT_CRYPTO_SHA256_BYTES, (uint32_t)s->index);
  s->aad[LT_CRYPTO_SHA256_BYTES + 4] = final ? 1 : 0;
  int n;
  if (EVP_CipherInit_ex(s->cctx, NULL, NULL, NULL, nonce, -1) != 1) return -1;
  if (EVP_CipherUpdate(s->cctx, NULL, &n, s->aad, sizeof s->aad) != 1) return -1;
  if (len && EVP_CipherUpdate(s->cctx, out, &n, in, (int)len) != 1) return -1;
  if (s->enc) {
    if (EVP_CipherFinal_ex(s->cctx, out + len, &n) != 1) return -1;
    return EVP_CIPHER_CTX_ctrl(s->cctx, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1 ? 1 : -1;
  }
  if (EVP_CIPHER_CTX_ctrl(s->cctx, EVP_CTRL_GCM_SET_TAG, 16, tag) != 1) return -1;
  return EVP_CipherFinal_ex(s->cctx, out + len, &n) == 1 ? 1 : 0;
}

static lt_err_t stream_start(lt_crypto_stream_t *s, const char *object_key, char *errstr,
                             size_t errstr_size) {
  lt_err_t e = check_id("object key", object_key, LT_CRYPTO_OBJECT_KEY_MAX, errstr, errstr_size);
  if (e) return e;
  snprintf(s->object_key, sizeof s->object_key, "%s", object_key);
  s->failed = false;
  s->hdr_done = false;
  s->index = 0;
  s->buf_len = 0;
  if (!s->enc) {
    s->hdr_len = 0;
    return LT_OK;
  }
  size_t kl = strlen(s->dek->key_id);
  memcpy(s->hdr, MAGIC, 4);
  s->hdr[4] = VERSION;
  s->hdr[5] = ALG_AES256GCM_HKDF;
  s->hdr[6] = (uint8_t)kl;
  s->hdr[7] = 0;
  put_be32(s->hdr + 8, (uint32_t)s->chunk);
  if (lt_crypto_random(s->hdr + 12, SALT_BYTES))
    return lt_errf(errstr, errstr_size, LT_ERR_INTERNAL, "RAND_bytes failed for an object salt");
  memcpy(s->hdr + HDR_FIXED, s->dek->key_id, kl);
  s->hdr_len = HDR_FIXED + kl;
  return stream_keys(s, errstr, errstr_size);
}

static lt_err_t stream_new(lt_crypto_stream_t **out, bool enc, const lt_crypto_dek_t *dek,
                           const char *object_key, size_t chunk, char *errstr,
                           size_t errstr_size) {
  if (!dek) return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "no data key given");
  if (chunk == 0) chunk = LT_CRYPTO_CHUNK_DEFAULT;
  if (chunk > LT_CRYPTO_CHUNK_MAX)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "chunk size %zu is above the limit %u",
                   chunk, LT_CRYPTO_CHUNK_MAX);
  lt_crypto_stream_t *s = calloc(1, sizeof *s);
  if (!s) return LT_ERR_NOMEM;
  s->enc = enc;
  s->dek = dek;
  s->chunk = chunk;
  s->cctx = EVP_CIPHER_CTX_new();
  s->hkdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
  if (enc) {
    s->buf_cap = chunk;
    s->buf = malloc(chunk);
  }
  if (!s->cctx || !s->hkdf || (enc && !s->buf)) {
    lt_crypto_stream_destroy(s);
    return lt_errf(errstr, errstr_size, LT_ERR_NOMEM, "cannot allocate a crypto stream");
  }
  lt_err_t e = stream_start(s, object_key, errstr, errstr_size);
  if (e) {
    lt_crypto_stream_destroy(s);
    return e;
  }
  *out = s;
  return LT_OK;
}

lt_err_t lt_crypto_enc_new(lt_crypto_stream_t **out, const lt_crypto_dek_t *dek,
                           const char *object_key, size_t chunk_size, char *errstr,
                           size_t errstr_size) {
  return stream_new(out, true, dek, object_key, chunk_size, errstr, errstr_size);
}

lt_err_t lt_crypto_dec_new(lt_crypto_stream_t **out, const lt_crypto_dek_t *dek,
                           const char *object_key, char *errstr, size_t errstr_size) {
  return stream_new(out, false, dek, object_key, LT_CRYPTO_CHUNK_DEFAULT, errstr, errstr_size);
}

lt_err_t lt_crypto_stream_reset(lt_crypto_stream_t *s, const char *object_key, char *errstr,
                                size_t errstr_size) {
  if (s->buf) OPENSSL_cleanse(s->buf, s->buf_len);
  return stream_start(s, object_key, errstr, errstr_size);
}

void lt_crypto_stream_destroy(lt_crypto_stream_t *s) {
  if (!s) return;
  EVP_CIPHER_CTX_free(s->cctx); /* clears the key schedule */
  EVP_KDF_free(s->hkdf);
  if (s->buf) {
    OPENSSL_cleanse(s->buf, s->buf_cap);
    free(s->buf);
  }
  OPENSSL_cleanse(s, sizeof *s);
  free(s);
}

size_t lt_crypto_stream_out_max(const lt_crypto_stream_t *s, size_t in_len) {
  if (s->enc) {
    size_t total = s->buf_len + in_len;
    size_t chunks = total / s->chunk + 1;
    return (s->hdr_done ? 0 : s->hdr_len) + total + chunks * LT_CRYPTO_TAG_BYTES;
  }
  /* Plaintext never outgrows the ciphertext it comes from. */
  return s->buf_len + in_len;
}

static lt_err_t stream_err_corrupt(lt_crypto_stream_t *s, int r, bool final, char *errstr,
                                   size_t errstr_size) {
  if (r < 0) return fail(s, errstr, errstr_size, LT_ERR_INTERNAL, "AES-256-GCM failed in OpenSSL");
  return fail(s, errstr, errstr_size, LT_ERR_CORRUPT,
              "object '%s' of tenant '%s': chunk %llu%s does not authenticate (altered, truncated, "
              "reordered, moved from another object or tenant, or wrong data key)",
              s->object_key, s->dek->tenant, (unsigned long long)s->index,
              final ? " (final)" : "");
}

static lt_err_t enc_chunk(lt_crypto_stream_t *s, bool final, const uint8_t *in, size_t len,
                          uint8_t *out, size_t *pos, char *errstr, size_t errstr_size) {
  if (s->index > UINT32_MAX)
    return fail(s, errstr, errstr_size, LT_ERR_INVALID, "object '%s' exceeds 2^32 chunks",
                s->object_key);
  int r = chunk_op(s, final, in, len, out + *pos, out + *pos + len);
  if (r != 1) return stream_err_corrupt(s, r, final, errstr, errstr_size);
  *pos += len + LT_CRYPTO_TAG_BYTES;
  s->index++;
  return LT_OK;
}

/* Verifies one chunk of ciphertext+tag (len payload bytes) and writes its plaintext. For a final
 * chunk that fails, tells truncation apart: if it verifies as a non-final chunk, the stream was
 * cut after it. */
static lt_err_t dec_chunk(lt_crypto_stream_t *s, bool final, const uint8_t *in, size_t len,
                          uint8_t *out, size_t *pos, char *errstr, size_t errstr_size) {
  if (s->index > UINT32_MAX)
    return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s' exceeds 2^32 chunks",
                s->object_key);
  uint8_t tag[LT_CRYPTO_TAG_BYTES];
  memcpy(tag, in + len, sizeof tag);
  int r = chunk_op(s, final, in, len, out + *pos, tag);
  if (r == 1) {
    *pos += len;
    s->index++;
    return LT_OK;
  }
  OPENSSL_cleanse(out + *pos, len);
  if (r == 0 && final && len == s->chunk && chunk_op(s, false, in, len, out + *pos, tag) == 1) {
    OPENSSL_cleanse(out + *pos, len);
    return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s' of tenant '%s' is "
                "truncated: it ends after chunk %llu, which is not its final chunk",
                s->object_key, s->dek->tenant, (unsigned long long)s->index);
  }
  OPENSSL_cleanse(out + *pos, len);
  return stream_err_corrupt(s, r, final, errstr, errstr_size);
}

/* Parses the header once enough bytes are buffered in s->hdr. Returns LT_OK with hdr_done false
 * when more bytes are needed. */
static lt_err_t dec_header(lt_crypto_stream_t *s, const uint8_t **in, size_t *in_len, char *errstr,
                           size_t errstr_size) {
  size_t need = s->hdr_len < HDR_FIXED ? HDR_FIXED : HDR_FIXED + s->hdr[6];
  while (*in_len && s->hdr_len < need) {
    size_t take = need - s->hdr_len < *in_len ? need - s->hdr_len : *in_len;
    memcpy(s->hdr + s->hdr_len, *in, take);
    s->hdr_len += take;
    *in += take;
    *in_len -= take;
    if (s->hdr_len == HDR_FIXED) {
      if (memcmp(s->hdr, MAGIC, 4) != 0)
        return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s' does not start with "
                    "the LTE1 magic: not an encrypted Lathe object", s->object_key);
      if (s->hdr[4] != VERSION || s->hdr[5] != ALG_AES256GCM_HKDF)
        return fail(s, errstr, errstr_size, LT_ERR_UNSUPPORTED, "object '%s' has LTE1 version %u "
                    "algorithm %u; this build reads version %u algorithm %u", s->object_key,
                    s->hdr[4], s->hdr[5], VERSION, ALG_AES256GCM_HKDF);
      if (s->hdr[6] == 0 || s->hdr[6] > LT_CRYPTO_ID_MAX || s->hdr[7] != 0)
        return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s': header has a bad key "
                    "id length %u", s->object_key, s->hdr[6]);
      uint32_t cs = get_be32(s->hdr + 8);
      if (cs == 0 || cs > LT_CRYPTO_CHUNK_MAX)
        return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s': header chunk size %u "
                    "is outside 1..%u", s->object_key, cs, LT_CRYPTO_CHUNK_MAX);
      need = HDR_FIXED + s->hdr[6];
    }
  }
  if (s->hdr_len < need) return LT_OK;
  size_t kl = s->hdr[6];
  if (kl != strlen(s->dek->key_id) || memcmp(s->hdr + HDR_FIXED, s->dek->key_id, kl) != 0)
    return fail(s, errstr, errstr_size, LT_ERR_INVALID, "object '%s' was encrypted with data key "
                "'%.*s', not '%s'", s->object_key, (int)kl, (const char *)s->hdr + HDR_FIXED,
                s->dek->key_id);
  s->chunk = get_be32(s->hdr + 8);
  size_t cap = s->chunk + LT_CRYPTO_TAG_BYTES;
  if (s->buf_cap < cap) {
    uint8_t *nb = malloc(cap);
    if (!nb) return fail(s, errstr, errstr_size, LT_ERR_NOMEM, "cannot allocate a %zu-byte chunk "
                         "buffer", cap);
    if (s->buf) {
      OPENSSL_cleanse(s->buf, s->buf_cap);
      free(s->buf);
    }
    s->buf = nb;
    s->buf_cap = cap;
  }
  lt_err_t e = stream_keys(s, errstr, errstr_size);
  if (e) return e;
  s->hdr_done = true;
  return LT_OK;
}

typedef lt_err_t chunk_fn(lt_crypto_stream_t *s, bool final, const uint8_t *in, size_t len, uint8_t *out,
                          size_t *pos, char *errstr, size_t errstr_size);

/* Cuts input into units (a plaintext chunk when sealing, a chunk and its tag when opening) and
 * hands each complete unit to fn as a non-final chunk; what is left waits in s->buf. A full
 * unit goes out only once a byte after it is known, because the last one is the final one. */
static lt_err_t feed_units(lt_crypto_stream_t *s, const uint8_t *in, size_t in_len, size_t unit,
                           chunk_fn *fn, uint8_t *out, size_t *pos, char *errstr, size_t errstr_size) {
  lt_err_t e;
  if (s->buf_len) {
    size_t take = unit - s->buf_len < in_len ? unit - s->buf_len : in_len;
    memcpy(s->buf + s->buf_len, in, take);
    s->buf_len += take;
    in += take;
    in_len -= take;
    if (s->buf_len == unit && in_len) {
      if ((e = fn(s, false, s->buf, s->chunk, out, pos, errstr, errstr_size))) return e;
      s->buf_len = 0;
    }
  }
  while (in_len > unit) {
    if ((e = fn(s, false, in, s->chunk, out, pos, errstr, errstr_size))) return e;
    in += unit;
    in_len -= unit;
  }
  if (in_len) {
    memcpy(s->buf + s->buf_len, in, in_len);
    s->buf_len += in_len;
  }
  return LT_OK;
}

/* What update and final do first: refuse a stream that failed (or finished), check that out
 * holds lt_crypto_stream_out_max(s, in_len) bytes, and start an encrypted stream's first output
 * with its header (*pos moves past it). */
static lt_err_t stream_begin(lt_crypto_stream_t *s, size_t in_len, uint8_t *out, size_t out_cap,
                             size_t *pos, char *errstr, size_t errstr_size) {
  if (s->failed)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "crypto stream of object '%s' failed "
                   "earlier; reset or free it", s->object_key);
  if (out_cap < lt_crypto_stream_out_max(s, in_len))
    return fail(s, errstr, errstr_size, LT_ERR_INVALID, "output buffer of %zu bytes is smaller "
                "than lt_crypto_stream_out_max (%zu)", out_cap, lt_crypto_stream_out_max(s, in_len));
  if (s->enc && !s->hdr_done) {
    memcpy(out, s->hdr, s->hdr_len);
    *pos = s->hdr_len;
    s->hdr_done = true;
  }
  return LT_OK;
}

lt_err_t lt_crypto_stream_update(lt_crypto_stream_t *s, const void *in_v, size_t in_len,
                                 void *out_v, size_t out_cap, size_t *out_len, char *errstr,
                                 size_t errstr_size) {
  const uint8_t *in = in_v;
  uint8_t *out = out_v;
  size_t pos = 0;
  *out_len = 0;
  lt_err_t e = stream_begin(s, in_len, out, out_cap, &pos, errstr, errstr_size);
  if (e) return e;
  if (s->enc) {
    e = feed_units(s, in, in_len, s->chunk, enc_chunk, out, &pos, errstr, errstr_size);
  } else {
    if (!s->hdr_done) {
      if ((e = dec_header(s, &in, &in_len, errstr, errstr_size))) return e;
      if (!s->hdr_done) return LT_OK;
    }
    e = feed_units(s, in, in_len, s->chunk + LT_CRYPTO_TAG_BYTES, dec_chunk, out, &pos, errstr, errstr_size);
  }
  if (!e) *out_len = pos;
  return e;
}

lt_err_t lt_crypto_stream_final(lt_crypto_stream_t *s, void *out_v, size_t out_cap,
                                size_t *out_len, char *errstr, size_t errstr_size) {
  uint8_t *out = out_v;
  size_t pos = 0;
  *out_len = 0;
  lt_err_t e = stream_begin(s, 0, out, out_cap, &pos, errstr, errstr_size);
  if (e) return e;
  if (s->enc) {
    if ((e = enc_chunk(s, true, s->buf, s->buf_len, out, &pos, errstr, errstr_size))) return e;
    OPENSSL_cleanse(s->buf, s->buf_len);
    s->buf_len = 0;
    s->failed = true; /* finished: only reset or free from here */
    *out_len = pos;
    return LT_OK;
  }
  if (!s->hdr_done)
    return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s' is truncated: it ends inside "
                "its LTE1 header (%zu bytes)", s->object_key, s->hdr_len);
  if (s->buf_len < LT_CRYPTO_TAG_BYTES)
    return fail(s, errstr, errstr_size, LT_ERR_CORRUPT, "object '%s' of tenant '%s' is truncated: "
                "%s after chunk %llu", s->object_key, s->dek->tenant,
                s->buf_len ? "a partial tag" : "no final chunk", (unsigned long long)s->index);
  e = dec_chunk(s, true, s->buf, s->buf_len - LT_CRYPTO_TAG_BYTES, out, &pos, errstr,
                errstr_size);
  if (e) return e;
  s->buf_len = 0;
  s->failed = true;
  *out_len = pos;
  return LT_OK;
}

size_t lt_crypto_sealed_size(const lt_crypto_dek_t *dek, size_t plain_len, size_t chunk_size) {
  if (chunk_size == 0) chunk_size = LT_CRYPTO_CHUNK_DEFAULT;
  size_t chunks = plain_len == 0 ? 1 : (plain_len + chunk_size - 1) / chunk_size;
  return HDR_FIXED + strlen(dek->key_id) + plain_len + chunks * LT_CRYPTO_TAG_BYTES;
}

lt_err_t lt_crypto_seal(const lt_crypto_dek_t *dek, const char *object_key, size_t chunk_size,
                        const void *in, size_t in_len, void *out, size_t out_cap,
                        size_t *out_len, char *errstr, size_t errstr_size) {
  lt_crypto_stream_t *s;
  lt_err_t e = lt_crypto_enc_new(&s, dek, object_key, chunk_size, errstr, errstr_size);
  if (e) return e;
  size_t need = lt_crypto_sealed_size(dek, in_len, chunk_size), a = 0;
  if (out_cap < need)
    e = lt_errf(errstr, errstr_size, LT_ERR_INVALID, "output buffer of %zu bytes is smaller than "
                "the sealed size %zu", out_cap, need);
  if (!e) {
    /* Chunks straight from the input: the exact sealed size suffices (update's bound does not). */
    uint8_t *o = out;
    const uint8_t *i = in;
    s->hdr_done = true;
    memcpy(o, s->hdr, s->hdr_len);
    size_t pos = s->hdr_len;
    size_t left = in_len;
    while (!e && left > s->chunk) {
      e = enc_chunk(s, false, i, s->chunk, o, &pos, errstr, errstr_size);
      i += s->chunk;
      left -= s->chunk;
    }
    if (!e) e = enc_chunk(s, true, i, left, o, &pos, errstr, errstr_size);
    a = pos;
  }
  lt_crypto_stream_destroy(s);
  if (!e) *out_len = a;
  return e;
}

lt_err_t lt_crypto_open(const lt_crypto_dek_t *dek, const char *object_key, const void *in,
                        size_t in_len, void *out, size_t out_cap, size_t *out_len, char *errstr,
                        size_t errstr_size) {
  if (out_cap < in_len)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "output buffer of %zu bytes is smaller "
                   "than the input (%zu)", out_cap, in_len);
  lt_crypto_stream_t *s;
  lt_err_t e = lt_crypto_dec_new(&s, dek, object_key, errstr, errstr_size);
  if (e) return e;
  size_t a = 0, b = 0;
  e = lt_crypto_stream_update(s, in, in_len, out, out_cap, &a, errstr, errstr_size);
  if (!e) e = lt_crypto_stream_final(s, (uint8_t *)out + a, out_cap - a, &b, errstr, errstr_size);
  lt_crypto_stream_destroy(s);
  if (e) {
    OPENSSL_cleanse(out, a);
    return e;
  }
  *out_len = a + b;
  return LT_OK;
}

lt_err_t lt_crypto_peek_key_id(const void *in_v, size_t in_len, char *key_id, size_t key_id_size,
                               char *errstr, size_t errstr_size) {
  const uint8_t *in = in_v;
  if (in_len >= 4 && memcmp(in, MAGIC, 4) != 0)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "not an LTE1 object (bad magic)");
  if (in_len < HDR_FIXED || in_len < (size_t)HDR_FIXED + in[6])
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "%zu bytes are too few for an LTE1 header",
                   in_len);
  size_t kl = in[6];
  if (kl == 0 || kl > LT_CRYPTO_ID_MAX)
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "LTE1 header has a bad key id length %zu",
                   kl);
  /* A key id is a C string: one with a NUL byte in it would come out shorter than the header
   * says, and name another key. */
  if (memchr(in + HDR_FIXED, 0, kl))
    return lt_errf(errstr, errstr_size, LT_ERR_CORRUPT, "LTE1 header's key id holds a NUL byte");
  if (key_id_size < kl + 1)
    return lt_errf(errstr, errstr_size, LT_ERR_INVALID, "key id buffer of %zu bytes is too small",
                   key_id_size);
  memcpy(key_id, in + HDR_FIXED, kl);
  key_id[kl] = 0;
  return LT_OK;
}
